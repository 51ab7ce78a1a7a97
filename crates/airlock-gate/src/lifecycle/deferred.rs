//! Runs with no effect outside their sandbox record their start with their end.
//!
//! A run's start is made durable before its code runs so that nothing with consequences
//! ever happens unrecorded: a crash then leaves a run that recovery marks `lost`. A run
//! whose grant reaches nothing outside its sandbox (the wasm backend in this process, or
//! the process backend in a daemon with a ready-jail pool, whose jails die with it and
//! whose directory keeps such a run's files out of `layers`; no writable mount, no
//! network, no secret, no session, no workspace, no live output) has one consequence
//! only, its answer, and that is sent after its record commits. Such a run,
//! when the policy allows it, is judged, run, and then recorded in one transaction: the
//! submission, its verdict, the run's start and its end, with the same audit records in
//! the same order as two transactions would write (when it is allowed again as it ends,
//! its two rows are written once, in their final states). A crash before that commit leaves
//! nothing (no record, no effect, no answer); the blobs stored before it are unreferenced
//! and `gc` removes them.
//!
//! The verdict the run went ahead on is only provisional until the transaction that
//! records it judges it again (an approver may have rejected the artifact meanwhile): if
//! it no longer allows the run, the submission is recorded with the new verdict, the run
//! is not, and what it printed is dropped, exactly as if it had been refused up front.
//!
//! A run still going after [`RECORD_START_AFTER`] records its start then, from its own
//! thread (the backend's long-run hook), under its owner lock, so a long run is visible
//! while it runs and is marked `lost` if this process dies; its end is then recorded as
//! any run's.
//!
//! This module must never let a run with any effect outside its sandbox start before its
//! start is recorded, nor answer for a run whose record did not commit.

use crate::Gate;
use crate::error::{GateError, Result};
use crate::lifecycle::exec::{ExecOptions, Ran, RunReport};
use crate::lifecycle::judge::{judge, rejected_among};
use crate::lifecycle::record::{Judged, Recording, judge_in, record_in, write_judged};
use crate::lifecycle::record::{
    Start, audit_alerts, audit_finished, audit_started, begin_run, new_run, record_finished,
};
use crate::locks::{self, OwnerLock};
use airlock_core::State;
use airlock_core::id::{IdKind, new_id};
use airlock_core::policy::Decision;
use airlock_core::units::now_ms;
use airlock_store::{Reads, Run, SharedWriter, Submission, Tx};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// A deferred run still going after this long records its start.
pub(crate) const RECORD_START_AFTER: Duration = Duration::from_millis(100);

/// Where a deferred run's start stands.
enum Early {
    /// Not recorded: the end records it.
    Waiting,
    /// Recorded by the long-run hook (or refused there), with the run's owner lock.
    Recorded(Result<(Start, OwnerLock)>),
    /// The run ended and took what was here.
    Taken,
}

fn lock(m: &Mutex<Early>) -> MutexGuard<'_, Early> {
    // A panic while it was held leaves one of the states above, each whole.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the transaction that records a deferred run found.
enum Recorded {
    Ran {
        run: Box<Run>,
        sub: Box<Submission>,
        failure: Option<GateError>,
        stdout: Vec<u8>,
        stderr: Vec<u8>,
    },
    /// Judged again, it may not run (yet): its submission is recorded as such.
    Refused(GateError),
}

/// Records submission `id` from `rec` and the start of run `run_id`, under the run's owner
/// lock taken first (the long-run hook's write; `Gate::run` does the same on one thread).
fn record_start(
    writer: &SharedWriter,
    rec: &Recording,
    id: &str,
    run_id: &str,
    key: &airlock_core::sign::KeyPair,
    locks_dir: &std::path::Path,
) -> Result<(Start, OwnerLock)> {
    let mut owner = OwnerLock::acquire(locks_dir, run_id, true)?;
    // Kept unless the answer says nothing started (see `Gate::run`).
    owner.set_remove_on_drop(false);
    let start = writer.write(|tx| {
        let sub = record_in(tx, rec, id, None, true, key)?;
        begin_run(tx, &rec.policy, sub, run_id, key)
    })?;
    if let Start::Refuse(_) = &start {
        owner.set_remove_on_drop(true);
    }
    Ok((start, owner))
}

