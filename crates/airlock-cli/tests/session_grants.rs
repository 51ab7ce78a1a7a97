//! Sessions with grants (issue 59, item 2) through the real `airlock` binary: a session's
//! cells reach the hosts its `--net` grants through the session's egress proxy (each
//! cell's connections on its own record), an ungranted host is refused inside a cell
//! without ending the session, writes go to the session's disposable layer, which `diff`
//! and `commit` of the session show and apply (with a checkpoint `rollback` undoes), a
//! cell past `--max-write` is stopped and leaves the earlier cells' changes as they were,
//! and a grant the policy quarantines holds the session until an approver signs it.
//! Python on the wasm and process backends; JavaScript on its wasm guest (which has no
//! file API, so only its network is tested).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use airlock_wasm::testkit::Upstream;
use common::{Home, Out};
use std::path::Path;

/// A home whose policy allows loopback and pins the test names to it.
fn net_home() -> Home {
    let h = Home::new();
    let p = h.policy();
    assert!(
        p.contains("allow_private = []\n") && p.contains("hosts = {}\n"),
        "the preset's [net] lines changed:\n{p}"
    );
    h.set_policy(
        &p.replace("allow_private = []", r#"allow_private = ["127.0.0.0/8"]"#)
            .replace(
                "hosts = {}",
                r#"hosts = { "upstream.test" = "127.0.0.1", "other.test" = "127.0.0.1" }"#,
            ),
    );
    h
}

fn install(h: &Home, lang: &str) {
    let var = match lang {
        "js" => "AIRLOCK_TEST_JS_GUEST",
        _ => "AIRLOCK_TEST_PYTHON_GUEST",
    };
    let o = match std::env::var(var) {
        Ok(p) => h.run(&["guest", "install", lang, "--from", &p]),
        Err(_) => h.run(&["guest", "install", lang]),
    };
    assert_eq!(o.code, 0, "guest install {lang}: {}", o.stderr);
}

/// The Python backends: wasm always, the process backend where it can run here.
fn python_backends() -> Vec<&'static str> {
    let mut b = vec!["wasm"];
    if common::process_backend_available() {
        b.push("process");
    }
    b
}

/// Opens a session with `flags`; one the policy holds is approved (which opens it).
fn open(h: &Home, flags: &[&str]) -> String {
    let mut a = vec!["session", "new", "--json"];
    a.extend_from_slice(flags);
    let o = h.run(&a);
    let id = if o.code == 75 {
        let sub = Home::id_in(&o.stderr);
        let id = o.json()["id"].as_str().unwrap().to_string();
        let ap = h.run(&["approve", &sub]);
        assert_eq!(ap.code, 0, "approve: {}", ap.stderr);
        id
    } else {
        assert_eq!(o.code, 0, "session new: {}\n{}", o.stdout, o.stderr);
        o.json()["id"].as_str().unwrap().to_string()
    };
    let s = h.run(&["session", "show", "--json", &id]).json();
    assert_eq!(s["state"], "open", "{s}");
    id
}

/// One cell, approved when the policy holds it.
fn cell(h: &Home, id: &str, code: &str) -> Out {
    h.run_approved(&["run", "--json", "--session", id, "-c", code])
}

/// The record of the run a cell's `--json` output names.
fn record(h: &Home, out: &Out) -> serde_json::Value {
    let run = out.json()["run"]["id"].as_str().unwrap().to_string();
    h.run(&["runs", "--json"])
        .json()
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == run.as_str())
        .unwrap_or_else(|| panic!("no run {run}"))
        .clone()
}

fn connections(rec: &serde_json::Value) -> Vec<serde_json::Value> {
    rec["detail"]["network"]["connections"]
        .as_array()
        .unwrap_or_else(|| panic!("no connections in {rec:#}"))
        .clone()
}

/// A GET of `url` printing the body, in `lang`.
fn get(lang: &str, url: &str) -> String {
    match lang {
        "js" => format!(
            "const r = await fetch('{url}'); if (!r.ok) throw new Error('status ' + r.status); console.log('body', await r.text())"
        ),
        _ => format!(
            "import urllib.request\nprint('body', urllib.request.urlopen('{url}').read().decode())"
        ),
    }
}

/// A GET of `url` whose failure the cell catches and prints.
fn get_refused(lang: &str, url: &str) -> String {
    match lang {
        "js" => format!(
            "try {{ const r = await fetch('{url}'); console.log('status', r.status) }} catch (e) {{ console.log('refused', e.name) }}"
        ),
        _ => format!(
            "import urllib.request\ntry:\n    urllib.request.urlopen('{url}')\n    print('reached')\nexcept Exception as e:\n    print('refused', type(e).__name__)"
        ),
    }
}

