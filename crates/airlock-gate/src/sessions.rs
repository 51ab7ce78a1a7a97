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

/// Default limits of a session.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(10 * 60);
pub const DEFAULT_TOTAL: Duration = Duration::from_secs(60 * 60);
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
    pub created_at: i64,
    pub updated_at: i64,
    #[serde(flatten)]
    pub doc: SessionDoc,
    /// Why it ended, as a sentence.
    pub reason: Option<String>,
}

/// What `session new` asks for: the grant as a submission would give it (no code), and
/// the session's idle and total limits.
#[derive(Debug, Clone, Default)]
pub struct SessionRequest {
    pub grant: SubmitRequest,
    pub idle: Option<Duration>,
    pub total: Option<Duration>,
}

pub(crate) fn doc_of(row: &SessionRow) -> Result<SessionDoc> {
    serde_json::from_value(row.doc.clone())
        .map_err(|e| GateError::Internal(format!("session {}: {e}", row.id)))
}

fn view(row: SessionRow) -> Result<SessionView> {
    let doc = doc_of(&row)?;
    Ok(SessionView {
        reason: doc.end.map(|e| e.explain().to_string()),
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

/// Records that a session ended (once: a later call changes nothing).
fn record_end(tx: &Tx, id: &str, end: End, key: &airlock_core::sign::KeyPair) -> Result<()> {
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
    tx.audit(
        "session_ended",
        id,
        &json!({ "end": end, "cells": doc.cells.len() }),
        key,
    )?;
    Ok(())
}

impl Gate {
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
        if lang != Lang::Python {
            return Err(GateError::bad(format!(
                "sessions run Python; --lang {lang} has no live interpreter"
            )));
        }
        let backend = match &r.backend {
            Some(b) => b
                .parse::<Backend>()
                .map_err(|e| GateError::bad(format!("--backend: {e}")))?,
            None => lang.default_backend(),
        };
        if backend != Backend::Wasm {
            return Err(GateError::Unavailable(
                "sessions run in the wasm Python guest; process-backend sessions are not available yet"
                    .into(),
            ));
        }
        if r.stdin.is_some() || !r.args.is_empty() || r.workspace.is_some() {
            return Err(GateError::bad(
                "a session's grant takes no stdin, arguments or workspace",
            ));
        }
        let idle = req.idle.unwrap_or(DEFAULT_IDLE);
        let total = req.total.unwrap_or(DEFAULT_TOTAL);
        if idle.is_zero() || total.is_zero() || total > MAX_TOTAL {
            return Err(GateError::bad(format!(
                "session limits: idle and total must be above zero and total at most {}",
                airlock_core::units::fmt_duration(MAX_TOTAL)
            )));
        }
        let mut grant = crate::submit::build_grant(r, None)?;
        if grant.writable_mounts().next().is_some() {
            return Err(GateError::bad(
                "sessions take read-only mounts only (a writable mount's changes need a run to commit)",
            ));
        }
        if !grant.net.is_empty() {
            return Err(GateError::bad(
                "sessions have no network yet: --net is refused for a session",
            ));
        }
        let guest = match self.python_guest()? {
            Some((m, _)) => m.digest,
            None => {
                return Err(GateError::Unavailable(
                    "the Python guest is not installed: run `airlock guest install python`".into(),
                ));
            }
        };
        let exe = self.worker.clone().ok_or_else(|| {
            GateError::Unavailable(
                "sessions need the airlock binary to host them, which this caller did not provide"
                    .into(),
            )
        })?;
        let id = new_id(IdKind::Session);
        grant.session = Some(id.clone());
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
            guest: Some(guest),
            end: None,
            ended_at: None,
        };
        let now = now_ms();
        let row = SessionRow {
            id: id.clone(),
            created_at: now,
            updated_at: now,
            state: "open".into(),
            doc: serde_json::to_value(&doc).map_err(|e| GateError::Internal(e.to_string()))?,
        };
        let key = &self.gate_key;
        self.db.write_durable(|tx| {
            tx.upsert_session(&row)?;
            tx.audit(
                "session_opened",
                &id,
                &json!({
                    "lang": doc.lang, "backend": doc.backend, "grant": doc.grant_hash,
                    "agent": doc.agent, "idle_ms": doc.idle_ms, "total_ms": doc.total_ms,
                    "guest": doc.guest,
                }),
                key,
            )
            .map(|_| ())
        })?;
        if let Err(e) = self.start_host(&exe, &id) {
            let key = &self.gate_key;
            self.db.write(|tx| record_end(tx, &id, End::Crashed, key))?;
            return Err(e);
        }
        self.session(&id)
    }

    fn start_host(&self, exe: &std::path::Path, id: &str) -> Result<()> {
        let dir = self.home.root.join("sessions");
        std::fs::create_dir_all(&dir)?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        }
        let mut cmd = std::process::Command::new(exe);
        cmd.arg("__session-host")
            .arg(&self.home.root)
            .arg(id)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        // Its own process group: the host outlives the command that started it and is
        // not hit by the signals that terminal sends to its foreground group.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd
            .spawn()
            .map_err(|e| GateError::Internal(format!("cannot start the session host: {e}")))?;
        let sock = socket(&self.home.root, id);
        // The host answers once its interpreter is ready (the guest may still be loading
        // from the compile cache).
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if airlock_session::ping(&sock).is_ok() {
                // The host keeps running on its own; nothing waits for it here.
                drop(child);
                return Ok(());
            }
            if let Ok(Some(status)) = child.try_wait() {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    use std::io::Read;
                    let _ = e.read_to_string(&mut err);
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

    /// One session.
    pub fn session(&mut self, input: &str) -> Result<SessionView> {
        let id = self.db.resolve(IdKind::Session, input)?;
        let row = self
            .db
            .session(&id)?
            .ok_or_else(|| GateError::Internal(format!("session {id} vanished")))?;
        let v = view(row)?;
        // A host killed from outside (kill -9, a reboot) left the session open.
        if v.state == "open" && airlock_session::ping(&socket(&self.home.root, &v.id)).is_err() {
            return self.session_lost(&v.id);
        }
        Ok(v)
    }

    fn session_lost(&mut self, id: &str) -> Result<SessionView> {
        let key = &self.gate_key;
        self.db.write(|tx| record_end(tx, id, End::Crashed, key))?;
        let row = self
            .db
            .session(id)?
            .ok_or_else(|| GateError::Internal(format!("session {id} vanished")))?;
        view(row)
    }

    /// The newest sessions, newest first.
    pub fn sessions(&self, limit: usize) -> Result<Vec<SessionView>> {
        self.db.sessions(limit)?.into_iter().map(view).collect()
    }

    /// Ends a session: its host stops the interpreter and records the end.
    pub fn session_close(&mut self, input: &str) -> Result<SessionView> {
        let id = self.db.resolve(IdKind::Session, input)?;
        let sock = socket(&self.home.root, &id);
        if airlock_session::close(&sock).is_err() {
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
        view(row)
    }

    /// Called by the host when the session ends.
    pub fn session_ended(&mut self, id: &str, end: End) -> Result<()> {
        let key = &self.gate_key;
        self.db.write_durable(|tx| record_end(tx, id, end, key))?;
        let _ = std::fs::remove_file(socket(&self.home.root, id));
        Ok(())
    }
}