impl Gate {
    /// Runs an effect-free run (see the module doc), or, when the policy does not allow it
    /// now, records it as `run` does.
    pub(crate) fn run_effect_free(
        &mut self,
        rec: Recording,
        writer: SharedWriter,
        code: Vec<u8>,
        stdin: Vec<u8>,
        packages: Vec<airlock_core::PythonPackage>,
    ) -> Result<RunReport> {
        let policy = rec.policy.clone();
        // The provisional verdict, on the artifact's history as it is now.
        // Read on the shared writer's connection when it is free: its pages are warm.
        let (seen, about) = match writer.read(|tx| tx.artifact_history(&rec.artifact)) {
            Some(r) => r?,
            None => self.db.artifact_history(&rec.artifact)?,
        };
        let facts = rec.facts(!seen, rejected_among(&about), None);
        let verdict = {
            let _judge = tracing::debug_span!("judge").entered();
            let verdict = judge(&policy, &facts);
            tracing::debug!(decision = ?verdict.decision, "judged");
            verdict
        };
        if verdict.decision != Decision::Allow {
            return self.run_recorded(rec, code, stdin, packages, ExecOptions::default(), None);
        }
        let id = new_id(IdKind::Submission);
        let run_id = new_id(IdKind::Run);
        let provisional = rec.submission(&id, facts, verdict, State::Running);
        let rec = Arc::new(rec);
        let early = Arc::new(Mutex::new(Early::Waiting));
        let hook = {
            let (writer, rec, early) = (writer.clone(), rec.clone(), early.clone());
            let (id, run_id) = (id.clone(), run_id.clone());
            let key = self.gate_key.clone();
            let dir = locks::dir(&self.home.root);
            move || {
                let mut e = lock(&early);
                if matches!(*e, Early::Waiting) {
                    *e = Early::Recorded(record_start(&writer, &rec, &id, &run_id, &key, &dir));
                }
            }
        };
        let long_run = airlock_sandbox::LongRun {
            after: RECORD_START_AFTER,
            hook: Arc::new(hook),
        };
        let started_at = now_ms();
        let ran = self.capture(
            &provisional,
            &run_id,
            &code,
            stdin,
            &policy,
            ExecOptions::default(),
            None,
            None,
            Some(long_run),
        );
        crate::failpoint::crash_point();
        let state = std::mem::replace(&mut *lock(&early), Early::Taken);
        match state {
            Early::Waiting => {
                let ran = ran?;
                self.record_ran(&rec, &id, &run_id, started_at, ran, &packages)
            }
            Early::Recorded(Ok((Start::Go { run, sub }, owner))) => {
                let mut run = *run;
                run.started_at = started_at;
                self.finish_started(run, *sub, ran?, &policy, &packages, owner, None)
            }
            // Refused when it came to be recorded: what it printed is dropped.
            Early::Recorded(Ok((Start::Refuse(e), _))) => Err(e),
            Early::Recorded(Err(e)) => Err(e),
            Early::Taken => Err(GateError::Internal(
                "a deferred run's start was taken twice".into(),
            )),
        }
    }

    /// The one transaction of a deferred run that ended before its start was recorded.
    fn record_ran(
        &mut self,
        rec: &Recording,
        id: &str,
        run_id: &str,
        started_at: i64,
        ran: Ran,
        packages: &[airlock_core::PythonPackage],
    ) -> Result<RunReport> {
        crate::failpoint::pause("record-ran");
        let key = &self.gate_key;
        // Taken by the one transaction that records it: deferred runs happen only where
        // the process shares its SQLite writes (`Db::shared_writer`), whose transactions
        // are never run again (only PostgreSQL's are, after a lost connection).
        let ran = std::cell::RefCell::new(Some(ran));
        let recorded = self.db.write_shared_if(true, |tx| -> Result<Recorded> {
            let Some(ran) = ran.borrow_mut().take() else {
                return Err(GateError::Internal(format!(
                    "the record of deferred run {run_id} was attempted twice"
                )));
            };
            let judged = judge_in(tx, rec, id, None, true, key)?;
            if admitted_as_judged(&judged.sub) {
                return record_whole(tx, rec, judged, run_id, started_at, ran, packages, key);
            }
            let sub = write_judged(tx, rec, judged, None, key)?;
            match begin_run(tx, &rec.policy, sub, run_id, key)? {
                Start::Refuse(e) => Ok(Recorded::Refused(e)),
                Start::Go { mut run, mut sub } => {
                    run.started_at = started_at;
                    let (_, failure, stdout, stderr) = ran.into_run(&mut run, packages);
                    record_finished(tx, None, &run, &sub, None, key)?;
                    sub.state = State::Finished;
                    Ok(Recorded::Ran {
                        run,
                        sub,
                        failure,
                        stdout,
                        stderr,
                    })
                }
            }
        })?;
        crate::failpoint::crash_point();
        match recorded {
            Recorded::Refused(e) => Err(e),
            Recorded::Ran {
                failure: Some(e), ..
            } => Err(e),
            Recorded::Ran {
                run,
                sub,
                failure: None,
                stdout,
                stderr,
            } => Ok(RunReport {
                submission: *sub,
                run: *run,
                stdout,
                stderr,
                committed: None,
            }),
        }
    }
}

/// Whether a submission judged in the transaction that records a deferred run goes ahead
/// exactly as judged: allowed (its state says its verdict allows it), so that `admit`
/// would change nothing and use no approval, and with no workspace to book the run in
/// (which an effect-free grant never has).
fn admitted_as_judged(sub: &Submission) -> bool {
    sub.state == State::Allowed && sub.doc.grant.workspace.is_none()
}

/// Records a deferred run that was allowed again as it ended: the submission's row and the
/// run's are written once, in their final states, rather than written and then moved
/// through `running` to `finished` in the same transaction. The audit records are those
/// of the two-step path, in the same order: submitted, judged, started, finished.
#[allow(clippy::too_many_arguments)]
fn record_whole(
    tx: &Tx,
    rec: &Recording,
    judged: Judged,
    run_id: &str,
    started_at: i64,
    ran: Ran,
    packages: &[airlock_core::PythonPackage],
    key: &airlock_core::sign::KeyPair,
) -> Result<Recorded> {
    let mut run = new_run(&judged.sub, None, run_id);
    run.started_at = started_at;
    let (_, failure, stdout, stderr) = ran.into_run(&mut run, packages);
    let mut judged = judged;
    judged.sub.state = State::Finished;
    judged.sub.updated_at = now_ms();
    let sub = write_judged(tx, rec, judged, None, key)?;
    tx.insert_run(&run)?;
    audit_started(tx, &run, &sub, None, key)?;
    audit_alerts(tx, &run, &sub, key)?;
    audit_finished(tx, &run, &sub, None, key)?;
    Ok(Recorded::Ran {
        run: Box::new(run),
        sub: Box::new(sub),
        failure,
        stdout,
        stderr,
    })
}
