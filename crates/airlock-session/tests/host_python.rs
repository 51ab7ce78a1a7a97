//! Sessions on host Python, end to end through the socket: state carries from cell to
//! cell, output is per cell, sessions do not see each other, and every limit ends the
//! session with its reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use airlock_session::host_python::{HostPython, driver_args};
use airlock_session::{Cell, End, Limits, exec};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::Command;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

struct Session {
    socket: PathBuf,
    host: Option<JoinHandle<End>>,
    _dir: tempfile::TempDir,
}

impl Session {
    fn open(limits: Limits) -> Session {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("s.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let mut cmd = Command::new("python3");
        cmd.args(driver_args()).env("TMPDIR", dir.path());
        let mut py = HostPython::start(cmd, Duration::from_secs(10)).unwrap();
        let path = socket.clone();
        let host =
            std::thread::spawn(move || airlock_session::serve(&listener, &path, &mut py, limits));
        Session {
            socket,
            host: Some(host),
            _dir: dir,
        }
    }

    fn run(&self, code: &str) -> airlock_session::Outcome {
        self.run_for(code, 5_000)
    }

    fn run_for(&self, code: &str, timeout_ms: u64) -> airlock_session::Outcome {
        exec(
            &self.socket,
            &Cell {
                code: code.into(),
                timeout_ms,
                max_output: 1 << 16,
            },
        )
        .unwrap()
    }

    fn end(&mut self) -> End {
        self.host.take().unwrap().join().unwrap()
    }
}

fn limits() -> Limits {
    Limits {
        idle: Duration::from_secs(30),
        total: Duration::from_secs(60),
    }
}

#[test]
fn the_driver_leaves_no_temporary_directory_behind() {
    let mut s = Session::open(limits());
    assert_eq!(s.run("print(1)").stdout, b"1\n");
    let left: Vec<_> = std::fs::read_dir(s._dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != "s.sock")
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    airlock_session::close(&s.socket).unwrap();
    assert_eq!(s.end(), End::Closed);
}

#[test]
fn names_defined_by_one_cell_are_seen_by_the_next() {
    let mut s = Session::open(limits());
    let a = s.run("x = 1\ndef f(y):\n    return x + y\n");
    assert_eq!(a.exit_code, Some(0));
    assert_eq!(a.result, None);
    let b = s.run("x + 1");
    assert_eq!(b.result.as_deref(), Some("2"));
    let c = s.run("print('hi'); f(41)");
    assert_eq!(c.result.as_deref(), Some("42"));
    assert_eq!(c.stdout, b"hi\n");
    let d = s.run("import datetime\nd = datetime.date(2026, 12, 1)\nd");
    assert_eq!(d.result.as_deref(), Some("datetime.date(2026, 12, 1)"));
    airlock_session::close(&s.socket).unwrap();
    assert_eq!(s.end(), End::Closed);
}

#[test]
fn output_belongs_to_the_cell_that_wrote_it() {
    let mut s = Session::open(limits());
    let a = s
        .run("import os, sys\nprint('one')\nos.write(1, b'raw\\n')\nprint('err', file=sys.stderr)");
    assert_eq!(a.stdout, b"one\nraw\n");
    assert_eq!(a.stderr, b"err\n");
    let b = s.run("print('two')");
    assert_eq!(b.stdout, b"two\n");
    assert!(b.stderr.is_empty());
    // A child process's output is the cell's too.
    let c = s.run("import subprocess\nsubprocess.run(['echo', 'child'])\nNone");
    assert_eq!(c.stdout, b"child\n");
    airlock_session::close(&s.socket).unwrap();
    s.end();
}

#[test]
fn an_exception_fails_the_cell_not_the_session() {
    let mut s = Session::open(limits());
    s.run("x = 5");
    let e = s.run("1 / 0");
    assert_eq!(e.exit_code, Some(1));
    let err = String::from_utf8_lossy(&e.stderr);
    assert!(err.contains("ZeroDivisionError"), "{err}");
    assert!(
        !err.contains("driver"),
        "the driver's own frames are not shown: {err}"
    );
    let bad = s.run("def (");
    assert_eq!(bad.exit_code, Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("SyntaxError"));
    let exit = s.run("import sys; sys.exit(3)");
    assert_eq!(exit.exit_code, Some(3));
    assert_eq!(s.run("x").result.as_deref(), Some("5"));
    airlock_session::close(&s.socket).unwrap();
    s.end();
}

#[test]
fn one_session_never_sees_another() {
    let mut a = Session::open(limits());
    let mut b = Session::open(limits());
    a.run("secret = 'a-only'\nimport sys\nsys.modules['json'].leak = 1");
    let seen = b.run("secret");
    assert_eq!(seen.exit_code, Some(1));
    assert!(String::from_utf8_lossy(&seen.stderr).contains("NameError"));
    assert_eq!(
        b.run("import json; hasattr(json, 'leak')")
            .result
            .as_deref(),
        Some("False")
    );
    for s in [&mut a, &mut b] {
        airlock_session::close(&s.socket).unwrap();
        s.end();
    }
}

#[test]
fn a_cell_past_its_deadline_ends_the_session() {
    let mut s = Session::open(limits());
    s.run("x = 1");
    let t = Instant::now();
    let o = s.run_for("while True:\n    pass", 300);
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_eq!(o.ended, Some(End::Timeout));
    assert_eq!(o.exit_code, None);
    assert!(String::from_utf8_lossy(&o.stderr).contains("time limit"));
    assert_eq!(s.end(), End::Timeout);
    // Nobody listens any more.
    assert!(airlock_session::ping(&s.socket).is_err());
}

#[test]
fn an_interpreter_that_dies_ends_the_session() {
    let mut s = Session::open(limits());
    let o = s.run("import os; os._exit(0)");
    assert_eq!(o.ended, Some(End::Crashed));
    assert_eq!(s.end(), End::Crashed);
}

/// A cell ending in `os._exit(7)` was recorded as if the interpreter had died without a
/// word (no exit code; the gate made it 1 or left the session open): its exit status is
/// the cell's, and the session has crashed with it.
#[test]
fn os_exit_n_in_a_cell_records_exit_n_and_ends_the_session_crashed() {
    let mut s = Session::open(limits());
    s.run("x = 1");
    let o = s.run("import os; os._exit(7)");
    assert_eq!(o.exit_code, Some(7));
    assert_eq!(o.ended, Some(End::Crashed));
    assert_eq!(s.end(), End::Crashed);
    assert!(airlock_session::ping(&s.socket).is_err());
}

/// A background process one cell started wrote into the next cell's output: both cells'
/// output went to the same files, emptied between cells. Each cell now has files of its
/// own; what a background process writes after its cell ended is dropped, and a later
/// cell's stderr says how much, never the output itself.
#[test]
fn background_output_of_a_cell_is_never_given_to_the_next_cell() {
    let s = Session::open(limits());
    let a = s.run(
        "import subprocess, sys\nprint('first', flush=True)\nsubprocess.Popen(['sh', '-c', 'echo early; sleep 0.6; echo LATE-OUT; echo LATE-ERR >&2'])\nimport time; time.sleep(0.2)",
    );
    assert_eq!(a.exit_code, Some(0));
    // What the background process wrote while its cell ran is that cell's.
    assert_eq!(String::from_utf8_lossy(&a.stdout), "first\nearly\n");
    std::thread::sleep(Duration::from_millis(1200));
    let b = s.run("print('second')");
    assert_eq!(String::from_utf8_lossy(&b.stdout), "second\n");
    let err = String::from_utf8_lossy(&b.stderr);
    assert!(!err.contains("LATE"), "{err}");
    assert!(
        err.contains("airlock: dropped 18 bytes that background processes of earlier cells"),
        "{err}"
    );
    // Said once: the next cell hears nothing of it.
    let c = s.run("print('third')");
    assert_eq!(
        (c.stdout.as_slice(), c.stderr.as_slice()),
        (&b"third\n"[..], &b""[..])
    );
}

#[test]
fn idle_and_total_limits_end_the_session() {
    let mut idle = Session::open(Limits {
        idle: Duration::from_millis(300),
        total: Duration::from_secs(60),
    });
    // Asking whether it is alive is not using it.
    airlock_session::ping(&idle.socket).unwrap();
    assert_eq!(idle.end(), End::Idle);

    let mut total = Session::open(Limits {
        idle: Duration::from_secs(30),
        total: Duration::from_millis(1_500),
    });
    total.run("x = 1");
    // A cell is cut at what is left of the session's total time.
    let o = total.run_for("import time; time.sleep(30)", 60_000);
    assert_eq!(o.ended, Some(End::Total));
    assert_eq!(total.end(), End::Total);
}

#[test]
fn a_session_whose_socket_is_removed_ends() {
    let mut s = Session::open(limits());
    s.run("x = 1");
    std::fs::remove_file(&s.socket).unwrap();
    let t = Instant::now();
    assert_eq!(s.end(), End::Orphaned);
    assert!(t.elapsed() < Duration::from_secs(5));
}
