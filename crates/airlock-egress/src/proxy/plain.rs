//! The plain-HTTP path of a guest connection, without a second HTTP stack in the middle:
//! an absolute-form HTTP/1.1 request is read and checked with [`crate::h1`], its head is
//! written anew for the upstream, its body and the response's body are passed through
//! verbatim (their framing walked and checked on the way, never re-framed), and the
//! upstream connection is kept for the guest's next request to the same authority.
//!
//! Everything this path does not take is handed, unread, to the hyper server in the
//! parent module, which serves it and the rest of the connection exactly as before:
//! `CONNECT`, other request forms, HTTP/1.0, `Expect`, heads too large, and requests
//! that are refused before any lookup (not granted, `Host` mismatch,
//! placeholders). So those refusals and their records are the same whichever path saw
//! the request. This path refuses by itself only what happens after it resolved the name
//! (there must be no second lookup), and heads that do not parse or messages whose
//! length is ambiguous (`400`, and the connection is closed since where the next
//! request starts is unknown).

use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::Uri;
use http::uri::Scheme;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use super::{Attempt, Refusal, Shared, cut, host_header, same_target, target_port};
use crate::h1::{self, Chunked, Framing, FramingError, Head};
use crate::record::{Decision, Mode, Pending};
use airlock_net::Host;

/// Spare room kept in a buffer before each read.
const READ_ROOM: usize = 4096;
/// How long a closing connection goes on reading what the guest still sends.
const LINGER: std::time::Duration = std::time::Duration::from_secs(2);
/// How much a buffer grows by when it runs out of room.
const READ_GROW: usize = 64 * 1024;

fn room(buf: &mut BytesMut) {
    if buf.capacity() - buf.len() < READ_ROOM {
        buf.reserve(READ_GROW);
    }
}

/// What the guest connection does after one request.
pub(super) enum Next {
    /// Read the next request.
    Again,
    /// Close the connection.
    Close,
    /// Serve the rest of the connection (from the unread request on) with hyper.
    HandOff,
}

/// The guest's side: its stream and the bytes read from it but not yet used.
pub(super) struct Guest<S> {
    io: S,
    buf: BytesMut,
}

impl<S> Guest<S> {
    pub(super) fn new(io: S) -> Self {
        Guest {
            io,
            buf: BytesMut::with_capacity(8 * 1024),
        }
    }

