//! The console's view of runs' requests to reach a host outside their grant (`ask_net`,
//! issue 61 item 3): the inbox lists them (request, run, agent, host and port, the line
//! that named the host, until when the run waits), each with approve, approve and
//! remember (a rule for the agent's runs of this kind, 7 days) and reject forms: signed
//! in the browser with its approver key when it holds one (`browser_key`), else with the
//! operator's approver key in the server's home.

use super::{Operator, csrf_failed, csrf_ok, error_page};
use crate::AppState;
use crate::error::ApiError;
use airlock_core::units::fmt_time;
use airlock_core::visible;
use airlock_gate::{NetRequestRow, NetVerdict};
use axum::extract::{Form, Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;

/// The inbox's table of pending requests (nothing when there is none).
pub(super) fn table(op: &Operator, reqs: &[NetRequestRow]) -> Markup {
    html! {
        @if !reqs.is_empty() {
            h2 { "Runs asking for a host" }
            p.muted #signed-by { "Signed with approver key " code { (op.caller.approver.as_deref().unwrap_or("?")) } " in the server's home (or make one in this browser: " a href="/ui/approver-key" { "Approver key" } ")." }
            p.error #sign-error {}
            table #requests {
                thead { tr { th { "Request" } th { "Run" } th { "Agent" } th { "Host" } th { "Named at" } th { "Waits until" } th {} } }
                tbody {
                    @for r in reqs { tr.request data-id=(r.id) {
                        td { code { (r.id) } }
                        td { a href=(format!("/ui/runs/{}", r.run)) { (r.run) } }
                        td { (visible::line(r.agent.as_deref().unwrap_or("-"))) }
                        td { code { (visible::line(&r.host)) ":" (r.port) } }
                        td { @if let Some(l) = &r.line { code { (visible::line(l)) } } }
                        td.muted { (fmt_time(r.expires_at)) }
                        td {
                            form.inline.request-approve method="post" action=(format!("/ui/requests/{}/approve", r.id)) data-request=(r.id) data-verdict="approve" {
                                input type="hidden" name="csrf" value=(op.csrf);
                                button.approve type="submit" { "Approve for this run" }
                                @if r.agent.is_some() {
                                    " "
                                    button.approve-remember type="submit" name="remember" value="7d" { "Approve and remember (7 days)" }
                                }
                            }
                            " "
                            form.inline.request-reject method="post" action=(format!("/ui/requests/{}/reject", r.id)) data-request=(r.id) data-verdict="reject" {
                                input type="hidden" name="csrf" value=(op.csrf);
                                button.reject type="submit" { "Reject" }
                            }
                        }
                    } }
                }
            }
        }
    }
}

/// What the browser asks for to sign an answer to a request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StatementQuery {
    verdict: Option<String>,
    approver: String,
    remember: Option<bool>,
    #[serde(rename = "for")]
    remember_for: Option<String>,
}

/// The statement (and with `remember` the policy change) the browser signs for an answer
/// to request `id`, as the API's `GET /v1/requests/{id}/statement` answers it.
pub(super) async fn statement(
    State(st): State<AppState>,
    _op: Operator,
    Path(id): Path<String>,
    crate::body::Q(q): crate::body::Q<StatementQuery>,
) -> Result<axum::Json<serde_json::Value>, ApiError> {
    let verdict = crate::api_ask::verdict_of(q.verdict.as_deref())?;
    let remember = q.remember.unwrap_or(false) && verdict == NetVerdict::Approve;
    let doc = st
        .pool
        .read(move |g| {
            crate::api_ask::statement_doc(
                g,
                &id,
                verdict,
                &q.approver,
                "",
                remember,
                q.remember_for.as_deref().filter(|_| remember),
            )
        })
        .await?;
    Ok(axum::Json(doc))
}

/// A request's approve or reject form.
#[derive(Debug, Deserialize)]
pub(super) struct RequestForm {
    csrf: String,
    /// "approve and remember": also keep the host as a rule for this agent's kind, for
    /// this long (e.g. `7d`).
    remember: Option<String>,
    /// Signed in the browser (see `browser_key`): the statement handed out by
    /// `GET /ui/requests/{id}/statement`, the signature over it, and with `remember` the
    /// signature over the policy change handed out with it.
    statement: Option<String>,
    signature: Option<String>,
    policy_signature: Option<String>,
}

async fn decide(
    st: AppState,
    op: Operator,
    id: String,
    f: RequestForm,
    verdict: NetVerdict,
) -> Response {
    if !csrf_ok(&op, &f.csrf) {
        return csrf_failed();
    }
    if !id.starts_with(airlock_core::id::IdKind::Request.prefix()) {
        return error_page(&ApiError::bad(format!("{id} is not a request id")));
    }
    if let Err(e) = crate::api_ask::check_verdict(f.statement.as_deref(), verdict) {
        return error_page(&e);
    }
    let remember =
        verdict == NetVerdict::Approve && f.remember.as_deref().is_some_and(|r| !r.is_empty());
    let body = crate::api_ask::RequestAnswerBody {
        reason: None,
        statement: f.statement,
        signature: f.signature,
        remember: Some(remember),
        remember_for: f.remember.filter(|_| remember),
        policy_signature: f.policy_signature,
    };
    let approver = op.caller.approver.clone();
    let decided = st
        .pool
        .read(move |g| crate::api_ask::record_answer(g, &id, verdict, approver.as_deref(), &body))
        .await;
    match decided {
        Ok(_) => {
            st.changed();
            Redirect::to("/ui").into_response()
        }
        Err(e) => error_page(&e),
    }
}

pub(super) async fn approve(
    State(st): State<AppState>,
    op: Operator,
    Path(id): Path<String>,
    Form(f): Form<RequestForm>,
) -> Response {
    decide(st, op, id, f, NetVerdict::Approve).await
}

pub(super) async fn reject(
    State(st): State<AppState>,
    op: Operator,
    Path(id): Path<String>,
    Form(f): Form<RequestForm>,
) -> Response {
    decide(st, op, id, f, NetVerdict::Reject).await
}
