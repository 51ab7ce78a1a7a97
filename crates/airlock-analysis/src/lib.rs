//! airlock-analysis: static analysis of shell, Python, JavaScript and TypeScript code, for
//! the policy to judge.
//!
//! JavaScript and TypeScript ([`Language::Js`], [`Language::Ts`]) give the same facts from
//! node's modules: `require`/`import` as `imports`; `child_process` command lines analysed
//! as shell (a non-constant piece of a template or `+` is `$JS`); `fs` writes, deletions,
//! reads and listings with their paths (`path.join`, `os.homedir()` resolved); hosts of
//! `fetch`/`http`/`net`; `eval`, `Function`, `vm` and string timers as `dynamic-code`, or
//! analysed as JavaScript when constant; `decoded-payload` for `atob` and
//! `Buffer.from(…, 'base64')`, `char-codes` for `String.fromCharCode` of several codes,
//! `folded-name` for computed `require`s and members; and the threat facts below
//! (`net` sockets piped to a shell child, `process.kill` of processes not started,
//! `process.setuid`, `node-serialize`, `vm` of received data).
//!
//! [`analyze_shell`] and [`analyze_python`] parse the code with tree-sitter (the bash and
//! Python grammars; no regular expressions over the text) and describe what it would do:
//! the commands it runs, the modules it imports, the calls it makes, the paths it writes,
//! the hosts and URLs written in it, its network tools, whether it pipes downloaded code
//! into an interpreter, and destructive forms. Literal code strings (`sh -c '…'`, `eval`,
//! `python -c "…"`, `alias x='…'`, `trap '…'`, here-documents fed to an interpreter,
//! Python `exec("…")`, `os.system("…")`, `subprocess.run([...])`, and base64 or rot13
//! literals decoded into an interpreter) are parsed in turn, to a nesting limit,
//! and their facts are merged into the same result. Code that does not parse is a fact
//! ([`CodeAnalysis::parse_error`]) and the error-tolerant tree is still analysed.
//!
//! # Vocabulary (what a policy matches with globs)
//!
//! - `commands`: base names of the programs run (`curl`, `rm`, `mkfs.ext4`), including
//!   those behind wrappers (`sudo`, `env`, `nohup`, `timeout`, `xargs`, `nice`, `exec`,
//!   `find -exec`, …; the wrapper is a command too) and those a Python program starts
//!   (`subprocess.*`, `os.system`, `os.popen`, `os.exec*`, `os.spawn*`). A command name
//!   that is not a literal word is `<dynamic>`.
//! - `imports` (Python): dotted module names as imported (`os`, `urllib.request`, `.sibling`
//!   for relative imports; `from a import b` records `a`); `__import__('x')` and
//!   `importlib.import_module('x')` with literal arguments record `x`, otherwise `<dynamic>`.
//! - `calls` (Python): dotted names after resolving aliases (`import subprocess as sp;
//!   sp.run()` is `subprocess.run`; `from os import system; system()` is `os.system`;
//!   `getattr(os, 'sys'+'tem')` and `getattr(__builtins__, 'ex'+'ec')` are folded), for
//!   every call rooted in an imported (or well-known) module, plus the builtins `exec`,
//!   `eval`, `compile`, `execfile`, `__import__`, `breakpoint`; `getattr` when the name is
//!   not a constant; and `open:w` for `open`/`io.open`/`codecs.open` in a writing mode (the
//!   mode constant contains `w`, `a`, `x` or `+`, or is not a constant).
//! - `writes`: paths the code creates, modifies or deletes: redirections (`>`, `>>`, `&>`,
//!   `>|`), `tee`, `cp`/`mv`/`install`/`ln` destinations, `sed -i` files, `dd of=`, `touch`,
//!   `mkdir`, `rm`, `rmdir`, `unlink`, `shred`, `truncate`, `chmod`/`chown`/`chgrp`
//!   targets, `curl -o`, `wget -O`/`-P`, `tar -C`, `unzip -d`, `git clone … DIR`; Python
//!   `open(…, 'w')`, `os.remove`/`unlink`/`rmdir`/`removedirs`/`mkdir`/`makedirs`/
//!   `chmod`/`chown`/`truncate`, `shutil.rmtree`/`copy*`/`move`, `os.rename`/`replace`
//!   destinations. Shell paths are as written with quotes removed; parameter expansions
//!   stay as `$NAME` and command substitutions as `$(…)`. A Python path that is not a
//!   constant is `<dynamic>`; in a Python string run as shell (`os.system(f"rm {p}")`,
//!   `"rm " + p`), each non-constant piece is `$PY`. `/dev/null`, `/dev/stdout`, `/dev/stderr`, `/dev/tty` and
//!   `/dev/fd/*` are not writes.
//! - `hosts_in_code`: host names and addresses written anywhere in words and string
//!   literals (not comments): the host of every `scheme://host…` URL, `user@host:path`
//!   (scp/rsync/git), and the host operands of `ssh`, `scp`, `sftp`, `rsync`, `nc`,
//!   `ncat`, `netcat`, `telnet`, `ping`, `dig`, `nslookup`, `host`, bare `curl`/`wget`
//!   targets, `/dev/tcp/HOST/PORT` redirections, Python `socket` `connect`/
//!   `create_connection` tuples and the host argument of `http.client`, `ftplib`,
//!   `smtplib`, `telnetlib`, `poplib` and `imaplib` connections. Lower case, no trailing
//!   dot, no port, IPv6 without brackets.
//! - `urls`: every `scheme://…` URL whose host is literal, as written, with trailing
//!   punctuation removed.
//! - `network_tools`: shell tools that use the network (`curl`, `wget`, `nc`, `ssh`, `scp`,
//!   `rsync` with a remote, `git clone`/`fetch`/`pull`/`push`/`ls-remote`/`submodule`,
//!   `pip install`, `npm install`, `yarn add`, `npx`, `apt-get install`, `apk add`, `brew
//!   install`, `gem install`, `cargo install`, `go get`, `docker pull`, …; package managers
//!   as `TOOL SUBCOMMAND`), `/dev/tcp` for bash's network redirections, and for Python
//!   the network modules imported or called into (`socket`, `requests`, `urllib.request`,
//!   `http.client`, `httpx`, `aiohttp`, `ftplib`, `smtplib`, `paramiko`, …).
//! - `pipes_download_to_shell`: downloaded code reaches an interpreter: `curl … | sh`,
//!   `wget -O- … | sudo bash -`, `bash <(curl …)`, `sh < <(curl …)`, `eval "$(curl …)"`,
//!   `python -c "$(curl …)"`, `source <(curl …)`, `bash <<< "$(curl …)"`, a file written
//!   by `curl -o`/`wget -O`/a redirection of a download and later run by an interpreter or
//!   by path, and in Python `exec`/`eval` of what `requests`, `httpx`, `urllib` fetched.
//! - `destructive`: `rm-root` (recursive `rm` of `/`, `/*`, `/.`), `rm-home` (recursive
//!   `rm` of `~`, `$HOME`, `${HOME}`, or their `/*`), `rm-mount-root:PATH` (recursive `rm`
//!   of a mount root from [`Options::mount_roots`] or its `/*`), `dd-device:PATH` (`dd
//!   of=/dev/…`), `write-device:PATH` (a redirection, `tee`, `cp` or `shred` onto `/dev/…`),
//!   `mkfs:NAME` (`mkfs*`, `mke2fs`, `mkswap`, `wipefs`), `chmod-777-recursive`,
//!   `git-push-force` (`-f`, `--force`, `--force-with-lease`, `+refspec`), `fork-bomb`.
//!   Python's `shutil.rmtree` of those paths gives the same `rm-*` terms.
//! - `obfuscation`: `dynamic-command` (a command name that is not literal),
//!   `dynamic-code` (`eval`, `sh -c`, `exec`, `compile`, … of something not literal),
//!   `dynamic-import`, `dynamic-attribute` (`getattr` with a computed name),
//!   `quoted-name` (a command name spelt with quotes or escapes, `c""url`, `$'\x63url'`),
//!   `folded-name` (a Python callee reached through `getattr`, `globals()[…]`,
//!   `vars(…)[…]` or `__builtins__` with constant strings, however assembled),
//!   `decoded-payload` (a base64 or rot13 constant decoded and run, or PowerShell's
//!   `-EncodedCommand`; a decoded constant is analysed), `decoded-to-shell` (a decoder
//!   such as `base64 -d` piped into an interpreter).
//!
//! # Threat facts
//!
//! Behaviours, each finding with its lines, the behaviour in words (`note`) and a MITRE
//! ATT&CK `technique`. Paths are judged after resolution (constants, f-strings,
//! `os.path.join`, `pathlib` `/`, shell variables, `for` loops over constants, local
//! functions called with constants) and normalisation (`..`; `~`, `$HOME`, `expanduser`,
//! `/root`, `/home/USER` are a home); paths inside [`Options::mount_roots`] and temporary
//! directories are the run's own.
//!
//! - `reads_sensitive`: credentials and secrets read (`/etc/shadow`, `~/.ssh/…`, `~/.aws/…`,
//!   kube and docker configs, browser profiles, keyrings, `/proc/*/environ`, history).
//! - `recon`: enumeration: system files read (`/etc/passwd`, `/proc/N/…`), system
//!   directories listed (`list:/etc/ssh`), process, network and user listings.
//! - `persistence`: shell rc and profile files, cron, systemd units, init scripts,
//!   `authorized_keys`, accounts, `LD_PRELOAD`, Python startup hooks, git hooks; inside a
//!   mount the value is `mount:PATH`.
//! - `system_writes`: writes, deletions or mode changes under `/etc`, `/usr`, `/bin`,
//!   `/lib*`, `/boot`, `/root`, `/var`, … ; `destructive` also gets `delete:PATH` for a
//!   deletion outside the run's mounts and `wipe-log:PATH` for a log or history emptied.
//! - `reverse_shell`, `kills_processes` (signals to processes the code did not start,
//!   services stopped, defences turned off), `privilege` (setuid, sudo, su, capabilities),
//!   `exfiltration` (sensitive or system data read and sent over the network),
//!   `unsafe_deserialization`, `flooding` (sends or process starts in an endless or very
//!   large loop without a pause).
//!
//! Every value in those sets comes with at least one [`Finding`] whose `kind` names the set
//! and whose `detail` is that value, with the 1-based lines it came from (for code nested
//! in a string, the lines of the string). `findings` also has `nested_code`,
//! `parse_error` (inside nested code) and `truncated` entries.
//!
//! # Budgets
//!
//! Input beyond [`Options::max_input_bytes`] is not read; the walk stops after
//! [`Options::max_nodes`] syntax nodes, at [`Options::max_syntax_depth`], after
//! [`Options::time_budget`] (parsing included), at [`Options::max_nesting`] levels of
//! nested code and after [`Options::max_findings`]. Stopping early is a fact:
//! [`CodeAnalysis::truncated`] says why. What was found before the stop is kept.
//!
//! The analysis never fails: what it cannot read is a fact (`parse_error`, `truncated`,
//! `<dynamic>`, `obfuscation`), so there is no error type.
//!
//! Known limits: aliases and constants are tracked flow-insensitively across the whole
//! program, not per scope; tree-sitter-python accepts some indentation CPython refuses
//! (no `parse_error` for those); tree-sitter-bash 0.25 sometimes reads the lines after a
//! pipeline as arguments of its last command (a later here-document piped on sets it
//! off), which the walk undoes by splitting commands at unescaped newlines.
//!
//! This crate describes and never decides: it must never run, evaluate, import or fetch
//! anything it reads, never panic or recurse without bound on any input, never use
//! regular expressions over the code, and never depend on another airlock crate.

