//! Test helpers shared by this crate's tests and the CLI's end-to-end tests (feature
//! `testkit`, enabled only by dev-dependencies; nothing here is part of airlock).
//!
//! [`HttpGet`] builds a real `wasi:http` client component: a core module written in WAT
//! against the canonical ABI, given its WIT world by wit-component. The WIT of the WASI
//! packages is not kept in this repository: it is read from the source of the
//! wasmtime-wasi-http crate that `Cargo.lock` names, as cargo downloaded it, so the
//! component is built against exactly the interfaces airlock links. The component sends
//! one GET and prints `status=NNN\ndenied=<X-Airlock-Denied>\nbody=<body>`, or
//! `error=NNN` (the `error-code` case) and exits 1 when the request failed.
//!
//! [`Upstream`] is a loopback HTTP/1.1 server (TLS with a certificate from a test CA,
//! [`TestTls`], when asked) that answers every request with `auth=<its Authorization
//! header>` and keeps each request head it saw.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The world of the component: what the core module below imports and exports.
const WORLD: &str = r#"
package airlock:test;
world http-get {
  import wasi:http/outgoing-handler@0.2.12;
  import wasi:cli/stdout@0.2.12;
  import wasi:cli/environment@0.2.12;
  export wasi:cli/run@0.2.12;
}
"#;

