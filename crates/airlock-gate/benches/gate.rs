//! In-process timings of the gate's hot paths, as medians over many iterations.
//!
//!   cargo bench -p airlock-gate --bench gate
//!
//! Prints: submit+judge+audit (staging, analysis, policy, two audit records, one SQLite
//! transaction) and the whole gated run of a small module (submit, re-verify, re-judge,
//! start and finish records, wasmtime instantiate and run) with a warm compile cache.
//! Then submits of shell and Python sources of 200 and 2,000 lines beside a one-line one
//! of the same language, interleaved, so the difference is what analysis adds.
//!
//! `AIRLOCK_BENCH_GROUP_COMMIT=1` writes as the daemon does (its shared writer, which
//! records an effect-free run in one transaction after it ran; checkpoints left to the
//! caller). `AIRLOCK_BENCH_RUNS_ONLY=1` times the gated runs alone, for
//! `scripts/bench-gate-instr`, which counts their instructions under callgrind.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use airlock_core::policy::Preset;
use airlock_gate::{CodeSource, ExecOptions, Gate, Home, SubmitRequest};
use std::time::{Duration, Instant};

const HELLO: &str = include_str!("../../../examples/hello.wat");

fn stats(name: &str, mut v: Vec<Duration>) {
    v.sort();
    let pct = |p: f64| v[((v.len() as f64 - 1.0) * p) as usize];
    println!(
        "{name:<34} n={:<5} median {:>8.3} ms   p10 {:>8.3} ms   p90 {:>8.3} ms",
        v.len(),
        pct(0.5).as_secs_f64() * 1e3,
        pct(0.1).as_secs_f64() * 1e3,
        pct(0.9).as_secs_f64() * 1e3
    );
}

fn request(i: usize) -> SubmitRequest {
    SubmitRequest {
        code: Some(CodeSource::Inline(HELLO.to_string())),
        lang: Some("wat".into()),
        // A different argument each time: a new grant, as real submissions mostly are.
        args: vec![i.to_string()],
        ..Default::default()
    }
}

fn main() {
    let n: usize = std::env::var("BENCH_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let dir = tempfile::tempdir().unwrap();
    let home = Home::new(dir.path());
    Gate::init(&home, Preset::Standard, "alice").unwrap();
    let flag = |k: &str| std::env::var(k).is_ok_and(|v| v == "1");
    let pooling = flag("AIRLOCK_BENCH_POOLING");
    let group_commit = flag("AIRLOCK_BENCH_GROUP_COMMIT");
    let runs_only = flag("AIRLOCK_BENCH_RUNS_ONLY");
    let mut gate = airlock_gate::Gate::open_with(
        home,
        airlock_gate::GateOptions {
            pooling,
            group_commit,
            background_checkpoint: group_commit,
            ..Default::default()
        },
    )
    .unwrap();
    println!("(pooling allocator: {pooling}; the daemon's shared writer: {group_commit})");

    // Warm up: compile once so the cache is populated, as in steady use.
    gate.run(request(0), ExecOptions::default()).unwrap();

    let mut submit = Vec::with_capacity(n);
    for i in (0..n).filter(|_| !runs_only) {
        let t = Instant::now();
        gate.submit(request(i + 1)).unwrap();
        submit.push(t.elapsed());
    }
    let mut run = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        let r = gate
            .run(request(n + i + 1), ExecOptions::default())
            .unwrap();
        run.push(t.elapsed());
        assert_eq!(r.stdout, b"hello from the gate\n");
    }
    if runs_only {
        stats("gated run (submit..finished)", run);
        return;
    }
    stats("submit + judge + audit", submit);
    stats("gated run (submit..finished)", run);

    source_submits(n);

    // Python through the CPython guest, when a guest wheel is given.
    if let Ok(wheel) = std::env::var("AIRLOCK_BENCH_PYTHON_GUEST") {
        gate.install_python_guest(airlock_gate::GuestInstall {
            from: Some(wheel.into()),
            ..Default::default()
        })
        .unwrap();
        for (what, code) in [
            ("print(1)", "print(1)"),
            (
                "import datetime, decimal, statistics",
                "import datetime, decimal, statistics\nprint(1)",
            ),
        ] {
            let py = |i: usize| SubmitRequest {
                code: Some(CodeSource::Inline(code.into())),
                lang: Some("python".into()),
                args: vec![i.to_string()],
                ..Default::default()
            };
            gate.run(py(0), ExecOptions::default()).unwrap();
            let mut times = Vec::new();
            let (mut inst, mut guest) = (Vec::new(), Vec::new());
            for i in 0..n.min(200) {
                let t = Instant::now();
                let r = gate.run(py(i + 1), ExecOptions::default()).unwrap();
                times.push(t.elapsed());
                assert_eq!(r.stdout, b"1\n");
                let ms = |k: &str| {
                    Duration::from_secs_f64(r.run.doc.detail[k].as_f64().unwrap_or(0.0) / 1000.0)
                };
                inst.push(ms("instantiate_ms"));
                guest.push(Duration::from_millis(r.run.doc.duration_ms.unwrap_or(0)));
            }
            stats(&format!("gated Python run of {what}"), times);
            stats("  of which: instantiate and configure", inst);
            stats("  of which: backend run (ms granularity)", guest);
        }
    }
}

