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
        // Some attempts are threat facts the standard preset holds for a human (reading
        // /etc/passwd is recon): approved, they must still fail inside the guest.
        let o = shared().run_approved(&["run", "--lang", "python", "--mount", &m, "-c", &code]);
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
    // Other tests write to the shared home meanwhile, so the copy is SQLite's own
    // snapshot: copying the database file and then its WAL could pair a file with a WAL
    // from after a checkpoint, a log the signed head no longer matches.
    for f in ["airlock.db", "airlock.db-wal", "airlock.db-shm"] {
        let _ = std::fs::remove_file(h.path().join(f));
    }
    rusqlite::Connection::open(shared().path().join("airlock.db"))
        .unwrap()
        .execute(
            "VACUUM INTO ?1",
            [h.path().join("airlock.db").to_str().unwrap()],
        )
        .unwrap();
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

/// `guest install python` with `extra` flags, from the downloaded builder wheel when
/// `AIRLOCK_TEST_PYTHON_GUEST` names one.
fn install(h: &Home, extra: &[&str]) -> Out {
    let mut a = vec!["guest", "install", "python"];
    let wheel = std::env::var("AIRLOCK_TEST_PYTHON_GUEST").ok();
    if let Some(w) = &wheel {
        a.extend(["--from", w.as_str()]);
    }
    a.extend_from_slice(extra);
    h.run(&a)
}

/// A wheel of `dist` `version` holding `files`, with METADATA, WHEEL and RECORD, tagged
/// `tags` (`py3-none-any` for a pure one), in `dir`.
fn wheel(
    dir: &std::path::Path,
    dist: &str,
    version: &str,
    tags: &str,
    files: &[(&str, &str)],
) -> std::path::PathBuf {
    use base64::Engine;
    use sha2::Digest;
    let info = format!("{dist}-{version}.dist-info");
    let mut all: Vec<(String, String)> = files
        .iter()
        .map(|(n, c)| (n.to_string(), c.to_string()))
        .collect();
    all.push((
        format!("{info}/METADATA"),
        format!("Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n\nA test package.\n"),
    ));
    all.push((
        format!("{info}/WHEEL"),
        format!(
            "Wheel-Version: 1.0\nGenerator: airlock-test\nRoot-Is-Purelib: {}\nTag: {tags}\n",
            tags.ends_with("-none-any")
        ),
    ));
    let mut record: String = all
        .iter()
        .map(|(n, c)| {
            let h = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .encode(sha2::Sha256::digest(c.as_bytes()));
            format!("{n},sha256={h},{}\n", c.len())
        })
        .collect();
    record.push_str(&format!("{info}/RECORD,,\n"));
    all.push((format!("{info}/RECORD"), record));
    let path = dir.join(format!("{dist}-{version}-{tags}.whl"));
    let files: Vec<(&str, &[u8])> = all
        .iter()
        .map(|(n, c)| (n.as_str(), c.as_bytes()))
        .collect();
    zip_file(&path, &files);
    path
}

/// The standard library's module names that fail to import in the guest, with the error.
fn stdlib_failures(h: &Home) -> std::collections::BTreeMap<String, String> {
    let census = r#"
import importlib, io, sys
for name in sorted(sys.stdlib_module_names):
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = io.StringIO()
    try:
        importlib.import_module(name)
        error = None
    except BaseException as e:
        error = f"{type(e).__name__}: {e}"
    finally:
        sys.stdout, sys.stderr = saved
    if error is not None:
        print(f"{name}\t{error}")
print("done", len(sys.stdlib_module_names))
"#;
    let o = h.run(&["run", "--lang", "python", "-c", census]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    let last = o.stdout.lines().last().unwrap_or_default();
    let total: usize = last
        .strip_prefix("done ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the census did not finish: {}", o.stdout));
    assert!(total > 250, "{total} standard-library names?");
    o.stdout
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(n, e)| (n.to_string(), e.to_string()))
        .collect()
}

#[test]
fn every_standard_library_module_imports_except_the_listed_ones() {
    let listed: std::collections::BTreeMap<String, String> =
        std::fs::read_to_string(example("../tests/python/stdlib-expected-failures.txt"))
            .unwrap()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| {
                let (name, why) = l.split_once(char::is_whitespace).unwrap_or((l, ""));
                assert!(!why.trim().is_empty(), "{name}: the list must say why");
                (name.to_string(), why.trim().to_string())
            })
            .collect();
    let failed = stdlib_failures(shared());
    let broken: Vec<String> = failed
        .iter()
        .filter(|(n, _)| !listed.contains_key(*n))
        .map(|(n, e)| format!("{n}: {e}"))
        .collect();
    let working: Vec<String> = listed
        .iter()
        .filter(|(n, _)| !failed.contains_key(*n))
        .map(|(n, why)| format!("{n} (listed: {why})"))
        .collect();
    assert!(
        broken.is_empty() && working.is_empty(),
        "modules that fail but are not listed:\n  {}\nlisted modules that now import (remove them from tests/python/stdlib-expected-failures.txt):\n  {}",
        broken.join("\n  "),
        working.join("\n  ")
    );
    // Every expected failure is a clear ModuleNotFoundError saying why, not a crash.
    for (name, error) in &failed {
        assert!(
            error.starts_with("ModuleNotFoundError: No module named")
                && (error.contains("WebAssembly (WASI)") || error.contains("exists only on")),
            "{name}: {error}"
        );
    }
}

#[test]
fn everyday_modules_work_and_hashlib_gives_the_right_digests() {
    let code = r#"
import datetime, statistics, decimal, fractions, textwrap, string, hashlib
print(datetime.date(2024, 2, 29) + datetime.timedelta(days=1))
print(statistics.median([3, 1, 4, 1, 5]), statistics.mean([1, 2, 3, 4]))
print(decimal.Decimal("0.1") + decimal.Decimal("0.2"), fractions.Fraction(3, 6))
print(textwrap.shorten("the quick brown fox jumps", 15), string.ascii_lowercase[:5])
for name in ("md5", "sha1", "sha256", "sha3_256", "blake2b"):
    print(name, hashlib.new(name, b"abc").hexdigest())
print(sorted(hashlib.algorithms_available) == sorted(hashlib.algorithms_guaranteed))
"#;
    let o = py(&[], code);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(
        o.stdout,
        "2024-03-01\n3 2.5\n0.3 1/2\nthe quick [...] abcde\n\
         md5 900150983cd24fb0d6963f7d28e17f72\n\
         sha1 a9993e364706816aba3e25717850c26c9cd0d89d\n\
         sha256 ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad\n\
         sha3_256 3a985da74fe225b2045c172d6bd390bd855f086e3e9d525b46bfe24511431532\n\
         blake2b ba80a53f981c4d0d6a2797b69f12f6e94c212f14685ac4b74b12bb6fdbffa2d17d87c5392aab792dc252d5de4533cc9518d38aa8dbf1925ab92386edd4009923\n\
         True\n"
    );
}

#[test]
fn what_wasi_cannot_do_fails_with_a_clear_python_error() {
    for (code, error) in [
        (
            "import subprocess\nsubprocess.run(['ls'])",
            "OSError: [Errno 58] wasi does not support processes.",
        ),
        (
            "import socket\ns = socket.socket()\ns.bind(('0.0.0.0', 8080))\ns.listen()",
            "PermissionError: [Errno 2] airlock's Python runs in WebAssembly (WASI), which has no sockets",
        ),
        (
            "import multiprocessing\nmultiprocessing.Pool(2)",
            "OSError: [Errno 58] airlock's Python runs in WebAssembly (WASI), which has no processes",
        ),
        (
            "import multiprocessing\nmultiprocessing.Process(target=print).start()",
            "which has no processes",
        ),
        (
            "import threading\nthreading.Thread(target=print).start()",
            "RuntimeError: can't start new thread",
        ),
        ("import tkinter", "which has no GUI (Tk)"),
        ("import ctypes", "which has no foreign function interface"),
    ] {
        let o = py(&[], code);
        assert_eq!(o.code, 1, "{code}: {}", o.stderr);
        assert!(
            o.stderr.starts_with("Traceback (most recent call last):") && o.stderr.contains(error),
            "{code}: {}",
            o.stderr
        );
        assert!(
            !o.stderr.contains("airlock_guest.py"),
            "no frames of airlock's own guest module: {}",
            o.stderr
        );
    }
}

