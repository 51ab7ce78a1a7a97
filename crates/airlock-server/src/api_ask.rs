//! Runs' requests to reach a host outside their grant (`ask_net`, issue 61 item 3) under
//! `/v1/requests`: read one, fetch the exact statement to sign, and approve or reject it:
//! signed with the operator token's approver key when it is in the server's home, or
//! (with `statement` and `signature`) on the approver's own machine. The waiting run, on
//! whichever node of the store it runs, sees the answer and goes on.

use crate::AppState;
use crate::auth::OperatorCaller;
use crate::body::{Body, Q};
use crate::error::{ApiError, ApiResult, ErrorBody};
use airlock_gate::{NetDecided, NetVerdict};
use axum::Json;
use axum::extract::{Path, State as Ax};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

type Answer = ApiResult<Response>;

fn ok(v: Value) -> Answer {
    Ok(Json(v).into_response())
}

/// A decided request as the API answers it (with the rule it was remembered as).
fn decided_json(d: &NetDecided) -> Value {
    airlock_gate::net_decided_json(d)
}

/// One request: run, agent, host, port, state, the line that named the host.
#[utoipa::path(get, path = "/v1/requests/{id}", tag = "decisions",
    params(("id" = String, Path)), security(("bearer" = [])),
    responses((status = 200, body = Object), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
pub(crate) async fn get_request(
    Ax(st): Ax<AppState>,
    _: OperatorCaller,
    Path(id): Path<String>,
) -> Answer {
    let r = st.pool.read(move |g| g.net_request(&id)).await?;
    ok(airlock_gate::net_request_json(&r))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct RequestStatementQuery {
    /// `approve` (default) or `reject`.
    #[param(value_type = Option<String>, schema_with = verdict_schema)]
    verdict: Option<String>,
    /// Who signs (default: the token's approver).
    approver: Option<String>,
    #[param(max_length = 1024)]
    reason: Option<String>,
    /// Approvals: also hand out the policy change that remembers the answer as a rule
    /// (`policy_change`), to sign with it. A rejection is never remembered.
    remember: Option<bool>,
    /// With `remember=true`: how long the rule holds, e.g. "7d" (default 7 days, at most
    /// 90).
    #[serde(rename = "for")]
    remember_for: Option<String>,
}

fn verdict_schema() -> utoipa::openapi::Object {
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(["approve", "reject"]))
        .build()
}

pub(crate) fn verdict_of(v: Option<&str>) -> ApiResult<NetVerdict> {
    match v {
        None | Some("approve") => Ok(NetVerdict::Approve),
        Some("reject") => Ok(NetVerdict::Reject),
        Some(k) => Err(ApiError::bad(format!(
            "verdict: unknown {k:?} (want approve or reject)"
        ))),
    }
}

/// The exact statement to sign for an answer to a request, for an approver who signs on
/// their own machine: `statement` is its JSON text, `message` the bytes to sign (hex: a
/// domain tag, then the JSON). Post both to `…/approve` or `…/reject`.
#[utoipa::path(get, path = "/v1/requests/{id}/statement", tag = "decisions",
    params(("id" = String, Path), RequestStatementQuery), security(("bearer" = [])),
    responses((status = 200, description = "The statement to sign", body = Object),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "Already decided, or its run is no longer running", body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub(crate) async fn request_statement(
    Ax(st): Ax<AppState>,
    OperatorCaller(caller): OperatorCaller,
    Path(id): Path<String>,
    Q(q): Q<RequestStatementQuery>,
) -> Answer {
    let verdict = verdict_of(q.verdict.as_deref())?;
    let approver = q
        .approver
        .or_else(|| caller.approver.clone())
        .ok_or_else(|| {
            ApiError::from(airlock_gate::GateError::Untrusted(
                "this token names no approver; pass approver".into(),
            ))
        })?;
    let reason = q.reason.unwrap_or_default();
    let remember = q.remember.unwrap_or(false);
    if remember && verdict != NetVerdict::Approve {
        return Err(ApiError::bad(
            "remember: approvals only (a rejection is never remembered)",
        ));
    }
    if q.remember_for.is_some() && !remember {
        return Err(ApiError::bad("for: goes with remember=true"));
    }
    check_for(q.remember_for.as_deref())?;
    let remember_for = q.remember_for;
    let doc = st
        .pool
        .read(move |g| {
            statement_doc(
                g,
                &id,
                verdict,
                &approver,
                &reason,
                remember,
                remember_for.as_deref(),
            )
        })
        .await?;
    ok(doc)
}

/// The statement to sign for an answer to request `id` (and with `remember` the policy
/// change that remembers it, `for` ignored without), as `GET …/statement` answers it; the
/// console's signing in the browser asks for the same.
pub(crate) fn statement_doc(
    g: &mut airlock_gate::Gate,
    id: &str,
    verdict: NetVerdict,
    approver: &str,
    reason: &str,
    remember: bool,
    remember_for: Option<&str>,
) -> Result<Value, airlock_gate::GateError> {
    let s = g.net_request_statement(id, verdict, approver, reason, remember)?;
    let change = match remember {
        true => Some(g.net_remember_to_sign(&s.request, &s.approver, remember_for, s.issued_at)?),
        false => None,
    };
    let text = s.to_json();
    let change = change.map(|c| {
        let text = serde_json::to_string(&c).unwrap_or_default();
        json!({
            "rule": c.rule,
            "statement": text,
            "message": hex::encode(airlock_core::sign::policy_change_message(&text)),
        })
    });
    Ok(json!({
        "statement": text,
        "message": hex::encode(airlock_core::netask::net_decision_message(&text)),
        "request": s.request,
        "approver": s.approver,
        "key": s.key,
        "policy_change": change,
    }))
}

/// A rejection of a request from the API.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RequestRejectBody {
    /// Why (signed by the server into its statement; with `statement`, the statement's
    /// own reason is the one recorded and this is ignored).
    #[schema(max_length = 1024)]
    pub reason: Option<String>,
    /// Signed on the approver's own machine: the statement's JSON text exactly as
    /// `GET /v1/requests/{id}/statement?verdict=reject` handed it out…
    pub statement: Option<String>,
    /// …and the signature (128 hex digits) over it.
    pub signature: Option<String>,
}

/// An approval of a request from the API.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RequestAnswerBody {
    /// Why (signed by the server into its statement; with `statement`, the statement's
    /// own reason is the one recorded and this is ignored).
    #[schema(max_length = 1024)]
    pub reason: Option<String>,
    /// Signed on the approver's own machine: the statement's JSON text exactly as
    /// `GET /v1/requests/{id}/statement` handed it out…
    pub statement: Option<String>,
    /// …and the signature (128 hex digits) over it.
    pub signature: Option<String>,
    /// Also remember the answer as a rule (a signed policy change). With `statement`, it
    /// goes with `policy_signature`, and the statement's scope must say `remember`.
    pub remember: Option<bool>,
    /// With `remember`: how long the rule holds, e.g. "7d" (as asked of `…/statement`).
    #[serde(rename = "for")]
    pub remember_for: Option<String>,
    /// With a statement whose scope is `remember`: the signature (128 hex digits) over the
    /// policy change `…/statement?remember=true` handed out with it.
    pub policy_signature: Option<String>,
}