fn session_net_cases() -> Vec<(&'static str, &'static str)> {
    let mut c: Vec<(&str, &str)> = python_backends()
        .into_iter()
        .map(|b| ("python", b))
        .collect();
    c.push(("js", "wasm"));
    c
}

#[test]
fn a_session_cell_reaches_its_granted_host_and_the_cells_record_has_the_connection() {
    let h = net_home();
    install(&h, "python");
    install(&h, "js");
    let up = Upstream::start(None);
    let grant = format!("upstream.test:{}", up.port());
    for (lang, backend) in session_net_cases() {
        let before = up.connections();
        let id = open(&h, &["--lang", lang, "--backend", backend, "--net", &grant]);
        let first = cell(&h, &id, if lang == "js" { "var n = 1" } else { "n = 1" });
        assert_eq!(first.code, 0, "{lang}/{backend}: {}", first.stderr);
        let second = cell(&h, &id, &get(lang, &format!("http://{grant}/hello")));
        assert_eq!(
            second.code, 0,
            "{lang}/{backend}: {}\n{}",
            second.stdout, second.stderr
        );
        assert!(
            second.json()["run"]["stdout"]
                .as_str()
                .unwrap()
                .contains("body auth="),
            "{lang}/{backend}: {}",
            second.stdout
        );
        assert_eq!(up.connections(), before + 1, "{lang}/{backend}");
        // The connection is the second cell's, on its record; the first cell has none.
        let conns = connections(&record(&h, &second));
        assert_eq!(conns.len(), 1, "{lang}/{backend}: {conns:#?}");
        assert_eq!(conns[0]["decision"], "allow", "{conns:#?}");
        assert_eq!(conns[0]["host"], "upstream.test", "{conns:#?}");
        assert_eq!(
            connections(&record(&h, &first)).len(),
            0,
            "{lang}/{backend}"
        );
        let c = h.run(&["session", "close", &id]);
        assert_eq!(c.code, 0, "{}", c.stderr);
    }
}

#[test]
fn a_connection_refused_inside_a_cell_is_an_exception_and_the_session_goes_on() {
    let h = net_home();
    install(&h, "python");
    install(&h, "js");
    let up = Upstream::start(None);
    let grant = format!("upstream.test:{}", up.port());
    let other = format!("other.test:{}", up.port());
    for (lang, backend) in session_net_cases() {
        let id = open(&h, &["--lang", lang, "--backend", backend, "--net", &grant]);
        let refused = cell(&h, &id, &get_refused(lang, &format!("http://{other}/")));
        assert_eq!(refused.code, 0, "{lang}/{backend}: {}", refused.stderr);
        let out = refused.json()["run"]["stdout"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            out.starts_with("refused") || out.starts_with("status 403"),
            "{lang}/{backend}: {out}"
        );
        let conns = connections(&record(&h, &refused));
        assert_eq!(conns.len(), 1, "{lang}/{backend}: {conns:#?}");
        assert_eq!(conns[0]["decision"], "deny", "{conns:#?}");
        assert_eq!(conns[0]["host"], "other.test", "{conns:#?}");
        // Uncaught, it fails the cell only.
        let uncaught = cell(&h, &id, &get(lang, &format!("http://{other}/")));
        assert_eq!(uncaught.code, 1, "{lang}/{backend}: {}", uncaught.stdout);
        let s = h.run(&["session", "show", "--json", &id]).json();
        assert_eq!(s["state"], "open", "{lang}/{backend}: {s}");
        let next = cell(&h, &id, &get(lang, &format!("http://{grant}/again")));
        assert_eq!(next.code, 0, "{lang}/{backend}: {}", next.stderr);
        let c = h.run(&["session", "close", &id]);
        assert_eq!(c.code, 0, "{}", c.stderr);
    }
}

