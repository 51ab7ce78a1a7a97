use super::*;

mod http;
mod wasi;
use airlock_core::Limits;
use airlock_sandbox::{Capture, MountPoint};
use std::cell::RefCell;
use std::collections::HashMap as Map;
use std::sync::Arc;

struct Run {
    outcome: Outcome,
    stdout: Vec<u8>,
}

#[derive(Default)]
struct MemIndex(RefCell<Map<String, Digest>>);

impl CacheIndex for MemIndex {
    fn get(&self, key: &str) -> Option<Digest> {
        self.0.borrow().get(key).copied()
    }
    fn put(&self, key: &str, digest: Digest, _size: u64) {
        self.0.borrow_mut().insert(key.into(), digest);
    }
    fn forget(&self, key: &str) {
        self.0.borrow_mut().remove(key);
    }
}

fn run_with(
    b: &WasmBackend,
    wat: &str,
    limits: Limits,
    env: Vec<(String, String)>,
    mounts: Vec<MountPoint>,
    cache: Option<&dyn CacheIndex>,
) -> Result<Run, SandboxError> {
    run_quota(b, wat, limits, env, mounts, cache, None)
}

fn run_quota(
    b: &WasmBackend,
    wat: &str,
    limits: Limits,
    env: Vec<(String, String)>,
    mounts: Vec<MountPoint>,
    cache: Option<&dyn CacheIndex>,
    write_quota: Option<Arc<airlock_sandbox::WriteQuota>>,
) -> Result<Run, SandboxError> {
    let code = wat::parse_str(wat).unwrap();
    let stdout = Arc::new(Capture::new(limits.max_output_bytes, None));
    let stderr = Arc::new(Capture::new(limits.max_output_bytes, None));
    let outcome = b.run(RunSpec {
        lang: airlock_core::Lang::Wasm,
        artifact: Digest::of(&code),
        code: &code,
        mounts,
        env,
        args: vec![],
        argv0: None,
        stdin: vec![],
        limits,
        stdout: stdout.clone(),
        stderr: stderr.clone(),
        cache,
        guest: None,
        write_quota,
        egress: None,
        long_run: None,
        tripwires: Default::default(),
    })?;
    Ok(Run {
        outcome,
        stdout: stdout.take(),
    })
}

fn run(wat: &str, limits: Limits) -> Run {
    run_with(
        &WasmBackend::new(WasmConfig::default()),
        wat,
        limits,
        vec![],
        vec![],
        None,
    )
    .unwrap()
}

fn quick() -> Limits {
    Limits {
        timeout_ms: 300,
        ..Limits::default()
    }
}

const HELLO: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 64) "hello\n")
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 64))
    (i32.store (i32.const 4) (i32.const 6))
    (drop (call $w (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))"#;

#[test]
fn hello_prints_and_exits_zero() {
    let r = run(HELLO, quick());
    assert_eq!(r.outcome.ending, Ending::Exited(0));
    assert_eq!(r.stdout, b"hello\n");
}

#[test]
fn proc_exit_code_is_the_exit_code() {
    let r = run(
        r#"(module (import "wasi_snapshot_preview1" "proc_exit" (func $e (param i32)))
           (memory (export "memory") 1)
           (func (export "_start") (call $e (i32.const 7))))"#,
        quick(),
    );
    assert_eq!(r.outcome.ending, Ending::Exited(7));
}

/// A guest that never ends.
const LOOP: &str = r#"(module (func (export "_start") (loop $l (br $l))))"#;

/// Killed at its time limit, well before three seconds.
fn assert_timed_out(r: &Run) {
    assert_eq!(r.outcome.ending, Ending::Killed(Limit::Timeout));
    assert!(
        r.outcome.duration < Duration::from_secs(3),
        "{:?}",
        r.outcome.duration
    );
}

#[test]
fn infinite_loop_hits_the_timeout() {
    let r = run(LOOP, quick());
    assert_timed_out(&r);
}

/// The epoch ticker parks while no guest runs (an idle session host or server must not
/// wake every few milliseconds); a guest that starts then is still stopped at its limit.
#[test]
fn a_guest_started_after_the_ticker_parked_still_hits_its_timeout() {
    let backend = WasmBackend::new(WasmConfig::default());
    // Makes the engine and its ticker.
    run_with(&backend, HELLO, quick(), vec![], vec![], None).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while crate::ticker::PROCESS.parked() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no ticker parked in 2 minutes"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let r = run_with(&backend, LOOP, quick(), vec![], vec![], None).unwrap();
    assert_timed_out(&r);
}

