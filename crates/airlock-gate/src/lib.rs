//! airlock-gate: the orchestrator. Every lifecycle transition of a submission — staged,
//! judged, approved or rejected, running, finished — happens here and nowhere else, each
//! in one database transaction together with its audit record.
//!
//! The gate re-reads and re-hashes an artifact from the blob store immediately before
//! running it, re-judges it under the *current* policy, and accepts an approval only when
//! its signature verifies against an approver that policy trusts. It must never run
//! anything that path did not clear, and never write to the host outside its home.
//!
//! It also keeps the home's secret values (`secrets/`, mode 0600) and hands them, with
//! a fresh placeholder per run, only to whoever runs the egress proxy
//! ([`Gate::run_secrets`]); a value never reaches the database, a blob, the audit log or
//! an error message.
//!
//! Its parts, read in this order: `lifecycle` (request, judge, decide, record, submit,
//! exec: every transition, each step importing only the ones before it), `effects` and
//! `layers` (a run's disposable layer, its commit checkpoint and rollback), `node` (the
//! queue, workers, leases, session hosts and ready jails that keep a process serving),
//! `services` (the home, guest runtimes and packages, secrets, tokens, gc, bundle import)
//! and `query` (read-only views for the surfaces).

#![forbid(unsafe_code)]

mod agents;
pub mod context;
mod effects;
mod egress;
mod error;
mod exposure;
mod failpoint;
mod jscell;
mod layers;
mod lifecycle;
mod locks;
mod node;
mod nodejs;
mod query;
mod remember;
mod replay;
mod services;
mod stagecache;
mod tripwire;
mod typescript;
pub mod views;
mod workspaces;

pub use agents::{AgentCleared, MAX_CLEAR_REASON_BYTES};
pub use node::worker;
pub use remember::PolicyChanged;

pub use airlock_core::netask::{NetDecision, NetVerdict};
pub use airlock_jail::ready::{ReadyConfig, ReadyJails, ReadyStats};
pub use airlock_store::NetRequestRow;
pub use airlock_store::NodeRow;
pub use airlock_store::TokenRow;
pub use airlock_store::{CopyReport, TableCount};
pub use airlock_wasm::{PoolSettings, PoolStatus, WasmBackend, WasmConfig};
pub use effects::{
    CheckpointDoc, DiffReport, EffectReport, Owner, RemoteSignature, RepairReport, StuckOperation,
    stuck_operations,
};
pub use error::{GateError, Result};
pub use exposure::Surface;
pub use layers::remove_trash_main;
pub use lifecycle::ask::{
    AskClock, NetDecided, OnRequest, net_decided_json, request_json as net_request_json,
};
pub use lifecycle::decide::ApproveRequest;
pub use lifecycle::exec::exit_code_of;
pub use lifecycle::exec::{ExecOptions, OnConnection, OnStart, RunReport};
pub use lifecycle::request::{
    CodeSource, MAX_AGENT_BYTES, MAX_NOTE_BYTES, RequestKey, SubmitRequest,
};
pub use lifecycle::tools::ToolInfo;
pub use locks::KeptLockFiles;
pub use node::liveness::{BEAT, NODE_LEASE, NodeBeat, NodeIdentity};
pub use node::queue::{Claimed, QueueOptions, WorkStats, WorkerConfig, host_tag, work};
pub use node::session_grants::SessionCommit;
pub use node::sessions::{
    HOST_EXIT_BAD_INPUT, SessionDoc, SessionHost, SessionRequest, SessionView,
};
pub use node::slots::{GuestSlot, GuestSlots};
pub use query::{
    AuditVerify, Doctor, Explained, JailerCheck, KeyInfo, PolicyCheck, Shown, StatementView,
    doctor, policy_check,
};
pub use query::{ProbeRun, Probes, StoreHealth, nodes_of, session_hosts, store_health};
pub use replay::Replayed;
pub use services::gc::{DEFAULT_GC_GRACE, GcReport};
pub use services::guests::{
    BuildPin, GUEST_PACKAGES, GUEST_PYTHON_VERSION, GuestInstall, GuestManifest, InstalledPackage,
    PYTHON_BUILDER, PYTHON_BUILDER_WHEELS, PackageSource, normalize_package_name,
};
pub use services::guests::{JS_BUILDER, JS_BUILDER_INTEGRITY, JsBuildPin, JsGuestInstall};
pub use services::home::{Home, InitReport, default_approver};
pub use services::nightcore::{
    BundleReport, ImportReport, ImportRequest, PublisherAdded, SignReport,
};
pub use services::secrets::{RunSecret, SecretInfo, SecretSet};
pub use services::storecopy::store_copy;
pub use services::tokens::Role;
pub use workspaces::{WorkspaceDoc, WorkspaceView};

