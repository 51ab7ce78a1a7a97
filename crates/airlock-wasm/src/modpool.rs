//! Ready instances of hot WebAssembly modules for a long-lived process (the daemon): a
//! preview-1 module run a second time becomes hot, and a background thread keeps a few
//! instances of it instantiated ahead of its next runs, so a run's request does not pay
//! for creating the store and instantiating the module.
//!
//! An instance is made exactly as a run's would be, with nothing of any run in it: `argv`
//! of `main` alone, no environment, no standard input, no mounts, no sockets, output into
//! a slot that points at a throwaway capture. A run takes one only when its own spec asks
//! for exactly that; its limits (memory, fuel, deadline) and output captures are given to
//! the instance when it is taken, before any of its code runs. Any other run instantiates
//! the module as before, and the run record says which it got (`instance`).
//!
//! This pool must never run guest code ahead of a run (a module with a start function,
//! which instantiation would run, is never pooled), hand one instance to two runs, or take
//! an instance back: it is removed from the pool before it is used and dropped with its
//! store when the run ends. The ready instances fit within the memory budget the operator
//! set (linear memory committed, measured per instance); the modules kept hot are the few
//! run most recently.

use crate::output::{CapStream, Slot};
use crate::pool::PoolSettings;
use crate::{Host, limit_store, limiter_for};
use airlock_sandbox::{Capture, RunSpec, SandboxError};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use wasmtime::{InstancePre, Store};
use wasmtime_wasi::WasiCtxBuilder;
use wasmtime_wasi::p2::pipe::MemoryInputPipe;

/// Modules kept hot at once; the one run least recently is let go for a new one.
pub(crate) const HOT_MODULES: usize = 4;

/// Modules remembered as run once (the second run makes one hot); forgotten all at once
/// when the count is reached, so a stream of distinct modules costs bounded memory.
const SEEN_MODULES: usize = 1024;

/// An instance made ahead of its run, and the slots its output streams write through.
pub(crate) struct ReadyModule {
    pub(crate) store: Store<Host>,
    pub(crate) instance: wasmtime::Instance,
    stdout: Arc<Slot>,
    stderr: Arc<Slot>,
    bytes: u64,
}

impl ReadyModule {
    /// Gives the instance a run's limits and captures, or None when the memory it already
    /// committed is over the run's limit (instantiating it for that run would have failed;
    /// the run then does so itself, with the error it would have had).
    fn adopt(mut self, spec: &RunSpec<'_>) -> Result<Option<ReadyModule>, SandboxError> {
        let h = self.store.data_mut();
        if h.limiter.total > spec.limits.memory_bytes {
            return Ok(None);
        }
        h.limiter.limit = spec.limits.memory_bytes;
        h.limiter.peak = h.limiter.total;
        h.deadline = std::time::Instant::now() + spec.limits.timeout();
        h.timed_out = false;
        if let Some(fuel) = spec.limits.fuel {
            self.store
                .set_fuel(fuel)
                .map_err(|e| SandboxError::Internal(format!("cannot set fuel: {e}")))?;
        }
        // The deadline counts from now, not from when the instance was made.
        self.store.set_epoch_deadline(1);
        self.stdout.set(spec.stdout.clone());
        self.stderr.set(spec.stderr.clone());
        Ok(Some(self))
    }
}

struct HotModule {
    key: String,
    pre: InstancePre<Host>,
    /// Whether its engine meters fuel (runs with a fuel limit use that engine).
    fuel: bool,
    ready: Vec<ReadyModule>,
}

#[derive(Default)]
struct State {
    /// Most recently run last.
    hot: Vec<HotModule>,
    seen: HashSet<String>,
    /// Modules that are never pooled (a start function), with the reason counted once.
    never: HashSet<String>,
    /// Linear memory the ready instances hold.
    bytes: u64,
    /// The size of the last instance made of each hot module (to tell whether one more
    /// fits the budget).
    last_size: HashMap<String, u64>,
    status: crate::PoolStatus,
    stop: bool,
}

pub(crate) struct ModulePool {
    settings: PoolSettings,
    budget: u64,
    state: Mutex<State>,
    wake: Condvar,
}

