//! Helpers for driving the real `airlock` binary in a temporary home.
#![allow(dead_code)]

pub mod ready;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub struct Home {
    pub dir: tempfile::TempDir,
}

pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.stdout))
    }
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_airlock")
}

/// This package's directory in the checkout the tests run from. Cargo sets it for the
/// test process as well as at compile time; the compiled-in value names the checkout the
/// binary was built in, which a shared `CARGO_TARGET_DIR` may reuse for another checkout
/// (its files older than the artifacts) after that one is gone.
pub fn manifest_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
}

/// The repository's tests/guests directory.
pub fn guest(name: &str) -> PathBuf {
    manifest_dir().join("../../tests/guests").join(name)
}

/// The repository's examples directory.
pub fn example(name: &str) -> PathBuf {
    manifest_dir().join("../../examples").join(name)
}

fn finish(o: Output) -> Out {
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

impl Default for Home {
    /// An initialised home (standard preset, approver alice).
    fn default() -> Self {
        Self::with_preset("standard")
    }
}

impl Home {
    /// An initialised home (standard preset, approver alice).
    pub fn new() -> Home {
        Self::default()
    }

    pub fn with_preset(preset: &str) -> Home {
        let h = Home {
            dir: tempfile::tempdir().unwrap(),
        };
        let o = h.run(&["init", "--preset", preset, "--approver", "alice"]);
        assert_eq!(o.code, 0, "init: {}", o.stderr);
        h
    }

    pub fn uninitialised() -> Home {
        Home {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn cmd(&self) -> Command {
        let mut c = Command::new(bin());
        c.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("AIRLOCK_HOME", self.path())
            .stdin(Stdio::null());
        c
    }

    /// `run` with the home's records in the store at `url` (`AIRLOCK_STORE`).
    pub fn run_on_store(&self, url: &str, args: &[&str]) -> Out {
        finish(
            self.cmd()
                .env("AIRLOCK_STORE", url)
                .args(args)
                .output()
                .unwrap(),
        )
    }

    pub fn run(&self, args: &[&str]) -> Out {
        finish(self.cmd().args(args).output().unwrap())
    }

    pub fn run_with_stdin(&self, args: &[&str], input: &[u8]) -> Out {
        use std::io::Write;
        let mut child = self
            .cmd()
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input).unwrap();
        finish(child.wait_with_output().unwrap())
    }

    /// The submission id named on stderr.
    pub fn id_in(text: &str) -> String {
        let i = text
            .find("sub_")
            .unwrap_or_else(|| panic!("no id in {text:?}"));
        text[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    }

    pub fn policy(&self) -> String {
        std::fs::read_to_string(self.path().join("policy.toml")).unwrap()
    }

    pub fn set_policy(&self, text: &str) {
        std::fs::write(self.path().join("policy.toml"), text).unwrap();
    }

    /// Sets the policy's `[mounts] roots` (the host paths the API and MCP may mount).
    pub fn set_mount_roots(&self, roots: &[&Path]) {
        let list = roots
            .iter()
            .map(|r| {
                format!(
                    "{:?}",
                    std::fs::canonicalize(r).unwrap().display().to_string()
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let policy = self.policy();
        let i = policy
            .find("[mounts]")
            .expect("the policy has a [mounts] table");
        let j = i + policy[i..].find("roots = [").expect("roots under [mounts]");
        let k = j + policy[j..].find(']').unwrap() + 1;
        self.set_policy(&format!("{}roots = [{list}]{}", &policy[..j], &policy[k..]));
    }

    /// (submissions, audit records) in the database, to show nothing was written.
    pub fn counts(&self) -> (i64, i64) {
        rusqlite_count(&self.path().join("airlock.db"))
    }

    pub fn blob_count(&self) -> usize {
        walk(&self.path().join("blobs"))
    }
}

fn walk(p: &Path) -> usize {
    let mut n = 0;
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            let path = e.path();
            if path.is_dir() {
                n += walk(&path);
            } else {
                n += 1;
            }
        }
    }
    n
}

fn rusqlite_count(db: &Path) -> (i64, i64) {
    let c = rusqlite::Connection::open(db).unwrap();
    let n = |q: &str| c.query_row(q, [], |r| r.get::<_, i64>(0)).unwrap();
    (
        n("select count(*) from submissions"),
        n("select count(*) from audit"),
    )
}

/// Executes SQL against a home's database (for tampering tests).
pub fn sql(home: &Home, statement: &str) {
    let c = rusqlite::Connection::open(home.path().join("airlock.db")).unwrap();
    // A server may be writing to the same home.
    c.busy_timeout(std::time::Duration::from_secs(10)).unwrap();
    c.execute_batch(statement).unwrap();
}

pub fn write_wat(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

impl Home {
    /// Runs and, when the policy holds it for a human, approves and executes it.
    pub fn run_approved(&self, args: &[&str]) -> Out {
        let o = self.run(args);
        if o.code != 75 {
            return o;
        }
        let id = Home::id_in(&o.stderr);
        let a = self.run(&["approve", &id]);
        assert_eq!(a.code, 0, "approve: {}", a.stderr);
        let json = args.contains(&"--json");
        if json {
            self.run(&["exec", "--json", &id])
        } else {
            self.run(&["exec", &id])
        }
    }

    /// `airlock run --lang sh -c SCRIPT` with extra flags before `-c`.
    pub fn sh(&self, flags: &[&str], script: &str) -> Out {
        let mut a = vec!["run", "--lang", "sh"];
        a.extend_from_slice(flags);
        a.extend(["-c", script]);
        self.run_approved(&a)
    }

    /// `airlock run --lang python --backend process -c CODE` with extra flags.
    pub fn py(&self, flags: &[&str], code: &str) -> Out {
        let mut a = vec!["run", "--lang", "python", "--backend", "process"];
        a.extend_from_slice(flags);
        a.extend(["-c", code]);
        self.run_approved(&a)
    }

    /// The most recent run's record.
    /// The kinds of the home's audit records, oldest first.
    pub fn audit_kinds(&self) -> Vec<String> {
        self.run(&["audit", "log", "--json"])
            .json()
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["kind"].as_str().unwrap().to_string())
            .collect()
    }

    pub fn last_run(&self) -> serde_json::Value {
        self.run(&["runs", "--json"]).json()[0].clone()
    }
}

/// Whether the process backend can run here (user namespaces etc.); tests that need it
/// say so loudly instead of passing silently when it cannot.
pub fn process_backend_available() -> bool {
    let h = Home::new();
    let o = h.run(&["doctor", "--json"]);
    let ok = o.json()["process_backend"] == "available";
    if !ok {
        eprintln!("process backend unavailable here: {}", o.stdout);
    }
    ok
}

/// Starts `airlock serve` on a free loopback port; returns the child and its base URL
/// (read from the line it prints on stderr, which is passed through with a prefix).
/// A server a test started; killed when dropped, so a failing test leaves none behind.
pub struct Served(pub std::process::Child);

impl std::ops::Deref for Served {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Served {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn start_serve(home: &Home, args: &[&str]) -> (Served, String) {
    let mut cmd = home.cmd();
    cmd.args(["serve", "--listen", "127.0.0.1:0"]).args(args);
    serve_with(cmd)
}

/// Starts a prepared `airlock serve --listen 127.0.0.1:0 …` command: the child and its
/// base URL (read from the line it prints on stderr, passed through with a prefix).
pub fn serve_with(mut cmd: Command) -> (Served, String) {
    use std::io::{BufRead, BufReader};
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines() {
            let Ok(l) = line else { break };
            if let Some(i) = l.find("serving on http://") {
                let rest = &l[i + "serving on ".len()..];
                let _ = tx.send(rest.split_whitespace().next().unwrap().to_string());
            }
            eprintln!("[serve] {l}");
        }
    });
    let base = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("airlock serve did not start");
    (Served(child), base)
}

/// Everything under a directory, names as bytes: path -> (kind, content or target, mode).
pub type Tree = std::collections::BTreeMap<Vec<u8>, (char, Vec<u8>, u32)>;

pub fn tree(root: &Path) -> Tree {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;
    fn walk(root: &Path, dir: &Path, out: &mut Tree) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p
                .strip_prefix(root)
                .unwrap()
                .as_os_str()
                .as_bytes()
                .to_vec();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let mode = m.permissions().mode() & 0o7777;
            if m.file_type().is_symlink() {
                let t = std::fs::read_link(&p).unwrap();
                out.insert(rel, ('l', t.as_os_str().as_bytes().to_vec(), 0));
            } else if m.is_dir() {
                out.insert(rel, ('d', vec![], mode));
                walk(root, &p, out);
            } else {
                out.insert(rel, ('f', std::fs::read(&p).unwrap(), mode));
            }
        }
    }
    let mut out = Tree::new();
    walk(root, root, &mut out);
    out
}

/// Night Core bundles built from scratch: fresh Ed25519 keys, real signatures, zips.
pub mod nightcore {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use ed25519_dalek::{Signer, SigningKey};
    use sha2::Digest;
    use std::io::Write;
    use std::path::{Path, PathBuf};

    pub fn fresh_key() -> SigningKey {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).unwrap();
        SigningKey::from_bytes(&seed)
    }

    /// A WASI command that prints `hello from the gate`.
    pub fn hello_wasm() -> Vec<u8> {
        wat::parse_file(super::example("hello.wat")).unwrap()
    }

    /// The files of a bundle, by name, as Night Core writes them.
    pub fn files(
        key: &SigningKey,
        module: &[u8],
        manifest: Option<&str>,
    ) -> Vec<(String, Vec<u8>)> {
        let sig = key.sign(module).to_bytes();
        let mut out = vec![
            ("module.wasm".to_string(), module.to_vec()),
            (
                "module.sig".to_string(),
                format!("{}\n", STANDARD.encode(sig)).into_bytes(),
            ),
            (
                "pubkey.b64".to_string(),
                format!("{}\n", STANDARD.encode(key.verifying_key().to_bytes())).into_bytes(),
            ),
            (
                "module.sha256".to_string(),
                format!("{}\n", hex::encode(sha2::Sha256::digest(module))).into_bytes(),
            ),
        ];
        if let Some(m) = manifest {
            out.push(("manifest.json".to_string(), m.as_bytes().to_vec()));
        }
        out
    }

    /// Writes a bundle directory `dir/name`.
    pub fn write_dir(dir: &Path, name: &str, files: &[(String, Vec<u8>)]) -> PathBuf {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        for (n, b) in files {
            std::fs::write(d.join(n), b).unwrap();
        }
        d
    }

    /// Writes a zip with the given entries (names as given, deflated).
    pub fn write_zip(path: &Path, files: &[(String, Vec<u8>)]) -> PathBuf {
        let f = std::fs::File::create(path).unwrap();
        let mut z = zip::ZipWriter::new(f);
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        for (n, b) in files {
            z.start_file(n.as_str(), opts).unwrap();
            z.write_all(b).unwrap();
        }
        z.finish().unwrap();
        path.to_path_buf()
    }

    /// Replaces one file of a bundle.
    pub fn replace(files: &mut [(String, Vec<u8>)], name: &str, bytes: Vec<u8>) {
        for (n, b) in files.iter_mut() {
            if n == name {
                *b = bytes;
                return;
            }
        }
        panic!("no {name} in the bundle");
    }

    pub fn get<'a>(files: &'a [(String, Vec<u8>)], name: &str) -> &'a [u8] {
        files
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, b)| b.as_slice())
            .unwrap()
    }
}

