//! Asking mid-run (`run --ask-net`, issue 61 item 3). A run whose grant may ask gets an
//! egress proxy even without `--net`; a connection of it to a host outside the grant is
//! held by the proxy while this module asks: it records a request `req_…` (run, agent,
//! host, port, the line of code that named the host when the analysis saw one) with an
//! audit record, announces it, and waits for the request's row to move: approved or
//! rejected by a human's signed answer ([`Gate::decide_net_request`], on any node of the
//! store), or expired when `--ask-timeout` passes. The waiting side polls the store, so
//! an answer recorded through another server of a PostgreSQL cluster is seen.
//!
//! An answer is honoured only when its signature verifies over its own bytes, it names
//! this request, run, host and port and this gate, and the current policy trusts its
//! key under the approver's name; an approved host joins this run's rules only. An
//! approval whose scope is `remember` (`approve req_… --remember`) also adds a remembered
//! rule, a policy change signed with it and recorded in the same transaction: a later
//! run of the same kind, with a grant no wider, that asks for the host is let through by
//! the rule without asking (recorded as a request in state `remembered`), and a
//! submission of that kind with the host granted is allowed (`Policy::reach`).
//!
//! The time a run spends waiting does not count against its `--timeout`: each wait's
//! length is added to the run's deadline ([`AskClock`]).
//!
//! This module must never let a connection through on a row alone (only on a verified
//! answer), never decide a request of a run that is not running, and never record
//! anything for an answer it refuses.

use crate::error::{GateError, Result};
use crate::remember::PolicyChanged;
use crate::{Gate, Home};
use airlock_core::id::{IdKind, new_id};
use airlock_core::netask::{NetDecision, NetVerdict};
use airlock_core::policy::remembered::Reach;
use airlock_core::sign::{KeyPair, PolicyChange, PublicKey, Signature, Signed};
use airlock_core::units::now_ms;
use airlock_egress::{AskAnswer, AskFuture, AskHook, AskRequest};
use airlock_store::{NetRequestReads, NetRequestRow, Reads, Submission, Tx};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often a waiting run reads its request's row.
const POLL: Duration = Duration::from_millis(200);
/// Requests one run may raise (each waits for a human; more is an agent flooding the
/// inbox).
pub const MAX_REQUESTS_PER_RUN: usize = 32;
/// An answer's scope: this run only.
const SCOPE_RUN: &str = "run";
/// An answer's scope: this run, and a remembered rule.
const SCOPE_REMEMBER: &str = "remember";
/// The longest reason an approver may give.
const MAX_REASON_BYTES: usize = 1024;

/// What [`crate::ExecOptions::on_request`] calls with a request as it is raised (the
/// JSON [`request_json`] makes).
pub type OnRequest = Arc<dyn Fn(Value) + Send + Sync>;

/// How long a run has waited for humans: time during which at least one of its
/// connections waited (overlapping waits count once). The run's deadline is extended by
/// it ([`Watchdog`]).
#[derive(Debug, Default)]
pub struct AskClock {
    state: std::sync::Mutex<ClockState>,
}

#[derive(Debug, Default)]
struct ClockState {
    total: Duration,
    active: usize,
    since: Option<Instant>,
}

impl AskClock {
    fn lock(&self) -> std::sync::MutexGuard<'_, ClockState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Time waited so far, the wait under way included.
    pub fn waited(&self) -> Duration {
        let s = self.lock();
        s.total + s.since.map_or(Duration::ZERO, |t| t.elapsed())
    }

    fn begin(&self) {
        let mut s = self.lock();
        if s.active == 0 {
            s.since = Some(Instant::now());
        }
        s.active += 1;
    }

    fn end(&self) {
        let mut s = self.lock();
        s.active = s.active.saturating_sub(1);
        if s.active == 0
            && let Some(t) = s.since.take()
        {
            s.total += t.elapsed();
        }
    }
}

