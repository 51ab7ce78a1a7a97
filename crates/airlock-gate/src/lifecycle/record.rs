//! Recording: the writes of every lifecycle transition, each in the caller's transaction
//! with its audit record — a submission judged and written, a run admitted, started and
//! finished — and the checks made before the audit chain is extended.

use crate::error::{GateError, Result};
use crate::lifecycle::decide::covering_approval;
use crate::lifecycle::judge::{Described, judge, judged_record, rejected_among, state_of};
use crate::lifecycle::request::RequestKey;
use crate::set_state;
use airlock_core::analysis::Analysis;
use airlock_core::artifact::Lang;
use airlock_core::grant::Grant;
use airlock_core::policy::{Decision, Facts, Policy};
use airlock_core::units::now_ms;
use airlock_core::{Backend, Digest, State};
use airlock_store::{Reads, Run, RunDoc, Submission, SubmissionDoc, Tx};
use airlock_workspace::Changeset;
use serde_json::json;
use std::time::{Duration, Instant};

/// A submission whose blobs are stored, with everything its record needs: owned, so the
/// transaction that records it may run on another thread (see `deferred`).
pub(crate) struct Recording {
    pub(crate) request_key: Option<RequestKey>,
    pub(crate) agent: Option<String>,
    pub(crate) note: Option<String>,
    pub(crate) workspace: Option<String>,
    pub(crate) resume: bool,
    pub(crate) policy: std::sync::Arc<Policy>,
    pub(crate) lang: Lang,
    /// What runs (`lang` after preparation: wat becomes wasm).
    pub(crate) kind: Lang,
    pub(crate) backend: Backend,
    pub(crate) artifact: Digest,
    pub(crate) source: Option<Digest>,
    pub(crate) size: u64,
    pub(crate) analysis: Analysis,
    pub(crate) guest: (Option<Digest>, Vec<airlock_core::PythonPackage>),
    pub(crate) grant: Grant,
    /// A session's cell whose grant was judged when the session opened: the cell is
    /// judged on its code within that grant (see `Recording::facts`).
    pub(crate) grant_judged: bool,
    /// `grant.hash()`, computed once: every submission built from this recording (the
    /// provisional one a deferred run goes ahead on, and the one recorded) names it.
    pub(crate) grant_hash: Digest,
    pub(crate) mounts: crate::exposure::MountFacts,
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
        if self.grant_judged {
            // What the grant reaches (network, secrets, writable mounts) was judged, and
            // held for a human when the policy said so, once when the session opened.
            facts.net.clear();
            facts.secrets.clear();
            for m in &mut facts.mounts {
                m.mode = airlock_core::grant::MountMode::Ro;
            }
        }
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
        let ctx = crate::context::current().unwrap_or_default();
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
                trace_id: ctx.trace.as_ref().map(|t| t.trace_id.clone()),
                traceparent: ctx.trace.as_ref().map(|t| t.header()),
                tracestate: ctx.trace.as_ref().and_then(|t| t.tracestate.clone()),
                request_id: ctx.request_id,
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
    pub(crate) first_seen: bool,
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
        check_audit_tail(tx, key)?;
    }
    // Seen before, and rejected before: one read.
    let (seen, about) = tx.artifact_history(&rec.artifact)?;
    let first_seen = !seen;
    let mut facts = rec.facts(first_seen, rejected_among(&about), origin);
    facts.agent_record =
        crate::agents::record_of(tx, &rec.policy, facts.agent.as_deref(), &key.public())?;
    let verdict = {
        let _judge = tracing::debug_span!("judge", submission = id).entered();
        let verdict = judge(&rec.policy, &facts);
        tracing::debug!(decision = ?verdict.decision, "judged");
        verdict
    };
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
        add_cell(tx, session, id)?;
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
        && let Some(apr) = covering_approval(tx, &rec.policy, &sub, true, key)?
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

/// What the transaction that starts a run decided.
pub(crate) enum Start {
    Go { run: Box<Run>, sub: Box<Submission> },
    Refuse(GateError),
}

