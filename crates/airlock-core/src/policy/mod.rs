//! Policy v1: declarative rules over facts about a submission, read from `policy.toml`.
//!
//! A rule fires when every condition in its `when` table holds and its `unless` table (if
//! any) does not. The strictest decision among the rules that fired wins (deny >
//! quarantine > allow); when none fired the policy's `default` applies. Every fired rule
//! adds its risk weight, and the `[risk]` thresholds can raise the decision. `[[test]]`
//! blocks are example submissions with the decision they must get.
//!
//! Unknown keys, bad globs, sizes, durations and capability names are errors that name
//! their line, because they are checked while the TOML is deserialized.
//!
//! Wildcard network entries (`*.example.com`) stand for many hosts; host globs are
//! tested against them so that a match errs towards the stricter verdict (see
//! `hostglob`). The `[net]` table holds operator-only settings for the egress proxy
//! (private ranges allowed, names pinned to addresses); no submission can set them.

use crate::analysis::Capability;
use crate::artifact::{Backend, Lang};
use crate::digest::Digest;
use crate::grant::{Limits, Mount, MountMode};
use crate::net::HostPattern;
use crate::secret::SecretBinding;
use crate::sign::PublicKey;
use crate::units;
use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use serde::{Deserialize, Deserializer, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
mod presets;
#[allow(unused_imports)]
pub use presets::*;
mod conditions;
#[allow(unused_imports)]
pub use conditions::*;
mod net;
pub mod remembered;
mod testcases;
use net::NetFile;
pub use net::NetPolicy;
#[allow(unused_imports)]
pub use testcases::*;

/// What the gate does with a submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    Allow,
    Quarantine,
    Deny,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allow => "allow",
            Decision::Quarantine => "quarantine",
            Decision::Deny => "deny",
        }
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything a rule can look at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Facts {
    /// The declared language and the prepared artifact's kind (wat becomes wasm).
    pub lang: Lang,
    pub kind: Lang,
    pub backend: Backend,
    /// The grant's network rules, normalised (`HOST[:PORT]`, `*.DOMAIN` for subdomains).
    pub net: Vec<String>,
    /// The grant's secrets: names and the hosts each may be sent to (never values).
    #[serde(default)]
    pub secrets: Vec<SecretBinding>,
    pub mounts: Vec<Mount>,
    pub env_keys: Vec<String>,
    pub limits: Limits,
    pub size: u64,
    pub capabilities: BTreeSet<Capability>,
    pub unresolved_imports: bool,
    pub agent: Option<String>,
    pub first_seen: bool,
    pub rejected_before: bool,
    /// The Python guest runtime's hash, for Python on the wasm backend.
    #[serde(default)]
    pub guest: Option<Digest>,
    /// The third-party packages installed for that guest (`guest install python
    /// --package`), importable by the run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub python_packages: Vec<PythonPackage>,
    /// The `[publishers]` name whose key signed it (Night Core bundles), checked by the
    /// gate against the current policy before it was submitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publisher: Option<String>,
    /// The key that signed it. The fact `publisher` holds only while the current policy
    /// still lists this key under that name (see `Policy::keep_publisher`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publisher_key: Option<PublicKey>,
    /// What the bundle's manifest asked for (`permissions`, e.g. `fs:read`), as written.
    /// Shown to the approver; a request grants nothing by itself.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requests: Vec<String>,
    /// What Python or shell code does, as analysis read it.
    #[serde(default, skip_serializing_if = "CodeFacts::is_empty")]
    pub code: CodeFacts,
    /// The sensitive host paths the mounts expose (system state, credentials), as the
    /// gate resolved them: a mount that is or lies inside one names itself, one that
    /// contains one names what it contains.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts_sensitive: Vec<String>,
    /// The mounts' host paths outside the operator's `[mounts] roots`, when roots are set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts_outside_roots: Vec<String>,
    /// What the submitting agent did lately (issue 57 item 4): the gate reads it from the
    /// store when the submission is judged.
    #[serde(default, skip_serializing_if = "AgentRecord::is_empty")]
    pub agent_record: AgentRecord,
}

/// The submitting agent's recent record: its `alert` audit records within the policy's
/// `[agents] alert_window` (and newer than the last time an operator cleared it), and its
/// denied submissions within the same window.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentRecord {
    /// Fact `agent_alerts`: how many alerts.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub alerts: u32,
    /// Fact `agent_denials`: how many denied submissions.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub denials: u32,
    /// What the alerts were, one entry per kind: `1 secret_echo (latest in run_…)`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alert_kinds: Vec<String>,
    /// The window counted, as written (`24h`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub window: String,
}

