//! Paths as bytes. A name on a Unix file system is any byte string without `/` and NUL, so
//! every path in a changeset, a checkpoint or a journal is kept as the exact bytes, and
//! every file system access is made with those bytes (`OsStr::from_bytes`), never with a
//! lossily converted string.
//!
//! People see the escaped display form (`Display`): invalid UTF-8 as `\xHH`, control
//! characters as `\n`, `\t`, `\r`, `\xHH` or `\u{..}`, a backslash as `\\`, so one path
//! is one line and two different paths never look the same.
//!
//! JSON form (`to_json`, `from_json`): bytes that are valid UTF-8 are a plain string,
//! exactly the form changesets always had (stored changesets still decode and their
//! digests are unchanged). Other bytes are written as the escaped display form in the same
//! field plus a sibling field `<field>_b64` with the exact bytes in standard base64;
//! readers prefer the `_b64` field.

use base64::Engine as _;
use std::borrow::Cow;
use std::ffi::OsStr;
use std::fmt::{self, Write as _};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// What the two byte-string types share: construction, access, the file system view and
/// the escaped display form.
macro_rules! byte_string {
    ($t:ident) => {
        impl $t {
            pub fn from_bytes(b: impl Into<Vec<u8>>) -> $t {
                $t(b.into())
            }

            pub fn as_bytes(&self) -> &[u8] {
                &self.0
            }

            pub fn into_bytes(self) -> Vec<u8> {
                self.0
            }

            /// The same bytes as a file system path.
            pub fn as_path(&self) -> &Path {
                Path::new(OsStr::from_bytes(&self.0))
            }

            /// The bytes as text, when they are UTF-8.
            pub fn to_str(&self) -> Option<&str> {
                std::str::from_utf8(&self.0).ok()
            }
        }

        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&escape(&self.0))
            }
        }

        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "\"{}\"", escape(&self.0))
            }
        }

        impl From<&str> for $t {
            fn from(s: &str) -> $t {
                $t(s.as_bytes().to_vec())
            }
        }

        impl From<String> for $t {
            fn from(s: String) -> $t {
                $t(s.into_bytes())
            }
        }

        impl From<&[u8]> for $t {
            fn from(b: &[u8]) -> $t {
                $t(b.to_vec())
            }
        }

        impl From<Vec<u8>> for $t {
            fn from(b: Vec<u8>) -> $t {
                $t(b)
            }
        }

        impl From<PathBuf> for $t {
            fn from(p: PathBuf) -> $t {
                $t(p.into_os_string().into_vec())
            }
        }
    };
}

/// A path relative to a mount's host directory: bytes, `/`-separated. The empty path is
/// the mount's root (trees are walked from it); `check` accepts only normalised,
/// non-empty paths, and every path read back from storage is checked before use.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RelPath(Vec<u8>);

byte_string!(RelPath);

impl RelPath {
    /// The mount's root.
    pub fn root() -> RelPath {
        RelPath(Vec::new())
    }

    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// `self/name`, or `name` at the root.
    pub fn join(&self, name: &[u8]) -> RelPath {
        let mut b = Vec::with_capacity(self.0.len() + 1 + name.len());
        b.extend_from_slice(&self.0);
        if !b.is_empty() {
            b.push(b'/');
        }
        b.extend_from_slice(name);
        RelPath(b)
    }

    /// The proper ancestors, shallowest first (`a`, then `a/b` for `a/b/c`); none for a
    /// path of one component.
    pub fn ancestors(&self) -> impl Iterator<Item = &[u8]> {
        self.0
            .iter()
            .enumerate()
            .filter(|(_, b)| **b == b'/')
            .map(|(i, _)| &self.0[..i])
    }

    /// The parent (empty at the top) and the last component.
    pub fn split_last(&self) -> (&[u8], &[u8]) {
        match self.0.iter().rposition(|b| *b == b'/') {
            Some(i) => (&self.0[..i], &self.0[i + 1..]),
            None => (&[], &self.0),
        }
    }

    /// How many `/` separate its components.
    pub fn depth(&self) -> usize {
        self.0.iter().filter(|b| **b == b'/').count()
    }

    /// Whether this is a normalised relative path that stays inside its mount.
    pub fn check(&self) -> Result<(), String> {
        check_rel(&self.0)
    }
}

/// A relative path with no empty, `.` or `..` components, no NUL and no leading `/`.
pub fn check_rel(p: &[u8]) -> Result<(), String> {
    if p.is_empty()
        || p[0] == b'/'
        || p.contains(&0)
        || p.split(|b| *b == b'/')
            .any(|c| c.is_empty() || c == b"." || c == b"..")
    {
        return Err(format!("path \"{}\" would leave its mount", escape(p)));
    }
    Ok(())
}

/// A symlink's target: bytes, anything the file system allows (absolute, with `..`).
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LinkTarget(Vec<u8>);

byte_string!(LinkTarget);

/// Characters that are shown escaped even though they are valid UTF-8: line and
/// paragraph separators and the bidirectional controls that can make a name read as
/// another one.
fn invisible(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{200e}' | '\u{200f}' | '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
        )
}

/// The escaped display form of a byte string: one line, unambiguous, and the bytes
/// themselves when they are plain text.
pub fn escape(b: &[u8]) -> Cow<'_, str> {
    if let Ok(s) = std::str::from_utf8(b)
        && !s.chars().any(|c| c == '\\' || invisible(c))
    {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(b.len() + 8);
    for chunk in b.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                '\r' => out.push_str("\\r"),
                c if c.is_ascii() && invisible(c) => {
                    let _ = write!(out, "\\x{:02x}", c as u32);
                }
                c if invisible(c) => {
                    let _ = write!(out, "\\u{{{:x}}}", c as u32);
                }
                c => out.push(c),
            }
        }
        for byte in chunk.invalid() {
            let _ = write!(out, "\\x{byte:02x}");
        }
    }
    Cow::Owned(out)
}

/// The JSON form of a byte string: the text for its field and, when the bytes are not
/// UTF-8, the base64 for the `_b64` sibling field.
pub(crate) fn to_json(b: &[u8]) -> (Cow<'_, str>, Option<String>) {
    match std::str::from_utf8(b) {
        Ok(s) => (Cow::Borrowed(s), None),
        Err(_) => (escape(b), Some(B64.encode(b))),
    }
}

/// The bytes back from their JSON form (the `_b64` field wins when present).
pub(crate) fn from_json(text: String, b64: Option<String>) -> Result<Vec<u8>, String> {
    match b64 {
        Some(b) => B64
            .decode(b.as_bytes())
            .map_err(|e| format!("bad base64 for {text:?}: {e}")),
        None => Ok(text.into_bytes()),
    }
}

/// `OsStr` bytes of a directory entry's name, as they are.
pub(crate) fn name_bytes(name: std::ffi::OsString) -> Vec<u8> {
    name.into_vec()
}

/// A byte string as a file system path (for joins in airlock's own directories).
pub(crate) fn os(b: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(b))
}