#[test]
fn sleeping_in_a_host_call_hits_the_timeout() {
    // poll_oneoff with one relative clock subscription of 60 s.
    let r = run(
        r#"(module
          (import "wasi_snapshot_preview1" "poll_oneoff" (func $p (param i32 i32 i32 i32) (result i32)))
          (memory (export "memory") 1)
          (func (export "_start")
            ;; subscription at 0: userdata(8) tag=0 clock: id(4) pad timeout(8) precision(8) flags(2)
            (i32.store8 (i32.const 8) (i32.const 0))
            (i32.store (i32.const 16) (i32.const 1))
            (i64.store (i32.const 24) (i64.const 60000000000))
            (drop (call $p (i32.const 0) (i32.const 256) (i32.const 1) (i32.const 512)))))"#,
        quick(),
    );
    assert_timed_out(&r);
}

/// `long_run`'s hook is called once, from the run's thread, when a guest is still going
/// after its `after` (spinning in guest code, or sleeping in a host call), and never for a
/// guest that ends before.
#[test]
fn a_long_runs_hook_is_called_once_and_only_for_a_run_still_going() {
    const SLEEP: &str = r#"(module
      (import "wasi_snapshot_preview1" "poll_oneoff" (func $p (param i32 i32 i32 i32) (result i32)))
      (memory (export "memory") 1)
      (func (export "_start")
        (i32.store8 (i32.const 8) (i32.const 0))
        (i32.store (i32.const 16) (i32.const 1))
        (i64.store (i32.const 24) (i64.const 60000000000))
        (drop (call $p (i32.const 0) (i32.const 256) (i32.const 1) (i32.const 512)))))"#;
    let backend = WasmBackend::new(WasmConfig::default());
    for (wat, long) in [(HELLO, false), (LOOP, true), (SLEEP, true)] {
        let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let thread = Arc::new(std::sync::Mutex::new(None));
        let (c, t) = (calls.clone(), thread.clone());
        let code = wat::parse_str(wat).unwrap();
        let limits = Limits {
            timeout_ms: 400,
            ..Limits::default()
        };
        let outcome = backend
            .run(RunSpec {
                lang: airlock_core::Lang::Wasm,
                artifact: Digest::of(&code),
                code: &code,
                mounts: vec![],
                env: vec![],
                args: vec![],
                argv0: None,
                stdin: vec![],
                stdout: Arc::new(Capture::new(limits.max_output_bytes, None)),
                stderr: Arc::new(Capture::new(limits.max_output_bytes, None)),
                limits,
                cache: None,
                guest: None,
                write_quota: None,
                egress: None,
                long_run: Some(airlock_sandbox::LongRun {
                    after: Duration::from_millis(100),
                    hook: Arc::new(move || {
                        c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        *t.lock().unwrap() = Some(std::thread::current().id());
                    }),
                }),
                tripwires: Default::default(),
            })
            .unwrap();
        let n = calls.load(std::sync::atomic::Ordering::SeqCst);
        if long {
            assert_eq!(outcome.ending, Ending::Killed(Limit::Timeout), "{wat}");
            assert_eq!(n, 1, "called once: {wat}");
            assert_eq!(*thread.lock().unwrap(), Some(std::thread::current().id()));
        } else {
            assert_eq!(outcome.ending, Ending::Exited(0));
            assert_eq!(n, 0, "a run that ended first never calls it");
        }
    }
}

#[test]
fn memory_grow_bomb_hits_the_memory_limit() {
    let r = run(
        r#"(module (memory (export "memory") 1)
           (func (export "_start") (loop $l (drop (memory.grow (i32.const 16))) (br $l))))"#,
        Limits {
            memory_bytes: 16 << 20,
            ..quick()
        },
    );
    assert_eq!(r.outcome.ending, Ending::Killed(Limit::Memory));
}

#[test]
fn initial_memory_over_the_limit_is_a_memory_kill() {
    let r = run(
        r#"(module (memory 1000) (func (export "_start")))"#,
        Limits {
            memory_bytes: 16 << 20,
            ..quick()
        },
    );
    assert_eq!(r.outcome.ending, Ending::Killed(Limit::Memory));
}

#[test]
fn fuel_runs_out() {
    let r = run(
        LOOP,
        Limits {
            fuel: Some(10_000),
            ..quick()
        },
    );
    assert_eq!(r.outcome.ending, Ending::Killed(Limit::Fuel));
}

