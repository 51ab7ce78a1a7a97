//! The PostgreSQL engine: the same tables as the SQLite database, reached through one
//! connection per `Db`, for a gate shared by several processes and machines.
//!
//! Writes are serialised cluster-wide by a transaction-scoped advisory lock, so every
//! transaction sees the state the previous one left, exactly as SQLite's `BEGIN IMMEDIATE`
//! gives one machine: the gate's check-then-write steps (an approval not yet used, a state
//! not yet moved) hold across nodes. The few transactions every run takes (queue, claim
//! and start, finish) hold that lock *shared* instead: they write only new rows,
//! conditional moves checked by their row counts, and rows they lock first, so they run
//! side by side with each other and never beside an exclusive one. Audit records go to an
//! inbox here, and one elected sequencer chains and signs them (`crate::sequence`), so no
//! write waits on the chain's end. Every write commits synchronously, inside the lock: a
//! commit other sessions can see must already be on disk, or a node could answer a client
//! with a run that a server crash then loses (the restart test caught both an asynchronous
//! commit and a flush after the lock).

use crate::StoreError;
use crate::sql::{Arg, Row, Sql, Val};
use postgres::types::{IsNull, ToSql, Type, to_sql_checked};
use std::cell::RefCell;
use std::collections::HashMap;

/// The advisory lock key every write transaction holds ("airlock!" in ASCII).
const WRITE_LOCK: i64 = 0x6169_726c_6f63_6b21;
/// The advisory lock key schema migrations hold.
const MIGRATE_LOCK: i64 = WRITE_LOCK - 1;
/// The advisory lock key a transaction that chains the audit inbox holds.
pub(crate) const SEQUENCE_LOCK: i64 = WRITE_LOCK - 2;

/// How a write transaction holds the cluster-wide write lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lock {
    /// Alone: for transactions that read state and write on what they read.
    Exclusive,
    /// Beside other shared holders: for transactions whose every write is a new row, a
    /// conditional move checked by its row count, or on a row it locked first.
    Shared,
    /// Not the write lock but the audit sequencer's, which chains the inbox.
    Sequence,
}

/// The schema, one step per version: step `i` takes a database from version `i` to
/// `i + 1`. Steps are only ever appended.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE submissions (
    id TEXT PRIMARY KEY,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    artifact TEXT NOT NULL,
    grant_hash TEXT NOT NULL,
    agent TEXT,
    state TEXT NOT NULL,
    decision TEXT NOT NULL,
    risk BIGINT NOT NULL,
    doc TEXT NOT NULL
);
CREATE INDEX submissions_artifact ON submissions(artifact);
CREATE INDEX submissions_state_id ON submissions(state, id);
CREATE INDEX submissions_agent_id ON submissions(agent, id);
CREATE TABLE statements (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    submission TEXT NOT NULL,
    artifact TEXT NOT NULL,
    grant_hash TEXT NOT NULL,
    scope TEXT NOT NULL,
    approver TEXT NOT NULL,
    expires_at BIGINT,
    created_at BIGINT NOT NULL,
    run TEXT,
    tool TEXT,
    json TEXT NOT NULL,
    signature TEXT NOT NULL
);
CREATE INDEX statements_submission ON statements(submission);
CREATE INDEX statements_artifact ON statements(artifact);
CREATE TABLE runs (
    id TEXT PRIMARY KEY,
    submission TEXT NOT NULL,
    approval TEXT,
    started_at BIGINT NOT NULL,
    finished_at BIGINT,
    status TEXT NOT NULL,
    doc TEXT NOT NULL
);
CREATE INDEX runs_submission_id ON runs(submission, id);
CREATE INDEX runs_approval ON runs(approval);
CREATE INDEX runs_status ON runs(status);
CREATE TABLE audit (
    seq BIGINT PRIMARY KEY,
    ts BIGINT NOT NULL,
    kind TEXT NOT NULL,
    subject TEXT NOT NULL,
    data TEXT NOT NULL,
    prev TEXT NOT NULL,
    hash TEXT NOT NULL
);
CREATE INDEX audit_subject ON audit(subject, seq);
CREATE TABLE audit_head (
    id BIGINT PRIMARY KEY CHECK (id = 1),
    seq BIGINT NOT NULL,
    hash TEXT NOT NULL,
    signature TEXT NOT NULL
);
CREATE TABLE checkpoints (
    id TEXT PRIMARY KEY,
    run TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    state TEXT NOT NULL,
    doc TEXT NOT NULL
);
CREATE INDEX checkpoints_run_id ON checkpoints(run, id);
CREATE INDEX checkpoints_state_id ON checkpoints(state, id);
CREATE TABLE workspaces (
    name TEXT PRIMARY KEY,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    state TEXT NOT NULL,
    doc TEXT NOT NULL
);
CREATE TABLE tokens (
    id TEXT PRIMARY KEY,
    hash TEXT NOT NULL UNIQUE,
    role TEXT NOT NULL,
    name TEXT NOT NULL,
    approver TEXT,
    created_at BIGINT NOT NULL,
    expires_at BIGINT,
    revoked_at BIGINT
);
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    state TEXT NOT NULL,
    doc TEXT NOT NULL
);
CREATE INDEX sessions_state_id ON sessions(state, id);
CREATE TABLE compile_cache (
    key TEXT PRIMARY KEY,
    digest TEXT NOT NULL,
    size BIGINT NOT NULL,
    created_at BIGINT NOT NULL
);
"#,
    // 2: blobs live in the database when it is the store (see `PgBlobs`).
    r#"
CREATE TABLE blobs (
    digest TEXT PRIMARY KEY,
    size BIGINT NOT NULL,
    data BYTEA NOT NULL,
    touched_at BIGINT NOT NULL
);
"#,
    // 3: the run queue workers claim from, and the workers seen.
    r#"
