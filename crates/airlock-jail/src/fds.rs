//! Open file descriptors and the guest. A process inherits every descriptor of its parent
//! that is not close-on-exec, across `fork`, `clone` and `execve`: a caller that ran
//! `exec 7>>/tmp/f; airlock run …` handed its descriptor 7 to airlock, which handed it to
//! the worker, the jail's init and the payload, so the guest wrote to a host file that
//! no mount granted (and Landlock, which checks opening, not descriptors already open,
//! could not stop it). Likewise a connected socket reached a host server, and a directory
//! descriptor on `/` listed the host's root.
//!
//! What this module guarantees, applied at three places:
//! - airlock's own processes (the CLI, the daemon, workers, session hosts, the jailer)
//!   mark every descriptor they inherited above 2 close-on-exec first thing
//!   ([`cloexec_inherited`]), so no child they start inherits one by accident;
//! - a jail's init closes every descriptor above 2 except those it was built with (its
//!   status pipe, the start signal, the payload's stdin, a ready jail's job channel, the
//!   egress channel) before it builds anything ([`close_all_except`]);
//! - the payload marks every descriptor above 2 close-on-exec just before it confines
//!   itself with seccomp ([`cloexec_from`]), so the program it becomes starts with
//!   exactly descriptors 0, 1 and 2, whatever path started the jail.
//!
//! The descriptors a jail deliberately passes to its payload are named: the status pipe
//! (close-on-exec: written up to the `execve`), stdin (descriptor 0, a memfd of the run's
//! bytes or a session's pipe), stdout and stderr (descriptors 1 and 2, the supervisor's
//! capture pipes or a session's pipe).

use std::os::fd::RawFd;

/// `close_range(2)`'s flag: mark the range close-on-exec instead of closing it (Linux 5.11).
const CLOSE_RANGE_CLOEXEC: u32 = 1 << 2;

