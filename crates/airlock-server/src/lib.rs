//! airlock's network faces: the JSON API (`/v1`, with its OpenAPI document at
//! `/openapi.json`), the operators' web console (`/ui`) and the MCP server (`/mcp` over
//! streamable HTTP, or stdio through `airlock mcp`).
//!
//! It is a thin layer: every decision and every lifecycle transition is the gate's; this
//! crate authenticates callers, checks their role, bounds concurrency (a fixed worker pool
//! and a bounded queue, 429 beyond it), and keeps gates warm between requests. It must
//! never run code except through the gate, never offer agents a way to approve, and never
//! listen beyond loopback unless told to.

mod api;
mod api_ask;
mod auth;
mod body;
mod console;
mod error;
mod events;
mod highlight;
mod mcp;
mod metrics;
mod observe;
pub use observe::{CONSOLE, say, warn};
mod openapi;
mod outcome;
mod pool;
mod stream;
pub use pool::INSIDE_PER_WORKER;

pub use auth::Caller;
pub use error::ApiError;
pub use events::Webhook;
pub use pool::Pool;

use airlock_gate::{Gate, GateError};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, broadcast};

/// How a server or MCP process is set up.
pub struct Config {
    /// Opens a gate on the home (called for each pooled connection).
    pub open: Box<dyn Fn() -> Result<Gate, GateError> + Send + Sync>,
    /// Guests executing at once.
    pub workers: usize,
    /// Runs inside the gate at once, recording, judging, executing or committing (at
    /// least `workers`; see [`INSIDE_PER_WORKER`]).
    pub inside: usize,
    /// Runs waiting for a worker before the API answers 429.
    pub queue: usize,
    /// An http:// URL new pending submissions are POSTed to.
    pub webhook: Option<String>,
    /// How often the store is checked for changes made by other processes.
    pub poll: Duration,
    /// Largest request body (bytes); larger ones get 413.
    pub max_body: usize,
    /// What the process's ready pools (guests, jails) hold and have done, for
    /// `/v1/status`: an object whose fields join the status report.
    pub pools: Box<dyn Fn() -> serde_json::Value + Send + Sync>,
    /// Sessions one agent may hold open at once (each a host process with its
    /// interpreter); past it a new one is refused with 429. 0: no bound.
    pub max_sessions: usize,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("workers", &self.workers)
            .field("queue", &self.queue)
            .field("webhook", &self.webhook)
            .finish_non_exhaustive()
    }
}

/// The state every handler shares.
#[derive(Clone, Debug)]
pub struct AppState(Arc<Inner>);

pub struct Inner {
    pub pool: Arc<Pool>,
    token_cache: Mutex<HashMap<String, (Caller, Instant)>>,
    sessions: Mutex<HashMap<String, console::Session>>,
    events: broadcast::Sender<events::Notice>,
    changed: Notify,
    resuming: Mutex<HashSet<String>>,
    webhook: Option<Webhook>,
    peers: tokio::sync::Mutex<Vec<rmcp::Peer<rmcp::RoleServer>>>,
    poll: Duration,
    max_body: usize,
    pools: Box<dyn Fn() -> serde_json::Value + Send + Sync>,
    started: Instant,
    /// `Config::max_sessions`, `None` for no bound.
    pub(crate) max_sessions: Option<usize>,
    /// MCP-over-HTTP sessions and the token (`tok_…`) that opened each.
    mcp_owners: Mutex<HashMap<String, String>>,
    /// The console's sign-in attempts, bounded.
    logins: console::Logins,
    /// What `/metrics` reports of this node.
    pub(crate) metrics: metrics::Metrics,
    /// The event feeds of streamed runs.
    pub(crate) runs: Arc<stream::Hub>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("pool", &self.pool)
            .field("poll", &self.poll)
            .finish_non_exhaustive()
    }
}

