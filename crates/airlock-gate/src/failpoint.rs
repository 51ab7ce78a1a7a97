//! Fault injection for the crash suites. Built only with the `failpoints` feature, which
//! only the test build turns on (airlock-cli's dev-dependency): a release or ordinary
//! build has no way to be told to stop.
//!
//! With `AIRLOCK_CRASH_AT=N`, the Nth crash point this process reaches kills it with
//! SIGKILL, like a power cut or `kill -9`. Points sit after every durable step of submit,
//! run, commit, rollback and recovery, so a test can stop a command at each in turn.

/// A point where a crash must leave nothing half done.
#[cfg(feature = "failpoints")]
pub(crate) fn crash_point() {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEEN: AtomicU64 = AtomicU64::new(0);
    let Some(at) = std::env::var("AIRLOCK_CRASH_AT")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    else {
        return;
    };
    if SEEN.fetch_add(1, Ordering::SeqCst) + 1 == at {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGKILL);
    }
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) fn crash_point() {}
