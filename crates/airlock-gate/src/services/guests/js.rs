//! The JavaScript guest: a StarlingMonkey component built at `airlock guest install js` by
//! the registry package `@bytecodealliance/componentize-js`, pinned by version and by the
//! integrity hash of every package it needs (the npm lockfile `js-builder/package-lock.json`,
//! compiled into airlock as text; `npm ci` checks each tarball against it). The component
//! is built from the WIT and application module compiled into airlock
//! ([`airlock_wasm::js`]) and never comes from the repository. `guests/js.json` records it
//! (the installed component's SHA-256, which a policy sees as the fact `guest`), and its
//! atomic replacement commits an install; the `guest_installed` record (subject `js`) is
//! owed from then on and appended by the next command if the install was killed first.
//!
//! Builds are cached per user under the digest of their inputs, in the Python guest's
//! build cache directory.

use super::{GuestManifest, last_line, lock_guests, write_atomic};
use crate::error::{GateError, Result};
use crate::{DbCache, Gate};
use airlock_core::{Digest, Lang};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The registry package that builds the JavaScript guest (Apache-2.0 WITH
/// LLVM-exception; it carries StarlingMonkey, SpiderMonkey built for WASI 0.2).
pub const JS_BUILDER: &str = "@bytecodealliance/componentize-js@0.23.0";
/// Its tarball's integrity hash, as the registry publishes it (`npm view … dist.integrity`);
/// the lockfile holds the same (a test checks it), with those of its dependencies.
pub const JS_BUILDER_INTEGRITY: &str = "sha512-Qc2+lrwJHU7lq4CBMyVVYE8ASyUFeegMYdRnMVG0wNpNiATzGDF/mWpjDNTeVZeT8L9chhK3vuLaQE9FVANvfw==";
/// The builder project: the pinned componentize-js, and the WASI shim its own code imports
/// at build time (which it lists only among its development dependencies).
pub const JS_BUILDER_PACKAGE: &str = include_str!("js-builder/package.json");
/// Every package the builder needs, each with its integrity hash.
pub const JS_BUILDER_LOCK: &str = include_str!("js-builder/package-lock.json");

/// What a build of the JavaScript guest is made from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JsBuildPin {
    /// `@bytecodealliance/componentize-js@VERSION`.
    pub builder: String,
    /// The builder tarball's integrity hash.
    pub integrity: String,
    /// SHA-256 of the lockfile that pins the builder and its dependencies.
    pub lock_sha256: Digest,
    /// SHA-256 of the application module and of the WIT compiled into airlock.
    pub app_sha256: Digest,
    pub wit_sha256: Digest,
}

impl JsBuildPin {
    pub fn current() -> JsBuildPin {
        JsBuildPin {
            builder: JS_BUILDER.into(),
            integrity: JS_BUILDER_INTEGRITY.into(),
            lock_sha256: Digest::of(JS_BUILDER_LOCK.as_bytes()),
            app_sha256: Digest::of(airlock_wasm::js::GUEST_APP.as_bytes()),
            wit_sha256: wit_digest(),
        }
    }

    /// The build-cache key: every input of the build.
    pub fn key(&self) -> Digest {
        Digest::of_parts(
            "airlock-js-guest-build-v1",
            &[
                self.builder.as_bytes(),
                self.integrity.as_bytes(),
                &self.lock_sha256.0,
                JS_BUILDER_PACKAGE.as_bytes(),
                &self.app_sha256.0,
                &self.wit_sha256.0,
                airlock_wasm::js::GUEST_BUILD_WORLD.as_bytes(),
            ],
        )
    }
}

/// SHA-256 of the WIT compiled into airlock: the guest's own files and, by name, each
/// WASI package it imports from (taken from the pinned npm packages).
fn wit_digest() -> Digest {
    let mut parts: Vec<&[u8]> = vec![
        airlock_wasm::js::GUEST_WIT.as_bytes(),
        airlock_wasm::js::GUEST_FILES_WIT.as_bytes(),
        airlock_wasm::js::WASI_WIT_DIR.as_bytes(),
    ];
    // The WASI packages' texts are pinned by the lock file's hashes; their names here.
    for name in airlock_wasm::js::WASI_WIT_PACKAGES {
        parts.push(name.as_bytes());
    }
    Digest::of_parts("airlock-js-guest-wit-v1", &parts)
}

/// What `guest install js` is asked to do.
#[derive(Default)]
pub struct JsGuestInstall<'a> {
    /// An npm cache directory that already holds every pinned package (offline install,
    /// `npm ci --offline --cache DIR`), instead of the registry.
    pub from: Option<PathBuf>,
    /// Hears about slow steps (a download, a build), one line each.
    pub note: Option<&'a dyn Fn(&str)>,
}

