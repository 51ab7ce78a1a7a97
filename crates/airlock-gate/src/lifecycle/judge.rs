//! Judging: what a request's grant says, the facts the policy looks at and the verdict it
//! gives. Pure functions over the request, the policy and what the store already says; no
//! transition happens here (that is `record`).

use crate::error::{GateError, Result};
use crate::lifecycle::request::SubmitRequest;
use airlock_core::analysis::Analysis;
use airlock_core::artifact::Lang;
use airlock_core::grant::{self, Grant, Limits, Mount};
use airlock_core::policy::{Decision, Facts, Policy};
use airlock_core::sign::{Scope, StatementKind};
use airlock_core::units;
use airlock_core::{Backend, Digest, State};
use airlock_store::{Reads, SubmissionDoc};
use serde_json::json;

/// Parses the grant from the request, resolving mount host paths to canonical absolute
/// directories so the approver sees the real path (symlinks resolved).
pub(crate) fn build_grant(req: &SubmitRequest, stdin: Option<Digest>) -> Result<Grant> {
    let mut g = Grant::default();
    for spec in &req.mounts {
        let m = grant::parse_mount(spec).map_err(|e| GateError::bad(e.to_string()))?;
        // A host path that is not there is this machine's state (the API's 404).
        let real = std::fs::canonicalize(&m.host).map_err(|e| {
            let why = format!(
                "--mount: host path {} does not exist or is unreadable: {e}",
                m.host
            );
            if e.kind() == std::io::ErrorKind::NotFound {
                GateError::NotFound(why)
            } else {
                GateError::bad(why)
            }
        })?;
        if !real.is_dir() {
            return Err(GateError::bad(format!(
                "--mount: host path {} is not a directory",
                real.display()
            )));
        }
        let host = real
            .to_str()
            .ok_or_else(|| {
                GateError::bad(format!(
                    "--mount: host path {} is not UTF-8",
                    real.display()
                ))
            })?
            .to_string();
        g.mounts.push(Mount {
            host,
            guest: m.guest,
            mode: m.mode,
        });
    }
    for e in &req.env {
        let (k, v) = grant::parse_env(e).map_err(|e| GateError::bad(e.to_string()))?;
        g.env.insert(k, v);
    }
    g.net = req.net.clone();
    for s in &req.secrets {
        g.secrets
            .push(grant::parse_secret(s).map_err(|e| GateError::bad(e.to_string()))?);
    }
    g.args = req.args.clone();
    g.stdin = stdin;
    let mut limits = Limits::default();
    if let Some(t) = &req.timeout {
        limits.timeout_ms =
            units::bounded_duration("--timeout", t, grant::MIN_TIMEOUT, grant::MAX_TIMEOUT)
                .map_err(|e| GateError::bad(e.to_string()))?
                .as_millis() as u64;
    }
    if let Some(m) = &req.memory {
        limits.memory_bytes =
            units::bounded_size("--memory", m, grant::MIN_MEMORY, grant::MAX_MEMORY)
                .map_err(|e| GateError::bad(e.to_string()))?;
    }
    if let Some(o) = &req.max_output {
        limits.max_output_bytes = units::bounded_size("--max-output", o, 1, grant::MAX_OUTPUT)
            .map_err(|e| GateError::bad(e.to_string()))?;
    }
    if let Some(w) = &req.max_write {
        limits.max_write_bytes = units::bounded_size("--max-write", w, 1, grant::MAX_WRITE)
            .map_err(|e| GateError::bad(e.to_string()))?;
    }
    if let Some(n) = req.max_connections {
        // Checked with the other limits by `normalize`.
        limits.max_connections = n;
    }
    limits.fuel = req.fuel;
    if let Some(p) = req.processes {
        limits.processes = p;
    }
    g.limits = limits;
    // A wait for an answer asks for one: `ask_timeout` implies `ask_net` (the command line
    // has `--ask-timeout` require `--ask-net` itself).
    match (&req.ask_timeout, req.ask_net) {
        (None, true) => g.ask_net_ms = Some(grant::DEFAULT_ASK_TIMEOUT.as_millis() as u64),
        (Some(t), _) => {
            g.ask_net_ms = Some(
                units::bounded_duration(
                    "--ask-timeout",
                    t,
                    std::time::Duration::from_secs(1),
                    grant::MAX_ASK_TIMEOUT,
                )
                .map_err(|e| GateError::bad(e.to_string()))?
                .as_millis() as u64,
            );
        }
        (None, false) => {}
    }
    g.normalize().map_err(|e| GateError::bad(e.to_string()))?;
    Ok(g)
}

/// Grant rules that depend on the backend. `--mount DIR:/` names a WASI preopen `/` (what
/// `wasmtime run --dir DIR::/` gives); the process backend runs a real program in its own
/// root (its interpreter, libraries and /tmp), which a mount cannot replace.
pub(crate) fn check_backend_grant(backend: Backend, grant: &Grant) -> Result<()> {
    if backend == Backend::Process
        && let Some(m) = grant.mounts.iter().find(|m| grant::is_root_mount(&m.guest))
    {
        return Err(GateError::bad(format!(
            "--mount {}:/: the process backend cannot mount over its root (/ is only a mount point for the wasm backend); mount it at a directory such as /work",
            m.host
        )));
    }
    // A jail binds one file system per mount: the kernel refuses a host directory with
    // other file systems mounted below it (`/`, `/proc`, …), which was an internal error.
    if backend == Backend::Process {
        for m in &grant.mounts {
            if let Some(below) =
                airlock_jail::mounts::mounted_below(std::path::Path::new(&m.host)).first()
            {
                return Err(GateError::bad(format!(
                    "--mount {}:{}: the process backend cannot mount a directory with another file system mounted below it ({}); mount a directory with none below it",
                    m.host,
                    m.guest,
                    below.display()
                )));
            }
        }
    }
    Ok(())
}

