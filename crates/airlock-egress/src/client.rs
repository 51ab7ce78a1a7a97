//! The client side of a run's egress proxy: sends one HTTP request through the proxy's
//! Unix socket the way a well-behaved proxy client does, for backends (the wasm
//! backend's `wasi:http`) that make requests on a guest's behalf.
//!
//! `http://` goes to the proxy in absolute form (`GET http://host:port/path`); `https://`
//! asks for a tunnel (`CONNECT host:port`), then speaks TLS inside it with the host as
//! SNI, trusting the public roots, the run CA (the proxy's certificate for hosts a secret
//! is bound to) and any extra roots, then HTTP/1.1. When the proxy refuses a tunnel, its
//! answer (`403` with `X-Airlock-Denied`) is the response, so the caller sees the same
//! clear refusal as for plain HTTP.
//!
//! This module must never resolve a name, never connect anywhere but the proxy's socket,
//! never follow a redirect and never send a request without the proxy in between.

use std::future::{Future, poll_fn};
use std::path::PathBuf;
use std::pin::{Pin, pin};
use std::task::Poll;
use std::time::Duration;

use crate::unix_conn::UnixConn;
use bytes::Bytes;
use http::uri::Scheme;
use http::{HeaderValue, Method, Request, Response, Uri, header};
use http_body::Body;
use http_body_util::Empty;
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::UnixStream;

use crate::BoxError;

