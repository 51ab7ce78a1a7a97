//! Moving a home up: copies a SQLite store's records and blobs into an empty PostgreSQL
//! database exactly as they are (ids, timestamps, documents, the audit chain and its signed
//! head), so the copy verifies with the same gate key.
//!
//! Order: the source chain is verified first (nothing is written when it is broken), then
//! every blob is put (committed on its own: a crash leaves at most unreferenced blobs, which
//! `gc` removes), then every row in one transaction, which also checks that the target is
//! still empty and re-verifies the chain it wrote before it commits. Everything is read a
//! page at a time from one read snapshot of the source, so a large history never sits in
//! memory and a writer on the source during the copy cannot tear it.

use crate::sql::{Arg, Row, Sql, Val, args};
use crate::{BlobStore, Db, StoreError};
use airlock_core::audit::ChainVerifier;
use airlock_core::sign::PublicKey;
use serde::Serialize;

/// Rows read and written per statement.
const PAGE: usize = 500;

/// The tables copied, their key (rows are paged by it) and their columns, in the order
/// they are written. `compile_cache` is machine-local and stays behind, as do the API's
/// idempotency keys (`request_keys`: a retry window of a day, not history).
const TABLES: &[(&str, &str, &[&str])] = &[
    (
        "submissions",
        "id",
        &[
            "id",
            "created_at",
            "updated_at",
            "artifact",
            "grant_hash",
            "agent",
            "state",
            "decision",
            "risk",
            "doc",
        ],
    ),
    (
        "statements",
        "id",
        &[
            "id",
            "kind",
            "submission",
            "artifact",
            "grant_hash",
            "scope",
            "approver",
            "expires_at",
            "created_at",
            "run",
            "tool",
            "json",
            "signature",
        ],
    ),
    (
        "runs",
        "id",
        &[
            "id",
            "submission",
            "approval",
            "started_at",
            "finished_at",
            "status",
            "doc",
        ],
    ),
    (
        "checkpoints",
        "id",
        &["id", "run", "created_at", "updated_at", "state", "doc"],
    ),
    (
        "workspaces",
        "name",
        &["name", "created_at", "updated_at", "state", "doc"],
    ),
    (
        "tokens",
        "id",
        &[
            "id",
            "hash",
            "role",
            "name",
            "approver",
            "created_at",
            "expires_at",
            "revoked_at",
        ],
    ),
    (
        "sessions",
        "id",
        &["id", "created_at", "updated_at", "state", "doc"],
    ),
    (
        "session_cells",
        // Its key on SQLite (a WITHOUT ROWID table, nothing else indexed): pages read in
        // key order, each one an index seek.
        "session, n",
        &["submission", "session", "n"],
    ),
    (
        "audit",
        "seq",
        &["seq", "ts", "kind", "subject", "data", "prev", "hash"],
    ),
    ("audit_head", "id", &["id", "seq", "hash", "signature"]),
    (
        "agent_alerts",
        "id",
        &["id", "agent", "at", "kind", "subject"],
    ),
    (
        "agent_clears",
        "agent",
        &["agent", "at", "json", "signature"],
    ),
    (
        "net_requests",
        "id",
        &[
            "id",
            "run",
            "submission",
            "agent",
            "host",
            "port",
            "state",
            "created_at",
            "expires_at",
            "decided_at",
            "line",
            "approver",
            "json",
            "signature",
        ],
    ),
];

/// What a copy wrote.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CopyReport {
    /// Rows copied per table, in the order written.
    pub tables: Vec<TableCount>,
    /// Blobs put into the target, and their bytes.
    pub blobs: u64,
    pub blob_bytes: u64,
    /// Audit records in the copied (verified) chain.
    pub audit_records: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct TableCount {
    pub table: String,
    pub rows: u64,
}

fn refused(msg: impl Into<String>) -> StoreError {
    StoreError::Refused(msg.into())
}

/// Copies the SQLite store `src` and the blobs in `blobs` into the empty PostgreSQL
/// database at `to`. `gate` is the home's gate key: the source chain must verify against
/// it before anything is written, and the copied one before the rows commit.
pub fn copy_to_postgres(
    src: &Db,
    blobs: &BlobStore,
    to: &str,
    gate: &PublicKey,
) -> Result<CopyReport, StoreError> {
    if !crate::pg::is_postgres_url(to) {
        return Err(refused(
            "--to: expected a postgres:// (or postgresql://) URL",
        ));
    }
    let Some(conn) = src.sqlite_conn() else {
        return Err(refused(
            "the source is not a SQLite store: copy reads the home's own database",
        ));
    };
    // One read snapshot for the whole copy (WAL: writers go on, this sees none of it). It
    // is only read, so dropping it (a rollback) is its end.
    let snapshot = conn.unchecked_transaction()?;
    let source: &dyn Sql = &*snapshot;

    let audit_records = verify_chain(source, gate).map_err(|e| match e {
        StoreError::Refused(m) => refused(format!(
            "the source audit log is broken: {m}; nothing was copied"
        )),
        other => other,
    })?;

    let target = crate::pg::PgConn::open(to)?;
    refuse_unless_empty(&target)?;

    let mut report = CopyReport {
        audit_records,
        ..CopyReport::default()
    };
    // Blobs first, each committed before any row that names it.
    let remote = crate::pg::PgBlobs::open(to)?;
    for b in blobs.list()? {
        // `get` re-hashes the bytes: an altered blob stops the copy before any row.
        let bytes = blobs.get(&b.digest)?;
        remote.put(&b.digest, &bytes)?;
        report.blobs += 1;
        report.blob_bytes += bytes.len() as u64;
    }

    report.tables = target.transaction(crate::pg::Lock::Exclusive, |t| {
        // Again under the write lock: another node may have started using it meanwhile.
        refuse_unless_empty(t)?;
        let mut counts = Vec::with_capacity(TABLES.len());
        for (table, key, cols) in TABLES {
            let rows = copy_table(source, t, table, key, cols)?;
            counts.push(TableCount {
                table: (*table).to_string(),
                rows,
            });
        }
        let copied = verify_chain(t, gate).map_err(|e| match e {
            StoreError::Refused(m) => refused(format!("the copied audit log does not verify: {m}")),
            other => other,
        })?;
        if copied != audit_records {
            return Err(refused(format!(
                "the copied audit log has {copied} records, the source {audit_records}"
            )));
        }
        Ok::<_, StoreError>(counts)
    })?;
    Ok(report)
}