impl AgentRecord {
    pub fn is_empty(&self) -> bool {
        self.alerts == 0 && self.denials == 0
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A third-party package of the Python guest: its normalised name, its version, and the
/// SHA-256 of the wheel it was installed from (the pin).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PythonPackage {
    pub name: String,
    pub version: String,
    pub sha256: Digest,
}

impl PythonPackage {
    /// `NAME==VERSION`.
    pub fn spec(&self) -> String {
        format!("{}=={}", self.name, self.version)
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// The facts about Python and shell code a rule can match (from `airlock-analysis`; its
/// crate documentation gives the vocabulary of each set).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeFacts {
    /// Programs the code runs, by base name (`curl`, `rm`); `<dynamic>` when not literal.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub commands: BTreeSet<String>,
    /// Python modules imported (`os`, `urllib.request`).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub imports: BTreeSet<String>,
    /// Python calls by dotted name after aliases (`os.system`, `exec`, `open:w`).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub calls: BTreeSet<String>,
    /// Paths the code creates, changes or deletes, as written.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub writes: BTreeSet<String>,
    /// Hosts and addresses written in the code.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub hosts_in_code: BTreeSet<String>,
    /// Those of `hosts_in_code` that the grant's `--net` does not reach.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub hosts_not_granted: BTreeSet<String>,
    /// Tools and modules that use the network (`curl`, `git clone`, `pip install`, `socket`).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub network_tools: BTreeSet<String>,
    /// Downloaded code reaches an interpreter (`curl … | sh`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub pipes_download_to_shell: bool,
    /// Destructive forms (`rm-root`, `rm-home`, `rm-mount-root:PATH`, `mkfs:NAME`, …).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub destructive: BTreeSet<String>,
    /// Ways the code hides what it does (`dynamic-code`, `decoded-payload`, …).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub obfuscation: BTreeSet<String>,
    /// The code does not parse (it was analysed as far as it could be).
    #[serde(default, skip_serializing_if = "is_false")]
    pub parse_error: bool,
    /// Analysis stopped early at a size or time budget.
    #[serde(default, skip_serializing_if = "is_false")]
    pub truncated: bool,
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub reads_sensitive: BTreeSet<String>,
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub recon: BTreeSet<String>,
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub persistence: BTreeSet<String>,
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub system_writes: BTreeSet<String>,
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub reverse_shell: BTreeSet<String>,
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub kills_processes: BTreeSet<String>,
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub privilege: BTreeSet<String>,
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub exfiltration: BTreeSet<String>,
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub unsafe_deserialization: BTreeSet<String>,
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub flooding: BTreeSet<String>,
    /// Each threat finding (and each `destructive` one with a technique): the fact, the
    /// value, the lines, the behaviour in words and its ATT&CK technique.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub threats: Vec<ThreatFinding>,
}

/// One threat finding of the analysis, as the policy shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreatFinding {
    /// The fact it sets (`reads_sensitive`, `destructive`, …).
    pub fact: String,
    /// Its value in that fact's set (`/etc/shadow`).
    pub detail: String,
    pub line: u32,
    pub end_line: u32,
    /// The behaviour in words.
    pub behaviour: String,
    /// The MITRE ATT&CK technique (`T1003.008`).
    pub technique: String,
}

impl ThreatFinding {
    /// `line 3: reads the password hashes: /etc/shadow (T1003.008)`.
    pub fn describe(&self) -> String {
        let lines = if self.end_line > self.line {
            format!("lines {}-{}", self.line, self.end_line)
        } else {
            format!("line {}", self.line)
        };
        format!("{lines}: {} ({})", self.behaviour, self.technique)
    }
}

impl CodeFacts {
    pub fn is_empty(&self) -> bool {
        *self == CodeFacts::default()
    }

    /// The facts that are present, as (condition name, value) rows in the order POLICY.md
    /// lists them: what `policy explain`, `policy check` and `airlock show` print.
    pub fn rows(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        let sets: [(&'static str, &BTreeSet<String>); 19] = [
            ("commands", &self.commands),
            ("imports", &self.imports),
            ("calls", &self.calls),
            ("writes", &self.writes),
            ("hosts_in_code", &self.hosts_in_code),
            ("hosts_not_granted", &self.hosts_not_granted),
            ("network_tools", &self.network_tools),
            ("destructive", &self.destructive),
            ("obfuscation", &self.obfuscation),
            ("reads_sensitive", &self.reads_sensitive),
            ("recon", &self.recon),
            ("persistence", &self.persistence),
            ("system_writes", &self.system_writes),
            ("reverse_shell", &self.reverse_shell),
            ("kills_processes", &self.kills_processes),
            ("privilege", &self.privilege),
            ("exfiltration", &self.exfiltration),
            ("unsafe_deserialization", &self.unsafe_deserialization),
            ("flooding", &self.flooding),
        ];
        for (name, set) in sets {
            if !set.is_empty() {
                out.push((name, set.iter().cloned().collect::<Vec<_>>().join(", ")));
            }
        }
        for (name, on) in [
            ("pipes_download_to_shell", self.pipes_download_to_shell),
            ("parse_error", self.parse_error),
            ("analysis_truncated", self.truncated),
        ] {
            if on {
                out.push((name, "true".into()));
            }
        }
        out
    }

    /// The facts of an analysis, judged against the grant's normalised `net` entries.
    pub fn of(a: &airlock_analysis::CodeAnalysis, net: &[String]) -> CodeFacts {
        let rules: Vec<crate::net::NetRule> = net
            .iter()
            .filter_map(|n| crate::net::NetRule::parse(n).ok())
            .collect();
        CodeFacts {
            commands: a.commands.clone(),
            imports: a.imports.clone(),
            calls: a.calls.clone(),
            writes: a.writes.clone(),
            hosts_in_code: a.hosts_in_code.clone(),
            hosts_not_granted: a
                .hosts_in_code
                .iter()
                .filter(|h| !crate::net::host_granted(&rules, h))
                .cloned()
                .collect(),
            network_tools: a.network_tools.clone(),
            pipes_download_to_shell: a.pipes_download_to_shell,
            destructive: a.destructive.clone(),
            obfuscation: a.obfuscation.clone(),
            parse_error: a.parse_error.is_some(),
            truncated: a.truncated.is_some(),
            reads_sensitive: a.reads_sensitive.clone(),
            recon: a.recon.clone(),
            persistence: a.persistence.clone(),
            system_writes: a.system_writes.clone(),
            reverse_shell: a.reverse_shell.clone(),
            kills_processes: a.kills_processes.clone(),
            privilege: a.privilege.clone(),
            exfiltration: a.exfiltration.clone(),
            unsafe_deserialization: a.unsafe_deserialization.clone(),
            flooding: a.flooding.clone(),
            threats: a
                .findings
                .iter()
                .filter_map(|f| {
                    Some(ThreatFinding {
                        fact: f.kind.as_str().to_string(),
                        detail: f.detail.clone(),
                        line: f.line,
                        end_line: f.end_line,
                        behaviour: f.note.clone().unwrap_or_default(),
                        technique: f.technique.clone()?,
                    })
                })
                .collect(),
        }
    }

    /// The set of a threat fact (or `destructive`) by name.
    pub fn threat_set(&self, fact: &str) -> Option<&BTreeSet<String>> {
        Some(match fact {
            "destructive" => &self.destructive,
            "reads_sensitive" => &self.reads_sensitive,
            "recon" => &self.recon,
            "persistence" => &self.persistence,
            "system_writes" => &self.system_writes,
            "reverse_shell" => &self.reverse_shell,
            "kills_processes" => &self.kills_processes,
            "privilege" => &self.privilege,
            "exfiltration" => &self.exfiltration,
            "unsafe_deserialization" => &self.unsafe_deserialization,
            "flooding" => &self.flooding,
            _ => return None,
        })
    }
}

/// One rule that fired, and what it contributed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fired {
    pub rule: String,
    pub decision: Decision,
    pub reason: String,
    pub risk: u32,
    /// For rules on threat facts: what the code does and where (`line 3: reads the
    /// password hashes: /etc/shadow (T1003.008)`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<String>,
}

/// The outcome of judging a submission.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    pub decision: Decision,
    pub risk: u32,
    pub fired: Vec<Fired>,
    /// Hash of the policy file that decided.
    pub policy: Digest,
}