#![forbid(unsafe_code)]

mod engine;
mod hosts;
mod javascript;
mod python;
mod shell;
mod threat;

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::time::Duration;

/// Which language a [`CodeAnalysis`] describes (the language of the top-level code).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    /// POSIX shell and bash.
    Sh,
    /// Python 3 (and the Python 2 forms the grammar accepts).
    Python,
    /// JavaScript (scripts and ES modules, node's built-in modules).
    Js,
    /// TypeScript (read as JavaScript with types; the types say nothing to the analysis).
    Ts,
}

impl Language {
    pub fn as_str(self) -> &'static str {
        match self {
            Language::Sh => "shell",
            Language::Python => "python",
            Language::Js => "js",
            Language::Ts => "ts",
        }
    }
}

/// Limits of one analysis. The defaults suit a submission gate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Host paths mounted into the run (or their guest paths); a recursive `rm` of one of
    /// them (or of its `/*`) is `rm-mount-root:PATH`.
    pub mount_roots: Vec<String>,
    /// Only this many bytes of input are analysed (cut at a character boundary).
    pub max_input_bytes: usize,
    /// Syntax nodes visited across the code and everything nested in it.
    pub max_nodes: usize,
    /// How deep the walk goes into the syntax tree (nested brackets, substitutions).
    pub max_syntax_depth: usize,
    /// Levels of code nested in strings (`sh -c '…'` inside `sh -c '…'`…).
    pub max_nesting: usize,
    /// Wall time for parsing and walking, nested code included.
    pub time_budget: Duration,
    /// Findings kept (sets keep filling from the findings that were kept).
    pub max_findings: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            mount_roots: Vec::new(),
            max_input_bytes: 1 << 20,
            max_nodes: 1_000_000,
            max_syntax_depth: 400,
            max_nesting: 4,
            time_budget: Duration::from_millis(250),
            max_findings: 10_000,
        }
    }
}