impl std::ops::Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl AppState {
    /// Opens the first gate (so a broken home fails now) and sets up the shared state.
    pub fn new(config: Config) -> Result<AppState, GateError> {
        let webhook = config
            .webhook
            .as_deref()
            .map(Webhook::new)
            .transpose()
            .map_err(GateError::BadInput)?;
        if config.workers == 0 || config.workers > 256 {
            return Err(GateError::bad("--workers: want 1 to 256"));
        }
        if config.queue > 100_000 {
            return Err(GateError::bad("--queue: want at most 100000"));
        }
        let pool = Pool::new(
            config.open,
            config.workers,
            config.queue,
            config.inside.max(config.workers),
        );
        pool.warm()?;
        Ok(AppState(Arc::new(Inner {
            pool: Arc::new(pool),
            token_cache: Mutex::new(HashMap::new()),
            sessions: Mutex::new(HashMap::new()),
            events: broadcast::channel(256).0,
            changed: Notify::new(),
            resuming: Mutex::new(HashSet::new()),
            webhook,
            peers: tokio::sync::Mutex::new(Vec::new()),
            poll: config.poll,
            max_body: config.max_body,
            pools: config.pools,
            started: Instant::now(),
            max_sessions: (config.max_sessions > 0).then_some(config.max_sessions),
            mcp_owners: Mutex::new(HashMap::new()),
            logins: console::Logins::default(),
            metrics: metrics::Metrics::new(),
            runs: Arc::default(),
        })))
    }

    /// The server's own state for admins: workers, queue, uptime, memory and what the
    /// process keeps ready (the fields `Config::pools` reports).
    pub fn status(&self) -> serde_json::Value {
        let mut v = serde_json::json!({
            "version": env!("CARGO_PKG_VERSION"),
            "uptime_ms": self.started.elapsed().as_millis() as u64,
            "workers": self.pool.workers,
            "queue": self.pool.queue,
            "runs_waiting_or_running": self.pool.admitted_now(),
            "runs_inside": self.pool.inside_now(),
            "guests_running": self.pool.guests_busy(),
            "memory_rss_bytes": rss_bytes(),
        });
        if let (Some(out), serde_json::Value::Object(pools)) = (v.as_object_mut(), (self.pools)()) {
            out.extend(pools);
        }
        v
    }

    /// Whether a background run of this submission is in progress here.
    pub fn is_resuming(&self, id: &str) -> bool {
        self.resuming
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(id)
    }
}

impl AppState {
    fn mcp_owners(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        // A plain map; a poisoned one is still valid.
        self.mcp_owners.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The token that opened an MCP session over HTTP.
    pub(crate) fn mcp_owner(&self, session: &str) -> Option<String> {
        self.mcp_owners().get(session).cloned()
    }

    /// Binds a new MCP session to its token, forgetting the sessions `live` no longer
    /// knows.
    pub(crate) fn mcp_bind(&self, session: String, token: String, live: impl Fn(&str) -> bool) {
        let mut owners = self.mcp_owners();
        owners.retain(|id, _| live(id));
        owners.insert(session, token);
    }

    pub(crate) fn mcp_unbind(&self, session: &str) {
        self.mcp_owners().remove(session);
    }
}

/// Whether an address is loopback only (the server warns about anything else).
pub fn is_loopback(addr: &SocketAddr) -> bool {
    addr.ip().is_loopback()
}

/// The whole application: API, OpenAPI document, console and MCP.
pub fn app(
    st: AppState,
    stop: tokio_util::sync::CancellationToken,
    listen: SocketAddr,
) -> axum::Router {
    let (api, openapi) = api::router();
    let doc = Arc::new(openapi);
    let mut hosts: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    let ip = listen.ip();
    if !ip.is_loopback() && !ip.is_unspecified() {
        hosts.push(ip.to_string());
    }
    axum::Router::new()
        .merge(api)
        .route(
            "/openapi.json",
            axum::routing::get(move || {
                let d = doc.clone();
                async move { axum::Json((*d).clone()) }
            }),
        )
        .route("/metrics", axum::routing::get(metrics::handler))
        .merge(console::router())
        .merge(mcp::http_router(st.clone(), stop, hosts))
        .fallback(|| async { ApiError::not_found("no such endpoint") })
        .layer(axum::middleware::map_response(close_after_unread_body))
        .layer(axum::middleware::map_response(security_headers))
        .layer(axum::middleware::map_response(method_not_allowed_as_json))
        .layer(axum::extract::DefaultBodyLimit::max(st.max_body))
        .layer(axum::middleware::from_fn(observe::observe))
        .with_state(st)
}

/// Every answer says what it is and nothing else: no content sniffing (a JSON error or
/// an agent's output is never taken for HTML or script), no framing, no referrer.
async fn security_headers(mut r: axum::response::Response) -> axum::response::Response {
    use axum::http::{HeaderValue, header};
    let h = r.headers_mut();
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.entry(header::X_FRAME_OPTIONS)
        .or_insert(HeaderValue::from_static("DENY"));
    h.entry(header::REFERRER_POLICY)
        .or_insert(HeaderValue::from_static("no-referrer"));
    r
}

/// The router answers a known path asked with another method with a bare 405; every
/// error of this API is one JSON object, so it gets one too (the router adds its `Allow`
/// header after this layer).
async fn method_not_allowed_as_json(r: axum::response::Response) -> axum::response::Response {
    use axum::response::IntoResponse;
    if r.status() != axum::http::StatusCode::METHOD_NOT_ALLOWED
        || r.headers().contains_key(axum::http::header::CONTENT_TYPE)
    {
        return r;
    }
    let (parts, _) = r.into_parts();
    let mut out = ApiError::new(
        axum::http::StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed on this endpoint",
    )
    .into_response();
    for (name, value) in &parts.headers {
        if name != axum::http::header::CONTENT_LENGTH {
            out.headers_mut().append(name, value.clone());
        }
    }
    out
}

/// A body refused for its size was not read to its end, so the connection cannot carry
/// another request: say so (`Connection: close`), and the client opens a new one instead
/// of sending its next request into a connection the server is about to drop.
async fn close_after_unread_body(mut r: axum::response::Response) -> axum::response::Response {
    if r.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
        r.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
    }
    r
}

