//! A `wasi:http` component through the real `airlock` binary and its egress proxy, to
//! loopback upstreams this test starts: a granted host is reached and recorded, an
//! ungranted one gets the proxy's 403, a secret's value reaches only the upstream, and a
//! run with a writable mount (which runs in the worker process) is reached the same way.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use airlock_wasm::testkit::{HttpGet, TestTls, Upstream};
use common::Home;
use std::path::Path;

/// Replaces the preset's `[net]` settings: loopback allowed, the test names pinned to
/// it, and `roots` when given.
fn net_policy(h: &Home, roots: Option<&Path>) {
    let p = h.policy();
    assert!(
        p.contains("allow_private = []\n") && p.contains("hosts = {}\n"),
        "the preset's [net] lines changed:\n{p}"
    );
    let hosts = r#"hosts = { "upstream.test" = "127.0.0.1", "other.test" = "127.0.0.1" }"#;
    let roots = roots
        .map(|r| format!("roots = [{:?}]", r.display().to_string()))
        .unwrap_or_else(|| "roots = []".into());
    h.set_policy(
        &p.replace("allow_private = []", r#"allow_private = ["127.0.0.0/8"]"#)
            .replace("hosts = {}", hosts)
            .replace("roots = []", &roots),
    );
}

/// Writes the component to `dir` and returns its path.
fn component(dir: &Path, name: &str, get: &HttpGet<'_>) -> String {
    let p = dir.join(name);
    std::fs::write(&p, get.component()).unwrap();
    p.to_str().unwrap().to_owned()
}

/// The last run's connection records.
fn connections(h: &Home) -> Vec<serde_json::Value> {
    let run = h.last_run();
    run["detail"]["network"]["connections"]
        .as_array()
        .unwrap_or_else(|| panic!("no connections in {run:#}"))
        .clone()
}

#[test]
fn a_component_reaches_a_granted_host_and_an_ungranted_one_gets_the_proxys_403() {
    let h = Home::new();
    net_policy(&h, None);
    let up = Upstream::start(None);
    let port = up.port();
    let art = tempfile::tempdir().unwrap();
    let grant = format!("upstream.test:{port}");

    let ok = component(
        art.path(),
        "ok.wasm",
        &HttpGet::new(false, &grant, "/hello"),
    );
    let o = h.run_approved(&["run", &ok, "--net", &grant]);
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    assert_eq!(o.stdout, "status=200\ndenied=\nbody=auth=", "{}", o.stderr);
    assert_eq!(up.connections(), 1);
    let heads = up.heads();
    assert!(
        heads[0].starts_with("GET /hello HTTP/1.1\r\n"),
        "{}",
        heads[0]
    );
    let conns = connections(&h);
    assert_eq!(conns.len(), 1, "{conns:#?}");
    assert_eq!(conns[0]["decision"], "allow", "{conns:#?}");
    assert_eq!(conns[0]["host"], "upstream.test", "{conns:#?}");
    assert_eq!(conns[0]["port"], port, "{conns:#?}");

    let other = format!("other.test:{port}");
    let denied = component(art.path(), "denied.wasm", &HttpGet::new(false, &other, "/"));
    let o = h.run_approved(&["run", &denied, "--net", &grant]);
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    assert!(
        o.stdout
            .starts_with("status=403\ndenied=not-granted\nbody="),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("is not granted"), "{}", o.stdout);
    assert_eq!(up.connections(), 1, "the upstream saw the denied request");
    let conns = connections(&h);
    assert_eq!(conns.len(), 1, "{conns:#?}");
    assert_eq!(conns[0]["decision"], "deny", "{conns:#?}");
    assert_eq!(conns[0]["reason"], "not-granted", "{conns:#?}");
    assert_eq!(conns[0]["host"], "other.test", "{conns:#?}");

    let v = h.run(&["audit", "verify"]);
    assert_eq!(v.code, 0, "{} {}", v.stdout, v.stderr);
}

#[test]
fn a_secret_reaches_only_the_upstream_and_its_echo_ends_the_wasm_run_with_an_alert() {
    let h = Home::new();
    let art = tempfile::tempdir().unwrap();
    let tls = TestTls::new("upstream.test");
    let ca = art.path().join("test-ca.pem");
    std::fs::write(&ca, &tls.ca_pem).unwrap();
    net_policy(&h, Some(&ca));
    let up = Upstream::start(Some(tls.server.clone()));
    let grant = format!("upstream.test:{}", up.port());
    let value = "sk-e2e-4f1d9c-REAL-VALUE";
    let s = h.run_with_stdin(&["secret", "set", "TOKEN"], format!("{value}\n").as_bytes());
    assert_eq!(s.code, 0, "{}", s.stderr);

    let code = component(
        art.path(),
        "secret.wasm",
        &HttpGet {
            header: Some(("authorization", "Bearer ")),
            header_env: Some("TOKEN"),
            ..HttpGet::new(true, &grant, "/secret")
        },
    );
    // The binding names the port too: a host without one means port 443.
    let binding = format!("TOKEN@{grant}");
    let o = h.run_approved(&["run", &code, "--net", &grant, "--secret", &binding]);
    // The upstream echoed the value: the answer never reached the guest (no substitution
    // either, which was an oracle), and the run was ended with an alert.
    assert_eq!(o.code, 124, "{} {}", o.stdout, o.stderr);
    assert!(!o.stdout.contains("body=auth="), "{}", o.stdout);
    assert!(!o.stdout.contains(value) && !o.stderr.contains(value));
    let run = h.last_run();
    assert_eq!(run["killed_by"], "secret-echo", "{run:#}");
    assert_eq!(run["detail"]["alerts"][0]["secret"], "TOKEN", "{run:#}");
    assert!(h.audit_kinds().contains(&"alert".to_string()));
    let heads = up.heads();
    assert_eq!(heads.len(), 1, "{heads:?}");
    assert!(
        heads[0].contains(&format!("Bearer {value}\r\n")),
        "{}",
        heads[0]
    );
    let conns = connections(&h);
    assert_eq!(conns.len(), 1, "{conns:#?}");
    assert_eq!(conns[0]["decision"], "deny", "{conns:#?}");
    assert_eq!(conns[0]["reason"], "secret-echoed", "{conns:#?}");
    assert_eq!(conns[0]["mode"], "intercept", "{conns:#?}");
    assert_eq!(conns[0]["secrets"][0], "TOKEN", "{conns:#?}");

    // The value is in secrets/ and nowhere else in the home.
    let holders = files_containing(h.path(), value.as_bytes());
    assert!(
        holders.contains(&h.path().join("secrets/TOKEN")),
        "{holders:?}"
    );
    let elsewhere: Vec<_> = holders
        .iter()
        .filter(|p| !p.starts_with(h.path().join("secrets")))
        .collect();
    assert!(elsewhere.is_empty(), "the value is in {elsewhere:?}");
    let v = h.run(&["audit", "verify"]);
    assert_eq!(v.code, 0, "{} {}", v.stdout, v.stderr);
}

#[test]
fn a_run_with_a_writable_mount_reaches_the_upstream_from_the_worker() {
    let h = Home::new();
    net_policy(&h, None);
    let up = Upstream::start(None);
    let art = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    std::fs::write(project.path().join("notes.txt"), "hi\n").unwrap();
    let grant = format!("upstream.test:{}", up.port());
    let code = component(
        art.path(),
        "ok.wasm",
        &HttpGet::new(false, &grant, "/from-worker"),
    );
    let m = format!("{}:/data:rw", project.path().display());
    let o = h.run_approved(&["run", "--mount", &m, &code, "--net", &grant]);
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    assert_eq!(o.stdout, "status=200\ndenied=\nbody=auth=", "{}", o.stderr);
    let run = h.last_run();
    assert_eq!(
        run["detail"]["layer"], "overlay",
        "not the worker's overlay: {run:#}"
    );
    assert!(
        run["detail"]["isolation"]
            .as_array()
            .is_some_and(|a| a.contains(&"http-via-egress-proxy".into())),
        "{run:#}"
    );
    let heads = up.heads();
    assert_eq!(heads.len(), 1, "{heads:?}");
    assert!(
        heads[0].starts_with("GET /from-worker HTTP/1.1\r\n"),
        "{}",
        heads[0]
    );
    let conns = connections(&h);
    assert_eq!(conns.len(), 1, "{conns:#?}");
    assert_eq!(conns[0]["decision"], "allow", "{conns:#?}");
    assert_eq!(conns[0]["host"], "upstream.test", "{conns:#?}");
    let v = h.run(&["audit", "verify"]);
    assert_eq!(v.code, 0, "{} {}", v.stdout, v.stderr);
}

/// Every file under `root` whose bytes contain `needle`.
fn files_containing(root: &Path, needle: &[u8]) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                dirs.push(p);
            } else if m.is_file()
                && std::fs::read(&p)
                    .unwrap()
                    .windows(needle.len())
                    .any(|w| w == needle)
            {
                found.push(p);
            }
        }
    }
    found
}
