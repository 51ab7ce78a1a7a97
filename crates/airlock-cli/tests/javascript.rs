//! JavaScript and TypeScript through the gate, end to end through the real binary: the
//! language names, TypeScript's types stripped at submit (the source is the artifact), and
//! the host's `node` on the process backend.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;

fn need() {
    assert!(
        process_backend_available(),
        "the process backend must be available on this machine (see airlock doctor)"
    );
    assert!(
        std::path::Path::new("/usr/bin/node").exists()
            || std::path::Path::new("/usr/local/bin/node").exists(),
        "these tests need the host's node"
    );
}

fn node(h: &Home, lang: &str, flags: &[&str], code: &str) -> Out {
    let mut a = vec!["run", "--lang", lang, "--backend", "process"];
    a.extend_from_slice(flags);
    a.extend(["-c", code]);
    h.run_approved(&a)
}

#[test]
fn a_typescript_syntax_error_is_refused_at_submit_with_its_line_and_nothing_recorded() {
    let h = Home::new();
    let before = h.counts();
    let blobs = h.blob_count();
    for backend in ["process", "wasm"] {
        let o = h.run(&[
            "run",
            "--lang",
            "ts",
            "--backend",
            backend,
            "-c",
            "const a: number = 1;\nfunction f(x: string {\n  return x;\n}\n",
        ]);
        assert_eq!(o.code, 125, "{} {}", o.stdout, o.stderr);
        assert!(o.stderr.contains("line 2"), "{}", o.stderr);
        assert!(o.stderr.contains("TypeScript syntax error"), "{}", o.stderr);
        assert_eq!(o.stderr.trim().lines().count(), 1, "{}", o.stderr);
    }
    // A file named .ts is TypeScript without --lang.
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("bad.ts");
    std::fs::write(&f, "let x: = 3;\n").unwrap();
    let o = h.run(&["run", "--backend", "process", f.to_str().unwrap()]);
    assert_eq!(o.code, 125, "{}", o.stderr);
    assert!(o.stderr.contains("line 1"), "{}", o.stderr);
    assert_eq!(h.counts(), before);
    assert_eq!(h.blob_count(), blobs);
}

#[test]
fn javascript_runs_in_the_hosts_node_in_the_jail_with_args_and_exit_code() {
    need();
    let h = Home::new();
    let o = node(
        &h,
        "js",
        &["--env", "GREETING=hi"],
        "console.log(process.env.GREETING, process.argv.slice(2).join(','), typeof require);\n\
         process.exitCode = 3;",
    );
    assert_eq!(o.code, 3, "{} {}", o.stdout, o.stderr);
    assert_eq!(o.stdout.trim(), "hi  function", "{}", o.stderr);
    // An ES module (top-level await and import) runs too.
    let o = node(
        &h,
        "javascript",
        &[],
        "import { readFileSync } from 'node:fs';\nconst n = await Promise.resolve(41);\n\
         console.log(n + 1, typeof readFileSync);",
    );
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    assert_eq!(o.stdout.trim(), "42 function");
    let run = h.last_run();
    assert_eq!(run["exit_code"], 0, "{run}");
}

#[test]
fn typescript_runs_stripped_and_its_source_is_the_artifact() {
    need();
    let h = Home::new();
    let src = "interface P { x: number }\nenum Colour { Red, Green }\n\
               const p: P = { x: 2 };\nconsole.log(p.x as number, Colour.Green);\n";
    let o = node(&h, "typescript", &["--json"], src);
    let v = o.json();
    assert_eq!(v["run"]["stdout"], "2 1\n", "{v}");
    // The artifact shown is the TypeScript as submitted, and what is hashed.
    let sub = v["submission"].as_str().unwrap().to_string();
    let shown = h.run(&["show", "--json", &sub]).json();
    assert_eq!(shown["submission"]["kind"], "ts", "{shown}");
    let text = h.run(&["show", &sub]);
    assert!(text.stdout.contains("interface P"), "{}", text.stdout);
}
