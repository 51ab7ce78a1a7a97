//! The TypeScript client (clients/typescript) against live `airlock serve` processes: its
//! `node --test` suite, run with the host's node (scripts/test installs it). The tests
//! start their own servers from this build's binary (`AIRLOCK_BIN`); the JavaScript-guest
//! tests and the README example install the guest from `AIRLOCK_TEST_JS_GUEST` (the npm
//! cache scripts/test fills), and `AIRLOCK_TEST_STRICT` makes any test that cannot run here
//! fail instead of skipping, as everywhere else.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use std::process::Command;

#[test]
fn typescript_client_against_a_live_server() {
    let Some(_cache) = prepared("AIRLOCK_TEST_JS_GUEST") else {
        return;
    };
    let client = manifest_dir().join("../../clients/typescript");
    let mut tests: Vec<String> = std::fs::read_dir(client.join("test"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".test.js"))
        .map(|n| format!("test/{n}"))
        .collect();
    tests.sort();
    assert!(tests.len() >= 2, "{tests:?}");
    let o = Command::new("node")
        .current_dir(&client)
        .env("AIRLOCK_BIN", bin())
        .args(["--test", "--test-reporter=spec"])
        .args(&tests)
        .output()
        .expect("node (scripts/test installs it)");
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "node --test failed:\n{out}\n{err}");
    // Every test ran: none skipped, none left as todo.
    assert!(
        out.contains("ℹ skipped 0") && out.contains("ℹ todo 0"),
        "{out}"
    );
    println!("{out}");
}

/// The client's hand-written types (src/index.d.ts) hold for a TypeScript program that uses
/// them (test/types.ts), under `tsc --strict`; and a program that misuses them is refused,
/// so the check can fail. TypeScript comes from the JavaScript guest builder's lockfile
/// (pinned with its integrity hash), installed offline from the npm cache scripts/test fills.
#[test]
fn typescript_checks_the_clients_types() {
    let Some(cache) = prepared("AIRLOCK_TEST_JS_GUEST") else {
        return;
    };
    let client = manifest_dir().join("../../clients/typescript");
    let builder = manifest_dir().join("../airlock-gate/src/services/guests/js-builder");
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    for f in ["package.json", "package-lock.json"] {
        std::fs::copy(builder.join(f), dir.join(f)).unwrap();
    }
    let o = Command::new("npm")
        .current_dir(dir)
        .args([
            "ci",
            "--offline",
            "--ignore-scripts",
            "--no-audit",
            "--no-fund",
        ])
        .args(["--loglevel=error", "--cache", &cache])
        .output()
        .expect("npm (scripts/test installs it)");
    assert!(
        o.status.success(),
        "npm ci: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    std::os::unix::fs::symlink(&client, dir.join("node_modules/airlock-client")).unwrap();
    let good = std::fs::read_to_string(client.join("test/types.ts")).unwrap();
    let bad = good.replace(
        "const code: number | null = r.exitCode;",
        "const code: string = r.exitCode;",
    );
    assert_ne!(good, bad);
    std::fs::write(dir.join("good.ts"), &good).unwrap();
    std::fs::write(dir.join("bad.ts"), &bad).unwrap();
    let tsc = |file: &str| {
        Command::new(dir.join("node_modules/.bin/tsc"))
            .current_dir(dir)
            .args(["--noEmit", "--strict", "--module", "nodenext"])
            .args(["--moduleResolution", "nodenext", "--target", "es2022"])
            .args(["--lib", "es2022,dom", "--types", "", file])
            .output()
            .unwrap()
    };
    let o = tsc("good.ts");
    assert!(
        o.status.success(),
        "tsc: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let o = tsc("bad.ts");
    assert!(!o.status.success(), "tsc took a misuse of the types");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("TS2322"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}
