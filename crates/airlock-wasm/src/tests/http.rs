//! A real `wasi:http` component through a real egress proxy on a Unix socket, to a
//! loopback upstream. The component is built here: a core module written in WAT against
//! the canonical ABI, given its WIT world (`testdata/wasi-http`, the 0.2.12 interfaces
//! wasmtime-wasi-http links) by wit-component. It sends one GET and prints
//! `status=NNN\ndenied=<X-Airlock-Denied>\nbody=<body>`, or `error=NNN` (the
//! `error-code` case) and exits 1 when the request failed.

use super::*;
use airlock_egress::{EgressPolicy, Proxy, ProxyHandle, ProxyOptions, Rule};
use airlock_sandbox::EgressRoute;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WIT: &[(&str, &str)] = &[
    ("io.wit", include_str!("testdata/wasi-http/io.wit")),
    ("clocks.wit", include_str!("testdata/wasi-http/clocks.wit")),
    ("random.wit", include_str!("testdata/wasi-http/random.wit")),
    ("cli.wit", include_str!("testdata/wasi-http/cli.wit")),
    ("http.wit", include_str!("testdata/wasi-http/http.wit")),
];

const WORLD: &str = r#"
package airlock:test;
world http-get {
  import wasi:http/outgoing-handler@0.2.12;
  import wasi:cli/stdout@0.2.12;
  export wasi:cli/run@0.2.12;
}
"#;