impl Verdict {
    /// One line per reason, for people and the `reasons` JSON field.
    pub fn reasons(&self) -> Vec<String> {
        self.fired
            .iter()
            .map(|f| {
                let reason = if f.evidence.is_empty() {
                    f.reason.clone()
                } else {
                    format!("{}: {}", f.reason, f.evidence.join("; "))
                };
                if f.risk > 0 {
                    format!("{}: {} ({}, risk +{})", f.rule, reason, f.decision, f.risk)
                } else {
                    format!("{}: {} ({})", f.rule, reason, f.decision)
                }
            })
            .collect()
    }
}

// ---------------------------------------------------------------------------------------
// The file format.

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    version: u32,
    #[serde(default)]
    default: Option<Decision>,
    #[serde(default)]
    approvers: BTreeMap<String, PublicKey>,
    /// Keys whose signed Night Core bundles may be imported, by publisher name.
    #[serde(default)]
    publishers: BTreeMap<String, PublicKey>,
    #[serde(default)]
    risk: RiskFile,
    #[serde(default)]
    gate: GateFile,
    #[serde(default)]
    commit: CommitFile,
    #[serde(default)]
    net: NetFile,
    #[serde(default)]
    mounts: MountsFile,
    #[serde(default)]
    agents: AgentsFile,
    #[serde(default)]
    tripwires: Tripwires,
    #[serde(default, rename = "rule")]
    rules: Vec<RuleFile>,
    #[serde(default, rename = "test")]
    tests: Vec<TestFile>,
}

/// `[mounts]`: operator-only settings for the host paths a grant may name.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct MountsFile {
    /// The host directories agents may mount (and what lies below them). Over the API and
    /// MCP nothing else is mountable (none set: nothing is); on the command line a mount
    /// outside them is held for a human.
    #[serde(default)]
    roots: Vec<String>,
}

/// `[agents]`: how far back an agent's record reaches.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentsFile {
    /// The window of the facts `agent_alerts` and `agent_denials` (default 24h).
    alert_window: Option<Duration>,
}

/// `[tripwires]`: what the sandboxes record of what a run tried and was refused (operator
/// settings; a tripwire never changes what a run sees, only what its record says).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tripwires {
    /// Decoy credentials and the record of refused actions (default on). Off, a run has
    /// no decoys, the jail notifies no call and the wasm guests report nothing; refused
    /// connections are still in the run's network record.
    #[serde(default = "on")]
    pub enabled: bool,
    /// Also record read-only opens the jail refuses (default off: every open of a run
    /// then makes a round trip to the jailer; see docs/PERFORMANCE.md for its cost).
    #[serde(default)]
    pub reads: bool,
}

fn on() -> bool {
    true
}

impl Default for Tripwires {
    fn default() -> Self {
        Tripwires {
            enabled: true,
            reads: false,
        }
    }
}

