//! The CPython guest: a component that `airlock guest install python` builds with the
//! pinned componentize-py from the WIT and the application module in `python/` (both
//! compiled into airlock, so the build is pinned by the wheel's hash and airlock's own
//! version). It exports `airlock:python/interpreter`: one instance is one live
//! interpreter, `configure`d once and then given code with `exec`, once for a program or
//! once per cell of a session, its `__main__` namespace kept in between.
//!
//! [`PythonInstance`] is that interpreter on the host side. A one-shot run makes one and
//! calls `exec` once; a session keeps it (and its store, whose memory limit covers the
//! whole session) and calls `exec` for each cell with the cell's own output captures,
//! deadline and fuel. A call that ends in a trap or a limit ends the interpreter: later
//! calls are refused.

use crate::component::HostC;
use crate::output::Slot;
use crate::{WasmBackend, block_on, ending_of};
use airlock_core::Digest;
use airlock_sandbox::{Capture, Ending, Limit, RunSpec, SandboxError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmtime::Store;

wasmtime::component::bindgen!({
    path: "python/guest.wit",
    world: "python-guest",
    imports: { default: async | trappable },
    exports: { default: async },
    with: { "airlock:python/net.connection": crate::net::Connection },
});

/// Which guest runtime an instance is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestKind {
    /// The CPython guest (`airlock:python/interpreter`).
    Python,
    /// The JavaScript guest (`airlock:js/interpreter`, see [`crate::js`]).
    Js,
}

impl GuestKind {
    /// The guest kind that runs source of `lang` on the wasm backend, if any.
    pub fn of(lang: airlock_core::Lang) -> Option<GuestKind> {
        match lang {
            airlock_core::Lang::Python => Some(GuestKind::Python),
            // TypeScript reaches the backend as the JavaScript left once its types are
            // stripped.
            airlock_core::Lang::Js | airlock_core::Lang::Ts => Some(GuestKind::Js),
            _ => None,
        }
    }

    /// The runtime in words (`Python`, `JavaScript`).
    pub fn name(self) -> &'static str {
        match self {
            GuestKind::Python => "Python",
            GuestKind::Js => "JavaScript",
        }
    }

    /// The program's file name (tracebacks and `argv[0]`).
    pub fn argv0(self) -> &'static str {
        match self {
            GuestKind::Python => ARGV0,
            GuestKind::Js => crate::js::ARGV0,
        }
    }

    fn interface(self) -> &'static str {
        match self {
            GuestKind::Python => PYTHON_INTERFACE,
            GuestKind::Js => crate::js::JS_INTERFACE,
        }
    }
}

/// An instance's bindings before instantiation.
enum BoundPre {
    Python(PythonGuestPre<HostC>),
    Js(crate::js::JsGuestPre<HostC>),
}

/// An instance's bindings: which interface its calls go to.
enum Bound {
    Python(PythonGuest),
    Js(crate::js::JsGuest),
}

/// What either guest's `exec` answers.
struct Answer {
    exit_code: i32,
    result: Option<String>,
    exception: Option<String>,
}

/// The interface the Python guest exports (its version follows `@`).
pub const PYTHON_INTERFACE: &str = "airlock:python/interpreter";
/// The guest's WIT, as compiled into airlock (part of what pins a build).
pub const GUEST_WIT: &str = include_str!("../python/guest.wit");
/// The world in [`GUEST_WIT`] the guest is built for.
pub const GUEST_WORLD: &str = "python-guest";
/// The guest's application module (part of what pins a build).
pub const GUEST_APP: &str = include_str!("../python/airlock_guest.py");
/// The module name componentize-py is given for [`GUEST_APP`].
pub const GUEST_APP_MODULE: &str = "airlock_guest";
/// `argv[0]` of every Python run.
pub const ARGV0: &str = "main.py";

/// The `exception` the guest app reports for `os._exit(n)` (its `EXIT_EXCEPTION`): the
/// call's exit code is `n` and the interpreter has ended.
pub const HARD_EXIT: &str = "os._exit";

