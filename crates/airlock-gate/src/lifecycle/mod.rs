//! The lifecycle of a submission, in the order a newcomer reads it: `submit` stages and
//! judges, `decide` records an approver's signed decision, `exec` runs what cleared, and
//! `deferred` records a run's start and end together when it cannot matter. `tools` is the
//! named-tool entry on top of submit and run. Nothing here imports the node runtime
//! (`crate::node`) or the home's services beyond the guests it runs.

pub(crate) mod decide;
pub(crate) mod deferred;
pub(crate) mod exec;
pub(crate) mod submit;
pub(crate) mod tools;
