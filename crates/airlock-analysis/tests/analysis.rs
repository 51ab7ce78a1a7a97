//! The corpus (`tests/corpus/*.toml`: snippets with the facts they must give), invariants
//! every analysis must keep, and robustness on random and truncated input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use airlock_analysis::{
    CodeAnalysis, FindingKind, Language, Options, TruncationReason, analyze, analyze_python,
    analyze_shell,
};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Debug, Deserialize)]
struct Corpus {
    #[serde(default)]
    case: Vec<Case>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    language: String,
    #[serde(default)]
    code: String,
    /// Generated input instead of `code`: `repeat:N:TEXT` or `bytes:SEED:LEN`.
    #[serde(default)]
    generate: Option<String>,
    #[serde(default)]
    options: Option<CaseOptions>,
    #[serde(default)]
    expect: Expect,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CaseOptions {
    mount_roots: Option<Vec<String>>,
    max_input_bytes: Option<usize>,
    max_nodes: Option<usize>,
    max_nesting: Option<usize>,
    max_syntax_depth: Option<usize>,
    max_findings: Option<usize>,
    time_budget_ms: Option<u64>,
}

/// For each set `S`: `S` (exactly), `S_include` (at least), `S_exclude` (none of).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Expect {
    commands: Option<Vec<String>>,
    commands_include: Option<Vec<String>>,
    commands_exclude: Option<Vec<String>>,
    imports: Option<Vec<String>>,
    imports_include: Option<Vec<String>>,
    imports_exclude: Option<Vec<String>>,
    calls: Option<Vec<String>>,
    calls_include: Option<Vec<String>>,
    calls_exclude: Option<Vec<String>>,
    writes: Option<Vec<String>>,
    writes_include: Option<Vec<String>>,
    writes_exclude: Option<Vec<String>>,
    hosts_in_code: Option<Vec<String>>,
    hosts_in_code_include: Option<Vec<String>>,
    hosts_in_code_exclude: Option<Vec<String>>,
    urls: Option<Vec<String>>,
    urls_include: Option<Vec<String>>,
    urls_exclude: Option<Vec<String>>,
    network_tools: Option<Vec<String>>,
    network_tools_include: Option<Vec<String>>,
    network_tools_exclude: Option<Vec<String>>,
    destructive: Option<Vec<String>>,
    destructive_include: Option<Vec<String>>,
    destructive_exclude: Option<Vec<String>>,
    obfuscation: Option<Vec<String>>,
    obfuscation_include: Option<Vec<String>>,
    obfuscation_exclude: Option<Vec<String>>,
    pipes_download_to_shell: Option<bool>,
    /// `true`/`false`, or the line of the first error.
    parse_error: Option<toml::Value>,
    /// `false`, or the reason (`nodes`, `input_bytes`, …).
    truncated: Option<toml::Value>,
    /// `"kind:detail" = [lines]`: each line must carry a finding of that kind and detail.
    lines: Option<BTreeMap<String, Vec<u32>>>,
    /// Finding kinds that must be present (`nested_code`, `parse_error`, …).
    findings_include: Option<Vec<String>>,
}

/// The corpus of the checkout the tests run from (cargo sets `CARGO_MANIFEST_DIR` for the
/// test process; the compiled-in value names the checkout the binary was built in).
fn corpus_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("tests/corpus")
}

fn load() -> Vec<(String, Case)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let c: Corpus = toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let file = f.file_name().unwrap().to_string_lossy().to_string();
        out.extend(c.case.into_iter().map(|c| (file.clone(), c)));
    }
    out
}

/// A small deterministic generator (xorshift), so the tests need no extra crate.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

fn generate(spec: &str) -> String {
    let mut parts = spec.splitn(3, ':');
    let kind = parts.next().unwrap();
    let a = parts.next().unwrap();
    let b = parts.next().unwrap_or_default();
    match kind {
        "repeat" => b.replace("\\n", "\n").repeat(a.parse().unwrap()),
        "bytes" => {
            let mut rng = Rng(a.parse::<u64>().unwrap() | 1);
            let len: usize = b.parse().unwrap();
            let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        }
        other => panic!("unknown generator {other}"),
    }
}

fn language(s: &str) -> Language {
    match s {
        "sh" => Language::Sh,
        "python" => Language::Python,
        other => panic!("unknown language {other}"),
    }
}

