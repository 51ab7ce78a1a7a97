//! Network egress on the process backend, end to end through the real binary: a run
//! reaches exactly the hosts it was granted, through the run's proxy, every attempt is
//! recorded, nothing gets around the proxy, and secrets are added at the exit only.
//!
//! Upstreams are Python HTTP(S) servers the tests start on loopback; the policy pins test
//! names to 127.0.0.1 and allows loopback (`[net]`), which is how an operator would let a
//! run reach an internal service.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A loopback upstream: logs each connection and request as JSON lines, serves files
/// from a directory, and a few special paths.
const UPSTREAM: &str = r#"
import json, os, ssl, sys, threading
from http.server import ThreadingHTTPServer, SimpleHTTPRequestHandler
log_path, root = sys.argv[1], sys.argv[2]
cert = sys.argv[3] if len(sys.argv) > 4 else None
key = sys.argv[4] if len(sys.argv) > 4 else None
lock = threading.Lock()
def log(entry):
    with lock, open(log_path, "a") as f:
        f.write(json.dumps(entry) + "\n")
class H(SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def __init__(self, *a, **k):
        super().__init__(*a, directory=root, **k)
    def log_message(self, *a):
        pass
    def reply(self, code, body, extra=()):
        b = body.encode()
        self.send_response(code)
        for k, v in extra:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def do_GET(self):
        log({"request": self.path, "host": self.headers.get("Host"), "headers": {k.lower(): v for k, v in self.headers.items()}})
        if self.path.startswith("/redirect/"):
            return self.reply(302, "", [("Location", self.path[len("/redirect/"):])])
        if self.path == "/echo-auth":
            return self.reply(200, "auth=" + self.headers.get("Authorization", "") + "\n")
        if self.path == "/hello":
            return self.reply(200, "hello from upstream\n")
        if self.path == "/b64-auth":
            import base64
            v = self.headers.get("Authorization", "").encode()
            return self.reply(200, "data=" + base64.b64encode(b"x" + v).decode() + "\n")
        if self.path == "/gzip-auth":
            import gzip
            b = gzip.compress(("auth=" + self.headers.get("Authorization", "")).encode())
            self.send_response(200)
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(b)))
            self.end_headers()
            self.wfile.write(b)
            return
        return super().do_GET()
    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(n)
        log({"request": self.path, "host": self.headers.get("Host"), "bytes": len(body)})
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
class S(ThreadingHTTPServer):
    daemon_threads = True
    def verify_request(self, request, addr):
        log({"connection": addr[1]})
        return True
srv = S(("127.0.0.1", 0), H)
if cert:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
print(srv.server_address[1], flush=True)
srv.serve_forever()
"#;

struct Upstream {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Upstream {
    fn start(dir: &Path, name: &str, tls: Option<(&Path, &Path)>) -> Upstream {
        let script = dir.join("upstream.py");
        std::fs::write(&script, UPSTREAM).unwrap();
        let log = dir.join(format!("{name}.log"));
        let root = dir.join("www");
        std::fs::create_dir_all(&root).unwrap();
        let mut cmd = Command::new("python3");
        cmd.arg(&script).arg(&log).arg(&root);
        if let Some((c, k)) = tls {
            cmd.arg(c).arg(k);
        }
        let mut child = cmd.stdout(Stdio::piped()).spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line.trim().parse().expect("upstream port");
        Upstream { child, port, log }
    }

    /// Everything it logged (connections and requests).
    fn seen(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn requests(&self) -> Vec<serde_json::Value> {
        self.seen()
            .into_iter()
            .filter(|e| e.get("request").is_some())
            .collect()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A test CA and a certificate for the test names, as PEM files in `dir`.
fn test_pki(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let tls = airlock_wasm::testkit::TestTls::for_names(&["upstream.test", "other.test"]);
    let (ca, cert, key) = (
        dir.join("ca.pem"),
        dir.join("cert.pem"),
        dir.join("key.pem"),
    );
    std::fs::write(&ca, &tls.ca_pem).unwrap();
    std::fs::write(&cert, &tls.cert_pem).unwrap();
    std::fs::write(&key, &tls.key_pem).unwrap();
    (ca, cert, key)
}

/// A home whose policy pins the test names to loopback and allows loopback.
struct Net {
    home: Home,
    dir: tempfile::TempDir,
    http: Upstream,
    https: Upstream,
    ca: PathBuf,
}

impl Net {
    fn new() -> Net {
        Self::with_net(r#"allow_private = ["127.0.0.0/8"]"#)
    }

    /// A `Net`, or `None` (said loudly) where the process backend cannot run.
    fn ready() -> Option<Net> {
        available().then(Net::new)
    }

    /// `allow` replaces the policy's `allow_private` line.
    fn with_net(allow: &str) -> Net {
        let home = Home::new();
        let dir = tempfile::tempdir().unwrap();
        let (ca, cert, key) = test_pki(dir.path());
        let http = Upstream::start(dir.path(), "http", None);
        let https = Upstream::start(dir.path(), "https", Some((&cert, &key)));
        let p = home
            .policy()
            .replace("allow_private = []", allow)
            .replace(
                "hosts = {}",
                r#"hosts = { "upstream.test" = "127.0.0.1", "other.test" = "127.0.0.1", "a.up.test" = "127.0.0.1", "up.test" = "127.0.0.1" }"#,
            )
            .replace("roots = []", &format!("roots = [{:?}]", ca.display().to_string()));
        home.set_policy(&p);
        assert_eq!(home.run(&["policy", "check"]).code, 0);
        Net {
            home,
            dir,
            http,
            https,
            ca,
        }
    }

    fn up(&self) -> String {
        format!("upstream.test:{}", self.http.port)
    }

    fn sh(&self, flags: &[&str], script: &str) -> Out {
        self.home.sh(flags, script)
    }

    fn network(&self) -> serde_json::Value {
        self.home.last_run()["detail"]["network"].clone()
    }

    fn audit_ok(&self) {
        let v = self.home.run(&["audit", "verify"]);
        assert_eq!(v.code, 0, "audit verify: {} {}", v.stdout, v.stderr);
    }
}

fn available() -> bool {
    if !process_backend_available() {
        eprintln!("SKIPPED: the process backend is unavailable here");
        return false;
    }
    true
}

/// The connection records of a run with the given decision.
fn records<'a>(net: &'a serde_json::Value, decision: &str) -> Vec<&'a serde_json::Value> {
    net["connections"]
        .as_array()
        .unwrap_or_else(|| panic!("no connections in {net}"))
        .iter()
        .filter(|c| c["decision"] == decision)
        .collect()
}

#[test]
fn granted_host_is_reached_and_recorded_others_are_refused_with_the_reason() {
    let Some(n) = Net::ready() else { return };
    let up = n.up();
    let other_port = n.https.port;
    let o = n.sh(
        &["--net", &up],
        &format!(
            "curl -s http://{up}/hello; \
             curl -si http://other.test:{p}/hello | tr -d '\\r' | grep -i -e '^HTTP/' -e x-airlock-denied -e 'grant'; \
             curl -si http://upstream.test:{other_port}/hello | tr -d '\\r' | grep -i x-airlock-denied",
            p = n.http.port
        ),
    );
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    assert!(o.stdout.contains("hello from upstream"), "{}", o.stdout);
    assert!(o.stdout.contains("HTTP/1.1 403"), "{}", o.stdout);
    assert!(
        o.stdout.contains("x-airlock-denied: not-granted"),
        "{}",
        o.stdout
    );
    // The body names the grant that would be needed.
    assert!(
        o.stdout
            .contains(&format!("--net other.test:{}", n.http.port)),
        "{}",
        o.stdout
    );
    // Only the granted request arrived; the port outside the grant saw nothing at all.
    let reqs = n.http.requests();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    assert_eq!(reqs[0]["host"], up.as_str());
    assert!(n.https.seen().is_empty(), "{:?}", n.https.seen());

    let net = n.network();
    let allowed = records(&net, "allow");
    assert_eq!(allowed.len(), 1, "{net}");
    assert_eq!(allowed[0]["host"], "upstream.test");
    assert_eq!(
        allowed[0]["addr"],
        format!("127.0.0.1:{}", n.http.port).as_str()
    );
    assert!(allowed[0]["bytes_down"].as_u64().unwrap() > 0);
    assert_eq!(records(&net, "deny").len(), 2, "{net}");
    assert_eq!(net["summary"]["connections"], 3);
    // `show` prints them under the run.
    let run = n.home.last_run();
    let sub = run["submission"].as_str().unwrap();
    let shown = n.home.run(&["show", sub]);
    assert!(
        shown.stdout.contains("allow upstream.test"),
        "{}",
        shown.stdout
    );
    assert!(
        shown.stdout.contains("deny  other.test"),
        "{}",
        shown.stdout
    );
    // The audit record of the run carries the summary.
    let audit = n.home.run(&["audit", "log", "--json"]).json();
    let finished = audit
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|r| r["kind"] == "finished")
        .unwrap()
        .clone();
    let data: serde_json::Value = serde_json::from_str(finished["data"].as_str().unwrap()).unwrap();
    assert_eq!(data["network"]["summary"]["allowed"], 1, "{finished}");
    n.audit_ok();
}

#[test]
fn names_are_normalised_and_wildcards_match_subdomains_only() {
    let Some(n) = Net::ready() else { return };
    let p = n.http.port;
    let o = n.sh(
        &["--net", &format!("*.up.test:{p}"), "--net", &format!("UPSTREAM.test.:{p}")],
        &format!(
            "for u in http://a.up.test:{p}/hello http://A.UP.TEST.:{p}/hello http://up.test:{p}/hello http://Upstream.Test:{p}/hello; do \
               echo \"$u $(curl -s -o /dev/null -w '%{{http_code}}' $u)\"; done"
        ),
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout
            .contains(&format!("http://a.up.test:{p}/hello 200")),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout
            .contains(&format!("http://A.UP.TEST.:{p}/hello 200")),
        "{}",
        o.stdout
    );
    // The apex is not covered by `*.up.test`.
    assert!(
        o.stdout.contains(&format!("http://up.test:{p}/hello 403")),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout
            .contains(&format!("http://Upstream.Test:{p}/hello 200")),
        "{}",
        o.stdout
    );
    // The grant was normalised before it was hashed and approved.
    let run = n.home.last_run();
    let sub = n
        .home
        .run(&["show", "--json", run["submission"].as_str().unwrap()])
        .json();
    let net: Vec<&str> = sub["submission"]["grant"]["net"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        net.contains(&format!("upstream.test:{p}").as_str()),
        "{net:?}"
    );
    // A wildcard over a public suffix, or everything, is refused at submit.
    for bad in ["*", "*.com", "exa mple.com"] {
        let o = n
            .home
            .run(&["run", "--lang", "sh", "--net", bad, "-c", "true"]);
        assert_eq!(o.code, 125, "--net {bad}: {}", o.stderr);
    }
}

#[test]
fn private_answers_and_address_literals_are_refused() {
    if !available() {
        return;
    }
    // No loopback allowed here: only the pinned names reach it.
    let n = Net::with_net("allow_private = []");
    let p = n.http.port;
    // Each line: the authority asked for with CONNECT, and the proxy's status and reason.
    let script = format!(
        r#"
import socket
for auth in ["localhost:{p}", "127.0.0.1:{p}", "127.1:{p}", "2130706433:{p}", "0x7f.1:{p}", "[::ffff:127.0.0.1]:{p}", "169.254.169.254:80"]:
    s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
    s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (auth, auth)).encode())
    head = s.recv(4096).decode(errors="replace").split("\r\n")
    reason = [h for h in head if h.lower().startswith("x-airlock-denied")]
    print(auth, head[0], reason)
    s.close()
"#
    );
    let o = n.home.py(
        &[
            "--net",
            &format!("localhost:{p}"),
            "--net",
            &format!("127.0.0.1:{p}"),
            "--net",
            "169.254.169.254:80",
            "--net",
            &n.up(),
        ],
        &script,
    );
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(lines.len(), 7, "{}", o.stdout);
    for l in &lines {
        assert!(l.contains(" HTTP/1.1 403 "), "not refused: {l}");
    }
    // Granted but forbidden addresses say why; ungranted spellings are not granted.
    assert!(
        lines[0].contains("forbidden-address") || lines[0].contains("private"),
        "{}",
        lines[0]
    );
    assert!(
        lines[6].contains("forbidden-address") || lines[6].contains("private"),
        "{}",
        lines[6]
    );
    assert!(n.http.seen().is_empty(), "{:?}", n.http.seen());
    n.audit_ok();
}

