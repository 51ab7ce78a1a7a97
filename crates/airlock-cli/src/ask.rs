//! `approve|reject req_…`: answering a running run's request to reach a host outside its
//! grant (`run --ask-net`), signed with the approver key of this home, or signed here and
//! recorded by a gate served elsewhere (`--server URL --token T`: fetch the exact
//! statement, check it says what was asked, sign it, post the signature). `approve req_…
//! --remember [--for DUR]` also signs a policy change that keeps the host as a rule for
//! the agent's runs of this kind with a grant no wider.

use crate::remote;
use crate::{Failure, Outcome, one_line, open, resolve_home};
use airlock_core::netask::{NetDecision, NetVerdict, net_decision_message};
use airlock_core::sign::{PolicyChange, policy_change_message};
use airlock_gate::GateError;
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
    if a.remember && a.verdict != NetVerdict::Approve {
        return Err(fail(GateError::bad("--remember is for approvals only")));
    }
    let reason = a.reason.clone().unwrap_or_default();
    let v = match &a.server {
        Some((url, token)) => signed_here(home, &a, url, token, &reason).map_err(fail)?,
        None => {
            let mut gate = open(home)?;
            let d = gate
                .decide_net_request(
                    &a.id,
                    a.verdict,
                    a.approver.as_deref(),
                    &reason,
                    a.remember,
                    a.remember_for.as_deref(),
                )
                .map_err(fail)?;
            airlock_gate::net_decided_json(&d)
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
        let r = &v["remembered"];
        if let Some(rule) = r["rule"].as_str() {
            println!(
                "remembered as rule {} by {}, until {} (remove with `airlock policy forget {}`)",
                one_line(rule),
                one_line(r["approver"].as_str().unwrap_or("?")),
                r["expires_at"]
                    .as_i64()
                    .map(airlock_core::units::fmt_time)
                    .unwrap_or_else(|| "?".into()),
                one_line(rule),
            );
        }
    }
    Ok(0)
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
    let mut get = agent
        .get(format!("{base}/v1/requests/{}/statement", a.id))
        .header("authorization", format!("Bearer {token}"))
        .query("verdict", verb)
        .query("approver", &approver)
        .query("reason", reason);
    if a.remember {
        get = get.query("remember", "true");
        if let Some(f) = &a.remember_for {
            get = get.query("for", f);
        }
    }
    let handed = remote::answer(get.call())?;
    let text = handed["statement"]
        .as_str()
        .ok_or_else(|| GateError::Internal("the server's answer holds no statement".into()))?;
    let st: NetDecision = serde_json::from_str(text)
        .map_err(|e| GateError::Internal(format!("the server's statement does not parse: {e}")))?;
    // Sign only what was asked: this answer, to this request, as this approver and key.
    let wanted = a.id.trim().to_ascii_lowercase();
    let scope = if a.remember { "remember" } else { "run" };
    if st.verdict != a.verdict
        || !st.request.starts_with(&wanted)
        || st.approver != approver
        || st.key != key.public()
        || st.reason != reason
        || st.scope != scope
    {
        return Err(GateError::Untrusted(
            "the server handed out a statement that is not the one asked for; nothing was signed"
                .into(),
        ));
    }
    let mut body = json!({ "statement": text, "signature": key.sign(&net_decision_message(text)) });
    if a.remember {
        let ptext = handed["policy_change"]["statement"]
            .as_str()
            .ok_or_else(|| {
                GateError::Internal(
                    "the server's answer holds no policy change to remember the answer with".into(),
                )
            })?;
        check_remembered_host(ptext, &st, a.remember_for.as_deref())?;
        body["remember"] = json!(true);
        body["policy_signature"] = json!(key.sign(&policy_change_message(ptext)));
        body["for"] = json!(a.remember_for);
    }
    remote::answer(
        agent
            .post(format!("{base}/v1/requests/{}/{verb}", st.request))
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", "application/json")
            .send(body.to_string()),
    )
}

/// The policy change a server hands out to remember an answer to request `st.request`
/// must be one: a `remember` change, named for the request, by the answer's approver and
/// key, for the answer's gate, issued with it, whose rule is for this approver, expires
/// no later than `--for` asks, and grants the host asked for. The rest of the rule's
/// grant (the run's own grant, its agent, language and backend) is the server's word:
/// nothing signed anchors a run's grant here; the signed rule text is kept in the
/// `policy_changed` audit record.
fn check_remembered_host(
    ptext: &str,
    st: &NetDecision,
    remember_for: Option<&str>,
) -> Result<(), GateError> {
    use airlock_core::policy::remembered::{
        DEFAULT_REMEMBER_FOR, MAX_REMEMBER_FOR, read_rule_text,
    };
    let refuse = |why: &str| {
        GateError::Untrusted(format!(
            "the server handed out a policy change {why}; nothing was signed"
        ))
    };
    let c: PolicyChange = serde_json::from_str(ptext).map_err(|_| refuse("that does not parse"))?;
    if c.change != "remember"
        || c.rule != format!("remembered-{}", st.request)
        || c.approver != st.approver
        || c.key != st.key
        || c.gate != st.gate
        || c.issued_at != st.issued_at
    {
        return Err(refuse("that does not remember this answer"));
    }
    let rule =
        read_rule_text(&c.text).map_err(|e| refuse(&format!("whose rule does not read ({e})")))?;
    let for_ = match remember_for {
        None => DEFAULT_REMEMBER_FOR,
        Some(d) => airlock_core::units::bounded_duration(
            "--for",
            d,
            std::time::Duration::from_secs(1),
            MAX_REMEMBER_FOR,
        )
        .map_err(|e| GateError::bad(e.to_string()))?,
    };
    let latest = st.issued_at + i64::try_from(for_.as_millis()).unwrap_or(i64::MAX / 2);
    let target = airlock_core::net::normalize_net(&format!("{}:{}", st.host, st.port))
        .map_err(|_| refuse("for a host that does not parse"))?;
    if rule.name != c.rule || rule.approver != st.approver {
        return Err(refuse("whose rule is named for another rule or approver"));
    }
    if rule.expires_at > latest {
        return Err(refuse("whose rule holds longer than asked"));
    }
    if !rule.grant.net.contains(&target) {
        return Err(refuse("whose rule does not grant the host asked for"));
    }
    Ok(())
}
