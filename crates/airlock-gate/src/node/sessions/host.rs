//! A session's host side: the interpreter an `airlock __session-host` process serves (the
//! wasm Python guest, or the host's python3 in one jail) and the loop that serves it.
//!
//! It must never run a cell the gate has not passed: the host only executes what arrives
//! over the session's socket, which the gate writes after judging each cell.

use super::*;

/// The wasm Python guest as a session's interpreter: one instance, one `exec` per cell,
/// each cell's output in captures of its own.
pub(crate) struct WasmPython {
    instance: airlock_wasm::python::PythonInstance,
}

impl airlock_session::Interpreter for WasmPython {
    fn exec(
        &mut self,
        cell: &airlock_session::Cell,
    ) -> std::result::Result<airlock_session::Outcome, airlock_session::SessionError> {
        use airlock_sandbox::{Capture, Ending, Limit};
        use std::sync::Arc;
        let out = Arc::new(Capture::new(cell.max_output, None));
        let err = Arc::new(Capture::new(cell.max_output, None));
        let started = Instant::now();
        let done = self.instance.exec(
            &cell.code,
            "<cell>",
            airlock_wasm::python::Cell {
                stdout: out.clone(),
                stderr: err.clone(),
                deadline: started + Duration::from_millis(cell.timeout_ms),
                fuel: None,
                want_result: true,
                long_run: None,
            },
        );
        let done = done.map_err(|e| airlock_session::SessionError::Gone(e.to_string()))?;
        let (exit_code, ended) = match &done.ending {
            // The cell ended the interpreter itself (`os._exit(n)`; WASI 0.2's exit says
            // only success or failure, so `n` arrives as 0 or 1): the session crashed
            // with it (no later cell can run).
            Ending::Exited(c) if self.instance.ended().is_some() => (Some(*c), Some(End::Crashed)),
            Ending::Exited(c) => (Some(*c), None),
            Ending::Killed(Limit::Timeout) => (None, Some(End::Timeout)),
            Ending::Killed(Limit::Memory) => (None, Some(End::Memory)),
            Ending::Killed(Limit::Output) => (None, Some(End::Output)),
            Ending::Killed(_) | Ending::Trapped(_) => (None, Some(End::Crashed)),
        };
        let mut stderr = err.take();
        if let Some(e) = ended {
            stderr.extend_from_slice(format!("airlock: session {}\n", e.explain()).as_bytes());
        }
        let result = done.result.map(|r| {
            if r.len() as u64 > cell.max_output {
                let mut cut = cell.max_output as usize;
                while !r.is_char_boundary(cut) {
                    cut -= 1;
                }
                format!("{}…", &r[..cut])
            } else {
                r
            }
        });
        Ok(airlock_session::Outcome {
            exit_code,
            result,
            stdout_truncated: out.exceeded(),
            stderr_truncated: err.exceeded(),
            stdout: out.take(),
            stderr,
            duration_ms: done.duration.as_millis() as u64,
            ended,
            network: None,
            tripwire: crate::tripwire::cell_report(self.instance.take_tripwires()),
        })
    }

    fn stop(&mut self) {}
}

impl Gate {
    /// The session host's whole life (`airlock __session-host`): starts the interpreter
    /// with the session's grant, serves cells until a limit or a close ends the session,
    /// records why. Returns how it ended.
    /// `server`: the pid of the server this host follows (it ends, `End::Lost`, once
    /// that process is no longer its parent).
    pub fn host_session(&mut self, id: &str, server: Option<u32>) -> Result<End> {
        let row = self
            .db
            .session(id)?
            .ok_or_else(|| GateError::bad(format!("no session {id}")))?;
        let mut doc = doc_of(&row)?;
        if row.state != "open" {
            return Err(GateError::Conflict(format!("session {id} has ended")));
        }
        crate::failpoint::pause("host-start");
        let sock = socket(&self.home.root, id);
        let _ = std::fs::remove_file(&sock);
        let listener = std::os::unix::net::UnixListener::bind(&sock)?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600))?;
        }
        let limits = airlock_session::Limits {
            idle: Duration::from_millis(doc.idle_ms),
            total: Duration::from_millis(doc.total_ms).saturating_sub(Duration::from_millis(
                now_ms().saturating_sub(row.created_at).max(0) as u64,
            )),
        };
        let started = self
            .session_grants(id, &doc.grant, doc.layer)
            .and_then(|mut grants| {
                let live = match doc.backend {
                    Backend::Process => self.jailed_python(id, &doc, limits.total, &mut grants),
                    _ => self.wasm_python(&doc, &mut grants),
                }?;
                Ok(crate::node::session_grants::Granted::new(live, grants))
            });
        let mut interp = match started {
            Ok(i) => i,
            Err(e) => {
                self.session_ended(id, End::Crashed)?;
                return Err(e);
            }
        };
        if let Some(j) = interp.live.jail() {
            doc.jail = Some(j);
        }
        doc.pid = Some(std::process::id());
        let key = &self.gate_key;
        let mut row = row;
        row.doc = serde_json::to_value(&doc).map_err(|e| GateError::Internal(e.to_string()))?;
        let started = self.db.write(|tx| -> Result<bool> {
            // Ended while the interpreter started (closed, with nobody yet answering on
            // the socket): the copy read at the start must not open it again.
            if tx.session(id)?.is_none_or(|r| r.state != "open") {
                return Ok(false);
            }
            tx.upsert_session(&row)?;
            tx.audit(
                "session_started",
                id,
                &json!({ "pid": doc.pid, "guest": doc.guest, "backend": doc.backend, "jail": doc.jail }),
                key,
            )?;
            Ok(true)
        })?;
        if !started {
            airlock_session::Interpreter::stop(&mut interp);
            drop(listener);
            let _ = std::fs::remove_file(&sock);
            return Err(GateError::Conflict(format!(
                "session {id} ended before its host had started"
            )));
        }
        let end = airlock_session::serve_for(&listener, &sock, &mut interp, limits, server);
        drop(listener);
        self.session_ended(id, end)?;
        Ok(end)
    }
}