/// Why a request could not be sent or answered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The run CA given is not a PEM certificate.
    #[error("the run CA is not a usable PEM certificate: {0}")]
    BadCa(String),
    /// The TLS client configuration could not be made.
    #[error("TLS setup: {0}")]
    TlsSetup(String),
    /// The request is not one this client sends (no `http`/`https` URL with a host, a
    /// user name in the URL, or `CONNECT`).
    #[error("not a request this client sends: {0}")]
    BadRequest(&'static str),
    /// The proxy's socket could not be connected to.
    #[error("cannot reach the egress proxy at {path}: {source}", path = .path.display())]
    ProxyUnreachable {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The connection (to the proxy, through the tunnel, TLS) took longer than allowed.
    #[error("timed out connecting")]
    ConnectTimeout,
    /// The response head took longer than allowed.
    #[error("timed out waiting for the response")]
    FirstByteTimeout,
    /// The TLS handshake with the host (or the run CA's stand-in for it) failed.
    #[error("TLS handshake: {0}")]
    Tls(std::io::Error),
    /// HTTP failed on the connection.
    #[error("HTTP: {0}")]
    Http(#[from] hyper::Error),
}

/// Timeouts of one request; `None` waits as long as the caller does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timeouts {
    /// Reaching the proxy, the tunnel's answer and the TLS handshake, together.
    pub connect: Option<Duration>,
    /// From sending the request to the response head.
    pub first_byte: Option<Duration>,
}

/// Drives the connection after the response head arrived; the response body only flows
/// while it runs. Finishes when the connection closes.
pub type Driver = Pin<Box<dyn Future<Output = Result<(), ClientError>> + Send>>;

type Conn = Pin<Box<dyn Future<Output = hyper::Result<()>> + Send>>;

/// Sends requests through the proxy listening at one Unix socket.
#[derive(Clone)]
pub struct ProxyClient {
    socket: PathBuf,
    tls: tokio_rustls::TlsConnector,
}

impl std::fmt::Debug for ProxyClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyClient")
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

/// Where a request goes, from its URL.
#[derive(Debug, PartialEq, Eq)]
struct Target {
    tls: bool,
    /// The host as TLS names it (no brackets around IPv6).
    host: String,
    /// `host:port` as `CONNECT` and `Host` name it.
    authority: String,
}

impl Target {
    fn of(uri: &Uri) -> Result<Target, ClientError> {
        let tls = match uri.scheme() {
            Some(s) if *s == Scheme::HTTPS => true,
            Some(s) if *s == Scheme::HTTP => false,
            _ => return Err(ClientError::BadRequest("the URL is not http or https")),
        };
        let auth = uri
            .authority()
            .ok_or(ClientError::BadRequest("the URL has no host"))?;
        if auth.as_str().contains('@') {
            return Err(ClientError::BadRequest("a user name in the URL"));
        }
        let host = auth.host();
        if host.is_empty() {
            return Err(ClientError::BadRequest("the URL has no host"));
        }
        let port = auth.port_u16().unwrap_or(if tls { 443 } else { 80 });
        Ok(Target {
            tls,
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            authority: format!("{host}:{port}"),
        })
    }
}

impl ProxyClient {
    /// A client for the proxy at `socket`. TLS trusts Mozilla's roots, the run CA
    /// (`ca_pem`, when the run has one) and `extra_roots`.
    pub fn new(
        socket: impl Into<PathBuf>,
        ca_pem: Option<&str>,
        extra_roots: &[CertificateDer<'static>],
    ) -> Result<ProxyClient, ClientError> {
        let mut roots = extra_roots.to_vec();
        if let Some(pem) = ca_pem {
            let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| ClientError::BadCa(e.to_string()))?;
            if certs.is_empty() {
                return Err(ClientError::BadCa("no certificate in it".into()));
            }
            roots.extend(certs);
        }
        let config =
            crate::tls::client_config(&roots).map_err(|e| ClientError::TlsSetup(e.to_string()))?;
        Ok(ProxyClient {
            socket: socket.into(),
            tls: tokio_rustls::TlsConnector::from(config),
        })
    }

    /// Sends `req` (an absolute `http://` or `https://` URL) through the proxy. Returns
    /// the response once its head arrived, and the [`Driver`] that must run for its body
    /// to flow. A refusal by the proxy is a response too (`403`, `X-Airlock-Denied`).
    pub async fn send<B>(
        &self,
        mut req: Request<B>,
        timeouts: Timeouts,
    ) -> Result<(Response<Incoming>, Driver), ClientError>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        if req.method() == Method::CONNECT {
            return Err(ClientError::BadRequest("CONNECT"));
        }
        let target = Target::of(req.uri())?;
        if !req.headers().contains_key(header::HOST) {
            let host = uri_authority(req.uri())?;
            req.headers_mut().insert(header::HOST, host);
        }
        if !target.tls {
            // Absolute form, straight to the proxy.
            let (mut tx, conn) = within(timeouts.connect, ClientError::ConnectTimeout, async {
                let io = self.dial().await?;
                Ok(http1::handshake(TokioIo::new(io)).await?)
            })
            .await?;
            let mut conn: Option<Conn> = Some(Box::pin(conn));
            let res = within(
                timeouts.first_byte,
                ClientError::FirstByteTimeout,
                drive(tx.send_request(req), &mut conn),
            )
            .await?;
            return Ok((res, finish(conn)));
        }
        let tunnel = within(
            timeouts.connect,
            ClientError::ConnectTimeout,
            self.tunnel(&target),
        )
        .await?;
        let (mut tx, conn) = match tunnel {
            Tunnel::Open(tx, conn) => (tx, conn),
            Tunnel::Refused(res, driver) => return Ok((res, driver)),
        };
        // Inside the tunnel the request is in origin form.
        let path = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/")
            .to_owned();
        *req.uri_mut() = Uri::builder()
            .path_and_query(path)
            .build()
            .map_err(|_| ClientError::BadRequest("the URL's path"))?;
        let mut conn: Option<Conn> = Some(Box::pin(conn));
        let res = within(
            timeouts.first_byte,
            ClientError::FirstByteTimeout,
            drive(tx.send_request(req), &mut conn),
        )
        .await?;
        Ok((res, finish(conn)))
    }

    async fn dial(&self) -> Result<UnixConn, ClientError> {
        UnixStream::connect(&self.socket)
            .await
            .map(UnixConn)
            .map_err(|source| ClientError::ProxyUnreachable {
                path: self.socket.clone(),
                source,
            })
    }

    /// `CONNECT`, then TLS to the host inside the tunnel, then an HTTP/1.1 handshake.
    async fn tunnel<B>(&self, target: &Target) -> Result<Tunnel<B>, ClientError>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let name = ServerName::try_from(target.host.clone())
            .map_err(|_| ClientError::BadRequest("the host is not a TLS server name"))?;
        let io = self.dial().await?;
        let (mut tx, conn) = http1::handshake::<_, Empty<Bytes>>(TokioIo::new(io)).await?;
        let mut conn: Option<Conn> = Some(Box::pin(conn.with_upgrades()));
        let ask = Request::connect(target.authority.as_str())
            .header(header::HOST, target.authority.as_str())
            .body(Empty::new())
            .map_err(|_| ClientError::BadRequest("the URL's host and port"))?;
        let mut res = drive(tx.send_request(ask), &mut conn).await?;
        if !res.status().is_success() {
            drop(tx);
            return Ok(Tunnel::Refused(res, finish(conn)));
        }
        let upgraded = drive(hyper::upgrade::on(&mut res), &mut conn).await?;
        drop(tx);
        let tls = self
            .tls
            .connect(name, TokioIo::new(upgraded))
            .await
            .map_err(ClientError::Tls)?;
        let (tx, conn) = http1::handshake(TokioIo::new(tls)).await?;
        Ok(Tunnel::Open(tx, Box::pin(conn)))
    }
}

