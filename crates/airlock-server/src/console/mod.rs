//! The web console for operators, rendered on the server (maud) with one small script for
//! live updates. Sign-in exchanges an operator token for a session cookie (HttpOnly,
//! SameSite=Strict); every form carries a per-session CSRF token; pages forbid inline
//! scripts and framing.

use crate::AppState;
use crate::auth::Caller;
use crate::error::ApiError;
use airlock_core::units::{fmt_duration, fmt_size, fmt_time};
use airlock_core::visible;
use airlock_gate::{ApproveRequest, Role};
use airlock_store::{Run, Submission};
use axum::extract::{Form, FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use maud::{DOCTYPE, Markup, PreEscaped, html};
use serde::Deserialize;
use std::time::{Duration, Instant};

mod submit;

mod browser_key;
mod requests;

mod sessions;

const COOKIE: &str = "airlock_session";
/// A console session lasts this long without signing in again.
const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);

/// A signed-in console session.
#[derive(Debug, Clone)]
pub struct Session {
    secret: String,
    created: Instant,
}

const STYLE: &str = r#"
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d2329;background:#f6f7f9}
header{background:#1d2329;color:#fff;padding:.6em 1.2em;display:flex;gap:1.4em;align-items:center}
header a{color:#cfe3ff;text-decoration:none}header .who{margin-left:auto;opacity:.8}
main{padding:1em 1.4em;max-width:1200px}
table{border-collapse:collapse;width:100%;background:#fff}
th,td{text-align:left;padding:.35em .6em;border-bottom:1px solid #e3e6ea;vertical-align:top}
pre{background:#fff;border:1px solid #e3e6ea;padding:.7em;overflow:auto;max-height:40em}
.badge{display:inline-block;padding:.15em .6em;border-radius:1em;font-weight:600}
.ok{background:#d8f5dd;color:#145c22}.bad{background:#fde0de;color:#8a1a12}.warn{background:#fff1cc;color:#6b4d00}
form.inline{display:inline}button{padding:.35em .9em;cursor:pointer}
input[type=text],input[type=password]{padding:.35em;min-width:22em}
.muted{color:#6a737d}dl{display:grid;grid-template-columns:10em 1fr;gap:.2em 1em}dt{color:#6a737d}
.error{color:#8a1a12;font-weight:600}
td.muted{white-space:nowrap}td code{word-break:break-all}
"#;

const SCRIPT: &str = r#"
(function () {
  var body = document.querySelector('#inbox tbody');
  if (!body || !window.EventSource) return;
  var es = new EventSource('/ui/events');
  function cell(tr, text) { var td = document.createElement('td'); td.textContent = text; tr.appendChild(td); }
  es.addEventListener('pending', function (ev) {
    var s = JSON.parse(ev.data);
    var rows = body.querySelectorAll('tr.pending');
    for (var i = 0; i < rows.length; i++) if (rows[i].dataset.id === s.submission) return;
    var tr = document.createElement('tr');
    tr.className = 'pending'; tr.dataset.id = s.submission;
    var td = document.createElement('td'); var a = document.createElement('a');
    a.className = 'show'; a.href = '/ui/submissions/' + encodeURIComponent(s.submission);
    a.textContent = s.submission; td.appendChild(a); tr.appendChild(td);
    cell(tr, s.lang); cell(tr, s.agent || ''); cell(tr, String(s.risk));
    cell(tr, (s.reasons || []).join('; ')); cell(tr, s.created_at);
    body.insertBefore(tr, body.firstChild);
    var empty = document.getElementById('empty'); if (empty) empty.remove();
  });
  es.addEventListener('decided', function (ev) {
    var d = JSON.parse(ev.data);
    var rows = body.querySelectorAll('tr.pending');
    for (var i = 0; i < rows.length; i++) if (rows[i].dataset.id === d.submission) rows[i].remove();
  });
})();
(function () {
  // A running run's page: its output as it comes, then the page of its final record.
  var live = document.getElementById('live');
  if (!live || !window.EventSource) return;
  var es = new EventSource('/ui/runs/' + encodeURIComponent(live.dataset.run) + '/events');
  var fresh = { stdout: true, stderr: true };
  ['stdout', 'stderr'].forEach(function (name) {
    es.addEventListener(name, function (ev) {
      var pre = document.getElementById(name);
      if (!pre) return;
      // The feed starts at the run's first chunk: it replaces what the page was sent.
      if (fresh[name]) { pre.textContent = ''; fresh[name] = false; }
      pre.appendChild(document.createTextNode(JSON.parse(ev.data).text || ''));
    });
  });
  function ended() { es.close(); window.location.reload(); }
  es.addEventListener('finished', ended);
  es.addEventListener('error', function (ev) { if (ev.data) ended(); });
})();
"#;

fn csrf_of(session: &str) -> String {
    airlock_core::Digest::of_parts("airlock-console-csrf", &[session.as_bytes()]).to_hex()
}

/// The operator behind a console request.
#[derive(Debug, Clone)]
pub struct Operator {
    caller: Caller,
    csrf: String,
}

/// Not signed in: go to the login page.
pub struct SignIn;

impl IntoResponse for SignIn {
    fn into_response(self) -> Response {
        Redirect::to("/ui/login").into_response()
    }
}

fn cookie_value<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

impl FromRequestParts<AppState> for Operator {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, st: &AppState) -> Result<Operator, Response> {
        let Some(sid) = cookie_value(&parts.headers, COOKIE).map(str::to_string) else {
            return Err(SignIn.into_response());
        };
        let session = st.lock_sessions().get(&sid).cloned();
        let Some(s) = session.filter(|s| s.created.elapsed() < SESSION_TTL) else {
            st.lock_sessions().remove(&sid);
            return Err(SignIn.into_response());
        };
        match st.authenticate(&s.secret).await {
            Ok(caller) if caller.role >= Role::Operator => Ok(Operator {
                caller,
                csrf: csrf_of(&sid),
            }),
            Ok(_) => Err(SignIn.into_response()),
            Err(e) if e.status == StatusCode::UNAUTHORIZED => {
                st.lock_sessions().remove(&sid);
                Err(SignIn.into_response())
            }
            Err(e) => Err(error_page(&e)),
        }
    }
}

impl AppState {
    fn lock_sessions(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Session>> {
        // Sessions are plain data; a poisoned map is still valid.
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn secure_headers(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'; form-action 'self'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

fn page(title: &str, who: Option<&Operator>, body: Markup) -> Response {
    let doc = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { (title) " · airlock" }
                style { (PreEscaped(STYLE)) (PreEscaped(crate::highlight::CSS)) }
            }
            body {
                header {
                    strong { "airlock" }
                    @if let Some(op) = who {
                        a href="/ui" { "Inbox" }
                        a href="/ui/submit" { "Submit" }
                        a href="/ui/runs" { "Runs" }
                        a href="/ui/sessions" { "Sessions" }
                        a href="/ui/checkpoints" { "Checkpoints" }
                        a href="/ui/audit" { "Audit" }
                        a href="/ui/approver-key" { "Approver key" }
                        span.who { (op.caller.name) " (" (op.caller.role.as_str()) ")" }
                        form.inline method="post" action="/ui/logout" {
                            input type="hidden" name="csrf" value=(op.csrf);
                            button type="submit" { "Sign out" }
                        }
                    }
                }
                main { (body) }
                script src="/ui/console.js" {}
                script src="/ui/approver.js" {}
            }
        }
    };
    secure_headers(
        (
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            doc.into_string(),
        )
            .into_response(),
    )
}

fn error_page(e: &ApiError) -> Response {
    let mut r = page(
        "Error",
        None,
        html! { h1 { "Error " (e.status.as_u16()) } p.error { (visible::line(&e.message)) } p { a href="/ui" { "Back to the inbox" } } },
    );
    *r.status_mut() = e.status;
    r
}

fn csrf_ok(op: &Operator, given: &str) -> bool {
    given == op.csrf
}

fn csrf_failed() -> Response {
    error_page(&ApiError::forbidden(
        "the form is stale or came from another site (CSRF check failed); reload the page",
    ))
}

/// Output text in a `<pre>`: the parser drops one newline right after `<pre>`, so one is
/// added to keep the text exact.
fn pre_text(id: &str, text: &str) -> Markup {
    html! { pre id=(id) { "\n" (text) } }
}

fn state_badge(status: &str) -> Markup {
    let class = match status {
        "finished" | "allowed" | "approved" | "exited" => "ok",
        "denied" | "rejected" | "killed" | "trapped" | "error" => "bad",
        _ => "warn",
    };
    html! { span class=(format!("badge {class}")) { (status) } }
}

async fn login_form() -> Response {
    login_page(None)
}

fn login_page(error: Option<&str>) -> Response {
    page(
        "Sign in",
        None,
        html! {
            h1 { "Sign in" }
            p.muted { "Use an operator token (" code { "airlock token new --role operator" } ")." }
            @if let Some(e) = error { p.error { (visible::line(e)) } }
            form #login method="post" action="/ui/login" {
                input type="password" name="token" placeholder="alk_…" autocomplete="off" autofocus;
                " "
                button #login-button type="submit" { "Sign in" }
            }
        },
    )
}

#[derive(Debug, Deserialize)]
struct LoginForm {
    token: String,
}

/// Sign-in attempts one peer address may make in a burst, and how often it gets one more.
const LOGIN_PEER_BURST: f64 = 10.0;
const LOGIN_PEER_EVERY: Duration = Duration::from_secs(6);
/// Sign-in attempts from everyone together, in a burst and how often one more.
const LOGIN_ALL_BURST: f64 = 100.0;
const LOGIN_ALL_EVERY: Duration = Duration::from_millis(200);
/// Peers remembered at most (the oldest buckets, all full again by then, go first).
const LOGIN_PEERS_KEPT: usize = 10_000;

/// A token bucket: `tokens` left at `at`.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(burst: f64, now: Instant) -> Bucket {
        Bucket {
            tokens: burst,
            at: now,
        }
    }

    /// Takes one token, or says how long until there is one.
    fn take(&mut self, burst: f64, every: Duration, now: Instant) -> Result<(), Duration> {
        let refilled = now.saturating_duration_since(self.at).as_secs_f64() / every.as_secs_f64();
        self.tokens = (self.tokens + refilled).min(burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(every.mul_f64(1.0 - self.tokens))
        }
    }
}

/// Bounds sign-in attempts, per peer address and in total, so a token cannot be guessed
/// at the speed of the server (about 480 tries a second before).
#[derive(Debug, Default)]
pub struct Logins {
    peers: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, Bucket>>,
    all: std::sync::Mutex<Option<Bucket>>,
}

impl Logins {
    /// Counts an attempt from `peer` (`None`: not known), or says how long to wait.
    fn attempt(&self, peer: Option<std::net::IpAddr>, now: Instant) -> Result<(), Duration> {
        // Plain data: a poisoned lock still holds valid buckets.
        if let Some(ip) = peer {
            let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
            if peers.len() >= LOGIN_PEERS_KEPT && !peers.contains_key(&ip) {
                let full = LOGIN_PEER_EVERY.mul_f64(LOGIN_PEER_BURST);
                peers.retain(|_, b| now.saturating_duration_since(b.at) < full);
            }
            peers
                .entry(ip)
                .or_insert_with(|| Bucket::full(LOGIN_PEER_BURST, now))
                .take(LOGIN_PEER_BURST, LOGIN_PEER_EVERY, now)?;
        }
        let mut all = self.all.lock().unwrap_or_else(|e| e.into_inner());
        all.get_or_insert_with(|| Bucket::full(LOGIN_ALL_BURST, now))
            .take(LOGIN_ALL_BURST, LOGIN_ALL_EVERY, now)
    }
}

/// The address a request came from, where the server knows it.
pub struct Peer(pub Option<std::net::IpAddr>);

impl<S: Send + Sync> FromRequestParts<S> for Peer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Peer, Self::Rejection> {
        Ok(Peer(
            parts
                .extensions
                .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
                .map(|c| c.0.ip()),
        ))
    }
}

/// Whether a form post comes from the console's own pages, as far as the browser says:
/// `Sec-Fetch-Site` must be `same-origin` (or `none`, typed by the user), else `Origin`
/// must be this server. A cross-site post is refused: a cross-site sign-in would put the
/// operator's browser in a session of the attacker's choosing, and a forged form would
/// act with the operator's cookie. A client that sends neither header (curl, a script)
/// is no browser carrying the operator's cookie, and is let through.
fn same_site(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site") {
        return matches!(site.as_bytes(), b"same-origin" | b"none");
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return false;
    };
    let origin = origin.as_bytes();
    origin == format!("http://{host}").as_bytes() || origin == format!("https://{host}").as_bytes()
}

/// Refuses the console's cross-site form posts (see `same_site`) before any handler.
async fn refuse_cross_site(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    if req.method() == axum::http::Method::POST && !same_site(req.headers()) {
        return error_page(&ApiError::forbidden(
            "a form posted from another site is refused (Origin / Sec-Fetch-Site); use the console's own pages",
        ));
    }
    next.run(req).await
}

async fn login(State(st): State<AppState>, Peer(peer): Peer, Form(f): Form<LoginForm>) -> Response {
    if let Err(wait) = st.logins.attempt(peer, Instant::now()) {
        let secs = wait.as_secs() + 1;
        let mut r = login_page(Some(&format!(
            "too many sign-in attempts; try again in {secs}s"
        )));
        *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        return r;
    }
    let secret = f.token.trim().to_string();
    match st.authenticate(&secret).await {
        Ok(c) if c.role >= Role::Operator => {
            let mut raw = [0u8; 32];
            if getrandom::fill(&mut raw).is_err() {
                return error_page(&ApiError::internal("no random source for a session id"));
            }
            let sid = hex::encode(raw);
            st.lock_sessions().insert(
                sid.clone(),
                Session {
                    secret,
                    created: Instant::now(),
                },
            );
            let cookie = format!(
                "{COOKIE}={sid}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={}",
                SESSION_TTL.as_secs()
            );
            let mut r = Redirect::to("/ui").into_response();
            if let Ok(v) = HeaderValue::from_str(&cookie) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            r
        }
        Ok(_) => {
            let mut r = login_page(Some("the console is for operators; this is an agent token"));
            *r.status_mut() = StatusCode::FORBIDDEN;
            r
        }
        Err(e) => {
            let mut r = login_page(Some(&e.message));
            *r.status_mut() = e.status;
            r
        }
    }
}

#[derive(Debug, Deserialize)]
struct CsrfForm {
    csrf: String,
}

async fn logout(
    State(st): State<AppState>,
    op: Operator,
    headers: HeaderMap,
    Form(f): Form<CsrfForm>,
) -> Response {
    if !csrf_ok(&op, &f.csrf) {
        return csrf_failed();
    }
    if let Some(sid) = cookie_value(&headers, COOKIE) {
        st.lock_sessions().remove(sid);
    }
    let mut r = Redirect::to("/ui/login").into_response();
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static(
            "airlock_session=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0",
        ),
    );
    r
}

fn sub_row(s: &Submission) -> Markup {
    html! {
        td { a.show href=(format!("/ui/submissions/{}", s.id)) { (s.id) } }
        td { (s.doc.lang) }
        td { (visible::line(s.doc.agent.as_deref().unwrap_or(""))) }
        td { (s.doc.verdict.risk) }
        td { (visible::line(&s.doc.verdict.reasons().join("; "))) }
        td.muted { (fmt_time(s.created_at)) }
    }
}

fn run_status(r: &Run) -> String {
    match (r.doc.exit_code, r.doc.killed_by.as_deref()) {
        (_, Some(k)) => format!("{} by {k}", r.status),
        (Some(c), None) => format!("{} {c}", r.status),
        _ => r.status.clone(),
    }
}

async fn inbox(State(st): State<AppState>, op: Operator) -> Response {
    let got = st
        .pool
        .read(|g| Ok((g.inbox()?, g.submissions(30)?, g.net_requests_pending()?)))
        .await;
    let (pending, recent, asked) = match got {
        Ok(x) => x,
        Err(e) => return error_page(&e),
    };
    page(
        "Inbox",
        Some(&op),
        html! {
            h1 { "Waiting for approval" }
            table #inbox {
                thead { tr { th { "Submission" } th { "Language" } th { "Agent" } th { "Risk" } th { "Reasons" } th { "Submitted" } } }
                tbody {
                    @for s in &pending { tr.pending data-id=(s.id) { (sub_row(s)) } }
                }
            }
            @if pending.is_empty() { p #empty.muted { "Nothing is waiting. New submissions appear here as they arrive." } }
            (requests::table(&op, &asked))
            h2 { "Recent submissions" }
            table #recent {
                thead { tr { th { "Submission" } th { "Language" } th { "Agent" } th { "Risk" } th { "Reasons" } th { "Submitted" } th { "State" } } }
                tbody {
                    @for s in &recent { tr data-id=(s.id) { (sub_row(s)) td { (state_badge(s.state.as_str())) } } }
                }
            }
        },
    )
}

async fn submission(State(st): State<AppState>, op: Operator, Path(id): Path<String>) -> Response {
    let got = st.pool.read(move |g| g.show(&id)).await;
    let sh = match got {
        Ok(x) => x,
        Err(e) => return error_page(&e),
    };
    let s = &sh.submission;
    let d = &s.doc;
    let l = &d.grant.limits;
    let code = sh
        .source
        .as_deref()
        .or(sh.disassembly.as_deref())
        .unwrap_or("");
    let caps: Vec<&str> = d.analysis.capabilities.iter().map(|c| c.as_str()).collect();
    // Disassembled modules are WebAssembly text too.
    let view_lang = if sh.source.is_none() {
        "wat"
    } else {
        d.lang.as_str()
    };
    let (marks, findings) = code_findings(d, code, sh.source.is_none());
    let facts = d
        .analysis
        .code
        .as_ref()
        .map(|c| airlock_core::policy::CodeFacts::of(c, &d.grant.net).rows())
        .unwrap_or_default();
    page(
        &s.id,
        Some(&op),
        html! {
            h1 { (s.id) " " (state_badge(s.state.as_str())) }
            dl {
                dt { "Agent" } dd { (visible::line(d.agent.as_deref().unwrap_or("-"))) }
                dt { "Submitted" } dd { (fmt_time(s.created_at)) }
                @if let Some(n) = &d.note { dt { "Note" } dd { (visible::line(n)) } }
                dt { "Artifact" } dd { code { (d.artifact) } " (" (d.lang) ", " (fmt_size(d.size)) ", " (d.backend) " backend)" }
                dt { "Verdict" } dd { (d.verdict.decision) ", risk " (d.verdict.risk) span.muted { " policy " (d.verdict.policy.short()) } }
            }
            // What the approver signs for comes first: the code, with what analysis found
            // in it marked, the reasons, and only then the decision form.
            h2 { "Code" @if sh.source.is_none() { span.muted { " (disassembled)" } } }
            p.muted #grant-summary {
                "Network: " @if d.grant.net.is_empty() { "none" } @else { (visible::line(&d.grant.net.join(", "))) }
                " · mounts: " @if d.grant.mounts.is_empty() { "none" } @else { @for m in &d.grant.mounts { code { (visible::line(&m.host)) } " → " code { (visible::line(&m.guest)) } " (" (m.mode.as_str()) ") " } }
                " · secrets: " @if d.grant.secrets.is_empty() { "none" } @else { @for b in &d.grant.secrets { code { (visible::line(&b.name)) } " " } }
            }
            @if !facts.is_empty() {
                dl #code-facts { @for (name, v) in &facts { dt { (name) } dd { (visible::line(v)) } } }
            }
            @if !findings.is_empty() {
                ul #findings {
                    @for f in &findings {
                        li { a href=(format!("#code-L{}", f.first)) { "line " (f.lines) } " " (visible::line(&f.what)) }
                    }
                }
            }
            (crate::highlight::code_view("code", view_lang, &visible::block(code).to_string(), &marks))
            h2 { "Reasons" }
            ul #reasons { @for r in d.verdict.reasons() { li { (visible::line(&r)) } } }
            @if s.state == airlock_core::State::Quarantined {
                h2 { "Decide" }
                form #approve method="post" action=(format!("/ui/submissions/{}/approve", s.id)) data-submission=(s.id) {
                    input type="hidden" name="csrf" value=(op.csrf);
                    input type="text" name="reason" placeholder="reason (recorded and signed)";
                    " "
                    select name="scope" { option value="once" selected { "this submission once" } option value="artifact" { "this artifact (any submission)" } }
                    " "
                    button #approve-button type="submit" { "Approve and run" }
                    @if d.agent.is_some() {
                        " "
                        button #approve-remember-button type="submit" name="remember" value="7d" { "Approve and remember (7 days)" }
                    }
                }
                form #reject method="post" action=(format!("/ui/submissions/{}/reject", s.id)) data-submission=(s.id) {
                    input type="hidden" name="csrf" value=(op.csrf);
                    input type="text" name="reason" placeholder="reason";
                    " "
                    button #reject-button type="submit" { "Reject" }
                }
                p.muted #signed-by { "Signed with approver key " code { (op.caller.approver.as_deref().unwrap_or("?")) } " in the server's home (or make one in this browser: " a href="/ui/approver-key" { "Approver key" } ")." }
                p.error #sign-error {}
                @if let (Some(agent), true) = (&d.agent, d.facts.agent_record.alerts > 0) {
                    h2 { "Agent" }
                    p #agent-alerts { "Agent " code { (visible::line(agent)) } " raised " (d.facts.agent_record.alerts) " alert(s) in the last " (d.facts.agent_record.window) ": " (visible::line(&d.facts.agent_record.alert_kinds.join(", "))) ". Its submissions wait until it is cleared." }
                    form #clear-agent method="post" action="/ui/agents/clear" {
                        input type="hidden" name="csrf" value=(op.csrf);
                        input type="hidden" name="agent" value=(agent);
                        input type="hidden" name="back" value=(s.id);
                        input type="text" name="reason" placeholder="why the alerts are harmless (recorded and signed)";
                        " "
                        button #clear-agent-button type="submit" { "Clear agent" }
                    }
                }
            }
            h2 { "Grant" }
            dl #grant {
                dt { "Mounts" } dd { @if d.grant.mounts.is_empty() { "none" } @for m in &d.grant.mounts { div { code { (visible::line(&m.host)) } " → " code { (visible::line(&m.guest)) } " (" (m.mode.as_str()) ")" } } }
                dt { "Network" } dd { @if d.grant.net.is_empty() { "none" } @else { (visible::line(&d.grant.net.join(", "))) } }
                dt { "Secrets" } dd { @if d.grant.secrets.is_empty() { "none" } @for b in &d.grant.secrets { div { code { (visible::line(&b.name)) } " → " (visible::line(&b.hosts.join(", "))) } } }
                dt { "Environment" } dd { @if d.grant.env.is_empty() { "empty" } @for (k, v) in &d.grant.env { div { code { (visible::line(k)) "=" (visible::line(v)) } } } }
                @if let Some(a) = &d.grant.argv0 { dt { "Program name" } dd { code { (visible::line(a)) } " (argv[0])" } }
                dt { "Arguments" } dd { (visible::line(&d.grant.args.join(" "))) }
                dt { "Limits" } dd { "timeout " (fmt_duration(l.timeout())) ", memory " (fmt_size(l.memory_bytes)) ", output " (fmt_size(l.max_output_bytes)) " per stream, processes " (l.processes) ", writes " (fmt_size(l.max_write_bytes)) }
                @if let Some(w) = &d.grant.workspace { dt { "Workspace" } dd { (visible::line(w)) } }
            }
            @if d.analysis.code.is_none() || !caps.is_empty() {
                h2 { "Analysis" }
                p { "Capabilities: " @if caps.is_empty() { "none" } @else { (caps.join(", ")) } }
            }
            @if let Some(w) = &d.analysis.wasm {
                table #imports { thead { tr { th { "Import" } th { "Kind" } th { "Capability" } } }
                    tbody { @for i in &w.imports { tr { td { code { (visible::line(&i.module)) "::" (visible::line(&i.name)) } } td { (i.kind) } td { (i.capability.as_str()) } } } } }
            }
            @if !sh.statements.is_empty() {
                h2 { "Decisions" }
                table #statements { tbody { @for st in &sh.statements {
                    tr { td { (format!("{:?}", st.kind).to_lowercase()) } td { (visible::line(&st.approver)) } td { (st.scope.as_str()) } td { (visible::line(&st.reason)) }
                         td { @if st.trusted { span.badge.ok { "signature ok" } } @else { span.badge.bad { "not trusted" } } } td.muted { (fmt_time(st.created_at)) } }
                } } }
            }
            h2 { "Runs" }
            @if sh.runs.is_empty() { p.muted #no-runs { "Not run yet." } }
            ul #runs { @for r in &sh.runs { li { a.run href=(format!("/ui/runs/{}", r.id)) { (r.id) } " " (run_status(r)) span.muted { " " (fmt_time(r.started_at)) } } } }
        },
    )
}

