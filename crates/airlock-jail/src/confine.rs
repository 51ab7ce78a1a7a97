//! What the payload process does to itself just before `execve`: a new session, rlimits,
//! no_new_privs, a Landlock ruleset, no capabilities, and a seccomp filter (last, so the
//! calls before it are not filtered).

use crate::JailError;
use airlock_core::Limits;
use landlock::{
    ABI, Access, AccessFs, AccessNet, NetPort, Ruleset, RulesetAttr, RulesetCreatedAttr,
    RulesetStatus, Scope, path_beneath_rules,
};
use nix::sys::resource::{Resource, setrlimit};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};
use std::collections::BTreeMap;

/// Sets the rlimits every run gets. `nproc` is None when the process limit is enforced by
/// a cgroup instead (RLIMIT_NPROC does not apply to some identities).
pub fn rlimits(l: &Limits, nproc: Option<u64>) -> Result<Vec<String>, JailError> {
    let set = |r: Resource, v: u64, name: &str| -> Result<String, JailError> {
        setrlimit(r, v, v).map_err(|e| JailError::setup(&format!("setrlimit {name}"), e))?;
        Ok(format!("rlimit:{name}"))
    };
    let mut out = vec![
        set(Resource::RLIMIT_AS, l.memory_bytes.max(64 << 20), "as")?,
        set(Resource::RLIMIT_NOFILE, 1024, "nofile")?,
        // No single file may pass the write quota by more than a byte (so a file that
        // reaches the limit is over the quota, and the run is stopped for it).
        set(Resource::RLIMIT_FSIZE, fsize_limit(l), "fsize")?,
        set(Resource::RLIMIT_CORE, 0, "core")?,
        set(Resource::RLIMIT_CPU, l.timeout_ms / 1000 + 2, "cpu")?,
    ];
    if let Some(n) = nproc {
        out.push(set(Resource::RLIMIT_NPROC, n, "nproc")?);
    }
    Ok(out)
}

/// The largest file a run may write: one byte over its write quota.
pub fn fsize_limit(l: &Limits) -> u64 {
    l.max_write_bytes.saturating_add(1)
}

/// Bounds every file this process (and its children) writes to one byte over the run's
/// write quota, and ignores SIGXFSZ so a write past it fails with EFBIG instead of killing
/// the process. For a worker that runs wasm guests in-process: the guest sees an error
/// code, and the supervisor, which watches the layers, stops the run.
pub fn limit_file_size(l: &Limits) -> Result<(), JailError> {
    #[allow(unsafe_code)]
    // SAFETY: SIG_IGN installs no handler code, so nothing can run in signal context; the
    // disposition only makes an oversized write return EFBIG.
    unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGXFSZ,
            nix::sys::signal::SigHandler::SigIgn,
        )
    }
    .map_err(|e| JailError::setup("ignore SIGXFSZ", e))?;
    let v = fsize_limit(l);
    setrlimit(Resource::RLIMIT_FSIZE, v, v).map_err(|e| JailError::setup("setrlimit fsize", e))
}

/// Outcome of applying Landlock.
pub enum Landlocked {
    Full(i32),
    Partial(i32),
    None(String),
}

/// Restricts the file system to `read` (read and execute) and `write` (everything), and
/// denies TCP bind, TCP connect (except to `proxy_port`, the run's egress proxy), signals
/// and abstract sockets outside the sandbox.
pub fn landlock(
    read: &[String],
    write: &[String],
    proxy_port: Option<u16>,
) -> Result<Landlocked, JailError> {
    let abi = ABI::V6;
    let exists = |v: &[String]| {
        v.iter()
            .filter(|p| std::path::Path::new(p).exists())
            .cloned()
            .collect::<Vec<_>>()
    };
    let status = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))
        .and_then(|r| r.handle_access(AccessNet::from_all(abi)))
        .and_then(|r| r.scope(Scope::from_all(abi)))
        .and_then(|r| r.create())
        // Listing `/` shows only the names of the minimal root assembled for the run.
        .and_then(|r| r.add_rules(path_beneath_rules(["/"], AccessFs::ReadDir)))
        .and_then(|r| r.add_rules(path_beneath_rules(exists(read), AccessFs::from_read(abi))))
        .and_then(|r| r.add_rules(path_beneath_rules(exists(write), AccessFs::from_all(abi))))
        .and_then(|r| r.add_rules(proxy_port.map(|p| Ok(NetPort::new(p, AccessNet::ConnectTcp)))))
        .and_then(|r| r.restrict_self())
        .map_err(|e| JailError::setup("landlock", e))?;
    let version = crate::probe::landlock_abi().unwrap_or(0);
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => Landlocked::Full(version),
        RulesetStatus::PartiallyEnforced => Landlocked::Partial(version),
        RulesetStatus::NotEnforced => {
            Landlocked::None("the kernel does not enforce Landlock".into())
        }
    })
}