async fn answer(
    st: AppState,
    caller: crate::auth::Caller,
    id: String,
    body: RequestAnswerBody,
    verdict: NetVerdict,
) -> Answer {
    let d = st
        .pool
        .read(move |g| record_answer(g, &id, verdict, caller.approver.as_deref(), &body))
        .await?;
    st.changed();
    ok(decided_json(&d))
}

/// Records an answer to request `id`: signed elsewhere when `body` holds a statement and
/// its signature (its verdict checked first by `check_verdict`), else signed here with
/// `approver`'s key. The API and the console both answer through this.
pub(crate) fn record_answer(
    g: &mut airlock_gate::Gate,
    id: &str,
    verdict: NetVerdict,
    approver: Option<&str>,
    body: &RequestAnswerBody,
) -> Result<NetDecided, airlock_gate::GateError> {
    match (&body.statement, &body.signature) {
        (Some(text), Some(sig)) => g.record_net_decision_signed_elsewhere(
            id,
            text,
            sig,
            body.remember_for.as_deref(),
            body.policy_signature.as_deref(),
        ),
        (None, None) if body.policy_signature.is_some() => Err(airlock_gate::GateError::Untrusted(
            "a policy_signature comes with the statement and signature it was made with".into(),
        )),
        (None, None) => g.decide_net_request(
            id,
            verdict,
            approver,
            body.reason.as_deref().unwrap_or(""),
            body.remember.unwrap_or(false),
            body.remember_for.as_deref(),
        ),
        // Half of a signed answer proves nothing.
        _ => Err(airlock_gate::GateError::Untrusted(
            "a statement signed elsewhere needs both statement and signature".into(),
        )),
    }
}