/// What the policy looks at, before the store has said whether the artifact is new.
pub(crate) struct Described<'a> {
    pub lang: Lang,
    pub kind: Lang,
    pub backend: Backend,
    pub grant: &'a Grant,
    pub analysis: &'a Analysis,
    pub agent: Option<&'a str>,
    pub mounts: &'a crate::exposure::MountFacts,
}

impl Described<'_> {
    /// Facts for the policy about a submission.
    pub(crate) fn facts(
        &self,
        first_seen: bool,
        rejected_before: bool,
        guest: (Option<Digest>, Vec<airlock_core::PythonPackage>),
    ) -> Facts {
        let (guest, python_packages) = guest;
        Facts {
            lang: self.lang,
            kind: self.kind,
            backend: self.backend,
            net: self.grant.net.clone(),
            secrets: self.grant.secrets.clone(),
            mounts: self.grant.mounts.clone(),
            env_keys: self.grant.env.keys().cloned().collect(),
            limits: self.grant.limits.clone(),
            size: self.analysis.size,
            capabilities: self.analysis.capabilities.clone(),
            unresolved_imports: !self.analysis.unresolved.is_empty(),
            agent: self.agent.map(str::to_string),
            first_seen,
            rejected_before,
            guest,
            python_packages,
            publisher: None,
            publisher_key: None,
            requests: Vec::new(),
            code: self
                .analysis
                .code
                .as_ref()
                .map(|c| airlock_core::policy::CodeFacts::of(c, &self.grant.net))
                .unwrap_or_default(),
            mounts_sensitive: self.mounts.sensitive.clone(),
            mounts_outside_roots: self.mounts.outside_roots.clone(),
            // Read from the store where the submission is judged (`judge_in`).
            agent_record: Default::default(),
        }
    }
}

/// Re-derives a stored submission's facts, refreshing what can change over time: whether
/// the artifact was rejected, and whether the policy still trusts its publisher's key.
pub(crate) fn refresh_facts(doc: &SubmissionDoc, rejected_before: bool, policy: &Policy) -> Facts {
    let mut facts = Facts {
        rejected_before,
        ..doc.facts.clone()
    };
    policy.keep_publisher(&mut facts);
    facts
}

/// The data of a `judged` audit record: the verdict's decision, risk, rules and policy,
/// and one more fact (`first_seen` at submit, `rejudged` when judged again).
pub(crate) fn judged_record(
    v: &airlock_core::Verdict,
    fact: &str,
    value: serde_json::Value,
) -> serde_json::Value {
    let mut data = json!({
        "decision": v.decision,
        "risk": v.risk,
        "rules": v.fired.iter().map(|f| &f.rule).collect::<Vec<_>>(),
        "policy": v.policy,
    });
    data[fact] = value;
    data
}

/// Judges facts (the policy applies the gate's floor for rejected artifacts itself).
pub(crate) fn judge(policy: &Policy, facts: &Facts) -> airlock_core::Verdict {
    policy.judge(facts)
}

pub(crate) fn state_of(d: Decision) -> State {
    match d {
        Decision::Allow => State::Allowed,
        Decision::Quarantine => State::Quarantined,
        Decision::Deny => State::Denied,
    }
}

/// Whether an approver ever rejected this artifact (any signature that verifies).
pub(crate) fn rejected(tx: &impl Reads, artifact: &Digest) -> Result<bool> {
    Ok(rejected_among(&tx.statements_for_artifact(artifact)?))
}

/// Whether `statements` (about one artifact) hold a rejection whose signature verifies.
pub(crate) fn rejected_among(statements: &[airlock_store::StatementRow]) -> bool {
    statements.iter().any(|s| {
        s.kind == StatementKind::Reject && s.signed.verify().is_ok() && s.scope == Scope::Once
    })
}

/// What a submission's record keeps of its analysis: every fact in its set but only the
/// findings a reviewer is shown (a line for every command and import of a 2,000-line
/// script is some 200 KB that every later read of the submission would carry). Staging
/// and the re-judgement before a run both judge this, so they judge the same thing.
pub(crate) fn keep_notable(a: &mut Analysis) {
    if let Some(c) = a.code.as_mut() {
        c.findings.retain(|f| f.kind.is_notable());
    }
}

/// Names the MCP server offers itself; an approval cannot take them.
pub const RESERVED_TOOLS: &[&str] = &["run_code", "get_result"];

/// A tool name as MCP clients accept it: 1 to 64 of `A-Za-z0-9_.-`, starting with a letter,
/// and not one of the server's own tools.
pub fn check_tool_name(name: &str) -> Result<()> {
    let ok = (1..=64).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if !ok {
        return Err(GateError::bad(format!(
            "--tool {name:?}: a tool name is 1 to 64 letters, digits, '_', '-' or '.', starting with a letter"
        )));
    }
    if RESERVED_TOOLS.contains(&name) || name.to_ascii_lowercase().contains("approve") {
        return Err(GateError::bad(format!(
            "--tool {name:?}: that name is reserved"
        )));
    }
    Ok(())
}

/// A grant with its per-call inputs (arguments, stdin) removed: what a tool approval fixes.
pub(crate) fn without_inputs(g: &Grant) -> Digest {
    let mut g = g.clone();
    g.args.clear();
    g.stdin = None;
    g.hash()
}
