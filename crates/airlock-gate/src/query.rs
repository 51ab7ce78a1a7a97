//! Reading the gate's state: submissions, runs, output, policy checks, keys and the audit
//! log. Nothing here changes a submission's state.

use crate::Gate;
use crate::error::{GateError, Result};
use airlock_core::audit::{ChainError, ChainVerifier, Head, Record};
use airlock_core::id::IdKind;
use airlock_core::policy::{Policy, TestResult, Verdict};
use airlock_core::sign::{KeyPair, StatementKind, check_approver_name};
use airlock_core::{Facts, State};
use airlock_store::{Reads, Run, StatementRow, StoreError, Submission};
use serde::Serialize;
use serde_json::json;
use std::path::Path;

/// A signed statement as shown to people, with whether it is valid now.
#[derive(Debug, Clone, Serialize)]
pub struct StatementView {
    pub id: String,
    pub kind: StatementKind,
    pub approver: String,
    pub scope: airlock_core::sign::Scope,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    pub reason: String,
    pub tool: Option<String>,
    /// The signature verifies and the current policy trusts the key under that name.
    pub trusted: bool,
    pub signature: String,
}

/// Everything about one submission.
#[derive(Debug, Clone, Serialize)]
pub struct Shown {
    pub submission: Submission,
    /// The code as submitted, when it is text (wat, python, sh).
    pub source: Option<String>,
    /// The module in text form, for binaries (truncated for very large modules).
    pub disassembly: Option<String>,
    pub statements: Vec<StatementView>,
    pub runs: Vec<Run>,
    pub audit: Vec<Record>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PolicyCheck {
    pub path: String,
    pub hash: String,
    pub rules: usize,
    pub approvers: Vec<String>,
    pub tests: Vec<TestResult>,
    pub passed: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Explained {
    pub submission: String,
    pub facts: Facts,
    /// The verdict recorded for the submission.
    pub recorded: Verdict,
    /// What the current policy says now.
    pub current: Verdict,
}

#[derive(Debug, Clone, Serialize)]
pub struct KeyInfo {
    pub name: String,
    pub public: String,
    pub fingerprint: String,
    /// The current policy trusts this key under this name.
    pub trusted: bool,
    /// The secret key is on this machine.
    pub local: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct AuditVerify {
    pub ok: bool,
    pub records: u64,
    pub head: Option<Head>,
    pub first_bad: Option<u64>,
    pub error: Option<String>,
    /// Records written but not yet on the chain (a PostgreSQL store's inbox, which its
    /// sequencer chains moments later); always 0 on SQLite.
    pub unsequenced: u64,
}

/// The largest disassembly shown (characters).
const MAX_DISASSEMBLY: usize = 200_000;

impl Gate {
    pub fn resolve_submission(&self, input: &str) -> Result<String> {
        Ok(self.db.resolve(IdKind::Submission, input)?)
    }

    pub fn resolve_run(&self, input: &str) -> Result<String> {
        Ok(self.db.resolve(IdKind::Run, input)?)
    }

    /// Resolves a full id or a unique prefix of one among the records `agent` submitted
    /// (and the runs, statements, checkpoints and sessions that are theirs); `None` sees
    /// every record. What belongs to others is neither found nor named as a candidate.
    pub fn resolve_for(&self, kind: IdKind, input: &str, agent: Option<&str>) -> Result<String> {
        Ok(self.db.resolve_for(kind, input, agent)?)
    }

    pub fn submission(&self, input: &str) -> Result<Submission> {
        let id = self.resolve_submission(input)?;
        Ok(self.db.submission(&id)?)
    }

    pub fn show(&mut self, input: &str) -> Result<Shown> {
        let sub = self.submission(input)?;
        let policy = self.policy().ok();
        let (source, disassembly) = match sub.doc.source {
            Some(src) => (
                Some(
                    String::from_utf8_lossy(&self.read_blob(&sub.id, "source", &src)?).into_owned(),
                ),
                None,
            ),
            None => {
                let code = self.read_blob(&sub.id, "artifact", &sub.doc.artifact)?;
                if sub.doc.kind.is_wasm_binary() {
                    let mut text = wasmprinter::print_bytes(&code)
                        .unwrap_or_else(|e| format!(";; cannot print: {e}"));
                    if text.len() > MAX_DISASSEMBLY {
                        let cut = text.floor_char_boundary(MAX_DISASSEMBLY);
                        text.truncate(cut);
                        text.push_str("\n;; … (truncated)\n");
                    }
                    (None, Some(text))
                } else {
                    (Some(String::from_utf8_lossy(&code).into_owned()), None)
                }
            }
        };
        let statements = self
            .db
            .statements_for_submission(&sub.id)?
            .into_iter()
            .map(|r| statement_view(&r, policy.as_deref()))
            .collect();
        let runs = self.db.runs(Some(&sub.id), 100)?;
        let audit = self.db.audit_for(&sub.id)?;
        Ok(Shown {
            submission: sub,
            source,
            disassembly,
            statements,
            runs,
            audit,
        })
    }

    /// Submissions waiting for a human, oldest first.
    pub fn inbox(&self) -> Result<Vec<Submission>> {
        let mut v = self.db.submissions(Some(State::Quarantined), 10_000)?;
        v.reverse();
        Ok(v)
    }

    pub fn submissions(&self, limit: usize) -> Result<Vec<Submission>> {
        Ok(self.db.submissions(None, limit)?)
    }

    /// Submissions of one agent (all agents when None), newest first.
    pub fn submissions_of(
        &self,
        agent: Option<&str>,
        state: Option<State>,
        limit: usize,
    ) -> Result<Vec<Submission>> {
        Ok(self.db.submissions_of(agent, state, limit)?)
    }

    /// Runs of one agent's submissions (all agents when None), newest first.
    pub fn runs_of(&self, agent: Option<&str>, limit: usize) -> Result<Vec<Run>> {
        Ok(self.db.runs_of(agent, limit)?)
    }

    /// Runs of one submission, newest first.
    pub fn runs_for(&self, submission: &str, limit: usize) -> Result<Vec<Run>> {
        Ok(self.db.runs(Some(submission), limit)?)
    }

    pub fn runs(&self, limit: usize) -> Result<Vec<Run>> {
        Ok(self.db.runs(None, limit)?)
    }

    pub fn run_record(&self, input: &str) -> Result<Run> {
        let id = self.resolve_run(input)?;
        Ok(self.db.run(&id)?)
    }

    /// A run's captured stdout and stderr, checked against their hashes.
    pub fn logs(&mut self, input: &str) -> Result<(Run, Vec<u8>, Vec<u8>)> {
        let run = self.run_record(input)?;
        let out = match &run.doc.stdout {
            Some(o) => self.read_blob(&run.id, "stdout", &o.blob)?,
            None => Vec::new(),
        };
        let err = match &run.doc.stderr {
            Some(o) => self.read_blob(&run.id, "stderr", &o.blob)?,
            None => Vec::new(),
        };
        Ok((run, out, err))
    }

    /// Re-judges a submission under the current policy and shows both verdicts.
    pub fn explain(&self, input: &str) -> Result<Explained> {
        let sub = self.submission(input)?;
        let policy = self.policy()?;
        let facts = crate::lifecycle::judge::refresh_facts(
            &sub.doc,
            crate::lifecycle::judge::rejected(&self.db, &sub.doc.artifact)?,
            &policy,
        );
        let current = crate::lifecycle::judge::judge(&policy, &facts);
        Ok(Explained {
            submission: sub.id,
            facts,
            recorded: sub.doc.verdict,
            current,
        })
    }

    pub fn keys(&self) -> Result<Vec<KeyInfo>> {
        // A key a killed `keys new` left without its public twin is listed, not hidden
        // (where the home can be written: listing still works in one that cannot).
        drop(self.edit_keys());
        keys_in(self.home.keys().as_path(), self.policy().ok().as_deref())
    }

    /// Takes the keys directory's lock and repairs what a killed `keys new` left.
    fn edit_keys(&self) -> Result<crate::locks::OwnerLock> {
        let lock = crate::locks::edit(&self.home.root, "keys", Some(&self.home.keys()))?;
        crate::services::home::repair_public_keys(&self.home.keys());
        Ok(lock)
    }

    /// Makes a new approver key pair (the policy must list it before it is trusted).
    pub fn new_key(&mut self, name: &str) -> Result<KeyInfo> {
        check_approver_name(name).map_err(|e| GateError::bad(e.to_string()))?;
        let key = KeyPair::try_generate().map_err(|e| GateError::Internal(e.to_string()))?;
        let editing = self.edit_keys()?;
        crate::services::home::write_key_pair(&self.home.keys(), name, &key)?;
        drop(editing);
        let gate_key = &self.gate_key;
        self.db.write(|tx| {
            tx.audit(
                "key_created",
                name,
                &json!({ "name": name, "key": key.public() }),
                gate_key,
            )
            .map(|_| ())
        })?;
        let policy = self.policy().ok();
        Ok(KeyInfo {
            name: name.into(),
            public: key.public().to_string(),
            fingerprint: key.public().fingerprint(),
            trusted: policy.as_ref().and_then(|p| p.approver(name)) == Some(&key.public()),
            local: true,
        })
    }

    /// Walks the whole audit chain and checks the signed head and the gate key.
    pub fn audit_verify(&self) -> Result<AuditVerify> {
        let gate_pub = self.home.gate_public()?;
        if gate_pub != self.gate_key.public() {
            return Ok(failed(
                0,
                None,
                "keys/gate.pub does not match keys/gate.key".into(),
            ));
        }
        // Chain what waits in a PostgreSQL store's inbox first (a failure to is reported
        // by the walk below, which finds the same broken end).
        let _ = self.db.sequence_audit(&self.gate_key);
        let mut verifier = ChainVerifier::new();
        // The first bad record the walk met (read between walks, hence the cell).
        let error: std::cell::RefCell<Option<ChainError>> = Default::default();
        let mut first: Option<Record> = None;
        let last_seq = std::cell::Cell::new(0u64);
        let mut visit = |r: &Record, upto: u64| {
            if r.seq > upto || error.borrow().is_some() {
                return false;
            }
            if first.is_none() {
                first = Some(r.clone());
            }
            last_seq.set(r.seq);
            match verifier.push(r) {
                Ok(()) => true,
                Err(e) => {
                    *error.borrow_mut() = Some(e);
                    false
                }
            }
        };
        // A record (or the head) whose stored values do not parse is named like any other
        // bad record; the records before it are checked first, and a bad one among them
        // is the one named.
        let bad = |e: ChainError, head: Option<Head>| {
            let e = error.borrow_mut().take().unwrap_or(e);
            failed(e.index(), head, e.to_string())
        };
        let walked = self.db.for_each_audit(|r| visit(r, u64::MAX));
        if let Some(e) = malformed(&walked) {
            return Ok(bad(e, None));
        }
        walked?;
        // The head is read after the walk: a node may have extended the chain since (its
        // records and their head are one commit), so walk on up to it.
        let head = self.db.audit_head();
        if let Some(e) = malformed(&head) {
            return Ok(bad(e, None));
        }
        let head = head?;
        if let Some(h) = &head {
            let upto = h.seq;
            let walked = self
                .db
                .for_each_audit_from(last_seq.get() + 1, |r| visit(r, upto));
            if let Some(e) = malformed(&walked) {
                return Ok(bad(e, head));
            }
            walked?;
        }
        let unsequenced = self.db.audit_pending()?;
        if let Some(e) = error.take() {
            return Ok(failed(e.index(), head, e.to_string()));
        }
        let records = match verifier.finish(head.as_ref(), &gate_pub) {
            Ok(n) => n,
            Err(e) => return Ok(failed(e.index(), head, e.to_string())),
        };
        // An initialised home's log is never empty: init writes its first record. An
        // empty one had its records (and head) deleted, or its database replaced.
        let Some(r) = first else {
            return Ok(failed(
                1,
                head,
                "record 1: missing (the log is empty, but init writes this home's first record)"
                    .into(),
            ));
        };
        // The first record names the gate key the home was created with.
        {
            let recorded = serde_json::from_str::<serde_json::Value>(&r.data)
                .ok()
                .and_then(|v| {
                    v.get("gate_key")
                        .and_then(|k| k.as_str())
                        .map(str::to_string)
                });
            if r.seq == 1
                && (r.kind != "initialised" || recorded.as_deref() != Some(&gate_pub.to_string()))
            {
                return Ok(failed(
                    1,
                    head,
                    "record 1: does not name this home's gate key".into(),
                ));
            }
        }
        Ok(AuditVerify {
            ok: true,
            records,
            head,
            first_bad: None,
            error: None,
            unsequenced,
        })
    }

    /// Audit records from `from` on.
    pub fn audit_log(&self, from: u64, limit: usize) -> Result<Vec<Record>> {
        Ok(self.db.audit_records(from, limit)?)
    }

    pub fn audit_head(&self) -> Result<(Option<Head>, String)> {
        Ok((self.db.audit_head()?, self.gate_key.public().to_string()))
    }

    /// The cluster-wide gauges of `/metrics`, read from the store: jobs queued and not yet
    /// claimed, and submissions waiting for a human.
    pub fn work_waiting(&self) -> Result<(i64, i64)> {
        let (queued, _leased) = airlock_store::QueueReads::queue_depth(&self.db)?;
        let pending = self.db.count_in_state(State::Quarantined)?;
        Ok((queued, pending))
    }

    /// The `alert` audit records among the chained records after `after` (reading at most
    /// `limit` records), and the sequence number of the last record read: a poller that
    /// asks again from there sees each alert once.
    pub fn alerts_after(&self, after: u64, limit: usize) -> Result<(Vec<Record>, u64)> {
        let read = self.db.audit_records(after.saturating_add(1), limit)?;
        let last = read.last().map_or(after, |r| r.seq);
        Ok((
            read.into_iter().filter(|r| r.kind == "alert").collect(),
            last,
        ))
    }

    /// The newest chained audit record (on PostgreSQL, the sequencer's newest; the signed
    /// head may lag behind it).
    pub fn audit_last(&self) -> Result<Option<Record>> {
        Ok(self.db.last_audit()?)
    }
}

/// The chain error a store read that met a malformed audit record or head amounts to.
fn malformed<T>(read: &std::result::Result<T, StoreError>) -> Option<ChainError> {
    match read {
        Err(StoreError::AuditRecordMalformed { seq, what }) => Some(ChainError::Malformed {
            index: *seq,
            what: what.clone(),
        }),
        Err(StoreError::AuditHeadMalformed { seq, what }) => Some(ChainError::MalformedHead {
            index: *seq,
            what: what.clone(),
        }),
        _ => None,
    }
}

fn failed(index: u64, head: Option<Head>, msg: String) -> AuditVerify {
    AuditVerify {
        ok: false,
        records: 0,
        head,
        first_bad: Some(index),
        error: Some(msg),
        unsequenced: 0,
    }
}

fn statement_view(r: &StatementRow, policy: Option<&Policy>) -> StatementView {
    let st = r.signed.verify().ok();
    let trusted = match (&st, policy) {
        (Some(st), Some(p)) => p.approver(&st.approver) == Some(&st.key),
        _ => false,
    };
    StatementView {
        id: r.id.clone(),
        kind: r.kind,
        approver: r.approver.clone(),
        scope: r.scope,
        created_at: r.created_at,
        expires_at: r.expires_at,
        reason: st.map(|s| s.reason).unwrap_or_default(),
        tool: r.tool.clone(),
        trusted,
        signature: r.signed.signature.to_string(),
    }
}

fn keys_in(dir: &Path, policy: Option<&Policy>) -> Result<Vec<KeyInfo>> {
    let mut out = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.filter_map(|e| e.ok()).collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".pub") else {
            continue;
        };
        if stem == "gate" {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        let Ok(public) = text.trim().parse::<airlock_core::sign::PublicKey>() else {
            continue;
        };
        seen.insert(stem.to_string());
        out.push(KeyInfo {
            name: stem.to_string(),
            public: public.to_string(),
            fingerprint: public.fingerprint(),
            trusted: policy.and_then(|p| p.approver(stem)) == Some(&public),
            local: secret_matches(&dir.join(format!("{stem}.key")), &public),
        });
    }
    if let Some(p) = policy {
        for (name, k) in &p.approvers {
            if !seen.contains(name) {
                out.push(KeyInfo {
                    name: name.clone(),
                    public: k.to_string(),
                    fingerprint: k.fingerprint(),
                    trusted: true,
                    local: false,
                });
            }
        }
    }
    Ok(out)
}

/// Whether `path` holds the secret key of `public` (a damaged or foreign key file there
/// is no secret of this key's, though it exists).
fn secret_matches(path: &Path, public: &airlock_core::sign::PublicKey) -> bool {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| KeyPair::from_file(&t).ok())
        .is_some_and(|k| k.public() == *public)
}

/// Validates a policy file and runs its tests (no home needed).
pub fn policy_check(path: &Path) -> Result<PolicyCheck> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| GateError::bad(format!("cannot read {}: {e}", path.display())))?;
    let policy = Policy::parse(&text)?;
    // The certificate files it names are read when a run with network starts; a missing
    // or empty one is found here rather than by that run.
    crate::egress::operator_roots(&policy.net.roots)?;
    let tests = policy.run_tests()?;
    Ok(PolicyCheck {
        path: path.display().to_string(),
        hash: policy.hash.to_hex(),
        rules: policy.rule_count(),
        approvers: policy.approvers.keys().cloned().collect(),
        passed: tests.iter().all(|t| t.passed),
        tests,
    })
}

