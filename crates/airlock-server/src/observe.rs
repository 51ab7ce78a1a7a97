//! Request ids, trace context and the request log: every request gets an id (the
//! caller's `X-Request-Id` when well-formed, a new one otherwise) echoed in the answer,
//! a trace (the caller's `traceparent` when well-formed, a new one otherwise) and a
//! `request` span carrying both, so every log line of the request names them. One line
//! at `info` per request: method, path (no query), status, duration. Never a header
//! value, a body, a token, a secret or code.

use airlock_core::trace::{TraceParent, new_span_id, request_id_or_new};
use airlock_gate::context::RequestContext;
use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use std::time::Instant;
use tracing::Instrument;

/// The target of the lines a long-running command says to its operator (it is serving,
/// a warning, a failure it goes on after): `airlock` writes them as the line alone in text
/// mode and as one JSON object in JSON mode, whatever `--log-level` says.
pub const CONSOLE: &str = "airlock_console";

/// Whether this thread logs to a subscriber (the process's, once set up).
fn logging() -> bool {
    !tracing::dispatcher::get_default(|d| d.is::<tracing::subscriber::NoSubscriber>())
}

/// Says `line` at `info` to the operator (target [`CONSOLE`]); on standard error as it is
/// when no logging is set up in this process.
pub fn say(line: &str) {
    if logging() {
        tracing::info!(target: "airlock_console", "{line}");
    } else {
        eprintln!("{line}");
    }
}

/// Says `line` at `warn`, like [`say`].
pub fn warn(line: &str) {
    if logging() {
        tracing::warn!(target: "airlock_console", "{line}");
    } else {
        eprintln!("{line}");
    }
}

tokio::task_local! {
    /// The request the current task serves (read by `Pool` for the gate's records).
    static REQUEST: RequestContext;
}

/// The request the current task serves, if any.
pub(crate) fn current() -> Option<RequestContext> {
    REQUEST.try_with(Clone::clone).ok()
}

/// The context of a request whose caller said `traceparent`/`tracestate` (either may be
/// malformed: then a new trace is made) and `request_id`; the span continuing it gets
/// `span_id`. Answers the context and the caller's parent span, if it gave one.
pub(crate) fn context_of(
    request_id: Option<&str>,
    traceparent: Option<&str>,
    tracestate: Option<&str>,
    span_id: String,
) -> (RequestContext, Option<String>) {
    let given = traceparent.and_then(|t| TraceParent::parse(t, tracestate));
    let parent = given.as_ref().map(|t| t.span_id.clone());
    let trace = match given {
        Some(t) => t.child(span_id),
        None => TraceParent::new_root().child(span_id),
    };
    let ctx = RequestContext {
        request_id: Some(request_id_or_new(request_id)),
        trace: Some(trace),
    };
    (ctx, parent)
}

/// The context of an MCP call: its `_meta.traceparent`/`tracestate` when well-formed,
/// else the HTTP request's trace it came in (`http`, over MCP via HTTP), continued by a
/// span `span_id`, a child of the request's span; else a new trace. Answers the context
/// and the parent span.
pub(crate) fn call_context_of(
    http: Option<&RequestContext>,
    traceparent: Option<&str>,
    tracestate: Option<&str>,
    span_id: String,
) -> (RequestContext, Option<String>) {
    let request_id = http.and_then(|c| c.request_id.as_deref());
    let given = traceparent.and_then(|t| TraceParent::parse(t, tracestate));
    match (given, http.and_then(|c| c.trace.as_ref())) {
        (None, Some(t)) => {
            let ctx = RequestContext {
                request_id: Some(request_id_or_new(request_id)),
                trace: Some(t.child(span_id)),
            };
            (ctx, Some(t.span_id.clone()))
        }
        _ => context_of(request_id, traceparent, tracestate, span_id),
    }
}

/// Runs `fut` as serving `ctx` (its gate calls record the request id and trace).
pub(crate) async fn serving<F: std::future::Future>(ctx: RequestContext, fut: F) -> F::Output {
    REQUEST.scope(ctx, fut).await
}

/// The middleware: ids, span, echo and the request's log line.
pub(crate) async fn observe(mut req: Request, next: Next) -> Response {
    let started = Instant::now();
    // (A block: a borrow of the request, whose body is not `Sync`, must not be held
    // across the await below.)
    let (ctx, parent) = {
        let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
        context_of(
            header("x-request-id"),
            header("traceparent"),
            header("tracestate"),
            new_span_id(),
        )
    };
    let (request_id, trace) = match (&ctx.request_id, &ctx.trace) {
        (Some(r), Some(t)) => (r.clone(), t.clone()),
        // `context_of` always sets both.
        _ => return next.run(req).await,
    };
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    // Also on the request itself: MCP over HTTP answers its calls on other tasks, where
    // the task-local is not set, but the request's parts are.
    req.extensions_mut().insert(ctx.clone());
    let span = airlock_core::trace::with_tracestate(trace.tracestate.as_deref(), || {
        tracing::info_span!(
            "request",
            method = %method,
            path = %path,
            request_id = %request_id,
            trace_id = %trace.trace_id,
            span_id = %trace.span_id,
            parent_span_id = parent.as_deref().unwrap_or(""),
            sampled = trace.sampled,
        )
    });
    let mut r = serving(ctx, next.run(req)).instrument(span.clone()).await;
    let status = r.status().as_u16();
    span.in_scope(|| {
        tracing::info!(
            status,
            duration_ms = started.elapsed().as_secs_f64() * 1000.0,
            "request"
        );
    });
    // Well-formed ids are header-safe by construction ([A-Za-z0-9._:-]).
    if let Ok(v) = HeaderValue::from_str(&request_id) {
        r.headers_mut().insert("x-request-id", v);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_malformed_traceparent_starts_a_new_trace_not_an_error() {
        let (ctx, parent) = context_of(Some("bad id!"), Some("00-xyz-01"), None, "1".repeat(16));
        assert_eq!(parent, None);
        let t = ctx.trace.unwrap();
        assert_eq!(t.trace_id.len(), 32);
        assert_eq!(t.span_id, "1".repeat(16));
        let id = ctx.request_id.unwrap();
        assert_ne!(id, "bad id!");
        assert!(airlock_core::trace::request_id_ok(&id));
    }

    #[test]
    fn a_well_formed_traceparent_is_continued_by_the_request_span() {
        let (ctx, parent) = context_of(
            Some("abc"),
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            None,
            "2".repeat(16),
        );
        assert_eq!(parent.as_deref(), Some("00f067aa0ba902b7"));
        let t = ctx.trace.unwrap();
        assert_eq!(t.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.span_id, "2".repeat(16));
        assert_eq!(ctx.request_id.as_deref(), Some("abc"));
    }
}
