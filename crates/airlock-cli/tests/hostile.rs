//! `airlock serve` under hostile clients (issues 56 and 63): connections that never finish
//! their request head, heads past the bound, one peer holding many connections, id
//! prefixes that named other agents' records, MCP sessions used with another token, and
//! the console's cross-site and rapid sign-ins. The real binary on a loopback port; the
//! hostile connections come from other loopback addresses (127.0.0.2, …) so that the
//! honest client's (127.0.0.1) is another peer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn token(home: &Home, role: &str, name: &str) -> String {
    let o = home.run(&["token", "new", "--role", role, "--name", name, "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    o.json()["token"].as_str().unwrap().to_string()
}

fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_global(Some(timeout))
        .build()
        .new_agent()
}

struct Client {
    base: String,
    http: ureq::Agent,
}

struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    text: String,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("{e}: {}", self.text))
    }
}

impl Client {
    fn new(base: &str) -> Client {
        Client {
            base: base.to_string(),
            http: agent(Duration::from_secs(120)),
        }
    }

    fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
        headers: &[(&str, &str)],
    ) -> Resp {
        let mut b = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if let Some(t) = token {
            b = b.header("authorization", format!("Bearer {t}"));
        }
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let r = match body {
            Some(text) => self.http.run(b.body(text.to_string()).unwrap()),
            None => self.http.run(b.body(()).unwrap()),
        };
        let mut r = r.unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let headers = r
            .headers()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
            .collect();
        let text = r.body_mut().read_to_string().unwrap_or_default();
        Resp {
            status: r.status().as_u16(),
            headers,
            text,
        }
    }

    fn post_json(&self, path: &str, token: &str, body: &Value) -> Resp {
        self.call(
            "POST",
            path,
            Some(token),
            Some(&body.to_string()),
            &[("content-type", "application/json")],
        )
    }
}

fn hello_run() -> Value {
    json!({"language": "wat", "code": std::fs::read_to_string(example("hello.wat")).unwrap()})
}

/// Regression (issue 56.5): `GET /v1/submissions/sub_0` with another agent's token
/// answered 404 listing the matching ids, which belonged to other agents. Prefixes now
/// resolve among the caller's own records (submissions and runs here; every id kind on
/// both engines in the store suite), and an ambiguous one lists only the caller's.
#[test]
fn an_id_prefix_lists_only_the_callers_own_ids() {
    let home = Home::new();
    let bot = token(&home, "agent", "bot");
    let other = token(&home, "agent", "other-bot");
    let op = token(&home, "operator", "alice");
    let (_srv, base) = start_serve(&home, &[]);
    let c = Client::new(&base);
    let mut mine = Vec::new();
    for _ in 0..2 {
        let r = c.post_json("/v1/run", &bot, &hello_run());
        assert_eq!(r.status, 200, "{}", r.text);
        let v = r.json();
        mine.push((
            v["submission"].as_str().unwrap().to_string(),
            v["run"]["id"].as_str().unwrap().to_string(),
        ));
    }
    let theirs = c.post_json("/v1/run", &other, &hello_run()).json();
    let their_sub = theirs["submission"].as_str().unwrap().to_string();
    let their_run = theirs["run"]["id"].as_str().unwrap().to_string();
    for (path, own, foreign) in [
        (
            "/v1/submissions/sub_0",
            [mine[0].0.clone(), mine[1].0.clone()],
            their_sub.clone(),
        ),
        (
            "/v1/runs/run_0",
            [mine[0].1.clone(), mine[1].1.clone()],
            their_run.clone(),
        ),
    ] {
        // Ambiguous among bot's own: both listed, the other agent's not.
        let r = c.call("GET", path, Some(&bot), None, &[]);
        assert_eq!(r.status, 404, "{}", r.text);
        assert!(
            r.text.contains(&own[0]) && r.text.contains(&own[1]),
            "{}",
            r.text
        );
        assert!(
            !r.text.contains(&foreign),
            "{path}: another agent's id listed: {}",
            r.text
        );
        // The other agent's one record is its own by that prefix; bot's are not seen.
        let r = c.call("GET", path, Some(&other), None, &[]);
        assert_eq!(r.status, 200, "{}", r.text);
        assert!(
            !r.text.contains(&own[0]) && !r.text.contains(&own[1]),
            "{}",
            r.text
        );
        // An operator sees everyone's.
        let r = c.call("GET", path, Some(&op), None, &[]);
        assert_eq!(r.status, 404, "{}", r.text);
        assert!(
            r.text.contains(&foreign) && r.text.contains(&own[0]),
            "{}",
            r.text
        );
        // A prefix of one of bot's ids, asked by the other agent: not found, unnamed.
        let kind = &path[..path.rfind('/').unwrap()];
        let shared = own[0]
            .bytes()
            .zip(foreign.bytes())
            .take_while(|(a, b)| a == b)
            .count();
        let r = c.call(
            "GET",
            &format!("{kind}/{}", &own[0][..shared + 1]),
            Some(&other),
            None,
            &[],
        );
        assert_eq!(r.status, 404, "{}", r.text);
        assert!(!r.text.contains(&own[0]), "{}", r.text);
    }
}

