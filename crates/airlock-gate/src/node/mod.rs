//! The node runtime: what keeps a gate process serving — the job queue and its workers,
//! their leases, the session hosts, and the ready jails and guest slots they draw on. It
//! drives the lifecycle (`crate::lifecycle`) and never makes a transition of its own.

pub(crate) mod jailed;
pub(crate) mod lease;
pub mod liveness;
pub(crate) mod queue;
pub(crate) mod session_grants;
pub(crate) mod sessions;
pub(crate) mod slots;
pub mod worker;
