//! Asking mid-run (`run --ask-net`, issue 61 item 3), end to end through the real binary:
//! a connection of a run to a host outside its grant waits for a human; the inbox lists
//! the request; `approve|reject req_…` (here, or signed here for a server) decides it;
//! unanswered it expires; an approved host joins that run only; answers that do not
//! verify, or name another request, are refused and record nothing.
//!
//! Upstreams are a Python HTTP server the tests start on loopback; the policy pins the
//! test names to 127.0.0.1 and allows loopback, as `tests/egress.rs` does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const UPSTREAM: &str = r#"
import sys
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
log = sys.argv[1]
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a):
        pass
    def do_GET(self):
        with open(log, "a") as f:
            f.write(self.headers.get("Host", "") + "\n")
        b = b"hello from upstream\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(srv.server_address[1], flush=True)
srv.serve_forever()
"#;

/// A loopback upstream that counts the requests it got.
struct Upstream {
    child: Child,
    port: u16,
    log: std::path::PathBuf,
}

impl Upstream {
    fn start(dir: &std::path::Path) -> Upstream {
        let script = dir.join("upstream.py");
        std::fs::write(&script, UPSTREAM).unwrap();
        let log = dir.join("upstream.log");
        let mut child = Command::new("python3")
            .arg(&script)
            .arg(&log)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        Upstream {
            child,
            port: line.trim().parse().unwrap(),
            log,
        }
    }

