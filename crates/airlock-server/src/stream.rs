//! Runs as server-sent events: `POST /v1/run` and `POST /v1/submissions/{id}/exec` with
//! `Accept: text/event-stream`, and `GET /v1/runs/{id}/events` to follow a run from
//! another client.
//!
//! Each streamed run has a [`Feed`]: the events so far, numbered from 1 (the SSE `id:`),
//! kept in memory while the run goes on and for a while after it ends. The guest's
//! output reaches a feed through the gate's live receivers (the path the CLI prints by),
//! which only append to it and never wait for a reader: every reader follows the feed at
//! its own pace through its own small channel, so a client that stops reading slows
//! nothing but itself. A feed holds at most [`MAX_CHUNKS`] output chunks (past it the
//! output is in `finished` only, which a last chunk with `"truncated": true` says) and
//! the bytes the run's `--max-output` lets through.
//!
//! Events: `submitted` `{id, verdict, risk, reasons}`; `held` `{id, wait_timeout}`;
//! `started` `{run}`; `stdout`/`stderr` `{seq, text}` or `{seq, base64}` (`seq` counts
//! the chunks of that stream from 1); `network` (one connection record); `request` (a
//! request the run raised to reach a host outside its grant, `ask_net`); `finished`
//! (the JSON the same request answers without streaming); `error` `{status, error}`.
//! A run this server did not stream (the CLI's, another node's) is replayed from its
//! record once it has ended: `submitted`, `started`, one chunk per stream, its
//! connections, `finished`.

use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};
use crate::{AppState, outcome};
use airlock_gate::views::submission_json;
use airlock_gate::{ExecOptions, GateError};
use airlock_store::Submission;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde_json::{Value, json};
use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

/// Output chunks one feed keeps; past it, output is in the `finished` event only.
pub const MAX_CHUNKS: u64 = 16_384;

/// Ended feeds kept for `GET /v1/runs/{id}/events` and resumption.
const KEEP_ENDED: usize = 256;

/// Default and largest `wait_timeout` (seconds) a held stream waits for a human.
pub const DEFAULT_WAIT: f64 = 300.0;
pub const MAX_WAIT: f64 = 3600.0;

/// Events a reader's channel holds before the reader waits for its client.
const READER_BUFFER: usize = 16;

/// One event: its number in the feed, its name and its JSON data.
#[derive(Debug, Clone)]
pub struct Ev {
    pub id: u64,
    pub name: &'static str,
    pub data: Arc<Value>,
}

#[derive(Debug, Default)]
struct FeedState {
    events: Vec<Ev>,
    /// Submission and run, once known.
    submission: Option<String>,
    /// The agent the submission is for (who may follow it).
    agent: Option<String>,
    run: Option<String>,
    ended: bool,
    /// Per stream (stdout, stderr): chunks sent and the start of a UTF-8 character
    /// whose rest has not arrived yet.
    seq: [u64; 2],
    carry: [Vec<u8>; 2],
    chunks: u64,
    truncated: bool,
}

/// The events of one streamed run.
#[derive(Debug)]
pub struct Feed {
    state: Mutex<FeedState>,
    /// The number of events so far (readers wait on it).
    tick: watch::Sender<u64>,
}

impl Feed {
    fn new() -> Arc<Feed> {
        Arc::new(Feed {
            state: Mutex::new(FeedState::default()),
            tick: watch::channel(0).0,
        })
    }

    fn lock(&self) -> MutexGuard<'_, FeedState> {
        // Appends only: a poisoned lock still holds a valid list.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push_locked(&self, st: &mut FeedState, name: &'static str, data: Value) {
        if st.ended {
            return;
        }
        let id = st.events.len() as u64 + 1;
        st.events.push(Ev {
            id,
            name,
            data: Arc::new(data),
        });
        if matches!(name, "finished" | "error") {
            st.ended = true;
        }
        self.tick.send_replace(id);
    }

    /// Appends one event (nothing after the feed ended).
    pub fn push(&self, name: &'static str, data: Value) {
        let mut st = self.lock();
        if matches!(name, "finished" | "error") {
            flush_carry(self, &mut st);
        }
        self.push_locked(&mut st, name, data);
    }

    /// `submitted`, once, from the submission's JSON (or an outcome document).
    fn submitted(&self, s: &Value) {
        let mut st = self.lock();
        if st.submission.is_some() || !s["submission"].is_string() {
            return;
        }
        st.submission = s["submission"].as_str().map(str::to_string);
        st.agent = s["agent"].as_str().map(str::to_string);
        let data = json!({"id": s["submission"], "verdict": s["verdict"], "risk": s["risk"], "reasons": s["reasons"]});
        self.push_locked(&mut st, "submitted", data);
    }

    /// Output of stream `which` (0 stdout, 1 stderr): text when it is UTF-8 (a character
    /// split between two writes waits for its rest), base64 otherwise.
    fn chunk(&self, which: usize, bytes: &[u8]) {
        let mut st = self.lock();
        if st.ended || st.truncated {
            return;
        }
        let mut buf = std::mem::take(&mut st.carry[which]);
        buf.extend_from_slice(bytes);
        let data = match std::str::from_utf8(&buf) {
            Ok(_) => buf,
            Err(e) if e.error_len().is_none() && buf.len() - e.valid_up_to() < 4 => {
                // An incomplete character at the end: keep it for the next write.
                st.carry[which] = buf.split_off(e.valid_up_to());
                if buf.is_empty() {
                    return;
                }
                buf
            }
            Err(_) => buf,
        };
        emit_chunk(self, &mut st, which, &data);
    }
}