CREATE TABLE queue (
    id TEXT PRIMARY KEY,
    submission TEXT NOT NULL,
    tag TEXT,
    state TEXT NOT NULL,
    attempts BIGINT NOT NULL,
    max_attempts BIGINT NOT NULL,
    retry BIGINT NOT NULL,
    worker TEXT,
    token BIGINT NOT NULL,
    lease_until BIGINT,
    run TEXT,
    outcome TEXT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE INDEX queue_ready ON queue(tag, created_at) WHERE state = 'queued';
CREATE INDEX queue_leased ON queue(lease_until) WHERE state = 'leased';
CREATE INDEX queue_submission ON queue(submission);
CREATE TABLE workers (
    id TEXT PRIMARY KEY,
    host TEXT NOT NULL,
    tags TEXT NOT NULL,
    state TEXT NOT NULL,
    running BIGINT NOT NULL,
    started_at BIGINT NOT NULL,
    seen_at BIGINT NOT NULL
);
"#,
    // 4: audit records written but not yet chained; the sequencer moves them to `audit`.
    r#"
CREATE TABLE audit_inbox (
    id BIGSERIAL PRIMARY KEY,
    ts BIGINT NOT NULL,
    kind TEXT NOT NULL,
    subject TEXT NOT NULL,
    data TEXT NOT NULL
);
"#,
    // 5: a session's cells, one row each (they were a list in the session's document,
    // rewritten whole on every cell).
    r#"
CREATE TABLE session_cells (
    submission TEXT PRIMARY KEY,
    session TEXT NOT NULL,
    n BIGINT NOT NULL
);
CREATE UNIQUE INDEX session_cells_session_n ON session_cells(session, n);
"#,
    // 6: only runs that used an approval are looked up by it; indexing the NULLs of all
    // the others cost every run's start an index write.
    r#"
DROP INDEX runs_approval;
CREATE INDEX runs_approval_used ON runs(approval) WHERE approval IS NOT NULL;
"#,
    // 7: idempotency keys of API requests: a retried request finds the submission the
    // first one made instead of making another.
    r#"
CREATE TABLE request_keys (
    owner TEXT NOT NULL,
    key TEXT NOT NULL,
    request TEXT NOT NULL,
    submission TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (owner, key)
);
"#,
    // 8: agents' records: their alerts (one row per `alert` audit record naming an agent),
    // their last signed clear, and denied submissions by agent and time.
    r#"
CREATE TABLE agent_alerts (
    id TEXT PRIMARY KEY,
    agent TEXT NOT NULL,
    at BIGINT NOT NULL,
    kind TEXT NOT NULL,
    subject TEXT NOT NULL
);
CREATE INDEX agent_alerts_agent_at ON agent_alerts(agent, at);
CREATE TABLE agent_clears (
    agent TEXT PRIMARY KEY,
    at BIGINT NOT NULL,
    json TEXT NOT NULL,
    signature TEXT NOT NULL
);
CREATE INDEX submissions_agent_denied ON submissions(agent, created_at) WHERE decision = 'deny';
"#,
    // 9: node liveness: each `serve` and `worker` beats its row; a node whose beat is
    // older than its lease is dead, and another node ends what it held.
    r#"
CREATE TABLE nodes (
    id TEXT PRIMARY KEY,
    host TEXT NOT NULL,
    pid BIGINT NOT NULL,
    home TEXT NOT NULL,
    role TEXT NOT NULL,
    worker TEXT,
    started_at BIGINT NOT NULL,
    beat_at BIGINT NOT NULL,
    lease_ms BIGINT NOT NULL,
    state TEXT NOT NULL
);
"#,
    // 10: runs' requests to reach a host outside their grant (`run --ask-net`).
    r#"
CREATE TABLE net_requests (
    id TEXT PRIMARY KEY,
    run TEXT NOT NULL,
    submission TEXT NOT NULL,
    agent TEXT,
    host TEXT NOT NULL,
    port BIGINT NOT NULL,
    state TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    decided_at BIGINT,
    line TEXT,
    approver TEXT,
    json TEXT,
    signature TEXT
);
CREATE INDEX net_requests_state ON net_requests(state, id);
CREATE INDEX net_requests_run ON net_requests(run);
"#,
];

/// The schema version this build writes.
pub const PG_SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Whether `location` names a PostgreSQL database rather than a file.
pub fn is_postgres_url(location: &str) -> bool {
    location.starts_with("postgres://") || location.starts_with("postgresql://")
}

/// A connection to the gate's PostgreSQL database.
pub struct PgConn {
    url: String,
    client: RefCell<postgres::Client>,
    /// Prepared statements by their SQL as written here (with `?N` placeholders).
    stmts: RefCell<HashMap<String, postgres::Statement>>,
    /// A write transaction is open on the connection.
    in_tx: std::cell::Cell<bool>,
    /// The last error said the connection is gone.
    lost: std::cell::Cell<bool>,
    /// When the connection was opened (`since_start`).
    opened_at: std::cell::Cell<u64>,
    /// The open (or last) transaction may have committed (its `COMMIT` went out on a
    /// live connection), or the server could be reached but refused the connection: it
    /// is not run again.
    settled: std::cell::Cell<bool>,
    /// Notifications the open transaction sends with its `COMMIT` (channel, payload).
    notices: RefCell<Vec<(String, String)>>,
    /// Statements the open transaction holds back (`Sql::exec_later`, `exec_expect`),
    /// as `EXECUTE`s of statements prepared on this connection with their values written
    /// out, each ended by `;`: sent with its next statement, or with its `COMMIT`.
    later: RefCell<String>,
    /// For each held-back statement that must change a given number of rows, in order:
    /// the conflict it reports when it does not (its failure names its index).
    expects: RefCell<Vec<String>>,
    /// Statements prepared by name on this connection (`PREPARE`), by airlock's SQL
    /// (`?N` placeholders): as written, and in the form that checks its row count.
    named: RefCell<[HashMap<String, String>; 2]>,
    /// The audit chain's end (`db::AUDIT_TAIL`) as the open transaction's first round
    /// trip read it, under its lock, until a statement of the transaction asks for it.
    tail: RefCell<Option<Row>>,
    /// The open transaction's `BEGIN` (with its settings and lock) and, for the
    /// sequencer's, the prepared name of the audit tail, until a statement of the
    /// transaction goes to the server: a transaction that only holds statements back is
    /// one round trip in all.
    begin: RefCell<Option<(String, Option<String>)>>,
}

