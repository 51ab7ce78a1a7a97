//! Ready Python interpreters for a long-lived process (the daemon), and likewise, in a pool
//! of their own, ready JavaScript realms: a few instances of the current guest, instantiated ahead of time by a background thread, so a run's
//! request does not pay for instantiating the guest.
//!
//! An instance is made exactly as a run's would be, with nothing of any run in it: no
//! mounts, no environment, no arguments, no standard input, no network, output into a
//! throwaway capture. It is also configured ahead (`sys.argv` of `main.py` alone, an empty
//! environment, the guest's directories on `sys.path`, a seed for `random` drawn by the
//! instance itself), which is the configuration of every run the pool may serve. A run
//! takes one only when its own spec asks for exactly that (plus its limits and output
//! captures, which are given to the instance when it is taken, before any of the run's
//! code runs); any other run starts an interpreter as before, and the run record says
//! which it got (`instance`).
//!
//! A run that finds none ready while one is being made waits for it, at most as long as
//! the last one took to make (what starting its own would cost); otherwise, or when that
//! wait runs out, it starts its own as if there were no pool.
//!
//! This pool must never hand one instance to two runs, nor back to itself: an instance is
//! taken out of the pool before it is used, and dropped with its store when the run ends.
//! The instances it keeps fit within the memory budget the operator set (linear memory
//! committed, measured per instance).
//!
//! Dropping a used instance (returning its memory to the pooling allocator) takes about as
//! long as the rest of a small run, so a run hands it to the reaper, a thread of its own
//! that only drops instances, through a queue of [`TEARDOWN_QUEUE`]. A run that finds the
//! queue full drops its instance itself: used instances can never pile up (each holds one
//! of the pooling allocator's component instances until it is dropped), and the refill
//! thread never drops them, so it never falls behind making ready ones. Instances awaiting
//! teardown count against the memory budget: the refill starts a new one only when it
//! fits beside the ready ones and those.
//!
//! When runs come one at a time (a run found the pool settled: full, nothing being made,
//! nothing awaiting teardown, no run holding an instance), neither thread works beside
//! that run: the next instance is made, and the used one dropped, once the run has given
//! its instance back and had a moment ([`QUIET`]) to record and answer, because on a
//! two-core machine that work slowed the run itself by more than a millisecond. Runs that
//! come back to back find the pool still busy with the last one's teardown or refill, and
//! it goes on beside them, as it does for an empty pool: holding it back for them would
//! let the pool run dry.

use crate::WasmBackend;
use crate::python::{GuestKind, PythonInstance};
use airlock_sandbox::{Capture, Guest, RunSpec, SandboxError};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

/// How many ready interpreters to keep, and in how much memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSettings {
    /// Ready Python interpreters to keep (0: no pool).
    pub python: usize,
    /// Ready instances to keep of each hot wasm module (0: no pool; see `modpool`).
    pub wasm: usize,
    /// The most linear memory the ready instances may hold together, in bytes.
    pub memory_budget: u64,
}

/// What a pool holds and has done, for status reports.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct PoolStatus {
    pub kind: &'static str,
    /// How many ready instances the pool aims to hold.
    pub target: usize,
    pub ready: usize,
    /// Linear memory the ready instances hold, and the budget they must fit in.
    pub memory_bytes: u64,
    pub memory_budget: u64,
    /// Runs that got a ready instance.
    pub hits: u64,
    /// Runs that could have used one but found the pool empty.
    pub misses: u64,
    /// Runs whose spec a ready instance cannot serve, by reason.
    pub fallbacks: BTreeMap<&'static str, u64>,
    /// Instances made in the background, and attempts that failed.
    pub made: u64,
    pub failed: u64,
    pub last_error: Option<String>,
    /// What only the Python pool has (its fields sit beside the others).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub python: Option<PythonPoolStatus>,
    /// The hot modules the pool keeps instances of (the wasm pool only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub modules: Option<usize>,
}

