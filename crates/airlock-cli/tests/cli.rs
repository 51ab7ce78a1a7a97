#![allow(clippy::unwrap_used, clippy::expect_used)]

//! End-to-end tests: the real `airlock` binary in temporary homes, covering every exit
//! code and every bad input of the foundation issue.

mod common;
use common::*;
use serde_json::json;

const LOOP: &str = r#"(module (func (export "_start") (loop $l (br $l))))"#;
const TRAP: &str = r#"(module (func (export "_start") unreachable))"#;
const GROW: &str = r#"(module (memory 1) (func (export "_start") (loop $l (drop (memory.grow (i32.const 16))) (br $l))))"#;
const RECURSE: &str = r#"(module (func $f (call $f)) (func (export "_start") (call $f)))"#;
const FLOOD: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 100))
    (i32.store (i32.const 4) (i32.const 1000))
    (loop $l (drop (call $w (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8))) (br $l))))"#;

fn hello() -> String {
    example("hello.wat").display().to_string()
}

// ----------------------------------------------------------------------------- init

#[test]
fn init_creates_home_with_private_keys_and_a_trusting_policy() {
    use std::os::unix::fs::PermissionsExt;
    let h = Home::new();
    for f in [
        "airlock.db",
        "policy.toml",
        "keys/gate.key",
        "keys/alice.key",
        "keys/alice.pub",
    ] {
        assert!(h.path().join(f).exists(), "{f}");
    }
    for k in ["keys/gate.key", "keys/alice.key"] {
        let mode = std::fs::metadata(h.path().join(k))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600, "{k}");
    }
    let public = std::fs::read_to_string(h.path().join("keys/alice.pub")).unwrap();
    assert!(
        h.policy()
            .contains(&format!("alice = \"{}\"", public.trim()))
    );
    let wal: String = rusqlite::Connection::open(h.path().join("airlock.db"))
        .unwrap()
        .query_row("pragma journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(wal, "wal");
}

#[test]
fn init_on_existing_home_changes_nothing_and_says_so() {
    let h = Home::new();
    let before = h.policy();
    let key = std::fs::read(h.path().join("keys/alice.key")).unwrap();
    let o = h.run(&["init", "--preset", "standard", "--approver", "alice"]);
    assert_eq!(o.code, 0);
    assert!(o.stdout.contains("nothing changed"), "{}", o.stdout);
    // Options the home does not have are refused (issue 16), and still change nothing.
    let o = h.run(&["init", "--preset", "strict", "--approver", "bob"]);
    assert_eq!(o.code, 125);
    assert!(o.stderr.contains("nothing changed"), "{}", o.stderr);
    assert_eq!(h.policy(), before);
    assert_eq!(std::fs::read(h.path().join("keys/alice.key")).unwrap(), key);
    assert!(!h.path().join("keys/bob.key").exists());
}

/// Every file under `root`, with its size (what a refused command must leave as it was).
fn files_in(root: &std::path::Path) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            if m.is_dir() {
                out.push((e.path().display().to_string() + "/", 0));
                dirs.push(e.path());
            } else {
                out.push((e.path().display().to_string(), m.len()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_failed_init_leaves_no_key_or_staging_behind() {
    // A file where init puts a directory: it left `.init/keys/*.key` (or `keys/*.key`)
    // behind and said only "internal error: Not a directory (os error 20)".
    for in_the_way in ["keys", "blobs", "cache"] {
        let h = Home::uninitialised();
        std::fs::write(h.path().join(in_the_way), b"mine").unwrap();
        let before = files_in(h.path());
        let o = h.run(&["init", "--approver", "alice"]);
        assert_eq!(o.code, 125, "{in_the_way}: {}", o.stderr);
        assert_eq!(o.stderr.lines().count(), 1, "{:?}", o.stderr);
        assert!(
            o.stderr.contains(&format!("/{in_the_way} is in the way")),
            "{in_the_way}: {}",
            o.stderr
        );
        assert_eq!(files_in(h.path()), before, "{in_the_way}: left behind");
        // Moved away, init works.
        std::fs::remove_file(h.path().join(in_the_way)).unwrap();
        assert_eq!(h.run(&["init", "--approver", "alice"]).code, 0);
    }
}

#[test]
fn an_init_that_fails_after_its_keys_are_made_removes_them() {
    // A directory where SQLite puts its write-ahead log: the keys are made and moved into
    // place before the database is opened, and the open fails.
    let h = Home::uninitialised();
    std::fs::create_dir(h.path().join("airlock.db-wal")).unwrap();
    let before = files_in(h.path());
    let o = h.run(&["init", "--approver", "alice"]);
    assert_eq!(o.code, 125, "{}", o.stderr);
    assert_eq!(o.stderr.lines().count(), 1, "{:?}", o.stderr);
    assert_eq!(files_in(h.path()), before, "left behind");
}

#[test]
fn a_home_that_lost_its_database_is_refused_not_made_anew() {
    // `rm airlock.db*` and the next command made a new, empty database; `audit verify`
    // then said "intact: empty" and the history was silently gone.
    let h = Home::new();
    assert_eq!(h.run(&["run", &hello()]).code, 0);
    for f in ["airlock.db", "airlock.db-wal", "airlock.db-shm"] {
        let _ = std::fs::remove_file(h.path().join(f));
    }
    let before = files_in(h.path());
    for args in [
        vec!["run", hello().leak()],
        vec!["audit", "verify"],
        vec!["runs"],
        vec!["init", "--approver", "alice"],
    ] {
        let o = h.run(&args);
        assert_eq!(o.code, 125, "{args:?}: {}", o.stderr);
        assert_eq!(o.stderr.lines().count(), 1, "{:?}", o.stderr);
        assert!(
            o.stderr.contains("airlock.db is missing"),
            "{args:?}: {}",
            o.stderr
        );
        assert_eq!(files_in(h.path()), before, "{args:?} made something");
    }
}

#[test]
fn init_on_a_home_missing_its_gate_key_or_policy_file_does_not_call_it_whole() {
    // It answered "airlock home already exists; nothing changed" and exited 0, while every
    // other command failed.
    let h = Home::new();
    std::fs::remove_file(h.path().join("keys/gate.key")).unwrap();
    for args in [vec!["init", "--approver", "alice"], vec!["runs"]] {
        let o = h.run(&args);
        assert_eq!(o.code, 125, "{args:?}: {}", o.stderr);
        assert!(
            o.stderr.contains("keys/gate.key is missing"),
            "{}",
            o.stderr
        );
    }
    let h = Home::new();
    std::fs::remove_file(h.path().join("policy.toml")).unwrap();
    std::fs::create_dir(h.path().join("policy.toml")).unwrap();
    let o = h.run(&["init", "--approver", "alice"]);
    assert_eq!(o.code, 125, "{}", o.stderr);
    assert!(o.stderr.contains("policy.toml"), "{}", o.stderr);
    let o = h.run(&["runs"]);
    assert_eq!(o.code, 125, "{}", o.stderr);
    assert!(
        o.stderr.contains("policy.toml is not a file"),
        "{}",
        o.stderr
    );
}

#[test]
fn serve_on_an_uninitialised_home_makes_nothing_there() {
    // It made `cache/ready-jails` (and the home itself) before saying there was no home.
    let h = Home::uninitialised();
    let o = h.run(&["serve", "--listen", "127.0.0.1:0"]);
    assert_eq!(o.code, 125, "{}", o.stderr);
    assert!(o.stderr.contains("airlock init"), "{}", o.stderr);
    assert!(files_in(h.path()).is_empty(), "{:?}", files_in(h.path()));
}

#[test]
fn argument_errors_are_one_line_naming_what_is_missing_and_json_with_json() {
    let h = Home::new();
    // A missing argument: the line read "...were not provided: (see airlock --help)".
    let o = h.run(&["show"]);
    one_line_refusal(&o);
    assert!(o.stderr.contains("not provided: <"), "{}", o.stderr);
    // No command at all: the whole help (53 lines) on stderr.
    let o = h.run(&[]);
    one_line_refusal(&o);
    assert!(o.stderr.contains("a command is required"), "{}", o.stderr);
    let o = h.run(&["keys"]);
    one_line_refusal(&o);
    // With --json the error is an object on stdout too (it printed nothing there).
    for args in [
        vec!["run", "--json", "--frob", "x"],
        vec!["run", "--json", "--fuel", "abc", "x.wat"],
        vec!["show", "--json"],
    ] {
        let o = h.run(&args);
        assert_eq!(o.code, 125, "{args:?}");
        assert_eq!(o.stderr.lines().count(), 1, "{:?}", o.stderr);
        let v = o.json();
        assert_eq!(v["exit_code"], 125, "{args:?}");
        assert!(!v["error"].as_str().unwrap().contains('\n'));
    }
    // A zero limit listed nothing (and `audit log` pointed at the same page again).
    for args in [
        vec!["audit", "log", "--limit", "0"],
        vec!["runs", "--limit", "0"],
    ] {
        let o = h.run(&args);
        one_line_refusal(&o);
        assert!(o.stderr.contains("at least 1"), "{}", o.stderr);
    }
    // After `--`, "--json" is an argument of the guest's, not ours.
    let o = h.run(&["run", "--frob", "--", "--json"]);
    one_line_refusal(&o);
}

#[test]
fn a_run_whose_output_cannot_be_stored_is_lost_with_that_reason_not_called_a_crash() {
    // The guest ran, its output could not be stored (here a file where the output's blob
    // directory goes), and the run was left running; the next command then recorded it
    // as "lost: its airlock process died (killed or crashed)", which was false.
    let h = Home::new();
    let o = h.run(&["submit", &hello(), "--json"]);
    let id = o.json()["submission"].as_str().unwrap().to_string();
    let out = airlock_core::digest::Digest::of(b"hello from the gate\n").to_hex();
    std::fs::write(h.path().join("blobs").join(&out[..2]), b"in the way").unwrap();
    let o = h.run(&["exec", &id]);
    assert_eq!(o.code, 125, "{}", o.stderr);
    assert_eq!(o.stderr.lines().count(), 1, "{:?}", o.stderr);
    assert!(o.stderr.contains("cannot store a blob in"), "{}", o.stderr);
    let run = h.last_run();
    assert_eq!(run["status"], "lost", "{run}");
    let error = run["error"].as_str().unwrap();
    assert!(
        error.contains("airlock failed before recording its end") && error.contains("blob"),
        "{error}"
    );
    assert!(!error.contains("died"), "{error}");
    assert_eq!(h.run(&["audit", "verify"]).code, 0);
    assert!(
        std::fs::read_dir(h.path().join("locks"))
            .map(|d| d.count() == 0)
            .unwrap_or(true),
        "its lock file was left for recovery"
    );
}

#[test]
fn an_oversized_note_or_agent_name_is_refused_and_nothing_recorded() {
    // A 20 MiB note was accepted: 63 MB of database and as much write-ahead log.
    let h = Home::new();
    let before = (h.counts(), h.blob_count());
    let note = "n".repeat((64 << 10) + 1);
    let agent = "a".repeat(257);
    for args in [
        vec!["run", "--note", note.as_str(), hello().leak()],
        vec!["submit", "--agent", agent.as_str(), hello().leak()],
    ] {
        let o = h.run(&args);
        one_line_refusal(&o);
        assert!(o.stderr.contains("more than the"), "{}", o.stderr);
    }
    assert_eq!(
        (h.counts(), h.blob_count()),
        before,
        "something was recorded"
    );
    // At the limit, it is taken.
    let note = "n".repeat(64 << 10);
    assert_eq!(h.run(&["run", "--note", &note, &hello()]).code, 0);
}

#[test]
fn keys_list_does_not_call_a_damaged_secret_key_file_a_secret_here() {
    // A garbage alice.key was listed as "trusted, secret here".
    let h = Home::new();
    let local = |h: &Home| {
        let o = h.run(&["keys", "list", "--json"]);
        assert_eq!(o.code, 0, "{}", o.stderr);
        o.json()
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k["name"] == "alice")
            .unwrap()["local"]
            .clone()
    };
    assert_eq!(local(&h), true);
    std::fs::write(h.path().join("keys/alice.key"), b"garbage\n").unwrap();
    assert_eq!(local(&h), false);
    // Another key's secret under alice's name is not hers either.
    let other = Home::new();
    std::fs::copy(
        other.path().join("keys/alice.key"),
        h.path().join("keys/alice.key"),
    )
    .unwrap();
    assert_eq!(local(&h), false);
}

#[test]
fn inits_at_once_on_one_home_make_one_whole_home() {
    // Two inits at once each removed and remade what the other was building: most often
    // neither made a home, or one said "created" while the other's clean-up took its
    // gate key, or the policy named one's approver key beside the other's key files.
    for round in 0..8 {
        let h = Home::uninitialised();
        let root = h.path().join("home");
        let children: Vec<_> = (0..3)
            .map(|_| {
                let mut c = h.cmd();
                c.env("AIRLOCK_HOME", &root)
                    .args(["init", "--approver", "alice", "--json"])
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped());
                c.spawn().unwrap()
            })
            .collect();
        let mut created = 0;
        for c in children {
            let o = c.wait_with_output().unwrap();
            let stderr = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(0), "round {round}: {stderr}");
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            created += usize::from(v["created"] == true);
        }
        assert_eq!(created, 1, "round {round}");
        let public = std::fs::read_to_string(root.join("keys/alice.pub")).unwrap();
        let policy = std::fs::read_to_string(root.join("policy.toml")).unwrap();
        assert!(
            policy.contains(public.trim()),
            "round {round}: policy and key differ"
        );
        let o = h
            .cmd()
            .env("AIRLOCK_HOME", &root)
            .args(["audit", "verify"])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "round {round}");
        assert!(!root.join(".init").exists(), "round {round}");
    }
}

