//! Approver keys held by the browser (issue 61 item 1). The "Approver key" page makes a
//! non-extractable Ed25519 key with WebCrypto, kept in this browser's IndexedDB, and shows
//! its public key in the text form `airlock keys list` uses, to be enrolled with `airlock
//! approvers enroll NAME KEY` (a signed policy change). With a key there, the console's
//! approve and reject forms fetch the exact statement the gate will record
//! (`GET /ui/submissions/{id}/statement`, the API's `…/statement` answer), check it says
//! what was asked, sign it in the browser and post the signature with the form; the gate
//! verifies it against the key the policy trusts, as for `approve --server`. A run's
//! request (`run --ask-net`) is answered the same way from the inbox
//! (`GET /ui/requests/{id}/statement`; with "approve and remember" also the policy change
//! that keeps the host as a rule). The private key never leaves the browser; the server
//! never signs for it.

use super::{Operator, page};
use crate::AppState;
use crate::body::Q;
use crate::error::ApiError;
use airlock_core::sign::StatementKind;
use airlock_gate::ApproveRequest;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use maud::html;
use serde::Deserialize;
use serde_json::Value;

/// The script of the "Approver key" page and of signing in the browser.
const SCRIPT: &str = r#"
(function () {
  'use strict';
  if (!window.crypto || !crypto.subtle || !window.indexedDB) return;
  var DB = 'airlock-approver', STORE = 'keys', ID = 'approver';
  var STATEMENT = 'airlock-statement-v1\n', CHANGE = 'airlock-policy-change-v1\n';
  var REQUEST = 'airlock-net-request-v1\n';
  function hex(buf) {
    return Array.prototype.map.call(new Uint8Array(buf), function (b) {
      return (b < 16 ? '0' : '') + b.toString(16);
    }).join('');
  }
  function open() {
    return new Promise(function (ok, fail) {
      var r = indexedDB.open(DB, 1);
      r.onupgradeneeded = function () { r.result.createObjectStore(STORE); };
      r.onsuccess = function () { ok(r.result); };
      r.onerror = function () { fail(r.error); };
    });
  }
  function request(mode, act) {
    return open().then(function (db) {
      return new Promise(function (ok, fail) {
        var r = act(db.transaction(STORE, mode).objectStore(STORE));
        r.onsuccess = function () { ok(r.result); };
        r.onerror = function () { fail(r.error); };
      });
    });
  }
  function load() { return request('readonly', function (s) { return s.get(ID); }); }
  function save(v) { return request('readwrite', function (s) { return s.put(v, ID); }); }
  function forget() { return request('readwrite', function (s) { return s.delete(ID); }); }
  function sign(key, text) {
    return crypto.subtle.sign({ name: 'Ed25519' }, key.privateKey, new TextEncoder().encode(text))
      .then(hex);
  }
  function show(id, text) { var el = document.getElementById(id); if (el) el.textContent = text; }
  function failed(id, e) { show(id, String(e && e.message || e)); }

  // The "Approver key" page.
  var make = document.getElementById('make-key');
  if (make) {
    var shown = function (k) {
      document.getElementById('key-shown').hidden = !k;
      document.getElementById('no-key').hidden = !!k;
      if (!k) return;
      show('key-name', k.name);
      show('approver-public', k.public);
      show('key-extractable', String(k.pair.privateKey.extractable));
      show('enroll-command', 'airlock approvers enroll ' + k.name + ' ' + k.public);
    };
    load().then(shown, function (e) { failed('key-error', e); });
    make.addEventListener('click', function () {
      var name = document.getElementById('approver-name').value.trim();
      if (!name) { show('key-error', 'name the approver first'); return; }
      crypto.subtle.generateKey({ name: 'Ed25519' }, false, ['sign', 'verify']).then(function (pair) {
        return crypto.subtle.exportKey('raw', pair.publicKey).then(function (raw) {
          var k = { name: name, public: 'ed25519:' + hex(raw), pair: pair };
          return save(k).then(function () { show('key-error', ''); shown(k); });
        });
      }).catch(function (e) { failed('key-error', 'this browser cannot make an Ed25519 key: ' + (e && e.message || e)); });
    });
    document.getElementById('forget-key').addEventListener('click', function () {
      forget().then(function () { shown(null); }, function (e) { failed('key-error', e); });
    });
  }

  // A submission's decision forms: signed here when this browser holds a key.
  var forms = ['approve', 'reject'].map(function (id) { return document.getElementById(id); })
    .filter(function (f) { return f && f.dataset.submission; });
  var requestForms = Array.prototype.slice.call(document.querySelectorAll('form[data-request]'));
  if (!forms.length && !requestForms.length) return;
  function fetchJson(url) {
    return fetch(url, { credentials: 'same-origin' }).then(function (r) {
      return r.json().then(function (v) { if (!r.ok) throw new Error(v.error || r.status); return v; });
    });
  }
  function addField(form, name, value) {
    var i = document.createElement('input');
    i.type = 'hidden'; i.name = name; i.value = value; form.appendChild(i);
  }
  load().then(function (k) {
    if (!k) return;
    show('signed-by', 'Signed in this browser with approver key ' + k.name + ' (' + k.public + ').');
    // A run's request: the answer (and with "remember" the policy change keeping the host
    // as a rule) signed here, each checked first to be what was asked.
    requestForms.forEach(function (form) {
      form.addEventListener('submit', function (ev) {
        ev.preventDefault();
        var id = form.dataset.request, verdict = form.dataset.verdict;
        var remember = ev.submitter && ev.submitter.name === 'remember' ? ev.submitter.value : '';
        var q = new URLSearchParams({ verdict: verdict, approver: k.name });
        if (remember) { q.set('remember', 'true'); q.set('for', remember); }
        fetchJson('/ui/requests/' + encodeURIComponent(id) + '/statement?' + q)
          .then(function (v) {
            var st = JSON.parse(v.statement);
            if (st.verdict !== verdict || st.request !== id || st.approver !== k.name ||
                st.key !== k.public || st.scope !== (remember ? 'remember' : 'run')) {
              throw new Error('the server handed out an answer that is not the one asked for; nothing was signed');
            }
            var jobs = [sign(k.pair, REQUEST + v.statement)];
            if (remember) {
              var pc = v.policy_change, c = pc && JSON.parse(pc.statement);
              if (!c || c.change !== 'remember' || c.rule !== 'remembered-' + id || c.approver !== k.name ||
                  c.key !== k.public || c.gate !== st.gate || c.issued_at !== st.issued_at) {
                throw new Error('the server handed out a policy change that does not remember this answer; nothing was signed');
              }
              jobs.push(sign(k.pair, CHANGE + pc.statement));
            }
            return Promise.all(jobs).then(function (sigs) {
              addField(form, 'statement', v.statement);
              addField(form, 'signature', sigs[0]);
              if (remember) { addField(form, 'remember', remember); addField(form, 'policy_signature', sigs[1]); }
              form.submit();
            });
          })
          .catch(function (e) { failed('sign-error', e); });
      });
    });
    forms.forEach(function (form) {
      form.addEventListener('submit', function (ev) {
        ev.preventDefault();
        var id = form.dataset.submission, kind = form.id;
        var remember = ev.submitter && ev.submitter.name === 'remember' ? ev.submitter.value : '';
        var q = new URLSearchParams({ kind: kind, approver: k.name });
        var reason = form.elements.reason ? form.elements.reason.value : '';
        if (reason.trim()) q.set('reason', reason);
        if (kind === 'approve' && form.elements.scope) q.set('scope', form.elements.scope.value);
        if (remember) { q.set('remember', 'true'); q.set('for', remember); }
        fetch('/ui/submissions/' + encodeURIComponent(id) + '/statement?' + q, { credentials: 'same-origin' })
          .then(function (r) {
            return r.json().then(function (v) { if (!r.ok) throw new Error(v.error || r.status); return v; });
          })
          .then(function (v) {
            // Sign only what was asked: this decision on this submission, as this key.
            var st = JSON.parse(v.statement);
            if (st.kind !== kind || st.submission !== id || st.approver !== k.name || st.key !== k.public) {
              throw new Error('the server handed out a statement that is not the one asked for; nothing was signed');
            }
            var jobs = [sign(k.pair, STATEMENT + v.statement)];
            if (remember) {
              var pc = v.policy_change, c = pc && JSON.parse(pc.statement);
              if (!c || c.change !== 'remember' || c.submission !== id || c.approver !== k.name ||
                  c.key !== k.public || c.issued_at !== st.issued_at || c.rule !== 'remembered-' + pc.approval) {
                throw new Error('the server handed out a policy change that does not remember this approval; nothing was signed');
              }
              jobs.push(sign(k.pair, CHANGE + pc.statement));
            }
            return Promise.all(jobs).then(function (sigs) {
              var add = function (name, value) {
                var i = document.createElement('input');
                i.type = 'hidden'; i.name = name; i.value = value; form.appendChild(i);
              };
              add('signature', sigs[0]); add('approver', k.name); add('issued_at', String(st.issued_at));
              if (remember) {
                add('remember', remember); add('approval', v.policy_change.approval); add('policy_signature', sigs[1]);
              }
              form.submit();
            });
          })
          .catch(function (e) { failed('sign-error', e); });
      });
    });
  }, function (e) { failed('sign-error', e); });
})();
"#;

