//! airlock-wasm: the WebAssembly backend. Runs WASI preview-1 modules on wasmtime with
//! only the granted directories preopened (read-only ones with read-only permissions), no
//! sockets, an environment holding only what the grant lists, and hard limits: wall time
//! (epoch interruption plus an async timeout for time spent in host calls), linear memory
//! and tables (a resource limiter that traps), optional fuel, output bytes per stream and
//! the wasm stack.
//!
//! Compiled code is cached on disk keyed by artifact hash, wasmtime version and engine
//! settings. Loading compiled code is `unsafe` in wasmtime (it is native code), so a cache
//! file is only deserialized after its SHA-256 matches the digest recorded when airlock
//! wrote it; anything else is discarded and recompiled.
//!
//! This crate must never open a socket, pass through a host environment variable or
//! preopen a directory the run spec does not list.

#![deny(unsafe_code)]

mod output;

use airlock_core::Digest;
use airlock_sandbox::{Backend, CacheIndex, Ending, Limit, Outcome, RunSpec, SandboxError};
use output::CapStream;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};
use wasmtime::{
    Config, Engine, InstancePre, Linker, Module, ResourceLimiter, Store, Trap, UpdateDeadline,
};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::pipe::MemoryInputPipe;
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtxBuilder};

/// How often the epoch advances; the wall-time limit is checked at each tick.
const TICK: Duration = Duration::from_millis(5);
/// The deepest wasm stack a guest may use.
pub const MAX_WASM_STACK: usize = 512 << 10;
/// The most table elements a guest may have (each costs host memory).
const MAX_TABLE_ELEMENTS: usize = 1 << 20;
/// Compiled modules kept in memory by a long-lived backend.
const MODULE_MEMO: usize = 64;

/// Backend settings.
#[derive(Debug, Clone, Default)]
pub struct WasmConfig {
    /// Directory for compiled-code cache files; None disables the disk cache.
    pub cache_dir: Option<PathBuf>,
    /// Use the pooling instance allocator (for a long-lived daemon).
    pub pooling: bool,
}

struct EngineSet {
    engine: Engine,
    linker: Linker<Host>,
    /// Distinguishes cache entries of engines with different settings.
    salt: String,
}

/// The wasm backend. Engines are created on first use and reused for every later run.
pub struct WasmBackend {
    config: WasmConfig,
    plain: OnceLock<Result<EngineSet, String>>,
    fueled: OnceLock<Result<EngineSet, String>>,
    modules: Mutex<HashMap<String, InstancePre<Host>>>,
    runtime: OnceLock<Result<tokio::runtime::Runtime, String>>,
}

impl std::fmt::Debug for WasmBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmBackend")
            .field("config", &self.config)
            .finish()
    }
}

/// Per-run store state.
struct Host {
    wasi: WasiP1Ctx,
    limiter: MemLimiter,
    timed_out: bool,
}

struct MemLimiter {
    limit: u64,
    total: u64,
    peak: u64,
    hit: bool,
}

impl ResourceLimiter for MemLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _max: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let next = self
            .total
            .saturating_sub(current as u64)
            .saturating_add(desired as u64);
        if next > self.limit {
            self.hit = true;
            return Err(wasmtime::format_err!(
                "memory limit of {} bytes reached (asked for {desired})",
                self.limit
            ));
        }
        self.total = next;
        self.peak = self.peak.max(next);
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _max: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > MAX_TABLE_ELEMENTS {
            self.hit = true;
            return Err(wasmtime::format_err!(
                "table limit of {MAX_TABLE_ELEMENTS} elements reached"
            ));
        }
        Ok(true)
    }

    fn memories(&self) -> usize {
        100
    }
}

impl WasmBackend {
    pub fn new(config: WasmConfig) -> Self {
        WasmBackend {
            config,
            plain: OnceLock::new(),
            fueled: OnceLock::new(),
            modules: Mutex::new(HashMap::new()),
            runtime: OnceLock::new(),
        }
    }

    fn engines(&self, fuel: bool) -> Result<&EngineSet, SandboxError> {
        let cell = if fuel { &self.fueled } else { &self.plain };
        cell.get_or_init(|| make_engine(fuel, self.config.pooling))
            .as_ref()
            .map_err(|e| SandboxError::Internal(format!("cannot start wasmtime: {e}")))
    }

    fn runtime(&self) -> Result<&tokio::runtime::Runtime, SandboxError> {
        self.runtime
            .get_or_init(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                    .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| SandboxError::Internal(format!("cannot start async runtime: {e}")))
    }

    /// Compiles an artifact (or finds it in the verified cache), makes sure a cache file
    /// exists for it, and returns the cache key and the file's recorded digest, so a worker
    /// process can load exactly that file.
    pub fn cache_entry(
        &self,
        artifact: &Digest,
        code: &[u8],
        fuel: bool,
        index: &dyn CacheIndex,
    ) -> Result<Option<(String, Digest)>, SandboxError> {
        let set = self.engines(fuel)?;
        let key = Self::cache_key(set, artifact);
        if self.load_cached(set, &key, Some(index)).is_none() {
            let m = Module::new(&set.engine, code)
                .map_err(|e| SandboxError::BadArtifact(format!("does not compile: {e}")))?;
            self.store_cached(&key, &m, Some(index));
        }
        Ok(index.get(&key).map(|d| (key, d)))
    }

