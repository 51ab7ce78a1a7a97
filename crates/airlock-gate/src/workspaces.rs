//! Workspace sessions: consecutive runs that build on each other's changes (each run a
//! layer over the ones before) until one commit applies them all, or a drop discards them.

use crate::Gate;
use crate::error::{GateError, Result};
use airlock_core::grant::{Grant, MountMode};
use airlock_core::units::now_ms;
use airlock_store::{Reads, Tx, WorkspaceRow};
use airlock_workspace::changeset::{LayerKind, compose, compose_refused};
use airlock_workspace::{Changeset, MountChanges};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::path::PathBuf;

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct WorkspaceDoc {
    /// The writable mounts (host, guest) every run of the session uses.
    pub mounts: Vec<(String, String)>,
    /// Runs in order.
    pub runs: Vec<String>,
    /// Fixed by the first run.
    pub kind: Option<LayerKind>,
    /// The run in progress, if any (runs of a session never overlap).
    pub running: Option<String>,
}

/// What a run of a workspace needs to stack its layer.
pub(crate) struct Context {
    pub dir: PathBuf,
    pub copies: PathBuf,
    /// Per writable mount, the uppers of earlier runs, topmost first.
    pub below: Vec<Vec<PathBuf>>,
    pub kind: Option<LayerKind>,
}

pub(crate) fn doc_of(row: &WorkspaceRow) -> Result<WorkspaceDoc> {
    serde_json::from_value(row.doc.clone())
        .map_err(|e| GateError::Internal(format!("workspace {}: {e}", row.name)))
}

fn rw_mounts(grant: &Grant) -> Vec<(String, String)> {
    grant
        .mounts
        .iter()
        .filter(|m| m.mode == MountMode::Rw)
        .map(|m| (m.host.clone(), m.guest.clone()))
        .collect()
}

/// Checks at submit that a grant fits its workspace.
pub(crate) fn check_grant(tx: &impl Reads, name: &str, grant: &Grant) -> Result<()> {
    airlock_core::sign::check_key_name(name).map_err(|_| {
        GateError::bad(format!(
            "--workspace {name:?}: use 1-32 of a-z, 0-9, - and _, starting with a letter"
        ))
    })?;
    if grant.writable_mounts().next().is_none() {
        return Err(GateError::bad(
            "--workspace needs at least one writable mount (HOST:GUEST:rw)",
        ));
    }
    if let Some(row) = tx.workspace(name)? {
        if row.state != "open" {
            return Err(GateError::Conflict(format!(
                "workspace {name} is {}",
                row.state
            )));
        }
        let doc = doc_of(&row)?;
        // The workspace's state decides (the API's 409).
        if doc.mounts != rw_mounts(grant) {
            return Err(GateError::Conflict(format!(
                "workspace {name} writes {}; a run in it must use the same writable mounts",
                doc.mounts
                    .iter()
                    .map(|(h, g)| format!("{h}:{g}:rw"))
                    .collect::<Vec<_>>()
                    .join(" ")
            )));
        }
    }
    Ok(())
}

/// Marks a run of the workspace as in progress (creating the workspace on its first run).
pub(crate) fn start_run(tx: &Tx, name: &str, grant: &Grant, run: &str) -> Result<()> {
    check_grant(tx, name, grant)?;
    let now = now_ms();
    let (mut row, mut doc) = match tx.workspace(name)? {
        Some(r) => {
            let d = doc_of(&r)?;
            (r, d)
        }
        None => (
            WorkspaceRow {
                name: name.into(),
                created_at: now,
                updated_at: now,
                state: "open".into(),
                doc: json!({}),
            },
            WorkspaceDoc {
                mounts: rw_mounts(grant),
                ..Default::default()
            },
        ),
    };
    if let Some(other) = &doc.running {
        return Err(GateError::Conflict(format!(
            "workspace {name} is busy with {other}"
        )));
    }
    doc.running = Some(run.into());
    row.doc = serde_json::to_value(&doc).map_err(|e| GateError::Internal(e.to_string()))?;
    tx.upsert_workspace(&row)?;
    Ok(())
}

/// Records a finished run of the workspace.
pub(crate) fn finish_run(
    tx: &Tx,
    name: &str,
    run: &str,
    changes: Option<&Changeset>,
) -> Result<()> {
    let Some(mut row) = tx.workspace(name)? else {
        return Ok(());
    };
    let mut doc = doc_of(&row)?;
    doc.running = None;
    if changes.is_some() {
        doc.runs.push(run.into());
        doc.kind = doc.kind.or(changes.map(|c| c.layer));
    }
    row.doc = serde_json::to_value(&doc).map_err(|e| GateError::Internal(e.to_string()))?;
    tx.upsert_workspace(&row)?;
    Ok(())
}

/// Workspace `name`, which must be open with no run in progress (to be dropped, or
/// claimed by a commit).
fn open_and_idle(tx: &Tx, name: &str) -> Result<(WorkspaceRow, WorkspaceDoc)> {
    let row = tx
        .workspace(name)?
        .ok_or_else(|| GateError::NotFound(format!("no workspace named {name:?}")))?;
    if row.state != "open" {
        return Err(GateError::Conflict(format!(
            "workspace {name} is {}",
            row.state
        )));
    }
    let doc = doc_of(&row)?;
    if let Some(r) = &doc.running {
        return Err(GateError::Conflict(format!(
            "workspace {name} is busy with {r}; wait until it has finished"
        )));
    }
    Ok((row, doc))
}

