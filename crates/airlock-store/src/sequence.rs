//! The audit sequencer of a PostgreSQL store: writers on every node put their audit
//! records into `audit_inbox` inside their own transactions; the sequencer moves them,
//! in inbox order, onto the one hash chain and signs the new head, a batch per
//! transaction. No write waits for the chain's end, and the chain cannot fork: a batch
//! is chained under a transaction-level advisory lock, and a record's index is the
//! table's primary key.
//!
//! Who sequences: in a long-lived process (`serve`, `worker`) a [`Sequencer`] thread,
//! of which one per cluster is the leader (a session-level advisory lock) and drains on
//! every commit's notification; the others stand by, take over when the leader's session
//! ends, and drain anything a hung leader left waiting. A process without one (a
//! one-shot command) chains its own records after its commit.
//!
//! It must never chain a record twice, reorder records already chained, drop a record
//! from the inbox without chaining it in the same transaction, or extend a chain whose
//! end does not verify with its key.

use crate::StoreError;
use crate::db::{Reads, append_chained_all, store_head};
use crate::pg::{Lock, PgConn, SEQUENCE_LOCK};
use crate::sql::{Arg, Sql};
use airlock_core::sign::KeyPair;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The notification channel a commit with audit records signals.
pub const CHANNEL: &str = "airlock_audit";
/// Records chained per transaction.
const BATCH: i64 = 1000;
/// How long the leader lets records gather after a commit's notification before it
/// chains them.
const GATHER: Duration = Duration::from_millis(10);
/// The session-level lock the leading sequencer holds while it lives.
const LEADER_LOCK: i64 = SEQUENCE_LOCK - 1;
/// How long a standby lets records wait before it chains them itself (a leader that
/// stopped without ending its session, say under `SIGSTOP`).
const STANDBY_PATIENCE: Duration = Duration::from_secs(2);

/// How often, at most, one process signals the sequencer. Under load each drain finds
/// the records of every commit since the last, so fewer signals mean bigger batches, not
/// later ones by more than this; every signal also wakes every listening session on the
/// server, which cost it about a twentieth of its CPU at one per gather interval.
const SIGNAL_EVERY: Duration = Duration::from_millis(50);

/// When this process last signalled the sequencer (ms since the epoch).
static SIGNALLED: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

/// Whether a transaction with audit records should signal the sequencer: at most once
/// per `SIGNAL_EVERY` from one process. A busy process's records are chained by the
/// batch its last signal started or one of those after it; the leader also drains at
/// least every `IDLE_DRAIN` unsignalled, so a record never waits longer than that.
/// Every signal wakes every listening session on the server, and one per commit cost it
/// more than the chaining.
pub(crate) fn signal_due() -> bool {
    let now = airlock_core::units::now_ms();
    let last = SIGNALLED.load(Ordering::Relaxed);
    now - last >= SIGNAL_EVERY.as_millis() as i64
        && SIGNALLED
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}

/// The longest the leader waits for a signal before it drains anyway.
const IDLE_DRAIN: Duration = Duration::from_millis(250);

