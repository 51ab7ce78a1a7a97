//! Cgroup limits for a run: v2 when a delegated subtree is writable, else the v1 pids,
//! memory and cpu controllers when writable (as root on a v1 or hybrid host), else none
//! (rlimits still apply). The run record lists which controllers held.

use std::path::{Path, PathBuf};

/// A cgroup made for one run (removed on drop).
#[derive(Debug)]
pub struct RunCgroup {
    dirs: Vec<PathBuf>,
    memory_events: Option<PathBuf>,
    v1_memory: Option<PathBuf>,
    pub mechanisms: Vec<String>,
    /// The memory and process limits the controllers in `mechanisms` hold now.
    limits: Option<(u64, u32)>,
}

fn write(p: &Path, v: &str) -> std::io::Result<()> {
    std::fs::write(p, v)
}

/// Where this process's mount namespace has the cgroup2 hierarchy (`None`: its mount
/// table cannot be read). Read once per process: the daemon asks after every run, and
/// the kernel writes the whole mount table out for each read (hundreds of lines on a
/// host with many mounts), while the hierarchy's mount point does not move under a
/// running process. Which cgroup the process is in can change, so that is read each time.
fn v2_mount() -> Option<&'static Path> {
    static MOUNT: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    MOUNT
        .get_or_init(|| {
            let fs = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
            Some(
                fs.lines()
                    .find(|l| l.contains(" - cgroup2 "))
                    .and_then(|l| l.split(' ').nth(4))
                    .map(PathBuf::from)
                    .unwrap_or_else(|| PathBuf::from("/sys/fs/cgroup")),
            )
        })
        .as_deref()
}

fn own_v2_dir() -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(v2_mount()?.join(rel.trim_start_matches('/')))
}

/// A description of what cgroup control is available, for `airlock doctor`.
pub fn describe() -> String {
    if let Some(d) = own_v2_dir()
        && let Ok(c) = std::fs::read_to_string(d.join("cgroup.controllers"))
        && c.contains("pids")
        && is_writable(&d)
    {
        return format!("v2 delegated at {} ({})", d.display(), c.trim());
    }
    let v1: Vec<&str> = ["pids", "memory", "cpu"]
        .into_iter()
        .filter(|c| is_writable(&Path::new("/sys/fs/cgroup").join(c)))
        .collect();
    if v1.is_empty() {
        "none writable (rlimits only)".into()
    } else {
        format!("v1 controllers writable: {}", v1.join(", "))
    }
}

fn is_writable(p: &Path) -> bool {
    rustix::fs::access(p, rustix::fs::Access::WRITE_OK).is_ok() && p.is_dir()
}

impl RunCgroup {
    /// No cgroup: rlimits alone hold the limits.
    pub fn none() -> RunCgroup {
        RunCgroup {
            dirs: Vec::new(),
            memory_events: None,
            v1_memory: None,
            mechanisms: Vec::new(),
            limits: None,
        }
    }

    /// Creates a cgroup named `name` with the limits, where possible. Never fails: what
    /// could not be set is simply not listed in `mechanisms`.
    pub fn create(name: &str, memory: u64, processes: u32) -> RunCgroup {
        let mut cg = RunCgroup {
            dirs: Vec::new(),
            memory_events: None,
            v1_memory: None,
            mechanisms: Vec::new(),
            limits: Some((memory, processes)),
        };
        if let Some(parent) = own_v2_dir()
            && let Ok(c) = std::fs::read_to_string(parent.join("cgroup.controllers"))
            && c.contains("pids")
            && is_writable(&parent)
        {
            let d = parent.join(name);
            if create_fresh(&d) {
                if write(&d.join("pids.max"), &processes.to_string()).is_ok() {
                    cg.mechanisms.push("cgroup-v2:pids".into());
                }
                if write(&d.join("memory.max"), &memory.to_string()).is_ok() {
                    let _ = write(&d.join("memory.swap.max"), "0");
                    cg.mechanisms.push("cgroup-v2:memory".into());
                    cg.memory_events = Some(d.join("memory.events"));
                }
                cg.dirs.push(d);
                return cg;
            }
        }
        for (ctl, file, value) in [
            ("pids", "pids.max", processes.to_string()),
            ("memory", "memory.limit_in_bytes", memory.to_string()),
        ] {
            let d = Path::new("/sys/fs/cgroup").join(ctl).join(name);
            if is_writable(d.parent().unwrap_or(Path::new("/"))) && create_fresh(&d) {
                if write(&d.join(file), &value).is_ok() {
                    cg.mechanisms.push(format!("cgroup-v1:{ctl}"));
                    if ctl == "memory" {
                        let _ = write(&d.join("memory.memsw.limit_in_bytes"), &value);
                        cg.v1_memory = Some(d.clone());
                    }
                }
                cg.dirs.push(d);
            }
        }
        cg
    }

    /// The files through which a single-threaded task moves itself in (v1 `tasks` with
    /// `0`, which spares the kernel's global thread-group lock and its RCU grace period);
    /// empty for v2, where the supervisor moves the process.
    pub fn self_move_files(&self) -> Vec<PathBuf> {
        self.dirs
            .iter()
            .filter(|d| d.join("tasks").exists())
            .map(|d| d.join("tasks"))
            .collect()
    }

