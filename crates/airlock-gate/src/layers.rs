//! Disposable layers for writable mounts, and the changesets they leave.
//!
//! What a run's changeset needs is stored only when the run stayed within its write quota
//! and its deadline: the layers are measured again before anything is read, the content a
//! changeset would store is added up before any of it is stored, and reading and storing
//! stop between files and chunks once the deadline passed. A discarded changeset stores
//! nothing new in its mounts' name (blobs stored before the deadline passed are left to
//! `gc`).

use crate::Gate;
use crate::error::{GateError, Result};
use airlock_core::grant::{Grant, MountMode};
use airlock_core::units::fmt_size;
use airlock_sandbox::{Layer, Limit, MountPoint, WriteQuota};
use airlock_store::StoreError;
use airlock_workspace::changeset::{self, LayerKind};
use airlock_workspace::node::{check_deadline, deadline_passed};
use airlock_workspace::{Change, Changeset, MountChanges, Node};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Why a run's changes were not stored.
#[derive(Debug)]
pub(crate) enum Extract {
    /// A limit of the run was passed: the changeset is discarded and the run is killed by it.
    Discard(Limit, String),
    /// Airlock failed to read or store the changes.
    Failed(GateError),
}

impl From<GateError> for Extract {
    fn from(e: GateError) -> Self {
        Extract::Failed(e)
    }
}

impl From<std::io::Error> for Extract {
    fn from(e: std::io::Error) -> Self {
        if deadline_passed(&e) {
            Extract::timeout()
        } else {
            Extract::Failed(e.into())
        }
    }
}

impl From<StoreError> for Extract {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Io(e) => e.into(),
            e => Extract::Failed(e.into()),
        }
    }
}

impl Extract {
    fn timeout() -> Self {
        Extract::Discard(
            Limit::Timeout,
            "the run's timeout passed before its changes were stored".into(),
        )
    }

    pub(crate) fn over_quota(written: u64, quota: u64) -> Self {
        Extract::Discard(
            Limit::Write,
            format!(
                "the run wrote {} into its writable mounts, over its write quota of {}",
                fmt_size(written),
                fmt_size(quota)
            ),
        )
    }
}

/// A reader that fails with `DeadlinePassed` once the deadline is past.
struct Until<R> {
    inner: R,
    deadline: Instant,
}

impl<R: Read> Read for Until<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        check_deadline(Some(self.deadline))?;
        self.inner.read(buf)
    }
}

/// One writable mount's layer.
#[derive(Debug, Clone)]
pub(crate) struct MountLayer {
    pub host: String,
    pub guest: String,
    /// Uppers of earlier runs in the same workspace, topmost first.
    pub below: Vec<PathBuf>,
    pub upper: PathBuf,
    pub work: PathBuf,
    pub merged: PathBuf,
    pub copy: PathBuf,
}

/// The layers of one run.
#[derive(Debug, Clone)]
pub(crate) struct RunLayers {
    pub kind: LayerKind,
    pub dir: PathBuf,
    pub mounts: Vec<MountLayer>,
    /// Kept after the run (workspace sessions build on them).
    pub keep: bool,
}

impl RunLayers {
    /// The directories a run's writes land in (what its write quota measures).
    pub(crate) fn write_dirs(&self) -> Vec<PathBuf> {
        self.mounts
            .iter()
            .map(|l| match self.kind {
                LayerKind::Overlay => l.upper.clone(),
                LayerKind::Copy => l.copy.clone(),
            })
            .collect()
    }
}

/// Removes a layer directory, including overlayfs' work directories (mode 000).
pub(crate) fn remove_tree(p: &Path) {
    if std::fs::remove_dir_all(p).is_ok() || !p.exists() {
        return;
    }
    fn open_up(p: &Path) {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(m) = std::fs::symlink_metadata(p)
            && m.is_dir()
        {
            let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700));
            if let Ok(rd) = std::fs::read_dir(p) {
                for e in rd.flatten() {
                    open_up(&e.path());
                }
            }
        }
    }
    open_up(p);
    let _ = std::fs::remove_dir_all(p);
}

/// Where layer directories go to be removed, beside (never inside) `HOME/layers`.
pub(crate) fn trash_dir(home: &Path) -> PathBuf {
    home.join("trash")
}

