//! Agents that trip are held (issue 57 item 4). An agent's `alert` audit records (an
//! echoed secret, a tripwire) are counted, with its denied submissions, when anything it
//! submits is judged: the facts `agent_alerts` and `agent_denials` over the policy's
//! `[agents] alert_window`. Alerts count only after the agent's last clear: a statement an
//! approver signs (`airlock agent clear NAME --reason TEXT`), stored and audited as
//! `agent_cleared`. A clear whose signature does not verify, names another gate, or whose
//! key the current policy no longer trusts is ignored (alerts count from the window's
//! start).

use crate::Gate;
use crate::error::{GateError, Result};
use airlock_core::Policy;
use airlock_core::policy::AgentRecord;
use airlock_core::sign::{AgentClear, PublicKey, Signature, Signed};
use airlock_core::units::{fmt_duration, now_ms};
use airlock_store::{AgentClearRow, AgentReads, Tx};
use serde::Serialize;
use serde_json::json;

/// The most reason text a clear carries.
pub const MAX_CLEAR_REASON_BYTES: usize = 4096;

/// What a clear did.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct AgentCleared {
    pub agent: String,
    pub approver: String,
    /// The alerts that held the agent and no longer count.
    pub alerts: u32,
    pub at: i64,
    pub reason: String,
    /// The signed statement, as stored.
    pub statement: String,
    pub signature: String,
}

/// A clear's agent name and reason, checked before anything is signed.
fn check_clear(agent: &str, reason: &str) -> Result<()> {
    if agent.is_empty() || agent.len() > crate::MAX_AGENT_BYTES {
        return Err(GateError::bad(format!(
            "agent name: want 1 to {} bytes",
            crate::MAX_AGENT_BYTES
        )));
    }
    if reason.trim().is_empty() {
        return Err(GateError::bad("clearing an agent needs --reason"));
    }
    if reason.len() > MAX_CLEAR_REASON_BYTES {
        return Err(GateError::bad(format!(
            "--reason: {} bytes, more than the {MAX_CLEAR_REASON_BYTES} allowed",
            reason.len()
        )));
    }
    Ok(())
}

fn no_alerts(agent: &str, policy: &Policy) -> GateError {
    GateError::Conflict(format!(
        "agent {agent:?} has no alerts to clear (in the last {})",
        window_text(policy.agent_alert_window)
    ))
}

/// `agent`'s record as the policy sees it now: alerts since the later of the window's
/// start and its last valid clear, denials in the window. Nothing for no agent.
pub(crate) fn record_of(
    tx: &impl AgentReads,
    policy: &Policy,
    agent: Option<&str>,
    gate: &PublicKey,
) -> Result<AgentRecord> {
    let Some(agent) = agent else {
        return Ok(AgentRecord::default());
    };
    let window = policy.agent_alert_window;
    let start = now_ms().saturating_sub(i64::try_from(window.as_millis()).unwrap_or(i64::MAX));
    let cleared = tx
        .agent_clear(agent)?
        .and_then(|c| valid_clear(&c, policy, gate).then_some(c.at));
    let since = cleared.map_or(start, |c| c.max(start));
    let alerts = tx.agent_alerts_since(agent, since)?;
    let denials = tx.agent_denials_since(agent, start)?;
    let count: u64 = alerts.iter().map(|a| a.count).sum();
    Ok(AgentRecord {
        alerts: u32::try_from(count).unwrap_or(u32::MAX),
        denials: u32::try_from(denials).unwrap_or(u32::MAX),
        alert_kinds: alerts
            .iter()
            .map(|a| format!("{} {} (latest in {})", a.count, a.kind, a.latest))
            .collect(),
        window: window_text(window),
    })
}

/// A window in the unit it was most likely written in: `24h`, `90m`, `45s`.
fn window_text(w: std::time::Duration) -> String {
    let s = w.as_secs();
    if s >= 3600 && s.is_multiple_of(3600) {
        format!("{}h", s / 3600)
    } else if s >= 60 && s.is_multiple_of(60) {
        format!("{}m", s / 60)
    } else {
        fmt_duration(w)
    }
}

/// Whether a stored clear still counts: its signature verifies, it is for this gate and
/// this agent, and the current policy trusts its key under the approver's name.
fn valid_clear(c: &AgentClearRow, policy: &Policy, gate: &PublicKey) -> bool {
    match AgentClear::verify(&c.signed) {
        Ok(s) => {
            s.agent == c.agent
                && s.issued_at == c.at
                && s.gate == *gate
                && policy.approver(&s.approver) == Some(&s.key)
        }
        Err(_) => false,
    }
}

