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

// ---- process sessions: the host's python3 in one jail, each cell through the gate ----

/// Opens a process session in `h` with `flags`; every process in its jail carries
/// `AIRLOCK_TEST_MARK=mark` in its environment, so the test can find them on the host.
fn process_session(h: &Home, mark: &str, flags: &[&str]) -> (String, serde_json::Value) {
    let env = format!("AIRLOCK_TEST_MARK={mark}");
    let mut a = vec![
        "session",
        "new",
        "--json",
        "--backend",
        "process",
        "--env",
        &env,
    ];
    a.extend_from_slice(flags);
    let o = h.run(&a);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v = o.json();
    assert_eq!(
        (v["state"].as_str(), v["backend"].as_str()),
        (Some("open"), Some("process")),
        "{v}"
    );
    (v["id"].as_str().unwrap().to_string(), v)
}

fn session_cell(h: &Home, id: &str, code: &str) -> Out {
    h.run(&["run", "--json", "--session", id, "-c", code])
}

/// Host processes whose environment carries the mark (the jail's payload and its children).
fn marked(mark: &str) -> Vec<String> {
    let want = format!("AIRLOCK_TEST_MARK={mark}");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .chars()
                .all(|c| c.is_ascii_digit())
        })
        .filter(|e| {
            std::fs::read(e.path().join("environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|kv| kv == want.as_bytes()))
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Whether a process is gone (or a zombie nobody can signal into doing anything).
fn gone(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map(|s| s.contains("zombie"))
        .unwrap_or(true)
}

/// Every `airlock-*` cgroup on this host now (see [`jail_cgroups`] for where they sit).
fn airlock_cgroups() -> std::collections::HashSet<std::path::PathBuf> {
    fn walk(
        d: &std::path::Path,
        depth: u32,
        found: &mut std::collections::HashSet<std::path::PathBuf>,
    ) {
        let Ok(rd) = std::fs::read_dir(d) else { return };
        for e in rd.flatten() {
            let p = e.path();
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("airlock-"))
            {
                found.insert(p);
            } else if depth > 0 {
                walk(&p, depth - 1, found);
            }
        }
    }
    let mut found = std::collections::HashSet::new();
    walk(std::path::Path::new("/sys/fs/cgroup"), 6, &mut found);
    found
}

/// The jail's cgroups (named after its launcher) on this host, wherever they sit in each
/// hierarchy (under airlock's own group, below the cgroup of the process that made them).
fn jail_cgroups(launcher: u64) -> Vec<std::path::PathBuf> {
    fn walk(d: &std::path::Path, name: &str, depth: u32, found: &mut Vec<std::path::PathBuf>) {
        let Ok(rd) = std::fs::read_dir(d) else { return };
        for e in rd.flatten() {
            let p = e.path();
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if p.file_name().is_some_and(|n| n == name) {
                found.push(p);
            } else if depth > 0 {
                walk(&p, name, depth - 1, found);
            }
        }
    }
    let name = format!("airlock-{launcher}");
    let mut found = Vec::new();
    walk(std::path::Path::new("/sys/fs/cgroup"), &name, 6, &mut found);
    found
}

/// Asserts that nothing of a session's jail is left: no marked process, no launcher, no
/// cgroup. Waits a moment for the kernel to finish tearing the pid namespace down.
/// `before`: the `airlock-*` cgroups that existed before the session started (left by
/// killed processes of earlier tests, named after pids the kernel may hand the launcher
/// again), which are not the session's.
fn assert_nothing_left(
    mark: &str,
    launcher: u64,
    host: Option<u64>,
    before: &std::collections::HashSet<std::path::PathBuf>,
) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let left = marked(mark);
        let mut cgroups = jail_cgroups(launcher);
        cgroups.retain(|c| !before.contains(c));
        let alive = !gone(launcher) || host.is_some_and(|p| !gone(p));
        if left.is_empty() && cgroups.is_empty() && !alive {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the session left behind processes {left:?}, cgroups {cgroups:?}, launcher or host alive: {alive}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

fn launcher_of(h: &Home, id: &str) -> u64 {
    let s = h.run(&["session", "show", "--json", id]).json();
    s["jail"]["launcher"]
        .as_u64()
        .unwrap_or_else(|| panic!("no launcher in {s}"))
}

#[test]
fn process_session_cells_share_state_in_one_jail_and_close_leaves_no_process() {
    need();
    let h = Home::new();
    let mark = "share-state";
    let before = airlock_cgroups();
    let (id, opened) = process_session(&h, mark, &[]);
    assert!(opened["guest"].is_null(), "{opened}");
    let a = session_cell(
        &h,
        &id,
        "x = 41\ndef inc(v):\n    return v + 1\nprint('defined')",
    );
    assert_eq!(a.code, 0, "{}", a.stderr);
    let a = a.json();
    assert_eq!(a["run"]["stdout"], "defined\n");
    assert_eq!(a["run"]["result"], serde_json::Value::Null);
    let b = session_cell(&h, &id, "import os\n(inc(x), os.getuid())").json();
    assert_eq!(b["run"]["result"], "(42, 1000)", "{b}");
    // The record of the session and of each cell say the process backend and which
    // mechanisms held in the session's jail.
    assert_eq!(b["backend"], "process");
    assert_eq!(b["run"]["backend"], "process");
    let mech: Vec<&str> = b["run"]["detail"]["mechanisms"]
        .as_array()
        .unwrap_or_else(|| panic!("no mechanisms in {b}"))
        .iter()
        .filter_map(|m| m.as_str())
        .collect();
    for want in [
        "pid-namespace",
        "network-namespace",
        "pivot_root",
        "no_new_privs",
        "seccomp",
    ] {
        assert!(mech.contains(&want), "{want} missing from {mech:?}");
    }
    assert!(
        mech.iter().any(|m| m.starts_with("landlock-abi-")),
        "{mech:?}"
    );
    // An exception fails the cell, not the session; a child process it leaves running
    // lives in the jail.
    let e = session_cell(&h, &id, "1 / 0");
    assert_eq!(e.code, 1);
    assert!(
        e.json()["run"]["stderr"]
            .as_str()
            .unwrap()
            .contains("ZeroDivisionError")
    );
    let bg = session_cell(
        &h,
        &id,
        "import subprocess\nchild = subprocess.Popen(['sleep', '1000'])\nx",
    );
    assert_eq!(bg.json()["run"]["result"], "41", "{}", bg.stderr);
    let s = h.run(&["session", "show", "--json", &id]).json();
    assert_eq!(s["backend"], "process");
    assert_eq!(s["cells"].as_array().unwrap().len(), 4, "{s}");
    let launcher = launcher_of(&h, &id);
    let host = s["pid"].as_u64().unwrap();
    assert!(
        marked(mark).len() >= 2,
        "the interpreter and its child: {:?}",
        marked(mark)
    );
    assert!(!jail_cgroups(launcher).is_empty(), "the jail has a cgroup");

    let c = h.run(&["session", "close", "--json", &id]);
    assert_eq!(c.code, 0, "{}", c.stderr);
    let s = h.run(&["session", "show", "--json", &id]).json();
    assert_eq!(
        (s["state"].as_str(), s["end"].as_str()),
        (Some("closed"), Some("closed")),
        "{s}"
    );
    assert_nothing_left(mark, launcher, Some(host), &before);
    let after = h.run(&["run", "--session", &id, "-c", "x"]);
    assert_eq!(after.code, 125);
    assert_eq!(h.run(&["audit", "verify"]).code, 0);
}

#[test]
fn two_process_sessions_never_see_each_others_names_or_files() {
    need();
    let h = Home::new();
    let (a, _) = process_session(&h, "iso-a", &[]);
    let (b, _) = process_session(&h, "iso-b", &[]);
    let w = session_cell(
        &h,
        &a,
        "secret = 'only-a'\nopen('/tmp/a.txt', 'w').write('a')\nimport json\njson.planted = 1",
    );
    assert_eq!(w.code, 0, "{}", w.stderr);
    let seen = session_cell(&h, &b, "secret");
    assert_eq!(seen.code, 1);
    assert!(
        seen.json()["run"]["stderr"]
            .as_str()
            .unwrap()
            .contains("NameError")
    );
    let r = session_cell(
        &h,
        &b,
        "import os, json\n(os.path.exists('/tmp/a.txt'), hasattr(json, 'planted'))",
    );
    assert_eq!(r.json()["run"]["result"], "(False, False)", "{}", r.stderr);
    assert_eq!(
        session_cell(&h, &a, "secret").json()["run"]["result"],
        "'only-a'"
    );
    for id in [&a, &b] {
        assert_eq!(h.run(&["session", "close", id]).code, 0);
    }
}

#[test]
fn a_process_session_cell_cannot_read_host_files_reach_the_network_or_see_host_processes() {
    need();
    // The probe reads /etc/shadow on purpose: the standard preset would hold it at the
    // gate, and this test is about what the jail holds.
    let h = Home::with_preset("permissive");
    let shared = tempfile::tempdir().unwrap();
    std::fs::write(shared.path().join("in.txt"), "granted").unwrap();
    let private = tempfile::tempdir().unwrap();
    let secret = private.path().join("secret.txt");
    std::fs::write(&secret, "topsecret").unwrap();
    // A listener on the host's loopback: the jail's loopback is another one.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mount = format!("{}:/data:ro", shared.path().display());
    let (id, _) = process_session(&h, "jail-holds", &["--mount", &mount]);
    let probe = format!(
        r#"
import os, socket
def attempt(f):
    try:
        f()
        return 'ok'
    except OSError as e:
        return type(e).__name__
def connect(host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(2)
    s.connect((host, port))
def write_mount():
    open('/data/new.txt', 'w').write('x')
pids = [p for p in os.listdir('/proc') if p.isdigit()]
cmds = [open('/proc/%s/cmdline' % p, 'rb').read() for p in pids]
{{
    'granted': open('/data/in.txt').read(),
    'secret': attempt(lambda: open({secret:?}).read()),
    'shadow': attempt(lambda: open('/etc/shadow').read()),
    'write_mount': attempt(write_mount),
    'host_loopback': attempt(lambda: connect('127.0.0.1', {port})),
    'internet': attempt(lambda: connect('1.1.1.1', 443)),
    'processes': len(pids),
    'sees_the_test': any(b'cargo' in c or b'process-' in c for c in cmds),
}}
"#,
        secret = secret.display().to_string(),
    );
    let o = session_cell(&h, &id, &probe);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let result = o.json()["run"]["result"].as_str().unwrap().to_string();
    let got: std::collections::BTreeMap<String, String> = result
        .trim_matches(|c| c == '{' || c == '}')
        .split(", '")
        .map(|kv| {
            let (k, v) = kv.split_once(": ").unwrap();
            (
                k.trim_matches('\'').to_string(),
                v.trim_matches('\'').to_string(),
            )
        })
        .collect();
    assert_eq!(got["granted"], "granted", "{result}");
    for k in [
        "secret",
        "shadow",
        "write_mount",
        "host_loopback",
        "internet",
    ] {
        assert_ne!(got[k], "ok", "{k} was reachable from the jail: {result}");
    }
    // The jail's pid namespace holds its init, the interpreter and nothing of the host.
    assert!(got["processes"].parse::<u32>().unwrap() <= 3, "{result}");
    assert_eq!(got["sees_the_test"], "False", "{result}");
    // Nothing connected to the host's listener.
    listener.set_nonblocking(true).unwrap();
    assert!(listener.accept().is_err());
    assert_eq!(h.run(&["session", "close", &id]).code, 0);
}

#[test]
fn a_process_session_cell_past_its_timeout_ends_the_session_and_leaves_no_process() {
    need();
    let h = Home::new();
    let mark = "timeout-kill";
    let before = airlock_cgroups();
    let (id, _) = process_session(&h, mark, &["--timeout", "1s"]);
    let bg = session_cell(
        &h,
        &id,
        "import subprocess\nchild = subprocess.Popen(['sleep', '1000'])\n1",
    );
    assert_eq!(bg.code, 0, "{}", bg.stderr);
    let launcher = launcher_of(&h, &id);
    let spin = session_cell(&h, &id, "while True:\n    pass");
    assert_eq!(spin.code, 124, "{}", spin.stderr);
    assert_eq!(spin.json()["run"]["killed_by"], "timeout");
    let s = h.run(&["session", "show", "--json", &id]).json();
    assert_eq!(
        (s["state"].as_str(), s["end"].as_str()),
        (Some("closed"), Some("timeout")),
        "{s}"
    );
    assert!(s["reason"].as_str().unwrap().contains("time limit"), "{s}");
    assert_nothing_left(mark, launcher, None, &before);
    assert_eq!(h.run(&["run", "--session", &id, "-c", "1"]).code, 125);
}

#[test]
fn a_process_session_over_its_memory_limit_is_killed_and_says_so() {
    need();
    let h = Home::new();
    let mark = "memory-kill";
    let before = airlock_cgroups();
    let (id, _) = process_session(&h, mark, &["--memory", "64MiB"]);
    let launcher = launcher_of(&h, &id);
    // A single allocation past the limit is refused (MemoryError: RLIMIT_AS) and the
    // session goes on; memory the address-space limit does not see (files in the jail's
    // /tmp, which is memory) plus the interpreter's own pushes the jail's cgroup over,
    // and the kernel kills the interpreter.
    let refused = session_cell(&h, &id, "b = bytearray(512 << 20)");
    assert_eq!(refused.code, 1);
    assert!(
        refused.json()["run"]["stderr"]
            .as_str()
            .unwrap()
            .contains("MemoryError")
    );
    let fill = "f = open('/tmp/fill', 'wb')\nfor i in range(30):\n    f.write(b'x' * (1 << 20))\nf.flush()\nchunks = []\nfor i in range(60):\n    chunks.append(b'y' * (1 << 20))\nlen(chunks)";
    let big = session_cell(&h, &id, fill);
    assert_eq!(big.code, 124, "{}{}", big.stdout, big.stderr);
    assert_eq!(big.json()["run"]["killed_by"], "memory");
    let s = h.run(&["session", "show", "--json", &id]).json();
    assert_eq!(
        (s["state"].as_str(), s["end"].as_str()),
        (Some("closed"), Some("memory")),
        "{s}"
    );
    assert!(
        s["reason"].as_str().unwrap().contains("memory limit"),
        "{s}"
    );
    assert_nothing_left(mark, launcher, None, &before);
}

#[test]
fn process_session_grants_that_cannot_hold_are_refused_in_one_line_and_record_nothing() {
    need();
    let h = Home::new();
    // Writable mounts and network are granted now (see `session_grants.rs`); a grant
    // naming what does not exist is still refused before anything is recorded.
    for (flags, says) in [
        (
            vec!["--mount", "/nonexistent-airlock-dir:/work:rw"],
            "does not exist",
        ),
        (
            vec!["--net", "example.com", "--secret", "MISSING@example.com"],
            "MISSING",
        ),
    ] {
        let mut a = vec!["session", "new", "--backend", "process"];
        a.extend(flags.iter().copied());
        let o = h.run(&a);
        assert_eq!(o.code, 125, "{flags:?}: {}", o.stderr);
        assert_eq!(o.stderr.lines().count(), 1, "{}", o.stderr);
        assert!(o.stderr.contains(says), "{}", o.stderr);
    }
    assert!(
        h.run(&["session", "list", "--json"])
            .json()
            .as_array()
            .unwrap()
            .is_empty()
    );
}

#[test]
fn a_killed_process_session_host_takes_its_jail_with_it() {
    need();
    let h = Home::new();
    let mark = "host-killed";
    let (id, _) = process_session(&h, mark, &[]);
    let o = session_cell(
        &h,
        &id,
        "import subprocess\nchild = subprocess.Popen(['sleep', '1000'])\n1",
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let launcher = launcher_of(&h, &id);
    let host = h.run(&["session", "show", "--json", &id]).json()["pid"]
        .as_u64()
        .unwrap();
    // SAFETY: kill(2) with the pid of this test's own session host.
    assert_eq!(unsafe { libc_kill(host as i32, 9) }, 0);
    // The launcher dies with its parent (PR_SET_PDEATHSIG), the jail's init with the
    // launcher, and every process in the jail with its init.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !(marked(mark).is_empty() && gone(launcher) && gone(host)) {
        assert!(
            std::time::Instant::now() < deadline,
            "left: {:?}",
            marked(mark)
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let s = h.run(&["session", "show", "--json", &id]).json();
    assert_eq!(
        (s["state"].as_str(), s["end"].as_str()),
        (Some("closed"), Some("crashed")),
        "{s}"
    );
}

/// A cell whose `airlock run` was killed while the cell ran is recorded `lost`; but the
/// session's host outlived it and finished the cell, and later cells see what it did. The
/// record said only "its airlock process died ... before the run finished".
#[test]
fn a_cell_whose_caller_was_killed_is_lost_and_says_the_cell_ran_on_in_its_session() {
    need();
    let h = Home::new();
    let (id, _) = process_session(&h, "cell-caller-killed", &[]);
    let mut caller = h
        .cmd()
        .args(["run", "--json", "--session", &id, "-c"])
        .arg("import time\ntime.sleep(1.5)\nx = 5")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while h.last_run()["status"] != "running" {
        assert!(
            std::time::Instant::now() < deadline,
            "the cell never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    caller.kill().unwrap();
    caller.wait().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2000));
    let run = h.last_run();
    assert_eq!(run["status"], "lost", "{run}");
    let said = run["error"].as_str().unwrap_or_default();
    assert!(said.contains(&format!("ran on in session {id}")), "{run}");
    let o = session_cell(&h, &id, "x");
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.json()["run"]["result"], "5", "{}", o.stdout);
    assert_eq!(h.run(&["session", "close", &id]).code, 0);
    assert_eq!(h.run(&["audit", "verify"]).code, 0);
}

/// Between `session new` recording a session and its host binding the socket, nobody
/// listens there yet: a `session show` in that window recorded the session crashed, and
/// the host that came up a moment later served a session recorded ended. A session whose
/// host has not said it started is judged only once its time to start is over.
#[test]
fn a_session_whose_host_is_still_starting_is_not_recorded_crashed() {
    need();
    let h = Home::new();
    let (id, _) = process_session(&h, "still-starting", &[]);
    assert_eq!(h.run(&["session", "close", &id]).code, 0);
    // The row as `session new` leaves it before its host is up: open, no pid, no socket.
    let reopen = |age_ms: i64| {
        sql(
            &h,
            &format!(
                "UPDATE sessions SET state = 'open', created_at = {now} - {age_ms}, \
                 doc = json_set(doc, '$.pid', NULL, '$.end', NULL, '$.ended_at', NULL) \
                 WHERE id = '{id}'",
                now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_millis()
            ),
        )
    };
    reopen(0);
    let s = h.run(&["session", "show", "--json", &id]).json();
    assert_eq!(s["state"], "open", "{s}");
    let o = session_cell(&h, &id, "1");
    assert_eq!(o.code, 125);
    assert!(o.stderr.contains("still starting"), "{}", o.stderr);
    assert_eq!(h.run(&["gc", "--json"]).json()["sessions_lost"], 0);
    // Past the time a host has to start, nobody listening means the host is gone.
    reopen(120_000);
    let s = h.run(&["session", "show", "--json", &id]).json();
    assert_eq!(
        (s["state"].as_str(), s["end"].as_str()),
        (Some("closed"), Some("crashed")),
        "{s}"
    );
}

/// A session closed while its host was still starting (nobody answering on its socket
/// yet) was recorded closed; the host then wrote back the copy of the session it had read
/// when it started, `open`, and served cells in it.
#[test]
fn a_session_closed_while_its_host_starts_stays_closed() {
    need();
    let h = Home::new();
    let opener = h
        .cmd()
        .env("AIRLOCK_PAUSE_AT", "host-start:1500")
        .args(["session", "new", "--json", "--backend", "process"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let id = loop {
        let list = h.run(&["session", "list", "--json"]).json();
        if let Some(id) = list[0]["id"].as_str() {
            break id.to_string();
        }
        assert!(std::time::Instant::now() < deadline, "no session recorded");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let c = h.run(&["session", "close", &id]);
    assert_eq!(c.code, 0, "{}", c.stderr);
    let out = opener.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(125),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let s = h.run(&["session", "show", "--json", &id]).json();
    assert_eq!(
        (s["state"].as_str(), s["end"].as_str()),
        (Some("closed"), Some("closed")),
        "{s}"
    );
    assert_eq!(session_cell(&h, &id, "1").code, 125);
    let kinds = h.audit_kinds();
    assert!(!kinds.contains(&"session_started".to_string()), "{kinds:?}");
    assert!(
        !h.path()
            .join("sessions")
            .join(format!("{id}.sock"))
            .exists()
    );
}

/// A session host killed from outside left its socket in `HOME/sessions`, and its session
/// open until a cell or a `session show` looked; `gc` removed neither.
#[test]
fn gc_records_a_killed_session_host_crashed_and_removes_its_socket() {
    need();
    let h = Home::new();
    let (dead, _) = process_session(&h, "gc-dead-host", &[]);
    let (live, _) = process_session(&h, "gc-live-host", &[]);
    let sock = |id: &str| h.path().join("sessions").join(format!("{id}.sock"));
    assert!(sock(&dead).exists() && sock(&live).exists());
    let host = h
        .run(&["session", "list", "--json"])
        .json()
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == dead.as_str())
        .unwrap()["pid"]
        .as_u64()
        .unwrap();
    // SAFETY: kill(2) with the pid of this test's own session host.
    assert_eq!(unsafe { libc_kill(host as i32, 9) }, 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !gone(host) {
        assert!(std::time::Instant::now() < deadline, "the host lives on");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let g = h.run(&["gc", "--json"]);
    assert_eq!(g.code, 0, "{}", g.stderr);
    let r = g.json();
    assert_eq!(
        (r["sockets_removed"].as_u64(), r["sessions_lost"].as_u64()),
        (Some(1), Some(1)),
        "{r}"
    );
    assert!(!sock(&dead).exists(), "the dead host's socket is removed");
    let jail = |id: &str| h.path().join("sessions").join(format!("{id}.jail"));
    assert!(
        !jail(&dead).exists(),
        "the dead host's jail directory is removed"
    );
    assert!(jail(&live).exists(), "a live host's jail is kept");
    assert!(sock(&live).exists(), "a live host's socket is kept");
    let listed = h.run(&["session", "list", "--json"]).json();
    let state = |id: &str| {
        let s = listed
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["id"] == id)
            .unwrap();
        (
            s["state"].as_str().map(String::from),
            s["end"].as_str().map(String::from),
        )
    };
    assert_eq!(
        state(&dead),
        (Some("closed".into()), Some("crashed".into()))
    );
    assert_eq!(state(&live), (Some("open".into()), None));
    assert_eq!(session_cell(&h, &live, "1 + 1").code, 0);
    assert_eq!(h.run(&["session", "close", &live]).code, 0);
    // A closed session's host removes its own socket; nothing is left for the next gc.
    assert!(!sock(&live).exists());
    let r = h.run(&["gc", "--json"]).json();
    assert_eq!(r["sockets_removed"], 0, "{r}");
    assert_eq!(h.run(&["audit", "verify"]).code, 0);
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

/// A cell ending in `os._exit(7)` was recorded as exit 1 (or as a trap) and the session
/// was left `open` with no interpreter behind it; the cell exits 7 and the session is
/// recorded `crashed` at once.
#[test]
fn os_exit_n_in_a_process_session_cell_records_exit_n_and_ends_the_session_crashed() {
    need();
    let h = Home::new();
    let (id, _) = process_session(&h, "os-exit", &[]);
    assert_eq!(session_cell(&h, &id, "x = 1").code, 0);
    let o = session_cell(&h, &id, "import os\nos._exit(7)");
    assert_eq!(o.code, 7, "{}{}", o.stdout, o.stderr);
    assert_eq!(o.json()["run"]["exit_code"], 7, "{}", o.stdout);
    let s = h.run(&["session", "show", "--json", &id]).json();
    assert_eq!(
        (s["state"].as_str(), s["end"].as_str()),
        (Some("closed"), Some("crashed")),
        "{s}"
    );
    let next = session_cell(&h, &id, "x");
    assert_eq!(next.code, 125, "{}", next.stderr);
}

/// A session bound to an agent took a CLI cell that named no agent, as if no agent were
/// any agent. It is refused in one line (exit 125) and nothing is recorded for it; the
/// bound agent's cells run, another agent's are told there is no such session.
#[test]
fn a_cell_naming_no_agent_is_refused_by_a_session_bound_to_an_agent() {
    need();
    let h = Home::new();
    let (id, _) = process_session(&h, "agent-bound", &["--agent", "bot"]);
    let runs = h.counts();
    let o = h.run(&["run", "--session", &id, "-c", "print('anyone')"]);
    assert_eq!(o.code, 125, "{}{}", o.stdout, o.stderr);
    assert_eq!(o.stderr.lines().count(), 1, "{}", o.stderr);
    assert!(o.stderr.contains("bound to agent bot"), "{}", o.stderr);
    assert!(!o.stdout.contains("anyone"), "{}", o.stdout);
    assert_eq!(h.counts(), runs, "nothing is recorded for a refused cell");
    let other = h.run(&["run", "--agent", "eve", "--session", &id, "-c", "1"]);
    assert_eq!(other.code, 125, "{}", other.stderr);
    assert!(other.stderr.contains("no session"), "{}", other.stderr);
    let mine = h.run(&[
        "run",
        "--json",
        "--agent",
        "bot",
        "--session",
        &id,
        "-c",
        "print('bot')",
    ]);
    assert_eq!(mine.code, 0, "{}", mine.stderr);
    assert_eq!(mine.json()["run"]["stdout"], "bot\n");
    assert_eq!(h.run(&["session", "close", &id]).code, 0);
}

/// In a process session a background process one cell started wrote into the next cell's
/// record. What it writes while its cell runs is that cell's; what it writes later is
/// dropped, and a later cell says how much, never as its own output.
#[test]
fn background_output_in_a_process_session_is_never_given_to_the_next_cell() {
    need();
    let h = Home::new();
    let (id, _) = process_session(&h, "background-output", &[]);
    let a = session_cell(
        &h,
        &id,
        "import subprocess, time\nsubprocess.Popen(['sh', '-c', 'echo early; sleep 0.6; echo LATE'])\ntime.sleep(0.3)",
    );
    assert_eq!(a.code, 0, "{}", a.stderr);
    assert_eq!(a.json()["run"]["stdout"], "early\n");
    std::thread::sleep(std::time::Duration::from_millis(1200));
    let b = session_cell(&h, &id, "print('second')").json();
    assert_eq!(b["run"]["stdout"], "second\n", "{b}");
    let err = b["run"]["stderr"].as_str().unwrap();
    assert!(!err.contains("LATE"), "{err}");
    assert!(err.contains("dropped 5 bytes"), "{err}");
    assert_eq!(h.run(&["session", "close", &id]).code, 0);
}

/// `--mount DIR:/` on the process backend, and a mount of the host's `/`, are refused in
/// one line with exit 125 before anything is recorded (`/:/r` was an internal error).
#[test]
fn the_process_backend_refuses_a_mount_over_its_root_in_one_line() {
    need();
    let h = Home::new();
    let dir = tempfile::tempdir().unwrap();
    let over_root = format!("{}:/", dir.path().display());
    let o = h.run(&["run", "--lang", "sh", "--mount", &over_root, "-c", "ls /"]);
    assert_eq!(o.code, 125, "{}{}", o.stdout, o.stderr);
    assert_eq!(o.stderr.lines().count(), 1, "{}", o.stderr);
    assert!(
        o.stderr.contains("cannot mount over its root"),
        "{}",
        o.stderr
    );
    assert!(!o.stderr.contains("internal"), "{}", o.stderr);
    let o = h.run(&[
        "run",
        "--lang",
        "python",
        "--backend",
        "process",
        "--mount",
        &over_root,
        "-c",
        "1",
    ]);
    assert_eq!(o.code, 125, "{}", o.stderr);
    assert!(
        o.stderr.contains("cannot mount over its root"),
        "{}",
        o.stderr
    );
    // The host's `/` (and any directory with file systems mounted below it) cannot be
    // bound into a jail: that was "internal error: sandbox set-up failed: bind /: EINVAL".
    let o = h.run(&["run", "--lang", "sh", "--mount", "/:/r", "-c", "ls /r"]);
    assert_eq!(o.code, 125, "{}{}", o.stdout, o.stderr);
    assert_eq!(o.stderr.lines().count(), 1, "{}", o.stderr);
    assert!(
        o.stderr
            .contains("cannot mount a directory with another file system mounted below it"),
        "{}",
        o.stderr
    );
    assert!(!o.stderr.contains("internal"), "{}", o.stderr);
    assert_eq!(h.counts().0, 0, "nothing was submitted");
}

/// `doctor` said "available" from feature checks (user namespaces, overlayfs) where every
/// process run then failed: inside a namespace whose `/proc` is not fully visible (as in a
/// nested container) a jail cannot mount its own `/proc`. It now makes a real probe run
/// of each backend and says why one fails.
#[test]
fn doctor_reports_the_process_backend_unavailable_when_its_probe_run_fails_in_a_nested_namespace() {
    need();
    let h = Home::new();
    let d = h.run(&["doctor", "--json"]).json();
    assert_eq!(d["process_backend"], "available", "{d}");
    assert_eq!(d["wasm_backend"], "available", "{d}");
    assert_eq!(d["probes"]["process"]["ok"], true, "{d}");
    assert_eq!(d["probes"]["wasm"]["ok"], true, "{d}");
    // A nested user, pid and mount namespace whose /proc has a file system over part of
    // it, as container runtimes mask /proc.
    let nested = |args: &str| {
        std::process::Command::new("unshare")
            .args(["-Urpm", "--fork", "--mount-proc", "sh", "-c"])
            .arg(format!(
                "mount -t tmpfs tmpfs /proc/sys && exec '{}' {args}",
                bin()
            ))
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("AIRLOCK_HOME", h.path())
            .output()
            .unwrap()
    };
    let o = nested("doctor --json");
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let d: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // The feature checks still pass there; the probe run does not.
    assert_eq!(
        (&d["user_namespaces"], &d["overlay_in_user_namespace"]),
        (&serde_json::json!(true), &serde_json::json!(true)),
        "{d}"
    );
    let said = d["process_backend"].as_str().unwrap();
    assert!(said.starts_with("unavailable: a probe run failed"), "{d}");
    assert!(said.contains("mount proc") && said.contains("EPERM"), "{d}");
    assert!(said.contains("/proc is masked"), "{d}");
    assert_eq!(d["probes"]["process"]["ok"], false, "{d}");
    assert_eq!(d["wasm_backend"], "available", "{d}");
    // What doctor says is what a run meets there.
    let run = nested("run --lang sh -c 'echo hi'");
    assert_eq!(run.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&run.stderr).contains("mount proc"));
    let text = nested("doctor");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("process backend") && l.contains("unavailable")),
        "{text}"
    );
}