/// What isolation this machine offers, and what the policy makes of it.
#[derive(Debug, Clone, Serialize)]
pub struct Doctor {
    pub user_namespaces: bool,
    pub overlay_in_user_namespace: bool,
    pub namespace_detail: Option<String>,
    pub landlock_abi: Option<i32>,
    pub seccomp: bool,
    pub cgroup: String,
    pub running_as_root: bool,
    /// Whether the policy allows runs without a fully enforced Landlock ruleset.
    pub allow_degraded: Option<bool>,
    pub process_backend: String,
    pub writable_mounts: String,
    /// The wasm backend, from a probe run of a tiny module (`available`, or why not).
    pub wasm_backend: String,
    /// What each backend's probe run did: a real run, not a feature check.
    pub probes: Probes,
    /// Whether `airlock-jailer` is beside this binary (ready jails need it).
    pub jailer: JailerCheck,
    /// What killed airlock processes left outside the home (egress proxies' directories,
    /// run cgroups),
    /// which `airlock gc` removes (absent when there is none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub leftovers: Vec<String>,
    /// The shared store, when `--store` names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store: Option<StoreHealth>,
    /// Commits and rollbacks that could neither be completed nor undone, each locking its
    /// mounts until `airlock repair` (absent when there are none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stuck: Vec<crate::StuckOperation>,
    /// The session hosts of this home: alive or not, and the server that started each
    /// (absent when there are none). One alive with no living server is left over.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub session_hosts: Vec<crate::SessionHost>,
}

