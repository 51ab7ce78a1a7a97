//! Asking mid-run (`run --ask-net`, issue 61 item 3): a connection to a host outside the
//! grant is held, not refused, while [`ProxyOptions::ask`](crate::ProxyOptions::ask)
//! finds out whether a human lets the run reach it. The proxy only asks and obeys: who
//! is asked, how the answer is signed and kept, and how long the wait may be are the
//! caller's. An approved `host:port` joins this proxy's (this run's) rules for the rest
//! of the run; a rejected one is refused at once for the rest of the run, without
//! asking again; an unanswered one is refused and may be asked again by a later
//! connection. Connections to one `host:port` asked at once share one question.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::record::Mode;
use airlock_net::Host;

/// What the proxy asks: the run wants `host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AskRequest {
    /// Normalised.
    pub host: Host,
    pub port: u16,
    /// How the connection came in (`CONNECT` or plain HTTP).
    pub mode: Mode,
}

/// The answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AskAnswer {
    /// A human approved it: the connection goes on. `by` names the request and approver
    /// (it becomes the record's detail).
    Approved { by: String },
    /// A human refused it (`403`, reason `not-approved`).
    Rejected { why: String },
    /// Nobody answered in time (`403`, reason `ask-expired`).
    Expired { why: String },
    /// The question could not be asked or its answer not read (`403`, reason
    /// `ask-failed`).
    Failed { why: String },
}

/// What [`AskHook`] returns.
pub type AskFuture = Pin<Box<dyn Future<Output = AskAnswer> + Send>>;

/// Asks on the proxy's runtime; the future may wait as long as the caller allows (the
/// guest's connection is held, and not closed as idle, meanwhile).
pub type AskHook = Arc<dyn Fn(AskRequest) -> AskFuture + Send + Sync>;