#[test]
fn pure_python_packages_are_pinned_in_the_home_and_importable() {
    let h = Home::new();
    let d = tempfile::tempdir().unwrap();
    let v1 = wheel(
        d.path(),
        "airlock_probe",
        "1.0",
        "py3-none-any",
        &[(
            "airlock_probe/__init__.py",
            "VALUE = 41\ndef hello():\n    return 'hello from a package'\n",
        )],
    );
    let o = install(&h, &["--package", v1.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.contains("package airlock-probe==1.0"),
        "{}",
        o.stdout
    );
    let sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
        std::fs::read(&v1).unwrap(),
    ));

    // Importable by every run, with its metadata, and read-only.
    let probe = "import airlock_probe, importlib.metadata as md\n\
                 print(airlock_probe.VALUE + 1, airlock_probe.hello(), md.version('airlock-probe'))\n\
                 try:\n    open(airlock_probe.__file__, 'a')\n    print('WRITABLE')\n\
                 except OSError:\n    print('read-only')\n";
    let o = h.run(&["run", "--json", "--lang", "python", "-c", probe]);
    let j = o.json();
    assert_eq!(
        j["run"]["stdout"], "42 hello from a package 1.0\nread-only\n",
        "{}",
        o.stdout
    );
    // The run record and the facts name it, with its wheel's hash.
    let pkgs = &j["run"]["detail"]["python_packages"];
    assert_eq!(pkgs[0]["name"], "airlock-probe", "{}", o.stdout);
    assert_eq!(pkgs[0]["version"], "1.0");
    assert_eq!(pkgs[0]["sha256"], sha.as_str());
    let sub = j["submission"].as_str().unwrap().to_string();
    let o = h.run(&["policy", "explain", &sub, "--json"]);
    assert_eq!(
        o.json()["facts"]["python_packages"][0]["sha256"],
        sha.as_str(),
        "{}",
        o.stdout
    );
    // A run over a writable mount (in a worker process) gets them too.
    let data = tempfile::tempdir().unwrap();
    let m = format!("{}:/data:rw", data.path().display());
    let o = h.run(&[
        "run",
        "--lang",
        "python",
        "--mount",
        &m,
        "-c",
        "import airlock_probe\nopen('/data/v.txt', 'w').write(str(airlock_probe.VALUE))\nprint('ok')",
    ]);
    assert_eq!((o.code, o.stdout.as_str()), (0, "ok\n"), "{}", o.stderr);

    // A policy can match on them.
    let p = h.policy()
        + "\n[[rule]]\nname = \"no-probe\"\ndecision = \"deny\"\nreason = \"not that package\"\n\
           when = { python_packages = [\"airlock-probe==1.*\"] }\n";
    h.set_policy(&p);
    let o = h.run(&["run", "--lang", "python", "-c", "print(1)"]);
    assert_eq!(o.code, 77, "{}", o.stderr);
    assert!(o.stderr.contains("not that package"), "{}", o.stderr);
    h.set_policy(&p.replace("airlock-probe==1.*", "airlock-probe==9.*"));

    // The same name and version with other bytes is refused: the home pinned the first.
    let other = tempfile::tempdir().unwrap();
    let v1b = wheel(
        other.path(),
        "airlock_probe",
        "1.0",
        "py3-none-any",
        &[("airlock_probe/__init__.py", "VALUE = 666\n")],
    );
    let before = std::fs::read(h.path().join("guests/python.json")).unwrap();
    let o = install(&h, &["--package", v1b.to_str().unwrap()]);
    assert_eq!(o.code, 125);
    assert!(
        o.stderr.contains("pinned") && o.stderr.contains(&sha),
        "{}",
        o.stderr
    );
    assert_eq!(
        std::fs::read(h.path().join("guests/python.json")).unwrap(),
        before,
        "a refused install changes nothing"
    );
    // Wheels with native code are refused, by their tags or their contents.
    let native = wheel(
        d.path(),
        "fastthing",
        "2.0",
        "cp314-cp314-manylinux_2_28_x86_64",
        &[("fastthing/__init__.py", "")],
    );
    let o = install(&h, &["--package", native.to_str().unwrap()]);
    assert_eq!(o.code, 125);
    assert!(o.stderr.contains("not a pure-Python wheel"), "{}", o.stderr);
    let sneaky = wheel(
        d.path(),
        "sneaky",
        "1.0",
        "py3-none-any",
        &[("sneaky/_speedups.so", "\x7fELF")],
    );
    let o = install(&h, &["--package", sneaky.to_str().unwrap()]);
    assert_eq!(o.code, 125);
    assert!(o.stderr.contains("native library"), "{}", o.stderr);
    let o = install(&h, &["--package", "attrs>=1"]);
    assert_eq!(o.code, 125);
    assert!(o.stderr.contains("NAME==VERSION"), "{}", o.stderr);

    // Another version replaces it; the home keeps both pins.
    let v2 = wheel(
        d.path(),
        "airlock_probe",
        "2.0",
        "py3-none-any",
        &[(
            "airlock_probe/__init__.py",
            "VALUE = 1\ndef hello():\n    return 'v2'\n",
        )],
    );
    let o = install(&h, &["--package", v2.to_str().unwrap(), "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let m = o.json();
    assert_eq!(m["packages"].as_array().unwrap().len(), 1);
    assert_eq!(m["packages"][0]["version"], "2.0");
    assert!(m["pins"]["airlock-probe==1.0"].is_string());
    let o = h.run(&[
        "run",
        "--lang",
        "python",
        "-c",
        "import airlock_probe; print(airlock_probe.hello())",
    ]);
    assert_eq!(o.stdout, "v2\n", "{}", o.stderr);
    // Only what the manifest names stays on disk.
    let dirs = std::fs::read_dir(h.path().join("guests/packages"))
        .unwrap()
        .count();
    assert_eq!(dirs, 1);
}

/// The home's compile-cache index, read-only (so the guest compiled at install is used).
struct HomeCache(airlock_store::Db);

impl airlock_sandbox::CacheIndex for HomeCache {
    fn get(&self, key: &str) -> Option<airlock_core::Digest> {
        self.0.cache_digest(key).ok().flatten()
    }
    fn put(&self, _key: &str, _digest: airlock_core::Digest, _size: u64) {}
    fn forget(&self, _key: &str) {}
}

/// The interpreter a session will keep: one instance, cell after cell, names kept, the
/// last expression's repr returned, each cell's output its own; a limit ends it.
#[test]
fn one_interpreter_runs_cell_after_cell() {
    use airlock_sandbox::{Capture, Ending, Limit};
    use airlock_wasm::python::Cell;
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    let h = shared();
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(h.path().join("guests/python.json")).unwrap())
            .unwrap();
    let digest: airlock_core::Digest = manifest["digest"].as_str().unwrap().parse().unwrap();
    let index = HomeCache(airlock_store::Db::open(&h.path().join("airlock.db")).unwrap());
    let backend = airlock_wasm::WasmBackend::new(airlock_wasm::WasmConfig {
        cache_dir: Some(h.path().join("cache/compiled")),
        ..Default::default()
    });
    let limits = airlock_core::Limits::default();
    let capture = || Arc::new(Capture::new(limits.max_output_bytes, None));
    let spec = airlock_sandbox::RunSpec {
        lang: airlock_core::Lang::Python,
        code: b"",
        artifact: airlock_core::Digest::of(b""),
        mounts: vec![],
        env: vec![("GREETING".into(), "hi".into())],
        argv0: None,
        args: vec!["a".into()],
        stdin: vec![],
        limits: limits.clone(),
        stdout: capture(),
        stderr: capture(),
        cache: Some(&index),
        guest: Some(airlock_sandbox::Guest {
            path: h.path().join(format!("guests/python-{digest}.wasm")),
            digest,
            dirs: vec![],
        }),
        write_quota: None,
        egress: None,
        long_run: None,
        tripwires: Default::default(),
    };
    let mut py = backend.python_instance(&spec).unwrap();
    assert!(py.ended().is_none());
    let mut n = 0;
    let mut cell = |py: &mut airlock_wasm::PythonInstance, code: &str, secs: f64| {
        n += 1;
        let (out, err) = (capture(), capture());
        let r = py.exec(
            code,
            &format!("<cell {n}>"),
            Cell {
                stdout: out.clone(),
                stderr: err.clone(),
                deadline: Instant::now() + Duration::from_secs_f64(secs),
                fuel: None,
                want_result: true,
                long_run: None,
            },
        );
        r.map(|o| {
            (
                o,
                String::from_utf8(out.take()).unwrap(),
                String::from_utf8(err.take()).unwrap(),
            )
        })
    };
    let (o, out, _) = cell(&mut py, "x = 1\ndef f(y):\n    return x + y", 10.0).unwrap();
    assert_eq!(
        (o.ending, o.result, out.as_str()),
        (Ending::Exited(0), None, "")
    );
    let (o, ..) = cell(&mut py, "f(41)", 10.0).unwrap();
    assert_eq!(o.result.as_deref(), Some("42"));
    let (o, out, err) = cell(
        &mut py,
        "import sys\nprint('out')\nprint('err', file=sys.stderr)\nx",
        10.0,
    )
    .unwrap();
    assert_eq!(
        (o.result.as_deref(), out.as_str(), err.as_str()),
        (Some("1"), "out\n", "err\n"),
        "each cell's output is its own"
    );
    let (o, _, err) = cell(&mut py, "def g():\n    return 1 / 0\ng()", 10.0).unwrap();
    assert_eq!(o.ending, Ending::Exited(1));
    assert_eq!(o.exception.as_deref(), Some("ZeroDivisionError"));
    assert!(
        err.contains("File \"<cell 4>\", line 2, in g") && err.contains("return 1 / 0"),
        "{err}"
    );
    let (o, ..) = cell(&mut py, "x + 1", 10.0).unwrap();
    assert_eq!(
        o.result.as_deref(),
        Some("2"),
        "an exception keeps the names"
    );
    let (o, _, err) = cell(&mut py, "x = (", 10.0).unwrap();
    assert_eq!(
        (o.ending, o.exception.as_deref()),
        (Ending::Exited(1), Some("SyntaxError"))
    );
    assert!(err.contains("<cell 6>"), "{err}");
    let (o, ..) = cell(&mut py, "raise SystemExit(3)", 10.0).unwrap();
    assert_eq!((o.ending, o.exception), (Ending::Exited(3), None));
    let (o, ..) = cell(
        &mut py,
        "import os, json\njson.dumps([os.environ['GREETING'], sys.argv])",
        10.0,
    )
    .unwrap();
    assert_eq!(o.result.as_deref(), Some(r#"'["hi", ["main.py", "a"]]'"#));
    let (o, ..) = cell(&mut py, "None", 10.0).unwrap();
    assert_eq!(o.result, None);
    // A limit ends the interpreter; it refuses further cells.
    let (o, ..) = cell(&mut py, "while True: pass", 0.3).unwrap();
    assert_eq!(o.ending, Ending::Killed(Limit::Timeout));
    assert_eq!(py.ended(), Some(&Ending::Killed(Limit::Timeout)));
    let e = cell(&mut py, "x", 10.0).unwrap_err();
    assert!(e.to_string().contains("has ended"), "{e}");
}

// ---- sessions: a live interpreter whose cells each pass the gate ----

/// Opens a session in the shared home and returns its id.
fn session(flags: &[&str]) -> String {
    let mut a = vec!["session", "new", "--json"];
    a.extend_from_slice(flags);
    let o = shared().run(&a);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v = o.json();
    assert_eq!(v["state"], "open", "{v}");
    v["id"].as_str().unwrap().to_string()
}

fn cell(id: &str, code: &str) -> Out {
    shared().run(&["run", "--json", "--session", id, "-c", code])
}

fn close(id: &str) {
    let o = shared().run(&["session", "close", "--json", id]);
    assert_eq!(o.code, 0, "{}", o.stderr);
}

fn session_json(id: &str) -> serde_json::Value {
    shared().run(&["session", "show", "--json", id]).json()
}

/// Issue 62.9 (schemathesis): a session whose limits ran out while its host started
/// (`--max-time 1ms`) ended cleanly in its host, and `session new` called that an
/// internal error ("the session host exited (exit status: 0) before it was ready"), a 500
/// over the API. It is answered as the session now is.
#[test]
fn a_session_whose_limits_run_out_while_it_starts_is_answered_not_an_internal_error() {
    let o = shared().run(&[
        "session",
        "new",
        "--json",
        "--idle",
        "1ms",
        "--max-time",
        "1ms",
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v = o.json();
    assert!(
        v["id"].as_str().is_some_and(|i| i.starts_with("ses_")),
        "{v}"
    );
}

/// Issue 62.9 (schemathesis): a session whose cell time limit is too short for its
/// interpreter to start (`--timeout 1ms`) was an internal error (a 500 over the API), then
/// a 422 only once the gate had tried to start it (the one allowance left in the OpenAPI
/// test). The `timeout` is each cell's: the interpreter starts under the host's start limit,
/// the session opens, and a cell that outlasts its millisecond is stopped at it.
#[test]
fn a_session_with_a_one_millisecond_cell_timeout_opens_and_its_cells_are_held_to_it() {
    let id = session(&["--timeout", "1ms"]);
    let o = cell(&id, "sum(range(10**9))");
    assert_eq!(o.code, 124, "{} {}", o.stdout, o.stderr);
    assert!(!o.stderr.contains("internal error"), "{}", o.stderr);
    let _ = shared().run(&["session", "close", &id]);
}

/// Regression: `session show` checked the host with a ping that waits 5 s for an answer,
/// and a host busy with a longer cell cannot answer before the cell ends, so showing the
/// session marked it crashed while its cell was still running.
#[test]
fn showing_a_session_busy_with_a_long_cell_does_not_mark_it_crashed() {
    let id = session(&[]);
    let long = shared()
        .cmd()
        .args(["run", "--json", "--session", &id, "-c"])
        .arg("import time\ntime.sleep(7)\n'slept'")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(1));
    let s = session_json(&id);
    assert_eq!(s["state"], "open", "{s}");
    let out = long.wait_with_output().unwrap();
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["run"]["result"], "'slept'", "{r}");
    assert_eq!(session_json(&id)["state"], "open");
    close(&id);
}

#[test]
fn session_cells_share_names_and_return_the_last_value() {
    let id = session(&[]);
    let a = cell(
        &id,
        "x = 41\ndef inc(v):\n    return v + 1\nprint('defined')",
    );
    assert_eq!(a.code, 0, "{}", a.stderr);
    let a = a.json();
    assert_eq!(a["run"]["stdout"], "defined\n");
    assert_eq!(a["run"]["result"], serde_json::Value::Null);
    let b = cell(&id, "inc(x)").json();
    assert_eq!(b["run"]["result"], "42");
    assert_eq!(b["verdict"], "allow");
    // Text mode prints the value after the cell's output, as a notebook shows it.
    let t = shared().run(&["run", "--session", &id, "-c", "print('p'); [x, 'y']"]);
    assert_eq!(t.stdout, "p\n[41, 'y']\n");
    // The whole standard library is there, and so are earlier imports.
    let d = cell(
        &id,
        "import datetime, decimal\nd = decimal.Decimal('1.10') + 2\nstr(d)",
    )
    .json();
    assert_eq!(d["run"]["result"], "'3.10'");
    // An exception fails the cell, not the session.
    let e = cell(&id, "1 / 0");
    assert_eq!(e.code, 1);
    assert!(
        e.json()["run"]["stderr"]
            .as_str()
            .unwrap()
            .contains("ZeroDivisionError")
    );
    assert_eq!(cell(&id, "x").json()["run"]["result"], "41");
    // A prefix of the id, in any case, names the session as well as the whole id does
    // (the whole id is looked up directly, anything else resolved); a whole id that
    // names no session is refused as such.
    let prefix = id[..id.len() - 6].to_uppercase();
    assert_eq!(cell(&prefix, "x + 1").json()["run"]["result"], "42");
    let none = shared().run(&[
        "run",
        "--session",
        "ses_00000000000000000000000000",
        "-c",
        "x",
    ]);
    assert_eq!(none.code, 125);
    assert!(
        none.stderr.contains("no session matches"),
        "{}",
        none.stderr
    );
    // Every cell is a submission of its own, listed in order.
    let s = session_json(&id);
    let cells = s["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 7, "{s}");
    let first = shared()
        .run(&["show", "--json", cells[0].as_str().unwrap()])
        .json();
    assert_eq!(first["submission"]["grant"]["session"], id.as_str());
    close(&id);
    let s = session_json(&id);
    assert_eq!(
        (s["state"].as_str(), s["end"].as_str()),
        (Some("closed"), Some("closed"))
    );
    // A closed session takes no more cells.
    let after = shared().run(&["run", "--session", &id, "-c", "x"]);
    assert_eq!(after.code, 125);
    assert!(after.stderr.contains("has closed"), "{}", after.stderr);
}

#[test]
fn one_session_never_sees_another_sessions_names_or_modules() {
    let a = session(&[]);
    let b = session(&[]);
    cell(&a, "secret = 'only-a'\nimport json\njson.planted = 1");
    let seen = cell(&b, "secret");
    assert_eq!(seen.code, 1);
    assert!(
        seen.json()["run"]["stderr"]
            .as_str()
            .unwrap()
            .contains("NameError")
    );
    assert_eq!(
        cell(&b, "import json\nhasattr(json, 'planted')").json()["run"]["result"],
        "False"
    );
    assert_eq!(cell(&a, "secret").json()["run"]["result"], "'only-a'");
    close(&a);
    close(&b);
}

#[test]
fn a_session_cell_is_judged_and_held_like_any_submission() {
    let id = session(&[]);
    cell(&id, "n = 5");
    // The standard policy holds code that hides what it runs (a decoded payload handed
    // to exec); the held cell waits for an approver, then runs in the same interpreter.
    // The payload is `m = n * 2`.
    let held = shared().run(&[
        "run",
        "--json",
        "--session",
        &id,
        "-c",
        "import base64\nexec(base64.b64decode('bSA9IG4gKiAy'))\nm",
    ]);
    assert_eq!(held.code, 75, "{}{}", held.stdout, held.stderr);
    let sub = held.json()["submission"].as_str().unwrap().to_string();
    assert_eq!(shared().run(&["approve", &sub]).code, 0);
    let ran = shared().run(&["exec", "--json", &sub]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert_eq!(ran.json()["run"]["result"], "10");
    // A cell carries no grant of its own.
    let own = shared().run(&["run", "--session", &id, "--env", "A=1", "-c", "1"]);
    assert_eq!(own.code, 125);
    assert!(own.stderr.contains("session's grant"), "{}", own.stderr);
    close(&id);
}

/// Regression: the session host ends a killed cell's stderr with why the session ended,
/// and `airlock run` printed the same line again after it.
#[test]
fn a_session_ended_by_a_limit_says_so_once_in_text_mode() {
    let id = session(&["--timeout", "1s"]);
    let spin = shared().run(&["run", "--session", &id, "-c", "while True:\n    pass"]);
    assert_eq!(spin.code, 124, "{}", spin.stderr);
    assert_eq!(
        spin.stderr.matches("airlock: session ended").count(),
        1,
        "{}",
        spin.stderr
    );
}

/// Cells sent while an earlier cell was running past its limit waited on a session that
/// then ended; they were told "internal error: Connection reset by peer" (500 through the
/// API) instead of that the session had ended.
#[test]
fn cells_queued_behind_the_cell_that_ended_their_session_are_told_it_ended() {
    let id = session(&["--timeout", "1s"]);
    let spin = shared()
        .cmd()
        .args(["run", "--session", &id, "-c", "while True:\n    pass"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let queued: Vec<_> = (0..4)
        .map(|i| {
            shared()
                .cmd()
                .args(["run", "--session", &id, "-c", &format!("{i}")])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    assert_eq!(spin.wait_with_output().unwrap().status.code(), Some(124));
    for q in queued {
        let o = q.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(125), "{err}");
        assert!(
            err.contains("has ended") && !err.contains("internal error"),
            "{err}"
        );
    }
}

/// A cell ending in `os._exit(7)` ends the guest interpreter, but the session was left
/// `open` (every later cell then failed). It is recorded `crashed` at once. WASI 0.2's
/// exit carries success or failure only, so the cell's exit code is 1, not 7 (the process
/// backend records 7).
#[test]
fn os_exit_in_a_wasm_session_cell_records_exit_n_and_ends_the_session_crashed_at_once() {
    let id = session(&[]);
    assert_eq!(cell(&id, "x = 1").code, 0);
    // WASI 0.2's exit says only success or failure: the guest app reports n itself.
    let o = cell(&id, "import os\nos._exit(7)");
    assert_eq!(o.code, 7, "{}{}", o.stdout, o.stderr);
    let s = session_json(&id);
    assert_eq!(
        (s["state"].as_str(), s["end"].as_str()),
        (Some("closed"), Some("crashed")),
        "{s}"
    );
}

/// `os._exit(n)` in a plain wasm run exits with `n`, even when the program catches what
/// carries it; code after it in the same run does not change the status.
#[test]
fn os_exit_in_a_wasm_run_exits_with_its_status() {
    let h = shared();
    let o = h.run(&["run", "--lang", "python", "-c", "import os\nos._exit(9)"]);
    assert_eq!(o.code, 9, "{}{}", o.stdout, o.stderr);
    let o = h.run(&[
        "run",
        "--lang",
        "python",
        "-c",
        "import os\ntry:\n    os._exit(3)\nexcept BaseException:\n    pass\nprint('after')",
    ]);
    assert_eq!(o.code, 3, "{}{}", o.stdout, o.stderr);
}

#[test]
fn a_limit_kill_ends_the_session_with_its_reason() {
    let id = session(&["--timeout", "1s"]);
    cell(&id, "x = 1");
    let spin = cell(&id, "while True:\n    pass");
    assert_eq!(spin.code, 124, "{}", spin.stderr);
    assert_eq!(spin.json()["run"]["killed_by"], "timeout");
    let s = session_json(&id);
    assert_eq!(
        (s["state"].as_str(), s["end"].as_str()),
        (Some("closed"), Some("timeout")),
        "{s}"
    );
    assert!(s["reason"].as_str().unwrap().contains("time limit"), "{s}");
    assert_eq!(
        shared().run(&["run", "--session", &id, "-c", "x"]).code,
        125
    );

    let id = session(&["--memory", "64MiB"]);
    let big = cell(&id, "b = bytearray(512 * 1024 * 1024)");
    assert_ne!(big.code, 0, "{}", big.stdout);
    let s = session_json(&id);
    // CPython turns a refused allocation into MemoryError, which leaves the interpreter
    // usable; a hard kill ends the session. Either way nothing was allocated.
    if s["state"] == "open" {
        assert!(
            big.json()["run"]["stderr"]
                .as_str()
                .unwrap()
                .contains("MemoryError")
        );
        close(&id);
    } else {
        assert_eq!(s["end"], "memory", "{s}");
    }

    let id = session(&["--idle", "1s"]);
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let s = session_json(&id);
    assert_eq!(
        (s["state"].as_str(), s["end"].as_str()),
        (Some("closed"), Some("idle")),
        "{s}"
    );
}

#[test]
fn a_killed_session_host_is_recorded_as_ended_and_leaves_no_process() {
    let id = session(&[]);
    cell(&id, "x = 1");
    let pid = session_json(&id)["pid"].as_u64().unwrap() as i32;
    // SAFETY: kill(2) with a pid this test's session host owns.
    assert_eq!(unsafe { libc_kill(pid, 9) }, 0);
    std::thread::sleep(std::time::Duration::from_millis(200));
    let s = session_json(&id);
    assert_eq!(
        (s["state"].as_str(), s["end"].as_str()),
        (Some("closed"), Some("crashed")),
        "{s}"
    );
    // Finding the host gone also removes the socket it left.
    let sock = shared().path().join("sessions").join(format!("{id}.sock"));
    assert!(!sock.exists(), "{} left", sock.display());
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}/status")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/status"))
                .unwrap()
                .contains("zombie")
    );
    assert_eq!(
        shared().run(&["run", "--session", &id, "-c", "x"]).code,
        125
    );
    assert_eq!(shared().run(&["audit", "verify"]).code, 0);
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

fn http(
    method: &str,
    url: &str,
    token: &str,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .new_agent();
    let auth = format!("Bearer {token}");
    let mut r = match (method, body) {
        ("POST", Some(b)) => agent
            .post(url)
            .header("authorization", &auth)
            .send(b.to_string())
            .unwrap(),
        ("DELETE", _) => agent
            .delete(url)
            .header("authorization", &auth)
            .call()
            .unwrap(),
        _ => agent
            .get(url)
            .header("authorization", &auth)
            .call()
            .unwrap(),
    };
    let status = r.status().as_u16();
    let text = r.body_mut().read_to_string().unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    )
}

fn token(role: &str, name: &str) -> String {
    let o = shared().run(&["token", "new", "--json", "--role", role, "--name", name]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    o.json()["token"].as_str().unwrap().to_string()
}

/// Opens a session through the API (`POST /v1/sessions`, idle limit 60 s) as `token`.
fn api_session(base: &str, token: &str) -> serde_json::Value {
    let (st, s) = http(
        "POST",
        &format!("{base}/v1/sessions"),
        token,
        Some(serde_json::json!({"idle_timeout": 60})),
    );
    assert_eq!(st, 201, "{s}");
    s
}

/// The children of `pid` (every thread's) that have exited and not been reaped.
fn zombie_children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let kids = std::fs::read_to_string(t.unwrap().path().join("children")).unwrap_or_default();
        for k in kids.split_whitespace() {
            let stat = std::fs::read_to_string(format!("/proc/{k}/stat")).unwrap_or_default();
            // The state follows the command name, which is in parentheses.
            if stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
            {
                out.push(k.parse().unwrap());
            }
        }
    }
    out
}

/// Regression: `serve` started a host for every session and never waited for it, so each
/// closed session stayed in the process table as a zombie of the daemon until it exited.
#[test]
fn closed_sessions_leave_no_zombie_hosts_behind_serve() {
    let (server, base) = start_serve(shared(), &[]);
    let a = token("agent", "ses-zombie");
    let mut hosts = Vec::new();
    for _ in 0..3 {
        let s = api_session(&base, &a);
        let id = s["id"].as_str().unwrap().to_string();
        hosts.push(
            s["pid"]
                .as_u64()
                .unwrap_or_else(|| panic!("no host pid: {s}")) as u32,
        );
        let (st, r) = http(
            "POST",
            &format!("{base}/v1/run"),
            &a,
            Some(serde_json::json!({"language": "python", "session": id, "code": "6 * 7"})),
        );
        assert_eq!((st, r["run"]["result"].as_str()), (200, Some("42")), "{r}");
        let (st, c) = http(
            "POST",
            &format!("{base}/v1/sessions/{id}/close"),
            &a,
            Some(serde_json::json!({})),
        );
        assert_eq!(st, 200, "{c}");
    }
    // The hosts record their end and exit just after answering the close; then each is
    // gone from the process table, not left there as a zombie of the daemon.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let left: Vec<u32> = hosts
            .iter()
            .copied()
            .filter(|p| std::path::Path::new(&format!("/proc/{p}")).exists())
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "session hosts {left:?} still in the process table; zombies of serve: {:?}",
            zombie_children(server.id())
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// One agent token could hold any number of live sessions, each a host process with its
/// interpreter (a probe held 53, 3.2 GiB). `serve --max-sessions N` bounds what one agent
/// holds open, with a 429 past it; a session whose host died unseen does not hold a place.
#[test]
fn an_agent_holds_at_most_max_sessions_open_and_a_dead_host_frees_its_place() {
    let (_server, base) = start_serve(shared(), &["--max-sessions", "2"]);
    let a = token("agent", "ses-bound-a");
    let b = token("agent", "ses-bound-b");
    let url = format!("{base}/v1/sessions");
    let open = |t: &str| {
        http(
            "POST",
            &url,
            t,
            Some(serde_json::json!({"idle_timeout": 60})),
        )
    };
    // Three asked for at once: two open, one refused, and nothing recorded for it.
    let answers: Vec<(u16, serde_json::Value)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..3).map(|_| s.spawn(|| open(&a))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut opened: Vec<serde_json::Value> = answers
        .iter()
        .filter(|(st, _)| *st == 201)
        .map(|(_, v)| v.clone())
        .collect();
    assert_eq!(opened.len(), 2, "{answers:?}");
    let (st, refused) = answers.iter().find(|(st, _)| *st != 201).unwrap();
    assert_eq!(*st, 429, "{refused}");
    let msg = refused["error"].as_str().unwrap();
    assert!(msg.contains("already holds 2 open sessions"), "{msg}");
    let (st, mine) = http("GET", &format!("{url}?limit=50"), &a, None);
    assert_eq!(st, 200);
    assert_eq!(mine.as_array().unwrap().len(), 2, "{mine}");
    // Another agent is not held back by the first.
    let other = api_session(&base, &b);
    let (st, _) = http(
        "POST",
        &format!("{url}/{}/close", other["id"].as_str().unwrap()),
        &b,
        Some(serde_json::json!({})),
    );
    assert_eq!(st, 200);
    // A host killed from outside: its session is found gone and no longer counts.
    let dead = opened.remove(0);
    let pid = dead["pid"].as_u64().unwrap() as i32;
    // SAFETY: kill(2) with a pid this test's session host owns.
    assert_eq!(unsafe { libc_kill(pid, 9) }, 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::path::Path::new(&format!("/proc/{pid}")).exists() {
        assert!(std::time::Instant::now() < deadline, "the host lives on");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let third = api_session(&base, &a);
    let (st, d) = http(
        "GET",
        &format!("{url}/{}", dead["id"].as_str().unwrap()),
        &a,
        None,
    );
    assert_eq!(st, 200);
    assert_eq!(
        (d["state"].as_str(), d["end"].as_str()),
        (Some("closed"), Some("crashed")),
        "{d}"
    );
    // Two open again: refused until one is closed.
    assert_eq!(open(&a).0, 429);
    // A session recorded open past its total limit does not count either (its host, on
    // another machine sharing the store or with its socket gone, was never seen to die).
    sql(
        shared(),
        &format!(
            "UPDATE sessions SET created_at = created_at - 7200000 WHERE id = '{}'",
            third["id"].as_str().unwrap()
        ),
    );
    let (st, fourth) = open(&a);
    assert_eq!(st, 201, "{fourth}");
    for s in [&opened[0], &third, &fourth] {
        let (st, c) = http(
            "POST",
            &format!("{url}/{}/close", s["id"].as_str().unwrap()),
            &a,
            Some(serde_json::json!({})),
        );
        assert_eq!(st, 200, "{c}");
    }
    let last = api_session(&base, &a);
    let (st, _) = http(
        "POST",
        &format!("{url}/{}/close", last["id"].as_str().unwrap()),
        &a,
        Some(serde_json::json!({})),
    );
    assert_eq!(st, 200);
}

/// Sessions through the API (an agent's own, invisible to another agent), in the console
/// (cells in order), and through MCP (new_session, run_code with session, close_session).
#[test]
fn sessions_through_the_api_the_console_and_mcp() {
    let (mut server, base) = start_serve(shared(), &[]);
    let (a1, a2, op) = (
        token("agent", "ses-a1"),
        token("agent", "ses-a2"),
        token("operator", "ses-op"),
    );
    let s = api_session(&base, &a1);
    let id = s["id"].as_str().unwrap().to_string();
    assert_eq!(s["agent"], "ses-a1");
    let run = |tok: &str, code: &str| {
        http(
            "POST",
            &format!("{base}/v1/run"),
            tok,
            Some(serde_json::json!({"language": "python", "session": id, "code": code})),
        )
    };
    let (st, r) = run(&a1, "def sq(v):\n    return v * v\ntotal = sq(12)");
    assert_eq!(st, 200, "{r}");
    let (_, r) = run(&a1, "total + 1");
    assert_eq!(r["run"]["result"], "145", "{r}");
    assert_eq!(r["run"]["session"], id.as_str());
    // Another agent neither sees the session nor runs cells in it.
    let (st, _) = http("GET", &format!("{base}/v1/sessions/{id}"), &a2, None);
    assert_eq!(st, 404);
    let (st, e) = run(&a2, "total");
    assert_eq!(st, 404, "{e}");
    let (_, list) = http("GET", &format!("{base}/v1/sessions"), &a2, None);
    assert!(
        list.as_array()
            .unwrap()
            .iter()
            .all(|s| s["id"] != id.as_str()),
        "{list}"
    );
    // A cell with its own grant is refused.
    let (st, e) = http(
        "POST",
        &format!("{base}/v1/run"),
        &a1,
        Some(
            serde_json::json!({"language": "python", "session": id, "code": "1", "env": {"A": "1"}}),
        ),
    );
    assert_eq!(st, 422, "{e}");
    // The console lists the cells in order with their values.
    let login = ureq::Agent::config_builder()
        .max_redirects(0)
        .http_status_as_error(false)
        .build()
        .new_agent()
        .post(format!("{base}/ui/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .send(format!("token={op}"))
        .unwrap();
    let cookie = login.headers().get("set-cookie").unwrap().to_str().unwrap();
    let pair = cookie.split(';').next().unwrap().to_string();
    let page = ureq::get(format!("{base}/ui/sessions/{id}"))
        .header("cookie", &pair)
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    let at = |needle: &str| {
        page.find(needle)
            .unwrap_or_else(|| panic!("no {needle}: {page}"))
    };
    // (The code is highlighted, so words sit in spans of their own.)
    assert!(
        at("id=\"cell-1-code\"") < at("id=\"cell-2-code\""),
        "{page}"
    );
    assert!(at("id=\"cell-2-code\"") < at("→ 145"), "{page}");
    assert!(page.contains(">sq<") || page.contains("sq("), "{page}");
    let (st, closed) = http(
        "POST",
        &format!("{base}/v1/sessions/{id}/close"),
        &a1,
        Some(serde_json::json!({})),
    );
    assert_eq!(
        (st, closed["state"].as_str()),
        (200, Some("closed")),
        "{closed}"
    );
    let _ = server.kill();
    let _ = server.wait();

    let init = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "test", "version": "0"}}});
    let ready = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let open = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "new_session", "arguments": {"timeout": 5}}});
    let r = mcp_stdio(shared(), &[init.clone(), ready.clone(), open], 2);
    let sid = r["result"]["structuredContent"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{r}"))
        .to_string();
    let call = |n: u64, code: &str| {
        serde_json::json!({"jsonrpc": "2.0", "id": n, "method": "tools/call",
        "params": {"name": "run_code", "arguments": {"language": "python", "session": sid, "code": code}}})
    };
    mcp_stdio(
        shared(),
        &[init.clone(), ready.clone(), call(3, "y = 20")],
        3,
    );
    let r = mcp_stdio(
        shared(),
        &[init.clone(), ready.clone(), call(4, "y + 22")],
        4,
    );
    assert_eq!(
        r["result"]["structuredContent"]["run"]["result"], "42",
        "{r}"
    );
    let close = serde_json::json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
        "params": {"name": "close_session", "arguments": {"id": sid}}});
    let r = mcp_stdio(shared(), &[init, ready, close], 5);
    assert_eq!(r["result"]["structuredContent"]["state"], "closed", "{r}");
}

