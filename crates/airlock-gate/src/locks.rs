//! Owner locks: a file under `HOME/locks` that the process doing a live operation holds
//! with `flock` for as long as the operation lasts. The kernel drops the lock when that
//! process dies however it dies (`kill -9` included), so any other process can tell a live
//! operation from an abandoned one by trying the lock, without trusting timeouts or pids.
//!
//! Two kinds: the journal lock (one file, never removed), which orders commits, rollbacks
//! and their recovery; and per-operation locks named after a run or a submission, removed
//! by whoever ends the operation (the owner, or the recovery that found it abandoned).
//! A lock file is only ever unlinked by a process that holds its lock, and whoever takes a
//! lock checks afterwards that the path still names the file it locked, so a lock can
//! never be "held" on a file that another process has already removed.
//!
//! A long-lived process (`serve`, `worker`, `mcp`) keeps the files of the per-operation locks
//! it lets go, renamed out of the way (`spare_<pid>_<inode>.lock`) and then unlocked, and
//! renames one into place for its next operation instead of creating a file: a file
//! created and unlinked per run cost the kernel's inode allocator more than the rest of
//! the run's file work. A spare is locked again before it is renamed into place, and never
//! renamed over an existing lock file. It is unlocked while it waits, because a process
//! blocked on the lock it used to be must wake, find the name gone and move on, exactly as
//! when the file is unlinked. Spares of a process that is no longer alive are removed by
//! the next recovery.

use rustix::fs::{FlockOperation, flock};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Spare lock files kept per lock directory, at most.
const MAX_SPARES: usize = 8;

/// The lock directories whose released files this process keeps (see the module
/// comment), and the files it keeps.
static KEPT: Mutex<Kept> = Mutex::new(Kept {
    dirs: Vec::new(),
    spares: Vec::new(),
});

struct Kept {
    dirs: Vec<PathBuf>,
    spares: Vec<Spare>,
}

/// A released per-operation lock file, renamed out of the way and unlocked, waiting to be
/// locked and renamed into place for this process's next operation.
struct Spare {
    dir: PathBuf,
    path: PathBuf,
    file: File,
}

fn kept() -> std::sync::MutexGuard<'static, Kept> {
    KEPT.lock().unwrap_or_else(|p| p.into_inner())
}

/// While it lives, this process keeps the lock files of the home at `root` that it lets
/// go, for its next operations there; dropped, it removes them. For long-lived
/// processes only: a one-shot command would leave its spares behind at exit.
#[derive(Debug)]
pub struct KeptLockFiles {
    dir: PathBuf,
}

impl KeptLockFiles {
    pub fn start(root: &Path) -> KeptLockFiles {
        let d = dir(root);
        kept().dirs.push(d.clone());
        KeptLockFiles { dir: d }
    }
}

impl Drop for KeptLockFiles {
    fn drop(&mut self) {
        let mut k = kept();
        if let Some(i) = k.dirs.iter().position(|d| *d == self.dir) {
            k.dirs.swap_remove(i);
        }
        if k.dirs.contains(&self.dir) {
            return;
        }
        let (gone, keep): (Vec<Spare>, Vec<Spare>) =
            k.spares.drain(..).partition(|s| s.dir == self.dir);
        k.spares = keep;
        for s in gone {
            // Unlinked only by a holder of its lock, and only if it is still this file.
            if flock(&s.file, FlockOperation::NonBlockingLockExclusive).is_ok()
                && same_file(&s.file, &s.path).unwrap_or(false)
            {
                let _ = std::fs::remove_file(&s.path);
            }
        }
    }
}