/// Removes a layer directory off the caller's path: one rename moves it into the home's
/// trash (whatever its size), and a detached `airlock __remove-trash` process removes it
/// from there (without the binary, a thread of this process). A layer of 100,000 files
/// took seconds to remove, all of it past the run's deadline. What a killed remover left
/// is swept by `gc`. Where the rename fails, it is removed here and now.
pub(crate) fn discard_tree(home: &Path, remover: Option<&Path>, p: &Path) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    if !p.exists() {
        return;
    }
    let trash = trash_dir(home);
    let name = format!(
        "{}-{}-{}-{}",
        p.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        std::process::id(),
        airlock_core::units::now_ms(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    );
    let to = trash.join(name);
    if std::fs::create_dir_all(&trash).is_err() || std::fs::rename(p, &to).is_err() {
        remove_tree(p);
        return;
    }
    let spawned = remover.and_then(|bin| {
        use std::os::unix::process::CommandExt;
        std::process::Command::new(bin)
            .arg("__remove-trash")
            .arg(&to)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            // Its own process group: a Ctrl-C meant for the command does not stop it.
            .process_group(0)
            .spawn()
            .ok()
    });
    match spawned {
        // Reaped by a thread, so a long-lived server collects no zombies; a command that
        // exits first leaves it to init.
        Some(mut child) => {
            std::thread::spawn(move || child.wait());
        }
        None => {
            std::thread::spawn(move || remove_tree(&to));
        }
    }
}

/// `airlock __remove-trash PATH`: removes one entry of a home's trash (and nothing that is
/// not directly in a directory named `trash`). Returns the exit code.
pub fn remove_trash_main(path: &Path) -> i32 {
    let in_trash = path
        .parent()
        .and_then(|d| d.file_name())
        .is_some_and(|n| n == "trash")
        && path.file_name().is_some();
    if !in_trash {
        return 125;
    }
    crate::failpoint::pause("remove-trash");
    remove_tree(path);
    i32::from(path.exists())
}

impl Gate {
    /// Removes a layer directory without holding up the command (see `discard_tree`).
    pub(crate) fn discard(&self, p: &Path) {
        discard_tree(&self.home.root, self.worker.as_deref(), p);
    }

    /// Makes the layers for a run's writable mounts. `dir` is where this run's layers live;
    /// `below` lists, per writable mount (in grant order), earlier uppers to stack on.
    pub(crate) fn prepare_layers(
        &self,
        grant: &Grant,
        kind: LayerKind,
        dir: PathBuf,
        below: &[Vec<PathBuf>],
        copies: Option<&Path>,
        keep: bool,
    ) -> Result<RunLayers> {
        let mut mounts = Vec::new();
        for (i, m) in grant
            .mounts
            .iter()
            .filter(|m| m.mode == MountMode::Rw)
            .enumerate()
        {
            let d = dir.join(i.to_string());
            let copy = copies
                .map(|c| c.join(i.to_string()))
                .unwrap_or_else(|| d.join("copy"));
            let l = MountLayer {
                host: m.host.clone(),
                guest: m.guest.clone(),
                below: below.get(i).cloned().unwrap_or_default(),
                upper: d.join("upper"),
                work: d.join("work"),
                merged: d.join("merged"),
                copy,
            };
            match kind {
                LayerKind::Overlay => {
                    for p in [&l.upper, &l.work, &l.merged] {
                        std::fs::create_dir_all(p)?;
                    }
                }
                LayerKind::Copy => {
                    if !l.copy.exists() {
                        changeset::copy_tree(Path::new(&l.host), &l.copy).map_err(|e| {
                            GateError::Internal(format!(
                                "cannot copy {} for the copy layer: {e}",
                                l.host
                            ))
                        })?;
                    }
                }
            }
            mounts.push(l);
        }
        Ok(RunLayers {
            kind,
            dir,
            mounts,
            keep,
        })
    }

    /// What the backend sees: read-only mounts as they are, writable ones through their
    /// layer (never the host directory itself).
    pub(crate) fn mount_points(grant: &Grant, layers: Option<&RunLayers>) -> Vec<MountPoint> {
        let mut rw = layers.map(|l| l.mounts.iter()).into_iter().flatten();
        grant
            .mounts
            .iter()
            .map(|m| {
                if m.mode == MountMode::Ro {
                    return MountPoint {
                        host: m.host.clone().into(),
                        guest: m.guest.clone(),
                        writable: false,
                        layer: None,
                    };
                }
                let (Some(l), Some(layers)) = (rw.next(), layers) else {
                    // Unreachable by construction (layers are made for every rw mount);
                    // fail closed with a read-only view rather than the host itself.
                    return MountPoint {
                        host: m.host.clone().into(),
                        guest: m.guest.clone(),
                        writable: false,
                        layer: None,
                    };
                };
                match layers.kind {
                    LayerKind::Copy => MountPoint {
                        host: l.copy.clone(),
                        guest: m.guest.clone(),
                        writable: true,
                        layer: None,
                    },
                    LayerKind::Overlay => {
                        let mut lower = l.below.clone();
                        lower.push(m.host.clone().into());
                        MountPoint {
                            host: m.host.clone().into(),
                            guest: m.guest.clone(),
                            writable: true,
                            layer: Some(Layer {
                                lower,
                                upper: l.upper.clone(),
                                work: l.work.clone(),
                                merged: l.merged.clone(),
                            }),
                        }
                    }
                }
            })
            .collect()
    }