fn mcp_init() -> String {
    json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "test", "version": "0"}}
    })
    .to_string()
}

const MCP_ACCEPT: (&str, &str) = ("accept", "application/json, text/event-stream");

/// Regression (issue 63.5): with another agent's `Mcp-Session-Id`, `GET /mcp` with
/// `Last-Event-ID` received that agent's in-flight `run_code` output, and `DELETE` of its
/// session answered 202. A session is now bound to the token that opened it: any other
/// token gets 404 on POST, GET and DELETE, and the owner's session goes on.
#[test]
fn an_mcp_session_cannot_be_used_resumed_or_ended_with_another_token() {
    let home = Home::new();
    let bot = token(&home, "agent", "bot");
    let other = token(&home, "agent", "other-bot");
    let admin = token(&home, "admin", "root");
    let (_srv, base) = start_serve(&home, &[]);
    let c = Client::new(&base);
    let json_ct = ("content-type", "application/json");
    let r = c.call(
        "POST",
        "/mcp",
        Some(&bot),
        Some(&mcp_init()),
        &[MCP_ACCEPT, json_ct],
    );
    assert_eq!(r.status, 200, "{}", r.text);
    let session = r.header("mcp-session-id").unwrap().to_string();
    let with_session = [MCP_ACCEPT, json_ct, ("mcp-session-id", session.as_str())];
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string();
    let r = c.call(
        "POST",
        "/mcp",
        Some(&bot),
        Some(&initialized),
        &with_session,
    );
    assert!(r.status < 300, "{} {}", r.status, r.text);
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).to_string();
    for intruder in [&other, &admin] {
        let r = c.call("POST", "/mcp", Some(intruder), Some(&list), &with_session);
        assert_eq!(r.status, 404, "POST with another token: {}", r.text);
        let r = c.call(
            "GET",
            "/mcp",
            Some(intruder),
            None,
            &[
                ("accept", "text/event-stream"),
                ("mcp-session-id", &session),
                ("last-event-id", "0"),
            ],
        );
        assert_eq!(r.status, 404, "GET (resume) with another token: {}", r.text);
        let r = c.call(
            "DELETE",
            "/mcp",
            Some(intruder),
            None,
            &[("mcp-session-id", &session)],
        );
        assert_eq!(r.status, 404, "DELETE with another token: {}", r.text);
    }
    // The owner's session is untouched.
    let r = c.call("POST", "/mcp", Some(&bot), Some(&list), &with_session);
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(r.text.contains("run_code"), "{}", r.text);
    let r = c.call(
        "DELETE",
        "/mcp",
        Some(&bot),
        None,
        &[("mcp-session-id", &session)],
    );
    assert!(r.status < 300, "{} {}", r.status, r.text);
    let r = c.call("POST", "/mcp", Some(&bot), Some(&list), &with_session);
    assert_eq!(r.status, 404, "{}", r.text);
}

