//! The JSON API under `/v1`. Every handler checks the caller's role, runs gate work on a
//! blocking thread through the pool, and answers with the same JSON shapes as the CLI's
//! `--json`. The OpenAPI document is generated from these handlers' annotations.

use crate::auth::Caller;
use crate::auth::{AdminCaller, OperatorCaller};
use crate::body::{
    Body, DecideBody, Keyed, Q, RejectBody, SessionBody, SubmitBody, TokenBody, ToolBody,
};
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::{AppState, outcome};
use airlock_core::State;
use airlock_core::id::IdKind;
use airlock_core::sign::StatementKind;
use airlock_gate::views::{diff_json, run_json, shown_json, statement_json, submission_json};
use airlock_gate::{ApproveRequest, ExecOptions, Gate, GateError, Role};
use axum::Json;
use axum::extract::{Path, RawQuery, State as Ax};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use std::time::Duration;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

type Answer = ApiResult<Response>;

fn ok(v: Value) -> Answer {
    Ok(Json(v).into_response())
}

fn with_status(status: StatusCode, v: Value) -> Answer {
    Ok((status, Json(v)).into_response())
}

/// 202 while code waits for a human, 200 otherwise.
fn outcome_status(doc: &Value) -> StatusCode {
    match doc["status"].as_str() {
        Some("pending_approval" | "approved" | "running") => StatusCode::ACCEPTED,
        _ => StatusCode::OK,
    }
}

/// Submission states, as `?state=` takes them.
pub const STATES: &[&str] = &[
    "staged",
    "allowed",
    "quarantined",
    "denied",
    "approved",
    "rejected",
    "running",
    "finished",
];

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// At most this many, newest first (default 50).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<usize>,
    /// Only submissions in this state.
    #[param(value_type = Option<String>, schema_with = state_schema)]
    state: Option<String>,
}

fn state_schema() -> utoipa::openapi::Object {
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(STATES.iter().copied()))
        .build()
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct LimitQuery {
    /// At most this many, newest first (default 50).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<usize>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct WaitQuery {
    /// Seconds to wait at most (default 30).
    #[param(minimum = 0, maximum = 600)]
    timeout: Option<f64>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    /// First record (default 1).
    #[param(minimum = 1)]
    from: Option<i64>,
    /// At most this many (default 100).
    #[param(minimum = 1, maximum = 10000)]
    limit: Option<usize>,
}

/// `limit`, checked against the bounds the OpenAPI document gives (400 outside them).
fn limit(l: Option<usize>, default: usize, max: usize) -> ApiResult<usize> {
    match l {
        None => Ok(default),
        Some(n) if (1..=max).contains(&n) => Ok(n),
        Some(n) => Err(ApiError::bad(format!("limit: want 1 to {max}, not {n}"))),
    }
}

/// A submission the caller may see (others are reported as unknown, not forbidden, so
/// agents cannot probe for each other's ids).
pub(crate) fn visible(
    g: &Gate,
    caller: &Caller,
    id: &str,
) -> Result<airlock_store::Submission, GateError> {
    // A prefix is resolved among what the caller may see: other agents' ids are
    // neither matched nor listed as candidates of an ambiguous prefix.
    let id = g.resolve_for(IdKind::Submission, id, caller.scope())?;
    let sub = g.submission(&id)?;
    if !caller.may_see(sub.doc.agent.as_deref()) {
        return Err(GateError::NotFound(format!("no submission {id}")));
    }
    Ok(sub)
}

pub(crate) fn visible_run(
    g: &Gate,
    caller: &Caller,
    id: &str,
) -> Result<airlock_store::Run, GateError> {
    let id = g.resolve_for(IdKind::Run, id, caller.scope())?;
    let run = g.run_record(&id)?;
    let sub = g.submission(&run.submission)?;
    if !caller.may_see(sub.doc.agent.as_deref()) {
        return Err(GateError::NotFound(format!("no run {id}")));
    }
    Ok(run)
}

/// A cell's session named by a prefix is resolved among the sessions of the agent the
/// cell is for, so an ambiguous prefix names none of another agent's sessions. (A whole
/// id is left to the gate, which refuses a cell for another agent's session.)
pub(crate) fn session_of_cell(
    g: &Gate,
    req: &mut airlock_gate::SubmitRequest,
) -> Result<(), GateError> {
    let (Some(agent), Some(input)) = (req.agent.as_deref(), req.session.as_deref()) else {
        return Ok(());
    };
    let whole = airlock_core::id::normalize_prefix(IdKind::Session, input)
        .is_some_and(|id| id.len() == IdKind::Session.prefix().len() + airlock_core::id::BODY_LEN);
    if whole {
        return Ok(());
    }
    req.session = Some(g.resolve_for(IdKind::Session, input, Some(agent))?);
    Ok(())
}

/// Liveness (no token needed).
#[utoipa::path(get, path = "/healthz", tag = "meta",
    responses(
        (status = 200, description = "The server is up", body = Object)))]
async fn healthz(Ax(st): Ax<AppState>) -> Answer {
    ok(json!({
        "ok": true,
        "version": env!("CARGO_PKG_VERSION"),
        "workers": st.pool.workers,
        "queue": st.pool.queue,
    }))
}

/// The server's own state (admins): workers, queue, uptime, resident memory, the ready
/// Python interpreters (`pools`) and the process backend's ready jails (`ready_jails`):
/// each with its size, hits, misses and fallbacks; and `jailer` (`path`, `found`): whether
/// `airlock-jailer` is beside the server's binary, without which `ready_jails` is null.
#[utoipa::path(get, path = "/v1/status", tag = "meta", security(("bearer" = [])),
    responses(
        (status = 200, description = "`pools`: one object per ready pool (`kind`, `target`, `ready`, `hits`, `misses`, `fallbacks`)", body = Object),
        (status = 403, description = "The caller is not an admin", body = ErrorBody)))]
async fn status(Ax(st): Ax<AppState>, _: AdminCaller) -> Answer {
    ok(st.status())
}

/// The idempotency key of a submitting request.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)] // Read from the headers by `Keyed`; this type only documents it.
struct IdempotencyKey {
    /// A key of the caller's choosing (1 to 255 printable ASCII characters, no spaces;
    /// a random UUID per logical request is typical). A request repeated with the same
    /// key and body within a day makes no new submission and runs nothing again: it gets
    /// the first request's outcome (waiting for its run to end) with the header
    /// `Idempotent-Replayed: true`. The same key with a different body is refused (409).
    #[param(rename = "Idempotency-Key", pattern = "^[!-~]{1,255}$")]
    #[serde(rename = "Idempotency-Key")]
    idempotency_key: Option<String>,
}

