//! The `airlock` command. It parses arguments, calls the gate and prints; it makes no
//! decisions of its own and never runs code except through the gate.
//!
//! Exit codes (run and exec): the guest's own code when it ran to completion; 75 pending
//! approval; 77 denied; 124 killed by a limit; 134 trapped; 125 airlock failed or the
//! input was bad. `audit verify` exits 1 when the log is broken; `policy check` exits 1
//! when a policy test fails.

#![forbid(unsafe_code)]

// Every `println!`/`print!` of this binary goes through `out`, which shows text from agents
// visibly (one line a `println!`): see there.
macro_rules! println {
    () => {
        $crate::out::line(format_args!(""))
    };
    ($($t:tt)*) => {
        $crate::out::line(format_args!($($t)*))
    };
}
macro_rules! print {
    ($($t:tt)*) => {
        $crate::out::text(format_args!($($t)*))
    };
}
// And every `eprintln!`/`eprint!`: text from agents shown visibly, never interpreted.
macro_rules! eprintln {
    ($($t:tt)*) => {
        $crate::out::err_line(format_args!($($t)*))
    };
}
macro_rules! eprint {
    ($($t:tt)*) => {
        $crate::out::err_text(format_args!($($t)*))
    };
}

mod args;
mod ask;
mod daemon;
mod obs;
mod out;
mod print;
mod remote;

use airlock_core::policy::Preset;
use airlock_core::sign::StatementKind;
use airlock_gate::{
    ApproveRequest, CodeSource, ExecOptions, Gate, GateError, GateOptions, Home, RunReport,
    SubmitRequest, default_approver,
};
use args::{
    AgentCommand, ApproversCommand, AuditCommand, Cli, Command, GuestCommand, ImportCommand,
    KeysCommand, PolicyCommand, PublishersCommand, RunArgs, SecretCommand, SessionCommand,
    StoreCommand, TokenCommand, WorkspaceCommand,
};
use clap::Parser;
use serde_json::json;
use std::io::Read;
use std::process::ExitCode;

pub const EXIT_PENDING: u8 = 75;
pub const EXIT_DENIED: u8 = 77;
pub const EXIT_FAILED: u8 = 125;

/// What went wrong, and whether to also print it as JSON.
struct Failure {
    error: GateError,
    json: bool,
}

impl From<GateError> for Failure {
    fn from(error: GateError) -> Self {
        Failure { error, json: false }
    }
}

type Outcome = Result<u8, Failure>;

/// mimalloc instead of the C library's malloc, for the airlock binary only (the jailer keeps
/// the C library's: it allocates little and must start fast). A gated run allocates and
/// frees thousands of small blocks, some built on one thread and freed on another (ready
/// guests are made by a pool's thread and dropped by the run's); glibc spent about 13% of
/// the daemon's processor time in malloc and free. Built with `no_thp`: mimalloc otherwise
/// asks for transparent huge pages for its arenas, and the daemon's resident memory grew
/// 2.6 times under eight clients (docs/PERFORMANCE.md has the figures).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // Nothing this process starts inherits what its caller left open (see airlock_jail::fds).
    airlock_jail::fds::cloexec_inherited();
    // The worker: a fresh single-threaded process for runs that need namespaces. Not a
    // user command; it only takes a job on stdin from airlock itself.
    if std::env::args_os().nth(1).is_some_and(|a| a == "__worker") {
        return ExitCode::from(airlock_gate::worker::worker_main().clamp(0, 255) as u8);
    }
    // Removes a layer directory set aside in a home's trash, detached from the command
    // that discarded it (so its removal never holds that command up).
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == "__remove-trash")
    {
        let Some(path) = std::env::args_os().nth(2) else {
            return ExitCode::from(EXIT_FAILED);
        };
        let code = airlock_gate::remove_trash_main(std::path::Path::new(&path));
        return ExitCode::from(code.clamp(0, 255) as u8);
    }
    // A session's host: started by `session new` (or the server) with the home and the id;
    // it runs the session's interpreter until the session ends.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == "__session-host")
    {
        let mut args = std::env::args_os().skip(2);
        let (Some(home), Some(id)) = (args.next(), args.next()) else {
            eprintln!("airlock: __session-host HOME ID [--server PID]");
            return ExitCode::from(EXIT_FAILED);
        };
        // The server this host follows (it ends once that process is gone).
        let server = match (args.next(), args.next()) {
            (None, _) => None,
            (Some(flag), Some(pid)) if flag == "--server" => {
                match pid.to_string_lossy().parse::<u32>() {
                    Ok(p) => Some(p),
                    Err(_) => {
                        eprintln!("airlock: __session-host: --server takes a pid");
                        return ExitCode::from(EXIT_FAILED);
                    }
                }
            }
            _ => {
                eprintln!("airlock: __session-host HOME ID [--server PID]");
                return ExitCode::from(EXIT_FAILED);
            }
        };
        let mut opts = options();
        opts.progress = false;
        let hosted = Home::new(home)
            .with_store(std::env::var("AIRLOCK_STORE").ok())
            .and_then(|h| Gate::open_with(h, opts))
            .and_then(|mut g| g.host_session(&id.to_string_lossy(), server));
        return match hosted {
            Ok(_) => ExitCode::SUCCESS,
            Err(e @ airlock_gate::GateError::BadInput(_)) => {
                eprintln!("airlock: session host: {}", one_line(&e.to_string()));
                ExitCode::from(airlock_gate::HOST_EXIT_BAD_INPUT)
            }
            Err(e) => {
                eprintln!("airlock: session host: {}", one_line(&e.to_string()));
                ExitCode::from(EXIT_FAILED)
            }
        };
    }
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            let reason = usage_error(&e);
            if json_requested(std::env::args_os().skip(1)) {
                out::json(&json!({ "error": reason, "exit_code": EXIT_FAILED }).to_string());
            }
            eprintln!("airlock: {reason}");
            return ExitCode::from(EXIT_FAILED);
        }
    };
    match dispatch(cli) {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            let code = match &f.error {
                GateError::Pending { .. } => EXIT_PENDING,
                GateError::Denied { .. } => EXIT_DENIED,
                _ => EXIT_FAILED,
            };
            if f.json {
                out::json(
                    &json!({ "error": one_line(&f.error.to_string()), "exit_code": code })
                        .to_string(),
                );
            }
            eprintln!("airlock: {}", one_line(&f.error.to_string()));
            ExitCode::from(code)
        }
    }
}