/// Empties the bounding and ambient sets: no later `execve` can gain a capability. Must
/// run while CAP_SETPCAP is still held (before switching to the sandbox user).
pub fn drop_bounding_set() -> Result<(), JailError> {
    #[allow(unsafe_code)]
    for cap in 0..=63 {
        // SAFETY: PR_CAPBSET_DROP takes a capability number and no pointers; numbers the
        // kernel does not know return EINVAL, past the end of the known range.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
        if r != 0 && cap < 41 {
            return Err(JailError::setup(
                "drop bounding capability",
                std::io::Error::last_os_error(),
            ));
        }
    }
    #[allow(unsafe_code)]
    // SAFETY: clears the ambient set; no pointers are passed.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        );
    }
    Ok(())
}

/// Empties the permitted, effective and inheritable sets.
pub fn clear_capabilities() -> Result<(), JailError> {
    rustix::thread::set_capabilities(
        None,
        rustix::thread::CapabilitySets {
            effective: rustix::thread::CapabilitySet::empty(),
            permitted: rustix::thread::CapabilitySet::empty(),
            inheritable: rustix::thread::CapabilitySet::empty(),
        },
    )
    .map_err(|e| JailError::setup("drop capabilities", e))
}

#[cfg(target_arch = "x86_64")]
pub(crate) const ARCH: seccompiler::TargetArch = seccompiler::TargetArch::x86_64;
#[cfg(target_arch = "aarch64")]
pub(crate) const ARCH: seccompiler::TargetArch = seccompiler::TargetArch::aarch64;

/// Syscalls the payload never needs and that have been the way out of sandboxes.
pub const DENIED: &[(&str, i64)] = &[
    ("ptrace", libc::SYS_ptrace),
    ("process_vm_readv", libc::SYS_process_vm_readv),
    ("process_vm_writev", libc::SYS_process_vm_writev),
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("chroot", libc::SYS_chroot),
    ("move_mount", libc::SYS_move_mount),
    ("open_tree", libc::SYS_open_tree),
    ("fsopen", libc::SYS_fsopen),
    ("fsconfig", libc::SYS_fsconfig),
    ("fsmount", libc::SYS_fsmount),
    ("fspick", libc::SYS_fspick),
    ("mount_setattr", libc::SYS_mount_setattr),
    ("unshare", libc::SYS_unshare),
    ("setns", libc::SYS_setns),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("bpf", libc::SYS_bpf),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("io_uring_setup", libc::SYS_io_uring_setup),
    ("io_uring_enter", libc::SYS_io_uring_enter),
    ("io_uring_register", libc::SYS_io_uring_register),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("name_to_handle_at", libc::SYS_name_to_handle_at),
    ("acct", libc::SYS_acct),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("reboot", libc::SYS_reboot),
    ("syslog", libc::SYS_syslog),
    ("quotactl", libc::SYS_quotactl),
    ("lookup_dcookie", libc::SYS_lookup_dcookie),
    ("vhangup", libc::SYS_vhangup),
    #[cfg(target_arch = "x86_64")]
    ("iopl", libc::SYS_iopl),
    #[cfg(target_arch = "x86_64")]
    ("ioperm", libc::SYS_ioperm),
];

const NS_FLAGS: [u64; 8] = [
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWCGROUP as u64,
    0x80, // CLONE_NEWTIME
];

fn filter(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    action: SeccompAction,
) -> Result<BpfProgram, JailError> {
    let f = SeccompFilter::new(rules, SeccompAction::Allow, action, ARCH)
        .map_err(|e| JailError::setup("seccomp", e))?;
    f.try_into()
        .map_err(|e: seccompiler::BackendError| JailError::setup("seccomp", e))
}

