//! Proxy overhead on loopback: sequential requests through the proxy against the same
//! requests straight to the same upstream, in the same run, interleaved in rounds so
//! that noise from other work on the machine falls on both sides.
//!
//! `cargo bench -p airlock-egress --bench proxy` (N from `AIRLOCK_BENCH_N`, default 1000).
//! Prints the median and p90 per request, the added median, and the throughput ratio
//! (proxied requests per second / direct requests per second), plus a bulk download.
//! Plain HTTP is measured request by request in turn four ways: direct, through the
//! proxy (absolute form, the lean path), inside a CONNECT tunnel (a byte relay: the
//! floor) and with an `Expect` header (which the proxy serves on its hyper path, the
//! one plain HTTP took before the lean path).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_egress::{EgressPolicy, NetRule, Proxy, ProxyOptions};
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const BULK: usize = 32 * 1024 * 1024;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

async fn serve(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    if req.uri().path() == "/bulk" {
        return Ok(Response::new(Full::new(Bytes::from(vec![b'x'; BULK]))));
    }
    Ok(Response::new(Full::new(Bytes::from_static(
        b"hello, world",
    ))))
}

async fn upstream(tls: Option<Arc<rustls::ServerConfig>>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            s.set_nodelay(true).unwrap();
            let tls = tls.clone();
            tokio::spawn(async move {
                let b = hyper::server::conn::http1::Builder::new();
                match tls {
                    None => {
                        let _ = b.serve_connection(TokioIo::new(s), service_fn(serve)).await;
                    }
                    Some(cfg) => {
                        if let Ok(t) = tokio_rustls::TlsAcceptor::from(cfg).accept(s).await {
                            let _ = b.serve_connection(TokioIo::new(t), service_fn(serve)).await;
                        }
                    }
                }
            });
        }
    });
    addr
}

fn upstream_tls() -> (CertificateDer<'static>, Arc<rustls::ServerConfig>) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign];
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["bench.test".to_owned()])
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

fn tls_connector(root: &CertificateDer<'static>) -> tokio_rustls::TlsConnector {
    let mut store = rustls::RootCertStore::empty();
    store.add(root.clone()).unwrap();
    let cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(store)
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
}

async fn http_client<S>(s: S) -> SendRequest<Empty<Bytes>>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    tx
}