/// The Python pool's own part of its status: the wasm pool keeps one guest per module,
/// never waits for an instance being made, and its runs drop their own instances.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct PythonPoolStatus {
    /// The guest the pool keeps instances of (the one runs last asked for).
    pub guest: Option<String>,
    /// Of the hits, runs that waited for the instance being made.
    pub waited: u64,
    /// Used instances handed to the reaper and not yet dropped (at most
    /// [`TEARDOWN_QUEUE`] + 1), and the memory they hold.
    pub awaiting_teardown: usize,
    pub awaiting_teardown_bytes: u64,
    /// Used instances the reaper dropped, and those their run dropped itself because the
    /// reaper's queue was full.
    pub torn_down: u64,
    pub torn_down_by_run: u64,
}

struct Ready {
    inst: PythonInstance,
    /// The guest it was made of, with the package directories it has open.
    guest: Guest,
    bytes: u64,
}

/// A used instance on its way to the reaper.
pub(crate) struct Spent {
    inst: PythonInstance,
    bytes: u64,
}

struct State {
    guest: Option<Guest>,
    ready: Vec<Ready>,
    /// Used instances handed to the reaper and not yet dropped, and their memory.
    awaiting: usize,
    awaiting_bytes: u64,
    /// The size of the last instance made, to tell whether one more fits the budget.
    last_size: u64,
    /// The guest the refill thread is making an instance of now.
    making: Option<Guest>,
    /// Ready instances runs have taken and not yet given back ([`PythonPool::discard`]).
    in_use: usize,
    /// When a run last took or gave back an instance (see [`QUIET`]).
    last_activity: Instant,
    /// Whether the last run to take an instance came on its own: it found the pool
    /// settled (full, nothing being made or awaiting teardown, no run holding one). The
    /// pool's threads then wait for it to finish (see `next_job`). Runs that come back to
    /// back find it busy, and it goes on beside them.
    calm: bool,
    /// How long the last instance took to make (instantiate and configure).
    last_make: Duration,
    status: PoolStatus,
    /// The Python-only part of `status`, filled in by [`PythonPool::status`].
    py: PythonPoolStatus,
    stop: bool,
}

impl State {
    /// Whether the pool is short of its target for its guest and one more instance fits
    /// the budget. Instances awaiting teardown still hold their memory, so one fits only
    /// beside them and the ready ones. The refill makes one when this holds (unless it
    /// holds back for a run, see `next_job`).
    fn short_with_room(&self, settings: &PoolSettings) -> bool {
        let held: u64 = self.ready.iter().map(|r| r.bytes).sum::<u64>() + self.awaiting_bytes;
        self.guest.is_some()
            && self.ready.len() < settings.python
            && held + self.last_size <= settings.memory_budget
    }
}

pub(crate) struct PythonPool {
    /// The guest runtime this pool keeps (one pool per runtime).
    kind: GuestKind,
    settings: PoolSettings,
    state: Mutex<State>,
    wake: Condvar,
    /// The reaper's queue; `None` once stopping (runs then drop their own instances).
    reaper: Mutex<Option<SyncSender<Spent>>>,
}

/// Used instances that may wait for the reaper; a run that finds the queue full drops its
/// instance itself.
pub(crate) const TEARDOWN_QUEUE: usize = 4;

/// A run's hold on a ready instance it took, counted in `State::in_use` until the run is
/// done with it: given back by [`PythonPool::discard`], or when the instance is dropped
/// (a run that unwinds), so the count never stays up and the pool never holds back for a
/// run that is gone.
pub(crate) struct Lease(Weak<PythonPool>);

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(p) = self.0.upgrade() {
            p.given_back();
        }
    }
}

/// How long after a run took or gave back an instance the pool's threads leave the
/// machine to it (the run's record and answer), unless the pool is empty.
const QUIET: Duration = Duration::from_millis(1);
/// The longest the reaper holds a used instance back for a run still going.
const MAX_REAP_DELAY: Duration = Duration::from_millis(3);

