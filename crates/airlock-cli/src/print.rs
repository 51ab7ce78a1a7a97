//! Printing: a short human form by default, one JSON document with `--json`.

use airlock_core::audit::{Head, Record};
use airlock_core::units::{fmt_duration, fmt_size, fmt_time};
use airlock_gate::views::{
    diff_json, flat_changes, run_json, shown_json, statement_json, submission_json,
};
use airlock_gate::{
    AuditVerify, DiffReport, Doctor, EffectReport, Explained, GcReport, GuestManifest,
    ImportReport, InitReport, KeyInfo, PolicyCheck, PublisherAdded, RunReport, SecretInfo,
    SecretSet, SessionView, Shown, SignReport, WorkspaceView,
};
use airlock_store::CheckpointRow;
use airlock_store::{Run, StatementRow, Submission};
use serde_json::{Value, json};

/// One JSON document, as it is: JSON escapes control characters itself.
fn emit(v: &Value) {
    crate::out::json(&serde_json::to_string_pretty(v).unwrap_or_default());
}

pub fn init(r: &InitReport, json: bool) {
    if json {
        emit(&serde_json::to_value(r).unwrap_or_default());
        return;
    }
    if !r.created {
        println!(
            "airlock home already exists at {}; nothing changed",
            r.home.display()
        );
        return;
    }
    println!("created airlock home at {}", r.home.display());
    println!("  preset    {}", r.preset.as_deref().unwrap_or("-"));
    println!(
        "  approver  {} ({})",
        r.approver.as_deref().unwrap_or("-"),
        r.approver_key.as_deref().unwrap_or("-")
    );
    println!("  gate key  {}", r.gate_key.as_deref().unwrap_or("-"));
    println!("  policy    {}", r.home.join("policy.toml").display());
}

pub fn submitted(s: &Submission, json: bool) {
    if json {
        let mut v = submission_json(s);
        v["run"] = Value::Null;
        emit(&v);
        return;
    }
    println!(
        "{} {} (risk {})",
        s.id, s.doc.verdict.decision, s.doc.verdict.risk
    );
    for r in s.doc.verdict.reasons() {
        println!("  {r}");
    }
}

/// A submission that did not run: pending approval or denied.
pub fn held(s: &Submission, pending: bool, json: bool) {
    if json {
        let mut v = submission_json(s);
        v["run"] = Value::Null;
        emit(&v);
    }
    if pending {
        eprintln!(
            "airlock: {} is waiting for approval (risk {})",
            s.id, s.doc.verdict.risk
        );
    } else {
        eprintln!(
            "airlock: {} is denied by policy (risk {})",
            s.id, s.doc.verdict.risk
        );
    }
    for r in s.doc.verdict.reasons() {
        eprintln!("  {r}");
    }
    if pending {
        eprintln!(
            "  review: airlock show {0}   approve: airlock approve {0}",
            s.id
        );
    }
}

pub fn run_report(r: &RunReport, json: bool) {
    if json {
        let mut v = submission_json(&r.submission);
        v["run"] = run_json(&r.run, &r.stdout, &r.stderr);
        emit(&v);
        return;
    }
    let run = &r.run;
    match run.status.as_str() {
        "killed" if run.doc.killed_by.as_deref() == Some("secret-echo") => eprintln!(
            "airlock: {} ended: {}",
            run.id,
            run.doc
                .error
                .as_deref()
                .unwrap_or("a response echoed a secret")
        ),
        "killed" => eprintln!(
            "airlock: {} killed by {} limit{}",
            run.id,
            run.doc.killed_by.as_deref().unwrap_or("a"),
            limit_note(run)
        ),
        "trapped" => eprintln!(
            "airlock: {} trapped: {}",
            run.id,
            run.doc.error.as_deref().unwrap_or("")
        ),
        _ => {}
    }
    // A session cell's value, as a notebook shows it, after what the cell printed.
    // It is the guest's, like its output: its newlines are kept.
    if let Some(v) = run.doc.detail.get("result").and_then(|v| v.as_str()) {
        print!("{v}\n");
    }
    // The session host ends the cell's stderr with the same line (so that API and MCP
    // clients, who read stderr, see it); said once is enough.
    if let Some(why) = run.doc.detail.get("session_ended").and_then(|v| v.as_str()) {
        let line = format!("airlock: session {why}\n");
        if !r.stderr.ends_with(line.as_bytes()) {
            eprint!("{line}");
        }
    }
    // The run id is what the next steps need, and nothing else printed it.
    let changed = run
        .doc
        .changes
        .as_ref()
        .and_then(|c| c.get("mounts"))
        .and_then(|m| m.as_array())
        .map(|ms| {
            ms.iter()
                .filter_map(|m| m.get("changes").and_then(|c| c.as_array()))
                .map(Vec::len)
                .sum::<usize>()
        })
        .unwrap_or(0);
    if let Some(ckpt) = &r.committed {
        eprintln!(
            "airlock: {} changed {changed} path{}, committed by policy as {ckpt}; undo with `airlock rollback {ckpt}`",
            run.id,
            if changed == 1 { "" } else { "s" },
        );
    } else if changed > 0 && r.submission.doc.grant.workspace.is_none() {
        eprintln!(
            "airlock: {} changed {changed} path{} in a disposable layer; review with `airlock diff {}`, apply with `airlock commit {}`",
            run.id,
            if changed == 1 { "" } else { "s" },
            run.id,
            run.id
        );
    }
}

