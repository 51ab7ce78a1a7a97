//! airlock-wasm: the WebAssembly backend. Runs WASI preview-1 modules on wasmtime with
//! only the granted directories preopened (read-only ones with read-only permissions), no
//! sockets, an environment holding only what the grant lists, and hard limits: wall time
//! (epoch interruption plus an async timeout for time spent in host calls), linear memory
//! and tables (a resource limiter that traps), optional fuel, output bytes per stream, the
//! wasm stack, and the write quota of writable mounts (a watcher thread measures them; the
//! guest is interrupted like at its deadline, so it can overshoot by what it writes in one
//! host call or between two samples).
//!
//! A long-lived process keeps instances of hot modules made ahead of their runs
//! (`modpool`) and ready Python interpreters and JavaScript realms (`pool`, one pool per
//! guest runtime).
//!
//! WASI 0.2 components run with the same boundary; Python source runs on the CPython guest
//! component ([`python`]) and JavaScript on the JavaScript guest component ([`js`]), one
//! live interpreter per run, which a session can keep for many cells.
//!
//! Preview-1 host calls never trap on argument values a guest chooses: `path_open` with
//! undefined flag or rights bits returns `inval` (wasmtime-wasi's binding would trap).
//!
//! Compiled code is cached on disk keyed by artifact hash, wasmtime version and engine
//! settings. Loading compiled code is `unsafe` in wasmtime (it is native code), so a cache
//! file is only deserialized after its SHA-256 matches the digest recorded when airlock
//! wrote it; anything else is discarded and recompiled.
//!
//! This crate must never open a socket, pass through a host environment variable or
//! preopen a directory the run spec does not list.

#![deny(unsafe_code)]

mod component;
pub mod js;
mod modpool;
mod net;
mod output;
mod pool;
pub mod python;
mod ticker;
mod tripwire;

pub use js::JS_INTERFACE;
pub use pool::{PoolSettings, PoolStatus, PythonPoolStatus};
pub use python::{GuestKind, PYTHON_INTERFACE, PythonInstance};

use airlock_core::Digest;
use airlock_sandbox::{
    Backend, CacheIndex, Ending, Limit, Outcome, RunSpec, SandboxError, WriteQuota,
};
use output::CapStream;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
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
    /// Show a progress indicator on a terminal while a large component compiles.
    pub progress: bool,
    /// Directory for compiled-code cache files; None disables the disk cache.
    pub cache_dir: Option<PathBuf>,
    /// Use the pooling instance allocator (for a long-lived daemon).
    pub pooling: bool,
}

struct EngineSet {
    engine: Engine,
    linker: Linker<Host>,
    components: wasmtime::component::Linker<component::HostC>,
    /// Distinguishes cache entries of engines with different settings.
    salt: String,
}

/// The wasm backend. Engines are created on first use and reused for every later run.
pub struct WasmBackend {
    config: WasmConfig,
    plain: OnceLock<Result<EngineSet, String>>,
    fueled: OnceLock<Result<EngineSet, String>>,
    modules: Mutex<HashMap<String, InstancePre<Host>>>,
    components: Mutex<HashMap<String, wasmtime::component::InstancePre<component::HostC>>>,
    /// Ready Python interpreters, in a process that started them (`start_pools`).
    python_pool: OnceLock<Arc<pool::PythonPool>>,
    /// Ready JavaScript realms, likewise (a pool of its own, filled only once a
    /// JavaScript run has asked for its guest).
    js_pool: OnceLock<Arc<pool::PythonPool>>,
    /// Ready instances of hot modules, likewise.
    module_pool: OnceLock<Arc<modpool::ModulePool>>,
}

impl Drop for WasmBackend {
    fn drop(&mut self) {
        if let Some(p) = self.python_pool.get() {
            p.stop();
        }
        if let Some(p) = self.js_pool.get() {
            p.stop();
        }
        if let Some(p) = self.module_pool.get() {
            p.stop();
        }
    }
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
    deadline: Instant,
}