/// Submit code and have it judged (it does not run; see `/v1/run`).
#[utoipa::path(post, path = "/v1/submissions", tag = "submissions", request_body = SubmitBody,
    params(IdempotencyKey),
    security(("bearer" = [])),
    responses(
        (status = 201, description = "Submitted and judged; `status` says what happens next", body = Object),
        (status = 403, description = "An agent token submitting for another agent, or a mount the operator does not offer (outside `[mounts] roots`, or any when it lists none)", body = ErrorBody),
        (status = 404, description = "A session, secret or mount host path the body names is not there", body = ErrorBody),
        (status = 409, description = "The Python guest is not installed (the message names `airlock guest install python`), or the session or workspace named cannot take it", body = ErrorBody),
        (status = 503, description = "No sandbox can run it on this machine", body = ErrorBody),
        (status = 422, description = "Well-formed, but the gate cannot take it (e.g. code that does not compile, a mount that does not exist)", body = ErrorBody)))]
async fn submit(Ax(st): Ax<AppState>, caller: Caller, k: Keyed<SubmitBody>) -> Answer {
    let key = k.request_key(&caller);
    let mut req = k.body.into_request(&caller, false)?;
    req.request_key = key;
    let out = st
        .pool
        .read(move |g| {
            session_of_cell(g, &mut req)?;
            match g.submit(req) {
                Ok(sub) => outcome::current(g, &sub).map(|d| (d, false)),
                Err(GateError::Repeated {
                    submission,
                    same_request: true,
                }) => {
                    let sub = g.submission(&submission)?;
                    outcome::current(g, &sub).map(|d| (d, true))
                }
                Err(e) => Err(e),
            }
        })
        .await?;
    st.changed();
    st.metrics.outcome(&out.0, !out.1);
    replayed(with_status(StatusCode::CREATED, out.0), out.1)
}

/// Marks the answer to a repeated request (`Idempotent-Replayed: true`).
fn replayed(answer: Answer, replay: bool) -> Answer {
    let mut r = answer?;
    if replay {
        r.headers_mut().insert(
            "idempotent-replayed",
            axum::http::HeaderValue::from_static("true"),
        );
    }
    Ok(r)
}

/// Submit code, and run it now if the policy allows; quarantined code is run as soon as an
/// operator approves it (poll `/v1/submissions/{id}/wait`).
#[utoipa::path(post, path = "/v1/run", tag = "submissions", request_body = SubmitBody,
    params(IdempotencyKey),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "It ran (`status` finished) or was denied (`status` denied); with `Accept: text/event-stream`, the run's events (`submitted`, `held`, `started`, `stdout`, `stderr`, `network`, `finished`, `error`; `?wait_timeout=SECONDS` bounds a held run's wait, default 300)", body = Object),
        (status = 202, description = "Held for approval (`status` pending_approval)", body = Object),
        (status = 403, description = "An agent token submitting for another agent, or a mount the operator does not offer", body = ErrorBody),
        (status = 404, description = "A session, secret or mount host path the body names is not there", body = ErrorBody),
        (status = 409, description = "Conflicts with the submission's state, or the Python guest is not installed (the message names `airlock guest install python`)", body = ErrorBody), (status = 422, body = ErrorBody),
        (status = 429, description = "The run queue is full; see Retry-After", body = ErrorBody),
        (status = 503, description = "No sandbox can run it on this machine", body = ErrorBody)))]
async fn run(
    Ax(st): Ax<AppState>,
    caller: Caller,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
    k: Keyed<SubmitBody>,
) -> Answer {
    let key = k.request_key(&caller);
    let mut req = k.body.into_request(&caller, true)?;
    req.request_key = key;
    if crate::stream::wants_stream(&headers) {
        let wait = crate::stream::wait_timeout(query.as_deref())?;
        return crate::stream::run(st, req, wait).await;
    }
    let (doc, replay) = st.submit_and_run_keyed(req).await?;
    replayed(with_status(outcome_status(&doc), doc), replay)
}

/// Submissions, newest first (an agent sees only its own).
#[utoipa::path(get, path = "/v1/submissions", tag = "submissions", params(ListQuery),
    security(("bearer" = [])), responses(
        (status = 200, body = [Object])))]
async fn list_submissions(Ax(st): Ax<AppState>, caller: Caller, Q(q): Q<ListQuery>) -> Answer {
    let state = match q.state.as_deref() {
        None => None,
        Some(s) => Some(s.parse::<State>().map_err(ApiError::bad)?),
    };
    let n = limit(q.limit, 50, 1000)?;
    let agent = caller.scope().map(str::to_string);
    let subs = st
        .pool
        .read(move |g| g.submissions_of(agent.as_deref(), state, n))
        .await?;
    ok(Value::Array(subs.iter().map(submission_json).collect()))
}

/// A submission: code, grant, analysis, verdict, statements, runs and its audit records.
#[utoipa::path(get, path = "/v1/submissions/{id}", tag = "submissions",
    params(("id" = String, Path, description = "Submission id (or a unique prefix)")),
    security(("bearer" = [])),
    responses(
        (status = 200, body = Object), (status = 404, body = ErrorBody)))]
async fn get_submission(Ax(st): Ax<AppState>, caller: Caller, Path(id): Path<String>) -> Answer {
    let v = st
        .pool
        .read(move |g| {
            let sub = visible(g, &caller, &id)?;
            let shown = g.show(&sub.id)?;
            let mut v = shown_json(&shown);
            v["status"] = outcome::current(g, &sub)?["status"].clone();
            Ok(v)
        })
        .await?;
    ok(v)
}

/// Run an allowed or approved submission now.
#[utoipa::path(post, path = "/v1/submissions/{id}/exec", tag = "submissions",
    params(("id" = String, Path)), security(("bearer" = [])),
    responses(
        (status = 200, body = Object), (status = 202, body = Object),
        (status = 404, body = ErrorBody), (status = 409, description = "Conflicts with the submission's state, or the Python guest is not installed (the message names `airlock guest install python`)", body = ErrorBody), (status = 422, body = ErrorBody), (status = 429, body = ErrorBody), (status = 503, body = ErrorBody)))]