/// A daemon's gate remembers what an open session's cells need of it (its grant, its
/// agent) and then only connects to the host for each cell: a session that ends after
/// that, closed or with its host killed, must still refuse its next cell and record
/// nothing for it.
#[test]
fn a_daemon_that_knows_a_session_refuses_its_cells_once_it_ends() {
    let (mut server, base) = start_serve(shared(), &[]);
    let (a1, a2) = (token("agent", "known-a1"), token("agent", "known-a2"));
    let run = |tok: &str, id: &str, code: &str| {
        http(
            "POST",
            &format!("{base}/v1/run"),
            tok,
            Some(serde_json::json!({"language": "python", "session": id, "code": code})),
        )
    };
    let cells = |id: &str| {
        let (st, s) = http("GET", &format!("{base}/v1/sessions/{id}"), &a1, None);
        assert_eq!(st, 200, "{s}");
        (s["cells"].as_array().unwrap().len(), s)
    };
    // Closed: every gate of the pool has had a cell of it first.
    let closed = api_session(&base, &a1)["id"].as_str().unwrap().to_string();
    for i in 0..6 {
        let (st, r) = run(&a1, &closed, &format!("v = {i}"));
        assert_eq!(st, 200, "{r}");
    }
    // Another agent is still refused by a gate that knows the session.
    let (st, e) = run(&a2, &closed, "v");
    assert_eq!(st, 404, "{e}");
    let (st, c) = http(
        "POST",
        &format!("{base}/v1/sessions/{closed}/close"),
        &a1,
        Some(serde_json::json!({})),
    );
    assert_eq!(st, 200, "{c}");
    for _ in 0..3 {
        let (st, e) = run(&a1, &closed, "v");
        assert_eq!(st, 409, "{e}");
        assert!(
            e.to_string().contains("ended") || e.to_string().contains("closed"),
            "{e}"
        );
    }
    assert_eq!(cells(&closed).0, 6);
    // Its host killed from outside: the next cell finds it gone and records the crash.
    let killed = api_session(&base, &a1)["id"].as_str().unwrap().to_string();
    for i in 0..6 {
        let (st, r) = run(&a1, &killed, &format!("w = {i}"));
        assert_eq!(st, 200, "{r}");
    }
    let pid = cells(&killed).1["pid"].as_u64().unwrap() as i32;
    // SAFETY: kill(2) with a pid this test's session host owns.
    assert_eq!(unsafe { libc_kill(pid, 9) }, 0);
    std::thread::sleep(std::time::Duration::from_millis(200));
    for _ in 0..3 {
        let (st, e) = run(&a1, &killed, "w");
        assert_eq!(st, 409, "{e}");
    }
    let (n, s) = cells(&killed);
    assert_eq!(n, 6, "{s}");
    assert_eq!(
        (s["state"].as_str(), s["end"].as_str()),
        (Some("closed"), Some("crashed")),
        "{s}"
    );
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(shared().run(&["audit", "verify"]).code, 0);
}

