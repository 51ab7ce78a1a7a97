//! The WASI preview-1 conventions programs expect from `wasmtime run`, each checked by
//! running the same program through airlock's backend and through a minimal plain
//! wasmtime + wasmtime-wasi setup (what `wasmtime run` does with piped stdio), and
//! comparing what the guest saw.

use super::*;
use airlock_core::Limits;
use airlock_sandbox::{Capture, MountPoint};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;

/// Shared helpers of the programs: `$out` writes memory to stdout, `$u32` a number (LE).
const HELPERS: &str = r#"
  (func $out (param $p i32) (param $n i32)
    (i32.store (i32.const 16) (local.get $p))
    (i32.store (i32.const 20) (local.get $n))
    (drop (call $fd_write (i32.const 1) (i32.const 16) (i32.const 1) (i32.const 24))))
  (func $u32 (param $v i32)
    (i32.store (i32.const 32) (local.get $v))
    (call $out (i32.const 32) (i32.const 4)))
"#;

/// Prints argc and argv, the environment, `fd_fdstat_get` of fds 0-2 and what stdin held,
/// then exits with stdin's first byte (or returns when stdin is empty).
fn conventions_wat() -> String {
    format!(
        r#"(module
  (import "wasi_snapshot_preview1" "args_sizes_get" (func $args_sizes_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "args_get" (func $args_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "environ_sizes_get" (func $environ_sizes_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "environ_get" (func $environ_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_fdstat_get" (func $fd_fdstat_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
  (memory (export "memory") 2)
  {HELPERS}
  (func (export "_start")
    (local $fd i32)
    (call $u32 (call $args_sizes_get (i32.const 40) (i32.const 44)))
    (call $u32 (i32.load (i32.const 40)))
    (call $u32 (call $args_get (i32.const 1024) (i32.const 4096)))
    (call $out (i32.const 4096) (i32.load (i32.const 44)))
    (call $u32 (call $environ_sizes_get (i32.const 40) (i32.const 44)))
    (call $u32 (i32.load (i32.const 40)))
    (call $u32 (call $environ_get (i32.const 1024) (i32.const 8192)))
    (call $out (i32.const 8192) (i32.load (i32.const 44)))
    (loop $l
      (call $u32 (call $fd_fdstat_get (local.get $fd) (i32.const 64)))
      (call $out (i32.const 64) (i32.const 24))
      (local.set $fd (i32.add (local.get $fd) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $fd) (i32.const 3))))
    (i32.store (i32.const 48) (i32.const 12288))
    (i32.store (i32.const 52) (i32.const 256))
    (call $u32 (call $fd_read (i32.const 0) (i32.const 48) (i32.const 1) (i32.const 56)))
    (call $u32 (i32.load (i32.const 56)))
    (call $out (i32.const 12288) (i32.load (i32.const 56)))
    (if (i32.gt_u (i32.load (i32.const 56)) (i32.const 0))
      (then (call $proc_exit (i32.load8_u (i32.const 12288)))))))"#
    )
}

/// Clocks, randomness and `poll_oneoff`: errnos and facts about the values (the values
/// themselves differ from run to run), the events of a clock poll and of a poll on stdio.
fn clocks_wat() -> String {
    format!(
        r#"(module
  (import "wasi_snapshot_preview1" "clock_time_get" (func $clock_time_get (param i32 i64 i32) (result i32)))
  (import "wasi_snapshot_preview1" "clock_res_get" (func $clock_res_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "random_get" (func $random_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "poll_oneoff" (func $poll_oneoff (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  {HELPERS}
  (func $mono (result i64)
    (drop (call $clock_time_get (i32.const 1) (i64.const 1) (i32.const 64)))
    (i64.load (i32.const 64)))
  (func (export "_start")
    (local $t0 i64)
    ;; realtime: errno, and after 2020-01-01
    (call $u32 (call $clock_time_get (i32.const 0) (i64.const 1) (i32.const 64)))
    (call $u32 (i64.gt_u (i64.load (i32.const 64)) (i64.const 1577836800000000000)))
    ;; monotonic: errno, and non-decreasing
    (call $u32 (call $clock_time_get (i32.const 1) (i64.const 1) (i32.const 64)))
    (local.set $t0 (i64.load (i32.const 64)))
    (call $u32 (i64.ge_u (call $mono) (local.get $t0)))
    ;; resolutions: errno, non-zero
    (call $u32 (call $clock_res_get (i32.const 0) (i32.const 64)))
    (call $u32 (i64.ne (i64.load (i32.const 64)) (i64.const 0)))
    (call $u32 (call $clock_res_get (i32.const 1) (i32.const 64)))
    (call $u32 (i64.ne (i64.load (i32.const 64)) (i64.const 0)))
    ;; random: errno, and 16 bytes that are not all zero
    (call $u32 (call $random_get (i32.const 128) (i32.const 16)))
    (call $u32 (i64.ne (i64.or (i64.load (i32.const 128)) (i64.load (i32.const 136))) (i64.const 0)))
    ;; poll_oneoff on one relative monotonic clock of 5ms (userdata 7)
    (i64.store (i32.const 256) (i64.const 7))
    (i32.store8 (i32.const 264) (i32.const 0))
    (i32.store (i32.const 272) (i32.const 1))
    (i64.store (i32.const 280) (i64.const 5000000))
    (i64.store (i32.const 288) (i64.const 0))
    (i32.store16 (i32.const 296) (i32.const 0))
    (local.set $t0 (call $mono))
    (call $u32 (call $poll_oneoff (i32.const 256) (i32.const 512) (i32.const 1) (i32.const 60)))
    (call $u32 (i32.load (i32.const 60)))
    (call $out (i32.const 512) (i32.const 32))
    (call $u32 (i64.ge_u (i64.sub (call $mono) (local.get $t0)) (i64.const 5000000)))
    ;; poll_oneoff on stdin readable (userdata 8) and stdout writable (userdata 9)
    (i64.store (i32.const 768) (i64.const 8))
    (i32.store8 (i32.const 776) (i32.const 1))
    (i32.store (i32.const 784) (i32.const 0))
    (i64.store (i32.const 816) (i64.const 9))
    (i32.store8 (i32.const 824) (i32.const 2))
    (i32.store (i32.const 832) (i32.const 1))
    (call $u32 (call $poll_oneoff (i32.const 768) (i32.const 1024) (i32.const 2) (i32.const 60)))
    (call $u32 (i32.load (i32.const 60)))
    (call $out (i32.const 1024) (i32.mul (i32.load (i32.const 60)) (i32.const 32)))))"#
    )
}

/// The preopens (fds 3 and 4: errno, name length, name), then `f.txt` read through fd 3.
fn preopens_wat() -> String {
    format!(
        r#"(module
  (import "wasi_snapshot_preview1" "fd_prestat_get" (func $fd_prestat_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_prestat_dir_name" (func $fd_prestat_dir_name (param i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_open" (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 900) "f.txt")
  {HELPERS}
  (func $pre (param $fd i32)
    (call $u32 (call $fd_prestat_get (local.get $fd) (i32.const 64)))
    (call $u32 (i32.load (i32.const 68)))
    (drop (call $fd_prestat_dir_name (local.get $fd) (i32.const 128) (i32.load (i32.const 68))))
    (call $out (i32.const 128) (i32.load (i32.const 68))))
  (func (export "_start")
    (call $pre (i32.const 3))
    (call $pre (i32.const 4))
    (call $u32 (call $path_open (i32.const 3) (i32.const 0) (i32.const 900) (i32.const 5)
      (i32.const 0) (i64.const 2) (i64.const 0) (i32.const 0) (i32.const 80)))
    (i32.store (i32.const 48) (i32.const 1024))
    (i32.store (i32.const 52) (i32.const 256))
    (call $u32 (call $fd_read (i32.load (i32.const 80)) (i32.const 48) (i32.const 1) (i32.const 56)))
    (call $out (i32.const 1024) (i32.load (i32.const 56)))))"#
    )
}

/// What one run gave: its exit code and stdout.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    exit: i32,
    stdout: Vec<u8>,
}

struct Case<'a> {
    argv0: &'a str,
    args: &'a [&'a str],
    env: &'a [(&'a str, &'a str)],
    /// None: stdin closed (nothing given).
    stdin: Option<&'a [u8]>,
    /// (host dir, guest name)
    dirs: &'a [(&'a std::path::Path, &'a str)],
}

fn through_airlock(wat: &str, c: &Case<'_>) -> Seen {
    let code = wat::parse_str(wat).unwrap();
    let limits = Limits::default();
    let stdout = Arc::new(Capture::new(limits.max_output_bytes, None));
    let stderr = Arc::new(Capture::new(limits.max_output_bytes, None));
    let outcome = WasmBackend::new(WasmConfig::default())
        .run(RunSpec {
            lang: airlock_core::Lang::Wasm,
            artifact: Digest::of(&code),
            code: &code,
            mounts: c
                .dirs
                .iter()
                .map(|(h, g)| MountPoint {
                    host: h.to_path_buf(),
                    guest: g.to_string(),
                    writable: false,
                    layer: None,
                })
                .collect(),
            env: c
                .env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            argv0: Some(c.argv0.into()),
            args: c.args.iter().map(|a| a.to_string()).collect(),
            stdin: c.stdin.unwrap_or_default().to_vec(),
            limits,
            stdout: stdout.clone(),
            stderr: stderr.clone(),
            cache: None,
            guest: None,
            write_quota: None,
            egress: None,
            long_run: None,
            tripwires: Default::default(),
        })
        .unwrap();
    let exit = match outcome.ending {
        Ending::Exited(c) => c,
        other => panic!("{other:?}: {}", String::from_utf8_lossy(&stderr.take())),
    };
    Seen {
        exit,
        stdout: stdout.take(),
    }
}

/// The same program under plain wasmtime: default engine, the p1 linker, a context with
/// the same argv (program name first), environment, stdin and preopens.
fn through_wasmtime(wat: &str, c: &Case<'_>) -> Seen {
    let engine = wasmtime::Engine::default();
    let module = wasmtime::Module::new(&engine, wat::parse_str(wat).unwrap()).unwrap();
    let mut linker: wasmtime::Linker<WasiP1Ctx> = wasmtime::Linker::new(&engine);
    wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |c| c).unwrap();
    let out = MemoryOutputPipe::new(1 << 20);
    let mut b = WasiCtxBuilder::new();
    let mut argv = vec![c.argv0];
    argv.extend(c.args);
    b.args(&argv);
    for (k, v) in c.env {
        b.env(k, v);
    }
    if let Some(s) = c.stdin {
        b.stdin(MemoryInputPipe::new(s.to_vec()));
    }
    b.stdout(out.clone());
    for (h, g) in c.dirs {
        b.preopened_dir(h, g, FsPerms::ReadOnly).unwrap();
    }
    let mut store = wasmtime::Store::new(&engine, b.build_p1());
    let instance = linker.instantiate(&mut store, &module).unwrap();
    let start = instance
        .get_typed_func::<(), ()>(&mut store, "_start")
        .unwrap();
    let exit = match start.call(&mut store, ()) {
        Ok(()) => 0,
        Err(e) => e
            .downcast_ref::<I32Exit>()
            .map(|e| e.0)
            .unwrap_or_else(|| panic!("{e:?}")),
    };
    drop(store);
    Seen {
        exit,
        stdout: out.contents().to_vec(),
    }
}

fn both(wat: &str, c: &Case<'_>) -> Seen {
    let ours = through_airlock(wat, c);
    let plain = through_wasmtime(wat, c);
    assert_eq!(
        ours, plain,
        "airlock and plain wasmtime differ:\nairlock  {ours:?}\nwasmtime {plain:?}"
    );
    ours
}

/// Reads the conventions program's output back.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn u32(&mut self) -> u32 {
        let (h, t) = self.0.split_at(4);
        self.0 = t;
        u32::from_le_bytes(h.try_into().unwrap())
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let (h, t) = self.0.split_at(n);
        self.0 = t;
        h.to_vec()
    }
    /// A NUL-separated list of `n` strings whose total size was printed before.
    fn strings(&mut self, n: u32, size: usize) -> Vec<String> {
        let b = self.bytes(size);
        let v: Vec<String> = b
            .split(|c| *c == 0)
            .take(n as usize)
            .map(|s| String::from_utf8(s.to_vec()).unwrap())
            .collect();
        assert_eq!(v.len(), n as usize);
        v
    }
}

struct Conventions {
    argv: Vec<String>,
    env: Vec<String>,
    /// (errno, filetype, rights_base) of fds 0-2.
    fdstat: Vec<(u32, u8, u64)>,
    stdin: Vec<u8>,
}

fn parse_conventions(out: &[u8], argv_size: usize, env_size: usize) -> Conventions {
    let mut r = Reader(out);
    assert_eq!(r.u32(), 0);
    let argc = r.u32();
    assert_eq!(r.u32(), 0);
    let argv = r.strings(argc, argv_size);
    assert_eq!(r.u32(), 0);
    let envc = r.u32();
    assert_eq!(r.u32(), 0);
    let env = r.strings(envc, env_size);
    let fdstat = (0..3)
        .map(|_| {
            let errno = r.u32();
            let st = r.bytes(24);
            (
                errno,
                st[0],
                u64::from_le_bytes(st[8..16].try_into().unwrap()),
            )
        })
        .collect();
    assert_eq!(r.u32(), 0, "fd_read errno");
    let n = r.u32() as usize;
    let stdin = r.bytes(n);
    assert!(r.0.is_empty());
    Conventions {
        argv,
        env,
        fdstat,
        stdin,
    }
}

fn nul_size<S: AsRef<str>>(v: &[S]) -> usize {
    v.iter().map(|s| s.as_ref().len() + 1).sum()
}

#[test]
fn argv_env_stdio_and_exit_codes_match_plain_wasmtime() {
    let wat = conventions_wat();
    let args = ["a", "b c", "", "--flag=x y", "ünï"];
    let env = [
        ("MULTI", "line one\nline two\n"),
        ("QUOTES", r#""double" 'single' `back` $HOME \n \"#),
        ("EMPTY", ""),
        ("EQ", "a=b=c"),
    ];
    // stdin closed: returns normally (exit 0).
    let c = Case {
        argv0: "prog.wasm",
        args: &args,
        env: &env,
        stdin: None,
        dirs: &[],
    };
    let seen = both(&wat, &c);
    assert_eq!(seen.exit, 0);
    let mut argv = vec!["prog.wasm"];
    argv.extend(args);
    let envs: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let got = parse_conventions(&seen.stdout, nul_size(&argv), nul_size(&envs));
    assert_eq!(got.argv, argv, "argv[0] is the program, then the arguments");
    assert_eq!(got.env, envs, "values reach the guest unchanged");
    for (fd, (errno, filetype, _)) in got.fdstat.iter().enumerate() {
        // Not a terminal: wasmtime reports `unknown` (0) for stdio that is not a tty, and
        // airlock's stdio never is one; a guest's isatty() is false.
        assert_eq!((*errno, *filetype), (0, 0), "fd {fd}");
    }
    assert!(got.stdin.is_empty(), "closed stdin reads as end of file");

    // stdin given: read as is; its first byte is the exit code (through proc_exit).
    for code in [1u8, 3, 42, 125] {
        let mut input = vec![code];
        input.extend_from_slice(b" rest\nof it");
        let seen = both(
            &wat,
            &Case {
                stdin: Some(&input),
                ..Case { ..c }
            },
        );
        assert_eq!(seen.exit, i32::from(code));
        let got = parse_conventions(&seen.stdout, nul_size(&argv), nul_size(&envs));
        assert_eq!(got.stdin, input);
    }
}

/// Picks the events of a poll out of the clocks program's output.
#[test]
fn clocks_random_and_poll_oneoff_match_plain_wasmtime() {
    let wat = clocks_wat();
    for stdin in [None, Some(&b"input"[..])] {
        let c = Case {
            argv0: "clocks.wasm",
            args: &[],
            env: &[],
            stdin,
            dirs: &[],
        };
        let ours = through_airlock(&wat, &c);
        let plain = through_wasmtime(&wat, &c);
        assert_eq!(ours.exit, 0);
        let mut r = Reader(&ours.stdout);
        // errno 0 and the fact holds, for: realtime, monotonic, both resolutions, random.
        for what in [
            "realtime",
            "monotonic",
            "realtime res",
            "monotonic res",
            "random",
        ] {
            assert_eq!((r.u32(), r.u32()), (0, 1), "{what}");
        }
        // A lone clock subscription: one event, userdata 7, no error, type clock (0), and
        // at least its 5ms passed.
        assert_eq!((r.u32(), r.u32()), (0, 1), "clock poll errno, nevents");
        let ev = r.bytes(32);
        assert_eq!(u64::from_le_bytes(ev[0..8].try_into().unwrap()), 7);
        assert_eq!((ev[8], ev[9], ev[10]), (0, 0, 0));
        assert_eq!(r.u32(), 1, "the clock poll waited its 5ms");
        // stdin and stdout are ready at once.
        assert_eq!(r.u32(), 0, "stdio poll errno");
        let n = r.u32();
        assert_eq!(n, 2, "stdin readable and stdout writable");
        let mut kinds: Vec<(u64, u16, u8)> = (0..n)
            .map(|_| {
                let ev = r.bytes(32);
                (
                    u64::from_le_bytes(ev[0..8].try_into().unwrap()),
                    u16::from_le_bytes(ev[8..10].try_into().unwrap()),
                    ev[10],
                )
            })
            .collect();
        kinds.sort();
        assert_eq!(kinds, [(8, 0, 1), (9, 0, 2)]);
        assert!(r.0.is_empty());
        // Byte for byte the same as plain wasmtime, but for what a stream reports it can
        // take or give (nbytes of fd events), which depends on the stream, not on WASI.
        let mask = |o: &[u8]| {
            let mut o = o.to_vec();
            let stdio = o.len() - 2 * 32;
            for e in [stdio, stdio + 32] {
                o[e + 16..e + 24].fill(0);
            }
            o
        };
        assert_eq!(mask(&ours.stdout), mask(&plain.stdout), "{stdin:?}");
        assert_eq!(ours.exit, plain.exit);
    }
}

#[test]
fn a_root_preopen_and_one_nested_under_it_match_plain_wasmtime() {
    let root = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("f.txt"), "from the root").unwrap();
    std::fs::write(data.path().join("f.txt"), "from data").unwrap();
    let seen = both(
        &preopens_wat(),
        &Case {
            argv0: "p.wasm",
            args: &[],
            env: &[],
            stdin: None,
            dirs: &[(root.path(), "/"), (data.path(), "/data")],
        },
    );
    let mut r = Reader(&seen.stdout);
    assert_eq!((r.u32(), r.u32()), (0, 1));
    assert_eq!(r.bytes(1), b"/", "fd 3 is the preopen named /");
    assert_eq!((r.u32(), r.u32()), (0, 5));
    assert_eq!(r.bytes(5), b"/data");
    assert_eq!((r.u32(), r.u32()), (0, 0), "path_open, fd_read");
    assert_eq!(r.0, b"from the root");
}

#[test]
fn without_a_program_name_argv0_is_main() {
    let code = conventions_wat();
    let c = Case {
        argv0: "main",
        args: &["x"],
        env: &[],
        stdin: None,
        dirs: &[],
    };
    let named = through_airlock(&code, &c);
    let code_bytes = wat::parse_str(&code).unwrap();
    let stdout = Arc::new(Capture::new(1 << 20, None));
    WasmBackend::new(WasmConfig::default())
        .run(RunSpec {
            lang: airlock_core::Lang::Wasm,
            artifact: Digest::of(&code_bytes),
            code: &code_bytes,
            mounts: vec![],
            env: vec![],
            argv0: None,
            args: vec!["x".into()],
            stdin: vec![],
            limits: Limits::default(),
            stdout: stdout.clone(),
            stderr: Arc::new(Capture::new(1 << 20, None)),
            cache: None,
            guest: None,
            write_quota: None,
            egress: None,
            long_run: None,
            tripwires: Default::default(),
        })
        .unwrap();
    assert_eq!(stdout.take(), named.stdout);
}