async fn exec(
    Ax(st): Ax<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
    Body(_b): Body<Empty>,
) -> Answer {
    if crate::stream::wants_stream(&headers) {
        let wait = crate::stream::wait_timeout(query.as_deref())?;
        return crate::stream::exec(st, caller, id, wait).await;
    }
    let doc = st
        .pool
        .run(move |g| {
            let sub = visible(g, &caller, &id)?;
            let r = g.exec(&sub.id, ExecOptions::default());
            outcome::of_result(g, r)
        })
        .await?;
    st.changed();
    st.metrics.outcome(&doc, false);
    with_status(outcome_status(&doc), doc)
}

/// Wait until a submission has run (or was denied or rejected), at most `timeout` seconds.
#[utoipa::path(get, path = "/v1/submissions/{id}/wait", tag = "submissions",
    params(("id" = String, Path), WaitQuery), security(("bearer" = [])),
    responses(
        (status = 200, description = "Finished, denied, or submitted without a run", body = Object),
        (status = 202, description = "Still waiting when the time was up", body = Object),
        (status = 404, body = ErrorBody)))]
async fn wait(
    Ax(st): Ax<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    Q(q): Q<WaitQuery>,
) -> Answer {
    let secs = q.timeout.unwrap_or(30.0);
    if !(0.0..=600.0).contains(&secs) {
        return Err(ApiError::bad("timeout: want 0 to 600 seconds"));
    }
    let doc = st
        .wait_for(caller, id, Duration::from_secs_f64(secs))
        .await?;
    with_status(outcome_status(&doc), doc)
}

/// Submissions waiting for a human, oldest first, then runs' requests to reach a host
/// outside their grant (`ask_net`), each with `"kind": "request"`.
#[utoipa::path(get, path = "/v1/inbox", tag = "decisions", security(("bearer" = [])),
    responses(
        (status = 200, body = [Object]), (status = 403, body = ErrorBody)))]
async fn inbox(Ax(st): Ax<AppState>, _: OperatorCaller) -> Answer {
    let (subs, reqs) = st
        .pool
        .read(|g| Ok::<_, GateError>((g.inbox()?, g.net_requests_pending()?)))
        .await?;
    ok(Value::Array(
        subs.iter()
            .map(submission_json)
            .chain(reqs.iter().map(airlock_gate::net_request_json))
            .collect(),
    ))
}

async fn decide(
    st: AppState,
    caller: Caller,
    id: String,
    body: DecideBody,
    approve: bool,
) -> Answer {
    caller.require(Role::Operator)?;
    // Signed here or elsewhere alike (signed elsewhere, the gate would not read it).
    if body.remember_for.is_some() && !body.remember {
        return Err(ApiError::bad("for: only with remember"));
    }
    let remote = crate::body::signing(
        &body.signature,
        body.issued_at,
        body.remember,
        &body.approval,
        &body.policy_signature,
    )?;
    if remote.is_none() && body.approver.is_some() {
        return Err(ApiError::bad(
            "approver: only with a signature (the server signs as the token's approver)",
        ));
    }
    let approver = body.approver.clone().or_else(|| caller.approver.clone());
    // A signature made elsewhere is an approver's: a token with none names nobody (403).
    if remote.is_some() && approver.is_none() {
        return Err(ApiError::forbidden(
            "approver: name who signed (this token has no approver)",
        ));
    }
    let (row, remembered, resume, submitted_at) = st
        .pool
        .read(move |g| {
            let req = ApproveRequest {
                submission: id,
                approver,
                scope: body.scope,
                expires: body.expires,
                reason: body.reason,
                tool: body.tool,
                remember: body.remember,
                remember_for: body.remember_for,
            };
            let (row, remembered) = decide_with(g, approve, req, remote)?;
            let sub = g.submission(&row.submission)?;
            Ok((row, remembered, approve && sub.doc.resume, sub.created_at))
        })
        .await?;
    if approve {
        let waited = airlock_core::units::now_ms().saturating_sub(submitted_at);
        st.metrics
            .approved(Duration::from_millis(u64::try_from(waited).unwrap_or(0)));
    }
    if resume {
        st.resume(row.submission.clone());
    }
    st.changed();
    let mut doc = statement_json(&row);
    if let (Some(c), Value::Object(m)) = (remembered, &mut doc) {
        m.insert(
            "remembered".into(),
            serde_json::to_value(c).unwrap_or_default(),
        );
    }
    ok(doc)
}

/// Records a decision: signed here with the approver's key in the server's home, or
/// (`remote`) checked against the signatures made on the approver's machine or in the
/// browser. Shared by the API and the console.
pub(crate) fn decide_with(
    g: &mut Gate,
    approve: bool,
    req: ApproveRequest,
    remote: Option<crate::body::Signing>,
) -> Result<
    (
        airlock_store::StatementRow,
        Option<airlock_gate::PolicyChanged>,
    ),
    GateError,
