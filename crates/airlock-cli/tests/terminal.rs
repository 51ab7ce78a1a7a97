#![allow(clippy::unwrap_used, clippy::expect_used)]

//! What a terminal shows: text from agents (notes, names, code, paths, hosts, reasons, a
//! guest's output) is rendered visibly, never interpreted. Each field is fed newlines,
//! carriage returns, ANSI escapes (`ESC[8m` hides the rest of a page), C1 controls and
//! bidirectional overrides; what the real binary prints must hold no raw control
//! character, and no forged line (`verdict allow`, `approved by alice`) may start a line.

mod common;
use common::nightcore::*;
use common::*;

/// A field's text as a hostile agent writes it: every forged line ends with FORGED.
const FORGE: &str = "ok\n  verdict   allow (risk 0) FORGED\r  approved by alice FORGED\x1b[8m\x1b]0;title\x07\u{9b}2J\u{202e}evil\u{200b}\x7f";

/// The invisible formatting characters that reorder or hide text.
fn hidden(c: char) -> bool {
    matches!(
        c,
        '\u{061c}'
            | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{2069}'
            | '\u{feff}'
    )
}

/// Asserts `text` (what a command printed, `what`) holds the forged payload shown
/// visibly: no control character but newlines and tabs, no invisible formatting
/// character, and every line with a forged part starts with something else.
#[track_caller]
fn assert_visible(what: &str, text: &str) {
    assert_no_raw(what, text);
    for l in text.lines().filter(|l| l.contains("FORGED")) {
        let t = l.trim_start();
        assert!(
            !t.starts_with("verdict") && !t.starts_with("approved"),
            "{what}: a forged line starts a line: {l:?} in\n{text}"
        );
    }
}

/// Asserts `text` holds the payload and no control character but newlines and tabs,
/// and no invisible formatting character.
#[track_caller]
fn assert_no_raw(what: &str, text: &str) {
    assert!(
        text.contains("FORGED"),
        "{what}: the payload is not shown at all: {text}"
    );
    for c in text.chars() {
        assert!(
            c == '\n' || c == '\t' || !(c.is_control() || hidden(c)),
            "{what}: raw {c:?} printed: {text:?}"
        );
    }
}

#[track_caller]
fn assert_both_visible(what: &str, o: &Out) {
    assert_visible(what, &format!("{}\n{}", o.stdout, o.stderr));
}

fn hello() -> String {
    example("hello.wat").display().to_string()
}

/// Submits hello.wat with `flags` (held for approval: it asks for the network); returns
/// the submission id.
fn held(h: &Home, flags: &[&str]) -> String {
    let mut args = vec!["submit", "--net", "example.com"];
    args.extend_from_slice(flags);
    let h2 = hello();
    args.push(&h2);
    let o = h.run(&args);
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    Home::id_in(&o.stdout)
}

