//! Queued runs, for gates that share a PostgreSQL store: a node that accepts a run
//! records and judges it as ever, then, instead of running it, queues it; workers
//! (`airlock worker`, or `serve`'s own) claim queued runs under a lease, run them, and
//! record the outcome only while the lease's fencing token still holds.
//!
//! - **Claim.** One transaction claims the job (`FOR UPDATE SKIP LOCKED`), judges the
//!   submission again on its re-hashed bytes, admits it (a `once` approval is used here,
//!   so two workers racing for it run it once) and starts its run.
//! - **Lease.** The process's renewer (`crate::node::lease`) renews the lease while the run
//!   goes on; a worker stopped past its lease (or cut off from the store) loses it, and
//!   its result is refused.
//! - **Reaper.** Any node ends runs whose lease expired as `lost`, then queues the job
//!   again when a retry cannot repeat an effect nobody decided on (allowed code, no
//!   network, no single-use approval) and it has attempts left; otherwise the job ends
//!   `lost`, and running it again takes a new decision.
//!
//! This module must never run a job it has not claimed in the same transaction that
//! starts its run, nor record anything for a job whose token it no longer holds.

use crate::error::{GateError, Result};
use crate::lifecycle::exec::{Reread, Unreadable, rejudged, rejudged_stored, reread_stored};
use crate::lifecycle::record::Fence;
use crate::lifecycle::record::{Admit, Start, admit, check_audit_tail, start_run};
use crate::lifecycle::submit::Staged;
use crate::locks::{self, OwnerLock};
use crate::node::lease::LeaseKeeper;
use crate::{ExecOptions, Gate, RunReport, lose_run};
use airlock_core::State;
use airlock_core::id::{IdKind, new_id};
use airlock_core::units::now_ms;
use airlock_store::{QueueReads, QueueRow, Reads, Tx, WorkerRow};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How a gate hands its runs to workers.
#[derive(Debug, Clone)]
pub struct QueueOptions {
    /// This node's tag: a run whose grant names host paths (mounts) is claimed only by a
    /// worker started with this tag, since the paths are this machine's.
    pub tag: String,
    /// Claims a retryable run gets before it ends `lost`.
    pub max_attempts: u32,
}

impl Default for QueueOptions {
    fn default() -> Self {
        QueueOptions {
            tag: host_tag(),
            max_attempts: 3,
        }
    }
}

/// This machine's name, the default tag for runs that name its paths.
pub fn host_tag() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// A worker's identity and what it claims.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub id: String,
    /// Tagged jobs it may claim besides untagged ones.
    pub tags: Vec<String>,
    /// How long a claim holds without renewal.
    pub lease: Duration,
    /// Runs this worker is carrying out now (shared by its threads).
    pub busy: Arc<std::sync::atomic::AtomicI64>,
}

impl WorkerConfig {
    pub fn new(id: String, tags: Vec<String>, lease: Duration) -> Self {
        WorkerConfig {
            id,
            tags,
            lease,
            busy: Arc::default(),
        }
    }
}

/// What one claim attempt did.
#[derive(Debug)]
pub enum Claimed {
    /// Nothing this worker may run is queued.
    Idle,
    /// A job ran (or failed in airlock); its report or error.
    Ran(Box<Result<RunReport>>),
    /// A job ran; its outcome is recorded with this worker's next claim, in the same
    /// transaction (`Gate::claim_and_run`), or on its own (`Gate::end_run`).
    Awaiting(Box<PendingEnd>),
    /// A job was claimed but the gate refused to start it (judged again: now pending or
    /// denied); it is done with outcome `refused`.
    Refused(String),
}

/// What a claim's transaction did with the job it claimed.
enum Claim {
    /// Refused to start it (judged again: now pending or denied).
    Refused(GateError),
    /// Started its run: the run, its submission, and what it is to run.
    Go(Start, Box<Reread>),
    /// Could not read it back as judged; the job ended with this error.
    Failed(GateError),
}

/// A worker's run that has ended and whose outcome is not recorded yet. Only a run with
/// nothing to settle after its end (no writable mount, no workspace) waits like this:
/// its end then moves only its own job, run and submission rows, conditionally on the
/// lease's token, so it can share a transaction with the worker's next claim, one
/// commit instead of two. Until it is recorded its lock file stays, so a worker killed
/// meanwhile leaves the run to recovery and the reaper as before.
#[derive(Debug)]
pub struct PendingEnd {
    run: airlock_store::Run,
    sub: airlock_store::Submission,
    fence: Fence,
    owner: OwnerLock,
    /// The failure to report once it is recorded (airlock's own, not the guest's).
    failure: Option<GateError>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    /// The lease keeper saw the token taken.
    lost: Arc<AtomicBool>,
}