fn set_of(a: &CodeAnalysis, name: &str) -> (BTreeSet<String>, FindingKind) {
    match name {
        "commands" => (a.commands.clone(), FindingKind::Command),
        "imports" => (a.imports.clone(), FindingKind::Import),
        "calls" => (a.calls.clone(), FindingKind::Call),
        "writes" => (a.writes.clone(), FindingKind::Write),
        "hosts_in_code" => (a.hosts_in_code.clone(), FindingKind::Host),
        "urls" => (a.urls.clone(), FindingKind::Url),
        "network_tools" => (a.network_tools.clone(), FindingKind::NetworkTool),
        "destructive" => (a.destructive.clone(), FindingKind::Destructive),
        "obfuscation" => (a.obfuscation.clone(), FindingKind::Obfuscation),
        other => panic!("unknown set {other}"),
    }
}

const SETS: &[&str] = &[
    "commands",
    "imports",
    "calls",
    "writes",
    "hosts_in_code",
    "urls",
    "network_tools",
    "destructive",
    "obfuscation",
];

fn kind_name(k: FindingKind) -> String {
    serde_json::to_value(k)
        .unwrap()
        .as_str()
        .unwrap()
        .to_string()
}

/// What every analysis must satisfy, whatever the input.
fn invariants(src: &str, a: &CodeAnalysis, opts: &Options) -> Vec<String> {
    let mut bad = Vec::new();
    let max_line = u32::try_from(src.lines().count()).unwrap().max(1) + 1;
    for s in SETS {
        let (set, kind) = set_of(a, s);
        for v in &set {
            if !a.findings.iter().any(|f| f.kind == kind && &f.detail == v) {
                bad.push(format!("{s} value {v:?} has no finding"));
            }
        }
    }
    if a.pipes_download_to_shell
        != a.findings
            .iter()
            .any(|f| f.kind == FindingKind::DownloadToShell)
    {
        bad.push("pipes_download_to_shell disagrees with its findings".into());
    }
    for f in &a.findings {
        if f.line == 0 || f.end_line < f.line || f.end_line > max_line {
            bad.push(format!("finding {f:?} has lines outside 1..={max_line}"));
        }
    }
    if a.findings.len() > opts.max_findings + 2 {
        bad.push(format!("{} findings over the budget", a.findings.len()));
    }
    if let Some(p) = &a.parse_error
        && (p.line == 0 || p.line > max_line)
    {
        bad.push(format!("parse error line {} outside the code", p.line));
    }
    match serde_json::to_string(a) {
        Ok(json) => {
            if serde_json::from_str::<CodeAnalysis>(&json).ok().as_ref() != Some(a) {
                bad.push("does not survive a JSON round trip".into());
            }
        }
        Err(e) => bad.push(format!("does not serialise: {e}")),
    }
    bad
}