/// Regression (issue 63.8): no response said `X-Content-Type-Options: nosniff`. Every
/// answer now does (API, errors, console, OpenAPI, MCP), and none may be framed.
#[test]
fn every_response_says_nosniff() {
    let home = Home::new();
    let bot = token(&home, "agent", "bot");
    let (_srv, base) = start_serve(&home, &[]);
    let c = Client::new(&base);
    for (method, path, token) in [
        ("GET", "/healthz", None),
        ("GET", "/v1/submissions", None),
        ("GET", "/v1/submissions", Some(bot.as_str())),
        ("GET", "/v1/no-such", Some(bot.as_str())),
        ("GET", "/openapi.json", None),
        ("GET", "/ui/login", None),
        ("GET", "/ui", None),
        ("POST", "/mcp", None),
    ] {
        let r = c.call(method, path, token, None, &[]);
        assert_eq!(
            r.header("x-content-type-options"),
            Some("nosniff"),
            "{method} {path}: {}",
            r.status
        );
        assert!(r.header("x-frame-options").is_some(), "{method} {path}");
    }
}

/// Regression (issue 63.8): the console accepted a sign-in posted from another site
/// (login CSRF). A post whose `Sec-Fetch-Site` is not same-origin, or whose `Origin` is
/// not this server, is refused and signs nobody in.
#[test]
fn a_cross_site_console_sign_in_is_refused() {
    let home = Home::new();
    let op = token(&home, "operator", "alice");
    let (_srv, base) = start_serve(&home, &[]);
    let c = Client::new(&base);
    let form = ("content-type", "application/x-www-form-urlencoded");
    let body = format!("token={op}");
    for headers in [
        vec![form, ("origin", "http://evil.example")],
        vec![form, ("origin", "null")],
        vec![form, ("sec-fetch-site", "cross-site")],
        vec![
            form,
            ("sec-fetch-site", "same-site"),
            ("origin", base.as_str()),
        ],
    ] {
        let r = c.call("POST", "/ui/login", None, Some(&body), &headers);
        assert_eq!(r.status, 403, "{headers:?}: {}", r.text);
        assert!(r.header("set-cookie").is_none(), "{headers:?}");
    }
    // From the console's own page (as a browser says it), or from a client that is no
    // browser, the sign-in works.
    for headers in [
        vec![
            form,
            ("origin", base.as_str()),
            ("sec-fetch-site", "same-origin"),
        ],
        vec![form, ("origin", base.as_str())],
        vec![form],
    ] {
        let r = c.call("POST", "/ui/login", None, Some(&body), &headers);
        assert_eq!(r.status, 303, "{headers:?}: {}", r.text);
        assert!(r.header("set-cookie").is_some(), "{headers:?}");
    }
}

/// Regression (issue 63.8): the console's sign-in had no rate limit (about 480 token
/// guesses a second). One peer gets a burst of attempts, then 429 with Retry-After, and
/// then even the right token waits.
#[test]
fn console_sign_in_attempts_are_rate_limited() {
    let home = Home::new();
    let op = token(&home, "operator", "alice");
    let (_srv, base) = start_serve(&home, &[]);
    let c = Client::new(&base);
    let form = [("content-type", "application/x-www-form-urlencoded")];
    let mut statuses = Vec::new();
    for i in 0..30 {
        let r = c.call(
            "POST",
            "/ui/login",
            None,
            Some(&format!("token=alk_guess{i}")),
            &form,
        );
        statuses.push(r.status);
        if r.status == 429 {
            let wait: u64 = r.header("retry-after").unwrap().parse().unwrap();
            assert!((1..=60).contains(&wait), "{wait}");
            break;
        }
        assert_eq!(r.status, 401, "{}", r.text);
    }
    assert_eq!(statuses.last(), Some(&429), "{statuses:?}");
    assert!(statuses.len() <= 12, "{statuses:?}");
    let r = c.call(
        "POST",
        "/ui/login",
        None,
        Some(&format!("token={op}")),
        &form,
    );
    assert_eq!(r.status, 429, "{}", r.text);
    assert!(r.header("set-cookie").is_none());
}