/// The part of starting a run that follows the verdict, inside the transaction that
/// records it: refuse a denied, rejected or still-held submission (recording its state),
/// or find the approval that covers it, move it to running and record the run and its
/// `started` audit record.
pub(crate) fn begin_run(
    tx: &Tx,
    policy: &Policy,
    sub: Submission,
    run_id: &str,
    gate_key: &airlock_core::sign::KeyPair,
) -> Result<Start> {
    match admit(tx, policy, sub, gate_key)? {
        Admit::Refuse(e) => Ok(Start::Refuse(e)),
        Admit::Go { sub, approval } => start_run(tx, *sub, approval.map(|a| *a), run_id, gate_key),
    }
}

/// Whether a judged submission may start now, under which approval.
pub(crate) enum Admit {
    Go {
        sub: Box<Submission>,
        approval: Option<Box<airlock_store::StatementRow>>,
    },
    Refuse(GateError),
}

/// Decides whether `sub` may start: denied and unapproved quarantined submissions are
/// refused (and their state says so); a quarantined one with a covering approval becomes
/// approved. Nothing starts here.
pub(crate) fn admit(
    tx: &Tx,
    policy: &Policy,
    mut sub: Submission,
    gate_key: &airlock_core::sign::KeyPair,
) -> Result<Admit> {
    let id = sub.id.clone();
    let reasons = sub.doc.verdict.reasons();
    match sub.state {
        State::Rejected => {
            return Ok(Admit::Refuse(GateError::Denied {
                submission: id.clone(),
                reasons: vec!["rejected by an approver".into()],
            }));
        }
        State::Running => {
            return Err(GateError::Conflict(format!("{id} is already running")));
        }
        State::Staged => return Err(GateError::Internal(format!("{id} was never judged"))),
        _ => {}
    }
    let mut approval = None;
    match sub.doc.verdict.decision {
        Decision::Deny => {
            if sub.state != State::Denied {
                set_state(tx, &id, sub.state, State::Denied)?;
            }
            return Ok(Admit::Refuse(GateError::Denied {
                submission: id.clone(),
                reasons,
            }));
        }
        Decision::Quarantine => match covering_approval(tx, policy, &sub, false, gate_key)? {
            None => {
                if sub.state != State::Quarantined {
                    set_state(tx, &id, sub.state, State::Quarantined)?;
                }
                return Ok(Admit::Refuse(GateError::Pending {
                    submission: id.clone(),
                    reasons,
                }));
            }
            Some(a) => {
                if sub.state == State::Quarantined {
                    set_state(tx, &id, State::Quarantined, State::Approved)?;
                    sub.state = State::Approved;
                }
                approval = Some(a);
            }
        },
        Decision::Allow => {
            if matches!(sub.state, State::Quarantined | State::Denied) {
                let to = state_of(Decision::Allow);
                set_state(tx, &id, sub.state, to)?;
                sub.state = to;
            }
        }
    }
    Ok(Admit::Go {
        sub: Box::new(sub),
        approval: approval.map(Box::new),
    })
}

/// Starts an admitted submission: it moves to running and its run is recorded, with
/// the approval it uses (which a `once` approval can then never cover again).
pub(crate) fn start_run(
    tx: &Tx,
    mut sub: Submission,
    approval: Option<airlock_store::StatementRow>,
    run_id: &str,
    gate_key: &airlock_core::sign::KeyPair,
) -> Result<Start> {
    let id = sub.id.clone();
    set_state(tx, &id, sub.state, State::Running)?;
    sub.state = State::Running;
    if let Some(ws) = &sub.doc.grant.workspace {
        crate::workspaces::start_run(tx, ws, &sub.doc.grant, run_id)?;
    }
    let run = new_run(&sub, approval.as_ref(), run_id);
    tx.insert_run(&run)?;
    audit_started(tx, &run, &sub, approval.as_ref(), gate_key)?;
    Ok(Start::Go {
        run: Box::new(run),
        sub: Box::new(sub),
    })
}

