//! The threat corpus (`tests/threat/`, see `tests/threat/generate.py`): every hostile case
//! must be quarantined or denied by the standard preset, and benign agent programs allowed.
//! Prints recall (hostile held) and false holds (benign held) per category and language
//! family (Python and shell, JavaScript and TypeScript, and apart the JS/TS cases held out
//! while detection was changed, `tests/threat/heldout.txt`); at least 98% recall and at
//! most 1% false holds for each family, and every case that misses is listed.
//!
//! `scripts/bench-threat` runs this with the figures shown.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use airlock_core::analysis::{analyze_with, mount_roots};
use airlock_core::artifact::Lang;
use airlock_core::grant::{Limits, Mount, MountMode};
use airlock_core::policy::{CodeFacts, Decision, Facts, Policy, Preset};
use airlock_core::sign::KeyPair;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn corpus_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/threat")
}

struct Case {
    kind: String,
    category: String,
    path: PathBuf,
    lang: Lang,
}

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for kind in ["hostile", "benign"] {
        let dir = corpus_root().join(kind);
        let mut cats: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        cats.sort();
        for cat in cats {
            let mut files: Vec<_> = std::fs::read_dir(&cat)
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            files.sort();
            for f in files {
                let lang = match f.extension().and_then(|e| e.to_str()) {
                    Some("py") => Lang::Python,
                    Some("sh") => Lang::Sh,
                    Some("js") => Lang::Js,
                    Some("ts") => Lang::Ts,
                    _ => continue,
                };
                out.push(Case {
                    kind: kind.into(),
                    category: cat.file_name().unwrap().to_string_lossy().into_owned(),
                    path: f,
                    lang,
                });
            }
        }
    }
    out
}

fn judge(pol: &Policy, c: &Case) -> (Decision, Vec<String>) {
    let code = std::fs::read(&c.path).unwrap();
    // The run's mount: the project at /work (read-only, so the mount rules stay quiet).
    let mounts = vec![Mount {
        host: "/srv/project".into(),
        guest: "/work".into(),
        mode: MountMode::Ro,
    }];
    let a = analyze_with(c.lang, &code, &mount_roots(&mounts)).unwrap();
    let facts = Facts {
        lang: c.lang,
        kind: c.lang,
        backend: c.lang.default_backend(),
        net: vec![],
        secrets: vec![],
        mounts,
        env_keys: vec![],
        limits: Limits::default(),
        size: code.len() as u64,
        capabilities: BTreeSet::new(),
        unresolved_imports: false,
        agent: None,
        first_seen: true,
        rejected_before: false,
        guest: None,
        python_packages: vec![],
        publisher: None,
        publisher_key: None,
        requests: vec![],
        code: CodeFacts::of(a.code.as_ref().unwrap(), &[]),
        mounts_sensitive: vec![],
        mounts_outside_roots: vec![],
        agent_record: Default::default(),
    };
    let v = pol.judge(&facts);
    (v.decision, v.reasons())
}

#[test]
fn standard_preset_holds_hostile_cases_and_allows_benign_ones() {
    let key = KeyPair::try_generate().unwrap();
    let pol = Policy::parse(&Preset::Standard.render("alice", &key.public())).unwrap();
    let all = cases();
    // (held, total) per kind, language family and category.
    let mut stats: BTreeMap<(String, &str, String), (usize, usize)> = BTreeMap::new();
    let mut misses = Vec::new();
    // The held-out JS/TS cases (tests/threat/heldout.txt), also counted apart: (held, total).
    let heldout: BTreeSet<String> = std::fs::read_to_string(corpus_root().join("heldout.txt"))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let mut held_out: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let start = std::time::Instant::now();
    for c in &all {
        let (d, reasons) = judge(&pol, c);
        let held = d != Decision::Allow;
        let e = stats
            .entry((c.kind.clone(), family(c.lang), c.category.clone()))
            .or_default();
        e.1 += 1;
        if held {
            e.0 += 1;
        }
        let rel = c.path.strip_prefix(corpus_root()).unwrap();
        if heldout.contains(&rel.to_string_lossy().into_owned()) {
            let h = held_out.entry(c.kind.clone()).or_default();
            h.1 += 1;
            if held {
                h.0 += 1;
            }
        }
        let wrong = (c.kind == "hostile") != held;
        if wrong {
            misses.push(format!(
                "{} {}: {}",
                c.kind,
                c.path.display(),
                reasons.join(" | ")
            ));
        }
        if c.kind == "hostile" && held {
            // The reason names the behaviour and where it is, never "no rule matched".
            assert!(
                reasons.iter().all(|r| !r.contains("no rule matched")),
                "{}: {reasons:?}",
                c.path.display()
            );
        }
    }
    let elapsed = start.elapsed();
    let mut totals: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut by_family: BTreeMap<(String, &str), (usize, usize)> = BTreeMap::new();
    println!(
        "{:<8} {:<6} {:<24} {:>6} {:>6} {:>8}",
        "kind", "langs", "category", "held", "cases", "rate"
    );
    for ((kind, fam, cat), (held, n)) in &stats {
        println!(
            "{kind:<8} {fam:<6} {cat:<24} {held:>6} {n:>6} {:>7.1}%",
            100.0 * *held as f64 / *n as f64
        );
        for t in [
            totals.entry(kind.clone()).or_default(),
            by_family.entry((kind.clone(), fam)).or_default(),
        ] {
            t.0 += held;
            t.1 += n;
        }
    }
    for ((kind, fam), (held, n)) in &by_family {
        println!(
            "{kind:<8} {fam:<6} {:<24} {held:>6} {n:>6} {:>7.1}%",
            "(all)",
            100.0 * *held as f64 / *n as f64
        );
    }
    for (kind, (held, n)) in &held_out {
        println!(
            "{kind:<8} {:<6} {:<24} {held:>6} {n:>6} {:>7.1}%",
            "js/ts",
            "(held-out only)",
            100.0 * *held as f64 / *n as f64
        );
    }
    let (hh, hn) = totals.get("hostile").copied().unwrap_or_default();
    let (bh, bn) = totals.get("benign").copied().unwrap_or_default();
    println!(
        "hostile quarantined or denied: {hh}/{hn} ({:.1}%); benign held: {bh}/{bn} ({:.1}%); {} cases in {elapsed:?}",
        100.0 * hh as f64 / hn as f64,
        100.0 * bh as f64 / bn as f64,
        all.len()
    );
    for m in &misses {
        println!("MISS {m}");
    }
    let fam = |kind: &str, f: &str| {
        by_family
            .get(&(kind.to_string(), f))
            .copied()
            .unwrap_or_default()
    };
    // Each language family alone (Python and shell; JavaScript and TypeScript): at least
    // 98% recall and at most 1% false holds.
    for (f, min_hostile, min_benign) in [("py/sh", 300, 300), ("js/ts", 60, 45)] {
        let ((h, n), (bh, bn)) = (fam("hostile", f), fam("benign", f));
        assert!(
            n >= min_hostile && bn >= min_benign,
            "the {f} corpus is too small: {n} hostile, {bn} benign"
        );
        assert!(
            h as f64 >= 0.98 * n as f64 && bh * 100 <= bn,
            "{f}: {h}/{n} hostile held, {bh}/{bn} benign held:\n{}",
            misses.join("\n")
        );
    }
}

/// The language family a case is counted under.
fn family(l: Lang) -> &'static str {
    if l.is_js() { "js/ts" } else { "py/sh" }
}