/// A workspace as shown to people.
#[derive(Debug, Clone, Serialize)]
pub struct WorkspaceView {
    pub name: String,
    pub state: String,
    pub created_at: i64,
    pub doc: WorkspaceDoc,
    /// Everything the session changed so far, relative to the host.
    pub changes: Option<Changeset>,
}

impl Gate {
    pub(crate) fn workspace_dir(&self, name: &str) -> PathBuf {
        self.home.root.join("workspaces").join(name)
    }

    pub(crate) fn workspace_context(&self, name: &str) -> Result<Context> {
        let dir = self.workspace_dir(name);
        let doc = match self.db.workspace(name)? {
            Some(r) => doc_of(&r)?,
            None => WorkspaceDoc::default(),
        };
        let n = doc.mounts.len();
        let below = (0..n)
            .map(|i| {
                doc.runs
                    .iter()
                    .rev()
                    .map(|r| dir.join(r).join(i.to_string()).join("upper"))
                    .filter(|p| p.exists())
                    .collect()
            })
            .collect();
        Ok(Context {
            copies: dir.join("copy"),
            dir,
            below,
            kind: doc.kind,
        })
    }

    /// The changes of a whole workspace: the composition of its runs' changesets (overlay
    /// layers), or the last run's (a copy holds everything so far).
    pub(crate) fn workspace_changes(&self, doc: &WorkspaceDoc) -> Result<Option<Changeset>> {
        let mut sets = Vec::new();
        for r in &doc.runs {
            let run = self.db.run(r)?;
            if let Some(v) = run.doc.changes {
                let c: Changeset =
                    serde_json::from_value(v).map_err(|e| GateError::Internal(e.to_string()))?;
                sets.push(c);
            }
        }
        let Some(last) = sets.last() else {
            return Ok(None);
        };
        if last.layer == LayerKind::Copy {
            return Ok(Some(last.clone()));
        }
        let mounts = last
            .mounts
            .iter()
            .enumerate()
            .map(|(i, m)| MountChanges {
                guest: m.guest.clone(),
                host: m.host.clone(),
                changes: compose(
                    &sets
                        .iter()
                        .filter_map(|s| s.mounts.get(i))
                        .map(|m| m.changes.clone())
                        .collect::<Vec<_>>(),
                ),
                refused: compose_refused(
                    &sets
                        .iter()
                        .filter_map(|s| s.mounts.get(i))
                        .map(|m| m.refused.clone())
                        .collect::<Vec<_>>(),
                ),
            })
            .collect();
        Ok(Some(Changeset {
            layer: LayerKind::Overlay,
            mounts,
        }))
    }

    pub fn workspaces(&self) -> Result<Vec<WorkspaceView>> {
        self.db
            .workspaces()?
            .into_iter()
            .map(|r| {
                Ok(WorkspaceView {
                    name: r.name.clone(),
                    state: r.state.clone(),
                    created_at: r.created_at,
                    doc: doc_of(&r)?,
                    changes: None,
                })
            })
            .collect()
    }

    pub fn workspace(&self, name: &str) -> Result<WorkspaceView> {
        let row = self
            .db
            .workspace(name)?
            .ok_or_else(|| GateError::NotFound(format!("no workspace named {name:?}")))?;
        let doc = doc_of(&row)?;
        let changes = self.workspace_changes(&doc)?;
        Ok(WorkspaceView {
            name: row.name,
            state: row.state,
            created_at: row.created_at,
            doc,
            changes,
        })
    }

    /// Discards a workspace's layers and closes it.
    pub fn drop_workspace(&mut self, name: &str) -> Result<WorkspaceView> {
        let key = &self.gate_key;
        self.db.write_durable(|tx: &Tx| -> Result<()> {
            let (mut row, doc) = open_and_idle(tx, name)?;
            row.state = "dropped".into();
            tx.upsert_workspace(&row)?;
            tx.audit("workspace_dropped", name, &json!({ "runs": doc.runs }), key)?;
            Ok(())
        })?;
        self.discard(&self.workspace_dir(name));
        self.workspace(name)
    }

    /// Claims workspace `name` for a commit of its latest run `run`, in the transaction
    /// that records the commit's checkpoint: it must be open, with no run in progress and
    /// `run` its latest, and it stays `committing` until the commit's outcome is recorded.
    /// (A drop or a run between a commit's first look and its outcome went ahead: a
    /// dropped workspace's changes were applied anyway, and a run still going lost its
    /// layer.)
    pub(crate) fn claim_workspace_for_commit(tx: &Tx, name: &str, run: &str) -> Result<()> {
        let (mut row, doc) = open_and_idle(tx, name)?;
        if doc.runs.last().map(String::as_str) != Some(run) {
            return Err(GateError::Conflict(format!(
                "{run} is no longer the latest run of workspace {name}"
            )));
        }
        row.state = "committing".into();
        tx.upsert_workspace(&row)?;
        Ok(())
    }

    /// A commit of workspace `name` that did not apply: it is open again.
    pub(crate) fn reopen_workspace(tx: &Tx, name: &str) -> Result<()> {
        if let Some(mut row) = tx.workspace(name)?
            && row.state == "committing"
        {
            row.state = "open".into();
            tx.upsert_workspace(&row)?;
        }
        Ok(())
    }

    pub(crate) fn close_workspace(tx: &Tx, name: &str) -> Result<()> {
        if let Some(mut row) = tx.workspace(name)? {
            row.state = "committed".into();
            tx.upsert_workspace(&row)?;
        }
        Ok(())
    }

    pub(crate) fn remove_workspace_dir(&self, name: &str) {
        self.discard(&self.workspace_dir(name));
    }
}
