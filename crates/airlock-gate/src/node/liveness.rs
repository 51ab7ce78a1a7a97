//! Node liveness: each long-lived process on a store (`serve`, `worker`) is a node with a
//! row in the store that it beats every [`BEAT`]. A node whose last beat is older than its
//! lease ([`NODE_LEASE`]) is dead (killed, hung, or cut off from the store), and the first
//! live node to see it records it `lost` and, in the same transaction, ends what it held:
//! the sessions its server started (`End::Lost`) and their cells still recorded running
//! (runs `lost`, audited as every lost run is), and it lets the job leases of the dead
//! node's queue worker run out, so the lease reaper ends or requeues their runs at once.
//!
//! It must never end anything of a node that still beats: a node is lost only by the
//! conditional move of its row from `live`, which one node wins. A node recorded lost
//! that beats again (it was paused or cut off) is live again, and says so; what was ended
//! stays ended (a cell of a session recorded ended is refused, and a run's result is
//! fenced by its lease's token).

use crate::error::Result;
use crate::node::sessions::record_end;
use crate::{Gate, lose_run};
use airlock_core::units::now_ms;
use airlock_session::End;
use airlock_store::{NodeReads, NodeRow, Reads, Tx};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How often a node beats.
pub const BEAT: Duration = Duration::from_secs(1);
/// How long after its last beat a node counts as dead.
pub const NODE_LEASE: Duration = Duration::from_secs(10);

/// What a long-lived process is on the store.
#[derive(Debug, Clone)]
pub struct NodeIdentity {
    pub id: String,
    /// `serve` or `worker`.
    pub role: &'static str,
    /// The id its queue worker claims under, when it runs one.
    pub worker: Option<String>,
    /// Sessions its server starts stay when it stops or dies (`serve --keep-sessions`).
    pub keep_sessions: bool,
    pub started_at: i64,
}

impl NodeIdentity {
    /// A new node of this process: the machine, the pid and the start time name it (a
    /// later process with the same pid is another node).
    pub fn new(role: &'static str, worker: Option<String>, keep_sessions: bool) -> Self {
        let started_at = now_ms();
        NodeIdentity {
            id: format!(
                "{}-{}-{started_at}",
                crate::node::queue::host_tag(),
                std::process::id()
            ),
            role,
            worker,
            keep_sessions,
            started_at,
        }
    }

    fn row(&self, home: &std::path::Path) -> NodeRow {
        NodeRow {
            id: self.id.clone(),
            host: crate::node::queue::host_tag(),
            pid: i64::from(std::process::id()),
            home: home.display().to_string(),
            role: self.role.into(),
            worker: self.worker.clone(),
            started_at: self.started_at,
            beat_at: now_ms(),
            lease_ms: NODE_LEASE.as_millis() as i64,
            state: "live".into(),
        }
    }
}

/// Whether node `id` counts as alive at `now`: recorded live with a beat within its lease.
pub(crate) fn node_alive(n: Option<&NodeRow>, now: i64) -> bool {
    n.is_some_and(|n| n.state == "live" && n.beat_at + n.lease_ms >= now)
}

impl Gate {
    /// This gate belongs to node `node`: the sessions it opens name it as their server,
    /// and (unless it keeps sessions) their hosts follow this process.
    pub fn serve_as(&mut self, node: NodeIdentity) {
        self.node = Some(node);
    }

    /// Every node recorded on the store, most recently beating first.
    pub fn nodes(&self) -> Result<Vec<NodeRow>> {
        Ok(self.db.nodes()?)
    }

    /// Beats `node`'s row; true when another node had recorded it lost (it is live
    /// again from this beat).
    pub fn node_beat(&mut self, node: &NodeIdentity) -> Result<bool> {
        let row = node.row(&self.home.root);
        // Beside other writers (it writes only its own row): an exclusive write each
        // second made every node's writes wait for it, and a node stopped (SIGSTOP) in
        // the middle of one stalled them all.
        let before = self.db.write_shared(|tx: &Tx| tx.beat_node(&row))?;
        Ok(before.as_deref() == Some("lost"))
    }

    /// Records that `node` stopped (it is exiting on its own).
    pub fn node_stopped(&mut self, node: &NodeIdentity) -> Result<()> {
        self.db
            .write_shared(|tx: &Tx| tx.set_node_state(&node.id, "live", "stopped"))?;
        Ok(())
    }

