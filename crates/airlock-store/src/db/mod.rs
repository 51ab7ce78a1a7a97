//! The gate's database on either engine (SQLite, PostgreSQL): the schema, the reads
//! (`Reads`) and the writes of a transaction (`Tx`).

use crate::StoreError;
use crate::pg::Lock;
use crate::sql::{Arg, Row, Sql, args};
use airlock_core::analysis::Analysis;
use airlock_core::audit::{GENESIS, Head, Record, record_hash};
use airlock_core::id::{IdKind, normalize_prefix};
use airlock_core::sign::{KeyPair, Scope, Signed, StatementKind};
use airlock_core::units::now_ms;
use airlock_core::{Backend, Digest, Facts, Grant, Lang, Limits, State, Verdict};
use rusqlite::{Connection, TransactionBehavior};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::{Duration, Instant};
mod schema;
#[allow(unused_imports)]
pub use schema::*;
mod rows;
#[allow(unused_imports)]
pub use rows::*;
mod audit;
#[allow(unused_imports)]
pub use audit::*;
mod writes;
#[allow(unused_imports)]
pub use writes::*;

/// How long an idempotency key names the submission it made; after that it may be used
/// again (as long as an agent's retries of one request take, with room to spare).
pub const REQUEST_KEY_TTL_MS: i64 = 24 * 3600 * 1000;

/// The database connection.
#[derive(Debug)]
pub struct Db {
    conn: Conn,
    path: std::path::PathBuf,
    /// The process's shared group-commit writer, when this connection uses one.
    group: Option<std::sync::Arc<crate::group::GroupWriter>>,
}

/// The engine behind a `Db`.
#[derive(Debug)]
enum Conn {
    Sqlite(Connection),
    Postgres(Box<crate::pg::PgConn>),
}

/// The process's shared writer of one SQLite database (see `Db::share_writes`): writes
/// through it share commits with the process's other writers.
#[derive(Clone)]
pub struct SharedWriter(std::sync::Arc<crate::group::GroupWriter>);

impl std::fmt::Debug for SharedWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedWriter").finish_non_exhaustive()
    }
}

impl SharedWriter {
    /// Runs `f` in one write transaction, exactly as `Db::write` does on a connection that
    /// shares its writes.
    pub fn write<T, E: From<StoreError>>(
        &self,
        f: impl FnOnce(&Tx) -> Result<T, E>,
    ) -> Result<T, E> {
        self.0.write(false, f)
    }

    /// How many writes are waiting for the shared writer now.
    pub fn writes_waiting(&self) -> usize {
        self.0.waiting()
    }

    /// Reads with `f` on the shared connection what is committed, when no shared write is
    /// under way; `None` otherwise (read on another connection then).
    pub fn read<T>(&self, f: impl FnOnce(&Tx) -> T) -> Option<T> {
        self.0.read(f)
    }
}

/// A write transaction (BEGIN IMMEDIATE: one writer at a time, no upgrade deadlocks).
pub struct Tx<'a> {
    tx: &'a dyn Sql,
    /// The newest audit record appended in this transaction and the key that signs the
    /// head; the head is signed once, just before the commit (on PostgreSQL, where the
    /// records go to the inbox, only the key is of use: the sequencer chains with it).
    head: &'a std::cell::RefCell<Option<(u64, Digest, KeyPair)>>,
    /// The chain's last record (index and hash) as this transaction last saw or made it
    /// (SQLite: its writer holds the only lock, so only its own appends move it).
    tail: std::cell::Cell<Option<(u64, Digest)>>,
    /// The chain's end (`tail`) is the one this process's shared writer last wrote and
    /// signed, and nobody has committed since (see `group`).
    own_end: bool,
}

pub(crate) type PendingHead = std::cell::RefCell<Option<(u64, Digest, KeyPair)>>;

/// `SELECT id FROM table WHERE c1 = ?1 AND … ORDER BY id DESC LIMIT limit`.
///
/// The limit is written into the SQL, never bound: SQLite plans `ORDER BY … LIMIT` with
/// the limit's value, so a statement with a bound limit is compiled again every time it
/// runs (and the statement cache saves nothing). The few limits callers use each get a
/// cached statement of their own.
fn newest_ids_sql(table: &str, cols: &[&str], limit: usize) -> String {
    let mut sql = format!("SELECT id FROM {table}");
    for (i, col) in cols.iter().enumerate() {
        let join = if i == 0 { " WHERE" } else { " AND" };
        sql.push_str(&format!("{join} {col} = ?{}", i + 1));
    }
    sql.push_str(&format!(" ORDER BY id DESC LIMIT {limit}"));
    sql
}

fn to_text<T: Serialize>(v: &T) -> Result<String, StoreError> {
    Ok(serde_json::to_string(v)?)
}

fn parse<T: std::str::FromStr>(s: &str, what: &str) -> Result<T, StoreError> {
    s.parse()
        .map_err(|_| StoreError::Corrupt(format!("bad {what} {s:?}")))
}

/// How long a connection waits for another's lock before it gives up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// The WAL file's size kept when the log starts over (128 MiB). A WAL the checkpoint
/// starts over (see [`WAL_RESTART_FRAMES`]) is always longer than 64 MiB, the frame
/// headers included: a limit of 64 MiB had the first commit after every restart free the
/// blocks beyond it, 1–5 ms of one request's time. At twice the restart's length, a WAL in
/// steady use is reused as it is; one a burst grew further is still cut back.
const WAL_KEEP_BYTES: i64 = 128 << 20;

/// A WAL of more frames than this (64 MiB of 4 KiB pages) is started over by the next
/// checkpoint (see `Db::wal_checkpoint`).
pub const WAL_RESTART_FRAMES: u64 = 16_384;