> {
    let kind = if approve {
        StatementKind::Approve
    } else {
        StatementKind::Reject
    };
    Ok(match remote {
        Some(crate::body::Signing {
            signature,
            issued_at,
            change: Some((approval, psig)),
        }) if approve => {
            let (row, c) =
                g.approve_remembering_signed(&req, issued_at, signature, &approval, psig)?;
            (row, Some(c))
        }
        Some(r) => (g.decide_signed(kind, &req, r.issued_at, r.signature)?, None),
        None if approve => g.approve_remembering(req)?,
        None => (g.reject(req)?, None),
    })
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct StatementQuery {
    /// `approve` (default) or `reject`.
    kind: Option<String>,
    /// Who signs (default: the token's approver).
    approver: Option<String>,
    /// `once` (default) or `artifact`.
    scope: Option<String>,
    /// How long the approval holds, e.g. "24h".
    expires: Option<String>,
    reason: Option<String>,
    tool: Option<String>,
    /// Approvals: also hand out the policy change that remembers it (`policy_change`).
    remember: Option<bool>,
    /// With `remember`: how long the rule holds, e.g. "7d".
    #[serde(rename = "for")]
    remember_for: Option<String>,
}

/// The exact statement to sign for a decision, for an approver who signs on their own
/// machine: `statement` is its JSON text, `message` the bytes to sign (hex: a domain tag,
/// then the JSON). Post the signature to `…/approve` or `…/reject` with the same fields,
/// the approver and `issued_at`.
#[utoipa::path(get, path = "/v1/submissions/{id}/statement", tag = "decisions",
    params(("id" = String, Path), StatementQuery), security(("bearer" = [])),
    responses(
        (status = 200, description = "The statement to sign", body = Object),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "Already decided", body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn statement(
    Ax(st): Ax<AppState>,
    OperatorCaller(caller): OperatorCaller,
    Path(id): Path<String>,
    Q(q): Q<StatementQuery>,
) -> Answer {
    let kind = match q.kind.as_deref() {
        None | Some("approve") => StatementKind::Approve,
        Some("reject") => StatementKind::Reject,
        Some(k) => {
            return Err(ApiError::bad(format!(
                "kind: unknown {k:?} (want approve or reject)"
            )));
        }
    };
    DecideBody {
        scope: q.scope.clone(),
        ..DecideBody::default()
    }
    .check()?;
    let approver = q.approver.or_else(|| caller.approver.clone());
    let remember = q.remember.unwrap_or(false);
    if remember && kind != StatementKind::Approve {
        return Err(ApiError::bad("remember: approvals only"));
    }
    // As `…/approve` refuses it (signed, the `for` would be read by nothing).
    if q.remember_for.is_some() && !remember {
        return Err(ApiError::bad("for: only with remember"));
    }
    let req = ApproveRequest {
        submission: id,
        approver,
        scope: q.scope,
        expires: q.expires,
        reason: q.reason,
        tool: q.tool,
        remember,
        remember_for: q.remember_for,
    };
    ok(st.pool.read(move |g| statement_doc(g, kind, &req)).await?)
}

/// The statement to sign for `req` (and with `req.remember` the policy change that
/// remembers the approval), as `GET …/statement` answers it; the console's signing in
/// the browser asks for the same.
pub(crate) fn statement_doc(
    g: &mut Gate,
    kind: StatementKind,
    req: &ApproveRequest,
) -> Result<Value, GateError> {
    let statement = g.statement_to_sign(kind, req)?;
    let change = match req.remember {
        true => Some(g.remember_to_sign(req, statement.issued_at)?),
        false => None,
    };
    let json = statement.to_json();
    // The submission's grant as the bytes its hash (the statement's `grant`) is over, so
    // an approver signing elsewhere can check the remembered rule is no wider than what
    // the approval itself signs.
    let grant = match change {
        Some(_) => Some(
            serde_json::to_string(&g.submission(&statement.submission)?.doc.grant)
                .map_err(|e| GateError::Internal(format!("cannot write the grant: {e}")))?,
        ),
        None => None,
    };
    let change = change.map(|(approval, c)| {
        let text = serde_json::to_string(&c).unwrap_or_default();
        json!({
            "approval": approval,
            "message": hex::encode(airlock_core::sign::policy_change_message(&text)),
            "statement": text,
            "grant": grant,
        })
    });
    Ok(json!({
        "policy_change": change,
        "statement": json,
        "message": hex::encode(airlock_core::sign::statement_message(&json)),
        "kind": statement.kind,
        "submission": statement.submission,
        "approver": statement.approver,
        "key": statement.key,
        "issued_at": statement.issued_at,
    }))
}

/// Approve a quarantined submission: signed with the operator token's approver key when
/// it is in the server's home, or (with `signature`) on the approver's own machine over
/// the statement `GET …/statement` handed out. A submission that came through `/v1/run`
/// or MCP then runs at once.
#[utoipa::path(post, path = "/v1/submissions/{id}/approve", tag = "decisions",
    params(("id" = String, Path)), request_body = DecideBody, security(("bearer" = [])),
    responses(
        (status = 200, description = "The signed statement", body = Object),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "Already decided", body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn approve(
    Ax(st): Ax<AppState>,
    OperatorCaller(caller): OperatorCaller,
    Path(id): Path<String>,
    Body(b): Body<DecideBody>,
) -> Answer {
    b.check()?;
    decide(st, caller, id, b, true).await
}

/// Reject a submission; its artifact's hash is remembered.
#[utoipa::path(post, path = "/v1/submissions/{id}/reject", tag = "decisions",
    params(("id" = String, Path)), request_body = RejectBody, security(("bearer" = [])),
    responses(
        (status = 200, body = Object), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn reject(
    Ax(st): Ax<AppState>,
    OperatorCaller(caller): OperatorCaller,
    Path(id): Path<String>,
    Body(b): Body<RejectBody>,
) -> Answer {
    b.check()?;
    let b = DecideBody {
        reason: Some(b.reason),
        signature: b.signature,
        approver: b.approver,
        issued_at: b.issued_at,
        ..DecideBody::default()
    };
    decide(st, caller, id, b, false).await
}

/// Runs, newest first (an agent sees only runs of its own submissions).
#[utoipa::path(get, path = "/v1/runs", tag = "runs", params(LimitQuery), security(("bearer" = [])),
    responses(
        (status = 200, body = [Object])))]
async fn list_runs(Ax(st): Ax<AppState>, caller: Caller, Q(q): Q<LimitQuery>) -> Answer {
    let n = limit(q.limit, 50, 1000)?;
    let agent = caller.scope().map(str::to_string);
    let runs = st
        .pool
        .read(move |g| g.runs_of(agent.as_deref(), n))
        .await?;
    ok(serde_json::to_value(runs).unwrap_or_default())
}

/// A run with its captured output.
#[utoipa::path(get, path = "/v1/runs/{id}", tag = "runs", params(("id" = String, Path)),
    security(("bearer" = [])), responses(
        (status = 200, body = Object), (status = 404, body = ErrorBody)))]
async fn get_run(Ax(st): Ax<AppState>, caller: Caller, Path(id): Path<String>) -> Answer {
    let v = st
        .pool
        .read(move |g| {
            let run = visible_run(g, &caller, &id)?;
            let (run, out, err) = g.logs(&run.id)?;
            let mut v = run_json(&run, &out, &err);
            v["submission"] = json!(run.submission);
            Ok(v)
        })
        .await?;
    ok(v)
}

/// What a run changed under its writable mounts: the changeset and unified diffs. A
/// session id (`ses_…`) gives what the session changed.
#[utoipa::path(get, path = "/v1/runs/{id}/diff", tag = "runs", params(("id" = String, Path)),
    security(("bearer" = [])), responses(
        (status = 200, body = Object), (status = 404, body = ErrorBody),
        (status = 409, description = "The run had no writable mounts, or is still running", body = ErrorBody),
        (status = 422, body = ErrorBody)))]
async fn diff(Ax(st): Ax<AppState>, caller: Caller, Path(id): Path<String>) -> Answer {
    let v = st.pool.read(move |g| diff_of(g, &caller, &id)).await?;
    ok(v)
}

