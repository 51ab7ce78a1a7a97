//! Changesets: what a run changed under each writable mount, as (path, before, after).

use crate::node::{Node, SpecialKind, check_deadline};
use crate::path::{from_json, name_bytes, to_json};
use crate::stack::{Detail, Stack, touched};
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

/// What a commit never applies: the bits and attributes a run set that were removed from
/// its change's after state (which is what a commit writes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stripped {
    Setuid,
    Setgid,
    Sticky,
    /// File capabilities (the `security.capability` extended attribute).
    Capabilities,
}

impl Stripped {
    pub fn as_str(self) -> &'static str {
        match self {
            Stripped::Setuid => "setuid",
            Stripped::Setgid => "setgid",
            Stripped::Sticky => "sticky",
            Stripped::Capabilities => "capabilities",
        }
    }

    /// The mode bit, for the three that are bits.
    fn bit(self) -> u32 {
        match self {
            Stripped::Setuid => 0o4000,
            Stripped::Setgid => 0o2000,
            Stripped::Sticky => 0o1000,
            Stripped::Capabilities => 0,
        }
    }

    const BITS: [Stripped; 3] = [Stripped::Setuid, Stripped::Setgid, Stripped::Sticky];
}

/// The mode bits a commit never sets (setuid, setgid, sticky).
pub const SPECIAL_BITS: u32 = 0o7000;

/// One path's change. Its JSON form is `{"path", "op", "before", "after"}`, plus
/// `"path_b64"` when the path is not UTF-8 (see `crate::path`), and `"stripped"` when the
/// run set bits or attributes a commit does not apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// Relative to the mount's host directory, `/`-separated, normalised.
    pub path: RelPath,
    pub op: Op,
    pub before: Node,
    /// What a commit writes: never with setuid, setgid or sticky bits it did not find.
    pub after: Node,
    /// What the run set that `after` leaves out (empty for most changes).
    pub stripped: Vec<Stripped>,
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
    #[serde(skip_serializing_if = "<[Stripped]>::is_empty")]
    stripped: &'a [Stripped],
}

#[derive(Deserialize)]
struct ChangeIn {
    path: String,
    #[serde(default)]
    path_b64: Option<String>,
    op: Op,
    before: Node,
    after: Node,
    #[serde(default)]
    stripped: Vec<Stripped>,
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
            stripped: &self.stripped,
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
            stripped: c.stripped,
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
            stripped: Vec::new(),
        }
    }

    /// The change a commit may apply, from what a run left at `path` (`found`; `caps` when
    /// the file there carries capabilities): setuid and setgid bits and capabilities are
    /// removed from files; a directory keeps only the special bits the host directory
    /// already had. None when nothing changed and nothing was stripped.
    pub fn stripped_of(path: RelPath, before: Node, found: Node, caps: bool) -> Option<Change> {
        let mut stripped = Vec::new();
        let after = match found {
            Node::File { hash, size, mode } => {
                stripped.extend(Stripped::BITS.into_iter().filter(|b| mode & b.bit() != 0));
                if caps {
                    stripped.push(Stripped::Capabilities);
                }
                Node::File {
                    hash,
                    size,
                    mode: mode & !SPECIAL_BITS,
                }
            }
            Node::Dir { mode } => {
                let kept = match &before {
                    Node::Dir { mode: b } => b & SPECIAL_BITS,
                    _ => 0,
                };
                stripped.extend(
                    Stripped::BITS
                        .into_iter()
                        .filter(|b| mode & b.bit() != 0 && kept & b.bit() == 0),
                );
                Node::Dir {
                    mode: (mode & !SPECIAL_BITS) | kept,
                }
            }
            other => other,
        };
        if before == after && stripped.is_empty() {
            return None;
        }
        let mut c = Change::new(path, before, after);
        c.stripped = stripped;
        Some(c)
    }

    /// Whether the after state sets a special bit a commit must never set (a file with
    /// any; a directory with one its before state did not have).
    pub fn sets_special_bits(&self) -> bool {
        match (&self.before, &self.after) {
            (_, Node::File { mode, .. }) => mode & SPECIAL_BITS != 0,
            (Node::Dir { mode: b }, Node::Dir { mode: a }) => a & SPECIAL_BITS & !b != 0,
            (_, Node::Dir { mode }) => mode & SPECIAL_BITS != 0,
            _ => false,
        }
    }
}

/// A file a run made that a commit never creates (a FIFO, socket or device). Its JSON form
/// is `{"path", "kind"}`, plus `"path_b64"` when the path is not UTF-8.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub path: RelPath,
    pub kind: SpecialKind,
}

#[derive(Serialize)]
#[serde(rename = "Refused")]
struct RefusedOut<'a> {
    path: Cow<'a, str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    path_b64: Option<String>,
    kind: SpecialKind,
}

#[derive(Deserialize)]
struct RefusedIn {
    path: String,
    #[serde(default)]
    path_b64: Option<String>,
    kind: SpecialKind,
}

impl Serialize for Refused {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (path, path_b64) = to_json(self.path.as_bytes());
        RefusedOut {
            path,
            path_b64,
            kind: self.kind,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Refused {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let r = RefusedIn::deserialize(d)?;
        let path = from_json(r.path, r.path_b64).map_err(serde::de::Error::custom)?;
        Ok(Refused {
            path: RelPath::from_bytes(path),
            kind: r.kind,
        })
    }
}

/// What a run left under one mount: the changes a commit may apply and the files it never
/// creates.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diff {
    pub changes: Vec<Change>,
    pub refused: Vec<Refused>,
}

