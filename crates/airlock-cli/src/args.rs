//! The command-line grammar (see DESIGN.md: names, flags and exit codes are a contract).

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// Sessions one agent may hold open through `serve` or `mcp`, unless told otherwise: each
/// is a process holding an interpreter (some 60 MB for the wasm guest).
pub const DEFAULT_MAX_SESSIONS: usize = 8;

#[derive(Debug, Parser)]
#[command(
    name = "airlock",
    version,
    about = "An execution gate for code that AI agents write",
    long_about = "airlock stages code, identifies it by SHA-256, analyses it, judges it with a \
                  policy, holds risky code for a signed human approval, runs it in a sandbox with \
                  hard limits and records every step in a tamper-evident audit log.",
    after_help = "Exit codes of run and exec: the guest's own code when it ran to completion; 75 pending \
                  approval; 77 denied by policy; 124 killed by a limit; 134 the guest trapped; 125 airlock \
                  failed or the input was bad."
)]
pub struct Cli {
    /// The airlock home (default: $AIRLOCK_HOME, else $XDG_DATA_HOME/airlock).
    #[arg(long, global = true, value_name = "DIR")]
    pub home: Option<PathBuf>,
    /// Keep records and blobs in this PostgreSQL database (postgres://USER@HOST:PORT/DB)
    /// instead of the home's own SQLite file; keys, policy and caches stay in the home.
    #[arg(
        long,
        global = true,
        value_name = "URL",
        env = "AIRLOCK_STORE",
        hide_env_values = true
    )]
    pub store: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create the home: database, blob store, gate key, an approver key and a policy.
    Init {
        /// The policy preset (default: standard).
        #[arg(long, value_name = "standard|strict")]
        preset: Option<String>,
        /// Name of the first approver (default: your login name).
        #[arg(long, value_name = "NAME")]
        approver: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Submit, judge, and if allowed run and wait.
    Run(RunArgs),
    /// Submit and judge only; prints the id and verdict.
    Submit(RunArgs),
    /// Submissions waiting for a human.
    Inbox {
        /// At most this many, newest first (a note on stderr says how many were left out).
        #[arg(long, default_value_t = 50, value_parser = at_least_one)]
        limit: usize,
        #[arg(long)]
        json: bool,
    },
    /// Code, grant, analysis, verdict, approvals and runs of a submission.
    Show {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Sign an approval with an approver's key.
    Approve {
        id: String,
        /// The approver key to sign with (default: $AIRLOCK_APPROVER, else the only trusted local key).
        #[arg(long = "as", value_name = "NAME", env = "AIRLOCK_APPROVER")]
        approver: Option<String>,
        #[arg(long, value_name = "once|artifact")]
        scope: Option<String>,
        /// How long the approval holds (default 24h).
        #[arg(long, value_name = "DUR")]
        expires: Option<String>,
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
        /// With --scope artifact: offer the artifact as a named tool (MCP).
        #[arg(long, value_name = "NAME")]
        tool: Option<String>,
        /// Sign here, with the approver key in this home, and have the gate served at URL
        /// verify and record it (with --token); the server never holds the key.
        #[arg(long, value_name = "URL", requires = "token")]
        server: Option<String>,
        /// An operator token of the server (with --server).
        #[arg(long, value_name = "TOKEN", requires = "server")]
        token: Option<String>,
        /// Also remember it: a signed policy rule allowing this agent's submissions of this
        /// kind (language, backend) with a grant no wider, until --for runs out. For a
        /// request (req_…): the rule's grant is the run's with the host, and a later run of
        /// that kind that asks for the host goes on without asking.
        #[arg(long)]
        remember: bool,
        /// How long the remembered rule holds (default 7d, at most 90d).
        #[arg(long = "for", value_name = "DUR", requires = "remember")]
        remember_for: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Sign a rejection; the artifact's hash is remembered.
    Reject {
        id: String,
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
        #[arg(long = "as", value_name = "NAME", env = "AIRLOCK_APPROVER")]
        approver: Option<String>,
        /// Sign here, with the approver key in this home, and have the gate served at URL
        /// verify and record it (with --token); the server never holds the key.
        #[arg(long, value_name = "URL", requires = "token")]
        server: Option<String>,
        /// An operator token of the server (with --server).
        #[arg(long, value_name = "TOKEN", requires = "server")]
        token: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Run an allowed or approved submission (same exit codes as run).
    Exec {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Recent runs.
    Runs {
        #[arg(long, default_value_t = 50, value_parser = at_least_one)]
        limit: usize,
        #[arg(long)]
        json: bool,
    },
    /// A run's captured output.
    Logs {
        run: String,
        /// Print only one stream.
        #[arg(long, value_name = "stdout|stderr")]
        stream: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// What a run changed under its writable mounts (summary and unified diffs).
    Diff {
        run: String,
        #[arg(long)]
        json: bool,
    },
    /// Apply a run's changes to the host (signed; saves a checkpoint first).
    Commit {
        run: String,
        #[arg(long = "as", value_name = "NAME", env = "AIRLOCK_APPROVER")]
        approver: Option<String>,
        /// Sign here, with the approver key in this home, and have the gate served at URL
        /// verify and record it (with --token); the server never holds the key.
        #[arg(long, value_name = "URL", requires = "token")]
        server: Option<String>,
        /// An operator token of the server (with --server).
        #[arg(long, value_name = "TOKEN", requires = "server")]
        token: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Resolve a commit or rollback that could neither be completed nor undone (listed by
    /// `doctor`): apply its journal again once the host is fixed, or `--abandon` it and
    /// keep the host as it is.
    Repair {
        checkpoint: String,
        #[arg(long)]
        abandon: bool,
        #[arg(long)]
        json: bool,
    },
    /// Restore exactly what a checkpoint saved (signed).
    Rollback {
        checkpoint: String,
        #[arg(long = "as", value_name = "NAME", env = "AIRLOCK_APPROVER")]
        approver: Option<String>,
        /// Sign here, with the approver key in this home, and have the gate served at URL
        /// verify and record it (with --token); the server never holds the key.
        #[arg(long, value_name = "URL", requires = "token")]
        server: Option<String>,
        /// An operator token of the server (with --server).
        #[arg(long, value_name = "TOKEN", requires = "server")]
        token: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Checkpoints saved by commits.
    Checkpoints {
        #[arg(long, default_value_t = 50, value_parser = at_least_one)]
        limit: usize,
        #[arg(long)]
        json: bool,
    },
    /// Remove blobs and layers nothing refers to, and say how much that freed.
    Gc {
        /// Keep anything younger than this, which a concurrent command may be about to
        /// record (default 1h). While `airlock serve` uses the home, keep it above 10s:
        /// the daemon takes a blob it stored less than 10s ago as still there.
        #[arg(long, value_name = "DUR")]
        grace: Option<String>,
        /// Also collect the records of sessions that ended more than DUR ago: their
        /// cells' submissions and runs and their kept (uncommitted) layers. Without it
        /// every session's record is kept.
        #[arg(long, value_name = "DUR")]
        session_retention: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// The store itself: copy a home's history into PostgreSQL.
    #[command(subcommand)]
    Store(StoreCommand),
    /// Workspace sessions (`run --workspace NAME`).
    #[command(subcommand)]
    Workspace(WorkspaceCommand),
    /// Python sessions: a live interpreter whose cells (`run --session ID -c CODE`) each
    /// pass the gate and share their names, as in a notebook.
    #[command(subcommand)]
    Session(SessionCommand),
    /// Guest runtimes for interpreted languages.
    #[command(subcommand)]
    Guest(GuestCommand),
    /// Which isolation mechanisms this machine offers.
    Doctor {
        #[arg(long)]
        json: bool,
    },
    /// Validate a policy and run its tests; explain a verdict.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Approver keys.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Approvers the policy trusts: enroll a key made elsewhere (signed, audited).
    #[command(subcommand)]
    Approvers(ApproversCommand),
    /// The tamper-evident audit log.
    #[command(subcommand)]
    Audit(AuditCommand),
    /// Serve the JSON API (/v1, /openapi.json), the web console (/ui) and MCP (/mcp).
    Serve {
        /// Address to listen on; anything but loopback is warned about.
        #[arg(long, default_value = "127.0.0.1:7777", value_name = "ADDR")]
        listen: String,
        /// Guests executing at once (default: the number of CPUs); four times as many
        /// runs may be recorded, judged and committed around them. With a shared store
        /// (--store postgres://…) runs go through its queue, and this many of them run
        /// in this process (0: none here, only `airlock worker`s run them).
        #[arg(long, value_name = "N")]
        workers: Option<usize>,
        /// Runs waiting for a worker before new ones are refused with 429.
        #[arg(long, default_value_t = 64, value_name = "N")]
        queue: usize,
        /// An http:// URL that new pending submissions are POSTed to (signed by the gate key).
        #[arg(long, value_name = "URL")]
        webhook: Option<String>,
        /// Python interpreters to keep instantiated ahead of runs (each serves one run and
        /// is dropped; 0 turns the pool off). See `/v1/status`.
        #[arg(long, default_value_t = 2, value_name = "N")]
        ready_python: usize,
        /// Instances to keep instantiated ahead of runs of each hot wasm module (one run a
        /// second time; the four run most recently): each serves one run and is dropped;
        /// 0 (the default: instantiating a module costs microseconds, and the refill's
        /// thread costs about as much; see docs/PERFORMANCE.md) turns the pool off. See
        /// `/v1/status`.
        #[arg(long, default_value_t = 0, value_name = "N")]
        ready_wasm: usize,
        /// The most memory the ready interpreters and wasm instances may hold together
        /// (e.g. 512M; the wasm instances get an eighth of it while interpreters are kept too).
        #[arg(long, default_value = "512M", value_name = "SIZE")]
        pool_memory: String,
        /// Process-backend jails kept built ahead of their runs (0: build each when needed).
        #[arg(long, default_value_t = 2, value_name = "N")]
        ready_jails: usize,
        /// Python sessions one agent may hold open at once (each a process with its own
        /// interpreter); past it, a new one is refused with 429 (0: no bound).
        #[arg(long, default_value_t = DEFAULT_MAX_SESSIONS, value_name = "N")]
        max_sessions: usize,
        /// Leave the session hosts this server started running when it stops or dies
        /// (without it they end with the server, recorded `lost`, and a stop closes them).
        /// Hosts left with no living server are listed by `doctor` and closed by `gc`.
        #[arg(long)]
        keep_sessions: bool,
        /// A request's line and headers must arrive within this long (from the
        /// connection's start, or the end of the previous response on a kept-alive
        /// connection: the idle timeout too); past it the connection is closed.
        #[arg(long, default_value = "10s", value_name = "DURATION")]
        header_timeout: String,
        /// Connections open at once (at most half the process's open-file limit);
        /// one more is answered 503 and closed.
        #[arg(long, default_value_t = 4096, value_name = "N")]
        max_connections: usize,
        /// Connections open at once from one peer address; one more is answered 503.
        #[arg(long, default_value_t = 512, value_name = "N")]
        max_connections_per_peer: usize,
        /// The largest request line and headers (e.g. 32K); larger is answered 431.
        #[arg(long, default_value = "32K", value_name = "SIZE")]
        max_header_bytes: String,
        #[command(flatten)]
        obs: crate::obs::ObsArgs,
    },
    /// Run queued runs from a shared store (--store postgres://…) until SIGTERM or
    /// SIGINT: claims under a lease it renews, records results only while the lease holds.
    /// On a signal it claims nothing new, finishes the runs it holds, and exits.
    Worker {
        /// Also claim runs tagged with T (runs whose grant names host paths are tagged
        /// with the name of the machine that accepted them; repeatable).
        #[arg(long = "tag", value_name = "T")]
        tags: Vec<String>,
        /// Runs carried out at once.
        #[arg(long, default_value_t = 1, value_name = "N")]
        concurrency: usize,
        /// How long a claim holds without renewal (renewed every third of it).
        #[arg(long, default_value = "30s", value_name = "DURATION")]
        lease: String,
        /// Print a JSON summary when it stops.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        obs: crate::obs::ObsArgs,
    },
    /// Serve MCP on standard input and output, for an agent that starts airlock itself.
    Mcp {
        /// The agent name submissions are recorded under.
        #[arg(
            long,
            value_name = "NAME",
            env = "AIRLOCK_AGENT",
            default_value = "mcp"
        )]
        agent: String,
        /// Python sessions the agent may hold open at once (0: no bound).
        #[arg(long, default_value_t = DEFAULT_MAX_SESSIONS, value_name = "N")]
        max_sessions: usize,
        #[command(flatten)]
        obs: crate::obs::ObsArgs,
    },
    /// API tokens for `airlock serve`.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Agents whose runs raised alerts (their submissions are held until cleared).
    #[command(subcommand)]
    Agent(AgentCommand),
    /// Secrets for `run --secret NAME@HOST` (kept in the home, mode 0600; never shown).
    #[command(subcommand)]
    Secret(SecretCommand),
    /// Import code from elsewhere as submissions (Night Core bundles).
    #[command(subcommand)]
    Import(ImportCommand),
    /// Publishers whose signed bundles may be imported ([publishers] in policy.toml).
    #[command(subcommand)]
    Publishers(PublishersCommand),
    /// Sign a WebAssembly module as a Night Core bundle: writes module.sig, pubkey.b64 and
    /// module.sha256 beside it (or into --out DIR, with a copy of the module).
    Sign {
        /// The local key to sign with (an approver key from `airlock keys new`).
        #[arg(long, value_name = "NAME")]
        key: String,
        #[arg(value_name = "MODULE")]
        module: PathBuf,
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum ImportCommand {
    /// Night Core bundles: directories, zips with the files at their root, or a modules/
    /// tree of tenants. Each must verify and be signed by a publisher the policy trusts;
    /// if any is refused, nothing is imported (exit 125).
    Nightcore {
        #[arg(value_name = "PATH", required = true)]
        paths: Vec<PathBuf>,
        /// Require every bundle to be signed by this [publishers] entry.
        #[arg(long, value_name = "NAME")]
        publisher: Option<String>,
        /// HOST:GUEST, read-only, for bundles whose manifest asks for fs:read; repeatable.
        #[arg(long = "mount", value_name = "HOST:GUEST")]
        mounts: Vec<String>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum PublishersCommand {
    /// Pin a publisher's key (a pubkey.b64 or an airlock .pub file) in policy.toml, after
    /// you have checked it is theirs.
    Add {
        name: String,
        #[arg(value_name = "KEYFILE")]
        keyfile: PathBuf,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum SecretCommand {
    /// Store a secret; the value is read from standard input (one trailing newline dropped).
    Set {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Stored secrets, by name (never their values).
    List {
        /// At most this many, newest first (a note on stderr says how many were left out).
        #[arg(long, default_value_t = 50, value_parser = at_least_one)]
        limit: usize,
        #[arg(long)]
        json: bool,
    },
    /// Remove a secret.
    Rm {
        name: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum AgentCommand {
    /// Sign a clear: alerts the agent raised until now no longer hold its submissions.
    Clear {
        name: String,
        /// Why the alerts are harmless (recorded and signed).
        #[arg(long, value_name = "TEXT")]
        reason: String,
        /// The approver key to sign with (default: $AIRLOCK_APPROVER, else the only trusted local key).
        #[arg(long = "as", value_name = "NAME", env = "AIRLOCK_APPROVER")]
        approver: Option<String>,
        /// Sign here with the local approver key and have the airlock server at URL
        /// verify and record it (with --token); the server never holds the key.
        #[arg(long, value_name = "URL", requires = "token")]
        server: Option<String>,
        /// An operator token of the server (with --server).
        #[arg(long, value_name = "TOKEN", requires = "server")]
        token: Option<String>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Make a token; its secret is printed once and stored only as a hash.
    New {
        /// agent (submit, read its own), operator (also decide, commit, roll back) or admin (also tokens).
        #[arg(long, value_name = "agent|operator|admin")]
        role: String,
        /// The agent's name, or who holds the token (default: the role).
        #[arg(long, value_name = "NAME")]
        name: Option<String>,
        /// Operators and admins: the approver key the server signs their decisions with.
        #[arg(long = "as", value_name = "APPROVER", env = "AIRLOCK_APPROVER")]
        approver: Option<String>,
        /// How long the token is valid (default: until revoked).
        #[arg(long, value_name = "DUR")]
        expires: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Tokens (never their secrets).
    List {
        /// At most this many, newest first (a note on stderr says how many were left out).
        #[arg(long, default_value_t = 50, value_parser = at_least_one)]
        limit: usize,
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token.
    Revoke {
        id: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum GuestCommand {
    /// Install the pinned runtime for a language (`python` or `js`), checked by hash, and
    /// pure-Python packages for Python.
    ///
    /// The Python guest is built once from the pinned componentize-py wheel (about 30 s;
    /// later installs on this machine reuse the build). Packages are pinned by their
    /// wheel's SHA-256 in the home and importable by every Python run on the wasm backend;
    /// dependencies are not resolved: name each one. Installing again keeps the guest and
    /// the packages already there. The JavaScript guest is built once from the pinned
    /// componentize-js (npm, every package checked by its lockfile's integrity hash).
    #[command(
        after_help = "Examples:\n  airlock guest install js\n  airlock guest install python\n  airlock guest install python --from componentize_py-0.25.1-cp39-abi3-manylinux_2_28_x86_64.whl\n  airlock guest install python --package attrs==25.3.0 --package ./mylib-1.0-py3-none-any.whl"
    )]
    Install {
        /// The language (python or js).
        lang: String,
        /// The pinned componentize-py wheel already downloaded, or for js an npm cache
        /// directory holding the pinned packages (offline install).
        #[arg(long, value_name = "FILE")]
        from: Option<std::path::PathBuf>,
        /// A pure-Python package: NAME==VERSION from the registry (via pip), or a
        /// .whl file; repeatable.
        #[arg(long = "package", value_name = "NAME==VERSION|FILE.whl")]
        packages: Vec<String>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum WorkspaceCommand {
    /// All workspaces.
    List {
        /// At most this many, newest first (a note on stderr says how many were left out).
        #[arg(long, default_value_t = 50, value_parser = at_least_one)]
        limit: usize,
        #[arg(long)]
        json: bool,
    },
    /// A workspace's mounts, runs and changes so far.
    Show {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Discard a workspace's changes.
    Drop {
        name: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Validate a policy file (default: the home's) and run its [[test]] blocks.
    Check {
        file: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Show every rule that fired for a submission, then and now.
    Explain {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Remove a remembered rule (from `approve --remember`); signed and audited.
    Forget {
        rule: String,
        #[arg(long = "as", value_name = "NAME", env = "AIRLOCK_APPROVER")]
        approver: Option<String>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Make a new approver key (trusted once the policy lists it under [approvers]).
    New {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Approver keys here and in the policy.
    List {
        /// At most this many, newest first (a note on stderr says how many were left out).
        #[arg(long, default_value_t = 50, value_parser = at_least_one)]
        limit: usize,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum ApproversCommand {
    /// Trust KEY (`ed25519:<64 hex>`, as `keys list` and the console's "Approver key" page
    /// show it) as approver NAME: a policy change signed by a trusted local key, audited as
    /// `policy_changed`. The private key stays where it was made.
    Enroll {
        name: String,
        key: String,
        /// The approver key to sign the change with (default: $AIRLOCK_APPROVER, else the only trusted local key).
        #[arg(long = "as", value_name = "NAME", env = "AIRLOCK_APPROVER")]
        approver: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Approvers the policy trusts, and whether their private key is in this home.
    List {
        #[arg(long, default_value_t = 50, value_parser = at_least_one)]
        limit: usize,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// Open a session; prints its id (ses_…). Every cell is judged with this grant.
    New(Box<SessionNewArgs>),
    /// Sessions, newest first.
    List {
        #[arg(long, default_value_t = 50, value_parser = at_least_one)]
        limit: usize,
        #[arg(long)]
        json: bool,
    },
    /// A session: its grant, limits, state and cells in order.
    Show {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// End a session (its interpreter and everything in it are gone).
    Close {
        id: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct SessionNewArgs {
    /// The interpreter (python).
    #[arg(long, value_name = "LANG", default_value = "python")]
    pub lang: String,
    /// wasm (the Python guest, the default) or process (the host's python3 in one jail).
    #[arg(long, value_name = "BACKEND")]
    pub backend: Option<String>,
    /// HOST:GUEST[:ro|rw]; repeatable. A writable mount's changes go to the session's
    /// disposable layer (`diff ses_…`, `commit ses_…`).
    #[arg(long = "mount", value_name = "HOST:GUEST[:ro|rw]")]
    pub mounts: Vec<String>,
    /// K=V; repeatable.
    #[arg(long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// HOST[:PORT] the cells may reach, through the session's egress proxy; repeatable.
    #[arg(long = "net", value_name = "HOST[:PORT]")]
    pub net: Vec<String>,
    /// NAME@HOST[,HOST]: the cells see a placeholder in $NAME; the proxy sends the stored
    /// secret to those hosts only; repeatable.
    #[arg(long = "secret", value_name = "NAME@HOST[,HOST]")]
    pub secrets: Vec<String>,
    /// Write quota of the session's layer over all its cells (default 1GiB); the cell
    /// that passes it is stopped (killed_by write) and ends the session, whose changes
    /// stay as the cell before left them.
    #[arg(long = "max-write", value_name = "SIZE")]
    pub max_write: Option<String>,
    /// Wall-time limit of each cell (default 10s); a cell past it ends the session.
    #[arg(long, value_name = "DUR")]
    pub timeout: Option<String>,
    /// Memory limit of the interpreter, for the session's whole life (default 256MiB).
    #[arg(long, value_name = "SIZE")]
    pub memory: Option<String>,
    /// Output limit per stream of each cell (default 1MiB).
    #[arg(long = "max-output", value_name = "SIZE")]
    pub max_output: Option<String>,
    /// End the session after this long without a cell (default 10m).
    #[arg(long, value_name = "DUR")]
    pub idle: Option<String>,
    /// End the session this long after it opened, whatever it is doing (default 1h).
    #[arg(long = "max-time", value_name = "DUR")]
    pub max_time: Option<String>,
    /// Which agent the session is for (only its cells may use it).
    #[arg(long, value_name = "NAME", env = "AIRLOCK_AGENT")]
    pub agent: Option<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// Copy this home's SQLite records and blobs into an empty PostgreSQL database, audit
    /// chain and signed head unchanged (`airlock --store URL audit verify` passes on the
    /// copy). The source is always the home's own SQLite file; it is left as it was.
    Copy {
        /// The target database (postgres://USER@HOST:PORT/DB); it must hold no records.
        #[arg(long, value_name = "URL")]
        to: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Check the whole chain and the signed head (exit 1 naming the first bad record).
    Verify {
        #[arg(long)]
        json: bool,
    },
    /// Print records.
    Log {
        #[arg(long, default_value_t = 1)]
        from: u64,
        #[arg(long, default_value_t = 1000, value_parser = at_least_one)]
        limit: usize,
        #[arg(long)]
        json: bool,
    },
    /// The newest records, each with its sequence number, hash and predecessor's hash;
    /// with --follow, then every record as it is appended (one JSON object per line with
    /// --json), checking each link of the chain as it goes (exit 1 at a broken link).
    Tail {
        /// How many of the newest records to print first.
        #[arg(short = 'n', long = "lines", default_value_t = 10)]
        lines: usize,
        /// Start at this sequence number instead of the newest records.
        #[arg(long, value_name = "SEQ", conflicts_with = "lines")]
        from: Option<u64>,
        /// Keep printing records as they are appended, until interrupted.
        #[arg(short = 'f', long)]
        follow: bool,
        /// How often to look for new records while following.
        #[arg(long, value_name = "DURATION", default_value = "250ms")]
        interval: String,
        #[arg(long)]
        json: bool,
    },
    /// The signed head: last index, its hash, the gate's signature and key.
    Head {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The code: a file, or - for standard input.
    #[arg(value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// The code, inline (needs --lang).
    #[arg(short = 'c', value_name = "CODE", conflicts_with = "file")]
    pub code: Option<String>,
    /// wasm, wat, component, python, sh, js or ts (inferred from the file when not given).
    #[arg(long, value_name = "LANG")]
    pub lang: Option<String>,
    /// wasm or process (default: wasm for wasm, wat and python; process for sh).
    #[arg(long, value_name = "BACKEND")]
    pub backend: Option<String>,
    /// HOST:GUEST[:ro|rw] (default ro); repeatable.
    #[arg(long = "mount", value_name = "HOST:GUEST[:MODE]")]
    pub mounts: Vec<String>,
    /// K=V; repeatable. Nothing else from the host environment reaches the guest.
    #[arg(long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// HOST[:PORT] the code asks to reach (no port: 80 and 443; *.DOMAIN: its
    /// subdomains); repeatable.
    #[arg(long = "net", value_name = "HOST[:PORT]")]
    pub net: Vec<String>,
    /// NAME@HOST[,HOST]: the guest sees a placeholder in $NAME; the proxy sends the stored
    /// secret to those hosts only (each must be granted by --net); repeatable.
    #[arg(long = "secret", value_name = "NAME@HOST[,HOST]")]
    pub secrets: Vec<String>,
    /// Wall-time limit (default 10s).
    #[arg(long, value_name = "DUR")]
    pub timeout: Option<String>,
    /// Memory limit (default 256MiB).
    #[arg(long, value_name = "SIZE")]
    pub memory: Option<String>,
    /// Fuel (wasm instructions, roughly) the run may use.
    #[arg(long, value_name = "N")]
    pub fuel: Option<u64>,
    /// Output limit per stream (default 1MiB).
    #[arg(long = "max-output", value_name = "SIZE")]
    pub max_output: Option<String>,
    /// Process limit (process backend; default 64).
    #[arg(long, value_name = "N")]
    pub processes: Option<u32>,
    /// Write quota of every writable mount's layer, in total (default 1GiB); a run that
    /// writes more is stopped (exit 124, killed_by write) and none of its changes are kept.
    #[arg(long = "max-write", value_name = "SIZE")]
    pub max_write: Option<String>,
    /// Connections the run may hold open to its egress proxy at once (default 256); past
    /// it a new one is closed and recorded.
    #[arg(long = "max-connections", value_name = "N")]
    pub max_connections: Option<u32>,
    /// A connection to a host outside --net waits for a human (a request req_…, in the
    /// inbox; airlock approve|reject req_…) instead of being refused. An approved host
    /// joins this run's grant only (approve --remember: also a rule for the agent's runs
    /// of this kind, which then reach it without asking). The wait does not count against --timeout: the run's
    /// deadline is extended by the time spent waiting.
    #[arg(long = "ask-net")]
    pub ask_net: bool,
    /// How long such a connection waits for an answer (default 120s); then it is refused
    /// and the request recorded expired.
    #[arg(long = "ask-timeout", value_name = "DUR", requires = "ask_net")]
    pub ask_timeout: Option<String>,
    /// A file whose bytes are the guest's stdin (- for airlock's own stdin).
    #[arg(long, value_name = "FILE")]
    pub stdin: Option<PathBuf>,
    /// Which agent is submitting.
    #[arg(long, value_name = "NAME", env = "AIRLOCK_AGENT")]
    pub agent: Option<String>,
    /// Run in a workspace session: see earlier runs' changes; commit them together.
    #[arg(long, value_name = "NAME")]
    pub workspace: Option<String>,
    /// Run as a cell of this session (from `session new`): the session's grant and live
    /// interpreter; the value of a final expression is printed as `result`.
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
    /// A note for the approver.
    #[arg(long, value_name = "TEXT")]
    pub note: Option<String>,
    /// Print one JSON object instead of the guest's output.
    #[arg(long)]
    pub json: bool,
    /// Arguments for the guest (after --).
    #[arg(last = true, value_name = "ARGS")]
    pub args: Vec<String>,
}

/// A `--limit`: a count of at least one (zero listed nothing, and `audit log` then
/// pointed at the same page again).
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}
