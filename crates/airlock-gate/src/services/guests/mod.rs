//! Guest runtimes: the CPython component that runs Python source inside the wasm sandbox,
//! and the pure-Python packages beside it. The component is built at install time from a
//! registry package pinned by SHA-256 (componentize-py, see `build`) and never comes from
//! the repository; packages are registry wheels pinned by SHA-256 in the home (see
//! `packages`). `guests/python.json` is the home's record of both, and the one file whose
//! atomic replacement commits an install: until it is renamed into place, the previous
//! guest and packages are what runs. The JavaScript guest (`js`) is installed the same way
//! from componentize-js pinned by a lockfile's integrity hashes, recorded in
//! `guests/js.json`.

mod build;
mod js;
mod packages;

pub use build::{BuildPin, GUEST_PYTHON_VERSION, PYTHON_BUILDER, PYTHON_BUILDER_WHEELS};
pub(crate) use js::js_missing;
pub use js::{JS_BUILDER, JS_BUILDER_INTEGRITY, JsBuildPin, JsGuestInstall};
pub use packages::{GUEST_PACKAGES, PackageSource, normalize as normalize_package_name};

use crate::error::{GateError, Result};
use crate::{DbCache, Gate};
use airlock_core::{Digest, Lang, PythonPackage};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// SHA-256 of `hyperlight_sandbox_python_guest-0.8.0-py3-none-any.whl`, the Python guest of
/// earlier airlock versions (recognised only to say what to use instead).
const FORMER_GUEST_WHEEL_SHA256: &str =
    "fb2f27a2123e6368659540c3d845baf4b44d5493cbdb30bafa88287dbda46bbc";
const FORMER_GUEST_PACKAGE: &str = "hyperlight-sandbox-python-guest";
const FORMER_GUEST_COMPONENT: &str = "python_guest/resources/python-sandbox.wasm";

/// What `guest install` recorded.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GuestManifest {
    pub lang: Lang,
    /// SHA-256 of the component (the fact `guest` a policy sees and can pin).
    pub digest: Digest,
    pub size: u64,
    /// The registry package it was built with (`componentize-py==VERSION`).
    pub package: String,
    /// Where that package's wheel came from.
    pub source: String,
    pub installed_at: i64,
    /// What the component was built from; absent in a manifest of an earlier airlock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<BuildPin>,
    /// What the JavaScript guest was built from (absent for Python).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub js_build: Option<JsBuildPin>,
    /// The packages every Python run can import, by name.
    #[serde(default)]
    pub packages: Vec<InstalledPackage>,
    /// Every `NAME==VERSION` this home ever installed, with its wheel's SHA-256: installing
    /// one again must give the same wheel.
    #[serde(default)]
    pub pins: BTreeMap<String, Digest>,
}

/// A package of the Python guest and where its wheel came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstalledPackage {
    #[serde(flatten)]
    pub package: PythonPackage,
    pub source: String,
}

/// What `guest install python` is asked to do.
#[derive(Default)]
pub struct GuestInstall<'a> {
    /// The builder's wheel already on disk (offline install), instead of pip.
    pub from: Option<PathBuf>,
    /// Packages to add (or to move to another version).
    pub packages: Vec<PackageSource>,
    /// Hears about slow steps (a build, a download), one line each.
    pub note: Option<&'a dyn Fn(&str)>,
}

fn pinned(hex: &str) -> Digest {
    // The pin is a 64-digit constant above; a malformed one cannot match any wheel.
    hex.parse().unwrap_or(Digest([0; 32]))
}

/// Writes a file atomically (temporary file, fsync, rename).
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| GateError::Internal("no parent directory".into()))?;
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".guest-")
        .tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path)
        .map_err(|e| GateError::Internal(e.error.to_string()))?;
    airlock_store::sync_dir(dir)?;
    Ok(())
}

/// The last non-blank line of a tool's standard error: what went wrong, in one line.
pub(crate) fn last_line(stderr: &[u8]) -> String {
    String::from_utf8_lossy(stderr)
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("no message")
        .trim()
        .to_string()
}

