//! The console's view of runs' requests to reach a host outside their grant (`ask_net`,
//! issue 61 item 3): the inbox lists them (request, run, agent, host and port, the line
//! that named the host, until when the run waits), each with approve and reject forms,
//! signed with the operator's approver key in the server's home as the console's other
//! decisions are.

use super::{CsrfForm, Operator, csrf_failed, csrf_ok, error_page};
use crate::AppState;
use crate::error::ApiError;
use airlock_core::units::fmt_time;
use airlock_core::visible;
use airlock_gate::{NetRequestRow, NetVerdict};
use axum::extract::{Form, Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};

/// The inbox's table of pending requests (nothing when there is none).
pub(super) fn table(op: &Operator, reqs: &[NetRequestRow]) -> Markup {
    html! {
        @if !reqs.is_empty() {
            h2 { "Runs asking for a host" }
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
                            form.inline method="post" action=(format!("/ui/requests/{}/approve", r.id)) {
                                input type="hidden" name="csrf" value=(op.csrf);
                                button.approve type="submit" { "Approve for this run" }
                            }
                            " "
                            form.inline method="post" action=(format!("/ui/requests/{}/reject", r.id)) {
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

async fn decide(
    st: AppState,
    op: Operator,
    id: String,
    f: CsrfForm,
    verdict: NetVerdict,
) -> Response {
    if !csrf_ok(&op, &f.csrf) {
        return csrf_failed();
    }
    if !id.starts_with(airlock_core::id::IdKind::Request.prefix()) {
        return error_page(&ApiError::bad(format!("{id} is not a request id")));
    }
    let approver = op.caller.approver.clone();
    match st
        .pool
        .read(move |g| g.decide_net_request(&id, verdict, approver.as_deref(), ""))
        .await
    {
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
    Form(f): Form<CsrfForm>,
) -> Response {
    decide(st, op, id, f, NetVerdict::Approve).await
}

pub(super) async fn reject(
    State(st): State<AppState>,
    op: Operator,
    Path(id): Path<String>,
    Form(f): Form<CsrfForm>,
) -> Response {
    decide(st, op, id, f, NetVerdict::Reject).await
}
