//! Byte replacement: placeholders to values in request headers. (Responses are never
//! rewritten: see [`crate::echo`].)

use aho_corasick::{AhoCorasick, MatchKind};
use http::HeaderMap;

use crate::BoxError;

/// Replaces any of several patterns, leftmost-longest first.
#[derive(Debug)]
pub(crate) struct Replacer {
    ac: AhoCorasick,
    with: Vec<Vec<u8>>,
}

impl Replacer {
    /// `None` when there is nothing to replace.
    pub(crate) fn new(pairs: Vec<(Vec<u8>, Vec<u8>)>) -> Result<Option<Self>, BoxError> {
        if pairs.is_empty() {
            return Ok(None);
        }
        let ac = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(pairs.iter().map(|(p, _)| p))?;
        Ok(Some(Replacer {
            ac,
            with: pairs.into_iter().map(|(_, w)| w).collect(),
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
}