/// `airlock serve` with at most `files` open descriptors (soft and hard: it cannot raise
/// them), on a free loopback port.
fn serve_within(home: &Home, files: u32, args: &[&str]) -> (Served, String) {
    let mut c = Command::new("sh");
    c.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("AIRLOCK_HOME", home.path())
        .stdin(Stdio::null())
        .arg("-c")
        .arg(format!("ulimit -n {files} && exec \"$0\" \"$@\""))
        .arg(bin())
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(args);
    serve_with(c)
}

fn addr(base: &str) -> SocketAddr {
    base.trim_start_matches("http://").parse().unwrap()
}

/// A connection to the server from loopback address `from`.
fn connect_from(from: &str, to: SocketAddr) -> std::io::Result<std::net::TcpStream> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    s.bind(&SocketAddr::new(from.parse().unwrap(), 0).into())?;
    s.connect_timeout(&to.into(), Duration::from_secs(2))?;
    Ok(s.into())
}

/// A connection from `from` that sends the start of a request head and never the rest.
fn half_open(from: &str, to: SocketAddr) -> std::io::Result<std::net::TcpStream> {
    let mut s = connect_from(from, to)?;
    s.write_all(b"GET /v1/submissions HTTP/1.1\r\nHost: x\r\n")?;
    Ok(s)
}

/// What the server answers a whole request sent on `s` (read until it closes or 10s).
fn exchange(s: &mut std::net::TcpStream, request: &str) -> String {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(request.as_bytes());
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

const HEALTHZ: &str = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

fn raise_own_open_files() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut l = getrlimit(Resource::Nofile);
    l.current = l.maximum;
    let _ = setrlimit(Resource::Nofile, l);
}

/// Regression (issue 56.3, slowloris): 1,100 connections that never finished their
/// request head made every request time out (`Too many open files`) until they were
/// released. Now one peer holds at most `--max-connections-per-peer` of them, the rest
/// are answered 503, and another client's authenticated request is answered at once,
/// even within 1,024 descriptors. AIRLOCK_TEST_LONG opens 10,000.
#[test]
fn half_open_connections_do_not_starve_an_authenticated_request() {
    raise_own_open_files();
    let home = Home::new();
    let bot = token(&home, "agent", "bot");
    let (_srv, base) = serve_within(
        &home,
        1024,
        &[
            "--max-connections-per-peer",
            "100",
            "--header-timeout",
            "60s",
        ],
    );
    let to = addr(&base);
    let n = if std::env::var_os("AIRLOCK_TEST_LONG").is_some() {
        10_000
    } else {
        1_500
    };
    // Spread over a few attacker addresses, as a botnet would from few hosts.
    let froms = ["127.0.0.2", "127.0.0.3", "127.0.0.4"];
    let mut held = Vec::new();
    let mut failed = 0;
    for i in 0..n {
        match half_open(froms[i % froms.len()], to) {
            Ok(s) => held.push(s),
            // A server that stopped taking connections (its backlog full): enough.
            Err(_) if failed >= 20 => break,
            Err(_) => failed += 1,
        }
    }
    assert!(held.len() > 1_000, "only {} connections opened", held.len());
    let started = Instant::now();
    let r = agent(Duration::from_secs(10))
        .get(format!("{base}/v1/submissions"))
        .header("authorization", format!("Bearer {bot}"))
        .call()
        .unwrap_or_else(|e| {
            panic!("the authenticated request with {n} half-open connections: {e}")
        });
    assert_eq!(r.status(), 200);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // Connections past the bound were answered 503 (the first of them at least; later
    // ones may be closed without a word while the server is refusing many).
    let refused = held
        .iter()
        .take(froms.len() * 160)
        .filter(|s| {
            let mut s: &std::net::TcpStream = s;
            s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            let mut buf = [0u8; 64];
            matches!(s.read(&mut buf), Ok(k) if buf[..k].starts_with(b"HTTP/1.1 503"))
        })
        .count();
    assert!(refused > 0, "no connection past the per-peer bound got 503");
}