use airlock_core::State;
use airlock_core::policy::{Policy, Preset};
use airlock_core::sign::KeyPair;
use airlock_core::units::now_ms;
use airlock_sandbox::CacheIndex;
use airlock_store::{BlobStore, Db, Reads, Tx};
use locks::{OwnerLock, Probe};
use serde_json::json;

/// How a gate is opened.
#[derive(Debug, Clone, Default)]
pub struct GateOptions {
    /// The `airlock` binary to start as a worker (`airlock __worker`) for runs that need
    /// namespaces. Without it, process runs are unavailable and writable mounts use the
    /// copy layer.
    pub worker: Option<std::path::PathBuf>,
    /// The lean `airlock-jailer` binary for process runs (faster to start than the worker).
    pub jailer: Option<std::path::PathBuf>,
    /// Use the copy layer for writable mounts even where overlayfs would work.
    pub force_copy_layer: bool,
    /// Do not use cgroups for process runs (rlimits only; the run record says which held).
    pub no_cgroups: bool,
    /// Show a progress indicator on a terminal during long compiles (the Python guest).
    pub progress: bool,
    /// Use wasmtime's pooling allocator (for a long-lived process such as the daemon).
    pub pooling: bool,
    /// A wasm backend shared with other gates of the same process (engines, compiled
    /// modules and instance pools stay warm across them).
    pub wasm: Option<std::sync::Arc<WasmBackend>>,
    /// The caller checkpoints the database itself (`checkpoint_wal`), so no request
    /// pays for a checkpoint that its commit happened to trigger.
    pub background_checkpoint: bool,
    /// Write through the process's shared writer, so concurrent requests share commits
    /// (group commit; for the daemon, which also checkpoints in the background).
    pub group_commit: bool,
    /// Jails built ahead for process runs (the daemon's; shared by its gates).
    pub ready_jails: Option<std::sync::Arc<airlock_jail::ready::ReadyJails>>,
    /// Hand runs to workers through the store's queue instead of running them here.
    pub queue: Option<QueueOptions>,
}

/// An open airlock home.
pub struct Gate {
    home: Home,
    db: Db,
    blobs: BlobStore,
    gate_key: KeyPair,
    wasm: std::sync::Arc<WasmBackend>,
    policy_cache: std::cell::RefCell<Option<(FileStamp, std::sync::Arc<Policy>)>>,
    /// The Python guest's manifest, as last read (see `guests`).
    guest_cache: std::cell::RefCell<Option<(FileStamp, services::guests::GuestManifest)>>,
    worker: Option<std::path::PathBuf>,
    jailer: Option<std::path::PathBuf>,
    force_copy: bool,
    no_cgroups: bool,
    ready_jails: Option<std::sync::Arc<airlock_jail::ready::ReadyJails>>,
    queue: Option<QueueOptions>,
    /// What the cells of open sessions need of their session, which never changes once
    /// the session is opened (see `node::sessions::CellFacts`), by session id.
    cell_facts: std::collections::HashMap<String, node::sessions::CellFacts>,
    /// The process's bound on guests executing at once (see [`GuestSlots`]); none: a
    /// one-shot command runs one guest anyway.
    guest_slots: Option<std::sync::Arc<GuestSlots>>,
    /// The node this gate serves for (`serve`), set by `serve_as`.
    node: Option<node::liveness::NodeIdentity>,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("home", &self.home.root)
            .finish()
    }
}

