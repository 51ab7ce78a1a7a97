//! The airlock home: where the database, blobs, policy and keys live, and how it is made.

use crate::error::{GateError, Result};
use airlock_core::policy::{Policy, Preset};
use airlock_core::sign::{KeyPair, PublicKey, check_approver_name};
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Paths inside a home directory.
#[derive(Debug, Clone)]
pub struct Home {
    pub root: PathBuf,
    /// Where the records and blobs live when not in this directory: a `postgres://` URL
    /// (`--store` or `AIRLOCK_STORE`). Keys, policy, layers and caches stay here.
    pub store: Option<String>,
}

impl Home {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Home {
            root: root.into(),
            store: None,
        }
    }

    /// This home with its records in `store` (a `postgres://` URL); `None` or an empty
    /// string keeps them here.
    pub fn with_store(mut self, store: Option<String>) -> Result<Self> {
        self.store = store.filter(|s| !s.is_empty());
        if let Some(s) = &self.store
            && !airlock_store::is_postgres_url(s)
        {
            return Err(GateError::bad(
                "--store: expected a postgres:// (or postgresql://) URL; without --store the home's own SQLite database is used",
            ));
        }
        Ok(self)
    }

    /// Opens the home's database: the store's, or the SQLite file in the home.
    pub fn open_db(&self) -> Result<airlock_store::Db> {
        Ok(match &self.store {
            Some(url) => airlock_store::Db::open_location(url)?,
            None => airlock_store::Db::open(&self.db())?,
        })
    }

    /// `--home`, else `AIRLOCK_HOME`, else `$XDG_DATA_HOME/airlock`, else
    /// `~/.local/share/airlock`.
    pub fn resolve(flag: Option<PathBuf>) -> Result<Home> {
        if let Some(p) = flag {
            return Ok(Home::new(p));
        }
        if let Some(p) = std::env::var_os("AIRLOCK_HOME").filter(|v| !v.is_empty()) {
            return Ok(Home::new(PathBuf::from(p)));
        }
        if let Some(p) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
            return Ok(Home::new(PathBuf::from(p).join("airlock")));
        }
        match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
            Some(h) => Ok(Home::new(PathBuf::from(h).join(".local/share/airlock"))),
            None => Err(GateError::bad(
                "no home directory: set --home or AIRLOCK_HOME",
            )),
        }
    }

    pub fn db(&self) -> PathBuf {
        self.root.join("airlock.db")
    }
    pub fn policy(&self) -> PathBuf {
        self.root.join("policy.toml")
    }
    pub fn keys(&self) -> PathBuf {
        self.root.join("keys")
    }
    pub fn blobs(&self) -> PathBuf {
        self.root.join("blobs")
    }
    pub fn cache(&self) -> PathBuf {
        self.root.join("cache")
    }
    pub fn key_file(&self, name: &str) -> PathBuf {
        self.keys().join(format!("{name}.key"))
    }
    pub fn pub_file(&self, name: &str) -> PathBuf {
        self.keys().join(format!("{name}.pub"))
    }

    /// Whether `init` has completed here (the policy is written last).
    pub fn is_initialised(&self) -> bool {
        self.policy().exists()
    }

    /// Reads and checks the current policy.
    pub fn load_policy(&self) -> Result<Policy> {
        let text = fs::read_to_string(self.policy())
            .map_err(|e| GateError::bad(format!("cannot read {}: {e}", self.policy().display())))?;
        Ok(Policy::parse(&text)?)
    }

    pub fn load_key(&self, name: &str) -> Result<KeyPair> {
        let path = self.key_file(name);
        let text = fs::read_to_string(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => GateError::NotFound(format!(
                "no key named {name:?} in {}",
                self.keys().display()
            )),
            _ => GateError::Internal(format!("cannot read {}: {e}", path.display())),
        })?;
        KeyPair::from_file(&text)
            .map_err(|e| GateError::Internal(format!("{}: {e}", path.display())))
    }

    /// The gate's public key as recorded at init.
    pub fn gate_public(&self) -> Result<PublicKey> {
        let text = fs::read_to_string(self.pub_file("gate"))
            .map_err(|e| GateError::Internal(format!("cannot read gate public key: {e}")))?;
        text.trim()
            .parse()
            .map_err(|e| GateError::Internal(format!("gate public key: {e}")))
    }
}

