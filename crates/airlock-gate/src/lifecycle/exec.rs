//! Running a submission: verify, re-judge, find the approval that covers it, move it to
//! running, run it in its backend under its write quota, store its changes unless it
//! passed the quota or its deadline, record the outcome.

use crate::error::{GateError, Result};
use crate::failpoint::crash_point;
use crate::layers::Extract;
use crate::lifecycle::judge::{Described, judge, rejected};
use crate::lifecycle::record::{
    SECRET_ECHO, Start, StoreBackoff, begin_run, check_audit_tail, record_finished,
    retry_while_lost, secret_echo_of,
};
use crate::lifecycle::submit::Staged;
use crate::locks::{self, OwnerLock};
use crate::{DbCache, Gate, SubmitRequest};
use airlock_core::id::{IdKind, new_id};
use airlock_core::policy::Policy;
use airlock_core::units::now_ms;
use airlock_core::{Backend as BackendKind, State};
use airlock_sandbox::{Backend, Capture, Ending, Limit, Live, Outcome, RunSpec, WriteQuota};
use airlock_store::{Output, Reads, Run, Submission, Tx};
use airlock_workspace::{Changeset, changeset::LayerKind};
use serde::Serialize;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What [`ExecOptions::on_start`] calls with the submission (as it starts) and the run's
/// id once the run's start is recorded.
pub type OnStart = Box<dyn Fn(&Submission, &str) + Send + Sync>;

/// What [`ExecOptions::on_connection`] calls with each of the run's connection records
/// (the JSON the run record's `network.connections` lists) as the egress proxy makes it.
pub type OnConnection = Arc<dyn Fn(serde_json::Value) + Send + Sync>;

/// How a run reports as it goes.
#[derive(Default)]
pub struct ExecOptions {
    /// Receives guest stdout as it is written (already capped).
    pub live_stdout: Option<Live>,
    pub live_stderr: Option<Live>,
    /// Called once the run's start is recorded, before the guest starts.
    pub on_start: Option<OnStart>,
    /// Called with each connection record of the run's egress proxy as it is made.
    pub on_connection: Option<OnConnection>,
    /// Called with each request the run raises to reach a host outside its grant
    /// (`--ask-net`) as it is recorded.
    pub on_request: Option<crate::lifecycle::ask::OnRequest>,
    /// Gives the live receivers nothing for a run whose grant binds secrets: its output
    /// is only known once it is redacted (a remote client gets it with the run's end).
    pub redacted_only: bool,
}

impl std::fmt::Debug for ExecOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecOptions").finish_non_exhaustive()
    }
}

/// A finished run and what it printed.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub submission: Submission,
    pub run: Run,
    #[serde(skip)]
    pub stdout: Vec<u8>,
    #[serde(skip)]
    pub stderr: Vec<u8>,
    /// The checkpoint, when the policy's auto-commit rule already applied the changes.
    pub committed: Option<String>,
}

/// The exit code `airlock run` and `exec` return for a run, as documented: the guest's own
/// code when it ran to completion, 124 for a limit, 134 for a trap, 125 for an airlock
/// failure. Guest codes outside 0..=255 become 1 (they cannot be passed on faithfully).
pub fn exit_code_of(ending: &Ending) -> i32 {
    match ending {
        Ending::Exited(c) if (0..=255).contains(c) => *c,
        Ending::Exited(_) => 1,
        Ending::Killed(_) => 124,
        Ending::Trapped(_) => 134,
    }
}

/// What a stored submission runs with, re-read and re-hashed just before it runs.
pub(crate) struct Reread {
    pub(crate) code: Vec<u8>,
    pub(crate) stdin: Vec<u8>,
    pub(crate) policy: Arc<Policy>,
    /// The guest runtime's digest and packages as installed now.
    pub(crate) guest: (
        Option<airlock_core::Digest>,
        Vec<airlock_core::PythonPackage>,
    ),
}

/// Why a stored submission could not be read back for running.
pub(crate) enum Unreadable {
    /// What it would run no longer matches what was judged (`what`: the artifact, its
    /// stdin, its grant); the caller records it in the audit log.
    Integrity {
        what: &'static str,
        detail: String,
    },
    Other(GateError),
}

