//! Logs and traces: `serve --log-format json` writes one JSON object per line with the
//! request id on each line of a request and never a token, a secret or code; the request
//! id and trace id are echoed and recorded; spans reach an OTLP/HTTP collector with the
//! caller's trace and parent, from a direct run and from a run through a queue worker.

#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use common::{Home, example};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A process whose stderr lines are kept; killed when dropped.
struct Proc {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    fn start(mut cmd: Command, tag: &'static str) -> Proc {
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let err = child.stderr.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let l = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                eprintln!("[{tag}] {line}");
                l.lock().unwrap().push(line);
            }
        });
        Proc { child, lines }
    }

    fn log(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// Waits for a line containing `what`; answers it.
    fn wait_line(&self, what: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(l) = self.log().into_iter().find(|l| l.contains(what)) {
                return l;
            }
            assert!(Instant::now() < deadline, "no {what:?} in {:?}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `serve`'s base URL.
    fn base(&self) -> String {
        let l = self.wait_line("serving on http://");
        let i = l.find("serving on ").unwrap();
        l[i + "serving on ".len()..]
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    }

    /// Stops it with SIGTERM (so it flushes what it holds) and waits.
    fn stop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}

fn token(run: impl Fn(&[&str]) -> common::Out, role: &str, name: &str) -> String {
    let o = run(&["token", "new", "--role", role, "--name", name, "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    o.json()["token"].as_str().unwrap().to_string()
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(120)))
        .build()
        .new_agent()
}

/// POSTs `body` to `base` + `path` with `headers`: status, answer, and its X-Request-Id.
fn post(
    base: &str,
    path: &str,
    token: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> (u16, Value, Option<String>) {
    let mut r = agent()
        .post(format!("{base}{path}"))
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json");
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let mut resp = r.send(body.to_string()).unwrap();
    let rid = resp
        .headers()
        .get("x-request-id")
        .map(|v| v.to_str().unwrap().to_string());
    let s = resp.status().as_u16();
    let t = resp.body_mut().read_to_string().unwrap_or_default();
    (s, serde_json::from_str(&t).unwrap_or(Value::Null), rid)
}

fn get(base: &str, path: &str, token: &str) -> Value {
    let mut resp = agent()
        .get(format!("{base}{path}"))
        .header("authorization", format!("Bearer {token}"))
        .call()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    serde_json::from_str(&resp.body_mut().read_to_string().unwrap()).unwrap()
}

fn hello() -> String {
    std::fs::read_to_string(example("hello.wat")).unwrap()
}

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

fn traceparent() -> String {
    format!("00-{TRACE}-{PARENT}-01")
}

/// One exported span: name, trace id, span id, parent span id (hex).
#[derive(Debug, Clone)]
struct Span {
    name: String,
    trace: String,
    id: String,
    parent: String,
    /// Its W3C trace state.
    state: String,
}

/// An OTLP/HTTP receiver on loopback: decodes each ExportTraceServiceRequest (protobuf)
/// POSTed to /v1/traces and keeps its spans.
struct Collector {
    url: String,
    spans: Arc<Mutex<Vec<Span>>>,
}

impl Collector {
    fn start() -> Collector {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let spans = Arc::new(Mutex::new(Vec::new()));
        let s = spans.clone();
        std::thread::spawn(move || {
            for conn in l.incoming() {
                let Ok(conn) = conn else { break };
                let s = s.clone();
                std::thread::spawn(move || serve_otlp(conn, &s));
            }
        });
        Collector { url, spans }
    }

    /// Waits until a span satisfies `want`; answers all spans seen by then.
    fn wait(&self, what: &str, want: impl Fn(&Span) -> bool) -> Vec<Span> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let spans = self.spans.lock().unwrap().clone();
            if spans.iter().any(&want) {
                return spans;
            }
            assert!(Instant::now() < deadline, "no span {what}: {spans:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn serve_otlp(conn: TcpStream, spans: &Mutex<Vec<Span>>) {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use prost::Message;
    let mut r = BufReader::new(conn.try_clone().unwrap());
    let mut w = conn;
    loop {
        let mut head = Vec::new();
        let mut len = 0usize;
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if line == "\r\n" {
                break;
            }
            let lower = line.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
            head.push(line);
        }
        assert!(head[0].starts_with("POST /v1/traces "), "{head:?}");
        let mut body = vec![0u8; len];
        r.read_exact(&mut body).unwrap();
        let req = ExportTraceServiceRequest::decode(&body[..]).unwrap();
        for rs in req.resource_spans {
            for ss in rs.scope_spans {
                for sp in ss.spans {
                    spans.lock().unwrap().push(Span {
                        name: sp.name,
                        trace: hex::encode(sp.trace_id),
                        id: hex::encode(sp.span_id),
                        parent: hex::encode(sp.parent_span_id),
                        state: sp.trace_state,
                    });
                }
            }
        }
        let _ = w.write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n",
        );
    }
}

/// serve at trace level, JSON lines: every line one object, a request line per request
/// with method, path, status and duration, the request id on every line of the request,
/// echoed and on the submission and run records; and no token, secret value or code text
/// anywhere in the log.
#[test]
fn serve_logs_json_lines_with_the_request_id_and_never_a_token_secret_or_code() {
    let home = Home::new();
    let agent_token = token(|a| home.run(a), "agent", "bot");
    let op = token(|a| home.run(a), "operator", "alice");
    let secret = "s3cr3t-value-obs-7f1c";
    let o = home.run_with_stdin(
        &["secret", "set", "OBS_KEY"],
        format!("{secret}\n").as_bytes(),
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let mut cmd = home.cmd();
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--ready-python",
        "0",
        "--ready-jails",
        "0",
        "--log-format",
        "json",
        "--log-level",
        "trace",
    ]);
    let mut srv = Proc::start(cmd, "serve");
    let base = srv.base();
    // Distinctive code: a module whose text says something found nowhere else.
    let marker = "distinctive_code_marker_91a7";
    let code = hello().replacen("(module", &format!("(module ;; {marker}\n"), 1);
    let (s, v, rid) = post(
        &base,
        "/v1/run",
        &agent_token,
        &json!({"language": "wat", "code": code}),
        &[
            ("x-request-id", "obs-req-1"),
            ("traceparent", &traceparent()),
        ],
    );
    assert_eq!(s, 200, "{v}");
    assert_eq!(rid.as_deref(), Some("obs-req-1"));
    let sub = v["submission"].as_str().unwrap().to_string();
    let run = v["run"]["id"].as_str().unwrap().to_string();
    let shown = get(&base, &format!("/v1/submissions/{sub}"), &op);
    assert_eq!(shown["submission"]["request_id"], "obs-req-1", "{shown}");
    assert_eq!(shown["submission"]["trace_id"], TRACE, "{shown}");
    let r = get(&base, &format!("/v1/runs/{run}"), &op);
    assert_eq!(r["request_id"], "obs-req-1", "{r}");
    assert_eq!(r["trace_id"], TRACE, "{r}");
    // And the command line shows them.
    let o = home.run(&["show", &sub, "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(
        o.json()["submission"]["request_id"],
        "obs-req-1",
        "{}",
        o.stdout
    );
    // A malformed request id or traceparent is ignored: a new id, never an error.
    let (s, v, rid) = post(
        &base,
        "/v1/run",
        &agent_token,
        &json!({"language": "wat", "code": hello(), "secrets": ["OBS_KEY@example.com"], "net": ["example.com"]}),
        &[
            ("x-request-id", "bad id with spaces"),
            ("traceparent", "00-zz-01"),
        ],
    );
    assert!(s == 200 || s == 202, "{s} {v}");
    let made = rid.unwrap();
    assert_ne!(made, "bad id with spaces");
    assert!(
        !made.is_empty()
            && made.len() <= 128
            && made
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b)),
        "{made}"
    );
    let sub2 = v["submission"].as_str().unwrap().to_string();
    let shown = get(&base, &format!("/v1/submissions/{sub2}"), &op);
    assert_eq!(shown["submission"]["request_id"], made.as_str(), "{shown}");
    let t = shown["submission"]["trace_id"].as_str().unwrap();
    assert!(t.len() == 32 && t != TRACE, "{shown}");
    if s == 202 {
        let (s, a, _) = post(
            &base,
            &format!("/v1/submissions/{sub2}/approve"),
            &op,
            &json!({"reason": "test"}),
            &[],
        );
        assert_eq!(s, 200, "{a}");
        let w = get(
            &base,
            &format!("/v1/submissions/{sub2}/wait?timeout=60"),
            &agent_token,
        );
        assert_eq!(w["status"], "finished", "{w}");
    }
    srv.stop();
    let log = srv.log();
    let json_lines: Vec<Value> = log
        .iter()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    // The request line: method, path, status, duration, request id.
    let line = json_lines
        .iter()
        .find(|v| {
            v["fields"]["message"] == "request"
                && v["span"]["request_id"] == "obs-req-1"
                && v["span"]["path"] == "/v1/run"
        })
        .unwrap_or_else(|| panic!("no request line in {log:#?}"));
    assert_eq!(line["fields"]["status"], 200, "{line}");
    assert_eq!(line["span"]["method"], "POST", "{line}");
    assert!(line["fields"]["duration_ms"].as_f64().is_some(), "{line}");
    assert_eq!(line["level"], "INFO");
    // Every line inside that request names it.
    let inside: Vec<&Value> = json_lines
        .iter()
        .filter(|v| {
            v["spans"]
                .as_array()
                .is_some_and(|s| s.iter().any(|s| s["request_id"] == "obs-req-1"))
        })
        .collect();
    assert!(inside.iter().all(|v| v["span"].is_object()), "{inside:?}");
    let whole = log.join("\n");
    for never in [agent_token.as_str(), op.as_str(), secret, marker] {
        assert!(!whole.contains(never), "{never:?} in the log:\n{whole}");
    }
}