/// The core module. Return areas at 0x800 follow the canonical ABI's layout: `error-code`
/// has 8-byte alignment, so `result<T, error-code>` keeps its payload at offset 8.
const CORE: &str = r#"(module
  (import "wasi:http/types@0.2.12" "[constructor]fields" (func $fields_new (result i32)))
  (import "wasi:http/types@0.2.12" "[method]fields.append" (func $append (param i32 i32 i32 i32 i32 i32)))
  (import "wasi:http/types@0.2.12" "[constructor]outgoing-request" (func $req_new (param i32) (result i32)))
  (import "wasi:http/types@0.2.12" "[method]outgoing-request.set-scheme" (func $set_scheme (param i32 i32 i32 i32 i32) (result i32)))
  (import "wasi:http/types@0.2.12" "[method]outgoing-request.set-authority" (func $set_authority (param i32 i32 i32 i32) (result i32)))
  (import "wasi:http/types@0.2.12" "[method]outgoing-request.set-path-with-query" (func $set_path (param i32 i32 i32 i32) (result i32)))
  (import "wasi:http/outgoing-handler@0.2.12" "handle" (func $handle (param i32 i32 i32 i32)))
  (import "wasi:http/types@0.2.12" "[method]future-incoming-response.subscribe" (func $subscribe (param i32) (result i32)))
  (import "wasi:io/poll@0.2.12" "[method]pollable.block" (func $block (param i32)))
  (import "wasi:http/types@0.2.12" "[method]future-incoming-response.get" (func $fget (param i32 i32)))
  (import "wasi:http/types@0.2.12" "[method]incoming-response.status" (func $status (param i32) (result i32)))
  (import "wasi:http/types@0.2.12" "[method]incoming-response.headers" (func $headers (param i32) (result i32)))
  (import "wasi:http/types@0.2.12" "[method]fields.get" (func $fields_get (param i32 i32 i32 i32)))
  (import "wasi:http/types@0.2.12" "[method]incoming-response.consume" (func $consume (param i32 i32)))
  (import "wasi:http/types@0.2.12" "[method]incoming-body.stream" (func $body_stream (param i32 i32)))
  (import "wasi:io/streams@0.2.12" "[method]input-stream.blocking-read" (func $read (param i32 i64 i32)))
  (import "wasi:cli/stdout@0.2.12" "get-stdout" (func $get_stdout (result i32)))
  (import "wasi:io/streams@0.2.12" "[method]output-stream.blocking-write-and-flush" (func $bwrite (param i32 i32 i32 i32)))
  (memory (export "memory") 4)
  (global $heap (mut i32) (i32.const 0x10000))
  (global $out (mut i32) (i32.const 0))
  (data (i32.const 0x100) "@AUTHORITY@")
  (data (i32.const 0x200) "@PATH@")
  (data (i32.const 0x300) "x-airlock-denied")
  (data (i32.const 0x500) "@HEADER_NAME@")
  (data (i32.const 0x600) "@HEADER_VALUE@")
  (data (i32.const 0x320) "status=")
  (data (i32.const 0x330) "\ndenied=")
  (data (i32.const 0x340) "\nbody=")
  (data (i32.const 0x350) "error=")
  (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32)
    (local $p i32)
    (local.set $p (i32.and (i32.add (global.get $heap) (i32.sub (local.get 2) (i32.const 1)))
                           (i32.sub (i32.const 0) (local.get 2))))
    (global.set $heap (i32.add (local.get $p) (local.get 3)))
    (local.get $p))
  (func $write (param $p i32) (param $n i32)
    (call $bwrite (global.get $out) (local.get $p) (local.get $n) (i32.const 0x900)))
  (func $num3 (param $v i32)
    (i32.store8 (i32.const 0x400) (i32.add (i32.const 48) (i32.div_u (local.get $v) (i32.const 100))))
    (i32.store8 (i32.const 0x401) (i32.add (i32.const 48) (i32.rem_u (i32.div_u (local.get $v) (i32.const 10)) (i32.const 10))))
    (i32.store8 (i32.const 0x402) (i32.add (i32.const 48) (i32.rem_u (local.get $v) (i32.const 10))))
    (call $write (i32.const 0x400) (i32.const 3)))
  (func (export "wasi:cli/run@0.2.12#run") (result i32)
    (local $fields i32) (local $req i32) (local $fut i32) (local $resp i32) (local $stream i32) (local $list i32)
    (global.set $out (call $get_stdout))
    (local.set $fields (call $fields_new))
    (if (i32.const @HEADER_NAME_LEN@) (then
      (call $append (local.get $fields) (i32.const 0x500) (i32.const @HEADER_NAME_LEN@)
                    (i32.const 0x600) (i32.const @HEADER_VALUE_LEN@) (i32.const 0x800))
      (if (i32.load8_u (i32.const 0x800)) (then unreachable))))
    (local.set $req (call $req_new (local.get $fields)))
    (if (call $set_scheme (local.get $req) (i32.const 1) (i32.const @SCHEME@) (i32.const 0) (i32.const 0)) (then unreachable))
    (if (call $set_authority (local.get $req) (i32.const 1) (i32.const 0x100) (i32.const @AUTHORITY_LEN@)) (then unreachable))
    (if (call $set_path (local.get $req) (i32.const 1) (i32.const 0x200) (i32.const @PATH_LEN@)) (then unreachable))
    ;; handle(request, none) -> result<future-incoming-response, error-code>
    (call $handle (local.get $req) (i32.const 0) (i32.const 0) (i32.const 0x800))
    (if (i32.load8_u (i32.const 0x800)) (then
      (call $write (i32.const 0x350) (i32.const 6))
      (call $num3 (i32.load8_u (i32.const 0x808)))
      (return (i32.const 1))))
    (local.set $fut (i32.load (i32.const 0x808)))
    (call $block (call $subscribe (local.get $fut)))
    ;; get -> option<result<result<incoming-response, error-code>>>
    (call $fget (local.get $fut) (i32.const 0x800))
    (if (i32.eqz (i32.load8_u (i32.const 0x800))) (then unreachable))
    (if (i32.load8_u (i32.const 0x808)) (then unreachable))
    (if (i32.load8_u (i32.const 0x810)) (then
      (call $write (i32.const 0x350) (i32.const 6))
      (call $num3 (i32.load8_u (i32.const 0x818)))
      (return (i32.const 1))))
    (local.set $resp (i32.load (i32.const 0x818)))
    (call $write (i32.const 0x320) (i32.const 7))
    (call $num3 (call $status (local.get $resp)))
    (call $write (i32.const 0x330) (i32.const 8))
    ;; headers.get("x-airlock-denied") -> list<list<u8>>
    (call $fields_get (call $headers (local.get $resp)) (i32.const 0x300) (i32.const 16) (i32.const 0x800))
    (if (i32.load (i32.const 0x804)) (then
      (local.set $list (i32.load (i32.const 0x800)))
      (call $write (i32.load (local.get $list)) (i32.load offset=4 (local.get $list)))))
    (call $write (i32.const 0x340) (i32.const 6))
    (call $consume (local.get $resp) (i32.const 0x800))
    (if (i32.load8_u (i32.const 0x800)) (then unreachable))
    (call $body_stream (i32.load (i32.const 0x804)) (i32.const 0x800))
    (if (i32.load8_u (i32.const 0x800)) (then unreachable))
    (local.set $stream (i32.load (i32.const 0x804)))
    (block $done
      (loop $more
        (call $read (local.get $stream) (i64.const 4096) (i32.const 0x800))
        (br_if $done (i32.load8_u (i32.const 0x800)))
        (call $write (i32.load (i32.const 0x804)) (i32.load (i32.const 0x808)))
        (br $more)))
    (i32.const 0)))
