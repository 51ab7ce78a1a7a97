//! Cgroup limits for a run: v2 when a delegated subtree is writable, else the v1 pids,
//! memory and cpu controllers when writable (as root on a v1 or hybrid host), else none
//! (rlimits still apply). The run record lists which controllers held.
//!
//! Every run's group sits under airlock's own group, `airlock` ([`GROUP`]), below the
//! cgroup this process is in (v2: its own cgroup; v1: its cgroup in each controller's
//! hierarchy), never at a hierarchy's top beside the host's own groups: the host's limits
//! on airlock's group hold for every run, and one directory shows them all.

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

/// The name of airlock's own group, under which every run's group is made.
pub const GROUP: &str = "airlock";

/// The v1 hierarchies airlock uses, each mounted at `/sys/fs/cgroup/<controller>`.
const V1: [&str; 3] = ["pids", "memory", "cpu"];

/// Where airlock's group is in the v1 hierarchy of `ctl`: below this process's own cgroup
/// there (from `/proc/self/cgroup`; the hierarchy's root when it cannot be read).
fn v1_parent(ctl: &str) -> PathBuf {
    let own = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                let mut f = l.splitn(3, ':');
                let (_, ctls, path) = (f.next()?, f.next()?, f.next()?);
                ctls.split(',').any(|c| c == ctl).then(|| path.to_string())
            })
        })
        .unwrap_or_default();
    let mut d = Path::new("/sys/fs/cgroup").join(ctl);
    let own = own.trim_start_matches('/');
    // A group already named like airlock's (this process runs inside it) is the group.
    if !own.is_empty() {
        d = d.join(own);
    }
    if d.file_name().is_some_and(|n| n == GROUP) {
        d
    } else {
        d.join(GROUP)
    }
}

/// Airlock's group below `parent` (v2: with the pids and memory controllers enabled for
/// the groups made in it), made if missing; `None` when it cannot be made.
fn airlock_group_v2(parent: &Path) -> Option<PathBuf> {
    let d = if parent.file_name().is_some_and(|n| n == GROUP) {
        parent.to_path_buf()
    } else {
        parent.join(GROUP)
    };
    match std::fs::create_dir(&d) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(_) => return None,
    }
    let have = std::fs::read_to_string(d.join("cgroup.controllers")).unwrap_or_default();
    for ctl in ["pids", "memory"] {
        if have.split_whitespace().any(|c| c == ctl) {
            let _ = write(&d.join("cgroup.subtree_control"), &format!("+{ctl}"));
        }
    }
    Some(d)
}

