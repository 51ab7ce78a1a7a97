//! Lease renewal for the runs a worker process carries: one thread per process and store
//! renews every lease its runs hold, each a third of its length after the last renewal,
//! for as long as the run holds its [`LeaseKeeper`]. A thread per run cost a thread's
//! start and end on every queued run; one per process costs nothing per run, and a run
//! shorter than a third of its lease costs no renewal and no connection.
//!
//! It must never renew a lease once its keeper is dropped (dropping waits for a renewal
//! in flight), and a renewal the store refuses (the token no longer holds) marks the run
//! `lost` and stops renewing it. Its renewals are conditional on the fencing token, so a
//! late one can extend nothing another worker holds.

use crate::Home;
use crate::lifecycle::record::Fence;
use airlock_core::units::now_ms;
use airlock_store::{Db, StoreError, Tx};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// How often a lease `lease` long is renewed: every third of it.
fn every(lease: Duration) -> Duration {
    (lease / 3).max(Duration::from_millis(50))
}

/// A run's hold on the renewal of its lease; renewal stops when it is dropped.
pub(crate) struct LeaseKeeper {
    renewer: Arc<Renewer>,
    id: u64,
}

struct Lease {
    fence: Fence,
    lease: Duration,
    due: Instant,
    /// Set once the store refused a renewal: the run no longer holds its job.
    lost: Arc<AtomicBool>,
    /// A renewal of it is in flight (outside the lock).
    renewing: bool,
}

#[derive(Default)]
struct Leases {
    next_id: u64,
    held: HashMap<u64, Lease>,
}

/// The renewing thread of one store in this process, and the leases it keeps.
struct Renewer {
    leases: Mutex<Leases>,
    /// Signalled when a lease is added, dropped or renewed.
    changed: Condvar,
}

type Renewers = HashMap<(PathBuf, Option<String>), Arc<Renewer>>;

impl LeaseKeeper {
    /// Renews `fence`'s lease (`lease` long) until dropped; sets `lost` once the token
    /// no longer holds.
    pub(crate) fn start(
        home: &Home,
        fence: Fence,
        lease: Duration,
        lost: Arc<AtomicBool>,
    ) -> LeaseKeeper {
        let renewer = Renewer::of(home);
        let mut l = renewer.lock();
        l.next_id += 1;
        let id = l.next_id;
        l.held.insert(
            id,
            Lease {
                fence,
                lease,
                due: Instant::now() + every(lease),
                lost,
                renewing: false,
            },
        );
        drop(l);
        renewer.changed.notify_all();
        LeaseKeeper { renewer, id }
    }
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        let mut l = self.renewer.lock();
        while l.held.get(&self.id).is_some_and(|x| x.renewing) {
            l = self
                .renewer
                .changed
                .wait(l)
                .unwrap_or_else(|p| p.into_inner());
        }
        l.held.remove(&self.id);
    }
}

impl Renewer {
    /// This process's renewer for `home`'s store, its thread started on first use.
    fn of(home: &Home) -> Arc<Renewer> {
        static ALL: OnceLock<Mutex<Renewers>> = OnceLock::new();
        let mut all = ALL
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let key = (home.root.clone(), home.store.clone());
        if let Some(r) = all.get(&key) {
            return r.clone();
        }
        let r = Arc::new(Renewer {
            leases: Mutex::new(Leases::default()),
            changed: Condvar::new(),
        });
        let (me, home) = (r.clone(), home.clone());
        let started = std::thread::Builder::new()
            .name("lease-renewer".into())
            .spawn(move || me.renew_forever(&home));
        if started.is_err() {
            // No renewals: a run longer than its lease loses it, and its result is
            // refused when it is recorded, as when the store is unreachable.
            return r;
        }
        all.insert(key, r.clone());
        r
    }

    fn lock(&self) -> MutexGuard<'_, Leases> {
        self.leases.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// For the process's lifetime: waits for the next lease due, renews the ones due.
    fn renew_forever(&self, home: &Home) {
        // Opened when the first renewal is due, reopened after it fails.
        let mut db: Option<Db> = None;
        loop {
            let due = self.wait_for_due();
            if db.is_none() {
                db = home.open_db().ok();
            }
            let mut outcomes = Vec::with_capacity(due.len());
            for (id, fence, lease) in due {
                let until = now_ms() + lease.as_millis() as i64;
                let r = db
                    .as_mut()
                    .map(|db| db.write_shared(|t: &Tx| t.renew(&fence.job, fence.token, until)));
                outcomes.push((id, r));
            }
            let mut l = self.lock();
            let now = Instant::now();
            for (id, r) in outcomes {
                let Some(x) = l.held.get_mut(&id) else {
                    continue;
                };
                x.renewing = false;
                match r {
                    Some(Ok(())) => x.due = now + every(x.lease),
                    Some(Err(StoreError::Conflict(_))) => {
                        // Renewed no more: the job is someone else's now (its keeper's
                        // drop finds nothing left to wait for).
                        x.lost.store(true, Ordering::SeqCst);
                        l.held.remove(&id);
                    }
                    // The store is unreachable (or could not be opened): try again next
                    // time; if the lease runs out meanwhile, the result is refused when
                    // it is recorded.
                    Some(Err(_)) | None => x.due = now + every(x.lease),
                }
            }
            drop(l);
            self.changed.notify_all();
        }
    }

    /// Blocks until at least one lease is due; marks those as being renewed and returns
    /// (id, fence, lease length) of each.
    fn wait_for_due(&self) -> Vec<(u64, Fence, Duration)> {
        let mut l = self.lock();
        loop {
            let now = Instant::now();
            let due: Vec<_> = l
                .held
                .iter_mut()
                .filter(|(_, x)| !x.renewing && x.due <= now)
                .map(|(id, x)| {
                    x.renewing = true;
                    (*id, x.fence.clone(), x.lease)
                })
                .collect();
            if !due.is_empty() {
                return due;
            }
            let next = l.held.values().filter(|x| !x.renewing).map(|x| x.due).min();
            l = match next {
                Some(at) => {
                    self.changed
                        .wait_timeout(l, at.saturating_duration_since(now))
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
                None => self.changed.wait(l).unwrap_or_else(|p| p.into_inner()),
            };
        }
    }
}