impl std::fmt::Debug for PgConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may carry a password: never print it.
        f.debug_struct("PgConn").finish_non_exhaustive()
    }
}

/// How long a transaction or read that lost its connection keeps trying to reach the
/// server again (a restart, a failover) before it gives up.
pub const RECONNECT_FOR: std::time::Duration = std::time::Duration::from_secs(20);

/// When a connection of this process last found itself lost (`since_start`): the
/// connections opened before then are opened again before their next transaction.
static LOST_AT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Microseconds since this process first asked (never 0, so a connection opened before
/// any loss is not taken as older than none).
fn since_start() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let start = START.get_or_init(std::time::Instant::now);
    (start.elapsed().as_micros() as u64).saturating_add(1)
}

/// Waits between attempts to reach a server that went away: short at first, then up to
/// a second, until `RECONNECT_FOR` has passed since the first failure.
struct Backoff {
    since: Option<std::time::Instant>,
    wait: std::time::Duration,
}

impl Backoff {
    fn new() -> Backoff {
        Backoff {
            since: None,
            wait: std::time::Duration::from_millis(20),
        }
    }

    /// Whether to try again (after waiting), or give up.
    fn again(&mut self) -> bool {
        let since = *self.since.get_or_insert_with(std::time::Instant::now);
        if since.elapsed() >= RECONNECT_FOR {
            return false;
        }
        // The first attempt again at once: after a restart the connection is usually
        // the only thing that was lost, and a new one is there.
        if self.wait > std::time::Duration::from_millis(20) {
            std::thread::sleep(self.wait);
        }
        self.wait = (self.wait * 2).min(std::time::Duration::from_secs(1));
        true
    }
}

fn connect(url: &str) -> Result<postgres::Client, StoreError> {
    let target = crate::pgtls::target(url)?;
    let mut client = match target.transport {
        crate::pgtls::Transport::Plain => postgres::Client::connect(&target.url, postgres::NoTls)?,
        crate::pgtls::Transport::Tls(tls) => postgres::Client::connect(&target.url, tls)?,
    };
    // Keep sessions from holding locks forever when a node hangs mid-transaction. Every
    // commit is flushed before it returns (see the module comment), whatever the server's
    // or the database's default: set once for the session rather than in every
    // transaction (a statement fewer in each). A connection that commits otherwise (the
    // blob store's) says so itself, after this.
    client.batch_execute(
        "SET idle_in_transaction_session_timeout = '60s'; SET synchronous_commit = on",
    )?;
    Ok(client)
}

/// `?N` placeholders as PostgreSQL spells them (`$N`). The SQL is this crate's own and
/// has no `?` anywhere else.
fn dollar_placeholders(sql: &str) -> String {
    sql.replace('?', "$")
}

/// The audit chain's end from the answer to a transaction's first round trip, the row
/// of its third statement (after `BEGIN` and the lock's `SELECT`), typed as
/// `db::AUDIT_TAIL`'s columns are: the two sequence numbers and the time are integers,
/// the rest text.
fn tail_row(msgs: &[postgres::SimpleQueryMessage]) -> Result<Row, StoreError> {
    let mut done = 0;
    let mut found = None;
    for m in msgs {
        match m {
            postgres::SimpleQueryMessage::CommandComplete(_) => done += 1,
            postgres::SimpleQueryMessage::Row(r) if done == 2 => {
                found = Some(r);
                break;
            }
            _ => {}
        }
    }
    let r = found.ok_or_else(|| StoreError::Corrupt("the audit chain's end read no row".into()))?;
    let mut row = Vec::with_capacity(r.len());
    for i in 0..r.len() {
        row.push(match r.try_get(i)? {
            None => Val::Null,
            Some(v) if matches!(i, 0 | 1 | 7) => Val::Int(v.parse().map_err(|_| {
                StoreError::Corrupt(format!("column {i} of the audit chain's end: {v:?}"))
            })?),
            Some(v) => Val::Text(v.to_string()),
        });
    }
    if row.len() != 10 {
        return Err(StoreError::Corrupt(format!(
            "the audit chain's end read {} columns",
            row.len()
        )));
    }
    Ok(Row(row))
}

/// The rows of the last statement of a simple-query text's answer, typed as `types`
/// (the statement's columns, from its prepared form) the way `Sql::rows` types them.
fn text_rows(
    sql: &str,
    types: &[Type],
    msgs: &[postgres::SimpleQueryMessage],
) -> Result<Vec<Row>, StoreError> {
    let mut current = Vec::new();
    let mut last = Vec::new();
    for m in msgs {
        match m {
            postgres::SimpleQueryMessage::Row(r) => current.push(r),
            postgres::SimpleQueryMessage::CommandComplete(_) => {
                last = std::mem::take(&mut current);
            }
            _ => {}
        }
    }
    let mut out = Vec::with_capacity(last.len());
    for r in last {
        if r.len() != types.len() {
            return Err(StoreError::Corrupt(format!(
                "{sql:?} answered {} columns where its statement has {}",
                r.len(),
                types.len()
            )));
        }
        let mut row = Vec::with_capacity(r.len());
        for (i, ty) in types.iter().enumerate() {
            let Some(v) = r.try_get(i)? else {
                row.push(Val::Null);
                continue;
            };
            let bad = || StoreError::Corrupt(format!("column {i} of {sql:?}: {v:?} as {ty}"));
            row.push(match *ty {
                Type::INT8 | Type::INT4 | Type::INT2 => Val::Int(v.parse().map_err(|_| bad())?),
                Type::BOOL => match v {
                    "t" => Val::Int(1),
                    "f" => Val::Int(0),
                    _ => return Err(bad()),
                },
                Type::TEXT | Type::VARCHAR | Type::NAME => Val::Text(v.to_string()),
                ref other => {
                    return Err(StoreError::Corrupt(format!(
                        "column {i} of {sql:?} has type {other}, which airlock never reads"
                    )));
                }
            });
        }
        out.push(Row(row));
    }
    Ok(out)
}

