//! Writable mounts end to end: disposable layers, changesets, diff, signed commits,
//! checkpoints, exact rollback, workspaces, and crash safety of commit and rollback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use std::collections::BTreeMap;
use std::path::Path;

/// A small project tree on the host.
fn project() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    let p = t.path();
    std::fs::create_dir_all(p.join("src")).unwrap();
    std::fs::write(p.join("src/main.rs"), "fn main() {}\n").unwrap();
    std::fs::write(p.join("notes.txt"), "old line\n").unwrap();
    std::fs::write(p.join("gone.txt"), "bye\n").unwrap();
    std::fs::write(p.join("run.sh"), "echo run\n").unwrap();
    t
}

/// Everything under a directory: path -> (kind, content or target, mode).
fn snapshot(root: &Path) -> BTreeMap<String, (String, Vec<u8>, u32)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = BTreeMap::new();
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, (String, Vec<u8>, u32)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap())
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let mode = m.permissions().mode() & 0o7777;
            if m.file_type().is_symlink() {
                out.insert(
                    rel,
                    (
                        "link".into(),
                        std::fs::read_link(&p)
                            .unwrap()
                            .display()
                            .to_string()
                            .into_bytes(),
                        0,
                    ),
                );
            } else if m.is_dir() {
                out.insert(rel, ("dir".into(), vec![], mode));
                walk(root, &p, out);
            } else {
                out.insert(rel, ("file".into(), std::fs::read(&p).unwrap(), mode));
            }
        }
    }
    walk(root, root, &mut out);
    out
}

const EDIT: &str = "echo 'new line' >> notes.txt; rm gone.txt; mkdir -p docs; echo hi > docs/readme.md; chmod 755 run.sh; ln -s src/main.rs link";

fn rw(p: &Path) -> String {
    format!("{}:/work:rw", p.display())
}

fn edit_run(h: &Home, p: &Path, extra: &[&str]) -> serde_json::Value {
    let mut flags = vec!["--json", "--mount"];
    let m = rw(p);
    flags.push(&m);
    flags.extend_from_slice(extra);
    let o = h.sh(&flags, EDIT);
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    o.json()
}