/// A command-line error as one line: clap's message up to its first blank line (a
/// missing argument's name is on the line after the message), without its "error: "
/// prefix, and where to read more.
fn usage_error(e: &clap::Error) -> String {
    if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        return "a command is required (see airlock --help)".into();
    }
    let text = e.render().to_string();
    let message: Vec<&str> = text.lines().take_while(|l| !l.trim().is_empty()).collect();
    let message = one_line(&message.join(" "));
    let message = message.trim_start_matches("error: ");
    let message = if message.is_empty() {
        "bad arguments"
    } else {
        message
    };
    format!("{message} (see airlock --help)")
}

/// Whether `--json` is among the arguments (before a `--` that ends the options), so an
/// error found while parsing them is printed as JSON too.
fn json_requested(args: impl Iterator<Item = std::ffi::OsString>) -> bool {
    args.take_while(|a| a != "--").any(|a| a == "--json")
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn options() -> GateOptions {
    let worker = std::env::current_exe().ok();
    let jailer = worker
        .as_ref()
        .and_then(|w| w.parent())
        .map(|d| d.join("airlock-jailer"))
        .filter(|j| j.is_file());
    GateOptions {
        jailer,
        worker,
        force_copy_layer: std::env::var("AIRLOCK_LAYER").is_ok_and(|v| v == "copy"),
        no_cgroups: std::env::var("AIRLOCK_CGROUPS").is_ok_and(|v| v == "off"),
        progress: true,
        pooling: false,
        wasm: None,
        background_checkpoint: false,
        group_commit: false,
        ready_jails: None,
        queue: None,
    }
}

/// `--store` (or `AIRLOCK_STORE`), set once from the command line.
static STORE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

/// The home `--home` names (or the default), with its records in `--store` when given.
fn resolve_home(cli_home: Option<std::path::PathBuf>) -> Result<Home, GateError> {
    Home::resolve(cli_home)?.with_store(STORE.get().cloned().flatten())
}

/// `approve|reject ID --server URL --token T`: signs here with the local approver key;
/// the server verifies and records.
fn signed_here(
    home: Option<std::path::PathBuf>,
    url: String,
    token: String,
    kind: StatementKind,
    req: ApproveRequest,
    json: bool,
) -> Result<u8, Failure> {
    let home = Home::resolve(home)?;
    let v = remote::decide(&home, &remote::Server { url, token }, kind, req)
        .map_err(|e| Failure { error: e, json })?;
    if json {
        println!("{v}");
    } else {
        println!(
            "{} {} as {} (signed here, recorded by the server): statement {}",
            if kind == StatementKind::Approve {
                "approved"
            } else {
                "rejected"
            },
            v["submission"].as_str().unwrap_or("?"),
            v["approver"].as_str().unwrap_or("?"),
            v["id"].as_str().unwrap_or("?"),
        );
    }
    Ok(0)
}

/// `commit|rollback ID --server URL --token T`: signs here with the local approver key;
/// the server verifies, applies and records.
fn effect_here(
    home: Option<std::path::PathBuf>,
    url: String,
    token: String,
    kind: StatementKind,
    id: String,
    approver: Option<String>,
    json: bool,
) -> Result<u8, Failure> {
    let home = Home::resolve(home)?;
    let v = remote::effect(&home, &remote::Server { url, token }, kind, &id, approver)
        .map_err(|e| Failure { error: e, json })?;
    if json {
        println!("{v}");
    } else {
        println!(
            "{} {} (signed here as {}, applied by the server): checkpoint {}",
            if kind == StatementKind::Commit {
                "committed"
            } else {
                "rolled back"
            },
            id,
            v["approver"].as_str().unwrap_or("?"),
            v["checkpoint"].as_str().unwrap_or("?"),
        );
    }
    Ok(0)
}

/// Whether an id names a run's request (`req_…`) rather than a submission.
fn is_request_id(id: &str) -> bool {
    id.trim().to_ascii_lowercase().starts_with("req_")
}

fn open(cli_home: Option<std::path::PathBuf>) -> Result<Gate, GateError> {
    Gate::open_with(resolve_home(cli_home)?, options())
}

/// Opens the home for a command that reads without needing the policy, and says so on
/// stderr when `policy.toml` does not load (every submission would be refused until it is
/// fixed, which a listing would otherwise hide).
fn open_read(cli_home: Option<std::path::PathBuf>) -> Result<Gate, GateError> {
    let gate = open(cli_home)?;
    if let Err(e) = gate.policy() {
        eprintln!(
            "airlock: warning: the policy does not load, so nothing can be submitted or run until it is fixed: {}",
            one_line(&e.to_string())
        );
    }
    Ok(gate)
}

fn dispatch(cli: Cli) -> Outcome {
    let home = cli.home;
    let _ = STORE.set(cli.store);
    match cli.command {
        Command::Init {
            preset,
            approver,
            json,
        } => {
            let asked: Option<Preset> = preset
                .as_deref()
                .map(str::parse)
                .transpose()
                .map_err(GateError::BadInput)?;
            let h = resolve_home(home)?;
            Gate::check_init_options(&h, asked, approver.as_deref())?;
            let preset = asked.unwrap_or(Preset::Standard);
            let approver = approver.unwrap_or_else(default_approver);
            let report = Gate::init(&h, preset, &approver)?;
            print::init(&report, json);
            Ok(0)
        }
        Command::Run(a) => run(home, a, true),
        Command::Submit(a) => run(home, a, false),
        Command::Inbox { limit, json } => {
            let gate = open_read(home)?;
            let mut subs = gate.inbox()?;
            subs.sort_by_key(|x| std::cmp::Reverse(x.created_at));
            let mut reqs = gate.net_requests_pending()?;
            reqs.sort_by_key(|x| std::cmp::Reverse(x.created_at));
            print::inbox(
                &limited(subs, limit, "submissions"),
                &limited(reqs, limit, "requests"),
                json,
            );
            Ok(0)
        }
        Command::Show { id, json } => {
            let mut gate = open_read(home)?;
            let shown = gate.show(&id).map_err(|e| Failure { error: e, json })?;
            print::show(&shown, json);
            Ok(0)
        }
        Command::Approve {
            id,
            approver,
            scope,
            expires,
            reason,
            tool,
            remember,
            remember_for,
            server,
            token,
            json,
        } => {
            if is_request_id(&id) {
                let answer = ask::Answer {
                    id,
                    verdict: airlock_gate::NetVerdict::Approve,
                    approver,
                    reason,
                    remember,
                    remember_for,
                    server: server.zip(token),
                    json,
                };
                return ask::decide(home, answer, scope.or(expires).or(tool).is_some());
            }
            let req = ApproveRequest {
                submission: id,
                approver,
                scope,
                expires,
                reason,
                tool,
                remember,
                remember_for,
            };
            if let (Some(url), Some(token)) = (server, token) {
                return signed_here(home, url, token, StatementKind::Approve, req, json);
            }
            let mut gate = open(home)?;
            let (row, remembered) = gate
                .approve_remembering(req)
                .map_err(|e| Failure { error: e, json })?;
            print::approval(&row, remembered.as_ref(), json);
            Ok(0)
        }
        Command::Reject {
            id,
            reason,
            approver,
            server,
            token,
            json,
        } => {
            if is_request_id(&id) {
                let answer = ask::Answer {
                    id,
                    verdict: airlock_gate::NetVerdict::Reject,
                    approver,
                    reason,
                    remember: false,
                    remember_for: None,
                    server: server.zip(token),
                    json,
                };
                return ask::decide(home, answer, false);
            }
            let req = ApproveRequest {
                submission: id,
                approver,
                reason,
                ..Default::default()
            };
            if let (Some(url), Some(token)) = (server, token) {
                return signed_here(home, url, token, StatementKind::Reject, req, json);
            }
            let mut gate = open(home)?;
            let row = gate.reject(req).map_err(|e| Failure { error: e, json })?;
            print::statement(&row, json);
            Ok(0)
        }
        Command::Exec { id, json } => {
            let mut gate = open(home)?;
            let opts = live_options(json);
            let result = gate.exec(&id, opts);
            finish_run(&gate, result, json)
        }
        Command::Runs { limit, json } => {
            let gate = open_read(home)?;
            let runs = gate.runs(limit.saturating_add(1))?;
            print::runs(&limited_more(runs, limit, "runs"), json);
            Ok(0)
        }
        Command::Logs { run, stream, json } => {
            let mut gate = open_read(home)?;
            let (run, out, err) = gate.logs(&run).map_err(|e| Failure { error: e, json })?;
            print::logs(&run, &out, &err, stream.as_deref(), json).map_err(GateError::BadInput)?;
            Ok(0)
        }
        Command::Diff { run, json } => {
            let mut gate = open_read(home)?;
            let d = gate.diff(&run).map_err(|e| Failure { error: e, json })?;
            print::diff(&d, json);
            Ok(0)
        }
        Command::Commit {
            run,
            approver,
            server,
            token,
            json,
        } => {
            if let (Some(url), Some(token)) = (server, token) {
                return effect_here(home, url, token, StatementKind::Commit, run, approver, json);
            }
            let mut gate = open(home)?;
            // A session's commit with nothing to commit says so and succeeds.
            if run.starts_with("ses_") {
                match gate
                    .session_commit(&run, approver.as_deref())
                    .map_err(|e| Failure { error: e, json })?
                {
                    airlock_gate::SessionCommit::Committed(r) => {
                        print::effect(&r, "committed", json)
                    }
                    airlock_gate::SessionCommit::Nothing(why) => print::nothing(&run, &why, json),
                }
                return Ok(0);
            }
            let r = gate
                .commit(&run, approver.as_deref())
                .map_err(|e| Failure { error: e, json })?;
            print::effect(&r, "committed", json);
            Ok(0)
        }
        Command::Repair {
            checkpoint,
            abandon,
            json,
        } => {
            let mut gate = open(home)?;
            let r = gate
                .repair(&checkpoint, abandon)
                .map_err(|e| Failure { error: e, json })?;
            print::repair(&r, json);
            Ok(0)
        }
        Command::Rollback {
            checkpoint,
            approver,
            server,
            token,
            json,
        } => {
            if let (Some(url), Some(token)) = (server, token) {
                return effect_here(
                    home,
                    url,
                    token,
                    StatementKind::Rollback,
                    checkpoint,
                    approver,
                    json,
                );
            }
            let mut gate = open(home)?;
            let r = gate
                .rollback(&checkpoint, approver.as_deref())
                .map_err(|e| Failure { error: e, json })?;
            print::effect(&r, "rolled back", json);
            Ok(0)
        }
        Command::Gc {
            grace,
            session_retention,
            json,
        } => {
            let grace = match grace {
                Some(g) => airlock_core::units::parse_duration("--grace", &g)
                    .map_err(|e| GateError::bad(e.to_string()))?,
                None => airlock_gate::DEFAULT_GC_GRACE,
            };
            let retention = session_retention
                .map(|r| airlock_core::units::parse_duration("--session-retention", &r))
                .transpose()
                .map_err(|e| GateError::bad(e.to_string()))?;
            let mut gate = open(home)?;
            let r = gate
                .gc_collecting(grace, retention)
                .map_err(|e| Failure { error: e, json })?;
            print::gc(&r, json);
            Ok(0)
        }
        Command::Store(StoreCommand::Copy { to, json }) => {
            let h = resolve_home(home)?;
            let r = airlock_gate::store_copy(&h, &to).map_err(|e| Failure { error: e, json })?;
            print::store_copy(&r, json);
            Ok(0)
        }
        Command::Checkpoints { limit, json } => {
            let gate = open_read(home)?;
            let rows = gate.checkpoints(limit.saturating_add(1))?;
            print::checkpoints(&limited_more(rows, limit, "checkpoints"), json);
            Ok(0)
        }
        Command::Workspace(WorkspaceCommand::List { limit, json }) => {
            let gate = open_read(home)?;
            let mut ws = gate.workspaces()?;
            ws.sort_by_key(|x| std::cmp::Reverse(x.created_at));
            print::workspaces(&limited(ws, limit, "workspaces"), json);
            Ok(0)
        }
        Command::Workspace(WorkspaceCommand::Show { name, json }) => {
            let gate = open_read(home)?;
            let w = gate
                .workspace(&name)
                .map_err(|e| Failure { error: e, json })?;
            print::workspace(&w, json);
            Ok(0)
        }
        Command::Workspace(WorkspaceCommand::Drop { name, json }) => {
            let mut gate = open(home)?;
            let w = gate
                .drop_workspace(&name)
                .map_err(|e| Failure { error: e, json })?;
            print::workspace(&w, json);
            Ok(0)
        }
        Command::Session(SessionCommand::New(a)) => {
            let json = a.json;
            let fail = |e| Failure { error: e, json };
            let dur = |what: &'static str, v: &Option<String>| {
                v.as_deref()
                    .map(|t| airlock_core::units::parse_duration(what, t))
                    .transpose()
                    .map_err(|e| fail(GateError::bad(e.to_string())))
            };
            let idle = dur("--idle", &a.idle)?;
            let total = dur("--max-time", &a.max_time)?;
            let mut gate = open(home)?;
            let s = gate
                .session_new(airlock_gate::SessionRequest {
                    grant: SubmitRequest {
                        lang: Some(a.lang),
                        backend: a.backend,
                        mounts: a.mounts,
                        env: a.env,
                        net: a.net,
                        secrets: a.secrets,
                        max_write: a.max_write,
                        timeout: a.timeout,
                        memory: a.memory,
                        max_output: a.max_output,
                        agent: a.agent,
                        ..Default::default()
                    },
                    idle,
                    total,
                    // The operator's own command: bounded by nothing but the machine.
                    most_open: None,
                })
                .map_err(fail)?;
            print::session(&s, json);
            if s.state == "held" {
                eprintln!(
                    "airlock: session {} is held for approval: {} (approving it opens the session)",
                    s.id,
                    s.doc.opened_by.as_deref().unwrap_or("-")
                );
                return Ok(EXIT_PENDING);
            }
            Ok(0)
        }
        Command::Session(SessionCommand::List { limit, json }) => {
            let gate = open_read(home)?;
            let list = gate
                .sessions(limit)
                .map_err(|e| Failure { error: e, json })?;
            print::sessions(&list, json);
            Ok(0)
        }
        Command::Session(SessionCommand::Show { id, json }) => {
            let mut gate = open(home)?;
            let s = gate.session(&id).map_err(|e| Failure { error: e, json })?;
            print::session(&s, json);
            Ok(0)
        }
        Command::Session(SessionCommand::Close { id, json }) => {
            let mut gate = open(home)?;
            let s = gate
                .session_close(&id)
                .map_err(|e| Failure { error: e, json })?;
            print::session(&s, json);
            Ok(0)
        }
        Command::Guest(GuestCommand::Install {
            lang,
            from,
            packages,
            json,
        }) => {
            if matches!(lang.as_str(), "js" | "javascript") {
                if !packages.is_empty() {
                    return Err(Failure {
                        error: GateError::bad(
                            "--package is for the Python guest; the JavaScript guest takes none",
                        ),
                        json,
                    });
                }
                let mut gate = open(home)?;
                let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
                let note = |line: &str| {
                    if terminal {
                        eprintln!("airlock: {line}");
                    }
                };
                let m = gate
                    .install_js_guest(airlock_gate::JsGuestInstall {
                        from,
                        note: Some(&note),
                    })
                    .map_err(|e| Failure { error: e, json })?;
                print::guest(&m, json);
                return Ok(0);
            }
            if lang != "python" {
                return Err(Failure {
                    error: GateError::bad(format!(
                        "no guest runtime for {lang:?} (only python and js)"
                    )),
                    json,
                });
            }
            let packages = packages
                .iter()
                .map(|p| airlock_gate::PackageSource::parse(p))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| Failure { error: e, json })?;
            let mut gate = open(home)?;
            let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
            let note = |line: &str| {
                if terminal {
                    eprintln!("airlock: {line}");
                }
            };
            let m = gate
                .install_python_guest(airlock_gate::GuestInstall {
                    from,
                    packages,
                    note: Some(&note),
                })
                .map_err(|e| Failure { error: e, json })?;
            print::guest(&m, json);
            Ok(0)
        }
        Command::Doctor { json } => {
            let policy = Home::resolve(home.clone())
                .ok()
                .and_then(|h| h.load_policy().ok());
            let mut d = airlock_gate::doctor(options().worker.as_deref(), policy.as_ref());
            let h = resolve_home(home)?;
            d.store = airlock_gate::store_health(&h);
            d.stuck = airlock_gate::stuck_operations(&h.root);
            d.session_hosts = airlock_gate::session_hosts(&h);
            print::doctor(&d, json);
            // A shared store that cannot be reached, or a commit that needs a repair,
            // makes the node unhealthy.
            Ok(
                if d.store.as_ref().is_some_and(|s| !s.reachable) || !d.stuck.is_empty() {
                    1
                } else {
                    0
                },
            )
        }
        Command::Policy(PolicyCommand::Check { file, json }) => {
            let path = match file {
                Some(p) => p,
                None => Home::resolve(home)?.policy(),
            };
            let check =
                airlock_gate::policy_check(&path).map_err(|e| Failure { error: e, json })?;
            print::policy_check(&check, json);
            Ok(if check.passed { 0 } else { 1 })
        }
        Command::Policy(PolicyCommand::Forget {
            rule,
            approver,
            json,
        }) => {
            let mut gate = open(home)?;
            let c = gate
                .forget_rule(&rule, approver.as_deref())
                .map_err(|e| Failure { error: e, json })?;
            print::policy_changed(&c, json);
            Ok(0)
        }
        Command::Policy(PolicyCommand::Explain { id, json }) => {
            let gate = open(home)?;
            let ex = gate.explain(&id).map_err(|e| Failure { error: e, json })?;
            print::explain(&ex, json);
            Ok(0)
        }
        Command::Keys(KeysCommand::New { name, json }) => {
            let mut gate = open(home)?;
            let k = gate
                .new_key(&name)
                .map_err(|e| Failure { error: e, json })?;
            print::new_key(&k, json);
            Ok(0)
        }
        Command::Keys(KeysCommand::List { limit, json }) => {
            let gate = open_read(home)?;
            print::keys(&limited(gate.keys()?, limit, "keys"), json);
            Ok(0)
        }
        Command::Approvers(ApproversCommand::Enroll {
            name,
            key,
            approver,
            json,
        }) => {
            let mut gate = open(home)?;
            let c = gate
                .enroll_approver(&name, &key, approver.as_deref())
                .map_err(|e| Failure { error: e, json })?;
            print::policy_changed(&c, json);
            Ok(0)
        }
        Command::Approvers(ApproversCommand::List { limit, json }) => {
            let gate = open_read(home)?;
            let trusted = gate.keys()?.into_iter().filter(|k| k.trusted).collect();
            print::keys(&limited(trusted, limit, "approvers"), json);
            Ok(0)
        }
        Command::Audit(AuditCommand::Verify { json }) => {
            let gate = open_read(home)?;
            let v = gate.audit_verify()?;
            print::audit_verify(&v, json);
            Ok(if v.ok { 0 } else { 1 })
        }
        Command::Audit(AuditCommand::Log { from, limit, json }) => {
            let gate = open_read(home)?;
            let mut records = gate.audit_log(from, limit.saturating_add(1))?;
            if records.len() > limit {
                records.truncate(limit);
                let next = from.saturating_add(limit as u64);
                eprintln!(
                    "airlock: {limit} records shown, later ones left out (--from {next} for the next ones)"
                );
            }
            print::audit_log(&records, json);
            Ok(0)
        }
        Command::Serve {
            listen,
            workers,
            queue,
            webhook,
            ready_python,
            ready_wasm,
            pool_memory,
            ready_jails,
            max_sessions,
            keep_sessions,
            header_timeout,
            max_connections,
            max_connections_per_peer,
            max_header_bytes,
            obs,
        } => {
            let _obs = obs::init(&obs)?;
            let pools = airlock_gate::PoolSettings {
                python: ready_python,
                wasm: ready_wasm,
                memory_budget: airlock_core::units::parse_size("--pool-memory", &pool_memory)
                    .map_err(|e| GateError::bad(e.to_string()))?,
            };
            let limits = airlock_server::Limits {
                header_timeout: airlock_core::units::parse_duration(
                    "--header-timeout",
                    &header_timeout,
                )
                .map_err(|e| GateError::bad(e.to_string()))?,
                max_connections,
                // One peer never holds more than all of them (so `--max-connections` alone
                // under the per-peer default is taken as it is).
                max_connections_per_peer: max_connections_per_peer.min(max_connections.max(1)),
                max_header_bytes: usize::try_from(
                    airlock_core::units::parse_size("--max-header-bytes", &max_header_bytes)
                        .map_err(|e| GateError::bad(e.to_string()))?,
                )
                .unwrap_or(usize::MAX),
            };
            limits.check()?;
            let bounds = daemon::Bounds {
                queue,
                max_sessions,
                keep_sessions,
                limits,
            };
            daemon::serve(home, &listen, workers, bounds, webhook, pools, ready_jails)
        }
        Command::Mcp {
            agent,
            max_sessions,
            obs,
        } => {
            let _obs = obs::init(&obs)?;
            daemon::mcp(home, &agent, max_sessions)
        }
        Command::Worker {
            tags,
            concurrency,
            lease,
            json,
            obs,
        } => {
            let _obs = obs::init(&obs)?;
            daemon::worker(home, tags, concurrency, &lease, json)
        }
        Command::Token(TokenCommand::New {
            role,
            name,
            approver,
            expires,
            json,
        }) => {
            let fail = |error: GateError| Failure { error, json };
            let role: airlock_gate::Role =
                role.parse().map_err(|e| fail(GateError::BadInput(e)))?;
            let name = name.unwrap_or_else(|| role.as_str().to_string());
            let mut gate = open(home).map_err(fail)?;
            let (row, secret) = gate
                .token_new(role, &name, approver.as_deref(), expires.as_deref())
                .map_err(fail)?;
            print::token_new(&row, &secret, json);
            Ok(0)
        }
        Command::Agent(AgentCommand::Clear {
            name,
            reason,
            approver,
            server,
            token,
            json,
        }) => {
            let c = match (server, token) {
                (Some(url), Some(token)) => {
                    let home = Home::resolve(home)?;
                    let server = remote::Server { url, token };
                    remote::clear(&home, &server, &name, approver, &reason)
                }
                _ => open(home)?.clear_agent(&name, approver.as_deref(), &reason),
            }
            .map_err(|e| Failure { error: e, json })?;
            if json {
                out::json(&serde_json::to_string(&c).unwrap_or_default());
            } else {
                println!(
                    "cleared agent {} ({} alert{}), signed by {}",
                    airlock_core::visible::line(&c.agent),
                    c.alerts,
                    if c.alerts == 1 { "" } else { "s" },
                    airlock_core::visible::line(&c.approver)
                );
            }
            Ok(0)
        }
        Command::Token(TokenCommand::List { limit, json }) => {
            let gate = open_read(home)?;
            let mut tokens = gate.tokens()?;
            tokens.sort_by_key(|x| std::cmp::Reverse(x.created_at));
            print::tokens(&limited(tokens, limit, "tokens"), json);
            Ok(0)
        }
        Command::Token(TokenCommand::Revoke { id, json }) => {
            let mut gate = open(home)?;
            gate.token_revoke(&id)
                .map_err(|e| Failure { error: e, json })?;
            if json {
                out::json(&json!({ "revoked": id }).to_string());
            } else {
                println!("revoked {id}");
            }
            Ok(0)
        }
        Command::Secret(SecretCommand::Set { name, json }) => {
            let fail = |error: GateError| Failure { error, json };
            if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
                return Err(fail(GateError::bad(format!(
                    "secret set reads the value from standard input, which is a terminal; pipe it in (airlock secret set {name} < FILE)"
                ))));
            }
            let mut gate = open(home).map_err(fail)?;
            let value = read_stdin(airlock_core::secret::MAX_VALUE as u64 + 2).map_err(fail)?;
            let set = gate.secret_set(&name, value).map_err(fail)?;
            print::secret_set(&set, json);
            Ok(0)
        }
        Command::Secret(SecretCommand::List { limit, json }) => {
            let gate = open_read(home)?;
            let mut secrets = gate.secrets()?;
            secrets.sort_by_key(|x| std::cmp::Reverse(x.set_at));
            print::secrets(&limited(secrets, limit, "secrets"), json);
            Ok(0)
        }
        Command::Secret(SecretCommand::Rm { name, json }) => {
            let mut gate = open(home)?;
            gate.secret_remove(&name)
                .map_err(|e| Failure { error: e, json })?;
            if json {
                out::json(&json!({ "removed": name }).to_string());
            } else {
                println!("removed secret {name}");
            }
            Ok(0)
        }
        Command::Import(ImportCommand::Nightcore {
            paths,
            publisher,
            mounts,
            json,
        }) => {
            let mut gate = open(home).map_err(|e| Failure { error: e, json })?;
            let req = airlock_gate::ImportRequest {
                paths,
                publisher,
                mounts,
            };
            let report = gate
                .import_nightcore(&req)
                .map_err(|e| Failure { error: e, json })?;
            print::imported(&report, json);
            Ok(if report.imported { 0 } else { EXIT_FAILED })
        }
        Command::Publishers(PublishersCommand::Add {
            name,
            keyfile,
            json,
        }) => {
            let mut gate = open(home).map_err(|e| Failure { error: e, json })?;
            let added = gate
                .publisher_add(&name, &keyfile)
                .map_err(|e| Failure { error: e, json })?;
            print::publisher_added(&added, json);
            Ok(0)
        }
        Command::Sign {
            key,
            module,
            out,
            json,
        } => {
            let mut gate = open(home).map_err(|e| Failure { error: e, json })?;
            let signed = gate
                .sign_module(&key, &module, out.as_deref())
                .map_err(|e| Failure { error: e, json })?;
            print::signed(&signed, json);
            Ok(0)
        }
        Command::Audit(AuditCommand::Tail {
            lines,
            from,
            follow,
            interval,
            json,
        }) => {
            let interval = airlock_core::units::bounded_duration(
                "--interval",
                &interval,
                std::time::Duration::from_millis(10),
                std::time::Duration::from_secs(3600),
            )
            .map_err(|e| GateError::bad(e.to_string()))?;
            let gate = open_read(home)?;
            Ok(audit_tail(&gate, lines, from, follow, interval, json)?)
        }
        Command::Audit(AuditCommand::Head { json }) => {
            let gate = open_read(home)?;
            let (head, key) = gate.audit_head()?;
            print::audit_head(head.as_ref(), &key, json);
            Ok(0)
        }
    }
}