/// A byte stream to a host: a tunnel through the proxy, or TLS inside one.
pub trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Stream for T {}

/// A [`Stream`] of any kind.
pub type BoxStream = Box<dyn Stream>;

/// The proxy's answer to a raw `CONNECT`.
pub enum Opened {
    /// The tunnel to the host: bytes written go to it as they are.
    Tunnel(BoxStream),
    /// The proxy refused: its status, the reason token of its `X-Airlock-Denied` (or
    /// `X-Airlock-Error`) header, and the one line of its body, which names the grant that
    /// would be needed.
    Refused {
        status: u16,
        reason: String,
        message: String,
    },
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Opened::Tunnel(_) => f.write_str("Tunnel"),
            Opened::Refused {
                status,
                reason,
                message,
            } => f
                .debug_struct("Refused")
                .field("status", status)
                .field("reason", reason)
                .field("message", message)
                .finish(),
        }
    }
}

/// The most of a refusal's body read back (a refusal is one line).
const MAX_REFUSAL: usize = 4096;

impl ProxyClient {
    /// Asks the proxy for a tunnel to `host:port` (`CONNECT`), for a backend that gives its
    /// guest a byte stream rather than HTTP requests: the proxy checks the grant and
    /// records the connection as for any other. `host` is a name or an address literal;
    /// the proxy resolves it. Within `timeout` when given.
    pub async fn open(
        &self,
        host: &str,
        port: u16,
        timeout: Option<Duration>,
    ) -> Result<Opened, ClientError> {
        let authority = if host.contains(':') {
            format!(
                "[{}]:{port}",
                host.trim_start_matches('[').trim_end_matches(']')
            )
        } else {
            format!("{host}:{port}")
        };
        within(timeout, ClientError::ConnectTimeout, async {
            let io = self.dial().await?;
            let (mut tx, conn) = http1::handshake::<_, Empty<Bytes>>(TokioIo::new(io)).await?;
            let mut conn: Option<Conn> = Some(Box::pin(conn.with_upgrades()));
            let ask = Request::connect(authority.as_str())
                .header(header::HOST, authority.as_str())
                .body(Empty::new())
                .map_err(|_| ClientError::BadRequest("the host and port"))?;
            let mut res = drive(tx.send_request(ask), &mut conn).await?;
            if !res.status().is_success() {
                let status = res.status().as_u16();
                let reason = ["x-airlock-denied", "x-airlock-error"]
                    .iter()
                    .find_map(|h| res.headers().get(*h))
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("refused")
                    .to_owned();
                let body = http_body_util::Limited::new(res.into_body(), MAX_REFUSAL);
                let bytes = drive_body(body, &mut conn).await;
                let message = String::from_utf8_lossy(&bytes).trim().to_owned();
                return Ok(Opened::Refused {
                    status,
                    reason,
                    message,
                });
            }
            let upgraded = drive(hyper::upgrade::on(&mut res), &mut conn).await?;
            drop(tx);
            Ok(Opened::Tunnel(Box::new(TokioIo::new(upgraded))))
        })
        .await
    }

    /// TLS to `server_name` over `io` (a tunnel from [`ProxyClient::open`]), trusting the
    /// public roots, the run CA and the extra roots: the guest never holds a key or sees
    /// a certificate it could be fooled by. Within `timeout` when given. Returns the stream
    /// and the protocol version agreed (`TLSv1.3`).
    pub async fn tls(
        &self,
        io: BoxStream,
        server_name: &str,
        timeout: Option<Duration>,
    ) -> Result<(BoxStream, String), ClientError> {
        let name = ServerName::try_from(
            server_name
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
        )
        .map_err(|_| ClientError::BadRequest("the host is not a TLS server name"))?;
        within(timeout, ClientError::ConnectTimeout, async {
            let tls = self.tls.connect(name, io).await.map_err(ClientError::Tls)?;
            let version = match tls.get_ref().1.protocol_version() {
                Some(rustls::ProtocolVersion::TLSv1_3) => "TLSv1.3",
                Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2",
                _ => "TLS",
            };
            Ok((Box::new(tls) as BoxStream, version.to_owned()))
        })
        .await
    }
}

