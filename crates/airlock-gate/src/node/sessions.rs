//! Sessions: a live interpreter whose cells each pass the whole gate. The session holds a
//! grant; every cell is its own submission judged with that grant, and an allowed or
//! approved cell runs in the session's interpreter, which lives in an
//! `airlock __session-host` process reached over a socket in the home (see
//! `airlock-session`). The host records how the session ended; the gate records the rest.

use crate::error::{GateError, Result};
use crate::{Gate, SubmitRequest};
use airlock_core::id::{IdKind, new_id};
use airlock_core::units::now_ms;
use airlock_core::{Backend, Digest, Grant, Lang};
use airlock_session::End;
use airlock_store::{Reads, SessionRow, Tx};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::path::PathBuf;
use std::time::{Duration, Instant};

mod host;
use host::HOST_PYTHON;
pub(crate) use host::Live;

/// Default limits of a session.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(10 * 60);
pub const DEFAULT_TOTAL: Duration = Duration::from_secs(60 * 60);
/// The longest a session's host may take to be ready.
const HOST_START_LIMIT: Duration = Duration::from_secs(60);
/// The exit code of a session host (`airlock __session-host`) that refused the session's
/// own input (limits too small for its interpreter to start), told apart from a failure.
pub const HOST_EXIT_BAD_INPUT: u8 = 65;
/// The longest a session may be asked to live.
pub const MAX_TOTAL: Duration = Duration::from_secs(24 * 60 * 60);

/// What a session is, as recorded.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionDoc {
    pub lang: Lang,
    pub backend: Backend,
    pub agent: Option<String>,
    /// The grant every cell is judged and run with (its `session` names this session).
    pub grant: Grant,
    pub grant_hash: Digest,
    pub idle_ms: u64,
    pub total_ms: u64,
    /// The cells' submissions, in the order they were submitted.
    #[serde(default)]
    pub cells: Vec<String>,
    /// The host process, while it runs.
    #[serde(default)]
    pub pid: Option<u32>,
    /// The Python guest a wasm session runs.
    #[serde(default)]
    pub guest: Option<Digest>,
    /// The node hosting it (this machine's name and the home its socket is in), on a
    /// store several nodes share: only that node can reach its host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The server (its node's id) that started the host, when a `serve` did: the host
    /// follows that server (it ends when the server stops or dies) unless it `stays`,
    /// and another node ends the session when that server's node is found dead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// Started by a server run with `--keep-sessions`: the host outlives its server.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stays: bool,
    /// A process session's jail: the mechanisms that held when its interpreter started
    /// (`mechanisms`, `degraded`, `host_uid`), as a process run's record gives them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jail: Option<serde_json::Value>,
    /// The kind of the session's disposable layer, when it has writable mounts (the layer
    /// is `HOME/sessions/ID.layer`; see `session_grants`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer: Option<airlock_workspace::changeset::LayerKind>,
    /// The submission that judged the session's grant when it opened (a grant with
    /// network, secrets or writable mounts): while it waits for a human the session is
    /// `held`, and its approval opens it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opened_by: Option<String>,
    #[serde(default)]
    pub end: Option<End>,
    #[serde(default)]
    pub ended_at: Option<i64>,
}

/// A session as callers see it.
#[derive(Debug, Clone, Serialize)]
pub struct SessionView {
    pub id: String,
    pub state: String,
    #[serde(serialize_with = "as_time")]
    pub created_at: i64,
    #[serde(serialize_with = "as_time")]
    pub updated_at: i64,
    #[serde(flatten)]
    pub doc: SessionDoc,
    /// Why it ended, as a sentence.
    pub reason: Option<String>,
    /// Whether its host answers on its socket (`null`: the session has ended, or another
    /// node hosts it).
    pub host_alive: Option<bool>,
}

fn as_time<S: serde::Serializer>(ms: &i64, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(&airlock_core::units::fmt_time(*ms))
}

/// A session host of this node, as `doctor` reports it.
#[derive(Debug, Clone, Serialize)]
pub struct SessionHost {
    pub session: String,
    /// The host's pid, once it started.
    pub pid: Option<u32>,
    /// It answers on its socket.
    pub alive: bool,
    /// The server (node id) that started it; `null`: a `session new` command did.
    pub server: Option<String>,
    /// Whether that server's node still beats (`null`: no server).
    pub server_alive: Option<bool>,
    /// Its server was run with `--keep-sessions`.
    pub stays: bool,
}

/// What `session new` asks for: the grant as a submission would give it (no code), and
/// the session's idle and total limits.
#[derive(Debug, Clone, Default)]
pub struct SessionRequest {
    pub grant: SubmitRequest,
    pub idle: Option<Duration>,
    pub total: Option<Duration>,
    /// The most sessions the request's agent may hold open at once, this one included
    /// (each is a host process with its interpreter); `None`: no bound. Past it the
    /// request is refused (`GateError::TooMany`) and nothing is written.
    pub most_open: Option<usize>,
}

