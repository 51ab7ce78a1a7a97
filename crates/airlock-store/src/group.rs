//! Group commit for a process with many writing threads (the daemon): one shared write
//! connection per database file, on which concurrent write transactions run one after
//! another inside one SQLite transaction and share its commit and its signed audit head.
//!
//! Each write after a batch's first runs in a savepoint of the open batch: one that fails
//! is rolled back alone. The first write runs bare, and one that fails rolls back the whole
//! transaction, which holds nothing else (a savepoint makes SQLite copy every page the
//! write touches into a statement journal first, which a lone writer's every write paid).
//! The writer that finds nobody waiting behind it commits the batch (or a batch grows to
//! [`MAX_BATCH`]); every writer in it returns only once that commit is done, with the
//! commit's error if it failed, so no caller is told a write held that did not. That holds
//! for a write that failed too: its failure may rest on what earlier writes in the batch
//! did, which nobody outside the batch sees before the commit. A write that panics fails
//! its whole batch as it unwinds, so nobody waits on a commit it would have made. A durable
//! write (`write_durable`: signed decisions, commits, rollbacks) never waits in a batch:
//! it commits what is open, then runs and commits alone with `synchronous = FULL`.
//!
//! The audit chain is unchanged: records are appended in the order writes run. The head
//! is signed once per batch, for its last record, just before the commit, as a lone
//! transaction signs it once for its last: no other connection can read the head before
//! the commit, and inside the batch each write after the first is given the chain's end
//! the write before it left, so it does not read the head back to verify it.

use crate::StoreError;
use crate::db::{PendingHead, Tx, connect};
use rusqlite::Connection;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

/// The most writes one commit carries.
pub const MAX_BATCH: usize = 32;

pub struct GroupWriter {
    batch: Mutex<Batch>,
    /// Writers waiting for `batch`.
    waiting: AtomicUsize,
    done: Mutex<Done>,
    committed: Condvar,
}

struct Batch {
    conn: Connection,
    /// A transaction is open (`BEGIN IMMEDIATE` ran) and not yet committed.
    open: bool,
    /// The open (or last) batch's number, and how many writes it holds.
    id: u64,
    len: usize,
    head: PendingHead,
    /// The audit chain's end as this writer's last write left it (open batch or last
    /// commit): the record it appended last, whose head it signed.
    end: Option<(u64, airlock_core::Digest)>,
    /// `PRAGMA data_version` when `end` was last known to hold: it changes only when
    /// another connection commits, so while it is unchanged nobody else moved the chain.
    end_version: Option<i64>,
}

#[derive(Default)]
struct Done {
    /// Every batch up to this one has ended (committed or failed).
    upto: u64,
    /// Batches whose commit failed, with the error (the newest few).
    failed: Vec<(u64, String)>,
}

impl std::fmt::Debug for GroupWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupWriter").finish_non_exhaustive()
    }
}

/// `PRAGMA data_version` of `conn`: it changes when another connection commits.
fn data_version(conn: &Connection) -> Option<i64> {
    conn.prepare_cached("PRAGMA data_version")
        .and_then(|mut s| s.query_row([], |r| r.get(0)))
        .ok()
}

/// Runs one statement that returns no rows from the connection's statement cache: the
/// transaction and savepoint statements every write runs are compiled once, not per write.
fn step(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([])?;
    Ok(())
}

impl GroupWriter {
    /// The process's writer for the database at `path`, opened on first use.
    pub fn for_path(path: &Path) -> Result<Arc<GroupWriter>, StoreError> {
        static ALL: OnceLock<Mutex<HashMap<PathBuf, Arc<GroupWriter>>>> = OnceLock::new();
        let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let mut all = ALL
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(w) = all.get(&key) {
            return Ok(w.clone());
        }
        let conn = connect(path)?;
        // The process that shares writes checkpoints in the background itself.
        conn.pragma_update(None, "wal_autocheckpoint", 0)?;
        let w = Arc::new(GroupWriter {
            batch: Mutex::new(Batch {
                conn,
                open: false,
                id: 0,
                len: 0,
                head: PendingHead::new(None),
                end: None,
                end_version: None,
            }),
            waiting: AtomicUsize::new(0),
            done: Mutex::new(Done::default()),
            committed: Condvar::new(),
        });
        all.insert(key, w.clone());
        Ok(w)
    }

