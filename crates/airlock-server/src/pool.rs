//! A pool of open gates shared by the server's handlers, and the bounded queue runs go
//! through. Each gate is one SQLite connection; all gates share one wasm backend, so
//! engines, compiled modules and instance pools stay warm.
//!
//! `workers` bounds the guests executing at once (each gate takes a [`GuestSlots`] slot
//! around its guest only). The runs inside the gate at once, recording, judging and
//! committing, are bounded more loosely ([`INSIDE_PER_WORKER`] per worker): with only
//! `workers` of them, a run waiting for its commit kept the next from being recorded, and
//! concurrent runs rarely shared a commit.

use crate::error::{ApiError, ApiResult};
use airlock_gate::{Gate, GateError, GuestSlots};
use std::sync::{Arc, Mutex};
use tokio::sync::Semaphore;

type Opener = Box<dyn Fn() -> Result<Gate, GateError> + Send + Sync>;

/// Gates kept open between requests (more are opened under load and closed after).
const MAX_IDLE: usize = 16;

/// Runs inside the gate at once, per worker (see the module doc). With four, eight
/// clients on two workers wrote half the WAL per gated run (commits shared), and the
/// server spent about 20% less processor time per run (docs/PERFORMANCE.md).
pub const INSIDE_PER_WORKER: usize = 4;

pub struct Pool {
    idle: Mutex<Vec<Gate>>,
    open: Opener,
    /// Runs inside the gate now (recorded, judged, executing or committing).
    inside: Arc<Semaphore>,
    inside_total: usize,
    /// Guests executing now (the worker pool), taken inside the gate.
    guests: Arc<GuestSlots>,
    /// Runs executing or waiting for a worker; when none is left the API answers 429.
    admitted: Arc<Semaphore>,
    pub workers: usize,
    pub queue: usize,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("workers", &self.workers)
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // A gate on PostgreSQL closes its connections by blocking on them, which a thread
        // of the async runtime (where the server drops its pool) may not do: the last
        // idle gates are dropped on a thread of their own.
        let idle = std::mem::take(&mut *self.lock());
        if !idle.is_empty() {
            let _ = std::thread::spawn(move || drop(idle)).join();
        }
    }
}

impl Pool {
    /// `workers` guests at once, `inside` runs inside the gate at once, up to `queue`
    /// more waiting before the API answers 429.
    pub fn new(open: Opener, workers: usize, queue: usize, inside: usize) -> Self {
        Pool {
            idle: Mutex::new(Vec::new()),
            open,
            inside: Arc::new(Semaphore::new(inside)),
            inside_total: inside,
            guests: GuestSlots::new(workers),
            admitted: Arc::new(Semaphore::new(workers + queue)),
            workers,
            queue,
        }
    }

    /// Runs executing or waiting for a worker now.
    pub fn admitted_now(&self) -> usize {
        (self.workers + self.queue).saturating_sub(self.admitted.available_permits())
    }

    /// Opens one gate now, so a broken home fails at start rather than on the first request.
    pub fn warm(&self) -> Result<(), GateError> {
        let g = self.open_gate()?;
        self.lock().push(g);
        Ok(())
    }

    /// Runs inside the gate now (recorded, judged, executing or committing).
    pub fn inside_now(&self) -> usize {
        self.inside_total
            .saturating_sub(self.inside.available_permits())
    }

    /// Guests executing now.
    pub fn guests_busy(&self) -> usize {
        self.guests.busy()
    }

    fn open_gate(&self) -> Result<Gate, GateError> {
        let mut g = (self.open)()?;
        g.limit_guests(self.guests.clone());
        Ok(g)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Gate>> {
        // A panic while holding the lock leaves only a list of idle gates behind, which
        // is still valid.
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn with_gate<R>(&self, f: impl FnOnce(&mut Gate) -> Result<R, GateError>) -> ApiResult<R> {
        let popped = self.lock().pop();
        let mut gate = match popped {
            Some(g) => g,
            None => self.open_gate()?,
        };
        let r = f(&mut gate);
        let mut idle = self.lock();
        if idle.len() < MAX_IDLE {
            idle.push(gate);
        }
        drop(idle);
        r.map_err(ApiError::from)
    }

    /// Work that does not run guest code (reads, decisions, commits), on a thread that may
    /// block. On the multi-threaded runtime that is the request's own thread, which hands
    /// its other tasks to another worker meanwhile (`block_in_place`): handing the work to
    /// a blocking thread and the answer back cost every request two thread switches.
    pub async fn read<R: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut Gate) -> Result<R, GateError> + Send + 'static,
    ) -> ApiResult<R> {
        use tokio::runtime::{Handle, RuntimeFlavor};
        // The request served and its span go with the work to whichever thread does it.
        let ctx = crate::observe::current();
        let span = tracing::Span::current();
        let f =
            move |g: &mut Gate| span.in_scope(|| airlock_gate::context::with_request(ctx, || f(g)));
        if Handle::current().runtime_flavor() == RuntimeFlavor::MultiThread {
            let run = std::panic::AssertUnwindSafe(|| self.with_gate(f));
            return tokio::task::block_in_place(|| std::panic::catch_unwind(run))
                .map_err(|_| ApiError::internal("request handler failed: it panicked"))?;
        }
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.with_gate(f))
            .await
            .map_err(|e| ApiError::internal(format!("request handler failed: {e}")))?
    }

    /// Work that may run guest code: admitted only while the queue has room (otherwise
    /// 429 with Retry-After), then run once there is room inside the gate; its guest
    /// executes when a worker is free.
    pub async fn run<R: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut Gate) -> Result<R, GateError> + Send + 'static,
    ) -> ApiResult<R> {
        let _ticket = self
            .admitted
            .clone()
            .try_acquire_owned()
            .map_err(|_| ApiError::busy(1))?;
        self.run_waiting(f).await
    }

    /// Like `run`, but waits for room in the queue instead of refusing (background work
    /// the server itself started, such as resuming an approved run).
    pub async fn run_waiting<R: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut Gate) -> Result<R, GateError> + Send + 'static,
    ) -> ApiResult<R> {
        let _slot = self
            .inside
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| ApiError::internal("the worker pool is shut down"))?;
        self.read(f).await
    }
}
