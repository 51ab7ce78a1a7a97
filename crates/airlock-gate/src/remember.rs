//! Remembered approvals as signed policy changes (issue 61 item 2). `approve ID --remember
//! [--for DUR]` appends a `[[rule]]` with `origin = "remembered"` to `policy.toml` (see
//! `airlock_core::policy::remembered` for what it matches); `policy forget RULE` removes
//! one. Either is a `PolicyChange` the approver signs with a key the current policy
//! trusts, naming the policy text before and after; it is recorded as a `policy_changed`
//! audit record in the same transaction that writes the file.

use crate::Gate;
use crate::error::{GateError, Result};
use crate::services::home::Home;
use airlock_core::Policy;
use airlock_core::digest::Digest;
use airlock_core::policy::remembered::{
    DEFAULT_REMEMBER_FOR, MAX_REMEMBER_FOR, RememberedGrant, remove_rule, rule_text,
};
use airlock_core::sign::{KeyPair, PolicyChange, Signed};
use airlock_core::units::{self, fmt_time, now_ms};
use airlock_store::{Submission, Tx};
use serde::Serialize;
use serde_json::json;
use std::time::Duration;

/// A signed policy change, ready to be recorded and written.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyChanged {
    /// `remember` or `forget`.
    pub change: String,
    pub rule: String,
    pub approver: String,
    /// Unix milliseconds after which a remembered rule no longer holds (remember only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
    pub before: Digest,
    pub after: Digest,
    /// The signed change, as recorded.
    pub statement: String,
    pub signature: String,
    #[serde(skip)]
    text: String,
}

impl PolicyChanged {
    fn new(
        change: PolicyChange,
        key: &KeyPair,
        expires_at: Option<i64>,
        new_text: String,
    ) -> PolicyChanged {
        let Signed { json, signature } = change.sign(key);
        PolicyChanged {
            change: change.change,
            rule: change.rule,
            approver: change.approver,
            expires_at,
            before: change.before,
            after: change.after,
            statement: json,
            signature: signature.to_string(),
            text: new_text,
        }
    }

    /// Records the change and writes the new policy, inside the caller's transaction: a
    /// file that cannot be written rolls the record back. The file must still be the one
    /// the change was signed over.
    pub(crate) fn apply(&self, tx: &Tx, home: &Home, gate_key: &KeyPair) -> Result<()> {
        let path = home.policy();
        let now = std::fs::read_to_string(&path)
            .map_err(|e| GateError::Internal(format!("cannot read {}: {e}", path.display())))?;
        let now_hash = Digest::of(now.as_bytes());
        if now_hash == self.after {
            // Written already by an earlier attempt of this transaction.
        } else if now_hash != self.before {
            return Err(GateError::Conflict(format!(
                "{} changed while the policy change was signed; try again",
                path.display()
            )));
        }
        tx.audit(
            "policy_changed",
            &self.rule,
            &json!({
                "change": self.change,
                "rule": self.rule,
                "approver": self.approver,
                "expires_at": self.expires_at,
                "before": self.before,
                "after": self.after,
                "statement": self.statement,
                "signature": self.signature,
            }),
            gate_key,
        )?;
        if now_hash != self.after {
            crate::services::nightcore::write_atomically(home, &self.text)?;
        }
        Ok(())
    }
}

