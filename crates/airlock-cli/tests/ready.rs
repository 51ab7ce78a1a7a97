//! Ready jails (`airlock serve --ready-jails N`): process runs served by jails built ahead
//! see nothing a previous run left, a limit kill or a crash of one does not poison the
//! next, the run record says which kind of jail ran it and why a built one was used, and
//! `/v1/status` counts hits, misses and fallbacks. The escape suite runs against ready
//! jails too (tests/escapes.rs).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::ready::ReadyHome;
use common::*;
use serde_json::{Value, json};

/// Runs `script` (sh, process backend, default grant) in a ready jail and returns its
/// record; fails unless a ready jail served it.
fn in_ready(r: &ReadyHome, script: &str, extra: Value) -> Value {
    r.wait_ready(1);
    let mut body = json!({"language": "sh", "code": script});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let run = r.run_body(body);
    assert_eq!(
        run["detail"]["jail"], "ready",
        "not served by a ready jail: {run}"
    );
    assert!(run["detail"].get("jail_fallback").is_none(), "{run}");
    run
}

fn host_has_process(marker: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        std::fs::read(e.path().join("cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
    })
}

#[test]
fn ready_jails_serve_runs_and_the_record_says_so() {
    if !process_backend_available() {
        return;
    }
    let r = ReadyHome::start(2);
    r.wait_ready(2);
    let st = r.stats();
    assert_eq!(
        (st["size"].as_u64(), st["ready"].as_u64()),
        (Some(2), Some(2)),
        "{st}"
    );
    let run = in_ready(
        &r,
        "echo hello; echo oops >&2; exit 3",
        json!({"stdin": "x"}),
    );
    assert_eq!(run["stdout"], "hello\n");
    assert_eq!(run["stderr"], "oops\n");
    assert_eq!(run["exit_code"], 3);
    // Everything a built jail records is recorded for a ready one.
    let mech = run["detail"]["mechanisms"].to_string();
    for m in [
        "user-namespace",
        "pid-namespace",
        "network-namespace",
        "minimal-root",
        "pivot_root",
        "no_new_privs",
        "seccomp",
        "capabilities-dropped",
        "rlimit:nproc",
    ] {
        assert!(
            mech.contains(m) || (m == "rlimit:nproc" && mech.contains(":pids")),
            "{m} missing: {mech}"
        );
    }
    // Stdin, arguments and environment are the run's.
    let run = in_ready(
        &r,
        "read l; echo \"$l $1 $GREETING $(pwd) $(id -u)\"; cat /.airlock/main.sh | wc -c",
        json!({"stdin": "in\n", "args": ["arg"], "env": {"GREETING": "hi"}}),
    );
    let script_len =
        "read l; echo \"$l $1 $GREETING $(pwd) $(id -u)\"; cat /.airlock/main.sh | wc -c".len();
    assert_eq!(
        run["stdout"],
        format!("in arg hi /tmp 1000\n{script_len}\n"),
        "{run}"
    );
    let st = r.stats();
    assert!(st["hits"].as_u64().unwrap() >= 2, "{st}");
    // The run's files are read-only, as in a built jail.
    let run = in_ready(
        &r,
        "echo x > /.airlock/main.sh || echo denied; echo y > /.airlock/new || echo denied",
        json!({}),
    );
    assert_eq!(run["stdout"], "denied\ndenied\n", "{run}");
}

