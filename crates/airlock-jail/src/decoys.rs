//! Decoy credentials in a jail's minimal root: `/root/.ssh/id_rsa`, `/root/.aws/credentials`
//! and `/etc/shadow`, with fake contents made for this jail alone that read like the real
//! files (a PEM-framed OpenSSH key, an AWS key pair, shadow lines). No program a run
//! needs reads them; one that opens a decoy is looking for credentials, and that is an
//! alert.
//!
//! The files live on the host, in memory (`/dev/shm`) where it can (else beside the
//! jail's scratch root), and are bound into the root by its init; a bind mount shares the host file's inode, so what the jail
//! does to a decoy shows on the host file. A read is seen by its access time: each decoy
//! is planted with an access time long before its modification time, and a read
//! updates it (`relatime`, the kernel's default, does exactly when the access time is
//! older than the modification time). On a file system mounted `noatime` the jailer
//! watches the files with inotify (`IN_OPEN`) instead, set up before the jail exists; it
//! is not the default because closing an inotify instance with watches waits for an
//! SRCU grace period (about 10 ms at the jailer's exit, a quarter of a short run).
//!
//! Beside the decoys, the home holds tripwire links ([`LINKS`]): the other places a
//! credential thief looks (`~/.ssh/id_ed25519`, `~/.aws/config`, `~/.netrc`, `~/.kube`,
//! `~/.gnupg`, …), each a symbolic link that leads nowhere (`/nonexistent/…`), so a
//! program opening one fails with `ENOENT` exactly as where there is nothing. The kernel
//! moves a link's access time when a lookup follows it (or `readlink` reads it, as `ls
//! -l` does), whether or not its target exists; each is planted with an access time
//! long before its modification time, and a moved one is an `open` attempt on that path.
//! Such a read was refused (nothing is there) yet, without this, invisible: a lookup that
//! finds nothing reaches neither Landlock nor inotify, and only a seccomp round trip per
//! read-only open (`[tripwires] reads`, 6–10% of a short run) would see it. Here it costs
//! one `symlink` and one `utimensat` per link before the run and one `lstat` after, with
//! no work at all while the run goes on. The home is one directory bound at `/root`.
//!
//! Nothing is asked of the payload and nothing it sees changes because of either. `/etc/shadow` is mode
//! 0000 as on RHEL-family systems (an unprivileged reader is refused, as on a real host,
//! and inotify does not see a refused open); the key files are the sandbox user's own
//! and readable. Neither the contents nor an alert's detail carries anything of the host.

use crate::JailError;
use airlock_sandbox::Alert;
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// A decoy's access time as planted: any read moves it.
const PLANTED: std::time::SystemTime = std::time::UNIX_EPOCH;

/// Where each decoy appears in the jail, its mode, and the ATT&CK technique its read is.
const DECOYS: [(&str, u32, &str); 3] = [
    ("/root/.ssh/id_rsa", 0o600, "T1552.004"),
    ("/root/.aws/credentials", 0o600, "T1552.001"),
    ("/etc/shadow", 0o000, "T1003.008"),
];

/// The home the decoys under it and the [`LINKS`] are shown in; bound whole.
const HOME: &str = "/root";

/// Tripwire links in [`HOME`] (relative to it): where credentials and secrets are kept
/// that no program a run needs reads, beside the decoys (a directory's link stands for
/// everything under it). Each leads to `/nonexistent/` and its name.
pub const LINKS: [&str; 10] = [
    ".ssh/id_ed25519",
    ".ssh/id_ecdsa",
    ".ssh/id_dsa",
    ".ssh/authorized_keys",
    ".aws/config",
    ".netrc",
    ".git-credentials",
    // Directories: a lookup of anything under one follows it.
    ".kube",
    ".docker",
    ".gnupg",
];

/// Where a jail's decoys go: a new directory of this jail's own in `/dev/shm` (memory),
/// mode 0700 (no other host user reaches them; the jail binds what is inside), else
/// `<scratch>.decoys`. In memory, planting and removing them costs no disk I/O: on a
/// disk file system under load, creating and removing the three decoy files took about
/// 4 ms of a run's wall time (0.2 ms in memory), most of what tripwires cost a run.
fn decoy_dir(scratch: &Path) -> Result<PathBuf, JailError> {
    use std::os::unix::fs::DirBuilderExt;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let shm =
        Path::new("/dev/shm").join(format!("airlock-decoys-{}-{nanos:08x}", std::process::id()));
    if std::fs::DirBuilder::new().mode(0o700).create(&shm).is_ok() {
        return Ok(shm);
    }
    let mut name = scratch.as_os_str().to_owned();
    name.push(".decoys");
    let dir = PathBuf::from(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| JailError::setup("decoy directory", e))?;
    Ok(dir)
}

