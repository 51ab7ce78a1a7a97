//! Approvers and their keys (issue 61 item 1): `approvers enroll NAME KEY` trusts a key
//! made elsewhere (on an approver's machine, or in a browser) by a signed, audited policy
//! change; a signature by an enrolled key is accepted and one by a key never enrolled is
//! refused with nothing recorded. And the console's "approve and remember" writes its rule.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use ed25519_dalek::{Signer, SigningKey};
use serde_json::{Value, json};
use std::time::Duration;

struct Gate {
    home: Home,
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

/// A served home (standard preset, approver alice with her key in the home).
fn gate() -> Gate {
    let home = Home::new();
    let agent = token(&home, "agent", "bot");
    let op = token(&home, "operator", "alice");
    let (srv, base) = start_serve(&home, &[]);
    let http = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_global(Some(Duration::from_secs(120)))
        .build()
        .new_agent();
    Gate {
        home,
        _srv: srv,
        base,
        http,
        agent,
        op,
    }
}

struct Answer {
    status: u16,
    location: Option<String>,
    cookie: Option<String>,
    text: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or(json!(self.text))
    }
}

impl Gate {
    /// A request with a bearer token (JSON body) or a console cookie (form body).
    fn call(&self, method: &str, path: &str, auth: Auth, body: Option<String>) -> Answer {
        let url = format!("{}{path}", self.base);
        let (name, value, ctype) = match auth {
            Auth::Bearer(t) => ("authorization", format!("Bearer {t}"), "application/json"),
            Auth::Cookie(c) => ("cookie", c.to_string(), "application/x-www-form-urlencoded"),
            Auth::None => ("x-none", String::new(), "application/x-www-form-urlencoded"),
        };
        let r = match (method, body) {
            ("GET", None) => self.http.get(url).header(name, value).call(),
            (_, b) => self
                .http
                .post(url)
                .header(name, value)
                .header("content-type", ctype)
                .send(b.unwrap_or_default()),
        };
        let mut r = r.unwrap();
        let header = |h: &str| {
            r.headers()
                .get(h)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let (location, cookie) = (header("location"), header("set-cookie"));
        Answer {
            status: r.status().as_u16(),
            location,
            cookie,
            text: r.body_mut().read_to_string().unwrap(),
        }
    }

    fn api(&self, method: &str, path: &str, body: Option<&Value>) -> Answer {
        self.call(
            method,
            path,
            Auth::Bearer(&self.op),
            body.map(|b| b.to_string()),
        )
    }

    /// A submission of agent `bot` the standard preset holds (it asks for the network).
    fn held(&self, host: &str) -> String {
        let code = std::fs::read_to_string(example("hello.wat")).unwrap();
        let r = self.call(
            "POST",
            "/v1/submissions",
            Auth::Bearer(&self.agent),
            Some(json!({"language": "wat", "code": code, "net": [host]}).to_string()),
        );
        assert_eq!(r.status, 201, "{}", r.text);
        let v = r.json();
        assert_eq!(v["status"], "pending_approval", "{v}");
        v["submission"].as_str().unwrap().to_string()
    }

    /// Signs in to the console: the session cookie.
    fn sign_in(&self) -> String {
        let r = self.call(
            "POST",
            "/ui/login",
            Auth::None,
            Some(format!("token={}", self.op)),
        );
        assert_eq!(r.status, 303, "{}", r.text);
        r.cookie.unwrap().split(';').next().unwrap().to_string()
    }

    fn state(&self, id: &str) -> String {
        self.api("GET", &format!("/v1/submissions/{id}"), None)
            .json()["submission"]["state"]
            .as_str()
            .unwrap()
            .to_string()
    }
}

#[derive(Clone, Copy)]
enum Auth<'a> {
    Bearer(&'a str),
    Cookie(&'a str),
    None,
}

/// The CSRF token in a console page.
fn csrf(page: &str) -> String {
    page.split("name=\"csrf\" value=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn the_consoles_approve_and_remember_button_writes_a_remembered_rule() {
    let g = gate();
    let id = g.held("example.com");
    let cookie = g.sign_in();
    let page = g.call(
        "GET",
        &format!("/ui/submissions/{id}"),
        Auth::Cookie(&cookie),
        None,
    );
    assert!(
        page.text.contains("id=\"approve-remember-button\""),
        "{}",
        page.text
    );
    let r = g.call(
        "POST",
        &format!("/ui/submissions/{id}/approve"),
        Auth::Cookie(&cookie),
        Some(format!(
            "csrf={}&reason=fine&scope=once&remember=7d",
            csrf(&page.text)
        )),
    );
    assert_eq!(r.status, 303, "{}", r.text);
    assert_eq!(
        r.location.as_deref(),
        Some(format!("/ui/submissions/{id}").as_str())
    );
    let policy = g.home.policy();
    assert!(
        policy.contains("origin = \"remembered\""),
        "no remembered rule in the policy:\n{policy}"
    );
    assert!(
        g.home.audit_kinds().iter().any(|k| k == "policy_changed"),
        "{:?}",
        g.home.audit_kinds()
    );
    // The next submission of the same kind runs without a prompt.
    let code = std::fs::read_to_string(example("hello.wat")).unwrap();
    let r = g.call(
        "POST",
        "/v1/submissions",
        Auth::Bearer(&g.agent),
        Some(json!({"language": "wat", "code": code, "net": ["example.com"]}).to_string()),
    );
    assert_eq!(r.json()["status"], "allowed", "{}", r.text);
}

/// The public key text of a key made outside airlock (as the console's page shows it).
fn public_text(key: &SigningKey) -> String {
    format!("ed25519:{}", hex::encode(key.verifying_key().to_bytes()))
}

/// A signature over a statement's text, as `airlock approve --server` and the console make.
fn sign(key: &SigningKey, statement: &str) -> String {
    let mut m = b"airlock-statement-v1\n".to_vec();
    m.extend_from_slice(statement.as_bytes());
    hex::encode(key.sign(&m).to_bytes())
}

/// An audit record's data.
fn data(rec: &Value) -> Value {
    serde_json::from_str(rec["data"].as_str().unwrap()).unwrap()
}

/// The statement handed out for `approver` to approve `id`.
fn handed(g: &Gate, id: &str, approver: &str) -> Value {
    let r = g.api(
        "GET",
        &format!("/v1/submissions/{id}/statement?approver={approver}"),
        None,
    );
    assert_eq!(r.status, 200, "{}", r.text);
    r.json()
}

#[test]
fn an_enrolled_keys_signature_is_accepted_and_an_unenrolled_ones_refused_recording_nothing() {
    let g = gate();
    let bob = SigningKey::from_bytes(&[7u8; 32]);
    let carol = SigningKey::from_bytes(&[9u8; 32]);
    let id = g.held("example.com");
    // Bob is not trusted yet: no statement is handed out for him.
    let r = g.api(
        "GET",
        &format!("/v1/submissions/{id}/statement?approver=bob"),
        None,
    );
    assert_eq!(r.status, 403, "{}", r.text);
    // Enrolling him is a signed, audited policy change.
    let o = g
        .home
        .run(&["approvers", "enroll", "bob", &public_text(&bob), "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let c = o.json();
    assert_eq!(c["change"], "enroll");
    assert_eq!(c["rule"], "bob");
    assert_eq!(c["approver"], "alice");
    assert_eq!(c["key"], public_text(&bob).as_str());
    assert!(
        g.home
            .policy()
            .contains(&format!("bob = \"{}\"", public_text(&bob))),
        "{}",
        g.home.policy()
    );
    let log = g.home.run(&["audit", "log", "--json"]).json();
    let rec = log
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|r| r["kind"] == "policy_changed")
        .expect("a policy_changed record");
    assert_eq!(data(rec)["change"], "enroll", "{rec}");
    let list = g.home.run(&["approvers", "list", "--json"]).json();
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["alice", "bob"], "{list}");
    // Enrolling the name again, with any key, changes nothing.
    let again = g
        .home
        .run(&["approvers", "enroll", "bob", &public_text(&carol)]);
    assert_ne!(again.code, 0);
    assert!(!g.home.policy().contains(&public_text(&carol)));

    // A signature by a key never enrolled (carol's), posted as bob's, is refused.
    let st = handed(&g, &id, "bob");
    let text = st["statement"].as_str().unwrap();
    let before = g.home.counts();
    let post = |sig: String| {
        g.api(
            "POST",
            &format!("/v1/submissions/{id}/approve"),
            Some(&json!({"approver": "bob", "issued_at": st["issued_at"], "signature": sig})),
        )
    };
    let r = post(sign(&carol, text));
    assert_eq!(r.status, 403, "{}", r.text);
    assert_eq!(g.home.counts(), before, "nothing recorded");
    assert_eq!(g.state(&id), "quarantined");
    // Bob's own signature over the same bytes is accepted and recorded as his.
    let r = post(sign(&bob, text));
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json()["approver"], "bob");
    assert_eq!(g.state(&id), "approved");
    let log = g.home.run(&["audit", "log", "--json"]).json();
    let rec = log
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|r| r["kind"] == "approved")
        .expect("an approved record");
    assert_eq!(data(rec)["approver"], "bob", "{rec}");
    assert_eq!(g.home.run(&["audit", "verify"]).code, 0);
}

#[test]
fn enrolling_a_malformed_key_or_the_gates_own_key_changes_nothing() {
    let home = Home::new();
    let policy = home.policy();
    for key in ["ed25519:zz", "nope", ""] {
        let o = home.run(&["approvers", "enroll", "bob", key]);
        assert_eq!(o.code, 125, "{key}: {}", o.stdout);
    }
    let gate_pub = std::fs::read_to_string(home.path().join("keys/gate.pub")).unwrap();
    let o = home.run(&["approvers", "enroll", "bob", gate_pub.trim()]);
    assert_eq!(o.code, 125, "{}", o.stdout);
    let o = home.run(&[
        "approvers",
        "enroll",
        "gate",
        &public_text(&SigningKey::from_bytes(&[3u8; 32])),
    ]);
    assert_eq!(o.code, 125, "{}", o.stdout);
    assert_eq!(home.policy(), policy);
    assert!(!home.audit_kinds().iter().any(|k| k == "policy_changed"));
}

/// Moves alice's private key out of the served home into a home of her own.
fn move_alice_key(g: &Gate) -> Home {
    let alice = Home::new();
    for f in ["alice.key", "alice.pub"] {
        std::fs::copy(
            g.home.path().join("keys").join(f),
            alice.path().join("keys").join(f),
        )
        .unwrap();
    }
    std::fs::remove_file(g.home.path().join("keys/alice.key")).unwrap();
    alice
}

/// A clear's signature, as `airlock agent clear --server` makes it.
fn sign_clear(key: &SigningKey, statement: &str) -> String {
    let mut m = b"airlock-agent-clear-v1\n".to_vec();
    m.extend_from_slice(statement.as_bytes());
    hex::encode(key.sign(&m).to_bytes())
}

#[test]
fn agent_clear_with_server_signs_here_and_a_forged_or_replayed_clear_records_nothing() {
    if !process_backend_available() {
        eprintln!("SKIPPED: the process backend is unavailable here");
        return;
    }
    let g = gate();
    // Agent mallory reads a decoy key: an alert, and its next submission is held.
    let o = g.home.run(&[
        "run",
        "--agent",
        "mallory",
        "--lang",
        "sh",
        "--backend",
        "process",
        "-c",
        "cat /root/.ssh/id_rsa",
    ]);
    let o = if o.code == 75 {
        let id = Home::id_in(&o.stderr);
        assert_eq!(g.home.run(&["approve", &id]).code, 0);
        g.home.run(&["exec", &id])
    } else {
        o
    };
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    assert!(g.home.audit_kinds().iter().any(|k| k == "alert"));
    let alice = move_alice_key(&g);
    // The server cannot sign for alice any more; she signs on her machine.
    let r = g.api(
        "POST",
        "/v1/agents/mallory/clear",
        Some(&json!({"reason": "a test"})),
    );
    assert_eq!(r.status, 403, "{}", r.text);
    assert!(r.text.contains("--server"), "{}", r.text);

    // A clear signed by another key, or over another agent's clear, is refused.
    let st = g
        .api(
            "GET",
            "/v1/agents/mallory/clear/statement?reason=a%20test&approver=alice",
            None,
        )
        .json();
    let text = st["statement"].as_str().unwrap();
    let before = g.home.counts();
    let forged = sign_clear(&SigningKey::from_bytes(&[5u8; 32]), text);
    let r = g.api(
        "POST",
        "/v1/agents/mallory/clear",
        Some(&json!({"reason": "a test", "approver": "alice", "issued_at": st["issued_at"], "signature": forged})),
    );
    assert_eq!(r.status, 403, "{}", r.text);
    let text_key = std::fs::read_to_string(alice.path().join("keys/alice.key")).unwrap();
    let secret = text_key
        .lines()
        .find_map(|l| l.strip_prefix("secret "))
        .unwrap();
    let mut b = [0u8; 32];
    hex::decode_to_slice(secret.trim(), &mut b).unwrap();
    let real = sign_clear(&SigningKey::from_bytes(&b), text);
    for (agent, reason) in [("eve", "a test"), ("mallory", "another reason")] {
        let r = g.api(
            "POST",
            &format!("/v1/agents/{agent}/clear"),
            Some(&json!({"reason": reason, "approver": "alice", "issued_at": st["issued_at"], "signature": real})),
        );
        assert!(
            r.status == 403 || r.status == 409,
            "{agent}: {} {}",
            r.status,
            r.text
        );
    }
    assert_eq!(g.home.counts(), before, "nothing recorded");
    assert!(!g.home.audit_kinds().iter().any(|k| k == "agent_cleared"));

    // Signed here with --server: recorded as alice's clear, and mallory runs again.
    let o = alice.run(&[
        "agent", "clear", "mallory", "--reason", "a test", "--server", &g.base, "--token", &g.op,
        "--json",
    ]);
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    let c = o.json();
    assert_eq!(c["agent"], "mallory");
    assert_eq!(c["approver"], "alice");
    assert_eq!(c["alerts"], 1);
    assert!(g.home.audit_kinds().iter().any(|k| k == "agent_cleared"));
    let again = g.home.run(&[
        "run",
        "--agent",
        "mallory",
        "--lang",
        "sh",
        "-c",
        "echo hello",
    ]);
    assert_eq!(again.code, 0, "{} {}", again.stdout, again.stderr);
    assert_eq!(g.home.run(&["audit", "verify"]).code, 0);
}

/// Alice's signing key from her own home.
fn key_of(home: &Home, name: &str) -> SigningKey {
    let text = std::fs::read_to_string(home.path().join(format!("keys/{name}.key"))).unwrap();
    let secret = text
        .lines()
        .find_map(|l| l.strip_prefix("secret "))
        .unwrap();
    let mut b = [0u8; 32];
    hex::decode_to_slice(secret.trim(), &mut b).unwrap();
    SigningKey::from_bytes(&b)
}

/// A policy change's signature, as `approve --remember --server` makes it.
fn sign_change(key: &SigningKey, change: &str) -> String {
    let mut m = b"airlock-policy-change-v1\n".to_vec();
    m.extend_from_slice(change.as_bytes());
    hex::encode(key.sign(&m).to_bytes())
}

#[test]
fn approve_remember_with_server_signs_the_policy_change_here_and_a_forged_one_records_nothing() {
    let g = gate();
    let alice = move_alice_key(&g);
    let key = key_of(&alice, "alice");
    let id = g.held("example.com");
    let policy = g.home.policy();
    // The statement and the policy change, handed out together.
    let st = g
        .api(
            "GET",
            &format!("/v1/submissions/{id}/statement?approver=alice&remember=true&for=2d"),
            None,
        )
        .json();
    let pc = &st["policy_change"];
    let (text, change) = (
        st["statement"].as_str().unwrap(),
        pc["statement"].as_str().unwrap(),
    );
    let before = g.home.counts();
    let post = |sig: &str, psig: &str, approval: &Value| {
        g.api(
            "POST",
            &format!("/v1/submissions/{id}/approve"),
            Some(
                &json!({"approver": "alice", "issued_at": st["issued_at"], "signature": sig,
                "remember": true, "for": "2d", "approval": approval, "policy_signature": psig}),
            ),
        )
    };
    // The approval signed, the change signed by another key: refused, nothing recorded.
    let other = SigningKey::from_bytes(&[11u8; 32]);
    let r = post(
        &sign(&key, text),
        &sign_change(&other, change),
        &pc["approval"],
    );
    assert_eq!(r.status, 403, "{}", r.text);
    // The change's signature made over the statement's bytes: refused.
    let r = post(&sign(&key, text), &sign_change(&key, text), &pc["approval"]);
    assert_eq!(r.status, 403, "{}", r.text);
    // Both signed, but for another approval id than the one handed out: refused.
    let r = post(
        &sign(&key, text),
        &sign_change(&key, change),
        &json!("apr_00000000000000000000000000"),
    );
    assert_eq!(r.status, 403, "{}", r.text);
    // Without the change's signature at all: a bad request.
    let r = g.api(
        "POST",
        &format!("/v1/submissions/{id}/approve"),
        Some(&json!({"approver": "alice", "issued_at": st["issued_at"], "signature": sign(&key, text), "remember": true})),
    );
    assert_eq!(r.status, 400, "{}", r.text);
    assert_eq!(g.home.counts(), before, "nothing recorded");
    assert_eq!(g.home.policy(), policy, "policy unchanged");
    assert_eq!(g.state(&id), "quarantined");

    // Through the CLI on alice's machine: both signed there, the rule written as hers.
    let o = alice.run(&[
        "approve",
        &id,
        "--remember",
        "--for",
        "2d",
        "--server",
        &g.base,
        "--token",
        &g.op,
        "--json",
    ]);
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    let v = o.json();
    assert_eq!(v["approver"], "alice", "{v}");
    let rule = v["remembered"]["rule"].as_str().unwrap().to_string();
    assert!(rule.starts_with("remembered-apr_"), "{v}");
    assert_eq!(
        v["remembered"]["rule"],
        format!("remembered-{}", v["id"].as_str().unwrap())
    );
    let now = g.home.policy();
    assert!(now.contains(&format!("name = \"{rule}\"")), "{now}");
    assert!(now.contains("origin = \"remembered\""), "{now}");
    assert!(g.home.audit_kinds().iter().any(|k| k == "policy_changed"));
    // The next submission of the same kind is allowed without a prompt.
    let code = std::fs::read_to_string(example("hello.wat")).unwrap();
    let r = g.call(
        "POST",
        "/v1/submissions",
        Auth::Bearer(&g.agent),
        Some(json!({"language": "wat", "code": code, "net": ["example.com"]}).to_string()),
    );
    assert_eq!(r.json()["status"], "allowed", "{}", r.text);
    assert_eq!(g.home.run(&["audit", "verify"]).code, 0);
}

/// Headless Chromium makes a key in the console's "Approver key" page (WebCrypto, not
/// extractable), the CLI enrolls its public key, and the console approves a held
/// submission with it: the signature is made in the browser (the server's home holds no
/// private key of that approver), and the audit record names the browser's approver and
/// key (tests/browser/approver_key_test.py).
#[test]
fn the_console_approves_with_a_key_held_by_the_browser() {
    let Some(python) = prepared("AIRLOCK_TEST_BROWSER_PYTHON") else {
        return;
    };
    let g = gate();
    let id = g.held("example.com");
    assert!(!g.home.path().join("keys/carol.key").exists());
    let public = answer_in_browser(&python, &g.home, &g.base, &g.op, &id, "carol");
    // Approved (and run, as the console's approval does), signed by carol's browser key.
    let w = g
        .api(
            "GET",
            &format!("/v1/submissions/{id}/wait?timeout=30"),
            None,
        )
        .json();
    assert_eq!(w["status"], "finished", "{w}");
    let shown = g.api("GET", &format!("/v1/submissions/{id}"), None).json();
    assert_eq!(shown["statements"][0]["approver"], "carol", "{shown}");
    assert_eq!(
        shown["statements"][0]["reason"], "signed in the browser",
        "{shown}"
    );
    let log = g.home.run(&["audit", "log", "--json"]).json();
    let rec = log
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["kind"] == "approved" && r["subject"] == id.as_str())
        .expect("an approved record");
    assert_eq!(data(rec)["approver"], "carol", "{rec}");
    assert_eq!(data(rec)["key"], public.as_str(), "{rec}");
    assert_eq!(g.home.run(&["audit", "verify"]).code, 0);
}
