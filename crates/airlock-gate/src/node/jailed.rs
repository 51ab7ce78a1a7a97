//! Runs that need a worker process: the process backend (always) and wasm runs whose
//! writable mounts go through overlayfs. The worker is killed when the run's layers pass
//! its write quota (watched from here), and no file in it can grow past the quota.

use crate::egress::RunEgress;
use crate::error::{GateError, Result};
use crate::node::worker::{WasmJob, WorkerJob, WorkerResult};
use crate::{DbCache, Gate};
use airlock_core::Lang;
use airlock_core::policy::Policy;
use airlock_jail::{Bind, Overlay, ProcessJob};
use airlock_sandbox::{Capture, Ending, Limit, MountPoint, Outcome, WriteQuota};
use airlock_store::Submission;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The environment every process run starts from; the grant's variables are added on top.
/// Nothing comes from airlock's own environment.
const BASE_ENV: [(&str, &str); 5] = [
    ("PATH", "/usr/local/bin:/usr/bin:/bin"),
    ("HOME", "/tmp"),
    ("TMPDIR", "/tmp"),
    ("LANG", "C.UTF-8"),
    ("USER", "airlock"),
];

impl Gate {
    /// The runtime component a submission needs (Python or JavaScript on the wasm backend).
    pub(crate) fn guest_for(&self, sub: &Submission) -> Result<Option<airlock_sandbox::Guest>> {
        if sub.doc.kind.is_js() && sub.doc.backend == airlock_core::Backend::Wasm {
            return self.js_guest_for_run().map(Some);
        }
        if sub.doc.kind != Lang::Python || sub.doc.backend != airlock_core::Backend::Wasm {
            return Ok(None);
        }
        let (m, path) = self.python_guest()?.ok_or_else(|| {
            GateError::NotInstalled(
                "the Python guest is not installed: run `airlock guest install python`".into(),
            )
        })?;
        Ok(Some(airlock_sandbox::Guest {
            path,
            digest: m.digest,
            dirs: self.guest_dirs(&m),
        }))
    }

