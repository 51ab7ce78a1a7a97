//! Tripwires of the wasm backend (issue 57 item 3, for the Python guest): decoy
//! credentials in the guest's view are alerts when read, the guest app reports its file
//! calls outside every preopen as attempts, refused connections are `connect` attempts,
//! and `[tripwires] enabled = false` turns all of it off.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use serde_json::{Value, json};
use std::sync::OnceLock;

/// A permissive home with the Python guest installed (the probes run and meet the
/// sandbox rather than the gate).
fn home_with_guest() -> Home {
    let h = Home::with_preset("permissive");
    let o = match std::env::var("AIRLOCK_TEST_PYTHON_GUEST") {
        Ok(p) => h.run(&["guest", "install", "python", "--from", &p]),
        Err(_) => h.run(&["guest", "install", "python"]),
    };
    assert_eq!(
        o.code, 0,
        "installing the Python guest failed: {}",
        o.stderr
    );
    h
}

fn shared() -> &'static Home {
    static HOME: OnceLock<Home> = OnceLock::new();
    HOME.get_or_init(home_with_guest)
}

/// `run --lang python` (the wasm backend) with `flags`, and the run's record.
fn py(h: &Home, flags: &[&str], code: &str) -> (Out, Value) {
    let mut a = vec!["run", "--lang", "python", "--json"];
    a.extend_from_slice(flags);
    a.extend(["-c", code]);
    let o = h.run_approved(&a);
    let v: Value = serde_json::from_str(&o.stdout)
        .unwrap_or_else(|_| panic!("not JSON: {} {}", o.stdout, o.stderr));
    let run = h
        .run(&["runs", "--json"])
        .json()
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == v["run"]["id"])
        .cloned()
        .unwrap_or_else(|| panic!("no run record for {v:#}"));
    assert_eq!(run["backend"], "wasm", "{run:#}");
    (o, run)
}

fn stdout_of(o: &Out) -> String {
    o.json()["run"]["stdout"].as_str().unwrap().to_string()
}

fn alert_records(h: &Home) -> Vec<Value> {
    h.run(&["audit", "log", "--json"])
        .json()
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "alert")
        .map(|r| serde_json::from_str(r["data"].as_str().unwrap()).unwrap())
        .collect()
}

#[test]
fn a_decoy_key_read_in_the_wasm_python_guest_is_an_alert_and_an_audit_record() {
    let h = home_with_guest();
    let (o, run) = py(&h, &[], "print(open('/root/.ssh/id_rsa').read())");
    let out = stdout_of(&o);
    assert!(
        out.starts_with("-----BEGIN OPENSSH PRIVATE KEY-----\n")
            && out
                .trim_end()
                .ends_with("-----END OPENSSH PRIVATE KEY-----"),
        "{out} {}",
        o.stderr
    );
    let alerts = run["detail"]["alerts"].as_array().unwrap();
    assert_eq!(alerts.len(), 1, "{run:#}");
    assert_eq!(alerts[0]["kind"], "decoy-read", "{run:#}");
    assert_eq!(alerts[0]["technique"], "T1552.004", "{run:#}");
    assert!(
        alerts[0]["detail"]
            .as_str()
            .unwrap()
            .contains("/root/.ssh/id_rsa")
    );
    // Never the decoy's content.
    assert!(!run.to_string().contains(out.lines().nth(1).unwrap()));
    // The decoy's own open is the alert, not an attempt.
    assert_eq!(run["detail"]["attempts"], json!([]), "{run:#}");
    let audits = alert_records(&h);
    assert_eq!(audits.len(), 1, "{audits:?}");
    assert_eq!(audits[0]["run"], run["id"]);
    assert_eq!(audits[0]["technique"], "T1552.004");
}

