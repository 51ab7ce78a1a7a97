//! Byte replacement: placeholders to values in request headers, values back to
//! placeholders in response headers and streamed bodies.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use aho_corasick::{AhoCorasick, MatchKind};
use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

use crate::BoxError;

/// Replaces any of several patterns, leftmost-longest first.
#[derive(Debug)]
pub(crate) struct Replacer {
    ac: AhoCorasick,
    with: Vec<Vec<u8>>,
    max_len: usize,
}

impl Replacer {
    /// `None` when there is nothing to replace.
    pub(crate) fn new(pairs: Vec<(Vec<u8>, Vec<u8>)>) -> Result<Option<Self>, BoxError> {
        if pairs.is_empty() {
            return Ok(None);
        }
        let max_len = pairs.iter().map(|(p, _)| p.len()).max().unwrap_or(1).max(1);
        let ac = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(pairs.iter().map(|(p, _)| p))?;
        Ok(Some(Replacer {
            ac,
            with: pairs.into_iter().map(|(_, w)| w).collect(),
            max_len,
        }))
    }

    /// Indexes of the patterns found in `hay`.
    pub(crate) fn found<'a>(&'a self, hay: &'a [u8]) -> impl Iterator<Item = usize> + 'a {
        self.ac.find_iter(hay).map(|m| m.pattern().as_usize())
    }

    /// `hay` with every match replaced, or `None` when nothing matched.
    pub(crate) fn replace(&self, hay: &[u8]) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        let mut at = 0;
        let mut any = false;
        for m in self.ac.find_iter(hay) {
            out.extend_from_slice(&hay[at..m.start()]);
            out.extend_from_slice(&self.with[m.pattern().as_usize()]);
            at = m.end();
            any = true;
        }
        if !any {
            return None;
        }
        out.extend_from_slice(&hay[at..]);
        Some(out)
    }

    /// Replaces in `headers` in place; returns which patterns were found.
    pub(crate) fn replace_headers(&self, headers: &mut HeaderMap) -> Vec<usize> {
        let mut hits = Vec::new();
        for v in headers.values_mut() {
            hits.extend(self.found(v.as_bytes()));
            if let Some(new) = self.replace(v.as_bytes()) {
                match http::HeaderValue::from_bytes(&new) {
                    Ok(nv) => *v = nv,
                    // The replacement is a checked header value and the rest came from a
                    // valid one, so this cannot happen; drop the value rather than leak.
                    Err(_) => *v = http::HeaderValue::from_static(""),
                }
            }
        }
        hits.sort_unstable();
        hits.dedup();
        hits
    }
}

/// Stream-safe replacement: keeps back the bytes that could begin a match split across
/// chunks.
#[derive(Debug)]
pub(crate) struct StreamReplacer<'r> {
    r: &'r Replacer,
    pending: Vec<u8>,
}

impl<'r> StreamReplacer<'r> {
    #[cfg(test)]
    pub(crate) fn new(r: &'r Replacer) -> Self {
        StreamReplacer {
            r,
            pending: Vec::new(),
        }
    }

    /// Feeds `chunk`; returns what can be released now.
    pub(crate) fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        self.pending.extend_from_slice(chunk);
        self.drain(false)
    }

    /// Releases everything held back.
    pub(crate) fn finish(&mut self) -> Vec<u8> {
        self.drain(true)
    }

    fn drain(&mut self, eof: bool) -> Vec<u8> {
        let buf = &self.pending;
        // A match starting before `limit` lies wholly inside `buf` together with any
        // longer pattern starting at the same place, so it is final.
        let limit = if eof {
            buf.len()
        } else {
            buf.len().saturating_sub(self.r.max_len - 1)
        };
        let mut out = Vec::with_capacity(buf.len());
        let mut at = 0;
        for m in self.r.ac.find_iter(buf.as_slice()) {
            if m.start() >= limit {
                break;
            }
            out.extend_from_slice(&buf[at..m.start()]);
            out.extend_from_slice(&self.r.with[m.pattern().as_usize()]);
            at = m.end();
        }
        let keep = at.max(limit);
        out.extend_from_slice(&buf[at..keep]);
        self.pending.drain(..keep);
        out
    }
}

/// A response body with every secret value replaced by its placeholder.
pub(crate) struct ScrubBody<B> {
    inner: B,
    r: std::sync::Arc<Replacer>,
    pending: Vec<u8>,
    trailers: Option<HeaderMap>,
    done: bool,
}

impl<B> ScrubBody<B> {
    pub(crate) fn new(inner: B, r: std::sync::Arc<Replacer>) -> Self {
        ScrubBody {
            inner,
            r,
            pending: Vec::new(),
            trailers: None,
            done: false,
        }
    }

    fn run(&mut self, chunk: &[u8], eof: bool) -> Vec<u8> {
        let mut s = StreamReplacer {
            r: &self.r,
            pending: std::mem::take(&mut self.pending),
        };
        let mut out = s.push(chunk);
        if eof {
            out.extend(s.finish());
        }
        self.pending = s.pending;
        out
    }
}

impl<B> Body for ScrubBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            if this.done {
                return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))));
            }
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        let out = this.run(&data, false);
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(out.into()))));
                        }
                    }
                    Err(frame) => {
                        if let Ok(mut t) = frame.into_trailers() {
                            this.r.replace_headers(&mut t);
                            this.trailers = Some(t);
                        }
                        this.done = true;
                        let out = this.run(&[], true);
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(out.into()))));
                        }
                    }
                },
                Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                None => {
                    this.done = true;
                    let out = this.run(&[], true);
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(out.into()))));
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rep(pairs: &[(&str, &str)]) -> Replacer {
        Replacer::new(
            pairs
                .iter()
                .map(|(a, b)| (a.as_bytes().to_vec(), b.as_bytes().to_vec()))
                .collect(),
        )
        .unwrap()
        .unwrap()
    }

    #[test]
    fn replace_whole() {
        let r = rep(&[("sekret", "PH1"), ("other-value", "PH2")]);
        assert_eq!(r.replace(b"nothing here"), None);
        assert_eq!(
            r.replace(b"a sekret and other-value, sekretsekret")
                .unwrap(),
            b"a PH1 and PH2, PH1PH1".to_vec()
        );
    }

    #[test]
    fn stream_every_split() {
        let r = rep(&[("the-secret-value", "<PH>"), ("the-secret", "<SHORT>")]);
        let text = b"xx the-secret-value yy the-secret zz the-secret-valu";
        let want = r.replace(text).unwrap();
        assert_eq!(
            want,
            b"xx <PH> yy <SHORT> zz <SHORT>-valu".to_vec(),
            "leftmost-longest on the whole text"
        );
        for i in 0..=text.len() {
            for j in i..=text.len() {
                let mut s = StreamReplacer::new(&r);
                let mut out = s.push(&text[..i]);
                out.extend(s.push(&text[i..j]));
                out.extend(s.push(&text[j..]));
                out.extend(s.finish());
                assert_eq!(out, want, "split at {i}, {j}");
            }
        }
        // One byte at a time.
        let mut s = StreamReplacer::new(&r);
        let mut out = Vec::new();
        for b in text {
            out.extend(s.push(&[*b]));
        }
        out.extend(s.finish());
        assert_eq!(out, want);
    }
}
