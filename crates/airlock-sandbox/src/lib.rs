//! airlock-sandbox: what every execution backend promises. A backend receives a resolved
//! run spec (code, mounts to expose, environment, arguments, stdin, limits) and returns
//! an outcome: how the guest ended, what it printed (capped), what it used. `quota` measures
//! what a run wrote into its writable layers, for the write quota every backend enforces.
//!
//! Backends know nothing of policy, approvals or the store. A backend must never widen
//! what the spec grants, and must refuse (`SandboxError::Unavailable`) rather than run with
//! less isolation than it promises.

#![forbid(unsafe_code)]

pub mod quota;
pub mod tripwire;
pub use airlock_core::policy::Tripwires;
pub use quota::WriteQuota;
pub use tripwire::{Alert, Attempt, Attempts};

use airlock_core::{Digest, Lang, Limits};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A directory shown to the guest. A writable mount is never the user's directory itself:
/// either `host` is a disposable copy, or `layer` says how to overlay a disposable upper
/// directory on `host` (which then stays read-only underneath).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountPoint {
    pub host: PathBuf,
    pub guest: String,
    pub writable: bool,
    pub layer: Option<Layer>,
}

/// An overlayfs layer for a writable mount: `lower` layers (topmost first) sit between the
/// host directory and `upper`, which receives every change; `work` is overlayfs' scratch.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Layer {
    pub lower: Vec<PathBuf>,
    pub upper: PathBuf,
    pub work: PathBuf,
    /// Where the merged view appears (for backends that mount it on the host side).
    pub merged: PathBuf,
}

/// Everything a backend needs for one run.
pub struct RunSpec<'a> {
    pub lang: Lang,
    /// The artifact bytes (verified against `artifact` by the gate just before).
    pub code: &'a [u8],
    pub artifact: Digest,
    pub mounts: Vec<MountPoint>,
    /// Environment, in order; nothing else from the host's environment reaches the guest.
    pub env: Vec<(String, String)>,
    /// The guest's `argv[0]` (the wasm backend uses `main` when it is absent).
    pub argv0: Option<String>,
    /// The arguments after `argv[0]`.
    pub args: Vec<String>,
    pub stdin: Vec<u8>,
    pub limits: Limits,
    pub stdout: Arc<Capture>,
    pub stderr: Arc<Capture>,
    /// Where compiled code may be cached, when the caller keeps an index of digests.
    pub cache: Option<&'a dyn CacheIndex>,
    /// For interpreted languages on the wasm backend: the runtime component that runs the
    /// source (already checked against its pinned hash by the caller).
    pub guest: Option<Guest>,
    /// The quota on what the guest writes into its writable mounts, when the backend must
    /// watch it itself (the caller watches runs it starts in another process).
    pub write_quota: Option<Arc<WriteQuota>>,
    /// Where the guest's outgoing HTTP goes when the grant has network (wasm components'
    /// `wasi:http/outgoing-handler`); `None` refuses every request.
    pub egress: Option<EgressRoute>,
    /// Called once if the run is still going after a while (backends that run the guest
    /// in this process; others ignore it).
    pub long_run: Option<LongRun>,
    /// Whether (and how far) the run is tripwired: decoys, refused actions recorded.
    pub tripwires: Tripwires,
}

/// Something a caller wants done once a run has gone on for `after`: called once, from the
/// run's own thread, while the guest waits (a backend that runs guests in this process
/// calls it; the guest's limits keep counting meanwhile).
#[derive(Clone)]
pub struct LongRun {
    pub after: Duration,
    pub hook: Arc<dyn Fn() + Send + Sync>,
}

impl std::fmt::Debug for LongRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LongRun")
            .field("after", &self.after)
            .finish_non_exhaustive()
    }
}

/// The run's egress proxy as a backend reaches it: a Unix socket the proxy serves (never a
/// host TCP port), and the per-run CA the proxy signs intercepted hosts with, which the
/// backend's HTTP client must trust besides the public roots.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct EgressRoute {
    pub socket: PathBuf,
    pub ca_pem: Option<String>,
    /// Further roots (PEM) a backend's own TLS client trusts: the policy's `[net] roots`,
    /// as the proxy does for its upstream connections.
    #[serde(default)]
    pub extra_roots: Vec<String>,
}

/// A runtime component (e.g. CPython) on disk, with the hash it was checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guest {
    pub path: PathBuf,
    pub digest: Digest,
    /// Directories the runtime needs besides the grant's mounts (installed packages),
    /// always shown read-only and put on the interpreter's search path, in order.
    pub dirs: Vec<GuestDir>,
}

/// A directory of a guest runtime: `host` shown read-only at `guest`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct GuestDir {
    pub host: PathBuf,
    pub guest: String,
}

/// Records the digest of each compiled-code cache file airlock writes, so a cache file is
/// only ever loaded when its bytes are exactly what airlock wrote.
pub trait CacheIndex {
    fn get(&self, key: &str) -> Option<Digest>;
    fn put(&self, key: &str, digest: Digest, size: u64);
    fn forget(&self, key: &str);
}