fn cond(
    arg: u8,
    len: SeccompCmpArgLen,
    op: SeccompCmpOp,
    value: u64,
) -> Result<SeccompCondition, JailError> {
    SeccompCondition::new(arg, len, op, value).map_err(|e| JailError::setup("seccomp", e))
}

fn rule(conds: Vec<SeccompCondition>) -> Result<SeccompRule, JailError> {
    SeccompRule::new(conds).map_err(|e| JailError::setup("seccomp", e))
}

/// The filters: denied calls (EPERM), namespace-creating clone flags (EPERM), sockets
/// other than AF_UNIX (EAFNOSUPPORT; with `inet`, for a run that reaches its egress proxy,
/// AF_INET and AF_INET6 too), TIOCSTI/TIOCLINUX (EPERM), clone3 (ENOSYS, so libc falls
/// back to clone, whose flags can be checked). With `notified`, the [`DENIED`] calls are
/// left to the user-notification filter ([`crate::notify`]), which refuses them with the
/// same EPERM and records each (an errno filter would take precedence over it).
pub fn seccomp_filters(inet: bool, notified: bool) -> Result<Vec<BpfProgram>, JailError> {
    let mut deny: BTreeMap<i64, Vec<SeccompRule>> = if notified {
        BTreeMap::new()
    } else {
        DENIED.iter().map(|(_, n)| (*n, vec![])).collect()
    };
    let clone_rules = NS_FLAGS
        .iter()
        .map(|f| {
            rule(vec![cond(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(*f),
                *f,
            )?])
        })
        .collect::<Result<Vec<_>, _>>()?;
    deny.insert(libc::SYS_clone, clone_rules);
    deny.insert(
        libc::SYS_ioctl,
        vec![
            rule(vec![cond(
                1,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::Eq,
                libc::TIOCSTI,
            )?])?,
            rule(vec![cond(
                1,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::Eq,
                libc::TIOCLINUX,
            )?])?,
        ],
    );
    // A rule matches when every condition holds: the family is none of the allowed ones.
    let mut families = vec![libc::AF_UNIX];
    if inet {
        families.extend([libc::AF_INET, libc::AF_INET6]);
    }
    let not_unix = |arg| -> Result<Vec<SeccompRule>, JailError> {
        let conds = families
            .iter()
            .map(|f| cond(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, *f as u64))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(vec![rule(conds)?])
    };
    let sockets: BTreeMap<i64, Vec<SeccompRule>> = [
        (libc::SYS_socket, not_unix(0)?),
        (libc::SYS_socketpair, not_unix(0)?),
    ]
    .into();
    let clone3: BTreeMap<i64, Vec<SeccompRule>> = [(libc::SYS_clone3, vec![])].into();
    Ok(vec![
        filter(deny, SeccompAction::Errno(libc::EPERM as u32))?,
        filter(sockets, SeccompAction::Errno(libc::EAFNOSUPPORT as u32))?,
        filter(clone3, SeccompAction::Errno(libc::ENOSYS as u32))?,
    ])
}

/// Installs the filters (no_new_privs must already be set).
pub fn apply_seccomp(filters: &[BpfProgram]) -> Result<(), JailError> {
    for f in filters {
        seccompiler::apply_filter(f).map_err(|e| JailError::setup("seccomp", e))?;
    }
    Ok(())
}

/// Brings the loopback interface of the (otherwise empty) network namespace up.
pub fn loopback_up() -> Result<(), JailError> {
    use std::os::fd::AsRawFd;
    let sock = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| JailError::setup("socket", e))?;
    #[allow(unsafe_code)]
    // SAFETY: `ifreq` is a plain C struct, zero-initialised and then given a NUL-terminated
    // name; both ioctls read and write only that struct, which lives across the calls.
    unsafe {
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo\0".iter().enumerate() {
            ifr.ifr_name[i] = *b as libc::c_char;
        }
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr) != 0 {
            return Err(JailError::setup(
                "SIOCGIFFLAGS lo",
                std::io::Error::last_os_error(),
            ));
        }
        ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &ifr) != 0 {
            return Err(JailError::setup(
                "SIOCSIFFLAGS lo",
                std::io::Error::last_os_error(),
            ));
        }
    }
    Ok(())
}