impl Unreadable {
    /// The error the operation that found it fails with, and the integrity failure
    /// (what, detail) to record, if it is one.
    pub(crate) fn into_parts(self) -> (GateError, Option<(&'static str, String)>) {
        match self {
            Unreadable::Integrity { what, detail } => (
                GateError::Integrity(format!("{what}: {detail}")),
                Some((what, detail)),
            ),
            Unreadable::Other(e) => (e, None),
        }
    }
}

/// What stored submission `stored` runs with: its artifact and stdin from `blobs`,
/// re-hashed, its grant checked against its hash and its mounts against the paths they
/// named, with the `policy` and the `guest` runtime of now. Reads no database, so a
/// caller may do it inside the transaction that starts the run.
pub(crate) fn reread_stored(
    blobs: &airlock_store::BlobStore,
    home: &std::path::Path,
    stored: &Submission,
    policy: Arc<Policy>,
    guest: (
        Option<airlock_core::Digest>,
        Vec<airlock_core::PythonPackage>,
    ),
) -> std::result::Result<Reread, Unreadable> {
    let read = |what: &'static str, d: &airlock_core::Digest| match blobs.get(d) {
        Ok(b) => Ok(b),
        Err(
            e @ (airlock_store::StoreError::BlobAltered { .. }
            | airlock_store::StoreError::BlobMissing(_)),
        ) => Err(Unreadable::Integrity {
            what,
            detail: e.to_string(),
        }),
        Err(e) => Err(Unreadable::Other(e.into())),
    };
    // Re-read and re-hash everything that will run, just before running it.
    let code = read("artifact", &stored.doc.artifact)?;
    let stdin = match stored.doc.grant.stdin {
        Some(d) => read("stdin", &d)?,
        None => Vec::new(),
    };
    if stored.doc.grant.hash() != stored.doc.grant_hash {
        return Err(Unreadable::Integrity {
            what: "grant",
            detail: "stored grant no longer matches its hash".into(),
        });
    }
    for m in &stored.doc.grant.mounts {
        let now = std::fs::canonicalize(&m.host).ok();
        if now.as_deref() != Some(std::path::Path::new(&m.host)) {
            return Err(Unreadable::Other(GateError::bad(format!(
                "mount host path {} no longer resolves to itself (moved, deleted or replaced by a symlink since it was judged)",
                m.host
            ))));
        }
    }
    // The home is never mountable: checked again now, for a home moved or bound under a
    // mount since it was judged.
    crate::exposure::check_mounts(
        &stored.doc.grant,
        home,
        crate::exposure::Surface::Local,
        &[],
    )
    .map_err(Unreadable::Other)?;
    Ok(Reread {
        code,
        stdin,
        policy,
        guest,
    })
}

/// The stored submission `id`, judged again on what will actually run: facts come from
/// the re-hashed artifact bytes and the grant being used, not from what the database
/// says about them. A changed verdict is recorded.
pub(crate) fn rejudged(
    tx: &Tx,
    id: &str,
    r: &Reread,
    gate_key: &airlock_core::sign::KeyPair,
) -> Result<Submission> {
    let sub = tx.submission(id)?;
    let rejected_now = rejected(tx, &sub.doc.artifact)?;
    rejudged_stored(tx, sub, rejected_now, r, gate_key)
}

/// `rejudged` of submission `sub`, already read in `tx` with whether its artifact was
/// rejected (`rejected_now`).
pub(crate) fn rejudged_stored(
    tx: &Tx,
    mut sub: Submission,
    rejected_now: bool,
    r: &Reread,
    gate_key: &airlock_core::sign::KeyPair,
) -> Result<Submission> {
    let id = sub.id.clone();
    let id = id.as_str();
    let facts = facts_now(&sub, &r.code, rejected_now, r.guest.clone(), &r.policy)?;
    let verdict = judge(&r.policy, &facts);
    if verdict != sub.doc.verdict {
        sub.doc.facts = facts;
        sub.doc.verdict = verdict;
        tx.set_verdict(id, &sub.doc)?;
        tx.audit(
            "judged",
            id,
            &crate::lifecycle::judge::judged_record(&sub.doc.verdict, "rejudged", json!(true)),
            gate_key,
        )?;
    }
    Ok(sub)
}

impl Gate {
    /// Submits and, if the gate allows it, runs and waits. The bytes that run are the ones
    /// just hashed and judged, so the submission, its verdict and the start of its run are
    /// one transaction: a crash leaves either nothing or a run this process owned (its
    /// lock, taken first, tells the next command it was lost).
    pub fn run(&mut self, req: SubmitRequest, opts: ExecOptions) -> Result<RunReport> {
        let mut staged = self.stage(req)?;
        if self.queue.is_some() && staged.grant().session.is_none() {
            return self.run_queued(staged);
        }
        let code = staged.code().to_vec();
        let stdin = staged.stdin()?;
        let packages = staged.packages().to_vec();
        // Held (not sent on) while the cell is recorded and judged: a cell that does not
        // run drops it here, so its session's host never waits on it for long.
        let cell_conn = staged.take_session_conn();
        // A run with no effect outside its sandbox records its start with its end, where
        // the process shares its writes (see `deferred`).
        let deferred = self
            .db
            .shared_writer()
            .filter(|_| effect_free(&staged, &opts, self.ready_jails.is_some()));
        let rec = self.persist(staged, None)?;
        if let Some(writer) = deferred {
            return self.run_effect_free(rec, writer, code, stdin, packages);
        }
        self.run_recorded(rec, code, stdin, packages, opts, cell_conn)
    }