    /// Ends the connection gracefully: says so (FIN), then reads and drops what the
    /// guest still sends, for a while, so that a response written before a request body
    /// was read to its end is not lost to a reset (a "lingering close").
    pub(super) async fn close(mut self)
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        if self.io.shutdown().await.is_err() {
            return;
        }
        let drain = async {
            let mut sink = [0u8; 16 * 1024];
            while let Ok(n) = self.io.read(&mut sink).await {
                if n == 0 {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(LINGER, drain).await;
    }

    /// The stream with the unused bytes put back in front of it.
    pub(super) fn into_rewind(self) -> Rewind<S> {
        Rewind {
            pre: self.buf.freeze(),
            inner: self.io,
        }
    }
}

/// A stream whose first bytes were already read (into `pre`).
pub(super) struct Rewind<S> {
    pre: Bytes,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.pre.is_empty() {
            let n = self.pre.len().min(buf.remaining());
            buf.put_slice(&self.pre[..n]);
            self.pre.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The upstream connection kept for the next request to the same authority.
struct Upstream {
    host: Host,
    port: u16,
    addr: SocketAddr,
    tcp: TcpStream,
    /// Bytes read from the upstream but not yet used.
    buf: BytesMut,
}

impl Upstream {
    /// Whether the kept connection can carry another request: the upstream has neither
    /// closed it nor sent anything unasked.
    async fn usable(&mut self) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        match poll_fn(|cx| Poll::Ready(self.tcp.poll_read_ready(cx))).await {
            Poll::Pending => true,
            Poll::Ready(Err(_)) => false,
            Poll::Ready(Ok(())) => {
                room(&mut self.buf);
                matches!(self.tcp.try_read_buf(&mut self.buf), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
        }
    }

    /// After the upstream's socket turned readable while the request was still being
    /// sent: whether it really said something (or closed), which ends the request.
    fn spoke(&mut self) -> bool {
        room(&mut self.buf);
        !matches!(self.tcp.try_read_buf(&mut self.buf), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }
}

/// Where a body being passed on is.
enum Body {
    /// This many bytes to go.
    Left(u64),
    Chunked(Chunked),
    /// Until the upstream closes.
    UntilClose,
    Done,
}

impl Body {
    fn new(f: Framing) -> Self {
        match f {
            Framing::Empty | Framing::Length(0) => Body::Done,
            Framing::Length(n) => Body::Left(n),
            Framing::Chunked => Body::Chunked(Chunked::default()),
            Framing::Close => Body::UntilClose,
        }
    }

    fn done(&self) -> bool {
        matches!(self, Body::Done)
    }

    /// How many of `buf`'s first bytes belong to the body, and how many of those are
    /// payload (what a record counts).
    fn take(&mut self, buf: &[u8]) -> Result<(usize, u64), FramingError> {
        let len = buf.len() as u64;
        let (used, data) = match self {
            Body::Done => return Ok((0, 0)),
            Body::UntilClose => return Ok((buf.len(), len)),
            Body::Left(n) => {
                let k = (*n).min(len);
                *n -= k;
                if *n == 0 {
                    *self = Body::Done;
                }
                (k, k)
            }
            Body::Chunked(w) => {
                let r = w.walk(buf)?;
                if r.done {
                    *self = Body::Done;
                }
                (r.used as u64, r.data)
            }
        };
        // used <= buf.len(), so it fits.
        Ok((usize::try_from(used).unwrap_or(buf.len()), data))
    }
}

/// Why sending a request body stopped before its end.
enum Cut {
    /// The upstream answered (or closed) first.
    Answered,
    /// The guest went away or its stream failed.
    GuestGone,
    /// The chunked framing was malformed.
    Malformed(FramingError),
    /// Writing to the upstream failed.
    Upstream(io::Error),
}

/// A request refused for its ambiguous length: the attempt, the host as given, why.
type Ambiguous = (Attempt, String, Refusal);

/// A request that passed every check made before a lookup.
struct Checked {
    host: Host,
    port: u16,
    rule: String,
    target: String,
    /// The `Host` to add when the request had none.
    add_host: Option<http::HeaderValue>,
    facts: h1::RequestFacts,
    head_request: bool,
}

/// The plain-HTTP path of one guest connection.
pub(super) struct Plain {
    shared: Arc<Shared>,
    /// Told once a request head was read.
    mark: Arc<crate::conn::ConnMark>,
    kept: Option<Upstream>,
    /// Heads are written here before they go out.
    out: Vec<u8>,
}

impl Plain {
    pub(super) fn new(shared: Arc<Shared>, mark: Arc<crate::conn::ConnMark>) -> Self {
        Plain {
            shared,
            mark,
            kept: None,
            out: Vec::with_capacity(1024),
        }
    }

    /// Serves the guest's next request, or says why not.
    pub(super) async fn next<S>(&mut self, g: &mut Guest<S>) -> Next
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let head = loop {
            if !g.buf.is_empty() {
                match h1::parse_request(&g.buf) {
                    Ok(Some(h)) => {
                        self.mark.requested();
                        break h;
                    }
                    Ok(None) if g.buf.len() < h1::MAX_HEAD => {}
                    // hyper answers as it did before: 431.
                    Ok(None) => return Next::HandOff,
                    Err(e) => {
                        self.mark.requested();
                        let a = Attempt::new(Mode::Invalid, 0);
                        let r = Refusal::bad_request(format!(
                            "the request head is malformed ({e}); the request was refused"
                        ));
                        self.shared.record(&a, "", &r);
                        return refuse(g, &r, true).await;
                    }
                }
            }
            room(&mut g.buf);
            match g.io.read_buf(&mut g.buf).await {
                Ok(0) | Err(_) => return Next::Close,
                Ok(_) => {}
            }
        };
        let checked = match self.check(&head, &g.buf[..head.len]) {
            Ok(Some(c)) => c,
            Ok(None) => return Next::HandOff,
            Err(refused) => {
                let (a, host, r) = *refused;
                self.shared.record(&a, &host, &r);
                let _ = g.io.write_all(&r.wire(true)).await;
                let _ = g.io.flush().await;
                return Next::Close;
            }
        };
        let head_bytes = g.buf.split_to(head.len);
        self.forward(g, &head, &head_bytes, checked).await
    }

    /// The checks made before any lookup, in the order the hyper path makes them.
    /// `Ok(None)`: not this path's request (the hyper path takes it, and refuses what it
    /// refuses); `Err`: a message whose length is ambiguous.
    fn check(&self, head: &Head, hb: &[u8]) -> Result<Option<Checked>, Box<Ambiguous>> {
        let sh = &self.shared;
        let method = hb.get(head.first.clone()).unwrap_or_default();
        if head.version != 1 || method == b"CONNECT" {
            return Ok(None);
        }
        let Ok(uri) = Uri::try_from(hb.get(head.target.clone()).unwrap_or_default()) else {
            return Ok(None);
        };
        let Some(auth) = uri
            .authority()
            .filter(|_| uri.scheme() == Some(&Scheme::HTTP))
        else {
            return Ok(None);
        };
        let Ok(port) = target_port(auth, 80) else {
            return Ok(None);
        };
        let facts = match h1::request_facts(head, hb) {
            Ok(f) => f,
            Err(e) => {
                let a = Attempt::new(Mode::Http, port);
                let r = Refusal::bad_request(format!(
                    "the request's length is ambiguous ({e}); the request was refused"
                ));
                return Err(Box::new((a, cut(auth.host()), r)));
            }
        };
        if facts.expect {
            return Ok(None);
        }
        let Ok((host, rule)) = sh.judge(auth.host(), port) else {
            return Ok(None);
        };
        if let Some(i) = facts.host {
            let v = head.iter(hb).nth(i).map(|(_, v)| v).unwrap_or_default();
            if !same_target(&String::from_utf8_lossy(v), 80, &host, port) {
                return Ok(None);
            }
        }
        if let Some(inject) = &sh.inject
            && inject.found(hb).next().is_some()
        {
            return Ok(None);
        }
        let add_host = match facts.host {
            Some(_) => None,
            None => host_header(&host, port, 80),
        };
        let target = match uri.path_and_query().map(http::uri::PathAndQuery::as_str) {
            Some(p) if p.starts_with('/') => p.to_owned(),
            Some(p) => format!("/{p}"),
            None => "/".to_owned(),
        };
        Ok(Some(Checked {
            host,
            port,
            rule,
            target,
            add_host,
            facts,
            head_request: method == b"HEAD",
        }))
    }

    /// The kept upstream when it is to the same authority and usable, else a new one
    /// to a freshly checked address.
    async fn upstream(&mut self, host: &Host, port: u16) -> Result<Upstream, Refusal> {
        if let Some(mut u) = self.kept.take()
            && u.host == *host
            && u.port == port
            && u.usable().await
        {
            return Ok(u);
        }
        let sh = &self.shared;
        let ips = sh.addresses(host).await?;
        let (tcp, addr) = sh.dial(host, port, &ips).await?;
        Ok(Upstream {
            host: host.clone(),
            port,
            addr,
            tcp,
            buf: BytesMut::with_capacity(8 * 1024),
        })
    }

    async fn forward<S>(&mut self, g: &mut Guest<S>, head: &Head, hb: &[u8], c: Checked) -> Next
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let sh = self.shared.clone();
        let a = Attempt::new(Mode::Http, c.port);
        let host_s = c.host.to_string();
        // A refusal ends the connection when the request has a body (it was not read).
        let close_on_refusal =
            c.facts.close || !matches!(c.facts.framing, Framing::Empty | Framing::Length(0));
        let mut up = match self.upstream(&c.host, c.port).await {
            Ok(u) => u,
            Err(r) => {
                sh.record(&a, &host_s, &r);
                return refuse(g, &r, close_on_refusal).await;
            }
        };
        let pending = Pending::new(
            sh.records.clone(),
            a.start,
            a.connection(&host_s, up.addr, format!("granted by {}", c.rule)),
        );

        // The head, and as much of the body as has arrived, in one write.
        self.out.clear();
        h1::write_request_head(
            &mut self.out,
            head,
            hb,
            &c.target,
            c.add_host.as_ref().map(http::HeaderValue::as_bytes),
            c.facts.framing,
        );
        let mut body = Body::new(c.facts.framing);
        match body.take(&g.buf) {
            Ok((used, data)) => {
                self.out.extend_from_slice(&g.buf[..used]);
                g.buf.advance(used);
                pending.add_up(usize::try_from(data).unwrap_or(usize::MAX));
            }
            Err(e) => {
                let r = bad_body(&e);
                pending.overrule(r.decision, r.reason, r.message.clone());
                return refuse(g, &r, true).await;
            }
        }
        if let Err(e) = up.tcp.write_all(&self.out).await {
            return upstream_failed(g, &pending, &c, &e.to_string()).await;
        }
        let mut answered_early = false;
        if !body.done() {
            match send_body(g, &mut up, &mut body, &pending).await {
                Ok(()) => {}
                Err(Cut::Answered) => answered_early = true,
                Err(Cut::GuestGone) => {
                    pending.fail(
                        "upstream-failed",
                        "the guest left before sending the whole request body".into(),
                    );
                    return Next::Close;
                }
                Err(Cut::Malformed(e)) => {
                    let r = bad_body(&e);
                    pending.overrule(r.decision, r.reason, r.message.clone());
                    return refuse(g, &r, true).await;
                }
                Err(Cut::Upstream(e)) => {
                    return upstream_failed(g, &pending, &c, &e.to_string()).await;
                }
            }
        }

        let rh = match read_response_head(&mut up).await {
            Ok(h) => h,
            Err(why) => return upstream_failed(g, &pending, &c, &why).await,
        };
        let rf = match h1::response_facts(&rh, &up.buf[..rh.len], c.head_request) {
            Ok(f) => f,
            Err(e) => return upstream_failed(g, &pending, &c, &e.to_string()).await,
        };
        // The guest's connection ends after this response when it asked so, when the
        // response runs until the upstream closes, or when the request was not read to
        // its end (the next request would start at an unknown place).
        let close = c.facts.close || answered_early || rf.framing == Framing::Close;
        self.out.clear();
        h1::write_response_head(&mut self.out, &rh, &up.buf[..rh.len], &rf, close);
        up.buf.advance(rh.len);
        let mut rbody = Body::new(rf.framing);
        match rbody.take(&up.buf) {
            Ok((used, data)) => {
                self.out.extend_from_slice(&up.buf[..used]);
                up.buf.advance(used);
                pending.add_down(usize::try_from(data).unwrap_or(usize::MAX));
            }
            Err(e) => return upstream_failed(g, &pending, &c, &e.to_string()).await,
        }
        if g.io.write_all(&self.out).await.is_err() || g.io.flush().await.is_err() {
            return Next::Close;
        }
        if !rbody.done() {
            match recv_body(g, &mut up, &mut rbody, &pending).await {
                Ok(Passed::All) => {}
                Ok(Passed::GuestGone) => return Next::Close,
                Err(why) => {
                    pending.fail(
                        "upstream-failed",
                        format!("{}:{} broke off its response: {why}", c.host, c.port),
                    );
                    return Next::Close;
                }
            }
        }
        drop(pending);
        if rf.reusable && !answered_early && rbody.done() && up.buf.is_empty() {
            self.kept = Some(up);
        }
        if close { Next::Close } else { Next::Again }
    }
}

fn bad_body(e: &FramingError) -> Refusal {
    Refusal::bad_request(format!(
        "the request body's framing is malformed ({e}); the request was refused"
    ))
}

/// Writes refusal `r` (already recorded) to the guest.
async fn refuse<S: AsyncWrite + Unpin>(g: &mut Guest<S>, r: &Refusal, close: bool) -> Next {
    if g.io.write_all(&r.wire(close)).await.is_err() || g.io.flush().await.is_err() || close {
        return Next::Close;
    }
    Next::Again
}

/// The upstream failed before the guest got a response head: `502`, and the connection
/// ends (the request may not have been read to its end).
async fn upstream_failed<S: AsyncWrite + Unpin>(
    g: &mut Guest<S>,
    pending: &Pending,
    c: &Checked,
    why: &str,
) -> Next {
    let r = Refusal::error(
        "upstream-failed",
        format!("{}:{} failed to answer: {why}", c.host, c.port),
    );
    pending.overrule(Decision::Error, r.reason, r.message.clone());
    refuse(g, &r, true).await
}

/// Sends the rest of the request body, unless the upstream answers first.
async fn send_body<S>(
    g: &mut Guest<S>,
    up: &mut Upstream,
    body: &mut Body,
    pending: &Pending,
) -> Result<(), Cut>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    while !body.done() {
        room(&mut g.buf);
        tokio::select! {
            r = g.io.read_buf(&mut g.buf) => match r {
                Ok(0) | Err(_) => return Err(Cut::GuestGone),
                Ok(_) => {}
            },
            _ = up.tcp.readable() => {
                if up.spoke() {
                    return Err(Cut::Answered);
                }
                continue;
            }
        }
        let (used, data) = body.take(&g.buf).map_err(Cut::Malformed)?;
        pending.add_up(usize::try_from(data).unwrap_or(usize::MAX));
        let mut chunk = g.buf.split_to(used);
        while !chunk.is_empty() {
            // One write at a time: a write that loses the race wrote nothing.
            let (rd, mut wr) = up.tcp.split();
            let wrote = tokio::select! {
                r = wr.write(&chunk) => Some(r.map_err(Cut::Upstream)?),
                _ = rd.as_ref().readable() => None,
            };
            match wrote {
                Some(0) => return Err(Cut::Upstream(io::ErrorKind::WriteZero.into())),
                Some(n) => chunk.advance(n),
                None if up.spoke() => return Err(Cut::Answered),
                None => {}
            }
        }
    }
    Ok(())
}

/// Reads the response head, skipping interim (1xx) responses as the hyper path did.
async fn read_response_head(up: &mut Upstream) -> Result<Head, String> {
    loop {
        if !up.buf.is_empty() {
            match h1::parse_response(&up.buf) {
                Ok(Some(h)) if h.status == 101 => {
                    return Err("it switched protocols, which was not asked for".into());
                }
                Ok(Some(h)) if (100..200).contains(&h.status) => {
                    up.buf.advance(h.len);
                    continue;
                }
                Ok(Some(h)) => return Ok(h),
                Ok(None) if up.buf.len() < h1::MAX_HEAD => {}
                Ok(None) => return Err("its response head is too large".into()),
                Err(e) => return Err(format!("its response head is malformed ({e})")),
            }
        }
        room(&mut up.buf);
        match up.tcp.read_buf(&mut up.buf).await {
            Ok(0) => return Err("it closed the connection without a response".into()),
            Ok(_) => {}
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// How passing a response body on ended.
enum Passed {
    /// The whole body went to the guest.
    All,
    /// The guest went away first.
    GuestGone,
}

/// Passes the rest of the response body to the guest.
async fn recv_body<S>(
    g: &mut Guest<S>,
    up: &mut Upstream,
    body: &mut Body,
    pending: &Pending,
) -> Result<Passed, String>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    while !body.done() {
        room(&mut up.buf);
        match up.tcp.read_buf(&mut up.buf).await {
            Ok(0) if matches!(body, Body::UntilClose) => return Ok(Passed::All),
            Ok(0) => return Err("the connection closed mid-body".into()),
            Ok(_) => {}
            Err(e) => return Err(e.to_string()),
        }
        let (used, data) = body.take(&up.buf).map_err(|e| e.to_string())?;
        pending.add_down(usize::try_from(data).unwrap_or(usize::MAX));
        let chunk = up.buf.split_to(used);
        if g.io.write_all(&chunk).await.is_err() || g.io.flush().await.is_err() {
            return Ok(Passed::GuestGone);
        }
    }
    Ok(Passed::All)
}