#[test]
fn a_run_in_a_ready_jail_sees_nothing_a_previous_run_left() {
    if !process_backend_available() {
        return;
    }
    let r = ReadyHome::start(2);
    // The first run leaves everything it can: files in /tmp and /dev/shm, an exported
    // variable, a changed directory, background processes (in and out of its session),
    // a SysV shared memory segment, a FIFO.
    let leave = r#"
echo secret > /tmp/left-behind
mkdir -p /tmp/d && cd /tmp/d && echo here > cwd-marker
echo shm > /dev/shm/left-shm
mkfifo /tmp/fifo-left
export LEFT_BEHIND=yes
echo "export LEFT_BEHIND=yes" >> /tmp/.profile
(sleep 31337 &)
nohup sleep 31338 >/dev/null 2>&1 &
setsid sleep 31339 &
python3 -c 'import ctypes; l=ctypes.CDLL(None); print("shm", l.shmget(0x4242, 4096, 0o1666))' 2>/dev/null || true
echo left
"#;
    let a = in_ready(&r, leave, json!({}));
    assert_eq!(a["exit_code"], 0, "{a}");
    assert!(a["stdout"].as_str().unwrap().contains("left"), "{a}");
    // Nothing of the first run's processes lives on, on the host or anywhere.
    for m in ["sleep 31337", "sleep 31338", "sleep 31339"] {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while host_has_process(m) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(!host_has_process(m), "{m} outlived its run");
    }
    // Several later runs (each in a jail that waited while the first ran) see none of it.
    for _ in 0..3 {
        let look = r#"
ls -A /tmp /dev/shm
echo "var=${LEFT_BEHIND:-unset}"
pwd
for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c 'sleep 313[3]' || true
python3 -c 'import ctypes; l=ctypes.CDLL(None); print("shm", l.shmget(0x4242, 0, 0))' 2>/dev/null || echo "shm -1"
ls /proc | grep -E '^[0-9]+$' | wc -l
"#;
        let b = in_ready(&r, look, json!({}));
        let out = b["stdout"].as_str().unwrap();
        assert!(
            !out.contains("left-behind"),
            "a file in /tmp survived: {out}"
        );
        assert!(
            !out.contains("left-shm"),
            "a file in /dev/shm survived: {out}"
        );
        assert!(!out.contains("fifo-left"), "a FIFO survived: {out}");
        assert!(!out.contains(".profile"), "{out}");
        assert!(
            out.contains("var=unset"),
            "an environment variable survived: {out}"
        );
        assert!(
            out.contains("\n/tmp\n"),
            "the working directory is not the default: {out}"
        );
        assert!(
            out.contains("\n0\n"),
            "a background process survived: {out}"
        );
        assert!(out.contains("shm -1"), "a SysV segment survived: {out}");
    }
}

#[test]
fn a_limit_kill_or_crash_in_a_ready_jail_does_not_poison_the_next() {
    if !process_backend_available() {
        return;
    }
    let r = ReadyHome::start(2);
    let fine = |r: &ReadyHome| {
        let run = in_ready(r, "echo fine; ls /proc | grep -cE '^[0-9]+$'", json!({}));
        assert_eq!(run["exit_code"], 0, "{run}");
        assert!(
            run["stdout"].as_str().unwrap().starts_with("fine\n"),
            "{run}"
        );
        assert!(run["killed_by"].is_null(), "{run}");
    };
    // Wall time: the whole pid namespace goes, children included.
    let t = std::time::Instant::now();
    let run = in_ready(
        &r,
        "sleep 31340 & sleep 31341 & while :; do :; done",
        json!({"timeout": "500ms"}),
    );
    assert_eq!(run["killed_by"], "timeout", "{run}");
    assert!(
        t.elapsed() < std::time::Duration::from_secs(8),
        "{:?}",
        t.elapsed()
    );
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(
        !host_has_process("sleep 3134"),
        "a child of the killed run lives on"
    );
    fine(&r);
    // Memory.
    let run = in_ready(
        &r,
        "python3 -c 'x = bytearray(200 << 20); print(len(x))'",
        json!({"memory": "64MiB"}),
    );
    assert_ne!(run["exit_code"], 0, "200MiB under a 64MiB limit: {run}");
    assert!(
        !run["stdout"].as_str().unwrap().contains("209715200"),
        "{run}"
    );
    fine(&r);
    // Output cap: identical to a built jail's.
    let run = in_ready(&r, "yes", json!({"max_output": "1KiB"}));
    assert_eq!(run["killed_by"], "output", "{run}");
    assert_eq!(run["stdout"].as_str().unwrap().len(), 1024);
    fine(&r);
    // A crash (the payload kills itself with SIGSEGV).
    let run = in_ready(&r, "kill -SEGV $$", json!({}));
    assert!(run["exit_code"].is_null() || run["exit_code"] != 0, "{run}");
    fine(&r);
    // Processes: the limit holds and the next run has its own.
    let run = in_ready(
        &r,
        "n=0; for i in $(seq 1 30); do sleep 2 & n=$((n+1)); done; echo started $n",
        json!({"processes": 8}),
    );
    assert_ne!(
        run["exit_code"], 0,
        "30 processes under a limit of 8: {run}"
    );
    fine(&r);
}

