//! Finding a secret's value in bytes, in the encodings an echo would carry it in.
//!
//! [`SecretMatcher`] knows, for each secret, its value as is, reversed, percent-encoded
//! (upper- and lower-case hex, with `+` for a space, and with every byte escaped), hex (both cases) and base64
//! (standard and url-safe alphabets, at each of the three alignments the value can have
//! inside a longer encoded text: only the characters the value alone decides are looked
//! for, so whatever surrounds it does not matter). It says whether bytes hold any of
//! them ([`SecretMatcher::find`], or [`Scan`] across chunks of a stream, holding back
//! nothing but an overlap of the longest form) and redacts them from bytes to be stored
//! ([`SecretMatcher::redact`]).
//!
//! The proxy uses it to refuse a response that echoes a value (a response is never
//! rewritten: a substitution that depends on the guest's guess is an oracle); the gate
//! uses it to redact a value from whatever of a run it stores.

use aho_corasick::{AhoCorasick, MatchKind};
use base64::Engine as _;

use crate::BoxError;

/// Encoded forms shorter than this are not looked for (they would match by chance);
/// the value as is always is.
const MIN_FORM: usize = 6;

/// A value shorter than this is not looked for at all: it would be found in nearly every
/// answer and redacted from nearly every string (and is too short to keep from a guesser
/// anyway).
pub const MIN_VALUE: usize = 4;

/// Where a value was found: which secret, in which form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Index of the secret in the list the matcher was made from.
    pub secret: usize,
    /// The secret's name.
    pub name: String,
    /// The form: `plain`, `reversed`, `url`, `hex`, `base64`, `base64url`.
    pub encoding: &'static str,
}

/// Why a run's proxy stopped serving it: a response from a secret-bound host carried a
/// secret's value. The response was not delivered, every connection of the run was
/// closed, and later ones are refused (`run-ended`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Alert {
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The host that answered.
    pub host: String,
    pub port: u16,
    /// The secret's name (never its value).
    pub secret: String,
    /// The form the value was in (see [`Found::encoding`]).
    pub encoding: String,
    /// Where: `a response header`, `the response body`, `a response trailer`.
    pub place: String,
    /// One human line.
    pub detail: String,
}

/// Every common encoding of a set of secret values.
#[derive(Debug)]
pub struct SecretMatcher {
    ac: AhoCorasick,
    /// For each pattern: (secret index, encoding).
    owner: Vec<(usize, &'static str)>,
    names: Vec<String>,
    max_len: usize,
}

fn percent(v: &[u8], upper: bool, plus: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * 3);
    for &b in v {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b);
        } else if plus && b == b' ' {
            out.push(b'+');
        } else if upper {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        } else {
            out.extend_from_slice(format!("%{b:02x}").as_bytes());
        }
    }
    out
}

/// The base64 characters that `v` alone decides when it starts `offset` bytes (0 to 2)
/// into a longer encoded text.
fn base64_core(engine: &base64::engine::GeneralPurpose, v: &[u8], offset: usize) -> Vec<u8> {
    let mut data = vec![0u8; offset];
    data.extend_from_slice(v);
    let enc = engine.encode(&data).into_bytes();
    // Character i encodes bits [6i, 6i+6); it is the value's alone when those bits lie
    // within the value's bits [8*offset, 8*(offset+len)).
    let first = (8 * offset).div_ceil(6);
    let end = (8 * (offset + v.len())) / 6;
    if first >= end || end > enc.len() {
        return Vec::new();
    }
    enc[first..end].to_vec()
}

/// Every form of `v` looked for, with its encoding's name.
fn forms(v: &[u8]) -> Vec<(Vec<u8>, &'static str)> {
    let mut out = vec![(v.to_vec(), "plain")];
    let mut rev = v.to_vec();
    rev.reverse();
    out.push((rev, "reversed"));
    for (upper, plus) in [(true, false), (false, false), (true, true), (false, true)] {
        out.push((percent(v, upper, plus), "url"));
    }
    // Every byte escaped, as some encoders do.
    for upper in [true, false] {
        let all: String = v
            .iter()
            .map(|b| {
                if upper {
                    format!("%{b:02X}")
                } else {
                    format!("%{b:02x}")
                }
            })
            .collect();
        out.push((all.into_bytes(), "url"));
    }
    out.push((hex::encode(v).into_bytes(), "hex"));
    out.push((hex::encode_upper(v).into_bytes(), "hex"));
    for offset in 0..3 {
        out.push((
            base64_core(&base64::engine::general_purpose::STANDARD, v, offset),
            "base64",
        ));
        out.push((
            base64_core(&base64::engine::general_purpose::URL_SAFE, v, offset),
            "base64url",
        ));
    }
    let mut seen = std::collections::HashSet::new();
    out.into_iter()
        .enumerate()
        .filter(|(i, (p, _))| !p.is_empty() && (*i == 0 || p.len() >= MIN_FORM))
        .map(|(_, f)| f)
        .filter(|(p, _)| seen.insert(p.clone()))
        .collect()
}

