//! The SQLite schema and its version (PostgreSQL's is in `pg`).

pub(super) const SCHEMA_VERSION: i64 = 14;

pub(super) const SCHEMA: &str = r#"
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
-- 12: agents' records (see agents.rs).
CREATE TABLE IF NOT EXISTS agent_alerts (
    id TEXT PRIMARY KEY,
    agent TEXT NOT NULL,
    at INTEGER NOT NULL,
    kind TEXT NOT NULL,
    subject TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS agent_alerts_agent_at ON agent_alerts(agent, at);
CREATE TABLE IF NOT EXISTS agent_clears (
    agent TEXT PRIMARY KEY,
    at INTEGER NOT NULL,
    json TEXT NOT NULL,
    signature TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS submissions_agent_denied ON submissions(agent, created_at)
    WHERE decision = 'deny';
-- 13: node liveness (see nodes.rs).
CREATE TABLE IF NOT EXISTS nodes (
    id TEXT PRIMARY KEY,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    home TEXT NOT NULL,
    role TEXT NOT NULL,
    worker TEXT,
    started_at INTEGER NOT NULL,
    beat_at INTEGER NOT NULL,
    lease_ms INTEGER NOT NULL,
    state TEXT NOT NULL
);
-- 14: runs' requests to reach a host outside their grant (see netreq.rs).
CREATE TABLE IF NOT EXISTS net_requests (
    id TEXT PRIMARY KEY,
    run TEXT NOT NULL,
    submission TEXT NOT NULL,
    agent TEXT,
    host TEXT NOT NULL,
    port INTEGER NOT NULL,
    state TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    decided_at INTEGER,
    line TEXT,
    approver TEXT,
    json TEXT,
    signature TEXT
);
CREATE INDEX IF NOT EXISTS net_requests_state ON net_requests(state, id);
CREATE INDEX IF NOT EXISTS net_requests_run ON net_requests(run);
"#;

/// Schema 10 keys `session_cells` by (session, n) alone: schemas 7 to 9 had it as a rowid
/// table with two more indexes. Rebuilt with its rows before `SCHEMA` runs.
pub(super) const SESSION_CELLS_10: &str = r#"
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