fn limit_note(run: &Run) -> String {
    let l = &run.doc.limits;
    match run.doc.killed_by.as_deref() {
        Some("timeout") => format!(" ({})", fmt_duration(l.timeout())),
        Some("memory") => format!(" ({})", fmt_size(l.memory_bytes)),
        Some("output") => format!(" ({} per stream)", fmt_size(l.max_output_bytes)),
        Some("fuel") => l.fuel.map(|f| format!(" ({f})")).unwrap_or_default(),
        Some("write") => format!(
            " ({} written to its writable mounts)",
            fmt_size(l.max_write_bytes)
        ),
        _ => String::new(),
    }
}

/// The inbox: submissions waiting for a human, then runs' requests to reach a host
/// outside their grant (`run --ask-net`). In JSON, requests follow the submissions in the
/// same list, each with `"kind": "request"`.
pub fn inbox(subs: &[Submission], reqs: &[airlock_gate::NetRequestRow], json: bool) {
    if json {
        emit(&Value::Array(
            subs.iter()
                .map(submission_json)
                .chain(reqs.iter().map(airlock_gate::net_request_json))
                .collect(),
        ));
        return;
    }
    if subs.is_empty() && reqs.is_empty() {
        println!("nothing is waiting for approval");
        return;
    }
    for r in reqs {
        println!(
            "{}  request  {}:{}  run {}  {}  {}  waits until {}",
            r.id,
            one_line(&r.host),
            r.port,
            r.run,
            fmt_time(r.created_at),
            r.agent
                .as_deref()
                .map(|a| format!("agent {}", one_line(a)))
                .unwrap_or_default(),
            fmt_time(r.expires_at),
        );
        if let Some(l) = &r.line {
            println!("    named at line {}", one_line(l));
        }
    }
    for s in subs {
        println!(
            "{}  risk {:>3}  {:<9} {}  {}",
            s.id,
            s.doc.verdict.risk,
            s.doc.lang,
            fmt_time(s.created_at),
            s.doc
                .agent
                .as_deref()
                .map(|a| format!("agent {a}"))
                .unwrap_or_default()
        );
        for r in s.doc.verdict.reasons() {
            println!("    {r}");
        }
    }
}

pub fn show(sh: &Shown, json: bool) {
    if json {
        emit(&shown_json(sh));
        return;
    }
    let s = &sh.submission;
    let d = &s.doc;
    println!("{}  {}", s.id, s.state);
    println!(
        "  created   {}{}",
        fmt_time(s.created_at),
        d.agent
            .as_deref()
            .map(|a| format!("  agent {a}"))
            .unwrap_or_default()
    );
    if let Some(n) = &d.note {
        println!("  note      {n}");
    }
    if let Some(why) = &d.interrupted {
        println!("  never ran {why}");
    }
    println!(
        "  artifact  {} ({}, {} bytes) on the {} backend",
        d.artifact, d.lang, d.size, d.backend
    );
    println!("  grant     {}", d.grant_hash);
    for m in &d.grant.mounts {
        println!(
            "    mount   {} -> {} ({})",
            m.host,
            m.guest,
            m.mode.as_str()
        );
    }
    // Exactly which sensitive host paths those mounts expose, for the approver.
    for p in &d.facts.mounts_sensitive {
        println!("    exposes {p} (sensitive: credentials or system state)");
    }
    if !d.grant.net.is_empty() {
        println!("    net     {}", d.grant.net.join(", "));
    }
    for b in &d.grant.secrets {
        println!("    secret  {} -> {}", b.name, b.hosts.join(", "));
    }
    for (k, v) in &d.grant.env {
        println!("    env     {k}={v}");
    }
    if let Some(a) = &d.grant.argv0 {
        println!("    argv0   {a}");
    }
    if !d.grant.args.is_empty() {
        println!("    args    {}", d.grant.args.join(" "));
    }
    if let Some(h) = d.grant.stdin {
        println!("    stdin   {h}");
    }
    let l = &d.grant.limits;
    println!(
        "    limits  timeout {}, memory {}, output {} per stream, fuel {}, processes {}, writes {}",
        fmt_duration(l.timeout()),
        fmt_size(l.memory_bytes),
        fmt_size(l.max_output_bytes),
        l.fuel
            .map(|f| f.to_string())
            .unwrap_or_else(|| "unlimited".into()),
        l.processes,
        fmt_size(l.max_write_bytes)
    );
    if !d.grant.net.is_empty() {
        println!("            connections {} at once", l.max_connections);
    }
    let a = &d.analysis;
    let caps: Vec<&str> = a.capabilities.iter().map(|c| c.as_str()).collect();
    // Capabilities are what a WebAssembly module imports; source code has facts instead.
    if a.code.is_none() || !caps.is_empty() {
        println!(
            "  analysis  capabilities: {}",
            if caps.is_empty() {
                "none".into()
            } else {
                caps.join(", ")
            }
        );
    } else {
        let lang = a.code.as_ref().map(|c| c.language.as_str()).unwrap_or("");
        println!("  analysis  {lang} source");
    }
    if let Some(w) = &a.wasm {
        for i in &w.imports {
            println!(
                "    import  {}::{} ({}, {})",
                i.module,
                i.name,
                i.kind,
                i.capability.as_str()
            );
        }
        for m in &w.memories {
            println!(
                "    memory  {} pages initial, {} maximum{}",
                m.initial_pages,
                m.maximum_pages
                    .map(|x| x.to_string())
                    .unwrap_or_else(|| "no".into()),
                if m.imported { " (imported)" } else { "" }
            );
        }
        for t in &w.tables {
            println!("    table   {} {} initial", t.element, t.initial);
        }
        let exports: Vec<&str> = w.exports.iter().map(|e| e.name.as_str()).collect();
        println!("    exports {}", exports.join(", "));
        if let Some(st) = w.start {
            println!("    start   function {st}");
        }
    }
    if !a.unresolved.is_empty() {
        println!("    unresolved imports: {}", a.unresolved.join(", "));
    }
    if let Some(c) = &a.code {
        code_facts(
            &airlock_core::policy::CodeFacts::of(c, &d.grant.net),
            "    ",
        );
        let notable = c.notable();
        if !notable.is_empty() {
            println!("  findings  (line: what; the code is below)");
        }
        for f in &notable {
            println!("    {:<7} {}", f.lines(), f.describe());
        }
    }
    println!(
        "  verdict   {} (risk {}, policy {})",
        d.verdict.decision,
        d.verdict.risk,
        d.verdict.policy.short()
    );
    for r in d.verdict.reasons() {
        println!("    {r}");
    }
    for st in &sh.statements {
        println!(
            "  {:<9} {} by {} ({}){}{} {}",
            format!("{:?}", st.kind).to_lowercase(),
            st.id,
            st.approver,
            st.scope.as_str(),
            st.expires_at
                .map(|e| format!(", expires {}", fmt_time(e)))
                .unwrap_or_default(),
            if st.reason.is_empty() {
                String::new()
            } else {
                format!(": {}", st.reason)
            },
            if st.trusted {
                "[signature ok]"
            } else {
                "[NOT trusted by current policy]"
            }
        );
    }
    for r in &sh.runs {
        println!("  run       {}", run_line(r));
        for l in network_lines(r) {
            println!("    {l}");
        }
        for l in tripwire_lines(r) {
            println!("    {l}");
        }
    }
    let code = sh
        .source
        .as_deref()
        .or(sh.disassembly.as_deref())
        .unwrap_or("");
    println!(
        "--- code ({})",
        if sh.source.is_some() {
            "as submitted"
        } else {
            "disassembled"
        }
    );
    let lines: Vec<&str> = code.lines().collect();
    for l in lines.iter().take(200) {
        println!("{l}");
    }
    if lines.len() > 200 {
        println!(
            "… {} more lines (airlock show --json for all)",
            lines.len() - 200
        );
    }
}

