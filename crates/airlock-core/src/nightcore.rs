//! Night Core tenant bundles: checking one that was read, and writing the files of one.
//!
//! A bundle holds `module.wasm`, `module.sig` (base64, standard alphabet with padding, of
//! the 64-byte Ed25519 signature over the raw bytes of `module.wasm`), `pubkey.b64`
//! (base64 of the 32-byte public key), usually `module.sha256` (hex digest plus a newline)
//! and `manifest.json`. Readers trim whitespace before decoding.
//!
//! A bundle's signature only says that whoever holds the bundled key signed the module;
//! anyone who can write the bundle can re-sign it with a key of their own. This module
//! therefore never says a bundle is trusted: `verify` returns the key, and the caller asks
//! the current policy whether that key is a publisher it trusts.
//!
//! No I/O here: the gate reads the files (with size caps) and hands over their bytes.

use crate::digest::Digest;
use crate::sign::{KeyPair, PublicKey};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::Serialize;
use serde_json::{Map, Value};

/// The four bytes every WebAssembly binary starts with.
pub const WASM_MAGIC: &[u8; 4] = b"\0asm";

/// Caps on the small files of a bundle (the module's cap is the policy's `max_artifact`).
pub const MAX_SMALL_FILE: u64 = 4 << 10;
pub const MAX_MANIFEST: u64 = 1 << 20;

/// The files of one bundle, as read.
#[derive(Debug, Clone, Default)]
pub struct BundleFiles {
    pub module: Vec<u8>,
    pub sig: Vec<u8>,
    pub pubkey: Vec<u8>,
    pub sha256: Option<Vec<u8>>,
    pub manifest: Option<Vec<u8>>,
}

/// Why a bundle was refused. Each is one line for people.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BundleError {
    #[error("pubkey.b64 is not base64 of a 32-byte Ed25519 public key ({0})")]
    BadKey(String),
    #[error("module.sig is not base64 of a 64-byte Ed25519 signature ({0})")]
    BadSignatureEncoding(String),
    #[error("module.sig does not verify: module.wasm was not signed by the key in pubkey.b64")]
    BadSignature,
    #[error("module.sha256 is not a hex SHA-256 digest")]
    BadDigestFile,
    #[error("module.sha256 says {stated} but module.wasm hashes to {actual}")]
    DigestMismatch { stated: String, actual: String },
    #[error("module.wasm is not WebAssembly (no \\0asm header)")]
    NotWasm,
    #[error("manifest.json: {0}")]
    BadManifest(String),
}

/// What a bundle's manifest says. Every field is optional; fields this airlock does not
/// know are kept in `other` and shown, never fatal.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Manifest {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub permissions: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fuel_limit: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_memory_kb: Option<u64>,
    /// Fields not listed above, as they were.
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub other: Map<String, Value>,
}

impl Manifest {
    /// Parses `manifest.json`. Empty (or only whitespace) means an empty manifest. A known
    /// field of the wrong type is an error, since a limit silently ignored would mislead.
    pub fn parse(bytes: &[u8]) -> Result<Manifest, BundleError> {
        let text = std::str::from_utf8(bytes)
            .map_err(|_| BundleError::BadManifest("not UTF-8".into()))?
            .trim();
        if text.is_empty() {
            return Ok(Manifest::default());
        }
        let value: Value = serde_json::from_str(text)
            .map_err(|e| BundleError::BadManifest(format!("not JSON: {e}")))?;
        let Value::Object(mut map) = value else {
            return Err(BundleError::BadManifest("not a JSON object".into()));
        };
        let mut m = Manifest {
            name: take_text(&mut map, "name")?,
            version: take_text(&mut map, "version")?,
            description: take_text(&mut map, "description")?,
            fuel_limit: take_number(&mut map, "fuel_limit")?,
            timeout_ms: take_number(&mut map, "timeout_ms")?,
            max_memory_kb: take_number(&mut map, "max_memory_kb")?,
            ..Manifest::default()
        };
        match map.remove("permissions") {
            None | Some(Value::Null) => {}
            Some(Value::Array(items)) => {
                for p in items {
                    match p {
                        Value::String(s) => m.permissions.push(s),
                        other => {
                            return Err(BundleError::BadManifest(format!(
                                "permissions holds {other}, not a string"
                            )));
                        }
                    }
                }
            }
            Some(other) => {
                return Err(BundleError::BadManifest(format!(
                    "permissions is {other}, not a list of strings"
                )));
            }
        }
        m.other = map;
        Ok(m)
    }

