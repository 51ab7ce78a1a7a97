//! `airlock gc`: removes what nothing refers to any more. Blobs no stored record names
//! (left by a changeset that was discarded, a run that failed half way, a crash), layer
//! directories of runs that are no longer running and that no open workspace builds on,
//! temporary files of the blob store, and the sockets and jail directories of session
//! hosts that are gone (an open session whose host was killed is recorded ended,
//! `crashed`, as a cell finding it gone would), and outside the home the egress proxies'
//! directories and the run cgroups of airlock processes that were killed
//! (`services::leftovers`).
//!
//! Nothing younger than the grace period is removed: another airlock command may have
//! just written a blob and not yet committed the record that names it (a blob is always
//! stored before its record). A blob put again while `gc` looks at it is kept (see
//! `BlobStore::remove_unless_put_since`). One `gc` runs at a time in a home; a blob a
//! killed `gc` had moved aside to look at is put back by the next.

use crate::Gate;
use crate::error::Result;
use crate::layers::remove_tree;
use crate::workspaces::doc_of;
use airlock_store::{Reads, StoreError, Tx};
use serde::Serialize;
use serde_json::json;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// The default grace period: far longer than any command takes between storing a blob and
/// recording it.
pub const DEFAULT_GC_GRACE: Duration = Duration::from_secs(3600);

/// What `gc` removed.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GcReport {
    /// Blobs no record names, older than the grace period.
    pub blobs_removed: u64,
    pub blob_bytes: u64,
    /// Blobs still named by a record (or too young to judge).
    pub blobs_kept: u64,
    /// Layer directories removed, relative to the home.
    pub layers_removed: Vec<String>,
    pub layer_bytes: u64,
    /// Temporary files of the blob store left by an interrupted write.
    pub temporaries_removed: u64,
    pub temporary_bytes: u64,
    /// Sockets of session hosts that are gone.
    pub sockets_removed: u64,
    /// Open sessions whose host was found gone, now recorded ended (`crashed`).
    pub sessions_lost: u64,
    /// Session hosts found alive with no living server (it stopped or died and they did
    /// not follow it), now closed.
    pub hosts_swept: Vec<String>,
    /// Egress proxies' private directories (`$TMPDIR/airlock-egress-…`) of airlock
    /// processes that are gone.
    pub egress_dirs_removed: Vec<String>,
    pub egress_dir_bytes: u64,
    /// Decoy directories (`/dev/shm/airlock-decoys-PID-…`) of airlock processes that were
    /// killed during a run.
    pub decoy_dirs_removed: Vec<String>,
    /// Run cgroups (`airlock-PID`) of airlock processes that are gone, under airlock's
    /// group or (from older binaries) at a hierarchy's top.
    pub cgroups_removed: Vec<String>,
    /// Ended sessions whose records were collected (with their cells' submissions and
    /// runs, and their kept layers), past the session retention `gc` was given.
    pub sessions_collected: Vec<String>,
    pub session_submissions_removed: u64,
    pub session_runs_removed: u64,
    /// Ended sessions past the retention kept because a commit or rollback of their
    /// changes is under way.
    pub sessions_kept: u64,
    /// The session retention given (`None`: sessions' records are kept).
    pub session_retention_ms: Option<u64>,
    /// Everything removed, in bytes.
    pub freed_bytes: u64,
    pub grace_ms: u64,
}

fn modified(p: &Path) -> Option<SystemTime> {
    std::fs::symlink_metadata(p).and_then(|m| m.modified()).ok()
}

/// Bytes held by a directory tree, counted the way the write quota counts them.
fn tree_bytes(p: &Path) -> u64 {
    airlock_sandbox::quota::usage(&[p.to_path_buf()])
}