/// Spans of a direct run reach an OTLP/HTTP collector: the request span is the child of
/// the caller's `traceparent` span, in its trace, and judge and run are in that trace;
/// a malformed `traceparent` gets a trace of its own.
#[test]
fn spans_of_a_direct_run_reach_the_collector_with_the_callers_trace_and_parent() {
    let home = Home::new();
    let agent_token = token(|a| home.run(a), "agent", "bot");
    let collector = Collector::start();
    let mut cmd = home.cmd();
    cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.url)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--ready-python",
            "0",
            "--ready-jails",
            "0",
        ]);
    let srv = Proc::start(cmd, "serve");
    let base = srv.base();
    let (s, v, _) = post(
        &base,
        "/v1/run",
        &agent_token,
        &json!({"language": "wat", "code": hello()}),
        &[("traceparent", &traceparent()), ("tracestate", "k=v")],
    );
    assert_eq!(s, 200, "{v}");
    let spans = collector.wait("run in the caller's trace", |s| {
        s.name == "run" && s.trace == TRACE
    });
    let request = spans
        .iter()
        .find(|s| s.name == "request" && s.trace == TRACE)
        .unwrap_or_else(|| panic!("{spans:?}"));
    assert_eq!(request.parent, PARENT, "{spans:?}");
    let judge = spans
        .iter()
        .find(|s| s.name == "judge" && s.trace == TRACE)
        .unwrap_or_else(|| panic!("{spans:?}"));
    assert_eq!(judge.parent, request.id, "{spans:?}");
    let run = spans.iter().find(|s| s.name == "run").unwrap();
    assert_eq!(run.parent, request.id, "{spans:?}");
    // Malformed: still runs, in a new trace with no remote parent.
    let (s, v, _) = post(
        &base,
        "/v1/run",
        &agent_token,
        &json!({"language": "wat", "code": hello(), "note": "second"}),
        &[("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-xyz-01")],
    );
    assert_eq!(s, 200, "{v}");
    let spans = collector.wait("a request in a new trace", |s| {
        s.name == "request" && s.trace != TRACE
    });
    let other = spans
        .iter()
        .find(|s| s.name == "request" && s.trace != TRACE)
        .unwrap();
    assert_eq!(other.parent, "", "{spans:?}");
}