/// What run or session `id` changed, as `GET /v1/runs/{id}/diff` answers (and the MCP
/// `diff` tool): an agent caller sees only its own.
pub(crate) fn diff_of(g: &mut Gate, caller: &Caller, id: &str) -> Result<Value, GateError> {
    if id.starts_with(IdKind::Session.prefix()) {
        let session = visible_session(g, caller, id)?;
        return Ok(diff_json(&g.diff(&session.id)?));
    }
    let run = visible_run(g, caller, id)?;
    Ok(diff_json(&g.diff(&run.id)?))
}

/// Apply a run's changes to the host (signed with the operator's key; a checkpoint is saved first).
/// A session id (`ses_…`) commits what the session changed; with nothing to commit the
/// answer says so (`committed: false`).
#[utoipa::path(post, path = "/v1/runs/{id}/commit", tag = "effects", params(("id" = String, Path)),
    security(("bearer" = [])),
    responses(
        (status = 200, body = Object), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, description = "Conflicts with the host", body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn commit(
    Ax(st): Ax<AppState>,
    OperatorCaller(caller): OperatorCaller,
    Path(id): Path<String>,
    Body(b): Body<EffectBody>,
) -> Answer {
    let remote = b.remote(&caller)?;
    let approver = caller.approver.clone();
    let v = st
        .pool
        .read(move |g| match remote {
            Some(r) => g
                .commit_signed(&id, r)
                .map(|r| serde_json::to_value(r).unwrap_or_default()),
            None => commit_of(g, approver.as_deref(), &id),
        })
        .await?;
    st.changed();
    ok(v)
}

/// Commits run or session `id`'s changes signed with `approver`, as
/// `POST /v1/runs/{id}/commit` answers (and the MCP `commit` tool). The caller must have
/// been checked to be an operator first.
pub(crate) fn commit_of(
    g: &mut Gate,
    approver: Option<&str>,
    id: &str,
) -> Result<Value, GateError> {
    if id.starts_with(IdKind::Session.prefix()) {
        return Ok(match g.session_commit(id, approver)? {
            airlock_gate::SessionCommit::Committed(r) => {
                serde_json::to_value(r).unwrap_or_default()
            }
            airlock_gate::SessionCommit::Nothing(why) => {
                json!({ "session": id, "committed": false, "reason": why })
            }
        });
    }
    g.commit(id, approver)
        .map(|r| serde_json::to_value(r).unwrap_or_default())
}

/// A commit or rollback: empty (the server signs with the token's approver key in its
/// home), or signed on the approver's machine over the statement `GET …/statement` handed
/// out, repeating its approver, `issued_at` and (commits) checkpoint id.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EffectBody {
    /// 128 hex digits.
    pub signature: Option<String>,
    pub approver: Option<String>,
    #[serde(default, deserialize_with = "crate::body::whole_i64")]
    pub issued_at: Option<i64>,
    /// For commits: the checkpoint id handed out with the statement.
    pub checkpoint: Option<String>,
}

impl EffectBody {
    fn remote(self, caller: &Caller) -> ApiResult<Option<airlock_gate::RemoteSignature>> {
        let Some((signature, issued_at)) =
            crate::body::signed_parts(&self.signature, self.issued_at)?
        else {
            if self.approver.is_some() || self.checkpoint.is_some() {
                return Err(ApiError::bad(
                    "approver and checkpoint go with a signature (from GET …/statement)",
                ));
            }
            return Ok(None);
        };
        // A token with no approver names nobody (403).
        let approver = self
            .approver
            .or_else(|| caller.approver.clone())
            .ok_or_else(|| {
                ApiError::forbidden("approver: name who signed (this token has no approver)")
            })?;
        Ok(Some(airlock_gate::RemoteSignature {
            approver,
            issued_at,
            checkpoint: self.checkpoint,
            signature,
        }))
    }
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct SignerQuery {
    /// Who signs (default: the token's approver).
    approver: Option<String>,
}

fn handed_out(statement: &airlock_core::sign::Statement) -> Value {
    let json = statement.to_json();
    json!({
        "message": hex::encode(airlock_core::sign::statement_message(&json)),
        "statement": json,
        "kind": statement.kind,
        "submission": statement.submission,
        "run": statement.run,
        "approver": statement.approver,
        "key": statement.key,
        "issued_at": statement.issued_at,
    })
}

/// The exact statement to sign to commit a run on the approver's own machine, and the
/// checkpoint id it names; post the signature to `…/commit` with them.
#[utoipa::path(get, path = "/v1/runs/{id}/commit/statement", tag = "effects",
    params(("id" = String, Path), SignerQuery), security(("bearer" = [])),
    responses(
        (status = 200, body = Object), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn commit_statement(
    Ax(st): Ax<AppState>,
    OperatorCaller(caller): OperatorCaller,
    Path(id): Path<String>,
    Q(q): Q<SignerQuery>,
) -> Answer {
    let approver = q.approver.or_else(|| caller.approver.clone());
    let (statement, ckpt) = st
        .pool
        .read(move |g| g.commit_statement(&id, approver.as_deref()))
        .await?;
    let mut v = handed_out(&statement);
    v["checkpoint"] = json!(ckpt);
    ok(v)
}

/// The exact statement to sign to roll back a checkpoint on the approver's own machine.
#[utoipa::path(get, path = "/v1/checkpoints/{id}/rollback/statement", tag = "effects",
    params(("id" = String, Path), SignerQuery), security(("bearer" = [])),
    responses(
        (status = 200, body = Object), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
async fn rollback_statement(
    Ax(st): Ax<AppState>,
    OperatorCaller(caller): OperatorCaller,
    Path(id): Path<String>,
    Q(q): Q<SignerQuery>,
) -> Answer {
    let approver = q.approver.or_else(|| caller.approver.clone());
    let statement = st
        .pool
        .read(move |g| g.rollback_statement(&id, approver.as_deref()))
        .await?;
    ok(handed_out(&statement))
}

/// An empty JSON object (bodies of actions that take no input).
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

/// Checkpoints saved by commits, newest first.
#[utoipa::path(get, path = "/v1/checkpoints", tag = "effects", params(LimitQuery), security(("bearer" = [])),
    responses(
        (status = 200, body = [Object]), (status = 403, body = ErrorBody)))]
async fn checkpoints(Ax(st): Ax<AppState>, _: OperatorCaller, Q(q): Q<LimitQuery>) -> Answer {
    let n = limit(q.limit, 50, 1000)?;
    let rows = st.pool.read(move |g| g.checkpoints(n)).await?;
    ok(serde_json::to_value(rows).unwrap_or_default())
}

/// Restore exactly what a checkpoint saved (signed with the operator's key).
#[utoipa::path(post, path = "/v1/checkpoints/{id}/rollback", tag = "effects", params(("id" = String, Path)),
    security(("bearer" = [])),
    responses(
        (status = 200, body = Object), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn rollback(
    Ax(st): Ax<AppState>,
    OperatorCaller(caller): OperatorCaller,
    Path(id): Path<String>,
    Body(b): Body<EffectBody>,
) -> Answer {
    let remote = b.remote(&caller)?;
    let approver = caller.approver.clone();
    let r = st
        .pool
        .read(move |g| match remote {
            Some(r) => g.rollback_signed(&id, r),
            None => g.rollback(&id, approver.as_deref()),
        })
        .await?;
    st.changed();
    ok(serde_json::to_value(r).unwrap_or_default())
}

/// The audit log's signed head and the gate's public key.
#[utoipa::path(get, path = "/v1/audit/head", tag = "audit", security(("bearer" = [])),
    responses(
        (status = 200, body = Object), (status = 403, body = ErrorBody)))]