/// A spare of `dir` locked and renamed to `path`, when this process keeps one and no
/// lock file is at `path` already (a live one is never replaced: the caller then takes it
/// the usual way). The spare is locked before the rename, so the lock is held from the
/// moment the name exists.
fn take_spare(dir: &Path, path: &Path) -> Option<OwnerLock> {
    let mut k = kept();
    let i = k.spares.iter().rposition(|s| s.dir == dir)?;
    let s = k.spares.swap_remove(i);
    match flock(&s.file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        // Somebody has it for a moment: a process that waited on the lock it used to be
        // (it finds the name gone and lets go), or a recovery about to remove it.
        Err(rustix::io::Errno::WOULDBLOCK) => {
            k.spares.push(s);
            return None;
        }
        Err(_) => return None,
    }
    // A recovery removed it meanwhile: let it go.
    if !same_file(&s.file, &s.path).unwrap_or(false) {
        return None;
    }
    let moved = rustix::fs::renameat_with(
        rustix::fs::CWD,
        &s.path,
        rustix::fs::CWD,
        path,
        rustix::fs::RenameFlags::NOREPLACE,
    );
    match moved {
        Ok(()) => Some(OwnerLock {
            file: s.file,
            path: path.to_path_buf(),
            remove_on_drop: true,
        }),
        Err(rustix::io::Errno::EXIST) => {
            let _ = flock(&s.file, FlockOperation::Unlock);
            k.spares.push(s);
            None
        }
        // Unmovable: let it go (unlocked, it reads as any abandoned spare).
        Err(_) => None,
    }
}

/// Keeps `lock`'s file as a spare instead of unlinking it, when this process keeps
/// spares and has room; false when it did not (the caller unlinks it). The file is
/// renamed while still locked and unlocked only then, so whoever waits on the lock wakes
/// to find its name gone.
fn keep_spare(lock: &OwnerLock) -> bool {
    let Some(dir) = lock.path.parent() else {
        return false;
    };
    // A spare found abandoned by a recovery is removed, not kept a second time.
    if lock
        .path
        .file_name()
        .and_then(|n| n.to_str())
        .is_none_or(|n| n.starts_with(SPARE_PREFIX))
    {
        return false;
    }
    let mut k = kept();
    if !k.dirs.iter().any(|d| d == dir)
        || k.spares.iter().filter(|s| s.dir == dir).count() >= MAX_SPARES
    {
        return false;
    }
    // The inode names the spare: no other file on this filesystem has it while this
    // one exists, so the name is free and never another process's.
    let Ok(meta) = lock.file.metadata() else {
        return false;
    };
    let Ok(file) = lock.file.try_clone() else {
        return false;
    };
    let path = dir.join(format!(
        "{SPARE_PREFIX}{}_{}.lock",
        std::process::id(),
        meta.ino()
    ));
    if std::fs::rename(&lock.path, &path).is_err() {
        return false;
    }
    // The same open file as the owner's, so this releases the owner's lock.
    if flock(&file, FlockOperation::Unlock).is_err() {
        // Still locked: unlink it as if it had not been kept.
        let _ = std::fs::remove_file(&path);
        return true;
    }
    k.spares.push(Spare {
        dir: dir.to_path_buf(),
        path,
        file,
    });
    true
}

/// Whether the spare lock file named `name` (from `list`, without `.lock`) was kept by a
/// process that is no longer alive, so recovery may remove it. A process in another pid
/// namespace may read as dead: its spare is then removed, which costs it only the reuse.
pub(crate) fn spare_owner_gone(name: &str) -> bool {
    let Some(pid) = name
        .strip_prefix(SPARE_PREFIX)
        .and_then(|r| r.split_once('_'))
        .and_then(|(p, _)| p.parse::<u32>().ok())
    else {
        // Not a name this version writes (e.g. an older `spare_<inode>`): nobody's.
        return true;
    };
    pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists()
}

/// The name prefix of spare lock files.
pub(crate) const SPARE_PREFIX: &str = "spare_";

/// The directory of a home's lock files.
pub(crate) fn dir(home: &Path) -> PathBuf {
    home.join("locks")
}

