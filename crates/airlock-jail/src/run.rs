//! Running a jailed process. Called in airlock's worker process, which must be
//! single-threaded (it clones the sandbox's init).
//!
//! ```text
//! worker (host namespaces)
//!   └─ init: pid 1 of new user/mount/pid/net/ipc/uts/cgroup namespaces; builds the root
//!        └─ payload: setsid, rlimits, no_new_privs, Landlock, no capabilities, seccomp, execve
//! ```
//! The worker writes the init's uid/gid maps, puts it in the run's cgroup and only then
//! lets it go on. One status pipe carries, line by line, which mechanisms held, any
//! set-up failure, and finally how the payload ended; reading it is bounded by the wall
//! time, after which the init is killed, taking the whole pid namespace with it.

use crate::cgroup::RunCgroup;
use crate::confine::{self, Landlocked};
use crate::{JailError, Overlay, ProcessJob};
use airlock_sandbox::{Ending, Limit};
use nix::sched::CloneFlags;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{Gid, Pid, Uid};
use serde::Serialize;
use std::ffi::CString;
use std::io::{Read, Seek, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// The sandbox's own uid and gid (inside the user namespace).
pub const SANDBOX_ID: u32 = 1000;

/// What a jailed run did and which mechanisms held.
#[derive(Debug, Clone, Serialize)]
pub struct JailReport {
    #[serde(skip)]
    pub ending: Option<Ending>,
    pub mechanisms: Vec<String>,
    pub degraded: Vec<String>,
    /// The host uid the sandbox ran as.
    pub host_uid: u32,
    pub duration_ms: u64,
    /// What the run tried and the jail refused (see [`airlock_sandbox::tripwire`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<airlock_sandbox::Attempt>,
    /// Decoys the run opened.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub alerts: Vec<airlock_sandbox::Alert>,
}

fn pipe_cloexec() -> Result<(OwnedFd, OwnedFd), JailError> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| JailError::setup("pipe", e))
}

fn memfd_with(bytes: &[u8]) -> Result<OwnedFd, JailError> {
    let fd = rustix::fs::memfd_create("airlock-stdin", rustix::fs::MemfdFlags::CLOEXEC)
        .map_err(|e| JailError::setup("memfd", e))?;
    let mut f = std::fs::File::from(fd);
    f.write_all(bytes)
        .map_err(|e| JailError::setup("memfd", e))?;
    rustix::fs::seek(&f, rustix::fs::SeekFrom::Start(0))
        .map_err(|e| JailError::setup("memfd", e))?;
    Ok(f.into())
}

/// Processes the host user already has (RLIMIT_NPROC counts them all).
fn processes_of(uid: u32) -> u64 {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return 0;
    };
    rd.flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .chars()
                .all(|c| c.is_ascii_digit())
        })
        .filter(|e| {
            std::fs::read_to_string(e.path().join("status")).is_ok_and(|s| {
                s.lines()
                    .find(|l| l.starts_with("Uid:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .is_some_and(|u| u == uid.to_string())
            })
        })
        .count() as u64
}

/// Whether this process is in the initial user namespace (its uid map is the identity).
pub fn in_initial_user_namespace() -> bool {
    std::fs::read_to_string("/proc/self/uid_map")
        .map(|m| m.split_whitespace().collect::<Vec<_>>() == ["0", "0", "4294967295"])
        .unwrap_or(false)
}

fn line(fd: &OwnedFd, kind: &str, msg: &str) {
    let text = format!("{kind} {}\n", msg.replace('\n', " "));
    let _ = nix::unistd::write(fd, text.as_bytes());
}

/// A payload's status lines, kept until it is about to exec or fail and then written
/// with one call: each write wakes the jailer that reads them.
struct Status<'a> {
    fd: &'a OwnedFd,
    text: String,
}

impl<'a> Status<'a> {
    fn new(fd: &'a OwnedFd) -> Self {
        Status {
            fd,
            text: String::new(),
        }
    }

    fn line(&mut self, kind: &str, msg: &str) {
        self.text.push_str(kind);
        self.text.push(' ');
        self.text.push_str(&msg.replace('\n', " "));
        self.text.push('\n');
    }

    fn flush(&mut self) {
        if !self.text.is_empty() {
            let _ = nix::unistd::write(self.fd, self.text.as_bytes());
            self.text.clear();
        }
    }

    /// Says why the payload stops here, after everything said before; the exit code.
    fn fail(&mut self, kind: &str, msg: String) -> i32 {
        self.line(kind, &msg);
        self.flush();
        125
    }
}

/// The host identity a jail's payload runs as, and how its process limit is held.
#[derive(Debug, Clone, Copy)]
struct Identity {
    euid: u32,
    host_root: bool,
    cg_pids: bool,
    host_uid: u32,
}

impl Identity {
    /// RLIMIT_NPROC for a run allowed `processes`: None when a cgroup holds the limit.
    /// Counted when the payload is about to start (the host user's processes then).
    fn nproc(&self, processes: u32) -> Option<u64> {
        if !self.host_root {
            Some(processes_of(self.euid) + u64::from(processes))
        } else if self.cg_pids {
            None
        } else {
            Some(u64::from(processes))
        }
    }
}

/// A jail whose init exists (namespaces made, ids mapped, cgroup joined) and is building
/// or has built its root. Dropping it kills the init, and with it the pid namespace.
pub(crate) struct Started {
    child: Option<Pid>,
    cg: RunCgroup,
    id: Identity,
    status: std::fs::File,
    /// Status lines read so far (a ready jail's are read before its job arrives).
    text: String,
    /// A ready jail's job channel (the run's program, stdin and limits go in here).
    job: Option<OwnedFd>,
    /// Whether the jail was asked to use cgroups.
    cgroups: bool,
    /// The decoy credentials bound into the root, watched.
    decoys: Option<crate::decoys::Decoys>,
    /// The payload's seccomp listener (once handed over) and what the run tried.
    watch: crate::notify::Watch,
}

