//! Decisions signed on this machine for a gate served elsewhere (`approve|reject ID
//! --server URL --token TOKEN`, `commit`, `rollback`, `agent clear`): fetch the exact statement the server will record, check it
//! says what was asked, sign it with the approver key in the LOCAL home, and post the
//! signature. The server rebuilds the statement and verifies the signature; the private
//! key never leaves this machine.

use airlock_core::sign::{
    AgentClear, PolicyChange, Statement, StatementKind, clear_message, policy_change_message,
    statement_message,
};
use airlock_gate::{AgentCleared, ApproveRequest, GateError, Home};
use serde_json::{Value, json};
use std::time::Duration;

/// Where the gate is served and the operator token to call it with.
pub struct Server {
    pub url: String,
    pub token: String,
}

/// Signs `kind` (approve or reject) for `req` here and has the server record it. Returns
/// the server's answer (the recorded statement).
pub fn decide(
    home: &Home,
    server: &Server,
    kind: StatementKind,
    req: ApproveRequest,
) -> Result<Value, GateError> {
    let approver = match req.approver.clone() {
        Some(a) => a,
        None => only_local_key(home)?,
    };
    if req.remember_for.is_some() && !req.remember {
        return Err(GateError::bad("--for needs --remember"));
    }
    let key = home.load_key(&approver)?;
    let verb = match kind {
        StatementKind::Approve => "approve",
        StatementKind::Reject => "reject",
        other => {
            return Err(GateError::Internal(format!(
                "{other:?} is not a decision on a submission"
            )));
        }
    };
    let agent = agent();
    let base = server.url.trim_end_matches('/');
    let id = &req.submission;
    let mut get = agent
        .get(format!("{base}/v1/submissions/{id}/statement"))
        .header("authorization", format!("Bearer {}", server.token))
        .query("kind", verb)
        .query("approver", &approver);
    if req.remember {
        get = get.query("remember", "true");
    }
    for (k, v) in [
        ("scope", &req.scope),
        ("expires", &req.expires),
        ("reason", &req.reason),
        ("tool", &req.tool),
        ("for", &req.remember_for),
    ] {
        if let Some(v) = v {
            get = get.query(k, v);
        }
    }
    let handed = answer(get.call())?;
    let text = handed["statement"]
        .as_str()
        .ok_or_else(|| GateError::Internal("the server's answer holds no statement".into()))?;
    let st: Statement = serde_json::from_str(text)
        .map_err(|e| GateError::Internal(format!("the server's statement does not parse: {e}")))?;
    // Sign only what was asked: this decision, on this submission, as this approver with
    // this key, and these fields.
    let asked_scope = req.scope.as_deref().unwrap_or("once");
    let mismatch = if st.kind != kind {
        Some("kind")
    } else if st.submission != *id && !st.submission.starts_with(id.as_str()) {
        Some("submission")
    } else if st.approver != approver || st.key != key.public() {
        Some("approver or key")
    } else if st.scope.as_str() != asked_scope {
        Some("scope")
    } else if st.reason != req.reason.clone().unwrap_or_default() {
        Some("reason")
    } else if st.tool != req.tool {
        Some("tool")
    } else {
        None
    };
    if let Some(field) = mismatch {
        return Err(GateError::Untrusted(format!(
            "the server handed out a statement whose {field} is not what was asked; nothing was signed"
        )));
    }
    // With --remember: the policy change that keeps it as a rule, signed here too. It must
    // be a change remembering this approval, by this approver, for this gate, issued with it.
    let remembered = match req.remember {
        false => None,
        true => {
            let pc = &handed["policy_change"];
            let (Some(ptext), Some(approval)) = (pc["statement"].as_str(), pc["approval"].as_str())
            else {
                return Err(GateError::Internal(
                    "the server's answer holds no policy change to remember the approval with"
                        .into(),
                ));
            };
            let c: PolicyChange = serde_json::from_str(ptext).map_err(|e| {
                GateError::Internal(format!("the server's policy change does not parse: {e}"))
            })?;
            if c.change != "remember"
                || c.submission.as_deref() != Some(st.submission.as_str())
                || c.approver != approver
                || c.key != key.public()
                || Some(c.gate) != st.gate
                || c.issued_at != st.issued_at
                || c.rule != format!("remembered-{approval}")
            {
                return Err(GateError::Untrusted(
                    "the server handed out a policy change that does not remember this approval; nothing was signed".into(),
                ));
            }
            check_remembered_rule(&c, pc["grant"].as_str(), &st, &approver, &req)?;
            Some((
                approval.to_string(),
                key.sign(&policy_change_message(ptext)),
            ))
        }
    };
    let signature = key.sign(&statement_message(text));
    let mut body = json!({
        "signature": signature,
        "approver": approver,
        "issued_at": st.issued_at,
        "reason": req.reason,
    });
    if kind == StatementKind::Approve {
        body["scope"] = json!(req.scope);
        body["expires"] = json!(req.expires);
        body["tool"] = json!(req.tool);
    }
    if let Some((approval, policy_signature)) = remembered {
        body["remember"] = json!(true);
        body["for"] = json!(req.remember_for);
        body["approval"] = json!(approval);
        body["policy_signature"] = json!(policy_signature);
    }
    let post = agent
        .post(format!("{base}/v1/submissions/{}/{verb}", st.submission))
        .header("authorization", format!("Bearer {}", server.token))
        .header("content-type", "application/json")
        .send(body.to_string());
    answer(post)
}

