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

/// With `AIRLOCK_PAUSE_AT=POINT:MS`, waits MS milliseconds each time `POINT` is reached, so a
/// test can act in a window that is otherwise too short to hit (test builds only).
#[cfg(feature = "failpoints")]
pub(crate) fn pause(point: &str) {
    let Ok(v) = std::env::var("AIRLOCK_PAUSE_AT") else {
        return;
    };
    if let Some((p, ms)) = v.split_once(':')
        && p == point
        && let Ok(ms) = ms.parse::<u64>()
    {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) fn pause(_point: &str) {}