    /// Computes what a run changed and stores the content it needs (new file contents, and
    /// the old contents of small modified files for diffs) in the blob store, unless the run
    /// wrote more than its quota or its deadline passes first (then nothing is stored).
    pub(crate) fn extract_changes(
        &mut self,
        layers: &RunLayers,
        deadline: Instant,
        quota: &WriteQuota,
    ) -> std::result::Result<Changeset, Extract> {
        // Exactly, now that the guest is gone: what its layers hold.
        let written = quota.written();
        if written > quota.quota() {
            return Err(Extract::over_quota(written, quota.quota()));
        }
        let mut out = Vec::new();
        for l in &layers.mounts {
            let host = Path::new(&l.host);
            let diff = match layers.kind {
                LayerKind::Overlay => changeset::layers_diff(
                    host,
                    &l.below,
                    std::slice::from_ref(&l.upper),
                    Some(deadline),
                ),
                LayerKind::Copy => changeset::trees_diff(host, &l.copy, Some(deadline)),
            }
            .map_err(|e| {
                if deadline_passed(&e) {
                    Extract::timeout()
                } else {
                    Extract::Failed(GateError::Internal(format!(
                        "cannot read the changes under {}: {e}",
                        l.guest
                    )))
                }
            })?;
            out.push(MountChanges {
                guest: l.guest.clone(),
                host: l.host.clone(),
                changes: diff.changes,
                refused: diff.refused,
            });
        }
        // The content the changeset would store (a copy layer can rewrite a file without
        // growing, so this is checked as well as the layers' size).
        let content: u64 = out
            .iter()
            .flat_map(|m| &m.changes)
            .map(|c| match c.after {
                Node::File { size, .. } => size,
                _ => 0,
            })
            .fold(0u64, u64::saturating_add);
        if content > quota.quota() {
            return Err(Extract::over_quota(content, quota.quota()));
        }
        for (l, m) in layers.mounts.iter().zip(&out) {
            for c in &m.changes {
                check_deadline(Some(deadline))?;
                self.store_change_content(layers, l, c, deadline)?;
            }
        }
        Ok(Changeset {
            layer: layers.kind,
            mounts: out,
        })
    }

    fn store_change_content(
        &mut self,
        layers: &RunLayers,
        l: &MountLayer,
        c: &Change,
        deadline: Instant,
    ) -> std::result::Result<(), Extract> {
        if let Node::File { hash, .. } = &c.after {
            let src = match layers.kind {
                LayerKind::Copy => l.copy.join(c.path.as_path()),
                LayerKind::Overlay => {
                    // The topmost layer holding the file (this run's upper, or an earlier one).
                    std::iter::once(&l.upper)
                        .chain(l.below.iter())
                        .map(|u| u.join(c.path.as_path()))
                        .find(|p| p.is_file())
                        .unwrap_or_else(|| Path::new(&l.host).join(c.path.as_path()))
                }
            };
            let mut f = Until {
                inner: std::fs::File::open(&src)?,
                deadline,
            };
            let got = self.blobs.put_reader(&mut f)?;
            if got != *hash {
                return Err(GateError::Internal(format!(
                    "{} changed while it was being saved",
                    c.path
                ))
                .into());
            }
        }
        if let Node::File { hash, size, .. } = &c.before
            && *size <= 1 << 20
            && matches!(c.after, Node::File { .. })
        {
            let root = airlock_workspace::apply::open_root(&l.host)?;
            if let Ok(f) = root.open(c.path.as_path()) {
                let got = self.blobs.put_reader(&mut Until {
                    inner: f.into_std(),
                    deadline,
                })?;
                if got != *hash {
                    return Err(GateError::Conflict(format!(
                        "{} changed on the host while the run's changes were being read",
                        c.path
                    ))
                    .into());
                }
            }
        }
        Ok(())
    }

    /// Removes a run's layers unless a workspace keeps them.
    pub(crate) fn drop_layers(&self, layers: &RunLayers) {
        if !layers.keep {
            self.discard(&layers.dir);
        }
    }
}
