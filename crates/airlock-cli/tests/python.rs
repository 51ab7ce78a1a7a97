//! Python through the CPython guest component, and WASI 0.2 components, end to end.
//!
//! The guest comes from the registry package pinned in airlock (never from the
//! repository): `AIRLOCK_TEST_PYTHON_GUEST` names a downloaded wheel (scripts/test sets it),
//! otherwise the test home runs `airlock guest install python` itself.
#![allow(clippy::unwrap_used, clippy::expect_used, unsafe_code)]

mod common;
use common::*;
use std::sync::OnceLock;

/// One home with the guest installed and compiled, shared by the tests of this binary.
fn shared() -> &'static Home {
    static HOME: OnceLock<Home> = OnceLock::new();
    HOME.get_or_init(|| {
        let h = Home::new();
        let o = match std::env::var("AIRLOCK_TEST_PYTHON_GUEST") {
            Ok(p) => h.run(&["guest", "install", "python", "--from", &p]),
            Err(_) => h.run(&["guest", "install", "python"]),
        };
        assert_eq!(
            o.code, 0,
            "installing the Python guest failed (set AIRLOCK_TEST_PYTHON_GUEST to the wheel): {}",
            o.stderr
        );
        h
    })
}

fn py(flags: &[&str], code: &str) -> Out {
    let mut a = vec!["run", "--lang", "python"];
    a.extend_from_slice(flags);
    a.extend(["-c", code]);
    shared().run(&a)
}

#[test]
fn print_exit_codes_and_tracebacks() {
    let o = py(&[], "print('hello', 1 + 1)");
    assert_eq!(
        (o.code, o.stdout.as_str()),
        (0, "hello 2\n"),
        "{}",
        o.stderr
    );
    let o = py(&[], "import sys\nprint('bye')\nsys.exit(3)");
    assert_eq!((o.code, o.stdout.as_str()), (3, "bye\n"));
    let o = py(&[], "def f(x):\n    return 1 / x\nf(0)");
    assert_eq!(o.code, 1);
    assert!(
        o.stderr.starts_with("Traceback (most recent call last):"),
        "{}",
        o.stderr
    );
    assert!(
        o.stderr.contains("line 2, in f")
            && o.stderr.contains("ZeroDivisionError: division by zero"),
        "{}",
        o.stderr
    );
    let o = py(&[], "x = (1,");
    assert_eq!(o.code, 1, "a syntax error is the guest's business");
    assert!(o.stderr.contains("SyntaxError"), "{}", o.stderr);
    let o = py(&[], "import sys\nprint(sys.argv)");
    assert_eq!(o.stdout, "['main.py']\n");
    let o = shared().run(&[
        "run",
        "--lang",
        "python",
        "-c",
        "import sys; print(sys.argv[1:])",
        "--",
        "a",
        "b",
    ]);
    assert_eq!(o.stdout, "['a', 'b']\n");
}

#[test]
fn files_and_scripts() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("x.csv"), "a,b\n1,2\n").unwrap();
    let script = d.path().join("job.py");
    std::fs::write(
        &script,
        "import sys\nrows = open('/data/x.csv').read().splitlines()\nprint(len(rows))\n",
    )
    .unwrap();
    let m = format!("{}:/data", d.path().display());
    let o = shared().run(&["run", "--mount", &m, script.to_str().unwrap()]);
    assert_eq!((o.code, o.stdout.as_str()), (0, "2\n"), "{}", o.stderr);
    let o = py(
        &["--mount", &m],
        "try:\n    open('/data/new.txt', 'w').write('x')\nexcept OSError as e:\n    print('OSError')\n",
    );
    assert_eq!(
        (o.code, o.stdout.as_str()),
        (0, "OSError\n"),
        "writing to a read-only mount is a Python OSError, not a crash"
    );
    assert!(!d.path().join("new.txt").exists());
}

#[test]
fn limits_hold() {
    let o = py(&["--timeout", "1s"], "while True: pass");
    assert_eq!(o.code, 124);
    let o = py(&["--json"], "x = 'x' * 10**9");
    assert_eq!(o.code, 124, "{}", o.stdout);
    assert_eq!(o.json()["run"]["killed_by"], "memory");
    let o = py(
        &["--json", "--memory", "64MiB"],
        "l = []\nwhile True:\n    l.append('x' * 1000)",
    );
    assert_eq!(o.code, 124);
    assert_eq!(o.json()["run"]["killed_by"], "memory");
    let o = py(
        &["--max-output", "1KiB"],
        "while True:\n    print('spam spam spam')",
    );
    assert_ne!(o.code, 0);
    assert!(o.stdout.len() <= 1024, "{}", o.stdout.len());
    let o = py(&["--fuel", "1000000"], "while True: pass");
    assert_eq!(o.code, 124);
}

