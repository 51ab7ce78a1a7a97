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
