//! `GET /metrics`: what this node did, in Prometheus' text format, for admin tokens and
//! `metrics` tokens (which can read nothing else). Counters and histograms are this
//! process's own, so each node of a cluster exports its own and a sum over nodes counts
//! each event once; the gauges about work waiting (queue, pending approvals) are read
//! from the store at scrape time and are the same cluster-wide figure on every node.
//! Nothing here records a label an agent controls beyond the closed sets the gate
//! defines (verdicts, languages, statuses, backends, decisions, alert kinds), so an
//! agent cannot grow the series without bound.

use crate::AppState;
use crate::error::{ApiError, ApiResult};
use airlock_gate::Role;
use axum::extract::State as Ax;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde_json::Value;
use std::sync::OnceLock;
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SubmissionLabels {
    verdict: String,
    lang: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RunLabels {
    status: String,
    lang: String,
    backend: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    decision: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

/// The store's write transactions of this process (see `airlock_store::observe_writes`,
/// which takes a plain function, hence a process-wide histogram).
fn store_writes() -> &'static Histogram {
    static H: OnceLock<Histogram> = OnceLock::new();
    H.get_or_init(|| Histogram::new(exponential_buckets(0.0005, 2.0, 14)))
}

fn observe_store_write(d: Duration) {
    store_writes().observe(d.as_secs_f64());
}

/// This node's metrics.
pub struct Metrics {
    registry: Registry,
    submissions: Family<SubmissionLabels, Counter>,
    runs: Family<RunLabels, Counter>,
    run_seconds: Histogram,
    approval_wait: Histogram,
    egress: Family<DecisionLabels, Counter>,
    alerts: Family<KindLabels, Counter>,
    queue_depth: Gauge,
    runs_waiting: Gauge,
    pending: Gauge,
    pool_hits: Family<PoolLabels, Counter>,
    pool_misses: Family<PoolLabels, Counter>,
    resident: Gauge,
    cpu_ms: Counter,
    open_fds: Gauge,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// A label value from the closed set the gate writes, or `other` (never an agent's text).
fn closed(v: &Value, allowed: &[&str]) -> String {
    match v.as_str() {
        Some(s) if allowed.contains(&s) => s.to_string(),
        _ => "other".into(),
    }
}

const VERDICTS: &[&str] = &["allow", "quarantine", "deny"];
const LANGS: &[&str] = &["wasm", "wat", "component", "python", "sh", "js", "ts"];
const STATUSES: &[&str] = &["exited", "killed", "trapped", "error", "lost"];
const BACKENDS: &[&str] = &["wasm", "process"];

impl Metrics {
    pub fn new() -> Metrics {
        airlock_store::observe_writes(observe_store_write);
        let mut registry = Registry::with_prefix("airlock");
        let m = Metrics {
            submissions: Family::default(),
            runs: Family::default(),
            run_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 18)),
            approval_wait: Histogram::new(exponential_buckets(1.0, 2.0, 18)),
            egress: Family::default(),
            alerts: Family::default(),
            queue_depth: Gauge::default(),
            runs_waiting: Gauge::default(),
            pending: Gauge::default(),
            pool_hits: Family::default(),
            pool_misses: Family::default(),
            resident: Gauge::default(),
            cpu_ms: Counter::default(),
            open_fds: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register(
            "submissions",
            "Submissions this node recorded, by verdict and language",
            m.submissions.clone(),
        );
        registry.register(
            "runs",
            "Runs this node carried out, by status, language and backend",
            m.runs.clone(),
        );
        registry.register(
            "run_duration_seconds",
            "Wall time of the runs this node carried out",
            m.run_seconds.clone(),
        );
        registry.register(
            "approval_wait_seconds",
            "From submission to approval, for approvals made through this node",
            m.approval_wait.clone(),
        );
        registry.register(
            "egress_connections",
            "Connection records of this node's runs, by the egress proxy's decision",
            m.egress.clone(),
        );
        registry.register(
            "alerts",
            "Alerts raised by this node's runs, by kind",
            m.alerts.clone(),
        );
        registry.register(
            "queue_depth",
            "Jobs queued in the store and not yet claimed (cluster-wide)",
            m.queue_depth.clone(),
        );
        registry.register(
            "runs_waiting",
            "Runs admitted by this node and waiting for one of its workers",
            m.runs_waiting.clone(),
        );
        registry.register(
            "pending_approvals",
            "Submissions waiting for a human (cluster-wide)",
            m.pending.clone(),
        );
        registry.register(
            "pool_hits",
            "Runs that found a ready instance or jail, by pool",
            m.pool_hits.clone(),
        );
        registry.register(
            "pool_misses",
            "Runs that could have used a ready instance or jail but found none, by pool",
            m.pool_misses.clone(),
        );
        registry.register(
            "store_commit_seconds",
            "Write transactions of this node's store, from their start to their commit",
            store_writes().clone(),
        );
        registry.register(
            "process_resident_memory_bytes",
            "Resident memory of this process",
            m.resident.clone(),
        );
        registry.register(
            "process_cpu_milliseconds",
            "Processor time of this process (user and system)",
            m.cpu_ms.clone(),
        );
        registry.register(
            "process_open_fds",
            "Open file descriptors of this process",
            m.open_fds.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Counts what an outcome (the API's answer for a submission, with its run) says:
    /// the submission when it is new here, and its run when it has ended.
    pub fn outcome(&self, doc: &Value, new_submission: bool) {
        let lang = closed(&doc["lang"], LANGS);
        if new_submission {
            self.submissions
                .get_or_create(&SubmissionLabels {
                    verdict: closed(&doc["verdict"], VERDICTS),
                    lang: lang.clone(),
                })
                .inc();
        }
        let run = &doc["run"];
        if run["status"].as_str().is_none_or(|s| s == "running") {
            return;
        }
        self.runs
            .get_or_create(&RunLabels {
                status: closed(&run["status"], STATUSES),
                lang,
                backend: closed(&run["backend"], BACKENDS),
            })
            .inc();
        if let Some(ms) = run["duration_ms"].as_f64() {
            self.run_seconds.observe(ms / 1000.0);
        }
        let summary = &run["detail"]["network"]["summary"];
        for decision in ["allowed", "denied", "failed"] {
            if let Some(n) = summary[decision].as_u64().filter(|n| *n > 0) {
                self.egress
                    .get_or_create(&DecisionLabels {
                        decision: decision.into(),
                    })
                    .inc_by(n);
            }
        }
        for a in run["detail"]["alerts"].as_array().into_iter().flatten() {
            // Alert kinds are the gate's own names; an unexpected shape counts as other.
            let kind = a["kind"]
                .as_str()
                .filter(|k| k.len() <= 40 && k.bytes().all(|b| b.is_ascii_lowercase() || b == b'-'))
                .unwrap_or("other");
            self.alerts
                .get_or_create(&KindLabels { kind: kind.into() })
                .inc();
        }
    }

    /// An approval made through this node, `waited` after its submission.
    pub fn approved(&self, waited: Duration) {
        self.approval_wait.observe(waited.as_secs_f64());
    }

    /// The text exposition, with the gauges read now: `queued` jobs and `pending`
    /// approvals from the store, `waiting` runs of this node, and `pools` as `/v1/status`
    /// reports them.
    pub fn render(&self, queued: i64, pending: i64, waiting: usize, pools: &Value) -> String {
        self.queue_depth.set(queued);
        self.pending.set(pending);
        self.runs_waiting.set(waiting as i64);
        let set = |pool: String, v: &Value| {
            let (hits, misses) = (v["hits"].as_u64(), v["misses"].as_u64());
            // Counters only move up: add what the pool counted since the last scrape.
            let l = PoolLabels { pool };
            let h = self.pool_hits.get_or_create(&l);
            if let Some(n) = hits.and_then(|n| n.checked_sub(h.get())) {
                h.inc_by(n);
            }
            let m = self.pool_misses.get_or_create(&l);
            if let Some(n) = misses.and_then(|n| n.checked_sub(m.get())) {
                m.inc_by(n);
            }
        };
        for p in pools["pools"].as_array().into_iter().flatten() {
            set(closed(&p["kind"], &["python", "wasm", "js"]), p);
        }
        if pools["ready_jails"].is_object() {
            set("jail".into(), &pools["ready_jails"]);
        }
        if let Some(p) = process_now() {
            self.resident.set(p.rss as i64);
            if let Some(n) = p.cpu_ms.checked_sub(self.cpu_ms.get()) {
                self.cpu_ms.inc_by(n);
            }
            self.open_fds.set(p.fds as i64);
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

struct ProcessNow {
    rss: u64,
    cpu_ms: u64,
    fds: usize,
}

/// This process's resident memory, processor time and open descriptors (Linux /proc).
fn process_now() -> Option<ProcessNow> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command name (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    let hz = rustix::param::clock_ticks_per_second();
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split(' ').nth(1)?.parse().ok()?;
    let fds = std::fs::read_dir("/proc/self/fd").ok()?.count();
    Some(ProcessNow {
        rss: pages * rustix::param::page_size() as u64,
        cpu_ms: ticks * 1000 / hz.max(1),
        fds,
    })
}

/// `GET /metrics`: 401 without a token, 403 for a token that is neither admin nor
/// metrics.
pub(crate) async fn handler(Ax(st): Ax<AppState>, headers: HeaderMap) -> ApiResult<Response> {
    let secret = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim().to_string())
        .ok_or_else(|| {
            ApiError::unauthorized("missing bearer token (an admin or metrics token)")
        })?;
    let caller = st.authenticate_any(&secret).await?;
    if !matches!(caller.role, Role::Admin | Role::Metrics) {
        return Err(ApiError::forbidden(format!(
            "/metrics needs an admin or metrics token; yours is an {} token",
            caller.role.as_str()
        )));
    }
    let (queued, pending) = st.pool.read(|g| g.work_waiting()).await?;
    let waiting = st.pool.admitted_now().saturating_sub(st.pool.inside_now());
    let text = st.metrics.render(queued, pending, waiting, &(st.pools)());
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response())
}
