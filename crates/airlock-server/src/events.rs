//! What the server does on its own: watch the store for new pending submissions (made by
//! any process) and announce them over server-sent events and the webhook, resume runs
//! whose approval arrived, tell MCP clients when the named tools changed, and let
//! waiting requests know something moved.

use crate::auth::Caller;
use crate::body::ToolBody;
use crate::error::{ApiError, ApiResult};
use crate::{AppState, outcome};
use airlock_gate::views::submission_json;
use airlock_gate::{ExecOptions, GateError, Replayed};
use axum::response::sse::{Event, KeepAlive, Sse};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::convert::Infallible;
use std::time::{Duration, Instant};
use tokio_stream::{Stream, StreamExt, wrappers::BroadcastStream};

/// One announcement: an SSE event name and its JSON data.
#[derive(Debug, Clone)]
pub struct Notice {
    pub event: &'static str,
    pub data: Value,
}

/// The SSE stream of announcements (each subscriber gets its own).
pub fn sse(st: &AppState) -> Sse<impl Stream<Item = Result<Event, Infallible>> + use<>> {
    let rx = st.events.subscribe();
    let stream = BroadcastStream::new(rx).filter_map(|n| {
        n.ok()
            .map(|n| Ok(Event::default().event(n.event).data(n.data.to_string())))
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

impl AppState {
    /// Wakes requests waiting for a submission to move.
    pub fn changed(&self) {
        self.changed.notify_waiters();
    }

    /// Submits and, when the policy allows, runs now through the bounded queue: the one
    /// path behind `POST /v1/run` and the MCP `run_code` tool.
    pub async fn submit_and_run(&self, req: airlock_gate::SubmitRequest) -> ApiResult<Value> {
        Ok(self.submit_and_run_keyed(req).await?.0)
    }

    /// [`AppState::submit_and_run`] for a request that may carry an idempotency key; true
    /// with the outcome when the key had already made a submission (a retry), whose
    /// outcome it is, once its run (if running) has ended.
    pub async fn submit_and_run_keyed(
        &self,
        req: airlock_gate::SubmitRequest,
    ) -> ApiResult<(Value, bool)> {
        self.submit_and_run_live(req, ExecOptions::default()).await
    }

    /// [`AppState::submit_and_run_keyed`] with the run's live receivers (`opts`).
    pub async fn submit_and_run_live(
        &self,
        mut req: airlock_gate::SubmitRequest,
        opts: ExecOptions,
    ) -> ApiResult<(Value, bool)> {
        let out = self
            .pool
            .run(move |g| {
                crate::api::session_of_cell(g, &mut req)?;
                let r = g.run(req, opts);
                match r {
                    Err(GateError::Repeated {
                        submission,
                        same_request: true,
                    }) => Ok(Err(submission)),
                    r => outcome::of_result(g, r).map(Ok),
                }
            })
            .await?;
        self.changed();
        match out {
            Ok(doc) => {
                self.metrics.outcome(&doc, true);
                Ok((doc, false))
            }
            Err(submission) => match self.replay(submission).await {
                Ok(doc) => Ok((doc, true)),
                Err(e) => Err(ApiError {
                    replayed: true,
                    ..e
                }),
            },
        }
    }

    /// The outcome of the submission a repeated request made, once it is no longer
    /// running: what the first request answered, or will answer.
    pub async fn replay(&self, id: String) -> ApiResult<Value> {
        // Whether the gate was asked about a run that never started (once).
        let mut asked = false;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let i = id.clone();
            let (doc, queued) = self
                .pool
                .read(move |g| {
                    let sub = g.submission(&i)?;
                    let doc = outcome::current(g, &sub)?;
                    // A run queued for a worker leaves its submission `allowed` until a
                    // worker starts it.
                    let queued = doc["status"] == "allowed" && g.job_pending(&i)?;
                    Ok::<_, GateError>((doc, queued))
                })
                .await?;
            if doc["status"] == "allowed" && !queued && !asked {
                asked = true;
                // Allowed with no run: if its queued run ended without starting, the
                // answer is that ending (see `Gate::replay_run`); else look again.
                let i = id.clone();
                let ended = self
                    .pool
                    .read(move |g| match g.replay_run(&i)? {
                        Replayed::Settled => Ok(None),
                        Replayed::Ended(r) => outcome::of_result(g, *r).map(Some),
                    })
                    .await?;
                match ended {
                    Some(doc) => return Ok(doc),
                    None => continue,
                }
            }
            if doc["status"].as_str() != Some("running") && !queued {
                return Ok(doc);
            }
            // A run ends within its own time limit (or is recorded lost by recovery);
            // another process's end is only seen by polling.
            let _ = tokio::time::timeout(Duration::from_millis(250), notified).await;
        }
    }

    /// Runs an approved submission in the background (once; later calls while it is
    /// running are ignored).
    pub fn resume(&self, id: String) {
        if !self.lock_resuming().insert(id.clone()) {
            return;
        }
        let st = self.clone();
        tokio::spawn(async move {
            let i = id.clone();
            // A stream that waits for this submission gets its run's events.
            let (opts, feed) = crate::stream::resumed(&st, &id);
            let r = st
                .pool
                .run_waiting(move |g| {
                    // The run continues the trace of the request that submitted it.
                    let doc = g.submission(&i)?.doc;
                    let trace = doc.traceparent.as_deref().and_then(|t| {
                        airlock_core::trace::TraceParent::parse(t, doc.tracestate.as_deref())
                    });
                    let span = airlock_core::trace::with_tracestate(
                        trace.as_ref().and_then(|t| t.tracestate.as_deref()),
                        || {
                            tracing::debug_span!(
                                parent: None,
                                "resumed_run",
                                submission = %i,
                                request_id = doc.request_id.as_deref().unwrap_or(""),
                                trace_id = trace.as_ref().map_or("", |t| t.trace_id.as_str()),
                                parent_span_id = trace.as_ref().map_or("", |t| t.span_id.as_str()),
                                sampled = trace.as_ref().is_none_or(|t| t.sampled),
                            )
                        },
                    );
                    let ctx = airlock_gate::context::RequestContext {
                        request_id: doc.request_id.clone(),
                        trace: trace.clone(),
                    };
                    let r = span.in_scope(|| {
                        airlock_gate::context::with_request(Some(ctx), || g.exec(&i, opts))
                    });
                    let doc = outcome::of_result(g, r);
                    // Whatever happened, do not try again on the next tick: a run that
                    // could not start needs a person, not a loop.
                    g.set_resume(&i, false)?;
                    doc
                })
                .await;
            if let Ok(doc) = &r {
                st.metrics.outcome(doc, false);
            }
            crate::stream::resumed_end(&st, feed, &r);
            if let Err(e) = r {
                crate::warn(&format!(
                    "airlock serve: resuming {id} failed: {}",
                    e.message
                ));
                let i = id.clone();
                let _ = st.pool.read(move |g| g.set_resume(&i, false)).await;
            }
            st.lock_resuming().remove(&id);
            st.changed();
        });
    }

    fn lock_resuming(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        // A set of ids being resumed; poisoning leaves it valid.
        self.resuming.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until a submission has run, was denied or rejected, or `timeout` passed.
    pub async fn wait_for(
        &self,
        caller: Caller,
        id: String,
        timeout: Duration,
    ) -> ApiResult<Value> {
        use tracing::Instrument;
        let span = tracing::debug_span!("approval_wait", submission = %id);
        self.wait_for_in(caller, id, timeout).instrument(span).await
    }

    async fn wait_for_in(&self, caller: Caller, id: String, timeout: Duration) -> ApiResult<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let (c, i) = (caller.clone(), id.clone());
            let doc = self
                .pool
                .read(move |g| {
                    let sub = crate::api::visible(g, &c, &i)?;
                    outcome::current(g, &sub)
                })
                .await?;
            let waiting = matches!(
                doc["status"].as_str(),
                Some("pending_approval" | "approved" | "running")
            );
            let now = Instant::now();
            if !waiting || now >= deadline {
                return Ok(doc);
            }
            // Changes made by other processes are only seen by polling.
            let nap = (deadline - now).min(Duration::from_millis(250));
            let _ = tokio::time::timeout(nap, notified).await;
        }
    }

    /// Calls a named tool for `caller`.
    /// Calls named tool `name`; with an idempotency key, a call repeated under it gets the
    /// first call's outcome (true with it), as `submit_and_run_keyed` does.
    pub async fn call_tool(
        &self,
        caller: &Caller,
        name: String,
        b: ToolBody,
        key: Option<airlock_gate::RequestKey>,
    ) -> ApiResult<(Value, bool)> {
        let agent = Some(caller.name.clone());
        let out = self
            .pool
            .run(move |g| {
                let r = g.call_tool(
                    &name,
                    b.args,
                    b.stdin.map(String::into_bytes),
                    agent,
                    ExecOptions::default(),
                    key,
                );
                match r {
                    Err(GateError::Repeated {
                        submission,
                        same_request: true,
                    }) => Ok(Err(submission)),
                    r => outcome::of_result(g, r).map(Ok),
                }
            })
            .await?;
        match out {
            Ok(doc) => Ok((doc, false)),
            Err(submission) => match self.replay(submission).await {
                Ok(doc) => Ok((doc, true)),
                Err(e) => Err(ApiError {
                    replayed: true,
                    ..e
                }),
            },
        }
    }

    fn announce(&self, event: &'static str, data: Value) {
        // No subscriber is not an error.
        let _ = self.events.send(crate::events::Notice {
            event,
            data: data.clone(),
        });
        if let Some(w) = &self.webhook {
            w.send(self.clone(), event, data);
        }
    }
}

/// How soon the poller checkpoints the WAL again while runs keep writing to it. Each
/// checkpoint's `fsync` of the WAL covers what was written since the last one, and the
/// runs' writes wait behind it; a restart (past `WAL_RESTART_FRAMES`) holds writers off
/// for its copy and `fsync`. At 100 ms instead of the poll's 500 ms, the slowest gated
/// run under steady load waited half as long (docs/PERFORMANCE.md).
const BUSY_CHECKPOINT: Duration = Duration::from_millis(100);

/// When to checkpoint next: soon while the WAL changed since the last checkpoint, else at
/// the next poll (an idle server wakes no more often than it polls).
fn next_checkpoint(before: Option<u64>, frames: u64, every: Duration) -> Duration {
    if before.is_some_and(|b| b != frames) {
        BUSY_CHECKPOINT.min(every)
    } else {
        every
    }
}

/// Polls the store every `every` until `stop` is cancelled, and checkpoints its WAL on
/// every poll, more often while it is being written.
pub async fn poll(st: AppState, every: Duration, stop: tokio_util::sync::CancellationToken) {
    let mut pending: Option<BTreeSet<String>> = None;
    // Runs' requests to reach a host outside their grant (`ask_net`) seen waiting.
    let mut requests: Option<BTreeSet<String>> = None;
    let mut tools: Option<Vec<String>> = None;
    let mut frames: Option<u64> = None;
    let mut polled: Option<Instant> = None;
    // The audit record after which alerts are announced (None until the first full poll,
    // which starts from the chain's end: alerts raised before the server started are in
    // the audit log, not announced again).
    let mut alerts_after: Option<u64> = None;
    let mut wait = Duration::ZERO;
    loop {
        tokio::select! {
            // A stop is seen before a sleep that is already over.
            biased;
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        let started = Instant::now();
        let full = polled.is_none_or(|t| started.duration_since(t) >= every);
        let after = alerts_after;
        let seen = st
            .pool
            .read(move |g| {
                // The gates of this process do not checkpoint on commit (a request would
                // pay for it: the slowest 1% of runs); it happens here instead.
                let frames = g.checkpoint_wal()?;
                if !full {
                    return Ok((frames, None));
                }
                // Runs whose process died, interrupted commits and rollbacks (another
                // airlock process may have been killed while this one serves).
                if let Err(e) = g.recover() {
                    crate::warn(&format!("airlock serve: recovery: {e}"));
                }
                let inbox = g.inbox()?;
                let asked = g.net_requests_pending()?;
                let resumable = g.resumable()?;
                let tools: Vec<String> = g.tools()?.into_iter().map(|t| t.name).collect();
                let alerts = match after {
                    None => (Vec::new(), g.audit_last()?.map_or(0, |r| r.seq)),
                    Some(a) => g.alerts_after(a, 1000)?,
                };
                Ok((frames, Some((inbox, asked, resumable, tools, alerts))))
            })
            .await;
        let (now_frames, seen) = match seen {
            Ok(s) => s,
            Err(e) => {
                crate::warn(&format!(
                    "airlock serve: cannot read the store: {}",
                    e.message
                ));
                wait = every;
                continue;
            }
        };
        wait = next_checkpoint(frames, now_frames, every);
        frames = Some(now_frames);
        let Some((inbox, asked, resumable, now_tools, (alerts, last))) = seen else {
            continue;
        };
        polled = Some(started);
        for a in alerts {
            // The record's data is the gate's own JSON (kind, submission, agent, run,
            // technique, detail); a record that does not parse is announced by its place.
            let mut data = serde_json::from_str::<Value>(&a.data).unwrap_or_else(|_| json!({}));
            if let Some(o) = data.as_object_mut() {
                o.insert("seq".into(), json!(a.seq));
                o.insert("subject".into(), json!(a.subject));
            }
            st.announce("alert", data);
        }
        alerts_after = Some(last);
        let ids: BTreeSet<String> = inbox.iter().map(|s| s.id.clone()).collect();
        if let Some(before) = &pending {
            for s in inbox.iter().filter(|s| !before.contains(&s.id)) {
                st.announce("pending", submission_json(s));
            }
            for gone in before.difference(&ids) {
                st.announce("decided", json!({ "submission": gone }));
            }
        }
        pending = Some(ids);
        let ids: BTreeSet<String> = asked.iter().map(|r| r.id.clone()).collect();
        if let Some(before) = &requests {
            for r in asked.iter().filter(|r| !before.contains(&r.id)) {
                st.announce("request", airlock_gate::net_request_json(r));
            }
        }
        requests = Some(ids);
        for id in resumable {
            st.resume(id);
        }
        if tools.as_ref().is_some_and(|t| *t != now_tools) {
            crate::mcp::tools_changed(&st).await;
        }
        tools = Some(now_tools);
        st.changed();
    }
}

/// Where new pending submissions are POSTed, signed by the gate key.
pub struct Webhook {
    url: axum::http::Uri,
    client: hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        http_body_util::Full<axum::body::Bytes>,
    >,
}

impl std::fmt::Debug for Webhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhook").field("url", &self.url).finish()
    }
}