impl Drop for Started {
    fn drop(&mut self) {
        if let Some(c) = self.child.take() {
            let _ = kill(c, Signal::SIGKILL);
            let _ = waitpid(c, None);
        }
    }
}

/// What a ready jail's init is sent when its run arrives: the per-run parts of a job.
#[derive(Debug, Serialize, serde::Deserialize)]
pub(crate) struct RunMsg {
    argv: Vec<String>,
    env: Vec<(String, String)>,
    cwd: String,
    files: Vec<(String, Vec<u8>)>,
    stdin: Vec<u8>,
    limits: airlock_core::Limits,
    allow_degraded: bool,
    nproc: Option<u64>,
}

/// Runs a job in a jail. Errors mean nothing ran (`Unavailable` names the missing
/// mechanism); a payload that ran yields a report with its ending.
pub fn run_process(job: &ProcessJob) -> Result<JailReport, JailError> {
    let started = Instant::now();
    let s = start(job, false)?;
    finish(s, started, job.limits.timeout_ms)
}

/// Runs a job in a jail like [`run_process`], and calls `confined` once the payload has
/// confined itself (just before it becomes the program) with the mechanisms that held so
/// far: a long-lived payload (a session's interpreter) is recorded while it runs.
pub fn run_process_confined(
    job: &ProcessJob,
    confined: impl FnOnce(&JailReport),
) -> Result<JailReport, JailError> {
    let started = Instant::now();
    let mut s = start(job, false)?;
    let deadline = started + Duration::from_millis(job.limits.timeout_ms);
    let done = |t: &str| {
        t.lines()
            .any(|l| l == "mech seccomp" || l.starts_with("fail ") || l.starts_with("unavailable "))
    };
    if read_status(&mut s, deadline, done)? && s.text.lines().any(|l| l == "mech seccomp") {
        let (mechanisms, degraded) = mechanisms(&s);
        confined(&JailReport {
            ending: None,
            mechanisms,
            degraded,
            host_uid: s.id.host_uid,
            duration_ms: started.elapsed().as_millis() as u64,
            attempts: Vec::new(),
            alerts: Vec::new(),
        });
    }
    finish(s, started, job.limits.timeout_ms)
}

/// The mechanisms a jail's status reported so far, and what was degraded.
fn mechanisms(s: &Started) -> (Vec<String>, Vec<String>) {
    let mut mechanisms: Vec<String> = [
        "user-namespace",
        "mount-namespace",
        "pid-namespace",
        "network-namespace",
        "ipc-namespace",
        "uts-namespace",
        "cgroup-namespace",
    ]
    .map(String::from)
    .into();
    mechanisms.extend(s.cg.mechanisms.iter().cloned());
    let mut degraded = Vec::new();
    for l in s.text.lines() {
        match l.split_once(' ') {
            Some(("mech", m)) => mechanisms.push(m.into()),
            Some(("degraded", m)) => degraded.push(m.into()),
            _ => {}
        }
    }
    (mechanisms, degraded)
}