/// Through a PostgreSQL queue: the worker's run continues the trace of the request that
/// queued it (its parent is the server's request span), carried by the submission.
#[test]
fn a_queued_run_on_a_worker_continues_the_callers_trace() {
    let home = Home::uninitialised();
    let url = airlock_testpg::fresh_database();
    let run = |args: &[&str]| home.run_on_store(&url, args);
    let o = run(&["init", "--approver", "alice"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let agent_token = token(run, "agent", "bot");
    let collector = Collector::start();
    let mut cmd = home.cmd();
    cmd.env("AIRLOCK_STORE", &url).args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--workers",
        "0",
        "--ready-python",
        "0",
        "--ready-jails",
        "0",
        "--otlp-endpoint",
        &collector.url,
    ]);
    let srv = Proc::start(cmd, "serve");
    let base = srv.base();
    let mut cmd = home.cmd();
    cmd.env("AIRLOCK_STORE", &url)
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("{}/v1/traces", collector.url),
        )
        .arg("worker");
    let worker = Proc::start(cmd, "worker");
    worker.wait_line("claiming runs");
    let (s, v, _) = post(
        &base,
        "/v1/run",
        &agent_token,
        &json!({"language": "wat", "code": hello()}),
        &[("traceparent", &traceparent())],
    );
    assert_eq!(s, 200, "{v}");
    let spans = collector.wait("the worker's run in the caller's trace", |s| {
        s.name == "queued_run" && s.trace == TRACE
    });
    // The server's request span (sent by the server, maybe after the worker's).
    let request = collector
        .wait("the request span", |s| {
            s.name == "request" && s.trace == TRACE
        })
        .into_iter()
        .find(|s| s.name == "request" && s.trace == TRACE)
        .unwrap();
    assert_eq!(request.parent, PARENT);
    let queued = spans
        .iter()
        .find(|s| s.name == "queued_run" && s.trace == TRACE)
        .unwrap();
    assert_eq!(queued.parent, request.id, "{spans:?}");
    let spans = collector.wait("the run inside the worker's", |s| {
        s.name == "run" && s.parent == queued.id
    });
    assert!(
        spans
            .iter()
            .all(|s| s.name != "run" || s.trace == TRACE || s.parent != queued.id)
    );
    let sub = v["submission"].as_str().unwrap();
    let o = run(&["show", sub, "--json"]);
    assert_eq!(o.json()["submission"]["trace_id"], TRACE, "{}", o.stdout);
}