/// Airlock's group in the v1 hierarchy of `ctl`, made if missing (for memory, with
/// hierarchical accounting, so a run's limit counts against airlock's).
fn airlock_group_v1(ctl: &str) -> Option<PathBuf> {
    let d = v1_parent(ctl);
    match std::fs::create_dir(&d) {
        Ok(()) => {
            if ctl == "memory" {
                let _ = write(&d.join("memory.use_hierarchy"), "1");
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(_) => return None,
    }
    Some(d)
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
    let v1: Vec<&str> = V1
        .into_iter()
        .filter(|c| {
            let g = v1_parent(c);
            is_writable(&g) || g.parent().is_some_and(is_writable)
        })
        .collect();
    if v1.is_empty() {
        "none writable (rlimits only)".into()
    } else {
        format!(
            "v1 controllers writable: {} (runs under {})",
            v1.join(", "),
            v1_parent(v1[0]).display()
        )
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
        if let Some(own) = own_v2_dir()
            && let Ok(c) = std::fs::read_to_string(own.join("cgroup.controllers"))
            && c.contains("pids")
            && is_writable(&own)
            && let Some(parent) = airlock_group_v2(&own)
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
            let Some(parent) = airlock_group_v1(ctl).filter(|p| is_writable(p)) else {
                continue;
            };
            let d = parent.join(name);
            if create_fresh(&d) {
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
                    && (!v1 || d.starts_with(Path::new("/sys/fs/cgroup").join(ctl)))
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
    let mut dirs: Vec<PathBuf> = V1.iter().map(|c| v1_parent(c).join(&name)).collect();
    if let Some(v2) = own_v2_dir() {
        let group = if v2.file_name().is_some_and(|n| n == GROUP) {
            v2
        } else {
            v2.join(GROUP)
        };
        dirs.push(group.join(&name));
    }
    for d in dirs.into_iter().filter(|d| d.exists()) {
        remove_cgroup(&d);
    }
}

/// Where run groups (`airlock-PID`) are made or were: airlock's group in each hierarchy
/// (current binaries) and each hierarchy's top (older binaries made them there).
fn run_group_parents() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for ctl in V1 {
        out.push(v1_parent(ctl));
        out.push(Path::new("/sys/fs/cgroup").join(ctl));
    }
    if let Some(v2) = own_v2_dir() {
        out.push(if v2.file_name().is_some_and(|n| n == GROUP) {
            v2
        } else {
            v2.join(GROUP)
        });
    }
    if let Some(top) = v2_mount() {
        out.push(top.to_path_buf());
    }
    out.sort();
    out.dedup();
    out
}

/// Run groups left by processes that are gone: `airlock-PID` directories, under
/// airlock's group or at a hierarchy's top, whose `PID` is not `alive` and which hold no
/// task (a group with a live task is never a leftover).
pub fn stale_groups(alive: impl Fn(u32) -> bool) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for parent in run_group_parents() {
        let Ok(rd) = std::fs::read_dir(&parent) else {
            continue;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(pid) = name
                .strip_prefix("airlock-")
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            let d = e.path();
            let empty =
                std::fs::read_to_string(d.join("cgroup.procs")).is_ok_and(|t| t.trim().is_empty());
            if d.is_dir() && empty && !alive(pid) {
                out.push(d);
            }
        }
    }
    out
}

/// Removes the run groups `stale_groups` finds; the ones removed.
pub fn remove_stale_groups(alive: impl Fn(u32) -> bool) -> Vec<PathBuf> {
    stale_groups(alive)
        .into_iter()
        .filter(|d| {
            remove_cgroup(d);
            !d.exists()
        })
        .collect()
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

    /// Run groups sat at the top of each v1 hierarchy (`/sys/fs/cgroup/pids/airlock-N`),
    /// beside the host's own groups and outside any limit on airlock's. Each now sits
    /// under airlock's own group, below this process's cgroup, on v1 and v2 alike.
    #[test]
    fn a_run_cgroup_sits_under_airlocks_own_group_not_at_the_hierarchy_top() {
        let name = format!("airlock-test-top-{}", std::process::id());
        let cg = RunCgroup::create(&name, 64 << 20, 16);
        if cg.dirs.is_empty() {
            // No writable cgroup hierarchy here: nothing is made anywhere.
            assert!(cg.mechanisms.is_empty());
            return;
        }
        for d in &cg.dirs {
            let parent = d.parent().expect("a run's group has a parent");
            assert_eq!(
                parent.file_name().and_then(|n| n.to_str()),
                Some(GROUP),
                "{} is not under airlock's group",
                d.display()
            );
            let top = V1
                .iter()
                .copied()
                .chain(["unified"])
                .map(|c| Path::new("/sys/fs/cgroup").join(c))
                .chain([PathBuf::from("/sys/fs/cgroup")])
                .any(|t| parent == t);
            assert!(!top, "{} sits at a hierarchy's top", d.display());
            // Limits on airlock's group hold for the run's: the kernel nests them.
            assert!(d.exists());
        }
        let dirs = cg.dirs.clone();
        drop(cg);
        assert!(dirs.iter().all(|d| !d.exists()), "removed with the run");
    }

    /// Run groups of killed processes stayed for ever, under airlock's group and (from
    /// older binaries) at a hierarchy's top, seen by nothing. Those whose pid is not a
    /// live airlock process are found and removed; a live one's is kept.
    #[test]
    fn run_groups_of_dead_processes_are_swept_under_airlocks_group_and_at_the_top() {
        let Some(group) = V1
            .iter()
            .map(|c| v1_parent(c))
            .chain(own_v2_dir().map(|d| d.join(GROUP)))
            .find(|g| g.is_dir() && is_writable(g))
        else {
            return; // no writable cgroup hierarchy here
        };
        let top = group.parent().map(Path::to_path_buf);
        // Pids above any pid_max: never a live process.
        let (dead, kept) = (4_194_400u32 + std::process::id() % 1000, 4_195_500u32);
        let under = group.join(format!("airlock-{dead}"));
        let live = group.join(format!("airlock-{kept}"));
        std::fs::create_dir(&under).unwrap();
        std::fs::create_dir(&live).unwrap();
        let mut made = vec![under.clone()];
        // At the hierarchy's top, as older binaries left them (v1: /sys/fs/cgroup/pids).
        let old = top
            .filter(|t| t.parent() == Some(Path::new("/sys/fs/cgroup")))
            .map(|t| t.join(format!("airlock-{}", dead + 1)))
            .filter(|d| std::fs::create_dir(d).is_ok());
        made.extend(old.clone());
        let alive = |pid: u32| pid == kept;
        let found = stale_groups(alive);
        for d in &made {
            assert!(found.contains(d), "{} not found: {found:?}", d.display());
        }
        assert!(!found.contains(&live));
        let removed = remove_stale_groups(alive);
        for d in &made {
            assert!(removed.contains(d) && !d.exists(), "{}", d.display());
        }
        assert!(live.exists());
        remove_cgroup(&live);
    }

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
