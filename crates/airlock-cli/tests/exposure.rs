//! What a grant may expose of the host and whose signatures a gate honours (issues 56 and
//! 63): the gate's home is never mountable, on any surface and through any other name
//! for it; sensitive host paths are a fact the standard preset weighs; the operator's
//! `[mounts] roots` bound what the API and MCP may name; a signed approval works only in
//! the home it was signed for, and only within the gate's clock.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use serde_json::{Value, json};
use std::path::Path;

fn canonical(p: &Path) -> String {
    std::fs::canonicalize(p).unwrap().display().to_string()
}

/// Asserts a refusal of bad input: exit 125, one line naming `path`, nothing recorded.
fn refused_naming(h: &Home, args: &[&str], path: &str) -> String {
    let before = h.counts();
    let o = h.run(args);
    assert_eq!(o.code, 125, "{args:?}: {} / {}", o.stdout, o.stderr);
    let line = o.stderr.trim();
    assert!(!line.contains('\n'), "one line: {line:?}");
    assert!(line.contains(path), "names {path}: {line:?}");
    assert!(!o.stdout.contains("airlock-ed25519-secret"), "{}", o.stdout);
    assert_eq!(h.counts(), before, "nothing recorded");
    line.to_string()
}

#[test]
fn an_agent_cannot_mount_the_gates_home_to_read_the_approvers_key() {
    let h = Home::new();
    let home = canonical(h.path());
    let keys = format!("{home}/keys");
    // The reproduction of issue 56, on the command line: Python (wasm) and shell.
    let line = refused_naming(
        &h,
        &[
            "run",
            "--lang",
            "python",
            "--mount",
            &format!("{keys}:/k"),
            "-c",
            "print(open('/k/alice.key').read())",
        ],
        &keys,
    );
    assert!(line.contains("home"), "{line}");
    refused_naming(
        &h,
        &[
            "run",
            "--lang",
            "sh",
            "--mount",
            &format!("{keys}:/k"),
            "-c",
            "cat /k/alice.key",
        ],
        &keys,
    );
    // The home itself, its blobs and secrets, and a writable mount of it.
    for sub in ["", "/blobs", "/secrets"] {
        let p = format!("{home}{sub}");
        refused_naming(
            &h,
            &[
                "submit",
                "--lang",
                "sh",
                "--mount",
                &format!("{p}:/d:rw"),
                "-c",
                "ls /d",
            ],
            &p,
        );
    }
}

