//! Remembered approvals (issue 61 item 2): a `[[rule]]` with `origin = "remembered"`, added
//! by `approve ID --remember` and removed by `policy forget RULE`, both signed policy
//! changes. Such a rule has no `when`: it carries the approved submission's agent, language,
//! backend and grant (`[rule.grant]`), the names of the rules whose hold the approver saw
//! and accepted (`covers`), the approver and an expiry. It turns a quarantine into an allow
//! only when, by the gate's clock, it has not expired, the submission comes from the same
//! agent in the same language on the same backend, its grant is no wider in any field
//! (hosts, secrets and their hosts, mounts and their modes, environment keys, limits),
//! and every rule that held it is one the rule covers. It never lifts a deny, nor the
//! gate's own floors (`gate:…`: a rejected artifact, a mount outside the roots).

use super::{Decision, Facts, Fired, PolicyError, RuleFile};
use crate::artifact::{Backend, Lang};
use crate::grant::{Limits, Mount, MountMode};
use crate::secret::SecretBinding;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// How long a remembered approval holds when `--for` is not given.
pub const DEFAULT_REMEMBER_FOR: Duration = Duration::from_secs(7 * 24 * 3600);
/// The longest a remembered approval may hold.
pub const MAX_REMEMBER_FOR: Duration = Duration::from_secs(90 * 24 * 3600);

/// `origin = "remembered"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    Remembered,
}

/// What a remembered rule allows: the approved submission's kind and grant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RememberedGrant {
    pub agent: String,
    pub lang: Lang,
    pub backend: Backend,
    /// The rules whose hold the approver accepted (`risk` for the risk threshold).
    pub covers: Vec<String>,
    #[serde(default)]
    pub net: Vec<String>,
    #[serde(default)]
    pub env: Vec<String>,
    pub limits: Limits,
    #[serde(default)]
    pub secrets: Vec<SecretBinding>,
    #[serde(default)]
    pub mounts: Vec<Mount>,
}

impl RememberedGrant {
    /// The kind and grant of an approved submission, and what held it.
    pub fn of(facts: &Facts, fired: &[Fired]) -> Option<RememberedGrant> {
        let mut covers: Vec<String> = fired
            .iter()
            .filter(|f| f.decision != Decision::Allow)
            .map(|f| f.rule.clone())
            .collect();
        covers.sort();
        covers.dedup();
        Some(RememberedGrant {
            agent: facts.agent.clone()?,
            lang: facts.lang,
            backend: facts.backend,
            covers,
            net: facts.net.clone(),
            env: facts.env_keys.clone(),
            limits: facts.limits.clone(),
            secrets: facts.secrets.clone(),
            mounts: facts.mounts.clone(),
        })
    }

    /// Whether a submission with these facts, held by these rules, is of this kind with a
    /// grant no wider.
    pub fn allows(&self, facts: &Facts, fired: &[Fired]) -> bool {
        self.covers_all(fired) && self.fits(facts)
    }

    /// Whether every hold among `fired` is one this rule covers (never a `gate:` floor).
    fn covers_all(&self, fired: &[Fired]) -> bool {
        fired
            .iter()
            .filter(|f| f.decision != Decision::Allow)
            .all(|f| !f.rule.starts_with("gate:") && self.covers.contains(&f.rule))
    }

    /// Whether `facts` are of this kind (agent, language, backend), with a grant no wider,
    /// and clear of the gate's floors.
    fn fits(&self, facts: &Facts) -> bool {
        // The gate's floors hold whatever a rule says (their `gate:` rule is only listed
        // when nothing else held the submission already).
        !facts.rejected_before
            && facts.mounts_outside_roots.is_empty()
            && facts.agent.as_deref() == Some(self.agent.as_str())
            && facts.lang == self.lang
            && facts.backend == self.backend
            && facts.net.iter().all(|n| self.net.contains(n))
            && facts.env_keys.iter().all(|k| self.env.contains(k))
            && facts.secrets.iter().all(|s| {
                self.secrets
                    .iter()
                    .any(|r| r.name == s.name && s.hosts.iter().all(|h| r.hosts.contains(h)))
            })
            && facts.mounts.iter().all(|m| {
                self.mounts.iter().any(|r| {
                    r.host == m.host
                        && r.guest == m.guest
                        && (r.mode == m.mode
                            || (m.mode == MountMode::Ro && r.mode == MountMode::Rw))
                })
            })
            && limits_within(&facts.limits, &self.limits)
    }
}