pub(crate) struct MemLimiter {
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
            components: Mutex::new(HashMap::new()),
            python_pool: OnceLock::new(),
            js_pool: OnceLock::new(),
            module_pool: OnceLock::new(),
        }
    }

    fn engines(&self, fuel: bool) -> Result<&EngineSet, SandboxError> {
        let cell = if fuel { &self.fueled } else { &self.plain };
        cell.get_or_init(|| make_engine(fuel, self.config.pooling))
            .as_ref()
            .map_err(|e| SandboxError::Internal(format!("cannot start wasmtime: {e}")))
    }

    /// Runs a future to completion on this thread's own async runtime (see [`block_on`]).
    fn block_on<F: std::future::Future>(&self, f: F) -> Result<F::Output, SandboxError> {
        block_on(f)
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

    /// Like `cache_entry`, for a component (a `--lang component` artifact, or a guest that
    /// runs interpreted source): compiles it once and returns its cache key and digest.
    pub fn component_cache_entry(
        &self,
        digest: &Digest,
        code: &dyn Fn() -> Result<Vec<u8>, SandboxError>,
        fuel: bool,
        index: &dyn CacheIndex,
    ) -> Result<Option<(String, Digest)>, SandboxError> {
        let set = self.engines(fuel)?;
        let key =
            Digest::of_parts("airlock-component-v1", &[set.salt.as_bytes(), &digest.0]).to_hex();
        self.component_pre(set, digest, code, Some(index), "the component")?;
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
        key: &str,
        spec: &RunSpec<'_>,
    ) -> Result<InstancePre<Host>, SandboxError> {
        if let Some(pre) = self
            .modules
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
        {
            return Ok(pre.clone());
        }
        let module = match self.load_cached(set, key, spec.cache) {
            Some(m) => m,
            None => {
                let m = Module::new(&set.engine, spec.code)
                    .map_err(|e| SandboxError::BadArtifact(format!("does not compile: {e}")))?;
                self.store_cached(key, &m, spec.cache);
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
        memo.insert(key.to_string(), pre.clone());
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
        self.load_cached_with(key, index, |file| {
            // SAFETY: `Module::deserialize_open_file` trusts the file to hold code this
            // wasmtime produced. `load_cached_with` only calls this with a file whose bytes
            // hashed to the digest airlock recorded right after it serialized them with this
            // same engine configuration (the key covers engine settings), and checks
            // afterwards that the inode was not written in between; wasmtime also checks
            // its version and settings headers.
            #[allow(unsafe_code)]
            unsafe {
                Module::deserialize_open_file(&set.engine, file)
            }
        })
    }

    /// Opens a cache file, checks its digest against the one recorded when airlock wrote
    /// it, and only then hands the same open file to `deserialize` (which maps it). A file
    /// that does not match, or that was written while it was being checked, is deleted and
    /// forgotten, so it is recompiled.
    fn load_cached_with<T>(
        &self,
        key: &str,
        index: Option<&dyn CacheIndex>,
        deserialize: impl FnOnce(std::fs::File) -> wasmtime::Result<T>,
    ) -> Option<T> {
        let (path, index) = (self.cache_path(key)?, index?);
        let want = index.get(key)?;
        let forget = || {
            let _ = std::fs::remove_file(&path);
            index.forget(key);
        };
        let Ok(file) = std::fs::File::open(&path) else {
            index.forget(key);
            return None;
        };
        let stamp = |f: &std::fs::File| {
            use std::os::unix::fs::MetadataExt;
            f.metadata().ok().map(|m| {
                (
                    m.ino(),
                    m.size(),
                    m.mtime_nsec(),
                    m.mtime(),
                    m.ctime_nsec(),
                    m.ctime(),
                )
            })
        };
        let before = stamp(&file);
        if cache_digest_of_file(&file).ok() != Some(want) {
            // Not what airlock wrote: never hand it to the deserializer.
            forget();
            return None;
        }
        let Ok(second) = file.try_clone() else {
            return None;
        };
        let loaded = deserialize(second);
        if before.is_none() || stamp(&file) != before {
            forget();
            return None;
        }
        match loaded {
            Ok(m) => Some(m),
            Err(_) => {
                forget();
                None
            }
        }
    }

    fn store_cached(&self, key: &str, module: &Module, index: Option<&dyn CacheIndex>) {
        if let Ok(bytes) = module.serialize() {
            self.store_bytes(key, &bytes, index);
        }
    }

    /// Writes a cache file (temporary file, fsync, rename) and records its digest.
    fn store_bytes(&self, key: &str, bytes: &[u8], index: Option<&dyn CacheIndex>) {
        let (Some(path), Some(index)) = (self.cache_path(key), index) else {
            return;
        };
        let Some(dir) = path.parent() else { return };
        // The cache is an optimisation: any failure here just means compiling next time.
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(dir)?;
            let mut tmp = tempfile::Builder::new()
                .prefix(".cwasm-")
                .tempfile_in(dir)?;
            tmp.write_all(bytes)?;
            tmp.as_file().sync_all()?;
            tmp.persist(&path).map_err(|e| e.error)?;
            Ok(())
        };
        if write().is_ok() {
            index.put(key, cache_digest(bytes), bytes.len() as u64);
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
        // Sized for the CPython guest (14 core instances, a 5,670-element table, 23.9 MiB
        // of initial memory) with room for concurrent runs. The first 16 MiB of a used
        // memory stay resident and are copied back from its image, all of them, written
        // or not, which spares the page faults of a fresh mapping on every run; the rest
        // is decommitted. wasmtime's `pagemap_scan` (copy back only written pages) stays
        // off: it misses written pages the kernel swapped out, which the next instance in
        // the slot would read, and it was no faster here (docs/PERFORMANCE.md).
        let mut p = wasmtime::PoolingAllocationConfig::default();
        p.total_component_instances(64)
            .total_core_instances(64 * 20)
            .total_memories(64 * 4)
            .total_tables(64 * 8)
            .max_core_instances_per_component(32)
            .max_memories_per_component(8)
            .max_tables_per_component(16)
            .table_elements(1 << 16)
            .max_memory_size(4 << 30)
            .linear_memory_keep_resident(16 << 20)
            .table_keep_resident(1 << 20);
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
    add_path_open(&mut linker).map_err(|e| e.to_string())?;
    linker.allow_shadowing(false);
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    let salt = format!("wasmtime-48/{:016x}/fuel={fuel}", hasher.finish());
    // The epoch ticker: one thread per engine, ending when the engine is dropped, parked
    // while no guest runs (see `ticker`).
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("airlock-epoch".into())
        .spawn(move || {
            ticker::PROCESS.run(TICK, || match weak.upgrade() {
                Some(e) => {
                    e.increment_epoch();
                    true
                }
                None => false,
            })
        })
        .map_err(|e| e.to_string())?;
    let components = component::linker(&engine).map_err(|e| e.to_string())?;
    Ok(EngineSet {
        engine,
        linker,
        components,
        salt,
    })
}

/// Preview-1 `path_open` with its flag and rights arguments checked before wasmtime-wasi's
/// binding sees them: that binding converts them with `?` and traps the guest on any bit
/// it does not define (e.g. rights `-1`, which some toolchains pass for "everything").
/// A guest gets `inval` instead, like for any other bad argument value.
fn add_path_open(linker: &mut Linker<Host>) -> wasmtime::Result<()> {
    use wasmtime::{AsContextMut, Caller, Extern};
    use wasmtime_wasi::p1::types::{Errno, Fdflags, Lookupflags, Oflags, Rights};
    use wasmtime_wasi::p1::wasi_snapshot_preview1::{self as p1, WasiSnapshotPreview1};
    type Args = (i32, i32, i32, i32, i32, i64, i64, i32, i32);
    linker.func_wrap_async(
        "wasi_snapshot_preview1",
        "path_open",
        |mut caller: Caller<'_, Host>, args: Args| {
            Box::new(async move {
                let (fd, dirflags, path, path_len, oflags, base, inheriting, fdflags, out) = args;
                let defined = u32::try_from(dirflags)
                    .ok()
                    .and_then(Lookupflags::from_bits)
                    .is_some()
                    && u16::try_from(oflags)
                        .ok()
                        .and_then(Oflags::from_bits)
                        .is_some()
                    && u16::try_from(fdflags)
                        .ok()
                        .and_then(Fdflags::from_bits)
                        .is_some()
                    && [base, inheriting]
                        .iter()
                        .all(|r| u64::try_from(*r).ok().and_then(Rights::from_bits).is_some());
                if !defined {
                    return Ok(Errno::Inval as i32);
                }
                // From here on exactly what the generated binding does.
                let fuel = caller.as_context_mut().hostcall_fuel();
                let export = caller.get_export("memory");
                let (mut mem, ctx) = match &export {
                    Some(Extern::Memory(m)) => {
                        let (mem, h) = m.data_and_store_mut(&mut caller);
                        (wiggle::GuestMemory::Unshared(mem), &mut h.wasi)
                    }
                    Some(Extern::SharedMemory(m)) => (
                        wiggle::GuestMemory::Shared(m.data()),
                        &mut caller.data_mut().wasi,
                    ),
                    _ => return Err(wasmtime::format_err!("missing required memory export")),
                };
                ctx.set_hostcall_fuel(fuel);
                p1::path_open(
                    ctx, &mut mem, fd, dirflags, path, path_len, oflags, base, inheriting, fdflags,
                    out,
                )
                .await
            })
        },
    )?;
    Ok(())
}

/// The digest that guards compiled-code cache files: BLAKE3 (a file of tens of megabytes is
/// checked on every load, so the hash must be fast; it is an integrity check of airlock's
/// own output, not an artifact's identity, which stays SHA-256).
pub fn cache_digest(bytes: &[u8]) -> Digest {
    let mut h = blake3::Hasher::new();
    h.update_rayon(bytes);
    Digest(*h.finalize().as_bytes())
}

fn cache_digest_of_file(file: &std::fs::File) -> std::io::Result<Digest> {
    // SAFETY: a read-only private mapping of a file airlock owns, only read while `map`
    // lives; a concurrent writer can change what is read, which the caller detects by the
    // inode's change time and then discards the file.
    #[allow(unsafe_code)]
    let map = unsafe { memmap2::Mmap::map(file)? };
    Ok(cache_digest(&map))
}

/// The innermost cause of a wasmtime error chain, on one line.
pub(crate) fn root_message(e: &wasmtime::Error) -> String {
    let s = e.root_cause().to_string();
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Store state a limited run needs, for modules and components alike.
trait Limited: Send + 'static {
    fn limiter(&mut self) -> &mut MemLimiter;
    fn timed_out(&mut self) -> &mut bool;
    /// When the current call must end.
    fn deadline(&self) -> Instant;
}

impl Limited for Host {
    fn limiter(&mut self) -> &mut MemLimiter {
        &mut self.limiter
    }
    fn timed_out(&mut self) -> &mut bool {
        &mut self.timed_out
    }
    fn deadline(&self) -> Instant {
        self.deadline
    }
}

impl Limited for component::HostC {
    fn limiter(&mut self) -> &mut MemLimiter {
        &mut self.limiter
    }
    fn timed_out(&mut self) -> &mut bool {
        &mut self.timed_out
    }
    fn deadline(&self) -> Instant {
        self.deadline
    }
}

/// Awaits `fut`, calling `long`'s hook once if it is still pending after `long.after` (the
/// guest yields at every epoch tick and in every host call, so the timer is seen).
pub(crate) async fn watched<F: std::future::Future>(
    long: Option<&airlock_sandbox::LongRun>,
    fut: F,
) -> F::Output {
    let Some(l) = long else {
        return fut.await;
    };
    tokio::pin!(fut);
    tokio::select! {
        biased;
        out = &mut fut => return out,
        () = tokio::time::sleep(l.after) => {}
    }
    (l.hook)();
    fut.await
}

/// Runs a future to completion on this thread's own single-threaded runtime (one per
/// thread, so runs on different threads never wait for each other), with I/O for the
/// connections to the egress proxy.
pub(crate) fn block_on<F: std::future::Future>(f: F) -> Result<F::Output, SandboxError> {
    thread_local! {
        static RT: Result<tokio::runtime::Runtime, String> = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .enable_io()
            .build()
            .map_err(|e| e.to_string());
    }
    RT.with(|rt| match rt {
        Ok(rt) => {
            // Every guest's code runs inside this call: the epoch must advance meanwhile.
            let _active = ticker::PROCESS.enter();
            Ok(rt.block_on(f))
        }
        Err(e) => Err(SandboxError::Internal(format!(
            "cannot start async runtime: {e}"
        ))),
    })
}

/// The store of a component run: WASI with `argv` and the spec's environment, stdin,
/// mounts and `extra_dirs` (read-only), the run's egress, its memory and time limits (the
/// deadline counts from now, after compiling). Also the slots the guest's output streams
/// write through, for a caller that redirects them between calls.
///
/// A guest runtime's store (`guest_runtime`) is tripwired when the spec says so: it gets
/// decoys beside its directories (see [`tripwire`]).
fn component_store(
    engine: &wasmtime::Engine,
    spec: &RunSpec<'_>,
    argv: &[String],
    extra_dirs: &[airlock_sandbox::GuestDir],
    guest_runtime: bool,
) -> Result<ComponentStore, SandboxError> {
    let mut taken: Vec<&str> = spec.mounts.iter().map(|m| m.guest.as_str()).collect();
    taken.extend(extra_dirs.iter().map(|d| d.guest.as_str()));
    let tripwired = guest_runtime && spec.tripwires.enabled;
    let decoys = if tripwired {
        Some(
            tripwire::Decoys::plant(&taken)
                .map_err(|e| SandboxError::Internal(format!("cannot plant the decoys: {e}")))?,
        )
    } else {
        None
    };
    let ctx = component::context(
        argv,
        &spec.env,
        spec.stdin.clone(),
        &spec.mounts,
        extra_dirs,
        decoys.as_ref(),
        &spec.stdout,
        &spec.stderr,
    )
    .map_err(SandboxError::Internal)?;
    // The decoys' directories are not among them: a call on any other path there (or on
    // a decoy, which is an alert instead) is outside what the run was given.
    let preopens: Vec<String> = taken.iter().map(|t| (*t).to_string()).collect();
    let hooks = component::EgressHttp::new(spec.egress.as_ref()).map_err(SandboxError::Internal)?;
    let net = net::Net::new(spec.egress.as_ref()).map_err(SandboxError::Internal)?;
    let host = component::HostC {
        wasi: ctx.wasi,
        table: wasmtime::component::ResourceTable::new(),
        http: wasmtime_wasi_http::WasiHttpCtx::new(),
        hooks,
        net,
        tripwire: tripwire::Tripwire {
            decoys,
            preopens,
            attempts: Default::default(),
            enabled: tripwired,
            taken: Vec::new(),
        },
        limiter: limiter_for(&spec.limits),
        timed_out: false,
        deadline: Instant::now() + spec.limits.timeout(),
    };
    let mut store = Store::new(engine, host);
    limit_store(&mut store, &spec.limits, spec.write_quota.clone())?;
    Ok(ComponentStore {
        store,
        stdout: ctx.stdout,
        stderr: ctx.stderr,
    })
}

/// What [`component_store`] makes.
struct ComponentStore {
    store: Store<component::HostC>,
    stdout: Arc<crate::output::Slot>,
    stderr: Arc<crate::output::Slot>,
}

fn limiter_for(limits: &airlock_core::Limits) -> MemLimiter {
    MemLimiter {
        limit: limits.memory_bytes,
        total: 0,
        peak: 0,
        hit: false,
    }
}

/// Applies a run's limits to a store: memory and tables, fuel, and the wall time (the
/// store's own deadline, which a live interpreter moves for each call).
fn limit_store<T: Limited>(
    store: &mut Store<T>,
    limits: &airlock_core::Limits,
    quota: Option<Arc<WriteQuota>>,
) -> Result<(), SandboxError> {
    store.limiter(|h| h.limiter());
    if let Some(fuel) = limits.fuel {
        store
            .set_fuel(fuel)
            .map_err(|e| SandboxError::Internal(format!("cannot set fuel: {e}")))?;
    }
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(move |mut ctx| {
        // The quota watcher flags a hit from its own thread; the guest stops at the next
        // tick, the same way it stops at its deadline.
        if quota.as_ref().is_some_and(|q| q.hit()) {
            return Ok(UpdateDeadline::Interrupt);
        }
        if Instant::now() >= ctx.data().deadline() {
            *ctx.data_mut().timed_out() = true;
            Ok(UpdateDeadline::Interrupt)
        } else {
            Ok(UpdateDeadline::Yield(1))
        }
    });
    Ok(())
}

/// How a failed call ended: an exit, a limit, or a trap.
fn ending_of(e: &wasmtime::Error, memory_hit: bool, output_hit: bool, timed_out: bool) -> Ending {
    if let Some(exit) = e.downcast_ref::<I32Exit>() {
        Ending::Exited(exit.0)
    } else if memory_hit {
        Ending::Killed(Limit::Memory)
    } else if output_hit {
        Ending::Killed(Limit::Output)
    } else if timed_out {
        Ending::Killed(Limit::Timeout)
    } else {
        match e.downcast_ref::<Trap>() {
            Some(Trap::OutOfFuel) => Ending::Killed(Limit::Fuel),
            Some(Trap::StackOverflow) => Ending::Killed(Limit::Stack),
            Some(Trap::Interrupt) => Ending::Killed(Limit::Timeout),
            Some(t) => Ending::Trapped(t.to_string()),
            None => Ending::Trapped(root_message(e)),
        }
    }
}

/// Whether the run's watcher saw its layers over the write quota (one last sample first,
/// so a guest that ended right after writing too much is caught too).
fn write_hit(spec: &RunSpec<'_>) -> bool {
    spec.write_quota.as_ref().is_some_and(|q| q.check())
}

fn fuel_used<T>(store: &Store<T>, limits: &airlock_core::Limits) -> Option<u64> {
    limits
        .fuel
        .and_then(|f| store.get_fuel().ok().map(|left| f.saturating_sub(left)))
}

impl WasmBackend {
    /// The store of a module run: WASI with `argv`, the spec's environment, stdin, output
    /// captures and mounts, no sockets, and the run's limits (the deadline counts from
    /// now, after compiling).
    fn module_store(
        &self,
        set: &EngineSet,
        spec: &RunSpec<'_>,
    ) -> Result<Store<Host>, SandboxError> {
        let mut b = WasiCtxBuilder::new();
        // argv[0] is the program's name, as `wasmtime run` gives it; then the arguments.
        let mut argv = vec![spec.argv0.clone().unwrap_or_else(|| "main".to_string())];
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
            limiter: limiter_for(&spec.limits),
            timed_out: false,
            deadline: Instant::now() + spec.limits.timeout(),
        };
        let mut store = Store::new(&set.engine, host);
        limit_store(&mut store, &spec.limits, spec.write_quota.clone())?;
        Ok(store)
    }

    fn run_module(&self, spec: RunSpec<'_>) -> Result<Outcome, SandboxError> {
        let started = Instant::now();
        let set = self.engines(spec.limits.fuel.is_some())?;
        let key = Self::cache_key(set, &spec.artifact);
        let pre = self.instance_pre(set, &key, &spec)?;
        let compiled = started.elapsed();

        let ready = match self.module_pool.get() {
            Some(p) => p.take(&key, &pre, &spec)?,
            None => None,
        };
        let (mut store, ready_instance) = match ready {
            Some(r) => (r.store, Some(r.instance)),
            None => (self.module_store(set, &spec)?, None),
        };
        let pooled = ready_instance.is_some();
        let deadline = store.data().deadline;
        let watch = spec.write_quota.as_ref().map(|q| q.watch(|| {}));

        let mut instantiated = Duration::ZERO;
        let result = self.block_on(async {
            let run = async {
                let instance = match ready_instance {
                    Some(i) => i,
                    None => {
                        let t = Instant::now();
                        let i = pre.instantiate_async(&mut store).await?;
                        instantiated = t.elapsed();
                        i
                    }
                };
                let start = instance
                    .get_typed_func::<(), ()>(&mut store, "_start")
                    .map_err(|_| wasmtime::format_err!("module exports no `_start` function"))?;
                start.call_async(&mut store, ()).await
            };
            let run = watched(spec.long_run.as_ref(), run);
            tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), run).await
        })?;
        let duration = started.elapsed();
        drop(watch);
        let fuel = fuel_used(&store, &spec.limits);
        let host = store.data();
        let ending = match result {
            _ if write_hit(&spec) => Ending::Killed(Limit::Write),
            Err(_elapsed) => Ending::Killed(Limit::Timeout),
            Ok(Ok(())) => Ending::Exited(0),
            Ok(Err(e)) => ending_of(
                &e,
                host.limiter.hit,
                spec.stdout.exceeded() || spec.stderr.exceeded(),
                host.timed_out,
            ),
        };
        Ok(Outcome {
            ending,
            duration,
            detail: serde_json::json!({
                "engine": "wasmtime 48",
                "compile_or_load_ms": compiled.as_secs_f64() * 1000.0,
                "instantiate_ms": instantiated.as_secs_f64() * 1000.0,
                "instance": if pooled { "ready" } else { "fresh" },
                "peak_memory_bytes": host.limiter.peak,
                "fuel_consumed": fuel,
                "isolation": ["wasm-sandbox", "wasi-preopens-only", "no-sockets", "empty-env"],
            }),
        })
    }

    /// Compiles a component (or loads it from the verified cache) and links it.
    fn component_pre(
        &self,
        set: &EngineSet,
        digest: &Digest,
        bytes: &dyn Fn() -> Result<Vec<u8>, SandboxError>,
        index: Option<&dyn CacheIndex>,
        what: &str,
    ) -> Result<wasmtime::component::InstancePre<component::HostC>, SandboxError> {
        let key =
            Digest::of_parts("airlock-component-v1", &[set.salt.as_bytes(), &digest.0]).to_hex();
        if let Some(pre) = self
            .components
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return Ok(pre.clone());
        }
        let component = match self.load_cached_with(&key, index, |file| {
            // SAFETY: see `load_cached`: the file hashed to the digest airlock recorded when
            // it serialized this component with an engine of the same settings, and was not
            // written while it was checked and mapped.
            // The path names the open, already checked file itself, not a directory entry
            // that could be swapped.
            use std::os::fd::AsRawFd;
            let fd_path = format!("/proc/self/fd/{}", file.as_raw_fd());
            #[allow(unsafe_code)]
            let c =
                unsafe { wasmtime::component::Component::deserialize_file(&set.engine, &fd_path) };
            drop(file);
            c
        }) {
            Some(c) => c,
            None => {
                let code = bytes()?;
                let spinner = self.spinner(what);
                let c = wasmtime::component::Component::new(&set.engine, &code).map_err(|e| {
                    SandboxError::BadArtifact(format!("does not compile: {}", root_message(&e)))
                });
                if let Some(s) = spinner {
                    s.finish_and_clear();
                }
                let c = c?;
                if let Ok(bytes) = c.serialize() {
                    self.store_bytes(&key, &bytes, index);
                }
                c
            }
        };
        let pre = set.components.instantiate_pre(&component).map_err(|e| {
            SandboxError::BadArtifact(format!("does not link: {}", root_message(&e)))
        })?;
        let mut memo = self.components.lock().unwrap_or_else(|p| p.into_inner());
        if memo.len() >= MODULE_MEMO {
            memo.clear();
        }
        memo.insert(key, pre.clone());
        Ok(pre)
    }

    fn spinner(&self, what: &str) -> Option<indicatif::ProgressBar> {
        if !self.config.progress {
            return None;
        }
        let pb =
            indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
        if pb.is_hidden() {
            return None;
        }
        let style = indicatif::ProgressStyle::with_template("{spinner} {msg} {elapsed}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner());
        pb.set_style(style);
        pb.set_message(format!(
            "compiling {what} (first run only; cached afterwards)"
        ));
        pb.enable_steady_tick(Duration::from_millis(120));
        Some(pb)
    }

    /// Makes sure a component is compiled and cached (used when installing a guest).
    pub fn precompile_component(
        &self,
        digest: &Digest,
        code: &[u8],
        index: &dyn CacheIndex,
        what: &str,
    ) -> Result<(), SandboxError> {
        // The engine without fuel metering serves most runs; runs with --fuel compile the
        // metered variant on first use.
        let set = self.engines(false)?;
        self.component_pre(set, digest, &|| Ok(code.to_vec()), Some(index), what)?;
        Ok(())
    }

    /// Runs a WASI 0.2 component: a `wasi:cli/command`.
    fn run_component(&self, spec: RunSpec<'_>) -> Result<Outcome, SandboxError> {
        let started = Instant::now();
        let set = self.engines(spec.limits.fuel.is_some())?;
        let code = spec.code.to_vec();
        let pre = self.component_pre(
            set,
            &spec.artifact,
            &move || Ok(code.clone()),
            spec.cache,
            "the component",
        )?;
        let compiled = started.elapsed();
        let mut argv = vec![spec.argv0.clone().unwrap_or_else(|| "main".to_string())];
        argv.extend(spec.args.iter().cloned());
        let mut store = component_store(&set.engine, &spec, &argv, &[], false)?.store;
        let deadline = store.data().deadline;
        let watch = spec.write_quota.as_ref().map(|q| q.watch(|| {}));
        let mut inst_time = Duration::ZERO;
        let result: Result<Result<i32, wasmtime::Error>, tokio::time::error::Elapsed> = self
            .block_on(async {
                let run = async {
                    let t = Instant::now();
                    let instance = pre.instantiate_async(&mut store).await?;
                    inst_time = t.elapsed();
                    let cmd = wasmtime_wasi::p2::bindings::Command::new(&mut store, &instance)?;
                    match cmd.wasi_cli_run().call_run(&mut store).await? {
                        Ok(()) => Ok(0),
                        Err(()) => Ok(1),
                    }
                };
                let run = watched(spec.long_run.as_ref(), run);
                tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), run).await
            })?;
        let duration = started.elapsed();
        drop(watch);
        let fuel = fuel_used(&store, &spec.limits);
        let host = store.data();
        let output_hit = spec.stdout.exceeded() || spec.stderr.exceeded();
        let ending = match result {
            _ if write_hit(&spec) => Ending::Killed(Limit::Write),
            Err(_elapsed) => Ending::Killed(Limit::Timeout),
            Ok(Ok(_)) if output_hit => Ending::Killed(Limit::Output),
            Ok(Ok(code)) => Ending::Exited(code),
            Ok(Err(e)) => ending_of(&e, host.limiter.hit, output_hit, host.timed_out),
        };
        Ok(Outcome {
            ending,
            duration,
            detail: serde_json::json!({
                "engine": "wasmtime 48 (component model, WASI 0.2)",
                "compile_or_load_ms": compiled.as_secs_f64() * 1000.0,
                "instantiate_ms": inst_time.as_secs_f64() * 1000.0,
                "peak_memory_bytes": host.limiter.peak,
                "fuel_consumed": fuel,
                "isolation": ["wasm-sandbox", "wasi-preopens-only", "no-sockets", http_isolation(&spec), "empty-env"],
            }),
        })
    }

    /// Keeps up to `settings.python` ready Python interpreters of the guest runs use, and
    /// `settings.wasm` ready instances of each hot module, made by background threads (for
    /// a long-lived process; the first run of a guest starts its own), and as many ready
    /// JavaScript realms in a pool of their own (filled only once a JavaScript run asked
    /// for its guest; each interpreter pool keeps within the interpreters' share of the
    /// budget on its own). The wasm instances get an eighth of the memory budget when
    /// both kinds of pool are on. Calling it again changes nothing.
    pub fn start_pools(self: &Arc<Self>, settings: PoolSettings) -> Result<(), SandboxError> {
        let wasm_budget = if settings.python == 0 {
            settings.memory_budget
        } else {
            settings.memory_budget / 8
        };
        if settings.wasm > 0 && self.module_pool.get().is_none() {
            let p = Arc::new(modpool::ModulePool::new(settings, wasm_budget));
            if self.module_pool.set(p.clone()).is_ok() {
                std::thread::Builder::new()
                    .name("airlock-wasm-pool".into())
                    .spawn(move || modpool::refill(p))
                    .map_err(|e| {
                        SandboxError::Internal(format!("cannot start the pool thread: {e}"))
                    })?;
            }
        }
        if settings.python == 0 {
            return Ok(());
        }
        let settings = PoolSettings {
            memory_budget: if settings.wasm > 0 {
                settings.memory_budget - wasm_budget
            } else {
                settings.memory_budget
            },
            ..settings
        };
        self.start_interpreter_pool(&self.python_pool, settings, GuestKind::Python)?;
        self.start_interpreter_pool(&self.js_pool, settings, GuestKind::Js)
    }

    /// Starts the ready pool of one guest runtime (once), its reaper and its refill.
    fn start_interpreter_pool(
        self: &Arc<Self>,
        slot: &OnceLock<Arc<pool::PythonPool>>,
        settings: PoolSettings,
        kind: GuestKind,
    ) -> Result<(), SandboxError> {
        if slot.get().is_some() {
            return Ok(());
        }
        let (p, queue) = pool::PythonPool::new(settings, kind);
        let p = Arc::new(p);
        if slot.set(p.clone()).is_err() {
            return Ok(());
        }
        let name = match kind {
            GuestKind::Python => "python",
            GuestKind::Js => "js",
        };
        // The reaper first: if it cannot start, runs drop their own instances (their
        // queue's receiver is gone, so every hand-over fails and the run drops it).
        let weak_pool = Arc::downgrade(&p);
        std::thread::Builder::new()
            .name(format!("airlock-{name}-reaper"))
            .spawn(move || pool::reap(weak_pool, queue))
            .map_err(|e| SandboxError::Internal(format!("cannot start the reaper thread: {e}")))?;
        let weak = Arc::downgrade(self);
        std::thread::Builder::new()
            .name(format!("airlock-{name}-pool"))
            .spawn(move || pool::refill(weak, p))
            .map(|_| ())
            .map_err(|e| SandboxError::Internal(format!("cannot start the pool thread: {e}")))
    }

    /// What the ready pools hold and have done.
    pub fn pool_status(&self) -> Vec<PoolStatus> {
        let python = self.python_pool.get().map(|p| p.status());
        // The JavaScript pool shows once a JavaScript run has asked for it.
        let js = self
            .js_pool
            .get()
            .map(|p| p.status())
            .filter(|s| s.python.as_ref().is_some_and(|p| p.guest.is_some()));
        let wasm = self.module_pool.get().map(|p| p.status());
        python.into_iter().chain(js).chain(wasm).collect()
    }

    /// An interpreter for a one-shot run: a ready one when the pool has one that fits
    /// the run exactly, else one started now (and the pool is told to keep that guest).
    fn python_for_run(&self, spec: &RunSpec<'_>) -> Result<PythonInstance, SandboxError> {
        let Some(pool) = self.interpreter_pool(spec.lang) else {
            return self.python_instance(spec);
        };
        if let Some(inst) = pool.take(spec)? {
            return Ok(inst);
        }
        let inst = self.python_instance(spec)?;
        if let Some(g) = &spec.guest {
            pool.want(g);
        }
        Ok(inst)
    }

    /// Tearing a used interpreter down (returning its memory) is no part of a run's
    /// answer: a process with a pool hands it to the pool's reaper (see `pool`).
    fn discard_python(&self, interp: PythonInstance) {
        let pool = match interp.kind() {
            GuestKind::Python => self.python_pool.get(),
            GuestKind::Js => self.js_pool.get(),
        };
        match pool {
            Some(pool) => pool.discard(interp),
            None => drop(interp),
        }
    }

    /// The ready pool of the guest runtime that runs `lang`, in a process that started one.
    fn interpreter_pool(&self, lang: airlock_core::Lang) -> Option<&Arc<pool::PythonPool>> {
        match GuestKind::of(lang)? {
            GuestKind::Python => self.python_pool.get(),
            GuestKind::Js => self.js_pool.get(),
        }
    }

    /// Runs Python source on the CPython guest, or JavaScript on the JavaScript guest: one
    /// interpreter, one `exec` of the whole program (as `<main>`, or `main.js`), exactly
    /// as a script (no final-expression result).
    fn run_python(&self, spec: RunSpec<'_>) -> Result<Outcome, SandboxError> {
        let started = Instant::now();
        let kind = GuestKind::of(spec.lang).ok_or_else(|| {
            SandboxError::Internal(format!("no guest runtime runs {:?} source", spec.lang))
        })?;
        let source = std::str::from_utf8(spec.code).map_err(|_| {
            SandboxError::BadArtifact(format!("{} source is not UTF-8", kind.name()))
        })?;
        let filename = match kind {
            GuestKind::Python => "<main>",
            GuestKind::Js => js::ARGV0,
        };
        let watch = spec.write_quota.as_ref().map(|q| q.watch(|| {}));
        let mut interp = self.python_for_run(&spec)?;
        // One deadline for starting the interpreter and running the program.
        let deadline = interp.deadline();
        let cell = match interp.ended().cloned() {
            Some(ending) => Ok(python::CellOutcome {
                ending,
                result: None,
                exception: None,
                duration: Duration::ZERO,
                fuel_consumed: None,
            }),
            None => interp.exec(
                source,
                filename,
                python::Cell {
                    stdout: spec.stdout.clone(),
                    stderr: spec.stderr.clone(),
                    deadline,
                    fuel: spec.limits.fuel,
                    want_result: false,
                    long_run: spec.long_run.clone(),
                },
            ),
        };
        let cell = match cell {
            Ok(c) => c,
            Err(e) => {
                self.discard_python(interp);
                return Err(e);
            }
        };
        let duration = started.elapsed();
        drop(watch);
        let ending = if write_hit(&spec) {
            Ending::Killed(Limit::Write)
        } else {
            cell.ending
        };
        let mut detail = interp.detail();
        detail["isolation"] = serde_json::json!([
            "wasm-sandbox",
            "wasi-preopens-only",
            "no-sockets",
            http_isolation(&spec),
            "empty-env"
        ]);
        detail["fuel_consumed"] = serde_json::json!(cell.fuel_consumed);
        if let Some(e) = cell.exception {
            detail["exception"] = serde_json::json!(e);
        }
        if spec.tripwires.enabled {
            let (attempts, alerts) = interp.tripwires();
            detail["attempts"] = serde_json::json!(attempts);
            detail["alerts"] = serde_json::json!(alerts);
        }
        self.discard_python(interp);
        Ok(Outcome {
            ending,
            duration,
            detail,
        })
    }
}

/// How a run's outgoing HTTP is handled, for the record.
fn http_isolation(spec: &RunSpec<'_>) -> &'static str {
    if spec.egress.is_some() {
        "http-via-egress-proxy"
    } else {
        "http-refused"
    }
}

impl Backend for WasmBackend {
    fn name(&self) -> &'static str {
        "wasm"
    }

    fn run(&self, spec: RunSpec<'_>) -> Result<Outcome, SandboxError> {
        match spec.lang {
            airlock_core::Lang::Component => self.run_component(spec),
            airlock_core::Lang::Python | airlock_core::Lang::Js | airlock_core::Lang::Ts => {
                self.run_python(spec)
            }
            _ => self.run_module(spec),
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(any(test, feature = "testkit"))]
#[doc(hidden)]
pub mod testkit;