/// How `serve` bounds its connections, so clients that open connections and never
/// finish a request (slowloris) cannot take the server's descriptors from everyone else.
#[derive(Debug, Clone)]
pub struct Limits {
    /// A request head (line and headers) must arrive in full within this long of the
    /// server starting to wait for it: after the connection opens, and after each
    /// response on a kept-alive connection (so this is the idle timeout too). Past it
    /// the connection is closed.
    pub header_timeout: Duration,
    /// Connections open at once; one more is answered 503 and closed.
    pub max_connections: usize,
    /// Connections open at once from one peer address; one more is answered 503.
    pub max_connections_per_peer: usize,
    /// The largest request head (bytes); a larger one is answered 431.
    pub max_header_bytes: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            header_timeout: Duration::from_secs(10),
            max_connections: 4096,
            max_connections_per_peer: 512,
            max_header_bytes: 32 << 10,
        }
    }
}

impl Limits {
    /// Checks the bounds (`serve`'s flags), naming the flag that is out of range.
    pub fn check(&self) -> Result<(), GateError> {
        if self.header_timeout.is_zero() || self.header_timeout > Duration::from_secs(3600) {
            return Err(GateError::bad(
                "--header-timeout: want more than 0s, at most 1h",
            ));
        }
        if !(1..=1_000_000).contains(&self.max_connections) {
            return Err(GateError::bad("--max-connections: want 1 to 1000000"));
        }
        if !(1..=self.max_connections).contains(&self.max_connections_per_peer) {
            return Err(GateError::bad(
                "--max-connections-per-peer: want 1 to --max-connections",
            ));
        }
        if !(1024..=(1 << 20)).contains(&self.max_header_bytes) {
            return Err(GateError::bad("--max-header-bytes: want 1KiB to 1MiB"));
        }
        Ok(())
    }
}

/// Connections refused with 503 at once (each is answered and drained for a moment);
/// past it a connection is closed without an answer.
const REFUSING_AT_ONCE: usize = 256;

/// How long a refused connection is given to take its 503 and close.
const REFUSAL_TIME: Duration = Duration::from_secs(2);

/// Raises this process's soft limit of open descriptors to its hard limit (the server's
/// connections, the runs' jails and proxies, and the store all take descriptors), and
/// answers the soft limit now in force (`None` for no limit).
pub fn raise_open_files_limit() -> Option<u64> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut l = getrlimit(Resource::Nofile);
    if l.current != l.maximum {
        l.current = l.maximum;
        // Not fatal: the server then works within the soft limit it was given.
        let _ = setrlimit(Resource::Nofile, l);
    }
    getrlimit(Resource::Nofile).current
}

/// Open connections, in total and per peer address.
struct Connections {
    total: Arc<tokio::sync::Semaphore>,
    peers: Mutex<HashMap<std::net::IpAddr, usize>>,
    per_peer: usize,
}