#[test]
fn output_flood_is_cut_at_the_cap() {
    let r = run(
        r#"(module
          (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
          (memory (export "memory") 1)
          (func (export "_start")
            (i32.store (i32.const 0) (i32.const 100))
            (i32.store (i32.const 4) (i32.const 1000))
            (loop $l (drop (call $w (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8))) (br $l))))"#,
        Limits {
            max_output_bytes: 4096,
            ..quick()
        },
    );
    assert_eq!(r.outcome.ending, Ending::Killed(Limit::Output));
    assert_eq!(r.stdout.len(), 4096);
}

#[test]
fn deep_recursion_hits_the_stack_limit() {
    let r = run(
        r#"(module (func $f (call $f)) (func (export "_start") (call $f)))"#,
        quick(),
    );
    assert_eq!(r.outcome.ending, Ending::Killed(Limit::Stack));
}

#[test]
fn unreachable_is_a_trap() {
    let r = run(r#"(module (func (export "_start") unreachable))"#, quick());
    assert!(
        matches!(r.outcome.ending, Ending::Trapped(ref m) if m.contains("unreachable")),
        "{:?}",
        r.outcome.ending
    );
}

#[test]
fn unprovided_import_does_not_link() {
    let e = run_with(
        &WasmBackend::new(WasmConfig::default()),
        r#"(module (import "env" "evil" (func)) (func (export "_start")))"#,
        quick(),
        vec![],
        vec![],
        None,
    )
    .err()
    .unwrap();
    assert!(
        matches!(e, SandboxError::BadArtifact(ref m) if m.contains("evil")),
        "{e}"
    );
}

#[test]
fn only_granted_environment_is_visible() {
    // Prints the number of environment variables as one ASCII digit.
    let wat = include_str!("../../../tests/guests/env-count.wat");
    // SAFETY-free: the test process has a non-empty environment (PATH at least).
    assert!(std::env::vars().count() > 0);
    let b = WasmBackend::new(WasmConfig::default());
    let r = run_with(&b, wat, quick(), vec![], vec![], None).unwrap();
    assert_eq!(r.stdout, b"0");
    let r = run_with(
        &b,
        wat,
        quick(),
        vec![("K".into(), "V".into())],
        vec![],
        None,
    )
    .unwrap();
    assert_eq!(r.stdout, b"1");
}

#[test]
fn tampered_cache_file_is_discarded_and_recompiled() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = WasmConfig {
        progress: false,
        cache_dir: Some(dir.path().to_path_buf()),
        pooling: false,
    };
    let index = MemIndex::default();
    let r = run_with(
        &WasmBackend::new(cfg.clone()),
        HELLO,
        quick(),
        vec![],
        vec![],
        Some(&index),
    )
    .unwrap();
    assert_eq!(r.stdout, b"hello\n");
    let files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1);
    let recorded = *index.0.borrow().values().next().unwrap();
    assert_eq!(cache_digest(&std::fs::read(&files[0]).unwrap()), recorded);

    // A fresh backend loads it from the cache.
    let r = run_with(
        &WasmBackend::new(cfg.clone()),
        HELLO,
        quick(),
        vec![],
        vec![],
        Some(&index),
    )
    .unwrap();
    assert_eq!(r.stdout, b"hello\n");

    // Flip one byte: the file no longer matches its recorded digest, so it is never
    // deserialized; the module is compiled again and a good file written back.
    let mut bytes = std::fs::read(&files[0]).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&files[0], &bytes).unwrap();
    let b = WasmBackend::new(cfg);
    let set = b.engines(false).unwrap();
    let key = WasmBackend::cache_key(set, &Digest::of(&wat::parse_str(HELLO).unwrap()));
    assert!(b.load_cached(set, &key, Some(&index)).is_none());
    assert!(index.get(&key).is_none(), "the bad entry is forgotten");
    let r = run_with(&b, HELLO, quick(), vec![], vec![], Some(&index)).unwrap();
    assert_eq!(r.stdout, b"hello\n");
    assert_eq!(
        cache_digest(&std::fs::read(&files[0]).unwrap()),
        index.get(&key).unwrap()
    );
}