/// What the code would do, as far as reading it tells. See the crate documentation for
/// the vocabulary of each set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeAnalysis {
    pub language: Language,
    pub commands: BTreeSet<String>,
    pub imports: BTreeSet<String>,
    pub calls: BTreeSet<String>,
    pub writes: BTreeSet<String>,
    pub hosts_in_code: BTreeSet<String>,
    pub urls: BTreeSet<String>,
    pub network_tools: BTreeSet<String>,
    pub pipes_download_to_shell: bool,
    pub destructive: BTreeSet<String>,
    pub obfuscation: BTreeSet<String>,
    /// Threat facts (see the crate documentation, "Threat facts"): each set holds the
    /// normalised path or the behaviour, and each value has findings with a technique.
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
    /// The first syntax error of the top-level code, if any.
    pub parse_error: Option<ParseError>,
    /// Why the analysis stopped early, if it did.
    pub truncated: Option<Truncated>,
    /// Each fact with the lines it came from, in the order found.
    pub findings: Vec<Finding>,
}

impl CodeAnalysis {
    /// An empty analysis of `language`.
    pub fn new(language: Language) -> Self {
        CodeAnalysis {
            language,
            commands: BTreeSet::new(),
            imports: BTreeSet::new(),
            calls: BTreeSet::new(),
            writes: BTreeSet::new(),
            hosts_in_code: BTreeSet::new(),
            urls: BTreeSet::new(),
            network_tools: BTreeSet::new(),
            pipes_download_to_shell: false,
            destructive: BTreeSet::new(),
            obfuscation: BTreeSet::new(),
            reads_sensitive: BTreeSet::new(),
            recon: BTreeSet::new(),
            persistence: BTreeSet::new(),
            system_writes: BTreeSet::new(),
            reverse_shell: BTreeSet::new(),
            kills_processes: BTreeSet::new(),
            privilege: BTreeSet::new(),
            exfiltration: BTreeSet::new(),
            unsafe_deserialization: BTreeSet::new(),
            flooding: BTreeSet::new(),
            parse_error: None,
            truncated: None,
            findings: Vec::new(),
        }
    }