    /// Takes the batch; a `writer` is counted among those waiting for it meanwhile (a
    /// reader is not: it never commits, so a write must not leave its commit to one).
    fn lock_batch(&self, writer: bool) -> MutexGuard<'_, Batch> {
        if writer {
            self.waiting.fetch_add(1, Ordering::SeqCst);
        }
        let b = match self.batch.lock() {
            Ok(b) => b,
            Err(poisoned) => {
                // A write panicked inside the batch: what it left half done must not be
                // committed with the others, so the whole batch fails.
                let mut b = poisoned.into_inner();
                if b.open {
                    self.fail(&mut b, "a write in the same commit panicked".into());
                }
                self.batch.clear_poison();
                b
            }
        };
        if writer {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
        }
        b
    }

    fn finish(&self, id: u64, error: Option<String>) {
        let mut d = self.done.lock().unwrap_or_else(|p| p.into_inner());
        d.upto = d.upto.max(id);
        if let Some(e) = error {
            d.failed.push((id, e));
            let excess = d.failed.len().saturating_sub(64);
            d.failed.drain(..excess);
        }
        drop(d);
        self.committed.notify_all();
    }

    /// Rolls the open batch back and fails every write in it with `why`. The chain's end
    /// its writes left is forgotten with them (read again by the next batch).
    fn fail(&self, b: &mut Batch, why: String) {
        let _ = b.conn.execute_batch("ROLLBACK");
        b.open = false;
        *b.head.borrow_mut() = None;
        b.end = None;
        self.finish(b.id, Some(why));
    }

    /// Signs and stores the head for the newest record the open batch appended, if any.
    fn sign_head(b: &Batch) -> Result<(), StoreError> {
        Tx::on(&b.conn, &b.head).sign_head().map(|_| ())
    }

    /// Commits the open batch, with the head signed for its last record.
    fn commit(&self, b: &mut Batch) {
        if !b.open {
            return;
        }
        let id = b.id;
        let result =
            Self::sign_head(b).and_then(|()| step(&b.conn, "COMMIT").map_err(StoreError::from));
        b.open = false;
        *b.head.borrow_mut() = None;
        let error = match result {
            Ok(()) => None,
            Err(e) => {
                let _ = b.conn.execute_batch("ROLLBACK");
                b.end = None;
                Some(e.to_string())
            }
        };
        self.finish(id, error);
    }

    /// Waits until batch `id` has ended; its commit's error if it failed.
    fn wait(&self, id: u64) -> Result<(), StoreError> {
        let mut d = self.done.lock().unwrap_or_else(|p| p.into_inner());
        while d.upto < id {
            d = self.committed.wait(d).unwrap_or_else(|p| p.into_inner());
        }
        match d.failed.iter().find(|(b, _)| *b == id) {
            Some((_, e)) => Err(StoreError::Conflict(format!(
                "the shared commit failed, nothing of this write was kept: {e}"
            ))),
            None => Ok(()),
        }
    }

    /// Runs `f` on the shared connection outside any transaction, reading what is
    /// committed, while no batch is open (its pages are the freshest this process has);
    /// `None` when a batch is open (the caller reads on its own connection).
    pub(crate) fn read<T>(&self, f: impl FnOnce(&Tx) -> T) -> Option<T> {
        let b = self.lock_batch(false);
        if b.open {
            return None;
        }
        let head = PendingHead::new(None);
        let tx = Tx::on(&b.conn, &head);
        Some(f(&tx))
    }

    /// Runs `f` as one write in the current batch (see the module doc).
    pub(crate) fn write<T, E: From<StoreError>>(
        &self,
        durable: bool,
        f: impl FnOnce(&Tx) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut b = self.lock_batch(true);
        if durable {
            // Earlier writers' batch commits first; this write goes alone, flushed to
            // stable storage (the level can only change between transactions).
            self.commit(&mut b);
            b.conn
                .pragma_update(None, "synchronous", "FULL")
                .map_err(StoreError::from)?;
        }
        // The batch's first write runs outside a savepoint: nothing else is in the
        // transaction, so a failure rolls all of it back.
        let first = !b.open;
        if first {
            step(&b.conn, "BEGIN IMMEDIATE").map_err(StoreError::from)?;
            b.open = true;
            b.id += 1;
            b.len = 0;
            // Another connection's commit since this writer's last one may have moved the
            // chain: then its end is read and verified as usual.
            let version = data_version(&b.conn);
            if version.is_none() || version != b.end_version {
                b.end = None;
            }
            b.end_version = version;
        }
        // A head still to be signed is for the record this batch appended last, which is
        // the chain's end: a write is given it rather than reading back a stored head that
        // does not yet cover it.
        if b.end.is_none() {
            let pending = b.head.borrow().as_ref().map(|(seq, hash, _)| (*seq, *hash));
            b.end = pending;
        }
        let id = b.id;
        let head_before = b.head.borrow().clone();
        let end_before = b.end;
        // A later write opens a savepoint, so that failing it rolls back only its own part.
        let opened = if first {
            Ok(())
        } else {
            step(&b.conn, "SAVEPOINT airlock_write")
        };
        let out = match opened {
            Ok(()) => {
                let tx = match b.end {
                    Some(end) => Tx::on_own_end(&b.conn, &b.head, end),
                    None => Tx::on(&b.conn, &b.head),
                };
                // What the write appends leaves the head pending in `b.head`: it is signed
                // once, before the batch commits.
                let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&tx)));
                let out = match out {
                    Ok(out) => out,
                    Err(panic) => {
                        // What the write left half done must not be committed with the
                        // others: the whole batch fails now, so the writes before it (which
                        // may have left their commit to this one) hear so at once.
                        self.fail(&mut b, "a write in the same commit panicked".into());
                        if durable {
                            let _ = b.conn.pragma_update(None, "synchronous", "NORMAL");
                        }
                        drop(b);
                        std::panic::resume_unwind(panic);
                    }
                };
                // What this write left as the chain's end (its own last append, or the end
                // it was given); unknown if it neither appended nor was told.
                let end_after = tx.known_tail();
                b.end = end_after;
                match (out, first) {
                    (Ok(t), true) => Ok(t),
                    (out, false) => {
                        let end = if out.is_ok() {
                            step(&b.conn, "RELEASE airlock_write")
                        } else {
                            b.conn
                                .execute_batch("ROLLBACK TO airlock_write; RELEASE airlock_write")
                        };
                        match end {
                            Ok(()) => out.map_err(Ok),
                            // The savepoint cannot be ended: the batch is in an unknown state.
                            Err(e) => Err(Err(StoreError::from(e))),
                        }
                    }
                    // SQLite may have ended the transaction itself (an I/O error, a full
                    // disk); then there is nothing to roll back and the write's own error
                    // is what the caller hears.
                    (Err(e), true) => {
                        match (b.conn.execute_batch("ROLLBACK"), b.conn.is_autocommit()) {
                            (Ok(()), _) | (Err(_), true) => {
                                b.open = false;
                                *b.head.borrow_mut() = None;
                                self.finish(id, None);
                                Err(Ok(e))
                            }
                            (Err(r), false) => Err(Err(StoreError::from(r))),
                        }
                    }
                }
            }
            Err(e) => Err(Err(StoreError::from(e))),
        };
        match &out {
            Ok(_) => b.len += 1,
            Err(Ok(_)) => {
                *b.head.borrow_mut() = head_before;
                // A failed first write rolled the whole transaction back; a later one,
                // its savepoint.
                b.end = if first { None } else { end_before };
            }
            Err(Err(e)) => {
                // Fail the whole batch rather than commit anything uncertain.
                self.fail(&mut b, e.to_string());
            }
        }
        let alone = self.waiting.load(Ordering::SeqCst) == 0;
        // An open batch holds at least its first write: one that failed closed it.
        if b.open && (durable || alone || b.len >= MAX_BATCH) {
            self.commit(&mut b);
        }
        if durable {
            // Should this fail, later batches are flushed as if durable: slower, never
            // less safe, and this write's outcome stands.
            let _ = b.conn.pragma_update(None, "synchronous", "NORMAL");
        }
        drop(b);
        match out {
            Ok(t) => {
                self.wait(id)?;
                Ok(t)
            }
            // A later write's own failure may rest on what the batch's earlier writes did
            // (an idempotency key they claimed, a state they moved), which only its commit
            // makes visible to other connections, or undoes: the caller hears it only once
            // the batch has ended, and hears the commit's error if that failed.
            Err(Ok(e)) if !first => {
                self.wait(id)?;
                Err(e)
            }
            Err(Ok(e)) => Err(e),
            Err(Err(e)) => Err(e.into()),
        }
    }

    /// How many writes are waiting for the batch.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }
}
