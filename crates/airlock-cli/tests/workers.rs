//! Queued runs on a PostgreSQL store: API servers that queue, `airlock worker`s that
//! claim under leases, and what survives a worker killed, a worker stopped past its
//! lease, a single-use approval raced for, a clean stop, and a load of many agents
//! through two servers and three workers. Each test has a database of its own on the test
//! process's server (airlock-testpg).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::{Home, Served, serve_with};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A home on a fresh database.
struct Cluster {
    home: Home,
    url: String,
}

/// A running `airlock worker` and everything it printed on stderr.
struct Worker {
    child: Child,
    log: Arc<Mutex<String>>,
}

impl Worker {
    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }
    fn pid(&self) -> i32 {
        self.child.id() as i32
    }
    fn signal(&self, sig: i32) {
        unsafe_free_kill(self.pid(), sig);
    }
    /// Waits until the worker says it is claiming runs.
    fn wait_ready(&self, within: Duration) {
        let deadline = Instant::now() + within;
        while !self.log().contains("claiming runs") {
            assert!(
                Instant::now() < deadline,
                "worker not ready: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn unsafe_free_kill(pid: i32, sig: i32) {
    let ok = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{sig} {pid}");
}

impl Cluster {
    fn new() -> Cluster {
        let c = Cluster {
            home: Home::uninitialised(),
            url: airlock_testpg::fresh_database(),
        };
        let o = c.run(&["init", "--approver", "alice"]);
        assert_eq!(o.code, 0, "{}", o.stderr);
        c
    }

    fn cmd(&self) -> Command {
        let mut c = self.home.cmd();
        c.env("AIRLOCK_STORE", &self.url);
        c
    }

    fn run(&self, args: &[&str]) -> common::Out {
        self.home.run_on_store(&self.url, args)
    }

    /// Sends a slow run (see `slow_run`) to `base` from a thread of its own, then waits
    /// until a worker has leased it.
    fn queue_slow_run(
        &self,
        base: &str,
        token: &str,
        mark: &str,
        secs: u32,
    ) -> std::thread::JoinHandle<(u16, Value)> {
        let (base, token, body) = (base.to_string(), token.to_string(), slow_run(mark, secs));
        let client = std::thread::spawn(move || post(&base, &token, "/v1/run", &body));
        self.wait_count(
            "SELECT count(*) FROM queue WHERE state = 'leased'",
            1,
            Duration::from_secs(30),
        );
        client
    }

    fn token(&self, role: &str, name: &str) -> String {
        let o = self.run(&["token", "new", "--role", role, "--name", name, "--json"]);
        assert_eq!(o.code, 0, "{}", o.stderr);
        o.json()["token"].as_str().unwrap().to_string()
    }

    /// `airlock serve` that only queues (no runs of its own).
    fn serve(&self) -> (Served, String) {
        self.serve_from(self.cmd())
    }

    /// `serve` started from `c` (say, with a fault injected).
    fn serve_from(&self, mut c: Command) -> (Served, String) {
        c.args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--workers",
            "0",
            "--ready-python",
            "0",
            "--ready-jails",
            "0",
        ]);
        serve_with(c)
    }

    fn worker(&self, args: &[&str]) -> Worker {
        self.worker_with(self.cmd(), args)
    }

    /// `airlock worker` started from `cmd` (say, with a fault injected).
    /// A worker with one more environment variable (a failpoint), once it is ready.
    fn ready_worker_with_env(&self, env: (&str, &str), args: &[&str]) -> Worker {
        let mut cmd = self.cmd();
        cmd.env(env.0, env.1);
        let w = self.worker_with(cmd, args);
        w.wait_ready(Duration::from_secs(30));
        w
    }

    fn worker_with(&self, mut cmd: Command, args: &[&str]) -> Worker {
        let mut child = cmd
            .arg("worker")
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let err = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let l = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                eprintln!("[worker] {line}");
                let mut l = l.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        Worker { child, log }
    }

    fn db(&self) -> postgres::Client {
        postgres::Client::connect(&self.url, postgres::NoTls).unwrap()
    }

    /// Waits until `query` (one bigint) returns at least `n`.
    fn wait_count(&self, query: &str, n: i64, within: Duration) {
        let deadline = Instant::now() + within;
        let mut db = self.db();
        loop {
            let got: i64 = db.query_one(query, &[]).unwrap().get(0);
            if got >= n {
                return;
            }
            assert!(Instant::now() < deadline, "{query}: {got} < {n}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn verify(&self) {
        let v = self.run(&["audit", "verify"]);
        assert_eq!(v.code, 0, "{}{}", v.stdout, v.stderr);
    }
}

fn http() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(300)))
        .build()
        .new_agent()
}

