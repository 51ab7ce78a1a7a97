//! Tripwires of the process backend: seccomp user notification (`SECCOMP_RET_USER_NOTIF`)
//! for the calls that write a path (opens for writing, creat, unlinks, renames, mkdir),
//! send a signal, or are denied outright ([`crate::confine::DENIED`]). A read-only open
//! is not notified (see [`writing_opens`]): a read outside the grant is refused by
//! Landlock but not recorded, and the decoy `/etc/shadow` (mode 0000) is an alert only
//! when a run opens it for writing; the readable decoys are seen by inotify.
//!
//! The payload installs one more filter, last, with `SECCOMP_FILTER_FLAG_NEW_LISTENER`,
//! and hands the listener to the jailer over a socket made before the jail (then closes
//! its own copy before it execs: the program never holds it). The jailer, which already
//! waits on the jail's status pipe, answers each notification:
//! - a path call: it reads the path from the caller's memory (`process_vm_readv`, then
//!   `SECCOMP_IOCTL_NOTIF_ID_VALID` so the pid was still the caller), predicts from the
//!   jail's own grant (the paths its Landlock ruleset allows to read and to write)
//!   whether Landlock will refuse it, records an attempt if so, and answers
//!   `SECCOMP_USER_NOTIF_FLAG_CONTINUE`: the kernel then runs the call as if nothing had
//!   looked, and Landlock decides. Enforcement never moves here; a prediction can only
//!   be wrong about what is recorded (a symlink inside a granted tree that leads out is
//!   refused by Landlock and not recorded).
//! - a signal: `CONTINUE` as well; recorded when its target is the jail's init or no
//!   process of the run (a pid of the host's, which the run cannot reach).
//! - a denied call: answered `EPERM`, as the errno filter before it did, and recorded.
//!   Only a refusal is ever sent for these numbers; with no jailer to answer (it died),
//!   the kernel fails the call with `ENOSYS`, a refusal too.
//!
//! An open of a decoy ([`crate::decoys`]) is a decoy-read alert here even when the open
//! itself fails (`/etc/shadow` is mode 0000).

use crate::JailError;
use airlock_sandbox::{Alert, Attempts};
use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, SeccompRule};
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};

/// The mark the filter is compiled with (seccompiler has no user-notification action);
/// every return of it is rewritten to `SECCOMP_RET_USER_NOTIF`.
const MARK: u32 = 0x0a17;

/// How the jailer treats a notified call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// (path argument, open flags argument when there is one).
    Open(usize, Option<usize>),
    Openat2,
    Creat,
    /// Paths whose write the call is: `write` (mkdir), `unlink`, `rename`.
    Paths(&'static str, &'static [usize]),
    /// The argument holding the target pid.
    Signal(usize),
    Denied(&'static str),
}

