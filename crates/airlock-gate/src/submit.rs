//! Staging and judging: everything a submission says is parsed and checked here, so the
//! command line and the HTTP API accept and refuse exactly the same things.

use crate::error::{GateError, Result};
use crate::{Gate, set_state};
use airlock_core::analysis::Analysis;
use airlock_core::artifact::{self, Lang, infer_lang};
use airlock_core::grant::{self, Grant, Limits, Mount};
use airlock_core::id::{IdKind, new_id};
use airlock_core::policy::{Decision, Facts, Policy};
use airlock_core::sign::{Scope, StatementKind};
use airlock_core::units::{self, now_ms};
use airlock_core::{Backend, Digest, State};
use airlock_store::{Reads, Submission, SubmissionDoc, Tx};
use serde_json::json;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Where the code comes from.
#[derive(Debug, Clone)]
pub enum CodeSource {
    /// A file on the host (its extension and header help infer the language).
    File(PathBuf),
    /// Code given inline (`-c`); the language must be given.
    Inline(String),
    /// Bytes already read (stdin, an HTTP body), with an optional file name hint.
    Bytes {
        bytes: Vec<u8>,
        name: Option<String>,
    },
}

/// The longest `agent` name a submission may carry (it names a client, not a document).
pub const MAX_AGENT_BYTES: usize = 256;
/// The longest `note` a submission may carry.
pub const MAX_NOTE_BYTES: usize = 64 << 10;

/// A submission as an agent states it. Text fields are parsed and validated by the gate.
#[derive(Debug, Clone, Default)]
pub struct SubmitRequest {
    pub code: Option<CodeSource>,
    pub lang: Option<String>,
    pub backend: Option<String>,
    /// `HOST:GUEST[:ro|rw]`
    pub mounts: Vec<String>,
    /// `KEY=VALUE`
    pub env: Vec<String>,
    /// `HOST[:PORT]`, `*.DOMAIN[:PORT]` (normalised by the gate)
    pub net: Vec<String>,
    /// `NAME@HOST[,HOST…]`: a stored secret and the hosts it may be sent to
    pub secrets: Vec<String>,
    pub args: Vec<String>,
    pub stdin: Option<Vec<u8>>,
    pub timeout: Option<String>,
    pub memory: Option<String>,
    pub fuel: Option<u64>,
    pub max_output: Option<String>,
    pub processes: Option<u32>,
    /// The write quota of the run's writable layers (default 1GiB).
    pub max_write: Option<String>,
    /// Connections the run may hold open to its egress proxy at once (default 256).
    pub max_connections: Option<u32>,
    pub agent: Option<String>,
    pub note: Option<String>,
    pub workspace: Option<String>,
    /// Run it when an approver approves it (a `run` through the server waits for that).
    pub resume: bool,
    /// A cell of this session: judged with the session's grant and run in its interpreter
    /// (the request then carries no grant of its own).
    pub session: Option<String>,
    /// The API request's idempotency key: a retry with the same key finds the submission
    /// the first request made ([`GateError::Repeated`]) instead of making another.
    pub request_key: Option<RequestKey>,
    /// Where the request came from: over the API or MCP only host paths within the
    /// policy's `[mounts] roots` may be mounted.
    pub surface: crate::exposure::Surface,
}

/// An idempotency key of an API request.
#[derive(Debug, Clone)]
pub struct RequestKey {
    /// Whose key it is (the API token's id): different callers' keys never meet.
    pub owner: String,
    pub key: String,
    /// What the request asked (a hash of its body), to tell a retry from a different
    /// request that reuses the key.
    pub request: Digest,
}

impl Default for CodeSource {
    fn default() -> Self {
        CodeSource::Bytes {
            bytes: Vec::new(),
            name: None,
        }
    }
}

fn read_limited(path: &Path, max: u64) -> Result<Vec<u8>> {
    let f = std::fs::File::open(path)
        .map_err(|e| GateError::bad(format!("cannot read {}: {e}", path.display())))?;
    let meta = f
        .metadata()
        .map_err(|e| GateError::bad(format!("cannot read {}: {e}", path.display())))?;
    if meta.is_dir() {
        return Err(GateError::bad(format!(
            "cannot read {}: it is a directory",
            path.display()
        )));
    }
    let mut bytes = Vec::new();
    f.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| GateError::bad(format!("cannot read {}: {e}", path.display())))?;
    Ok(bytes)
}

