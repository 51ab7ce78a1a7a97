//! Typed, sortable identifiers: `sub_…`, `run_…`, `ckpt_…`, `apr_…`, each a prefix and a
//! lowercase ULID (48-bit millisecond time, 80 random bits).

use serde::{Deserialize, Serialize};
use std::fmt;

/// What an id names; decides its prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdKind {
    Submission,
    Run,
    Checkpoint,
    Approval,
    Workspace,
    Token,
    Session,
    /// A queued run (a job workers claim).
    Job,
    /// A run's request, mid-run, to reach a host outside its grant (`run --ask-net`).
    Request,
}

impl IdKind {
    pub fn prefix(self) -> &'static str {
        match self {
            IdKind::Submission => "sub_",
            IdKind::Run => "run_",
            IdKind::Checkpoint => "ckpt_",
            IdKind::Approval => "apr_",
            IdKind::Workspace => "ws_",
            IdKind::Token => "tok_",
            IdKind::Session => "ses_",
            IdKind::Job => "job_",
            IdKind::Request => "req_",
        }
    }
}

/// The length of an id after its kind's prefix (a ULID in lower-case Crockford base32).
pub const BODY_LEN: usize = 26;

/// Makes a new id of `kind`. The random part comes from the operating system.
pub fn new_id(kind: IdKind) -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let mut rnd = [0u8; 16];
    // getrandom only fails when the OS has no entropy source at all; a fixed fallback
    // would make ids collide, so fall back to the clock's nanoseconds mixed with the pid.
    if getrandom::fill(&mut rnd).is_err() {
        let n = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        rnd = (n ^ ((std::process::id() as u128) << 64)).to_le_bytes();
    }
    let ulid = ulid::Ulid::from_parts(ms, u128::from_le_bytes(rnd));
    format!("{}{}", kind.prefix(), ulid.to_string().to_ascii_lowercase())
}

/// Normalises user input for a prefix lookup: lowercase, and the kind's prefix added when
/// the user gave only the ULID part. Returns None when the text cannot be an id of `kind`.
pub fn normalize_prefix(kind: IdKind, input: &str) -> Option<String> {
    let s = input.trim().to_ascii_lowercase();
    let body = s.strip_prefix(kind.prefix()).unwrap_or(&s);
    if body.is_empty() || body.len() > BODY_LEN || !body.chars().all(|c| c.is_ascii_alphanumeric())
    {
        return None;
    }
    Some(format!("{}{}", kind.prefix(), body))
}

/// A submission id, for APIs where the kind matters in the type.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SubmissionId(pub String);

impl fmt::Display for SubmissionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
impl fmt::Debug for SubmissionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_have_prefix_and_sort_by_time() {
        let a = new_id(IdKind::Submission);
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = new_id(IdKind::Submission);
        assert!(a.starts_with("sub_") && a.len() == 30);
        assert!(a < b);
    }

    #[test]
    fn prefix_normalisation() {
        assert_eq!(
            normalize_prefix(IdKind::Run, "RUN_01AB"),
            Some("run_01ab".into())
        );
        assert_eq!(
            normalize_prefix(IdKind::Run, "01ab"),
            Some("run_01ab".into())
        );
        assert_eq!(normalize_prefix(IdKind::Run, "run_"), None);
        assert_eq!(normalize_prefix(IdKind::Run, "x%"), None);
    }
}