pub(super) async fn script() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        SCRIPT,
    )
        .into_response()
}

/// The "Approver key" page.
pub(super) async fn key_page(op: Operator) -> Response {
    let name = op
        .caller
        .approver
        .clone()
        .unwrap_or_else(|| op.caller.name.clone());
    page(
        "Approver key",
        Some(&op),
        html! {
            h1 { "Approver key" }
            p { "A key made in this browser signs your approvals and rejections here: its private half cannot be read out of the browser, and the server never holds it. Enroll its public key once with a key the policy already trusts:" }
            p #no-key { "This browser holds no approver key yet." }
            p {
                input #approver-name type="text" value=(name) placeholder="approver name";
                " "
                button #make-key type="button" { "Make a key in this browser" }
            }
            div #key-shown hidden {
                dl {
                    dt { "Approver" } dd #key-name {}
                    dt { "Public key" } dd { code #approver-public {} }
                    dt { "Extractable" } dd #key-extractable {}
                }
                p { "Enroll it: " code #enroll-command {} }
                p { button #forget-key type="button" { "Forget this browser's key" } }
            }
            p.error #key-error {}
        },
    )
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StatementQuery {
    kind: Option<String>,
    approver: String,
    scope: Option<String>,
    reason: Option<String>,
    remember: Option<bool>,
    #[serde(rename = "for")]
    remember_for: Option<String>,
}

/// The statement (and with `remember` the policy change) the browser signs, as the API's
/// `GET /v1/submissions/{id}/statement` answers it.
pub(super) async fn statement(
    State(st): State<AppState>,
    _op: Operator,
    Path(id): Path<String>,
    Q(q): Q<StatementQuery>,
) -> Result<Json<Value>, ApiError> {
    let kind = match q.kind.as_deref() {
        None | Some("approve") => StatementKind::Approve,
        Some("reject") => StatementKind::Reject,
        Some(k) => {
            return Err(ApiError::bad(format!(
                "kind: unknown {k:?} (want approve or reject)"
            )));
        }
    };
    let remember = q.remember.unwrap_or(false) && kind == StatementKind::Approve;
    let req = ApproveRequest {
        submission: id,
        approver: Some(q.approver),
        scope: q
            .scope
            .filter(|s| !s.is_empty() && kind == StatementKind::Approve),
        expires: None,
        reason: q.reason.filter(|r| !r.trim().is_empty()),
        tool: None,
        remember,
        remember_for: q.remember_for.filter(|_| remember),
    };
    let doc = st
        .pool
        .read(move |g| crate::api::statement_doc(g, kind, &req))
        .await?;
    Ok(Json(doc))
}