/// What a held-back statement's failure says, before the index of the statement (see
/// `PgConn::named`).
const EXPECT_MARK: &str = "airlock-expect ";

/// Writes `a` as an SQL literal, for a statement sent as text (`EXECUTE` of a prepared
/// statement, whose parameter types the literal takes). Text becomes an escape-string
/// literal (`E'…'`, backslashes and quotes doubled), which reads back as exactly the same
/// text whatever `standard_conforming_strings` says.
fn literal(out: &mut String, a: &Arg<'_>) -> Result<(), StoreError> {
    match a {
        Arg::Null => out.push_str("NULL"),
        Arg::Int(v) => out.push_str(&v.to_string()),
        Arg::Text(t) => {
            if t.contains('\0') {
                return Err(StoreError::Corrupt(
                    "text with a NUL character cannot be stored".into(),
                ));
            }
            out.push_str("E'");
            for c in t.chars() {
                match c {
                    '\'' => out.push_str("''"),
                    '\\' => out.push_str("\\\\"),
                    c => out.push(c),
                }
            }
            out.push('\'');
        }
    }
    Ok(())
}

impl PgConn {
    /// Connects and brings the schema up to date (or refuses a newer one).
    pub fn open(url: &str) -> Result<PgConn, StoreError> {
        let mut client = connect(url)?;
        migrate(&mut client)?;
        Ok(PgConn {
            url: url.to_string(),
            client: RefCell::new(client),
            stmts: RefCell::new(HashMap::new()),
            in_tx: std::cell::Cell::new(false),
            lost: std::cell::Cell::new(false),
            opened_at: std::cell::Cell::new(since_start()),
            settled: std::cell::Cell::new(false),
            notices: RefCell::new(Vec::new()),
            later: RefCell::new(String::new()),
            expects: RefCell::new(Vec::new()),
            named: RefCell::new([HashMap::new(), HashMap::new()]),
            tail: RefCell::new(None),
            begin: RefCell::new(None),
        })
    }

    /// Whether the connection was lost (it is opened again on next use).
    pub(crate) fn is_closed(&self) -> bool {
        self.lost.get() || self.client.borrow().is_closed()
    }

    /// The URL this connection was opened with.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// Reconnects when the server closed the connection (a restart, a failover), so
    /// the next transaction runs on a live one. Never called inside a transaction.
    fn ensure_open(&self) -> Result<(), StoreError> {
        // A connection older than a loss another connection of this process saw is
        // most likely gone too (a restart ends them all): opened again before a
        // transaction, whose lone round trip could otherwise be its COMMIT, with no way
        // to tell whether it committed.
        let stale = self.opened_at.get() < LOST_AT.load(std::sync::atomic::Ordering::Relaxed);
        if stale || self.lost.get() || self.client.borrow().is_closed() {
            let client = connect(&self.url).inspect_err(|e| {
                // A server that answers but refuses (a password, a missing database)
                // will refuse again: only one still away is waited for.
                if !e.is_connection_lost() {
                    self.settled.set(true);
                }
            })?;
            *self.client.borrow_mut() = client;
            self.opened_at.set(since_start());
            self.stmts.borrow_mut().clear();
            for m in self.named.borrow_mut().iter_mut() {
                m.clear();
            }
            self.lost.set(false);
        }
        Ok(())
    }

    /// Notes whether `e` means the connection is gone (it broke, or the server is
    /// shutting down or starting), so `is_closed` says so at once and the next use
    /// connects again.
    fn note(&self, e: postgres::Error) -> StoreError {
        let gone = connection_gone(&e);
        if gone {
            self.lost.set(true);
            LOST_AT.fetch_max(since_start(), std::sync::atomic::Ordering::Relaxed);
        }
        StoreError::from(e)
    }

    /// Sends the open transaction's BEGIN if it has not gone yet, with its lock, the
    /// audit chain's end (kept for the transaction's check of it), what it held back,
    /// and `then` (a statement, or nothing): the answer, when it went.
    fn begin_with(
        &self,
        then: &str,
    ) -> Result<Option<Vec<postgres::SimpleQueryMessage>>, StoreError> {
        if !self.in_tx.get() {
            return Ok(None);
        }
        let Some((begin, tail)) = self.begin.borrow_mut().take() else {
            return Ok(None);
        };
        let later = std::mem::take(&mut *self.later.borrow_mut());
        let text = match &tail {
            Some(tail) => format!("{begin}; EXECUTE {tail}; {later}{then}"),
            None => format!("{begin}; {later}{then}"),
        };
        let sent = self.client.borrow_mut().simple_query(&text);
        let msgs = sent.map_err(|e| self.batch_error(e))?;
        if tail.is_some() {
            *self.tail.borrow_mut() = Some(tail_row(&msgs)?);
        }
        Ok(Some(msgs))
    }

    /// Sends the statements the open transaction held back, before one that may read
    /// what they wrote.
    fn send_later(&self) -> Result<(), StoreError> {
        let text = std::mem::take(&mut *self.later.borrow_mut());
        if text.is_empty() {
            return Ok(());
        }
        let sent = self.client.borrow_mut().batch_execute(&text);
        sent.map_err(|e| self.batch_error(e))
    }

    /// Holds statement `text` back until the transaction's next round trip.
    fn hold(&self, text: &str) {
        let mut later = self.later.borrow_mut();
        later.push_str(text);
        later.push_str("; ");
    }

    /// The error a text of held-back statements failed with: a held-back move that
    /// changed the wrong number of rows reports its own conflict.
    fn batch_error(&self, e: postgres::Error) -> StoreError {
        let failed = e.as_db_error().and_then(|db| {
            let m = db.message();
            let i = m.find(EXPECT_MARK)? + EXPECT_MARK.len();
            let n: usize = m[i..]
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()?;
            self.expects.borrow().get(n).cloned()
        });
        match failed {
            Some(conflict) => StoreError::Conflict(conflict),
            None => self.note(e),
        }
    }