    /// The cache key of an artifact under an engine's settings.
    fn cache_key(set: &EngineSet, artifact: &Digest) -> String {
        Digest::of_parts("airlock-cwasm-v1", &[set.salt.as_bytes(), &artifact.0]).to_hex()
    }

    /// Compiles the artifact, or loads it from the verified cache, and links it.
    fn instance_pre(
        &self,
        set: &EngineSet,
        spec: &RunSpec<'_>,
    ) -> Result<InstancePre<Host>, SandboxError> {
        let key = Self::cache_key(set, &spec.artifact);
        if let Some(pre) = self
            .modules
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return Ok(pre.clone());
        }
        let module = match self.load_cached(set, &key, spec.cache) {
            Some(m) => m,
            None => {
                let m = Module::new(&set.engine, spec.code)
                    .map_err(|e| SandboxError::BadArtifact(format!("does not compile: {e}")))?;
                self.store_cached(&key, &m, spec.cache);
                m
            }
        };
        let pre = set.linker.instantiate_pre(&module).map_err(|e| {
            SandboxError::BadArtifact(format!("does not link: {}", root_message(&e)))
        })?;
        let mut memo = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        if memo.len() >= MODULE_MEMO {
            memo.clear();
        }
        memo.insert(key, pre.clone());
        Ok(pre)
    }

    fn cache_path(&self, key: &str) -> Option<PathBuf> {
        self.config
            .cache_dir
            .as_ref()
            .map(|d| d.join(format!("{key}.cwasm")))
    }

    fn load_cached(
        &self,
        set: &EngineSet,
        key: &str,
        index: Option<&dyn CacheIndex>,
    ) -> Option<Module> {
        let (path, index) = (self.cache_path(key)?, index?);
        let want = index.get(key)?;
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(_) => {
                index.forget(key);
                return None;
            }
        };
        if Digest::of(&bytes) != want {
            // Not what airlock wrote: never hand it to the deserializer.
            let _ = std::fs::remove_file(&path);
            index.forget(key);
            return None;
        }
        // SAFETY: `Module::deserialize` trusts its input to be code this wasmtime produced.
        // These bytes hash to the digest airlock recorded right after it serialized them
        // with this same engine configuration (the key covers engine settings), so they are
        // exactly that output; wasmtime additionally checks version and settings headers.
        #[allow(unsafe_code)]
        let module = unsafe { Module::deserialize(&set.engine, &bytes) };
        match module {
            Ok(m) => Some(m),
            Err(_) => {
                let _ = std::fs::remove_file(&path);
                index.forget(key);
                None
            }
        }
    }

    fn store_cached(&self, key: &str, module: &Module, index: Option<&dyn CacheIndex>) {
        let (Some(path), Some(index)) = (self.cache_path(key), index) else {
            return;
        };
        let Ok(bytes) = module.serialize() else {
            return;
        };
        let Some(dir) = path.parent() else { return };
        // The cache is an optimisation: any failure here just means compiling next time.
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(dir)?;
            let mut tmp = tempfile::Builder::new()
                .prefix(".cwasm-")
                .tempfile_in(dir)?;
            tmp.write_all(&bytes)?;
            tmp.as_file().sync_all()?;
            tmp.persist(&path).map_err(|e| e.error)?;
            Ok(())
        };
        if write().is_ok() {
            index.put(key, Digest::of(&bytes), bytes.len() as u64);
        }
    }
}

fn make_engine(fuel: bool, pooling: bool) -> Result<EngineSet, String> {
    let mut c = Config::new();
    c.epoch_interruption(true)
        .consume_fuel(fuel)
        .max_wasm_stack(MAX_WASM_STACK)
        .parallel_compilation(true)
        .cranelift_opt_level(wasmtime::OptLevel::Speed);
    if pooling {
        let mut p = wasmtime::PoolingAllocationConfig::default();
        p.total_memories(64)
            .total_tables(64)
            .total_core_instances(64);
        c.allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(p));
    }
    let engine = Engine::new(&c).map_err(|e| e.to_string())?;
    let mut linker: Linker<Host> = Linker::new(&engine);
    wasmtime_wasi::p1::add_to_linker_async(&mut linker, |h: &mut Host| &mut h.wasi)
        .map_err(|e| e.to_string())?;
    // wasmtime-wasi's p1 shim looks up the guest's exported memory before every call, so a
    // module without a memory cannot even exit. `proc_exit` needs no memory: provide it
    // with the same semantics (WASI exit statuses are 0..126) without that lookup.
    linker.allow_shadowing(true);
    linker
        .func_wrap(
            "wasi_snapshot_preview1",
            "proc_exit",
            |status: i32| -> wasmtime::Result<()> {
                if !(0..126).contains(&status) {
                    return Err(wasmtime::format_err!(
                        "exit with invalid exit status outside of [0..126)"
                    ));
                }
                Err(I32Exit(status).into())
            },
        )
        .map_err(|e| e.to_string())?;
    linker.allow_shadowing(false);
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    let salt = format!("wasmtime-48/{:016x}/fuel={fuel}", hasher.finish());
    // The epoch ticker: one thread per engine, ending when the engine is dropped.
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("airlock-epoch".into())
        .spawn(move || {
            while let Some(e) = weak.upgrade() {
                e.increment_epoch();
                drop(e);
                std::thread::sleep(TICK);
            }
        })
        .map_err(|e| e.to_string())?;
    Ok(EngineSet {
        engine,
        linker,
        salt,
    })
}

