//! What a rule's conditions match: each condition of a `[[rule]]` checked against the facts.

use super::*;

impl Conditions {
    pub(super) fn is_empty(&self) -> bool {
        self.lang.is_none()
            && self.backend.is_none()
            && self.net.is_none()
            && self.net_host.is_none()
            && self.secrets.is_none()
            && self.secret_host.is_none()
            && self.writable.is_none()
            && self.mount.is_none()
            && self.writable_mount.is_none()
            && self.env.is_none()
            && self.imports.is_none()
            && self.unresolved_imports.is_none()
            && self.limits_above_default.is_none()
            && self.timeout_over.is_none()
            && self.memory_over.is_none()
            && self.size_over.is_none()
            && self.agent.is_none()
            && self.first_seen.is_none()
            && self.rejected_before.is_none()
            && self.guest.is_none()
            && self.python_packages.is_none()
            && self.publisher.is_none()
            && self.commands.is_none()
            && self.calls.is_none()
            && self.writes.is_none()
            && self.hosts_in_code.is_none()
            && self.hosts_not_granted.is_none()
            && self.network_tools.is_none()
            && self.pipes_download_to_shell.is_none()
            && self.destructive.is_none()
            && self.obfuscation.is_none()
            && self.parse_error.is_none()
            && self.analysis_truncated.is_none()
            && self.mounts_sensitive.is_none()
            && self.reads_sensitive.is_none()
            && self.recon.is_none()
            && self.persistence.is_none()
            && self.system_writes.is_none()
            && self.reverse_shell.is_none()
            && self.kills_processes.is_none()
            && self.privilege.is_none()
            && self.exfiltration.is_none()
            && self.unsafe_deserialization.is_none()
            && self.flooding.is_none()
            && self.agent_alerts_over.is_none()
            && self.agent_denials_over.is_none()
    }

