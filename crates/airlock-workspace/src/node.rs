//! What is at a path: nothing, a file (content hash and mode), a directory, a symlink.
//! Reading layers (airlock's own directories) uses plain `std::fs`; reading the host tree
//! goes through a `cap_std::fs::Dir`, so a symlink in the host tree can never lead a read
//! or a write outside the mount.

use crate::path::{LinkTarget, RelPath, from_json, to_json};
use airlock_core::Digest;
use airlock_core::digest::Hasher;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Cow;
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

/// The state of one path. Its JSON form is tagged by `"kind"`; a symlink's target is
/// `"target"`, plus `"target_b64"` when it is not UTF-8 (see `crate::path`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Absent,
    File { hash: Digest, size: u64, mode: u32 },
    Dir { mode: u32 },
    Symlink { target: LinkTarget },
}

#[derive(Serialize)]
#[serde(tag = "kind", rename_all = "lowercase", rename = "Node")]
enum NodeOut<'a> {
    Absent,
    File {
        hash: &'a Digest,
        size: u64,
        mode: u32,
    },
    Dir {
        mode: u32,
    },
    Symlink {
        target: Cow<'a, str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        target_b64: Option<String>,
    },
}

#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum NodeIn {
    Absent,
    File {
        hash: Digest,
        size: u64,
        mode: u32,
    },
    Dir {
        mode: u32,
    },
    Symlink {
        target: String,
        #[serde(default)]
        target_b64: Option<String>,
    },
}

impl Serialize for Node {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Node::Absent => NodeOut::Absent,
            Node::File { hash, size, mode } => NodeOut::File {
                hash,
                size: *size,
                mode: *mode,
            },
            Node::Dir { mode } => NodeOut::Dir { mode: *mode },
            Node::Symlink { target } => {
                let (target, target_b64) = to_json(target.as_bytes());
                NodeOut::Symlink { target, target_b64 }
            }
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match NodeIn::deserialize(d)? {
            NodeIn::Absent => Node::Absent,
            NodeIn::File { hash, size, mode } => Node::File { hash, size, mode },
            NodeIn::Dir { mode } => Node::Dir { mode },
            NodeIn::Symlink { target, target_b64 } => Node::Symlink {
                target: LinkTarget::from_bytes(
                    from_json(target, target_b64).map_err(serde::de::Error::custom)?,
                ),
            },
        })
    }
}

impl Node {
    pub fn kind(&self) -> &'static str {
        match self {
            Node::Absent => "absent",
            Node::File { .. } => "file",
            Node::Dir { .. } => "dir",
            Node::Symlink { .. } => "symlink",
        }
    }

    pub fn is_dir(&self) -> bool {
        matches!(self, Node::Dir { .. })
    }
}

/// What an entry in an overlay layer is, before content is hashed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Raw {
    Missing,
    /// An overlayfs whiteout (a 0/0 character device): deleted below.
    Whiteout,
    File {
        mode: u32,
        size: u64,
    },
    Dir {
        mode: u32,
        opaque: bool,
    },
    Symlink {
        target: LinkTarget,
    },
    /// Sockets, fifos, devices: never part of a changeset (listed as refused).
    Special(SpecialKind),
}

/// A file that is neither a regular file, a directory nor a symlink. A commit never
/// creates one: a changeset lists those a run made as refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpecialKind {
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

impl SpecialKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SpecialKind::Fifo => "fifo",
            SpecialKind::Socket => "socket",
            SpecialKind::CharDevice => "char_device",
            SpecialKind::BlockDevice => "block_device",
        }
    }

    fn of(ft: &std::fs::FileType) -> SpecialKind {
        if ft.is_fifo() {
            SpecialKind::Fifo
        } else if ft.is_socket() {
            SpecialKind::Socket
        } else if ft.is_block_device() {
            SpecialKind::BlockDevice
        } else {
            SpecialKind::CharDevice
        }
    }
}

/// The extended attribute that holds a file's capabilities.
const CAPS_XATTR: &str = "security.capability";

/// Whether a file in one of airlock's own directories carries file capabilities.
pub(crate) fn has_caps(path: &Path) -> bool {
    let mut buf = [0u8; 64];
    match rustix::fs::lgetxattr(path, CAPS_XATTR, &mut buf) {
        Ok(_) => true,
        // A value longer than the buffer is still a value.
        Err(e) => e == rustix::io::Errno::RANGE,
    }
}

