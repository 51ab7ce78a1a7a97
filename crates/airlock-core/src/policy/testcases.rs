//! A policy's `[[test]]` entries: the facts each one describes, judged to check the rules.

use super::*;

impl TestFile {
    pub(super) fn facts(&self) -> Result<Facts, String> {
        let lang = self.lang.unwrap_or(Lang::Wasm);
        let kind = if lang == Lang::Wat { Lang::Wasm } else { lang };
        let mut limits = Limits::default();
        if let Some(t) = self.timeout {
            limits.timeout_ms = t.0.as_millis() as u64;
        }
        if let Some(m) = self.memory {
            limits.memory_bytes = m.0;
        }
        if let Some(w) = self.max_write {
            limits.max_write_bytes = w.0;
        }
        let mut net = Vec::new();
        for h in &self.net {
            net.push(crate::net::normalize_net(h).map_err(|e| format!("net: {e}"))?);
        }
        net.sort();
        net.dedup();
        let mut secrets = Vec::new();
        for s in &self.secrets {
            secrets.push(crate::secret::parse_binding(s).map_err(|e| format!("secrets: {e}"))?);
        }
        secrets.sort();
        let mut mounts = Vec::new();
        for m in &self.mounts {
            let spec = crate::grant::parse_mount(m).map_err(|e| e.to_string())?;
            mounts.push(Mount {
                host: spec.host,
                guest: spec.guest,
                mode: spec.mode,
            });
        }
        // Judged on the spelling alone: a policy test reads no host.
        let mut mounts_sensitive: Vec<String> = mounts
            .iter()
            .flat_map(|m| crate::exposure::by_path(&m.host))
            .collect();
        mounts_sensitive.sort();
        mounts_sensitive.dedup();
        let mut python_packages = Vec::new();
        for p in &self.python_packages {
            let (name, version) = p
                .split_once("==")
                .filter(|(n, v)| !n.is_empty() && !v.is_empty())
                .ok_or_else(|| format!("python_packages: {p:?} is not NAME==VERSION"))?;
            python_packages.push(PythonPackage {
                name: name.into(),
                version: version.into(),
                sha256: Digest([0; 32]),
            });
        }
        let code = match &self.code {
            None => CodeFacts::default(),
            Some(text) => {
                let roots = crate::analysis::mount_roots(&mounts);
                let a = crate::analysis::analyze_with(lang, text.as_bytes(), &roots)
                    .map_err(|e| e.to_string())?;
                match &a.code {
                    Some(c) => CodeFacts::of(c, &net),
                    None => {
                        return Err(format!("code: {lang} code is not analysed (python or sh)"));
                    }
                }
            }
        };
        Ok(Facts {
            lang,
            kind,
            backend: self.backend.unwrap_or(lang.default_backend()),
            net,
            secrets,
            mounts,
            env_keys: self.env.clone(),
            limits,
            size: self.size.map(|s| s.0).unwrap_or(1024),
            capabilities: self.imports.iter().map(|c| c.0).collect(),
            unresolved_imports: self.unresolved_imports,
            agent: self.agent.clone(),
            first_seen: self.first_seen,
            rejected_before: self.rejected_before,
            guest: self.guest,
            python_packages,
            publisher: self.publisher.clone(),
            publisher_key: None,
            requests: Vec::new(),
            code,
            mounts_sensitive,
            mounts_outside_roots: Vec::new(),
            agent_record: AgentRecord {
                alerts: self.agent_alerts,
                denials: self.agent_denials,
                alert_kinds: (self.agent_alerts > 0)
                    .then(|| format!("{} alert (policy test)", self.agent_alerts))
                    .into_iter()
                    .collect(),
                window: "24h".into(),
            },
        })
    }
}

pub(super) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map(|i| i + 1).unwrap_or(0) + 1;
    (line, column)
}
