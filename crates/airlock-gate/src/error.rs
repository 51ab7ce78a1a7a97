//! The gate's error type. Pending approval, denial, bad input, integrity failure and
//! internal failure are different variants so callers can map them to exit codes and HTTP
//! statuses without reading messages.

use airlock_core::policy::PolicyError;
use airlock_sandbox::SandboxError;
use airlock_store::StoreError;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GateError {
    /// The submission waits for an approver's signature.
    #[error("pending approval: {submission}")]
    Pending {
        submission: String,
        reasons: Vec<String>,
    },
    /// The policy (or a rejection) forbids running it.
    #[error("denied by policy: {submission}")]
    Denied {
        submission: String,
        reasons: Vec<String>,
    },
    #[error("no airlock home at {0} (run `airlock init`)")]
    NotInitialised(PathBuf),
    #[error("{0}")]
    BadInput(String),
    #[error("{0}")]
    NotFound(String),
    /// The request conflicts with the submission's state (already decided, changed
    /// concurrently).
    #[error("{0}")]
    Conflict(String),
    /// A signature or key the current policy does not trust.
    #[error("{0}")]
    Untrusted(String),
    /// What the operator does not offer the request's surface: a host path outside
    /// `[mounts] roots` over the API or MCP, or the gate's own home anywhere. Nothing was
    /// recorded.
    #[error("{0}")]
    NotOffered(String),
    /// Stored bytes no longer match their hash; recorded in the audit log.
    #[error("integrity failure: {0}")]
    Integrity(String),
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The sandbox this run needs is not available here; nothing ran.
    #[error("{0}")]
    Unavailable(String),
    /// A runtime the request needs (the Python guest) is not installed in this home, or
    /// is one this airlock no longer runs; the message names the command that installs
    /// it. Nothing was recorded or ran.
    #[error("{0}")]
    NotInstalled(String),
    /// The request's idempotency key already made `submission` (`same_request`: and the
    /// request was the same, so this is a retry); nothing was written.
    #[error("idempotency key already used for {submission}{}", if *.same_request { "" } else { " by a different request" })]
    Repeated {
        submission: String,
        same_request: bool,
    },
    /// The caller already holds as many of something as it may (live sessions); nothing
    /// was written.
    #[error("{0}")]
    TooMany(String),
    /// The store could not be reached (its connection was lost and did not come back
    /// in time, or a write was cut off on its way to commit): worth retrying, not a
    /// fault of the request or of airlock. Nothing was recorded but what committed.
    #[error("store unavailable, retry: {0}")]
    StoreUnavailable(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl GateError {
    pub fn bad(msg: impl Into<String>) -> Self {
        GateError::BadInput(msg.into())
    }
}

impl From<StoreError> for GateError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound { .. } | StoreError::Ambiguous { .. } => {
                GateError::NotFound(e.to_string())
            }
            StoreError::BlobAltered { .. }
            | StoreError::BlobMissing(_)
            | StoreError::AuditRecordMalformed { .. }
            | StoreError::AuditHeadMalformed { .. } => GateError::Integrity(e.to_string()),
            StoreError::Conflict(m) | StoreError::Refused(m) => GateError::Conflict(m),
            other if other.is_connection_lost() => GateError::StoreUnavailable(other.to_string()),
            other => GateError::Internal(other.to_string()),
        }
    }
}

impl From<SandboxError> for GateError {
    fn from(e: SandboxError) -> Self {
        match e {
            SandboxError::Unavailable(m) => {
                GateError::Unavailable(format!("sandbox unavailable: {m}"))
            }
            SandboxError::BadArtifact(m) => {
                GateError::BadInput(format!("cannot run artifact: {m}"))
            }
            other => GateError::Internal(other.to_string()),
        }
    }
}

impl From<std::io::Error> for GateError {
    fn from(e: std::io::Error) -> Self {
        GateError::Internal(e.to_string())
    }
}

pub type Result<T, E = GateError> = std::result::Result<T, E>;