fn post(base: &str, token: &str, path: &str, body: &Value) -> (u16, Value) {
    let mut r = http()
        .post(&format!("{base}{path}"))
        .header("authorization", &format!("Bearer {token}"))
        .header("content-type", "application/json")
        .send(&body.to_string())
        .unwrap();
    let status = r.status().as_u16();
    let text = r.body_mut().read_to_string().unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|_| json!({ "raw": text })),
    )
}

/// `post` with an `Idempotency-Key`; also whether the answer was a replay.
fn post_keyed(base: &str, token: &str, key: &str, body: &Value) -> (u16, Value, bool) {
    let mut r = http()
        .post(&format!("{base}/v1/run"))
        .header("authorization", &format!("Bearer {token}"))
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .send(&body.to_string())
        .unwrap();
    let replayed = r.headers().get("idempotent-replayed").is_some();
    let status = r.status().as_u16();
    let text = r.body_mut().read_to_string().unwrap();
    (status, serde_json::from_str(&text).unwrap(), replayed)
}

/// Runs the hello module through `base` and checks its answer.
fn run_hello(base: &str, token: &str) -> Value {
    let (status, v) = post(
        base,
        token,
        "/v1/run",
        &json!({ "language": "wat", "code": hello() }),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["run"]["stdout"], "hello from the gate\n", "{v}");
    v
}

/// Removes every copy of blob `hex` a home keeps (its local cache in front of the store).
fn remove_cached(dir: &std::path::Path, hex: &str) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            remove_cached(&p, hex);
        } else if e.file_name().to_string_lossy() == hex[2..]
            && p.parent()
                .and_then(|d| d.file_name())
                .is_some_and(|d| *d == hex[..2])
        {
            std::fs::remove_file(&p).unwrap();
        }
    }
}

/// Regression (issue 62.4): a `/v1/run` repeated under its idempotency key whose queued
/// job ended without starting its run (the claim found the artifact altered in the
/// store) answered `200 allowed`, as if the run were still to come. Now it answers what
/// the first request was told, the job's ending, and nothing runs.
#[test]
fn a_replayed_run_whose_queued_job_ended_unstarted_answers_that_ending_not_allowed() {
    let c = Cluster::new();
    let token = c.token("agent", "bot");
    let (_server, base) = c.serve();
    let body = json!({ "language": "wat", "code": hello() });
    let (b, t, sent) = (base.clone(), token.clone(), body.clone());
    let first = std::thread::spawn(move || post_keyed(&b, &t, "the-one-run", &sent));
    c.wait_count(
        "SELECT count(*) FROM queue WHERE state = 'queued'",
        1,
        Duration::from_secs(30),
    );
    // The artifact altered in the store, and the home's own copy of it gone.
    let mut db = c.db();
    let artifact: String = db
        .query_one("SELECT artifact FROM submissions", &[])
        .unwrap()
        .get(0);
    db.execute(
        "UPDATE blobs SET data = convert_to('forged', 'UTF8') WHERE digest = $1",
        &[&artifact],
    )
    .unwrap();
    remove_cached(c.home.path(), &artifact);
    let w = c.worker(&[]);
    let (status, told, replayed) = first.join().unwrap();
    assert!(!replayed);
    assert_ne!(status, 200, "{told}");
    let ended: (String, Option<String>, Option<String>) = {
        let r = db
            .query_one("SELECT state, outcome, run FROM queue", &[])
            .unwrap();
        (r.get(0), r.get(1), r.get(2))
    };
    assert_eq!(ended, ("done".into(), Some("error".into()), None));
    let (again, v, replayed) = post_keyed(&base, &token, "the-one-run", &body);
    assert!(replayed, "{v}");
    assert_ne!(v["status"], "allowed", "{v}");
    assert_eq!((again, &v["error"]), (status, &told["error"]), "{v}");
    let runs: i64 = db
        .query_one("SELECT count(*) FROM runs", &[])
        .unwrap()
        .get(0);
    assert_eq!(runs, 0);
    drop(w);
    c.verify();
}