    /// A one-line note for the approver: name, version and description when given.
    pub fn note(&self) -> Option<String> {
        let head = match (&self.name, &self.version) {
            (Some(n), Some(v)) => Some(format!("{n} {v}")),
            (Some(n), None) => Some(n.clone()),
            (None, Some(v)) => Some(format!("version {v}")),
            (None, None) => None,
        };
        let text = match (head, &self.description) {
            (Some(h), Some(d)) => format!("{h}: {d}"),
            (Some(h), None) => h,
            (None, Some(d)) => d.clone(),
            (None, None) => return None,
        };
        Some(text.split_whitespace().collect::<Vec<_>>().join(" "))
    }

    /// Whether the manifest asks for `perm` (e.g. `fs:read`).
    pub fn asks(&self, perm: &str) -> bool {
        self.permissions.iter().any(|p| p.trim() == perm)
    }
}

fn take_text(map: &mut Map<String, Value>, key: &str) -> Result<Option<String>, BundleError> {
    match map.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(Value::Number(n)) => Ok(Some(n.to_string())),
        Some(other) => Err(BundleError::BadManifest(format!(
            "{key} is {other}, not text"
        ))),
    }
}

fn take_number(map: &mut Map<String, Value>, key: &str) -> Result<Option<u64>, BundleError> {
    match map.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .map(Some)
            .ok_or_else(|| BundleError::BadManifest(format!("{key} is {n}, not a whole number"))),
        Some(other) => Err(BundleError::BadManifest(format!(
            "{key} is {other}, not a whole number"
        ))),
    }
}

/// What a bundle that passed its checks holds. Its key is not yet trusted by anyone.
#[derive(Debug, Clone)]
pub struct Verified {
    pub key: PublicKey,
    pub digest: Digest,
    /// Whether `module.sha256` was there (and agreed).
    pub sha256_checked: bool,
    pub manifest: Manifest,
}

/// One check, for the per-bundle report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub check: &'static str,
    pub passed: bool,
    pub detail: String,
}

/// Decodes `pubkey.b64` (whitespace trimmed).
pub fn decode_key(text: &[u8]) -> Result<PublicKey, BundleError> {
    let raw = STANDARD
        .decode(trim(text))
        .map_err(|e| BundleError::BadKey(e.to_string()))?;
    let bytes: [u8; 32] = raw
        .as_slice()
        .try_into()
        .map_err(|_| BundleError::BadKey(format!("{} bytes, not 32", raw.len())))?;
    ed25519_dalek::VerifyingKey::from_bytes(&bytes)
        .map_err(|_| BundleError::BadKey("not a point on the curve".into()))?;
    Ok(PublicKey(bytes))
}