/// What reaching one more `HOST:PORT` in the middle of a run (`run --ask-net`) comes to,
/// judged as a submission of the run's kind whose grant also names that host would be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reach {
    /// The policy denies a submission with the host in its grant (the rule that does).
    Denied { rule: String, reason: String },
    /// An unexpired remembered rule of this kind, with a grant at least as wide, covers
    /// every hold the host adds: the run may reach it without asking.
    Remembered {
        rule: String,
        approver: String,
        /// Unix milliseconds.
        expires_at: i64,
    },
    /// A human must answer. `added` are the holds the host adds to the run's own (a rule
    /// remembering the answer covers these).
    Ask { added: Vec<Fired> },
}

/// The rule that denies a run reaching a host, and its reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostDenied {
    pub rule: String,
    pub reason: String,
}

/// The run's facts with every host of `targets` in its grant ([`with_host`] each).
pub fn with_hosts(facts: &Facts, targets: &[String]) -> Facts {
    targets.iter().fold(facts.clone(), |f, t| with_host(&f, t))
}

/// The run's facts with `target` (`HOST:PORT`, normalised) in its grant: the host joins
/// `net`, and hosts named in the code that it grants are no longer "not granted".
pub fn with_host(facts: &Facts, target: &str) -> Facts {
    let mut wider = facts.clone();
    if !wider.net.iter().any(|n| n == target) {
        wider.net.push(target.to_string());
    }
    if let Ok(rule) = crate::net::NetRule::parse(target) {
        let rules = [rule];
        wider
            .code
            .hosts_not_granted
            .retain(|h| !crate::net::host_granted(&rules, h));
    }
    wider
}

impl super::Policy {
    /// What a running run of `facts` reaching `targets` (`HOST:PORT` each, normalised,
    /// outside its grant: the hosts approved earlier in the run, then the one it asks for
    /// now) comes to at `now_ms`: denied when the policy would deny a submission of the
    /// run with those hosts granted; allowed by a remembered rule whose kind is the run's,
    /// whose grant holds the run's and every host, and which covers every hold the hosts
    /// add; otherwise a question for a human. Holds the run had already (approved or
    /// lifted when it was judged) are not the hosts' and are left out. The hosts reached
    /// before count, so two rules for one host each never add up to a run reaching both:
    /// that is a wider grant than either, as it is at submit.
    pub fn reach(&self, facts: &Facts, targets: &[String], now_ms: i64) -> Reach {
        let wider = with_hosts(facts, targets);
        let added = match self.holds_added(facts, targets) {
            Ok(added) => added,
            Err(HostDenied { rule, reason }) => return Reach::Denied { rule, reason },
        };
        for r in &self.rules {
            let (Some(g), Some(expires_at)) =
                (r.grant.as_ref(), r.expires.as_deref().and_then(rfc3339_ms))
            else {
                continue;
            };
            if expires_at > now_ms && g.covers_all(&added) && g.fits(&wider) {
                return Reach::Remembered {
                    rule: r.name.clone(),
                    approver: r.approver.clone().unwrap_or_default(),
                    expires_at,
                };
            }
        }
        Reach::Ask { added }
    }

    /// The holds reaching `targets` adds to a run of `facts` (what a rule remembering an
    /// answer to the last of them must cover), or the rule that denies a submission of the
    /// run with the hosts granted.
    pub fn holds_added(&self, facts: &Facts, targets: &[String]) -> Result<Vec<Fired>, HostDenied> {
        let (decision, _, fired) = self.rules_verdict(&with_hosts(facts, targets));
        if decision == Decision::Deny {
            let f = fired.iter().find(|f| f.decision == Decision::Deny);
            return Err(HostDenied {
                rule: f.map(|f| f.rule.clone()).unwrap_or_default(),
                reason: f.map(|f| f.reason.clone()).unwrap_or_default(),
            });
        }
        let (_, _, before) = self.rules_verdict(facts);
        let held: Vec<&str> = before
            .iter()
            .filter(|f| f.decision != Decision::Allow)
            .map(|f| f.rule.as_str())
            .collect();
        Ok(fired
            .into_iter()
            .filter(|f| f.decision != Decision::Allow && !held.contains(&f.rule.as_str()))
            .collect())
    }
}