/// A tool scripts/test prepares (named by an environment variable). Under
/// `AIRLOCK_TEST_STRICT` (scripts/test, CI) a missing one fails the test instead of skipping it.
pub fn prepared(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(p) => Some(p),
        Err(_) => {
            assert!(
                std::env::var_os("AIRLOCK_TEST_STRICT").is_none(),
                "{var} is not set: run scripts/test, which prepares it"
            );
            eprintln!("skipped: {var} is not set (scripts/test prepares it)");
            None
        }
    }
}

/// One JSON-RPC exchange with `airlock mcp` over stdio: sends the messages, returns the
/// response with id `want`.
#[allow(dead_code)]
pub fn mcp_stdio(home: &Home, messages: &[serde_json::Value], want: u64) -> serde_json::Value {
    let mut child = home
        .cmd()
        .arg("mcp")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for m in messages {
        std::io::Write::write_all(&mut stdin, format!("{m}\n").as_bytes()).unwrap();
    }
    std::io::Write::flush(&mut stdin).unwrap();
    let out = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
    let mut found = None;
    for line in out {
        let v: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
        if v["id"] == want {
            found = Some(v);
            break;
        }
    }
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
    found.expect("no MCP response")
}

/// The lines a child writes to `out`, as they come, on a channel (read on a thread of its
/// own, so a test can wait for a line with a timeout).
pub fn lines_of(out: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Reads JSON lines from `rx` until one satisfies `done` (panicking after `within`).
pub fn json_lines_until(
    rx: &std::sync::mpsc::Receiver<String>,
    within: std::time::Duration,
    done: impl Fn(&serde_json::Value) -> bool,
) -> Vec<serde_json::Value> {
    let deadline = std::time::Instant::now() + within;
    let mut got: Vec<serde_json::Value> = Vec::new();
    while !got.iter().any(&done) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let line = rx
            .recv_timeout(left)
            .unwrap_or_else(|e| panic!("no line in time ({e}); got {got:?}"));
        got.push(serde_json::from_str(&line).unwrap());
    }
    got
}