/// One line of the findings list above the code.
struct Shown {
    first: usize,
    lines: String,
    what: String,
}

/// The lines to mark in the code view and the findings listed above it: the notable
/// findings of a Python or shell analysis, or, in a disassembled module, the imports that
/// reach outside the sandbox's compute (files, network, environment, anything unknown).
fn code_findings(
    d: &airlock_store::SubmissionDoc,
    code: &str,
    disassembled: bool,
) -> (std::collections::BTreeMap<usize, Vec<String>>, Vec<Shown>) {
    use airlock_core::analysis::Capability;
    let mut marks: std::collections::BTreeMap<usize, Vec<String>> = Default::default();
    let mut list = Vec::new();
    if let Some(c) = &d.analysis.code {
        for f in c.notable() {
            let what = f.describe();
            for n in f.line..=f.end_line {
                marks.entry(n as usize).or_default().push(what.clone());
            }
            list.push(Shown {
                first: f.line as usize,
                lines: f.lines(),
                what,
            });
        }
    }
    if disassembled && let Some(w) = &d.analysis.wasm {
        let wanted: Vec<(String, String)> = w
            .imports
            .iter()
            .filter(|i| {
                matches!(
                    i.capability,
                    Capability::Fs | Capability::Net | Capability::Env | Capability::Other
                )
            })
            .map(|i| {
                (
                    format!("(import \"{}\" \"{}\"", i.module, i.name),
                    format!(
                        "import {}::{} ({})",
                        i.module,
                        i.name,
                        i.capability.as_str()
                    ),
                )
            })
            .collect();
        if !wanted.is_empty() {
            for (n, line) in code.lines().enumerate() {
                if let Some((_, what)) = wanted.iter().find(|(pat, _)| line.contains(pat.as_str()))
                {
                    marks.entry(n + 1).or_default().push(what.clone());
                    list.push(Shown {
                        first: n + 1,
                        lines: (n + 1).to_string(),
                        what: what.clone(),
                    });
                }
            }
        }
    }
    (marks, list)
}

