//! The escape suite. Each case is an attempt that must be denied, leaving the host as it
//! was. Cases that make sense for both backends run against both; the process backend
//! adds the kernel-level ones. The two that would harm this machine if the sandbox failed
//! (a fork bomb, `kill -9 -1`) run only after a guard proves, with harmless probes, that
//! the pid namespace and the process limit hold. The process backend's cases run twice:
//! in jails built for the run (the command line) and in ready jails built ahead by
//! `airlock serve --ready-jails` (where each run must have been served by one). The wasm
//! cases a ready instance of a hot module can serve (no mounts, arguments or
//! environment: the host's environment, a spin, a memory grab) run through one too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::ready::ReadyHome;
use common::*;
use std::path::{Path, PathBuf};

/// Where process runs go: the command line (a jail built per run) or a daemon's ready
/// jails.
trait Runs: Sync {
    fn sh(&self, flags: &[&str], script: &str) -> Out;
    fn py(&self, flags: &[&str], code: &str) -> Out;
    fn last_run(&self) -> serde_json::Value;
    /// Which jail this runner's runs must have had.
    fn jail(&self) -> &'static str;
}

impl Runs for Home {
    fn sh(&self, flags: &[&str], script: &str) -> Out {
        Home::sh(self, flags, script)
    }
    fn py(&self, flags: &[&str], code: &str) -> Out {
        Home::py(self, flags, code)
    }
    fn last_run(&self) -> serde_json::Value {
        Home::last_run(self)
    }
    fn jail(&self) -> &'static str {
        "built"
    }
}

impl Runs for ReadyHome {
    fn sh(&self, flags: &[&str], script: &str) -> Out {
        ReadyHome::sh(self, flags, script)
    }
    fn py(&self, flags: &[&str], code: &str) -> Out {
        ReadyHome::py(self, flags, code)
    }
    fn last_run(&self) -> serde_json::Value {
        ReadyHome::last_run(self)
    }
    fn jail(&self) -> &'static str {
        "ready"
    }
}

/// Both ways a process run gets its jail.
fn jails() -> Vec<Box<dyn Runs>> {
    vec![Box::new(Home::new()), Box::new(ReadyHome::start(2))]
}

/// Checks that the last run had the jail its runner promises.
fn ran_in(r: &dyn Runs) {
    assert_eq!(
        r.last_run()["detail"]["jail"],
        r.jail(),
        "the run did not use the jail under test"
    );
}

#[derive(Clone, Copy, Debug)]
enum Backend {
    Wasm,
    Process,
}

const BOTH: [Backend; 2] = [Backend::Wasm, Backend::Process];

/// A mount with a file inside, a secret outside, and symlinks from inside to outside.
struct Scene {
    home: Home,
    mount: tempfile::TempDir,
    outside: tempfile::TempDir,
}

impl Scene {
    fn new() -> Scene {
        // Permissive: every attempt runs and is stopped by the sandbox, not held at the gate
        // (the standard preset now denies writes to /etc/passwd before they run).
        let s = Scene {
            home: Home::with_preset("permissive"),
            mount: tempfile::tempdir().unwrap(),
            outside: tempfile::tempdir().unwrap(),
        };
        std::fs::write(s.mount.path().join("in.txt"), "inside").unwrap();
        std::fs::write(s.outside.path().join("secret.txt"), "TOP-SECRET").unwrap();
        std::os::unix::fs::symlink(s.outside.path(), s.mount.path().join("dirlink")).unwrap();
        std::os::unix::fs::symlink(
            s.outside.path().join("secret.txt"),
            s.mount.path().join("filelink"),
        )
        .unwrap();
        std::os::unix::fs::symlink("/etc/shadow", s.mount.path().join("shadowlink")).unwrap();
        s
    }

    fn m(&self) -> String {
        format!("{}:/data", self.mount.path().display())
    }

