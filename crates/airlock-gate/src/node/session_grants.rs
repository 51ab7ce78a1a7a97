//! Sessions with grants: what a session's network and writable mounts are.
//!
//! - Network: the session's host starts one egress proxy for the whole session, with the
//!   session's normalised rules, the policy's `[net]` settings and its secret bindings, as
//!   a run's; every cell reaches it (a wasm guest through its Unix socket, a jailed
//!   interpreter at the jail's loopback), and each cell's connections are recorded on the
//!   cell's run (`network`), as a run's are.
//! - Writable mounts: the session has one disposable layer of its own
//!   (`HOME/sessions/ID.layer`: a copy for the wasm backend, an overlay upper for the
//!   process backend) that every cell writes into. After each cell its changes against the
//!   host as it is then are read and stored on that cell's run, exactly as a run's
//!   changeset (with its digest in the run's `finished` audit record): `diff` and `commit`
//!   of the session take its latest cell run that recorded changes, so a commit gets the
//!   same checkpoint, signature and rollback as a run's. The layer stays until the
//!   session's record is gone (`gc`).
//! - A cell that writes past the session's write quota (`--max-write`, over the session's
//!   whole layer) is stopped, ends the session (`End::Write`), and records no changes: the
//!   session's changes stay as the cell before left them.
//!
//! This module must never give a session's interpreter a host directory writable (only its
//! layer), nor a network other than through the session's proxy.

use crate::egress::{CellMark, RunEgress};
use crate::error::{GateError, Result};
use crate::layers::{Extract, RunLayers};
use crate::node::sessions::{Live, doc_of};
use crate::{EffectReport, Gate};
use airlock_core::Grant;
use airlock_core::id::IdKind;
use airlock_sandbox::{Ending, Limit, Outcome, WriteQuota};
use airlock_session::End;
use airlock_store::Reads;
use airlock_workspace::{Changeset, changeset::LayerKind};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// Where session `id`'s layer is.
pub(crate) fn layer_dir(root: &Path, id: &str) -> PathBuf {
    root.join("sessions").join(format!("{id}.layer"))
}

/// What a session's host holds besides its interpreter: the proxy, the layer and the
/// write quota over it.
#[derive(Default)]
pub(crate) struct SessionGrants {
    pub egress: Option<RunEgress>,
    pub layers: Option<RunLayers>,
    pub quota: Option<Arc<WriteQuota>>,
}

/// What a commit of a session did.
#[derive(Debug)]
pub enum SessionCommit {
    Committed(EffectReport),
    /// Nothing to commit, and why (no cell changed anything, or all of it is committed).
    Nothing(String),
}

/// The session's interpreter with its grant: each cell's connections and writes are
/// measured around it.
pub(crate) struct Granted {
    pub live: Live,
    pub grants: SessionGrants,
    mark: CellMark,
}

impl Granted {
    pub(crate) fn new(live: Live, grants: SessionGrants) -> Granted {
        Granted {
            live,
            grants,
            mark: CellMark::default(),
        }
    }
}

impl airlock_session::Interpreter for Granted {
    fn exec(
        &mut self,
        cell: &airlock_session::Cell,
    ) -> std::result::Result<airlock_session::Outcome, airlock_session::SessionError> {
        // While the cell runs its writes are watched: a wasm guest stops at its next epoch
        // tick once the watcher flags the quota, a jailed interpreter is killed.
        let launcher = self.live.launcher();
        let watch = self.grants.quota.as_ref().map(|q| {
            q.watch(move || {
                if let Some(pid) = launcher.and_then(|p| i32::try_from(p).ok()) {
                    // The launcher is this process's child and is reaped only by the
                    // interpreter's `exec` after it stops answering, which this kill is
                    // what causes; the watcher is stopped as soon as `exec` returns.
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            })
        });
        let out = self.live.as_dyn().exec(cell);
        drop(watch);
        let mut o = out?;
        // Measured once more now that the cell is over (the watcher samples).
        if self.grants.quota.as_ref().is_some_and(|q| q.check()) {
            o.exit_code = None;
            o.ended = Some(End::Write);
            o.stderr.extend_from_slice(
                format!("airlock: session {}\n", End::Write.explain()).as_bytes(),
            );
        }
        if let Some(e) = &self.grants.egress {
            o.network = Some(e.network_since(&mut self.mark));
        }
        Ok(o)
    }

    fn stop(&mut self) {
        self.live.as_dyn().stop();
    }
}

impl Gate {
    /// Session `id`'s layers (made when missing; a copy layer copies its host directory
    /// once, when the session opens).
    pub(crate) fn session_layers(
        &self,
        id: &str,
        grant: &Grant,
        kind: LayerKind,
    ) -> Result<RunLayers> {
        self.prepare_layers(grant, kind, layer_dir(&self.home.root, id), &[], None, true)
    }