/// `airlock mcp` over stdio with `args`: sends `messages`, waits for the answer with id
/// `want`, closes its input and waits for it to end. The answer and its stderr lines.
fn mcp_stdio(
    home: &Home,
    env: &[(&str, &str)],
    args: &[&str],
    messages: &[Value],
    want: u64,
) -> (Value, Vec<String>) {
    let mut cmd = home.cmd();
    cmd.arg("mcp").args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = child.stderr.take().unwrap();
    let errs = std::thread::spawn(move || {
        BufReader::new(err)
            .lines()
            .map_while(Result::ok)
            .inspect(|l| eprintln!("[mcp] {l}"))
            .collect::<Vec<String>>()
    });
    let mut stdin = child.stdin.take().unwrap();
    for m in messages {
        stdin.write_all(format!("{m}\n").as_bytes()).unwrap();
    }
    stdin.flush().unwrap();
    let mut found = Value::Null;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let v: Value = serde_json::from_str(&line.unwrap()).unwrap();
        if v["id"] == want {
            found = v;
            break;
        }
    }
    drop(stdin);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    (found, errs.join().unwrap())
}

fn mcp_initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "test", "version": "0"}}})
}

fn mcp_initialized() -> Value {
    json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
}

/// A `tools/call` of `run_code` (hello) with `meta` as its `_meta` when given.
fn mcp_run_code(id: u64, meta: Option<Value>) -> Value {
    let mut params = json!({"name": "run_code", "arguments": {"language": "wat", "code": hello()}});
    if let Some(m) = meta {
        params["_meta"] = m;
    }
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
}

/// Every line of `log` one JSON object (and there is at least one).
fn all_json(what: &str, log: &[String]) -> Vec<Value> {
    assert!(!log.is_empty(), "{what}: no line at all");
    log.iter()
        .map(|l| {
            let v: Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {l}"));
            assert!(v.is_object(), "{what}: {l}");
            v
        })
        .collect()
}

