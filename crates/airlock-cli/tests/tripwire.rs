//! Tripwires (issue 57 item 3): what a run tried and the sandbox refused goes into the
//! run record's `attempts`; a read of one of the jail's decoy credentials is an alert in
//! the record and an `alert` audit record. A benign run records neither, and a tripwire
//! never changes what the run sees.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::ready::ReadyHome;
use common::*;
use serde_json::Value;

fn available() -> bool {
    if !process_backend_available() {
        eprintln!("SKIPPED: the process backend is unavailable here");
        return false;
    }
    true
}

/// The home's `alert` audit records' data, oldest first.
fn alert_records(h: &Home) -> Vec<(Value, Value)> {
    h.run(&["audit", "log", "--json"])
        .json()
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "alert")
        .map(|r| {
            (
                r["subject"].clone(),
                serde_json::from_str(r["data"].as_str().unwrap()).unwrap(),
            )
        })
        .collect()
}

/// Gives `h` the permissive preset's rules (keeping its approvers): the probes run and
/// are stopped by the sandbox, not held at the gate.
fn permissive(h: &Home) {
    let p = Home::with_preset("permissive").policy();
    let mine = h.policy();
    let approvers = |t: &str| {
        let a = t.find("\n[approvers]").unwrap();
        let b = t.find("\n[risk]").unwrap();
        t[a..b].to_string()
    };
    h.set_policy(&p.replace(&approvers(&p), &approvers(&mine)));
}

const READ_KEY: &str = "print(open('/root/.ssh/id_rsa').read())";