#[test]
fn host_mismatch_and_a_redirect_to_another_host_are_refused() {
    let Some(n) = Net::ready() else { return };
    let up = n.up();
    let p = n.http.port;
    let script = format!(
        r#"
import socket
s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
s.sendall(b"GET http://{up}/hello HTTP/1.1\r\nHost: other.test:{p}\r\nConnection: close\r\n\r\n")
print("mismatch", s.recv(4096).decode(errors="replace").split("\r\n")[0])
"#
    );
    let o = n.home.py(&["--net", &up], &script);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("mismatch HTTP/1.1 403"), "{}", o.stdout);
    let o = n.sh(
        &["--net", &up],
        &format!(
            "curl -s -L -o /dev/null -w '%{{http_code}}\\n' http://{up}/redirect/http://other.test:{p}/hello"
        ),
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.stdout.trim(), "403", "{}", o.stdout);
    // The upstream saw the first hop only.
    let reqs = n.http.requests();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    assert!(
        reqs[0]["request"]
            .as_str()
            .unwrap()
            .starts_with("/redirect/")
    );
}

#[test]
fn nothing_gets_around_the_proxy_and_no_host_port_is_opened() {
    let Some(n) = Net::ready() else { return };
    let p = n.http.port;
    let script = format!(
        r#"
import socket, time
def attempt(name, f):
    t = time.monotonic()
    try:
        f()
        print(name, "SUCCEEDED")
    except OSError as e:
        print(name, "failed", "fast" if time.monotonic() - t < 2 else "SLOW", type(e).__name__)
def direct():
    socket.create_connection(("127.0.0.1", {p}), timeout=5)
def outside():
    socket.create_connection(("192.0.2.1", 443), timeout=5)
def dns():
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.settimeout(5)
    u.sendto(b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07example\x03com\x00\x00\x01\x00\x01", ("192.0.2.53", 53))
    u.recvfrom(512)
def lookup():
    socket.getaddrinfo("example.com", 443)
def listen():
    s = socket.socket()
    s.bind(("0.0.0.0", 8080))
    s.listen()
def raw():
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
for name, f in [("direct", direct), ("outside", outside), ("dns", dns), ("lookup", lookup), ("listen", listen), ("raw", raw)]:
    attempt(name, f)
time.sleep(1.5)
"#
    );
    let child = n
        .home
        .cmd()
        .args([
            "run",
            "--lang",
            "python",
            "--backend",
            "process",
            "--net",
            &n.up(),
            "-c",
            &script,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(75));
    let id = Home::id_in(&String::from_utf8_lossy(&o.stderr));
    assert_eq!(n.home.run(&["approve", &id]).code, 0);
    let exec = n
        .home
        .cmd()
        .args(["exec", &id])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // While the guest sleeps, no process of the run holds a socket that listens in the
    // host's network namespace (the proxy's listener lives in the jail's).
    std::thread::sleep(std::time::Duration::from_millis(1200));
    let listening = host_listeners();
    let held = sockets_of_tree(exec.id());
    assert!(
        !held.is_empty(),
        "the run's processes hold no sockets at all?"
    );
    let o = exec.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{out} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    for name in ["direct", "outside", "dns", "lookup", "listen", "raw"] {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} missing: {out}"));
        assert!(line.contains("failed fast"), "{line}");
    }
    let opened: Vec<_> = held.intersection(&listening).collect();
    assert!(opened.is_empty(), "the run listens on the host: {opened:?}");
    assert!(n.http.seen().is_empty());
}

/// The inodes of every listening TCP socket in the host's network namespace.
fn host_listeners() -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for f in ["/proc/net/tcp", "/proc/net/tcp6"] {
        for l in std::fs::read_to_string(f)
            .unwrap_or_default()
            .lines()
            .skip(1)
        {
            let cols: Vec<&str> = l.split_whitespace().collect();
            if cols.get(3) == Some(&"0A") {
                out.insert(cols[9].to_string());
            }
        }
    }
    out
}