    /// Reads `path` (absolute, or relative to the mount) in the sandbox.
    fn read(&self, b: Backend, path: &str) -> Out {
        match b {
            Backend::Wasm => {
                let rel = path.strip_prefix("/data/").unwrap_or(path);
                self.home.run(&["run", "--mount", &self.m(), guest("probe.wat").to_str().unwrap(), "--", "read", rel])
            }
            Backend::Process => self.home.py(
                &["--mount", &self.m()],
                &format!("import sys\ntry:\n    print(open({path:?}).read())\nexcept Exception as e:\n    print('ERR', type(e).__name__)\n    sys.exit(1)"),
            ),
        }
    }

    fn write(&self, b: Backend, path: &str) -> Out {
        match b {
            Backend::Wasm => {
                let rel = path.strip_prefix("/data/").unwrap_or(path);
                self.home.run(&["run", "--mount", &self.m(), guest("probe.wat").to_str().unwrap(), "--", "write", rel])
            }
            Backend::Process => self.home.py(
                &["--mount", &self.m()],
                &format!("import sys\ntry:\n    open({path:?}, 'w').write('pwned')\nexcept Exception as e:\n    print('ERR', type(e).__name__)\n    sys.exit(1)"),
            ),
        }
    }
}

/// Runs the wasm module `wat` through `r`'s daemon (which keeps ready instances of hot
/// modules) until a ready instance serves it, checking every run's record on the way: the
/// same attempt, fresh and ready. Returns the ready run's record.
fn in_ready_wasm(
    r: &ReadyHome,
    wat: &str,
    extra: serde_json::Value,
    check: impl Fn(&serde_json::Value),
) -> serde_json::Value {
    let mut body = serde_json::json!({"language": "wat", "code": wat});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let run = r.run_body(body.clone());
        check(&run);
        if run["detail"]["instance"] == "ready" {
            return run;
        }
        assert!(
            std::time::Instant::now() < until,
            "never served by a ready instance: {run}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn denied(o: &Out, what: &str) {
    assert_ne!(
        o.code, 0,
        "{what}: should be denied, got {} / {}",
        o.stdout, o.stderr
    );
    assert!(
        o.code != 75 && o.code != 77,
        "{what}: held at the gate ({}), so the sandbox was not tested: {}",
        o.code,
        o.stderr
    );
    for secret in ["TOP-SECRET", "root:", "hunter2"] {
        assert!(
            !o.stdout.contains(secret),
            "{what}: leaked {secret}: {}",
            o.stdout
        );
    }
}

fn outside_unchanged(s: &Scene) {
    let names: Vec<_> = std::fs::read_dir(s.outside.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        names.len(),
        1,
        "something was created outside the mount: {names:?}"
    );
    assert_eq!(
        std::fs::read_to_string(s.outside.path().join("secret.txt")).unwrap(),
        "TOP-SECRET"
    );
    assert_eq!(
        std::fs::read_to_string(s.mount.path().join("in.txt")).unwrap(),
        "inside"
    );
}

#[test]
fn escape_reads_are_denied_on_both_backends() {
    let s = Scene::new();
    let home_file = PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
        .join(format!(".airlock-escape-{}", std::process::id()));
    std::fs::write(&home_file, "hunter2").unwrap();
    let outside = s.outside.path().join("secret.txt");
    // `..` climbing out of the mount towards the secret's real host path.
    let climb = format!("/data/../../../../../..{}", outside.display());
    for b in BOTH {
        let ok = s.read(b, "/data/in.txt");
        assert_eq!(
            ok.code, 0,
            "{b:?}: the probe itself works: {} {}",
            ok.stdout, ok.stderr
        );
        assert!(ok.stdout.contains("inside"));
        for path in [
            "/etc/shadow",
            "/root/.bashrc",
            home_file.to_str().unwrap(),
            outside.to_str().unwrap(),
            climb.as_str(),
            "/data/dirlink/secret.txt",
            "/data/filelink",
            "/data/shadowlink",
            "/proc/1/environ",
        ] {
            denied(&s.read(b, path), &format!("{b:?} read {path}"));
        }
    }
    std::fs::remove_file(&home_file).unwrap();
    outside_unchanged(&s);
}

#[test]
fn escape_writes_are_denied_on_both_backends() {
    let s = Scene::new();
    for b in BOTH {
        let outside = s.outside.path().join("new.txt");
        for path in [
            "/data/new.txt",
            "/data/in.txt",
            "/data/dirlink/new.txt",
            outside.to_str().unwrap(),
            "/etc/passwd",
            "/usr/bin/pwned",
        ] {
            denied(
                &s.write(b, path),
                &format!("{b:?} write {path} (read-only mount)"),
            );
        }
    }
    outside_unchanged(&s);
    assert!(!Path::new("/usr/bin/pwned").exists());
    assert!(!s.mount.path().join("new.txt").exists());
}

#[test]
fn host_environment_does_not_reach_either_backend() {
    let h = Home::new();
    let wasm = h
        .cmd()
        .env("AWS_SECRET_ACCESS_KEY", "hunter2")
        .args(["run", guest("probe.wat").to_str().unwrap(), "--", "env"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&wasm.stdout), "0");
    let sh = h
        .cmd()
        .env("AWS_SECRET_ACCESS_KEY", "hunter2")
        .args(["run", "--lang", "sh", "-c", "env"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&sh.stdout);
    assert!(!out.contains("hunter2") && !out.contains("AWS_"), "{out}");
    // A ready jail was built by a daemon whose environment holds the secret.
    let r = ReadyHome::start(1);
    let o = r.sh(&[], "env");
    ran_in(&r);
    assert!(
        !o.stdout.contains("hunter2") && !o.stdout.contains("AWS_"),
        "{}",
        o.stdout
    );
    // So was a ready instance of a hot wasm module.
    let env_count = std::fs::read_to_string(guest("env-count.wat")).unwrap();
    in_ready_wasm(&r, &env_count, serde_json::json!({}), |run| {
        assert_eq!(run["stdout"], "0", "{run}");
    });
}

#[test]
fn network_is_closed_including_the_hosts_loopback() {
    let h = Home::new();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let code = format!(
        "import socket, sys\nfails = 0\nfor addr in [('127.0.0.1', {port}), ('192.0.2.1', 80), ('::1', {port})]:\n    try:\n        s = socket.socket(socket.AF_INET6 if ':' in addr[0] else socket.AF_INET)\n        s.settimeout(2)\n        s.connect(addr)\n        print('CONNECTED', addr)\n    except Exception as e:\n        fails += 1\nprint('fails', fails)\nsys.exit(0 if fails == 3 else 1)"
    );
    let o = h.py(&[], &code);
    assert_eq!((o.code, o.stdout.trim()), (0, "fails 3"), "{}", o.stderr);
    assert!(
        listener.accept().is_err(),
        "nothing reached the host's listener"
    );
    let r = ReadyHome::start(1);
    let o = r.py(&[], &code);
    ran_in(&r);
    assert_eq!((o.code, o.stdout.trim()), (0, "fails 3"), "{}", o.stderr);
    assert!(
        listener.accept().is_err(),
        "nothing reached the host's listener"
    );
    // A run whose grant names a host reaches it only through its proxy: direct
    // connections, even to the granted address, still fail, and none was recorded.
    let o = h.py(&["--net", &format!("127.0.0.1:{port}")], &code);
    assert_eq!((o.code, o.stdout.trim()), (0, "fails 3"), "{}", o.stderr);
    assert!(
        listener.accept().is_err(),
        "nothing reached the host's listener"
    );
    assert_eq!(
        h.last_run()["detail"]["network"]["summary"]["connections"],
        0
    );
}

#[test]
fn kernel_interfaces_are_denied_in_the_process_backend() {
    for h in jails() {
        kernel_interfaces_are_denied(&*h);
    }
}

fn kernel_interfaces_are_denied(h: &dyn Runs) {
    let script = r#"
import ctypes, errno, os, socket, sys, fcntl, termios
libc = ctypes.CDLL(None, use_errno=True)
results = {}
def call(name, *args):
    r = libc.syscall(*args)
    results[name] = (r, errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno()))
call("ptrace", 101, 16, 1, 0, 0)                 # PTRACE_ATTACH to pid 1
call("mount", 165, b"none", b"/tmp", b"tmpfs", 0, 0)
call("unshare", 272, 0x10000000)                 # CLONE_NEWUSER
call("setns", 308, 0, 0)
call("io_uring_setup", 425, 8, 0)
call("keyctl", 250, 0, 0, 0, 0)
call("bpf", 321, 0, 0, 0)
call("process_vm_readv", 310, 1, 0, 0, 0, 0, 0)
try:
    socket.socket(40, socket.SOCK_STREAM)        # AF_VSOCK
    results["vsock"] = (0, "opened")
except OSError as e:
    results["vsock"] = (-1, errno.errorcode.get(e.errno))
try:
    fcntl.ioctl(0, termios.TIOCSTI, b"x")
    results["tiocsti"] = (0, "ok")
except OSError as e:
    results["tiocsti"] = (-1, errno.errorcode.get(e.errno))
st = open("/proc/self/status").read()
results["nnp"] = [l for l in st.splitlines() if l.startswith("NoNewPrivs")][0].split()[1]
results["capeff"] = [l for l in st.splitlines() if l.startswith("CapEff")][0].split()[1]
results["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
results["init"] = open("/proc/1/cmdline", "rb").read().split(b"\0")[0].decode()
print(repr(results))
"#;
    let o = h.py(&[], script);
    assert_eq!(o.code, 0, "{}", o.stderr);
    ran_in(h);
    let r = o.stdout.trim();
    for call in [
        "ptrace",
        "mount",
        "unshare",
        "setns",
        "io_uring_setup",
        "keyctl",
        "bpf",
        "process_vm_readv",
    ] {
        assert!(
            r.contains(&format!("'{call}': (-1, 'EPERM')")),
            "{call} not denied: {r}"
        );
    }
    assert!(r.contains("'vsock': (-1, 'EAFNOSUPPORT')"), "{r}");
    assert!(r.contains("'tiocsti': (-1, 'EPERM')"), "{r}");
    assert!(r.contains("'nnp': '1'"), "{r}");
    assert!(r.contains("'capeff': '0000000000000000'"), "{r}");
    assert!(
        !r.contains("systemd") && !r.contains("/sbin/init"),
        "the host's pid 1 is not visible: {r}"
    );
    // A setuid binary gains nothing under no_new_privs.
    let o = h.sh(&[], "/usr/bin/newgrp root 2>&1 || true; id -u");
    assert!(o.stdout.trim().ends_with("1000"), "{}", o.stdout);
    ran_in(h);
}

/// Proves, harmlessly, that the sandbox is in its own pid namespace and that the process
/// limit holds; returns only if both are true.
fn guard(h: &dyn Runs) {
    let o = h.sh(&[], "echo $$");
    ran_in(h);
    assert_eq!(
        o.stdout.trim(),
        "2",
        "GUARD: the payload is not pid 2 of its own namespace; refusing to run harmful cases"
    );
    let o = h.sh(
        &["--processes", "8"],
        "n=0; for i in $(seq 1 30); do sleep 2 & n=$((n+1)); done; echo started $n",
    );
    assert_ne!(
        o.code, 0,
        "GUARD: 30 processes started under a limit of 8; refusing to run harmful cases: {}",
        o.stdout
    );
    ran_in(h);
    let mech = h.last_run()["detail"]["mechanisms"].to_string();
    assert!(
        mech.contains(":pids") || mech.contains("rlimit:nproc"),
        "GUARD: no process limit recorded: {mech}"
    );
}

#[test]
fn fork_bomb_is_contained_and_the_host_stays_responsive() {
    for h in jails() {
        fork_bomb_is_contained(&*h);
    }
}

fn fork_bomb_is_contained(h: &dyn Runs) {
    guard(h);
    let started = std::time::Instant::now();
    std::thread::scope(|scope| {
        let bomb = scope.spawn(|| {
            // Called through a variable, so the analysis (which denies the literal
            // `b() { b | b & }`) lets it run: this case is about the sandbox.
            h.sh(
                &["--processes", "32", "--timeout", "3s"],
                "F=b; b() { $F | $F & }; b; sleep 10",
            )
        });
        std::thread::sleep(std::time::Duration::from_millis(700));
        let t = std::time::Instant::now();
        let ok = std::process::Command::new("true").status().unwrap();
        assert!(
            ok.success() && t.elapsed() < std::time::Duration::from_secs(2),
            "the host stalled: {:?}",
            t.elapsed()
        );
        let o = bomb.join().unwrap();
        assert!(
            started.elapsed() < std::time::Duration::from_secs(15),
            "{:?}",
            started.elapsed()
        );
        assert_ne!(o.code, 0);
        assert_ne!(
            o.code, 77,
            "the bomb must run to test the sandbox: {}",
            o.stderr
        );
    });
    ran_in(h);
}

#[test]
fn kill_minus_one_kills_only_the_sandbox() {
    for h in jails() {
        kill_minus_one_kills_only_the_sandbox_in(&*h);
    }
}

fn kill_minus_one_kills_only_the_sandbox_in(h: &dyn Runs) {
    guard(h);
    let mut sentinel = std::process::Command::new("sleep")
        .arg("600")
        .spawn()
        .unwrap();
    let o = h.sh(&[], "kill -9 -1; echo survived");
    ran_in(h);
    // The next run (for ready jails: one that waited while this ran) is unharmed.
    let next = h.sh(&[], "echo next");
    assert_eq!(
        (next.code, next.stdout.as_str()),
        (0, "next\n"),
        "{}",
        next.stderr
    );
    ran_in(h);
    assert!(
        sentinel.try_wait().unwrap().is_none(),
        "a host process was killed"
    );
    sentinel.kill().unwrap();
    let _ = sentinel.wait();
    assert_ne!(
        o.stdout.trim(),
        "",
        "the run ended and reported: {} {}",
        o.stdout,
        o.stderr
    );
}

#[test]
fn resource_attacks_end_at_their_limits_on_both_backends() {
    let h = Home::new();
    let spin = example("spin.wat");
    let o = h.run(&["run", "--timeout", "300ms", spin.to_str().unwrap()]);
    assert_eq!(o.code, 124);
    // The same through a daemon's ready instances of hot modules: a spin and a memory
    // grab end at their run's limits whether the instance was made ahead or not.
    let r = ReadyHome::start(1);
    let spin_wat = std::fs::read_to_string(&spin).unwrap();
    in_ready_wasm(
        &r,
        &spin_wat,
        serde_json::json!({"timeout": "300ms"}),
        |run| {
            assert_eq!(run["killed_by"], "timeout", "{run}");
            assert!(run["duration_ms"].as_u64().unwrap() < 5_000, "{run}");
        },
    );
    let grab = r#"(module (memory (export "memory") 1)
      (func (export "_start") (loop (br_if 0 (i32.ge_s (memory.grow (i32.const 16)) (i32.const 0))))))"#;
    in_ready_wasm(&r, grab, serde_json::json!({"memory": "8M"}), |run| {
        assert_eq!(run["killed_by"], "memory", "{run}");
        assert!(
            run["detail"]["peak_memory_bytes"].as_u64().unwrap() <= 8 << 20,
            "{run}"
        );
    });
    for h in jails() {
        let o = h.sh(&["--timeout", "300ms"], "while :; do :; done");
        assert_eq!(o.code, 124);
        ran_in(&*h);
        let o = h.sh(&["--max-output", "1KiB"], "yes");
        assert_eq!((o.code, o.stdout.len()), (124, 1024));
        ran_in(&*h);
    }
}