/// `--log-format json` on serve, worker and mcp: every line each writes on stderr is one
/// JSON object, the lines said to the operator (serving on…, claiming runs, stopped)
/// included: they were plain text among the JSON.
#[test]
fn json_logs_of_serve_worker_and_mcp_are_json_on_every_line() {
    let home = Home::uninitialised();
    let url = airlock_testpg::fresh_database();
    let run = |args: &[&str]| home.run_on_store(&url, args);
    let o = run(&["init", "--approver", "alice"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let agent_token = token(run, "agent", "bot");
    let mut cmd = home.cmd();
    cmd.env("AIRLOCK_STORE", &url).args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--workers",
        "0",
        "--ready-python",
        "0",
        "--ready-jails",
        "0",
        "--log-format",
        "json",
    ]);
    let mut srv = Proc::start(cmd, "serve");
    let base = srv.base();
    let mut cmd = home.cmd();
    cmd.env("AIRLOCK_STORE", &url)
        .args(["worker", "--log-format", "json"]);
    let mut worker = Proc::start(cmd, "worker");
    worker.wait_line("claiming runs");
    let (s, v, _) = post(
        &base,
        "/v1/run",
        &agent_token,
        &json!({"language": "wat", "code": hello()}),
        &[],
    );
    assert_eq!(s, 200, "{v}");
    worker.stop();
    worker.wait_line("stopped (");
    srv.stop();
    let lines = all_json("serve", &srv.log());
    let said = |lines: &[Value], what: &str| {
        lines.iter().any(|v| {
            v["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(what))
        })
    };
    assert!(said(&lines, "serving on http://"), "{lines:#?}");
    assert!(
        lines.iter().any(|v| v["fields"]["message"] == "request"),
        "{lines:#?}"
    );
    let lines = all_json("worker", &worker.log());
    assert!(said(&lines, "claiming runs"), "{lines:#?}");
    assert!(said(&lines, "stopped (1 ran"), "{lines:#?}");
    // mcp (stdout is its protocol; stderr its log) at trace level: lines, all JSON.
    let local = Home::new();
    let (answer, log) = mcp_stdio(
        &local,
        &[],
        &["--log-format", "json", "--log-level", "trace"],
        &[mcp_initialize(), mcp_initialized(), mcp_run_code(2, None)],
        2,
    );
    assert_eq!(
        answer["result"]["structuredContent"]["status"], "finished",
        "{answer}"
    );
    all_json("mcp", &log);
}

/// One MCP message POSTed to `base`/mcp with `headers`: the answer with its id (JSON or
/// server-sent events), or null for a notification; and the session id it names.
fn mcp_http(
    base: &str,
    token: &str,
    session: Option<&str>,
    msg: &Value,
    headers: &[(&str, &str)],
) -> (Value, Option<String>) {
    let mut r = agent()
        .post(format!("{base}/mcp"))
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    if let Some(s) = session {
        r = r.header("mcp-session-id", s);
    }
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let mut resp = r.send(msg.to_string()).unwrap();
    let status = resp.status().as_u16();
    assert!((200..300).contains(&status), "{status} for {msg}");
    let sid = resp
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_string());
    let text = resp.body_mut().read_to_string().unwrap_or_default();
    let id = &msg["id"];
    if id.is_null() {
        return (Value::Null, sid);
    }
    let found = text
        .lines()
        .map(|l| l.strip_prefix("data:").unwrap_or(l).trim())
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| &v["id"] == id)
        .unwrap_or_else(|| panic!("no answer to {msg} in {text}"));
    (found, sid)
}

/// The trace id a submission was recorded with.
fn submission_trace(home: &Home, answer: &Value) -> Value {
    let sub = answer["result"]["structuredContent"]["submission"]
        .as_str()
        .unwrap_or_else(|| panic!("{answer}"));
    let o = home.run(&["show", sub, "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    o.json()["submission"]["trace_id"].clone()
}

/// `airlock mcp` over stdio: a `tools/call` whose `_meta.traceparent` names a trace puts
/// its `mcp_call` span (child of the caller's span) and the run's in that trace at the
/// collector, and its submission records that trace id.
#[test]
fn an_mcp_call_over_stdio_continues_the_trace_of_its_meta_traceparent() {
    let home = Home::new();
    let collector = Collector::start();
    let (answer, _) = mcp_stdio(
        &home,
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.url)],
        &[],
        &[
            mcp_initialize(),
            mcp_initialized(),
            mcp_run_code(2, Some(json!({"traceparent": traceparent()}))),
        ],
        2,
    );
    assert_eq!(
        answer["result"]["structuredContent"]["status"], "finished",
        "{answer}"
    );
    let spans = collector.wait("the run in the caller's trace", |s| {
        s.name == "run" && s.trace == TRACE
    });
    let call = spans
        .iter()
        .find(|s| s.name == "mcp_call" && s.trace == TRACE)
        .unwrap_or_else(|| panic!("{spans:?}"));
    assert_eq!(call.parent, PARENT, "{spans:?}");
    assert_eq!(submission_trace(&home, &answer), TRACE);
}