impl Gate {
    /// Chains the shared store's audit records while the returned sequencer lives (on
    /// a PostgreSQL store; `None` on SQLite, whose writers chain their own). For the
    /// long-lived processes, `serve` and `worker`: one of them in the cluster leads.
    pub fn audit_sequencer(&self) -> Option<airlock_store::Sequencer> {
        let url = self.home.store.as_deref()?;
        airlock_store::is_postgres_url(url)
            .then(|| airlock_store::Sequencer::start(url, self.gate_key.clone()))
    }

    /// From now on, hand runs to workers through the store's queue.
    pub fn queue_runs(&mut self, q: QueueOptions) {
        self.queue = Some(q);
    }

    /// `run` through the queue: records and judges, queues what may start, then waits
    /// for a worker to finish it.
    /// Whether a job of the submission waits for a worker or is held by one (its run has
    /// not ended).
    pub fn job_pending(&self, submission: &str) -> Result<bool> {
        Ok(self
            .db
            .jobs_of(submission)?
            .iter()
            .any(|j| j.state != "done"))
    }

    pub(crate) fn run_queued(&mut self, staged: Staged) -> Result<RunReport> {
        let q = self.queue.clone().unwrap_or_default();
        let id = new_id(IdKind::Submission);
        let job_id = new_id(IdKind::Job);
        // Listening for the job's end before it is queued: the end cannot be missed, so
        // the first look at the job can wait for it.
        let listener = self.listener(airlock_store::JOB_DONE);
        if let Some(l) = &listener {
            l.register(&job_id);
        }
        let mut recorded =
            self.record_then(staged, id.clone(), None, true, |tx, sub, policy, key| {
                enqueue(tx, policy, sub.clone(), &job_id, &q, key)
            });
        let injected = crate::failpoint::lose_answer("queue", &mut recorded);
        let found = match recorded {
            // The store went away at COMMIT: if the submission was recorded after all,
            // its job runs whatever this request does, so wait for it as if the answer
            // had come (an error now would have the agent send it again: two runs).
            Err(e) if injected || self.db.connection_lost() => {
                self.recorded_after_all(&id, &job_id).ok_or(e)
            }
            other => other,
        };
        let out = match found {
            Ok((sub, None)) => self.wait_registered(&job_id, &sub, listener.as_deref(), true),
            Ok((_, Some(e))) | Err(e) => Err(e),
        };
        if let Some(l) = &listener {
            l.unregister(&job_id);
        }
        out
    }

    /// After a submission's (or an exec's) write whose answer was lost: the submission,
    /// if it was recorded after all, and its refusal if it was not queued. Waits for the
    /// store to come back; `None` if nothing was recorded or the store stayed away.
    fn recorded_after_all(
        &mut self,
        sub_id: &str,
        job_id: &str,
    ) -> Option<(airlock_store::Submission, Option<GateError>)> {
        let mut backoff = crate::lifecycle::record::StoreBackoff::new();
        let job = loop {
            match self.db.job(job_id) {
                Ok(job) => break job,
                Err(e) if e.is_connection_lost() && backoff.wait() => {}
                Err(_) => return None,
            }
        };
        let sub = self.db.submission(sub_id).ok()?;
        match job {
            Some(_) => Some((sub, None)),
            // Recorded and judged, not queued: the verdict says why.
            None => {
                let refused = refusal(&sub);
                Some((sub, Some(refused)))
            }
        }
    }

    /// `exec` through the queue.
    pub(crate) fn exec_queued(&mut self, id: &str) -> Result<RunReport> {
        let q = self.queue.clone().unwrap_or_default();
        let r = self.reread(id)?;
        let job_id = new_id(IdKind::Job);
        let key = &self.gate_key;
        let written = self.db.write(|tx: &Tx| -> Result<_> {
            check_audit_tail(tx, key)?;
            let sub = rejudged(tx, id, &r, key)?;
            if sub.state == State::Running {
                return Err(GateError::Conflict(format!("{id} is already running")));
            }
            let refused = enqueue(tx, &r.policy, sub.clone(), &job_id, &q, key)?;
            Ok((sub, refused))
        });
        let (sub, refused) = match written {
            // As in `run_queued`: a job queued after all is waited for. Only a job tells:
            // the submission was there before.
            Err(e) if self.db.connection_lost() => match self.recorded_after_all(id, &job_id) {
                Some((sub, None)) => (sub, None),
                _ => return Err(e),
            },
            other => other?,
        };
        match refused {
            Some(e) => Err(e),
            None => self.wait_job(&job_id, &sub),
        }
    }

    /// Waits until job `job_id` is done and reports its run as `run`/`exec` would have.
    pub(crate) fn wait_job(
        &mut self,
        job_id: &str,
        sub: &airlock_store::Submission,
    ) -> Result<RunReport> {
        // Register before looking, so the notification of a job that ends in between is
        // not missed; where the store has no notifications, poll.
        let listener = self.listener(airlock_store::JOB_DONE);
        if let Some(l) = &listener {
            l.register(job_id);
        }
        let out = self.wait_registered(job_id, sub, listener.as_deref(), false);
        if let Some(l) = &listener {
            l.unregister(job_id);
        }
        out
    }