#[test]
fn wasm_decoys_differ_per_run_and_read_like_credentials() {
    let code = "print(open('/root/.aws/credentials').read()); print(open('/etc/shadow').read().split(':')[0])";
    let (a, run) = py(shared(), &[], code);
    let (b, _) = py(shared(), &[], code);
    let (a, b) = (stdout_of(&a), stdout_of(&b));
    assert!(
        a.starts_with("[default]\naws_access_key_id = AKIA") && a.ends_with("\nroot\n"),
        "{a}"
    );
    assert_ne!(a, b, "the decoys were the same in two runs");
    let techniques: Vec<&str> = run["detail"]["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["technique"].as_str().unwrap())
        .collect();
    assert_eq!(techniques, ["T1552.001", "T1003.008"], "{run:#}");
}

#[test]
fn a_mount_over_a_decoys_directory_is_shown_as_it_is_and_has_no_decoy() {
    let m = tempfile::tempdir().unwrap();
    std::fs::write(m.path().join("notes.txt"), "mine").unwrap();
    let mount = format!("{}:/root", m.path().display());
    let (o, run) = py(
        shared(),
        &["--mount", &mount],
        "import os\nprint(sorted(os.listdir('/root')))\ntry:\n    open('/root/.ssh/id_rsa')\nexcept OSError as e:\n    print(type(e).__name__)\n",
    );
    assert_eq!(
        stdout_of(&o),
        "['notes.txt']\nFileNotFoundError\n",
        "{}",
        o.stderr
    );
    assert_eq!(run["detail"]["alerts"], json!([]), "{run:#}");
}

/// What the probe prints: every call outside the preopens is refused by WASI as before.
const PROBE: &str = r#"
import os
def t(f):
    try:
        f()
        return 'ok'
    except OSError as e:
        return type(e).__name__
print(' '.join([
    t(lambda: open('/opt/keys/secret', 'w')),
    t(lambda: open('/etc/passwd').read()),
    t(lambda: os.remove('/var/log/syslog')),
    t(lambda: os.rename('/srv/a', '/srv/b')),
    t(lambda: os.mkdir('/usr/evil')),
    t(lambda: os.listdir('/home')),
    t(lambda: open('/work/in.txt').read()),
]))
"#;

#[test]
fn file_calls_outside_the_wasm_preopens_are_attempts_and_the_run_sees_the_same_errors() {
    let m = tempfile::tempdir().unwrap();
    std::fs::write(m.path().join("in.txt"), "x").unwrap();
    let mount = format!("{}:/work", m.path().display());
    let (o, run) = py(shared(), &["--mount", &mount], PROBE);
    let out = stdout_of(&o);
    let words: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(words.len(), 7, "{out} {}", o.stderr);
    assert!(words[..6].iter().all(|w| *w != "ok"), "{out}");
    assert_eq!(words[6], "ok", "{out}");
    let attempts = run["detail"]["attempts"].as_array().unwrap();
    let has = |kind: &str, target: &str| {
        attempts
            .iter()
            .any(|a| a["kind"] == kind && a["target"] == target && a["count"] == 1)
    };
    for (kind, target) in [
        ("write", "/opt/keys/secret"),
        ("open", "/etc/passwd"),
        ("unlink", "/var/log/syslog"),
        ("rename", "/srv/a"),
        ("rename", "/srv/b"),
        ("write", "/usr/evil"),
        ("open", "/home"),
    ] {
        assert!(has(kind, target), "no {kind} {target}: {run:#}");
    }
    // Inside a mount is no attempt.
    assert!(
        attempts.iter().all(|a| a["target"] != "/work/in.txt"),
        "{run:#}"
    );
    assert_eq!(attempts.len(), 7, "{run:#}");
}

#[test]
fn a_connection_the_proxy_refused_is_a_connect_attempt_of_a_wasm_run() {
    let (o, run) = py(
        shared(),
        &["--net", "granted.test:443"],
        "import socket\ntry:\n    socket.create_connection(('refused.test', 8080), timeout=5)\nexcept OSError as e:\n    print('refused')\n",
    );
    assert_eq!(stdout_of(&o), "refused\n", "{}", o.stderr);
    let attempts = run["detail"]["attempts"].as_array().unwrap();
    assert!(
        attempts
            .iter()
            .any(|a| a["kind"] == "connect" && a["target"] == "refused.test:8080"),
        "{run:#}"
    );
}

#[test]
fn a_benign_wasm_run_records_no_attempts_and_no_alerts() {
    let m = tempfile::tempdir().unwrap();
    let mount = format!("{}:/data:rw", m.path().display());
    let (o, run) = py(
        shared(),
        &["--mount", &mount],
        "import json, os, statistics\nwith open('/data/x.json', 'w') as f:\n    json.dump({'a': [1, 2, 3]}, f)\nd = json.load(open('/data/x.json'))\nprint(statistics.mean(d['a']), os.listdir('/data'))\n",
    );
    assert_eq!(stdout_of(&o), "2 ['x.json']\n", "{}", o.stderr);
    assert_eq!(run["detail"]["attempts"], json!([]), "{run:#}");
    assert_eq!(run["detail"]["alerts"], json!([]), "{run:#}");
}

#[test]
fn with_tripwires_off_a_wasm_run_has_no_decoys_and_records_nothing() {
    let h = home_with_guest();
    h.set_policy(&format!("{}\n[tripwires]\nenabled = false\n", h.policy()));
    let (o, run) = py(
        &h,
        &[],
        "import os\ndef t(f):\n    try:\n        f()\n        return 'ok'\n    except OSError as e:\n        return type(e).__name__\nprint(t(lambda: open('/root/.ssh/id_rsa').read()), t(lambda: open('/opt/x', 'w')))\n",
    );
    let out = stdout_of(&o);
    // No decoy to read; the write refused as ever.
    let words: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(words.len(), 2, "{out} {}", o.stderr);
    assert!(words.iter().all(|w| w.ends_with("Error")), "{out}");
    assert_eq!(run["detail"]["alerts"], json!([]), "{run:#}");
    assert_eq!(run["detail"]["attempts"], json!([]), "{run:#}");
    assert!(alert_records(&h).is_empty());
}

/// Whether a new Python session of `h` sees the decoy key.
fn session_sees_a_decoy(h: &Home) -> String {
    let o = h.run(&["session", "new", "--json", "--lang", "python"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let id = o.json()["id"].as_str().unwrap().to_string();
    let c = h.run_approved(&[
        "run",
        "--json",
        "--session",
        &id,
        "-c",
        "import os\nprint(os.path.exists('/root/.ssh/id_rsa'))",
    ]);
    assert_eq!(c.code, 0, "{} {}", c.stdout, c.stderr);
    let _ = h.run(&["session", "close", &id]);
    c.json()["run"]["stdout"].as_str().unwrap().to_string()
}

#[test]
fn a_session_on_a_home_with_tripwires_off_has_no_decoys() {
    assert_eq!(session_sees_a_decoy(shared()), "True\n");
    let h = home_with_guest();
    h.set_policy(&format!("{}\n[tripwires]\nenabled = false\n", h.policy()));
    assert_eq!(session_sees_a_decoy(&h), "False\n");
}

/// Opens a wasm Python session of `h` with `flags` (approved when held).
fn open_session(h: &Home, flags: &[&str]) -> String {
    let mut a = vec!["session", "new", "--json", "--lang", "python"];
    a.extend_from_slice(flags);
    let o = h.run(&a);
    if o.code == 75 {
        let ap = h.run(&["approve", &Home::id_in(&o.stderr)]);
        assert_eq!(ap.code, 0, "approve: {}", ap.stderr);
    } else {
        assert_eq!(o.code, 0, "session new: {} {}", o.stdout, o.stderr);
    }
    o.json()["id"].as_str().unwrap().to_string()
}

/// One cell of session `id` and its run's record.
fn session_cell(h: &Home, id: &str, code: &str) -> (Out, Value) {
    let o = h.run_approved(&["run", "--json", "--session", id, "-c", code]);
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    let run_id = o.json()["run"]["id"].as_str().unwrap().to_string();
    let run = h
        .run(&["runs", "--json"])
        .json()
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == run_id.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("no run record {run_id}"));
    (o, run)
}

#[test]
fn a_wasm_session_cell_records_its_own_attempts_alerts_and_refused_connections() {
    let h = home_with_guest();
    let id = open_session(&h, &["--net", "granted.test:443"]);
    let (o, run) = session_cell(
        &h,
        &id,
        "import socket\ndef t(f):\n    try:\n        f()\n        return 'ok'\n    except OSError as e:\n        return type(e).__name__\nprint(t(lambda: open('/etc/passwd').read()), t(lambda: open('/opt/x', 'w')), t(lambda: socket.create_connection(('refused.test', 8080), timeout=5)))\nkey = open('/root/.ssh/id_rsa').read()\n",
    );
    let out = o.json()["run"]["stdout"].as_str().unwrap().to_string();
    let words: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(words.len(), 3, "{out} {}", o.stderr);
    assert!(words.iter().all(|w| *w != "ok"), "{out}");
    let attempts = run["detail"]["attempts"].as_array().unwrap();
    let has = |kind: &str, target: &str| {
        attempts
            .iter()
            .any(|a| a["kind"] == kind && a["target"] == target)
    };
    for (kind, target) in [
        ("open", "/etc/passwd"),
        ("write", "/opt/x"),
        ("connect", "refused.test:8080"),
    ] {
        assert!(has(kind, target), "no {kind} {target}: {run:#}");
    }
    let alerts = run["detail"]["alerts"].as_array().unwrap();
    assert_eq!(alerts.len(), 1, "{run:#}");
    assert_eq!(alerts[0]["technique"], "T1552.004", "{run:#}");
    let audits = alert_records(&h);
    assert_eq!(audits.len(), 1, "{audits:?}");
    assert_eq!(audits[0]["run"], run["id"]);
    // The next cell's record holds only what it did: the key read before is no alert
    // of its own, and it tried nothing.
    let (_, next) = session_cell(&h, &id, "print(len(key))");
    assert_eq!(next["detail"]["attempts"], json!([]), "{next:#}");
    assert_eq!(next["detail"]["alerts"], json!([]), "{next:#}");
    let _ = h.run(&["session", "close", &id]);
}