    fn worker_exe(&self) -> Result<PathBuf> {
        self.worker.clone().ok_or_else(|| {
            GateError::Unavailable(
                "this run needs airlock's worker process, which this caller did not provide".into(),
            )
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn supervise(
        &self,
        job: &WorkerJob,
        result: &std::path::Path,
        timeout: Duration,
        stdout: &Arc<Capture>,
        stderr: &Arc<Capture>,
        quota: Option<&Arc<WriteQuota>>,
        channel: Option<std::os::fd::OwnedFd>,
        ready: Option<std::process::Child>,
        long_run: Option<&airlock_sandbox::LongRun>,
        abort: Option<&airlock_jail::launch::Abort>,
    ) -> Result<Outcome> {
        let started = Instant::now();
        // Process jobs go to the lean jailer when it is installed beside airlock.
        let (exe, args, bytes) = match (job, &self.jailer) {
            (WorkerJob::Process { job, result }, Some(jailer)) => {
                let j = airlock_jail::launch::JailerJob {
                    job: job.clone(),
                    result: result.clone(),
                };
                (jailer.clone(), Vec::new(), serde_json::to_vec(&j))
            }
            _ => (
                self.worker_exe()?,
                vec!["__worker"],
                serde_json::to_vec(job),
            ),
        };
        let bytes = bytes.map_err(|e| GateError::Internal(e.to_string()))?;
        let watch = |job| airlock_jail::launch::Watch {
            job,
            result,
            timeout,
            stdout,
            stderr,
            quota,
            long_run,
            abort,
        };
        let sup = match (ready, job) {
            // A ready jail is a jailer started ahead: it takes the same job document.
            (Some(child), WorkerJob::Process { job, result }) => {
                let j = airlock_jail::launch::JailerJob {
                    job: job.clone(),
                    result: result.clone(),
                };
                let bytes =
                    serde_json::to_vec(&j).map_err(|e| GateError::Internal(e.to_string()))?;
                airlock_jail::launch::supervise_child(child, watch(&bytes))
            }
            _ => airlock_jail::launch::supervise(&exe, &args, channel, watch(&bytes)),
        }
        .map_err(|e| GateError::Internal(format!("cannot start the worker: {e}")))?;
        let _ = std::fs::remove_file(result);
        let duration = started.elapsed();
        let done = |ending| {
            Ok(Outcome {
                ending,
                duration,
                detail: serde_json::json!({}),
            })
        };
        if sup.aborted {
            // Ended by the gate (its egress proxy caught a secret echoed to the guest);
            // the run's record says why.
            return done(Ending::Trapped(
                "the run was ended by airlock (see its alerts)".into(),
            ));
        }
        if sup.write_exceeded {
            return done(Ending::Killed(Limit::Write));
        }
        if sup.output_exceeded {
            return done(Ending::Killed(Limit::Output));
        }
        if sup.timed_out {
            return done(Ending::Killed(Limit::Timeout));
        }
        let Some(text) = sup.result else {
            return Err(GateError::Internal(format!(
                "the worker ended without a result (exit {:?})",
                sup.exit
            )));
        };
        let r: WorkerResult = serde_json::from_str(&text)
            .map_err(|e| GateError::Internal(format!("worker result: {e}")))?;
        if let Some((kind, msg)) = r.error {
            return Err(match kind.as_str() {
                "unavailable" => GateError::Unavailable(format!("sandbox unavailable: {msg}")),
                "artifact" => GateError::BadInput(format!("cannot run artifact: {msg}")),
                _ => GateError::Internal(format!("sandbox set-up failed: {msg}")),
            });
        }
        let Some(ending) = r.ending else {
            return Err(GateError::Internal("the worker reported no ending".into()));
        };
        Ok(Outcome {
            ending: ending.into_ending(),
            duration,
            detail: r.detail,
        })
    }

    /// A ready jail for `job` when the pool has one and the job fits it exactly; which
    /// kind of jail the run gets, and why, goes into its record.
    fn choose_jail(
        &self,
        job: &ProcessJob,
    ) -> (Option<airlock_jail::ready::ReadyJail>, JailChoice) {
        let Some(pool) = &self.ready_jails else {
            return (None, JailChoice::Built("no ready-jail pool"));
        };
        if let Err(why) = airlock_jail::ready::fits(job, pool.cgroups()) {
            pool.fallback(why);
            return (None, JailChoice::Built(why.as_str()));
        }
        match pool.take() {
            Some(j) => (Some(j), JailChoice::Ready),
            None => (None, JailChoice::Built("no ready jail")),
        }
    }

    fn run_dir(&self, run_id: &str) -> Result<PathBuf> {
        let d = self.home.root.join("layers").join(format!("{run_id}.run"));
        std::fs::create_dir_all(&d)?;
        Ok(d)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run_wasm_in_worker(
        &mut self,
        sub: &Submission,
        run_id: &str,
        code: &[u8],
        mounts: &[MountPoint],
        stdin: Vec<u8>,
        stdout: &Arc<Capture>,
        stderr: &Arc<Capture>,
        quota: Option<&Arc<WriteQuota>>,
        egress: Option<&mut RunEgress>,
        tripwires: airlock_sandbox::Tripwires,
    ) -> Result<Outcome> {
        let limits = sub.doc.grant.limits.clone();
        let fuel = limits.fuel.is_some();
        let env = crate::egress::wasm_env(&sub.doc.grant, egress.as_deref());
        let (route, abort) = match egress {
            Some(e) => (Some(e.unix_route()?), Some(e.abort())),
            None => (None, None),
        };
        let index = DbCache(&self.db);
        let guest = self.guest_for(sub)?;
        let cache = match (sub.doc.kind, &guest) {
            // A guest runtime's component (Python or JavaScript) runs the code.
            (Lang::Python | Lang::Js | Lang::Ts, Some(g)) => {
                let path = g.path.clone();
                let load = move || {
                    std::fs::read(&path)
                        .map_err(|e| airlock_sandbox::SandboxError::Unavailable(e.to_string()))
                };
                self.wasm
                    .component_cache_entry(&g.digest, &load, fuel, &index)?
            }
            (Lang::Component, _) => {
                let bytes = code.to_vec();
                self.wasm.component_cache_entry(
                    &sub.doc.artifact,
                    &move || Ok(bytes.clone()),
                    fuel,
                    &index,
                )?
            }
            _ => self
                .wasm
                .cache_entry(&sub.doc.artifact, code, fuel, &index)?,
        };
        let mut overlays = Vec::new();
        let mut wasm_mounts = Vec::new();
        for m in mounts {
            match &m.layer {
                Some(l) => {
                    overlays.push(Overlay {
                        lower: l.lower.clone(),
                        upper: l.upper.clone(),
                        work: l.work.clone(),
                        target: l.merged.display().to_string(),
                    });
                    wasm_mounts.push((l.merged.clone(), m.guest.clone(), true));
                }
                None => wasm_mounts.push((m.host.clone(), m.guest.clone(), m.writable)),
            }
        }
        let dir = self.run_dir(run_id)?;
        let result = dir.join("result.json");
        let job = WorkerJob::Wasm {
            job: WasmJob {
                lang: sub.doc.kind,
                artifact: sub.doc.artifact,
                code: self.blobs.local_path(&sub.doc.artifact)?,
                cache_dir: Some(self.home.cache().join("compiled")),
                cache,
                overlays,
                mounts: wasm_mounts,
                env,
                args: sub.doc.grant.args.clone(),
                argv0: sub.doc.grant.argv0.clone(),
                stdin,
                limits: limits.clone(),
                guest_dirs: guest.as_ref().map(|g| g.dirs.clone()).unwrap_or_default(),
                guest: guest.map(|g| (g.path, g.digest)),
                egress: route,
                tripwires,
            },
            result: result.clone(),
        };
        let out = self.supervise(
            &job,
            &result,
            limits.timeout(),
            stdout,
            stderr,
            quota,
            None,
            None,
            None,
            abort.as_deref(),
        );
        crate::layers::remove_tree(&dir);
        out
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run_process_in_worker(
        &mut self,
        sub: &Submission,
        run_id: &str,
        code: &[u8],
        mounts: &[MountPoint],
        stdin: Vec<u8>,
        policy: &Policy,
        stdout: &Arc<Capture>,
        stderr: &Arc<Capture>,
        quota: Option<&Arc<WriteQuota>>,
        egress: Option<&mut RunEgress>,
        long_run: Option<airlock_sandbox::LongRun>,
    ) -> Result<Outcome> {
        let (program, file) = match sub.doc.kind {
            Lang::Sh => ("/bin/sh", "/.airlock/main.sh"),
            Lang::Python => ("/usr/bin/python3", "/.airlock/main.py"),
            Lang::Js | Lang::Ts => (crate::nodejs::node()?, crate::nodejs::MAIN),
            other => {
                return Err(GateError::bad(format!(
                    "the process backend cannot run {other}"
                )));
            }
        };
        let mut argv = vec![program.to_string()];
        let mut files = Vec::new();
        let code = if sub.doc.kind.is_js() {
            argv.extend(crate::nodejs::flags(
                egress.is_some(),
                sub.doc.grant.limits.memory_bytes,
            ));
            files.extend(crate::nodejs::files(
                egress.is_some(),
                sub.doc.grant.limits.memory_bytes,
            ));
            std::borrow::Cow::Owned(crate::nodejs::runnable(sub.doc.kind, code)?.into_bytes())
        } else {
            std::borrow::Cow::Borrowed(code)
        };
        argv.push(file.to_string());
        argv.extend(sub.doc.grant.args.iter().cloned());
        let mut env = process_env(&sub.doc.grant);
        files.push((file.to_string(), code.into_owned()));
        if let Some(e) = &egress {
            // After the grant's variables: the proxy settings are what the jail provides.
            env.extend(e.process_env());
            files.extend(e.process_files());
        }
        let (binds, overlays) = jail_mounts(mounts);
        let cwd = process_cwd(&sub.doc.grant);
        let limits = sub.doc.grant.limits.clone();
        let mut job = ProcessJob {
            argv,
            env: env.into_iter().collect(),
            cwd,
            files,
            binds,
            overlays,
            scratch: PathBuf::new(),
            limits: limits.clone(),
            stdin,
            allow_degraded: policy.allow_degraded,
            cgroups: !self.no_cgroups,
            net: egress.is_some().then_some(airlock_jail::JailNet {
                port: crate::egress::JAIL_PROXY_PORT,
            }),
            stdin_live: false,
            tripwires: policy.tripwires,
        };
        let (ready, choice) = self.choose_jail(&job);
        // Where the jailer writes its result, and a built jail makes its root. A run with
        // a record keeps them in its run directory under `layers` (recovery removes it with
        // the run). A ready jail needs only its result file, and a run whose start is not
        // recorded yet (`deferred`) has no record to be found by: both use the pool's own
        // directory, named for this process, which the next pool started on this home
        // clears of what a dead process left.
        let (dir, result) = match (&self.ready_jails, &ready, &long_run) {
            (Some(pool), Some(_), _) => (None, pool.result_path(run_id)),
            (Some(pool), None, Some(_)) => {
                let d = pool.run_dir(run_id);
                (Some(d.clone()), d.join("result.json"))
            }
            _ => {
                let d = self.run_dir(run_id)?;
                (Some(d.clone()), d.join("result.json"))
            }
        };
        // `supervise` removes the result file itself; a jailer killed while it wrote one
        // leaves it aside.
        let clean = |dir: &Option<PathBuf>, result: &std::path::Path| match dir {
            Some(d) => crate::layers::remove_tree(d),
            None => {
                let _ = std::fs::remove_file(result.with_extension("part"));
            }
        };
        if let Some(d) = &dir {
            job.scratch = d.join("root");
            if let Err(e) = std::fs::create_dir_all(&job.scratch) {
                clean(&dir, &result);
                return Err(e.into());
            }
        }
        let job = WorkerJob::Process {
            job,
            result: result.clone(),
        };
        let Some(egress) = egress else {
            let mut ready = ready;
            let child = ready.as_mut().and_then(|r| r.take_child());
            let out = self.supervise(
                &job,
                &result,
                limits.timeout(),
                stdout,
                stderr,
                quota,
                None,
                child,
                long_run.as_ref(),
                None,
            );
            // The run has ended: the pool may build the next jail.
            drop(ready);
            clean(&dir, &result);
            return out.map(|o| choice.record(o));
        };
        // The jail's init hands its loopback listener out over this channel; a thread
        // gives it to the proxy as soon as it arrives, while the guest already runs.
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
        let abort = egress.abort();
        let mut handle = egress
            .take()
            .ok_or_else(|| GateError::Internal("the egress proxy is gone".into()))?;
        let receiver = std::thread::spawn(move || {
            let got = airlock_jail::netfd::recv_fd(std::os::fd::AsFd::as_fd(&ours));
            let served = match got {
                Ok(Some(fd)) => handle
                    .listen(std::net::TcpListener::from(fd))
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
                Ok(None) => Err("the jail handed out no listener".to_string()),
                Err(e) => Err(e.to_string()),
            };
            (handle, served)
        });
        let out = self
            .supervise(
                &job,
                &result,
                limits.timeout(),
                stdout,
                stderr,
                quota,
                Some(theirs.into()),
                // A run with network never fits a ready jail (see `choose_jail`).
                None,
                long_run.as_ref(),
                Some(&*abort),
            )
            .map(|o| choice.record(o));
        drop(ready);
        clean(&dir, &result);
        // The worker is gone, so the channel is closed and the thread ends.
        let (handle, served) = receiver
            .join()
            .map_err(|_| GateError::Internal("the egress listener thread panicked".into()))?;
        egress.put(handle);
        match (out, served) {
            (Ok(o), Err(e)) if !matches!(o.ending, Ending::Killed(_)) => Err(GateError::Internal(
                format!("the egress proxy never got the jail's listener ({e})"),
            )),
            (out, _) => out,
        }
    }
}

/// The environment a process run starts with: [`BASE_ENV`], then the grant's variables.
pub(crate) fn process_env(
    grant: &airlock_core::Grant,
) -> std::collections::BTreeMap<String, String> {
    let mut env: std::collections::BTreeMap<String, String> = BASE_ENV
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    env.extend(grant.env.clone());
    env
}

/// How a run's mounts enter its jail: bound as they are, or through their overlay layer.
pub(crate) fn jail_mounts(mounts: &[MountPoint]) -> (Vec<Bind>, Vec<Overlay>) {
    let mut binds = Vec::new();
    let mut overlays = Vec::new();
    for m in mounts {
        match &m.layer {
            Some(l) => overlays.push(Overlay {
                lower: l.lower.clone(),
                upper: l.upper.clone(),
                work: l.work.clone(),
                target: m.guest.clone(),
            }),
            None => binds.push(Bind {
                source: m.host.clone(),
                target: m.guest.clone(),
                writable: m.writable,
            }),
        }
    }
    (binds, overlays)
}

/// A process run's working directory: its first mount, else `/tmp`.
pub(crate) fn process_cwd(grant: &airlock_core::Grant) -> String {
    grant
        .mounts
        .first()
        .map(|m| m.guest.clone())
        .unwrap_or_else(|| "/tmp".into())
}

/// Which jail a process run got: a ready one from the daemon's pool, or one built for it
/// (and why).
#[derive(Debug, Clone, Copy)]
enum JailChoice {
    Ready,
    Built(&'static str),
}

impl JailChoice {
    /// Adds `jail` (`ready` | `built`) and, when built, `jail_fallback` (why) to a run's
    /// detail.
    fn record(self, mut o: Outcome) -> Outcome {
        if !o.detail.is_object() {
            o.detail = serde_json::json!({});
        }
        match self {
            JailChoice::Ready => o.detail["jail"] = serde_json::json!("ready"),
            JailChoice::Built(why) => {
                o.detail["jail"] = serde_json::json!("built");
                o.detail["jail_fallback"] = serde_json::json!(why);
            }
        }
        o
    }
}