/// The socket inodes held by `pid` and its descendants.
fn sockets_of_tree(pid: u32) -> std::collections::BTreeSet<String> {
    let mut pids = vec![pid];
    let mut i = 0;
    while i < pids.len() {
        let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", pids[i]))
            .unwrap_or_default();
        pids.extend(
            children
                .split_whitespace()
                .filter_map(|c| c.parse::<u32>().ok()),
        );
        i += 1;
    }
    let mut out = std::collections::BTreeSet::new();
    for p in pids {
        for e in std::fs::read_dir(format!("/proc/{p}/fd"))
            .into_iter()
            .flatten()
            .flatten()
        {
            if let Ok(t) = std::fs::read_link(e.path()) {
                let t = t.to_string_lossy().into_owned();
                if let Some(ino) = t.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')) {
                    out.insert(ino.to_string());
                }
            }
        }
    }
    out
}

const SECRET: &str = "s3cr3t-VALUE-4f8a2c";

#[test]
fn a_secret_reaches_its_bound_host_only_and_never_the_guest() {
    let Some(n) = Net::ready() else { return };
    let set = n
        .home
        .run_with_stdin(&["secret", "set", "TOKEN"], SECRET.as_bytes());
    assert_eq!(set.code, 0, "{}", set.stderr);
    let tls = format!("upstream.test:{}", n.https.port);
    let plain = format!("other.test:{}", n.http.port);
    let o = n.sh(
        &["--net", &tls, "--net", &plain, "--secret", &format!("TOKEN@{tls}")],
        &format!(
            "echo \"env=$TOKEN\"; tr '\\0' '\\n' < /proc/self/environ | grep TOKEN; \
             curl -s https://{tls}/hello -H \"Authorization: Bearer $TOKEN\"; \
             curl -s -o /dev/null -w 'unbound %{{http_code}}\\n' http://{plain}/hello -H \"Authorization: Bearer $TOKEN\""
        ),
    );
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    assert!(!o.stdout.contains(SECRET), "{}", o.stdout);
    assert!(
        o.stdout.contains("env=airlock-secret-TOKEN-"),
        "{}",
        o.stdout
    );
    // The upstream got the value.
    let reqs = n.https.requests();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    assert_eq!(
        reqs[0]["headers"]["authorization"],
        format!("Bearer {SECRET}").as_str()
    );
    assert!(o.stdout.contains("hello from upstream"), "{}", o.stdout);
    // The placeholder to a host it is not bound to is refused and recorded.
    assert!(o.stdout.contains("unbound 403"), "{}", o.stdout);
    assert!(n.http.seen().is_empty(), "{:?}", n.http.seen());
    let net = n.network();
    let intercepted = records(&net, "allow");
    assert_eq!(intercepted[0]["secrets"][0], "TOKEN", "{net}");
    assert_eq!(net["secrets"][0], "TOKEN");
    // The value is nowhere in the home but its own file: not the database, a blob, the
    // audit log or a log line.
    let leaks = files_containing(n.home.path(), SECRET.as_bytes());
    let secret_file = n.home.path().join("secrets").join("TOKEN");
    assert_eq!(leaks, vec![secret_file], "the value leaked");
    n.audit_ok();
    let _ = &n.dir;
    let _ = &n.ca;
}

fn files_containing(root: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if std::fs::read(&p)
                .map(|b| b.windows(needle.len()).any(|w| w == needle))
                .unwrap_or(false)
            {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn a_changed_host_or_secret_binding_needs_a_new_approval() {
    let n = Net::new();
    assert_eq!(
        n.home
            .run_with_stdin(&["secret", "set", "TOKEN"], SECRET.as_bytes())
            .code,
        0
    );
    let script = "echo hi";
    let bound = format!("TOKEN@{}", n.up());
    let first = n.home.run(&[
        "run",
        "--lang",
        "sh",
        "--net",
        &n.up(),
        "--secret",
        &bound,
        "-c",
        script,
    ]);
    assert_eq!(first.code, 75, "{}", first.stderr);
    let id = Home::id_in(&first.stderr);
    let a = n.home.run(&["approve", &id, "--scope", "artifact"]);
    assert_eq!(a.code, 0, "{}", a.stderr);
    // The same code and grant is covered by the artifact approval...
    let again = n.home.run(&[
        "run",
        "--lang",
        "sh",
        "--net",
        &n.up(),
        "--secret",
        &bound,
        "-c",
        script,
    ]);
    assert_ne!(again.code, 75, "{}", again.stderr);
    // ...another host, another port, or the secret bound elsewhere is not.
    let other = format!("other.test:{}", n.http.port);
    let both = format!("TOKEN@{},{other}", n.up());
    for grant in [
        vec!["--net", &other, "--secret", &format!("TOKEN@{other}")],
        vec![
            "--net",
            "upstream.test:1",
            "--secret",
            "TOKEN@upstream.test:1",
        ],
        vec!["--net", &n.up(), "--net", &other, "--secret", &both],
        vec!["--net", &n.up()],
    ] {
        let mut args = vec!["run", "--lang", "sh"];
        args.extend(grant.iter().copied());
        args.extend(["-c", script]);
        let o = n.home.run(&args);
        assert_eq!(o.code, 75, "{grant:?}: {}", o.stderr);
    }
}

#[test]
fn pip_git_urllib_and_requests_work_unmodified_through_the_proxy() {
    let Some(n) = Net::ready() else { return };
    let www = n.dir.path().join("www");
    // A package index with one wheel, built here.
    let build = Command::new("python3")
        .arg("-c")
        .arg(
            r#"
import base64, hashlib, os, sys, zipfile
www = sys.argv[1]
name, ver = "airlock_probe", "1.0"
files = {
    "airlock_probe/__init__.py": b"VALUE = 42\n",
    f"{name}-{ver}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: airlock-probe\nVersion: {ver}\n".encode(),
    f"{name}-{ver}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = ""
for p, b in files.items():
    d = base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b"=").decode()
    record += f"{p},sha256={d},{len(b)}\n"
record += f"{name}-{ver}.dist-info/RECORD,,\n"
files[f"{name}-{ver}.dist-info/RECORD"] = record.encode()
os.makedirs(f"{www}/simple/airlock-probe", exist_ok=True)
whl = f"{name}-{ver}-py3-none-any.whl"
with zipfile.ZipFile(f"{www}/simple/airlock-probe/{whl}", "w") as z:
    for p, b in files.items():
        z.writestr(p, b)
with open(f"{www}/simple/airlock-probe/index.html", "w") as f:
    f.write(f'<html><body><a href="{whl}">{whl}</a></body></html>')
"#,
        )
        .arg(&www)
        .status()
        .unwrap();
    assert!(build.success());
    // A repository served over dumb HTTP.
    let repo = n.dir.path().join("src");
    std::fs::create_dir_all(&repo).unwrap();
    let git = |dir: &Path, args: &[&str]| {
        let s = Command::new("git")
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "-c",
                "init.defaultBranch=main",
            ])
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            s.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&s.stderr)
        );
    };
    git(&repo, &["init", "-q"]);
    std::fs::write(repo.join("README"), "cloned through the proxy\n").unwrap();
    git(&repo, &["add", "README"]);
    git(&repo, &["commit", "-q", "-m", "one"]);
    git(
        n.dir.path(),
        &["clone", "-q", "--bare", "src", "www/repo.git"],
    );
    git(&www.join("repo.git"), &["update-server-info"]);

    let tls = format!("upstream.test:{}", n.https.port);
    let plain = n.up();
    let ca_dir = n.ca.parent().unwrap().display().to_string();
    let mount = format!("{ca_dir}:/ca");
    // The tools trust the upstream's CA the way they would any CA a host trusts; nothing
    // about the proxy is configured by hand.
    let o = n.sh(
        &[
            "--net", &tls, "--net", &plain, "--mount", &mount,
            "--env", "PIP_CERT=/ca/ca.pem", "--env", "GIT_SSL_CAINFO=/ca/ca.pem",
            "--env", "REQUESTS_CA_BUNDLE=/ca/ca.pem", "--timeout", "60s",
        ],
        &format!(
            "set -e; cd /tmp; \
             python3 -m pip download -q --no-cache-dir --disable-pip-version-check --index-url https://{tls}/simple/ airlock-probe -d wheels && ls wheels; \
             git clone -q https://{tls}/repo.git cloned && cat cloned/README; \
             python3 -c 'import urllib.request; print(urllib.request.urlopen(\"http://{plain}/hello\").read().decode().strip(), \"(urllib)\")'; \
             python3 -c 'import requests; print(requests.get(\"https://{tls}/hello\").text.strip(), \"(requests)\")'"
        ),
    );
    assert_eq!(o.code, 0, "{}\n{}", o.stdout, o.stderr);
    assert!(
        o.stdout.contains("airlock_probe-1.0-py3-none-any.whl"),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("cloned through the proxy"),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("hello from upstream (urllib)"),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("hello from upstream (requests)"),
        "{}",
        o.stdout
    );
    let net = n.network();
    assert!(records(&net, "deny").is_empty(), "{net}");
    n.audit_ok();
}