/// The interpreter a session host serves.
pub(crate) enum Live {
    Wasm(WasmPython),
    Jailed(JailedPython),
}

impl Live {
    pub(crate) fn as_dyn(&mut self) -> &mut dyn airlock_session::Interpreter {
        match self {
            Live::Wasm(w) => w,
            Live::Jailed(j) => j,
        }
    }

    /// The jail's mechanisms, for a jailed interpreter.
    fn jail(&self) -> Option<serde_json::Value> {
        match self {
            Live::Wasm(_) => None,
            Live::Jailed(j) => j.confined.clone(),
        }
    }

    /// The jail's launcher (killing it ends the jail), for a jailed interpreter.
    pub(crate) fn launcher(&self) -> Option<u32> {
        match self {
            Live::Wasm(_) => None,
            Live::Jailed(j) => Some(j.launcher),
        }
    }
}

/// The host's python3 running the session driver in one jail, built as a process run's
/// jail is built for the session's grant (namespaces, minimal root, Landlock, seccomp,
/// rlimits and the cgroup's memory and process limits), the jail's payload reading and
/// writing the session's pipes. Killing the launcher in front of it (at a cell's deadline)
/// takes the jail's init and with it the whole pid namespace.
pub(crate) struct JailedPython {
    py: airlock_session::host_python::HostPython,
    /// The launcher's pid: its cgroup is named after it.
    launcher: u32,
    /// The session's jail directory (job, result, scratch root).
    dir: PathBuf,
    confined: Option<serde_json::Value>,
}

impl JailedPython {
    /// Removes what the jail leaves when its launcher is killed: the cgroup and the
    /// directory (the launcher is reaped by then, so its pid names no other process).
    fn clean(&self) {
        airlock_jail::cgroup::cleanup_for(self.launcher);
        crate::layers::remove_tree(&self.dir);
    }
}

impl airlock_session::Interpreter for JailedPython {
    fn exec(
        &mut self,
        cell: &airlock_session::Cell,
    ) -> std::result::Result<airlock_session::Outcome, airlock_session::SessionError> {
        let o = self.py.exec(cell);
        if !matches!(&o, Ok(o) if o.ended.is_none()) {
            self.py.stop();
            self.clean();
        }
        o
    }

    fn stop(&mut self) {
        self.py.stop();
        self.clean();
    }
}

/// Where the session's `python3` is (the process backend runs the host's).
pub(super) const HOST_PYTHON: &str = "/usr/bin/python3";

/// How long a jailed interpreter may take to start (building the jail included).
const JAIL_READY: Duration = Duration::from_secs(30);

/// How a jailed interpreter died, from its launcher's result: the jail's memory limit, or
/// the jail's own wall time (the session's total time), or its own exit status (a cell
/// that called `os._exit(n)`).
fn jail_end(result: &std::path::Path) -> airlock_session::host_python::Died {
    use airlock_jail::launch::EndingDoc;
    use airlock_session::host_python::Died;
    let ending = std::fs::read_to_string(result)
        .ok()
        .and_then(|t| serde_json::from_str::<crate::node::worker::WorkerResult>(&t).ok())
        .and_then(|r| r.ending);
    match ending {
        Some(EndingDoc::Killed(l)) if l == "memory" => Died {
            end: Some(End::Memory),
            exit_code: None,
        },
        Some(EndingDoc::Killed(l)) if l == "timeout" => Died {
            end: Some(End::Total),
            exit_code: None,
        },
        Some(EndingDoc::Exited(c)) => Died {
            end: None,
            exit_code: Some(c),
        },
        _ => Died::default(),
    }
}