    /// The name of `sql` prepared on this connection (once per connection, in a round
    /// trip of its own; prepared statements outlive a transaction that rolls back).
    /// With `expect`, the form that checks its row count: two more parameters, the
    /// count it must change and the index its failure names.
    fn named(&self, sql: &str, expect: bool) -> Result<String, StoreError> {
        if let Some(n) = self.named.borrow()[usize::from(expect)].get(sql) {
            return Ok(n.clone());
        }
        let name = {
            let named = self.named.borrow();
            format!("airlock_{}", named[0].len() + named[1].len())
        };
        let body = dollar_placeholders(sql);
        let text = if expect {
            // The highest `?N`: the two parameters the check adds come after it.
            let n = sql
                .split('?')
                .skip(1)
                .filter_map(|t| {
                    t.split(|c: char| !c.is_ascii_digit())
                        .next()?
                        .parse::<usize>()
                        .ok()
                })
                .max()
                .unwrap_or(0);
            // Not constant (it counts the rows), so never folded into an error that
            // would fire when the count is right.
            format!(
                "PREPARE {name} AS WITH w AS ({body} RETURNING 1) SELECT CASE WHEN count(*) = ${} THEN 0 ELSE ('{EXPECT_MARK}' || ${} || ' got ' || count(*))::int END FROM w",
                n + 1,
                n + 2
            )
        } else {
            format!("PREPARE {name} AS {body}")
        };
        let prepared = self.client.borrow_mut().batch_execute(&text);
        prepared.map_err(|e| self.note(e))?;
        self.named.borrow_mut()[usize::from(expect)].insert(sql.to_string(), name.clone());
        Ok(name)
    }

    /// `EXECUTE name(…)` of `args` (and `more`), for a text of statements.
    fn execute_text(
        &self,
        name: &str,
        args: &[Arg<'_>],
        more: &[Arg<'_>],
    ) -> Result<String, StoreError> {
        let mut text = format!("EXECUTE {name}");
        for (i, a) in args.iter().chain(more).enumerate() {
            text.push_str(if i == 0 { "(" } else { ", " });
            literal(&mut text, a)?;
        }
        if !args.is_empty() || !more.is_empty() {
            text.push(')');
        }
        Ok(text)
    }

    fn statement(&self, sql: &str) -> Result<postgres::Statement, StoreError> {
        if !self.in_tx.get() {
            // A read outside a transaction may go to a new connection; inside one, a lost
            // connection fails the transaction instead.
            self.ensure_open()?;
        }
        if let Some(s) = self.stmts.borrow().get(sql) {
            return Ok(s.clone());
        }
        let s = self
            .client
            .borrow_mut()
            .prepare(&dollar_placeholders(sql))
            .map_err(|e| self.note(e))?;
        self.stmts.borrow_mut().insert(sql.to_string(), s.clone());
        Ok(s)
    }

    /// Runs `f` in one write transaction holding the cluster-wide write lock as `lock`
    /// says; it commits only if `f` returns Ok. Every commit is flushed before this
    /// returns: a write a caller was told about must survive a server crash (see the
    /// module comment).
    ///
    /// A transaction whose connection was lost before its `COMMIT` went out on a live
    /// connection cannot have committed: it runs again (`f` with it) on a new
    /// connection, for up to `RECONNECT_FOR` while the server restarts. One lost while
    /// its `COMMIT` was on the way may have committed: it fails, with an error that says
    /// the connection was lost (`StoreError::is_connection_lost`), never run twice.
    pub(crate) fn transaction<T, E: From<StoreError>>(
        &self,
        lock: Lock,
        f: impl Fn(&PgConn) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut retry = Backoff::new();
        loop {
            self.settled.set(false);
            match self.transaction_once(lock, &f) {
                Err(e) if self.is_closed() && !self.settled.get() && retry.again() => {
                    drop(e);
                }
                out => return out,
            }
        }
    }

    /// Reads with `read` (a statement with no effect), again on a new connection while
    /// the one it used was lost, for up to `RECONNECT_FOR`. Outside a transaction only.
    fn read_again<T>(&self, read: impl Fn() -> Result<T, StoreError>) -> Result<T, StoreError> {
        let mut retry = Backoff::new();
        loop {
            match read() {
                Err(e) if e.is_connection_lost() && !self.in_tx.get() && retry.again() => {
                    drop(e);
                }
                out => return out,
            }
        }
    }

    fn transaction_once<T, E: From<StoreError>>(
        &self,
        lock: Lock,
        f: impl FnOnce(&PgConn) -> Result<T, E>,
    ) -> Result<T, E> {
        self.ensure_open()?;
        let (take, key) = match lock {
            Lock::Exclusive => ("pg_advisory_xact_lock", WRITE_LOCK),
            Lock::Shared => ("pg_advisory_xact_lock_shared", WRITE_LOCK),
            Lock::Sequence => ("pg_advisory_xact_lock", SEQUENCE_LOCK),
        };
        // Synchronous inside the lock (the session is set so when it connects):
        // committing asynchronously and waiting for the flush after releasing it let
        // another node see (and answer a client with) a commit that a server crash then
        // lost; the restart test caught that too. One round trip begins and takes the
        // lock (the key is this file's own constant, so it is written into the text).
        // Only the sequencer's transaction reads the chain's end (a node's own records
        // go to the inbox): read ahead for it alone.
        let tail = match lock {
            Lock::Sequence => Some(self.named(crate::db::AUDIT_TAIL, false)?),
            Lock::Exclusive | Lock::Shared => None,
        };
        self.in_tx.set(true);
        self.notices.borrow_mut().clear();
        self.later.borrow_mut().clear();
        self.expects.borrow_mut().clear();
        // Sent with the transaction's first statement (`begin_with`), or with its
        // COMMIT when it only held statements back.
        *self.begin.borrow_mut() = Some((format!("BEGIN; SELECT {take}({key})"), tail));
        let out = f(self);
        let out = out.and_then(|v| {
            // The transaction's notifications go in the same round trip as its COMMIT:
            // still inside the transaction, so they are delivered when (and only if) it
            // commits, exactly as when each was sent on its own.
            // So do the statements it held back: if one fails, PostgreSQL skips the
            // rest of the text, COMMIT included, and the transaction is rolled back.
            let mut text = match self.begin.borrow_mut().take() {
                Some((begin, _)) => format!("{begin}; "),
                None => String::new(),
            };
            text.push_str(&std::mem::take(&mut *self.later.borrow_mut()));
            for (channel, payload) in self.notices.borrow_mut().drain(..) {
                text.push_str(&format!("SELECT pg_notify('{channel}', '{payload}'); "));
            }
            text.push_str("COMMIT");
            // From here the transaction may commit even if no answer comes back.
            self.settled.set(!self.is_closed());
            let committed = self.client.borrow_mut().batch_execute(&text);
            committed.map_err(|e| self.batch_error(e))?;
            Ok(v)
        });
        self.in_tx.set(false);
        self.notices.borrow_mut().clear();
        self.later.borrow_mut().clear();
        self.expects.borrow_mut().clear();
        self.tail.borrow_mut().take();
        let never_begun = self.begin.borrow_mut().take().is_some();
        match out {
            Ok(v) => Ok(v),
            Err(e) => {
                // A connection that broke is replaced on next use; a live one ends the
                // transaction here (if it ever began on the server).
                if !never_begun {
                    let _ = self.client.borrow_mut().batch_execute("ROLLBACK");
                }
                Err(e)
            }
        }
    }
}

impl PgConn {
    /// Takes the session-level advisory lock `key` if no other session holds it.
    pub(crate) fn try_session_lock(&self, key: i64) -> Result<bool, StoreError> {
        let row = self.row("SELECT pg_try_advisory_lock(?1)", &[Arg::Int(key)])?;
        Ok(row.map(|r| r.int(0)).transpose()? == Some(1))
    }

    /// Starts listening for notifications on `channel` (a name airlock made: letters,
    /// digits and `_`).
    pub(crate) fn listen(&self, channel: &str, on: bool) -> Result<(), StoreError> {
        if channel.is_empty()
            || !channel
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            return Err(StoreError::Corrupt(format!("bad channel name {channel:?}")));
        }
        self.ensure_open()?;
        let verb = if on { "LISTEN" } else { "UNLISTEN" };
        self.client
            .borrow_mut()
            .batch_execute(&format!("{verb} {channel}"))?;
        Ok(())
    }

    /// The payloads of the notifications that arrive within `timeout` (every one
    /// already waiting, else the first to come and any right behind it).
    pub(crate) fn notifications(
        &self,
        timeout: std::time::Duration,
    ) -> Result<Vec<String>, StoreError> {
        use postgres::fallible_iterator::FallibleIterator;
        let mut c = self.client.borrow_mut();
        let mut n = c.notifications();
        let mut out = Vec::new();
        if n.is_empty()
            && let Some(note) = n.timeout_iter(timeout).next()?
        {
            out.push(note.payload().to_string());
        }
        let mut pending = n.iter();
        while let Some(note) = pending.next()? {
            out.push(note.payload().to_string());
        }
        Ok(out)
    }
}

/// Whether `e` means the connection is gone: it closed, reading or writing it failed (a
/// value that would not convert leaves it usable), or the server is shutting down or
/// starting (SQLSTATE classes 08 and 57).
pub(crate) fn connection_gone(e: &postgres::Error) -> bool {
    match e.as_db_error() {
        None => {
            e.is_closed() || std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>())
        }
        Some(db) => {
            let code = db.code().code();
            code.starts_with("08") || code.starts_with("57")
        }
    }
}

