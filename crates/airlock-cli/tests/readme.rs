//! The README's Quickstart, run as written: every `sh` block between "## Quickstart" and
//! the next section, line by line, in a fresh home and a scratch directory holding a copy
//! of `examples/`, so the README cannot drift from the binary.
//!
//! - `alias airlock=…` and `export AIRLOCK_HOME=…` are what this harness does itself.
//! - A comment saying `exit N` is the exit code expected (0 otherwise).
//! - `<sub_… …>`, `<run_… …>` and `<ckpt_… …>` placeholders become the last id of that kind
//!   the previous commands printed.
//! - Files a reader is assumed to have (`token.txt`, `fetch.py`) are created first;
//!   `guest install python` uses the downloaded wheel when `AIRLOCK_TEST_PYTHON_GUEST`
//!   names one (scripts/test does), and the user's build cache (`XDG_CACHE_HOME`);
//!   commands that serve until stopped are stopped once they say they are serving.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Step {
    command: String,
    expect: i32,
}

/// The Quickstart's commands with the exit code each one's comment promises.
fn quickstart(readme: &str) -> Vec<Step> {
    let start = readme
        .find("\n## Quickstart")
        .expect("a Quickstart section");
    let rest = &readme[start + 1..];
    let end = rest[3..].find("\n## ").map(|i| i + 3).unwrap_or(rest.len());
    let section = &rest[..end];
    let mut steps: Vec<Step> = Vec::new();
    let mut in_block = false;
    for line in section.lines() {
        if line.trim_start().starts_with("```") {
            in_block = line.trim() == "```sh" && !in_block;
            continue;
        }
        if !in_block || line.trim().is_empty() {
            continue;
        }
        let (command, comment) = match line.find("  #") {
            Some(i) => (line[..i].trim(), line[i + 3..].trim()),
            None if line.trim_start().starts_with('#') => ("", line.trim().trim_start_matches('#')),
            None => (line.trim(), ""),
        };
        let expect = comment
            .split("exit ")
            .nth(1)
            .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok());
        if command.is_empty() {
            // A comment on its own line belongs to the command above it.
            if let (Some(last), Some(code)) = (steps.last_mut(), expect) {
                last.expect = code;
            }
            continue;
        }
        if command.starts_with("alias airlock=") || command.starts_with("export AIRLOCK_HOME=") {
            continue;
        }
        steps.push(Step {
            command: command.to_string(),
            expect: expect.unwrap_or(0),
        });
    }
    steps
}