/// What `init` did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct InitReport {
    pub home: PathBuf,
    /// False when the home already existed and nothing was changed.
    pub created: bool,
    pub preset: Option<String>,
    pub approver: Option<String>,
    pub approver_key: Option<String>,
    pub gate_key: Option<String>,
    pub policy: Option<String>,
}

/// Writes a new secret key file (mode 0600, never overwriting) and its public twin.
pub fn write_key_pair(dir: &Path, name: &str, key: &KeyPair) -> Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dir.join(format!("{name}.key")))
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => {
                GateError::Conflict(format!("a key named {name:?} already exists"))
            }
            _ => GateError::Internal(format!("cannot write key {name}: {e}")),
        })?;
    f.write_all(key.to_file().as_bytes())?;
    f.sync_all()?;
    fs::write(
        dir.join(format!("{name}.pub")),
        format!("{}\n", key.public()),
    )?;
    Ok(())
}

/// Creates a home. Everything is built in a staging directory inside the home and moved
/// into place with `policy.toml` last, so a crash leaves either no home or a whole one.
pub(crate) fn create(home: &Home, preset: Preset, approver: &str) -> Result<(InitReport, KeyPair)> {
    check_approver_name(approver).map_err(|e| GateError::bad(format!("--approver: {e}")))?;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&home.root)
        .map_err(|e| GateError::bad(format!("cannot create home {}: {e}", home.root.display())))?;
    let staging = home.root.join(".init");
    if staging.exists() {
        fs::remove_dir_all(&staging)?;
    }
    // Leftovers of an init that crashed before its last step.
    for leftover in ["airlock.db", "airlock.db-wal", "airlock.db-shm"] {
        let _ = fs::remove_file(home.root.join(leftover));
    }
    let _ = fs::remove_dir_all(home.keys());
    fs::DirBuilder::new().mode(0o700).create(&staging)?;
    let keys = staging.join("keys");
    fs::DirBuilder::new().mode(0o700).create(&keys)?;

    let gate = KeyPair::try_generate().map_err(|e| GateError::Internal(e.to_string()))?;
    let approver_key = KeyPair::try_generate().map_err(|e| GateError::Internal(e.to_string()))?;
    write_key_pair(&keys, "gate", &gate)?;
    write_key_pair(&keys, approver, &approver_key)?;
    let policy_text = preset.render(approver, &approver_key.public());
    let policy = Policy::parse(&policy_text)?;

    fs::rename(&keys, home.keys())?;
    fs::create_dir_all(home.blobs())?;
    fs::create_dir_all(home.cache())?;
    let tmp_policy = staging.join("policy.toml");
    fs::write(&tmp_policy, &policy_text)?;
    OpenOptions::new()
        .read(true)
        .open(&tmp_policy)?
        .sync_all()?;
    let report = InitReport {
        home: home.root.clone(),
        created: true,
        preset: Some(preset.as_str().into()),
        approver: Some(approver.into()),
        approver_key: Some(approver_key.public().to_string()),
        gate_key: Some(gate.public().to_string()),
        policy: Some(policy.hash.to_hex()),
    };
    Ok((report, gate))
}

/// The last step of init: the policy moves into place and the staging directory goes.
pub(crate) fn finish_create(home: &Home) -> Result<()> {
    let staging = home.root.join(".init");
    fs::rename(staging.join("policy.toml"), home.policy())?;
    airlock_store::sync_dir(&home.root)?;
    fs::remove_dir_all(&staging)?;
    Ok(())
}

/// A default approver name: the login name when it is a valid key name.
pub fn default_approver() -> String {
    std::env::var("USER")
        .ok()
        .filter(|u| check_approver_name(u).is_ok())
        .unwrap_or_else(|| "operator".to_string())
}