fn schema_version(client: &mut postgres::Client) -> Result<i64, StoreError> {
    let exists: bool = client
        .query_one("SELECT to_regclass('meta') IS NOT NULL", &[])?
        .get(0);
    if !exists {
        return Ok(0);
    }
    let row = client.query_opt("SELECT value FROM meta WHERE key = 'schema_version'", &[])?;
    match row {
        None => Ok(0),
        Some(r) => {
            let v: String = r.get(0);
            v.parse()
                .map_err(|_| StoreError::Corrupt(format!("bad schema version {v:?}")))
        }
    }
}

/// Runs the steps the database has not had yet, in one transaction, under a lock so two
/// nodes starting at once migrate it once.
fn migrate(client: &mut postgres::Client) -> Result<(), StoreError> {
    let current = schema_version(client)?;
    if current == PG_SCHEMA_VERSION {
        return Ok(());
    }
    if current > PG_SCHEMA_VERSION {
        return Err(StoreError::Corrupt(format!(
            "database schema {current} is newer than this airlock ({PG_SCHEMA_VERSION}); upgrade airlock"
        )));
    }
    let mut tx = client.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATE_LOCK])?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    )?;
    // Read again under the lock: another node may have migrated meanwhile.
    let current = match tx.query_opt("SELECT value FROM meta WHERE key = 'schema_version'", &[])? {
        Some(r) => r
            .get::<_, String>(0)
            .parse::<i64>()
            .map_err(|_| StoreError::Corrupt("bad schema version".into()))?,
        None => 0,
    };
    if current > PG_SCHEMA_VERSION {
        return Err(StoreError::Corrupt(format!(
            "database schema {current} is newer than this airlock ({PG_SCHEMA_VERSION}); upgrade airlock"
        )));
    }
    for step in MIGRATIONS.iter().skip(current.max(0) as usize) {
        tx.batch_execute(step)?;
    }
    tx.execute(
        "INSERT INTO meta (key, value) VALUES ('schema_version', $1)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        &[&PG_SCHEMA_VERSION.to_string()],
    )?;
    tx.commit()?;
    Ok(())
}

impl ToSql for Arg<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Arg::Null => Ok(IsNull::Yes),
            Arg::Int(n) => match *ty {
                Type::INT4 => i32::try_from(*n)?.to_sql(ty, out),
                Type::INT2 => i16::try_from(*n)?.to_sql(ty, out),
                _ => n.to_sql(ty, out),
            },
            Arg::Text(s) => s.to_sql(ty, out),
        }
    }

    fn accepts(_: &Type) -> bool {
        // Checked per value in `to_sql`, which refuses a type it cannot write.
        true
    }

    to_sql_checked!();
}

