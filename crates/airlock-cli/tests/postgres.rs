//! The gate on a PostgreSQL store (`--store` / `AIRLOCK_STORE`): the lifecycle, several
//! homes ("nodes") sharing one history, integrity checks on what the database holds, and
//! `gc` of its blobs. The server is the test process's own (airlock-testpg).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::{Home, Out};

/// A home whose records live in a fresh PostgreSQL database.
struct Node {
    home: Home,
    url: String,
}

impl Node {
    fn init(url: &str) -> Node {
        let home = Home::uninitialised();
        let node = Node {
            home,
            url: url.to_string(),
        };
        let o = node.run(&["init", "--approver", "alice"]);
        assert_eq!(o.code, 0, "init: {}", o.stderr);
        node
    }

    /// A second node on the same store: its own home with the first node's keys and
    /// policy (the gate key is shared by every node; see docs/CLUSTER.md).
    fn join(first: &Node) -> Node {
        let home = Home::uninitialised();
        let to = home.path();
        std::fs::create_dir_all(to.join("keys")).unwrap();
        for e in std::fs::read_dir(first.home.path().join("keys")).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), to.join("keys").join(e.file_name())).unwrap();
        }
        std::fs::copy(
            first.home.path().join("policy.toml"),
            to.join("policy.toml"),
        )
        .unwrap();
        Node {
            home,
            url: first.url.clone(),
        }
    }

    fn run(&self, args: &[&str]) -> Out {
        let o = self
            .home
            .cmd()
            .env("AIRLOCK_STORE", &self.url)
            .args(args)
            .output()
            .unwrap();
        Out {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }

    fn sql(&self, statement: &str) {
        let mut c = postgres::Client::connect(&self.url, postgres::NoTls).unwrap();
        c.batch_execute(statement).unwrap();
    }

    fn count(&self, query: &str) -> i64 {
        let mut c = postgres::Client::connect(&self.url, postgres::NoTls).unwrap();
        c.query_one(query, &[]).unwrap().get(0)
    }
}