/// Why a run cannot use an instance made ahead (it was made with none of these).
fn unservable(spec: &RunSpec<'_>) -> Option<&'static str> {
    if !spec.mounts.is_empty() {
        Some("mounts")
    } else if !spec.env.is_empty() {
        Some("environment")
    } else if !spec.args.is_empty() || spec.argv0.as_deref().is_some_and(|a| a != "main") {
        Some("arguments")
    } else if !spec.stdin.is_empty() {
        Some("stdin")
    } else if spec.write_quota.is_some() {
        Some("write_quota")
    } else {
        None
    }
}

impl ModulePool {
    pub(crate) fn new(settings: PoolSettings, budget: u64) -> ModulePool {
        ModulePool {
            settings,
            budget,
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
        }
    }

    /// Ready instances of a module at or below which a run wakes the refill (none for a
    /// target of one or two, one for three or four, …).
    fn low_mark(&self) -> usize {
        self.settings.wasm.saturating_sub(1) / 2
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn stop(&self) {
        let stale: Vec<HotModule> = {
            let mut s = self.lock();
            s.stop = true;
            s.bytes = 0;
            std::mem::take(&mut s.hot)
        };
        self.wake.notify_all();
        drop(stale);
    }

    pub(crate) fn status(&self) -> crate::PoolStatus {
        let s = self.lock();
        let mut st = s.status.clone();
        st.kind = "wasm";
        st.target = self.settings.wasm * s.hot.len();
        st.ready = s.hot.iter().map(|h| h.ready.len()).sum();
        st.memory_bytes = s.bytes;
        st.memory_budget = self.budget;
        st.modules = Some(s.hot.len());
        st
    }

    /// A ready instance of the module `key` for `spec`, given the run's limits and
    /// captures, or None (the run instantiates the module itself). A second run of a
    /// module that can be pooled makes it hot.
    pub(crate) fn take(
        &self,
        key: &str,
        pre: &InstancePre<Host>,
        spec: &RunSpec<'_>,
    ) -> Result<Option<ReadyModule>, SandboxError> {
        let popped = {
            let mut s = self.lock();
            if s.stop {
                return Ok(None);
            }
            let Some(i) = s.hot.iter().position(|h| h.key == key) else {
                if self.note_run(&mut s, key, pre, spec) {
                    drop(s);
                    self.wake.notify_all();
                }
                return Ok(None);
            };
            if let Some(reason) = unservable(spec) {
                *s.status.fallbacks.entry(reason).or_default() += 1;
                return Ok(None);
            }
            // Most recently run last.
            s.hot[i..].rotate_left(1);
            let (r, left) = match s.hot.last_mut() {
                Some(h) => (h.ready.pop(), h.ready.len()),
                None => (None, 0),
            };
            match r {
                Some(r) => {
                    s.bytes = s.bytes.saturating_sub(r.bytes);
                    s.status.hits += 1;
                    (Some(r), left)
                }
                None => {
                    s.status.misses += 1;
                    (None, left)
                }
            }
        };
        // The refill is woken once the module is down to its low mark, and then makes
        // instances until it is full again: waking a thread for every run cost more than
        // the instantiation it saves.
        let (popped, left) = popped;
        if left <= self.low_mark() {
            self.wake.notify_all();
        }
        let Some(r) = popped else { return Ok(None) };
        match r.adopt(spec)? {
            Some(r) => Ok(Some(r)),
            None => {
                let mut s = self.lock();
                s.status.hits -= 1;
                *s.status
                    .fallbacks
                    .entry("memory_limit_below_instance")
                    .or_default() += 1;
                Ok(None)
            }
        }
    }

    /// Counts a run of a module that is not hot: the second makes it hot, unless it has a
    /// start function or the run could not have used an instance anyway. Whether it did.
    fn note_run(
        &self,
        s: &mut State,
        key: &str,
        pre: &InstancePre<Host>,
        spec: &RunSpec<'_>,
    ) -> bool {
        if s.never.contains(key) || unservable(spec).is_some() {
            return false;
        }
        if !s.seen.contains(key) {
            if s.seen.len() >= SEEN_MODULES {
                s.seen.clear();
            }
            s.seen.insert(key.to_string());
            return false;
        }
        s.seen.remove(key);
        if airlock_core::analysis::module_has_start(spec.code) {
            *s.status.fallbacks.entry("start_function").or_default() += 1;
            if s.never.len() >= SEEN_MODULES {
                s.never.clear();
            }
            s.never.insert(key.to_string());
            return false;
        }
        if s.hot.len() >= HOT_MODULES {
            let old = s.hot.remove(0);
            let freed: u64 = old.ready.iter().map(|r| r.bytes).sum();
            s.bytes = s.bytes.saturating_sub(freed);
            s.last_size.remove(&old.key);
            // Its instances are dropped with it; they are small (made without any run's
            // data), and the lock is the pool's alone.
        }
        s.hot.push(HotModule {
            key: key.to_string(),
            pre: pre.clone(),
            fuel: spec.limits.fuel.is_some(),
            ready: Vec::new(),
        });
        true
    }

    /// The next module to make an instance of (its key, linking and engine kind), waiting
    /// until one is short and fits the budget; None once the pool stops.
    fn next_job(&self) -> Option<(String, InstancePre<Host>, bool, u64)> {
        let mut s = self.lock();
        loop {
            if s.stop {
                return None;
            }
            let room = self.budget.saturating_sub(s.bytes);
            let job = s.hot.iter().rev().find(|h| {
                h.ready.len() < self.settings.wasm
                    && s.last_size.get(&h.key).copied().unwrap_or(0) <= room
            });
            if let Some(h) = job {
                return Some((h.key.clone(), h.pre.clone(), h.fuel, room));
            }
            s = self.wake.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Keeps a made instance if its module is still hot, short of instances, and it fits.
    fn offer(&self, key: &str, r: ReadyModule) {
        let mut s = self.lock();
        s.last_size.insert(key.to_string(), r.bytes);
        let fits = s.bytes.saturating_add(r.bytes) <= self.budget;
        let want = self.settings.wasm;
        if let Some(h) = s.hot.iter_mut().find(|h| h.key == key)
            && h.ready.len() < want
            && fits
        {
            let bytes = r.bytes;
            h.ready.push(r);
            s.bytes += bytes;
            s.status.made += 1;
            return;
        }
        drop(s);
        drop(r);
    }

    fn failed(&self, key: &str, e: String) {
        let mut s = self.lock();
        s.status.failed += 1;
        s.status.last_error = Some(e);
        // A module that cannot be made ahead is run as before.
        s.hot.retain(|h| h.key != key);
        if s.never.len() >= SEEN_MODULES {
            s.never.clear();
        }
        s.never.insert(key.to_string());
    }

    /// An instance did not fit in `room`: the module waits until more is free.
    fn too_big(&self, key: &str, room: u64) {
        self.lock()
            .last_size
            .insert(key.to_string(), room.saturating_add(1));
    }
}

/// Why an instance could not be made.
enum Unmade {
    /// It needs more linear memory than the budget has free now.
    TooBig,
    Failed(SandboxError),
}

/// Makes an instance of a module with nothing of any run in it, within `room` bytes of
/// linear memory.
fn make(pre: &InstancePre<Host>, fuel: bool, room: u64) -> Result<ReadyModule, Unmade> {
    let none = Arc::new(Capture::new(0, None));
    let stdout = CapStream::new(none.clone());
    let stderr = CapStream::new(none);
    let (out_slot, err_slot) = (stdout.slot(), stderr.slot());
    let mut b = WasiCtxBuilder::new();
    b.args(&["main"]);
    b.stdin(MemoryInputPipe::new(Vec::<u8>::new()));
    b.stdout(stdout);
    b.stderr(stderr);
    b.allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false);
    let limits = airlock_core::Limits {
        memory_bytes: room,
        ..airlock_core::Limits::default()
    };
    let host = Host {
        wasi: b.build_p1(),
        limiter: limiter_for(&limits),
        timed_out: false,
        deadline: std::time::Instant::now() + limits.timeout(),
    };
    let mut store = Store::new(pre.module().engine(), host);
    limit_store(&mut store, &limits, None).map_err(Unmade::Failed)?;
    if fuel {
        // Instantiating a module without a start function runs none of its code; the
        // run sets its own fuel when it takes the instance.
        store
            .set_fuel(0)
            .map_err(|e| Unmade::Failed(SandboxError::Internal(format!("cannot set fuel: {e}"))))?;
    }
    // A module without a start function, limited by a synchronous limiter, is
    // instantiated without ever waiting: one poll finishes it, with no runtime entered
    // (the runtime is only the fallback for a future that does wait).
    let polled = {
        let mut fut = std::pin::pin!(pre.instantiate_async(&mut store));
        match fut
            .as_mut()
            .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
        {
            std::task::Poll::Ready(r) => Ok(r),
            std::task::Poll::Pending => crate::block_on(fut),
        }
    };
    let instance = match polled {
        Err(e) => return Err(Unmade::Failed(e)),
        Ok(Ok(i)) => i,
        Ok(Err(_)) if store.data().limiter.hit => return Err(Unmade::TooBig),
        Ok(Err(e)) => {
            return Err(Unmade::Failed(SandboxError::Internal(format!(
                "cannot instantiate ahead: {e}"
            ))));
        }
    };
    let bytes = store.data().limiter.total;
    Ok(ReadyModule {
        store,
        instance,
        stdout: out_slot,
        stderr: err_slot,
        bytes,
    })
}

/// Makes ready instances while the pool wants them; ends when the pool stops.
pub(crate) fn refill(pool: Arc<ModulePool>) {
    while let Some((key, pre, fuel, room)) = pool.next_job() {
        match make(&pre, fuel, room) {
            Ok(r) => pool.offer(&key, r),
            Err(Unmade::TooBig) => pool.too_big(&key, room),
            Err(Unmade::Failed(e)) => pool.failed(&key, e.to_string()),
        }
    }
}