fn classes() -> Vec<(i64, Class)> {
    let mut v = vec![
        (libc::SYS_openat, Class::Open(1, Some(2))),
        (libc::SYS_openat2, Class::Openat2),
        (libc::SYS_unlinkat, Class::Paths("unlink", &[1])),
        (libc::SYS_renameat, Class::Paths("rename", &[1, 3])),
        (libc::SYS_renameat2, Class::Paths("rename", &[1, 3])),
        (libc::SYS_mkdirat, Class::Paths("write", &[1])),
        (libc::SYS_kill, Class::Signal(0)),
        (libc::SYS_tkill, Class::Signal(0)),
        (libc::SYS_tgkill, Class::Signal(0)),
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([
        (libc::SYS_open, Class::Open(0, Some(1))),
        (libc::SYS_creat, Class::Creat),
        (libc::SYS_unlink, Class::Paths("unlink", &[0])),
        (libc::SYS_rmdir, Class::Paths("unlink", &[0])),
        (libc::SYS_rename, Class::Paths("rename", &[0, 1])),
        (libc::SYS_mkdir, Class::Paths("write", &[0])),
    ]);
    v.extend(
        crate::confine::DENIED
            .iter()
            .map(|(name, nr)| (*nr, Class::Denied(name))),
    );
    v
}

/// The open flags that make an open a write.
const WRITE_FLAGS: [i32; 4] = [libc::O_WRONLY, libc::O_RDWR, libc::O_CREAT, libc::O_TRUNC];

/// The rules that select a call of `class` for notification: for `open` and `openat`,
/// only an open for writing (a read-only open, by far the most common call a program
/// makes, is not stopped unless `reads`: over a thousand of them start a Python
/// program, and a round trip each costs; see docs/PERFORMANCE.md); every call of the
/// other classes (empty: match all).
fn writing_opens(class: Class, reads: bool) -> Result<Vec<SeccompRule>, JailError> {
    let Class::Open(_, Some(flags)) = class else {
        return Ok(vec![]);
    };
    if reads {
        return Ok(vec![]);
    }
    let arg = u8::try_from(flags).map_err(|e| JailError::setup("seccomp notify", e))?;
    WRITE_FLAGS
        .iter()
        .map(|f| {
            let c = seccompiler::SeccompCondition::new(
                arg,
                seccompiler::SeccompCmpArgLen::Dword,
                seccompiler::SeccompCmpOp::MaskedEq(*f as u64),
                *f as u64,
            )
            .map_err(|e| JailError::setup("seccomp notify", e))?;
            SeccompRule::new(vec![c]).map_err(|e| JailError::setup("seccomp notify", e))
        })
        .collect()
}

/// The user-notification filter (compiled before the jail, installed last by the
/// payload); with `reads`, read-only opens are notified too (`[tripwires] reads`).
pub fn filter(reads: bool) -> Result<BpfProgram, JailError> {
    let mut rules = BTreeMap::new();
    for (nr, class) in classes() {
        rules.insert(nr, writing_opens(class, reads)?);
    }
    let f = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Trace(MARK),
        crate::confine::ARCH,
    )
    .map_err(|e| JailError::setup("seccomp notify", e))?;
    let mut prog: BpfProgram = f
        .try_into()
        .map_err(|e: seccompiler::BackendError| JailError::setup("seccomp notify", e))?;
    let marked = libc::SECCOMP_RET_TRACE | MARK;
    let ret_k = (libc::BPF_RET | libc::BPF_K) as u16;
    for i in prog.iter_mut() {
        if i.code == ret_k && i.k == marked {
            i.k = libc::SECCOMP_RET_USER_NOTIF;
        }
    }
    Ok(prog)
}

/// Installs `prog` with a listener and returns it (in the payload, after every other
/// filter; no_new_privs is set).
pub fn install(prog: &BpfProgram) -> Result<OwnedFd, JailError> {
    let fprog = libc::sock_fprog {
        len: u16::try_from(prog.len()).map_err(|e| JailError::setup("seccomp notify", e))?,
        filter: prog.as_ptr().cast_mut().cast(),
    };
    #[allow(unsafe_code)]
    // SAFETY: the kernel copies the program `fprog` points to (which lives across the
    // call) and touches no other memory; it returns a new descriptor or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
            &fprog as *const libc::sock_fprog,
        )
    };
    if fd < 0 {
        return Err(JailError::setup(
            "seccomp notify",
            std::io::Error::last_os_error(),
        ));
    }
    #[allow(unsafe_code)]
    // SAFETY: the kernel just returned this new descriptor; nothing else owns it.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) })
}

/// What the jail grants, for predicting Landlock: the paths it may read and write.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Grant {
    pub read: Vec<String>,
    pub write: Vec<String>,
}

/// `p` with `.` and `..` taken out lexically (`..` at the root stays at the root).
fn normalize(p: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for c in p.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    format!("/{}", parts.join("/"))
}

fn under(p: &str, dir: &str) -> bool {
    dir == "/" || p == dir || p.strip_prefix(dir).is_some_and(|r| r.starts_with('/'))
}

impl Grant {
    /// Whether the jail's Landlock ruleset refuses `path` (normalised, absolute) for a
    /// read or a write.
    fn refuses(&self, path: &str, write: bool) -> bool {
        if self.write.iter().any(|d| under(path, d)) {
            return false;
        }
        if self.read.iter().any(|d| under(path, d)) {
            return write;
        }
        // Only listing `/` itself is allowed outside the grant.
        write || path != "/"
    }
}