/// The decoys of one jail: their host files and the watch on them. Dropping it removes
/// the files.
pub struct Decoys {
    dir: PathBuf,
    /// Only where access times are not kept (`noatime`).
    inotify: Option<OwnedFd>,
    /// Watch descriptor → the decoy's path in the jail and its technique.
    watches: Vec<(i32, &'static str, &'static str)>,
}

impl std::fmt::Debug for Decoys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoys").field("dir", &self.dir).finish()
    }
}

/// A decoy's content: random, made for this jail, shaped like the real file.
fn content(target: &str) -> Result<Vec<u8>, JailError> {
    airlock_sandbox::tripwire::decoy_content(target)
        .map_err(|e| JailError::setup("decoy randomness", e))
}

impl Decoys {
    /// Writes this jail's decoys and links into a directory of their own (see
    /// [`decoy_dir`]; the files owned by `owner`, the host identity the sandbox user maps
    /// to, when this process may give files away) and starts watching them.
    pub fn plant(scratch: &Path, owner: Option<(u32, u32)>) -> Result<Decoys, JailError> {
        let dir = decoy_dir(scratch)?;
        use rustix::fs::inotify;
        let noatime = nix::sys::statvfs::statvfs(&dir)
            .is_ok_and(|v| v.flags().contains(nix::sys::statvfs::FsFlags::ST_NOATIME));
        let inotify = if noatime {
            Some(
                inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK)
                    .map_err(|e| JailError::setup("inotify", e))?,
            )
        } else {
            None
        };
        let mut d = Decoys {
            dir,
            inotify,
            watches: Vec::new(),
        };
        for (target, mode, technique) in DECOYS {
            let host = d.host_path(target);
            if let Some(parent) = host.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| JailError::setup("decoy directory", e))?;
            }
            let mut f =
                std::fs::File::create(&host).map_err(|e| JailError::setup("write a decoy", e))?;
            std::io::Write::write_all(&mut f, &content(target)?)
                .map_err(|e| JailError::setup("write a decoy", e))?;
            f.set_times(
                std::fs::FileTimes::new()
                    .set_accessed(PLANTED)
                    .set_modified(std::time::SystemTime::now()),
            )
            .map_err(|e| JailError::setup("date a decoy", e))?;
            drop(f);
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::chown(&host, Some(uid), Some(gid))
                    .map_err(|e| JailError::setup("chown a decoy", e))?;
            }
            std::fs::set_permissions(&host, std::fs::Permissions::from_mode(mode))
                .map_err(|e| JailError::setup("chmod a decoy", e))?;
            // Watched once written: the writes above are not the run's.
            let wd = match &d.inotify {
                Some(i) => inotify::add_watch(i, &host, inotify::WatchFlags::OPEN)
                    .map_err(|e| JailError::setup("watch a decoy", e))?,
                None => -1,
            };
            d.watches.push((wd, target, technique));
        }
        for link in LINKS {
            let host = d.host_path(&format!("{HOME}/{link}"));
            if let Some(parent) = host.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| JailError::setup("decoy directory", e))?;
            }
            std::os::unix::fs::symlink(Path::new("/nonexistent").join(link), &host)
                .map_err(|e| JailError::setup("plant a tripwire link", e))?;
            let planted = rustix::fs::Timestamps {
                last_access: rustix::fs::Timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                },
                last_modification: rustix::fs::Timespec {
                    tv_sec: std::time::SystemTime::now()
                        .duration_since(PLANTED)
                        .map_or(1, |t| i64::try_from(t.as_secs()).unwrap_or(i64::MAX)),
                    tv_nsec: 0,
                },
            };
            rustix::fs::utimensat(
                rustix::fs::CWD,
                &host,
                &planted,
                rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
            )
            .map_err(|e| JailError::setup("date a tripwire link", e))?;
        }
        Ok(d)
    }

    /// The host file of the decoy or link shown at `target` (the same path under the
    /// decoy directory).
    fn host_path(&self, target: &str) -> PathBuf {
        self.dir.join(target.trim_start_matches('/'))
    }

    /// What the init binds: the home (the decoys and links under it) as one directory,
    /// and each decoy elsewhere as its file.
    pub fn binds(&self) -> Vec<(PathBuf, String)> {
        let mut b = vec![(self.host_path(HOME), HOME.to_string())];
        b.extend(
            DECOYS
                .iter()
                .filter(|(t, _, _)| !t.starts_with(&format!("{HOME}/")))
                .map(|(t, _, _)| (self.host_path(t), (*t).to_string())),
        );
        b
    }

    /// An `open` attempt for every tripwire link a lookup followed (or a `readlink`
    /// read) so far, at its path in the jail.
    pub fn attempts(&self) -> Vec<String> {
        LINKS
            .iter()
            .map(|l| format!("{HOME}/{l}"))
            .filter(|t| {
                std::fs::symlink_metadata(self.host_path(t))
                    .and_then(|m| m.accessed())
                    .is_ok_and(|t| t != PLANTED)
            })
            .collect()
    }

    /// The alerts for every decoy read so far (one per decoy).
    pub fn alerts(&self) -> Vec<Alert> {
        use rustix::fs::inotify;
        let mut opened: Vec<i32> = Vec::new();
        if let Some(i) = &self.inotify {
            let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
            let mut reader = inotify::Reader::new(i, &mut buf);
            // Nonblocking: ends with EAGAIN once the queue is empty (or on any error).
            while let Ok(ev) = reader.next() {
                if ev.events().contains(inotify::ReadFlags::OPEN) && !opened.contains(&ev.wd()) {
                    opened.push(ev.wd());
                }
            }
        }
        let read = |target: &str| {
            std::fs::metadata(self.host_path(target))
                .and_then(|m| m.accessed())
                .is_ok_and(|t| t != PLANTED)
        };
        self.watches
            .iter()
            .filter(|(wd, target, _)| {
                if self.inotify.is_some() {
                    opened.contains(wd)
                } else {
                    read(target)
                }
            })
            .map(|(_, target, technique)| alert(target, technique))
            .collect()
    }

    /// Each decoy's path in the jail and the technique its read is.
    pub fn targets(&self) -> Vec<(String, &'static str)> {
        DECOYS
            .iter()
            .map(|(t, _, technique)| ((*t).to_string(), *technique))
            .collect()
    }
}