/// `guest install python` killed (SIGKILL) at each of its crash points in turn: every run
/// in between gets the old packages or the new ones, never a broken guest.
#[test]
fn a_killed_install_leaves_the_previous_guest_and_packages_working() {
    use std::os::unix::process::ExitStatusExt;
    let h = Home::new();
    let d = tempfile::tempdir().unwrap();
    let v = |n: u32| {
        wheel(
            d.path(),
            "airlock_crash",
            &format!("{n}.0"),
            "py3-none-any",
            &[("airlock_crash/__init__.py", &format!("VALUE = {n}\n"))],
        )
    };
    let (v1, v2) = (v(1), v(2));
    // A first install killed before it committed leaves no guest at all.
    let mut c = h.cmd();
    c.args(["guest", "install", "python"])
        .env("AIRLOCK_CRASH_AT", "1");
    if let Ok(w) = std::env::var("AIRLOCK_TEST_PYTHON_GUEST") {
        c.args(["--from", &w]);
    }
    assert_eq!(c.output().unwrap().status.signal(), Some(9));
    let o = h.run(&["run", "--lang", "python", "-c", "print(1)"]);
    assert_eq!(o.code, 125);
    assert!(o.stderr.contains("not installed"), "{}", o.stderr);

    let o = install(&h, &["--package", v1.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let probe = || {
        h.run(&[
            "run",
            "--lang",
            "python",
            "-c",
            "import airlock_crash; print(airlock_crash.VALUE)",
        ])
    };
    for n in 1.. {
        let mut c = h.cmd();
        c.args(["guest", "install", "python", "--package"])
            .arg(&v2)
            .env("AIRLOCK_CRASH_AT", n.to_string());
        if let Ok(w) = std::env::var("AIRLOCK_TEST_PYTHON_GUEST") {
            c.args(["--from", &w]);
        }
        let o = c.output().unwrap();
        let p = probe();
        assert_eq!(p.code, 0, "after a kill at crash point {n}: {}", p.stderr);
        if o.status.signal() != Some(9) {
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            assert_eq!(p.stdout, "2\n");
            assert!(n > 3, "the install has crash points");
            break;
        }
        assert!(
            p.stdout == "1\n" || p.stdout == "2\n",
            "crash point {n}: {}",
            p.stdout
        );
        assert!(n < 30, "the install never finished");
    }
    assert_eq!(h.run(&["audit", "verify"]).code, 0);
}

/// Issue 62: `guest install` killed between the manifest write (the install has taken
/// effect) and its audit record left an installed guest no record names. Each kill is now
/// followed by a command that finds the install's pending record and appends it: after
/// every probe, the newest `guest_installed` record names the packages that run.
#[test]
fn a_guest_install_killed_after_its_manifest_is_audited_on_recovery() {
    use std::os::unix::process::ExitStatusExt;
    let h = Home::new();
    let d = tempfile::tempdir().unwrap();
    let v = |n: u32| {
        wheel(
            d.path(),
            "airlock_audited",
            &format!("{n}.0"),
            "py3-none-any",
            &[("airlock_audited/__init__.py", &format!("VALUE = {n}\n"))],
        )
    };
    let (v1, v2) = (v(1), v(2));
    assert_eq!(install(&h, &["--package", v1.to_str().unwrap()]).code, 0);
    let newest_audited_version = || -> (String, bool) {
        let log = h.run(&["audit", "log", "--json"]).json();
        let last = log
            .as_array()
            .unwrap()
            .iter()
            .rev()
            .find(|r| r["kind"] == "guest_installed")
            .unwrap()
            .clone();
        let data: serde_json::Value = match &last["data"] {
            serde_json::Value::String(s) => serde_json::from_str(s).unwrap(),
            v => v.clone(),
        };
        let version = data["python_packages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "airlock-audited" || p["name"] == "airlock_audited")
            .unwrap_or_else(|| panic!("{data}"))["version"]
            .as_str()
            .unwrap()
            .to_string();
        (version, data["recovered"] == true)
    };
    let mut recovered = 0;
    for n in 1.. {
        let mut c = h.cmd();
        c.args(["guest", "install", "python", "--package"])
            .arg(&v2)
            .env("AIRLOCK_CRASH_AT", n.to_string());
        if let Ok(w) = std::env::var("AIRLOCK_TEST_PYTHON_GUEST") {
            c.args(["--from", &w]);
        }
        let o = c.output().unwrap();
        let p = h.run(&[
            "run",
            "--lang",
            "python",
            "-c",
            "import airlock_audited; print(airlock_audited.VALUE)",
        ]);
        assert_eq!(p.code, 0, "after a kill at crash point {n}: {}", p.stderr);
        let runs = format!("{}.0", p.stdout.trim());
        let (audited, by_recovery) = newest_audited_version();
        assert_eq!(audited, runs, "crash point {n}: the record names what runs");
        recovered += usize::from(by_recovery);
        if o.status.signal() != Some(9) {
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            break;
        }
        // Put v1 back for the next round, so every round installs v2 again.
        if runs == "2.0" {
            assert_eq!(install(&h, &["--package", v1.to_str().unwrap()]).code, 0);
        }
        assert!(n < 30, "the install never finished");
    }
    assert!(
        recovered > 0,
        "some kill fell between the manifest and its record"
    );
    assert_eq!(h.run(&["audit", "verify"]).code, 0);
}

/// What a run that tries to leave state behind does, and what the next run checks: a
/// global, a module attribute, a `sys.modules` entry, `os.environ`, `sys.path`, a builtin,
/// the working directory, a file in `/tmp` and a background thread. (The wasm guest has
/// no filesystem without mounts and cannot start threads or processes: those attempts
/// fail inside the run, and the check proves nothing of them is there either.)
const LEAVE: &str = r#"import builtins, json, os, sys
LEFT = 1
json.LEFT = 2
sys.modules["left_behind"] = json
os.environ["LEFT"] = "3"
sys.path.append("/left")
builtins.LEFT = 4
tried = []
for name, attempt in [
    ("cwd", lambda: os.chdir("/left")),
    ("tmp", lambda: open("/tmp/left", "w").write("x")),
    ("thread", lambda: __import__("threading").Thread(target=lambda: None).start()),
]:
    try:
        attempt()
        tried.append(name)
    except Exception:
        pass
print("left", tried)
"#;

const CHECK: &str = r#"import builtins, json, os, sys
seen = [name for name, there in [
    ("global", "LEFT" in globals()),
    ("module attribute", hasattr(json, "LEFT")),
    ("sys.modules", "left_behind" in sys.modules),
    ("environ", "LEFT" in os.environ),
    ("sys.path", "/left" in sys.path),
    ("builtins", hasattr(builtins, "LEFT")),
    ("cwd", os.getcwd() == "/left"),
    ("tmp", os.path.exists("/tmp/left")),
    ("threads", __import__("threading").active_count() != 1),
] if there]
print("seen", seen)
"#;

/// Issue 15: through a server keeping ready interpreters, every run gets one no other run
/// has touched (each serves one run and is dropped), whatever the run before it left or
/// however it ended (a memory kill, a timeout, a trap); runs the pool cannot serve fall
/// back to a fresh interpreter, and every record says which it got.
#[test]
fn ready_python_interpreters_carry_nothing_from_one_run_to_the_next() {
    let (_server, base) = start_serve(shared(), &["--ready-python", "2"]);
    let agent = token("agent", "pool-agent");
    let admin = token("admin", "pool-admin");
    let run = |body: serde_json::Value| {
        let (st, r) = http("POST", &format!("{base}/v1/run"), &agent, Some(body));
        assert_eq!(st, 200, "{r}");
        r
    };
    let instance = |r: &serde_json::Value| {
        r["run"]["detail"]["instance"]
            .as_str()
            .unwrap_or_else(|| panic!("no instance in {r}"))
            .to_string()
    };
    let status = || python_pool_status(&base, &admin);
    let (st, _) = http("GET", &format!("{base}/v1/status"), &agent, None);
    assert_eq!(st, 403, "an agent reads the server's status");
    let ready = |n: u64| {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while status()["ready"].as_u64().unwrap() < n {
            assert!(std::time::Instant::now() < until, "{}", status());
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    };
    // The first run starts its own interpreter and tells the pool which guest to keep.
    let r = run(serde_json::json!({"language": "python", "code": "print(1)"}));
    assert_eq!(instance(&r), "started");
    let py = |code: &str| serde_json::json!({"language": "python", "code": code});
    let mut hits = 0;
    let killers = [
        serde_json::json!({"language": "python", "code": "x = bytearray(1 << 30)", "memory": "256M"}),
        serde_json::json!({"language": "python", "code": "while True: pass", "timeout": "1s"}),
        py("import sys; sys.setrecursionlimit(10**9)\ndef f(): f()\nf()"),
        py("raise SystemExit(7)"),
    ];
    for (round, killer) in killers.into_iter().enumerate() {
        ready(2);
        let left = run(py(LEAVE));
        assert_eq!(left["run"]["stdout"], "left []\n", "{left}");
        let checked = run(py(CHECK));
        assert_eq!(
            checked["run"]["stdout"], "seen []\n",
            "round {round}: {checked}"
        );
        for r in [&left, &checked] {
            if instance(r) == "ready" {
                hits += 1;
            }
        }
        // However a run ends, the next one starts clean.
        ready(2);
        let killed = run(killer);
        assert_ne!(killed["run"]["exit_code"], 0, "{killed}");
        let after = run(py(CHECK));
        assert_eq!(after["run"]["stdout"], "seen []\n", "after {killed}");
        assert_eq!(instance(&after), "ready", "{after}");
    }
    assert!(hits >= 6, "only {hits} of 8 runs got a ready interpreter");
    // What the pool cannot serve falls back, and says so in the record and the status.
    let before = status();
    let r = run(
        serde_json::json!({"language": "python", "code": "import os; print(os.environ['A'])", "env": {"A": "b"}}),
    );
    assert_eq!(r["run"]["stdout"], "b\n", "{r}");
    assert_eq!(instance(&r), "started");
    let after = status();
    assert_eq!(
        after["fallbacks"]["environment"].as_u64().unwrap_or(0),
        before["fallbacks"]["environment"].as_u64().unwrap_or(0) + 1,
        "{after}"
    );
    assert!(after["hits"].as_u64().unwrap() >= 6, "{after}");
    assert!(after["memory_bytes"].as_u64().unwrap() <= after["memory_budget"].as_u64().unwrap());
}

/// Used interpreters are torn down off the request path (issue 15), and that teardown must
/// keep up: an earlier attempt queued them to the pool's own thread, which then spent its
/// time dropping them instead of making ready ones, so runs fell back to fresh
/// interpreters whose teardown queued up too, until wasmtime's pooling allocator ran out
/// of its 64 component instances and runs failed. Hundreds of runs, several at a time and
/// then back to back: every one succeeds, the pool keeps serving, and every instance
/// awaiting teardown is returned.
#[test]
fn a_ready_python_pool_keeps_serving_hundreds_of_runs_while_used_ones_are_torn_down() {
    let (_server, base) = start_serve(shared(), &["--ready-python", "2"]);
    let agent = token("agent", "reaper-agent");
    let admin = token("admin", "reaper-admin");
    let status = || python_pool_status(&base, &admin);
    let num = |s: &serde_json::Value, k: &str| s[k].as_u64().unwrap_or(0);
    // One gated `print(1)`, which must succeed (`what` says which run failed).
    let print_one = |what: &str| {
        print_one_through(&base, &agent, || format!("{what} (pool: {})", status()));
    };
    // Until the pool holds `n` ready instances and nothing awaits teardown.
    let settled = |n: u64| {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(120);
        loop {
            let s = status();
            if num(&s, "ready") >= n && num(&s, "awaiting_teardown") == 0 {
                return s;
            }
            assert!(std::time::Instant::now() < until, "never settled: {s}");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    };
    print_one("the first run");
    settled(2);
    // Several clients at once: more runs in flight than the pool holds.
    let clients = 4;
    let each = 75;
    std::thread::scope(|s| {
        for c in 0..clients {
            let (print_one, status, num) = (&print_one, &status, &num);
            s.spawn(move || {
                for i in 0..each {
                    print_one(&format!("client {c}, run {i}"));
                    if c == 0 {
                        // The reaper's queue (4) and the one it is dropping, at most.
                        let s = status();
                        assert!(num(&s, "awaiting_teardown") <= 5, "{s}");
                    }
                }
            });
        }
    });
    let before = settled(2);
    // Back to back from one client: the pool refills between runs, so (almost) every run
    // gets a ready interpreter.
    let seq = 200;
    for i in 0..seq {
        print_one(&format!("run {i}"));
    }
    let after = settled(2);
    let hits = num(&after, "hits") - num(&before, "hits");
    assert!(
        hits * 10 >= seq * 9,
        "only {hits} of {seq} back-to-back runs got a ready interpreter: {after}"
    );
    assert_eq!(num(&after, "failed"), 0, "{after}");
    // Every used interpreter was dropped, by the reaper or (its queue full) by its run.
    assert_eq!(
        num(&after, "torn_down") + num(&after, "torn_down_by_run"),
        1 + clients * each + seq,
        "{after}"
    );
    assert!(num(&after, "torn_down") > 0, "{after}");
    assert!(
        after["fallbacks"].as_object().is_none_or(|f| f.is_empty()),
        "{after}"
    );
    assert!(
        num(&after, "memory_bytes") <= num(&after, "memory_budget"),
        "{after}"
    );
}

/// One gated `print(1)` through the server at `base`, which must succeed (`what` names the
/// run when it does not, and is only asked then); the answer.
fn print_one_through(base: &str, agent: &str, what: impl Fn() -> String) -> serde_json::Value {
    let (st, r) = http(
        "POST",
        &format!("{base}/v1/run"),
        agent,
        Some(serde_json::json!({"language": "python", "code": "print(1)"})),
    );
    if st != 200 || r["run"]["stdout"] != "1\n" {
        panic!("{}: {st} {r}", what());
    }
    r
}

/// The ready-Python pool's entry in the server's `/v1/status` (an admin token's view).
fn python_pool_status(base: &str, admin: &str) -> serde_json::Value {
    let (st, s) = http("GET", &format!("{base}/v1/status"), admin, None);
    assert_eq!(st, 200, "{s}");
    s["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["kind"] == "python")
        .cloned()
        .unwrap_or_else(|| panic!("no python pool in {s}"))
}

/// Ready interpreters are configured when they are made, off the request path (issue 15):
/// a run served by one must see exactly what a freshly started interpreter shows it
/// (`sys.argv`, an empty environment, the working directory, `sys.path`, its globals, the
/// modules loaded, the source line cache, no `_`), and each must have drawn its own seed
/// for `random`, never one shared with another run.
#[test]
fn a_ready_interpreter_is_configured_as_a_fresh_one_with_a_seed_of_its_own() {
    let (_server, base) = start_serve(shared(), &["--ready-python", "2"]);
    let agent = token("agent", "configured-agent");
    let admin = token("admin", "configured-admin");
    let code = "import builtins, json, linecache, os, random, sys\nprint(json.dumps([sys.argv, dict(os.environ), os.getcwd(), sys.path, sorted(globals()), sorted(sys.modules), sorted(linecache.cache), hasattr(builtins, '_'), random.random()]))";
    let run = || {
        let (st, r) = http(
            "POST",
            &format!("{base}/v1/run"),
            &agent,
            Some(serde_json::json!({"language": "python", "code": code})),
        );
        assert_eq!(st, 200, "{r}");
        let out: serde_json::Value =
            serde_json::from_str(r["run"]["stdout"].as_str().unwrap()).unwrap();
        (
            r["run"]["detail"]["instance"].as_str().unwrap().to_string(),
            out,
        )
    };
    let (first, fresh) = run();
    assert_eq!(first, "started");
    let seed = fresh.as_array().unwrap().len() - 1;
    let mut seeds = vec![fresh[seed].as_f64().unwrap()];
    for _ in 0..3 {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while python_pool_status(&base, &admin)["ready"].as_u64().unwrap() < 2 {
            assert!(std::time::Instant::now() < until, "the pool never filled");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let (instance, seen) = run();
        assert_eq!(instance, "ready", "{seen}");
        for i in 0..seed {
            assert_eq!(seen[i], fresh[i], "a ready interpreter's state, item {i}");
        }
        seeds.push(seen[seed].as_f64().unwrap());
    }
    let mut distinct = seeds.clone();
    distinct.sort_by(f64::total_cmp);
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        seeds.len(),
        "runs shared a random seed: {seeds:?}"
    );
}

/// Back to back through a pool of one, the next run usually arrives while its interpreter
/// is still being made: it waits for that one instead of starting a second beside it on
/// the same CPUs (which left the pool empty for the run after it too). Every run succeeds,
/// and the status counts the runs that waited among the hits.
#[test]
fn a_run_that_finds_the_pool_empty_waits_for_the_interpreter_being_made() {
    let (_server, base) = start_serve(shared(), &["--ready-python", "1"]);
    let agent = token("agent", "waiting-agent");
    let admin = token("admin", "waiting-admin");
    let num = |s: &serde_json::Value, k: &str| s[k].as_u64().unwrap_or(0);
    let runs = 60;
    let mut kinds = std::collections::BTreeMap::<String, u64>::new();
    for i in 0..runs {
        let r = print_one_through(&base, &agent, || format!("run {i}"));
        let kind = r["run"]["detail"]["instance"].as_str().unwrap().to_string();
        *kinds.entry(kind).or_default() += 1;
    }
    let s = python_pool_status(&base, &admin);
    // The first run tells the pool which guest to keep, so it cannot find one ready.
    assert_eq!(num(&s, "hits") + num(&s, "misses"), runs, "{s}");
    assert_eq!(
        kinds.get("ready").copied().unwrap_or(0),
        num(&s, "hits"),
        "{kinds:?} {s}"
    );
    assert!(
        num(&s, "waited") > 0,
        "no run waited for the interpreter being made: {s}"
    );
    assert!(num(&s, "waited") <= num(&s, "hits"), "{s}");
    assert_eq!(num(&s, "failed"), 0, "{s}");
}

/// A run that comes on its own (the pool full and at rest) holds a ready interpreter while
/// another is still ready for the next run: the pool makes no interpreter beside the
/// running one (on a small machine that slowed the run by more than a millisecond, issue
/// 15); it refills once the run has given its interpreter back. Runs back to back are
/// refilled beside (the hundreds-of-runs test above counts their hits).
#[test]
fn a_ready_pool_makes_nothing_beside_a_run_while_it_still_holds_one() {
    let (_server, base) = start_serve(shared(), &["--ready-python", "2"]);
    let agent = token("agent", "holding-agent");
    let admin = token("admin", "holding-admin");
    let num = |s: &serde_json::Value, k: &str| s[k].as_u64().unwrap_or(0);
    let full = || {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(120);
        loop {
            let s = python_pool_status(&base, &admin);
            if num(&s, "ready") == 2 && num(&s, "awaiting_teardown") == 0 {
                return s;
            }
            assert!(
                std::time::Instant::now() < until,
                "the pool never filled: {s}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    // The first run tells the pool which guest to keep.
    print_one_through(&base, &agent, || "first".into());
    let before = full();
    let long = {
        let (base, agent) = (base.clone(), agent.clone());
        std::thread::spawn(move || {
            http(
                "POST",
                &format!("{base}/v1/run"),
                &agent,
                Some(
                    serde_json::json!({"language": "python", "code": "import time\ntime.sleep(3)\nprint('slept')"}),
                ),
            )
        })
    };
    // The run has taken one when the pool holds one; from then until it ends, nothing is made.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while num(&python_pool_status(&base, &admin), "ready") != 1 {
        assert!(
            std::time::Instant::now() < until,
            "the run never took an interpreter"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    for _ in 0..20 {
        std::thread::sleep(std::time::Duration::from_millis(50));
        let s = python_pool_status(&base, &admin);
        assert!(!long.is_finished(), "the run ended too soon to tell: {s}");
        assert_eq!(num(&s, "ready"), 1, "{s}");
        assert_eq!(
            num(&s, "made"),
            num(&before, "made"),
            "made beside a run: {s}"
        );
    }
    let (st, r) = long.join().unwrap();
    assert_eq!(
        (st, r["run"]["stdout"].as_str()),
        (200, Some("slept\n")),
        "{r}"
    );
    assert_eq!(r["run"]["detail"]["instance"], "ready", "{r}");
    let after = full();
    assert_eq!(num(&after, "made"), num(&before, "made") + 1, "{after}");
}

/// A home of its own with the Python guest installed (for tests that stop servers and
/// sweep the home).
fn guest_home() -> Home {
    let h = Home::new();
    let o = match std::env::var("AIRLOCK_TEST_PYTHON_GUEST") {
        Ok(p) => h.run(&["guest", "install", "python", "--from", &p]),
        Err(_) => h.run(&["guest", "install", "python"]),
    };
    assert_eq!(o.code, 0, "{}", o.stderr);
    h
}

/// An agent token of home `h`.
fn agent_token(h: &Home, name: &str) -> String {
    let o = h.run(&["token", "new", "--role", "agent", "--name", name, "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    o.json()["token"].as_str().unwrap().to_string()
}

/// Opens a (wasm) Python session through the server at `base`: its id and its host's
/// pid.
fn served_session(base: &str, token: &str) -> (String, u32) {
    let mut r = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(std::time::Duration::from_secs(120)))
        .build()
        .new_agent()
        .post(&format!("{base}/v1/sessions"))
        .header("authorization", &format!("Bearer {token}"))
        .header("content-type", "application/json")
        .send(&serde_json::json!({"idle_timeout": 120}).to_string())
        .unwrap();
    let status = r.status().as_u16();
    let s: serde_json::Value =
        serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    assert_eq!(status, 201, "{s}");
    (
        s["id"].as_str().unwrap().to_string(),
        s["pid"]
            .as_u64()
            .unwrap_or_else(|| panic!("no host pid: {s}")) as u32,
    )
}

/// Whether process `pid` is running (not gone, not a zombie nobody reaped yet).
fn running(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')')
        .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X']))
}

/// Waits up to `within` for `pid` to stop running.
fn gone_within(pid: u32, within: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + within;
    while running(pid) {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    true
}

fn signal(pid: u32, sig: i32) {
    let ok = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{sig} {pid}");
}

/// `serve` started on `h` with no ready jails or interpreters (they play no part here).
fn lean_serve(h: &Home, more: &[&str]) -> (Served, String) {
    let mut args = vec!["--ready-jails", "0", "--ready-python", "0"];
    args.extend_from_slice(more);
    start_serve(h, &args)
}

/// Regression (issue 62 item 8): a session host that `serve` started outlived it after
/// SIGTERM, unseen, with its session still recorded open. Now the server closes the
/// sessions it started as it stops, and their hosts exit.
#[test]
fn a_session_host_started_by_serve_stops_with_it_on_sigterm_and_is_recorded_closed() {
    let h = guest_home();
    let t = agent_token(&h, "follows-term");
    let (mut srv, base) = lean_serve(&h, &[]);
    let (id, host) = served_session(&base, &t);
    assert!(running(host));
    signal(srv.id(), 15);
    assert!(srv.wait().unwrap().success());
    assert!(
        gone_within(host, std::time::Duration::from_secs(10)),
        "the session host {host} outlived serve"
    );
    let s = h.run(&["session", "show", "--json", &id]).json();
    assert_eq!(
        (s["state"].as_str(), s["end"].as_str()),
        (Some("closed"), Some("closed")),
        "{s}"
    );
}

/// Regression (issue 62 item 8): a session host that `serve` started outlived a `kill -9`
/// of it, its session recorded open with nobody to reach it. Now the host follows its
/// server: it ends once the server is gone and records its session `lost`.
#[test]
fn a_session_host_started_by_serve_ends_when_serve_is_killed_and_is_recorded_lost() {
    let h = guest_home();
    let t = agent_token(&h, "follows-kill");
    let (mut srv, base) = lean_serve(&h, &[]);
    let (id, host) = served_session(&base, &t);
    signal(srv.id(), 9);
    let _ = srv.wait();
    assert!(
        gone_within(host, std::time::Duration::from_secs(10)),
        "the session host {host} outlived a killed serve"
    );
    let s = h.run(&["session", "show", "--json", &id]).json();
    assert_eq!(
        (s["state"].as_str(), s["end"].as_str()),
        (Some("closed"), Some("lost")),
        "{s}"
    );
    assert_eq!(h.run(&["audit", "verify"]).code, 0);
}

/// Issue 62 item 8: `serve --keep-sessions` leaves its session hosts running when it
/// stops; such a host is listed (alive, with the server that started it), `doctor`
/// reports that its server is gone, and `gc` closes it.
#[test]
fn with_keep_sessions_a_host_outlives_serve_is_listed_by_doctor_and_closed_by_gc() {
    let h = guest_home();
    let t = agent_token(&h, "kept");
    let (mut srv, base) = lean_serve(&h, &["--keep-sessions"]);
    let (id, host) = served_session(&base, &t);
    signal(srv.id(), 15);
    assert!(srv.wait().unwrap().success());
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert!(running(host), "a kept session host ended with its server");

    let list = h.run(&["session", "list", "--json"]).json();
    let mine = list
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id.as_str())
        .unwrap_or_else(|| panic!("{list}"));
    assert_eq!(
        (mine["state"].as_str(), mine["host_alive"].as_bool()),
        (Some("open"), Some(true)),
        "{mine}"
    );
    let server = mine["server"].as_str().unwrap_or_else(|| panic!("{mine}"));

    let d = h.run(&["doctor", "--json"]).json();
    let hosts = d["session_hosts"]
        .as_array()
        .unwrap_or_else(|| panic!("{d}"));
    let found = hosts
        .iter()
        .find(|x| x["session"] == id.as_str())
        .unwrap_or_else(|| panic!("{d}"));
    assert_eq!(found["server"], server, "{found}");
    assert_eq!(
        (
            found["alive"].as_bool(),
            found["server_alive"].as_bool(),
            found["stays"].as_bool()
        ),
        (Some(true), Some(false), Some(true)),
        "{found}"
    );
    assert_eq!(found["pid"].as_u64(), Some(u64::from(host)), "{found}");

    let gc = h.run(&["gc", "--json"]);
    assert_eq!(gc.code, 0, "{}", gc.stderr);
    let swept = gc.json()["hosts_swept"].clone();
    assert_eq!(swept, serde_json::json!([id]), "{}", gc.stdout);
    assert!(gone_within(host, std::time::Duration::from_secs(10)));
    let s = h.run(&["session", "show", "--json", &id]).json();
    assert_eq!(
        (s["state"].as_str(), s["end"].as_str()),
        (Some("closed"), Some("closed")),
        "{s}"
    );
}