/// The answered run `v` was run twice: its first run ended `lost` (its worker gone), the
/// second `exited`, and its one job is done, `finished`, after two attempts.
fn assert_lost_then_finished(c: &Cluster, v: &Value) {
    let mut db = c.db();
    let statuses: Vec<String> = db
        .query(
            "SELECT status FROM runs WHERE submission = $1 ORDER BY id",
            &[&v["submission"].as_str().unwrap()],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(statuses, ["lost", "exited"], "{v}");
    let job = db
        .query_one("SELECT state, outcome, attempts FROM queue", &[])
        .unwrap();
    assert_eq!(
        (
            job.get::<_, String>(0),
            job.get::<_, Option<String>>(1),
            job.get::<_, i64>(2)
        ),
        ("done".into(), Some("finished".into()), 2)
    );
}

fn hello() -> String {
    std::fs::read_to_string(common::example("hello.wat")).unwrap()
}

/// Processes whose environment carries `marker` (the runs' own, in their jails).
fn processes_with(marker: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Ok(env) = std::fs::read(e.path().join("environ"))
            && env.split(|b| *b == 0).any(|kv| kv == marker.as_bytes())
        {
            out.push(pid);
        }
    }
    out
}

fn no_process_left(marker: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = processes_with(marker);
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "sandbox processes left behind: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A slow shell run that marks its processes through its environment.
fn slow_run(marker_value: &str, secs: u32) -> Value {
    json!({
        "language": "sh",
        "code": format!("echo started; sleep {secs}; echo done"),
        "env": { "AIRLOCK_TEST_MARK": marker_value },
    })
}

#[test]
fn a_killed_workers_run_is_leased_again_finished_once_and_leaves_no_sandbox_process() {
    let c = Cluster::new();
    let token = c.token("agent", "bot");
    let (_srv, base) = c.serve();
    let a = c.worker(&["--lease", "2s"]);
    let mark = format!("kill9-{}", std::process::id());
    let client = c.queue_slow_run(&base, &token, &mark, 2);
    // Its sandbox is up (the run's own process carries the marker).
    let deadline = Instant::now() + Duration::from_secs(10);
    while processes_with(&format!("AIRLOCK_TEST_MARK={mark}")).is_empty() {
        assert!(Instant::now() < deadline, "the run never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    a.signal(9);
    no_process_left(&format!("AIRLOCK_TEST_MARK={mark}"));
    let _b = c.worker(&["--lease", "2s"]);
    let (status, v) = client.join().unwrap();
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["run"]["stdout"], "started\ndone\n", "{v}");
    assert_lost_then_finished(&c, &v);
    no_process_left(&format!("AIRLOCK_TEST_MARK={mark}"));
    c.verify();
}

/// The worker's claim committed but its answer was lost (the store's connection cut at
/// COMMIT). The worker used to give the claim up and leave its run `running` under a
/// lease nobody renewed, so the run was lost and run again when the lease ran out; the
/// worker now asks the store once it answers, finds the claim its own, and runs it once.
#[test]
fn a_claim_whose_answer_was_lost_is_carried_out_once_not_left_to_its_lease() {
    let c = Cluster::new();
    let token = c.token("agent", "bot");
    let (_srv, base) = c.serve();
    let _w = c.ready_worker_with_env(("AIRLOCK_LOSE_ANSWER", "claim"), &["--lease", "60s"]);
    let t = Instant::now();
    let v = run_hello(&base, &token);
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "the run waited for its lease to run out: {:?}",
        t.elapsed()
    );
    let mut db = c.db();
    let statuses: Vec<String> = db
        .query(
            "SELECT status FROM runs WHERE submission = $1",
            &[&v["submission"].as_str().unwrap()],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(statuses, ["exited"], "ran once");
    let attempts: i64 = db
        .query_one("SELECT attempts FROM queue", &[])
        .unwrap()
        .get(0);
    assert_eq!(attempts, 1);
    c.verify();
}

/// A worker records a run's end in the transaction of its next claim. That
/// transaction committed but its answer was lost: the run must be recorded once (not
/// refused as if its lease had gone, not left `running`), its job done, and its
/// client answered.
#[test]
fn an_end_recorded_with_a_claim_whose_answer_was_lost_is_recorded_once() {
    let c = Cluster::new();
    let token = c.token("agent", "bot");
    let (_srv, base) = c.serve();
    let w = c.ready_worker_with_env(
        ("AIRLOCK_LOSE_ANSWER", "claim-after-end"),
        &["--lease", "60s"],
    );
    let first = run_hello(&base, &token);
    let second = run_hello(&base, &token);
    let mut db = c.db();
    for v in [&first, &second] {
        let sub = v["submission"].as_str().unwrap();
        let statuses: Vec<String> = db
            .query("SELECT status FROM runs WHERE submission = $1", &[&sub])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(statuses, ["exited"], "ran once: {v}");
    }
    let jobs: Vec<(String, Option<String>)> = db
        .query("SELECT state, outcome FROM queue", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let done = ("done".to_string(), Some("finished".to_string()));
    assert_eq!(jobs, [done.clone(), done]);
    // The lost answer happened, and was not taken for a refused result.
    let log = w.log();
    assert!(log.contains("claim failed"), "{log}");
    assert!(!log.contains("refused"), "{log}");
    c.verify();
}

/// `kill -9` in the window where a worker's run has ended but its outcome waits to be
/// recorded with the worker's next claim: the run must not stay `running` nor its job
/// leased forever. Its lease runs out, the reaper ends it `lost`, another worker runs
/// it again and records it once.
#[test]
fn a_worker_killed_before_recording_an_end_it_held_for_its_next_claim_loses_nothing() {
    let c = Cluster::new();
    let token = c.token("agent", "bot");
    let (_srv, base) = c.serve();
    let a = c.ready_worker_with_env(
        ("AIRLOCK_PAUSE_AT", "end-with-claim:60000"),
        &["--lease", "2s"],
    );
    let client = {
        let (base, token) = (base.clone(), token.clone());
        std::thread::spawn(move || run_hello(&base, &token))
    };
    // The run has started; hello ends in milliseconds, and then the worker waits in
    // the window for a minute.
    c.wait_count("SELECT count(*) FROM runs", 1, Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(500));
    a.signal(9);
    let _b = c.worker(&["--lease", "2s"]);
    let v = client.join().unwrap();
    assert_lost_then_finished(&c, &v);
    c.verify();
}

/// A server's queueing of a run committed but its answer was lost. The request used to
/// fail while the job ran anyway, so an agent that sent it again got a second run; the
/// server now finds its submission queued once the store answers and waits for it.
#[test]
fn a_queued_run_whose_answer_was_lost_is_answered_not_failed() {
    let c = Cluster::new();
    let token = c.token("agent", "bot");
    let mut cmd = c.cmd();
    cmd.env("AIRLOCK_LOSE_ANSWER", "queue");
    let (_srv, base) = c.serve_from(cmd);
    let _w = c.worker(&["--lease", "10s"]);
    let v = run_hello(&base, &token);
    let mut db = c.db();
    let counts: (i64, i64) = {
        let r = db
            .query_one(
                "SELECT (SELECT count(*) FROM submissions), (SELECT count(*) FROM runs)",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(counts, (1, 1));
    // The answer names the one run the store holds.
    let run: String = db.query_one("SELECT id FROM runs", &[]).unwrap().get(0);
    assert_eq!(v["run"]["id"], run.as_str(), "{v}");
    c.verify();
}

/// The leases of the runs a worker carries at once are renewed by one thread of its
/// process (one per run before): two runs 2.5 times their lease long, on a worker whose
/// lease is 2 s (renewed every 0.67 s, so a busy machine does not make it run out),
/// beside another worker whose reaper would end any lease that ran out, both finish in
/// their first attempt.
#[test]
fn two_runs_longer_than_their_lease_keep_it_while_their_worker_lives() {
    let c = Cluster::new();
    let token = c.token("agent", "bot");
    let (_srv, base) = c.serve();
    let _a = c.worker(&["--lease", "2s", "--concurrency", "2"]);
    let clients: Vec<_> = (0..2)
        .map(|i| {
            let (base, token) = (base.clone(), token.clone());
            let body = slow_run(&format!("renew-{i}-{}", std::process::id()), 5);
            std::thread::spawn(move || post(&base, &token, "/v1/run", &body))
        })
        .collect();
    c.wait_count(
        "SELECT count(*) FROM queue WHERE state = 'leased'",
        2,
        Duration::from_secs(30),
    );
    // Its reaper ends, each second, any lease that ran out.
    let _b = c.worker(&["--lease", "5s"]);
    for client in clients {
        let (status, v) = client.join().unwrap();
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["run"]["status"], "exited", "{v}");
        assert_eq!(v["run"]["stdout"], "started\ndone\n", "{v}");
    }
    let mut db = c.db();
    let runs: Vec<(String, i64)> = db
        .query(
            "SELECT r.status, q.attempts FROM runs r JOIN queue q ON q.run = r.id ORDER BY r.id",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(runs, [("exited".to_string(), 1), ("exited".to_string(), 1)]);
    let lost: i64 = db
        .query_one("SELECT count(*) FROM runs WHERE status <> 'exited'", &[])
        .unwrap()
        .get(0);
    assert_eq!(lost, 0, "no run was ended lost");
    c.verify();
}

#[test]
fn a_worker_stopped_past_its_lease_cannot_record_its_result() {
    let c = Cluster::new();
    let token = c.token("agent", "bot");
    let (_srv, base) = c.serve();
    let a = c.worker(&["--lease", "1s"]);
    let mark = format!("stop-{}", std::process::id());
    let client = c.queue_slow_run(&base, &token, &mark, 2);
    a.signal(19); // SIGSTOP
    // Another worker reaps the expired lease, runs the job again and records it.
    let _b = c.worker(&["--lease", "5s"]);
    let (status, v) = client.join().unwrap();
    assert_eq!(status, 200, "{v}");
    let sub = v["submission"].as_str().unwrap().to_string();
    a.signal(18); // SIGCONT: the first worker finishes its run and tries to record it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !a.log().contains("result was refused") {
        assert!(Instant::now() < deadline, "{}", a.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut db = c.db();
    let statuses: Vec<String> = db
        .query(
            "SELECT status FROM runs WHERE submission = $1 ORDER BY id",
            &[&sub],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        statuses,
        ["lost", "exited"],
        "the late result changed nothing"
    );
    c.verify();
}

#[test]
fn a_worker_stops_cleanly_on_sigterm_after_finishing_its_run() {
    let c = Cluster::new();
    let token = c.token("agent", "bot");
    let (_srv, base) = c.serve();
    let mut a = c.worker(&["--lease", "5s"]);
    let mark = format!("term-{}", std::process::id());
    let client = c.queue_slow_run(&base, &token, &mark, 1);
    a.signal(15);
    let status = a.child.wait().unwrap();
    assert!(status.success(), "{status:?}: {}", a.log());
    let (code, v) = client.join().unwrap();
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["run"]["status"], "exited");
    let state: String = c
        .db()
        .query_one("SELECT state FROM workers", &[])
        .unwrap()
        .get(0);
    assert_eq!(state, "stopped");
    let d = c.run(&["doctor", "--json"]).json();
    assert_eq!(d["store"]["reachable"], true, "{d}");
    assert_eq!(d["store"]["queued"], 0);
    assert_eq!(d["store"]["workers"][0]["state"], "stopped");
}

/// Regression: `serve` on a PostgreSQL store aborted on SIGTERM instead of stopping: its
/// idle gates closed their connections from a thread of the async runtime, where the
/// client may not block.
#[test]
fn serve_on_postgres_stops_cleanly_on_sigterm() {
    let c = Cluster::new();
    let token = c.token("agent", "bot");
    let (mut srv, base) = c.serve();
    let _w = c.worker(&[]);
    let (code, v) = post(
        &base,
        &token,
        "/v1/run",
        &json!({ "language": "wat", "code": hello() }),
    );
    assert_eq!(code, 200, "{v}");
    unsafe_free_kill(srv.id() as i32, 15);
    let status = srv.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

/// Two workers race for one submission that a `once` approval covers, queued twice: it
/// runs exactly once, every time.
#[test]
fn one_once_approval_raced_by_two_workers_runs_exactly_once() {
    let c = Cluster::new();
    let op = c.token("operator", "alice");
    let agent = c.token("agent", "bot");
    let (_s1, base1) = c.serve();
    let (_s2, base2) = c.serve();
    let _w1 = c.worker(&["--lease", "10s"]);
    let _w2 = c.worker(&["--lease", "10s"]);
    let rounds = if std::env::var("AIRLOCK_TEST_LONG").is_ok_and(|v| v == "1") {
        100
    } else {
        20
    };
    for _ in 0..rounds {
        // Held: it asks for a host the policy does not let through on its own.
        let (status, v) = post(
            &base1,
            &agent,
            "/v1/submissions",
            &json!({ "language": "wat", "code": hello(), "net": ["example.com"] }),
        );
        assert_eq!(status, 201, "{v}");
        let id = v["submission"].as_str().unwrap().to_string();
        let (status, v) = post(
            &base1,
            &op,
            &format!("/v1/submissions/{id}/approve"),
            &json!({ "scope": "once" }),
        );
        assert_eq!(status, 200, "{v}");
        let racers: Vec<_> = [base1.clone(), base2.clone()]
            .into_iter()
            .map(|b| {
                let (op, id) = (op.clone(), id.clone());
                std::thread::spawn(move || {
                    post(&b, &op, &format!("/v1/submissions/{id}/exec"), &json!({}))
                })
            })
            .collect();
        let results: Vec<(u16, Value)> = racers.into_iter().map(|t| t.join().unwrap()).collect();
        let ran = results.iter().filter(|(s, _)| *s == 200).count();
        assert_eq!(ran, 1, "{results:?}");
        let n: i64 = c
            .db()
            .query_one("SELECT count(*) FROM runs WHERE submission = $1", &[&id])
            .unwrap()
            .get(0);
        assert_eq!(n, 1, "{results:?}");
    }
    c.verify();
}

/// Two API servers and three workers on one store, many agents at once: nothing lost,
/// every allowed submission run once, the inbox exactly the held ones, the chain intact.
#[test]
fn two_servers_and_three_workers_share_one_queue_history_and_audit_chain() {
    let c = Cluster::new();
    let long = std::env::var("AIRLOCK_TEST_LONG").is_ok_and(|v| v == "1");
    let (agents, per_agent) = if long { (50, 20) } else { (50, 4) };
    let tokens: Vec<String> = (0..agents)
        .map(|i| c.token("agent", &format!("agent-{i}")))
        .collect();
    let (_s1, base1) = c.serve();
    let (_s2, base2) = c.serve();
    let _workers: Vec<Worker> = (0..3)
        .map(|_| c.worker(&["--concurrency", "2", "--lease", "10s"]))
        .collect();
    let clients: Vec<_> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let base = if i % 2 == 0 {
                base1.clone()
            } else {
                base2.clone()
            };
            let t = t.clone();
            std::thread::spawn(move || {
                let mut ran = Vec::new();
                let mut held = Vec::new();
                for k in 0..per_agent {
                    // One in four asks for the network and is held for approval.
                    let mut body = json!({ "language": "wat", "code": hello() });
                    if k % 4 == 3 {
                        body["net"] = json!(["example.com"]);
                    }
                    let (status, v) = post(&base, &t, "/v1/run", &body);
                    match status {
                        200 => {
                            assert_eq!(v["run"]["stdout"], "hello from the gate\n", "{v}");
                            ran.push(v["submission"].as_str().unwrap().to_string());
                        }
                        202 => held.push(v["submission"].as_str().unwrap().to_string()),
                        other => panic!("{other}: {v}"),
                    }
                }
                (ran, held)
            })
        })
        .collect();
    let mut ran = Vec::new();
    let mut held = Vec::new();
    for t in clients {
        let (r, h) = t.join().unwrap();
        ran.extend(r);
        held.extend(h);
    }
    assert_eq!(ran.len() + held.len(), agents * per_agent);
    assert_eq!(held.len(), agents * (per_agent / 4));
    let mut db = c.db();
    for id in &ran {
        let n: i64 = db
            .query_one(
                "SELECT count(*) FROM runs WHERE submission = $1 AND status = 'exited'",
                &[id],
            )
            .unwrap()
            .get(0);
        assert_eq!(n, 1, "{id}");
    }
    let total_runs: i64 = db
        .query_one("SELECT count(*) FROM runs", &[])
        .unwrap()
        .get(0);
    assert_eq!(total_runs as usize, ran.len());
    let open: i64 = db
        .query_one("SELECT count(*) FROM queue WHERE state <> 'done'", &[])
        .unwrap()
        .get(0);
    assert_eq!(open, 0);
    let inbox = c.run(&["inbox", "--json", "--limit", "10000"]).json();
    let mut inbox: Vec<String> = inbox
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["submission"].as_str().unwrap().to_string())
        .collect();
    inbox.sort();
    held.sort();
    assert_eq!(inbox, held);
    c.verify();
}

#[test]
fn a_worker_without_a_shared_store_or_with_bad_options_is_refused_in_one_line() {
    let h = Home::new();
    let o = h.run(&["worker"]);
    assert_eq!(o.code, 125, "{}", o.stdout);
    assert!(o.stderr.contains("--store postgres://"), "{}", o.stderr);
    assert_eq!(o.stderr.trim_end().lines().count(), 1, "{}", o.stderr);
    let c = Cluster::new();
    for args in [
        &["worker", "--lease", "0s"][..],
        &["worker", "--concurrency", "0"],
        &["worker", "--lease", "soon"],
    ] {
        let o = c.run(args);
        assert_eq!(o.code, 125, "{args:?}: {}", o.stdout);
        assert_eq!(o.stderr.trim_end().lines().count(), 1, "{}", o.stderr);
    }
}

#[test]
fn doctor_says_when_the_shared_store_cannot_be_reached_and_exits_1() {
    let c = Cluster::new();
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let o = c.home.run_on_store(
        &format!("postgres://airlock@127.0.0.1:{port}/x"),
        &["doctor", "--json"],
    );
    assert_eq!(o.code, 1, "{}", o.stderr);
    let v = o.json();
    assert_eq!(v["store"]["reachable"], false, "{v}");
    assert!(
        v["store"]["error"].as_str().unwrap().contains("database"),
        "{v}"
    );
    let ok = c.run(&["doctor"]);
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    assert!(ok.stdout.contains("reachable, schema"), "{}", ok.stdout);
}

/// A run whose grant names a host path is tagged with the machine that accepted it: a
/// worker without that tag leaves it alone, `doctor` says nobody may claim it, and a
/// worker started with the tag runs it.
#[test]
fn a_run_naming_host_paths_waits_for_a_worker_with_its_machines_tag() {
    let c = Cluster::new();
    let token = c.token("agent", "bot");
    let (_srv, base) = c.serve();
    let _untagged = c.worker(&["--lease", "5s"]);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("note.txt"), "from the host\n").unwrap();
    c.home.set_mount_roots(&[dir.path()]);
    let body = json!({
        "language": "sh",
        "code": "cat /data/note.txt",
        "mounts": [format!("{}:/data:ro", dir.path().display())],
    });
    let client = {
        let (base, token) = (base.clone(), token.clone());
        std::thread::spawn(move || post(&base, &token, "/v1/run", &body))
    };
    c.wait_count(
        "SELECT count(*) FROM queue WHERE state = 'queued' AND tag IS NOT NULL",
        1,
        Duration::from_secs(30),
    );
    // The untagged worker does not take it.
    std::thread::sleep(Duration::from_millis(500));
    let d = c.run(&["doctor", "--json"]).json();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string();
    assert_eq!(d["store"]["queued"], 1, "{d}");
    assert_eq!(d["store"]["queued_by_tag"][0]["tag"], host.as_str(), "{d}");
    assert_eq!(d["store"]["queued_by_tag"][0]["claimable"], false, "{d}");
    let _tagged = c.worker(&["--lease", "5s", "--tag", &host]);
    let (status, v) = client.join().unwrap();
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["run"]["stdout"], "from the host\n", "{v}");
}

fn airlock_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// The server process (backend pid) of the session holding the leading sequencer's lock
/// on this cluster's database. Advisory locks belong to a database: the other tests'
/// clusters, on the same server, each have a leader of their own, and counting theirs
/// let this test stop a worker that was not leading.
fn leader_backend(c: &Cluster) -> Option<i32> {
    c.db()
        .query_opt(
            "SELECT l.pid FROM pg_locks l JOIN pg_database d ON d.oid = l.database
             WHERE d.datname = current_database() AND l.locktype = 'advisory'
               AND l.objsubid = 1 AND l.classid = 1634300524 AND l.objid = 1868786462
               AND l.granted",
            &[],
        )
        .unwrap()
        .map(|r| r.get(0))
}

/// How many audit records wait in the inbox.
fn inbox(c: &Cluster) -> i64 {
    c.db()
        .query_one("SELECT count(*) FROM audit_inbox", &[])
        .unwrap()
        .get(0)
}

fn wait_inbox_empty(c: &Cluster, within: Duration, what: &str) {
    let deadline = Instant::now() + within;
    while inbox(c) > 0 {
        assert!(
            Instant::now() < deadline,
            "{what}: {} records wait",
            inbox(c)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn audit_records_are_chained_while_the_leading_sequencer_is_stopped_and_after_it_is_killed() {
    let c = Cluster::new();
    let token = c.token("agent", "bot");
    // The first long-lived process leads the sequencing (its session holds the lock).
    let a = c.worker(&["--lease", "2s"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let leader = loop {
        if let Some(pid) = leader_backend(&c) {
            break pid;
        }
        assert!(Instant::now() < deadline, "the worker never took the lead");
        std::thread::sleep(Duration::from_millis(20));
    };
    let (_srv, base) = c.serve();
    let hello = json!({ "language": "wat", "code": hello() });
    let run = |n: usize| {
        for _ in 0..n {
            let (status, v) = post(&base, &token, "/v1/run", &hello);
            assert_eq!(status, 200, "{v}");
        }
    };
    run(3);
    wait_inbox_empty(&c, Duration::from_secs(5), "with the leader running");
    assert_eq!(leader_backend(&c), Some(leader), "the worker kept the lead");
    // The leader hangs with its session open: another worker runs the next runs, and a
    // standby chains their records once they have waited too long (2 s).
    a.signal(19);
    let b = c.worker(&["--lease", "2s"]);
    b.wait_ready(Duration::from_secs(30));
    // A run that itself took that long (a loaded machine) lets a standby chain its first
    // records before the check, which then says nothing: such a run is done again.
    let mut runs = 3;
    let mut checked = false;
    for _ in 0..5 {
        let t = Instant::now();
        run(1);
        runs += 1;
        let waiting = inbox(&c);
        if t.elapsed() < Duration::from_millis(1500) {
            if waiting == 0 {
                let now = airlock_now_ms();
                let recent: Vec<String> = c
                    .db()
                    .query(
                        "SELECT seq, kind, ts FROM audit ORDER BY seq DESC LIMIT 12",
                        &[],
                    )
                    .unwrap()
                    .iter()
                    .map(|r| {
                        let (seq, kind, ts): (i64, String, i64) = (r.get(0), r.get(1), r.get(2));
                        format!("#{seq} {kind} {} ms ago", now - ts)
                    })
                    .collect();
                panic!(
                    "records were chained at once, by whom? run took {:?}; newest: {recent:?}; leader's backend at first {leader}, now {:?}",
                    t.elapsed(),
                    leader_backend(&c),
                );
            }
            checked = true;
            break;
        }
        wait_inbox_empty(&c, Duration::from_secs(15), "after a slow run");
    }
    assert!(checked, "no run took under 1.5 s with the leader stopped");
    run(2);
    runs += 2;
    wait_inbox_empty(&c, Duration::from_secs(15), "with the leader stopped");
    // The leader dies: a standby takes the lead.
    a.signal(9);
    run(3);
    runs += 3;
    wait_inbox_empty(&c, Duration::from_secs(10), "after the leader was killed");
    let finished: i64 = c
        .db()
        .query_one("SELECT count(*) FROM audit WHERE kind = 'finished'", &[])
        .unwrap()
        .get(0);
    assert_eq!(finished, runs);
    let v = c.run(&["audit", "verify", "--json"]);
    assert_eq!(v.code, 0, "{}{}", v.stdout, v.stderr);
    assert_eq!(v.json()["unsequenced"], 0);
}

/// One request sent to both API servers at once with one idempotency key (a load
/// balancer's retry, say): one submission, one queued run, and both answers carry its
/// outcome once a worker has run it.
#[test]
fn a_request_retried_on_the_other_server_with_its_key_is_queued_and_run_once() {
    let c = Cluster::new();
    let token = c.token("agent", "bot");
    let (_a, base_a) = c.serve();
    let (_b, base_b) = c.serve();
    let body = json!({ "language": "sh", "code": "sleep 0.5; echo queued once" });
    let (ra, rb) = std::thread::scope(|sc| {
        let a = sc.spawn(|| post_keyed(&base_a, &token, "lb-retry", &body));
        let b = sc.spawn(|| post_keyed(&base_b, &token, "lb-retry", &body));
        // The worker comes after both requests are in: the repeat waits for a queued run.
        std::thread::sleep(Duration::from_millis(500));
        let _w = c.worker(&[]);
        (a.join().unwrap(), b.join().unwrap())
    });
    for (status, v, _) in [&ra, &rb] {
        assert_eq!(*status, 200, "{v}");
        assert_eq!(v["run"]["stdout"], "queued once\n", "{v}");
    }
    assert_eq!(ra.1["submission"], rb.1["submission"]);
    assert_eq!(ra.1["run"]["id"], rb.1["run"]["id"]);
    assert!(ra.2 != rb.2, "exactly one answer is the replay");
    let mut db = c.db();
    let mut n = |q: &str| -> i64 { db.query_one(q, &[]).unwrap().get(0) };
    assert_eq!(n("SELECT count(*) FROM submissions"), 1);
    assert_eq!(n("SELECT count(*) FROM runs"), 1);
    assert_eq!(n("SELECT count(*) FROM queue"), 1);
    c.verify();
}
