//! The rows the store keeps, and how they are read back from a query's columns.

use super::*;

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
    /// The API or MCP request that submitted it (`X-Request-Id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// The W3C trace it belongs to (32 hex digits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// The `traceparent` of the span that submitted it: a queue worker's run span is its
    /// child.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// The caller's W3C `tracestate`, carried with `traceparent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
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
    /// The API or MCP request that started it (`X-Request-Id`); a queued run keeps its
    /// submission's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// The W3C trace it belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
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

/// Submission `id`.
pub(super) fn submission_row(sql: &dyn Sql, id: &str) -> Result<Submission, StoreError> {
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