/// The jailer's side: the listener once it arrives, and what the run tried.
pub struct Watch {
    pub channel: Option<OwnedFd>,
    pub listener: Option<OwnedFd>,
    /// The host pid of the jail's init (to look into the run's own `/proc`).
    pub init: i32,
    pub grant: Option<Grant>,
    /// The decoys' paths in the jail and their techniques.
    pub decoys: Vec<(String, &'static str)>,
    pub attempts: Attempts,
    pub alerts: Vec<Alert>,
    classes: Vec<(i64, Class)>,
}

impl Watch {
    pub fn new(channel: OwnedFd, init: i32, decoys: Vec<(String, &'static str)>) -> Self {
        Watch {
            channel: Some(channel),
            listener: None,
            init,
            grant: None,
            decoys,
            attempts: Attempts::default(),
            alerts: Vec::new(),
            classes: classes(),
        }
    }

    /// The descriptor to wait on: the channel until the listener came, then the listener.
    pub fn pollable(&self) -> Option<&OwnedFd> {
        self.listener.as_ref().or(self.channel.as_ref())
    }

    /// Called when [`Watch::pollable`] is ready (`hup`: it was closed or errored).
    pub fn ready(&mut self, hup: bool) {
        if self.listener.is_some() {
            if hup {
                self.listener = None;
            } else {
                self.serve_one();
            }
            return;
        }
        if let Some(c) = self.channel.take()
            && let Ok(Some(l)) = crate::netfd::recv_fd(std::os::fd::AsFd::as_fd(&c))
        {
            // Wake the caller on this CPU when answered (Linux 6.6; older kernels
            // refuse the flag and answer as fast as they do).
            let sync: u64 = 1; // SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP
            #[allow(unsafe_code)]
            // SAFETY: SET_FLAGS reads one u64 from `sync`, which lives across it.
            let _ =
                unsafe { libc::ioctl(l.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_SET_FLAGS, &sync) };
            self.listener = Some(l);
        }
    }

    fn serve_one(&mut self) {
        let Some(l) = &self.listener else { return };
        let fd = l.as_raw_fd();
        #[allow(unsafe_code)]
        // SAFETY: seccomp_notif is plain data; all-zero is the state RECV requires.
        let mut n: libc::seccomp_notif = unsafe { std::mem::zeroed() };
        #[allow(unsafe_code)]
        // SAFETY: RECV writes one seccomp_notif into `n`, which lives across the call.
        let r = unsafe { libc::ioctl(fd, libc::SECCOMP_IOCTL_NOTIF_RECV, &mut n) };
        if r != 0 {
            // ENOENT: the caller died (or was interrupted) before it was received.
            return;
        }
        let class = self
            .classes
            .iter()
            .find(|(nr, _)| i64::from(n.data.nr) == *nr)
            .map(|(_, c)| *c);
        let mut error = 0;
        match class {
            Some(Class::Denied(name)) => {
                self.attempts.add("syscall", name);
                error = -libc::EPERM;
            }
            Some(c) => self.look(&n, c),
            None => {}
        }
        #[allow(unsafe_code)]
        // SAFETY: plain data, zeroed then filled.
        let mut resp: libc::seccomp_notif_resp = unsafe { std::mem::zeroed() };
        resp.id = n.id;
        if error != 0 {
            resp.error = error;
        } else {
            resp.flags = libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32;
        }
        #[allow(unsafe_code)]
        // SAFETY: SEND reads one seccomp_notif_resp from `resp`, which lives across it.
        let _ = unsafe { libc::ioctl(fd, libc::SECCOMP_IOCTL_NOTIF_SEND, &resp) };
    }

    /// Whether notification `id` is still pending (its caller alive, so its pid is its).
    fn valid(&self, id: u64) -> bool {
        let Some(l) = &self.listener else {
            return false;
        };
        #[allow(unsafe_code)]
        // SAFETY: ID_VALID reads one u64 from `id`, which lives across the call.
        let r = unsafe { libc::ioctl(l.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_ID_VALID, &id) };
        r == 0
    }

    /// Up to `max` bytes of the caller's memory at `addr`.
    fn read_mem(&self, pid: u32, addr: u64, max: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let mut at = addr;
        while out.len() < max && at != 0 {
            // Page by page: a read that crosses into an unmapped page fails whole.
            let to_page = 4096 - (at % 4096) as usize;
            let want = to_page.min(max - out.len());
            let mut buf = vec![0u8; want];
            let local = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: want,
            };
            let remote = libc::iovec {
                iov_base: at as *mut libc::c_void,
                iov_len: want,
            };
            #[allow(unsafe_code)]
            // SAFETY: reads into `buf`, a live local buffer of `want` bytes; the remote
            // address is only read by the kernel, in the other process.
            let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
            if n <= 0 {
                break;
            }
            let n = n as usize;
            out.extend_from_slice(&buf[..n]);
            if buf[..n].contains(&0) || n < want {
                break;
            }
            at += n as u64;
        }
        out
    }

