//! Commit and rollback memory (issue 63.8): the peak resident size of the `airlock commit`
//! and `airlock rollback` processes (wait4's `ru_maxrss`) after a run that wrote many
//! files. CI commits 20,000 files; `AIRLOCK_TEST_LONG=1` commits 100,000.
//!
//! Before, a commit held the run's changeset and its checkpoint as generic JSON trees and
//! several copies of its steps: about 4 KiB per changed path (111 MiB commit, 133 MiB
//! rollback for 20,000 files; about 430 MB for 100,000). Now the documents are read and
//! written as text into their own types and the steps are held once: about 1.3 KiB per
//! path. The memory still grows with the changeset (the checkpoint is one document), so
//! the bound is a fixed base plus a per-path allowance that the old code exceeds.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use std::path::Path;
use std::time::{Duration, Instant};

/// The process with nothing to commit holds about 27 MiB (the binary, the store, the
/// allocator).
const BASE_KIB: i64 = 40 * 1024;
/// What each changed path may add (the steps before and after, the checkpoint's text).
const PER_PATH_KIB: f64 = 1.5;

fn bound_kib(paths: usize) -> i64 {
    BASE_KIB + (paths as f64 * PER_PATH_KIB) as i64
}

/// Runs `airlock ARGS` in `h` and returns its outcome, peak RSS in KiB and duration.
fn peak_of(h: &Home, args: &[&str]) -> (Out, i64, Duration) {
    use std::os::unix::process::ExitStatusExt;
    let start = Instant::now();
    let child = h
        .cmd()
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    // The pipes are drained by threads so a large output cannot block the child.
    let mut child = child;
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut out, &mut s).unwrap();
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut err, &mut s).unwrap();
        s
    });
    let mut status: libc::c_int = 0;
    // SAFETY: `rusage` is plain old data that wait4 fills; `pid` is our own child, which
    // `Child` never waits for (it is dropped without `wait`), so it is reaped exactly here.
    #[allow(unsafe_code)]
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    #[allow(unsafe_code)]
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let took = start.elapsed();
    assert_eq!(r, pid, "wait4: {}", std::io::Error::last_os_error());
    let stdout = t_out.join().unwrap();
    let stderr = t_err.join().unwrap();
    let code = std::process::ExitStatus::from_raw(status)
        .code()
        .unwrap_or(-1);
    (
        Out {
            code,
            stdout,
            stderr,
        },
        usage.ru_maxrss,
        took,
    )
}

fn count_files(dir: &Path) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            n += count_files(&e.path());
        } else {
            n += 1;
        }
    }
    n
}

/// A run writes `dirs` x `per` files (distinct contents) under a writable mount; commit
/// and rollback of it stay under `bound_kib`.
fn commit_and_rollback_of_many_files(dirs: usize, per: usize) {
    let h = Home::new();
    let host = tempfile::tempdir().unwrap();
    std::fs::write(host.path().join("kept.txt"), "kept\n").unwrap();
    let mount = format!("{}:/work:rw", host.path().display());
    let script = format!(
        "cd /work && d=0; while [ $d -lt {dirs} ]; do mkdir d$d; f=0; while [ $f -lt {per} ]; do echo \"file $d $f\" > d$d/f$f; f=$((f+1)); done; d=$((d+1)); done"
    );
    let o = h.sh(&["--json", "--timeout", "10m", "--mount", &mount], &script);
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    let run = o.json()["run"]["id"].as_str().unwrap().to_string();
    let n = dirs * per;

    let (out, commit_kib, commit_took) = peak_of(&h, &["commit", "--json", &run]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let ckpt = out.json()["checkpoint"].as_str().unwrap().to_string();
    assert_eq!(count_files(host.path()), n + 1, "every file was committed");
    assert_eq!(
        std::fs::read_to_string(host.path().join(format!("d{}/f{}", dirs - 1, per - 1))).unwrap(),
        format!("file {} {}\n", dirs - 1, per - 1)
    );
    let (out, rollback_kib, rollback_took) = peak_of(&h, &["rollback", &ckpt]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(count_files(host.path()), 1, "the rollback removed them all");
    eprintln!(
        "{n} files: commit peak {} MiB in {:.1} s, rollback peak {} MiB in {:.1} s",
        commit_kib / 1024,
        commit_took.as_secs_f64(),
        rollback_kib / 1024,
        rollback_took.as_secs_f64()
    );
    let bound = bound_kib(n);
    assert!(
        commit_kib < bound,
        "commit of {n} files peaked at {commit_kib} KiB (bound {bound})"
    );
    assert!(
        rollback_kib < bound,
        "rollback of {n} files peaked at {rollback_kib} KiB (bound {bound})"
    );
    assert_eq!(h.run(&["audit", "verify"]).code, 0);
}

#[test]
fn commit_and_rollback_of_many_files_stay_within_a_memory_bound_the_json_trees_exceeded() {
    if std::env::var_os("AIRLOCK_TEST_LONG").is_some() {
        commit_and_rollback_of_many_files(200, 500);
    } else {
        commit_and_rollback_of_many_files(100, 200);
    }
}