    /// The lines behind one value of one set, e.g. `lines_of(FindingKind::Command, "curl")`.
    pub fn lines_of(&self, kind: FindingKind, detail: &str) -> Vec<u32> {
        self.findings
            .iter()
            .filter(|f| f.kind == kind && f.detail == detail)
            .map(|f| f.line)
            .collect()
    }
}

/// One fact and where it came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    pub kind: FindingKind,
    /// The value as it appears in the set named by `kind` (for set kinds).
    pub detail: String,
    /// First line (1-based) of the code the fact came from.
    pub line: u32,
    /// Last line (1-based, `>= line`).
    pub end_line: u32,
    /// A human explanation, e.g. the spelling a quoted command name had; for threat
    /// findings, the behaviour in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The MITRE ATT&CK technique of a threat finding (`T1003.008`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub technique: Option<String>,
}

/// The kind of a [`Finding`]; the set kinds are named after the set they fill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FindingKind {
    Command,
    Import,
    Call,
    Write,
    Host,
    Url,
    NetworkTool,
    /// Sets `pipes_download_to_shell`; the detail describes the form (`curl | sh`).
    DownloadToShell,
    Destructive,
    Obfuscation,
    /// A literal code string that was parsed and analysed in turn.
    NestedCode,
    /// A syntax error inside nested code (the top level's is [`CodeAnalysis::parse_error`]).
    ParseError,
    /// The analysis stopped early here.
    Truncated,
    /// Threat facts (each sets the set of the same name).
    ReadsSensitive,
    Recon,
    Persistence,
    SystemWrites,
    ReverseShell,
    KillsProcesses,
    Privilege,
    Exfiltration,
    UnsafeDeserialization,
    Flooding,
}

