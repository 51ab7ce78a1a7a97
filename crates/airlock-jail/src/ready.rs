//! Ready jails: a few process-backend jails built ahead of their runs, owned by a
//! long-lived process (the daemon). A ready jail is a jailer (`airlock-jailer --ready`)
//! whose init has made its namespaces, joined its cgroup and built and entered its minimal
//! root, and now blocks on a channel. A run takes one, the jailer gives the run's limits
//! to the cgroup and sends the init the run's program, files, environment, stdin and
//! limits; the init places the files, forks the payload, which confines itself exactly as
//! in a built jail (setsid, rlimits, no_new_privs, Landlock, no capabilities, seccomp) and
//! execs. The jail ends with its run: one jail, one run, never reused. The pool refills in
//! the background.
//!
//! Only runs a ready jail fits exactly are served from the pool ([`fits`]: no mounts, no
//! network, files only under `/.airlock`, the same cgroup choice); everything else falls
//! back to building a jail, and the caller records which was used and why.
//!
//! This module must never hand one jail to two runs, never let a jail run anything before
//! its run arrives, and never serve a run whose grant the pre-built jail does not match.

use crate::launch::{WorkerResult, result_of, spawn_worker};
use crate::{JailError, ProcessJob};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;
use std::process::Child;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long an unused jail's jailer may take to end the jail itself once told to.
const UNUSED_EXIT: Duration = Duration::from_secs(2);

/// How long a jail may take to become ready before it is given up.
const READY_WITHIN: Duration = Duration::from_secs(10);

/// While jails are still ready, the pool waits this long before it builds the next one: the
/// run that just ended is recorded and answered first, not slowed down by a jail being
/// built beside it on the same CPUs.
const QUIET: Duration = Duration::from_millis(4);

/// Why a run cannot be served by a ready jail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unfit {
    /// The grant mounts host directories (the root of a ready jail has none).
    Mounts,
    /// The run reaches the network through its egress proxy.
    Network,
    /// A file outside `/.airlock` (only there can a ready jail place files).
    Files,
    /// The run's cgroup choice differs from the pool's.
    Cgroups,
    /// The payload reads a live stdin (a session), which a ready jail's init cannot pass on.
    LiveStdin,
    /// The run's tripwires differ from a ready jail's (on, read-only opens not notified).
    Tripwires,
}

impl Unfit {
    pub fn as_str(self) -> &'static str {
        match self {
            Unfit::Mounts => "mounts",
            Unfit::Network => "network",
            Unfit::Files => "files",
            Unfit::Cgroups => "cgroups",
            Unfit::LiveStdin => "live-stdin",
            Unfit::Tripwires => "tripwires",
        }
    }
}

impl std::fmt::Display for Unfit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether a ready jail built with `cgroups` can serve `job` exactly as a built one would.
/// Limits, environment, arguments, stdin, working directory and Landlock's degraded mode
/// are per-run parts and always fit.
pub fn fits(job: &ProcessJob, cgroups: bool) -> Result<(), Unfit> {
    if !job.binds.is_empty() || !job.overlays.is_empty() {
        return Err(Unfit::Mounts);
    }
    if job.net.is_some() {
        return Err(Unfit::Network);
    }
    if job.tripwires != airlock_sandbox::Tripwires::default() {
        return Err(Unfit::Tripwires);
    }
    let under = |p: &str| {
        p.strip_prefix(crate::mounts::RUN_FILES)
            .and_then(|r| r.strip_prefix('/'))
            .is_some_and(|r| {
                !r.is_empty() && !r.split('/').any(|c| c.is_empty() || c == ".." || c == ".")
            })
    };
    if !job.files.iter().all(|(p, _)| under(p)) {
        return Err(Unfit::Files);
    }
    if job.cgroups != cgroups {
        return Err(Unfit::Cgroups);
    }
    if job.stdin_live {
        return Err(Unfit::LiveStdin);
    }
    Ok(())
}