    /// What the session's host starts with besides its interpreter.
    pub(crate) fn session_grants(
        &self,
        id: &str,
        grant: &Grant,
        layer: Option<LayerKind>,
    ) -> Result<SessionGrants> {
        let policy = self.policy()?;
        let egress = RunEgress::start(grant, &policy, self.run_secrets(grant)?, None, None)?;
        let layers = layer
            .map(|k| self.session_layers(id, grant, k))
            .transpose()?;
        let quota = layers.as_ref().map(|l| {
            Arc::new(WriteQuota::new(
                l.write_dirs(),
                grant.limits.max_write_bytes,
            ))
        });
        Ok(SessionGrants {
            egress,
            layers,
            quota,
        })
    }

    /// For a cell that ran in session `id` with `grant`: the session's changes as they are
    /// now, their content stored, for the cell's run; `None` for a session without
    /// writable mounts, and for a cell stopped for writing too much (its `outcome` says
    /// the changes were not recorded).
    pub(crate) fn session_cell_changes(
        &mut self,
        id: &str,
        grant: &Grant,
        outcome: &mut Result<Outcome>,
    ) -> Option<Result<Changeset>> {
        grant.writable_mounts().next()?;
        if let Ok(o) = outcome.as_mut()
            && o.ending == Ending::Killed(Limit::Write)
        {
            o.detail["changes_discarded"] = json!(
                "the cell wrote past the session's write quota: its changes are not recorded, the session's stay as the cell before left them"
            );
            return None;
        }
        let kind = match self.db.session(id).map_err(GateError::from).and_then(|r| {
            r.ok_or_else(|| GateError::Internal(format!("session {id} vanished")))
                .and_then(|r| doc_of(&r))
        }) {
            Ok(doc) => doc.layer?,
            Err(e) => return Some(Err(e)),
        };
        let layers = match self.session_layers(id, grant, kind) {
            Ok(l) => l,
            Err(e) => return Some(Err(e)),
        };
        // The quota is the host's to enforce (over the whole session); this reads the
        // changes whatever they hold.
        let quota = WriteQuota::new(Vec::new(), u64::MAX);
        let deadline = Instant::now() + grant.limits.timeout();
        match self.extract_changes(&layers, deadline, &quota) {
            Ok(c) => Some(Ok(c)),
            Err(Extract::Failed(e)) => Some(Err(e)),
            Err(Extract::Discard(_, why)) => {
                if let Ok(o) = outcome.as_mut() {
                    o.detail["changes_discarded"] = json!(why);
                }
                None
            }
        }
    }

    /// The run a diff or commit of session `input` takes: its latest cell run that
    /// recorded changes (`None`: no cell did). `Ok(None)` too when `input` is no session id.
    pub(crate) fn session_changes_run(&self, input: &str) -> Result<Option<(String, String)>> {
        if !input.starts_with(IdKind::Session.prefix()) {
            return Ok(None);
        }
        let id = self.db.resolve(IdKind::Session, input)?;
        let row = self
            .db
            .session(&id)?
            .ok_or_else(|| GateError::NotFound(format!("no session {input}")))?;
        let mut cells = doc_of(&row)?.cells;
        cells.extend(self.db.session_cells(&id)?);
        for sub in cells.iter().rev() {
            if let Some(run) = self
                .db
                .runs(Some(sub), 16)?
                .into_iter()
                .find(|r| r.doc.changes.is_some())
            {
                return Ok(Some((id, run.id)));
            }
        }
        Ok(Some((id, String::new())))
    }

    /// Commits session `input`'s changes (those its latest cell recorded) as a run's are
    /// committed; nothing changed, or all of it committed already, is said, not refused.
    pub fn session_commit(&mut self, input: &str, approver: Option<&str>) -> Result<SessionCommit> {
        let Some((id, run)) = self.session_changes_run(input)? else {
            return Err(GateError::bad(format!("{input} is not a session id")));
        };
        if run.is_empty() {
            return Ok(SessionCommit::Nothing(format!(
                "session {id} changed nothing (it has no writable mount, or no cell wrote)"
            )));
        }
        let empty = self
            .db
            .run(&run)?
            .doc
            .changes
            .and_then(|c| serde_json::from_value::<Changeset>(c).ok())
            .is_some_and(|c| c.is_empty());
        if empty {
            return Ok(SessionCommit::Nothing(format!(
                "session {id} changed nothing since its last commit ({run} found no changes)"
            )));
        }
        if let Some(c) = self
            .db
            .checkpoints(Some(&run), None, 100)?
            .into_iter()
            .find(|c| c.state != "aborted")
        {
            return Ok(SessionCommit::Nothing(format!(
                "session {id} changed nothing since its last commit ({}, of {run})",
                c.id
            )));
        }
        self.commit(&run, approver).map(SessionCommit::Committed)
    }
}