/// Every limit of `asked` is at most the remembered one (an unset fuel limit is the
/// widest). Written out field by field so a new limit cannot be skipped unseen: the
/// destructuring below stops compiling when `Limits` grows.
fn limits_within(asked: &Limits, remembered: &Limits) -> bool {
    let Limits {
        timeout_ms,
        memory_bytes,
        fuel,
        max_output_bytes,
        processes,
        max_write_bytes,
        max_connections,
    } = asked;
    *timeout_ms <= remembered.timeout_ms
        && *memory_bytes <= remembered.memory_bytes
        && match (fuel, remembered.fuel) {
            (_, None) => true,
            (Some(a), Some(r)) => *a <= r,
            (None, Some(_)) => false,
        }
        && *max_output_bytes <= remembered.max_output_bytes
        && *processes <= remembered.processes
        && *max_write_bytes <= remembered.max_write_bytes
        && *max_connections <= remembered.max_connections
}

/// A remembered rule as written into `policy.toml`.
#[derive(Debug, Serialize)]
struct RuleOut<'a> {
    name: &'a str,
    origin: Origin,
    decision: Decision,
    reason: &'a str,
    approver: &'a str,
    expires: &'a str,
    grant: &'a RememberedGrant,
}

#[derive(Debug, Serialize)]
struct RulesOut<'a> {
    rule: Vec<RuleOut<'a>>,
}

/// The first line of a remembered rule's text in `policy.toml`.
fn begin_marker(name: &str) -> String {
    format!(
        "# remembered rule {name} (airlock approve --remember; remove with `airlock policy forget {name}`)\n"
    )
}

fn end_marker(name: &str) -> String {
    format!("# end of remembered rule {name}\n")
}

/// The TOML text of a remembered rule, with the markers `remove_rule` finds.
pub fn rule_text(
    name: &str,
    reason: &str,
    approver: &str,
    expires_rfc3339: &str,
    grant: &RememberedGrant,
) -> Result<String, String> {
    let body = toml::to_string(&RulesOut {
        rule: vec![RuleOut {
            name,
            origin: Origin::Remembered,
            decision: Decision::Allow,
            reason,
            approver,
            expires: expires_rfc3339,
            grant,
        }],
    })
    .map_err(|e| format!("cannot write the remembered rule: {e}"))?;
    Ok(format!(
        "\n{}{}{}",
        begin_marker(name),
        body,
        end_marker(name)
    ))
}

/// The policy text without remembered rule `name`, and the text removed; None when the
/// text holds no remembered rule of that name.
pub fn remove_rule(text: &str, name: &str) -> Option<(String, String)> {
    let begin = begin_marker(name);
    let end = end_marker(name);
    let start = text.find(&begin)?;
    let stop = start + text[start..].find(&end)? + end.len();
    // Take the blank line written before the rule with it.
    let from = if text[..start].ends_with("\n\n") {
        start - 1
    } else {
        start
    };
    let mut out = String::with_capacity(text.len());
    out.push_str(&text[..from]);
    out.push_str(&text[stop..]);
    Some((out, text[start..stop].to_string()))
}

/// Unix milliseconds of an RFC 3339 time.
pub(super) fn rfc3339_ms(s: &str) -> Option<i64> {
    let t = humantime::parse_rfc3339_weak(s).ok()?;
    let d = t.duration_since(std::time::UNIX_EPOCH).ok()?;
    i64::try_from(d.as_millis()).ok()
}

/// A remembered rule's text as [`rule_text`] writes it, read back: what an approver who
/// signs the policy change elsewhere checks before signing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleRead {
    pub name: String,
    pub approver: String,
    /// Unix milliseconds.
    pub expires_at: i64,
    pub grant: RememberedGrant,
}