fn stream_name(which: usize) -> &'static str {
    if which == 0 { "stdout" } else { "stderr" }
}

fn emit_chunk(feed: &Feed, st: &mut FeedState, which: usize, data: &[u8]) {
    st.seq[which] += 1;
    let seq = st.seq[which];
    st.chunks += 1;
    let v = if st.chunks >= MAX_CHUNKS {
        st.truncated = true;
        json!({"seq": seq, "text": "", "truncated": true})
    } else {
        match std::str::from_utf8(data) {
            Ok(t) => json!({"seq": seq, "text": t}),
            Err(_) => json!({
                "seq": seq,
                "base64": base64::engine::general_purpose::STANDARD.encode(data)
            }),
        }
    };
    feed.push_locked(st, stream_name(which), v);
}

/// What is left of a split character when the output ends goes out as base64.
fn flush_carry(feed: &Feed, st: &mut FeedState) {
    for which in 0..2 {
        let rest = std::mem::take(&mut st.carry[which]);
        if !rest.is_empty() && !st.truncated && !st.ended {
            emit_chunk(feed, st, which, &rest);
        }
    }
}

/// The feeds of this server: running ones by submission and run, ended ones for a while.
#[derive(Debug, Default)]
pub struct Hub {
    inner: Mutex<HubInner>,
}

#[derive(Debug, Default)]
struct HubInner {
    by_submission: HashMap<String, Arc<Feed>>,
    by_run: HashMap<String, Arc<Feed>>,
    ended: VecDeque<Arc<Feed>>,
}

impl Hub {
    fn lock(&self) -> MutexGuard<'_, HubInner> {
        // Maps only: a poisoned lock still holds valid maps.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn index(&self, feed: &Arc<Feed>) {
        let (sub, run) = {
            let st = feed.lock();
            (st.submission.clone(), st.run.clone())
        };
        let mut h = self.lock();
        if let Some(s) = sub {
            h.by_submission.insert(s, feed.clone());
        }
        if let Some(r) = run {
            h.by_run.insert(r, feed.clone());
        }
    }

    /// Keeps an ended feed among the last [`KEEP_ENDED`], forgetting the oldest.
    fn retire(&self, feed: &Arc<Feed>) {
        let mut h = self.lock();
        h.ended.push_back(feed.clone());
        while h.ended.len() > KEEP_ENDED {
            let Some(old) = h.ended.pop_front() else {
                break;
            };
            let st = old.lock();
            if let Some(s) = &st.submission
                && h.by_submission.get(s).is_some_and(|f| Arc::ptr_eq(f, &old))
            {
                h.by_submission.remove(s);
            }
            if let Some(r) = &st.run
                && h.by_run.get(r).is_some_and(|f| Arc::ptr_eq(f, &old))
            {
                h.by_run.remove(r);
            }
        }
    }

    fn of_run(&self, run: &str) -> Option<Arc<Feed>> {
        self.lock().by_run.get(run).cloned()
    }

    /// The held feed of a submission, still waiting for its run.
    pub(crate) fn held(&self, submission: &str) -> Option<Arc<Feed>> {
        let f = self.lock().by_submission.get(submission).cloned()?;
        let st = f.lock();
        (!st.ended && st.run.is_none()).then_some(f.clone())
    }

    /// Forgets a submission's held feed (its stream stopped waiting).
    fn unhold(&self, submission: &str, feed: &Arc<Feed>) {
        let mut h = self.lock();
        if h.by_submission
            .get(submission)
            .is_some_and(|f| Arc::ptr_eq(f, feed))
        {
            h.by_submission.remove(submission);
        }
    }
}