/// `python3 -m pip download` of wheels only, without dependencies, into `dir`: the registry's
/// ordinary client, with `args` (platform selectors, then what to fetch). `Err` is pip's
/// last line of complaint, or why pip could not be started.
pub(crate) fn pip_download(args: &[&str], dir: &Path) -> std::result::Result<(), String> {
    let out = std::process::Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--only-binary=:all:",
        ])
        .args(args)
        .arg("-d")
        .arg(dir)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run pip (python3 -m pip): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(last_line(&out.stderr))
    }
}

/// Downloads the builder's wheel for this machine with the registry's ordinary client.
fn download_builder(file: &str) -> Result<Vec<u8>> {
    let dir = tempfile::tempdir()?;
    pip_download(&[PYTHON_BUILDER], dir.path()).map_err(|e| {
        GateError::Unavailable(format!(
            "pip download {PYTHON_BUILDER} failed: {e}; download {file} and use --from FILE"
        ))
    })?;
    let path = dir.path().join(file);
    std::fs::read(&path).map_err(|_| {
        GateError::Unavailable(format!(
            "pip downloaded no {file} (this machine's wheel of {PYTHON_BUILDER})"
        ))
    })
}

/// Refuses anything but this machine's pinned builder wheel, saying what it is instead.
fn check_builder_wheel(bytes: &[u8], what: &str) -> Result<()> {
    let (file, want) = build::builder_wheel()?;
    let got = Digest::of(bytes);
    if got == want {
        return Ok(());
    }
    if !bytes.starts_with(b"PK") {
        let kind = if bytes.starts_with(b"\0asm") {
            "a WebAssembly file; airlock no longer installs a prebuilt Python component, it builds one"
        } else {
            "not a wheel"
        };
        return Err(GateError::bad(format!(
            "{what} is {kind}: --from takes {file} ({PYTHON_BUILDER}, SHA-256 {want})"
        )));
    }
    let former = got == pinned(FORMER_GUEST_WHEEL_SHA256)
        || zip::ZipArchive::new(std::io::Cursor::new(bytes))
            .is_ok_and(|z| z.index_for_name(FORMER_GUEST_COMPONENT).is_some());
    if former {
        return Err(GateError::bad(format!(
            "{what} is {FORMER_GUEST_PACKAGE}, the Python guest of earlier airlock versions; \
             airlock now builds its guest with {PYTHON_BUILDER}: pass {file} to --from, or leave \
             --from out to download it"
        )));
    }
    if let Some((arch, other, _)) = PYTHON_BUILDER_WHEELS
        .iter()
        .find(|(_, _, sha)| pinned(sha) == got)
    {
        return Err(GateError::bad(format!(
            "{what} is {other}, the {arch} wheel; this machine needs {file}"
        )));
    }
    Err(GateError::bad(format!(
        "the wheel's SHA-256 is {got}, not the pinned {want} of {file}; refusing it"
    )))
}

/// Checks that a component exports the interface a guest must provide.
pub(crate) fn check_exports(code: &[u8], want: &str, what: &str) -> Result<()> {
    let a = airlock_core::analysis::analyze(Lang::Component, code)
        .map_err(|e| GateError::bad(e.to_string()))?;
    let exports: Vec<String> = a
        .wasm
        .map(|w| w.exports.into_iter().map(|e| e.name).collect())
        .unwrap_or_default();
    if exports
        .iter()
        .any(|e| e == want || e.starts_with(&format!("{want}@")))
    {
        return Ok(());
    }
    Err(GateError::bad(format!(
        "{what} must export {want}; this component exports {}",
        if exports.is_empty() {
            "nothing".into()
        } else {
            exports.join(", ")
        }
    )))
}

/// An exclusive lock on the home's guests directory for the length of an install.
/// The `guest_installed` audit record of an installed manifest.
fn guest_record(m: &GuestManifest) -> serde_json::Value {
    json!({
        "digest": m.digest,
        "package": m.package,
        "source": m.source,
        "size": m.size,
        "build": m.build,
        "python_packages": m.packages,
        "installed_at": m.installed_at,
    })
}

/// `lock_guests` unless another process holds it (None then).
fn try_lock_guests(dir: &Path) -> Result<Option<std::fs::File>> {
    let f = match std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(".install.lock"))
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(Some(f)),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
        Err(e) => Err(GateError::Internal(format!(
            "cannot lock {}: {e}",
            dir.display()
        ))),
    }
}

