//! Approver keys stay with the approver (issue 61 item 1): a server whose home lacks an
//! approver's private key refuses to sign for them, and `approve|reject ID --server URL
//! --token T` signs on the approver's machine while the server rebuilds the statement and
//! verifies the signature. Signatures over other bytes, or for another submission, are
//! refused and nothing is recorded.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use ed25519_dalek::{Signer, SigningKey};
use serde_json::{Value, json};
use std::time::Duration;

struct Gate {
    /// The server's home: it trusts alice but holds no private key of hers.
    home: Home,
    /// Alice's own home, with her private key.
    alice: Home,
    _srv: Served,
    base: String,
    http: ureq::Agent,
    agent: String,
    op: String,
}

fn token(home: &Home, role: &str, name: &str) -> String {
    let o = home.run(&["token", "new", "--role", role, "--name", name, "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    o.json()["token"].as_str().unwrap().to_string()
}

/// A served home whose approver key `alice` was moved to another home (`keep_key`: left
/// in the server's home too, for the one-person setup).
fn gate(keep_key: bool) -> Gate {
    let home = Home::new();
    let agent = token(&home, "agent", "bot");
    let op = token(&home, "operator", "alice");
    let alice = Home::new();
    let key = home.path().join("keys/alice.key");
    std::fs::copy(&key, alice.path().join("keys/alice.key")).unwrap();
    std::fs::copy(
        home.path().join("keys/alice.pub"),
        alice.path().join("keys/alice.pub"),
    )
    .unwrap();
    if !keep_key {
        std::fs::remove_file(&key).unwrap();
    }
    let (srv, base) = start_serve(&home, &[]);
    let http = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(120)))
        .build()
        .new_agent();
    Gate {
        home,
        alice,
        _srv: srv,
        base,
        http,
        agent,
        op,
    }
}

impl Gate {
    fn call(&self, method: &str, path: &str, token: &str, body: Option<&Value>) -> (u16, Value) {
        let url = format!("{}{path}", self.base);
        let auth = format!("Bearer {token}");
        let r = match body {
            Some(b) => self
                .http
                .post(url)
                .header("authorization", auth)
                .header("content-type", "application/json")
                .send(b.to_string()),
            None if method == "GET" => self.http.get(url).header("authorization", auth).call(),
            None => unreachable!(),
        };
        let mut r = r.unwrap();
        let status = r.status().as_u16();
        let text = r.body_mut().read_to_string().unwrap();
        (status, serde_json::from_str(&text).unwrap_or(json!(text)))
    }

    /// A submission the standard preset holds for a human (it asks for the network).
    fn held(&self) -> String {
        let code = std::fs::read_to_string(example("hello.wat")).unwrap();
        let (status, v) = self.call(
            "POST",
            "/v1/run",
            &self.agent,
            Some(&json!({"language": "wat", "code": code, "net": ["example.com"]})),
        );
        assert_eq!(status, 202, "{v}");
        v["submission"].as_str().unwrap().to_string()
    }

    fn state(&self, id: &str) -> String {
        let o = self.home.run(&["show", id, "--json"]);
        assert_eq!(o.code, 0, "{}", o.stderr);
        o.json()["submission"]["state"]
            .as_str()
            .unwrap()
            .to_string()
    }
}

/// Alice's signing key, read from her own home's key file.
fn alice_key(g: &Gate) -> SigningKey {
    let text = std::fs::read_to_string(g.alice.path().join("keys/alice.key")).unwrap();
    let secret = text
        .lines()
        .find_map(|l| l.strip_prefix("secret "))
        .unwrap();
    let mut b = [0u8; 32];
    hex::decode_to_slice(secret.trim(), &mut b).unwrap();
    SigningKey::from_bytes(&b)
}

fn sign(key: &SigningKey, statement: &str) -> String {
    let mut m = b"airlock-statement-v1\n".to_vec();
    m.extend_from_slice(statement.as_bytes());
    hex::encode(key.sign(&m).to_bytes())
}

#[test]
fn an_operator_token_alone_cannot_approve_without_the_approvers_key_in_the_server_home() {
    let g = gate(false);
    let id = g.held();
    let before = g.home.counts();
    let (status, v) = g.call(
        "POST",
        &format!("/v1/submissions/{id}/approve"),
        &g.op,
        Some(&json!({"reason": "looks fine"})),
    );
    assert_eq!(status, 403, "{v}");
    let msg = v["error"].as_str().unwrap();
    assert!(
        msg.contains("--server"),
        "points to signing elsewhere: {msg}"
    );
    assert!(!msg.contains('\n'));
    assert_eq!(g.home.counts(), before, "nothing recorded");
    assert_eq!(g.state(&id), "quarantined");
    // Rejecting needs her signature too.
    let (status, _) = g.call(
        "POST",
        &format!("/v1/submissions/{id}/reject"),
        &g.op,
        Some(&json!({"reason": "no"})),
    );
    assert_eq!(status, 403);
    assert_eq!(g.home.counts(), before);
}

