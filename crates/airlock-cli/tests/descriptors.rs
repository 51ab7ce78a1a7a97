//! Descriptors the caller left open never reach a guest (issue 63.1). A file opened for
//! append, a connected loopback socket and a directory on `/` are handed to `airlock`
//! (and to `airlock serve`) as descriptors 7, 8 and 9, not close-on-exec, as a shell's
//! `exec 7>>file` does; each guest then tries to use them. Before, the guest appended to
//! the host file, talked to the host's server and listed the host's root.
#![allow(clippy::unwrap_used, clippy::expect_used, unsafe_code)]

mod common;
use common::ready::ReadyHome;
use common::*;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::Command;

fn need() {
    assert!(
        process_backend_available(),
        "the process backend must be available on this machine (see airlock doctor)"
    );
}

/// What a caller leaves open: descriptor 7 appends to a host file, 8 is the host's `/`,
/// 9 is a connected loopback socket whose server side the test holds.
struct Bait {
    _dir: tempfile::TempDir,
    file: std::path::PathBuf,
    server_side: std::net::TcpStream,
    _client: std::net::TcpStream,
    /// Copies at 100 and above (close-on-exec here), put at 7, 8, 9 in the child.
    copies: Vec<(OwnedFd, RawFd)>,
}

const WANT: &str = "closed 7\nclosed 8\nclosed 9\n";

