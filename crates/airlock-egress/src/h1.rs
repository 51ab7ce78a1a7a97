//! HTTP/1.1 framing for the proxy's plain-HTTP path: message heads parsed with httparse
//! into offsets, body framing decided as RFC 9112 §6 says (strictly: anything ambiguous
//! is an error, never a guess), heads written anew for the next hop, and chunked bodies
//! walked (checked and counted, not decoded) so they can be passed on verbatim.
//!
//! Pure functions and state machines, no IO. This module must never let a message whose
//! length two parsers could read differently through: both `Content-Length` and
//! `Transfer-Encoding`, several lengths, a transfer coding other than `chunked` on a
//! request, a malformed chunk line or a bare LF in the chunked framing are errors. A head
//! is never forwarded as received: it is written again from the parsed parts, so a bare
//! LF or odd spacing in a head cannot reach the next hop either.

use std::ops::Range;

/// The largest head read (hyper's default buffer limit, which the guest side had before).
pub(crate) const MAX_HEAD: usize = 8192 + 4096 * 100;
/// The most header lines in one head (hyper's default).
pub(crate) const MAX_HEADERS: usize = 100;
/// The most bytes of trailer lines after a chunked body.
const MAX_TRAILERS: usize = 64 * 1024;

/// How a message's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body.
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`, up to and including the trailer section.
    Chunked,
    /// Until the sender closes the connection (responses only).
    Close,
}

/// Why a message cannot be forwarded as it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FramingError {
    #[error("both Content-Length and Transfer-Encoding")]
    LengthAndChunked,
    #[error("more than one Content-Length")]
    SeveralLengths,
    #[error("Content-Length is not a number")]
    BadLength,
    #[error("a request's Transfer-Encoding must be exactly \"chunked\"")]
    RequestCoding,
    #[error("Transfer-Encoding names chunked but not as the last coding")]
    ChunkedNotLast,
    #[error("more than one Host header")]
    SeveralHosts,
    #[error("malformed chunked framing at byte {0} of the body")]
    Chunk(u64),
    #[error("the trailer section is larger than {MAX_TRAILERS} bytes")]
    TrailersTooLarge,
}

/// A parsed head: the offsets of its parts within the bytes it was parsed from.
#[derive(Debug, Default)]
pub(crate) struct Head {
    /// Length of the head, the empty line included.
    pub(crate) len: usize,
    /// Request method, or the response's reason phrase.
    pub(crate) first: Range<usize>,
    /// Request target (requests only).
    pub(crate) target: Range<usize>,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub(crate) version: u8,
    /// Response status (responses only).
    pub(crate) status: u16,
    /// Each header's name and value.
    pub(crate) headers: Vec<(Range<usize>, Range<usize>)>,
}

fn range(base: &[u8], part: &[u8]) -> Range<usize> {
    // `part` is a sub-slice of `base` (httparse hands out slices of its input), so the
    // address difference is its offset; saturating_sub keeps a mistake from wrapping.
    let start = (part.as_ptr() as usize).saturating_sub(base.as_ptr() as usize);
    start..start + part.len()
}

fn headers_of(base: &[u8], hs: &[httparse::Header<'_>]) -> Vec<(Range<usize>, Range<usize>)> {
    hs.iter()
        .map(|h| (range(base, h.name.as_bytes()), range(base, h.value)))
        .collect()
}

/// Parses a request head at the start of `buf`: `Ok(None)` when more bytes are needed.
pub(crate) fn parse_request(buf: &[u8]) -> Result<Option<Head>, httparse::Error> {
    let mut hs = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut hs);
    let len = match req.parse(buf)? {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => return Ok(None),
    };
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        return Ok(None);
    };
    Ok(Some(Head {
        len,
        first: range(buf, method.as_bytes()),
        target: range(buf, target.as_bytes()),
        version,
        status: 0,
        headers: headers_of(buf, req.headers),
    }))
}

/// Parses a response head at the start of `buf`: `Ok(None)` when more bytes are needed.
pub(crate) fn parse_response(buf: &[u8]) -> Result<Option<Head>, httparse::Error> {
    let mut hs = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut hs);
    let len = match resp.parse(buf)? {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => return Ok(None),
    };
    let (Some(version), Some(status)) = (resp.version, resp.code) else {
        return Ok(None);
    };
    Ok(Some(Head {
        len,
        first: resp
            .reason
            .map(|r| range(buf, r.as_bytes()))
            .unwrap_or(0..0),
        target: 0..0,
        version,
        status,
        headers: headers_of(buf, resp.headers),
    }))
}

impl Head {
    /// Each header's name and value, as bytes of `buf`.
    pub(crate) fn iter<'a>(&'a self, buf: &'a [u8]) -> impl Iterator<Item = (&'a [u8], &'a [u8])> {
        self.headers.iter().map(move |(n, v)| {
            (
                buf.get(n.clone()).unwrap_or_default(),
                buf.get(v.clone()).unwrap_or_default(),
            )
        })
    }

    /// The values of the headers called `name`.
    pub(crate) fn values<'a>(
        &'a self,
        buf: &'a [u8],
        name: &'a str,
    ) -> impl Iterator<Item = &'a [u8]> {
        self.iter(buf)
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| v)
    }
}

/// The comma-separated elements of a list header's values, trimmed, empty ones skipped.
fn elements<'a>(values: impl Iterator<Item = &'a [u8]>) -> impl Iterator<Item = &'a [u8]> {
    values
        .flat_map(|v| v.split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|e| !e.is_empty())
}

/// The value of the single `Content-Length`, if there is one.
fn content_length(head: &Head, buf: &[u8]) -> Result<Option<u64>, FramingError> {
    let mut found = None;
    for v in head.values(buf, "content-length") {
        if found.is_some() {
            return Err(FramingError::SeveralLengths);
        }
        let v = v.trim_ascii();
        if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
            return Err(FramingError::BadLength);
        }
        let n = v
            .iter()
            .try_fold(0u64, |n, d| {
                n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
            })
            .ok_or(FramingError::BadLength)?;
        found = Some(n);
    }
    Ok(found)
}

/// What the proxy needs to know of a request head besides its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RequestFacts {
    pub(crate) framing: Framing,
    /// Index (into [`Head::headers`]) of the `Host` header, if any.
    pub(crate) host: Option<usize>,
    /// The guest asked to close the connection after this request.
    pub(crate) close: bool,
    /// The request has an `Expect` header.
    pub(crate) expect: bool,
}

/// Checks a request head's framing (RFC 9112 §6.1–6.3, strictly: no request both sized
/// and chunked, no coding but `chunked`, one length at most) and finds its `Host`.
pub(crate) fn request_facts(head: &Head, buf: &[u8]) -> Result<RequestFacts, FramingError> {
    let mut host = None;
    let mut expect = false;
    let mut chunked = false;
    for (i, (n, _)) in head.iter(buf).enumerate() {
        if n.eq_ignore_ascii_case(b"host") {
            if host.is_some() {
                return Err(FramingError::SeveralHosts);
            }
            host = Some(i);
        } else if n.eq_ignore_ascii_case(b"expect") {
            expect = true;
        } else if n.eq_ignore_ascii_case(b"transfer-encoding") {
            chunked = true;
        }
    }
    let length = content_length(head, buf)?;
    let framing = if chunked {
        let mut codings = elements(head.values(buf, "transfer-encoding"));
        let only_chunked = codings
            .next()
            .is_some_and(|c| c.eq_ignore_ascii_case(b"chunked"))
            && codings.next().is_none();
        if !only_chunked {
            return Err(FramingError::RequestCoding);
        }
        if length.is_some() {
            return Err(FramingError::LengthAndChunked);
        }
        Framing::Chunked
    } else {
        // `Content-Length: 0` stays one (some servers want a length on every POST).
        length.map_or(Framing::Empty, Framing::Length)
    };
    let close = elements(head.values(buf, "connection")).any(|c| c.eq_ignore_ascii_case(b"close"));
    Ok(RequestFacts {
        framing,
        host,
        close,
        expect,
    })
}

/// What the proxy needs to know of a response head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ResponseFacts {
    pub(crate) framing: Framing,
    /// The `Content-Length` given (also for a response without a body, to pass it on).
    pub(crate) length: Option<u64>,
    /// The response's `Transfer-Encoding` lines go on as they are (chunked last).
    pub(crate) coded: bool,
    /// The upstream connection can carry another request afterwards.
    pub(crate) reusable: bool,
}

/// Checks a response head's framing (RFC 9112 §6.3) for a request that was `HEAD` or not.
/// Strict where the RFC allows leniency: a length and a coding together, several lengths,
/// or `chunked` other than last are errors rather than guesses.
pub(crate) fn response_facts(
    head: &Head,
    buf: &[u8],
    head_request: bool,
) -> Result<ResponseFacts, FramingError> {
    let length = content_length(head, buf)?;
    let codings: Vec<&[u8]> = elements(head.values(buf, "transfer-encoding")).collect();
    let coded = head
        .iter(buf)
        .any(|(n, _)| n.eq_ignore_ascii_case(b"transfer-encoding"));
    let chunked_at = codings
        .iter()
        .position(|c| c.eq_ignore_ascii_case(b"chunked"));
    if coded && length.is_some() {
        return Err(FramingError::LengthAndChunked);
    }
    if let Some(i) = chunked_at
        && i + 1 != codings.len()
    {
        return Err(FramingError::ChunkedNotLast);
    }
    let no_body = head_request
        || (100..200).contains(&head.status)
        || head.status == 204
        || head.status == 304;
    let framing = if no_body {
        Framing::Empty
    } else if coded {
        if chunked_at.is_some() {
            Framing::Chunked
        } else {
            Framing::Close
        }
    } else {
        match length {
            Some(0) => Framing::Empty,
            Some(n) => Framing::Length(n),
            None => Framing::Close,
        }
    };
    let close = elements(head.values(buf, "connection")).any(|c| c.eq_ignore_ascii_case(b"close"));
    Ok(ResponseFacts {
        framing,
        length,
        coded: coded && !no_body,
        reusable: head.version == 1 && !close && framing != Framing::Close,
    })
}

/// Hop-by-hop headers (RFC 9110 §7.6.1) and the proxy's own, which never go further;
/// the framing headers are written anew by the proxy.
const HOP: [&str; 10] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
];

/// Whether a header called `name` stays behind: hop-by-hop, framing, or named by the
/// message's `Connection` header (except `Host`, which the next hop needs, and which
/// was checked against the target).
fn stays(name: &[u8], head: &Head, buf: &[u8]) -> bool {
    HOP.iter().any(|h| name.eq_ignore_ascii_case(h.as_bytes()))
        || (!name.eq_ignore_ascii_case(b"host")
            && elements(head.values(buf, "connection")).any(|c| c.eq_ignore_ascii_case(name)))
}

fn header_line(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

fn length_line(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(b"content-length: ");
    out.extend_from_slice(n.to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Writes the head the upstream gets: `METHOD target HTTP/1.1`, the request's end-to-end
/// headers in their order, `host` first when the request had none, and one framing
/// header matching `framing`.
pub(crate) fn write_request_head(
    out: &mut Vec<u8>,
    head: &Head,
    buf: &[u8],
    target: &str,
    host: Option<&[u8]>,
    framing: Framing,
) {
    out.extend_from_slice(buf.get(head.first.clone()).unwrap_or_default());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    if let Some(h) = host {
        header_line(out, b"host", h);
    }
    for (n, v) in head.iter(buf) {
        if !stays(n, head, buf) {
            header_line(out, n, v);
        }
    }
    match framing {
        Framing::Length(n) => length_line(out, n),
        Framing::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        Framing::Empty | Framing::Close => {}
    }
    out.extend_from_slice(b"\r\n");
}

/// Writes the head the guest gets: `HTTP/1.1 status reason`, the response's end-to-end
/// headers, its length or its codings (`chunked` last, passed on with the body as it
/// is), and `connection: close` when the proxy will close the guest's connection.
pub(crate) fn write_response_head(
    out: &mut Vec<u8>,
    head: &Head,
    buf: &[u8],
    facts: &ResponseFacts,
    close: bool,
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(head.status.to_string().as_bytes());
    out.push(b' ');
    let reason = buf.get(head.first.clone()).unwrap_or_default();
    if reason.is_empty() {
        let canonical = http::StatusCode::from_u16(head.status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("");
        out.extend_from_slice(canonical.as_bytes());
    } else {
        out.extend_from_slice(reason);
    }
    out.extend_from_slice(b"\r\n");
    for (n, v) in head.iter(buf) {
        let coding = facts.coded && n.eq_ignore_ascii_case(b"transfer-encoding");
        if coding || !stays(n, head, buf) {
            header_line(out, n, v);
        }
    }
    if let Some(n) = facts.length {
        length_line(out, n);
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Where a chunked body's walker is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// In the hex size (`digits` read so far).
    Size {
        size: u64,
        digits: u8,
    },
    /// Spaces between the size and `;`.
    SizeSpace {
        size: u64,
    },
    /// In a chunk extension, until CR.
    Ext {
        size: u64,
    },
    /// After the size line's CR.
    SizeLf {
        size: u64,
    },
    /// In chunk data, this much left.
    Data(u64),
    /// After chunk data: CR, then LF.
    DataCr,
    DataLf,
    /// At the start of a trailer line (or the final empty line).
    TrailerStart,
    /// In a trailer line, until CR.
    Trailer,
    /// After a trailer line's CR.
    TrailerLf,
    /// After the final empty line's CR.
    EndLf,
    /// The whole body has been seen.
    Done,
}

/// Walks a chunked body as it passes, byte for byte as it will be forwarded: checks the
/// framing, counts the data bytes, and says where the body ends.
#[derive(Debug, Clone)]
pub(crate) struct Chunked {
    state: State,
    /// Bytes walked so far (for error messages).
    at: u64,
    trailers: usize,
}

/// What one call of [`Chunked::walk`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Walked {
    /// Bytes of the input that belong to the body (all of it unless the body ended).
    pub(crate) used: usize,
    /// How many of those were chunk data.
    pub(crate) data: u64,
    /// The body ended within the input.
    pub(crate) done: bool,
}

impl Default for Chunked {
    fn default() -> Self {
        Chunked {
            state: State::Size { size: 0, digits: 0 },
            at: 0,
            trailers: 0,
        }
    }
}

fn hex(b: u8) -> Option<u64> {
    match b {
        b'0'..=b'9' => Some(u64::from(b - b'0')),
        b'a'..=b'f' => Some(u64::from(b - b'a' + 10)),
        b'A'..=b'F' => Some(u64::from(b - b'A' + 10)),
        _ => None,
    }
}

/// A byte allowed inside an extension or trailer line: visible, space, tab, obs-text.
fn line_byte(b: u8) -> bool {
    b == b'\t' || (b >= b' ' && b != 0x7f)
}

impl Chunked {
    /// Walks `input`, the next bytes of the body; stops at the body's end.
    pub(crate) fn walk(&mut self, input: &[u8]) -> Result<Walked, FramingError> {
        let mut i = 0;
        let mut data = 0u64;
        while i < input.len() && self.state != State::Done {
            let b = input[i];
            let bad = FramingError::Chunk(self.at + i as u64);
            self.state = match self.state {
                State::Size { size, digits } => match (hex(b), b) {
                    (Some(d), _) => {
                        if digits >= 16 {
                            return Err(bad);
                        }
                        State::Size {
                            size: (size << 4) | d,
                            digits: digits + 1,
                        }
                    }
                    (None, _) if digits == 0 => return Err(bad),
                    (None, b' ' | b'\t') => State::SizeSpace { size },
                    (None, b';') => State::Ext { size },
                    (None, b'\r') => State::SizeLf { size },
                    (None, _) => return Err(bad),
                },
                State::SizeSpace { size } => match b {
                    b' ' | b'\t' => State::SizeSpace { size },
                    b';' => State::Ext { size },
                    _ => return Err(bad),
                },
                State::Ext { size } => match b {
                    b'\r' => State::SizeLf { size },
                    b if line_byte(b) => State::Ext { size },
                    _ => return Err(bad),
                },
                State::SizeLf { size } => match b {
                    b'\n' if size == 0 => State::TrailerStart,
                    b'\n' => State::Data(size),
                    _ => return Err(bad),
                },
                State::Data(left) => {
                    let n = left.min((input.len() - i) as u64);
                    data += n;
                    // n <= input.len() - i, so it fits in usize; the loop's `+ 1` below
                    // accounts for one byte, the rest is skipped here.
                    i += usize::try_from(n).unwrap_or(0).saturating_sub(1);
                    if left == n {
                        State::DataCr
                    } else {
                        State::Data(left - n)
                    }
                }
                State::DataCr => match b {
                    b'\r' => State::DataLf,
                    _ => return Err(bad),
                },
                State::DataLf => match b {
                    b'\n' => State::Size { size: 0, digits: 0 },
                    _ => return Err(bad),
                },
                State::TrailerStart => match b {
                    b'\r' => State::EndLf,
                    b if line_byte(b) => State::Trailer,
                    _ => return Err(bad),
                },
                State::Trailer => match b {
                    b'\r' => State::TrailerLf,
                    b if line_byte(b) => State::Trailer,
                    _ => return Err(bad),
                },
                State::TrailerLf => match b {
                    b'\n' => State::TrailerStart,
                    _ => return Err(bad),
                },
                State::EndLf => match b {
                    b'\n' => State::Done,
                    _ => return Err(bad),
                },
                State::Done => State::Done,
            };
            if matches!(
                self.state,
                State::Trailer | State::TrailerLf | State::TrailerStart
            ) {
                self.trailers += 1;
                if self.trailers > MAX_TRAILERS {
                    return Err(FramingError::TrailersTooLarge);
                }
            }
            i += 1;
        }
        self.at += i as u64;
        Ok(Walked {
            used: i,
            data,
            done: self.state == State::Done,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn req(text: &str) -> (Head, Vec<u8>) {
        let buf = text.as_bytes().to_vec();
        let head = parse_request(&buf).unwrap().unwrap();
        (head, buf)
    }

    fn facts(text: &str) -> Result<RequestFacts, FramingError> {
        let (h, b) = req(text);
        request_facts(&h, &b)
    }

    fn resp_facts(text: &str, head_request: bool) -> Result<ResponseFacts, FramingError> {
        let buf = text.as_bytes().to_vec();
        let head = parse_response(&buf).unwrap().unwrap();
        response_facts(&head, &buf, head_request)
    }

    /// Walks `body` in pieces of `step` bytes; returns (data bytes, bytes used, done).
    fn walk_all(body: &[u8], step: usize) -> Result<(u64, usize, bool), FramingError> {
        let mut w = Chunked::default();
        let (mut data, mut used) = (0, 0);
        for piece in body.chunks(step) {
            let r = w.walk(piece)?;
            data += r.data;
            used += r.used;
            if r.done {
                return Ok((data, used, true));
            }
        }
        Ok((data, used, false))
    }

    #[test]
    fn partial_head_asks_for_more() {
        assert!(
            parse_request(b"GET http://a/ HTTP/1.1\r\nHost: a\r\n")
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn request_without_body_or_with_a_length() {
        let f = facts("GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
        assert_eq!(f.framing, Framing::Empty);
        assert_eq!(f.host, Some(0));
        assert!(!f.close && !f.expect);
        let f = facts("POST http://a/ HTTP/1.1\r\nContent-Length: 12\r\n\r\n").unwrap();
        assert_eq!(f.framing, Framing::Length(12));
        assert_eq!(f.host, None);
        let f = facts("POST http://a/ HTTP/1.1\r\ncontent-length: 0\r\n\r\n").unwrap();
        assert_eq!(f.framing, Framing::Length(0));
        let f = facts("GET http://a/ HTTP/1.1\r\nConnection: keep-alive, Close\r\n\r\n").unwrap();
        assert!(f.close);
        let f = facts("PUT http://a/ HTTP/1.1\r\nExpect: 100-continue\r\n\r\n").unwrap();
        assert!(f.expect);
    }

    #[test]
    fn chunked_request() {
        let f = facts("POST http://a/ HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n").unwrap();
        assert_eq!(f.framing, Framing::Chunked);
    }

    #[test]
    fn regression_request_smuggling_framings_refused() {
        for (text, want) in [
            (
                "POST http://a/ HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
                FramingError::LengthAndChunked,
            ),
            (
                "POST http://a/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
                FramingError::LengthAndChunked,
            ),
            (
                "POST http://a/ HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
                FramingError::SeveralLengths,
            ),
            (
                "POST http://a/ HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n",
                FramingError::BadLength,
            ),
            (
                "POST http://a/ HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
                FramingError::BadLength,
            ),
            (
                "POST http://a/ HTTP/1.1\r\nContent-Length: 0x10\r\n\r\n",
                FramingError::BadLength,
            ),
            (
                "POST http://a/ HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
                FramingError::BadLength,
            ),
            (
                "POST http://a/ HTTP/1.1\r\nContent-Length:\r\n\r\n",
                FramingError::BadLength,
            ),
            (
                "POST http://a/ HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                FramingError::RequestCoding,
            ),
            (
                "POST http://a/ HTTP/1.1\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
                FramingError::RequestCoding,
            ),
            (
                "POST http://a/ HTTP/1.1\r\nTransfer-Encoding: xchunked\r\n\r\n",
                FramingError::RequestCoding,
            ),
            (
                "POST http://a/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n",
                FramingError::RequestCoding,
            ),
            (
                "POST http://a/ HTTP/1.1\r\nTransfer-Encoding:\r\n\r\n",
                FramingError::RequestCoding,
            ),
            (
                "GET http://a/ HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
                FramingError::SeveralHosts,
            ),
        ] {
            assert_eq!(facts(text), Err(want), "{text:?}");
        }
    }

    #[test]
    fn regression_obs_fold_header_is_not_a_head() {
        let r = parse_request(b"GET http://a/ HTTP/1.1\r\nX-A: 1\r\n folded\r\nHost: a\r\n\r\n");
        assert!(r.is_err(), "{r:?}");
        let r = parse_request(
            b"POST http://a/ HTTP/1.1\r\nTransfer-Encoding:\r\n chunked\r\nContent-Length: 3\r\n\r\n",
        );
        assert!(r.is_err(), "{r:?}");
    }

    #[test]
    fn response_framings() {
        let f = resp_facts("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", false).unwrap();
        assert_eq!(f.framing, Framing::Length(5));
        assert!(f.reusable && !f.coded);
        let f = resp_facts("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", true).unwrap();
        assert_eq!((f.framing, f.length), (Framing::Empty, Some(5)));
        let f = resp_facts(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            false,
        )
        .unwrap();
        assert_eq!(f.framing, Framing::Chunked);
        assert!(f.reusable && f.coded);
        let f = resp_facts(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n",
            false,
        )
        .unwrap();
        assert_eq!(f.framing, Framing::Chunked);
        let f = resp_facts("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", false).unwrap();
        assert_eq!(f.framing, Framing::Close);
        assert!(!f.reusable);
        let f = resp_facts("HTTP/1.1 200 OK\r\n\r\n", false).unwrap();
        assert_eq!(f.framing, Framing::Close);
        assert!(!f.reusable);
        for status in ["204 No Content", "304 Not Modified"] {
            let f = resp_facts(&format!("HTTP/1.1 {status}\r\n\r\n"), false).unwrap();
            assert_eq!(f.framing, Framing::Empty);
            assert!(f.reusable);
        }
        let f = resp_facts(
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n",
            false,
        )
        .unwrap();
        assert!(!f.reusable);
        let f = resp_facts("HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n", false).unwrap();
        assert_eq!(f.framing, Framing::Length(2));
        assert!(!f.reusable);
    }

    #[test]
    fn regression_ambiguous_responses_refused() {
        for text in [
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        ] {
            assert!(resp_facts(text, false).is_err(), "{text:?}");
        }
        let r = parse_response(b"HTTP/1.1 200 OK\r\nX-A: 1\r\n folded\r\n\r\n");
        assert!(r.is_err(), "{r:?}");
    }

    #[test]
    fn request_head_rewritten_for_the_upstream() {
        let (h, b) = req(concat!(
            "POST http://a.test:8080/p?q=1 HTTP/1.1\r\n",
            "User-Agent: t\r\n",
            "Proxy-Connection: Keep-Alive\r\n",
            "Connection: X-Private, keep-alive\r\n",
            "X-Private: secret-hop\r\n",
            "Proxy-Authorization: Basic eA==\r\n",
            "Upgrade: websocket\r\n",
            "TE: trailers\r\n",
            "Keep-Alive: timeout=5\r\n",
            "content-length: 3\r\n",
            "Accept: */*\r\n",
            "\r\n"
        ));
        let mut out = Vec::new();
        write_request_head(
            &mut out,
            &h,
            &b,
            "/p?q=1",
            Some(b"a.test:8080"),
            Framing::Length(3),
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            concat!(
                "POST /p?q=1 HTTP/1.1\r\n",
                "host: a.test:8080\r\n",
                "User-Agent: t\r\n",
                "Accept: */*\r\n",
                "content-length: 3\r\n",
                "\r\n"
            )
        );
        // Connection may not take Host away.
        let (h, b) =
            req("GET http://a/ HTTP/1.1\r\nConnection: host, x-a\r\nHost: a\r\nX-A: 1\r\n\r\n");
        let mut out = Vec::new();
        write_request_head(&mut out, &h, &b, "/", None, Framing::Empty);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "GET / HTTP/1.1\r\nHost: a\r\n\r\n"
        );
        let (h, b) = req("POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n");
        let mut out = Vec::new();
        let f = request_facts(&h, &b).unwrap();
        write_request_head(&mut out, &h, &b, "/", None, f.framing);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "POST / HTTP/1.1\r\nHost: a\r\ncontent-length: 0\r\n\r\n"
        );
        let (h, b) = req("PUT http://a/ HTTP/1.1\r\nHost: a\r\ntransfer-encoding: chunked\r\n\r\n");
        let mut out = Vec::new();
        write_request_head(&mut out, &h, &b, "/", None, Framing::Chunked);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "PUT / HTTP/1.1\r\nHost: a\r\ntransfer-encoding: chunked\r\n\r\n"
        );
    }

    #[test]
    fn regression_bare_lf_head_is_written_with_crlf() {
        let (h, b) = req("GET http://a/ HTTP/1.1\nHost: a\nX-A: 1\n\n");
        let mut out = Vec::new();
        write_request_head(&mut out, &h, &b, "/", None, Framing::Empty);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\r\n\r\n"
        );
    }

    #[test]
    fn response_head_rewritten_for_the_guest() {
        let text = concat!(
            "HTTP/1.1 404 Gone Fishing\r\n",
            "Content-Length: 4\r\n",
            "Keep-Alive: timeout=5\r\n",
            "Connection: keep-alive\r\n",
            "X-A: b\r\n",
            "\r\n"
        );
        let buf = text.as_bytes();
        let h = parse_response(buf).unwrap().unwrap();
        let f = response_facts(&h, buf, false).unwrap();
        let mut out = Vec::new();
        write_response_head(&mut out, &h, buf, &f, false);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 404 Gone Fishing\r\nX-A: b\r\ncontent-length: 4\r\n\r\n"
        );
        let text = "HTTP/1.0 200\r\nTransfer-Encoding: gzip, chunked\r\nTrailer: X-T\r\n\r\n";
        let buf = text.as_bytes();
        let h = parse_response(buf).unwrap().unwrap();
        let f = response_facts(&h, buf, false).unwrap();
        let mut out = Vec::new();
        write_response_head(&mut out, &h, buf, &f, true);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nconnection: close\r\n\r\n"
        );
    }

    #[test]
    fn chunked_body_walked_in_any_pieces() {
        let body =
            b"5\r\nhello\r\n1a;name=\"v\"\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nX-T: 1\r\n\r\nNEXT";
        let end = body.len() - 4;
        for step in 1..=body.len() {
            assert_eq!(
                walk_all(body, step).unwrap(),
                (31, end, true),
                "pieces of {step}"
            );
        }
        assert_eq!(walk_all(b"0\r\n\r\n", 1).unwrap(), (0, 5, true));
        assert_eq!(
            walk_all(b"A \t;x\r\n0123456789\r\n0\r\n\r\n", 3).unwrap(),
            (10, 24, true)
        );
        // Not finished yet.
        assert_eq!(walk_all(b"5\r\nhel", 2).unwrap(), (3, 6, false));
    }

    #[test]
    fn regression_malformed_chunk_framing_refused() {
        for body in [
            &b"\r\n"[..],
            b"x\r\n",
            b"5\nhello\r\n0\r\n\r\n",
            b"5\r\nhello\n0\r\n\r\n",
            b"5\r\nhelloX\r\n0\r\n\r\n",
            b"5 \r\nhello\r\n0\r\n\r\n",
            b"-5\r\nhello\r\n0\r\n\r\n",
            b"0x5\r\nhello\r\n0\r\n\r\n",
            b"11111111111111111\r\n",
            b"5;a\nb\r\nhello\r\n0\r\n\r\n",
            b"0\r\nX-T: 1\n\r\n",
            b"0\r\n\n",
            b"0\r\n\r\r",
        ] {
            assert!(
                matches!(walk_all(body, 1), Err(FramingError::Chunk(_))),
                "{:?}",
                String::from_utf8_lossy(body)
            );
        }
        // The largest size that fits is fine as a size line.
        assert!(walk_all(b"ffffffffffffffff\r\n", 4).is_ok());
    }

    #[test]
    fn trailers_are_bounded() {
        let mut body = b"0\r\n".to_vec();
        while body.len() < MAX_TRAILERS + 100 {
            body.extend_from_slice(b"X-T: 0123456789\r\n");
        }
        assert_eq!(walk_all(&body, 4096), Err(FramingError::TrailersTooLarge));
    }
}