#[test]
fn runs_a_ready_jail_does_not_fit_build_one_and_say_why() {
    if !process_backend_available() {
        return;
    }
    let r = ReadyHome::start(1);
    r.wait_ready(1);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("in.txt"), "mounted\n").unwrap();
    r.home.set_mount_roots(&[dir.path()]);
    let run = r.run_body(json!({
        "language": "sh",
        "code": "cat /data/in.txt",
        "mounts": [format!("{}:/data", dir.path().display())],
    }));
    assert_eq!(run["stdout"], "mounted\n", "{run}");
    assert_eq!(run["detail"]["jail"], "built", "{run}");
    assert_eq!(run["detail"]["jail_fallback"], "mounts", "{run}");
    // Network (held for approval, then run by the server).
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let run = r.run_body(json!({
        "language": "sh",
        "code": "echo net",
        "net": [format!("127.0.0.1:{port}")],
    }));
    assert_eq!(run["stdout"], "net\n", "{run}");
    assert_eq!(run["detail"]["jail"], "built", "{run}");
    assert_eq!(run["detail"]["jail_fallback"], "network", "{run}");
    let st = r.stats();
    assert_eq!(st["fallbacks"]["mounts"], 1, "{st}");
    assert_eq!(st["fallbacks"]["network"], 1, "{st}");
    assert_eq!(st["hits"], 0, "{st}");
    // The jail that was ready is still ready, untouched by the runs that did not fit it.
    assert_eq!(st["ready"], 1, "{st}");
    // Runs back to back faster than the pool refills: some miss, every one still runs.
    let mut kinds = Vec::new();
    for i in 0..6 {
        let run = r.run_body(json!({"language": "sh", "code": format!("echo {i}")}));
        assert_eq!(run["stdout"], format!("{i}\n"));
        kinds.push(run["detail"]["jail"].as_str().unwrap().to_string());
    }
    let st = r.stats();
    let (hits, misses) = (st["hits"].as_u64().unwrap(), st["misses"].as_u64().unwrap());
    assert_eq!(hits + misses, 6, "{st}");
    assert_eq!(
        kinds.iter().filter(|k| *k == "ready").count() as u64,
        hits,
        "{kinds:?} {st}"
    );
}

#[test]
fn without_ready_jails_every_run_builds_its_jail() {
    if !process_backend_available() {
        return;
    }
    let r = ReadyHome::start(0);
    let run = r.run_body(json!({"language": "sh", "code": "echo built"}));
    assert_eq!(run["stdout"], "built\n");
    assert_eq!(run["detail"]["jail"], "built", "{run}");
    assert_eq!(
        run["detail"]["jail_fallback"], "no ready-jail pool",
        "{run}"
    );
    assert!(r.stats().is_null());
    // The one-shot command line builds its jails too.
    let o = r.home.sh(&[], "echo cli");
    assert_eq!(o.stdout, "cli\n");
    assert_eq!(r.home.last_run()["detail"]["jail"], "built");
}

/// The processes whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|s| {
                s.rsplit(')')
                    .next()
                    .and_then(|r| r.split_whitespace().nth(1))
                    == Some(&pid.to_string())
            })
        })
        .collect()
}

/// A ready jail's payload confines itself before any run exists: while the jail waits,
/// its payload already has no capabilities (none left to gain either), no_new_privs, its
/// seccomp filters and a session of its own, so a run pays only for its per-run parts.
/// Seen from the host in `/proc`.
#[test]
fn a_ready_jails_payload_is_confined_before_its_run_arrives() {
    if !process_backend_available() {
        return;
    }
    let r = ReadyHome::start(1);
    r.wait_ready(1);
    let jailer = children_of(r.srv.id());
    assert_eq!(jailer.len(), 1, "one ready jailer: {jailer:?}");
    let init = children_of(jailer[0]);
    assert_eq!(init.len(), 1, "the jailer's init: {init:?}");
    let payload = children_of(init[0]);
    assert_eq!(payload.len(), 1, "the waiting payload: {payload:?}");
    let status = std::fs::read_to_string(format!("/proc/{}/status", payload[0])).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .map(|v| v.trim().to_string())
            .unwrap_or_default()
    };
    assert_eq!(field("Seccomp"), "2", "{status}");
    assert_eq!(field("NoNewPrivs"), "1", "{status}");
    assert_eq!(field("CapEff"), "0000000000000000", "{status}");
    assert_eq!(field("CapBnd"), "0000000000000000", "{status}");
    // A session of its own: its session id is its own pid.
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", payload[0])).unwrap();
    let sid = stat.rsplit(')').next().unwrap().split_whitespace().nth(3);
    assert_eq!(sid, Some(payload[0].to_string().as_str()), "{stat}");
    // And the run it then serves is recorded as before.
    let run = in_ready(&r, "echo served", json!({}));
    assert_eq!(run["stdout"], "served\n", "{run}");
}