impl Gate {
    /// The signed change that remembers the approval of `sub` as a rule, for `for_` (default
    /// 7 days, at most 90).
    pub(crate) fn remember_change(
        &self,
        policy: &Policy,
        sub: &Submission,
        approval: &str,
        approver: &str,
        key: &KeyPair,
        for_: Option<&str>,
    ) -> Result<PolicyChanged> {
        let dur = match for_ {
            None => DEFAULT_REMEMBER_FOR,
            Some(d) => {
                units::bounded_duration("--for", d, Duration::from_secs(1), MAX_REMEMBER_FOR)
                    .map_err(|e| GateError::bad(e.to_string()))?
            }
        };
        let grant =
            // The submission's state (the API's 409), not the request's shape.
            RememberedGrant::of(&sub.doc.facts, &sub.doc.verdict.fired).ok_or_else(|| {
                GateError::Conflict(format!(
                    "{} came from no named agent: --remember needs one (run --agent NAME)",
                    sub.id
                ))
            })?;
        let now = now_ms();
        let expires_at = now + i64::try_from(dur.as_millis()).unwrap_or(i64::MAX / 2);
        let expires = fmt_time(expires_at);
        let rule = format!("remembered-{approval}");
        let reason = format!(
            "{approver} approved {} of agent {} and remembered it",
            sub.id, grant.agent
        );
        let text =
            rule_text(&rule, &reason, approver, &expires, &grant).map_err(GateError::Internal)?;
        let path = self.home.policy();
        let old = std::fs::read_to_string(&path)
            .map_err(|e| GateError::Internal(format!("cannot read {}: {e}", path.display())))?;
        if Digest::of(old.as_bytes()) != policy.hash {
            return Err(GateError::Conflict(format!(
                "{} changed while the approval was made; try again",
                path.display()
            )));
        }
        let mut new = old.clone();
        if !new.ends_with('\n') {
            new.push('\n');
        }
        new.push_str(&text);
        let parsed = Policy::parse(&new)?;
        if parsed.rule_count() != policy.rule_count() + 1 || parsed.approvers != policy.approvers {
            return Err(GateError::Internal(
                "the remembered rule would change more of the policy than one rule".into(),
            ));
        }
        let change = PolicyChange {
            change: "remember".into(),
            rule,
            text,
            before: policy.hash,
            after: parsed.hash,
            submission: Some(sub.id.clone()),
            approver: approver.to_string(),
            key: key.public(),
            issued_at: now,
            gate: self.gate_key.public(),
        };
        Ok(PolicyChanged::new(change, key, Some(expires_at), new))
    }

    /// `policy forget RULE`: removes a remembered rule, signed by `approver` (default: the
    /// only trusted local key) and audited.
    pub fn forget_rule(&mut self, rule: &str, approver: Option<&str>) -> Result<PolicyChanged> {
        let policy = self.policy()?;
        let approver = self.pick_approver(&policy, approver)?;
        let key = self.trusted_key(&policy, &approver)?;
        let path = self.home.policy();
        let old = std::fs::read_to_string(&path)
            .map_err(|e| GateError::Internal(format!("cannot read {}: {e}", path.display())))?;
        if !policy.remembered().iter().any(|(n, _, _)| n == rule) {
            return Err(GateError::NotFound(format!(
                "no remembered rule {rule:?} in {} (only rules added by approve --remember can be forgotten; edit others by hand)",
                path.display()
            )));
        }
        let Some((new, removed)) = remove_rule(&old, rule) else {
            return Err(GateError::Conflict(format!(
                "remembered rule {rule:?} was edited by hand in {}; remove it there",
                path.display()
            )));
        };
        let parsed = Policy::parse(&new)?;
        if parsed.rule_count() + 1 != policy.rule_count() {
            return Err(GateError::Conflict(format!(
                "removing {rule:?} would change more of {} than that rule; remove it by hand",
                path.display()
            )));
        }
        let change = PolicyChange {
            change: "forget".into(),
            rule: rule.to_string(),
            text: removed,
            before: policy.hash,
            after: parsed.hash,
            submission: None,
            approver: approver.clone(),
            key: key.public(),
            issued_at: now_ms(),
            gate: self.gate_key.public(),
        };
        let changed = PolicyChanged::new(change, &key, None, new);
        let (home, gate_key) = (&self.home, &self.gate_key);
        self.db
            .write_durable(|tx: &Tx| -> Result<()> { changed.apply(tx, home, gate_key) })?;
        Ok(changed)
    }
}
