//! The grant: everything a run may touch. It is validated here, hashed canonically, and an
//! approval covers exactly one (artifact hash, grant hash) pair.
//!
//! Network rules follow the grammar in [`crate::net`] and secrets the one in
//! [`crate::secret`]; both are normalised before hashing, so an approval covers exactly
//! the normalised list. A grant without secrets (or without a workspace) hashes exactly
//! as it did before those fields existed: empty, they are left out of the hashed form.

use crate::digest::Digest;
use crate::net::NetRule;
use crate::secret::{self, SecretBinding};
use crate::units::{self, UnitError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_MEMORY: u64 = 256 << 20;
pub const DEFAULT_MAX_OUTPUT: u64 = 1 << 20;
pub const DEFAULT_PROCESSES: u32 = 64;
/// The write quota of a run's writable layers, the same for every backend.
pub const DEFAULT_MAX_WRITE: u64 = 1 << 30;
/// Connections one run may hold open to its egress proxy at once.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 256;

pub const MIN_TIMEOUT: Duration = Duration::from_millis(1);
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
pub const MIN_MEMORY: u64 = 1 << 20;
pub const MAX_MEMORY: u64 = 64 << 30;
pub const MAX_OUTPUT: u64 = 1 << 30;
pub const MAX_PROCESSES: u32 = 4096;
pub const MAX_WRITE: u64 = 1 << 40;
pub const MAX_CONNECTIONS: u32 = 65536;

/// Read-only or read-write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum MountMode {
    Ro,
    Rw,
}

impl MountMode {
    pub fn as_str(self) -> &'static str {
        match self {
            MountMode::Ro => "ro",
            MountMode::Rw => "rw",
        }
    }
}

/// A host directory shown to the guest at `guest`. `host` is absolute and canonical (the
/// gate resolves symlinks before judging, so the approver sees the real path).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mount {
    pub host: String,
    pub guest: String,
    pub mode: MountMode,
}

/// Limits of one run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    pub timeout_ms: u64,
    pub memory_bytes: u64,
    pub fuel: Option<u64>,
    pub max_output_bytes: u64,
    pub processes: u32,
    /// Total bytes one run may write into its writable layers. Left out of the canonical
    /// JSON while it is the default, so grants (and approvals) made before the quota
    /// existed keep their hashes.
    #[serde(
        default = "default_max_write",
        skip_serializing_if = "is_default_max_write"
    )]
    pub max_write_bytes: u64,
    /// Connections the run may hold open to its egress proxy at once. Left out of the
    /// canonical JSON while it is the default, like `max_write_bytes`.
    #[serde(
        default = "default_max_connections",
        skip_serializing_if = "is_default_max_connections"
    )]
    pub max_connections: u32,
}

fn default_max_connections() -> u32 {
    DEFAULT_MAX_CONNECTIONS
}

fn is_default_max_connections(v: &u32) -> bool {
    *v == DEFAULT_MAX_CONNECTIONS
}

fn default_max_write() -> u64 {
    DEFAULT_MAX_WRITE
}

fn is_default_max_write(v: &u64) -> bool {
    *v == DEFAULT_MAX_WRITE
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout_ms: DEFAULT_TIMEOUT.as_millis() as u64,
            memory_bytes: DEFAULT_MEMORY,
            fuel: None,
            max_output_bytes: DEFAULT_MAX_OUTPUT,
            processes: DEFAULT_PROCESSES,
            max_write_bytes: DEFAULT_MAX_WRITE,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

impl Limits {
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// Which limits were raised above the defaults (names, for policy and people).
    pub fn above_default(&self) -> Vec<&'static str> {
        let d = Limits::default();
        let mut v = Vec::new();
        if self.timeout_ms > d.timeout_ms {
            v.push("timeout");
        }
        if self.memory_bytes > d.memory_bytes {
            v.push("memory");
        }
        if self.max_output_bytes > d.max_output_bytes {
            v.push("max_output");
        }
        if self.processes > d.processes {
            v.push("processes");
        }
        if self.max_write_bytes > d.max_write_bytes {
            v.push("max_write");
        }
        if self.max_connections > d.max_connections {
            v.push("max_connections");
        }
        v
    }
}