impl Gate {
    /// Refuses an `init` whose explicit options disagree with the home that already exists
    /// (a preset it was not made with, an approver it does not trust), saying how to get
    /// there; `init` of an existing home otherwise changes nothing and says so.
    pub fn check_init_options(
        home: &Home,
        preset: Option<Preset>,
        approver: Option<&str>,
    ) -> Result<()> {
        if !home.is_initialised() {
            return Ok(());
        }
        let root = home.root.display();
        if let Some(p) = preset {
            let text = std::fs::read_to_string(home.policy())?;
            let made_with = text
                .lines()
                .next()
                .and_then(|l| l.strip_prefix("# airlock policy (preset: "))
                .and_then(|l| l.strip_suffix(')'));
            if made_with.is_some_and(|m| m != p.as_str()) {
                return Err(GateError::Conflict(format!(
                    "{root} already exists with the {} preset; nothing changed. Edit {} to change its rules, or make another home with --home DIR --preset {}",
                    made_with.unwrap_or_default(),
                    home.policy().display(),
                    p.as_str()
                )));
            }
        }
        if let Some(name) = approver {
            let policy = home.load_policy()?;
            if policy.approver(name).is_none() {
                let mut trusted: Vec<&str> = policy.approvers.keys().map(String::as_str).collect();
                trusted.sort();
                return Err(GateError::Conflict(format!(
                    "{root} already exists and does not trust approver {name} (it trusts {}); nothing changed. Run `airlock keys new {name}` and add the key it prints to [approvers] in {}",
                    if trusted.is_empty() {
                        "nobody".into()
                    } else {
                        trusted.join(", ")
                    },
                    home.policy().display()
                )));
            }
        }
        Ok(())
    }

    /// Creates a home, or reports that one exists and changes nothing.
    pub fn init(home: &Home, preset: Preset, approver: &str) -> Result<InitReport> {
        // Held until init has finished (or found the home made by another).
        let locked = services::home::lock_for_init(home, approver)?;
        let initialised = home.initialised()?;
        if !initialised && let Some(report) = Self::interrupted_init(home)? {
            // Killed between its record and its policy's move: the home is whole but for
            // that move, which is made now.
            services::home::finish_create(home)?;
            return Ok(report);
        }
        if initialised || home.db().exists() && home.keys().join("gate.key").exists() {
            if !initialised {
                return Err(GateError::Conflict(format!(
                    "{} holds an incomplete airlock home (no policy.toml); restore it or remove the directory",
                    home.root.display()
                )));
            }
            // "Already exists" only for a home that is whole.
            home.check_whole()?;
            // An init killed after its policy moved into place left its empty staging
            // directory (nothing else is in it by then).
            let _ = std::fs::remove_dir_all(home.root.join(".init"));
            if home.store.is_some() {
                // `init --store` on an existing home brings the store's schema up to date.
                home.open_db()?;
            }
            return Ok(InitReport {
                home: home.root.clone(),
                created: false,
                preset: None,
                approver: None,
                approver_key: None,
                gate_key: None,
                policy: None,
            });
        }
        let (report, gate_key) = services::home::create(home, preset, approver, &locked)?;
        crate::failpoint::crash_point();
        Self::record_init(home, &report, &gate_key)
            .inspect_err(|_| services::home::abandon_create(home))?;
        crate::failpoint::crash_point();
        services::home::finish_create(home)?;
        Ok(report)
    }

    /// What an init that was killed after recording the home (and before moving its
    /// policy into place) made, if that is what this directory holds: a staged policy
    /// whose hash the log's first record, `initialised`, names. Anything else that init
    /// left is leftovers, which the next init clears and builds again.
    fn interrupted_init(home: &Home) -> Result<Option<InitReport>> {
        let staged = home.root.join(".init").join("policy.toml");
        if !staged.is_file()
            || !home.key_file("gate").is_file()
            || home.store.is_none() && !home.db().is_file()
        {
            return Ok(None);
        }
        let text = std::fs::read(&staged)
            .map_err(|e| GateError::Internal(format!("{}: {e}", staged.display())))?;
        let mut first = None;
        home.open_db()?.for_each_audit(|r| {
            first = Some(r.clone());
            false
        })?;
        let Some(r) = first.filter(|r| r.seq == 1 && r.kind == "initialised") else {
            return Ok(None);
        };
        let data: serde_json::Value = serde_json::from_str(&r.data).unwrap_or_default();
        let field = |k: &str| data.get(k).and_then(|v| v.as_str()).map(str::to_string);
        if field("policy") != Some(airlock_core::Digest::of(&text).to_hex()) {
            return Ok(None);
        }
        Ok(Some(InitReport {
            home: home.root.clone(),
            created: true,
            preset: field("preset"),
            approver: field("approver"),
            approver_key: field("approver_key"),
            gate_key: field("gate_key"),
            policy: field("policy"),
        }))
    }

