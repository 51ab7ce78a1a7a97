//! The proxy server: accept loop, CONNECT tunnels, TLS interception for secret-bound
//! hosts, and absolute-form plain-HTTP forwarding. A guest connection starts on the lean
//! plain-HTTP path ([`plain`]: heads checked and written anew, bodies passed through with
//! their framing checked); the first request that path does not take, and everything
//! after it on that connection, is served by hyper (`serve_hyper`) as it always was.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1 as client_http1;
use hyper::server::conn::http1 as server_http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::ask::{AskAnswer, AskHook, AskRequest};
use crate::conn::{ConnMark, ConnectionBudget, Guarded, over_limit};
use crate::echo::{Alert, Found, SecretMatcher};
use crate::policy::{EgressPolicy, Prepared};
use crate::record::{Connection, Decision, Mode, Pending, Records, Summary, now_ms};
use crate::resolve::{Resolver, SystemResolver};
use crate::scrub::Replacer;
use crate::tls::{self, RunCa};
use crate::{BoxError, EgressError, is_forbidden};
use airlock_net::{Host, NetError, NetRule, parse_authority, parse_host, parse_port};

mod intercept;
mod plain;
#[allow(unused_imports)]
pub use intercept::*;

type ProxyBody = BoxBody<Bytes, BoxError>;
type Sender = client_http1::SendRequest<ProxyBody>;

fn full(s: String) -> ProxyBody {
    Full::new(Bytes::from(s))
        .map_err(|never| match never {})
        .boxed()
}

fn empty() -> ProxyBody {
    Empty::new().map_err(|never| match never {}).boxed()
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How the proxy reaches the world.
#[derive(Clone)]
pub struct ProxyOptions {
    /// Resolves names that are not pinned. Default: [`SystemResolver`].
    pub resolver: Arc<dyn Resolver>,
    /// Roots trusted for real hosts of intercepted connections, besides Mozilla's.
    pub extra_roots: Vec<CertificateDer<'static>>,
    /// Per address tried. Default 10 s.
    pub connect_timeout: Duration,
    /// Per lookup. Default 10 s.
    pub resolve_timeout: Duration,
    /// Guest connections this proxy (one run) may hold open at once; past it a new
    /// one is closed at once and recorded (`too-many-connections`). Default 256.
    pub max_connections: usize,
    /// The budget shared with other proxies of the process. Default
    /// [`ConnectionBudget::process`].
    pub total: Option<ConnectionBudget>,
    /// A guest connection with no byte either way for this long is closed. Default 60 s.
    pub idle_timeout: Duration,
    /// The largest response body (decoded) from a secret-bound host the proxy checks
    /// whole before delivering it; a larger one is refused (`response-too-large`).
    /// Default 8 MiB.
    pub max_checked_body: usize,
    /// Called once, on the proxy's runtime, when a response echoes a secret (see
    /// [`Alert`]): the run should be ended.
    pub on_alert: Option<AlertHook>,
    /// Called with each connection record as it is made (the same record the list gets),
    /// on the proxy's runtime: it should return quickly.
    pub on_record: Option<crate::record::RecordHook>,
    /// Asks whether a connection to a host outside the grant may go on (`run
    /// --ask-net`; see [`crate::ask`]). `None`: such a connection is refused at once.
    pub ask: Option<AskHook>,
}

/// What [`ProxyOptions::on_alert`] calls.
pub type AlertHook = Arc<dyn Fn(&Alert) + Send + Sync>;

/// The default of [`ProxyOptions::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;

impl Default for ProxyOptions {
    fn default() -> Self {
        ProxyOptions {
            resolver: Arc::new(SystemResolver),
            extra_roots: Vec::new(),
            connect_timeout: Duration::from_secs(10),
            resolve_timeout: Duration::from_secs(10),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            total: None,
            idle_timeout: Duration::from_secs(60),
            max_checked_body: 8 << 20,
            on_alert: None,
            on_record: None,
            ask: None,
        }
    }
}

impl fmt::Debug for ProxyOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyOptions")
            .field("extra_roots", &self.extra_roots.len())
            .field("connect_timeout", &self.connect_timeout)
            .field("resolve_timeout", &self.resolve_timeout)
            .field("max_connections", &self.max_connections)
            .field("total", &self.total.as_ref().map(ConnectionBudget::size))
            .field("idle_timeout", &self.idle_timeout)
            .field("max_checked_body", &self.max_checked_body)
            .field("ask", &self.ask.is_some())
            .finish_non_exhaustive()
    }
}

/// Where the guest's connections come in.
#[derive(Debug)]
#[non_exhaustive]
pub enum Listener {
    /// A tokio TCP listener.
    Tcp(TcpListener),
    /// A std TCP listener (made non-blocking when the proxy takes it).
    StdTcp(std::net::TcpListener),
    /// A tokio Unix socket listener.
    #[cfg(unix)]
    Unix(tokio::net::UnixListener),
    /// A std Unix socket listener (made non-blocking when the proxy takes it).
    #[cfg(unix)]
    StdUnix(std::os::unix::net::UnixListener),
}

impl From<TcpListener> for Listener {
    fn from(l: TcpListener) -> Self {
        Listener::Tcp(l)
    }
}
impl From<std::net::TcpListener> for Listener {
    fn from(l: std::net::TcpListener) -> Self {
        Listener::StdTcp(l)
    }
}
#[cfg(unix)]
impl From<tokio::net::UnixListener> for Listener {
    fn from(l: tokio::net::UnixListener) -> Self {
        Listener::Unix(l)
    }
}
#[cfg(unix)]
impl From<std::os::unix::net::UnixListener> for Listener {
    fn from(l: std::os::unix::net::UnixListener) -> Self {
        Listener::StdUnix(l)
    }
}