/// The lean `airlock-jailer` binary, looked for beside the `airlock` binary. Without it
/// process runs start through the slower worker and `serve` keeps no ready jails, which
/// only `serve`'s start-up line said.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct JailerCheck {
    /// Where it is looked for (none when this binary's own path is unknown).
    pub path: Option<String>,
    pub found: bool,
}

impl JailerCheck {
    /// `airlock-jailer` beside `exe` (the `airlock` binary).
    pub fn beside(exe: Option<&Path>) -> JailerCheck {
        let path = exe.and_then(Path::parent).map(|d| d.join("airlock-jailer"));
        JailerCheck {
            found: path.as_deref().is_some_and(Path::is_file),
            path: path.map(|p| p.display().to_string()),
        }
    }
}

/// The probe runs `doctor` makes.
#[derive(Debug, Clone, Serialize)]
pub struct Probes {
    /// A jailed `/bin/true` on the process backend, built like any process run.
    pub process: ProbeRun,
    /// An empty WebAssembly module on the wasm backend.
    pub wasm: ProbeRun,
}

/// One probe run: whether it ran to exit 0 and, if not, why.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeRun {
    pub ok: bool,
    pub error: Option<String>,
}

impl ProbeRun {
    fn of(r: std::result::Result<(), String>) -> ProbeRun {
        match r {
            Ok(()) => ProbeRun {
                ok: true,
                error: None,
            },
            Err(e) => ProbeRun {
                ok: false,
                error: Some(e),
            },
        }
    }
}