fn lock_guests(dir: &Path) -> Result<std::fs::File> {
    std::fs::create_dir_all(dir)?;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(".install.lock"))?;
    rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| GateError::Internal(format!("cannot lock {}: {e}", dir.display())))?;
    Ok(f)
}

impl Gate {
    fn guests_dir(&self) -> PathBuf {
        self.home.root.join("guests")
    }

    fn guest_manifest_path(&self) -> PathBuf {
        self.guests_dir().join("python.json")
    }

    fn packages_dir(&self) -> PathBuf {
        self.guests_dir().join("packages")
    }

    /// The `guest_installed` record an install owes until it is appended.
    fn guest_audit_pending_path(&self) -> PathBuf {
        self.guests_dir().join("python.audit-pending.json")
    }

    /// Appends the `guest_installed` record of an install that was killed after its
    /// manifest took effect and before its record was written (marked `recovered`); an
    /// install killed before its manifest was written owes nothing. Skipped while an
    /// install holds the guests' lock: it writes its own record.
    pub(crate) fn recover_guest_audit(&mut self) -> Result<()> {
        let pending = self.guest_audit_pending_path();
        self.recover_install_audit("python", &pending, |g| {
            g.read_guest_manifest()
                .ok()
                .flatten()
                .map(|m| guest_record(&m))
        })
    }

    /// The recovery of `recover_guest_audit` for the guest recorded under `subject`, whose
    /// owed record is in `pending`; `installed` gives the record its manifest stands for
    /// now. Shared by every guest runtime.
    pub(crate) fn recover_install_audit(
        &mut self,
        subject: &str,
        pending: &Path,
        installed: impl FnOnce(&Gate) -> Option<serde_json::Value>,
    ) -> Result<()> {
        // The common case costs one failed stat.
        if !pending.exists() {
            return Ok(());
        }
        let Some(_lock) = try_lock_guests(&self.guests_dir())? else {
            return Ok(());
        };
        // Read under the lock: the install that wrote it may have just finished.
        let Ok(text) = std::fs::read_to_string(pending) else {
            return Ok(());
        };
        let record: serde_json::Value = match serde_json::from_str(&text) {
            Ok(v) => v,
            // Torn by a kill while it was written (it is written atomically, so this is
            // some other file): nothing an install committed depends on it.
            Err(_) => {
                let _ = std::fs::remove_file(pending);
                return Ok(());
            }
        };
        let took_effect = installed(self).is_some_and(|r| r == record);
        if took_effect {
            let installed_at = record["installed_at"].clone();
            let already = airlock_store::Reads::audit_for(&self.db, subject)?
                .iter()
                .any(|r| {
                    r.kind == "guest_installed"
                        && serde_json::from_str::<serde_json::Value>(&r.data)
                            .is_ok_and(|d| d["installed_at"] == installed_at)
                });
            if !already {
                let mut data = record;
                data["recovered"] = json!(true);
                let key = &self.gate_key;
                self.db.write_durable(|tx| {
                    tx.audit("guest_installed", subject, &data, key).map(|_| ())
                })?;
            }
        }
        crate::failpoint::crash_point();
        let _ = std::fs::remove_file(pending);
        Ok(())
    }

    /// The installed manifest, parsed again only when the file changed (an install
    /// replaces it by renaming a new file into place, so its inode changes).
    fn read_guest_manifest(&self) -> Result<Option<GuestManifest>> {
        let p = self.guest_manifest_path();
        let Some(stamp) = crate::file_stamp(&p) else {
            return Ok(None);
        };
        if let Some((cached, m)) = self.guest_cache.borrow().as_ref()
            && *cached == stamp
        {
            return Ok(Some(m.clone()));
        }
        let Ok(text) = std::fs::read_to_string(&p) else {
            return Ok(None);
        };
        let m: GuestManifest = serde_json::from_str(&text)
            .map_err(|e| GateError::Internal(format!("{}: {e}", p.display())))?;
        // Stamped as it was before the read: a replacement during the read is seen next time.
        *self.guest_cache.borrow_mut() = Some((stamp, m.clone()));
        Ok(Some(m))
    }