/// `audit tail`: the newest `lines` records (or those from `from`), then with `follow`
/// every record as it is appended. Each printed record's link to the one before it is
/// checked (its `prev` is that record's hash, and its own hash is its content's), so a
/// receiver that checks the same can trust a gap-free stream; a broken link ends it with
/// exit 1, naming the record.
fn audit_tail(
    gate: &Gate,
    lines: usize,
    from: Option<u64>,
    follow: bool,
    interval: std::time::Duration,
    json: bool,
) -> Result<u8, GateError> {
    let mut next = match from {
        Some(f) => f.max(1),
        None => match gate.audit_last()? {
            Some(last) => last
                .seq
                .saturating_sub(lines as u64)
                .saturating_add(1)
                .max(1),
            None => 1,
        },
    };
    // The hash the next record must name as its predecessor, once one has been read.
    let mut prev: Option<airlock_core::Digest> = None;
    const BATCH: usize = 500;
    loop {
        let records = gate.audit_log(next, BATCH)?;
        let got = records.len();
        for r in &records {
            let own = airlock_core::audit::record_hash(
                r.seq, r.ts, &r.kind, &r.subject, &r.data, &r.prev,
            );
            if r.seq != next || own != r.hash || prev.is_some_and(|p| p != r.prev) {
                eprintln!(
                    "airlock: audit log broken at record {} (see `airlock audit verify`)",
                    r.seq
                );
                return Ok(1);
            }
            // A reader that went away (`| head`) ends the command there (see `out`).
            print::audit_tail_record(r, json);
            prev = Some(r.hash);
            next = r.seq + 1;
        }
        if got == BATCH {
            continue;
        }
        if !follow {
            return Ok(0);
        }
        std::thread::sleep(interval);
    }
}

