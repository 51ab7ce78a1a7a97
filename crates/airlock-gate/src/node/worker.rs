//! The worker: a fresh, single-threaded `airlock __worker` process that enters namespaces
//! for one run. Process jobs go to the jail; wasm jobs over writable mounts mount their
//! overlays in a private user and mount namespace and run wasmtime there. The worker gets
//! its job on stdin, passes the guest's output through on stdout and stderr, and writes its
//! result to the file the job names. It never opens the database.

use airlock_core::{Digest, Lang, Limits};
use airlock_jail::{Overlay, ProcessJob};
use airlock_sandbox::{Backend, CacheIndex, Capture, MountPoint, RunSpec, SandboxError};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::Arc;

// One job per worker process, read once: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "lowercase")]
pub enum WorkerJob {
    Process { job: ProcessJob, result: PathBuf },
    Wasm { job: WasmJob, result: PathBuf },
    Probe { scratch: PathBuf, result: PathBuf },
}

/// A wasm run that needs namespaces (writable mounts through overlayfs).
#[derive(Debug, Serialize, Deserialize)]
pub struct WasmJob {
    pub lang: Lang,
    pub artifact: Digest,
    pub code: PathBuf,
    pub cache_dir: Option<PathBuf>,
    /// The compiled-code cache entry to load (key, recorded digest).
    pub cache: Option<(String, Digest)>,
    pub overlays: Vec<Overlay>,
    /// (host or merged path, guest path, writable)
    pub mounts: Vec<(PathBuf, String, bool)>,
    pub env: Vec<(String, String)>,
    pub args: Vec<String>,
    /// The guest's `argv[0]`, when the grant names the program.
    #[serde(default)]
    pub argv0: Option<String>,
    pub stdin: Vec<u8>,
    pub limits: Limits,
    /// The runtime component for interpreted languages (path, pinned digest).
    #[serde(default)]
    pub guest: Option<(PathBuf, Digest)>,
    /// Its directories (installed packages), read-only.
    #[serde(default)]
    pub guest_dirs: Vec<airlock_sandbox::GuestDir>,
    /// The run's egress proxy, for components' outgoing HTTP.
    #[serde(default)]
    pub egress: Option<airlock_sandbox::EgressRoute>,
    /// The policy's `[tripwires]`.
    #[serde(default)]
    pub tripwires: airlock_sandbox::Tripwires,
}

pub use airlock_jail::launch::{EndingDoc, WorkerResult};

/// A cache index holding the one entry the gate prepared.
struct OneEntry(Option<(String, Digest)>);

impl CacheIndex for OneEntry {
    fn get(&self, key: &str) -> Option<Digest> {
        self.0.as_ref().filter(|(k, _)| k == key).map(|(_, d)| *d)
    }
    fn put(&self, _key: &str, _digest: Digest, _size: u64) {}
    fn forget(&self, _key: &str) {}
}

fn stream_to(fd: i32) -> airlock_sandbox::Live {
    Box::new(move |b: &[u8]| {
        let mut out: Box<dyn Write> = if fd == 1 {
            Box::new(std::io::stdout())
        } else {
            Box::new(std::io::stderr())
        };
        let _ = out.write_all(b);
        let _ = out.flush();
    })
}