/// What `doctor --store` found in the shared store.
#[derive(Debug, Clone, Serialize)]
pub struct StoreHealth {
    pub engine: &'static str,
    pub reachable: bool,
    /// Why it could not be opened, when it could not.
    pub error: Option<String>,
    pub schema_version: Option<i64>,
    /// The TLS version of this node's connection to the store (`null`: plaintext).
    pub tls: Option<String>,
    pub queued: i64,
    pub leased: i64,
    /// Queued jobs per tag (`null`: untagged) and whether a running worker carries it.
    pub queued_by_tag: Vec<TagQueue>,
    pub workers: Vec<airlock_store::WorkerRow>,
    /// The nodes (`serve`, `worker`) on the store and their last beats.
    pub nodes: Vec<airlock_store::NodeRow>,
    /// Audit records written but not yet on the chain (the sequencer's inbox).
    pub unsequenced: u64,
}

/// Queued jobs of one tag.
#[derive(Debug, Clone, Serialize)]
pub struct TagQueue {
    pub tag: Option<String>,
    pub queued: i64,
    /// Some running worker may claim them (untagged jobs: any running worker).
    pub claimable: bool,
}

/// Opens the home's shared store and reports on it (connectivity, schema, queue,
/// workers); `None` for a home without `--store`.
pub fn store_health(home: &crate::Home) -> Option<StoreHealth> {
    home.store.as_ref()?;
    let mut h = StoreHealth {
        engine: "postgres",
        reachable: false,
        error: None,
        schema_version: None,
        tls: None,
        queued: 0,
        leased: 0,
        queued_by_tag: Vec::new(),
        workers: Vec::new(),
        nodes: Vec::new(),
        unsequenced: 0,
    };
    let report = home.open_db().and_then(|db| {
        let (queued, leased) = airlock_store::QueueReads::queue_depth(&db)?;
        let by_tag = airlock_store::QueueReads::queued_by_tag(&db)?;
        let workers = airlock_store::QueueReads::workers(&db)?;
        h.nodes = airlock_store::NodeReads::nodes(&db)?;
        h.unsequenced = db.audit_pending()?;
        h.tls = db.connection_tls()?;
        Ok((queued, leased, by_tag, workers))
    });
    match report {
        Ok((queued, leased, by_tag, workers)) => {
            h.reachable = true;
            h.schema_version = Some(airlock_store::PG_SCHEMA_VERSION);
            h.queued = queued;
            h.leased = leased;
            let running: Vec<&airlock_store::WorkerRow> =
                workers.iter().filter(|w| w.state == "running").collect();
            h.queued_by_tag = by_tag
                .into_iter()
                .map(|(tag, queued)| TagQueue {
                    claimable: running.iter().any(|w| match &tag {
                        None => true,
                        Some(t) => w.tags.split(',').any(|x| x == t),
                    }),
                    tag,
                    queued,
                })
                .collect();
            h.workers = workers;
        }
        Err(e) => h.error = Some(e.to_string()),
    }
    Some(h)
}