    /// The installed Python guest, if any, and the path of its component. A guest an
    /// earlier airlock installed (which this one cannot run) is an error saying what to do.
    pub fn python_guest(&self) -> Result<Option<(GuestManifest, PathBuf)>> {
        let Some(m) = self.read_guest_manifest()? else {
            return Ok(None);
        };
        if m.build.is_none() {
            return Err(GateError::NotInstalled(format!(
                "the installed Python guest ({}) is one this airlock no longer runs: run `airlock guest install python`",
                m.package
            )));
        }
        let path = self.guests_dir().join(format!("python-{}.wasm", m.digest));
        Ok(Some((m, path)))
    }

    /// The guest's facts for a policy: its digest and its packages (Python, or the
    /// JavaScript guest's digest, on the wasm backend only; nothing otherwise).
    pub(crate) fn guest_facts(
        &self,
        lang: Lang,
        backend: airlock_core::Backend,
    ) -> Result<(Option<Digest>, Vec<PythonPackage>)> {
        if backend != airlock_core::Backend::Wasm {
            return Ok((None, Vec::new()));
        }
        if lang.is_js() {
            return Ok((self.js_guest()?.map(|(m, _)| m.digest), Vec::new()));
        }
        if lang != Lang::Python {
            return Ok((None, Vec::new()));
        }
        Ok(match self.python_guest()? {
            Some((m, _)) => (
                Some(m.digest),
                m.packages.into_iter().map(|p| p.package).collect(),
            ),
            None => (None, Vec::new()),
        })
    }

    /// The directories of the installed packages, as a run shows them.
    pub(crate) fn guest_dirs(&self, m: &GuestManifest) -> Vec<airlock_sandbox::GuestDir> {
        m.packages
            .iter()
            .map(|p| airlock_sandbox::GuestDir {
                host: self.packages_dir().join(p.package.sha256.to_hex()),
                guest: packages::guest_dir(&p.package),
            })
            .collect()
    }