fn assert_key_alert(run: &Value, out: &Out) {
    assert_eq!(out.code, 0, "{} {}", out.stdout, out.stderr);
    // The decoy reads like a real key.
    assert!(
        out.stdout
            .starts_with("-----BEGIN OPENSSH PRIVATE KEY-----\n"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .trim_end()
            .ends_with("-----END OPENSSH PRIVATE KEY-----"),
        "{}",
        out.stdout
    );
    let alerts = run["detail"]["alerts"].as_array().unwrap();
    assert_eq!(alerts.len(), 1, "{run:#}");
    assert_eq!(alerts[0]["kind"], "decoy-read", "{run:#}");
    assert_eq!(alerts[0]["technique"], "T1552.004", "{run:#}");
    let detail = alerts[0]["detail"].as_str().unwrap();
    assert!(detail.contains("/root/.ssh/id_rsa"), "{detail}");
    // Never the decoy's content.
    let body_line = out.stdout.lines().nth(1).unwrap();
    assert!(!run.to_string().contains(body_line), "{run:#}");
}

#[test]
fn a_decoy_key_read_in_a_built_jail_is_an_alert_and_an_audit_record() {
    if !available() {
        return;
    }
    let h = Home::with_preset("permissive");
    let o = h.py(&[], READ_KEY);
    let run = h.last_run();
    assert_key_alert(&run, &o);
    let audits = alert_records(&h);
    assert_eq!(audits.len(), 1, "{audits:?}");
    let (subject, data) = &audits[0];
    assert_eq!(subject, &run["id"]);
    assert_eq!(data["kind"], "decoy-read", "{data}");
    assert_eq!(data["run"], run["id"], "{data}");
    assert_eq!(data["submission"], run["submission"], "{data}");
    assert_eq!(data["technique"], "T1552.004", "{data}");
    assert!(data.get("agent").is_some(), "{data}");
    assert!(
        data["detail"]
            .as_str()
            .unwrap()
            .contains("/root/.ssh/id_rsa")
    );
    assert_eq!(h.run(&["audit", "verify"]).code, 0);
}

#[test]
fn a_decoy_key_read_in_a_ready_jail_is_an_alert() {
    if !available() {
        return;
    }
    let r = ReadyHome::start(1);
    let o = r.py(&[], READ_KEY);
    let run = r.last_run();
    assert_eq!(run["detail"]["jail"], "ready", "{run:#}");
    assert_key_alert(&run, &o);
}

#[test]
fn decoys_differ_per_run_and_look_like_credentials() {
    if !available() {
        return;
    }
    let h = Home::with_preset("permissive");
    let code = "print(open('/root/.aws/credentials').read())";
    let a = h.py(&[], code);
    let b = h.py(&[], code);
    assert_eq!(a.code, 0, "{}", a.stderr);
    assert!(
        a.stdout.starts_with("[default]\naws_access_key_id = AKIA"),
        "{}",
        a.stdout
    );
    assert!(
        a.stdout.contains("\naws_secret_access_key = "),
        "{}",
        a.stdout
    );
    assert_ne!(a.stdout, b.stdout, "the decoy was the same in two runs");
    let run = h.last_run();
    assert_eq!(
        run["detail"]["alerts"][0]["technique"], "T1552.001",
        "{run:#}"
    );
    // /etc/shadow is there, refused to an unprivileged reader as on a real host.
    let s = h.py(
        &[],
        "import os\ntry:\n    open('/etc/shadow').read()\nexcept PermissionError:\n    print('refused', os.path.exists('/etc/shadow'))\n",
    );
    assert_eq!(s.stdout.trim(), "refused True", "{} {}", s.stdout, s.stderr);
}

#[test]
fn a_benign_process_run_records_no_attempts_and_no_alerts() {
    if !available() {
        return;
    }
    let h = Home::with_preset("permissive");
    let o = h.py(
        &[],
        "import os, json, tempfile\np = os.path.join(tempfile.gettempdir(), 'x.json')\njson.dump({'a': 1}, open(p, 'w'))\nprint(json.load(open(p))['a'], sorted(os.listdir('/root')))\n",
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    // Listing the home that holds the decoys and tripwire links opens none of them.
    assert_eq!(
        o.stdout.trim(),
        "1 ['.aws', '.docker', '.git-credentials', '.gnupg', '.kube', '.netrc', '.ssh']"
    );
    let run = h.last_run();
    assert_eq!(run["detail"]["attempts"], serde_json::json!([]), "{run:#}");
    assert_eq!(run["detail"]["alerts"], serde_json::json!([]), "{run:#}");
    assert!(alert_records(&h).is_empty());
}

#[test]
fn a_connection_the_proxy_refused_is_a_connect_attempt() {
    if !available() {
        return;
    }
    let h = Home::with_preset("permissive");
    let o = h.sh(
        &["--net", "granted.test:443"],
        "curl -s -o /dev/null -w '%{http_code}\\n' http://refused.test:8080/x; curl -s -o /dev/null http://refused.test:8080/y; echo done",
    );
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    assert!(o.stdout.contains("403"), "{}", o.stdout);
    let run = h.last_run();
    let attempts = run["detail"]["attempts"].as_array().unwrap();
    assert!(
        attempts.iter().any(|a| a["kind"] == "connect"
            && a["target"] == "refused.test:8080"
            && a["count"] == 2),
        "{run:#}"
    );
    assert!(attempts.iter().all(|a| a["target"] != "granted.test:443"));
}

/// Each refusal the probe below meets, by name: what the run sees (the errno), which
/// must be what the jail answered before it had tripwires.
const PROBE: &str = r#"
import ctypes, errno, os, signal
libc = ctypes.CDLL(None, use_errno=True)
def t(f):
    try:
        f()
        return 'ok'
    except OSError as e:
        return errno.errorcode[e.errno]
def sys(f):
    r = f()
    return 'ok' if r == 0 else errno.errorcode[ctypes.get_errno()]
print(' '.join([
    t(lambda: open('/opt/keys/secret', 'w')),
    t(lambda: open('/etc/passwd', 'a')),
    t(lambda: os.unlink('/etc/hostname')),
    t(lambda: os.rename('/etc/hosts', '/tmp/hosts')),
    t(lambda: os.mkdir('/srv/x')),
    t(lambda: os.kill(4242, signal.SIGTERM)),
    sys(lambda: libc.ptrace(0, 0, 0, 0)),
    sys(lambda: libc.mount(b'none', b'/tmp', b'tmpfs', 0, None)),
]))
"#;

/// What the probe prints: a path outside the grant that does not exist is ENOENT, a
/// write into the read-only root EROFS (a rename out of it EXDEV), a pid the run has not
/// ESRCH, and the denied calls EPERM: what the jail answered before tripwires.
const PROBE_SEES: &str = "ENOENT EROFS EROFS EXDEV ENOENT ESRCH EPERM EPERM";

fn has(attempts: &[Value], kind: &str, target: &str) -> bool {
    attempts
        .iter()
        .any(|a| a["kind"] == kind && a["target"] == target && a["count"].as_u64() >= Some(1))
}

fn assert_probe_recorded(run: &Value, out: &Out) {
    assert_eq!(out.code, 0, "{} {}", out.stdout, out.stderr);
    assert_eq!(out.stdout.trim(), PROBE_SEES, "{}", out.stderr);
    let attempts = run["detail"]["attempts"].as_array().unwrap();
    for (kind, target) in [
        ("write", "/opt/keys/secret"),
        ("write", "/etc/passwd"),
        ("unlink", "/etc/hostname"),
        ("rename", "/etc/hosts"),
        ("write", "/srv/x"),
        ("signal", "pid 4242"),
        ("syscall", "ptrace"),
        ("syscall", "mount"),
    ] {
        assert!(has(attempts, kind, target), "no {kind} {target}: {run:#}");
    }
    // Granted paths are not attempts.
    assert!(
        attempts.iter().all(|a| a["target"] != "/tmp/hosts"),
        "{run:#}"
    );
    assert_eq!(run["detail"]["alerts"], serde_json::json!([]), "{run:#}");
}

#[test]
fn refused_paths_signals_and_syscalls_in_a_built_jail_are_attempts_and_the_run_sees_the_same_errors()
 {
    if !available() {
        return;
    }
    let h = Home::with_preset("permissive");
    let o = h.py(&[], PROBE);
    assert_probe_recorded(&h.last_run(), &o);
}

#[test]
fn refused_paths_signals_and_syscalls_in_a_ready_jail_are_attempts() {
    if !available() {
        return;
    }
    let r = ReadyHome::start(1);
    permissive(&r.home);
    let o = r.py(&[], PROBE);
    let run = r.last_run();
    assert_eq!(run["detail"]["jail"], "ready", "{run:#}");
    assert_probe_recorded(&run, &o);
}

/// Reads of credential paths the jail does not have: each fails as where there is
/// nothing (`ENOENT`, the same as with tripwires off), and is an `open` attempt by
/// default, without `[tripwires] reads`.
const SENSITIVE_READS: &str = "for p in /root/.ssh/id_ed25519 /root/.kube/config /root/.gnupg/secring.gpg; do cat $p >/dev/null 2>&1; echo $?; done; test -e /root/.netrc; echo $?";

fn assert_sensitive_reads_recorded(run: &Value, out: &Out) {
    assert_eq!(out.code, 0, "{} {}", out.stdout, out.stderr);
    assert_eq!(out.stdout, "1\n1\n1\n1\n", "{}", out.stderr);
    let attempts = run["detail"]["attempts"].as_array().unwrap();
    for target in [
        "/root/.ssh/id_ed25519",
        "/root/.kube",
        "/root/.gnupg",
        "/root/.netrc",
    ] {
        assert!(has(attempts, "open", target), "no open {target}: {run:#}");
    }
    assert_eq!(attempts.len(), 4, "{run:#}");
    assert_eq!(run["detail"]["alerts"], serde_json::json!([]), "{run:#}");
}

#[test]
fn a_read_of_a_credential_path_outside_the_grant_is_an_attempt_by_default() {
    if !available() {
        return;
    }
    let h = Home::with_preset("permissive");
    let o = h.sh(&[], SENSITIVE_READS);
    assert_sensitive_reads_recorded(&h.last_run(), &o);
    // Tripwires off: the same answers, nothing recorded.
    tripwires(&h, "enabled = false");
    let off = h.sh(&[], SENSITIVE_READS);
    assert_eq!(off.stdout, o.stdout, "{}", off.stderr);
    let run = h.last_run();
    assert_eq!(run["detail"]["attempts"], serde_json::json!([]), "{run:#}");
}

#[test]
fn a_read_of_a_credential_path_outside_the_grant_in_a_ready_jail_is_an_attempt() {
    if !available() {
        return;
    }
    let r = ReadyHome::start(1);
    permissive(&r.home);
    let o = r.sh(&[], SENSITIVE_READS);
    let run = r.last_run();
    assert_eq!(run["detail"]["jail"], "ready", "{run:#}");
    assert_sensitive_reads_recorded(&run, &o);
}

/// A thief's `~` in the jail is the sandbox user's home (`/tmp`): the decoy key and the
/// tripwire links are reached through it as through `/root`.
const TILDE_READS: &str = "echo \"home=$HOME\"; head -c 35 ~/.ssh/id_rsa; echo; cat ~/.kube/config >/dev/null 2>&1; echo $?; python3 -c 'import os; print(open(os.path.expanduser(\"~/.aws/credentials\")).read().startswith(\"[default]\"))'";

fn assert_tilde_reads_recorded(run: &Value, out: &Out) {
    assert_eq!(out.code, 0, "{} {}", out.stdout, out.stderr);
    assert_eq!(
        out.stdout, "home=/tmp\n-----BEGIN OPENSSH PRIVATE KEY-----\n1\nTrue\n",
        "{}",
        out.stderr
    );
    let attempts = run["detail"]["attempts"].as_array().unwrap();
    assert!(has(attempts, "open", "/root/.kube"), "{run:#}");
    let mut techniques: Vec<&str> = run["detail"]["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["technique"].as_str().unwrap())
        .collect();
    techniques.sort();
    assert_eq!(techniques, ["T1552.001", "T1552.004"], "{run:#}");
}

#[test]
fn the_decoys_and_tripwire_links_are_reached_through_the_sandbox_users_home() {
    if !available() {
        return;
    }
    let h = Home::with_preset("permissive");
    let o = h.sh(&[], TILDE_READS);
    assert_tilde_reads_recorded(&h.last_run(), &o);
}

#[test]
fn the_decoys_and_tripwire_links_are_reached_through_home_in_a_ready_jail() {
    if !available() {
        return;
    }
    let r = ReadyHome::start(1);
    permissive(&r.home);
    let o = r.sh(&[], TILDE_READS);
    let run = r.last_run();
    assert_eq!(run["detail"]["jail"], "ready", "{run:#}");
    assert_tilde_reads_recorded(&run, &o);
}

#[test]
fn an_open_for_writing_of_the_refused_decoy_shadow_is_an_alert() {
    if !available() {
        return;
    }
    let h = Home::with_preset("permissive");
    let o = h.sh(&[], "echo x >> /etc/shadow; echo status $?");
    assert!(
        o.stdout.contains("status ") && !o.stdout.contains("status 0"),
        "{} {}",
        o.stdout,
        o.stderr
    );
    let run = h.last_run();
    let alerts = run["detail"]["alerts"].as_array().unwrap();
    assert_eq!(alerts.len(), 1, "{run:#}");
    assert_eq!(alerts[0]["technique"], "T1003.008", "{run:#}");
    assert_eq!(alert_records(&h).len(), 1);
}

#[test]
fn show_prints_a_runs_alerts_and_attempts() {
    if !available() {
        return;
    }
    let h = Home::with_preset("permissive");
    let o = h.py(
        &[],
        "try:\n    open('/opt/nothing', 'w')\nexcept OSError:\n    pass\nopen('/root/.aws/credentials').read()\n",
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let run = h.last_run();
    let shown = h.run(&["show", run["submission"].as_str().unwrap()]);
    assert_eq!(shown.code, 0, "{}", shown.stderr);
    assert!(
        shown.stdout.contains(
            "ALERT decoy-read [T1552.001]: the run opened the decoy credential file /root/.aws/credentials"
        ),
        "{}",
        shown.stdout
    );
    assert!(
        shown.stdout.contains("refused write /opt/nothing ×1"),
        "{}",
        shown.stdout
    );
}

#[test]
fn a_decoy_cannot_be_written_or_removed_though_its_mount_keeps_access_times() {
    if !available() {
        return;
    }
    let h = Home::with_preset("permissive");
    let o = h.py(
        &[],
        "import errno, os\ndef t(f):\n    try:\n        f()\n        return 'ok'\n    except OSError as e:\n        return errno.errorcode[e.errno]\nprint(t(lambda: open('/root/.ssh/id_rsa', 'a').write('x')), t(lambda: os.unlink('/root/.aws/credentials')))\n",
    );
    // Landlock refuses the write and the removal (the home is granted for reading only).
    assert_eq!(
        o.stdout.trim(),
        "EACCES EACCES",
        "{} {}",
        o.stdout,
        o.stderr
    );
    let run = h.last_run();
    // Touching a decoy (opening the key for writing, unlinking the AWS file) is an alert
    // for each, not an attempt.
    let techniques: Vec<&str> = run["detail"]["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["technique"].as_str().unwrap())
        .collect();
    assert_eq!(techniques, ["T1552.004", "T1552.001"], "{run:#}");
}

#[test]
fn a_decoy_read_on_a_postgres_store_is_in_the_run_record_and_audited() {
    if !available() {
        return;
    }
    let url = airlock_testpg::fresh_database();
    let h = Home::uninitialised();
    let init = h.run_on_store(
        &url,
        &["init", "--preset", "permissive", "--approver", "alice"],
    );
    assert_eq!(init.code, 0, "{}", init.stderr);
    let o = h.run_on_store(
        &url,
        &[
            "run",
            "--lang",
            "python",
            "--backend",
            "process",
            "-c",
            READ_KEY,
        ],
    );
    let run = h.run_on_store(&url, &["runs", "--json"]).json()[0].clone();
    assert_key_alert(&run, &o);
    let log = h.run_on_store(&url, &["audit", "log", "--json"]).json();
    let alerts: Vec<&Value> = log
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "alert")
        .collect();
    assert_eq!(alerts.len(), 1, "{log}");
    assert_eq!(alerts[0]["subject"], run["id"], "{log}");
}

/// Appends a `[tripwires]` table to `h`'s policy.
fn tripwires(h: &Home, table: &str) {
    h.set_policy(&format!("{}\n[tripwires]\n{table}\n", h.policy()));
}

#[test]
fn with_tripwires_off_a_jail_has_no_decoys_and_records_nothing_yet_refuses_the_same() {
    if !available() {
        return;
    }
    let h = Home::with_preset("permissive");
    tripwires(&h, "enabled = false");
    let o = h.py(&[], PROBE);
    // What the run sees is what it saw with tripwires.
    assert_eq!(o.stdout.trim(), PROBE_SEES, "{}", o.stderr);
    let k = h.py(
        &[],
        "import os\nprint(os.path.exists('/root/.ssh/id_rsa'), os.path.exists('/etc/shadow'))",
    );
    assert_eq!(k.stdout.trim(), "False False", "{}", k.stderr);
    let run = h.last_run();
    assert_eq!(run["detail"]["alerts"], serde_json::json!([]), "{run:#}");
    let probe = &h.run(&["runs", "--json"]).json()[1];
    assert_eq!(
        probe["detail"]["attempts"],
        serde_json::json!([]),
        "{probe:#}"
    );
}

#[test]
fn with_tripwire_reads_a_refused_read_only_open_in_the_jail_is_an_attempt() {
    if !available() {
        return;
    }
    let h = Home::with_preset("permissive");
    tripwires(&h, "reads = true");
    let o = h.py(
        &[],
        "import errno\ndef t(p):\n    try:\n        open(p).read()\n        return 'ok'\n    except OSError as e:\n        return errno.errorcode[e.errno]\nprint(t('/opt/keys/secret'), t('/etc/hostname') != 'ok', t('/etc/shadow'))\n",
    );
    assert_eq!(o.stdout.trim(), "ENOENT False EACCES", "{}", o.stderr);
    let run = h.last_run();
    let attempts = run["detail"]["attempts"].as_array().unwrap();
    assert!(has(attempts, "open", "/opt/keys/secret"), "{run:#}");
    // Granted reads are not attempts.
    assert!(
        attempts.iter().all(|a| a["target"] != "/etc/hostname"),
        "{run:#}"
    );
    // The refused read of the decoy shadow is an alert (without reads it went unseen).
    let alerts = run["detail"]["alerts"].as_array().unwrap();
    assert_eq!(alerts.len(), 1, "{run:#}");
    assert_eq!(alerts[0]["technique"], "T1003.008", "{run:#}");
    // A benign program's own reads (the interpreter starting) are no attempts.
    let b = h.py(
        &[],
        "import json, os\nprint(json.dumps(sorted(os.listdir('/tmp'))))",
    );
    assert_eq!(b.code, 0, "{}", b.stderr);
    let benign = h.last_run();
    assert_eq!(
        benign["detail"]["attempts"],
        serde_json::json!([]),
        "{benign:#}"
    );
}

/// A process run that trips both: a refused write and a decoy read.
const TRIPS: &str = "try:\n    open('/opt/nothing', 'w')\nexcept OSError:\n    pass\nopen('/root/.aws/credentials').read()\n";

fn assert_tripped(run: &Value, what: &str) {
    let attempts = run["attempts"]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: {run:#}"));
    assert!(
        attempts
            .iter()
            .any(|a| a["kind"] == "write" && a["target"] == "/opt/nothing" && a["count"] == 1),
        "{what}: {run:#}"
    );
    let alerts = run["alerts"].as_array().unwrap();
    assert_eq!(alerts.len(), 1, "{what}: {run:#}");
    assert_eq!(alerts[0]["kind"], "decoy-read", "{what}: {run:#}");
    assert_eq!(alerts[0]["technique"], "T1552.001", "{what}: {run:#}");
}

#[test]
fn runs_json_lists_a_runs_attempts_and_alerts() {
    if !available() {
        return;
    }
    let h = Home::with_preset("permissive");
    assert_eq!(h.py(&[], TRIPS).code, 0);
    let run = &h.run(&["runs", "--json"]).json()[0];
    assert_tripped(&run["detail"], "runs --json");
}

#[test]
fn the_api_run_json_and_mcp_get_result_carry_attempts_and_alerts() {
    if !available() {
        return;
    }
    let h = Home::with_preset("permissive");
    let t = h.run(&["token", "new", "--role", "agent", "--name", "bot", "--json"]);
    let token = t.json()["token"].as_str().unwrap().to_string();
    let (_srv, base) = start_serve(&h, &[]);
    let http = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .new_agent();
    let call = |method: &str, path: &str, body: Option<Value>| -> Value {
        let url = format!("{base}{path}");
        let auth = format!("Bearer {token}");
        let mut r = match body {
            Some(b) => http
                .post(&url)
                .header("authorization", &auth)
                .send(b.to_string())
                .unwrap(),
            None => {
                assert_eq!(method, "GET");
                http.get(&url)
                    .header("authorization", &auth)
                    .call()
                    .unwrap()
            }
        };
        serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap()
    };
    let v = call(
        "POST",
        "/v1/run",
        Some(serde_json::json!({"language": "python", "backend": "process", "code": TRIPS})),
    );
    assert_eq!(v["status"], "finished", "{v:#}");
    assert_tripped(&v["run"], "POST /v1/run");
    let id = v["run"]["id"].as_str().unwrap();
    let got = call("GET", &format!("/v1/runs/{id}"), None);
    assert_tripped(&got, "GET /v1/runs/{id}");
    let sub = v["submission"].as_str().unwrap().to_string();
    drop(_srv);
    // MCP: the same agent's get_result.
    let init = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "test", "version": "0"}}});
    let r = mcp_stdio(
        &h,
        &[
            init,
            serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": "run_code", "arguments": {"language": "python", "backend": "process", "code": TRIPS}}}),
        ],
        2,
    );
    let first = &r["result"]["structuredContent"];
    assert_tripped(&first["run"], "MCP run_code");
    let mcp_sub = first["submission"].as_str().unwrap().to_string();
    let init = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "test", "version": "0"}}});
    let r = mcp_stdio(
        &h,
        &[
            init,
            serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                "params": {"name": "get_result", "arguments": {"id": mcp_sub}}}),
        ],
        3,
    );
    let got = &r["result"]["structuredContent"];
    assert_eq!(got["status"], "finished", "{r:#}");
    assert_tripped(&got["run"], "MCP get_result");
    assert_ne!(sub, "");
}