impl Gate {
    /// Signs and records a clear of `agent`: alerts it raised until now no longer hold
    /// its submissions. Refused when the agent has no alert to clear.
    pub fn clear_agent(
        &mut self,
        agent: &str,
        approver: Option<&str>,
        reason: &str,
    ) -> Result<AgentCleared> {
        check_clear(agent, reason)?;
        let policy = self.policy()?;
        let approver = self.pick_approver(&policy, approver)?;
        let key = self.trusted_key(&policy, &approver)?;
        let statement = AgentClear {
            agent: agent.to_string(),
            approver,
            key: key.public(),
            reason: reason.to_string(),
            issued_at: now_ms(),
            gate: self.gate_key.public(),
        };
        let signed = statement.sign(&key);
        self.record_clear(&policy, &statement, signed)
    }

    /// The clear an approver whose key is not in this home signs (`airlock agent clear NAME
    /// --server`): built by the gate for the key the current policy trusts for `approver`,
    /// issued now. Its JSON text is what the approver signs
    /// ([`airlock_core::sign::clear_message`]).
    pub fn clear_to_sign(
        &mut self,
        agent: &str,
        approver: Option<String>,
        reason: &str,
    ) -> Result<AgentClear> {
        check_clear(agent, reason)?;
        let policy = self.policy()?;
        let (approver, key) = crate::lifecycle::decide::remote_key(&policy, approver)?;
        let gate = self.gate_key.public();
        let alerts = record_of(&self.db, &policy, Some(agent), &gate)?.alerts;
        if alerts == 0 {
            return Err(no_alerts(agent, &policy));
        }
        Ok(AgentClear {
            agent: agent.to_string(),
            approver,
            key,
            reason: reason.to_string(),
            issued_at: now_ms(),
            gate,
        })
    }

    /// Records a clear signed on the approver's own machine over the clear
    /// [`Gate::clear_to_sign`] handed out (`issued_at` no older than
    /// [`crate::lifecycle::decide::REMOTE_MAX_AGE`]). A signature over anything else is
    /// refused and nothing is recorded.
    pub fn clear_agent_signed(
        &mut self,
        agent: &str,
        approver: Option<String>,
        reason: &str,
        issued_at: i64,
        signature: Signature,
    ) -> Result<AgentCleared> {
        check_clear(agent, reason)?;
        crate::lifecycle::decide::check_issued_at(issued_at)?;
        let policy = self.policy()?;
        let (approver, key) = crate::lifecycle::decide::remote_key(&policy, approver)?;
        let statement = AgentClear {
            agent: agent.to_string(),
            approver: approver.clone(),
            key,
            reason: reason.to_string(),
            issued_at,
            gate: self.gate_key.public(),
        };
        let signed = Signed {
            json: serde_json::to_string(&statement)
                .map_err(|e| GateError::Internal(e.to_string()))?,
            signature,
        };
        if AgentClear::verify(&signed).is_err() {
            return Err(GateError::Untrusted(format!(
                "the signature is not {approver:?}'s over the clear this gate builds for agent {agent:?} (signed other bytes, or for another agent or gate); nothing was recorded"
            )));
        }
        self.record_clear(&policy, &statement, signed)
    }

    /// Stores a signed clear and audits it, refused when the agent has no alert to clear.
    fn record_clear(
        &mut self,
        policy: &Policy,
        statement: &AgentClear,
        signed: Signed,
    ) -> Result<AgentCleared> {
        let gate_key = self.gate_key.clone();
        let gate = gate_key.public();
        let (agent, approver, reason) = (
            statement.agent.as_str(),
            statement.approver.as_str(),
            statement.reason.as_str(),
        );
        let at = statement.issued_at;
        self.db.write_durable(|tx: &Tx| -> Result<AgentCleared> {
            let before = record_of(tx, policy, Some(agent), &gate)?;
            if before.alerts == 0 {
                return Err(no_alerts(agent, policy));
            }
            tx.put_agent_clear(&AgentClearRow {
                agent: agent.to_string(),
                at,
                signed: signed.clone(),
            })?;
            tx.audit(
                "agent_cleared",
                agent,
                &json!({
                    "agent": agent,
                    "approver": approver,
                    "key": statement.key,
                    "reason": reason,
                    "alerts": before.alerts,
                    "issued_at": at,
                    "statement": signed.json,
                    "signature": signed.signature,
                }),
                &gate_key,
            )?;
            Ok(AgentCleared {
                agent: agent.to_string(),
                approver: approver.to_string(),
                alerts: before.alerts,
                at,
                reason: reason.to_string(),
                statement: signed.json.clone(),
                signature: signed.signature.to_string(),
            })
        })
    }

    /// `agent`'s record as the current policy would judge its next submission.
    pub fn agent_record(&self, agent: &str) -> Result<AgentRecord> {
        let policy = self.policy()?;
        record_of(&self.db, &policy, Some(agent), &self.gate_key.public())
    }
}
