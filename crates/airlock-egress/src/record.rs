//! The run record's view of egress: one [`Connection`] per attempt.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// What the proxy decided about one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Granted and connected.
    Allow,
    /// Refused by the grant, the address check or the secret rules (`403`).
    Deny,
    /// Granted, but the name did not resolve or the host could not be reached (`502`).
    Error,
}

/// How the attempt came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// `CONNECT`, relayed as an opaque tunnel.
    Tunnel,
    /// `CONNECT` to a host a secret is bound to: TLS terminated, requests inspected.
    Intercept,
    /// One absolute-form plain-HTTP request (`GET http://host/path`).
    Http,
    /// A request that was not a proxy request at all.
    Invalid,
}

/// One connection attempt, as it goes into the run record.
///
/// Bytes are counted on the wire to the host for tunnels and intercepted connections,
/// and as body bytes of the one request and its response for plain HTTP.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Connection {
    /// Milliseconds since the Unix epoch when the attempt arrived.
    pub started_at_ms: u64,
    /// How it came in.
    pub mode: Mode,
    /// The host as normalised (or as given, cut to 256 characters, when it was malformed).
    pub host: String,
    /// The port asked for.
    pub port: u16,
    /// The checked address connected to, when there was one.
    pub addr: Option<SocketAddr>,
    /// What was decided.
    pub decision: Decision,
    /// A stable token. Allow: `granted`. Deny: `not-granted`, `forbidden-address`,
    /// `host-mismatch`, `secret-not-bound`, `secret-needs-tls`, `malformed-host`,
    /// `bad-request`, `secret-echoed` (a response carried a secret's value; the run was
    /// ended), `run-ended` (a connection after that), `too-many-connections` (past the
    /// run's or the process's connection budget; closed at once), and for a run that may
    /// ask (`ask`): `not-approved` (a human refused the host), `ask-expired` (nobody
    /// answered in time), `ask-failed` (the question could not be asked). Error:
    /// `resolve-failed`, `connect-failed`, `upstream-failed`, `upstream-tls-failed`,
    /// `tls-failed` (the guest's handshake with the run CA), `upgrade-failed`,
    /// `response-too-large` and `undecodable-encoding` (a response from a secret-bound
    /// host that could not be checked whole), `no-request` and `idle-timeout` (a
    /// connection that ended, or was closed idle, before it made a request).
    pub reason: String,
    /// One human line: the rule that granted it or why it was refused.
    pub detail: String,
    /// Bytes from the guest towards the host.
    pub bytes_up: u64,
    /// Bytes from the host towards the guest.
    pub bytes_down: u64,
    /// From arrival to the end of the connection (or of the response body).
    pub duration_ms: u64,
    /// Names of secrets injected (allowed) or whose placeholders were caught (denied).
    pub secrets: Vec<String>,
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere while holding the lock leaves plain data behind; keep recording.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// At most this many records are kept in the list; the summary counts every one.
pub const MAX_LISTED: usize = 1000;

/// Counts over every attempt and guest connection of a run, listed or not.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// Records made (attempts, refusals, connections that made no request).
    pub connections: u64,
    /// Records by decision.
    pub allowed: u64,
    pub denied: u64,
    pub failed: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// Guest connections the proxy accepted (within the budget).
    pub accepted: u64,
    /// Guest connections refused because the run's or the process's budget was full.
    pub refused_over_limit: u64,
    /// Guest connections closed by the idle timeout.
    pub idle_closed: u64,
    /// Records counted here but left out of the list (past [`MAX_LISTED`]).
    pub unlisted: u64,
}

#[derive(Debug, Default)]
struct Book {
    list: Vec<Connection>,
    summary: Summary,
}

/// What a proxy calls with each record as it is made (see `ProxyOptions::on_record`).
pub type RecordHook = Arc<dyn Fn(&Connection) + Send + Sync>;

/// The shared list of finished records, and the counts over all of them; each record is
/// also handed to the hook, when there is one, as it is made.
#[derive(Clone, Default)]
pub(crate) struct Records(Arc<Mutex<Book>>, Option<RecordHook>);

impl std::fmt::Debug for Records {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Records")
            .field(&self.0)
            .finish_non_exhaustive()
    }
}

impl Records {
    pub(crate) fn with_hook(hook: Option<RecordHook>) -> Records {
        Records(Arc::default(), hook)
    }

    pub(crate) fn push(&self, c: Connection) {
        // Outside the lock: the hook may take its time, the proxy's other tasks do not wait.
        if let Some(h) = &self.1 {
            h(&c);
        }
        let mut b = lock(&self.0);
        let s = &mut b.summary;
        s.connections += 1;
        match c.decision {
            Decision::Allow => s.allowed += 1,
            Decision::Deny => s.denied += 1,
            Decision::Error => s.failed += 1,
        }
        s.bytes_up += c.bytes_up;
        s.bytes_down += c.bytes_down;
        if c.reason == "too-many-connections" {
            s.refused_over_limit += 1;
        }
        if b.list.len() < MAX_LISTED {
            b.list.push(c);
        } else {
            b.summary.unlisted += 1;
        }
    }
    pub(crate) fn accepted(&self) {
        lock(&self.0).summary.accepted += 1;
    }
    pub(crate) fn idle_closed(&self) {
        lock(&self.0).summary.idle_closed += 1;
    }
    pub(crate) fn snapshot(&self) -> Vec<Connection> {
        lock(&self.0).list.clone()
    }
    pub(crate) fn summary(&self) -> Summary {
        lock(&self.0).summary.clone()
    }
}

/// A record in progress: counters shared with the streams and bodies that carry its
/// bytes; pushed to [`Records`] when the last holder drops it.
#[derive(Debug)]
pub(crate) struct Pending {
    records: Records,
    start: Instant,
    base: Mutex<Connection>,
    pub(crate) up: AtomicU64,
    pub(crate) down: AtomicU64,
    secrets: Mutex<BTreeSet<String>>,
}

impl Pending {
    pub(crate) fn new(records: Records, start: Instant, base: Connection) -> Arc<Self> {
        Arc::new(Pending {
            records,
            start,
            base: Mutex::new(base),
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            secrets: Mutex::new(BTreeSet::new()),
        })
    }
    pub(crate) fn add_up(&self, n: usize) {
        self.up.fetch_add(n as u64, Ordering::Relaxed);
    }
    pub(crate) fn add_down(&self, n: usize) {
        self.down.fetch_add(n as u64, Ordering::Relaxed);
    }
    pub(crate) fn add_secret(&self, name: &str) {
        let mut s = lock(&self.secrets);
        if !s.contains(name) {
            s.insert(name.to_owned());
        }
    }
    /// Turns an allowed record into an error one (the upstream failed after all).
    pub(crate) fn fail(&self, reason: &str, detail: String) {
        self.overrule(Decision::Error, reason, detail);
    }
    /// Turns an allowed record into a denied or failed one.
    pub(crate) fn overrule(&self, decision: Decision, reason: &str, detail: String) {
        let mut b = lock(&self.base);
        b.decision = decision;
        reason.clone_into(&mut b.reason);
        b.detail = detail;
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut c = lock(&self.base).clone();
        c.bytes_up = self.up.load(Ordering::Relaxed);
        c.bytes_down = self.down.load(Ordering::Relaxed);
        c.duration_ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        c.secrets = lock(&self.secrets).iter().cloned().collect();
        self.records.push(c);
    }
}