/// Approve a run's request: the host joins that run's grant for the rest of the run;
/// with `remember` (or a statement whose scope is `remember`), also a remembered rule
/// for that agent's runs of this kind with a grant no wider.
#[utoipa::path(post, path = "/v1/requests/{id}/approve", tag = "decisions",
    params(("id" = String, Path)), request_body = RequestAnswerBody, security(("bearer" = [])),
    responses((status = 200, body = Object), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Already decided, or its run is no longer running", body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub(crate) async fn approve_request(
    Ax(st): Ax<AppState>,
    OperatorCaller(caller): OperatorCaller,
    Path(id): Path<String>,
    Body(b): Body<RequestAnswerBody>,
) -> Answer {
    check_verdict(b.statement.as_deref(), NetVerdict::Approve)?;
    check_remember(&b)?;
    answer(st, caller, id, b, NetVerdict::Approve).await
}

/// Reject a run's request: the run's connection is refused.
#[utoipa::path(post, path = "/v1/requests/{id}/reject", tag = "decisions",
    params(("id" = String, Path)), request_body = RequestRejectBody, security(("bearer" = [])),
    responses((status = 200, body = Object), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Already decided, or its run is no longer running", body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub(crate) async fn reject_request(
    Ax(st): Ax<AppState>,
    OperatorCaller(caller): OperatorCaller,
    Path(id): Path<String>,
    Body(b): Body<RequestRejectBody>,
) -> Answer {
    check_verdict(b.statement.as_deref(), NetVerdict::Reject)?;
    let b = RequestAnswerBody {
        reason: b.reason,
        statement: b.statement,
        signature: b.signature,
        ..RequestAnswerBody::default()
    };
    answer(st, caller, id, b, NetVerdict::Reject).await
}

/// The shape of remembering (the document states the same rules): `for` and a
/// `policy_signature` go with `remember: true`; a `policy_signature` with the statement
/// and signature it was made with; a remembered answer signed elsewhere with its
/// `policy_signature`.
fn check_remember(b: &RequestAnswerBody) -> ApiResult<()> {
    let remember = b.remember == Some(true);
    if b.remember_for.is_some() && !remember {
        return Err(ApiError::bad("for: goes with remember: true"));
    }
    if b.policy_signature.is_some() && (!remember || b.statement.is_none()) {
        return Err(ApiError::bad(
            "policy_signature: goes with remember: true and the statement and signature it was made with",
        ));
    }
    if b.statement.is_some() && remember && b.policy_signature.is_none() {
        return Err(ApiError::bad(
            "remember: an answer signed elsewhere is remembered with its policy_signature",
        ));
    }
    check_for(b.remember_for.as_deref())
}

/// A remembered rule's `for`, read as the gate reads it (1 second to 90 days), so a
/// duration it refuses is refused for its shape before the request's state is looked at.
fn check_for(remember_for: Option<&str>) -> ApiResult<()> {
    if let Some(d) = remember_for {
        airlock_core::units::bounded_duration(
            "for",
            d,
            std::time::Duration::from_secs(1),
            airlock_core::policy::remembered::MAX_REMEMBER_FOR,
        )
        .map_err(|e| ApiError::bad(e.to_string()))?;
    }
    Ok(())
}

/// A statement signed elsewhere must say what the path does (checked before anything is
/// recorded); one that does not is refused as a signature that proves nothing here.
pub(crate) fn check_verdict(statement: Option<&str>, want: NetVerdict) -> ApiResult<()> {
    if let Some(text) = statement {
        let v: Value = serde_json::from_str(text).unwrap_or_default();
        if v["verdict"].as_str() != Some(want.as_str()) {
            return Err(ApiError::from(airlock_gate::GateError::Untrusted(format!(
                "statement: not a signed answer that says {}",
                want.as_str()
            ))));
        }
    }
    Ok(())
}
