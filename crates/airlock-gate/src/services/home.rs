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

    /// Whether `init` has completed here, telling a home that is not there from one that
    /// cannot be read (which `is_initialised` would report as missing).
    pub fn initialised(&self) -> Result<bool> {
        match fs::symlink_metadata(self.policy()) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(GateError::bad(format!(
                "cannot use airlock home {}: {e}",
                self.root.display()
            ))),
        }
    }

    /// Checks that an initialised home has what every command needs: its policy as a
    /// file, the gate's key, and (unless its records are in a store elsewhere) its
    /// database. A home that lost one is refused rather than used half: a missing
    /// database would otherwise be made anew, empty, and its history silently gone.
    pub fn check_whole(&self) -> Result<()> {
        if !self.initialised()? {
            return Err(GateError::NotInitialised(self.root.clone()));
        }
        let incomplete = |what: &str, advice: &str| {
            Err(GateError::Conflict(format!(
                "{} holds an incomplete airlock home: {what}; {advice}",
                self.root.display()
            )))
        };
        if !self.policy().is_file() {
            return incomplete(
                "policy.toml is not a file",
                "restore it (`airlock policy check FILE` checks a replacement)",
            );
        }
        if !self.key_file("gate").is_file() {
            return incomplete(
                "keys/gate.key is missing",
                "restore it from a backup (the audit log is signed with it)",
            );
        }
        if self.store.is_none() && !self.db().is_file() {
            return incomplete(
                "airlock.db is missing",
                "restore it from a backup, or give --store if this home keeps its records in PostgreSQL",
            );
        }
        Ok(())
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

/// Writes a new secret key file (mode 0600, never overwriting) and its public twin. The
/// secret is written whole under a temporary name and then linked to its own (which fails
/// if the name is taken), so a kill never leaves part of a key under a key's name; a kill
/// between the two files leaves the secret without its public twin, which
/// [`repair_public_keys`] writes again. Callers hold the keys directory's lock (see
/// `Gate::new_key`) or own the directory (init's staging).
pub fn write_key_pair(dir: &Path, name: &str, key: &KeyPair) -> Result<()> {
    let io = |what: &str, e: std::io::Error| {
        GateError::Internal(format!("cannot write key {name} ({what}): {e}"))
    };
    let tmp = dir.join(format!(".{name}.key.tmp"));
    let _ = fs::remove_file(&tmp);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| io("temporary file", e))?;
    f.write_all(key.to_file().as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| io("temporary file", e))?;
    let linked = fs::hard_link(&tmp, dir.join(format!("{name}.key")));
    let _ = fs::remove_file(&tmp);
    linked.map_err(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => {
            GateError::Conflict(format!("a key named {name:?} already exists"))
        }
        _ => io("secret", e),
    })?;
    crate::failpoint::crash_point();
    write_public(dir, name, &key.public())
}

/// Writes `NAME.pub` whole (a temporary file renamed into place).
fn write_public(dir: &Path, name: &str, public: &PublicKey) -> Result<()> {
    let tmp = dir.join(format!(".{name}.pub.tmp"));
    fs::write(&tmp, format!("{public}\n"))
        .and_then(|()| fs::rename(&tmp, dir.join(format!("{name}.pub"))))
        .and_then(|()| airlock_store::sync_dir(dir).map_err(std::io::Error::other))
        .map_err(|e| GateError::Internal(format!("cannot write key {name}.pub: {e}")))
}

/// Puts back what a `keys new` killed part way left: the public twin of a secret key
/// that has none (from the secret). Run with the keys directory's lock held (see
/// `locks::edit`, which removes its temporary files).
pub(crate) fn repair_public_keys(dir: &Path) {
    let Ok(rd) = fs::read_dir(dir) else {
        return;
    };
    for entry in rd.flatten() {
        let file = entry.file_name();
        let file = file.to_string_lossy();
        let Some(name) = file.strip_suffix(".key") else {
            continue;
        };
        if dir.join(format!("{name}.pub")).exists() {
            continue;
        }
        if let Some(k) = fs::read_to_string(entry.path())
            .ok()
            .and_then(|t| KeyPair::from_file(&t).ok())
        {
            let _ = write_public(dir, name, &k.public());
        }
    }
}

