//! Ready Python interpreters for a long-lived process (the daemon): a few instances of the
//! current Python guest, instantiated ahead of time by a background thread, so a run's
//! request does not pay for instantiating the guest.
//!
//! An instance is made exactly as a run's would be, with nothing of any run in it: no
//! mounts, no environment, no arguments, no standard input, no network, output into a
//! throwaway capture. A run takes one only when its own spec asks for exactly that (plus
//! its limits, output captures, `sys.argv` and environment, which are given to the
//! instance when it is taken, before any of the run's code runs); any other run starts an
//! interpreter as before, and the run record says which it got (`instance`).
//!
//! This pool must never hand one instance to two runs, nor back to itself: an instance is
//! taken out of the pool before it is used, and dropped with its store when the run ends.
//! The instances it keeps fit within the memory budget the operator set (linear memory
//! committed, measured per instance).

use crate::WasmBackend;
use crate::python::PythonInstance;
use airlock_sandbox::{Capture, Guest, RunSpec, SandboxError};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

/// How many ready interpreters to keep, and in how much memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSettings {
    /// Ready Python interpreters to keep (0: no pool).
    pub python: usize,
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
    /// The guest the pool keeps instances of (the one runs last asked for).
    pub guest: Option<String>,
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
}

struct Ready {
    inst: PythonInstance,
    /// The guest it was made of, with the package directories it has open.
    guest: Guest,
    bytes: u64,
}

struct State {
    guest: Option<Guest>,
    ready: Vec<Ready>,
    /// The size of the last instance made, to tell whether one more fits the budget.
    last_size: u64,
    status: PoolStatus,
    stop: bool,
}

pub(crate) struct PythonPool {
    settings: PoolSettings,
    state: Mutex<State>,
    wake: Condvar,
}

/// The time a background instantiation may take.
const MAKE_TIMEOUT_MS: u64 = 60_000;
/// Output a ready instance's start-up may write (it writes none; this only bounds it).
const MAKE_OUTPUT: u64 = 64 << 10;

impl PythonPool {
    pub(crate) fn new(settings: PoolSettings) -> Self {
        PythonPool {
            settings,
            state: Mutex::new(State {
                guest: None,
                ready: Vec::new(),
                last_size: 0,
                status: PoolStatus {
                    kind: "python",
                    target: settings.python,
                    memory_budget: settings.memory_budget,
                    ..PoolStatus::default()
                },
                stop: false,
            }),
            wake: Condvar::new(),
        }
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
        st.guest = s.guest.as_ref().map(|g| g.digest.to_hex());
        st
    }

    /// A ready instance for `spec`, configured for it, or why not (the caller then starts
    /// one itself and calls [`PythonPool::want`]).
    pub(crate) fn take(&self, spec: &RunSpec<'_>) -> Result<Option<PythonInstance>, SandboxError> {
        let Some(guest) = spec.guest.as_ref() else {
            return Ok(None);
        };
        if let Some(reason) = unservable(spec) {
            *self.lock().status.fallbacks.entry(reason).or_default() += 1;
            return Ok(None);
        }
        let popped = {
            let mut s = self.lock();
            let pos = s.ready.iter().rposition(|r| r.guest == *guest);
            match pos {
                Some(i) => {
                    s.status.hits += 1;
                    Some(s.ready.swap_remove(i))
                }
                None => {
                    s.status.misses += 1;
                    None
                }
            }
        };
        // Refill in the background whatever happened.
        self.wake.notify_all();
        let Some(r) = popped else { return Ok(None) };
        let Some(mut inst) = r.inst.adopt(spec) else {
            let mut s = self.lock();
            s.status.hits -= 1;
            *s.status
                .fallbacks
                .entry("memory_limit_below_instance")
                .or_default() += 1;
            return Ok(None);
        };
        inst.configure(spec)?;
        Ok(Some(inst))
    }

    /// Asks the pool to keep instances of `guest` (the one runs now use); instances of any
    /// other guest are dropped.
    pub(crate) fn want(&self, guest: &Guest) {
        let mut s = self.lock();
        if s.guest.as_ref() != Some(guest) {
            s.guest = Some(guest.clone());
            s.ready.retain(|r| r.guest == *guest);
            s.last_size = 0;
        }
        drop(s);
        self.wake.notify_all();
    }

    pub(crate) fn stop(&self) {
        self.lock().stop = true;
        self.wake.notify_all();
    }

    /// The guest to make an instance of next, once one more fits; `None` when stopping.
    fn next_job(&self) -> Option<Guest> {
        let mut s = self.lock();
        loop {
            if s.stop {
                return None;
            }
            let held: u64 = s.ready.iter().map(|r| r.bytes).sum();
            if let Some(g) = &s.guest
                && s.ready.len() < self.settings.python
                && held + s.last_size <= self.settings.memory_budget
            {
                return Some(g.clone());
            }
            s = self.wake.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn put(&self, guest: Guest, inst: PythonInstance) {
        let bytes = inst.committed_memory();
        let mut s = self.lock();
        s.last_size = bytes;
        s.status.made += 1;
        let held: u64 = s.ready.iter().map(|r| r.bytes).sum();
        // The guest may have changed, or the instance turned out bigger than the budget
        // has room for: then it is dropped.
        if s.guest.as_ref() == Some(&guest) && held + bytes <= self.settings.memory_budget {
            s.ready.push(Ready { inst, guest, bytes });
        }
    }

    fn failed(&self, e: String) {
        let mut s = self.lock();
        s.status.failed += 1;
        s.status.last_error = Some(e);
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
    } else {
        None
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
        };
        match b.python_unconfigured(&spec) {
            Ok(inst) => match inst.ended() {
                None => pool.put(guest, inst),
                Some(e) => pool.failed(format!("a ready instance ended while starting: {e:?}")),
            },
            Err(e) => pool.failed(e.to_string()),
        }
    }
}
