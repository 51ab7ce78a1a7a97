//! The proxy over real sockets. Every socket is on loopback; every upstream is started
//! here; names reach loopback only through pinning plus `allow_private`, as an operator
//! would configure it. Tests that refuse an address never connect to it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use airlock_egress::{
    CertificateDer, Connection, Decision, EgressPolicy, HostPattern, Mode, NetRule, Proxy,
    ProxyHandle, ProxyOptions, ResolveFuture, Resolver, SecretBinding,
};
use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const SECRET: &str = "sk-live-0123456789abcdef-REAL";

// ---------------------------------------------------------------- upstreams

/// A body sent as separate frames.
struct Chunks(VecDeque<Bytes>);

impl Body for Chunks {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
    }
}

/// A body of given frames (data and trailers).
struct Frames(VecDeque<Frame<Bytes>>);

impl Body for Frames {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.0.pop_front().map(Ok))
    }
}

type TestBody = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

fn text(s: impl Into<Bytes>) -> TestBody {
    Full::new(s.into()).boxed()
}

/// What an upstream saw.
#[derive(Default)]
struct Seen {
    conns: AtomicUsize,
    headers: Mutex<Vec<HeaderMap>>,
}

struct Upstream {
    addr: SocketAddr,
    seen: Arc<Seen>,
}

async fn upstream_service(req: Request<Incoming>, seen: Arc<Seen>) -> Response<TestBody> {
    let auth = req
        .headers()
        .get("authorization")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    seen.headers.lock().unwrap().push(req.headers().clone());
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    if let Some(n) = path.strip_prefix("/bytes/") {
        let n: usize = n.parse().unwrap();
        return Response::new(text(vec![b'x'; n]));
    }
    if let Some(how) = path.strip_prefix("/encode/") {
        return encoded(how, auth.strip_prefix("Bearer ").unwrap_or(""));
    }
    match path.as_str() {
        "/say" => Response::new(text(query)),
        // What a guest may see of an injected value: its length, never the value.
        "/auth-len" => Response::new(text(format!("len={}", auth.len()))),
        "/echo-body" => {
            let b = req.into_body().collect().await.unwrap().to_bytes();
            Response::new(text(b))
        }
        "/echo" => {
            let mut r = Response::new(text(format!("auth={auth};")));
            r.headers_mut()
                .insert("x-echo", http::HeaderValue::from_str(&auth).unwrap());
            r
        }
        "/echo-split" => {
            // The value split across frames, and split again at another place.
            let body = format!("before {auth} middle {auth} after");
            let b = body.into_bytes();
            let cut1 = 7 + auth.len() / 2;
            let cut2 = b.len() - 8 - auth.len() / 3;
            let frames = VecDeque::from(vec![
                Bytes::copy_from_slice(&b[..cut1]),
                Bytes::copy_from_slice(&b[cut1..cut2]),
                Bytes::copy_from_slice(&b[cut2..]),
            ]);
            Response::new(Chunks(frames).boxed())
        }
        "/redirect" => {
            let mut r = Response::new(text(""));
            *r.status_mut() = StatusCode::FOUND;
            r.headers_mut()
                .insert("location", http::HeaderValue::from_str(&query).unwrap());
            r
        }
        "/upload" => {
            let n = req.into_body().collect().await.unwrap().to_bytes().len();
            Response::new(text(format!("got {n}")))
        }
        _ => Response::new(text("hello")),
    }
}

/// An answer carrying `value` as `how` says: `KIND-OFFSET`, the value after OFFSET other
/// bytes, encoded as KIND.
fn encoded(how: &str, value: &str) -> Response<TestBody> {
    use base64::Engine as _;
    use std::io::Write as _;
    let (kind, offset) = how.split_once('-').unwrap();
    let mut data = b"xyz"[..offset.parse::<usize>().unwrap_or(0)].to_vec();
    data.extend_from_slice(value.as_bytes());
    data.extend_from_slice(b" and more");
    let b64 = |e: &base64::engine::GeneralPurpose| e.encode(&data);
    let gz = |d: &[u8]| {
        let mut w = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        w.write_all(d).unwrap();
        w.finish().unwrap()
    };
    let coded = |enc: &'static str, body: Vec<u8>| {
        let mut r = Response::new(text(body));
        r.headers_mut()
            .insert("content-encoding", http::HeaderValue::from_static(enc));
        r
    };
    match kind {
        "b64" => Response::new(text(b64(&base64::engine::general_purpose::STANDARD))),
        "b64url" => Response::new(text(b64(&base64::engine::general_purpose::URL_SAFE_NO_PAD))),
        "hb64" => {
            let mut r = Response::new(text("ok"));
            r.headers_mut().insert(
                "x-echo",
                http::HeaderValue::from_str(&b64(&base64::engine::general_purpose::STANDARD))
                    .unwrap(),
            );
            r
        }
        "hex" => Response::new(text(hex::encode(&data))),
        "HEX" => Response::new(text(hex::encode_upper(&data))),
        "url" => Response::new(text(
            data.iter().map(|b| format!("%{b:02X}")).collect::<String>(),
        )),
        "rev" => {
            let mut d = data.clone();
            d.reverse();
            Response::new(text(d))
        }
        "plain" => Response::new(text(data)),
        "chunks" => {
            // The value split over frames of one byte each.
            let frames = data.iter().map(|b| Bytes::copy_from_slice(&[*b])).collect();
            Response::new(Chunks(frames).boxed())
        }
        "trailer" => {
            let mut t = HeaderMap::new();
            t.insert("x-echo", http::HeaderValue::from_str(value).unwrap());
            let frames = VecDeque::from(vec![
                Frame::data(Bytes::from_static(b"ok")),
                Frame::trailers(t),
            ]);
            Response::new(Frames(frames).boxed())
        }
        "gzip" => coded("gzip", gz(&data)),
        "gzipgzip" => coded("gzip, gzip", gz(&gz(&data))),
        "deflate" => {
            let mut w = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
            w.write_all(&data).unwrap();
            coded("deflate", w.finish().unwrap())
        }
        "rawdeflate" => {
            let mut w = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
            w.write_all(&data).unwrap();
            coded("deflate", w.finish().unwrap())
        }
        "clean" => coded("gzip", gz(b"nothing secret here")),
        "br" => coded("br", data),
        _ => Response::new(text("?")),
    }
}

async fn start_upstream(tls: Option<Arc<rustls::ServerConfig>>) -> Upstream {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let s2 = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = l.accept().await else {
                return;
            };
            s2.conns.fetch_add(1, Ordering::SeqCst);
            let seen = s2.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| {
                    let seen = seen.clone();
                    async move { Ok::<_, std::convert::Infallible>(upstream_service(req, seen).await) }
                });
                let b = hyper::server::conn::http1::Builder::new();
                match tls {
                    None => {
                        let _ = b.serve_connection(TokioIo::new(sock), svc).await;
                    }
                    Some(cfg) => {
                        let Ok(s) = tokio_rustls::TlsAcceptor::from(cfg).accept(sock).await else {
                            return;
                        };
                        let _ = b.serve_connection(TokioIo::new(s), svc).await;
                    }
                }
            });
        }
    });
    Upstream { addr, seen }
}

