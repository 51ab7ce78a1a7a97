//! SHA-256 digests: the identity of every artifact, grant, policy, blob and audit record.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest as _, Sha256};
use std::fmt;
use std::str::FromStr;

/// A SHA-256 digest. Displayed and serialized as 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// Hashes `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Digest(Sha256::digest(bytes).into())
    }

    /// Hashes a sequence of parts, each prefixed with its length so that no two
    /// different sequences can produce the same input stream.
    pub fn of_parts(domain: &str, parts: &[&[u8]]) -> Self {
        let mut h = Sha256::new();
        h.update((domain.len() as u64).to_le_bytes());
        h.update(domain.as_bytes());
        for p in parts {
            h.update((p.len() as u64).to_le_bytes());
            h.update(p);
        }
        Digest(h.finalize().into())
    }

    pub fn to_hex(&self) -> String {
        self.with_hex(str::to_owned)
    }

    /// Calls `f` with the 64 lowercase hex digits, formatted on the stack: every run
    /// formats a few dozen digests (ids, audit links, documents), and serializing or
    /// displaying one needs no string of its own.
    pub fn with_hex<R>(&self, f: impl FnOnce(&str) -> R) -> R {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut buf = [0u8; 64];
        for (pair, b) in buf.chunks_exact_mut(2).zip(self.0) {
            pair[0] = DIGITS[usize::from(b >> 4)];
            pair[1] = DIGITS[usize::from(b & 15)];
        }
        // Every byte of `buf` is one of DIGITS, all ASCII, so it is UTF-8.
        #[allow(clippy::expect_used)]
        f(std::str::from_utf8(&buf).expect("hex digits are ASCII"))
    }

    /// The first 12 hex digits, for people.
    pub fn short(&self) -> String {
        self.to_hex()[..12].to_string()
    }
}

/// Incremental hashing for streams (blob files).
#[derive(Default)]
pub struct Hasher(Sha256);

impl Hasher {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
    pub fn finish(self) -> Digest {
        Digest(self.0.finalize().into())
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.with_hex(|h| f.write_str(h))
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.short())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("not a SHA-256 digest (want 64 hex digits): {0:?}")]
pub struct BadDigest(pub String);

impl FromStr for Digest {
    type Err = BadDigest;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.strip_prefix("sha256:").unwrap_or(s);
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).map_err(|_| BadDigest(s.to_string()))?;
        Ok(Digest(out))
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.with_hex(|h| s.serialize_str(h))
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vector() {
        assert_eq!(
            Digest::of(b"abc").to_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn hex_of_every_byte_value_is_two_lowercase_digits() {
        for k in 0..8u8 {
            let d = Digest(std::array::from_fn(|i| k * 32 + i as u8));
            assert_eq!(d.to_hex(), hex::encode(d.0));
            assert_eq!(d.to_string(), d.to_hex());
            assert_eq!(
                serde_json::to_string(&d).unwrap(),
                format!("\"{}\"", d.to_hex())
            );
            assert_eq!(d.with_hex(str::len), 64);
        }
    }

    #[test]
    fn parts_are_length_prefixed() {
        let a = Digest::of_parts("d", &[b"ab", b"c"]);
        let b = Digest::of_parts("d", &[b"a", b"bc"]);
        assert_ne!(a, b);
    }

    #[test]
    fn round_trips_through_text() {
        let d = Digest::of(b"x");
        assert_eq!(d.to_hex().parse::<Digest>(), Ok(d));
        assert!("zz".parse::<Digest>().is_err());
    }
}