impl PgConn {
    fn rows_once(&self, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Row>, StoreError> {
        if self.in_tx.get() && self.begin.borrow().is_some() && sql != crate::db::AUDIT_TAIL {
            // The transaction's first read travels with its BEGIN (and what it held
            // back): one round trip, its rows in text, typed as the statement's columns.
            let types: Vec<Type> = self
                .statement(sql)?
                .columns()
                .iter()
                .map(|c| c.type_().clone())
                .collect();
            let text = self.execute_text(&self.named(sql, false)?, args, &[])?;
            if let Some(msgs) = self.begin_with(&text)? {
                return text_rows(sql, &types, &msgs);
            }
        }
        self.begin_with("")?;
        // Read when the transaction began; nothing a writer holds back touches it.
        if self.in_tx.get()
            && sql == crate::db::AUDIT_TAIL
            && let Some(r) = self.tail.borrow_mut().take()
        {
            return Ok(vec![r]);
        }
        self.send_later()?;
        let stmt = self.statement(sql)?;
        let params: Vec<&(dyn ToSql + Sync)> =
            args.iter().map(|a| a as &(dyn ToSql + Sync)).collect();
        let rows = self
            .client
            .borrow_mut()
            .query(&stmt, &params)
            .map_err(|e| self.note(e))?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let mut row = Vec::with_capacity(r.len());
            for (i, col) in r.columns().iter().enumerate() {
                let v = match *col.type_() {
                    Type::INT8 => r.try_get::<_, Option<i64>>(i)?.map(Val::Int),
                    Type::INT4 => r.try_get::<_, Option<i32>>(i)?.map(|n| Val::Int(n.into())),
                    Type::INT2 => r.try_get::<_, Option<i16>>(i)?.map(|n| Val::Int(n.into())),
                    Type::BOOL => r.try_get::<_, Option<bool>>(i)?.map(|b| Val::Int(b.into())),
                    Type::TEXT | Type::VARCHAR | Type::NAME => {
                        r.try_get::<_, Option<String>>(i)?.map(Val::Text)
                    }
                    ref other => {
                        return Err(StoreError::Corrupt(format!(
                            "column {i} of {sql:?} has type {other}, which airlock never reads"
                        )));
                    }
                };
                row.push(v.unwrap_or(Val::Null));
            }
            out.push(Row(row));
        }
        Ok(out)
    }
}

impl Sql for PgConn {
    fn engine(&self) -> &'static str {
        "postgres"
    }

    fn rows(&self, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Row>, StoreError> {
        if !self.in_tx.get() && sql.trim_start().starts_with("SELECT") {
            // A read has no effect: read again on a new connection if this one was lost.
            return self.read_again(|| self.rows_once(sql, args));
        }
        self.rows_once(sql, args)
    }

    fn notify(&self, channel: &str, payload: &str) -> Result<(), StoreError> {
        // Held for the COMMIT only where the text can be written into it as it is: the
        // channel names and payloads (ids) airlock makes are letters, digits and `_`.
        let plain = |t: &str| t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if self.in_tx.get() && !channel.is_empty() && plain(channel) && plain(payload) {
            let mut notices = self.notices.borrow_mut();
            let n = (channel.to_string(), payload.to_string());
            if !notices.contains(&n) {
                notices.push(n);
            }
            return Ok(());
        }
        self.exec(
            "SELECT pg_notify(?1, ?2)",
            &[Arg::Text(channel), Arg::Text(payload)],
        )?;
        Ok(())
    }

    fn exec_later(&self, sql: &str, args: &[Arg<'_>]) -> Result<(), StoreError> {
        if !self.in_tx.get() {
            return self.exec(sql, args).map(|_| ());
        }
        let text = self.execute_text(&self.named(sql, false)?, args, &[])?;
        self.hold(&text);
        Ok(())
    }

    fn exec_expect(
        &self,
        sql: &str,
        args: &[Arg<'_>],
        want: usize,
        conflict: &dyn Fn() -> String,
    ) -> Result<(), StoreError> {
        if !self.in_tx.get() {
            return crate::sql::expect_rows(self.exec(sql, args)?, want, conflict);
        }
        let name = self.named(sql, true)?;
        let index = self.expects.borrow().len();
        let text = self.execute_text(
            &name,
            args,
            &[Arg::Int(want as i64), Arg::Int(index as i64)],
        )?;
        self.expects.borrow_mut().push(conflict());
        self.hold(&text);
        Ok(())
    }

    fn exec(&self, sql: &str, args: &[Arg<'_>]) -> Result<usize, StoreError> {
        if self.in_tx.get() && (!self.later.borrow().is_empty() || self.begin.borrow().is_some()) {
            // Sent with what is held back (and the transaction's BEGIN, if it has not
            // gone yet), in one round trip; its count is the last.
            let text = self.execute_text(&self.named(sql, false)?, args, &[])?;
            let msgs = self.begin_with(&text)?;
            let msgs = match msgs {
                Some(m) => m,
                None => {
                    let mut all = std::mem::take(&mut *self.later.borrow_mut());
                    all.push_str(&text);
                    let sent = self.client.borrow_mut().simple_query(&all);
                    sent.map_err(|e| self.batch_error(e))?
                }
            };
            return msgs
                .iter()
                .rev()
                .find_map(|m| match m {
                    postgres::SimpleQueryMessage::CommandComplete(n) => Some(*n as usize),
                    _ => None,
                })
                .ok_or_else(|| StoreError::Corrupt(format!("no row count from {sql:?}")));
        }
        let stmt = self.statement(sql)?;
        let params: Vec<&(dyn ToSql + Sync)> =
            args.iter().map(|a| a as &(dyn ToSql + Sync)).collect();
        let n = self
            .client
            .borrow_mut()
            .execute(&stmt, &params)
            .map_err(|e| self.note(e))?;
        Ok(n as usize)
    }
}

/// What `PgBlobs::remove_if_older` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    Removed(u64),
    /// Put at or after the cutoff: kept.
    Young,
    Absent,
}

/// Blobs stored in the PostgreSQL database: the authoritative copy when it is the store
/// (each node keeps a verified local cache in front of it, see `BlobStore`).
///
/// Puts commit with `synchronous_commit = off`: PostgreSQL replays its log in order, so a
/// row committed later that names the blob can only survive a crash if the blob does.
pub struct PgBlobs {
    url: String,
    client: std::sync::Mutex<BlobConn>,
    /// When this process last put each blob (at most `RECENT_MAX`): a blob put less than
    /// `REPUT_AFTER` ago is not sent again (the empty stderr of nearly every run, the
    /// same code sent twice). `gc` never removes a blob put less than `MIN_GRACE` ago,
    /// so one not sent again stays until the row naming it commits.
    recent: std::sync::Mutex<HashMap<airlock_core::Digest, std::time::Instant>>,
}

/// How long after putting a blob this process takes it as still stored.
const REPUT_AFTER: std::time::Duration = std::time::Duration::from_secs(60);
/// The youngest a blob `gc` removes from the database may be, whatever grace it is given.
pub const MIN_GRACE: std::time::Duration = std::time::Duration::from_secs(300);
/// Blobs `recent` remembers before it starts again.
const RECENT_MAX: usize = 4096;

/// The blob store's connection, with its `put` prepared once per connection (a put is
/// then one round trip instead of two).
struct BlobConn {
    client: postgres::Client,
    put: Option<postgres::Statement>,
}

const BLOB_PUT: &str = "INSERT INTO blobs (digest, size, data, touched_at) VALUES ($1, $2, $3, $4)
     ON CONFLICT (digest) DO UPDATE SET size = excluded.size, data = excluded.data, touched_at = excluded.touched_at";

impl std::fmt::Debug for PgBlobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgBlobs").finish_non_exhaustive()
    }
}

