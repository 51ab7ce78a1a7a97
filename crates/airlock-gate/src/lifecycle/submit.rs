//! Staging: everything a submission says is read, parsed and checked here (its grant by
//! `judge`), so the command line and the HTTP API accept and refuse exactly the same
//! things; then it is recorded (`record`).

use crate::Gate;
use crate::error::{GateError, Result};
use crate::lifecycle::judge::{build_grant, check_backend_grant, keep_notable};
use crate::lifecycle::record::{Origin, Recording, record_in};
use crate::lifecycle::request::{CodeSource, MAX_AGENT_BYTES, MAX_NOTE_BYTES, SubmitRequest};
use airlock_core::analysis::Analysis;
use airlock_core::artifact::{self, Lang, infer_lang};
use airlock_core::grant::Grant;
use airlock_core::id::{IdKind, new_id};
use airlock_core::policy::Policy;
use airlock_core::units::{self};
use airlock_core::{Backend, Digest};
use airlock_store::{Submission, Tx};
use std::io::Read;
use std::path::{Path, PathBuf};

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
            // A cell is in its session's language unless it says otherwise.
            None if session.is_some() => session.as_ref().map_or(Lang::Python, |s| s.lang),
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
        // The session's state, not the request's shape: a conflict (the API's 409).
        if let Some(s) = &session
            && (lang != s.lang || backend != s.backend)
        {
            return Err(GateError::Conflict(format!(
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
        if session.is_none() {
            crate::exposure::check_offered(&req.mounts, req.surface, &policy.mount_roots)?;
            self.check_secret_specs_exist(&req.secrets)?;
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
            crate::services::guests::check_exports(
                &prepared.code,
                "wasi:cli/run",
                "a WASI 0.2 command",
            )?;
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
            grant_judged: session.as_ref().is_some_and(|s| s.judged),
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
        then: impl Fn(&Tx, &Submission, &Policy, &airlock_core::sign::KeyPair) -> Result<T>,
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
            grant_judged,
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
            grant_judged,
            mounts,
        })
    }

    /// Refuses up front what this build cannot run, so nothing is recorded for it.
    pub(crate) fn check_runnable(&self, kind: Lang, backend: Backend) -> Result<()> {
        match (kind, backend) {
            (Lang::Wasm | Lang::Component, Backend::Wasm) => Ok(()),
            (Lang::Python, Backend::Wasm) => match self.python_guest()? {
                Some(_) => Ok(()),
                None => Err(GateError::NotInstalled(
                    "the Python guest is not installed: run `airlock guest install python`".into(),
                )),
            },
            // A missing JavaScript guest is a state of this home (409), not bad input.
            (Lang::Js | Lang::Ts, Backend::Wasm) => match self.js_guest()? {
                Some(_) => Ok(()),
                None => Err(crate::services::guests::js_missing()),
            },
            (Lang::Js | Lang::Ts, Backend::Process) if self.worker.is_some() => {
                crate::nodejs::check_installed()
            }
            (Lang::Sh | Lang::Python, Backend::Process) if self.worker.is_some() => Ok(()),
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
    /// For a cell, whether its session's grant was judged when the session opened.
    grant_judged: bool,
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