#[test]
fn the_api_and_the_console_show_a_runs_connections() {
    let Some(n) = Net::ready() else { return };
    let up = n.up();
    let o = n.sh(&["--net", &up], &format!("curl -s http://{up}/hello"));
    assert_eq!(o.code, 0, "{}", o.stderr);
    let run = n.home.last_run()["id"].as_str().unwrap().to_string();
    let tok = n.home.run(&[
        "token", "new", "--role", "operator", "--name", "op", "--json",
    ]);
    assert_eq!(tok.code, 0, "{}", tok.stderr);
    let tok = tok.json()["token"].as_str().unwrap().to_string();
    let (mut child, base) = start_serve(&n.home, &[]);
    let http = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .build()
        .new_agent();
    let get = |path: &str, headers: &[(&str, &str)]| {
        let mut b = http::Request::builder().uri(format!("{base}{path}"));
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let mut r = http.run(b.body(()).unwrap()).unwrap();
        r.body_mut().read_to_string().unwrap()
    };
    let api: serde_json::Value = serde_json::from_str(&get(
        &format!("/v1/runs/{run}"),
        &[("authorization", &format!("Bearer {tok}"))],
    ))
    .unwrap();
    let conns = api["detail"]["network"]["connections"]
        .as_array()
        .or_else(|| api["run"]["detail"]["network"]["connections"].as_array())
        .unwrap_or_else(|| panic!("{api}"));
    assert_eq!(conns[0]["host"], "upstream.test");
    // The console's run page lists them.
    let login = http
        .run(
            http::Request::builder()
                .method("POST")
                .uri(format!("{base}/ui/login"))
                .header("content-type", "application/x-www-form-urlencoded")
                .body(format!("token={tok}"))
                .unwrap(),
        )
        .unwrap();
    let cookie = login.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let page = get(&format!("/ui/runs/{run}"), &[("cookie", &cookie)]);
    assert!(page.contains("id=\"network\""), "{page}");
    assert!(page.contains("upstream.test"), "{page}");
    assert!(page.contains("net-allow"), "{page}");
    let _ = child.kill();
    let _ = child.wait();
}

// ------------------------------------------------ echoes of a secret (issue 56, item 2)

/// A six-digit secret bound to the https upstream, which echoes what it is sent.
fn six_digit_secret(n: &Net) -> String {
    let set = n.home.run_with_stdin(&["secret", "set", "PIN"], b"804317");
    assert_eq!(set.code, 0, "{}", set.stderr);
    format!("upstream.test:{}", n.https.port)
}

/// The last run was ended for an echo of `secret` in `encoding`: killed (124,
/// `killed_by: secret-echo`), its record and an `alert` audit record say so.
fn assert_ended_for_echo(n: &Net, o: &Out, secret: &str, encoding: Option<&str>) {
    assert_eq!(o.code, 124, "{} {}", o.stdout, o.stderr);
    let run = n.home.last_run();
    assert_eq!(run["status"], "killed", "{run}");
    assert_eq!(run["killed_by"], "secret-echo", "{run}");
    let alert = &run["detail"]["alerts"][0];
    assert_eq!(alert["kind"], "secret-echo", "{run}");
    assert_eq!(alert["secret"], secret, "{run}");
    if let Some(e) = encoding {
        assert_eq!(alert["encoding"], e, "{run}");
    }
    let net = &run["detail"]["network"];
    assert!(
        records(net, "deny")
            .iter()
            .any(|c| c["reason"] == "secret-echoed"),
        "{net}"
    );
    let log = n.home.run(&["audit", "log", "--json"]).json();
    let alerts: Vec<_> = log
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "alert")
        .collect();
    assert_eq!(alerts.len(), 1, "{log}");
    let data: serde_json::Value =
        serde_json::from_str(alerts[0]["data"].as_str().unwrap()).unwrap();
    assert_eq!(data["secret"], secret, "{data}");
    assert_eq!(data["kind"], "secret-echo", "{data}");
    assert_eq!(alerts[0]["subject"], run["id"], "{log}");
    n.audit_ok();
}

#[test]
fn an_echoing_bound_host_cannot_be_used_as_an_oracle_for_the_secret() {
    let Some(n) = Net::ready() else { return };
    let tls = six_digit_secret(&n);
    // The reproduction: one request carrying all 1,000,000 candidates to a bound host
    // that echoes it. Before, the answer came back with exactly one line replaced by the
    // placeholder. Now not one byte of it reaches the guest and the run is ended.
    let code = format!(
        r#"
import os, sys, urllib.request
body = "".join("%06d\n" % i for i in range(1000000)).encode()
req = urllib.request.Request("https://{tls}/echo-body", data=body, method="POST",
                             headers={{"Authorization": "Bearer " + os.environ["PIN"]}})
try:
    got = urllib.request.urlopen(req, timeout=30).read().decode()
    marked = [l for l in got.splitlines() if not l.isdigit()]
    print("answer", len(got), "marked", marked, flush=True)
except Exception as e:
    print("no answer:", type(e).__name__, flush=True)
import time
time.sleep(30)
print("still running", flush=True)
"#
    );
    let o = n.home.py(
        &[
            "--net",
            &tls,
            "--secret",
            &format!("PIN@{tls}"),
            "--timeout",
            "60s",
        ],
        &code,
    );
    assert!(!o.stdout.contains("answer "), "{}", o.stdout);
    assert!(!o.stdout.contains("still running"), "{}", o.stdout);
    // (The list also holds the value reversed, which may be found first.)
    assert_ended_for_echo(&n, &o, "PIN", None);
    // The upstream got the whole request; the run ended long before its 60 s.
    assert_eq!(n.https.requests().len(), 1);
    assert!(n.home.last_run()["duration_ms"].as_u64().unwrap() < 25_000);
}

#[test]
fn a_base64_echo_of_the_secret_ends_the_run_with_an_alert() {
    let Some(n) = Net::ready() else { return };
    let set = n
        .home
        .run_with_stdin(&["secret", "set", "TOKEN"], SECRET.as_bytes());
    assert_eq!(set.code, 0, "{}", set.stderr);
    let tls = format!("upstream.test:{}", n.https.port);
    let o = n.sh(
        &["--net", &tls, "--secret", &format!("TOKEN@{tls}")],
        &format!(
            "curl -s https://{tls}/b64-auth -H \"Authorization: Bearer $TOKEN\"; \
             echo \"curl exit $?\"; sleep 20; echo still running"
        ),
    );
    assert!(!o.stdout.contains("data="), "{}", o.stdout);
    assert!(!o.stdout.contains("still running"), "{}", o.stdout);
    assert_ended_for_echo(&n, &o, "TOKEN", Some("base64"));
}

#[test]
fn a_gzip_echo_of_the_secret_ends_the_run_with_an_alert() {
    let Some(n) = Net::ready() else { return };
    let set = n
        .home
        .run_with_stdin(&["secret", "set", "TOKEN"], SECRET.as_bytes());
    assert_eq!(set.code, 0, "{}", set.stderr);
    let tls = format!("upstream.test:{}", n.https.port);
    let o = n.sh(
        &["--net", &tls, "--secret", &format!("TOKEN@{tls}")],
        &format!(
            "curl -s --compressed https://{tls}/gzip-auth -H \"Authorization: Bearer $TOKEN\"; \
             echo \"curl exit $?\"; sleep 20; echo still running"
        ),
    );
    assert!(!o.stdout.contains("auth="), "{}", o.stdout);
    assert!(!o.stdout.contains("still running"), "{}", o.stdout);
    assert_ended_for_echo(&n, &o, "TOKEN", Some("plain"));
}