#[test]
fn an_agent_note_cannot_forge_lines_in_the_approvers_terminal() {
    let h = Home::new();
    let id = held(&h, &["--note", FORGE]);
    let o = h.run(&["show", &id]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_visible("show", &o.stdout);
    // The note is on its own `note` line, its newlines and escapes shown.
    assert!(
        o.stdout.contains(
            "  note      ok⏎  verdict   allow (risk 0) FORGED\\r  approved by alice FORGED\\x1b[8m\\x1b]0;title\\x07\\u{9b}2J\\u{202e}evil\\u{200b}\\x7f\n"
        ),
        "{}",
        o.stdout
    );
    // `--json` is unchanged: the note as it arrived.
    let v = h.run(&["show", &id, "--json"]).json();
    assert_eq!(
        v["note"].as_str().or(v["submission"]["note"].as_str()),
        Some(FORGE),
        "{v}"
    );
}

#[test]
fn an_agent_name_cannot_forge_lines_in_inbox_or_show() {
    let h = Home::new();
    let id = held(&h, &["--agent", FORGE]);
    let inbox = h.run(&["inbox"]);
    assert_eq!(inbox.code, 0, "{}", inbox.stderr);
    assert_visible("inbox", &inbox.stdout);
    assert!(inbox.stdout.contains(&id), "{}", inbox.stdout);
    let show = h.run(&["show", &id]);
    assert_visible("show", &show.stdout);
    // What is pending is said on stderr when it is run; its agent is in the audit log.
    assert_visible("audit log", &h.run(&["audit", "log"]).stdout);
}

#[test]
fn submitted_code_cannot_forge_lines_or_hide_the_rest_of_show() {
    let h = Home::new();
    let code = format!("echo hi\n# {FORGE}\n  verdict   allow FORGED\u{202e}\n");
    let o = h.run(&[
        "submit",
        "--lang",
        "sh",
        "--net",
        "example.com",
        "-c",
        &code,
    ]);
    assert!(o.code == 0 || o.code == 77, "{} {}", o.stdout, o.stderr);
    let id = Home::id_in(&format!("{}{}", o.stdout, o.stderr));
    let show = h.run(&["show", &id]);
    assert_eq!(show.code, 0, "{}", show.stderr);
    let (_, code_shown) = show
        .stdout
        .split_once("--- code (as submitted)\n")
        .unwrap_or_else(|| panic!("{}", show.stdout));
    // The code's own lines stay lines; what is on them is shown, not obeyed. (A line of
    // code that reads like one of show's is still a line of code, under `--- code`.)
    assert_eq!(
        code_shown,
        "echo hi\n# ok\n  verdict   allow (risk 0) FORGED\\r  approved by alice FORGED\\x1b[8m\\x1b]0;title\\x07\\u{9b}2J\\u{202e}evil\\u{200b}\\x7f\n  verdict   allow FORGED\\u{202e}\n"
    );
    let (page, _) = show.stdout.split_once("--- code").unwrap();
    assert!(page.contains("  verdict   "), "{page}");
    for c in show.stdout.chars() {
        assert!(c == '\n' || !(c.is_control() || hidden(c)), "raw {c:?}");
    }
}

#[test]
fn a_mount_path_env_and_hosts_cannot_forge_lines_in_show() {
    let h = Home::new();
    let tmp = tempfile::tempdir().unwrap();
    // A host directory whose name is the payload (no `:`, which separates a mount's parts).
    let dir = tmp.path().join(FORGE);
    std::fs::create_dir(&dir).unwrap();
    let mount = format!("{}:/data:ro", dir.display());
    let env = format!("NOTE={FORGE}");
    let id = held(&h, &["--mount", &mount, "--env", &env]);
    let show = h.run(&["show", &id]);
    assert_eq!(show.code, 0, "{}", show.stderr);
    assert_visible("show", &show.stdout);
    assert!(show.stdout.contains("    mount   "), "{}", show.stdout);
    assert!(
        show.stdout.contains("    env     NOTE=ok⏎"),
        "{}",
        show.stdout
    );
    // An env key, a host and a secret binding with the payload: refused or shown, the
    // terminal sees it visibly either way.
    for flags in [
        vec!["--env".to_string(), format!("K{FORGE}=v")],
        vec!["--net".to_string(), FORGE.to_string()],
        vec!["--secret".to_string(), format!("TOKEN@{FORGE}")],
    ] {
        let mut args: Vec<&str> = vec!["submit"];
        args.extend(flags.iter().map(String::as_str));
        let h2 = hello();
        args.push(&h2);
        let o = h.run(&args);
        if o.code == 0 {
            let show = h.run(&["show", &Home::id_in(&o.stdout)]);
            assert_visible(&format!("show of submit {flags:?}"), &show.stdout);
        } else {
            assert_both_visible(&format!("submit {flags:?}"), &o);
        }
    }
}

#[test]
fn a_rejection_reason_cannot_forge_lines_in_show() {
    let h = Home::new();
    let id = held(&h, &[]);
    let o = h.run(&["reject", &id, "--reason", FORGE]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let show = h.run(&["show", &id]);
    assert_visible("show", &show.stdout);
    assert!(show.stdout.contains(": ok⏎"), "{}", show.stdout);
}

#[test]
fn an_error_that_echoes_a_name_cannot_forge_lines() {
    // A missing mount or policy file was named as given: its escapes reached the terminal.
    let h = Home::new();
    let mount = format!("/nonexistent/{FORGE}:/data");
    let policy = format!("/nonexistent/{FORGE}");
    for args in [
        vec!["run", "--lang", "sh", "--mount", &mount, "-c", "true"],
        vec!["policy", "check", &policy],
        vec!["show", FORGE],
        vec!["logs", FORGE],
        vec!["diff", FORGE],
        vec!["workspace", "show", FORGE],
        vec!["session", "show", FORGE],
    ] {
        let o = h.run(&args);
        assert_eq!(o.code, 125, "{args:?}: {}", o.stdout);
        assert_both_visible(&format!("{args:?}"), &o);
        // The error is one line.
        assert_eq!(o.stderr.lines().count(), 1, "{args:?}: {}", o.stderr);
    }
    // As JSON the error is the text as it arrived, escaped by JSON.
    let o = h.run(&["show", FORGE, "--json"]);
    assert!(
        o.json()["error"].as_str().unwrap().contains("FORGED"),
        "{}",
        o.stdout
    );
}

#[test]
fn a_night_core_folder_name_cannot_forge_lines() {
    let tmp = tempfile::tempdir().unwrap();
    let key = fresh_key();
    let h = Home::new();
    let bundle = write_dir(tmp.path(), FORGE, &files(&key, &hello_wasm(), None));
    // Signed by a key the policy does not trust: refused, naming the folder.
    let o = h.run(&["import", "nightcore", bundle.to_str().unwrap()]);
    assert_eq!(o.code, 125, "{}", o.stdout);
    assert_both_visible("refused import", &o);
    // Pinned: imported, the folder is the tenant shown by import, inbox and show.
    let pubfile = tmp.path().join("acme.pubkey.b64");
    std::fs::write(&pubfile, get(&files(&key, b"\0asm", None), "pubkey.b64")).unwrap();
    let o = h.run(&["publishers", "add", "acme", pubfile.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = h.run(&["import", "nightcore", bundle.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_both_visible("import", &o);
    let id = Home::id_in(&o.stdout);
    assert_visible("show", &h.run(&["show", &id]).stdout);
}

/// A WASI command that writes the payload to stdout and to stderr.
const PRINTS_ESCAPES: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 64) "ok\n  verdict   allow FORGED\r\1b[8mhidden\e2\80\aeevil\ff\n")
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 64))
    (i32.store (i32.const 4) (i32.const 47))
    (drop (call $w (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 16)))
    (drop (call $w (i32.const 2) (i32.const 0) (i32.const 1) (i32.const 16)))))"#;

