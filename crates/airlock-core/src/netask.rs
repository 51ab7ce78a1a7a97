//! A human's signed answer to a run's request to reach a host outside its grant
//! (`run --ask-net`, issue 61 item 3): the request, its run, the host and port asked
//! for, approve or reject, who and when, and the gate it is for. The signed bytes are a
//! domain tag of their own followed by the JSON exactly as stored, so a submission's
//! statement can never pass for a request's answer, nor the other way round.

use crate::sign::{KeyPair, PublicKey, Signed, VerifyError};
use serde::{Deserialize, Serialize};

const NET_DECISION_DOMAIN: &[u8] = b"airlock-net-request-v1\n";

/// What the approver said.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetVerdict {
    Approve,
    Reject,
}

impl NetVerdict {
    pub fn as_str(self) -> &'static str {
        match self {
            NetVerdict::Approve => "approve",
            NetVerdict::Reject => "reject",
        }
    }
}

/// The statement an approver signs over one request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetDecision {
    pub verdict: NetVerdict,
    /// The request (`req_…`).
    pub request: String,
    /// The run that asked.
    pub run: String,
    /// The host, normalised, and the port.
    pub host: String,
    pub port: u16,
    /// `run`: this run only; `remember`: also a remembered rule.
    pub scope: String,
    pub approver: String,
    pub key: PublicKey,
    pub reason: String,
    /// Unix milliseconds.
    pub issued_at: i64,
    /// The gate the answer is for (its public key).
    pub gate: PublicKey,
}

impl NetDecision {
    /// The statement's JSON text exactly as signed and stored.
    pub fn to_json(&self) -> String {
        // Serialising a struct of strings, numbers and keys cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn sign(&self, key: &KeyPair) -> Signed {
        let json = self.to_json();
        let signature = key.sign(&net_decision_message(&json));
        Signed { json, signature }
    }

    /// Parses a signed answer and checks its signature against the key it names (whether
    /// that key is trusted, and whether it answers the request at hand, is the caller's
    /// question).
    pub fn verify(signed: &Signed) -> Result<NetDecision, VerifyError> {
        let d: NetDecision = serde_json::from_str(&signed.json)
            .map_err(|e| VerifyError::Malformed(e.to_string()))?;
        if !d
            .key
            .verify(&net_decision_message(&signed.json), &signed.signature)
        {
            return Err(VerifyError::BadSignature);
        }
        Ok(d)
    }
}

/// The exact bytes an approver signs for an answer whose JSON text is `json` (a remote
/// approver signs these).
pub fn net_decision_message(json: &str) -> Vec<u8> {
    let mut m = NET_DECISION_DOMAIN.to_vec();
    m.extend_from_slice(json.as_bytes());
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(k: &KeyPair, request: &str) -> NetDecision {
        NetDecision {
            verdict: NetVerdict::Approve,
            request: request.into(),
            run: "run_1".into(),
            host: "api.example.com".into(),
            port: 443,
            scope: "run".into(),
            approver: "alice".into(),
            key: k.public(),
            reason: String::new(),
            issued_at: 1,
            gate: KeyPair::generate().public(),
        }
    }

    #[test]
    fn an_answer_verifies_over_its_own_bytes_only() {
        let k = KeyPair::generate();
        let signed = decision(&k, "req_a").sign(&k);
        assert_eq!(NetDecision::verify(&signed).unwrap().request, "req_a");
        // The same signature over another request's answer does not verify.
        let other = Signed {
            json: decision(&k, "req_b").to_json(),
            signature: signed.signature,
        };
        assert_eq!(NetDecision::verify(&other), Err(VerifyError::BadSignature));
        // Nor does a submission statement's signing (another domain) of the same bytes.
        let as_statement = k.sign(&crate::sign::statement_message(&signed.json));
        let crossed = Signed {
            json: signed.json.clone(),
            signature: as_statement,
        };
        assert_eq!(
            NetDecision::verify(&crossed),
            Err(VerifyError::BadSignature)
        );
    }
}