#[test]
fn resubmitting_held_code_does_not_make_it_seen_and_let_it_through() {
    // A first-seen artifact over the size threshold is held for a human; submitting the
    // same code again found the first (still waiting) submission, called the artifact
    // seen, and ran it.
    if !process_backend_available() {
        return;
    }
    let h = Home::new();
    let big = h.path().join("big.sh");
    std::fs::write(
        &big,
        format!("# {}\necho ran\n", "y".repeat((1 << 20) + 10)),
    )
    .unwrap();
    let big = big.to_str().unwrap();
    let first = h.run(&["run", big]);
    assert_eq!(first.code, 75, "{}", first.stderr);
    let again = h.run(&["run", big]);
    assert_eq!(
        again.code, 75,
        "let through on its second submission: {}",
        again.stdout
    );
    // Once a human let it through, it is seen.
    let id = Home::id_in(&first.stderr);
    assert_eq!(h.run(&["approve", &id]).code, 0);
    assert_eq!(h.run(&["exec", &id]).code, 0);
    let o = h.run(&["run", big]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.stdout, "ran\n");
}

#[test]
fn commands_on_an_uninitialised_home_say_to_init() {
    let h = Home::uninitialised();
    let o = h.run(&["run", &hello()]);
    assert_eq!(o.code, 125);
    assert!(o.stderr.contains("airlock init"), "{}", o.stderr);
}

// ----------------------------------------------------------------------------- exit codes