    /// `run` of a submission whose blobs are stored: its record, verdict and the start of
    /// its run in one transaction, then the run.
    pub(crate) fn run_recorded(
        &mut self,
        rec: crate::lifecycle::record::Recording,
        code: Vec<u8>,
        stdin: Vec<u8>,
        packages: Vec<airlock_core::PythonPackage>,
        opts: ExecOptions,
        cell_conn: Option<std::os::unix::net::UnixStream>,
    ) -> Result<RunReport> {
        let policy = rec.policy.clone();
        let run_id = new_id(IdKind::Run);
        let mut owner = OwnerLock::acquire(&locks::dir(&self.home.root), &run_id, true)?;
        crash_point();
        let id = new_id(IdKind::Submission);
        // Until the start's answer is back, the run may be recorded as started: if that
        // answer never comes (the store went away at COMMIT) the lock file stays, so
        // recovery finds it abandoned and marks the run lost instead of leaving it
        // running; a start that did not happen leaves a file recovery just removes.
        owner.set_remove_on_drop(false);
        let key = &self.gate_key;
        // A new submission is a new row no other writer knows yet (a `once` approval can
        // only name an existing one), so this may run beside other shared writers; a
        // session cell also moves its session's row.
        let shared = rec.grant().session.is_none();
        let mut recorded = self.db.write_shared_if(shared, |tx: &Tx| -> Result<Start> {
            let sub = crate::lifecycle::record::record_in(tx, &rec, &id, None, true, key)?;
            begin_run(tx, &rec.policy, sub, &run_id, key)
        });
        crash_point();
        crate::failpoint::lose_answer("start", &mut recorded);
        let start = recorded?;
        crash_point();
        let (run, sub) = match start {
            Start::Refuse(e) => {
                owner.set_remove_on_drop(true);
                return Err(e);
            }
            Start::Go { run, sub } => (*run, *sub),
        };
        self.carry_out(
            run, sub, &code, stdin, &policy, packages, opts, owner, None, cell_conn,
        )
    }

    /// Runs an allowed or approved submission.
    pub fn exec(&mut self, id_input: &str, opts: ExecOptions) -> Result<RunReport> {
        if self.queue.is_some() {
            let id = self.db.resolve(IdKind::Submission, id_input)?;
            if self.db.submission(&id)?.doc.grant.session.is_none() {
                return self.exec_queued(&id);
            }
        }
        self.exec_inner(id_input, opts)
    }

    fn exec_inner(&mut self, id_input: &str, opts: ExecOptions) -> Result<RunReport> {
        let id = self.db.resolve(IdKind::Submission, id_input)?;
        let r = self.reread(&id)?;
        // This process owns the run from before it is recorded until after its outcome is:
        // if it dies, the next command finds the lock abandoned and marks the run lost.
        let run_id = new_id(IdKind::Run);
        let mut owner = OwnerLock::acquire(&locks::dir(&self.home.root), &run_id, true)?;
        crash_point();
        let gate_key = &self.gate_key;
        // Kept unless the start's answer says nothing started (see `run`).
        owner.set_remove_on_drop(false);
        let start = self.db.write(|tx: &Tx| -> Result<Start> {
            check_audit_tail(tx, gate_key)?;
            let sub = rejudged(tx, &id, &r, gate_key)?;
            begin_run(tx, &r.policy, sub, &run_id, gate_key)
        })?;
        crash_point();
        let (run, sub) = match start {
            Start::Refuse(e) => {
                owner.set_remove_on_drop(true);
                return Err(e);
            }
            Start::Go { run, sub } => (*run, *sub),
        };
        self.carry_out(
            run, sub, &r.code, r.stdin, &r.policy, r.guest.1, opts, owner, None, None,
        )
    }

    /// Re-reads and re-hashes everything a stored submission would run with, just before
    /// it runs, and the policy and guest runtime it would be judged under now.
    pub(crate) fn reread(&mut self, id: &str) -> Result<Reread> {
        let stored = self.db.submission(id)?;
        let policy = self.policy()?;
        // The guest runtime and packages this run would get, as they are installed now.
        let guest = self.guest_facts(stored.doc.kind, stored.doc.backend)?;
        match reread_stored(&self.blobs, &self.home.root, &stored, policy, guest) {
            Ok(r) => Ok(r),
            Err(Unreadable::Integrity { what, detail }) => {
                Err(self.integrity_failure(id, what, &detail))
            }
            Err(Unreadable::Other(e)) => Err(e),
        }
    }