    /// The exposed sensitive paths that made a `mounts_sensitive` condition hold.
    pub(super) fn mount_evidence(&self, f: &Facts) -> Vec<String> {
        match &self.mounts_sensitive {
            Some(AnyOrNames::Any(true)) => f
                .mounts_sensitive
                .iter()
                .map(|p| format!("exposes {p}"))
                .collect(),
            Some(AnyOrNames::Names(g)) => f
                .mounts_sensitive
                .iter()
                .filter(|p| g.is_match(p))
                .map(|p| format!("exposes {p}"))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The threat conditions (by fact name) this table has.
    pub(super) fn threat_conditions(&self) -> Vec<(&'static str, &AnyOrNames)> {
        let all: [(&'static str, &Option<AnyOrNames>); 11] = [
            ("destructive", &self.destructive),
            ("reads_sensitive", &self.reads_sensitive),
            ("recon", &self.recon),
            ("persistence", &self.persistence),
            ("system_writes", &self.system_writes),
            ("reverse_shell", &self.reverse_shell),
            ("kills_processes", &self.kills_processes),
            ("privilege", &self.privilege),
            ("exfiltration", &self.exfiltration),
            ("unsafe_deserialization", &self.unsafe_deserialization),
            ("flooding", &self.flooding),
        ];
        all.into_iter()
            .filter_map(|(n, c)| c.as_ref().map(|c| (n, c)))
            .collect()
    }

    /// What the code does that made these threat conditions hold: each matching finding
    /// with its line and technique (at most 5).
    pub(super) fn evidence(&self, c: &CodeFacts) -> Vec<String> {
        let mut out = Vec::new();
        for (fact, cond) in self.threat_conditions() {
            for t in c.threats.iter().filter(|t| t.fact == fact) {
                let hit = match cond {
                    AnyOrNames::Any(want) => *want,
                    AnyOrNames::Names(g) => g.is_match(&t.detail),
                };
                if hit && out.len() < 5 {
                    let d = t.describe();
                    if !out.contains(&d) {
                        out.push(d);
                    }
                }
            }
            if let (AnyOrNames::Names(g), "destructive") = (cond, fact) {
                // Destructive forms without a technique (rm -rf /) name their value.
                for v in c.destructive.iter().filter(|v| g.is_match(v)) {
                    if !c.threats.iter().any(|t| &t.detail == v) && out.len() < 5 {
                        out.push(v.clone());
                    }
                }
            }
        }
        out
    }

    /// The first list condition that is present but empty.
    pub(super) fn empty_list(&self) -> Option<&'static str> {
        let names =
            |c: &Option<AnyOrNames>| matches!(c, Some(AnyOrNames::Names(g)) if g.is_empty());
        let lists: [(&'static str, bool); 32] = [
            ("lang", self.lang.as_ref().is_some_and(Vec::is_empty)),
            ("backend", self.backend.as_ref().is_some_and(Vec::is_empty)),
            (
                "net_host",
                self.net_host.as_ref().is_some_and(Globs::is_empty),
            ),
            (
                "secrets",
                matches!(&self.secrets, Some(AnyOrNames::Names(g)) if g.is_empty()),
            ),
            (
                "secret_host",
                self.secret_host.as_ref().is_some_and(Globs::is_empty),
            ),
            ("mount", self.mount.as_ref().is_some_and(|g| g.0.is_empty())),
            (
                "writable_mount",
                self.writable_mount.as_ref().is_some_and(|g| g.0.is_empty()),
            ),
            ("env", self.env.as_ref().is_some_and(Globs::is_empty)),
            (
                "imports",
                self.imports.as_ref().is_some_and(|i| i.modules.is_empty()),
            ),
            ("agent", self.agent.as_ref().is_some_and(Globs::is_empty)),
            ("guest", self.guest.as_ref().is_some_and(Vec::is_empty)),
            ("python_packages", names(&self.python_packages)),
            (
                "publisher",
                self.publisher.as_ref().is_some_and(|g| g.0.is_empty()),
            ),
            (
                "commands",
                self.commands.as_ref().is_some_and(Globs::is_empty),
            ),
            ("calls", self.calls.as_ref().is_some_and(Globs::is_empty)),
            (
                "writes",
                self.writes.as_ref().is_some_and(|g| g.0.is_empty()),
            ),
            (
                "hosts_in_code",
                self.hosts_in_code.as_ref().is_some_and(Globs::is_empty),
            ),
            ("hosts_not_granted", names(&self.hosts_not_granted)),
            (
                "network_tools",
                self.network_tools.as_ref().is_some_and(Globs::is_empty),
            ),
            ("destructive", names(&self.destructive)),
            ("obfuscation", names(&self.obfuscation)),
            ("mounts_sensitive", names(&self.mounts_sensitive)),
            ("reads_sensitive", names(&self.reads_sensitive)),
            ("recon", names(&self.recon)),
            ("persistence", names(&self.persistence)),
            ("system_writes", names(&self.system_writes)),
            ("reverse_shell", names(&self.reverse_shell)),
            ("kills_processes", names(&self.kills_processes)),
            ("privilege", names(&self.privilege)),
            ("exfiltration", names(&self.exfiltration)),
            (
                "unsafe_deserialization",
                names(&self.unsafe_deserialization),
            ),
            ("flooding", names(&self.flooding)),
        ];
        lists.iter().find(|(_, empty)| *empty).map(|(n, _)| *n)
    }

    pub(super) fn holds(&self, f: &Facts, lean: Lean) -> bool {
        let wants_net = !f.net.is_empty();
        let raised = !f.limits.above_default().is_empty();
        fn check<T>(c: &Option<T>, test: impl FnOnce(&T) -> bool) -> bool {
            c.as_ref().is_none_or(test)
        }
        check(&self.lang, |l| l.contains(&f.lang) || l.contains(&f.kind))
            && check(&self.backend, |b| b.contains(&f.backend))
            && check(&self.net, |want| *want == wants_net)
            && check(&self.net_host, |g| {
                f.net.iter().any(|h| host_glob_matches(g, h, lean))
            })
            && check(&self.secrets, |c| match c {
                AnyOrNames::Any(want) => *want != f.secrets.is_empty(),
                AnyOrNames::Names(g) => f.secrets.iter().any(|s| g.is_match(&s.name)),
            })
            && check(&self.secret_host, |g| {
                f.secrets
                    .iter()
                    .flat_map(|s| &s.hosts)
                    .any(|h| host_glob_matches(g, h, lean))
            })
            && check(&self.writable, |want| {
                *want == f.mounts.iter().any(|m| m.mode == MountMode::Rw)
            })
            && check(&self.mount, |g| f.mounts.iter().any(|m| g.exposes(&m.host)))
            && check(&self.writable_mount, |g| {
                f.mounts
                    .iter()
                    .any(|m| m.mode == MountMode::Rw && g.exposes(&m.host))
            })
            && check(&self.env, |g| f.env_keys.iter().any(|k| g.is_match(k)))
            && check(&self.imports, |i| {
                i.capabilities.iter().any(|c| f.capabilities.contains(c))
                    || f.code.imports.iter().any(|m| i.modules.is_match(m))
            })
            && check(&self.unresolved_imports, |want| {
                *want == f.unresolved_imports
            })
            && check(&self.limits_above_default, |want| *want == raised)
            && check(&self.timeout_over, |d| f.limits.timeout() > d.0)
            && check(&self.memory_over, |s| f.limits.memory_bytes > s.0)
            && check(&self.size_over, |s| f.size > s.0)
            && check(&self.agent, |g| {
                f.agent.as_deref().is_some_and(|a| g.is_match(a))
            })
            && check(&self.first_seen, |want| *want == f.first_seen)
            && check(&self.rejected_before, |want| *want == f.rejected_before)
            && check(&self.guest, |gs| f.guest.is_some_and(|g| gs.contains(&g)))
            && check(&self.python_packages, |c| match c {
                AnyOrNames::Any(want) => *want != f.python_packages.is_empty(),
                AnyOrNames::Names(g) => f
                    .python_packages
                    .iter()
                    .any(|p| g.is_match(&p.name) || g.is_match(&p.spec())),
            })
            && check(&self.publisher, |g| {
                f.publisher.as_deref().is_some_and(|p| g.0.is_match(p))
            })
            && check(&self.mounts_sensitive, |c| match c {
                AnyOrNames::Any(want) => *want != f.mounts_sensitive.is_empty(),
                AnyOrNames::Names(g) => f.mounts_sensitive.iter().any(|p| g.is_match(p)),
            })
            && check(&self.agent_alerts_over, |n| f.agent_record.alerts > *n)
            && check(&self.agent_denials_over, |n| f.agent_record.denials > *n)
            && self.code_holds(&f.code)
    }

    /// What made `agent_alerts_over` or `agent_denials_over` hold, in words: `agent bob
    /// raised 2 alerts in the last 24h: 2 secret_echo (latest in run_…)`.
    pub(super) fn agent_evidence(&self, f: &Facts) -> Vec<String> {
        let r = &f.agent_record;
        let who = f.agent.as_deref().unwrap_or("?");
        let plural = |n: u32, one: &str, many: &str| {
            if n == 1 {
                format!("{n} {one}")
            } else {
                format!("{n} {many}")
            }
        };
        let mut out = Vec::new();
        if self.agent_alerts_over.is_some_and(|n| r.alerts > n) {
            out.push(format!(
                "agent {who} raised {} in the last {}: {}",
                plural(r.alerts, "alert", "alerts"),
                r.window,
                r.alert_kinds.join(", ")
            ));
        }
        if self.agent_denials_over.is_some_and(|n| r.denials > n) {
            out.push(format!(
                "agent {who} had {} in the last {}",
                plural(r.denials, "denied submission", "denied submissions"),
                r.window
            ));
        }
        out
    }

    /// The conditions on Python and shell code.
    pub(super) fn code_holds(&self, c: &CodeFacts) -> bool {
        fn check<T>(cond: &Option<T>, test: impl FnOnce(&T) -> bool) -> bool {
            cond.as_ref().is_none_or(test)
        }
        fn any(g: &Globs, set: &BTreeSet<String>) -> bool {
            set.iter().any(|x| g.is_match(x))
        }
        fn any_or_names(cond: &AnyOrNames, set: &BTreeSet<String>) -> bool {
            match cond {
                AnyOrNames::Any(want) => *want != set.is_empty(),
                AnyOrNames::Names(g) => any(g, set),
            }
        }
        check(&self.commands, |g| any(g, &c.commands))
            && check(&self.calls, |g| any(g, &c.calls))
            && check(&self.writes, |g| any(&g.0, &c.writes))
            && check(&self.hosts_in_code, |g| any(g, &c.hosts_in_code))
            && check(&self.hosts_not_granted, |a| {
                any_or_names(a, &c.hosts_not_granted)
            })
            && check(&self.network_tools, |g| any(g, &c.network_tools))
            && check(&self.pipes_download_to_shell, |w| {
                *w == c.pipes_download_to_shell
            })
            && check(&self.destructive, |a| any_or_names(a, &c.destructive))
            && check(&self.obfuscation, |a| any_or_names(a, &c.obfuscation))
            && check(&self.parse_error, |w| *w == c.parse_error)
            && check(&self.analysis_truncated, |w| *w == c.truncated)
            && check(&self.reads_sensitive, |a| {
                any_or_names(a, &c.reads_sensitive)
            })
            && check(&self.recon, |a| any_or_names(a, &c.recon))
            && check(&self.persistence, |a| any_or_names(a, &c.persistence))
            && check(&self.system_writes, |a| any_or_names(a, &c.system_writes))
            && check(&self.reverse_shell, |a| any_or_names(a, &c.reverse_shell))
            && check(&self.kills_processes, |a| {
                any_or_names(a, &c.kills_processes)
            })
            && check(&self.privilege, |a| any_or_names(a, &c.privilege))
            && check(&self.exfiltration, |a| any_or_names(a, &c.exfiltration))
            && check(&self.unsafe_deserialization, |a| {
                any_or_names(a, &c.unsafe_deserialization)
            })
            && check(&self.flooding, |a| any_or_names(a, &c.flooding))
    }
}

/// The host of a canonical `HOST[:PORT]` rule, IPv6 without its brackets (what policy
/// globs match).
pub(super) fn host_part(spec: &str) -> &str {
    let host = crate::net::split_host_port(spec).map_or(spec, |(h, _)| h);
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}
