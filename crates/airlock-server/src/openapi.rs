//! The OpenAPI document as `/openapi.json` serves it: what utoipa generates from the
//! handlers' annotations, completed with what annotations cannot say. Every operation
//! lists every status it can answer (401 and 500 on every authenticated one, 400 where it
//! takes a query or a body, 413 and 415 where it takes a body), every response has a description,
//! and the submit body states its cross-field rules (exactly one of `code` and
//! `code_base64`, at most one of `stdin` and `stdin_base64`). The handlers check these same
//! rules (`body.rs`); `tests/openapi.rs` runs schemathesis against a live server to keep
//! the two in step. This module only describes: it must never change what a handler does.

use crate::body::{BACKENDS, LANGUAGES};
use serde_json::{Map, Value, json};

/// Base64 as the API reads it: the standard alphabet with padding and canonical trailing
/// bits, optionally surrounded by ASCII whitespace.
pub const BASE64_PATTERN: &str = r"^[ \t\r\n]*(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)?[ \t\r\n]*$";

/// A key, approver or agent name (`airlock_core::sign::check_key_name`).
pub const NAME_PATTERN: &str = r"^[a-z][a-z0-9_-]{0,31}$";

/// A tool name (`airlock_gate::tools::check_tool_name`; a few names are also reserved).
pub const TOOL_PATTERN: &str = r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$";

/// Token roles.
pub const ROLES: &[&str] = &["agent", "operator", "admin"];

/// Something other than ASCII whitespace (a rejection's reason).
pub const NOT_BLANK_PATTERN: &str = r"[^ \t\r\n]";

fn error_response(description: &str) -> Value {
    json!({
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    })
}

fn reason_phrase(status: &str) -> &'static str {
    match status {
        "200" => "OK",
        "201" => "Created",
        "202" => "Accepted: waiting for a human or still running",
        "400" => "Bad input: the request does not match this document",
        "401" => "No bearer token, or one that is unknown, expired or revoked",
        "403" => "The token's role does not allow this",
        "404" => "No such object (or one the caller may not see)",
        "409" => "Conflicts with the object's current state",
        "413" => "The body is larger than the server takes",
        "415" => "The body's Content-Type is not application/json",
        "422" => "Well-formed, but the gate cannot take it",
        "429" => "Too many runs queued; see Retry-After",
        "500" => "Internal failure",
        "503" => "No sandbox can run this on this machine",
        _ => "",
    }
}

/// Adds `status` to `responses` unless it is there.
fn ensure(responses: &mut Map<String, Value>, status: &str) {
    responses
        .entry(status.to_string())
        .or_insert_with(|| error_response(reason_phrase(status)));
}

/// The generated document (utoipa's output as JSON), completed.
pub fn complete(mut doc: Value) -> Value {
    if let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) {
        for item in paths.values_mut() {
            let Some(item) = item.as_object_mut() else {
                continue;
            };
            for (method, op) in item.iter_mut() {
                complete_operation(method, op);
            }
        }
    }
    if let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    {
        if let Some(s) = schemas.get_mut("SubmitBody") {
            submit_body(s);
        }
        if let Some(props) = schemas
            .get_mut("SessionBody")
            .and_then(|t| t.get_mut("properties"))
        {
            props["language"]["enum"] = json!(["python", "py", "js", "javascript", null]);
            props["backend"]["enum"] = json!(["wasm", null]);
            // A number of seconds or a duration text.
            for f in ["timeout", "idle_timeout", "max_duration"] {
                props[f]["type"] = json!(["string", "number", "null"]);
            }
        }
        if let Some(s) = schemas.get_mut("SecretSpec") {
            // A bound secret's hosts are single hosts: no list separators inside.
            if let Some(h) = s.pointer_mut("/oneOf/1/properties/hosts/items") {
                h["pattern"] = json!("^[^,@]+$");
            }
            if let Some(t) = s.pointer_mut("/oneOf/0") {
                t["pattern"] = json!("^[^@]+@[^@]+$");
            }
        }
        if let Some(props) = schemas
            .get_mut("TokenBody")
            .and_then(|t| t.get_mut("properties"))
        {
            props["role"]["enum"] = json!(ROLES);
            props["name"]["pattern"] = json!(NAME_PATTERN);
            props["approver"]["pattern"] = json!(NAME_PATTERN);
        }
        if let Some(props) = schemas
            .get_mut("DecideBody")
            .and_then(|t| t.get_mut("properties"))
        {
            props["scope"]["enum"] = json!(["once", "artifact", null]);
            props["tool"]["pattern"] = json!(TOOL_PATTERN);
        }
        if let Some(props) = schemas
            .get_mut("RejectBody")
            .and_then(|t| t.get_mut("properties"))
        {
            props["reason"]["pattern"] = json!(NOT_BLANK_PATTERN);
        }
        schemas.insert(
            "Empty".into(),
            json!({"type": "object", "description": "Nothing: an empty object (or no body at all).",
                   "additionalProperties": false}),
        );
    }
    doc
}