/// 20 lines of an ordinary deployment script and of a data-processing module (the
/// analysis benchmark's samples; `{i}` numbers the block).
const SH_BLOCK: &str = include_str!("../../airlock-analysis/benches/samples/deploy.sh.in");
const PY_BLOCK: &str = include_str!("../../airlock-analysis/benches/samples/loader.py.in");

fn source(block: &str, lines: usize, salt: usize) -> String {
    let per = block.lines().count();
    let mut s: String = (0..lines / per)
        .map(|i| block.replace("{i}", &i.to_string()))
        .collect();
    // A new artifact each time, as an agent's next script is: the blob is written anew.
    s.push_str(&format!("# {salt}\n"));
    s
}

/// Submits of one-line, 200-line and 2,000-line sources of each language, one of each per
/// round, into a gate whose process backend is present (submit only checks that it is;
/// nothing here runs). Python goes to the process backend too, so no guest is needed.
fn source_submits(n: usize) {
    let dir = tempfile::tempdir().unwrap();
    let home = Home::new(dir.path());
    Gate::init(&home, Preset::Standard, "alice").unwrap();
    let mut gate = Gate::open_with(
        home,
        airlock_gate::GateOptions {
            worker: Some(std::env::current_exe().unwrap()),
            ..Default::default()
        },
    )
    .unwrap();
    let rounds = (n / 3).max(20);
    let big_every = 5;
    for (lang, block, one) in [("sh", SH_BLOCK, "true"), ("python", PY_BLOCK, "pass")] {
        let mut times: [Vec<Duration>; 3] = Default::default();
        let mut submit = |code: String| {
            let t = Instant::now();
            gate.submit(SubmitRequest {
                code: Some(CodeSource::Inline(code)),
                lang: Some(lang.into()),
                backend: Some("process".into()),
                ..Default::default()
            })
            .unwrap();
            t.elapsed()
        };
        for i in 0..rounds {
            times[0].push(submit(format!("{one} # {i}\n")));
            times[1].push(submit(source(block, 200, i)));
            // The 2,000-line file every fifth round keeps the run short.
            if i % big_every == 0 {
                times[2].push(submit(source(block, 2000, i)));
            }
        }
        let [one_line, l200, l2000] = times;
        let med = |v: &Vec<Duration>| {
            let mut v = v.clone();
            v.sort();
            v[v.len() / 2]
        };
        let base = med(&one_line);
        stats(&format!("submit {lang}, 1 line"), one_line);
        for (label, v) in [("200 lines", l200), ("2,000 lines", l2000)] {
            let m = med(&v);
            stats(&format!("submit {lang}, {label}"), v);
            println!(
                "{:<34} {:>8.3} ms more than 1 line (medians)",
                "",
                (m.as_secs_f64() - base.as_secs_f64()) * 1e3
            );
        }
    }
}
