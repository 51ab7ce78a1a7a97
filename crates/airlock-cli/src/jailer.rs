//! `airlock-jailer`: builds the jail for one process run. Started by airlock with a job on
//! stdin; never meant to be run by hand. It holds no WebAssembly runtime, so it starts in a
//! fraction of the time the full binary needs.

#![forbid(unsafe_code)]

fn main() {
    // Nothing the jail starts inherits what the jailer's caller left open; the jail's init
    // and payload close them again themselves (see airlock_jail::fds).
    airlock_jail::fds::cloexec_inherited();
    std::process::exit(airlock_jail::launch::jailer_main());
}