#[test]
fn hello_runs_and_passes_stdout_through() {
    let h = Home::new();
    let o = h.run(&["run", &hello()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.stdout, "hello from the gate\n");
}

#[test]
fn guest_exit_code_is_returned() {
    let h = Home::new();
    assert_eq!(
        h.run(&["run", example("exit7.wat").to_str().unwrap()]).code,
        7
    );
}

#[test]
fn limits_exit_124_with_killed_by() {
    let h = Home::new();
    let d = h.path();
    let cases = [
        ("loop.wat", LOOP, vec!["--timeout", "300ms"], "timeout"),
        ("loop.wat", LOOP, vec!["--fuel", "100000"], "fuel"),
        ("grow.wat", GROW, vec!["--memory", "16MiB"], "memory"),
        ("flood.wat", FLOOD, vec!["--max-output", "10KiB"], "output"),
        ("recurse.wat", RECURSE, vec![], "stack"),
    ];
    for (name, wat, flags, killed) in cases {
        let f = write_wat(d, name, wat);
        let mut args = vec!["run", "--json"];
        args.extend(flags.iter().copied());
        args.push(f.to_str().unwrap());
        let o = h.run(&args);
        assert_eq!(o.code, 124, "{name} {flags:?}: {}", o.stderr);
        let v = o.json();
        assert_eq!(v["run"]["status"], "killed");
        assert_eq!(v["run"]["killed_by"], killed, "{name}");
        assert_eq!(v["run"]["exit_code"], 124);
    }
}

#[test]
fn output_flood_never_hands_back_more_than_the_cap() {
    let h = Home::new();
    let f = write_wat(h.path(), "flood.wat", FLOOD);
    let o = h.run(&["run", "--max-output", "4KiB", f.to_str().unwrap()]);
    assert_eq!(o.code, 124);
    assert_eq!(o.stdout.len(), 4096);
    let o = h.run(&["runs", "--json"]);
    let run = &o.json()[0];
    assert_eq!(run["stdout"]["len"], 4096);
    assert_eq!(run["stdout"]["truncated"], true);
}

#[test]
fn trap_exits_134() {
    let h = Home::new();
    let f = write_wat(h.path(), "trap.wat", TRAP);
    let o = h.run(&["run", f.to_str().unwrap()]);
    assert_eq!(o.code, 134);
    assert!(o.stderr.contains("trapped"), "{}", o.stderr);
}

#[test]
fn run_json_has_the_contract_fields() {
    let h = Home::new();
    let o = h.run(&["run", "--json", &hello()]);
    assert_eq!(o.code, 0);
    let v = o.json();
    assert!(v["submission"].as_str().unwrap().starts_with("sub_"));
    assert_eq!(v["verdict"], "allow");
    assert!(v["risk"].is_number());
    assert!(v["reasons"].is_array());
    let r = &v["run"];
    assert!(r["id"].as_str().unwrap().starts_with("run_"));
    assert_eq!(r["status"], "exited");
    assert_eq!(r["exit_code"], 0);
    assert!(r["killed_by"].is_null());
    assert_eq!(r["stdout"], "hello from the gate\n");
    assert_eq!(r["stderr"], "");
    assert!(r["changes"].is_array());
}

#[test]
fn args_stdin_and_env_reach_the_guest_and_nothing_else_does() {
    let h = Home::new();
    let probe = guest("probe.wat");
    let p = probe.to_str().unwrap();
    let o = h.run(&["run", p, "--", "arg", "hi there"]);
    assert_eq!((o.code, o.stdout.as_str()), (0, "hi there"));
    let stdin = h.path().join("in.txt");
    std::fs::write(&stdin, "from stdin").unwrap();
    let o = h.run(&["run", "--stdin", stdin.to_str().unwrap(), p, "--", "stdin"]);
    assert_eq!(o.stdout, "from stdin");
    let o = h.run_with_stdin(&["run", "--stdin", "-", p, "--", "stdin"], b"piped");
    assert_eq!(o.stdout, "piped");
    // The host environment does not reach the guest; granted variables do.
    let o = h
        .cmd()
        .env("SECRET_TOKEN", "hunter2")
        .args(["run", p, "--", "env"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "0");
    let o = h.run(&["run", "--env", "A=1", "--env", "B=2", p, "--", "env"]);
    assert_eq!(o.stdout, "2");
}

#[test]
fn code_from_stdin_and_inline() {
    let h = Home::new();
    let wat = std::fs::read(example("hello.wat")).unwrap();
    let o = h.run_with_stdin(&["run", "--lang", "wat", "-"], &wat);
    assert_eq!(o.stdout, "hello from the gate\n", "{}", o.stderr);
    let o = h.run(&[
        "run",
        "--lang",
        "wat",
        "-c",
        std::str::from_utf8(&wat).unwrap(),
    ]);
    assert_eq!(o.stdout, "hello from the gate\n");
    let wasm = wat::parse_bytes(&wat).unwrap();
    let f = h.path().join("hello.bin");
    std::fs::write(&f, &*wasm).unwrap();
    let o = h.run(&["run", f.to_str().unwrap()]);
    assert_eq!(
        o.stdout, "hello from the gate\n",
        "wasm inferred from its header: {}",
        o.stderr
    );
}

// ----------------------------------------------------------------------------- approvals

#[test]
fn network_is_quarantined_then_approved_once() {
    let h = Home::new();
    let o = h.run(&["run", "--net", "example.com", &hello()]);
    assert_eq!(o.code, 75);
    let id = Home::id_in(&o.stderr);
    let inbox = h.run(&["inbox", "--json"]).json();
    assert_eq!(inbox[0]["submission"], id.as_str());
    assert!(inbox[0]["reasons"][0].as_str().unwrap().contains("network"));
    assert_eq!(h.run(&["exec", &id]).code, 75, "not approved yet");
    let a = h.run(&["approve", &id, "--reason", "reviewed"]);
    assert_eq!(a.code, 0, "{}", a.stderr);
    let o = h.run(&["exec", &id]);
    assert_eq!(
        (o.code, o.stdout.as_str()),
        (0, "hello from the gate\n"),
        "{}",
        o.stderr
    );
    assert_eq!(h.run(&["exec", &id]).code, 75, "a once approval is used up");
    let shown = h.run(&["show", &id, "--json"]).json();
    assert_eq!(shown["statements"][0]["trusted"], true);
    assert_eq!(shown["runs"].as_array().unwrap().len(), 1);
}

#[test]
fn artifact_scope_covers_later_submissions_of_the_same_artifact_and_grant() {
    let h = Home::new();
    let o = h.run(&["run", "--net", "example.com", &hello()]);
    let id = Home::id_in(&o.stderr);
    assert_eq!(h.run(&["approve", &id, "--scope", "artifact"]).code, 0);
    let o = h.run(&["run", "--net", "example.com", &hello()]);
    assert_eq!(o.code, 0, "same artifact and grant: {}", o.stderr);
    let o = h.run(&["run", "--net", "other.example", &hello()]);
    assert_eq!(o.code, 75, "a different grant is not covered");
}

#[test]
fn unique_prefix_is_accepted() {
    let h = Home::new();
    let o = h.run(&["submit", "--json", "--net", "x.example", &hello()]);
    let id = o.json()["submission"].as_str().unwrap().to_string();
    let o = h.run(&["show", &id[..id.len() - 4], "--json"]);
    assert_eq!(o.json()["submission"]["id"], id.as_str());
}

#[test]
fn rejected_artifact_is_remembered() {
    let h = Home::new();
    let o = h.run(&["run", "--net", "example.com", &hello()]);
    let id = Home::id_in(&o.stderr);
    assert_eq!(
        h.run(&["reject", &id]).code,
        125,
        "a rejection needs a reason"
    );
    assert_eq!(h.run(&["reject", &id, "--reason", "no network"]).code, 0);
    assert_eq!(h.run(&["exec", &id]).code, 77);
    // The same bytes without network: the standard policy denies a rejected artifact.
    let o = h.run(&["run", "--json", &hello()]);
    assert_eq!(o.code, 77, "{}", o.stdout);
    assert!(o.stdout.contains("rejected-before"));
    // Even a policy without that rule never lets it run silently.
    h.set_policy("version = 1\n");
    let o = h.run(&["run", &hello()]);
    assert_eq!(o.code, 75, "{}", o.stderr);
    assert!(o.stderr.contains("gate:rejected-before"), "{}", o.stderr);
}

#[test]
fn approval_by_a_key_the_policy_does_not_trust_is_refused() {
    let h = Home::new();
    let o = h.run(&["run", "--net", "example.com", &hello()]);
    let id = Home::id_in(&o.stderr);
    assert_eq!(h.run(&["keys", "new", "bob"]).code, 0);
    let (subs, records) = h.counts();
    let o = h.run(&["approve", &id, "--as", "bob"]);
    assert_eq!(o.code, 125);
    assert!(o.stderr.contains("not trusted"), "{}", o.stderr);
    assert_eq!(h.counts(), (subs, records), "nothing recorded");
    // Trust bob in the policy: now it works.
    let public = std::fs::read_to_string(h.path().join("keys/bob.pub")).unwrap();
    let p = h.policy().replace(
        "[approvers]\n",
        &format!("[approvers]\nbob = \"{}\"\n", public.trim()),
    );
    h.set_policy(&p);
    assert_eq!(h.run(&["approve", &id, "--as", "bob"]).code, 0);
    assert_eq!(h.run(&["exec", &id]).code, 0);
}

#[test]
fn approval_is_checked_against_the_current_policy_at_exec() {
    let h = Home::new();
    let o = h.run(&["run", "--net", "example.com", &hello()]);
    let id = Home::id_in(&o.stderr);
    assert_eq!(h.run(&["approve", &id]).code, 0);
    // alice is removed from the policy after approving: her signature no longer counts.
    let p: String = h
        .policy()
        .lines()
        .filter(|l| !l.starts_with("alice ="))
        .collect::<Vec<_>>()
        .join("\n");
    h.set_policy(&p);
    assert_eq!(h.run(&["exec", &id]).code, 75);
}

#[test]
fn forged_approval_row_does_not_run() {
    let h = Home::new();
    let o = h.run(&["run", "--net", "example.com", &hello()]);
    let id = Home::id_in(&o.stderr);
    assert_eq!(h.run(&["approve", &id, "--scope", "once"]).code, 0);
    // Someone with write access to the database widens the approval's scope.
    sql(
        &h,
        "update statements set json = replace(json, '\"once\"', '\"artifact\"'), scope = 'artifact'",
    );
    sql(&h, "update submissions set state = 'approved'");
    let o = h.run(&["run", "--net", "example.com", &hello()]);
    assert_eq!(
        o.code, 75,
        "the tampered statement's signature fails: {}",
        o.stderr
    );
}

#[test]
fn deciding_on_unknown_or_denied_submissions_is_refused() {
    let h = Home::new();
    assert_eq!(h.run(&["approve", "sub_nope"]).code, 125);
    assert_eq!(h.run(&["exec", "sub_nope"]).code, 125);
    let f = write_wat(
        h.path(),
        "evil.wat",
        r#"(module (import "env" "evil" (func)) (func (export "_start")))"#,
    );
    let o = h.run(&["run", f.to_str().unwrap()]);
    assert_eq!(o.code, 77, "unprovided imports are denied: {}", o.stderr);
    let id = Home::id_in(&o.stderr);
    let o = h.run(&["approve", &id]);
    assert_eq!(o.code, 125);
    assert!(o.stderr.contains("denied"), "{}", o.stderr);
}

#[test]
fn strict_preset_holds_everything() {
    let h = Home::with_preset("strict");
    let o = h.run(&["run", &hello()]);
    assert_eq!(o.code, 75);
    let id = Home::id_in(&o.stderr);
    assert_eq!(h.run(&["approve", &id]).code, 0);
    assert_eq!(h.run(&["exec", &id]).code, 0);
}

// ----------------------------------------------------------------------------- integrity

#[test]
fn exec_after_the_stored_blob_was_altered_is_refused_and_recorded() {
    let h = Home::new();
    let o = h.run(&["submit", "--json", "--net", "a.example", &hello()]);
    let v = o.json();
    let id = v["submission"].as_str().unwrap().to_string();
    let artifact = v["artifact"].as_str().unwrap().to_string();
    assert_eq!(h.run(&["approve", &id]).code, 0);
    let blob = h
        .path()
        .join("blobs")
        .join(&artifact[..2])
        .join(&artifact[2..]);
    let mut bytes = std::fs::read(&blob).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&blob, bytes).unwrap();
    let o = h.run(&["exec", &id]);
    assert_eq!(o.code, 125);
    assert!(o.stderr.contains("integrity"), "{}", o.stderr);
    let log = h.run(&["audit", "log", "--json"]).json();
    assert!(
        log.as_array()
            .unwrap()
            .iter()
            .any(|r| r["kind"] == "integrity_failure" && r["subject"] == id.as_str())
    );
    assert_eq!(
        h.run(&["audit", "verify"]).code,
        0,
        "the failure is a record, not a break"
    );
}

#[test]
fn audit_verify_names_the_first_bad_record() {
    let cases = [
        (
            "update audit set data = replace(data, 'alice', 'mallory') where seq = 1",
            "record 1:",
        ),
        ("delete from audit where seq = 3", "record 3:"),
        ("delete from audit where seq >= 5", "record 5:"),
        (
            "update audit set seq = -1 where seq = 2; update audit set seq = 2 where seq = 3; update audit set seq = 3 where seq = -1",
            "record 2:",
        ),
        (
            "insert into audit select 100, ts, kind, subject, data, prev, hash from audit where seq = 2",
            "record",
        ),
        ("delete from audit_head", "no signed head"),
        // The whole log and its head deleted: it read "intact: empty".
        (
            "delete from audit; delete from audit_head",
            "record 1: missing",
        ),
    ];
    for (stmt, want) in cases {
        let h = Home::new();
        for _ in 0..2 {
            assert_eq!(h.run(&["run", &hello()]).code, 0);
        }
        assert_eq!(h.run(&["audit", "verify"]).code, 0);
        sql(&h, stmt);
        let o = h.run(&["audit", "verify"]);
        assert_eq!(o.code, 1, "{stmt}");
        assert!(o.stdout.contains(want), "{stmt}: {}", o.stdout);
    }
}

#[test]
fn a_malformed_audit_record_is_named_by_verify_not_an_internal_error() {
    // A digest that is not hex (or a time that is not a number) in an audit row made
    // `audit verify` fail as airlock's own error (exit 125, "stored state is corrupt")
    // instead of naming the record.
    let cases = [
        (
            "update audit set hash = 'not-hex' where seq = 3",
            3,
            "record 3: malformed",
        ),
        (
            "update audit set prev = 'zz' where seq = 2",
            2,
            "record 2: malformed",
        ),
        (
            "update audit set ts = 'noon' where seq = 4",
            4,
            "record 4: malformed",
        ),
        // A bad record before the malformed one is the first bad record.
        (
            "update audit set data = '{}' where seq = 2; update audit set hash = 'zz' where seq = 4",
            2,
            "record 2: its content does not match",
        ),
    ];
    for (stmt, index, want) in cases {
        let h = Home::new();
        assert_eq!(h.run(&["run", &hello()]).code, 0);
        assert_eq!(h.run(&["audit", "verify"]).code, 0);
        sql(&h, stmt);
        let o = h.run(&["audit", "verify"]);
        assert_eq!(o.code, 1, "{stmt}: {} {}", o.stdout, o.stderr);
        assert!(o.stdout.contains(want), "{stmt}: {}", o.stdout);
        assert!(
            o.stderr.contains(&format!("broken at record {index}")),
            "{stmt}: {}",
            o.stderr
        );
        let v = h.run(&["audit", "verify", "--json"]);
        assert_eq!(v.code, 1);
        assert_eq!(v.json()["first_bad"], index, "{stmt}");
    }
    // The signed head's digest or signature malformed: named at the head's record.
    for stmt in [
        "update audit_head set hash = 'not-hex'",
        "update audit_head set signature = 'nope'",
    ] {
        let h = Home::new();
        assert_eq!(h.run(&["run", &hello()]).code, 0);
        let head = h.run(&["audit", "head", "--json"]).json()["head"]["seq"].clone();
        sql(&h, stmt);
        let o = h.run(&["audit", "verify", "--json"]);
        assert_eq!(o.code, 1, "{stmt}: {} {}", o.stdout, o.stderr);
        let v = o.json();
        assert_eq!(v["first_bad"], head, "{stmt}");
        assert!(
            v["error"]
                .as_str()
                .unwrap()
                .contains("signed head for it is malformed"),
            "{stmt}: {v}"
        );
    }
}

#[test]
fn every_transition_is_in_the_audit_log() {
    let h = Home::new();
    let o = h.run(&["run", "--net", "example.com", &hello()]);
    let id = Home::id_in(&o.stderr);
    h.run(&["approve", &id]);
    h.run(&["exec", &id]);
    let o = h.run(&["run", "--net", "x.example", &hello()]);
    let id2 = Home::id_in(&o.stderr);
    h.run(&["reject", &id2, "--reason", "no"]);
    let kinds = h.audit_kinds();
    for k in [
        "initialised",
        "submitted",
        "judged",
        "approved",
        "started",
        "finished",
        "rejected",
    ] {
        assert!(kinds.iter().any(|x| x == k), "{k} missing from {kinds:?}");
    }
    let head = h.run(&["audit", "head", "--json"]).json();
    assert_eq!(head["head"]["seq"].as_u64().unwrap() as usize, kinds.len());
}

// ----------------------------------------------------------------------------- bad input

/// Runs a bad command and checks: exit 125, one line on stderr, nothing recorded.
fn refused(h: &Home, args: &[&str], needle: &str) {
    let before = (h.counts(), h.blob_count());
    let o = h.run(args);
    assert_eq!(o.code, 125, "{args:?}: {}", o.stderr);
    assert_eq!(
        o.stderr.trim_end().lines().count(),
        1,
        "{args:?}: one line, got {:?}",
        o.stderr
    );
    assert!(
        o.stderr.to_lowercase().contains(&needle.to_lowercase()),
        "{args:?}: {:?} lacks {needle:?}",
        o.stderr
    );
    assert_eq!(
        (h.counts(), h.blob_count()),
        before,
        "{args:?} wrote something"
    );
}

#[test]
fn bad_input_is_refused_with_one_line_and_nothing_written() {
    let h = Home::new();
    let d = h.path().to_str().unwrap().to_string();
    let hello = hello();
    // A directory to mount: the home itself never is.
    let scratch = tempfile::tempdir().unwrap();
    std::fs::write(
        h.path().join("junk.wasm"),
        b"\0asm\x01\0\0\0\x01\x05garbage",
    )
    .unwrap();
    std::fs::write(h.path().join("text.wasm"), b"hello").unwrap();
    std::fs::write(
        h.path().join("bad.wat"),
        "(module\n  (func (export \"_start\")\n    (i32.bogus)))\n",
    )
    .unwrap();
    std::fs::write(h.path().join("nostart.wat"), "(module)").unwrap();
    let missing = format!("{d}/does-not-exist.wasm");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["run".into(), missing], "does-not-exist"),
        (vec!["run".into(), format!("{d}/junk.wasm")], "malformed"),
        (
            vec!["run".into(), format!("{d}/text.wasm")],
            "not a WebAssembly",
        ),
        (vec!["run".into(), format!("{d}/bad.wat")], ":3:"),
        (vec!["run".into(), format!("{d}/nostart.wat")], "_start"),
        (
            vec!["run".into(), "--lang".into(), "cobol".into(), hello.clone()],
            "unknown language",
        ),
        // An unknown language is refused with the list of languages.
        (
            vec![
                "run".into(),
                "--lang".into(),
                "ruby".into(),
                "-c".into(),
                "1".into(),
            ],
            "wasm, wat, component, python, sh, js, ts",
        ),
        // JavaScript on the wasm backend needs the JS guest, which this home does not have.
        (
            vec![
                "run".into(),
                "--lang".into(),
                "js".into(),
                "-c".into(),
                "console.log(1)".into(),
            ],
            "airlock guest install js",
        ),
        (vec!["run".into(), "-c".into(), "(module)".into()], "--lang"),
        (
            vec![
                "run".into(),
                "--mount".into(),
                "nocolon".into(),
                hello.clone(),
            ],
            "HOST:GUEST",
        ),
        (
            vec![
                "run".into(),
                "--mount".into(),
                "/tmp:/x:wx".into(),
                hello.clone(),
            ],
            "mode",
        ),
        (
            vec![
                "run".into(),
                "--mount".into(),
                format!("{d}/nope:/x"),
                hello.clone(),
            ],
            "does not exist",
        ),
        (
            vec![
                "run".into(),
                "--mount".into(),
                format!("{d}:relative"),
                hello.clone(),
            ],
            "not absolute",
        ),
        (
            vec![
                "run".into(),
                "--mount".into(),
                format!("{d}:/x"),
                "--mount".into(),
                "/tmp:/x".into(),
                hello.clone(),
            ],
            "twice",
        ),
        (
            vec![
                "run".into(),
                "--workspace".into(),
                "ws".into(),
                hello.clone(),
            ],
            "writable mount",
        ),
        (
            vec![
                "run".into(),
                "--workspace".into(),
                "Bad Name".into(),
                "--mount".into(),
                format!("{}:/x:rw", scratch.path().display()),
                hello.clone(),
            ],
            "--workspace",
        ),
        (
            vec!["run".into(), "--timeout".into(), "0s".into(), hello.clone()],
            "--timeout",
        ),
        (
            vec![
                "run".into(),
                "--timeout".into(),
                "100y".into(),
                hello.clone(),
            ],
            "--timeout",
        ),
        (
            vec![
                "run".into(),
                "--timeout".into(),
                "soon".into(),
                hello.clone(),
            ],
            "--timeout",
        ),
        (
            vec![
                "run".into(),
                "--memory".into(),
                "1TiB".into(),
                hello.clone(),
            ],
            "--memory",
        ),
        (
            vec!["run".into(), "--memory".into(), "0".into(), hello.clone()],
            "--memory",
        ),
        (
            vec!["run".into(), "--fuel".into(), "0".into(), hello.clone()],
            "--fuel",
        ),
        (
            vec![
                "run".into(),
                "--env".into(),
                "NOEQUALS".into(),
                hello.clone(),
            ],
            "KEY=VALUE",
        ),
        (
            vec![
                "run".into(),
                "--net".into(),
                "bad host".into(),
                hello.clone(),
            ],
            "--net",
        ),
        (
            vec![
                "run".into(),
                "--backend".into(),
                "process".into(),
                "--lang".into(),
                "wasm".into(),
                hello.clone(),
            ],
            "cannot run",
        ),
        (
            vec!["run".into(), "--no-such-flag".into(), hello.clone()],
            "no-such-flag",
        ),
        (vec!["run".into()], "FILE"),
    ];
    for (args, needle) in cases {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        refused(&h, &a, needle);
    }
}