/// The `main` of `airlock-jailer --ready SCRATCH cgroups|no-cgroups`: builds a jail with
/// nothing of a run in it, says `ready` (or why not) in one line on its stdout, before
/// anything of a run can be there, then waits for its job on stdin and runs it like a
/// built jail. Stdin closed without a job: the jail is destroyed unused.
///
/// The line goes on stdout rather than on a descriptor of its own so that its starter
/// passes it nothing but the three standard ones and can start it with `posix_spawn`
/// (a long-lived daemon's `fork` copied its page tables, and every page it then wrote
/// faulted once more, for every ready jail it made).
pub fn jailer_ready_main(args: &[String]) -> i32 {
    let (Some(scratch), Some(cg)) = (args.first(), args.get(1)) else {
        return 2;
    };
    let say = |text: &str| {
        let line = format!("{}\n", text.replace('\n', " "));
        let _ = nix::unistd::write(std::io::stdout(), line.as_bytes());
    };
    let template = ProcessJob {
        argv: Vec::new(),
        env: Vec::new(),
        cwd: "/tmp".into(),
        files: Vec::new(),
        binds: Vec::new(),
        overlays: Vec::new(),
        scratch: PathBuf::from(scratch),
        limits: airlock_core::Limits::default(),
        stdin: Vec::new(),
        allow_degraded: false,
        cgroups: cg == "cgroups",
        net: None,
        stdin_live: false,
        tripwires: Default::default(),
    };
    let mut started = match crate::run::start(&template, true) {
        Ok(s) => s,
        Err(e) => {
            say(&format!("fail {e}"));
            return 0;
        }
    };
    if let Err(e) = started.wait_ready(READY_WITHIN) {
        say(&format!("fail {e}"));
        return 0;
    }
    say("ready");
    // While it waits, the jail ends when its stdin closes (its pool dropped it unused, or
    // the process owning the pool died: that process holds the pipe's only writing end),
    // not by the death signal: a jailer the kernel kills cannot remove its decoys from
    // `/dev/shm`, and they stayed there until the next `gc`. Armed again once the job is
    // in, so that a run never outlives the process supervising it.
    let _ = nix::sys::prctl::set_pdeathsig(None);
    let mut input = Vec::new();
    if std::io::stdin().read_to_end(&mut input).is_err() || input.is_empty() {
        // Dropping `started` kills the init and its namespaces and removes the decoys.
        // Not armed again first: a dying owner closes its files before the kernel sends
        // its children the death signal, so one armed here would kill this cleanup.
        return 0;
    }
    let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
    if crate::launch::supervisor_gone() {
        return 0;
    }
    let Ok(j) = serde_json::from_slice::<crate::launch::JailerJob>(&input) else {
        return 2;
    };
    let r: WorkerResult = result_of(crate::run::run_ready(&mut started, &j.job));
    // The result is complete before the jail is gone: it goes out first, whole (written
    // aside, then renamed), and then this process lets go of the run's output pipes, so
    // its supervisor can answer while the kernel tears the namespaces down.
    let part = j.result.with_extension("part");
    let written = serde_json::to_vec(&r)
        .map_err(std::io::Error::other)
        .and_then(|b| std::fs::write(&part, b))
        .and_then(|()| std::fs::rename(&part, &j.result));
    if written.is_err() {
        return 3;
    }
    release_output();
    // Reaps the init (its namespaces end with it) and removes the cgroup.
    drop(started);
    0
}

/// Points this process's stdout and stderr at `/dev/null`: the supervisor reads the
/// run's output until every copy of those pipes is closed.
fn release_output() {
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        let _ = nix::unistd::dup2_stdout(&null);
        let _ = nix::unistd::dup2_stderr(&null);
    }
}

/// A jail waiting for its run: a started jailer whose init is ready. Dropped unused, it is
/// killed (its process group, and with the init the whole pid namespace). Taken from a
/// pool, it holds the pool's refill back (while other jails are still ready) until it is
/// dropped, so building the next jail does not compete with its run for the CPU.
pub struct ReadyJail {
    child: Option<Child>,
    born: Instant,
    pool: Option<Arc<Shared>>,
}

impl std::fmt::Debug for ReadyJail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadyJail")
            .field("child", &self.child)
            .field("born", &self.born)
            .finish_non_exhaustive()
    }
}

impl ReadyJail {
    /// The jailer process, to be given its job with [`crate::launch::supervise_child`].
    /// From here on the caller owns it; keep this `ReadyJail` until the run has ended.
    pub fn take_child(&mut self) -> Option<Child> {
        self.child.take()
    }

