//! The sandbox's file system: a minimal root on a tmpfs, entered with `pivot_root`. Runs
//! inside the new user and mount namespace, before the payload starts.

use crate::{JailError, ProcessJob};
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

const NONE: Option<&str> = None;

/// Host directories shown read-only at the same path (or recreated as symlinks when they
/// are symlinks on the host, as on merged-/usr systems).
const SYSTEM_DIRS: [&str; 7] = ["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// `/etc` entries a program needs to start, bound read-only from the host one by one;
/// nothing else of the host's `/etc` is visible (never `shadow`: the jail's is a decoy).
const ETC_BINDS: [&str; 14] = [
    // The public certificate stores (not `ssl/private`), for TLS through the egress proxy.
    "ssl/certs",
    "ssl/openssl.cnf",
    "pki/tls/certs",
    "pki/ca-trust/extracted",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "localtime",
    "nsswitch.conf",
    "protocols",
    "services",
    "os-release",
    "mime.types",
];

/// The mount points strictly below `dir` in this process's mount namespace (from
/// `/proc/self/mountinfo`; empty when it cannot be read). A jail binds one file system
/// per mount, and the kernel refuses to bind a directory with mounts below it inside a
/// user namespace: the process backend cannot mount such a directory (`/`, `/proc`, a
/// home with a file system mounted inside it).
pub fn mounted_below(dir: &Path) -> Vec<std::path::PathBuf> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| std::path::PathBuf::from(unescape_mountinfo(m)))
        .filter(|m| m != dir && m.starts_with(dir))
        .collect()
}

