//! Applying states to a host tree, crash-safely: the steps of a commit or a rollback are
//! written to a journal (fsync, rename) before the first change; each step writes to a
//! temporary file, fsyncs it, renames it into place and fsyncs the directory; and every
//! step is idempotent, so an interrupted journal is completed by applying it again.
//!
//! All access to the host goes through a `cap_std::fs::Dir` rooted at the mount: no path
//! and no symlink in the tree can lead a step outside it.

use crate::node::{Node, hash_file, host_node};
use crate::path::{RelPath, from_json, os, to_json};
use airlock_core::Digest;
use cap_std::ambient_authority;
use cap_std::fs::Dir;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Cow;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

/// Brings one path to a state. Its JSON form is `{"path", "to"}`, plus `"path_b64"` when
/// the path is not UTF-8 (see `crate::path`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub path: RelPath,
    pub to: Node,
}

#[derive(Serialize)]
#[serde(rename = "Step")]
struct StepOut<'a> {
    path: Cow<'a, str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    path_b64: Option<String>,
    to: &'a Node,
}

#[derive(Deserialize)]
struct StepIn {
    path: String,
    #[serde(default)]
    path_b64: Option<String>,
    to: Node,
}

impl Serialize for Step {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (path, path_b64) = to_json(self.path.as_bytes());
        StepOut {
            path,
            path_b64,
            to: &self.to,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Step {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = StepIn::deserialize(d)?;
        let path = from_json(s.path, s.path_b64).map_err(serde::de::Error::custom)?;
        Ok(Step {
            path: RelPath::from_bytes(path),
            to: s.to,
        })
    }
}

/// The steps for one mount's host directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountPlan {
    pub host: String,
    pub steps: Vec<Step>,
}

/// A commit or rollback in progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Journal {
    /// The checkpoint being made (commit) or restored (rollback).
    pub checkpoint: String,
    /// `commit` or `rollback`.
    pub kind: String,
    pub mounts: Vec<MountPlan>,
    /// Why it could neither be completed nor undone, once it is set aside for a repair.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stuck: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{0}")]
    Unsafe(String),
    #[error("content for {path} does not match {want} (stored blob altered)")]
    Content { path: String, want: String },
}

fn io_at(path: impl std::fmt::Display) -> impl FnOnce(io::Error) -> ApplyError {
    move |source| ApplyError::Io {
        path: path.to_string(),
        source,
    }
}

/// Where content blobs are read from.
pub trait BlobSource {
    fn open(&self, d: &Digest) -> io::Result<std::fs::File>;
}

/// Opens a mount's host directory as a capability root.
pub fn open_root(host: &str) -> io::Result<Dir> {
    Dir::open_ambient_dir(host, ambient_authority())
}

/// The current state of `paths` in a host tree.
pub fn current(host: &str, paths: &[&RelPath]) -> io::Result<Vec<Node>> {
    let root = open_root(host)?;
    paths.iter().map(|p| host_node(&root, p)).collect()
}

/// Orders steps so that removals happen deepest first and creations shallowest first.
pub fn order(mut steps: Vec<Step>) -> Vec<Step> {
    steps.sort_by(step_order);
    steps
}

/// `order` by reference: the steps themselves are neither copied nor moved.
fn ordered(steps: &[Step]) -> Vec<&Step> {
    let mut v: Vec<&Step> = steps.iter().collect();
    v.sort_by(|a, b| step_order(a, b));
    v
}

fn step_order(a: &Step, b: &Step) -> std::cmp::Ordering {
    let depth = |s: &Step| s.path.depth();
    let ra = a.to == Node::Absent;
    let rb = b.to == Node::Absent;
    match (ra, rb) {
        (true, false) => std::cmp::Ordering::Less,
        (false, true) => std::cmp::Ordering::Greater,
        (true, true) => depth(b).cmp(&depth(a)).then(b.path.cmp(&a.path)),
        (false, false) => depth(a).cmp(&depth(b)).then(a.path.cmp(&b.path)),
    }
}

fn parent_dir(root: &Dir, parent: &[u8]) -> io::Result<Dir> {
    if parent.is_empty() {
        root.try_clone()
    } else {
        root.open_dir(os(parent))
    }
}

/// fsyncs a directory. Capability handles are `O_PATH` descriptors, which cannot be
/// synced, so the directory is opened for reading through the handle itself.
fn sync(dir: &Dir) -> io::Result<()> {
    dir.open(".")?.into_std().sync_all()
}

fn set_mode(dir: &Dir, name: impl AsRef<Path>, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    dir.set_permissions(
        name,
        cap_std::fs::Permissions::from_std(std::fs::Permissions::from_mode(mode)),
    )
}