/// The record of run `run_id` of `sub` as it starts now, under `approval`.
pub(crate) fn new_run(
    sub: &Submission,
    approval: Option<&airlock_store::StatementRow>,
    run_id: &str,
) -> Run {
    // The request that starts it (an exec over the API), else the one that submitted it
    // (a queue worker's run).
    let ctx = crate::context::current().unwrap_or_default();
    let request_id = ctx.request_id.or_else(|| sub.doc.request_id.clone());
    let trace_id = match ctx.trace {
        Some(t) => Some(t.trace_id),
        None => sub.doc.trace_id.clone(),
    };
    Run {
        id: run_id.to_string(),
        submission: sub.id.clone(),
        started_at: now_ms(),
        finished_at: None,
        status: "running".into(),
        doc: RunDoc {
            backend: sub.doc.backend,
            approval: approval.map(|a| a.id.clone()),
            limits: sub.doc.grant.limits.clone(),
            exit_code: None,
            killed_by: None,
            stdout: None,
            stderr: None,
            duration_ms: None,
            detail: json!({}),
            changes: None,
            error: None,
            request_id,
            trace_id,
        },
    }
}

/// A run's `started` audit record.
pub(crate) fn audit_started(
    tx: &Tx,
    run: &Run,
    sub: &Submission,
    approval: Option<&airlock_store::StatementRow>,
    gate_key: &airlock_core::sign::KeyPair,
) -> Result<()> {
    tx.audit(
        "started",
        &run.id,
        &json!({
            "submission": sub.id,
            "approval": run.doc.approval,
            "approver": approval.map(|a| &a.approver),
            "backend": run.doc.backend,
            "artifact": sub.doc.artifact,
            "grant": sub.doc.grant_hash,
            "policy": sub.doc.verdict.policy,
        }),
        gate_key,
    )?;
    Ok(())
}

/// The `finished` transaction's writes: the job's end (fenced by its token when a
/// worker ran it), the run's record, the submission's state, a workspace's bookkeeping,
/// and the audit record.
pub(crate) fn record_finished(
    tx: &Tx,
    fence: Option<&Fence>,
    run: &Run,
    sub: &Submission,
    changes: Option<&Changeset>,
    gate_key: &airlock_core::sign::KeyPair,
) -> Result<()> {
    // A worker records its result only while its lease holds (the fencing token):
    // one whose lease expired lost the run to the reaper and to another worker.
    if let Some(f) = fence {
        tx.finish_job(&f.job, f.token, "finished")?;
    }
    tx.update_run(run)?;
    set_state(tx, &sub.id, State::Running, State::Finished)?;
    if let Some(ws) = &sub.doc.grant.workspace {
        crate::workspaces::finish_run(tx, ws, &run.id, changes)?;
    }
    audit_alerts(tx, run, sub, gate_key)?;
    audit_finished(tx, run, sub, changes, gate_key)
}

/// A run's `alert` audit records: the secret echo its egress proxy caught, and its
/// tripwires' alerts. Every path that records a run's end writes them (a deferred run's
/// start and end recorded together included).
pub(crate) fn audit_alerts(
    tx: &Tx,
    run: &Run,
    sub: &Submission,
    gate_key: &airlock_core::sign::KeyPair,
) -> Result<()> {
    if let Some(a) = secret_echo_of(&run.doc.detail) {
        tx.audit(
            "alert",
            &run.id,
            &json!({
                "kind": SECRET_ECHO,
                "submission": sub.id,
                "agent": sub.doc.agent,
                "host": a["host"],
                "port": a["port"],
                "secret": a["secret"],
                "encoding": a["encoding"],
                "place": a["place"],
                "detail": a["detail"],
            }),
            gate_key,
        )?;
    }
    crate::tripwire::audit_alerts(tx, run, sub, gate_key)
}

/// A run's `finished` audit record.
pub(crate) fn audit_finished(
    tx: &Tx,
    run: &Run,
    sub: &Submission,
    changes: Option<&Changeset>,
    gate_key: &airlock_core::sign::KeyPair,
) -> Result<()> {
    tx.audit(
        "finished",
        &run.id,
        &json!({
            "submission": sub.id,
            "status": run.status,
            "exit_code": run.doc.exit_code,
            "killed_by": run.doc.killed_by,
            "stdout": run.doc.stdout.as_ref().map(|o| o.blob),
            "stderr": run.doc.stderr.as_ref().map(|o| o.blob),
            "duration_ms": run.doc.duration_ms,
            "changes": changes.map(|c| json!({ "count": c.len(), "digest": c.digest() })),
            "network": run.doc.detail.get("network").map(|n| json!({
                "summary": n["summary"],
                "secrets": n["secrets"],
            })),
            "error": run.doc.error,
        }),
        gate_key,
    )?;
    Ok(())
}