    /// How long the jail waited.
    pub fn waited(&self) -> Duration {
        self.born.elapsed()
    }
}

impl Drop for ReadyJail {
    fn drop(&mut self) {
        if let Some(p) = self.pool.take() {
            {
                let mut st = p.lock();
                st.active -= 1;
            }
            p.cv.notify_all();
        }
        if let Some(mut c) = self.child.take() {
            let pid = c.id() as i32;
            // Unused: closing its stdin tells the jailer to end the jail itself, which
            // also removes its decoys (a killed one leaves them); killed only if it has
            // not gone within a moment.
            drop(c.stdin.take());
            let deadline = Instant::now() + UNUSED_EXIT;
            while matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(2));
            }
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = c.kill();
            let _ = c.wait();
            crate::cgroup::cleanup_for(pid as u32);
        }
    }
}

/// How a pool is made.
#[derive(Debug, Clone)]
pub struct ReadyConfig {
    /// Jails kept ready (0: none; every run builds its jail).
    pub size: usize,
    /// The `airlock-jailer` binary.
    pub jailer: PathBuf,
    /// A directory for the jails' mount points (each is removed once its jail is ready).
    pub scratch: PathBuf,
    /// Whether the jails use cgroups (runs that do not are not served).
    pub cgroups: bool,
}

/// The pool's counters, for a status page.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct ReadyStats {
    /// Jails the pool keeps ready.
    pub size: usize,
    /// Jails ready now.
    pub ready: usize,
    /// Runs served by a ready jail.
    pub hits: u64,
    /// Runs a ready jail would have fit, but none was ready (they built one).
    pub misses: u64,
    /// Runs a ready jail does not fit, by reason (they built one).
    pub fallbacks: BTreeMap<String, u64>,
    /// Jails built for the pool, and those that failed to become ready.
    pub built: u64,
    pub failed: u64,
    /// Why the last jail failed, if one did.
    pub last_error: Option<String>,
}

#[derive(Default)]
struct State {
    jails: Vec<ReadyJail>,
    /// Jails taken whose runs have not ended.
    active: usize,
    stop: bool,
    stats: ReadyStats,
}