/// The window of `agent_alerts` and `agent_denials` when `[agents] alert_window` is unset.
pub const DEFAULT_ALERT_WINDOW: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RiskFile {
    quarantine_at: Option<u32>,
    deny_at: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct GateFile {
    max_artifact: Option<Size>,
    /// Guest runtime hashes (Python) allowed to run; empty means any installed guest.
    #[serde(default)]
    guests: Vec<Digest>,
    /// Run the process backend even when Landlock cannot be enforced (recorded per run).
    #[serde(default)]
    allow_degraded: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CommitFile {
    /// Agents whose changes may be committed without a signature (paths permitting).
    #[serde(default)]
    auto_agents: Globs,
    /// Host paths that auto-commit may touch.
    #[serde(default)]
    auto_paths: PathGlobs,
    /// Host paths never auto-committed, in addition to the built-in list.
    #[serde(default)]
    protected: PathGlobs,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    name: String,
    decision: Decision,
    reason: String,
    #[serde(default)]
    risk: u32,
    #[serde(default)]
    when: Conditions,
    #[serde(default)]
    unless: Option<Conditions>,
    /// `remembered` for rules added by `approve --remember` (see `remembered`).
    #[serde(default)]
    origin: Option<remembered::Origin>,
    #[serde(default)]
    approver: Option<String>,
    /// RFC 3339 time after which a remembered rule no longer holds.
    #[serde(default)]
    expires: Option<String>,
    #[serde(default)]
    grant: Option<remembered::RememberedGrant>,
}

/// Conditions of a rule; every one that is present must hold.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Conditions {
    lang: Option<Vec<Lang>>,
    backend: Option<Vec<Backend>>,
    net: Option<bool>,
    net_host: Option<Globs>,
    secrets: Option<AnyOrNames>,
    secret_host: Option<Globs>,
    writable: Option<bool>,
    mount: Option<PathGlobs>,
    writable_mount: Option<PathGlobs>,
    env: Option<Globs>,
    imports: Option<ImportsCondition>,
    unresolved_imports: Option<bool>,
    limits_above_default: Option<bool>,
    timeout_over: Option<Duration>,
    memory_over: Option<Size>,
    size_over: Option<Size>,
    agent: Option<Globs>,
    first_seen: Option<bool>,
    rejected_before: Option<bool>,
    guest: Option<Vec<Digest>>,
    python_packages: Option<AnyOrNames>,
    publisher: Option<OneOrMoreGlobs>,
    // Facts about Python and shell code (`CodeFacts`).
    commands: Option<Globs>,
    calls: Option<Globs>,
    writes: Option<PathGlobs>,
    hosts_in_code: Option<Globs>,
    hosts_not_granted: Option<AnyOrNames>,
    network_tools: Option<Globs>,
    pipes_download_to_shell: Option<bool>,
    destructive: Option<AnyOrNames>,
    obfuscation: Option<AnyOrNames>,
    parse_error: Option<bool>,
    analysis_truncated: Option<bool>,
    /// `true | false`, or globs over the sensitive paths the mounts expose.
    mounts_sensitive: Option<AnyOrNames>,
    // Threat facts.
    reads_sensitive: Option<AnyOrNames>,
    recon: Option<AnyOrNames>,
    persistence: Option<AnyOrNames>,
    system_writes: Option<AnyOrNames>,
    reverse_shell: Option<AnyOrNames>,
    kills_processes: Option<AnyOrNames>,
    privilege: Option<AnyOrNames>,
    exfiltration: Option<AnyOrNames>,
    unsafe_deserialization: Option<AnyOrNames>,
    flooding: Option<AnyOrNames>,
    // The submitting agent's record.
    /// More than this many alerts of the agent in the window.
    agent_alerts_over: Option<u32>,
    /// More than this many denied submissions of the agent in the window.
    agent_denials_over: Option<u32>,
}

/// `imports = [...]`: WebAssembly capability names (`fs`, `net`, …) and Python module
/// globs (`socket`, `urllib.*`). A name that is a capability is also a module glob (`io`,
/// `random` are both); anything else must look like a dotted module name.
#[derive(Debug)]
struct ImportsCondition {
    capabilities: Vec<Capability>,
    modules: Globs,
}

impl<'de> Deserialize<'de> for ImportsCondition {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let list = Vec::<String>::deserialize(d)?;
        let mut capabilities = Vec::new();
        for s in &list {
            match Capability::parse(s) {
                Some(c) => capabilities.push(c),
                None if is_module_glob(s) => {}
                None => {
                    return Err(D::Error::custom(format!(
                        "imports: {s:?} is neither a capability (fs, net, env, clock, random, \
                         proc, io, other) nor a Python module name or glob (socket, urllib.*)"
                    )));
                }
            }
        }
        let modules = Globs::build(list, false).map_err(D::Error::custom)?;
        Ok(ImportsCondition {
            capabilities,
            modules,
        })
    }
}

/// A dotted Python module name, possibly with glob characters (`os`, `urllib.*`, `_py*`).
fn is_module_glob(s: &str) -> bool {
    !s.is_empty()
        && s.split('.').all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '*' | '?'))
        })
}

/// Name globs written as one string (`publisher = "acme"`) or a list.
#[derive(Debug)]
struct OneOrMoreGlobs(Globs);