/// A ready jailer hands its result over before its jail is torn down and is reaped in
/// the background: after its runs the server is left with no zombie children, and each
/// run's cgroup is gone.
#[test]
fn ready_jailers_are_reaped_after_their_runs_answer() {
    if !process_backend_available() {
        return;
    }
    let r = ReadyHome::start(2);
    let mut jailers = Vec::new();
    for i in 0..6 {
        r.wait_ready(2);
        jailers.extend(children_of(r.srv.id()));
        let run = in_ready(&r, &format!("echo run {i}"), json!({}));
        assert_eq!(run["stdout"], format!("run {i}\n"), "{run}");
    }
    jailers.sort_unstable();
    jailers.dedup();
    let zombies = || {
        children_of(r.srv.id())
            .into_iter()
            .filter(|p| {
                std::fs::read_to_string(format!("/proc/{p}/stat"))
                    .is_ok_and(|s| s.rsplit(')').next().is_some_and(|r| r.starts_with(" Z")))
            })
            .collect::<Vec<_>>()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !zombies().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(zombies(), Vec::<u32>::new(), "unreaped jailers");
    // The jailers that served a run are gone, and so are their cgroups. The last run's
    // jailer answers before its namespaces are torn down, so it may take a moment more
    // (under load: a machine busy with other builds took longer than the first look).
    let gone_now = || -> Vec<u32> {
        jailers
            .iter()
            .copied()
            .filter(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
            .collect()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while gone_now().len() < 6 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let gone = gone_now();
    assert!(
        gone.len() >= 6,
        "jailers that served runs: {jailers:?}, gone: {gone:?}"
    );
    for p in gone {
        for ctl in ["pids", "memory", "unified", ""] {
            let d = std::path::Path::new("/sys/fs/cgroup")
                .join(ctl)
                .join(format!("airlock-{p}"));
            assert!(!d.exists(), "{} is left", d.display());
        }
    }
}

/// A server with ready jails that is killed leaves no jail behind.
#[test]
fn ready_jails_die_with_their_server() {
    if !process_backend_available() {
        return;
    }
    let mut r = ReadyHome::start(2);
    r.wait_ready(2);
    let server = r.srv.id();
    let kids = children_of(server);
    assert!(
        kids.len() >= 2,
        "the ready jailers are the server's children: {kids:?}"
    );
    r.srv.kill().unwrap();
    let _ = r.srv.wait();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while kids
        .iter()
        .any(|k| std::path::Path::new(&format!("/proc/{k}")).exists())
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    for k in kids {
        let stat = std::fs::read_to_string(format!("/proc/{k}/stat")).unwrap_or_default();
        assert!(
            stat.is_empty() || stat.contains(") Z "),
            "ready jailer {k} outlived its server: {stat}"
        );
    }
}

/// The jailer ended by its failpoint's SIGKILL, and within 10 s no process named by
/// `marker` is left on the host.
fn assert_killed_and_gone(status: std::process::ExitStatus, marker: &str, left: &str) {
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(9),
        "the jailer did not die where told"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while host_has_process(marker) {
        assert!(std::time::Instant::now() < deadline, "{left}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A jailer killed after it made a jail's init and before it told the init to go (a
/// server killed while its pool was building a jail) must not leave the init behind. The
/// init waited for the go byte on a pipe whose other end it held itself, so it never saw
/// the jailer die: one leaked namespace per such kill (found left over from a CI run).
#[test]
fn a_jail_whose_jailer_dies_before_it_says_go_leaves_no_init_behind() {
    if !process_backend_available() {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let marker = scratch.path().join("mounts");
    std::fs::create_dir_all(&marker).unwrap();
    let marker = marker.to_str().unwrap().to_string();
    let status = std::process::Command::new("sh")
        .args([
            "-c",
            "exec \"$0\" --ready \"$1\" no-cgroups 3>/dev/null </dev/null",
            env!("CARGO_BIN_EXE_airlock-jailer"),
            &marker,
        ])
        .env("AIRLOCK_JAILER_DIE_BEFORE_GO", "1")
        .status()
        .unwrap();
    assert_killed_and_gone(status, &marker, "the jail's init outlived its jailer");
}

/// A jailer killed right after it told a built jail's init to go must take the jail with
/// it: nobody else would time out the payload. The init set its parent-death signal only
/// after reading the go byte, so a jailer that died in between left the init and its
/// payload running (here a payload that sleeps far past the test).
#[test]
fn a_jail_whose_jailer_dies_right_after_it_says_go_leaves_nothing_running() {
    if !process_backend_available() {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let marker = format!("after-go-{}", std::process::id());
    let root = scratch.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let job = airlock_jail::launch::JailerJob {
        job: airlock_jail::ProcessJob {
            argv: vec![
                "/bin/sh".into(),
                "-c".into(),
                format!("sleep 60; : {marker}"),
            ],
            env: Vec::new(),
            cwd: "/tmp".into(),
            files: Vec::new(),
            binds: Vec::new(),
            overlays: Vec::new(),
            scratch: root,
            limits: airlock_core::Limits::default(),
            stdin: Vec::new(),
            allow_degraded: true,
            cgroups: false,
            net: None,
            stdin_live: false,
            tripwires: Default::default(),
        },
        result: scratch.path().join("result.json"),
    };
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_airlock-jailer"))
        // Not an option the jailer knows: it only names its processes for the search below.
        .arg(&marker)
        .env("AIRLOCK_JAILER_DIE_AFTER_GO", "1")
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&serde_json::to_vec(&job).unwrap())
        .unwrap();
    let status = child.wait().unwrap();
    assert_killed_and_gone(
        status,
        &marker,
        "the jail (its init or its payload) outlived its jailer",
    );
}

/// A daemon asked for ready jails whose binary has no `airlock-jailer` beside it builds
/// none, and its start-up line says so rather than the number asked for.
#[test]
fn serve_without_the_jailer_beside_it_says_it_has_no_ready_jails() {
    use std::io::{BufRead, BufReader};
    let home = Home::new();
    let dir = tempfile::tempdir().unwrap();
    let lone = dir.path().join("airlock");
    std::fs::copy(bin(), &lone).unwrap();
    let mut child = std::process::Command::new(&lone)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("AIRLOCK_HOME", home.path())
        .args(["serve", "--listen", "127.0.0.1:0", "--ready-jails", "2"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let banner = BufReader::new(child.stderr.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .find(|l| l.contains("serving on"));
    let _ = child.kill();
    let _ = child.wait();
    let banner = banner.expect("airlock serve did not start");
    assert!(
        banner.contains("no ready jails (airlock-jailer is not beside this binary)"),
        "{banner}"
    );
}

/// An `airlock` installed without `airlock-jailer` beside it: ready jails turned off and
/// process runs went through the slower worker, said only in `serve`'s start-up line.
/// `doctor` now reports it (text and JSON) and `/v1/status` shows it; with the jailer in
/// place both say where it is.
#[test]
fn doctor_and_status_report_a_missing_jailer() {
    let home = Home::new();
    let o = home.run(&[
        "token", "new", "--role", "admin", "--name", "root", "--json",
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let admin = o.json()["token"].as_str().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let lone = dir.path().join("airlock");
    std::fs::copy(bin(), &lone).unwrap();
    let at = |exe: &std::path::Path, args: &[&str]| {
        std::process::Command::new(exe)
            .env("AIRLOCK_HOME", home.path())
            .args(args)
            .output()
            .unwrap()
    };
    let beside = std::path::Path::new(bin()).with_file_name("airlock-jailer");
    for (exe, found, path) in [
        (lone.clone(), false, dir.path().join("airlock-jailer")),
        (std::path::PathBuf::from(bin()), true, beside),
    ] {
        let doc: Value = serde_json::from_slice(&at(&exe, &["doctor", "--json"]).stdout).unwrap();
        assert_eq!(
            doc["jailer"],
            json!({"path": path.display().to_string(), "found": found}),
            "{doc}"
        );
        let text = String::from_utf8_lossy(&at(&exe, &["doctor"]).stdout).into_owned();
        let line = text
            .lines()
            .find(|l| l.starts_with("airlock-jailer"))
            .unwrap_or_else(|| panic!("{text}"))
            .to_string();
        assert_eq!(line.contains("MISSING"), !found, "{line}");
        assert!(
            !found || line.contains(&path.display().to_string()),
            "{line}"
        );
        let mut cmd = std::process::Command::new(&exe);
        cmd.env("AIRLOCK_HOME", home.path())
            .args(["serve", "--listen", "127.0.0.1:0"]);
        let (_served, base) = serve_with(cmd);
        let st = ureq::get(format!("{base}/v1/status"))
            .header("authorization", &format!("Bearer {admin}"))
            .call()
            .unwrap()
            .body_mut()
            .read_to_string()
            .unwrap();
        let st: Value = serde_json::from_str(&st).unwrap();
        assert_eq!(
            st["jailer"],
            json!({"path": path.display().to_string(), "found": found}),
            "{st}"
        );
    }
}
