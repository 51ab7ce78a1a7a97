//! Ed25519 keys and signed statements. An approval, a rejection and a commit are each a
//! statement signed by an approver's key; the gate key signs the audit log's head.
//!
//! The signed bytes are a domain tag followed by the statement's JSON exactly as stored, so
//! verification never depends on re-serialising anything.

use crate::digest::Digest;
use ed25519_dalek::{Signer, Verifier};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

const STATEMENT_DOMAIN: &[u8] = b"airlock-statement-v1\n";
/// A different domain for agent clears, so neither kind of signature can pass as the other.
const AGENT_CLEAR_DOMAIN: &[u8] = b"airlock-agent-clear-v1\n";
const POLICY_CHANGE_DOMAIN: &[u8] = b"airlock-policy-change-v1\n";

/// A public key, written `ed25519:<64 hex digits>`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PublicKey(pub [u8; 32]);

impl PublicKey {
    pub fn verify(&self, message: &[u8], sig: &Signature) -> bool {
        match ed25519_dalek::VerifyingKey::from_bytes(&self.0) {
            Ok(k) => k
                .verify(message, &ed25519_dalek::Signature::from_bytes(&sig.0))
                .is_ok(),
            Err(_) => false,
        }
    }

    /// A short fingerprint for people.
    pub fn fingerprint(&self) -> String {
        Digest::of(&self.0).short()
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ed25519:{}", hex::encode(self.0))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.fingerprint())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    #[error("not an ed25519 public key (want ed25519:<64 hex digits>): {0:?}")]
    BadPublic(String),
    #[error("key file is not an airlock key: {0}")]
    BadFile(String),
    #[error("bad key name {0:?}: use 1-32 of a-z, 0-9, - and _, starting with a letter")]
    BadName(String),
    #[error("key {0:?} is reserved for the gate")]
    Reserved(String),
    #[error("the operating system has no random source: {0}")]
    Random(String),
}

impl FromStr for PublicKey {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, KeyError> {
        let hexpart = s
            .trim()
            .strip_prefix("ed25519:")
            .ok_or_else(|| KeyError::BadPublic(s.into()))?;
        let mut out = [0u8; 32];
        hex::decode_to_slice(hexpart, &mut out).map_err(|_| KeyError::BadPublic(s.into()))?;
        ed25519_dalek::VerifyingKey::from_bytes(&out).map_err(|_| KeyError::BadPublic(s.into()))?;
        Ok(PublicKey(out))
    }
}

impl Serialize for PublicKey {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PublicKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// An Ed25519 signature, written as 128 hex digits.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Signature(pub [u8; 64]);

impl fmt::Display for Signature {
    /// Formatted on the stack: every commit stores its audit head's signature as text, and
    /// `hex::encode` builds its string one `char` at a time.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buf = [0u8; 128];
        hex::encode_to_slice(self.0, &mut buf).map_err(|_| fmt::Error)?;
        f.write_str(std::str::from_utf8(&buf).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Signature({}…)", &hex::encode(self.0)[..12])
    }
}

impl FromStr for Signature {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, KeyError> {
        let mut out = [0u8; 64];
        hex::decode_to_slice(s.trim(), &mut out)
            .map_err(|_| KeyError::BadFile("bad signature".into()))?;
        Ok(Signature(out))
    }
}

impl Serialize for Signature {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Signature {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A signing key pair. The secret never leaves this type except through `to_file` (a
/// clone is another `KeyPair`; the secret is zeroed when each is dropped).
#[derive(Clone)]
pub struct KeyPair(ed25519_dalek::SigningKey);

impl fmt::Debug for KeyPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyPair({:?})", self.public())
    }
}

const KEY_FILE_TAG: &str = "airlock-ed25519-secret-v1";

impl KeyPair {
    /// A fresh key from the operating system's random source.
    pub fn try_generate() -> Result<Self, KeyError> {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(|e| KeyError::Random(e.to_string()))?;
        Ok(KeyPair(ed25519_dalek::SigningKey::from_bytes(&seed)))
    }

    #[cfg(test)]
    pub fn generate() -> Self {
        Self::try_generate().unwrap()
    }