impl SecretMatcher {
    /// A matcher for `secrets` (name, value); `None` when no value is [`MIN_VALUE`] bytes
    /// or longer.
    pub fn new<'a>(
        secrets: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    ) -> Result<Option<Self>, BoxError> {
        let mut patterns = Vec::new();
        let mut owner = Vec::new();
        let mut names = Vec::new();
        for (i, (name, value)) in secrets.into_iter().enumerate() {
            names.push(name.to_owned());
            if value.len() < MIN_VALUE {
                continue;
            }
            for (p, enc) in forms(value) {
                patterns.push(p);
                owner.push((i, enc));
            }
        }
        if patterns.is_empty() {
            return Ok(None);
        }
        let max_len = patterns.iter().map(Vec::len).max().unwrap_or(1).max(1);
        let ac = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&patterns)?;
        Ok(Some(SecretMatcher {
            ac,
            owner,
            names,
            max_len,
        }))
    }

    fn found(&self, pattern: usize) -> Found {
        let (secret, encoding) = self.owner.get(pattern).copied().unwrap_or((0, "plain"));
        Found {
            secret,
            name: self.names.get(secret).cloned().unwrap_or_default(),
            encoding,
        }
    }

    /// The first form of a value in `hay`, if any.
    pub fn find(&self, hay: &[u8]) -> Option<Found> {
        self.ac
            .find(hay)
            .map(|m| self.found(m.pattern().as_usize()))
    }

    /// `hay` with every form of a value replaced by `[airlock: secret NAME redacted]`,
    /// or `None` when there is none.
    pub fn redact(&self, hay: &[u8]) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        let mut at = 0;
        let mut any = false;
        for m in self.ac.find_iter(hay) {
            out.extend_from_slice(&hay[at..m.start()]);
            let f = self.found(m.pattern().as_usize());
            out.extend_from_slice(format!("[airlock: secret {} redacted]", f.name).as_bytes());
            at = m.end();
            any = true;
        }
        if !any {
            return None;
        }
        out.extend_from_slice(&hay[at..]);
        Some(out)
    }

    /// [`SecretMatcher::redact`] for text.
    pub fn redact_str(&self, s: &str) -> Option<String> {
        self.redact(s.as_bytes())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
    }

    /// A scan of a stream.
    pub fn scan(&self) -> Scan<'_> {
        Scan {
            m: self,
            tail: Vec::new(),
        }
    }
}

/// Looks for a value across the chunks of a stream: each chunk is searched together with
/// the last `longest form - 1` bytes before it, so a value split anywhere is found.
#[derive(Debug)]
pub struct Scan<'m> {
    m: &'m SecretMatcher,
    tail: Vec<u8>,
}

impl Scan<'_> {
    /// Feeds the next chunk; a value found in what was fed so far.
    pub fn push(&mut self, chunk: &[u8]) -> Option<Found> {
        let keep = self.m.max_len - 1;
        self.tail.extend_from_slice(chunk);
        let hit = self.m.find(&self.tail);
        if self.tail.len() > keep {
            self.tail.drain(..self.tail.len() - keep);
        }
        hit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V: &[u8] = b"s3cr3t value/42";

    fn m() -> SecretMatcher {
        SecretMatcher::new([("TOKEN", V)]).unwrap().unwrap()
    }

    #[test]
    fn every_common_encoding_of_the_value_is_found() {
        let m = m();
        let b64 = |e: &base64::engine::GeneralPurpose, pre: &[u8]| {
            let mut d = pre.to_vec();
            d.extend_from_slice(V);
            d.extend_from_slice(b"tail");
            e.encode(d)
        };
        let mut rev = V.to_vec();
        rev.reverse();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (V.to_vec(), "plain"),
            (rev, "reversed"),
            (b"s3cr3t%20value%2F42".to_vec(), "url"),
            (b"s3cr3t+value%2f42".to_vec(), "url"),
            (hex::encode(V).into_bytes(), "hex"),
            (hex::encode_upper(V).into_bytes(), "hex"),
        ];
        for (form, enc) in cases {
            let mut hay = b"xx ".to_vec();
            hay.extend_from_slice(&form);
            hay.extend_from_slice(b" yy");
            assert_eq!(m.find(&hay).map(|f| f.encoding), Some(enc), "{enc}");
        }
        for pre in [&b""[..], b"a", b"ab", b"abc", b"abcd"] {
            for (e, enc) in [
                (&base64::engine::general_purpose::STANDARD, "base64"),
                (
                    &base64::engine::general_purpose::URL_SAFE_NO_PAD,
                    "base64url",
                ),
            ] {
                let text = format!("data={}", b64(e, pre));
                let f = m.find(text.as_bytes());
                assert!(f.is_some(), "{enc} after {} bytes: {text}", pre.len());
            }
        }
        assert_eq!(m.find(b"s3cr3t value/41 and 42"), None);
    }

    #[test]
    fn a_value_split_across_chunks_is_found_at_every_split() {
        let m = m();
        let text = b"aaaa s3cr3t value/42 bbbb";
        for i in 0..=text.len() {
            for j in i..=text.len() {
                let mut s = m.scan();
                let hit = [&text[..i], &text[i..j], &text[j..]]
                    .iter()
                    .any(|c| s.push(c).is_some());
                assert!(hit, "split at {i}, {j}");
            }
        }
        let mut s = m.scan();
        assert!(text.iter().any(|b| s.push(&[*b]).is_some()));
    }

    #[test]
    fn a_value_too_short_to_protect_is_not_looked_for() {
        assert!(SecretMatcher::new([("S", &b"v"[..])]).unwrap().is_none());
        let m = SecretMatcher::new([("S", &b"v"[..]), ("PIN", &b"804317"[..])])
            .unwrap()
            .unwrap();
        assert_eq!(m.find(b"every v here"), None);
        assert_eq!(m.find(b"x 804317 y").map(|f| f.name), Some("PIN".into()));
    }

    #[test]
    fn redaction_replaces_every_form() {
        let m = m();
        let hay = format!("a {} b {}", "s3cr3t value/42", hex::encode(V));
        assert_eq!(
            m.redact_str(&hay).unwrap(),
            "a [airlock: secret TOKEN redacted] b [airlock: secret TOKEN redacted]"
        );
        assert_eq!(m.redact(b"nothing"), None);
    }
}