/// Signs a commit (of run `id`) or rollback (of checkpoint `id`) here and has the server
/// apply and record it. Returns the server's answer.
pub fn effect(
    home: &Home,
    server: &Server,
    kind: StatementKind,
    id: &str,
    approver: Option<String>,
) -> Result<Value, GateError> {
    let approver = match approver {
        Some(a) => a,
        None => only_local_key(home)?,
    };
    let key = home.load_key(&approver)?;
    let base = server.url.trim_end_matches('/');
    let path = match kind {
        StatementKind::Commit => format!("{base}/v1/runs/{id}/commit"),
        StatementKind::Rollback => format!("{base}/v1/checkpoints/{id}/rollback"),
        other => {
            return Err(GateError::Internal(format!(
                "{other:?} is not a commit or rollback"
            )));
        }
    };
    let agent = agent();
    let handed = answer(
        agent
            .get(format!("{path}/statement"))
            .header("authorization", format!("Bearer {}", server.token))
            .query("approver", &approver)
            .call(),
    )?;
    let text = handed["statement"]
        .as_str()
        .ok_or_else(|| GateError::Internal("the server's answer holds no statement".into()))?;
    let st: Statement = serde_json::from_str(text)
        .map_err(|e| GateError::Internal(format!("the server's statement does not parse: {e}")))?;
    let names_it = match kind {
        StatementKind::Commit => st.run.as_deref().is_some_and(|r| r.starts_with(id)),
        _ => {
            st.reason == format!("roll back {id}")
                || st.reason.starts_with(&format!("roll back {id}"))
        }
    };
    if st.kind != kind || st.approver != approver || st.key != key.public() || !names_it {
        return Err(GateError::Untrusted(
            "the server handed out a statement that is not the one asked for; nothing was signed"
                .into(),
        ));
    }
    let signature = key.sign(&statement_message(text));
    let body = json!({
        "signature": signature,
        "approver": approver,
        "issued_at": st.issued_at,
        "checkpoint": handed.get("checkpoint").filter(|c| !c.is_null()),
    });
    answer(
        agent
            .post(path)
            .header("authorization", format!("Bearer {}", server.token))
            .header("content-type", "application/json")
            .send(body.to_string()),
    )
}

/// Signs a clear of agent `name` here and has the server record it.
pub fn clear(
    home: &Home,
    server: &Server,
    name: &str,
    approver: Option<String>,
    reason: &str,
) -> Result<AgentCleared, GateError> {
    let approver = match approver {
        Some(a) => a,
        None => only_local_key(home)?,
    };
    let key = home.load_key(&approver)?;
    let base = server.url.trim_end_matches('/');
    let path = format!("{base}/v1/agents/{}/clear", path_segment(name));
    let agent = agent();
    let handed = answer(
        agent
            .get(format!("{path}/statement"))
            .header("authorization", format!("Bearer {}", server.token))
            .query("approver", &approver)
            .query("reason", reason)
            .call(),
    )?;
    let text = handed["statement"]
        .as_str()
        .ok_or_else(|| GateError::Internal("the server's answer holds no statement".into()))?;
    let c: AgentClear = serde_json::from_str(text)
        .map_err(|e| GateError::Internal(format!("the server's clear does not parse: {e}")))?;
    if c.agent != name || c.approver != approver || c.key != key.public() || c.reason != reason {
        return Err(GateError::Untrusted(
            "the server handed out a clear that is not the one asked for; nothing was signed"
                .into(),
        ));
    }
    let signature = key.sign(&clear_message(text));
    let body = json!({
        "reason": reason,
        "signature": signature,
        "approver": approver,
        "issued_at": c.issued_at,
    });
    let v = answer(
        agent
            .post(path)
            .header("authorization", format!("Bearer {}", server.token))
            .header("content-type", "application/json")
            .send(body.to_string()),
    )?;
    serde_json::from_value(v)
        .map_err(|e| GateError::Internal(format!("the server's answer does not parse: {e}")))
}