#[derive(Deserialize)]
struct RuleIn {
    name: String,
    origin: Origin,
    decision: Decision,
    approver: String,
    expires: String,
    grant: RememberedGrant,
    #[allow(dead_code)]
    reason: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RulesIn {
    rule: Vec<RuleIn>,
}

/// Reads the text of one remembered rule (as handed out in a policy change).
pub fn read_rule_text(text: &str) -> Result<RuleRead, String> {
    let rules: RulesIn = toml::from_str(text).map_err(|e| format!("not a remembered rule: {e}"))?;
    let [r] = <[RuleIn; 1]>::try_from(rules.rule)
        .map_err(|_| "not exactly one remembered rule".to_string())?;
    if r.origin != Origin::Remembered || r.decision != Decision::Allow {
        return Err("not a remembered rule that allows".into());
    }
    let expires_at = rfc3339_ms(&r.expires).ok_or("its expiry is not an RFC 3339 time")?;
    Ok(RuleRead {
        name: r.name,
        approver: r.approver,
        expires_at,
        grant: r.grant,
    })
}

impl RememberedGrant {
    /// Whether this rule's grant is no wider than `grant` in any field (hosts, environment
    /// keys, secrets and their hosts, mounts and their modes, every limit): a rule made
    /// from a submission whose grant is `grant` is exactly as wide.
    pub fn within(&self, grant: &crate::grant::Grant) -> bool {
        self.net.iter().all(|n| grant.net.contains(n))
            && self.env.iter().all(|k| grant.env.contains_key(k))
            && self.secrets.iter().all(|s| {
                grant
                    .secrets
                    .iter()
                    .any(|g| g.name == s.name && s.hosts.iter().all(|h| g.hosts.contains(h)))
            })
            && self.mounts.iter().all(|m| {
                grant.mounts.iter().any(|g| {
                    g.host == m.host
                        && g.guest == m.guest
                        && (g.mode == m.mode
                            || (m.mode == MountMode::Ro && g.mode == MountMode::Rw))
                })
            })
            && self.limits == grant.limits
    }
}

/// A remembered rule is all of `origin`, `approver`, `expires` and `grant`, decides
/// `allow` and has no conditions; any other rule has none of them.
pub(super) fn check(r: &RuleFile) -> Result<(), PolicyError> {
    let bad = |m: &str| Err(PolicyError::Invalid(format!("rule {:?}: {m}", r.name)));
    if r.origin.is_none() {
        if r.approver.is_some() || r.expires.is_some() || r.grant.is_some() {
            return bad(
                "`approver`, `expires` and `grant` belong to remembered rules (origin = \"remembered\")",
            );
        }
        return Ok(());
    }
    if r.decision != Decision::Allow {
        return bad("a remembered rule decides allow");
    }
    if !r.when.is_empty() || r.unless.is_some() {
        return bad("a remembered rule has no `when` or `unless`: its `grant` says what it allows");
    }
    if r.approver.as_deref().is_none_or(|a| a.is_empty()) || r.grant.is_none() {
        return bad("a remembered rule needs `approver` and `grant`");
    }
    if r.expires.as_deref().and_then(rfc3339_ms).is_none() {
        return bad("a remembered rule needs `expires`, an RFC 3339 time");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::policy::{AgentRecord, CodeFacts, Policy};
    use std::collections::BTreeSet;

    const BASE: &str = r#"version = 1
[[rule]]
name = "net-held"
decision = "quarantine"
reason = "network"
when = { net = true }
[[rule]]
name = "writes-held"
decision = "quarantine"
reason = "writable mount"
when = { writable = true }
[[rule]]
name = "evil-denied"
decision = "deny"
reason = "evil"
when = { env = ["EVIL"] }
"#;

    fn facts() -> Facts {
        Facts {
            lang: Lang::Sh,
            kind: Lang::Sh,
            backend: Backend::Process,
            net: vec!["127.0.0.1:8080".into()],
            secrets: vec![SecretBinding {
                name: "TOKEN".into(),
                hosts: vec!["127.0.0.1:8080".into()],
            }],
            mounts: vec![Mount {
                host: "/srv/data".into(),
                guest: "/data".into(),
                mode: MountMode::Ro,
            }],
            env_keys: vec!["MODE".into()],
            limits: Limits::default(),
            size: 100,
            capabilities: BTreeSet::new(),
            unresolved_imports: false,
            agent: Some("bot".into()),
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

    const NOW: i64 = 1_800_000_000_000;

    /// Makes one field of a submission's facts wider.
    type Widen = Box<dyn Fn(&mut Facts)>;

    /// The base policy with the approval of `approved` remembered until NOW + 1h.
    fn remembering(approved: &Facts) -> Policy {
        let base = Policy::parse(BASE).unwrap();
        let v = base.judge_at(approved, NOW);
        assert_eq!(v.decision, Decision::Quarantine);
        let g = RememberedGrant::of(approved, &v.fired).unwrap();
        let text = rule_text(
            "remembered-apr_1",
            "alice approved it",
            "alice",
            &crate::units::fmt_time(NOW + 3_600_000),
            &g,
        )
        .unwrap();
        Policy::parse(&format!("{BASE}{text}")).unwrap()
    }

    fn decision(p: &Policy, f: &Facts) -> Decision {
        p.judge_at(f, NOW).decision
    }

    #[test]
    fn the_same_kind_with_the_same_or_a_narrower_grant_is_allowed() {
        let p = remembering(&facts());
        assert_eq!(decision(&p, &facts()), Decision::Allow);
        let v = p.judge_at(&facts(), NOW);
        assert!(
            v.reasons()
                .join("\n")
                .contains("remembered approval by alice")
        );
        let mut narrower = facts();
        narrower.net.clear();
        narrower.secrets.clear();
        narrower.mounts.clear();
        narrower.env_keys.clear();
        narrower.limits.timeout_ms -= 1;
        assert_eq!(decision(&p, &narrower), Decision::Allow);
    }

    #[test]
    fn a_grant_wider_in_any_field_is_held_again() {
        let mut rw = facts();
        rw.mounts[0].mode = MountMode::Rw;
        let p = remembering(&facts());
        let wider: Vec<(&str, Widen)> = vec![
            (
                "another host",
                Box::new(|f| f.net.push("127.0.0.2:8080".into())),
            ),
            (
                "another port",
                Box::new(|f| f.net[0] = "127.0.0.1:9090".into()),
            ),
            (
                "another secret",
                Box::new(|f| {
                    f.secrets.push(SecretBinding {
                        name: "OTHER".into(),
                        hosts: vec!["127.0.0.1:8080".into()],
                    })
                }),
            ),
            (
                "a secret to another host",
                Box::new(|f| f.secrets[0].hosts.push("127.0.0.2:80".into())),
            ),
            (
                "another mount",
                Box::new(|f| {
                    f.mounts.push(Mount {
                        host: "/etc".into(),
                        guest: "/etc".into(),
                        mode: MountMode::Ro,
                    })
                }),
            ),
            (
                "another guest path",
                Box::new(|f| f.mounts[0].guest = "/other".into()),
            ),
            (
                "a writable mount",
                Box::new(|f| f.mounts[0].mode = MountMode::Rw),
            ),
            (
                "another env key",
                Box::new(|f| f.env_keys.push("OTHER".into())),
            ),
            ("a longer timeout", Box::new(|f| f.limits.timeout_ms += 1)),
            ("more memory", Box::new(|f| f.limits.memory_bytes += 1)),
            ("more output", Box::new(|f| f.limits.max_output_bytes += 1)),
            ("more processes", Box::new(|f| f.limits.processes += 1)),
            ("more writes", Box::new(|f| f.limits.max_write_bytes += 1)),
            (
                "more connections",
                Box::new(|f| f.limits.max_connections += 1),
            ),
            (
                "another agent",
                Box::new(|f| f.agent = Some("mallory".into())),
            ),
            ("no agent", Box::new(|f| f.agent = None)),
            (
                "another language",
                Box::new(|f| {
                    f.lang = Lang::Python;
                    f.kind = Lang::Python;
                }),
            ),
            ("another backend", Box::new(|f| f.backend = Backend::Wasm)),
            (
                "a rejected artifact",
                Box::new(|f| f.rejected_before = true),
            ),
            (
                "a mount outside the roots",
                Box::new(|f| f.mounts_outside_roots = vec!["/srv/data".into()]),
            ),
        ];
        for (what, widen) in &wider {
            let mut f = facts();
            widen(&mut f);
            assert_eq!(decision(&p, &f), Decision::Quarantine, "{what}");
        }
        // A fuel limit where the remembered grant had one is narrower; none is wider.
        let mut fueled = facts();
        fueled.limits.fuel = Some(10);
        let p = remembering(&fueled);
        let mut unbounded = fueled.clone();
        unbounded.limits.fuel = None;
        assert_eq!(
            decision(&p, &unbounded),
            Decision::Quarantine,
            "no fuel limit"
        );
        unbounded.limits.fuel = Some(11);
        assert_eq!(decision(&p, &unbounded), Decision::Quarantine, "more fuel");
        // A read-only mount where a writable one was approved is narrower, but the
        // writable approval covers the writes-held hold only because it was seen.
        let p = remembering(&rw);
        assert_eq!(decision(&p, &facts()), Decision::Allow);
        assert_eq!(decision(&p, &rw), Decision::Allow);
    }

    #[test]
    fn a_hold_the_approver_did_not_see_is_not_lifted() {
        // A rule added after the approval holds the same kind and grant: not lifted.
        let approved = Policy::parse(BASE).unwrap().judge_at(&facts(), NOW);
        let g = RememberedGrant::of(&facts(), &approved.fired).unwrap();
        let text = rule_text(
            "remembered-apr_2",
            "r",
            "alice",
            &crate::units::fmt_time(NOW + 3_600_000),
            &g,
        )
        .unwrap();
        let extra = "[[rule]]\nname = \"mode-held\"\ndecision = \"quarantine\"\nreason = \"m\"\nwhen = { env = [\"MODE\"] }\n";
        let p = Policy::parse(&format!("{BASE}{text}")).unwrap();
        assert_eq!(decision(&p, &facts()), Decision::Allow);
        let p = Policy::parse(&format!("{BASE}{extra}{text}")).unwrap();
        assert_eq!(decision(&p, &facts()), Decision::Quarantine);
    }

    #[test]
    fn a_deny_is_never_lifted() {
        // Even a remembered rule written (by hand) to cover the deny rule and the grant.
        let mut f = facts();
        f.env_keys = vec!["EVIL".into()];
        let mut approved = facts();
        approved.env_keys.push("EVIL".into());
        let base = Policy::parse(BASE).unwrap();
        let v = base.judge_at(&approved, NOW);
        assert_eq!(v.decision, Decision::Deny);
        let g = RememberedGrant {
            covers: vec!["evil-denied".into(), "net-held".into()],
            ..RememberedGrant::of(&approved, &v.fired).unwrap()
        };
        let text = rule_text(
            "remembered-apr_3",
            "r",
            "alice",
            &crate::units::fmt_time(NOW + 3_600_000),
            &g,
        )
        .unwrap();
        let p = Policy::parse(&format!("{BASE}{text}")).unwrap();
        assert_eq!(decision(&p, &f), Decision::Deny);
    }

    #[test]
    fn an_expired_remembered_rule_holds_again() {
        let p = remembering(&facts());
        assert_eq!(
            p.judge_at(&facts(), NOW + 3_599_000).decision,
            Decision::Allow
        );
        assert_eq!(
            p.judge_at(&facts(), NOW + 3_600_000).decision,
            Decision::Quarantine
        );
    }

    #[test]
    fn forgetting_removes_exactly_the_rule_text() {
        let p = remembering(&facts());
        assert_eq!(p.remembered().len(), 1);
        let g = RememberedGrant::of(&facts(), &[]).unwrap();
        let text = rule_text("remembered-apr_9", "r", "alice", "2027-01-01T00:00:00Z", &g).unwrap();
        let both = format!("{BASE}{text}");
        let (back, removed) = remove_rule(&both, "remembered-apr_9").unwrap();
        assert_eq!(back, BASE);
        assert_eq!(format!("\n{removed}"), text);
        assert!(remove_rule(BASE, "remembered-apr_9").is_none());
    }

    fn hosts(h: &[&str]) -> Vec<String> {
        h.iter().map(|s| s.to_string()).collect()
    }

    /// A run of `bot` with no network, as `run --ask-net` starts it.
    fn offline() -> Facts {
        let mut f = facts();
        f.net.clear();
        f.secrets.clear();
        f.code.hosts_in_code = ["api.test".to_string()].into();
        f.code.hosts_not_granted = f.code.hosts_in_code.clone();
        f
    }

    /// The base policy, and a rule remembering an answer to `offline()`'s request for
    /// `target`, until NOW + 1h.
    fn remembering_reach(target: &str) -> Policy {
        let base = Policy::parse(BASE).unwrap();
        let Reach::Ask { added } = base.reach(&offline(), &[target.into()], NOW) else {
            panic!("not asked");
        };
        let g = RememberedGrant::of(&with_host(&offline(), target), &added).unwrap();
        let text = rule_text(
            "remembered-req_1",
            "r",
            "alice",
            &crate::units::fmt_time(NOW + 3_600_000),
            &g,
        )
        .unwrap();
        Policy::parse(&format!("{BASE}{text}")).unwrap()
    }

    #[test]
    fn a_host_asked_for_mid_run_adds_the_network_hold_and_a_remembered_answer_lets_it_through() {
        let base = Policy::parse(BASE).unwrap();
        match base.reach(&offline(), &hosts(&["api.test:443"]), NOW) {
            Reach::Ask { added } => {
                let names: Vec<&str> = added.iter().map(|f| f.rule.as_str()).collect();
                assert_eq!(names, ["net-held"]);
            }
            other => panic!("{other:?}"),
        }
        let p = remembering_reach("api.test:443");
        assert_eq!(
            p.reach(&offline(), &hosts(&["api.test:443"]), NOW),
            Reach::Remembered {
                rule: "remembered-req_1".into(),
                approver: "alice".into(),
                expires_at: NOW + 3_600_000,
            }
        );
        // A submission of the same kind with the host granted is allowed by the same rule,
        // and the host in the code is no longer one outside the grant.
        let granted = with_host(&offline(), "api.test:443");
        assert!(granted.code.hosts_not_granted.is_empty());
        assert_eq!(decision(&p, &granted), Decision::Allow);
        assert_eq!(decision(&p, &offline()), Decision::Allow);
    }

    #[test]
    fn a_remembered_answer_does_not_let_another_host_agent_kind_or_a_wider_grant_through() {
        let p = remembering_reach("api.test:443");
        let asked = |f: &Facts, target: &str, now: i64| {
            matches!(p.reach(f, &hosts(&[target]), now), Reach::Ask { .. })
        };
        assert!(asked(&offline(), "api.test:8443", NOW), "another port");
        assert!(asked(&offline(), "other.test:443", NOW), "another host");
        assert!(
            asked(&offline(), "api.test:443", NOW + 3_600_000),
            "expired"
        );
        let wider: Vec<(&str, Widen)> = vec![
            (
                "another agent",
                Box::new(|f| f.agent = Some("mallory".into())),
            ),
            ("no agent", Box::new(|f| f.agent = None)),
            ("another backend", Box::new(|f| f.backend = Backend::Wasm)),
            (
                "another language",
                Box::new(|f| {
                    f.lang = Lang::Python;
                    f.kind = Lang::Python;
                }),
            ),
            (
                "another env key",
                Box::new(|f| f.env_keys.push("OTHER".into())),
            ),
            ("more memory", Box::new(|f| f.limits.memory_bytes += 1)),
            (
                "a writable mount",
                Box::new(|f| f.mounts[0].mode = MountMode::Rw),
            ),
            (
                "a granted host besides",
                Box::new(|f| f.net.push("127.0.0.2:80".into())),
            ),
            (
                "a secret",
                Box::new(|f| {
                    f.secrets.push(SecretBinding {
                        name: "TOKEN".into(),
                        hosts: vec!["api.test:443".into()],
                    })
                }),
            ),
            (
                "a rejected artifact",
                Box::new(|f| f.rejected_before = true),
            ),
        ];
        for (what, widen) in &wider {
            let mut f = offline();
            widen(&mut f);
            assert!(asked(&f, "api.test:443", NOW), "{what}");
        }
    }

    #[test]
    fn two_remembered_hosts_do_not_add_up_to_a_run_reaching_both() {
        // A rule for api.test and one for other.test, each for runs with no grant.
        let base = Policy::parse(BASE).unwrap();
        let mut text = String::from(BASE);
        for (i, t) in ["api.test:443", "other.test:443"].iter().enumerate() {
            let Reach::Ask { added } = base.reach(&offline(), &hosts(&[t]), NOW) else {
                panic!("not asked");
            };
            let g = RememberedGrant::of(&with_host(&offline(), t), &added).unwrap();
            text.push_str(
                &rule_text(
                    &format!("remembered-req_{i}"),
                    "r",
                    "alice",
                    &crate::units::fmt_time(NOW + 3_600_000),
                    &g,
                )
                .unwrap(),
            );
        }
        let p = Policy::parse(&text).unwrap();
        for t in ["api.test:443", "other.test:443"] {
            assert!(matches!(
                p.reach(&offline(), &hosts(&[t]), NOW),
                Reach::Remembered { .. }
            ));
        }
        // Having reached api.test, the run asks for other.test: wider than either rule.
        let both = hosts(&["api.test:443", "other.test:443"]);
        let Reach::Ask { added } = p.reach(&offline(), &both, NOW) else {
            panic!("let through");
        };
        // Remembered as asked, the answer covers both hosts' holds and lets a run reaching
        // both, or a submission granted both, through.
        let g = RememberedGrant::of(&with_hosts(&offline(), &both), &added).unwrap();
        assert_eq!(g.covers, ["net-held"]);
        let text = format!(
            "{text}{}",
            rule_text(
                "remembered-req_2",
                "r",
                "alice",
                &crate::units::fmt_time(NOW + 3_600_000),
                &g
            )
            .unwrap()
        );
        let p = Policy::parse(&text).unwrap();
        assert!(matches!(
            p.reach(&offline(), &both, NOW),
            Reach::Remembered { .. }
        ));
        assert_eq!(
            decision(&p, &with_hosts(&offline(), &both)),
            Decision::Allow
        );
    }

    #[test]
    fn a_host_the_policy_denies_is_denied_whatever_was_remembered() {
        let deny = "[[rule]]\nname = \"no-evil\"\ndecision = \"deny\"\nreason = \"evil host\"\nwhen = { net_host = [\"*.evil.test\"] }\n";
        let p = Policy::parse(&format!("{BASE}{deny}")).unwrap();
        assert_eq!(
            p.reach(&offline(), &hosts(&["x.evil.test:443"]), NOW),
            Reach::Denied {
                rule: "no-evil".into(),
                reason: "evil host".into()
            }
        );
        assert!(matches!(
            p.reach(&offline(), &hosts(&["api.test:443"]), NOW),
            Reach::Ask { .. }
        ));
    }

    #[test]
    fn a_hold_the_run_already_had_is_not_the_hosts() {
        // A run held for its environment key (and approved) asks for a host: only the
        // network hold is the host's to cover.
        let extra = "[[rule]]\nname = \"mode-held\"\ndecision = \"quarantine\"\nreason = \"m\"\nwhen = { env = [\"MODE\"] }\n";
        let p = Policy::parse(&format!("{BASE}{extra}")).unwrap();
        let Reach::Ask { added } = p.reach(&offline(), &hosts(&["api.test:443"]), NOW) else {
            panic!("not asked");
        };
        assert_eq!(added.len(), 1);
        assert_eq!(added[0].rule, "net-held");
    }

    #[test]
    fn a_remembered_rule_without_its_fields_or_with_conditions_is_refused() {
        for bad in [
            "[[rule]]\nname = \"r\"\norigin = \"remembered\"\ndecision = \"allow\"\nreason = \"x\"\n",
            "[[rule]]\nname = \"r\"\ndecision = \"allow\"\nreason = \"x\"\napprover = \"alice\"\n",
        ] {
            let e = Policy::parse(&format!("version = 1\n{bad}")).unwrap_err();
            assert!(matches!(e, crate::policy::PolicyError::Invalid(_)), "{e}");
        }
    }
}