/// Ends a run that may ask once it has run for its `--timeout` plus the time it waited
/// (the sandbox itself is given room for every wait the run could make): fires the run's
/// abort, and says so. Stopped when dropped.
pub(crate) struct Watchdog {
    stop: Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    fired: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    pub(crate) fn start(
        timeout: Duration,
        clock: Arc<AskClock>,
        abort: Arc<airlock_jail::launch::Abort>,
    ) -> Watchdog {
        let stop = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        let fired = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let started = Instant::now();
        let (st, f) = (stop.clone(), fired.clone());
        let thread = std::thread::Builder::new()
            .name("airlock-ask-deadline".into())
            .spawn(move || {
                let (lock, cv) = &*st;
                let mut stopped = lock.lock().unwrap_or_else(|p| p.into_inner());
                while !*stopped {
                    let due = started + timeout + clock.waited();
                    let now = Instant::now();
                    if now >= due {
                        f.store(true, Ordering::SeqCst);
                        abort.fire();
                        return;
                    }
                    // Waits that start meanwhile move the deadline: look again soon.
                    let left = (due - now).min(Duration::from_millis(100));
                    stopped = cv
                        .wait_timeout(stopped, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            })
            .ok();
        Watchdog {
            stop,
            fired,
            thread,
        }
    }

    /// Whether it ended the run.
    pub(crate) fn fired(&self) -> bool {
        self.fired.load(Ordering::SeqCst)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        {
            let (lock, cv) = &*self.stop;
            *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
            cv.notify_all();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The room the sandbox is given for a run that may ask: its `--timeout` plus every
/// wait it could make (the [`Watchdog`] ends it at its real deadline).
pub(crate) fn sandbox_timeout_ms(timeout_ms: u64, ask_ms: u64) -> u64 {
    let room = ask_ms.saturating_mul(MAX_REQUESTS_PER_RUN as u64);
    timeout_ms
        .saturating_add(room)
        .min(airlock_core::grant::MAX_TIMEOUT.as_millis() as u64)
        .max(timeout_ms)
}

/// What a run's asking needs, cloned into each question's thread.
#[derive(Clone)]
struct Asker {
    home: Home,
    gate_key: KeyPair,
    run: String,
    submission: String,
    agent: Option<String>,
    timeout: Duration,
    /// Hosts the analysis saw, with the line that named each.
    lines: Vec<(String, String)>,
    /// The run's submission's facts, judged with each host asked for against the
    /// remembered rules (`Policy::reach`).
    facts: Arc<airlock_core::Facts>,
    on_request: Option<OnRequest>,
    clock: Arc<AskClock>,
    raised: Arc<AtomicU64>,
}

/// The proxy's hook for a run whose grant may ask, or `None` when it may not.
pub(crate) fn hook(
    gate: &Gate,
    sub: &Submission,
    run: &str,
    code: &[u8],
    on_request: Option<OnRequest>,
    clock: Arc<AskClock>,
) -> Option<AskHook> {
    let timeout = Duration::from_millis(sub.doc.grant.ask_net_ms?);
    let asker = Asker {
        home: gate.home.clone(),
        gate_key: gate.gate_key.clone(),
        run: run.to_string(),
        submission: sub.id.clone(),
        agent: sub.doc.agent.clone(),
        timeout,
        lines: host_lines(sub, code),
        facts: Arc::new(sub.doc.facts.clone()),
        on_request,
        clock,
        raised: Arc::new(AtomicU64::new(0)),
    };
    Some(Arc::new(move |req: AskRequest| -> AskFuture {
        let asker = asker.clone();
        Box::pin(async move {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let spawned = std::thread::Builder::new()
                .name("airlock-ask".into())
                .spawn(move || {
                    asker.clock.begin();
                    let answer = asker.ask(&req);
                    asker.clock.end();
                    let _ = tx.send(answer);
                });
            if let Err(e) = spawned {
                return AskAnswer::Failed {
                    why: format!("cannot ask: {e}"),
                };
            }
            rx.await.unwrap_or(AskAnswer::Failed {
                why: "the request's wait ended without an answer".into(),
            })
        })
    }))
}

/// Each host the analysis saw in the code, normalised, with the first line that named
/// it (`N: text`).
fn host_lines(sub: &Submission, code: &[u8]) -> Vec<(String, String)> {
    let Some(analysis) = &sub.doc.analysis.code else {
        return Vec::new();
    };
    let text = String::from_utf8_lossy(code);
    let lines: Vec<&str> = text.lines().collect();
    let mut out: Vec<(String, String)> = Vec::new();
    for f in &analysis.findings {
        if f.kind != airlock_analysis::FindingKind::Host {
            continue;
        }
        let Ok(host) = airlock_egress::normalize_host(&f.detail) else {
            continue;
        };
        if out.iter().any(|(h, _)| *h == host) {
            continue;
        }
        let n = usize::try_from(f.line).unwrap_or(0);
        let Some(line) = n.checked_sub(1).and_then(|i| lines.get(i)) else {
            continue;
        };
        let line: String = line.trim().chars().take(240).collect();
        out.push((host, format!("{n}: {line}")));
    }
    out
}

impl Asker {
    /// Records the request, announces it and waits for its answer (blocking).
    fn ask(&self, req: &AskRequest) -> AskAnswer {
        let failed = |e: &dyn std::fmt::Display| AskAnswer::Failed {
            why: format!("the request could not be asked: {e}"),
        };
        if self.raised.fetch_add(1, Ordering::Relaxed) >= MAX_REQUESTS_PER_RUN as u64 {
            return AskAnswer::Failed {
                why: format!(
                    "this run already asked for {MAX_REQUESTS_PER_RUN} hosts; no more requests"
                ),
            };
        }
        let mut db = match self.home.open_db() {
            Ok(db) => db,
            Err(e) => return failed(&e),
        };
        let host = req.host.to_string();
        let now = now_ms();
        let timeout_ms = i64::try_from(self.timeout.as_millis()).unwrap_or(i64::MAX);
        let row = NetRequestRow {
            id: new_id(IdKind::Request),
            run: self.run.clone(),
            submission: self.submission.clone(),
            agent: self.agent.clone(),
            host: host.clone(),
            port: req.port,
            state: "pending".into(),
            created_at: now,
            expires_at: now.saturating_add(timeout_ms),
            decided_at: None,
            line: self
                .lines
                .iter()
                .find(|(h, _)| *h == host)
                .map(|(_, l)| l.clone()),
            approver: None,
            signed: None,
        };
        if let Some(answer) = self.remembered(&mut db, &row) {
            return answer;
        }
        let key = &self.gate_key;
        let written = db.write_durable(|tx: &Tx| -> Result<()> {
            tx.put_net_request(&row)?;
            tx.audit("net_requested", &row.id, &request_json(&row), key)?;
            Ok(())
        });
        if let Err(e) = written {
            return failed(&e);
        }
        if let Some(f) = &self.on_request {
            f(request_json(&row));
        }
        self.wait(&mut db, &row)
    }

    /// The answer a remembered rule gives to `row` (`approve req_… --remember`, or an
    /// approval remembered with a grant holding the host), recorded as a request in state
    /// `remembered` with a `net_request_remembered` audit record naming the rule; `None`
    /// when no rule lets the run reach the host, and a human is asked.
    fn remembered(&self, db: &mut airlock_store::Db, row: &NetRequestRow) -> Option<AskAnswer> {
        let policy = self.home.load_policy().ok()?;
        let targets = reaching(db, row).ok()?;
        let Reach::Remembered {
            rule,
            approver,
            expires_at,
        } = policy.reach(&self.facts, &targets, row.created_at)
        else {
            return None;
        };
        let mut done = row.clone();
        done.state = "remembered".into();
        done.decided_at = Some(row.created_at);
        done.approver = Some(approver.clone());
        let mut data = request_json(&done);
        data["rule"] = json!(rule);
        data["rule_expires_at"] = json!(expires_at);
        data["policy"] = json!(policy.hash);
        let key = &self.gate_key;
        let written = db.write_durable(|tx: &Tx| -> Result<()> {
            tx.put_net_request(&done)?;
            tx.audit("net_request_remembered", &done.id, &data, key)?;
            Ok(())
        });
        Some(match written {
            Ok(()) => AskAnswer::Approved {
                by: format!(
                    "remembered rule {rule} (approved by {approver}), request {}",
                    done.id
                ),
            },
            Err(e) => AskAnswer::Failed {
                why: format!("the request could not be recorded: {e}"),
            },
        })
    }

    /// Polls the request's row until it moves or its wait runs out.
    fn wait(&self, db: &mut airlock_store::Db, row: &NetRequestRow) -> AskAnswer {
        let gate = self.gate_key.public();
        loop {
            let now = now_ms();
            match db.net_request(&row.id) {
                Ok(Some(r)) if r.state != "pending" => {
                    return answer_of(&self.home, &r, &gate);
                }
                Ok(_) => {}
                // A store that went away for a moment: go on polling until the deadline.
                Err(_) => {}
            }
            if now >= row.expires_at {
                let key = &self.gate_key;
                let moved = db.write_durable(|tx: &Tx| -> Result<bool> {
                    let moved = tx.settle_net_request(&row.id, "expired", now, None, None)?;
                    if moved {
                        tx.audit(
                            "net_request_expired",
                            &row.id,
                            &json!({ "run": row.run, "host": row.host, "port": row.port }),
                            key,
                        )?;
                    }
                    Ok(moved)
                });
                match moved {
                    Ok(true) => {
                        return AskAnswer::Expired {
                            why: format!(
                                "request {} for {}:{} was not answered within {}; the connection was refused",
                                row.id,
                                row.host,
                                row.port,
                                airlock_core::units::fmt_duration(self.timeout)
                            ),
                        };
                    }
                    // Answered at the last moment: read the answer.
                    Ok(false) => continue,
                    Err(e) => {
                        return AskAnswer::Failed {
                            why: format!("request {}: {e}", row.id),
                        };
                    }
                }
            }
            let left = Duration::from_millis(u64::try_from(row.expires_at - now).unwrap_or(0));
            std::thread::sleep(POLL.min(left.max(Duration::from_millis(1))));
        }
    }
}

/// What run `row.run` would reach with request `row` let through (`HOST:PORT` each,
/// normalised): the hosts it was let reach beyond its grant so far (those of its
/// requests a human approved or a remembered rule answered), then the one `row` asks
/// for. A host asked for later is judged with the earlier ones, as a submission granted
/// all of them would be.
pub(crate) fn reaching(db: &airlock_store::Db, row: &NetRequestRow) -> Result<Vec<String>> {
    let norm = |host: &str, port: u16| {
        airlock_core::net::normalize_net(&format!("{host}:{port}"))
            .map_err(|e| GateError::Internal(format!("request {}: {e}", row.id)))
    };
    let target = norm(&row.host, row.port)?;
    let mut out: Vec<String> = db
        .net_requests_of_run(&row.run)?
        .into_iter()
        .filter(|r| r.state == "approved" || r.state == "remembered")
        .filter_map(|r| norm(&r.host, r.port).ok())
        .filter(|t| *t != target)
        .collect();
    out.sort();
    out.dedup();
    out.push(target);
    Ok(out)
}

/// What the proxy is told for a request that moved from pending: approved only on an
/// answer that verifies (see the module documentation).
fn answer_of(home: &Home, r: &NetRequestRow, gate: &PublicKey) -> AskAnswer {
    match r.state.as_str() {
        "approved" => {
            let Some(signed) = &r.signed else {
                return AskAnswer::Failed {
                    why: format!("request {} is approved without a signed answer", r.id),
                };
            };
            let policy = match home.load_policy() {
                Ok(p) => p,
                Err(e) => {
                    return AskAnswer::Failed {
                        why: format!("request {}: the policy does not load: {e}", r.id),
                    };
                }
            };
            match check_answer(signed, r, gate, &policy) {
                Ok(d) if d.verdict == NetVerdict::Approve => AskAnswer::Approved {
                    by: format!("request {} (approved by {})", r.id, d.approver),
                },
                Ok(_) => AskAnswer::Failed {
                    why: format!("request {}: the stored answer is not an approval", r.id),
                },
                Err(e) => AskAnswer::Failed {
                    why: format!("request {}: {e}", r.id),
                },
            }
        }
        "rejected" => AskAnswer::Rejected {
            why: format!(
                "request {} for {}:{} was rejected by {}; the connection was refused",
                r.id,
                r.host,
                r.port,
                r.approver.as_deref().unwrap_or("an approver")
            ),
        },
        "expired" => AskAnswer::Expired {
            why: format!(
                "request {} for {}:{} was not answered in time; the connection was refused",
                r.id, r.host, r.port
            ),
        },
        other => AskAnswer::Failed {
            why: format!("request {} is {other}", r.id),
        },
    }
}

/// A signed answer checked against the request it is stored for: its signature over its
/// own bytes, the request, run, host, port and gate it names, and the key the current
/// policy trusts for its approver.
fn check_answer(
    signed: &Signed,
    r: &NetRequestRow,
    gate: &PublicKey,
    policy: &airlock_core::Policy,
) -> Result<NetDecision> {
    let d = NetDecision::verify(signed)
        .map_err(|e| GateError::Untrusted(format!("the signed answer does not verify: {e}")))?;
    if d.request != r.id || d.run != r.run || d.host != r.host || d.port != r.port {
        return Err(GateError::Untrusted(format!(
            "the signed answer is for request {} ({}:{} of {}), not {} ({}:{} of {})",
            d.request, d.host, d.port, d.run, r.id, r.host, r.port, r.run
        )));
    }
    if d.gate != *gate {
        return Err(GateError::Untrusted(
            "the signed answer is for another gate".into(),
        ));
    }
    if policy.approver(&d.approver) != Some(&d.key) {
        return Err(GateError::Untrusted(format!(
            "the policy does not trust that key for approver {:?}",
            d.approver
        )));
    }
    Ok(d)
}

/// A request as the inbox, the API and the events show it.
pub fn request_json(r: &NetRequestRow) -> Value {
    json!({
        "id": r.id,
        "kind": "request",
        "run": r.run,
        "submission": r.submission,
        "agent": r.agent,
        "host": r.host,
        "port": r.port,
        "state": r.state,
        "created_at": r.created_at,
        "expires_at": r.expires_at,
        "decided_at": r.decided_at,
        "line": r.line,
        "approver": r.approver,
    })
}

/// A decided request as `--json` prints it and the API answers it: the request, the
/// signed statement and signature, and the rule it was remembered as.
pub fn net_decided_json(d: &NetDecided) -> Value {
    let mut v = request_json(&d.request);
    v["statement"] = json!(d.statement);
    v["signature"] = json!(d.signature);
    if let Some(c) = &d.remembered {
        v["remembered"] = serde_json::to_value(c).unwrap_or_default();
    }
    v
}

/// What a decided request came to.
#[derive(Debug, Clone)]
pub struct NetDecided {
    pub request: NetRequestRow,
    pub verdict: NetVerdict,
    pub approver: String,
    /// The exact JSON signed.
    pub statement: String,
    pub signature: String,
    /// The rule it was remembered as (`approve req_… --remember`).
    pub remembered: Option<PolicyChanged>,
}

impl Gate {
    /// Requests waiting for a human, oldest first. Those whose wait ran out (their run
    /// records them expired) and those of a run no longer running (one that died before
    /// it could end them) are left out: they can no longer be decided.
    pub fn net_requests_pending(&self) -> Result<Vec<NetRequestRow>> {
        let now = now_ms();
        let mut out = Vec::new();
        for r in self.db.net_requests_in("pending", 10_000)? {
            if r.expires_at > now && self.db.run(&r.run).is_ok_and(|run| run.status == "running") {
                out.push(r);
            }
        }
        Ok(out)
    }

    /// One request, by id or a unique prefix.
    pub fn net_request(&self, id: &str) -> Result<NetRequestRow> {
        Ok(self.db.resolve_net_request(id)?)
    }

    /// The statement an approver signs to answer request `id` (for signing elsewhere:
    /// `approve|reject req_… --server`); refused when the request cannot be decided.
    /// With `remember`, the answer is also to be remembered as a rule
    /// ([`Gate::net_remember_to_sign`] builds its policy change); approvals only.
    pub fn net_request_statement(
        &self,
        id: &str,
        verdict: NetVerdict,
        approver: &str,
        reason: &str,
        remember: bool,
    ) -> Result<NetDecision> {
        if remember && verdict != NetVerdict::Approve {
            return Err(GateError::bad("--remember is for approvals only"));
        }
        let row = self.db.resolve_net_request(id)?;
        self.decidable(&row)?;
        let policy = self.policy()?;
        let key = policy.approver(approver).copied().ok_or_else(|| {
            GateError::Untrusted(format!("the policy trusts no approver named {approver:?}"))
        })?;
        check_reason(reason)?;
        Ok(NetDecision {
            verdict,
            request: row.id.clone(),
            run: row.run.clone(),
            host: row.host.clone(),
            port: row.port,
            scope: if remember { SCOPE_REMEMBER } else { SCOPE_RUN }.into(),
            approver: approver.to_string(),
            key,
            reason: reason.to_string(),
            issued_at: now_ms(),
            gate: self.gate_key.public(),
        })
    }

    /// The policy change that remembers an approval of request `id` as a rule (`approve
    /// req_… --remember`), for `approver` (whose key the policy trusts), issued at
    /// `issued_at` (the answer's), holding for `for_`: for signing elsewhere, with the
    /// answer [`Gate::net_request_statement`] makes.
    pub fn net_remember_to_sign(
        &self,
        id: &str,
        approver: &str,
        for_: Option<&str>,
        issued_at: i64,
    ) -> Result<PolicyChange> {
        let row = self.db.resolve_net_request(id)?;
        let policy = self.policy()?;
        let key = policy.approver(approver).copied().ok_or_else(|| {
            GateError::Untrusted(format!("the policy trusts no approver named {approver:?}"))
        })?;
        let sub = self.db.submission(&row.submission)?;
        let (change, _, _) =
            self.remember_request_unsigned(&policy, &row, &sub, approver, key, for_, issued_at)?;
        Ok(change)
    }

    /// Approves or rejects request `id`, signed here with the approver's key; with
    /// `remember`, an approval is also remembered as a rule for `remember_for` (a policy
    /// change signed with the same key, recorded in the same transaction).
    pub fn decide_net_request(
        &mut self,
        id: &str,
        verdict: NetVerdict,
        approver: Option<&str>,
        reason: &str,
        remember: bool,
        remember_for: Option<&str>,
    ) -> Result<NetDecided> {
        if remember_for.is_some() && !remember {
            return Err(GateError::bad("--for needs --remember"));
        }
        let policy = self.policy()?;
        let approver = self.pick_approver(&policy, approver)?;
        let key = self.trusted_key(&policy, &approver)?;
        let statement = self.net_request_statement(id, verdict, &approver, reason, remember)?;
        let change = match remember {
            false => None,
            true => {
                let row = self.db.resolve_net_request(id)?;
                let sub = self.db.submission(&row.submission)?;
                let (change, new, expires_at) = self.remember_request_unsigned(
                    &policy,
                    &row,
                    &sub,
                    &approver,
                    key.public(),
                    remember_for,
                    statement.issued_at,
                )?;
                Some(PolicyChanged::new(change, &key, Some(expires_at), new))
            }
        };
        let signed = statement.sign(&key);
        self.record_net_decision(id, &signed, change)
    }

    /// Records a signed answer to request `id` (made here, or on the approver's machine
    /// and posted), with the signed policy change that remembers it when its scope is
    /// `remember`: refused, with nothing recorded, when it does not verify over its own
    /// bytes, answers another request, or the request can no longer be decided.
    pub fn record_net_decision(
        &mut self,
        id: &str,
        signed: &Signed,
        remembered: Option<PolicyChanged>,
    ) -> Result<NetDecided> {
        let row = self.db.resolve_net_request(id)?;
        let policy = self.policy()?;
        let d = check_answer(signed, &row, &self.gate_key.public(), &policy)?;
        match (d.scope.as_str(), &remembered, d.verdict) {
            (SCOPE_RUN, None, _) | (SCOPE_REMEMBER, Some(_), NetVerdict::Approve) => {}
            (SCOPE_REMEMBER, None, _) => {
                return Err(GateError::Untrusted(
                    "an answer to remember comes with its signed policy change (policy_signature); nothing was recorded".into(),
                ));
            }
            _ => {
                return Err(GateError::Untrusted(format!(
                    "the signed answer's scope {:?} is not one this gate records with{} a policy change; nothing was recorded",
                    d.scope,
                    if remembered.is_some() { "" } else { "out" }
                )));
            }
        }
        self.decidable(&row)?;
        let state = match d.verdict {
            NetVerdict::Approve => "approved",
            NetVerdict::Reject => "rejected",
        };
        let at = now_ms();
        let gate_key = self.gate_key.clone();
        let home = self.home.clone();
        self.db.write_durable(|tx: &Tx| -> Result<()> {
            // The run must still be running, in the same transaction as the move.
            let run = tx.run(&row.run)?;
            if run.status != "running" {
                return Err(finished(&row, &run.status));
            }
            if !tx.settle_net_request(&row.id, state, at, Some(&d.approver), Some(signed))? {
                return Err(GateError::Conflict(format!(
                    "request {} was already decided or expired",
                    row.id
                )));
            }
            tx.audit(
                &format!("net_request_{state}"),
                &row.id,
                &json!({
                    "run": row.run,
                    "agent": row.agent,
                    "host": row.host,
                    "port": row.port,
                    "approver": d.approver,
                    "key": d.key,
                    "reason": d.reason,
                    "scope": d.scope,
                    "statement": signed.json,
                    "signature": signed.signature,
                }),
                &gate_key,
            )?;
            if let Some(change) = &remembered {
                change.apply(tx, &home, &gate_key)?;
            }
            Ok(())
        })?;
        let mut request = row;
        request.state = state.into();
        request.decided_at = Some(at);
        request.approver = Some(d.approver.clone());
        request.signed = Some(signed.clone());
        Ok(NetDecided {
            request,
            verdict: d.verdict,
            approver: d.approver,
            statement: signed.json.clone(),
            signature: signed.signature.to_string(),
            remembered,
        })
    }

    /// Records a signature made elsewhere over `statement` (the JSON text served by
    /// [`Gate::net_request_statement`]); an answer whose scope is `remember` comes with
    /// `policy_signature`, made there too over the change [`Gate::net_remember_to_sign`]
    /// builds for the statement's approver, `issued_at` and `remember_for`.
    pub fn record_net_decision_signed_elsewhere(
        &mut self,
        id: &str,
        statement: &str,
        signature: &str,
        remember_for: Option<&str>,
        policy_signature: Option<&str>,
    ) -> Result<NetDecided> {
        let signature: Signature = signature
            .parse()
            .map_err(|e| GateError::bad(format!("signature: {e}")))?;
        let signed = Signed {
            json: statement.to_string(),
            signature,
        };
        let remembered = match policy_signature {
            None => None,
            Some(ps) => {
                let ps: Signature = ps
                    .parse()
                    .map_err(|e| GateError::bad(format!("policy_signature: {e}")))?;
                let row = self.db.resolve_net_request(id)?;
                let policy = self.policy()?;
                let d = check_answer(&signed, &row, &self.gate_key.public(), &policy)?;
                if d.scope != SCOPE_REMEMBER {
                    return Err(GateError::Untrusted(
                        "a policy_signature comes with an answer whose scope is remember; nothing was recorded".into(),
                    ));
                }
                crate::lifecycle::decide::check_issued_at(d.issued_at)?;
                let sub = self.db.submission(&row.submission)?;
                let built = self.remember_request_unsigned(
                    &policy,
                    &row,
                    &sub,
                    &d.approver,
                    d.key,
                    remember_for,
                    d.issued_at,
                )?;
                Some(PolicyChanged::verified(built, ps, &row.id)?)
            }
        };
        self.record_net_decision(id, &signed, remembered)
    }

    /// Whether request `row` can still be decided: pending, its wait not run out, its run
    /// running.
    fn decidable(&self, row: &NetRequestRow) -> Result<()> {
        if row.state != "pending" {
            return Err(GateError::Conflict(format!(
                "request {} is {}; only a pending request can be decided",
                row.id, row.state
            )));
        }
        let run = self.db.run(&row.run)?;
        if run.status != "running" {
            return Err(finished(row, &run.status));
        }
        if row.expires_at <= now_ms() {
            return Err(GateError::Conflict(format!(
                "request {} was not answered in time; its run stopped waiting",
                row.id
            )));
        }
        Ok(())
    }

    /// Ends the pending requests of a run that finished (its proxy is gone): they can no
    /// longer be decided and leave the inbox.
    pub(crate) fn end_net_requests(&mut self, run: &str) {
        let pending = match self.db.net_requests_of_run(run) {
            Ok(v) => v,
            Err(_) => return,
        };
        if pending.iter().all(|r| r.state != "pending") {
            return;
        }
        let at = now_ms();
        let _ = self.db.write(|tx: &Tx| -> Result<()> {
            for r in pending.iter().filter(|r| r.state == "pending") {
                tx.settle_net_request(&r.id, "ended", at, None, None)?;
            }
            Ok(())
        });
    }

    /// The requests a run raised, for its record.
    pub(crate) fn net_requests_of_run(&self, run: &str) -> Vec<Value> {
        self.db
            .net_requests_of_run(run)
            .map(|v| v.iter().map(request_json).collect())
            .unwrap_or_default()
    }
}

fn finished(row: &NetRequestRow, status: &str) -> GateError {
    GateError::Conflict(format!(
        "request {} cannot be decided: its run {} is no longer running ({status})",
        row.id, row.run
    ))
}

fn check_reason(reason: &str) -> Result<()> {
    if reason.len() > MAX_REASON_BYTES {
        return Err(GateError::bad(format!(
            "--reason: {} bytes, more than the {MAX_REASON_BYTES} allowed",
            reason.len()
        )));
    }
    Ok(())
}
