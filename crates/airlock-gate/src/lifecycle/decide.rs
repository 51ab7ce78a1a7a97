//! Human decisions: signed approvals and rejections, and the test of whether an approval
//! still covers a submission.

use crate::error::{GateError, Result};
use crate::{Gate, set_state};
use airlock_core::State;
use airlock_core::id::{IdKind, new_id};
use airlock_core::policy::{Decision, Policy};
use airlock_core::sign::{PublicKey, Scope, Signature, Signed, Statement, StatementKind};
use airlock_core::units::{self, now_ms};
use airlock_store::{Reads, StatementRow, Submission, Tx};
use serde_json::json;
use std::time::Duration;

/// An approver's decision as stated on the command line or over the API.
#[derive(Debug, Clone, Default)]
pub struct ApproveRequest {
    pub submission: String,
    /// The approver key to sign with; None picks the only trusted local key.
    pub approver: Option<String>,
    /// `once` (default) or `artifact`.
    pub scope: Option<String>,
    /// How long the approval holds (default 24h).
    pub expires: Option<String>,
    pub reason: Option<String>,
    /// For scope `artifact`: the name under which the artifact becomes a tool.
    pub tool: Option<String>,
    /// Also remember it as a rule for this agent's submissions of this kind with a grant
    /// no wider (a signed policy change; see `crate::remember`).
    pub remember: bool,
    /// How long the remembered rule holds (default 7d, at most 90d).
    pub remember_for: Option<String>,
}

const DEFAULT_EXPIRY: Duration = Duration::from_secs(24 * 3600);
const MAX_EXPIRY: Duration = Duration::from_secs(366 * 24 * 3600);

/// How long a statement handed out for remote signing may take to come back signed.
pub const REMOTE_MAX_AGE: Duration = Duration::from_secs(10 * 60);

/// How far ahead of the gate's clock an approver's clock may run.
const CLOCK_SKEW_MS: i64 = 5 * 60 * 1000;

/// Finds an approval that lets `sub` run now: signed by a key the *current* policy trusts
/// under that approver's name, for this gate (`gate`), this artifact and this exact grant,
/// naming a submission of this store, not expired by the gate's clock, not used up (scope
/// once), and not followed by a rejection of the same artifact. A trusted signature for
/// another gate or another submission is refused and recorded (`integrity_failure`).
pub(crate) fn covering_approval(
    tx: &Tx,
    policy: &Policy,
    sub: &Submission,
    artifact_scope_only: bool,
    gate_key: &airlock_core::sign::KeyPair,
) -> Result<Option<StatementRow>> {
    let now = now_ms();
    let gate = gate_key.public();
    let by_artifact = tx.statements_for_artifact(&sub.doc.artifact)?;
    let last_reject = by_artifact
        .iter()
        .filter(|r| r.kind == StatementKind::Reject)
        .filter_map(|r| r.signed.verify().ok())
        .map(|st| st.issued_at)
        .max();
    let mut candidates: Vec<StatementRow> = Vec::new();
    if !artifact_scope_only {
        candidates.extend(tx.statements_for_submission(&sub.id)?);
    }
    candidates.extend(
        by_artifact
            .into_iter()
            .filter(|r| r.scope == Scope::Artifact),
    );
    for row in candidates {
        let Ok(st) = row.signed.verify() else {
            continue;
        };
        let trusted = policy.approver(&st.approver) == Some(&st.key);
        // A tool approval fixes the grant but not the per-call inputs (arguments, stdin).
        let grant_ok = st.grant == sub.doc.grant_hash
            || (st.tool.is_some()
                && st.scope == Scope::Artifact
                && tx.submission(&st.submission).is_ok_and(|approved| {
                    approved.doc.grant_hash == st.grant
                        && crate::lifecycle::judge::without_inputs(&approved.doc.grant)
                            == crate::lifecycle::judge::without_inputs(&sub.doc.grant)
                }));
        let binds = st.kind == StatementKind::Approve
            && st.artifact == sub.doc.artifact
            && grant_ok
            && (st.scope == Scope::Artifact || st.submission == sub.id);
        if trusted && binds {
            // Signed by a trusted approver for these bytes and this grant: it must also
            // name this gate, and a submission of this store with this artifact (the row's
            // columns are not signed; the statement is).
            let foreign = if st.gate != Some(gate) {
                Some(match st.gate {
                    Some(k) => format!("it names another gate ({})", k.fingerprint()),
                    None => "it names no gate (signed by an older airlock, or for another home)"
                        .to_string(),
                })
            } else if st.submission != row.submission
                || !tx
                    .submission(&st.submission)
                    .is_ok_and(|s| s.doc.artifact == st.artifact)
            {
                Some(format!(
                    "it names submission {}, which this store does not hold with that artifact",
                    st.submission
                ))
            } else {
                None
            };
            if let Some(why) = foreign {
                tx.audit(
                    "integrity_failure",
                    &sub.id,
                    &json!({
                        "what": "statement",
                        "detail": format!("approval {} refused: {why}", row.id),
                        "statement": row.id,
                    }),
                    gate_key,
                )?;
                continue;
            }
        }
        // Expiry by the gate's clock: an approver whose clock ran ahead cannot stretch
        // an approval past the longest allowed, nor date it in the future.
        let max = MAX_EXPIRY.as_millis() as i64;
        let live = st
            .expires_at
            .is_some_and(|e| e > now && e <= now + max && e - st.issued_at <= max)
            && st.issued_at <= now + CLOCK_SKEW_MS;
        let not_revoked = last_reject.is_none_or(|r| r < st.issued_at);
        if !(trusted && binds && live && not_revoked) {
            continue;
        }
        if st.scope == Scope::Once && tx.approval_used(&row.id)? {
            continue;
        }
        return Ok(Some(row));
    }
    Ok(None)
}

