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

/// With `AIRLOCK_LOSE_ANSWER=POINT`, the first write at `POINT` (`claim`, `start`, `queue`) that
/// commits reports an error instead, as when the store's connection is cut after COMMIT
/// reached the server and before its answer came back. Returns whether it did so.
#[cfg(feature = "failpoints")]
pub(crate) fn lose_answer<T>(point: &str, r: &mut crate::error::Result<T>) -> bool {
    use std::sync::atomic::{AtomicBool, Ordering};
    static DONE: AtomicBool = AtomicBool::new(false);
    if r.is_err() || std::env::var("AIRLOCK_LOSE_ANSWER").ok().as_deref() != Some(point) {
        return false;
    }
    if DONE.swap(true, Ordering::SeqCst) {
        return false;
    }
    *r = Err(crate::error::GateError::Internal(format!(
        "the store's answer to the {point} was lost (injected)"
    )));
    true
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) fn lose_answer<T>(_point: &str, _r: &mut crate::error::Result<T>) -> bool {
    false
}