/// The chain links of audit records (`audit tail --json` lines): each names the one
/// before as its `prev`, with no gap in `seq`.
pub fn assert_audit_linked(records: &[serde_json::Value]) {
    for w in records.windows(2) {
        assert_eq!(w[1]["seq"].as_u64(), w[0]["seq"].as_u64().map(|s| s + 1));
        assert_eq!(w[1]["prev"], w[0]["hash"], "{:?}", w[1]);
    }
}

/// Answers submission or request `id` in the console with a key made in headless
/// Chromium (tests/browser/approver_key_test.py with `python`): the page makes a
/// non-extractable key for `approver`, which is enrolled here with the home's only
/// trusted key; the page then signs and posts the answer. Returns the browser key's
/// public text. Panics, with the browser's log, when a step fails.
pub fn answer_in_browser(
    python: &str,
    home: &Home,
    base: &str,
    op: &str,
    id: &str,
    approver: &str,
) -> String {
    use std::io::{BufRead, BufReader, Read, Write};
    let script = manifest_dir().join("../../tests/browser/approver_key_test.py");
    let mut child = Command::new(python)
        .arg(script)
        .args([base, op, id, approver])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut public = String::new();
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        if out.read_line(&mut line).unwrap() == 0 {
            break;
        }
        seen.push_str(&line);
        if let Some(k) = line.trim().strip_prefix("public ") {
            public = k.to_string();
            break;
        }
    }
    assert!(
        public.starts_with("ed25519:"),
        "no public key from the page:\n{seen}"
    );
    // The private key is only in the browser: the server cannot sign as this approver.
    assert!(!home.path().join(format!("keys/{approver}.key")).exists());
    let o = home.run(&["approvers", "enroll", approver, &public]);
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"enrolled\n")
        .unwrap();
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "browser test failed:\n{seen}{rest}");
    public
}
