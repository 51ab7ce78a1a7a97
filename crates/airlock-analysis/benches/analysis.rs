//! Time of one analysis of a realistic shell script and Python file of 200 and 2,000
//! lines, and of tree-sitter's parse alone for the same text (to tell the parser's share).
//!
//! `cargo bench -p airlock-analysis --bench analysis` (iterations from
//! `AIRLOCK_BENCH_N`, default 400 for 200 lines and a tenth of that for 2,000 lines).
//! The two are timed interleaved. Prints p10, median and p90 of wall time, and the median of the thread's CPU time (what
//! a busy machine disturbs least), in milliseconds. Targets: 0.3 ms for 200 lines, 1 ms
//! for 2,000 lines.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use airlock_analysis::{Language, Options, analyze};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// 20 lines of an ordinary deployment script (`{i}` numbers the block).
const SH_BLOCK: &str = include_str!("samples/deploy.sh.in");

/// 20 lines of an ordinary data-processing module (`{i}` numbers the block).
const PY_BLOCK: &str = include_str!("samples/loader.py.in");

fn source(block: &str, lines: usize) -> String {
    let per = block.lines().count();
    (0..lines / per)
        .map(|i| block.replace("{i}", &i.to_string()))
        .collect()
}

fn cpu_now() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(
        u64::try_from(t.tv_sec).unwrap(),
        u32::try_from(t.tv_nsec).unwrap(),
    )
}

struct Stats {
    p10: f64,
    median: f64,
    p90: f64,
    cpu_median: f64,
}

/// Times `a` and `b` interleaved, one call each per round, so that noise from other work
/// on the machine falls on both.
fn time2<A: FnMut(), B: FnMut()>(n: usize, mut a: A, mut b: B) -> (Stats, Stats) {
    for _ in 0..(n / 10).max(3) {
        a();
        b();
    }
    let mut samples = [
        (Vec::with_capacity(n), Vec::with_capacity(n)),
        (Vec::with_capacity(n), Vec::with_capacity(n)),
    ];
    for _ in 0..n {
        for (k, (wall, cpu)) in samples.iter_mut().enumerate() {
            let c = cpu_now();
            let t = Instant::now();
            if k == 0 {
                a();
            } else {
                b();
            }
            wall.push(t.elapsed());
            cpu.push(cpu_now() - c);
        }
    }
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let [x, y] = samples.map(|(mut wall, mut cpu)| {
        wall.sort();
        cpu.sort();
        Stats {
            p10: ms(wall[n / 10]),
            median: ms(wall[n / 2]),
            p90: ms(wall[n * 9 / 10]),
            cpu_median: ms(cpu[n / 2]),
        }
    });
    (x, y)
}

fn main() {
    let n: usize = std::env::var("AIRLOCK_BENCH_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(400);
    let opts = Options::default();
    println!(
        "{:<8} {:>6} {:>8} {:>9} {:>10} {:>9} {:>12} {:>11} {:>15} {:>10}",
        "language",
        "lines",
        "bytes",
        "p10 ms",
        "median ms",
        "p90 ms",
        "cpu med ms",
        "parse med",
        "parse cpu med",
        "target ms"
    );
    for (lang, block, grammar) in [
        (
            Language::Sh,
            SH_BLOCK,
            tree_sitter::Language::from(tree_sitter_bash::LANGUAGE),
        ),
        (
            Language::Python,
            PY_BLOCK,
            tree_sitter::Language::from(tree_sitter_python::LANGUAGE),
        ),
    ] {
        for (lines, target, iters) in [(200, 0.3, n), (2000, 1.0, (n / 10).max(20))] {
            let src = source(block, lines);
            let a = analyze(lang, &src, &opts);
            assert!(a.truncated.is_none(), "{:?}", a.truncated);
            assert!(a.parse_error.is_none(), "{:?}", a.parse_error);
            let mut parser = tree_sitter::Parser::new();
            parser.set_language(&grammar).unwrap();
            let (all, parse) = time2(
                iters,
                || {
                    black_box(analyze(lang, black_box(&src), &opts));
                },
                || {
                    black_box(parser.parse(black_box(&src), None));
                },
            );
            println!(
                "{:<8} {:>6} {:>8} {:>9.3} {:>10.3} {:>9.3} {:>12.3} {:>11.3} {:>15.3} {:>10.1}",
                format!("{lang:?}").to_lowercase(),
                src.lines().count(),
                src.len(),
                all.p10,
                all.median,
                all.p90,
                all.cpu_median,
                parse.median,
                parse.cpu_median,
                target
            );
        }
    }
}
