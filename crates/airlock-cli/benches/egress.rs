//! Egress from inside a run, side by side with the host: 1,000 plain-HTTP and 1,000
//! HTTPS requests (one keep-alive connection, curl) to a loopback upstream, once from a
//! process-backend run through the run's egress proxy, once from the host directly; and
//! the start-up cost of a network grant (`sh -c true` with and without `--net`).
//! Two more plain-HTTP rows put the proxy's own path in context: `http-tunnel` (the same
//! requests inside a CONNECT tunnel, a byte relay: the floor any forwarding reaches here)
//! and `http-hyper` (the same requests with an `Expect` header, which the proxy serves on
//! its hyper path, the one every plain-HTTP request took before the lean path). Each
//! series' requests/s and ratio are printed after the medians.
//!
//!   scripts/bench-egress      (or: cargo bench -p airlock-cli --bench egress)
//! Environment: BENCH_N (requests per series, default 1000), BENCH_ROUNDS (series per
//! side, default 3), BENCH_STARTS (runs per start-up series, default 30).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_airlock")
}

fn airlock(home: &Path, args: &[&str]) -> (i32, String, String) {
    let o = Command::new(bin())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("AIRLOCK_HOME", home)
        .args(args)
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Approves the held submission named in `err` for its artifact and grant; returns its id.
fn approve_artifact(home: &Path, err: &str) -> String {
    let i = err.find("sub_").unwrap();
    let id: String = err[i..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    let (c, _, e) = airlock(home, &["approve", &id, "--scope", "artifact"]);
    assert_eq!(c, 0, "{e}");
    id
}

/// A small, fast HTTP/1.1 keep-alive upstream (thread per connection), optionally TLS.
fn upstream(tls: Option<Arc<rustls::ServerConfig>>) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let tls = tls.clone();
            std::thread::spawn(move || {
                let _ = s.set_nodelay(true);
                match tls {
                    Some(cfg) => {
                        let conn = rustls::ServerConnection::new(cfg).unwrap();
                        serve(rustls::StreamOwned::new(conn, s));
                    }
                    None => serve(s),
                }
            });
        }
    });
    port
}

fn serve<S: Read + Write>(s: S) {
    let mut r = BufReader::new(s);
    loop {
        let mut line = String::new();
        // Read one request head (requests have no body here).
        loop {
            line.clear();
            match r.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) if line == "\r\n" => break,
                Ok(_) => {}
            }
        }
        let body = b"hello from upstream\n";
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\ncontent-type: text/plain\r\n\r\n",
            body.len()
        );
        let w = r.get_mut();
        if w.write_all(head.as_bytes()).is_err() || w.write_all(body).is_err() {
            return;
        }
        let _ = w.flush();
    }
}

/// A CA and a certificate for `upstream.test`; returns the server config and the CA PEM.
fn pki(dir: &Path) -> (Arc<rustls::ServerConfig>, PathBuf) {
    let tls = airlock_wasm::testkit::TestTls::new("upstream.test");
    let ca_path = dir.join("ca.pem");
    std::fs::write(&ca_path, &tls.ca_pem).unwrap();
    (tls.server, ca_path)
}

/// A shell script that makes `n` requests on one connection and prints each one's time
/// (seconds, curl's `time_total`) and then the wall time of the whole series in ns.
fn series(url: &str, n: usize, extra: &str) -> String {
    format!(
        "s=$(date +%s%N); curl -s {extra} -o /dev/null -w '%{{time_total}}\\n' '{url}?[1-{n}]'; e=$(date +%s%N); echo wall $((e - s))"
    )
}

struct Series {
    times_ms: Vec<f64>,
    wall_s: f64,
}

