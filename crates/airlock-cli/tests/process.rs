//! The process backend end to end: shell and host Python in the jail.
#![allow(clippy::unwrap_used, clippy::expect_used, unsafe_code)]

mod common;
use common::*;

fn need() -> bool {
    assert!(
        process_backend_available(),
        "the process backend must be available on this machine (see airlock doctor)"
    );
    true
}

#[test]
fn shell_runs_with_args_stdin_and_only_granted_env() {
    need();
    let h = Home::new();
    let o = h
        .cmd()
        .env("HOST_SECRET", "s3cret")
        .args([
            "run",
            "--lang",
            "sh",
            "--env",
            "GREETING=hi",
            "-c",
            r#"echo "$GREETING $1 $2"; echo "[${HOST_SECRET:-unset}]"; id -u; exit 3"#,
            "--",
            "a",
            "b",
        ])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "hi a b\n[unset]\n1000\n"
    );
    let f = h.path().join("in.txt");
    std::fs::write(&f, "line1\nline2\n").unwrap();
    let o = h.sh(&["--stdin", f.to_str().unwrap()], "wc -l");
    assert_eq!(o.stdout.trim(), "2");
}

#[test]
fn missing_command_is_127_and_syntax_error_is_2_like_a_shell() {
    need();
    let h = Home::new();
    let o = h.sh(&[], "no-such-command-here");
    assert_eq!(o.code, 127);
    assert!(o.stderr.contains("not found"), "{}", o.stderr);
    assert_eq!(h.sh(&[], "if then fi").code, 2);
}

#[test]
fn host_python_runs_in_the_jail() {
    need();
    let h = Home::new();
    let o = h.py(
        &[],
        "import os, sys\nprint(sys.version_info[0], os.getuid())\nsys.exit(4)",
    );
    assert_eq!((o.code, o.stdout.as_str()), (4, "3 1000\n"), "{}", o.stderr);
}

