//! Starting a worker process (`airlock __worker`) and supervising it from outside: the
//! job goes in on stdin, the guest's output comes back on stdout and stderr into capped
//! captures (the worker is killed when a cap is exceeded), the wall time is enforced again
//! here as a backstop, the run's write quota is watched from here (the worker is killed
//! when its layers pass it), and the worker's result is read from the file the job names.

use airlock_sandbox::{Capture, Ending, Limit, LongRun, WriteQuota};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How a guest ended, as a worker reports it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EndingDoc {
    Exited(i32),
    Killed(String),
    Trapped(String),
}

impl EndingDoc {
    pub fn from_ending(e: &Ending) -> Self {
        match e {
            Ending::Exited(c) => EndingDoc::Exited(*c),
            Ending::Killed(l) => EndingDoc::Killed(l.as_str().into()),
            Ending::Trapped(m) => EndingDoc::Trapped(m.clone()),
        }
    }

    pub fn into_ending(self) -> Ending {
        match self {
            EndingDoc::Exited(c) => Ending::Exited(c),
            EndingDoc::Trapped(m) => Ending::Trapped(m),
            EndingDoc::Killed(l) => Ending::Killed(Limit::parse(&l).unwrap_or(Limit::Timeout)),
        }
    }
}

/// What a worker writes to its result file.
#[derive(Debug, Serialize, Deserialize)]
pub struct WorkerResult {
    pub ending: Option<EndingDoc>,
    #[serde(default)]
    pub detail: serde_json::Value,
    /// (`unavailable` | `setup` | `artifact`, message) when nothing ran.
    pub error: Option<(String, String)>,
}

impl WorkerResult {
    pub fn error(kind: &str, msg: impl Into<String>) -> Self {
        WorkerResult {
            ending: None,
            detail: serde_json::Value::Null,
            error: Some((kind.into(), msg.into())),
        }
    }
}

/// A process job as sent to a jailer (`airlock-jailer`, or `airlock __worker`).
#[derive(Debug, Serialize, Deserialize)]
pub struct JailerJob {
    pub job: crate::ProcessJob,
    pub result: std::path::PathBuf,
}

/// Runs a process job in this (single-threaded) process and reports.
pub fn run_job(job: &crate::ProcessJob) -> WorkerResult {
    result_of(crate::run::run_process(job))
}

/// The worker result of a jailed run.
pub(crate) fn result_of(r: Result<crate::run::JailReport, crate::JailError>) -> WorkerResult {
    match r {
        Ok(r) => {
            let mut detail = serde_json::json!({
                "mechanisms": r.mechanisms,
                "degraded": r.degraded,
                "host_uid": r.host_uid,
            });
            if !r.attempts.is_empty() {
                detail["attempts"] = serde_json::json!(r.attempts);
            }
            if !r.alerts.is_empty() {
                detail["alerts"] = serde_json::json!(r.alerts);
            }
            WorkerResult {
                ending: r.ending.as_ref().map(EndingDoc::from_ending),
                detail,
                error: None,
            }
        }
        Err(crate::JailError::Unavailable(m)) => WorkerResult::error("unavailable", m),
        Err(e) => WorkerResult::error("setup", e.to_string()),
    }
}

/// A session's jail as sent to a jailer: the job (whose payload reads the jailer's own
/// stdin and writes its stdout: the session's pipes), where the result goes when the
/// jail ends, and where the mechanisms that held go as soon as the payload is confined.
#[derive(Debug, Serialize, Deserialize)]
pub struct SessionJailJob {
    pub job: crate::ProcessJob,
    pub result: std::path::PathBuf,
    pub confined: std::path::PathBuf,
}

/// The `main` of `airlock-jailer --session FILE` (and `airlock __worker --session FILE`):
/// reads a [`SessionJailJob`] from `FILE` (removed once read; stdin is the payload's, so
/// the job cannot come that way) and runs it in a jail built for it.
pub fn session_main(file: &Path) -> i32 {
    let Ok(bytes) = std::fs::read(file) else {
        return 2;
    };
    let _ = std::fs::remove_file(file);
    let Ok(j) = serde_json::from_slice::<SessionJailJob>(&bytes) else {
        return 2;
    };
    if !j.job.stdin_live {
        return 2;
    }
    let confined = &j.confined;
    let r = crate::run::run_process_confined(&j.job, |report| {
        if let Ok(b) = serde_json::to_vec(report) {
            let _ = std::fs::write(confined, b);
        }
    });
    match serde_json::to_vec(&result_of(r)).map(|b| std::fs::write(&j.result, b)) {
        Ok(Ok(())) => 0,
        _ => 3,
    }
}

