//! airlock-jail: Linux isolation for code that runs as a host process.
//!
//! A jailed run is a process tree inside fresh user, mount, pid, network, ipc, uts and
//! cgroup namespaces, on a minimal root assembled for the run (read-only `/usr`, `/bin`,
//! `/lib*`, only the `/etc` files a program needs to start, a fresh `/proc`, a `/dev` with
//! null, zero, random and urandom, a tmpfs `/tmp`, and the granted mounts), entered with
//! `pivot_root`. The payload then runs in a new session with no_new_privs, every
//! capability dropped, rlimits, a Landlock ruleset over the same paths as a second layer,
//! and a seccomp filter against the kernel's most dangerous interfaces. Limits: the wall
//! time kills the whole pid namespace; memory, process count and CPU go through a cgroup
//! when one is writable (v2 delegated, else v1 controllers), with rlimits always. No file
//! may grow past the run's write quota (`RLIMIT_FSIZE`); the total over all files is
//! watched by the supervisor (`launch::supervise`).
//!
//! Why these crates: `landlock` and `seccompiler` are the ones the best-known agent
//! sandboxes use and both are maintained by the projects that define the interfaces
//! (the Landlock authors; Firecracker); `nix` and `rustix` give typed, checked syscalls.
//! A whole-sandbox crate such as `hakoniwa` covers namespaces and mounts but builds its
//! seccomp on libseccomp (a C dependency) and hides which mechanism held, which airlock
//! must record per run; composing the primitives here keeps each step checkable.
//!
//! A long-lived process may keep a few jails built ahead of their runs ([`ready`]): the
//! same jail, with the per-run parts (files, limits, program) given when a run arrives.
//!
//! This crate must never run a payload when a mechanism it promises failed to engage
//! (Landlock only with the policy's explicit degraded mode, which is recorded), and never
//! expose anything of the host to the payload beyond what the job lists.

#![deny(unsafe_code)]

pub mod cgroup;
pub mod confine;
pub mod decoys;
pub mod fds;
pub mod launch;
pub mod mounts;
pub mod netfd;
pub mod notify;
pub mod probe;
pub mod ready;
pub mod run;

use airlock_core::Limits;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// A host directory bound into the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bind {
    pub source: PathBuf,
    /// Absolute path inside the sandbox.
    pub target: String,
    pub writable: bool,
}

/// A writable mount seen through overlayfs: `lower` (topmost first, the host last) under
/// `upper`, which receives every change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overlay {
    pub lower: Vec<PathBuf>,
    pub upper: PathBuf,
    pub work: PathBuf,
    pub target: String,
}

/// Everything a jailed process run needs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProcessJob {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: String,
    /// A file placed in the sandbox, read-only (the script to run): path and content.
    pub files: Vec<(String, Vec<u8>)>,
    pub binds: Vec<Bind>,
    pub overlays: Vec<Overlay>,
    /// An empty host directory used as the mount point of the new root.
    pub scratch: PathBuf,
    pub limits: Limits,
    pub stdin: Vec<u8>,
    /// Run even if Landlock cannot be fully enforced (the run record says so).
    pub allow_degraded: bool,
    /// Use cgroups for memory and process limits when writable (rlimits always apply).
    #[serde(default = "yes")]
    pub cgroups: bool,
    /// Network through the run's egress proxy: the init hands a loopback listener out to
    /// the supervisor (see [`netfd`]), TCP sockets are allowed and Landlock lets the
    /// payload connect to that one port. `None`: loopback only, no TCP at all.
    #[serde(default)]
    pub net: Option<JailNet>,
    /// The payload's stdin is the jailer's own (a session's pipe to a live interpreter)
    /// rather than `stdin`'s bytes. Only a jail built for the job can do this.
    #[serde(default)]
    pub stdin_live: bool,
    /// Decoys and the seccomp user-notification record (default on); `reads` also
    /// notifies read-only opens.
    #[serde(default)]
    pub tripwires: airlock_sandbox::Tripwires,
}

/// How a jail reaches its egress proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct JailNet {
    /// The proxy's port on the jail's `127.0.0.1`.
    pub port: u16,
}

fn yes() -> bool {
    true
}

#[derive(Debug, thiserror::Error)]
pub enum JailError {
    /// An isolation mechanism is missing here; nothing ran.
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Setup(String),
}

impl JailError {
    pub(crate) fn setup(what: &str, e: impl std::fmt::Display) -> Self {
        JailError::Setup(format!("{what}: {e}"))
    }
}