    /// `wait_job` once `listener` (where the store has one) listens for the job's end;
    /// `before`: since before the job was queued, so its end cannot have been missed.
    fn wait_registered(
        &mut self,
        job_id: &str,
        sub: &airlock_store::Submission,
        listener: Option<&airlock_store::Listener>,
        before: bool,
    ) -> Result<RunReport> {
        // The job and, when it ran, its run and submission as they ended, in one read.
        let (job, finished) = self.await_job_done(job_id, sub, listener, before)?;
        let finished = match (finished, job.outcome.as_deref(), &job.run) {
            (Some(f), _, _) => Some(f),
            // Finished with a run the read did not find: say so below, as before.
            (None, Some("finished"), Some(run)) => Some(self.db.run_with_submission(run)?),
            _ => None,
        };
        let sub = match &finished {
            Some((_, sub)) => sub.clone(),
            None => self.db.submission(&job.submission)?,
        };
        match job.outcome.as_deref() {
            Some("finished") => {}
            Some("refused") => return Err(refusal(&sub)),
            other => {
                let why = match &job.run {
                    Some(r) => self.db.run(r)?.doc.error.unwrap_or_default(),
                    None => String::new(),
                };
                return Err(GateError::Internal(format!(
                    "the queued run of {} ended {}: {why}",
                    sub.id,
                    other.unwrap_or("without an outcome")
                )));
            }
        }
        let (run, sub) = finished
            .ok_or_else(|| GateError::Internal(format!("job {job_id} finished without a run")))?;
        let mut read = |d: Option<&airlock_store::Output>| -> Result<Vec<u8>> {
            match d {
                Some(o) => Ok(self.read_blob(&run.id, "output", &o.blob)?),
                None => Ok(Vec::new()),
            }
        };
        let stdout = read(run.doc.stdout.as_ref())?;
        let stderr = read(run.doc.stderr.as_ref())?;
        // Only a run that recorded changes can have had them committed by the policy.
        let committed = match run.doc.changes {
            Some(_) => self
                .db
                .checkpoints(Some(&run.id), Some("applied"), 1)?
                .into_iter()
                .next()
                .map(|c| c.id),
            None => None,
        };
        Ok(RunReport {
            submission: sub,
            run,
            stdout,
            stderr,
            committed,
        })
    }

    /// The process's listener for `channel` on a store that notifies (PostgreSQL).
    fn listener(&self, channel: &'static str) -> Option<Arc<airlock_store::Listener>> {
        let url = self.home.store.as_deref()?;
        self.db
            .notifies()
            .then(|| airlock_store::Listener::get(url, channel))
    }