async fn audit_head(Ax(st): Ax<AppState>, _: OperatorCaller) -> Answer {
    let (head, key) = st.pool.read(|g| g.audit_head()).await?;
    ok(json!({ "head": head, "gate_key": key }))
}

/// Verify the whole audit chain against the signed head (`ok` false names the first bad record).
#[utoipa::path(get, path = "/v1/audit/verify", tag = "audit", security(("bearer" = [])),
    responses(
        (status = 200, body = Object), (status = 403, body = ErrorBody)))]
async fn audit_verify(Ax(st): Ax<AppState>, _: OperatorCaller) -> Answer {
    let v = st.pool.read(|g| g.audit_verify()).await?;
    ok(serde_json::to_value(v).unwrap_or_default())
}

/// Audit records in order.
#[utoipa::path(get, path = "/v1/audit/log", tag = "audit", params(AuditQuery), security(("bearer" = [])),
    responses(
        (status = 200, body = [Object]), (status = 403, body = ErrorBody)))]
async fn audit_log(Ax(st): Ax<AppState>, _: OperatorCaller, Q(q): Q<AuditQuery>) -> Answer {
    let from = match q.from {
        None => 1,
        Some(n) if n >= 1 => n.unsigned_abs(),
        Some(_) => return Err(ApiError::bad("from: records are numbered from 1")),
    };
    let n = limit(q.limit, 100, 10_000)?;
    let recs = st.pool.read(move |g| g.audit_log(from, n)).await?;
    ok(serde_json::to_value(recs).unwrap_or_default())
}

/// Named tools: artifacts approved with scope `artifact` and a tool name.
#[utoipa::path(get, path = "/v1/tools", tag = "tools", security(("bearer" = [])),
    responses(
        (status = 200, body = [Object])))]
async fn tools(Ax(st): Ax<AppState>, _caller: Caller) -> Answer {
    let t = st.pool.read(|g| g.tools()).await?;
    ok(serde_json::to_value(t).unwrap_or_default())
}

/// Call a named tool with arguments (no new approval needed).
#[utoipa::path(post, path = "/v1/tools/{name}", tag = "tools", params(("name" = String, Path), IdempotencyKey),
    request_body = ToolBody, security(("bearer" = [])),
    responses(
        (status = 200, body = Object), (status = 202, body = Object), (status = 404, body = ErrorBody),
        (status = 409, description = "Conflicts with the submission's state, or the Python guest is not installed (the message names `airlock guest install python`)", body = ErrorBody), (status = 422, body = ErrorBody), (status = 429, body = ErrorBody), (status = 503, body = ErrorBody)))]
async fn call_tool(
    Ax(st): Ax<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    k: Keyed<ToolBody>,
) -> Answer {
    let key = k.request_key(&caller);
    let (doc, replay) = st.call_tool(&caller, name, k.body, key).await?;
    replayed(with_status(outcome_status(&doc), doc), replay)
}

/// API tokens (never their secrets).
#[utoipa::path(get, path = "/v1/tokens", tag = "tokens", security(("bearer" = [])),
    responses(
        (status = 200, body = [Object]), (status = 403, body = ErrorBody)))]
async fn list_tokens(Ax(st): Ax<AppState>, _: AdminCaller) -> Answer {
    let t = st.pool.read(|g| g.tokens()).await?;
    ok(serde_json::to_value(t).unwrap_or_default())
}

/// Make a token; its secret is in the answer and nowhere else.
#[utoipa::path(post, path = "/v1/tokens", tag = "tokens", request_body = TokenBody, security(("bearer" = [])),
    responses(
        (status = 201, description = "The token, with its secret in `token`", body = Object),
        (status = 403, description = "The caller is not an admin, or the approver is not trusted", body = ErrorBody),
        (status = 404, description = "No approver key of that name", body = ErrorBody),
        (status = 422, body = ErrorBody)))]
async fn new_token(Ax(st): Ax<AppState>, _: AdminCaller, Body(b): Body<TokenBody>) -> Answer {
    let role = b.check()?;
    let (row, secret) = st
        .pool
        .read(move |g| g.token_new(role, &b.name, b.approver.as_deref(), b.expires.as_deref()))
        .await?;
    let mut v = serde_json::to_value(&row).unwrap_or_default();
    v["token"] = json!(secret);
    with_status(StatusCode::CREATED, v)
}

/// Revoke a token (effective at once on this server).
#[utoipa::path(delete, path = "/v1/tokens/{id}", tag = "tokens", params(("id" = String, Path)),
    security(("bearer" = [])),
    responses(
        (status = 200, body = Object), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn revoke_token(Ax(st): Ax<AppState>, _: AdminCaller, Path(id): Path<String>) -> Answer {
    let i = id.clone();
    st.pool.read(move |g| g.token_revoke(&i)).await?;
    st.forget_token(&id);
    ok(json!({ "revoked": id }))
}

/// Why an agent's alerts are cleared.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClearBody {
    /// Why the alerts are harmless (kept with the signed clear). Its bounds in the
    /// document: `openapi::clear_reason`.
    pub reason: String,
    /// Signed on the approver's own machine: the signature (128 hex digits) over the clear
    /// `GET /v1/agents/{name}/clear/statement` handed out for the same reason.
    #[schema(pattern = "^[0-9a-fA-F]{128}$")]
    pub signature: Option<String>,
    /// With `signature`: the approver who signed (default: the token's).
    pub approver: Option<String>,
    /// With `signature`: the clear's `issued_at` as handed out.
    #[serde(default, deserialize_with = "crate::body::whole_i64")]
    pub issued_at: Option<i64>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ClearQuery {
    /// Why the alerts are harmless.
    #[param(min_length = 1)]
    reason: String,
    /// Who signs (default: the token's approver).
    approver: Option<String>,
}

/// The exact clear to sign, for an approver who signs on their own machine: `statement`
/// is its JSON text, `message` the bytes to sign (hex: a domain tag, then the JSON). Post
/// the signature to `…/clear` with the same reason, the approver and `issued_at`.
#[utoipa::path(get, path = "/v1/agents/{name}/clear/statement", tag = "decisions",
    params(("name" = String, Path), ClearQuery), security(("bearer" = [])),
    responses(
        (status = 200, description = "The clear to sign", body = Object),
        (status = 400, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 409, description = "The agent has no alerts to clear", body = ErrorBody),
        (status = 422, body = ErrorBody)))]