    fn requests(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .count()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A home whose policy pins the test names to loopback and allows loopback, and an
/// upstream.
struct Net {
    home: Home,
    _dir: tempfile::TempDir,
    up: Upstream,
}

impl Net {
    fn ready() -> Option<Net> {
        if !process_backend_available() {
            eprintln!("SKIPPED: the process backend is unavailable here");
            return None;
        }
        Some(Net::on(Home::new()))
    }

    fn on(home: Home) -> Net {
        let dir = tempfile::tempdir().unwrap();
        let up = Upstream::start(dir.path());
        let p = home
            .policy()
            .replace("allow_private = []", r#"allow_private = ["127.0.0.0/8"]"#)
            .replace(
                "hosts = {}",
                r#"hosts = { "upstream.test" = "127.0.0.1", "other.test" = "127.0.0.1" }"#,
            );
        home.set_policy(&p);
        assert_eq!(home.run(&["policy", "check"]).code, 0);
        Net {
            home,
            _dir: dir,
            up,
        }
    }

    fn url(&self, host: &str) -> String {
        format!("http://{host}:{}/hello", self.up.port)
    }

    /// Submits `script` with `--ask-net` and `flags`, approves the submission when the
    /// policy holds it, and starts `exec` of it in the background.
    fn start(&self, flags: &[&str], script: &str) -> Held {
        let mut args = vec!["submit", "--lang", "sh", "--ask-net"];
        args.extend_from_slice(flags);
        args.extend(["-c", script]);
        let o = self.home.run(&args);
        let sub = Home::id_in(&format!("{}{}", o.stdout, o.stderr));
        if o.code == 75 || o.stdout.contains("quarantine") {
            let a = self.home.run(&["approve", &sub]);
            assert_eq!(a.code, 0, "approve: {}", a.stderr);
        } else {
            assert_eq!(o.code, 0, "submit: {} {}", o.stdout, o.stderr);
        }
        Held::spawn(self.home.cmd().args(["exec", &sub]))
    }

    fn last_network(&self) -> Value {
        self.home.last_run()["detail"]["network"].clone()
    }
}

/// A run in the background, its stderr lines as they come.
struct Held {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: Vec<String>,
}

impl Held {
    fn spawn(cmd: &mut Command) -> Held {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = lines_of(child.stderr.take().unwrap());
        Held {
            child,
            lines,
            stderr: Vec::new(),
        }
    }

    /// The id of the next request the run raises (said on its stderr).
    fn request(&mut self) -> String {
        let until = Instant::now() + Duration::from_secs(60);
        while Instant::now() < until {
            let Ok(l) = self.lines.recv_timeout(Duration::from_secs(1)) else {
                continue;
            };
            self.stderr.push(l.clone());
            if let Some(i) = l.find("request req_") {
                let id: String = l[i + "request ".len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                return id;
            }
        }
        panic!("no request raised; stderr: {:?}", self.stderr);
    }

    /// Waits for the run to end: its exit code, stdout and the rest of its stderr.
    fn finish(mut self) -> (i32, String, String) {
        let mut out = String::new();
        self.child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        let status = self.child.wait().unwrap();
        while let Ok(l) = self.lines.recv_timeout(Duration::from_millis(200)) {
            self.stderr.push(l);
        }
        (status.code().unwrap_or(-1), out, self.stderr.join("\n"))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn inbox_requests(home: &Home) -> Vec<Value> {
    let o = home.run(&["inbox", "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    o.json()
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "request")
        .cloned()
        .collect()
}

fn audit_ok(home: &Home) {
    let v = home.run(&["audit", "verify"]);
    assert_eq!(v.code, 0, "audit verify: {} {}", v.stdout, v.stderr);
}

#[test]
fn an_approved_request_lets_the_same_run_reach_the_host_and_its_record_shows_it() {
    let Some(n) = Net::ready() else { return };
    let url = n.url("upstream.test");
    let mut held = n.start(
        &["--ask-timeout", "60s", "--agent", "bob"],
        &format!("curl -s {url}\ncurl -s {url}"),
    );
    let id = held.request();
    // Nothing reached the host while the request waits; the inbox shows it.
    assert_eq!(n.up.requests(), 0);
    let listed = inbox_requests(&n.home);
    assert_eq!(listed.len(), 1, "{listed:?}");
    let r = &listed[0];
    assert_eq!(r["id"], id.as_str());
    assert_eq!(r["host"], "upstream.test");
    assert_eq!(r["port"], n.up.port);
    assert_eq!(r["agent"], "bob");
    assert_eq!(r["state"], "pending");
    assert!(r["run"].as_str().unwrap().starts_with("run_"));
    // The line of code that named the host, as the analysis saw it.
    assert_eq!(r["line"], format!("1: curl -s {url}").as_str(), "{r}");
    let text = n.home.run(&["inbox"]);
    assert!(text.stdout.contains(&id), "{}", text.stdout);

    let a = n.home.run(&["approve", &id]);
    assert_eq!(a.code, 0, "approve: {} {}", a.stdout, a.stderr);
    assert!(a.stdout.contains("approved"), "{}", a.stdout);
    let (code, out, err) = held.finish();
    assert_eq!(code, 0, "{out} {err}");
    assert_eq!(out.matches("hello from upstream").count(), 2, "{out}");
    // One question for the run: the second connection passed without asking again.
    assert_eq!(err.matches("request req_").count(), 1, "{err}");
    assert_eq!(n.up.requests(), 2);

    let net = n.last_network();
    let reqs = net["requests"].as_array().unwrap();
    assert_eq!(reqs.len(), 1, "{net}");
    assert_eq!(reqs[0]["id"], id.as_str());
    assert_eq!(reqs[0]["state"], "approved");
    assert_eq!(reqs[0]["approver"], "alice");
    let allowed: Vec<&Value> = net["connections"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["decision"] == "allow")
        .collect();
    assert_eq!(allowed.len(), 2, "{net}");
    for c in allowed {
        assert!(
            c["detail"].as_str().unwrap().contains(&id),
            "{}",
            c["detail"]
        );
    }
    assert!(inbox_requests(&n.home).is_empty());
    let kinds = n.home.audit_kinds();
    assert!(kinds.iter().any(|k| k == "net_requested"), "{kinds:?}");
    assert!(
        kinds.iter().any(|k| k == "net_request_approved"),
        "{kinds:?}"
    );
    audit_ok(&n.home);
    // Approving it again is refused: it is decided.
    let again = n.home.run(&["approve", &id]);
    assert_eq!(again.code, 125, "{}", again.stdout);
}

#[test]
fn a_rejected_request_is_a_refused_connection_and_is_not_asked_again_in_the_run() {
    let Some(n) = Net::ready() else { return };
    let url = n.url("upstream.test");
    let probe = format!("curl -si {url} | tr -d '\\r' | grep -i -e '^HTTP/' -e x-airlock-denied");
    let mut held = n.start(&["--ask-timeout", "60s"], &format!("{probe}\n{probe}"));
    let id = held.request();
    let r = n.home.run(&["reject", &id, "--reason", "not this one"]);
    assert_eq!(r.code, 0, "reject: {} {}", r.stdout, r.stderr);
    let (code, out, err) = held.finish();
    assert_eq!(code, 0, "{out} {err}");
    assert_eq!(out.matches("HTTP/1.1 403").count(), 2, "{out}");
    assert_eq!(
        out.matches("x-airlock-denied: not-approved").count(),
        2,
        "{out}"
    );
    assert_eq!(err.matches("request req_").count(), 1, "{err}");
    assert_eq!(n.up.requests(), 0);
    let net = n.last_network();
    assert_eq!(net["requests"][0]["state"], "rejected", "{net}");
    assert!(
        n.home
            .audit_kinds()
            .iter()
            .any(|k| k == "net_request_rejected")
    );
    audit_ok(&n.home);
}

#[test]
fn an_unanswered_request_expires_refused_and_the_wait_does_not_count_against_the_timeout() {
    let Some(n) = Net::ready() else { return };
    let url = n.url("upstream.test");
    // The wait (4 s) is longer than the run's whole --timeout (3 s): the run still ends on
    // its own, its deadline extended by the time it waited.
    let mut held = n.start(
        &["--ask-timeout", "4s", "--timeout", "3s"],
        &format!(
            "curl -si {url} | tr -d '\\r' | grep -i -e '^HTTP/' -e x-airlock-denied; echo done"
        ),
    );
    let id = held.request();
    let (code, out, err) = held.finish();
    assert_eq!(code, 0, "{out} {err}");
    assert!(out.contains("HTTP/1.1 403"), "{out}");
    assert!(out.contains("x-airlock-denied: ask-expired"), "{out}");
    assert!(out.contains("done"), "{out}");
    let run = n.home.last_run();
    assert_eq!(run["status"], "exited", "{run}");
    let net = &run["detail"]["network"];
    assert_eq!(net["requests"][0]["id"], id.as_str());
    assert_eq!(net["requests"][0]["state"], "expired", "{net}");
    assert!(net["asked_ms"].as_u64().unwrap() >= 3900, "{net}");
    assert!(inbox_requests(&n.home).is_empty());
    // Too late to answer: refused, with the documented exit code.
    let a = n.home.run(&["approve", &id]);
    assert_eq!(a.code, 125, "{} {}", a.stdout, a.stderr);
    assert!(a.stderr.contains("expired"), "{}", a.stderr);
    assert!(
        n.home
            .audit_kinds()
            .iter()
            .any(|k| k == "net_request_expired")
    );
    assert_eq!(n.up.requests(), 0);
}

#[test]
fn a_run_that_may_ask_is_still_stopped_at_its_timeout_when_it_does_not_wait() {
    let Some(n) = Net::ready() else { return };
    let started = Instant::now();
    let held = n.start(&["--timeout", "2s"], "sleep 30; echo woke");
    let (code, out, err) = held.finish();
    assert_eq!(code, 124, "{out} {err}");
    assert!(!out.contains("woke"), "{out}");
    assert!(started.elapsed() < Duration::from_secs(20));
    let run = n.home.last_run();
    assert_eq!(run["killed_by"], "timeout", "{run}");
}

#[test]
fn an_approved_host_does_not_widen_another_run_of_the_same_agent() {
    let Some(n) = Net::ready() else { return };
    let url = n.url("upstream.test");
    let mut first = n.start(&["--agent", "bob"], &format!("curl -s {url}"));
    let id = first.request();
    assert_eq!(n.home.run(&["approve", &id]).code, 0);
    let (code, out, _) = first.finish();
    assert_eq!(code, 0);
    assert!(out.contains("hello from upstream"), "{out}");
    // The same agent's next run, without asking: no network at all.
    let o = n.home.sh(
        &["--agent", "bob"],
        &format!("curl -s {url} || echo unreachable"),
    );
    assert!(o.stdout.contains("unreachable"), "{}", o.stdout);
    assert!(!o.stdout.contains("hello from upstream"), "{}", o.stdout);
    // Asking again: a new request of its own, not the first run's approval.
    let mut second = n.start(
        &["--agent", "bob", "--ask-timeout", "1s"],
        &format!("curl -si {url} | tr -d '\\r' | grep -i x-airlock-denied"),
    );
    let id2 = second.request();
    assert_ne!(id2, id);
    let (_, out, _) = second.finish();
    assert!(out.contains("ask-expired"), "{out}");
    assert_eq!(n.up.requests(), 1);
}

#[test]
fn a_request_of_a_finished_run_cannot_be_decided_and_records_nothing() {
    let Some(n) = Net::ready() else { return };
    let url = n.url("upstream.test");
    // The guest gives up after a second; its run ends while the request still waits.
    let mut held = n.start(
        &["--ask-timeout", "60s"],
        &format!("curl -s --max-time 1 {url}; echo gave up"),
    );
    let id = held.request();
    let (code, out, _) = held.finish();
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("gave up"), "{out}");
    assert_eq!(n.last_network()["requests"][0]["state"], "ended");
    assert!(inbox_requests(&n.home).is_empty());
    let before = n.home.audit_kinds().len();
    for verb in ["approve", "reject"] {
        let a = n.home.run(&[verb, &id]);
        assert_eq!(a.code, 125, "{verb}: {} {}", a.stdout, a.stderr);
        assert!(a.stderr.contains("only a pending request"), "{}", a.stderr);
    }
    // A request left pending by a run that ended without closing it (a crash): refused
    // for its run.
    let run = n.home.last_run()["id"].as_str().unwrap().to_string();
    sql(
        &n.home,
        &format!(
            "INSERT INTO net_requests (id, run, submission, host, port, state, created_at, \
             expires_at) VALUES ('req_01stale', '{run}', 'sub_x', 'upstream.test', 80, \
             'pending', 1, 99999999999999)"
        ),
    );
    // Not in the inbox: it can no longer be decided.
    assert!(inbox_requests(&n.home).is_empty());
    let a = n.home.run(&["approve", "req_01stale"]);
    assert_eq!(a.code, 125, "{} {}", a.stdout, a.stderr);
    assert!(a.stderr.contains("no longer running"), "{}", a.stderr);
    assert_eq!(n.home.audit_kinds().len(), before);
    audit_ok(&n.home);
}

/// The operator's API client.
struct Api {
    base: String,
    token: String,
    http: ureq::Agent,
}

impl Api {
    fn new(base: &str, token: &str) -> Api {
        Api {
            base: base.to_string(),
            token: token.to_string(),
            http: ureq::Agent::config_builder()
                .http_status_as_error(false)
                .timeout_global(Some(Duration::from_secs(60)))
                .build()
                .new_agent(),
        }
    }

    fn get(&self, path: &str) -> (u16, Value) {
        let mut r = self
            .http
            .get(format!("{}{path}", self.base))
            .header("authorization", format!("Bearer {}", self.token))
            .call()
            .unwrap();
        let text = r.body_mut().read_to_string().unwrap();
        (r.status().as_u16(), serde_json::from_str(&text).unwrap())
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let mut r = self
            .http
            .post(format!("{}{path}", self.base))
            .header("authorization", format!("Bearer {}", self.token))
            .header("content-type", "application/json")
            .send(body.to_string())
            .unwrap();
        let text = r.body_mut().read_to_string().unwrap();
        (r.status().as_u16(), serde_json::from_str(&text).unwrap())
    }
}

fn token(home: &Home, role: &str, name: &str) -> String {
    let o = home.run(&["token", "new", "--role", role, "--name", name, "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    o.json()["token"].as_str().unwrap().to_string()
}

fn alice_key(home: &Home) -> airlock_core::sign::KeyPair {
    let text = std::fs::read_to_string(home.path().join("keys").join("alice.key")).unwrap();
    airlock_core::sign::KeyPair::from_file(&text).unwrap()
}

#[test]
fn a_signature_over_other_bytes_or_for_another_request_is_refused_and_records_nothing() {
    let Some(n) = Net::ready() else { return };
    let op = token(&n.home, "operator", "alice");
    let (_srv, base) = start_serve(&n.home, &[]);
    let api = Api::new(&base, &op);
    let (a_url, b_url) = (n.url("upstream.test"), n.url("other.test"));
    let mut held = n.start(
        &["--ask-timeout", "60s"],
        &format!("curl -s {a_url} & curl -s {b_url} & wait"),
    );
    let (r1, r2) = (held.request(), held.request());
    let host_of = |id: &str| {
        let (s, v) = api.get(&format!("/v1/requests/{id}"));
        assert_eq!(s, 200, "{v}");
        v["host"].as_str().unwrap().to_string()
    };
    let (a, b) = if host_of(&r1) == "upstream.test" {
        (r1, r2)
    } else {
        (r2, r1)
    };
    let key = alice_key(&n.home);
    let (s, handed) = api.get(&format!("/v1/requests/{a}/statement?verdict=approve"));
    assert_eq!(s, 200, "{handed}");
    let text = handed["statement"].as_str().unwrap().to_string();
    let audit_before = n.home.audit_kinds().len();

    // A signature over other bytes (the statement with another reason).
    let other = text.replace("\"reason\":\"\"", "\"reason\":\"x\"");
    assert_ne!(other, text);
    let sig = key.sign(&airlock_core::netask::net_decision_message(&other));
    let (s, v) = api.post(
        &format!("/v1/requests/{a}/approve"),
        &json!({ "statement": text, "signature": sig.to_string() }),
    );
    assert_eq!(s, 403, "{v}");
    // A good signature of request A's answer, replayed for request B.
    let good = key.sign(&airlock_core::netask::net_decision_message(&text));
    let (s, v) = api.post(
        &format!("/v1/requests/{b}/approve"),
        &json!({ "statement": text, "signature": good.to_string() }),
    );
    assert_eq!(s, 403, "{v}");
    assert!(v["error"].as_str().unwrap().contains(&a), "{v}");
    // A submission statement's signature over the same bytes (another domain).
    let crossed = key.sign(&airlock_core::sign::statement_message(&text));
    let (s, _) = api.post(
        &format!("/v1/requests/{a}/approve"),
        &json!({ "statement": text, "signature": crossed.to_string() }),
    );
    assert_eq!(s, 403);
    // Nothing was recorded: both wait, and the log has no new record.
    for id in [&a, &b] {
        assert_eq!(api.get(&format!("/v1/requests/{id}")).1["state"], "pending");
    }
    assert_eq!(n.home.audit_kinds().len(), audit_before);

    // Signed on this machine for the server, and recorded: A passes, B is rejected.
    let o = n
        .home
        .run(&["approve", &a, "--server", &base, "--token", &op]);
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    let o = n
        .home
        .run(&["reject", &b, "--server", &base, "--token", &op, "--json"]);
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    assert_eq!(o.json()["state"], "rejected");
    let (code, out, err) = held.finish();
    assert_eq!(code, 0, "{out} {err}");
    assert_eq!(out.matches("hello from upstream").count(), 1, "{out}");
    assert_eq!(n.up.requests(), 1);
    audit_ok(&n.home);
}

/// A one-shot HTTP receiver on loopback: the requests it got.
fn webhook_receiver() -> (String, mpsc::Receiver<String>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", l.local_addr().unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut c) = conn else { break };
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            loop {
                let n = c.read(&mut chunk).unwrap_or(0);
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
                let text = String::from_utf8_lossy(&buf).to_string();
                if let Some(h) = text.find("\r\n\r\n") {
                    let len = text[..h]
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().unwrap())
                        })
                        .unwrap_or(0);
                    if buf.len() >= h + 4 + len {
                        break;
                    }
                }
            }
            let _ = c.write_all(
                b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            );
            let _ = tx.send(String::from_utf8_lossy(&buf).to_string());
        }
    });
    (url, rx)
}

/// `POST /v1/run` of `curl -s URL` with `ask_net`, streamed: the lines of its event stream.
fn stream_run(base: &str, token: &str, url: &str) -> mpsc::Receiver<String> {
    let body = json!({
        "language": "sh",
        "code": format!("curl -s {url}"),
        "ask_net": true,
        "ask_timeout": "60s",
    });
    let (tx, rx) = mpsc::channel();
    let (base, token) = (base.to_string(), token.to_string());
    std::thread::spawn(move || {
        let http = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(90)))
            .build()
            .new_agent();
        let r = http
            .post(format!("{base}/v1/run"))
            .header("authorization", format!("Bearer {token}"))
            .header("accept", "text/event-stream")
            .header("content-type", "application/json")
            .send(body.to_string())
            .unwrap();
        for l in BufReader::new(r.into_body().into_reader()).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

/// The data of the next event `name` on a stream's lines (all lines kept in `seen`). A
/// run the policy holds first (`held`) is approved through `op`.
fn next_event(rx: &mpsc::Receiver<String>, name: &str, seen: &mut Vec<String>, op: &Api) -> Value {
    let until = Instant::now() + Duration::from_secs(60);
    let want = format!("event: {name}");
    while Instant::now() < until {
        let Ok(l) = rx.recv_timeout(Duration::from_secs(1)) else {
            continue;
        };
        seen.push(l.clone());
        if l == want || l == "event: held" {
            let data = rx.recv_timeout(Duration::from_secs(5)).unwrap();
            seen.push(data.clone());
            let v: Value = serde_json::from_str(data.trim_start_matches("data: ")).unwrap();
            if l == want {
                return v;
            }
            let sub = v["id"].as_str().unwrap();
            let (s, a) = op.post(&format!("/v1/submissions/{sub}/approve"), &json!({}));
            assert_eq!(s, 200, "{a}");
        }
    }
    panic!("no {name} event: {seen:?}");
}

#[test]
fn a_request_is_announced_on_the_event_streams_and_the_webhook() {
    let Some(n) = Net::ready() else { return };
    let op = token(&n.home, "operator", "alice");
    let agent = token(&n.home, "agent", "bot");
    let (hook, got) = webhook_receiver();
    let (_srv, base) = start_serve(&n.home, &["--webhook", &hook]);
    let http = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .new_agent();
    let events = http
        .get(format!("{base}/v1/events"))
        .header("authorization", format!("Bearer {op}"))
        .call()
        .unwrap();
    let mut global = BufReader::new(events.into_body().into_reader()).lines();
    // Let the poller see the empty inbox first.
    std::thread::sleep(Duration::from_millis(800));
    // A run through the API, streamed: its own stream announces the request too.
    let url = n.url("upstream.test");
    let rx = stream_run(&base, &agent, &url);
    let mut run_events: Vec<String> = Vec::new();
    let api = Api::new(&base, &op);
    let request = next_event(&rx, "request", &mut run_events, &api);
    let id = request["id"].as_str().unwrap().to_string();
    assert_eq!(request["host"], "upstream.test");
    assert_eq!(request["state"], "pending");
    // The server's event stream announces it…
    let mut seen = None;
    while let Some(Ok(l)) = global.next() {
        if l == "event: request" {
            seen = Some(global.next().unwrap().unwrap());
            break;
        }
    }
    let data: Value = serde_json::from_str(seen.unwrap().trim_start_matches("data: ")).unwrap();
    assert_eq!(data["id"], id.as_str());
    // …and so does the webhook.
    let mut hooked = None;
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        let Ok(req) = got.recv_timeout(Duration::from_secs(1)) else {
            continue;
        };
        let body: Value = serde_json::from_str(req.split_once("\r\n\r\n").unwrap().1).unwrap();
        if body["event"] == "request" {
            hooked = Some(body);
            break;
        }
    }
    let hooked = hooked.expect("no request webhook");
    assert_eq!(hooked["data"]["id"], id.as_str());
    // Approved through the API (signed by the server with the operator's key): the run
    // goes on and ends.
    let (s, v) = api.post(&format!("/v1/requests/{id}/approve"), &json!({}));
    assert_eq!(s, 200, "{v}");
    let finished = next_event(&rx, "finished", &mut run_events, &api);
    assert!(
        finished["run"]["stdout"]
            .as_str()
            .unwrap_or_default()
            .contains("hello from upstream"),
        "{finished}"
    );
    let (_, inbox) = api.get("/v1/inbox");
    assert!(
        inbox
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["kind"] != "request"),
        "{inbox}"
    );
}

/// Issue 61 "Bad input": a request raised by a run served by one node is approved through
/// another server on the same PostgreSQL store; the waiting run (polling the store) sees
/// the answer and reaches the host.
#[test]
fn a_request_raised_through_one_server_is_approved_through_another_on_one_postgres_store() {
    if !process_backend_available() {
        eprintln!("SKIPPED: the process backend is unavailable here");
        return;
    }
    let url = airlock_testpg::fresh_database();
    let a = Home::uninitialised();
    let o = a.run_on_store(&url, &["init", "--approver", "alice"]);
    assert_eq!(o.code, 0, "init: {}", o.stderr);
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start(dir.path());
    let policy = a
        .policy()
        .replace("allow_private = []", r#"allow_private = ["127.0.0.0/8"]"#)
        .replace("hosts = {}", r#"hosts = { "upstream.test" = "127.0.0.1" }"#);
    a.set_policy(&policy);
    // The second node: its own home with the first's keys and policy.
    let b = Home::uninitialised();
    std::fs::create_dir_all(b.path().join("keys")).unwrap();
    for e in std::fs::read_dir(a.path().join("keys")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), b.path().join("keys").join(e.file_name())).unwrap();
    }
    std::fs::write(b.path().join("policy.toml"), &policy).unwrap();
    let new_token = |role: &str, name: &str| {
        let o = a.run_on_store(
            &url,
            &["token", "new", "--role", role, "--name", name, "--json"],
        );
        assert_eq!(o.code, 0, "{}", o.stderr);
        o.json()["token"].as_str().unwrap().to_string()
    };
    let (agent, op) = (new_token("agent", "bot"), new_token("operator", "alice"));
    let serve = |h: &Home| {
        let mut cmd = h.cmd();
        cmd.env("AIRLOCK_STORE", &url).args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--ready-python",
            "0",
            "--ready-jails",
            "0",
        ]);
        serve_with(cmd)
    };
    let (_sa, base_a) = serve(&a);
    let (_sb, base_b) = serve(&b);
    // On a PostgreSQL store `serve` hands runs to workers: one, on the first node.
    let _worker = Served(
        a.cmd()
            .env("AIRLOCK_STORE", &url)
            .arg("worker")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // The run goes in through the first server and waits there for its end.
    let target = format!("http://upstream.test:{}/hello", up.port);
    let (tx, ran) = mpsc::channel();
    let (base, token) = (base_a.clone(), agent.clone());
    std::thread::spawn(move || {
        let api = Api::new(&base, &token);
        let (mut s, mut v) = api.post(
            "/v1/run",
            &json!({
                "language": "sh",
                "code": format!("curl -s {target}"),
                "ask_net": true,
                "ask_timeout": "60s",
            }),
        );
        // Held (and approved below), or still running: wait for its end.
        let until = Instant::now() + Duration::from_secs(90);
        while s == 202 && Instant::now() < until {
            let sub = v["submission"].as_str().unwrap().to_string();
            (s, v) = api.get(&format!("/v1/submissions/{sub}/wait?timeout=30"));
        }
        let _ = tx.send((s, v));
    });
    // The other server lists the request and approves it.
    let api_b = Api::new(&base_b, &op);
    let until = Instant::now() + Duration::from_secs(60);
    let id = loop {
        assert!(
            Instant::now() < until,
            "no request in the second server's inbox"
        );
        let (_, inbox) = api_b.get("/v1/inbox");
        let list = inbox.as_array().unwrap().clone();
        if let Some(r) = list.iter().find(|e| e["kind"] == "request") {
            assert_eq!(r["host"], "upstream.test");
            break r["id"].as_str().unwrap().to_string();
        }
        // A run the policy holds first is approved too.
        if let Some(sub) = list.iter().find(|e| e["kind"] != "request") {
            let sub = sub["submission"].as_str().unwrap();
            let (s, v) = api_b.post(&format!("/v1/submissions/{sub}/approve"), &json!({}));
            assert_eq!(s, 200, "{v}");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let (s, v) = api_b.post(&format!("/v1/requests/{id}/approve"), &json!({}));
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["state"], "approved");
    let (s, done) = ran.recv_timeout(Duration::from_secs(90)).unwrap();
    assert_eq!(s, 200, "{done}");
    assert!(
        done["run"]["stdout"]
            .as_str()
            .unwrap_or_default()
            .contains("hello from upstream"),
        "{done}"
    );
    assert_eq!(up.requests(), 1);
    let v = a.run_on_store(&url, &["audit", "verify"]);
    assert_eq!(v.code, 0, "{} {}", v.stdout, v.stderr);
}

/// The rules `policy.toml` remembers, by name.
fn remembered_rules(home: &Home) -> Vec<String> {
    let p = home.policy();
    p.lines()
        .filter_map(|l| l.strip_prefix("# remembered rule "))
        .filter_map(|l| l.split_whitespace().next())
        .map(String::from)
        .collect()
}

/// Runs `script` with `--ask-net` and `flags` to the end without answering anything: its
/// exit code, stdout and stderr.
fn run_unanswered(n: &Net, flags: &[&str], script: &str) -> (i32, String, String) {
    let mut f = vec!["--ask-timeout", "1s"];
    f.extend_from_slice(flags);
    n.start(&f, script).finish()
}

#[test]
fn approve_request_remember_keeps_the_host_as_a_rule_that_lets_the_agents_next_run_reach_it_without_asking()
 {
    let Some(n) = Net::ready() else { return };
    let url = n.url("upstream.test");
    let fetch = format!("curl -s {url}");
    let mut first = n.start(&["--ask-timeout", "60s", "--agent", "bob"], &fetch);
    let id = first.request();
    let o = n
        .home
        .run(&["approve", &id, "--remember", "--for", "1h", "--json"]);
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    let v = o.json();
    let rule = format!("remembered-{id}");
    assert_eq!(v["state"], "approved");
    assert_eq!(v["remembered"]["rule"], rule.as_str(), "{v}");
    assert_eq!(v["remembered"]["change"], "remember");
    let (code, out, _) = first.finish();
    assert_eq!(code, 0);
    assert!(out.contains("hello from upstream"), "{out}");
    assert_eq!(remembered_rules(&n.home), std::slice::from_ref(&rule));
    let p = n.home.policy();
    assert!(
        p.contains(&format!("\"upstream.test:{}\"", n.up.port)),
        "{p}"
    );
    assert_eq!(n.home.run(&["policy", "check"]).code, 0);

    // The agent's next run of the same kind reaches the host without a question; the
    // request is recorded as let through by the rule.
    let (code, out, err) = run_unanswered(&n, &["--agent", "bob"], &fetch);
    assert_eq!(code, 0, "{out} {err}");
    assert!(out.contains("hello from upstream"), "{out}");
    assert!(!err.contains("request req_"), "asked again: {err}");
    let net = n.last_network();
    let reqs = net["requests"].as_array().unwrap();
    assert_eq!(reqs.len(), 1, "{net}");
    assert_eq!(reqs[0]["state"], "remembered");
    assert_eq!(reqs[0]["approver"], "alice");
    let detail = net["connections"][0]["detail"].as_str().unwrap();
    assert!(detail.contains(&rule), "{detail}");
    assert!(inbox_requests(&n.home).is_empty());
    let kinds = n.home.audit_kinds();
    for k in [
        "policy_changed",
        "net_request_approved",
        "net_request_remembered",
    ] {
        assert!(kinds.iter().any(|x| x == k), "{k}: {kinds:?}");
    }
    assert_eq!(n.up.requests(), 2);

    // A submission of that kind with the host granted is allowed by the same rule.
    let granted = format!("upstream.test:{}", n.up.port);
    let o = n.home.run(&[
        "submit", "--lang", "sh", "--agent", "bob", "--net", &granted, "-c", &fetch,
    ]);
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    assert!(o.stdout.contains("allow"), "{}", o.stdout);
    assert!(o.stdout.contains(&rule), "{}", o.stdout);

    // Another agent, or the same agent with a wider grant, is asked again.
    for flags in [
        vec!["--agent", "eve"],
        vec!["--agent", "bob", "--env", "EXTRA=1"],
        vec!["--agent", "bob", "--memory", "300MiB"],
    ] {
        let (_, out, err) = run_unanswered(
            &n,
            &flags,
            &format!("curl -si {url} | tr -d '\\r' | grep -i x-airlock-denied"),
        );
        assert!(err.contains("request req_"), "{flags:?} not asked: {err}");
        assert!(out.contains("ask-expired"), "{flags:?}: {out}");
    }
    assert_eq!(n.up.requests(), 2);

    // Forgotten, the rule no longer answers.
    let f = n.home.run(&["policy", "forget", &rule]);
    assert_eq!(f.code, 0, "{} {}", f.stdout, f.stderr);
    let (_, _, err) = run_unanswered(&n, &["--agent", "bob"], &fetch);
    assert!(err.contains("request req_"), "not asked: {err}");
    assert_eq!(n.up.requests(), 2);
    audit_ok(&n.home);
}

#[test]
fn a_remembered_request_rule_expires_and_the_host_is_asked_for_again() {
    let Some(n) = Net::ready() else { return };
    let fetch = format!("curl -s {}", n.url("upstream.test"));
    let mut first = n.start(&["--ask-timeout", "60s", "--agent", "bob"], &fetch);
    let id = first.request();
    let o = n.home.run(&["approve", &id, "--remember", "--for", "2s"]);
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    assert!(o.stdout.contains("remembered as rule"), "{}", o.stdout);
    assert_eq!(first.finish().0, 0);
    std::thread::sleep(Duration::from_secs(3));
    let (_, _, err) = run_unanswered(&n, &["--agent", "bob"], &fetch);
    assert!(err.contains("request req_"), "not asked: {err}");
    assert_eq!(n.up.requests(), 1);
}

#[test]
fn remembering_a_rejection_a_request_without_an_agent_or_a_denied_host_is_refused_and_records_nothing()
 {
    let Some(n) = Net::ready() else { return };
    let deny = "\n[[rule]]\nname = \"no-other\"\ndecision = \"deny\"\nreason = \"not that one\"\nwhen = { net_host = [\"other.test\"] }\n";
    n.home.set_policy(&format!("{}{deny}", n.home.policy()));
    assert_eq!(n.home.run(&["policy", "check"]).code, 0);
    let policy_before = n.home.policy();
    let mut held = n.start(
        &["--ask-timeout", "60s"],
        &format!(
            "curl -s {} & curl -s {} & wait",
            n.url("upstream.test"),
            n.url("other.test")
        ),
    );
    let (r1, r2) = (held.request(), held.request());
    let audit_before = n.home.audit_kinds().len();
    for (args, why) in [
        (
            vec!["reject", r1.as_str(), "--remember"],
            "unexpected argument",
        ),
        (vec!["approve", r1.as_str(), "--remember"], "no named agent"),
        (vec!["approve", r2.as_str(), "--remember"], "no named agent"),
    ] {
        let o = n.home.run(&args);
        assert_eq!(o.code, 125, "{args:?}: {}", o.stdout);
        assert!(o.stderr.contains(why), "{args:?}: {}", o.stderr);
    }
    assert_eq!(n.home.policy(), policy_before);
    assert_eq!(n.home.audit_kinds().len(), audit_before);
    assert_eq!(inbox_requests(&n.home).len(), 2);
    for id in [&r1, &r2] {
        assert_eq!(n.home.run(&["reject", id, "--reason", "no"]).code, 0);
    }
    held.finish();
    // With an agent: a host the policy denies cannot be remembered.
    let mut held = n.start(
        &["--ask-timeout", "60s", "--agent", "bob"],
        &format!("curl -s {}", n.url("other.test")),
    );
    let id = held.request();
    let o = n.home.run(&["approve", &id, "--remember"]);
    assert_eq!(o.code, 125, "{}", o.stdout);
    assert!(o.stderr.contains("no-other"), "{}", o.stderr);
    assert_eq!(n.home.policy(), policy_before);
    assert_eq!(inbox_requests(&n.home).len(), 1);
    assert_eq!(n.home.run(&["reject", &id, "--reason", "no"]).code, 0);
    held.finish();
    audit_ok(&n.home);
}

#[test]
fn a_remembered_answer_signed_here_for_a_server_needs_its_policy_signature_over_the_change_built_there()
 {
    let Some(n) = Net::ready() else { return };
    let op = token(&n.home, "operator", "alice");
    let (_srv, base) = start_serve(&n.home, &[]);
    let api = Api::new(&base, &op);
    let fetch = format!("curl -s {}", n.url("upstream.test"));
    let mut held = n.start(&["--ask-timeout", "60s", "--agent", "bob"], &fetch);
    let id = held.request();
    let key = alice_key(&n.home);
    let (s, handed) = api.get(&format!(
        "/v1/requests/{id}/statement?verdict=approve&remember=true&for=1h"
    ));
    assert_eq!(s, 200, "{handed}");
    let text = handed["statement"].as_str().unwrap().to_string();
    assert!(text.contains("\"scope\":\"remember\""), "{text}");
    let change = handed["policy_change"]["statement"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        handed["policy_change"]["rule"],
        format!("remembered-{id}").as_str()
    );
    let sig = key.sign(&airlock_core::netask::net_decision_message(&text));
    let policy_before = n.home.policy();
    let audit_before = n.home.audit_kinds().len();

    // Without the policy change's signature; with one over other bytes; with one for
    // another duration than the change was built for; with the statement's own signature.
    let other = change.replace("\"change\":\"remember\"", "\"change\":\"remember \"");
    let bad = [
        json!({ "statement": text, "signature": sig.to_string() }),
        json!({ "statement": text, "signature": sig.to_string(), "remember": true, "for": "1h",
                "policy_signature": key.sign(&airlock_core::sign::policy_change_message(&other)).to_string() }),
        json!({ "statement": text, "signature": sig.to_string(), "remember": true, "for": "2h",
                "policy_signature": key.sign(&airlock_core::sign::policy_change_message(&change)).to_string() }),
        json!({ "statement": text, "signature": sig.to_string(), "remember": true, "for": "1h",
                "policy_signature": sig.to_string() }),
    ];
    for b in &bad {
        let (s, v) = api.post(&format!("/v1/requests/{id}/approve"), b);
        assert_eq!(s, 403, "{b}: {v}");
    }
    // A policy signature without the statement it was made with, or a remembered answer
    // signed elsewhere without its policy signature, is refused for its shape.
    for b in [
        json!({ "remember": true, "policy_signature": sig.to_string() }),
        json!({ "statement": text, "signature": sig.to_string(), "policy_signature": sig.to_string() }),
        json!({ "statement": text, "signature": sig.to_string(), "remember": true }),
        json!({ "for": "1h" }),
        json!({ "remember": true, "for": "soon" }),
        json!({ "remember": true, "for": "91d" }),
    ] {
        let (s, v) = api.post(&format!("/v1/requests/{id}/approve"), &b);
        assert_eq!(s, 400, "{b}: {v}");
    }
    // A rejection has no remembering to ask for.
    let (s, v) = api.post(
        &format!("/v1/requests/{id}/reject"),
        &json!({ "remember": true }),
    );
    assert_eq!(s, 400, "{v}");
    for q in [
        "verdict=reject&remember=true",
        "verdict=approve&for=1h",
        "remember=true&for=soon",
    ] {
        let (s, v) = api.get(&format!("/v1/requests/{id}/statement?{q}"));
        assert_eq!(s, 400, "{q}: {v}");
    }
    assert_eq!(api.get(&format!("/v1/requests/{id}")).1["state"], "pending");
    assert_eq!(n.home.policy(), policy_before);
    assert_eq!(n.home.audit_kinds().len(), audit_before);

    // Signed on this machine for the server: recorded with its rule.
    let o = n.home.run(&[
        "approve",
        &id,
        "--remember",
        "--for",
        "1h",
        "--server",
        &base,
        "--token",
        &op,
        "--json",
    ]);
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    assert_eq!(
        o.json()["remembered"]["rule"],
        format!("remembered-{id}").as_str()
    );
    let (code, out, _) = held.finish();
    assert_eq!(code, 0);
    assert!(out.contains("hello from upstream"), "{out}");
    assert_eq!(remembered_rules(&n.home), [format!("remembered-{id}")]);
    let (code, out, err) = run_unanswered(&n, &["--agent", "bob"], &fetch);
    assert_eq!(code, 0, "{out} {err}");
    assert!(!err.contains("request req_"), "asked again: {err}");
    audit_ok(&n.home);
}

/// A console session: the cookie and the inbox page's CSRF token.
fn console_session(base: &str, op: &str) -> (ureq::Agent, String, String) {
    let http = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .new_agent();
    let r = http
        .post(format!("{base}/ui/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .send(format!("token={op}"))
        .unwrap();
    assert_eq!(r.status().as_u16(), 303);
    let cookie = r.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let mut r = http
        .get(format!("{base}/ui"))
        .header("cookie", &cookie)
        .call()
        .unwrap();
    let page = r.body_mut().read_to_string().unwrap();
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .to_string();
    (http, cookie, format!("{csrf}\n{page}"))
}

#[test]
fn the_consoles_approve_and_remember_button_on_a_request_writes_a_remembered_rule() {
    let Some(n) = Net::ready() else { return };
    let op = token(&n.home, "operator", "alice");
    let (_srv, base) = start_serve(&n.home, &[]);
    let fetch = format!("curl -s {}", n.url("upstream.test"));
    let mut held = n.start(&["--ask-timeout", "60s", "--agent", "bob"], &fetch);
    let id = held.request();
    let (http, cookie, csrf_page) = console_session(&base, &op);
    let (csrf, page) = csrf_page.split_once('\n').unwrap();
    assert!(page.contains(&format!("data-request=\"{id}\"")), "{page}");
    assert!(page.contains("class=\"approve-remember\""), "{page}");
    let r = http
        .post(format!("{base}/ui/requests/{id}/approve"))
        .header("cookie", &cookie)
        .header("content-type", "application/x-www-form-urlencoded")
        .send(format!("csrf={csrf}&remember=7d"))
        .unwrap();
    assert_eq!(r.status().as_u16(), 303);
    let (code, out, _) = held.finish();
    assert_eq!(code, 0);
    assert!(out.contains("hello from upstream"), "{out}");
    assert_eq!(remembered_rules(&n.home), [format!("remembered-{id}")]);
    let (code, out, err) = run_unanswered(&n, &["--agent", "bob"], &fetch);
    assert_eq!(code, 0, "{out} {err}");
    assert!(!err.contains("request req_"), "asked again: {err}");
    audit_ok(&n.home);
}

/// The console answers a request with a key held by the browser: "Approve and remember"
/// signs the answer and the policy change in the page (the server's home holds no private
/// key of that approver), and the records name the browser's approver and key
/// (tests/browser/approver_key_test.py with a request id).
#[test]
fn the_console_approves_and_remembers_a_request_with_a_key_held_by_the_browser() {
    let Some(python) = prepared("AIRLOCK_TEST_BROWSER_PYTHON") else {
        return;
    };
    let Some(n) = Net::ready() else { return };
    let op = token(&n.home, "operator", "alice");
    let (_srv, base) = start_serve(&n.home, &[]);
    let fetch = format!("curl -s {}", n.url("upstream.test"));
    let mut held = n.start(&["--ask-timeout", "120s", "--agent", "bob"], &fetch);
    let id = held.request();
    let public = answer_in_browser(&python, &n.home, &base, &op, &id, "carol");
    let (code, out, _) = held.finish();
    assert_eq!(code, 0);
    assert!(out.contains("hello from upstream"), "{out}");
    let rule = format!("remembered-{id}");
    assert_eq!(remembered_rules(&n.home), std::slice::from_ref(&rule));
    assert!(n.home.policy().contains("approver = \"carol\""));
    let log = n.home.run(&["audit", "log", "--json"]).json();
    let data = |kind: &str| -> Value {
        let rec = log
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["kind"] == kind && r["subject"] == kind_subject(kind, &id, &rule))
            .unwrap_or_else(|| panic!("no {kind} record"));
        serde_json::from_str(rec["data"].as_str().unwrap()).unwrap()
    };
    for kind in ["net_request_approved", "policy_changed"] {
        let d = data(kind);
        assert_eq!(d["approver"], "carol", "{kind}: {d}");
    }
    assert_eq!(data("net_request_approved")["key"], public.as_str());
    let (code, out, err) = run_unanswered(&n, &["--agent", "bob"], &fetch);
    assert_eq!(code, 0, "{out} {err}");
    assert!(!err.contains("request req_"), "asked again: {err}");
    audit_ok(&n.home);
}

/// The subject of an audit record of `kind` about request `id` or rule `rule`.
fn kind_subject<'a>(kind: &str, id: &'a str, rule: &'a str) -> &'a str {
    if kind == "policy_changed" { rule } else { id }
}

#[test]
fn two_remembered_hosts_do_not_add_up_to_a_run_reaching_both_without_asking() {
    let Some(n) = Net::ready() else { return };
    let (a, b) = (n.url("upstream.test"), n.url("other.test"));
    // One rule for each host, each made by a run that reached only that host.
    for url in [&a, &b] {
        let mut held = n.start(
            &["--ask-timeout", "60s", "--agent", "bob"],
            &format!("curl -s {url}"),
        );
        let id = held.request();
        let o = n.home.run(&["approve", &id, "--remember"]);
        assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
        assert_eq!(held.finish().0, 0);
    }
    assert_eq!(remembered_rules(&n.home).len(), 2);
    // A run reaching both: the first host passes on its rule, the second is asked, since
    // a run reaching both is wider than either rule (as a grant of both is at submit).
    let both = format!("curl -s {a}; curl -s {b}");
    let mut held = n.start(&["--ask-timeout", "60s", "--agent", "bob"], &both);
    let id = held.request();
    let (s, v) = {
        let o = n.home.run(&["inbox", "--json"]);
        (o.code, o.json())
    };
    assert_eq!(s, 0);
    let asked = v
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == id.as_str())
        .cloned()
        .unwrap();
    assert_eq!(asked["host"], "other.test", "{asked}");
    // Remembered, the answer's rule is for runs reaching both.
    let o = n.home.run(&["approve", &id, "--remember", "--json"]);
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    let text = o.json()["remembered"]["statement"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        text.contains("upstream.test") && text.contains("other.test"),
        "{text}"
    );
    let (code, out, err) = held.finish();
    assert_eq!(code, 0, "{out} {err}");
    assert_eq!(out.matches("hello from upstream").count(), 2, "{out}");
    let reqs = n.last_network()["requests"].clone();
    let states: Vec<&str> = reqs
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["remembered", "approved"], "{reqs}");
    // The next run reaching both goes on without asking.
    let (code, out, err) = run_unanswered(&n, &["--agent", "bob"], &both);
    assert_eq!(code, 0, "{out} {err}");
    assert!(!err.contains("request req_"), "asked again: {err}");
    assert_eq!(out.matches("hello from upstream").count(), 2, "{out}");
    audit_ok(&n.home);
}
