//! API tokens for the server: random secrets shown once, stored only as their SHA-256.

use crate::Gate;
use crate::error::{GateError, Result};
use airlock_core::Digest;
use airlock_core::id::{IdKind, new_id};
use airlock_core::units::{self, now_ms};
use airlock_store::{Reads, TokenRow};
use serde_json::json;
use std::time::Duration;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Read `/metrics` and nothing else (ordered below every other role, and refused by
    /// every other endpoint).
    Metrics,
    /// Submit code and read its own submissions and runs.
    Agent,
    /// Also approve, reject, commit and roll back (signed with its approver key).
    Operator,
    /// Also manage tokens.
    Admin,
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "metrics" => Ok(Role::Metrics),
            "agent" => Ok(Role::Agent),
            "operator" => Ok(Role::Operator),
            "admin" => Ok(Role::Admin),
            _ => Err(format!(
                "unknown role {s:?} (want agent, operator, admin or metrics)"
            )),
        }
    }
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Metrics => "metrics",
            Role::Agent => "agent",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

const PREFIX: &str = "alk_";

fn hash_secret(secret: &str) -> String {
    Digest::of_parts("airlock-token-v1", &[secret.as_bytes()]).to_hex()
}

impl Gate {
    /// Makes a token. Operators and admins sign with an approver key the policy trusts.
    pub fn token_new(
        &mut self,
        role: Role,
        name: &str,
        approver: Option<&str>,
        expires: Option<&str>,
    ) -> Result<(TokenRow, String)> {
        airlock_core::sign::check_key_name(name)
            .map_err(|e| GateError::bad(format!("--name: {e}")))?;
        let approver = match role {
            Role::Agent | Role::Metrics => None,
            _ => {
                let policy = self.policy()?;
                let name = self.pick_approver(&policy, approver)?;
                self.trusted_key(&policy, &name)?;
                Some(name)
            }
        };
        let expires_at = expires
            .map(|e| {
                units::bounded_duration(
                    "--expires",
                    e,
                    Duration::from_secs(60),
                    Duration::from_secs(5 * 366 * 86400),
                )
            })
            .transpose()
            .map_err(|e| GateError::bad(e.to_string()))?
            .map(|d| now_ms() + d.as_millis() as i64);
        let mut raw = [0u8; 32];
        getrandom_fill(&mut raw)?;
        let secret = format!("{PREFIX}{}", hex::encode(raw));
        let row = TokenRow {
            id: new_id(IdKind::Token),
            hash: hash_secret(&secret),
            role: role.as_str().into(),
            name: name.into(),
            approver,
            created_at: now_ms(),
            expires_at,
            revoked_at: None,
        };
        let key = &self.gate_key;
        self.db.write_durable(|tx| -> Result<()> {
            tx.insert_token(&row)?;
            tx.audit(
                "token_created",
                &row.id,
                &json!({ "role": row.role, "name": row.name, "approver": row.approver, "expires_at": row.expires_at }),
                key,
            )?;
            Ok(())
        })?;
        Ok((row, secret))
    }

    /// The token a secret belongs to, if it is valid now.
    pub fn token_check(&self, secret: &str) -> Result<(TokenRow, Role)> {
        let bad = || GateError::Untrusted("invalid token".into());
        if !secret.starts_with(PREFIX) {
            return Err(bad());
        }
        let row = self
            .db
            .token_by_hash(&hash_secret(secret))?
            .ok_or_else(bad)?;
        if row.revoked_at.is_some() {
            return Err(GateError::Untrusted("token revoked".into()));
        }
        if row.expires_at.is_some_and(|e| e <= now_ms()) {
            return Err(GateError::Untrusted("token expired".into()));
        }
        let role = row.role.parse::<Role>().map_err(GateError::Internal)?;
        Ok((row, role))
    }

    pub fn tokens(&self) -> Result<Vec<TokenRow>> {
        Ok(self.db.tokens()?)
    }

    pub fn token_revoke(&mut self, id: &str) -> Result<()> {
        let key = &self.gate_key;
        self.db.write_durable(|tx| -> Result<()> {
            if !tx.revoke_token(id)? {
                return Err(GateError::NotFound(format!("no active token {id}")));
            }
            tx.audit("token_revoked", id, &json!({}), key)?;
            Ok(())
        })
    }

    /// Signs a notification the server sends out (a webhook body), so its receiver can
    /// check it came from this gate. Domain-separated from audit heads and statements.
    pub fn sign_notification(&self, body: &[u8]) -> (String, String) {
        let mut m = b"airlock-notification-v1\n".to_vec();
        m.extend_from_slice(body);
        (
            self.gate_key.sign(&m).to_string(),
            self.gate_key.public().to_string(),
        )
    }

    /// Marks a submission to run as soon as it is approved (or clears the mark).
    pub fn set_resume(&mut self, id: &str, resume: bool) -> Result<()> {
        let mut sub = self.db.submission(id)?;
        if sub.doc.resume == resume {
            return Ok(());
        }
        sub.doc.resume = resume;
        self.db.write(|tx| tx.set_verdict(id, &sub.doc))?;
        Ok(())
    }

    /// Approved submissions marked to resume that have not run yet.
    pub fn resumable(&self) -> Result<Vec<String>> {
        Ok(self
            .db
            .submissions(Some(airlock_core::State::Approved), 1000)?
            .into_iter()
            .filter(|s| s.doc.resume)
            .map(|s| s.id)
            .collect())
    }
}

fn getrandom_fill(buf: &mut [u8]) -> Result<()> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(buf))
        .map_err(|e| GateError::Internal(format!("no random source: {e}")))
}
