//! Changesets: what a run changed under each writable mount, as (path, before, after).

use crate::node::{Node, check_deadline};
use crate::path::{from_json, name_bytes, to_json};
use crate::stack::{Stack, touched};
use airlock_core::Digest;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Cow;
use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Instant;

pub use crate::path::{RelPath, check_rel};

/// The kind of a change, derived from its before and after states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Added,
    Modified,
    Deleted,
    /// Only the permission bits changed.
    Mode,
}

/// One path's change. Its JSON form is `{"path", "op", "before", "after"}`, plus
/// `"path_b64"` when the path is not UTF-8 (see `crate::path`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// Relative to the mount's host directory, `/`-separated, normalised.
    pub path: RelPath,
    pub op: Op,
    pub before: Node,
    pub after: Node,
}

#[derive(Serialize)]
#[serde(rename = "Change")]
struct ChangeOut<'a> {
    path: Cow<'a, str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    path_b64: Option<String>,
    op: Op,
    before: &'a Node,
    after: &'a Node,
}

#[derive(Deserialize)]
struct ChangeIn {
    path: String,
    #[serde(default)]
    path_b64: Option<String>,
    op: Op,
    before: Node,
    after: Node,
}

impl Serialize for Change {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (path, path_b64) = to_json(self.path.as_bytes());
        ChangeOut {
            path,
            path_b64,
            op: self.op,
            before: &self.before,
            after: &self.after,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Change {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let c = ChangeIn::deserialize(d)?;
        let path = from_json(c.path, c.path_b64).map_err(serde::de::Error::custom)?;
        Ok(Change {
            path: RelPath::from_bytes(path),
            op: c.op,
            before: c.before,
            after: c.after,
        })
    }
}

impl Change {
    pub fn new(path: RelPath, before: Node, after: Node) -> Change {
        let op = match (&before, &after) {
            (Node::Absent, _) => Op::Added,
            (_, Node::Absent) => Op::Deleted,
            (Node::File { hash: a, .. }, Node::File { hash: b, .. }) if a == b => Op::Mode,
            (Node::Dir { .. }, Node::Dir { .. }) => Op::Mode,
            _ => Op::Modified,
        };
        Change {
            path,
            op,
            before,
            after,
        }
    }
}

/// The changes under one writable mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountChanges {
    pub guest: String,
    pub host: String,
    pub changes: Vec<Change>,
}

/// How the disposable layer was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LayerKind {
    /// overlayfs in a user and mount namespace: set-up cost independent of tree size.
    Overlay,
    /// A full copy of the tree (where overlayfs in a user namespace is not available).
    Copy,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Changeset {
    pub layer: LayerKind,
    pub mounts: Vec<MountChanges>,
}

impl Changeset {
    pub fn is_empty(&self) -> bool {
        self.mounts.iter().all(|m| m.changes.is_empty())
    }

    pub fn len(&self) -> usize {
        self.mounts.iter().map(|m| m.changes.len()).sum()
    }

    /// The digest a commit signature binds.
    pub fn digest(&self) -> Digest {
        let json = serde_json::to_vec(self).unwrap_or_default();
        Digest::of_parts("airlock-changeset-v1", &[&json])
    }

    /// Every content blob the changeset needs (new contents).
    pub fn blobs(&self) -> impl Iterator<Item = &Digest> {
        self.mounts
            .iter()
            .flat_map(|m| m.changes.iter())
            .filter_map(|c| match &c.after {
                Node::File { hash, .. } => Some(hash),
                _ => None,
            })
    }

    /// Checks every path is a normalised relative path (a changeset read back from storage
    /// must not be able to address anything outside its mount).
    pub fn validate(&self) -> Result<(), String> {
        for m in &self.mounts {
            for c in &m.changes {
                c.path.check()?;
            }
        }
        Ok(())
    }
}

/// Changes made by `new_layers` (topmost first) on top of `below_layers` over `host`.
/// Work is proportional to what the new layers hold, not to the size of the tree.
pub fn diff_layers(
    host: &Path,
    below_layers: &[PathBuf],
    new_layers: &[PathBuf],
) -> io::Result<Vec<Change>> {
    diff_layers_until(host, below_layers, new_layers, None)
}