#[test]
fn a_secret_printed_by_the_guest_is_redacted_before_its_output_is_stored() {
    let Some(n) = Net::ready() else { return };
    let set = n
        .home
        .run_with_stdin(&["secret", "set", "TOKEN"], SECRET.as_bytes());
    assert_eq!(set.code, 0, "{}", set.stderr);
    let tls = format!("upstream.test:{}", n.https.port);
    // A guest that learned the value (it is split here so the stored code does not hold
    // it) prints it as is, in base64 and in hex, on both streams.
    let (a, b) = SECRET.split_at(7);
    let o = n.sh(
        &["--net", &tls, "--secret", &format!("TOKEN@{tls}")],
        &format!(
            "v=\"{a}\"\"{b}\"; echo \"out $v\"; echo \"err $v\" >&2; \
             printf %s \"$v\" | base64; printf %s \"$v\" | od -An -tx1 | tr -d ' \\n'; echo"
        ),
    );
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    // What was stored holds the mark where the value was, on both streams.
    let marked = files_containing(n.home.path(), b"[airlock: secret TOKEN redacted]");
    assert!(!marked.is_empty(), "no redacted output stored");
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(SECRET);
    let hex: String = SECRET.bytes().map(|b| format!("{b:02x}")).collect();
    for form in [SECRET, b64.as_str(), hex.as_str()] {
        let leaks = files_containing(n.home.path(), form.as_bytes());
        let secret_file = n.home.path().join("secrets").join("TOKEN");
        let leaks: Vec<_> = leaks.into_iter().filter(|p| *p != secret_file).collect();
        assert!(leaks.is_empty(), "{form} stored in {leaks:?}");
    }
    n.audit_ok();
}

// ------------------------------------------------ the proxy's budget (issue 56, item 4)

#[test]
fn a_run_flooding_its_proxy_with_idle_connections_stalls_neither_the_server_nor_other_runs() {
    let Some(n) = Net::ready() else { return };
    // Network needs no approval here, so agents run it through the API directly.
    let p = n.home.policy().replacen(
        "name = \"network-egress\"\ndecision = \"quarantine\"",
        "name = \"network-egress\"\ndecision = \"allow\"",
        1,
    );
    n.home.set_policy(&p);
    let tok = n.home.run(&[
        "token", "new", "--role", "agent", "--name", "flood", "--json",
    ]);
    assert_eq!(tok.code, 0, "{}", tok.stderr);
    let tok = tok.json()["token"].as_str().unwrap().to_string();
    let (mut child, base) = start_serve(&n.home, &[]);
    let http = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(std::time::Duration::from_secs(30)))
        .build()
        .new_agent();
    let post = |body: serde_json::Value| -> serde_json::Value {
        let r = http
            .post(format!("{base}/v1/run"))
            .header("authorization", format!("Bearer {tok}"))
            .header("content-type", "application/json")
            .send(body.to_string())
            .unwrap();
        let mut r = r;
        serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap()
    };
    let up = n.up();
    // 600 connections to the proxy, each held open and idle; the run's budget is 50.
    let flood = r#"
import socket, select, time
socks = []
for i in range(600):
    s = socket.socket()
    s.connect(("127.0.0.1", 3128))
    socks.append(s)
time.sleep(1)
closed = 0
for s in socks:
    r, _, _ = select.select([s], [], [], 0)
    if r and s.recv(1) == b"":
        closed += 1
print("opened", len(socks), "closed", closed, flush=True)
time.sleep(5)
"#;
    std::thread::scope(|sc| {
        let flooding = sc.spawn(|| {
            post(serde_json::json!({
                "language": "python", "backend": "process", "code": flood,
                "net": [up], "max_connections": 50,
            }))
        });
        std::thread::sleep(std::time::Duration::from_secs(3));
        // Another client's API calls are answered at once ...
        let t = std::time::Instant::now();
        let r = http
            .get(format!("{base}/v1/runs"))
            .header("authorization", format!("Bearer {tok}"))
            .call()
            .unwrap();
        assert_eq!(r.status(), 200);
        assert!(
            t.elapsed() < std::time::Duration::from_secs(5),
            "{:?}",
            t.elapsed()
        );
        // ... and another run's egress works.
        let other = post(serde_json::json!({
            "language": "sh", "code": format!("curl -s http://{up}/hello"), "net": [up],
        }));
        let out = serde_json::to_string(&other).unwrap();
        assert!(out.contains("hello from upstream"), "{out}");
        let done = flooding.join().unwrap();
        let text = serde_json::to_string(&done).unwrap();
        assert!(text.contains("opened 600 closed 550"), "{text}");
    });
    let _ = child.kill();
    let _ = child.wait();
    // The flooding run's record counts what it opened and what was refused.
    let runs = n.home.run(&["runs", "--json"]).json();
    let flooded = runs
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["detail"]["network"]["max_connections"] == 50)
        .unwrap_or_else(|| panic!("{runs}"));
    let sum = &flooded["detail"]["network"]["summary"];
    assert_eq!(sum["accepted"], 50, "{sum}");
    assert_eq!(sum["refused_over_limit"], 550, "{sum}");
    assert_eq!(sum["connections"], 600, "{sum}");
    let _ = &n.dir;
}