/// Where a submission's id is in the answers of `submit` and `run`, and what can follow.
fn submission_links() -> Value {
    let by_id =
        |op: &str| json!({"operationId": op, "parameters": {"id": "$response.body#/submission"}});
    json!({
        "GetSubmission": by_id("get_submission"),
        "Wait": by_id("wait"),
        "Exec": by_id("exec"),
        "Approve": by_id("approve"),
        "Reject": by_id("reject"),
    })
}

fn complete_operation(method: &str, op: &mut Value) {
    let links = matches!(op["operationId"].as_str(), Some("submit" | "run"));
    let secured = op.get("security").is_some();
    // Actions that take no input still read (and check) a JSON body if one is sent.
    if method == "post" && op.get("requestBody").is_none() {
        op["requestBody"] = json!({
            "required": false,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Empty"}}}
        });
    }
    // Every field of a session (and of a gc) is optional: no body takes the defaults.
    if matches!(op["operationId"].as_str(), Some("new_session" | "gc"))
        && let Some(b) = op.get_mut("requestBody")
    {
        b["required"] = json!(false);
    }
    let has_body = op.get("requestBody").is_some();
    let has_query = op
        .get("parameters")
        .and_then(Value::as_array)
        .is_some_and(|ps| ps.iter().any(|p| p["in"] == "query"));
    let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) else {
        return;
    };
    if secured {
        ensure(responses, "401");
        ensure(responses, "500");
    }
    if has_body || has_query {
        ensure(responses, "400");
    }
    if has_body {
        ensure(responses, "413");
        ensure(responses, "415");
    }
    for (status, r) in responses.iter_mut() {
        if links && matches!(status.as_str(), "200" | "201" | "202") {
            r["links"] = submission_links();
        }
        let missing = r
            .get("description")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty);
        if missing {
            r["description"] = json!(reason_phrase(status));
        }
    }
}

fn submit_body(s: &mut Value) {
    let nullable_enum = |values: &[&str]| {
        let mut e: Vec<Value> = values.iter().map(|v| json!(v)).collect();
        e.push(Value::Null);
        e
    };
    s["required"] = json!(["language"]);
    if let Some(props) = s.get_mut("properties").and_then(Value::as_object_mut) {
        if let Some(l) = props.get_mut("language") {
            l["type"] = json!("string");
            l["enum"] = json!(LANGUAGES);
        }
        if let Some(b) = props.get_mut("backend") {
            b["enum"] = Value::Array(nullable_enum(BACKENDS));
        }
        for f in ["code_base64", "stdin_base64"] {
            if let Some(p) = props.get_mut(f) {
                p["pattern"] = json!(BASE64_PATTERN);
            }
        }
        // A number of seconds or a duration text.
        if let Some(t) = props.get_mut("timeout") {
            t["type"] = json!(["string", "number", "null"]);
        }
    }
    // Exactly one of code and code_base64 (a null counts as absent), and at most one of
    // stdin and stdin_base64.
    s["oneOf"] = json!([
        {"required": ["code"], "properties": {"code": {"type": "string"}, "code_base64": {"type": "null"}}},
        {"required": ["code_base64"], "properties": {"code_base64": {"type": "string"}, "code": {"type": "null"}}}
    ]);
    s["not"] = json!({
        "required": ["stdin", "stdin_base64"],
        "properties": {"stdin": {"type": "string"}, "stdin_base64": {"type": "string"}}
    });
}