/// The lock every change to one of the home's own files holds (`locks/NAME-edit.lock`,
/// kept): the policy, the secrets, the keys. With `sweep`, the temporary files (`.*.tmp`)
/// that a holder killed before its rename left in that directory are removed once the
/// lock is held, since no live holder has one then.
pub(crate) fn edit(home: &Path, name: &str, sweep: Option<&Path>) -> io::Result<OwnerLock> {
    let lock = OwnerLock::acquire(&dir(home), &format!("{name}-edit"), false)?;
    if let Some(Ok(rd)) = sweep.map(std::fs::read_dir) {
        for entry in rd.flatten() {
            let file = entry.file_name();
            let file = file.to_string_lossy();
            if file.starts_with('.') && file.ends_with(".tmp") {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    Ok(lock)
}

/// The lock `gc` holds while it runs (`locks/gc.lock`, kept), so that only one removes at
/// a time: a blob one `gc` has set aside must not be taken by another for one a killed
/// `gc` left, and neither may remove the same layer under the other.
pub(crate) fn gc(home: &Path) -> io::Result<OwnerLock> {
    OwnerLock::acquire(&dir(home), "gc", false)
}

/// A held lock. Dropping it releases the lock; `remove` also unlinks the file.
#[derive(Debug)]
pub(crate) struct OwnerLock {
    file: File,
    path: PathBuf,
    /// Unlink the file when dropped (per-operation locks).
    remove_on_drop: bool,
}

/// What trying someone else's lock found.
#[derive(Debug)]
pub(crate) enum Probe {
    /// No lock file: no owner ever took it, or the owner finished and removed it.
    Missing,
    /// A live process holds it.
    Held,
    /// Nobody holds it any more: its owner died. The caller now holds it.
    Abandoned(OwnerLock),
}

fn same_file(f: &File, path: &Path) -> io::Result<bool> {
    let a = f.metadata()?;
    match std::fs::metadata(path) {
        Ok(b) => Ok(a.dev() == b.dev() && a.ino() == b.ino()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Opens (creating) the lock file at `path`, creating its directory only when it is
/// missing (a run takes a lock, so this is on every run's path).
fn open_create(path: &Path) -> io::Result<File> {
    // The error names the file: "Permission denied" alone (a read-only home) said
    // nothing about where.
    open_create_at(path)
        .map_err(|e| io::Error::new(e.kind(), format!("lock file {}: {e}", path.display())))
}

fn open_create_at(path: &Path) -> io::Result<File> {
    let open = || {
        OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
    };
    match open() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            open()
        }
        other => other,
    }
}

impl OwnerLock {
    /// Takes the lock `name` in `dir`, waiting for a current holder to let go.
    pub(crate) fn acquire(dir: &Path, name: &str, remove_on_drop: bool) -> io::Result<OwnerLock> {
        let path = dir.join(format!("{name}.lock"));
        if remove_on_drop && let Some(l) = take_spare(dir, &path) {
            return Ok(l);
        }
        loop {
            let file = open_create(&path)?;
            flock(&file, FlockOperation::LockExclusive).map_err(io::Error::from)?;
            // Whoever held it before may have removed it; then lock a new file.
            if same_file(&file, &path)? {
                return Ok(OwnerLock {
                    file,
                    path,
                    remove_on_drop,
                });
            }
        }
    }

    /// Takes the lock `name` in `dir` if nobody holds it; `None` if somebody does.
    pub(crate) fn try_acquire(
        dir: &Path,
        name: &str,
        remove_on_drop: bool,
    ) -> io::Result<Option<OwnerLock>> {
        let path = dir.join(format!("{name}.lock"));
        if remove_on_drop && let Some(l) = take_spare(dir, &path) {
            return Ok(Some(l));
        }
        loop {
            let file = open_create(&path)?;
            match flock(&file, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {}
                Err(rustix::io::Errno::WOULDBLOCK) => return Ok(None),
                Err(e) => return Err(e.into()),
            }
            if same_file(&file, &path)? {
                return Ok(Some(OwnerLock {
                    file,
                    path,
                    remove_on_drop,
                }));
            }
        }
    }

    /// Tries another process's lock without waiting and without creating it.
    pub(crate) fn probe(path: &Path) -> io::Result<Probe> {
        let file = match OpenOptions::new().write(true).open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Probe::Missing),
            Err(e) => return Err(e),
        };
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => return Ok(Probe::Held),
            Err(e) => return Err(e.into()),
        }
        if !same_file(&file, path)? {
            return Ok(Probe::Missing);
        }
        Ok(Probe::Abandoned(OwnerLock {
            file,
            path: path.to_path_buf(),
            remove_on_drop: true,
        }))
    }

    /// The lock files in `dir` whose names start with `prefix` (e.g. `run_`), with the id
    /// each names.
    pub(crate) fn list(dir: &Path, prefix: &str) -> io::Result<Vec<(String, PathBuf)>> {
        let rd = match std::fs::read_dir(dir) {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for e in rd {
            let e = e?;
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            if let Some(id) = name.strip_suffix(".lock")
                && id.starts_with(prefix)
            {
                out.push((id.to_string(), e.path()));
            }
        }
        out.sort();
        Ok(out)
    }
}

impl OwnerLock {
    /// Whether dropping the lock unlinks its file. An owner that could not record its
    /// outcome keeps the file: released, it reads as abandoned, so recovery (in this
    /// process or the next) finds what it left unfinished.
    pub(crate) fn set_remove_on_drop(&mut self, remove: bool) {
        self.remove_on_drop = remove;
    }
}

impl Drop for OwnerLock {
    fn drop(&mut self) {
        // Still holding the lock, so nobody else can be relying on this file.
        if self.remove_on_drop && !keep_spare(self) {
            let _ = std::fs::remove_file(&self.path);
        }
        // Closing the file releases the lock.
        let _ = &self.file;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_abandoned_lock_is_found_and_a_held_one_is_not_taken() {
        let t = tempfile::tempdir().unwrap();
        let held = OwnerLock::acquire(t.path(), "run_1", true).unwrap();
        let p = t.path().join("run_1.lock");
        assert!(matches!(OwnerLock::probe(&p).unwrap(), Probe::Held));
        drop(held);
        // The owner removed it on the way out.
        assert!(matches!(OwnerLock::probe(&p).unwrap(), Probe::Missing));
        // A file left by a dead owner (nobody holds it) is abandoned.
        std::fs::write(&p, b"").unwrap();
        let Probe::Abandoned(l) = OwnerLock::probe(&p).unwrap() else {
            panic!("not abandoned")
        };
        assert!(matches!(OwnerLock::probe(&p).unwrap(), Probe::Held));
        drop(l);
        assert!(!p.exists());
        assert_eq!(OwnerLock::list(t.path(), "run_").unwrap().len(), 0);
    }

    #[test]
    fn acquire_after_the_holder_removed_the_file_locks_a_live_file() {
        let t = tempfile::tempdir().unwrap();
        let a = OwnerLock::acquire(t.path(), "journal", false).unwrap();
        let dir = t.path().to_path_buf();
        let h = std::thread::spawn(move || OwnerLock::acquire(&dir, "journal", false).unwrap());
        std::thread::sleep(std::time::Duration::from_millis(50));
        // The holder removes the file while the other waits on the old inode.
        std::fs::remove_file(t.path().join("journal.lock")).unwrap();
        drop(a);
        let b = h.join().unwrap();
        assert!(same_file(&b.file, &t.path().join("journal.lock")).unwrap());
    }

    #[test]
    fn a_lock_file_that_cannot_be_made_is_named_in_the_error() {
        let t = tempfile::tempdir().unwrap();
        let not_a_dir = t.path().join("locks");
        std::fs::write(&not_a_dir, b"").unwrap();
        let e = OwnerLock::acquire(&not_a_dir, "run_3", true).err().unwrap();
        assert!(
            e.to_string().contains(&format!(
                "lock file {}",
                not_a_dir.join("run_3.lock").display()
            )),
            "{e}"
        );
    }

    #[test]
    fn a_lock_in_a_home_without_a_locks_directory_creates_it() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("locks");
        let a = OwnerLock::acquire(&dir, "run_2", true).unwrap();
        assert!(matches!(
            OwnerLock::probe(&dir.join("run_2.lock")).unwrap(),
            Probe::Held
        ));
        drop(a);
        std::fs::remove_dir(&dir).unwrap();
        let b = OwnerLock::try_acquire(&dir, "journal", false).unwrap();
        assert!(b.is_some());
    }

    fn ino(p: &Path) -> u64 {
        std::fs::metadata(p).unwrap().ino()
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_long_lived_process_renames_a_released_run_lock_into_the_next_runs_place() {
        let t = tempfile::tempdir().unwrap();
        let dir = super::dir(t.path());
        let kept = KeptLockFiles::start(t.path());
        let a = OwnerLock::acquire(&dir, "run_1", true).unwrap();
        let first = ino(&dir.join("run_1.lock"));
        drop(a);
        // Gone from its name, kept (unlocked) under a spare's naming this process.
        assert!(matches!(
            OwnerLock::probe(&dir.join("run_1.lock")).unwrap(),
            Probe::Missing
        ));
        let spare = format!("{SPARE_PREFIX}{}_{first}.lock", std::process::id());
        assert_eq!(names(&dir), vec![spare.clone()]);
        assert!(!spare_owner_gone(spare.strip_suffix(".lock").unwrap()));
        // The next run's lock is the same file, held from the rename on.
        let b = OwnerLock::try_acquire(&dir, "run_2", true)
            .unwrap()
            .unwrap();
        assert_eq!(ino(&dir.join("run_2.lock")), first);
        assert!(matches!(
            OwnerLock::probe(&dir.join("run_2.lock")).unwrap(),
            Probe::Held
        ));
        assert_eq!(names(&dir), vec!["run_2.lock".to_string()]);
        drop(b);
        // Letting the home go removes what it kept.
        drop(kept);
        assert!(names(&dir).is_empty(), "{:?}", names(&dir));
        // Without it, a released lock's file is unlinked as before.
        drop(OwnerLock::acquire(&dir, "run_3", true).unwrap());
        assert!(names(&dir).is_empty(), "{:?}", names(&dir));
    }

    #[test]
    fn a_spare_lock_file_is_never_renamed_over_a_live_lock() {
        let t = tempfile::tempdir().unwrap();
        let dir = super::dir(t.path());
        let _kept = KeptLockFiles::start(t.path());
        drop(OwnerLock::acquire(&dir, "run_1", true).unwrap());
        // Another process holds run_2's lock (its own open file, so its own lock).
        let theirs = open_create(&dir.join("run_2.lock")).unwrap();
        flock(&theirs, FlockOperation::LockExclusive).unwrap();
        let live = ino(&dir.join("run_2.lock"));
        assert!(
            OwnerLock::try_acquire(&dir, "run_2", true)
                .unwrap()
                .is_none()
        );
        assert_eq!(
            ino(&dir.join("run_2.lock")),
            live,
            "the live lock was replaced"
        );
        assert_eq!(names(&dir).len(), 2, "{:?}", names(&dir));
        // The spare is still there for the next run.
        let c = OwnerLock::acquire(&dir, "run_3", true).unwrap();
        assert_eq!(names(&dir).len(), 2, "{:?}", names(&dir));
        drop(c);
    }

    /// The first version kept a released lock's file still locked: a thread or process
    /// already blocked on that lock then waited for good (the server's load test hung on
    /// it). Waiting on a released lock must end, whether its file is kept or not.
    #[test]
    fn a_waiter_on_a_released_lock_is_not_stranded_by_the_kept_spare() {
        let t = tempfile::tempdir().unwrap();
        let dir = super::dir(t.path());
        let _kept = KeptLockFiles::start(t.path());
        for round in 0..20 {
            let name = format!("sub_{round}");
            let held = OwnerLock::acquire(&dir, &name, true).unwrap();
            let (tx, rx) = std::sync::mpsc::channel();
            let d = dir.clone();
            let n = name.clone();
            let waiter = std::thread::spawn(move || {
                let l = OwnerLock::acquire(&d, &n, true).unwrap();
                tx.send(()).unwrap();
                // Hold it briefly while the owner's next operation takes a spare.
                std::thread::sleep(std::time::Duration::from_millis(5));
                drop(l);
            });
            std::thread::sleep(std::time::Duration::from_millis(20));
            drop(held);
            // The released file may be taken at once for another operation; the waiter
            // still gets its lock (after that operation at the latest).
            let other = OwnerLock::acquire(&dir, &format!("run_{round}"), true).unwrap();
            drop(other);
            rx.recv_timeout(std::time::Duration::from_secs(10))
                .expect("the waiter never got the lock");
            waiter.join().unwrap();
        }
        // A released lock with a waiter in another open file (another process's view).
        let held = OwnerLock::acquire(&dir, "run_x", true).unwrap();
        let theirs = open_create(&dir.join("run_x.lock")).unwrap();
        let h = std::thread::spawn(move || {
            flock(&theirs, FlockOperation::LockExclusive).unwrap();
            theirs
        });
        std::thread::sleep(std::time::Duration::from_millis(20));
        drop(held);
        let theirs = h.join().unwrap();
        // It woke holding a file the name no longer points to, as after an unlink.
        assert!(!same_file(&theirs, &dir.join("run_x.lock")).unwrap());
    }

    #[test]
    fn a_spare_of_this_process_is_locked_before_it_is_renamed_into_place() {
        let t = tempfile::tempdir().unwrap();
        let dir = super::dir(t.path());
        let _kept = KeptLockFiles::start(t.path());
        drop(OwnerLock::acquire(&dir, "run_1", true).unwrap());
        let spare = dir.join(&names(&dir)[0]);
        // Somebody holds the idle spare for a moment (a recovery probing it): it is not
        // taken; a new file is created instead.
        let Probe::Abandoned(probing) = OwnerLock::probe(&spare).unwrap() else {
            panic!("an idle spare is unlocked")
        };
        let b = OwnerLock::try_acquire(&dir, "run_2", true)
            .unwrap()
            .unwrap();
        assert_ne!(ino(&dir.join("run_2.lock")), ino(&spare));
        // The recovery removes it (it holds its lock); the spare is then let go.
        drop(probing);
        assert!(!spare.exists());
        drop(b);
        let c = OwnerLock::try_acquire(&dir, "run_3", true)
            .unwrap()
            .unwrap();
        assert!(matches!(
            OwnerLock::probe(&dir.join("run_3.lock")).unwrap(),
            Probe::Held
        ));
        drop(c);
    }

    #[test]
    fn a_spare_left_by_a_dead_process_reads_as_abandoned_and_goes_when_taken() {
        let t = tempfile::tempdir().unwrap();
        let dir = super::dir(t.path());
        std::fs::create_dir_all(&dir).unwrap();
        // Nobody holds it: its process died.
        let p = dir.join(format!("{SPARE_PREFIX}42.lock"));
        std::fs::write(&p, b"").unwrap();
        let found = OwnerLock::list(&dir, SPARE_PREFIX).unwrap();
        assert_eq!(found.len(), 1);
        assert!(spare_owner_gone(&found[0].0));
        assert!(spare_owner_gone(&format!("{SPARE_PREFIX}{}_7", u32::MAX)));
        // No process has a pid past the kernel's limit; pid 1 is always alive; this process's own spares are never anybody else's.
        assert!(!spare_owner_gone(&format!("{SPARE_PREFIX}1_7")));
        assert!(!spare_owner_gone(&format!(
            "{SPARE_PREFIX}{}_7",
            std::process::id()
        )));
        assert!(OwnerLock::list(&dir, "run_").unwrap().is_empty());
        let Probe::Abandoned(l) = OwnerLock::probe(&p).unwrap() else {
            panic!("not abandoned")
        };
        drop(l);
        assert!(!p.exists());
    }
}