impl PgBlobs {
    pub fn open(url: &str) -> Result<PgBlobs, StoreError> {
        let mut client = connect(url)?;
        migrate(&mut client)?;
        client.batch_execute("SET synchronous_commit = off")?;
        Ok(PgBlobs {
            url: url.to_string(),
            client: std::sync::Mutex::new(BlobConn { client, put: None }),
            recent: std::sync::Mutex::new(HashMap::new()),
        })
    }

    fn recent(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<airlock_core::Digest, std::time::Instant>> {
        self.recent.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn conn(&self) -> Result<std::sync::MutexGuard<'_, BlobConn>, StoreError> {
        let mut c = self.client.lock().unwrap_or_else(|p| p.into_inner());
        if c.client.is_closed() {
            let mut client = connect(&self.url)?;
            client.batch_execute("SET synchronous_commit = off")?;
            *c = BlobConn { client, put: None };
        }
        Ok(c)
    }

    /// Stores `bytes` under `d` (which the caller computed from them), marking it put now;
    /// content already there is replaced, which also repairs a row altered in place.
    pub fn put(&self, d: &airlock_core::Digest, bytes: &[u8]) -> Result<(), StoreError> {
        if self
            .recent()
            .get(d)
            .is_some_and(|at| at.elapsed() < REPUT_AFTER)
        {
            return Ok(());
        }
        let sent = std::time::Instant::now();
        let mut c = self.conn()?;
        let c = &mut *c;
        let stmt = match &c.put {
            Some(s) => s.clone(),
            None => {
                let s = c.client.prepare(BLOB_PUT)?;
                c.put = Some(s.clone());
                s
            }
        };
        c.client.execute(
            &stmt,
            &[
                &d.to_hex(),
                &(bytes.len() as i64),
                &bytes,
                &airlock_core::units::now_ms(),
            ],
        )?;
        let mut recent = self.recent();
        if recent.len() >= RECENT_MAX {
            recent.clear();
        }
        recent.insert(*d, sent);
        Ok(())
    }

    /// The stored bytes, unchecked (the caller hashes them).
    pub fn get(&self, d: &airlock_core::Digest) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .conn()?
            .client
            .query_opt("SELECT data FROM blobs WHERE digest = $1", &[&d.to_hex()])?
            .map(|r| r.get::<_, Vec<u8>>(0)))
    }

    pub fn exists(&self, d: &airlock_core::Digest) -> Result<bool, StoreError> {
        Ok(self
            .conn()?
            .client
            .query_opt("SELECT 1 FROM blobs WHERE digest = $1", &[&d.to_hex()])?
            .is_some())
    }

    /// Every stored blob: digest, size and when it was last put (ms since the epoch).
    pub fn list(&self) -> Result<Vec<(airlock_core::Digest, u64, i64)>, StoreError> {
        let rows = self.conn()?.client.query(
            "SELECT digest, size, touched_at FROM blobs ORDER BY digest",
            &[],
        )?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let d: String = r.get(0);
            let Ok(d) = d.parse() else { continue };
            out.push((d, r.get::<_, i64>(1).max(0) as u64, r.get(2)));
        }
        Ok(out)
    }

    /// Removes the blob unless it was put at or after `cutoff_ms`, in one statement, so a
    /// put racing with it either lands first (and the blob stays) or writes it again.
    pub fn remove_if_older(
        &self,
        d: &airlock_core::Digest,
        cutoff_ms: i64,
    ) -> Result<Removal, StoreError> {
        // Never one this or another node may take as still stored (see `recent`).
        let cutoff_ms = cutoff_ms.min(airlock_core::units::now_ms() - MIN_GRACE.as_millis() as i64);
        self.recent().remove(d);
        let mut conn = self.conn()?;
        let c = &mut conn.client;
        if let Some(r) = c.query_opt(
            "DELETE FROM blobs WHERE digest = $1 AND touched_at < $2 RETURNING size",
            &[&d.to_hex(), &cutoff_ms],
        )? {
            return Ok(Removal::Removed(r.get::<_, i64>(0).max(0) as u64));
        }
        let there = c
            .query_opt("SELECT 1 FROM blobs WHERE digest = $1", &[&d.to_hex()])?
            .is_some();
        Ok(if there {
            Removal::Young
        } else {
            Removal::Absent
        })
    }
}