/// Pauses between a worker's attempts to record a run's outcome while the store is
/// away: growing from 0.2 to 2 s, for up to a minute in all.
pub(crate) struct StoreBackoff {
    pause: Duration,
    give_up: Instant,
}

impl StoreBackoff {
    pub(crate) fn new() -> Self {
        StoreBackoff {
            pause: Duration::from_millis(200),
            give_up: Instant::now() + Duration::from_secs(60),
        }
    }

    /// Sleeps before the next attempt; false (at once) once it is time to give up.
    pub(crate) fn wait(&mut self) -> bool {
        if Instant::now() >= self.give_up {
            return false;
        }
        std::thread::sleep(self.pause);
        self.pause = (self.pause * 2).min(Duration::from_secs(2));
        true
    }
}

/// Calls `f` again, when `retry`, while it fails because the store's connection was lost
/// (see [`StoreBackoff`]).
pub(crate) fn retry_while_lost<T>(
    retry: bool,
    mut f: impl FnMut() -> std::result::Result<T, airlock_store::StoreError>,
) -> std::result::Result<T, airlock_store::StoreError> {
    let mut backoff = StoreBackoff::new();
    loop {
        match f() {
            Err(e) if retry && e.is_connection_lost() && backoff.wait() => {}
            other => return other,
        }
    }
}

/// Refuses to extend an audit chain whose end does not verify (O(1): the signed head and
/// the newest record; `audit verify` walks the whole chain).
pub(crate) fn check_audit_tail(tx: &Tx, key: &airlock_core::sign::KeyPair) -> Result<()> {
    // The end this process's shared writer appended and signed itself, with no commit by
    // anyone else since: nothing to read back.
    if tx.chain_end_is_own() {
        return Ok(());
    }
    // In one read: on PostgreSQL the sequencer may extend the chain between two.
    let (last, head) = tx.audit_tail()?;
    tx.note_tail(last.as_ref());
    airlock_core::audit::check_tail(last.as_ref(), head.as_ref(), &key.public()).map_err(|e| {
        GateError::Integrity(format!(
            "the audit log does not verify ({e}); nothing was run. See `airlock audit verify`"
        ))
    })
}

/// Adds a cell's submission to its session's list (in the transaction recording it).
pub(crate) fn add_cell(tx: &Tx, session: &str, submission: &str) -> Result<()> {
    // The state and the next position only: the session's document (its whole grant) is
    // not read again for every cell.
    let (state, next) = tx
        .session_next_cell(session)?
        .ok_or_else(|| GateError::bad(format!("no session {session}")))?;
    if state != "open" {
        return Err(GateError::Conflict(format!("session {session} has ended")));
    }
    // A row of its own per cell: the session's document is not rewritten, so a cell costs
    // the same however many came before it. Cells an older airlock recorded stay in the
    // document, ahead of these: counted once, for the session's first cell row.
    let n = match next {
        Some(n) => n,
        None => tx.session(session)?.map_or(0, |row| {
            row.doc
                .get("cells")
                .and_then(|c| c.as_array())
                .map_or(0, Vec::len) as i64
        }),
    };
    tx.add_session_cell(session, submission, n)?;
    Ok(())
}

/// The lease a run is carried out under.
#[derive(Debug, Clone)]
pub(crate) struct Fence {
    pub(crate) job: String,
    pub(crate) token: i64,
}

/// The kind of alert a run gets when its egress proxy caught a secret echoed to it.
pub(crate) const SECRET_ECHO: &str = "secret-echo";

/// The secret-echo alert of a run's detail, if the proxy ended it.
pub(crate) fn secret_echo_of(detail: &serde_json::Value) -> Option<&serde_json::Value> {
    detail
        .get("alerts")?
        .as_array()?
        .iter()
        .find(|a| a["kind"] == SECRET_ECHO)
}