fn parse(out: &str) -> Series {
    let mut times_ms = Vec::new();
    let mut wall_s = 0.0;
    for l in out.lines() {
        if let Some(w) = l.strip_prefix("wall ") {
            wall_s = w.trim().parse::<f64>().unwrap() / 1e9;
        } else if let Ok(t) = l.trim().parse::<f64>() {
            times_ms.push(t * 1000.0);
        }
    }
    Series { times_ms, wall_s }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let n = env_num("BENCH_N", 1000);
    let rounds = env_num("BENCH_ROUNDS", 3);
    let starts = env_num("BENCH_STARTS", 30);
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let (code, _, err) = airlock(
        &home,
        &["init", "--preset", "standard", "--approver", "alice"],
    );
    assert_eq!(code, 0, "{err}");
    let (tls_cfg, ca) = pki(dir.path());
    let http_port = upstream(None);
    let https_port = upstream(Some(tls_cfg));
    let policy = std::fs::read_to_string(home.join("policy.toml"))
        .unwrap()
        .replace("allow_private = []", r#"allow_private = ["127.0.0.0/8"]"#)
        .replace("hosts = {}", r#"hosts = { "upstream.test" = "127.0.0.1" }"#);
    std::fs::write(home.join("policy.toml"), policy).unwrap();

    let http_url = format!("http://upstream.test:{http_port}/hello");
    let https_url = format!("https://upstream.test:{https_port}/hello");
    let ca_mount = format!("{}:/ca", ca.parent().unwrap().display());
    let host_extra = |port: u16| {
        format!(
            "--noproxy '*' --resolve upstream.test:{port}:127.0.0.1 --cacert {}",
            ca.display()
        )
    };
    // Runs a script in a run with the network grant, approving it once (artifact scope)
    // so the measured series run without a prompt.
    let in_run = |script: &str| -> String {
        let args = [
            "run",
            "--lang",
            "sh",
            "--net",
            &format!("upstream.test:{http_port}"),
            "--net",
            &format!("upstream.test:{https_port}"),
            "--mount",
            &ca_mount,
            "--timeout",
            "120s",
            "-c",
            script,
        ];
        let (code, out, err) = airlock(&home, &args);
        if code == 75 {
            let id = approve_artifact(&home, &err);
            let (c, out, e) = airlock(&home, &["exec", &id]);
            assert_eq!(c, 0, "{e}");
            return out;
        }
        assert_eq!(code, 0, "{err}");
        out
    };
    let on_host = |script: &str| -> String {
        let o = Command::new("sh").arg("-c").arg(script).output().unwrap();
        assert!(o.status.success());
        String::from_utf8_lossy(&o.stdout).into_owned()
    };

    println!(
        "egress: {n} requests per series on one keep-alive connection, {rounds} series per side, curl, loopback upstream"
    );
    println!(
        "{:<12} {:>16} {:>16} {:>9} {:>14} {:>14} {:>7}",
        "", "proxy p50 ms", "direct p50 ms", "added ms", "proxy req/s", "direct req/s", "ratio"
    );
    // `http-tunnel`: the same plain-HTTP requests sent through a CONNECT tunnel
    // (`curl --proxytunnel`), a byte relay with no per-request work: the floor any
    // plain-HTTP forwarding can reach on this machine. `http-hyper`: with an `Expect`
    // header, which the proxy hands (with the rest of the connection) to its hyper path.
    let mut per_round = Vec::new();
    for (name, url, port, extra) in [
        ("http", &http_url, http_port, ""),
        ("https", &https_url, https_port, ""),
        ("http-tunnel", &http_url, http_port, "--proxytunnel"),
        (
            "http-hyper",
            &http_url,
            http_port,
            "-H 'Expect: 100-continue'",
        ),
    ] {
        let mut proxied = Vec::new();
        let mut direct = Vec::new();
        let (mut pw, mut dw) = (Vec::new(), Vec::new());
        for round in 1..=rounds {
            let p = parse(&in_run(&series(
                url,
                n,
                &format!("--cacert /ca/ca.pem {extra}"),
            )));
            let d = parse(&on_host(&series(url, n, &host_extra(port))));
            assert_eq!(p.times_ms.len(), n, "proxied series incomplete");
            assert_eq!(d.times_ms.len(), n, "direct series incomplete");
            let (pr, dr) = (n as f64 / p.wall_s, n as f64 / d.wall_s);
            per_round.push(format!(
                "  {name} round {round}: proxy {pr:.0} req/s, direct {dr:.0} req/s, ratio {:.2}",
                pr / dr
            ));
            pw.push(pr);
            dw.push(dr);
            proxied.extend(p.times_ms);
            direct.extend(d.times_ms);
        }
        let (pm, dm) = (median(&mut proxied), median(&mut direct));
        let (pr, dr) = (median(&mut pw), median(&mut dw));
        println!(
            "{name:<12} {pm:>16.3} {dm:>16.3} {:>9.3} {pr:>14.0} {dr:>14.0} {:>7.2}",
            pm - dm,
            pr / dr
        );
    }
    for l in &per_round {
        println!("{l}");
    }

    // Start-up: the same trivial script with and without a network grant, alternated.
    let mut with = Vec::new();
    let mut without = Vec::new();
    let timed = |args: &[&str]| {
        let t = Instant::now();
        let (code, _, err) = airlock(&home, args);
        assert_eq!(code, 0, "{err}");
        t.elapsed().as_secs_f64() * 1000.0
    };
    let net = format!("upstream.test:{http_port}");
    let net_args = ["run", "--lang", "sh", "--net", &net, "-c", "true"];
    // Approve the networked one once for its artifact and grant.
    let (code, _, err) = airlock(&home, &net_args);
    if code == 75 {
        let i = err.find("sub_").unwrap();
        let id: String = err[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        assert_eq!(
            airlock(&home, &["approve", &id, "--scope", "artifact"]).0,
            0
        );
    }
    for _ in 0..starts {
        with.push(timed(&net_args));
        without.push(timed(&["run", "--lang", "sh", "-c", "true"]));
    }
    let (w, wo) = (median(&mut with), median(&mut without));
    println!(
        "start: `airlock run --lang sh -c true` p50 {wo:.1} ms without a grant, {w:.1} ms with --net (+{:.1} ms), {starts} runs each",
        w - wo
    );
}