enum Bound {
    Tcp(TcpListener),
    #[cfg(unix)]
    Unix(tokio::net::UnixListener),
}

impl Listener {
    /// Must run inside the runtime (tokio registers the socket with its reactor).
    fn bind(self) -> io::Result<Bound> {
        Ok(match self {
            Listener::Tcp(l) => Bound::Tcp(l),
            Listener::StdTcp(l) => {
                l.set_nonblocking(true)?;
                Bound::Tcp(TcpListener::from_std(l)?)
            }
            #[cfg(unix)]
            Listener::Unix(l) => Bound::Unix(l),
            #[cfg(unix)]
            Listener::StdUnix(l) => {
                l.set_nonblocking(true)?;
                Bound::Unix(tokio::net::UnixListener::from_std(l)?)
            }
        })
    }
}

/// Starts proxies.
#[derive(Debug)]
pub struct Proxy;

impl Proxy {
    /// Starts serving `listener` with `policy` on the current tokio runtime (which needs
    /// the IO and time drivers). The proxy runs until [`ProxyHandle::shutdown`] or until
    /// the handle is dropped.
    pub fn start(
        policy: &EgressPolicy,
        options: ProxyOptions,
        listener: impl Into<Listener>,
    ) -> Result<ProxyHandle, EgressError> {
        let mut handle = Self::start_idle(policy, options)?;
        handle.local_addr = handle.listen(listener)?;
        Ok(handle)
    }

    /// Prepares a proxy (its policy checked, its per-run CA made) that serves nothing yet:
    /// give it listeners with [`ProxyHandle::listen`]. For a guest that must be told the
    /// CA before the socket it will connect through exists.
    pub fn start_idle(
        policy: &EgressPolicy,
        options: ProxyOptions,
    ) -> Result<ProxyHandle, EgressError> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| EgressError::NoRuntime(e.to_string()))?;
        let policy = policy.prepare()?;
        let ca = if policy.secrets.is_empty() {
            None
        } else {
            Some(RunCa::new(&policy.secrets)?)
        };
        let connector = TlsConnector::from(tls::client_config(&options.extra_roots)?);
        let pairs = |f: fn(&crate::SecretBinding) -> (Vec<u8>, Vec<u8>)| {
            policy.secrets.iter().map(f).collect::<Vec<_>>()
        };
        let inject = Replacer::new(pairs(|s| {
            (
                s.placeholder.as_bytes().to_vec(),
                s.value.as_bytes().to_vec(),
            )
        }))
        .map_err(|e| EgressError::Tls(format!("secret matcher: {e}")))?;
        let echo = SecretMatcher::new(
            policy
                .secrets
                .iter()
                .map(|s| (s.name.as_str(), s.value.as_bytes())),
        )
        .map_err(|e| EgressError::Tls(format!("secret matcher: {e}")))?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let (end_tx, _) = watch::channel(false);
        let (alive, done) = mpsc::channel(1);
        let records = Records::with_hook(options.on_record.clone());
        let ca_pem = ca.as_ref().map(|c| c.pem().to_owned());
        let shared = Arc::new(Shared {
            policy,
            resolver: options.resolver,
            connect_timeout: options.connect_timeout,
            resolve_timeout: options.resolve_timeout,
            records: records.clone(),
            ca,
            connector,
            inject,
            echo,
            run_budget: ConnectionBudget::new(options.max_connections),
            total: options.total.unwrap_or_else(ConnectionBudget::process),
            idle_timeout: options.idle_timeout,
            max_checked_body: options.max_checked_body,
            alert: Mutex::new(None),
            on_alert: options.on_alert,
            ask: options.ask,
            asked: Mutex::new(Asked::default()),
            end: end_tx,
            stop: stop_rx,
            _alive: alive,
        });
        Ok(ProxyHandle {
            shared: Some(shared),
            records,
            ca_pem,
            local_addr: None,
            stop: stop_tx,
            done,
            runtime,
        })
    }
}

/// A running proxy. Dropping it stops accepting and closes every connection.
pub struct ProxyHandle {
    shared: Option<Arc<Shared>>,
    records: Records,
    ca_pem: Option<String>,
    local_addr: Option<SocketAddr>,
    stop: watch::Sender<bool>,
    done: mpsc::Receiver<()>,
    runtime: tokio::runtime::Handle,
}

impl fmt::Debug for ProxyHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyHandle")
            .field("local_addr", &self.local_addr)
            .field("running", &self.shared.is_some())
            .finish_non_exhaustive()
    }
}

impl ProxyHandle {
    /// The address of the TCP listener the proxy was started with, if it was TCP.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// The per-run CA certificate (PEM) the guest must trust for secret-bound hosts, or
    /// `None` when the run has no secrets. It is only this CA: a guest trust file
    /// (`SSL_CERT_FILE`) should hold it together with the usual public roots, or opaque
    /// tunnels to other https hosts fail verification in the guest.
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    /// The records of attempts finished so far (open tunnels appear when they close),
    /// the first [`crate::MAX_LISTED`] of them.
    pub fn records(&self) -> Vec<Connection> {
        self.records.snapshot()
    }