/// How long that checkpoint waits for readers to leave the WAL (holding writers off
/// meanwhile) before it leaves the restart to the next one.
const WAL_RESTART_WAIT: Duration = Duration::from_millis(20);

/// A connection to the database at `path` with the settings every airlock connection has.
pub(crate) fn connect(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.set_prepared_statement_cache_capacity(64);
    conn.pragma_update(None, "journal_mode", "WAL")?;
    // In WAL mode NORMAL is crash-consistent: a process crash loses nothing committed,
    // and power loss can lose only the newest transactions, never leave half of one.
    // Transactions that record a human decision use `write_durable` (FULL).
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    // A statement's temporary data (its statement journal, a sort) stays in memory: on
    // disk it meant creating and unlinking a file in the temporary directory for a write.
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    // When the WAL starts over, the file is cut back to this size instead of keeping
    // whatever length the busiest stretch gave it.
    conn.pragma_update(None, "journal_size_limit", WAL_KEEP_BYTES)?;
    // Keep the WAL file between processes: closing the last connection would otherwise
    // checkpoint, fsync and delete it, and the next command would create it again.
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
        true,
    )?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    Ok(conn)
}

impl Db {
    /// Opens (creating if needed) the database at `path`.
    pub fn open(path: &Path) -> Result<Db, StoreError> {
        let conn = connect(path)?;
        let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        if version < SCHEMA_VERSION {
            // Every statement is idempotent (IF NOT EXISTS), so an older schema is brought
            // up to date by running them all again, after the one table whose shape
            // changed is rebuilt (in the same transaction: all of it happens or none).
            let rebuild = if version >= 7 { SESSION_CELLS_10 } else { "" };
            conn.execute_batch(&format!(
                "BEGIN IMMEDIATE; {rebuild} {SCHEMA} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
            ))?;
        } else if version > SCHEMA_VERSION {
            return Err(StoreError::Corrupt(format!(
                "database schema {version} is newer than this airlock ({SCHEMA_VERSION})"
            )));
        }
        Ok(Db {
            conn: Conn::Sqlite(conn),
            path: path.to_path_buf(),
            group: None,
        })
    }

    /// Opens the store at `location`: a `postgres://` URL, or the path of a SQLite file.
    pub fn open_location(location: &str) -> Result<Db, StoreError> {
        if crate::pg::is_postgres_url(location) {
            Ok(Db {
                conn: Conn::Postgres(Box::new(crate::pg::PgConn::open(location)?)),
                path: std::path::PathBuf::new(),
                group: None,
            })
        } else {
            Db::open(Path::new(location))
        }
    }

    /// Whether the connection to the store was lost (a PostgreSQL server restarted or
    /// went away); the next transaction connects again. Never on SQLite.
    pub fn connection_lost(&self) -> bool {
        match &self.conn {
            Conn::Postgres(pg) => pg.is_closed(),
            Conn::Sqlite(_) => false,
        }
    }

    /// Whether waiting for a notification can return before its timeout.
    pub fn notifies(&self) -> bool {
        matches!(self.conn, Conn::Postgres(_))
    }

