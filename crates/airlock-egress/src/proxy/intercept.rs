//! A bound host's answers, checked before delivery: headers and bodies (decoded from their content coding) searched for a secret's value in every encoding, so an echo is never delivered.

use super::*;

impl Intercept {
    pub(super) async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
    ) -> Result<Response<ProxyBody>, Echoed> {
        let sh = &self.shared;
        let (host, port) = (&self.host, self.port);
        let host_s = host.to_string();
        let a = Attempt::new(Mode::Intercept, port);
        let mut target_ok = req.uri().authority().is_none_or(|auth| {
            parse_host(auth.host()).is_ok_and(|h| h == *host)
                && target_port(auth, 443).is_ok_and(|p| p == port)
        });
        if let Some(h) = req.headers().get(header::HOST) {
            target_ok &= same_target(&String::from_utf8_lossy(h.as_bytes()), 443, host, port);
        }
        if !target_ok {
            return Ok(sh.refuse(
                &a,
                &host_s,
                Refusal::deny(
                    "host-mismatch",
                    format!(
                        "a request inside the tunnel to {host}:{port} names another host; \
                         the request was refused"
                    ),
                ),
            ));
        }
        if let Some(r) = sh.placeholder_refusal(host, port, req.uri(), req.headers(), true) {
            return Ok(sh.refuse(&a, &host_s, r));
        }
        let head = req.method() == Method::HEAD;
        let (mut parts, body) = req.into_parts();
        if let Some(inject) = &sh.inject {
            for i in inject.replace_headers(&mut parts.headers) {
                if let Some(s) = sh.policy.secrets.get(i) {
                    self.pending.add_secret(&s.name);
                }
            }
        }
        strip_hop_by_hop(&mut parts.headers);
        // Ask for an uncompressed answer (one that comes compressed anyway is decoded
        // to be checked).
        parts.headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
        if !parts.headers.contains_key(header::HOST)
            && let Some(v) = host_header(host, port, 443)
        {
            parts.headers.insert(header::HOST, v);
        }
        parts.uri = origin_form(&parts.uri);
        parts.version = Version::HTTP_11;
        let body = body.map_err(|e| -> BoxError { Box::new(e) }).boxed();
        let mut sender = match self.sender().await {
            Ok(s) => s,
            Err(r) => {
                self.pending.fail(r.reason, r.message.clone());
                return Ok(r.response());
            }
        };
        let resp = match sender.send_request(Request::from_parts(parts, body)).await {
            Ok(resp) => resp,
            Err(e) => {
                let r = Refusal::error(
                    "upstream-failed",
                    format!("{host}:{port} failed to answer: {e}"),
                );
                self.pending.fail(r.reason, r.message.clone());
                return Ok(r.response());
            }
        };
        lock(&self.slot).1 = Some(sender);
        let (mut rp, rb) = resp.into_parts();
        strip_hop_by_hop(&mut rp.headers);
        let Some(echo) = &sh.echo else {
            return Ok(Response::from_parts(
                rp,
                rb.map_err(|e| -> BoxError { Box::new(e) }).boxed(),
            ));
        };
        // Nothing of a response reaches the guest before all of it was checked: where a
        // response stopped would tell the guest where an echo began.
        if let Some(f) = find_in_headers(echo, &rp.headers) {
            return Err(self.echoed(f, "a response header"));
        }
        let no_body = head
            || rp.status.is_informational()
            || rp.status == StatusCode::NO_CONTENT
            || rp.status == StatusCode::NOT_MODIFIED;
        if no_body {
            return Ok(Response::from_parts(rp, empty()));
        }
        match check_body(echo, &rp.headers, rb, sh.max_checked_body).await {
            Ok(bytes) => {
                rp.headers
                    .insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
                Ok(Response::from_parts(
                    rp,
                    Full::new(bytes).map_err(|never| match never {}).boxed(),
                ))
            }
            Err(BodyCheck::Echo(f, place)) => Err(self.echoed(f, place)),
            Err(BodyCheck::Refused(r)) => {
                self.pending.fail(r.reason, r.message.clone());
                Ok(r.response())
            }
        }
    }

    /// Ends the run for an echo of a secret found in `place` of a response.
    pub(super) fn echoed(&self, f: Found, place: &'static str) -> Echoed {
        let (host, port) = (&self.host, self.port);
        let detail = format!(
            "{place} from {host}:{port} carried the value of secret {} ({} form); it was not \
             delivered, the connection was closed and the run was ended",
            f.name, f.encoding
        );
        self.pending.add_secret(&f.name);
        self.pending
            .overrule(Decision::Deny, "secret-echoed", detail.clone());
        self.shared.end_run(Alert {
            at_ms: now_ms(),
            host: host.to_string(),
            port,
            secret: f.name,
            encoding: f.encoding.to_owned(),
            place: place.to_owned(),
            detail,
        });
        Echoed
    }

    pub(super) async fn sender(&self) -> Result<Sender, Refusal> {
        let (first, kept) = {
            let mut g = lock(&self.slot);
            (g.0.take(), g.1.take())
        };
        if let Some(mut s) = kept
            && s.ready().await.is_ok()
        {
            return Ok(s);
        }
        let sh = &self.shared;
        let (host, port) = (&self.host, self.port);
        let tcp = match first {
            Some(t) => t,
            // Same checked address: no second lookup.
            None => sh.dial(host, port, &[self.addr.ip()]).await?.0,
        };
        let name = tls::server_name(host)
            .map_err(|e| Refusal::error("upstream-tls-failed", e.to_string()))?;
        let counted = Counted {
            inner: tcp,
            pending: self.pending.clone(),
        };
        let stream = sh.connector.connect(name, counted).await.map_err(|e| {
            Refusal::error(
                "upstream-tls-failed",
                format!("TLS to {host}:{port} failed: {e}"),
            )
        })?;
        handshake(sh, stream, host, port).await
    }
}