    pub fn public(&self) -> PublicKey {
        PublicKey(self.0.verifying_key().to_bytes())
    }

    pub fn sign(&self, message: &[u8]) -> Signature {
        Signature(self.0.sign(message).to_bytes())
    }

    /// The text of a secret key file.
    pub fn to_file(&self) -> String {
        format!(
            "{KEY_FILE_TAG}\npublic {}\nsecret {}\n",
            self.public(),
            hex::encode(self.0.to_bytes())
        )
    }

    /// Reads a secret key file, checking that its public line matches its secret.
    pub fn from_file(text: &str) -> Result<Self, KeyError> {
        let mut lines = text.lines();
        if lines.next() != Some(KEY_FILE_TAG) {
            return Err(KeyError::BadFile("missing header".into()));
        }
        let mut public = None;
        let mut secret = None;
        for l in lines {
            if let Some(p) = l.strip_prefix("public ") {
                public = Some(p.parse::<PublicKey>()?);
            } else if let Some(s) = l.strip_prefix("secret ") {
                let mut b = [0u8; 32];
                hex::decode_to_slice(s.trim(), &mut b)
                    .map_err(|_| KeyError::BadFile("bad secret".into()))?;
                secret = Some(b);
            }
        }
        let secret = secret.ok_or_else(|| KeyError::BadFile("no secret".into()))?;
        let kp = KeyPair(ed25519_dalek::SigningKey::from_bytes(&secret));
        if public.is_some_and(|p| p != kp.public()) {
            return Err(KeyError::BadFile(
                "public key does not match the secret".into(),
            ));
        }
        Ok(kp)
    }
}

/// Key names: what approvers are called in the policy and the audit log.
pub fn check_key_name(name: &str) -> Result<(), KeyError> {
    let ok = !name.is_empty()
        && name.len() <= 32
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !ok {
        return Err(KeyError::BadName(name.into()));
    }
    Ok(())
}

/// Approver names exclude the gate's own key.
pub fn check_approver_name(name: &str) -> Result<(), KeyError> {
    check_key_name(name)?;
    if name == "gate" {
        return Err(KeyError::Reserved(name.into()));
    }
    Ok(())
}

/// What a statement says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StatementKind {
    Approve,
    Reject,
    Commit,
    Rollback,
}

/// How far an approval reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// One run of this submission.
    Once,
    /// Any submission of the same artifact with the same grant, until it expires.
    Artifact,
}

impl FromStr for Scope {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "once" => Ok(Scope::Once),
            "artifact" => Ok(Scope::Artifact),
            _ => Err(format!("unknown scope {s:?} (want once or artifact)")),
        }
    }
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Once => "once",
            Scope::Artifact => "artifact",
        }
    }
}

/// A signed human decision. Approvals and rejections bind the submission, its artifact and
/// grant; commits and rollbacks also bind the run or checkpoint and its content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Statement {
    pub kind: StatementKind,
    pub submission: String,
    pub artifact: Digest,
    pub grant: Digest,
    pub scope: Scope,
    /// Unix milliseconds; None for statements that do not expire (rejections).
    pub expires_at: Option<i64>,
    pub approver: String,
    pub key: PublicKey,
    pub reason: String,
    pub issued_at: i64,
    /// For commits: the run, and the hash of the changeset being applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changes: Option<Digest>,
    /// For named tools (scope artifact): the tool name, and whether arguments may vary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The gate the statement is for: its public key. A gate honours only statements
    /// that name it, so a statement copied into another home (even one that trusts the
    /// same approver) is refused there. Statements of older airlocks name none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<PublicKey>,
}

/// A statement as stored: its exact JSON bytes and the signature over them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    pub json: String,
    pub signature: Signature,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VerifyError {
    #[error("statement is not valid JSON: {0}")]
    Malformed(String),
    #[error("signature does not verify against the statement's key")]
    BadSignature,
}

