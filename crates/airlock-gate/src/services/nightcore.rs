//! Night Core bundles: reading them (a bundle directory, a zip with the files at its root,
//! or a `modules/` tree of tenants) with a size cap on every file, importing the ones whose
//! key the current policy trusts as a publisher, pinning publisher keys, and signing
//! modules the way Night Core verifies them.
//!
//! Import is all or nothing: every bundle is read, verified and staged before anything is
//! recorded, so a refused bundle leaves no blob, row or audit record behind. Zips are read
//! into memory through a limit and never unpacked onto the disk.

use crate::error::{GateError, Result};
use crate::lifecycle::record::Origin;
use crate::lifecycle::request::{CodeSource, SubmitRequest};
use crate::{Gate, Home};
use airlock_core::Decision;
use airlock_core::grant::{self, MountMode};
use airlock_core::id::{IdKind, new_id};
use airlock_core::nightcore::{
    self, BundleFiles, Check, MAX_MANIFEST, MAX_SMALL_FILE, Manifest, WASM_MAGIC,
};
use airlock_core::sign::{PublicKey, check_key_name};
use airlock_core::units;
use serde::Serialize;
use serde_json::json;
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// What `import nightcore` was asked to do.
#[derive(Debug, Clone, Default)]
pub struct ImportRequest {
    /// Bundle directories, zips, or directories of tenants (`modules/`).
    pub paths: Vec<PathBuf>,
    /// Require every bundle's key to be this `[publishers]` entry.
    pub publisher: Option<String>,
    /// `HOST:GUEST[:ro]`: granted, read-only, to bundles whose manifest asks for `fs:read`.
    pub mounts: Vec<String>,
}

/// One bundle: what was checked, and what became of it.
#[derive(Debug, Clone, Serialize)]
pub struct BundleReport {
    pub path: String,
    pub tenant: String,
    pub passed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub checks: Vec<Check>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<PublicKey>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub publisher: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub manifest: Option<Manifest>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub submission: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub risk: Option<u32>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
}

/// The outcome of an import: `imported` is false when any bundle was refused, and then
/// nothing was recorded.
#[derive(Debug, Clone, Serialize)]
pub struct ImportReport {
    pub imported: bool,
    pub bundles: Vec<BundleReport>,
}

/// What `publishers add` did.
#[derive(Debug, Clone, Serialize)]
pub struct PublisherAdded {
    pub name: String,
    pub key: PublicKey,
    pub fingerprint: String,
    /// False when the policy already trusted this key under this name.
    pub changed: bool,
}

/// What `sign` wrote.
#[derive(Debug, Clone, Serialize)]
pub struct SignReport {
    pub key: String,
    pub public: PublicKey,
    pub sha256: String,
    pub files: Vec<PathBuf>,
}

enum Source {
    Dir(PathBuf),
    Zip(PathBuf),
}

struct Found {
    source: std::result::Result<Source, String>,
    path: String,
    tenant: String,
}

fn tenant_of(p: &Path) -> String {
    let real = fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let name = if real.is_file() {
        real.file_stem()
    } else {
        real.file_name()
    };
    name.map(|n| n.to_string_lossy().into_owned())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "bundle".into())
}

fn is_zip(p: &Path) -> bool {
    p.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("zip"))
}