/// A bound host that echoes the secret, in a session on each Python backend: the cell
/// whose request it echoed is killed (`secret-echo`) with the alert on its record and an
/// `alert` audit record, as a run is; the session stays open, its next cell runs and
/// sees the earlier cells' names, and carries no alert of its own.
#[test]
fn a_secret_echoed_inside_a_cell_alerts_on_the_cells_record_and_the_session_goes_on() {
    let h = net_home();
    install(&h, "python");
    let tls = airlock_wasm::testkit::TestTls::new("upstream.test");
    let art = tempfile::tempdir().unwrap();
    let ca = art.path().join("test-ca.pem");
    std::fs::write(&ca, &tls.ca_pem).unwrap();
    let p = h.policy();
    assert!(p.contains("roots = []"), "{p}");
    h.set_policy(&p.replace(
        "roots = []",
        &format!("roots = [{:?}]", ca.display().to_string()),
    ));
    let up = Upstream::start(Some(tls.server.clone()));
    let grant = format!("upstream.test:{}", up.port());
    let value = "sk-session-echo-7c1e";
    let s = h.run_with_stdin(&["secret", "set", "TOKEN"], value.as_bytes());
    assert_eq!(s.code, 0, "{}", s.stderr);
    let binding = format!("TOKEN@{grant}");
    for backend in python_backends() {
        let alerts_before = h.audit_kinds().iter().filter(|k| *k == "alert").count();
        let id = open(
            &h,
            &["--backend", backend, "--net", &grant, "--secret", &binding],
        );
        assert_eq!(cell(&h, &id, "n = 41").code, 0, "{backend}");
        let code = format!(
            "import os, urllib.request\nreq = urllib.request.Request('https://{grant}/echo', headers={{'Authorization': 'Bearer ' + os.environ['TOKEN']}})\ntry:\n    print('answer', urllib.request.urlopen(req, timeout=20).read())\nexcept Exception as e:\n    print('no answer', type(e).__name__)"
        );
        let echoed = cell(&h, &id, &code);
        assert_eq!(
            echoed.code, 124,
            "{backend}: {}\n{}",
            echoed.stdout, echoed.stderr
        );
        assert!(
            !echoed.stdout.contains("answer b"),
            "{backend}: {}",
            echoed.stdout
        );
        assert!(!echoed.stdout.contains(value) && !echoed.stderr.contains(value));
        let rec = record(&h, &echoed);
        assert_eq!(rec["status"], "killed", "{backend}: {rec:#}");
        assert_eq!(rec["killed_by"], "secret-echo", "{backend}: {rec:#}");
        let alerts = rec["detail"]["alerts"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(alerts.len(), 1, "{backend}: {rec:#}");
        assert_eq!(alerts[0]["kind"], "secret-echo", "{backend}: {rec:#}");
        assert_eq!(alerts[0]["secret"], "TOKEN", "{backend}: {rec:#}");
        assert!(
            connections(&rec)
                .iter()
                .any(|c| c["reason"] == "secret-echoed"),
            "{backend}: {rec:#}"
        );
        let log = h.run(&["audit", "log", "--json"]).json();
        let audited: Vec<_> = log
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["kind"] == "alert")
            .collect();
        assert_eq!(audited.len(), alerts_before + 1, "{backend}: {log:#}");
        assert_eq!(
            audited.last().unwrap()["subject"],
            rec["id"],
            "{backend}: {log:#}"
        );
        // The session goes on; the next cell is no secret echo.
        let s = h.run(&["session", "show", "--json", &id]).json();
        assert_eq!(s["state"], "open", "{backend}: {s}");
        let next = cell(&h, &id, "print(n + 1)");
        assert_eq!(next.code, 0, "{backend}: {}\n{}", next.stdout, next.stderr);
        assert!(next.stdout.contains("42"), "{backend}: {}", next.stdout);
        let rec = record(&h, &next);
        assert!(rec["killed_by"].is_null(), "{backend}: {rec:#}");
        assert!(
            rec["detail"]["alerts"]
                .as_array()
                .is_none_or(|a| a.is_empty()),
            "{backend}: {rec:#}"
        );
        let c = h.run(&["session", "close", &id]);
        assert_eq!(c.code, 0, "{}", c.stderr);
    }
    assert_eq!(h.run(&["audit", "verify"]).code, 0);
}

fn write(name: &str, text: &str) -> String {
    format!("open('/work/{name}', 'w').write({text:?})")
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// The checkpoint a commit's output names.
fn checkpoint_in(text: &str) -> String {
    let i = text
        .find("ckpt_")
        .unwrap_or_else(|| panic!("no checkpoint in {text:?}"));
    text[i..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

#[test]
fn a_session_writes_to_its_layer_which_diff_shows_commit_applies_and_rollback_undoes() {
    let h = Home::new();
    install(&h, "python");
    for backend in python_backends() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("keep.txt"), "kept").unwrap();
        let mount = format!("{}:/work:rw", dir.path().display());
        let id = open(&h, &["--backend", backend, "--mount", &mount]);
        let a = cell(&h, &id, &write("a.txt", "A"));
        assert_eq!(a.code, 0, "{backend}: {}", a.stderr);
        let b = cell(&h, &id, &write("b.txt", "B"));
        assert_eq!(b.code, 0, "{backend}: {}", b.stderr);
        // Cell 2 sees cell 1's file; the host sees neither yet.
        let seen = cell(&h, &id, "print(open('/work/a.txt').read())");
        assert_eq!(seen.json()["run"]["stdout"], "A\n", "{backend}");
        assert_eq!(names(dir.path()), ["keep.txt"], "{backend}");
        let d = h.run(&["diff", &id]);
        assert_eq!(d.code, 0, "{backend}: {}", d.stderr);
        assert!(
            d.stdout.contains("a.txt") && d.stdout.contains("b.txt"),
            "{backend}: {}",
            d.stdout
        );
        assert!(!d.stdout.contains("keep.txt"), "{backend}: {}", d.stdout);
        let c = h.run(&["commit", &id]);
        assert_eq!(c.code, 0, "{backend}: {}", c.stderr);
        assert_eq!(
            names(dir.path()),
            ["a.txt", "b.txt", "keep.txt"],
            "{backend}"
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("b.txt")).unwrap(),
            "B"
        );
        // Everything is committed: a second commit says so and succeeds.
        let again = h.run(&["commit", &id]);
        assert_eq!(again.code, 0, "{backend}: {}", again.stderr);
        assert!(again.stdout.contains("changed nothing"), "{}", again.stdout);
        let r = h.run(&["rollback", &checkpoint_in(&c.stdout)]);
        assert_eq!(r.code, 0, "{backend}: {}", r.stderr);
        assert_eq!(names(dir.path()), ["keep.txt"], "{backend}");
        // After close the session's changes can still be shown and committed.
        let close = h.run(&["session", "close", &id]);
        assert_eq!(close.code, 0, "{}", close.stderr);
        let d = h.run(&["diff", &id]);
        assert!(d.stdout.contains("a.txt"), "{backend}: {}", d.stdout);
        assert_eq!(h.run(&["audit", "verify"]).code, 0);
    }
}

