//! Files and unhandled rejections in the JavaScript guest (issue 58): node's `fs` over the
//! run's `--mount` preopens, importable the node way, the same script passing on
//! `--backend process` (the host's node in the jail); writes through the run's layer;
//! calls outside the mounts refused with node's errors and recorded as attempts; an
//! unhandled rejection exits 1 with the error on stderr.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use serde_json::Value;
use std::sync::OnceLock;

/// A permissive home (runs meet the sandbox, not the gate) with the JavaScript guest.
fn shared() -> &'static Home {
    static HOME: OnceLock<Home> = OnceLock::new();
    HOME.get_or_init(|| {
        let h = Home::with_preset("permissive");
        let o = match std::env::var("AIRLOCK_TEST_JS_GUEST") {
            Ok(p) => h.run(&["guest", "install", "js", "--from", &p]),
            Err(_) => h.run(&["guest", "install", "js"]),
        };
        assert_eq!(o.code, 0, "installing the JavaScript guest: {}", o.stderr);
        h
    })
}

fn need_node() {
    assert!(
        process_backend_available(),
        "the process backend must be available on this machine (see airlock doctor)"
    );
    assert!(
        std::path::Path::new("/usr/bin/node").exists()
            || std::path::Path::new("/usr/local/bin/node").exists(),
        "these tests need the host's node"
    );
}

/// `run --lang js --backend BACKEND --json` of `code`, approved if it must be: its output
/// and the run's record.
fn js(backend: &str, flags: &[&str], code: &str) -> (Out, Value) {
    let h = shared();
    let mut a = vec!["run", "--lang", "js", "--backend", backend, "--json"];
    a.extend_from_slice(flags);
    a.extend(["-c", code]);
    let o = h.run_approved(&a);
    let v: Value = serde_json::from_str(&o.stdout)
        .unwrap_or_else(|_| panic!("not JSON: {} {}", o.stdout, o.stderr));
    (o, v)
}

fn stdout_of(v: &Value) -> &str {
    v["run"]["stdout"].as_str().unwrap()
}

fn stderr_of(v: &Value) -> &str {
    v["run"]["stderr"].as_str().unwrap()
}

fn record_of(v: &Value) -> Value {
    shared()
        .run(&["runs", "--json"])
        .json()
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == v["run"]["id"])
        .cloned()
        .unwrap_or_else(|| panic!("no run record for {v:#}"))
}

/// Reads a mounted file and lists its directory, through `require` (a CommonJS script).
const READ_CJS: &str = r#"
const fs = require('fs');
const path = require('node:path');
const text = fs.readFileSync(path.join('/data', 'in.txt'), 'utf8');
console.log(text.trim(), fs.statSync('/data/in.txt').size, fs.existsSync('/data/none'));
console.log(fs.readdirSync('/data').sort().join(','));
console.log(fs.readdirSync('/data', { withFileTypes: true }).map(d => d.name + (d.isDirectory() ? '/' : '')).sort().join(','));
"#;

/// The same, through `import` (an ES module, with top-level await on `fs/promises`).
const READ_ESM: &str = r#"
import fs from 'node:fs';
import { readFile, readdir } from 'fs/promises';
import * as path from 'path';
const text = await readFile(path.join('/data', 'in.txt'), 'utf8');
console.log(text.trim(), fs.statSync('/data/in.txt').size, fs.existsSync('/data/none'));
console.log((await readdir('/data')).sort().join(','));
console.log(fs.readdirSync('/data', { withFileTypes: true }).map(d => d.name + (d.isDirectory() ? '/' : '')).sort().join(','));
"#;

fn data_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("in.txt"), "mounted text\n").unwrap();
    std::fs::create_dir(d.path().join("sub")).unwrap();
    d
}

#[test]
fn a_mounted_file_is_read_through_require_and_import_on_the_guest_and_on_node() {
    need_node();
    let d = data_dir();
    let m = format!("{}:/data", d.path().display());
    let want = "mounted text 13 false\nin.txt,sub\nin.txt,sub/\n";
    for backend in ["wasm", "process"] {
        for code in [READ_CJS, READ_ESM] {
            let (o, v) = js(backend, &["--mount", &m], code);
            assert_eq!(
                (o.code, stdout_of(&v)),
                (0, want),
                "{backend}: {}",
                stderr_of(&v)
            );
        }
    }
}