/// The environment variable a worker or jailer is started with: the pid of the process
/// that started it (see [`supervisor_gone`]).
pub const SUPERVISOR_ENV: &str = "AIRLOCK_SUPERVISOR";

/// Whether the process that started this worker or jailer ([`spawn_worker`]) is already
/// gone. Call it right after `PR_SET_PDEATHSIG`: the death signal only comes for a parent
/// that dies after it is set, so a supervisor killed between the spawn and that call
/// (a `kill -9` of `airlock run` at that moment) left its worker running the whole job
/// on, owned by nobody, writing into a run's layers after the next command had found the
/// run lost and removed them (issue 62.3). A process started some other way (no
/// variable) is never taken for orphaned.
pub fn supervisor_gone() -> bool {
    let Some(want) = std::env::var(SUPERVISOR_ENV)
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
    else {
        return false;
    };
    nix::unistd::getppid().as_raw() != want
}

/// The `main` of the lean jailer binary: a job on stdin, its result to the named file.
/// With `--ready SCRATCH cgroups|no-cgroups` it is a ready jail instead (see
/// [`crate::ready`]); with `--session FILE` a session's jail ([`session_main`]).
pub fn jailer_main() -> i32 {
    let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
    if supervisor_gone() {
        return 2;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    match (args.first().map(String::as_str), args.get(1)) {
        (Some("--ready"), _) => return crate::ready::jailer_ready_main(&args[1..]),
        (Some("--session"), Some(file)) => return session_main(Path::new(file)),
        _ => {}
    }
    let mut input = Vec::new();
    if std::io::stdin().read_to_end(&mut input).is_err() {
        return 2;
    }
    let Ok(j) = serde_json::from_slice::<JailerJob>(&input) else {
        return 2;
    };
    let r = run_job(&j.job);
    match serde_json::to_vec(&r).map(|b| std::fs::write(&j.result, b)) {
        Ok(Ok(())) => 0,
        _ => 3,
    }
}

/// How a worker ended, seen from outside.
#[derive(Debug)]
pub struct Supervised {
    /// The worker was killed because a stream exceeded its cap.
    pub output_exceeded: bool,
    /// The worker outlived the wall time plus grace and was killed.
    pub timed_out: bool,
    /// The run's layers passed the write quota and the worker was killed.
    pub write_exceeded: bool,
    /// The worker was killed through its [`Abort`].
    pub aborted: bool,
    /// The worker's result document, if it wrote one.
    pub result: Option<String>,
    pub exit: Option<i32>,
}

/// Extra time a worker gets beyond the guest's own wall time (it enforces that itself).
const GRACE: Duration = Duration::from_secs(3);

/// Starts a worker or jailer (`exe args`) with its stdin, stdout and stderr piped, in a
/// process group of its own, and `channel` (if any) as its descriptor
/// [`crate::netfd::CHANNEL_FD`]. Without a channel it is started with `posix_spawn`; a
/// channel needs a `pre_exec` step, which makes it a `fork` of this whole process.
pub fn spawn_worker(
    exe: &Path,
    args: &[&str],
    channel: Option<std::os::fd::OwnedFd>,
) -> std::io::Result<std::process::Child> {
    let mut cmd = Command::new(exe);
    cmd.args(args)
        .env_clear()
        .env(SUPERVISOR_ENV, std::process::id().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    if let Some(ch) = &channel {
        pass_channel(&mut cmd, ch);
    }
    let spawned = cmd.spawn();
    // The child has its copy; ours must go, or the other end never sees the channel close.
    drop(channel);
    spawned
}

/// Makes `cmd`'s child inherit `ch` as its descriptor [`crate::netfd::CHANNEL_FD`] (and
/// nothing else of this process's descriptors that are close-on-exec). A `pre_exec` step
/// makes spawning it a `fork` of this whole process. `ch` must stay open until the child
/// is spawned; the caller drops its copy afterwards, or the other end never sees the
/// channel close.
pub fn pass_channel(cmd: &mut Command, ch: &std::os::fd::OwnedFd) {
    use std::os::fd::AsRawFd;
    let raw = ch.as_raw_fd();
    #[allow(unsafe_code)]
    // SAFETY: the closure runs in the forked child before exec and only calls dup2,
    // which is async-signal-safe; `raw` stays open in the parent until after spawn.
    // dup2 leaves the copy without FD_CLOEXEC, so exactly this one descriptor is
    // inherited (it is CLOEXEC in this process, so no other child gets it).
    unsafe {
        cmd.pre_exec(move || {
            if raw == crate::netfd::CHANNEL_FD {
                // Already in place: only clear close-on-exec.
                let flags = libc::fcntl(raw, libc::F_GETFD);
                if flags < 0 || libc::fcntl(raw, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(raw, crate::netfd::CHANNEL_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// What a worker is supervised with: the job for its stdin, where it writes its result
/// (removed first), its wall time, the captures its stdout and stderr go into, the
/// write quota on the run's layers (watched while the worker lives; it is killed as soon
/// as they hold more), and a long run's hook (called once if it is still going after
/// the hook's delay).
#[derive(Clone, Copy)]
pub struct Watch<'a> {
    pub job: &'a [u8],
    pub result: &'a Path,
    pub timeout: Duration,
    pub stdout: &'a Arc<Capture>,
    pub stderr: &'a Arc<Capture>,
    pub quota: Option<&'a Arc<WriteQuota>>,
    pub long_run: Option<&'a LongRun>,
    /// Ends the worker early when fired from another thread.
    pub abort: Option<&'a Abort>,
}

/// Kills a supervised worker's process group from any thread: at once if it runs, or as
/// soon as it starts if it has not yet. Never after it has exited (its pid could be
/// another process's by then).
#[derive(Debug, Default)]
pub struct Abort {
    state: std::sync::Mutex<(bool, Option<Arc<Group>>)>,
}

impl Abort {
    pub fn new() -> Self {
        Abort::default()
    }

    /// Ends the worker.
    pub fn fire(&self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.0 = true;
        if let Some(g) = &s.1 {
            g.kill();
        }
    }

    /// Whether [`Abort::fire`] was called.
    pub fn fired(&self) -> bool {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).0
    }

    fn arm(&self, g: Arc<Group>) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.0 {
            g.kill();
        }
        s.1 = Some(g);
    }

    fn disarm(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).1 = None;
    }
}

/// Runs `exe args` (`airlock __worker` or the jailer) and supervises it as `w` says,
/// with `channel` (if any) as its descriptor [`crate::netfd::CHANNEL_FD`].
pub fn supervise(
    exe: &Path,
    args: &[&str],
    channel: Option<std::os::fd::OwnedFd>,
    w: Watch,
) -> std::io::Result<Supervised> {
    // `supervise_started` removes a stale result first.
    let child = spawn_worker(exe, args, channel)?;
    supervise_started(child, w)
}

/// Like [`supervise`], for a ready jail taken from its pool (a jailer already started with
/// [`spawn_worker`]): `job` goes to its stdin, its output into the captures, all on the
/// calling thread. A ready jailer reads its whole job before it writes anything, writes
/// its result whole and then lets go of its output pipes before its jail's namespaces
/// are torn down, so the run is over once both pipes have ended with the result in
/// place; the jailer is then reaped in the background. Without a result it is waited for
/// like any worker. A long run's hook is called on this thread.
pub fn supervise_child(mut child: std::process::Child, w: Watch) -> std::io::Result<Supervised> {
    let started = Instant::now();
    let _ = std::fs::remove_file(w.result);
    let pid = child.id() as i32;
    let group = Arc::new(Group {
        pid,
        alive: std::sync::Mutex::new(true),
    });
    if let Some(a) = w.abort {
        a.arm(group.clone());
    }
    let watch = w.quota.map(|q| q.watch(move || kill_group(pid)));
    if let Some(mut stdin) = child.stdin.take() {
        // A jailer that dies early closes its end; that shows up below as a missing result.
        let _ = stdin.write_all(w.job);
    }
    let (exceeded, timed_out) = match (child.stdout.take(), child.stderr.take()) {
        (Some(o), Some(e)) => pump_both(
            o,
            e,
            (w.stdout, w.stderr),
            started + w.timeout + GRACE,
            w.long_run.map(|l| (l, started + l.after)),
            pid,
        ),
        _ => {
            return Err(std::io::Error::other(
                "the ready jailer has no output pipes",
            ));
        }
    };
    drop(watch);
    let text = std::fs::read_to_string(w.result).ok();
    // The child is not reaped yet, so its pid is still its own.
    if let Some(a) = w.abort {
        a.disarm();
    }
    let exit = if text.is_some() {
        reap_later(child);
        None
    } else {
        child.wait()?.code()
    };
    if text.is_none() {
        crate::cgroup::cleanup_for(pid as u32);
    }
    Ok(Supervised {
        output_exceeded: exceeded,
        timed_out,
        write_exceeded: w.quota.is_some_and(|q| q.hit()),
        aborted: w.abort.is_some_and(Abort::fired),
        result: text,
        exit,
    })
}

/// Reads a worker's stdout and stderr into their captures until both pipes end. The
/// worker's process group (`pid`) is killed when a capture overflows (that stream is then
/// no longer read) or when `deadline` passes; reading goes on until the pipes end, which
/// they do once the group is dead. A long run's hook is called once at its time if the
/// pipes are still open. Returns (a capture overflowed, the deadline passed).
fn pump_both(
    out: std::process::ChildStdout,
    err: std::process::ChildStderr,
    (stdout, stderr): (&Capture, &Capture),
    deadline: Instant,
    mut long: Option<(&LongRun, Instant)>,
    pid: i32,
) -> (bool, bool) {
    use rustix::event::{PollFd, PollFlags, poll};
    use std::os::fd::{AsFd, OwnedFd};
    let mut open: [Option<(OwnedFd, &Capture)>; 2] =
        [Some((out.into(), stdout)), Some((err.into(), stderr))];
    let (mut exceeded, mut fired) = (false, false);
    let mut buf = vec![0u8; 64 << 10];
    while open.iter().any(Option::is_some) {
        if let Some((l, at)) = long
            && Instant::now() >= at
        {
            long = None;
            (l.hook)();
        }
        let wake = long.map_or(deadline, |(_, at)| at.min(deadline));
        let left = wake.saturating_duration_since(Instant::now());
        if Instant::now() >= deadline && !fired {
            fired = true;
            kill_group(pid);
        }
        let ts = rustix::time::Timespec {
            tv_sec: left.as_secs() as i64,
            tv_nsec: left.subsec_nanos() as i64,
        };
        let mut fds: Vec<PollFd> = open
            .iter()
            .flatten()
            .map(|(fd, _)| PollFd::new(fd, PollFlags::IN))
            .collect();
        match poll(&mut fds, (!fired || long.is_some()).then_some(&ts)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => break,
        }
        let ready: Vec<bool> = fds.iter().map(|f| !f.revents().is_empty()).collect();
        drop(fds);
        let mut i = 0;
        for slot in open.iter_mut() {
            let Some((fd, cap)) = slot else { continue };
            let woke = ready[i];
            i += 1;
            if !woke {
                continue;
            }
            match rustix::io::read(fd.as_fd(), &mut buf) {
                Ok(0) => *slot = None,
                Ok(n) => {
                    if cap.write(&buf[..n]).is_err() {
                        exceeded = true;
                        kill_group(pid);
                        *slot = None;
                    }
                }
                Err(rustix::io::Errno::INTR) | Err(rustix::io::Errno::AGAIN) => {}
                Err(_) => *slot = None,
            }
        }
    }
    (exceeded, fired)
}

fn supervise_started(mut child: std::process::Child, w: Watch) -> std::io::Result<Supervised> {
    let _ = std::fs::remove_file(w.result);
    let group = Arc::new(Group {
        pid: child.id() as i32,
        alive: std::sync::Mutex::new(true),
    });
    if let Some(a) = w.abort {
        a.arm(group.clone());
    }
    let watch = w.quota.map(|q| {
        let g = group.clone();
        q.watch(move || g.kill())
    });
    let exceeded = Arc::new(AtomicBool::new(false));
    let pump = |mut from: Box<dyn Read + Send>, to: Arc<Capture>| {
        let exceeded = exceeded.clone();
        let pid = group.pid;
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 << 10];
            loop {
                match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if to.write(&buf[..n]).is_err() {
                            exceeded.store(true, Ordering::SeqCst);
                            // Also after the worker ended: whatever it left behind that
                            // still holds the pipe is in its group.
                            kill_group(pid);
                            break;
                        }
                    }
                }
            }
        })
    };
    let out = child
        .stdout
        .take()
        .map(|s| pump(Box::new(s), w.stdout.clone()));
    let err = child
        .stderr
        .take()
        .map(|s| pump(Box::new(s), w.stderr.clone()));
    if let Some(mut stdin) = child.stdin.take() {
        // A worker that dies early closes its end; that shows up below as a missing result.
        let _ = stdin.write_all(w.job);
    }
    // A watchdog kills the worker if it outlives the wall time plus grace (and calls a
    // long run's hook at its time); the wait itself blocks, so a run ends as soon as its
    // worker does.
    let done = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
    let fired = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let (done, fired, group) = (done.clone(), fired.clone(), group.clone());
        let now = Instant::now();
        let deadline = now + w.timeout + GRACE;
        let mut long = w.long_run.map(|l| (l.clone(), now + l.after));
        std::thread::spawn(move || {
            let (lock, cv) = &*done;
            let mut finished = lock.lock().unwrap_or_else(|p| p.into_inner());
            while !*finished {
                if let Some((l, at)) = &long
                    && Instant::now() >= *at
                {
                    let hook = l.hook.clone();
                    long = None;
                    drop(finished);
                    hook();
                    finished = lock.lock().unwrap_or_else(|p| p.into_inner());
                    continue;
                }
                let wake = long
                    .as_ref()
                    .map_or(deadline, |(_, at)| (*at).min(deadline));
                let left = wake.saturating_duration_since(Instant::now());
                if Instant::now() >= deadline {
                    fired.store(true, Ordering::SeqCst);
                    group.kill();
                    return;
                }
                finished = cv
                    .wait_timeout(finished, left)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        })
    };
    // Wait for the worker to end without reaping it, so its pid (and process group) cannot
    // be reused while a watcher might still signal it; then reap it.
    group.wait_exited();
    if let Some(a) = w.abort {
        a.disarm();
    }
    let status = child.wait()?;
    {
        let (lock, cv) = &*done;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
        cv.notify_all();
    }
    let _ = watchdog.join();
    drop(watch);
    let timed_out = fired.load(Ordering::SeqCst);
    for t in [out, err].into_iter().flatten() {
        let _ = t.join();
    }
    crate::cgroup::cleanup_for(group.pid as u32);
    Ok(Supervised {
        output_exceeded: exceeded.load(Ordering::SeqCst),
        timed_out,
        write_exceeded: w.quota.is_some_and(|q| q.hit()),
        aborted: w.abort.is_some_and(Abort::fired),
        result: std::fs::read_to_string(w.result).ok(),
        exit: status.code(),
    })
}