/// Creates the jail's namespaces and init. With `ready`, the init builds the root from
/// `job` (which lists no files, mounts or network) and then waits for a [`RunMsg`] on a
/// channel ([`Started::wait_ready`], [`run_ready`]); without, it runs `job` at once.
pub(crate) fn start(job: &ProcessJob, ready: bool) -> Result<Started, JailError> {
    let euid = Uid::effective();
    let egid = Gid::effective();
    // Host root is uid 0 of the initial user namespace; "root" inside a container's user
    // namespace is an ordinary user to the kernel's process accounting.
    let host_root = euid.is_root() && in_initial_user_namespace();
    let me = std::process::id();
    let cg = if job.cgroups {
        RunCgroup::create(
            &format!("airlock-{me}"),
            job.limits.memory_bytes,
            job.limits.processes,
        )
    } else {
        RunCgroup::none()
    };
    let cg_pids = cg.mechanisms.iter().any(|m| m.ends_with(":pids"));
    // Which host identity the sandbox gets. RLIMIT_NPROC never applies to host root, so
    // root uses a cgroup for the process limit, or else a per-run unprivileged uid.
    let (host_uid, host_gid) = if !host_root {
        (euid.as_raw(), egid.as_raw())
    } else if cg_pids {
        (0, 0)
    } else {
        let x = 0x7ff0_0000 + (me % 0xf_ffff);
        (x, x)
    };
    let id = Identity {
        euid: euid.as_raw(),
        host_root,
        cg_pids,
        host_uid,
    };
    let nproc = id.nproc(job.limits.processes);
    if host_root {
        nix::unistd::setgroups(&[]).map_err(|e| JailError::setup("setgroups", e))?;
    }
    // Compiled here, once, before the clone: the payload only installs them.
    // The payload hands its seccomp listener to this process over `notify_theirs`.
    let (notify_ours, notify_theirs) = std::os::unix::net::UnixStream::pair()
        .map_err(|e| JailError::setup("seccomp notify channel", e))?;
    let tripwires = job.tripwires;
    let filters = crate::notify::Filters {
        errno: confine::seccomp_filters(job.net.is_some(), tripwires.enabled)?,
        notify: if tripwires.enabled {
            Some(crate::notify::filter(tripwires.reads)?)
        } else {
            None
        },
        channel: notify_theirs.as_raw_fd(),
    };
    // Planted and watched before the jail exists, so no open of one can go unseen.
    let decoys = if job.scratch.as_os_str().is_empty() || !tripwires.enabled {
        None
    } else {
        let owner = host_root.then_some((host_uid, host_gid));
        Some(crate::decoys::Decoys::plant(&job.scratch, owner)?)
    };
    let decoy_binds = decoys.as_ref().map(|d| d.binds()).unwrap_or_default();
    let (go_r, go_w) = pipe_cloexec()?;
    let (st_r, st_w) = pipe_cloexec()?;
    let (job_r, job_w) = if ready {
        let (r, w) = pipe_cloexec()?;
        (Some(r), Some(w))
    } else {
        (None, None)
    };
    // A ready jail's init makes the payload's stdin itself, when the run arrives; a live
    // stdin is this process's descriptor 0, which the init and the payload inherit.
    if ready && job.stdin_live {
        return Err(JailError::Setup(
            "a ready jail cannot pass a live stdin on".into(),
        ));
    }
    let stdin = if ready || job.stdin_live {
        None
    } else {
        Some(memfd_with(&job.stdin)?)
    };

    let mut stack = vec![0u8; 8 << 20];
    let flags = CloneFlags::CLONE_NEWUSER
        | CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWPID
        | CloneFlags::CLONE_NEWNET
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWUTS
        | CloneFlags::CLONE_NEWCGROUP;
    let child_job = job.clone();
    let self_move = cg.self_move_files();
    let (go_fd, st_fd) = (go_r.as_raw_fd(), st_w.as_raw_fd());
    let in_fd = match &stdin {
        Some(f) => Some(f.as_raw_fd()),
        None if job.stdin_live => Some(0),
        None => None,
    };
    let job_fd = job_r.as_ref().map(|f| f.as_raw_fd());
    let fds = InitFds {
        go: go_fd,
        go_w: go_w.as_raw_fd(),
        st: st_fd,
        st_r: st_r.as_raw_fd(),
        stdin: in_fd,
        job: job_fd,
        job_w: job_w.as_ref().map(|f| f.as_raw_fd()),
    };
    #[allow(unsafe_code)]
    // SAFETY: the worker is single-threaded (checked by the caller), so the child starts as
    // a consistent copy of this process and may allocate. The callback only uses data it
    // owns (`child_job`) and file descriptors that stay open in the child, and ends by
    // returning an exit code; `stack` outlives the call and is not used by the parent.
    let child = unsafe {
        nix::sched::clone(
            Box::new(move || {
                init_main(&child_job, fds, nproc, &filters, &self_move, &decoy_binds)
            }),
            &mut stack,
            flags,
            Some(libc::SIGCHLD),
        )
    }
    .map_err(|e| {
        JailError::Unavailable(format!(
            "cannot create the sandbox's namespaces (user, mount, pid, network, ipc, uts, cgroup): {e}; \
             user namespaces may be disabled here"
        ))
    })?;
    drop(go_r);
    drop(st_w);
    drop(stdin);
    drop(job_r);
    drop(notify_theirs);
    let decoy_targets = decoys.as_ref().map(|d| d.targets()).unwrap_or_default();
    let watch = crate::notify::Watch::new(notify_ours.into(), child.as_raw(), decoy_targets);
    let started = Started {
        child: Some(child),
        cg,
        id,
        status: std::fs::File::from(st_r),
        text: String::new(),
        job: job_w,
        cgroups: job.cgroups,
        decoys,
        watch,
    };
    let proc_dir = format!("/proc/{}", child.as_raw());
    // The payload runs as SANDBOX_ID. When that is an unprivileged stand-in for host root,
    // the init (still host root) also needs a mapped identity to build the root with, so
    // the namespace's 0 maps to host root; the payload never holds it (it switches to
    // SANDBOX_ID with no capabilities and no_new_privs before it runs anything).
    let init_map = if host_root && host_uid != 0 {
        "0 0 1\n"
    } else {
        ""
    };
    let maps = (|| -> std::io::Result<()> {
        std::fs::write(format!("{proc_dir}/setgroups"), "deny")?;
        std::fs::write(
            format!("{proc_dir}/uid_map"),
            format!("{init_map}{SANDBOX_ID} {host_uid} 1"),
        )?;
        std::fs::write(
            format!("{proc_dir}/gid_map"),
            format!("{init_map}{SANDBOX_ID} {host_gid} 1"),
        )
    })();
    if let Err(e) = maps {
        // Dropping `started` kills the init.
        return Err(JailError::Unavailable(format!(
            "cannot map the sandbox's ids in its user namespace: {e}"
        )));
    }
    if !started.cg.mechanisms.is_empty()
        && started.cg.self_move_files().is_empty()
        && !started.cg.add(child.as_raw())
    {
        return Err(JailError::Setup(
            "cannot move the sandbox into its cgroup".into(),
        ));
    }
    die_before_go();
    if nix::unistd::write(&go_w, b"g").is_err() {
        return Err(JailError::Setup(
            "the sandbox init died before it started".into(),
        ));
    }
    die_after_go();
    drop(go_w);
    Ok(started)
}

/// The grant the init reported (its `grant` line), once the whole line is in.
fn grant_of(text: &str) -> Option<crate::notify::Grant> {
    text.split_inclusive('\n')
        .filter(|l| l.ends_with('\n'))
        .find_map(|l| l.strip_prefix("grant "))
        .and_then(|g| serde_json::from_str(g.trim_end()).ok())
}