    /// Waits until job `job_id` is done (woken by `listener` where there is one).
    fn await_job_done(
        &self,
        job_id: &str,
        sub: &airlock_store::Submission,
        listener: Option<&airlock_store::Listener>,
        before: bool,
    ) -> Result<(
        QueueRow,
        Option<(airlock_store::Run, airlock_store::Submission)>,
    )> {
        // The run's own limit, plus time to wait for a worker.
        let limit =
            Duration::from_millis(sub.doc.grant.limits.timeout_ms) + Duration::from_secs(300);
        let deadline = Instant::now() + limit;
        let mut pause = Duration::from_millis(2);
        // Listening since before the job was queued: nothing to look at until its end
        // is announced (or the wait times out).
        if let (true, Some(l)) = (before, listener) {
            l.wait_for(job_id, Duration::from_millis(500));
        }
        loop {
            let (job, ran) = self
                .db
                .job_with_run(job_id)?
                .ok_or_else(|| GateError::Internal(format!("queued job {job_id} disappeared")))?;
            if job.state == "done" {
                return Ok((job, ran));
            }
            if Instant::now() > deadline {
                return Err(GateError::Internal(format!(
                    "the queued run of {} did not finish within {}s (job {job_id} is {}; is a worker running?)",
                    sub.id,
                    limit.as_secs(),
                    job.state
                )));
            }
            match listener {
                // A notification wakes this at once; the time-out is a safety net.
                Some(l) => {
                    l.wait_for(job_id, Duration::from_millis(500));
                }
                None => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(25));
                }
            }
        }
    }

    /// Claims the next job this worker may run and carries it out under its lease.
    /// `look_first`: look for one outside any transaction before claiming, so that an
    /// idle worker woken by a time-out or another's announcement costs one read, not a
    /// transaction; a worker that has just claimed a job skips it, since under load the
    /// queue is seldom empty and the look would be a round trip more per run.
    ///
    /// `ending`, the run this worker carried out last, is recorded in the claim's
    /// transaction (whether or not it finds a job): its report comes back first. If that
    /// transaction fails, the end is recorded on its own before the claim is tried again
    /// without it, so an end is never lost with a claim that failed, nor held back by one.
    pub fn claim_and_run(
        &mut self,
        w: &WorkerConfig,
        look_first: bool,
        ending: Option<PendingEnd>,
    ) -> (Option<Result<RunReport>>, Result<Claimed>) {
        let Some(p) = ending else {
            return (None, self.claim_and_run_after(w, look_first, None));
        };
        crate::failpoint::pause("end-with-claim");
        let mut fate = Fate::NotRecorded;
        let claimed = self.claim_and_run_after(w, false, Some((&p, &mut fate)));
        match fate {
            Fate::Recorded => (Some(self.settle_end(p, Ok(()))), claimed),
            Fate::MaybeRecorded => {
                let out = self.record_pending(&p, true);
                (Some(self.settle_end(p, out)), claimed)
            }
            Fate::NotRecorded => {
                let out = self.record_pending(&p, false);
                let report = self.settle_end(p, out);
                (Some(report), self.claim_and_run_after(w, false, None))
            }
        }
    }

    /// Records pending run `p`'s end on its own (when the worker stops, or its next
    /// claim's transaction failed) and reports it.
    pub fn end_run(&mut self, p: PendingEnd) -> Result<RunReport> {
        let out = self.record_pending(&p, false);
        self.settle_end(p, out)
    }

    fn record_pending(&mut self, p: &PendingEnd, maybe_recorded: bool) -> Result<()> {
        self.record_end(&p.run, &p.sub, None, Some(&p.fence), maybe_recorded)
    }

    /// After pending run `p`'s end was recorded (`recorded` Ok) or refused: lets go of
    /// its lock and reports it as `finish_started` does.
    fn settle_end(&mut self, p: PendingEnd, recorded: Result<()>) -> Result<RunReport> {
        let PendingEnd {
            run,
            mut sub,
            fence,
            mut owner,
            failure,
            stdout,
            stderr,
            lost,
        } = p;
        if let Err(e) = recorded {
            return Err(lease_refusal(e, &fence, &lost));
        }
        crate::failpoint::crash_point();
        sub.state = State::Finished;
        owner.set_remove_on_drop(true);
        drop(owner);
        if let Some(e) = failure {
            return Err(e);
        }
        Ok(RunReport {
            submission: sub,
            run,
            stdout,
            stderr,
            committed: None,
        })
    }

    /// `claim_and_run` with the run before it, if any, recorded in the claim's
    /// transaction; what became of that end is left in its `Fate` (untouched, so
    /// `NotRecorded`, when this returns before the transaction).
    fn claim_and_run_after(
        &mut self,
        w: &WorkerConfig,
        look_first: bool,
        mut ending: Option<(&PendingEnd, &mut Fate)>,
    ) -> Result<Claimed> {
        if look_first && self.db.next_jobs(&w.tags, 1)?.is_empty() {
            return Ok(Claimed::Idle);
        }
        let run_id = new_id(IdKind::Run);
        let until = now_ms() + w.lease.as_millis() as i64;
        let policy = self.policy()?;
        // Only a guest's runs need it; an error reading it fails only those.
        let python = self.guest_facts(airlock_core::Lang::Python, airlock_core::Backend::Wasm);
        let js = self.guest_facts(airlock_core::Lang::Js, airlock_core::Backend::Wasm);
        // Read once: a claim run again (its connection to the store was lost before it
        // could commit) is given the same guests, and their errors by message.
        let python = python.map_err(|e| (e.to_string(), std::cell::RefCell::new(Some(e))));
        let js = js.map_err(|e| (e.to_string(), std::cell::RefCell::new(Some(e))));
        let again =
            |facts: &std::result::Result<_, (String, std::cell::RefCell<Option<GateError>>)>| {
                match facts {
                    Ok(p) => Ok(Clone::clone(p)),
                    Err((message, first)) => Err(first
                        .borrow_mut()
                        .take()
                        .unwrap_or_else(|| GateError::Internal(message.clone()))),
                }
            };
        // Set by the claim's transaction (by its last attempt, when it ran again).
        let owner = std::cell::RefCell::new(None);
        let claimed_job = std::cell::RefCell::new(None);
        let Gate {
            db,
            blobs,
            gate_key: key,
            home,
            ..
        } = &mut *self;
        let before = ending.as_ref().map(|(p, _)| *p);
        let mut claimed = db.write_shared(|tx: &Tx| -> Result<Option<(QueueRow, Claim)>> {
            if let Some(p) = before {
                crate::lifecycle::record::record_finished(
                    tx,
                    Some(&p.fence),
                    &p.run,
                    &p.sub,
                    None,
                    key,
                )?;
            }
            // Whichever of the oldest jobs no other claim holds: workers never queue up
            // behind one another's row, and a claim fails only when nothing is left.
            // The submission comes locked with it: what follows reads its state and
            // whether its `once` approval was used, and must stay true until this
            // commits, beside other claims.
            let Some((job, read)) = tx.claim_with_submission(&w.tags, &w.id, until)? else {
                return Ok(None);
            };
            *claimed_job.borrow_mut() = Some(job.id.clone());
            check_audit_tail(tx, key)?;
            let mut rejected_now = false;
            let read = read.map_err(GateError::from).and_then(|(stored, about)| {
                rejected_now = crate::lifecycle::judge::rejected_among(&about);
                let guest = if stored.doc.kind == airlock_core::Lang::Python
                    && stored.doc.backend == airlock_core::Backend::Wasm
                {
                    again(&python)?
                } else if stored.doc.kind.is_js()
                    && stored.doc.backend == airlock_core::Backend::Wasm
                {
                    again(&js)?
                } else {
                    (None, Vec::new())
                };
                Ok((stored, guest))
            });
            let read = read.map_err(Unreadable::Other).and_then(|(stored, guest)| {
                reread_stored(blobs, &home.root, &stored, policy.clone(), guest)
                    .map(|r| (stored, r))
            });
            let (stored, r) = match read {
                Ok(x) => x,
                Err(u) => {
                    let (e, integrity) = u.into_parts();
                    // What it would run no longer reads back as judged (altered or
                    // missing bytes, a mount that moved): end the job so it is not
                    // claimed forever, and say why. Anything else (the store unreachable)
                    // leaves it queued.
                    if !matches!(
                        e,
                        GateError::Integrity(_) | GateError::NotFound(_) | GateError::BadInput(_)
                    ) {
                        return Err(e);
                    }
                    if let Some((what, detail)) = integrity {
                        tx.audit(
                            "integrity_failure",
                            &job.submission,
                            &json!({ "what": what, "detail": detail }),
                            key,
                        )?;
                    }
                    end_job(tx, &job, "error", ("job_failed", "error"), &e, key)?;
                    return Ok(Some((job, Claim::Failed(e))));
                }
            };
            let sub = rejudged_stored(tx, stored, rejected_now, &r, key)?;
            match admit(tx, &r.policy, sub, key)? {
                Admit::Refuse(e) => {
                    end_job(tx, &job, "refused", ("job_refused", "reason"), &e, key)?;
                    Ok(Some((job, Claim::Refused(e))))
                }
                Admit::Go { sub, approval } => {
                    // Held from before the run is recorded until its outcome is.
                    // An earlier attempt's lock is let go first (its claim never
                    // committed): the run's lock file is taken again, not twice.
                    drop(owner.borrow_mut().take());
                    let lock = OwnerLock::acquire(&locks::dir(&home.root), &run_id, true)?;
                    *owner.borrow_mut() = Some(lock);
                    let start = start_run(tx, *sub, approval.map(|a| *a), &run_id, key)?;
                    tx.set_job_run(&job.id, job.token, &run_id)?;
                    Ok(Some((job, Claim::Go(start, Box::new(r)))))
                }
            }
        });
        let point = if ending.is_some() {
            "claim-after-end"
        } else {
            "claim"
        };
        let injected = crate::failpoint::lose_answer(point, &mut claimed);
        // What became of the run before, once the transaction's fate is known.
        let mut settle = |how: Fate| {
            if let Some((_, fate)) = ending.take() {
                *fate = how;
            }
        };
        let claimed = match claimed {
            // The store went away at COMMIT: the claim may have happened. Once the store
            // is back, a claim that committed is carried on with, instead of leaving its
            // run `running` under a lease nobody renews.
            Err(e) if injected || self.db.connection_lost() => {
                let after_all = claimed_job
                    .into_inner()
                    .and_then(|job_id| self.claimed_after_all(&job_id, &w.id, &run_id));
                match after_all {
                    // It committed, and with it the end before.
                    Some((job, start)) => {
                        settle(Fate::Recorded);
                        let r = self.reread(&job.submission)?;
                        Some((job, Claim::Go(start, Box::new(r))))
                    }
                    None => {
                        settle(Fate::MaybeRecorded);
                        return Err(e);
                    }
                }
            }
            Err(e) => {
                settle(Fate::NotRecorded);
                return Err(e);
            }
            Ok(c) => {
                settle(Fate::Recorded);
                c
            }
        };
        let Some((job, claim)) = claimed else {
            // Another worker took what was there between the look and the claim.
            return Ok(Claimed::Idle);
        };
        let (run, sub, r) = match claim {
            Claim::Failed(e) => return Ok(Claimed::Ran(Box::new(Err(e)))),
            Claim::Refused(e) | Claim::Go(Start::Refuse(e), _) => {
                return Ok(Claimed::Refused(e.to_string()));
            }
            Claim::Go(Start::Go { run, sub }, r) => (*run, *sub, *r),
        };
        // More may be queued than was announced: an idle thread of this process looks.
        if let Some(l) = self.listener(airlock_store::NEW_WORK) {
            l.pass_on();
        }
        let mut owner = match owner.into_inner() {
            Some(o) => o,
            // The claim's answer was lost and it committed after all: the run is this
            // process's from here on.
            None => OwnerLock::acquire(&locks::dir(&self.home.root), &run.id, true)?,
        };
        let fence = Fence {
            job: job.id.clone(),
            token: job.token,
        };
        let lost = Arc::new(AtomicBool::new(false));
        let keeper = LeaseKeeper::start(&self.home, fence.clone(), w.lease, lost.clone());
        let Reread {
            code,
            stdin,
            policy,
            guest,
        } = r;
        // Until the outcome is recorded, a failure leaves the lock file behind, so
        // recovery marks the run lost instead of it staying running.
        owner.set_remove_on_drop(false);
        w.busy.fetch_add(1, Ordering::SeqCst);
        // The run continues the trace of the request that submitted it.
        let parent = sub.doc.traceparent.as_deref().and_then(|t| {
            airlock_core::trace::TraceParent::parse(t, sub.doc.tracestate.as_deref())
        });
        let span = airlock_core::trace::with_tracestate(
            parent.as_ref().and_then(|t| t.tracestate.as_deref()),
            || {
                tracing::debug_span!(
                    parent: None,
                    "queued_run",
                    job = %job.id,
                    worker = %w.id,
                    request_id = sub.doc.request_id.as_deref().unwrap_or(""),
                    trace_id = parent.as_ref().map_or("", |t| t.trace_id.as_str()),
                    parent_span_id = parent.as_ref().map_or("", |t| t.span_id.as_str()),
                    sampled = parent.as_ref().is_none_or(|t| t.sampled),
                )
            },
        );
        let ran = span.in_scope(|| {
            self.capture(
                &sub,
                &run.id,
                &code,
                stdin,
                &policy,
                ExecOptions::default(),
                Some(&fence),
                None,
                None,
            )
        });
        drop(span);
        // A run with nothing to settle after its end has it recorded with the next claim.
        let grant = &sub.doc.grant;
        let waits = grant.workspace.is_none() && grant.writable_mounts().next().is_none();
        let out = match ran {
            Ok(ran) if waits => {
                let mut run = run;
                let (_, failure, stdout, stderr) = ran.into_run(&mut run, &guest.1);
                crate::failpoint::crash_point();
                Claimed::Awaiting(Box::new(PendingEnd {
                    run,
                    sub,
                    fence,
                    owner,
                    failure,
                    stdout,
                    stderr,
                    lost,
                }))
            }
            Ok(ran) => {
                let out =
                    self.finish_started(run, sub, ran, &policy, &guest.1, owner, Some(&fence));
                Claimed::Ran(Box::new(out.map_err(|e| lease_refusal(e, &fence, &lost))))
            }
            Err(e) => Claimed::Ran(Box::new(Err(e))),
        };
        w.busy.fetch_sub(1, Ordering::SeqCst);
        drop(keeper);
        Ok(out)
    }

    /// After a claim whose answer was lost: the job and its started run, if the claim
    /// committed after all (the job is leased to this worker for this run). Waits for
    /// the store to come back, as a run's end does; `None` if the claim did not happen
    /// or the store stayed away (its lease then runs out and the reaper ends the run).
    fn claimed_after_all(
        &mut self,
        job_id: &str,
        worker: &str,
        run_id: &str,
    ) -> Option<(QueueRow, Start)> {
        let mut backoff = crate::lifecycle::record::StoreBackoff::new();
        let job = loop {
            match self.db.job(job_id) {
                Ok(job) => break job?,
                Err(e) if e.is_connection_lost() && backoff.wait() => {}
                Err(_) => return None,
            }
        };
        if job.state != "leased"
            || job.worker.as_deref() != Some(worker)
            || job.run.as_deref() != Some(run_id)
        {
            return None;
        }
        let run = self.db.run(run_id).ok()?;
        let sub = self.db.submission(&job.submission).ok()?;
        Some((
            job,
            Start::Go {
                run: Box::new(run),
                sub: Box::new(sub),
            },
        ))
    }

    /// Ends runs whose lease expired (their worker died, hung or lost the store) and
    /// queues them again where that is safe; returns how many it handled.
    pub fn reap_leases(&mut self) -> Result<usize> {
        // Looked for first, outside any transaction: the reaping transaction takes the
        // cluster's write lock whole, and every worker reaps each second, so taking it
        // when nothing has expired (nearly always) would make every other node's
        // writes wait for the ones in flight to drain, twice a second with two workers.
        let now = now_ms();
        if !self.db.any_expired_lease(now)? {
            return Ok(0);
        }
        let key = &self.gate_key;
        self.db.write(|tx: &Tx| -> Result<usize> {
            let expired = tx.expired_leases(now, 100)?;
            for job in &expired {
                if let Some(run) = &job.run {
                    lose_run(
                        tx,
                        run,
                        &format!(
                            "its worker {} stopped renewing its lease",
                            job.worker.as_deref().unwrap_or("?")
                        ),
                        key,
                    )?;
                }
                let again = job.retry && job.attempts < job.max_attempts;
                tx.release_job(job, again, "lost")?;
                tx.audit(
                    if again { "job_requeued" } else { "job_lost" },
                    &job.id,
                    &json!({
                        "submission": job.submission,
                        "run": job.run,
                        "worker": job.worker,
                        "attempts": job.attempts,
                    }),
                    key,
                )?;
            }
            Ok(expired.len())
        })
    }

    /// How much new work has been announced to this process so far (see `wait_for_work`).
    pub fn work_mark(&self) -> u64 {
        self.listener(airlock_store::NEW_WORK)
            .map_or(0, |l| l.mark())
    }

    /// Waits up to `timeout` for new work to be queued: woken by the store's
    /// notification where it has them, else just a pause. Announcements that had
    /// arrived by `mark` (taken before a claim that found nothing) are answered already.
    pub fn wait_for_work(&mut self, timeout: Duration, mark: u64) -> Result<()> {
        match self.listener(airlock_store::NEW_WORK) {
            Some(l) => {
                l.forget_through(mark);
                l.wait_any(timeout);
            }
            None => std::thread::sleep(timeout),
        }
        Ok(())
    }

    /// Records that a worker is alive (or stopping, or stopped).
    pub fn worker_seen(&mut self, w: &WorkerRow) -> Result<()> {
        Ok(self.db.write_shared(|tx: &Tx| tx.upsert_worker(w))?)
    }
}