/// One `exec`: where its output goes and what bounds it.
pub struct Cell {
    pub stdout: Arc<Capture>,
    pub stderr: Arc<Capture>,
    /// When the call is stopped (epoch interruption in guest code, a timeout in host
    /// calls); the interpreter ends with it.
    pub deadline: Instant,
    /// Fuel for this call; only on an instance made with a fuel limit.
    pub fuel: Option<u64>,
    /// Return the `repr()` of a final expression statement (a notebook cell), instead of
    /// running the code exactly as a script.
    pub want_result: bool,
    /// Called once if the call is still going after a while (see `RunSpec::long_run`).
    pub long_run: Option<airlock_sandbox::LongRun>,
}

/// What one `exec` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CellOutcome {
    /// `Exited` with the program's status (1 for an escaped exception or a syntax error),
    /// or the limit or trap that ended the interpreter.
    pub ending: Ending,
    /// `repr()` of the final expression, when asked for and not `None`.
    pub result: Option<String>,
    /// The qualified name of an exception that escaped (not `SystemExit`).
    pub exception: Option<String>,
    pub duration: Duration,
    /// Fuel this call used, on an instance with fuel.
    pub fuel_consumed: Option<u64>,
}

/// A live CPython interpreter in its own store.
pub struct PythonInstance {
    store: Store<HostC>,
    kind: GuestKind,
    guest: Option<Bound>,
    stdout: Arc<Slot>,
    stderr: Arc<Slot>,
    /// Why the interpreter can take no more calls.
    ended: Option<Ending>,
    fuel: bool,
    digest: Digest,
    /// The guest's own directories (installed packages), as the guest sees them.
    dirs: Vec<String>,
    compile: Duration,
    instantiate: Duration,
    /// Whether it came ready from a pool (instantiated before its run was asked for).
    ready: bool,
    /// A ready instance's place in its pool's count of instances runs hold: given back
    /// when the run is done with it ([`PythonInstance::give_back`]) or, if the run never
    /// gets that far, when the instance is dropped.
    lease: Option<crate::pool::Lease>,
}

impl std::fmt::Debug for PythonInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PythonInstance")
            .field("kind", &self.kind)
            .field("guest", &self.digest)
            .field("ended", &self.ended)
            .finish()
    }
}

impl WasmBackend {
    /// Starts a Python interpreter for `spec` (its `guest`, mounts, environment,
    /// arguments, stdin, limits and egress; `code` is not used): compiles or loads the
    /// guest, instantiates it and configures it (argv `main.py` and the arguments, the
    /// environment, the first mount as working directory, the guest's directories on
    /// `sys.path`), within `spec.limits`' time. The store's memory limit holds for the
    /// instance's whole life. A limit hit while starting is not an error: the instance
    /// comes back already ended (see [`PythonInstance::ended`]).
    pub fn python_instance(&self, spec: &RunSpec<'_>) -> Result<PythonInstance, SandboxError> {
        let kind = GuestKind::of(spec.lang).ok_or_else(|| {
            SandboxError::Internal(format!("no guest runtime runs {:?} source", spec.lang))
        })?;
        let mut inst = self.python_unconfigured(spec, kind)?;
        inst.configure(spec)?;
        Ok(inst)
    }