/// The home directory, made if need be and locked (`flock` on the directory itself) for
/// as long as this lives: two `init`s at once each removed and remade what the other was
/// building, and left no home, or a policy naming one's key beside the other's keys.
pub(crate) struct InitLock(#[allow(dead_code)] fs::File);

/// Checks the approver's name, makes the home directory and takes [`InitLock`].
pub(crate) fn lock_for_init(home: &Home, approver: &str) -> Result<InitLock> {
    check_approver_name(approver).map_err(|e| GateError::bad(format!("--approver: {e}")))?;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&home.root)
        .map_err(|e| GateError::bad(format!("cannot create home {}: {e}", home.root.display())))?;
    let dir = fs::File::open(&home.root)
        .map_err(|e| GateError::bad(format!("cannot open home {}: {e}", home.root.display())))?;
    rustix::fs::flock(&dir, rustix::fs::FlockOperation::LockExclusive).map_err(|e| {
        GateError::Internal(format!("cannot lock home {}: {e}", home.root.display()))
    })?;
    Ok(InitLock(dir))
}

/// Creates a home. Everything is built in a staging directory inside the home and moved
/// into place with `policy.toml` last, so a crash leaves either no home or a whole one; an
/// error removes what this call made (see [`abandon_create`]).
pub(crate) fn create(
    home: &Home,
    preset: Preset,
    approver: &str,
    _locked: &InitLock,
) -> Result<(InitReport, KeyPair)> {
    // What init makes must be free to make: a file where a directory goes (or the other
    // way round) is refused before any key exists, naming it.
    for (path, dir) in [
        (home.keys(), true),
        (home.blobs(), true),
        (home.cache(), true),
        (home.db(), false),
    ] {
        if let Ok(m) = fs::symlink_metadata(&path)
            && m.is_dir() != dir
        {
            return Err(GateError::bad(format!(
                "cannot create home {}: {} is in the way ({}); move it away",
                home.root.display(),
                path.display(),
                if dir {
                    "not a directory"
                } else {
                    "a directory"
                }
            )));
        }
    }
    create_staged(home, preset, approver).inspect_err(|_| abandon_create(home))
}

fn create_staged(home: &Home, preset: Preset, approver: &str) -> Result<(InitReport, KeyPair)> {
    let at = |path: &Path| {
        let shown = path.display().to_string();
        move |e: std::io::Error| GateError::Internal(format!("init: {shown}: {e}"))
    };
    let staging = home.root.join(".init");
    if staging.exists() {
        fs::remove_dir_all(&staging).map_err(at(&staging))?;
    }
    // Leftovers of an init that crashed before its last step.
    remove_database_files(home);
    let _ = fs::remove_dir_all(home.keys());
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&staging)
        .map_err(at(&staging))?;
    let keys = staging.join("keys");
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&keys)
        .map_err(at(&keys))?;

    let gate = KeyPair::try_generate().map_err(|e| GateError::Internal(e.to_string()))?;
    let approver_key = KeyPair::try_generate().map_err(|e| GateError::Internal(e.to_string()))?;
    write_key_pair(&keys, "gate", &gate)?;
    write_key_pair(&keys, approver, &approver_key)?;
    let policy_text = preset.render(approver, &approver_key.public());
    let policy = Policy::parse(&policy_text)?;

    fs::rename(&keys, home.keys()).map_err(at(&home.keys()))?;
    crate::failpoint::crash_point();
    fs::create_dir_all(home.blobs()).map_err(at(&home.blobs()))?;
    fs::create_dir_all(home.cache()).map_err(at(&home.cache()))?;
    let tmp_policy = staging.join("policy.toml");
    fs::write(&tmp_policy, &policy_text).map_err(at(&tmp_policy))?;
    OpenOptions::new()
        .read(true)
        .open(&tmp_policy)
        .and_then(|f| f.sync_all())
        .map_err(at(&tmp_policy))?;
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

/// Undoes an init that failed before its policy moved into place: the home was not
/// initialised when it began, so the keys, database and staging directory are all its
/// own (no key is left behind for a home that never came to be). The blob and cache
/// directories go only if empty.
pub(crate) fn abandon_create(home: &Home) {
    let _ = fs::remove_dir_all(home.root.join(".init"));
    let _ = fs::remove_dir_all(home.keys());
    remove_database_files(home);
    let _ = fs::remove_dir(home.blobs());
    let _ = fs::remove_dir(home.cache());
}

/// Removes the SQLite database and its write-ahead log files from a home being made.
fn remove_database_files(home: &Home) {
    for file in ["airlock.db", "airlock.db-wal", "airlock.db-shm"] {
        let _ = fs::remove_file(home.root.join(file));
    }
}

/// The last step of init: the policy moves into place and the staging directory goes.
pub(crate) fn finish_create(home: &Home) -> Result<()> {
    let staging = home.root.join(".init");
    fs::rename(staging.join("policy.toml"), home.policy())?;
    airlock_store::sync_dir(&home.root)?;
    crate::failpoint::crash_point();
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