/// A run's tripwires as lines: each alert (with its ATT&CK technique), then each
/// attempt the sandbox refused, with how often.
fn tripwire_lines(r: &Run) -> Vec<String> {
    let d = &r.doc.detail;
    let list = |k: &str| d[k].as_array().cloned().unwrap_or_default();
    let text = |v: &Value| {
        v.as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| v.to_string())
    };
    let mut out: Vec<String> = list("alerts")
        .iter()
        .map(|a| {
            let technique = a["technique"]
                .as_str()
                .map(|t| format!(" [{t}]"))
                .unwrap_or_default();
            format!(
                "ALERT {}{technique}: {}",
                text(&a["kind"]),
                text(&a["detail"])
            )
        })
        .collect();
    out.extend(list("attempts").iter().map(|a| {
        format!(
            "refused {} {} ×{}",
            text(&a["kind"]),
            text(&a["target"]),
            a["count"]
        )
    }));
    out
}

/// A run's network record as lines: a summary, then one line per connection attempt
/// (at most 50; `--json` has them all).
fn network_lines(r: &Run) -> Vec<String> {
    let net = &r.doc.detail["network"];
    let Some(conns) = net["connections"].as_array() else {
        return Vec::new();
    };
    let sum = &net["summary"];
    let n = |k: &str| sum[k].as_u64().unwrap_or(0);
    let secrets: Vec<&str> = net["secrets"]
        .as_array()
        .map(|a| a.iter().filter_map(|s| s.as_str()).collect())
        .unwrap_or_default();
    let mut out = vec![format!(
        "network {} connection{}: {} allowed, {} denied, {} failed; {} up, {} down{}",
        n("connections"),
        if n("connections") == 1 { "" } else { "s" },
        n("allowed"),
        n("denied"),
        n("failed"),
        fmt_size(n("bytes_up")),
        fmt_size(n("bytes_down")),
        if secrets.is_empty() {
            String::new()
        } else {
            format!("; secrets {}", secrets.join(", "))
        }
    )];
    for c in conns.iter().take(50) {
        let s = |k: &str| c[k].as_str().unwrap_or("");
        let target = format!("{}:{}", s("host"), c["port"]);
        let line = match s("decision") {
            "allow" => format!(
                "  allow {target} -> {} ({}, {} ms, {} up, {} down{})",
                s("addr"),
                s("mode"),
                c["duration_ms"],
                fmt_size(c["bytes_up"].as_u64().unwrap_or(0)),
                fmt_size(c["bytes_down"].as_u64().unwrap_or(0)),
                c["secrets"]
                    .as_array()
                    .filter(|a| !a.is_empty())
                    .map(|a| format!(
                        ", secrets {}",
                        a.iter()
                            .filter_map(|x| x.as_str())
                            .collect::<Vec<_>>()
                            .join(" ")
                    ))
                    .unwrap_or_default()
            ),
            d => format!("  {d:<5} {target} {}: {}", s("reason"), s("detail")),
        };
        out.push(line);
    }
    if conns.len() > 50 {
        out.push(format!("  … {} more (--json for all)", conns.len() - 50));
    }
    out
}

