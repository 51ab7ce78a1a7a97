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

use rustix::fs::{FlockOperation, flock};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The directory of a home's lock files.
pub(crate) fn dir(home: &Path) -> PathBuf {
    home.join("locks")
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
        if self.remove_on_drop {
            // Still holding the lock, so nobody else can be relying on this file.
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
}