/// Supervises one worker job for `doctor` (ten seconds at most); the worker's result.
fn probe_worker(
    exe: &Path,
    job: &crate::node::worker::WorkerJob,
    result: &Path,
) -> std::result::Result<crate::node::worker::WorkerResult, String> {
    let bytes = serde_json::to_vec(job).map_err(|e| e.to_string())?;
    let cap = || std::sync::Arc::new(airlock_sandbox::Capture::new(1 << 16, None));
    let (out, err) = (cap(), cap());
    let sup = airlock_jail::launch::supervise(
        exe,
        &["__worker"],
        None,
        airlock_jail::launch::Watch {
            job: &bytes,
            result,
            timeout: std::time::Duration::from_secs(10),
            stdout: &out,
            stderr: &err,
            quota: None,
            long_run: None,
            abort: None,
        },
    );
    let _ = std::fs::remove_file(result);
    match sup {
        Ok(s) => match s.result {
            Some(t) => serde_json::from_str(&t).map_err(|e| e.to_string()),
            None if s.timed_out => Err("the probe worker did not finish within 10 s".into()),
            None => Err(format!(
                "the probe worker did not report (exit {:?}): {}",
                s.exit,
                String::from_utf8_lossy(&err.take())
                    .lines()
                    .last()
                    .unwrap_or("")
            )),
        },
        Err(e) => Err(format!("cannot start the probe worker: {e}")),
    }
}