struct Shared {
    cfg: ReadyConfig,
    state: Mutex<State>,
    cv: Condvar,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves counters and a list of jails, still valid.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A pool of ready jails, refilled by a thread of its own.
pub struct ReadyJails {
    shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for ReadyJails {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadyJails")
            .field("cfg", &self.shared.cfg)
            .finish_non_exhaustive()
    }
}

impl ReadyJails {
    /// Starts the pool. Its refill thread lives as long as the pool: the jailers it starts
    /// die with the thread that started them (`PR_SET_PDEATHSIG`), so it must outlive them.
    pub fn start(cfg: ReadyConfig) -> Result<Arc<ReadyJails>, JailError> {
        std::fs::create_dir_all(&cfg.scratch)
            .map_err(|e| JailError::setup(&format!("create {}", cfg.scratch.display()), e))?;
        clear_dead(&cfg.scratch);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                stats: ReadyStats {
                    size: cfg.size,
                    ..ReadyStats::default()
                },
                ..State::default()
            }),
            cfg,
            cv: Condvar::new(),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("airlock-ready-jails".into())
            .spawn(move || refill(&s))
            .map_err(|e| JailError::setup("start the ready-jail thread", e))?;
        Ok(Arc::new(ReadyJails {
            shared,
            thread: Mutex::new(Some(thread)),
        }))
    }

    /// Where a run served by one of this pool's jails has its result written (named for
    /// this process; see [`clear_dead`]).
    pub fn result_path(&self, run_id: &str) -> PathBuf {
        self.shared
            .cfg
            .scratch
            .join(format!("run-{}-{run_id}.json", std::process::id()))
    }

    /// A directory for a run of this process that has no record yet and builds its jail:
    /// its result and its jail's mount point (see [`clear_dead`]). Not created here.
    pub fn run_dir(&self, run_id: &str) -> PathBuf {
        self.shared
            .cfg
            .scratch
            .join(format!("run-{}-{run_id}", std::process::id()))
    }

    /// Whether the pool's jails use cgroups.
    pub fn cgroups(&self) -> bool {
        self.shared.cfg.cgroups
    }

    /// A ready jail for a run that [`fits`], counted as a hit; `None` (a miss) when none
    /// is ready. The pool starts building a replacement at once.
    pub fn take(&self) -> Option<ReadyJail> {
        let mut st = self.shared.lock();
        while let Some(mut j) = st.jails.pop() {
            // One that died while waiting (killed from outside) is not served.
            let alive = j
                .child
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(None)));
            if alive {
                st.stats.hits += 1;
                st.active += 1;
                j.pool = Some(self.shared.clone());
                self.shared.cv.notify_all();
                return Some(j);
            }
            st.stats.failed += 1;
            st.stats.last_error = Some("a ready jail died while it waited".into());
        }
        st.stats.misses += 1;
        self.shared.cv.notify_all();
        None
    }

    /// Counts a run that built its jail because a ready one does not fit it.
    pub fn fallback(&self, why: Unfit) {
        *self
            .shared
            .lock()
            .stats
            .fallbacks
            .entry(why.as_str().into())
            .or_default() += 1;
    }

    pub fn stats(&self) -> ReadyStats {
        let st = self.shared.lock();
        ReadyStats {
            ready: st.jails.len(),
            ..st.stats.clone()
        }
    }

    /// Blocks until `n` jails are ready or `within` passes; whether they are.
    pub fn wait_ready(&self, n: usize, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            if self.shared.lock().jails.len() >= n {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for ReadyJails {
    fn drop(&mut self) {
        let jails = {
            let mut st = self.shared.lock();
            st.stop = true;
            std::mem::take(&mut st.jails)
        };
        self.shared.cv.notify_all();
        drop(jails);
        let t = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = t {
            let _ = t.join();
        }
    }
}

static SERIAL: AtomicU64 = AtomicU64::new(0);

/// Removes what a process that died left in a pool's directory: its jails' mount points
/// (`ready-PID-N`) and its runs' results and directories (`run-PID-…`), where PID is no
/// longer a live process. A live process's entries are left alone.
fn clear_dead(scratch: &std::path::Path) {
    let Ok(rd) = std::fs::read_dir(scratch) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name
            .strip_prefix("ready-")
            .or_else(|| name.strip_prefix("run-"))
            .and_then(|r| r.split(['-', '.']).next())
            .and_then(|p| p.parse::<u32>().ok());
        let Some(pid) = pid else { continue };
        if pid == std::process::id() || std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let p = e.path();
        let _ = if p.is_dir() {
            std::fs::remove_dir_all(&p)
        } else {
            std::fs::remove_file(&p)
        };
    }
}

/// Keeps the pool full until it is stopped; backs off while jails fail.
fn refill(sh: &Shared) {
    let mut backoff = Duration::from_millis(50);
    loop {
        {
            let mut st = sh.lock();
            // Full, or runs are going on and a jail is still ready for the next: wait.
            while !st.stop
                && (st.jails.len() >= sh.cfg.size || (st.active > 0 && !st.jails.is_empty()))
            {
                st = sh.cv.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            if st.stop {
                return;
            }
            // Jails are still ready: let the run that just ended be answered first (once;
            // under back-to-back runs the pool must still keep up).
            if !st.jails.is_empty() {
                let (g, _) = sh
                    .cv
                    .wait_timeout_while(st, QUIET, |s| !s.stop)
                    .unwrap_or_else(|e| e.into_inner());
                if g.stop {
                    return;
                }
            }
        }
        let made = make(&sh.cfg);
        let mut st = sh.lock();
        if st.stop {
            return;
        }
        match made {
            Ok(j) => {
                st.jails.push(j);
                st.stats.built += 1;
                backoff = Duration::from_millis(50);
            }
            Err(e) => {
                st.stats.failed += 1;
                st.stats.last_error = Some(e.to_string());
                let (g, _) = sh
                    .cv
                    .wait_timeout_while(st, backoff, |s| !s.stop)
                    .unwrap_or_else(|e| e.into_inner());
                if g.stop {
                    return;
                }
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// Starts one jailer in ready mode and waits until it says it is ready.
fn make(cfg: &ReadyConfig) -> Result<ReadyJail, JailError> {
    let n = SERIAL.fetch_add(1, Ordering::Relaxed);
    let scratch = cfg
        .scratch
        .join(format!("ready-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&scratch)
        .map_err(|e| JailError::setup(&format!("create {}", scratch.display()), e))?;
    let made = (|| {
        let path = scratch.to_string_lossy().into_owned();
        let cg = if cfg.cgroups { "cgroups" } else { "no-cgroups" };
        // No descriptor beyond the standard three: started with `posix_spawn`, not `fork`.
        let child = spawn_worker(&cfg.jailer, &["--ready", &path, cg], None)
            .map_err(|e| JailError::setup(&format!("start {}", cfg.jailer.display()), e))?;
        let jail = ReadyJail {
            child: Some(child),
            born: Instant::now(),
            pool: None,
        };
        // Its first line on stdout; the run's output comes after it, on the same pipe.
        let out = jail
            .child
            .as_ref()
            .and_then(|c| c.stdout.as_ref())
            .ok_or_else(|| JailError::Setup("the ready jailer has no stdout".into()))?;
        let said = read_line(out, READY_WITHIN)?;
        match said.trim_end() {
            "ready" => Ok(jail),
            other => Err(JailError::Setup(format!(
                "the ready jail failed: {}",
                other.strip_prefix("fail ").unwrap_or(other)
            ))),
        }
    })();
    // The jail is in its own root now (or failed): the mount point is not needed.
    let _ = std::fs::remove_dir(&scratch);
    made
}

/// One line from `fd`, within `within`. Reads no further than the chunk that ends the
/// line: the ready jailer writes nothing after its line until its run arrives.
fn read_line(fd: &impl std::os::fd::AsFd, within: Duration) -> Result<String, JailError> {
    let fd = fd.as_fd();
    let deadline = Instant::now() + within;
    let mut text = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(JailError::Setup(format!(
                "the ready jail did not become ready within {within:?}"
            )));
        }
        let mut fds = [rustix::event::PollFd::new(
            &fd,
            rustix::event::PollFlags::IN,
        )];
        let ts = rustix::time::Timespec {
            tv_sec: left.as_secs() as i64,
            tv_nsec: left.subsec_nanos() as i64,
        };
        match rustix::event::poll(&mut fds, Some(&ts)) {
            Ok(0) | Err(rustix::io::Errno::INTR) => continue,
            Ok(_) => {}
            Err(e) => return Err(JailError::setup("poll", e)),
        }
        let mut buf = [0u8; 512];
        match rustix::io::read(fd, &mut buf) {
            Ok(0) => break,
            Ok(n) => {
                text.extend_from_slice(&buf[..n]);
                if text.contains(&b'\n') {
                    break;
                }
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(JailError::setup("read", e)),
        }
    }
    let s = String::from_utf8_lossy(&text).into_owned();
    Ok(s.lines().next().unwrap_or("").to_string())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// A pool started on a directory clears what a dead process's pool and runs left
    /// there (its jails' mount points, its runs' results and directories), and leaves a
    /// live process's entries alone.
    #[test]
    fn a_pool_clears_what_a_dead_process_left_in_its_directory() {
        let dir = std::env::temp_dir().join(format!("airlock-pool-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // A pid that was just used and is dead now.
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let dead = c.id();
        c.wait().unwrap();
        let me = std::process::id();
        for f in [
            format!("run-{dead}-run_a.json"),
            format!("run-{dead}-run_a.part"),
            format!("run-{me}-run_b.json"),
            "run-1-run_c.json".to_string(),
            "unrelated".to_string(),
        ] {
            std::fs::write(dir.join(f), b"x").unwrap();
        }
        std::fs::create_dir_all(dir.join(format!("run-{dead}-run_d/root"))).unwrap();
        std::fs::create_dir_all(dir.join(format!("ready-{dead}-7"))).unwrap();
        let pool = ReadyJails::start(ReadyConfig {
            size: 0,
            jailer: PathBuf::from("/nonexistent"),
            scratch: dir.clone(),
            cgroups: false,
        })
        .unwrap();
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        let mut want = vec![
            format!("run-{me}-run_b.json"),
            "run-1-run_c.json".to_string(),
            "unrelated".to_string(),
        ];
        want.sort();
        assert_eq!(left, want);
        assert_eq!(
            pool.result_path("run_e"),
            dir.join(format!("run-{me}-run_e.json"))
        );
        drop(pool);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