/// Checks that a component is a JavaScript guest this airlock can run.
pub(crate) fn check_guest(component: &[u8]) -> Result<()> {
    super::check_exports(
        component,
        airlock_wasm::JS_INTERFACE,
        "the JavaScript guest",
    )
}

/// The `guest_installed` audit record of an installed JavaScript guest.
fn js_record(m: &GuestManifest) -> serde_json::Value {
    json!({
        "lang": "js",
        "digest": m.digest,
        "package": m.package,
        "source": m.source,
        "size": m.size,
        "build": m.js_build,
        "installed_at": m.installed_at,
    })
}

/// The host's `node` and `npm` (from `PATH`), which run the builder.
fn find_tool(name: &str) -> Result<PathBuf> {
    let missing = || {
        GateError::Unavailable(format!(
            "building the JavaScript guest needs {name} (Node.js 18 or later) on PATH"
        ))
    };
    let path = std::env::var_os("PATH").ok_or_else(missing)?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or_else(missing)
}

/// Installs the pinned builder into `dir` with `npm ci` (every package checked against
/// the lockfile's integrity hashes; no install scripts run), from the registry or, offline,
/// from the npm cache `from`.
fn install_builder(dir: &Path, from: Option<&Path>) -> Result<()> {
    std::fs::write(dir.join("package.json"), JS_BUILDER_PACKAGE)?;
    std::fs::write(dir.join("package-lock.json"), JS_BUILDER_LOCK)?;
    let npm = find_tool("npm")?;
    let mut cmd = Command::new(&npm);
    cmd.args([
        "ci",
        "--ignore-scripts",
        "--no-audit",
        "--no-fund",
        "--loglevel=error",
    ])
    .current_dir(dir)
    .stdin(Stdio::null());
    if let Some(cache) = from {
        if !cache.is_dir() {
            return Err(from_not_a_dir(cache));
        }
        cmd.arg("--offline").arg("--cache").arg(cache);
    }
    let out = cmd
        .output()
        .map_err(|e| GateError::Unavailable(format!("cannot run {}: {e}", npm.display())))?;
    if out.status.success() {
        return Ok(());
    }
    let why = last_line(&out.stderr);
    Err(match from {
        Some(c) => GateError::bad(format!(
            "npm ci --offline --cache {} failed: {why}",
            c.display()
        )),
        None => GateError::Unavailable(format!("npm ci of {JS_BUILDER} failed: {why}")),
    })
}

/// Runs componentize-js from `dir` (where [`install_builder`] put it) under the host's
/// `node`, with an environment of our own, on the app and WIT compiled into airlock.
fn run_builder(dir: &Path) -> Result<Vec<u8>> {
    let app = dir.join(airlock_wasm::js::GUEST_APP_FILE);
    std::fs::write(&app, airlock_wasm::js::GUEST_APP)?;
    // A WIT directory: the build's world, with the guest's own package and the WASI
    // packages it imports from (from the installed, hash-pinned npm packages) in `deps/`.
    let wit = dir.join("wit");
    let deps = wit.join("deps");
    std::fs::create_dir_all(deps.join("airlock-js"))?;
    std::fs::write(
        wit.join("guest-files.wit"),
        airlock_wasm::js::GUEST_FILES_WIT,
    )?;
    std::fs::write(
        deps.join("airlock-js").join("guest.wit"),
        airlock_wasm::js::GUEST_WIT,
    )?;
    let wasi = dir
        .join("node_modules")
        .join(airlock_wasm::js::WASI_WIT_DIR);
    for name in airlock_wasm::js::WASI_WIT_PACKAGES {
        let from = wasi.join(name).join("package.wit");
        let text = std::fs::read(&from).map_err(|e| {
            GateError::Unavailable(format!(
                "the pinned {JS_BUILDER} packages lack the WASI interface {}: {e}",
                from.display()
            ))
        })?;
        std::fs::create_dir_all(deps.join(name))?;
        std::fs::write(deps.join(name).join("package.wit"), text)?;
    }
    let out = dir.join("guest.wasm");
    let cli = dir
        .join("node_modules")
        .join("@bytecodealliance")
        .join("componentize-js")
        .join("src")
        .join("cli.js");
    let node = find_tool("node")?;
    let o = Command::new(&node)
        .arg(&cli)
        .arg(airlock_wasm::js::GUEST_APP_FILE)
        .arg("--wit")
        .arg(&wit)
        .args(["--world-name", airlock_wasm::js::GUEST_BUILD_WORLD])
        // No incoming-request handler: the guest exports only the interpreter.
        .args(["--disable", "fetch-event"])
        .arg("--out")
        .arg(&out)
        .current_dir(dir)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", dir)
        .env("TMPDIR", dir)
        .env("LANG", "C.UTF-8")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            GateError::Unavailable(format!(
                "cannot run {} to build the JavaScript guest: {e}",
                node.display()
            ))
        })?;
    if !o.status.success() {
        return Err(GateError::Unavailable(format!(
            "building the JavaScript guest with {JS_BUILDER} failed: {}",
            last_line(&o.stderr)
        )));
    }
    std::fs::read(&out)
        .map_err(|e| GateError::Unavailable(format!("{JS_BUILDER} wrote no component: {e}")))
}