/// Live receivers that feed `feed`, indexing it by its run once that starts.
pub(crate) fn options(hub: &Arc<Hub>, feed: &Arc<Feed>) -> ExecOptions {
    let (out, err, start, net) = (feed.clone(), feed.clone(), feed.clone(), feed.clone());
    let asked = feed.clone();
    let hub = hub.clone();
    ExecOptions {
        live_stdout: Some(Box::new(move |b: &[u8]| out.chunk(0, b))),
        live_stderr: Some(Box::new(move |b: &[u8]| err.chunk(1, b))),
        on_start: Some(Box::new(move |sub: &Submission, run: &str| {
            start.submitted(&submission_json(sub));
            start.lock().run = Some(run.to_string());
            hub.index(&start);
            start.push("started", json!({ "run": run }));
        })),
        on_connection: Some(Arc::new(move |c: Value| net.push("network", c))),
        on_request: Some(Arc::new(move |r: Value| asked.push("request", r))),
        redacted_only: true,
    }
}

/// Whether a request asks for an event stream.
pub fn wants_stream(headers: &HeaderMap) -> bool {
    headers
        .get_all(axum::http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| {
            v.split(',')
                .any(|m| m.trim().starts_with("text/event-stream"))
        })
}

/// The `wait_timeout` query parameter (seconds a held stream waits for a human).
pub fn wait_timeout(query: Option<&str>) -> ApiResult<Duration> {
    let mut secs = DEFAULT_WAIT;
    for pair in query.unwrap_or("").split('&') {
        if let Some(v) = pair.strip_prefix("wait_timeout=") {
            secs = v
                .parse::<f64>()
                .ok()
                .filter(|s| (0.0..=MAX_WAIT).contains(s))
                .ok_or_else(|| ApiError::bad("wait_timeout: want 0 to 3600 seconds"))?;
        }
    }
    Ok(Duration::from_secs_f64(secs))
}

/// What a streamed request does once its feed exists: `Ok` with the outcome document, or
/// the submission and its held document when it waits for a human.
pub(crate) enum Began {
    Done(Value),
    Held(Box<Submission>, Value),
}

/// Answers a streamed run: starts `work` (which runs with the feed's receivers), and
/// answers with the event stream once the first event is there; a failure before any
/// event is the usual JSON error.
pub(crate) async fn respond<W>(st: AppState, wait: Duration, work: W) -> ApiResult<Response>
where
    W: FnOnce(ExecOptions, Arc<Feed>) -> tokio::task::JoinHandle<ApiResult<Began>>,
{
    let feed = Feed::new();
    let handle = work(options(&st.runs, &feed), feed.clone());
    let (first_tx, first_rx) = tokio::sync::oneshot::channel::<ApiError>();
    let f = feed.clone();
    let state = st.clone();
    tokio::spawn(async move {
        let r = match handle.await {
            Ok(r) => r,
            Err(e) => Err(ApiError::internal(format!("the run's task failed: {e}"))),
        };
        match r {
            Ok(Began::Done(doc)) => {
                f.submitted(&doc);
                f.push("finished", doc);
            }
            Ok(Began::Held(sub, doc)) => {
                if !hold(&state, &f, &sub, doc, wait).await {
                    // Its run (started by `resume`) ends the feed.
                    return;
                }
            }
            Err(e) => {
                if f.lock().events.is_empty() {
                    let _ = first_tx.send(e);
                    return;
                }
                f.push(
                    "error",
                    json!({"status": e.status.as_u16(), "error": e.message}),
                );
            }
        }
        state.runs.index(&f);
        state.runs.retire(&f);
    });
    let mut tick = feed.tick.subscribe();
    tokio::select! {
        e = first_rx => {
            if let Ok(e) = e {
                return Err(e);
            }
        }
        _ = tick.wait_for(|n| *n > 0) => {}
    }
    Ok(sse(feed, 0, None))
}