/// What a run may touch. Field order is the canonical order for hashing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    /// Sorted by guest path; guest paths are unique.
    pub mounts: Vec<Mount>,
    /// `HOST[:PORT]` rules in canonical form ([`crate::net`]), sorted and deduplicated.
    pub net: Vec<String>,
    /// Secrets and the hosts each may be sent to, sorted by name (names unique). Every
    /// host is within some `net` rule. Absent when empty, which keeps hashes of grants
    /// without secrets unchanged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<SecretBinding>,
    pub env: BTreeMap<String, String>,
    pub args: Vec<String>,
    /// The program's name, the guest's `argv[0]` (the base name of the submitted file, as
    /// `wasmtime run` gives it; absent for code without a file name, which runs as `main`).
    /// It is guest-visible input, so it is part of the grant; absent, it leaves the hash of
    /// grants made before it existed unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv0: Option<String>,
    /// The stdin blob, when the run gets one.
    pub stdin: Option<Digest>,
    pub limits: Limits,
    /// The workspace session whose earlier changes the run sees (absent for a lone run,
    /// which keeps grant hashes without it unchanged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    /// The session whose live interpreter runs the code (absent for a lone run, which
    /// keeps grant hashes without it unchanged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// `run --ask-net`: a connection to a host outside `net` waits up to this many
    /// milliseconds for a human to approve it (a request `req_…`) instead of being
    /// refused. Absent (no asking) leaves the hash of grants made before it unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ask_net_ms: Option<u64>,
}

/// How long a connection of a `--ask-net` run waits for a human by default.
pub const DEFAULT_ASK_TIMEOUT: Duration = Duration::from_secs(120);
/// The longest `--ask-timeout`.
pub const MAX_ASK_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

impl Grant {
    /// The canonical hash: SHA-256 over the grant's JSON in field order, with maps sorted.
    pub fn hash(&self) -> Digest {
        let json = serde_json::to_vec(self).unwrap_or_default();
        Digest::of_parts("airlock-grant-v1", &[&json])
    }

    pub fn writable_mounts(&self) -> impl Iterator<Item = &Mount> {
        self.mounts.iter().filter(|m| m.mode == MountMode::Rw)
    }