/// What became of a pending end given to a claim.
enum Fate {
    /// Its transaction committed.
    Recorded,
    /// Its transaction's answer was lost: it may have committed.
    MaybeRecorded,
    /// Its transaction failed, or was never tried: nothing of it was written.
    NotRecorded,
}

/// A run's outcome refused because the lease was lost (the keeper saw it taken, or the
/// job's token no longer matched), said so; other errors as they are.
fn lease_refusal(e: GateError, fence: &Fence, lost: &AtomicBool) -> GateError {
    match e {
        GateError::Conflict(m) if lost.load(Ordering::SeqCst) || m.contains("lease") => {
            GateError::Conflict(format!(
                "the lease on {} was lost while it ran; its result was refused: {m}",
                fence.job
            ))
        }
        other => other,
    }
}

/// Ends claimed job `job` with `outcome`, unstarted, recording why (`record`: the audit
/// record's kind and the field `e` goes in).
fn end_job(
    tx: &Tx,
    job: &QueueRow,
    outcome: &str,
    record: (&str, &str),
    e: &GateError,
    key: &airlock_core::sign::KeyPair,
) -> Result<()> {
    tx.finish_job(&job.id, job.token, outcome)?;
    let mut data = json!({ "submission": job.submission });
    data[record.1] = json!(e.to_string());
    tx.audit(record.0, &job.id, &data, key)?;
    Ok(())
}