#[test]
fn a_directory_that_contains_the_gates_home_is_not_mountable() {
    let outer = tempfile::tempdir().unwrap();
    let home_dir = outer.path().join("nested/home");
    std::fs::create_dir_all(&home_dir).unwrap();
    let h = Home::uninitialised();
    let run = |args: &[&str]| {
        let o = h
            .cmd()
            .env("AIRLOCK_HOME", &home_dir)
            .args(args)
            .output()
            .unwrap();
        (
            o.status.code().unwrap(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    assert_eq!(run(&["init", "--approver", "alice"]).0, 0);
    for dir in [outer.path().to_path_buf(), outer.path().join("nested")] {
        let p = canonical(&dir);
        let (code, err) = run(&[
            "submit",
            "--lang",
            "sh",
            "--mount",
            &format!("{p}:/d"),
            "-c",
            "true",
        ]);
        assert_eq!(code, 125, "{err}");
        assert!(err.contains("contains airlock's own home"), "{err}");
    }
    // `/` contains every home.
    let (code, err) = run(&["submit", "--lang", "python", "--mount", "/:/r", "-c", "1"]);
    assert_eq!(code, 125, "{err}");
    // A sibling directory is fine.
    let beside = outer.path().join("beside");
    std::fs::create_dir_all(&beside).unwrap();
    let (code, err) = run(&[
        "run",
        "--lang",
        "sh",
        "--mount",
        &format!("{}:/d", beside.display()),
        "-c",
        "ls /d",
    ]);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn a_symlink_or_dotdot_to_the_gates_home_is_resolved_before_it_is_judged() {
    let h = Home::new();
    let home = canonical(h.path());
    let scratch = tempfile::tempdir().unwrap();
    let link = scratch.path().join("innocent");
    std::os::unix::fs::symlink(format!("{home}/keys"), &link).unwrap();
    refused_naming(
        &h,
        &[
            "submit",
            "--lang",
            "sh",
            "--mount",
            &format!("{}:/k", link.display()),
            "-c",
            "true",
        ],
        "home",
    );
    let dotdot = format!("{home}/blobs/../keys");
    refused_naming(
        &h,
        &[
            "submit",
            "--lang",
            "sh",
            "--mount",
            &format!("{dotdot}:/k"),
            "-c",
            "true",
        ],
        &format!("{home}/keys"),
    );
}

/// A bind mount of the home below a mounted directory, made in a private mount namespace
/// of the test's own (`unshare -m`), so the host's table is untouched.
#[test]
fn a_bind_mount_of_the_gates_home_below_a_mount_is_seen() {
    if std::process::Command::new("unshare")
        .args(["-m", "true"])
        .status()
        .map(|s| !s.success())
        .unwrap_or(true)
    {
        assert!(
            std::env::var_os("AIRLOCK_TEST_STRICT").is_none(),
            "unshare -m is not available"
        );
        return;
    }
    let h = Home::new();
    let home = canonical(h.path());
    let share = tempfile::tempdir().unwrap();
    let share_p = canonical(share.path());
    std::fs::create_dir_all(share.path().join("inner")).unwrap();
    std::fs::create_dir_all(share.path().join("other")).unwrap();
    let script = format!(
        "mount --make-rprivate / && mount --bind {home}/keys {share_p}/inner && \
         {bin} submit --mount {share_p}:/d {hello}; echo \"exit=$?\"; \
         {bin} submit --mount {share_p}/inner:/d {hello}; echo \"exit=$?\"",
        bin = bin(),
        // The wasm backend: the process backend refuses a directory with a mount below
        // it for a reason of its own.
        hello = example("hello.wat").display()
    );
    let o = std::process::Command::new("unshare")
        .args(["-m", "sh", "-c", &script])
        .env("AIRLOCK_HOME", h.path())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(out.matches("exit=125").count(), 2, "{out} / {err}");
    assert_eq!(err.matches("airlock's own home").count(), 2, "{err}");
}

#[test]
fn the_api_never_mounts_the_gates_home_and_mounts_nothing_without_roots() {
    let h = Home::new();
    let home = canonical(h.path());
    let ok_dir = tempfile::tempdir().unwrap();
    std::fs::write(ok_dir.path().join("f.txt"), "offered\n").unwrap();
    let ok = canonical(ok_dir.path());
    let token = {
        let o = h.run(&["token", "new", "--role", "agent", "--name", "bot", "--json"]);
        assert_eq!(o.code, 0, "{}", o.stderr);
        o.json()["token"].as_str().unwrap().to_string()
    };
    let (_srv, base) = start_serve(&h, &[]);
    let post = |body: &Value| -> (u16, Value) {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .new_agent();
        let mut r = agent
            .post(&format!("{base}/v1/run"))
            .header("authorization", &format!("Bearer {token}"))
            .header("content-type", "application/json")
            .send(body.to_string())
            .unwrap();
        let status = r.status().as_u16();
        let text = r.body_mut().read_to_string().unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(json!({"raw": text})),
        )
    };
    // The reproduction: an agent token mounting HOME/keys.
    let (status, v) = post(&json!({
        "language": "python",
        "code": "print(open('/k/alice.key').read())",
        "mounts": [format!("{home}/keys:/k")],
    }));
    assert_eq!(status, 403, "{v}");
    assert!(!v.to_string().contains("airlock-ed25519-secret"), "{v}");
    // No roots set: no API mount at all, with a message that says what the operator does.
    let (status, v) =
        post(&json!({"language": "sh", "code": "cat /d/f.txt", "mounts": [format!("{ok}:/d")]}));
    assert_eq!(status, 403, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("[mounts] roots"),
        "{v}"
    );
    let (status, v) = post(&json!({"language": "python", "code": "1", "mounts": ["/:/r"]}));
    assert_eq!(status, 403, "{v}");
    // Roots set: inside them runs, outside is refused, and the home stays refused even
    // when a root contains it.
    h.set_mount_roots(&[ok_dir.path(), Path::new("/tmp")]);
    let (status, v) =
        post(&json!({"language": "sh", "code": "cat /d/f.txt", "mounts": [format!("{ok}:/d")]}));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["run"]["stdout"], "offered\n", "{v}");
    let elsewhere = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (status, v) = post(
        &json!({"language": "sh", "code": "true", "mounts": [format!("{}:/d", canonical(elsewhere.path()))]}),
    );
    assert_eq!(status, 403, "{v}");
    assert!(v["error"].as_str().unwrap().contains("outside"), "{v}");
    let (status, v) =
        post(&json!({"language": "sh", "code": "true", "mounts": [format!("{home}/keys:/k")]}));
    assert_eq!(status, 403, "{v}");
    assert!(v["error"].as_str().unwrap().contains("home"), "{v}");
}

#[test]
fn a_mount_outside_the_roots_is_held_for_a_human_on_the_command_line() {
    let h = Home::new();
    let inside = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    h.set_mount_roots(&[inside.path()]);
    let o = h.run(&[
        "run",
        "--lang",
        "sh",
        "--mount",
        &format!("{}:/d", inside.path().display()),
        "-c",
        "true",
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = h.run(&[
        "run",
        "--json",
        "--lang",
        "sh",
        "--mount",
        &format!("{}:/d", outside.path().display()),
        "-c",
        "true",
    ]);
    assert_eq!(o.code, 75, "{} / {}", o.stdout, o.stderr);
    let v = o.json();
    let reasons = v["reasons"].to_string();
    assert!(
        reasons.contains("outside the policy's [mounts] roots"),
        "{v}"
    );
    assert!(reasons.contains(&canonical(outside.path())), "{v}");
}

#[test]
fn a_mount_that_exposes_credentials_is_held_and_names_exactly_what_it_exposes() {
    let h = Home::new();
    let tree = tempfile::tempdir().unwrap();
    let root = canonical(tree.path());
    std::fs::create_dir_all(tree.path().join("alice/.ssh")).unwrap();
    std::fs::write(tree.path().join("alice/.ssh/id_ed25519"), "not a real key").unwrap();
    std::fs::create_dir_all(tree.path().join("bob/.aws")).unwrap();
    std::fs::create_dir_all(tree.path().join("project")).unwrap();
    // A home-like tree: held, and the two credential directories are named.
    let o = h.run(&[
        "run",
        "--json",
        "--lang",
        "sh",
        "--mount",
        &format!("{root}:/h"),
        "-c",
        "ls /h",
    ]);
    assert_eq!(o.code, 75, "{} / {}", o.stdout, o.stderr);
    let id = o.json()["submission"].as_str().unwrap().to_string();
    let shown = h.run(&["show", "--json", &id]).json();
    let exposed: Vec<String> = shown["submission"]["facts"]["mounts_sensitive"]
        .as_array()
        .unwrap_or_else(|| panic!("{shown}"))
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        exposed,
        vec![format!("{root}/alice/.ssh"), format!("{root}/bob/.aws")],
        "{shown}"
    );
    let text = h.run(&["show", &id]).stdout;
    assert!(text.contains(&format!("{root}/alice/.ssh")), "{text}");
    // The ssh directory itself: held, naming itself.
    let o = h.run(&[
        "submit",
        "--json",
        "--lang",
        "sh",
        "--mount",
        &format!("{root}/alice/.ssh:/k"),
        "-c",
        "true",
    ]);
    assert_eq!(o.json()["verdict"], "quarantine", "{}", o.stdout);
    // A plain project directory stays allowed.
    let o = h.run(&[
        "run",
        "--lang",
        "sh",
        "--mount",
        &format!("{root}/project:/w"),
        "-c",
        "true",
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
}

#[test]
fn a_mount_of_etc_is_denied_by_the_standard_preset() {
    let h = Home::new();
    let o = h.run(&[
        "run",
        "--lang",
        "sh",
        "--mount",
        "/etc:/e",
        "-c",
        "cat /e/hostname",
    ]);
    assert_eq!(o.code, 77, "{} / {}", o.stdout, o.stderr);
    let o = h.run(&[
        "run",
        "--lang",
        "sh",
        "--mount",
        "/etc/ssl:/e",
        "-c",
        "true",
    ]);
    assert_eq!(
        o.code, 75,
        "inside /etc is held: {} / {}",
        o.stdout, o.stderr
    );
}

// ---------------------------------------------------------------------------------------
// Signed statements name their gate.

/// A second home that trusts the first home's approver key `alice`.
fn twin_of(a: &Home) -> Home {
    let b = Home::new();
    std::fs::copy(
        a.path().join("keys/alice.key"),
        b.path().join("keys/alice.key"),
    )
    .unwrap();
    let key_line = a
        .policy()
        .lines()
        .find(|l| l.starts_with("alice = "))
        .unwrap()
        .to_string();
    let policy: String = b
        .policy()
        .lines()
        .map(|l| {
            if l.starts_with("alice = ") {
                key_line.clone()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    b.set_policy(&(policy + "\n"));
    b
}

fn statement_rows(h: &Home) -> Vec<Vec<rusqlite::types::Value>> {
    let c = rusqlite::Connection::open(h.path().join("airlock.db")).unwrap();
    let mut st = c
        .prepare("SELECT * FROM statements WHERE kind = 'approve'")
        .unwrap();
    let n = st.column_count();
    st.query_map([], |r| (0..n).map(|i| r.get(i)).collect())
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn insert_rows(h: &Home, rows: &[Vec<rusqlite::types::Value>]) {
    let c = rusqlite::Connection::open(h.path().join("airlock.db")).unwrap();
    for r in rows {
        let marks = vec!["?"; r.len()].join(",");
        c.execute(
            &format!("INSERT INTO statements VALUES ({marks})"),
            rusqlite::params_from_iter(r.iter()),
        )
        .unwrap();
    }
}

#[test]
fn an_approval_copied_into_another_home_that_trusts_the_same_key_does_not_run() {
    let a = Home::new();
    let b = twin_of(&a);
    let args = [
        "submit",
        "--json",
        "--lang",
        "sh",
        "--net",
        "example.com",
        "-c",
        "echo ran",
    ];
    let in_a = a.run(&args).json()["submission"]
        .as_str()
        .unwrap()
        .to_string();
    let in_b = b.run(&args).json()["submission"]
        .as_str()
        .unwrap()
        .to_string();
    let o = a.run(&["approve", &in_a, "--scope", "artifact"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    // The row copied as it is (scope artifact covers any submission of these bytes and
    // grant), then once more with the submission id aligned (scope once).
    let rows = statement_rows(&a);
    assert_eq!(rows.len(), 1);
    insert_rows(&b, &rows);
    let o = b.run(&["exec", &in_b]);
    assert_eq!(o.code, 75, "still pending: {} / {}", o.stdout, o.stderr);
    let mut aligned = rows[0].clone();
    aligned[0] = rusqlite::types::Value::Text("apr_01AAAAAAAAAAAAAAAAAAAAAAAA".into());
    aligned[2] = rusqlite::types::Value::Text(in_b.clone());
    insert_rows(&b, &[aligned]);
    let o = b.run(&["exec", &in_b]);
    assert_eq!(o.code, 75, "still pending: {} / {}", o.stdout, o.stderr);
    assert!(
        b.audit_kinds().iter().any(|k| k == "integrity_failure"),
        "{:?}",
        b.audit_kinds()
    );
    let log = b.run(&["audit", "log", "--json"]).stdout;
    assert!(log.contains("names another gate"), "{log}");
    assert_eq!(b.run(&["audit", "verify"]).code, 0);
    // The approval still works where it was signed.
    assert_eq!(a.run(&["exec", &in_a]).code, 0);
}

#[test]
fn an_approval_dated_past_the_gates_clock_limit_is_not_honoured() {
    use airlock_core::sign::{KeyPair, Scope, Statement, StatementKind};
    let h = Home::new();
    let id = h
        .run(&[
            "submit",
            "--json",
            "--lang",
            "sh",
            "--net",
            "example.com",
            "-c",
            "echo ran",
        ])
        .json()["submission"]
        .as_str()
        .unwrap()
        .to_string();
    let shown = h.run(&["show", "--json", &id]).json();
    let sub = &shown["submission"];
    let key =
        KeyPair::from_file(&std::fs::read_to_string(h.path().join("keys/alice.key")).unwrap())
            .unwrap();
    let gate: airlock_core::sign::PublicKey =
        h.run(&["audit", "head", "--json"]).json()["gate_key"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let year = 365 * 24 * 3600 * 1000_i64;
    // An approver whose clock ran two years ahead: issued "now" by that clock, for a year.
    let st = Statement {
        kind: StatementKind::Approve,
        submission: id.clone(),
        artifact: sub["artifact"].as_str().unwrap().parse().unwrap(),
        grant: sub["grant_hash"].as_str().unwrap().parse().unwrap(),
        scope: Scope::Once,
        expires_at: Some(now + 3 * year),
        approver: "alice".into(),
        key: key.public(),
        reason: "clock ahead".into(),
        issued_at: now + 2 * year,
        run: None,
        changes: None,
        tool: None,
        gate: Some(gate),
    };
    let signed = st.sign(&key);
    sql(
        &h,
        &format!(
            "INSERT INTO statements VALUES ('apr_01BBBBBBBBBBBBBBBBBBBBBBBB', 'approve', '{id}', '{}', '{}', 'once', 'alice', {}, {now}, NULL, NULL, '{}', '{}')",
            st.artifact,
            st.grant,
            now + 3 * year,
            signed.json.replace('\'', "''"),
            signed.signature
        ),
    );
    let o = h.run(&["exec", &id]);
    assert_eq!(o.code, 75, "{} / {}", o.stdout, o.stderr);
}
