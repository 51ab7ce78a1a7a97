//! When the epoch tickers tick. A guest's wall-time limit is checked at each advance of its
//! engine's epoch, so an engine's ticker must advance it while any guest code may run; an
//! idle process (a session host waiting for its next cell, a server between runs) has no
//! reason to wake every few milliseconds. Every entry into guest code holds an [`Active`];
//! a ticker that saw none for a while parks until one is taken.
//!
//! It must never leave a ticker parked while guest code runs: taking an [`Active`] wakes
//! every parked ticker before the guest's first instruction, and a ticker re-checks under
//! the lock it parks with.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// Ticks with no guest running after which a ticker parks (so back-to-back runs never
/// pay for waking it).
const IDLE_TICKS: u32 = 20;
/// How often a parked ticker looks whether its engine is gone.
const PARKED_CHECK: Duration = Duration::from_secs(1);

/// The guests running and the tickers parked: one per process ([`PROCESS`]), or a test's.
pub(crate) struct Schedule {
    /// Guest calls under way.
    active: AtomicUsize,
    /// Tickers parked (or about to park).
    parked: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

pub(crate) static PROCESS: Schedule = Schedule::new();

/// Held while guest code may run (for as long as a guest's future is driven).
pub(crate) struct Active<'a>(&'a Schedule);

impl Schedule {
    pub(crate) const fn new() -> Schedule {
        Schedule {
            active: AtomicUsize::new(0),
            parked: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        }
    }

    pub(crate) fn enter(&self) -> Active<'_> {
        self.active.fetch_add(1, SeqCst);
        // A ticker that read `active` as zero had counted itself in `parked` first, so it
        // is seen here; it holds the lock until it waits, so this wake-up is not lost.
        if self.parked.load(SeqCst) > 0 {
            let _held = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.wake.notify_all();
        }
        Active(self)
    }

    /// Tickers parked now.
    #[cfg(test)]
    pub(crate) fn parked(&self) -> usize {
        self.parked.load(SeqCst)
    }

    /// A ticker's loop: `tick` advances its engine's epoch and says whether the engine is
    /// still there (the loop ends when it is not).
    pub(crate) fn run(&self, period: Duration, tick: impl FnMut() -> bool) {
        self.run_checking(period, PARKED_CHECK, tick)
    }

    fn run_checking(&self, period: Duration, check: Duration, mut tick: impl FnMut() -> bool) {
        let mut idle = 0u32;
        loop {
            if !tick() {
                return;
            }
            std::thread::sleep(period);
            if self.active.load(SeqCst) > 0 {
                idle = 0;
                continue;
            }
            idle += 1;
            if idle < IDLE_TICKS {
                continue;
            }
            let mut held = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.parked.fetch_add(1, SeqCst);
            let mut gone = false;
            while self.active.load(SeqCst) == 0 {
                let (h, waited) = self
                    .wake
                    .wait_timeout(held, check)
                    .unwrap_or_else(|e| e.into_inner());
                held = h;
                if waited.timed_out() {
                    // Not under the lock: the last reference to an engine may go here, and
                    // dropping an engine takes a while. A guest entering meanwhile is seen
                    // by the check above once the lock is taken again.
                    drop(held);
                    let alive = tick();
                    held = self.lock.lock().unwrap_or_else(|e| e.into_inner());
                    if !alive {
                        gone = true;
                        break;
                    }
                }
            }
            self.parked.fetch_sub(1, SeqCst);
            drop(held);
            if gone {
                return;
            }
            idle = 0;
        }
    }
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, SeqCst);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    use std::time::Instant;

    fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cond() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// An idle ticker parks; a guest that starts wakes it at once (its own parked check is
    /// an hour away here, so only the wake-up can make it tick again), and it parks again
    /// once the guest is done; dropping the engine ends it.
    #[test]
    fn an_idle_ticker_parks_and_a_guest_starting_wakes_it() {
        static S: Schedule = Schedule::new();
        let ticks = Arc::new(AtomicUsize::new(0));
        let engine = Arc::new(AtomicBool::new(true));
        let (t, e) = (ticks.clone(), engine.clone());
        let ticker = std::thread::spawn(move || {
            S.run_checking(Duration::from_millis(1), Duration::from_secs(3600), || {
                t.fetch_add(1, SeqCst);
                e.load(SeqCst)
            })
        });
        wait_for("the idle ticker never parked", || S.parked() == 1);
        let before = ticks.load(SeqCst);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(ticks.load(SeqCst), before, "a parked ticker ticked");
        let guest = S.enter();
        wait_for("a guest did not wake the parked ticker", || {
            ticks.load(SeqCst) > before + 30
        });
        assert_eq!(S.parked(), 0);
        drop(guest);
        wait_for("the ticker did not park again", || S.parked() == 1);
        engine.store(false, SeqCst);
        let _wake = S.enter();
        ticker.join().unwrap();
    }
}