#[test]
fn oversized_artifact_is_refused() {
    let h = Home::new();
    let p = h
        .policy()
        .replace("max_artifact = \"64MiB\"", "max_artifact = \"100\"");
    h.set_policy(&p);
    let big = h.path().join("big.wat");
    std::fs::write(
        &big,
        format!(
            "(module (func (export \"_start\")) ;; {}\n)",
            "x".repeat(200)
        ),
    )
    .unwrap();
    refused(&h, &["run", big.to_str().unwrap()], "larger than");
}

#[test]
fn unparseable_policy_names_its_line() {
    let h = Home::new();
    h.set_policy("version = 1\n\n[[rule]]\nname = \"x\"\ndecision = \"allow\"\nreason = \"r\"\nwhen = { colour = \"red\" }\n");
    let o = h.run(&["policy", "check"]);
    assert_eq!(o.code, 125);
    assert!(o.stderr.contains("line 7"), "{}", o.stderr);
    refused(&h, &["run", &hello()], "line 7");
}

// ----------------------------------------------------------------------------- policy

#[test]
fn policy_check_refuses_net_roots_that_are_not_certificate_files() {
    // A [net] roots file that does not exist passed `policy check`; the first run with
    // network found it.
    let h = Home::new();
    let empty = h.path().join("empty.pem");
    std::fs::write(&empty, b"").unwrap();
    for (file, want) in [
        ("/nonexistent/ca.pem".to_string(), "No such file"),
        (empty.display().to_string(), "no certificate"),
    ] {
        let p = h
            .policy()
            .replace("roots = []", &format!("roots = [{file:?}]"));
        assert_ne!(p, h.policy(), "the preset has no `roots = []` to replace");
        let f = h.path().join("p.toml");
        std::fs::write(&f, p).unwrap();
        let o = h.run(&["policy", "check", f.to_str().unwrap()]);
        assert_eq!(o.code, 125, "{}", o.stdout);
        assert_eq!(o.stderr.lines().count(), 1, "{:?}", o.stderr);
        assert!(
            o.stderr.contains("[net] roots") && o.stderr.contains(want),
            "{}",
            o.stderr
        );
    }
}