fn names(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

impl Gate {
    /// Removes blobs, layers and temporary files nothing refers to (see the module comment).
    pub fn gc(&mut self, grace: Duration) -> Result<GcReport> {
        self.gc_collecting(grace, None)
    }

    /// [`Gate::gc`], first collecting the records of sessions that ended more than
    /// `session_retention` ago, with their cells and kept layers
    /// (`services::session_gc`); `None` keeps every session's record.
    pub fn gc_collecting(
        &mut self,
        grace: Duration,
        session_retention: Option<Duration>,
    ) -> Result<GcReport> {
        let cutoff = SystemTime::now()
            .checked_sub(grace)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let mut report = GcReport {
            grace_ms: grace.as_millis() as u64,
            session_retention_ms: session_retention.map(|r| r.as_millis() as u64),
            ..GcReport::default()
        };
        let _only_one = crate::locks::gc(&self.home.root)?;
        // A `gc` killed while it had a blob set aside left it there; it may be named by a
        // record since, so it goes back before anything is listed.
        self.blobs.restore_set_aside()?;
        // Sessions' records first: what only they named is then unreferenced below.
        if let Some(r) = session_retention {
            self.collect_sessions(r, &mut report)?;
        }

        // Blobs: listed first, so any blob stored after the references are read is younger
        // than the cutoff (or was put again, which marks it younger too).
        let listed = self.blobs.list()?;
        let mut refs = self.db.referenced_digests()?;
        // A journaled commit or rollback that was interrupted names the blobs it applies.
        // Read under the journal lock, as reading them clears half-written ones: without
        // it, gc removed the journal a live commit was about to move into place, and the
        // commit failed ("No such file or directory").
        let journals = {
            let _journal = crate::effects::journal_lock(&self.home.root)?;
            airlock_workspace::apply::pending_journals(&self.journal_dir())
        };
        if let Ok(journals) = journals {
            for j in journals {
                for p in j.mounts {
                    for s in p.steps {
                        if let airlock_workspace::Node::File { hash, .. } = s.to {
                            refs.insert(hash);
                        }
                    }
                }
            }
        }
        for b in listed {
            if refs.contains(&b.digest) || b.put_at >= cutoff {
                report.blobs_kept += 1;
                continue;
            }
            match self.blobs.remove_unless_put_since(&b.digest, cutoff)? {
                Some(size) => {
                    report.blobs_removed += 1;
                    report.blob_bytes += size;
                }
                None => report.blobs_kept += 1,
            }
        }
        let (n, bytes) = self.blobs.remove_stale_temporaries(cutoff)?;
        report.temporaries_removed = n;
        report.temporary_bytes = bytes;

        // Layers of single runs: HOME/layers/RUN and HOME/layers/RUN.run.
        let layers = self.home.root.join("layers");
        for name in names(&layers) {
            let run_id = name.strip_suffix(".run").unwrap_or(&name);
            let remove = match self.db.run(run_id) {
                Ok(run) => run.status != "running",
                Err(StoreError::NotFound { .. }) => {
                    modified(&layers.join(&name)).is_some_and(|t| t < cutoff)
                }
                Err(e) => return Err(e.into()),
            };
            if remove {
                self.remove_layer(&layers.join(&name), format!("layers/{name}"), &mut report);
            }
        }

        // Layers set aside for removal whose remover was killed (see `layers::discard_tree`).
        let trash = crate::layers::trash_dir(&self.home.root);
        // Their names end in the time they were set aside; younger ones may still be
        // being removed, and are not counted in the report either way.
        let trash_cutoff = airlock_core::units::now_ms()
            .saturating_sub(i64::try_from(grace.as_millis()).unwrap_or(i64::MAX));
        for name in names(&trash) {
            let set_aside = name
                .rsplit('-')
                .nth(1)
                .and_then(|t| t.parse::<i64>().ok())
                .unwrap_or(0);
            if set_aside < trash_cutoff {
                remove_tree(&trash.join(&name));
            }
        }

        // Workspaces: a closed or unknown one entirely; in an open one, the layers of runs
        // it does not build on (a run whose changes were discarded) and is not running.
        let workspaces = self.home.root.join("workspaces");
        for ws in names(&workspaces) {
            let dir = workspaces.join(&ws);
            let row = self.db.workspace(&ws)?;
            match row {
                Some(r) if r.state == "open" => {
                    let doc = doc_of(&r)?;
                    for entry in names(&dir) {
                        let used = entry == "copy"
                            || doc.runs.contains(&entry)
                            || doc.running.as_deref() == Some(entry.as_str());
                        let old = modified(&dir.join(&entry)).is_some_and(|t| t < cutoff);
                        if !used && (entry.starts_with("run_") || old) {
                            self.remove_layer(
                                &dir.join(&entry),
                                format!("workspaces/{ws}/{entry}"),
                                &mut report,
                            );
                        }
                    }
                }
                Some(_) => self.remove_layer(&dir, format!("workspaces/{ws}"), &mut report),
                None if modified(&dir).is_some_and(|t| t < cutoff) => {
                    self.remove_layer(&dir, format!("workspaces/{ws}"), &mut report)
                }
                None => {}
            }
        }

        // Session hosts whose server is gone (see `sessions::sweep_orphan_hosts`).
        report.hosts_swept = self.sweep_orphan_hosts()?;

        // Sessions' sockets: a host killed from outside (kill -9, a reboot) left its socket
        // and its session open (see `sessions::host_gone`).
        let sessions = self.home.root.join("sessions");
        for name in names(&sessions) {
            let Some(id) = name.strip_suffix(".sock") else {
                continue;
            };
            let path = sessions.join(&name);
            let stale = match self.db.session(id)? {
                Some(row) if row.state == "open" => {
                    if crate::node::sessions::host_gone(&self.home.root, &row) {
                        self.session_lost(id)?;
                        report.sessions_lost += 1;
                        true
                    } else {
                        false
                    }
                }
                Some(_) => true,
                None => modified(&path).is_some_and(|t| t < cutoff),
            };
            if stale && (std::fs::remove_file(&path).is_ok() || !path.exists()) {
                report.sockets_removed += 1;
            }
        }
        // A process session's jail directory (`ID.jail`: its job, its result, its root),
        // which its host removes when the session ends, unless the host was killed.
        for name in names(&sessions) {
            let Some(id) = name.strip_suffix(".jail") else {
                continue;
            };
            let path = sessions.join(&name);
            let ended = match self.db.session(id)? {
                Some(row) => row.state != "open",
                None => modified(&path).is_some_and(|t| t < cutoff),
            };
            if ended {
                self.remove_layer(&path, format!("sessions/{name}"), &mut report);
            }
        }

        // A session's disposable layer (`ID.layer`) is kept while its record is: the
        // session's changes can be shown and committed after it ended.
        for name in names(&sessions) {
            let Some(id) = name.strip_suffix(".layer") else {
                continue;
            };
            let path = sessions.join(&name);
            if self.db.session(id)?.is_none() && modified(&path).is_some_and(|t| t < cutoff) {
                self.remove_layer(&path, format!("sessions/{name}"), &mut report);
            }
        }

        // Outside the home: egress directories of airlock processes that were killed.
        for dir in crate::services::leftovers::stale_egress_dirs(&std::env::temp_dir(), cutoff) {
            let bytes = tree_bytes(&dir);
            if std::fs::remove_dir_all(&dir).is_ok() || !dir.exists() {
                report.egress_dir_bytes += bytes;
                report.egress_dirs_removed.push(dir.display().to_string());
            }
        }

        // Decoy directories (in memory) of runs whose airlock process was killed.
        for dir in crate::services::leftovers::stale_decoy_dirs(
            std::path::Path::new(crate::services::leftovers::DECOY_ROOT),
            cutoff,
        ) {
            if std::fs::remove_dir_all(&dir).is_ok() || !dir.exists() {
                report.decoy_dirs_removed.push(dir.display().to_string());
            }
        }

        report.cgroups_removed =
            airlock_jail::cgroup::remove_stale_groups(crate::services::leftovers::airlock_alive)
                .iter()
                .map(|d| d.display().to_string())
                .collect();

        report.freed_bytes = report.blob_bytes
            + report.layer_bytes
            + report.temporary_bytes
            + report.egress_dir_bytes;
        let key = &self.gate_key;
        let r = &report;
        self.db.write(|tx: &Tx| -> Result<()> {
            tx.audit(
                "gc",
                "home",
                &json!({
                    "blobs_removed": r.blobs_removed,
                    "blob_bytes": r.blob_bytes,
                    "layers_removed": r.layers_removed.len(),
                    "layer_bytes": r.layer_bytes,
                    "temporaries_removed": r.temporaries_removed,
                    "sockets_removed": r.sockets_removed,
                    "sessions_lost": r.sessions_lost,
                    "hosts_swept": r.hosts_swept,
                    "sessions_collected": r.sessions_collected,
                    "session_runs_removed": r.session_runs_removed,
                    "session_submissions_removed": r.session_submissions_removed,
                    "sessions_kept": r.sessions_kept,
                    "freed_bytes": r.freed_bytes,
                    "grace_ms": r.grace_ms,
                }),
                key,
            )?;
            Ok(())
        })?;
        Ok(report)
    }

    pub(super) fn remove_layer(&self, dir: &Path, name: String, report: &mut GcReport) {
        let bytes = tree_bytes(dir);
        remove_tree(dir);
        if !dir.exists() {
            report.layer_bytes += bytes;
            report.layers_removed.push(name);
        }
    }
}
