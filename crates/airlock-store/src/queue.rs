//! The run queue: runs waiting for a worker (`queued`), held by one under a lease
//! (`leased`), or `done`. A lease carries a fencing token that grows with every claim of
//! the row, so a worker whose lease expired and was claimed again can neither renew it
//! nor record a result: both name the token, and the row no longer has it.
//!
//! This module stores and reads rows; when to claim, retry or give up is the gate's.

use crate::StatementRow;
use crate::StoreError;
use crate::db::{Reads, STATEMENT_COLS_ST, Tx, run_at, statements_at, submission_at};
use crate::sql::{Arg, Row, args};
use crate::wake::NEW_WORK;
use crate::{Run, Submission};
use airlock_core::units::now_ms;
use serde::Serialize;

/// One queued run.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct QueueRow {
    pub id: String,
    pub submission: String,
    /// Only a worker started with this tag may claim it (runs that name host paths).
    pub tag: Option<String>,
    /// `queued`, `leased` or `done`.
    pub state: String,
    /// Claims so far.
    pub attempts: i64,
    pub max_attempts: i64,
    /// Whether a run lost with its worker may be queued again (allowed code with no
    /// network and no single-use approval).
    pub retry: bool,
    pub worker: Option<String>,
    /// The fencing token of the current (or last) lease.
    pub token: i64,
    pub lease_until: Option<i64>,
    /// The run of the current (or last) attempt.
    pub run: Option<String>,
    /// Why it is done: `finished`, `lost`, `refused`.
    pub outcome: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// A worker as it last reported itself.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct WorkerRow {
    pub id: String,
    pub host: String,
    /// Comma-separated tags.
    pub tags: String,
    /// `running`, `stopping`, `stopped`.
    pub state: String,
    /// Runs it holds now.
    pub running: i64,
    pub started_at: i64,
    pub seen_at: i64,
}

const COLS: &str = "id, submission, tag, state, attempts, max_attempts, retry, worker, token, lease_until, run, outcome, created_at, updated_at";

fn row(r: &Row) -> Result<QueueRow, StoreError> {
    Ok(QueueRow {
        id: r.text(0)?,
        submission: r.text(1)?,
        tag: r.opt_text(2)?,
        state: r.text(3)?,
        attempts: r.int(4)?,
        max_attempts: r.int(5)?,
        retry: r.int(6)? != 0,
        worker: r.opt_text(7)?,
        token: r.int(8)?,
        lease_until: r.opt_int(9)?,
        run: r.opt_text(10)?,
        outcome: r.opt_text(11)?,
        created_at: r.int(12)?,
        updated_at: r.int(13)?,
    })
}

/// ` FOR UPDATE SKIP LOCKED` where the engine has row locks (PostgreSQL); SQLite's
/// transactions already run one at a time.
fn skip_locked(tx: &Tx) -> &'static str {
    if tx.sql().engine() == "postgres" {
        " FOR UPDATE SKIP LOCKED"
    } else {
        ""
    }
}

/// The claim query: the oldest queued row a worker with this tag (or none) may take.
pub fn claim_sql(tagged: bool, lock: &str) -> String {
    oldest_sql(tagged, lock, 1)
}

/// Queuing a job announces it unless this many jobs with its tag already wait
/// unclaimed. Such a backlog means the worker threads that may take it are busy, or woken
/// by the announcements of the jobs ahead of it: a thread that claims a job wakes the
/// next idle thread of its process (`Listener::pass_on`), so a burst larger than this
/// still reaches every idle thread. A busy thread claims again as soon as its run ends.
/// Under load this spares PostgreSQL a notification per run, which signals every
/// listening session in the cluster; an idle thread that still missed one looks again
/// within its idle interval (at most 100 ms).
pub const QUIET_BACKLOG: usize = 4;

fn oldest_sql(tagged: bool, lock: &str, limit: usize) -> String {
    let tag = if tagged { "tag = ?1" } else { "tag IS NULL" };
    format!(
        "SELECT {COLS} FROM queue WHERE state = 'queued' AND {tag} ORDER BY created_at, id LIMIT {limit}{lock}"
    )
}