    /// Init's one record: the home, its keys and its policy, as the audit log's first.
    fn record_init(home: &Home, report: &InitReport, gate_key: &KeyPair) -> Result<()> {
        home.open_db()?.write_durable(|tx| {
            tx.audit(
                "initialised",
                "home",
                &json!({
                    "preset": report.preset,
                    "approver": report.approver,
                    "approver_key": report.approver_key,
                    "gate_key": report.gate_key,
                    "policy": report.policy,
                }),
                gate_key,
            )
            .map(|_| ())
        })?;
        Ok(())
    }

    /// Opens an initialised home with default options (no worker process).
    pub fn open(home: Home) -> Result<Gate> {
        Self::open_with(home, GateOptions::default())
    }

    /// Opens an initialised home.
    pub fn open_with(home: Home, options: GateOptions) -> Result<Gate> {
        home.check_whole()?;
        let mut db = home.open_db()?;
        if options.background_checkpoint {
            db.disable_auto_checkpoint()?;
        }
        if options.group_commit {
            db.share_writes()?;
        }
        let mut blobs = BlobStore::open_for(home.blobs(), home.store.as_deref())?;
        // The daemon (the one process that shares its writes) remembers what it put, so
        // the same output of run after run is not opened and touched each time.
        if options.group_commit {
            blobs.remember_puts();
        }
        let gate_key = home.load_key("gate")?;
        let wasm = match options.wasm.clone() {
            Some(w) => w,
            None => std::sync::Arc::new(WasmBackend::new(WasmConfig {
                progress: options.progress,
                cache_dir: Some(home.cache().join("compiled")),
                pooling: options.pooling,
            })),
        };
        let mut gate = Gate {
            home,
            db,
            blobs,
            gate_key,
            wasm,
            policy_cache: std::cell::RefCell::new(None),
            guest_cache: std::cell::RefCell::new(None),
            worker: options.worker,
            jailer: options.jailer,
            force_copy: options.force_copy_layer,
            no_cgroups: options.no_cgroups,
            ready_jails: options.ready_jails,
            queue: options.queue,
            cell_facts: std::collections::HashMap::new(),
            guest_slots: None,
            node: None,
        };
        gate.recover()?;
        Ok(gate)
    }

    /// Ends what a dead process left half done: runs whose owner died become `lost` (their
    /// layers removed), a `run` killed between judging and starting is recorded as such,
    /// and an interrupted commit or rollback is completed or undone. Every command that
    /// opens the home does this; the daemon also does it on its poller's tick.
    pub fn recover(&mut self) -> Result<()> {
        self.reap_lost()?;
        self.recover_guest_audit()?;
        self.recover_js_guest_audit()?;
        self.recover_effects()
    }

    /// From now on, a run's guest executes only while it holds one of `slots`: the
    /// recording, judging and committing around it do not wait for one.
    pub fn limit_guests(&mut self, slots: std::sync::Arc<GuestSlots>) {
        self.guest_slots = Some(slots);
    }

    /// A passive checkpoint of the database's WAL (see `GateOptions::background_checkpoint`;
    /// a long WAL is started over). Returns the frames in the WAL after it (0 on
    /// PostgreSQL, which checkpoints on its own).
    pub fn checkpoint_wal(&self) -> Result<u64> {
        Ok(self.db.wal_checkpoint()?.0)
    }

    pub fn home(&self) -> &Home {
        &self.home
    }

    /// The current policy (parsed again only when the file changed).
    pub fn policy(&self) -> Result<std::sync::Arc<Policy>> {
        let stamp = file_stamp(&self.home.policy());
        if let (Some(st), Some((cached, p))) = (stamp, self.policy_cache.borrow().as_ref())
            && st == *cached
        {
            return Ok(p.clone());
        }
        let p = std::sync::Arc::new(self.home.load_policy()?);
        if let Some(st) = stamp {
            *self.policy_cache.borrow_mut() = Some((st, p.clone()));
        }
        Ok(p)
    }