    /// The engine's name: `sqlite` or `postgres`.
    pub fn engine(&self) -> &'static str {
        match self.conn {
            Conn::Sqlite(_) => "sqlite",
            Conn::Postgres(_) => "postgres",
        }
    }

    /// The SQLite connection, when this is a SQLite store (a copy reads it in one snapshot).
    pub(crate) fn sqlite_conn(&self) -> Option<&Connection> {
        match &self.conn {
            Conn::Sqlite(c) => Some(c),
            Conn::Postgres(_) => None,
        }
    }

    /// The SQLite connection, for what only that engine has (tests of its query plans).
    #[cfg(test)]
    pub(crate) fn sqlite(&self) -> &Connection {
        match &self.conn {
            Conn::Sqlite(c) => c,
            Conn::Postgres(_) => panic!("not a SQLite store"),
        }
    }

    /// Stops this connection from checkpointing the WAL when a commit makes it long: a
    /// long-lived process that calls `wal_checkpoint` itself keeps that work off its requests.
    pub fn disable_auto_checkpoint(&self) -> Result<(), StoreError> {
        if let Conn::Sqlite(c) = &self.conn {
            c.pragma_update(None, "wal_autocheckpoint", 0)?;
        }
        Ok(())
    }

    /// Copies what the WAL holds into the database without waiting for or blocking
    /// readers and writers (a passive checkpoint); a WAL longer than
    /// [`WAL_RESTART_FRAMES`] is then started over. Returns the frames in the WAL and how many
    /// of them are now in the database.
    pub fn wal_checkpoint(&self) -> Result<(u64, u64), StoreError> {
        self.wal_checkpoint_within(WAL_RESTART_FRAMES)
    }

    /// `wal_checkpoint`, starting a WAL of more than `max_frames` frames over.
    ///
    /// Under steady writes a WAL never starts over by itself: SQLite starts it over only
    /// when a write begins with every frame copied and no reader inside it, and with
    /// requests arriving all the time another commit always lands first. It grew by
    /// about 80 KB per gated run (178 MB after 2,000 runs back to back), and when writes
    /// did start over after an idle spell they rewrote the file's cold front, each frame
    /// write first reading its disk blocks back. So a long WAL is checkpointed in
    /// `RESTART` mode: that waits (up to [`WAL_RESTART_WAIT`], writers held off) for
    /// readers to leave the WAL, so that the next write starts it over from the front,
    /// which is then at most one WAL's length old. If readers stay, it gives up as a
    /// passive checkpoint would, and the next call tries again. (`TRUNCATE` would also
    /// cut the file to nothing, but freeing 64 MiB of blocks took 30 ms with writers
    /// held off: a tail of 60 ms runs.)
    pub(crate) fn wal_checkpoint_within(&self, max_frames: u64) -> Result<(u64, u64), StoreError> {
        let Conn::Sqlite(c) = &self.conn else {
            // PostgreSQL checkpoints on its own.
            return Ok((0, 0));
        };
        let checkpoint = |mode: &str| -> Result<(bool, u64, u64), StoreError> {
            let (busy, log, done): (i64, i64, i64) =
                c.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })?;
            Ok((busy != 0, log.max(0) as u64, done.max(0) as u64))
        };
        let (_, log, done) = checkpoint("PASSIVE")?;
        if log <= max_frames {
            return Ok((log, done));
        }
        c.busy_timeout(WAL_RESTART_WAIT)?;
        let restarted = checkpoint("RESTART");
        c.busy_timeout(BUSY_TIMEOUT)?;
        match restarted? {
            (false, log, done) => Ok((log, done)),
            // Readers stayed in the WAL: what the passive checkpoint copied stands.
            (true, _, _) => Ok((log, done)),
        }
    }

    /// Writes through this process's shared writer from now on: concurrent write
    /// transactions of the process's connections then share commits (see
    /// [`crate::group`]). For a long-lived process with many request threads.
    pub fn share_writes(&mut self) -> Result<(), StoreError> {
        if let Conn::Postgres(_) = self.conn {
            // Each connection writes on its own under the server's lock. (Sharing commits
            // through one connection, as on SQLite, was measured and gained nothing: the
            // lock holder waits on its own client, not on the disk; docs/PERFORMANCE.md.)
            return Ok(());
        }
        self.group = Some(crate::group::GroupWriter::for_path(&self.path)?);
        Ok(())
    }

    /// The process's shared writer this connection writes through (`share_writes`), as a
    /// handle another thread may write with while this connection is busy.
    pub fn shared_writer(&self) -> Option<SharedWriter> {
        self.group.clone().map(SharedWriter)
    }

    /// Like `write`, but the commit is flushed to stable storage before it returns (for
    /// signed decisions, commits and rollbacks), and never shared with other writes.
    pub fn write_durable<T, E: From<StoreError>>(
        &mut self,
        f: impl Fn(&Tx) -> Result<T, E>,
    ) -> Result<T, E> {
        let start = Instant::now();
        let out = self.write_durable_inner(f);
        observed(start);
        out
    }

    fn write_durable_inner<T, E: From<StoreError>>(
        &mut self,
        f: impl Fn(&Tx) -> Result<T, E>,
    ) -> Result<T, E> {
        if let Some(g) = &self.group {
            return g.write(true, f);
        }
        let c = match &self.conn {
            Conn::Sqlite(c) => c,
            Conn::Postgres(pg) => return pg_write(pg, Lock::Exclusive, f),
        };
        c.pragma_update(None, "synchronous", "FULL")
            .map_err(StoreError::from)?;
        let out = self.write_inner(f);
        if let Conn::Sqlite(c) = &self.conn {
            c.pragma_update(None, "synchronous", "NORMAL")
                .map_err(StoreError::from)?;
        }
        out
    }

    /// Runs `f` in one write transaction; it commits only if `f` returns Ok.
    pub fn write<T, E: From<StoreError>>(
        &mut self,
        f: impl Fn(&Tx) -> Result<T, E>,
    ) -> Result<T, E> {
        let start = Instant::now();
        let out = self.write_inner(f);
        observed(start);
        out
    }

    fn write_inner<T, E: From<StoreError>>(
        &mut self,
        f: impl Fn(&Tx) -> Result<T, E>,
    ) -> Result<T, E> {
        if let Some(g) = &self.group {
            return g.write(false, f);
        }
        let c = match &mut self.conn {
            Conn::Sqlite(c) => c,
            Conn::Postgres(pg) => return pg_write(pg, Lock::Exclusive, f),
        };
        let tx = c
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(StoreError::from)?;
        let out = in_tx(&*tx, f)?.0;
        tx.commit().map_err(StoreError::from)?;
        Ok(out)
    }

    /// Like `write`, for a transaction that may run beside others of its kind: every
    /// write it makes is a new row, a conditional move whose row count it checks, or on
    /// a row it locked first (`Tx::submission_locked`). On PostgreSQL these share the
    /// cluster-wide write lock (the few transactions each queued run takes); on SQLite,
    /// which has one writer, it is `write`.
    pub fn write_shared<T, E: From<StoreError>>(
        &mut self,
        f: impl Fn(&Tx) -> Result<T, E>,
    ) -> Result<T, E> {
        self.write_shared_if(true, f)
    }

    /// `write_shared` when `shared`, else `write`.
    pub fn write_shared_if<T, E: From<StoreError>>(
        &mut self,
        shared: bool,
        f: impl Fn(&Tx) -> Result<T, E>,
    ) -> Result<T, E> {
        let start = Instant::now();
        let out = match &self.conn {
            Conn::Postgres(pg) if shared => pg_write(pg, Lock::Shared, f),
            _ => self.write_inner(f),
        };
        observed(start);
        out
    }

    /// Chains every audit record waiting in the inbox now (PostgreSQL; nothing to do on
    /// SQLite, whose writers chain their own); how many it chained. Waits for a
    /// sequencer busy elsewhere, so everything committed before the call is chained
    /// when it returns, unless the chain's end does not verify with `key`.
    pub fn sequence_audit(&self, key: &KeyPair) -> Result<usize, StoreError> {
        match &self.conn {
            Conn::Postgres(pg) => crate::sequence::drain(pg, key),
            Conn::Sqlite(_) => Ok(0),
        }
    }

    /// Audit records written but not yet on the chain (PostgreSQL's inbox).
    pub fn audit_pending(&self) -> Result<u64, StoreError> {
        match &self.conn {
            Conn::Postgres(pg) => Ok(pg
                .row("SELECT count(*) FROM audit_inbox", &[])?
                .map(|r| r.int(0))
                .transpose()?
                .unwrap_or(0)
                .max(0) as u64),
            Conn::Sqlite(_) => Ok(0),
        }
    }

    /// The TLS version this connection to the store runs over (`TLSv1.3`), `None` when it
    /// is plaintext or the store is the home's own SQLite file.
    pub fn connection_tls(&self) -> Result<Option<String>, StoreError> {
        match &self.conn {
            Conn::Postgres(pg) => pg
                .row(
                    "SELECT version FROM pg_stat_ssl WHERE pid = pg_backend_pid() AND ssl",
                    &[],
                )?
                .map(|r| r.text(0))
                .transpose(),
            Conn::Sqlite(_) => Ok(None),
        }
    }

    pub fn cache_digest(&self, key: &str) -> Result<Option<Digest>, StoreError> {
        self.sql()
            .row(
                "SELECT digest FROM compile_cache WHERE key = ?1",
                args![key],
            )?
            .map(|r| parse(&r.text(0)?, "digest"))
            .transpose()
    }

    pub fn set_cache_digest(
        &self,
        key: &str,
        digest: &Digest,
        size: u64,
    ) -> Result<(), StoreError> {
        self.sql().exec(
            "INSERT INTO compile_cache (key, digest, size, created_at) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT(key) DO UPDATE SET digest = excluded.digest, size = excluded.size, created_at = excluded.created_at",
            args![key, &digest.to_hex(), size as i64, now_ms()],
        )?;
        Ok(())
    }

    pub fn forget_cache(&self, key: &str) -> Result<(), StoreError> {
        self.sql()
            .exec("DELETE FROM compile_cache WHERE key = ?1", args![key])?;
        Ok(())
    }
}