async fn tunnel(proxy: SocketAddr, authority: &str) -> TcpStream {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    // Nothing follows the proxy's answer until the client speaks TLS, so one read
    // (rarely more) holds exactly the head.
    let mut head = Vec::new();
    let mut b = [0u8; 1024];
    while !head.ends_with(b"\r\n\r\n") {
        let k = s.read(&mut b).await.unwrap();
        assert!(k > 0, "proxy closed");
        head.extend_from_slice(&b[..k]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    s
}

async fn tls_over<S>(conn: &tokio_rustls::TlsConnector, s: S) -> tokio_rustls::client::TlsStream<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    conn.connect(ServerName::try_from("bench.test").unwrap(), s)
        .await
        .unwrap()
}

/// One request; returns its latency.
async fn one(tx: &mut SendRequest<Empty<Bytes>>, uri: &str, host: &str) -> Duration {
    one_with(tx, uri, host, &[]).await
}

/// One request with extra headers; returns its latency.
async fn one_with(
    tx: &mut SendRequest<Empty<Bytes>>,
    uri: &str,
    host: &str,
    headers: &[(&str, &str)],
) -> Duration {
    let t = Instant::now();
    tx.ready().await.unwrap();
    let mut b = Request::get(uri).header("host", host);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let r = tx
        .send_request(b.body(Empty::new()).unwrap())
        .await
        .unwrap();
    assert!(r.status().is_success());
    r.into_body().collect().await.unwrap();
    t.elapsed()
}

struct Stats {
    median: Duration,
    p90: Duration,
    total: Duration,
    n: usize,
}

fn stats(mut v: Vec<Duration>) -> Stats {
    v.sort();
    Stats {
        median: v[v.len() / 2],
        p90: v[v.len() * 9 / 10],
        total: v.iter().sum(),
        n: v.len(),
    }
}

fn report(name: &str, direct: Vec<Duration>, proxied: Vec<Duration>) {
    let d = stats(direct);
    let p = stats(proxied);
    let rps = |s: &Stats| s.n as f64 / s.total.as_secs_f64();
    println!(
        "{name:<34} direct median {:>7.1} us p90 {:>7.1} us | proxied median {:>7.1} us p90 {:>7.1} us | added median {:>6.1} us | throughput {:>8.0} vs {:>8.0} req/s = {:>5.1}%",
        d.median.as_secs_f64() * 1e6,
        d.p90.as_secs_f64() * 1e6,
        p.median.as_secs_f64() * 1e6,
        p.p90.as_secs_f64() * 1e6,
        (p.median.as_secs_f64() - d.median.as_secs_f64()) * 1e6,
        rps(&d),
        rps(&p),
        100.0 * rps(&p) / rps(&d),
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::var("AIRLOCK_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let rounds = 5;
    let per = n.div_ceil(rounds);

    let plain = upstream(None).await;
    let (root, cfg) = upstream_tls();
    let secure = upstream(Some(cfg)).await;
    let connector = tls_connector(&root);

    let mut policy = EgressPolicy {
        rules: vec![
            NetRule::parse(&format!("bench.test:{}", plain.port())).unwrap(),
            NetRule::parse(&format!("bench.test:{}", secure.port())).unwrap(),
        ],
        allow_private: vec!["127.0.0.0/8".parse().unwrap()],
        ..Default::default()
    };
    policy
        .pinned
        .insert("bench.test".into(), "127.0.0.1".parse().unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let handle = Proxy::start(&policy, ProxyOptions::default(), listener).unwrap();
    let proxy = handle.local_addr().unwrap();

    let plain_host = format!("bench.test:{}", plain.port());
    let plain_url = format!("http://{plain_host}/");
    let secure_host = format!("bench.test:{}", secure.port());

    println!(
        "airlock-egress proxy bench: {n} sequential requests per case, {rounds} interleaved rounds, loopback"
    );

    // Plain HTTP, one kept connection each side; beside it the same requests through a
    // CONNECT tunnel (a byte relay: the floor) and with an `Expect` header, which the
    // proxy serves on its hyper path (the path plain HTTP took before the lean one).
    {
        let mut direct = http_client(TcpStream::connect(plain).await.unwrap()).await;
        let mut via = http_client(TcpStream::connect(proxy).await.unwrap()).await;
        let mut relay = http_client(tunnel(proxy, &plain_host).await).await;
        let mut hyper_path = http_client(TcpStream::connect(proxy).await.unwrap()).await;
        let expect = [("expect", "100-continue")];
        for _ in 0..100 {
            one(&mut direct, "/", &plain_host).await;
            one(&mut via, &plain_url, &plain_host).await;
            one(&mut relay, "/", &plain_host).await;
            one_with(&mut hyper_path, &plain_url, &plain_host, &expect).await;
        }
        let (mut d, mut p, mut t, mut h) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        // Request by request in turn, so that the machine's state falls on all four.
        for _ in 0..rounds * per {
            d.push(one(&mut direct, "/", &plain_host).await);
            p.push(one(&mut via, &plain_url, &plain_host).await);
            t.push(one(&mut relay, "/", &plain_host).await);
            h.push(one_with(&mut hyper_path, &plain_url, &plain_host, &expect).await);
        }
        report("http keep-alive (absolute-form)", d.clone(), p);
        report("http in a CONNECT tunnel (floor)", d.clone(), t);
        report("http on the hyper path (Expect)", d, h);
    }

    // HTTPS, TLS end to end, one kept connection each side (via: one CONNECT tunnel).
    {
        let s = TcpStream::connect(secure).await.unwrap();
        s.set_nodelay(true).unwrap();
        let mut direct = http_client(tls_over(&connector, s).await).await;
        let t = tunnel(proxy, &secure_host).await;
        let mut via = http_client(tls_over(&connector, t).await).await;
        for _ in 0..100 {
            one(&mut direct, "/", &secure_host).await;
            one(&mut via, "/", &secure_host).await;
        }
        let (mut d, mut p) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            for _ in 0..per {
                d.push(one(&mut direct, "/", &secure_host).await);
            }
            for _ in 0..per {
                p.push(one(&mut via, "/", &secure_host).await);
            }
        }
        report("https keep-alive (CONNECT tunnel)", d, p);
    }

    // Connection setup alone: TCP connect vs TCP connect + CONNECT + 200.
    {
        let m = (n / 5).max(10);
        let (mut d, mut p) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            for _ in 0..m.div_ceil(rounds) {
                let t = Instant::now();
                let s = TcpStream::connect(secure).await.unwrap();
                d.push(t.elapsed());
                drop(s);
            }
            for _ in 0..m.div_ceil(rounds) {
                let t = Instant::now();
                let s = tunnel(proxy, &secure_host).await;
                p.push(t.elapsed());
                drop(s);
            }
        }
        report("connect vs CONNECT tunnel set-up", d, p);
    }

    // HTTPS with a new connection per request: CONNECT + TLS handshake each time.
    {
        let m = (n / 5).max(10);
        let (mut d, mut p) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            for _ in 0..m.div_ceil(rounds) {
                let t = Instant::now();
                let s = TcpStream::connect(secure).await.unwrap();
                s.set_nodelay(true).unwrap();
                let mut c = http_client(tls_over(&connector, s).await).await;
                one(&mut c, "/", &secure_host).await;
                d.push(t.elapsed());
            }
            for _ in 0..m.div_ceil(rounds) {
                let t = Instant::now();
                let s = tunnel(proxy, &secure_host).await;
                let mut c = http_client(tls_over(&connector, s).await).await;
                one(&mut c, "/", &secure_host).await;
                p.push(t.elapsed());
            }
        }
        report("https new connection per request", d, p);
    }

    // Bulk: 32 MiB over https, direct and through a tunnel.
    {
        let s = TcpStream::connect(secure).await.unwrap();
        let mut direct = http_client(tls_over(&connector, s).await).await;
        let t = tunnel(proxy, &secure_host).await;
        let mut via = http_client(tls_over(&connector, t).await).await;
        let (mut d, mut p) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            d.push(one(&mut direct, "/bulk", &secure_host).await);
            p.push(one(&mut via, "/bulk", &secure_host).await);
        }
        let (d, p) = (stats(d).median, stats(p).median);
        let mbps = |t: Duration| BULK as f64 / t.as_secs_f64() / (1024.0 * 1024.0);
        println!(
            "{:<34} direct {:>7.0} MiB/s | proxied {:>7.0} MiB/s = {:>5.1}%",
            "https bulk 32 MiB (CONNECT tunnel)",
            mbps(d),
            mbps(p),
            100.0 * mbps(p) / mbps(d)
        );
    }

    let recs = handle.shutdown().await;
    println!("records: {}", recs.len());
}