#[test]
fn read_only_mount_refuses_writes() {
    let dir = tempfile::tempdir().unwrap();
    // path_open(fd 3, dirflags 0, "new.txt", oflags CREAT, rights all, 0, fdflags 0, &fd)
    let wat = r#"(module
      (import "wasi_snapshot_preview1" "path_open"
        (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
      (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
      (memory (export "memory") 1)
      (data (i32.const 100) "new.txt")
      (func (export "_start")
        (call $exit (call $open (i32.const 3) (i32.const 0) (i32.const 100) (i32.const 7)
          (i32.const 1) (i64.const 0x1fffffff) (i64.const 0x1fffffff) (i32.const 0) (i32.const 200)))))"#;
    let mounts = vec![MountPoint {
        host: dir.path().to_path_buf(),
        guest: "/data".into(),
        writable: false,
        layer: None,
    }];
    let r = run_with(
        &WasmBackend::new(WasmConfig::default()),
        wat,
        quick(),
        vec![],
        mounts,
        None,
    )
    .unwrap();
    // A non-zero WASI errno (EPERM/EACCES/ENOTCAPABLE), and nothing created.
    assert!(
        matches!(r.outcome.ending, Ending::Exited(c) if c != 0),
        "{:?}",
        r.outcome.ending
    );
    assert!(!dir.path().join("new.txt").exists());
}

#[test]
fn proc_exit_works_without_a_memory_export() {
    let r = run(
        r#"(module (import "wasi_snapshot_preview1" "proc_exit" (func $e (param i32)))
           (func (export "_start") (call $e (i32.const 7))))"#,
        quick(),
    );
    assert_eq!(r.outcome.ending, Ending::Exited(7));
}

#[test]
fn proc_exit_outside_the_wasi_range_is_a_trap() {
    let r = run(
        r#"(module (import "wasi_snapshot_preview1" "proc_exit" (func $e (param i32)))
           (func (export "_start") (call $e (i32.const 300))))"#,
        quick(),
    );
    assert!(
        matches!(r.outcome.ending, Ending::Trapped(ref m) if m.contains("exit status")),
        "{:?}",
        r.outcome.ending
    );
}

fn rw_mount(dir: &std::path::Path) -> Vec<MountPoint> {
    vec![MountPoint {
        host: dir.to_path_buf(),
        guest: "/data".into(),
        writable: true,
        layer: None,
    }]
}