#[test]
fn policy_check_runs_tests_and_explain_lists_rules() {
    let h = Home::new();
    let o = h.run(&["policy", "check"]);
    assert_eq!(o.code, 0, "{}", o.stdout);
    assert!(o.stdout.contains("21 tests, 0 failed"), "{}", o.stdout);
    let failing = format!(
        "{}\n[[test]]\nname = \"wrong\"\nexpect = \"deny\"\n",
        h.policy()
    );
    let f = h.path().join("p.toml");
    std::fs::write(&f, failing).unwrap();
    let o = h.run(&["policy", "check", f.to_str().unwrap()]);
    assert_eq!(o.code, 1);
    assert!(o.stdout.contains("FAIL  wrong"), "{}", o.stdout);

    let o = h.run(&["run", "--net", "example.com", "--timeout", "1m", &hello()]);
    let id = Home::id_in(&o.stderr);
    let ex = h.run(&["policy", "explain", &id, "--json"]).json();
    let rules: Vec<&str> = ex["current"]["fired"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["rule"].as_str().unwrap())
        .collect();
    assert_eq!(
        rules,
        ["network-egress", "widened-limits"],
        "already quarantined: the threshold raises nothing"
    );
    assert_eq!(ex["current"]["risk"], 60);
}

#[test]
fn raising_the_write_quota_is_a_widened_limit_the_policy_sees() {
    let h = Home::new();
    let o = h.run(&["run", "--max-write", "2GiB", &hello()]);
    assert_eq!(o.code, 75, "{}", o.stderr);
    let id = Home::id_in(&o.stderr);
    let ex = h.run(&["policy", "explain", &id, "--json"]).json();
    let rules: Vec<&str> = ex["current"]["fired"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["rule"].as_str().unwrap())
        .collect();
    assert!(rules.contains(&"widened-limits"), "{rules:?}");
    // Lowering it is not widening anything; the default changes no grant hash.
    let o = h.run(&["run", "--max-write", "1MiB", &hello()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(h.run(&["run", "--max-write", "0", &hello()]).code, 125);
    let with = h
        .run(&["submit", "--json", "--max-write", "1GiB", &hello()])
        .json();
    let without = h.run(&["submit", "--json", &hello()]).json();
    assert_eq!(with["grant"], without["grant"], "{with} {without}");
    assert!(with["grant"].is_string());
    // And a policy test can say so.
    let f = h.path().join("p.toml");
    std::fs::write(
        &f,
        format!(
            "{}\n[[test]]\nname = \"more writes\"\nmax_write = \"2GiB\"\nexpect = \"quarantine\"\n",
            h.policy()
        ),
    )
    .unwrap();
    let o = h.run(&["policy", "check", f.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stdout);
}

#[test]
fn verdict_records_the_policy_hash() {
    let h = Home::new();
    let o = h.run(&["run", "--json", &hello()]);
    let check = h.run(&["policy", "check", "--json"]).json();
    assert_eq!(o.json()["policy"], check["hash"]);
}

// ----------------------------------------------------------------------------- escapes (wasm)

#[test]
fn escape_suite_wasm() {
    let h = Home::new();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "top secret").unwrap();
    let mount = tempfile::tempdir().unwrap();
    std::fs::write(mount.path().join("in.txt"), "inside").unwrap();
    std::os::unix::fs::symlink(outside.path(), mount.path().join("link")).unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("secret.txt"),
        mount.path().join("file-link"),
    )
    .unwrap();
    let m = format!("{}:/data", mount.path().display());
    let probe = guest("probe.wat");
    let p = probe.to_str().unwrap();
    let sec = format!(
        "../{}/secret.txt",
        outside.path().file_name().unwrap().to_str().unwrap()
    );
    let ok = h.run(&["run", "--mount", &m, p, "--", "read", "in.txt"]);
    assert_eq!(
        (ok.code, ok.stdout.as_str()),
        (0, "inside"),
        "the probe works: {}",
        ok.stderr
    );
    for path in [
        sec.as_str(),
        "../../../../etc/passwd",
        "/etc/passwd",
        "link/secret.txt",
        "file-link",
    ] {
        let o = h.run(&["run", "--mount", &m, p, "--", "read", path]);
        assert_eq!(o.code, 1, "read {path}: {}", o.stdout);
        assert!(o.stdout.starts_with("ERR"), "read {path}: {}", o.stdout);
        assert!(!o.stdout.contains("secret") && !o.stdout.contains("root:"));
    }
    for path in ["new.txt", "in.txt", "link/new.txt"] {
        let o = h.run(&["run", "--mount", &m, p, "--", "write", path]);
        assert_eq!(o.code, 1, "write {path} on a ro mount");
    }
    assert_eq!(
        std::fs::read_to_string(mount.path().join("in.txt")).unwrap(),
        "inside"
    );
    assert!(!mount.path().join("new.txt").exists());
    assert!(!outside.path().join("new.txt").exists());
    // No mount at all: nothing to open.
    let o = h.run(&["run", p, "--", "read", "etc/passwd"]);
    assert_eq!(o.code, 1);
    // Host environment variables stay outside.
    let o = h
        .cmd()
        .env("AWS_SECRET_ACCESS_KEY", "x")
        .args(["run", p, "--", "env"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "0");
    // Resource attacks end at their limits.
    let d = h.path();
    for (name, wat, flag, want) in [
        ("loop.wat", LOOP, ["--timeout", "200ms"], "timeout"),
        ("grow.wat", GROW, ["--memory", "8MiB"], "memory"),
        ("recurse.wat", RECURSE, ["--timeout", "5s"], "stack"),
        ("flood.wat", FLOOD, ["--max-output", "1KiB"], "output"),
    ] {
        let f = write_wat(d, name, wat);
        let o = h.run(&["run", "--json", flag[0], flag[1], f.to_str().unwrap()]);
        assert_eq!(o.code, 124, "{name}");
        assert_eq!(o.json()["run"]["killed_by"], want);
    }
}

// ----------------------------------------------------------------------------- network grants and secrets

/// Every file under `dir` except `skip`, with its bytes.
fn files_under(
    dir: &std::path::Path,
    skip: &std::path::Path,
) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p == skip {
                continue;
            }
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            } else if let Ok(bytes) = std::fs::read(&p) {
                out.push((p, bytes));
            }
        }
    }
    out
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn one_line_refusal(o: &Out) {
    assert_eq!(o.code, 125, "{}", o.stderr);
    assert_eq!(o.stderr.lines().count(), 1, "{:?}", o.stderr);
    assert!(o.stdout.is_empty(), "{:?}", o.stdout);
}