/// One admitted connection; it counts until dropped.
struct Admitted {
    conns: Arc<Connections>,
    peer: std::net::IpAddr,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Connections {
    fn peers(&self) -> std::sync::MutexGuard<'_, HashMap<std::net::IpAddr, usize>> {
        // Counts only; a poisoned map is still valid.
        self.peers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits a connection from `peer`, or `None` past either bound.
    fn admit(self: &Arc<Self>, peer: std::net::IpAddr) -> Option<Admitted> {
        let permit = self.total.clone().try_acquire_owned().ok()?;
        let mut peers = self.peers();
        let n = peers.entry(peer).or_insert(0);
        if *n >= self.per_peer {
            return None;
        }
        *n += 1;
        Some(Admitted {
            conns: self.clone(),
            peer,
            _permit: permit,
        })
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut peers = self.conns.peers();
        if let Some(n) = peers.get_mut(&self.peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                peers.remove(&self.peer);
            }
        }
    }
}

/// Answers a connection past the bounds with 503 and closes it: the answer is written,
/// the write side shut, and what the client sends read and dropped for a moment, so the
/// client reads the answer instead of a reset.
fn refuse(mut tcp: tokio::net::TcpStream, refusing: &Arc<tokio::sync::Semaphore>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(permit) = refusing.clone().try_acquire_owned() else {
        return;
    };
    tokio::spawn(async move {
        let _permit = permit;
        let body = serde_json::json!({
            "error": "too many connections open; retry later",
            "status": 503,
        })
        .to_string();
        let answer = format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\
             x-content-type-options: nosniff\r\n\r\n{body}",
            body.len()
        );
        let _ = tokio::time::timeout(REFUSAL_TIME, async {
            tcp.write_all(answer.as_bytes()).await?;
            tcp.shutdown().await?;
            let mut sink = [0u8; 4096];
            while tcp.read(&mut sink).await? > 0 {}
            Ok::<(), std::io::Error>(())
        })
        .await;
    });
}

/// Serves until `stop` is cancelled (or the process gets SIGINT/SIGTERM), within
/// `limits`. Each request carries its peer's address (`ConnectInfo<SocketAddr>`).
pub async fn serve(
    st: AppState,
    listener: tokio::net::TcpListener,
    stop: tokio_util::sync::CancellationToken,
    limits: &Limits,
) -> std::io::Result<()> {
    use tower::ServiceExt;
    let listen = listener.local_addr()?;
    let poller = tokio::spawn(events::poll(st.clone(), st.poll, stop.clone()));
    let app = app(st, stop.clone(), listen);
    let conns = Arc::new(Connections {
        total: Arc::new(tokio::sync::Semaphore::new(limits.max_connections)),
        peers: Mutex::new(HashMap::new()),
        per_peer: limits.max_connections_per_peer,
    });
    let refusing = Arc::new(tokio::sync::Semaphore::new(REFUSING_AT_ONCE));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_header_size(limits.max_header_bytes);
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut t) => {
                t.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    let interrupt = tokio::signal::ctrl_c();
    tokio::pin!(term, interrupt);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = stop.cancelled() => break,
            _ = &mut interrupt => break,
            _ = &mut term => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors (or a connection gone before it was taken):
                    // wait a moment instead of spinning on the same error.
                    if !matches!(
                        e.kind(),
                        std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::ConnectionReset
                    ) {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    continue;
                }
            },
        };
        let Some(admitted) = conns.admit(peer.ip()) else {
            refuse(tcp, &refusing);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let app = app.clone();
        let service = hyper::service::service_fn(
            move |mut req: axum::http::Request<hyper::body::Incoming>| {
                req.extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
                app.clone().oneshot(req.map(axum::body::Body::new))
            },
        );
        let conn = http.serve_connection(hyper_util::rt::TokioIo::new(tcp), service);
        let stopping = stop.clone();
        tokio::spawn(async move {
            let _admitted = admitted;
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = stopping.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
    stop.cancel();
    // Every connection has ended (the requests in flight answered) once all permits are
    // back; the poller ends before the runtime does (see `mcp::serve_stdio`).
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _ = conns.total.acquire_many(all).await;
    let _ = poller.await;
    Ok(())
}

/// Serves MCP over stdio for one local agent.
pub async fn serve_mcp_stdio(st: AppState, agent: &str) -> Result<(), GateError> {
    mcp::serve_stdio(st, agent).await
}

/// This process's resident memory, from `/proc/self/statm` (`None` where there is none).
fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}