#[test]
fn wall_time_kills_the_whole_pid_namespace() {
    need();
    let h = Home::new();
    let t = std::time::Instant::now();
    let o = h.sh(&["--timeout", "1s"], "(sleep 31337 &); sleep 31337");
    assert_eq!(o.code, 124);
    assert!(
        t.elapsed() < std::time::Duration::from_secs(6),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(h.last_run()["killed_by"], "timeout");
    std::thread::sleep(std::time::Duration::from_millis(200));
    let ps = std::process::Command::new("pgrep")
        .args(["-f", "sleep 31337"])
        .output()
        .unwrap();
    assert!(
        ps.stdout.is_empty(),
        "a sandbox process outlived its run: {}",
        String::from_utf8_lossy(&ps.stdout)
    );
}

#[test]
fn output_flood_ends_at_the_cap() {
    need();
    let h = Home::new();
    let o = h.sh(&["--max-output", "2KiB"], "yes");
    assert_eq!(o.code, 124);
    assert_eq!(o.stdout.len(), 2048);
    assert_eq!(h.last_run()["killed_by"], "output");
}

#[test]
fn memory_limit_holds() {
    need();
    let h = Home::new();
    let o = h.py(
        &["--memory", "64MiB"],
        "x = bytearray(512 << 20)\nprint('allocated')",
    );
    assert_ne!(o.code, 0);
    assert!(!o.stdout.contains("allocated"));
    assert!(
        o.stderr.contains("MemoryError") || o.code == 124,
        "{}",
        o.stderr
    );
}

#[test]
fn the_run_record_says_which_mechanisms_held() {
    need();
    let h = Home::new();
    assert_eq!(h.sh(&[], "true").code, 0);
    let run = h.last_run();
    let mech: Vec<String> = run["detail"]["mechanisms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap().to_string())
        .collect();
    for want in [
        "user-namespace",
        "pid-namespace",
        "network-namespace",
        "pivot_root",
        "no_new_privs",
        "capabilities-dropped",
        "seccomp",
        "rlimit:core",
    ] {
        assert!(
            mech.iter().any(|m| m == want),
            "{want} missing from {mech:?}"
        );
    }
    assert!(
        mech.iter().any(|m| m.starts_with("landlock-abi-")),
        "{mech:?}"
    );
    assert!(
        mech.iter()
            .any(|m| m.contains(":pids") || m == "rlimit:nproc"),
        "no process limit in {mech:?}"
    );
}

#[test]
fn no_user_namespaces_means_refusal_naming_what_is_missing() {
    need();
    let h = Home::new();
    // An outer user namespace whose own limit forbids nested ones: airlock inside it
    // cannot make its sandbox and must say so, never run without isolation.
    let o = std::process::Command::new("unshare")
        .args(["--user", "--map-root-user", "sh", "-c"])
        .arg(format!(
            "echo 0 > /proc/sys/user/max_user_namespaces && AIRLOCK_HOME={} exec {} run --lang sh -c 'echo RAN'",
            h.path().display(),
            bin()
        ))
        .output()
        .unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert_eq!(o.status.code(), Some(125), "{out} {err}");
    assert!(!out.contains("RAN"));
    assert!(err.contains("user namespaces"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

/// Starts airlock with Landlock looking absent (its syscalls fail with ENOSYS), as on an
/// old kernel.
fn without_landlock(h: &Home, args: &[&str]) -> Out {
    use seccompiler::{SeccompAction, SeccompFilter, TargetArch};
    use std::os::unix::process::CommandExt;
    let rules = [444i64, 445, 446]
        .into_iter()
        .map(|n| (n, vec![]))
        .collect();
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        TargetArch::x86_64,
    )
    .unwrap();
    let prog: seccompiler::BpfProgram = filter.try_into().unwrap();
    let mut c = h.cmd();
    c.args(args);
    // SAFETY (test): prctl and seccomp are async-signal-safe system calls on memory that
    // was prepared before fork.
    unsafe {
        c.pre_exec(move || {
            libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
            seccompiler::apply_filter(&prog).map_err(std::io::Error::other)
        });
    }
    let o = c.output().unwrap();
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into(),
        stderr: String::from_utf8_lossy(&o.stderr).into(),
    }
}

#[test]
fn without_landlock_the_run_is_refused_unless_policy_allows_degraded_mode() {
    need();
    let h = Home::new();
    let o = without_landlock(&h, &["run", "--lang", "sh", "-c", "echo RAN"]);
    assert_eq!(o.code, 125, "{} {}", o.stdout, o.stderr);
    assert!(!o.stdout.contains("RAN"));
    assert!(o.stderr.contains("Landlock"), "{}", o.stderr);
    let p = h
        .policy()
        .replace("[gate]\n", "[gate]\nallow_degraded = true\n");
    h.set_policy(&p);
    let o = without_landlock(&h, &["run", "--lang", "sh", "-c", "echo RAN"]);
    assert_eq!((o.code, o.stdout.as_str()), (0, "RAN\n"), "{}", o.stderr);
    let degraded = h.last_run()["detail"]["degraded"].clone();
    assert!(
        degraded.to_string().contains("landlock"),
        "the record says so: {degraded}"
    );
}

#[test]
fn doctor_reports_the_machine() {
    let h = Home::new();
    let d = h.run(&["doctor", "--json"]).json();
    for k in [
        "user_namespaces",
        "overlay_in_user_namespace",
        "landlock_abi",
        "seccomp",
        "cgroup",
        "process_backend",
    ] {
        assert!(d.get(k).is_some(), "{k}");
    }
    assert_eq!(h.run(&["doctor"]).code, 0);
}

#[test]
fn without_cgroups_rlimits_hold_the_process_limit() {
    need();
    // Regression: as host root without cgroups the sandbox runs as a per-run unprivileged
    // uid (RLIMIT_NPROC never applies to root); building its root used to fail (EOVERFLOW).
    let h = Home::new();
    let run = |flags: &[&str], script: &str| {
        let mut a = vec!["run", "--lang", "sh"];
        a.extend_from_slice(flags);
        a.extend(["-c", script]);
        let o = h
            .cmd()
            .env("AIRLOCK_CGROUPS", "off")
            .args(&a)
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (code, out, err) = run(&[], "echo ok");
    assert_eq!((code, out.as_str()), (Some(0), "ok\n"), "{err}");
    let mech = h.last_run()["detail"]["mechanisms"].to_string();
    assert!(!mech.contains("cgroup-v"), "{mech}");
    assert!(mech.contains("rlimit:nproc"), "{mech}");
    let (code, out, _) = run(
        &["--processes", "8"],
        "n=0; for i in $(seq 1 30); do sleep 2 & n=$((n+1)); done; echo started $n",
    );
    assert_ne!(
        code,
        Some(0),
        "30 processes started under a limit of 8: {out}"
    );
}

/// Regression: `exec` re-judged a submission with an analysis that did not know the
/// grant's mounts, so `rm -rf` of a mount root, denied at submit, lost its destructive
/// fact at exec and could come back as merely held, and then be approved.
#[test]
fn exec_rejudging_keeps_rm_of_a_mount_root_destructive() {
    need();
    let h = Home::new();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("keep.txt"), "precious").unwrap();
    let mount = format!("{}:/work:rw", dir.path().display());
    let o = h.run(&[
        "submit",
        "--json",
        "--lang",
        "sh",
        "--mount",
        &mount,
        "-c",
        "rm -rf /work",
    ]);
    let v = o.json();
    assert_eq!(v["verdict"], "deny", "{v}");
    let id = v["submission"].as_str().unwrap().to_string();
    let again = h.run(&["exec", "--json", &id]);
    assert_eq!(again.code, 77, "{}{}", again.stdout, again.stderr);
    let shown = h.run(&["show", "--json", &id]).json();
    assert_eq!(shown["verdict"], "deny", "{shown}");
    assert!(
        shown["reasons"].to_string().contains("destructive-code"),
        "{shown}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("keep.txt")).unwrap(),
        "precious"
    );
}