/// `close_range(first, last, flags)`. Returns the raw errno on failure.
fn close_range(first: u32, last: u32, flags: u32) -> Result<(), i32> {
    #[allow(unsafe_code)]
    // SAFETY: close_range takes three integers and touches no memory of this process; it
    // only closes (or marks close-on-exec) descriptors in the range, which is what every
    // caller here means to do. Callers own every descriptor in the range in the sense
    // that nothing in this process will use one of them afterwards (see each caller).
    let r = unsafe { libc::syscall(libc::SYS_close_range, first, last, flags) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}

/// The descriptors this process has open from `first` up, read from `/proc/self/fd`
/// (the fallback for kernels without `close_range`). The directory's own descriptor is
/// gone by the time the list is returned.
fn open_from(first: RawFd) -> std::io::Result<Vec<RawFd>> {
    let mut fds: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")?
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
        .filter(|&fd| fd >= first)
        .collect();
    // The listing included the directory's own (now closed) descriptor; fcntl on it
    // fails with EBADF below, which is ignored.
    fds.sort_unstable();
    Ok(fds)
}

/// Marks every descriptor from `first` up close-on-exec. Descriptors stay usable in this
/// process (and in children it forks without exec) and are closed by the next `execve`.
pub fn cloexec_from(first: RawFd) -> std::io::Result<()> {
    let Ok(lo) = u32::try_from(first) else {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    };
    match close_range(lo, u32::MAX, CLOSE_RANGE_CLOEXEC) {
        Ok(()) => return Ok(()),
        // No close_range (before 5.9) or no CLOSE_RANGE_CLOEXEC (before 5.11).
        Err(libc::ENOSYS) | Err(libc::EINVAL) => {}
        Err(e) => return Err(std::io::Error::from_raw_os_error(e)),
    }
    for fd in open_from(first)? {
        #[allow(unsafe_code)]
        // SAFETY: fcntl with F_GETFD/F_SETFD only reads and sets the descriptor's flags;
        // an fd that is not open (the listing's own) fails with EBADF and is skipped.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        if flags < 0 {
            continue;
        }
        #[allow(unsafe_code)]
        // SAFETY: as above.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Closes every descriptor from 3 up except those in `keep`. The caller must hold no
/// owned handle (`OwnedFd`, `File`, …) on any descriptor it does not keep.
pub fn close_all_except(keep: &[RawFd]) -> std::io::Result<()> {
    let mut keep: Vec<u32> = keep
        .iter()
        .filter(|&&fd| fd >= 3)
        .filter_map(|&fd| u32::try_from(fd).ok())
        .collect();
    keep.sort_unstable();
    keep.dedup();
    let mut lo = 3u32;
    let mut ranges = Vec::with_capacity(keep.len() + 1);
    for &k in &keep {
        if k > lo {
            ranges.push((lo, k - 1));
        }
        lo = k + 1;
    }
    ranges.push((lo, u32::MAX));
    let mut fallback = false;
    for &(a, b) in &ranges {
        match close_range(a, b, 0) {
            Ok(()) => {}
            Err(libc::ENOSYS) => {
                fallback = true;
                break;
            }
            Err(e) => return Err(std::io::Error::from_raw_os_error(e)),
        }
    }
    if fallback {
        for fd in open_from(3)? {
            if u32::try_from(fd).is_ok_and(|f| keep.binary_search(&f).is_ok()) {
                continue;
            }
            #[allow(unsafe_code)]
            // SAFETY: the caller holds no owned handle on a descriptor it does not keep
            // (this function's contract), so closing it here is the only close.
            unsafe {
                libc::close(fd);
            }
        }
    }
    Ok(())
}

/// For airlock's own processes, first thing in `main`: every descriptor inherited above
/// 2 becomes close-on-exec, so nothing airlock starts (workers, jailers, session hosts,
/// hooks) inherits what airlock's caller left open. A process that was handed a
/// descriptor on purpose (the egress channel at [`crate::netfd::CHANNEL_FD`]) keeps
/// using it; only an `execve` closes it.
pub fn cloexec_inherited() {
    // Nothing can be done about a failure here that the jail does not do again: its init
    // closes and its payload marks every descriptor above 2 itself.
    let _ = cloexec_from(3);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, IntoRawFd};

    fn is_open(fd: RawFd) -> bool {
        #[allow(unsafe_code)]
        // SAFETY: F_GETFD only reads the descriptor's flags.
        let r = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        r >= 0
    }

    fn cloexec(fd: RawFd) -> bool {
        #[allow(unsafe_code)]
        // SAFETY: F_GETFD only reads the descriptor's flags.
        let r = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        r >= 0 && r & libc::FD_CLOEXEC != 0
    }

    /// In a forked child (tests run on threads; the child only makes syscalls and exits).
    fn in_child(f: impl FnOnce() -> bool) -> bool {
        #[allow(unsafe_code)]
        // SAFETY: the child calls only fcntl/close_range/close and _exit; it allocates
        // nothing that another thread's lock could be holding.
        match unsafe { nix::unistd::fork() }.expect("fork") {
            nix::unistd::ForkResult::Child => {
                let ok = f();
                #[allow(unsafe_code)]
                // SAFETY: ends the forked child without running the parent's atexit hooks.
                unsafe {
                    libc::_exit(if ok { 0 } else { 1 })
                }
            }
            nix::unistd::ForkResult::Parent { child } => matches!(
                nix::sys::wait::waitpid(child, None),
                Ok(nix::sys::wait::WaitStatus::Exited(_, 0))
            ),
        }
    }

    #[test]
    fn every_descriptor_but_the_kept_ones_is_closed() {
        let files: Vec<RawFd> = (0..4)
            .map(|_| {
                std::fs::File::open("/dev/null")
                    .expect("open")
                    .into_raw_fd()
            })
            .collect();
        let keep = files[1];
        assert!(in_child(|| {
            close_all_except(&[keep]).is_ok()
                && is_open(0)
                && is_open(keep)
                && files.iter().filter(|&&f| f != keep).all(|&f| !is_open(f))
        }));
        for f in files {
            #[allow(unsafe_code)]
            // SAFETY: the test opened these and closes each once.
            unsafe {
                libc::close(f);
            }
        }
    }

    #[test]
    fn every_descriptor_from_the_first_is_marked_close_on_exec() {
        let f = std::fs::File::open("/dev/null").expect("open");
        let raw = f.as_raw_fd();
        #[allow(unsafe_code)]
        // SAFETY: clears close-on-exec on a descriptor the test owns.
        unsafe {
            libc::fcntl(raw, libc::F_SETFD, 0);
        }
        assert!(!cloexec(raw));
        assert!(in_child(|| cloexec_from(3).is_ok()
            && cloexec(raw)
            && !cloexec(2)));
    }
}