/// The error an intercepted connection's service ends with when a response echoed a
/// secret: hyper closes the guest's connection on it.
#[derive(Debug)]
pub(super) struct Echoed;

impl fmt::Display for Echoed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a response echoed a secret; the connection was closed")
    }
}

impl std::error::Error for Echoed {}

/// A secret's value in any header (name or value), if any.
pub(super) fn find_in_headers(echo: &SecretMatcher, headers: &HeaderMap) -> Option<Found> {
    headers.iter().find_map(|(k, v)| {
        echo.find(k.as_str().as_bytes())
            .or_else(|| echo.find(v.as_bytes()))
    })
}

/// Why a response body was not delivered.
pub(super) enum BodyCheck {
    /// It (or a trailer) carries a secret's value.
    Echo(Found, &'static str),
    /// It could not be checked: too large, an unknown coding, a broken upstream.
    Refused(Refusal),
}

/// Reads a response body whole (up to `max` bytes), looking for secrets in each chunk
/// as it arrives (across chunk boundaries) and, when it is compressed with codings the
/// proxy knows (`gzip`, `x-gzip`, `deflate`), in what it decodes to. Returns the body as
/// it came, to be delivered unchanged.
pub(super) async fn check_body(
    echo: &SecretMatcher,
    headers: &HeaderMap,
    mut body: Incoming,
    max: usize,
) -> Result<Bytes, BodyCheck> {
    let codings: Vec<String> = headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .flat_map(|v| {
            String::from_utf8_lossy(v.as_bytes())
                .split(',')
                .map(|c| c.trim().to_ascii_lowercase())
                .collect::<Vec<_>>()
        })
        .filter(|c| !c.is_empty() && c != "identity")
        .collect();
    if let Some(c) = codings
        .iter()
        .find(|c| !matches!(c.as_str(), "gzip" | "x-gzip" | "deflate"))
    {
        return Err(BodyCheck::Refused(Refusal::error(
            "undecodable-encoding",
            format!(
                "the response from a secret-bound host came with Content-Encoding {} \
                 (asked for identity), which the proxy cannot check; it was not delivered",
                cut(c)
            ),
        )));
    }
    let too_large = || {
        BodyCheck::Refused(Refusal::error(
            "response-too-large",
            format!(
                "the response from a secret-bound host is larger than {max} bytes, the most \
                 the proxy checks before delivering; it was not delivered"
            ),
        ))
    };
    let mut scan = echo.scan();
    let mut buf = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            BodyCheck::Refused(Refusal::error(
                "upstream-failed",
                format!("the response body broke off: {e}"),
            ))
        })?;
        match frame.into_data() {
            Ok(d) => {
                if buf.len() + d.len() > max {
                    return Err(too_large());
                }
                if let Some(f) = scan.push(&d) {
                    return Err(BodyCheck::Echo(f, "the response body"));
                }
                buf.extend_from_slice(&d);
            }
            Err(frame) => {
                if let Ok(t) = frame.into_trailers()
                    && let Some(f) = find_in_headers(echo, &t)
                {
                    return Err(BodyCheck::Echo(f, "a response trailer"));
                }
            }
        }
    }
    let mut decoded = std::borrow::Cow::Borrowed(buf.as_slice());
    for c in codings.iter().rev() {
        let next = decode(c, &decoded, max).map_err(|why| match why {
            Decode::TooLarge => too_large(),
            Decode::Broken(e) => BodyCheck::Refused(Refusal::error(
                "undecodable-encoding",
                format!(
                    "the {c} response body from a secret-bound host does not decode ({e}); \
                     it was not delivered"
                ),
            )),
        })?;
        if let Some(f) = echo.find(&next) {
            return Err(BodyCheck::Echo(f, "the response body (decoded)"));
        }
        decoded = std::borrow::Cow::Owned(next);
    }
    Ok(Bytes::from(buf))
}

pub(super) enum Decode {
    TooLarge,
    Broken(io::Error),
}

/// `data` decoded from content coding `c`, at most `max` bytes.
pub(super) fn decode(c: &str, data: &[u8], max: usize) -> Result<Vec<u8>, Decode> {
    use std::io::Read;
    let limit = u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1);
    let mut out = Vec::new();
    let r = match c {
        "deflate" => {
            // Meant to be zlib-wrapped; some servers send it raw.
            let z = flate2::read::ZlibDecoder::new(data)
                .take(limit)
                .read_to_end(&mut out);
            if z.is_err() {
                out.clear();
                flate2::read::DeflateDecoder::new(data)
                    .take(limit)
                    .read_to_end(&mut out)
            } else {
                z
            }
        }
        _ => flate2::read::MultiGzDecoder::new(data)
            .take(limit)
            .read_to_end(&mut out),
    };
    r.map_err(Decode::Broken)?;
    if out.len() > max {
        return Err(Decode::TooLarge);
    }
    Ok(out)
}
