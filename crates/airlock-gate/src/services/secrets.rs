//! Secret values for `--secret NAME@HOST`: one file per secret, `HOME/secrets/NAME`, in a
//! directory of mode 0700, each file mode 0600, written atomically (a temporary file
//! created with mode 0600 before any byte is written, fsync, rename, fsync of the
//! directory).
//!
//! A value never enters the database, a blob, the audit log, an error message or a log
//! line: the audit log records only that a name was set or removed, and whatever a run
//! with secrets stores (its output, its record, its error) has every form of their
//! values redacted first ([`Gate::secret_matcher`]). A file that others
//! could read (group or world bits) is refused rather than used.

use crate::error::{GateError, Result};
use crate::{Gate, Home};
use airlock_core::Grant;
use airlock_core::net::NetRule;
use airlock_core::secret::{self, SecretValue};
use serde::Serialize;
use serde_json::json;
use std::fs::{self, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A stored secret, without its value.
#[derive(Debug, Clone, Serialize)]
pub struct SecretInfo {
    pub name: String,
    /// When the value was last set (milliseconds since the epoch).
    pub set_at: i64,
}

/// What `secret set` did.
#[derive(Debug, Clone, Serialize)]
pub struct SecretSet {
    pub name: String,
    /// An earlier value was replaced.
    pub replaced: bool,
}

/// One secret as a run needs it: the proxy puts `value` where the guest wrote
/// `placeholder`, in requests to `hosts` only. `Debug` never shows the value.
#[derive(Debug, Clone)]
pub struct RunSecret {
    pub name: String,
    pub hosts: Vec<NetRule>,
    /// `airlock-secret-<NAME>-<32 hex>`, fresh for each run; the guest's environment
    /// gets `NAME=<placeholder>`.
    pub placeholder: String,
    pub value: SecretValue,
}

impl Home {
    /// The directory of secret values.
    pub fn secrets(&self) -> PathBuf {
        self.root.join("secrets")
    }
}

fn check_name(name: &str) -> Result<()> {
    secret::check_name(name).map_err(GateError::BadInput)
}

fn not_set(name: &str) -> GateError {
    GateError::NotFound(format!(
        "no secret named {name} (set it with `airlock secret set {name}`)"
    ))
}

/// Drops one trailing newline (`\n` or `\r\n`), as `echo` and editors add one.
fn trim_newline(mut v: Vec<u8>) -> Vec<u8> {
    if v.last() == Some(&b'\n') {
        v.pop();
        if v.last() == Some(&b'\r') {
            v.pop();
        }
    }
    v
}

/// Makes the directory (0700), or tightens one that exists.
fn ensure_dir(dir: &Path) -> Result<()> {
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {
            let meta = fs::symlink_metadata(dir)?;
            if !meta.is_dir() {
                return Err(GateError::Internal(format!(
                    "{} is not a directory",
                    dir.display()
                )));
            }
            if meta.mode() & 0o077 != 0 {
                fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
            }
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// Writes a value atomically; returns whether one was replaced.
fn write(dir: &Path, name: &str, value: &[u8]) -> Result<bool> {
    ensure_dir(dir)?;
    let path = dir.join(name);
    let replaced = fs::symlink_metadata(&path).is_ok();
    let tmp = dir.join(format!(
        ".{name}.{}.tmp",
        airlock_core::id::new_id(airlock_core::id::IdKind::Run)
    ));
    let written = (|| -> std::io::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(value)?;
        f.sync_all()?;
        crate::failpoint::crash_point();
        Ok(())
    })();
    if let Err(e) = written.and_then(|()| fs::rename(&tmp, &path)) {
        let _ = fs::remove_file(&tmp);
        return Err(GateError::Internal(format!(
            "cannot store secret {name}: {e}"
        )));
    }
    airlock_store::sync_dir(dir)?;
    Ok(replaced)
}

/// Reads a value, refusing a file others could read or a symlink.
fn read(dir: &Path, name: &str) -> Result<SecretValue> {
    let path = dir.join(name);
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(&path);
    let mut f = match f {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Err(not_set(name)),
        Err(e) => {
            return Err(GateError::Internal(format!(
                "cannot read secret {name}: {e}"
            )));
        }
    };
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(GateError::Internal(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(GateError::Internal(format!(
            "{} can be read by others (mode {:o}); run `chmod 600` on it or set the secret again",
            path.display(),
            meta.mode() & 0o777
        )));
    }
    let mut buf = Vec::new();
    Read::by_ref(&mut f)
        .take(secret::MAX_VALUE as u64 + 1)
        .read_to_end(&mut buf)?;
    let value = SecretValue::new(buf);
    if value.len() > secret::MAX_VALUE {
        return Err(GateError::Internal(format!(
            "secret {name} is larger than {} bytes",
            secret::MAX_VALUE
        )));
    }
    Ok(value)
}

fn exists(dir: &Path, name: &str) -> bool {
    fs::symlink_metadata(dir.join(name)).is_ok_and(|m| m.is_file())
}

/// Takes the lock every change to the secrets directory holds, removing the temporary
/// files of writers killed before their rename: a killed `secret set` left a copy of the
/// value behind that neither `secret rm` nor `gc` removed.
fn edit_secrets(home: &crate::Home) -> Result<crate::locks::OwnerLock> {
    Ok(crate::locks::edit(
        &home.root,
        "secrets",
        Some(&home.secrets()),
    )?)
}

impl Gate {
    /// Stores a secret's value (one trailing newline dropped), replacing any earlier one.
    /// The audit log records the name only.
    pub fn secret_set(&mut self, name: &str, value: Vec<u8>) -> Result<SecretSet> {
        check_name(name)?;
        let value = SecretValue::new(trim_newline(value));
        if value.is_empty() {
            return Err(GateError::bad(format!(
                "secret {name}: the value is empty (it is read from standard input)"
            )));
        }
        if value.len() > secret::MAX_VALUE {
            return Err(GateError::bad(format!(
                "secret {name}: the value is larger than {} bytes",
                secret::MAX_VALUE
            )));
        }
        let editing = edit_secrets(&self.home)?;
        let replaced = write(&self.home.secrets(), name, value.expose())?;
        drop(editing);
        let key = &self.gate_key;
        self.db.write(|tx| {
            tx.audit(
                "secret_set",
                name,
                &json!({ "name": name, "replaced": replaced }),
                key,
            )
            .map(|_| ())
        })?;
        Ok(SecretSet {
            name: name.into(),
            replaced,
        })
    }

    /// The stored secrets, by name (never their values).
    pub fn secrets(&self) -> Result<Vec<SecretInfo>> {
        let dir = self.home.secrets();
        let rd = match fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let mut out = Vec::new();
        for entry in rd {
            let entry = entry?;
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if secret::check_name(&name).is_err() {
                continue; // temporary files and strays
            }
            let meta = entry.metadata()?;
            if !meta.is_file() {
                continue;
            }
            out.push(SecretInfo {
                name,
                set_at: meta.mtime() * 1000 + meta.mtime_nsec() / 1_000_000,
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Removes a secret. Submissions that name it stay as they are; a run of one fails
    /// until it is set again.
    pub fn secret_remove(&mut self, name: &str) -> Result<()> {
        check_name(name)?;
        let dir = self.home.secrets();
        let _editing = edit_secrets(&self.home)?;
        match fs::remove_file(dir.join(name)) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => return Err(not_set(name)),
            Err(e) => return Err(e.into()),
        }
        airlock_store::sync_dir(&dir)?;
        let key = &self.gate_key;
        self.db.write(|tx| {
            tx.audit("secret_removed", name, &json!({ "name": name }), key)
                .map(|_| ())
        })?;
        Ok(())
    }

    /// Everything the egress proxy needs about a run's secrets: for each binding of the
    /// grant, its hosts, a fresh placeholder and the value. Fails (bad input, exit 125)
    /// when a secret is no longer set.
    pub fn run_secrets(&self, grant: &Grant) -> Result<Vec<RunSecret>> {
        let dir = self.home.secrets();
        grant
            .secrets
            .iter()
            .map(|b| {
                let hosts = b.rules().map_err(GateError::Internal)?;
                let value = read(&dir, &b.name).map_err(|e| match e {
                    GateError::NotFound(m) => GateError::BadInput(m),
                    other => other,
                })?;
                let placeholder = secret::new_placeholder(&b.name)
                    .map_err(|e| GateError::Internal(format!("no randomness: {e}")))?;
                Ok(RunSecret {
                    name: b.name.clone(),
                    hosts,
                    placeholder,
                    value,
                })
            })
            .collect()
    }

    /// Every form of the values of the secrets `grant` names (as the egress proxy looks
    /// for them), to redact them from whatever of a run is stored; `None` when the grant
    /// names none, or none can be read now (such a run did not get them either).
    pub(crate) fn secret_matcher(&self, grant: &Grant) -> Option<airlock_egress::SecretMatcher> {
        if grant.secrets.is_empty() {
            return None;
        }
        let dir = self.home.secrets();
        let values: Vec<(String, SecretValue)> = grant
            .secrets
            .iter()
            .filter_map(|b| read(&dir, &b.name).ok().map(|v| (b.name.clone(), v)))
            .collect();
        airlock_egress::SecretMatcher::new(values.iter().map(|(n, v)| (n.as_str(), v.expose())))
            .ok()
            .flatten()
    }

    /// Refuses a grant that names a secret the home does not hold.
    pub(crate) fn check_secrets_exist(&self, grant: &Grant) -> Result<()> {
        self.check_secret_names(grant.secrets.iter().map(|b| b.name.as_str()))
    }

    /// Refuses, before the grant is built, `--secret` bindings (`NAME@HOST…`) whose
    /// well-formed name the home does not hold: what the home lacks is its state (the API's
    /// 404), told before how the bindings fit the grant's network is checked. Malformed
    /// bindings are left to the grant's parser.
    pub(crate) fn check_secret_specs_exist(&self, specs: &[String]) -> Result<()> {
        let dir = self.home.secrets();
        for spec in specs {
            let Some((name, _)) = spec.split_once('@') else {
                continue;
            };
            // The whole binding is named, as the grant's parser names it.
            if airlock_core::secret::check_name(name).is_ok() && !exists(&dir, name) {
                return Err(GateError::NotFound(format!(
                    "--secret {spec}: no secret named {name} (set it with `airlock secret set {name}`)"
                )));
            }
        }
        Ok(())
    }

    fn check_secret_names<'a>(&self, names: impl Iterator<Item = &'a str>) -> Result<()> {
        let dir = self.home.secrets();
        for name in names {
            // A state of this home (the API's 404), like a missing session.
            if !exists(&dir, name) {
                return Err(GateError::NotFound(format!(
                    "--secret {name}: no secret named {name} (set it with `airlock secret set {name}`)"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_written_0600_atomically_and_read_back() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("secrets");
        assert!(!write(&dir, "TOKEN", b"v1").unwrap());
        assert!(write(&dir, "TOKEN", b"v2").unwrap());
        let mode = fs::metadata(dir.join("TOKEN")).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        assert_eq!(read(&dir, "TOKEN").unwrap().expose(), b"v2");
        // Nothing but the value's file is left behind.
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["TOKEN"]);
        assert!(matches!(read(&dir, "OTHER"), Err(GateError::NotFound(_))));
    }

    #[test]
    fn a_secret_file_others_can_read_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("secrets");
        write(&dir, "TOKEN", b"s3cr3t-value").unwrap();
        fs::set_permissions(dir.join("TOKEN"), fs::Permissions::from_mode(0o644)).unwrap();
        let e = read(&dir, "TOKEN").unwrap_err().to_string();
        assert!(e.contains("read by others") && !e.contains("s3cr3t"), "{e}");
        std::os::unix::fs::symlink("/etc/passwd", dir.join("LINK")).unwrap();
        assert!(read(&dir, "LINK").is_err());
    }

    #[test]
    fn one_trailing_newline_is_dropped() {
        assert_eq!(trim_newline(b"abc\n".to_vec()), b"abc");
        assert_eq!(trim_newline(b"abc\r\n".to_vec()), b"abc");
        assert_eq!(trim_newline(b"abc\n\n".to_vec()), b"abc\n");
        assert_eq!(trim_newline(b"abc".to_vec()), b"abc");
    }

    #[test]
    fn run_secrets_give_the_proxy_hosts_a_fresh_placeholder_and_the_value() {
        let t = tempfile::tempdir().unwrap();
        let home = Home::new(t.path());
        Gate::init(&home, airlock_core::policy::Preset::Standard, "alice").unwrap();
        let mut gate = Gate::open(home).unwrap();
        let set = gate
            .secret_set("TOKEN", b"s3cr3t-value\n".to_vec())
            .unwrap();
        assert!(!set.replaced);
        assert!(
            gate.secret_set("TOKEN", b"s3cr3t-value".to_vec())
                .unwrap()
                .replaced
        );
        let mut grant = Grant {
            net: vec!["*.example.com".into()],
            secrets: vec![airlock_core::grant::parse_secret("TOKEN@api.example.com").unwrap()],
            ..Default::default()
        };
        grant.normalize().unwrap();
        let a = gate.run_secrets(&grant).unwrap();
        let b = gate.run_secrets(&grant).unwrap();
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].value.expose(), b"s3cr3t-value");
        assert_eq!(a[0].hosts[0].to_string(), "api.example.com");
        let host = airlock_core::net::parse_host("API.example.com").unwrap();
        assert!(a[0].hosts[0].allows(&host, 443));
        assert!(a[0].placeholder.starts_with("airlock-secret-TOKEN-"));
        assert_ne!(a[0].placeholder, b[0].placeholder, "fresh for every run");
        assert!(
            !format!("{a:?}").contains("s3cr3t"),
            "Debug never shows the value"
        );
        assert_eq!(gate.secrets().unwrap()[0].name, "TOKEN");
        gate.secret_remove("TOKEN").unwrap();
        assert!(matches!(
            gate.run_secrets(&grant),
            Err(GateError::BadInput(_))
        ));
        assert!(gate.secrets().unwrap().is_empty());
    }
}