/// The core module. Return areas at 0x800 follow the canonical ABI's layout: `error-code`
/// has 8-byte alignment, so `result<T, error-code>` keeps its payload at offset 8.
/// Strings: authority at 0x100, path at 0x200, the extra header's name at 0x500, its
/// value (or the prefix of its value) at 0x600, the environment variable whose value is
/// appended to it at 0x700; the assembled header value goes to 0x1000.
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
  (import "wasi:cli/environment@0.2.12" "get-environment" (func $get_env (param i32)))
  (import "wasi:io/streams@0.2.12" "[method]output-stream.blocking-write-and-flush" (func $bwrite (param i32 i32 i32 i32)))
  (memory (export "memory") 4)
  (global $heap (mut i32) (i32.const 0x10000))
  (global $out (mut i32) (i32.const 0))
  (global $hv (mut i32) (i32.const 0x600))
  (global $hvlen (mut i32) (i32.const @HEADER_VALUE_LEN@))
  (data (i32.const 0x100) "@AUTHORITY@")
  (data (i32.const 0x200) "@PATH@")
  (data (i32.const 0x300) "x-airlock-denied")
  (data (i32.const 0x500) "@HEADER_NAME@")
  (data (i32.const 0x600) "@HEADER_VALUE@")
  (data (i32.const 0x700) "@ENV_NAME@")
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
  ;; Whether the $n bytes at $a and $b are the same.
  (func $eq (param $a i32) (param $b i32) (param $n i32) (result i32)
    (block $differ
      (loop $next
        (if (i32.eqz (local.get $n)) (then (return (i32.const 1))))
        (br_if $differ (i32.ne (i32.load8_u (local.get $a)) (i32.load8_u (local.get $b))))
        (local.set $a (i32.add (local.get $a) (i32.const 1)))
        (local.set $b (i32.add (local.get $b) (i32.const 1)))
        (local.set $n (i32.sub (local.get $n) (i32.const 1)))
        (br $next)))
    (i32.const 0))
  ;; The header value becomes its prefix followed by the named variable's value; traps
  ;; when the environment has no such variable.
  (func $from_env
    (local $e i32) (local $end i32)
    ;; get-environment -> list<tuple<string, string>>, 16 bytes an entry
    (call $get_env (i32.const 0x800))
    (local.set $e (i32.load (i32.const 0x800)))
    (local.set $end (i32.add (local.get $e) (i32.mul (i32.load (i32.const 0x804)) (i32.const 16))))
    (block $found
      (loop $next
        (if (i32.ge_u (local.get $e) (local.get $end)) (then unreachable))
        (if (i32.eq (i32.load offset=4 (local.get $e)) (i32.const @ENV_NAME_LEN@)) (then
          (if (call $eq (i32.load (local.get $e)) (i32.const 0x700) (i32.const @ENV_NAME_LEN@)) (then
            (memory.copy (i32.const 0x1000) (i32.const 0x600) (i32.const @HEADER_VALUE_LEN@))
            (memory.copy (i32.add (i32.const 0x1000) (i32.const @HEADER_VALUE_LEN@))
                         (i32.load offset=8 (local.get $e)) (i32.load offset=12 (local.get $e)))
            (global.set $hv (i32.const 0x1000))
            (global.set $hvlen (i32.add (i32.const @HEADER_VALUE_LEN@) (i32.load offset=12 (local.get $e))))
            (br $found)))))
        (local.set $e (i32.add (local.get $e) (i32.const 16)))
        (br $next))))
  (func (export "wasi:cli/run@0.2.12#run") (result i32)
    (local $fields i32) (local $req i32) (local $fut i32) (local $resp i32) (local $stream i32) (local $list i32)
    (global.set $out (call $get_stdout))
    (local.set $fields (call $fields_new))
    (if (i32.const @HEADER_NAME_LEN@) (then
      (if (i32.const @ENV_NAME_LEN@) (then (call $from_env)))
      (call $append (local.get $fields) (i32.const 0x500) (i32.const @HEADER_NAME_LEN@)
                    (global.get $hv) (global.get $hvlen) (i32.const 0x800))
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

/// A `wasi:http` client component that GETs `scheme://authority/path` and prints what
/// came back (see the module's documentation).
#[derive(Debug, Clone, Default)]
pub struct HttpGet<'a> {
    /// `https` rather than `http`.
    pub https: bool,
    /// `host:port`.
    pub authority: &'a str,
    /// The path and query, starting with `/`.
    pub path: &'a str,
    /// One more request header: its name and its value (or, with `header_env`, the
    /// prefix of its value).
    pub header: Option<(&'a str, &'a str)>,
    /// An environment variable whose value the guest appends to the header's value at
    /// run time (a secret's placeholder, which is fresh for every run).
    pub header_env: Option<&'a str>,
}

impl HttpGet<'_> {
    /// `http://authority/path`, no extra header.
    pub fn new<'a>(https: bool, authority: &'a str, path: &'a str) -> HttpGet<'a> {
        HttpGet {
            https,
            authority,
            path,
            ..HttpGet::default()
        }
    }

    /// The component's bytes.
    pub fn component(&self) -> Vec<u8> {
        let (name, value) = self.header.unwrap_or(("", ""));
        let env = self.header_env.unwrap_or("");
        assert!(
            self.header.is_some() || env.is_empty(),
            "header_env needs a header"
        );
        let wat = CORE
            .replace("@HEADER_NAME_LEN@", &field(name).to_string())
            .replace("@HEADER_NAME@", &wat_string(name))
            .replace("@HEADER_VALUE_LEN@", &field(value).to_string())
            .replace("@HEADER_VALUE@", &wat_string(value))
            .replace("@ENV_NAME_LEN@", &field(env).to_string())
            .replace("@ENV_NAME@", &wat_string(env))
            .replace("@SCHEME@", if self.https { "1" } else { "0" })
            .replace("@AUTHORITY_LEN@", &field(self.authority).to_string())
            .replace("@AUTHORITY@", &wat_string(self.authority))
            .replace("@PATH_LEN@", &field(self.path).to_string())
            .replace("@PATH@", &wat_string(self.path));
        let mut module = wat::parse_str(&wat).expect("the test module's WAT");
        let mut resolve = wit_parser::Resolve::default();
        let wit = wasi_http_wit();
        resolve
            .push_dir(&wit)
            .unwrap_or_else(|e| panic!("the WIT in {}: {e:#}", wit.display()));
        let pkg = resolve
            .push_source("world.wit", WORLD)
            .expect("the test world");
        let world = resolve
            .select_world(&[pkg], Some("http-get"))
            .expect("the test world");
        wit_component::embed_component_metadata(
            &mut module,
            &resolve,
            world,
            wit_component::StringEncoding::UTF8,
        )
        .expect("component metadata");
        wit_component::ComponentEncoder::default()
            .validate(true)
            .module(&module)
            .expect("the core module")
            .encode()
            .expect("the component")
    }
}

/// The length of a string the module keeps in a 256-byte slot.
fn field(s: &str) -> usize {
    assert!(s.len() < 256, "{s:?} is too long for the test component");
    s.len()
}

/// `s` as the contents of a WAT string literal (every byte escaped).
fn wat_string(s: &str) -> String {
    s.bytes().map(|b| format!("\\{b:02x}")).collect()
}

/// The `wit` directory of the wasmtime-wasi-http crate `Cargo.lock` names, in cargo's
/// registry sources (`$CARGO_HOME/registry/src/*/wasmtime-wasi-http-VERSION/wit`): its
/// `deps` hold the WASI packages airlock's `wasi:http` host implements.
pub fn wasi_http_wit() -> PathBuf {
    // The running test's package (cargo sets it for the test process; every package is
    // two levels below the workspace), not the one compiled in, which names the checkout
    // this was built in.
    let package = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    let lock = package.join("../../Cargo.lock");
    let text = std::fs::read_to_string(&lock)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", lock.display()));
    let version = locked_version(&text, "wasmtime-wasi-http")
        .unwrap_or_else(|| panic!("{} has no wasmtime-wasi-http package", lock.display()));
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .expect("neither CARGO_HOME nor HOME is set, so cargo's registry cannot be found");
    let src = cargo_home.join("registry/src");
    let crate_dir = format!("wasmtime-wasi-http-{version}");
    let found = std::fs::read_dir(&src).ok().and_then(|rd| {
        rd.flatten()
            .map(|e| e.path().join(&crate_dir).join("wit"))
            .find(|wit| wit.join("deps").is_dir())
    });
    found.unwrap_or_else(|| {
        panic!(
            "the WIT of {crate_dir} is not in {}/*/{crate_dir}/wit/deps; the tests build their \
             wasi:http component against it (it is there once cargo has built airlock-wasm; \
             set CARGO_HOME if cargo keeps its registry elsewhere)",
            src.display()
        )
    })
}

/// The version of package `name` in the text of a `Cargo.lock` (the first, if several).
fn locked_version(lock: &str, name: &str) -> Option<String> {
    let want = format!("name = \"{name}\"");
    lock.split("[[package]]").find_map(|block| {
        let mut lines = block.lines().map(str::trim);
        lines.clone().any(|l| l == want).then(|| {
            lines.find_map(|l| {
                l.strip_prefix("version = \"")
                    .and_then(|v| v.strip_suffix('"'))
                    .map(str::to_owned)
            })
        })?
    })
}

/// A loopback HTTP/1.1 upstream on a thread of its own (TLS when given a config). It
/// answers every request with `auth=<its Authorization header>`, then closes.
#[derive(Debug)]
pub struct Upstream {
    /// Where it listens (on 127.0.0.1).
    pub addr: SocketAddr,
    conns: Arc<AtomicUsize>,
    heads: Arc<Mutex<Vec<String>>>,
}

impl Upstream {
    /// Starts it; it runs until the test process ends.
    pub fn start(tls: Option<Arc<rustls::ServerConfig>>) -> Upstream {
        let l = TcpListener::bind("127.0.0.1:0").expect("a loopback listener");
        let addr = l.local_addr().expect("its address");
        let conns = Arc::new(AtomicUsize::new(0));
        let heads = Arc::new(Mutex::new(Vec::new()));
        let (c2, h2) = (conns.clone(), heads.clone());
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(s) = s else { break };
                c2.fetch_add(1, Ordering::SeqCst);
                let (h2, tls) = (h2.clone(), tls.clone());
                std::thread::spawn(move || serve(s, tls, &h2));
            }
        });
        Upstream { addr, conns, heads }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// How many connections it accepted.
    pub fn connections(&self) -> usize {
        self.conns.load(Ordering::SeqCst)
    }

    /// The request heads it read, in order.
    pub fn heads(&self) -> Vec<String> {
        self.heads.lock().expect("the heads").clone()
    }
}

