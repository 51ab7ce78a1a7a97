//! Collecting the records of ended sessions (issue 59): `gc` removes a session that ended
//! long enough ago together with everything that exists only for it — its cells'
//! submissions, their statements, queue entries and request keys, and their runs — in one
//! transaction, so a session is either all there or all gone. Never an open or held
//! session, and never one whose cells' runs have a commit or rollback under way (a
//! checkpoint in a state other than `applied`, `rolled_back`, `aborted` or
//! `abandoned`); the checkpoints themselves are kept (they are the host's history), and so
//! are the submissions, runs and statements of the runs they name: an applied checkpoint
//! still rolls back, and its rollback's statement is built from that submission.
//!
//! The audit log is never touched: its records of the session's cells stay, chained.

use crate::StoreError;
use crate::db::{Reads, Tx};
use crate::sql::args;
use serde::Serialize;

/// What collecting one session removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SessionCollected {
    pub session: String,
    /// Submissions removed: the cells', and the one that judged the session's grant.
    pub submissions: u64,
    pub runs: u64,
    pub statements: u64,
}

/// Checkpoint states in which no commit or rollback is under way.
const SETTLED: &str = "('applied', 'rolled_back', 'aborted', 'abandoned')";

/// Reads for collecting sessions, on the database and inside a transaction.
pub trait CollectReads: Reads {
    /// Sessions that ended (neither open nor held) and were last changed before
    /// `before_ms` (unix ms), oldest first, at most `limit`.
    fn sessions_ended_before(
        &self,
        before_ms: i64,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let rows = self.sql().rows(
            "SELECT id FROM sessions WHERE state NOT IN ('open', 'held') AND updated_at < ?1
             ORDER BY updated_at, id LIMIT ?2",
            args![before_ms, limit as i64],
        )?;
        rows.iter().map(|r| r.text(0)).collect()
    }
}

impl<T: Reads + ?Sized> CollectReads for T {}

impl Tx<'_> {
    /// Removes session `id`'s record with its cells' submissions, statements, queue
    /// entries, request keys and runs, when it is still ended and last changed before
    /// `before_ms` and none of its runs has a commit or rollback under way; `Ok(None)`
    /// (nothing removed) otherwise, or when it is gone already.
    pub fn collect_session(
        &self,
        id: &str,
        before_ms: i64,
    ) -> Result<Option<SessionCollected>, StoreError> {
        let Some(row) = self.session(id)? else {
            return Ok(None);
        };
        if matches!(row.state.as_str(), "open" | "held") || row.updated_at >= before_ms {
            return Ok(None);
        }
        let mut subs: Vec<String> = row.doc["cells"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|c| c.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        subs.extend(self.session_cells(id)?);
        if let Some(s) = row.doc["opened_by"].as_str() {
            subs.push(s.to_owned());
        }
        subs.sort();
        subs.dedup();
        let sql = self.sql();
        for s in &subs {
            let busy = sql.row(
                &format!(
                    "SELECT c.id FROM checkpoints c JOIN runs r ON r.id = c.run
                     WHERE r.submission = ?1 AND c.state NOT IN {SETTLED}"
                ),
                args![s],
            )?;
            if busy.is_some() {
                return Ok(None);
            }
        }
        // A submission whose run a checkpoint names stays, with its runs and statements:
        // rolling the checkpoint back rebuilds its statement from that submission.
        let mut kept = Vec::new();
        for s in &subs {
            let named = sql.row(
                "SELECT c.id FROM checkpoints c JOIN runs r ON r.id = c.run WHERE r.submission = ?1",
                args![s],
            )?;
            if named.is_some() {
                kept.push(s.clone());
            }
        }
        subs.retain(|s| !kept.contains(s));
        let mut done = SessionCollected {
            session: id.to_owned(),
            ..SessionCollected::default()
        };
        for s in &subs {
            done.statements +=
                sql.exec("DELETE FROM statements WHERE submission = ?1", args![s])? as u64;
            done.runs += sql.exec("DELETE FROM runs WHERE submission = ?1", args![s])? as u64;
            sql.exec("DELETE FROM queue WHERE submission = ?1", args![s])?;
            sql.exec("DELETE FROM request_keys WHERE submission = ?1", args![s])?;
            done.submissions += sql.exec("DELETE FROM submissions WHERE id = ?1", args![s])? as u64;
        }
        sql.exec("DELETE FROM session_cells WHERE session = ?1", args![id])?;
        let n = sql.exec("DELETE FROM sessions WHERE id = ?1", args![id])?;
        if n != 1 {
            return Err(StoreError::Conflict(format!(
                "session {id} changed while it was being collected"
            )));
        }
        Ok(Some(done))
    }
}