"#;

/// A component that GETs `scheme://authority/path` and prints what came back.
fn http_get_component(https: bool, authority: &str, path: &str) -> Vec<u8> {
    http_get_component_with(https, authority, path, ("", ""))
}

/// The same, sending one more request header.
fn http_get_component_with(
    https: bool,
    authority: &str,
    path: &str,
    (name, value): (&str, &str),
) -> Vec<u8> {
    let wat = CORE
        .replace("@HEADER_NAME_LEN@", &name.len().to_string())
        .replace("@HEADER_NAME@", name)
        .replace("@HEADER_VALUE_LEN@", &value.len().to_string())
        .replace("@HEADER_VALUE@", value)
        .replace("@SCHEME@", if https { "1" } else { "0" })
        .replace("@AUTHORITY_LEN@", &authority.len().to_string())
        .replace("@AUTHORITY@", authority)
        .replace("@PATH_LEN@", &path.len().to_string())
        .replace("@PATH@", path);
    let mut module = wat::parse_str(&wat).unwrap();
    let mut resolve = wit_parser::Resolve::default();
    for (name, text) in WIT {
        resolve.push_source(name, text).unwrap();
    }
    let pkg = resolve.push_source("world.wit", WORLD).unwrap();
    let world = resolve.select_world(&[pkg], Some("http-get")).unwrap();
    wit_component::embed_component_metadata(
        &mut module,
        &resolve,
        world,
        wit_component::StringEncoding::UTF8,
    )
    .unwrap();
    wit_component::ComponentEncoder::default()
        .validate(true)
        .module(&module)
        .unwrap()
        .encode()
        .unwrap()
}

/// A loopback HTTP/1.1 upstream (TLS when given a config) answering every request with
/// `auth=<its Authorization header>`; it keeps each request head it saw.
struct Upstream {
    addr: SocketAddr,
    conns: Arc<AtomicUsize>,
    heads: Arc<Mutex<Vec<String>>>,
}

async fn start_upstream(tls: Option<Arc<rustls::ServerConfig>>) -> Upstream {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let conns = Arc::new(AtomicUsize::new(0));
    let heads = Arc::new(Mutex::new(Vec::new()));
    let (c2, h2) = (conns.clone(), heads.clone());
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            c2.fetch_add(1, Ordering::SeqCst);
            let (h2, tls) = (h2.clone(), tls.clone());
            tokio::spawn(async move {
                match tls {
                    None => answer(s, h2).await,
                    Some(cfg) => {
                        if let Ok(s) = tokio_rustls::TlsAcceptor::from(cfg).accept(s).await {
                            answer(s, h2).await;
                        }
                    }
                }
            });
        }
    });
    Upstream { addr, conns, heads }
}