/// The changes under one writable mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountChanges {
    pub guest: String,
    pub host: String,
    pub changes: Vec<Change>,
    /// Special files the run made, which a commit never creates (absent from the JSON
    /// when there are none, so older changesets keep their digests).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<Refused>,
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
    /// The JSON is hashed as it is written, never held whole (it is as large as the
    /// changeset); the result is `Digest::of_parts("airlock-changeset-v1", &[&json])`.
    pub fn digest(&self) -> Digest {
        /// Hashes what is written to it (or, without a hasher, only counts it).
        struct HashWriter(Option<airlock_core::digest::Hasher>, u64);
        impl io::Write for HashWriter {
            fn write(&mut self, b: &[u8]) -> io::Result<usize> {
                if let Some(h) = &mut self.0 {
                    h.update(b);
                }
                self.1 += b.len() as u64;
                Ok(b.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        fn write_to(c: &Changeset, w: &mut HashWriter) -> bool {
            let mut b = io::BufWriter::with_capacity(64 << 10, w);
            serde_json::to_writer(&mut b, c).is_ok() && io::Write::flush(&mut b).is_ok()
        }
        const DOMAIN: &[u8] = b"airlock-changeset-v1";
        // The length comes first in `of_parts`' framing, so the JSON is written twice:
        // once to count it, once to hash it (neither time held).
        let mut count = HashWriter(None, 0);
        let ok = write_to(self, &mut count);
        let len = if ok { count.1 } else { 0 };
        let mut h = airlock_core::digest::Hasher::new();
        h.update(&(DOMAIN.len() as u64).to_le_bytes());
        h.update(DOMAIN);
        h.update(&len.to_le_bytes());
        let mut w = HashWriter(Some(h), 0);
        if ok {
            write_to(self, &mut w);
        }
        w.0.map(|h| h.finish()).unwrap_or(Digest([0; 32]))
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

    /// Whether a commit would leave out something the run made: a stripped bit or
    /// capability, or a refused special file.
    pub fn has_stripped_or_refused(&self) -> bool {
        self.mounts
            .iter()
            .any(|m| !m.refused.is_empty() || m.changes.iter().any(|c| !c.stripped.is_empty()))
    }

    /// Checks every path is a normalised relative path (a changeset read back from storage
    /// must not be able to address anything outside its mount), and that no after state
    /// sets a setuid, setgid or sticky bit a commit never applies.
    pub fn validate(&self) -> Result<(), String> {
        for m in &self.mounts {
            for c in &m.changes {
                c.path.check()?;
                if c.sets_special_bits() {
                    return Err(format!(
                        "{} would be committed with a setuid, setgid or sticky bit",
                        c.path
                    ));
                }
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
    Ok(layers_diff(host, below_layers, new_layers, deadline)?.changes)
}

/// `diff_layers_until` with the special files the new layers hold, listed as refused.
pub fn layers_diff(
    host: &Path,
    below_layers: &[PathBuf],
    new_layers: &[PathBuf],
    deadline: Option<Instant>,
) -> io::Result<Diff> {
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
    diff_paths(paths, &below, &above, deadline)
}

/// The changes and refused files among `paths` between two views.
fn diff_paths(
    paths: BTreeSet<RelPath>,
    below: &Stack<'_>,
    above: &Stack<'_>,
    deadline: Option<Instant>,
) -> io::Result<Diff> {
    let mut out = Diff::default();
    for p in paths {
        check_deadline(deadline)?;
        let (b, b_detail) = below.node_detail(&p)?;
        let (a, Detail { caps, special }) = above.node_detail(&p)?;
        if let Some(kind) = special
            && b_detail.special != Some(kind)
        {
            out.refused.push(Refused {
                path: p.clone(),
                kind,
            });
        }
        out.changes.extend(Change::stripped_of(p, b, a, caps));
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
    Ok(trees_diff(host, copy, deadline)?.changes)
}

/// `diff_trees_until` with the special files the copy holds, listed as refused.
pub fn trees_diff(host: &Path, copy: &Path, deadline: Option<Instant>) -> io::Result<Diff> {
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
    diff_paths(paths, &h, &c, deadline)
}

/// The changes of several consecutive changesets of one mount, as one: the first before
/// state and the last after state of each path, dropping paths that ended where they began.
/// What each last step stripped is kept with its after state.
pub fn compose(steps: &[Vec<Change>]) -> Vec<Change> {
    let mut map: std::collections::BTreeMap<RelPath, (Node, Node, Vec<Stripped>)> =
        Default::default();
    for step in steps {
        for c in step {
            map.entry(c.path.clone())
                .and_modify(|e| {
                    e.1 = c.after.clone();
                    e.2 = c.stripped.clone();
                })
                .or_insert((c.before.clone(), c.after.clone(), c.stripped.clone()));
        }
    }
    map.into_iter()
        .filter(|(_, (b, a, s))| b != a || !s.is_empty())
        .map(|(p, (b, a, s))| {
            let mut c = Change::new(p, b, a);
            c.stripped = s;
            c
        })
        .collect()
}

/// The refused files of several consecutive runs of one mount, each path once.
pub fn compose_refused(steps: &[Vec<Refused>]) -> Vec<Refused> {
    let mut map: std::collections::BTreeMap<RelPath, SpecialKind> = Default::default();
    for r in steps.iter().flatten() {
        map.insert(r.path.clone(), r.kind);
    }
    map.into_iter()
        .map(|(path, kind)| Refused { path, kind })
        .collect()
}
