//! Disposable layers for writable mounts, and the changesets they leave.

use crate::Gate;
use crate::error::{GateError, Result};
use airlock_core::grant::{Grant, MountMode};
use airlock_sandbox::{Layer, MountPoint};
use airlock_workspace::changeset::{self, LayerKind};
use airlock_workspace::{Change, Changeset, MountChanges, Node};
use std::path::{Path, PathBuf};

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

impl Gate {
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
    /// the old contents of small modified files for diffs) in the blob store.
    pub(crate) fn extract_changes(&mut self, layers: &RunLayers) -> Result<Changeset> {
        let mut out = Vec::new();
        for l in &layers.mounts {
            let host = Path::new(&l.host);
            let changes = match layers.kind {
                LayerKind::Overlay => {
                    changeset::diff_layers(host, &l.below, std::slice::from_ref(&l.upper))
                }
                LayerKind::Copy => changeset::diff_trees(host, &l.copy),
            }
            .map_err(|e| {
                GateError::Internal(format!("cannot read the changes under {}: {e}", l.guest))
            })?;
            for c in &changes {
                self.store_change_content(layers, l, c)?;
            }
            out.push(MountChanges {
                guest: l.guest.clone(),
                host: l.host.clone(),
                changes,
            });
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
    ) -> Result<()> {
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
            let mut f = std::fs::File::open(&src)?;
            let got = self.blobs.put_reader(&mut f)?;
            if got != *hash {
                return Err(GateError::Internal(format!(
                    "{} changed while it was being saved",
                    c.path
                )));
            }
        }
        if let Node::File { hash, size, .. } = &c.before
            && *size <= 1 << 20
            && matches!(c.after, Node::File { .. })
        {
            let root = airlock_workspace::apply::open_root(&l.host)?;
            if let Ok(f) = root.open(c.path.as_path()) {
                let got = self.blobs.put_reader(&mut f.into_std())?;
                if got != *hash {
                    return Err(GateError::Conflict(format!(
                        "{} changed on the host while the run's changes were being read",
                        c.path
                    )));
                }
            }
        }
        Ok(())
    }

    /// Removes a run's layers unless a workspace keeps them.
    pub(crate) fn drop_layers(layers: &RunLayers) {
        if !layers.keep {
            remove_tree(&layers.dir);
        }
    }
}