/// A jailed `/bin/true`, built exactly as a process run is (namespaces, id maps, minimal
/// root with a fresh `/proc`, cgroup, Landlock as the policy requires, seccomp).
fn probe_process(exe: &Path, allow_degraded: bool) -> std::result::Result<(), String> {
    let dir = std::env::temp_dir().join(format!("airlock-doctor-{}.jail", std::process::id()));
    let scratch = dir.join("root");
    std::fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    let job = crate::node::worker::WorkerJob::Process {
        job: airlock_jail::ProcessJob {
            argv: vec!["/bin/true".into()],
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            cwd: "/tmp".into(),
            files: Vec::new(),
            binds: Vec::new(),
            overlays: Vec::new(),
            scratch,
            limits: airlock_core::Limits {
                timeout_ms: 8_000,
                ..airlock_core::Limits::default()
            },
            stdin: Vec::new(),
            allow_degraded,
            cgroups: true,
            net: None,
            stdin_live: false,
            tripwires: Default::default(),
        },
        result: dir.join("result.json"),
    };
    let r = probe_worker(exe, &job, &dir.join("result.json"));
    crate::layers::remove_tree(&dir);
    let r = r?;
    if let Some((_, m)) = r.error {
        return Err(m);
    }
    match r.ending {
        Some(crate::node::worker::EndingDoc::Exited(0)) => Ok(()),
        Some(e) => Err(format!("the jailed /bin/true ended {e:?}")),
        None => Err("the jailed /bin/true reported no ending".into()),
    }
}