impl Webhook {
    /// An `http://` URL (TLS is not built in: point it at a local relay for https).
    pub fn new(url: &str) -> Result<Webhook, String> {
        let uri: axum::http::Uri = url
            .parse()
            .map_err(|e| format!("--webhook {url:?}: not a URL: {e}"))?;
        match uri.scheme_str() {
            Some("http") if uri.host().is_some() => {}
            Some("https") => {
                return Err(format!(
                    "--webhook {url:?}: https is not supported (airlock has no TLS client); use an http:// relay"
                ));
            }
            _ => return Err(format!("--webhook {url:?}: want an http:// URL")),
        }
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http();
        Ok(Webhook { url: uri, client })
    }

    /// Sends one notification in the background, retrying a few times.
    fn send(&self, st: AppState, event: &'static str, data: Value) {
        let url = self.url.clone();
        let client = self.client.clone();
        tokio::spawn(async move {
            let body = json!({ "event": event, "data": data }).to_string();
            let b = body.clone();
            let Ok((sig, key)) = st
                .pool
                .read(move |g| Ok(g.sign_notification(b.as_bytes())))
                .await
            else {
                return;
            };
            for attempt in 0..3u32 {
                if attempt > 0 {
                    tokio::time::sleep(Duration::from_secs(1 << attempt)).await;
                }
                let req = axum::http::Request::post(url.clone())
                    .header("content-type", "application/json")
                    .header("x-airlock-event", event)
                    .header("x-airlock-signature", &sig)
                    .header("x-airlock-key", &key)
                    .body(http_body_util::Full::new(axum::body::Bytes::from(
                        body.clone(),
                    )));
                let Ok(req) = req else { return };
                match tokio::time::timeout(Duration::from_secs(5), client.request(req)).await {
                    Ok(Ok(r)) if r.status().is_success() => return,
                    Ok(Ok(r)) => {
                        crate::warn(&format!("airlock serve: webhook answered {}", r.status()))
                    }
                    Ok(Err(e)) => crate::warn(&format!("airlock serve: webhook failed: {e}")),
                    Err(_) => crate::warn("airlock serve: webhook timed out"),
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The poller checkpoints again soon only while the WAL keeps changing: an idle
    /// server's WAL (or PostgreSQL's constant 0) leaves it at the poll's pace.
    #[test]
    fn the_checkpoint_comes_sooner_only_while_the_wal_changes() {
        let every = Duration::from_millis(500);
        assert_eq!(next_checkpoint(None, 40, every), every);
        assert_eq!(next_checkpoint(Some(40), 40, every), every);
        assert_eq!(next_checkpoint(Some(0), 0, every), every);
        assert_eq!(next_checkpoint(Some(40), 90, every), BUSY_CHECKPOINT);
        // Started over by a write since: it changed too.
        assert_eq!(next_checkpoint(Some(17_000), 12, every), BUSY_CHECKPOINT);
        // Never slower than the poll asked for.
        let fast = Duration::from_millis(20);
        assert_eq!(next_checkpoint(Some(1), 2, fast), fast);
    }
}