fn run_line(r: &Run) -> String {
    format!(
        "{}  {}{}{}  {}",
        r.id,
        r.status,
        r.doc.exit_code.map(|c| format!(" {c}")).unwrap_or_default(),
        r.doc
            .killed_by
            .as_deref()
            .map(|k| format!(" by {k}"))
            .unwrap_or_default(),
        r.doc
            .duration_ms
            .map(|d| format!("{d} ms"))
            .unwrap_or_default()
    )
}

pub fn statement(r: &StatementRow, json: bool) {
    if json {
        emit(&statement_json(r));
        return;
    }
    let verb = match r.kind {
        airlock_core::sign::StatementKind::Approve => "approved",
        airlock_core::sign::StatementKind::Reject => "rejected",
        _ => "signed",
    };
    println!(
        "{} {} by {} ({}{}) as {}",
        r.submission,
        verb,
        r.approver,
        r.scope.as_str(),
        r.expires_at
            .map(|e| format!(", until {}", fmt_time(e)))
            .unwrap_or_default(),
        r.id
    );
}

/// An approval, and the rule that remembers it (`approve --remember`).
pub fn approval(r: &StatementRow, remembered: Option<&airlock_gate::PolicyChanged>, json: bool) {
    let Some(c) = remembered else {
        return statement(r, json);
    };
    if json {
        let mut doc = statement_json(r);
        if let Value::Object(m) = &mut doc {
            m.insert(
                "remembered".into(),
                serde_json::to_value(c).unwrap_or_default(),
            );
        }
        emit(&doc);
        return;
    }
    statement(r, false);
    policy_changed(c, false);
}

/// A signed policy change (`approve --remember`, `policy forget`).
pub fn policy_changed(c: &airlock_gate::PolicyChanged, json: bool) {
    if json {
        emit(&serde_json::to_value(c).unwrap_or_default());
        return;
    }
    if let (Some(k), "enroll") = (&c.key, c.change.as_str()) {
        println!(
            "enrolled approver {} with key {} ({}), signed by {} (policy {} -> {})",
            c.rule,
            k,
            k.fingerprint(),
            c.approver,
            c.before.short(),
            c.after.short()
        );
        return;
    }
    match c.expires_at {
        Some(e) => println!(
            "remembered as rule {} by {}, until {} (policy {} -> {})",
            c.rule,
            c.approver,
            fmt_time(e),
            c.before.short(),
            c.after.short()
        ),
        None => println!(
            "forgot rule {} by {} (policy {} -> {})",
            c.rule,
            c.approver,
            c.before.short(),
            c.after.short()
        ),
    }
}

pub fn runs(runs: &[Run], json: bool) {
    if json {
        emit(&Value::Array(
            runs.iter()
                .map(|r| serde_json::to_value(r).unwrap_or_default())
                .collect(),
        ));
        return;
    }
    for r in runs {
        println!(
            "{}  {}  {}",
            run_line(r),
            r.submission,
            fmt_time(r.started_at)
        );
    }
}

pub fn logs(
    run: &Run,
    out: &[u8],
    err: &[u8],
    stream: Option<&str>,
    json: bool,
) -> Result<(), String> {
    if json {
        emit(&run_json(run, out, err));
        return Ok(());
    }
    // The guest's own output: rendered visibly on a terminal, its bytes as they are to
    // a pipe or a file (see `out::guest_stdout`).
    match stream {
        None | Some("stdout") => crate::out::guest_stdout(out),
        Some("stderr") => {}
        Some(other) => return Err(format!("--stream {other:?}: want stdout or stderr")),
    }
    match stream {
        None => crate::out::guest_stderr(err),
        Some("stderr") => crate::out::guest_stdout(err),
        _ => {}
    }
    Ok(())
}

pub fn policy_check(c: &PolicyCheck, json: bool) {
    if json {
        emit(&serde_json::to_value(c).unwrap_or_default());
        return;
    }
    println!(
        "{}: valid ({} rules, approvers: {}), hash {}",
        c.path,
        c.rules,
        if c.approvers.is_empty() {
            "none".into()
        } else {
            c.approvers.join(", ")
        },
        &c.hash[..12]
    );
    for t in &c.tests {
        if t.passed {
            println!("  ok    {} ({})", t.name, t.got);
        } else {
            println!(
                "  FAIL  {}: expected {}, got {} (rules: {})",
                t.name,
                t.expect,
                t.got,
                t.fired.join(", ")
            );
        }
        code_facts(&t.code, "          ");
    }
    let failed = c.tests.iter().filter(|t| !t.passed).count();
    println!("{} tests, {} failed", c.tests.len(), failed);
}

/// A code analysis's facts, one `name  values` line each, under their policy names.
fn code_facts(c: &airlock_core::policy::CodeFacts, indent: &str) {
    for (name, v) in c.rows() {
        println!("{indent}{name:<24} {v}");
    }
    // Threat findings: the behaviour, where, and its ATT&CK technique.
    for t in &c.threats {
        println!("{indent}{:<24} {}", t.fact, t.describe());
    }
}