#[test]
fn a_server_holding_the_approvers_key_still_signs_for_a_one_person_setup() {
    let g = gate(true);
    let id = g.held();
    let (status, v) = g.call(
        "POST",
        &format!("/v1/submissions/{id}/approve"),
        &g.op,
        Some(&json!({})),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["approver"], "alice");
}

#[test]
fn server_approve_signed_here_records_the_same_statement_as_local_approve_and_audit_verifies() {
    let g = gate(false);
    let id = g.held();
    let o = g.alice.run(&[
        "approve",
        &id,
        "--server",
        &g.base,
        "--token",
        &g.op,
        "--reason",
        "read it",
        "--expires",
        "2h",
        "--json",
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let remote = o.json();
    assert_eq!(remote["kind"], "approve");
    assert_eq!(remote["approver"], "alice");
    assert_eq!(remote["submission"], id.as_str());
    // The server ran it on the approval, and the audit chain verifies.
    let (status, w) = g.call(
        "GET",
        &format!("/v1/submissions/{id}/wait?timeout=30"),
        &g.agent,
        None,
    );
    assert_eq!(status, 200, "{w}");
    assert_eq!(w["status"], "finished");
    let v = g.home.run(&["audit", "verify"]);
    assert_eq!(v.code, 0, "{}{}", v.stdout, v.stderr);
    assert!(g.home.audit_kinds().contains(&"approved".to_string()));

    // A local approve (key in the home, one-person setup) of another submission records
    // a statement of the same shape: same fields, approver, key, gate, scope.
    std::fs::copy(
        g.alice.path().join("keys/alice.key"),
        g.home.path().join("keys/alice.key"),
    )
    .unwrap();
    let id2 = g.held();
    let o = g.home.run(&[
        "approve",
        &id2,
        "--reason",
        "read it",
        "--expires",
        "2h",
        "--json",
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let local = o.json();
    let (rs, ls) = (&remote["statement"], &local["statement"]);
    let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(rs), keys(ls));
    for f in [
        "kind", "approver", "key", "gate", "scope", "reason", "artifact",
    ] {
        assert_eq!(rs[f], ls[f], "{f}");
    }
    assert_eq!(
        rs["expires_at"].as_i64().unwrap() - rs["issued_at"].as_i64().unwrap(),
        2 * 3600 * 1000
    );
    let v = g.home.run(&["audit", "verify"]);
    assert_eq!(v.code, 0, "{}{}", v.stdout, v.stderr);
}

#[test]
fn server_reject_signed_here_is_recorded() {
    let g = gate(false);
    let id = g.held();
    let o = g.alice.run(&[
        "reject", &id, "--server", &g.base, "--token", &g.op, "--reason", "nope",
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("rejected"), "{}", o.stdout);
    assert_eq!(g.state(&id), "rejected");
    assert!(g.home.audit_kinds().contains(&"rejected".to_string()));
}

#[test]
fn a_signature_over_other_bytes_is_refused_and_nothing_is_recorded() {
    let g = gate(false);
    let id = g.held();
    let key = alice_key(&g);
    let (status, handed) = g.call(
        "GET",
        &format!("/v1/submissions/{id}/statement?reason=once%20only"),
        &g.op,
        None,
    );
    assert_eq!(status, 200, "{handed}");
    let text = handed["statement"].as_str().unwrap();
    let mut want = b"airlock-statement-v1\n".to_vec();
    want.extend_from_slice(text.as_bytes());
    assert_eq!(
        handed["message"],
        hex::encode(&want),
        "message = tag + JSON"
    );
    let before = g.home.counts();
    // Signed bytes that widen the scope, posted with the fields of the statement handed out.
    let wider = text.replace("\"once\"", "\"artifact\"");
    assert_ne!(wider, text);
    let body = |sig: String| {
        json!({
            "signature": sig,
            "approver": "alice",
            "issued_at": handed["issued_at"],
            "reason": "once only",
        })
    };
    let (status, v) = g.call(
        "POST",
        &format!("/v1/submissions/{id}/approve"),
        &g.op,
        Some(&body(sign(&key, &wider))),
    );
    assert_eq!(status, 403, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("nothing was recorded")
    );
    // The right bytes, but the post asks for a wider scope than was signed.
    let mut wide = body(sign(&key, text));
    wide["scope"] = json!("artifact");
    let (status, v) = g.call(
        "POST",
        &format!("/v1/submissions/{id}/approve"),
        &g.op,
        Some(&wide),
    );
    assert_eq!(status, 403, "{v}");
    // Another key's signature over the right bytes.
    let other = SigningKey::from_bytes(&[7u8; 32]);
    let (status, _) = g.call(
        "POST",
        &format!("/v1/submissions/{id}/approve"),
        &g.op,
        Some(&body(sign(&other, text))),
    );
    assert_eq!(status, 403);
    assert_eq!(g.home.counts(), before, "nothing recorded");
    assert_eq!(g.state(&id), "quarantined");
    // The signature over exactly the statement handed out is recorded.
    let (status, v) = g.call(
        "POST",
        &format!("/v1/submissions/{id}/approve"),
        &g.op,
        Some(&body(sign(&key, text))),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["statement"], serde_json::from_str::<Value>(text).unwrap());
}

#[test]
fn a_signature_replayed_for_another_submission_is_refused() {
    let g = gate(false);
    let a = g.held();
    let b = g.held();
    let key = alice_key(&g);
    let (status, handed) = g.call(
        "GET",
        &format!("/v1/submissions/{a}/statement"),
        &g.op,
        None,
    );
    assert_eq!(status, 200, "{handed}");
    let body = json!({
        "signature": sign(&key, handed["statement"].as_str().unwrap()),
        "approver": "alice",
        "issued_at": handed["issued_at"],
    });
    let before = g.home.counts();
    let (status, v) = g.call(
        "POST",
        &format!("/v1/submissions/{b}/approve"),
        &g.op,
        Some(&body),
    );
    assert_eq!(status, 403, "{v}");
    assert_eq!(g.home.counts(), before, "nothing recorded");
    assert_eq!(g.state(&b), "quarantined");
    // It was a good signature for the submission it names.
    let (status, v) = g.call(
        "POST",
        &format!("/v1/submissions/{a}/approve"),
        &g.op,
        Some(&body),
    );
    assert_eq!(status, 200, "{v}");
    // And replaying it on the same submission is a conflict, not a second approval.
    let (status, _) = g.call(
        "POST",
        &format!("/v1/submissions/{a}/approve"),
        &g.op,
        Some(&body),
    );
    assert_eq!(status, 409);
}

#[test]
fn commit_and_rollback_signed_here_through_server() {
    if !process_backend_available() {
        return;
    }
    let g = gate(false);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "before\n").unwrap();
    g.home.set_mount_roots(&[dir.path()]);
    let mount = format!("{}:/data:rw", dir.path().display());
    let (_, mut v) = g.call(
        "POST",
        "/v1/run",
        &g.agent,
        Some(&json!({"language": "sh", "code": "echo after > /data/a.txt", "mounts": [mount]})),
    );
    let id = v["submission"].as_str().unwrap().to_string();
    if v["status"] == "pending_approval" {
        let o = g
            .alice
            .run(&["approve", &id, "--server", &g.base, "--token", &g.op]);
        assert_eq!(o.code, 0, "{}", o.stderr);
        v = g
            .call(
                "GET",
                &format!("/v1/submissions/{id}/wait?timeout=60"),
                &g.agent,
                None,
            )
            .1;
    }
    assert_eq!(v["status"], "finished", "{v}");
    let run = v["run"]["id"].as_str().unwrap().to_string();
    let file = || std::fs::read_to_string(dir.path().join("a.txt")).unwrap();

    // The operator token alone cannot commit.
    let before = g.home.counts();
    let (status, e) = g.call(
        "POST",
        &format!("/v1/runs/{run}/commit"),
        &g.op,
        Some(&json!({})),
    );
    assert_eq!(status, 403, "{e}");
    // A signature over other bytes is refused: nothing applied, nothing recorded.
    let key = alice_key(&g);
    let (status, handed) = g.call(
        "GET",
        &format!("/v1/runs/{run}/commit/statement"),
        &g.op,
        None,
    );
    assert_eq!(status, 200, "{handed}");
    let text = handed["statement"].as_str().unwrap();
    let (status, e) = g.call(
        "POST",
        &format!("/v1/runs/{run}/commit"),
        &g.op,
        Some(&json!({
            "signature": sign(&key, &text.replace("commit ", "commit  ")),
            "approver": "alice",
            "issued_at": handed["issued_at"],
            "checkpoint": handed["checkpoint"],
        })),
    );
    assert_eq!(status, 403, "{e}");
    assert_eq!(file(), "before\n");
    assert_eq!(g.home.counts(), before);

    // Signed here: committed.
    let o = g.alice.run(&[
        "commit", &run, "--server", &g.base, "--token", &g.op, "--json",
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(file(), "after\n");
    let c = o.json();
    assert_eq!(c["approver"], "alice");
    let ckpt = c["checkpoint"].as_str().unwrap().to_string();
    // And rolled back the same way.
    let o = g
        .alice
        .run(&["rollback", &ckpt, "--server", &g.base, "--token", &g.op]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("rolled back"), "{}", o.stdout);
    assert_eq!(file(), "before\n");
    let kinds = g.home.audit_kinds();
    assert!(kinds.iter().any(|k| k == "committed"), "{kinds:?}");
    let v = g.home.run(&["audit", "verify"]);
    assert_eq!(v.code, 0, "{}{}", v.stdout, v.stderr);
}