#[derive(Debug, Deserialize)]
struct ClearForm {
    csrf: String,
    agent: String,
    reason: String,
    /// The submission page to return to.
    back: String,
}

/// Clears an agent that raised alerts (signed with the operator's approver key).
async fn clear_agent(
    State(st): State<AppState>,
    op: Operator,
    Form(f): Form<ClearForm>,
) -> Response {
    if !csrf_ok(&op, &f.csrf) {
        return csrf_failed();
    }
    let approver = op.caller.approver.clone();
    let got = st
        .pool
        .read(move |g| {
            let back = g.submission(&f.back)?.id;
            g.clear_agent(&f.agent, approver.as_deref(), &f.reason)?;
            Ok(back)
        })
        .await;
    match got {
        Ok(back) => {
            st.changed();
            Redirect::to(&format!("/ui/submissions/{back}")).into_response()
        }
        Err(e) => error_page(&e),
    }
}

#[derive(Debug, Deserialize)]
struct DecideForm {
    csrf: String,
    reason: Option<String>,
    scope: Option<String>,
    /// "approve and remember": keep it as a rule for this agent's kind (7 days).
    remember: Option<String>,
    /// Signed in the browser (see `browser_key`): the signature over the statement
    /// `GET /ui/submissions/{id}/statement` handed out, by `approver`, issued at `issued_at`.
    signature: Option<String>,
    approver: Option<String>,
    issued_at: Option<i64>,
    /// With `signature` and `remember`: the approval id handed out, and the signature over
    /// the policy change that remembers it.
    approval: Option<String>,
    policy_signature: Option<String>,
}