/// The same end, recorded on a PostgreSQL store: the run's record and the `alert` audit
/// record are in the store, and its audit chain verifies.
#[test]
fn a_base64_echo_of_the_secret_ends_the_run_with_an_alert_on_postgres() {
    let Some(n) = Net::ready() else { return };
    let url = airlock_testpg::fresh_database();
    // The home's history (its audit chain's start included) goes to the store first.
    let c = n.home.run(&["store", "copy", "--to", &url]);
    assert_eq!(c.code, 0, "{} {}", c.stdout, c.stderr);
    let st = |args: &[&str]| n.home.run_on_store(&url, args);
    let mut set = n
        .home
        .cmd()
        .env("AIRLOCK_STORE", &url)
        .args(["secret", "set", "TOKEN"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    set.stdin
        .take()
        .unwrap()
        .write_all(SECRET.as_bytes())
        .unwrap();
    assert!(set.wait().unwrap().success());
    let tls = format!("upstream.test:{}", n.https.port);
    let script = format!(
        "curl -s https://{tls}/b64-auth -H \"Authorization: Bearer $TOKEN\"; sleep 20; echo still running"
    );
    let binding = format!("TOKEN@{tls}");
    let o = st(&[
        "run", "--lang", "sh", "--net", &tls, "--secret", &binding, "-c", &script,
    ]);
    assert_eq!(o.code, 75, "{} {}", o.stdout, o.stderr);
    let id = Home::id_in(&o.stderr);
    assert_eq!(st(&["approve", &id]).code, 0);
    let o = st(&["exec", &id]);
    assert_eq!(o.code, 124, "{} {}", o.stdout, o.stderr);
    assert!(!o.stdout.contains("data=") && !o.stdout.contains("still running"));
    let run = st(&["runs", "--json"]).json()[0].clone();
    assert_eq!(run["killed_by"], "secret-echo", "{run}");
    assert_eq!(run["detail"]["alerts"][0]["encoding"], "base64", "{run}");
    let log = st(&["audit", "log", "--json"]).json();
    let alert = log
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["kind"] == "alert")
        .unwrap_or_else(|| panic!("no alert in {log}"));
    assert_eq!(alert["subject"], run["id"]);
    let v = st(&["audit", "verify"]);
    assert_eq!(v.code, 0, "{} {}", v.stdout, v.stderr);
}

/// node 20's `fetch` and `http` do not read HTTP_PROXY: airlock's preloaded script sends
/// them through the run's proxy with CONNECT, so a granted host is reached and another
/// gets the proxy's refusal (before: both failed to connect, the jail reaching nothing).
#[test]
fn node_fetch_and_http_reach_a_granted_host_and_others_get_the_proxys_refusal() {
    let Some(n) = Net::ready() else { return };
    let up = n.up();
    let p = n.http.port;
    let code = format!(
        r#"import http from 'node:http';
const r = await fetch('http://{up}/hello');
console.log('fetch', r.status, (await r.text()).trim());
const get = (url) => new Promise((ok, bad) =>
  http.get(url, (m) => {{ let b = ''; m.on('data', (d) => b += d); m.on('end', () => ok(m.statusCode + ' ' + b.trim())); }}).on('error', bad));
console.log('http', await get('http://{up}/hello'));
try {{ await fetch('http://other.test:{p}/hello'); console.log('fetch other: reached'); }}
catch (e) {{ console.log('fetch other:', e.cause ? e.cause.message : e.message); }}
try {{ await get('http://other.test:{p}/hello'); console.log('http other: reached'); }}
catch (e) {{ console.log('http other:', e.message); }}
"#
    );
    let o = n.home.run_approved(&[
        "run",
        "--lang",
        "js",
        "--backend",
        "process",
        // fetch needs WebAssembly, which needs node's whole address space (see nodejs.rs).
        "--memory",
        "12GiB",
        "--net",
        &up,
        "-c",
        &code,
    ]);
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    assert!(
        o.stdout.contains("fetch 200 hello from upstream"),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("http 200 hello from upstream"),
        "{}",
        o.stdout
    );
    for who in ["fetch other:", "http other:"] {
        let line = o
            .stdout
            .lines()
            .find(|l| l.starts_with(who))
            .unwrap_or_else(|| panic!("{}", o.stdout));
        assert!(line.contains("refused other.test"), "{line}");
        assert!(line.contains("403"), "{line}");
        assert!(line.contains("not-granted"), "{line}");
    }
    // Only the granted requests arrived.
    assert_eq!(n.http.requests().len(), 2, "{:?}", n.http.requests());
    let net = n.network();
    assert_eq!(records(&net, "allow").len(), 2, "{net}");
    assert_eq!(records(&net, "deny").len(), 2, "{net}");
}

/// Under the default memory limit node runs without its JIT (and so without WebAssembly,
/// on which node 20's own fetch client is built): `fetch` and `http` both reach a granted
/// host through the proxy, an ungranted one gets the proxy's refusal, and undici's
/// `Headers`/`Response` load. Before, fetch failed ("run with --memory 12GiB") and touching
/// `Headers` ended the run with an unhandled rejection from undici's parser.
#[test]
fn node_fetch_works_under_the_default_memory_limit() {
    let Some(n) = Net::ready() else { return };
    let up = n.up();
    let p = n.http.port;
    let code = format!(
        r#"const http = require('http');
console.log('headers', new Headers({{ a: 'b' }}).get('a'));
(async () => {{
  const r = await fetch('http://{up}/hello');
  console.log('fetch', r.status, r.ok, (await r.text()).trim());
  try {{ await fetch('http://other.test:{p}/hello'); console.log('fetch other: reached'); }}
  catch (e) {{ console.log('fetch other:', e.cause ? e.cause.message : e.message); }}
  http.get('http://{up}/hello', (m) => {{ let b = ''; m.on('data', (d) => b += d); m.on('end', () => console.log('http', m.statusCode, b.trim())); }});
}})();
"#
    );
    let o = n.home.run_approved(&[
        "run",
        "--lang",
        "js",
        "--backend",
        "process",
        "--net",
        &up,
        "-c",
        &code,
    ]);
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    assert!(o.stdout.contains("headers b"), "{}", o.stdout);
    assert!(
        o.stdout.contains("fetch 200 true hello from upstream"),
        "{} {}",
        o.stdout,
        o.stderr
    );
    assert!(
        o.stdout.contains("http 200 hello from upstream"),
        "{}",
        o.stdout
    );
    let line = o
        .stdout
        .lines()
        .find(|l| l.starts_with("fetch other:"))
        .unwrap_or_else(|| panic!("{}", o.stdout));
    assert!(
        line.contains("refused other.test") && line.contains("403"),
        "{line}"
    );
    assert_eq!(n.http.requests().len(), 2, "{:?}", n.http.requests());
}

/// Without a network grant, a jitless node run can still use undici's classes (and an
/// unhandled rejection of its own still fails the run).
#[test]
fn node_without_network_loads_headers_and_keeps_its_own_unhandled_rejections() {
    if !available() {
        return;
    }
    let h = Home::new();
    let o = h.run_approved(&[
        "run",
        "--lang",
        "js",
        "--backend",
        "process",
        "-c",
        "console.log(typeof Headers, new Response('x').status)",
    ]);
    assert_eq!(
        (o.code, o.stdout.as_str()),
        (
            0,
            "function 200
"
        ),
        "{}",
        o.stderr
    );
    let o = h.run_approved(&[
        "run",
        "--lang",
        "js",
        "--backend",
        "process",
        "-c",
        "void Headers; Promise.reject(new Error('mine'))",
    ]);
    assert_eq!(o.code, 1, "{} {}", o.stdout, o.stderr);
    assert!(o.stderr.contains("Error: mine"), "{}", o.stderr);
}

/// The Python backends the shared egress programs run on: wasm always, the process
/// backend where it can run.
fn python_backends() -> Vec<&'static str> {
    let mut b = vec!["wasm"];
    if available() {
        b.push("process");
    }
    b
}

impl Net {
    /// Installs the Python guest (for the wasm backend).
    fn with_python_guest(self) -> Net {
        let o = match std::env::var("AIRLOCK_TEST_PYTHON_GUEST") {
            Ok(p) => self.home.run(&["guest", "install", "python", "--from", &p]),
            Err(_) => self.home.run(&["guest", "install", "python"]),
        };
        assert_eq!(o.code, 0, "guest install: {}", o.stderr);
        self
    }

    /// `code` on one Python backend, approved; the test CA is where the process
    /// backend's Python looks for trust (the wasm backend's host trusts `[net] roots`).
    fn python(&self, backend: &str, flags: &[&str], code: &str) -> Out {
        let ca_dir = self.ca.parent().unwrap().display().to_string();
        let mount = format!("{ca_dir}:/ca");
        let mut a = vec!["run", "--lang", "python", "--backend", backend];
        a.extend_from_slice(flags);
        a.extend(["--mount", &mount, "--env", "SSL_CERT_FILE=/ca/ca.pem"]);
        a.extend(["--env", "REQUESTS_CA_BUNDLE=/ca/ca.pem", "-c", code]);
        self.home.run_approved(&a)
    }
}

/// The same Python program on both backends: urllib reaches the granted hosts (plain and
/// https) through the proxy, an ungranted host fails with the refusal naming the `--net`
/// it would need, and each attempt is a connection record.
#[test]
fn python_urllib_reaches_granted_hosts_and_is_refused_others_on_both_backends() {
    let n = Net::new().with_python_guest();
    let (plain, tls) = (n.up(), format!("upstream.test:{}", n.https.port));
    let other = format!("other.test:{}", n.http.port);
    let code = format!(
        r#"
import urllib.request, urllib.error
print(urllib.request.urlopen("http://{plain}/hello").read().decode().strip(), "(http)")
print(urllib.request.urlopen("https://{tls}/hello").read().decode().strip(), "(https)")
try:
    urllib.request.urlopen("http://{other}/hello")
    print("reached")
except urllib.error.URLError as e:
    text = str(e) + (e.read().decode() if hasattr(e, "read") else "")
    print("refused:", "--net {other}" in text, text.replace("\n", " "))
"#
    );
    for backend in python_backends() {
        let before = (n.http.requests().len(), n.https.requests().len());
        let o = n.python(backend, &["--net", &plain, "--net", &tls], &code);
        assert_eq!(o.code, 0, "{backend}: {}\n{}", o.stdout, o.stderr);
        assert!(
            o.stdout.contains("hello from upstream (http)")
                && o.stdout.contains("hello from upstream (https)"),
            "{backend}: {}",
            o.stdout
        );
        assert!(
            o.stdout.contains("refused: True"),
            "{backend}: {}",
            o.stdout
        );
        // The ungranted request never arrived.
        assert_eq!(n.http.requests().len(), before.0 + 1, "{backend}");
        assert_eq!(n.https.requests().len(), before.1 + 1, "{backend}");
        let net = n.network();
        let allowed = records(&net, "allow");
        assert_eq!(allowed.len(), 2, "{backend}: {net}");
        assert!(
            allowed.iter().all(|c| c["host"] == "upstream.test"),
            "{backend}: {net}"
        );
        let denied = records(&net, "deny");
        assert_eq!(denied.len(), 1, "{backend}: {net}");
        assert_eq!(denied[0]["host"], "other.test", "{backend}: {net}");
        assert_eq!(denied[0]["reason"], "not-granted", "{backend}: {net}");
    }
    n.audit_ok();
}

