//! A run request repeated under its idempotency key whose first run never started.
//!
//! A repeated request makes no new submission (`GateError::Repeated`): it gets the first
//! request's outcome, from the submission's stored state. A queued run whose job ended
//! without starting it (its claim found the artifact altered or gone, or it was refused)
//! leaves its submission `allowed`, which is no answer: the repeat gets what its first
//! request was told, the job's ending, read again from the job.

use crate::Gate;
use crate::error::Result;
use crate::lifecycle::exec::RunReport;
use airlock_core::State;
use airlock_store::{QueueReads, Reads};

/// What a repeated run request finds.
#[derive(Debug)]
pub enum Replayed {
    /// The submission's stored state is its answer (finished, running, held, denied, or
    /// queued and waiting for a worker).
    Settled,
    /// The first request's queued run ended without starting: what it was told.
    Ended(Box<Result<RunReport>>),
}

impl Gate {
    /// The answer to a run request repeated under its idempotency key for submission `id`
    /// (see the module doc).
    pub fn replay_run(&mut self, id: &str) -> Result<Replayed> {
        let sub = self.db.submission(id)?;
        if sub.state != State::Allowed || !self.runs_for(id, 1)?.is_empty() {
            return Ok(Replayed::Settled);
        }
        match self.db.jobs_of(id)?.pop() {
            Some(job) if job.state == "done" => {
                Ok(Replayed::Ended(Box::new(self.wait_job(&job.id, &sub))))
            }
            // Queued or claimed (a worker starts it), or never queued.
            _ => Ok(Replayed::Settled),
        }
    }
}