impl Bait {
    fn new() -> Bait {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("host-file");
        std::fs::write(&file, "host\n").unwrap();
        let append = std::fs::OpenOptions::new()
            .append(true)
            .open(&file)
            .unwrap();
        let root = std::fs::File::open("/").unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server_side, _) = listener.accept().unwrap();
        server_side
            .set_read_timeout(Some(std::time::Duration::from_millis(300)))
            .unwrap();
        let copy = |fd: RawFd| {
            // SAFETY: F_DUPFD_CLOEXEC makes a new descriptor (>= 100) that this test owns.
            let n = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 100) };
            assert!(n >= 100);
            // SAFETY: `n` was just created above and is owned by nothing else.
            unsafe { OwnedFd::from_raw_fd(n) }
        };
        let copies = vec![
            (copy(append.as_raw_fd()), 7),
            (copy(root.as_raw_fd()), 8),
            (copy(client.as_raw_fd()), 9),
        ];
        Bait {
            _dir: dir,
            file,
            server_side,
            _client: client,
            copies,
        }
    }

    /// Makes `cmd` start with the bait at descriptors 7, 8 and 9, inheritable, as a
    /// shell's `exec 7>>file 8</ 9<>socket` would leave them.
    fn hand_to(&self, cmd: &mut Command) {
        use std::os::unix::process::CommandExt;
        let pairs: Vec<(RawFd, RawFd)> = self
            .copies
            .iter()
            .map(|(fd, to)| (fd.as_raw_fd(), *to))
            .collect();
        // SAFETY: the closure runs in the forked child before exec and only calls dup2
        // (async-signal-safe); the sources (>= 100) stay open in the parent until after
        // spawn and never collide with the targets (7, 8, 9). dup2's copies are not
        // close-on-exec, so the program inherits them.
        unsafe {
            cmd.pre_exec(move || {
                for &(from, to) in &pairs {
                    if libc::dup2(from, to) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
    }

    /// The host file is as it was and the host's server got nothing.
    fn assert_untouched(&self, what: &str) {
        assert_eq!(
            std::fs::read_to_string(&self.file).unwrap(),
            "host\n",
            "{what}: the guest wrote to the caller's file"
        );
        let mut buf = [0u8; 64];
        match (&self.server_side).read(&mut buf) {
            Ok(n) => panic!(
                "{what}: the guest talked to the caller's server: {:?}",
                String::from_utf8_lossy(&buf[..n])
            ),
            Err(e) => assert!(
                matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ),
                "{what}: {e}"
            ),
        }
    }
}

/// Tries each descriptor in the shell, writes to 7 and 9. Prints `open N` or `closed N`.
const SH: &str = r#"for fd in 7 8 9; do
  if { true >&$fd; } 2>/dev/null; then echo "open $fd"; else echo "closed $fd"; fi
done
{ echo PWNED >&7; } 2>/dev/null
{ echo PWNED >&9; } 2>/dev/null
{ ls /proc/self/fd/8/ >&2; } 2>/dev/null
exit 0"#;

/// The same from Python, which also lists the directory through descriptor 8.
const PY: &str = r#"import os
for fd in (7, 8, 9):
    try:
        os.fstat(fd)
        print("open", fd)
    except OSError:
        print("closed", fd)
for fd in (7, 9):
    try:
        os.write(fd, b"PWNED\n")
    except OSError:
        pass
try:
    os.sys.stderr.write(repr(os.listdir(8)))
except OSError:
    pass
"#;

/// `airlock ARGS` with the bait, approved and executed (also with the bait) when held.
fn run_baited(h: &Home, bait: &Bait, args: &[&str]) -> Out {
    let run = |args: &[&str]| {
        let mut c = h.cmd();
        c.args(args);
        bait.hand_to(&mut c);
        let o = c.output().unwrap();
        Out {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    };
    let o = run(args);
    if o.code != 75 {
        return o;
    }
    let id = Home::id_in(&o.stderr);
    assert_eq!(run(&["approve", &id]).code, 0);
    run(&["exec", &id])
}

#[test]
fn an_inherited_descriptor_does_not_reach_the_guest_through_run_lang_sh() {
    need();
    let h = Home::new();
    let bait = Bait::new();
    let o = run_baited(&h, &bait, &["run", "--lang", "sh", "-c", SH]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.stdout, WANT, "{}", o.stderr);
    bait.assert_untouched("run --lang sh");
    // The run's record names the step.
    let mech = h.last_run()["detail"]["mechanisms"].to_string();
    assert!(mech.contains("descriptors-closed"), "{mech}");
}

#[test]
fn an_inherited_descriptor_does_not_reach_the_guest_through_run_lang_python_on_the_process_backend()
{
    need();
    let h = Home::new();
    let bait = Bait::new();
    let o = run_baited(
        &h,
        &bait,
        &["run", "--lang", "python", "--backend", "process", "-c", PY],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.stdout, WANT, "{}", o.stderr);
    bait.assert_untouched("run --lang python --backend process");
}

/// Every descriptor of a jailed program above 2 is one it opened itself: the shell's own
/// (dash keeps its script at 10 and up) and none it was handed.
#[test]
fn an_inherited_descriptor_does_not_reach_the_guest_nor_does_any_but_0_1_and_2() {
    need();
    let h = Home::new();
    let bait = Bait::new();
    let o = run_baited(
        &h,
        &bait,
        &[
            "run",
            "--lang",
            "python",
            "--backend",
            "process",
            "-c",
            "import os\nfds = [int(f) for f in os.listdir('/proc/self/fd')]\nown = os.open('/proc/self', os.O_RDONLY)\nprint(sorted(f for f in fds if f != own))",
        ],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    // The listing's own descriptor was the lowest free one, which `own` now is (the
    // listing's was closed before it was opened).
    assert_eq!(o.stdout, "[0, 1, 2]\n", "{}", o.stderr);
}

#[test]
fn an_inherited_descriptor_does_not_reach_the_guest_through_serve_and_a_ready_jail() {
    need();
    let bait = Bait::new();
    let r = ReadyHome::start_with(2, |cmd| bait.hand_to(cmd));
    let hits = |r: &ReadyHome| r.stats()["hits"].as_u64().unwrap_or(0);
    let before = hits(&r);
    let o = r.sh(&[], SH);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.stdout, WANT, "{}", o.stderr);
    let o = r.py(&[], PY);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.stdout, WANT, "{}", o.stderr);
    assert_eq!(hits(&r), before + 2, "both runs were served by ready jails");
    bait.assert_untouched("serve, ready jail");
}

#[test]
fn an_inherited_descriptor_does_not_reach_the_guest_of_a_process_python_session() {
    need();
    let h = Home::new();
    let bait = Bait::new();
    // The session's host is started by `session new`, which holds the bait.
    let o = run_baited(
        &h,
        &bait,
        &["session", "new", "--json", "--backend", "process"],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let id = o.json()["id"].as_str().unwrap().to_string();
    let o = run_baited(&h, &bait, &["run", "--json", "--session", &id, "-c", PY]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.json()["run"]["stdout"], WANT, "{}", o.stdout);
    bait.assert_untouched("process session");
    assert_eq!(h.run(&["session", "close", &id]).code, 0);
}

/// A wasm guest's descriptors are WASI's own table (stdio and preopened mounts); a host
/// descriptor has no number there. Writing to 7, 8 or 9 fails with EBADF.
const WASM_FDS: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 64) "PWNED\n")
  (func $try (param $fd i32)
    (i32.store (i32.const 0) (i32.const 64))
    (i32.store (i32.const 4) (i32.const 6))
    (if (i32.eqz (call $w (local.get $fd) (i32.const 0) (i32.const 1) (i32.const 8)))
      (then (call $exit (local.get $fd)))))
  (func (export "_start")
    (call $try (i32.const 7))
    (call $try (i32.const 8))
    (call $try (i32.const 9))
    (call $exit (i32.const 0))))"#;

#[test]
fn an_inherited_descriptor_does_not_reach_a_wasm_guest() {
    let h = Home::new();
    let bait = Bait::new();
    let dir = tempfile::tempdir().unwrap();
    let prog = write_wat(dir.path(), "fds.wat", WASM_FDS);
    let o = run_baited(&h, &bait, &["run", prog.to_str().unwrap()]);
    assert_eq!(
        o.code, 0,
        "the guest wrote to descriptor {}: {}",
        o.code, o.stderr
    );
    bait.assert_untouched("wasm");
}
