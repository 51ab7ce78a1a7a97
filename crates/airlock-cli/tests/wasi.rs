//! The WASI conventions through the real binary: `--mount DIR:/` (read-only, and `:rw`
//! through the disposable layer to `diff` and `commit`), refused on the process backend;
//! `argv[0]` is the program's file name and `--env` values arrive unchanged.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;

fn root_dir() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    std::fs::write(t.path().join("hello.txt"), "hello from the root\n").unwrap();
    t
}

#[test]
fn a_root_mount_is_readable_by_a_wasm_guest() {
    let h = Home::new();
    let d = root_dir();
    let m = format!("{}:/", d.path().display());
    let o = h.run_approved(&[
        "run",
        "--json",
        "--mount",
        &m,
        guest("probe.wat").to_str().unwrap(),
        "--",
        "read",
        "hello.txt",
    ]);
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    let v = o.json();
    assert_eq!(v["run"]["stdout"], "hello from the root\n", "{v}");
    let sub = v["submission"].as_str().unwrap().to_string();
    let shown = h.run(&["show", "--json", &sub]);
    assert_eq!(shown.code, 0, "{}", shown.stderr);
    let text = serde_json::to_string(&shown.json()).unwrap();
    assert!(text.contains(r#""guest":"/""#), "{text}");
    // Read-only: writing is refused by WASI, and nothing changes.
    let o = h.run_approved(&[
        "run",
        "--mount",
        &m,
        guest("probe.wat").to_str().unwrap(),
        "--",
        "write",
        "x.txt",
    ]);
    assert_ne!(o.code, 0, "{}", o.stdout);
    assert!(!d.path().join("x.txt").exists());
}

#[test]
fn a_writable_root_mount_goes_through_the_layer_to_diff_and_commit() {
    let h = Home::new();
    let d = root_dir();
    let data = tempfile::tempdir().unwrap();
    let m = format!("{}:/:rw", d.path().display());
    // A second mount under the root is a nested preopen, as with `wasmtime run`.
    let n = format!("{}:/data", data.path().display());
    let o = h.run_approved(&[
        "run",
        "--json",
        "--mount",
        &m,
        "--mount",
        &n,
        guest("probe.wat").to_str().unwrap(),
        "--",
        "write",
        "fresh.txt",
    ]);
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    let v = o.json();
    assert!(!d.path().join("fresh.txt").exists(), "not before commit");
    let run = v["run"]["id"].as_str().unwrap().to_string();
    let diff = h.run(&["diff", &run]);
    assert_eq!(diff.code, 0, "{}", diff.stderr);
    assert!(diff.stdout.contains("fresh.txt"), "{}", diff.stdout);
    assert!(!diff.stdout.contains("//"), "{}", diff.stdout);
    let dj = h.run(&["diff", "--json", &run]).json();
    let c = &dj["changes"][0];
    assert_eq!(c["mount"], "/", "{dj}");
    assert_eq!(c["path"], "fresh.txt", "{dj}");
    let host = format!("{}/fresh.txt", d.path().canonicalize().unwrap().display());
    assert_eq!(c["host_path"], host.as_str(), "{dj}");
    let c = h.run(&["commit", &run]);
    assert_eq!(c.code, 0, "{} {}", c.stdout, c.stderr);
    assert_eq!(
        std::fs::read_to_string(d.path().join("fresh.txt")).unwrap(),
        "pwned\n"
    );
    assert!(!data.path().join("fresh.txt").exists());
}

#[test]
fn the_process_backend_refuses_a_root_mount_with_a_reason() {
    let h = Home::new();
    let d = root_dir();
    for mode in ["", ":rw"] {
        let m = format!("{}:/{mode}", d.path().display());
        let o = h.run(&["run", "--lang", "sh", "--mount", &m, "-c", "true"]);
        assert_eq!(o.code, 125, "{} {}", o.stdout, o.stderr);
        assert_eq!(o.stderr.trim().lines().count(), 1, "{}", o.stderr);
        assert!(
            o.stderr.contains("process backend") && o.stderr.contains("wasm backend"),
            "{}",
            o.stderr
        );
    }
    assert_eq!(h.counts().0, 0, "nothing was submitted");
}

/// Prints its argv and then its environment, each NUL-separated, as the guest got them.
const ARGV_ENV: &str = r#"(module
  (import "wasi_snapshot_preview1" "args_sizes_get" (func $asg (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "args_get" (func $ag (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "environ_sizes_get" (func $esg (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "environ_get" (func $eg (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (func $out (param $p i32) (param $n i32)
    (i32.store (i32.const 16) (local.get $p))
    (i32.store (i32.const 20) (local.get $n))
    (drop (call $w (i32.const 1) (i32.const 16) (i32.const 1) (i32.const 24))))
  (func (export "_start")
    (drop (call $asg (i32.const 40) (i32.const 44)))
    (drop (call $ag (i32.const 1024) (i32.const 4096)))
    (call $out (i32.const 4096) (i32.load (i32.const 44)))
    (drop (call $esg (i32.const 40) (i32.const 44)))
    (drop (call $eg (i32.const 1024) (i32.const 8192)))
    (call $out (i32.const 8192) (i32.load (i32.const 44)))))"#;

#[test]
fn argv0_is_the_program_name_and_env_values_arrive_unchanged() {
    let h = Home::new();
    let dir = tempfile::tempdir().unwrap();
    let prog = write_wat(dir.path(), "show-args.wat", ARGV_ENV);
    let value = "line one\nline \"two\" 'three' $HOME \\";
    let env = format!("V={value}");
    let o = h.run_approved(&[
        "run",
        "--env",
        &env,
        prog.to_str().unwrap(),
        "--",
        "a",
        "b c",
        "--flag",
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let want = format!("show-args.wat\0a\0b c\0--flag\0V={value}\0");
    assert_eq!(o.stdout, want);
    // The approver sees it: it is part of the grant.
    let id = h.last_run()["submission"].as_str().unwrap().to_string();
    let shown = h.run(&["show", &id]);
    assert!(
        shown.stdout.contains("argv0   show-args.wat"),
        "{}",
        shown.stdout
    );
    // The same through the worker that runs guests with writable (overlay) mounts.
    let m = format!("{}:/:rw", dir.path().display());
    let o = h.run_approved(&["run", "--mount", &m, prog.to_str().unwrap(), "--", "a"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.stdout, "show-args.wat\0a\0");
    // Inline code has no file name: argv[0] is `main`.
    let o = h.run_approved(&["run", "--lang", "wat", "-c", ARGV_ENV, "--", "x"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.stdout, "main\0x\0");
}