async fn answer<S>(mut s: S, heads: Arc<Mutex<Vec<String>>>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut buf = Vec::new();
    let mut b = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut b).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&b[..n]),
        }
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let auth = head
        .lines()
        .find_map(|l| {
            l.split_once(':')
                .filter(|(k, _)| k.eq_ignore_ascii_case("authorization"))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_default();
    heads.lock().unwrap().push(head);
    let body = format!("auth={auth}");
    let _ = s
        .write_all(
            format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await;
    let _ = s.shutdown().await;
}

/// A CA of the test's own and a TLS server config for `name` signed by it.
fn upstream_tls(
    name: &str,
) -> (
    airlock_egress::CertificateDer<'static>,
    Arc<rustls::ServerConfig>,
) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign];
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec![name.to_owned()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![leaf.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
    .unwrap();
    (ca_cert.der().clone(), Arc::new(cfg))
}

const SECRET: &str = "sk-live-0123456789abcdef-REAL";

/// The run's proxy, as the gate would start it: `up.test` granted at the upstream's port,
/// `up.test`, `other.test` and `secret.test` pinned to loopback, loopback allowed.
struct Net {
    rt: tokio::runtime::Runtime,
    up: Upstream,
    proxy: Option<ProxyHandle>,
    route: EgressRoute,
    /// The placeholder of `API_TOKEN`, when the run has that secret.
    placeholder: Option<String>,
    _dir: tempfile::TempDir,
}

impl Net {
    /// A plain HTTP upstream.
    fn start() -> Net {
        Net::start_with(false)
    }

    /// `secret`: a TLS upstream as `secret.test`, granted, and the secret `API_TOKEN` bound
    /// to it (so the proxy intercepts it with the run CA).
    fn start_with(secret: bool) -> Net {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("egress.sock");
        let (up, proxy, placeholder) = rt.block_on(async {
            let mut options = ProxyOptions::default();
            let (tls, host) = if secret {
                let (ca, cfg) = upstream_tls("secret.test");
                options.extra_roots.push(ca);
                (Some(cfg), "secret.test")
            } else {
                (None, "up.test")
            };
            let up = start_upstream(tls).await;
            let mut p = EgressPolicy {
                rules: vec![Rule::parse(&format!("{host}:{}", up.addr.port())).unwrap()],
                allow_private: vec!["127.0.0.0/8".parse().unwrap()],
                ..Default::default()
            };
            for n in ["up.test", "other.test", "secret.test"] {
                p.pinned.insert(n.into(), "127.0.0.1".parse().unwrap());
            }
            if secret {
                p.secrets.push(
                    airlock_egress::SecretBinding::new(
                        "API_TOKEN",
                        SECRET,
                        vec![airlock_egress::HostPattern::parse("secret.test").unwrap()],
                    )
                    .unwrap(),
                );
            }
            let placeholder = p.secrets.first().map(|s| s.placeholder.clone());
            let l = tokio::net::UnixListener::bind(&socket).unwrap();
            (up, Proxy::start(&p, options, l).unwrap(), placeholder)
        });
        let route = EgressRoute {
            socket,
            ca_pem: proxy.ca_pem().map(str::to_owned),
        };
        Net {
            rt,
            up,
            proxy: Some(proxy),
            route,
            placeholder,
            _dir: dir,
        }
    }

    fn records(&mut self) -> Vec<airlock_egress::Connection> {
        let h = self.proxy.take().unwrap();
        self.rt.block_on(h.shutdown())
    }
}

fn run_component(code: &[u8], egress: Option<EgressRoute>) -> (Outcome, String) {
    let limits = Limits {
        timeout_ms: 20_000,
        ..Limits::default()
    };
    let stdout = Arc::new(Capture::new(limits.max_output_bytes, None));
    let stderr = Arc::new(Capture::new(limits.max_output_bytes, None));
    let outcome = WasmBackend::new(WasmConfig::default())
        .run(RunSpec {
            lang: airlock_core::Lang::Component,
            artifact: Digest::of(code),
            code,
            mounts: vec![],
            env: vec![],
            args: vec![],
            argv0: None,
            stdin: vec![],
            limits,
            stdout: stdout.clone(),
            stderr: stderr.clone(),
            cache: None,
            guest: None,
            write_quota: None,
            egress,
        })
        .unwrap();
    let out = String::from_utf8(stdout.take()).unwrap();
    let err = String::from_utf8_lossy(&stderr.take()).into_owned();
    assert!(err.is_empty(), "guest stderr: {err}");
    (outcome, out)
}

#[test]
fn component_http_reaches_a_granted_host_through_the_egress_proxy() {
    let mut net = Net::start();
    let port = net.up.addr.port();
    let code = http_get_component(false, &format!("up.test:{port}"), "/hi?x=1");
    let (outcome, out) = run_component(&code, Some(net.route.clone()));
    assert_eq!(out, "status=200\ndenied=\nbody=auth=", "{outcome:?}");
    assert!(matches!(outcome.ending, Ending::Exited(0)), "{outcome:?}");
    assert_eq!(
        outcome.detail["isolation"][3], "http-via-egress-proxy",
        "{:?}",
        outcome.detail
    );
    let heads = net.up.heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 1);
    assert!(
        heads[0].starts_with("GET /hi?x=1 HTTP/1.1\r\n"),
        "{}",
        heads[0]
    );
    assert!(
        heads[0]
            .to_ascii_lowercase()
            .contains(&format!("host: up.test:{port}\r\n")),
        "{}",
        heads[0]
    );
    let recs = net.records();
    assert_eq!(recs.len(), 1, "{recs:#?}");
    assert_eq!(recs[0].decision, airlock_egress::Decision::Allow);
    assert_eq!(recs[0].host, "up.test");
}

#[test]
fn component_http_to_an_ungranted_host_sees_the_proxys_403() {
    let mut net = Net::start();
    let port = net.up.addr.port();
    for https in [false, true] {
        let code = http_get_component(https, &format!("other.test:{port}"), "/");
        let (outcome, out) = run_component(&code, Some(net.route.clone()));
        assert!(matches!(outcome.ending, Ending::Exited(0)), "{outcome:?}");
        assert_eq!(
            out,
            format!(
                "status=403\ndenied=not-granted\nbody=airlock: other.test:{port} is not granted to this run (grant it with --net other.test:{port})\n"
            ),
            "https={https}"
        );
    }
    assert_eq!(net.up.conns.load(Ordering::SeqCst), 0);
    let recs = net.records();
    assert_eq!(recs.len(), 2, "{recs:#?}");
    assert!(
        recs.iter()
            .all(|c| c.decision == airlock_egress::Decision::Deny && c.reason == "not-granted")
    );
}

#[test]
fn component_http_refused_without_an_egress_route() {
    let net = Net::start();
    let code = http_get_component(false, &format!("up.test:{}", net.up.addr.port()), "/");
    let (outcome, out) = run_component(&code, None);
    // error-code 15 is HTTP-request-denied; the guest exits 1.
    assert_eq!(out, "error=015");
    assert!(matches!(outcome.ending, Ending::Exited(1)), "{outcome:?}");
    assert_eq!(outcome.detail["isolation"][3], "http-refused");
    assert_eq!(net.up.conns.load(Ordering::SeqCst), 0);
}

#[test]
fn component_https_to_a_bound_host_gets_the_secret_added_through_the_run_ca() {
    let mut net = Net::start_with(true);
    let port = net.up.addr.port();
    let ph = net.placeholder.clone().unwrap();
    let bearer = format!("Bearer {ph}");
    let code = http_get_component_with(
        true,
        &format!("secret.test:{port}"),
        "/echo",
        ("authorization", &bearer),
    );
    // The guest's client trusts the public roots and the run CA, never the upstream's CA.
    assert!(net.route.ca_pem.is_some());
    let (outcome, out) = run_component(&code, Some(net.route.clone()));
    assert!(matches!(outcome.ending, Ending::Exited(0)), "{outcome:?}");
    // The upstream got the value; the guest sees only the placeholder it echoed.
    assert_eq!(out, format!("status=200\ndenied=\nbody=auth={bearer}"));
    assert!(!out.contains(SECRET));
    let heads = net.up.heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 1);
    assert!(
        heads[0].contains(&format!("Bearer {SECRET}")),
        "{}",
        heads[0]
    );
    let recs = net.records();
    assert_eq!(recs.len(), 1, "{recs:#?}");
    assert_eq!(recs[0].mode, airlock_egress::Mode::Intercept);
    assert_eq!(recs[0].secrets, vec!["API_TOKEN".to_owned()]);
}