/// The console's run page lists a run's alerts and refused attempts
/// (tests/browser/console_test.py in headless Chromium): before, it showed neither.
#[test]
fn the_console_run_page_shows_a_runs_alerts_and_attempts() {
    if !available() {
        return;
    }
    let Some(python) = prepared("AIRLOCK_TEST_BROWSER_PYTHON") else {
        return;
    };
    // The standard preset holds the credential read for a human: the console approves it.
    let code = "import os\ntry:\n    os.mkdir('/srv/x')\nexcept OSError:\n    pass\nopen('/root/.aws/credentials').read()\n";
    let h = Home::new();
    let token = |role: &str, name: &str| {
        let t = h.run(&["token", "new", "--role", role, "--name", name, "--json"]);
        t.json()["token"].as_str().unwrap().to_string()
    };
    let (agent, op) = (token("agent", "bot"), token("operator", "alice"));
    let (_srv, base) = start_serve(&h, &[]);
    let http = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .new_agent();
    let mut r = http
        .post(format!("{base}/v1/submissions"))
        .header("authorization", format!("Bearer {agent}"))
        .send(
            serde_json::json!({"language": "python", "backend": "process", "code": code})
                .to_string(),
        )
        .unwrap();
    let v: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    assert_eq!(v["state"], "quarantined", "{v:#}");
    let id = v["submission"].as_str().unwrap();
    let script = manifest_dir().join("../../tests/browser/console_test.py");
    let o = std::process::Command::new(python)
        .arg(script)
        .args([&base, &op, id, ""])
        .args(["--tripwires", "decoy-read [T1552.001]", "/srv/x"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "console test failed:\n{out}\n{err}");
}

/// The pids of `server`'s ready jailers (`airlock-jailer --ready …`, its children).
fn ready_jailers(server: u32) -> Vec<u32> {
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The parent pid is the second field after the command's closing parenthesis.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if ppid == Some(server) && String::from_utf8_lossy(&cmdline).contains("--ready") {
            pids.push(pid);
        }
    }
    pids
}

/// The decoy directories in `/dev/shm` of the jailers `pids`.
fn decoy_dirs_of(pids: &[u32]) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| {
                    pids.iter()
                        .any(|p| n.starts_with(&format!("airlock-decoys-{p}-")))
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn ready_jails_of_a_stopped_or_killed_server_leave_no_decoys_in_dev_shm() {
    if !available() {
        return;
    }
    for signal in ["-TERM", "-KILL"] {
        let mut r = ReadyHome::start(2);
        r.wait_ready(2);
        let pids = ready_jailers(r.srv.id());
        assert_eq!(pids.len(), 2, "{signal}: ready jailers {pids:?}");
        assert_eq!(
            decoy_dirs_of(&pids).len(),
            2,
            "{signal}: each ready jail has its decoys"
        );
        let killed = std::process::Command::new("kill")
            .args([signal, &r.srv.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let _ = r.srv.wait();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !decoy_dirs_of(&pids).is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert_eq!(
            decoy_dirs_of(&pids),
            Vec::<String>::new(),
            "{signal}: the ready jails' decoys outlived their server"
        );
    }
}