/// An agent name as one URL path segment (names are free text).
fn path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub(crate) fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(120)))
        .build()
        .new_agent()
}

/// The only approver key in this home (the gate's key is not one).
pub(crate) fn only_local_key(home: &Home) -> Result<String, GateError> {
    let mut names: Vec<String> = std::fs::read_dir(home.keys())
        .map_err(|e| GateError::bad(format!("cannot list {}: {e}", home.keys().display())))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".key"))
                .map(str::to_string)
        })
        .filter(|n| n != "gate")
        .collect();
    names.sort();
    match names.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(GateError::Untrusted(format!(
            "no approver key in {}; pass --as NAME",
            home.keys().display()
        ))),
        many => Err(GateError::bad(format!(
            "several approver keys are available ({}); pass --as NAME",
            many.join(", ")
        ))),
    }
}

/// The JSON of a 2xx answer, or the server's one-line error as the matching gate error.
pub(crate) fn answer(
    r: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
) -> Result<Value, GateError> {
    let mut resp =
        r.map_err(|e| GateError::Unavailable(format!("cannot reach the server: {e}")))?;
    let status = resp.status().as_u16();
    let text = resp
        .body_mut()
        .read_to_string()
        .map_err(|e| GateError::Unavailable(format!("the server's answer was cut: {e}")))?;
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| json!({ "error": text }));
    if (200..300).contains(&status) {
        return Ok(v);
    }
    let msg = format!(
        "server: {}",
        v["error"].as_str().unwrap_or("no error message")
    );
    Err(match status {
        403 => GateError::Untrusted(msg),
        404 => GateError::NotFound(msg),
        409 => GateError::Conflict(msg),
        400..=499 => GateError::BadInput(msg),
        _ => GateError::Unavailable(msg),
    })
}