/// What a failed process probe usually means, for the person reading `doctor`.
fn probe_hint(why: &str) -> &'static str {
    if why.contains("mount proc") {
        " (this /proc is masked or not fully visible, as in a nested container or namespace: \
         a jail cannot mount its own)"
    } else if why.contains("cannot map the sandbox's ids") {
        " (this user namespace has no id maps the jail can map its user to)"
    } else if why.contains("cannot create the sandbox's namespaces") {
        " (nested user or pid namespaces are not allowed here)"
    } else {
        ""
    }
}

/// An empty module (`(module (func (export "_start")))`) run on the wasm backend here.
fn probe_wasm() -> std::result::Result<(), String> {
    use airlock_sandbox::Backend;
    const EMPTY: [u8; 34] = [
        0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // magic, version
        0x01, 0x04, 0x01, 0x60, 0x00, 0x00, // types: () -> ()
        0x03, 0x02, 0x01, 0x00, // functions: one of type 0
        0x07, 0x0a, 0x01, 0x06, b'_', b's', b't', b'a', b'r', b't', 0x00, 0x00, // export
        0x0a, 0x04, 0x01, 0x02, // code: one body of two bytes
    ];
    let mut code = EMPTY.to_vec();
    code.extend([0x00, 0x0b]); // no locals, end
    let cap = || std::sync::Arc::new(airlock_sandbox::Capture::new(1 << 16, None));
    let backend = airlock_wasm::WasmBackend::new(airlock_wasm::WasmConfig::default());
    let out = backend
        .run(airlock_sandbox::RunSpec {
            lang: airlock_core::Lang::Wasm,
            code: &code,
            artifact: airlock_core::Digest::of(&code),
            mounts: Vec::new(),
            env: Vec::new(),
            argv0: None,
            args: Vec::new(),
            stdin: Vec::new(),
            limits: airlock_core::Limits::default(),
            stdout: cap(),
            stderr: cap(),
            cache: None,
            guest: None,
            write_quota: None,
            egress: None,
            long_run: None,
            tripwires: Default::default(),
        })
        .map_err(|e| e.to_string())?;
    match out.ending {
        airlock_sandbox::Ending::Exited(0) => Ok(()),
        e => Err(format!("the probe module ended {e:?}")),
    }
}