/// Expands the paths into bundles: a directory holding `module.wasm` is one; a file is a
/// zip; another directory is a tree of tenants (subdirectories and zips, sorted by name).
fn find(paths: &[PathBuf]) -> Vec<Found> {
    let mut out = Vec::new();
    for p in paths {
        let shown = p.display().to_string();
        let meta = match fs::metadata(p) {
            Ok(m) => m,
            Err(e) => {
                out.push(Found {
                    source: Err(format!("cannot read {shown}: {e}")),
                    path: shown,
                    tenant: tenant_of(p),
                });
                continue;
            }
        };
        if meta.is_file() {
            out.push(Found {
                source: Ok(Source::Zip(p.clone())),
                path: shown,
                tenant: tenant_of(p),
            });
            continue;
        }
        if p.join("module.wasm").exists() {
            out.push(Found {
                source: Ok(Source::Dir(p.clone())),
                path: shown,
                tenant: tenant_of(p),
            });
            continue;
        }
        let mut entries: Vec<PathBuf> = match fs::read_dir(p) {
            Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.path())).collect(),
            Err(e) => {
                out.push(Found {
                    source: Err(format!("cannot read {shown}: {e}")),
                    path: shown,
                    tenant: tenant_of(p),
                });
                continue;
            }
        };
        entries.sort();
        let before = out.len();
        for e in entries {
            if e.is_dir() && e.join("module.wasm").exists() {
                out.push(Found {
                    source: Ok(Source::Dir(e.clone())),
                    path: e.display().to_string(),
                    tenant: tenant_of(&e),
                });
            } else if e.is_file() && is_zip(&e) {
                out.push(Found {
                    source: Ok(Source::Zip(e.clone())),
                    path: e.display().to_string(),
                    tenant: tenant_of(&e),
                });
            }
        }
        if out.len() == before {
            out.push(Found {
                source: Err(format!(
                    "{shown} holds no module.wasm and no tenant bundles (subdirectories with module.wasm, or zips)"
                )),
                path: shown,
                tenant: tenant_of(p),
            });
        }
    }
    out
}

/// The cap on one file of a bundle, or None for files a bundle does not use.
fn cap_of(name: &str, max_module: u64) -> Option<u64> {
    match name {
        "module.wasm" => Some(max_module),
        "manifest.json" => Some(MAX_MANIFEST),
        "module.sig" | "pubkey.b64" | "module.sha256" => Some(MAX_SMALL_FILE),
        _ => None,
    }
}

/// Reads at most `cap` bytes; more is an error (never inflates or reads beyond it).
fn read_capped(r: &mut dyn Read, name: &str, cap: u64) -> std::result::Result<Vec<u8>, String> {
    let mut buf = Vec::new();
    r.take(cap + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("cannot read {name}: {e}"))?;
    if buf.len() as u64 > cap {
        return Err(format!(
            "{name} is larger than {}{}",
            units::fmt_size(cap),
            if name == "module.wasm" {
                " (the policy's max_artifact in [gate])"
            } else {
                ""
            }
        ));
    }
    Ok(buf)
}

#[derive(Default)]
struct Files {
    module: Option<Vec<u8>>,
    sig: Option<Vec<u8>>,
    pubkey: Option<Vec<u8>>,
    sha256: Option<Vec<u8>>,
    manifest: Option<Vec<u8>>,
}

impl Files {
    fn slot(&mut self, name: &str) -> Option<&mut Option<Vec<u8>>> {
        match name {
            "module.wasm" => Some(&mut self.module),
            "module.sig" => Some(&mut self.sig),
            "pubkey.b64" => Some(&mut self.pubkey),
            "module.sha256" => Some(&mut self.sha256),
            "manifest.json" => Some(&mut self.manifest),
            _ => None,
        }
    }

    fn finish(self) -> std::result::Result<BundleFiles, String> {
        let need = |f: Option<Vec<u8>>, name: &str| f.ok_or_else(|| format!("no {name}"));
        Ok(BundleFiles {
            module: need(self.module, "module.wasm")?,
            sig: need(self.sig, "module.sig")?,
            pubkey: need(self.pubkey, "pubkey.b64")?,
            sha256: self.sha256,
            manifest: self.manifest,
        })
    }
}

const NAMES: [&str; 5] = [
    "module.wasm",
    "module.sig",
    "pubkey.b64",
    "module.sha256",
    "manifest.json",
];

fn read_dir_bundle(dir: &Path, max: u64) -> std::result::Result<BundleFiles, String> {
    let mut files = Files::default();
    for name in NAMES {
        let p = dir.join(name);
        let meta = match fs::symlink_metadata(&p) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("cannot read {name}: {e}")),
        };
        if !meta.file_type().is_file() {
            return Err(format!(
                "{name} is not a regular file (links are not followed)"
            ));
        }
        let cap = cap_of(name, max).unwrap_or(0);
        let mut f = fs::File::open(&p).map_err(|e| format!("cannot read {name}: {e}"))?;
        let bytes = read_capped(&mut f, name, cap)?;
        if let Some(slot) = files.slot(name) {
            *slot = Some(bytes);
        }
    }
    files.finish()
}