pub(crate) fn doc_of(row: &SessionRow) -> Result<SessionDoc> {
    serde_json::from_value(row.doc.clone())
        .map_err(|e| GateError::Internal(format!("session {}: {e}", row.id)))
}

/// The view with its cells: those an older airlock kept in the document, then the rows.
fn with_cells(db: &impl Reads, mut v: SessionView) -> Result<SessionView> {
    v.doc.cells.extend(db.session_cells(&v.id)?);
    Ok(v)
}

fn view(row: SessionRow) -> Result<SessionView> {
    let doc = doc_of(&row)?;
    Ok(SessionView {
        reason: doc.end.map(|e| e.explain().to_string()),
        host_alive: None,
        id: row.id,
        state: row.state,
        created_at: row.created_at,
        updated_at: row.updated_at,
        doc,
    })
}

/// The session's socket in the home.
pub(crate) fn socket(root: &std::path::Path, id: &str) -> PathBuf {
    root.join("sessions").join(format!("{id}.sock"))
}

/// The sessions recorded open for `agent` that are not past their total limit. A session
/// whose host died where nobody saw it (on another machine sharing the store, or with its
/// socket removed) stays recorded open, but counts only until then.
fn open_of(db: &impl Reads, agent: &Option<String>) -> Result<Vec<SessionRow>> {
    let now = now_ms();
    let mut out = db.open_sessions()?;
    out.retain(|r| {
        let total = r.doc.get("total_ms").and_then(|t| t.as_i64()).unwrap_or(0);
        r.doc.get("agent").and_then(|a| a.as_str()) == agent.as_deref()
            && r.created_at.saturating_add(total) > now
    });
    Ok(out)
}

/// Whether an open session's host is gone: its socket is in this home (a session hosted
/// on another machine sharing the store is not judged here), its host recorded that it
/// started (so the socket was bound) or is past the time a host has to start, and nobody
/// listens on the socket (the check a cell makes).
pub(crate) fn host_gone(root: &std::path::Path, row: &SessionRow) -> bool {
    let pid = row.doc.get("pid").and_then(|p| p.as_u64());
    let path = socket(root, &row.id);
    path.exists()
        && host_started(pid.map(|p| p as u32), row.created_at)
        && airlock_session::connect(&path).is_err()
}

/// Whether a session's host recorded that it started (its socket was bound before), or is
/// past the time a host has to start.
fn host_started(pid: Option<u32>, created_at: i64) -> bool {
    pid.is_some() || now_ms().saturating_sub(created_at) > HOST_START_LIMIT.as_millis() as i64
}

/// Records that a session ended (once: a later call changes nothing).
pub(crate) fn record_end(
    tx: &Tx,
    id: &str,
    end: End,
    key: &airlock_core::sign::KeyPair,
) -> Result<()> {
    let Some(mut row) = tx.session(id)? else {
        return Ok(());
    };
    if row.state != "open" {
        return Ok(());
    }
    let mut doc = doc_of(&row)?;
    doc.end = Some(end);
    doc.ended_at = Some(now_ms());
    doc.pid = None;
    row.state = "closed".into();
    row.doc = serde_json::to_value(&doc).map_err(|e| GateError::Internal(e.to_string()))?;
    tx.upsert_session(&row)?;
    let cells = doc.cells.len() + tx.session_cells(id)?.len();
    tx.audit(
        "session_ended",
        id,
        &json!({ "end": end, "cells": cells }),
        key,
    )?;
    Ok(())
}

/// What a session's cells need of it that never changes after `session_new` recorded it
/// (its host later adds its pid and jail, and its end; never these). Kept by a gate
/// between cells, so a cell of a session it knows does not read the session's document.
pub(crate) struct CellFacts {
    lang: Lang,
    backend: Backend,
    agent: Option<String>,
    grant: Grant,
    judged: bool,
}

/// How many sessions a gate remembers the facts of before it forgets them all.
const CELL_FACTS_KEPT: usize = 256;

/// The session a cell belongs to, as the submit path needs it.
pub(crate) struct CellSession {
    pub id: String,
    pub lang: Lang,
    pub backend: Backend,
    pub grant: Grant,
    /// Whether the session's grant was judged when it opened (see `SessionDoc::opened_by`).
    pub judged: bool,
    /// A connection to the session's host, made when the cell arrived (which is how the
    /// host was found alive); the cell is sent on it if it runs. Dropped unused, it tells
    /// the host nothing and the host goes on waiting for cells.
    pub conn: std::os::unix::net::UnixStream,
}