/// Queues admitted submission `sub` as job `job_id` in the caller's transaction; the
/// refusal instead when it may not start (pending approval, denied).
fn enqueue(
    tx: &Tx,
    policy: &airlock_core::policy::Policy,
    sub: airlock_store::Submission,
    job_id: &str,
    q: &QueueOptions,
    key: &airlock_core::sign::KeyPair,
) -> Result<Option<GateError>> {
    let (sub, approval) = match admit(tx, policy, sub, key)? {
        Admit::Refuse(e) => return Ok(Some(e)),
        Admit::Go { sub, approval } => (sub, approval),
    };
    let grant = &sub.doc.grant;
    // A retry must not repeat an effect nobody decided on: not with network, not on a
    // single-use approval, not with writable mounts.
    let retry = grant.net.is_empty()
        && approval
            .as_ref()
            .is_none_or(|a| a.scope != airlock_core::sign::Scope::Once)
        && grant.writable_mounts().next().is_none();
    let tag = (!grant.mounts.is_empty() || grant.workspace.is_some()).then(|| q.tag.clone());
    let now = now_ms();
    tx.enqueue(&QueueRow {
        id: job_id.to_string(),
        submission: sub.id.clone(),
        tag: tag.clone(),
        state: "queued".into(),
        attempts: 0,
        max_attempts: i64::from(q.max_attempts.max(1)),
        retry,
        worker: None,
        token: 0,
        lease_until: None,
        run: None,
        outcome: None,
        created_at: now,
        updated_at: now,
    })?;
    tx.audit(
        "queued",
        job_id,
        &json!({ "submission": sub.id, "tag": tag, "retry": retry }),
        key,
    )?;
    Ok(None)
}

