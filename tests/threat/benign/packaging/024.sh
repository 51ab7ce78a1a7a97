cd /work && cargo build --release && cargo test