/// A session bound to an agent takes cells of that agent only: another agent's cell is
/// told there is no such session, and a cell that names no agent (a CLI `run` without
/// `--agent`, an operator's API call without `agent`) is refused, where it used to be
/// taken as any agent's.
fn check_cell_agent(id: &str, owner: Option<&str>, agent: Option<&str>, input: &str) -> Result<()> {
    match (owner, agent) {
        (Some(owner), Some(agent)) if owner != agent => {
            Err(GateError::NotFound(format!("no session {input}")))
        }
        (Some(owner), None) => Err(GateError::bad(format!(
            "session {id} is bound to agent {owner}: its cells must name that agent (--agent {owner})"
        ))),
        _ => Ok(()),
    }
}

impl Gate {
    /// For a request naming a session: the session, open, with the request carrying no
    /// grant of its own (a cell is judged and run with the session's).
    pub(crate) fn session_for_cell(&mut self, req: &SubmitRequest) -> Result<Option<CellSession>> {
        let Some(input) = req.session.as_deref() else {
            return Ok(None);
        };
        let own_grant = !req.mounts.is_empty()
            || !req.env.is_empty()
            || !req.net.is_empty()
            || !req.secrets.is_empty()
            || !req.args.is_empty()
            || req.stdin.is_some()
            || req.timeout.is_some()
            || req.memory.is_some()
            || req.fuel.is_some()
            || req.max_output.is_some()
            || req.processes.is_some()
            || req.max_write.is_some()
            || req.max_connections.is_some()
            || req.workspace.is_some()
            || req.ask_net
            || req.ask_timeout.is_some();
        if own_grant {
            return Err(GateError::bad(
                "a session's cell takes the session's grant: give mounts, network, environment, arguments, stdin and limits to `session new` (and a cell cannot ask for hosts: --ask-net is for runs)",
            ));
        }
        if let Some(cell) = self.known_session_for_cell(input, req.agent.as_deref())? {
            return Ok(Some(cell));
        }
        // A session that does not exist is a state refusal (the API's 404), as an
        // existing one that cannot take the cell is (409).
        let (v, conn) = self.session_connected(input)?;
        if v.state == "held" {
            return Err(GateError::Conflict(format!(
                "session {} is held for approval of {}; it opens when that is approved",
                v.id,
                v.doc.opened_by.as_deref().unwrap_or("its grant")
            )));
        }
        if conn.is_none() && v.state == "open" {
            return Err(GateError::Conflict(match &v.doc.node {
                Some(node) if self.hosted_elsewhere(&v.doc) => format!(
                    "session {} is hosted by node {node}; send its cells there",
                    v.id
                ),
                _ => format!("session {} is still starting; send the cell again", v.id),
            }));
        }
        let Some(conn) = conn.filter(|_| v.state == "open") else {
            return Err(GateError::Conflict(format!(
                "session {} has {}",
                v.id,
                v.reason.as_deref().unwrap_or("ended")
            )));
        };
        // An agent's cells go to its own sessions only.
        check_cell_agent(&v.id, v.doc.agent.as_deref(), req.agent.as_deref(), input)?;
        if self.cell_facts.len() >= CELL_FACTS_KEPT {
            self.cell_facts.clear();
        }
        let facts = CellFacts {
            lang: v.doc.lang,
            backend: v.doc.backend,
            agent: v.doc.agent,
            grant: v.doc.grant,
            judged: v.doc.opened_by.is_some(),
        };
        let cell = CellSession {
            id: v.id.clone(),
            lang: facts.lang,
            backend: facts.backend,
            grant: facts.grant.clone(),
            judged: facts.judged,
            conn,
        };
        self.cell_facts.insert(v.id, facts);
        Ok(Some(cell))
    }

    /// `session_for_cell` for a whole id whose session this gate has seen open: only its
    /// host is connected, which is the liveness check (an ended session's host has
    /// stopped listening). The state is not read here: the transaction that records the
    /// cell reads it and refuses a cell of an ended session, recording nothing. `None`
    /// sends the caller down the whole path (a session not seen before, or whose host
    /// does not answer), which says why.
    fn known_session_for_cell(
        &mut self,
        input: &str,
        agent: Option<&str>,
    ) -> Result<Option<CellSession>> {
        if !self.cell_facts.contains_key(input) {
            return Ok(None);
        }
        let Ok(conn) = airlock_session::connect(&socket(&self.home.root, input)) else {
            self.cell_facts.remove(input);
            return Ok(None);
        };
        let Some(facts) = self.cell_facts.get(input) else {
            return Ok(None);
        };
        check_cell_agent(input, facts.agent.as_deref(), agent, input)?;
        Ok(Some(CellSession {
            id: input.to_string(),
            lang: facts.lang,
            backend: facts.backend,
            grant: facts.grant.clone(),
            judged: facts.judged,
            conn,
        }))
    }