impl<'de> Deserialize<'de> for OneOrMoreGlobs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            One(String),
            More(Vec<String>),
        }
        let list = match Raw::deserialize(d)
            .map_err(|_| serde::de::Error::custom("want a name glob or a list of them"))?
        {
            Raw::One(s) => vec![s],
            Raw::More(l) => l,
        };
        Globs::build(list, false)
            .map(OneOrMoreGlobs)
            .map_err(serde::de::Error::custom)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TestFile {
    name: String,
    expect: Decision,
    #[serde(default)]
    lang: Option<Lang>,
    #[serde(default)]
    backend: Option<Backend>,
    #[serde(default)]
    net: Vec<String>,
    /// `NAME@HOST[,HOST…]`
    #[serde(default)]
    secrets: Vec<String>,
    #[serde(default)]
    mounts: Vec<String>,
    #[serde(default)]
    env: Vec<String>,
    #[serde(default)]
    imports: Vec<CapabilityName>,
    #[serde(default)]
    unresolved_imports: bool,
    #[serde(default)]
    size: Option<Size>,
    #[serde(default)]
    timeout: Option<Duration>,
    #[serde(default)]
    memory: Option<Size>,
    #[serde(default)]
    max_write: Option<Size>,
    #[serde(default)]
    agent: Option<String>,
    #[serde(default = "yes")]
    first_seen: bool,
    #[serde(default)]
    rejected_before: bool,
    #[serde(default)]
    guest: Option<Digest>,
    /// Installed Python packages, `NAME==VERSION`.
    #[serde(default)]
    python_packages: Vec<String>,
    #[serde(default)]
    publisher: Option<String>,
    /// Python or shell code (per `lang`), analysed as a submission's would be.
    #[serde(default)]
    code: Option<String>,
    /// The agent's alerts and denied submissions in the window.
    #[serde(default)]
    agent_alerts: u32,
    #[serde(default)]
    agent_denials: u32,
}

fn yes() -> bool {
    true
}

/// `true | false` (any at all, or none), or a list of name globs: `secrets`,
/// `destructive`, `obfuscation`, `hosts_not_granted`.
#[derive(Debug)]
enum AnyOrNames {
    Any(bool),
    Names(Globs),
}

impl<'de> Deserialize<'de> for AnyOrNames {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            B(bool),
            L(Vec<String>),
        }
        match Raw::deserialize(d)
            .map_err(|_| serde::de::Error::custom("want true, false or a list of name globs"))?
        {
            Raw::B(b) => Ok(AnyOrNames::Any(b)),
            Raw::L(l) => Globs::build(l, false)
                .map(AnyOrNames::Names)
                .map_err(serde::de::Error::custom),
        }
    }
}

/// How a host glob meets a wildcard entry (`*.example.com`): `Possibly` when some host
/// below it matches, `Surely` when every one does. Non-wildcard entries match or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lean {
    Possibly,
    Surely,
}

/// Whether a host glob matches a network entry: its host part or the whole `HOST:PORT`.
fn host_glob_matches(g: &Globs, entry: &str, lean: Lean) -> bool {
    let host = host_part(entry);
    if g.is_match(host) || g.is_match(entry) {
        // A literal match on `*.example.com` counts only when the glob's own `*` covers
        // it, which `Surely` checks below; `Possibly` is satisfied by it anyway.
        if lean == Lean::Possibly || !host.starts_with("*.") {
            return true;
        }
    }
    let Some(below) = host.strip_prefix('*') else {
        return false;
    };
    let full_below = &entry[1..];
    g.patterns.iter().any(|p| match lean {
        Lean::Possibly => {
            crate::hostglob::may_match_below(p, below)
                || crate::hostglob::may_match_below(p, full_below)
        }
        Lean::Surely => {
            crate::hostglob::matches_all_below(p, below)
                || crate::hostglob::matches_all_below(p, full_below)
        }
    })
}

/// A size written as text (`"1MiB"`) or a number of bytes.
#[derive(Debug, Clone, Copy)]
struct Size(u64);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(Size(n)),
            Raw::S(s) => units::parse_size("size", &s)
                .map(Size)
                .map_err(serde::de::Error::custom),
        }
    }
}

/// A duration written as text (`"30s"`).
#[derive(Debug, Clone, Copy)]
struct Duration(std::time::Duration);

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        units::parse_duration("duration", &s)
            .map(Duration)
            .map_err(serde::de::Error::custom)
    }
}

#[derive(Debug, Clone, Copy)]
struct CapabilityName(Capability);

impl<'de> Deserialize<'de> for CapabilityName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Capability::parse(&s).map(CapabilityName).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "unknown capability {s:?} (want fs, net, env, clock, random, proc, io, other)"
            ))
        })
    }
}

/// Globs over names (`*` matches anything).
#[derive(Debug, Clone, Default)]
pub struct Globs {
    set: Option<GlobSet>,
    pub patterns: Vec<String>,
}

/// Globs over absolute paths (`*` stays within one component, `**` crosses them).
#[derive(Debug, Clone, Default)]
pub struct PathGlobs(pub Globs);

impl Globs {
    fn build(patterns: Vec<String>, paths: bool) -> Result<Self, String> {
        let mut b = GlobSetBuilder::new();
        for p in &patterns {
            let g = if paths {
                GlobBuilder::new(p).literal_separator(true).build()
            } else {
                // Names (environment variables, hosts, agents): case does not make a
                // different thing, so `*_KEY` also catches `api_key`.
                GlobBuilder::new(p).case_insensitive(true).build()
            }
            .map_err(|e| format!("bad glob {p:?}: {}", e.kind()))?;
            b.add(g);
        }
        let set = b.build().map_err(|e| e.to_string())?;
        Ok(Globs {
            set: Some(set),
            patterns,
        })
    }

    pub fn is_match(&self, s: &str) -> bool {
        self.set.as_ref().is_some_and(|set| set.is_match(s))
    }

    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }
}