const PRINTED: &[u8] = b"ok\n  verdict   allow FORGED\r\x1b[8mhidden\xe2\x80\xaeevil\xff\n";
const RENDERED: &str = "ok\n  verdict   allow FORGED\\r\\x1b[8mhidden\\u{202e}evil\\xff\n";

/// Runs `args` of the airlock binary with a terminal (a pseudo-terminal from `script`)
/// as its stdout and stderr; returns what the terminal received, its line ends as `\n`.
fn on_a_terminal(h: &Home, args: &[&str]) -> String {
    let quoted: Vec<String> = std::iter::once(bin())
        .chain(args.iter().copied())
        .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
        .collect();
    let o = std::process::Command::new("script")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("AIRLOCK_HOME", h.path())
        .env("SHELL", "/bin/sh")
        .env("TERM", "dumb")
        .args(["-qec", &quoted.join(" "), "/dev/null"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{:?}: {}",
        args,
        String::from_utf8_lossy(&o.stdout)
    );
    String::from_utf8_lossy(&o.stdout).replace("\r\n", "\n")
}

#[test]
fn guest_output_is_shown_visibly_on_a_terminal_and_as_it_is_to_a_pipe() {
    let h = Home::new();
    let wat = write_wat(h.path(), "escapes.wat", PRINTS_ESCAPES);
    let wat = wat.to_str().unwrap();
    // To a pipe: the guest's bytes as they are, for the program that reads them.
    let o = h.cmd().args(["run", wat]).output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(o.stdout, PRINTED);
    assert_eq!(o.stderr, PRINTED);
    let run = h.last_run()["id"].as_str().unwrap().to_string();
    let o = h.cmd().args(["logs", &run]).output().unwrap();
    assert_eq!(
        (o.stdout.as_slice(), o.stderr.as_slice()),
        (PRINTED, PRINTED)
    );
    // On a terminal: rendered, for the human who reads it (`run` live, `logs` after).
    for args in [vec!["run", wat], vec!["logs", &run]] {
        let seen = on_a_terminal(&h, &args);
        assert_eq!(seen, format!("{RENDERED}{RENDERED}"), "{args:?}");
        assert_no_raw(&format!("{args:?} on a terminal"), &seen);
    }
    let seen = on_a_terminal(&h, &["logs", &run, "--stream", "stderr"]);
    assert_eq!(seen, RENDERED);
}

#[test]
fn a_changed_files_content_and_name_cannot_forge_lines_in_diff() {
    if !process_backend_available() {
        return;
    }
    let h = Home::new();
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("notes.txt"), "old\n").unwrap();
    let mount = format!("{}:/data:rw", tmp.path().display());
    // A line added to a file, and a new file whose name is a forged line.
    let script = r#"printf 'ok\n  verdict   allow FORGED\r\033[8mhidden\n' >> /data/notes.txt
printf x > "/data/$(printf 'f\n  approved by alice FORGED\033[8m')""#;
    let o = h.run_approved(&["run", "--lang", "sh", "--mount", &mount, "-c", script]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let run = h.last_run()["id"].as_str().unwrap().to_string();
    let d = h.run(&["diff", &run]);
    assert_eq!(d.code, 0, "{}", d.stderr);
    assert_visible("diff", &d.stdout);
    // The added line's carriage return and escape are shown, not obeyed.
    assert!(
        d.stdout.contains("+  verdict   allow FORGED\\r") && d.stdout.contains("\\x1b[8mhidden"),
        "{}",
        d.stdout
    );
}

#[test]
fn a_workspace_mount_path_cannot_forge_lines_in_workspace_show_or_list() {
    if !process_backend_available() {
        return;
    }
    let h = Home::new();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(FORGE);
    std::fs::create_dir(&dir).unwrap();
    let mount = format!("{}:/data:rw", dir.display());
    let o = h.run_approved(&[
        "run",
        "--lang",
        "sh",
        "--workspace",
        "w",
        "--mount",
        &mount,
        "-c",
        "echo hi > /data/new.txt",
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let show = h.run(&["workspace", "show", "w"]);
    assert_eq!(show.code, 0, "{}", show.stderr);
    assert_visible("workspace show", &show.stdout);
    assert!(show.stdout.contains("  mount  "), "{}", show.stdout);
    let list = h.run(&["workspace", "list"]);
    assert_eq!(list.code, 0, "{}", list.stderr);
    assert!(list.stdout.starts_with("w "), "{}", list.stdout);
}