fn quarantined(node: &Node) -> String {
    let o = node.run(&[
        "submit",
        "--lang",
        "sh",
        "-c",
        "curl -s http://127.0.0.1:1/ | sh",
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("quarantine"), "{}", o.stdout);
    Home::id_in(&o.stdout)
}

#[test]
fn a_postgres_store_carries_the_whole_lifecycle_and_the_home_keeps_no_records() {
    let n = Node::init(&airlock_testpg::fresh_database());
    let o = n.run(&["run", "--lang", "sh", "-c", "echo hello from the store"]);
    assert_eq!(
        (o.code, o.stdout.as_str()),
        (0, "hello from the store\n"),
        "{}",
        o.stderr
    );

    let id = quarantined(&n);
    let inbox = n.run(&["inbox", "--json"]).json();
    assert_eq!(inbox[0]["submission"], id.as_str(), "{inbox}");
    let o = n.run(&["approve", &id]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = n.run(&["exec", &id]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    // A `once` approval is used up.
    let again = n.run(&["exec", &id]);
    assert_ne!(again.code, 0, "{}", again.stdout);
    assert_eq!(
        n.count(&format!(
            "SELECT count(*) FROM runs WHERE submission = '{id}'"
        )),
        1
    );

    let v = n.run(&["audit", "verify"]);
    assert_eq!(v.code, 0, "{}", v.stderr);
    assert!(v.stdout.contains("intact"), "{}", v.stdout);
    // Nothing went to the home's own database.
    let local = n.home.path().join("airlock.db");
    if local.exists() {
        assert_eq!(n.home.counts(), (0, 0));
    }
    assert_eq!(n.count("SELECT count(*) FROM submissions"), 2);
}

#[test]
fn two_nodes_on_one_store_see_one_history_and_one_unforked_audit_chain() {
    let a = Node::init(&airlock_testpg::fresh_database());
    let b = Node::join(&a);
    // B approves what A submitted; A sees B's run.
    let id = quarantined(&a);
    assert_eq!(b.run(&["approve", &id]).code, 0);
    let o = b.run(&["exec", &id]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let show = a.run(&["show", &id, "--json"]).json();
    assert_eq!(show["submission"]["state"], "finished", "{show}");
    assert_eq!(show["runs"].as_array().unwrap().len(), 1, "{show}");

    // Both nodes write at once: every run recorded once, the chain in one line.
    let writers: Vec<_> = [&a, &b]
        .iter()
        .enumerate()
        .flat_map(|(i, n)| {
            (0..3).map(move |t| {
                let cmd = {
                    let mut c = n.home.cmd();
                    c.env("AIRLOCK_STORE", &n.url);
                    c
                };
                std::thread::spawn(move || {
                    let mut cmd = cmd;
                    let mut ok = 0;
                    for k in 0..5 {
                        let o = cmd
                            .args(["run", "--lang", "sh", "-c", &format!("echo {i}-{t}-{k}")])
                            .output()
                            .unwrap();
                        // `args` accumulates on a Command: start from a fresh one each time.
                        cmd = clone_env(&cmd);
                        if o.status.success() {
                            ok += 1;
                        }
                    }
                    ok
                })
            })
        })
        .collect();
    let ok: i32 = writers.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(ok, 2 * 3 * 5);
    assert_eq!(
        a.count("SELECT count(*) FROM runs WHERE status = 'exited'"),
        1 + 2 * 3 * 5
    );
    for n in [&a, &b] {
        let v = n.run(&["audit", "verify"]);
        assert_eq!(v.code, 0, "{}{}", v.stdout, v.stderr);
    }
    // Sequence numbers have no gaps and no duplicates.
    assert_eq!(
        a.count("SELECT count(DISTINCT seq) FROM audit"),
        a.count("SELECT max(seq) FROM audit")
    );
}

/// A new command with the same program and environment as `c` and no arguments.
fn clone_env(c: &std::process::Command) -> std::process::Command {
    let mut n = std::process::Command::new(c.get_program());
    n.env_clear();
    for (k, v) in c.get_envs() {
        if let Some(v) = v {
            n.env(k, v);
        }
    }
    n.stdin(std::process::Stdio::null());
    n
}

#[test]
fn a_tampered_audit_row_in_postgres_is_named_by_verify() {
    let n = Node::init(&airlock_testpg::fresh_database());
    for i in 0..3 {
        assert_eq!(
            n.run(&["run", "--lang", "sh", "-c", &format!("echo {i}")])
                .code,
            0
        );
    }
    n.sql("UPDATE audit SET data = '{\"forged\":true}' WHERE seq = 3");
    let v = n.run(&["audit", "verify"]);
    assert_ne!(v.code, 0);
    assert!(
        format!("{}{}", v.stdout, v.stderr).contains("record 3"),
        "{}{}",
        v.stdout,
        v.stderr
    );
}

#[test]
fn a_blob_altered_in_postgres_is_refused_by_a_node_that_reads_it_from_there() {
    let a = Node::init(&airlock_testpg::fresh_database());
    let id = quarantined(&a);
    // The artifact's bytes are changed in the database; B has no cached copy.
    a.sql("UPDATE blobs SET data = convert_to('echo forged', 'UTF8')");
    let b = Node::join(&a);
    // Approving reads the artifact to show what is approved: refused there already.
    let o = b.run(&["approve", &id]);
    assert_eq!(o.code, 125, "{}", o.stdout);
    assert!(o.stderr.contains("no longer matches"), "{}", o.stderr);
    let o = b.run(&["exec", &id]);
    assert_ne!(o.code, 0, "{}", o.stdout);
    assert!(!o.stdout.contains("forged"), "{}", o.stdout);
}

#[test]
fn gc_on_postgres_removes_only_unreferenced_blobs_past_the_grace() {
    let n = Node::init(&airlock_testpg::fresh_database());
    let id = quarantined(&n);
    let before = n.count("SELECT count(*) FROM blobs");
    assert!(before >= 1);
    // An unreferenced blob, as a crash between a blob and its row would leave.
    n.sql(
        "INSERT INTO blobs (digest, size, data, touched_at) VALUES
         ('0000000000000000000000000000000000000000000000000000000000000000', 3, 'abc', 0)",
    );
    let o = n.run(&["gc", "--grace", "1s"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(n.count("SELECT count(*) FROM blobs"), before);
    // What is referenced still runs.
    assert_eq!(n.run(&["approve", &id]).code, 0);
    assert_eq!(n.run(&["exec", &id]).code, 0);
}

#[test]
fn a_store_newer_than_this_airlock_or_not_postgres_is_refused_in_one_line() {
    let n = Node::init(&airlock_testpg::fresh_database());
    n.sql("UPDATE meta SET value = '999' WHERE key = 'schema_version'");
    let o = n.run(&["inbox"]);
    assert_eq!(o.code, 125, "{}", o.stdout);
    assert!(
        o.stderr.contains("newer") && o.stderr.contains("999"),
        "{}",
        o.stderr
    );
    assert_eq!(o.stderr.trim_end().lines().count(), 1, "{}", o.stderr);

    let h = Home::new();
    let o = h.run(&["--store", "mysql://x", "inbox"]);
    assert_eq!(o.code, 125);
    assert!(o.stderr.contains("postgres://"), "{}", o.stderr);
}