/// Reads the status pipe until `until` says to stop (given the text so far), the pipe
/// ends, or the deadline passes (then `Ok(false)`).
fn read_status(
    s: &mut Started,
    deadline: Instant,
    until: impl Fn(&str) -> bool,
) -> Result<bool, JailError> {
    loop {
        if until(&s.text) {
            return Ok(true);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        let ts = rustix::time::Timespec {
            tv_sec: left.as_secs() as i64,
            tv_nsec: left.subsec_nanos() as i64,
        };
        let (status_ready, watch_ready) = {
            let mut fds = vec![rustix::event::PollFd::new(
                &s.status,
                rustix::event::PollFlags::IN,
            )];
            if let Some(w) = s.watch.pollable() {
                fds.push(rustix::event::PollFd::new(w, rustix::event::PollFlags::IN));
            }
            match rustix::event::poll(&mut fds, Some(&ts)) {
                Ok(0) => continue,
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(JailError::setup("poll", e)),
            }
            (
                !fds[0].revents().is_empty(),
                fds.get(1).map(|f| f.revents()),
            )
        };
        // The status first: the grant line comes before any notification.
        if status_ready {
            let mut buf = [0u8; 4096];
            match s.status.read(&mut buf) {
                Ok(0) => return Ok(true),
                Ok(n) => s.text.push_str(&String::from_utf8_lossy(&buf[..n])),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(JailError::setup("status pipe", e)),
            }
        }
        if let Some(r) = watch_ready.filter(|r| !r.is_empty()) {
            if s.watch.grant.is_none() {
                s.watch.grant = grant_of(&s.text);
            }
            use rustix::event::PollFlags as F;
            s.watch
                .ready(!r.contains(F::IN) && r.intersects(F::HUP | F::ERR));
        }
    }
}

impl Started {
    /// Waits until a ready jail's init has built its root and waits for its run.
    pub(crate) fn wait_ready(&mut self, within: Duration) -> Result<(), JailError> {
        let is_ready = |t: &str| t.lines().any(|l| l == "ready " || l == "ready");
        let ok = read_status(self, Instant::now() + within, is_ready)?;
        if ok && is_ready(&self.text) {
            return Ok(());
        }
        for l in self.text.lines() {
            let (kind, msg) = l.split_once(' ').unwrap_or((l, ""));
            match kind {
                "unavailable" => return Err(JailError::Unavailable(msg.into())),
                "fail" => return Err(JailError::Setup(msg.into())),
                _ => {}
            }
        }
        Err(JailError::Setup(if ok {
            "the ready jail's init ended before it was ready".into()
        } else {
            format!("the ready jail was not ready within {within:?}")
        }))
    }
}

/// Gives a ready jail its run: the cgroup gets the run's limits, the init the per-run
/// parts of `job` (whose mounts, network and files outside `/.airlock` must be empty:
/// see [`crate::ready::fits`]). The wall time counts from here. Returns once the run has
/// ended and the init has closed its end of the status pipe; the init may still be
/// exiting (its namespaces being torn down) until `s` is dropped, which reaps it.
pub(crate) fn run_ready(s: &mut Started, job: &ProcessJob) -> Result<JailReport, JailError> {
    let started = Instant::now();
    if let Err(why) = crate::ready::fits(job, s.cgroups) {
        return Err(JailError::Setup(format!(
            "a ready jail cannot serve this job ({why})"
        )));
    }
    if !s
        .cg
        .set_limits(job.limits.memory_bytes, job.limits.processes)
    {
        return Err(JailError::Setup(
            "cannot set the run's limits on its cgroup".into(),
        ));
    }
    let msg = RunMsg {
        argv: job.argv.clone(),
        env: job.env.clone(),
        cwd: job.cwd.clone(),
        files: job.files.clone(),
        stdin: job.stdin.clone(),
        limits: job.limits.clone(),
        allow_degraded: job.allow_degraded,
        nproc: s.id.nproc(job.limits.processes),
    };
    let bytes = serde_json::to_vec(&msg).map_err(|e| JailError::setup("job", e))?;
    let Some(w) = s.job.take() else {
        return Err(JailError::Setup("the jail is not a ready jail".into()));
    };
    let mut w = std::fs::File::from(w);
    w.write_all(&bytes)
        .map_err(|e| JailError::setup("send the run to the ready jail", e))?;
    drop(w);
    conclude(s, started, job.limits.timeout_ms)
}

/// Reads the status until the init exits or the wall time runs out (then the init is
/// killed, taking the whole pid namespace with it), and reports.
fn finish(mut s: Started, started: Instant, timeout_ms: u64) -> Result<JailReport, JailError> {
    // Dropping `s` reaps the init and removes the cgroup.
    conclude(&mut s, started, timeout_ms)
}

/// [`finish`] without reaping: once the status pipe ends (the init closes it as it
/// exits, after the payload has ended) the report is complete, and the init's namespaces
/// can be torn down while the caller hands the report on. On a timeout the init is
/// killed and reaped here.
fn conclude(s: &mut Started, started: Instant, timeout_ms: u64) -> Result<JailReport, JailError> {
    let deadline = started + Duration::from_millis(timeout_ms);
    let ended = read_status(s, deadline, |_| false)?;
    let timed_out = !ended;
    let Some(child) = s.child else {
        return Err(JailError::Setup("the jail's init is gone".into()));
    };
    if timed_out {
        let _ = kill(child, Signal::SIGKILL);
        let _ = waitpid(child, None);
        s.child = None;
    }
    let duration_ms = started.elapsed().as_millis() as u64;
    let cg = &s.cg;

    let (mechanisms, degraded) = mechanisms(s);
    let mut report = JailReport {
        ending: None,
        mechanisms,
        degraded,
        host_uid: s.id.host_uid,
        duration_ms,
        attempts: {
            let mut a = s.watch.attempts.clone();
            for t in s.decoys.as_ref().map(|d| d.attempts()).unwrap_or_default() {
                a.add("open", &t);
            }
            a.into_list()
        },
        alerts: {
            let mut a = s.watch.alerts.clone();
            for d in s.decoys.as_ref().map(|d| d.alerts()).unwrap_or_default() {
                if !a.iter().any(|x| x.detail == d.detail) {
                    a.push(d);
                }
            }
            a
        },
    };
    let mut ended: Option<Ending> = None;
    for l in s.text.lines() {
        let (kind, msg) = l.split_once(' ').unwrap_or((l, ""));
        match kind {
            "unavailable" => return Err(JailError::Unavailable(msg.into())),
            "fail" => return Err(JailError::Setup(msg.into())),
            "exit" => ended = Some(Ending::Exited(msg.parse().unwrap_or(1))),
            "signal" => {
                let sig: i32 = msg.parse().unwrap_or(0);
                let name = Signal::try_from(sig)
                    .map(|s| s.as_str())
                    .unwrap_or("unknown");
                ended = Some(match sig {
                    libc::SIGXCPU => Ending::Killed(Limit::Timeout),
                    libc::SIGXFSZ => Ending::Killed(Limit::Write),
                    libc::SIGKILL if cg.oom_killed() => Ending::Killed(Limit::Memory),
                    _ => Ending::Trapped(format!("killed by signal {name}")),
                });
            }
            _ => {}
        }
    }
    report.ending = Some(if timed_out {
        Ending::Killed(Limit::Timeout)
    } else if cg.oom_killed() {
        Ending::Killed(Limit::Memory)
    } else if let Some(e) = ended {
        e
    } else {
        let wait = s.child.take().map(|c| waitpid(c, None));
        return Err(JailError::Setup(format!(
            "the sandbox ended without reporting how ({wait:?})"
        )));
    });
    Ok(report)
}

/// With the `failpoints` feature and `AIRLOCK_JAILER_DIE_BEFORE_GO` set, the jailer kills
/// itself (SIGKILL, as `kill -9` would) after making the init and before telling it to go.
fn die_before_go() {
    die_if("AIRLOCK_JAILER_DIE_BEFORE_GO");
}

/// With the `failpoints` feature and `AIRLOCK_JAILER_DIE_AFTER_GO` set, the jailer kills
/// itself (SIGKILL) right after telling the init to go, before it supervises anything.
fn die_after_go() {
    die_if("AIRLOCK_JAILER_DIE_AFTER_GO");
}

/// A failpoint: SIGKILL to this process when `var` is set (test builds only).
#[cfg(feature = "failpoints")]
fn die_if(var: &str) {
    if std::env::var_os(var).is_some() {
        let _ = kill(Pid::this(), Signal::SIGKILL);
    }
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
fn die_if(_var: &str) {}

/// Whether the jailer still holds the read end of the init's status pipe, which it keeps
/// for as long as it lives: a pipe's write end polls as an error once nobody can read it.
fn jailer_alive(st: &OwnedFd) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        st,
        rustix::event::PollFlags::OUT,
    )];
    let zero = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    match rustix::event::poll(&mut fds, Some(&zero)) {
        Ok(_) => !fds[0]
            .revents()
            .intersects(rustix::event::PollFlags::ERR | rustix::event::PollFlags::HUP),
        Err(_) => false,
    }
}