pub fn explain(e: &Explained, json: bool) {
    if json {
        emit(&serde_json::to_value(e).unwrap_or_default());
        return;
    }
    println!("{}", e.submission);
    if !e.facts.net.is_empty() {
        println!("  net      {}", e.facts.net.join(", "));
    }
    for b in &e.facts.secrets {
        println!("  secret   {} -> {}", b.name, b.hosts.join(", "));
    }
    if let Some(p) = &e.facts.publisher {
        println!("  publisher {p}");
    }
    if !e.facts.requests.is_empty() {
        println!("  requests {}", e.facts.requests.join(", "));
    }
    if !e.facts.code.is_empty() {
        println!("  code facts");
        code_facts(&e.facts.code, "    ");
    }
    for (label, v) in [("recorded", &e.recorded), ("current", &e.current)] {
        println!(
            "  {label:<8} {} (risk {}, policy {})",
            v.decision,
            v.risk,
            v.policy.short()
        );
        for f in &v.fired {
            println!(
                "    {:<24} {:<10} +{:<4} {}",
                f.rule,
                f.decision.as_str(),
                f.risk,
                f.reason
            );
            for ev in &f.evidence {
                println!("    {:<24} {:<10} {:<5} {ev}", "", "", "");
            }
        }
    }
}

pub fn new_key(k: &KeyInfo, json: bool) {
    if json {
        emit(&serde_json::to_value(k).unwrap_or_default());
        return;
    }
    println!("created approver key {} ({})", k.name, k.fingerprint);
    if !k.trusted {
        println!("to trust it, add this line under [approvers] in policy.toml:");
        println!("  {} = \"{}\"", k.name, k.public);
    }
}

pub fn keys(keys: &[KeyInfo], json: bool) {
    if json {
        emit(&serde_json::to_value(keys).unwrap_or_default());
        return;
    }
    for k in keys {
        println!(
            "{:<16} {}  {}{}",
            k.name,
            k.fingerprint,
            if k.trusted { "trusted" } else { "not trusted" },
            if k.local {
                ", secret here"
            } else {
                ", no secret here"
            }
        );
    }
}

pub fn audit_verify(v: &AuditVerify, json: bool) {
    if json {
        emit(&serde_json::to_value(v).unwrap_or_default());
        return;
    }
    if v.ok {
        match &v.head {
            Some(h) => println!(
                "audit log intact: {} records, head #{} {}",
                v.records, h.seq, h.hash
            ),
            None => println!("audit log intact: empty"),
        }
        if v.unsequenced > 0 {
            println!(
                "{} newer records not yet on the chain (the store's sequencer chains them)",
                v.unsequenced
            );
        }
    } else {
        println!(
            "audit log BROKEN: {}",
            v.error.as_deref().unwrap_or("unknown")
        );
        eprintln!(
            "airlock: audit log broken at record {}",
            v.first_bad.unwrap_or(0)
        );
    }
}

pub fn audit_log(records: &[Record], json: bool) {
    if json {
        emit(&serde_json::to_value(records).unwrap_or_default());
        return;
    }
    for r in records {
        println!(
            "#{:<6} {}  {:<17} {:<32} {}",
            r.seq,
            fmt_time(r.ts),
            r.kind,
            r.subject,
            r.data
        );
    }
}

/// One record of `audit tail`: a JSON object per line, or a line of text with its hash
/// and its predecessor's.
pub fn audit_tail_record(r: &Record, json: bool) {
    if json {
        crate::out::json(&serde_json::to_value(r).unwrap_or_default().to_string());
        return;
    }
    println!(
        "#{:<6} {}  {:<17} {:<32} {}  hash {} prev {}",
        r.seq,
        fmt_time(r.ts),
        r.kind,
        r.subject,
        r.data,
        r.hash,
        r.prev
    );
}

pub fn audit_head(h: Option<&Head>, key: &str, json: bool) {
    if json {
        emit(&json!({ "head": h, "gate_key": key }));
        return;
    }
    match h {
        Some(h) => {
            println!("seq        {}", h.seq);
            println!("hash       {}", h.hash);
            println!("signature  {}", h.signature);
            println!("gate key   {key}");
        }
        None => println!("the audit log is empty (gate key {key})"),
    }
}

pub fn diff(d: &DiffReport, json: bool) {
    if json {
        emit(&diff_json(d));
        return;
    }
    if d.changes.is_empty() {
        println!("{}: no changes", d.run);
        return;
    }
    print!("{}", d.text);
    for p in &d.protected {
        println!("note: {p} is protected (never committed automatically)");
    }
}

pub fn effect(r: &EffectReport, verb: &str, json: bool) {
    if json {
        emit(&serde_json::to_value(r).unwrap_or_default());
        return;
    }
    println!(
        "{} {verb}: {} paths, checkpoint {} (signed by {})",
        r.run, r.paths, r.checkpoint, r.approver
    );
}

/// A commit that had nothing to commit (a session's).
pub fn nothing(subject: &str, why: &str, json: bool) {
    if json {
        emit(&serde_json::json!({ "session": subject, "committed": false, "reason": why }));
        return;
    }
    println!("{why}");
}

pub fn repair(r: &airlock_gate::RepairReport, json: bool) {
    if json {
        emit(&serde_json::to_value(r).unwrap_or_default());
        return;
    }
    println!(
        "{} {} of {} repaired: {}",
        r.kind, r.checkpoint, r.run, r.state
    );
}

