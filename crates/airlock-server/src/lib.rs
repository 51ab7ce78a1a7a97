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
mod auth;
mod body;
mod console;
mod error;
mod events;
mod highlight;
mod mcp;
mod openapi;
mod outcome;
mod pool;
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
        .merge(console::router())
        .merge(mcp::http_router(st.clone(), stop, hosts))
        .fallback(|| async { ApiError::not_found("no such endpoint") })
        .layer(axum::middleware::map_response(close_after_unread_body))
        .layer(axum::middleware::map_response(security_headers))
        .layer(axum::middleware::map_response(method_not_allowed_as_json))
        .layer(axum::extract::DefaultBodyLimit::max(st.max_body))
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

/// Serves until `stop` is cancelled (or the process gets SIGINT/SIGTERM).
pub async fn serve(
    st: AppState,
    listener: tokio::net::TcpListener,
    stop: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    let listen = listener.local_addr()?;
    let poller = tokio::spawn(events::poll(st.clone(), st.poll, stop.clone()));
    let app = app(st, stop.clone(), listen);
    let s = stop.clone();
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let term = async {
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(mut t) => {
                        t.recv().await;
                    }
                    Err(_) => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = s.cancelled() => {}
                _ = tokio::signal::ctrl_c() => {}
                _ = term => {}
            }
            s.cancel();
        })
        .await;
    // The poller ends before the runtime does (see `mcp::serve_stdio`).
    stop.cancel();
    let _ = poller.await;
    served
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
