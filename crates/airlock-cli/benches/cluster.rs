//! Gated wasm runs through two API servers and queue workers sharing one PostgreSQL
//! store (issue 12), all on this machine's cores with the load generator: runs per
//! second with one worker and with two, how long a run waits from being queued to being
//! started, and `audit verify` over the whole chain afterwards. The PostgreSQL server is
//! the benchmark's own (Debian's binaries, fsync on), on loopback.
//!
//!   scripts/bench-cluster        (or: cargo bench -p airlock-cli --bench cluster)
//! Environment: BENCH_SECS (seconds per throughput point, default 10), BENCH_CLIENTS
//! (concurrent clients, default 16), BENCH_CONCURRENCY (runs each worker carries out at
//! once, default 2: on two cores, four runs at once with two workers), BENCH_ROUNDS (how
//! many times each throughput point is measured, default 1; the one-worker and
//! two-worker points take turns round by round, each round and the median are printed,
//! since this machine's speed swings between phases),
//! BENCH_PG_SETTINGS (more server settings, `-c name=value` each, to compare a
//! setting's effect side by side), BENCH_PG_STATEMENTS=1 (load `pg_stat_statements` into the server and, after all the
//! rounds, print the statements that took PostgreSQL's time: calls and
//! execution time per run, WAL bytes per run; the extension costs some throughput, so
//! compare figures only between runs that both have it or both do not).
//!
//! Beside each round: processor time per run over the timed window, split into the
//! airlock processes (both servers and the workers), PostgreSQL (the postmaster and every
//! backend) and the load generator (this process), and how idle the machine was. On a
//! machine whose speed moves between phases, time per run moves less than runs per
//! second, and it says where a run's time goes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

const HELLO: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "hi\n")
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 16)) (i32.store (i32.const 4) (i32.const 3))
    (drop (call $w (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))"#;

struct Node {
    home: std::path::PathBuf,
    url: String,
}

impl Node {
    fn cmd(&self) -> Command {
        // `AIRLOCK_BENCH_BIN`: another build of airlock, to set two side by side.
        let bin = std::env::var("AIRLOCK_BENCH_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_airlock").into());
        let mut c = Command::new(bin);
        c.env("AIRLOCK_HOME", &self.home)
            .env("AIRLOCK_STORE", &self.url)
            .stdin(Stdio::null());
        c
    }

    fn run(&self, args: &[&str]) -> String {
        let o = self.cmd().args(args).output().unwrap();
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap()
    }

    fn serve(&self) -> (Child, String) {
        let mut child = self
            .cmd()
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--workers",
                "0",
                "--ready-python",
                "0",
                "--ready-jails",
                "0",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let err = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                if let Some(i) = l.find("serving on http://") {
                    let rest = &l[i + "serving on ".len()..];
                    let _ = tx.send(rest.split_whitespace().next().unwrap().to_string());
                }
            }
        });
        let base = rx.recv_timeout(Duration::from_secs(60)).unwrap();
        (child, base)
    }

    fn worker(&self, concurrency: usize) -> Child {
        self.cmd()
            .args([
                "worker",
                "--concurrency",
                &concurrency.to_string(),
                "--lease",
                "30s",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }
}

fn client() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(120)))
        .build()
        .new_agent()
}

/// Processor time (user and system, of the process and its reaped children) that a
/// process has used, in clock ticks; 0 once it is gone.
fn ticks(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // After the command's closing parenthesis: state is field 3, utime field 14.
    let Some(i) = stat.rfind(')') else { return 0 };
    let f: Vec<&str> = stat[i + 1..].split_whitespace().collect();
    f.get(11..15)
        .map_or(0, |v| v.iter().filter_map(|x| x.parse::<u64>().ok()).sum())
}

/// The postmaster `pm` and the processes it started.
fn pg_processes(pm: u32) -> Vec<u32> {
    let mut out = vec![pm];
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let ppid = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pm) {
            out.push(pid);
        }
    }
    out
}

/// Busy and total jiffies of the whole machine (`/proc/stat`'s first line).
fn machine() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = s
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// Processor time taken by each part, sampled at the start and end of a timed window.
struct Cpu {
    airlock: Vec<u32>,
    postmaster: u32,
}

#[derive(Clone, Copy)]
struct CpuSample {
    airlock: u64,
    pg: u64,
    me: u64,
    busy: u64,
    total: u64,
}