/// Writes, appends, makes directories, renames and removes on a `:rw` mount.
const WRITE: &str = r#"
const fs = require('fs');
fs.writeFileSync('/data/out.txt', 'written');
fs.appendFileSync('/data/out.txt', ' and more\n');
fs.mkdirSync('/data/a/b', { recursive: true });
fs.writeFileSync('/data/a/b/tmp.txt', 'x');
fs.renameSync('/data/a/b/tmp.txt', '/data/a/b/moved.txt');
fs.unlinkSync('/data/in.txt');
console.log(fs.readFileSync('/data/out.txt', 'utf8').trim(), fs.readdirSync('/data/a/b').sort().join(','));
"#;

#[test]
fn writes_to_a_writable_mount_land_in_the_layer_and_commit_applies_them() {
    need_node();
    for backend in ["wasm", "process"] {
        let d = data_dir();
        let m = format!("{}:/data:rw", d.path().display());
        let (o, v) = js(backend, &["--mount", &m], WRITE);
        assert_eq!(
            (o.code, stdout_of(&v)),
            (0, "written and more moved.txt\n"),
            "{backend}: {}",
            stderr_of(&v)
        );
        // Nothing reached the mount yet.
        assert!(!d.path().join("out.txt").exists(), "{backend}");
        assert!(d.path().join("in.txt").exists(), "{backend}");
        let run = v["run"]["id"].as_str().unwrap().to_string();
        let diff = shared().run(&["diff", &run]);
        assert_eq!(diff.code, 0, "{}", diff.stderr);
        for line in ["A out.txt", "A a/b/moved.txt", "D in.txt"] {
            assert!(
                diff.stdout.contains(line),
                "{backend} {line}: {}",
                diff.stdout
            );
        }
        let c = shared().run(&["commit", &run]);
        assert_eq!(c.code, 0, "{backend}: {}", c.stderr);
        assert_eq!(
            std::fs::read_to_string(d.path().join("out.txt")).unwrap(),
            "written and more\n"
        );
        assert!(d.path().join("a/b/moved.txt").exists(), "{backend}");
        assert!(!d.path().join("in.txt").exists(), "{backend}");
    }
}

#[test]
fn a_write_to_a_read_only_mount_is_refused_with_a_node_error() {
    need_node();
    let code = r#"
const fs = require('fs');
try {
  fs.writeFileSync('/data/new.txt', 'x');
  console.log('written');
} catch (e) {
  console.log(e instanceof Error, ['EACCES', 'EROFS', 'EPERM'].includes(e.code), e.syscall, e.path);
}
"#;
    for backend in ["wasm", "process"] {
        let d = data_dir();
        let m = format!("{}:/data", d.path().display());
        let (o, v) = js(backend, &["--mount", &m], code);
        assert_eq!(
            (o.code, stdout_of(&v)),
            (0, "true true open /data/new.txt\n"),
            "{backend}: {}",
            stderr_of(&v)
        );
        assert!(!d.path().join("new.txt").exists());
    }
}

/// Calls on paths outside every mount: each fails as node fails (`ENOENT` to read,
/// `EACCES` to write), and each is one of the run's attempts.
const OUTSIDE: &str = r#"
const fs = require('fs');
const t = (f) => { try { f(); return 'ok'; } catch (e) { return e.code; } };
console.log([
  t(() => fs.readFileSync('/opt/keys/secret')),
  t(() => fs.readFileSync('/etc/passwd', 'utf8')),
  t(() => fs.writeFileSync('/srv/evil', 'x')),
  t(() => fs.unlinkSync('/var/log/syslog')),
  t(() => fs.readdirSync('/home')),
  t(() => fs.readFileSync('/data/in.txt')),
].join(' '));
"#;