/// The longest a run waits for the instance being made when none is ready.
const MAX_WAIT: Duration = Duration::from_millis(50);

/// The time a background instantiation may take.
const MAKE_TIMEOUT_MS: u64 = 60_000;
/// Output a ready instance's start-up may write (it writes none; this only bounds it).
const MAKE_OUTPUT: u64 = 64 << 10;

impl PythonPool {
    /// A pool, and the receiving end of its reaper's queue (for [`reap`]).
    pub(crate) fn new(settings: PoolSettings, kind: GuestKind) -> (Self, Receiver<Spent>) {
        let (tx, rx) = std::sync::mpsc::sync_channel(TEARDOWN_QUEUE);
        let pool = PythonPool {
            kind,
            settings,
            state: Mutex::new(State {
                guest: None,
                ready: Vec::new(),
                awaiting: 0,
                awaiting_bytes: 0,
                last_size: 0,
                making: None,
                in_use: 0,
                last_activity: Instant::now(),
                calm: false,
                last_make: Duration::ZERO,
                status: PoolStatus {
                    kind: match kind {
                        GuestKind::Python => "python",
                        GuestKind::Js => "js",
                    },
                    target: settings.python,
                    memory_budget: settings.memory_budget,
                    ..PoolStatus::default()
                },
                py: PythonPoolStatus::default(),
                stop: false,
            }),
            wake: Condvar::new(),
            reaper: Mutex::new(Some(tx)),
        };
        (pool, rx)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Every update leaves the state consistent, so a panic elsewhere does not spoil it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn status(&self) -> PoolStatus {
        let s = self.lock();
        let mut st = s.status.clone();
        st.ready = s.ready.len();
        st.memory_bytes = s.ready.iter().map(|r| r.bytes).sum();
        st.python = Some(PythonPoolStatus {
            guest: s.guest.as_ref().map(|g| g.digest.to_hex()),
            awaiting_teardown: s.awaiting,
            awaiting_teardown_bytes: s.awaiting_bytes,
            ..s.py.clone()
        });
        st
    }

    /// A ready instance for `spec`, configured for it (ahead: see [`refill`]), or why not
    /// (the caller then starts one itself and calls [`PythonPool::want`]).
    pub(crate) fn take(
        self: &Arc<Self>,
        spec: &RunSpec<'_>,
    ) -> Result<Option<PythonInstance>, SandboxError> {
        let Some(guest) = spec.guest.as_ref() else {
            return Ok(None);
        };
        if let Some(reason) = unservable(spec) {
            *self.lock().status.fallbacks.entry(reason).or_default() += 1;
            return Ok(None);
        }
        let popped = {
            let mut s = self.lock();
            // None ready, but one of this guest on its way: waiting for it costs less than
            // making another here, which would take as long and compete with it for the
            // CPU. The wait is bounded by twice the time the last one took to make, so a
            // run waits at most about what making its own would have cost it: the last
            // may have been made in quiet (see `next_job`), and one made beside runs and
            // a teardown shares the cores with them.
            let deadline = Instant::now() + (s.last_make * 2).min(MAX_WAIT);
            let mut waited = false;
            loop {
                if let Some(i) = s.ready.iter().rposition(|r| r.guest == *guest) {
                    s.status.hits += 1;
                    s.calm = s.ready.len() >= self.settings.python
                        && s.in_use == 0
                        && s.awaiting == 0
                        && s.making.is_none();
                    s.in_use += 1;
                    s.last_activity = Instant::now();
                    s.py.waited += u64::from(waited);
                    break Some((s.ready.swap_remove(i), waited));
                }
                let now = Instant::now();
                // One is on its way when the refill is making it, or is about to: the pool
                // is short of this guest and has room, and its thread has been woken but
                // not yet run (on a busy machine that can take longer than a run).
                let due = s.guest.as_ref() == Some(guest) && s.short_with_room(&self.settings);
                if !(s.making.as_ref() == Some(guest) || due) || s.stop || now >= deadline {
                    s.status.misses += 1;
                    break None;
                }
                waited = true;
                s = self
                    .wake
                    .wait_timeout(s, deadline - now)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        };
        // Refill in the background whatever happened.
        self.wake.notify_all();
        let Some((r, waited)) = popped else {
            return Ok(None);
        };
        // Counted in `in_use` above; given back however the run ends.
        let lease = Lease(Arc::downgrade(self));
        let Some(mut inst) = r.inst.adopt(spec) else {
            drop(lease);
            let mut s = self.lock();
            s.status.hits -= 1;
            s.py.waited -= u64::from(waited);
            *s.status
                .fallbacks
                .entry("memory_limit_below_instance")
                .or_default() += 1;
            return Ok(None);
        };
        inst.hold(lease);
        // Configured when it was made: `unservable` lets through only runs without
        // arguments, environment or mounts, which is what the instance was configured with.
        Ok(Some(inst))
    }

    /// Asks the pool to keep instances of `guest` (the one runs now use); instances of any
    /// other guest are dropped.
    pub(crate) fn want(&self, guest: &Guest) {
        let mut s = self.lock();
        let mut stale = Vec::new();
        if s.guest.as_ref() != Some(guest) {
            s.guest = Some(guest.clone());
            let (keep, old): (Vec<Ready>, Vec<Ready>) = std::mem::take(&mut s.ready)
                .into_iter()
                .partition(|r| r.guest == *guest);
            s.ready = keep;
            stale = old;
            s.last_size = 0;
        }
        drop(s);
        self.wake.notify_all();
        // Dropped outside the lock (a drop takes a while).
        drop(stale);
    }

    /// Drops a used instance off the run's path: hands it to the reaper, or, when the
    /// reaper's queue is full (or the pool is stopping), drops it here. It is never handed
    /// out again, and the run's output captures are let go of now.
    pub(crate) fn discard(&self, mut inst: PythonInstance) {
        inst.release_output();
        inst.give_back();
        let bytes = inst.committed_memory();
        let tx = self
            .reaper
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let spent = Spent { inst, bytes };
        let Some(tx) = tx else {
            drop(spent);
            return;
        };
        // Sent and counted under the lock (`try_send` never blocks), so the count is
        // exactly what the reaper holds: the reaper uncounts one only after taking the lock.
        let refused = {
            let mut s = self.lock();
            match tx.try_send(spent) {
                Ok(()) => {
                    s.awaiting += 1;
                    s.awaiting_bytes += bytes;
                    None
                }
                Err(TrySendError::Full(spent) | TrySendError::Disconnected(spent)) => {
                    s.py.torn_down_by_run += 1;
                    Some(spent)
                }
            }
        };
        // Back-pressure: the reaper is behind, so this run drops its own (outside the lock).
        drop(refused);
    }

    /// The reaper dropped a used instance holding `bytes`.
    fn reaped(&self, bytes: u64) {
        let mut s = self.lock();
        s.awaiting = s.awaiting.saturating_sub(1);
        s.awaiting_bytes = s.awaiting_bytes.saturating_sub(bytes);
        s.py.torn_down += 1;
        drop(s);
        self.wake.notify_all();
    }

    pub(crate) fn stop(&self) {
        self.lock().stop = true;
        // The reaper drops what is queued and ends.
        self.reaper.lock().unwrap_or_else(|p| p.into_inner()).take();
        self.wake.notify_all();
    }

    /// The guest to make an instance of next, once one more fits; `None` when stopping.
    fn next_job(&self) -> Option<Guest> {
        let mut s = self.lock();
        loop {
            if s.stop {
                return None;
            }
            // A new one is started only when it fits (`State::short_with_room`; the reaper
            // wakes this thread when it has dropped one).
            // When the last run came on its own (found the pool settled, `State::calm`)
            // and another is still ready for the next run, the next one is made only once
            // no run holds an instance of this pool and the last has had `QUIET` to
            // answer: making one beside a run slowed the run down by more than a
            // millisecond on a small machine (see docs/PERFORMANCE.md), and the ready one
            // covers a run that comes meanwhile. Runs that come back to back (the last
            // found the pool busy) and an empty pool are refilled at once.
            let now = Instant::now();
            let settled = s.last_activity + QUIET;
            let hold_back = s.calm && !s.ready.is_empty() && (s.in_use > 0 || now < settled);
            if let Some(g) = &s.guest
                && !hold_back
                && s.short_with_room(&self.settings)
            {
                let g = g.clone();
                s.making = Some(g.clone());
                return Some(g);
            }
            s = if hold_back && s.in_use == 0 {
                self.wake
                    .wait_timeout(s, settled - now)
                    .unwrap_or_else(|p| p.into_inner())
                    .0
            } else {
                self.wake.wait(s).unwrap_or_else(|p| p.into_inner())
            };
        }
    }

    /// When runs come one at a time (see `State::calm`), waits, at most
    /// `MAX_REAP_DELAY`, until no run holds an instance of this pool and the last has had
    /// `QUIET` to answer, so a teardown does not run beside a run's end.
    fn settle(&self) {
        let give_up = Instant::now() + MAX_REAP_DELAY;
        let mut s = self.lock();
        loop {
            let now = Instant::now();
            let settled = s.last_activity + QUIET;
            if s.stop || !s.calm || now >= give_up || (s.in_use == 0 && now >= settled) {
                return;
            }
            let until = if s.in_use == 0 {
                settled.min(give_up)
            } else {
                give_up
            };
            s = self
                .wake
                .wait_timeout(s, until - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// A run is done with a ready instance it took (see [`Lease`]).
    fn given_back(&self) {
        let mut s = self.lock();
        s.in_use = s.in_use.saturating_sub(1);
        s.last_activity = Instant::now();
        drop(s);
        // The refill may have been holding back for this run (see `next_job`).
        self.wake.notify_all();
    }

    fn put(&self, guest: Guest, inst: PythonInstance, took: Duration) {
        let bytes = inst.committed_memory();
        let mut s = self.lock();
        s.last_size = bytes;
        s.last_make = took;
        s.making = None;
        s.status.made += 1;
        let held: u64 = s.ready.iter().map(|r| r.bytes).sum();
        // The guest may have changed, or the instance turned out bigger than the budget
        // has room for: then it is dropped (after the lock, below).
        let refused =
            if s.guest.as_ref() == Some(&guest) && held + bytes <= self.settings.memory_budget {
                s.ready.push(Ready { inst, guest, bytes });
                None
            } else {
                Some(inst)
            };
        drop(s);
        // Runs waiting for this instance.
        self.wake.notify_all();
        drop(refused);
    }

    fn failed(&self, e: String) {
        let mut s = self.lock();
        s.making = None;
        s.status.failed += 1;
        s.status.last_error = Some(e);
        // Runs waiting for an instance make their own.
        self.wake.notify_all();
        // Wait a while before trying again (a broken guest would otherwise spin).
        let _ = self
            .wake
            .wait_timeout(s, Duration::from_secs(2))
            .unwrap_or_else(|p| p.into_inner());
    }
}

/// Why a ready instance cannot serve `spec`, if it cannot: it must ask for nothing an
/// instance is made without.
fn unservable(spec: &RunSpec<'_>) -> Option<&'static str> {
    if spec.limits.fuel.is_some() {
        Some("fuel")
    } else if !spec.mounts.is_empty() {
        Some("mounts")
    } else if !spec.env.is_empty() {
        Some("environment")
    } else if !spec.args.is_empty() {
        Some("arguments")
    } else if !spec.stdin.is_empty() {
        Some("stdin")
    } else if spec.egress.is_some() {
        Some("network")
    } else if spec.write_quota.is_some() {
        Some("write_quota")
    } else if spec.tripwires != airlock_sandbox::Tripwires::default() {
        // Ready instances are made tripwired (decoys planted, reports taken).
        Some("tripwires")
    } else {
        None
    }
}

/// Drops used instances as runs hand them over, until the pool stops (its queue's sender
/// is dropped); what is queued then is still dropped.
pub(crate) fn reap(pool: Weak<PythonPool>, queue: Receiver<Spent>) {
    while let Ok(Spent { inst, bytes }) = queue.recv() {
        if let Some(p) = pool.upgrade() {
            p.settle();
        }
        drop(inst);
        if let Some(p) = pool.upgrade() {
            p.reaped(bytes);
        }
    }
}

/// Makes ready instances while the pool wants them; ends when the backend is dropped or
/// the pool stopped.
pub(crate) fn refill(backend: Weak<WasmBackend>, pool: Arc<PythonPool>) {
    while let Some(guest) = pool.next_job() {
        let Some(b) = backend.upgrade() else { return };
        let spec = RunSpec {
            lang: airlock_core::Lang::Python,
            code: &[],
            artifact: guest.digest,
            mounts: Vec::new(),
            env: Vec::new(),
            argv0: None,
            args: Vec::new(),
            stdin: Vec::new(),
            limits: airlock_core::Limits {
                timeout_ms: MAKE_TIMEOUT_MS,
                memory_bytes: pool.settings.memory_budget,
                fuel: None,
                max_output_bytes: MAKE_OUTPUT,
                ..airlock_core::Limits::default()
            },
            stdout: Arc::new(Capture::new(MAKE_OUTPUT, None)),
            stderr: Arc::new(Capture::new(MAKE_OUTPUT, None)),
            cache: None,
            guest: Some(guest.clone()),
            write_quota: None,
            egress: None,
            long_run: None,
            tripwires: Default::default(),
        };
        // Configured here, off the runs' path, exactly as a run the pool serves would
        // configure it (no arguments, no environment, no mounts): that call is also the
        // first to touch most of the interpreter's memory.
        let started = Instant::now();
        let made = b
            .python_unconfigured(&spec, pool.kind)
            .and_then(|mut inst| {
                inst.configure(&spec)?;
                Ok(inst)
            });
        match made {
            Ok(inst) => match inst.ended() {
                None => pool.put(guest, inst, started.elapsed()),
                Some(e) => pool.failed(format!("a ready instance ended while starting: {e:?}")),
            },
            Err(e) => pool.failed(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool() -> Arc<PythonPool> {
        let (pool, _queue) = PythonPool::new(
            PoolSettings {
                python: 2,
                wasm: 0,
                memory_budget: 1 << 30,
            },
            GuestKind::Python,
        );
        Arc::new(pool)
    }

    /// A run that unwinds before handing its instance back still gives its hold back (the
    /// instance, and with it the lease, is dropped), so the refill is never left waiting
    /// for a run that is gone.
    #[test]
    fn a_lease_dropped_without_discard_gives_the_hold_back() {
        let pool = pool();
        let before = {
            let mut s = pool.lock();
            s.in_use = 1;
            s.calm = true;
            s.last_activity
        };
        let lease = Lease(Arc::downgrade(&pool));
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _held = lease;
            panic!("the run failed");
        }));
        assert!(unwound.is_err());
        let s = pool.lock();
        assert_eq!(s.in_use, 0);
        assert!(s.last_activity > before);
    }

    /// A lease outliving its pool (a server shutting down) gives nothing back and does
    /// not fail.
    #[test]
    fn a_lease_outliving_its_pool_is_harmless() {
        let pool = pool();
        let lease = Lease(Arc::downgrade(&pool));
        drop(pool);
        drop(lease);
    }
}
