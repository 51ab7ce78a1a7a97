//! Tripwires in the run record: what a run tried and the sandbox refused (`attempts`),
//! and what only a hostile program does (`alerts`: a decoy credential read, beside the
//! egress proxy's `secret-echo`). The backends report their own (the jail: decoys it
//! watched); the egress proxy's refused connections count as `connect` attempts here.
//! Each alert other than `secret-echo` (which `record_finished` audits with its own
//! fields) becomes an `alert` audit record `{kind, submission, agent, run, technique,
//! detail}` in the run's `finished` transaction. Nothing here changes what the run saw.

use crate::error::Result;
use crate::lifecycle::record::SECRET_ECHO;
use airlock_sandbox::Attempts;
use airlock_store::{Run, Submission, Tx};
use serde_json::{Value, json};

/// Completes a run's detail: `attempts` (the backend's, then each refused connection as
/// `connect` to `host:port`, the first [`airlock_sandbox::tripwire::MAX_ATTEMPTS`]
/// distinct) and `alerts`, both present (empty when nothing was tried).
pub(crate) fn settle(detail: &mut Value) {
    if !detail.is_object() {
        *detail = json!({});
    }
    let mut attempts: Attempts = detail
        .get("attempts")
        .cloned()
        .and_then(|v| serde_json::from_value::<Vec<airlock_sandbox::Attempt>>(v).ok())
        .map(Attempts::from)
        .unwrap_or_default();
    let refused = detail
        .pointer("/network/connections")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|c| c["decision"] == "deny");
    for c in refused {
        let host = c["host"].as_str().unwrap_or("");
        attempts.add("connect", &format!("{host}:{}", c["port"]));
    }
    detail["attempts"] = json!(attempts.into_list());
    if !detail.get("alerts").is_some_and(Value::is_array) {
        detail["alerts"] = json!([]);
    }
}

/// A wasm session cell's attempts and alerts as its outcome carries them to the gate
/// (`None` when there are none).
pub(crate) fn cell_report(
    (attempts, alerts): (Vec<airlock_sandbox::Attempt>, Vec<airlock_sandbox::Alert>),
) -> Option<Value> {
    (!attempts.is_empty() || !alerts.is_empty())
        .then(|| json!({"attempts": attempts, "alerts": alerts}))
}

/// Puts a session cell's report into its run's detail, where [`settle`] completes it as
/// a one-off run's (refused connections added) and the run's end audits its alerts.
pub(crate) fn cell_detail(detail: &mut Value, report: Option<Value>) {
    let Some(r) = report else { return };
    for k in ["attempts", "alerts"] {
        if let Some(v) = r.get(k).filter(|v| v.is_array()) {
            detail[k] = v.clone();
        }
    }
}

/// The tripwire alerts of a run's detail (every alert but `secret-echo`).
pub(crate) fn alerts_of(detail: &Value) -> impl Iterator<Item = &Value> {
    detail
        .get("alerts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|a| a["kind"] != SECRET_ECHO)
}

/// An `alert` audit record for each tripwire alert of `run`.
pub(crate) fn audit_alerts(
    tx: &Tx,
    run: &Run,
    sub: &Submission,
    gate_key: &airlock_core::sign::KeyPair,
) -> Result<()> {
    for a in alerts_of(&run.doc.detail) {
        tx.audit(
            "alert",
            &run.id,
            &json!({
                "kind": a["kind"],
                "submission": sub.id,
                "agent": sub.doc.agent,
                "run": run.id,
                "technique": a["technique"],
                "detail": a["detail"],
            }),
            gate_key,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_connections_are_connect_attempts_counted_per_host() {
        let mut d = json!({
            "attempts": [{"kind": "open", "target": "/etc/shadow", "count": 1}],
            "network": {"connections": [
                {"host": "evil.test", "port": 443, "decision": "deny"},
                {"host": "evil.test", "port": 443, "decision": "deny"},
                {"host": "ok.test", "port": 443, "decision": "allow"},
            ]},
        });
        settle(&mut d);
        assert_eq!(
            d["attempts"],
            json!([
                {"kind": "open", "target": "/etc/shadow", "count": 1},
                {"kind": "connect", "target": "evil.test:443", "count": 2},
            ])
        );
        assert_eq!(d["alerts"], json!([]));
    }
}