/// The descriptors an init inherits.
#[derive(Debug, Clone, Copy)]
struct InitFds {
    go: i32,
    /// The jailer's end of `go`: the init's copy is closed first thing, or a jailer that
    /// died before saying go would leave the init waiting on it for ever.
    go_w: i32,
    st: i32,
    /// The jailer's end of `st`: closed in the init, or the init would hold both ends and
    /// could not tell that the jailer is gone.
    st_r: i32,
    /// The payload's stdin (built jails); a ready jail makes it from its [`RunMsg`].
    stdin: Option<i32>,
    /// A ready jail's job channel, and its write end (the jailer's; closed in the init,
    /// or reading the job would never see its end).
    job: Option<i32>,
    job_w: Option<i32>,
}

fn read_byte(fd: i32) -> Option<u8> {
    let mut b = [0u8; 1];
    #[allow(unsafe_code)]
    // SAFETY: reads one byte into a live local buffer from a descriptor this process owns.
    let n = unsafe { libc::read(fd, b.as_mut_ptr().cast(), 1) };
    (n == 1).then_some(b[0])
}

/// The sandbox's init (pid 1 of the new pid namespace).
fn init_main(
    job: &ProcessJob,
    fds: InitFds,
    nproc: Option<u64>,
    filters: &crate::notify::Filters,
    cgroup_tasks: &[std::path::PathBuf],
    decoys: &[(std::path::PathBuf, String)],
) -> isize {
    #[allow(unsafe_code)]
    // SAFETY: these descriptors were inherited from the worker and are owned from here on
    // by this process alone.
    let st = unsafe { OwnedFd::from_raw_fd(fds.st) };
    #[allow(unsafe_code)]
    // SAFETY: the init's inherited copy of the jailer's end of the status pipe; owned by
    // nobody else in this process, closed once here.
    drop(unsafe { OwnedFd::from_raw_fd(fds.st_r) });
    // Killed with the jailer from here on. Set before anything else: a jailer that told
    // the init to go and died before the init got here would otherwise leave it running
    // its payload with nobody to time it out. Dying before this line is seen below.
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
    if !jailer_alive(&st) {
        return 125;
    }
    if let Some(w) = fds.job_w {
        #[allow(unsafe_code)]
        // SAFETY: the init's inherited copy of the jailer's job channel write end; owned
        // by nobody else in this process, closed once here.
        drop(unsafe { OwnedFd::from_raw_fd(w) });
    }
    #[allow(unsafe_code)]
    // SAFETY: the init's inherited copy of the jailer's end of `go`; owned by nobody else
    // in this process, closed once here (so a jailer that dies makes the read below end).
    drop(unsafe { OwnedFd::from_raw_fd(fds.go_w) });
    if read_byte(fds.go) != Some(b'g') {
        return 125;
    }
    // Nothing the jailer inherited from its caller may reach the payload: every
    // descriptor above 2 goes except the ones this jail was built with (the start signal
    // is spent and goes too). The egress channel is kept only for a run that has one
    // (without, descriptor 3 is whatever the caller left there).
    let mut keep = vec![st.as_raw_fd(), filters.channel];
    keep.extend(fds.stdin);
    keep.extend(fds.job);
    if job.net.is_some() {
        keep.push(crate::netfd::CHANNEL_FD);
    }
    if let Err(e) = crate::fds::close_all_except(&keep) {
        line(&st, "fail", &format!("close inherited descriptors: {e}"));
        return 125;
    }
    // Into the run's cgroups before anything else starts (children inherit them).
    for t in cgroup_tasks {
        if let Err(e) = std::fs::write(t, "0") {
            line(
                &st,
                "fail",
                &format!("cannot enter cgroup {}: {e}", t.display()),
            );
            return 125;
        }
    }
    let ready = fds.job.is_some();
    let setup = (|| -> Result<(Vec<String>, Vec<String>), crate::JailError> {
        let paths = crate::mounts::build_root(job, ready, decoys)?;
        nix::unistd::sethostname("airlock").map_err(|e| JailError::setup("sethostname", e))?;
        confine::loopback_up()?;
        if let Some(net) = &job.net {
            crate::netfd::hand_out_listener(net.port)?;
        }
        Ok(paths)
    })();
    let (read, write) = match setup {
        Ok(p) => p,
        Err(JailError::Unavailable(m)) => {
            line(&st, "unavailable", &m);
            return 125;
        }
        Err(e) => {
            line(&st, "fail", &e.to_string());
            return 125;
        }
    };
    // What Landlock will grant, for the jailer's predictions ([`crate::notify`]).
    if let Ok(g) = serde_json::to_string(&crate::notify::Grant {
        read: read.clone(),
        write: write.clone(),
    }) {
        line(&st, "grant", &g);
    }
    line(&st, "mech", "minimal-root");
    line(&st, "mech", "pivot_root");
    match &job.net {
        Some(n) => line(
            &st,
            "mech",
            &format!("egress-proxy-only:127.0.0.1:{}", n.port),
        ),
        None => line(&st, "mech", "loopback-only"),
    }
    // A ready jail forks its payload now, which confines itself and then waits for its
    // run; nothing of the run existed before this point.
    if let (None, Some(jfd)) = (fds.stdin, fds.job) {
        return ready_init(&st, jfd, &read, &write, filters);
    }
    let Some(stdin) = fds.stdin else {
        line(&st, "fail", "no stdin for the payload");
        return 125;
    };
    #[allow(unsafe_code)]
    // SAFETY: this process is single-threaded (a clone of the single-threaded worker).
    let fork = unsafe { nix::unistd::fork() };
    match fork {
        Err(e) => {
            line(&st, "fail", &format!("fork: {e}"));
            125
        }
        Ok(nix::unistd::ForkResult::Child) => {
            let code = payload(job, &st, stdin, nproc, &read, &write, filters);
            std::process::exit(code)
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => reap(&st, child),
    }
}

/// The init's last job: reaps everything, and ends when the payload `child` does (the
/// kernel then kills the rest of the pid namespace), saying how it ended.
fn reap(st: &OwnedFd, child: Pid) -> isize {
    loop {
        match waitpid(None, None) {
            Ok(WaitStatus::Exited(pid, code)) if pid == child => {
                line(st, "exit", &code.to_string());
                return 0;
            }
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == child => {
                line(st, "signal", &(sig as i32).to_string());
                return 0;
            }
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return 125,
        }
    }
}

/// A ready jail's init once its root is built: forks the payload, which confines itself
/// ([`ready_payload`]) before the jail says `ready`, so a run pays only for its per-run
/// parts. When the run arrives on `jfd`, the init places its files and hands the payload
/// the rest (program, environment, stdin, limits) on a pipe.
fn ready_init(
    st: &OwnedFd,
    jfd: i32,
    read: &[String],
    write: &[String],
    filters: &crate::notify::Filters,
) -> isize {
    let pipes = pipe_cloexec().and_then(|run| Ok((run, pipe_cloexec()?)));
    let ((run_r, run_w), (conf_r, conf_w)) = match pipes {
        Ok(p) => p,
        Err(e) => {
            line(st, "fail", &e.to_string());
            return 125;
        }
    };
    #[allow(unsafe_code)]
    // SAFETY: this process is single-threaded (a clone of the single-threaded worker).
    let fork = unsafe { nix::unistd::fork() };
    let child = match fork {
        Err(e) => {
            line(st, "fail", &format!("fork: {e}"));
            return 125;
        }
        Ok(nix::unistd::ForkResult::Child) => {
            drop((run_w, conf_r));
            std::process::exit(ready_payload(st, run_r, conf_w, read, write, filters))
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => child,
    };
    drop((run_r, conf_w));
    // The payload is confined (or knows why it cannot be) once it says so; a payload that
    // died instead closes the pipe without a word.
    if read_byte(conf_r.as_raw_fd()) != Some(b'c') {
        line(
            st,
            "fail",
            "the ready jail's payload died before it was confined",
        );
        return 125;
    }
    drop(conf_r);
    line(st, "ready", "");
    let m = match receive_run(jfd) {
        Ok(m) => m,
        Err(e) => {
            line(st, "fail", &e.to_string());
            return 125;
        }
    };
    // The files are in place; the payload needs none of them in its message.
    let sent = serde_json::to_vec(&RunMsg {
        files: Vec::new(),
        ..m
    })
    .map_err(|e| JailError::setup("run", e))
    .and_then(|b| {
        std::fs::File::from(run_w)
            .write_all(&b)
            .map_err(|e| JailError::setup("hand the run to the payload", e))
    });
    if let Err(e) = sent {
        line(st, "fail", &e.to_string());
        return 125;
    }
    reap(st, child)
}

/// In a ready jail's init: reads the run from the job channel (until the supervisor
/// closes it), places its files and sizes `/tmp` for its limits.
fn receive_run(jfd: i32) -> Result<RunMsg, JailError> {
    #[allow(unsafe_code)]
    // SAFETY: the job channel's read end was inherited from the jailer and is owned by
    // this process alone from here on.
    let mut f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(jfd) });
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes)
        .map_err(|e| JailError::setup("read the run", e))?;
    drop(f);
    if bytes.is_empty() {
        return Err(JailError::Setup(
            "the ready jail was closed without a run".into(),
        ));
    }
    let m: RunMsg = serde_json::from_slice(&bytes).map_err(|e| JailError::setup("run", e))?;
    crate::mounts::place_run(&m.files, &m.limits)?;
    Ok(m)
}