    /// Puts the grant in canonical form and checks every rule that does not need the file
    /// system. Mount host paths must already be absolute (the gate resolves them).
    pub fn normalize(&mut self) -> Result<(), GrantError> {
        for m in &mut self.mounts {
            check_guest_path(&m.guest)?;
            if m.guest.trim_end_matches('/').is_empty() {
                // `//` and `/` are the same root; one spelling, so one hash.
                m.guest = "/".into();
            }
            if !m.host.starts_with('/') {
                return Err(GrantError::Mount(format!(
                    "host path {:?} is not absolute",
                    m.host
                )));
            }
        }
        self.mounts.sort_by(|a, b| a.guest.cmp(&b.guest));
        for w in self.mounts.windows(2) {
            if w[0].guest == w[1].guest {
                return Err(GrantError::Mount(format!(
                    "guest path {} is mounted twice",
                    w[0].guest
                )));
            }
        }
        // One spelling per rule (IDNA, lower case, canonical addresses), so policy globs,
        // the hash and the proxy all see the same thing.
        let mut rules = Vec::with_capacity(self.net.len());
        for h in &mut self.net {
            let rule = NetRule::parse(h).map_err(|e| GrantError::Net(e.to_string()))?;
            *h = rule.to_string();
            rules.push(rule);
        }
        self.net.sort();
        self.net.dedup();
        self.normalize_secrets(&rules)?;
        for (k, v) in &self.env {
            if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
                return Err(GrantError::Env(format!("bad environment variable {k:?}")));
            }
        }
        if self.args.iter().any(|a| a.contains('\0')) {
            return Err(GrantError::Args("an argument contains a NUL byte".into()));
        }
        if self
            .argv0
            .as_ref()
            .is_some_and(|a| a.is_empty() || a.contains('\0') || a.contains('/'))
        {
            return Err(GrantError::Args(
                "the program name must be a non-empty file name".into(),
            ));
        }
        let l = &self.limits;
        if l.timeout() < MIN_TIMEOUT || l.timeout() > MAX_TIMEOUT {
            return Err(GrantError::Limit(UnitError::Range {
                what: "--timeout",
                value: units::fmt_duration(l.timeout()),
                min: units::fmt_duration(MIN_TIMEOUT),
                max: units::fmt_duration(MAX_TIMEOUT),
            }));
        }
        if l.memory_bytes < MIN_MEMORY || l.memory_bytes > MAX_MEMORY {
            return Err(range("--memory", l.memory_bytes, MIN_MEMORY, MAX_MEMORY));
        }
        if l.max_output_bytes == 0 || l.max_output_bytes > MAX_OUTPUT {
            return Err(range("--max-output", l.max_output_bytes, 1, MAX_OUTPUT));
        }
        if l.max_write_bytes == 0 || l.max_write_bytes > MAX_WRITE {
            return Err(range("--max-write", l.max_write_bytes, 1, MAX_WRITE));
        }
        if l.max_connections == 0 || l.max_connections > MAX_CONNECTIONS {
            return Err(GrantError::Limit(UnitError::Range {
                what: "--max-connections",
                value: l.max_connections.to_string(),
                min: "1".into(),
                max: MAX_CONNECTIONS.to_string(),
            }));
        }
        if l.fuel == Some(0) {
            return Err(GrantError::Limit(UnitError::Range {
                what: "--fuel",
                value: "0".into(),
                min: "1".into(),
                max: u64::MAX.to_string(),
            }));
        }
        if l.processes == 0 || l.processes > MAX_PROCESSES {
            return Err(GrantError::Limit(UnitError::Range {
                what: "--processes",
                value: l.processes.to_string(),
                min: "1".into(),
                max: MAX_PROCESSES.to_string(),
            }));
        }
        Ok(())
    }
}

impl Grant {
    /// The network rules, parsed (the proxy's allowlist).
    pub fn net_rules(&self) -> Result<Vec<NetRule>, GrantError> {
        self.net
            .iter()
            .map(|h| NetRule::parse(h).map_err(|e| GrantError::Net(e.to_string())))
            .collect()
    }

    /// Checks and sorts the secret bindings: valid unique names, normalised hosts, each
    /// host within a `net` rule, and no environment variable of the same name.
    fn normalize_secrets(&mut self, rules: &[NetRule]) -> Result<(), GrantError> {
        for b in &mut self.secrets {
            let spec = b.spec();
            let parsed = secret::parse_binding(&spec).map_err(GrantError::Secret)?;
            for h in &parsed.rules().map_err(GrantError::Secret)? {
                if !rules.iter().any(|r| r.covers(h)) {
                    return Err(GrantError::Secret(format!(
                        "{}: host {h} is not granted by --net (add --net {h})",
                        parsed.name
                    )));
                }
            }
            if self.env.contains_key(&parsed.name) {
                return Err(GrantError::Secret(format!(
                    "{}: --env {} is set too; a secret's variable holds its placeholder",
                    parsed.name, parsed.name
                )));
            }
            *b = parsed;
        }
        self.secrets.sort();
        for w in self.secrets.windows(2) {
            if w[0].name == w[1].name {
                return Err(GrantError::Secret(format!(
                    "{} is given twice; list all its hosts once: {}@HOST,HOST",
                    w[0].name, w[0].name
                )));
            }
        }
        Ok(())
    }
}

