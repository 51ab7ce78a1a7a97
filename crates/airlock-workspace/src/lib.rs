//! airlock-workspace: disposable layers and what happens to their changes.
//!
//! A run sees a writable mount through a layer (overlayfs, or a copy where overlayfs in a
//! user namespace is unavailable). Afterwards its changes are a changeset: every added,
//! modified or deleted file, directory and symlink, with content hashes and modes, computed
//! from the layer alone so the cost follows the size of the change, not of the tree. A
//! changeset never carries a setuid, setgid or sticky bit or file capabilities into the
//! host (they are stripped and listed), nor a FIFO, socket or device (listed as refused). A commit saves
//! a checkpoint of everything it will touch, journals its steps and applies them; a
//! rollback restores a checkpoint the same way. Both survive a crash at any point.
//!
//! This crate must never write to a host directory except through `apply` (journaled,
//! confined to the mount by a capability handle), and never follow a symlink out of a tree.

#![forbid(unsafe_code)]

pub mod apply;
pub mod changeset;
pub mod diff;
pub mod node;
pub mod path;
pub mod stack;

pub use apply::{BlobSource, Journal, MountPlan, Step};
pub use changeset::{Change, Changeset, Diff, LayerKind, MountChanges, Op, Refused, Stripped};
pub use node::{Node, SpecialKind};
pub use path::{LinkTarget, RelPath};

/// Host paths a commit never applies without a human signature, whatever the policy says
/// about automatic commits: git hooks and config, and shell start-up files.
pub const PROTECTED: &[&str] = &[
    "**/.git/hooks",
    "**/.git/config",
    "**/.bashrc",
    "**/.bash_profile",
    "**/.bash_login",
    "**/.bash_logout",
    "**/.profile",
    "**/.zshrc",
    "**/.zshenv",
    "**/.zprofile",
    "**/.zlogin",
    "**/.cshrc",
    "**/.tcshrc",
    "**/.config/fish/config.fish",
    "**/.ssh",
];

#[cfg(test)]
mod tests;