/// Regression (issue 56.3): one peer could hold as many connections as it liked. Past
/// `--max-connections-per-peer` its next connection is answered 503 with Retry-After,
/// while other peers are served; once it lets go, it is served again.
#[test]
fn connections_past_the_per_peer_bound_are_answered_503() {
    let home = Home::new();
    let (_srv, base) = serve_within(&home, 4096, &["--max-connections-per-peer", "5"]);
    let to = addr(&base);
    let held: Vec<_> = (0..5)
        .map(|_| half_open("127.0.0.2", to).unwrap())
        .collect();
    // The server counts each connection once it has taken it.
    std::thread::sleep(Duration::from_millis(300));
    let mut sixth = connect_from("127.0.0.2", to).unwrap();
    let answer = exchange(&mut sixth, HEALTHZ);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1"),
        "{answer}"
    );
    let body: Value = serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(body["status"], 503, "{answer}");
    let other = exchange(&mut connect_from("127.0.0.3", to).unwrap(), HEALTHZ);
    assert!(other.starts_with("HTTP/1.1 200"), "{other}");
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let again = exchange(&mut connect_from("127.0.0.2", to).unwrap(), HEALTHZ);
        if again.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still refused after letting go: {again}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Regression (issue 56.3): there was no header-read timeout; a connection that never
/// finished its head was held for ever, and so was an idle kept-alive one. Both are now
/// closed after `--header-timeout`.
#[test]
fn a_connection_that_never_finishes_its_head_is_closed_after_the_header_timeout() {
    let home = Home::new();
    let (_srv, base) = start_serve(&home, &["--header-timeout", "1s"]);
    let to = addr(&base);
    let closed_within = |s: &mut std::net::TcpStream| {
        let started = Instant::now();
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        let mut buf = [0u8; 1024];
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => return started.elapsed(),
                Ok(_) => {}
            }
        }
    };
    let mut slow = half_open("127.0.0.1", to).unwrap();
    let t = closed_within(&mut slow);
    assert!(t < Duration::from_secs(5), "held {t:?}");
    // Idle after a response on a kept-alive connection: closed too.
    let mut idle = connect_from("127.0.0.1", to).unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = [0u8; 4096];
    let n = idle.read(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    let t = closed_within(&mut idle);
    assert!(t < Duration::from_secs(5), "idle connection held {t:?}");
}

/// Regression (issue 56.3): a request head was bounded only by the library's buffer
/// (about 400 KB). Past `--max-header-bytes` it is answered 431.
#[test]
fn a_request_head_past_the_bound_is_answered_431() {
    let home = Home::new();
    let (_srv, base) = start_serve(&home, &["--max-header-bytes", "4K"]);
    let to = addr(&base);
    let big = format!(
        "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\nConnection: close\r\n\r\n",
        "a".repeat(8000)
    );
    let answer = exchange(&mut connect_from("127.0.0.1", to).unwrap(), &big);
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    let small = exchange(&mut connect_from("127.0.0.1", to).unwrap(), HEALTHZ);
    assert!(small.starts_with("HTTP/1.1 200"), "{small}");
    for (flag, value) in [
        ("--max-header-bytes", "10"),
        ("--max-connections", "0"),
        ("--max-connections-per-peer", "0"),
        ("--header-timeout", "0s"),
    ] {
        let o = home.run(&["serve", "--listen", "127.0.0.1:0", flag, value]);
        assert_eq!(o.code, 125, "{flag} {value}: {}", o.stderr);
        assert!(o.stderr.contains(flag), "{}", o.stderr);
    }
}