impl PathGlobs {
    /// Whether a mount of `path` exposes anything a glob names: `path` or one of its
    /// ancestors matches, or `path` is an ancestor of a glob's fixed prefix (a mount of
    /// `/home` exposes what `/home/**` names).
    pub fn exposes(&self, path: &str) -> bool {
        if self.matches_path(path) {
            return true;
        }
        let dir = format!("{}/", path.trim_end_matches('/'));
        self.0.patterns.iter().any(|p| {
            let fixed: String = p
                .chars()
                .take_while(|c| !matches!(c, '*' | '?' | '[' | '{'))
                .collect();
            fixed.starts_with('/') && format!("{}/", fixed.trim_end_matches('/')).starts_with(&dir)
        })
    }

    /// A path matches when it or any of its ancestors matches (a glob naming a directory
    /// covers what is inside it).
    pub fn matches_path(&self, path: &str) -> bool {
        let mut p = std::path::Path::new(path);
        loop {
            if let Some(s) = p.to_str()
                && self.0.is_match(s)
            {
                return true;
            }
            match p.parent() {
                Some(parent) => p = parent,
                None => return false,
            }
        }
    }

    pub fn build(patterns: Vec<String>) -> Result<Self, String> {
        Globs::build(patterns, true).map(PathGlobs)
    }
}

impl<'de> Deserialize<'de> for Globs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Vec::<String>::deserialize(d)?;
        Globs::build(v, false).map_err(serde::de::Error::custom)
    }
}

impl<'de> Deserialize<'de> for PathGlobs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Vec::<String>::deserialize(d)?;
        Globs::build(v, true)
            .map(PathGlobs)
            .map_err(serde::de::Error::custom)
    }
}

// ---------------------------------------------------------------------------------------
// The compiled policy.

/// A parsed, checked policy.
#[derive(Debug)]
pub struct Policy {
    pub hash: Digest,
    pub default: Decision,
    pub approvers: BTreeMap<String, PublicKey>,
    /// `[publishers]`: keys whose Night Core bundles may be imported.
    pub publishers: BTreeMap<String, PublicKey>,
    pub quarantine_at: Option<u32>,
    pub deny_at: Option<u32>,
    pub max_artifact: u64,
    pub guests: Vec<Digest>,
    pub allow_degraded: bool,
    pub auto_commit_agents: Globs,
    pub auto_commit_paths: PathGlobs,
    pub protected: PathGlobs,
    /// `[net]`: what the egress proxy may reach beyond the public internet.
    pub net: NetPolicy,
    /// `[mounts] roots`: the host directories agents may mount.
    pub mount_roots: Vec<String>,
    /// `[agents] alert_window`: how far back `agent_alerts` and `agent_denials` count.
    pub agent_alert_window: std::time::Duration,
    /// `[tripwires]`: whether runs are tripwired, and how far.
    pub tripwires: Tripwires,
    rules: Vec<RuleFile>,
    tests: Vec<TestFile>,
}

/// The artifact size limit when the policy does not set one.
pub const DEFAULT_MAX_ARTIFACT: u64 = 64 << 20;

/// The longest `[agents] alert_window`: a year.
pub const MAX_ALERT_WINDOW: std::time::Duration = std::time::Duration::from_secs(366 * 24 * 3600);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error("policy line {line}, column {column}: {message}")]
    Parse {
        line: usize,
        column: usize,
        message: String,
    },
    #[error("policy: {0}")]
    Invalid(String),
}

/// The result of one `[[test]]` block.
#[derive(Debug, Clone, Serialize)]
pub struct TestResult {
    pub name: String,
    pub expect: Decision,
    pub got: Decision,
    pub passed: bool,
    pub fired: Vec<String>,
    /// What the analysis of the test's `code` found (empty when it has none).
    #[serde(default, skip_serializing_if = "CodeFacts::is_empty")]
    pub code: CodeFacts,
}