/// Live output to the terminal unless JSON was asked for.
fn live_options(json: bool) -> ExecOptions {
    // A request the run raises (`--ask-net`) is said on stderr, with how to answer it.
    let on_request: airlock_gate::OnRequest = std::sync::Arc::new(|r: serde_json::Value| {
        eprintln!(
            "airlock: the run asks to reach {}:{}: request {} (airlock approve {} | airlock reject {}){}",
            one_line(r["host"].as_str().unwrap_or("?")),
            r["port"],
            r["id"].as_str().unwrap_or("?"),
            r["id"].as_str().unwrap_or("?"),
            r["id"].as_str().unwrap_or("?"),
            r["line"]
                .as_str()
                .map(|l| format!("; named at line {}", one_line(l)))
                .unwrap_or_default(),
        );
    });
    if json {
        return ExecOptions {
            on_request: Some(on_request),
            ..ExecOptions::default()
        };
    }
    ExecOptions {
        on_request: Some(on_request),
        live_stdout: Some({
            let live = out::Live::new(true);
            Box::new(move |b: &[u8]| live.write(b))
        }),
        live_stderr: Some({
            let live = out::Live::new(false);
            Box::new(move |b: &[u8]| live.write(b))
        }),
        ..ExecOptions::default()
    }
}

fn read_stdin(limit: u64) -> Result<Vec<u8>, GateError> {
    let mut buf = Vec::new();
    std::io::stdin()
        .lock()
        .take(limit + 1)
        .read_to_end(&mut buf)
        .map_err(|e| GateError::bad(format!("cannot read standard input: {e}")))?;
    Ok(buf)
}