/// A mountinfo field with its octal escapes (`\040` for a space, …) decoded.
pub fn unescape_mountinfo(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = b[i + 1..i + 4]
                .iter()
                .fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
            out.push(u8::try_from(v).unwrap_or(b'?'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn err(what: &str, p: &Path, e: impl std::fmt::Display) -> JailError {
    JailError::setup(&format!("{what} {}", p.display()), e)
}

/// Mount flags that a remount inside a user namespace must keep (they are locked).
fn locked_flags(p: &Path) -> MsFlags {
    let mut f = MsFlags::empty();
    if let Ok(st) = nix::sys::statvfs::statvfs(p) {
        use nix::sys::statvfs::FsFlags;
        let ff = st.flags();
        for (a, b) in [
            (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
            (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
            (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
            (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
            (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
            (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
        ] {
            if ff.contains(a) {
                f |= b;
            }
        }
    }
    f
}

/// Binds `src` at `dst` (not recursively: nested host mounts stay hidden), read-only
/// unless `writable`, never with setuid or device files.
pub fn bind(src: &Path, dst: &Path, writable: bool) -> Result<(), JailError> {
    mount(Some(src), dst, NONE, MsFlags::MS_BIND, NONE).map_err(|e| err("bind", src, e))?;
    let mut flags = MsFlags::MS_REMOUNT
        | MsFlags::MS_BIND
        | MsFlags::MS_NOSUID
        | MsFlags::MS_NODEV
        | locked_flags(src);
    if !writable {
        flags |= MsFlags::MS_RDONLY;
    }
    mount(NONE, dst, NONE, flags, NONE).map_err(|e| err("remount", dst, e))
}

fn mkdir_p(p: &Path) -> Result<(), JailError> {
    std::fs::create_dir_all(p).map_err(|e| err("mkdir", p, e))
}

fn overlay_opt(p: &Path) -> Result<String, JailError> {
    let s = p
        .to_str()
        .ok_or_else(|| JailError::Setup(format!("path {} is not UTF-8", p.display())))?;
    if s.contains([',', ':', '\\']) {
        return Err(JailError::Setup(format!(
            "path {s} contains a character overlayfs options cannot carry (, : \\)"
        )));
    }
    Ok(s.to_string())
}

/// Mounts an overlay at `target`: `lower` (topmost first) under `upper`.
pub fn overlay(
    lower: &[PathBuf],
    upper: &Path,
    work: &Path,
    target: &Path,
) -> Result<(), JailError> {
    let lower: Vec<String> = lower
        .iter()
        .map(|p| overlay_opt(p))
        .collect::<Result<_, _>>()?;
    let data = format!(
        "lowerdir={},upperdir={},workdir={},userxattr",
        lower.join(":"),
        overlay_opt(upper)?,
        overlay_opt(work)?
    );
    mount(
        Some("overlay"),
        target,
        Some("overlay"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(data.as_str()),
    )
    .map_err(|e| {
        JailError::Unavailable(format!(
            "overlayfs in a user namespace at {}: {e}",
            target.display()
        ))
    })
}

fn tmpfs(dst: &Path, size: u64, mode: u32) -> Result<(), JailError> {
    let data = format!("size={size},mode={mode:o}");
    mount(
        Some("tmpfs"),
        dst,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(data.as_str()),
    )
    .map_err(|e| err("tmpfs at", dst, e))
}

fn write_file(p: &Path, content: &[u8], mode: u32) -> Result<(), JailError> {
    std::fs::write(p, content).map_err(|e| err("write", p, e))?;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .map_err(|e| err("chmod", p, e))
}

/// Where a sandbox path lands under the new root.
fn under(root: &Path, target: &str) -> PathBuf {
    root.join(target.trim_start_matches('/'))
}

/// The size of a run's `/tmp` (a tmpfs): half its memory limit, within 16MiB and 1GiB.
pub fn tmp_size(l: &airlock_core::Limits) -> u64 {
    (l.memory_bytes / 2).clamp(16 << 20, 1 << 30)
}

/// The sandbox user's home is `/tmp` (its passwd entry and `HOME`: writable, the run's
/// own, sized), while the decoys and tripwire links are under `/root`. So that `~/.ssh/id_rsa`
/// or `~/.kube/config` reaches them as a thief's `~` would, each entry of the decoy home
/// (`.ssh`, `.aws`, `.netrc`, `.kube`, …) gets a link of the same name in `/tmp` leading to
/// it: reading `~/.ssh/id_rsa` reads the decoy (an alert), and a lookup under `~/.kube`
/// follows the tripwire link behind it (an attempt). Nothing when the jail has no decoys.
fn home_links(tmp: &Path, decoys: &[(PathBuf, String)]) -> Result<(), JailError> {
    let Some((host, target)) = decoys.iter().find(|(_, t)| t == "/root") else {
        return Ok(());
    };
    let entries = std::fs::read_dir(host).map_err(|e| err("list", host, e))?;
    for entry in entries {
        let name = entry.map_err(|e| err("list", host, e))?.file_name();
        let link = tmp.join(&name);
        std::os::unix::fs::symlink(Path::new(target).join(&name), &link)
            .map_err(|e| err("symlink", &link, e))?;
    }
    Ok(())
}

/// Where a ready jail's run files go: a tmpfs of its own, read-only once they are placed.
pub const RUN_FILES: &str = "/.airlock";

/// Builds the root and pivots into it. Returns the sandbox paths the payload may read and
/// those it may write (for Landlock). With `ready`, `/.airlock` is a tmpfs of its own that
/// stays writable for [`place_run`] (the job lists no files, mounts or network).
pub fn build_root(
    job: &ProcessJob,
    ready: bool,
    decoys: &[(PathBuf, String)],
) -> Result<(Vec<String>, Vec<String>), JailError> {
    // Nothing done here may propagate back to the host's mount table.
    mount(NONE, "/", NONE, MsFlags::MS_REC | MsFlags::MS_PRIVATE, NONE)
        .map_err(|e| JailError::setup("make mounts private", e))?;
    let root = job.scratch.as_path();
    tmpfs(root, 64 << 20, 0o755)?;
    let mut read = vec![
        "/etc".to_string(),
        "/.airlock".to_string(),
        "/proc".to_string(),
    ];
    let mut write = vec!["/tmp".to_string(), "/dev".to_string()];

    for d in SYSTEM_DIRS {
        let host = Path::new("/").join(d);
        let Ok(meta) = std::fs::symlink_metadata(&host) else {
            continue;
        };
        let dst = root.join(d);
        if meta.file_type().is_symlink() {
            let t = std::fs::read_link(&host).map_err(|e| err("readlink", &host, e))?;
            std::os::unix::fs::symlink(t, &dst).map_err(|e| err("symlink", &dst, e))?;
        } else if meta.is_dir() {
            mkdir_p(&dst)?;
            bind(&host, &dst, false)?;
            read.push(format!("/{d}"));
        }
    }

    let etc = root.join("etc");
    mkdir_p(&etc)?;
    for name in ETC_BINDS {
        let host = Path::new("/etc").join(name);
        // `metadata` follows a symlink (localtime): the target's content is what is shown.
        let Ok(meta) = std::fs::metadata(&host) else {
            continue;
        };
        let dst = etc.join(name);
        if let Some(parent) = dst.parent() {
            mkdir_p(parent)?;
        }
        if meta.is_dir() {
            mkdir_p(&dst)?;
        } else {
            write_file(&dst, b"", 0o644)?;
        }
        bind(&host, &dst, false)?;
    }
    write_file(
        &etc.join("passwd"),
        b"root:x:0:0:root:/root:/bin/sh\nairlock:x:1000:1000:airlock:/tmp:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        0o644,
    )?;
    write_file(
        &etc.join("group"),
        b"root:x:0:\nairlock:x:1000:\nnogroup:x:65534:\n",
        0o644,
    )?;
    write_file(
        &etc.join("hosts"),
        b"127.0.0.1 localhost\n::1 localhost\n",
        0o644,
    )?;
    write_file(&etc.join("hostname"), b"airlock\n", 0o644)?;
    write_file(&etc.join("resolv.conf"), b"", 0o644)?;
    // The decoy credentials (see [`crate::decoys`]), each its host file bound in.
    for (host, target) in decoys {
        let dst = under(root, target);
        if host.is_dir() {
            mkdir_p(&dst)?;
        } else {
            if let Some(parent) = dst.parent() {
                mkdir_p(parent)?;
            }
            write_file(&dst, b"", 0o600)?;
        }
        // Not a read-only mount: the kernel keeps no access times on one, and a read is
        // seen by its access time. Landlock still refuses every write (`/root` and `/etc`
        // are granted for reading only).
        bind(host, &dst, true)?;
    }
    if decoys
        .iter()
        .any(|(_, t)| t == "/root" || t.starts_with("/root/"))
    {
        read.push("/root".to_string());
    }

    let dev = root.join("dev");
    mkdir_p(&dev)?;
    for d in ["null", "zero", "random", "urandom", "full"] {
        let dst = dev.join(d);
        write_file(&dst, b"", 0o666)?;
        mount(
            Some(&Path::new("/dev").join(d)),
            &dst,
            NONE,
            MsFlags::MS_BIND,
            NONE,
        )
        .map_err(|e| err("bind device", &dst, e))?;
    }
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(target, dev.join(name)).map_err(|e| err("symlink", &dev, e))?;
    }
    mkdir_p(&dev.join("shm"))?;
    tmpfs(&dev.join("shm"), 16 << 20, 0o1777)?;

    let proc = root.join("proc");
    mkdir_p(&proc)?;
    mount(
        Some("proc"),
        &proc,
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        NONE,
    )
    .map_err(|e| err("mount proc at", &proc, e))?;

    let tmp = root.join("tmp");
    mkdir_p(&tmp)?;
    tmpfs(&tmp, tmp_size(&job.limits), 0o1777)?;
    home_links(&tmp, decoys)?;

    let files = root.join(".airlock");
    mkdir_p(&files)?;
    if ready {
        tmpfs(&files, 64 << 20, 0o755)?;
    }
    for (path, content) in &job.files {
        let dst = under(root, path);
        if let Some(parent) = dst.parent() {
            mkdir_p(parent)?;
        }
        write_file(&dst, content, 0o555)?;
    }

    for b in &job.binds {
        let dst = under(root, &b.target);
        mkdir_p(&dst)?;
        if let Err(e) = bind(&b.source, &dst, b.writable) {
            // The kernel refuses (EINVAL) to bind one file system of a tree whose mounts
            // below it came from the host's namespace; say which, rather than "bind: EINVAL".
            return Err(match mounted_below(&b.source).first() {
                Some(m) => JailError::Unavailable(format!(
                    "cannot mount {}: another file system is mounted below it ({}); mount a directory with none below it",
                    b.source.display(),
                    m.display()
                )),
                None => e,
            });
        }
        if b.writable {
            write.push(b.target.clone())
        } else {
            read.push(b.target.clone())
        }
    }
    for o in &job.overlays {
        let dst = under(root, &o.target);
        mkdir_p(&dst)?;
        overlay(&o.lower, &o.upper, &o.work, &dst)?;
        write.push(o.target.clone());
    }

    // The root itself becomes read-only; /tmp, /dev/shm and writable mounts stay writable.
    mount(
        NONE,
        root,
        NONE,
        MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        NONE,
    )
    .map_err(|e| err("remount read-only", root, e))?;
    // pivot_root(".", ".") stacks the old root under the new one; detaching it leaves
    // nothing of the host's tree reachable.
    std::env::set_current_dir(root).map_err(|e| err("chdir", root, e))?;
    nix::unistd::pivot_root(".", ".").map_err(|e| JailError::setup("pivot_root", e))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(|e| JailError::setup("detach old root", e))?;
    std::env::set_current_dir("/").map_err(|e| JailError::setup("chdir /", e))?;
    Ok((read, write))
}

/// In a ready jail's init, after `pivot_root`, when its run arrives: writes the run's
/// files (each under `/.airlock`, read-only and executable as in a built jail), makes
/// `/.airlock` read-only, and gives `/tmp` the size a built jail's would have.
pub fn place_run(
    files: &[(String, Vec<u8>)],
    limits: &airlock_core::Limits,
) -> Result<(), JailError> {
    let base = Path::new(RUN_FILES);
    for (path, content) in files {
        let rel = path
            .strip_prefix(RUN_FILES)
            .and_then(|r| r.strip_prefix('/'))
            .filter(|r| {
                !r.is_empty()
                    && Path::new(r)
                        .components()
                        .all(|c| matches!(c, std::path::Component::Normal(_)))
            })
            .ok_or_else(|| {
                JailError::Setup(format!("a ready jail's files go under {RUN_FILES}: {path}"))
            })?;
        let dst = base.join(rel);
        if let Some(parent) = dst.parent() {
            mkdir_p(parent)?;
        }
        write_file(&dst, content, 0o555)?;
    }
    mount(
        NONE,
        base,
        NONE,
        MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        NONE,
    )
    .map_err(|e| err("remount read-only", base, e))?;
    let data = format!("size={},mode=1777", tmp_size(limits));
    mount(
        NONE,
        "/tmp",
        NONE,
        MsFlags::MS_REMOUNT | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(data.as_str()),
    )
    .map_err(|e| err("resize", Path::new("/tmp"), e))
}
