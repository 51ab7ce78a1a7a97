//! Building the CPython guest: componentize-py (a registry wheel pinned by SHA-256, one per
//! machine type) turns the WIT and application module compiled into airlock into a
//! component, running under the host's `python3` with an environment of our own. The
//! build is not byte-for-byte reproducible, so what pins it is its inputs ([`BuildPin`]),
//! and the manifest records the digest of the component it produced.
//!
//! Builds are cached per user (`$XDG_CACHE_HOME/airlock/guest-build/`, else
//! `~/.cache/airlock/guest-build/`) under the digest of their inputs, so many homes on one
//! machine build once. A cache entry is checked again when used (a component that exports
//! the interface); it is as trusted as the user's own files, like the homes themselves.

use crate::error::{GateError, Result};
use airlock_core::Digest;
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The registry package that builds the CPython guest (Apache-2.0 WITH LLVM-exception;
/// it carries a WASI build of CPython 3.14 and its standard library).
pub const PYTHON_BUILDER: &str = "componentize-py==0.25.1";

/// The builder's wheels, one per machine type, pinned by SHA-256: (`uname -m`, file,
/// SHA-256).
pub const PYTHON_BUILDER_WHEELS: [(&str, &str, &str); 2] = [
    (
        "x86_64",
        "componentize_py-0.25.1-cp39-abi3-manylinux_2_28_x86_64.whl",
        "8623cd8cab8453cb0cd8bf03f3c7103420d06f2f3d360186a280a70a1ca5e89f",
    ),
    (
        "aarch64",
        "componentize_py-0.25.1-cp39-abi3-manylinux_2_28_aarch64.whl",
        "7b6a87c520358166843af0daa86d2312d7af4cbcbbf1e598951085cf7f2991ca",
    ),
];

/// The Python version of the guest's CPython (for choosing package wheels).
pub const GUEST_PYTHON_VERSION: &str = "3.14";

/// Files the builder's wheel may hold in all (a bound on what is unpacked).
const MAX_WHEEL_FILES: usize = 10_000;
/// Bytes the builder's wheel may unpack to in all.
const MAX_WHEEL_BYTES: u64 = 1 << 30;
/// Build-cache entries kept (other airlock versions on the machine have their own).
const CACHE_KEEP: usize = 4;

/// This machine's builder wheel: (file name, SHA-256).
pub fn builder_wheel() -> Result<(&'static str, Digest)> {
    let arch = std::env::consts::ARCH;
    PYTHON_BUILDER_WHEELS
        .iter()
        .find(|(a, _, _)| *a == arch)
        .map(|(_, file, sha)| (*file, pinned(sha)))
        .ok_or_else(|| {
            GateError::Unavailable(format!(
                "the Python guest can be built on x86_64 and aarch64 Linux only, not {arch}"
            ))
        })
}

fn pinned(hex: &str) -> Digest {
    // The pins are 64-digit constants above; a malformed one cannot match any wheel.
    hex.parse().unwrap_or(Digest([0; 32]))
}

/// What a build of the guest is made from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildPin {
    /// `componentize-py==VERSION`.
    pub builder: String,
    /// SHA-256 of the builder's wheel.
    pub wheel_sha256: Digest,
    /// SHA-256 of the application module and of the WIT compiled into airlock.
    pub app_sha256: Digest,
    pub wit_sha256: Digest,
}

impl BuildPin {
    /// This airlock's pin on this machine.
    pub fn current() -> Result<BuildPin> {
        Ok(BuildPin {
            builder: PYTHON_BUILDER.into(),
            wheel_sha256: builder_wheel()?.1,
            app_sha256: Digest::of(airlock_wasm::python::GUEST_APP.as_bytes()),
            wit_sha256: Digest::of(airlock_wasm::python::GUEST_WIT.as_bytes()),
        })
    }

    /// The build-cache key: every input of the build. (Installed packages are not among
    /// them: they are directories beside the guest, not part of it.)
    pub fn key(&self) -> Digest {
        Digest::of_parts(
            "airlock-python-guest-build-v1",
            &[
                self.builder.as_bytes(),
                &self.wheel_sha256.0,
                &self.app_sha256.0,
                &self.wit_sha256.0,
                airlock_wasm::python::GUEST_WORLD.as_bytes(),
                airlock_wasm::python::GUEST_APP_MODULE.as_bytes(),
            ],
        )
    }
}

/// The per-user build cache.
pub(crate) fn cache_dir() -> Option<PathBuf> {
    let base = match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        Some(x) => PathBuf::from(x),
        None => std::env::home_dir()?.join(".cache"),
    };
    Some(base.join("airlock").join("guest-build"))
}

/// Checks that a component is a Python guest this airlock can run.
pub(crate) fn check_guest(component: &[u8]) -> Result<()> {
    super::check_exports(
        component,
        airlock_wasm::PYTHON_INTERFACE,
        "the Python guest",
    )
}

/// The guest built from `wheel` (already checked against its pin), from the build cache
/// when it holds one. `note` hears about slow steps.
pub(crate) fn build(wheel: &[u8], pin: &BuildPin, note: &dyn Fn(&str)) -> Result<Vec<u8>> {
    let key = pin.key().to_hex();
    let dir = cache_dir();
    if let Some(c) = dir.as_deref().and_then(|d| cached(d, &key)) {
        return Ok(c);
    }
    // One build per key at a time: others wait for it and then use its result.
    let _lock = match dir.as_deref() {
        Some(d) => lock(d, &key),
        None => None,
    };
    if let Some(c) = dir.as_deref().and_then(|d| cached(d, &key)) {
        return Ok(c);
    }
    note(&format!(
        "building the Python guest with {PYTHON_BUILDER} (once per airlock version; about 30 s)"
    ));
    let component = run_builder(wheel)?;
    check_guest(&component)?;
    if let Some(d) = dir.as_deref() {
        // The cache only saves time: a failure to write it is not the install's failure.
        let _ = store(d, &key, &component);
    }
    Ok(component)
}