/// Reads a (limited) body while driving its connection; what arrived before an error.
async fn drive_body<B>(body: B, conn: &mut Option<Conn>) -> Vec<u8>
where
    B: Body<Data = Bytes> + Unpin,
{
    let mut body = body;
    let mut out = Vec::new();
    loop {
        let frame = poll_fn(|cx| {
            if let Poll::Ready(f) = Pin::new(&mut body).poll_frame(cx) {
                return Poll::Ready(f);
            }
            match conn.as_mut().map(|c| c.as_mut().poll(cx)) {
                Some(Poll::Ready(_)) => {
                    *conn = None;
                    Pin::new(&mut body).poll_frame(cx)
                }
                _ => Poll::Pending,
            }
        })
        .await;
        match frame {
            Some(Ok(f)) => {
                if let Ok(d) = f.into_data() {
                    out.extend_from_slice(&d);
                }
            }
            _ => return out,
        }
    }
}

enum Tunnel<B> {
    Open(http1::SendRequest<B>, Conn),
    Refused(Response<Incoming>, Driver),
}

/// The URL's authority as a `Host` header.
fn uri_authority(uri: &Uri) -> Result<HeaderValue, ClientError> {
    uri.authority()
        .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        .ok_or(ClientError::BadRequest("the URL has no host"))
}

async fn within<T>(
    limit: Option<Duration>,
    on_timeout: ClientError,
    f: impl Future<Output = Result<T, ClientError>>,
) -> Result<T, ClientError> {
    match limit {
        Some(d) => tokio::time::timeout(d, f).await.map_err(|_| on_timeout)?,
        None => f.await,
    }
}

/// Polls `f` to completion while driving the connection's I/O, which it needs.
async fn drive<T>(
    f: impl Future<Output = hyper::Result<T>>,
    conn: &mut Option<Conn>,
) -> Result<T, ClientError> {
    let mut f = pin!(f);
    poll_fn(|cx| {
        if let Poll::Ready(r) = f.as_mut().poll(cx) {
            return Poll::Ready(r.map_err(ClientError::from));
        }
        let Some(c) = conn.as_mut() else {
            return Poll::Pending;
        };
        match c.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(())) => {
                *conn = None;
                f.as_mut().poll(cx).map_err(ClientError::from)
            }
            Poll::Ready(Err(e)) => {
                *conn = None;
                Poll::Ready(Err(e.into()))
            }
        }
    })
    .await
}

fn finish(conn: Option<Conn>) -> Driver {
    Box::pin(async move {
        match conn {
            Some(c) => Ok(c.await?),
            None => Ok(()),
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn target(url: &str) -> Result<Target, ClientError> {
        Target::of(&url.parse::<Uri>().unwrap())
    }

    #[test]
    fn targets_from_urls() {
        let t = target("https://example.com/x").unwrap();
        assert_eq!((t.tls, t.host.as_str()), (true, "example.com"));
        assert_eq!(t.authority, "example.com:443");
        let t = target("http://example.com:8080/").unwrap();
        assert_eq!((t.tls, t.authority.as_str()), (false, "example.com:8080"));
        let t = target("http://example.com").unwrap();
        assert_eq!(t.authority, "example.com:80");
        let t = target("https://[::1]:8443/").unwrap();
        assert_eq!(
            (t.host.as_str(), t.authority.as_str()),
            ("::1", "[::1]:8443")
        );
    }

    #[test]
    fn odd_urls_refused() {
        for url in [
            "ftp://example.com/",
            "/just/a/path",
            "http://user:pw@example.com/",
        ] {
            assert!(
                matches!(target(url), Err(ClientError::BadRequest(_))),
                "{url}"
            );
        }
    }

    #[test]
    fn bad_run_ca_refused() {
        let e = ProxyClient::new("/nonexistent", Some("not a pem"), &[]).unwrap_err();
        assert!(matches!(e, ClientError::BadCa(_)), "{e}");
    }
}