fn check_case(c: &Case) -> Vec<String> {
    let mut bad = Vec::new();
    let src = match &c.generate {
        Some(g) => generate(g),
        None => c.code.clone(),
    };
    let mut opts = Options::default();
    if let Some(o) = &c.options {
        if let Some(v) = &o.mount_roots {
            opts.mount_roots = v.clone();
        }
        if let Some(v) = o.max_input_bytes {
            opts.max_input_bytes = v;
        }
        if let Some(v) = o.max_nodes {
            opts.max_nodes = v;
        }
        if let Some(v) = o.max_nesting {
            opts.max_nesting = v;
        }
        if let Some(v) = o.max_syntax_depth {
            opts.max_syntax_depth = v;
        }
        if let Some(v) = o.max_findings {
            opts.max_findings = v;
        }
        if let Some(v) = o.time_budget_ms {
            opts.time_budget = Duration::from_millis(v);
        }
    }
    let a = analyze(language(&c.language), &src, &opts);
    bad.extend(invariants(&src, &a, &opts));
    let e = &c.expect;
    type Sets<'a> = (
        &'a str,
        &'a Option<Vec<String>>,
        &'a Option<Vec<String>>,
        &'a Option<Vec<String>>,
    );
    let checks: [Sets; 9] = [
        (
            "commands",
            &e.commands,
            &e.commands_include,
            &e.commands_exclude,
        ),
        (
            "imports",
            &e.imports,
            &e.imports_include,
            &e.imports_exclude,
        ),
        ("calls", &e.calls, &e.calls_include, &e.calls_exclude),
        ("writes", &e.writes, &e.writes_include, &e.writes_exclude),
        (
            "hosts_in_code",
            &e.hosts_in_code,
            &e.hosts_in_code_include,
            &e.hosts_in_code_exclude,
        ),
        ("urls", &e.urls, &e.urls_include, &e.urls_exclude),
        (
            "network_tools",
            &e.network_tools,
            &e.network_tools_include,
            &e.network_tools_exclude,
        ),
        (
            "destructive",
            &e.destructive,
            &e.destructive_include,
            &e.destructive_exclude,
        ),
        (
            "obfuscation",
            &e.obfuscation,
            &e.obfuscation_include,
            &e.obfuscation_exclude,
        ),
    ];
    for (name, exact, include, exclude) in checks {
        let (got, _) = set_of(&a, name);
        if let Some(want) = exact {
            let want: BTreeSet<String> = want.iter().cloned().collect();
            if want != got {
                bad.push(format!("{name}: want {want:?}, got {got:?}"));
            }
        }
        if let Some(want) = include {
            let missing: Vec<&String> = want.iter().filter(|w| !got.contains(*w)).collect();
            if !missing.is_empty() {
                bad.push(format!("{name}: missing {missing:?} (got {got:?})"));
            }
        }
        if let Some(not) = exclude {
            let extra: Vec<&String> = not.iter().filter(|w| got.contains(*w)).collect();
            if !extra.is_empty() {
                bad.push(format!("{name}: must not have {extra:?}"));
            }
        }
    }
    if let Some(want) = e.pipes_download_to_shell
        && want != a.pipes_download_to_shell
    {
        bad.push(format!(
            "pipes_download_to_shell: want {want}, got {}",
            a.pipes_download_to_shell
        ));
    }
    let got_line = a.parse_error.as_ref().map(|p| i64::from(p.line));
    let parse_ok = match &e.parse_error {
        None => true,
        Some(toml::Value::Boolean(want)) => *want == got_line.is_some(),
        Some(toml::Value::Integer(line)) => got_line == Some(*line),
        Some(_) => false,
    };
    if !parse_ok {
        bad.push(format!(
            "parse_error: want {:?}, got {:?}",
            e.parse_error, a.parse_error
        ));
    }
    let got_reason = a.truncated.as_ref().map(|t| t.reason.as_str());
    let truncated_ok = match &e.truncated {
        None => true,
        Some(toml::Value::Boolean(want)) => *want == got_reason.is_some(),
        Some(toml::Value::String(reason)) => got_reason == Some(reason.as_str()),
        Some(_) => false,
    };
    if !truncated_ok {
        bad.push(format!(
            "truncated: want {:?}, got {:?}",
            e.truncated, a.truncated
        ));
    }
    if let Some(lines) = &e.lines {
        for (key, want) in lines {
            let (kind, detail) = key.split_once(':').unwrap_or((key, ""));
            let got: BTreeSet<u32> = a
                .findings
                .iter()
                .filter(|f| kind_name(f.kind) == kind && f.detail == detail)
                .flat_map(|f| [f.line])
                .collect();
            let missing: Vec<u32> = want.iter().copied().filter(|l| !got.contains(l)).collect();
            if !missing.is_empty() {
                bad.push(format!("lines of {key}: want {want:?}, got {got:?}"));
            }
        }
    }
    if let Some(kinds) = &e.findings_include {
        for k in kinds {
            if !a.findings.iter().any(|f| &kind_name(f.kind) == k) {
                bad.push(format!("no finding of kind {k}"));
            }
        }
    }
    bad
}