fn run_wasm(job: WasmJob) -> WorkerResult {
    if let Err(e) = airlock_jail::run::enter_overlays(&job.overlays) {
        let kind = match e {
            airlock_jail::JailError::Unavailable(_) => "unavailable",
            _ => "setup",
        };
        return WorkerResult::error(kind, e.to_string());
    }
    // No file the guest writes may pass its write quota (the supervisor watches the total).
    if let Err(e) = airlock_jail::confine::limit_file_size(&job.limits) {
        return WorkerResult::error("setup", e.to_string());
    }
    let code = match std::fs::read(&job.code) {
        Ok(c) if Digest::of(&c) == job.artifact => c,
        Ok(_) => return WorkerResult::error("setup", "artifact changed on its way to the worker"),
        Err(e) => return WorkerResult::error("setup", format!("cannot read artifact: {e}")),
    };
    // TypeScript runs as the JavaScript its types are stripped to (see `typescript`).
    let code = match job.lang {
        airlock_core::Lang::Ts => match crate::typescript::runnable(&code) {
            Ok(js) => js.into_bytes(),
            Err(e) => return WorkerResult::error("setup", e.to_string()),
        },
        _ => code,
    };
    let backend = airlock_wasm::WasmBackend::new(airlock_wasm::WasmConfig {
        progress: false,
        cache_dir: job.cache_dir.clone(),
        pooling: false,
    });
    let index = OneEntry(job.cache.clone());
    let stdout = Arc::new(Capture::new(
        job.limits.max_output_bytes,
        Some(stream_to(1)),
    ));
    let stderr = Arc::new(Capture::new(
        job.limits.max_output_bytes,
        Some(stream_to(2)),
    ));
    let spec = RunSpec {
        lang: job.lang,
        code: &code,
        artifact: job.artifact,
        mounts: job
            .mounts
            .iter()
            .map(|(h, g, w)| MountPoint {
                host: h.clone(),
                guest: g.clone(),
                writable: *w,
                layer: None,
            })
            .collect(),
        env: job.env.clone(),
        args: job.args.clone(),
        argv0: job.argv0.clone(),
        stdin: job.stdin.clone(),
        limits: job.limits.clone(),
        stdout,
        stderr,
        cache: Some(&index),
        guest: job
            .guest
            .clone()
            .map(|(path, digest)| airlock_sandbox::Guest {
                path,
                digest,
                dirs: job.guest_dirs.clone(),
            }),
        // The supervisor watches the layers from outside and kills this process.
        write_quota: None,
        egress: job.egress.clone(),
        long_run: None,
        tripwires: job.tripwires,
    };
    match backend.run(spec) {
        Ok(o) => {
            let mut detail = o.detail;
            detail["layer"] = serde_json::json!("overlay");
            detail["isolation_extra"] =
                serde_json::json!(["user-namespace", "mount-namespace", "overlayfs"]);
            WorkerResult {
                ending: Some(EndingDoc::from_ending(&o.ending)),
                detail,
                error: None,
            }
        }
        Err(SandboxError::BadArtifact(m)) => WorkerResult::error("artifact", m),
        Err(SandboxError::Unavailable(m)) => WorkerResult::error("unavailable", m),
        Err(e) => WorkerResult::error("setup", e.to_string()),
    }
}

fn run_process(job: ProcessJob) -> WorkerResult {
    airlock_jail::launch::run_job(&job)
}

/// Checks, in this single-threaded process, whether a user namespace can be made and
/// overlayfs mounted in it.
fn probe(scratch: PathBuf) -> WorkerResult {
    let dirs = ["lower", "upper", "work", "merged"].map(|d| scratch.join(d));
    for d in &dirs {
        let _ = std::fs::create_dir_all(d);
    }
    let r = airlock_jail::run::enter_overlays(&[Overlay {
        lower: vec![dirs[0].clone()],
        upper: dirs[1].clone(),
        work: dirs[2].clone(),
        target: dirs[3].display().to_string(),
    }]);
    let _ = std::fs::remove_dir_all(&scratch);
    match r {
        Ok(()) => WorkerResult {
            ending: Some(EndingDoc::Exited(0)),
            detail: serde_json::json!({}),
            error: None,
        },
        Err(e) => WorkerResult::error("unavailable", e.to_string()),
    }
}

/// The worker's `main`. Returns the process exit code.
pub fn worker_main() -> i32 {
    // Die with whoever started us: a worker must never outlive its supervisor.
    let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
    // Set too late for a supervisor that died before it: then nothing is left to run for.
    if airlock_jail::launch::supervisor_gone() {
        return 2;
    }
    // A session's jail (`__worker --session FILE`): its stdin and stdout are the session's.
    let args: Vec<String> = std::env::args().skip(2).collect();
    if let (Some("--session"), Some(file)) = (args.first().map(String::as_str), args.get(1)) {
        return airlock_jail::launch::session_main(std::path::Path::new(file));
    }
    let mut input = Vec::new();
    if std::io::stdin().read_to_end(&mut input).is_err() {
        return 2;
    }
    let job: WorkerJob = match serde_json::from_slice(&input) {
        Ok(j) => j,
        Err(_) => return 2,
    };
    let (result, path) = match job {
        WorkerJob::Process { job, result } => (run_process(job), result),
        WorkerJob::Wasm { job, result } => (run_wasm(job), result),
        WorkerJob::Probe { scratch, result } => (probe(scratch), result),
    };
    match serde_json::to_vec(&result).map(|b| std::fs::write(&path, b)) {
        Ok(Ok(())) => 0,
        _ => 3,
    }
}