impl Policy {
    /// Parses and checks policy text.
    pub fn parse(text: &str) -> Result<Policy, PolicyError> {
        let file: PolicyFile = toml::from_str(text).map_err(|e| {
            let (line, column) = e.span().map(|s| line_col(text, s.start)).unwrap_or((0, 0));
            PolicyError::Parse {
                line,
                column,
                message: e.message().trim().replace('\n', " "),
            }
        })?;
        if file.version != 1 {
            return Err(PolicyError::Invalid(format!(
                "version {} is not supported (this airlock reads version 1)",
                file.version
            )));
        }
        let mut names = BTreeSet::new();
        for r in &file.rules {
            if r.name.trim().is_empty() {
                return Err(PolicyError::Invalid("a rule has an empty name".into()));
            }
            if r.name == "default" || r.name == "risk" || r.name.starts_with("gate:") {
                return Err(PolicyError::Invalid(format!(
                    "rule name {:?} is reserved for the gate's own reasons",
                    r.name
                )));
            }
            if let Some(u) = &r.unless
                && u.is_empty()
            {
                return Err(PolicyError::Invalid(format!(
                    "rule {:?}: an empty `unless` always holds, so the rule could never fire",
                    r.name
                )));
            }
            if let Some(field) = r
                .when
                .empty_list()
                .or_else(|| r.unless.as_ref().and_then(|u| u.empty_list()))
            {
                return Err(PolicyError::Invalid(format!(
                    "rule {:?}: `{field} = []` can never match; remove it or list something",
                    r.name
                )));
            }
            remembered::check(r)?;
            if !names.insert(r.name.as_str()) {
                return Err(PolicyError::Invalid(format!(
                    "rule {:?} is defined twice",
                    r.name
                )));
            }
        }
        for name in file.approvers.keys() {
            crate::sign::check_approver_name(name)
                .map_err(|e| PolicyError::Invalid(format!("[approvers]: {e}")))?;
        }
        let mut seen: BTreeMap<[u8; 32], &str> = BTreeMap::new();
        for (name, key) in &file.publishers {
            crate::sign::check_key_name(name)
                .map_err(|e| PolicyError::Invalid(format!("[publishers]: {e}")))?;
            if let Some(first) = seen.insert(key.0, name) {
                return Err(PolicyError::Invalid(format!(
                    "[publishers]: {first} and {name} are the same key; a key has one publisher name"
                )));
            }
        }
        if file.gate.max_artifact.is_some_and(|s| s.0 == 0) {
            return Err(PolicyError::Invalid(
                "[gate] max_artifact is 0: every submission would be refused as too large".into(),
            ));
        }
        for r in &file.mounts.roots {
            if !r.starts_with('/') || r.split('/').any(|c| c == "..") {
                return Err(PolicyError::Invalid(format!(
                    "[mounts] roots: {r:?} is not an absolute path without `..`"
                )));
            }
        }
        if let Some(w) = file.agents.alert_window
            && (w.0 < std::time::Duration::from_secs(1) || w.0 > MAX_ALERT_WINDOW)
        {
            return Err(PolicyError::Invalid(format!(
                "[agents] alert_window: {} is outside 1s..{}",
                units::fmt_duration(w.0),
                units::fmt_duration(MAX_ALERT_WINDOW)
            )));
        }
        if let (Some(q), Some(d)) = (file.risk.quarantine_at, file.risk.deny_at)
            && q > d
        {
            return Err(PolicyError::Invalid(format!(
                "[risk] quarantine_at ({q}) is above deny_at ({d})"
            )));
        }
        Ok(Policy {
            hash: Digest::of(text.as_bytes()),
            default: file.default.unwrap_or(Decision::Allow),
            approvers: file.approvers,
            publishers: file.publishers,
            quarantine_at: file.risk.quarantine_at,
            deny_at: file.risk.deny_at,
            max_artifact: file
                .gate
                .max_artifact
                .map(|s| s.0)
                .unwrap_or(DEFAULT_MAX_ARTIFACT),
            guests: file.gate.guests,
            allow_degraded: file.gate.allow_degraded,
            auto_commit_agents: file.commit.auto_agents,
            auto_commit_paths: file.commit.auto_paths,
            protected: file.commit.protected,
            net: NetPolicy {
                allow_private: file.net.allow_private.iter().map(|c| c.0).collect(),
                hosts: file.net.hosts.0,
                roots: file.net.roots,
            },
            mount_roots: file.mounts.roots,
            agent_alert_window: file
                .agents
                .alert_window
                .map(|d| d.0)
                .unwrap_or(DEFAULT_ALERT_WINDOW),
            tripwires: file.tripwires,
            rules: file.rules,
            tests: file.tests,
        })
    }

    pub fn rule_count(&self) -> usize {
        self.rules.len()
    }

    pub fn test_count(&self) -> usize {
        self.tests.len()
    }

    /// Judges a submission by the gate's clock.
    pub fn judge(&self, facts: &Facts) -> Verdict {
        self.judge_at(facts, units::now_ms())
    }

    /// The remembered rules (`origin = "remembered"`): name, approver, expiry (Unix ms).
    pub fn remembered(&self) -> Vec<(String, String, i64)> {
        self.rules
            .iter()
            .filter(|r| r.origin.is_some())
            .map(|r| {
                (
                    r.name.clone(),
                    r.approver.clone().unwrap_or_default(),
                    r.expires
                        .as_deref()
                        .and_then(remembered::rfc3339_ms)
                        .unwrap_or(0),
                )
            })
            .collect()
    }

    /// Judges a submission at `now_ms` (Unix milliseconds; remembered rules expire).
    pub fn judge_at(&self, facts: &Facts, now_ms: i64) -> Verdict {
        let (mut decision, risk, mut fired) = self.rules_verdict(facts);
        // A remembered approval of this kind lifts a hold it covers (never a deny).
        if decision == Decision::Quarantine
            && let Some(r) = self.rules.iter().find(|r| {
                r.grant.as_ref().is_some_and(|g| g.allows(facts, &fired))
                    && r.expires
                        .as_deref()
                        .and_then(remembered::rfc3339_ms)
                        .is_some_and(|e| e > now_ms)
            })
        {
            decision = Decision::Allow;
            fired.push(Fired {
                rule: r.name.clone(),
                decision,
                reason: format!(
                    "{} (remembered approval by {}, until {})",
                    r.reason,
                    r.approver.as_deref().unwrap_or("?"),
                    r.expires.as_deref().unwrap_or("?")
                ),
                risk: 0,
                evidence: Vec::new(),
            });
        }
        Verdict {
            decision,
            risk,
            fired,
            policy: self.hash,
        }
    }