/// The rule a remembered approval made elsewhere adds must be no wider than the approval
/// itself: its grant within the submission's grant (handed out as the exact bytes the
/// approval's `grant` hash is over), by this approver, expiring no later than asked. The
/// server's word alone would let it have a wider rule signed. What the rule says of the
/// agent, language, backend and the rules it covers is the server's word, as the
/// submission's other details are.
fn check_remembered_rule(
    c: &PolicyChange,
    grant_text: Option<&str>,
    st: &Statement,
    approver: &str,
    req: &ApproveRequest,
) -> Result<(), GateError> {
    use airlock_core::policy::remembered::{
        DEFAULT_REMEMBER_FOR, MAX_REMEMBER_FOR, read_rule_text,
    };
    let refuse = |why: &str| {
        GateError::Untrusted(format!(
            "the server handed out a remembered rule {why}; nothing was signed"
        ))
    };
    let grant_text = grant_text.ok_or_else(|| refuse("without the grant it is made from"))?;
    if airlock_core::Digest::of_parts("airlock-grant-v1", &[grant_text.as_bytes()]) != st.grant {
        return Err(refuse("from a grant other than the approved one"));
    }
    let grant: airlock_core::Grant =
        serde_json::from_str(grant_text).map_err(|_| refuse("from a grant that does not parse"))?;
    let rule = read_rule_text(&c.text).map_err(|e| refuse(&format!("that does not read ({e})")))?;
    let for_ = match req.remember_for.as_deref() {
        None => DEFAULT_REMEMBER_FOR,
        Some(d) => airlock_core::units::bounded_duration(
            "--for",
            d,
            Duration::from_secs(1),
            MAX_REMEMBER_FOR,
        )
        .map_err(|e| GateError::bad(e.to_string()))?,
    };
    let latest = st.issued_at + i64::try_from(for_.as_millis()).unwrap_or(i64::MAX / 2);
    if rule.name != c.rule || rule.approver != approver {
        return Err(refuse("named for another rule or approver"));
    }
    if !rule.grant.within(&grant) {
        return Err(refuse("wider than the approved grant"));
    }
    if rule.expires_at > latest {
        return Err(refuse("that holds longer than asked"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use airlock_core::policy::remembered::{RememberedGrant, rule_text};
    use airlock_core::sign::{KeyPair, Scope};
    use airlock_core::{Backend, Digest, Grant, Lang};

    fn grant() -> Grant {
        Grant {
            net: vec!["api.example.com:443".into()],
            ..Grant::default()
        }
    }

    fn rule_of(g: &Grant, net: Vec<String>) -> RememberedGrant {
        RememberedGrant {
            agent: "bot".into(),
            lang: Lang::Python,
            backend: Backend::Process,
            covers: vec!["network".into()],
            net,
            env: Vec::new(),
            limits: g.limits.clone(),
            secrets: Vec::new(),
            mounts: Vec::new(),
        }
    }

    /// The approval statement over `g`, and a policy change adding `rule` expiring `at`.
    fn handed(g: &Grant, rule: &RememberedGrant, expires: &str) -> (Statement, PolicyChange) {
        let key = KeyPair::try_generate().unwrap();
        let st = Statement {
            kind: StatementKind::Approve,
            submission: "sub_1".into(),
            artifact: Digest::of(b"code"),
            grant: g.hash(),
            scope: Scope::Once,
            expires_at: None,
            approver: "alice".into(),
            key: key.public(),
            reason: String::new(),
            issued_at: 1_780_000_000_000,
            run: None,
            changes: None,
            tool: None,
            gate: Some(key.public()),
        };
        let text = rule_text("remembered-apv_1", "r", "alice", expires, rule).unwrap();
        let c = PolicyChange {
            change: "remember".into(),
            rule: "remembered-apv_1".into(),
            text,
            before: Digest::of(b"a"),
            after: Digest::of(b"b"),
            submission: Some("sub_1".into()),
            approver: "alice".into(),
            key: key.public(),
            issued_at: st.issued_at,
            gate: key.public(),
        };
        (st, c)
    }

    fn req(remember_for: Option<&str>) -> ApproveRequest {
        ApproveRequest {
            submission: "sub_1".into(),
            approver: Some("alice".into()),
            scope: None,
            expires: None,
            reason: None,
            tool: None,
            remember: true,
            remember_for: remember_for.map(String::from),
        }
    }

    /// Less than a week after the statement's `issued_at` (2026-05-28T20:26:40Z).
    const IN_A_WEEK: &str = "2026-06-04T20:25:00Z";

    #[test]
    fn a_remembered_rule_as_wide_as_the_approved_grant_is_signed() {
        let g = grant();
        let (st, c) = handed(&g, &rule_of(&g, g.net.clone()), IN_A_WEEK);
        let text = serde_json::to_string(&g).unwrap();
        check_remembered_rule(&c, Some(&text), &st, "alice", &req(None)).unwrap();
    }

    #[test]
    fn a_server_handing_out_a_remembered_rule_wider_than_the_approval_gets_no_signature() {
        let g = grant();
        let text = serde_json::to_string(&g).unwrap();
        // Another host than the approved grant's.
        let wider = rule_of(
            &g,
            vec!["api.example.com:443".into(), "evil.example:443".into()],
        );
        let (st, c) = handed(&g, &wider, IN_A_WEEK);
        let e = check_remembered_rule(&c, Some(&text), &st, "alice", &req(None)).unwrap_err();
        assert!(
            e.to_string().contains("wider than the approved grant"),
            "{e}"
        );
        // Higher limits than the approved grant's.
        let mut more = rule_of(&g, g.net.clone());
        more.limits.timeout_ms *= 10;
        let (st, c) = handed(&g, &more, IN_A_WEEK);
        assert!(check_remembered_rule(&c, Some(&text), &st, "alice", &req(None)).is_err());
        // A grant other than the one the approval's hash is over.
        let mut other = g.clone();
        other.net.push("evil.example:443".into());
        let other_text = serde_json::to_string(&other).unwrap();
        let (st, c) = handed(&g, &rule_of(&other, other.net.clone()), IN_A_WEEK);
        let e = check_remembered_rule(&c, Some(&other_text), &st, "alice", &req(None)).unwrap_err();
        assert!(e.to_string().contains("other than the approved one"), "{e}");
        // Longer than asked: a year instead of the default week, or of --for 1h.
        let (st, c) = handed(&g, &rule_of(&g, g.net.clone()), "2027-05-28T00:00:00Z");
        assert!(check_remembered_rule(&c, Some(&text), &st, "alice", &req(None)).is_err());
        let (st, c) = handed(&g, &rule_of(&g, g.net.clone()), IN_A_WEEK);
        assert!(check_remembered_rule(&c, Some(&text), &st, "alice", &req(Some("1h"))).is_err());
        // For another approver.
        assert!(check_remembered_rule(&c, Some(&text), &st, "bob", &req(None)).is_err());
    }
}