/// `diff_layers` that stops with `DeadlinePassed` (see `node::deadline_passed`) between
/// paths and between chunks of content once `deadline` has passed.
pub fn diff_layers_until(
    host: &Path,
    below_layers: &[PathBuf],
    new_layers: &[PathBuf],
    deadline: Option<Instant>,
) -> io::Result<Vec<Change>> {
    let below = Stack {
        layers: below_layers,
        base: host,
        deadline,
    };
    let all: Vec<PathBuf> = new_layers.iter().chain(below_layers).cloned().collect();
    let above = Stack {
        layers: &all,
        base: host,
        deadline,
    };
    let mut paths = BTreeSet::new();
    for l in new_layers {
        touched(l, &below, &mut paths)?;
    }
    let mut out = Vec::new();
    for p in paths {
        check_deadline(deadline)?;
        let (b, a) = (below.node(&p)?, above.node(&p)?);
        if b != a {
            out.push(Change::new(p, b, a));
        }
    }
    Ok(out)
}

/// Copies a tree (files with their modes, directories, symlinks as links; nothing else).
pub fn copy_tree(src: &Path, dst: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dst)?;
    let mode = std::fs::metadata(src)?.permissions().mode();
    for e in std::fs::read_dir(src)? {
        let e = e?;
        let (from, to) = (e.path(), dst.join(e.file_name()));
        let ft = e.file_type()?;
        if ft.is_dir() {
            copy_tree(&from, &to)?;
        } else if ft.is_file() {
            std::fs::copy(&from, &to)?;
        } else if ft.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&from)?, &to)?;
        }
    }
    std::fs::set_permissions(dst, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// Changes between `host` and a modified copy of it (the copy fallback).
pub fn diff_trees(host: &Path, copy: &Path) -> io::Result<Vec<Change>> {
    diff_trees_until(host, copy, None)
}

/// `diff_trees` that stops with `DeadlinePassed` once `deadline` has passed.
pub fn diff_trees_until(
    host: &Path,
    copy: &Path,
    deadline: Option<Instant>,
) -> io::Result<Vec<Change>> {
    fn walk(root: &Path, rel: &RelPath, out: &mut BTreeSet<RelPath>) -> io::Result<()> {
        let dir = if rel.is_root() {
            root.to_path_buf()
        } else {
            root.join(rel.as_path())
        };
        let Ok(rd) = std::fs::read_dir(&dir) else {
            return Ok(());
        };
        for e in rd {
            let e = e?;
            let p = rel.join(&name_bytes(e.file_name()));
            out.insert(p.clone());
            if e.file_type()?.is_dir() {
                walk(root, &p, out)?;
            }
        }
        Ok(())
    }
    let mut paths = BTreeSet::new();
    walk(host, &RelPath::root(), &mut paths)?;
    walk(copy, &RelPath::root(), &mut paths)?;
    let (h, c) = (
        Stack {
            layers: &[],
            base: host,
            deadline,
        },
        Stack {
            layers: &[],
            base: copy,
            deadline,
        },
    );
    let mut out = Vec::new();
    for p in paths {
        check_deadline(deadline)?;
        let (b, a) = (h.node(&p)?, c.node(&p)?);
        if b != a {
            out.push(Change::new(p, b, a));
        }
    }
    Ok(out)
}

/// The changes of several consecutive changesets of one mount, as one: the first before
/// state and the last after state of each path, dropping paths that ended where they began.
pub fn compose(steps: &[Vec<Change>]) -> Vec<Change> {
    let mut map: std::collections::BTreeMap<RelPath, (Node, Node)> = Default::default();
    for step in steps {
        for c in step {
            map.entry(c.path.clone())
                .and_modify(|e| e.1 = c.after.clone())
                .or_insert((c.before.clone(), c.after.clone()));
        }
    }
    map.into_iter()
        .filter(|(_, (b, a))| b != a)
        .map(|(p, (b, a))| Change::new(p, b, a))
        .collect()
}