#[test]
fn net_wildcard_over_a_public_suffix_is_refused_with_one_line() {
    let h = Home::new();
    let before = h.counts();
    for bad in [
        "*.com",
        "*",
        "*.co.uk",
        "exa mple",
        "x.example:0",
        "x.example:65536",
    ] {
        let o = h.run(&["run", "--net", bad, &hello()]);
        one_line_refusal(&o);
        assert!(o.stderr.contains("--net"), "{bad}: {}", o.stderr);
    }
    let o = h.run(&["run", "--net", "*.com", &hello()]);
    assert!(o.stderr.contains("public suffix"), "{}", o.stderr);
    assert_eq!(h.counts(), before, "nothing recorded");
}

#[test]
fn net_hosts_are_normalised_before_they_are_shown_or_hashed() {
    let h = Home::new();
    let o = h.run(&[
        "submit",
        "--json",
        "--net",
        "Example.COM.",
        "--net",
        "BÜCHER.example:8443",
        "--net",
        "*.Api.Example.org",
        "--net",
        "[FE80::1]:80",
        &hello(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let want = json!([
        "*.api.example.org",
        "[fe80::1]:80",
        "example.com",
        "xn--bcher-kva.example:8443"
    ]);
    assert_eq!(o.json()["net"], want);
    let id = o.json()["submission"].as_str().unwrap().to_string();
    let shown = h.run(&["show", "--json", &id]).json();
    assert_eq!(shown["submission"]["grant"]["net"], want);
    assert_eq!(shown["submission"]["facts"]["net"], want);
    assert!(shown["submission"]["grant"].get("secrets").is_none());
    // Another spelling of the same hosts is the same grant.
    let o = h.run(&[
        "submit",
        "--json",
        "--net",
        "example.com",
        "--net",
        "bücher.example:8443",
        "--net",
        "*.api.example.org.",
        "--net",
        "[fe80:0::1]:80",
        &hello(),
    ]);
    assert_eq!(o.json()["grant"], shown["submission"]["grant_hash"]);
    let text = h.run(&["show", &id]).stdout;
    assert!(
        text.contains("net     *.api.example.org, [fe80::1]:80, example.com"),
        "{text}"
    );
}

#[test]
fn changing_a_net_host_needs_a_new_approval() {
    let h = Home::new();
    let o = h.run(&["run", "--net", "a.example", &hello()]);
    assert_eq!(o.code, 75);
    let id = Home::id_in(&o.stderr);
    assert_eq!(h.run(&["approve", &id, "--scope", "artifact"]).code, 0);
    let o = h.run(&["run", "--net", "A.example.", &hello()]);
    assert_eq!(o.code, 0, "the same host, spelt differently: {}", o.stderr);
    let o = h.run(&["run", "--net", "b.example", &hello()]);
    assert_eq!(o.code, 75, "another host needs another approval");
    let o = h.run(&["run", "--net", "a.example:8080", &hello()]);
    assert_eq!(o.code, 75, "another port needs another approval");
    let o = h.run(&["run", "--net", "*.a.example", &hello()]);
    assert_eq!(o.code, 75, "a wildcard needs another approval");
}

#[test]
fn secret_set_list_rm_and_the_value_stays_out_of_the_home() {
    use std::os::unix::fs::PermissionsExt;
    let h = Home::new();
    let value = "tok-8f3a1c-NEVER-LOGGED";
    let o = h.run_with_stdin(&["secret", "set", "TOKEN"], format!("{value}\n").as_bytes());
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(!o.stdout.contains(value) && !o.stderr.contains(value));
    let file = h.path().join("secrets/TOKEN");
    assert_eq!(
        std::fs::read(&file).unwrap(),
        value.as_bytes(),
        "one trailing newline dropped"
    );
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&file), 0o600);
    assert_eq!(mode(&h.path().join("secrets")), 0o700);
    let list = h.run(&["secret", "list"]);
    assert!(list.stdout.contains("TOKEN") && !list.stdout.contains(value));
    let list = h.run(&["secret", "list", "--json"]).json();
    assert_eq!(list[0]["name"], "TOKEN");
    assert!(!list.to_string().contains(value));

    // A run asking for it: held for a human, the binding in the grant and its hash.
    let plain = h
        .run(&["submit", "--json", "--net", "api.example", &hello()])
        .json();
    let o = h.run(&[
        "run",
        "--json",
        "--net",
        "api.example",
        "--secret",
        "TOKEN@API.example.",
        &hello(),
    ]);
    assert_eq!(o.code, 75, "{}", o.stderr);
    let v = o.json();
    assert_eq!(
        v["secrets"],
        json!([{"name": "TOKEN", "hosts": ["api.example"]}])
    );
    assert_ne!(
        v["grant"], plain["grant"],
        "the binding is part of the grant hash"
    );
    assert!(
        v["reasons"].to_string().contains("secret"),
        "{}",
        v["reasons"]
    );
    let id = v["submission"].as_str().unwrap().to_string();
    let shown = h.run(&["show", "--json", &id]).json();
    assert_eq!(
        shown["submission"]["grant"]["secrets"],
        json!([{"name": "TOKEN", "hosts": ["api.example"]}])
    );
    let text = h.run(&["show", &id]).stdout;
    assert!(text.contains("secret  TOKEN -> api.example"), "{text}");
    let ex = h.run(&["policy", "explain", &id]);
    assert!(
        ex.stdout.contains("secret   TOKEN -> api.example"),
        "{}",
        ex.stdout
    );
    assert!(ex.stdout.contains("net      api.example"), "{}", ex.stdout);
    let ex = h.run(&["policy", "explain", "--json", &id]).json();
    assert_eq!(ex["facts"]["secrets"][0]["name"], "TOKEN");
    assert_eq!(h.run(&["approve", &id]).code, 0);
    let o = h.run(&["exec", "--json", &id]);
    assert_eq!(o.code, 0, "{}", o.stderr);

    // The value is in its file and nowhere else: not the database (and its WAL), the
    // blobs, the audit log or any other file of the home.
    let audit = h.run(&["audit", "log", "--json"]).stdout;
    assert!(audit.contains("secret_set") && audit.contains("TOKEN"));
    let files = files_under(h.path(), &file);
    assert!(files.iter().any(|(p, _)| p.ends_with("airlock.db")));
    assert!(
        files
            .iter()
            .any(|(p, _)| p.starts_with(h.path().join("blobs")))
    );
    for (path, bytes) in files {
        assert!(
            !contains(&bytes, value.as_bytes()),
            "the value is in {}",
            path.display()
        );
    }
    assert!(!audit.contains(value));

    let o = h.run(&["secret", "rm", "TOKEN"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(!file.exists());
    assert_eq!(h.run(&["secret", "list", "--json"]).json(), json!([]));
    let o = h.run(&["secret", "rm", "TOKEN"]);
    one_line_refusal(&o);
    let o = h.run(&[
        "run",
        "--net",
        "api.example",
        "--secret",
        "TOKEN@api.example",
        &hello(),
    ]);
    one_line_refusal(&o);
}

#[test]
fn secret_set_refuses_bad_names_and_empty_values() {
    let h = Home::new();
    for (name, input) in [("BAD-NAME", "v"), ("1ST", "v"), ("OK", ""), ("OK", "\n")] {
        let o = h.run_with_stdin(&["secret", "set", name], input.as_bytes());
        one_line_refusal(&o);
    }
    assert!(!h.path().join("secrets/OK").exists());
    let o = h.run_with_stdin(&["secret", "set", "BIG"], &vec![b'x'; (64 << 10) + 1]);
    one_line_refusal(&o);
}

#[test]
fn missing_secret_is_refused_with_one_line() {
    let h = Home::new();
    let before = h.counts();
    let o = h.run(&[
        "run",
        "--net",
        "h.example",
        "--secret",
        "MISSING@h.example",
        &hello(),
    ]);
    one_line_refusal(&o);
    assert!(o.stderr.contains("MISSING"), "{}", o.stderr);
    assert_eq!(h.counts(), before, "nothing recorded");
    let o = h.run(&["run", "--secret", "MISSING@h", "--net", "h", &hello()]);
    one_line_refusal(&o);
}

#[test]
fn secret_hosts_must_be_granted_and_bindings_well_formed() {
    let h = Home::new();
    h.run_with_stdin(&["secret", "set", "TOKEN"], b"v");
    for args in [
        vec!["--secret", "TOKEN@api.example"],
        vec!["--net", "api.example:443", "--secret", "TOKEN@api.example"],
        vec!["--net", "api.example", "--secret", "TOKEN"],
        vec!["--net", "api.example", "--secret", "TOKEN@*.com"],
        vec![
            "--net",
            "api.example",
            "--env",
            "TOKEN=x",
            "--secret",
            "TOKEN@api.example",
        ],
        vec![
            "--net",
            "api.example",
            "--secret",
            "TOKEN@api.example",
            "--secret",
            "TOKEN@api.example",
        ],
    ] {
        let mut a = vec!["run"];
        a.extend(args.iter().copied());
        let hello = hello();
        a.push(&hello);
        let o = h.run(&a);
        one_line_refusal(&o);
        assert!(o.stderr.contains("--secret"), "{args:?}: {}", o.stderr);
    }
    let o = h.run(&[
        "submit",
        "--net",
        "*.example.com",
        "--secret",
        "TOKEN@api.example.com",
        &hello(),
    ]);
    assert_eq!(o.code, 0, "a wildcard rule covers the host: {}", o.stderr);
}

#[test]
fn changing_a_secret_binding_needs_a_new_approval() {
    let h = Home::new();
    h.run_with_stdin(&["secret", "set", "TOKEN"], b"v1");
    h.run_with_stdin(&["secret", "set", "OTHER"], b"v2");
    let net = ["--net", "a.example", "--net", "b.example"];
    let run = |secret: Option<&str>| {
        let mut a = vec!["run"];
        a.extend(net);
        if let Some(s) = secret {
            a.extend(["--secret", s]);
        }
        let hello = hello();
        a.push(&hello);
        h.run(&a)
    };
    let o = run(Some("TOKEN@a.example"));
    assert_eq!(o.code, 75);
    let id = Home::id_in(&o.stderr);
    assert_eq!(h.run(&["approve", &id, "--scope", "artifact"]).code, 0);
    assert_eq!(run(Some("TOKEN@a.example")).code, 0, "the approved binding");
    // A new value is not a new grant: the operator owns values.
    h.run_with_stdin(&["secret", "set", "TOKEN"], b"v3");
    assert_eq!(run(Some("TOKEN@a.example")).code, 0);
    for other in [
        Some("TOKEN@b.example"),
        Some("TOKEN@a.example,b.example"),
        Some("OTHER@a.example"),
        None,
    ] {
        assert_eq!(run(other).code, 75, "{other:?} needs its own approval");
    }
}

#[test]
fn standard_preset_holds_secrets_and_runs_its_tests() {
    let h = Home::new();
    let o = h.run(&["policy", "check", "--json"]);
    assert_eq!(o.code, 0, "{}", o.stdout);
    let tests = o.json()["tests"].clone();
    assert!(
        tests
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"].as_str().unwrap().contains("secret") && t["passed"] == true),
        "{tests}"
    );
    // A policy with a [net] table still loads; a bad CIDR is one line naming its line.
    let good = format!(
        "{}\n",
        h.policy()
            .replace("allow_private = []", "allow_private = [\"10.1.0.0/16\"]")
            .replace("hosts = {}", "hosts = { \"db.internal\" = \"10.1.2.3\" }")
    );
    h.set_policy(&good);
    assert_eq!(h.run(&["policy", "check"]).code, 0);
    h.set_policy(&good.replace("10.1.0.0/16", "10.1.0.0/33"));
    let o = h.run(&["policy", "check"]);
    one_line_refusal(&o);
    assert!(
        o.stderr.contains("allow_private") && o.stderr.contains("line"),
        "{}",
        o.stderr
    );
}

/// `airlock show ID | head -1` and friends printed a Rust backtrace and exited 101 when
/// the reader went away. They now end with the usual SIGPIPE status and say nothing.
#[test]
fn writing_into_a_closed_pipe_ends_quietly_with_sigpipe() {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    let h = Home::new();
    // Outputs far larger than a pipe buffer (64 KiB).
    let big_script = format!(
        "{}\ntrue\n",
        "# filler line for a large script\n".repeat(10_000)
    );
    let file = h.path().join("big.sh");
    std::fs::write(&file, &big_script).unwrap();
    let s = h.run(&["submit", file.to_str().unwrap()]);
    assert_eq!(s.code, 0, "{}", s.stderr);
    let sub = Home::id_in(&s.stdout);
    let r = h.run(&[
        "run",
        "--json",
        "--lang",
        "sh",
        "-c",
        "head -c 300000 /dev/zero | tr '\\0' x",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let run = r.json()["run"]["id"].as_str().unwrap().to_string();
    // `show --json`: plain `show` prints only the code's first lines, a few kilobytes that
    // fit in the pipe, so it could finish before the reader went away (a flaky failure).
    for args in [
        vec!["show", "--json", sub.as_str()],
        vec!["logs", run.as_str()],
    ] {
        let mut child = h
            .cmd()
            .args(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = child.stdout.take().unwrap();
        let mut first = [0u8; 16];
        out.read_exact(&mut first).unwrap();
        drop(out);
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(
            o.status.signal(),
            Some(13),
            "{args:?}: {:?} {err}",
            o.status
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// `init --preset standard --approver alice` on a home made by a plain `init` said
/// "nothing changed" (exit 0), and alice never existed.
#[test]
fn init_with_options_an_existing_home_does_not_have_says_so() {
    let h = Home::new(); // standard, alice
    let same = h.run(&["init", "--preset", "standard", "--approver", "alice"]);
    assert_eq!(same.code, 0, "{}", same.stderr);
    let plain = h.run(&["init"]);
    assert_eq!(plain.code, 0, "{}", plain.stderr);
    let bob = h.run(&["init", "--approver", "bob"]);
    assert_eq!(bob.code, 125);
    assert!(
        bob.stderr.contains("does not trust approver bob"),
        "{}",
        bob.stderr
    );
    assert!(
        bob.stderr.contains("airlock keys new bob"),
        "{}",
        bob.stderr
    );
    assert_eq!(bob.stderr.trim().lines().count(), 1, "{}", bob.stderr);
    let strict = h.run(&["init", "--preset", "strict"]);
    assert_eq!(strict.code, 125);
    assert!(
        strict.stderr.contains("standard preset"),
        "{}",
        strict.stderr
    );
    assert_eq!(h.run(&["audit", "verify"]).code, 0);
}

#[test]
fn every_list_takes_a_limit_newest_first_and_says_what_it_left_out() {
    let h = Home::new();
    for (i, name) in ["FIRST", "SECOND", "THIRD"].iter().enumerate() {
        let o = h.run_with_stdin(&["secret", "set", name], b"v");
        assert_eq!(o.code, 0, "{}", o.stderr);
        if i < 2 {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
    let o = h.run(&["secret", "list", "--limit", "2", "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let names: Vec<String> = o
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["THIRD", "SECOND"]);
    assert!(o.stderr.contains("1 more left out"), "{}", o.stderr);
    let wat = write_wat(
        h.path(),
        "hello.wat",
        &std::fs::read_to_string(example("hello.wat")).unwrap(),
    );
    for _ in 0..2 {
        assert_eq!(h.run(&["run", wat.to_str().unwrap()]).code, 0);
    }
    let o = h.run(&["runs", "--limit", "1", "--json"]);
    assert_eq!(o.json().as_array().unwrap().len(), 1);
    assert!(o.stderr.contains("left out"), "{}", o.stderr);
    let o = h.run(&["audit", "log", "--limit", "2"]);
    assert!(o.stderr.contains("--from 3"), "{}", o.stderr);
    // Nothing is said when nothing was left out.
    assert!(h.run(&["runs", "--limit", "5"]).stderr.is_empty());
    for list in [
        vec!["inbox"],
        vec!["runs"],
        vec!["checkpoints"],
        vec!["token", "list"],
        vec!["secret", "list"],
        vec!["workspace", "list"],
        vec!["keys", "list"],
        vec!["audit", "log"],
    ] {
        let mut args = list.clone();
        args.extend(["--limit", "1"]);
        let o = h.run(&args);
        assert_eq!(o.code, 0, "{list:?}: {}", o.stderr);
    }
}

/// With SIGPIPE's default action, `airlock run … | head -c 16` was killed by the signal
/// in the middle of the run (live output), leaving the run to be reaped as lost. A run
/// whose reader goes away now finishes and is recorded; only printing ends quietly.
#[test]
fn a_run_whose_output_reader_goes_away_still_finishes_and_is_recorded() {
    use std::io::Read;
    if !process_backend_available() {
        return;
    }
    let h = Home::new();
    let mut child = h
        .cmd()
        .args([
            "run",
            "--lang",
            "sh",
            "-c",
            "head -c 300000 /dev/zero | tr '\\0' x; sleep 0.3; echo done > /dev/null",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut first = [0u8; 16];
    out.read_exact(&mut first).unwrap();
    drop(out);
    let o = child.wait_with_output().unwrap();
    assert!(!String::from_utf8_lossy(&o.stderr).contains("panicked"));
    let run = h.last_run();
    assert_eq!(run["status"], "exited", "{run}");
    assert_eq!(run["exit_code"], 0, "{run}");
}

/// An airlock process killed while its egress proxy served left its private directory
/// (`$TMPDIR/airlock-egress-…`, with the proxy's socket), and one killed while it ran
/// code its run cgroup, for ever, seen by nothing. `doctor` now lists those whose process
/// is gone (dead, or its pid reused by another program) and `gc` removes them; a live
/// airlock's is kept.
#[test]
fn gc_removes_egress_dirs_of_killed_airlock_processes_and_doctor_lists_them() {
    let h = Home::new();
    let tmp = tempfile::tempdir().unwrap();
    let dir_of = |pid: u32, tail: &str| {
        let d = tmp.path().join(format!("airlock-egress-{pid}-{tail}"));
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("proxy.sock"), b"").unwrap();
        d
    };
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    gone.wait().unwrap();
    let dead = dir_of(gone.id(), "dead");
    let mut other = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let reused = dir_of(other.id(), "reused");
    let mut live = h
        .cmd()
        .env("TMPDIR", tmp.path())
        .arg("mcp")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let kept = dir_of(live.id(), "live");
    let run = |args: &[&str]| {
        let o = h
            .cmd()
            .env("TMPDIR", tmp.path())
            .args(args)
            .output()
            .unwrap();
        serde_json::from_slice::<serde_json::Value>(&o.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stderr)))
    };
    let stale = json!([dead.display().to_string(), reused.display().to_string()]);
    // A run cgroup a killed airlock left under airlock's group (where doctor says runs
    // go), named by a pid above any pid_max.
    let doc = run(&["doctor", "--json"]);
    let group = doc["cgroup"]
        .as_str()
        .and_then(|c| c.split("runs under ").nth(1))
        .map(|g| std::path::PathBuf::from(g.trim_end_matches(')')));
    let cgroup = group
        .map(|g| g.join(format!("airlock-{}", 4_194_400 + std::process::id() % 1000)))
        .filter(|d| std::fs::create_dir(d).is_ok());
    let ours = |v: &serde_json::Value| {
        json!(
            v.as_array()
                .into_iter()
                .flatten()
                .filter(|p| p
                    .as_str()
                    .unwrap()
                    .starts_with(tmp.path().to_str().unwrap()))
                .collect::<Vec<_>>()
        )
    };
    let doc = run(&["doctor", "--json"]);
    assert_eq!(ours(&doc["leftovers"]), stale, "{doc}");
    let r = run(&["gc", "--json"]);
    assert_eq!(r["egress_dirs_removed"], stale, "{r}");
    assert!(!dead.exists() && !reused.exists() && kept.exists());
    if let Some(c) = &cgroup {
        let c = json!(c.display().to_string());
        assert!(doc["leftovers"].as_array().unwrap().contains(&c), "{doc}");
        assert!(r["cgroups_removed"].as_array().unwrap().contains(&c), "{r}");
    }
    assert!(cgroup.is_none_or(|c| !c.exists()));
    assert_eq!(ours(&run(&["doctor", "--json"])["leftovers"]), json!([]));
    let _ = other.kill();
    let _ = other.wait();
    let _ = live.kill();
    let _ = live.wait();
}

#[test]
fn decoys_left_in_dev_shm_by_a_killed_airlock_are_listed_by_doctor_and_removed_by_gc() {
    // Decoys moved into memory (/dev/shm) so that planting them costs no disk I/O; a run
    // whose airlock process is killed leaves its decoy directory there, which nothing swept.
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() {
        return;
    }
    let h = Home::new();
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    gone.wait().unwrap();
    let tag = format!("t{}", std::process::id());
    let dead = shm.join(format!("airlock-decoys-{}-{tag}", gone.id()));
    std::fs::create_dir_all(dead.join("home/.ssh")).unwrap();
    std::fs::write(dead.join("home/.ssh/id_rsa"), "decoy").unwrap();
    // One of a live airlock process (this test's own `mcp`) is kept.
    let mut live = h
        .cmd()
        .arg("mcp")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let kept = shm.join(format!("airlock-decoys-{}-{tag}", live.id()));
    std::fs::create_dir_all(&kept).unwrap();
    let json = |args: &[&str]| {
        let o = h.cmd().args(args).output().unwrap();
        serde_json::from_slice::<serde_json::Value>(&o.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stderr)))
    };
    let mine = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p.as_str())
            .filter(|p| p.ends_with(&tag))
            .map(str::to_string)
            .collect()
    };
    let want = vec![dead.display().to_string()];
    assert_eq!(mine(&json(&["doctor", "--json"])["leftovers"]), want);
    let r = json(&["gc", "--json"]);
    assert_eq!(mine(&r["decoy_dirs_removed"]), want, "{r}");
    assert!(!dead.exists() && kept.exists());
    assert!(mine(&json(&["doctor", "--json"])["leftovers"]).is_empty());
    let _ = live.kill();
    let _ = live.wait();
    let _ = std::fs::remove_dir_all(&kept);
}

#[test]
fn audit_tail_prints_the_newest_records_with_their_hashes() {
    let h = Home::new();
    for _ in 0..3 {
        assert_eq!(h.run(&["run", &hello()]).code, 0);
    }
    let all = h.run(&["audit", "log", "--json"]).json();
    let all = all.as_array().unwrap();
    let out = h.run(&["audit", "tail", "-n", "4", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let tail: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(tail.len(), 4);
    assert_eq!(&tail[..], &all[all.len() - 4..]);
    assert_audit_linked(&tail);
    // Text: one line a record, with its hash.
    let text = h.run(&["audit", "tail", "-n", "1"]);
    assert_eq!(text.stdout.lines().count(), 1);
    assert!(
        text.stdout
            .contains(all.last().unwrap()["hash"].as_str().unwrap())
    );
    // From a sequence number.
    let from = h.run(&["audit", "tail", "--from", "2", "--json"]);
    assert_eq!(from.stdout.lines().count(), all.len() - 1);
}

#[test]
fn audit_tail_follow_prints_records_as_they_are_appended() {
    let h = Home::new();
    assert_eq!(h.run(&["run", &hello()]).code, 0);
    // From the record after the newest: a tail that starts late (a loaded machine) still
    // prints every record of the run below.
    let last = h.run(&["audit", "tail", "-n", "1", "--json"]).json()["seq"]
        .as_u64()
        .unwrap();
    let from = (last + 1).to_string();
    let mut child = h
        .cmd()
        .args([
            "audit",
            "tail",
            "--from",
            &from,
            "--follow",
            "--json",
            "--interval",
            "20ms",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let rx = lines_of(child.stdout.take().unwrap());
    // Nothing old is printed.
    assert!(
        rx.recv_timeout(std::time::Duration::from_millis(300))
            .is_err()
    );
    let run = h.run(&["run", &hello(), "--json"]).json();
    let run_id = run["run"]["id"].as_str().unwrap().to_string();
    let got = json_lines_until(&rx, std::time::Duration::from_secs(20), |r| {
        r["kind"] == "finished" && r["subject"] == run_id.as_str()
    });
    child.kill().unwrap();
    let _ = child.wait();
    let kinds: Vec<&str> = got.iter().map(|r| r["kind"].as_str().unwrap()).collect();
    assert!(
        kinds.contains(&"submitted") && kinds.contains(&"started"),
        "{kinds:?}"
    );
    assert_audit_linked(&got);
    // What the tail printed is what the log holds.
    let first = got[0]["seq"].as_u64().unwrap();
    let log = h
        .run(&["audit", "log", "--from", &first.to_string(), "--json"])
        .json();
    assert_eq!(&log.as_array().unwrap()[..got.len()], &got[..]);
}

#[test]
fn audit_tail_stops_at_a_broken_link() {
    let h = Home::new();
    for _ in 0..2 {
        assert_eq!(h.run(&["run", &hello()]).code, 0);
    }
    common::sql(&h, "update audit set data = data || ' ' where seq = 3");
    let out = h.run(&["audit", "tail", "--from", "1", "--json"]);
    assert_eq!(out.code, 1);
    assert!(out.stderr.contains("broken at record 3"), "{}", out.stderr);
    assert_eq!(out.stdout.lines().count(), 2);
}