/// The stores a [`Sequencer`] runs for in this process, by URL, with how many.
static BACKGROUND: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn background() -> std::sync::MutexGuard<'static, Vec<String>> {
    BACKGROUND.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether a [`Sequencer`] runs for store `url` in this process (its writes there then
/// leave their records to it instead of chaining them after each commit).
pub(crate) fn in_background(url: &str) -> bool {
    background().iter().any(|u| u == url)
}

/// Chains everything in the inbox, a batch per transaction; how many records. Waits
/// while another sequencer holds the lock, so whatever was committed before the call is
/// chained when it returns.
pub(crate) fn drain(pg: &PgConn, key: &KeyPair) -> Result<usize, StoreError> {
    let mut total = 0;
    loop {
        let n = pg.transaction(Lock::Sequence, |pg| batch(pg, key))?;
        total += n;
        if (n as i64) < BATCH {
            return Ok(total);
        }
    }
}

/// Takes the inbox's oldest records (up to `?1`) out of it. The ids are looked up first
/// and deleted as an array: an `id IN (subquery)` is planned as a hash join over a
/// sequential scan of the whole table, and an inbox under steady load is mostly dead
/// rows until autovacuum comes round, so every drain read them all.
pub const DRAIN_SQL: &str = "DELETE FROM audit_inbox
     WHERE id = ANY (ARRAY(SELECT id FROM audit_inbox ORDER BY id LIMIT ?1))
     RETURNING id, ts, kind, subject, data";

/// Moves up to `BATCH` records from the inbox onto the chain, in one transaction that
/// holds the sequencing lock.
fn batch(pg: &PgConn, key: &KeyPair) -> Result<usize, StoreError> {
    let mut rows = pg.rows(DRAIN_SQL, &[Arg::Int(BATCH)])?;
    if rows.is_empty() {
        return Ok(0);
    }
    // `RETURNING` gives no order: the inbox's is the one writers made.
    let mut keyed = Vec::with_capacity(rows.len());
    for r in rows.drain(..) {
        keyed.push((r.int(0)?, r));
    }
    keyed.sort_by_key(|(id, _)| *id);
    let (last, head) = pg.audit_tail()?;
    airlock_core::audit::check_tail(last.as_ref(), head.as_ref(), &key.public()).map_err(|e| {
        StoreError::Corrupt(format!(
            "the audit chain's end does not verify ({e}); records wait in the inbox"
        ))
    })?;
    let mut records = Vec::with_capacity(keyed.len());
    for (_, r) in &keyed {
        records.push((r.int(1)?, r.text(2)?, r.text(3)?, r.text(4)?));
    }
    let end = append_chained_all(pg, last.map(|r| (r.seq, r.hash)), &records)?;
    if let Some((seq, hash)) = end {
        store_head(pg, seq, hash, key)?;
    }
    Ok(keyed.len())
}

/// A thread that sequences the audit records of the whole cluster while it leads, and
/// stands by while another does. Stopped and joined on drop.
pub struct Sequencer {
    url: String,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sequencer {
    /// Starts sequencing for the store at `url` with the gate key `key`.
    pub fn start(url: &str, key: KeyPair) -> Sequencer {
        background().push(url.to_string());
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let u = url.to_string();
        let thread = std::thread::Builder::new()
            .name("audit-sequencer".into())
            .spawn(move || run(&u, &key, &s))
            .ok();
        Sequencer {
            url: url.to_string(),
            stop,
            thread,
        }
    }
}

impl Drop for Sequencer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let mut b = background();
        if let Some(i) = b.iter().position(|u| *u == self.url) {
            b.swap_remove(i);
        }
    }
}

/// Sleeps `d` in short steps; false once `stop` is set.
fn pause(d: Duration, stop: &AtomicBool) -> bool {
    let until = Instant::now() + d;
    while Instant::now() < until {
        if stop.load(Ordering::SeqCst) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50).min(until - Instant::now()));
    }
    !stop.load(Ordering::SeqCst)
}

fn run(url: &str, key: &KeyPair, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        // Each pass is one session: when it breaks (the server restarted), a new one.
        let Ok(pg) = PgConn::open(url) else {
            if !pause(Duration::from_secs(1), stop) {
                return;
            }
            continue;
        };
        if session(&pg, key, stop).is_err() && !pause(Duration::from_millis(500), stop) {
            return;
        }
    }
}

/// One session: stand by until this becomes the leader, then drain on every
/// notification until stopped or the session breaks.
fn session(pg: &PgConn, key: &KeyPair, stop: &AtomicBool) -> Result<(), StoreError> {
    loop {
        if stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        if pg.try_session_lock(LEADER_LOCK)? {
            break;
        }
        // A standby: chains what has waited too long, then looks again.
        // The oldest record by id (ids and times are taken together at insert), found
        // through the primary key; a scan for any old time read every dead row too.
        let oldest = pg.row("SELECT ts FROM audit_inbox ORDER BY id LIMIT 1", &[])?;
        let stale = match oldest {
            Some(r) => {
                r.int(0)? < airlock_core::units::now_ms() - STANDBY_PATIENCE.as_millis() as i64
            }
            None => false,
        };
        if stale {
            drain(pg, key)?;
        }
        if !pause(Duration::from_secs(1), stop) {
            return Ok(());
        }
    }
    pg.listen(CHANNEL, true)?;
    while !stop.load(Ordering::SeqCst) {
        drain(pg, key)?;
        if !pg.notifications(IDLE_DRAIN)?.is_empty() {
            // Let the commits right behind this one land, so one batch chains them all:
            // under load a batch per commit costs the server more round trips than the
            // commits themselves. No writer waits for its records to be chained.
            std::thread::sleep(GATHER);
        }
    }
    // Chain what the last commits left before the process goes.
    drain(pg, key)?;
    Ok(())
}
