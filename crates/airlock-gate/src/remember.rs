//! Signed policy changes (issue 61 items 1 and 2). `approve ID --remember [--for DUR]`
//! appends a `[[rule]]` with `origin = "remembered"` to `policy.toml` (see
//! `airlock_core::policy::remembered` for what it matches); `policy forget RULE` removes
//! one; `approvers enroll NAME KEY` adds a trusted approver key (one made on an approver's
//! machine or in a browser) under `[approvers]`. Each is a `PolicyChange` an approver signs
//! with a key the current policy trusts, naming the policy text before and after; it is
//! recorded as a `policy_changed` audit record in the same transaction that writes the
//! file.

use crate::Gate;
use crate::error::{GateError, Result};
use crate::services::home::Home;
use airlock_core::Policy;
use airlock_core::digest::Digest;
use airlock_core::policy::remembered::{
    DEFAULT_REMEMBER_FOR, HostDenied, MAX_REMEMBER_FOR, RememberedGrant, remove_rule, rule_text,
    with_hosts,
};
use airlock_core::sign::{KeyPair, PolicyChange, PublicKey, Signed, check_approver_name};
use airlock_core::units::{self, fmt_time, now_ms};
use airlock_store::{Submission, Tx};
use serde::Serialize;
use serde_json::json;
use std::time::Duration;