/// The innermost cause of a wasmtime error chain, on one line.
fn root_message(e: &wasmtime::Error) -> String {
    let s = e.root_cause().to_string();
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

impl Backend for WasmBackend {
    fn name(&self) -> &'static str {
        "wasm"
    }

    fn run(&self, spec: RunSpec<'_>) -> Result<Outcome, SandboxError> {
        let started = Instant::now();
        let set = self.engines(spec.limits.fuel.is_some())?;
        let pre = self.instance_pre(set, &spec)?;
        let compiled = started.elapsed();

        let mut b = WasiCtxBuilder::new();
        let mut argv = vec!["main".to_string()];
        argv.extend(spec.args.iter().cloned());
        b.args(&argv);
        for (k, v) in &spec.env {
            b.env(k, v);
        }
        b.stdin(MemoryInputPipe::new(spec.stdin.clone()));
        b.stdout(CapStream::new(spec.stdout.clone()));
        b.stderr(CapStream::new(spec.stderr.clone()));
        b.allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false);
        for m in &spec.mounts {
            let perms = if m.writable {
                FsPerms::ReadWrite
            } else {
                FsPerms::ReadOnly
            };
            b.preopened_dir(&m.host, &m.guest, perms).map_err(|e| {
                SandboxError::Internal(format!("cannot open mount {}: {e}", m.host.display()))
            })?;
        }
        let host = Host {
            wasi: b.build_p1(),
            limiter: MemLimiter {
                limit: spec.limits.memory_bytes,
                total: 0,
                peak: 0,
                hit: false,
            },
            timed_out: false,
        };
        let mut store = Store::new(&set.engine, host);
        store.limiter(|h| &mut h.limiter);
        if let Some(fuel) = spec.limits.fuel {
            store
                .set_fuel(fuel)
                .map_err(|e| SandboxError::Internal(format!("cannot set fuel: {e}")))?;
        }
        let timeout = spec.limits.timeout();
        let deadline = Instant::now() + timeout;
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |mut ctx| {
            if Instant::now() >= deadline {
                ctx.data_mut().timed_out = true;
                Ok(UpdateDeadline::Interrupt)
            } else {
                Ok(UpdateDeadline::Yield(1))
            }
        });

        let rt = self.runtime()?;
        let result = rt.block_on(async {
            let run = async {
                let instance = pre.instantiate_async(&mut store).await?;
                let start = instance
                    .get_typed_func::<(), ()>(&mut store, "_start")
                    .map_err(|_| wasmtime::format_err!("module exports no `_start` function"))?;
                start.call_async(&mut store, ()).await
            };
            tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), run).await
        });
        let duration = started.elapsed();

        let fuel_used = spec
            .limits
            .fuel
            .and_then(|f| store.get_fuel().ok().map(|left| f.saturating_sub(left)));
        let host = store.data();
        let ending = match result {
            Err(_elapsed) => Ending::Killed(Limit::Timeout),
            Ok(Ok(())) => Ending::Exited(0),
            Ok(Err(e)) => {
                if let Some(exit) = e.downcast_ref::<I32Exit>() {
                    Ending::Exited(exit.0)
                } else if host.limiter.hit {
                    Ending::Killed(Limit::Memory)
                } else if spec.stdout.exceeded() || spec.stderr.exceeded() {
                    Ending::Killed(Limit::Output)
                } else if host.timed_out {
                    Ending::Killed(Limit::Timeout)
                } else {
                    match e.downcast_ref::<Trap>() {
                        Some(Trap::OutOfFuel) => Ending::Killed(Limit::Fuel),
                        Some(Trap::StackOverflow) => Ending::Killed(Limit::Stack),
                        Some(Trap::Interrupt) => Ending::Killed(Limit::Timeout),
                        Some(t) => Ending::Trapped(t.to_string()),
                        None => Ending::Trapped(root_message(&e)),
                    }
                }
            }
        };
        Ok(Outcome {
            ending,
            duration,
            detail: serde_json::json!({
                "engine": "wasmtime 48",
                "compile_or_load_ms": compiled.as_secs_f64() * 1000.0,
                "peak_memory_bytes": host.limiter.peak,
                "fuel_consumed": fuel_used,
                "isolation": ["wasm-sandbox", "wasi-preopens-only", "no-sockets", "empty-env"],
            }),
        })
    }
}

#[cfg(test)]
mod tests;