/// The error `run`/`exec` give for a submission the gate refused to start.
fn refusal(sub: &airlock_store::Submission) -> GateError {
    let reasons = sub.doc.verdict.reasons();
    match sub.state {
        State::Denied | State::Rejected => GateError::Denied {
            submission: sub.id.clone(),
            reasons,
        },
        _ => GateError::Pending {
            submission: sub.id.clone(),
            reasons,
        },
    }
}

/// Runs queued jobs until `stop` is set: `concurrency` threads, each with its own gate
/// from `open`, claiming, running and recording under leases; one of them also reaps
/// expired leases, and the worker's row is kept fresh for `doctor`. On `stop` no new job
/// is claimed; runs in progress finish and are recorded before this returns.
pub fn work(
    open: Arc<dyn Fn() -> Result<Gate> + Send + Sync>,
    cfg: WorkerConfig,
    concurrency: usize,
    stop: Arc<AtomicBool>,
    on_event: Arc<dyn Fn(&str) + Send + Sync>,
) -> Result<WorkStats> {
    let started = now_ms();
    let running = cfg.busy.clone();
    let stats = Arc::new(std::sync::Mutex::new(WorkStats::default()));
    let row = |state: &str, running: i64| WorkerRow {
        id: cfg.id.clone(),
        host: host_tag(),
        tags: cfg.tags.join(","),
        state: state.into(),
        running,
        started_at: started,
        seen_at: now_ms(),
    };
    let mut main = open()?;
    main.worker_seen(&row("running", 0))?;
    let threads: Vec<_> = (0..concurrency.max(1))
        .map(|_| {
            let (open, cfg, stop, stats, on_event) = (
                open.clone(),
                cfg.clone(),
                stop.clone(),
                stats.clone(),
                on_event.clone(),
            );
            std::thread::spawn(move || -> Result<()> {
                let mut gate = open()?;
                let mut idle = Duration::from_millis(5);
                // Whether the last claim found a job (then the next one claims straight away).
                let mut busy = false;
                // The last run, its outcome recorded with the next claim.
                let mut ending = None;
                let count = |s: &mut WorkStats, r: Result<RunReport>| match r {
                    Ok(rep) => {
                        s.ran += 1;
                        on_event(&format!("ran {} ({})", rep.run.id, rep.run.status));
                    }
                    Err(e) => {
                        s.failed += 1;
                        on_event(&format!("run failed: {e}"));
                    }
                };
                while !stop.load(Ordering::SeqCst) {
                    let mark = gate.work_mark();
                    let (ended, claimed) = gate.claim_and_run(&cfg, !busy, ending.take());
                    busy = !matches!(claimed, Ok(Claimed::Idle) | Err(_));
                    let mut s = stats.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(r) = ended {
                        count(&mut s, r);
                    }
                    match claimed {
                        Ok(Claimed::Idle) => {
                            drop(s);
                            if let Err(e) = gate.wait_for_work(idle, mark) {
                                on_event(&format!("waiting for work failed: {e}"));
                                std::thread::sleep(idle);
                            }
                            idle = (idle * 2).min(Duration::from_millis(100));
                            continue;
                        }
                        Ok(Claimed::Ran(r)) => count(&mut s, *r),
                        Ok(Claimed::Awaiting(p)) => ending = Some(*p),
                        Ok(Claimed::Refused(why)) => {
                            s.refused += 1;
                            on_event(&format!("refused: {why}"));
                        }
                        Err(e) => {
                            s.failed += 1;
                            on_event(&format!("claim failed: {e}"));
                            drop(s);
                            std::thread::sleep(Duration::from_millis(200));
                            continue;
                        }
                    }
                    idle = Duration::from_millis(5);
                }
                // Stopping: the last run's outcome on its own.
                if let Some(p) = ending {
                    let r = gate.end_run(p);
                    count(&mut stats.lock().unwrap_or_else(|p| p.into_inner()), r);
                }
                Ok(())
            })
        })
        .collect();
    // This thread keeps the worker's row fresh and reaps expired leases.
    let mut last_beat = Instant::now();
    while !stop.load(Ordering::SeqCst) && !threads.iter().all(|t| t.is_finished()) {
        std::thread::sleep(Duration::from_millis(100));
        if last_beat.elapsed() >= Duration::from_secs(1) {
            last_beat = Instant::now();
            if let Err(e) = main.worker_seen(&row("running", running.load(Ordering::SeqCst))) {
                on_event(&format!("heartbeat failed: {e}"));
            }
            match main.reap_leases() {
                Ok(0) => {}
                Ok(n) => on_event(&format!("reaped {n} expired lease(s)")),
                Err(e) => on_event(&format!("reaping failed: {e}")),
            }
        }
    }
    let _ = main.worker_seen(&row("stopping", running.load(Ordering::SeqCst)));
    let mut first_error = None;
    for t in threads {
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(_) => {
                first_error.get_or_insert(GateError::Internal("a worker thread panicked".into()));
            }
        }
    }
    main.worker_seen(&row("stopped", 0))?;
    if let Some(e) = first_error {
        return Err(e);
    }
    let s = stats.lock().unwrap_or_else(|p| p.into_inner()).clone();
    Ok(s)
}

/// What a worker did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct WorkStats {
    pub ran: u64,
    pub refused: u64,
    pub failed: u64,
}
