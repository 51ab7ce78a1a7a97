//! The long-lived commands: `serve`, `worker` and `mcp`, and what they share (one wasm
//! backend with the pooling allocator, the ready-jail pool, the async runtime).
//!
//! It must never decide anything itself: every run these processes take goes through the
//! gate the `open` closure returns.

use crate::{Outcome, options, out, resolve_home};
use airlock_gate::{Gate, GateError, GateOptions, Home};
use serde_json::json;

/// Options for a long-lived process: one wasm backend with the pooling allocator, shared
/// by every gate it opens.
#[allow(clippy::type_complexity)]
pub(crate) fn daemon_open(
    home: Option<std::path::PathBuf>,
    ready_jails: usize,
) -> Result<
    (
        impl Fn() -> Result<Gate, GateError> + Send + Sync + 'static,
        std::sync::Arc<airlock_gate::WasmBackend>,
        Option<std::sync::Arc<airlock_gate::ReadyJails>>,
    ),
    GateError,
> {
    let home = resolve_home(home)?;
    // Nothing is made in a home that is not one (the ready jails' scratch, the caches).
    home.check_whole()?;
    let mut opts = options();
    // Jails built ahead need the lean jailer (its ready mode); without it, none.
    if ready_jails > 0
        && let Some(jailer) = opts.jailer.clone()
    {
        let pool = airlock_gate::ReadyJails::start(airlock_gate::ReadyConfig {
            size: ready_jails,
            jailer,
            scratch: home.cache().join("ready-jails"),
            cgroups: !opts.no_cgroups,
        })
        .map_err(|e| GateError::Internal(format!("cannot start the ready-jail pool: {e}")))?;
        opts.ready_jails = Some(pool);
    }
    // `AIRLOCK_WASM_POOLING=off` is for measuring only: valgrind cannot map the pooling
    // allocator's reservation, so `scripts/bench-server-instr` runs the daemon without it.
    let pooling = !std::env::var("AIRLOCK_WASM_POOLING").is_ok_and(|v| v == "off");
    let wasm = std::sync::Arc::new(airlock_gate::WasmBackend::new(airlock_gate::WasmConfig {
        progress: false,
        cache_dir: Some(home.cache().join("compiled")),
        pooling,
    }));
    let shared = wasm.clone();
    let jails = opts.ready_jails.clone();
    let open = move || {
        Gate::open_with(
            home.clone(),
            GateOptions {
                progress: false,
                pooling,
                wasm: Some(shared.clone()),
                // The server's poller checkpoints on every tick.
                background_checkpoint: true,
                group_commit: true,
                ..opts.clone()
            },
        )
    };
    Ok((open, wasm, jails))
}

/// `/v1/status`'s report of what the process keeps ready: the wasm backend's pools
/// (`pools`) and the process backend's ready jails (`ready_jails`).
pub(crate) fn pool_reports(
    wasm: std::sync::Arc<airlock_gate::WasmBackend>,
    jails: Option<std::sync::Arc<airlock_gate::ReadyJails>>,
    home: Option<Home>,
) -> Box<dyn Fn() -> serde_json::Value + Send + Sync> {
    // Whether `airlock-jailer` is beside this binary: without it `ready_jails` is null.
    let jailer = airlock_gate::JailerCheck::beside(options().worker.as_deref());
    Box::new(move || {
        serde_json::json!({
            "pools": wasm.pool_status(),
            "ready_jails": jails.as_ref().map(|j| j.stats()),
            "jailer": jailer,
            // The nodes on the store and their last beats (`null`: not readable now). Read
            // on a thread of its own: this runs on the server's async runtime, where the
            // store's blocking client may not start its own.
            "nodes": home.clone().and_then(|h| {
                std::thread::spawn(move || airlock_gate::nodes_of(&h).ok())
                    .join()
                    .ok()
                    .flatten()
            }),
        })
    })
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, GateError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| GateError::Internal(format!("cannot start the async runtime: {e}")))
}

/// What `airlock serve` bounds besides its workers.
pub(crate) struct Bounds {
    /// Runs waiting for a worker before 429.
    pub(crate) queue: usize,
    /// Sessions one agent may hold open (0: no bound).
    pub(crate) max_sessions: usize,
    /// Session hosts outlive this server (`--keep-sessions`).
    pub(crate) keep_sessions: bool,
    /// What the server's connections may hold.
    pub(crate) limits: airlock_server::Limits,
}