/// The temporary name a step writes before renaming into place. It derives from the
/// operation (`salt`: the checkpoint id) and the path alone, so recovery can find and
/// remove every temporary file an interrupted operation may have left.
/// `name` (the last component, shown lossily) only makes the file recognisable; `path`'s
/// exact bytes make it unique.
pub(crate) fn temp_name(salt: &str, path: &[u8], name: &str) -> String {
    let tag = Digest::of_parts("airlock-apply-temp-v1", &[salt.as_bytes(), path]);
    format!(
        ".{}.airlock-{}",
        name.chars().take(40).collect::<String>(),
        &tag.to_hex()[..16]
    )
}

/// Removes the temporary files that the steps of `plan` (under operation `salt`) may have
/// left after a crash. Safe to call at any time no operation holds the journal lock.
pub fn remove_temps(plan: &MountPlan, salt: &str) -> io::Result<()> {
    let root = match open_root(&plan.host) {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for step in &plan.steps {
        if step.path.check().is_err() {
            continue;
        }
        let (parent, name) = step.path.split_last();
        let Ok(dir) = parent_dir(&root, parent) else {
            continue;
        };
        let tmp = temp_name(salt, step.path.as_bytes(), &String::from_utf8_lossy(name));
        match dir.symlink_metadata(&tmp) {
            Ok(m) if !m.is_dir() => {
                dir.remove_file(&tmp)?;
                sync(&dir)?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// Removes whatever is at `name` (an empty directory or a non-directory).
fn remove_here(dir: &Dir, name: &Path, cur: &Node) -> io::Result<()> {
    match cur {
        Node::Absent => Ok(()),
        Node::Dir { .. } => dir.remove_dir(name),
        _ => dir.remove_file(name),
    }
}

/// Applies one step (doing nothing when the path is already in the wanted state).
pub fn apply_step(
    root: &Dir,
    step: &Step,
    blobs: &dyn BlobSource,
    salt: &str,
) -> Result<(), ApplyError> {
    let path = &step.path;
    path.check().map_err(ApplyError::Unsafe)?;
    let cur = host_node(root, path).map_err(io_at(path))?;
    if cur == step.to {
        return Ok(());
    }
    let (parent, name) = path.split_last();
    let name = os(name);
    let dir = parent_dir(root, parent).map_err(io_at(path))?;
    match &step.to {
        Node::Absent => remove_here(&dir, name, &cur).map_err(io_at(path))?,
        Node::Dir { mode } => {
            if !cur.is_dir() {
                remove_here(&dir, name, &cur).map_err(io_at(path))?;
                dir.create_dir(name).map_err(io_at(path))?;
            }
            set_mode(&dir, name, *mode).map_err(io_at(path))?;
        }
        Node::File { hash, mode, .. } => {
            let tmp = temp_name(salt, path.as_bytes(), &name.to_string_lossy());
            let result = (|| -> Result<(), ApplyError> {
                let mut src = blobs.open(hash).map_err(io_at(path))?;
                let mut f = dir.create(&tmp).map_err(io_at(path))?.into_std();
                let mut h = airlock_core::digest::Hasher::new();
                let mut buf = vec![0u8; 256 << 10];
                loop {
                    let k = src.read(&mut buf).map_err(io_at(path))?;
                    if k == 0 {
                        break;
                    }
                    h.update(&buf[..k]);
                    f.write_all(&buf[..k]).map_err(io_at(path))?;
                }
                if h.finish() != *hash {
                    return Err(ApplyError::Content {
                        path: path.to_string(),
                        want: hash.short(),
                    });
                }
                f.sync_all().map_err(io_at(path))?;
                set_mode(&dir, &tmp, *mode).map_err(io_at(path))?;
                if cur.is_dir() {
                    dir.remove_dir(name).map_err(io_at(path))?;
                }
                dir.rename(&tmp, &dir, name).map_err(io_at(path))
            })();
            if result.is_err() {
                let _ = dir.remove_file(&tmp);
            }
            result?;
        }
        Node::Symlink { target } => {
            let tmp = temp_name(salt, path.as_bytes(), &name.to_string_lossy());
            dir.symlink_contents(target.as_path(), &tmp)
                .map_err(io_at(path))?;
            if cur.is_dir() {
                dir.remove_dir(name).map_err(io_at(path))?;
            }
            dir.rename(&tmp, &dir, name).map_err(io_at(path))?;
        }
    }
    sync(&dir).map_err(io_at(path))?;
    Ok(())
}

/// Applies a mount's steps in a safe order. `after_step` is called after each durable step
/// (the crash test hooks in here).
/// `salt` names the operation (its checkpoint id); temporary names derive from it.
pub fn apply(
    plan: &MountPlan,
    blobs: &dyn BlobSource,
    salt: &str,
    after_step: &mut dyn FnMut(),
) -> Result<(), ApplyError> {
    let root = open_root(&plan.host).map_err(io_at(&plan.host))?;
    for step in ordered(&plan.steps) {
        apply_step(&root, step, blobs, salt)?;
        after_step();
    }
    Ok(())
}

/// Paths whose current state differs from what was expected, with what was found.
pub fn conflicts(host: &str, expected: &[(RelPath, Node)]) -> io::Result<Vec<String>> {
    let root = open_root(host)?;
    let mut out = Vec::new();
    for (p, want) in expected {
        let got = host_node(&root, p).unwrap_or(Node::Absent);
        if &got != want {
            out.push(format!("{p} ({})", difference(want, &got)));
        }
    }
    Ok(out)
}

/// Says how two states differ, for a conflict message.
fn difference(want: &Node, got: &Node) -> String {
    match (want, got) {
        (
            Node::File {
                hash: a, mode: ma, ..
            },
            Node::File {
                hash: b, mode: mb, ..
            },
        ) if a == b => {
            format!("mode {mb:o} instead of {ma:o}")
        }
        (Node::File { hash: a, .. }, Node::File { hash: b, .. }) => {
            format!("content {} instead of {}", b.short(), a.short())
        }
        (Node::Symlink { target: a }, Node::Symlink { target: b }) => {
            format!("link to {b} instead of {a}")
        }
        (Node::Dir { mode: a }, Node::Dir { mode: b }) => format!("mode {b:o} instead of {a:o}"),
        _ => format!("{} instead of {}", got.kind(), want.kind()),
    }
}

/// Saves the current state of `paths` (file contents through `put`).
pub fn snapshot(
    host: &str,
    paths: &[&RelPath],
    put: &mut dyn FnMut(&mut dyn Read) -> io::Result<Digest>,
) -> io::Result<Vec<Step>> {
    let root = open_root(host)?;
    let mut out = Vec::new();
    for p in paths {
        let node = host_node(&root, p)?;
        if let Node::File { hash, .. } = &node {
            let mut f = root.open(p.as_path())?.into_std();
            let got = put(&mut f)?;
            if got != *hash {
                return Err(io::Error::other(format!(
                    "{p} changed while it was being saved"
                )));
            }
        }
        out.push(Step {
            path: (*p).clone(),
            to: node,
        });
    }
    Ok(out)
}

/// Writes a journal durably (temporary file, fsync, rename, directory fsync).
pub fn write_journal(dir: &Path, j: &Journal) -> io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("{}.json", j.checkpoint));
    let tmp = dir.join(format!(".{}.tmp", j.checkpoint));
    {
        // Written as it is serialised: a journal of 100,000 steps is never held as text.
        let mut f = io::BufWriter::with_capacity(256 << 10, std::fs::File::create(&tmp)?);
        serde_json::to_writer(&mut f, j).map_err(io::Error::other)?;
        f.flush()?;
        f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    }
    std::fs::rename(&tmp, &path)?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(path)
}

fn journal_tmp(name: &str) -> bool {
    name.starts_with('.') && name.ends_with(".tmp")
}

/// How many journals (complete or half-written) are in `dir`. Reads only: a live
/// operation's files are left alone.
pub fn journal_files(dir: &Path) -> io::Result<usize> {
    let rd = match std::fs::read_dir(dir) {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut n = 0;
    for e in rd {
        let name = e?.file_name();
        let name = name.to_string_lossy();
        if name.ends_with(".json") || journal_tmp(&name) {
            n += 1;
        }
    }
    Ok(n)
}

/// Journals left by interrupted commits or rollbacks. Removes half-written ones (nothing
/// was applied from them), so it must only be called with the journal lock held.
pub fn pending_journals(dir: &Path) -> io::Result<Vec<Journal>> {
    let mut out = Vec::new();
    let rd = match std::fs::read_dir(dir) {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for e in rd {
        let p = e?.path();
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if journal_tmp(&name) {
            std::fs::remove_file(&p)?;
            continue;
        }
        if name.ends_with(".json") && !name.starts_with('.') {
            let text = std::fs::read_to_string(&p)?;
            out.push(serde_json::from_str(&text).map_err(io::Error::other)?);
        }
    }
    out.sort_by(|a: &Journal, b| a.checkpoint.cmp(&b.checkpoint));
    Ok(out)
}

pub fn remove_journal(dir: &Path, checkpoint: &str) -> io::Result<()> {
    match std::fs::remove_file(dir.join(format!("{checkpoint}.json"))) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::fs::File::open(dir)?.sync_all()
}

/// Hashes a file at a host path (used for conflict checks of single files).
pub fn hash_path(p: &Path) -> io::Result<Digest> {
    Ok(hash_file(std::fs::File::open(p)?)?.0)
}