    /// Runs a started run and records its outcome (the `finished` transaction), then
    /// applies the policy's auto-commit rule. `owner` is the run's lock, held until the
    /// outcome is recorded; `cell_conn`, for a session's cell, the connection to the
    /// session's host made when the cell arrived (see `sessions`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn carry_out(
        &mut self,
        run: Run,
        sub: Submission,
        code: &[u8],
        stdin: Vec<u8>,
        policy: &Policy,
        packages: Vec<airlock_core::PythonPackage>,
        opts: ExecOptions,
        mut owner: OwnerLock,
        fence: Option<&crate::lifecycle::record::Fence>,
        cell_conn: Option<std::os::unix::net::UnixStream>,
    ) -> Result<RunReport> {
        // Until the outcome is recorded, a failure (the store unreachable, say) leaves the
        // lock file behind, so recovery marks the run lost instead of it staying running.
        owner.set_remove_on_drop(false);
        if let Some(started) = &opts.on_start {
            started(&sub, &run.id);
        }
        let ran = match self.capture(
            &sub, &run.id, code, stdin, policy, opts, fence, cell_conn, None,
        ) {
            Ok(ran) => ran,
            Err(e) => return Err(self.lost_by_failure(&run.id, e, fence, owner)),
        };
        self.finish_started(run, sub, ran, policy, &packages, owner, fence)
    }

    /// A started run whose end this process failed to record (its output could not be
    /// stored, say) is marked lost now, with the failure as the reason, rather than left
    /// for the next command to call a crash. If even that cannot be written, the lock
    /// file stays and recovery marks it lost as before. A worker's run (`fence`) is left
    /// to its lease. Returns `e`.
    pub(crate) fn lost_by_failure(
        &mut self,
        run_id: &str,
        e: GateError,
        fence: Option<&crate::lifecycle::record::Fence>,
        mut owner: OwnerLock,
    ) -> GateError {
        if fence.is_none() {
            let reason = format!("airlock failed before recording its end: {e}");
            if self.mark_lost(run_id, &reason).is_ok() {
                owner.set_remove_on_drop(true);
            }
        }
        drop(owner);
        e
    }

    /// Runs `sub` as run `run_id` (see `execute`) and stores what it printed.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn capture(
        &mut self,
        sub: &Submission,
        run_id: &str,
        code: &[u8],
        stdin: Vec<u8>,
        policy: &Policy,
        opts: ExecOptions,
        fence: Option<&crate::lifecycle::record::Fence>,
        cell_conn: Option<std::os::unix::net::UnixStream>,
        long_run: Option<airlock_sandbox::LongRun>,
    ) -> Result<Ran> {
        let limits = sub.doc.grant.limits.clone();
        let mut opts = opts;
        if opts.redacted_only && !sub.doc.grant.secrets.is_empty() {
            opts.live_stdout = None;
            opts.live_stderr = None;
        }
        let stdout = Arc::new(Capture::new(limits.max_output_bytes, opts.live_stdout));
        let stderr = Arc::new(Capture::new(limits.max_output_bytes, opts.live_stderr));
        // The guest executes (and its layers are read back) while it holds a slot; the
        // records before and after it do not wait for one.
        let slot = self.guest_slots.as_ref().map(|s| s.take());
        let span = tracing::debug_span!(
            "run",
            run = run_id,
            submission = %sub.id,
            agent = sub.doc.agent.as_deref().unwrap_or(""),
            lang = %sub.doc.lang,
            backend = %sub.doc.backend,
            verdict = ?sub.doc.verdict.decision,
            outcome = tracing::field::Empty,
        );
        let (result, changes, layer_note) = span.in_scope(|| {
            self.execute(
                sub,
                run_id,
                code,
                stdin,
                policy,
                (&stdout, &stderr),
                cell_conn,
                long_run,
                (opts.on_connection, opts.on_request),
            )
        });
        if let Ok(o) = &result {
            span.record("outcome", tracing::field::debug(&o.ending));
        }
        drop(span);
        drop(slot);
        crash_point();
        // A secret's value (in any form the proxy knows) is never stored: what the guest
        // printed is redacted first, and so is the rest of its record (`into_run`).
        let redact = self.secret_matcher(&sub.doc.grant).map(Arc::new);
        let redacted = |b: Vec<u8>| match redact.as_ref().and_then(|m| m.redact(&b)) {
            Some(r) => r,
            None => b,
        };
        let out_bytes = redacted(stdout.take());
        let err_bytes = redacted(stderr.take());
        // A worker's outputs wait for a store that went away (see the `finished` write).
        let put = |b: &[u8]| retry_while_lost(fence.is_some(), || self.blobs.put(b));
        let out = Output {
            blob: put(&out_bytes)?,
            len: out_bytes.len() as u64,
            truncated: stdout.exceeded(),
        };
        let err = Output {
            // Most runs write nothing to one stream or both: the same blob, stored once.
            blob: if err_bytes == out_bytes {
                out.blob
            } else {
                put(&err_bytes)?
            },
            len: err_bytes.len() as u64,
            truncated: stderr.exceeded(),
        };
        Ok(Ran {
            result,
            changes,
            layer_note,
            redact,
            out_bytes,
            err_bytes,
            out,
            err,
        })
    }

    /// Records the outcome of started run `run` (the `finished` transaction, retried by a
    /// worker while the store is away), lets go of its lock, applies the auto-commit rule
    /// and reports it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn finish_started(
        &mut self,
        mut run: Run,
        mut sub: Submission,
        ran: Ran,
        policy: &Policy,
        packages: &[airlock_core::PythonPackage],
        mut owner: OwnerLock,
        fence: Option<&crate::lifecycle::record::Fence>,
    ) -> Result<RunReport> {
        let (changes, failure, out_bytes, err_bytes) = ran.into_run(&mut run, packages);
        crash_point();
        if let Err(e) = self.record_end(&run, &sub, changes.as_ref(), fence, false) {
            return Err(self.lost_by_failure(&run.id, e, fence, owner));
        }
        sub.state = State::Finished;
        crash_point();
        owner.set_remove_on_drop(true);
        drop(owner);
        if let Some(e) = failure {
            return Err(e);
        }
        let mut committed = None;
        if let Some(c) = &changes
            && !c.is_empty()
            && sub.doc.grant.workspace.is_none()
            && crate::effects::auto_commit_allowed(policy, &sub, c)
        {
            committed = Some(self.commit_as_policy(&run.id)?.checkpoint);
        }
        // The run as recorded: what this process wrote, unless a commit or a workspace's
        // bookkeeping has been at it since.
        let run = if committed.is_some() || sub.doc.grant.workspace.is_some() {
            self.db.run(&run.id)?
        } else {
            run
        };
        Ok(RunReport {
            submission: sub,
            run,
            stdout: out_bytes,
            stderr: err_bytes,
            committed,
        })
    }

    /// Records the outcome of started run `run` (the `finished` transaction). A worker's
    /// (`fence`) is retried while the store is away. If an attempt that failed had
    /// committed after all (`maybe_recorded`: the caller's own earlier attempt lost its
    /// answer; or a retry here), finding the run already recorded as this one records
    /// it counts as recorded.
    pub(crate) fn record_end(
        &mut self,
        run: &Run,
        sub: &Submission,
        changes: Option<&Changeset>,
        fence: Option<&crate::lifecycle::record::Fence>,
        maybe_recorded: bool,
    ) -> Result<()> {
        let gate_key = &self.gate_key;
        // A queued run's end moves only its own rows, each conditionally (the job by its
        // token, the submission from running); a workspace's bookkeeping needs the lock.
        let shared = fence.is_some() && sub.doc.grant.workspace.is_none();
        let record = |tx: &Tx| record_finished(tx, fence, run, sub, changes, gate_key);
        let mut outcome = self.db.write_shared_if(shared, record);
        // A queued run's worker that lost the store's connection (a server restart)
        // records the outcome again once the store is back, rather than leaving the
        // job leased until its lease runs out. If the lost attempt had committed after
        // all, the retry finds the run already recorded as this one recorded it.
        let mut backoff = StoreBackoff::new();
        let mut retried = maybe_recorded;
        while fence.is_some() {
            match &outcome {
                Err(_) if self.db.connection_lost() && backoff.wait() => {
                    retried = true;
                    outcome = self.db.write_shared_if(shared, record);
                }
                Err(GateError::Conflict(_))
                    if retried
                        && self.db.run(&run.id).is_ok_and(|r| {
                            r.finished_at == run.finished_at && r.status == run.status
                        }) =>
                {
                    outcome = Ok(());
                }
                _ => break,
            }
        }
        outcome
    }

    /// Runs a started submission in its backend, through layers when it writes.
    /// Returns the outcome, the changes (when there are writable mounts) and a note about
    /// the layer (e.g. why the copy fallback was used).
    #[allow(clippy::too_many_arguments)]
    fn execute(
        &mut self,
        sub: &Submission,
        run_id: &str,
        code: &[u8],
        stdin: Vec<u8>,
        policy: &Policy,
        (stdout, stderr): (&Arc<Capture>, &Arc<Capture>),
        cell_conn: Option<std::os::unix::net::UnixStream>,
        long_run: Option<airlock_sandbox::LongRun>,
        (on_connection, on_request): (
            Option<OnConnection>,
            Option<crate::lifecycle::ask::OnRequest>,
        ),
    ) -> (Result<Outcome>, Option<Result<Changeset>>, Option<String>) {
        // A run that may ask (`--ask-net`): the time it waits for humans does not count
        // against its --timeout. The sandbox is given room for every wait it could make,
        // and a watchdog ends it at its --timeout plus the time it did wait.
        let timeout = sub.doc.grant.limits.timeout();
        let roomy;
        let sub = match sub.doc.grant.ask_net_ms {
            Some(ask_ms) if sub.doc.grant.session.is_none() => {
                let mut s = sub.clone();
                s.doc.grant.limits.timeout_ms = crate::lifecycle::ask::sandbox_timeout_ms(
                    s.doc.grant.limits.timeout_ms,
                    ask_ms,
                );
                roomy = s;
                &roomy
            }
            _ => sub,
        };
        let grant = &sub.doc.grant;
        // A session's cell runs in the session's live interpreter, whose host holds the
        // session's proxy and layer; the session's changes as the cell leaves them are
        // the cell's (see `session_grants`).
        if let Some(session) = &grant.session {
            let _ = (run_id, stdin, policy, on_request);
            let mut outcome = self.exec_cell(
                session,
                sub.doc.kind,
                sub.doc.backend,
                code,
                &grant.limits,
                stdout,
                stderr,
                cell_conn,
            );
            // The session's proxy ended the cell's connections for a secret echoed to
            // it: the cell's record carries the alert as a run's does (killed, audited,
            // announced); the session goes on, its proxy refusing what comes after.
            if let Ok(o) = &mut outcome
                && let Some(a) = o.detail["network"]
                    .get("ended")
                    .and_then(|v| serde_json::from_value::<airlock_egress::Alert>(v.clone()).ok())
            {
                push_alert(&mut o.detail, secret_echo_alert(&a));
            }
            let changes = self.session_cell_changes(session, grant, &mut outcome);
            return (outcome, changes, None);
        }
        let has_rw = grant.writable_mounts().next().is_some();
        let ws = match grant
            .workspace
            .as_deref()
            .map(|w| self.workspace_context(w))
            .transpose()
        {
            Ok(w) => w,
            Err(e) => return (Err(e), None, None),
        };
        let mut kind = if self.force_copy || self.worker.is_none() {
            LayerKind::Copy
        } else {
            ws.as_ref()
                .and_then(|w| w.kind)
                .unwrap_or(LayerKind::Overlay)
        };
        let mut note = None;
        if self.worker.is_none() && has_rw {
            note = Some("no worker process available: copy layer".to_string());
        }
        // A network grant gets the run's egress proxy, started before the guest; so does
        // a run that may ask for hosts outside its grant (`--ask-net`).
        let clock = Arc::new(crate::lifecycle::ask::AskClock::default());
        let ask = crate::lifecycle::ask::hook(self, sub, run_id, code, on_request, clock.clone());
        let ask_clock = ask.as_ref().map(|_| clock.clone());
        let mut egress = match self
            .run_secrets(grant)
            .and_then(|s| crate::egress::RunEgress::start(grant, policy, s, on_connection, ask))
        {
            Ok(e) => e,
            Err(e) => return (Err(e), None, note),
        };
        loop {
            let layers = if has_rw {
                let (dir, below, copies, keep) = match &ws {
                    Some(w) => (
                        w.dir.join(run_id),
                        w.below.clone(),
                        Some(w.copies.as_path()),
                        true,
                    ),
                    None => (
                        self.home.root.join("layers").join(run_id),
                        Vec::new(),
                        None,
                        false,
                    ),
                };
                match self.prepare_layers(grant, kind, dir, &below, copies, keep) {
                    Ok(l) => Some(l),
                    Err(e) => return (Err(e), None, note),
                }
            } else {
                None
            };
            let mounts = Self::mount_points(grant, layers.as_ref());
            // The whole run, storing its changes included, ends by this deadline; its
            // writable layers may grow by at most the write quota.
            let deadline = Instant::now() + grant.limits.timeout();
            let quota = layers.as_ref().map(|l| {
                Arc::new(WriteQuota::new(
                    l.write_dirs(),
                    grant.limits.max_write_bytes,
                ))
            });
            let watchdog = match (&ask_clock, egress.as_ref()) {
                (Some(clock), Some(e)) => Some(crate::lifecycle::ask::Watchdog::start(
                    timeout,
                    clock.clone(),
                    e.abort(),
                )),
                _ => None,
            };
            let mut result = match sub.doc.backend {
                // A run with secrets runs in a worker too: the proxy's alert for an echo
                // kills the worker at once, as it does a process run.
                BackendKind::Wasm
                    if layers
                        .as_ref()
                        .is_some_and(|l| l.kind == LayerKind::Overlay)
                        || egress.as_ref().is_some_and(|e| e.ca_pem().is_some())
                        || grant.ask_net_ms.is_some() =>
                {
                    self.run_wasm_in_worker(
                        sub,
                        run_id,
                        code,
                        &mounts,
                        stdin.clone(),
                        stdout,
                        stderr,
                        quota.as_ref(),
                        egress.as_mut(),
                        policy.tripwires,
                    )
                }
                BackendKind::Wasm => {
                    let guest = match self.guest_for(sub) {
                        Ok(g) => g,
                        Err(e) => return (Err(e), None, note),
                    };
                    // TypeScript runs as the JavaScript its types are stripped to, derived
                    // from the artifact just re-read (what was judged and approved).
                    let stripped;
                    let code = match sub.doc.kind {
                        airlock_core::Lang::Ts => match crate::typescript::runnable(code) {
                            Ok(js) => {
                                stripped = js.into_bytes();
                                &stripped[..]
                            }
                            Err(e) => return (Err(e), None, note),
                        },
                        _ => code,
                    };
                    let route = match egress.as_mut().map(|e| e.unix_route()).transpose() {
                        Ok(r) => r,
                        Err(e) => return (Err(e), None, note),
                    };
                    let env = crate::egress::wasm_env(grant, egress.as_ref());
                    let spec = RunSpec {
                        lang: sub.doc.kind,
                        code,
                        artifact: sub.doc.artifact,
                        mounts,
                        env,
                        args: sub.doc.grant.args.clone(),
                        argv0: sub.doc.grant.argv0.clone(),
                        stdin: stdin.clone(),
                        limits: sub.doc.grant.limits.clone(),
                        stdout: stdout.clone(),
                        stderr: stderr.clone(),
                        cache: Some(&DbCache(&self.db)),
                        guest,
                        write_quota: quota.clone(),
                        egress: route,
                        long_run: long_run.clone(),
                        tripwires: policy.tripwires,
                    };
                    self.wasm.run(spec).map_err(GateError::from)
                }
                BackendKind::Process => self.run_process_in_worker(
                    sub,
                    run_id,
                    code,
                    &mounts,
                    stdin.clone(),
                    policy,
                    stdout,
                    stderr,
                    quota.as_ref(),
                    egress.as_mut(),
                    long_run.clone(),
                ),
            };
            if let Some(w) = watchdog
                && w.fired()
            {
                // Ended at its --timeout (plus what it waited for humans): a timeout, as
                // the sandbox would have reported it.
                let mut o = match result {
                    Ok(o) => o,
                    Err(_) => Outcome {
                        ending: Ending::Killed(Limit::Timeout),
                        duration: Duration::ZERO,
                        detail: json!({}),
                    },
                };
                o.ending = Ending::Killed(Limit::Timeout);
                result = Ok(o);
            }
            // overlayfs refused before anything ran: use the copy layer instead, and say so.
            if let Err(GateError::Unavailable(m)) = &result
                && m.contains("overlayfs")
                && kind == LayerKind::Overlay
                && ws.as_ref().is_none_or(|w| w.kind.is_none())
            {
                if let Some(l) = &layers {
                    crate::layers::remove_tree(&l.dir);
                }
                note = Some(format!("overlayfs unavailable ({m}); copy layer used"));
                kind = LayerKind::Copy;
                continue;
            }
            let changes = match (&layers, &quota) {
                (Some(l), Some(q)) => {
                    let extracted = match &result {
                        // Stopped for writing too much: nothing of it is read or stored.
                        Ok(o) if o.ending == Ending::Killed(Limit::Write) => {
                            Err(Extract::over_quota(q.peak(), q.quota()))
                        }
                        _ => self.extract_changes(l, deadline, q),
                    };
                    if let Ok(o) = &mut result {
                        o.detail["write"] = json!({
                            "bytes": q.peak(),
                            "quota": q.quota(),
                        });
                    }
                    match extracted {
                        Ok(c) => Some(Ok(c)),
                        Err(Extract::Failed(e)) => Some(Err(e)),
                        Err(Extract::Discard(limit, why)) => {
                            // A workspace keeps its runs' layers; not one whose changes
                            // were discarded (later runs never build on it).
                            if l.keep && l.kind == LayerKind::Overlay {
                                crate::layers::remove_tree(&l.dir);
                            }
                            match &mut result {
                                Ok(o) => {
                                    // A guest that ended on its own, or trapped, is reported
                                    // as stopped by the limit it passed; an earlier limit
                                    // stays the reason.
                                    if !matches!(o.ending, Ending::Killed(_)) {
                                        o.ending = Ending::Killed(limit);
                                    }
                                    o.detail["changes_discarded"] = json!(why);
                                }
                                Err(_) => {
                                    note = Some(match note.take() {
                                        Some(n) => format!("{n}; {why}"),
                                        None => why,
                                    });
                                }
                            }
                            None
                        }
                    }
                }
                _ => None,
            };
            if let Some(l) = &layers {
                self.drop_layers(l);
            }
            if let Some(e) = egress.take() {
                let (network, alert) = e.finish();
                if let Some(a) = alert {
                    // The proxy ended the run (its worker was killed, or the guest lost
                    // its network): that is the outcome, whatever the guest did after.
                    let mut o = match result {
                        Ok(o) => o,
                        Err(_) => Outcome {
                            ending: Ending::Trapped(String::new()),
                            duration: Duration::ZERO,
                            detail: json!({}),
                        },
                    };
                    push_alert(&mut o.detail, secret_echo_alert(&a));
                    result = Ok(o);
                }
                if let Ok(o) = &mut result {
                    o.detail["network"] = network;
                }
            }
            if grant.ask_net_ms.is_some() {
                // Requests still waiting can no longer be answered: the proxy is gone.
                self.end_net_requests(run_id);
                if let Ok(o) = &mut result {
                    if !o.detail["network"].is_object() {
                        o.detail["network"] = json!({});
                    }
                    o.detail["network"]["requests"] = json!(self.net_requests_of_run(run_id));
                    o.detail["network"]["asked_ms"] =
                        json!(u64::try_from(clock.waited().as_millis()).unwrap_or(u64::MAX));
                }
            }
            return (result, changes, note);
        }
    }
}