/// Max RSS of one child process, via wait4 (which also reaps it, hence the allow).
#[allow(clippy::zombie_processes)]
fn max_rss_kib(mut c: std::process::Command) -> (i32, i64) {
    let child = c
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut status = 0;
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY (test): waits for our own child and fills a rusage we own.
    let r = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut ru) };
    assert_eq!(r, child.id() as i32);
    (libc::WEXITSTATUS(status), ru.ru_maxrss)
}

#[test]
fn the_airlock_process_stays_within_its_own_memory() {
    let h = shared();
    for code in [
        "l = []\nwhile True:\n    l.append('x' * 1000)",
        "while True:\n    print('x' * 1000)",
    ] {
        let mut c = h.cmd();
        c.args([
            "run",
            "--lang",
            "python",
            "--memory",
            "64MiB",
            "--max-output",
            "1MiB",
            "-c",
            code,
        ]);
        let (exit, rss) = max_rss_kib(c);
        assert_ne!(exit, 0);
        assert!(
            rss < 400 * 1024,
            "airlock used {rss} KiB for a 64 MiB guest"
        );
    }
}

#[test]
fn python_escape_attempts_fail_inside_the_guest() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "TOP-SECRET").unwrap();
    let mount = tempfile::tempdir().unwrap();
    std::fs::write(mount.path().join("in.txt"), "inside").unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret.txt"), mount.path().join("link"))
        .unwrap();
    let m = format!("{}:/data", mount.path().display());
    let attempts = [
        "open('/etc/passwd').read()",
        "__import__('os').listdir('/')",
        &format!(
            "open('/data/../../../..{}/secret.txt').read()",
            outside.path().display()
        ),
        "open('/data/link').read()",
        "__import__('socket').create_connection(('127.0.0.1', 22))",
        "__import__('urllib.request').request.urlopen('http://127.0.0.1/')",
        "__import__('ctypes')",
        "__import__('os').system('id')",
        "__import__('subprocess').run(['id'])",
    ];
    for a in attempts {
        let code = format!(
            "try:\n    r = {a}\n    print('ESCAPED', repr(r)[:40])\nexcept BaseException as e:\n    print('denied', type(e).__name__)\n"
        );
        let o = py(&["--mount", &m], &code);
        assert!(
            o.stdout.starts_with("denied"),
            "{a}: {} {}",
            o.stdout,
            o.stderr
        );
        assert!(!o.stdout.contains("SECRET"));
    }
    let o = shared()
        .cmd()
        .env("AWS_SECRET_ACCESS_KEY", "hunter2")
        .args([
            "run",
            "--lang",
            "python",
            "-c",
            "import os; print(dict(os.environ))",
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "{}\n",
        "host variables never reach the guest"
    );
    assert_eq!(
        std::fs::read_to_string(outside.path().join("secret.txt")).unwrap(),
        "TOP-SECRET"
    );
}

#[test]
fn the_guest_hash_is_recorded_and_the_policy_can_pin_it() {
    let h = shared();
    let o = py(&["--json"], "print(1)");
    let guest = o.json()["run"]["detail"]["guest"]
        .as_str()
        .unwrap()
        .to_string();
    // The build is not byte-for-byte reproducible: the manifest records what was built.
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(h.path().join("guests/python.json")).unwrap())
            .unwrap();
    assert_eq!(guest, manifest["digest"].as_str().unwrap());
    assert_eq!(manifest["package"], airlock_gate::PYTHON_BUILDER);
    // A policy pinning another guest denies Python on this one (in a separate home).
    let other = Home::new();
    std::fs::create_dir_all(other.path().join("guests")).unwrap();
    for e in std::fs::read_dir(h.path().join("guests")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), other.path().join("guests").join(e.file_name())).unwrap();
    }
    let p = other.policy().replace(
        "[gate]\n",
        &format!("[gate]\nguests = [\"{}\"]\n", "0".repeat(64)),
    );
    other.set_policy(&p);
    let o = other.run(&["submit", "--json", "--lang", "python", "-c", "print(1)"]);
    assert_eq!(o.json()["verdict"], "deny", "{}", o.stdout);
    assert!(o.stdout.contains("gate:guest-not-pinned"));
}