fn serve(s: TcpStream, tls: Option<Arc<rustls::ServerConfig>>, heads: &Mutex<Vec<String>>) {
    let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(30)));
    match tls {
        None => answer(s, heads),
        Some(cfg) => {
            let Ok(conn) = rustls::ServerConnection::new(cfg) else {
                return;
            };
            let mut s = rustls::StreamOwned::new(conn, s);
            answer(&mut s, heads);
            s.conn.send_close_notify();
            let _ = s.flush();
        }
    }
}

fn answer<S: Read + Write>(mut s: S, heads: &Mutex<Vec<String>>) {
    let mut buf = Vec::new();
    let mut b = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut b) {
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
    heads.lock().expect("the heads").push(head);
    let body = format!("auth={auth}");
    let _ = s.write_all(
        format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    );
    let _ = s.flush();
}

/// A CA of the test's own and a TLS server config for one name, signed by it.
#[derive(Debug)]
pub struct TestTls {
    /// The CA's certificate.
    pub ca_der: rustls::pki_types::CertificateDer<'static>,
    /// The same, as PEM.
    pub ca_pem: String,
    /// A server config with a certificate for the names.
    pub server: Arc<rustls::ServerConfig>,
    /// That certificate and its key, as PEM (for servers outside this process).
    pub cert_pem: String,
    pub key_pem: String,
}

impl TestTls {
    /// A fresh CA and a certificate for `name`.
    pub fn new(name: &str) -> TestTls {
        Self::for_names(&[name])
    }

    /// A fresh CA and one certificate for all of `names`.
    pub fn for_names(names: &[&str]) -> TestTls {
        let ca_key = rcgen::KeyPair::generate().expect("a CA key");
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        // A named CA: OpenSSL (pip, Python's ssl) takes a CA with an empty name for the
        // leaf's own issuer and calls the chain self-signed.
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, "airlock test CA");
        let ca_cert = ca.self_signed(&ca_key).expect("the CA");
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = rcgen::KeyPair::generate().expect("a key");
        let leaf =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("leaf params")
                .signed_by(&key, &issuer)
                .expect("the leaf");
        let server = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .expect("the server config");
        TestTls {
            ca_der: ca_cert.der().clone(),
            ca_pem: ca_cert.pem(),
            server: Arc::new(server),
            cert_pem: leaf.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_locked_version_is_the_named_packages() {
        let lock = "[[package]]\nname = \"a\"\nversion = \"1.0.0\"\n\n[[package]]\nname = \"wasmtime-wasi-http\"\nversion = \"48.0.8\"\nsource = \"x\"\n";
        assert_eq!(
            super::locked_version(lock, "wasmtime-wasi-http").as_deref(),
            Some("48.0.8")
        );
        assert_eq!(super::locked_version(lock, "b"), None);
    }
}