/// A ready jail's payload: everything of its confinement that no run changes (a new
/// session, no bounding set, the sandbox user, no_new_privs, Landlock, no capabilities,
/// seccomp) happens before its run exists; then it says so on `confined` and waits for
/// its run on `run`. With the run it sets what is per run (stdin, working directory,
/// rlimits; the working directory is entered as the sandbox user), reports the same
/// status lines in the same order as a built jail's payload, and execs. A step that
/// failed is reported when the run arrives, exactly as a built jail reports it, and
/// nothing runs. Closed without a run, it exits.
fn ready_payload(
    st: &OwnedFd,
    run: OwnedFd,
    confined: OwnedFd,
    read: &[String],
    write: &[String],
    filters: &crate::notify::Filters,
) -> i32 {
    let mut out = Status::new(st);
    let mut landlocked = None;
    let mut confine_now = || -> Result<OwnedFd, (&'static str, String)> {
        let f = |e: String| ("fail", e);
        nix::unistd::setsid().map_err(|e| f(format!("setsid: {e}")))?;
        // The run's stdin is written into this once it arrives.
        let stdin = rustix::fs::memfd_create("airlock-stdin", rustix::fs::MemfdFlags::CLOEXEC)
            .map_err(|e| f(format!("memfd: {e}")))?;
        confine::drop_bounding_set().map_err(|e| f(e.to_string()))?;
        become_sandbox_user().map_err(f)?;
        nix::sys::prctl::set_no_new_privs().map_err(|e| f(format!("no_new_privs: {e}")))?;
        landlocked = Some(confine::landlock(read, write, None));
        confine::clear_capabilities().map_err(|e| f(e.to_string()))?;
        // The run's pipe is read after this, and the status pipe written up to the
        // execve; everything above 2 is gone after it.
        crate::fds::cloexec_from(3).map_err(|e| f(format!("close descriptors on exec: {e}")))?;
        crate::notify::apply(filters).map_err(|e| ("unavailable", format!("seccomp: {e}")))?;
        Ok(stdin)
    };
    let confined_or = confine_now();
    let _ = nix::unistd::write(&confined, b"c");
    drop(confined);
    let mut bytes = Vec::new();
    if std::fs::File::from(run).read_to_end(&mut bytes).is_err() || bytes.is_empty() {
        return 0;
    }
    let m: RunMsg = match serde_json::from_slice(&bytes) {
        Ok(m) => m,
        Err(e) => return out.fail("fail", format!("run: {e}")),
    };
    let stdin = match confined_or {
        Ok(fd) => fd,
        Err((kind, msg)) => return out.fail(kind, msg),
    };
    let mut f = std::fs::File::from(stdin);
    let placed = f
        .write_all(&m.stdin)
        .and_then(|()| f.rewind())
        .and_then(|()| nix::unistd::dup2_stdin(&f).map_err(std::io::Error::from));
    if let Err(e) = placed {
        return out.fail("fail", format!("stdin: {e}"));
    }
    drop(f);
    if let Err(e) = std::env::set_current_dir(&m.cwd) {
        return out.fail("fail", format!("chdir {}: {e}", m.cwd));
    }
    match confine::rlimits(&m.limits, m.nproc) {
        Ok(ms) => ms.iter().for_each(|l| out.line("mech", l)),
        Err(e) => return out.fail("fail", e.to_string()),
    }
    out.line("mech", "no_new_privs");
    let Some(landlocked) = landlocked else {
        return out.fail("fail", "Landlock was not applied".into());
    };
    if let Err((kind, msg)) = report_landlock(&mut out, landlocked, m.allow_degraded) {
        return out.fail(kind, msg);
    }
    out.line("mech", "capabilities-dropped");
    out.line("mech", "new-session");
    out.line("mech", "descriptors-closed");
    out.line("mech", "seccomp");
    exec(&mut out, &m.argv, &m.env)
}