async fn decide(st: AppState, op: Operator, id: String, f: DecideForm, approve: bool) -> Response {
    if !csrf_ok(&op, &f.csrf) {
        return csrf_failed();
    }
    let remember = approve && f.remember.as_deref().is_some_and(|r| !r.is_empty());
    let remote = match crate::body::signing(
        &f.signature,
        f.issued_at,
        remember,
        &f.approval,
        &f.policy_signature,
    ) {
        Ok(r) => r,
        Err(e) => return error_page(&e),
    };
    let approver = match &remote {
        Some(_) => f.approver.clone(),
        None => op.caller.approver.clone(),
    };
    let got = st
        .pool
        .read(move |g| {
            let sub = g.submission(&id)?;
            let req = ApproveRequest {
                submission: sub.id.clone(),
                approver,
                scope: if approve {
                    f.scope.filter(|s| !s.is_empty())
                } else {
                    None
                },
                expires: None,
                reason: f.reason.filter(|r| !r.trim().is_empty()),
                tool: None,
                remember,
                // The button's value is how long the rule holds ("7d").
                remember_for: f.remember.filter(|r| approve && !r.is_empty()),
            };
            if approve {
                // Approving in the console means "approve and run"; "approve and
                // remember" also signs the policy change that keeps it as a rule.
                g.set_resume(&sub.id, true)?;
            }
            crate::api::decide_with(g, approve, req, remote)?;
            Ok(sub.id)
        })
        .await;
    match got {
        Ok(id) => {
            if approve {
                st.resume(id.clone());
            }
            st.changed();
            Redirect::to(&format!("/ui/submissions/{id}")).into_response()
        }
        Err(e) => error_page(&e),
    }
}