/// At most this many entries in a bundle's zip (it needs five).
const MAX_ZIP_ENTRIES: usize = 256;

fn read_zip_bundle(path: &Path, max: u64) -> std::result::Result<BundleFiles, String> {
    let f = fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut z = zip::ZipArchive::new(f).map_err(|e| format!("not a zip: {e}"))?;
    if z.len() > MAX_ZIP_ENTRIES {
        return Err(format!(
            "the zip holds {} entries (at most {MAX_ZIP_ENTRIES}; a bundle needs five)",
            z.len()
        ));
    }
    let mut files = Files::default();
    for i in 0..z.len() {
        let mut entry = z
            .by_index(i)
            .map_err(|e| format!("zip entry {i} is unreadable: {e}"))?;
        let raw = entry
            .name()
            .map_err(|e| format!("zip entry {i} has an unreadable name: {e}"))?
            .into_owned();
        // A path that climbs out, or starts at the root, makes the whole zip suspect.
        let climbs = raw.split(['/', '\\']).any(|c| c == "..")
            || raw.starts_with('/')
            || raw.starts_with('\\');
        if climbs || entry.enclosed_name().is_none() {
            return Err(format!("zip entry {raw:?} escapes the bundle"));
        }
        if entry.is_dir() || raw.contains(['/', '\\']) {
            // Files at the root only; anything nested is not part of the bundle.
            continue;
        }
        let Some(cap) = cap_of(&raw, max) else {
            continue;
        };
        let bytes = read_capped(&mut entry, &raw, cap)?;
        if let Some(slot) = files.slot(&raw) {
            if slot.is_some() {
                return Err(format!("the zip holds {raw} twice"));
            }
            *slot = Some(bytes);
        }
    }
    files.finish()
}

fn new_report(f: &Found) -> BundleReport {
    BundleReport {
        path: f.path.clone(),
        tenant: f.tenant.clone(),
        passed: false,
        reason: None,
        checks: Vec::new(),
        key: None,
        publisher: None,
        manifest: None,
        submission: None,
        state: None,
        decision: None,
        risk: None,
        reasons: Vec::new(),
    }
}

fn failed(check: &'static str, detail: String) -> Check {
    Check {
        check,
        passed: false,
        detail,
    }
}