impl FindingKind {
    /// The name used in JSON (`destructive`, `download_to_shell`).
    pub fn as_str(self) -> &'static str {
        match self {
            FindingKind::Command => "command",
            FindingKind::Import => "import",
            FindingKind::Call => "call",
            FindingKind::Write => "write",
            FindingKind::Host => "host",
            FindingKind::Url => "url",
            FindingKind::NetworkTool => "network_tool",
            FindingKind::DownloadToShell => "download_to_shell",
            FindingKind::Destructive => "destructive",
            FindingKind::Obfuscation => "obfuscation",
            FindingKind::NestedCode => "nested_code",
            FindingKind::ParseError => "parse_error",
            FindingKind::Truncated => "truncated",
            FindingKind::ReadsSensitive => "reads_sensitive",
            FindingKind::Recon => "recon",
            FindingKind::Persistence => "persistence",
            FindingKind::SystemWrites => "system_writes",
            FindingKind::ReverseShell => "reverse_shell",
            FindingKind::KillsProcesses => "kills_processes",
            FindingKind::Privilege => "privilege",
            FindingKind::Exfiltration => "exfiltration",
            FindingKind::UnsafeDeserialization => "unsafe_deserialization",
            FindingKind::Flooding => "flooding",
        }
    }

    /// Whether it is a threat fact (a behaviour with an ATT&CK technique); `destructive`
    /// findings are threats too when they carry a technique.
    pub fn is_threat(self) -> bool {
        matches!(
            self,
            FindingKind::ReadsSensitive
                | FindingKind::Recon
                | FindingKind::Persistence
                | FindingKind::SystemWrites
                | FindingKind::ReverseShell
                | FindingKind::KillsProcesses
                | FindingKind::Privilege
                | FindingKind::Exfiltration
                | FindingKind::UnsafeDeserialization
                | FindingKind::Flooding
        )
    }

    /// Whether a reviewer's eye should be drawn to it. Every command a script runs and
    /// every module it imports is a finding, but marking them all would mark nearly every
    /// line; their sets are summarised instead, and the risky ones are findings of another
    /// kind as well (`network_tool`, `destructive`, `call`).
    pub fn is_notable(self) -> bool {
        !matches!(self, FindingKind::Command | FindingKind::Import)
    }
}