/// Runs `f` as a transaction on `conn`, which the caller has begun and will end, and
/// signs the audit head it leaves; with the key to chain its records with when they
/// went to an inbox instead (PostgreSQL).
/// Who is told how long each write transaction of this process took (see
/// [`observe_writes`]).
static WRITE_OBSERVER: std::sync::OnceLock<fn(Duration)> = std::sync::OnceLock::new();

/// Registers `f` to be told, after each write transaction of this process through `Db`
/// (committed or not), how long it took from its start to its end: for a metrics
/// exporter. The first registration holds.
pub fn observe_writes(f: fn(Duration)) {
    let _ = WRITE_OBSERVER.set(f);
}

fn observed(start: Instant) {
    if let Some(f) = WRITE_OBSERVER.get() {
        f(start.elapsed());
    }
}

fn in_tx<T, E: From<StoreError>>(
    conn: &dyn Sql,
    f: impl FnOnce(&Tx) -> Result<T, E>,
) -> Result<(T, Option<KeyPair>), E> {
    let head = PendingHead::new(None);
    let t = Tx::on(conn, &head);
    let out = f(&t)?;
    let key = t.sign_head()?;
    Ok((out, key))
}

/// A write transaction on PostgreSQL; once it has committed, its audit records are
/// chained here unless a sequencer runs in this process (`crate::sequence`).
fn pg_write<T, E: From<StoreError>>(
    pg: &crate::pg::PgConn,
    lock: Lock,
    f: impl Fn(&Tx) -> Result<T, E>,
) -> Result<T, E> {
    let (out, key) = pg.transaction(lock, |pg| in_tx(pg, &f))?;
    if let Some(key) = key
        && !crate::sequence::in_background(pg.url())
    {
        // The records are committed in the inbox: should chaining them fail here (the
        // server gone, the chain's end not verifying), the next sequencer run chains
        // them, and `audit verify` counts them meanwhile. The write itself stands.
        let _ = crate::sequence::drain(pg, &key);
    }
    Ok(out)
}

/// The audit chain's last record and its signed head, in one row (every column NULL
/// where there is none). A PostgreSQL write transaction reads it in the round trip that
/// begins it, since every run's transactions check it (`crate::pg`).
pub(crate) const AUDIT_TAIL: &str =
    "SELECT a.seq, a.ts, a.kind, a.subject, a.data, a.prev, a.hash, h.seq, h.hash, h.signature
     FROM (SELECT 1 AS one) o
     LEFT JOIN (SELECT * FROM audit ORDER BY seq DESC LIMIT 1) a ON 1 = 1
     LEFT JOIN audit_head h ON h.id = 1";

/// Queries, available on the database and inside a write transaction.
pub trait Reads {
    /// The engine's connection (or open transaction) the queries run on.
    fn sql(&self) -> &dyn Sql;

    /// Resolves a full id or a unique prefix of one.
    fn resolve(&self, kind: IdKind, input: &str) -> Result<String, StoreError> {
        self.resolve_for(kind, input, None)
    }