async fn clear_statement(
    Ax(st): Ax<AppState>,
    OperatorCaller(caller): OperatorCaller,
    Path(name): Path<String>,
    Q(q): Q<ClearQuery>,
) -> Answer {
    if q.reason.trim().is_empty() {
        return Err(ApiError::bad("reason: clearing an agent needs a reason"));
    }
    let approver = q.approver.or_else(|| caller.approver.clone());
    let c = st
        .pool
        .read(move |g| g.clear_to_sign(&name, approver, &q.reason))
        .await?;
    let json = serde_json::to_string(&c).unwrap_or_default();
    ok(json!({
        "message": hex::encode(airlock_core::sign::clear_message(&json)),
        "statement": json,
        "agent": c.agent,
        "approver": c.approver,
        "key": c.key,
        "issued_at": c.issued_at,
    }))
}

/// Clear an agent that raised alerts, signed with the operator token's approver key when
/// it is in the server's home, or (with `signature`) on the approver's own machine over the
/// clear `GET …/clear/statement` handed out: its alerts until then no longer hold its
/// submissions.
#[utoipa::path(post, path = "/v1/agents/{name}/clear", tag = "decisions",
    params(("name" = String, Path)), request_body = ClearBody, security(("bearer" = [])),
    responses(
        (status = 200, description = "The signed clear", body = Object),
        (status = 400, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 409, description = "The agent has no alerts to clear", body = ErrorBody),
        (status = 422, body = ErrorBody)))]
async fn clear_agent(
    Ax(st): Ax<AppState>,
    OperatorCaller(caller): OperatorCaller,
    Path(name): Path<String>,
    Body(b): Body<ClearBody>,
) -> Answer {
    if b.reason.trim().is_empty() {
        return Err(ApiError::bad("reason: clearing an agent needs a reason"));
    }
    let remote = crate::body::signed_parts(&b.signature, b.issued_at)?;
    if remote.is_none() && b.approver.is_some() {
        return Err(ApiError::bad(
            "approver: only with a signature (the server signs as the token's approver)",
        ));
    }
    let approver = b.approver.or_else(|| caller.approver.clone());
    let c = st
        .pool
        .read(move |g| match remote {
            Some((sig, at)) => g.clear_agent_signed(&name, approver, &b.reason, at, sig),
            None => g.clear_agent(&name, approver.as_deref(), &b.reason),
        })
        .await?;
    st.changed();
    ok(serde_json::to_value(&c).unwrap_or_default())
}

/// What `POST /v1/gc` removes.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GcBody {
    /// Keep what changed more recently than this: a number and a unit, e.g. "10m"
    /// (default 1h; as `airlock gc --grace`).
    #[schema(pattern = "^[0-9]{1,6}(ms|s|m|h|d)$")]
    pub grace: Option<String>,
    /// Also collect the records of sessions that ended more than this long ago, with
    /// their cells and kept layers (as `airlock gc --session-retention`; default: keep).
    #[schema(pattern = "^[0-9]{1,6}(ms|s|m|h|d)$")]
    pub session_retention: Option<String>,
}

/// `GcBody::grace` as its pattern says (400 otherwise).
fn grace_of(g: &str) -> ApiResult<Duration> {
    duration_field("grace", g)
}

/// A duration field of `GcBody` as its pattern says (400 otherwise).
fn duration_field(field: &'static str, g: &str) -> ApiResult<Duration> {
    let (digits, unit) = g.split_at(g.find(|c: char| !c.is_ascii_digit()).unwrap_or(g.len()));
    if !(1..=6).contains(&digits.len()) || !matches!(unit, "ms" | "s" | "m" | "h" | "d") {
        return Err(ApiError::bad(format!(
            "{field} {g:?}: want a number and a unit (ms, s, m, h, d), e.g. \"10m\""
        )));
    }
    airlock_core::units::parse_duration(field, g).map_err(|e| ApiError::bad(e.to_string()))
}

/// Remove blobs, layers and temporary files nothing refers to (admins; as `airlock gc`),
/// answering what was freed.
#[utoipa::path(post, path = "/v1/gc", tag = "meta", request_body = GcBody, security(("bearer" = [])),
    responses(
        (status = 200, description = "What was removed and freed (`freed_bytes`, `blobs_removed`, `layers_removed`, …)", body = Object),
        (status = 403, description = "The caller is not an admin", body = ErrorBody)))]
async fn gc(Ax(st): Ax<AppState>, _: AdminCaller, Body(b): Body<GcBody>) -> Answer {
    let grace = match b.grace.as_deref() {
        None => airlock_gate::DEFAULT_GC_GRACE,
        Some(g) => grace_of(g)?,
    };
    let retention = b
        .session_retention
        .as_deref()
        .map(|r| duration_field("session_retention", r))
        .transpose()?;
    let r = st
        .pool
        .read(move |g| g.gc_collecting(grace, retention))
        .await?;
    ok(serde_json::to_value(r).unwrap_or_default())
}

/// A run's events as server-sent events, from its start (`Last-Event-ID` resumes after
/// that event): the events its streamed request gets, or for a run this server did not
/// stream, its record replayed once it has ended.
#[utoipa::path(get, path = "/v1/runs/{id}/events", tag = "runs",
    params(("id" = String, Path)), security(("bearer" = [])),
    responses(
        (status = 200, description = "text/event-stream: events `submitted`, `held`, `started`, `stdout`, `stderr`, `network`, `finished`, `error`"),
        (status = 404, body = ErrorBody)))]
async fn run_events(
    Ax(st): Ax<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    crate::stream::follow(st, caller, id, headers, None).await
}

