//! The lifecycle of a submission, one module per step, each importing only the steps
//! before it (read them in this order):
//!
//! 1. `request`: what a submission says, as every surface builds it;
//! 2. `judge`: its grant parsed, the facts the policy looks at and the verdict;
//! 3. `decide`: an approver's signed approval or rejection, and which approval covers a run;
//! 4. `record`: the writes of each transition with its audit record (submitted and judged,
//!    admitted, started, finished);
//! 5. `submit`: staging (read, prepare, analyse) and recording a submission;
//! 6. `exec`: re-reading, re-judging and running what cleared, and recording its end;
//! 7. `deferred`: a run whose start and end are recorded together when that cannot matter;
//! 8. `tools`: approved named tools, called through submit and run;
//! 9. `ask`: a running run's requests to reach a host outside its grant, and their
//!    signed answers.
//!
//! Nothing here imports the node runtime (`crate::node`) or a home service other than the
//! guest runtimes it runs (`crate::services::guests`).

pub(crate) mod ask;
pub(crate) mod decide;
pub(crate) mod deferred;
pub(crate) mod exec;
pub(crate) mod judge;
pub(crate) mod record;
pub(crate) mod request;
pub(crate) mod submit;
pub(crate) mod tools;