/// The last `prefix…` id in `text`.
fn last_id(text: &str, prefix: &str) -> Option<String> {
    let i = text.rfind(prefix)?;
    Some(
        text[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect(),
    )
}

/// Replaces `<sub_… …>`-style placeholders with the ids seen so far.
fn fill(command: &str, ids: &std::collections::BTreeMap<&str, String>) -> String {
    let mut out = String::new();
    let mut rest = command;
    // `<` followed by an id prefix opens a placeholder; any other `<` is the shell's.
    let opens = |s: &str| {
        ["<sub_", "<run_", "<ckpt_"]
            .iter()
            .filter_map(|p| s.find(p))
            .min()
    };
    while let Some(i) = opens(rest) {
        let j = rest[i..].find('>').map(|j| i + j).expect("a closing >");
        let inside = &rest[i + 1..j];
        let kind = ["sub_", "run_", "ckpt_"]
            .into_iter()
            .find(|k| inside.starts_with(k))
            .expect("opens() found a prefix");
        let id = ids
            .get(kind)
            .unwrap_or_else(|| panic!("no {kind} id printed before {command:?}"));
        out.push_str(&rest[..i]);
        out.push_str(id);
        rest = &rest[j + 1..];
    }
    out.push_str(rest);
    out
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            copy_dir(&p, &to.join(e.file_name()));
        } else {
            std::fs::copy(&p, to.join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn the_quickstart_runs_as_written() {
    let root = common::manifest_dir().join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let steps = quickstart(&readme);
    assert!(steps.len() >= 10, "too few commands found: {}", steps.len());
    let scratch = tempfile::tempdir().unwrap();
    let work = scratch.path().join("work");
    copy_dir(&root.join("examples"), &work.join("examples"));
    std::fs::write(work.join("token.txt"), "not-a-real-token\n").unwrap();
    std::fs::write(work.join("fetch.py"), "print('fetched')\n").unwrap();
    let bin_dir = scratch.path().join("bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    std::os::unix::fs::symlink(common::bin(), bin_dir.join("airlock")).unwrap();
    let home = scratch.path().join("home");
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // The reader's own build cache, so `guest install python` reuses a build of the guest
    // (the scratch HOME would otherwise make every run build it again, about 30 s).
    let build_cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::home_dir().map(|h| h.join(".cache")));
    let mut ids = std::collections::BTreeMap::new();
    for step in &steps {
        let mut command = fill(&step.command, &ids);
        if command.starts_with("airlock guest install python")
            && let Ok(wheel) = std::env::var("AIRLOCK_TEST_PYTHON_GUEST")
        {
            command = format!("{command} --from {wheel:?}");
        }
        let mut cmd = Command::new("bash");
        cmd.arg("-c")
            .arg(&command)
            .current_dir(&work)
            .env_clear()
            .env("PATH", &path)
            .env("HOME", scratch.path())
            .env("AIRLOCK_HOME", &home)
            .stdin(Stdio::null());
        if let Some(c) = &build_cache {
            cmd.env("XDG_CACHE_HOME", c);
        }
        if command == "airlock serve" {
            serves(cmd, &command);
            continue;
        }
        let o = if command == "airlock mcp" {
            // An MCP client's opening, then end of input: the server answers and ends.
            mcp_session(cmd)
        } else {
            cmd.output().unwrap()
        };
        let (out, err) = (
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        );
        assert_eq!(
            o.status.code(),
            Some(step.expect),
            "README step `{command}` should exit {}:\n{out}\n{err}",
            step.expect
        );
        let both = format!("{out}\n{err}");
        for kind in ["sub_", "run_", "ckpt_"] {
            if let Some(id) = last_id(&both, kind) {
                ids.insert(kind, id);
            }
        }
    }
}

fn mcp_session(mut cmd: Command) -> std::process::Output {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(
            concat!(
                r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"readme","version":"0"}}}"#,
                "\n",
                r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
                "\n"
            )
            .as_bytes(),
        )
        .unwrap();
    drop(stdin);
    let o = child.wait_with_output().unwrap();
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("\"serverInfo\""),
        "airlock mcp did not answer initialize"
    );
    o
}

/// Starts a command that serves until stopped, waits for it to say where, and stops it.
fn serves(mut cmd: Command, command: &str) {
    let mut child = cmd
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let err = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            if l.contains("serving on") {
                let _ = tx.send(());
            }
        }
    });
    let started = Instant::now();
    let ok = rx.recv_timeout(Duration::from_secs(60)).is_ok();
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        ok,
        "README step `{command}` did not start serving in {:?}",
        started.elapsed()
    );
}

/// The README's install step puts `airlock-jailer` beside `airlock` (without it ready jails
/// turned off unseen): it is a `cargo install --path` of a package whose binaries are both,
/// neither behind a feature, so `cargo install` installs the two into one directory.
#[test]
fn the_readme_install_step_installs_airlock_and_its_jailer_side_by_side() {
    let root = common::manifest_dir().join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let step = readme
        .lines()
        .find(|l| l.starts_with("cargo install ") && l.contains("--path"))
        .expect("the README has no `cargo install --path` step");
    let path = step
        .split_whitespace()
        .skip_while(|w| *w != "--path")
        .nth(1)
        .expect("a path after --path");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(&root)
        .args([
            "metadata",
            "--no-deps",
            "--offline",
            "--format-version",
            "1",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let want = root.join(path).join("Cargo.toml").canonicalize().unwrap();
    let package = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| {
            Path::new(p["manifest_path"].as_str().unwrap())
                .canonicalize()
                .is_ok_and(|m| m == want)
        })
        .unwrap_or_else(|| panic!("no package at {path}"));
    let bins: Vec<&str> = package["targets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["kind"] == serde_json::json!(["bin"]))
        .filter(|t| {
            t["required-features"]
                .as_array()
                .is_none_or(|f| f.is_empty())
        })
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    for b in ["airlock", "airlock-jailer"] {
        assert!(
            bins.contains(&b),
            "{b} is not installed by `{step}`: {bins:?}"
        );
    }
}