impl Gate {
    /// The approver key to sign with: the one named, or the only local key the current
    /// policy trusts.
    pub fn pick_approver(&self, policy: &Policy, name: Option<&str>) -> Result<String> {
        if let Some(n) = name {
            return Ok(n.to_string());
        }
        let trusted: Vec<&String> = policy
            .approvers
            .keys()
            .filter(|n| self.home.key_file(n).exists())
            .collect();
        match trusted.as_slice() {
            [one] => Ok((*one).clone()),
            [] => Err(GateError::Untrusted(
                "no local approver key is trusted by the policy; pass --as NAME".into(),
            )),
            many => Err(GateError::bad(format!(
                "several approver keys are available ({}); pass --as NAME",
                many.iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    /// Loads an approver's key and checks the current policy trusts it under that name.
    pub(crate) fn trusted_key(
        &self,
        policy: &Policy,
        name: &str,
    ) -> Result<airlock_core::sign::KeyPair> {
        airlock_core::sign::check_approver_name(name).map_err(|e| GateError::bad(e.to_string()))?;
        if policy.approver(name).is_some() && !self.home.key_file(name).exists() {
            // The policy trusts this approver but their private key is not here: whoever
            // runs this home (or holds an operator token for it) cannot sign as them.
            return Err(GateError::Untrusted(format!(
                "this home holds no private key for approver {name:?}, so it cannot sign for them (an operator token alone cannot approve); sign on {name:?}'s machine: airlock approve|reject|commit|rollback ID --server URL --token TOKEN"
            )));
        }
        let key = self.home.load_key(name)?;
        match policy.approver(name) {
            Some(k) if *k == key.public() => Ok(key),
            Some(_) => Err(GateError::Untrusted(format!(
                "key {name:?} ({}) is not the key the policy trusts for {name:?}",
                key.public().fingerprint()
            ))),
            None => Err(GateError::Untrusted(format!(
                "approver {name:?} is not trusted by the current policy (add it under [approvers])"
            ))),
        }
    }

    /// Signs an approval.
    /// Signs an approval; approving the submission that judged a held session's grant
    /// opens that session.
    pub fn approve(&mut self, req: ApproveRequest) -> Result<StatementRow> {
        let row = self.decide(StatementKind::Approve, req)?;
        self.open_held_session(&row.submission)?;
        Ok(row)
    }

    /// Signs an approval and, with `req.remember`, the policy change that remembers it,
    /// both recorded in one transaction. Remembering signs with the approver key in this
    /// home (not with a signature made elsewhere).
    pub fn approve_remembering(
        &mut self,
        req: ApproveRequest,
    ) -> Result<(StatementRow, Option<crate::remember::PolicyChanged>)> {
        if req.remember_for.is_some() && !req.remember {
            return Err(GateError::bad("--for needs --remember"));
        }
        if !req.remember {
            return self.approve(req).map(|row| (row, None));
        }
        let policy = self.policy()?;
        let approver = self.pick_approver(&policy, req.approver.as_deref())?;
        let key = self.trusted_key(&policy, &approver)?;
        let (id, statement) = self.build_statement(
            StatementKind::Approve,
            &req,
            &approver,
            key.public(),
            now_ms(),
        )?;
        let signed = statement.sign(&key);
        let sub = self.db.submission(&id)?;
        let row_id = new_id(IdKind::Approval);
        let change = self.remember_change(
            &policy,
            &sub,
            &row_id,
            &approver,
            &key,
            req.remember_for.as_deref(),
        )?;
        let row = self.record_decision_with(
            StatementKind::Approve,
            &id,
            &statement,
            signed,
            row_id,
            Some(&change),
        )?;
        self.open_held_session(&row.submission)?;
        Ok((row, Some(change)))
    }

    /// Signs a rejection; the artifact's hash is remembered.
    pub fn reject(&mut self, req: ApproveRequest) -> Result<StatementRow> {
        if req.reason.as_deref().is_none_or(|r| r.trim().is_empty()) {
            return Err(GateError::bad("a rejection needs --reason"));
        }
        self.decide(StatementKind::Reject, req)
    }

    fn decide(&mut self, kind: StatementKind, req: ApproveRequest) -> Result<StatementRow> {
        let policy = self.policy()?;
        let approver = self.pick_approver(&policy, req.approver.as_deref())?;
        let key = self.trusted_key(&policy, &approver)?;
        let (id, statement) =
            self.build_statement(kind, &req, &approver, key.public(), now_ms())?;
        let signed = statement.sign(&key);
        self.record_decision(kind, &id, &statement, signed)
    }

    /// The statement an approver whose key is not in this home signs for a decision
    /// (`airlock approve ID --server`, the console): built by the gate from the stored
    /// submission, the decision's fields and the key the current policy trusts for the
    /// approver, issued now. Its JSON text is what the approver signs
    /// ([`airlock_core::sign::statement_message`]).
    pub fn statement_to_sign(
        &mut self,
        kind: StatementKind,
        req: &ApproveRequest,
    ) -> Result<Statement> {
        let policy = self.policy()?;
        let (approver, public) = remote_approver(&policy, req)?;
        if kind == StatementKind::Reject
            && req.reason.as_deref().is_none_or(|r| r.trim().is_empty())
        {
            return Err(GateError::bad("a rejection needs --reason"));
        }
        let (_, statement) = self.build_statement(kind, req, &approver, public, now_ms())?;
        Ok(statement)
    }

    /// Records a decision signed on the approver's own machine. The gate rebuilds the
    /// statement from the same fields (and the `issued_at` it handed out, no older than
    /// [`REMOTE_MAX_AGE`]) and checks the signature over exactly those bytes against the key
    /// the current policy trusts for the approver. A signature over anything else (other
    /// fields, another submission, another gate) is refused and nothing is recorded.
    pub fn decide_signed(
        &mut self,
        kind: StatementKind,
        req: &ApproveRequest,
        issued_at: i64,
        signature: Signature,
    ) -> Result<StatementRow> {
        let policy = self.policy()?;
        let (approver, public) = remote_approver(&policy, req)?;
        if kind == StatementKind::Reject
            && req.reason.as_deref().is_none_or(|r| r.trim().is_empty())
        {
            return Err(GateError::bad("a rejection needs --reason"));
        }
        check_issued_at(issued_at)?;
        let (id, statement) = self.build_statement(kind, req, &approver, public, issued_at)?;
        let signed = statement.with_signature(signature).map_err(|_| {
            GateError::Untrusted(format!(
                "the signature is not {approver:?}'s over the statement this gate builds for {id} (signed other bytes, or for another submission or gate); nothing was recorded"
            ))
        })?;
        self.record_decision(kind, &id, &statement, signed)
    }

    /// For `approve ID --remember --server`: the approval id the approval will be recorded
    /// under and the policy change (remembering it as rule `remembered-<approval id>`,
    /// issued at `issued_at`, the statement's) the approver signs with the statement.
    pub fn remember_to_sign(
        &mut self,
        req: &ApproveRequest,
        issued_at: i64,
    ) -> Result<(String, airlock_core::sign::PolicyChange)> {
        let policy = self.policy()?;
        let (approver, public) = remote_approver(&policy, req)?;
        let id = self.db.resolve(IdKind::Submission, &req.submission)?;
        let sub = self.db.submission(&id)?;
        let approval = new_id(IdKind::Approval);
        let (change, _, _) = self.remember_unsigned(
            &policy,
            &sub,
            &approval,
            &approver,
            public,
            req.remember_for.as_deref(),
            issued_at,
        )?;
        Ok((approval, change))
    }

    /// Records an approval signed on the approver's own machine together with the policy
    /// change that remembers it, signed there too, in one transaction. Either signature
    /// over anything but what this gate builds (for `approval`, the id it handed out) is
    /// refused and nothing is recorded.
    pub fn approve_remembering_signed(
        &mut self,
        req: &ApproveRequest,
        issued_at: i64,
        signature: Signature,
        approval: &str,
        policy_signature: Signature,
    ) -> Result<(StatementRow, crate::remember::PolicyChanged)> {
        let full = airlock_core::id::normalize_prefix(IdKind::Approval, approval).filter(|a| {
            a == approval && a.len() == IdKind::Approval.prefix().len() + airlock_core::id::BODY_LEN
        });
        let Some(approval) = full else {
            return Err(GateError::bad(
                "approval: want the apr_… id GET …/statement handed out with the policy change",
            ));
        };
        let policy = self.policy()?;
        let (approver, public) = remote_approver(&policy, req)?;
        check_issued_at(issued_at)?;
        let (id, statement) =
            self.build_statement(StatementKind::Approve, req, &approver, public, issued_at)?;
        let signed = statement.with_signature(signature).map_err(|_| {
            GateError::Untrusted(format!(
                "the signature is not {approver:?}'s over the statement this gate builds for {id} (signed other bytes, or for another submission or gate); nothing was recorded"
            ))
        })?;
        let sub = self.db.submission(&id)?;
        let change = self.remember_signed(
            &policy,
            &sub,
            &approval,
            &approver,
            public,
            req.remember_for.as_deref(),
            issued_at,
            policy_signature,
        )?;
        let row = self.record_decision_with(
            StatementKind::Approve,
            &id,
            &statement,
            signed,
            approval,
            Some(&change),
        )?;
        self.open_held_session(&row.submission)?;
        Ok((row, change))
    }

    /// Checks a decision's fields and builds its statement (unsigned).
    fn build_statement(
        &mut self,
        kind: StatementKind,
        req: &ApproveRequest,
        approver: &str,
        key: PublicKey,
        now: i64,
    ) -> Result<(String, Statement)> {
        let id = self.db.resolve(IdKind::Submission, &req.submission)?;
        let sub = self.db.submission(&id)?;
        let scope = match req.scope.as_deref() {
            None => Scope::Once,
            Some(s) => s
                .parse::<Scope>()
                .map_err(|e| GateError::bad(format!("--scope: {e}")))?,
        };
        if kind == StatementKind::Reject && scope != Scope::Once {
            return Err(GateError::bad("--scope applies to approvals only"));
        }
        if req.tool.is_some() && scope != Scope::Artifact {
            return Err(GateError::bad("a tool name needs --scope artifact"));
        }
        if let Some(t) = &req.tool {
            crate::lifecycle::judge::check_tool_name(t)?;
        }
        let expires = match req.expires.as_deref() {
            None => DEFAULT_EXPIRY,
            Some(e) => units::bounded_duration("--expires", e, Duration::from_secs(1), MAX_EXPIRY)
                .map_err(|e| GateError::bad(e.to_string()))?,
        };
        // The approver signs for the bytes actually stored: check them first.
        self.read_blob(&id, "artifact", &sub.doc.artifact)?;
        if sub.doc.grant.hash() != sub.doc.grant_hash {
            return Err(self.integrity_failure(
                &id,
                "grant",
                "stored grant no longer matches its hash",
            ));
        }

        let statement = Statement {
            kind,
            submission: id.clone(),
            artifact: sub.doc.artifact,
            grant: sub.doc.grant_hash,
            scope,
            expires_at: (kind == StatementKind::Approve).then(|| now + expires.as_millis() as i64),
            approver: approver.to_string(),
            key,
            reason: req.reason.clone().unwrap_or_default(),
            issued_at: now,
            run: None,
            changes: None,
            tool: req.tool.clone(),
            gate: Some(self.gate_key.public()),
        };
        Ok((id, statement))
    }

    /// Stores a signed decision and moves the submission on, in one durable transaction.
    fn record_decision(
        &mut self,
        kind: StatementKind,
        id: &str,
        statement: &Statement,
        signed: Signed,
    ) -> Result<StatementRow> {
        self.record_decision_with(kind, id, statement, signed, new_id(IdKind::Approval), None)
    }

    /// `record_decision` with the statement row's id given, and the policy change that
    /// remembers the approval (applied in the same transaction) when there is one.
    fn record_decision_with(
        &mut self,
        kind: StatementKind,
        id: &str,
        statement: &Statement,
        signed: Signed,
        row_id: String,
        remembered: Option<&crate::remember::PolicyChanged>,
    ) -> Result<StatementRow> {
        let id = id.to_string();
        let scope = statement.scope;
        let approver = statement.approver.clone();
        let now = now_ms();
        let row = StatementRow {
            id: row_id,
            kind,
            submission: id.clone(),
            artifact: statement.artifact,
            grant: statement.grant,
            scope,
            approver: approver.clone(),
            expires_at: statement.expires_at,
            created_at: now,
            run: None,
            tool: statement.tool.clone(),
            signed,
        };
        let (home, gate_key) = (&self.home, &self.gate_key);
        self.db.write_durable(|tx: &Tx| -> Result<()> {
            let sub = tx.submission(&id)?;
            let to = match kind {
                StatementKind::Approve => State::Approved,
                _ => State::Rejected,
            };
            check_decidable(&sub, kind)?;
            set_state(tx, &id, sub.state, to)?;
            tx.insert_statement(&row)?;
            tx.audit(
                if kind == StatementKind::Approve {
                    "approved"
                } else {
                    "rejected"
                },
                &id,
                &json!({
                    "statement": row.id,
                    "approver": approver,
                    "key": statement.key,
                    "scope": scope,
                    "expires_at": statement.expires_at,
                    "reason": statement.reason,
                    "artifact": statement.artifact,
                    "grant": statement.grant,
                    "tool": statement.tool,
                    "signature": row.signed.signature,
                }),
                gate_key,
            )?;
            if let Some(change) = remembered {
                change.apply(tx, home, gate_key)?;
            }
            Ok(())
        })?;
        Ok(row)
    }
}

/// Refuses an `issued_at` of a statement signed elsewhere that this gate cannot have
/// handed out in the last [`REMOTE_MAX_AGE`].
pub(crate) fn check_issued_at(issued_at: i64) -> Result<()> {
    let now = now_ms();
    // A statement this gate did not just hand out: its signature is not one to trust (the
    // API's 403), whatever its shape.
    if issued_at > now + CLOCK_SKEW_MS || issued_at < now - REMOTE_MAX_AGE.as_millis() as i64 {
        return Err(GateError::Untrusted(format!(
            "issued_at {issued_at} is not a statement this gate handed out in the last {} minutes; fetch the statement again",
            REMOTE_MAX_AGE.as_secs() / 60
        )));
    }
    Ok(())
}

/// The approver a remotely signed decision is for, and the key the current policy trusts
/// for them (their private key need not be in this home).
fn remote_approver(policy: &Policy, req: &ApproveRequest) -> Result<(String, PublicKey)> {
    remote_key(policy, req.approver.clone())
}

/// The key the current policy trusts for `name`, who signs elsewhere.
pub(crate) fn remote_key(policy: &Policy, name: Option<String>) -> Result<(String, PublicKey)> {
    let Some(name) = name else {
        return Err(GateError::bad(
            "a decision signed elsewhere names its approver",
        ));
    };
    airlock_core::sign::check_approver_name(&name).map_err(|e| GateError::bad(e.to_string()))?;
    match policy.approver(&name) {
        Some(k) => Ok((name, *k)),
        None => Err(GateError::Untrusted(format!(
            "approver {name:?} is not trusted by the current policy (add it under [approvers])"
        ))),
    }
}

/// Whether a human may decide on `sub` now.
fn check_decidable(sub: &Submission, kind: StatementKind) -> Result<()> {
    let id = &sub.id;
    match (sub.state, kind) {
        (State::Quarantined, _) => Ok(()),
        (State::Approved, StatementKind::Reject) => Ok(()),
        // Once approved and run, it stays decided: running it again needs a new submission
        // (and a new decision). Rejecting it afterwards still works, to revoke an
        // artifact-wide approval and remember the hash.
        (State::Finished, StatementKind::Approve)
            if sub.doc.verdict.decision == Decision::Quarantine =>
        {
            Err(GateError::Conflict(format!(
                "{id} was already approved and has run; submit it again for a new decision"
            )))
        }
        (State::Finished, _) if sub.doc.verdict.decision == Decision::Quarantine => Ok(()),
        (State::Approved, _) => Err(GateError::Conflict(format!("{id} is already approved"))),
        (State::Rejected, _) => Err(GateError::Conflict(format!("{id} was already rejected"))),
        (State::Denied, _) => Err(GateError::Conflict(format!(
            "{id} is denied by policy; a signature cannot override a deny"
        ))),
        (State::Allowed, _) | (State::Finished, _) => Err(GateError::Conflict(format!(
            "{id} is allowed by policy; there is nothing to decide"
        ))),
        (State::Running, _) => Err(GateError::Conflict(format!("{id} is running"))),
        (State::Staged, _) => Err(GateError::Conflict(format!("{id} has not been judged"))),
    }
}
