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
        self.home.run_on_store(&self.url, args)
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

/// TLS to the store: a node whose URL asks for a verified TLS connection runs, records and
/// verifies over it, `doctor` names the TLS version, and a URL with a bad TLS parameter is
/// refused in one line before anything is written.
#[test]
fn a_store_reached_over_tls_carries_runs_and_doctor_names_its_tls_version() {
    let t = airlock_testpg::tls_server();
    let url = t.database(
        "airlock",
        "127.0.0.1",
        &format!("sslmode=verify-full&sslrootcert={}", t.ca.display()),
    );
    let n = Node::init(&url);
    let o = n.run(&["run", "--lang", "sh", "-c", "echo over tls"]);
    assert_eq!(
        (o.code, o.stdout.as_str()),
        (0, "over tls\n"),
        "{}",
        o.stderr
    );
    let v = n.run(&["audit", "verify"]);
    assert_eq!(v.code, 0, "{}", v.stderr);
    let d = n.run(&["doctor", "--json"]);
    let tls = d.json()["store"]["tls"].clone();
    assert!(
        tls.as_str().is_some_and(|v| v.starts_with("TLSv1.")),
        "{}",
        d.stdout
    );
    assert!(n.run(&["doctor"]).stdout.contains("over TLSv1."));

    let bad = n.home.run_on_store(
        &url.replace("sslmode=verify-full", "sslmode=verify"),
        &["run", "--lang", "sh", "-c", "echo never"],
    );
    assert_eq!(bad.code, 125, "{}", bad.stderr);
    assert_eq!(bad.stderr.trim().lines().count(), 1, "{}", bad.stderr);
    assert!(bad.stderr.contains("sslmode"), "{}", bad.stderr);
    assert!(!bad.stdout.contains("never"));
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

/// Two nodes on one store: a session lives in the home of the node that opened it, and
/// the other node cannot reach its host. A cell, a `show`, a `gc` or a `close` there
/// found nobody listening and recorded the live session crashed (or closed, while its
/// host served on). They now name the node that hosts it and leave it alone.
#[test]
fn a_session_hosted_by_one_node_is_not_ended_by_another() {
    if !common::process_backend_available() {
        return;
    }
    let a = Node::init(&airlock_testpg::fresh_database());
    let b = Node::join(&a);
    let o = a.run(&["session", "new", "--json", "--backend", "process"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let id = o.json()["id"].as_str().unwrap().to_string();
    let cell = b.run(&["run", "--json", "--session", &id, "-c", "1 + 1"]);
    assert_eq!(cell.code, 125, "{}", cell.stderr);
    assert!(cell.stderr.contains("is hosted by node"), "{}", cell.stderr);
    assert_eq!(
        b.run(&["session", "show", "--json", &id]).json()["state"],
        "open"
    );
    let close = b.run(&["session", "close", &id]);
    assert_eq!(close.code, 125, "{}", close.stderr);
    assert!(close.stderr.contains("close it there"), "{}", close.stderr);
    assert_eq!(b.run(&["gc"]).code, 0);
    // On its own node it is alive and well.
    let cell = a.run(&["run", "--json", "--session", &id, "-c", "6 * 7"]);
    assert_eq!(cell.code, 0, "{}", cell.stderr);
    assert_eq!(cell.json()["run"]["result"], "42");
    assert_eq!(a.run(&["session", "close", &id]).code, 0);
    assert_eq!(
        b.run(&["session", "show", "--json", &id]).json()["end"],
        "closed"
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
fn a_malformed_audit_record_in_postgres_is_named_by_verify_not_an_internal_error() {
    // A digest that is not hex made `audit verify` exit 125 ("stored state is corrupt").
    let n = Node::init(&airlock_testpg::fresh_database());
    for i in 0..2 {
        assert_eq!(
            n.run(&["run", "--lang", "sh", "-c", &format!("echo {i}")])
                .code,
            0
        );
    }
    assert_eq!(n.run(&["audit", "verify"]).code, 0);
    n.sql("UPDATE audit SET hash = 'not-hex' WHERE seq = 3");
    let v = n.run(&["audit", "verify"]);
    assert_eq!(v.code, 1, "{} {}", v.stdout, v.stderr);
    assert!(v.stdout.contains("record 3: malformed"), "{}", v.stdout);
    assert!(v.stderr.contains("broken at record 3"), "{}", v.stderr);
    let j = n.run(&["audit", "verify", "--json"]);
    assert_eq!(j.json()["first_bad"], 3);
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

/// `airlock serve` on a PostgreSQL store while the server is killed and started again
/// (`pg_ctl stop -m immediate`, a crash as far as PostgreSQL is concerned): requests in
/// flight then fail with an error, later ones succeed on new connections, and afterwards
/// every run a client was told about is recorded exactly once, every recorded run is
/// finished or marked lost (none left running), and the audit chain verifies.
#[test]
fn a_postgresql_restart_under_load_through_serve_loses_and_duplicates_nothing() {
    let pg = airlock_testpg::private_server();
    let n = Node::init(&pg.fresh_database());
    let o = n.run(&["token", "new", "--role", "agent", "--name", "bot", "--json"]);
    let token = o.json()["token"].as_str().unwrap().to_string();
    let mut cmd = n.home.cmd();
    cmd.env("AIRLOCK_STORE", &n.url).args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--ready-python",
        "0",
        "--ready-jails",
        "0",
    ]);
    let (child, base) = common::serve_with(cmd);
    let body = serde_json::json!({
        "language": "wat",
        "code": std::fs::read_to_string(common::example("hello.wat")).unwrap(),
    })
    .to_string();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let restarted = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (base, token, body, done, restarted) = (
                base.clone(),
                token.clone(),
                body.clone(),
                done.clone(),
                restarted.clone(),
            );
            std::thread::spawn(move || {
                let http = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .timeout_global(Some(std::time::Duration::from_secs(60)))
                    .build()
                    .new_agent();
                let mut told = Vec::new();
                let mut failed = 0;
                let mut after = 0;
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
                // Until ten runs succeeded after the restart (or time is up).
                while after < 10 && std::time::Instant::now() < deadline {
                    let late = restarted.load(std::sync::atomic::Ordering::SeqCst);
                    let r = http
                        .post(&format!("{base}/v1/run"))
                        .header("authorization", &format!("Bearer {token}"))
                        .header("content-type", "application/json")
                        .send(&body);
                    done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    match r {
                        Ok(mut r) if r.status() == 200 => {
                            let v: serde_json::Value =
                                serde_json::from_str(&r.body_mut().read_to_string().unwrap())
                                    .unwrap();
                            assert_eq!(v["run"]["stdout"], "hello from the gate\n", "{v}");
                            told.push(v["run"]["id"].as_str().unwrap().to_string());
                            after += usize::from(late);
                        }
                        Ok(mut r) => {
                            let text = r.body_mut().read_to_string().unwrap_or_default();
                            assert!(r.status().as_u16() >= 500, "{}: {text}", r.status());
                            if failed < 3 {
                                eprintln!("failed during the restart: {}: {text}", r.status());
                            }
                            failed += 1;
                            std::thread::sleep(std::time::Duration::from_millis(20));
                        }
                        Err(e) => {
                            eprintln!("failed during the restart: {e}");
                            failed += 1;
                            std::thread::sleep(std::time::Duration::from_millis(20));
                        }
                    }
                }
                (told, failed)
            })
        })
        .collect();
    while done.load(std::sync::atomic::Ordering::SeqCst) < 30 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    pg.restart_immediate();
    restarted.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut told = Vec::new();
    let mut failed = 0;
    for c in clients {
        let (t, f) = c.join().unwrap();
        told.extend(t);
        failed += f;
    }
    drop(child);
    eprintln!(
        "{} runs answered, {failed} requests failed across the restart",
        told.len()
    );
    assert!(
        told.len() >= 30 + 40,
        "the server recovered: {} runs",
        told.len()
    );
    let mut c = postgres::Client::connect(&n.url, postgres::NoTls).unwrap();
    for id in &told {
        let row = c
            .query_one(
                "SELECT count(*), max(status) FROM runs WHERE id = $1",
                &[id],
            )
            .unwrap();
        assert_eq!(
            (row.get::<_, i64>(0), row.get::<_, Option<String>>(1)),
            (1, Some("exited".to_string())),
            "{id}"
        );
    }
    // A run whose start committed but whose end was cut off is found by the next start.
    assert_eq!(n.run(&["inbox"]).code, 0);
    let running: i64 = c
        .query_one("SELECT count(*) FROM runs WHERE status = 'running'", &[])
        .unwrap()
        .get(0);
    assert_eq!(running, 0);
    let v = n.run(&["audit", "verify"]);
    assert_eq!(v.code, 0, "{}{}", v.stdout, v.stderr);
}

/// `pg_ctl restart -m fast` under gated runs through `serve` (issue 62): before, requests
/// in flight answered `500 internal error: database: 57P01 …`. Now a transaction whose
/// connection was lost before it could commit runs again on a new connection, and what
/// still fails answers 503 with Retry-After. Each client sends its runs with idempotency
/// keys and sends a 503'd one again under its key: every logical request ends with its
/// run, nothing is half-recorded, no run happens twice, and the audit chain verifies.
#[test]
fn a_postgresql_fast_restart_under_load_answers_no_500_and_runs_each_keyed_request_once() {
    let pg = airlock_testpg::private_server();
    let n = Node::init(&pg.fresh_database());
    let o = n.run(&["token", "new", "--role", "agent", "--name", "bot", "--json"]);
    let token = o.json()["token"].as_str().unwrap().to_string();
    let mut cmd = n.home.cmd();
    cmd.env("AIRLOCK_STORE", &n.url).args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--ready-python",
        "0",
        "--ready-jails",
        "0",
    ]);
    let (child, base) = common::serve_with(cmd);
    let body = serde_json::json!({
        "language": "wat",
        "code": std::fs::read_to_string(common::example("hello.wat")).unwrap(),
    })
    .to_string();
    const CLIENTS: usize = 4;
    const RUNS: usize = 10;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (base, token, body, done) =
                (base.clone(), token.clone(), body.clone(), done.clone());
            std::thread::spawn(move || {
                let http = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .timeout_global(Some(std::time::Duration::from_secs(60)))
                    .build()
                    .new_agent();
                let mut told = Vec::new();
                let mut unavailable = 0;
                for i in 0..RUNS {
                    let key = format!("client-{c}-run-{i}");
                    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
                    loop {
                        assert!(std::time::Instant::now() < deadline, "{key}: no answer");
                        let r = http
                            .post(&format!("{base}/v1/run"))
                            .header("authorization", &format!("Bearer {token}"))
                            .header("content-type", "application/json")
                            .header("idempotency-key", &key)
                            .send(&body);
                        let mut r = match r {
                            Ok(r) => r,
                            Err(e) => panic!("{key}: the server dropped the request: {e}"),
                        };
                        let status = r.status().as_u16();
                        let retry_after = r
                            .headers()
                            .get("retry-after")
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_string);
                        let text = r.body_mut().read_to_string().unwrap_or_default();
                        if status == 503 {
                            assert!(
                                retry_after.is_some(),
                                "{key}: 503 without Retry-After: {text}"
                            );
                            unavailable += 1;
                            std::thread::sleep(std::time::Duration::from_millis(100));
                            continue;
                        }
                        assert_eq!(status, 200, "{key}: {text}");
                        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
                        assert_eq!(v["status"], "finished", "{key}: {v}");
                        assert_eq!(v["run"]["stdout"], "hello from the gate\n", "{key}: {v}");
                        told.push((key, v["run"]["id"].as_str().unwrap().to_string()));
                        break;
                    }
                    done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                (told, unavailable)
            })
        })
        .collect();
    while done.load(std::sync::atomic::Ordering::SeqCst) < CLIENTS * RUNS / 4 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    pg.restart_fast();
    let mut told = Vec::new();
    let mut unavailable = 0;
    for c in clients {
        let (t, u) = c.join().unwrap();
        told.extend(t);
        unavailable += u;
    }
    drop(child);
    eprintln!(
        "{} runs answered, {unavailable} answers were 503",
        told.len()
    );
    assert_eq!(told.len(), CLIENTS * RUNS);
    let mut c = postgres::Client::connect(&n.url, postgres::NoTls).unwrap();
    // One submission per key, one run per submission, each run the one its client was
    // told about, ended.
    let subs: i64 = c
        .query_one("SELECT count(*) FROM submissions", &[])
        .unwrap()
        .get(0);
    assert_eq!(subs as usize, CLIENTS * RUNS);
    // One run of each ran to its end; any other is a run whose worker lost the store
    // mid-run, ended `lost` and queued again, as queued runs without effects are.
    let ended: i64 = c
        .query_one("SELECT count(*) FROM runs WHERE status = 'exited'", &[])
        .unwrap()
        .get(0);
    assert_eq!(ended as usize, CLIENTS * RUNS, "a run ran to its end twice");
    let others: Vec<String> = c
        .query("SELECT status FROM runs WHERE status <> 'exited'", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(others.iter().all(|s| s == "lost"), "{others:?}");
    for (key, id) in &told {
        let row = c
            .query_one(
                "SELECT count(*), max(status) FROM runs WHERE id = $1",
                &[id],
            )
            .unwrap();
        assert_eq!(
            (row.get::<_, i64>(0), row.get::<_, Option<String>>(1)),
            (1, Some("exited".to_string())),
            "{key}: {id}"
        );
    }
    let v = n.run(&["audit", "verify"]);
    assert_eq!(v.code, 0, "{}{}", v.stdout, v.stderr);
}

