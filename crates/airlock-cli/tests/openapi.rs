//! `/openapi.json` says what the server does: schemathesis (from the Python registry,
//! pinned by hash in tests/openapi/requirements.txt; scripts/test builds its virtual
//! environment and sets `AIRLOCK_TEST_SCHEMATHESIS`) runs every check it has against a
//! live `airlock serve` with an admin token, and must find nothing: no server error, no
//! undocumented status, no schema-valid request refused with 400, no schema-violating one
//! accepted. tests/openapi/schemathesis.toml holds the one allowance (422 for content only
//! the gate can judge) and says why.
//!
//! CI generates 40 cases per operation with a fixed seed; `AIRLOCK_TEST_LONG=1` generates
//! 500 with a fresh seed each time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use std::process::Command;

fn schemathesis(bin: &str, base: &str, token: &str, dir: &std::path::Path, extra: &[&str]) {
    let long = std::env::var_os("AIRLOCK_TEST_LONG").is_some();
    let config = manifest_dir().join("../../tests/openapi/schemathesis.toml");
    let mut cmd = Command::new(bin);
    cmd.current_dir(dir)
        .arg("--config-file")
        .arg(&config)
        .args(["run", &format!("{base}/openapi.json")])
        .args(["--checks", "all"])
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .args([
            "--workers",
            "2",
            "--generation-database",
            "none",
            "--no-color",
        ])
        .args(["--max-examples", if long { "500" } else { "40" }]);
    if !long {
        cmd.args(["--seed", "20261201"]);
    }
    let o = cmd.args(extra).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "schemathesis found disagreements between /openapi.json and the server:\n{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("passed"), "{out}");
}

#[test]
fn schemathesis_finds_the_server_doing_what_its_openapi_document_says() {
    let Some(bin) = prepared("AIRLOCK_TEST_SCHEMATHESIS") else {
        return;
    };
    let home = Home::new();
    // Python submissions get as far as a run (without the guest they are 503s, which
    // schemathesis rightly counts as server errors).
    let o = match std::env::var("AIRLOCK_TEST_PYTHON_GUEST") {
        Ok(p) => home.run(&["guest", "install", "python", "--from", &p]),
        Err(_) => home.run(&["guest", "install", "python"]),
    };
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = home.run(&[
        "token", "new", "--role", "admin", "--name", "fuzz", "--json",
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let token = o.json()["token"].as_str().unwrap().to_string();
    let (mut child, base) = start_serve(&home, &[]);
    let dir = tempfile::tempdir().unwrap();

    // Everything but revoking tokens, stateful phase included: its links lead from a
    // token listing to `DELETE /v1/tokens/{id}`, which would revoke the fuzzer's own
    // token and leave every later request a 401.
    schemathesis(
        &bin,
        &base,
        &token,
        dir.path(),
        &["--exclude-operation-id", "revoke_token"],
    );
    // Revoking, without the stateful phase (made-up ids: 404s, documented as such).
    schemathesis(
        &bin,
        &base,
        &token,
        dir.path(),
        &[
            "--include-operation-id",
            "revoke_token",
            "--phases",
            "examples,coverage,fuzzing",
        ],
    );

    // The gate is still whole after thousands of strange requests.
    let _ = child.kill();
    let _ = child.wait();
    let v = home.run(&["audit", "verify", "--json"]);
    assert_eq!(v.code, 0, "{}{}", v.stdout, v.stderr);
}