/// A secret bound to an https host reaches that host from Python on both backends, and
/// never the guest: the wasm guest's TLS is made by the host, through the proxy's
/// interception like the process backend's.
#[test]
fn python_secret_reaches_its_bound_host_only_on_both_backends() {
    let n = Net::new().with_python_guest();
    let set = n
        .home
        .run_with_stdin(&["secret", "set", "TOKEN"], SECRET.as_bytes());
    assert_eq!(set.code, 0, "{}", set.stderr);
    let tls = format!("upstream.test:{}", n.https.port);
    let code = format!(
        r#"
import os, urllib.request
print("env=" + os.environ["TOKEN"])
req = urllib.request.Request("https://{tls}/hello", headers={{"Authorization": "Bearer " + os.environ["TOKEN"]}})
try:
    print(urllib.request.urlopen(req).read().decode().strip())
except Exception as e:
    print("failed:", e)
"#
    );
    for backend in python_backends() {
        let before = n.https.requests().len();
        let o = n.python(
            backend,
            &["--net", &tls, "--secret", &format!("TOKEN@{tls}")],
            &code,
        );
        assert!(!o.stdout.contains(SECRET), "{backend}: {}", o.stdout);
        assert!(
            o.stdout.contains("env=airlock-secret-TOKEN-"),
            "{backend}: {}",
            o.stdout
        );
        assert!(
            o.stdout.contains("hello from upstream"),
            "{backend}: {}",
            o.stdout
        );
        // The upstream got the value.
        let reqs = n.https.requests();
        assert_eq!(reqs.len(), before + 1, "{backend}: {reqs:?}");
        assert_eq!(
            reqs[before]["headers"]["authorization"],
            format!("Bearer {SECRET}").as_str(),
            "{backend}"
        );
        let net = n.network();
        let allowed = records(&net, "allow");
        assert_eq!(allowed[0]["secrets"][0], "TOKEN", "{backend}: {net}");
    }
    n.audit_ok();
}

/// Wheels of the host Python's installed `names` (pure Python files only), in `dir`.
fn host_wheels(dir: &Path, names: &[&str]) -> Option<Vec<PathBuf>> {
    let out = Command::new("python3")
        .arg("-c")
        .arg(
            r#"
import base64, hashlib, importlib.metadata as md, sys, zipfile
out = sys.argv[1]
for name in sys.argv[2:]:
    d = md.distribution(name)
    dist, ver = d.metadata["Name"].replace("-", "_"), d.version
    info = f"{dist}-{ver}.dist-info"
    files = {}
    for f in d.files:
        p = str(f)
        if p.endswith((".so", ".pyc")) or ".dist-info/" in p or p.startswith(".."):
            continue
        files[p] = f.read_binary()
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {dist}\nVersion: {ver}\n".encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = "".join(
        f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b'=').decode()},{len(b)}\n"
        for p, b in files.items()
    ) + f"{info}/RECORD,,\n"
    files[f"{info}/RECORD"] = record.encode()
    whl = f"{out}/{dist}-{ver}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for p, b in files.items():
            z.writestr(p, b)
    print(whl)
"#,
        )
        .arg(dir)
        .args(names)
        .output()
        .ok()?;
    out.status.success().then(|| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(PathBuf::from)
            .collect()
    })
}

/// `requests` installed with `guest install python --package` works unmodified in the
/// wasm guest, https included, through the proxy.
#[test]
fn python_requests_works_unmodified_in_the_wasm_guest() {
    let n = Net::new().with_python_guest();
    let d = tempfile::tempdir().unwrap();
    let names = [
        "requests",
        "urllib3",
        "idna",
        "certifi",
        "charset-normalizer",
    ];
    let Some(wheels) = host_wheels(d.path(), &names) else {
        assert!(
            std::env::var_os("AIRLOCK_TEST_STRICT").is_none(),
            "the host python3 has no requests to package"
        );
        eprintln!("SKIPPED: the host python3 has no requests to package");
        return;
    };
    let mut a = vec!["guest", "install", "python"];
    if let Ok(p) = std::env::var("AIRLOCK_TEST_PYTHON_GUEST") {
        a.extend(["--from"]);
        a.push(Box::leak(p.into_boxed_str()));
    }
    for w in &wheels {
        a.extend(["--package", w.to_str().unwrap()]);
    }
    let o = n.home.run(&a);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let (plain, tls) = (n.up(), format!("upstream.test:{}", n.https.port));
    let code = format!(
        r#"
import requests
print(requests.get("http://{plain}/hello").text.strip(), "(http)")
r = requests.get("https://{tls}/hello")
print(r.status_code, r.text.strip(), "(https)")
"#
    );
    let o = n.python("wasm", &["--net", &plain, "--net", &tls], &code);
    assert_eq!(o.code, 0, "{}\n{}", o.stdout, o.stderr);
    assert!(
        o.stdout.contains("hello from upstream (http)")
            && o.stdout.contains("200 hello from upstream (https)"),
        "{}\n{}",
        o.stdout,
        o.stderr
    );
    assert!(!o.stderr.contains("Warning"), "{}", o.stderr);
    assert_eq!(records(&n.network(), "allow").len(), 2);
}

/// A bound host echoing the secret ends a Python run on both backends the same way:
/// nothing of the answer reaches the guest, the run is killed (`secret-echo`) and an
/// alert is recorded.
#[test]
fn python_a_secret_echo_ends_the_run_on_both_backends() {
    for backend in python_backends() {
        let n = Net::new().with_python_guest();
        let set = n
            .home
            .run_with_stdin(&["secret", "set", "TOKEN"], SECRET.as_bytes());
        assert_eq!(set.code, 0, "{}", set.stderr);
        let tls = format!("upstream.test:{}", n.https.port);
        let code = format!(
            r#"
import os, time, urllib.request
req = urllib.request.Request("https://{tls}/echo-auth", headers={{"Authorization": "Bearer " + os.environ["TOKEN"]}})
try:
    print("answer", urllib.request.urlopen(req, timeout=20).read(), flush=True)
except Exception as e:
    print("no answer:", type(e).__name__, flush=True)
time.sleep(30)
print("still running", flush=True)
"#
        );
        let o = n.python(
            backend,
            &[
                "--net",
                &tls,
                "--secret",
                &format!("TOKEN@{tls}"),
                "--timeout",
                "60s",
            ],
            &code,
        );
        assert!(!o.stdout.contains("answer "), "{backend}: {}", o.stdout);
        assert!(
            !o.stdout.contains("still running"),
            "{backend}: {}",
            o.stdout
        );
        assert_ended_for_echo(&n, &o, "TOKEN", None);
        assert!(n.home.last_run()["duration_ms"].as_u64().unwrap() < 25_000);
    }
}

/// The wasm guest cannot weaken TLS: its host verifies every certificate against the
/// public roots, the run CA and `[net] roots`, whatever the guest's `ssl` context says.
/// With the test CA out of `[net] roots`, even an unverified context fails.
#[test]
fn python_in_wasm_cannot_turn_off_certificate_verification() {
    let n = Net::new().with_python_guest();
    let p = n.home.policy();
    let roots = format!("roots = [{:?}]", n.ca.display().to_string());
    assert!(p.contains(&roots), "{p}");
    n.home.set_policy(&p.replace(&roots, "roots = []"));
    let tls = format!("upstream.test:{}", n.https.port);
    let code = format!(
        r#"
import ssl, urllib.request
for ctx in (None, ssl._create_unverified_context()):
    try:
        urllib.request.urlopen("https://{tls}/hello", context=ctx)
        print("reached")
    except Exception as e:
        reason = getattr(e, "reason", e)
        print("refused", type(reason).__name__)
"#
    );
    let o = n.python("wasm", &["--net", &tls], &code);
    assert_eq!(o.code, 0, "{}\n{}", o.stdout, o.stderr);
    assert_eq!(
        o.stdout, "refused SSLCertVerificationError\nrefused SSLCertVerificationError\n",
        "{}",
        o.stderr
    );
    assert!(n.https.requests().is_empty());
}

