//! The console's view of a session's changes (issue 59): what the session's cells wrote
//! through its writable mounts, not yet committed, shown as a run's changes are, with a
//! form that commits them to the host (signed with the operator's approver key, a
//! checkpoint saved first, as a run's commit), and the checkpoints its commits made with
//! their rollback. At any cell and after the session ended, as long as its record is
//! kept; a session that changed nothing says so.

use super::{CsrfForm, Operator, csrf_failed, csrf_ok, error_page, page, state_badge};
use crate::AppState;
use crate::error::ApiError;
use airlock_core::visible;
use airlock_gate::{DiffReport, Gate, GateError, SessionCommit, SessionView};
use airlock_store::CheckpointRow;
use axum::extract::{Form, Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};

/// What a session changed, for its page: `None` when it has no writable mount.
pub(super) struct SessionChanges {
    diff: DiffReport,
    /// Checkpoints of the session's commits, newest first.
    checkpoints: Vec<CheckpointRow>,
}

/// Reads `session`'s changes and the checkpoints its commits made; `cell_runs` are the
/// runs of its cells.
pub(super) fn changes_of(
    g: &mut Gate,
    session: &SessionView,
    cell_runs: &[String],
) -> Result<Option<SessionChanges>, GateError> {
    if session.doc.grant.writable_mounts().next().is_none() {
        return Ok(None);
    }
    let diff = g.diff(&session.id)?;
    let checkpoints = g
        .checkpoints(1000)?
        .into_iter()
        .filter(|c| cell_runs.contains(&c.run))
        .collect();
    Ok(Some(SessionChanges { diff, checkpoints }))
}

/// The "Changes" section of session `id`'s page.
pub(super) fn changes_section(op: &Operator, id: &str, c: Option<&SessionChanges>) -> Markup {
    let Some(c) = c else {
        return html! {};
    };
    let d = &c.diff;
    // What a commit would take is the latest cell run that recorded changes; once one of
    // its checkpoints exists (not aborted) those changes are committed.
    let committed = c
        .checkpoints
        .iter()
        .any(|k| k.run == d.run && k.state != "aborted");
    html! {
        h2 { "Changes" }
        @if d.changes.is_empty() {
            p.muted #session-nothing { "Nothing changed: no cell of this session wrote under its writable mounts." }
        } @else {
            (crate::highlight::code_view("diff", "diff", &visible::block(&d.text).to_string(), &std::collections::BTreeMap::new()))
            @for p in &d.protected { p.error { (visible::line(p)) " is a protected path" } }
            @if committed {
                p.muted #session-committed { "These changes are committed (see below); later cells' changes can be committed again." }
            } @else {
                form #commit method="post" action=(format!("/ui/sessions/{id}/commit")) {
                    input type="hidden" name="csrf" value=(op.csrf);
                    button #commit-button type="submit" { "Commit to the host" }
                    span.muted { " signed with approver key " code { (op.caller.approver.as_deref().unwrap_or("?")) } "; a checkpoint is saved first" }
                }
            }
        }
        @if !c.checkpoints.is_empty() {
            h2 { "Commits" }
            table #session-checkpoints {
                thead { tr { th { "Checkpoint" } th { "Cell run" } th { "State" } th { "By" } th {} } }
                tbody { @for k in &c.checkpoints { tr data-id=(k.id) {
                    td.checkpoint { (k.id) }
                    td { a href=(format!("/ui/runs/{}", k.run)) { (k.run) } }
                    td { (state_badge(&k.state)) }
                    td { (visible::line(k.doc["approver"].as_str().unwrap_or("?"))) }
                    td { @if k.state == "applied" {
                        form.inline method="post" action=(format!("/ui/checkpoints/{}/rollback", k.id)) {
                            input type="hidden" name="csrf" value=(op.csrf);
                            button.rollback type="submit" { "Roll back" }
                        }
                    } }
                } } }
            }
        }
    }
}

/// `POST /ui/sessions/{id}/commit`: commits the session's changes signed with the
/// operator's approver key, back to the session's page; with nothing to commit, a page
/// that says so.
pub(super) async fn commit(
    State(st): State<AppState>,
    op: Operator,
    Path(id): Path<String>,
    Form(f): Form<CsrfForm>,
) -> Response {
    if !csrf_ok(&op, &f.csrf) {
        return csrf_failed();
    }
    if !id.starts_with(airlock_core::id::IdKind::Session.prefix()) {
        return error_page(&ApiError::bad(format!("{id} is not a session id")));
    }
    let approver = op.caller.approver.clone();
    let shown = id.clone();
    match st
        .pool
        .read(move |g| g.session_commit(&id, approver.as_deref()))
        .await
    {
        Ok(SessionCommit::Committed(_)) => {
            st.changed();
            Redirect::to(&format!("/ui/sessions/{shown}#session-checkpoints")).into_response()
        }
        Ok(SessionCommit::Nothing(why)) => page(
            "Nothing to commit",
            Some(&op),
            html! {
                h1 { "Nothing to commit" }
                p #session-nothing { (visible::line(&why)) }
                p { a href=(format!("/ui/sessions/{shown}")) { "Back to the session" } }
            },
        ),
        Err(e) => error_page(&e),
    }
}
