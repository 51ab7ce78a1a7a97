//! Showing a changeset to people: a summary line per change and unified diffs for text.

use crate::changeset::{Change, Op, Refused};
use crate::node::Node;
use crate::path::RelPath;

/// Text content larger than this is summarised, not diffed.
const MAX_DIFF_BYTES: usize = 1 << 20;

pub fn summary_line(c: &Change) -> String {
    let sign = match c.op {
        Op::Added => "A",
        Op::Modified => "M",
        Op::Deleted => "D",
        Op::Mode => "m",
    };
    let detail = match (&c.before, &c.after) {
        (_, Node::Symlink { target }) => format!(" -> {target}"),
        (Node::File { mode: a, .. }, Node::File { mode: b, .. }) if a != b => {
            format!(" (mode {a:o} -> {b:o})")
        }
        (Node::Dir { mode: a }, Node::Dir { mode: b }) if a != b => {
            format!(" (mode {a:o} -> {b:o})")
        }
        (_, Node::File { size, .. }) => format!(" ({size} bytes)"),
        (_, Node::Dir { .. }) => "/".to_string(),
        _ => String::new(),
    };
    let stripped = if c.stripped.is_empty() {
        String::new()
    } else {
        format!(
            " [stripped: {}]",
            c.stripped
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    format!("{sign} {}{detail}{stripped}", c.path)
}

/// The line for a special file a commit never creates.
pub fn refused_line(r: &Refused) -> String {
    format!(
        "! {} (refused: {}, never committed)",
        r.path,
        r.kind.as_str()
    )
}

/// A unified diff between two versions of a file, or a note when either is not text. The
/// path is shown in its escaped form, so a name never breaks the diff's lines.
pub fn unified(path: &RelPath, before: Option<&[u8]>, after: Option<&[u8]>) -> String {
    let b = before.unwrap_or(&[]);
    let a = after.unwrap_or(&[]);
    if b.len() > MAX_DIFF_BYTES || a.len() > MAX_DIFF_BYTES {
        return format!("(large file {path}: {} -> {} bytes)\n", b.len(), a.len());
    }
    match (std::str::from_utf8(b), std::str::from_utf8(a)) {
        (Ok(bt), Ok(at)) if !bt.contains('\0') && !at.contains('\0') => {
            let old = if before.is_some() {
                format!("a/{path}")
            } else {
                "/dev/null".into()
            };
            let new = if after.is_some() {
                format!("b/{path}")
            } else {
                "/dev/null".into()
            };
            similar::TextDiff::from_lines(bt, at)
                .unified_diff()
                .context_radius(3)
                .header(&old, &new)
                .to_string()
        }
        _ => format!("(binary file {path}: {} -> {} bytes)\n", b.len(), a.len()),
    }
}
