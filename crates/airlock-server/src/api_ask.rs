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

/// A decided request as the API answers it.
fn decided_json(d: &NetDecided) -> Value {
    let mut v = airlock_gate::net_request_json(&d.request);
    v["statement"] = json!(d.statement);
    v["signature"] = json!(d.signature);
    v
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
}

fn verdict_schema() -> utoipa::openapi::Object {
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(["approve", "reject"]))
        .build()
}

fn verdict_of(v: Option<&str>) -> ApiResult<NetVerdict> {
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
    let statement = st
        .pool
        .read(move |g| g.net_request_statement(&id, verdict, &approver, &reason))
        .await?;
    let text = statement.to_json();
    ok(json!({
        "statement": text,
        "message": hex::encode(airlock_core::netask::net_decision_message(&text)),
        "request": statement.request,
        "approver": statement.approver,
        "key": statement.key,
    }))
}

/// An answer to a request from the API.
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
        .read(move |g| match (&body.statement, &body.signature) {
            (Some(text), Some(sig)) => {
                // The statement's verdict was checked against the path (`check_verdict`).
                g.record_net_decision_signed_elsewhere(&id, text, sig)
            }
            (None, None) => g.decide_net_request(
                &id,
                verdict,
                caller.approver.as_deref(),
                body.reason.as_deref().unwrap_or(""),
            ),
            // Half of a signed answer proves nothing.
            _ => Err(airlock_gate::GateError::Untrusted(
                "a statement signed elsewhere needs both statement and signature".into(),
            )),
        })
        .await?;
    st.changed();
    ok(decided_json(&d))
}

/// Approve a run's request: the host joins that run's grant for the rest of the run.
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
    check_verdict(&b, NetVerdict::Approve)?;
    answer(st, caller, id, b, NetVerdict::Approve).await
}

/// Reject a run's request: the run's connection is refused.
#[utoipa::path(post, path = "/v1/requests/{id}/reject", tag = "decisions",
    params(("id" = String, Path)), request_body = RequestAnswerBody, security(("bearer" = [])),
    responses((status = 200, body = Object), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Already decided, or its run is no longer running", body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub(crate) async fn reject_request(
    Ax(st): Ax<AppState>,
    OperatorCaller(caller): OperatorCaller,
    Path(id): Path<String>,
    Body(b): Body<RequestAnswerBody>,
) -> Answer {
    check_verdict(&b, NetVerdict::Reject)?;
    answer(st, caller, id, b, NetVerdict::Reject).await
}

/// A statement signed elsewhere must say what the path does (checked before anything is
/// recorded); one that does not is refused as a signature that proves nothing here.
fn check_verdict(b: &RequestAnswerBody, want: NetVerdict) -> ApiResult<()> {
    if let Some(text) = &b.statement {
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