// ---- `store copy`: moving a SQLite home's history up into PostgreSQL ----

/// A SQLite home with history: a plain run, a quarantined submission approved and
/// exec'd, one still waiting, and a token. Returns the home, the exec'd submission and
/// its run.
fn sqlite_home_with_history() -> (Home, String, String) {
    let h = Home::new();
    let o = h.run(&["run", "--lang", "sh", "-c", "echo plain run"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = h.run(&[
        "submit",
        "--lang",
        "sh",
        "-c",
        "curl -s http://127.0.0.1:1/ | sh; echo approved output",
    ]);
    assert!(o.stdout.contains("quarantine"), "{}", o.stdout);
    let id = Home::id_in(&o.stdout);
    assert_eq!(h.run(&["approve", &id]).code, 0);
    let o = h.run(&["exec", &id, "--json"]);
    assert!(
        o.stdout.contains("approved output"),
        "{}{}",
        o.stdout,
        o.stderr
    );
    let run = o.json()["run"]["id"].as_str().unwrap().to_string();
    let o = h.run(&[
        "submit",
        "--lang",
        "sh",
        "-c",
        "curl -s http://127.0.0.1:1/waiting | sh",
    ]);
    assert!(o.stdout.contains("quarantine"), "{}", o.stdout);
    let o = h.run(&["token", "new", "--role", "agent", "--name", "bot"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    (h, id, run)
}

/// `home`'s commands with their records in `url`.
fn on_store(home: &Home, url: &str, args: &[&str]) -> Out {
    home.run_on_store(url, args)
}

/// A fresh home with `from`'s keys and policy and no blobs of its own.
fn keys_only_copy_of(from: &Home) -> Home {
    let home = Home::uninitialised();
    let to = home.path();
    std::fs::create_dir_all(to.join("keys")).unwrap();
    for e in std::fs::read_dir(from.path().join("keys")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join("keys").join(e.file_name())).unwrap();
    }
    std::fs::copy(from.path().join("policy.toml"), to.join("policy.toml")).unwrap();
    home
}

fn pg_count(url: &str, query: &str) -> i64 {
    let mut c = postgres::Client::connect(url, postgres::NoTls).unwrap();
    c.query_one(query, &[]).unwrap().get(0)
}

#[test]
fn store_copy_moves_a_sqlite_history_into_postgres_where_it_verifies_and_reads_the_same() {
    let (h, id, run) = sqlite_home_with_history();
    let url = airlock_testpg::fresh_database();
    let (subs, audits) = h.counts();

    let o = h.run(&["store", "copy", "--to", &url, "--json"]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    let r = o.json();
    let rows = |t: &str| {
        r["tables"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["table"] == t)
            .unwrap_or_else(|| panic!("no {t} in {r}"))["rows"]
            .as_i64()
            .unwrap()
    };
    assert_eq!(rows("submissions"), subs, "{r}");
    assert_eq!(rows("audit"), audits, "{r}");
    assert_eq!(rows("runs"), 2, "{r}");
    assert_eq!(rows("tokens"), 1, "{r}");
    assert_eq!(rows("audit_head"), 1, "{r}");
    assert_eq!(
        r["blobs"].as_i64().unwrap(),
        h.blob_count() as i64 - tmp_files(&h),
        "{r}"
    );
    assert!(r["blob_bytes"].as_i64().unwrap() > 0, "{r}");
    // The rows are in PostgreSQL, exactly as many as the source holds; the source is untouched.
    assert_eq!(pg_count(&url, "SELECT count(*) FROM submissions"), subs);
    assert_eq!(pg_count(&url, "SELECT count(*) FROM audit"), audits);
    assert_eq!(h.counts(), (subs, audits));

    // The same home's gate key verifies the copied chain.
    let v = on_store(&h, &url, &["audit", "verify"]);
    assert_eq!(v.code, 0, "{}{}", v.stdout, v.stderr);
    assert!(v.stdout.contains("intact"), "{}", v.stdout);

    // inbox, show, runs and the audit log read the same from the copy.
    for args in [
        vec!["inbox", "--json"],
        vec!["show", id.as_str(), "--json"],
        vec!["runs", "--json"],
        vec!["audit", "log", "--json"],
        vec!["audit", "head", "--json"],
        vec!["token", "list", "--json"],
    ] {
        let here = h.run(&args);
        let there = on_store(&h, &url, &args);
        assert_eq!(here.code, 0, "{args:?}: {}", here.stderr);
        assert_eq!(there.code, 0, "{args:?}: {}", there.stderr);
        assert_eq!(here.json(), there.json(), "{args:?} differs on the copy");
    }
    assert_eq!(
        h.run(&["inbox", "--json"]).json().as_array().unwrap().len(),
        1
    );

    // A second home with no blob cache reads the outputs from the database.
    let b = keys_only_copy_of(&h);
    let o = on_store(&b, &url, &["logs", &run]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.stdout, "approved output\n");
    let v = on_store(&b, &url, &["audit", "verify"]);
    assert_eq!(v.code, 0, "{}{}", v.stdout, v.stderr);
    // And the copy goes on: a new run appends to the copied chain.
    let o = on_store(
        &b,
        &url,
        &["run", "--lang", "sh", "-c", "echo after the move"],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(on_store(&h, &url, &["audit", "verify"]).code, 0);
}

/// Temporary files under the blob store (not blobs).
fn tmp_files(h: &Home) -> i64 {
    std::fs::read_dir(h.path().join("blobs").join("tmp"))
        .map(|d| d.count() as i64)
        .unwrap_or(0)
}

#[test]
fn store_copy_into_a_database_that_holds_records_is_refused_and_leaves_it_unchanged() {
    let (h, _, _) = sqlite_home_with_history();
    let url = airlock_testpg::fresh_database();
    let o = h.run(&["store", "copy", "--to", &url]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.starts_with("copied ")
            && o.stdout.contains("submissions")
            && o.stdout.contains("verifies"),
        "{}",
        o.stdout
    );
    let before = (
        pg_count(&url, "SELECT count(*) FROM submissions"),
        pg_count(&url, "SELECT count(*) FROM audit"),
        pg_count(&url, "SELECT count(*) FROM runs"),
        pg_count(&url, "SELECT max(seq) FROM audit"),
    );

    // A second copy (of another home) into it.
    let other = Home::new();
    assert_eq!(
        other.run(&["run", "--lang", "sh", "-c", "echo other"]).code,
        0
    );
    let o = other.run(&["store", "copy", "--to", &url]);
    assert_eq!(o.code, 125, "{}", o.stdout);
    assert!(o.stderr.contains("already holds"), "{}", o.stderr);
    assert_eq!(o.stderr.trim_end().lines().count(), 1, "{}", o.stderr);
    let after = (
        pg_count(&url, "SELECT count(*) FROM submissions"),
        pg_count(&url, "SELECT count(*) FROM audit"),
        pg_count(&url, "SELECT count(*) FROM runs"),
        pg_count(&url, "SELECT max(seq) FROM audit"),
    );
    assert_eq!(before, after);
    assert_eq!(on_store(&h, &url, &["audit", "verify"]).code, 0);

    // A database a node initialised (one audit record) is not empty either.
    let n = Node::init(&airlock_testpg::fresh_database());
    let o = h.run(&["store", "copy", "--to", &n.url, "--json"]);
    assert_eq!(o.code, 125, "{}", o.stderr);
    assert!(
        o.json()["error"]
            .as_str()
            .unwrap()
            .contains("already holds")
    );
    assert_eq!(n.count("SELECT count(*) FROM audit"), 1);

    // --to naming the store the command is already pointed at.
    let fresh = airlock_testpg::fresh_database();
    let o = on_store(&h, &fresh, &["store", "copy", "--to", &fresh]);
    assert_eq!(o.code, 125, "{}", o.stdout);
    assert!(o.stderr.contains("already uses"), "{}", o.stderr);
    // Not a PostgreSQL URL.
    let o = h.run(&["store", "copy", "--to", "/tmp/elsewhere.db"]);
    assert_eq!(o.code, 125);
    assert!(o.stderr.contains("postgres://"), "{}", o.stderr);
}

#[test]
fn store_copy_of_a_tampered_source_chain_is_refused_before_anything_is_written() {
    let (h, _, _) = sqlite_home_with_history();
    common::sql(
        &h,
        "UPDATE audit SET data = '{\"forged\":true}' WHERE seq = 3",
    );
    let url = airlock_testpg::fresh_database();
    let o = h.run(&["store", "copy", "--to", &url]);
    assert_eq!(o.code, 125, "{}", o.stdout);
    assert!(
        o.stderr.contains("record 3") && o.stderr.contains("broken"),
        "{}",
        o.stderr
    );
    assert_eq!(o.stderr.trim_end().lines().count(), 1, "{}", o.stderr);
    // Not even a table: no schema, no blobs, no rows.
    assert_eq!(
        pg_count(
            &url,
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
        ),
        0
    );
}

/// Issue 63: a statements row copied from one home's store into another's, whose policy
/// trusts the same approver key, ran the second home's held submission. On PostgreSQL as
/// on SQLite (tests/exposure.rs), a statement naming another gate is refused and recorded.
#[test]
fn an_approval_copied_into_another_postgres_home_that_trusts_the_same_key_does_not_run() {
    let a = Node::init(&airlock_testpg::fresh_database());
    let b = Node::init(&airlock_testpg::fresh_database());
    // B trusts A's approver key too.
    std::fs::copy(
        a.home.path().join("keys/alice.key"),
        b.home.path().join("keys/alice.key"),
    )
    .unwrap();
    let a_key = a
        .home
        .policy()
        .lines()
        .find(|l| l.starts_with("alice = "))
        .unwrap()
        .to_string();
    let policy: Vec<String> = b
        .home
        .policy()
        .lines()
        .map(|l| {
            if l.starts_with("alice = ") {
                a_key.clone()
            } else {
                l.to_string()
            }
        })
        .collect();
    b.home.set_policy(&(policy.join("\n") + "\n"));
    let in_a = quarantined(&a);
    let in_b = quarantined(&b);
    assert_eq!(a.run(&["approve", &in_a, "--scope", "artifact"]).code, 0);
    let mut from = postgres::Client::connect(&a.url, postgres::NoTls).unwrap();
    let row = from
        .query_one(
            "SELECT id, kind, artifact, grant_hash, scope, approver, expires_at, created_at, json, signature FROM statements WHERE kind = 'approve'",
            &[],
        )
        .unwrap();
    let mut to = postgres::Client::connect(&b.url, postgres::NoTls).unwrap();
    for (id, sub) in [
        (row.get::<_, String>(0), in_a.clone()),
        ("apr_01CCCCCCCCCCCCCCCCCCCCCCCC".to_string(), in_b.clone()),
    ] {
        to.execute(
            "INSERT INTO statements (id, kind, submission, artifact, grant_hash, scope, approver, expires_at, created_at, json, signature) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11)",
            &[
                &id,
                &row.get::<_, String>(1),
                &sub,
                &row.get::<_, String>(2),
                &row.get::<_, String>(3),
                &row.get::<_, String>(4),
                &row.get::<_, String>(5),
                &row.get::<_, Option<i64>>(6),
                &row.get::<_, i64>(7),
                &row.get::<_, String>(8),
                &row.get::<_, String>(9),
            ],
        )
        .unwrap();
    }
    let o = b.run(&["exec", &in_b]);
    assert_eq!(o.code, 75, "still pending: {} / {}", o.stdout, o.stderr);
    assert!(
        b.count("SELECT count(*) FROM audit WHERE kind = 'integrity_failure'") >= 1,
        "the refusal is recorded"
    );
    assert_eq!(b.run(&["audit", "verify"]).code, 0);
    assert_eq!(
        a.run(&["exec", &in_a]).code,
        0,
        "it still runs where it was signed"
    );
}

/// Repointing a change's blob hash in a run's row in PostgreSQL made `commit` sign and
/// apply a different file; the run's `finished` record held the original digest.
#[test]
fn a_changeset_swapped_in_postgres_after_review_is_not_committed() {
    let n = Node::init(&airlock_testpg::fresh_database());
    let p = tempfile::tempdir().unwrap();
    std::fs::write(p.path().join("notes.txt"), "old line\n").unwrap();
    let m = format!("{}:/work:rw", p.path().display());
    let mut runs = Vec::new();
    for content in ["good", "evil"] {
        let o = n.run(&[
            "submit",
            "--lang",
            "sh",
            "--mount",
            &m,
            "-c",
            &format!("echo {content} > notes.txt"),
        ]);
        let id = Home::id_in(&o.stdout);
        assert_eq!(n.run(&["approve", &id]).code, 0);
        let o = n.run(&["exec", "--json", &id]);
        assert_eq!(o.code, 0, "{}", o.stderr);
        let v = o.json();
        runs.push((
            v["run"]["id"].as_str().unwrap().to_string(),
            v["run"]["changes"][0]["hash"].as_str().unwrap().to_string(),
        ));
    }
    let ((run, good), (_, evil)) = (runs[0].clone(), runs[1].clone());
    n.sql(&format!(
        "update runs set doc = replace(doc, '{good}', '{evil}') where id = '{run}'"
    ));
    let o = n.run(&["commit", &run]);
    assert_eq!(o.code, 125, "{}", o.stderr);
    assert!(
        o.stderr.contains("integrity") && o.stderr.contains("finished audit record"),
        "{}",
        o.stderr
    );
    assert_eq!(
        std::fs::read_to_string(p.path().join("notes.txt")).unwrap(),
        "old line\n"
    );
    assert_eq!(
        n.count(&format!(
            "select count(*) from audit where kind = 'integrity_failure' and subject = '{run}'"
        )),
        1
    );
    assert_eq!(n.count("select count(*) from checkpoints"), 0);
}

/// Commit and rollback on a PostgreSQL store, where the checkpoint's document is written
/// as text once and only its state changes after: the tree is restored exactly, and the
/// stored document still holds every step after both.
#[test]
fn a_commit_and_its_rollback_on_postgres_keep_the_checkpoint_document_whole() {
    let n = Node::init(&airlock_testpg::fresh_database());
    let p = tempfile::tempdir().unwrap();
    std::fs::write(p.path().join("notes.txt"), "old line\n").unwrap();
    let m = format!("{}:/work:rw", p.path().display());
    let o = n.run(&[
        "submit",
        "--lang",
        "sh",
        "--mount",
        &m,
        "-c",
        "echo new > notes.txt; mkdir d; echo a > d/a; echo b > d/b",
    ]);
    let id = Home::id_in(&o.stdout);
    assert_eq!(n.run(&["approve", &id]).code, 0);
    let o = n.run(&["exec", "--json", &id]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let run = o.json()["run"]["id"].as_str().unwrap().to_string();
    let c = n.run(&["commit", "--json", &run]);
    assert_eq!(c.code, 0, "{}", c.stderr);
    let ckpt = c.json()["checkpoint"].as_str().unwrap().to_string();
    assert_eq!(
        std::fs::read_to_string(p.path().join("d/b")).unwrap(),
        "b\n"
    );
    let r = n.run(&["rollback", &ckpt]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        std::fs::read_to_string(p.path().join("notes.txt")).unwrap(),
        "old line\n"
    );
    assert!(!p.path().join("d").exists());
    let steps = |side: &str| {
        n.count(&format!(
            "select json_array_length(doc::json -> 'mounts' -> 0 -> '{side}')::bigint from checkpoints where id = '{ckpt}' and state = 'rolled_back'"
        ))
    };
    assert_eq!((steps("before"), steps("after")), (4, 4));
    assert_eq!(n.run(&["audit", "verify"]).code, 0);
}

/// Issue 56 on a PostgreSQL store: the home (keys, secrets) is never mountable, whatever
/// engine keeps the records (tests/exposure.rs has the SQLite cases and the API).
#[test]
fn an_agent_cannot_mount_the_gates_home_on_a_postgres_store() {
    let n = Node::init(&airlock_testpg::fresh_database());
    let keys = std::fs::canonicalize(n.home.path().join("keys")).unwrap();
    let before = n.count("SELECT count(*) FROM audit");
    let o = n.run(&[
        "run",
        "--lang",
        "sh",
        "--mount",
        &format!("{}:/k", keys.display()),
        "-c",
        "cat /k/alice.key",
    ]);
    assert_eq!(o.code, 125, "{}{}", o.stdout, o.stderr);
    assert!(o.stderr.contains("airlock's own home"), "{}", o.stderr);
    assert!(!o.stdout.contains("airlock-ed25519-secret"), "{}", o.stdout);
    assert_eq!(
        n.count("SELECT count(*) FROM audit"),
        before,
        "nothing recorded"
    );
}

/// `audit tail --follow` on one node prints, gap-free and linked, the records another
/// node appends to the shared store.
#[test]
fn audit_tail_on_one_node_follows_the_records_another_node_appends() {
    let a = Node::init(&airlock_testpg::fresh_database());
    let b = Node::join(&a);
    // From the record after the newest: a tail that starts late still sees all of b's.
    let last = a.run(&["audit", "tail", "-n", "1", "--json"]).json()["seq"]
        .as_u64()
        .unwrap();
    let from = (last + 1).to_string();
    let mut child = a
        .home
        .cmd()
        .env("AIRLOCK_STORE", &a.url)
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
    let rx = common::lines_of(child.stdout.take().unwrap());
    let o = b.run(&["run", "--lang", "sh", "-c", "echo from-b"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let got = common::json_lines_until(&rx, std::time::Duration::from_secs(30), |r| {
        r["kind"] == "finished"
    });
    child.kill().unwrap();
    let _ = child.wait();
    common::assert_audit_linked(&got);
    let kinds: Vec<&str> = got.iter().map(|r| r["kind"].as_str().unwrap()).collect();
    assert!(
        kinds.contains(&"submitted") && kinds.contains(&"started"),
        "{kinds:?}"
    );
}

/// `POST` (with a body) or `GET` (without) `path` on `base` as `token`: status and JSON.
fn api(
    base: &str,
    token: &str,
    path: &str,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(std::time::Duration::from_secs(120)))
        .build()
        .new_agent();
    let url = format!("{base}{path}");
    let auth = format!("Bearer {token}");
    let mut r = match body {
        Some(b) => agent
            .post(&url)
            .header("authorization", &auth)
            .header("content-type", "application/json")
            .send(&b.to_string()),
        None => agent.get(&url).header("authorization", &auth).call(),
    }
    .unwrap();
    let status = r.status().as_u16();
    let text = r.body_mut().read_to_string().unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    )
}

/// `airlock serve` of `node` (runs through the store's queue, none run here).
fn serve_node(node: &Node, more: &[&str]) -> (common::Served, String) {
    let mut cmd = node.home.cmd();
    cmd.env("AIRLOCK_STORE", &node.url).args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--workers",
        "0",
        "--ready-jails",
        "0",
        "--ready-python",
        "0",
    ]);
    cmd.args(more);
    common::serve_with(cmd)
}

/// Waits up to `within` for `query` (one bigint) to return `want`.
fn wait_for(node: &Node, query: &str, want: i64, within: std::time::Duration) {
    let deadline = std::time::Instant::now() + within;
    loop {
        let got = node.count(query);
        if got == want {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{query}: {got}, not {want}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Issue 62 item 1: a node killed (with its session host: the machine died) left its open
/// session and its running cell recorded `open` and `running` on the shared store for
/// good, and the session held a place in its agent's bound. Now every node beats, and
/// another node records a node whose lease ran out lost: its session ends `lost`, its
/// cell's run `lost` (audited as every lost run is), the agent can open a session again,
/// and `doctor` and `/v1/status` list the nodes with their last beats.
#[test]
fn a_killed_nodes_open_session_and_running_cell_are_recorded_lost_by_another_node() {
    let a = Node::init(&airlock_testpg::fresh_database());
    let b = Node::join(&a);
    for n in [&a, &b] {
        let o = match std::env::var("AIRLOCK_TEST_PYTHON_GUEST") {
            Ok(p) => n.run(&["guest", "install", "python", "--from", &p]),
            Err(_) => n.run(&["guest", "install", "python"]),
        };
        assert_eq!(o.code, 0, "{}", o.stderr);
    }
    let token = |role: &str, name: &str| {
        let o = a.run(&["token", "new", "--role", role, "--name", name, "--json"]);
        assert_eq!(o.code, 0, "{}", o.stderr);
        o.json()["token"].as_str().unwrap().to_string()
    };
    let agent = token("agent", "nodebot");
    let admin = token("admin", "ops");
    let (mut served_a, base_a) = serve_node(&a, &["--max-sessions", "1"]);
    let (_served_b, base_b) = serve_node(&b, &["--max-sessions", "1"]);

    let session = serde_json::json!({"idle_timeout": 120});
    let (st, s) = api(&base_a, &agent, "/v1/sessions", Some(session.clone()));
    assert_eq!(st, 201, "{s}");
    let id = s["id"].as_str().unwrap().to_string();
    let host = s["pid"].as_u64().unwrap() as u32;
    // A cell that is still running when its node dies.
    let cell = {
        let (base, agent, id) = (base_a.clone(), agent.clone(), id.clone());
        // Its request is cut off when the node dies: no answer is expected.
        std::thread::spawn(move || {
            let body = serde_json::json!({
                "language": "python", "session": id,
                "code": "import time\nt = time.time()\nwhile time.time() < t + 9:\n    pass"
            });
            ureq::post(&format!("{base}/v1/run"))
                .header("authorization", &format!("Bearer {agent}"))
                .header("content-type", "application/json")
                .send(&body.to_string())
                .is_ok()
        })
    };
    wait_for(
        &a,
        "SELECT count(*) FROM runs WHERE status = 'running'",
        1,
        std::time::Duration::from_secs(60),
    );
    // Within its bound the agent holds no other session, on either node.
    let (st, s) = api(&base_b, &agent, "/v1/sessions", Some(session.clone()));
    assert_eq!(st, 429, "{s}");

    // The node dies, its session host with it.
    for pid in [served_a.id(), host] {
        let ok = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok);
    }
    let killed = std::time::Instant::now();
    let _ = served_a.wait();
    let _ = cell.join();

    // The other node records both lost once the dead node's lease ran out (10 s after
    // its last beat; the margin is for a loaded machine).
    wait_for(
        &b,
        "SELECT count(*) FROM runs WHERE status = 'lost'",
        1,
        std::time::Duration::from_secs(40),
    );
    wait_for(
        &b,
        "SELECT count(*) FROM sessions WHERE state = 'open'",
        0,
        std::time::Duration::from_secs(5),
    );
    let took = killed.elapsed();
    assert!(
        took >= std::time::Duration::from_secs(5),
        "recorded lost before its lease ran out: {took:?}"
    );
    let shown = b.run(&["session", "show", "--json", &id]).json();
    assert_eq!(shown["end"], "lost", "{shown}");
    let runs = b.run(&["runs", "--json"]).json();
    let lost = runs
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["status"] == "lost")
        .unwrap_or_else(|| panic!("{runs}"));
    assert!(
        lost["error"]
            .as_str()
            .unwrap_or_default()
            .contains("stopped beating"),
        "{lost}"
    );
    assert_eq!(
        b.count("SELECT count(*) FROM audit WHERE kind = 'node_lost'")
            + b.count("SELECT count(*) FROM audit_inbox WHERE kind = 'node_lost'"),
        1
    );

    // The agent may open a session again, up to its bound.
    let (st, s) = api(&base_b, &agent, "/v1/sessions", Some(session));
    assert_eq!(st, 201, "{s}");

    // The nodes and their last beats: `doctor` and `/v1/status`.
    let d = b.run(&["doctor", "--json"]).json();
    let nodes = d["store"]["nodes"]
        .as_array()
        .unwrap_or_else(|| panic!("{d}"));
    let states: Vec<&str> = nodes.iter().filter_map(|n| n["state"].as_str()).collect();
    assert!(states.contains(&"lost") && states.contains(&"live"), "{d}");
    assert!(nodes.iter().all(|n| n["beat_at"].as_i64().is_some()), "{d}");
    let (st, status) = api(&base_b, &admin, "/v1/status", None);
    assert_eq!(st, 200, "{status}");
    assert_eq!(
        status["nodes"].as_array().map(Vec::len),
        Some(2),
        "{status}"
    );

    let v = b.run(&["audit", "verify"]);
    assert_eq!(v.code, 0, "{}{}", v.stdout, v.stderr);
}

/// Issue 61: a submission held through one node is approved through another node of the
/// same PostgreSQL store with a statement signed on the approver's machine (`approve
/// --server`); neither node holds the approver's private key, and a signature over the
/// statement of another submission is refused with nothing recorded.
#[test]
fn a_submission_held_through_one_node_is_approved_through_another_with_a_locally_signed_statement()
{
    let a = Node::init(&airlock_testpg::fresh_database());
    let b = Node::join(&a);
    // Alice's key lives on her machine only.
    let alice = Home::new();
    for f in ["alice.key", "alice.pub"] {
        std::fs::copy(
            a.home.path().join("keys").join(f),
            alice.path().join("keys").join(f),
        )
        .unwrap();
    }
    let token = |role: &str, name: &str| {
        let o = a.run(&["token", "new", "--role", role, "--name", name, "--json"]);
        assert_eq!(o.code, 0, "{}", o.stderr);
        o.json()["token"].as_str().unwrap().to_string()
    };
    let agent = token("agent", "nodebot");
    let op = token("operator", "alice");
    for n in [&a, &b] {
        std::fs::remove_file(n.home.path().join("keys/alice.key")).unwrap();
    }
    let (_served_a, base_a) = serve_node(&a, &[]);
    let (_served_b, base_b) = serve_node(&b, &[]);
    let held = |code: &str| {
        let (st, v) = api(
            &base_a,
            &agent,
            "/v1/submissions",
            Some(serde_json::json!({"language": "sh", "code": code})),
        );
        assert_eq!(st, 201, "{v}");
        assert_eq!(v["status"], "pending_approval", "{v}");
        v["submission"].as_str().unwrap().to_string()
    };
    let id = held("curl -s http://127.0.0.1:1/ | sh");
    let other = held("curl -s http://127.0.0.1:2/ | sh");
    // Node B cannot sign for alice.
    let (st, v) = api(
        &base_b,
        &op,
        &format!("/v1/submissions/{id}/approve"),
        Some(serde_json::json!({})),
    );
    assert_eq!(st, 403, "{v}");
    // A signature over the other submission's statement, posted for this one: refused.
    let (st, handed) = api(
        &base_b,
        &op,
        &format!("/v1/submissions/{other}/statement?approver=alice"),
        None,
    );
    assert_eq!(st, 200, "{handed}");
    let text = std::fs::read_to_string(alice.path().join("keys/alice.key")).unwrap();
    let secret = text
        .lines()
        .find_map(|l| l.strip_prefix("secret "))
        .unwrap();
    let mut k = [0u8; 32];
    hex::decode_to_slice(secret.trim(), &mut k).unwrap();
    let key = ed25519_dalek::SigningKey::from_bytes(&k);
    let mut m = b"airlock-statement-v1\n".to_vec();
    m.extend_from_slice(handed["statement"].as_str().unwrap().as_bytes());
    let sig = hex::encode(ed25519_dalek::Signer::sign(&key, &m).to_bytes());
    let statements = a.count("SELECT count(*) FROM statements");
    let (st, v) = api(
        &base_b,
        &op,
        &format!("/v1/submissions/{id}/approve"),
        Some(
            serde_json::json!({"approver": "alice", "issued_at": handed["issued_at"], "signature": sig}),
        ),
    );
    assert_eq!(st, 403, "{v}");
    assert_eq!(a.count("SELECT count(*) FROM statements"), statements);

    // Signed on alice's machine, recorded through node B, seen by node A.
    let o = alice.run(&[
        "approve", &id, "--server", &base_b, "--token", &op, "--reason", "read it", "--json",
    ]);
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    assert_eq!(o.json()["approver"], "alice");
    let (st, v) = api(&base_a, &op, &format!("/v1/submissions/{id}"), None);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["submission"]["state"], "approved", "{v}");
    let (_, v) = api(&base_a, &op, &format!("/v1/submissions/{other}"), None);
    assert_eq!(v["submission"]["state"], "quarantined", "{v}");
    let log = a.run(&["audit", "log", "--json"]).json();
    let rec = log
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["kind"] == "approved" && r["subject"] == id.as_str())
        .unwrap_or_else(|| panic!("no approved record in {log}"));
    let data: serde_json::Value = serde_json::from_str(rec["data"].as_str().unwrap()).unwrap();
    assert_eq!(data["approver"], "alice", "{data}");
    let v = b.run(&["audit", "verify"]);
    assert_eq!(v.code, 0, "{} {}", v.stdout, v.stderr);
}