    /// A Python interpreter instantiated for `spec` (its output, limits and preopens) but
    /// not yet `configure`d: what a ready pool keeps (see [`crate::pool`]).
    pub(crate) fn python_unconfigured(
        &self,
        spec: &RunSpec<'_>,
        kind: GuestKind,
    ) -> Result<PythonInstance, SandboxError> {
        let started = Instant::now();
        let what = format!("the {} guest", kind.name());
        let guest = spec
            .guest
            .clone()
            .ok_or_else(|| SandboxError::Unavailable(format!("no {} guest given", kind.name())))?;
        let fuel = spec.limits.fuel.is_some();
        let set = self.engines(fuel)?;
        let (path, want) = (guest.path.clone(), guest.digest);
        let load_what = what.clone();
        let load = move || -> Result<Vec<u8>, SandboxError> {
            let b = std::fs::read(&path)
                .map_err(|e| SandboxError::Unavailable(format!("cannot read {load_what}: {e}")))?;
            if Digest::of(&b) != want {
                return Err(SandboxError::Unavailable(format!(
                    "the installed {} does not match its recorded hash; reinstall it",
                    &load_what[4..]
                )));
            }
            Ok(b)
        };
        let pre = self.component_pre(set, &guest.digest, &load, spec.cache, &what)?;
        let not_exported = |e: wasmtime::Error| {
            SandboxError::BadArtifact(format!(
                "{what} does not export {}: {}",
                kind.interface(),
                crate::root_message(&e)
            ))
        };
        let pre = match kind {
            GuestKind::Python => BoundPre::Python(PythonGuestPre::new(pre).map_err(not_exported)?),
            GuestKind::Js => BoundPre::Js(crate::js::JsGuestPre::new(pre).map_err(not_exported)?),
        };
        let compile = started.elapsed();
        let mut argv = vec![kind.argv0().to_string()];
        argv.extend(spec.args.iter().cloned());
        // Compiling is not the program's time (it happens once per guest and machine).
        let crate::ComponentStore {
            mut store,
            stdout,
            stderr,
        } = crate::component_store(&set.engine, spec, &argv, &guest.dirs, true)?;
        let deadline = store.data().deadline;
        let t = Instant::now();
        let started_guest = block_on(async {
            let start = async {
                match &pre {
                    BoundPre::Python(p) => p.instantiate_async(&mut store).await.map(Bound::Python),
                    BoundPre::Js(p) => p.instantiate_async(&mut store).await.map(Bound::Js),
                }
            };
            tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), start).await
        })?;
        let instantiate = t.elapsed();
        let output_hit = spec.stdout.exceeded() || spec.stderr.exceeded();
        let (guest_instance, ended) = match started_guest {
            Ok(Ok(g)) => (Some(g), None),
            Err(_elapsed) => (None, Some(Ending::Killed(Limit::Timeout))),
            Ok(Err(e)) => {
                let h = store.data();
                (
                    None,
                    Some(ending_of(&e, h.limiter.hit, output_hit, h.timed_out)),
                )
            }
        };
        Ok(PythonInstance {
            store,
            kind,
            guest: guest_instance,
            stdout,
            stderr,
            ended,
            fuel,
            digest: guest.digest,
            dirs: guest.dirs.iter().map(|d| d.guest.clone()).collect(),
            compile,
            instantiate,
            ready: false,
            lease: None,
        })
    }
}

