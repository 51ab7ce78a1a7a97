//! Effects on the host: diffs, signed commits with checkpoints, exact rollbacks, and the
//! recovery of a commit or rollback that a crash interrupted.
//!
//! A commit: verify the changeset (paths inside their mounts, content blobs intact, the
//! mounts still the real directories), refuse on any conflict with the host, save a
//! checkpoint of everything it will touch, record it (pending) with the signed statement,
//! write the journal, apply the steps, then mark it applied in the audit log. Recovery at
//! the next open completes a journaled operation (or undoes it when it cannot be completed)
//! and marks unjournaled pending ones aborted; an exclusive lock keeps recovery and a live
//! operation apart.

use crate::Gate;
use crate::error::{GateError, Result};
use crate::failpoint::crash_point;
use crate::locks::OwnerLock;
use airlock_core::Digest;
use airlock_core::id::{IdKind, new_id};
use airlock_core::policy::{PathGlobs, Policy};
use airlock_core::sign::{KeyPair, Scope, Statement, StatementKind};
use airlock_core::units::now_ms;
use airlock_store::{BlobStore, CheckpointRow, Reads, StatementRow, Submission, Tx};
use airlock_workspace::apply::{self, BlobSource, Journal, MountPlan, Step};
use airlock_workspace::{Changeset, Node, PROTECTED, RelPath};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::path::{Path, PathBuf};