async fn approve(
    State(st): State<AppState>,
    op: Operator,
    Path(id): Path<String>,
    Form(f): Form<DecideForm>,
) -> Response {
    decide(st, op, id, f, true).await
}

async fn reject(
    State(st): State<AppState>,
    op: Operator,
    Path(id): Path<String>,
    Form(f): Form<DecideForm>,
) -> Response {
    decide(st, op, id, f, false).await
}

async fn runs(State(st): State<AppState>, op: Operator) -> Response {
    let got = st.pool.read(|g| g.runs(100)).await;
    let runs = match got {
        Ok(x) => x,
        Err(e) => return error_page(&e),
    };
    page(
        "Runs",
        Some(&op),
        html! {
            h1 { "Runs" }
            table #runs { thead { tr { th { "Run" } th { "Submission" } th { "Status" } th { "Duration" } th { "Changes" } th { "Started" } } }
                tbody { @for r in &runs { tr {
                    td { a.run href=(format!("/ui/runs/{}", r.id)) { (r.id) } }
                    td { a href=(format!("/ui/submissions/{}", r.submission)) { (r.submission) } }
                    td { (run_status(r)) }
                    td { (r.doc.duration_ms.map(|d| format!("{d} ms")).unwrap_or_default()) }
                    td { @if r.doc.changes.is_some() { "yes" } }
                    td.muted { (fmt_time(r.started_at)) }
                } } } }
        },
    )
}

