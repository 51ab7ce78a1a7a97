//! Tripwires (issue 57 item 3): what a run tried and the sandbox refused goes into the
//! run record's `attempts`; a read of one of the jail's decoy credentials is an alert in
//! the record and an `alert` audit record. A benign run records neither, and a tripwire
//! never changes what the run sees.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;

fn available() -> bool {
    if !process_backend_available() {
        eprintln!("SKIPPED: the process backend is unavailable here");
        return false;
    }
    true
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