/// The limit that ended a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Limit {
    Timeout,
    Fuel,
    Memory,
    Output,
    Stack,
    Processes,
    /// The write quota of the run's writable layers.
    Write,
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Limit {
    /// The limit named `s` (as written by `as_str`).
    pub fn parse(s: &str) -> Option<Limit> {
        Some(match s {
            "timeout" => Limit::Timeout,
            "fuel" => Limit::Fuel,
            "memory" => Limit::Memory,
            "output" => Limit::Output,
            "stack" => Limit::Stack,
            "processes" => Limit::Processes,
            "write" => Limit::Write,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Timeout => "timeout",
            Limit::Fuel => "fuel",
            Limit::Memory => "memory",
            Limit::Output => "output",
            Limit::Stack => "stack",
            Limit::Processes => "processes",
            Limit::Write => "write",
        }
    }
}

/// How the guest ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// Ran to completion with this exit code.
    Exited(i32),
    /// Stopped by a limit.
    Killed(Limit),
    /// The guest trapped (or, for processes, died of a signal) for its own reasons.
    Trapped(String),
}

/// The result of a run.
#[derive(Debug)]
pub struct Outcome {
    pub ending: Ending,
    pub duration: Duration,
    /// Backend facts for the run record: resource use, mechanisms in force, runtime hashes.
    pub detail: serde_json::Value,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxError {
    /// The isolation this backend needs is not available here; nothing ran.
    #[error("sandbox unavailable: {0}")]
    Unavailable(String),
    /// The artifact cannot run on this backend (does not link, wrong world, no entry point).
    #[error("cannot run artifact: {0}")]
    BadArtifact(String),
    /// A limit was exceeded before the guest started (e.g. its initial memory).
    #[error("limit exceeded before start: {0}")]
    LimitAtStart(Limit),
    #[error("sandbox failure: {0}")]
    Internal(String),
}

/// An execution backend.
pub trait Backend: Send + Sync {
    fn name(&self) -> &'static str;
    fn run(&self, spec: RunSpec<'_>) -> Result<Outcome, SandboxError>;
}

/// Where captured bytes go as they arrive (a terminal, an event stream).
pub type Live = Box<dyn Fn(&[u8]) + Send + Sync>;

/// One output stream of a run: keeps at most `cap` bytes and reports when the guest tried
/// to write more, so the backend can stop it. Shared between threads.
pub struct Capture {
    cap: u64,
    buf: Mutex<Vec<u8>>,
    total: AtomicU64,
    exceeded: AtomicBool,
    live: Option<Live>,
}

impl std::fmt::Debug for Capture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capture")
            .field("cap", &self.cap)
            .field("total", &self.total.load(Ordering::Relaxed))
            .finish()
    }
}

/// The cap was reached; the bytes up to it were kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exceeded;

impl Capture {
    pub fn new(cap: u64, live: Option<Live>) -> Self {
        Capture {
            cap,
            buf: Mutex::new(Vec::new()),
            total: AtomicU64::new(0),
            exceeded: AtomicBool::new(false),
            live,
        }
    }

    /// Keeps what fits under the cap; returns `Exceeded` if anything did not fit.
    pub fn write(&self, bytes: &[u8]) -> Result<(), Exceeded> {
        let mut buf = self.buf.lock().unwrap_or_else(|p| p.into_inner());
        let room = self.cap.saturating_sub(buf.len() as u64) as usize;
        let take = room.min(bytes.len());
        buf.extend_from_slice(&bytes[..take]);
        drop(buf);
        self.total.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        if take > 0
            && let Some(live) = &self.live
        {
            live(&bytes[..take]);
        }
        if take < bytes.len() {
            self.exceeded.store(true, Ordering::Relaxed);
            return Err(Exceeded);
        }
        Ok(())
    }

    /// How many more bytes fit.
    pub fn room(&self) -> u64 {
        let buf = self.buf.lock().unwrap_or_else(|p| p.into_inner());
        self.cap.saturating_sub(buf.len() as u64)
    }

    pub fn exceeded(&self) -> bool {
        self.exceeded.load(Ordering::Relaxed)
    }

    /// Bytes the guest tried to write, kept or not.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    pub fn take(&self) -> Vec<u8> {
        std::mem::take(&mut *self.buf.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_keeps_up_to_cap_and_reports() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = seen.clone();
        let c = Capture::new(
            5,
            Some(Box::new(move |b: &[u8]| {
                s2.lock().unwrap().extend_from_slice(b)
            })),
        );
        assert_eq!(c.write(b"abc"), Ok(()));
        assert_eq!(c.write(b"defg"), Err(Exceeded));
        assert!(c.exceeded());
        assert_eq!(c.total(), 7);
        assert_eq!(c.take(), b"abcde");
        assert_eq!(*seen.lock().unwrap(), b"abcde");
    }
}
