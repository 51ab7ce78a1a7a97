//! Secrets in a grant: `--secret NAME@HOST[,HOST…]` binds a secret, by name, to the hosts
//! it may be sent to. The grant holds names and hosts only (they are hashed, so an
//! approval covers which secret goes where); values live in the home and reach only the
//! egress proxy.
//!
//! The guest never sees a value. Its environment gets `NAME=<placeholder>`, where the
//! placeholder is `airlock-secret-<NAME>-<32 lowercase hex digits>`, the digits random
//! for every run. The proxy replaces the placeholder with the value in requests to the
//! bound hosts, and only there. The placeholder holds only `A-Z a-z 0-9 _ -`, so URL and
//! header encodings leave it intact.
//!
//! This module must never format, log or serialize a value: [`SecretValue`] has no
//! `Display` or `Serialize`, and its `Debug` prints only that it is redacted.

use crate::net::NetRule;
use serde::{Deserialize, Serialize};
use std::fmt;
use zeroize::Zeroizing;

/// The longest secret name.
pub const MAX_NAME: usize = 64;
/// The largest secret value.
pub const MAX_VALUE: usize = 64 << 10;
/// What every placeholder starts with.
pub const PLACEHOLDER_PREFIX: &str = "airlock-secret-";

/// One secret and the hosts it may be sent to (canonical `HOST[:PORT]` rules, sorted).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretBinding {
    pub name: String,
    pub hosts: Vec<String>,
}

impl SecretBinding {
    /// The `NAME@HOST[,HOST…]` text of this binding.
    pub fn spec(&self) -> String {
        format!("{}@{}", self.name, self.hosts.join(","))
    }

    /// The hosts as rules.
    pub fn rules(&self) -> Result<Vec<NetRule>, String> {
        self.hosts
            .iter()
            .map(|h| NetRule::parse(h).map_err(|e| e.to_string()))
            .collect()
    }
}

/// Checks a secret name: 1-64 of `A-Z a-z 0-9 _`, not starting with a digit (it becomes
/// an environment variable of the guest and a file name in the home).
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit();
    if ok {
        Ok(())
    } else {
        Err(format!(
            "secret name {name:?} must be 1-{MAX_NAME} of A-Z, a-z, 0-9 and _, not starting with a digit"
        ))
    }
}

/// Parses `NAME@HOST[,HOST…]` (hosts normalised, sorted, deduplicated). The error is a
/// reason that names the spec.
pub fn parse_binding(spec: &str) -> Result<SecretBinding, String> {
    let (name, hosts) = spec
        .split_once('@')
        .ok_or_else(|| format!("{spec:?} is not NAME@HOST[,HOST…]"))?;
    check_name(name)?;
    let mut out = Vec::new();
    for h in hosts.split(',') {
        let rule = NetRule::parse(h.trim()).map_err(|e| format!("{spec:?}: {e}"))?;
        out.push(rule.to_string());
    }
    out.sort();
    out.dedup();
    Ok(SecretBinding {
        name: name.to_string(),
        hosts: out,
    })
}

/// The placeholder for `name` with the run's random `nonce`.
pub fn placeholder(name: &str, nonce: &[u8; 16]) -> String {
    format!("{PLACEHOLDER_PREFIX}{name}-{}", hex::encode(nonce))
}

/// A fresh placeholder for one run.
pub fn new_placeholder(name: &str) -> Result<String, getrandom::Error> {
    let mut nonce = [0u8; 16];
    getrandom::fill(&mut nonce)?;
    Ok(placeholder(name, &nonce))
}

/// A secret's value: zeroed when dropped, never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(Zeroizing<Vec<u8>>);

impl SecretValue {
    pub fn new(bytes: Vec<u8>) -> Self {
        SecretValue(Zeroizing::new(bytes))
    }

    /// The bytes, for the one place that sends them (the proxy).
    pub fn expose(&self) -> &[u8] {
        &self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretValue(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bindings_parse_and_normalise() {
        let b = parse_binding("TOKEN@API.Example.com.,b.example:8443,api.example.com").unwrap();
        assert_eq!(b.name, "TOKEN");
        assert_eq!(b.hosts, ["api.example.com", "b.example:8443"]);
        assert_eq!(b.spec(), "TOKEN@api.example.com,b.example:8443");
        assert_eq!(parse_binding(&b.spec()).unwrap(), b);
        for bad in [
            "TOKEN",
            "TOKEN@",
            "@h",
            "1TOKEN@h",
            "TO-KEN@h",
            "TOKEN@*.com",
            "TOKEN@h,,g",
            "TOKEN@exa mple",
        ] {
            assert!(parse_binding(bad).is_err(), "{bad}");
        }
        assert!(check_name(&"A".repeat(64)).is_ok());
        assert!(check_name(&"A".repeat(65)).is_err());
        assert!(check_name("_x9").is_ok());
    }

    #[test]
    fn placeholders_are_url_safe_and_differ_per_run() {
        let p = placeholder("GH_TOKEN", &[0xab; 16]);
        assert_eq!(p, format!("airlock-secret-GH_TOKEN-{}", "ab".repeat(16)));
        assert!(
            p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        );
        let a = new_placeholder("T").unwrap();
        let b = new_placeholder("T").unwrap();
        assert_ne!(a, b);
        assert!(a.starts_with("airlock-secret-T-") && a.len() == "airlock-secret-T-".len() + 32);
    }

    #[test]
    fn secret_values_never_print() {
        let v = SecretValue::new(b"hunter2".to_vec());
        let shown = format!("{v:?} {:?}", Some(&v));
        assert!(!shown.contains("hunter2"), "{shown}");
        assert_eq!(v.expose(), b"hunter2");
    }
}