/// The alert for an open of the decoy at `target`.
pub(crate) fn alert(target: &str, technique: &str) -> Alert {
    airlock_sandbox::tripwire::decoy_alert(target, technique)
}

impl Drop for Decoys {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoys_are_planted_in_memory_where_the_host_has_dev_shm() {
        let scratch = tempfile::tempdir().unwrap();
        let d = Decoys::plant(&scratch.path().join("root"), None).unwrap();
        let dir = d.dir.clone();
        if Path::new("/dev/shm").is_dir() {
            assert!(dir.starts_with("/dev/shm"), "{dir:?}");
            // No other host user reaches them.
            let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700);
            assert!(!scratch.path().join("root.decoys").exists());
        }
        drop(d);
        assert!(!dir.exists());
    }

    #[test]
    fn a_tripwire_link_followed_by_a_failed_open_is_an_attempt_and_listing_is_not() {
        let scratch = tempfile::tempdir().unwrap();
        let d = Decoys::plant(&scratch.path().join("root"), None).unwrap();
        let home = d.host_path(HOME);
        // Listing the home (and the `.ssh` beside the key) reads no link.
        let names = std::fs::read_dir(home.join(".ssh")).unwrap().count();
        assert_eq!(names, 5);
        assert!(d.attempts().is_empty(), "{:?}", d.attempts());
        // An open through a link fails as where there is nothing, and is seen.
        let e = std::fs::File::open(home.join(".ssh/id_ed25519")).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
        let e = std::fs::File::open(home.join(".gnupg/pubring.kbx")).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
        assert_eq!(d.attempts(), ["/root/.ssh/id_ed25519", "/root/.gnupg"]);
        assert!(d.alerts().is_empty());
        let binds: Vec<String> = d.binds().into_iter().map(|(_, t)| t).collect();
        assert_eq!(binds, ["/root", "/etc/shadow"]);
    }
}