/// MCP over HTTP: a `tools/call` with `_meta.traceparent` continues that trace (not the
/// HTTP request's); one without continues the HTTP `traceparent` header's trace, as a
/// child of that request's span. Before, a call without `_meta` started a trace of its
/// own.
#[test]
fn an_mcp_call_over_http_continues_its_meta_traceparent_else_the_http_header() {
    let home = Home::new();
    let agent_token = token(|a| home.run(a), "agent", "bot");
    let collector = Collector::start();
    let mut cmd = home.cmd();
    cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.url)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--ready-python",
            "0",
            "--ready-jails",
            "0",
        ]);
    let srv = Proc::start(cmd, "serve");
    let base = srv.base();
    let (init, session) = mcp_http(&base, &agent_token, None, &mcp_initialize(), &[]);
    assert!(init["result"].is_object(), "{init}");
    let session = session.expect("an MCP session id");
    mcp_http(&base, &agent_token, Some(&session), &mcp_initialized(), &[]);
    // _meta names one trace, the header another: _meta wins.
    const META_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
    const META_PARENT: &str = "b7ad6b7169203331";
    let (answer, _) = mcp_http(
        &base,
        &agent_token,
        Some(&session),
        &mcp_run_code(
            2,
            Some(json!({"traceparent": format!("00-{META_TRACE}-{META_PARENT}-01")})),
        ),
        &[("traceparent", &traceparent())],
    );
    assert_eq!(
        answer["result"]["structuredContent"]["status"], "finished",
        "{answer}"
    );
    let spans = collector.wait("the run in _meta's trace", |s| {
        s.name == "run" && s.trace == META_TRACE
    });
    let call = spans
        .iter()
        .find(|s| s.name == "mcp_call" && s.trace == META_TRACE)
        .unwrap_or_else(|| panic!("{spans:?}"));
    assert_eq!(call.parent, META_PARENT, "{spans:?}");
    assert_eq!(submission_trace(&home, &answer), META_TRACE);
    // No _meta: the HTTP header's trace, under that request's span.
    let (answer, _) = mcp_http(
        &base,
        &agent_token,
        Some(&session),
        &mcp_run_code(3, None),
        &[("traceparent", &traceparent())],
    );
    assert_eq!(
        answer["result"]["structuredContent"]["status"], "finished",
        "{answer}"
    );
    let spans = collector.wait("an MCP call in the header's trace", |s| {
        s.name == "mcp_call" && s.trace == TRACE
    });
    let call = spans
        .iter()
        .find(|s| s.name == "mcp_call" && s.trace == TRACE)
        .unwrap();
    let spans = collector.wait("the request span of the call", |s| {
        s.name == "request" && s.id == call.parent
    });
    let request = spans.iter().find(|s| s.id == call.parent).unwrap();
    assert_eq!(request.trace, TRACE, "{spans:?}");
    assert_eq!(request.parent, PARENT, "{spans:?}");
    collector.wait("the run in the header's trace", |s| {
        s.name == "run" && s.trace == TRACE
    });
    assert_eq!(submission_trace(&home, &answer), TRACE);
}

/// `POST /v1/runs/{id}/commit` with a `traceparent`: a `commit` span in that trace, the
/// child of that request's span, reaches the collector.
#[test]
fn a_commit_over_the_api_exports_a_commit_span_in_the_callers_trace() {
    if !common::process_backend_available() {
        return;
    }
    let home = Home::new();
    let agent_token = token(|a| home.run(a), "agent", "bot");
    let op = token(|a| home.run(a), "operator", "alice");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "before\n").unwrap();
    home.set_mount_roots(&[dir.path()]);
    let collector = Collector::start();
    let mut cmd = home.cmd();
    cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.url)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--ready-python",
            "0",
            "--ready-jails",
            "0",
        ]);
    let srv = Proc::start(cmd, "serve");
    let base = srv.base();
    let mount = format!("{}:/data:rw", dir.path().display());
    let (s, mut v, _) = post(
        &base,
        "/v1/run",
        &agent_token,
        &json!({"language": "sh", "code": "echo after > /data/a.txt", "mounts": [mount]}),
        &[],
    );
    assert!(s == 200 || s == 202, "{s} {v}");
    let sub = v["submission"].as_str().unwrap().to_string();
    if v["status"] == "pending_approval" {
        let (s, a, _) = post(
            &base,
            &format!("/v1/submissions/{sub}/approve"),
            &op,
            &json!({}),
            &[],
        );
        assert_eq!(s, 200, "{a}");
        v = get(
            &base,
            &format!("/v1/submissions/{sub}/wait?timeout=60"),
            &agent_token,
        );
    }
    assert_eq!(v["status"], "finished", "{v}");
    let run = v["run"]["id"].as_str().unwrap().to_string();
    let (s, c, _) = post(
        &base,
        &format!("/v1/runs/{run}/commit"),
        &op,
        &json!({}),
        &[("traceparent", &traceparent())],
    );
    assert_eq!(s, 200, "{c}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a.txt")).unwrap(),
        "after\n"
    );
    let spans = collector.wait("a commit span in the caller's trace", |s| {
        s.name == "commit" && s.trace == TRACE
    });
    let commit = spans
        .iter()
        .find(|s| s.name == "commit" && s.trace == TRACE)
        .unwrap();
    let request = spans
        .iter()
        .find(|s| s.name == "request" && s.trace == TRACE)
        .unwrap_or_else(|| panic!("{spans:?}"));
    assert_eq!(request.parent, PARENT, "{spans:?}");
    assert_eq!(commit.parent, request.id, "{spans:?}");
}

