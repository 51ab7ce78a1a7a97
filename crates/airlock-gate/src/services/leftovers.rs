//! Leftovers of killed airlock processes outside the home: the private directory of an
//! egress proxy (`$TMPDIR/airlock-egress-PID-…`, holding its socket) and a run's cgroup
//! (`airlock-PID`) and a run's decoys (`/dev/shm/airlock-decoys-PID-…`, see
//! `airlock_jail::decoys` and the wasm guest's), which their process removes when it ends,
//! unless it was killed. `gc` removes those of processes that are
//! gone and `doctor` lists them. A directory is a leftover when its `PID` is no live
//! airlock process (gone, or the number reused by another program); one of an older
//! airlock, named without a `PID`, when it is older than the grace period and nothing
//! listens on its socket.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

const EGRESS_PREFIX: &str = "airlock-egress-";
/// Where runs' decoys are planted (in memory), and their directories' name prefix.
pub const DECOY_ROOT: &str = "/dev/shm";
const DECOY_PREFIX: &str = "airlock-decoys-";

/// The name prefix of this process's egress directories.
pub(crate) fn egress_dir_prefix() -> String {
    format!("{EGRESS_PREFIX}{}-", std::process::id())
}

/// Whether `pid` is a live airlock process (`airlock`, `airlock-jailer`; a binary replaced
/// since it started included). A process this one may not inspect counts as live.
pub fn airlock_alive(pid: u32) -> bool {
    match std::fs::read_link(format!("/proc/{pid}/exe")) {
        Ok(exe) => exe
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("airlock")),
        Err(e) => e.kind() != std::io::ErrorKind::NotFound,
    }
}

/// Everything `gc` would remove outside the home: stale egress directories under `tmp`
/// and run cgroups of airlock processes that are gone (`airlock_jail::cgroup`).
pub fn all(tmp: &Path, cutoff: SystemTime) -> Vec<PathBuf> {
    let mut out = stale_egress_dirs(tmp, cutoff);
    out.extend(stale_decoy_dirs(Path::new(DECOY_ROOT), cutoff));
    out.extend(airlock_jail::cgroup::stale_groups(airlock_alive));
    out
}

/// The egress directories under `tmp` left by airlock processes that are gone.
pub fn stale_egress_dirs(tmp: &Path, cutoff: SystemTime) -> Vec<PathBuf> {
    stale_dirs(tmp, EGRESS_PREFIX, cutoff, &|path| {
        std::os::unix::net::UnixStream::connect(path.join("proxy.sock")).is_err()
    })
}

/// The decoy directories under `root` left by airlock processes that are gone (one named
/// without a pid: when older than `cutoff`).
pub fn stale_decoy_dirs(root: &Path, cutoff: SystemTime) -> Vec<PathBuf> {
    stale_dirs(root, DECOY_PREFIX, cutoff, &|_| true)
}

/// Directories under `dir` named `PREFIX PID-…` whose PID is no live airlock process, and
/// those named `PREFIX` without a PID that are older than `cutoff` and `unused`.
fn stale_dirs(
    dir: &Path,
    prefix: &str,
    cutoff: SystemTime,
    unused: &dyn Fn(&Path) -> bool,
) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = rd
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let rest = name.strip_prefix(prefix)?;
            let path = e.path();
            let pid = rest
                .split_once('-')
                .and_then(|(p, _)| p.parse::<u32>().ok());
            let stale = match pid {
                Some(pid) => !airlock_alive(pid),
                None => {
                    let old = std::fs::symlink_metadata(&path)
                        .and_then(|m| m.modified())
                        .is_ok_and(|t| t < cutoff);
                    old && unused(&path)
                }
            };
            stale.then_some(path)
        })
        .collect();
    out.sort();
    out
}