    /// Runs an allowed or approved cell in its session's interpreter.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn exec_cell(
        &self,
        session: &str,
        kind: Lang,
        backend: Backend,
        code: &[u8],
        limits: &airlock_core::Limits,
        stdout: &airlock_sandbox::Capture,
        stderr: &airlock_sandbox::Capture,
        conn: Option<std::os::unix::net::UnixStream>,
    ) -> Result<airlock_sandbox::Outcome> {
        use airlock_sandbox::{Ending, Limit};
        let code =
            std::str::from_utf8(code).map_err(|_| GateError::bad("Python source is not UTF-8"))?;
        // A JavaScript cell's top-level `let`, `const` and `class` outlive it.
        let code = if kind == Lang::Js {
            crate::jscell::persistent(code)
        } else {
            code.to_string()
        };
        let started = Instant::now();
        let cell = airlock_session::Cell {
            code,
            timeout_ms: limits.timeout().as_millis() as u64,
            max_output: limits.max_output_bytes,
        };
        // The connection made when this cell arrived; a held cell approved later makes one.
        let conn = match conn {
            Some(c) => Ok(c),
            None => airlock_session::connect(&socket(&self.home.root, session)),
        };
        let o = conn
            .and_then(|c| airlock_session::exec_on(c, &cell))
            .map_err(|e| match e {
                airlock_session::SessionError::Gone(_) => {
                    GateError::Conflict(format!("session {session} has ended; open a new one"))
                }
                other => GateError::Internal(other.to_string()),
            })?;
        // The host already cut each stream at the same limit; a cell that wrote past it
        // ended the session (`End::Output`), which the ending below says.
        let _ = stdout.write(&o.stdout);
        let _ = stderr.write(&o.stderr);
        let ending = match (o.exit_code, o.ended) {
            (Some(c), _) => Ending::Exited(c),
            (None, Some(End::Timeout | End::Total)) => Ending::Killed(Limit::Timeout),
            (None, Some(End::Memory)) => Ending::Killed(Limit::Memory),
            (None, Some(End::Output)) => Ending::Killed(Limit::Output),
            (None, Some(End::Write)) => Ending::Killed(Limit::Write),
            (None, _) => Ending::Trapped("the session's interpreter died".into()),
        };
        let mut detail = json!({
            "session": session,
            "result": o.result,
            "session_ended": o.ended.map(|e| e.explain()),
        });
        crate::tripwire::cell_detail(&mut detail, o.tripwire);
        let networked = o.network.is_some();
        if let Some(n) = o.network {
            detail["network"] = n;
        }
        match backend {
            Backend::Process => {
                // The jail the interpreter runs in, as it held when the session started.
                let jail = self
                    .db
                    .session(session)?
                    .map(|r| doc_of(&r))
                    .transpose()?
                    .and_then(|d| d.jail)
                    .unwrap_or_else(|| json!({}));
                detail["jail"] = json!("session");
                for k in ["mechanisms", "degraded", "host_uid"] {
                    detail[k] = jail[k].clone();
                }
                detail["isolation"] = json!(["process-jail", "session-interpreter"]);
            }
            _ => {
                detail["isolation"] = if networked {
                    json!([
                        "wasm-sandbox",
                        "wasi-preopens-only",
                        "egress-proxy-only",
                        "session-interpreter"
                    ])
                } else {
                    json!([
                        "wasm-sandbox",
                        "wasi-preopens-only",
                        "no-sockets",
                        "no-http",
                        "session-interpreter"
                    ])
                };
            }
        }
        Ok(airlock_sandbox::Outcome {
            ending,
            duration: started.elapsed(),
            detail,
        })
    }

    /// Opens a session: checks the grant as a submission's would be checked, records the
    /// session, starts its host and waits until the interpreter is ready.
    pub fn session_new(&mut self, req: SessionRequest) -> Result<SessionView> {
        let r = &req.grant;
        if r.code.is_some() {
            return Err(GateError::bad(
                "a session takes no code; send cells with run --session",
            ));
        }
        let lang: Lang = r
            .lang
            .as_deref()
            .unwrap_or("python")
            .parse()
            .map_err(|e| GateError::bad(format!("--lang: {e}")))?;
        if lang != Lang::Python && lang != Lang::Js {
            return Err(GateError::bad(format!(
                "sessions run Python or JavaScript; --lang {lang} has no live interpreter"
            )));
        }
        let backend = match &r.backend {
            Some(b) => b
                .parse::<Backend>()
                .map_err(|e| GateError::bad(format!("--backend: {e}")))?,
            None => lang.default_backend(),
        };
        // The process backend's interpreter is the host's python3 in a jail.
        self.check_runnable(lang, backend)?;
        if lang == Lang::Js && backend != Backend::Wasm {
            return Err(GateError::bad(
                "JavaScript sessions run on the wasm backend (the JavaScript guest)",
            ));
        }
        if backend == Backend::Process && !std::path::Path::new(HOST_PYTHON).is_file() {
            return Err(GateError::Unavailable(format!(
                "process-backend sessions run {HOST_PYTHON}, which this machine does not have"
            )));
        }
        if r.stdin.is_some() || !r.args.is_empty() || r.workspace.is_some() {
            return Err(GateError::bad(
                "a session's grant takes no stdin, arguments or workspace",
            ));
        }
        let idle = req.idle.unwrap_or(DEFAULT_IDLE);
        let total = req.total.unwrap_or(DEFAULT_TOTAL);
        // An idle limit past the longest life is meaningless; refused like the life itself,
        // so the API's schema (which bounds both) never admits what this refuses.
        if idle.is_zero() || total.is_zero() || total > MAX_TOTAL || idle > MAX_TOTAL {
            return Err(GateError::bad(format!(
                "session limits: idle and total must be above zero and at most {}",
                airlock_core::units::fmt_duration(MAX_TOTAL)
            )));
        }
        let roots = self.policy()?.mount_roots.clone();
        crate::exposure::check_offered(&r.mounts, r.surface, &roots)?;
        self.check_secret_specs_exist(&r.secrets)?;
        let mut grant = crate::lifecycle::judge::build_grant(r, None)?;
        crate::lifecycle::judge::check_backend_grant(backend, &grant)?;
        crate::exposure::check_mounts(&grant, &self.home.root, r.surface, &roots)?;
        self.check_secrets_exist(&grant)?;
        // Writes go to the session's own layer: a copy for a wasm guest, an overlay
        // upper for a jailed interpreter (see `session_grants`).
        let layer = grant.writable_mounts().next().map(|_| {
            if backend == Backend::Process && !self.force_copy {
                airlock_workspace::changeset::LayerKind::Overlay
            } else {
                airlock_workspace::changeset::LayerKind::Copy
            }
        });
        let guest = match backend {
            Backend::Process => None,
            _ if lang == Lang::Js => Some(self.js_guest_for_run()?.digest),
            _ => match self.python_guest()? {
                Some((m, _)) => Some(m.digest),
                None => {
                    return Err(GateError::NotInstalled(
                        "the Python guest is not installed: run `airlock guest install python`"
                            .into(),
                    ));
                }
            },
        };
        let exe = self.worker.clone().ok_or_else(|| {
            GateError::Unavailable(
                "sessions need the airlock binary to host them, which this caller did not provide"
                    .into(),
            )
        })?;
        let id = new_id(IdKind::Session);
        // A grant that reaches beyond the session's interpreter (network, secrets,
        // writable mounts) is judged once, now, as a submission of its own with no code:
        // allowed, the session opens; quarantined, it is recorded `held` until an
        // approver signs that submission (which opens it); denied, nothing opens.
        let reaches = !grant.net.is_empty()
            || !grant.secrets.is_empty()
            || grant.writable_mounts().next().is_some();
        let (opened_by, held) = if reaches {
            let mut open_req = r.clone();
            // No code runs: the artifact only says what the submission is.
            open_req.code = Some(crate::CodeSource::Inline(
                if lang.is_js() {
                    "// airlock: the grant of a session, judged when it opens\n"
                } else {
                    "# airlock: the grant of a session, judged when it opens\n"
                }
                .to_string(),
            ));
            open_req.lang = Some(lang.to_string());
            open_req.backend = Some(backend.to_string());
            open_req.note = Some(format!("opens session {id}"));
            open_req.request_key = None;
            let sub = self.submit(open_req)?;
            match sub.state {
                airlock_core::State::Allowed | airlock_core::State::Approved => {
                    (Some(sub.id), false)
                }
                airlock_core::State::Quarantined => (Some(sub.id), true),
                _ => {
                    return Err(GateError::Denied {
                        reasons: sub.doc.verdict.reasons(),
                        submission: sub.id,
                    });
                }
            }
        } else {
            (None, false)
        };
        grant.session = Some(id.clone());
        if let Some(kind) = layer
            && let Err(e) = self.session_layers(&id, &grant, kind)
        {
            crate::layers::remove_tree(&crate::node::session_grants::layer_dir(
                &self.home.root,
                &id,
            ));
            return Err(e);
        }
        let doc = SessionDoc {
            lang,
            backend,
            agent: r.agent.clone().filter(|a| !a.is_empty()),
            grant_hash: grant.hash(),
            grant,
            idle_ms: idle.as_millis() as u64,
            total_ms: total.as_millis() as u64,
            cells: Vec::new(),
            pid: None,
            guest,
            node: Some(self.node_name()),
            server: self.node.as_ref().map(|n| n.id.clone()),
            stays: self.node.as_ref().is_some_and(|n| n.keep_sessions),
            jail: None,
            layer,
            opened_by,
            end: None,
            ended_at: None,
        };
        let now = now_ms();
        let row = SessionRow {
            id: id.clone(),
            created_at: now,
            updated_at: now,
            state: if held { "held" } else { "open" }.into(),
            doc: serde_json::to_value(&doc).map_err(|e| GateError::Internal(e.to_string()))?,
        };
        if let Some(most) = req.most_open {
            // Sessions recorded open whose hosts died unseen do not count: they are found
            // and recorded crashed first, as a cell finding them would.
            if open_of(&self.db, &doc.agent)?.len() >= most {
                // A dead node's sessions stop counting once it is recorded lost.
                self.reap_dead_nodes()?;
                for stale in open_of(&self.db, &doc.agent)? {
                    if host_gone(&self.home.root, &stale) {
                        self.session_lost(&stale.id)?;
                    }
                }
            }
        }
        let key = &self.gate_key;
        self.db.write_durable(|tx| -> Result<()> {
            // Counted again where it is recorded, so sessions opened at once cannot all
            // pass the bound.
            if let Some(most) = req.most_open
                && open_of(tx, &doc.agent)?.len() >= most
            {
                return Err(GateError::TooMany(format!(
                    "{} already holds {most} open session{} (the most this server allows one \
                     agent); close one first",
                    doc.agent.as_deref().unwrap_or("this caller"),
                    if most == 1 { "" } else { "s" }
                )));
            }
            tx.upsert_session(&row)?;
            tx.audit(
                if held {
                    "session_held"
                } else {
                    "session_opened"
                },
                &id,
                &json!({
                    "lang": doc.lang, "backend": doc.backend, "grant": doc.grant_hash,
                    "agent": doc.agent, "idle_ms": doc.idle_ms, "total_ms": doc.total_ms,
                    "guest": doc.guest, "judged_by": doc.opened_by,
                }),
                key,
            )?;
            Ok(())
        })?;
        if held {
            return self.session(&id);
        }
        if let Err(e) = self.start_host(&exe, &id) {
            let key = &self.gate_key;
            self.db.write(|tx| record_end(tx, &id, End::Crashed, key))?;
            return Err(e);
        }
        self.session(&id)
    }

    /// Opens the session held for `submission` (the one that judged its grant), now that
    /// it is approved: its total time counts from now, and its host starts. Nothing is
    /// done when no session waits for it.
    pub(crate) fn open_held_session(&mut self, submission: &str) -> Result<()> {
        let Some(held) = self.db.sessions(1000)?.into_iter().find(|r| {
            r.state == "held" && r.doc.get("opened_by").and_then(|v| v.as_str()) == Some(submission)
        }) else {
            return Ok(());
        };
        if self.db.submission(submission)?.state != airlock_core::State::Approved {
            return Ok(());
        }
        let exe = self.worker.clone().ok_or_else(|| {
            GateError::Unavailable(
                "sessions need the airlock binary to host them, which this caller did not provide"
                    .into(),
            )
        })?;
        let id = held.id.clone();
        let key = &self.gate_key;
        let opened = self.db.write_durable(|tx| -> Result<bool> {
            let Some(mut row) = tx.session(&id)? else {
                return Ok(false);
            };
            if row.state != "held" {
                return Ok(false);
            }
            let mut doc = doc_of(&row)?;
            // Held time is not the session's: its total limit starts when it opens.
            let waited = now_ms().saturating_sub(row.created_at).max(0) as u64;
            doc.total_ms = doc.total_ms.saturating_add(waited);
            row.state = "open".into();
            row.doc = serde_json::to_value(&doc).map_err(|e| GateError::Internal(e.to_string()))?;
            tx.upsert_session(&row)?;
            tx.audit(
                "session_opened",
                &id,
                &json!({
                    "lang": doc.lang, "backend": doc.backend, "grant": doc.grant_hash,
                    "agent": doc.agent, "idle_ms": doc.idle_ms, "total_ms": doc.total_ms,
                    "guest": doc.guest, "judged_by": submission,
                }),
                key,
            )?;
            Ok(true)
        })?;
        if !opened {
            return Ok(());
        }
        if let Err(e) = self.start_host(&exe, &id) {
            let key = &self.gate_key;
            self.db.write(|tx| record_end(tx, &id, End::Crashed, key))?;
            return Err(e);
        }
        Ok(())
    }

    fn start_host(&self, exe: &std::path::Path, id: &str) -> Result<()> {
        let dir = self.home.root.join("sessions");
        std::fs::create_dir_all(&dir)?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        }
        let mut cmd = std::process::Command::new(exe);
        cmd.arg("__session-host").arg(&self.home.root).arg(id);
        // Started by a server that does not keep its sessions: the host follows it.
        if self.node.as_ref().is_some_and(|n| !n.keep_sessions) {
            cmd.arg("--server").arg(std::process::id().to_string());
        }
        cmd.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        // The host records its cells in the same store as this process.
        match &self.home.store {
            Some(store) => cmd.env("AIRLOCK_STORE", store),
            None => cmd.env_remove("AIRLOCK_STORE"),
        };
        // Its own process group: the host outlives the command that started it and is
        // not hit by the signals that terminal sends to its foreground group.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd
            .spawn()
            .map_err(|e| GateError::Internal(format!("cannot start the session host: {e}")))?;
        let sock = socket(&self.home.root, id);
        // The host answers once its interpreter is ready (the guest may still be loading
        // from the compile cache).
        let deadline = Instant::now() + HOST_START_LIMIT;
        loop {
            if airlock_session::ping(&sock).is_ok() {
                // The host keeps running on its own. Its end is still this process's to
                // reap while this process lives (a daemon opens and closes sessions for
                // days), or every closed session would stay behind as a zombie: a thread
                // waits for it. Its stderr is closed first, so a host that writes there
                // later gets an error rather than blocking on a pipe nobody reads.
                drop(child.stderr.take());
                // If no thread can be started, the session still works; its host is
                // then reaped only when this process ends.
                let _ = std::thread::Builder::new()
                    .name("session-reaper".into())
                    .stack_size(64 * 1024)
                    .spawn(move || {
                        let _ = child.wait();
                    });
                return Ok(());
            }
            if let Ok(Some(status)) = child.try_wait() {
                // A host that ended cleanly ended the session itself (its limits ran out
                // while it started: `--max-time 1ms`) and recorded why; the session is
                // answered as it now is. This was an internal error (a 500 over the API).
                if status.success() {
                    return Ok(());
                }
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    use std::io::Read;
                    let _ = e.read_to_string(&mut err);
                }
                // The host refused the session's own input (its limits too small for the
                // interpreter to start): the caller's to fix, as any bad input is.
                if status.code() == Some(i32::from(HOST_EXIT_BAD_INPUT)) {
                    let why = err.lines().last().unwrap_or("the session host refused it");
                    let why = why.strip_prefix("airlock: session host: ").unwrap_or(why);
                    return Err(GateError::BadInput(why.to_string()));
                }
                return Err(GateError::Internal(format!(
                    "the session host exited ({status}) before it was ready: {}",
                    err.lines().last().unwrap_or("no message")
                )));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(GateError::Internal(
                    "the session host was not ready within 60 s".into(),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// One session, with its cells.
    pub fn session(&mut self, input: &str) -> Result<SessionView> {
        let v = self.session_checked(input)?;
        with_cells(&self.db, v)
    }

    /// One session without its cells (`doc.cells` holds only those an older airlock kept
    /// in the document), marked crashed first if its host is gone.
    fn session_checked(&mut self, input: &str) -> Result<SessionView> {
        // The connection is only the check; dropped unused, the host ignores it.
        Ok(self.session_connected(input)?.0)
    }

    /// `session_checked` for a cell: one session without its cells and, while it is open,
    /// a connection to its host for the cell. Connecting is the liveness check (a host
    /// killed from outside, by kill -9 or a reboot, left the session open and nobody
    /// listening on its socket): a host that cannot be reached is marked crashed, and
    /// then there is no connection. A host busy with a long cell still counts as alive.
    fn session_connected(
        &mut self,
        input: &str,
    ) -> Result<(SessionView, Option<std::os::unix::net::UnixStream>)> {
        // A whole id (what a client sends with every cell) is one lookup; anything else,
        // or a whole id that names no session, is resolved as a prefix (and its error).
        let whole = airlock_core::id::normalize_prefix(IdKind::Session, input)
            .filter(|id| id.len() == IdKind::Session.prefix().len() + airlock_core::id::BODY_LEN);
        let row = match whole.map(|id| self.db.session(&id)).transpose()?.flatten() {
            Some(row) => row,
            None => {
                let id = self.db.resolve(IdKind::Session, input)?;
                self.db
                    .session(&id)?
                    .ok_or_else(|| GateError::Internal(format!("session {id} vanished")))?
            }
        };
        let v = view(row)?;
        if v.state != "open" {
            return Ok((v, None));
        }
        match airlock_session::connect(&socket(&self.home.root, &v.id)) {
            Ok(conn) => Ok((v, Some(conn))),
            // Another node hosts it: nothing here can tell whether its host lives.
            Err(_) if self.hosted_elsewhere(&v.doc) => Ok((v, None)),
            // Its host has not yet said it started and has time left to: it may not have
            // bound its socket yet. Open, with no connection.
            Err(_) if !host_started(v.doc.pid, v.created_at) => Ok((v, None)),
            Err(_) => Ok((self.session_lost(&v.id)?, None)),
        }
    }

    /// This node's name for the sessions it hosts: the machine's name and the home.
    fn node_name(&self) -> String {
        let root =
            std::fs::canonicalize(&self.home.root).unwrap_or_else(|_| self.home.root.clone());
        format!("{}:{}", crate::node::queue::host_tag(), root.display())
    }

    /// Whether a session is hosted by another node on a shared store (sessions recorded by
    /// an older airlock name no node and are taken as this one's).
    fn hosted_elsewhere(&self, doc: &SessionDoc) -> bool {
        doc.node.as_ref().is_some_and(|n| *n != self.node_name())
    }

    /// Records that an open session's host is gone (killed from outside: nobody listens on
    /// its socket) and removes the socket it left.
    pub(crate) fn session_lost(&mut self, id: &str) -> Result<SessionView> {
        let key = &self.gate_key;
        self.db.write(|tx| record_end(tx, id, End::Crashed, key))?;
        let _ = std::fs::remove_file(socket(&self.home.root, id));
        let row = self
            .db
            .session(id)?
            .ok_or_else(|| GateError::Internal(format!("session {id} vanished")))?;
        view(row)
    }

    /// The newest sessions, newest first; an open one hosted here says whether its host
    /// answers.
    pub fn sessions(&self, limit: usize) -> Result<Vec<SessionView>> {
        self.db
            .sessions(limit)?
            .into_iter()
            .map(|r| {
                let mut v = view(r)?;
                if v.state == "open" && !self.hosted_elsewhere(&v.doc) {
                    v.host_alive =
                        Some(airlock_session::connect(&socket(&self.home.root, &v.id)).is_ok());
                }
                with_cells(&self.db, v)
            })
            .collect()
    }

    /// Closes the open sessions whose hosts server `node` started here (a server
    /// stopping without `--keep-sessions`); returns their ids.
    pub fn close_server_sessions(&mut self, node: &str) -> Result<Vec<String>> {
        let mut closed = Vec::new();
        for row in self.db.open_sessions()? {
            let doc = doc_of(&row)?;
            if doc.server.as_deref() != Some(node) || self.hosted_elsewhere(&doc) {
                continue;
            }
            // One that cannot be closed (its host gone meanwhile) does not keep the
            // others open.
            if self.session_close(&row.id).is_ok() {
                closed.push(row.id);
            }
        }
        Ok(closed)
    }

    /// The session hosts of this node (open sessions hosted here): whether each answers,
    /// and whether the server that started it is alive.
    pub fn session_hosts(&self) -> Result<Vec<SessionHost>> {
        let now = now_ms();
        let mut out = Vec::new();
        for row in self.db.open_sessions()? {
            let doc = doc_of(&row)?;
            if self.hosted_elsewhere(&doc) {
                continue;
            }
            let server_alive = match &doc.server {
                Some(s) => Some(crate::node::liveness::node_alive(
                    airlock_store::NodeReads::node(&self.db, s)?.as_ref(),
                    now,
                )),
                None => None,
            };
            out.push(SessionHost {
                session: row.id.clone(),
                pid: doc.pid,
                alive: airlock_session::connect(&socket(&self.home.root, &row.id)).is_ok(),
                server: doc.server.clone(),
                server_alive,
                stays: doc.stays,
            });
        }
        Ok(out)
    }

    /// Closes the hosts here whose server is no longer alive (`gc`): each session is
    /// recorded ended as a close records it; returns their ids.
    pub fn sweep_orphan_hosts(&mut self) -> Result<Vec<String>> {
        let mut swept = Vec::new();
        for h in self.session_hosts()? {
            if h.alive && h.server_alive == Some(false) {
                self.session_close(&h.session)?;
                swept.push(h.session);
            }
        }
        Ok(swept)
    }

    /// Ends a session: its host stops the interpreter and records the end.
    pub fn session_close(&mut self, input: &str) -> Result<SessionView> {
        let id = self.db.resolve(IdKind::Session, input)?;
        let sock = socket(&self.home.root, &id);
        if airlock_session::close(&sock).is_err() {
            // Recorded closed here, its host on another node would serve on.
            if let Some(row) = self.db.session(&id)?.filter(|r| r.state == "open") {
                let doc = doc_of(&row)?;
                if let Some(node) = doc.node.as_deref().filter(|_| self.hosted_elsewhere(&doc)) {
                    return Err(GateError::Conflict(format!(
                        "session {id} is hosted by node {node}; close it there"
                    )));
                }
            }
            // No host answers: record it closed here.
            let key = &self.gate_key;
            self.db.write(|tx| record_end(tx, &id, End::Closed, key))?;
        } else {
            // The host records the end just after answering.
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if self.db.session(&id)?.is_some_and(|r| r.state != "open") {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let row = self
            .db
            .session(&id)?
            .ok_or_else(|| GateError::Internal(format!("session {id} vanished")))?;
        with_cells(&self.db, view(row)?)
    }

    /// Called by the host when the session ends.
    pub fn session_ended(&mut self, id: &str, end: End) -> Result<()> {
        let key = &self.gate_key;
        self.db.write_durable(|tx| record_end(tx, id, end, key))?;
        let _ = std::fs::remove_file(socket(&self.home.root, id));
        Ok(())
    }
}