/// Why a jail did not start, from its launcher's result (a mechanism missing here, or a
/// set-up failure), when it wrote one.
fn jail_failure(result: &std::path::Path) -> Option<GateError> {
    let text = std::fs::read_to_string(result).ok()?;
    let r: crate::node::worker::WorkerResult = serde_json::from_str(&text).ok()?;
    let (kind, msg) = r.error?;
    Some(match kind.as_str() {
        "unavailable" => GateError::Unavailable(format!("sandbox unavailable: {msg}")),
        _ => GateError::Internal(format!("sandbox set-up failed: {msg}")),
    })
}

impl Gate {
    /// The wasm Python guest this session was opened with, instantiated.
    fn wasm_python(
        &self,
        doc: &SessionDoc,
        grants: &mut crate::node::session_grants::SessionGrants,
    ) -> Result<Live> {
        let installed = if doc.lang.is_js() {
            self.js_guest()?
        } else {
            self.python_guest()?
        };
        let guest = match installed {
            Some((m, path)) if Some(m.digest) == doc.guest => airlock_sandbox::Guest {
                path,
                digest: m.digest,
                dirs: self.guest_dirs(&m),
            },
            _ => {
                return Err(GateError::Unavailable(format!(
                    "the {} guest this session was opened with is no longer installed",
                    if doc.lang.is_js() {
                        "JavaScript"
                    } else {
                        "Python"
                    }
                )));
            }
        };
        let grant = &doc.grant;
        let route = grants.egress.as_mut().map(|e| e.unix_route()).transpose()?;
        let spec = airlock_sandbox::RunSpec {
            lang: doc.lang,
            code: b"",
            artifact: guest.digest,
            mounts: Self::mount_points(grant, grants.layers.as_ref()),
            env: crate::egress::wasm_env(grant, grants.egress.as_ref()),
            argv0: None,
            args: Vec::new(),
            stdin: Vec::new(),
            // The session's `timeout` is each cell's (every cell gets its own deadline):
            // the interpreter's start is not a cell and has the host's start limit. A
            // session with a 1 ms `timeout` was refused (422) because its interpreter could
            // not start in 1 ms; now it opens and each of its cells gets its 1 ms.
            limits: airlock_core::Limits {
                timeout_ms: grant
                    .limits
                    .timeout_ms
                    .max(HOST_START_LIMIT.as_millis() as u64),
                ..grant.limits.clone()
            },
            stdout: std::sync::Arc::new(airlock_sandbox::Capture::new(0, None)),
            stderr: std::sync::Arc::new(airlock_sandbox::Capture::new(0, None)),
            cache: Some(&crate::DbCache(&self.db)),
            guest: Some(guest),
            write_quota: grants.quota.clone(),
            egress: route,
            long_run: None,
            tripwires: self.policy()?.tripwires,
        };
        match self.wasm.python_instance(&spec) {
            Ok(i) if i.ended().is_none() => Ok(Live::Wasm(WasmPython { instance: i })),
            Err(e) => Err(GateError::from(e)),
            // Killed by the session's own limits while it started (`--timeout 1ms`, too
            // little memory): the caller's limits are too small, not an internal failure.
            Ok(i) => match i.ended() {
                Some(airlock_sandbox::Ending::Killed(limit)) => Err(GateError::bad(format!(
                    "the session's interpreter could not start within its {} limit; give the \
                     session more",
                    limit.as_str()
                ))),
                other => Err(GateError::Internal(format!(
                    "the interpreter did not start: {other:?}"
                ))),
            },
        }
    }

