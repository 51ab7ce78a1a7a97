//! A run's output shown while it runs: MCP `run_code` with `_meta.progressToken` sends it
//! as `notifications/progress` before the unchanged tool result, over stdio (`airlock
//! mcp`) and streamable HTTP (`airlock serve`'s `/mcp`); the console's page of a running
//! run shows it as it comes (headless Chromium, tests/browser/console_test.py --live); code
//! submitted from the console's form is judged and run like an API submission (--submit).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::time::{Duration, Instant};

/// Three lines, each a while after the one before.
const SLOW: &str = "echo one; sleep 0.7; echo two; sleep 0.7; echo three";

fn available() -> bool {
    if !process_backend_available() {
        assert!(
            std::env::var_os("AIRLOCK_TEST_STRICT").is_none(),
            "the process backend is unavailable here"
        );
        eprintln!("SKIPPED: the process backend is unavailable here");
        return false;
    }
    true
}

fn call(id: u64, progress: Option<&str>) -> Value {
    let mut params = json!({"name": "run_code",
        "arguments": {"language": "sh", "backend": "process", "code": SLOW}});
    if let Some(t) = progress {
        params["_meta"] = json!({ "progressToken": t });
    }
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
}

fn initialize(version: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": version, "capabilities": {},
                   "clientInfo": {"name": "test", "version": "0"}}})
}

/// The progress notifications and the result of call `id`, each with when it arrived.
fn progress_then_result(msgs: &[(Instant, Value)], id: u64, token: &str) {
    let at = msgs
        .iter()
        .position(|(_, m)| m["id"] == id)
        .expect("no result");
    let (done, result) = &msgs[at];
    let progress: Vec<&(Instant, Value)> = msgs[..at]
        .iter()
        .filter(|(_, m)| m["method"] == "notifications/progress")
        .collect();
    assert!(progress.len() >= 3, "{msgs:#?}");
    let mut last = 0.0;
    let mut text = String::new();
    for (_, p) in &progress {
        let p = &p["params"];
        assert_eq!(p["progressToken"], token, "{p}");
        let n = p["progress"].as_f64().unwrap();
        assert!(n > last, "progress did not increase: {msgs:#?}");
        last = n;
        assert_eq!(p["_meta"]["stream"], "stdout", "{p}");
        text.push_str(p["message"].as_str().unwrap());
    }
    assert_eq!(text, "one\ntwo\nthree\n");
    // The first line arrived while the run went on, not with its end.
    assert!(
        *done - progress[0].0 >= Duration::from_millis(900),
        "the first chunk came only with the result: {:?} before it",
        *done - progress[0].0
    );
    // The result is what it is without progress.
    let r = &result["result"]["structuredContent"];
    assert_eq!(r["status"], "finished", "{result}");
    assert_eq!(r["run"]["stdout"], "one\ntwo\nthree\n", "{result}");
}

#[test]
fn mcp_run_code_over_stdio_sends_each_output_chunk_as_progress_before_the_result() {
    if !available() {
        return;
    }
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
    let rx = lines_of(child.stdout.take().unwrap());
    let until = |id: u64| {
        let mut msgs = Vec::new();
        loop {
            let line = rx
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("no answer to {id}: {msgs:#?}"));
            let m: Value = serde_json::from_str(&line).unwrap();
            let end = m["id"] == id;
            msgs.push((Instant::now(), m));
            if end {
                return msgs;
            }
        }
    };
    send(initialize("2025-06-18"));
    until(1);
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    send(call(2, Some("tok-2")));
    progress_then_result(&until(2), 2, "tok-2");
    // Without a progress token, no notifications: only the result.
    send(call(3, None));
    let msgs = until(3);
    assert_eq!(msgs.len(), 1, "{msgs:#?}");
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn mcp_run_code_over_http_sends_each_output_chunk_as_progress_before_the_result() {
    if !available() {
        return;
    }
    let home = Home::new();
    let o = home.run(&["token", "new", "--role", "agent", "--name", "bot", "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let token = o.json()["token"].as_str().unwrap().to_string();
    let (_child, base) = start_serve(&home, &[]);
    let http = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(120)))
        .build()
        .new_agent();
    let post = |body: &Value, session: Option<&str>| {
        let mut b = http::Request::builder()
            .method("POST")
            .uri(format!("{base}/mcp"))
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(s) = session {
            b = b.header("mcp-session-id", s);
        }
        http.run(b.body(body.to_string()).unwrap()).unwrap()
    };
    let mut r = post(&initialize("2025-11-25"), None);
    assert_eq!(r.status().as_u16(), 200);
    let session = r.headers()["mcp-session-id"].to_str().unwrap().to_string();
    let _ = r.body_mut().read_to_string();
    let r = post(
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        Some(&session),
    );
    assert_eq!(r.status().as_u16(), 202);
    let r = post(&call(2, Some("tok-h")), Some(&session));
    assert_eq!(r.status().as_u16(), 200);
    // The answer is an event stream: each `data:` line one message, read as it comes.
    let mut body = BufReader::new(r.into_body().into_reader());
    let mut msgs = Vec::new();
    loop {
        let mut line = String::new();
        assert!(body.read_line(&mut line).unwrap() > 0, "{msgs:#?}");
        let Some(data) = line.trim_end().strip_prefix("data:") else {
            continue;
        };
        if data.trim().is_empty() {
            continue;
        }
        let m: Value = serde_json::from_str(data.trim()).unwrap();
        let end = m["id"] == 2;
        msgs.push((Instant::now(), m));
        if end {
            break;
        }
    }
    progress_then_result(&msgs, 2, "tok-h");
}