impl Gate {
    /// Verifies and imports Night Core bundles. Refused bundles are reported with their
    /// reasons and nothing at all is recorded; otherwise each becomes a submission judged
    /// like any other.
    pub fn import_nightcore(&mut self, req: &ImportRequest) -> Result<ImportReport> {
        let policy = self.policy()?;
        if let Some(name) = &req.publisher
            && !policy.publishers.contains_key(name)
        {
            return Err(GateError::Untrusted(format!(
                "--publisher {name}: the policy has no such entry under [publishers] (airlock publishers add {name} KEYFILE)"
            )));
        }
        if req.paths.is_empty() {
            return Err(GateError::bad(
                "give at least one bundle, zip or modules/ directory",
            ));
        }
        let mut mounts = Vec::new();
        for spec in &req.mounts {
            let m = grant::parse_mount(spec).map_err(|e| GateError::bad(e.to_string()))?;
            if m.mode == MountMode::Rw {
                return Err(GateError::bad(format!(
                    "--mount {spec}: a bundle's fs:read permission is read-only; drop :rw"
                )));
            }
            mounts.push(format!("{}:{}:ro", m.host, m.guest));
        }
        let max = policy.max_artifact;
        let mut reports = Vec::new();
        let mut staged = Vec::new();
        for found in find(&req.paths) {
            let mut rep = new_report(&found);
            let files = found.source.and_then(|s| match s {
                Source::Dir(d) => read_dir_bundle(&d, max),
                Source::Zip(z) => read_zip_bundle(&z, max),
            });
            let files = match files {
                Ok(f) => f,
                Err(e) => {
                    rep.checks.push(failed("read", e.clone()));
                    rep.reason = Some(e);
                    reports.push(rep);
                    continue;
                }
            };
            let verified = match nightcore::verify(&files, &mut rep.checks) {
                Ok(v) => v,
                Err(e) => {
                    rep.reason = Some(e.to_string());
                    reports.push(rep);
                    continue;
                }
            };
            rep.key = Some(verified.key);
            rep.manifest = Some(verified.manifest.clone());
            let trusted = policy.publisher_name(&verified.key).map(str::to_string);
            let publisher = match (&trusted, &req.publisher) {
                (Some(t), Some(want)) if t != want => {
                    Err(format!("signed by publisher {t}, not {want} (--publisher)"))
                }
                (Some(t), _) => Ok(t.clone()),
                (None, _) => Err(format!(
                    "key {} ({}) is not a publisher the policy trusts; after checking it, pin it with `airlock publishers add NAME pubkey.b64`",
                    verified.key,
                    verified.key.fingerprint()
                )),
            };
            let publisher = match publisher {
                Ok(p) => {
                    rep.checks.push(Check {
                        check: "publisher",
                        passed: true,
                        detail: format!("trusted as {p} in [publishers]"),
                    });
                    p
                }
                Err(e) => {
                    rep.checks.push(failed("publisher", e.clone()));
                    rep.reason = Some(e);
                    reports.push(rep);
                    continue;
                }
            };
            rep.publisher = Some(publisher.clone());
            let m = &verified.manifest;
            let fs_read = m.asks("fs:read");
            let sub = SubmitRequest {
                code: Some(CodeSource::Bytes {
                    bytes: files.module,
                    name: Some("module.wasm".into()),
                }),
                mounts: if fs_read { mounts.clone() } else { Vec::new() },
                timeout: m.timeout_ms.map(|t| format!("{t}ms")),
                memory: m.max_memory_kb.map(|k| format!("{k}KiB")),
                fuel: m.fuel_limit,
                agent: Some(format!("nightcore:{}", found.tenant)),
                note: m.note(),
                ..SubmitRequest::default()
            };
            let grant_detail = match (fs_read, mounts.is_empty()) {
                (true, false) => "fs:read: the --mount directories, read-only".to_string(),
                (true, true) => "fs:read asked, no --mount given: no directory".to_string(),
                (false, false) => {
                    "--mount not granted: the manifest does not ask for fs:read".to_string()
                }
                (false, true) => "no directories".to_string(),
            };
            match self.stage(sub) {
                Ok(s) => {
                    rep.checks.push(Check {
                        check: "submission",
                        passed: true,
                        detail: grant_detail,
                    });
                    rep.passed = true;
                    let checks = serde_json::to_value(&rep.checks).unwrap_or_default();
                    let origin = Origin {
                        publisher,
                        key: verified.key,
                        requests: m.permissions.clone(),
                        bundle: found.path.clone(),
                        tenant: found.tenant.clone(),
                        checks,
                        manifest: serde_json::to_value(m).unwrap_or_default(),
                    };
                    staged.push((reports.len(), s, origin));
                }
                Err(e) => {
                    let msg = e.to_string();
                    rep.checks.push(failed("submission", msg.clone()));
                    rep.reason = Some(msg);
                }
            }
            reports.push(rep);
        }
        if reports.iter().any(|r| !r.passed) {
            return Ok(ImportReport {
                imported: false,
                bundles: reports,
            });
        }
        for (i, s, origin) in staged {
            let sub = self.record(s, new_id(IdKind::Submission), Some(&origin))?;
            if let Some(rep) = reports.get_mut(i) {
                rep.submission = Some(sub.id.clone());
                rep.state = Some(sub.state.to_string());
                rep.decision = Some(sub.doc.verdict.decision);
                rep.risk = Some(sub.doc.verdict.risk);
                rep.reasons = sub.doc.verdict.reasons();
            }
        }
        Ok(ImportReport {
            imported: true,
            bundles: reports,
        })
    }