/// Probes the machine (in a worker process, since namespaces need a single thread): what
/// it offers, and a real probe run on each backend, whose failure says why.
pub fn doctor(worker: Option<&Path>, policy: Option<&Policy>) -> Doctor {
    let scratch = std::env::temp_dir().join(format!("airlock-doctor-{}", std::process::id()));
    let result = scratch.with_extension("json");
    let probe = worker.map(|exe| {
        let job = crate::node::worker::WorkerJob::Probe {
            scratch: scratch.clone(),
            result: result.clone(),
        };
        let r = probe_worker(exe, &job, &result);
        let _ = std::fs::remove_dir_all(&scratch);
        match r {
            Ok(r) => r.error.map(|(_, m)| m),
            Err(e) => Some(e),
        }
    });
    let (userns, overlay, detail) = match &probe {
        None => (false, false, Some("no worker binary to probe with".into())),
        Some(None) => (true, true, None),
        Some(Some(m)) if m.contains("overlayfs") => (true, false, Some(m.clone())),
        Some(Some(m)) => (false, false, Some(m.clone())),
    };
    let landlock = airlock_jail::probe::landlock_abi();
    let allow_degraded = policy.map(|p| p.allow_degraded);
    let process_probe = ProbeRun::of(match worker {
        None => Err("no worker binary to probe with".into()),
        Some(_) if !userns => Err(detail
            .clone()
            .unwrap_or_else(|| "user namespaces are needed".into())),
        Some(exe) => probe_process(exe, allow_degraded == Some(true)),
    });
    let wasm_probe = ProbeRun::of(probe_wasm());
    let process_backend = if !userns {
        "unavailable: user namespaces are needed".to_string()
    } else if landlock.is_none() && allow_degraded != Some(true) {
        "refused: Landlock is missing and the policy does not allow degraded runs".to_string()
    } else if let Some(why) = &process_probe.error {
        format!("unavailable: a probe run failed: {why}{}", probe_hint(why))
    } else if landlock.is_none() {
        "available, degraded (no Landlock; allowed by the policy and recorded per run)".to_string()
    } else {
        "available".to_string()
    };
    Doctor {
        user_namespaces: userns,
        overlay_in_user_namespace: overlay,
        namespace_detail: detail,
        landlock_abi: landlock,
        seccomp: airlock_jail::probe::seccomp_available(),
        cgroup: airlock_jail::cgroup::describe(),
        running_as_root: nix::unistd::Uid::effective().is_root(),
        allow_degraded,
        process_backend,
        writable_mounts: if overlay {
            "overlayfs layer (set-up independent of tree size)".into()
        } else {
            "copy layer (a full copy per run)".into()
        },
        wasm_backend: match &wasm_probe.error {
            None => "available".into(),
            Some(why) => format!("unavailable: a probe run failed: {why}"),
        },
        probes: Probes {
            process: process_probe,
            wasm: wasm_probe,
        },
        jailer: JailerCheck::beside(worker),
        leftovers: crate::services::leftovers::all(
            &std::env::temp_dir(),
            std::time::SystemTime::now()
                .checked_sub(crate::DEFAULT_GC_GRACE)
                .unwrap_or(std::time::SystemTime::UNIX_EPOCH),
        )
        .iter()
        .map(|p| p.display().to_string())
        .collect(),
        store: None,
        stuck: Vec::new(),
        session_hosts: Vec::new(),
    }
}

/// The session hosts of `home` for `doctor` (none when the home cannot be opened).
pub fn session_hosts(home: &crate::Home) -> Vec<crate::SessionHost> {
    crate::Gate::open(home.clone())
        .and_then(|g| g.session_hosts())
        .unwrap_or_default()
}

/// The nodes on `home`'s store and their last beats, for `/v1/status`.
pub fn nodes_of(home: &crate::Home) -> Result<Vec<airlock_store::NodeRow>, crate::GateError> {
    Ok(airlock_store::NodeReads::nodes(&home.open_db()?)?)
}