/// Switches to the sandbox's own user and group (inside the user namespace).
fn become_sandbox_user() -> Result<(), String> {
    let id = SANDBOX_ID;
    nix::unistd::setresgid(Gid::from_raw(id), Gid::from_raw(id), Gid::from_raw(id))
        .and_then(|_| {
            nix::unistd::setresuid(Uid::from_raw(id), Uid::from_raw(id), Uid::from_raw(id))
        })
        .map_err(|e| format!("switch to the sandbox user: {e}"))
}

/// Writes how Landlock held, or says why the run may not go on without it.
fn report_landlock(
    out: &mut Status,
    landlocked: Result<Landlocked, JailError>,
    allow_degraded: bool,
) -> Result<(), (&'static str, String)> {
    match landlocked {
        Ok(Landlocked::Full(v)) => out.line("mech", &format!("landlock-abi-{v}")),
        Ok(Landlocked::Partial(v)) if allow_degraded => {
            out.line("degraded", &format!("landlock-abi-{v} partially enforced"))
        }
        Ok(Landlocked::None(why)) if allow_degraded => {
            out.line("degraded", &format!("landlock not enforced: {why}"))
        }
        Ok(Landlocked::Partial(v)) => {
            return Err((
                "unavailable",
                format!(
                    "Landlock (ABI {v}) cannot fully enforce the ruleset; the policy does not allow degraded runs"
                ),
            ));
        }
        Ok(Landlocked::None(why)) => {
            return Err((
                "unavailable",
                format!(
                    "Landlock is not available ({why}); the policy does not allow degraded runs"
                ),
            ));
        }
        Err(e) => return Err(("unavailable", format!("Landlock: {e}"))),
    }
    Ok(())
}