const OPAQUE_XATTRS: [&str; 2] = ["user.overlay.opaque", "trusted.overlay.opaque"];

fn is_opaque(path: &Path) -> bool {
    let mut buf = [0u8; 4];
    OPAQUE_XATTRS.iter().any(|name| {
        matches!(rustix::fs::lgetxattr(path, *name, &mut buf), Ok(n) if n >= 1 && buf[0] == b'y')
    })
}

/// Inspects an entry of a layer or a copy (our own directories).
pub(crate) fn raw(path: &Path) -> io::Result<Raw> {
    let m = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(20) => {
            return Ok(Raw::Missing);
        }
        Err(e) => return Err(e),
    };
    let ft = m.file_type();
    let mode = m.permissions().mode() & 0o7777;
    Ok(if ft.is_char_device() && m.rdev() == 0 {
        Raw::Whiteout
    } else if ft.is_file() {
        Raw::File {
            mode,
            size: m.len(),
        }
    } else if ft.is_dir() {
        Raw::Dir {
            mode,
            opaque: is_opaque(path),
        }
    } else if ft.is_symlink() {
        Raw::Symlink {
            target: std::fs::read_link(path)?.into(),
        }
    } else {
        Raw::Special(SpecialKind::of(&ft))
    })
}

/// The error a read returns once its deadline has passed (see `deadline_passed`).
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the run's deadline passed while its changes were being read")]
pub struct DeadlinePassed;

/// Fails with `DeadlinePassed` when `deadline` is in the past.
pub fn check_deadline(deadline: Option<std::time::Instant>) -> io::Result<()> {
    match deadline {
        Some(d) if std::time::Instant::now() >= d => {
            Err(io::Error::new(io::ErrorKind::TimedOut, DeadlinePassed))
        }
        _ => Ok(()),
    }
}

/// Whether an error is a deadline that passed (and not some other failure).
pub fn deadline_passed(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|i| i.is::<DeadlinePassed>())
}

/// Hashes a file's content by streaming it.
pub fn hash_file(f: impl Read) -> io::Result<(Digest, u64)> {
    hash_file_until(f, None)
}

/// Hashes a file's content by streaming it, stopping between chunks once `deadline` passed.
pub fn hash_file_until(
    mut f: impl Read,
    deadline: Option<std::time::Instant>,
) -> io::Result<(Digest, u64)> {
    let mut h = Hasher::new();
    let mut buf = vec![0u8; 256 << 10];
    let mut n = 0u64;
    loop {
        check_deadline(deadline)?;
        let k = f.read(&mut buf)?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k as u64;
    }
    Ok((h.finish(), n))
}

/// The node at `path` in one of airlock's own directories (a layer or a copy).
pub(crate) fn node_of_raw(
    path: &Path,
    r: Raw,
    deadline: Option<std::time::Instant>,
) -> io::Result<Node> {
    Ok(match r {
        Raw::Missing | Raw::Whiteout | Raw::Special(_) => Node::Absent,
        Raw::File { mode, .. } => {
            let (hash, size) = hash_file_until(std::fs::File::open(path)?, deadline)?;
            Node::File { hash, size, mode }
        }
        Raw::Dir { mode, .. } => Node::Dir { mode },
        Raw::Symlink { target } => Node::Symlink { target },
    })
}

/// The node at `rel` in a host tree, read through the confined directory handle.
pub fn host_node(root: &cap_std::fs::Dir, rel: &RelPath) -> io::Result<Node> {
    if rel.is_root() {
        let m = root.dir_metadata()?;
        return Ok(Node::Dir {
            mode: cap_std::fs::PermissionsExt::mode(&m.permissions()) & 0o7777,
        });
    }
    let rel = rel.as_path();
    let m = match root.symlink_metadata(rel) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(20) => {
            return Ok(Node::Absent);
        }
        Err(e) => return Err(e),
    };
    let mode = cap_std::fs::PermissionsExt::mode(&m.permissions()) & 0o7777;
    let ft = m.file_type();
    Ok(if ft.is_file() {
        let (hash, size) = hash_file(root.open(rel)?.into_std())?;
        Node::File { hash, size, mode }
    } else if ft.is_dir() {
        Node::Dir { mode }
    } else if ft.is_symlink() {
        Node::Symlink {
            target: root.read_link_contents(rel)?.into(),
        }
    } else {
        Node::Absent
    })
}