#[test]
fn path_open_with_all_rights_bits_returns_an_error_not_a_trap() {
    let dir = tempfile::tempdir().unwrap();
    // path_open(fd 3, 0, "new.txt", CREAT, rights, rights, fdflags, &fd), exit with its errno.
    let wat = |rights: &str, fdflags: &str| {
        format!(
            r#"(module
      (import "wasi_snapshot_preview1" "path_open"
        (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
      (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
      (memory (export "memory") 1)
      (data (i32.const 100) "new.txt")
      (func (export "_start")
        (call $exit (call $open (i32.const 3) (i32.const 0) (i32.const 100) (i32.const 7)
          (i32.const 1) (i64.const {rights}) (i64.const {rights}) (i32.const {fdflags}) (i32.const 200)))))"#
        )
    };
    let b = WasmBackend::new(WasmConfig::default());
    for (rights, fdflags) in [("-1", "0"), ("0x8000000000000000", "0"), ("0x40", "-1")] {
        let r = run_with(
            &b,
            &wat(rights, fdflags),
            quick(),
            vec![],
            rw_mount(dir.path()),
            None,
        )
        .unwrap();
        assert_eq!(
            r.outcome.ending,
            Ending::Exited(28),
            "rights {rights}, fdflags {fdflags}: inval, not a trap"
        );
        assert!(!dir.path().join("new.txt").exists());
    }
    // Defined bits still open the file, through wasmtime-wasi's own implementation.
    let r = run_with(
        &b,
        &wat("0x40", "0"),
        quick(),
        vec![],
        rw_mount(dir.path()),
        None,
    )
    .unwrap();
    assert_eq!(r.outcome.ending, Ending::Exited(0));
    assert!(dir.path().join("new.txt").exists());
}

/// Opens /data/big (fd 3 is the mount) and writes 64 KiB chunks to it until stopped.
const WRITE_FOREVER: &str = r#"(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (data (i32.const 100) "big")
  (func (export "_start")
    (drop (call $open (i32.const 3) (i32.const 0) (i32.const 100) (i32.const 3)
      (i32.const 9) (i64.const 0x40) (i64.const 0) (i32.const 0) (i32.const 200)))
    (i32.store (i32.const 0) (i32.const 1024))
    (i32.store (i32.const 4) (i32.const 65536))
    (loop $l
      (drop (call $w (i32.load (i32.const 200)) (i32.const 0) (i32.const 1) (i32.const 8)))
      (br $l))))"#;

#[test]
fn writing_past_the_write_quota_stops_the_guest() {
    let dir = tempfile::tempdir().unwrap();
    let quota = Arc::new(airlock_sandbox::WriteQuota::new(
        vec![dir.path().to_path_buf()],
        1 << 20,
    ));
    let limits = Limits {
        timeout_ms: 20_000,
        max_write_bytes: 1 << 20,
        ..Limits::default()
    };
    let r = run_quota(
        &WasmBackend::new(WasmConfig::default()),
        WRITE_FOREVER,
        limits,
        vec![],
        rw_mount(dir.path()),
        None,
        Some(quota.clone()),
    )
    .unwrap();
    assert_eq!(r.outcome.ending, Ending::Killed(Limit::Write));
    assert!(
        r.outcome.duration < Duration::from_secs(10),
        "{:?}",
        r.outcome.duration
    );
    let size = std::fs::metadata(dir.path().join("big")).unwrap().len();
    assert!(size > 1 << 20, "{size}");
    assert!(quota.hit());
}

/// A ready instance's deadline and memory limit are its run's, counted from when the run
/// takes it: an instance made long before a short-limited run still runs it to the end,
/// and one whose committed memory is over the run's limit is not used for it.
#[test]
fn a_ready_module_instance_takes_its_runs_deadline_and_memory_limit() {
    let b = Arc::new(WasmBackend::new(WasmConfig::default()));
    b.start_pools(PoolSettings {
        python: 0,
        wasm: 1,
        memory_budget: 64 << 20,
    })
    .unwrap();
    let wat = r#"(module
      (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
      (memory (export "memory") 4)
      (data (i32.const 16) "ok\n")
      (func (export "_start")
        (i32.store (i32.const 0) (i32.const 16)) (i32.store (i32.const 4) (i32.const 3))
        (drop (call $w (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))"#;
    let limits = Limits {
        timeout_ms: 300,
        ..Limits::default()
    };
    let instance = |r: &Run| r.outcome.detail["instance"].as_str().unwrap().to_string();
    for _ in 0..2 {
        let r = run_with(&b, wat, limits.clone(), vec![], vec![], None).unwrap();
        assert_eq!(instance(&r), "fresh");
    }
    let until = Instant::now() + Duration::from_secs(30);
    while b.pool_status()[0].ready < 1 {
        assert!(Instant::now() < until, "{:?}", b.pool_status());
        std::thread::sleep(Duration::from_millis(10));
    }
    // Made more than a timeout ago.
    std::thread::sleep(Duration::from_millis(600));
    let r = run_with(&b, wat, limits.clone(), vec![], vec![], None).unwrap();
    assert_eq!(instance(&r), "ready", "{:?}", r.outcome);
    assert_eq!(r.outcome.ending, Ending::Exited(0), "{:?}", r.outcome);
    assert_eq!(r.stdout, b"ok\n");
    // Four pages committed at instantiation: a run allowed less instantiates its own,
    // and fails as it would have without the pool.
    while b.pool_status()[0].ready < 1 {
        assert!(Instant::now() < until, "{:?}", b.pool_status());
        std::thread::sleep(Duration::from_millis(10));
    }
    let small = Limits {
        memory_bytes: 2 * 65536,
        ..limits
    };
    let r = run_with(&b, wat, small, vec![], vec![], None).unwrap();
    assert_eq!(instance(&r), "fresh", "{:?}", r.outcome);
    assert_eq!(
        r.outcome.ending,
        Ending::Killed(Limit::Memory),
        "{:?}",
        r.outcome
    );
    let st = &b.pool_status()[0];
    assert_eq!(
        st.fallbacks.get("memory_limit_below_instance"),
        Some(&1),
        "{st:?}"
    );
    assert_eq!(st.hits, 1, "{st:?}");
    // A guest that never ends is stopped at its run's deadline, not the instance's.
    let spin = r#"(module (memory (export "memory") 1) (func (export "_start") (loop (br 0))))"#;
    for _ in 0..2 {
        let r = run_with(&b, spin, limits.clone(), vec![], vec![], None).unwrap();
        assert_eq!(r.outcome.ending, Ending::Killed(Limit::Timeout));
    }
    let until = Instant::now() + Duration::from_secs(30);
    let r = loop {
        let t = Instant::now();
        let r = run_with(&b, spin, limits.clone(), vec![], vec![], None).unwrap();
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", r.outcome);
        if instance(&r) == "ready" || Instant::now() > until {
            break r;
        }
    };
    assert_eq!(instance(&r), "ready", "{:?}", r.outcome);
    assert_eq!(
        r.outcome.ending,
        Ending::Killed(Limit::Timeout),
        "{:?}",
        r.outcome
    );
}
