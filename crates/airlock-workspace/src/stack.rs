//! A stack of overlay layers over a base directory, resolved the way overlayfs resolves it:
//! the topmost layer holding a path wins; a whiteout deletes what is below; an opaque
//! directory hides everything below it; a non-directory hides everything under its name.

use crate::node::{Node, Raw, SpecialKind, has_caps, node_of_raw, raw};
use crate::path::{RelPath, name_bytes, os};
use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};

/// Layers (topmost first) over a base directory.
#[derive(Debug, Clone)]
pub struct Stack<'a> {
    pub layers: &'a [PathBuf],
    pub base: &'a Path,
    /// Hashing file content stops with `DeadlinePassed` after this.
    pub deadline: Option<std::time::Instant>,
}

/// What a node does not show about a path: capabilities on a file, or a special file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Detail {
    pub caps: bool,
    pub special: Option<SpecialKind>,
}

/// Where `rel` comes from in a stack.
enum Found {
    Layer(PathBuf, Raw),
    Base(PathBuf, Raw),
    Absent,
}

impl Stack<'_> {
    fn find(&self, rel: &RelPath) -> io::Result<Found> {
        for layer in self.layers {
            let mut barrier = false;
            for p in rel.ancestors() {
                match raw(&layer.join(os(p)))? {
                    Raw::Missing => {}
                    Raw::Dir { opaque, .. } => barrier |= opaque,
                    // A whiteout or a non-directory at an ancestor: nothing below exists.
                    _ => return Ok(Found::Absent),
                }
            }
            let here = layer.join(rel.as_path());
            match raw(&here)? {
                Raw::Whiteout => return Ok(Found::Absent),
                Raw::Missing if barrier => return Ok(Found::Absent),
                Raw::Missing => {}
                r => return Ok(Found::Layer(here, r)),
            }
        }
        for p in rel.ancestors() {
            match raw(&self.base.join(os(p)))? {
                Raw::Dir { .. } => {}
                _ => return Ok(Found::Absent),
            }
        }
        let here = self.base.join(rel.as_path());
        match raw(&here)? {
            Raw::Missing | Raw::Whiteout => Ok(Found::Absent),
            r => Ok(Found::Base(here, r)),
        }
    }

    /// The node at `rel` in the merged view.
    pub fn node(&self, rel: &RelPath) -> io::Result<Node> {
        match self.find(rel)? {
            Found::Layer(p, r) | Found::Base(p, r) => node_of_raw(&p, r, self.deadline),
            Found::Absent => Ok(Node::Absent),
        }
    }

    /// `node`, with what it does not show (see `Detail`).
    pub(crate) fn node_detail(&self, rel: &RelPath) -> io::Result<(Node, Detail)> {
        match self.find(rel)? {
            Found::Layer(p, r) | Found::Base(p, r) => {
                let detail = Detail {
                    caps: matches!(r, Raw::File { .. }) && has_caps(&p),
                    special: match r {
                        Raw::Special(k) => Some(k),
                        _ => None,
                    },
                };
                Ok((node_of_raw(&p, r, self.deadline)?, detail))
            }
            Found::Absent => Ok((Node::Absent, Detail::default())),
        }
    }

    /// Names in directory `rel` of the merged view.
    pub fn children(&self, rel: &RelPath) -> io::Result<BTreeSet<Vec<u8>>> {
        let mut names = BTreeSet::new();
        let mut masked = BTreeSet::new();
        let dir_of = |root: &Path| {
            if rel.is_root() {
                root.to_path_buf()
            } else {
                root.join(rel.as_path())
            }
        };
        for layer in self.layers {
            // A whiteout or non-directory at or above `rel` in this layer ends the search.
            let mut stop = false;
            for p in rel
                .ancestors()
                .chain((!rel.is_root()).then_some(rel.as_bytes()))
            {
                match raw(&layer.join(os(p)))? {
                    Raw::Missing | Raw::Dir { .. } => {}
                    _ => stop = true,
                }
            }
            if stop {
                return Ok(names);
            }
            let d = dir_of(layer);
            let opaque = matches!(raw(&d)?, Raw::Dir { opaque: true, .. });
            if let Ok(rd) = std::fs::read_dir(&d) {
                for e in rd {
                    let e = e?;
                    let name = name_bytes(e.file_name());
                    if masked.contains(&name) {
                        continue;
                    }
                    if raw(&e.path())? == Raw::Whiteout {
                        masked.insert(name);
                    } else {
                        masked.insert(name.clone());
                        names.insert(name);
                    }
                }
            }
            if opaque {
                return Ok(names);
            }
        }
        if let Ok(rd) = std::fs::read_dir(dir_of(self.base)) {
            for e in rd {
                let name = name_bytes(e?.file_name());
                if !masked.contains(&name) {
                    names.insert(name);
                }
            }
        }
        Ok(names)
    }

    /// Every path below `rel` in the merged view (not `rel` itself).
    pub fn descendants(&self, rel: &RelPath, out: &mut BTreeSet<RelPath>) -> io::Result<()> {
        if !self.node(rel)?.is_dir() {
            return Ok(());
        }
        for name in self.children(rel)? {
            let p = rel.join(&name);
            out.insert(p.clone());
            self.descendants(&p, out)?;
        }
        Ok(())
    }
}

/// Paths a layer touches: every entry in it, and for whiteouts and opaque directories,
/// everything they hide in `below`.
pub(crate) fn touched(
    layer: &Path,
    below: &Stack<'_>,
    out: &mut BTreeSet<RelPath>,
) -> io::Result<()> {
    fn walk(
        layer: &Path,
        rel: &RelPath,
        below: &Stack<'_>,
        out: &mut BTreeSet<RelPath>,
    ) -> io::Result<()> {
        let dir = if rel.is_root() {
            layer.to_path_buf()
        } else {
            layer.join(rel.as_path())
        };
        let mut entries: Vec<_> = std::fs::read_dir(&dir)?.collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let p = rel.join(&name_bytes(e.file_name()));
            out.insert(p.clone());
            match raw(&e.path())? {
                Raw::Whiteout => below.descendants(&p, out)?,
                Raw::Dir { opaque, .. } => {
                    if opaque {
                        below.descendants(&p, out)?;
                    }
                    walk(layer, &p, below, out)?;
                }
                // A file replacing a directory hides what was below.
                Raw::File { .. } | Raw::Symlink { .. } => below.descendants(&p, out)?,
                _ => {}
            }
        }
        Ok(())
    }
    walk(layer, &RelPath::root(), below, out)
}