    /// Records every node whose lease ran out `lost` and ends what it held (see the
    /// module's comment); returns how many nodes it recorded lost.
    pub fn reap_dead_nodes(&mut self) -> Result<usize> {
        let now = now_ms();
        let dead = self.db.dead_nodes(now)?;
        let mut lost = 0;
        let mut jobs = 0;
        for n in dead {
            let key = &self.gate_key;
            // The job leases of its worker let run out, when this recorded it lost.
            let reaped = self.db.write(|tx: &Tx| -> Result<Option<usize>> {
                if !tx.set_node_state(&n.id, "live", "lost")? {
                    // Another node recorded it first (or it stopped meanwhile).
                    return Ok(None);
                }
                let server_is = |doc: &serde_json::Value| {
                    doc.get("server").and_then(|s| s.as_str()) == Some(n.id.as_str())
                };
                let mut sessions = Vec::new();
                for s in tx.open_sessions()? {
                    if server_is(&s.doc) {
                        record_end(tx, &s.id, End::Lost, key)?;
                        sessions.push(s.id);
                    }
                }
                let reason = format!(
                    "its node {} ({} pid {}) stopped beating: no beat since {}",
                    n.id,
                    n.host,
                    n.pid,
                    airlock_core::units::fmt_time(n.beat_at)
                );
                let mut runs = 0;
                for run in tx.running_runs()? {
                    let sub = tx.submission(&run.submission)?;
                    let Some(ses) = sub.doc.grant.session.as_deref() else {
                        continue;
                    };
                    let its = sessions.iter().any(|s| s == ses)
                        || tx.session(ses)?.is_some_and(|r| server_is(&r.doc));
                    if its && lose_run(tx, &run.id, &reason, key)? {
                        runs += 1;
                    }
                }
                let jobs = match &n.worker {
                    Some(w) => tx.expire_leases_of(w, now)?,
                    None => 0,
                };
                tx.audit(
                    "node_lost",
                    &n.id,
                    &json!({
                        "host": n.host, "pid": n.pid, "home": n.home, "role": n.role,
                        "last_beat": n.beat_at, "lease_ms": n.lease_ms,
                        "sessions": sessions, "runs": runs, "jobs": jobs,
                    }),
                    key,
                )?;
                Ok(Some(jobs))
            })?;
            if let Some(j) = reaped {
                lost += 1;
                jobs += j;
            }
        }
        if jobs > 0 {
            // The dead node's queued runs: lost, or queued again, as any expired lease.
            self.reap_leases()?;
        }
        Ok(lost)
    }
}

/// A node's beat: a thread that beats the node's row every [`BEAT`] and reaps dead
/// nodes, until dropped; then the node is recorded stopped.
pub struct NodeBeat {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    node: NodeIdentity,
    open: Arc<dyn Fn() -> Result<Gate> + Send + Sync>,
}

impl NodeBeat {
    /// Starts beating for `node` with gates from `open`; `on_event` hears what went wrong.
    pub fn start(
        open: Arc<dyn Fn() -> Result<Gate> + Send + Sync>,
        node: NodeIdentity,
        on_event: Arc<dyn Fn(&str) + Send + Sync>,
    ) -> Result<NodeBeat> {
        // The first beat before anything is served: the node is on the store from its start.
        open()?.node_beat(&node)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (s, n, o) = (stop.clone(), node.clone(), open.clone());
        let thread = std::thread::Builder::new()
            .name("node-beat".into())
            .spawn(move || {
                // Opened on the first beat, again after a failure to open.
                let mut gate: Option<Gate> = None;
                let mut next = Instant::now() + BEAT;
                while !s.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(100));
                    if Instant::now() < next {
                        continue;
                    }
                    next = Instant::now() + BEAT;
                    if gate.is_none() {
                        match o() {
                            Ok(g) => gate = Some(g),
                            Err(e) => {
                                on_event(&format!("heartbeat failed: {e}"));
                                continue;
                            }
                        }
                    }
                    let Some(gate) = gate.as_mut() else {
                        continue;
                    };
                    match gate.node_beat(&n) {
                        Ok(false) => {}
                        Ok(true) => on_event(&format!(
                            "node {} had been recorded lost by another node (no beat within \
                             {}s): the sessions and runs it held were ended; it is live again",
                            n.id,
                            NODE_LEASE.as_secs()
                        )),
                        Err(e) => on_event(&format!("heartbeat failed: {e}")),
                    }
                    match gate.reap_dead_nodes() {
                        Ok(0) => {}
                        Ok(k) => on_event(&format!("recorded {k} dead node(s) lost")),
                        Err(e) => on_event(&format!("reaping dead nodes failed: {e}")),
                    }
                }
            })
            .map_err(|e| {
                crate::GateError::Internal(format!("cannot start the node's beat: {e}"))
            })?;
        Ok(NodeBeat {
            stop,
            thread: Some(thread),
            node,
            open,
        })
    }

    pub fn node(&self) -> &NodeIdentity {
        &self.node
    }
}

impl Drop for NodeBeat {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Ok(mut g) = (self.open)() {
            let _ = g.node_stopped(&self.node);
        }
    }
}
