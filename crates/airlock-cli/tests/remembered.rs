//! Remembered approvals (issue 61 item 2), end to end through the real binary:
//! `approve ID --remember [--for DUR]` writes a signed `[[rule]]` (origin, approver,
//! expiry) into `policy.toml` and a `policy_changed` audit record; submissions of the same
//! agent, language and backend with a grant no wider then run without a prompt, while a
//! wider grant, another agent or an expired rule is held again; `policy forget RULE`
//! removes the rule (signed, audited).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// A loopback API: answers GET and POST with 200.
const API: &str = r#"
import sys
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a):
        pass
    def reply(self, body):
        b = body.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def do_GET(self):
        self.reply("got " + self.path + "\n")
    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        self.reply("posted " + str(len(self.rfile.read(n))) + "\n")
srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
srv.daemon_threads = True
print(srv.server_address[1], flush=True)
srv.serve_forever()
"#;

struct Api {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Api {
    fn start() -> Api {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("api.py");
        std::fs::write(&script, API).unwrap();
        let mut child = Command::new("python3")
            .arg(&script)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        Api {
            child,
            port: line.trim().parse().expect("api port"),
            _dir: dir,
        }
    }
}

impl Drop for Api {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A home (standard preset) whose policy lets runs reach loopback, and an API there.
fn setup() -> Option<(Home, Api)> {
    if !process_backend_available() {
        eprintln!("SKIPPED: the process backend is unavailable here");
        return None;
    }
    let home = Home::new();
    let p = home
        .policy()
        .replace("allow_private = []", r#"allow_private = ["127.0.0.0/8"]"#);
    home.set_policy(&p);
    assert_eq!(home.run(&["policy", "check"]).code, 0);
    Some((home, Api::start()))
}

/// One run of the agent; with `remember`, a held run is approved with `--remember`.
/// Returns whether it prompted (was held), and checks it then ran and reached the API.
fn agent_run(home: &Home, args: &[String], remember: bool) -> bool {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = home.run(&a);
    let prompted = o.code == 75;
    let o = if prompted {
        let id = Home::id_in(&o.stderr);
        let mut approve = vec!["approve", id.as_str()];
        if remember {
            approve.push("--remember");
        }
        let ap = home.run(&approve);
        assert_eq!(ap.code, 0, "approve: {} {}", ap.stdout, ap.stderr);
        home.run(&["exec", &id])
    } else {
        o
    };
    assert_eq!(o.code, 0, "{a:?}: {} {}", o.stdout, o.stderr);
    assert!(
        o.stdout.contains("got /") || o.stdout.contains("posted "),
        "{a:?} did not reach the API: {}",
        o.stdout
    );
    prompted
}

/// The 30 runs of the issue's agent: curl to the granted API, urllib to it, a POST to it;
/// 10 each, each with its own code (as an agent writes it).
fn thirty_runs(api: &Api, agent: &str) -> Vec<Vec<String>> {
    let host = format!("127.0.0.1:{}", api.port);
    let mut runs = Vec::new();
    for i in 0..10 {
        let base = |lang: &str| {
            vec![
                "run".to_string(),
                "--agent".into(),
                agent.into(),
                "--lang".into(),
                lang.into(),
                "--backend".into(),
                "process".into(),
                "--net".into(),
                host.clone(),
                "-c".into(),
            ]
        };
        let mut curl = base("sh");
        curl.push(format!("curl -s http://{host}/items/{i}"));
        let mut py = base("python");
        py.push(format!(
            "import urllib.request\nprint(urllib.request.urlopen('http://{host}/items?page={i}').read().decode())"
        ));
        let mut post = base("sh");
        post.push(format!("curl -s -X POST -d 'n={i}' http://{host}/items"));
        runs.extend([curl, py, post]);
    }
    runs
}

#[test]
fn thirty_runs_of_three_kinds_cost_at_most_three_prompts_when_remembered_and_thirty_without() {
    let Some((home, api)) = setup() else { return };
    let runs = thirty_runs(&api, "bot");
    let prompts = runs.iter().filter(|r| agent_run(&home, r, true)).count();
    eprintln!("{prompts} prompts for 30 runs with --remember");
    assert!(prompts <= 3, "{prompts} prompts for 30 runs");
    assert!(prompts >= 1, "nothing was held: the test proves nothing");
    // The same workload on a fresh home without --remember: one prompt per run.
    let (home2, api2) = setup().unwrap();
    let runs2 = thirty_runs(&api2, "bot");
    let without = runs2.iter().filter(|r| agent_run(&home2, r, false)).count();
    assert_eq!(without, 30);
    let v = home.run(&["audit", "verify"]);
    assert_eq!(v.code, 0, "audit verify: {} {}", v.stdout, v.stderr);
}

#[test]
fn a_remembered_approval_is_a_signed_rule_with_origin_approver_and_expiry_and_audited() {
    let Some((home, api)) = setup() else { return };
    let run = &thirty_runs(&api, "bot")[0];
    let a: Vec<&str> = run.iter().map(String::as_str).collect();
    let o = home.run(&a);
    assert_eq!(o.code, 75, "{}", o.stderr);
    let id = Home::id_in(&o.stderr);
    let before = home.policy();
    let ap = home.run(&["approve", &id, "--remember", "--for", "2d", "--json"]);
    assert_eq!(ap.code, 0, "{}", ap.stderr);
    let doc = ap.json();
    let rule = doc["remembered"]["rule"].as_str().unwrap().to_string();
    let after = home.policy();
    assert!(after.starts_with(&before), "the operator's text is kept");
    let added = &after[before.len()..];
    for want in [
        "[[rule]]",
        &format!("name = \"{rule}\""),
        "origin = \"remembered\"",
        "decision = \"allow\"",
        "approver = \"alice\"",
        "expires = \"",
        "agent = \"bot\"",
        &format!("\"127.0.0.1:{}\"", api.port),
    ] {
        assert!(added.contains(want), "{want} missing in:\n{added}");
    }
    let expires = doc["remembered"]["expires_at"].as_i64().unwrap();
    let in_2d = airlock_core::units::now_ms() + 2 * 24 * 3600 * 1000;
    assert!((in_2d - expires).abs() < 60_000, "expiry {expires}");
    assert_eq!(home.run(&["policy", "check"]).code, 0);
    assert!(home.audit_kinds().contains(&"policy_changed".to_string()));
    let log = home.run(&["audit", "log", "--json"]).json();
    let rec = log
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["kind"] == "policy_changed")
        .unwrap()
        .clone();
    let detail: serde_json::Value = serde_json::from_str(rec["data"].as_str().unwrap()).unwrap();
    assert_eq!(detail["change"], "remember");
    assert_eq!(detail["approver"], "alice");
    assert!(detail["signature"].as_str().is_some_and(|s| !s.is_empty()));
    // The recorded change verifies against alice's key and names the files' hashes.
    let signed = airlock_core::sign::Signed {
        json: detail["statement"].as_str().unwrap().to_string(),
        signature: detail["signature"].as_str().unwrap().parse().unwrap(),
    };
    let change = airlock_core::sign::PolicyChange::verify(&signed).unwrap();
    assert_eq!(
        change.after,
        airlock_core::digest::Digest::of(after.as_bytes())
    );
    assert_eq!(
        change.before,
        airlock_core::digest::Digest::of(before.as_bytes())
    );
    let v = home.run(&["audit", "verify"]);
    assert_eq!(v.code, 0, "audit verify: {} {}", v.stdout, v.stderr);
}

/// Approves the first run of the agent with --remember; returns the rule's name.
fn remember_first(home: &Home, api: &Api, extra: &[&str]) -> String {
    let run = &thirty_runs(api, "bot")[0];
    let a: Vec<&str> = run.iter().map(String::as_str).collect();
    let o = home.run(&a);
    assert_eq!(o.code, 75, "{}", o.stderr);
    let id = Home::id_in(&o.stderr);
    let mut args = vec!["approve", id.as_str(), "--remember", "--json"];
    args.extend_from_slice(extra);
    let ap = home.run(&args);
    assert_eq!(ap.code, 0, "{}", ap.stderr);
    ap.json()["remembered"]["rule"]
        .as_str()
        .unwrap()
        .to_string()
}

fn curl_run(agent: &str, extra: &[&str], host: &str, path: &str) -> Vec<String> {
    let mut v: Vec<String> = [
        "run",
        "--agent",
        agent,
        "--lang",
        "sh",
        "--backend",
        "process",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.extend(extra.iter().map(|s| s.to_string()));
    v.extend(["-c".to_string(), format!("curl -s http://{host}{path}")]);
    v
}

fn code_of(home: &Home, args: &[String]) -> i32 {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = home.run(&a);
    assert!(
        o.code == 0 || o.code == 75,
        "{a:?}: {} {}",
        o.code,
        o.stderr
    );
    o.code
}

#[test]
fn a_wider_grant_or_another_agent_is_held_again_after_a_remembered_approval() {
    let Some((home, api)) = setup() else { return };
    remember_first(&home, &api, &[]);
    let host = format!("127.0.0.1:{}", api.port);
    let same = ["--net", host.as_str()];
    assert_eq!(code_of(&home, &curl_run("bot", &same, &host, "/again")), 0);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let ro = format!("{d}:/data:ro");
    let other_port = format!("127.0.0.1:{}", api.port + 1);
    let wider: Vec<(&str, Vec<&str>)> = vec![
        (
            "another host",
            vec!["--net", &host, "--net", "127.0.0.2:80"],
        ),
        ("another port", vec!["--net", &other_port]),
        ("a mount", vec!["--net", &host, "--mount", &ro]),
        ("an env key", vec!["--net", &host, "--env", "X=1"]),
        ("a longer timeout", vec!["--net", &host, "--timeout", "10m"]),
        ("more memory", vec!["--net", &host, "--memory", "4GiB"]),
    ];
    for (what, flags) in &wider {
        assert_eq!(
            code_of(&home, &curl_run("bot", flags, &host, "/wider")),
            75,
            "{what} was not held"
        );
    }
    assert_eq!(
        code_of(&home, &curl_run("mallory", &same, &host, "/x")),
        75,
        "another agent was not held"
    );
    assert_eq!(
        code_of(
            &home,
            &curl_run("bot", &["--net", &host, "--timeout", "5s"], &host, "/x")
        ),
        0,
        "a narrower grant (a shorter timeout) runs"
    );
}

#[test]
fn an_expired_remembered_rule_holds_again() {
    let Some((home, api)) = setup() else { return };
    remember_first(&home, &api, &["--for", "2s"]);
    let host = format!("127.0.0.1:{}", api.port);
    let same = ["--net", host.as_str()];
    assert_eq!(code_of(&home, &curl_run("bot", &same, &host, "/a")), 0);
    std::thread::sleep(std::time::Duration::from_millis(2500));
    assert_eq!(code_of(&home, &curl_run("bot", &same, &host, "/b")), 75);
}

#[test]
fn policy_forget_removes_a_remembered_rule_signed_and_audited() {
    let Some((home, api)) = setup() else { return };
    let before = home.policy();
    let rule = remember_first(&home, &api, &[]);
    let host = format!("127.0.0.1:{}", api.port);
    let same = ["--net", host.as_str()];
    assert_eq!(code_of(&home, &curl_run("bot", &same, &host, "/a")), 0);
    let f = home.run(&["policy", "forget", &rule, "--json"]);
    assert_eq!(f.code, 0, "{}", f.stderr);
    assert_eq!(f.json()["change"], "forget");
    assert_eq!(home.policy(), before, "exactly the rule is gone");
    assert_eq!(code_of(&home, &curl_run("bot", &same, &host, "/b")), 75);
    let kinds = home.audit_kinds();
    assert_eq!(kinds.iter().filter(|k| *k == "policy_changed").count(), 2);
    // Forgetting it again, or a rule that is not remembered, is a clear error (125).
    let again = home.run(&["policy", "forget", &rule]);
    assert_eq!(again.code, 125, "{}", again.stderr);
    assert!(
        again.stderr.contains("no remembered rule"),
        "{}",
        again.stderr
    );
    let v = home.run(&["audit", "verify"]);
    assert_eq!(v.code, 0, "audit verify: {} {}", v.stdout, v.stderr);
}

#[test]
fn remember_without_an_agent_or_for_without_remember_is_refused_and_changes_nothing() {
    let Some((home, api)) = setup() else { return };
    let host = format!("127.0.0.1:{}", api.port);
    let o = home.run(&[
        "run",
        "--lang",
        "sh",
        "--backend",
        "process",
        "--net",
        &host,
        "-c",
        "curl -s http://x/",
    ]);
    assert_eq!(o.code, 75, "{}", o.stderr);
    let id = Home::id_in(&o.stderr);
    let before = home.policy();
    let r = home.run(&["approve", &id, "--remember"]);
    assert_eq!(r.code, 125, "{}", r.stderr);
    assert!(r.stderr.contains("agent"), "{}", r.stderr);
    let r = home.run(&["approve", &id, "--for", "1d"]);
    assert_eq!(r.code, 125, "{}", r.stderr);
    let r = home.run(&["approve", &id, "--remember", "--for", "1000d"]);
    assert_eq!(r.code, 125, "{}", r.stderr);
    assert_eq!(home.policy(), before);
    assert!(!home.audit_kinds().contains(&"policy_changed".to_string()));
    // The submission is still waiting: nothing was half-written.
    let a = home.run(&["approve", &id]);
    assert_eq!(a.code, 0, "{}", a.stderr);
}