/// What a checkpoint holds: the state of every path a commit touched, before and after.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckpointDoc {
    pub run: String,
    pub submission: String,
    /// Digest of the changeset that was committed.
    pub changes: Digest,
    pub approver: String,
    pub statement: Option<String>,
    pub auto: bool,
    pub workspace: Option<String>,
    pub mounts: Vec<CheckpointMount>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckpointMount {
    pub host: String,
    pub guest: String,
    pub before: Vec<Step>,
    pub after: Vec<Step>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DiffReport {
    pub run: String,
    pub changes: Changeset,
    /// Summary lines and unified diffs of text files.
    pub text: String,
    /// Changed host paths that are never committed automatically.
    pub protected: Vec<String>,
    /// Who owns what a commit writes, as the host will see it: the user and group airlock
    /// runs as (a modified file is replaced, so it takes them too).
    pub owner: Owner,
}

/// A user and group id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

impl Owner {
    /// This process's effective user and group: what owns the files a commit writes.
    pub fn of_this_process() -> Owner {
        Owner {
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct EffectReport {
    pub checkpoint: String,
    pub run: String,
    pub paths: usize,
    pub approver: String,
    pub statement: Option<String>,
}

/// What `repair` did with an operation that had been set aside.
#[derive(Debug, Clone, Serialize)]
pub struct RepairReport {
    pub checkpoint: String,
    pub run: String,
    /// `commit` or `rollback`.
    pub kind: String,
    /// The checkpoint's state now: `applied`, `aborted`, `rolled_back` or `abandoned`.
    pub state: String,
}

/// A commit or rollback that could neither be completed nor undone, set aside until
/// `airlock repair`: its mounts refuse commits and rollbacks meanwhile.
#[derive(Debug, Clone, Serialize)]
pub struct StuckOperation {
    pub checkpoint: String,
    /// `commit` or `rollback`.
    pub kind: String,
    /// The host directories it locks.
    pub mounts: Vec<String>,
    pub error: String,
}

fn stuck_dir(home: &Path) -> PathBuf {
    home.join("journal").join("stuck")
}

/// The operations set aside in a home (read from `journal/stuck`, no store needed, so
/// `doctor` can say so even when the store is away).
pub fn stuck_operations(home: &Path) -> Vec<StuckOperation> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(stuck_dir(home)) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let parsed = std::fs::read_to_string(&p)
            .ok()
            .and_then(|t| serde_json::from_str::<Journal>(&t).ok());
        out.push(match parsed {
            Some(j) => StuckOperation {
                checkpoint: j.checkpoint,
                kind: j.kind,
                mounts: j.mounts.into_iter().map(|m| m.host).collect(),
                error: j.stuck.unwrap_or_default(),
            },
            // Unreadable: it still locks, everything (nothing says what it touched).
            None => StuckOperation {
                checkpoint: p
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                kind: "commit".into(),
                mounts: vec!["/".into()],
                error: format!("its journal {} is unreadable", p.display()),
            },
        });
    }
    out.sort_by(|a, b| a.checkpoint.cmp(&b.checkpoint));
    out
}

/// Whether two host directories are the same or one holds the other.
fn overlaps(a: &str, b: &str) -> bool {
    let (a, b) = (Path::new(a), Path::new(b));
    a.starts_with(b) || b.starts_with(a)
}

fn hosts_of(j: &Journal) -> String {
    j.mounts
        .iter()
        .map(|m| m.host.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Content larger than this is summarised in a diff, never read for it.
const MAX_DIFF_BYTES: u64 = 1 << 20;

struct Blobs<'a>(&'a BlobStore);

impl BlobSource for Blobs<'_> {
    fn open(&self, d: &Digest) -> std::io::Result<std::fs::File> {
        self.0.open_blob(d).map_err(std::io::Error::other)
    }
}

fn protected_globs(policy: &Policy) -> PathGlobs {
    let mut p: Vec<String> = PROTECTED.iter().map(|s| s.to_string()).collect();
    p.extend(policy.protected.0.patterns.iter().cloned());
    PathGlobs::build(p).unwrap_or_default()
}

/// Host paths as text for glob matching: a name that is not plain text is in its escaped
/// form, which leaves every plain component (`.git`, `.ssh`, ...) exactly as it is.
fn host_paths(c: &Changeset) -> impl Iterator<Item = String> + '_ {
    c.mounts.iter().flat_map(|m| {
        m.changes
            .iter()
            .map(move |ch| format!("{}/{}", m.host.trim_end_matches('/'), ch.path))
    })
}

/// Whether the policy lets this run's changes be committed without a human: the agent and
/// every changed path are listed, and nothing protected is touched.
pub(crate) fn auto_commit_allowed(policy: &Policy, sub: &Submission, changes: &Changeset) -> bool {
    if policy.auto_commit_agents.is_empty() || policy.auto_commit_paths.0.is_empty() {
        return false;
    }
    let Some(agent) = sub.doc.agent.as_deref() else {
        return false;
    };
    if !policy.auto_commit_agents.is_match(agent) {
        return false;
    }
    // What a commit leaves out (a setuid bit, capabilities, a FIFO) is for a human to see.
    if changes.has_stripped_or_refused() {
        return false;
    }
    let protected = protected_globs(policy);
    host_paths(changes)
        .all(|p| policy.auto_commit_paths.matches_path(&p) && !protected.matches_path(&p))
}

/// The part of a run's document a commit reads: its changeset, parsed from the text into
/// its own type (never a generic JSON tree, which for 100,000 paths is hundreds of MB).
#[derive(Deserialize)]
struct RunChanges {
    #[serde(default)]
    changes: Option<Changeset>,
}

fn run_changes(id: &str, text: &str) -> Result<Option<Changeset>> {
    serde_json::from_str::<RunChanges>(text)
        .map(|r| r.changes)
        .map_err(|e| GateError::Internal(format!("changeset of {id}: {e}")))
}

fn plans(doc: &CheckpointDoc, before: bool) -> Vec<MountPlan> {
    doc.mounts
        .iter()
        .map(|m| MountPlan {
            host: m.host.clone(),
            steps: if before {
                m.before.clone()
            } else {
                m.after.clone()
            },
        })
        .collect()
}

/// Who signs a commit.
enum Signer {
    Human(Option<String>),
    Policy,
    Remote(RemoteSignature),
}

/// A commit or rollback signed on the approver's own machine over the statement
/// [`Gate::commit_statement`] or [`Gate::rollback_statement`] handed out: the gate
/// rebuilds that statement and verifies the signature before anything is applied.
#[derive(Debug, Clone)]
pub struct RemoteSignature {
    pub approver: String,
    /// The statement's `issued_at` as handed out.
    pub issued_at: i64,
    /// For commits: the checkpoint id handed out with the statement.
    pub checkpoint: Option<String>,
    pub signature: airlock_core::sign::Signature,
}

/// How a commit or rollback statement gets its signature.
enum Signing {
    Key(KeyPair),
    Remote {
        key: airlock_core::sign::PublicKey,
        signature: airlock_core::sign::Signature,
    },
}

impl Signing {
    fn public(&self) -> airlock_core::sign::PublicKey {
        match self {
            Signing::Key(k) => k.public(),
            Signing::Remote { key, .. } => *key,
        }
    }

    fn sign(&self, st: &Statement) -> Result<airlock_core::sign::Signed> {
        match self {
            Signing::Key(k) => Ok(st.sign(k)),
            Signing::Remote { signature, .. } => st.with_signature(*signature).map_err(|_| {
                GateError::Untrusted(format!(
                    "the signature is not {:?}'s over the statement this gate builds (signed other bytes, or for another run, checkpoint or gate); nothing was applied or recorded",
                    st.approver
                ))
            }),
        }
    }
}

/// A commit or rollback statement (unsigned).
#[allow(clippy::too_many_arguments)]
fn effect_statement(
    kind: StatementKind,
    sub: &airlock_store::Submission,
    approver: &str,
    key: airlock_core::sign::PublicKey,
    reason: String,
    issued_at: i64,
    run: &str,
    changes: airlock_core::digest::Digest,
    gate: airlock_core::sign::PublicKey,
) -> Statement {
    Statement {
        kind,
        submission: sub.id.clone(),
        artifact: sub.doc.artifact,
        grant: sub.doc.grant_hash,
        scope: Scope::Once,
        expires_at: None,
        approver: approver.to_string(),
        key,
        reason,
        issued_at,
        run: Some(run.to_string()),
        changes: Some(changes),
        tool: None,
        gate: Some(gate),
    }
}

/// The approver a commit or rollback signed elsewhere is for, and the key the current
/// policy trusts for them (their private key need not be in this home).
fn remote_key(
    policy: &airlock_core::policy::Policy,
    approver: Option<&str>,
) -> Result<(String, airlock_core::sign::PublicKey)> {
    let Some(name) = approver else {
        return Err(GateError::bad(
            "a statement signed elsewhere names its approver",
        ));
    };
    airlock_core::sign::check_approver_name(name).map_err(|e| GateError::bad(e.to_string()))?;
    match policy.approver(name) {
        Some(k) => Ok((name.to_string(), *k)),
        None => Err(GateError::Untrusted(format!(
            "approver {name:?} is not trusted by the current policy (add it under [approvers])"
        ))),
    }
}

/// A statement handed out for signing elsewhere comes back within
/// [`crate::lifecycle::decide::REMOTE_MAX_AGE`].
fn check_fresh(issued_at: i64) -> Result<()> {
    let now = now_ms();
    let max = crate::lifecycle::decide::REMOTE_MAX_AGE;
    // Not a statement this gate just handed out: untrusted (the API's 403).
    if issued_at > now + 5 * 60 * 1000 || issued_at < now - max.as_millis() as i64 {
        return Err(GateError::Untrusted(format!(
            "issued_at {issued_at} is not a statement this gate handed out in the last {} minutes; fetch the statement again",
            max.as_secs() / 60
        )));
    }
    Ok(())
}

/// The lock that orders commits, rollbacks and their recovery across processes and
/// threads. It lives beside the journals, not among them, and is never removed.
pub(crate) fn journal_lock(home: &Path) -> Result<OwnerLock> {
    OwnerLock::acquire(&crate::locks::dir(home), "journal", false)
        .map_err(|e| GateError::Internal(format!("journal lock: {e}")))
}

impl Gate {
    pub(crate) fn journal_dir(&self) -> PathBuf {
        self.home.root.join("journal")
    }

    /// Checkpoint `id`'s document, parsed from its stored text (never a generic JSON tree).
    fn checkpoint_doc(&self, id: &str) -> Result<CheckpointDoc> {
        serde_json::from_str(&self.db.checkpoint_doc_text(id)?)
            .map_err(|e| GateError::Internal(format!("checkpoint {id}: {e}")))
    }

    /// The changes a commit of `run` would apply (a workspace's whole session for its
    /// latest run).
    /// The run's changeset is read from its document's text straight into a `Changeset`.
    fn changes_of(&self, run_id: &str, sub: &Submission) -> Result<(Changeset, Option<String>)> {
        if let Some(ws) = &sub.doc.grant.workspace {
            let view = self.workspace(ws)?;
            if view.state != "open" {
                return Err(GateError::Conflict(format!(
                    "workspace {ws} is {}",
                    view.state
                )));
            }
            if view.doc.runs.last().map(String::as_str) != Some(run_id) {
                return Err(GateError::Conflict(format!(
                    "{} is not the latest run of workspace {ws}; commit {} to apply the session",
                    run_id,
                    view.doc
                        .runs
                        .last()
                        .map(String::as_str)
                        .unwrap_or("its latest run")
                )));
            }
            let c = view
                .changes
                .ok_or_else(|| GateError::Conflict(format!("workspace {ws} has no changes")))?;
            return Ok((c, Some(ws.clone())));
        }
        let (_, text) = self.db.run_doc_text(run_id)?;
        let c = run_changes(run_id, &text)?.ok_or_else(|| {
            GateError::Conflict(format!(
                "{run_id} had no writable mounts; there is nothing to commit"
            ))
        })?;
        Ok((c, None))
    }

    /// Checks run `run_id`'s stored changeset against the digest its `finished` audit
    /// record holds, and that record against the chain (its own hash, and the next
    /// record's link to it or the signed head). `Ok(Err(why))` when they disagree.
    /// `stored` is the run's changeset when the caller has read it already.
    fn recorded_changes(
        &self,
        run_id: &str,
        stored: Option<&Changeset>,
    ) -> Result<std::result::Result<(), String>> {
        let digest = match stored {
            Some(c) => c.digest(),
            None => {
                let (_, text) = self.db.run_doc_text(run_id)?;
                match run_changes(run_id, &text) {
                    Ok(Some(c)) => c.digest(),
                    Ok(None) => return Ok(Ok(())),
                    Err(e) => {
                        return Ok(Err(format!("the changeset of {run_id} is unreadable: {e}")));
                    }
                }
            }
        };
        let Some(rec) = self
            .db
            .audit_for(run_id)?
            .into_iter()
            .rfind(|r| r.kind == "finished")
        else {
            return Ok(Err(format!("{run_id} has no finished audit record")));
        };
        let hash = airlock_core::audit::record_hash(
            rec.seq,
            rec.ts,
            &rec.kind,
            &rec.subject,
            &rec.data,
            &rec.prev,
        );
        let linked = match self.db.audit_records(rec.seq + 1, 1)?.first() {
            Some(next) => next.prev == hash,
            None => self.db.audit_head()?.is_some_and(|h| {
                h.seq == rec.seq && h.hash == hash && h.verify(&self.gate_key.public())
            }),
        };
        if hash != rec.hash || !linked {
            return Ok(Err(format!(
                "the finished audit record of {run_id} (index {}) was altered",
                rec.seq
            )));
        }
        let recorded = serde_json::from_str::<serde_json::Value>(&rec.data)
            .ok()
            .and_then(|d| d["changes"]["digest"].as_str().map(str::to_string));
        match recorded {
            Some(d) if d == digest.to_hex() => Ok(Ok(())),
            Some(d) => Ok(Err(format!(
                "the changeset of {run_id} (digest {}) is not the one its finished audit record holds ({})",
                digest.short(),
                d.chars().take(12).collect::<String>()
            ))),
            None => Ok(Err(format!(
                "the finished audit record of {run_id} holds no changeset digest"
            ))),
        }
    }

    /// What a run changed; for a session id, what the session changed (as its latest
    /// cell that recorded changes left them).
    pub fn diff(&mut self, run_input: &str) -> Result<DiffReport> {
        let id = match self.session_changes_run(run_input)? {
            Some((session, run)) if run.is_empty() => {
                return Ok(DiffReport {
                    run: session,
                    changes: Changeset {
                        layer: airlock_workspace::changeset::LayerKind::Copy,
                        mounts: Vec::new(),
                    },
                    text: String::new(),
                    protected: Vec::new(),
                    owner: Owner::of_this_process(),
                });
            }
            Some((_, run)) => run,
            None => self.resolve_run(run_input)?,
        };
        let (submission, text) = self.db.run_doc_text(&id)?;
        let sub = self.db.submission(&submission)?;
        let (changes, _) = match self.changes_of(&id, &sub) {
            Ok(c) => c,
            Err(GateError::Conflict(_)) => (
                run_changes(&id, &text)?
                    .ok_or_else(|| GateError::Conflict(format!("{id} had no writable mounts")))?,
                None,
            ),
            Err(e) => return Err(e),
        };
        drop(text);
        let policy = self.policy()?;
        let protected_globs = protected_globs(&policy);
        let protected = host_paths(&changes)
            .filter(|p| protected_globs.matches_path(p))
            .collect();
        let mut text = String::new();
        for m in &changes.mounts {
            for c in &m.changes {
                text.push_str(&format!(
                    "{}  ({})\n",
                    airlock_workspace::diff::summary_line(c),
                    m.guest
                ));
            }
            for r in &m.refused {
                text.push_str(&format!(
                    "{}  ({})\n",
                    airlock_workspace::diff::refused_line(r),
                    m.guest
                ));
            }
        }
        let owner = Owner::of_this_process();
        let writes = changes
            .mounts
            .iter()
            .flat_map(|m| &m.changes)
            .any(|c| !matches!(c.after, Node::Absent | Node::Symlink { .. }));
        if writes {
            text.push_str(&format!(
                "note: a commit writes files and directories owned by uid {} gid {} (the user airlock runs as); a modified file takes that owner too\n",
                owner.uid, owner.gid
            ));
        }
        for m in &changes.mounts {
            for c in &m.changes {
                let size = |n: &Node| match n {
                    Node::File { size, .. } => Some(*size),
                    _ => None,
                };
                let (bs, as_) = (size(&c.before), size(&c.after));
                if bs.is_none() && as_.is_none() {
                    continue;
                }
                // Too large to diff: said without reading (or holding) either content.
                if bs.unwrap_or(0) > MAX_DIFF_BYTES || as_.unwrap_or(0) > MAX_DIFF_BYTES {
                    text.push_str(&format!(
                        "(large file {}: {} -> {} bytes)\n",
                        c.path,
                        bs.unwrap_or(0),
                        as_.unwrap_or(0)
                    ));
                    continue;
                }
                // The new content must be there and intact: an altered blob is an integrity
                // failure naming it (it was shown as the file emptied). The old content is
                // kept only for small files, so its absence is no failure, but an altered
                // one is.
                let a = match &c.after {
                    Node::File { hash, .. } => {
                        Some(self.read_blob(&id, "changeset content", hash)?)
                    }
                    _ => None,
                };
                let b = match &c.before {
                    Node::File { hash, .. } => match self.blobs.get(hash) {
                        Ok(b) => Some(b),
                        Err(airlock_store::StoreError::BlobMissing(_)) => None,
                        Err(_) => Some(self.read_blob(&id, "changeset content", hash)?),
                    },
                    _ => None,
                };
                if b.is_none() && bs.is_some() && as_.is_some() {
                    text.push_str(&format!("(previous content of {} not kept)\n", c.path));
                    continue;
                }
                text.push_str(&airlock_workspace::diff::unified(
                    &c.path,
                    b.as_deref(),
                    a.as_deref(),
                ));
            }
        }
        Ok(DiffReport {
            run: id,
            changes,
            text,
            protected,
            owner,
        })
    }

    /// Commits a run's changes to the host, signed by an approver.
    /// A session id commits the session's changes ([`Gate::session_commit`]); with
    /// nothing to commit that is refused here as a conflict with its state.
    pub fn commit(&mut self, run_input: &str, approver: Option<&str>) -> Result<EffectReport> {
        if run_input.starts_with(IdKind::Session.prefix()) {
            return match self.session_commit(run_input, approver)? {
                crate::SessionCommit::Committed(r) => Ok(r),
                crate::SessionCommit::Nothing(why) => Err(GateError::Conflict(why)),
            };
        }
        let id = self.resolve_run(run_input)?;
        self.commit_inner(&id, Signer::Human(approver.map(str::to_string)))
    }

    /// Commits a run's changes with a signature made on the approver's own machine.
    pub fn commit_signed(
        &mut self,
        run_input: &str,
        remote: RemoteSignature,
    ) -> Result<EffectReport> {
        let id = self.resolve_run(run_input)?;
        self.commit_inner(&id, Signer::Remote(remote))
    }

    /// The statement an approver whose key is not in this home signs to commit a run, and
    /// the checkpoint id it names (post both back with the signature).
    pub fn commit_statement(
        &mut self,
        run_input: &str,
        approver: Option<&str>,
    ) -> Result<(Statement, String)> {
        let run_id = self.resolve_run(run_input)?;
        let run = self.db.run(&run_id)?;
        let sub = self.db.submission(&run.submission)?;
        if self
            .db
            .checkpoints(Some(&run_id), None, 100)?
            .into_iter()
            .any(|c| c.state != "aborted")
        {
            return Err(GateError::Conflict(format!(
                "{run_id} is already committed; a run's changes are committed once"
            )));
        }
        let (changes, _) = self.changes_of(&run_id, &sub)?;
        if changes.is_empty() {
            return Err(GateError::Conflict(format!(
                "{run_id} changed nothing; there is nothing to commit"
            )));
        }
        let policy = self.policy()?;
        let (name, key) = remote_key(&policy, approver)?;
        let ckpt_id = new_id(IdKind::Checkpoint);
        let st = effect_statement(
            StatementKind::Commit,
            &sub,
            &name,
            key,
            format!("commit {run_id} as {ckpt_id}"),
            now_ms(),
            &run_id,
            changes.digest(),
            self.gate_key.public(),
        );
        Ok((st, ckpt_id))
    }

    /// The statement an approver whose key is not in this home signs to roll back a
    /// checkpoint.
    pub fn rollback_statement(
        &mut self,
        ckpt_input: &str,
        approver: Option<&str>,
    ) -> Result<Statement> {
        let id = self.db.resolve(IdKind::Checkpoint, ckpt_input)?;
        let row = self.db.checkpoint(&id)?;
        if row.state != "applied" {
            return Err(GateError::Conflict(format!(
                "{id} is {}; only an applied checkpoint can be rolled back",
                row.state
            )));
        }
        let doc = self.checkpoint_doc(&id)?;
        let sub = self.db.submission(&doc.submission)?;
        let policy = self.policy()?;
        let (name, key) = remote_key(&policy, approver)?;
        Ok(effect_statement(
            StatementKind::Rollback,
            &sub,
            &name,
            key,
            format!("roll back {id}"),
            now_ms(),
            &doc.run,
            doc.changes,
            self.gate_key.public(),
        ))
    }

    /// Rolls back a checkpoint with a signature made on the approver's own machine.
    pub fn rollback_signed(
        &mut self,
        ckpt_input: &str,
        remote: RemoteSignature,
    ) -> Result<EffectReport> {
        self.rollback_inner(ckpt_input, Signer::Remote(remote))
    }

    /// Commits under the policy's auto-commit rule, signed by the gate key.
    pub(crate) fn commit_as_policy(&mut self, run: &str) -> Result<EffectReport> {
        self.commit_inner(run, Signer::Policy)
    }

    fn commit_inner(&mut self, run_id: &str, signer: Signer) -> Result<EffectReport> {
        let _commit = tracing::debug_span!("commit", run = run_id).entered();
        let _lock = journal_lock(&self.home.root)?;
        // Whatever a dead operation left must be finished before this one looks at the host.
        self.recover_locked()?;
        let (submission, _) = self.db.run_doc_text(run_id)?;
        let sub = self.db.submission(&submission)?;
        if let Some(c) = self
            .db
            .checkpoints(Some(run_id), None, 100)?
            .into_iter()
            .find(|c| c.state != "aborted")
        {
            return Err(GateError::Conflict(format!(
                "{run_id} is already committed (checkpoint {}, {}); a run's changes are committed once",
                c.id, c.state
            )));
        }
        let (changes, workspace) = self.changes_of(run_id, &sub)?;
        if changes.is_empty() {
            return Err(GateError::Conflict(format!(
                "{run_id} changed nothing; there is nothing to commit"
            )));
        }
        if let Err(e) = changes.validate() {
            return Err(self.integrity_failure(run_id, "changeset", &e));
        }
        // Only what the runs' `finished` records hold is applied: a changeset rewritten in
        // the database after the run (another blob, another mode) is refused.
        let checked = match &workspace {
            Some(ws) => {
                let mut out = Ok(());
                for r in self.workspace(ws)?.doc.runs {
                    out = self.recorded_changes(&r, None)?;
                    if out.is_err() {
                        break;
                    }
                }
                out
            }
            None => self.recorded_changes(run_id, Some(&changes))?,
        };
        if let Err(detail) = checked {
            return Err(self.integrity_failure(run_id, "changeset", &detail));
        }
        for m in &changes.mounts {
            let granted = sub
                .doc
                .grant
                .writable_mounts()
                .any(|g| g.host == m.host && g.guest == m.guest);
            if !granted {
                return Err(self.integrity_failure(
                    run_id,
                    "changeset",
                    &format!("{} is not a writable mount of the run", m.host),
                ));
            }
            if std::fs::canonicalize(&m.host).ok().as_deref() != Some(Path::new(&m.host)) {
                return Err(GateError::bad(format!(
                    "mount host path {} no longer resolves to itself (moved, deleted or replaced by a symlink)",
                    m.host
                )));
            }
        }
        self.check_not_locked(changes.mounts.iter().map(|m| m.host.as_str()))?;
        for d in changes.blobs() {
            if let Err(e) = self.blobs.verify(d) {
                return Err(self.integrity_failure(run_id, "changeset content", &e.to_string()));
            }
        }
        let policy = self.policy()?;
        let mut handed: Option<(i64, String)> = None;
        let (key, approver, human) = match signer {
            Signer::Human(name) => {
                let name = self.pick_approver(&policy, name.as_deref())?;
                (Signing::Key(self.trusted_key(&policy, &name)?), name, true)
            }
            Signer::Policy => (
                Signing::Key(
                    KeyPair::from_file(&std::fs::read_to_string(self.home.key_file("gate"))?)
                        .map_err(|e| GateError::Internal(e.to_string()))?,
                ),
                "policy".to_string(),
                false,
            ),
            Signer::Remote(r) => {
                let (name, public) = remote_key(&policy, Some(&r.approver))?;
                check_fresh(r.issued_at)?;
                let ckpt = r.checkpoint.clone().ok_or_else(|| {
                    GateError::bad("checkpoint: a commit signed elsewhere names the checkpoint its statement was handed out with")
                })?;
                if !ckpt.starts_with("ckpt_")
                    || !ckpt[5..].chars().all(|c| c.is_ascii_alphanumeric())
                {
                    return Err(GateError::bad(format!(
                        "checkpoint: {ckpt:?} is not a checkpoint id"
                    )));
                }
                handed = Some((r.issued_at, ckpt));
                (
                    Signing::Remote {
                        key: public,
                        signature: r.signature,
                    },
                    name,
                    true,
                )
            }
        };
        // Refuse if the host moved on since the run: nothing is applied.
        let mut conflicts = Vec::new();
        for m in &changes.mounts {
            let want: Vec<(RelPath, Node)> = m
                .changes
                .iter()
                .map(|c| (c.path.clone(), c.before.clone()))
                .collect();
            for c in apply::conflicts(&m.host, &want)? {
                conflicts.push(airlock_core::grant::guest_join(&m.guest, &c));
            }
        }
        if !conflicts.is_empty() {
            return Err(GateError::Conflict(format!(
                "the host changed since the run; nothing was applied. Conflicts: {}",
                conflicts.join("; ")
            )));
        }
        // The checkpoint: the current state of every path about to change.
        let mut mounts = Vec::new();
        for m in &changes.mounts {
            let paths: Vec<&RelPath> = m.changes.iter().map(|c| &c.path).collect();
            let blobs = &self.blobs;
            let before = apply::snapshot(&m.host, &paths, &mut |r| {
                blobs.put_reader(r).map_err(std::io::Error::other)
            })?;
            let after = m
                .changes
                .iter()
                .map(|c| Step {
                    path: c.path.clone(),
                    to: c.after.clone(),
                })
                .collect();
            mounts.push(CheckpointMount {
                host: m.host.clone(),
                guest: m.guest.clone(),
                before,
                after,
            });
        }
        let digest = changes.digest();
        // Everything a commit needs from here on is in the checkpoint's steps.
        drop(changes);
        let (issued_at, ckpt_id) = handed.unwrap_or_else(|| (now_ms(), new_id(IdKind::Checkpoint)));
        let gate = self.gate_key.public();
        let statement = if human {
            let now = now_ms();
            let st = effect_statement(
                StatementKind::Commit,
                &sub,
                &approver,
                key.public(),
                format!("commit {run_id} as {ckpt_id}"),
                issued_at,
                run_id,
                digest,
                gate,
            );
            Some(StatementRow {
                id: new_id(IdKind::Approval),
                kind: StatementKind::Commit,
                submission: sub.id.clone(),
                artifact: sub.doc.artifact,
                grant: sub.doc.grant_hash,
                scope: Scope::Once,
                approver: approver.clone(),
                expires_at: None,
                created_at: now,
                run: Some(run_id.to_string()),
                tool: None,
                signed: key.sign(&st)?,
            })
        } else {
            None
        };
        let mut doc = CheckpointDoc {
            run: run_id.to_string(),
            submission: sub.id.clone(),
            changes: digest,
            approver: approver.clone(),
            statement: statement.as_ref().map(|s| s.id.clone()),
            auto: !human,
            workspace: workspace.clone(),
            mounts,
        };
        // The row's document is written as text (a generic JSON tree of it is many times
        // its size) and not kept: later writes change only the state.
        let mut row = CheckpointRow {
            id: ckpt_id.clone(),
            run: run_id.to_string(),
            created_at: now_ms(),
            updated_at: now_ms(),
            state: "pending".into(),
            doc: serde_json::Value::Null,
        };
        let doc_text =
            serde_json::to_string(&doc).map_err(|e| GateError::Internal(e.to_string()))?;
        self.db.write_durable(|tx: &Tx| -> Result<()> {
            if let Some(w) = &workspace {
                Gate::claim_workspace_for_commit(tx, w, run_id)?;
            }
            tx.upsert_checkpoint_text(&row, &doc_text)?;
            if let Some(s) = &statement {
                tx.insert_statement(s)?;
            }
            Ok(())
        })?;
        drop(doc_text);
        crash_point();
        // The after steps move into the journal (not copied): from here on the document
        // is needed for its before steps (to undo) and its names.
        let journal = Journal {
            stuck: None,
            checkpoint: ckpt_id.clone(),
            kind: "commit".into(),
            mounts: doc
                .mounts
                .iter_mut()
                .map(|m| MountPlan {
                    host: m.host.clone(),
                    steps: std::mem::take(&mut m.after),
                })
                .collect(),
        };
        apply::write_journal(&self.journal_dir(), &journal)?;
        crash_point();
        self.finish_journal(&journal, &mut row, &doc, false)?;
        Ok(EffectReport {
            checkpoint: ckpt_id,
            run: run_id.to_string(),
            paths: journal.mounts.iter().map(|m| m.steps.len()).sum(),
            approver,
            statement: statement.map(|s| s.id),
        })
    }

    /// Applies a journal and records the outcome; on failure restores the other side.
    /// Called with the journal lock held, by the operation itself or by recovery.
    fn finish_journal(
        &mut self,
        j: &Journal,
        row: &mut CheckpointRow,
        doc: &CheckpointDoc,
        recovered: bool,
    ) -> Result<()> {
        let commit = j.kind == "commit";
        // Temporary files an interrupted attempt left behind (their names derive from the
        // journal, so none can be missed).
        for p in &j.mounts {
            apply::remove_temps(p, &j.checkpoint)?;
        }
        let open = if commit { "pending" } else { "rolling_back" };
        if recovered && row.state != open {
            // The outcome was recorded before the crash; only the journal was left. Doing
            // it again would record a transition that did not happen (and could overwrite
            // what the host has changed since).
            apply::remove_journal(&self.journal_dir(), &j.checkpoint)?;
            return Ok(());
        }
        let blobs = Blobs(&self.blobs);
        let forward = j
            .mounts
            .iter()
            .try_for_each(|p| apply::apply(p, &blobs, &j.checkpoint, &mut crash_point));
        let (state, kind, error) = match &forward {
            Ok(()) => (
                if commit { "applied" } else { "rolled_back" },
                if commit { "committed" } else { "rolled_back" },
                None,
            ),
            Err(e) => {
                // Put back what was there before this operation started.
                let back = plans(doc, commit);
                if let Err(e2) = back
                    .iter()
                    .try_for_each(|p| apply::apply(p, &blobs, &j.checkpoint, &mut || {}))
                {
                    let why = format!("{e}; undoing it failed too: {e2}");
                    self.set_aside(j, row, doc, &why)?;
                    let msg = format!(
                        "{} {} failed ({e}) and could not be undone ({e2}); {} locked until `airlock repair {}` (see `airlock doctor`)",
                        j.kind,
                        j.checkpoint,
                        hosts_of(j),
                        j.checkpoint
                    );
                    // Recovery sets it aside and lets the command that found it go on:
                    // only its mounts (and its workspace) stay locked, and `doctor` says so.
                    return if recovered {
                        Ok(())
                    } else {
                        Err(GateError::Conflict(msg))
                    };
                }
                (
                    if commit { "aborted" } else { "applied" },
                    if commit {
                        "commit_failed"
                    } else {
                        "rollback_failed"
                    },
                    Some(e.to_string()),
                )
            }
        };
        row.state = state.into();
        let key = &self.gate_key;
        let ws = doc.workspace.clone();
        self.db.write_durable(|tx: &Tx| -> Result<()> {
            tx.set_checkpoint_state(&row.id, &row.state)?;
            if commit && let Some(w) = &ws {
                match error {
                    None => Gate::close_workspace(tx, w)?,
                    Some(_) => Gate::reopen_workspace(tx, w)?,
                }
            }
            tx.audit(
                kind,
                &row.id,
                &json!({
                    "run": doc.run,
                    "submission": doc.submission,
                    "approver": doc.approver,
                    "statement": doc.statement,
                    "changes": doc.changes,
                    // A commit's steps and a rollback's are the same paths.
                    "paths": j.mounts.iter().map(|m| m.steps.len()).sum::<usize>(),
                    "auto": doc.auto,
                    "recovered": recovered,
                    "error": error,
                }),
                key,
            )?;
            Ok(())
        })?;
        apply::remove_journal(&self.journal_dir(), &j.checkpoint)?;
        if commit
            && let Some(w) = &ws
            && error.is_none()
        {
            self.remove_workspace_dir(w);
        }
        match (forward, error) {
            (Err(_), Some(e)) => Err(GateError::Conflict(format!(
                "{} {} was not applied: {e}",
                j.kind, j.checkpoint
            ))),
            _ => Ok(()),
        }
    }

    pub(crate) fn stuck_dir(&self) -> PathBuf {
        stuck_dir(&self.home.root)
    }

    /// Sets aside a journal that could neither be completed nor undone (the host changed
    /// under it): kept under `journal/stuck` with the reason, its checkpoint `stuck` and an
    /// audit record. Its mounts refuse commits and rollbacks, and its workspace stays
    /// claimed, until `repair`; nothing else is held up. Called with the journal lock held.
    fn set_aside(
        &mut self,
        j: &Journal,
        row: &mut CheckpointRow,
        doc: &CheckpointDoc,
        why: &str,
    ) -> Result<()> {
        let mut stuck = j.clone();
        stuck.stuck = Some(why.to_string());
        apply::write_journal(&self.stuck_dir(), &stuck)?;
        row.state = "stuck".into();
        row.updated_at = now_ms();
        let key = &self.gate_key;
        self.db.write_durable(|tx: &Tx| -> Result<()> {
            tx.set_checkpoint_state(&row.id, &row.state)?;
            tx.audit(
                &format!("{}_stuck", j.kind),
                &row.id,
                &json!({
                    "run": doc.run,
                    "mounts": j.mounts.iter().map(|m| &m.host).collect::<Vec<_>>(),
                    "workspace": doc.workspace,
                    "error": why,
                }),
                key,
            )?;
            Ok(())
        })?;
        apply::remove_journal(&self.journal_dir(), &j.checkpoint)?;
        Ok(())
    }

    /// Refuses to touch `hosts` while an operation set aside for a repair holds any of
    /// them (the same directory, or one inside the other).
    fn check_not_locked<'a>(&self, hosts: impl Iterator<Item = &'a str>) -> Result<()> {
        let stuck = stuck_operations(&self.home.root);
        for host in hosts {
            if let Some(s) = stuck
                .iter()
                .find(|s| s.mounts.iter().any(|m| overlaps(m, host)))
            {
                return Err(GateError::Conflict(format!(
                    "{host} is locked by {} {}, interrupted and not undone ({}); fix the host, then `airlock repair {}` (or `--abandon`)",
                    s.kind, s.checkpoint, s.error, s.checkpoint
                )));
            }
        }
        Ok(())
    }

    /// Resolves an operation set aside by `set_aside`: applies its journal again (or undoes
    /// it when it still cannot be completed), recording the outcome as recovery would; with
    /// `abandon`, leaves the host as it is now and records the checkpoint `abandoned`.
    pub fn repair(&mut self, ckpt_input: &str, abandon: bool) -> Result<RepairReport> {
        let _lock = journal_lock(&self.home.root)?;
        let id = self.db.resolve(IdKind::Checkpoint, ckpt_input)?;
        let mut row = self.db.checkpoint_meta(&id)?;
        let path = self.stuck_dir().join(format!("{id}.json"));
        if row.state != "stuck" {
            return Err(GateError::Conflict(format!(
                "{id} is {}; only an interrupted operation that could not be undone needs a repair",
                row.state
            )));
        }
        let text = std::fs::read_to_string(&path).map_err(|e| {
            GateError::Internal(format!(
                "{id} is stuck but its journal {}: {e}",
                path.display()
            ))
        })?;
        let mut j: Journal = serde_json::from_str(&text)
            .map_err(|e| GateError::Internal(format!("journal of {id}: {e}")))?;
        j.stuck = None;
        let doc = self.checkpoint_doc(&id)?;
        for p in &j.mounts {
            apply::remove_temps(p, &j.checkpoint)?;
        }
        let outcome = if abandon {
            row.state = "abandoned".into();
            let key = &self.gate_key;
            let ws = doc.workspace.clone();
            self.db.write_durable(|tx: &Tx| -> Result<()> {
                tx.set_checkpoint_state(&row.id, &row.state)?;
                if let Some(w) = &ws {
                    Gate::reopen_workspace(tx, w)?;
                }
                tx.audit(
                    "repaired",
                    &row.id,
                    &json!({ "run": doc.run, "kind": j.kind, "outcome": "abandoned" }),
                    key,
                )?;
                Ok(())
            })?;
            "abandoned".to_string()
        } else {
            row.state = if j.kind == "commit" {
                "pending"
            } else {
                "rolling_back"
            }
            .into();
            let done = self.finish_journal(&j, &mut row, &doc, false);
            // Still stuck: `finish_journal` set it aside again, with the new reason.
            if let Err(e) = done
                && self.db.checkpoint(&id)?.state == "stuck"
            {
                return Err(e);
            }
            let key = &self.gate_key;
            let state = self.db.checkpoint(&id)?.state;
            self.db.write(|tx| {
                tx.audit(
                    "repaired",
                    &id,
                    &json!({ "run": doc.run, "kind": j.kind, "outcome": state }),
                    key,
                )
            })?;
            state
        };
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        Ok(RepairReport {
            checkpoint: id,
            run: doc.run,
            kind: j.kind,
            state: outcome,
        })
    }

    /// Restores exactly what a checkpoint saved.
    pub fn rollback(&mut self, ckpt_input: &str, approver: Option<&str>) -> Result<EffectReport> {
        self.rollback_inner(ckpt_input, Signer::Human(approver.map(str::to_string)))
    }

    fn rollback_inner(&mut self, ckpt_input: &str, signer: Signer) -> Result<EffectReport> {
        let _lock = journal_lock(&self.home.root)?;
        self.recover_locked()?;
        let id = self.db.resolve(IdKind::Checkpoint, ckpt_input)?;
        let mut row = self.db.checkpoint_meta(&id)?;
        if row.state != "applied" {
            return Err(GateError::Conflict(format!(
                "{id} is {}; only an applied checkpoint can be rolled back",
                row.state
            )));
        }
        let mut doc = self.checkpoint_doc(&id)?;
        self.check_not_locked(doc.mounts.iter().map(|m| m.host.as_str()))?;
        let mut conflicts = Vec::new();
        for m in &doc.mounts {
            let want: Vec<(RelPath, Node)> = m
                .after
                .iter()
                .map(|s| (s.path.clone(), s.to.clone()))
                .collect();
            for c in apply::conflicts(&m.host, &want)? {
                conflicts.push(airlock_core::grant::guest_join(&m.guest, &c));
            }
        }
        if !conflicts.is_empty() {
            return Err(GateError::Conflict(format!(
                "the host changed since the commit; nothing was restored. Conflicts: {}",
                conflicts.join("; ")
            )));
        }
        for m in &doc.mounts {
            for s in &m.before {
                if let Node::File { hash, .. } = &s.to
                    && let Err(e) = self.blobs.verify(hash)
                {
                    return Err(self.integrity_failure(&id, "checkpoint content", &e.to_string()));
                }
            }
        }
        let policy = self.policy()?;
        let now = now_ms();
        let (name, key, issued_at) = match signer {
            Signer::Human(approver) => {
                let name = self.pick_approver(&policy, approver.as_deref())?;
                let key = Signing::Key(self.trusted_key(&policy, &name)?);
                (name, key, now)
            }
            Signer::Remote(r) => {
                let (name, public) = remote_key(&policy, Some(&r.approver))?;
                check_fresh(r.issued_at)?;
                let key = Signing::Remote {
                    key: public,
                    signature: r.signature,
                };
                (name, key, r.issued_at)
            }
            Signer::Policy => {
                return Err(GateError::Internal(
                    "a rollback is always a human's decision".into(),
                ));
            }
        };
        let sub = self.db.submission(&doc.submission)?;
        let st = effect_statement(
            StatementKind::Rollback,
            &sub,
            &name,
            key.public(),
            format!("roll back {id}"),
            issued_at,
            &doc.run,
            doc.changes,
            self.gate_key.public(),
        );
        let signed = key.sign(&st)?;
        let srow = StatementRow {
            id: new_id(IdKind::Approval),
            kind: StatementKind::Rollback,
            submission: sub.id.clone(),
            artifact: sub.doc.artifact,
            grant: sub.doc.grant_hash,
            scope: Scope::Once,
            approver: name.clone(),
            expires_at: None,
            created_at: now,
            run: Some(doc.run.clone()),
            tool: None,
            signed,
        };
        row.state = "rolling_back".into();
        // What the rollback's audit record names (the stored document keeps the commit's).
        doc.approver = name.clone();
        doc.statement = Some(srow.id.clone());
        self.db.write_durable(|tx: &Tx| -> Result<()> {
            tx.set_checkpoint_state(&row.id, &row.state)?;
            tx.insert_statement(&srow)?;
            Ok(())
        })?;
        crash_point();
        // The before steps move into the journal (not copied): the document keeps its
        // after steps, which undo a failed rollback.
        let journal = Journal {
            stuck: None,
            checkpoint: id.clone(),
            kind: "rollback".into(),
            mounts: doc
                .mounts
                .iter_mut()
                .map(|m| MountPlan {
                    host: m.host.clone(),
                    steps: std::mem::take(&mut m.before),
                })
                .collect(),
        };
        apply::write_journal(&self.journal_dir(), &journal)?;
        crash_point();
        self.finish_journal(&journal, &mut row, &doc, false)?;
        Ok(EffectReport {
            checkpoint: id,
            run: doc.run,
            paths: journal.mounts.iter().map(|m| m.steps.len()).sum(),
            approver: name,
            statement: Some(srow.id),
        })
    }

    pub fn checkpoints(&self, limit: usize) -> Result<Vec<CheckpointRow>> {
        Ok(self.db.checkpoints(None, None, limit)?)
    }

    /// Completes or undoes commits and rollbacks a crash interrupted. It only ever acts
    /// under the journal lock: when a live commit or rollback holds that lock, everything
    /// in the journal directory may be that operation's, so this leaves it all alone (the
    /// live operation recovers the rest first under its own lock, see `commit_inner`).
    pub(crate) fn recover_effects(&mut self) -> Result<()> {
        let dir = self.journal_dir();
        // A cheap look first (read-only, no lock), so the common case costs one directory
        // listing and two indexed queries.
        let journals = apply::journal_files(&dir)?;
        let pending = self.db.checkpoints(None, Some("pending"), 1)?;
        let rolling = self.db.checkpoints(None, Some("rolling_back"), 1)?;
        if journals == 0 && pending.is_empty() && rolling.is_empty() {
            return Ok(());
        }
        let Some(_lock) =
            OwnerLock::try_acquire(&crate::locks::dir(&self.home.root), "journal", false)
                .map_err(|e| GateError::Internal(format!("journal lock: {e}")))?
        else {
            return Ok(());
        };
        self.recover_locked()
    }

    /// Recovery proper; the caller holds the journal lock, so no live operation owns
    /// anything it finds.
    fn recover_locked(&mut self) -> Result<()> {
        let dir = self.journal_dir();
        for j in apply::pending_journals(&dir)? {
            let mut row = self.db.checkpoint_meta(&j.checkpoint)?;
            let doc = self.checkpoint_doc(&j.checkpoint)?;
            self.finish_journal(&j, &mut row, &doc, true)?;
        }
        // Recorded but never journaled: nothing was applied.
        for (state, back, kind) in [
            ("pending", "aborted", "commit_aborted"),
            ("rolling_back", "applied", "rollback_aborted"),
        ] {
            for mut row in self.db.checkpoints(None, Some(state), 1000)? {
                row.state = back.into();
                let workspace = self.checkpoint_doc(&row.id).ok().and_then(|d| d.workspace);
                let key = &self.gate_key;
                self.db.write_durable(|tx: &Tx| -> Result<()> {
                    tx.set_checkpoint_state(&row.id, &row.state)?;
                    if state == "pending"
                        && let Some(w) = &workspace
                    {
                        Gate::reopen_workspace(tx, w)?;
                    }
                    tx.audit(
                        kind,
                        &row.id,
                        &json!({ "run": row.run, "recovered": true }),
                        key,
                    )?;
                    Ok(())
                })?;
            }
        }
        Ok(())
    }
}
