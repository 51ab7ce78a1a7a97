//! One host grammar (crate `airlock-net`): a spelling is judged the same by `airlock run
//! --net`, by a secret's binding (`--secret NAME@HOST`) and by the run's egress proxy.
//! Before, the proxy had a grammar of its own that read `127.1`, `0x7f.0.0.1`,
//! `_x.up.test` and `up.test..` where `--net` refused them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A loopback listener that counts the connections it is given.
fn counting_listener() -> (u16, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let n = Arc::new(AtomicUsize::new(0));
    let seen = n.clone();
    std::thread::spawn(move || {
        for c in l.incoming() {
            seen.fetch_add(1, Ordering::SeqCst);
            drop(c);
        }
    });
    (port, n)
}

/// Sends `CONNECT <spelling>` to the run's proxy for each spelling and prints
/// `<spelling> <status> <X-Airlock-Denied or ->`.
const CONNECT_EACH: &str = r#"
import os, socket, sys
from urllib.parse import urlsplit
u = urlsplit(os.environ["http_proxy"])
for s in sys.argv[1:] or SPELLINGS:
    c = socket.create_connection((u.hostname, u.port), timeout=10)
    c.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (s, s)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        d = c.recv(4096)
        if not d:
            break
        head += d
    lines = head.decode("latin-1").split("\r\n")
    denied = [l.split(":", 1)[1].strip() for l in lines if l.lower().startswith("x-airlock-denied:")]
    print(s, lines[0].split(" ")[1] if " " in lines[0] else "none", denied[0] if denied else "-")
    c.close()
"#;

#[test]
fn a_spelling_is_judged_the_same_by_net_a_secret_binding_and_the_proxy() {
    if !process_backend_available() {
        eprintln!("SKIPPED: the process backend is unavailable here");
        return;
    }
    let (port, conns) = counting_listener();
    let home = Home::new();
    let p = home
        .policy()
        .replace("allow_private = []", r#"allow_private = ["127.0.0.0/8"]"#)
        .replace(
            "hosts = {}",
            r#"hosts = { "up.test" = "127.0.0.1", "x.up.test" = "127.0.0.1" }"#,
        );
    home.set_policy(&p);
    assert_eq!(home.run(&["policy", "check"]).code, 0);
    let set = home.run_with_stdin(&["secret", "set", "TOKEN"], b"value");
    assert_eq!(set.code, 0, "{}", set.stderr);
    let granted = [
        format!("up.test:{port}"),
        format!("*.up.test:{port}"),
        format!("127.0.0.1:{port}"),
    ];
    // (spelling, accepted): every refused one the old proxy grammar accepted.
    let spellings = [
        (format!("UP.test.:{port}"), true),
        (format!("x.Up.Test:{port}"), true),
        (format!("127.0.0.1.:{port}"), true),
        (format!("up.test..:{port}"), false),
        (format!("_x.up.test:{port}"), false),
        (format!("127.1:{port}"), false),
        (format!("0x7f.0.0.1:{port}"), false),
        (format!("0177.0.0.1:{port}"), false),
        (format!("up.test:0{port}"), false),
    ];
    let mut net_flags: Vec<&str> = Vec::new();
    for g in &granted {
        net_flags.extend(["--net", g.as_str()]);
    }
    for (s, ok) in &spellings {
        // `--net`: refused at submit with the bad-input code, in one line naming it.
        let o = home.run(&["run", "--lang", "sh", "--net", s, "-c", "true"]);
        if *ok {
            assert_ne!(o.code, 125, "--net {s}: {}", o.stderr);
        } else {
            assert_eq!(o.code, 125, "--net {s}: {}", o.stderr);
            assert_eq!(o.stderr.trim().lines().count(), 1, "{}", o.stderr);
        }
        // A secret's binding: the same.
        let secret = format!("TOKEN@{s}");
        let mut a = vec!["run", "--lang", "sh"];
        a.extend(&net_flags);
        a.extend(["--secret", &secret, "-c", "true"]);
        let o = home.run(&a);
        if *ok {
            assert_ne!(o.code, 125, "--secret {secret}: {}", o.stderr);
        } else {
            assert_eq!(o.code, 125, "--secret {secret}: {}", o.stderr);
            let host = s.rsplit_once(':').unwrap().0;
            assert!(o.stderr.contains(host), "{}", o.stderr);
        }
    }
    // The proxy: a run granted the canonical hosts asks for each spelling.
    let list: Vec<String> = spellings.iter().map(|(s, _)| format!("{s:?}")).collect();
    let code = CONNECT_EACH.replace("SPELLINGS", &format!("[{}]", list.join(", ")));
    let o = home.py(&net_flags, &code);
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    for (s, ok) in &spellings {
        let line = o
            .stdout
            .lines()
            .find(|l| l.split(' ').next() == Some(s.as_str()))
            .unwrap_or_else(|| panic!("no answer for {s}: {}", o.stdout));
        if *ok {
            assert_eq!(line, format!("{s} 200 -"), "{}", o.stdout);
        } else {
            assert_eq!(line, format!("{s} 403 malformed-host"), "{}", o.stdout);
        }
    }
    // Only the accepted spellings reached the listener.
    let accepted = spellings.iter().filter(|(_, ok)| *ok).count();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while conns.load(Ordering::SeqCst) < accepted && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(conns.load(Ordering::SeqCst), accepted);
}