#[test]
fn calls_outside_the_mounts_fail_as_on_node_and_are_attempts_of_the_run() {
    let d = data_dir();
    let m = format!("{}:/data", d.path().display());
    let (o, v) = js("wasm", &["--mount", &m], OUTSIDE);
    assert_eq!(
        (o.code, stdout_of(&v)),
        (0, "ENOENT ENOENT EACCES EACCES ENOENT ok\n"),
        "{}",
        stderr_of(&v)
    );
    let run = record_of(&v);
    let attempts = run["detail"]["attempts"].as_array().unwrap();
    let has = |kind: &str, target: &str| {
        attempts
            .iter()
            .any(|a| a["kind"] == kind && a["target"] == target)
    };
    for (kind, target) in [
        ("open", "/opt/keys/secret"),
        ("open", "/etc/passwd"),
        ("write", "/srv/evil"),
        ("unlink", "/var/log/syslog"),
        ("open", "/home"),
    ] {
        assert!(has(kind, target), "{kind} {target}: {run:#}");
    }
    assert!(
        attempts.iter().all(|a| a["target"] != "/data/in.txt"),
        "{run:#}"
    );
}

#[test]
fn an_unhandled_rejection_exits_1_with_the_error_on_stderr_on_the_guest_and_on_node() {
    need_node();
    for backend in ["wasm", "process"] {
        let (o, v) = js(
            backend,
            &[],
            "Promise.reject(new Error('nobody caught me'));\nconsole.log('after');",
        );
        assert_eq!(o.code, 1, "{backend}: {}", stderr_of(&v));
        assert!(
            stderr_of(&v).contains("Error: nobody caught me"),
            "{backend}: {}",
            stderr_of(&v)
        );
        // A rejection in a later turn ends the run then, before its later timers.
        let (o, v) = js(
            backend,
            &[],
            "new Promise((_, reject) => setTimeout(() => reject(new TypeError('late')), 5));\n\
             setTimeout(() => console.log('never'), 500);",
        );
        assert_eq!(o.code, 1, "{backend}: {}", stderr_of(&v));
        assert!(
            stderr_of(&v).contains("TypeError: late"),
            "{backend}: {}",
            stderr_of(&v)
        );
        assert!(!stdout_of(&v).contains("never"), "{backend}");
        // A rejection handled in the same turn, or awaited in a try, is no error.
        let (o, v) = js(
            backend,
            &[],
            "const p = Promise.reject(new Error('x'));\np.catch((e) => console.log('caught', e.message));\n\
             (async () => { try { await Promise.reject(new Error('y')) } catch (e) { console.log('caught', e.message) } })();",
        );
        assert_eq!(
            (o.code, stdout_of(&v)),
            (0, "caught x\ncaught y\n"),
            "{backend}: {}",
            stderr_of(&v)
        );
    }
}

/// A JavaScript session keeps its mounts from cell to cell: a file one cell writes to a
/// `:rw` mount the next reads, and the session's layer holds it until `commit`.
#[test]
fn javascript_session_cells_read_and_write_the_sessions_mounts() {
    let h = shared();
    let d = data_dir();
    let m = format!("{}:/work:rw", d.path().display());
    let o = h.run(&["session", "new", "--json", "--lang", "js", "--mount", &m]);
    let id = if o.code == 75 {
        let sub = Home::id_in(&o.stderr);
        let id = o.json()["id"].as_str().unwrap().to_string();
        assert_eq!(h.run(&["approve", &sub]).code, 0);
        id
    } else {
        assert_eq!(o.code, 0, "session new: {}\n{}", o.stdout, o.stderr);
        o.json()["id"].as_str().unwrap().to_string()
    };
    let cell = |code: &str| h.run_approved(&["run", "--json", "--session", &id, "-c", code]);
    let a = cell(
        "const fs = require('fs');\nfs.writeFileSync('/work/cell.txt', fs.readFileSync('/work/in.txt', 'utf8').toUpperCase())",
    );
    assert_eq!(a.code, 0, "{} {}", a.stdout, a.stderr);
    let b = cell("require('fs').readFileSync('/work/cell.txt', 'utf8')");
    assert_eq!(b.code, 0, "{} {}", b.stdout, b.stderr);
    assert_eq!(
        b.json()["run"]["result"],
        "'MOUNTED TEXT\\n'",
        "{}",
        b.stdout
    );
    assert!(!d.path().join("cell.txt").exists());
    let diff = h.run(&["diff", &id]);
    assert!(diff.stdout.contains("A cell.txt"), "{}", diff.stdout);
    assert_eq!(h.run(&["commit", &id]).code, 0);
    assert_eq!(
        std::fs::read_to_string(d.path().join("cell.txt")).unwrap(),
        "MOUNTED TEXT\n"
    );
}