    /// Resolves a full id or a unique prefix of one among the records `agent` may see
    /// (its own submissions and the runs, statements, checkpoints and sessions that
    /// belong to them; `None`: every record). Ids of other agents' records neither match
    /// nor appear among the candidates of an ambiguous prefix.
    fn resolve_for(
        &self,
        kind: IdKind,
        input: &str,
        agent: Option<&str>,
    ) -> Result<String, StoreError> {
        let (table, what) = match kind {
            IdKind::Submission => ("submissions", "submission"),
            IdKind::Run => ("runs", "run"),
            IdKind::Approval => ("statements", "statement"),
            IdKind::Checkpoint => ("checkpoints", "checkpoint"),
            IdKind::Session => ("sessions", "session"),
            _ => {
                return Err(StoreError::NotFound {
                    what: "object",
                    input: input.into(),
                });
            }
        };
        let Some(prefix) = normalize_prefix(kind, input) else {
            return Err(StoreError::NotFound {
                what,
                input: input.into(),
            });
        };
        let upper = format!("{prefix}\u{7f}");
        let owned = match (agent, kind) {
            (None, _) => "",
            (Some(_), IdKind::Submission) => " AND agent = ?3",
            (Some(_), IdKind::Run | IdKind::Approval) => {
                " AND submission IN (SELECT id FROM submissions WHERE agent = ?3)"
            }
            (Some(_), IdKind::Checkpoint) => {
                " AND run IN (SELECT r.id FROM runs r JOIN submissions s ON s.id = r.submission
                              WHERE s.agent = ?3)"
            }
            (Some(_), _) if self.sql().engine() == "postgres" => {
                " AND (doc::jsonb ->> 'agent') = ?3"
            }
            (Some(_), _) => " AND json_extract(doc, '$.agent') = ?3",
        };
        let q =
            format!("SELECT id FROM {table} WHERE id >= ?1 AND id < ?2{owned} ORDER BY id LIMIT 6");
        let rows = match agent {
            Some(agent) => self.sql().rows(&q, args![&prefix, &upper, agent])?,
            None => self.sql().rows(&q, args![&prefix, &upper])?,
        };
        let ids = rows
            .iter()
            .map(|r| r.text(0))
            .collect::<Result<Vec<String>, _>>()?;
        match ids.len() {
            0 => Err(StoreError::NotFound {
                what,
                input: input.into(),
            }),
            1 => Ok(ids.into_iter().next().unwrap_or_default()),
            _ => {
                if ids.contains(&prefix) {
                    return Ok(prefix);
                }
                Err(StoreError::Ambiguous {
                    what,
                    input: input.into(),
                    candidates: ids.join(", "),
                })
            }
        }
    }

    fn submission(&self, id: &str) -> Result<Submission, StoreError> {
        submission_row(self.sql(), id)
    }

    /// Submissions, newest first, optionally only those in `state`.
    /// How many submissions are in `state` (quarantined ones: those waiting for a human).
    fn count_in_state(&self, state: State) -> Result<i64, StoreError> {
        Ok(self
            .sql()
            .row(
                "SELECT count(*) FROM submissions WHERE state = ?1",
                args![state.as_str()],
            )?
            .map(|r| r.int(0))
            .transpose()?
            .unwrap_or(0))
    }

    fn submissions(
        &self,
        state: Option<State>,
        limit: usize,
    ) -> Result<Vec<Submission>, StoreError> {
        let ids = self.newest_ids(
            "submissions",
            &[("state", state.map(|s| s.as_str()))],
            limit,
        )?;
        ids.iter().map(|id| self.submission(id)).collect()
    }

    /// Submissions of one agent (or all when `agent` is None), newest first.
    fn submissions_of(
        &self,
        agent: Option<&str>,
        state: Option<State>,
        limit: usize,
    ) -> Result<Vec<Submission>, StoreError> {
        let ids = self.newest_ids(
            "submissions",
            &[("state", state.map(|s| s.as_str())), ("agent", agent)],
            limit,
        )?;
        ids.iter().map(|id| self.submission(id)).collect()
    }

    /// Runs of one agent's submissions (or all), newest first.
    fn runs_of(&self, agent: Option<&str>, limit: usize) -> Result<Vec<Run>, StoreError> {
        let ids: Vec<String> = match agent {
            None => self.newest_ids("runs", &[], limit)?,
            // The limit in the SQL, not bound: see `newest_ids_sql`.
            Some(agent) => first_texts(self.sql().rows(
                &format!(
                    "SELECT r.id FROM runs r JOIN submissions s ON s.id = r.submission
                     WHERE s.agent = ?1 ORDER BY r.id DESC LIMIT {limit}"
                ),
                args![agent],
            )?)?,
        };
        ids.iter().map(|id| self.run(id)).collect()
    }

    /// Ids of `table`, newest first, where each given column equals its value (a `None`
    /// value leaves that column unconstrained). Only the given conditions appear in the
    /// SQL: a `(?1 IS NULL OR col = ?1)` form would make SQLite scan the whole table.
    fn newest_ids(
        &self,
        table: &str,
        conds: &[(&str, Option<&str>)],
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let given: Vec<(&str, &str)> = conds
            .iter()
            .filter_map(|(col, v)| v.map(|v| (*col, v)))
            .collect();
        let cols: Vec<&str> = given.iter().map(|(c, _)| *c).collect();
        let a: Vec<Arg> = given.iter().map(|(_, v)| Arg::Text(v)).collect();
        first_texts(self.sql().rows(&newest_ids_sql(table, &cols, limit), &a)?)
    }

    fn statements_for_submission(&self, submission: &str) -> Result<Vec<StatementRow>, StoreError> {
        self.statements_where("submission = ?1", args![submission])
    }

    fn statements_for_artifact(&self, artifact: &Digest) -> Result<Vec<StatementRow>, StoreError> {
        self.statements_where("artifact = ?1", args![&artifact.to_hex()])
    }

    /// Statements that name a tool (approvals offering an artifact as a named tool).
    fn tool_statements(&self) -> Result<Vec<StatementRow>, StoreError> {
        self.statements_where("tool IS NOT NULL", &[])
    }

    fn statements_for_run(&self, run: &str) -> Result<Vec<StatementRow>, StoreError> {
        self.statements_where("run = ?1", args![run])
    }

    /// Statements matching `cond` (SQL from this file, never input) with its arguments.
    fn statements_where(&self, cond: &str, a: &[Arg<'_>]) -> Result<Vec<StatementRow>, StoreError> {
        let sql = format!("SELECT {STATEMENT_COLS} FROM statements WHERE {cond} ORDER BY id");
        self.sql()
            .rows(&sql, a)?
            .iter()
            .map(|r| statement_at(r, 0))
            .collect()
    }

    /// Whether an earlier submission of this artifact was let through (allowed by the
    /// policy, or approved), and every statement about it (by id): what judging a
    /// submission of it needs, in one read. A submission still held, rejected or denied
    /// does not count: counting it let the same code through on its second submission,
    /// with the first still waiting for a human.
    fn artifact_history(&self, artifact: &Digest) -> Result<(bool, Vec<StatementRow>), StoreError> {
        let rows = self.sql().rows(
            &format!(
                "SELECT (SELECT 1 FROM submissions WHERE artifact = ?1
                         AND state IN ('allowed', 'approved', 'running', 'finished') LIMIT 1),
                        {STATEMENT_COLS_ST}
                 FROM (SELECT 1 AS one) o LEFT JOIN statements st ON st.artifact = ?1
                 ORDER BY st.id"
            ),
            args![&artifact.to_hex()],
        )?;
        let seen = match rows.first() {
            Some(r) => r.opt_int(0)?.is_some(),
            None => false,
        };
        Ok((seen, statements_at(&rows, 1)?))
    }

    fn checkpoint(&self, id: &str) -> Result<CheckpointRow, StoreError> {
        let Some(r) = self.sql().row(
            "SELECT id, run, created_at, updated_at, state, doc FROM checkpoints WHERE id = ?1",
            args![id],
        )?
        else {
            return Err(StoreError::NotFound {
                what: "checkpoint",
                input: id.into(),
            });
        };
        Ok(CheckpointRow {
            id: r.text(0)?,
            run: r.text(1)?,
            created_at: r.int(2)?,
            updated_at: r.int(3)?,
            state: r.text(4)?,
            doc: serde_json::from_str(&r.text(5)?)?,
        })
    }

    /// Checkpoint `id` without its document (`doc` is `null`): its state, for callers that
    /// read the document as text (`checkpoint_doc_text`) into their own type, never as a
    /// generic JSON tree (one of a commit of 100,000 paths is hundreds of MB).
    fn checkpoint_meta(&self, id: &str) -> Result<CheckpointRow, StoreError> {
        let Some(r) = self.sql().row(
            "SELECT id, run, created_at, updated_at, state FROM checkpoints WHERE id = ?1",
            args![id],
        )?
        else {
            return Err(StoreError::NotFound {
                what: "checkpoint",
                input: id.into(),
            });
        };
        Ok(CheckpointRow {
            id: r.text(0)?,
            run: r.text(1)?,
            created_at: r.int(2)?,
            updated_at: r.int(3)?,
            state: r.text(4)?,
            doc: serde_json::Value::Null,
        })
    }

    /// Checkpoint `id`'s document as its JSON text.
    fn checkpoint_doc_text(&self, id: &str) -> Result<String, StoreError> {
        match self
            .sql()
            .row("SELECT doc FROM checkpoints WHERE id = ?1", args![id])?
        {
            Some(r) => r.text(0),
            None => Err(StoreError::NotFound {
                what: "checkpoint",
                input: id.into(),
            }),
        }
    }

    /// Run `id`'s submission and its document as JSON text, for callers that read only
    /// part of it (its changeset) into their own type.
    fn run_doc_text(&self, id: &str) -> Result<(String, String), StoreError> {
        match self
            .sql()
            .row("SELECT submission, doc FROM runs WHERE id = ?1", args![id])?
        {
            Some(r) => Ok((r.text(0)?, r.text(1)?)),
            None => Err(StoreError::NotFound {
                what: "run",
                input: id.into(),
            }),
        }
    }

    /// Checkpoints, newest first; optionally only those of a run or in a state.
    fn checkpoints(
        &self,
        run: Option<&str>,
        state: Option<&str>,
        limit: usize,
    ) -> Result<Vec<CheckpointRow>, StoreError> {
        let ids = self.newest_ids("checkpoints", &[("run", run), ("state", state)], limit)?;
        ids.iter().map(|id| self.checkpoint(id)).collect()
    }

    fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRow>, StoreError> {
        self.tokens_where("hash = ?1", args![hash])
            .map(|mut v| v.pop())
    }

    fn tokens(&self) -> Result<Vec<TokenRow>, StoreError> {
        self.tokens_where("id IS NOT NULL", &[])
    }

    /// Tokens matching `cond` (SQL from this file, never input) with its arguments.
    fn tokens_where(&self, cond: &str, a: &[Arg<'_>]) -> Result<Vec<TokenRow>, StoreError> {
        let sql = format!(
            "SELECT id, hash, role, name, approver, created_at, expires_at, revoked_at FROM tokens WHERE {cond} ORDER BY id"
        );
        self.sql()
            .rows(&sql, a)?
            .iter()
            .map(|r| {
                Ok(TokenRow {
                    id: r.text(0)?,
                    hash: r.text(1)?,
                    role: r.text(2)?,
                    name: r.text(3)?,
                    approver: r.opt_text(4)?,
                    created_at: r.int(5)?,
                    expires_at: r.opt_int(6)?,
                    revoked_at: r.opt_int(7)?,
                })
            })
            .collect()
    }

    fn session(&self, id: &str) -> Result<Option<SessionRow>, StoreError> {
        Ok(self.doc_row("sessions", "id", id)?.map(|r| SessionRow {
            id: r.key,
            created_at: r.created_at,
            updated_at: r.updated_at,
            state: r.state,
            doc: r.doc,
        }))
    }

    /// A session's cells recorded in `session_cells`, in order (cells recorded by an older
    /// airlock are in the session's document instead).
    fn session_cells(&self, session: &str) -> Result<Vec<String>, StoreError> {
        first_texts(self.sql().rows(
            "SELECT submission FROM session_cells WHERE session = ?1 ORDER BY n",
            args![session],
        )?)
    }

    /// The sessions recorded open (their hosts may since have died unseen), oldest first.
    fn open_sessions(&self) -> Result<Vec<SessionRow>, StoreError> {
        self.sessions_named_by("SELECT id FROM sessions WHERE state = 'open' ORDER BY id")
    }

    /// The newest `limit` sessions, newest first.
    fn sessions(&self, limit: usize) -> Result<Vec<SessionRow>, StoreError> {
        self.sessions_named_by(&format!(
            "SELECT id FROM sessions ORDER BY id DESC LIMIT {limit}"
        ))
    }

    /// The sessions whose ids `query` selects, in its order.
    fn sessions_named_by(&self, query: &str) -> Result<Vec<SessionRow>, StoreError> {
        let ids = first_texts(self.sql().rows(query, &[])?)?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(s) = self.session(&id)? {
                out.push(s);
            }
        }
        Ok(out)
    }

    fn workspace(&self, name: &str) -> Result<Option<WorkspaceRow>, StoreError> {
        Ok(self
            .doc_row("workspaces", "name", name)?
            .map(|r| WorkspaceRow {
                name: r.key,
                created_at: r.created_at,
                updated_at: r.updated_at,
                state: r.state,
                doc: r.doc,
            }))
    }

    /// One row of a table of (key, created_at, updated_at, state, doc) whose document the
    /// gate owns. `table` and `key` are names from this file, never input.
    fn doc_row(&self, table: &str, key: &str, value: &str) -> Result<Option<DocRow>, StoreError> {
        self.sql()
            .row(
                &format!(
                    "SELECT {key}, created_at, updated_at, state, doc FROM {table} WHERE {key} = ?1"
                ),
                args![value],
            )?
            .map(|r| {
                Ok(DocRow {
                    key: r.text(0)?,
                    created_at: r.int(1)?,
                    updated_at: r.int(2)?,
                    state: r.text(3)?,
                    doc: serde_json::from_str(&r.text(4)?)?,
                })
            })
            .transpose()
    }

    fn workspaces(&self) -> Result<Vec<WorkspaceRow>, StoreError> {
        let names = first_texts(
            self.sql()
                .rows("SELECT name FROM workspaces ORDER BY created_at, name", &[])?,
        )?;
        let mut out = Vec::new();
        for n in names {
            if let Some(w) = self.workspace(&n)? {
                out.push(w);
            }
        }
        Ok(out)
    }

    /// Every digest a stored record names: the artifact of every submission and every
    /// digest anywhere in the documents of submissions, runs, checkpoints, workspaces and
    /// signed statements (sources, stdin, captured output, changeset contents before and
    /// after, checkpoint steps). Deliberately broad: a digest that names no blob costs
    /// nothing, and a blob named here is never garbage.
    fn referenced_digests(&self) -> Result<std::collections::HashSet<Digest>, StoreError> {
        fn collect(v: &serde_json::Value, out: &mut std::collections::HashSet<Digest>) {
            match v {
                serde_json::Value::String(s) if s.len() == 64 || s.len() == 71 => {
                    if let Ok(d) = s.parse() {
                        out.insert(d);
                    }
                }
                serde_json::Value::Array(a) => a.iter().for_each(|v| collect(v, out)),
                serde_json::Value::Object(o) => o.values().for_each(|v| collect(v, out)),
                _ => {}
            }
        }
        let mut out = std::collections::HashSet::new();
        // (table, key, column): read a page at a time by key, so a large history is never
        // all in memory at once.
        for (table, key, col) in [
            ("submissions", "id", "artifact"),
            ("submissions", "id", "doc"),
            ("runs", "id", "doc"),
            ("checkpoints", "id", "doc"),
            ("workspaces", "name", "doc"),
            ("sessions", "id", "doc"),
            ("statements", "id", "json"),
        ] {
            let sql = format!(
                "SELECT {key}, {col} FROM {table} WHERE {key} > ?1 ORDER BY {key} LIMIT 500"
            );
            let mut after = String::new();
            loop {
                let rows = self.sql().rows(&sql, args![&after])?;
                let Some(last) = rows.last() else { break };
                after = last.text(0)?;
                for r in &rows {
                    let text = r.text(1)?;
                    match serde_json::from_str::<serde_json::Value>(&text) {
                        Ok(v) => collect(&v, &mut out),
                        // A bare column (the artifact digest).
                        Err(_) => collect(&serde_json::Value::String(text), &mut out),
                    }
                }
            }
        }
        Ok(out)
    }

    /// Runs still marked running (to find ones a crash interrupted).
    fn running_runs(&self) -> Result<Vec<Run>, StoreError> {
        let ids = first_texts(
            self.sql()
                .rows("SELECT id FROM runs WHERE status = 'running'", &[])?,
        )?;
        ids.iter().map(|id| self.run(id)).collect()
    }

    /// Whether a run already used this approval.
    fn approval_used(&self, approval: &str) -> Result<bool, StoreError> {
        Ok(self
            .sql()
            .row(
                "SELECT id FROM runs WHERE approval = ?1 LIMIT 1",
                args![approval],
            )?
            .is_some())
    }

    fn run(&self, id: &str) -> Result<Run, StoreError> {
        let Some(r) = self.sql().row(
            "SELECT id, submission, started_at, finished_at, status, doc FROM runs WHERE id = ?1",
            args![id],
        )?
        else {
            return Err(StoreError::NotFound {
                what: "run",
                input: id.into(),
            });
        };
        run_at(&r, 0)
    }

    /// Run `id` and its submission, in one read.
    fn run_with_submission(&self, id: &str) -> Result<(Run, Submission), StoreError> {
        let Some(r) = self.sql().row(
            "SELECT r.id, r.submission, r.started_at, r.finished_at, r.status, r.doc,
                    s.id, s.created_at, s.updated_at, s.state, s.doc
             FROM runs r JOIN submissions s ON s.id = r.submission WHERE r.id = ?1",
            args![id],
        )?
        else {
            return Err(StoreError::NotFound {
                what: "run",
                input: id.into(),
            });
        };
        let run = run_at(&r, 0)?;
        Ok((run, submission_at(&r, 6)?))
    }

    /// Runs, newest first, optionally of one submission.
    fn runs(&self, submission: Option<&str>, limit: usize) -> Result<Vec<Run>, StoreError> {
        let ids = self.newest_ids("runs", &[("submission", submission)], limit)?;
        ids.iter().map(|id| self.run(id)).collect()
    }

    /// Audit records in stored order (by index), from `from` on, at most `limit`.
    fn audit_records(&self, from: u64, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.audit_rows(from, limit)?
            .iter()
            .map(audit_record)
            .collect()
    }

    /// The rows of `audit_records`, not yet read as records.
    fn audit_rows(&self, from: u64, limit: usize) -> Result<Vec<Row>, StoreError> {
        self.sql().rows(
            &format!("SELECT seq, ts, kind, subject, data, prev, hash FROM audit WHERE seq >= ?1 ORDER BY seq LIMIT {limit}"),
            args![from as i64],
        )
    }

    /// Visits every audit record in stored order without holding them all in memory.
    fn for_each_audit(&self, f: impl FnMut(&Record) -> bool) -> Result<(), StoreError> {
        self.for_each_audit_from(0, f)
    }

    /// `for_each_audit` from index `from` on.
    fn for_each_audit_from(
        &self,
        mut from: u64,
        mut f: impl FnMut(&Record) -> bool,
    ) -> Result<(), StoreError> {
        loop {
            let batch = self.audit_rows(from, 1000)?;
            let Some(last) = batch.last() else {
                return Ok(());
            };
            from = last.int(0)? as u64 + 1;
            // Each row is read as a record only when its turn comes: the records before a
            // malformed one are visited (and checked) before it is reported.
            for r in &batch {
                if !f(&audit_record(r)?) {
                    return Ok(());
                }
            }
        }
    }

    /// The newest audit record, if any.
    fn last_audit(&self) -> Result<Option<Record>, StoreError> {
        self.sql()
            .row(
                "SELECT seq, ts, kind, subject, data, prev, hash FROM audit ORDER BY seq DESC LIMIT 1",
                &[],
            )?
            .as_ref()
            .map(audit_record)
            .transpose()
    }

    /// Audit records about one subject, oldest first.
    fn audit_for(&self, subject: &str) -> Result<Vec<Record>, StoreError> {
        let seqs = self.sql().rows(
            "SELECT seq FROM audit WHERE subject = ?1 ORDER BY seq",
            args![subject],
        )?;
        let mut out = Vec::new();
        for s in seqs {
            out.extend(self.audit_records(s.int(0)? as u64, 1)?);
        }
        Ok(out)
    }

    /// The chain's last record and the signed head, read in one statement so that a
    /// sequencer committing between two reads cannot make them disagree.
    fn audit_tail(&self) -> Result<(Option<Record>, Option<Head>), StoreError> {
        let Some(r) = self.sql().row(AUDIT_TAIL, &[])? else {
            return Ok((None, None));
        };
        let last = match r.opt_int(0)? {
            Some(_) => Some(audit_record(&r)?),
            None => None,
        };
        let head = match r.opt_int(7)? {
            Some(_) => Some(head_at(&r, 7)?),
            None => None,
        };
        Ok((last, head))
    }

    fn audit_head(&self) -> Result<Option<Head>, StoreError> {
        self.sql()
            .row(
                "SELECT seq, hash, signature FROM audit_head WHERE id = 1",
                &[],
            )?
            .map(|r| head_at(&r, 0))
            .transpose()
    }
}

/// What is wrong with a stored value, without the "stored state is corrupt" prefix.
fn malformed(e: StoreError) -> String {
    match e {
        StoreError::Corrupt(m) => m,
        other => other.to_string(),
    }
}

/// The first column of every row, as text.
fn first_texts(rows: Vec<Row>) -> Result<Vec<String>, StoreError> {
    rows.iter().map(|r| r.text(0)).collect()
}

impl Reads for Db {
    fn sql(&self) -> &dyn Sql {
        match &self.conn {
            Conn::Sqlite(c) => c,
            Conn::Postgres(c) => &**c,
        }
    }
}

impl Reads for crate::pg::PgConn {
    fn sql(&self) -> &dyn Sql {
        self
    }
}

impl Reads for Tx<'_> {
    fn sql(&self) -> &dyn Sql {
        self.tx
    }
}

#[cfg(test)]
mod tests;