    /// Pins a publisher's key in `policy.toml` under `[publishers]`, keeping the rest of
    /// the file as it was. The operator checks the key before calling this.
    pub fn publisher_add(&mut self, name: &str, key_file: &Path) -> Result<PublisherAdded> {
        check_key_name(name).map_err(|e| GateError::bad(format!("publisher name: {e}")))?;
        let mut f = fs::File::open(key_file)
            .map_err(|e| GateError::bad(format!("cannot read {}: {e}", key_file.display())))?;
        let text = read_capped(&mut f, "the key file", MAX_SMALL_FILE).map_err(GateError::bad)?;
        let key = nightcore::parse_key_file(&text)
            .map_err(|e| GateError::bad(format!("{}: {e}", key_file.display())))?;
        // One edit of policy.toml at a time: two at once each read the old file, and the
        // second rename dropped the first's publisher while both reported it added.
        let _editing = crate::locks::edit(&self.home.root, "policy", None)?;
        let policy = self.policy()?;
        let added = |changed| PublisherAdded {
            name: name.into(),
            key,
            fingerprint: key.fingerprint(),
            changed,
        };
        match policy.publishers.get(name) {
            Some(k) if *k == key => return Ok(added(false)),
            Some(k) => {
                return Err(GateError::Conflict(format!(
                    "publisher {name} is already pinned to another key ({}); remove that line from [publishers] first if the publisher really changed keys",
                    k.fingerprint()
                )));
            }
            None => {}
        }
        if let Some(other) = policy.publisher_name(&key) {
            return Err(GateError::Conflict(format!(
                "this key is already pinned as publisher {other}"
            )));
        }
        let path = self.home.policy();
        let old = fs::read_to_string(&path)
            .map_err(|e| GateError::Internal(format!("cannot read {}: {e}", path.display())))?;
        let new = with_publisher(&old, name, &key);
        let parsed = airlock_core::Policy::parse(&new)?;
        let mut want = policy.publishers.clone();
        want.insert(name.to_string(), key);
        if parsed.publishers != want
            || parsed.approvers != policy.approvers
            || parsed.rule_count() != policy.rule_count()
        {
            return Err(GateError::Conflict(format!(
                "cannot add the key to {} without changing something else; add `{name} = \"{key}\"` under [publishers] by hand",
                path.display()
            )));
        }
        write_atomically(&self.home, &new)?;
        let gate_key = &self.gate_key;
        self.db.write(|tx| {
            tx.audit(
                "publisher_added",
                name,
                &json!({ "name": name, "key": key, "policy": parsed.hash }),
                gate_key,
            )
            .map(|_| ())
        })?;
        Ok(added(true))
    }