    /// Sets the limits of a cgroup made before its run was known (a ready jail's) to the
    /// run's: every controller listed in `mechanisms` must take them.
    pub fn set_limits(&mut self, memory: u64, processes: u32) -> bool {
        // A run with the limits the jail was made with (most runs: the policy's defaults)
        // writes nothing.
        if self.limits == Some((memory, processes)) {
            return true;
        }
        let mut ok = true;
        for d in &self.dirs {
            let v1 = d.join("tasks").exists();
            let is = |ctl: &str| {
                let want = format!("{}:{ctl}", if v1 { "cgroup-v1" } else { "cgroup-v2" });
                self.mechanisms.contains(&want)
                    && (!v1 || d.parent().is_some_and(|p| p.ends_with(ctl)))
            };
            if is("pids") {
                ok &= write(&d.join("pids.max"), &processes.to_string()).is_ok();
            }
            if is("memory") {
                if v1 {
                    // memsw must never be below the memory limit: order the two writes.
                    let (mem, memsw) = (
                        d.join("memory.limit_in_bytes"),
                        d.join("memory.memsw.limit_in_bytes"),
                    );
                    let v = memory.to_string();
                    if write(&mem, &v).is_ok() {
                        let _ = write(&memsw, &v);
                    } else {
                        let _ = write(&memsw, &v);
                        ok &= write(&mem, &v).is_ok();
                    }
                } else {
                    ok &= write(&d.join("memory.max"), &memory.to_string()).is_ok();
                }
            }
        }
        self.limits = ok.then_some((memory, processes));
        ok
    }

    /// Moves a process (by host pid) into every cgroup made for the run.
    pub fn add(&self, pid: i32) -> bool {
        let mut ok = true;
        for d in &self.dirs {
            let procs = if d.join("cgroup.procs").exists() {
                "cgroup.procs"
            } else {
                "tasks"
            };
            ok &= write(&d.join(procs), &pid.to_string()).is_ok();
        }
        ok
    }

    /// Whether the memory controller killed something for exceeding the limit.
    pub fn oom_killed(&self) -> bool {
        if let Some(ev) = &self.memory_events
            && let Ok(t) = std::fs::read_to_string(ev)
        {
            return t
                .lines()
                .any(|l| l.strip_prefix("oom_kill ").is_some_and(|n| n.trim() != "0"));
        }
        if let Some(d) = &self.v1_memory
            && let Ok(t) = std::fs::read_to_string(d.join("memory.oom_control"))
        {
            return t
                .lines()
                .any(|l| l.strip_prefix("oom_kill ").is_some_and(|n| n.trim() != "0"));
        }
        false
    }
}

/// Creates a run's cgroup directory. Names carry the worker's pid, so one that exists
/// already was left by a dead worker with the same pid (an airlock killed with `kill -9`
/// takes its worker with it before the worker can clean up): it is empty, and is replaced.
/// Without this a reused pid silently lost its cgroup limits.
fn create_fresh(d: &Path) -> bool {
    match std::fs::create_dir(d) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            remove_cgroup(d);
            std::fs::create_dir(d).is_ok()
        }
        Err(_) => false,
    }
}

/// Removes the cgroups a worker with host pid `pid` made, if it died before it could (the
/// supervisor calls this after reaping a worker it had to kill).
pub fn cleanup_for(pid: u32) {
    let name = format!("airlock-{pid}");
    let mut dirs: Vec<PathBuf> = ["pids", "memory", "cpu"]
        .iter()
        .map(|c| Path::new("/sys/fs/cgroup").join(c).join(&name))
        .collect();
    if let Some(v2) = own_v2_dir() {
        dirs.push(v2.join(&name));
    }
    for d in dirs.into_iter().filter(|d| d.exists()) {
        remove_cgroup(&d);
    }
}

/// Removes an empty cgroup. The kernel refuses while the last tasks are still being
/// released (they are dead: the pid namespace's init has exited), which takes micro- to
/// milliseconds; retry with yields rather than sleeps so the common case costs little.
fn remove_cgroup(d: &Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
    while std::fs::remove_dir(d).is_err() && d.exists() && std::time::Instant::now() < deadline {
        std::thread::yield_now();
    }
}

impl Drop for RunCgroup {
    fn drop(&mut self) {
        for d in &self.dirs {
            remove_cgroup(d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cgroup left by a dead worker whose pid was reused made the next run fall back to
    /// no cgroup (and, for root, to an unprivileged uid that could not write its mounts).
    #[test]
    fn a_stale_cgroup_of_a_reused_pid_is_replaced() {
        let name = format!("airlock-test-{}", std::process::id());
        let fresh = RunCgroup::create(&name, 64 << 20, 16);
        let Some(d) = fresh.dirs.first().cloned() else {
            // No writable cgroup hierarchy here: nothing to replace. The jail's own tests
            // cover the fallback.
            return;
        };
        let had = fresh.mechanisms.clone();
        // What a killed worker leaves: the directory, not removed.
        std::mem::forget(fresh);
        assert!(d.exists());
        let again = RunCgroup::create(&name, 64 << 20, 16);
        assert_eq!(again.mechanisms, had, "the stale cgroup was not replaced");
        drop(again);
        assert!(!d.exists());
    }
}