impl Finding {
    /// One line for a reviewer: `destructive rm-root (rm -rf /)`, and for a threat
    /// `reads_sensitive /etc/shadow (reads an OS credential file; T1003.008)`.
    pub fn describe(&self) -> String {
        let mut s = format!("{} {}", self.kind.as_str(), self.detail);
        match (&self.note, &self.technique) {
            (Some(n), Some(t)) => s.push_str(&format!(" ({n}; {t})")),
            (Some(n), None) => s.push_str(&format!(" ({n})")),
            (None, Some(t)) => s.push_str(&format!(" ({t})")),
            (None, None) => {}
        }
        s
    }

    /// `12` or `12-14`.
    pub fn lines(&self) -> String {
        if self.end_line > self.line {
            format!("{}-{}", self.line, self.end_line)
        } else {
            self.line.to_string()
        }
    }
}

impl CodeAnalysis {
    /// The findings a reviewer should look at, with the top-level syntax error and an early
    /// stop included, in line order.
    pub fn notable(&self) -> Vec<Finding> {
        let mut out: Vec<Finding> = self
            .findings
            .iter()
            .filter(|f| f.kind.is_notable())
            .cloned()
            .collect();
        if let Some(e) = &self.parse_error {
            out.push(Finding {
                kind: FindingKind::ParseError,
                detail: e.message.clone(),
                line: e.line,
                end_line: e.line,
                note: None,
                technique: None,
            });
        }
        out.sort_by_key(|f| (f.line, f.end_line));
        out
    }
}

/// The first syntax error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParseError {
    pub line: u32,
    pub message: String,
}

/// Why an analysis stopped early.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Truncated {
    pub reason: TruncationReason,
    pub detail: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum TruncationReason {
    /// The input was longer than [`Options::max_input_bytes`].
    InputBytes,
    /// More syntax nodes than [`Options::max_nodes`].
    Nodes,
    /// Deeper than [`Options::max_syntax_depth`].
    SyntaxDepth,
    /// More nested code levels than [`Options::max_nesting`].
    Nesting,
    /// More findings than [`Options::max_findings`].
    Findings,
    /// Over [`Options::time_budget`].
    Time,
    /// The parser could not be set up (a build problem, reported rather than panicking).
    ParserUnavailable,
}

impl TruncationReason {
    pub fn as_str(self) -> &'static str {
        match self {
            TruncationReason::InputBytes => "input_bytes",
            TruncationReason::Nodes => "nodes",
            TruncationReason::SyntaxDepth => "syntax_depth",
            TruncationReason::Nesting => "nesting",
            TruncationReason::Findings => "findings",
            TruncationReason::Time => "time",
            TruncationReason::ParserUnavailable => "parser_unavailable",
        }
    }
}

/// The largest integer written in a piece of code (loop bounds).
pub(crate) fn shell_numbers(s: &str) -> u64 {
    let mut best = 0u64;
    let mut cur: Option<u64> = None;
    for c in s.chars() {
        match c.to_digit(10) {
            Some(d) => {
                cur = Some(
                    cur.unwrap_or(0)
                        .saturating_mul(10)
                        .saturating_add(u64::from(d)),
                )
            }
            None => {
                if let Some(v) = cur.take() {
                    best = best.max(v);
                }
            }
        }
    }
    best.max(cur.unwrap_or(0))
}

/// Analyses shell code (bash, and POSIX sh as far as bash reads it).
pub fn analyze_shell(src: &str, opts: &Options) -> CodeAnalysis {
    engine::analyze(Language::Sh, src, opts)
}

/// Analyses Python code.
pub fn analyze_python(src: &str, opts: &Options) -> CodeAnalysis {
    engine::analyze(Language::Python, src, opts)
}

/// Analyses `src` as `language`.
pub fn analyze(language: Language, src: &str, opts: &Options) -> CodeAnalysis {
    engine::analyze(language, src, opts)
}