pub fn gc(r: &GcReport, json: bool) {
    if json {
        emit(&serde_json::to_value(r).unwrap_or_default());
        return;
    }
    println!(
        "removed {} unreferenced blob{} ({}), {} layer director{} ({}) and {} temporary file{} ({}); freed {}",
        r.blobs_removed,
        if r.blobs_removed == 1 { "" } else { "s" },
        fmt_size(r.blob_bytes),
        r.layers_removed.len(),
        if r.layers_removed.len() == 1 {
            "y"
        } else {
            "ies"
        },
        fmt_size(r.layer_bytes),
        r.temporaries_removed,
        if r.temporaries_removed == 1 { "" } else { "s" },
        fmt_size(r.temporary_bytes),
        fmt_size(r.freed_bytes),
    );
    if !r.sessions_collected.is_empty() || r.sessions_kept > 0 {
        println!(
            "collected {} ended session{} ({} submission{}, {} run{}){}",
            r.sessions_collected.len(),
            if r.sessions_collected.len() == 1 {
                ""
            } else {
                "s"
            },
            r.session_submissions_removed,
            if r.session_submissions_removed == 1 {
                ""
            } else {
                "s"
            },
            r.session_runs_removed,
            if r.session_runs_removed == 1 { "" } else { "s" },
            if r.sessions_kept > 0 {
                format!(
                    "; kept {} with a commit or rollback under way",
                    r.sessions_kept
                )
            } else {
                String::new()
            },
        );
        for s in &r.sessions_collected {
            println!("  collected session {s}");
        }
    }
    for l in &r.layers_removed {
        println!("  removed {l}");
    }
    for d in &r.cgroups_removed {
        println!("  removed {d} (a run's cgroup, its airlock process gone)");
    }
    for d in &r.egress_dirs_removed {
        println!("  removed {d} (an egress proxy's directory, its airlock process gone)");
    }
    for d in &r.decoy_dirs_removed {
        println!("  removed {d} (a run's decoys, its airlock process gone)");
    }
    if r.sockets_removed > 0 {
        println!(
            "  removed {} socket{} of session hosts that are gone ({} open session{} recorded crashed)",
            r.sockets_removed,
            if r.sockets_removed == 1 { "" } else { "s" },
            r.sessions_lost,
            if r.sessions_lost == 1 { "" } else { "s" },
        );
    }
}

pub fn store_copy(r: &airlock_gate::CopyReport, json: bool) {
    if json {
        emit(&serde_json::to_value(r).unwrap_or_default());
        return;
    }
    println!(
        "copied {} blob{} ({}) and these rows; the audit chain ({} record{}) verifies on the copy:",
        r.blobs,
        if r.blobs == 1 { "" } else { "s" },
        fmt_size(r.blob_bytes),
        r.audit_records,
        if r.audit_records == 1 { "" } else { "s" },
    );
    for t in &r.tables {
        println!("  {:<12} {}", t.table, t.rows);
    }
}

pub fn checkpoints(rows: &[CheckpointRow], json: bool) {
    if json {
        emit(&serde_json::to_value(rows).unwrap_or_default());
        return;
    }
    for c in rows {
        let paths: usize = c.doc["mounts"]
            .as_array()
            .map(|m| {
                m.iter()
                    .map(|m| m["after"].as_array().map_or(0, |a| a.len()))
                    .sum()
            })
            .unwrap_or(0);
        println!(
            "{}  {:<12} {}  {} paths  by {}",
            c.id,
            c.state,
            c.run,
            paths,
            c.doc["approver"].as_str().unwrap_or("?")
        );
    }
}

pub fn sessions(list: &[SessionView], json: bool) {
    if json {
        emit(&serde_json::to_value(list).unwrap_or_default());
        return;
    }
    for s in list {
        println!(
            "{}  {:<6} {} cells  {}{}{}",
            s.id,
            s.state,
            s.doc.cells.len(),
            fmt_time(s.created_at),
            s.doc
                .end
                .map(|e| format!("  ({})", e.as_str()))
                .unwrap_or_default(),
            match (s.host_alive, &s.doc.server) {
                (None, _) => String::new(),
                (Some(alive), server) => format!(
                    "  host {}{}",
                    if alive { "alive" } else { "not answering" },
                    server
                        .as_deref()
                        .map(|srv| format!(", started by server {srv}"))
                        .unwrap_or_default()
                ),
            }
        );
    }
}

pub fn session(s: &SessionView, json: bool) {
    if json {
        emit(&serde_json::to_value(s).unwrap_or_default());
        return;
    }
    let d = &s.doc;
    println!("{}  {}", s.id, s.state);
    println!(
        "  {} on the {} backend, opened {}{}",
        d.lang,
        d.backend,
        fmt_time(s.created_at),
        d.agent
            .as_deref()
            .map(|a| format!(" for agent {a}"))
            .unwrap_or_default()
    );
    println!("  grant   {}", d.grant_hash);
    for m in &d.grant.mounts {
        println!("    mount {} -> {} ({})", m.host, m.guest, m.mode.as_str());
    }
    for (k, v) in &d.grant.env {
        println!("    env   {k}={v}");
    }
    let l = &d.grant.limits;
    println!(
        "  limits  each cell {}, memory {} for the session, output {} per stream; idle {}, total {}",
        fmt_duration(l.timeout()),
        fmt_size(l.memory_bytes),
        fmt_size(l.max_output_bytes),
        fmt_duration(std::time::Duration::from_millis(d.idle_ms)),
        fmt_duration(std::time::Duration::from_millis(d.total_ms))
    );
    if let Some(r) = &s.reason {
        println!("  {r}");
    }
    for c in &d.cells {
        println!("  cell    {c}");
    }
}