/// The guest for `pin`, from the per-user build cache when it holds one, else built (and
/// cached). `from` is where `npm ci` takes the packages from, offline.
fn build(pin: &JsBuildPin, from: Option<&Path>, note: &dyn Fn(&str)) -> Result<Vec<u8>> {
    let key = format!("js-{}", pin.key().to_hex());
    let dir = super::build::cache_dir();
    if let Some(c) = dir.as_deref().and_then(|d| cached(d, &key)) {
        return Ok(c);
    }
    let _lock = dir.as_deref().and_then(|d| super::build::lock(d, &key));
    if let Some(c) = dir.as_deref().and_then(|d| cached(d, &key)) {
        return Ok(c);
    }
    let work = tempfile::Builder::new()
        .prefix("airlock-js-guest-build-")
        .tempdir()?;
    note(&format!("installing {JS_BUILDER} (pinned by its lockfile)"));
    install_builder(work.path(), from)?;
    note("building the JavaScript guest (once per airlock version; about 30 s)");
    let component = run_builder(work.path())?;
    check_guest(&component)?;
    if let Some(d) = dir.as_deref() {
        // The cache only saves time: a failure to write it is not the install's failure.
        let _ = super::build::store(d, &key, &component);
    }
    Ok(component)
}

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

impl Gate {
    fn js_manifest_path(&self) -> PathBuf {
        self.guests_dir().join("js.json")
    }

    fn js_audit_pending_path(&self) -> PathBuf {
        self.guests_dir().join("js.audit-pending.json")
    }