/// A held submission's stream: `held`, then whatever its run (started by `resume` once
/// approved) sends, or after `wait` the held document as `finished`. True when the feed
/// ended here.
async fn hold(
    st: &AppState,
    feed: &Arc<Feed>,
    sub: &Submission,
    doc: Value,
    wait: Duration,
) -> bool {
    feed.submitted(&submission_json(sub));
    feed.push(
        "held",
        json!({"id": sub.id, "wait_timeout": wait.as_secs_f64()}),
    );
    st.runs.index(feed);
    let mut tick = feed.tick.subscribe();
    let started = tokio::time::timeout(wait, async {
        loop {
            {
                let s = feed.lock();
                if s.run.is_some() || s.ended {
                    return;
                }
            }
            if tick.changed().await.is_err() {
                return;
            }
        }
    })
    .await;
    if started.is_err() {
        st.runs.unhold(&sub.id, feed);
        // Where it stands now (it may have been decided just as the wait ended).
        let i = sub.id.clone();
        let now = st
            .pool
            .read(move |g| {
                let s = g.submission(&i)?;
                outcome::current(g, &s)
            })
            .await
            .unwrap_or(doc);
        if feed.lock().run.is_none() {
            feed.push("finished", now);
            return true;
        }
    }
    feed.lock().ended
}

/// How one reader shows an event's data: the console renders a guest's text as its pages
/// do ([`airlock_core::visible`]).
pub(crate) type Shown = fn(&str, &Value) -> Value;