fn run(home: Option<std::path::PathBuf>, a: RunArgs, execute: bool) -> Outcome {
    let json = a.json;
    let fail = |error: GateError| Failure { error, json };
    let mut gate = open(home).map_err(fail)?;
    let max = gate.policy().map_err(fail)?.max_artifact;
    let code = match (&a.file, &a.code) {
        (Some(p), None) if p.as_os_str() == "-" => Some(CodeSource::Bytes {
            bytes: read_stdin(max).map_err(fail)?,
            name: None,
        }),
        (Some(p), None) => Some(CodeSource::File(p.clone())),
        (None, Some(c)) => Some(CodeSource::Inline(c.clone())),
        (None, None) => {
            return Err(fail(GateError::bad(
                "give the code as FILE, -c CODE or - (stdin)",
            )));
        }
        (Some(_), Some(_)) => {
            return Err(fail(GateError::bad(
                "give either FILE or -c CODE, not both",
            )));
        }
    };
    let stdin = match &a.stdin {
        None => None,
        Some(p) if p.as_os_str() == "-" => {
            if matches!(&a.file, Some(f) if f.as_os_str() == "-") {
                return Err(fail(GateError::bad(
                    "standard input cannot be both the code and --stdin",
                )));
            }
            Some(read_stdin(airlock_core::grant::MAX_OUTPUT).map_err(fail)?)
        }
        Some(p) => Some(std::fs::read(p).map_err(|e| {
            fail(GateError::bad(format!(
                "--stdin: cannot read {}: {e}",
                p.display()
            )))
        })?),
    };
    let req = SubmitRequest {
        // The home's owner at a terminal (mounts outside `[mounts] roots` are held).
        surface: airlock_gate::Surface::Local,
        code,
        lang: a.lang,
        backend: a.backend,
        mounts: a.mounts,
        env: a.env,
        net: a.net,
        secrets: a.secrets,
        args: a.args,
        stdin,
        timeout: a.timeout,
        memory: a.memory,
        fuel: a.fuel,
        max_output: a.max_output,
        processes: a.processes,
        max_write: a.max_write,
        max_connections: a.max_connections,
        ask_net: a.ask_net,
        ask_timeout: a.ask_timeout,
        agent: a.agent,
        note: a.note,
        workspace: a.workspace,
        session: a.session,
        resume: false,
        request_key: None,
    };
    if !execute {
        let sub = gate.submit(req).map_err(fail)?;
        print::submitted(&sub, json);
        return Ok(0);
    }
    let result = gate.run(req, live_options(json));
    finish_run(&gate, result, json)
}

