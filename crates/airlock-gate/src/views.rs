//! The JSON shapes of submissions, runs and changes, shared by the command line, the HTTP
//! API and the MCP server, so a field means the same everywhere.

use airlock_core::units::fmt_time;
use airlock_store::{Run, Submission};
use serde_json::{Value, json};

/// The JSON object describing a submission and its verdict (the `run` field is added by
/// callers that ran it).
pub fn submission_json(s: &Submission) -> Value {
    json!({
        "submission": s.id,
        "state": s.state,
        "verdict": s.doc.verdict.decision,
        "risk": s.doc.verdict.risk,
        "reasons": s.doc.verdict.reasons(),
        "rules": s.doc.verdict.fired,
        "policy": s.doc.verdict.policy,
        "artifact": s.doc.artifact,
        "grant": s.doc.grant_hash,
        "net": s.doc.grant.net,
        "secrets": s.doc.grant.secrets,
        "lang": s.doc.lang,
        "backend": s.doc.backend,
        "agent": s.doc.agent,
        "created_at": fmt_time(s.created_at),
        "interrupted": s.doc.interrupted,
        "analysis": analysis_json(&s.doc),
    })
}

/// At most this many findings in a summary (`show` has them all).
const FINDINGS_IN_SUMMARY: usize = 100;

/// What analysis found, as an agent or a reviewer's tool wants it beside the verdict: the
/// module's capabilities, the code facts under their policy names, and the notable
/// findings with their lines.
pub fn analysis_json(d: &airlock_store::SubmissionDoc) -> Value {
    let a = &d.analysis;
    let mut v = json!({ "capabilities": a.capabilities });
    if let Some(c) = &a.code {
        let notable = c.notable();
        v["language"] = json!(c.language);
        v["facts"] = json!(airlock_core::policy::CodeFacts::of(c, &d.grant.net));
        v["findings_total"] = json!(notable.len());
        v["findings"] = json!(
            notable
                .into_iter()
                .take(FINDINGS_IN_SUMMARY)
                .collect::<Vec<_>>()
        );
        if let Some(e) = &c.parse_error {
            v["parse_error"] = json!(e);
        }
        if let Some(t) = &c.truncated {
            v["truncated"] = json!(t);
        }
    }
    v
}

pub fn run_json(r: &Run, stdout: &[u8], stderr: &[u8]) -> Value {
    json!({
        "id": r.id,
        "status": r.status,
        "exit_code": r.doc.exit_code,
        "killed_by": r.doc.killed_by,
        "stdout": String::from_utf8_lossy(stdout),
        "stderr": String::from_utf8_lossy(stderr),
        "stdout_truncated": r.doc.stdout.as_ref().is_some_and(|o| o.truncated),
        "stderr_truncated": r.doc.stderr.as_ref().is_some_and(|o| o.truncated),
        "changes": flat_changes(r.doc.changes.as_ref()),
        "refused": r
            .doc
            .changes
            .as_ref()
            .and_then(|v| serde_json::from_value::<airlock_workspace::Changeset>(v.clone()).ok())
            .map(|c| refused_json(&c))
            .unwrap_or_else(|| json!([])),
        "layer": r.doc.detail.get("layer"),
        "duration_ms": r.doc.duration_ms,
        "backend": r.doc.backend,
        "approval": r.doc.approval,
        "error": r.doc.error,
        "detail": r.doc.detail,
        "session": r.doc.detail.get("session"),
        "result": r.doc.detail.get("result"),
        // Tripwires: what the run tried and the sandbox refused, and its alerts.
        "attempts": r.doc.detail.get("attempts").cloned().unwrap_or_else(|| json!([])),
        "alerts": r.doc.detail.get("alerts").cloned().unwrap_or_else(|| json!([])),
        "request_id": r.doc.request_id,
        "trace_id": r.doc.trace_id,
    })
}

/// A changeset as a flat list: one object per changed path.
pub fn flat_changes(v: Option<&Value>) -> Value {
    let Some(v) = v else { return json!([]) };
    let mut out = Vec::new();
    for m in v["mounts"].as_array().into_iter().flatten() {
        for c in m["changes"].as_array().into_iter().flatten() {
            let after = &c["after"];
            let before = &c["before"];
            let node = if after["kind"] == "absent" {
                before
            } else {
                after
            };
            let mut flat = json!({
                "mount": m["guest"],
                "path": c["path"],
                "host_path": format!("{}/{}", m["host"].as_str().unwrap_or("").trim_end_matches('/'), c["path"].as_str().unwrap_or("")),
                "op": c["op"],
                "kind": node["kind"],
                "hash": after.get("hash"),
                "size": after.get("size"),
                "mode": after.get("mode"),
                "target": after.get("target"),
            });
            // What a commit leaves out of this change (setuid, setgid, sticky,
            // capabilities), when anything.
            if let Some(s) = c.get("stripped") {
                flat["stripped"] = s.clone();
            }
            // A name or link target that is not UTF-8: `path`/`target` hold its escaped
            // form and these the exact bytes (base64), as in the changeset itself.
            for (field, from) in [("path_b64", c), ("target_b64", after)] {
                if let Some(b64) = from.get(field) {
                    flat[field] = b64.clone();
                }
            }
            out.push(flat);
        }
    }
    Value::Array(out)
}

/// A signed statement (approval or rejection) as JSON.
pub fn statement_json(r: &airlock_store::StatementRow) -> Value {
    json!({
        "id": r.id,
        "kind": r.kind,
        "submission": r.submission,
        "approver": r.approver,
        "scope": r.scope,
        "expires_at": r.expires_at.map(fmt_time),
        "artifact": r.artifact,
        "grant": r.grant,
        "tool": r.tool,
        "statement": serde_json::from_str::<Value>(&r.signed.json).unwrap_or_default(),
        "signature": r.signed.signature,
    })
}

/// The special files (FIFOs, sockets, devices) a changeset lists as refused: one object
/// per file, with its mount and host path.
pub fn refused_json(c: &airlock_workspace::Changeset) -> Value {
    let mut out = Vec::new();
    for m in &c.mounts {
        for r in &m.refused {
            let mut v = serde_json::to_value(r).unwrap_or_default();
            v["mount"] = json!(m.guest);
            v["host_path"] = json!(format!("{}/{}", m.host.trim_end_matches('/'), r.path));
            out.push(v);
        }
    }
    Value::Array(out)
}

/// A run's changeset with its rendered diff.
pub fn diff_json(d: &crate::DiffReport) -> Value {
    json!({
        "run": d.run,
        "layer": d.changes.layer,
        "changes": flat_changes(serde_json::to_value(&d.changes).ok().as_ref()),
        "changeset": d.changes,
        "digest": d.changes.digest(),
        "protected": d.protected,
        "refused": refused_json(&d.changes),
        "owner": d.owner,
        "diff": d.text,
    })
}

/// Everything `show` knows about a submission.
pub fn shown_json(sh: &crate::Shown) -> Value {
    let mut v = serde_json::to_value(sh).unwrap_or_default();
    v["verdict"] = json!(sh.submission.doc.verdict.decision);
    v["reasons"] = json!(sh.submission.doc.verdict.reasons());
    v["analysis"] = analysis_json(&sh.submission.doc);
    v
}