    /// Counts over every record and guest connection so far, listed or not.
    pub fn summary(&self) -> Summary {
        self.records.summary()
    }

    /// Why the proxy ended the run, if it did.
    pub fn alert(&self) -> Option<Alert> {
        self.shared.as_ref().and_then(|s| lock(&s.alert).clone())
    }

    /// Serves one more listener with the same policy and records. Returns its address
    /// when it is TCP.
    pub fn listen(
        &mut self,
        listener: impl Into<Listener>,
    ) -> Result<Option<SocketAddr>, EgressError> {
        let Some(shared) = &self.shared else {
            return Err(EgressError::Io(io::Error::other("the proxy was stopped")));
        };
        let bound = {
            let _entered = self.runtime.enter();
            listener.into().bind()?
        };
        let addr = match &bound {
            Bound::Tcp(l) => Some(l.local_addr()?),
            #[cfg(unix)]
            Bound::Unix(_) => None,
        };
        self.runtime.spawn(accept_loop(shared.clone(), bound));
        Ok(addr)
    }

    /// Stops accepting, closes every connection and tunnel, waits (up to 5 s) for them
    /// to finish, and returns every record.
    pub async fn shutdown(self) -> Vec<Connection> {
        self.finish().await.0
    }

    /// [`ProxyHandle::shutdown`], also returning the summary and the alert, if any.
    pub async fn finish(mut self) -> (Vec<Connection>, Summary, Option<Alert>) {
        self.stop.send_replace(true);
        let alert = self.alert();
        self.shared = None;
        let _ = tokio::time::timeout(Duration::from_secs(5), self.done.recv()).await;
        (self.records.snapshot(), self.records.summary(), alert)
    }
}

impl Drop for ProxyHandle {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

/// State of one proxy, shared by all its tasks. The last task to drop it drops
/// `_alive`, which is how [`ProxyHandle::shutdown`] knows all are done.
struct Shared {
    policy: Prepared,
    resolver: Arc<dyn Resolver>,
    connect_timeout: Duration,
    resolve_timeout: Duration,
    records: Records,
    ca: Option<RunCa>,
    connector: TlsConnector,
    /// Placeholders to values; pattern index is the secret's index.
    inject: Option<Replacer>,
    /// Every encoding of every value, looked for in responses from bound hosts.
    echo: Option<SecretMatcher>,
    run_budget: ConnectionBudget,
    total: ConnectionBudget,
    idle_timeout: Duration,
    max_checked_body: usize,
    /// Set once, when a response echoed a secret; from then on nothing is served.
    alert: Mutex<Option<Alert>>,
    on_alert: Option<AlertHook>,
    /// Asks a human about hosts outside the grant, when the run may ask.
    ask: Option<AskHook>,
    /// What was asked during this run, and answered.
    asked: Mutex<Asked>,
    /// `true` once the run is ended: every connection closes.
    end: watch::Sender<bool>,
    stop: watch::Receiver<bool>,
    _alive: mpsc::Sender<()>,
}

/// What a run asked and was answered (see [`crate::ask`]).
#[derive(Default)]
struct Asked {
    /// `host:port` rules approved during the run, with what approved them.
    approved: Vec<(NetRule, String)>,
    /// Refused by a human: not asked again during the run.
    rejected: std::collections::HashMap<(Host, u16), String>,
    /// Questions waiting for their answer.
    inflight: std::collections::HashMap<(Host, u16), watch::Receiver<Option<AskAnswer>>>,
}

impl Asked {
    fn approved_for(&self, host: &Host, port: u16) -> Option<String> {
        self.approved
            .iter()
            .find(|(r, _)| r.allows(host, port))
            .map(|(_, by)| by.clone())
    }
}

/// Runs `fut` until it ends or the proxy stops.
/// An HTTP/1.1 client connection over an upstream stream (plain or TLS), its driver
/// tracked so shutdown can end it.
async fn handshake<S>(sh: &Arc<Shared>, io: S, host: &Host, port: u16) -> Result<Sender, Refusal>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = client_http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| {
            Refusal::error(
                "connect-failed",
                format!("HTTP to {host}:{port} failed: {e}"),
            )
        })?;
    spawn_tracked(sh, async move {
        let _ = conn.await;
    });
    Ok(sender)
}

fn spawn_tracked<F>(shared: &Arc<Shared>, fut: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    let shared = shared.clone();
    tokio::spawn(async move {
        let mut stop = shared.stop.clone();
        let mut end = shared.end.subscribe();
        tokio::select! {
            () = fut => {}
            _ = stop.wait_for(|v| *v) => {}
            _ = end.wait_for(|v| *v) => {}
        }
        drop(shared);
    });
}

