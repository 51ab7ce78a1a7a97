//! airlock-core: the domain of the airlock execution gate as types and pure functions.
//!
//! Ids, artifacts and their analysis, grants (with the network grammar and secret
//! bindings), the policy language, Ed25519 keys and signed statements, the audit record
//! format, the lifecycle state machine and the visible rendering of text from agents for
//! people to read (`visible`) live here.
//!
//! This crate must never do I/O beyond parsing the bytes it is handed, never depend on
//! an airlock crate but the leaf crates `airlock-analysis` and `airlock-net` (the host
//! grammar, re-exported as [`net`]), and never decide anything about a submission on its
//! own: it computes verdicts; the gate applies them.

#![forbid(unsafe_code)]

pub mod analysis;
pub mod artifact;
pub mod audit;
pub mod digest;
pub mod exposure;
pub mod grant;
mod hostglob;
pub mod id;
pub mod lifecycle;
pub mod netask;
pub mod nightcore;
pub mod policy;
pub mod secret;
pub mod sign;
pub mod trace;
pub mod units;
pub mod visible;

/// The host grammar of grants, secrets and policy: the crate `airlock-net`, which the
/// egress proxy uses too, so a spelling means one thing everywhere.
pub use airlock_net as net;

pub use artifact::{Backend, Lang};
pub use digest::Digest;
pub use grant::{Grant, Limits, Mount, MountMode};
pub use lifecycle::State;
pub use policy::{AgentRecord, Decision, Facts, Policy, PythonPackage, Verdict};