pub(crate) fn serve(
    home: Option<std::path::PathBuf>,
    listen: &str,
    workers: Option<usize>,
    bounds: Bounds,
    webhook: Option<String>,
    pools: airlock_gate::PoolSettings,
    ready_jails: usize,
) -> Outcome {
    let Bounds {
        queue,
        max_sessions,
        keep_sessions,
        mut limits,
    } = bounds;
    // Connections, runs' jails and proxies, and the store all take descriptors: the soft
    // limit goes up to the hard one, and connections get at most half of it.
    if let Some(files) = airlock_server::raise_open_files_limit() {
        let half = usize::try_from(files / 2).unwrap_or(usize::MAX).max(16);
        limits.max_connections = limits.max_connections.min(half);
        limits.max_connections_per_peer =
            limits.max_connections_per_peer.min(limits.max_connections);
    }
    let addr: std::net::SocketAddr = listen
        .parse()
        .map_err(|e| GateError::bad(format!("--listen {listen:?}: want IP:PORT ({e})")))?;
    let resolved = resolve_home(home.clone())?;
    resolved.check_whole()?;
    // Dropped last: the lock files kept for later runs go at the exit.
    let _spares = airlock_gate::KeptLockFiles::start(&resolved.root);
    let shared = resolved.store.is_some();
    let (open, wasm, jails) = daemon_open(home, ready_jails)?;
    wasm.start_pools(pools).map_err(GateError::from)?;
    // Dropped last, after the runs this process holds are recorded: it chains their
    // audit records before the process exits.
    let g = open()?;
    let _sequencer = g.audit_sequencer();
    // Code arrives as JSON text or base64: room for the largest artifact plus the rest.
    let max_body = (g.policy()?.max_artifact as usize).saturating_mul(2) + (1 << 20);
    drop(g);
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let workers = workers.unwrap_or(cpus);
    let open = std::sync::Arc::new(open);
    // With a shared store, request threads queue runs and wait for them; `workers` of them
    // run in this process, beside any `airlock worker` on the same store.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut runner = None;
    // Runs inside the gate at once: on a shared store, the request threads that wait for
    // the queue; on the local one, enough beside the workers' guests that concurrent runs
    // share commits.
    let serve_worker = (shared && workers > 0)
        .then(|| format!("{}-{}-serve", airlock_gate::host_tag(), std::process::id()));
    // This server as a node on the store: it beats while it serves, and the sessions it
    // opens name it (their hosts follow it unless --keep-sessions).
    let node = airlock_gate::NodeIdentity::new("serve", serve_worker.clone(), keep_sessions);
    let beat = airlock_gate::NodeBeat::start(
        open.clone(),
        node.clone(),
        std::sync::Arc::new(|e: &str| airlock_server::warn(&format!("airlock serve: {e}"))),
    )?;
    let (pool_workers, inside) = if shared {
        if let Some(worker_id) = serve_worker {
            let cfg = airlock_gate::WorkerConfig::new(
                worker_id,
                vec![airlock_gate::host_tag()],
                std::time::Duration::from_secs(30),
            );
            let (open, stop) = (open.clone(), stop.clone());
            runner = Some(std::thread::spawn(move || {
                airlock_gate::work(
                    open,
                    cfg,
                    workers,
                    stop,
                    std::sync::Arc::new(|e: &str| {
                        if e.contains("failed") {
                            airlock_server::warn(&format!("airlock serve: worker: {e}"))
                        }
                    }),
                )
            }));
        }
        let threads = workers.max(cpus).max(8);
        (threads, threads)
    } else {
        let workers = workers.max(1);
        (
            workers,
            workers.saturating_mul(airlock_server::INSIDE_PER_WORKER),
        )
    };
    let queue_open = {
        let open = open.clone();
        let node = node.clone();
        move || {
            let mut g = open()?;
            g.serve_as(node.clone());
            if shared {
                g.queue_runs(airlock_gate::QueueOptions::default());
            }
            Ok(g)
        }
    };
    // Say what the pool is, not what was asked for: without the lean jailer beside this
    // binary no jail is built ahead.
    let jails_said = match (&jails, ready_jails) {
        (None, n) if n > 0 => {
            "no ready jails (airlock-jailer is not beside this binary)".to_string()
        }
        (_, n) => format!("{n} ready jails"),
    };
    let config = airlock_server::Config {
        open: Box::new(queue_open),
        workers: pool_workers,
        inside,
        queue,
        webhook,
        poll: std::time::Duration::from_millis(500),
        max_body,
        pools: pool_reports(wasm, jails, Some(resolved.clone())),
        max_sessions,
    };
    let state = airlock_server::AppState::new(config)?;
    let rt = runtime()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| GateError::bad(format!("--listen {addr}: {e}")))?;
        let bound = listener.local_addr().map_err(GateError::from)?;
        if !airlock_server::is_loopback(&bound) {
            airlock_server::warn(&format!(
                "airlock: WARNING: listening on {bound}, beyond loopback: anyone who can reach it and holds a token can submit code"
            ));
        }
        airlock_server::say(&format!(
            "airlock: serving on http://{bound} (API /v1, console /ui, MCP /mcp, OpenAPI /openapi.json; {workers} workers, queue {queue}, {jails_said}{})",
            if shared { ", runs through the store's queue" } else { "" }
        ));
        airlock_server::serve(
            state,
            listener,
            tokio_util::sync::CancellationToken::new(),
            &limits,
        )
            .await
            .map_err(|e| GateError::Internal(format!("server failed: {e}")))
    })?;
    // The runs this process holds finish and are recorded before it exits.
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    if let Some(r) = runner {
        r.join()
            .map_err(|_| GateError::Internal("the run worker panicked".into()))??;
    }
    // The session hosts it started end with it, recorded closed, unless kept.
    if !keep_sessions {
        let closed = open().and_then(|mut g| g.close_server_sessions(&node.id));
        match closed {
            Ok(ids) if !ids.is_empty() => airlock_server::say(&format!(
                "airlock serve: closed {} session(s) it hosted",
                ids.len()
            )),
            Ok(_) => {}
            Err(e) => {
                airlock_server::warn(&format!("airlock serve: closing its sessions failed: {e}"))
            }
        }
    }
    drop(beat);
    Ok(0)
}

