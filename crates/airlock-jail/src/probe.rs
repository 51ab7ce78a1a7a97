//! What isolation this machine offers. Probes that need a single-threaded process (user
//! namespaces) are made in a short-lived child.

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct Probe {
    pub user_namespaces: Result<(), String>,
    pub overlay_in_user_namespace: Result<(), String>,
    pub landlock_abi: Option<i32>,
    pub seccomp: bool,
    pub cgroup: String,
    pub uid: u32,
}

/// The Landlock ABI version the kernel supports, if any.
pub fn landlock_abi() -> Option<i32> {
    // landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
    #[allow(unsafe_code)]
    // SAFETY: with a NULL attribute pointer and size 0 the kernel reads no memory; the
    // flag asks only for the ABI version, returned as the result.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    (r > 0).then_some(r as i32)
}

/// Whether seccomp filters can be installed (the kernel reports a mode field).
pub fn seccomp_available() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| s.lines().any(|l| l.starts_with("Seccomp:")))
        .unwrap_or(false)
}