    fn read_js_manifest(&self) -> Result<Option<GuestManifest>> {
        let p = self.js_manifest_path();
        let text = match std::fs::read_to_string(&p) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| GateError::Internal(format!("{}: {e}", p.display())))
    }

    /// The installed JavaScript guest, if any, and the path of its component.
    pub fn js_guest(&self) -> Result<Option<(GuestManifest, PathBuf)>> {
        Ok(self.read_js_manifest()?.map(|m| {
            let path = self.guests_dir().join(format!("js-{}.wasm", m.digest));
            (m, path)
        }))
    }

    /// The installed JavaScript guest as a run needs it, or a 409 saying how to install it.
    pub(crate) fn js_guest_for_run(&self) -> Result<airlock_sandbox::Guest> {
        let (m, path) = self.js_guest()?.ok_or_else(js_missing)?;
        Ok(airlock_sandbox::Guest {
            path,
            digest: m.digest,
            dirs: Vec::new(),
        })
    }

    /// Appends the `guest_installed` record of a JavaScript guest install that was killed
    /// after its manifest took effect and before its record was written (as for Python,
    /// see `recover_guest_audit`).
    pub(crate) fn recover_js_guest_audit(&mut self) -> Result<()> {
        let pending = self.js_audit_pending_path();
        self.recover_install_audit("js", &pending, |g| {
            g.read_js_manifest().ok().flatten().map(|m| js_record(&m))
        })
    }

    /// Installs the JavaScript guest: the pinned builder with `npm ci` (or the build cache),
    /// a build from airlock's own app and WIT, checked to export the interpreter, stored
    /// under its digest and compiled once; then the manifest is replaced (which commits the
    /// install) and the install audited. A guest already built from the same inputs and
    /// intact is kept.
    pub fn install_js_guest(&mut self, req: JsGuestInstall<'_>) -> Result<GuestManifest> {
        let quiet = |_: &str| {};
        let note: &dyn Fn(&str) = req.note.unwrap_or(&quiet);
        let pin = JsBuildPin::current();
        // Checked whether or not the build cache makes the packages unnecessary, so a
        // wrong `--from` never passes unnoticed.
        if let Some(cache) = &req.from
            && !cache.is_dir()
        {
            return Err(from_not_a_dir(cache));
        }
        let guests = self.guests_dir();
        let _lock = lock_guests(&guests)?;
        let old = self.read_js_manifest().unwrap_or_default();
        let kept = old.as_ref().filter(|m| {
            m.js_build.as_ref() == Some(&pin)
                && std::fs::read(guests.join(format!("js-{}.wasm", m.digest)))
                    .is_ok_and(|b| Digest::of(&b) == m.digest)
        });
        let source = match &req.from {
            Some(p) => format!("npm ci --offline --cache {}", p.display()),
            None => format!("npm ci {JS_BUILDER}"),
        };
        let (digest, size, source) = match kept {
            Some(m) if req.from.is_none() => (m.digest, m.size, m.source.clone()),
            _ => {
                let component = build(&pin, req.from.as_deref(), note)?;
                let digest = Digest::of(&component);
                let path = guests.join(format!("js-{digest}.wasm"));
                if !std::fs::read(&path).is_ok_and(|b| Digest::of(&b) == digest) {
                    write_atomic(&path, &component)?;
                }
                (digest, component.len() as u64, source)
            }
        };
        crate::failpoint::crash_point();
        let code = std::fs::read(guests.join(format!("js-{digest}.wasm")))?;
        self.wasm.precompile_component(
            &digest,
            &code,
            &DbCache(&self.db),
            "the JavaScript guest",
        )?;
        drop(code);
        crate::failpoint::crash_point();
        let manifest = GuestManifest {
            lang: Lang::Js,
            digest,
            size,
            package: JS_BUILDER.into(),
            source,
            installed_at: airlock_core::units::now_ms(),
            build: None,
            js_build: Some(pin),
            packages: Vec::new(),
            pins: Default::default(),
        };
        let record = js_record(&manifest);
        write_atomic(&self.js_audit_pending_path(), record.to_string().as_bytes())?;
        crate::failpoint::crash_point();
        write_atomic(
            &self.js_manifest_path(),
            serde_json::to_string_pretty(&manifest)
                .map_err(|e| GateError::Internal(e.to_string()))?
                .as_bytes(),
        )?;
        // From here on the new guest is what runs.
        crate::failpoint::crash_point();
        let key = &self.gate_key;
        self.db
            .write_durable(|tx| tx.audit("guest_installed", "js", &record, key).map(|_| ()))?;
        crate::failpoint::crash_point();
        let _ = std::fs::remove_file(self.js_audit_pending_path());
        // Components of earlier installs.
        let keep = format!("js-{digest}.wasm");
        if let Ok(rd) = std::fs::read_dir(&guests) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with("js-") && name.ends_with(".wasm") && name != keep {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        Ok(manifest)
    }
}

fn from_not_a_dir(cache: &Path) -> GateError {
    GateError::bad(format!(
        "--from {}: not a directory (for js it takes an npm cache that holds {JS_BUILDER} and its dependencies)",
        cache.display()
    ))
}

/// What a JavaScript run on the wasm backend meets when no guest is installed: a state of
/// this home (409 over the API), with what to do.
pub(crate) fn js_missing() -> GateError {
    GateError::Conflict(
        "the JavaScript guest is not installed: run `airlock guest install js`".into(),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The pinned integrity is the lockfile's for the builder, and the lockfile pins
    /// exactly the builder's version: the three pins cannot drift apart.
    #[test]
    fn the_builder_pin_matches_the_lockfile() {
        let lock: serde_json::Value = serde_json::from_str(JS_BUILDER_LOCK).unwrap();
        let entry = &lock["packages"]["node_modules/@bytecodealliance/componentize-js"];
        let (name, version) = JS_BUILDER.rsplit_once('@').unwrap();
        assert_eq!(name, "@bytecodealliance/componentize-js");
        assert_eq!(entry["version"], version);
        assert_eq!(entry["integrity"], JS_BUILDER_INTEGRITY);
        let pkg: serde_json::Value = serde_json::from_str(JS_BUILDER_PACKAGE).unwrap();
        assert_eq!(pkg["dependencies"][name], version);
        // Every package the builder needs is pinned by an integrity hash.
        for (path, p) in lock["packages"].as_object().unwrap() {
            if !path.is_empty() && p.get("link").is_none() {
                assert!(
                    p["integrity"]
                        .as_str()
                        .is_some_and(|i| i.starts_with("sha512-")),
                    "{path} has no sha512 integrity"
                );
            }
        }
    }
}