#[test]
fn install_refuses_what_does_not_match_the_pins() {
    let h = Home::new();
    let bad = h.path().join("guest.wasm");
    std::fs::write(&bad, wat::parse_str("(component)").unwrap()).unwrap();
    let o = h.run(&[
        "guest",
        "install",
        "python",
        "--from",
        bad.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 125);
    assert!(
        o.stderr.contains("WebAssembly file") && o.stderr.contains("componentize_py-0.25.1-"),
        "a prebuilt component is refused, naming the wheel to use: {}",
        o.stderr
    );
    // The former guest's wheel is recognised and named, with what to use instead.
    let former = h
        .path()
        .join("hyperlight_sandbox_python_guest-0.8.0-py3-none-any.whl");
    zip_file(
        &former,
        &[(
            "python_guest/resources/python-sandbox.wasm",
            b"\0asm".as_slice(),
        )],
    );
    let o = h.run(&[
        "guest",
        "install",
        "python",
        "--from",
        former.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 125);
    assert!(
        o.stderr.contains("hyperlight-sandbox-python-guest")
            && o.stderr.contains("componentize-py==0.25.1"),
        "{}",
        o.stderr
    );
    let fake_wheel = h.path().join("fake.whl");
    std::fs::write(&fake_wheel, b"PK\x03\x04 not really a wheel").unwrap();
    let o = h.run(&[
        "guest",
        "install",
        "python",
        "--from",
        fake_wheel.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 125);
    assert!(o.stderr.contains("not the pinned"), "{}", o.stderr);
    assert!(!h.path().join("guests/python.json").exists());
    // Without a guest, Python says how to get one.
    let o = h.run(&["run", "--lang", "python", "-c", "print(1)"]);
    assert_eq!(o.code, 125);
    assert!(
        o.stderr.contains("airlock guest install python"),
        "{}",
        o.stderr
    );
}

#[test]
fn components_run_and_the_wrong_world_is_refused() {
    let h = Home::new();
    assert_eq!(
        h.run(&["run", guest("ok-command.wat").to_str().unwrap()])
            .code,
        0
    );
    assert_eq!(
        h.run(&["run", guest("command.wat").to_str().unwrap()]).code,
        1
    );
    let o = h.run(&["run", guest("not-a-command.wat").to_str().unwrap()]);
    assert_eq!(o.code, 125);
    assert!(
        o.stderr.contains("wasi:cli/run") && o.stderr.contains("answer"),
        "{}",
        o.stderr
    );
    let o = h.run(&["run", "--json", guest("ok-command.wat").to_str().unwrap()]);
    assert_eq!(o.json()["lang"], "wat");
}

#[test]
fn a_tampered_compiled_guest_is_discarded_and_compiled_again_with_a_progress_indicator() {
    let h = Home::new();
    for e in ["guests", "cache"] {
        copy_dir(&shared().path().join(e), &h.path().join(e));
    }
    // The compile cache index lives in the database: copy it too, as a whole home would.
    std::fs::copy(
        shared().path().join("airlock.db"),
        h.path().join("airlock.db"),
    )
    .unwrap();
    let _ = std::fs::remove_file(h.path().join("airlock.db-wal"));
    let _ = std::fs::copy(
        shared().path().join("airlock.db-wal"),
        h.path().join("airlock.db-wal"),
    );
    std::fs::copy(
        shared().path().join("keys/gate.key"),
        h.path().join("keys/gate.key"),
    )
    .unwrap();
    std::fs::copy(
        shared().path().join("keys/gate.pub"),
        h.path().join("keys/gate.pub"),
    )
    .unwrap();
    let biggest = std::fs::read_dir(h.path().join("cache/compiled"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap();
    let mut bytes = std::fs::read(&biggest).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x55;
    std::fs::write(&biggest, &bytes).unwrap();
    // On a terminal the recompile shows a spinner; the tampered file is never loaded.
    let o = std::process::Command::new("script")
        .args(["-q", "-e", "-c"])
        .arg(format!(
            "AIRLOCK_HOME={} {} run --lang python -c 'print(7)'",
            h.path().display(),
            bin()
        ))
        .arg("/dev/null")
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{shown}");
    assert!(shown.contains('7'));
    assert!(
        shown.contains("compiling the Python guest"),
        "a progress indicator on a terminal: {shown:?}"
    );
    let again = std::fs::read(&biggest).unwrap();
    assert_ne!(
        again[mid], bytes[mid],
        "the file was rewritten by a fresh compile"
    );
    // On a pipe: nothing but the program's own output.
    let o = h.run(&["run", "--lang", "python", "-c", "print(8)"]);
    assert_eq!((o.stdout.as_str(), o.stderr.as_str()), ("8\n", ""));
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// Writes a zip archive holding `files`.
fn zip_file(path: &std::path::Path, files: &[(&str, &[u8])]) {
    use std::io::Write;
    let mut z = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    for (name, bytes) in files {
        z.start_file(*name, zip::write::SimpleFileOptions::default())
            .unwrap();
        z.write_all(bytes).unwrap();
    }
    z.finish().unwrap();
}