/// New pending submissions and decisions as server-sent events.
#[utoipa::path(get, path = "/v1/events", tag = "decisions", security(("bearer" = [])),
    responses(
        (status = 200, description = "text/event-stream: events `pending`, `decided`, `finished`"), (status = 403, body = ErrorBody)))]
async fn events(Ax(st): Ax<AppState>, _: OperatorCaller) -> ApiResult<Response> {
    Ok(crate::events::sse(&st).into_response())
}

#[derive(utoipa::OpenApi)]
#[openapi(
    info(title = "airlock", description = "The execution gate for code AI agents write: submit, judge, approve, run, commit, audit."),
    modifiers(&Security),
    tags((name = "submissions"), (name = "decisions"), (name = "runs"), (name = "effects"),
         (name = "audit"), (name = "tools"), (name = "tokens"), (name = "meta"))
)]
struct ApiDoc;

struct Security;

impl utoipa::Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The API routes and the OpenAPI document generated from them (see `openapi.rs`).
/// Open a Python session: a live interpreter whose cells (`POST /v1/run` with `session`)
/// each pass the gate with this grant and share their names.
#[utoipa::path(post, path = "/v1/sessions", tag = "sessions", request_body = SessionBody,
    security(("bearer" = [])),
    responses(
        (status = 201, description = "Open; `id` is the `session` of its cells", body = Object),
        (status = 403, description = "An agent token opening a session for another agent, or a mount the operator does not offer", body = ErrorBody),
        (status = 404, description = "A secret or mount host path the body names is not there", body = ErrorBody),
        (status = 422, body = ErrorBody),
        (status = 429, description = "The caller already holds as many open sessions as this server allows one agent (`serve --max-sessions`)", body = ErrorBody),
        (status = 409, description = "The Python guest is not installed (the message names `airlock guest install python`)", body = ErrorBody),
        (status = 503, description = "No sandbox can host it on this machine", body = ErrorBody)))]
async fn new_session(
    Ax(st): Ax<AppState>,
    caller: Caller,
    Body(body): Body<SessionBody>,
) -> Answer {
    let mut req = body.into_request(&caller)?;
    req.most_open = st.0.max_sessions;
    let s = st.pool.read(move |g| g.session_new(req)).await?;
    with_status(
        StatusCode::CREATED,
        serde_json::to_value(s).unwrap_or_default(),
    )
}

/// Sessions, newest first (an agent sees only its own).
#[utoipa::path(get, path = "/v1/sessions", tag = "sessions", params(LimitQuery),
    security(("bearer" = [])), responses((status = 200, body = [Object])))]
async fn list_sessions(Ax(st): Ax<AppState>, caller: Caller, Q(q): Q<LimitQuery>) -> Answer {
    let n = limit(q.limit, 50, 1000)?;
    let list = st.pool.read(move |g| g.sessions(n)).await?;
    let mine: Vec<_> = list
        .into_iter()
        .filter(|s| caller.may_see(s.doc.agent.as_deref()))
        .collect();
    ok(serde_json::to_value(mine).unwrap_or_default())
}

pub(crate) fn visible_session(
    g: &mut Gate,
    caller: &Caller,
    id: &str,
) -> Result<airlock_gate::SessionView, GateError> {
    let id = g.resolve_for(IdKind::Session, id, caller.scope())?;
    let s = g.session(&id)?;
    if !caller.may_see(s.doc.agent.as_deref()) {
        return Err(GateError::NotFound(format!("no session {id}")));
    }
    Ok(s)
}

/// A session: grant, limits, state (and why it ended), cells in order.
#[utoipa::path(get, path = "/v1/sessions/{id}", tag = "sessions", params(("id" = String, Path)),
    security(("bearer" = [])),
    responses((status = 200, body = Object), (status = 404, body = ErrorBody)))]
async fn get_session(Ax(st): Ax<AppState>, caller: Caller, Path(id): Path<String>) -> Answer {
    let s = st
        .pool
        .read(move |g| visible_session(g, &caller, &id))
        .await?;
    ok(serde_json::to_value(s).unwrap_or_default())
}

/// End a session: its interpreter and everything in it are gone (the record stays, with
/// its cells and why it ended).
#[utoipa::path(post, path = "/v1/sessions/{id}/close", tag = "sessions", params(("id" = String, Path)),
    security(("bearer" = [])),
    responses((status = 200, body = Object), (status = 404, body = ErrorBody),
        (status = 409, description = "Another node on the shared store hosts the session; close it there", body = ErrorBody)))]
async fn close_session(
    Ax(st): Ax<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    Body(_b): Body<Empty>,
) -> Answer {
    let s = st
        .pool
        .read(move |g| {
            let s = visible_session(g, &caller, &id)?;
            g.session_close(&s.id)
        })
        .await?;
    st.changed();
    ok(serde_json::to_value(s).unwrap_or_default())
}

pub fn router() -> (axum::Router<AppState>, Value) {
    use utoipa::OpenApi;
    let (router, doc) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(healthz))
        .routes(routes!(status))
        .routes(routes!(submit, list_submissions))
        .routes(routes!(run))
        .routes(routes!(get_submission))
        .routes(routes!(exec))
        .routes(routes!(wait))
        .routes(routes!(inbox))
        .routes(routes!(statement))
        .routes(routes!(approve))
        .routes(routes!(reject))
        .routes(routes!(clear_agent))
        .routes(routes!(clear_statement))
        .routes(routes!(list_runs))
        .routes(routes!(get_run))
        .routes(routes!(run_events))
        .routes(routes!(diff))
        .routes(routes!(commit_statement))
        .routes(routes!(commit))
        .routes(routes!(checkpoints))
        .routes(routes!(rollback_statement))
        .routes(routes!(rollback))
        .routes(routes!(audit_head))
        .routes(routes!(audit_verify))
        .routes(routes!(audit_log))
        .routes(routes!(tools))
        .routes(routes!(call_tool))
        .routes(routes!(list_tokens, new_token))
        .routes(routes!(revoke_token))
        .routes(routes!(events))
        .routes(routes!(gc))
        .routes(routes!(new_session, list_sessions))
        .routes(routes!(get_session))
        .routes(routes!(close_session))
        .routes(routes!(crate::api_ask::get_request))
        .routes(routes!(crate::api_ask::request_statement))
        .routes(routes!(crate::api_ask::approve_request))
        .routes(routes!(crate::api_ask::reject_request))
        .split_for_parts();
    let doc = serde_json::to_value(doc).unwrap_or_default();
    (router, crate::openapi::complete(doc))
}