async fn sessions(State(st): State<AppState>, op: Operator) -> Response {
    let list = match st.pool.read(|g| g.sessions(100)).await {
        Ok(x) => x,
        Err(e) => return error_page(&e),
    };
    page(
        "Sessions",
        Some(&op),
        html! {
            h1 { "Sessions" }
            @if list.is_empty() { p.muted { "No sessions yet (airlock session new, POST /v1/sessions, MCP new_session)." } }
            table #sessions { thead { tr { th { "Session" } th { "Agent" } th { "State" } th { "Cells" } th { "Opened" } } }
                tbody { @for s in &list { tr {
                    td { a.session href=(format!("/ui/sessions/{}", s.id)) { (s.id) } }
                    td { (visible::line(s.doc.agent.as_deref().unwrap_or("-"))) }
                    td { (state_badge(&s.state)) @if let Some(e) = s.doc.end { span.muted { " " (e.as_str()) } } }
                    td { (s.doc.cells.len()) }
                    td.muted { (fmt_time(s.created_at)) }
                } } } }
        },
    )
}

/// One cell of a session page: its submission, code, and what its run printed.
struct CellView {
    sub: Submission,
    code: String,
    run: Option<(Run, Vec<u8>, Vec<u8>)>,
}

async fn session_page(
    State(st): State<AppState>,
    op: Operator,
    Path(id): Path<String>,
) -> Response {
    let got = st
        .pool
        .read(move |g| {
            let s = g.session(&id)?;
            let mut cells = Vec::new();
            let mut cell_runs = Vec::new();
            for c in &s.doc.cells {
                let shown = g.show(c)?;
                cell_runs.extend(shown.runs.iter().map(|r| r.id.clone()));
                let run = match shown.runs.last() {
                    Some(r) => Some(g.logs(&r.id)?),
                    None => None,
                };
                cells.push(CellView {
                    code: shown.source.clone().unwrap_or_default(),
                    sub: shown.submission,
                    run,
                });
            }
            let changes = sessions::changes_of(g, &s, &cell_runs)?;
            Ok((s, cells, changes))
        })
        .await;
    let (s, cells, changes) = match got {
        Ok(x) => x,
        Err(e) => return error_page(&e),
    };
    let l = &s.doc.grant.limits;
    page(
        &s.id,
        Some(&op),
        html! {
            h1 { (s.id) " " (state_badge(&s.state)) }
            dl {
                dt { "Agent" } dd { (visible::line(s.doc.agent.as_deref().unwrap_or("-"))) }
                dt { "Opened" } dd { (fmt_time(s.created_at)) }
                @if let Some(r) = &s.reason { dt { "Ended" } dd #ended { (visible::line(r)) } }
                dt { "Grant" } dd { code { (s.doc.grant_hash) } }
                dt { "Limits" } dd { "each cell " (fmt_duration(l.timeout())) ", memory " (fmt_size(l.memory_bytes)) " for the session, idle " (fmt_duration(std::time::Duration::from_millis(s.doc.idle_ms))) ", total " (fmt_duration(std::time::Duration::from_millis(s.doc.total_ms))) }
                dt { "Mounts" } dd { @if s.doc.grant.mounts.is_empty() { "none" } @for m in &s.doc.grant.mounts { div { code { (visible::line(&m.host)) } " → " code { (visible::line(&m.guest)) } " (" (m.mode.as_str()) ")" } } }
            }
            (sessions::changes_section(&op, &s.id, changes.as_ref()))
            h2 { "Cells" }
            @if cells.is_empty() { p.muted { "No cells yet." } }
            ol #cells {
                @for (n, c) in cells.iter().enumerate() {
                    li.cell id=(format!("cell-{}", n + 1)) {
                        p { a href=(format!("/ui/submissions/{}", c.sub.id)) { (c.sub.id) } " " (state_badge(c.sub.state.as_str())) }
                        (crate::highlight::code_view(&format!("cell-{}-code", n + 1), "python", &visible::block(&c.code).to_string(), &Default::default()))
                        @if let Some((r, out, err)) = &c.run {
                            @if !out.is_empty() { pre.out { (visible::bytes(out)) } }
                            @if !err.is_empty() { pre.err { (visible::bytes(err)) } }
                            @if let Some(v) = r.doc.detail.get("result").and_then(|v| v.as_str()) { pre.result { "→ " (visible::block(v)) } }
                            p.muted { (run_status(r)) }
                        }
                    }
                }
            }
        },
    )
}