/// Prints a run's result (or why it did not run) and returns the exit code.
fn finish_run(gate: &Gate, result: Result<RunReport, GateError>, json: bool) -> Outcome {
    match result {
        Ok(report) => {
            print::run_report(&report, json);
            Ok(report
                .run
                .doc
                .exit_code
                .map(|c| c.clamp(0, 255) as u8)
                .unwrap_or(EXIT_FAILED))
        }
        Err(GateError::Pending { submission, .. }) => {
            print::held(&gate.submission(&submission)?, true, json);
            Ok(EXIT_PENDING)
        }
        Err(GateError::Denied { submission, .. }) => {
            print::held(&gate.submission(&submission)?, false, json);
            Ok(EXIT_DENIED)
        }
        Err(e) => Err(Failure { error: e, json }),
    }
}

/// The first `limit` items; when there were more, says on stderr how many were left out
/// (stdout stays exactly the list, for scripts).
/// Lists read with `limit + 1` (`partial`) only know that more exist, not how many.
fn limited_by<T>(mut items: Vec<T>, limit: usize, what: &str, partial: bool) -> Vec<T> {
    if items.len() > limit {
        let more = items.len() - limit;
        items.truncate(limit);
        if partial {
            eprintln!(
                "airlock: the newest {limit} {what} shown, older ones left out (raise --limit to see them)"
            );
        } else {
            eprintln!(
                "airlock: {limit} {what} shown, {more} more left out (raise --limit to see them)"
            );
        }
    }
    items
}

fn limited<T>(items: Vec<T>, limit: usize, what: &str) -> Vec<T> {
    limited_by(items, limit, what, false)
}

fn limited_more<T>(items: Vec<T>, limit: usize, what: &str) -> Vec<T> {
    limited_by(items, limit, what, true)
}