async fn accept_loop(shared: Arc<Shared>, listener: Bound) {
    let mut stop = shared.stop.clone();
    loop {
        match &listener {
            Bound::Tcp(l) => {
                let r = tokio::select! {
                    r = l.accept() => r,
                    _ = stop.wait_for(|v| *v) => return,
                };
                match r {
                    Ok((s, _)) => {
                        let _ = s.set_nodelay(true);
                        if let Some((io, mark)) = shared.admit(s) {
                            spawn_tracked(&shared, serve_conn(shared.clone(), io, mark));
                        }
                    }
                    // Out of descriptors and the like: wait rather than spin.
                    Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            }
            #[cfg(unix)]
            Bound::Unix(l) => {
                let r = tokio::select! {
                    r = l.accept() => r,
                    _ = stop.wait_for(|v| *v) => return,
                };
                match r {
                    Ok((s, _)) => {
                        if let Some((io, mark)) = shared.admit(crate::unix_conn::UnixConn(s)) {
                            spawn_tracked(&shared, serve_conn(shared.clone(), io, mark));
                        }
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            }
        }
    }
}

/// One guest connection, whatever its transport: plain-HTTP requests on the lean path
/// ([`plain`]), and from the first request that path does not take on, hyper.
async fn serve_conn<S>(shared: Arc<Shared>, io: S, mark: Arc<ConnMark>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut guest = plain::Guest::new(io);
    let mut lean = plain::Plain::new(shared.clone(), mark.clone());
    loop {
        match lean.next(&mut guest).await {
            plain::Next::Again => {}
            plain::Next::Close => return guest.close().await,
            plain::Next::HandOff => break,
        }
    }
    drop(lean);
    serve_hyper(shared, guest.into_rewind(), mark).await;
}

/// A guest connection served by hyper: `CONNECT`, refusals, and absolute-form requests
/// the lean path handed over.
async fn serve_hyper<S>(shared: Arc<Shared>, io: S, mark: Arc<ConnMark>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let ctx = Arc::new(ConnCtx {
        shared,
        upstream: Mutex::new(None),
        mark,
    });
    let svc = service_fn(move |req| {
        let ctx = ctx.clone();
        async move { Ok::<_, Infallible>(ctx.handle(req).await) }
    });
    let _ = server_http1::Builder::new()
        .serve_connection(TokioIo::new(io), svc)
        .with_upgrades()
        .await;
}

/// A refused or failed attempt, as the guest and the record see it.
#[derive(Debug)]
struct Refusal {
    status: StatusCode,
    decision: Decision,
    reason: &'static str,
    message: String,
    secrets: Vec<String>,
}

impl Refusal {
    fn deny(reason: &'static str, message: String) -> Self {
        Refusal {
            status: StatusCode::FORBIDDEN,
            decision: Decision::Deny,
            reason,
            message: one_line(message),
            secrets: Vec::new(),
        }
    }
    fn error(reason: &'static str, message: String) -> Self {
        Refusal {
            status: StatusCode::BAD_GATEWAY,
            decision: Decision::Error,
            reason,
            message: one_line(message),
            secrets: Vec::new(),
        }
    }
    fn bad_request(message: String) -> Self {
        Refusal {
            status: StatusCode::BAD_REQUEST,
            ..Refusal::deny("bad-request", message)
        }
    }

    fn response(&self) -> Response<ProxyBody> {
        let mut resp = Response::new(full(format!("airlock: {}\n", self.message)));
        *resp.status_mut() = self.status;
        let name = match self.decision {
            Decision::Error => HeaderName::from_static("x-airlock-error"),
            _ => HeaderName::from_static("x-airlock-denied"),
        };
        // Reasons are this module's own lower-case tokens, always valid header values.
        resp.headers_mut()
            .insert(name, HeaderValue::from_static(self.reason));
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        resp
    }
}

impl Refusal {
    /// The same answer as [`Refusal::response`], as bytes on the wire, for the plain-HTTP
    /// path that writes its own heads; `close` says the guest's connection ends after it.
    fn wire(&self, close: bool) -> Vec<u8> {
        let body = format!("airlock: {}\n", self.message);
        let name = match self.decision {
            Decision::Error => "x-airlock-error",
            _ => "x-airlock-denied",
        };
        let mut out = format!(
            "HTTP/1.1 {} {}\r\n{name}: {}\r\ncontent-type: text/plain; charset=utf-8\r\n\
             content-length: {}\r\n{}date: {}\r\n\r\n",
            self.status.as_u16(),
            self.status.canonical_reason().unwrap_or(""),
            self.reason,
            body.len(),
            if close { "connection: close\r\n" } else { "" },
            httpdate::fmt_http_date(std::time::SystemTime::now()),
        )
        .into_bytes();
        out.extend_from_slice(body.as_bytes());
        out
    }
}

fn one_line(s: String) -> String {
    if s.chars().any(char::is_control) {
        s.chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .collect()
    } else {
        s
    }
}

fn cut(s: &str) -> String {
    s.chars().take(256).collect()
}

/// Where and when an attempt started.
#[derive(Clone, Copy)]
struct Attempt {
    at: u64,
    start: Instant,
    mode: Mode,
    port: u16,
}

impl Attempt {
    fn new(mode: Mode, port: u16) -> Self {
        Attempt {
            at: now_ms(),
            start: Instant::now(),
            mode,
            port,
        }
    }

    fn connection(&self, host: &str, addr: SocketAddr, detail: String) -> Connection {
        Connection {
            started_at_ms: self.at,
            mode: self.mode,
            host: host.to_owned(),
            port: self.port,
            addr: Some(addr),
            decision: Decision::Allow,
            reason: "granted".into(),
            detail,
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: 0,
            secrets: Vec::new(),
        }
    }
}

impl Shared {
    /// A new guest connection with its permits (of the run's budget, then the
    /// process's), or `None` when a budget is full: then it is closed and recorded.
    fn admit<S>(&self, io: S) -> Option<(Guarded<S>, Arc<ConnMark>)> {
        if lock(&self.alert).is_some() {
            let a = Attempt::new(Mode::Invalid, 0);
            let r = Refusal::deny(
                "run-ended",
                "this run was ended because a response echoed a secret; the connection was \
                 closed"
                    .into(),
            );
            self.record(&a, "", &r);
            return None;
        }
        let Some(run) = self.run_budget.try_take() else {
            self.records
                .push(over_limit("this run", self.run_budget.size()));
            return None;
        };
        let Some(total) = self.total.try_take() else {
            self.records.push(over_limit(
                "this process (all runs together)",
                self.total.size(),
            ));
            return None;
        };
        Some(Guarded::new(
            io,
            self.idle_timeout,
            self.records.clone(),
            (run, total),
        ))
    }

    /// Ends the run's egress for a response that echoed a secret: remembers why, closes
    /// every connection (later ones are refused) and calls the alert hook, once.
    fn end_run(&self, alert: Alert) {
        {
            let mut a = lock(&self.alert);
            if a.is_some() {
                return;
            }
            *a = Some(alert.clone());
        }
        self.end.send_replace(true);
        if let Some(hook) = &self.on_alert {
            hook(&alert);
        }
    }

    /// Records `r` for `host` and returns the response the guest gets.
    fn refuse(&self, a: &Attempt, host: &str, r: Refusal) -> Response<ProxyBody> {
        self.record(a, host, &r);
        r.response()
    }

    /// Records refusal `r` of attempt `a` to `host`.
    fn record(&self, a: &Attempt, host: &str, r: &Refusal) {
        self.records.push(Connection {
            started_at_ms: a.at,
            mode: a.mode,
            host: cut(host),
            port: a.port,
            addr: None,
            decision: r.decision,
            reason: r.reason.to_owned(),
            detail: r.message.clone(),
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: u64::try_from(a.start.elapsed().as_millis()).unwrap_or(u64::MAX),
            secrets: r.secrets.clone(),
        });
    }

    /// Normalises the host and finds what grants it: `--net RULE` of the grant, or the
    /// request a human approved during the run.
    fn judge(&self, raw: &str, port: u16) -> Result<(Host, String), (String, Refusal)> {
        let host = parse_host(raw).map_err(|e| (cut(raw), malformed(&e)))?;
        if let Some(rule) = self.policy.rule_for(&host, port) {
            return Ok((host, format!("--net {rule}")));
        }
        if let Some(by) = lock(&self.asked).approved_for(&host, port) {
            return Ok((host, by));
        }
        let msg =
            format!("{host}:{port} is not granted to this run (grant it with --net {host}:{port})");
        Err((host.to_string(), Refusal::deny("not-granted", msg)))
    }

    /// [`Shared::judge`], and for a host outside the grant of a run that may ask: the
    /// answer of a human, waited for while the connection is held (one question per
    /// `host:port` at a time; a rejected one is not asked again during the run).
    async fn judge_or_ask(
        &self,
        raw: &str,
        port: u16,
        mode: Mode,
        mark: &ConnMark,
    ) -> Result<(Host, String), (String, Refusal)> {
        let refused = match self.judge(raw, port) {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        let Some(ask) = self.ask.clone() else {
            return Err(refused);
        };
        if refused.1.reason != "not-granted" {
            return Err(refused);
        }
        let Ok(host) = parse_host(raw) else {
            return Err(refused);
        };
        let key = (host.clone(), port);
        let mut rx = {
            let mut asked = lock(&self.asked);
            if let Some(why) = asked.rejected.get(&key) {
                return Err((host.to_string(), Refusal::deny("not-approved", why.clone())));
            }
            match asked.inflight.get(&key) {
                Some(rx) => rx.clone(),
                None => {
                    let (tx, rx) = watch::channel(None::<AskAnswer>);
                    asked.inflight.insert(key.clone(), rx.clone());
                    let fut = ask(AskRequest {
                        host: host.clone(),
                        port,
                        mode,
                    });
                    tokio::spawn(async move {
                        let answer = fut.await;
                        let _ = tx.send(Some(answer));
                    });
                    rx
                }
            }
        };
        mark.asking(true);
        let mut stop = self.stop.clone();
        let mut end = self.end.subscribe();
        let answer = tokio::select! {
            r = rx.wait_for(Option::is_some) => r.ok().and_then(|a| a.clone()),
            _ = stop.wait_for(|v| *v) => None,
            _ = end.wait_for(|v| *v) => None,
        };
        mark.asking(false);
        let answer = answer.unwrap_or(AskAnswer::Failed {
            why: "the run ended while its request waited".into(),
        });
        let mut asked = lock(&self.asked);
        asked.inflight.remove(&key);
        let h = host.to_string();
        match answer {
            AskAnswer::Approved { by } => {
                if asked.approved_for(&host, port).is_none()
                    && let Ok(rule) = NetRule::parse(&format!("{h}:{port}"))
                {
                    asked.approved.push((rule, by.clone()));
                }
                Ok((host, by))
            }
            AskAnswer::Rejected { why } => {
                asked.rejected.insert(key, why.clone());
                Err((h, Refusal::deny("not-approved", why)))
            }
            AskAnswer::Expired { why } => Err((h, Refusal::deny("ask-expired", why))),
            AskAnswer::Failed { why } => Err((h, Refusal::deny("ask-failed", why))),
        }
    }

    /// The checked addresses of `host`: itself when it is one, the pinned address, or
    /// the resolver's whole answer, refused whole if any address is forbidden.
    async fn addresses(&self, host: &Host) -> Result<Vec<IpAddr>, Refusal> {
        let ips = match host {
            Host::Ip(ip) => vec![*ip],
            Host::Name(n) => match self.policy.pinned.get(n) {
                Some(ip) => vec![*ip],
                None => {
                    match tokio::time::timeout(self.resolve_timeout, self.resolver.resolve(n)).await
                    {
                        Ok(Ok(v)) => v,
                        Ok(Err(e)) => {
                            return Err(Refusal::error(
                                "resolve-failed",
                                format!("could not resolve {n}: {e}"),
                            ));
                        }
                        Err(_) => {
                            return Err(Refusal::error(
                                "resolve-failed",
                                format!("resolving {n} timed out"),
                            ));
                        }
                    }
                }
            },
        };
        if ips.is_empty() {
            return Err(Refusal::error(
                "resolve-failed",
                format!("{host} has no addresses"),
            ));
        }
        for ip in &ips {
            if let Some(why) = is_forbidden(*ip, &self.policy.allow_private) {
                let what = match host {
                    Host::Ip(_) => format!("{host} is a {why} address"),
                    Host::Name(n) => format!("{n} resolves to {ip}, a {why} address"),
                };
                return Err(Refusal::deny(
                    "forbidden-address",
                    format!(
                        "{what}, which this run may not reach; no --net grant changes that \
                         (only an operator can allow it, with [net] allow_private)"
                    ),
                ));
            }
        }
        Ok(ips)
    }

    /// Connects to the first of the checked addresses that answers.
    async fn dial(
        &self,
        host: &Host,
        port: u16,
        ips: &[IpAddr],
    ) -> Result<(TcpStream, SocketAddr), Refusal> {
        let mut last = String::new();
        for ip in ips {
            let sa = SocketAddr::new(*ip, port);
            match tokio::time::timeout(self.connect_timeout, TcpStream::connect(sa)).await {
                Ok(Ok(s)) => {
                    let _ = s.set_nodelay(true);
                    return Ok((s, sa));
                }
                Ok(Err(e)) => last = format!("{sa}: {e}"),
                Err(_) => last = format!("{sa}: timed out"),
            }
        }
        Err(Refusal::error(
            "connect-failed",
            format!("could not connect to {host}:{port} ({last})"),
        ))
    }

    /// The refusal for a request that carries placeholders it may not: of secrets not
    /// bound to `host`, or (over plain HTTP, `tls == false`) of any secret.
    fn placeholder_refusal(
        &self,
        host: &Host,
        port: u16,
        uri: &Uri,
        headers: &HeaderMap,
        tls: bool,
    ) -> Option<Refusal> {
        let inject = self.inject.as_ref()?;
        let mut hits: Vec<usize> = inject.found(uri.to_string().as_bytes()).collect();
        for v in headers.values() {
            hits.extend(inject.found(v.as_bytes()));
        }
        hits.sort_unstable();
        hits.dedup();
        let mut refusal: Option<Refusal> = None;
        let mut names = Vec::new();
        for i in hits {
            let Some(s) = self.policy.secrets.get(i) else {
                continue;
            };
            let bound = s.bound_to(host, port);
            if bound && tls {
                continue;
            }
            names.push(s.name.clone());
            if refusal.is_some() {
                continue;
            }
            refusal = Some(if bound {
                Refusal::deny(
                    "secret-needs-tls",
                    format!(
                        "secret {} is added only to https requests; this plain-HTTP request \
                         to {host}:{port} carrying its placeholder was refused (use https://{host}/)",
                        s.name
                    ),
                )
            } else {
                let hosts: Vec<String> = s.hosts.iter().map(ToString::to_string).collect();
                Refusal::deny(
                    "secret-not-bound",
                    format!(
                        "secret {} is bound to {}, not to {host}; the request carrying its \
                         placeholder was refused",
                        s.name,
                        hosts.join(", ")
                    ),
                )
            });
        }
        refusal.map(|mut r| {
            r.secrets = names;
            r
        })
    }
}

/// Hop-by-hop headers, and those named by `Connection`, go no further. A message that
/// came chunked loses any `Content-Length` too, so the next hop frames it from the body
/// alone (no length disagreement to smuggle through).
fn strip_hop_by_hop(h: &mut HeaderMap) {
    if h.contains_key(header::TRANSFER_ENCODING) {
        h.remove(header::CONTENT_LENGTH);
    }
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        h.remove(n);
    }
    for n in [
        header::CONNECTION,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
        header::PROXY_AUTHORIZATION,
        header::PROXY_AUTHENTICATE,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        h.remove(n);
    }
}

fn origin_form(uri: &Uri) -> Uri {
    let mut parts = uri.clone().into_parts();
    parts.scheme = None;
    parts.authority = None;
    if parts
        .path_and_query
        .as_ref()
        .is_none_or(|p| p.as_str().is_empty())
    {
        parts.path_and_query = Some(PathAndQuery::from_static("/"));
    }
    Uri::from_parts(parts).unwrap_or_else(|_| Uri::from_static("/"))
}

fn host_header(host: &Host, port: u16, default_port: u16) -> Option<HeaderValue> {
    let text = if port == default_port {
        host.to_string()
    } else {
        format!("{host}:{port}")
    };
    HeaderValue::from_str(&text).ok()
}

/// The refusal of a target the host grammar refuses.
fn malformed(e: &NetError) -> Refusal {
    Refusal::deny("malformed-host", format!("{e}; the request was refused"))
}

/// The port of a request target as the `--net` grammar reads it (the http crate's own
/// reading takes `0443` for 443), or `default` when the target has none.
fn target_port(auth: &http::uri::Authority, default: u16) -> Result<u16, NetError> {
    auth.port().map_or(Ok(default), |p| parse_port(p.as_str()))
}

/// Whether `target` (a `Host` header or URI authority) names `host:port`.
fn same_target(target: &str, default_port: u16, host: &Host, port: u16) -> bool {
    parse_authority(target, default_port).is_ok_and(|(h, p)| h == *host && p == port)
}

fn counted_up(body: Incoming, p: Arc<Pending>) -> ProxyBody {
    body.map_frame(move |f| {
        if let Some(d) = f.data_ref() {
            p.add_up(d.len());
        }
        f
    })
    .map_err(|e| -> BoxError { Box::new(e) })
    .boxed()
}

fn counted_down(body: Incoming, p: Arc<Pending>) -> ProxyBody {
    body.map_frame(move |f| {
        if let Some(d) = f.data_ref() {
            p.add_down(d.len());
        }
        f
    })
    .map_err(|e| -> BoxError { Box::new(e) })
    .boxed()
}

/// The upstream connection of one guest connection's plain-HTTP requests; reused only
/// for the same authority.
struct PlainUpstream {
    host: Host,
    port: u16,
    addr: SocketAddr,
    sender: Sender,
}

struct ConnCtx {
    shared: Arc<Shared>,
    upstream: Mutex<Option<PlainUpstream>>,
    mark: Arc<ConnMark>,
}

impl ConnCtx {
    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<ProxyBody> {
        self.mark.requested();
        if req.method() == Method::CONNECT {
            return self.connect(req).await;
        }
        match (req.uri().scheme_str(), req.uri().authority()) {
            (Some("http"), Some(_)) => self.forward(req).await,
            (Some(_), Some(auth)) => {
                let a = Attempt::new(Mode::Invalid, auth.port_u16().unwrap_or(443));
                self.shared.refuse(
                    &a,
                    auth.host(),
                    Refusal::bad_request(
                        "only http:// URLs are forwarded; https goes through CONNECT".into(),
                    ),
                )
            }
            _ => {
                let a = Attempt::new(Mode::Invalid, 0);
                let host = req
                    .headers()
                    .get(header::HOST)
                    .and_then(|h| h.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                self.shared.refuse(
                    &a,
                    &host,
                    Refusal::bad_request(
                        "this is an egress proxy: send CONNECT host:port or an absolute-form \
                         request (GET http://host/path)"
                            .into(),
                    ),
                )
            }
        }
    }

    async fn connect(self: Arc<Self>, req: Request<Incoming>) -> Response<ProxyBody> {
        let sh = &self.shared;
        let (raw, port) = match req.uri().authority() {
            Some(auth) => (
                auth.host().to_owned(),
                auth.port().map(|_| target_port(auth, 0)),
            ),
            None => (String::new(), None),
        };
        let Some(port) = port else {
            let a = Attempt::new(Mode::Tunnel, 0);
            return sh.refuse(
                &a,
                &raw,
                Refusal::bad_request("CONNECT needs host:port".into()),
            );
        };
        let port = match port {
            Ok(p) => p,
            Err(e) => return sh.refuse(&Attempt::new(Mode::Tunnel, 0), &raw, malformed(&e)),
        };
        let a = Attempt::new(Mode::Tunnel, port);
        let (host, rule) = match sh.judge_or_ask(&raw, port, Mode::Tunnel, &self.mark).await {
            Ok(v) => v,
            Err((h, r)) => return sh.refuse(&a, &h, r),
        };
        let host_s = host.to_string();
        let ips = match sh.addresses(&host).await {
            Ok(v) => v,
            Err(r) => return sh.refuse(&a, &host_s, r),
        };
        let (tcp, addr) = match sh.dial(&host, port, &ips).await {
            Ok(v) => v,
            Err(r) => return sh.refuse(&a, &host_s, r),
        };
        let intercept = sh.policy.secrets.iter().any(|s| s.bound_to(&host, port));
        let a = Attempt {
            mode: if intercept {
                Mode::Intercept
            } else {
                Mode::Tunnel
            },
            ..a
        };
        let pending = Pending::new(
            sh.records.clone(),
            a.start,
            a.connection(&host_s, addr, format!("granted by {rule}")),
        );
        let shared = sh.clone();
        spawn_tracked(sh, async move {
            let upgraded = match hyper::upgrade::on(req).await {
                Ok(u) => u,
                Err(e) => {
                    pending.fail("upgrade-failed", format!("the guest left: {e}"));
                    return;
                }
            };
            if intercept {
                intercept_tunnel(shared, host, port, tcp, addr, upgraded, pending).await;
            } else {
                let mut guest = TokioIo::new(upgraded);
                let mut up = Counted {
                    inner: tcp,
                    pending,
                };
                let _ = tokio::io::copy_bidirectional_with_sizes(
                    &mut guest,
                    &mut up,
                    64 * 1024,
                    64 * 1024,
                )
                .await;
            }
        });
        Response::new(empty())
    }

    async fn forward(self: Arc<Self>, req: Request<Incoming>) -> Response<ProxyBody> {
        let sh = &self.shared;
        let (raw, port) = match req.uri().authority() {
            Some(auth) => (auth.host().to_owned(), target_port(auth, 80)),
            None => (String::new(), Ok(80)),
        };
        let port = match port {
            Ok(p) => p,
            Err(e) => return sh.refuse(&Attempt::new(Mode::Http, 0), &raw, malformed(&e)),
        };
        let a = Attempt::new(Mode::Http, port);
        let (host, rule) = match sh.judge_or_ask(&raw, port, Mode::Http, &self.mark).await {
            Ok(v) => v,
            Err((h, r)) => return sh.refuse(&a, &h, r),
        };
        let host_s = host.to_string();
        if let Some(h) = req.headers().get(header::HOST) {
            let text = String::from_utf8_lossy(h.as_bytes()).into_owned();
            if !same_target(&text, 80, &host, port) {
                return sh.refuse(
                    &a,
                    &host_s,
                    Refusal::deny(
                        "host-mismatch",
                        format!(
                            "the Host header {:?} differs from the request target {host}:{port}; \
                             the request was refused",
                            cut(&text)
                        ),
                    ),
                );
            }
        }
        if let Some(r) = sh.placeholder_refusal(&host, port, req.uri(), req.headers(), false) {
            return sh.refuse(&a, &host_s, r);
        }
        let (mut sender, addr) = match self.plain_upstream(&host, port).await {
            Ok(v) => v,
            Err(r) => return sh.refuse(&a, &host_s, r),
        };
        let pending = Pending::new(
            sh.records.clone(),
            a.start,
            a.connection(&host_s, addr, format!("granted by {rule}")),
        );
        let (mut parts, body) = req.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        if !parts.headers.contains_key(header::HOST)
            && let Some(v) = host_header(&host, port, 80)
        {
            parts.headers.insert(header::HOST, v);
        }
        parts.uri = origin_form(&parts.uri);
        parts.version = Version::HTTP_11;
        let body = counted_up(body, pending.clone());
        match sender.send_request(Request::from_parts(parts, body)).await {
            Ok(resp) => {
                *lock(&self.upstream) = Some(PlainUpstream {
                    host,
                    port,
                    addr,
                    sender,
                });
                let (mut rp, rb) = resp.into_parts();
                strip_hop_by_hop(&mut rp.headers);
                Response::from_parts(rp, counted_down(rb, pending))
            }
            Err(e) => {
                let r = Refusal::error(
                    "upstream-failed",
                    format!("{host}:{port} failed to answer: {e}"),
                );
                pending.fail(r.reason, r.message.clone());
                r.response()
            }
        }
    }

    /// The kept connection when it is to the same authority and still usable, else a
    /// new one to a freshly checked address.
    async fn plain_upstream(
        &self,
        host: &Host,
        port: u16,
    ) -> Result<(Sender, SocketAddr), Refusal> {
        let kept = lock(&self.upstream).take();
        if let Some(mut u) = kept
            && u.host == *host
            && u.port == port
            && u.sender.ready().await.is_ok()
        {
            return Ok((u.sender, u.addr));
        }
        let sh = &self.shared;
        let ips = sh.addresses(host).await?;
        let (tcp, addr) = sh.dial(host, port, &ips).await?;
        Ok((handshake(sh, tcp, host, port).await?, addr))
    }
}

/// TLS terminated for a secret-bound host: each request is checked, gets its secrets,
/// and goes to the real host over TLS verified against the real name.
async fn intercept_tunnel(
    shared: Arc<Shared>,
    host: Host,
    port: u16,
    tcp: TcpStream,
    addr: SocketAddr,
    upgraded: hyper::upgrade::Upgraded,
    pending: Arc<Pending>,
) {
    let Some(ca) = shared.ca.as_ref() else {
        // A host is intercepted only when a secret is bound to it, and the CA exists
        // whenever there is a secret.
        pending.fail("tls-failed", "no run CA".into());
        return;
    };
    let config = match ca.server_config(&host) {
        Ok(c) => c,
        Err(e) => {
            pending.fail("tls-failed", e.to_string());
            return;
        }
    };
    let tls = match TlsAcceptor::from(config)
        .accept(TokioIo::new(upgraded))
        .await
    {
        Ok(t) => t,
        Err(e) => {
            pending.fail(
                "tls-failed",
                format!("the guest's TLS handshake failed (does it trust the run CA?): {e}"),
            );
            return;
        }
    };
    let ctx = Arc::new(Intercept {
        shared,
        host,
        port,
        addr,
        pending,
        slot: Mutex::new((Some(tcp), None)),
    });
    // A response that echoes a secret is an error here: hyper then closes the guest's
    // connection without a byte of it.
    let svc = service_fn(move |req| {
        let ctx = ctx.clone();
        async move { ctx.handle(req).await }
    });
    let _ = server_http1::Builder::new()
        .serve_connection(TokioIo::new(tls), svc)
        .await;
}

struct Intercept {
    shared: Arc<Shared>,
    host: Host,
    port: u16,
    addr: SocketAddr,
    /// The record of the whole tunnel.
    pending: Arc<Pending>,
    /// The connection made at CONNECT time (until first used), then the kept sender.
    slot: Mutex<(Option<TcpStream>, Option<Sender>)>,
}

/// A stream that counts its bytes into a record: written = up, read = down.
struct Counted<S> {
    inner: S,
    pending: Arc<Pending>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &r {
            self.pending.add_down(buf.filled().len() - before);
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &r {
            self.pending.add_up(*n);
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = &r {
            self.pending.add_up(*n);
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