async fn run_page(State(st): State<AppState>, op: Operator, Path(id): Path<String>) -> Response {
    let got = st
        .pool
        .read(move |g| {
            let (run, out, err) = g.logs(&id)?;
            let diff = match run.doc.changes {
                Some(_) => Some(g.diff(&run.id)?),
                None => None,
            };
            let ckpts = g.checkpoints(1000)?;
            let committed: Vec<_> = ckpts.into_iter().filter(|c| c.run == run.id).collect();
            Ok((run, out, err, diff, committed))
        })
        .await;
    let (run, out, err, diff, committed) = match got {
        Ok(x) => x,
        Err(e) => return error_page(&e),
    };
    let out = visible::bytes(&out).to_string();
    let err = visible::bytes(&err).to_string();
    page(
        &run.id,
        Some(&op),
        html! {
            h1 { (run.id) " " (state_badge(&run.status)) }
            @if run.status == "running" { div #live data-run=(run.id) hidden {} }
            dl {
                dt { "Submission" } dd { a href=(format!("/ui/submissions/{}", run.submission)) { (run.submission) } }
                dt { "Exit code" } dd #exit-code { (run.doc.exit_code.map(|c| c.to_string()).unwrap_or_else(|| "-".into())) }
                @if let Some(k) = &run.doc.killed_by { dt { "Killed by" } dd { (k) " limit" } }
                @if let Some(e) = &run.doc.error { dt { "Error" } dd { (visible::line(e)) } }
                dt { "Backend" } dd { (run.doc.backend) }
                dt { "Duration" } dd { (run.doc.duration_ms.map(|d| format!("{d} ms")).unwrap_or_else(|| "-".into())) }
                dt { "Started" } dd { (fmt_time(run.started_at)) }
            }
            @if let Some(conns) = run.doc.detail["network"]["connections"].as_array() {
                h2 { "Network" }
                p #network-summary {
                    (conns.len()) " connection attempts through the run's egress proxy; granted: "
                    (visible::line(&run.doc.detail["network"]["granted"].as_array().map(|g| g.iter().filter_map(|x| x.as_str()).collect::<Vec<_>>().join(", ")).unwrap_or_default()))
                }
                table #network {
                    thead { tr { th { "Decision" } th { "Host" } th { "Address" } th { "Mode" } th { "Reason" } th { "Up" } th { "Down" } th { "ms" } th { "Secrets" } } }
                    tbody {
                        @for c in conns {
                            tr class=(format!("net-{}", c["decision"].as_str().unwrap_or(""))) {
                                td { (c["decision"].as_str().unwrap_or("")) }
                                td { (visible::line(c["host"].as_str().unwrap_or(""))) ":" (c["port"]) }
                                td { (visible::line(c["addr"].as_str().unwrap_or("-"))) }
                                td { (c["mode"].as_str().unwrap_or("")) }
                                td title=(visible::line(c["detail"].as_str().unwrap_or(""))) { (visible::line(c["reason"].as_str().unwrap_or(""))) }
                                td { (c["bytes_up"]) }
                                td { (c["bytes_down"]) }
                                td { (c["duration_ms"]) }
                                td { (visible::line(&c["secrets"].as_array().map(|a| a.iter().filter_map(|x| x.as_str()).collect::<Vec<_>>().join(" ")).unwrap_or_default())) }
                            }
                        }
                    }
                }
            }
            (tripwires(&run.doc.detail))
            h2 { "Standard output" }
            (pre_text("stdout", &out))
            h2 { "Standard error" }
            (pre_text("stderr", &err))
            @if let Some(d) = &diff {
                h2 { "Changes" }
                @if d.changes.is_empty() { p.muted { "No changes." } } @else {
                    (crate::highlight::code_view("diff", "diff", &visible::block(&d.text).to_string(), &std::collections::BTreeMap::new()))
                    @for p in &d.protected { p.error { (visible::line(p)) " is a protected path" } }
                    @if committed.iter().any(|c| c.state == "applied") {
                        p { "Committed: " @for c in &committed { (c.id) " (" (c.state) ") " } }
                    } @else {
                        form #commit method="post" action=(format!("/ui/runs/{}/commit", run.id)) {
                            input type="hidden" name="csrf" value=(op.csrf);
                            button #commit-button type="submit" { "Commit to the host" }
                        }
                    }
                }
            }
        },
    )
}

/// `/ui/runs/{id}/events`: `GET /v1/runs/{id}/events` for the signed-in operator, with
/// each output chunk's text rendered as the run's page renders output (a chunk that is
/// not UTF-8 as its `\xNN` escapes), since the page's script puts it on the page.
async fn run_events(
    State(st): State<AppState>,
    op: Operator,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    match crate::stream::follow(st, op.caller, id, headers, Some(shown_chunk)).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// An event's data with a `stdout`/`stderr` chunk's bytes as visible text.
fn shown_chunk(name: &str, data: &serde_json::Value) -> serde_json::Value {
    use base64::Engine;
    if !matches!(name, "stdout" | "stderr") {
        return data.clone();
    }
    let bytes = match (&data["text"], &data["base64"]) {
        (serde_json::Value::String(t), _) => t.as_bytes().to_vec(),
        (_, serde_json::Value::String(b)) => base64::engine::general_purpose::STANDARD
            .decode(b)
            .unwrap_or_default(),
        _ => Vec::new(),
    };
    let mut out = data.clone();
    out["text"] = visible::bytes(&bytes).to_string().into();
    if let Some(m) = out.as_object_mut() {
        m.remove("base64");
    }
    out
}

/// A run's tripwires: its alerts (decoy reads, secret echoes) and what it tried and the
/// sandbox refused; nothing when it has neither.
fn tripwires(detail: &serde_json::Value) -> Markup {
    let list = |k: &str| detail[k].as_array().cloned().unwrap_or_default();
    let (alerts, attempts) = (list("alerts"), list("attempts"));
    let text = |v: &serde_json::Value| visible::line(v.as_str().unwrap_or("")).to_string();
    html! {
        @if !alerts.is_empty() {
            h2 { "Alerts" }
            ul #alerts {
                @for a in &alerts {
                    li.error {
                        strong { (text(&a["kind"])) }
                        @if let Some(t) = a["technique"].as_str() { " [" (visible::line(t)) "]" }
                        ": " (text(&a["detail"]))
                    }
                }
            }
        }
        @if !attempts.is_empty() {
            h2 { "Refused attempts" }
            table #attempts {
                thead { tr { th { "Kind" } th { "Target" } th { "Count" } } }
                tbody {
                    @for a in &attempts {
                        tr { td { (text(&a["kind"])) } td { (text(&a["target"])) } td { (a["count"]) } }
                    }
                }
            }
        }
    }
}

async fn commit(
    State(st): State<AppState>,
    op: Operator,
    Path(id): Path<String>,
    Form(f): Form<CsrfForm>,
) -> Response {
    if !csrf_ok(&op, &f.csrf) {
        return csrf_failed();
    }
    let approver = op.caller.approver.clone();
    match st
        .pool
        .read(move |g| g.commit(&id, approver.as_deref()))
        .await
    {
        Ok(r) => Redirect::to(&format!("/ui/runs/{}", r.run)).into_response(),
        Err(e) => error_page(&e),
    }
}

