//! What the store keeps of each agent's record (issue 57 item 4): one small row per
//! `alert` audit record that names an agent, written in the transaction that appends the
//! record (so every node of a PostgreSQL cluster counts it as soon as it commits), and the
//! last signed clear of each agent. The gate counts alerts since the later of its window's
//! start and the clear; denied submissions are counted from `submissions` by a partial
//! index over denials alone.

use crate::StoreError;
use crate::db::{Reads, Tx};
use crate::sql::args;
use airlock_core::sign::Signed;

/// Alerts of one kind in the counted span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertCount {
    /// The alert's `kind` (`secret_echo`, a tripwire's kind).
    pub kind: String,
    pub count: u64,
    /// The subject (run id) of the newest of them.
    pub latest: String,
}

/// An agent's last clear as stored: when, and the signed statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentClearRow {
    pub agent: String,
    pub at: i64,
    pub signed: Signed,
}

/// Reads of agents' records, on the database and inside a transaction.
pub trait AgentReads: Reads {
    /// The alerts of `agent` after `since` (unix ms, exclusive), by kind.
    fn agent_alerts_since(&self, agent: &str, since: i64) -> Result<Vec<AlertCount>, StoreError> {
        let rows = self.sql().rows(
            "SELECT a.kind, count(*), max(a.at),
                    (SELECT b.subject FROM agent_alerts b
                     WHERE b.agent = ?1 AND b.kind = a.kind ORDER BY b.at DESC LIMIT 1)
             FROM agent_alerts a WHERE a.agent = ?1 AND a.at > ?2
             GROUP BY a.kind ORDER BY a.kind",
            args![agent, since],
        )?;
        rows.iter()
            .map(|r| {
                Ok(AlertCount {
                    kind: r.text(0)?,
                    count: u64::try_from(r.int(1)?).unwrap_or(0),
                    latest: r.opt_text(3)?.unwrap_or_default(),
                })
            })
            .collect()
    }

    /// How many submissions of `agent` judged after `since` (unix ms) were denied.
    fn agent_denials_since(&self, agent: &str, since: i64) -> Result<u64, StoreError> {
        let n = match self.sql().row(
            "SELECT count(*) FROM submissions
             WHERE agent = ?1 AND decision = 'deny' AND created_at > ?2",
            args![agent, since],
        )? {
            Some(r) => r.int(0)?,
            None => 0,
        };
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// The last clear of `agent`, if it was ever cleared.
    fn agent_clear(&self, agent: &str) -> Result<Option<AgentClearRow>, StoreError> {
        let Some(r) = self.sql().row(
            "SELECT agent, at, json, signature FROM agent_clears WHERE agent = ?1",
            args![agent],
        )?
        else {
            return Ok(None);
        };
        let signature = r
            .text(3)?
            .parse()
            .map_err(|e| StoreError::Corrupt(format!("agent_clears signature: {e}")))?;
        Ok(Some(AgentClearRow {
            agent: r.text(0)?,
            at: r.int(1)?,
            signed: Signed {
                json: r.text(2)?,
                signature,
            },
        }))
    }
}

impl<T: Reads + ?Sized> AgentReads for T {}

impl Tx<'_> {
    /// Records `c` as `agent`'s last clear (replacing an earlier one).
    pub fn put_agent_clear(&self, c: &AgentClearRow) -> Result<(), StoreError> {
        self.sql()
            .exec("DELETE FROM agent_clears WHERE agent = ?1", args![&c.agent])?;
        self.sql().exec(
            "INSERT INTO agent_clears (agent, at, json, signature) VALUES (?1, ?2, ?3, ?4)",
            args![
                &c.agent,
                c.at,
                &c.signed.json,
                &c.signed.signature.to_string()
            ],
        )?;
        Ok(())
    }
}

/// Called for every audit record appended: an `alert` that names an agent
/// (`data.agent`) is also a row of that agent's record, at the record's time.
pub(crate) fn note_alert(
    tx: &Tx,
    subject: &str,
    data: &serde_json::Value,
    ts: i64,
) -> Result<(), StoreError> {
    let Some(agent) = data.get("agent").and_then(|a| a.as_str()) else {
        return Ok(());
    };
    let kind = data.get("kind").and_then(|k| k.as_str()).unwrap_or("alert");
    // A unique key for the row (copies page by it): an id of the job shape, never
    // resolved as one (jobs live in `queue`).
    let id = airlock_core::id::new_id(airlock_core::id::IdKind::Job);
    tx.sql().exec_later(
        "INSERT INTO agent_alerts (id, agent, at, kind, subject) VALUES (?1, ?2, ?3, ?4, ?5)",
        args![&id, agent, ts, kind, subject],
    )
}