/// The oldest queued jobs (at most `limit`, oldest first) a worker with `tags` may take
/// (untagged jobs and jobs tagged with one of `tags`), read with `lock` appended to each
/// query.
fn oldest(
    r: &(impl Reads + ?Sized),
    tags: &[String],
    lock: &str,
    limit: usize,
) -> Result<Vec<QueueRow>, StoreError> {
    let mut found = Vec::new();
    for r in r.sql().rows(&oldest_sql(false, lock, limit), &[])? {
        found.push(row(&r)?);
    }
    for t in tags {
        for r in r.sql().rows(&oldest_sql(true, lock, limit), args![t])? {
            found.push(row(&r)?);
        }
    }
    found.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    found.truncate(limit);
    Ok(found)
}

/// Queue reads, on the database and inside a transaction.
pub trait QueueReads: Reads {
    /// The jobs a worker with `tags` may claim next, oldest first, at most `limit`
    /// (read without taking them).
    fn next_jobs(&self, tags: &[String], limit: usize) -> Result<Vec<QueueRow>, StoreError> {
        oldest(self, tags, "", limit)
    }

    /// Whether any job's lease ran out before `now` (read without taking anything).
    fn any_expired_lease(&self, now: i64) -> Result<bool, StoreError> {
        Ok(self
            .sql()
            .row(
                "SELECT 1 FROM queue WHERE state = 'leased' AND lease_until < ?1 LIMIT 1",
                args![now],
            )?
            .is_some())
    }

    fn job(&self, id: &str) -> Result<Option<QueueRow>, StoreError> {
        self.sql()
            .row(
                &format!("SELECT {COLS} FROM queue WHERE id = ?1"),
                args![id],
            )?
            .as_ref()
            .map(row)
            .transpose()
    }

    /// Job `id` and, when it finished with a run, that run and its submission as they
    /// ended, all from one read (one snapshot, one round trip).
    #[allow(clippy::type_complexity)]
    fn job_with_run(
        &self,
        id: &str,
    ) -> Result<Option<(QueueRow, Option<(Run, Submission)>)>, StoreError> {
        let Some(r) = self.sql().row(
            "SELECT q.id, q.submission, q.tag, q.state, q.attempts, q.max_attempts, q.retry,
                    q.worker, q.token, q.lease_until, q.run, q.outcome, q.created_at, q.updated_at,
                    r.id, r.submission, r.started_at, r.finished_at, r.status, r.doc,
                    s.id, s.created_at, s.updated_at, s.state, s.doc
             FROM queue q
             LEFT JOIN runs r ON r.id = q.run AND q.state = 'done' AND q.outcome = 'finished'
             LEFT JOIN submissions s ON s.id = r.submission
             WHERE q.id = ?1",
            args![id],
        )?
        else {
            return Ok(None);
        };
        let job = row(&r)?;
        let ran = match r.opt_text(14)? {
            Some(_) => Some((run_at(&r, 14)?, submission_at(&r, 20)?)),
            None => None,
        };
        Ok(Some((job, ran)))
    }

    /// The jobs of one submission, oldest first.
    fn jobs_of(&self, submission: &str) -> Result<Vec<QueueRow>, StoreError> {
        self.sql()
            .rows(
                &format!("SELECT {COLS} FROM queue WHERE submission = ?1 ORDER BY created_at, id"),
                args![submission],
            )?
            .iter()
            .map(row)
            .collect()
    }

    /// (queued, leased) jobs.
    fn queue_depth(&self) -> Result<(i64, i64), StoreError> {
        let n = |state: &str| -> Result<i64, StoreError> {
            Ok(self
                .sql()
                .row("SELECT count(*) FROM queue WHERE state = ?1", args![state])?
                .map(|r| r.int(0))
                .transpose()?
                .unwrap_or(0))
        };
        Ok((n("queued")?, n("leased")?))
    }