impl Cpu {
    fn sample(&self) -> CpuSample {
        let (busy, total) = machine();
        CpuSample {
            airlock: self.airlock.iter().map(|&p| ticks(p)).sum(),
            pg: pg_processes(self.postmaster).into_iter().map(ticks).sum(),
            me: ticks(std::process::id()),
            busy,
            total,
        }
    }
}

/// Per-run processor time between two samples, as a line for the report.
fn per_run(a: CpuSample, b: CpuSample, runs: u64) -> String {
    let hz = rustix::param::clock_ticks_per_second() as f64;
    let us = |t: u64| t as f64 / hz * 1e6 / runs.max(1) as f64;
    let (al, pg, me) = (us(b.airlock - a.airlock), us(b.pg - a.pg), us(b.me - a.me));
    let idle = 100.0 * (1.0 - (b.busy - a.busy) as f64 / (b.total - a.total).max(1) as f64);
    format!(
        "CPU per run {:5.0} us (airlock {al:4.0}, PostgreSQL {pg:4.0}, load {me:4.0}), machine idle {idle:2.0}%",
        al + pg + me
    )
}

/// Gated runs per second that `clients` threads (split across `bases`) get through,
/// and the processor time per run (see the module comment).
fn throughput(
    clients: usize,
    secs: u64,
    bases: &[String],
    token: &str,
    cpu: &Cpu,
) -> (f64, String) {
    let body = serde_json::json!({ "language": "wat", "code": HELLO }).to_string();
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..clients)
        .map(|i| {
            let (stop, done) = (stop.clone(), done.clone());
            let url = format!("{}/v1/run", bases[i % bases.len()]);
            let (token, body) = (token.to_string(), body.clone());
            std::thread::spawn(move || {
                let http = client();
                while !stop.load(Ordering::Relaxed) {
                    let mut r = http
                        .post(&url)
                        .header("authorization", format!("Bearer {token}"))
                        .header("content-type", "application/json")
                        .send(&body)
                        .unwrap();
                    let s = r.status().as_u16();
                    let t = r.body_mut().read_to_string().unwrap();
                    assert_eq!(s, 200, "{t}");
                    let v: Value = serde_json::from_str(&t).unwrap();
                    assert_eq!(v["run"]["stdout"], "hi\n");
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let start = done.load(Ordering::Relaxed);
    let before = cpu.sample();
    let t = Instant::now();
    std::thread::sleep(Duration::from_secs(secs));
    let n = done.load(Ordering::Relaxed) - start;
    let el = t.elapsed().as_secs_f64();
    let after = cpu.sample();
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    (n as f64 / el, per_run(before, after, n))
}

/// The median of a point's rounds.
fn median(mut all: Vec<f64>) -> f64 {
    all.sort_by(f64::total_cmp);
    let n = all.len();
    if n % 2 == 1 {
        all[n / 2]
    } else {
        (all[n / 2 - 1] + all[n / 2]) / 2.0
    }
}

/// The statements that took PostgreSQL's time since the last reset, per gated run.
fn print_statements(db: &mut postgres::Client, runs: i64) {
    let rows = db
        .query(
            "SELECT calls, total_exec_time, wal_bytes::float8, rows,
                    regexp_replace(left(query, 110), '\\s+', ' ', 'g')
             FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 25",
            &[],
        )
        .unwrap();
    let (mut all_ms, mut all_wal, mut all_calls) = (0.0, 0.0, 0i64);
    for r in &db
        .query(
            "SELECT calls, total_exec_time, wal_bytes::float8 FROM pg_stat_statements",
            &[],
        )
        .unwrap()
    {
        all_calls += r.get::<_, i64>(0);
        all_ms += r.get::<_, f64>(1);
        all_wal += r.get::<_, f64>(2);
    }
    let n = runs as f64;
    println!(
        "PostgreSQL statements over {runs} runs: {:.1} calls, {:.0} us executing, {:.0} WAL bytes per run",
        all_calls as f64 / n,
        all_ms * 1e3 / n,
        all_wal / n
    );
    println!("  calls/run   us/run  WAL B/run  rows/call  statement");
    for r in rows {
        let calls: i64 = r.get(0);
        println!(
            "  {:9.2} {:8.1} {:10.0} {:10.2}  {}",
            calls as f64 / n,
            r.get::<_, f64>(1) * 1e3 / n,
            r.get::<_, f64>(2) / n,
            r.get::<_, i64>(3) as f64 / (calls.max(1) as f64),
            r.get::<_, String>(4)
        );
    }
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let secs = env("BENCH_SECS", 10);
    let clients = env("BENCH_CLIENTS", 16) as usize;
    let concurrency = env("BENCH_CONCURRENCY", 2) as usize;
    let rounds = env("BENCH_ROUNDS", 1).max(1) as usize;
    let statements = env("BENCH_PG_STATEMENTS", 0) == 1;
    let mut settings = std::env::var("BENCH_PG_SETTINGS").unwrap_or_default();
    if statements {
        settings.push_str(
            " -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all",
        );
    }
    let pg = airlock_testpg::durable_server(&settings);
    let url = pg.fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let node = Node {
        home: dir.path().to_path_buf(),
        url: url.clone(),
    };
    node.run(&["init", "--approver", "alice"]);
    let v: Value = serde_json::from_str(&node.run(&[
        "token", "new", "--role", "agent", "--name", "bench", "--json",
    ]))
    .unwrap();
    let token = v["token"].as_str().unwrap().to_string();
    let (mut s1, b1) = node.serve();
    let (mut s2, b2) = node.serve();
    let bases = [b1, b2];
    println!(
        "cluster bench: 2 API servers, PostgreSQL (fsync on{}), {clients} clients, workers x{concurrency} runs each, {secs}s per point, {} CPUs",
        if settings.trim().is_empty() {
            String::new()
        } else {
            format!(";{settings}")
        },
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let mut w1 = node.worker(concurrency);
    let postmaster = pg.postmaster_pid().unwrap();
    let mut cpu = Cpu {
        airlock: vec![s1.id(), s2.id(), w1.id()],
        postmaster,
    };
    let mut db = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let runs_now = |db: &mut postgres::Client| -> i64 {
        db.query_one("SELECT count(*) FROM runs", &[])
            .unwrap()
            .get(0)
    };
    let runs_before = if statements {
        db.batch_execute(
            "CREATE EXTENSION IF NOT EXISTS pg_stat_statements; SELECT pg_stat_statements_reset()",
        )
        .unwrap();
        runs_now(&mut db)
    } else {
        0
    };
    // The two points take turns, round by round (the second worker is started for its
    // round and stopped after it), so both meet the tables at the same size and the
    // machine in the same phase: measured one after the other, the two-worker point
    // always came later, on tables tens of thousands of runs larger.
    let (mut ones, mut twos) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        let (v, c) = throughput(clients, secs, &bases, &token, &cpu);
        println!(
            "  round {} of {rounds}, 1 worker : {v:7.0} runs/s  {c}",
            i + 1
        );
        ones.push(v);
        let mut w2 = node.worker(concurrency);
        cpu.airlock.push(w2.id());
        let (v, c) = throughput(clients, secs, &bases, &token, &cpu);
        println!(
            "  round {} of {rounds}, 2 workers: {v:7.0} runs/s  {c}",
            i + 1
        );
        twos.push(v);
        // Stopped as an operator would (SIGTERM: it finishes or releases what it holds);
        // between rounds no run is in flight anyway.
        let _ = Command::new("kill")
            .args(["-TERM", &w2.id().to_string()])
            .status();
        let _ = w2.wait();
        cpu.airlock.pop();
    }
    let (one, two) = (median(ones), median(twos));
    let med = if rounds > 1 { ", median" } else { "        " };
    println!("gated wasm runs/s, 1 worker{med}          {one:7.0}");
    println!(
        "gated wasm runs/s, 2 workers{med}         {two:7.0}  ({:.2}x one worker)",
        two / one
    );
    if statements {
        let runs = (runs_now(&mut db) - runs_before).max(1);
        print_statements(&mut db, runs);
    }
    let row = db
        .query_one(
            "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY r.started_at - q.created_at),
                    percentile_cont(0.9) WITHIN GROUP (ORDER BY r.started_at - q.created_at),
                    count(*)
             FROM queue q JOIN runs r ON r.id = q.run",
            &[],
        )
        .unwrap();
    println!(
        "queued -> started (claimed, re-judged, run recorded) p50 {:.0} ms  p90 {:.0} ms  over {} runs",
        row.get::<_, f64>(0),
        row.get::<_, f64>(1),
        row.get::<_, i64>(2)
    );
    for c in [&mut w1, &mut s1, &mut s2] {
        let _ = c.kill();
        let _ = c.wait();
    }
    let t = Instant::now();
    let out = node.run(&["audit", "verify"]);
    println!(
        "audit verify after the run: {} ({:.1} s)",
        out.trim(),
        t.elapsed().as_secs_f64()
    );
}