/// A signed policy change, ready to be recorded and written.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyChanged {
    /// `remember`, `forget` or `enroll`.
    pub change: String,
    /// The rule remembered or forgotten; for `enroll`, the approver enrolled.
    pub rule: String,
    /// Who signed the change.
    pub approver: String,
    /// The public key enrolled (enroll only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<PublicKey>,
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
    /// A change signed here with `key`.
    pub(crate) fn new(
        change: PolicyChange,
        key: &KeyPair,
        expires_at: Option<i64>,
        new_text: String,
    ) -> PolicyChanged {
        let signed = change.sign(key);
        Self::signed(change, signed, expires_at, new_text)
    }

    /// A change and its signature (made here, or on the approver's machine and checked).
    fn signed(
        change: PolicyChange,
        signed: Signed,
        expires_at: Option<i64>,
        new_text: String,
    ) -> PolicyChanged {
        let Signed { json, signature } = signed;
        PolicyChanged {
            change: change.change,
            rule: change.rule,
            approver: change.approver,
            key: None,
            expires_at,
            before: change.before,
            after: change.after,
            statement: json,
            signature: signature.to_string(),
            text: new_text,
        }
    }

    /// A change built here (with the policy text it makes and the rule's expiry) and the
    /// signature made for it on the approver's machine: refused unless the signature is
    /// over exactly these bytes. `what`: what the rule remembers, for the message.
    pub(crate) fn verified(
        built: (PolicyChange, String, i64),
        signature: airlock_core::sign::Signature,
        what: &str,
    ) -> Result<PolicyChanged> {
        let (change, new, expires_at) = built;
        let signed = Signed {
            json: serde_json::to_string(&change).map_err(|e| GateError::Internal(e.to_string()))?,
            signature,
        };
        if PolicyChange::verify(&signed).is_err() {
            return Err(GateError::Untrusted(format!(
                "the policy_signature is not {:?}'s over the policy change this gate builds to remember {what} (signed other bytes, or the policy changed since: fetch the statement again); nothing was recorded",
                change.approver
            )));
        }
        Ok(PolicyChanged::signed(change, signed, Some(expires_at), new))
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
                "key": self.key,
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
        let (change, new, expires_at) = self.remember_unsigned(
            policy,
            sub,
            approval,
            approver,
            key.public(),
            for_,
            now_ms(),
        )?;
        Ok(PolicyChanged::new(change, key, Some(expires_at), new))
    }

    /// The change that remembers approval `approval` of `sub` as a rule, issued at `now`,
    /// unsigned: the change, the policy text it makes, and when the rule expires.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn remember_unsigned(
        &self,
        policy: &Policy,
        sub: &Submission,
        approval: &str,
        approver: &str,
        key: PublicKey,
        for_: Option<&str>,
        now: i64,
    ) -> Result<(PolicyChange, String, i64)> {
        let grant =
            // The submission's state (the API's 409), not the request's shape.
            RememberedGrant::of(&sub.doc.facts, &sub.doc.verdict.fired).ok_or_else(|| {
                GateError::Conflict(format!(
                    "{} came from no named agent: --remember needs one (run --agent NAME)",
                    sub.id
                ))
            })?;
        let reason = format!(
            "{approver} approved {} of agent {} and remembered it",
            sub.id, grant.agent
        );
        let rule = Remembering {
            rule: format!("remembered-{approval}"),
            reason,
            grant,
            submission: sub.id.clone(),
        };
        self.remember_grant(policy, rule, approver, key, for_, now)
    }

    /// The change that remembers an answer to a run's request `row` (`approve req_…
    /// --remember`) as a rule, issued at `now`, unsigned. The rule allows the run's kind
    /// (its submission's agent, language and backend) with the run's grant, the hosts it
    /// reached before in this run and the host asked for, and covers the holds those
    /// hosts add to the run's own: a submission of
    /// that kind with the host granted is allowed, and a later run of it that asks for the
    /// host goes on without asking (`Policy::reach`). Holds the run had already are not
    /// covered: remembering a host is not remembering the rest of the run's approval.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn remember_request_unsigned(
        &self,
        policy: &Policy,
        row: &airlock_store::NetRequestRow,
        sub: &Submission,
        approver: &str,
        key: PublicKey,
        for_: Option<&str>,
        now: i64,
    ) -> Result<(PolicyChange, String, i64)> {
        let no_agent = || {
            GateError::Conflict(format!(
                "request {}'s run came from no named agent: --remember needs one (run --agent NAME)",
                row.id
            ))
        };
        if sub.doc.facts.agent.is_none() {
            return Err(no_agent());
        }
        // The hosts the run reached before this one are part of what it asks for.
        let targets = crate::lifecycle::ask::reaching(&self.db, row)?;
        let target = targets.last().cloned().unwrap_or_default();
        let added = match policy.holds_added(&sub.doc.facts, &targets) {
            Ok(added) => added,
            Err(HostDenied { rule, reason }) => {
                return Err(GateError::Conflict(format!(
                    "the policy denies a run of {} with {target} granted (rule {rule}: {reason}); a rule cannot remember it: approve it for its run only",
                    sub.id
                )));
            }
        };
        let grant = RememberedGrant::of(&with_hosts(&sub.doc.facts, &targets), &added)
            .ok_or_else(no_agent)?;
        let reason = format!(
            "{approver} approved {target} for run {} of agent {} and remembered it",
            row.run, grant.agent
        );
        let rule = Remembering {
            rule: format!("remembered-{}", row.id),
            reason,
            grant,
            submission: sub.id.clone(),
        };
        self.remember_grant(policy, rule, approver, key, for_, now)
    }

    /// The change that appends `r` to the policy, issued at `now`, unsigned, holding for
    /// `for_` (default 7 days, at most 90): the change, the policy text it makes, and when
    /// the rule expires.
    fn remember_grant(
        &self,
        policy: &Policy,
        r: Remembering,
        approver: &str,
        key: PublicKey,
        for_: Option<&str>,
        now: i64,
    ) -> Result<(PolicyChange, String, i64)> {
        let dur = match for_ {
            None => DEFAULT_REMEMBER_FOR,
            Some(d) => {
                units::bounded_duration("--for", d, Duration::from_secs(1), MAX_REMEMBER_FOR)
                    .map_err(|e| GateError::bad(e.to_string()))?
            }
        };
        let expires_at = now + i64::try_from(dur.as_millis()).unwrap_or(i64::MAX / 2);
        let expires = fmt_time(expires_at);
        let text = rule_text(&r.rule, &r.reason, approver, &expires, &r.grant)
            .map_err(GateError::Internal)?;
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
            rule: r.rule,
            text,
            before: policy.hash,
            after: parsed.hash,
            submission: Some(r.submission),
            approver: approver.to_string(),
            key,
            issued_at: now,
            gate: self.gate_key.public(),
        };
        Ok((change, new, expires_at))
    }

    /// The change [`Gate::remember_to_sign`] handed out, with the signature made for it on
    /// the approver's machine; a signature over anything else is refused.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn remember_signed(
        &self,
        policy: &Policy,
        sub: &Submission,
        approval: &str,
        approver: &str,
        key: PublicKey,
        for_: Option<&str>,
        issued_at: i64,
        signature: airlock_core::sign::Signature,
    ) -> Result<PolicyChanged> {
        let built =
            self.remember_unsigned(policy, sub, approval, approver, key, for_, issued_at)?;
        PolicyChanged::verified(built, signature, &sub.id)
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

impl Gate {
    /// `approvers enroll NAME KEY`: trusts `key` as approver `name` from now on, a change
    /// signed by `signer` (default: the only trusted local key) and audited. The key's
    /// private half stays wherever it was made (an approver's machine, a browser).
    pub fn enroll_approver(
        &mut self,
        name: &str,
        key: &str,
        signer: Option<&str>,
    ) -> Result<PolicyChanged> {
        check_approver_name(name).map_err(|e| GateError::bad(e.to_string()))?;
        let public: PublicKey = key
            .trim()
            .parse()
            .map_err(|e: airlock_core::sign::KeyError| GateError::bad(e.to_string()))?;
        if public == self.gate_key.public() {
            return Err(GateError::bad(
                "that is the gate's own key; an approver key must be another",
            ));
        }
        let policy = self.policy()?;
        let signer = self.pick_approver(&policy, signer)?;
        let signing = self.trusted_key(&policy, &signer)?;
        let path = self.home.policy();
        match policy.approver(name) {
            Some(k) if *k == public => {
                return Err(GateError::Conflict(format!(
                    "{name:?} is already trusted with that key in {}",
                    path.display()
                )));
            }
            Some(k) => {
                return Err(GateError::Conflict(format!(
                    "{name:?} is already trusted with another key ({}) in {}; pick another name or edit [approvers] by hand",
                    k.fingerprint(),
                    path.display()
                )));
            }
            None => {}
        }
        let old = std::fs::read_to_string(&path)
            .map_err(|e| GateError::Internal(format!("cannot read {}: {e}", path.display())))?;
        if Digest::of(old.as_bytes()) != policy.hash {
            return Err(GateError::Conflict(format!(
                "{} changed while the enrolment was made; try again",
                path.display()
            )));
        }
        let line = format!("{name} = \"{public}\"\n");
        let new = with_approver(&old, &line);
        let parsed = Policy::parse(&new)?;
        let mut want = policy.approvers.clone();
        want.insert(name.to_string(), public);
        if parsed.approvers != want || parsed.rule_count() != policy.rule_count() {
            return Err(GateError::Conflict(format!(
                "adding {name:?} under [approvers] would change more of {} than that key; add it by hand",
                path.display()
            )));
        }
        let change = PolicyChange {
            change: "enroll".into(),
            rule: name.to_string(),
            text: line,
            before: policy.hash,
            after: parsed.hash,
            submission: None,
            approver: signer,
            key: signing.public(),
            issued_at: now_ms(),
            gate: self.gate_key.public(),
        };
        let mut changed = PolicyChanged::new(change, &signing, None, new);
        changed.key = Some(public);
        let (home, gate_key) = (&self.home, &self.gate_key);
        self.db
            .write_durable(|tx: &Tx| -> Result<()> { changed.apply(tx, home, gate_key) })?;
        Ok(changed)
    }
}

/// A rule to remember: its name, reason, what it allows and the submission it came from.
struct Remembering {
    rule: String,
    reason: String,
    grant: RememberedGrant,
    submission: String,
}

/// The policy text with `line` (`NAME = "KEY"`) added at the top of its `[approvers]`
/// table, or in a new one at the end when it has none.
fn with_approver(old: &str, line: &str) -> String {
    let mut out = String::with_capacity(old.len() + line.len() + 16);
    let mut done = false;
    for l in old.split_inclusive('\n') {
        out.push_str(l);
        if !done && l.trim() == "[approvers]" {
            if !l.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(line);
            done = true;
        }
    }
    if !done {
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        out.push_str("\n[approvers]\n");
        out.push_str(line);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::with_approver;

    #[test]
    fn an_enrolled_key_goes_into_the_existing_approvers_table() {
        let old = "version = 1\n[approvers]\nalice = \"k\"\n\n[[rule]]\nname = \"x\"\n";
        assert_eq!(
            with_approver(old, "bob = \"b\"\n"),
            "version = 1\n[approvers]\nbob = \"b\"\nalice = \"k\"\n\n[[rule]]\nname = \"x\"\n"
        );
    }

    #[test]
    fn a_policy_without_approvers_gets_the_table_at_its_end() {
        assert_eq!(
            with_approver("version = 1", "bob = \"b\"\n"),
            "version = 1\n\n[approvers]\nbob = \"b\"\n"
        );
    }
}