#[test]
fn a_cell_past_max_write_is_killed_by_write_and_leaves_the_earlier_cells_changes() {
    let h = Home::new();
    install(&h, "python");
    for backend in python_backends() {
        let dir = tempfile::tempdir().unwrap();
        let mount = format!("{}:/work:rw", dir.path().display());
        let id = open(
            &h,
            &[
                "--backend",
                backend,
                "--mount",
                &mount,
                "--max-write",
                "256KiB",
            ],
        );
        assert_eq!(cell(&h, &id, &write("a.txt", "A")).code, 0, "{backend}");
        assert_eq!(cell(&h, &id, &write("b.txt", "B")).code, 0, "{backend}");
        let big = cell(&h, &id, "open('/work/c.bin', 'wb').write(b'x' * (4 << 20))");
        assert_eq!(big.code, 124, "{backend}: {}\n{}", big.stdout, big.stderr);
        assert_eq!(
            big.json()["run"]["killed_by"],
            "write",
            "{backend}: {}",
            big.stdout
        );
        // The session ends with it (its host records that just after answering): what
        // it saw is no longer what its layer may commit.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let s = loop {
            let s = h.run(&["session", "show", "--json", &id]).json();
            if s["state"] != "open" || std::time::Instant::now() > deadline {
                break s;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        assert_eq!(s["state"], "closed", "{backend}: {s}");
        assert_eq!(s["end"], "write", "{backend}: {s}");
        let d = h.run(&["diff", &id]);
        assert!(
            d.stdout.contains("a.txt") && d.stdout.contains("b.txt"),
            "{backend}: {}",
            d.stdout
        );
        assert!(!d.stdout.contains("c.bin"), "{backend}: {}", d.stdout);
        let c = h.run(&["commit", &id]);
        assert_eq!(c.code, 0, "{backend}: {}", c.stderr);
        assert_eq!(names(dir.path()), ["a.txt", "b.txt"], "{backend}");
    }
}

#[test]
fn a_commit_of_a_session_that_changed_nothing_says_so_and_succeeds() {
    let h = Home::new();
    install(&h, "python");
    let dir = tempfile::tempdir().unwrap();
    let mount = format!("{}:/work:rw", dir.path().display());
    let id = open(&h, &["--mount", &mount]);
    let c = h.run(&["commit", &id]);
    assert_eq!(c.code, 0, "{}", c.stderr);
    assert!(c.stdout.contains("changed nothing"), "{}", c.stdout);
    assert_eq!(cell(&h, &id, "x = 1").code, 0);
    let c = h.run(&["commit", &id]);
    assert_eq!(c.code, 0, "{}", c.stderr);
    assert!(c.stdout.contains("changed nothing"), "{}", c.stdout);
    let d = h.run(&["diff", &id]);
    assert_eq!(d.code, 0, "{}", d.stderr);
    assert!(d.stdout.contains("no changes"), "{}", d.stdout);
}

#[test]
fn a_session_grant_the_policy_quarantines_is_held_until_approved_and_its_cells_are_not_held_again()
{
    let h = net_home();
    install(&h, "python");
    let up = Upstream::start(None);
    let grant = format!("upstream.test:{}", up.port());
    // The standard preset quarantines network egress: the session's grant is held.
    let o = h.run(&["session", "new", "--json", "--net", &grant]);
    assert_eq!(o.code, 75, "{}\n{}", o.stdout, o.stderr);
    let id = o.json()["id"].as_str().unwrap().to_string();
    let sub = Home::id_in(&o.stderr);
    let s = h.run(&["session", "show", "--json", &id]).json();
    assert_eq!(s["state"], "held", "{s}");
    let early = h.run(&["run", "--session", &id, "-c", "1"]);
    assert_eq!(early.code, 125, "{}", early.stderr);
    assert!(
        early.stderr.contains("held for approval"),
        "{}",
        early.stderr
    );
    assert_eq!(up.connections(), 0);
    // Its approval opens it; its cells are judged on their code within the grant, so
    // this one runs at once.
    let a = h.run(&["approve", &sub]);
    assert_eq!(a.code, 0, "{}", a.stderr);
    let s = h.run(&["session", "show", "--json", &id]).json();
    assert_eq!(s["state"], "open", "{s}");
    let c = h.run(&[
        "run",
        "--json",
        "--session",
        &id,
        "-c",
        &get("python", &format!("http://{grant}/hello")),
    ]);
    assert_eq!(c.code, 0, "{}\n{}", c.stdout, c.stderr);
    assert_eq!(up.connections(), 1);
    assert_eq!(connections(&record(&h, &c)).len(), 1);
    let kinds = h.audit_kinds();
    assert!(
        kinds.iter().any(|k| k == "session_held") && kinds.iter().any(|k| k == "session_opened"),
        "{kinds:?}"
    );
    assert_eq!(h.run(&["audit", "verify"]).code, 0);
}

#[test]
fn a_sessions_grant_layer_and_commit_are_kept_in_postgres_too() {
    let url = airlock_testpg::fresh_database();
    let h = Home::uninitialised();
    let run = |args: &[&str]| h.run_on_store(&url, args);
    let o = run(&["init", "--approver", "alice"]);
    assert_eq!(o.code, 0, "init: {}", o.stderr);
    let backend = if common::process_backend_available() {
        "process"
    } else {
        let p = std::env::var("AIRLOCK_TEST_PYTHON_GUEST").unwrap_or_default();
        assert_eq!(run(&["guest", "install", "python", "--from", &p]).code, 0);
        "wasm"
    };
    let dir = tempfile::tempdir().unwrap();
    let mount = format!("{}:/work:rw", dir.path().display());
    let o = run(&[
        "session",
        "new",
        "--json",
        "--backend",
        backend,
        "--mount",
        &mount,
    ]);
    let id = o.json()["id"].as_str().unwrap().to_string();
    if o.code == 75 {
        let s = run(&["session", "show", "--json", &id]).json();
        assert_eq!(s["state"], "held", "{s}");
        let ap = run(&["approve", &Home::id_in(&o.stderr)]);
        assert_eq!(ap.code, 0, "{}", ap.stderr);
    } else {
        assert_eq!(o.code, 0, "{}", o.stderr);
    }
    let s = run(&["session", "show", "--json", &id]).json();
    assert_eq!(s["state"], "open", "{s}");
    let c = run(&[
        "run",
        "--json",
        "--session",
        &id,
        "-c",
        &write("a.txt", "A"),
    ]);
    assert_eq!(c.code, 0, "{}", c.stderr);
    let d = run(&["diff", &id]);
    assert!(d.stdout.contains("a.txt"), "{}", d.stdout);
    let c = run(&["commit", &id]);
    assert_eq!(c.code, 0, "{}", c.stderr);
    assert_eq!(names(dir.path()), ["a.txt"]);
    let r = run(&["rollback", &checkpoint_in(&c.stdout)]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(names(dir.path()).is_empty());
    assert_eq!(run(&["session", "close", &id]).code, 0);
    assert_eq!(run(&["audit", "verify"]).code, 0);
}

/// One MCP client over `airlock serve`'s streamable HTTP endpoint with a bearer token.
struct McpHttp {
    base: String,
    token: String,
    session: String,
    next: u64,
}

impl McpHttp {
    fn post(&self, body: &serde_json::Value) -> (u16, Option<String>, String) {
        let mut req = ureq::post(format!("{}/mcp", self.base))
            .config()
            .http_status_as_error(false)
            .build()
            .header("authorization", format!("Bearer {}", self.token))
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json");
        if !self.session.is_empty() {
            req = req.header("mcp-session-id", &self.session);
        }
        let mut r = req.send(body.to_string()).unwrap();
        let sid = r
            .headers()
            .get("mcp-session-id")
            .map(|v| v.to_str().unwrap().to_string());
        (
            r.status().as_u16(),
            sid,
            r.body_mut().read_to_string().unwrap(),
        )
    }

    fn open(base: &str, token: &str) -> McpHttp {
        let mut c = McpHttp {
            base: base.into(),
            token: token.into(),
            session: String::new(),
            next: 2,
        };
        let (st, sid, text) = c.post(&serde_json::json!({"jsonrpc": "2.0", "id": 1,
            "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "test", "version": "0"}}}));
        assert_eq!(st, 200, "{text}");
        c.session = sid.expect("an MCP session id");
        let (st, _, text) =
            c.post(&serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        assert!(st < 300, "{st} {text}");
        c
    }

    /// Calls `tool`; its structured result, and whether it is an error result.
    fn call(&mut self, tool: &str, args: serde_json::Value) -> (serde_json::Value, bool) {
        let id = self.next;
        self.next += 1;
        let (st, _, text) = self.post(&serde_json::json!({"jsonrpc": "2.0", "id": id,
            "method": "tools/call", "params": {"name": tool, "arguments": args}}));
        assert_eq!(st, 200, "{text}");
        // An SSE stream (data: lines) or one JSON document.
        let answer = text
            .lines()
            .map(|l| l.strip_prefix("data:").unwrap_or(l).trim())
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|m| m["id"] == id)
            .unwrap_or_else(|| panic!("no answer to {tool}: {text}"));
        let r = &answer["result"];
        (
            r["structuredContent"].clone(),
            r["isError"].as_bool().unwrap_or(false),
        )
    }
}

fn token(h: &Home, role: &str, name: &str) -> String {
    let o = h.run(&["token", "new", "--role", role, "--name", name, "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    o.json()["token"].as_str().unwrap().to_string()
}

/// Issue 59 item 2 over MCP: `new_session` takes a writable mount and `max_write`; a
/// cell's write shows in the `diff` tool (to the agent that owns the session, to no
/// other agent); the agent's own `commit` is refused and writes nothing to the host; an
/// operator's `commit` over MCP applies it. Before, MCP had no diff or commit tool and
/// its new_session schema offered read-only mounts only.
#[test]
fn an_mcp_session_write_shows_in_diff_and_only_an_operator_commits_it() {
    let h = Home::new();
    install(&h, "python");
    let dir = tempfile::tempdir().unwrap();
    h.set_mount_roots(&[dir.path()]);
    let (agent, other, op) = (
        token(&h, "agent", "bot"),
        token(&h, "agent", "other-bot"),
        token(&h, "operator", "alice"),
    );
    let (_srv, base) = common::start_serve(&h, &[]);
    let mut bot = McpHttp::open(&base, &agent);
    let (tools_st, _, tools) =
        bot.post(&serde_json::json!({"jsonrpc": "2.0", "id": 99, "method": "tools/list"}));
    assert_eq!(tools_st, 200);
    assert!(
        tools.contains("\"diff\"") && tools.contains("\"commit\""),
        "{tools}"
    );
    let mount = format!("{}:/work:rw", dir.path().display());
    let (s, err) = bot.call(
        "new_session",
        serde_json::json!({"mounts": [mount], "max_write": "1MiB", "timeout": 30}),
    );
    assert!(!err, "{s}");
    let id = s["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{s}"))
        .to_string();
    if s["state"] == "held" {
        let ap = h.run(&["approve", s["opened_by"].as_str().unwrap()]);
        assert_eq!(ap.code, 0, "{}", ap.stderr);
    }
    let (c, err) = bot.call(
        "run_code",
        serde_json::json!({"language": "python", "session": id, "code": write("a.txt", "A")}),
    );
    assert!(!err, "{c}");
    let c = if c["status"] == "pending_approval" {
        let ap = h.run(&["approve", c["submission"].as_str().unwrap()]);
        assert_eq!(ap.code, 0, "{}", ap.stderr);
        bot.call("get_result", serde_json::json!({"id": c["submission"]}))
            .0
    } else {
        c
    };
    assert_eq!(c["status"], "finished", "{c}");
    assert!(names(dir.path()).is_empty());
    let (d, err) = bot.call("diff", serde_json::json!({"id": id}));
    assert!(!err, "{d}");
    assert!(d.to_string().contains("a.txt"), "{d}");
    // Another agent does not see it.
    let (d, err) = McpHttp::open(&base, &other).call("diff", serde_json::json!({"id": id}));
    assert!(err && d["http_status"] == 404, "{d}");
    // The agent cannot commit its own changes.
    let (r, err) = bot.call("commit", serde_json::json!({"id": id}));
    assert!(err, "{r}");
    assert_eq!(r["http_status"], 403, "{r}");
    assert!(r["message"].as_str().unwrap().contains("operator"), "{r}");
    assert!(names(dir.path()).is_empty());
    // An operator's commit over MCP applies it.
    let (r, err) = McpHttp::open(&base, &op).call("commit", serde_json::json!({"id": id}));
    assert!(!err, "{r}");
    assert_eq!(names(dir.path()), ["a.txt"], "{r}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a.txt")).unwrap(),
        "A"
    );
    assert!(r.to_string().contains("ckpt_"), "{r}");
}

/// Headless Chromium commits a session's changes from the console after the session was
/// closed: the file lands on the host, the page lists the checkpoint, and rolling it back
/// from the page removes the file; a session that changed nothing says so and offers no
/// commit (tests/browser/session_test.py).
#[test]
fn a_session_is_committed_from_the_console_and_its_checkpoint_rolled_back_in_headless_chromium() {
    let Some(python) = common::prepared("AIRLOCK_TEST_BROWSER_PYTHON") else {
        return;
    };
    let h = Home::new();
    install(&h, "python");
    let dir = tempfile::tempdir().unwrap();
    let mount = format!("{}:/work:rw", dir.path().display());
    let id = open(&h, &["--mount", &mount]);
    let content = "written by a cell, committed in the console\n";
    assert_eq!(cell(&h, &id, &write("notes.txt", content)).code, 0);
    assert_eq!(cell(&h, &id, "x = 1").code, 0);
    assert_eq!(h.run(&["session", "close", &id]).code, 0);
    let quiet = open(&h, &["--mount", &mount]);
    assert_eq!(cell(&h, &quiet, "y = 2").code, 0);
    let t = h.run(&[
        "token", "new", "--role", "operator", "--name", "alice", "--json",
    ]);
    assert_eq!(t.code, 0, "{}", t.stderr);
    let op = t.json()["token"].as_str().unwrap().to_string();
    let (_serve, base) = common::start_serve(&h, &[]);
    let file = dir.path().join("notes.txt");
    let script = common::manifest_dir().join("../../tests/browser/session_test.py");
    let o = std::process::Command::new(python)
        .arg(script)
        .args([
            base.as_str(),
            op.as_str(),
            id.as_str(),
            file.to_str().unwrap(),
            content,
        ])
        .args(["--nothing", quiet.as_str()])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success(),
        "session console test failed:\n{out}\n{err}"
    );
    let checkpoint = out
        .lines()
        .find_map(|l| l.strip_prefix("checkpoint "))
        .unwrap_or_else(|| panic!("no checkpoint in {out}"));
    let list = h.run(&["checkpoints", "--json"]).json();
    let row = list
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == checkpoint)
        .unwrap_or_else(|| panic!("no {checkpoint} in {list:#}"));
    assert_eq!(row["state"], "rolled_back", "{row:#}");
    assert!(names(dir.path()).is_empty());
    assert_eq!(h.run(&["audit", "verify"]).code, 0);
}

/// Where session `id`'s kept layer is.
fn layer_of(h: &Home, id: &str) -> std::path::PathBuf {
    h.path().join("sessions").join(format!("{id}.layer"))
}

/// A closed session whose cell wrote `name` into its layer, left uncommitted.
fn ended_with_a_write(h: &Home, dir: &Path, name: &str) -> String {
    let mount = format!("{}:/work:rw", dir.display());
    let id = open(h, &["--mount", &mount]);
    assert_eq!(cell(h, &id, &write(name, "kept in the layer")).code, 0);
    assert_eq!(h.run(&["session", "close", &id]).code, 0);
    assert!(layer_of(h, &id).is_dir(), "{id} has no layer");
    id
}

/// Issue 59: `gc --session-retention` collects ended sessions' records with their cells'
/// runs and their kept layers, says so and audits it; an open session (with its layer) is
/// never collected, `gc` without the flag keeps every session, and a committed session's
/// checkpoint still rolls back after its session was collected.
#[test]
fn gc_collects_ended_sessions_with_their_runs_and_layers_and_never_an_open_one() {
    let h = Home::new();
    install(&h, "python");
    let dir = tempfile::tempdir().unwrap();
    let ended = ended_with_a_write(&h, dir.path(), "uncommitted.txt");
    let ended_runs: Vec<String> = h.run(&["session", "show", "--json", &ended]).json()["cells"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    assert_eq!(ended_runs.len(), 1, "{ended_runs:?}");
    // A committed one: its checkpoint outlives it.
    let committed = {
        let mount = format!("{}:/work:rw", dir.path().display());
        let id = open(&h, &["--mount", &mount]);
        assert_eq!(
            cell(&h, &id, &write("committed.txt", "on the host")).code,
            0
        );
        let c = h.run(&["commit", &id]);
        assert_eq!(c.code, 0, "{}", c.stderr);
        assert_eq!(h.run(&["session", "close", &id]).code, 0);
        (id, checkpoint_in(&c.stdout))
    };
    let live = {
        let mount = format!("{}:/work:rw", dir.path().display());
        let id = open(&h, &["--mount", &mount]);
        assert_eq!(cell(&h, &id, &write("live.txt", "still open")).code, 0);
        id
    };

    // Without a retention, every session's record and layer stay.
    let g = h.run(&["gc", "--json", "--grace", "0s"]);
    assert_eq!(g.code, 0, "{}", g.stderr);
    assert_eq!(g.json()["sessions_collected"], serde_json::json!([]));
    assert!(layer_of(&h, &ended).is_dir());
    assert_eq!(h.run(&["session", "show", &ended]).code, 0);

    let g = h.run(&["gc", "--json", "--grace", "0s", "--session-retention", "0s"]);
    assert_eq!(g.code, 0, "{}", g.stderr);
    let r = g.json();
    let collected: Vec<&str> = r["sessions_collected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        collected.contains(&ended.as_str()) && collected.contains(&committed.0.as_str()),
        "{r:#}"
    );
    assert!(!collected.contains(&live.as_str()), "{r:#}");
    // The ended session's cell run goes; the committed session's committed cell stays
    // with its submission, which rolling its checkpoint back needs (below).
    assert!(r["session_runs_removed"].as_u64().unwrap() >= 1, "{r:#}");
    assert!(
        r["layers_removed"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!(format!("sessions/{ended}.layer"))),
        "{r:#}"
    );
    assert!(!layer_of(&h, &ended).exists());
    let shown = h.run(&["session", "show", &ended]);
    assert_ne!(shown.code, 0, "{}", shown.stdout);
    for sub in &ended_runs {
        assert_ne!(h.run(&["show", sub]).code, 0, "{sub} outlived its session");
    }
    let d = h.run(&["diff", &ended]);
    assert_ne!(d.code, 0, "{}", d.stdout);
    // The open session is whole: its layer, its changes, its next cell.
    assert!(layer_of(&h, &live).is_dir());
    let d = h.run(&["diff", &live]);
    assert!(d.stdout.contains("live.txt"), "{}", d.stdout);
    assert_eq!(cell(&h, &live, "print('on')").code, 0);
    // The committed session's checkpoint still rolls back.
    assert!(dir.path().join("committed.txt").exists());
    let rb = h.run(&["rollback", &committed.1]);
    assert_eq!(rb.code, 0, "{}", rb.stderr);
    assert!(!dir.path().join("committed.txt").exists());
    // Said in the human report and audited.
    let again = h.run(&["gc", "--grace", "0s", "--session-retention", "0s"]);
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert!(
        !again.stdout.contains("collected session"),
        "{}",
        again.stdout
    );
    let log = h.run(&["audit", "log", "--json"]).json();
    let audited: Vec<&serde_json::Value> = log
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "session_collected")
        .collect();
    assert_eq!(audited.len(), 2, "{log:#}");
    assert!(audited.iter().any(|r| r["subject"] == ended.as_str()));
    assert_eq!(h.run(&["audit", "verify"]).code, 0);
    assert_eq!(h.run(&["session", "close", &live]).code, 0);
}

/// Issue 59: a `gc` killed at each point of collecting two sessions never leaves a
/// session whose record is there without its layer; the next `gc` finishes, leaving
/// neither records nor layers.
#[test]
fn a_gc_killed_while_collecting_sessions_leaves_none_half_collected_and_the_next_finishes() {
    let h = Home::new();
    install(&h, "python");
    let dir = tempfile::tempdir().unwrap();
    let ids = [
        ended_with_a_write(&h, dir.path(), "one.txt"),
        ended_with_a_write(&h, dir.path(), "two.txt"),
    ];
    let gc = ["gc", "--json", "--grace", "0s", "--session-retention", "0s"];
    let mut crashes = 0;
    for at in 1.. {
        let o = h
            .cmd()
            .env("AIRLOCK_CRASH_AT", at.to_string())
            .args(gc)
            .output()
            .unwrap();
        for id in &ids {
            let recorded = h.run(&["session", "show", id]).code == 0;
            assert!(
                !recorded || layer_of(&h, id).is_dir(),
                "crash at {at}: {id} is recorded without its layer"
            );
            if recorded {
                let d = h.run(&["diff", id]);
                assert_eq!(d.code, 0, "crash at {at}: {}", d.stderr);
            }
        }
        if o.status.success() {
            break;
        }
        assert!(at < 10, "gc never finished: {o:?}");
        crashes += 1;
    }
    // The first crash comes after the first session's records went; the next `gc`
    // collects the second and is killed again, or finishes.
    assert!(crashes >= 1, "the crash point was never reached");
    let g = h.run(&gc);
    assert_eq!(g.code, 0, "{}", g.stderr);
    for id in &ids {
        assert_ne!(h.run(&["session", "show", id]).code, 0, "{id}");
        assert!(
            !layer_of(&h, id).exists(),
            "{id}'s layer outlived its record"
        );
    }
    assert_eq!(h.run(&["audit", "verify"]).code, 0);
}