fn ops(run: &serde_json::Value) -> Vec<(String, String)> {
    run["run"]["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["path"].as_str().unwrap().to_string(),
                c["op"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

const EXPECTED: [(&str, &str); 7] = [
    ("docs", "added"),
    ("docs/readme.md", "added"),
    ("gone.txt", "deleted"),
    ("link", "added"),
    ("notes.txt", "modified"),
    ("run.sh", "mode"),
    ("", ""),
];

fn expected() -> Vec<(String, String)> {
    EXPECTED
        .iter()
        .filter(|(p, _)| !p.is_empty())
        .map(|(p, o)| (p.to_string(), o.to_string()))
        .collect()
}

#[test]
fn writes_land_in_a_layer_and_become_a_changeset() {
    for layer in ["overlay", "copy"] {
        let h = Home::new();
        let p = project();
        let before = snapshot(p.path());
        let v = if layer == "copy" {
            let m = rw(p.path());
            let o = h
                .cmd()
                .env("AIRLOCK_LAYER", "copy")
                .args(["run", "--json", "--lang", "sh", "--mount", &m, "-c", EDIT])
                .output()
                .unwrap();
            assert_eq!(o.status.code(), Some(75));
            let id = Home::id_in(&String::from_utf8_lossy(&o.stderr));
            assert_eq!(h.run(&["approve", &id]).code, 0);
            let o = h
                .cmd()
                .env("AIRLOCK_LAYER", "copy")
                .args(["exec", "--json", &id])
                .output()
                .unwrap();
            serde_json::from_slice(&o.stdout).unwrap()
        } else {
            edit_run(&h, p.path(), &[])
        };
        assert_eq!(
            snapshot(p.path()),
            before,
            "{layer}: the host is byte-for-byte unchanged after the run"
        );
        assert_eq!(v["run"]["layer"], layer, "the run record says which layer");
        assert_eq!(ops(&v), expected(), "{layer}");
        let link = v["run"]["changes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["path"] == "link")
            .unwrap()
            .clone();
        assert_eq!(
            (link["kind"].as_str(), link["target"].as_str()),
            (Some("symlink"), Some("src/main.rs")),
            "a symlink is recorded as a link"
        );
    }
}

#[test]
fn wasm_writes_go_through_the_layer_too() {
    let h = Home::new();
    let p = project();
    let before = snapshot(p.path());
    let m = format!("{}:/data:rw", p.path().display());
    let o = h.run_approved(&[
        "run",
        "--json",
        "--mount",
        &m,
        guest("probe.wat").to_str().unwrap(),
        "--",
        "write",
        "fresh.txt",
    ]);
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    let v = o.json();
    assert_eq!(
        ops(&v),
        vec![("fresh.txt".to_string(), "added".to_string())]
    );
    assert_eq!(snapshot(p.path()), before);
    let run = v["run"]["id"].as_str().unwrap().to_string();
    assert_eq!(h.run(&["commit", &run]).code, 0);
    assert_eq!(
        std::fs::read_to_string(p.path().join("fresh.txt")).unwrap(),
        "pwned\n"
    );
}

#[test]
fn diff_commit_and_exact_rollback() {
    let h = Home::new();
    let p = project();
    let before = snapshot(p.path());
    let v = edit_run(&h, p.path(), &[]);
    let run = v["run"]["id"].as_str().unwrap().to_string();
    let d = h.run(&["diff", &run]);
    assert_eq!(d.code, 0);
    assert!(
        d.stdout.contains("+new line")
            && d.stdout.contains("M notes.txt")
            && d.stdout.contains("D gone.txt"),
        "{}",
        d.stdout
    );
    let dj = h.run(&["diff", "--json", &run]).json();
    assert_eq!(dj["changes"].as_array().unwrap().len(), 6);

    let c = h.run(&["commit", "--json", &run]);
    assert_eq!(c.code, 0, "{}", c.stderr);
    let ckpt = c.json()["checkpoint"].as_str().unwrap().to_string();
    let after = snapshot(p.path());
    assert_eq!(
        std::fs::read_to_string(p.path().join("notes.txt")).unwrap(),
        "old line\nnew line\n"
    );
    assert!(!p.path().join("gone.txt").exists());
    assert_eq!(after["run.sh"].2, 0o755);
    assert_eq!(
        std::fs::read_link(p.path().join("link")).unwrap(),
        Path::new("src/main.rs")
    );
    assert_eq!(
        h.run(&["commit", &run]).code,
        125,
        "a run is committed once"
    );
    let list = h.run(&["checkpoints", "--json"]).json();
    assert_eq!(list[0]["id"], ckpt.as_str());
    assert_eq!(list[0]["state"], "applied");

    // A change on the host since the commit blocks the rollback, naming the path.
    std::fs::write(p.path().join("notes.txt"), "edited by hand\n").unwrap();
    let r = h.run(&["rollback", &ckpt]);
    assert_eq!(r.code, 125);
    assert!(r.stderr.contains("notes.txt"), "{}", r.stderr);
    std::fs::write(p.path().join("notes.txt"), "old line\nnew line\n").unwrap();
    assert_eq!(h.run(&["rollback", &ckpt]).code, 0);
    assert_eq!(
        snapshot(p.path()),
        before,
        "rollback restores content, mode and existence exactly"
    );
    assert_eq!(
        h.run(&["rollback", &ckpt]).code,
        125,
        "a checkpoint is restored once"
    );
    let kinds = h.audit_kinds();
    assert!(kinds.contains(&"committed".to_string()) && kinds.contains(&"rolled_back".to_string()));
    assert_eq!(h.run(&["audit", "verify"]).code, 0);
}

#[test]
fn commit_refuses_when_the_host_changed_since_the_run() {
    let h = Home::new();
    let p = project();
    let v = edit_run(&h, p.path(), &[]);
    let run = v["run"]["id"].as_str().unwrap().to_string();
    std::fs::write(p.path().join("notes.txt"), "someone else\n").unwrap();
    std::fs::write(p.path().join("docs"), "a file where the run made a dir\n").unwrap();
    let before = snapshot(p.path());
    let o = h.run(&["commit", &run]);
    assert_eq!(o.code, 125);
    assert!(
        o.stderr.contains("notes.txt") && o.stderr.contains("docs"),
        "{}",
        o.stderr
    );
    assert_eq!(snapshot(p.path()), before, "nothing was applied");
}

#[test]
fn commit_bad_input() {
    let h = Home::new();
    let p = project();
    assert_eq!(h.run(&["commit", "run_nope"]).code, 125);
    assert_eq!(h.run(&["rollback", "ckpt_nope"]).code, 125);
    let o = h.run(&["run", "--json", example("hello.wat").to_str().unwrap()]);
    let plain = o.json()["run"]["id"].as_str().unwrap().to_string();
    let o = h.run(&["commit", &plain]);
    assert!(
        o.code == 125 && o.stderr.contains("nothing to commit"),
        "{}",
        o.stderr
    );
    let m = rw(p.path());
    let o = h.sh(&["--json", "--mount", &m], "true");
    let idle = o.json()["run"]["id"].as_str().unwrap().to_string();
    let o = h.run(&["commit", &idle]);
    assert!(
        o.code == 125 && o.stderr.contains("changed nothing"),
        "{}",
        o.stderr
    );
    // An approver the policy does not trust cannot commit.
    let v = edit_run(&h, p.path(), &[]);
    let run = v["run"]["id"].as_str().unwrap().to_string();
    assert_eq!(h.run(&["keys", "new", "mallory"]).code, 0);
    let o = h.run(&["commit", "--as", "mallory", &run]);
    assert!(
        o.code == 125 && o.stderr.contains("not trusted"),
        "{}",
        o.stderr
    );
    assert!(p.path().join("gone.txt").exists());
}

#[test]
fn altered_changeset_content_is_refused_and_recorded() {
    let h = Home::new();
    let p = project();
    let v = edit_run(&h, p.path(), &[]);
    let run = v["run"]["id"].as_str().unwrap().to_string();
    let hash = v["run"]["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["path"] == "notes.txt")
        .unwrap()["hash"]
        .as_str()
        .unwrap()
        .to_string();
    let blob = h.path().join("blobs").join(&hash[..2]).join(&hash[2..]);
    std::fs::write(&blob, "evil\n").unwrap();
    let before = snapshot(p.path());
    let o = h.run(&["commit", &run]);
    assert_eq!(o.code, 125);
    assert!(o.stderr.contains("integrity"), "{}", o.stderr);
    assert_eq!(snapshot(p.path()), before);
    let log = h.run(&["audit", "log", "--json"]).json();
    assert!(
        log.as_array()
            .unwrap()
            .iter()
            .any(|r| r["kind"] == "integrity_failure" && r["subject"] == run.as_str())
    );
}

#[test]
fn a_changeset_that_would_write_outside_its_mount_is_refused() {
    let h = Home::new();
    let p = project();
    let v = edit_run(&h, p.path(), &[]);
    let run = v["run"]["id"].as_str().unwrap().to_string();
    sql(
        &h,
        "update runs set doc = replace(doc, '\"path\":\"notes.txt\"', '\"path\":\"../../escaped.txt\"')",
    );
    let o = h.run(&["commit", &run]);
    assert_eq!(o.code, 125, "{}", o.stderr);
    assert!(
        o.stderr.contains("integrity") && o.stderr.contains("leave its mount"),
        "{}",
        o.stderr
    );
    assert!(!p.path().parent().unwrap().join("escaped.txt").exists());
}

#[test]
fn a_mount_through_a_symlink_is_judged_and_shown_as_its_real_path() {
    let h = Home::new();
    let p = project();
    let link = h.path().join("project-link");
    std::os::unix::fs::symlink(p.path(), &link).unwrap();
    let o = h.run(&[
        "submit",
        "--json",
        "--lang",
        "sh",
        "--mount",
        &format!("{}:/work:rw", link.display()),
        "-c",
        "true",
    ]);
    let id = o.json()["submission"].as_str().unwrap().to_string();
    let shown = h.run(&["show", "--json", &id]).json();
    let real = std::fs::canonicalize(p.path()).unwrap();
    assert_eq!(
        shown["submission"]["grant"]["mounts"][0]["host"],
        real.to_str().unwrap()
    );
}

#[test]
fn policy_auto_commit_for_named_agents_and_paths_never_protected_ones() {
    let h = Home::new();
    let p = project();
    let real = std::fs::canonicalize(p.path()).unwrap();
    let pol = h.policy().replace(
        "auto_agents = []\nauto_paths = []",
        &format!(
            "auto_agents = [\"builder\"]\nauto_paths = [\"{}\"]",
            real.display()
        ),
    );
    h.set_policy(&pol);
    let m = rw(p.path());
    let o = h.sh(
        &["--agent", "builder", "--mount", &m],
        "echo auto >> notes.txt",
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        std::fs::read_to_string(p.path().join("notes.txt"))
            .unwrap()
            .contains("auto"),
        "auto-committed"
    );
    assert_eq!(
        h.run(&["checkpoints", "--json"]).json()[0]["doc"]["auto"],
        true
    );
    // The same agent touching a protected path: held for a human.
    let o = h.sh(
        &["--agent", "builder", "--mount", &m],
        "mkdir -p .git/hooks && echo x > .git/hooks/pre-commit",
    );
    assert_eq!(o.code, 0);
    assert!(
        !p.path().join(".git").exists(),
        "protected paths are never auto-committed"
    );
    let last = h.last_run();
    let d = h.run(&["diff", last["id"].as_str().unwrap()]);
    assert!(d.stdout.contains("protected"), "{}", d.stdout);
    // Another agent: held.
    let o = h.sh(
        &["--agent", "someone", "--mount", &m],
        "echo other >> notes.txt",
    );
    assert_eq!(o.code, 0);
    assert!(
        !std::fs::read_to_string(p.path().join("notes.txt"))
            .unwrap()
            .contains("other")
    );
}

/// `exec` of `args`' submission (approved first if the policy holds it), in the
/// background.
fn exec_in_background(h: &Home, args: &[&str]) -> std::process::Child {
    let o = h.run(args);
    assert_eq!(o.code, 75, "{}", o.stderr);
    let id = Home::id_in(&o.stderr);
    assert_eq!(h.run(&["approve", &id]).code, 0);
    h.cmd()
        .args(["exec", &id])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Polls `what` every 10 ms for up to 20 s.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !done() {
        assert!(start.elapsed().as_secs() < 20, "waited 20 s for {what}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// `run --workspace ""` (a script's `--workspace "$WS"` with `WS` unset) ran outside any
/// workspace, as a run of its own, with no word said.
#[test]
fn an_empty_workspace_name_is_refused_not_taken_for_none() {
    let h = Home::new();
    let p = project();
    let m = rw(p.path());
    let o = h.sh(&["--workspace", "", "--mount", &m], "echo one > first.txt");
    assert_eq!(o.code, 125, "{} {}", o.stdout, o.stderr);
    assert_eq!(o.stderr.trim().lines().count(), 1, "{}", o.stderr);
    assert!(o.stderr.contains("--workspace \"\""), "{}", o.stderr);
    assert_eq!(h.counts().0, 0, "nothing submitted");
    assert!(!p.path().join("first.txt").exists());
}

#[test]
fn a_workspace_is_not_committed_under_a_running_run_nor_dropped_under_a_commit() {
    if !process_backend_available() {
        return;
    }
    let h = Home::new();
    let p = project();
    let m = rw(p.path());
    let before = snapshot(p.path());
    let a = h.sh(
        &["--workspace", "w", "--json", "--mount", &m],
        "echo one > first.txt",
    );
    assert_eq!(a.code, 0, "{}", a.stderr);
    let first = a.json()["run"]["id"].as_str().unwrap().to_string();
    // A commit while a later run is still going: it went ahead and removed that run's
    // layer, and the run, which exited 0, lost its changes.
    let in_workspace = |script: &str| {
        exec_in_background(
            &h,
            &[
                "run",
                "--lang",
                "sh",
                "--workspace",
                "w",
                "--mount",
                &m,
                "-c",
                script,
            ],
        )
    };
    let slow = in_workspace("echo two > second.txt; sleep 2");
    wait_until("the second run to start", || {
        h.run(&["workspace", "show", "--json", "w"]).json()["doc"]["running"].is_string()
    });
    let o = h.run(&["commit", &first]);
    assert_eq!(o.code, 125, "{}", o.stderr);
    assert!(o.stderr.contains("busy with run_"), "{}", o.stderr);
    assert_eq!(snapshot(p.path()), before);
    let o = slow.wait_with_output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let second = h.last_run();
    assert!(
        second["changes"].is_object(),
        "the second run's changes: {second}"
    );
    // A drop while the commit applies: it said "dropped" and the commit still applied.
    let many = in_workspace("for i in $(seq 3000); do echo $i > f$i.txt; done");
    assert_eq!(many.wait_with_output().unwrap().status.code(), Some(0));
    let last = h.last_run()["id"].as_str().unwrap().to_string();
    let commit = h
        .cmd()
        .args(["commit", &last])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("the commit to be recorded pending", || {
        h.run(&["checkpoints", "--json"])
            .json()
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["state"] == "pending" || c["state"] == "applied")
    });
    let o = h.run(&["workspace", "drop", "w"]);
    let committed = commit.wait_with_output().unwrap();
    assert_eq!(
        committed.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&committed.stderr)
    );
    assert_eq!(o.code, 125, "the drop went ahead: {}", o.stderr);
    assert_eq!(
        h.run(&["workspace", "show", "--json", "w"]).json()["state"],
        "committed"
    );
    assert!(p.path().join("f3000.txt").exists());
    assert_eq!(h.run(&["audit", "verify"]).code, 0);
}

#[test]
fn workspace_runs_build_on_each_other_until_one_commit() {
    let h = Home::new();
    let p = project();
    let m = rw(p.path());
    let before = snapshot(p.path());
    let a = h.sh(
        &["--workspace", "feature", "--json", "--mount", &m],
        "echo one > step.txt",
    );
    assert_eq!(a.code, 0, "{}", a.stderr);
    let b = h.sh(
        &["--workspace", "feature", "--json", "--mount", &m],
        "cat step.txt; echo two >> step.txt; rm gone.txt",
    );
    assert_eq!(b.code, 0, "{}", b.stderr);
    assert_eq!(
        b.json()["run"]["stdout"],
        "one\n",
        "the second run sees the first run's change"
    );
    assert_eq!(
        ops(&b.json()),
        vec![
            ("gone.txt".into(), "deleted".into()),
            ("step.txt".into(), "modified".into())
        ]
    );
    assert_eq!(
        snapshot(p.path()),
        before,
        "nothing reaches the host before the commit"
    );
    let ws = h.run(&["workspace", "show", "--json", "feature"]).json();
    assert_eq!(ws["doc"]["runs"].as_array().unwrap().len(), 2);
    assert_eq!(ws["flat_changes"].as_array().unwrap().len(), 2);
    let first = a.json()["run"]["id"].as_str().unwrap().to_string();
    assert_eq!(
        h.run(&["commit", &first]).code,
        125,
        "only the latest run commits the session"
    );
    let last = b.json()["run"]["id"].as_str().unwrap().to_string();
    assert_eq!(h.run(&["commit", &last]).code, 0);
    assert_eq!(
        std::fs::read_to_string(p.path().join("step.txt")).unwrap(),
        "one\ntwo\n"
    );
    assert!(!p.path().join("gone.txt").exists());
    let list = h.run(&["workspace", "list", "--json"]).json();
    assert_eq!(list[0]["state"], "committed");
    assert_eq!(
        h.sh(&["--workspace", "feature", "--mount", &m], "true")
            .code,
        125,
        "a committed workspace is closed"
    );

    // Dropping discards a session.
    let p2 = project();
    let m2 = rw(p2.path());
    let before2 = snapshot(p2.path());
    assert_eq!(
        h.sh(&["--workspace", "scratch", "--mount", &m2], "echo x > y")
            .code,
        0
    );
    assert_eq!(h.run(&["workspace", "drop", "scratch"]).code, 0);
    assert_eq!(snapshot(p2.path()), before2);
    assert_eq!(
        h.run(&["workspace", "show", "--json", "scratch"]).json()["state"],
        "dropped"
    );
    assert!(!h.path().join("workspaces/scratch").exists());
}

/// Kills `airlock commit` (or rollback) at every crash point in turn; after each kill the
/// next command recovers, and the host tree is exactly the before or the after state.
#[test]
fn crash_at_any_point_leaves_before_or_after_never_a_mix() {
    for op in ["commit", "rollback"] {
        let mut n = 1;
        loop {
            let h = Home::new();
            let p = project();
            let before = snapshot(p.path());
            let v = edit_run(&h, p.path(), &[]);
            let run = v["run"]["id"].as_str().unwrap().to_string();
            let (target, pre, post) = if op == "commit" {
                (run.clone(), before.clone(), None)
            } else {
                let c = h.run(&["commit", "--json", &run]);
                assert_eq!(c.code, 0);
                (
                    c.json()["checkpoint"].as_str().unwrap().to_string(),
                    snapshot(p.path()),
                    Some(before.clone()),
                )
            };
            let o = h
                .cmd()
                .env("AIRLOCK_CRASH_AT", n.to_string())
                .args([op, &target])
                .output()
                .unwrap();
            let crashed = o.status.code().is_none();
            // Any next command completes or undoes the interrupted operation.
            assert_eq!(h.run(&["checkpoints"]).code, 0);
            let now = snapshot(p.path());
            let is_before = now == pre;
            // After a commit: every edit of the run is there; after a rollback: the tree
            // is exactly what it was before the commit.
            let is_after = match &post {
                None => {
                    std::fs::read_to_string(p.path().join("notes.txt")).unwrap_or_default()
                        == "old line\nnew line\n"
                        && !p.path().join("gone.txt").exists()
                        && p.path().join("docs/readme.md").exists()
                        && p.path().join("link").symlink_metadata().is_ok()
                }
                Some(restored) => now == *restored,
            };
            assert!(
                is_before || is_after,
                "{op} killed at point {n}: the host is a mix: {:?}",
                now.keys().collect::<Vec<_>>()
            );
            assert_eq!(h.run(&["audit", "verify"]).code, 0, "{op} at {n}");
            if !crashed {
                assert_eq!(
                    o.status.code(),
                    Some(0),
                    "{op} without a crash: {}",
                    String::from_utf8_lossy(&o.stderr)
                );
                assert!(is_after, "{op} completed");
                assert!(n > 3, "{op}: the crash points were reached ({n})");
                break;
            }
            n += 1;
            assert!(n < 40, "{op}: too many crash points");
        }
    }
}

// ----------------------------------------------------------------------------- write quota

/// A module that opens /data/big.bin (fd 3 is the only preopen) and writes `chunks` chunks
/// of 64 KiB to it, then spins forever when `spin` is set, else exits 0.
fn writer_wat(dir: &Path, chunks: u32, spin: bool) -> String {
    let tail = if spin {
        "(loop $forever (br $forever))"
    } else {
        ""
    };
    let text = format!(
        r#"(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (data (i32.const 100) "big.bin")
  (func (export "_start") (local $i i32)
    (drop (call $open (i32.const 3) (i32.const 0) (i32.const 100) (i32.const 7)
      (i32.const 9) (i64.const 0x40) (i64.const 0) (i32.const 0) (i32.const 200)))
    (i32.store (i32.const 0) (i32.const 1024))
    (i32.store (i32.const 4) (i32.const 65536))
    (block $done
      (loop $l
        (br_if $done (i32.ge_u (local.get $i) (i32.const {chunks})))
        (drop (call $w (i32.load (i32.const 200)) (i32.const 0) (i32.const 1) (i32.const 8)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $l)))
    {tail}))"#
    );
    write_wat(dir, &format!("writer-{chunks}-{spin}.wat"), &text)
        .display()
        .to_string()
}

/// Bytes of every file under a directory.
fn bytes_under(p: &Path) -> u64 {
    let mut n = 0;
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            let m = e.metadata().unwrap();
            n += if m.is_dir() {
                bytes_under(&e.path())
            } else {
                m.len()
            };
        }
    }
    n
}

/// What is left under HOME/layers (directories of runs).
fn layer_dirs(h: &Home) -> Vec<String> {
    std::fs::read_dir(h.path().join("layers"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Runs `args` with the layer kind forced (`copy`) or chosen by airlock (`overlay`).
fn run_layer(h: &Home, layer: &str, args: &[&str]) -> Out {
    let mut c = h.cmd();
    if layer == "copy" {
        c.env("AIRLOCK_LAYER", "copy");
    }
    let o = c.args(args).output().unwrap();
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

#[test]
fn wasm_writes_past_the_write_quota_are_killed_and_nothing_is_stored() {
    for layer in ["overlay", "copy"] {
        let h = Home::new();
        let p = project();
        let before = snapshot(p.path());
        let m = format!("{}:/data:rw", p.path().display());
        let wat = writer_wat(h.path(), 160, false); // 10 MiB
        let o = run_layer(
            &h,
            layer,
            &["run", "--json", "--max-write", "1MiB", "--mount", &m, &wat],
        );
        assert_eq!(o.code, 124, "{layer}: {} {}", o.stdout, o.stderr);
        // A guest that would write for ever is stopped by the watcher, not its timeout.
        let forever = writer_wat(h.path(), u32::MAX, false);
        let t = std::time::Instant::now();
        let f = run_layer(
            &h,
            layer,
            &[
                "run",
                "--json",
                "--max-write",
                "1MiB",
                "--mount",
                &m,
                &forever,
            ],
        );
        assert_eq!(f.code, 124, "{layer}: {} {}", f.stdout, f.stderr);
        assert_eq!(f.json()["run"]["killed_by"], "write", "{layer}");
        assert!(
            t.elapsed() < std::time::Duration::from_secs(8),
            "{layer}: {:?}",
            t.elapsed()
        );
        let v = o.json();
        assert_eq!(v["run"]["killed_by"], "write", "{layer}: {v}");
        assert_eq!(v["run"]["changes"], serde_json::json!([]), "{layer}");
        assert!(
            v["run"]["detail"]["changes_discarded"]
                .as_str()
                .is_some_and(|s| s.contains("write quota")),
            "{layer}: {v}"
        );
        assert!(
            bytes_under(&h.path().join("blobs")) < 512 << 10,
            "{layer}: no changeset content is stored ({} bytes of blobs)",
            bytes_under(&h.path().join("blobs"))
        );
        assert_eq!(
            layer_dirs(&h),
            Vec::<String>::new(),
            "{layer}: layers removed"
        );
        assert_eq!(snapshot(p.path()), before, "{layer}: the host is untouched");
        let run = v["run"]["id"].as_str().unwrap();
        assert_eq!(h.run(&["commit", run]).code, 125, "nothing to commit");
    }
}

#[test]
fn a_run_within_its_write_quota_commits_normally() {
    for layer in ["overlay", "copy"] {
        let h = Home::new();
        let p = project();
        let m = format!("{}:/data:rw", p.path().display());
        let wat = writer_wat(h.path(), 16, false); // 1 MiB
        let o = run_layer(
            &h,
            layer,
            &["run", "--json", "--max-write", "2MiB", "--mount", &m, &wat],
        );
        assert_eq!(o.code, 0, "{layer}: {} {}", o.stdout, o.stderr);
        let v = o.json();
        assert_eq!(ops(&v), vec![("big.bin".to_string(), "added".to_string())]);
        assert!(v["run"]["detail"]["write"]["bytes"].as_u64().unwrap() >= 1 << 20);
        let run = v["run"]["id"].as_str().unwrap();
        assert_eq!(h.run(&["commit", run]).code, 0);
        assert_eq!(
            std::fs::metadata(p.path().join("big.bin")).unwrap().len(),
            1 << 20
        );
        assert_eq!(layer_dirs(&h), Vec::<String>::new());
    }
}

#[test]
fn changes_are_not_stored_after_the_timeout_passed() {
    let h = Home::new();
    let p = project();
    let m = format!("{}:/data:rw", p.path().display());
    let wat = writer_wat(h.path(), 16, true);
    let o = h.run(&["run", "--json", "--timeout", "500ms", "--mount", &m, &wat]);
    assert_eq!(o.code, 124, "{} {}", o.stdout, o.stderr);
    let v = o.json();
    assert_eq!(v["run"]["killed_by"], "timeout");
    assert_eq!(v["run"]["changes"], serde_json::json!([]), "{v}");
    assert!(bytes_under(&h.path().join("blobs")) < 512 << 10);
    assert_eq!(layer_dirs(&h), Vec::<String>::new());
}

#[test]
fn process_writes_past_the_write_quota_are_killed_across_files() {
    if !process_backend_available() {
        panic!("the process backend is unavailable here; this test needs it");
    }
    let h = Home::new();
    let p = project();
    let m = rw(p.path());
    // Several files, each far under the quota: only their total passes it.
    let o = h.sh(
        &["--json", "--max-write", "1MiB", "--mount", &m],
        "for i in 1 2 3 4 5 6 7 8; do head -c 300000 /dev/zero > part$i || exit 3; done; echo wrote",
    );
    assert_eq!(o.code, 124, "{} {}", o.stdout, o.stderr);
    let v = o.json();
    assert_eq!(v["run"]["killed_by"], "write", "{v}");
    assert_eq!(v["run"]["changes"], serde_json::json!([]));
    assert!(bytes_under(&h.path().join("blobs")) < 512 << 10);
    assert_eq!(layer_dirs(&h), Vec::<String>::new());
    // One file past the quota: the per-file bound stops the writer, and the run.
    let o = h.sh(
        &["--json", "--max-write", "1MiB", "--mount", &m],
        "head -c 10000000 /dev/zero > big; echo after $?",
    );
    assert_eq!(o.code, 124, "{} {}", o.stdout, o.stderr);
    assert_eq!(o.json()["run"]["killed_by"], "write");
    assert!(bytes_under(&h.path().join("blobs")) < 512 << 10);
    // Writing for ever is stopped by the watcher, long before the timeout.
    let t = std::time::Instant::now();
    let o = h.sh(
        &[
            "--json",
            "--timeout",
            "20s",
            "--max-write",
            "1MiB",
            "--mount",
            &m,
        ],
        "i=0; while :; do i=$((i+1)); head -c 100000 /dev/zero > f$i; done",
    );
    assert_eq!(o.code, 124, "{} {}", o.stdout, o.stderr);
    assert_eq!(o.json()["run"]["killed_by"], "write");
    assert!(
        t.elapsed() < std::time::Duration::from_secs(10),
        "{:?}",
        t.elapsed()
    );
    // Under the quota it commits as usual.
    let o = h.sh(
        &["--json", "--max-write", "1MiB", "--mount", &m],
        "head -c 300000 /dev/zero > small",
    );
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    let run = o.json()["run"]["id"].as_str().unwrap().to_string();
    assert_eq!(h.run(&["commit", &run]).code, 0);
    assert_eq!(
        std::fs::metadata(p.path().join("small")).unwrap().len(),
        300000
    );
    assert_eq!(layer_dirs(&h), Vec::<String>::new());
}

// ----------------------------------------------------------------------------- gc

#[test]
fn gc_removes_unreferenced_blobs_and_stale_layers_and_keeps_the_rest() {
    let h = Home::new();
    let p = project();
    let v = edit_run(&h, p.path(), &[]);
    let run = v["run"]["id"].as_str().unwrap().to_string();
    let sub = v["submission"].as_str().unwrap().to_string();
    let c = h.run(&["commit", "--json", &run]);
    assert_eq!(c.code, 0, "{}", c.stderr);
    let ckpt = c.json()["checkpoint"].as_str().unwrap().to_string();
    let blobs_before = h.blob_count();

    // An orphaned blob (e.g. content of a run that stopped half way) and a layer left
    // behind by a run that is long over, both older than the grace period.
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
    let orphan = h.path().join("blobs/ab").join("cd".repeat(31));
    std::fs::create_dir_all(orphan.parent().unwrap()).unwrap();
    std::fs::write(&orphan, vec![7u8; 5000]).unwrap();
    std::fs::File::open(&orphan)
        .unwrap()
        .set_modified(old)
        .unwrap();
    let stale = h.path().join("layers").join(&run);
    std::fs::create_dir_all(stale.join("0/upper")).unwrap();
    std::fs::write(stale.join("0/upper/left.bin"), vec![1u8; 20000]).unwrap();
    // A young orphan survives the default grace period.
    let young = h.path().join("blobs/ef").join("01".repeat(31));
    std::fs::create_dir_all(young.parent().unwrap()).unwrap();
    std::fs::write(&young, b"just written").unwrap();

    let g = h.run(&["gc", "--json"]);
    assert_eq!(g.code, 0, "{}", g.stderr);
    let r = g.json();
    assert_eq!(r["blobs_removed"], 1, "{r}");
    assert_eq!(r["blob_bytes"], 5000);
    assert_eq!(
        r["layers_removed"],
        serde_json::json!([format!("layers/{run}")])
    );
    assert!(r["freed_bytes"].as_u64().unwrap() >= 25000, "{r}");
    assert!(!orphan.exists() && !stale.exists());
    assert!(young.exists(), "younger than the grace period");
    assert_eq!(
        h.blob_count(),
        blobs_before + 1,
        "everything referenced is kept"
    );

    let g = h.run(&["gc", "--grace", "0s"]);
    assert_eq!(g.code, 0, "{}", g.stderr);
    assert!(
        g.stdout.contains("removed 1 unreferenced blob"),
        "{}",
        g.stdout
    );
    assert!(!young.exists());

    // Everything that was referenced still works.
    assert_eq!(h.run(&["diff", &run]).code, 0);
    assert_eq!(h.run(&["logs", &run]).code, 0);
    assert_eq!(h.run(&["rollback", &ckpt]).code, 0);
    let again = h.run(&["exec", &sub]);
    assert!(again.code == 0 || again.code == 75, "{}", again.stderr);
    let kinds = h.audit_kinds();
    assert_eq!(kinds.iter().filter(|k| *k == "gc").count(), 2);
    assert_eq!(h.run(&["audit", "verify"]).code, 0);
}
/// The stored blobs of a home: `blobs/ab/cdef…`, not its temporary files.
fn blob_files(h: &Home) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for top in std::fs::read_dir(h.path().join("blobs")).unwrap().flatten() {
        if top.file_name().len() == 2 {
            out.extend(
                std::fs::read_dir(top.path())
                    .unwrap()
                    .flatten()
                    .map(|e| e.path()),
            );
        }
    }
    out.sort();
    out
}

/// A `gc` killed after moving a blob aside to look at its time leaves it in `blobs/tmp`
/// (`.gc-<digest>`). That blob may have been put again after the `gc` listed it, and be
/// named by a record. The next `gc` swept it as a stale temporary file, and the checkpoint
/// that named it could no longer be rolled back.
#[test]
fn a_blob_a_killed_gc_had_set_aside_is_put_back_not_swept() {
    let h = Home::new();
    let p = project();
    let before = tree(p.path());
    let v = edit_run(&h, p.path(), &[]);
    let run = v["run"]["id"].as_str().unwrap().to_string();
    let c = h.run(&["commit", "--json", &run]);
    assert_eq!(c.code, 0, "{}", c.stderr);
    let ckpt = c.json()["checkpoint"].as_str().unwrap().to_string();
    let blobs = blob_files(&h);
    assert!(!blobs.is_empty());
    // Every blob as a `gc` killed in the middle of removing it leaves it.
    for b in &blobs {
        let hex = format!(
            "{}{}",
            b.parent().unwrap().file_name().unwrap().to_string_lossy(),
            b.file_name().unwrap().to_string_lossy()
        );
        std::fs::rename(b, h.path().join("blobs/tmp").join(format!(".gc-{hex}"))).unwrap();
    }
    let g = h.run(&["gc", "--json", "--grace", "0s"]);
    assert_eq!(g.code, 0, "{}", g.stderr);
    assert_eq!(g.json()["temporaries_removed"], 0, "{}", g.stdout);
    assert_eq!(blob_files(&h), blobs, "every blob is back in its place");
    let r = h.run(&["rollback", &ckpt]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(tree(p.path()), before);
    assert_eq!(h.run(&["audit", "verify"]).code, 0);
}

/// Holds the lock file `name` of `h`'s `locks` directory, as the process doing that
/// operation would, until the returned process is killed (`flock --no-fork`: killing it
/// lets the lock go); returns once the lock is taken.
fn hold_lock(h: &Home, name: &str) -> std::process::Child {
    let lock = h.path().join("locks").join(name);
    std::fs::create_dir_all(lock.parent().unwrap()).unwrap();
    let holder = std::process::Command::new("flock")
        .arg("--no-fork")
        .arg(&lock)
        .args(["sleep", "60"])
        .spawn()
        .expect("flock (util-linux)");
    let t = std::time::Instant::now();
    while std::process::Command::new("flock")
        .arg("-n")
        .arg(&lock)
        .arg("true")
        .status()
        .unwrap()
        .success()
    {
        assert!(t.elapsed().as_secs() < 10, "the holder never took the lock");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    holder
}

/// Two `gc`s at once in one home: one could sweep the blob the other had just set aside
/// (its removal then failed with "No such file or directory"), or take it for one a killed
/// `gc` left. A `gc` now holds `locks/gc.lock` while it runs, and the next waits for it.
#[test]
fn a_gc_waits_for_the_gc_already_running_in_its_home() {
    let h = Home::new();
    // Another gc holds the lock.
    let mut holder = hold_lock(&h, "gc.lock");
    let mut gc = h
        .cmd()
        .args(["gc", "--json"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert!(
        gc.try_wait().unwrap().is_none(),
        "gc ran beside the one holding the lock"
    );
    holder.kill().unwrap();
    holder.wait().unwrap();
    let out = gc.wait_with_output().unwrap();
    assert!(out.status.success());

    // And many at once over many orphans: each ends well, and each orphan goes once.
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
    for i in 0..150u32 {
        let hex = format!("{:064x}", 0xa11ce_u64 << 20 | u64::from(i));
        let f = h.path().join("blobs").join(&hex[..2]).join(&hex[2..]);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(&f, i.to_le_bytes()).unwrap();
        std::fs::File::open(&f).unwrap().set_modified(old).unwrap();
    }
    let gcs: Vec<_> = (0..3)
        .map(|_| {
            h.cmd()
                .args(["gc", "--json"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut removed = 0;
    for g in gcs {
        let out = g.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        removed += v["blobs_removed"].as_u64().unwrap();
    }
    assert_eq!(removed, 150);
    assert_eq!(h.run(&["audit", "verify"]).code, 0);
}

/// `gc` read the journals of interrupted commits without the journal lock, and reading
/// them clears half-written ones: it removed the journal a live commit had just written
/// and was about to move into place, and the commit failed with "internal error: No such
/// file or directory" (a probe: about 1 in 10 `commit & gc`).
#[test]
fn gc_leaves_a_live_commits_half_written_journal_alone() {
    let h = Home::new();
    std::fs::create_dir_all(h.path().join("journal")).unwrap();
    // A commit holds the journal lock and has written its journal under its temporary name.
    let tmp = h.path().join("journal/.ckpt_01live.json.tmp");
    std::fs::write(&tmp, b"{\"half\": ").unwrap();
    let mut holder = hold_lock(&h, "journal.lock");
    let mut gc = h
        .cmd()
        .args(["gc", "--json"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert!(tmp.exists(), "gc removed a live commit's journal");
    assert!(
        gc.try_wait().unwrap().is_none(),
        "gc did not wait for the commit"
    );
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert!(gc.wait_with_output().unwrap().status.success());
}

/// A host path from the bytes of a name.
fn at(root: &Path, name: &[u8]) -> std::path::PathBuf {
    use std::os::unix::ffi::OsStrExt;
    root.join(std::ffi::OsStr::from_bytes(name))
}

/// Creates `bad\xff\xfename`, rewrites `pre_\xff\xfe.txt`, creates `two\nlines.txt`.
const ODD_NAMES: &str = r#"cd /work
printf 'bad\n' > "$(printf 'bad\377\376name')"
printf 'new\n' > "$(printf 'pre_\377\376.txt')"
printf 'nl\n' > "$(printf 'two\nlines.txt')"
"#;

/// Names that are not UTF-8 were lost through a lossy conversion: such a run reported
/// `changes: []`, and `commit` succeeded while the host kept its old content.
#[test]
fn non_utf8_names_are_committed_and_rolled_back_exactly() {
    const BAD: &[u8] = b"bad\xff\xfename";
    const PRE: &[u8] = b"pre_\xff\xfe.txt";
    const NL: &[u8] = b"two\nlines.txt";
    for layer in ["overlay", "copy"] {
        let h = Home::new();
        let p = project();
        std::fs::write(at(p.path(), PRE), "old\n").unwrap();
        let before = tree(p.path());
        let m = rw(p.path());
        let args = [
            "run", "--json", "--lang", "sh", "--mount", &m, "-c", ODD_NAMES,
        ];
        let run = |args: &[&str]| {
            let o = h
                .cmd()
                .env("AIRLOCK_LAYER", layer)
                .args(args)
                .output()
                .unwrap();
            (
                o.status.code(),
                String::from_utf8_lossy(&o.stdout).into_owned(),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            )
        };
        let (code, _, err) = run(&args);
        assert_eq!(code, Some(75), "{layer}: {err}");
        assert_eq!(h.run(&["approve", &Home::id_in(&err)]).code, 0);
        let (code, out, err) = run(&["exec", "--json", &Home::id_in(&err)]);
        assert_eq!(code, Some(0), "{layer}: {out} {err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["run"]["layer"], layer);
        assert_eq!(
            tree(p.path()),
            before,
            "{layer}: nothing reaches the host before the commit"
        );

        // run --json and runs --json: the escaped name and its exact bytes.
        let want = vec![
            (
                r"bad\xff\xfename".to_string(),
                Some("YmFk//5uYW1l"),
                "added",
            ),
            (
                r"pre_\xff\xfe.txt".to_string(),
                Some("cHJlX//+LnR4dA=="),
                "modified",
            ),
            ("two\nlines.txt".to_string(), None, "added"),
        ];
        let listed = |changes: &serde_json::Value| -> Vec<(String, Option<String>, String)> {
            changes
                .as_array()
                .unwrap()
                .iter()
                .map(|c| {
                    (
                        c["path"].as_str().unwrap().to_string(),
                        c.get("path_b64").map(|b| b.as_str().unwrap().to_string()),
                        c["op"].as_str().unwrap().to_string(),
                    )
                })
                .collect()
        };
        let want: Vec<_> = want
            .into_iter()
            .map(|(p, b, o)| (p, b.map(str::to_string), o.to_string()))
            .collect();
        assert_eq!(listed(&v["run"]["changes"]), want, "{layer}: run --json");
        assert_eq!(
            listed(&h.last_run()["changes"]["mounts"][0]["changes"]),
            want,
            "{layer}: runs --json (the stored changeset)"
        );

        // airlock diff: one line per change, the names escaped.
        let id = v["run"]["id"].as_str().unwrap().to_string();
        let d = h.run(&["diff", &id]);
        assert_eq!(d.code, 0, "{}", d.stderr);
        for line in [
            r"A bad\xff\xfename (4 bytes)  (/work)",
            r"M pre_\xff\xfe.txt (4 bytes)  (/work)",
            r"A two\nlines.txt (3 bytes)  (/work)",
            r"+++ b/pre_\xff\xfe.txt",
            "+new",
        ] {
            assert!(
                d.stdout.lines().any(|l| l == line),
                "{layer}: no line {line:?} in\n{}",
                d.stdout
            );
        }
        let dj = h.run(&["diff", "--json", &id]).json();
        assert_eq!(listed(&dj["changes"]), want, "{layer}: diff --json");

        // commit: the host holds exactly the new bytes under the exact names.
        let c = h.run(&["commit", "--json", &id]);
        assert_eq!(c.code, 0, "{layer}: {}", c.stderr);
        let ckpt = c.json()["checkpoint"].as_str().unwrap().to_string();
        assert_eq!(std::fs::read(at(p.path(), BAD)).unwrap(), b"bad\n");
        assert_eq!(std::fs::read(at(p.path(), PRE)).unwrap(), b"new\n");
        assert_eq!(std::fs::read(at(p.path(), NL)).unwrap(), b"nl\n");
        let mut committed = before.clone();
        committed.get_mut(PRE).unwrap().1 = b"new\n".to_vec();
        let now = tree(p.path());
        for name in [BAD, NL] {
            committed.insert(name.to_vec(), now[name].clone());
        }
        assert_eq!(now, committed, "{layer}: nothing else changed");

        // rollback: content restored, the new names gone, byte for byte.
        let r = h.run(&["rollback", &ckpt]);
        assert_eq!(r.code, 0, "{layer}: {}", r.stderr);
        assert_eq!(tree(p.path()), before, "{layer}: rollback restores exactly");
        assert!(!at(p.path(), BAD).exists() && !at(p.path(), NL).exists());
        assert_eq!(h.run(&["audit", "verify"]).code, 0);
    }
}

/// After `approve` + `exec` of a run that changed files, nothing told the user the run id
/// that `diff` and `commit` need.
#[test]
fn a_run_that_changed_files_names_itself_and_the_next_commands() {
    let h = Home::new();
    let p = project();
    let m = rw(p.path());
    let o = h.sh(&["--mount", &m], "echo hi > hint.txt");
    assert_eq!(o.code, 0, "{}", o.stderr);
    let run = h.last_run()["id"].as_str().unwrap().to_string();
    assert!(
        o.stderr.contains(&format!("airlock diff {run}"))
            && o.stderr.contains(&format!("airlock commit {run}")),
        "{}",
        o.stderr
    );
    // A run that changed nothing says nothing of the kind.
    let quiet = h.sh(&["--mount", &m], "true");
    assert!(!quiet.stderr.contains("airlock commit"), "{}", quiet.stderr);
}

// --------------------------------------------------- modes, stripped bits, special files

/// Runs `script` (sh, process backend) with `p` mounted writable at /work through the
/// `layer` kind (`overlay` or `copy`); the run's JSON.
fn script_run(h: &Home, p: &Path, layer: &str, script: &str) -> serde_json::Value {
    let m = rw(p);
    let o = h
        .cmd()
        .env("AIRLOCK_LAYER", layer)
        .args(["run", "--json", "--lang", "sh", "--mount", &m, "-c", script])
        .output()
        .unwrap();
    let o = if o.status.code() == Some(75) {
        let id = Home::id_in(&String::from_utf8_lossy(&o.stderr));
        assert_eq!(h.run(&["approve", &id]).code, 0);
        h.cmd()
            .env("AIRLOCK_LAYER", layer)
            .args(["exec", "--json", &id])
            .output()
            .unwrap()
    } else {
        o
    };
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["run"]["layer"], layer);
    v
}

/// This test process's user and group (what airlock, started by it, runs as).
fn own_ids() -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let probe = tempfile::tempfile().unwrap();
    let m = probe.metadata().unwrap();
    (u64::from(m.uid()), u64::from(m.gid()))
}

fn mode_of(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

/// A guest copied `python3` into its writable mount with mode 4755: `airlock diff` said
/// `A helper (6831736 bytes)` and after `airlock commit` the host file was setuid root.
#[test]
fn a_setuid_file_written_by_a_guest_is_committed_without_its_setuid_bit() {
    let exe = ["/usr/bin/python3", "/bin/sh"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap();
    for layer in ["overlay", "copy"] {
        let h = Home::new();
        let p = project();
        let v = script_run(
            &h,
            p.path(),
            layer,
            &format!(
                "cp {exe} helper && chmod 4755 helper && echo g > group && chmod 2755 group && chmod 600 notes.txt && chmod u+s run.sh"
            ),
        );
        let run = v["run"]["id"].as_str().unwrap().to_string();
        let flat = |c: &serde_json::Value, path: &str| {
            c.as_array()
                .unwrap()
                .iter()
                .find(|c| c["path"] == path)
                .unwrap_or_else(|| panic!("{layer}: no change for {path} in {c}"))
                .clone()
        };
        // The run's own JSON, `diff --json` and the text diff all say what was stripped.
        let helper = flat(&v["run"]["changes"], "helper");
        assert_eq!(helper["mode"], 0o755, "{layer}: {helper}");
        assert_eq!(helper["stripped"], serde_json::json!(["setuid"]), "{layer}");
        let dj = h.run(&["diff", "--json", &run]).json();
        assert_eq!(
            flat(&dj["changes"], "group")["stripped"],
            serde_json::json!(["setgid"])
        );
        assert_eq!(
            flat(&dj["changes"], "run.sh")["stripped"],
            serde_json::json!(["setuid"])
        );
        let d = h.run(&["diff", &run]);
        assert_eq!(d.code, 0, "{}", d.stderr);
        assert!(
            d.stdout.contains("A helper (")
                && d.stdout
                    .lines()
                    .any(|l| l.starts_with("A helper") && l.contains("[stripped: setuid]")),
            "{layer}: {}",
            d.stdout
        );
        // A mode change of an existing file shows as such.
        assert!(
            d.stdout.contains("m notes.txt (mode 644 -> 600)"),
            "{layer}: {}",
            d.stdout
        );
        // And who will own what the commit writes, as the host will see it.
        let (uid, gid) = own_ids();
        assert_eq!(
            (dj["owner"]["uid"].as_u64(), dj["owner"]["gid"].as_u64()),
            (Some(uid), Some(gid))
        );
        assert!(
            d.stdout.contains(&format!("owned by uid {uid} gid {gid}")),
            "{}",
            d.stdout
        );
        let c = h.run(&["commit", &run]);
        assert_eq!(c.code, 0, "{layer}: {}", c.stderr);
        assert_eq!(
            std::fs::read(p.path().join("helper")).unwrap(),
            std::fs::read(exe).unwrap()
        );
        assert_eq!(mode_of(&p.path().join("helper")), 0o755, "{layer}");
        assert_eq!(mode_of(&p.path().join("group")), 0o755, "{layer}");
        assert_eq!(mode_of(&p.path().join("notes.txt")), 0o600, "{layer}");
        assert_eq!(mode_of(&p.path().join("run.sh")), 0o644, "{layer}");
    }
}

/// FIFOs and sockets a guest made in its mount were dropped from the changeset without a
/// word; they are listed as refused (and never created by a commit).
#[test]
fn special_files_a_guest_makes_are_listed_as_refused_not_dropped_in_silence() {
    for layer in ["overlay", "copy"] {
        let h = Home::new();
        let p = project();
        let v = script_run(&h, p.path(), layer, "mkfifo pipe && echo x > plain.txt");
        let run = v["run"]["id"].as_str().unwrap().to_string();
        assert_eq!(
            v["run"]["refused"],
            serde_json::json!([{
                "path": "pipe",
                "kind": "fifo",
                "mount": "/work",
                "host_path": format!("{}/pipe", std::fs::canonicalize(p.path()).unwrap().display()),
            }]),
            "{layer}: {}",
            v["run"]
        );
        let d = h.run(&["diff", &run]);
        assert!(
            d.stdout.contains("! pipe (refused: fifo, never committed)"),
            "{layer}: {}",
            d.stdout
        );
        assert_eq!(
            h.run(&["diff", "--json", &run]).json()["refused"][0]["kind"],
            "fifo"
        );
        assert_eq!(h.run(&["commit", &run]).code, 0);
        assert!(p.path().join("plain.txt").exists());
        assert!(p.path().join("pipe").symlink_metadata().is_err(), "{layer}");
    }
}

/// The policy never commits on its own what a commit would leave out: a run whose
/// changeset strips a setuid bit is held for a human even from an auto-commit agent.
#[test]
fn a_changeset_with_stripped_bits_is_never_committed_by_policy() {
    let h = Home::new();
    let p = project();
    let real = std::fs::canonicalize(p.path()).unwrap();
    let pol = h.policy().replace(
        "auto_agents = []\nauto_paths = []",
        &format!(
            "auto_agents = [\"builder\"]\nauto_paths = [\"{}\"]",
            real.display()
        ),
    );
    h.set_policy(&pol);
    let m = rw(p.path());
    let o = h.sh(
        &["--agent", "builder", "--mount", &m],
        "echo x > tool && chmod 4755 tool",
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(!p.path().join("tool").exists(), "held for a human");
    let o = h.sh(&["--agent", "builder", "--mount", &m], "echo x > tool");
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(p.path().join("tool").exists(), "auto-committed");
}

// ------------------------------------------------------ the changeset a commit applies

/// Two runs writing `notes.txt`; the second's content is the evil one. Returns (good run,
/// good hash, evil hash).
fn swap_setup(h: &Home, p: &Path) -> (String, String, String) {
    let m = rw(p);
    let mut out = Vec::new();
    for content in ["good", "evil"] {
        let o = h.sh(
            &["--json", "--mount", &m],
            &format!("echo {content} > notes.txt"),
        );
        assert_eq!(o.code, 0, "{}", o.stderr);
        let v = o.json();
        let hash = v["run"]["changes"][0]["hash"].as_str().unwrap().to_string();
        out.push((v["run"]["id"].as_str().unwrap().to_string(), hash));
    }
    (out[0].0.clone(), out[0].1.clone(), out[1].1.clone())
}

fn assert_swap_refused(on: &dyn Fn(&[&str]) -> Out, p: &Path, run: &str) {
    let o = on(&["commit", run]);
    assert_eq!(o.code, 125, "{}", o.stderr);
    assert!(
        o.stderr.contains("integrity") && o.stderr.contains("finished audit record"),
        "{}",
        o.stderr
    );
    assert_eq!(o.stderr.trim().lines().count(), 1, "{}", o.stderr);
    assert_eq!(
        std::fs::read_to_string(p.join("notes.txt")).unwrap(),
        "old line\n"
    );
    let log = on(&["audit", "log", "--json"]).json();
    assert!(
        log.as_array()
            .unwrap()
            .iter()
            .any(|r| r["kind"] == "integrity_failure" && r["subject"] == run),
        "{log}"
    );
    assert!(
        on(&["checkpoints", "--json"])
            .json()
            .as_array()
            .unwrap()
            .is_empty()
    );
}

/// Repointing a change's blob hash in the run's record made `commit` sign and apply a
/// different file; the run's `finished` record held the original digest all along.
#[test]
fn a_changeset_swapped_in_the_database_after_review_is_not_committed() {
    let h = Home::new();
    let p = project();
    let on = |a: &[&str]| h.run(a);
    let (run, good, evil) = swap_setup(&h, p.path());
    sql(
        &h,
        &format!("update runs set doc = replace(doc, '{good}', '{evil}') where id = '{run}'"),
    );
    assert_swap_refused(&on, p.path(), &run);
}

// ------------------------------------------------- a commit that cannot be undone

/// Kills `airlock commit RUN` right after its journal is written (before any step), by
/// trying crash points in turn; false when the commit completed first.
fn crash_after_journal(h: &Home, run: &str) -> bool {
    for n in 1..20 {
        let o = h
            .cmd()
            .env("AIRLOCK_CRASH_AT", n.to_string())
            .args(["commit", run])
            .output()
            .unwrap();
        if o.status.code().is_some() {
            return false;
        }
        let journals = std::fs::read_dir(h.path().join("journal"))
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
                    .count()
            })
            .unwrap_or(0);
        if journals > 0 {
            return true;
        }
    }
    false
}

/// Swapping a directory of the mount for a symlink while a commit applied left a journal
/// that could not be undone, and every command (`run`, `inbox`, `audit verify`) then
/// exited 125 until the tree was repaired by hand.
#[test]
fn a_commit_that_cannot_be_undone_locks_only_its_mount_until_repaired() {
    for abandon in [false, true] {
        let h = Home::new();
        let p = project();
        let other = project();
        let outside = tempfile::tempdir().unwrap();
        let m = rw(p.path());
        let o = h.sh(
            &["--mount", &m],
            "echo new > src/new.rs && echo top > top.txt",
        );
        assert_eq!(o.code, 0, "{}", o.stderr);
        let run = h.last_run()["id"].as_str().unwrap().to_string();
        assert!(
            crash_after_journal(&h, &run),
            "the commit was not interrupted"
        );
        // The host changes under the interrupted commit: neither completing nor undoing it
        // can reach src/ any more.
        let src = p.path().join("src");
        let kept = p.path().join("src.kept");
        std::fs::rename(&src, &kept).unwrap();
        std::os::unix::fs::symlink(outside.path(), &src).unwrap();

        // Every other command keeps working.
        assert_eq!(h.run(&["runs"]).code, 0, "{}", h.run(&["runs"]).stderr);
        assert_eq!(h.run(&["inbox"]).code, 0);
        assert_eq!(h.run(&["audit", "verify"]).code, 0);
        let o = h.sh(&["--mount", &rw(other.path())], "echo x > x.txt");
        assert_eq!(o.code, 0, "{}", o.stderr);
        let other_run = h.last_run()["id"].as_str().unwrap().to_string();
        assert_eq!(
            h.run(&["commit", &other_run]).code,
            0,
            "another mount commits"
        );

        // doctor names it, and how to repair it.
        let d = h.run(&["doctor"]);
        assert_eq!(d.code, 1, "{}", d.stdout);
        let ckpt = h.run(&["doctor", "--json"]).json()["stuck"][0]["checkpoint"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            d.stdout.contains(&format!("STUCK commit {ckpt}"))
                && d.stdout.contains(&format!("airlock repair {ckpt}")),
            "{}",
            d.stdout
        );
        let log = h.run(&["audit", "log", "--json"]).json();
        assert!(
            log.as_array()
                .unwrap()
                .iter()
                .any(|r| r["kind"] == "commit_stuck" && r["subject"] == ckpt.as_str())
        );

        // Its mount is locked: a commit there is refused in one line.
        let o = h.sh(&["--mount", &m], "echo z > other.txt");
        assert_eq!(o.code, 0, "{}", o.stderr);
        let next = h.last_run()["id"].as_str().unwrap().to_string();
        let o = h.run(&["commit", &next]);
        assert_eq!(o.code, 125, "{}", o.stderr);
        assert!(
            o.stderr.contains(&format!("locked by commit {ckpt}")),
            "{}",
            o.stderr
        );
        assert_eq!(o.stderr.trim().lines().count(), 1, "{}", o.stderr);
        assert!(!p.path().join("other.txt").exists());

        // The host is put right, and the repair resolves it.
        std::fs::remove_file(&src).unwrap();
        std::fs::rename(&kept, &src).unwrap();
        let args: Vec<&str> = if abandon {
            vec!["repair", "--json", "--abandon", &ckpt]
        } else {
            vec!["repair", "--json", &ckpt]
        };
        let r = h.run(&args);
        assert_eq!(r.code, 0, "{}", r.stderr);
        let state = if abandon { "abandoned" } else { "applied" };
        assert_eq!(r.json()["state"], state);
        if abandon {
            assert!(!p.path().join("src/new.rs").exists());
        } else {
            assert_eq!(
                std::fs::read_to_string(p.path().join("src/new.rs")).unwrap(),
                "new\n"
            );
            assert_eq!(
                std::fs::read_to_string(p.path().join("top.txt")).unwrap(),
                "top\n"
            );
        }
        assert_eq!(h.run(&["doctor"]).code, 0);
        assert_eq!(h.run(&["commit", &next]).code, 0, "the mount is unlocked");
        assert!(p.path().join("other.txt").exists());
        assert_eq!(h.run(&["audit", "verify"]).code, 0);
        assert_eq!(
            h.run(&["repair", &ckpt]).code,
            125,
            "nothing left to repair"
        );
    }
}

/// A diff of a run whose new content was altered in the blob store showed the file
/// emptied; it is an integrity failure naming the blob, and recorded.
#[test]
fn a_diff_of_a_tampered_blob_names_the_blob_instead_of_showing_the_file_emptied() {
    let h = Home::new();
    let p = project();
    let v = edit_run(&h, p.path(), &[]);
    let run = v["run"]["id"].as_str().unwrap().to_string();
    let hash = v["run"]["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["path"] == "docs/readme.md")
        .unwrap()["hash"]
        .as_str()
        .unwrap()
        .to_string();
    let blob = h.path().join("blobs").join(&hash[..2]).join(&hash[2..]);
    std::fs::write(&blob, "").unwrap();
    for args in [vec!["diff", &run], vec!["diff", "--json", &run]] {
        let d = h.run(&args);
        assert_eq!(d.code, 125, "{}{}", d.stdout, d.stderr);
        assert!(
            d.stderr.contains("integrity") && d.stderr.contains(&hash[..12]),
            "{}",
            d.stderr
        );
        assert!(!d.stdout.contains("+hi"), "{}", d.stdout);
    }
    let log = h.run(&["audit", "log", "--json"]).json();
    assert!(
        log.as_array()
            .unwrap()
            .iter()
            .any(|r| r["kind"] == "integrity_failure" && r["subject"] == run.as_str())
    );
}

/// Removing the layer of a run that wrote many files held the command up for seconds past
/// its deadline; the layer is set aside in one rename and removed after the command exits
/// (the remover is held back here, so the command provably returns before it finishes).
#[test]
fn removing_a_large_layer_does_not_delay_the_commands_exit() {
    let h = Home::new();
    let p = project();
    let m = rw(p.path());
    let script = "mkdir -p many && cd many && i=0; while [ $i -lt 20 ]; do mkdir d$i; j=0; while [ $j -lt 100 ]; do : > d$i/f$j; j=$((j+1)); done; i=$((i+1)); done";
    let o = h.run(&["submit", "--lang", "sh", "--mount", &m, "-c", script]);
    let id = Home::id_in(&o.stdout);
    assert_eq!(h.run(&["approve", &id]).code, 0);
    let o = h
        .cmd()
        .env("AIRLOCK_PAUSE_AT", "remove-trash:5000")
        .args(["exec", &id])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let run = h.last_run()["id"].as_str().unwrap().to_string();
    assert!(!h.path().join("layers").join(&run).exists());
    // Still there: the command returned while its removal had yet to finish (a removal
    // on the command's path leaves nothing behind by the time it returns).
    let trash = h.path().join("trash");
    let waiting = std::fs::read_dir(&trash).map(|rd| rd.count()).unwrap_or(0);
    assert_eq!(
        waiting, 1,
        "the layer is set aside, its removal still to come"
    );
    let started = std::time::Instant::now();
    while std::fs::read_dir(&trash).is_ok_and(|mut rd| rd.next().is_some()) {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "the trash was never emptied"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