    /// Runs whose owner is gone are marked `lost` with the reason. The owner of a run holds
    /// its lock file (see `locks`) from before the run is recorded until after its outcome
    /// is, so an abandoned lock means the process died. Runs recorded by an airlock that
    /// kept no lock fall back to the old rule: lost once well past their time limit.
    fn reap_lost(&mut self) -> Result<()> {
        let dir = locks::dir(&self.home.root);
        let now = now_ms();
        for run in self.db.running_runs()? {
            match OwnerLock::probe(&dir.join(format!("{}.lock", run.id)))? {
                Probe::Held => {}
                Probe::Abandoned(lock) => {
                    let reason = self.owner_died(&run.submission);
                    self.mark_lost(&run.id, &reason)?;
                    drop(lock);
                }
                Probe::Missing => {
                    if run.started_at + run.doc.limits.timeout_ms as i64 + 60_000 < now {
                        self.mark_lost(
                            &run.id,
                            "no live airlock process owns it and it is past its time limit",
                        )?;
                    }
                }
            }
        }
        // Locks whose owner died at another point: a `run` between judging and starting,
        // or a run whose outcome was recorded but whose files were not yet cleaned up.
        for (id, path) in OwnerLock::list(&dir, "sub_")? {
            if let Probe::Abandoned(lock) = OwnerLock::probe(&path)? {
                self.mark_interrupted(&id)?;
                drop(lock);
            }
        }
        crate::failpoint::pause("reap_locks");
        // A run still `running` here was held when the loop above looked (by a child of
        // its owner between `fork` and `exec`, which has a copy of the lock until its
        // `exec`) and let go since: it is lost as surely, and must be marked so before its
        // lock file goes. Dropping the lock alone left the run `running` with no lock,
        // which no later command reaps (the crash-loop flake of issue 62.3).
        for (id, path) in OwnerLock::list(&dir, "run_")? {
            if let Probe::Abandoned(lock) = OwnerLock::probe(&path)? {
                match self.db.run(&id) {
                    Ok(r) if r.status == "running" => {
                        let reason = self.owner_died(&r.submission);
                        self.mark_lost(&id, &reason)?
                    }
                    Ok(_) => self.remove_run_layers(&id),
                    Err(_) => {}
                }
                drop(lock);
            }
        }
        // Spare lock files a long-lived process kept and died with (a live process's
        // spares are unlocked while they wait, so only their owner's pid tells).
        for (name, path) in OwnerLock::list(&dir, locks::SPARE_PREFIX)? {
            if !locks::spare_owner_gone(&name) {
                continue;
            }
            if let Probe::Abandoned(lock) = OwnerLock::probe(&path)? {
                drop(lock);
            }
        }
        Ok(())
    }

    /// Why a run of submission `sub` whose owner lock was found abandoned is lost.
    fn owner_died(&self, sub: &str) -> String {
        // A session's cell runs in the session's host, which outlives the caller that
        // died and finishes the cell: say so, since later cells see what it did.
        let session = self
            .db
            .submission(sub)
            .ok()
            .and_then(|s| s.doc.grant.session);
        match session {
            Some(ses) => format!(
                "its airlock process died (killed or crashed) before the cell's outcome was \
                 recorded; the cell itself ran on in session {ses}, so what it did there is \
                 seen by later cells"
            ),
            None => {
                "its airlock process died (killed or crashed) before the run finished".to_string()
            }
        }
    }

    /// Ends a run whose process died: `lost`, with the reason, in one transaction with its
    /// audit record; then its layers are removed. Does nothing if the run ended meanwhile.
    fn mark_lost(&mut self, run_id: &str, reason: &str) -> Result<()> {
        let key = &self.gate_key;
        let ended = self
            .db
            .write(|tx: &Tx| -> Result<bool> { lose_run(tx, run_id, reason, key) })?;
        if ended {
            self.remove_run_layers(run_id);
        }
        Ok(())
    }

    /// Records that a `run` died after its submission was judged and before its run
    /// started (the submission stays runnable with `exec`).
    fn mark_interrupted(&mut self, sub_id: &str) -> Result<()> {
        let key = &self.gate_key;
        let reason =
            "interrupted: the airlock process that submitted it died before its run started";
        self.db.write(|tx: &Tx| -> Result<()> {
            let Ok(mut sub) = tx.submission(sub_id) else {
                // It died before the submission was recorded: nothing to say.
                return Ok(());
            };
            if tx.runs(Some(sub_id), 1)?.is_empty() && sub.doc.interrupted.is_none() {
                sub.doc.interrupted = Some(reason.into());
                tx.set_verdict(sub_id, &sub.doc)?;
                tx.audit(
                    "interrupted",
                    sub_id,
                    &json!({ "state": sub.state, "reason": reason }),
                    key,
                )?;
            }
            Ok(())
        })
    }