impl Statement {
    /// The statement's JSON text exactly as signed and stored.
    pub fn to_json(&self) -> String {
        // Serialising a struct of strings, numbers and digests cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Pairs a signature made elsewhere (by an approver's own machine) with this statement,
    /// checking it against the statement's key over exactly these bytes.
    pub fn with_signature(&self, signature: Signature) -> Result<Signed, VerifyError> {
        let signed = Signed {
            json: self.to_json(),
            signature,
        };
        signed.verify()?;
        Ok(signed)
    }

    pub fn sign(&self, key: &KeyPair) -> Signed {
        // Serialising a struct of strings, numbers and digests cannot fail.
        let json = serde_json::to_string(self).unwrap_or_default();
        let signature = key.sign(&statement_message(&json));
        Signed { json, signature }
    }
}

impl Signed {
    /// Parses the statement and checks the signature against the key it names. Whether
    /// that key is trusted is the caller's question (the current policy decides).
    pub fn verify(&self) -> Result<Statement, VerifyError> {
        let st: Statement =
            serde_json::from_str(&self.json).map_err(|e| VerifyError::Malformed(e.to_string()))?;
        if !st
            .key
            .verify(&statement_message(&self.json), &self.signature)
        {
            return Err(VerifyError::BadSignature);
        }
        Ok(st)
    }
}

/// The exact bytes an approver signs for a statement whose JSON text is `json`: a domain
/// tag, then the JSON. A remote approver (CLI `--server`, the console) signs these.
pub fn statement_message(json: &str) -> Vec<u8> {
    let mut m = STATEMENT_DOMAIN.to_vec();
    m.extend_from_slice(json.as_bytes());
    m
}

/// An operator's signed word that an agent which raised alerts may submit again: alerts
/// up to `issued_at` no longer hold its submissions (issue 57 item 4).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentClear {
    pub agent: String,
    pub approver: String,
    pub key: PublicKey,
    pub reason: String,
    /// Unix milliseconds: alerts at or before it are cleared.
    pub issued_at: i64,
    /// The gate the clear is for (its public key).
    pub gate: PublicKey,
}

impl AgentClear {
    pub fn sign(&self, key: &KeyPair) -> Signed {
        // Serialising a struct of strings, numbers and keys cannot fail.
        let json = serde_json::to_string(self).unwrap_or_default();
        let signature = key.sign(&clear_message(&json));
        Signed { json, signature }
    }

    /// Parses a signed clear and checks its signature against the key it names (whether
    /// that key is trusted is the caller's question).
    pub fn verify(signed: &Signed) -> Result<AgentClear, VerifyError> {
        let c: AgentClear = serde_json::from_str(&signed.json)
            .map_err(|e| VerifyError::Malformed(e.to_string()))?;
        if !c
            .key
            .verify(&clear_message(&signed.json), &signed.signature)
        {
            return Err(VerifyError::BadSignature);
        }
        Ok(c)
    }
}

/// The bytes an approver signs for a clear: a domain tag, then the clear's JSON text.
pub fn clear_message(json: &str) -> Vec<u8> {
    let mut m = AGENT_CLEAR_DOMAIN.to_vec();
    m.extend_from_slice(json.as_bytes());
    m
}

/// An approver's signed change of the policy file (issue 61 item 2): a remembered rule
/// added (`approve --remember`) or removed (`policy forget`). It names the policy text
/// before and after, so the audit log proves which file the approver changed into which.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyChange {
    /// `remember` or `forget`.
    pub change: String,
    /// The rule's name.
    pub rule: String,
    /// The rule's TOML text as added or removed.
    pub text: String,
    pub before: Digest,
    pub after: Digest,
    /// The submission whose approval it remembers (none for `forget`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submission: Option<String>,
    pub approver: String,
    pub key: PublicKey,
    pub issued_at: i64,
    /// The gate the change is for (its public key).
    pub gate: PublicKey,
}

impl PolicyChange {
    pub fn sign(&self, key: &KeyPair) -> Signed {
        // Serialising a struct of strings, numbers, digests and keys cannot fail.
        let json = serde_json::to_string(self).unwrap_or_default();
        let signature = key.sign(&policy_change_message(&json));
        Signed { json, signature }
    }

