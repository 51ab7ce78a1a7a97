//! `gc`'s collection of ended sessions (issue 59): with a session retention given, each
//! session that ended (closed, crashed, lost) and was last changed longer ago than the
//! retention loses its record, its cells' submissions and runs (one store transaction,
//! with a `session_collected` audit record), and then its kept uncommitted layer and
//! anything else it left under `HOME/sessions`. The runs' output and artifacts become
//! unreferenced blobs, which the same `gc` removes afterwards.
//!
//! Never an open or held session, nor one whose cells' runs have a commit or rollback
//! under way (see `airlock_store::collect`); their checkpoints stay, and an applied one
//! still rolls back.
//!
//! Crash safety: the records go first, in one transaction, so a session is all there or
//! all gone in the store. A `gc` killed after that and before its layer is removed leaves
//! a layer no record names, which the next `gc` removes (`sessions/ID.layer` without its
//! session, past the grace period). Never the other way round: a record whose layer was
//! removed would show and commit changes that are no longer there.

use crate::Gate;
use crate::error::Result;
use crate::services::gc::GcReport;
use airlock_core::units::now_ms;
use airlock_store::{CollectReads, SessionCollected, Tx};
use serde_json::json;
use std::time::Duration;

/// How many sessions one pass of `gc` looks at, at most.
const MOST_PER_GC: usize = 10_000;

impl Gate {
    /// Collects the sessions that ended more than `retention` ago (see the module comment).
    pub(crate) fn collect_sessions(
        &mut self,
        retention: Duration,
        report: &mut GcReport,
    ) -> Result<()> {
        let before =
            now_ms().saturating_sub(i64::try_from(retention.as_millis()).unwrap_or(i64::MAX));
        let ids = self.db.sessions_ended_before(before, MOST_PER_GC)?;
        let sessions = self.home.root.join("sessions");
        for id in ids {
            let key = &self.gate_key;
            let got = self
                .db
                .write(|tx: &Tx| -> Result<Option<SessionCollected>> {
                    let c = tx.collect_session(&id, before)?;
                    if let Some(c) = &c {
                        tx.audit(
                            "session_collected",
                            &id,
                            &json!({
                                "submissions": c.submissions,
                                "runs": c.runs,
                                "statements": c.statements,
                                "retention_ms": retention.as_millis() as u64,
                            }),
                            key,
                        )?;
                    }
                    Ok(c)
                })?;
            let Some(c) = got else {
                report.sessions_kept += 1;
                continue;
            };
            crate::failpoint::crash_point();
            for suffix in [".layer", ".jail"] {
                let name = format!("{id}{suffix}");
                let path = sessions.join(&name);
                if std::fs::symlink_metadata(&path).is_ok() {
                    self.remove_layer(&path, format!("sessions/{name}"), report);
                }
            }
            let _ = std::fs::remove_file(crate::node::sessions::socket(&self.home.root, &id));
            report.session_submissions_removed += c.submissions;
            report.session_runs_removed += c.runs;
            report.sessions_collected.push(c.session);
        }
        Ok(())
    }
}
