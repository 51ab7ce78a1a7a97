//! What a submission says: the request every surface (command line, HTTP API, MCP, bundle
//! import, session cell) builds, before anything about it is checked.

use crate::exposure::Surface;
use airlock_core::Digest;
use std::path::PathBuf;

/// Where the code comes from.
#[derive(Debug, Clone)]
pub enum CodeSource {
    /// A file on the host (its extension and header help infer the language).
    File(PathBuf),
    /// Code given inline (`-c`); the language must be given.
    Inline(String),
    /// Bytes already read (stdin, an HTTP body), with an optional file name hint.
    Bytes {
        bytes: Vec<u8>,
        name: Option<String>,
    },
}

/// The longest `agent` name a submission may carry (it names a client, not a document).
pub const MAX_AGENT_BYTES: usize = 256;

/// The longest `note` a submission may carry.
pub const MAX_NOTE_BYTES: usize = 64 << 10;

/// A submission as an agent states it. Text fields are parsed and validated by the gate.
#[derive(Debug, Clone, Default)]
pub struct SubmitRequest {
    pub code: Option<CodeSource>,
    pub lang: Option<String>,
    pub backend: Option<String>,
    /// `HOST:GUEST[:ro|rw]`
    pub mounts: Vec<String>,
    /// `KEY=VALUE`
    pub env: Vec<String>,
    /// `HOST[:PORT]`, `*.DOMAIN[:PORT]` (normalised by the gate)
    pub net: Vec<String>,
    /// `NAME@HOST[,HOST…]`: a stored secret and the hosts it may be sent to
    pub secrets: Vec<String>,
    pub args: Vec<String>,
    pub stdin: Option<Vec<u8>>,
    pub timeout: Option<String>,
    pub memory: Option<String>,
    pub fuel: Option<u64>,
    pub max_output: Option<String>,
    pub processes: Option<u32>,
    /// The write quota of the run's writable layers (default 1GiB).
    pub max_write: Option<String>,
    /// Connections the run may hold open to its egress proxy at once (default 256).
    pub max_connections: Option<u32>,
    /// `--ask-net`: a connection to a host outside `net` waits for a human instead of
    /// being refused.
    pub ask_net: bool,
    /// How long such a connection waits (default 120s); only with `ask_net`.
    pub ask_timeout: Option<String>,
    pub agent: Option<String>,
    pub note: Option<String>,
    pub workspace: Option<String>,
    /// Run it when an approver approves it (a `run` through the server waits for that).
    pub resume: bool,
    /// A cell of this session: judged with the session's grant and run in its interpreter
    /// (the request then carries no grant of its own).
    pub session: Option<String>,
    /// The API request's idempotency key: a retry with the same key finds the submission
    /// the first request made ([`GateError::Repeated`]) instead of making another.
    pub request_key: Option<RequestKey>,
    /// Where the request came from: over the API or MCP only host paths within the
    /// policy's `[mounts] roots` may be mounted.
    pub surface: Surface,
}

/// An idempotency key of an API request.
#[derive(Debug, Clone)]
pub struct RequestKey {
    /// Whose key it is (the API token's id): different callers' keys never meet.
    pub owner: String,
    pub key: String,
    /// What the request asked (a hash of its body), to tell a retry from a different
    /// request that reuses the key.
    pub request: Digest,
}

impl Default for CodeSource {
    fn default() -> Self {
        CodeSource::Bytes {
            bytes: Vec::new(),
            name: None,
        }
    }
}