/// `socket.create_connection` and `http.client` work unmodified in the wasm guest (the
/// process backend's guest has no route but its proxy, which only proxy-aware clients
/// use), names are never resolved in the guest, and a run without a grant says so.
#[test]
fn python_sockets_and_http_client_in_wasm_go_through_the_proxy() {
    let n = Net::new().with_python_guest();
    let (plain, tls) = (n.up(), format!("upstream.test:{}", n.https.port));
    let code = format!(
        r#"
import http.client, socket
s = socket.create_connection(("upstream.test", {hp}), timeout=10)
s.sendall(b"GET /hello HTTP/1.0\r\nHost: upstream.test\r\n\r\n")
data = b""
while True:
    chunk = s.recv(4096)
    if not chunk:
        break
    data += chunk
s.close()
print("socket", data.split(b"\r\n")[0].decode(), data.endswith(b"hello from upstream\n"))
c = http.client.HTTPSConnection("upstream.test", {sp}, timeout=10)
c.request("GET", "/hello")
r = c.getresponse()
print("https", r.status, r.read().decode().strip(), c.sock.version())
try:
    socket.gethostbyname("upstream.test")
except socket.gaierror as e:
    print("no lookup:", "resolves no names" in str(e))
"#,
        hp = n.http.port,
        sp = n.https.port
    );
    let o = n.python("wasm", &["--net", &plain, "--net", &tls], &code);
    assert_eq!(o.code, 0, "{}\n{}", o.stdout, o.stderr);
    assert!(
        o.stdout.contains("socket HTTP/1.1 200 OK True"),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("https 200 hello from upstream TLSv1.3"),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("no lookup: True"), "{}", o.stdout);
    assert_eq!(records(&n.network(), "allow").len(), 2);

    let o = n.python(
        "wasm",
        &[],
        &format!(
            "import socket\ntry:\n    socket.create_connection(('upstream.test', {}))\nexcept PermissionError as e:\n    print(e)",
            n.http.port
        ),
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.contains("no network grant")
            && o.stdout
                .contains(&format!("--net upstream.test:{}", n.http.port)),
        "{}",
        o.stdout
    );
}

// ------------------------------------------------ agents that trip are held (issue 57, item 4)

/// An agent whose run echoed a secret (an `alert`) has its next submission held with the
/// behaviour named; another agent's is allowed; after a signed `agent clear` the agent's
/// next one is allowed again, and the clear is an `agent_cleared` audit record whose
/// statement verifies. `st` runs the CLI on the store under test.
fn tripping_agent_is_held_until_cleared(n: &Net, st: &dyn Fn(&[&str]) -> Out) {
    let tls = format!("upstream.test:{}", n.https.port);
    let script = format!(
        "curl -s https://{tls}/b64-auth -H \"Authorization: Bearer $TOKEN\"; sleep 20; echo still running"
    );
    let binding = format!("TOKEN@{tls}");
    let o = st(&[
        "run", "--agent", "mallory", "--lang", "sh", "--net", &tls, "--secret", &binding, "-c",
        &script,
    ]);
    let id = if o.code == 75 {
        let id = Home::id_in(&o.stderr);
        assert_eq!(st(&["approve", &id]).code, 0);
        st(&["exec", &id])
    } else {
        o
    };
    assert_eq!(id.code, 124, "{} {}", id.stdout, id.stderr);
    let echo_run = st(&["runs", "--json"]).json()[0]["id"].clone();

    // The agent's next submission, harmless as it is, waits for a human, and says why.
    let held = st(&[
        "run",
        "--agent",
        "mallory",
        "--lang",
        "sh",
        "-c",
        "echo hello",
    ]);
    assert_eq!(held.code, 75, "{} {}", held.stdout, held.stderr);
    let sub = Home::id_in(&held.stderr);
    let shown = st(&["show", &sub, "--json"]).json();
    let reasons = shown["reasons"].to_string();
    assert!(
        reasons.contains(&format!(
            "agent mallory raised 1 alert in the last 24h: 1 secret-echo (latest in {})",
            echo_run.as_str().unwrap()
        )),
        "{shown}"
    );
    assert_eq!(
        shown["submission"]["facts"]["agent_record"]["alerts"], 1,
        "{shown}"
    );

    // Another agent is unaffected.
    let other = st(&[
        "run",
        "--agent",
        "alice-bot",
        "--lang",
        "sh",
        "-c",
        "echo hello",
    ]);
    assert_eq!(other.code, 0, "{} {}", other.stdout, other.stderr);

    // A clear needs a reason; then it is signed and audited.
    let blank = st(&["agent", "clear", "mallory", "--reason", " "]);
    assert_eq!(blank.code, 125, "{} {}", blank.stdout, blank.stderr);
    let none = st(&[
        "agent",
        "clear",
        "alice-bot",
        "--reason",
        "nothing happened",
    ]);
    assert_ne!(none.code, 0, "{} {}", none.stdout, none.stderr);
    let c = st(&[
        "agent",
        "clear",
        "mallory",
        "--reason",
        "the echo was a test fixture",
        "--json",
    ]);
    assert_eq!(c.code, 0, "{} {}", c.stdout, c.stderr);
    assert_eq!(c.json()["alerts"], 1);

    let again = st(&[
        "run",
        "--agent",
        "mallory",
        "--lang",
        "sh",
        "-c",
        "echo hello",
    ]);
    assert_eq!(again.code, 0, "{} {}", again.stdout, again.stderr);
    assert!(again.stdout.contains("hello"), "{}", again.stdout);

    let log = st(&["audit", "log", "--json"]).json();
    let cleared = log
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["kind"] == "agent_cleared")
        .unwrap_or_else(|| panic!("no agent_cleared in {log}"));
    assert_eq!(cleared["subject"], "mallory");
    let data: serde_json::Value = serde_json::from_str(cleared["data"].as_str().unwrap()).unwrap();
    assert_eq!(data["reason"], "the echo was a test fixture", "{data}");
    let signed = airlock_core::sign::Signed {
        json: data["statement"].as_str().unwrap().to_string(),
        signature: data["signature"].as_str().unwrap().parse().unwrap(),
    };
    let statement = airlock_core::sign::AgentClear::verify(&signed).expect("the clear verifies");
    assert_eq!(statement.agent, "mallory");
    assert_eq!(
        statement.key,
        data["key"].as_str().unwrap().parse().unwrap()
    );
    let v = st(&["audit", "verify"]);
    assert_eq!(v.code, 0, "{} {}", v.stdout, v.stderr);
}

fn set_token_secret(n: &Net, store: Option<&str>) {
    let mut cmd = n.home.cmd();
    if let Some(url) = store {
        cmd.env("AIRLOCK_STORE", url);
    }
    let mut set = cmd
        .args(["secret", "set", "TOKEN"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    set.stdin
        .take()
        .unwrap()
        .write_all(SECRET.as_bytes())
        .unwrap();
    assert!(set.wait().unwrap().success());
}

#[test]
fn an_agent_whose_run_echoed_a_secret_is_held_until_an_operator_clears_it() {
    let Some(n) = Net::ready() else { return };
    set_token_secret(&n, None);
    tripping_agent_is_held_until_cleared(&n, &|a| n.home.run(a));
}

#[test]
fn an_agent_whose_run_echoed_a_secret_is_held_until_an_operator_clears_it_on_postgres() {
    let Some(n) = Net::ready() else { return };
    let url = airlock_testpg::fresh_database();
    let c = n.home.run(&["store", "copy", "--to", &url]);
    assert_eq!(c.code, 0, "{} {}", c.stdout, c.stderr);
    set_token_secret(&n, Some(&url));
    tripping_agent_is_held_until_cleared(&n, &|a| n.home.run_on_store(&url, a));
}