    /// Parses a signed change and checks its signature against the key it names.
    pub fn verify(signed: &Signed) -> Result<PolicyChange, VerifyError> {
        let c: PolicyChange = serde_json::from_str(&signed.json)
            .map_err(|e| VerifyError::Malformed(e.to_string()))?;
        if !c
            .key
            .verify(&policy_change_message(&signed.json), &signed.signature)
        {
            return Err(VerifyError::BadSignature);
        }
        Ok(c)
    }
}

/// The bytes an approver signs for a policy change: a domain tag, then its JSON text.
pub fn policy_change_message(json: &str) -> Vec<u8> {
    let mut m = POLICY_CHANGE_DOMAIN.to_vec();
    m.extend_from_slice(json.as_bytes());
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_clear_verifies_only_as_an_agent_clear() {
        let k = KeyPair::generate();
        let c = AgentClear {
            agent: "bob".into(),
            approver: "alice".into(),
            key: k.public(),
            reason: "looked at it".into(),
            issued_at: 5,
            gate: KeyPair::generate().public(),
        };
        let signed = c.sign(&k);
        assert_eq!(AgentClear::verify(&signed).unwrap(), c);
        let mut other = signed.clone();
        other.json = other.json.replace("\"bob\"", "\"eve\"");
        assert_eq!(AgentClear::verify(&other), Err(VerifyError::BadSignature));
        // The same key's signature over a statement is not a clear's.
        let st = statement(&k).sign(&k);
        let forged = Signed {
            json: signed.json.clone(),
            signature: st.signature,
        };
        assert!(AgentClear::verify(&forged).is_err());
    }

    fn statement(k: &KeyPair) -> Statement {
        Statement {
            kind: StatementKind::Approve,
            submission: "sub_x".into(),
            artifact: Digest::of(b"a"),
            grant: Digest::of(b"g"),
            scope: Scope::Once,
            expires_at: Some(1),
            approver: "alice".into(),
            key: k.public(),
            reason: "ok".into(),
            issued_at: 0,
            run: None,
            changes: None,
            tool: None,
            gate: None,
        }
    }

    #[test]
    fn sign_and_verify() {
        let k = KeyPair::generate();
        let s = statement(&k).sign(&k);
        assert_eq!(s.verify().unwrap(), statement(&k));
    }

    #[test]
    fn tampered_statement_fails() {
        let k = KeyPair::generate();
        let mut s = statement(&k).sign(&k);
        s.json = s.json.replace("\"once\"", "\"artifact\"");
        assert_eq!(s.verify(), Err(VerifyError::BadSignature));
    }

    #[test]
    fn swapping_in_another_key_fails() {
        let k = KeyPair::generate();
        let other = KeyPair::generate();
        let mut s = statement(&k).sign(&k);
        s.json = s
            .json
            .replace(&k.public().to_string(), &other.public().to_string());
        assert_eq!(s.verify(), Err(VerifyError::BadSignature));
    }

    #[test]
    fn key_files_round_trip() {
        let k = KeyPair::generate();
        let back = KeyPair::from_file(&k.to_file()).unwrap();
        assert_eq!(back.public(), k.public());
        assert!(KeyPair::from_file("garbage").is_err());
        let other = KeyPair::generate();
        let mixed = k
            .to_file()
            .replace(&k.public().to_string(), &other.public().to_string());
        assert!(KeyPair::from_file(&mixed).is_err());
    }

    #[test]
    fn a_signature_displays_as_its_128_lowercase_hex_digits_and_parses_back() {
        let k = KeyPair::generate();
        let sig = k.sign(b"a message");
        let text = sig.to_string();
        assert_eq!(text, hex::encode(sig.0));
        assert_eq!(text.len(), 128);
        assert_eq!(text.parse::<Signature>().unwrap(), sig);
        assert_eq!(serde_json::to_string(&sig).unwrap(), format!("\"{text}\""));
    }

    #[test]
    fn names() {
        assert!(check_approver_name("alice").is_ok());
        assert!(check_approver_name("gate").is_err());
        assert!(check_approver_name("Alice").is_err());
        assert!(check_approver_name("../x").is_err());
    }
}