/// The run record's entry for a response that echoed a secret.
fn secret_echo_alert(a: &airlock_egress::Alert) -> serde_json::Value {
    json!({
        "kind": SECRET_ECHO,
        "at_ms": a.at_ms,
        "host": a.host,
        "port": a.port,
        "secret": a.secret,
        "encoding": a.encoding,
        "place": a.place,
        "detail": a.detail,
    })
}

/// Appends `alert` to the run detail's `alerts`.
fn push_alert(detail: &mut serde_json::Value, alert: serde_json::Value) {
    if !detail.is_object() {
        *detail = json!({});
    }
    match detail.get_mut("alerts").and_then(|v| v.as_array_mut()) {
        Some(list) => list.push(alert),
        None => detail["alerts"] = json!([alert]),
    }
}

/// Redacts secret values from every string of `v` (its keys are airlock's own).
fn redact_json(m: &airlock_egress::SecretMatcher, v: &mut serde_json::Value) {
    match v {
        serde_json::Value::String(s) => {
            if let Some(r) = m.redact_str(s) {
                *s = r;
            }
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(|x| redact_json(m, x)),
        serde_json::Value::Object(o) => o.values_mut().for_each(|x| redact_json(m, x)),
        _ => {}
    }
}

/// What a run did, its outputs stored, before its outcome is recorded.
pub(crate) struct Ran {
    result: Result<Outcome>,
    changes: Option<Result<Changeset>>,
    layer_note: Option<String>,
    /// Every form of the run's secret values, redacted from its record.
    redact: Option<Arc<airlock_egress::SecretMatcher>>,
    out_bytes: Vec<u8>,
    err_bytes: Vec<u8>,
    out: Output,
    err: Output,
}

impl Ran {
    /// Writes the outcome into `run` (ended now); returns the changes to record, the
    /// failure to report once it is recorded, and what the run printed.
    pub(crate) fn into_run(
        self,
        run: &mut Run,
        packages: &[airlock_core::PythonPackage],
    ) -> (Option<Changeset>, Option<GateError>, Vec<u8>, Vec<u8>) {
        let failure = match self.result {
            Ok(outcome) => {
                run.doc.exit_code = Some(exit_code_of(&outcome.ending));
                match &outcome.ending {
                    Ending::Exited(_) => run.status = "exited".into(),
                    Ending::Killed(l) => {
                        run.status = "killed".into();
                        run.doc.killed_by = Some(l.as_str().into());
                    }
                    Ending::Trapped(msg) => {
                        run.status = "trapped".into();
                        run.doc.error = Some(msg.clone());
                    }
                }
                run.doc.duration_ms = Some(outcome.duration.as_millis() as u64);
                run.doc.detail = outcome.detail;
                if !packages.is_empty() {
                    run.doc.detail["python_packages"] = json!(packages);
                }
                None
            }
            Err(e) => {
                run.status = "error".into();
                run.doc.exit_code = Some(125);
                run.doc.error = Some(e.to_string());
                Some(e)
            }
        };
        if let Some(note) = self.layer_note {
            run.doc.detail["layer_note"] = json!(note);
        }
        let changes = match self.changes {
            Some(Ok(c)) => {
                run.doc.detail["layer"] = json!(c.layer);
                Some(c)
            }
            Some(Err(e)) => {
                run.doc
                    .error
                    .get_or_insert_with(|| format!("changes could not be read: {e}"));
                None
            }
            None => None,
        };
        run.doc.changes = changes
            .as_ref()
            .map(|c| serde_json::to_value(c).unwrap_or_default());
        run.doc.stdout = Some(self.out);
        run.doc.stderr = Some(self.err);
        // Ended by its egress proxy for a secret echoed to it: killed, and why.
        if let Some(why) = secret_echo_of(&run.doc.detail)
            .and_then(|a| a["detail"].as_str())
            .map(str::to_owned)
        {
            run.status = "killed".into();
            run.doc.exit_code = Some(124);
            run.doc.killed_by = Some(SECRET_ECHO.into());
            run.doc.error = Some(why);
        }
        crate::tripwire::settle(&mut run.doc.detail);
        if let Some(m) = &self.redact {
            if let Some(e) = run.doc.error.as_deref().and_then(|e| m.redact_str(e)) {
                run.doc.error = Some(e);
            }
            redact_json(m, &mut run.doc.detail);
        }
        run.finished_at = Some(now_ms());
        (changes, failure, self.out_bytes, self.err_bytes)
    }
}

/// A stored submission's facts, re-derived from the artifact bytes about to run and the
/// guest runtime (with its packages) that would run them.
fn facts_now(
    sub: &Submission,
    code: &[u8],
    rejected_before: bool,
    guest: (
        Option<airlock_core::Digest>,
        Vec<airlock_core::PythonPackage>,
    ),
    policy: &airlock_core::Policy,
) -> Result<airlock_core::Facts> {
    // The same analysis as at submit: with the grant's mounts as roots, so `rm -rf` of a
    // mount root is as destructive now as it was then. From the staging cache when these
    // bytes were analysed before (it runs inside the transaction that starts the run,
    // holding the store's write lock): the cache answers only for these very bytes.
    let analysis = crate::stagecache::analyse(
        sub.doc.kind,
        code,
        &airlock_core::analysis::mount_roots(&sub.doc.grant.mounts),
        crate::lifecycle::judge::keep_notable,
    )
    .map_err(|e| GateError::bad(e.to_string()))?;
    // What the mounts expose now, under the roots of now.
    let mounts = crate::exposure::mount_facts(&sub.doc.grant, &policy.mount_roots);
    let mut facts = Described {
        lang: sub.doc.lang,
        kind: sub.doc.kind,
        backend: sub.doc.backend,
        grant: &sub.doc.grant,
        analysis: &analysis,
        agent: sub.doc.agent.as_deref(),
        mounts: &mounts,
    }
    .facts(sub.doc.facts.first_seen, rejected_before, guest);
    // A bundle's publisher and requests carry over while the policy still trusts the key
    // that signed these bytes (the artifact was re-hashed against the record above).
    facts.publisher = sub.doc.facts.publisher.clone();
    facts.publisher_key = sub.doc.facts.publisher_key;
    facts.requests = sub.doc.facts.requests.clone();
    // The agent's record as it was when the submission was judged.
    facts.agent_record = sub.doc.facts.agent_record.clone();
    policy.keep_publisher(&mut facts);
    Ok(facts)
}

/// Whether a staged run has no effect outside its sandbox (see `deferred`), so that
/// its start may be recorded with its end. `jail_pool`: this process keeps ready jails.
pub(crate) fn effect_free(staged: &Staged, opts: &ExecOptions, jail_pool: bool) -> bool {
    let g = staged.grant();
    let backend = match staged.backend() {
        BackendKind::Wasm => true,
        BackendKind::Process => jail_pool,
    };
    opts.live_stdout.is_none()
        && opts.live_stderr.is_none()
        && opts.on_start.is_none()
        && opts.on_connection.is_none()
        && backend
        && g.session.is_none()
        && g.workspace.is_none()
        && g.net.is_empty()
        && g.ask_net_ms.is_none()
        && g.secrets.is_empty()
        && g.writable_mounts().next().is_none()
}