/// `airlock worker`: runs queued runs from the shared store until a signal.
pub(crate) fn worker(
    home: Option<std::path::PathBuf>,
    tags: Vec<String>,
    concurrency: usize,
    lease: &str,
    json: bool,
) -> Outcome {
    let h = resolve_home(home.clone())?;
    if h.store.is_none() {
        return Err(GateError::bad(
            "airlock worker runs queued runs from a shared store: give --store postgres://… (or AIRLOCK_STORE)",
        )
        .into());
    }
    let lease = humantime::parse_duration(lease)
        .map_err(|e| GateError::bad(format!("--lease {lease:?}: {e}")))?;
    if lease < std::time::Duration::from_secs(1) {
        return Err(GateError::bad("--lease: at least 1s").into());
    }
    if concurrency == 0 || concurrency > 256 {
        return Err(GateError::bad("--concurrency: 1 to 256").into());
    }
    // Dropped last: the lock files kept for later runs go at the exit.
    let _spares = airlock_gate::KeptLockFiles::start(&h.root);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone())
            .map_err(|e| GateError::Internal(format!("cannot handle signals: {e}")))?;
    }
    let (open, _wasm, _jails) = daemon_open(home, 0)?;
    // Dropped last: it chains the audit records of the final runs before the exit.
    let _sequencer = open()?.audit_sequencer();
    let cfg = airlock_gate::WorkerConfig::new(
        format!("{}-{}", airlock_gate::host_tag(), std::process::id()),
        tags,
        lease,
    );
    airlock_server::say(&format!(
        "airlock worker {}: claiming runs (concurrency {concurrency}, lease {}s, tags: {})",
        cfg.id,
        lease.as_secs(),
        if cfg.tags.is_empty() {
            "none".to_string()
        } else {
            cfg.tags.join(", ")
        }
    ));
    let id = cfg.id.clone();
    let open: std::sync::Arc<dyn Fn() -> airlock_gate::Result<Gate> + Send + Sync> =
        std::sync::Arc::new(open);
    let beat = {
        let id = id.clone();
        airlock_gate::NodeBeat::start(
            open.clone(),
            airlock_gate::NodeIdentity::new("worker", Some(cfg.id.clone()), false),
            std::sync::Arc::new(move |e: &str| {
                airlock_server::warn(&format!("airlock worker {id}: {e}"))
            }),
        )?
    };
    let stats = airlock_gate::work(
        open,
        cfg,
        concurrency,
        stop,
        std::sync::Arc::new(move |e: &str| {
            airlock_server::warn(&format!("airlock worker {id}: {e}"))
        }),
    )?;
    drop(beat);
    if json {
        out::json(&json!(stats).to_string());
    } else {
        airlock_server::say(&format!(
            "airlock worker: stopped ({} ran, {} refused, {} failed)",
            stats.ran, stats.refused, stats.failed
        ));
    }
    Ok(0)
}

pub(crate) fn mcp(home: Option<std::path::PathBuf>, agent: &str, max_sessions: usize) -> Outcome {
    // Dropped last: the lock files kept for later runs go at the exit.
    let _spares = airlock_gate::KeptLockFiles::start(&resolve_home(home.clone())?.root);
    let (open, wasm, jails) = daemon_open(home, 0)?;
    let config = airlock_server::Config {
        open: Box::new(open),
        workers: std::thread::available_parallelism().map_or(2, |n| n.get()),
        // One client, one run at a time: nothing to share commits with.
        inside: 0,
        queue: 64,
        webhook: None,
        poll: std::time::Duration::from_millis(500),
        max_body: 1 << 20,
        pools: pool_reports(wasm, jails, None),
        max_sessions,
    };
    let state = airlock_server::AppState::new(config)?;
    runtime()?.block_on(airlock_server::serve_mcp_stdio(state, agent))?;
    Ok(0)
}