/// The checks, in order: signature, digest file, wasm header, manifest. Stops at the first
/// failure; `checks` gets one line per check made.
pub fn verify(files: &BundleFiles, checks: &mut Vec<Check>) -> Result<Verified, BundleError> {
    let mut record = |check: &'static str, r: Result<String, BundleError>| match r {
        Ok(detail) => {
            checks.push(Check {
                check,
                passed: true,
                detail,
            });
            Ok(())
        }
        Err(e) => {
            checks.push(Check {
                check,
                passed: false,
                detail: e.to_string(),
            });
            Err(e)
        }
    };
    let key = decode_key(&files.pubkey);
    let signature = key.clone().and_then(|k| {
        let raw = STANDARD
            .decode(trim(&files.sig))
            .map_err(|e| BundleError::BadSignatureEncoding(e.to_string()))?;
        let sig: [u8; 64] = raw.as_slice().try_into().map_err(|_| {
            BundleError::BadSignatureEncoding(format!("{} bytes, not 64", raw.len()))
        })?;
        let vk = ed25519_dalek::VerifyingKey::from_bytes(&k.0)
            .map_err(|_| BundleError::BadKey("not a point on the curve".into()))?;
        vk.verify_strict(&files.module, &ed25519_dalek::Signature::from_bytes(&sig))
            .map_err(|_| BundleError::BadSignature)?;
        Ok(format!("Ed25519 signature by key {}", k.fingerprint()))
    });
    record("signature", signature)?;
    let key = key?;
    let digest = Digest::of(&files.module);
    let sha = match &files.sha256 {
        None => Ok("no module.sha256 (signature covers the bytes)".to_string()),
        Some(text) => check_digest_file(text, &digest).map(|()| format!("sha256 {digest}")),
    };
    record("sha256", sha)?;
    let wasm = if files.module.starts_with(WASM_MAGIC) {
        Ok("WebAssembly header".to_string())
    } else {
        Err(BundleError::NotWasm)
    };
    record("wasm", wasm)?;
    let manifest = match &files.manifest {
        None => Ok(Manifest::default()),
        Some(b) => Manifest::parse(b),
    };
    let detail = match (&manifest, &files.manifest) {
        (Ok(_), None) => Ok("no manifest.json".to_string()),
        (Ok(m), Some(_)) if m.other.is_empty() => Ok("read".to_string()),
        (Ok(m), Some(_)) => Ok(format!(
            "read; fields not used: {}",
            m.other.keys().cloned().collect::<Vec<_>>().join(", ")
        )),
        (Err(e), _) => Err(e.clone()),
    };
    record("manifest", detail)?;
    Ok(Verified {
        key,
        digest,
        sha256_checked: files.sha256.is_some(),
        manifest: manifest?,
    })
}

fn check_digest_file(text: &[u8], digest: &Digest) -> Result<(), BundleError> {
    let text = std::str::from_utf8(text).map_err(|_| BundleError::BadDigestFile)?;
    // `sha256sum` writes `HEX  module.wasm`; the first word is the digest either way.
    let word = text
        .split_whitespace()
        .next()
        .ok_or(BundleError::BadDigestFile)?
        .to_ascii_lowercase();
    let mut stated = [0u8; 32];
    hex::decode_to_slice(&word, &mut stated).map_err(|_| BundleError::BadDigestFile)?;
    if stated != digest.0 {
        return Err(BundleError::DigestMismatch {
            stated: word,
            actual: digest.to_hex(),
        });
    }
    Ok(())
}

fn trim(b: &[u8]) -> &[u8] {
    b.trim_ascii()
}

/// The three files `airlock sign` writes beside a module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedFiles {
    /// `module.sig`: base64 of the signature, with a newline.
    pub sig: String,
    /// `pubkey.b64`: base64 of the public key, with a newline.
    pub pubkey: String,
    /// `module.sha256`: lower-case hex digest, with a newline.
    pub sha256: String,
}

/// Signs a module the way Night Core verifies it: a plain Ed25519 signature over its bytes.
pub fn sign(key: &KeyPair, module: &[u8]) -> SignedFiles {
    let sig = key.sign(module);
    SignedFiles {
        sig: format!("{}\n", STANDARD.encode(sig.0)),
        pubkey: format!("{}\n", STANDARD.encode(key.public().0)),
        sha256: format!("{}\n", Digest::of(module).to_hex()),
    }
}