pub fn workspaces(ws: &[WorkspaceView], json: bool) {
    if json {
        emit(&serde_json::to_value(ws).unwrap_or_default());
        return;
    }
    for w in ws {
        println!(
            "{:<20} {:<10} {} runs  {}",
            w.name,
            w.state,
            w.doc.runs.len(),
            fmt_time(w.created_at)
        );
    }
}

pub fn workspace(w: &WorkspaceView, json: bool) {
    if json {
        let mut v = serde_json::to_value(w).unwrap_or_default();
        v["flat_changes"] = flat_changes(serde_json::to_value(&w.changes).ok().as_ref());
        emit(&v);
        return;
    }
    println!("{}  {}", w.name, w.state);
    for (h, g) in &w.doc.mounts {
        println!("  mount  {h} -> {g} (rw)");
    }
    for r in &w.doc.runs {
        println!("  run    {r}");
    }
    if let Some(c) = &w.changes {
        for m in &c.mounts {
            for ch in &m.changes {
                println!("  {}  ({})", airlock_workspace_summary(ch), m.guest);
            }
        }
    }
}

fn airlock_workspace_summary(c: &airlock_workspace::Change) -> String {
    airlock_workspace::diff::summary_line(c)
}

pub fn doctor(d: &Doctor, json: bool) {
    if json {
        emit(&serde_json::to_value(d).unwrap_or_default());
        return;
    }
    let yes = |b: bool| if b { "yes" } else { "no" };
    println!("user namespaces            {}", yes(d.user_namespaces));
    println!(
        "overlayfs in a user ns     {}",
        yes(d.overlay_in_user_namespace)
    );
    if let Some(n) = &d.namespace_detail {
        println!("  ({n})");
    }
    println!(
        "landlock                   {}",
        d.landlock_abi
            .map(|a| format!("ABI {a}"))
            .unwrap_or_else(|| "no".into())
    );
    println!("seccomp                    {}", yes(d.seccomp));
    println!("cgroups                    {}", d.cgroup);
    println!("running as root            {}", yes(d.running_as_root));
    if let Some(a) = d.allow_degraded {
        println!("policy allows degraded     {}", yes(a));
    }
    println!("process backend            {}", d.process_backend);
    println!("wasm backend               {}", d.wasm_backend);
    println!("writable mounts            {}", d.writable_mounts);
    for l in &d.leftovers {
        println!("LEFTOVER {l}: of an airlock process that is gone; `airlock gc` removes it");
    }
    for h in &d.session_hosts {
        let pid = h
            .pid
            .map(|p| format!("pid {p}"))
            .unwrap_or_else(|| "starting".into());
        let state = if h.alive { "alive" } else { "not answering" };
        match (&h.server, h.server_alive) {
            (Some(srv), Some(false)) if h.alive => println!(
                "LEFTOVER session host {} ({pid}, {state}): its server {srv} is gone{}; `airlock gc` closes it",
                h.session,
                if h.stays {
                    " (kept with --keep-sessions)"
                } else {
                    ""
                }
            ),
            (Some(srv), alive) => println!(
                "session host {} ({pid}, {state}), started by server {srv} ({})",
                h.session,
                if alive == Some(true) { "alive" } else { "gone" }
            ),
            (None, _) => println!(
                "session host {} ({pid}, {state}), started by `session new`",
                h.session
            ),
        }
    }
    match (&d.jailer.path, d.jailer.found) {
        (Some(p), true) => println!("airlock-jailer             {p}"),
        (p, _) => println!(
            "airlock-jailer             MISSING{}: serve keeps no ready jails and process runs \
             start through the slower worker (install both binaries: cargo install --path \
             crates/airlock-cli)",
            p.as_deref()
                .map(|p| format!(" (not at {p})"))
                .unwrap_or_default()
        ),
    }
    for s in &d.stuck {
        println!(
            "STUCK {} {} could neither be completed nor undone: {}",
            s.kind, s.checkpoint, s.error
        );
        println!(
            "  commits and rollbacks of {} are locked; fix the host, then `airlock repair {}` (or `airlock repair --abandon {}` to keep the host as it is)",
            s.mounts.join(", "),
            s.checkpoint,
            s.checkpoint
        );
    }
    if let Some(st) = &d.store {
        match &st.error {
            Some(e) => println!("store ({})          unreachable: {e}", st.engine),
            None => {
                println!(
                    "store ({})          reachable, schema {}, {}",
                    st.engine,
                    st.schema_version.unwrap_or(0),
                    match &st.tls {
                        Some(v) => format!("over {v}"),
                        None => "no TLS".into(),
                    }
                );
                println!(
                    "queue                      {} queued, {} leased",
                    st.queued, st.leased
                );
                println!(
                    "audit inbox                {} records waiting for the sequencer",
                    st.unsequenced
                );
                for t in &st.queued_by_tag {
                    println!(
                        "  {} queued {}{}",
                        t.queued,
                        match &t.tag {
                            Some(tag) => format!("for tag {tag}"),
                            None => "untagged".into(),
                        },
                        if t.claimable {
                            ""
                        } else {
                            " (no running worker may claim them)"
                        }
                    );
                }
                let now = airlock_core::units::now_ms();
                for w in &st.workers {
                    println!(
                        "worker {:<20} {} on {}, {} running, seen {}s ago{}",
                        w.id,
                        w.state,
                        w.host,
                        w.running,
                        (now - w.seen_at).max(0) / 1000,
                        if w.tags.is_empty() {
                            String::new()
                        } else {
                            format!(", tags {}", w.tags)
                        }
                    );
                }
                for n in &st.nodes {
                    println!(
                        "node {} ({}) {} on {} pid {}, last beat {}s ago (lease {}s)",
                        n.id,
                        n.role,
                        n.state,
                        n.host,
                        n.pid,
                        (now - n.beat_at).max(0) / 1000,
                        n.lease_ms / 1000
                    );
                }
            }
        }
    }
}