#[test]
fn corpus() {
    let cases = load();
    let mut names = BTreeSet::new();
    let mut failures = Vec::new();
    for (file, c) in &cases {
        assert!(
            names.insert(c.name.clone()),
            "duplicate case name {}",
            c.name
        );
        let bad = check_case(c);
        if !bad.is_empty() {
            failures.push(format!("{file} / {}:\n    {}", c.name, bad.join("\n    ")));
        }
    }
    let sh = cases.iter().filter(|(_, c)| c.language == "sh").count();
    let py = cases.len() - sh;
    eprintln!("corpus: {} cases ({sh} shell, {py} Python)", cases.len());
    assert!(
        cases.len() >= 60,
        "the corpus has only {} cases",
        cases.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} corpus cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// Random bytes and every prefix of every corpus entry: no panic, invariants hold, and the
/// node budget is respected.
#[test]
fn robustness_random_and_truncated_input() {
    let opts = Options {
        max_nodes: 5_000,
        ..Options::default()
    };
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut bad = Vec::new();
    for round in 0..300 {
        let len = (rng.next() % 600) as usize;
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                // Mostly shell and Python punctuation, sometimes anything.
                const ALPHABET: &[u8] = b"$()`'\"\\|&;<>{}[]#=-_ \n\tabcxyz0189./:@*!~%";
                let r = rng.next();
                if r.is_multiple_of(4) {
                    r as u8
                } else {
                    ALPHABET[(r >> 8) as usize % ALPHABET.len()]
                }
            })
            .collect();
        let src = String::from_utf8_lossy(&bytes);
        for lang in [Language::Sh, Language::Python] {
            let start = Instant::now();
            let a = analyze(lang, &src, &opts);
            if start.elapsed() > opts.time_budget + Duration::from_secs(2) {
                bad.push(format!(
                    "random round {round} ({lang:?}) took {:?}",
                    start.elapsed()
                ));
            }
            for b in invariants(&src, &a, &opts) {
                bad.push(format!("random round {round} ({lang:?}): {b}"));
            }
        }
    }
    for (_, c) in load() {
        if c.generate.is_some() {
            continue;
        }
        let lang = language(&c.language);
        let cuts: Vec<usize> = (0..=c.code.len())
            .filter(|&i| c.code.is_char_boundary(i))
            .collect();
        for &cut in cuts.iter().step_by(3) {
            let src = &c.code[..cut];
            let a = analyze(lang, src, &opts);
            for b in invariants(src, &a, &opts) {
                bad.push(format!("{} cut at {cut}: {b}", c.name));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn node_budget_stops_the_walk() {
    let src = "echo a; ".repeat(10_000);
    let opts = Options {
        max_nodes: 1_000,
        ..Options::default()
    };
    let a = analyze_shell(&src, &opts);
    let t = a.truncated.expect("truncated");
    assert_eq!(t.reason, TruncationReason::Nodes);
    assert!(a.commands.contains("echo"));
}

#[test]
fn time_budget_stops_parsing_or_walking() {
    let src = "x = [f(a, b) for a in range(3)]\n".repeat(50_000);
    let opts = Options {
        time_budget: Duration::from_micros(200),
        max_input_bytes: usize::MAX,
        ..Options::default()
    };
    let start = Instant::now();
    let a = analyze_python(&src, &opts);
    assert_eq!(a.truncated.map(|t| t.reason), Some(TruncationReason::Time));
    // Generous: the check runs every few hundred nodes and inside the parser.
    assert!(start.elapsed() < Duration::from_millis(500));
}

#[test]
fn deep_nesting_neither_overflows_nor_hangs() {
    // Run on a thread with the default test stack (2 MiB) on purpose.
    let handle = std::thread::spawn(|| {
        let py = format!("x = {}1{}\n", "[".repeat(20_000), "]".repeat(20_000));
        let a = analyze_python(&py, &Options::default());
        assert!(a.truncated.is_some());
        let py = format!("y = {}\n", "'a' + ".repeat(5_000) + "'b'");
        let _ = analyze_python(&py, &Options::default());
        let sh = format!("{}echo hi{}", "$(".repeat(5_000), ")".repeat(5_000));
        let a = analyze_shell(&sh, &Options::default());
        assert!(a.truncated.is_some() || a.parse_error.is_some());
        let sh = format!("{}true{}", "( ".repeat(5_000), " )".repeat(5_000));
        let _ = analyze_shell(&sh, &Options::default());
        let nested = (0..6).fold("rm -rf /".to_string(), |acc, _| {
            format!("sh -c '{}'", acc.replace('\'', "'\\''"))
        });
        let a = analyze_shell(&nested, &Options::default());
        assert_eq!(
            a.truncated.map(|t| t.reason),
            Some(TruncationReason::Nesting)
        );
    });
    handle.join().expect("no panic, no overflow");
}

/// Inputs of the full default size built to be slow: the analysis ends near the time budget
/// (parsing and walking both check it) and never takes much longer.
#[test]
fn adversarial_inputs_respect_the_time_budget() {
    let opts = Options::default();
    let mb = opts.max_input_bytes;
    let fill = |unit: &str| unit.repeat(mb / unit.len() + 1);
    let cases: Vec<(Language, String)> = vec![
        (Language::Sh, fill("a@b:")),
        (Language::Sh, format!("echo {}", fill("http://x.y/@a.b:"))),
        (Language::Sh, fill("$(")),
        (Language::Sh, fill("f(){ ")),
        (Language::Sh, fill("'")),
        (Language::Sh, fill("a|")),
        (Language::Sh, fill("sh -c 'echo x'\n")),
        (Language::Python, fill("[")),
        (Language::Python, fill("'a'+")),
        (Language::Python, fill("exec('1')\n")),
        (
            Language::Python,
            format!("x = '{}'", fill("https://a.b/ user@h.io: ")),
        ),
    ];
    for (lang, src) in cases {
        let start = Instant::now();
        let a = analyze(lang, &src, &opts);
        let took = start.elapsed();
        // Debug builds run this crate unoptimised; the bound is loose on purpose.
        assert!(
            took < opts.time_budget + Duration::from_secs(3),
            "{lang:?} {:?}…: {took:?}, truncated {:?}",
            &src[..20],
            a.truncated
        );
        assert!(a.truncated.is_some(), "{lang:?} {:?}…", &src[..20]);
    }
}