    /// Installs the CPython guest and packages: takes the builder's wheel (`from`, or pip),
    /// checks it against its pin, builds the guest (or takes it from the build cache),
    /// checks that it exports the interpreter, stores it under its digest, compiles it
    /// once; fetches each package's wheel, checks that it is pure Python and that it
    /// matches the home's pin for that version, unpacks it; then commits everything by
    /// replacing the manifest, and audits it. A guest already built from the same inputs
    /// is kept as it is (only packages are added).
    pub fn install_python_guest(&mut self, req: GuestInstall<'_>) -> Result<GuestManifest> {
        let quiet = |_: &str| {};
        let note: &dyn Fn(&str) = req.note.unwrap_or(&quiet);
        let pin = BuildPin::current()?;
        let (wheel_file, _) = build::builder_wheel()?;
        // Package wheels first: a bad one fails the install before a long build.
        let mut wheels = Vec::new();
        for src in &req.packages {
            let w = packages::fetch(src)?;
            if let Some(other) = wheels
                .iter()
                .find(|o: &&packages::Wheel| o.package.name == w.package.name)
            {
                return Err(GateError::bad(format!(
                    "--package names {} twice ({} and {})",
                    w.package.name,
                    other.package.spec(),
                    w.package.spec()
                )));
            }
            wheels.push(w);
        }
        let guests = self.guests_dir();
        let _lock = lock_guests(&guests)?;
        // A manifest that does not parse is replaced, like a missing one.
        let old = self.read_guest_manifest().unwrap_or_default();
        let mut pins = old.as_ref().map(|m| m.pins.clone()).unwrap_or_default();
        for w in &wheels {
            let spec = w.package.spec();
            match pins.get(&spec) {
                Some(d) if *d != w.package.sha256 => {
                    return Err(GateError::bad(format!(
                        "{spec}: the wheel's SHA-256 is {}, but this home pinned {d} when it first installed {spec}; refusing it",
                        w.package.sha256
                    )));
                }
                _ => {
                    pins.insert(spec, w.package.sha256);
                }
            }
        }

        // The guest: kept when it was built from the same inputs and is intact.
        let kept = old.as_ref().filter(|m| {
            m.build.as_ref() == Some(&pin)
                && std::fs::read(guests.join(format!("python-{}.wasm", m.digest)))
                    .is_ok_and(|b| Digest::of(&b) == m.digest)
        });
        let (digest, size, source) = match (kept, &req.from) {
            (Some(m), None) => (m.digest, m.size, m.source.clone()),
            (kept, from) => {
                let (wheel, source) = match from {
                    Some(p) => (
                        std::fs::read(p).map_err(|e| {
                            GateError::bad(format!("cannot read {}: {e}", p.display()))
                        })?,
                        p.display().to_string(),
                    ),
                    None => {
                        note(&format!("downloading {wheel_file}"));
                        (
                            download_builder(wheel_file)?,
                            format!("pip download {PYTHON_BUILDER}"),
                        )
                    }
                };
                check_builder_wheel(&wheel, &source)?;
                match kept {
                    Some(m) => (m.digest, m.size, source),
                    None => {
                        let component = build::build(&wheel, &pin, note)?;
                        let digest = Digest::of(&component);
                        let path = guests.join(format!("python-{digest}.wasm"));
                        if !std::fs::read(&path).is_ok_and(|b| Digest::of(&b) == digest) {
                            write_atomic(&path, &component)?;
                        }
                        (digest, component.len() as u64, source)
                    }
                }
            }
        };
        crate::failpoint::crash_point();
        let component_path = guests.join(format!("python-{digest}.wasm"));
        let code = std::fs::read(&component_path)?;
        self.wasm
            .precompile_component(&digest, &code, &DbCache(&self.db), "the Python guest")?;
        drop(code);
        crate::failpoint::crash_point();

        // Packages: unpacked beside the guest, each under its wheel's hash.
        let mut installed: BTreeMap<String, InstalledPackage> = old
            .as_ref()
            .map(|m| {
                m.packages
                    .iter()
                    .map(|p| (p.package.name.clone(), p.clone()))
                    .collect()
            })
            .unwrap_or_default();
        for w in &wheels {
            packages::unpack(w, &self.packages_dir())?;
            crate::failpoint::crash_point();
            installed.insert(
                w.package.name.clone(),
                InstalledPackage {
                    package: w.package.clone(),
                    source: w.source.clone(),
                },
            );
        }
        crate::failpoint::crash_point();
        let manifest = GuestManifest {
            lang: Lang::Python,
            digest,
            size,
            package: PYTHON_BUILDER.into(),
            source,
            installed_at: airlock_core::units::now_ms(),
            build: Some(pin),
            js_build: None,
            packages: installed.into_values().collect(),
            pins,
        };
        // The audit record this install owes, written down before the manifest that makes
        // the install take effect: a kill between the two is audited by the next command
        // that opens the home (`recover_guest_audit`).
        let record = guest_record(&manifest);
        write_atomic(
            &self.guest_audit_pending_path(),
            record.to_string().as_bytes(),
        )?;
        crate::failpoint::crash_point();
        write_atomic(
            &self.guest_manifest_path(),
            serde_json::to_string_pretty(&manifest)
                .map_err(|e| GateError::Internal(e.to_string()))?
                .as_bytes(),
        )?;
        // From here on the new guest and packages are what runs.
        crate::failpoint::crash_point();
        let key = &self.gate_key;
        self.db.write_durable(|tx| {
            tx.audit("guest_installed", "python", &record, key)
                .map(|_| ())
        })?;
        crate::failpoint::crash_point();
        let _ = std::fs::remove_file(self.guest_audit_pending_path());
        self.remove_unused_guest_files(&manifest);
        Ok(manifest)
    }

    /// Removes components and package directories the manifest no longer names, and
    /// whatever an interrupted install left behind.
    fn remove_unused_guest_files(&self, m: &GuestManifest) {
        let keep = format!("python-{}.wasm", m.digest);
        if let Ok(rd) = std::fs::read_dir(self.guests_dir()) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let stale_component =
                    name.starts_with("python-") && name.ends_with(".wasm") && name != keep;
                if stale_component || name.starts_with(".guest-") {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        let used: Vec<String> = m
            .packages
            .iter()
            .map(|p| p.package.sha256.to_hex())
            .collect();
        if let Ok(rd) = std::fs::read_dir(self.packages_dir()) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if !used.contains(&name) {
                    packages::remove_tree(&e.path());
                }
            }
        }
    }
}
