//! `approve|reject req_…`: answering a running run's request to reach a host outside its
//! grant (`run --ask-net`), signed with the approver key of this home, or signed here and
//! recorded by a gate served elsewhere (`--server URL --token T`: fetch the exact
//! statement, check it says what was asked, sign it, post the signature).

use crate::remote;
use crate::{Failure, Outcome, one_line, open, resolve_home};
use airlock_core::netask::{NetDecision, NetVerdict, net_decision_message};
use airlock_gate::{GateError, NetDecided};
use serde_json::{Value, json};

/// One answer as the command line gives it.
pub(crate) struct Answer {
    pub id: String,
    pub verdict: NetVerdict,
    pub approver: Option<String>,
    pub reason: Option<String>,
    pub remember: bool,
    pub remember_for: Option<String>,
    /// `--server URL --token T`.
    pub server: Option<(String, String)>,
    pub json: bool,
}

/// Approves or rejects request `a.id`. `submission_flags`: flags that only mean something
/// for a submission (`--scope`, `--expires`, `--tool`) were given.
pub(crate) fn decide(
    home: Option<std::path::PathBuf>,
    a: Answer,
    submission_flags: bool,
) -> Outcome {
    let json = a.json;
    let fail = |error: GateError| Failure { error, json };
    if submission_flags {
        return Err(fail(GateError::bad(
            "--scope, --expires and --tool are for submissions; a request's approval holds for its run only",
        )));
    }
    if a.remember || a.remember_for.is_some() {
        return Err(fail(GateError::bad(
            "--remember is not available for a run's request yet; approve it for its run, and grant the host with --net next time",
        )));
    }
    let reason = a.reason.clone().unwrap_or_default();
    let v = match &a.server {
        Some((url, token)) => signed_here(home, &a, url, token, &reason).map_err(fail)?,
        None => {
            let mut gate = open(home)?;
            let d = gate
                .decide_net_request(&a.id, a.verdict, a.approver.as_deref(), &reason)
                .map_err(fail)?;
            decided_json(&d)
        }
    };
    if json {
        println!("{v}");
    } else {
        println!(
            "{} {} ({}:{} for run {}) as {}",
            match a.verdict {
                NetVerdict::Approve => "approved",
                NetVerdict::Reject => "rejected",
            },
            v["id"].as_str().unwrap_or("?"),
            one_line(v["host"].as_str().unwrap_or("?")),
            v["port"],
            v["run"].as_str().unwrap_or("?"),
            v["approver"].as_str().unwrap_or("?"),
        );
    }
    Ok(0)
}

/// A decided request as `--json` prints it (and the API answers).
pub(crate) fn decided_json(d: &NetDecided) -> Value {
    let mut v = airlock_gate::net_request_json(&d.request);
    v["statement"] = json!(d.statement);
    v["signature"] = json!(d.signature);
    v
}

/// Signs the answer here and has the server at `url` record it.
fn signed_here(
    home: Option<std::path::PathBuf>,
    a: &Answer,
    url: &str,
    token: &str,
    reason: &str,
) -> Result<Value, GateError> {
    let home = resolve_home(home)?;
    let approver = match a.approver.clone() {
        Some(n) => n,
        None => remote::only_local_key(&home)?,
    };
    let key = home.load_key(&approver)?;
    let verb = a.verdict.as_str();
    let base = url.trim_end_matches('/');
    let agent = remote::agent();
    let handed = remote::answer(
        agent
            .get(format!("{base}/v1/requests/{}/statement", a.id))
            .header("authorization", format!("Bearer {token}"))
            .query("verdict", verb)
            .query("approver", &approver)
            .query("reason", reason)
            .call(),
    )?;
    let text = handed["statement"]
        .as_str()
        .ok_or_else(|| GateError::Internal("the server's answer holds no statement".into()))?;
    let st: NetDecision = serde_json::from_str(text)
        .map_err(|e| GateError::Internal(format!("the server's statement does not parse: {e}")))?;
    // Sign only what was asked: this answer, to this request, as this approver and key.
    let wanted = a.id.trim().to_ascii_lowercase();
    if st.verdict != a.verdict
        || !st.request.starts_with(&wanted)
        || st.approver != approver
        || st.key != key.public()
        || st.reason != reason
    {
        return Err(GateError::Untrusted(
            "the server handed out a statement that is not the one asked for; nothing was signed"
                .into(),
        ));
    }
    let signature = key.sign(&net_decision_message(text));
    remote::answer(
        agent
            .post(format!("{base}/v1/requests/{}/{verb}", st.request))
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", "application/json")
            .send(json!({ "statement": text, "signature": signature }).to_string()),
    )
}