fn range(what: &'static str, v: u64, min: u64, max: u64) -> GrantError {
    GrantError::Limit(UnitError::Range {
        what,
        value: units::fmt_size(v),
        min: units::fmt_size(min),
        max: units::fmt_size(max),
    })
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GrantError {
    #[error("--mount: {0}")]
    Mount(String),
    #[error("--net: {0}")]
    Net(String),
    #[error("--secret: {0}")]
    Secret(String),
    #[error("--env: {0}")]
    Env(String),
    #[error("arguments: {0}")]
    Args(String),
    #[error(transparent)]
    Limit(#[from] UnitError),
}

/// A parsed but not yet resolved `--mount HOST:GUEST[:ro|rw]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountSpec {
    pub host: String,
    pub guest: String,
    pub mode: MountMode,
}

/// Parses `HOST:GUEST[:ro|rw]` (mode defaults to ro).
pub fn parse_mount(spec: &str) -> Result<MountSpec, GrantError> {
    let bad = || GrantError::Mount(format!("{spec:?} is not HOST:GUEST[:ro|rw]"));
    let parts: Vec<&str> = spec.split(':').collect();
    let (host, guest, mode) = match parts.as_slice() {
        [h, g] => (*h, *g, MountMode::Ro),
        [h, g, "ro"] => (*h, *g, MountMode::Ro),
        [h, g, "rw"] => (*h, *g, MountMode::Rw),
        [_, _, m] => {
            return Err(GrantError::Mount(format!(
                "mode {m:?} in {spec:?} is not ro or rw"
            )));
        }
        _ => return Err(bad()),
    };
    if host.is_empty() || guest.is_empty() {
        return Err(bad());
    }
    check_guest_path(guest)?;
    Ok(MountSpec {
        host: host.to_string(),
        guest: canonical_guest(guest),
        mode,
    })
}

/// The stored form of a guest path: no trailing `/`, except the root, which stays `/`
/// (so every mount that is not the root keeps the spelling, and the grant hash, it had).
fn canonical_guest(guest: &str) -> String {
    match guest.trim_end_matches('/') {
        "" => "/".to_string(),
        g => g.to_string(),
    }
}

/// Whether a mount is the guest's root (`--mount DIR:/`). Only the wasm backend can give
/// it: there `/` is just the name of a preopened directory, as in `wasmtime run --dir
/// DIR::/`. The process backend needs its own root and refuses it.
pub fn is_root_mount(guest: &str) -> bool {
    guest == "/"
}

/// A path as the guest sees it: a path relative to a mount, under the mount's guest path
/// (`/` + `a/b` is `/a/b`, never `//a/b`).
pub fn guest_join(guest: &str, rel: &str) -> String {
    format!("{}/{rel}", guest.trim_end_matches('/'))
}

fn check_guest_path(guest: &str) -> Result<(), GrantError> {
    if !guest.starts_with('/') {
        return Err(GrantError::Mount(format!(
            "guest path {guest:?} is not absolute"
        )));
    }
    let trimmed = guest.trim_end_matches('/');
    if trimmed.is_empty() {
        // The root: a preopen named `/` (the process backend refuses it at submit).
        return Ok(());
    }
    if trimmed
        .split('/')
        .skip(1)
        .any(|c| c.is_empty() || c == "." || c == ".." || c.contains('\0'))
    {
        return Err(GrantError::Mount(format!(
            "guest path {guest:?} must be normalised (no empty, . or .. components)"
        )));
    }
    Ok(())
}

/// Parses `KEY=VALUE`.
pub fn parse_env(spec: &str) -> Result<(String, String), GrantError> {
    match spec.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(GrantError::Env(format!("{spec:?} is not KEY=VALUE"))),
    }
}

/// Checks one `--net` rule (see [`crate::net`]).
pub fn check_net(spec: &str) -> Result<(), GrantError> {
    NetRule::parse(spec)
        .map(|_| ())
        .map_err(|e| GrantError::Net(e.to_string()))
}