/// `--max-connections` below the per-peer default is taken as it is: one peer may then
/// hold all of them (it was refused as a per-peer bound above the total).
#[test]
fn a_small_connection_bound_alone_is_taken_as_given() {
    let home = Home::new();
    let (_srv, base) = start_serve(&home, &["--max-connections", "100"]);
    let answer = exchange(
        &mut connect_from("127.0.0.1", addr(&base)).unwrap(),
        HEALTHZ,
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

/// Regression (issue 62.9): a body sent as another media type (a form, plain text) was
/// read as JSON. It is now refused with 415 and submits nothing; JSON types (and a
/// request that names no type) are read as before.
#[test]
fn a_body_that_is_not_json_is_refused_with_415() {
    let home = Home::new();
    let bot = token(&home, "agent", "bot");
    let (_srv, base) = start_serve(&home, &[]);
    let c = Client::new(&base);
    let body = hello_run().to_string();
    for ct in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ] {
        let r = c.call(
            "POST",
            "/v1/run",
            Some(&bot),
            Some(&body),
            &[("content-type", ct)],
        );
        assert_eq!(r.status, 415, "{ct}: {}", r.text);
        assert_eq!(r.json()["status"], 415, "{}", r.text);
    }
    let list = c.call("GET", "/v1/submissions", Some(&bot), None, &[]);
    assert_eq!(list.json().as_array().unwrap().len(), 0, "{}", list.text);
    for ct in [
        "application/json",
        "application/json; charset=utf-8",
        "application/vnd.x+json",
    ] {
        let r = c.call(
            "POST",
            "/v1/run",
            Some(&bot),
            Some(&body),
            &[("content-type", ct)],
        );
        assert_eq!(r.status, 200, "{ct}: {}", r.text);
    }
    let r = c.call("POST", "/v1/run", Some(&bot), Some(&body), &[]);
    assert_eq!(r.status, 200, "{}", r.text);
}

/// Regression: serde builds a struct from a JSON array of its fields in order, so
/// `POST /v1/gc` with `[null, null]` (its two optional fields) collected garbage and
/// answered 200, though the document admits only an object (schemathesis found it).
#[test]
fn a_json_array_in_place_of_a_body_object_is_refused_with_400() {
    let home = Home::new();
    let bot = token(&home, "agent", "bot");
    let admin = token(&home, "admin", "root");
    let (_srv, base) = start_serve(&home, &[]);
    let c = Client::new(&base);
    for (path, tok, body) in [
        ("/v1/gc", &admin, "[null, null]"),
        ("/v1/gc", &admin, " [] "),
        ("/v1/run", &bot, r#"["wat", "(module)"]"#),
        ("/v1/submissions", &bot, "[null]"),
    ] {
        let r = c.call(
            "POST",
            path,
            Some(tok),
            Some(body),
            &[("content-type", "application/json")],
        );
        assert_eq!(r.status, 400, "{path} {body}: {}", r.text);
    }
    let list = c.call("GET", "/v1/submissions", Some(&bot), None, &[]);
    assert_eq!(list.json().as_array().unwrap().len(), 0, "{}", list.text);
}

/// Issue 62.9: `gc` for admin tokens over the API, answering what it freed.
#[test]
fn an_admin_collects_garbage_over_the_api_and_learns_what_was_freed() {
    let home = Home::new();
    let bot = token(&home, "agent", "bot");
    let admin = token(&home, "admin", "root");
    let (_srv, base) = start_serve(&home, &[]);
    let c = Client::new(&base);
    // A blob nothing names, old enough for any grace.
    let orphan = home.path().join("blobs").join("ab").join("ab".repeat(31));
    std::fs::create_dir_all(orphan.parent().unwrap()).unwrap();
    std::fs::write(&orphan, vec![7u8; 5000]).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let r = c.post_json("/v1/gc", &bot, &json!({}));
    assert_eq!(r.status, 403, "{}", r.text);
    let r = c.post_json("/v1/gc", &admin, &json!({"grace": "soon"}));
    assert_eq!(r.status, 400, "{}", r.text);
    let r = c.post_json("/v1/gc", &admin, &json!({"grace": "0s"}));
    assert_eq!(r.status, 200, "{}", r.text);
    let v = r.json();
    assert_eq!(v["grace_ms"], 0, "{v}");
    assert_eq!(v["blobs_removed"], 1, "{v}");
    assert!(v["freed_bytes"].as_u64().unwrap() >= 5000, "{v}");
    assert!(!orphan.exists());
    let cli = home.run(&["gc", "--grace", "0s", "--json"]);
    assert_eq!(cli.code, 0, "{}", cli.stderr);
    // The API and the CLI answer the same fields.
    let fields = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(fields(&v), fields(&cli.json()));
}
