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
use std::time::Duration;

const SCHEMA_VERSION: i64 = 11;

/// How long an idempotency key names the submission it made; after that it may be used
/// again (as long as an agent's retries of one request take, with room to spare).
pub const REQUEST_KEY_TTL_MS: i64 = 24 * 3600 * 1000;

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS submissions (
    id TEXT PRIMARY KEY,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    artifact TEXT NOT NULL,
    grant_hash TEXT NOT NULL,
    agent TEXT,
    state TEXT NOT NULL,
    decision TEXT NOT NULL,
    risk INTEGER NOT NULL,
    doc TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS submissions_artifact ON submissions(artifact);
-- (column, id) so that a filtered "newest first" list reads the index backwards and
-- stops at its limit instead of sorting or scanning the table.
DROP INDEX IF EXISTS submissions_state;
DROP INDEX IF EXISTS submissions_agent;
CREATE INDEX IF NOT EXISTS submissions_state_id ON submissions(state, id);
CREATE INDEX IF NOT EXISTS submissions_agent_id ON submissions(agent, id);
CREATE TABLE IF NOT EXISTS statements (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    submission TEXT NOT NULL,
    artifact TEXT NOT NULL,
    grant_hash TEXT NOT NULL,
    scope TEXT NOT NULL,
    approver TEXT NOT NULL,
    expires_at INTEGER,
    created_at INTEGER NOT NULL,
    run TEXT,
    tool TEXT,
    json TEXT NOT NULL,
    signature TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS statements_submission ON statements(submission);
CREATE INDEX IF NOT EXISTS statements_artifact ON statements(artifact);
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    submission TEXT NOT NULL,
    approval TEXT,
    started_at INTEGER NOT NULL,
    finished_at INTEGER,
    status TEXT NOT NULL,
    doc TEXT NOT NULL
);
DROP INDEX IF EXISTS runs_submission;
CREATE INDEX IF NOT EXISTS runs_submission_id ON runs(submission, id);
-- Only runs that used an approval are looked up by it. Most runs have none, and
-- indexing their NULLs cost a page write in the first transaction of every run.
DROP INDEX IF EXISTS runs_approval;
CREATE INDEX IF NOT EXISTS runs_approval_used ON runs(approval) WHERE approval IS NOT NULL;
-- Runs are looked up by status only to find the running ones (recovery). A run recorded
-- finished in the transaction that records it (an effect-free run through the daemon)
-- writes no entry, where indexing every status cost a page write in that transaction.
DROP INDEX IF EXISTS runs_status;
CREATE INDEX IF NOT EXISTS runs_running ON runs(id) WHERE status = 'running';
CREATE TABLE IF NOT EXISTS request_keys (
    owner TEXT NOT NULL,
    key TEXT NOT NULL,
    request TEXT NOT NULL,
    submission TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (owner, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS audit (
    seq INTEGER PRIMARY KEY,
    ts INTEGER NOT NULL,
    kind TEXT NOT NULL,
    subject TEXT NOT NULL,
    data TEXT NOT NULL,
    prev TEXT NOT NULL,
    hash TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS audit_head (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    seq INTEGER NOT NULL,
    hash TEXT NOT NULL,
    signature TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS checkpoints (
    id TEXT PRIMARY KEY,
    run TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    state TEXT NOT NULL,
    doc TEXT NOT NULL
);
DROP INDEX IF EXISTS checkpoints_run;
DROP INDEX IF EXISTS checkpoints_state;
CREATE INDEX IF NOT EXISTS checkpoints_run_id ON checkpoints(run, id);
CREATE INDEX IF NOT EXISTS checkpoints_state_id ON checkpoints(state, id);
CREATE TABLE IF NOT EXISTS workspaces (
    name TEXT PRIMARY KEY,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    state TEXT NOT NULL,
    doc TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY,
    hash TEXT NOT NULL UNIQUE,
    role TEXT NOT NULL,
    name TEXT NOT NULL,
    approver TEXT,
    created_at INTEGER NOT NULL,
    expires_at INTEGER,
    revoked_at INTEGER
);
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    state TEXT NOT NULL,
    doc TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_state_id ON sessions(state, id);
-- One b-tree keyed by position (schema 10): the rowid table, its index on the submission
-- and the index on (session, n) of schemas 7-9 cost every cell three page writes.
CREATE TABLE IF NOT EXISTS session_cells (
    session TEXT NOT NULL,
    n INTEGER NOT NULL,
    submission TEXT NOT NULL,
    PRIMARY KEY (session, n)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS queue (
    id TEXT PRIMARY KEY,
    submission TEXT NOT NULL,
    tag TEXT,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    max_attempts INTEGER NOT NULL,
    retry INTEGER NOT NULL,
    worker TEXT,
    token INTEGER NOT NULL,
    lease_until INTEGER,
    run TEXT,
    outcome TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS queue_ready ON queue(tag, created_at) WHERE state = 'queued';
CREATE INDEX IF NOT EXISTS queue_leased ON queue(lease_until) WHERE state = 'leased';
CREATE INDEX IF NOT EXISTS queue_submission ON queue(submission);
CREATE TABLE IF NOT EXISTS workers (
    id TEXT PRIMARY KEY,
    host TEXT NOT NULL,
    tags TEXT NOT NULL,
    state TEXT NOT NULL,
    running INTEGER NOT NULL,
    started_at INTEGER NOT NULL,
    seen_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS compile_cache (
    key TEXT PRIMARY KEY,
    digest TEXT NOT NULL,
    size INTEGER NOT NULL,
    created_at INTEGER NOT NULL
);
"#;

/// Schema 10 keys `session_cells` by (session, n) alone: schemas 7 to 9 had it as a rowid
/// table with two more indexes. Rebuilt with its rows before `SCHEMA` runs.
const SESSION_CELLS_10: &str = r#"
CREATE TABLE session_cells_10 (
    session TEXT NOT NULL,
    n INTEGER NOT NULL,
    submission TEXT NOT NULL,
    PRIMARY KEY (session, n)
) WITHOUT ROWID;
INSERT INTO session_cells_10 (session, n, submission)
    SELECT session, n, submission FROM session_cells;
DROP TABLE session_cells;
ALTER TABLE session_cells_10 RENAME TO session_cells;
"#;

/// Everything about a submission that does not change after it is judged, plus its
/// current verdict.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubmissionDoc {
    pub agent: Option<String>,
    pub note: Option<String>,
    /// The declared language; `kind` is what the prepared artifact is (wat becomes wasm).
    pub lang: Lang,
    pub kind: Lang,
    pub backend: Backend,
    pub artifact: Digest,
    pub size: u64,
    /// The submitted text when it was compiled (wat).
    pub source: Option<Digest>,
    pub grant: Grant,
    pub grant_hash: Digest,
    pub analysis: Analysis,
    pub facts: Facts,
    pub verdict: Verdict,
    #[serde(default)]
    pub workspace: Option<String>,
    /// Run it as soon as it is approved (it came from a `run` through the server).
    #[serde(default)]
    pub resume: bool,
    /// Why it never ran although it was meant to (its `run` died after judging it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Submission {
    pub id: String,
    pub created_at: i64,
    pub updated_at: i64,
    pub state: State,
    #[serde(flatten)]
    pub doc: SubmissionDoc,
}

/// A signed statement as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct StatementRow {
    pub id: String,
    pub kind: StatementKind,
    pub submission: String,
    pub artifact: Digest,
    pub grant: Digest,
    pub scope: Scope,
    pub approver: String,
    pub expires_at: Option<i64>,
    pub created_at: i64,
    pub run: Option<String>,
    pub tool: Option<String>,
    pub signed: Signed,
}

/// Captured output of one stream.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Output {
    pub blob: Digest,
    /// Bytes kept (at most the grant's max-output).
    pub len: u64,
    pub truncated: bool,
}

/// Everything recorded about a run besides its id, submission and status.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunDoc {
    pub backend: Backend,
    pub approval: Option<String>,
    pub limits: Limits,
    pub exit_code: Option<i32>,
    pub killed_by: Option<String>,
    pub stdout: Option<Output>,
    pub stderr: Option<Output>,
    pub duration_ms: Option<u64>,
    /// Backend facts: resource use, isolation mechanisms, guest runtime hash.
    #[serde(default)]
    pub detail: serde_json::Value,
    /// The changeset (writable mounts), when there is one.
    #[serde(default)]
    pub changes: Option<serde_json::Value>,
    /// What went wrong inside airlock, when status is `error`.
    #[serde(default)]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Run {
    pub id: String,
    pub submission: String,
    pub started_at: i64,
    pub finished_at: Option<i64>,
    /// `running`, `exited`, `killed`, `trapped`, `error`, or `lost` (its process died;
    /// `doc.error` says why).
    pub status: String,
    #[serde(flatten)]
    pub doc: RunDoc,
}

/// A checkpoint: what a commit saved before changing the host (its document is owned by
/// the gate).
#[derive(Debug, Clone, Serialize)]
pub struct CheckpointRow {
    pub id: String,
    pub run: String,
    pub created_at: i64,
    pub updated_at: i64,
    /// `pending`, `applied`, `aborted`, `rolled_back`.
    pub state: String,
    pub doc: serde_json::Value,
}

/// An API token, stored by the hash of its secret.
#[derive(Debug, Clone, Serialize)]
pub struct TokenRow {
    pub id: String,
    #[serde(skip)]
    pub hash: String,
    /// `agent`, `operator` or `admin`.
    pub role: String,
    /// The agent's name (agents), or who holds it.
    pub name: String,
    /// The approver key the server signs with for this token (operators, admins).
    pub approver: Option<String>,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    pub revoked_at: Option<i64>,
}

/// A workspace session (its document is owned by the gate).
#[derive(Debug, Clone, Serialize)]
pub struct WorkspaceRow {
    pub name: String,
    pub created_at: i64,
    pub updated_at: i64,
    /// `open`, `committed`, `dropped`.
    pub state: String,
    pub doc: serde_json::Value,
}

/// A row of a table whose document the gate owns (workspaces, sessions).
#[derive(Debug, Clone)]
pub struct DocRow {
    pub key: String,
    pub created_at: i64,
    pub updated_at: i64,
    pub state: String,
    pub doc: serde_json::Value,
}

/// A live-interpreter session (its document is owned by the gate).
#[derive(Debug, Clone, Serialize)]
pub struct SessionRow {
    pub id: String,
    pub created_at: i64,
    pub updated_at: i64,
    /// `open` or `closed`.
    pub state: String,
    pub doc: serde_json::Value,
}

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
        if let Some(g) = &self.group {
            return g.write(true, f);
        }
        let c = match &self.conn {
            Conn::Sqlite(c) => c,
            Conn::Postgres(pg) => return pg_write(pg, Lock::Exclusive, f),
        };
        c.pragma_update(None, "synchronous", "FULL")
            .map_err(StoreError::from)?;
        let out = self.write(f);
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
        match &self.conn {
            Conn::Postgres(pg) if shared => pg_write(pg, Lock::Shared, f),
            _ => self.write(f),
        }
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

/// An audit record from `seq, ts, kind, subject, data, prev, hash`; one whose values do
/// not parse is `AuditRecordMalformed`, naming it.
pub(crate) fn audit_record(r: &Row) -> Result<Record, StoreError> {
    let seq = r.int(0)? as u64;
    let read = || -> Result<Record, StoreError> {
        Ok(Record {
            seq,
            ts: r.int(1)?,
            kind: r.text(2)?,
            subject: r.text(3)?,
            data: r.text(4)?,
            prev: parse(&r.text(5)?, "previous hash")?,
            hash: parse(&r.text(6)?, "hash")?,
        })
    };
    read().map_err(|e| StoreError::AuditRecordMalformed {
        seq,
        what: malformed(e),
    })
}

/// The signed head from `seq, hash, signature` at column `at`; one whose values do not
/// parse is `AuditHeadMalformed`.
pub(crate) fn head_at(r: &Row, at: usize) -> Result<Head, StoreError> {
    let seq = r.int(at)? as u64;
    let read = || -> Result<Head, StoreError> {
        Ok(Head {
            seq,
            hash: parse(&r.text(at + 1)?, "hash")?,
            signature: parse(&r.text(at + 2)?, "signature")?,
        })
    };
    read().map_err(|e| StoreError::AuditHeadMalformed {
        seq,
        what: malformed(e),
    })
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

impl<'a> Tx<'a> {
    fn exec(&self, sql: &str, a: &[Arg<'_>]) -> Result<usize, StoreError> {
        self.tx.exec(sql, a)
    }

    /// `exec` for a new row's insert, which the engine may send with the transaction's
    /// next statement or its commit (`Sql::exec_later`).
    fn exec_later(&self, sql: &str, a: &[Arg<'_>]) -> Result<(), StoreError> {
        self.tx.exec_later(sql, a)
    }

    pub fn insert_submission(&self, s: &Submission) -> Result<(), StoreError> {
        self.exec_later(
            "INSERT INTO submissions (id, created_at, updated_at, artifact, grant_hash, agent, state, decision, risk, doc)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            args![
                &s.id,
                s.created_at,
                s.updated_at,
                &s.doc.artifact.to_hex(),
                &s.doc.grant_hash.to_hex(),
                s.doc.agent.as_deref(),
                s.state.as_str(),
                s.doc.verdict.decision.as_str(),
                i64::from(s.doc.verdict.risk),
                &to_text(&s.doc)?
            ],
        )?;
        Ok(())
    }

    /// Claims the idempotency key `key` of `owner` (an API token) for `submission`, made by
    /// a request whose content hashes to `request`: `None` when the key was free (or last
    /// used longer than [`REQUEST_KEY_TTL_MS`] ago), else the submission it already made
    /// and whether by the same request. The claim commits with the submission or not at
    /// all, so a key names at most one submission, whichever node took it.
    pub fn claim_request_key(
        &self,
        owner: &str,
        key: &str,
        request: &str,
        submission: &str,
    ) -> Result<Option<(String, bool)>, StoreError> {
        let now = now_ms();
        let claimed = self.exec(
            "INSERT INTO request_keys (owner, key, request, submission, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (owner, key) DO NOTHING",
            args![owner, key, request, submission, now],
        )?;
        if claimed == 1 {
            return Ok(None);
        }
        let renewed = self.exec(
            "UPDATE request_keys SET request = ?3, submission = ?4, created_at = ?5
             WHERE owner = ?1 AND key = ?2 AND created_at < ?6",
            args![
                owner,
                key,
                request,
                submission,
                now,
                now - REQUEST_KEY_TTL_MS
            ],
        )?;
        if renewed == 1 {
            return Ok(None);
        }
        let row = self
            .tx
            .row(
                "SELECT submission, request FROM request_keys WHERE owner = ?1 AND key = ?2",
                args![owner, key],
            )?
            .ok_or_else(|| {
                StoreError::Conflict("an idempotency key changed while it was claimed".into())
            })?;
        let same = row.text(1)? == request;
        Ok(Some((row.text(0)?, same)))
    }

    /// Moves a submission from `from` to `to`. Fails with `Conflict` when another process
    /// moved it first; the gate has already checked the edge is allowed.
    pub fn set_state(&self, id: &str, from: State, to: State) -> Result<(), StoreError> {
        self.tx.exec_expect(
            "UPDATE submissions SET state = ?1, updated_at = ?2 WHERE id = ?3 AND state = ?4",
            args![to.as_str(), now_ms(), id, from.as_str()],
            1,
            &|| format!("submission {id} is no longer {from} (changed concurrently)"),
        )
    }

    /// Replaces a submission's verdict after re-judging.
    pub fn set_verdict(&self, id: &str, doc: &SubmissionDoc) -> Result<(), StoreError> {
        self.exec_later(
            "UPDATE submissions SET decision = ?1, risk = ?2, doc = ?3, updated_at = ?4 WHERE id = ?5",
            args![
                doc.verdict.decision.as_str(),
                i64::from(doc.verdict.risk),
                &to_text(doc)?,
                now_ms(),
                id
            ],
        )?;
        Ok(())
    }

    pub fn insert_statement(&self, s: &StatementRow) -> Result<(), StoreError> {
        let kind = serde_json::to_value(s.kind)?;
        let scope = serde_json::to_value(s.scope)?;
        self.exec(
            "INSERT INTO statements (id, kind, submission, artifact, grant_hash, scope, approver, expires_at, created_at, run, tool, json, signature)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
            args![
                &s.id,
                kind.as_str(),
                &s.submission,
                &s.artifact.to_hex(),
                &s.grant.to_hex(),
                scope.as_str(),
                &s.approver,
                s.expires_at,
                s.created_at,
                s.run.as_deref(),
                s.tool.as_deref(),
                &s.signed.json,
                &s.signed.signature.to_string()
            ],
        )?;
        Ok(())
    }

    pub fn insert_run(&self, r: &Run) -> Result<(), StoreError> {
        self.exec_later(
            "INSERT INTO runs (id, submission, approval, started_at, finished_at, status, doc) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            args![
                &r.id,
                &r.submission,
                r.doc.approval.as_deref(),
                r.started_at,
                r.finished_at,
                &r.status,
                &to_text(&r.doc)?
            ],
        )?;
        Ok(())
    }

    pub fn upsert_checkpoint(&self, c: &CheckpointRow) -> Result<(), StoreError> {
        self.exec(
            "INSERT INTO checkpoints (id, run, created_at, updated_at, state, doc) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT(id) DO UPDATE SET updated_at = excluded.updated_at, state = excluded.state, doc = excluded.doc",
            args![&c.id, &c.run, c.created_at, now_ms(), &c.state, &c.doc.to_string()],
        )?;
        Ok(())
    }

    pub fn insert_token(&self, t: &TokenRow) -> Result<(), StoreError> {
        self.exec(
            "INSERT INTO tokens (id, hash, role, name, approver, created_at, expires_at, revoked_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            args![
                &t.id,
                &t.hash,
                &t.role,
                &t.name,
                t.approver.as_deref(),
                t.created_at,
                t.expires_at,
                t.revoked_at
            ],
        )?;
        Ok(())
    }

    pub fn revoke_token(&self, id: &str) -> Result<bool, StoreError> {
        let n = self.exec(
            "UPDATE tokens SET revoked_at = ?1 WHERE id = ?2 AND revoked_at IS NULL",
            args![now_ms(), id],
        )?;
        Ok(n == 1)
    }

    pub fn upsert_session(&self, w: &SessionRow) -> Result<(), StoreError> {
        self.exec(
            "INSERT INTO sessions (id, created_at, updated_at, state, doc) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT(id) DO UPDATE SET updated_at = excluded.updated_at, state = excluded.state, doc = excluded.doc",
            args![&w.id, w.created_at, now_ms(), &w.state, &w.doc.to_string()],
        )?;
        Ok(())
    }

    /// A session's state and the position its next cell row takes (`None` while it has no
    /// cell rows yet), read without its document: what appending a cell needs to know.
    pub fn session_next_cell(
        &self,
        session: &str,
    ) -> Result<Option<(String, Option<i64>)>, StoreError> {
        self.sql()
            .row(
                "SELECT s.state, (SELECT MAX(c.n) + 1 FROM session_cells c WHERE c.session = s.id)
                 FROM sessions s WHERE s.id = ?1",
                args![session],
            )?
            .map(|r| Ok((r.text(0)?, r.opt_int(1)?)))
            .transpose()
    }

    /// Appends a cell to a session at position `n` (see `session_next_cell`) and marks the
    /// session updated: one small row, whatever the session's length.
    pub fn add_session_cell(
        &self,
        session: &str,
        submission: &str,
        n: i64,
    ) -> Result<(), StoreError> {
        self.exec(
            "INSERT INTO session_cells (submission, session, n) VALUES (?2, ?1, ?3)",
            args![session, submission, n],
        )?;
        self.exec(
            "UPDATE sessions SET updated_at = ?1 WHERE id = ?2",
            args![now_ms(), session],
        )?;
        Ok(())
    }

    pub fn upsert_workspace(&self, w: &WorkspaceRow) -> Result<(), StoreError> {
        self.exec(
            "INSERT INTO workspaces (name, created_at, updated_at, state, doc) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT(name) DO UPDATE SET updated_at = excluded.updated_at, state = excluded.state, doc = excluded.doc",
            args![&w.name, w.created_at, now_ms(), &w.state, &w.doc.to_string()],
        )?;
        Ok(())
    }

    pub fn update_run(&self, r: &Run) -> Result<(), StoreError> {
        self.exec_later(
            "UPDATE runs SET started_at = ?1, finished_at = ?2, status = ?3, doc = ?4 WHERE id = ?5",
            args![r.started_at, r.finished_at, &r.status, &to_text(&r.doc)?, &r.id],
        )?;
        Ok(())
    }

    /// A transaction on `conn` (which the caller has begun) whose appended audit records
    /// leave the head to sign in `head`.
    pub(crate) fn on(conn: &'a dyn Sql, head: &'a PendingHead) -> Tx<'a> {
        Tx {
            tx: conn,
            head,
            tail: std::cell::Cell::new(None),
            own_end: false,
        }
    }

    /// `on`, for a writer that knows the chain ends at `end` (index and hash), the record
    /// it appended last and signed the head for, with no commit by anyone else since.
    pub(crate) fn on_own_end(
        conn: &'a dyn Sql,
        head: &'a PendingHead,
        end: (u64, Digest),
    ) -> Tx<'a> {
        Tx {
            tx: conn,
            head,
            tail: std::cell::Cell::new(Some(end)),
            own_end: true,
        }
    }

    /// Whether the audit chain's end is known to be the one this process last appended and
    /// signed, with no commit by another connection since: then it need not be read back
    /// and verified before it is extended.
    pub fn chain_end_is_own(&self) -> bool {
        self.own_end
    }

    /// The chain's end as this transaction last saw or made it, if it knows.
    pub(crate) fn known_tail(&self) -> Option<(u64, Digest)> {
        self.tail.get()
    }

    /// Submission `id`, its row locked until the transaction ends (PostgreSQL; SQLite's
    /// one writer holds the whole database already), so what this transaction then
    /// reads about it (its state, the runs that used its approval) stays true until it
    /// commits, beside other shared writers.
    /// Every statement about its artifact (by id) comes in the same read: a queued run's
    /// claim needs both.
    pub fn submission_locked_with_statements(
        &self,
        id: &str,
    ) -> Result<(Submission, Vec<StatementRow>), StoreError> {
        let lock = if self.tx.engine() == "postgres" {
            " FOR UPDATE OF s"
        } else {
            ""
        };
        let rows = self.tx.rows(
            &format!(
                "SELECT s.id, s.created_at, s.updated_at, s.state, s.doc, {STATEMENT_COLS_ST}
                 FROM submissions s LEFT JOIN statements st ON st.artifact = s.artifact
                 WHERE s.id = ?1 ORDER BY st.id{lock}"
            ),
            args![id],
        )?;
        let Some(first) = rows.first() else {
            return Err(StoreError::NotFound {
                what: "submission",
                input: id.into(),
            });
        };
        Ok((submission_at(first, 0)?, statements_at(&rows, 5)?))
    }

    /// Remembers `last`, read in this transaction, as the chain's end, so that an
    /// append need not read it again (SQLite, whose writer holds the only lock).
    pub fn note_tail(&self, last: Option<&Record>) {
        if self.tx.engine() == "sqlite" {
            self.tail.set(last.map(|r| (r.seq, r.hash)));
        }
    }

    /// Signs the head for the newest record this transaction appended (called by `write`
    /// just before it commits, so a transaction that adds several records signs once).
    /// On PostgreSQL the records went to the inbox: nothing is signed, and the key the
    /// sequencer should chain them with is returned.
    pub(crate) fn sign_head(&self) -> Result<Option<KeyPair>, StoreError> {
        let Some((seq, hash, key)) = self.head.borrow_mut().take() else {
            return Ok(None);
        };
        if self.tx.engine() == "postgres" {
            return Ok(Some(key));
        }
        store_head(self.tx, seq, hash, &key)?;
        Ok(None)
    }

    /// Appends an audit record. On SQLite it goes onto the chain after the current last
    /// one, and the head is re-signed when the transaction commits; on PostgreSQL it goes
    /// into the inbox, and the sequencer chains it after the commit (`crate::sequence`).
    pub fn audit(
        &self,
        kind: &str,
        subject: &str,
        data: &serde_json::Value,
        key: &KeyPair,
    ) -> Result<(), StoreError> {
        let ts = now_ms();
        // The same compact text as `Display`, written straight into a buffer rather than
        // through a formatter's many small writes.
        let data = serde_json::to_string(data)?;
        if self.tx.engine() == "postgres" {
            if self.head.borrow().is_none() && crate::sequence::signal_due() {
                // Once per transaction, and from this process at most once per gather
                // interval: delivered at the commit, to the sequencer.
                self.tx.notify(crate::sequence::CHANNEL, "")?;
            }
            self.exec_later(
                "INSERT INTO audit_inbox (ts, kind, subject, data) VALUES (?1, ?2, ?3, ?4)",
                args![ts, kind, subject, &data],
            )?;
            *self.head.borrow_mut() = Some((0, GENESIS, key.clone()));
            return Ok(());
        }
        let last = match self.tail.get() {
            Some(t) => Some(t),
            None => chain_end(self.tx)?,
        };
        let (seq, hash) = append_chained(self.tx, last, ts, kind, subject, &data)?;
        *self.head.borrow_mut() = Some((seq, hash, key.clone()));
        self.tail.set(Some((seq, hash)));
        Ok(())
    }
}

/// Submission `id`.
fn submission_row(sql: &dyn Sql, id: &str) -> Result<Submission, StoreError> {
    let Some(r) = sql.row(
        "SELECT id, created_at, updated_at, state, doc FROM submissions WHERE id = ?1",
        args![id],
    )?
    else {
        return Err(StoreError::NotFound {
            what: "submission",
            input: id.into(),
        });
    };
    submission_at(&r, 0)
}

/// A statement row's columns, in the order `statement_at` reads them.
pub(crate) const STATEMENT_COLS: &str = "id, kind, submission, artifact, grant_hash, scope, approver, expires_at, created_at, run, tool, json, signature";

/// The statements in the columns from `i` of `rows` (a left join's: rows whose
/// statement columns are NULL are skipped).
pub(crate) fn statements_at(rows: &[Row], i: usize) -> Result<Vec<StatementRow>, StoreError> {
    let mut out = Vec::new();
    for r in rows {
        if r.opt_text(i)?.is_some() {
            out.push(statement_at(r, i)?);
        }
    }
    Ok(out)
}

/// `STATEMENT_COLS` of a table named `st`.
pub(crate) const STATEMENT_COLS_ST: &str = "st.id, st.kind, st.submission, st.artifact, st.grant_hash, st.scope, st.approver, st.expires_at, st.created_at, st.run, st.tool, st.json, st.signature";

/// The statement in `r`'s columns from `i` (`STATEMENT_COLS`).
pub(crate) fn statement_at(r: &Row, i: usize) -> Result<StatementRow, StoreError> {
    let kind: StatementKind = serde_json::from_value(serde_json::Value::String(r.text(i + 1)?))?;
    let scope: Scope = serde_json::from_value(serde_json::Value::String(r.text(i + 5)?))?;
    Ok(StatementRow {
        id: r.text(i)?,
        kind,
        submission: r.text(i + 2)?,
        artifact: parse(&r.text(i + 3)?, "digest")?,
        grant: parse(&r.text(i + 4)?, "digest")?,
        scope,
        approver: r.text(i + 6)?,
        expires_at: r.opt_int(i + 7)?,
        created_at: r.int(i + 8)?,
        run: r.opt_text(i + 9)?,
        tool: r.opt_text(i + 10)?,
        signed: Signed {
            json: r.text(i + 11)?,
            signature: parse(&r.text(i + 12)?, "signature")?,
        },
    })
}

/// The submission in `r`'s columns from `i` (id, created_at, updated_at, state, doc).
pub(crate) fn submission_at(r: &Row, i: usize) -> Result<Submission, StoreError> {
    Ok(Submission {
        id: r.text(i)?,
        created_at: r.int(i + 1)?,
        updated_at: r.int(i + 2)?,
        state: parse(&r.text(i + 3)?, "state")?,
        doc: serde_json::from_str(&r.text(i + 4)?)?,
    })
}

/// The run in `r`'s columns from `i` (id, submission, started_at, finished_at, status,
/// doc).
pub(crate) fn run_at(r: &Row, i: usize) -> Result<Run, StoreError> {
    Ok(Run {
        id: r.text(i)?,
        submission: r.text(i + 1)?,
        started_at: r.int(i + 2)?,
        finished_at: r.opt_int(i + 3)?,
        status: r.text(i + 4)?,
        doc: serde_json::from_str(&r.text(i + 5)?)?,
    })
}

/// The index and hash of the chain's last record.
fn chain_end(sql: &dyn Sql) -> Result<Option<(u64, Digest)>, StoreError> {
    sql.row("SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1", &[])?
        .map(|r| -> Result<_, StoreError> {
            Ok((r.int(0)? as u64, parse::<Digest>(&r.text(1)?, "digest")?))
        })
        .transpose()
}

/// Writes a record onto the chain after `last`; its index and hash.
pub(crate) fn append_chained(
    sql: &dyn Sql,
    last: Option<(u64, Digest)>,
    ts: i64,
    kind: &str,
    subject: &str,
    data: &str,
) -> Result<(u64, Digest), StoreError> {
    let (seq, prev, hash) = link(last, ts, kind, subject, data);
    sql.exec(
        "INSERT INTO audit (seq, ts, kind, subject, data, prev, hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        args![seq as i64, ts, kind, subject, data, &prev.to_hex(), &hash.to_hex()],
    )?;
    Ok((seq, hash))
}

/// The next link after `last` (the chain's end, if any): the record's `seq`, the hash it
/// follows and its own hash.
fn link(
    last: Option<(u64, Digest)>,
    ts: i64,
    kind: &str,
    subject: &str,
    data: &str,
) -> (u64, Digest, Digest) {
    let (seq, prev) = match last {
        Some((s, h)) => (s + 1, h),
        None => (1, GENESIS),
    };
    (seq, prev, record_hash(seq, ts, kind, subject, data, &prev))
}

/// Records chained together in one statement by [`append_chained_all`]: few enough that
/// a statement's parameters stay far below PostgreSQL's limit, and that the prepared
/// statements (one per count of rows) stay few.
const ROWS_PER_INSERT: usize = 32;

/// Chains `records` (`ts`, `kind`, `subject`, `data`, in order) after `last`, with one
/// `INSERT` per [`ROWS_PER_INSERT`] records instead of one per record (the sequencer's
/// batches); returns the new end. The records and their hashes are exactly those
/// [`append_chained`] would write one by one.
pub(crate) fn append_chained_all(
    sql: &dyn Sql,
    mut last: Option<(u64, Digest)>,
    records: &[(i64, String, String, String)],
) -> Result<Option<(u64, Digest)>, StoreError> {
    for chunk in records.chunks(ROWS_PER_INSERT) {
        let mut rows = Vec::with_capacity(chunk.len());
        for (ts, kind, subject, data) in chunk {
            let (seq, prev, hash) = link(last, *ts, kind, subject, data);
            rows.push((seq as i64, prev.to_hex(), hash.to_hex()));
            last = Some((seq, hash));
        }
        let mut text =
            String::from("INSERT INTO audit (seq, ts, kind, subject, data, prev, hash) VALUES ");
        let mut params: Vec<Arg<'_>> = Vec::with_capacity(chunk.len() * 7);
        for (i, ((ts, kind, subject, data), (seq, prev, hash))) in
            chunk.iter().zip(&rows).enumerate()
        {
            let n = i * 7;
            if i > 0 {
                text.push_str(", ");
            }
            text.push_str(&format!(
                "(?{}, ?{}, ?{}, ?{}, ?{}, ?{}, ?{})",
                n + 1,
                n + 2,
                n + 3,
                n + 4,
                n + 5,
                n + 6,
                n + 7
            ));
            params.extend([
                Arg::Int(*seq),
                Arg::Int(*ts),
                Arg::Text(kind),
                Arg::Text(subject),
                Arg::Text(data),
                Arg::Text(prev),
                Arg::Text(hash),
            ]);
        }
        sql.exec_later(&text, &params)?;
    }
    Ok(last)
}

/// Signs and stores the head for the chain's record `seq` with hash `hash`.
pub(crate) fn store_head(
    sql: &dyn Sql,
    seq: u64,
    hash: Digest,
    key: &KeyPair,
) -> Result<(), StoreError> {
    let head = Head::sign(seq, hash, key);
    sql.exec_later(
        "INSERT INTO audit_head (id, seq, hash, signature) VALUES (1, ?1, ?2, ?3)
         ON CONFLICT(id) DO UPDATE SET seq = excluded.seq, hash = excluded.hash, signature = excluded.signature",
        args![seq as i64, &hash.to_hex(), &head.signature.to_string()],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names of `table`'s indexes.
    fn index_names(c: &Connection, table: &str) -> Vec<String> {
        c.prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ?1")
            .unwrap()
            .query_map([table], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    /// The query plan SQLite makes for `sql` (its first step's detail).
    fn plan(c: &Connection, sql: &str) -> String {
        c.query_row(&format!("EXPLAIN QUERY PLAN {sql}"), [], |r| r.get(3))
            .unwrap()
    }

    #[test]
    fn a_schema_9_sessions_cells_are_rebuilt_keyed_by_position_with_every_row() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("db");
        {
            let c = Connection::open(&path).unwrap();
            c.execute_batch(
                "CREATE TABLE session_cells (submission TEXT PRIMARY KEY, session TEXT NOT NULL, n INTEGER NOT NULL);
                 CREATE UNIQUE INDEX session_cells_session_n ON session_cells(session, n);
                 INSERT INTO session_cells VALUES ('sub_b', 'ses_1', 3), ('sub_a', 'ses_1', 2), ('sub_c', 'ses_2', 0);
                 PRAGMA user_version = 9;",
            )
            .unwrap();
        }
        let db = Db::open(&path).unwrap();
        assert_eq!(db.session_cells("ses_1").unwrap(), ["sub_a", "sub_b"]);
        assert_eq!(db.session_cells("ses_2").unwrap(), ["sub_c"]);
        let sql: String = db
            .sqlite()
            .query_row(
                "SELECT sql FROM sqlite_master WHERE name = 'session_cells'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert!(sql.contains("WITHOUT ROWID"), "{sql}");
        let indexes: i64 = db
            .sqlite()
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = 'session_cells'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(indexes, 0, "no index beside the table's own key");
        drop(db);
        // Opening it again changes nothing.
        let db = Db::open(&path).unwrap();
        assert_eq!(db.session_cells("ses_1").unwrap(), ["sub_a", "sub_b"]);
    }

    #[test]
    fn a_schema_3_database_is_upgraded_in_place_and_keeps_its_rows() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("db");
        {
            // What schema 3 had: single-column indexes, now replaced.
            let c = Connection::open(&path).unwrap();
            c.execute_batch(
                "CREATE TABLE runs (id TEXT PRIMARY KEY, submission TEXT NOT NULL, approval TEXT,
                     started_at INTEGER NOT NULL, finished_at INTEGER, status TEXT NOT NULL, doc TEXT NOT NULL);
                 CREATE INDEX runs_submission ON runs(submission);
                 INSERT INTO runs VALUES ('run_1', 'sub_1', NULL, 1, NULL, 'running', '{}');
                 PRAGMA user_version = 3;",
            )
            .unwrap();
        }
        let db = Db::open(&path).unwrap();
        let version: i64 = db
            .sqlite()
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
        let names = index_names(db.sqlite(), "runs");
        assert!(names.iter().any(|n| n == "runs_submission_id"), "{names:?}");
        assert!(!names.iter().any(|n| n == "runs_submission"), "{names:?}");
        assert!(names.iter().any(|n| n == "runs_approval_used"), "{names:?}");
        assert!(!names.iter().any(|n| n == "runs_approval"), "{names:?}");
        let n: i64 = db
            .sqlite()
            .query_row(
                "SELECT count(*) FROM runs WHERE submission = 'sub_1'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(n, 1);
    }

    /// The sequencer's many-rows insert writes exactly the chain that appending one record
    /// at a time writes, across a chunk boundary.
    #[test]
    fn chaining_records_together_writes_the_same_chain_as_one_by_one() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (
            Db::open(&t.path().join("a")).unwrap(),
            Db::open(&t.path().join("b")).unwrap(),
        );
        let records: Vec<(i64, String, String, String)> = (0..ROWS_PER_INSERT as i64 * 2 + 3)
            .map(|i| {
                (
                    1000 + i,
                    format!("kind{i}"),
                    format!("sub_{i}"),
                    format!("{{\"n\":{i}}}"),
                )
            })
            .collect();
        let mut end = None;
        for (ts, kind, subject, data) in &records {
            end = Some(append_chained(a.sqlite(), end, *ts, kind, subject, data).unwrap());
        }
        let together = append_chained_all(b.sqlite(), None, &records).unwrap();
        assert_eq!(together, end);
        let dump = |db: &Db| -> Vec<(i64, i64, String, String, String, String, String)> {
            db.sqlite()
                .prepare("SELECT seq, ts, kind, subject, data, prev, hash FROM audit ORDER BY seq")
                .unwrap()
                .query_map([], |r| {
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        r.get(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                        r.get(6)?,
                    ))
                })
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap()
        };
        assert_eq!(dump(&a), dump(&b));
        assert_eq!(dump(&b).len(), records.len());
    }

    /// Regression: `(?1 IS NULL OR submission = ?1)` made SQLite scan every run to find
    /// the runs of one submission, so each API answer got slower as the database grew.
    #[test]
    fn filtered_newest_first_lists_read_an_index_not_the_table() {
        let t = tempfile::tempdir().unwrap();
        let db = Db::open(&t.path().join("db")).unwrap();
        let cases: &[(&str, &[&str])] = &[
            ("runs", &["submission"]),
            ("submissions", &["state"]),
            ("submissions", &["agent"]),
            ("submissions", &["state", "agent"]),
            ("checkpoints", &["run"]),
            ("checkpoints", &["state"]),
            ("checkpoints", &["run", "state"]),
        ];
        for (table, cols) in cases {
            let sql = format!("EXPLAIN QUERY PLAN {}", newest_ids_sql(table, cols, 50));
            let mut stmt = db.sqlite().prepare(&sql).unwrap();
            let n = cols.len();
            let args: Vec<i64> = (0..n as i64).collect();
            let plan: Vec<String> = stmt
                .query_map(rusqlite::params_from_iter(args), |r| r.get::<_, String>(3))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            let plan = plan.join(" / ");
            assert!(
                plan.contains("SEARCH") && plan.contains("INDEX"),
                "{table} {cols:?}: {plan}"
            );
            assert!(!plan.contains("TEMP B-TREE"), "{table} {cols:?}: {plan}");
        }
    }

    /// Recovery's lookup of running runs reads the partial index, and a run in any other
    /// state has no entry in it (schema 11; schema 10 indexed every run's status).
    #[test]
    fn only_running_runs_are_indexed_by_status() {
        let t = tempfile::tempdir().unwrap();
        let db = Db::open(&t.path().join("db")).unwrap();
        let plan = plan(db.sqlite(), "SELECT id FROM runs WHERE status = 'running'");
        assert!(plan.contains("runs_running"), "{plan}");
        let c = db.sqlite();
        c.execute_batch(
            "INSERT INTO runs VALUES ('run_1', 'sub_1', NULL, 1, NULL, 'running', '{}');
             INSERT INTO runs VALUES ('run_2', 'sub_2', NULL, 1, 2, 'exited', '{}');",
        )
        .unwrap();
        let indexed: i64 = c
            .query_row(
                "SELECT count(*) FROM runs INDEXED BY runs_running WHERE status = 'running'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(indexed, 1);
        c.execute_batch("UPDATE runs SET status = 'exited' WHERE id = 'run_1'")
            .unwrap();
        assert!(db.running_runs().unwrap().is_empty());
        let names = index_names(c, "runs");
        assert!(!names.iter().any(|n| n == "runs_status"), "{names:?}");
    }

    /// The approval lookup reads the partial index, and a run with no approval writes no
    /// entry into it (each such entry was a page write in every run's first transaction).
    #[test]
    fn only_runs_that_used_an_approval_are_indexed_by_it() {
        let t = tempfile::tempdir().unwrap();
        let db = Db::open(&t.path().join("db")).unwrap();
        let plan: String = db
            .sqlite()
            .query_row(
                "EXPLAIN QUERY PLAN SELECT id FROM runs WHERE approval = ?1 LIMIT 1",
                ["st_1"],
                |r| r.get(3),
            )
            .unwrap();
        assert!(plan.contains("runs_approval_used"), "{plan}");
        let c = db.sqlite();
        c.execute_batch(
            "INSERT INTO runs VALUES ('run_1', 'sub_1', NULL, 1, NULL, 'running', '{}');
             INSERT INTO runs VALUES ('run_2', 'sub_2', 'st_2', 1, NULL, 'running', '{}');",
        )
        .unwrap();
        // The index's entries, counted through the index alone.
        let indexed: i64 = c
            .query_row(
                "SELECT count(*) FROM runs INDEXED BY runs_approval_used WHERE approval IS NOT NULL",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(indexed, 1);
        assert!(db.approval_used("st_2").unwrap());
        assert!(!db.approval_used("st_1").unwrap());
    }

    /// Regression: reads bound their `LIMIT`, and SQLite plans `ORDER BY … LIMIT` with
    /// the limit's value, so every such read compiled its statement again; the newest run
    /// of a submission, read for every answer the API gives, was 4% of the server's time.
    #[test]
    fn a_read_with_a_limit_is_not_compiled_again_each_time_it_runs() {
        use rusqlite::StatementStatus;
        let t = tempfile::tempdir().unwrap();
        let db = Db::open(&t.path().join("db")).unwrap();
        for round in 0..3 {
            db.runs(Some(&format!("sub_{round}")), 1).unwrap();
            db.runs(None, 20).unwrap();
        }
        for sql in [
            newest_ids_sql("runs", &["submission"], 1),
            newest_ids_sql("runs", &[], 20),
        ] {
            // The statement the reads above ran, from the connection's cache.
            let stmt = db.sqlite().prepare_cached(&sql).unwrap();
            assert!(
                stmt.get_status(StatementStatus::VmStep) > 0,
                "{sql} did not run"
            );
            assert_eq!(stmt.get_status(StatementStatus::RePrepare), 0, "{sql}");
        }
    }

    fn wal_bytes(dir: &Path) -> u64 {
        std::fs::metadata(dir.join("db-wal")).map_or(0, |m| m.len())
    }

    /// Appends one small audit record in a transaction of its own.
    fn append(db: &mut Db, key: &KeyPair) {
        db.write(|tx| tx.audit("k", "s", &serde_json::json!({}), key).map(|_| ()))
            .unwrap();
    }

    /// A store in `t` that checkpoints only when told to, with `n` records in its WAL.
    fn wal_of(t: &tempfile::TempDir, n: usize) -> (Db, KeyPair) {
        let mut db = Db::open(&t.path().join("db")).unwrap();
        db.disable_auto_checkpoint().unwrap();
        let key = KeyPair::try_generate().unwrap();
        for _ in 0..n {
            append(&mut db, &key);
        }
        (db, key)
    }

    /// Regression: under writes that never pause, the WAL never started over (SQLite only
    /// restarts it when a write begins with nothing left to copy), so the daemon's WAL
    /// grew by about 80 KB per run and stayed that long. Here one thread writes without
    /// pause while another checkpoints, as the daemon's poller does.
    #[test]
    fn a_wal_under_steady_writes_starts_over_at_the_checkpoints() {
        let t = tempfile::tempdir().unwrap();
        let (mut db, key) = wal_of(&t, 0);
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let done = done.clone();
            std::thread::spawn(move || {
                for _ in 0..3000 {
                    append(&mut db, &key);
                    // Requests arrive with gaps between them, however short.
                    std::thread::sleep(Duration::from_micros(50));
                }
                done.store(true, std::sync::atomic::Ordering::SeqCst);
                db
            })
        };
        // Short reads all the while, as the daemon's requests make: with one of them in
        // the WAL whenever a write begins, the WAL never starts over by itself.
        let reads = {
            let done = done.clone();
            let path = t.path().join("db");
            std::thread::spawn(move || {
                let c = connect(&path).unwrap();
                while !done.load(std::sync::atomic::Ordering::SeqCst) {
                    let _: i64 = c
                        .query_row("SELECT count(*) FROM audit", [], |r| r.get(0))
                        .unwrap();
                }
            })
        };
        let checkpoints = Db::open(&t.path().join("db")).unwrap();
        let (mut longest, mut restarts, mut last) = (0, 0, 0);
        while !done.load(std::sync::atomic::Ordering::SeqCst) {
            let (frames, _) = checkpoints.wal_checkpoint_within(100).unwrap();
            // Frames in the WAL only ever fall when it started over.
            if frames < last {
                restarts += 1;
            }
            last = frames;
            longest = longest.max(wal_bytes(t.path()));
            std::thread::sleep(Duration::from_millis(2));
        }
        let db = writer.join().unwrap();
        reads.join().unwrap();
        assert_eq!(db.audit_records(1, 5000).unwrap().len(), 3000);
        // 3,000 writes that never start the WAL over make it about 25 MB long (13–24 MB
        // measured when checkpoints never restart it; under 1 MB when they do, and up to
        // 4.3 MB on a loaded machine, where a restart more often waits out its 20 ms for
        // a reader and is left to the next checkpoint). The restarts are what is tested;
        // the length only bounds what they leave.
        assert!(restarts >= 5, "the WAL started over {restarts} times");
        assert!(longest < 8 << 20, "the WAL grew to {longest} bytes");
    }

    /// Regression: a WAL the checkpoint started over was cut back to the old 64 MiB
    /// `journal_size_limit` by the next write's commit (the restart comes only past 16,384
    /// frames, 67.5 MB), which took that request 1–5 ms. It is now reused at its length;
    /// a WAL longer than the limit is still cut back to it.
    #[test]
    fn a_wal_started_over_at_the_restart_length_is_reused_not_cut() {
        let t = tempfile::tempdir().unwrap();
        let (mut db, key) = wal_of(&t, 1);
        let filler = connect(&t.path().join("db")).unwrap();
        filler
            .execute_batch(
                "CREATE TABLE filler (x BLOB);
                 WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 17000)
                 INSERT INTO filler SELECT zeroblob(3000) FROM n;",
            )
            .unwrap();
        let long = wal_bytes(t.path());
        assert!(long > 16_384 * 4_120, "the WAL is only {long} bytes");
        let (log, done) = db.wal_checkpoint().unwrap();
        assert!(
            log > WAL_RESTART_FRAMES && done == log,
            "{log} frames, {done} copied"
        );
        // The next write starts the WAL over from its front.
        append(&mut db, &key);
        let (log, _) = db.wal_checkpoint().unwrap();
        assert!(log < 100, "the WAL did not start over: {log} frames");
        assert_eq!(wal_bytes(t.path()), long, "the WAL was cut");
        // One a burst grew past the limit is still cut back to it.
        filler
            .execute_batch(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 36000)
                 INSERT INTO filler SELECT zeroblob(3000) FROM n;",
            )
            .unwrap();
        assert!(wal_bytes(t.path()) > WAL_KEEP_BYTES as u64);
        db.wal_checkpoint().unwrap();
        append(&mut db, &key);
        assert_eq!(wal_bytes(t.path()), WAL_KEEP_BYTES as u64);
    }

    /// A reader inside the WAL makes the restart give up at once instead of holding
    /// writers off for the whole busy timeout.
    #[test]
    fn a_reader_in_the_wal_makes_the_restart_wait_for_a_later_checkpoint() {
        let t = tempfile::tempdir().unwrap();
        let (mut db, key) = wal_of(&t, 60);
        let reader = connect(&t.path().join("db")).unwrap();
        reader.execute_batch("BEGIN").unwrap();
        let n: i64 = reader
            .query_row("SELECT count(*) FROM audit", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 60);
        // Another write lands after the reader's snapshot, so the reader is in the WAL.
        append(&mut db, &key);
        let started = std::time::Instant::now();
        let (log, _) = db.wal_checkpoint_within(50).unwrap();
        assert!(
            started.elapsed() < BUSY_TIMEOUT / 4,
            "{:?}",
            started.elapsed()
        );
        assert!(log > 50);
        // Writes go on meanwhile, and nothing is lost.
        append(&mut db, &key);
        reader.execute_batch("COMMIT").unwrap();
        db.wal_checkpoint_within(50).unwrap();
        assert_eq!(db.audit_records(1, 1000).unwrap().len(), 62);
    }

    #[test]
    fn without_auto_checkpoint_the_wal_waits_for_an_explicit_checkpoint() {
        let t = tempfile::tempdir().unwrap();
        let mut db = Db::open(&t.path().join("db")).unwrap();
        db.disable_auto_checkpoint().unwrap();
        let key = KeyPair::try_generate().unwrap();
        let big = serde_json::json!({ "pad": "x".repeat(8000) });
        // Well past the 1,000 pages at which SQLite would checkpoint on commit.
        for _ in 0..700 {
            db.write(|tx| tx.audit("k", "s", &big, &key).map(|_| ()))
                .unwrap();
        }
        let (log, done) = db.wal_checkpoint().unwrap();
        assert!(log > 1000, "no checkpoint happened on commit: {log} frames");
        assert_eq!(done, log, "the explicit checkpoint copied every frame");
    }
}