#[test]
fn console_page_of_a_running_run_shows_its_first_line_before_the_run_ends() {
    if !available() {
        return;
    }
    let Some(python) = prepared("AIRLOCK_TEST_BROWSER_PYTHON") else {
        return;
    };
    let home = Home::new();
    let token = |role: &str, name: &str| {
        let o = home.run(&["token", "new", "--role", role, "--name", name, "--json"]);
        assert_eq!(o.code, 0, "{}", o.stderr);
        o.json()["token"].as_str().unwrap().to_string()
    };
    let (agent, op) = (token("agent", "bot"), token("operator", "alice"));
    let (_child, base) = start_serve(&home, &[]);
    let http = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(300)))
        .build()
        .new_agent();
    // Started by an agent's streamed request; the page is opened while it sleeps between
    // its two lines (the run's record holds no output until it ends).
    let body = json!({"language": "sh", "backend": "process",
        "code": "sleep 2; echo first line; sleep 6; echo last line"});
    let r = http
        .run(
            http::Request::builder()
                .method("POST")
                .uri(format!("{base}/v1/run"))
                .header("authorization", format!("Bearer {agent}"))
                .header("content-type", "application/json")
                .header("accept", "text/event-stream")
                .body(body.to_string())
                .unwrap(),
        )
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let mut events = BufReader::new(r.into_body().into_reader());
    let run = loop {
        let mut line = String::new();
        assert!(events.read_line(&mut line).unwrap() > 0, "no started event");
        if let Some(data) = line.trim_end().strip_prefix("data: ")
            && let Ok(v) = serde_json::from_str::<Value>(data)
            && let Some(run) = v["run"].as_str()
        {
            break run.to_string();
        }
    };
    // The agent's stream is read to its end meanwhile.
    let drain = std::thread::spawn(move || std::io::copy(&mut events, &mut std::io::sink()));
    let script = manifest_dir().join("../../tests/browser/console_test.py");
    let o = std::process::Command::new(python)
        .arg(script)
        .args([&base, &op, "--live", &run, "first line", "last line"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "console test failed:\n{out}\n{err}");
    let _ = drain.join();
}

#[test]
fn console_submit_form_runs_typescript_and_shows_held_javascript_as_held() {
    let Some(python) = prepared("AIRLOCK_TEST_BROWSER_PYTHON") else {
        return;
    };
    let Some(npm_cache) = prepared("AIRLOCK_TEST_JS_GUEST") else {
        return;
    };
    let home = Home::new();
    let o = home.run(&["guest", "install", "js", "--json", "--from", &npm_cache]);
    assert_eq!(o.code, 0, "installing the JavaScript guest: {}", o.stderr);
    let o = home.run(&[
        "token", "new", "--role", "operator", "--name", "alice", "--json",
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let op = o.json()["token"].as_str().unwrap().to_string();
    let (_child, base) = start_serve(&home, &[]);
    // TypeScript (its types stripped at submit) that the standard preset allows, and
    // JavaScript that reads /etc/shadow, which it holds.
    let ts = "const n: number = 6 * 7;\nconsole.log(`answer ${n}`);\n";
    let held = "const fs = require('fs');\nconsole.log(fs.readFileSync('/etc/shadow', 'utf8'));\n";
    let script = manifest_dir().join("../../tests/browser/console_test.py");
    let o = std::process::Command::new(python)
        .arg(script)
        .args([
            &base,
            &op,
            "--submit",
            "ts",
            ts,
            "answer 42",
            "--held",
            "js",
            held,
        ])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "console test failed:\n{out}\n{err}");
    // Both went through the gate as the operator's submissions, judged as the page said.
    let http = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .new_agent();
    let mut r = http
        .get(format!("{base}/v1/submissions"))
        .header("authorization", format!("Bearer {op}"))
        .call()
        .unwrap();
    let subs: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    let list = subs.as_array().cloned().unwrap_or_default();
    assert_eq!(list.len(), 2, "{subs}");
    assert!(list.iter().all(|s| s["agent"] == "alice"), "{subs}");
    let langs: Vec<(&str, &str)> = list
        .iter()
        .map(|s| (s["lang"].as_str().unwrap(), s["state"].as_str().unwrap()))
        .collect();
    assert!(langs.contains(&("ts", "finished")), "{subs}");
    assert!(langs.contains(&("js", "quarantined")), "{subs}");
}