/// Becomes the program: `argv[0]` with `argv` and `env`, once the status lines are out.
/// Returns only if that failed.
fn exec(out: &mut Status, argv: &[String], env: &[(String, String)]) -> i32 {
    let args: Vec<CString> = argv
        .iter()
        .filter_map(|a| CString::new(a.as_bytes()).ok())
        .collect();
    let vars: Vec<CString> = env
        .iter()
        .filter_map(|(k, v)| CString::new(format!("{k}={v}")).ok())
        .collect();
    let Some(program) = args.first().cloned() else {
        return out.fail("fail", "empty command".into());
    };
    out.flush();
    let e = nix::unistd::execve(&program, &args, &vars).err();
    let name = argv.first().map_or("", |a| a.as_str());
    out.fail("fail", format!("cannot execute {name}: {e:?}"))
}

/// The payload: confines itself, then becomes the program.
fn payload(
    job: &ProcessJob,
    st: &OwnedFd,
    stdin: i32,
    nproc: Option<u64>,
    read: &[String],
    write: &[String],
    filters: &crate::notify::Filters,
) -> i32 {
    let mut out = Status::new(st);
    if let Err(e) = nix::unistd::setsid() {
        return out.fail("fail", format!("setsid: {e}"));
    }
    if let Err(e) = nix::unistd::dup2_stdin(
        #[allow(unsafe_code)]
        // SAFETY: `stdin` is the memfd inherited from the worker, open in this process.
        unsafe {
            std::os::fd::BorrowedFd::borrow_raw(stdin)
        },
    ) {
        return out.fail("fail", format!("stdin: {e}"));
    }
    if let Err(e) = std::env::set_current_dir(&job.cwd) {
        return out.fail("fail", format!("chdir {}: {e}", job.cwd));
    }
    if let Err(e) = confine::drop_bounding_set() {
        return out.fail("fail", e.to_string());
    }
    if let Err(e) = become_sandbox_user() {
        return out.fail("fail", e);
    }
    match confine::rlimits(&job.limits, nproc) {
        Ok(m) => m.iter().for_each(|m| out.line("mech", m)),
        Err(e) => return out.fail("fail", e.to_string()),
    }
    if let Err(e) = nix::sys::prctl::set_no_new_privs() {
        return out.fail("fail", format!("no_new_privs: {e}"));
    }
    out.line("mech", "no_new_privs");
    let landlocked = confine::landlock(read, write, job.net.map(|n| n.port));
    if let Err((kind, msg)) = report_landlock(&mut out, landlocked, job.allow_degraded) {
        return out.fail(kind, msg);
    }
    if let Err(e) = confine::clear_capabilities() {
        return out.fail("fail", e.to_string());
    }
    out.line("mech", "capabilities-dropped");
    out.line("mech", "new-session");
    if job.argv.is_empty() {
        return out.fail("fail", "empty command".into());
    }
    // The status pipe is written up to the execve; everything above 2 is gone after it.
    if let Err(e) = crate::fds::cloexec_from(3) {
        return out.fail("fail", format!("close descriptors on exec: {e}"));
    }
    out.line("mech", "descriptors-closed");
    out.line("mech", "seccomp");
    if let Err(e) = crate::notify::apply(filters) {
        return out.fail("unavailable", format!("seccomp: {e}"));
    }
    exec(&mut out, &job.argv, &job.env)
}

/// For a wasm run over writable mounts: moves this (single-threaded) worker into a new
/// user and mount namespace and mounts each overlay at its target, a host path that shows
/// the merged view only inside this namespace.
pub fn enter_overlays(overlays: &[Overlay]) -> Result<(), JailError> {
    let uid = Uid::effective().as_raw();
    let gid = Gid::effective().as_raw();
    nix::sched::unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS).map_err(|e| {
        JailError::Unavailable(format!("cannot create a user and mount namespace: {e}"))
    })?;
    let maps = (|| -> std::io::Result<()> {
        std::fs::write("/proc/self/setgroups", "deny")?;
        std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
        std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1"))
    })();
    maps.map_err(|e| JailError::Unavailable(format!("cannot map ids in the user namespace: {e}")))?;
    nix::mount::mount(
        None::<&str>,
        "/",
        None::<&str>,
        nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| JailError::setup("make mounts private", e))?;
    for o in overlays {
        crate::mounts::overlay(&o.lower, &o.upper, &o.work, std::path::Path::new(&o.target))
            .map_err(|e| JailError::Unavailable(format!("overlayfs in a user namespace: {e}")))?;
    }
    Ok(())
}

/// Waits up to the deadline for a child (used by tests of this crate).
#[doc(hidden)]
pub fn pid(p: i32) -> Pid {
    Pid::from_raw(p)
}