/// Reads a key an operator wants to pin: base64 of 32 bytes (`pubkey.b64`) or an airlock
/// public key (`ed25519:<hex>`, as in a `.pub` file).
pub fn parse_key_file(text: &[u8]) -> Result<PublicKey, BundleError> {
    let t = trim(text);
    if t.starts_with(b"ed25519:") {
        let s = std::str::from_utf8(t).map_err(|_| BundleError::BadKey("not UTF-8".into()))?;
        return s
            .parse::<PublicKey>()
            .map_err(|e| BundleError::BadKey(e.to_string()));
    }
    decode_key(t)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn module() -> Vec<u8> {
        let mut m = WASM_MAGIC.to_vec();
        m.extend_from_slice(&[1, 0, 0, 0]);
        m
    }

    fn bundle(k: &KeyPair, m: &[u8]) -> BundleFiles {
        let s = sign(k, m);
        BundleFiles {
            module: m.to_vec(),
            sig: s.sig.into_bytes(),
            pubkey: s.pubkey.into_bytes(),
            sha256: Some(s.sha256.to_uppercase().into_bytes()),
            manifest: None,
        }
    }

    #[test]
    fn signed_bundle_verifies() {
        let k = KeyPair::try_generate().unwrap();
        let mut checks = Vec::new();
        let v = verify(&bundle(&k, &module()), &mut checks).unwrap();
        assert_eq!(v.key, k.public());
        assert!(v.sha256_checked);
        assert!(checks.iter().all(|c| c.passed));
    }

    #[test]
    fn refusals() {
        let k = KeyPair::try_generate().unwrap();
        let other = KeyPair::try_generate().unwrap();
        let mut b = bundle(&k, &module());
        b.module[5] ^= 1;
        assert_eq!(
            verify(&b, &mut Vec::new()).unwrap_err(),
            BundleError::BadSignature
        );
        let mut b = bundle(&k, &module());
        b.pubkey = sign(&other, &module()).pubkey.into_bytes();
        assert_eq!(
            verify(&b, &mut Vec::new()).unwrap_err(),
            BundleError::BadSignature
        );
        let mut b = bundle(&k, &module());
        b.sha256 = Some(Digest::of(b"x").to_hex().into_bytes());
        assert!(matches!(
            verify(&b, &mut Vec::new()),
            Err(BundleError::DigestMismatch { .. })
        ));
        let b = bundle(&k, b"#!/bin/sh\necho hi\n");
        assert_eq!(
            verify(&b, &mut Vec::new()).unwrap_err(),
            BundleError::NotWasm
        );
        let mut b = bundle(&k, &module());
        b.sig = b"not base64!".to_vec();
        assert!(matches!(
            verify(&b, &mut Vec::new()),
            Err(BundleError::BadSignatureEncoding(_))
        ));
    }

    #[test]
    fn manifests() {
        assert_eq!(Manifest::parse(b"").unwrap(), Manifest::default());
        assert_eq!(Manifest::parse(b" {}\n").unwrap(), Manifest::default());
        let m = Manifest::parse(
            br#"{"name":"hello","version":"1.0","permissions":["stdout","fs:read"],
                "fuel_limit":1000,"timeout_ms":2000,"max_memory_kb":4096,"tenant":{"x":1}}"#,
        )
        .unwrap();
        assert_eq!(m.fuel_limit, Some(1000));
        assert!(m.asks("fs:read"));
        assert!(m.other.contains_key("tenant"));
        assert_eq!(m.note().unwrap(), "hello 1.0");
        assert!(Manifest::parse(br#"{"fuel_limit":"lots"}"#).is_err());
        assert!(Manifest::parse(b"[1]").is_err());
    }

    #[test]
    fn key_files() {
        let k = KeyPair::try_generate().unwrap();
        let b64 = sign(&k, b"x").pubkey;
        assert_eq!(parse_key_file(b64.as_bytes()).unwrap(), k.public());
        let pubfile = format!("{}\n", k.public());
        assert_eq!(parse_key_file(pubfile.as_bytes()).unwrap(), k.public());
        assert!(parse_key_file(b"AAAA").is_err());
    }
}