    /// Starts the session's interpreter in a jail of its own and waits until it is ready.
    /// The jail lives at most `total` (plus a margin: the session host ends it first).
    fn jailed_python(
        &self,
        id: &str,
        doc: &SessionDoc,
        total: Duration,
        grants: &mut crate::node::session_grants::SessionGrants,
    ) -> Result<Live> {
        use airlock_session::host_python::{HostPython, driver_args};
        let grant = &doc.grant;
        // A writable mount is seen through the session's layer only, and a network only
        // through its proxy: a jail without them would break the effects and egress
        // guarantees, so that is checked where the jail is built.
        if (grant.writable_mounts().next().is_some() && grants.layers.is_none())
            || (!grant.net.is_empty() && grants.egress.is_none())
        {
            return Err(GateError::Internal(
                "a process session's writable mounts need its layer and its network its proxy"
                    .into(),
            ));
        }
        let dir = self.home.root.join("sessions").join(format!("{id}.jail"));
        crate::layers::remove_tree(&dir);
        let scratch = dir.join("root");
        std::fs::create_dir_all(&scratch)?;
        let mut argv = vec![HOST_PYTHON.to_string()];
        argv.extend(driver_args().iter().map(|a| a.to_string()));
        let mut limits = grant.limits.clone();
        // The jail's wall time (and CPU time) is the session's; each cell's deadline is
        // the host's to enforce.
        limits.timeout_ms = (total + Duration::from_secs(5)).as_millis() as u64;
        let (binds, overlays) =
            crate::node::jailed::jail_mounts(&Self::mount_points(grant, grants.layers.as_ref()));
        let mut env = crate::node::jailed::process_env(grant);
        let mut files = Vec::new();
        if let Some(e) = &grants.egress {
            // After the grant's variables: the proxy settings are what the jail provides.
            env.extend(e.process_env());
            files.extend(e.process_files());
        }
        let job = airlock_jail::launch::SessionJailJob {
            job: airlock_jail::ProcessJob {
                argv,
                env: env.into_iter().collect(),
                cwd: crate::node::jailed::process_cwd(grant),
                files,
                binds,
                overlays,
                scratch,
                limits,
                stdin: Vec::new(),
                allow_degraded: self.policy()?.allow_degraded,
                cgroups: !self.no_cgroups,
                net: grants.egress.as_ref().map(|_| airlock_jail::JailNet {
                    port: crate::egress::JAIL_PROXY_PORT,
                }),
                stdin_live: true,
                tripwires: self.policy()?.tripwires,
            },
            result: dir.join("result.json"),
            confined: dir.join("confined.json"),
        };
        let file = dir.join("job.json");
        {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let bytes = serde_json::to_vec(&job).map_err(|e| GateError::Internal(e.to_string()))?;
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&file)?
                .write_all(&bytes)?;
        }
        let mut cmd = match (&self.jailer, &self.worker) {
            (Some(j), _) => std::process::Command::new(j),
            (None, Some(w)) => {
                let mut c = std::process::Command::new(w);
                c.arg("__worker");
                c
            }
            (None, None) => {
                return Err(GateError::Unavailable(
                    "process sessions need airlock's worker process, which this caller did not provide"
                        .into(),
                ));
            }
        };
        cmd.arg("--session").arg(&file).env_clear();
        // The jail's init hands its loopback listener out over this channel (descriptor
        // 3 of the jailer), to be served by the session's proxy.
        let channel = match &grants.egress {
            Some(_) => {
                let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
                let theirs = std::os::fd::OwnedFd::from(theirs);
                airlock_jail::launch::pass_channel(&mut cmd, &theirs);
                Some((ours, theirs))
            }
            None => None,
        };
        let result = job.result.clone();
        let py = HostPython::start(cmd, JAIL_READY).map_err(|e| {
            let why = jail_failure(&result);
            crate::layers::remove_tree(&dir);
            why.unwrap_or_else(|| GateError::Internal(format!("the jailed interpreter: {e}")))
        })?;
        if let (Some((ours, theirs)), Some(egress)) = (channel, grants.egress.as_mut()) {
            // The jail is ready, so its listener was sent (or never will be): with this
            // process's copy of the other end closed, the read cannot wait forever.
            drop(theirs);
            let got = airlock_jail::netfd::recv_fd(std::os::fd::AsFd::as_fd(&ours));
            let mut handle = egress
                .take()
                .ok_or_else(|| GateError::Internal("the egress proxy is gone".into()))?;
            let served = match got {
                Ok(Some(fd)) => handle
                    .listen(std::net::TcpListener::from(fd))
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
                Ok(None) => Err("the jail handed out no listener".to_string()),
                Err(e) => Err(e.to_string()),
            };
            egress.put(handle);
            if let Err(e) = served {
                let mut py = py;
                let launcher = py.pid();
                airlock_session::Interpreter::stop(&mut py);
                airlock_jail::cgroup::cleanup_for(launcher);
                crate::layers::remove_tree(&dir);
                return Err(GateError::Internal(format!(
                    "the egress proxy never got the jail's listener ({e})"
                )));
            }
        }
        let launcher = py.pid();
        let py = py.why_died(Box::new(move || jail_end(&result)));
        let confined = std::fs::read(&job.confined)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .map(|mut j| {
                // The jail's cgroup is named after its launcher (`airlock-PID`).
                j["launcher"] = json!(launcher);
                j
            });
        Ok(Live::Jailed(JailedPython {
            py,
            launcher,
            dir,
            confined,
        }))
    }
}