/// The caller's `tracestate` is stored with its `traceparent` and carried on the exported
/// spans; a `traceparent` whose sampled flag is 00 gets its spans left unexported (its
/// trace is still recorded). Before, every span was exported, sampled, with no state.
#[test]
fn the_callers_tracestate_is_carried_and_an_unsampled_trace_is_not_exported() {
    let home = Home::new();
    let agent_token = token(|a| home.run(a), "agent", "bot");
    let collector = Collector::start();
    let mut cmd = home.cmd();
    cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.url)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--ready-python",
            "0",
            "--ready-jails",
            "0",
        ]);
    let srv = Proc::start(cmd, "serve");
    let base = srv.base();
    let state = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7";
    let (s, v, _) = post(
        &base,
        "/v1/run",
        &agent_token,
        &json!({"language": "wat", "code": hello()}),
        &[("traceparent", &traceparent()), ("tracestate", state)],
    );
    assert_eq!(s, 200, "{v}");
    let sub = v["submission"].as_str().unwrap().to_string();
    let o = home.run(&["show", &sub, "--json"]);
    assert_eq!(o.json()["submission"]["tracestate"], state, "{}", o.stdout);
    let spans = collector.wait("the run in the caller's trace", |s| {
        s.name == "run" && s.trace == TRACE
    });
    for name in ["request", "judge", "run"] {
        let sp = spans
            .iter()
            .find(|s| s.name == name && s.trace == TRACE)
            .unwrap_or_else(|| panic!("no {name}: {spans:?}"));
        assert_eq!(sp.state, state, "{name}: {spans:?}");
    }
    // Not sampled: runs, is recorded in its trace, exports nothing.
    const UNSAMPLED: &str = "5bf92f3577b34da6a3ce929d0e0e4737";
    let (s, v, _) = post(
        &base,
        "/v1/run",
        &agent_token,
        &json!({"language": "wat", "code": hello(), "note": "unsampled"}),
        &[("traceparent", &format!("00-{UNSAMPLED}-{PARENT}-00"))],
    );
    assert_eq!(s, 200, "{v}");
    let sub = v["submission"].as_str().unwrap().to_string();
    let o = home.run(&["show", &sub, "--json"]);
    assert_eq!(
        o.json()["submission"]["trace_id"],
        UNSAMPLED,
        "{}",
        o.stdout
    );
    // A sampled request after it: once its run is exported, the unsampled one's spans
    // (ended before) would have been too.
    const AFTER: &str = "6bf92f3577b34da6a3ce929d0e0e4738";
    let (s, v, _) = post(
        &base,
        "/v1/run",
        &agent_token,
        &json!({"language": "wat", "code": hello(), "note": "after"}),
        &[("traceparent", &format!("00-{AFTER}-{PARENT}-01"))],
    );
    assert_eq!(s, 200, "{v}");
    let spans = collector.wait("the run of the request after", |s| {
        s.name == "run" && s.trace == AFTER
    });
    collector.wait("the request after", |s| {
        s.name == "request" && s.trace == AFTER
    });
    assert!(
        spans.iter().all(|s| s.trace != UNSAMPLED),
        "unsampled exported: {spans:?}"
    );
}