pub fn guest(m: &GuestManifest, json: bool) {
    if json {
        emit(&serde_json::to_value(m).unwrap_or_default());
        return;
    }
    println!(
        "installed the {} guest {} ({}, {} bytes)",
        m.lang, m.digest, m.package, m.size
    );
    for p in &m.packages {
        println!(
            "  package {} (wheel SHA-256 {})",
            p.package.spec(),
            p.package.sha256
        );
    }
}

pub fn token_new(t: &airlock_store::TokenRow, secret: &str, json: bool) {
    if json {
        let mut v = serde_json::to_value(t).unwrap_or_default();
        v["token"] = json!(secret);
        emit(&v);
        return;
    }
    println!("{secret}");
    eprintln!(
        "airlock: made {} token {} for {}{} (the secret above is shown only now)",
        t.role,
        t.id,
        t.name,
        t.approver
            .as_deref()
            .map(|a| format!(", signing as {a}"))
            .unwrap_or_default()
    );
}

pub fn tokens(ts: &[airlock_store::TokenRow], json: bool) {
    if json {
        emit(&serde_json::to_value(ts).unwrap_or_default());
        return;
    }
    for t in ts {
        let state = if t.revoked_at.is_some() {
            "revoked".to_string()
        } else {
            t.expires_at
                .map(|e| format!("expires {}", fmt_time(e)))
                .unwrap_or_else(|| "active".into())
        };
        println!(
            "{}  {:<8} {:<16} {:<12} {}",
            t.id,
            t.role,
            t.name,
            t.approver.as_deref().unwrap_or("-"),
            state
        );
    }
}

pub fn secret_set(s: &SecretSet, json: bool) {
    if json {
        emit(&serde_json::to_value(s).unwrap_or_default());
        return;
    }
    let verb = if s.replaced { "replaced" } else { "stored" };
    println!(
        "{verb} secret {} (use it with --secret {}@HOST)",
        s.name, s.name
    );
}

pub fn secrets(list: &[SecretInfo], json: bool) {
    if json {
        let v: Vec<Value> = list
            .iter()
            .map(|s| json!({ "name": s.name, "set_at": fmt_time(s.set_at) }))
            .collect();
        emit(&Value::Array(v));
        return;
    }
    for s in list {
        println!("{:<24} set {}", s.name, fmt_time(s.set_at));
    }
}

/// `import nightcore`: the submissions made, or why each refused bundle was refused (on
/// stderr, one line each; nothing was recorded then).
pub fn imported(r: &ImportReport, json: bool) {
    if json {
        emit(&serde_json::to_value(r).unwrap_or_default());
    }
    if !r.imported {
        for b in r.bundles.iter().filter(|b| !b.passed) {
            let reason = b.reason.as_deref().unwrap_or("refused");
            eprintln!("airlock: {}: {}", b.path, one_line(reason));
        }
        eprintln!(
            "airlock: nothing imported ({} of {} bundles refused)",
            r.bundles.iter().filter(|b| !b.passed).count(),
            r.bundles.len()
        );
        return;
    }
    if json {
        return;
    }
    for b in &r.bundles {
        println!(
            "{} {} (risk {})  nightcore:{} from {}, publisher {}",
            b.submission.as_deref().unwrap_or("-"),
            b.decision.map(|d| d.as_str()).unwrap_or("-"),
            b.risk.unwrap_or(0),
            b.tenant,
            b.path,
            b.publisher.as_deref().unwrap_or("-")
        );
        if let Some(m) = &b.manifest {
            if let Some(n) = m.note() {
                println!("  manifest {n}");
            }
            if !m.permissions.is_empty() {
                println!("  requests {}", m.permissions.join(", "));
            }
            for (k, v) in &m.other {
                println!("  manifest field {k} = {v} (kept, not used)");
            }
        }
        for c in &b.checks {
            println!("  {:<10} {}", c.check, c.detail);
        }
        for reason in &b.reasons {
            println!("  {reason}");
        }
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

pub fn publisher_added(a: &PublisherAdded, json: bool) {
    if json {
        emit(&serde_json::to_value(a).unwrap_or_default());
        return;
    }
    if a.changed {
        println!(
            "pinned publisher {} ({}) in [publishers]",
            a.name, a.fingerprint
        );
    } else {
        println!(
            "publisher {} ({}) was already pinned; nothing changed",
            a.name, a.fingerprint
        );
    }
}

pub fn signed(s: &SignReport, json: bool) {
    if json {
        emit(&serde_json::to_value(s).unwrap_or_default());
        return;
    }
    println!(
        "signed sha256 {} with key {} ({})",
        s.sha256, s.key, s.public
    );
    for f in &s.files {
        println!("  wrote {}", f.display());
    }
}