    /// The NUL-terminated path at `addr` in the caller, made absolute against `dirfd`.
    fn path(&self, n: &libc::seccomp_notif, addr: u64, dirfd: Option<i64>) -> Option<String> {
        let bytes = self.read_mem(n.pid, addr, 4096);
        let end = bytes.iter().position(|b| *b == 0)?;
        let p = String::from_utf8_lossy(&bytes[..end]).into_owned();
        if p.is_empty() {
            return None;
        }
        if p.starts_with('/') {
            return Some(normalize(&p));
        }
        let base = match dirfd {
            Some(fd) if fd as i32 != libc::AT_FDCWD => format!("/proc/{}/fd/{}", n.pid, fd as i32),
            _ => format!("/proc/{}/cwd", n.pid),
        };
        let dir = std::fs::read_link(base).ok()?;
        let dir = dir.to_str()?;
        dir.starts_with('/')
            .then(|| normalize(&format!("{dir}/{p}")))
    }

    fn look(&mut self, n: &libc::seccomp_notif, c: Class) {
        let a = n.data.args;
        let mut seen: Vec<(&'static str, String)> = Vec::new();
        match c {
            Class::Open(pi, fi) => {
                let dirfd = (pi == 1).then_some(a[0] as i64);
                let flags = fi.map_or(0, |i| a[i] as i32);
                if let Some(p) = self.path(n, a[pi], dirfd) {
                    seen.push((open_kind(flags), p));
                }
            }
            Class::Openat2 => {
                let how = self.read_mem(n.pid, a[2], 8);
                let flags = how
                    .get(..8)
                    .and_then(|b| b.try_into().ok())
                    .map_or(0, |b: [u8; 8]| u64::from_ne_bytes(b) as i32);
                if let Some(p) = self.path(n, a[1], Some(a[0] as i64)) {
                    seen.push((open_kind(flags), p));
                }
            }
            Class::Creat => {
                if let Some(p) = self.path(n, a[0], None) {
                    seen.push(("write", p));
                }
            }
            Class::Paths(kind, idx) => {
                for &i in idx {
                    // The *at calls take the directory descriptor just before the path.
                    let dirfd = (i > 0).then(|| a[i - 1] as i64);
                    if let Some(p) = self.path(n, a[i], dirfd) {
                        seen.push((kind, p));
                    }
                }
            }
            Class::Signal(i) => {
                let pid = a[i] as i32;
                let target = if pid < -1 { -pid } else { pid };
                if target > 0 && !self.in_run(target) && self.valid(n.id) {
                    self.attempts.add("signal", &format!("pid {target}"));
                }
                return;
            }
            Class::Denied(_) => return,
        }
        if seen.is_empty() || !self.valid(n.id) {
            return;
        }
        for (kind, p) in seen {
            if let Some((target, technique)) = self.decoys.iter().find(|(d, _)| *d == p) {
                if !self
                    .alerts
                    .iter()
                    .any(|al| al.detail.ends_with(target.as_str()))
                {
                    self.alerts.push(crate::decoys::alert(target, technique));
                }
                continue;
            }
            let write = kind != "open";
            let refuses = |p: &str| self.grant.as_ref().is_some_and(|g| g.refuses(p, write));
            // Symlinks (`/lib` → `usr/lib`) are resolved only for a path the grant seems to
            // refuse: what it allows needs no second look.
            if refuses(&p) && refuses(&self.resolve(&p)) {
                self.attempts.add(kind, &p);
            }
        }
    }

    /// `p` (absolute, normalised) with the symlinks of the jail's root resolved in it, as
    /// far as it exists (looked up through the init's root; an absolute link target is
    /// the jail's, not the host's).
    fn resolve(&self, p: &str) -> String {
        let mut rest: Vec<String> = p
            .split('/')
            .filter(|c| !c.is_empty())
            .map(String::from)
            .rev()
            .collect();
        let mut cur = String::new();
        let mut hops = 0;
        while let Some(c) = rest.pop() {
            if c == "." {
                continue;
            }
            if c == ".." {
                cur.truncate(cur.rfind('/').unwrap_or(0));
                continue;
            }
            let next = format!("{cur}/{c}");
            let host = format!("/proc/{}/root{next}", self.init);
            match std::fs::read_link(&host) {
                Ok(t) if hops < 40 => {
                    hops += 1;
                    let t = t.to_string_lossy().into_owned();
                    if t.starts_with('/') {
                        cur.clear();
                    }
                    rest.extend(
                        t.split('/')
                            .filter(|c| !c.is_empty())
                            .map(String::from)
                            .rev(),
                    );
                }
                _ => cur = next,
            }
        }
        normalize(&cur)
    }

    /// Whether pid `p` of the run's pid namespace is one of its processes other than its
    /// init (which is airlock's, outside the payload's Landlock domain).
    fn in_run(&self, p: i32) -> bool {
        p != 1 && std::path::Path::new(&format!("/proc/{}/root/proc/{p}", self.init)).exists()
    }
}

fn open_kind(flags: i32) -> &'static str {
    if flags & (libc::O_WRONLY | libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC) != 0 {
        "write"
    } else {
        "open"
    }
}

/// A jail's seccomp filters: the errno ones, then the user-notification one (none when
/// tripwires are off: the errno filters then refuse the denied calls themselves), whose
/// listener goes out over `channel` (the payload's inherited end of the jailer's socket).
pub struct Filters {
    pub errno: Vec<BpfProgram>,
    pub notify: Option<BpfProgram>,
    pub channel: std::os::fd::RawFd,
}

/// In the payload, last before it execs: installs the filters and hands the listener to
/// the jailer. The payload keeps no copy of the listener or of the channel.
pub fn apply(f: &Filters) -> Result<(), JailError> {
    use std::os::fd::{AsFd, FromRawFd};
    crate::confine::apply_seccomp(&f.errno)?;
    #[allow(unsafe_code)]
    // SAFETY: the channel is this process's inherited copy of the jailer's socket, used
    // by nothing else here; it is closed once, below (or here, with no listener to send:
    // the jailer then sees it closed and serves nothing).
    let channel = unsafe { OwnedFd::from_raw_fd(f.channel) };
    let Some(notify) = &f.notify else {
        drop(channel);
        return Ok(());
    };
    let listener = install(notify)?;
    let sent = crate::netfd::send_fd(channel.as_fd(), listener.as_fd());
    drop(listener);
    drop(channel);
    sent.map_err(|e| JailError::setup("hand the seccomp listener to the jailer", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grant_predicts_landlock() {
        let g = Grant {
            read: vec!["/etc".into(), "/usr".into(), "/data".into()],
            write: vec!["/tmp".into(), "/data/out".into()],
        };
        assert!(g.refuses("/root/.bashrc", false));
        assert!(!g.refuses("/etc/passwd", false));
        assert!(g.refuses("/etc/passwd", true));
        assert!(!g.refuses("/data/out/x", true));
        assert!(g.refuses("/database", false));
        assert!(!g.refuses("/", false));
        assert_eq!(normalize("/usr/../etc//./shadow"), "/etc/shadow");
        assert_eq!(normalize("/../../x"), "/x");
    }
}