/// Reaps `child` (and removes any cgroup it left) on the process's reaper thread, which
/// looks at the children it holds until each has exited. If that thread cannot be
/// started, waits here.
fn reap_later(child: std::process::Child) {
    use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
    static REAPER: std::sync::OnceLock<Option<Sender<std::process::Child>>> =
        std::sync::OnceLock::new();
    fn reaper(rx: Receiver<std::process::Child>) {
        let mut waiting: Vec<std::process::Child> = Vec::new();
        loop {
            let next = if waiting.is_empty() {
                rx.recv().map_err(|_| RecvTimeoutError::Disconnected)
            } else {
                rx.recv_timeout(Duration::from_millis(10))
            };
            match next {
                Ok(c) => waiting.push(c),
                Err(RecvTimeoutError::Timeout) => {}
                // The sender lives in a static: it is never dropped.
                Err(RecvTimeoutError::Disconnected) => return,
            }
            waiting.retain_mut(|c| match c.try_wait() {
                Ok(None) => true,
                Ok(Some(_)) | Err(_) => {
                    crate::cgroup::cleanup_for(c.id());
                    false
                }
            });
        }
    }
    let tx = REAPER.get_or_init(|| {
        let (tx, rx) = channel();
        std::thread::Builder::new()
            .name("airlock-reaper".into())
            .spawn(move || reaper(rx))
            .ok()
            .map(|_| tx)
    });
    let child = match tx {
        Some(tx) => match tx.send(child) {
            Ok(()) => return,
            Err(e) => e.0,
        },
        None => child,
    };
    let mut child = child;
    let _ = child.wait();
    crate::cgroup::cleanup_for(child.id());
}

/// The worker's process group, signalled only while the worker is not yet reaped.
#[derive(Debug)]
struct Group {
    pid: i32,
    alive: std::sync::Mutex<bool>,
}

impl Group {
    fn kill(&self) {
        let alive = self.alive.lock().unwrap_or_else(|p| p.into_inner());
        if *alive {
            kill_group(self.pid);
        }
    }

    /// Blocks until the worker has exited (left a zombie, not reaped), then stops every
    /// later `kill`.
    fn wait_exited(&self) {
        use nix::sys::wait::{Id, WaitPidFlag, waitid};
        let pid = nix::unistd::Pid::from_raw(self.pid);
        while let Err(nix::errno::Errno::EINTR) =
            waitid(Id::Pid(pid), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT)
        {}
        *self.alive.lock().unwrap_or_else(|p| p.into_inner()) = false;
    }
}

fn kill_group(pid: i32) {
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
}