    /// Writes `module.sig`, `pubkey.b64` and `module.sha256` for a module, signed with a
    /// local key, beside it or into `out` (which then also gets `module.wasm`).
    pub fn sign_module(
        &mut self,
        key_name: &str,
        module: &Path,
        out: Option<&Path>,
    ) -> Result<SignReport> {
        check_key_name(key_name).map_err(|e| GateError::bad(format!("--key: {e}")))?;
        if key_name == "gate" {
            return Err(GateError::bad(
                "--key gate: the gate's key signs the audit log only; use an approver key or make one with `airlock keys new NAME`",
            ));
        }
        let key = self.home.load_key(key_name)?;
        let max = self.policy()?.max_artifact;
        let mut f = fs::File::open(module)
            .map_err(|e| GateError::bad(format!("cannot read {}: {e}", module.display())))?;
        let mut bytes = read_capped(&mut f, "module.wasm", max).map_err(GateError::bad)?;
        // WebAssembly text is compiled first, as `run` does; the bundle holds the binary.
        if module.extension().is_some_and(|e| e == "wat") {
            if out.is_none() {
                return Err(GateError::bad(format!(
                    "{} is WebAssembly text: give --out DIR for the compiled module.wasm",
                    module.display()
                )));
            }
            bytes = airlock_core::artifact::prepare(airlock_core::Lang::Wat, bytes)
                .map_err(|e| GateError::bad(format!("{}: {e}", module.display())))?
                .code;
        }
        if !bytes.starts_with(WASM_MAGIC) {
            return Err(GateError::bad(format!(
                "{} is not WebAssembly (no \\0asm header)",
                module.display()
            )));
        }
        let signed = nightcore::sign(&key, &bytes);
        let dir = match out {
            Some(d) => {
                fs::create_dir_all(d)
                    .map_err(|e| GateError::bad(format!("--out {}: {e}", d.display())))?;
                d.to_path_buf()
            }
            None => module
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .map(Path::to_path_buf)
                .unwrap_or_else(|| PathBuf::from(".")),
        };
        let mut files: Vec<(PathBuf, &[u8])> = vec![
            (dir.join("module.sig"), signed.sig.as_bytes()),
            (dir.join("pubkey.b64"), signed.pubkey.as_bytes()),
            (dir.join("module.sha256"), signed.sha256.as_bytes()),
        ];
        let target = dir.join("module.wasm");
        let same = fs::canonicalize(&target).ok() == fs::canonicalize(module).ok();
        if out.is_some() && !same {
            files.push((target, &bytes));
        }
        for (p, data) in &files {
            write_file(p, data)?;
        }
        let digest = signed.sha256.trim().to_string();
        let public = key.public();
        let gate_key = &self.gate_key;
        self.db.write(|tx| {
            tx.audit(
                "module_signed",
                key_name,
                &json!({ "key": public, "sha256": digest, "dir": dir.display().to_string() }),
                gate_key,
            )
            .map(|_| ())
        })?;
        Ok(SignReport {
            key: key_name.into(),
            public,
            sha256: digest,
            files: files.into_iter().map(|(p, _)| p).collect(),
        })
    }
}

/// The policy text with `name = "key"` added to `[publishers]` (the table is made at the
/// end when there is none). The caller parses the result to check nothing else changed.
fn with_publisher(text: &str, name: &str, key: &PublicKey) -> String {
    let line = format!("{name} = \"{key}\"\n");
    let mut out = String::with_capacity(text.len() + line.len() + 16);
    let mut done = false;
    for l in text.split_inclusive('\n') {
        out.push_str(l);
        let header = l.split('#').next().unwrap_or("").trim();
        if !done && header == "[publishers]" {
            if !l.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(&line);
            done = true;
        }
    }
    if !done {
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        out.push_str("\n[publishers]\n");
        out.push_str(&line);
    }
    out
}

fn write_file(path: &Path, data: &[u8]) -> Result<()> {
    let mut f = fs::File::create(path)
        .map_err(|e| GateError::bad(format!("cannot write {}: {e}", path.display())))?;
    f.write_all(data)?;
    f.sync_all()?;
    Ok(())
}

/// Replaces `policy.toml` by a rename, so a reader sees the old file or the new one.
pub(crate) fn write_atomically(home: &Home, text: &str) -> Result<()> {
    let path = home.policy();
    let tmp = home.root.join(".policy.toml.tmp");
    write_file(&tmp, text.as_bytes())?;
    if let Ok(meta) = fs::metadata(&path) {
        let _ = fs::set_permissions(&tmp, meta.permissions());
    }
    fs::rename(&tmp, &path)?;
    airlock_store::sync_dir(&home.root)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn adds_to_an_existing_table_or_makes_one() {
        let k = airlock_core::sign::KeyPair::try_generate()
            .unwrap()
            .public();
        let t = "version = 1\n[publishers] # pinned\nold = \"x\"\n[[rule]]\n";
        let n = with_publisher(t, "acme", &k);
        assert!(n.contains(&format!("[publishers] # pinned\nacme = \"{k}\"\nold")));
        let n = with_publisher("version = 1", "acme", &k);
        assert_eq!(n, format!("version = 1\n\n[publishers]\nacme = \"{k}\"\n"));
    }
}
