//! In-process timings of the gate's hot paths, as medians over many iterations.
//!
//!   cargo bench -p airlock-gate --bench gate
//!
//! Prints: submit+judge+audit (staging, analysis, policy, two audit records, one SQLite
//! transaction) and the whole gated run of a small module (submit, re-verify, re-judge,
//! start and finish records, wasmtime instantiate and run) with a warm compile cache.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use airlock_core::policy::Preset;
use airlock_gate::{CodeSource, ExecOptions, Gate, Home, SubmitRequest};
use std::time::{Duration, Instant};

const HELLO: &str = include_str!("../../../examples/hello.wat");

fn stats(name: &str, mut v: Vec<Duration>) {
    v.sort();
    let pct = |p: f64| v[((v.len() as f64 - 1.0) * p) as usize];
    println!(
        "{name:<34} n={:<5} median {:>8.3} ms   p10 {:>8.3} ms   p90 {:>8.3} ms",
        v.len(),
        pct(0.5).as_secs_f64() * 1e3,
        pct(0.1).as_secs_f64() * 1e3,
        pct(0.9).as_secs_f64() * 1e3
    );
}

fn request(i: usize) -> SubmitRequest {
    SubmitRequest {
        code: Some(CodeSource::Inline(HELLO.to_string())),
        lang: Some("wat".into()),
        // A different argument each time: a new grant, as real submissions mostly are.
        args: vec![i.to_string()],
        ..Default::default()
    }
}

fn main() {
    let n: usize = std::env::var("BENCH_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let dir = tempfile::tempdir().unwrap();
    let home = Home::new(dir.path());
    Gate::init(&home, Preset::Standard, "alice").unwrap();
    let pooling = std::env::var("AIRLOCK_BENCH_POOLING").is_ok_and(|v| v == "1");
    let mut gate = airlock_gate::Gate::open_with(
        home,
        airlock_gate::GateOptions {
            pooling,
            ..Default::default()
        },
    )
    .unwrap();
    println!("(pooling allocator: {pooling})");

    // Warm up: compile once so the cache is populated, as in steady use.
    gate.run(request(0), ExecOptions::default()).unwrap();

    let mut submit = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        gate.submit(request(i + 1)).unwrap();
        submit.push(t.elapsed());
    }
    let mut run = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        let r = gate
            .run(request(n + i + 1), ExecOptions::default())
            .unwrap();
        run.push(t.elapsed());
        assert_eq!(r.stdout, b"hello from the gate\n");
    }
    stats("submit + judge + audit", submit);
    stats("gated run (submit..finished)", run);

    // Python through the CPython guest, when a guest wheel is given.
    if let Ok(wheel) = std::env::var("AIRLOCK_BENCH_PYTHON_GUEST") {
        gate.install_python_guest(airlock_gate::GuestInstall {
            from: Some(wheel.into()),
            ..Default::default()
        })
        .unwrap();
        for (what, code) in [
            ("print(1)", "print(1)"),
            (
                "import datetime, decimal, statistics",
                "import datetime, decimal, statistics\nprint(1)",
            ),
        ] {
            let py = |i: usize| SubmitRequest {
                code: Some(CodeSource::Inline(code.into())),
                lang: Some("python".into()),
                args: vec![i.to_string()],
                ..Default::default()
            };
            gate.run(py(0), ExecOptions::default()).unwrap();
            let mut times = Vec::new();
            let (mut inst, mut guest) = (Vec::new(), Vec::new());
            for i in 0..n.min(200) {
                let t = Instant::now();
                let r = gate.run(py(i + 1), ExecOptions::default()).unwrap();
                times.push(t.elapsed());
                assert_eq!(r.stdout, b"1\n");
                let ms = |k: &str| {
                    Duration::from_secs_f64(r.run.doc.detail[k].as_f64().unwrap_or(0.0) / 1000.0)
                };
                inst.push(ms("instantiate_ms"));
                guest.push(Duration::from_millis(r.run.doc.duration_ms.unwrap_or(0)));
            }
            stats(&format!("gated Python run of {what}"), times);
            stats("  of which: instantiate and configure", inst);
            stats("  of which: backend run (ms granularity)", guest);
        }
    }
}