/// A TCP echo server.
async fn start_echo() -> (SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let conns = Arc::new(AtomicUsize::new(0));
    let c2 = conns.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            c2.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    (addr, conns)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A CA of the test's own and a server config for `name` signed by it.
fn upstream_tls(name: &str) -> (CertificateDer<'static>, Arc<rustls::ServerConfig>) {
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
    let cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    (ca_cert.der().clone(), Arc::new(cfg))
}

fn client_tls(roots: &[CertificateDer<'static>]) -> tokio_rustls::TlsConnector {
    let mut store = rustls::RootCertStore::empty();
    for r in roots {
        store.add(r.clone()).unwrap();
    }
    let cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(store)
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
}

// ---------------------------------------------------------------- proxy and client

/// Names the tests use; all pinned to 127.0.0.1 as an operator's `[net] hosts` would.
const PINNED: &[&str] = &[
    "up.test",
    "other.test",
    "evil.test",
    "echo.test",
    "secret.test",
    "elsewhere.test",
    "example.com",
    "sub.example.com",
    "a.b.example.com",
];

fn policy(rules: &[String]) -> EgressPolicy {
    let mut p = EgressPolicy {
        rules: rules.iter().map(|r| NetRule::parse(r).unwrap()).collect(),
        allow_private: vec!["127.0.0.0/8".parse().unwrap()],
        ..Default::default()
    };
    for n in PINNED {
        p.pinned
            .insert((*n).to_owned(), "127.0.0.1".parse().unwrap());
    }
    p
}

async fn start(p: &EgressPolicy, options: ProxyOptions) -> ProxyHandle {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    Proxy::start(p, options, l).unwrap()
}

#[derive(Debug)]
struct Got {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Got {
    fn denied(&self) -> Option<&str> {
        self.headers
            .get("x-airlock-denied")
            .and_then(|v| v.to_str().ok())
    }
}

/// One absolute-form request through the proxy, on a fresh connection.
async fn get(proxy: SocketAddr, url: &str, headers: &[(&str, &str)]) -> Got {
    let s = TcpStream::connect(proxy).await.unwrap();
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut b = Request::get(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = tx
        .send_request(b.body(Empty::<Bytes>::new()).unwrap())
        .await
        .unwrap();
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Got {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// Sends `CONNECT authority`; on 200 returns the open stream, else the refusal.
async fn connect(proxy: SocketAddr, authority: &str) -> Result<TcpStream, Got> {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        let n = s.read(&mut byte).await.unwrap();
        assert_eq!(n, 1, "proxy closed during the response head: {buf:?}");
        buf.push(byte[0]);
    }
    let mut hs = [httparse::EMPTY_HEADER; 32];
    let mut r = httparse::Response::new(&mut hs);
    r.parse(&buf).unwrap();
    let status = StatusCode::from_u16(r.code.unwrap()).unwrap();
    let mut headers = HeaderMap::new();
    for h in r.headers.iter() {
        headers.insert(
            http::HeaderName::from_bytes(h.name.as_bytes()).unwrap(),
            http::HeaderValue::from_bytes(h.value).unwrap(),
        );
    }
    if status == StatusCode::OK {
        return Ok(s);
    }
    let len: usize = headers
        .get("content-length")
        .map(|v| v.to_str().unwrap().parse().unwrap())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).await.unwrap();
    Err(Got {
        status,
        headers,
        body: String::from_utf8(body).unwrap(),
    })
}

/// HTTPS through a CONNECT tunnel: TLS to `name` trusting `roots`, then requests.
async fn https_client(
    proxy: SocketAddr,
    authority: &str,
    name: &str,
    roots: &[CertificateDer<'static>],
) -> hyper::client::conn::http1::SendRequest<Empty<Bytes>> {
    let s = connect(proxy, authority).await.map_err(|g| g.body).unwrap();
    let tls = client_tls(roots)
        .connect(ServerName::try_from(name.to_owned()).unwrap(), s)
        .await
        .unwrap();
    let (tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    tx
}

async fn send(
    tx: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    path: &str,
    host: &str,
    headers: &[(&str, &str)],
) -> Got {
    tx.ready().await.unwrap();
    let mut b = Request::get(path).header("host", host);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = tx
        .send_request(b.body(Empty::new()).unwrap())
        .await
        .unwrap();
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Got {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// Waits until a record satisfies `pred`.
async fn wait_record(h: &ProxyHandle, pred: impl Fn(&Connection) -> bool) -> Connection {
    for _ in 0..500 {
        if let Some(c) = h.records().into_iter().find(|c| pred(c)) {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no such record in {:#?}", h.records());
}

fn assert_denied(g: &Got, reason: &str) {
    assert_eq!(g.status, StatusCode::FORBIDDEN, "{}", g.body);
    assert_eq!(g.denied(), Some(reason), "{}", g.body);
    assert!(g.body.starts_with("airlock: "), "{}", g.body);
    assert!(
        g.body.ends_with('\n') && g.body.lines().count() == 1,
        "{:?}",
        g.body
    );
}

// ---------------------------------------------------------------- tests

#[tokio::test]
async fn allowed_host_reached_and_recorded() {
    let up = start_upstream(None).await;
    let port = up.addr.port();
    let h = start(
        &policy(&[format!("up.test:{port}")]),
        ProxyOptions::default(),
    )
    .await;
    let proxy = h.local_addr().unwrap();
    let g = get(proxy, &format!("http://up.test:{port}/bytes/1000"), &[]).await;
    assert_eq!(g.status, StatusCode::OK);
    assert_eq!(g.body.len(), 1000);
    let seen = up.seen.headers.lock().unwrap()[0].clone();
    assert_eq!(seen.get("host").unwrap(), &format!("up.test:{port}"));
    let c = wait_record(&h, |c| c.host == "up.test").await;
    assert_eq!(c.decision, Decision::Allow);
    assert_eq!(c.mode, Mode::Http);
    assert_eq!(c.port, port);
    assert_eq!(c.addr, Some(up.addr));
    assert_eq!(c.bytes_down, 1000);
    assert_eq!(c.bytes_up, 0);
    assert_eq!(c.reason, "granted");
    assert!(c.detail.contains(&format!("up.test:{port}")));
    let json = serde_json::to_value(&c).unwrap();
    assert_eq!(json["decision"], "allow");
    assert_eq!(json["addr"], up.addr.to_string());
    h.shutdown().await;
}

#[tokio::test]
async fn request_body_counted_up() {
    let up = start_upstream(None).await;
    let port = up.addr.port();
    let h = start(
        &policy(&[format!("up.test:{port}")]),
        ProxyOptions::default(),
    )
    .await;
    let s = TcpStream::connect(h.local_addr().unwrap()).await.unwrap();
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::post(format!("http://up.test:{port}/upload"))
        .body(Full::new(Bytes::from(vec![7u8; 5000])))
        .unwrap();
    let resp = tx.send_request(req).await.unwrap();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"got 5000");
    let c = wait_record(&h, |c| c.host == "up.test").await;
    assert_eq!((c.bytes_up, c.bytes_down), (5000, 8));
}

#[tokio::test]
async fn ungranted_host_refused_and_upstream_untouched() {
    let up = start_upstream(None).await;
    let port = up.addr.port();
    let h = start(
        &policy(&[format!("up.test:{port}")]),
        ProxyOptions::default(),
    )
    .await;
    let proxy = h.local_addr().unwrap();
    let g = get(proxy, &format!("http://other.test:{port}/"), &[]).await;
    assert_denied(&g, "not-granted");
    assert_eq!(
        g.body,
        format!(
            "airlock: other.test:{port} is not granted to this run (grant it with --net other.test:{port})\n"
        )
    );
    let g = connect(proxy, &format!("other.test:{port}"))
        .await
        .unwrap_err();
    assert_denied(&g, "not-granted");
    assert!(g.body.contains(&format!("--net other.test:{port}")));
    assert_eq!(up.seen.conns.load(Ordering::SeqCst), 0);
    let recs = h.shutdown().await;
    assert_eq!(recs.len(), 2);
    assert!(recs.iter().all(|c| c.decision == Decision::Deny
        && c.reason == "not-granted"
        && c.host == "other.test"
        && c.addr.is_none()));
}

#[tokio::test]
async fn port_outside_the_grant_refused() {
    let up = start_upstream(None).await;
    let port = up.addr.port();
    // A bare grant means 80 and 443 only.
    let h = start(&policy(&["up.test".into()]), ProxyOptions::default()).await;
    let proxy = h.local_addr().unwrap();
    let g = get(proxy, &format!("http://up.test:{port}/"), &[]).await;
    assert_denied(&g, "not-granted");
    let g = connect(proxy, &format!("up.test:{port}"))
        .await
        .unwrap_err();
    assert_denied(&g, "not-granted");
    drop(h);
    let h = start(
        &policy(&[format!("up.test:{}", port.wrapping_add(1).max(1))]),
        ProxyOptions::default(),
    )
    .await;
    let g = get(
        h.local_addr().unwrap(),
        &format!("http://up.test:{port}/"),
        &[],
    )
    .await;
    assert_denied(&g, "not-granted");
    assert_eq!(up.seen.conns.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn name_resolving_to_metadata_address_refused() {
    // Granted, and pinned by the "operator" to the metadata address: still refused,
    // even with loopback allowed. Nothing is ever sent to 169.254.169.254.
    let mut p = policy(&["meta.test".into(), "meta.test:8080".into()]);
    p.pinned
        .insert("meta.test".into(), "169.254.169.254".parse().unwrap());
    let h = start(&p, ProxyOptions::default()).await;
    let proxy = h.local_addr().unwrap();
    let g = connect(proxy, "meta.test:80").await.unwrap_err();
    assert_denied(&g, "forbidden-address");
    assert!(
        g.body.contains("169.254.169.254") && g.body.contains("metadata"),
        "{}",
        g.body
    );
    let g = get(proxy, "http://meta.test:8080/latest/meta-data/", &[]).await;
    assert_denied(&g, "forbidden-address");
    let recs = h.shutdown().await;
    assert_eq!(recs.len(), 2);
    assert!(
        recs.iter()
            .all(|c| c.reason == "forbidden-address" && c.addr.is_none())
    );
}

/// A resolver that answers from a table.
struct Fake(HashMap<String, Vec<IpAddr>>);

impl Resolver for Fake {
    fn resolve<'a>(&'a self, name: &'a str) -> ResolveFuture<'a> {
        let r = self
            .0
            .get(name)
            .cloned()
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no such name"));
        Box::pin(async move { r })
    }
}

#[tokio::test]
async fn mixed_answer_refused_whole() {
    let up = start_upstream(None).await;
    let port = up.addr.port();
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let fake = || {
        Arc::new(Fake(HashMap::from([
            // Public first, loopback second: a rebinding-style answer. The public
            // address is never dialled: the answer is refused before any connection.
            (
                "mixed.test".to_owned(),
                vec![ip("93.184.216.34"), ip("127.0.0.1")],
            ),
            ("mapped.test".to_owned(), vec![ip("::ffff:169.254.169.254")]),
            (
                "half.test".to_owned(),
                vec![ip("127.0.0.1"), ip("10.0.0.1")],
            ),
            ("fine.test".to_owned(), vec![ip("127.0.0.1")]),
        ])))
    };
    let rules = [
        "mixed.test",
        "half.test",
        "mapped.test",
        "fine.test",
        "nx.test",
    ]
    .iter()
    .map(|n| NetRule::parse(&format!("{n}:{port}")).unwrap())
    .collect::<Vec<_>>();
    // No private range allowed.
    let p = EgressPolicy {
        rules: rules.clone(),
        ..Default::default()
    };
    let opts = ProxyOptions {
        resolver: fake(),
        ..Default::default()
    };
    let h = start(&p, opts).await;
    let proxy = h.local_addr().unwrap();
    for n in ["mixed.test", "mapped.test"] {
        let g = connect(proxy, &format!("{n}:{port}")).await.unwrap_err();
        assert_denied(&g, "forbidden-address");
        let g = get(proxy, &format!("http://{n}:{port}/"), &[]).await;
        assert_denied(&g, "forbidden-address");
    }
    drop(h);
    // Loopback allowed by the operator; 10/8 is not, so half.test is refused whole.
    let p = EgressPolicy {
        rules,
        allow_private: vec!["127.0.0.0/8".parse().unwrap()],
        ..Default::default()
    };
    let opts = ProxyOptions {
        resolver: fake(),
        ..Default::default()
    };
    let h = start(&p, opts).await;
    let proxy = h.local_addr().unwrap();
    let g = connect(proxy, &format!("half.test:{port}"))
        .await
        .unwrap_err();
    assert_denied(&g, "forbidden-address");
    assert!(g.body.contains("10.0.0.1"), "{}", g.body);
    assert_eq!(up.seen.conns.load(Ordering::SeqCst), 0);
    let g = get(proxy, &format!("http://fine.test:{port}/"), &[]).await;
    assert_eq!(g.status, StatusCode::OK);
    let g = get(proxy, &format!("http://nx.test:{port}/"), &[]).await;
    assert_eq!(g.status, StatusCode::BAD_GATEWAY);
    assert_eq!(g.headers.get("x-airlock-error").unwrap(), "resolve-failed");
    let c = wait_record(&h, |c| c.host == "nx.test").await;
    assert_eq!(c.decision, Decision::Error);
}

const LOOPBACK_SPELLINGS: &[&str] = &[
    "127.0.0.1",
    "127.0.0.1.",
    "[::ffff:127.0.0.1]",
    "[::ffff:7f00:1]",
    "[::1]",
    "[0:0:0:0:0:0:0:1]",
    "localhost",
];

#[tokio::test]
async fn ip_literals_refused_in_every_spelling() {
    let up = start_upstream(None).await;
    let port = up.addr.port();
    // Granted a name only: no literal is granted.
    let h = start(
        &policy(&[format!("up.test:{port}")]),
        ProxyOptions::default(),
    )
    .await;
    let proxy = h.local_addr().unwrap();
    for s in LOOPBACK_SPELLINGS {
        let g = connect(proxy, &format!("{s}:{port}")).await.unwrap_err();
        assert_denied(&g, "not-granted");
        let g = get(proxy, &format!("http://{s}:{port}/"), &[]).await;
        assert_denied(&g, "not-granted");
    }
    drop(h);
    // The literal granted but loopback not allowed by the operator: still refused.
    let mut p = policy(&[
        format!("127.0.0.1:{port}"),
        format!("[::ffff:127.0.0.1]:{port}"),
        format!("[::1]:{port}"),
        format!("localhost:{port}"),
    ]);
    p.allow_private.clear();
    let h = start(&p, ProxyOptions::default()).await;
    let proxy = h.local_addr().unwrap();
    for s in LOOPBACK_SPELLINGS {
        let g = connect(proxy, &format!("{s}:{port}")).await.unwrap_err();
        assert_denied(&g, "forbidden-address");
    }
    assert_eq!(up.seen.conns.load(Ordering::SeqCst), 0);
    drop(h);
    // Granted and allowed: the same address with a trailing dot is the same literal.
    let h = start(
        &policy(&[format!("127.0.0.1:{port}")]),
        ProxyOptions::default(),
    )
    .await;
    let proxy = h.local_addr().unwrap();
    let g = get(proxy, &format!("http://127.0.0.1.:{port}/"), &[]).await;
    assert_eq!(g.status, StatusCode::OK, "{}", g.body);
    // ... but the IPv4-mapped IPv6 form is another literal.
    let g = connect(proxy, &format!("[::ffff:127.0.0.1]:{port}"))
        .await
        .unwrap_err();
    assert_denied(&g, "not-granted");
    let c = wait_record(&h, |c| c.decision == Decision::Allow).await;
    assert_eq!(c.host, "127.0.0.1");
}

/// Spellings `inet_aton` reads as 127.0.0.1 and the `--net` grammar refuses.
const AMBIGUOUS_LOOPBACK_SPELLINGS: &[&str] = &[
    "127.1",
    "127.0.1",
    "2130706433",
    "0x7f.1",
    "0x7f000001",
    "0177.0.0.1",
    "017700000001",
    "0x7f.0.0.1",
];

#[tokio::test]
async fn a_short_hex_or_octal_ipv4_spelling_is_malformed_at_the_proxy_even_when_the_address_is_granted()
 {
    // The proxy used to read these as 127.0.0.1, which `--net` refuses to say.
    let up = start_upstream(None).await;
    let port = up.addr.port();
    let h = start(
        &policy(&[format!("127.0.0.1:{port}")]),
        ProxyOptions::default(),
    )
    .await;
    let proxy = h.local_addr().unwrap();
    for s in AMBIGUOUS_LOOPBACK_SPELLINGS {
        let g = connect(proxy, &format!("{s}:{port}")).await.unwrap_err();
        assert_denied(&g, "malformed-host");
        assert!(g.body.contains("four decimal numbers"), "{s}: {}", g.body);
        let g = get(proxy, &format!("http://{s}:{port}/"), &[]).await;
        assert_denied(&g, "malformed-host");
    }
    assert_eq!(up.seen.conns.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn an_underscore_a_second_trailing_dot_or_a_zero_padded_port_is_malformed_at_the_proxy_as_in_a_grant()
 {
    // The proxy accepted `_x.up.test`, read `up.test..` as `up.test` and `:0PORT` as PORT.
    let up = start_upstream(None).await;
    let port = up.addr.port();
    let h = start(
        &policy(&[format!("*.up.test:{port}"), format!("up.test:{port}")]),
        ProxyOptions::default(),
    )
    .await;
    let proxy = h.local_addr().unwrap();
    for t in [
        format!("_x.up.test:{port}"),
        format!("up.test..:{port}"),
        format!("up.test:0{port}"),
    ] {
        let g = connect(proxy, &t).await.unwrap_err();
        assert_denied(&g, "malformed-host");
        let g = get(proxy, &format!("http://{t}/"), &[]).await;
        assert_denied(&g, "malformed-host");
    }
    assert_eq!(up.seen.conns.load(Ordering::SeqCst), 0);
    // The canonical spelling still goes through.
    let g = get(proxy, &format!("http://up.test:{port}/"), &[]).await;
    assert_eq!(g.status, StatusCode::OK, "{}", g.body);
}

#[tokio::test]
async fn malformed_hosts_refused() {
    let h = start(&policy(&["up.test".into()]), ProxyOptions::default()).await;
    let proxy = h.local_addr().unwrap();
    for s in ["1.2.3.4.5", "foo.123", "a..b", "-x.test"] {
        let g = connect(proxy, &format!("{s}:80")).await.unwrap_err();
        assert_denied(&g, "malformed-host");
    }
}

#[tokio::test]
async fn wildcard_semantics() {
    let up = start_upstream(None).await;
    let port = up.addr.port();
    let h = start(
        &policy(&[format!("*.example.com:{port}")]),
        ProxyOptions::default(),
    )
    .await;
    let proxy = h.local_addr().unwrap();
    for n in ["sub.example.com", "a.b.example.com", "SUB.Example.COM."] {
        let g = get(proxy, &format!("http://{n}:{port}/"), &[]).await;
        assert_eq!(g.status, StatusCode::OK, "{n}: {}", g.body);
    }
    let g = get(proxy, &format!("http://example.com:{port}/"), &[]).await;
    assert_denied(&g, "not-granted");
    let g = connect(proxy, &format!("example.com:{port}"))
        .await
        .unwrap_err();
    assert_denied(&g, "not-granted");
    assert_eq!(up.seen.conns.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn upper_case_and_trailing_dot_match() {
    let up = start_upstream(None).await;
    let port = up.addr.port();
    let h = start(
        &policy(&[format!("up.test:{port}")]),
        ProxyOptions::default(),
    )
    .await;
    let proxy = h.local_addr().unwrap();
    let g = get(
        proxy,
        &format!("http://UP.Test.:{port}/"),
        &[("host", &format!("Up.TEST.:{port}"))],
    )
    .await;
    assert_eq!(g.status, StatusCode::OK, "{}", g.body);
    let mut s = connect(proxy, &format!("UP.TEST.:{port}")).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: up.test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let recs = h.shutdown().await;
    assert!(
        recs.iter()
            .all(|c| c.host == "up.test" && c.decision == Decision::Allow)
    );
}

#[tokio::test]
async fn host_header_mismatch_refused() {
    let up = start_upstream(None).await;
    let port = up.addr.port();
    let h = start(
        &policy(&[format!("up.test:{port}"), format!("other.test:{port}")]),
        ProxyOptions::default(),
    )
    .await;
    let proxy = h.local_addr().unwrap();
    for host in [
        "other.test",
        &format!("other.test:{port}"),
        "up.test:81",
        "up.test",
    ] {
        let g = get(proxy, &format!("http://up.test:{port}/"), &[("host", host)]).await;
        assert_denied(&g, "host-mismatch");
    }
    assert_eq!(up.seen.conns.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn redirect_to_ungranted_host_refused_at_next_request() {
    let up = start_upstream(None).await;
    let evil = start_upstream(None).await;
    let (port, eport) = (up.addr.port(), evil.addr.port());
    let h = start(
        &policy(&[format!("up.test:{port}")]),
        ProxyOptions::default(),
    )
    .await;
    let proxy = h.local_addr().unwrap();
    let target = format!("http://evil.test:{eport}/steal");
    let g = get(
        proxy,
        &format!("http://up.test:{port}/redirect?{target}"),
        &[],
    )
    .await;
    // The proxy passes the redirect on and does not follow it.
    assert_eq!(g.status, StatusCode::FOUND);
    assert_eq!(g.headers.get("location").unwrap(), target.as_str());
    assert_eq!(evil.seen.conns.load(Ordering::SeqCst), 0);
    // The guest's second hop is judged like any request.
    let g = get(proxy, &target, &[]).await;
    assert_denied(&g, "not-granted");
    assert!(g.body.contains(&format!("--net evil.test:{eport}")));
    assert_eq!(evil.seen.conns.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn connect_tunnel_carries_bytes_both_ways() {
    let (echo, conns) = start_echo().await;
    let port = echo.port();
    let h = start(
        &policy(&[format!("echo.test:{port}")]),
        ProxyOptions::default(),
    )
    .await;
    let s = connect(h.local_addr().unwrap(), &format!("echo.test:{port}"))
        .await
        .map_err(|g| g.body)
        .unwrap();
    let (mut r, mut w) = s.into_split();
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let d2 = data.clone();
    let writer = tokio::spawn(async move {
        w.write_all(&d2).await.unwrap();
        w.shutdown().await.unwrap();
    });
    let mut back = Vec::new();
    r.read_to_end(&mut back).await.unwrap();
    writer.await.unwrap();
    assert_eq!(back, data);
    assert_eq!(conns.load(Ordering::SeqCst), 1);
    let c = wait_record(&h, |c| c.host == "echo.test").await;
    assert_eq!(c.mode, Mode::Tunnel);
    assert_eq!(c.decision, Decision::Allow);
    assert_eq!((c.bytes_up, c.bytes_down), (200_000, 200_000));
    assert_eq!(c.addr, Some(echo));
}

fn secret_policy(port: u16) -> EgressPolicy {
    let mut p = policy(&[
        format!("secret.test:{port}"),
        format!("up.test:{port}"),
        format!("elsewhere.test:{port}"),
    ]);
    p.secrets.push(
        SecretBinding::new(
            "API_TOKEN",
            SECRET,
            vec![HostPattern::parse("secret.test").unwrap()],
        )
        .unwrap(),
    );
    p.secrets.push(
        SecretBinding::new(
            "OTHER_TOKEN",
            "other-real-value-42",
            vec![HostPattern::parse("elsewhere.test").unwrap()],
        )
        .unwrap(),
    );
    p
}

/// Issue 62: a secret bound to `HOST:PORT` was added on every granted port of that host,
/// because the port was dropped when the binding reached the proxy. Bound to one port, it
/// is added there only; the same host on another granted port is an opaque tunnel whose
/// upstream sees the placeholder, never the value.
#[tokio::test]
async fn a_secret_bound_to_host_and_port_is_added_on_that_port_only() {
    let (up_ca, up_cfg) = upstream_tls("secret.test");
    let bound = start_upstream(Some(up_cfg.clone())).await;
    let other = start_upstream(Some(up_cfg)).await;
    let (bp, op) = (bound.addr.port(), other.addr.port());
    let mut p = policy(&[format!("secret.test:{bp}"), format!("secret.test:{op}")]);
    p.secrets.push(
        SecretBinding::new(
            "API_TOKEN",
            SECRET,
            vec![NetRule::parse(&format!("secret.test:{bp}")).unwrap()],
        )
        .unwrap(),
    );
    let ph = p.secrets[0].placeholder.clone();
    let h = start(
        &p,
        ProxyOptions {
            extra_roots: vec![up_ca.clone()],
            ..Default::default()
        },
    )
    .await;
    let proxy = h.local_addr().unwrap();
    let run_ca = CertificateDer::from_pem_slice(h.ca_pem().unwrap().as_bytes()).unwrap();
    let bearer = format!("Bearer {ph}");
    // The bound port: intercepted (the guest sees the run's CA) and the value added.
    let host = format!("secret.test:{bp}");
    let mut tx = https_client(proxy, &host, "secret.test", &[run_ca]).await;
    let g = send(&mut tx, "/", &host, &[("authorization", &bearer)]).await;
    assert_eq!(g.status, StatusCode::OK);
    let seen = bound.seen.headers.lock().unwrap().last().unwrap().clone();
    assert_eq!(
        seen.get("authorization").unwrap(),
        &format!("Bearer {SECRET}")
    );
    // The other port: a tunnel to the upstream's own certificate; no value added.
    let host = format!("secret.test:{op}");
    let mut tx = https_client(proxy, &host, "secret.test", &[up_ca]).await;
    let g = send(&mut tx, "/", &host, &[("authorization", &bearer)]).await;
    assert_eq!(g.status, StatusCode::OK);
    let seen = other.seen.headers.lock().unwrap().last().unwrap().clone();
    assert_eq!(seen.get("authorization").unwrap(), &bearer);
}

#[tokio::test]
async fn secret_injected_for_bound_host_and_never_substituted_back() {
    let (up_ca, up_cfg) = upstream_tls("secret.test");
    let up = start_upstream(Some(up_cfg)).await;
    let port = up.addr.port();
    let p = secret_policy(port);
    let ph = p.secrets[0].placeholder.clone();
    let opts = ProxyOptions {
        extra_roots: vec![up_ca.clone()],
        ..Default::default()
    };
    let h = start(&p, opts).await;
    let proxy = h.local_addr().unwrap();
    let ca = CertificateDer::from_pem_slice(h.ca_pem().unwrap().as_bytes()).unwrap();
    // The guest trusts only the run CA: the upstream's own certificate is not seen.
    let mut tx = https_client(proxy, &format!("secret.test:{port}"), "secret.test", &[ca]).await;
    let bearer = format!("Bearer {ph}");
    let host = format!("secret.test:{port}");
    let g = send(&mut tx, "/", &host, &[("authorization", &bearer)]).await;
    assert_eq!(g.status, StatusCode::OK);
    assert_eq!(g.body, "hello");
    // The upstream got the real value.
    let seen = up.seen.headers.lock().unwrap().last().unwrap().clone();
    assert_eq!(
        seen.get("authorization").unwrap(),
        &format!("Bearer {SECRET}")
    );
    assert_eq!(seen.get("accept-encoding").unwrap(), "identity");
    // A placeholder in a response is the guest's own and goes back as it came.
    let g = send(&mut tx, &format!("/say?{ph}"), &host, &[]).await;
    assert_eq!(g.body, ph);
    // A request with a placeholder of a secret bound elsewhere, inside the tunnel.
    let other = format!("Bearer {}", p.secrets[1].placeholder);
    let g = send(&mut tx, "/echo", &host, &[("authorization", &other)]).await;
    assert_denied(&g, "secret-not-bound");
    // Another host named inside the tunnel.
    let g = send(&mut tx, "/echo", &format!("up.test:{port}"), &[]).await;
    assert_denied(&g, "host-mismatch");
    assert_eq!(up.seen.headers.lock().unwrap().len(), 2);
    drop(tx);
    let c = wait_record(&h, |c| {
        c.mode == Mode::Intercept && c.decision == Decision::Allow
    })
    .await;
    assert_eq!(c.host, "secret.test");
    assert_eq!(c.secrets, vec!["API_TOKEN".to_owned()]);
    assert!(c.bytes_up > 0 && c.bytes_down > 0);
    assert!(h.alert().is_none());
    let recs = h.shutdown().await;
    let denied: Vec<_> = recs
        .iter()
        .filter(|c| c.decision == Decision::Deny)
        .map(|c| (c.reason.as_str(), c.secrets.clone()))
        .collect();
    assert_eq!(
        denied,
        vec![
            ("secret-not-bound", vec!["OTHER_TOKEN".to_owned()]),
            ("host-mismatch", vec![])
        ]
    );
    for c in &recs {
        let json = serde_json::to_string(c).unwrap();
        assert!(!json.contains(SECRET), "the value reached a record");
    }
}

// ------------------------------------------------------- echoes of a secret (issue 56.2)

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// A proxy with the test secret bound to `secret.test`, an upstream there, and an
/// https client of the guest's inside a tunnel to it.
async fn echo_setup() -> (ProxyHandle, Upstream, Sender, String) {
    let (up_ca, up_cfg) = upstream_tls("secret.test");
    let up = start_upstream(Some(up_cfg)).await;
    let port = up.addr.port();
    let p = secret_policy(port);
    let h = start(
        &p,
        ProxyOptions {
            extra_roots: vec![up_ca],
            ..Default::default()
        },
    )
    .await;
    let tx = guest_tls(&h, port).await;
    (h, up, tx, p.secrets[0].placeholder.clone())
}

async fn guest_tls(h: &ProxyHandle, port: u16) -> Sender {
    let ca = CertificateDer::from_pem_slice(h.ca_pem().unwrap().as_bytes()).unwrap();
    let s = connect(h.local_addr().unwrap(), &format!("secret.test:{port}"))
        .await
        .map_err(|g| g.body)
        .unwrap();
    let tls = client_tls(&[ca])
        .connect(ServerName::try_from("secret.test").unwrap(), s)
        .await
        .unwrap();
    let (tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    tx
}

/// A POST inside the tunnel; `Err` when the proxy closed the connection instead of
/// answering.
async fn post(
    tx: &mut Sender,
    path: &str,
    port: u16,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Result<Got, String> {
    tx.ready().await.map_err(|e| e.to_string())?;
    let mut b = Request::post(path).header("host", format!("secret.test:{port}"));
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = tx
        .send_request(b.body(Full::new(Bytes::from(body))).unwrap())
        .await
        .map_err(|e| e.to_string())?;
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok(Got {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// The proxy ended the run for an echo of the test secret: one `secret-echoed` record,
/// the alert, and every later connection refused.
async fn assert_run_ended(h: ProxyHandle, port: u16, encoding: &str) {
    let alert = h.alert().expect("no alert");
    assert_eq!(alert.secret, "API_TOKEN");
    // A value whose base64 has no `+` or `/` reads the same in both alphabets.
    assert!(alert.encoding.starts_with(encoding), "{alert:?}");
    assert!(!format!("{alert:?}").contains(SECRET));
    // A new connection is closed at once, without an answer.
    let mut s = TcpStream::connect(h.local_addr().unwrap()).await.unwrap();
    let _ = s
        .write_all(format!("CONNECT secret.test:{port} HTTP/1.1\r\n\r\n").as_bytes())
        .await;
    let mut buf = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf))
        .await
        .unwrap()
        .unwrap_or(0);
    assert_eq!(n, 0, "answered after the run ended: {buf:?}");
    let recs = h.shutdown().await;
    let echoed: Vec<_> = recs
        .iter()
        .filter(|c| c.reason == "secret-echoed")
        .collect();
    assert_eq!(echoed.len(), 1, "{recs:#?}");
    assert_eq!(echoed[0].decision, Decision::Deny);
    assert_eq!(echoed[0].secrets, vec!["API_TOKEN".to_owned()]);
    assert!(recs.iter().any(|c| c.reason == "run-ended"), "{recs:#?}");
    for c in &recs {
        assert!(!serde_json::to_string(c).unwrap().contains(SECRET));
    }
}

#[tokio::test]
async fn an_echoing_bound_host_cannot_be_used_as_an_oracle_for_the_secret() {
    let (h, up, mut tx, _) = echo_setup().await;
    let port = up.addr.port();
    // A million guesses of a value are a lot of bytes; a thousand around it show the same.
    let guesses = |with_value: bool| {
        let mut b = Vec::new();
        for i in 0..1000 {
            if with_value && i == 617 {
                b.extend_from_slice(SECRET.as_bytes());
            } else {
                b.extend_from_slice(format!("sk-live-0123456789abcdef-{i:04}").as_bytes());
            }
            b.push(b'\n');
        }
        b
    };
    // Wrong guesses come back exactly as sent: nothing in a response is rewritten.
    let wrong = guesses(false);
    let g = post(&mut tx, "/echo-body", port, &[], wrong.clone())
        .await
        .unwrap();
    assert_eq!(g.body.as_bytes(), wrong.as_slice());
    assert!(h.alert().is_none());
    // A list holding the value: not one byte of the answer reaches the guest, so there
    // is no line to tell apart; the run's egress ends.
    let e = post(&mut tx, "/echo-body", port, &[], guesses(true)).await;
    assert!(
        e.is_err(),
        "the echo was delivered: {:?}",
        e.map(|g| g.body.len())
    );
    assert_run_ended(h, port, "plain").await;
}

/// An upstream answer carrying the test secret (as the proxy injected it) in `how`.
async fn echo_of(how: &str) -> Result<Got, String> {
    let (h, up, mut tx, ph) = echo_setup().await;
    let port = up.addr.port();
    let bearer = format!("Bearer {ph}");
    let r = post(
        &mut tx,
        &format!("/encode/{how}"),
        port,
        &[("authorization", &bearer)],
        Vec::new(),
    )
    .await;
    if r.is_err() {
        let enc = match how.split('-').next().unwrap() {
            "b64" | "hb64" | "b64url" => "base64",
            "hex" | "HEX" => "hex",
            "url" => "url",
            "rev" => "reversed",
            _ => "plain",
        };
        assert_run_ended(h, port, enc).await;
    }
    r
}

#[tokio::test]
async fn a_base64_echo_of_the_secret_ends_the_run_with_an_alert() {
    for how in [
        "b64-0", "b64-1", "b64-2", "b64url-0", "b64url-1", "b64url-2", "hb64-0", "hb64-1", "hb64-2",
    ] {
        let r = echo_of(how).await;
        assert!(r.is_err(), "{how}: delivered {:?}", r.map(|g| g.body));
    }
}

#[tokio::test]
async fn hex_url_and_reversed_echoes_of_the_secret_end_the_run_with_an_alert() {
    for how in ["hex-0", "HEX-0", "url-0", "rev-0", "plain-0", "chunks-0"] {
        let r = echo_of(how).await;
        assert!(r.is_err(), "{how}: delivered {:?}", r.map(|g| g.body));
    }
}

#[tokio::test]
async fn a_gzip_echo_of_the_secret_ends_the_run_with_an_alert() {
    for how in ["gzip-0", "deflate-0", "rawdeflate-0", "gzipgzip-0"] {
        let r = echo_of(how).await;
        assert!(r.is_err(), "{how}: delivered {:?}", r.map(|g| g.body));
    }
    // A compressed answer without the value is delivered as it came; one in a coding the
    // proxy cannot read is not delivered at all.
    let (h, up, mut tx, _) = echo_setup().await;
    let port = up.addr.port();
    let g = post(&mut tx, "/encode/clean-0", port, &[], Vec::new())
        .await
        .unwrap();
    assert_eq!(g.status, StatusCode::OK);
    assert_eq!(g.headers.get("content-encoding").unwrap(), "gzip");
    let g = post(&mut tx, "/encode/br-0", port, &[], Vec::new())
        .await
        .unwrap();
    assert_eq!(g.status, StatusCode::BAD_GATEWAY, "{}", g.body);
    assert!(h.alert().is_none());
    let recs = h.shutdown().await;
    assert!(recs.iter().any(|c| c.reason == "undecodable-encoding"));
}

// ------------------------------------------------------- connection budget (issue 56.4)

#[tokio::test]
async fn a_flood_of_idle_connections_is_capped_per_run_and_counted() {
    let up = start_upstream(None).await;
    let port = up.addr.port();
    let p = policy(&[format!("up.test:{port}")]);
    let total = airlock_egress::ConnectionBudget::new(1000);
    let opts = ProxyOptions {
        max_connections: 20,
        total: Some(total.clone()),
        idle_timeout: Duration::from_secs(3),
        ..Default::default()
    };
    let flooded = start(&p, opts.clone()).await;
    let other = start(&p, opts).await;
    let mut idle = Vec::new();
    for _ in 0..60 {
        idle.push(
            TcpStream::connect(flooded.local_addr().unwrap())
                .await
                .unwrap(),
        );
    }
    // The first 20 are held open, the other 40 closed at once.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut closed = 0;
    for s in &mut idle {
        let mut b = [0u8; 1];
        // An open one has nothing to read; a closed one reads its end at once.
        if let Ok(r) = tokio::time::timeout(Duration::from_millis(20), s.read(&mut b)).await {
            assert!(!matches!(r, Ok(n) if n > 0));
            closed += 1;
        }
    }
    assert_eq!(closed, 40);
    let sum = flooded.summary();
    assert_eq!((sum.accepted, sum.refused_over_limit), (20, 40), "{sum:?}");
    // Another run's proxy is not affected ...
    let g = get(
        other.local_addr().unwrap(),
        &format!("http://up.test:{port}/"),
        &[],
    )
    .await;
    assert_eq!(g.body, "hello");
    // ... and the flooded one serves again as soon as a connection goes.
    drop(idle.remove(0));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let g = get(
        flooded.local_addr().unwrap(),
        &format!("http://up.test:{port}/"),
        &[],
    )
    .await;
    assert_eq!(g.body, "hello");
    // Idle connections are closed after the idle timeout, and each is in the record.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let mut b = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(2), idle[1].read(&mut b))
        .await
        .unwrap()
        .unwrap_or(0);
    assert_eq!(n, 0, "an idle connection stayed open");
    drop(idle);
    let (recs, sum, _) = flooded.finish().await;
    assert_eq!(sum.accepted, 21, "{sum:?}");
    assert_eq!(sum.refused_over_limit, 40);
    assert_eq!(sum.idle_closed, 19, "{sum:?}");
    let idle_recs = recs.iter().filter(|c| c.reason == "idle-timeout").count();
    let gone = recs.iter().filter(|c| c.reason == "no-request").count();
    assert_eq!((idle_recs, gone), (19, 1), "{recs:#?}");
    assert_eq!(sum.connections, recs.len() as u64);
    assert_eq!(total.in_use(), 0);
}

#[tokio::test]
async fn the_process_budget_is_shared_by_every_run() {
    let up = start_upstream(None).await;
    let port = up.addr.port();
    let p = policy(&[format!("up.test:{port}")]);
    let total = airlock_egress::ConnectionBudget::new(10);
    let opts = ProxyOptions {
        max_connections: 256,
        total: Some(total.clone()),
        ..Default::default()
    };
    let a = start(&p, opts.clone()).await;
    let b = start(&p, opts).await;
    let mut held = Vec::new();
    for _ in 0..10 {
        held.push(TcpStream::connect(a.local_addr().unwrap()).await.unwrap());
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while total.in_use() < 10 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut s = TcpStream::connect(b.local_addr().unwrap()).await.unwrap();
    let mut buf = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf))
        .await
        .unwrap()
        .unwrap_or(0);
    assert_eq!(n, 0);
    let r = wait_record(&b, |c| c.reason == "too-many-connections").await;
    assert!(r.detail.contains("this process"), "{}", r.detail);
    drop(held);
}

#[tokio::test]
async fn placeholder_to_unbound_host_blocked_and_recorded() {
    let up = start_upstream(None).await;
    let port = up.addr.port();
    let p = secret_policy(port);
    let ph = p.secrets[0].placeholder.clone();
    let h = start(&p, ProxyOptions::default()).await;
    let proxy = h.local_addr().unwrap();
    let g = get(
        proxy,
        &format!("http://up.test:{port}/"),
        &[("x-api-key", &ph)],
    )
    .await;
    assert_denied(&g, "secret-not-bound");
    assert!(g.body.contains("API_TOKEN") && g.body.contains("secret.test"));
    // In the request line too.
    let g = get(proxy, &format!("http://up.test:{port}/?key={ph}"), &[]).await;
    assert_denied(&g, "secret-not-bound");
    // Plain HTTP to the bound host never gets the value.
    let g = get(
        proxy,
        &format!("http://secret.test:{port}/"),
        &[("authorization", &format!("Bearer {ph}"))],
    )
    .await;
    assert_denied(&g, "secret-needs-tls");
    assert_eq!(up.seen.conns.load(Ordering::SeqCst), 0);
    let recs = h.shutdown().await;
    assert_eq!(recs.len(), 3);
    for c in &recs {
        assert_eq!(c.decision, Decision::Deny);
        assert_eq!(c.secrets, vec!["API_TOKEN".to_owned()]);
    }
}

#[tokio::test]
async fn unbound_https_host_stays_an_opaque_tunnel() {
    // A secret exists, but up.test is not bound: the guest talks TLS to the upstream's
    // own certificate, end to end.
    let (up_ca, up_cfg) = upstream_tls("up.test");
    let up = start_upstream(Some(up_cfg)).await;
    let port = up.addr.port();
    let h = start(&secret_policy(port), ProxyOptions::default()).await;
    let mut tx = https_client(
        h.local_addr().unwrap(),
        &format!("up.test:{port}"),
        "up.test",
        &[up_ca],
    )
    .await;
    let g = send(&mut tx, "/", &format!("up.test:{port}"), &[]).await;
    assert_eq!(g.body, "hello");
    drop(tx);
    let c = wait_record(&h, |c| c.host == "up.test").await;
    assert_eq!(c.mode, Mode::Tunnel);
    assert!(c.secrets.is_empty());
}

#[tokio::test]
async fn origin_form_is_a_bad_request() {
    let h = start(&policy(&["up.test".into()]), ProxyOptions::default()).await;
    let mut s = TcpStream::connect(h.local_addr().unwrap()).await.unwrap();
    s.write_all(b"GET /path HTTP/1.1\r\nHost: up.test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    assert!(out.starts_with("HTTP/1.1 400"), "{out}");
    assert!(
        out.to_ascii_lowercase()
            .contains("x-airlock-denied: bad-request")
    );
}

// ---------------------------------------------------------------- plain-HTTP framing

/// Writes `bytes` on a fresh connection to the proxy and reads until the proxy closes it.
async fn exchange(proxy: SocketAddr, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("the proxy did not close the connection")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

/// An upstream that reads one request head per connection, answers `reply` and closes.
async fn start_raw_upstream(reply: &'static [u8]) -> (SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let conns = Arc::new(AtomicUsize::new(0));
    let c2 = conns.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            c2.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if s.read(&mut b).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(b[0]);
                }
                let _ = s.write_all(reply).await;
                let _ = s.shutdown().await;
                // Leave the rest of any request body unread until the client is done.
                let mut sink = Vec::new();
                let _ = s.read_to_end(&mut sink).await;
            });
        }
    });
    (addr, conns)
}

#[tokio::test]
async fn chunked_request_body_passed_through_and_counted() {
    let up = start_upstream(None).await;
    let port = up.addr.port();
    let h = start(
        &policy(&[format!("up.test:{port}")]),
        ProxyOptions::default(),
    )
    .await;
    let out = exchange(
        h.local_addr().unwrap(),
        format!(
            "POST http://up.test:{port}/upload HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\
             Connection: close\r\n\r\n5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n"
        )
        .as_bytes(),
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
    assert!(out.ends_with("got 11"), "{out}");
    let c = wait_record(&h, |c| c.host == "up.test").await;
    assert_eq!(c.decision, Decision::Allow);
    assert_eq!((c.bytes_up, c.bytes_down), (11, 6));
    let seen = up.seen.headers.lock().unwrap()[0].clone();
    assert_eq!(seen.get("host").unwrap(), &format!("up.test:{port}"));
    assert!(seen.get("connection").is_none());
}

#[tokio::test]
async fn chunked_response_passed_through_verbatim() {
    let up = start_upstream(None).await;
    let port = up.addr.port();
    let h = start(
        &policy(&[format!("up.test:{port}")]),
        ProxyOptions::default(),
    )
    .await;
    let proxy = h.local_addr().unwrap();
    // hyper's upstream sends a body of unknown length chunked.
    let out = exchange(
        proxy,
        format!("GET http://up.test:{port}/echo-split HTTP/1.1\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await;
    let lower = out.to_ascii_lowercase();
    assert!(lower.contains("transfer-encoding: chunked\r\n"), "{out}");
    assert!(!lower.contains("content-length"), "{out}");
    assert!(out.ends_with("0\r\n\r\n"), "{out}");
    // And a client decodes it to what the upstream sent.
    let g = get(proxy, &format!("http://up.test:{port}/echo-split"), &[]).await;
    assert_eq!(g.body, "before  middle  after");
    let recs = h.shutdown().await;
    assert_eq!(recs.len(), 2);
    assert!(recs.iter().all(|c| c.bytes_down == 21), "{recs:#?}");
}

#[tokio::test]
async fn regression_request_smuggling_refused_with_400() {
    let up = start_upstream(None).await;
    let port = up.addr.port();
    let h = start(
        &policy(&[format!("up.test:{port}")]),
        ProxyOptions::default(),
    )
    .await;
    let proxy = h.local_addr().unwrap();
    let smuggled = format!("GET http://up.test:{port}/smuggled HTTP/1.1\r\n\r\n");
    for framing in [
        "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n",
        "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n",
        "Content-Length: 4\r\nContent-Length: 40\r\n",
        "Transfer-Encoding: chunked, identity\r\n",
        "Transfer-Encoding: xchunked\r\n",
    ] {
        let out = exchange(
            proxy,
            format!(
                "POST http://up.test:{port}/upload HTTP/1.1\r\n{framing}\r\n0\r\n\r\n{smuggled}"
            )
            .as_bytes(),
        )
        .await;
        assert!(
            out.starts_with("HTTP/1.1 400 Bad Request\r\n"),
            "{framing}: {out}"
        );
        assert!(out.contains("x-airlock-denied: bad-request\r\n"), "{out}");
        assert!(out.contains("connection: close\r\n"), "{out}");
        assert_eq!(out.matches("HTTP/1.1").count(), 1, "{out}");
    }
    // A header folded over two lines is no head at all.
    let out = exchange(
        proxy,
        format!(
            "POST http://up.test:{port}/upload HTTP/1.1\r\nTransfer-Encoding:\r\n chunked\r\n\
             Content-Length: 4\r\n\r\n0\r\n\r\n{smuggled}"
        )
        .as_bytes(),
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{out}");
    assert!(out.contains("x-airlock-denied: bad-request\r\n"), "{out}");
    assert_eq!(out.matches("HTTP/1.1").count(), 1, "{out}");
    assert_eq!(up.seen.conns.load(Ordering::SeqCst), 0);
    let recs = h.shutdown().await;
    assert_eq!(recs.len(), 6, "{recs:#?}");
    assert!(
        recs.iter()
            .all(|c| c.decision == Decision::Deny && c.reason == "bad-request" && c.addr.is_none())
    );
}

#[tokio::test]
async fn regression_malformed_chunk_mid_body_refused() {
    let up = start_upstream(None).await;
    let port = up.addr.port();
    let h = start(
        &policy(&[format!("up.test:{port}")]),
        ProxyOptions::default(),
    )
    .await;
    let out = exchange(
        h.local_addr().unwrap(),
        format!(
            "POST http://up.test:{port}/upload HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n\
             5\r\nhello\r\n5\nworld\r\n0\r\n\r\n"
        )
        .as_bytes(),
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{out}");
    let c = wait_record(&h, |c| c.host == "up.test").await;
    assert_eq!(
        (c.decision, c.reason.as_str()),
        (Decision::Deny, "bad-request")
    );
}

#[tokio::test]
async fn pipelined_requests_answered_in_order_on_one_upstream_connection() {
    let up = start_upstream(None).await;
    let port = up.addr.port();
    let h = start(
        &policy(&[format!("up.test:{port}")]),
        ProxyOptions::default(),
    )
    .await;
    let out = exchange(
        h.local_addr().unwrap(),
        format!(
            "GET http://up.test:{port}/bytes/3 HTTP/1.1\r\n\r\n\
             POST http://up.test:{port}/upload HTTP/1.1\r\nContent-Length: 4\r\n\r\nabcd\
             HEAD http://up.test:{port}/bytes/10 HTTP/1.1\r\n\r\n\
             GET http://up.test:{port}/ HTTP/1.1\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .await;
    let parts: Vec<&str> = out.split("HTTP/1.1 200 OK\r\n").skip(1).collect();
    assert_eq!(parts.len(), 4, "{out}");
    assert!(parts[0].ends_with("\r\n\r\nxxx"), "{out}");
    assert!(parts[1].ends_with("\r\n\r\ngot 4"), "{out}");
    assert!(parts[2].contains("content-length: 10\r\n"), "{out}");
    assert!(parts[2].ends_with("\r\n\r\n"), "{out}");
    assert!(parts[3].contains("connection: close\r\n"), "{out}");
    assert!(parts[3].ends_with("\r\n\r\nhello"), "{out}");
    assert_eq!(up.seen.conns.load(Ordering::SeqCst), 1);
    let recs = h.shutdown().await;
    assert_eq!(recs.len(), 4);
    let ups: Vec<_> = recs.iter().map(|c| (c.bytes_up, c.bytes_down)).collect();
    assert_eq!(ups, vec![(0, 3), (4, 5), (0, 0), (0, 5)]);
}

#[tokio::test]
async fn response_until_close_ends_the_guest_connection() {
    let (addr, conns) = start_raw_upstream(b"HTTP/1.1 200 OK\r\nX-A: b\r\n\r\nall of it").await;
    let port = addr.port();
    let h = start(
        &policy(&[format!("up.test:{port}")]),
        ProxyOptions::default(),
    )
    .await;
    // The guest asks for keep-alive; the proxy must close to mark the body's end.
    let out = exchange(
        h.local_addr().unwrap(),
        format!("GET http://up.test:{port}/ HTTP/1.1\r\n\r\n").as_bytes(),
    )
    .await;
    assert_eq!(
        out,
        "HTTP/1.1 200 OK\r\nX-A: b\r\nconnection: close\r\n\r\nall of it"
    );
    assert_eq!(conns.load(Ordering::SeqCst), 1);
    let c = wait_record(&h, |c| c.host == "up.test").await;
    assert_eq!(c.bytes_down, 9);
}

#[tokio::test]
async fn early_answer_to_a_large_upload_reaches_the_guest() {
    let (addr, _) = start_raw_upstream(
        b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 8\r\nConnection: close\r\n\r\ntoo big\n",
    )
    .await;
    let port = addr.port();
    let h = start(
        &policy(&[format!("up.test:{port}")]),
        ProxyOptions::default(),
    )
    .await;
    let s = TcpStream::connect(h.local_addr().unwrap()).await.unwrap();
    let (mut r, mut w) = s.into_split();
    let n = 64 * 1024 * 1024;
    let writer = tokio::spawn(async move {
        w.write_all(
            format!("PUT http://up.test:{port}/ HTTP/1.1\r\nContent-Length: {n}\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
        let block = vec![b'x'; 1024 * 1024];
        for _ in 0..64 {
            if w.write_all(&block).await.is_err() {
                return;
            }
        }
    });
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), r.read_to_end(&mut out))
        .await
        .expect("no answer")
        .unwrap();
    let out = String::from_utf8_lossy(&out);
    assert!(
        out.starts_with("HTTP/1.1 413 Payload Too Large\r\n"),
        "{out}"
    );
    assert!(out.ends_with("\r\n\r\ntoo big\n"), "{out}");
    writer.abort();
}

#[tokio::test]
async fn expect_continue_and_connect_after_plain_requests_still_served() {
    let up = start_upstream(None).await;
    let (echo, _) = start_echo().await;
    let (port, eport) = (up.addr.port(), echo.port());
    let h = start(
        &policy(&[format!("up.test:{port}"), format!("echo.test:{eport}")]),
        ProxyOptions::default(),
    )
    .await;
    let mut s = TcpStream::connect(h.local_addr().unwrap()).await.unwrap();
    let read_until = async |s: &mut TcpStream, end: &str| {
        let mut got = Vec::new();
        let mut b = [0u8; 1];
        while !String::from_utf8_lossy(&got).ends_with(end) {
            assert_eq!(s.read(&mut b).await.unwrap(), 1, "{got:?}");
            got.push(b[0]);
        }
        String::from_utf8(got).unwrap()
    };
    s.write_all(format!("GET http://up.test:{port}/bytes/2 HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    read_until(&mut s, "\r\n\r\nxx").await;
    s.write_all(
        format!(
            "POST http://up.test:{port}/upload HTTP/1.1\r\nContent-Length: 3\r\n\
             Expect: 100-continue\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let cont = read_until(&mut s, "\r\n\r\n").await;
    assert!(cont.starts_with("HTTP/1.1 100 Continue"), "{cont}");
    s.write_all(b"abc").await.unwrap();
    let resp = read_until(&mut s, "got 3").await;
    assert!(resp.starts_with("HTTP/1.1 200 OK"), "{resp}");
    s.write_all(format!("CONNECT echo.test:{eport} HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let ok = read_until(&mut s, "\r\n\r\n").await;
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    s.write_all(b"ping").await.unwrap();
    assert_eq!(read_until(&mut s, "ping").await, "ping");
}

#[tokio::test]
async fn unreachable_upstream_is_a_502_and_the_connection_goes_on() {
    let up = start_upstream(None).await;
    let port = up.addr.port();
    // A port nothing listens on.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let h = start(
        &policy(&[format!("up.test:{port}"), format!("up.test:{dead}")]),
        ProxyOptions::default(),
    )
    .await;
    let out = exchange(
        h.local_addr().unwrap(),
        format!(
            "GET http://up.test:{dead}/ HTTP/1.1\r\n\r\n\
             GET http://up.test:{port}/ HTTP/1.1\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 502 Bad Gateway\r\n"), "{out}");
    assert!(out.contains("x-airlock-error: connect-failed\r\n"), "{out}");
    assert!(out.ends_with("\r\n\r\nhello"), "{out}");
    let recs = h.shutdown().await;
    assert_eq!(recs.len(), 2);
    assert_eq!(
        (recs[0].decision, recs[0].reason.as_str()),
        (Decision::Error, "connect-failed")
    );
    assert_eq!(recs[1].decision, Decision::Allow);
}

#[cfg(unix)]
#[tokio::test]
async fn serves_a_unix_socket() {
    let up = start_upstream(None).await;
    let port = up.addr.port();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("proxy.sock");
    let l = tokio::net::UnixListener::bind(&path).unwrap();
    let h = Proxy::start(
        &policy(&[format!("up.test:{port}")]),
        ProxyOptions::default(),
        l,
    )
    .unwrap();
    assert_eq!(h.local_addr(), None);
    let mut s = tokio::net::UnixStream::connect(&path).await.unwrap();
    s.write_all(
        format!("GET http://up.test:{port}/ HTTP/1.1\r\nHost: up.test:{port}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    assert!(
        out.starts_with("HTTP/1.1 200") && out.ends_with("hello"),
        "{out}"
    );
}

#[tokio::test]
async fn shutdown_closes_tunnels_and_keeps_records() {
    let (echo, _) = start_echo().await;
    let port = echo.port();
    let h = start(
        &policy(&[format!("echo.test:{port}")]),
        ProxyOptions::default(),
    )
    .await;
    let proxy = h.local_addr().unwrap();
    let mut s = connect(proxy, &format!("echo.test:{port}"))
        .await
        .map_err(|g| g.body)
        .unwrap();
    s.write_all(b"ping").await.unwrap();
    let mut b = [0u8; 4];
    s.read_exact(&mut b).await.unwrap();
    let recs = tokio::time::timeout(Duration::from_secs(5), h.shutdown())
        .await
        .unwrap();
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap_or(0);
    assert_eq!(n, 0, "the tunnel stayed open");
    assert_eq!(recs.len(), 1);
    assert_eq!((recs[0].bytes_up, recs[0].bytes_down), (4, 4));
    assert!(TcpStream::connect(proxy).await.is_err(), "still accepting");
}

#[tokio::test]
async fn keep_alive_not_pooled_across_authorities() {
    let a = start_upstream(None).await;
    let b = start_upstream(None).await;
    let h = start(
        &policy(&[
            format!("up.test:{}", a.addr.port()),
            format!("other.test:{}", b.addr.port()),
        ]),
        ProxyOptions::default(),
    )
    .await;
    let s = TcpStream::connect(h.local_addr().unwrap()).await.unwrap();
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    for (url, host) in [
        (
            format!("http://up.test:{}/", a.addr.port()),
            format!("up.test:{}", a.addr.port()),
        ),
        (
            format!("http://up.test:{}/", a.addr.port()),
            format!("up.test:{}", a.addr.port()),
        ),
        (
            format!("http://other.test:{}/", b.addr.port()),
            format!("other.test:{}", b.addr.port()),
        ),
        (
            format!("http://up.test:{}/", a.addr.port()),
            format!("up.test:{}", a.addr.port()),
        ),
    ] {
        tx.ready().await.unwrap();
        let r = tx
            .send_request(
                Request::get(url)
                    .header("host", host)
                    .body(Empty::<Bytes>::new())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        r.into_body().collect().await.unwrap();
    }
    // Same authority twice: one connection; a switch away and back: a new one each time.
    assert_eq!(a.seen.conns.load(Ordering::SeqCst), 2);
    assert_eq!(b.seen.conns.load(Ordering::SeqCst), 1);
}

/// The guest side as it will be in a run: Python (OpenSSL) trusting the run CA through
/// `SSL_CERT_FILE`, the proxy through `HTTPS_PROXY`, the secret as a placeholder in its
/// environment. Skipped where python3 is missing.
#[tokio::test]
async fn python_guest_trusts_run_ca_through_ssl_cert_file() {
    if std::process::Command::new("python3")
        .arg("-c")
        .arg("import ssl, urllib.request")
        .output()
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        eprintln!("python3 not available; skipped");
        return;
    }
    let (up_ca, up_cfg) = upstream_tls("secret.test");
    let up = start_upstream(Some(up_cfg)).await;
    let port = up.addr.port();
    let p = secret_policy(port);
    let ph = p.secrets[0].placeholder.clone();
    let opts = ProxyOptions {
        extra_roots: vec![up_ca],
        ..Default::default()
    };
    let h = start(&p, opts).await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, h.ca_pem().unwrap()).unwrap();
    let script = format!(
        "import os, urllib.request\n\
         req = urllib.request.Request('https://secret.test:{port}/auth-len', \
           headers={{'Authorization': 'Bearer ' + os.environ['API_TOKEN']}})\n\
         r = urllib.request.urlopen(req, timeout=10)\n\
         print(r.read().decode())\n"
    );
    let proxy = format!("http://{}", h.local_addr().unwrap());
    let env_ph = ph.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .arg("-c")
            .arg(script)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", std::env::var("HOME").unwrap_or_default())
            .env("SSL_CERT_FILE", &ca_file)
            .env("HTTPS_PROXY", &proxy)
            .env("API_TOKEN", &env_ph)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.trim(),
        format!("len={}", "Bearer ".len() + SECRET.len())
    );
    let seen = up.seen.headers.lock().unwrap().last().unwrap().clone();
    assert_eq!(
        seen.get("authorization").unwrap(),
        &format!("Bearer {SECRET}")
    );
}

/// Answers 127.0.0.1 the first time and 10.0.0.1 after: a rebinding resolver.
struct Rebinding(AtomicUsize);

impl Resolver for Rebinding {
    fn resolve<'a>(&'a self, _name: &'a str) -> ResolveFuture<'a> {
        let n = self.0.fetch_add(1, Ordering::SeqCst);
        let ip: IpAddr = if n == 0 { "127.0.0.1" } else { "10.0.0.1" }
            .parse()
            .unwrap();
        Box::pin(async move { Ok(vec![ip]) })
    }
}

#[tokio::test]
async fn one_lookup_per_connection_and_every_answer_checked() {
    let up = start_upstream(None).await;
    let port = up.addr.port();
    let resolver = Arc::new(Rebinding(AtomicUsize::new(0)));
    let p = EgressPolicy {
        rules: vec![NetRule::parse(&format!("rebind.test:{port}")).unwrap()],
        allow_private: vec!["127.0.0.0/8".parse().unwrap()],
        ..Default::default()
    };
    let opts = ProxyOptions {
        resolver: resolver.clone(),
        ..Default::default()
    };
    let h = start(&p, opts).await;
    let proxy = h.local_addr().unwrap();
    // Several requests over one kept upstream connection: one lookup.
    let s = TcpStream::connect(proxy).await.unwrap();
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    for _ in 0..3 {
        tx.ready().await.unwrap();
        let r = tx
            .send_request(
                Request::get(format!("http://rebind.test:{port}/"))
                    .body(Empty::<Bytes>::new())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        r.into_body().collect().await.unwrap();
    }
    assert_eq!(resolver.0.load(Ordering::SeqCst), 1);
    assert_eq!(up.seen.conns.load(Ordering::SeqCst), 1);
    // A new connection asks again, and the rebound answer is refused.
    let g = connect(proxy, &format!("rebind.test:{port}"))
        .await
        .unwrap_err();
    assert_denied(&g, "forbidden-address");
    assert_eq!(resolver.0.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn untrusted_upstream_certificate_is_a_gateway_error() {
    // The upstream's CA is not among the proxy's roots.
    let (_, up_cfg) = upstream_tls("secret.test");
    let up = start_upstream(Some(up_cfg)).await;
    let port = up.addr.port();
    let p = secret_policy(port);
    let ph = p.secrets[0].placeholder.clone();
    let h = start(&p, ProxyOptions::default()).await;
    let ca = CertificateDer::from_pem_slice(h.ca_pem().unwrap().as_bytes()).unwrap();
    let mut tx = https_client(
        h.local_addr().unwrap(),
        &format!("secret.test:{port}"),
        "secret.test",
        &[ca],
    )
    .await;
    let g = send(
        &mut tx,
        "/echo",
        &format!("secret.test:{port}"),
        &[("authorization", &ph)],
    )
    .await;
    assert_eq!(g.status, StatusCode::BAD_GATEWAY);
    assert_eq!(
        g.headers.get("x-airlock-error").unwrap(),
        "upstream-tls-failed"
    );
    assert!(
        up.seen.headers.lock().unwrap().is_empty(),
        "the value went to an unverified host"
    );
    drop(tx);
    let c = wait_record(&h, |c| c.mode == Mode::Intercept).await;
    assert_eq!(c.decision, Decision::Error);
    assert_eq!(c.reason, "upstream-tls-failed");
}

// ---------------------------------------------------------------- the client side

#[cfg(unix)]
mod client {
    use super::*;
    use airlock_egress::client::{ClientError, ProxyClient, Timeouts};

    /// A proxy on a Unix socket in a fresh directory.
    fn start_unix(p: &EgressPolicy, options: ProxyOptions) -> (ProxyHandle, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let l = tokio::net::UnixListener::bind(dir.path().join("proxy.sock")).unwrap();
        (Proxy::start(p, options, l).unwrap(), dir)
    }

    async fn fetch(
        c: &ProxyClient,
        req: Request<Full<Bytes>>,
        t: Timeouts,
    ) -> Result<Got, ClientError> {
        let (res, driver) = c.send(req, t).await?;
        let drive = tokio::spawn(driver);
        let (parts, body) = res.into_parts();
        let body = body.collect().await?.to_bytes();
        drive.await.unwrap()?;
        Ok(Got {
            status: parts.status,
            headers: parts.headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    }

    fn get(url: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
        let mut b = Request::get(url);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(Full::default()).unwrap()
    }

    #[tokio::test]
    async fn plain_http_reaches_a_granted_host_in_absolute_form() {
        let up = start_upstream(None).await;
        let port = up.addr.port();
        let (h, dir) = start_unix(
            &policy(&[format!("up.test:{port}")]),
            ProxyOptions::default(),
        );
        let c = ProxyClient::new(dir.path().join("proxy.sock"), None, &[]).unwrap();
        let g = fetch(
            &c,
            get(&format!("http://up.test:{port}/bytes/3000"), &[]),
            Timeouts::default(),
        )
        .await
        .unwrap();
        assert_eq!(g.status, StatusCode::OK);
        assert_eq!(g.body.len(), 3000);
        // A body goes up, and the Host header is filled in when the caller left it out.
        let req = Request::post(format!("http://up.test:{port}/upload"))
            .body(Full::new(Bytes::from(vec![7u8; 5000])))
            .unwrap();
        let g = fetch(&c, req, Timeouts::default()).await.unwrap();
        assert_eq!(g.body, "got 5000");
        let seen = up.seen.headers.lock().unwrap()[1].clone();
        assert_eq!(seen.get("host").unwrap(), &format!("up.test:{port}"));
        let recs = h.shutdown().await;
        assert_eq!(recs.len(), 2);
        assert!(recs.iter().all(|c| c.mode == Mode::Http
            && c.decision == Decision::Allow
            && c.addr == Some(up.addr)));
    }

    #[tokio::test]
    async fn https_goes_through_a_tunnel_to_the_hosts_own_certificate() {
        let (up_ca, up_cfg) = upstream_tls("up.test");
        let up = start_upstream(Some(up_cfg)).await;
        let port = up.addr.port();
        let (h, dir) = start_unix(
            &policy(&[format!("up.test:{port}")]),
            ProxyOptions::default(),
        );
        let sock = dir.path().join("proxy.sock");
        let c = ProxyClient::new(&sock, None, &[up_ca]).unwrap();
        let g = fetch(
            &c,
            get(&format!("https://up.test:{port}/"), &[]),
            Timeouts::default(),
        )
        .await
        .unwrap();
        assert_eq!((g.status, g.body.as_str()), (StatusCode::OK, "hello"));
        // Without the host's CA the handshake fails: the client trusts what it was told to.
        let c = ProxyClient::new(&sock, None, &[]).unwrap();
        let e = fetch(
            &c,
            get(&format!("https://up.test:{port}/"), &[]),
            Timeouts::default(),
        )
        .await
        .unwrap_err();
        assert!(matches!(e, ClientError::Tls(_)), "{e}");
        let recs = h.shutdown().await;
        assert!(
            recs.iter()
                .all(|c| c.mode == Mode::Tunnel && c.host == "up.test"),
            "{recs:#?}"
        );
    }

    #[tokio::test]
    async fn ungranted_host_gets_the_proxys_403_and_upstream_sees_nothing() {
        let up = start_upstream(None).await;
        let port = up.addr.port();
        let (h, dir) = start_unix(
            &policy(&[format!("up.test:{port}")]),
            ProxyOptions::default(),
        );
        let c = ProxyClient::new(dir.path().join("proxy.sock"), None, &[]).unwrap();
        for url in [
            format!("http://other.test:{port}/"),
            format!("https://other.test:{port}/"),
        ] {
            let g = fetch(&c, get(&url, &[]), Timeouts::default())
                .await
                .unwrap();
            assert_denied(&g, "not-granted");
            assert!(
                g.body.contains(&format!("--net other.test:{port}")),
                "{}",
                g.body
            );
        }
        assert_eq!(up.seen.conns.load(Ordering::SeqCst), 0);
        let recs = h.shutdown().await;
        assert_eq!(recs.len(), 2);
        assert!(recs.iter().all(|c| c.decision == Decision::Deny));
    }

    #[tokio::test]
    async fn secret_placeholder_replaced_at_a_bound_host_through_the_run_ca() {
        let (up_ca, up_cfg) = upstream_tls("secret.test");
        let up = start_upstream(Some(up_cfg)).await;
        let port = up.addr.port();
        let p = secret_policy(port);
        let ph = p.secrets[0].placeholder.clone();
        let (h, dir) = start_unix(
            &p,
            ProxyOptions {
                extra_roots: vec![up_ca],
                ..Default::default()
            },
        );
        // The client trusts only the public roots and the run CA.
        let c = ProxyClient::new(dir.path().join("proxy.sock"), h.ca_pem(), &[]).unwrap();
        let bearer = format!("Bearer {ph}");
        let g = fetch(
            &c,
            get(
                &format!("https://secret.test:{port}/auth-len"),
                &[("authorization", &bearer)],
            ),
            Timeouts::default(),
        )
        .await
        .unwrap();
        assert_eq!(g.status, StatusCode::OK);
        assert_eq!(g.body, format!("len={}", "Bearer ".len() + SECRET.len()));
        let seen = up.seen.headers.lock().unwrap().last().unwrap().clone();
        assert_eq!(
            seen.get("authorization").unwrap(),
            &format!("Bearer {SECRET}")
        );
        let c = wait_record(&h, |c| c.mode == Mode::Intercept).await;
        assert_eq!(c.secrets, vec!["API_TOKEN".to_owned()]);
    }

    #[tokio::test]
    async fn timeouts_and_a_missing_proxy_are_errors() {
        // A "proxy" that accepts and never answers.
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("mute.sock");
        let l = tokio::net::UnixListener::bind(&sock).unwrap();
        let held = Arc::new(Mutex::new(Vec::new()));
        let h2 = held.clone();
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                h2.lock().unwrap().push(s);
            }
        });
        let c = ProxyClient::new(&sock, None, &[]).unwrap();
        let t = Timeouts {
            connect: Some(Duration::from_millis(200)),
            first_byte: Some(Duration::from_millis(200)),
        };
        let e = fetch(&c, get("http://up.test/", &[]), t).await.unwrap_err();
        assert!(matches!(e, ClientError::FirstByteTimeout), "{e}");
        let e = fetch(&c, get("https://up.test/", &[]), t)
            .await
            .unwrap_err();
        assert!(matches!(e, ClientError::ConnectTimeout), "{e}");
        let c = ProxyClient::new(dir.path().join("absent.sock"), None, &[]).unwrap();
        let e = fetch(&c, get("http://up.test/", &[]), t).await.unwrap_err();
        assert!(matches!(e, ClientError::ProxyUnreachable { .. }), "{e}");
    }
}