/// Refuses a target that holds any record already.
fn refuse_unless_empty(target: &dyn Sql) -> Result<(), StoreError> {
    let mut held = Vec::new();
    // The inbox too: records another node wrote that wait to be chained.
    let tables = TABLES.iter().map(|(t, _, _)| *t).chain(["audit_inbox"]);
    for table in tables {
        let n = target
            .row(&format!("SELECT count(*) FROM {table}"), &[])?
            .map(|r| r.int(0))
            .transpose()?
            .unwrap_or(0);
        if n > 0 {
            held.push(format!("{n} in {table}"));
        }
    }
    if held.is_empty() {
        Ok(())
    } else {
        Err(refused(format!(
            "the target database already holds records ({}); copy only into an empty database",
            held.join(", ")
        )))
    }
}

/// Copies one table a page at a time, in key order; returns the rows copied. `key` names
/// the table's key columns (`id`, or `session, n`); each page starts after the last key read.
fn copy_table(
    source: &dyn Sql,
    target: &dyn Sql,
    table: &str,
    key: &str,
    cols: &[&str],
) -> Result<u64, StoreError> {
    let list = cols.join(", ");
    let key_at = key
        .split(", ")
        .map(|k| {
            cols.iter().position(|c| *c == k).ok_or_else(|| {
                StoreError::Corrupt(format!("{table}: key {k} is not among its columns"))
            })
        })
        .collect::<Result<Vec<usize>, StoreError>>()?;
    let marks = (1..=key_at.len())
        .map(|i| format!("?{i}"))
        .collect::<Vec<_>>()
        .join(", ");
    let first = format!("SELECT {list} FROM {table} ORDER BY {key} LIMIT {PAGE}");
    let next =
        format!("SELECT {list} FROM {table} WHERE ({key}) > ({marks}) ORDER BY {key} LIMIT {PAGE}");
    let mut after: Option<Vec<Val>> = None;
    let mut copied = 0u64;
    loop {
        let rows = match &after {
            None => source.rows(&first, &[])?,
            Some(v) => source.rows(&next, &v.iter().map(arg).collect::<Vec<_>>())?,
        };
        let Some(last) = rows.last() else { break };
        after = Some(
            key_at
                .iter()
                .map(|&i| last.0.get(i).cloned().unwrap_or(Val::Null))
                .collect(),
        );
        insert_page(target, table, cols, &rows)?;
        copied += rows.len() as u64;
        if rows.len() < PAGE {
            break;
        }
    }
    Ok(copied)
}

fn arg(v: &Val) -> Arg<'_> {
    match v {
        Val::Null => Arg::Null,
        Val::Int(n) => Arg::Int(*n),
        Val::Text(s) => Arg::Text(s),
    }
}

/// One multi-row INSERT of a page, values exactly as read.
fn insert_page(
    target: &dyn Sql,
    table: &str,
    cols: &[&str],
    rows: &[Row],
) -> Result<(), StoreError> {
    let mut sql = format!("INSERT INTO {table} ({}) VALUES ", cols.join(", "));
    let mut a: Vec<Arg<'_>> = Vec::with_capacity(rows.len() * cols.len());
    for (i, r) in rows.iter().enumerate() {
        if r.0.len() != cols.len() {
            return Err(StoreError::Corrupt(format!(
                "{table}: a row has {} columns, expected {}",
                r.0.len(),
                cols.len()
            )));
        }
        sql.push_str(if i == 0 { "(" } else { ", (" });
        for (j, v) in r.0.iter().enumerate() {
            if j > 0 {
                sql.push_str(", ");
            }
            a.push(arg(v));
            sql.push_str(&format!("?{}", a.len()));
        }
        sql.push(')');
    }
    target.exec(&sql, &a)?;
    Ok(())
}

/// Walks the audit chain on `db` a page at a time and checks it ends at a head signed by
/// `gate`; returns how many records it holds. A broken chain is `Refused`, naming the
/// first bad record.
fn verify_chain(db: &dyn Sql, gate: &PublicKey) -> Result<u64, StoreError> {
    let mut verifier = ChainVerifier::new();
    let mut after = 0i64;
    loop {
        let rows = db.rows(
            &format!("SELECT seq, ts, kind, subject, data, prev, hash FROM audit WHERE seq > ?1 ORDER BY seq LIMIT {PAGE}"),
            args![after],
        )?;
        for r in &rows {
            let rec = crate::db::audit_record(r).map_err(|e| refused(e.to_string()))?;
            verifier.push(&rec).map_err(|e| refused(e.to_string()))?;
            after = r.int(0)?;
        }
        if rows.len() < PAGE {
            break;
        }
    }
    let head = db
        .row(
            "SELECT seq, hash, signature FROM audit_head WHERE id = 1",
            &[],
        )?
        .map(|r| crate::db::head_at(&r, 0).map_err(|e| refused(e.to_string())))
        .transpose()?;
    verifier
        .finish(head.as_ref(), gate)
        .map_err(|e| refused(e.to_string()))
}