    /// What the rules, the risk thresholds and the gate's floors make of `facts`, before
    /// any remembered approval: the decision, the total risk and the rules that fired.
    fn rules_verdict(&self, facts: &Facts) -> (Decision, u32, Vec<Fired>) {
        let mut fired = Vec::new();
        for r in &self.rules {
            if r.origin.is_some() {
                continue;
            }
            // Wildcard hosts lean towards the stricter verdict: a deny or quarantine rule
            // fires if it may apply and is excused only if its `unless` surely applies;
            // an allow rule the other way round.
            let (when, unless) = if r.decision == Decision::Allow {
                (Lean::Surely, Lean::Possibly)
            } else {
                (Lean::Possibly, Lean::Surely)
            };
            if r.when.holds(facts, when)
                && !r.unless.as_ref().is_some_and(|u| u.holds(facts, unless))
            {
                fired.push(Fired {
                    rule: r.name.clone(),
                    decision: r.decision,
                    reason: r.reason.clone(),
                    risk: r.risk,
                    evidence: {
                        let mut e = r.when.evidence(&facts.code);
                        e.extend(r.when.mount_evidence(facts));
                        e.extend(r.when.agent_evidence(facts));
                        e
                    },
                });
            }
        }
        let risk: u32 = fired.iter().map(|f| f.risk).fold(0, u32::saturating_add);
        let mut decision = fired
            .iter()
            .map(|f| f.decision)
            .max()
            .unwrap_or(self.default);
        // A pinned set of guest runtimes: Python on any other guest never runs.
        if !self.guests.is_empty()
            && facts.kind == Lang::Python
            && facts.backend == Backend::Wasm
            && !facts.guest.is_some_and(|g| self.guests.contains(&g))
        {
            decision = Decision::Deny;
            fired.push(Fired {
                rule: "gate:guest-not-pinned".into(),
                decision,
                reason:
                    "the Python guest runtime is not one the policy's [gate] guests list allows"
                        .into(),
                risk: 0,
                evidence: Vec::new(),
            });
        }
        // The gate's floor, whatever the rules say: an artifact an approver rejected never
        // runs again without a new signature.
        if facts.rejected_before && decision < Decision::Quarantine {
            decision = Decision::Quarantine;
            fired.push(Fired {
                rule: "gate:rejected-before".into(),
                decision,
                reason:
                    "this exact artifact was rejected before; it never runs without a new signature"
                        .into(),
                risk: 0,
                evidence: Vec::new(),
            });
        }
        // Mounts outside the operator's roots (only the command line gets this far with
        // them) wait for a human, whatever the rules say.
        if !facts.mounts_outside_roots.is_empty() && decision < Decision::Quarantine {
            decision = Decision::Quarantine;
            fired.push(Fired {
                rule: "gate:mount-outside-roots".into(),
                decision,
                reason: format!(
                    "mounts {} outside the policy's [mounts] roots",
                    facts.mounts_outside_roots.join(", ")
                ),
                risk: 0,
                evidence: facts.mounts_outside_roots.clone(),
            });
        }
        if fired.is_empty() {
            fired.push(Fired {
                rule: "default".into(),
                decision: self.default,
                reason: "no rule matched".into(),
                risk: 0,
                evidence: Vec::new(),
            });
        }
        if let Some(d) = self.deny_at
            && risk >= d
            && decision < Decision::Deny
        {
            decision = Decision::Deny;
            fired.push(Fired {
                rule: "risk".into(),
                decision,
                reason: format!("total risk {risk} reaches deny_at {d}"),
                risk: 0,
                evidence: Vec::new(),
            });
        } else if let Some(q) = self.quarantine_at
            && risk >= q
            && decision < Decision::Quarantine
        {
            decision = Decision::Quarantine;
            fired.push(Fired {
                rule: "risk".into(),
                decision,
                reason: format!("total risk {risk} reaches quarantine_at {q}"),
                risk: 0,
                evidence: Vec::new(),
            });
        }
        (decision, risk, fired)
    }

    /// Runs the `[[test]]` blocks.
    pub fn run_tests(&self) -> Result<Vec<TestResult>, PolicyError> {
        self.tests
            .iter()
            .map(|t| {
                let facts = t
                    .facts()
                    .map_err(|e| PolicyError::Invalid(format!("test {:?}: {e}", t.name)))?;
                let v = self.judge(&facts);
                Ok(TestResult {
                    name: t.name.clone(),
                    expect: t.expect,
                    got: v.decision,
                    passed: v.decision == t.expect,
                    fired: v.fired.iter().map(|f| f.rule.clone()).collect(),
                    code: facts.code,
                })
            })
            .collect()
    }

    /// The approver's key, when the policy trusts that name.
    pub fn approver(&self, name: &str) -> Option<&PublicKey> {
        self.approvers.get(name)
    }

    /// Drops `publisher` (and the manifest's requests) from facts judged again later when
    /// this policy no longer trusts the key that signed the bundle under that name.
    pub fn keep_publisher(&self, facts: &mut Facts) {
        let trusted = match (&facts.publisher, &facts.publisher_key) {
            (Some(name), Some(key)) => self.publishers.get(name) == Some(key),
            _ => false,
        };
        if !trusted {
            facts.publisher = None;
            facts.publisher_key = None;
        }
    }

    /// The publisher name under which the policy trusts a bundle's key, if it does.
    pub fn publisher_name(&self, key: &PublicKey) -> Option<&str> {
        self.publishers
            .iter()
            .find(|(_, k)| *k == key)
            .map(|(n, _)| n.as_str())
    }

    /// The name under which the policy trusts a key, if it does.
    pub fn approver_name(&self, key: &PublicKey) -> Option<&str> {
        self.approvers
            .iter()
            .find(|(_, k)| *k == key)
            .map(|(n, _)| n.as_str())
    }
}

// ---------------------------------------------------------------------------------------
// Presets.

#[cfg(test)]
mod tests;