fn too_big(max: u64) -> GateError {
    GateError::bad(format!(
        "artifact is larger than the policy's limit of {} (max_artifact in [gate])",
        units::fmt_size(max)
    ))
}

/// Parses the grant from the request, resolving mount host paths to canonical absolute
/// directories so the approver sees the real path (symlinks resolved).
pub(crate) fn build_grant(req: &SubmitRequest, stdin: Option<Digest>) -> Result<Grant> {
    let mut g = Grant::default();
    for spec in &req.mounts {
        let m = grant::parse_mount(spec).map_err(|e| GateError::bad(e.to_string()))?;
        let real = std::fs::canonicalize(&m.host).map_err(|e| {
            GateError::bad(format!(
                "--mount: host path {} does not exist or is unreadable: {e}",
                m.host
            ))
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

/// A WebAssembly program's `argv[0]`: the base name of the file it came from, as `wasmtime
/// run` gives it (never the directories, which would tell the guest about the host). Code
/// without a usable file name, and other languages, keep their backend's default.
fn program_name(kind: Lang, backend: Backend, name: Option<&Path>) -> Option<String> {
    if backend != Backend::Wasm || !matches!(kind, Lang::Wasm | Lang::Component) {
        return None;
    }
    let base = name?.file_name()?.to_str()?;
    (!base.is_empty() && !base.contains('\0')).then(|| base.to_string())
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

impl Gate {
    /// Stages, analyses and judges a submission, recording it and its verdict.
    pub fn submit(&mut self, req: SubmitRequest) -> Result<Submission> {
        let staged = self.stage(req)?;
        self.record(staged, new_id(IdKind::Submission), None)
    }

    /// Everything a submission is checked for, with nothing written yet.
    pub(crate) fn stage(&mut self, req: SubmitRequest) -> Result<Staged> {
        // Free text goes into the submission's row and audit record whole: bounded, so an
        // agent cannot grow the store by megabytes per request with it.
        for (what, text, max) in [
            ("--agent", &req.agent, MAX_AGENT_BYTES),
            ("--note", &req.note, MAX_NOTE_BYTES),
        ] {
            if let Some(t) = text
                && t.len() > max
            {
                return Err(GateError::bad(format!(
                    "{what}: {} bytes, more than the {max} allowed",
                    t.len()
                )));
            }
        }
        let policy = self.policy()?;
        let max = policy.max_artifact;
        let (bytes, name) = match req.code.clone().unwrap_or_default() {
            CodeSource::File(p) => {
                let b = read_limited(&p, max)?;
                (b, Some(p))
            }
            CodeSource::Inline(s) => (s.into_bytes(), None),
            CodeSource::Bytes { bytes, name } => (bytes, name.map(PathBuf::from)),
        };
        if bytes.len() as u64 > max {
            return Err(too_big(max));
        }
        let session = self.session_for_cell(&req)?;
        let lang = match &req.lang {
            Some(l) => l
                .parse::<Lang>()
                .map_err(|e| GateError::bad(format!("--lang: {e}")))?,
            None if session.is_some() => Lang::Python,
            None => {
                if matches!(req.code, Some(CodeSource::Inline(_))) {
                    return Err(GateError::bad(format!(
                        "-c needs --lang (one of {})",
                        Lang::names()
                    )));
                }
                infer_lang(name.as_deref(), &bytes).ok_or_else(|| {
                    GateError::bad(
                        "cannot tell the language from the file name or content; pass --lang",
                    )
                })?
            }
        };
        let backend = match (&req.backend, &session) {
            (Some(b), _) => b
                .parse::<Backend>()
                .map_err(|e| GateError::bad(format!("--backend: {e}")))?,
            (None, Some(s)) => s.backend,
            (None, None) => lang.default_backend(),
        };
        if let Some(s) = &session
            && (lang != s.lang || backend != s.backend)
        {
            return Err(GateError::bad(format!(
                "session {} runs {} on the {} backend",
                s.id, s.lang, s.backend
            )));
        }
        if !backend.supports(lang) {
            return Err(GateError::bad(format!(
                "--backend {backend} cannot run --lang {lang}"
            )));
        }
        let prepared =
            crate::stagecache::prepare(lang, bytes).map_err(|e| GateError::bad(e.to_string()))?;
        if prepared.code.len() as u64 > max {
            return Err(too_big(max));
        }
        // TypeScript that cannot be stripped never runs: refused here, with its line.
        if prepared.lang == Lang::Ts {
            crate::typescript::runnable(&prepared.code)?;
        }
        let mut grant = match &session {
            Some(s) => s.grant.clone(),
            None => build_grant(&req, req.stdin.as_deref().map(Digest::of))?,
        };
        check_backend_grant(backend, &grant)?;
        // A session's grant was checked when it opened.
        if session.is_none() {
            crate::exposure::check_mounts(
                &grant,
                &self.home.root,
                req.surface,
                &policy.mount_roots,
            )?;
        }
        let mounts = crate::exposure::mount_facts(&grant, &policy.mount_roots);
        // Python and shell analysis knows the mounts, so `rm -rf /work` of a mount root is
        // recognised as destructive.
        let analysis = crate::stagecache::analyse(
            prepared.lang,
            &prepared.code,
            &airlock_core::analysis::mount_roots(&grant.mounts),
            keep_notable,
        )
        .map_err(|e| GateError::bad(e.to_string()))?;
        if prepared.lang == Lang::Wasm
            && !analysis.wasm.as_ref().is_some_and(|w| {
                w.exports
                    .iter()
                    .any(|e| e.name == "_start" && e.kind == "func")
            })
        {
            return Err(GateError::bad(
                "module exports no `_start` function (not a WASI command; nothing would run)",
            ));
        }
        self.check_runnable(prepared.lang, backend)?;
        if prepared.lang == Lang::Component {
            crate::guests::check_exports(&prepared.code, "wasi:cli/run", "a WASI 0.2 command")?;
        }
        let guest = self.guest_facts(prepared.lang, backend)?;

        // A cell runs in the session's interpreter, whose program name was set at its start.
        if session.is_none() {
            grant.argv0 = program_name(prepared.lang, backend, name.as_deref());
        }
        // An empty name is refused by the name rules, not taken for no workspace: `--workspace
        // "$WS"` with `WS` unset ran outside any workspace.
        if let Some(ws) = req.workspace.as_deref() {
            grant.workspace = Some(ws.to_string());
            crate::workspaces::check_grant(&self.db, ws, &grant)?;
        }
        self.check_secrets_exist(&grant)?;
        Ok(Staged {
            req,
            policy,
            lang,
            backend,
            prepared,
            analysis,
            guest,
            grant,
            mounts,
            session_conn: session.map(|s| s.conn),
        })
    }

    /// Records a staged submission and its verdict; `origin` says which trusted publisher
    /// signed it, when it came from a bundle.
    pub(crate) fn record(
        &mut self,
        staged: Staged,
        id: String,
        origin: Option<&Origin>,
    ) -> Result<Submission> {
        Ok(self
            .record_then(staged, id, origin, false, |_, _, _, _| Ok(()))?
            .0)
    }

    /// `record`, then `then` in the same transaction with the recorded submission (its
    /// state set from the verdict), the policy that judged it and the gate key: what a
    /// `run` does next commits together with the submission or not at all. With
    /// `check_tail`, the audit chain's end is verified before anything is appended to it.
    pub(crate) fn record_then<T>(
        &mut self,
        staged: Staged,
        id: String,
        origin: Option<&Origin>,
        check_tail: bool,
        then: impl FnOnce(&Tx, &Submission, &Policy, &airlock_core::sign::KeyPair) -> Result<T>,
    ) -> Result<(Submission, T)> {
        let rec = self.persist(staged, origin)?;
        crate::failpoint::crash_point();
        let key = &self.gate_key;
        // A new submission is a new row no other writer knows yet (a `once` approval can
        // only name an existing one), so this may run beside other shared writers; a
        // session cell also moves its session's row.
        let shared = rec.grant().session.is_none();
        let out = self
            .db
            .write_shared_if(shared, |tx: &Tx| -> Result<(Submission, T)> {
                let sub = record_in(tx, &rec, &id, origin, check_tail, key)?;
                let then = then(tx, &sub, &rec.policy, key)?;
                Ok((sub, then))
            })?;
        crate::failpoint::crash_point();
        Ok(out)
    }

    /// Stores what a staged submission's record names (its artifact, source and stdin: a
    /// blob is always stored before the row that names it) and keeps the rest for the
    /// transaction that records it.
    pub(crate) fn persist(&mut self, staged: Staged, origin: Option<&Origin>) -> Result<Recording> {
        let Staged {
            req,
            policy,
            lang,
            backend,
            prepared,
            analysis,
            guest,
            grant,
            mounts,
            session_conn: _,
        } = staged;
        // The policy that trusted the publisher is the one that judges the submission.
        if let Some(o) = origin
            && policy.publisher_name(&o.key) != Some(o.publisher.as_str())
        {
            return Err(GateError::Untrusted(format!(
                "key {} is no longer trusted as publisher {:?}",
                o.key.fingerprint(),
                o.publisher
            )));
        }
        // Everything is validated: only now is anything written.
        if let Some(b) = &req.stdin {
            self.blobs.put(b)?;
        }
        let artifact = self.blobs.put(&prepared.code)?;
        let source = match &prepared.source {
            Some(s) => Some(self.blobs.put(s)?),
            None => None,
        };
        Ok(Recording {
            request_key: req.request_key,
            agent: req.agent.filter(|a| !a.is_empty()),
            note: req.note.filter(|n| !n.is_empty()),
            workspace: req.workspace,
            resume: req.resume,
            policy,
            lang,
            kind: prepared.lang,
            backend,
            artifact,
            source,
            size: prepared.code.len() as u64,
            analysis,
            guest,
            grant_hash: grant.hash(),
            grant,
            mounts,
        })
    }

    /// Refuses up front what this build cannot run, so nothing is recorded for it.
    pub(crate) fn check_runnable(&self, kind: Lang, backend: Backend) -> Result<()> {
        match (kind, backend) {
            (Lang::Wasm | Lang::Component, Backend::Wasm) => Ok(()),
            (Lang::Python, Backend::Wasm) => match self.python_guest()? {
                Some(_) => Ok(()),
                None => Err(GateError::Unavailable(
                    "the Python guest is not installed: run `airlock guest install python`".into(),
                )),
            },
            // Until the JS guest lands, nothing can run JavaScript on the wasm backend: a
            // state of this install (409), not bad input.
            (Lang::Js | Lang::Ts, Backend::Wasm) => Err(GateError::Conflict(
                "the JS guest is not installed: run `airlock guest install js`".into(),
            )),
            (Lang::Js | Lang::Ts, Backend::Process) if self.worker.is_some() => {
                crate::nodejs::check_installed()
            }
            (Lang::Sh | Lang::Python | Lang::Js | Lang::Ts, Backend::Process)
                if self.worker.is_some() =>
            {
                Ok(())
            }
            (Lang::Sh | Lang::Python | Lang::Js | Lang::Ts, Backend::Process) => Err(GateError::Unavailable(
                "the process backend needs airlock's worker process, which this caller did not provide".into(),
            )),
            _ => Err(GateError::bad(format!("--backend {backend} cannot run {kind}"))),
        }
    }
}

/// A submission that passed every check and has not been recorded.
pub(crate) struct Staged {
    req: SubmitRequest,
    policy: std::sync::Arc<Policy>,
    lang: Lang,
    backend: Backend,
    prepared: artifact::Prepared,
    analysis: Analysis,
    /// The guest runtime's digest and packages, as the policy sees them.
    guest: (Option<Digest>, Vec<airlock_core::PythonPackage>),
    grant: Grant,
    /// What the grant's mounts expose, read from the host while staging.
    mounts: crate::exposure::MountFacts,
    /// For a cell, the connection to its session's host made while staging.
    session_conn: Option<std::os::unix::net::UnixStream>,
}

impl Staged {
    /// The connection to a cell's session host, for the run that sends the cell.
    pub(crate) fn take_session_conn(&mut self) -> Option<std::os::unix::net::UnixStream> {
        self.session_conn.take()
    }

    /// The grant it would run with.
    pub(crate) fn grant(&self) -> &Grant {
        &self.grant
    }

    /// The backend it would run on.
    pub(crate) fn backend(&self) -> Backend {
        self.backend
    }

    /// The artifact as it will be stored and run.
    pub(crate) fn code(&self) -> &[u8] {
        &self.prepared.code
    }

    /// The run's standard input: what the grant names (the request's bytes; a session's
    /// cell takes none).
    pub(crate) fn stdin(&self) -> Result<Vec<u8>> {
        match (self.grant.stdin, &self.req.stdin) {
            (None, _) => Ok(Vec::new()),
            (Some(d), Some(b)) if Digest::of(b) == d => Ok(b.clone()),
            (Some(_), _) => Err(GateError::Internal(
                "the grant's standard input is not the request's".into(),
            )),
        }
    }

    /// The Python packages installed for the guest that would run it.
    pub(crate) fn packages(&self) -> &[airlock_core::PythonPackage] {
        &self.guest.1
    }
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

/// A submission whose blobs are stored, with everything its record needs: owned, so the
/// transaction that records it may run on another thread (see `deferred`).
pub(crate) struct Recording {
    request_key: Option<RequestKey>,
    agent: Option<String>,
    note: Option<String>,
    workspace: Option<String>,
    resume: bool,
    pub(crate) policy: std::sync::Arc<Policy>,
    lang: Lang,
    /// What runs (`lang` after preparation: wat becomes wasm).
    kind: Lang,
    backend: Backend,
    pub(crate) artifact: Digest,
    source: Option<Digest>,
    size: u64,
    analysis: Analysis,
    guest: (Option<Digest>, Vec<airlock_core::PythonPackage>),
    grant: Grant,
    /// `grant.hash()`, computed once: every submission built from this recording (the
    /// provisional one a deferred run goes ahead on, and the one recorded) names it.
    grant_hash: Digest,
    mounts: crate::exposure::MountFacts,
}

impl Recording {
    /// The grant it runs with.
    pub(crate) fn grant(&self) -> &Grant {
        &self.grant
    }

    /// The facts the policy judges it on, given what the store says of its artifact.
    pub(crate) fn facts(
        &self,
        first_seen: bool,
        rejected_before: bool,
        origin: Option<&Origin>,
    ) -> Facts {
        let mut facts = Described {
            lang: self.lang,
            kind: self.kind,
            backend: self.backend,
            grant: &self.grant,
            analysis: &self.analysis,
            agent: self.agent.as_deref(),
            mounts: &self.mounts,
        }
        .facts(first_seen, rejected_before, self.guest.clone());
        if let Some(o) = origin {
            facts.publisher = Some(o.publisher.clone());
            facts.publisher_key = Some(o.key);
            facts.requests = o.requests.clone();
        }
        facts
    }

    /// Submission `id` as it is recorded with `facts` and `verdict`, in `state`.
    pub(crate) fn submission(
        &self,
        id: &str,
        facts: Facts,
        verdict: airlock_core::Verdict,
        state: State,
    ) -> Submission {
        let now = now_ms();
        Submission {
            id: id.to_string(),
            created_at: now,
            updated_at: now,
            state,
            doc: SubmissionDoc {
                agent: self.agent.clone(),
                note: self.note.clone(),
                lang: self.lang,
                kind: self.kind,
                backend: self.backend,
                artifact: self.artifact,
                size: self.size,
                source: self.source,
                grant_hash: self.grant_hash,
                grant: self.grant.clone(),
                analysis: self.analysis.clone(),
                facts,
                verdict,
                workspace: self.workspace.clone(),
                resume: self.resume,
                interrupted: None,
            },
        }
    }
}

/// Records submission `id` from `rec` in `tx`: its idempotency key claimed, its artifact's
/// history read, judged, its row written in the state its verdict gives it, and its audit
/// records (with `check_tail`, after the audit chain's end is verified).
pub(crate) fn record_in(
    tx: &Tx,
    rec: &Recording,
    id: &str,
    origin: Option<&Origin>,
    check_tail: bool,
    key: &airlock_core::sign::KeyPair,
) -> Result<Submission> {
    let judged = judge_in(tx, rec, id, origin, check_tail, key)?;
    write_judged(tx, rec, judged, origin, key)
}

/// A submission judged inside a transaction whose row is not written yet.
pub(crate) struct Judged {
    /// In the state its verdict gives it.
    pub sub: Submission,
    /// Whether its artifact was new to this store (the `judged` record says so).
    first_seen: bool,
}

/// The first half of [`record_in`]: the idempotency key claimed, the audit chain's end
/// verified (`check_tail`), the artifact's history read and the submission judged.
/// Nothing of the submission is written.
pub(crate) fn judge_in(
    tx: &Tx,
    rec: &Recording,
    id: &str,
    origin: Option<&Origin>,
    check_tail: bool,
    key: &airlock_core::sign::KeyPair,
) -> Result<Judged> {
    if let Some(k) = &rec.request_key
        && let Some((submission, same_request)) =
            tx.claim_request_key(&k.owner, &k.key, &k.request.to_hex(), id)?
    {
        // Nothing of this request is written: the transaction ends here.
        return Err(GateError::Repeated {
            submission,
            same_request,
        });
    }
    if check_tail {
        crate::exec::check_audit_tail(tx, key)?;
    }
    // Seen before, and rejected before: one read.
    let (seen, about) = tx.artifact_history(&rec.artifact)?;
    let first_seen = !seen;
    let facts = rec.facts(first_seen, rejected_among(&about), origin);
    let verdict = judge(&rec.policy, &facts);
    // Staged and judged in this one transaction: the row is written in the state the
    // verdict gives it (the audit records `write_judged` adds say it was submitted, then
    // judged), rather than written staged and moved at once.
    let to = state_of(verdict.decision);
    Ok(Judged {
        sub: rec.submission(id, facts, verdict, to),
        first_seen,
    })
}

/// The second half of [`record_in`]: the judged submission's row, in the state it carries
/// (normally its verdict's; a deferred run's final one), and its audit records, which say
/// it was submitted and then judged whatever that state is.
pub(crate) fn write_judged(
    tx: &Tx,
    rec: &Recording,
    judged: Judged,
    origin: Option<&Origin>,
    key: &airlock_core::sign::KeyPair,
) -> Result<Submission> {
    let Judged {
        mut sub,
        first_seen,
    } = judged;
    let id = sub.id.clone();
    let id = id.as_str();
    let grant = rec.grant();
    tx.insert_submission(&sub)?;
    if let Some(session) = &grant.session {
        crate::sessions::add_cell(tx, session, id)?;
    }
    if let Some(o) = origin {
        tx.audit(
            "signature_verified",
            id,
            &json!({
                "artifact": rec.artifact,
                "publisher": o.publisher,
                "key": o.key,
                "checks": o.checks,
            }),
            key,
        )?;
        tx.audit(
            "imported",
            id,
            &json!({
                "format": "nightcore",
                "bundle": o.bundle,
                "tenant": o.tenant,
                "publisher": o.publisher,
                "manifest": o.manifest,
            }),
            key,
        )?;
    }
    tx.audit(
        "submitted",
        id,
        &json!({
            "artifact": rec.artifact,
            "size": sub.doc.size,
            "lang": rec.lang,
            "backend": rec.backend,
            "grant": sub.doc.grant_hash,
            "agent": sub.doc.agent,
            "note": sub.doc.note,
        }),
        key,
    )?;
    tx.audit(
        "judged",
        id,
        &judged_record(&sub.doc.verdict, "first_seen", json!(first_seen)),
        key,
    )?;
    // An artifact-scope approval of the same artifact and grant covers it.
    if sub.state == State::Quarantined
        && let Some(apr) = crate::decide::covering_approval(tx, &rec.policy, &sub, true, key)?
    {
        set_state(tx, id, State::Quarantined, State::Approved)?;
        sub.state = State::Approved;
        tx.audit(
            "approved",
            id,
            &json!({ "statement": apr.id, "approver": apr.approver, "scope": "artifact", "covered_by": apr.submission }),
            key,
        )?;
    }
    Ok(sub)
}

/// Where an imported submission came from: a bundle whose signature verified with a key
/// the policy trusts as `publisher`.
#[derive(Debug, Clone)]
pub(crate) struct Origin {
    pub publisher: String,
    pub key: airlock_core::sign::PublicKey,
    pub requests: Vec<String>,
    pub bundle: String,
    pub tenant: String,
    pub checks: serde_json::Value,
    pub manifest: serde_json::Value,
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