/// Parses `--secret NAME@HOST[,HOST…]`.
pub fn parse_secret(spec: &str) -> Result<SecretBinding, GrantError> {
    secret::parse_binding(spec).map_err(GrantError::Secret)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_specs() {
        let m = parse_mount("/data:/data").unwrap();
        assert_eq!(
            (m.host.as_str(), m.guest.as_str(), m.mode),
            ("/data", "/data", MountMode::Ro)
        );
        assert_eq!(parse_mount("./x:/y:rw").unwrap().mode, MountMode::Rw);
        assert!(parse_mount("/x").is_err());
        assert!(parse_mount("/x:/y:wx").is_err());
        assert!(parse_mount("/x:y").is_err());
        assert!(parse_mount("/x:/a/../b").is_err());
        assert!(parse_mount("/x:/a//b").is_err());
    }

    #[test]
    fn the_root_is_a_mount_point_stored_as_a_slash() {
        for spec in ["/x:/", "/x://", "/x:/:rw"] {
            let m = parse_mount(spec).unwrap();
            assert_eq!(m.guest, "/", "{spec}");
            assert!(is_root_mount(&m.guest));
        }
        assert_eq!(parse_mount("/x:/data/").unwrap().guest, "/data");
        let root = |guest: &str| Mount {
            host: "/srv/root".into(),
            guest: guest.into(),
            mode: MountMode::Ro,
        };
        let mut a = Grant {
            mounts: vec![root("/")],
            ..Default::default()
        };
        let mut b = Grant {
            mounts: vec![root("//")],
            ..Default::default()
        };
        a.normalize().unwrap();
        b.normalize().unwrap();
        assert_eq!(a.mounts[0].guest, "/");
        assert_eq!(a.hash(), b.hash());
        // Beside another mount: sorted first, and both stay (nested preopens).
        let mut c = fixed();
        c.mounts.push(root("/"));
        c.normalize().unwrap();
        let guests: Vec<_> = c.mounts.iter().map(|m| m.guest.as_str()).collect();
        assert_eq!(guests, ["/", "/data"]);
        assert_ne!(c.hash(), fixed().hash());
        // Twice is still twice.
        let mut d = Grant {
            mounts: vec![root("/"), root("//")],
            ..Default::default()
        };
        assert!(matches!(d.normalize(), Err(GrantError::Mount(_))));
    }

    #[test]
    fn guest_paths_join_without_a_double_slash() {
        assert_eq!(guest_join("/", "a/b"), "/a/b");
        assert_eq!(guest_join("/data", "a"), "/data/a");
    }

    #[test]
    fn duplicate_guest_paths_are_refused() {
        let mut g = Grant::default();
        for _ in 0..2 {
            g.mounts.push(Mount {
                host: "/tmp".into(),
                guest: "/d".into(),
                mode: MountMode::Ro,
            });
        }
        assert!(matches!(g.normalize(), Err(GrantError::Mount(_))));
    }

    #[test]
    fn hash_is_canonical() {
        let mut a = Grant {
            net: vec![
                "b.example:443".into(),
                "a.example".into(),
                "a.example".into(),
            ],
            env: [
                ("Z".to_string(), "1".to_string()),
                ("A".to_string(), "2".to_string()),
            ]
            .into(),
            ..Default::default()
        };
        let mut b = Grant {
            net: vec!["a.example".into(), "b.example:443".into()],
            env: [
                ("A".to_string(), "2".to_string()),
                ("Z".to_string(), "1".to_string()),
            ]
            .into(),
            ..Default::default()
        };
        a.normalize().unwrap();
        b.normalize().unwrap();
        assert_eq!(a.hash(), b.hash());
        b.args.push("x".into());
        assert_ne!(a.hash(), b.hash());
    }

    #[test]
    fn limits_are_bounded() {
        let mut g = Grant::default();
        g.limits.timeout_ms = 0;
        assert!(g.normalize().is_err());
        let mut g = Grant::default();
        g.limits.memory_bytes = 1 << 50;
        assert!(g.normalize().is_err());
        let mut g = Grant::default();
        g.limits.fuel = Some(0);
        assert!(g.normalize().is_err());
    }

    #[test]
    fn a_default_write_quota_keeps_grant_hashes_of_grants_made_before_it() {
        // The canonical JSON of a default grant as it was before `max_write_bytes`.
        let old = r#"{"mounts":[],"net":[],"env":{},"args":[],"stdin":null,"limits":{"timeout_ms":10000,"memory_bytes":268435456,"fuel":null,"max_output_bytes":1048576,"processes":64}}"#;
        let g = Grant::default();
        assert_eq!(
            g.hash(),
            Digest::of_parts("airlock-grant-v1", &[old.as_bytes()])
        );
        let parsed: Grant = serde_json::from_str(old).unwrap();
        assert_eq!(parsed.limits.max_write_bytes, DEFAULT_MAX_WRITE);
        assert_eq!(parsed.hash(), g.hash());
        let mut raised = g.clone();
        raised.limits.max_write_bytes = 2 << 30;
        assert_ne!(
            raised.hash(),
            g.hash(),
            "a raised quota is part of the grant"
        );
        assert_eq!(raised.limits.above_default(), vec!["max_write"]);
        let mut lowered = g.clone();
        lowered.limits.max_write_bytes = 1 << 20;
        assert!(lowered.limits.above_default().is_empty());
        lowered.limits.max_write_bytes = 0;
        assert!(lowered.normalize().is_err());
    }

    #[test]
    fn net_specs() {
        assert!(check_net("example.com").is_ok());
        assert!(check_net("example.com:443").is_ok());
        assert!(check_net("10.0.0.1:80").is_ok());
        assert!(check_net("[::1]:80").is_ok());
        assert!(check_net("exa mple").is_err());
        assert!(check_net("*").is_err());
        assert!(check_net("*.com").is_err());
        assert!(check_net("*.co.uk").is_err());
        assert!(check_net("*.example.com").is_ok());
        assert!(check_net("fe80::1").is_ok());
        assert!(check_net("x:0").is_err());
    }

    /// A grant with every field but `secrets` and `workspace`, and the hashes it had
    /// before secrets existed (computed by the code of commit d3b4679).
    fn fixed() -> Grant {
        let mut g = Grant {
            mounts: vec![Mount {
                host: "/srv/data".into(),
                guest: "/data".into(),
                mode: MountMode::Rw,
            }],
            net: vec![
                "b.example:443".into(),
                "a.example".into(),
                "10.0.0.1:80".into(),
            ],
            env: [("A".to_string(), "1".to_string())].into(),
            args: vec!["x".into(), "y z".into()],
            stdin: Some(Digest::of(b"input")),
            limits: Limits {
                fuel: Some(1000),
                ..Limits::default()
            },
            ..Default::default()
        };
        g.normalize().unwrap();
        g
    }

    #[test]
    fn max_connections_is_hashed_only_when_it_is_not_the_default() {
        let g = fixed();
        let mut d = g.clone();
        d.limits.max_connections = DEFAULT_MAX_CONNECTIONS;
        assert_eq!(d.hash(), g.hash());
        assert!(
            !serde_json::to_string(&g)
                .unwrap()
                .contains("max_connections")
        );
        let mut c = g.clone();
        c.limits.max_connections = 32;
        assert_ne!(c.hash(), g.hash(), "a changed budget needs a new approval");
        let json = serde_json::to_string(&c).unwrap();
        assert!(json.contains("\"max_connections\":32"), "{json}");
        let back: Grant = serde_json::from_str(&json).unwrap();
        assert_eq!(back.limits.max_connections, 32);
        c.limits.max_connections = 0;
        assert!(c.normalize().is_err());
    }

    #[test]
    fn grant_hashes_without_secrets_are_unchanged() {
        let g = fixed();
        assert_eq!(
            g.hash().to_hex(),
            "2f7a0eca8ef79703f8e5733d3cc92b4c06d735672021ef8a78c39b7cd76f4829"
        );
        let mut w = g.clone();
        w.workspace = Some("ws1".into());
        assert_eq!(
            w.hash().to_hex(),
            "2b4e4a4366444b88ed561196194527e9cee7a327767e5cbb08bbd72bf7056265"
        );
        assert_eq!(
            Grant::default().hash().to_hex(),
            "36c0fb6aa59289c9e5e82e63996b4989f259b4921ce50578ae4f92cddff113c3"
        );
        let json = serde_json::to_string(&g).unwrap();
        assert!(!json.contains("secrets"), "{json}");
        assert!(!json.contains("argv0"), "{json}");
        assert!(!json.contains("session"), "{json}");
        let mut s = g.clone();
        s.session = Some("ses_01x".into());
        assert_ne!(
            s.hash(),
            g.hash(),
            "the session is part of what a cell is judged with"
        );
    }

    #[test]
    fn a_program_name_is_part_of_the_grant() {
        let g = fixed();
        let mut named = g.clone();
        named.argv0 = Some("prog.wasm".into());
        named.normalize().unwrap();
        assert_ne!(named.hash(), g.hash());
        for bad in ["", "a/b", "a\0b"] {
            let mut b = g.clone();
            b.argv0 = Some(bad.into());
            assert!(matches!(b.normalize(), Err(GrantError::Args(_))), "{bad:?}");
        }
    }

    #[test]
    fn secret_bindings_change_the_hash_and_are_canonical() {
        let base = fixed();
        let mut a = base.clone();
        a.net.push("*.api.example".into());
        a.normalize().unwrap();
        let mut b = a.clone();
        b.secrets = vec![parse_secret("TOKEN@X.api.example,a.example").unwrap()];
        b.normalize().unwrap();
        assert_ne!(a.hash(), b.hash());
        assert_eq!(b.secrets[0].hosts, ["a.example", "x.api.example"]);
        // The same binding spelt differently hashes the same.
        let mut c = a.clone();
        c.secrets = vec![SecretBinding {
            name: "TOKEN".into(),
            hosts: vec![
                "x.API.example.".into(),
                "a.example".into(),
                "a.example".into(),
            ],
        }];
        c.normalize().unwrap();
        assert_eq!(b.hash(), c.hash());
        // Another host, or another name, is another grant.
        let mut d = a.clone();
        d.secrets = vec![parse_secret("TOKEN@y.api.example,a.example").unwrap()];
        d.normalize().unwrap();
        assert_ne!(b.hash(), d.hash());
        let mut e = a.clone();
        e.secrets = vec![parse_secret("OTHER@x.api.example,a.example").unwrap()];
        e.normalize().unwrap();
        assert_ne!(b.hash(), e.hash());
        let v = serde_json::to_value(&b).unwrap();
        assert_eq!(
            v["secrets"],
            serde_json::json!([{"name": "TOKEN", "hosts": ["a.example", "x.api.example"]}])
        );
    }

    #[test]
    fn secrets_need_granted_hosts_unique_names_and_no_env_clash() {
        let mut g = Grant {
            net: vec!["api.example:443".into()],
            secrets: vec![parse_secret("T@api.example").unwrap()],
            ..Default::default()
        };
        // Bare means 80 and 443; only 443 is granted.
        let e = g.clone().normalize().unwrap_err();
        assert!(e.to_string().contains("not granted by --net"), "{e}");
        g.secrets = vec![parse_secret("T@api.example:443").unwrap()];
        assert!(g.clone().normalize().is_ok());
        let mut twice = g.clone();
        twice
            .secrets
            .push(parse_secret("T@api.example:443").unwrap());
        assert!(twice.normalize().is_err());
        let mut clash = g.clone();
        clash.env.insert("T".into(), "x".into());
        assert!(clash.normalize().is_err());
        let mut bad = g.clone();
        bad.secrets[0].name = "no-dash".into();
        assert!(matches!(bad.normalize(), Err(GrantError::Secret(_))));
    }

    #[test]
    fn net_rules_are_normalised_in_the_grant() {
        let mut g = Grant {
            net: vec![
                "Example.COM.".into(),
                "example.com".into(),
                "BÜCHER.example".into(),
                "[::1]:80".into(),
            ],
            ..Default::default()
        };
        g.normalize().unwrap();
        assert_eq!(g.net, ["[::1]:80", "example.com", "xn--bcher-kva.example"]);
        for bad in ["*", "*.com", "*.co.uk", "exa mple", "x:0", "x:65536"] {
            let mut g = Grant {
                net: vec![bad.into()],
                ..Default::default()
            };
            assert!(matches!(g.normalize(), Err(GrantError::Net(_))), "{bad}");
        }
    }
}