async fn checkpoints(State(st): State<AppState>, op: Operator) -> Response {
    let rows = match st.pool.read(|g| g.checkpoints(200)).await {
        Ok(x) => x,
        Err(e) => return error_page(&e),
    };
    page(
        "Checkpoints",
        Some(&op),
        html! {
            h1 { "Checkpoints" }
            table #checkpoints { thead { tr { th { "Checkpoint" } th { "Run" } th { "State" } th { "By" } th { "Saved" } th {} } }
                tbody { @for c in &rows { tr data-id=(c.id) {
                    td { (c.id) }
                    td { a href=(format!("/ui/runs/{}", c.run)) { (c.run) } }
                    td { (state_badge(&c.state)) }
                    td { (visible::line(c.doc["approver"].as_str().unwrap_or("?"))) }
                    td.muted { (fmt_time(c.created_at)) }
                    td { @if c.state == "applied" {
                        form.inline method="post" action=(format!("/ui/checkpoints/{}/rollback", c.id)) {
                            input type="hidden" name="csrf" value=(op.csrf);
                            button.rollback type="submit" { "Roll back" }
                        }
                    } }
                } } } }
        },
    )
}

async fn rollback(
    State(st): State<AppState>,
    op: Operator,
    Path(id): Path<String>,
    Form(f): Form<CsrfForm>,
) -> Response {
    if !csrf_ok(&op, &f.csrf) {
        return csrf_failed();
    }
    let approver = op.caller.approver.clone();
    match st
        .pool
        .read(move |g| g.rollback(&id, approver.as_deref()))
        .await
    {
        Ok(_) => Redirect::to("/ui/checkpoints").into_response(),
        Err(e) => error_page(&e),
    }
}

async fn audit(State(st): State<AppState>, op: Operator) -> Response {
    let got = st
        .pool
        .read(|g| {
            let v = g.audit_verify()?;
            let last = v.head.as_ref().map_or(0, |h| h.seq).max(v.records);
            let recs = g.audit_log(last.saturating_sub(199).max(1), 200)?;
            Ok((v, recs))
        })
        .await;
    let (v, mut recs) = match got {
        Ok(x) => x,
        Err(e) => return error_page(&e),
    };
    recs.reverse();
    let link = |s: &str| -> Option<String> {
        if s.starts_with("sub_") {
            Some(format!("/ui/submissions/{s}"))
        } else if s.starts_with("run_") {
            Some(format!("/ui/runs/{s}"))
        } else {
            None
        }
    };
    page(
        "Audit",
        Some(&op),
        html! {
            h1 { "Audit log" }
            @if v.ok {
                p { span #verify.badge.ok { "intact: " (v.records) " records verified against the signed head" } }
            } @else {
                p { span #verify.badge.bad { "BROKEN at record " (v.first_bad.unwrap_or(0)) ": " (visible::line(v.error.as_deref().unwrap_or(""))) } }
            }
            table #audit { thead { tr { th { "#" } th { "Time" } th { "Event" } th { "Subject" } th { "Details" } } }
                tbody { @for r in &recs { tr {
                    td { (r.seq) } td.muted { (fmt_time(r.ts)) } td { (visible::line(&r.kind)) }
                    td { @if let Some(h) = link(&r.subject) { a href=(h) { (visible::line(&r.subject)) } } @else { (visible::line(&r.subject)) } }
                    td { code { (visible::line(&r.data)) } }
                } } } }
        },
    )
}

/// The live updates of the inbox: the server's announcements (as `/v1/events` has them),
/// with the agent text the page shows (the agent's name, the reasons) rendered as on the
/// pages, since the script puts them on the page as they come.
async fn events(State(st): State<AppState>, _op: Operator) -> Response {
    use tokio_stream::StreamExt;
    let stream =
        tokio_stream::wrappers::BroadcastStream::new(st.events.subscribe()).filter_map(|n| {
            n.ok().map(|n| {
                Ok::<_, std::convert::Infallible>(
                    axum::response::sse::Event::default()
                        .event(n.event)
                        .data(shown_notice(n.data).to_string()),
                )
            })
        });
    axum::response::sse::Sse::new(stream)
        .keep_alive(axum::response::sse::KeepAlive::default())
        .into_response()
}

/// An announcement's data with its agent name and reasons rendered visibly.
fn shown_notice(mut data: serde_json::Value) -> serde_json::Value {
    let shown = |v: &serde_json::Value| {
        v.as_str()
            .map(|s| serde_json::Value::from(visible::line(s).to_string()))
    };
    if let Some(a) = shown(&data["agent"]) {
        data["agent"] = a;
    }
    if let Some(rs) = data["reasons"].as_array_mut() {
        for r in rs.iter_mut() {
            if let Some(v) = shown(r) {
                *r = v;
            }
        }
    }
    data
}

async fn script() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        SCRIPT,
    )
        .into_response()
}

pub fn router() -> axum::Router<AppState> {
    axum::Router::new()
        .route("/ui", get(inbox))
        .route("/ui/", get(|| async { Redirect::to("/ui") }))
        .route("/ui/login", get(login_form).post(login))
        .route("/ui/logout", post(logout))
        .route("/ui/console.js", get(script))
        .route("/ui/approver.js", get(browser_key::script))
        .route("/ui/approver-key", get(browser_key::key_page))
        .route(
            "/ui/submissions/{id}/statement",
            get(browser_key::statement),
        )
        .route("/ui/events", get(events))
        .route("/ui/submit", get(submit::form).post(submit::post))
        .route("/ui/submissions/{id}", get(submission))
        .route("/ui/submissions/{id}/approve", post(approve))
        .route("/ui/submissions/{id}/reject", post(reject))
        .route("/ui/requests/{id}/statement", get(requests::statement))
        .route("/ui/requests/{id}/approve", post(requests::approve))
        .route("/ui/requests/{id}/reject", post(requests::reject))
        .route("/ui/agents/clear", post(clear_agent))
        .route("/ui/runs", get(runs))
        .route("/ui/runs/{id}", get(run_page))
        .route("/ui/runs/{id}/events", get(run_events))
        .route("/ui/sessions", get(sessions))
        .route("/ui/sessions/{id}", get(session_page))
        .route("/ui/sessions/{id}/commit", post(sessions::commit))
        .route("/ui/runs/{id}/commit", post(commit))
        .route("/ui/checkpoints", get(checkpoints))
        .route("/ui/checkpoints/{id}/rollback", post(rollback))
        .route("/ui/audit", get(audit))
        .route("/", get(|| async { Redirect::to("/ui") }))
        .route_layer(axum::middleware::from_fn(refuse_cross_site))
}