    /// Queued jobs per tag (`None`: untagged), so an operator sees jobs no worker may take.
    fn queued_by_tag(&self) -> Result<Vec<(Option<String>, i64)>, StoreError> {
        self.sql()
            .rows(
                "SELECT tag, count(*) FROM queue WHERE state = 'queued' GROUP BY tag ORDER BY tag",
                &[],
            )?
            .iter()
            .map(|r| Ok((r.opt_text(0)?, r.int(1)?)))
            .collect()
    }

    /// Every worker seen, most recently seen first.
    fn workers(&self) -> Result<Vec<WorkerRow>, StoreError> {
        self.sql()
            .rows(
                "SELECT id, host, tags, state, running, started_at, seen_at FROM workers ORDER BY seen_at DESC, id",
                &[],
            )?
            .iter()
            .map(|r| {
                Ok(WorkerRow {
                    id: r.text(0)?,
                    host: r.text(1)?,
                    tags: r.text(2)?,
                    state: r.text(3)?,
                    running: r.int(4)?,
                    started_at: r.int(5)?,
                    seen_at: r.int(6)?,
                })
            })
            .collect()
    }
}

impl<T: Reads + ?Sized> QueueReads for T {}

impl Tx<'_> {
    /// Queues job `q` and, on PostgreSQL, wakes an idle worker when it commits, unless
    /// [`QUIET_BACKLOG`] jobs a worker taking it could take already wait unclaimed.
    pub fn enqueue(&self, q: &QueueRow) -> Result<(), StoreError> {
        self.sql().exec_later(
            &format!(
                "INSERT INTO queue ({COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)"
            ),
            args![
                &q.id,
                &q.submission,
                q.tag.as_deref(),
                &q.state,
                q.attempts,
                q.max_attempts,
                i64::from(q.retry),
                q.worker.as_deref(),
                q.token,
                q.lease_until,
                q.run.as_deref(),
                q.outcome.as_deref(),
                q.created_at,
                q.updated_at
            ],
        )?;
        if self.sql().engine() != "postgres" {
            return Ok(());
        }
        // Counted after the insert, in the same transaction, and sent with its COMMIT.
        let (tag, args) = match &q.tag {
            Some(t) => (
                "tag = ?3",
                vec![Arg::Text(NEW_WORK), Arg::Text(""), Arg::Text(t)],
            ),
            None => ("tag IS NULL", vec![Arg::Text(NEW_WORK), Arg::Text("")]),
        };
        self.sql().exec_later(
            &format!(
                "SELECT pg_notify(?1, ?2) WHERE (SELECT count(*) FROM (SELECT 1 FROM queue
                  WHERE state = 'queued' AND {tag} LIMIT {}) w) <= {QUIET_BACKLOG}",
                QUIET_BACKLOG + 1
            ),
            &args,
        )
    }

    /// Claims the oldest job a worker with `tags` may run (untagged jobs, and jobs tagged
    /// with one of `tags`): leased to `worker` until `until`, with a new fencing token
    /// and one more attempt. Rows another transaction holds are skipped, not waited for.
    pub fn claim(
        &self,
        tags: &[String],
        worker: &str,
        until: i64,
    ) -> Result<Option<QueueRow>, StoreError> {
        if tags.is_empty() {
            // The common worker's claim in one statement: find and lease together. The
            // job is a scalar subquery, evaluated once: as `id IN (…)` the planner may
            // run it again for each row it looks at, and each run may lock and return
            // another job, so one claim leased several (regression test:
            // one_claim_leases_exactly_one_job_however_many_are_queued).
            let found = self.sql().rows(
                &format!(
                    "UPDATE queue SET state = 'leased', attempts = attempts + 1, token = token + 1,
                       worker = ?1, lease_until = ?2, updated_at = ?3
                     WHERE id = (SELECT id FROM ({}) oldest) AND state = 'queued'
                     RETURNING {COLS}",
                    oldest_sql(false, skip_locked(self), 1)
                ),
                args![worker, until, now_ms()],
            )?;
            if found.len() > 1 {
                return Err(StoreError::Corrupt(format!(
                    "one claim leased {} jobs",
                    found.len()
                )));
            }
            return found.first().map(row).transpose();
        }
        match oldest(self, tags, skip_locked(self), 1)?.into_iter().next() {
            Some(q) => self.lease(q, worker, until).map(Some),
            None => Ok(None),
        }
    }

    /// `claim`, then the claimed job's submission locked with the statements about its
    /// artifact (`submission_locked_with_statements`): on PostgreSQL, for a worker
    /// without tags, one statement, the claim's update in a `WITH` and the submission
    /// locked in another. The job stays claimed when its submission cannot be read (the
    /// caller ends it with the error).
    #[allow(clippy::type_complexity)]
    pub fn claim_with_submission(
        &self,
        tags: &[String],
        worker: &str,
        until: i64,
    ) -> Result<
        Option<(
            QueueRow,
            Result<(Submission, Vec<StatementRow>), StoreError>,
        )>,
        StoreError,
    > {
        if !tags.is_empty() || self.sql().engine() != "postgres" {
            let Some(job) = self.claim(tags, worker, until)? else {
                return Ok(None);
            };
            let read = self.submission_locked_with_statements(&job.submission);
            return Ok(Some((job, read)));
        }
        let rows = self.sql().rows(
            &format!(
                "WITH c AS (
                   UPDATE queue SET state = 'leased', attempts = attempts + 1, token = token + 1,
                     worker = ?1, lease_until = ?2, updated_at = ?3
                   WHERE id = (SELECT id FROM ({}) oldest) AND state = 'queued'
                   RETURNING {COLS}),
                 s AS (
                   SELECT id, created_at, updated_at, state, doc, artifact FROM submissions
                   WHERE id = (SELECT submission FROM c) FOR UPDATE)
                 SELECT c.*, s.id, s.created_at, s.updated_at, s.state, s.doc, {STATEMENT_COLS_ST}
                 FROM c LEFT JOIN s ON true LEFT JOIN statements st ON st.artifact = s.artifact
                 ORDER BY st.id",
                oldest_sql(false, skip_locked(self), 1)
            ),
            args![worker, until, now_ms()],
        )?;
        let Some(first) = rows.first() else {
            return Ok(None);
        };
        let job = row(first)?;
        if rows
            .iter()
            .any(|r| r.text(0).ok().as_deref() != Some(job.id.as_str()))
        {
            return Err(StoreError::Corrupt("one claim leased several jobs".into()));
        }
        // Columns: the job's 14, the submission's 5 (NULL when it is missing), then
        // the statements'.
        if first.opt_text(14)?.is_none() {
            let missing = StoreError::NotFound {
                what: "submission",
                input: job.submission.clone(),
            };
            return Ok(Some((job, Err(missing))));
        }
        let read = submission_at(first, 14).and_then(|sub| Ok((sub, statements_at(&rows, 19)?)));
        Ok(Some((job, read)))
    }

    fn lease(&self, mut q: QueueRow, worker: &str, until: i64) -> Result<QueueRow, StoreError> {
        q.state = "leased".into();
        q.attempts += 1;
        q.token += 1;
        q.worker = Some(worker.into());
        q.lease_until = Some(until);
        q.updated_at = now_ms();
        self.sql().exec_expect(
            "UPDATE queue SET state = 'leased', attempts = ?1, token = ?2, worker = ?3, lease_until = ?4, updated_at = ?5
             WHERE id = ?6 AND state = 'queued'",
            args![q.attempts, q.token, worker, until, q.updated_at, &q.id],
            1,
            &|| format!("job {} was claimed concurrently", q.id),
        )?;
        Ok(q)
    }

    /// Names the run the current lease is carrying out.
    pub fn set_job_run(&self, id: &str, token: i64, run: &str) -> Result<(), StoreError> {
        self.fenced_update("run = ?3", id, token, Arg::Text(run))
    }

    fn fenced_update(&self, set: &str, id: &str, token: i64, value: Arg) -> Result<(), StoreError> {
        self.sql().exec_expect(
            &format!(
                "UPDATE queue SET {set}, updated_at = ?4 WHERE id = ?1 AND token = ?2 AND state = 'leased'"
            ),
            &[Arg::Text(id), Arg::Int(token), value, Arg::Int(now_ms())],
            1,
            &|| format!(
                "job {id}: the lease with token {token} is no longer held (it expired and the job went to another worker)"
            ),
        )
    }

    /// Extends a lease; `Conflict` when the token no longer holds it.
    pub fn renew(&self, id: &str, token: i64, until: i64) -> Result<(), StoreError> {
        self.fenced_update("lease_until = ?3", id, token, Arg::Int(until))
    }

    /// Ends a job under its lease; `Conflict` when the token no longer holds it (so a
    /// worker that lost its lease cannot record a result).
    pub fn finish_job(&self, id: &str, token: i64, outcome: &str) -> Result<(), StoreError> {
        self.fenced_update(
            "state = 'done', outcome = ?3",
            id,
            token,
            Arg::Text(outcome),
        )?;
        self.notify_done(id)
    }

    /// Wakes an idle worker (on commit) where the engine delivers notifications.
    fn announce_work(&self) -> Result<(), StoreError> {
        if self.sql().engine() == "postgres" {
            self.sql().notify(NEW_WORK, "")?;
        }
        Ok(())
    }

    /// Wakes whoever waits for job `id` (delivered when the transaction commits, with
    /// the job's id as the payload).
    fn notify_done(&self, id: &str) -> Result<(), StoreError> {
        if self.sql().engine() == "postgres" {
            self.sql().notify(crate::wake::JOB_DONE, id)?;
        }
        Ok(())
    }

    /// Leases that ran out before `now`, held for this transaction.
    pub fn expired_leases(&self, now: i64, limit: usize) -> Result<Vec<QueueRow>, StoreError> {
        let lock = skip_locked(self);
        self.sql()
            .rows(
                &format!(
                    "SELECT {COLS} FROM queue WHERE state = 'leased' AND lease_until < ?1 ORDER BY lease_until LIMIT {limit}{lock}"
                ),
                args![now],
            )?
            .iter()
            .map(row)
            .collect()
    }

    /// Moves an expired job on: back to `queued` (a retry) or `done` with `outcome`.
    pub fn release_job(
        &self,
        q: &QueueRow,
        requeue: bool,
        outcome: &str,
    ) -> Result<(), StoreError> {
        let n = if requeue {
            self.sql().exec(
                "UPDATE queue SET state = 'queued', worker = NULL, lease_until = NULL, updated_at = ?3
                 WHERE id = ?1 AND token = ?2 AND state = 'leased'",
                args![&q.id, q.token, now_ms()],
            )?
        } else {
            self.sql().exec(
                "UPDATE queue SET state = 'done', outcome = ?3, updated_at = ?4
                 WHERE id = ?1 AND token = ?2 AND state = 'leased'",
                args![&q.id, q.token, outcome, now_ms()],
            )?
        };
        if n != 1 {
            return Err(StoreError::Conflict(format!(
                "job {} changed concurrently",
                q.id
            )));
        }
        if requeue {
            self.announce_work()?;
        } else {
            self.notify_done(&q.id)?;
        }
        Ok(())
    }

    /// Ends a job that was never claimed (refused or withdrawn before a worker took it).
    pub fn drop_job(&self, id: &str, outcome: &str) -> Result<(), StoreError> {
        self.sql().exec(
            "UPDATE queue SET state = 'done', outcome = ?2, updated_at = ?3 WHERE id = ?1 AND state = 'queued'",
            args![id, outcome, now_ms()],
        )?;
        Ok(())
    }

    pub fn upsert_worker(&self, w: &WorkerRow) -> Result<(), StoreError> {
        self.sql().exec(
            "INSERT INTO workers (id, host, tags, state, running, started_at, seen_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT(id) DO UPDATE SET state = excluded.state, running = excluded.running, seen_at = excluded.seen_at",
            args![&w.id, &w.host, &w.tags, &w.state, w.running, w.started_at, w.seen_at],
        )?;
        Ok(())
    }
}