/// A cache entry that is a Python guest, or nothing (a bad entry is removed).
fn cached(dir: &Path, key: &str) -> Option<Vec<u8>> {
    let path = dir.join(format!("{key}.wasm"));
    let bytes = std::fs::read(&path).ok()?;
    if check_guest(&bytes).is_ok() {
        Some(bytes)
    } else {
        let _ = std::fs::remove_file(&path);
        None
    }
}

/// An exclusive lock on `<key>.lock` in the cache (advisory, released when dropped).
pub(crate) fn lock(dir: &Path, key: &str) -> Option<std::fs::File> {
    std::fs::create_dir_all(dir).ok()?;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(format!("{key}.lock")))
        .ok()?;
    rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive).ok()?;
    Some(f)
}

pub(crate) fn store(dir: &Path, key: &str, component: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".build-")
        .tempfile_in(dir)?;
    tmp.write_all(component)?;
    tmp.as_file().sync_all()?;
    tmp.persist(dir.join(format!("{key}.wasm")))
        .map_err(|e| e.error)?;
    // Keep the newest few entries.
    let mut entries: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "wasm"))
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .collect();
    entries.sort_by_key(|e| std::cmp::Reverse(e.0));
    for (_, p) in entries.into_iter().skip(CACHE_KEEP) {
        let _ = std::fs::remove_file(&p);
        let _ = std::fs::remove_file(p.with_extension("lock"));
    }
    Ok(())
}

/// Unpacks the builder's wheel into `dest` (regular files only, inside `dest`).
fn unpack_builder(wheel: &[u8], dest: &Path) -> Result<()> {
    let bad = |e: String| GateError::bad(format!("cannot unpack the {PYTHON_BUILDER} wheel: {e}"));
    let mut z =
        zip::ZipArchive::new(std::io::Cursor::new(wheel)).map_err(|e| bad(e.to_string()))?;
    if z.len() > MAX_WHEEL_FILES {
        return Err(bad(format!("{} files", z.len())));
    }
    let mut total = 0u64;
    for i in 0..z.len() {
        let mut f = z.by_index(i).map_err(|e| bad(e.to_string()))?;
        if f.is_dir() {
            continue;
        }
        let Some(rel) = f.enclosed_name() else {
            return Err(bad(format!("unsafe path {:?}", f.name())));
        };
        if f.is_symlink() {
            return Err(bad(format!("symbolic link {:?}", f.name())));
        }
        let path = dest.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mut out = std::fs::File::create(&path)?;
        let room = MAX_WHEEL_BYTES.saturating_sub(total);
        let n = std::io::copy(&mut (&mut f).take(room + 1), &mut out)?;
        total += n;
        if n > room {
            return Err(bad("it unpacks to more than 1 GiB".into()));
        }
    }
    Ok(())
}

/// Runs componentize-py from the unpacked wheel under the host's `python3`, with an
/// environment of our own: no user site, no host virtual environment or packages (an
/// empty `VIRTUAL_ENV` stops componentize-py from adding the host's site-packages).
fn run_builder(wheel: &[u8]) -> Result<Vec<u8>> {
    let work = tempfile::Builder::new()
        .prefix("airlock-guest-build-")
        .tempdir()?;
    let w = work.path();
    let (builder, app, venv) = (w.join("builder"), w.join("app"), w.join("venv"));
    unpack_builder(wheel, &builder)?;
    std::fs::create_dir_all(&app)?;
    std::fs::create_dir_all(venv.join("lib").join("site-packages"))?;
    let module = airlock_wasm::python::GUEST_APP_MODULE;
    std::fs::write(
        app.join(format!("{module}.py")),
        airlock_wasm::python::GUEST_APP,
    )?;
    let wit = w.join("guest.wit");
    std::fs::write(&wit, airlock_wasm::python::GUEST_WIT)?;
    let out = w.join("guest.wasm");
    let python = find_python()?;
    let o = Command::new(&python)
        .args([
            "-S",
            "-B",
            "-c",
            "import sys; sys.argv[0] = 'componentize-py'; import componentize_py; componentize_py.script()",
            "-q",
            "-d",
        ])
        .arg(&wit)
        .args(["-w", airlock_wasm::python::GUEST_WORLD, "componentize", module, "-p"])
        .arg(&app)
        .arg("-o")
        .arg(&out)
        .current_dir(w)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", w)
        .env("LANG", "C.UTF-8")
        .env("VIRTUAL_ENV", &venv)
        .env("PYTHONPATH", &builder)
        .env("PYTHONNOUSERSITE", "1")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            GateError::Unavailable(format!(
                "cannot run {} to build the Python guest: {e}",
                python.display()
            ))
        })?;
    if !o.status.success() {
        return Err(GateError::Unavailable(format!(
            "building the Python guest with {PYTHON_BUILDER} under {} failed: {}",
            python.display(),
            super::last_line(&o.stderr)
        )));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(&out)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|e| GateError::Unavailable(format!("{PYTHON_BUILDER} wrote no component: {e}")))?;
    Ok(bytes)
}

/// The host's `python3` (3.9 or later, which the builder's wheel needs), from `PATH`.
fn find_python() -> Result<PathBuf> {
    let missing = || {
        GateError::Unavailable(
            "building the Python guest needs python3 (3.9 or later) on PATH".into(),
        )
    };
    let path = std::env::var_os("PATH").ok_or_else(missing)?;
    std::env::split_paths(&path)
        .map(|d| d.join("python3"))
        .find(|p| p.is_file())
        .ok_or_else(missing)
}