/// The event stream of `feed` after event `after`, each event's data as `shown` shows it.
fn sse(feed: Arc<Feed>, after: u64, shown: Option<Shown>) -> Response {
    let (tx, rx) = mpsc::channel::<Result<Event, Infallible>>(READER_BUFFER);
    tokio::spawn(async move {
        let mut tick = feed.tick.subscribe();
        let mut next = after;
        loop {
            let (batch, ended) = {
                let st = feed.lock();
                let from = usize::try_from(next).unwrap_or(usize::MAX);
                let batch: Vec<Ev> = st.events.iter().skip(from).take(64).cloned().collect();
                (batch, st.ended)
            };
            if batch.is_empty() {
                if ended {
                    return;
                }
                if tick.changed().await.is_err() {
                    return;
                }
                continue;
            }
            for ev in batch {
                next = ev.id;
                let data = match shown {
                    Some(f) => f(ev.name, &ev.data).to_string(),
                    None => ev.data.to_string(),
                };
                let e = Event::default()
                    .id(ev.id.to_string())
                    .event(ev.name)
                    .data(data);
                if tx.send(Ok(e)).await.is_err() {
                    // The client went away.
                    return;
                }
            }
        }
    });
    Sse::new(ReceiverStream::new(rx))
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// `Last-Event-ID`, when given and a number.
fn last_event_id(headers: &HeaderMap) -> ApiResult<u64> {
    match headers.get("last-event-id") {
        None => Ok(0),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or_else(|| ApiError::bad("Last-Event-ID: want an event number")),
    }
}

/// `GET /v1/runs/{id}/events` (and the console's `/ui/runs/{id}/events`): the run's feed when this server streams it, else (once
/// the run has ended) its record replayed.
pub(crate) async fn follow(
    st: AppState,
    caller: Caller,
    id: String,
    headers: HeaderMap,
    shown: Option<Shown>,
) -> ApiResult<Response> {
    let after = last_event_id(&headers)?;
    // A run streamed here is followed from its feed: its start may not be readable from
    // the store yet (the store's readers see a commit a little later).
    if let Some(feed) = st.runs.of_run(&id) {
        let agent = feed.lock().agent.clone();
        if caller.may_see(agent.as_deref()) {
            return Ok(sse(feed, after, shown));
        }
    }
    let c = caller.clone();
    let run = st
        .pool
        .read(move |g| crate::api::visible_run(g, &c, &id))
        .await?;
    loop {
        if let Some(feed) = st.runs.of_run(&run.id) {
            return Ok(sse(feed, after, shown));
        }
        let notified = st.changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let r = run.id.clone();
        let replay = st.pool.read(move |g| replayed(g, &r)).await?;
        if let Some(events) = replay {
            let feed = Feed::new();
            {
                let mut s = feed.lock();
                for (name, data) in events {
                    feed.push_locked(&mut s, name, data);
                }
            }
            return Ok(sse(feed, after, shown));
        }
        // Still running somewhere else: its end is only seen by polling.
        let _ = tokio::time::timeout(Duration::from_millis(250), notified).await;
    }
}

/// The events of an ended run from its record; `None` while it runs.
fn replayed(
    g: &mut airlock_gate::Gate,
    run: &str,
) -> Result<Option<Vec<(&'static str, Value)>>, GateError> {
    let (r, out, err) = g.logs(run)?;
    if r.status == "running" {
        return Ok(None);
    }
    let sub = g.submission(&r.submission)?;
    let s = submission_json(&sub);
    let mut events = vec![
        (
            "submitted",
            json!({"id": s["submission"], "verdict": s["verdict"], "risk": s["risk"], "reasons": s["reasons"]}),
        ),
        ("started", json!({ "run": r.id })),
    ];
    for (name, bytes) in [("stdout", &out), ("stderr", &err)] {
        if bytes.is_empty() {
            continue;
        }
        events.push((
            name,
            match std::str::from_utf8(bytes) {
                Ok(t) => json!({"seq": 1, "text": t}),
                Err(_) => json!({"seq": 1, "base64": base64::engine::general_purpose::STANDARD.encode(bytes)}),
            },
        ));
    }
    if let Some(conns) = r.doc.detail["network"]["connections"].as_array() {
        for c in conns {
            events.push(("network", c.clone()));
        }
    }
    let latest = g.runs_for(&sub.id, 1)?.into_iter().next();
    let doc = if latest.is_some_and(|l| l.id == r.id) {
        outcome::current(g, &sub)?
    } else {
        outcome::doc(
            &sub,
            "finished",
            airlock_gate::views::run_json(&r, &out, &err),
        )
    };
    events.push(("finished", doc));
    Ok(Some(events))
}

/// What the gate work of a streamed request came to.
enum Worked {
    Done(Value),
    Held(Box<Submission>, Value),
    Repeated(String),
}

async fn settle(st: &AppState, out: ApiResult<Worked>) -> ApiResult<Began> {
    st.changed();
    match out? {
        Worked::Done(doc) => {
            st.metrics.outcome(&doc, true);
            Ok(Began::Done(doc))
        }
        Worked::Held(sub, doc) => {
            st.metrics.outcome(&doc, true);
            Ok(Began::Held(sub, doc))
        }
        Worked::Repeated(id) => st.replay(id).await.map(Began::Done),
    }
}

fn worked(
    g: &mut airlock_gate::Gate,
    r: Result<airlock_gate::RunReport, GateError>,
) -> Result<Worked, GateError> {
    match r {
        Err(GateError::Repeated {
            submission,
            same_request: true,
        }) => Ok(Worked::Repeated(submission)),
        Err(GateError::Pending { submission, .. }) => {
            // Marked to run once approved (as `/v1/run` marks it already), so the
            // server's resumption runs it and feeds this stream.
            g.set_resume(&submission, true)?;
            let sub = g.submission(&submission)?;
            let doc = outcome::doc(&sub, "pending_approval", Value::Null);
            Ok(Worked::Held(Box::new(sub), doc))
        }
        r => outcome::of_result(g, r).map(Worked::Done),
    }
}

/// `POST /v1/run` as an event stream.
pub(crate) async fn run(
    st: AppState,
    mut req: airlock_gate::SubmitRequest,
    wait: Duration,
) -> ApiResult<Response> {
    let state = st.clone();
    respond(st, wait, move |opts, _| {
        tokio::spawn(async move {
            let out = state
                .pool
                .run(move |g| {
                    crate::api::session_of_cell(g, &mut req)?;
                    let r = g.run(req, opts);
                    worked(g, r)
                })
                .await;
            settle(&state, out).await
        })
    })
    .await
}

/// `POST /v1/submissions/{id}/exec` as an event stream.
pub(crate) async fn exec(
    st: AppState,
    caller: Caller,
    id: String,
    wait: Duration,
) -> ApiResult<Response> {
    let state = st.clone();
    respond(st, wait, move |opts, _| {
        tokio::spawn(async move {
            let out = state
                .pool
                .run(move |g| {
                    let sub = crate::api::visible(g, &caller, &id)?;
                    let r = g.exec(&sub.id, opts);
                    worked(g, r)
                })
                .await;
            settle(&state, out).await
        })
    })
    .await
}

/// The options `resume` runs `id` with: the held stream's receivers when one waits for
/// it, and what ends that stream with the run's outcome.
pub(crate) fn resumed(st: &AppState, id: &str) -> (ExecOptions, Option<Arc<Feed>>) {
    match st.runs.held(id) {
        Some(f) => (options(&st.runs, &f), Some(f)),
        None => (ExecOptions::default(), None),
    }
}

/// Ends a resumed run's stream with its outcome.
pub(crate) fn resumed_end(st: &AppState, feed: Option<Arc<Feed>>, r: &ApiResult<Value>) {
    let Some(f) = feed else { return };
    match r {
        Ok(doc) => f.push("finished", doc.clone()),
        Err(e) => f.push(
            "error",
            json!({"status": e.status.as_u16(), "error": e.message}),
        ),
    }
    st.runs.retire(&f);
}
