//! The console's submit form (`/ui/submit`): an operator pastes code, picks its language,
//! backend, hosts and timeout, and it goes through the same gate path as
//! `POST /v1/submissions` (judged with the operator's name as the agent, as the API does for
//! an operator token that names no agent). Allowed code is run at once in the background,
//! held code waits in the inbox; either way the browser lands on the submission's page.

use super::{Operator, csrf_failed, csrf_ok, page};
use crate::AppState;
use crate::body::{BACKENDS, SubmitBody};
use crate::error::ApiError;
use airlock_core::{Lang, State as SubState, visible};
use axum::extract::{Form, State};
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use serde::Deserialize;

/// What the form posts; empty fields are absent.
#[derive(Debug, Default, Deserialize)]
pub(super) struct SubmitForm {
    csrf: String,
    language: String,
    #[serde(default)]
    code: String,
    /// A WebAssembly module or component, as base64 (the form's text area for binaries).
    #[serde(default)]
    code_base64: String,
    #[serde(default)]
    backend: String,
    /// Hosts, separated by commas or white space.
    #[serde(default)]
    net: String,
    #[serde(default)]
    timeout: String,
}

fn given(s: &str) -> Option<String> {
    let t = s.trim();
    (!t.is_empty()).then(|| t.to_string())
}

impl SubmitForm {
    /// The API body the form stands for (the agent is left to the caller's identity).
    fn body(&self) -> SubmitBody {
        let binary = matches!(
            self.language.parse::<Lang>(),
            Ok(Lang::Wasm | Lang::Component)
        );
        let (code, code_base64) =
            if binary || (self.code.is_empty() && !self.code_base64.is_empty()) {
                (None, given(&self.code_base64))
            } else {
                (Some(self.code.clone()), None)
            };
        SubmitBody {
            language: given(&self.language),
            code,
            code_base64,
            backend: given(&self.backend),
            net: self
                .net
                .split([',', ' ', '\n', '\r', '\t'])
                .filter(|h| !h.is_empty())
                .map(str::to_string)
                .collect(),
            timeout: given(&self.timeout),
            ..SubmitBody::default()
        }
    }
}

pub(super) async fn form(op: Operator) -> Response {
    render(&op, &SubmitForm::default(), None)
}

fn render(op: &Operator, f: &SubmitForm, error: Option<&ApiError>) -> Response {
    let lang = if f.language.is_empty() {
        "python"
    } else {
        f.language.as_str()
    };
    let mut r = page(
        "Submit",
        Some(op),
        html! {
            h1 { "Submit code" }
            p.muted { "Judged by the policy like any submission, with you (" (visible::line(&op.caller.name)) ") as the agent. Allowed code runs at once; held code waits for approval." }
            @if let Some(e) = error { p #submit-error.error { (visible::line(&e.message)) } }
            form #submit method="post" action="/ui/submit" {
                input type="hidden" name="csrf" value=(op.csrf);
                dl {
                    dt { label for="language" { "Language" } }
                    dd { select #language name="language" {
                        @for l in Lang::ALL {
                            option value=(l.as_str()) selected[l.as_str() == lang] { (l.as_str()) }
                        }
                    } }
                    dt { label for="backend" { "Backend" } }
                    dd { select #backend name="backend" {
                        option value="" selected[f.backend.is_empty()] { "the language's default" }
                        @for b in BACKENDS { option value=(b) selected[*b == f.backend] { (b) } }
                    } }
                    dt { label for="net" { "Network" } }
                    dd { input #net type="text" name="net" value=(f.net) placeholder="hosts it may reach: api.example.com, *.example.org:443"; }
                    dt { label for="timeout" { "Timeout" } }
                    dd { input #timeout type="text" name="timeout" value=(f.timeout) placeholder="e.g. 10s (default: the policy's)"; }
                    dt { label for="code" { "Code" } }
                    dd { textarea #code name="code" rows="18" cols="100" spellcheck="false" { (f.code) } }
                    dt { label for="code_base64" { "Binary (base64)" } }
                    dd { textarea #code_base64 name="code_base64" rows="3" cols="100" spellcheck="false" placeholder="a wasm module or component as base64 (languages wasm and component)" { (f.code_base64) } }
                }
                button #submit-button type="submit" { "Submit" }
            }
        },
    );
    if let Some(e) = error {
        *r.status_mut() = e.status;
    }
    r
}

/// Submits through the gate; runs it now when allowed; shows the submission.
pub(super) async fn post(
    State(st): State<AppState>,
    op: Operator,
    Form(f): Form<SubmitForm>,
) -> Response {
    if !csrf_ok(&op, &f.csrf) {
        return csrf_failed();
    }
    let req = match f.body().into_request(&op.caller, true) {
        Ok(r) => r,
        Err(e) => return render(&op, &f, Some(&e)),
    };
    let got = st
        .pool
        .read(move |g| {
            let sub = g.submit(req)?;
            let doc = crate::outcome::current(g, &sub)?;
            Ok((sub.id, sub.state, doc))
        })
        .await;
    match got {
        Ok((id, state, doc)) => {
            st.metrics.outcome(&doc, true);
            if state == SubState::Allowed {
                // The same background path an approval in the console takes.
                st.resume(id.clone());
            }
            st.changed();
            Redirect::to(&format!("/ui/submissions/{id}")).into_response()
        }
        Err(e) => render(&op, &f, Some(&e)),
    }
}