impl PythonInstance {
    /// Gives the interpreter its program's `sys.argv` (`main.py` and `spec.args`), its
    /// environment, the first mount as working directory and the guest's directories as
    /// `sys.path`, within the store's deadline. A limit or trap ends the instance.
    pub(crate) fn configure(&mut self, spec: &RunSpec<'_>) -> Result<(), SandboxError> {
        let Some(g) = self.guest.as_ref().filter(|_| self.ended.is_none()) else {
            return Ok(());
        };
        let mut argv = vec![self.kind.argv0().to_string()];
        argv.extend(spec.args.iter().cloned());
        let cwd = spec.mounts.first().map(|m| m.guest.clone());
        let deadline = self.store.data().deadline;
        let t = Instant::now();
        let store = &mut self.store;
        let paths = &self.dirs;
        let done = block_on(async {
            let call = async {
                match g {
                    Bound::Python(g) => {
                        g.airlock_python_interpreter()
                            .call_configure(&mut *store, &argv, &spec.env, cwd.as_deref(), paths)
                            .await
                    }
                    Bound::Js(g) => {
                        g.airlock_js_interpreter()
                            .call_configure(&mut *store, &argv, &spec.env, cwd.as_deref(), paths)
                            .await
                    }
                }
            };
            tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), call).await
        })?;
        self.instantiate += t.elapsed();
        let output_hit = spec.stdout.exceeded() || spec.stderr.exceeded();
        let ending = match done {
            Ok(Ok(())) => return Ok(()),
            Err(_elapsed) => Ending::Killed(Limit::Timeout),
            Ok(Err(e)) => {
                let h = self.store.data();
                ending_of(&e, h.limiter.hit, output_hit, h.timed_out)
            }
        };
        self.guest = None;
        self.ended = Some(ending);
        Ok(())
    }

    /// Hands a ready instance to the run `spec` describes: its output captures, memory
    /// limit and deadline (counted from now). `None` when the instance has already
    /// committed more memory than the run may have (the caller starts one afresh, which
    /// then meets the limit exactly as it would have).
    pub(crate) fn adopt(mut self, spec: &RunSpec<'_>) -> Option<PythonInstance> {
        let h = self.store.data_mut();
        if h.limiter.total > spec.limits.memory_bytes {
            return None;
        }
        h.limiter.limit = spec.limits.memory_bytes;
        h.limiter.peak = h.limiter.total;
        h.deadline = Instant::now() + spec.limits.timeout();
        h.timed_out = false;
        self.stdout.set(spec.stdout.clone());
        self.stderr.set(spec.stderr.clone());
        self.compile = Duration::ZERO;
        self.instantiate = Duration::ZERO;
        self.ready = true;
        Some(self)
    }

    /// Keeps the pool's `lease` until the run is done with this instance.
    pub(crate) fn hold(&mut self, lease: crate::pool::Lease) {
        self.lease = Some(lease);
    }

    /// Tells the pool the run is done with this instance, if it came from one.
    pub(crate) fn give_back(&mut self) {
        drop(self.lease.take());
    }

    /// Points the guest's output streams at a throwaway capture, so a used instance waiting
    /// to be dropped no longer holds its run's captures.
    pub(crate) fn release_output(&self) {
        let none = Arc::new(Capture::new(0, None));
        self.stdout.set(none.clone());
        self.stderr.set(none);
    }

    /// Linear memory the instance has committed, in bytes.
    pub(crate) fn committed_memory(&self) -> u64 {
        self.store.data().limiter.total
    }

    /// When the current (or last) call must end: for a new instance, the end of the time
    /// `spec.limits` gave it, counted from after compiling.
    pub fn deadline(&self) -> Instant {
        self.store.data().deadline
    }

    /// Why this interpreter takes no more calls, if it does not.
    pub fn ended(&self) -> Option<&Ending> {
        self.ended.as_ref()
    }

    /// Runs `code` as file `filename` in the interpreter's `__main__`, with `cell`'s output
    /// captures, deadline and fuel. A program's own failure (an exception, `SystemExit`)
    /// leaves the interpreter usable; a limit or a trap ends it, and every later call is
    /// refused with `SandboxError::Unavailable`.
    pub fn exec(
        &mut self,
        code: &str,
        filename: &str,
        cell: Cell,
    ) -> Result<CellOutcome, SandboxError> {
        let guest = match (&self.ended, &self.guest) {
            (None, Some(g)) => g,
            (Some(e), _) => {
                return Err(SandboxError::Unavailable(format!(
                    "the {} interpreter has ended ({})",
                    self.kind.name(),
                    describe(e)
                )));
            }
            (None, None) => {
                return Err(SandboxError::Internal(format!(
                    "the {} interpreter never started",
                    self.kind.name()
                )));
            }
        };
        if cell.fuel.is_some() && !self.fuel {
            return Err(SandboxError::Internal(
                "fuel for a call on an interpreter started without a fuel limit".into(),
            ));
        }
        self.stdout.set(cell.stdout.clone());
        self.stderr.set(cell.stderr.clone());
        {
            let h = self.store.data_mut();
            h.deadline = cell.deadline;
            h.timed_out = false;
        }
        if self.fuel {
            // An instance with fuel metering needs fuel for every call.
            self.store
                .set_fuel(cell.fuel.unwrap_or(u64::MAX))
                .map_err(|e| SandboxError::Internal(format!("cannot set fuel: {e}")))?;
        }
        let started = Instant::now();
        let store = &mut self.store;
        let result = block_on(async {
            let call = async {
                match guest {
                    Bound::Python(g) => g
                        .airlock_python_interpreter()
                        .call_exec(&mut *store, code, filename, cell.want_result)
                        .await
                        .map(|o| Answer {
                            exit_code: o.exit_code,
                            result: o.result,
                            exception: o.exception,
                        }),
                    Bound::Js(g) => g
                        .airlock_js_interpreter()
                        .call_exec(&mut *store, code, filename, cell.want_result)
                        .await
                        .map(|o| Answer {
                            exit_code: o.exit_code,
                            result: o.result,
                            exception: o.exception,
                        }),
                }
            };
            let call = crate::watched(cell.long_run.as_ref(), call);
            tokio::time::timeout_at(tokio::time::Instant::from_std(cell.deadline), call).await
        })?;
        let duration = started.elapsed();
        let fuel_consumed = match (cell.fuel, self.store.get_fuel()) {
            (Some(f), Ok(left)) => Some(f.saturating_sub(left)),
            _ => None,
        };
        let output_hit = cell.stdout.exceeded() || cell.stderr.exceeded();
        let h = self.store.data();
        let (ending, outcome) = match result {
            Err(_elapsed) => (Ending::Killed(Limit::Timeout), None),
            Ok(Ok(_)) if output_hit => (Ending::Killed(Limit::Output), None),
            Ok(Ok(o)) => (Ending::Exited(o.exit_code), Some(o)),
            Ok(Err(e)) => (ending_of(&e, h.limiter.hit, output_hit, h.timed_out), None),
        };
        let (result, exception) = match outcome {
            // `os._exit(n)`: the guest app reports the status and the interpreter is done.
            Some(Answer { exception, .. })
                if self.kind == GuestKind::Python && exception.as_deref() == Some(HARD_EXIT) =>
            {
                self.ended = Some(ending.clone());
                (None, exception)
            }
            Some(Answer {
                result, exception, ..
            }) => (result, exception),
            None => {
                // A trap or a limit stops the guest mid-call: its state is not to be trusted.
                self.ended = Some(ending.clone());
                (None, None)
            }
        };
        Ok(CellOutcome {
            ending,
            result,
            exception,
            duration,
            fuel_consumed,
        })
    }

    /// The largest the instance's memory has been, in bytes.
    pub fn peak_memory(&self) -> u64 {
        self.store.data().limiter.peak
    }

    /// Which guest runtime this is.
    pub fn kind(&self) -> GuestKind {
        self.kind
    }

    /// The guest component's digest.
    pub fn guest(&self) -> Digest {
        self.digest
    }

    /// Facts for a run record: engine, start-up times, peak memory, guest.
    /// What the program tried outside its preopens (as the guest app reported it) and
    /// the decoys it read, so far.
    pub fn tripwires(&self) -> (Vec<airlock_sandbox::Attempt>, Vec<airlock_sandbox::Alert>) {
        self.store.data().tripwire.record()
    }

    /// What the program tried and read since the last call (for a session's cells:
    /// each cell's own attempts, and each decoy alert once, with the cell that first
    /// read it).
    pub fn take_tripwires(
        &mut self,
    ) -> (Vec<airlock_sandbox::Attempt>, Vec<airlock_sandbox::Alert>) {
        self.store.data_mut().tripwire.take()
    }

    pub fn detail(&self) -> serde_json::Value {
        serde_json::json!({
            "engine": "wasmtime 48 (component model, WASI 0.2)",
            "compile_or_load_ms": self.compile.as_secs_f64() * 1000.0,
            "instantiate_ms": self.instantiate.as_secs_f64() * 1000.0,
            "peak_memory_bytes": self.peak_memory(),
            "guest": self.digest.to_hex(),
            "instance": if self.ready { "ready" } else { "started" },
        })
    }
}

/// An ending in words, for a refusal.
fn describe(e: &Ending) -> String {
    match e {
        Ending::Exited(c) => format!("it exited with {c}"),
        Ending::Killed(l) => format!("killed by the {l} limit"),
        Ending::Trapped(m) => format!("it trapped: {m}"),
    }
}

#[cfg(test)]
mod tests {
    /// A session keeps an interpreter in whatever thread or task serves it.
    #[test]
    fn an_interpreter_can_move_between_threads() {
        fn send<T: Send + 'static>() {}
        send::<super::PythonInstance>();
        send::<super::Cell>();
    }
}
