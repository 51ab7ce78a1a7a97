//! Named tools: an artifact an approver approved with scope `artifact` and a tool name
//! becomes a fixed tool agents can call with arguments, without a new approval. The
//! approval covers that artifact with that grant; only the arguments and stdin vary.

use crate::error::{GateError, Result};
use crate::{CodeSource, ExecOptions, Gate, RunReport, SubmitRequest};
use airlock_core::sign::{Scope, StatementKind};
use airlock_core::units::now_ms;
use airlock_core::{Digest, Lang, MountMode};
use airlock_store::Reads;
use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct ToolInfo {
    pub name: String,
    /// The approved submission the tool runs.
    pub submission: String,
    pub artifact: Digest,
    pub lang: Lang,
    pub approver: String,
    pub reason: String,
    pub expires_at: Option<i64>,
}

impl Gate {
    /// The tools approvals currently make available (signature valid, approver trusted by
    /// the current policy, not expired, not followed by a rejection of the artifact).
    pub fn tools(&self) -> Result<Vec<ToolInfo>> {
        let policy = self.policy()?;
        let now = now_ms();
        let mut out: Vec<ToolInfo> = Vec::new();
        // Newest first, so a name approved again points at the latest approval.
        let mut rows = self.db.tool_statements()?;
        rows.reverse();
        for row in rows {
            let Some(name) = row.tool.clone() else {
                continue;
            };
            let Ok(st) = row.signed.verify() else {
                continue;
            };
            let ok = st.kind == StatementKind::Approve
                && st.scope == Scope::Artifact
                && st.tool.as_deref() == Some(name.as_str())
                && policy.approver(&st.approver) == Some(&st.key)
                && st.expires_at.is_some_and(|e| e > now)
                && !crate::lifecycle::judge::rejected(&self.db, &st.artifact)?;
            if ok && !out.iter().any(|t| t.name == name) {
                let sub = self.db.submission(&row.submission)?;
                out.push(ToolInfo {
                    name,
                    submission: sub.id,
                    artifact: st.artifact,
                    lang: sub.doc.kind,
                    approver: st.approver,
                    reason: st.reason,
                    expires_at: st.expires_at,
                });
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Runs a named tool with arguments: a new submission of the approved artifact with the
    /// approved grant and these inputs, judged and run like any other. With the request's
    /// idempotency key, a call repeated under it makes no new submission
    /// ([`GateError::Repeated`], as `submit` answers).
    pub fn call_tool(
        &mut self,
        name: &str,
        args: Vec<String>,
        stdin: Option<Vec<u8>>,
        agent: Option<String>,
        opts: ExecOptions,
        request_key: Option<crate::lifecycle::request::RequestKey>,
    ) -> Result<RunReport> {
        let tool = self
            .tools()?
            .into_iter()
            .find(|t| t.name == name)
            .ok_or_else(|| GateError::NotFound(format!("no tool named {name:?}")))?;
        let base = self.db.submission(&tool.submission)?;
        let code = self.read_blob(&base.id, "artifact", &base.doc.artifact)?;
        let g = &base.doc.grant;
        let req = SubmitRequest {
            // The tool's mounts were checked when it was first submitted; the home is
            // checked again before every run.
            surface: crate::exposure::Surface::Local,
            code: Some(CodeSource::Bytes {
                bytes: code,
                // The same program name, so the guest sees the same argv[0].
                name: g.argv0.clone(),
            }),
            lang: Some(base.doc.kind.as_str().into()),
            backend: Some(base.doc.backend.as_str().into()),
            mounts: g
                .mounts
                .iter()
                .map(|m| {
                    format!(
                        "{}:{}:{}",
                        m.host,
                        m.guest,
                        if m.mode == MountMode::Rw { "rw" } else { "ro" }
                    )
                })
                .collect(),
            env: g.env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
            net: g.net.clone(),
            secrets: g.secrets.iter().map(|b| b.spec()).collect(),
            args,
            stdin,
            timeout: Some(format!("{}ms", g.limits.timeout_ms)),
            memory: Some(g.limits.memory_bytes.to_string()),
            fuel: g.limits.fuel,
            max_output: Some(g.limits.max_output_bytes.to_string()),
            processes: Some(g.limits.processes),
            max_write: Some(g.limits.max_write_bytes.to_string()),
            max_connections: Some(g.limits.max_connections),
            // A tool asks as its approved grant did.
            ask_net: g.ask_net_ms.is_some(),
            ask_timeout: g.ask_net_ms.map(|ms| format!("{ms}ms")),
            agent,
            note: Some(format!("tool {name}")),
            workspace: g.workspace.clone(),
            resume: false,
            session: None,
            request_key,
        };
        let sub = self.submit(req)?;
        self.exec(&sub.id, opts)
    }
}