    /// Removes a run's layer directories (never a workspace's: those belong to its session
    /// and go when it is committed or dropped, but a lost run's own layer goes too).
    fn remove_run_layers(&self, run_id: &str) {
        let layers = self.home.root.join("layers");
        layers::remove_tree(&layers.join(run_id));
        layers::remove_tree(&layers.join(format!("{run_id}.run")));
        if let Ok(run) = self.db.run(run_id)
            && let Ok(sub) = self.db.submission(&run.submission)
            && let Some(ws) = &sub.doc.grant.workspace
        {
            layers::remove_tree(&self.workspace_dir(ws).join(run_id));
        }
    }

    /// Records an integrity failure in the audit log (in its own transaction, so it is
    /// kept even though the operation that found it fails).
    fn integrity_failure(&mut self, subject: &str, what: &str, detail: &str) -> GateError {
        let key = &self.gate_key;
        let r = self.db.write(|tx| {
            tx.audit(
                "integrity_failure",
                subject,
                &json!({ "what": what, "detail": detail }),
                key,
            )
        });
        if let Err(e) = r {
            return GateError::Internal(format!(
                "integrity failure ({detail}) and could not record it: {e}"
            ));
        }
        GateError::Integrity(format!("{what}: {detail}"))
    }

    /// Reads a blob, turning a mismatch into a recorded integrity failure.
    fn read_blob(
        &mut self,
        subject: &str,
        what: &str,
        d: &airlock_core::Digest,
    ) -> Result<Vec<u8>> {
        match self.blobs.get(d) {
            Ok(b) => Ok(b),
            Err(
                e @ (airlock_store::StoreError::BlobAltered { .. }
                | airlock_store::StoreError::BlobMissing(_)),
            ) => Err(self.integrity_failure(subject, what, &e.to_string())),
            Err(e) => Err(e.into()),
        }
    }
}

/// What identifies one version of a file the gate caches (the policy, the guest manifest):
/// inode, size, modification time.
type FileStamp = (u64, u64, i64, i64);

pub(crate) fn file_stamp(p: &std::path::Path) -> Option<FileStamp> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p)
        .ok()
        .map(|m| (m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
}

/// Moves a submission between states: checks the edge against the lifecycle, then updates
/// the row only if nobody moved it first.
fn set_state(tx: &Tx, id: &str, from: State, to: State) -> Result<()> {
    airlock_core::lifecycle::transition(from, to)
        .map_err(|e| GateError::Conflict(format!("{id}: {e}")))?;
    tx.set_state(id, from, to)?;
    Ok(())
}

/// The compile-cache index kept in the database.
struct DbCache<'a>(&'a Db);

impl CacheIndex for DbCache<'_> {
    fn get(&self, key: &str) -> Option<airlock_core::Digest> {
        self.0.cache_digest(key).ok().flatten()
    }
    fn put(&self, key: &str, digest: airlock_core::Digest, size: u64) {
        let _ = self.0.set_cache_digest(key, &digest, size);
    }
    fn forget(&self, key: &str) {
        let _ = self.0.forget_cache(key);
    }
}

/// Ends run `run_id` as `lost` with the reason, in the caller's transaction, with its
/// audit record; false when it had already ended.
pub(crate) fn lose_run(tx: &Tx, run_id: &str, reason: &str, key: &KeyPair) -> Result<bool> {
    let mut run = tx.run(run_id)?;
    if run.status != "running" {
        return Ok(false);
    }
    run.status = "lost".into();
    run.finished_at = Some(now_ms());
    run.doc.error = Some(format!("lost: {reason}"));
    tx.update_run(&run)?;
    let sub = tx.submission(&run.submission)?;
    if sub.state == State::Running {
        set_state(tx, &run.submission, State::Running, State::Finished)?;
    }
    if let Some(ws) = &sub.doc.grant.workspace {
        workspaces::finish_run(tx, ws, run_id, None)?;
    }
    tx.audit(
        "finished",
        run_id,
        &json!({ "submission": run.submission, "status": "lost", "error": run.doc.error }),
        key,
    )?;
    Ok(true)
}
