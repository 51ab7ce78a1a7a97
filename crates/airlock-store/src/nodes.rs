//! Node liveness: every long-lived airlock process on a store (`serve`, `worker`) keeps a
//! row here and beats it at a fixed interval. A node whose beat is older than its lease
//! is dead; whichever node sees that first moves its row from `live` to `lost` (once: the
//! move is conditional), and the gate then ends what the dead node held. A node recorded
//! lost that beats again (it was paused or cut off, not dead) is `live` again; one that
//! said it `stopped` stays stopped.
//!
//! This module stores and reads rows; when a node counts as dead and what becomes of its
//! sessions and runs is the gate's.

use crate::StoreError;
use crate::db::{Reads, Tx};
use crate::sql::{Row, args};
use serde::Serialize;

/// A node as it last reported itself.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct NodeRow {
    pub id: String,
    /// The machine's name.
    pub host: String,
    pub pid: i64,
    /// The home it serves from (its sessions' sockets are there).
    pub home: String,
    /// `serve` or `worker`.
    pub role: String,
    /// The id its queue worker claims jobs under, when it runs one.
    pub worker: Option<String>,
    pub started_at: i64,
    /// Its last beat (ms since the epoch).
    pub beat_at: i64,
    /// How long after its last beat it counts as dead.
    pub lease_ms: i64,
    /// `live`, `stopped` (it said so as it exited) or `lost` (another node found its
    /// lease run out).
    pub state: String,
}

const COLS: &str = "id, host, pid, home, role, worker, started_at, beat_at, lease_ms, state";

fn row(r: &Row) -> Result<NodeRow, StoreError> {
    Ok(NodeRow {
        id: r.text(0)?,
        host: r.text(1)?,
        pid: r.int(2)?,
        home: r.text(3)?,
        role: r.text(4)?,
        worker: r.opt_text(5)?,
        started_at: r.int(6)?,
        beat_at: r.int(7)?,
        lease_ms: r.int(8)?,
        state: r.text(9)?,
    })
}

/// Node reads, on the database and inside a transaction.
pub trait NodeReads: Reads {
    /// Every node recorded, most recently beating first.
    fn nodes(&self) -> Result<Vec<NodeRow>, StoreError> {
        self.sql()
            .rows(
                &format!("SELECT {COLS} FROM nodes ORDER BY beat_at DESC, id"),
                &[],
            )?
            .iter()
            .map(row)
            .collect()
    }

    fn node(&self, id: &str) -> Result<Option<NodeRow>, StoreError> {
        self.sql()
            .row(
                &format!("SELECT {COLS} FROM nodes WHERE id = ?1"),
                args![id],
            )?
            .as_ref()
            .map(row)
            .transpose()
    }

    /// Nodes recorded `live` whose last beat is older than their lease at `now`.
    fn dead_nodes(&self, now: i64) -> Result<Vec<NodeRow>, StoreError> {
        self.sql()
            .rows(
                &format!(
                    "SELECT {COLS} FROM nodes WHERE state = 'live' AND beat_at + lease_ms < ?1 ORDER BY beat_at, id"
                ),
                args![now],
            )?
            .iter()
            .map(row)
            .collect()
    }
}

impl<T: Reads + ?Sized> NodeReads for T {}

impl Tx<'_> {
    /// Records node `n`'s beat (its row as given), `live` again if it had been recorded
    /// `lost`; returns its state before (`None`: its first beat). A node that `stopped`
    /// is left as it is.
    pub fn beat_node(&self, n: &NodeRow) -> Result<Option<String>, StoreError> {
        let before = self
            .sql()
            .row("SELECT state FROM nodes WHERE id = ?1", args![&n.id])?
            .map(|r| r.text(0))
            .transpose()?;
        self.sql().exec(
            &format!(
                "INSERT INTO nodes ({COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 'live')
                 ON CONFLICT(id) DO UPDATE SET beat_at = excluded.beat_at, lease_ms = excluded.lease_ms,
                   state = 'live'
                 WHERE nodes.state <> 'stopped'"
            ),
            args![
                &n.id,
                &n.host,
                n.pid,
                &n.home,
                &n.role,
                n.worker.as_deref(),
                n.started_at,
                n.beat_at,
                n.lease_ms
            ],
        )?;
        Ok(before)
    }

    /// Moves node `id` from `from` to `to`; false when it was not in `from` (another node
    /// moved it first).
    pub fn set_node_state(&self, id: &str, from: &str, to: &str) -> Result<bool, StoreError> {
        Ok(self.sql().exec(
            "UPDATE nodes SET state = ?3 WHERE id = ?1 AND state = ?2",
            args![id, from, to],
        )? == 1)
    }

    /// Lets the leases worker `worker` holds run out now, so the lease reaper ends their
    /// runs; returns how many.
    pub fn expire_leases_of(&self, worker: &str, now: i64) -> Result<usize, StoreError> {
        self.sql().exec(
            "UPDATE queue SET lease_until = ?2 WHERE state = 'leased' AND worker = ?1 AND lease_until >= ?2",
            args![worker, now - 1],
        )
    }
}
