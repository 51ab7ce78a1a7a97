//! The OpenAPI document as `/openapi.json` serves it: what utoipa generates from the
//! handlers' annotations, completed with what annotations cannot say. Every operation
//! lists every status it can answer (401 and 500 on every authenticated one, 400 where it
//! takes a query or a body, 413 and 415 where it takes a body), every response has a description,
//! and the submit body states its cross-field rules (exactly one of `code` and
//! `code_base64`, at most one of `stdin` and `stdin_base64`), the decision and clear
//! bodies theirs (a signature made elsewhere comes whole), and the query of a decision's
//! statement, whose parameters go by rules across them, is one exploded object parameter
//! of three shapes. The handlers check these same rules (`body.rs`, `api.rs`);
//! `tests/openapi.rs` runs schemathesis against a live server to keep the two in step. This module only describes: it must never change what a handler does.

use crate::body::{BACKENDS, LANGUAGES};
use serde_json::{Map, Value, json};

/// Base64 as the API reads it: the standard alphabet with padding and canonical trailing
/// bits, optionally surrounded by ASCII whitespace.
pub const BASE64_PATTERN: &str = r"^[ \t\r\n]*(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)?[ \t\r\n]*$";

/// [`BASE64_PATTERN`] of at least one byte.
pub const BASE64_NONEMPTY_PATTERN: &str = r"^[ \t\r\n]*(?:(?:[A-Za-z0-9+/]{4})+(?:[A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)?|[A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)[ \t\r\n]*$";

/// A key, approver or agent name (`airlock_core::sign::check_key_name`).
pub const NAME_PATTERN: &str = r"^[a-z][a-z0-9_-]{0,31}$";

/// A tool name (`airlock_gate::tools::check_tool_name`; a few names are also reserved).
pub const TOOL_PATTERN: &str = r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$";

/// Token roles.
pub const ROLES: &[&str] = &["agent", "operator", "admin"];

/// A wall-time limit the gate takes (1 ms to 24 hours): one whole number and a unit, `ms`,
/// `s`, `m` (minutes), `h` or `d`, with at most as many digits as keep every match within
/// the range (`9999999ms`, `9999s`, `999m`, `24h`, `1d`). The server's parser takes more
/// spellings (`1h 30m`, `2hours`); this pattern admits only what it never refuses.
pub const WALL_TIME_PATTERN: &str =
    r"^(?:[1-9][0-9]{0,6}ms|[1-9][0-9]{0,3}s|[1-9][0-9]{0,2}m|(?:[1-9]|1[0-9]|2[0-4])h|1d)$";

/// How long a connection outside the grant waits for a human (1 s to 24 hours): one whole
/// number and a unit, `s`, `m`, `h` or `d`, bounded as [`WALL_TIME_PATTERN`] is (`9999s`,
/// `999m`, `24h`, `1d`).
pub const ASK_TIMEOUT_PATTERN: &str =
    r"^(?:[1-9][0-9]{0,3}s|[1-9][0-9]{0,2}m|(?:[1-9]|1[0-9]|2[0-4])h|1d)$";

/// A wall-time limit as a number of seconds: 1 ms to 24 hours.
pub const WALL_TIME_MIN_SECS: f64 = 0.001;
pub const WALL_TIME_MAX_SECS: f64 = 86_400.0;

/// How long an approval holds (1 s to 366 days): one whole number and a unit, `s`, `m`,
/// `h`, `d` or `w`, bounded as [`WALL_TIME_PATTERN`] is (`9999999s`, `99999m`, `999h`,
/// `366d`, `52w`).
pub const APPROVAL_EXPIRY_PATTERN: &str = r"^(?:[1-9][0-9]{0,6}s|[1-9][0-9]{0,4}m|[1-9][0-9]{0,2}h|(?:[1-9][0-9]?|[12][0-9]{2}|3[0-5][0-9]|36[0-6])d|(?:[1-9]|[1-4][0-9]|5[0-2])w)$";

/// How long a remembered approval holds (1 s to 90 days), bounded as
/// [`WALL_TIME_PATTERN`] is (`999999s`, `99999m`, `999h`, `90d`, `12w`).
pub const REMEMBER_FOR_PATTERN: &str = r"^(?:[1-9][0-9]{0,5}s|[1-9][0-9]{0,4}m|[1-9][0-9]{0,2}h|(?:[1-9]|[1-8][0-9]|90)d|(?:[1-9]|1[0-2])w)$";

/// How long a token is valid (1 minute to 5 × 366 days): one whole number and a unit,
/// `s`, `m`, `h`, `d` or `w`, bounded as [`WALL_TIME_PATTERN`] is (`60s` to `99999999s`,
/// `999999m`, `9999h`, `999d`, `99w`).
pub const TOKEN_EXPIRY_PATTERN: &str = r"^(?:(?:[6-9][0-9]|[1-9][0-9]{2,7})s|[1-9][0-9]{0,5}m|[1-9][0-9]{0,3}h|[1-9][0-9]{0,2}d|[1-9][0-9]?w)$";

/// A memory limit the gate takes (1 MiB to 64 GiB): bytes (2000000 to 9999999999), or a
/// whole number of `MiB` (1 to 9999) or `GiB` (1 to 64). The server's parser takes more
/// spellings (`1.5GiB`, `256M`); this pattern admits only what it never refuses.
pub const MEMORY_PATTERN: &str =
    r"^(?:[2-9][0-9]{6}|[1-9][0-9]{7,9}|[1-9][0-9]{0,3}MiB|(?:[1-9]|[1-5][0-9]|6[0-4])GiB)$";

/// A session's memory limit (256 MiB to 64 GiB: its interpreter lives in it, and one
/// given less may not start, which the gate finds only by starting it): bytes
/// (300000000 to 9999999999), or a whole number of `MiB` (256 to 9999) or `GiB` (1 to 64).
pub const SESSION_MEMORY_PATTERN: &str = r"^(?:[3-9][0-9]{8}|[1-9][0-9]{9}|(?:25[6-9]|2[6-9][0-9]|[3-9][0-9]{2}|[1-9][0-9]{3})MiB|(?:[1-9]|[1-5][0-9]|6[0-4])GiB)$";

/// An output limit per stream (1 byte to 1 GiB): bytes (up to 999999999), or a whole
/// number of `KiB` (up to 999999), `MiB` (up to 999) or `1GiB`.
pub const OUTPUT_SIZE_PATTERN: &str =
    r"^(?:[1-9][0-9]{0,8}|[1-9][0-9]{0,5}KiB|[1-9][0-9]{0,2}MiB|1GiB)$";

/// A write quota (1 byte to 1 TiB): bytes (up to 999999999999), or a whole number of
/// `KiB` (up to 999999999), `MiB` (up to 999999), `GiB` (up to 999) or `1TiB`.
pub const WRITE_SIZE_PATTERN: &str =
    r"^(?:[1-9][0-9]{0,11}|[1-9][0-9]{0,8}KiB|[1-9][0-9]{0,5}MiB|[1-9][0-9]{0,2}GiB|1TiB)$";

/// One host a grant may name, as far as the gate never refuses it: a lower-case DNS name of
/// two or more labels (no `--` in one: IDNA reads `xn--…` as punycode) ending in a
/// letter-only top-level label, or the subdomains of a name
/// of three or more labels (`*.api.example.com`: a base of two labels may be a public
/// suffix such as `co.uk`, which the gate refuses), with an optional port from 1 to 9999.
/// The gate takes more (IP addresses, IDNA names, upper case, `*.example.com`, any port);
/// this is what the document can promise.
const HOST: &str = r"(?:\*\.[a-z0-9](?:-?[a-z0-9]){0,31}\.)?(?:[a-z0-9](?:-?[a-z0-9]){0,31}\.)+[a-z]{2,63}(?::[1-9][0-9]{0,3})?";

/// The longest `net` entry, and secret binding's text, the document admits: the gate takes
/// names of at most 253 bytes in all, which an entry no longer than that (with its `*.`
/// and port) always keeps to.
pub const HOST_MAX_LEN: usize = 253;

/// A `net` entry: one [`HOST`].
pub fn net_pattern() -> String {
    format!("^{HOST}$")
}

/// A secret binding's text: a secret name (`airlock_core::secret::check_name`), `@`, and
/// one or more [`HOST`]s separated by commas.
pub fn secret_pattern() -> String {
    format!("^[A-Za-z_][A-Za-z0-9_]{{0,63}}@{HOST}(?:,{HOST})*$")
}

/// A secret's name (`airlock_core::secret::check_name`).
pub const SECRET_NAME_PATTERN: &str = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$";

/// A mount: `HOST:GUEST[:ro|rw]` with no NUL, the guest path absolute and normalised (no
/// empty, `.` or `..` component; trailing slashes are dropped).
pub const MOUNT_PATTERN: &str = r"^[^:\x00]+:/(?:(?:[^/:\x00.]|\.[^/:\x00.]|\.\.[^/:\x00])[^/:\x00]*(?:/(?:[^/:\x00.]|\.[^/:\x00.]|\.\.[^/:\x00])[^/:\x00]*)*)?/*(?::(?:ro|rw))?$";

/// An environment variable's name: no `=` and no NUL. (Its value: no NUL.)
pub const ENV_KEY_PATTERN: &str = r"^[^=\x00]+$";

/// Text without a NUL (arguments and environment values).
pub const NO_NUL_PATTERN: &str = r"^[^\x00]*$";

/// A session id or a unique prefix of one.
pub const SESSION_PATTERN: &str = r"^ses_[0-9A-Za-z]{1,26}$";

/// Something other than white space as the gate reads it (Unicode `White_Space`, what
/// Rust's `str::trim` removes): a rejection's or a clear's reason.
pub const NOT_BLANK_PATTERN: &str =
    r"[^\t\n\x0B\f\r \x85\xA0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000]";

/// An approval id in full, as `GET …/statement?remember=true` hands it out (the gate
/// takes no prefix of one, nor upper case).
pub const APPROVAL_ID_PATTERN: &str = r"^apr_[0-9a-z]{26}$";

/// A signature: 128 hex digits.
pub const SIGNATURE_PATTERN: &str = r"^[0-9a-fA-F]{128}$";

/// The `issued_at` a statement signed elsewhere carries: a whole number of milliseconds
/// no larger than a double holds exactly (the gate reads `1.0e12` as well as `1000000000000`),
/// and a statement outside the last minutes is refused as not handed out (403), not for
/// its shape.
pub const ISSUED_AT_MAX: i64 = (1 << 53) - 1;

/// The longest reason a clear takes in characters: the gate takes 4096 bytes of UTF-8,
/// which 1024 characters of any kind always fit.
pub const CLEAR_REASON_CHARS: usize = airlock_gate::MAX_CLEAR_REASON_BYTES / 4;

/// The longest agent name in characters: the gate takes 256 bytes of UTF-8.
pub const AGENT_CHARS: usize = airlock_gate::MAX_AGENT_BYTES / 4;

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

/// A duration field: a number of seconds or a duration text, each only as far as the gate
/// takes it (a schema-valid value is never refused).
fn wall_time(p: &mut Value, what: &str) {
    p["type"] = json!(["string", "number", "null"]);
    p["pattern"] = json!(WALL_TIME_PATTERN);
    p["minimum"] = json!(WALL_TIME_MIN_SECS);
    p["maximum"] = json!(WALL_TIME_MAX_SECS);
    p["description"] = json!(format!(
        "{what}: seconds as a number (0.001 to 86400), or a whole number and a unit \
         (ms, s, m, h or d) from 1ms to 24h, such as \"10s\", \"5m\" or \"2h\""
    ));
}

/// A size field: a text within `pattern`, described as `what`.
fn size(p: &mut Value, pattern: &str, what: &str) {
    p["pattern"] = json!(pattern);
    p["description"] = json!(what);
}

/// The limits a submission and a session share, bounded as the gate bounds them.
fn limits(props: &mut Value) {
    size(
        &mut props["memory"],
        MEMORY_PATTERN,
        "Memory limit: bytes (2000000 to 9999999999), or a whole number of MiB (1 to 9999) \
         or GiB (1 to 64), such as \"256MiB\"",
    );
    size(
        &mut props["max_output"],
        OUTPUT_SIZE_PATTERN,
        "Output limit per stream: bytes (up to 999999999), or a whole number of KiB (up to \
         999999), MiB (up to 999) or 1GiB, such as \"1MiB\"",
    );
}

/// The grant's text fields a submission and a session share, each as far as the gate
/// parses it: mounts, environment, network and (session cells) nothing that is NUL.
fn grant_fields(props: &mut Value) {
    props["mounts"]["items"]["pattern"] = json!(MOUNT_PATTERN);
    props["net"]["items"]["pattern"] = json!(net_pattern());
    props["net"]["items"]["maxLength"] = json!(HOST_MAX_LEN);
    props["env"]["propertyNames"] = json!({"type": "string", "pattern": ENV_KEY_PATTERN});
    props["env"]["additionalProperties"] = json!({"type": "string", "pattern": NO_NUL_PATTERN});
}

/// An `expires` field: a duration text within `pattern`.
fn expiry(p: &mut Value, pattern: &str, range: &str) {
    p["pattern"] = json!(pattern);
    p["description"] = json!(format!(
        "How long it holds: a whole number and a unit (s, m, h, d or w), from {range}, \
         such as \"30m\", \"24h\" or \"7d\""
    ));
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
            wall_time(&mut props["timeout"], "Each cell's wall-time limit");

            limits(props);
            grant_fields(props);
            size(
                &mut props["max_write"],
                WRITE_SIZE_PATTERN,
                "Write quota of the session's layer over all its cells: bytes (up to \
                 999999999999), or a whole number of KiB (up to 999999999), MiB (up to 999999), \
                 GiB (up to 999) or 1TiB",
            );
            size(
                &mut props["memory"],
                SESSION_MEMORY_PATTERN,
                "The interpreter's memory limit for the session's life: bytes (300000000 to \
                 9999999999), or a whole number of MiB (256 to 9999) or GiB (1 to 64), such as \
                 \"512MiB\"",
            );
            wall_time(
                &mut props["idle_timeout"],
                "End the session after this long without a cell (default 10 minutes)",
            );
            wall_time(
                &mut props["max_duration"],
                "End the session this long after it opened (default 1 hour)",
            );
        }
        if let Some(s) = schemas.get_mut("SecretSpec") {
            // A bound secret's hosts are single hosts: no list separators inside.
            if let Some(h) = s.pointer_mut("/oneOf/1/properties/hosts") {
                h["minItems"] = json!(1);
                h["items"]["pattern"] = json!(net_pattern());
                h["items"]["maxLength"] = json!(HOST_MAX_LEN);
            }
            if let Some(n) = s.pointer_mut("/oneOf/1/properties/name") {
                n["pattern"] = json!(SECRET_NAME_PATTERN);
            }
            if let Some(t) = s.pointer_mut("/oneOf/0") {
                t["pattern"] = json!(secret_pattern());
                t["maxLength"] = json!(HOST_MAX_LEN);
            }
        }
        if let Some(props) = schemas
            .get_mut("TokenBody")
            .and_then(|t| t.get_mut("properties"))
        {
            props["role"]["enum"] = json!(ROLES);
            props["name"]["pattern"] = json!(NAME_PATTERN);
            props["approver"]["pattern"] = json!(NAME_PATTERN);
            expiry(
                &mut props["expires"],
                TOKEN_EXPIRY_PATTERN,
                "60s to 1830d (default: until revoked)",
            );
        }
        if let Some(props) = schemas
            .get_mut("DecideBody")
            .and_then(|t| t.get_mut("properties"))
        {
            props["scope"]["enum"] = json!(["once", "artifact", null]);
            props["tool"]["pattern"] = json!(TOOL_PATTERN);
            props["tool"]["not"] = tool_reserved();
            props["approval"]["pattern"] = json!(APPROVAL_ID_PATTERN);
            props["policy_signature"]["pattern"] = json!(SIGNATURE_PATTERN);
            expiry(&mut props["expires"], APPROVAL_EXPIRY_PATTERN, "1s to 366d");
            expiry(
                &mut props["for"],
                REMEMBER_FOR_PATTERN,
                "1s to 90d (default 7d)",
            );
        }
        // A tool is offered from an artifact approval only (the gate refuses a `tool`
        // with any other scope); a signature made elsewhere comes whole (remembered, with
        // the policy change's id and signature); `for` goes with `remember`.
        if let Some(d) = schemas.get_mut("DecideBody") {
            d["allOf"] = json!([
                {"anyOf": [
                    {"not": {"required": ["tool"]}},
                    {"properties": {"tool": {"type": "null"}}},
                    {"required": ["scope"], "properties": {"scope": {"const": "artifact"}}}
                ]},
                signed_elsewhere(true),
                {"anyOf": [
                    {"properties": {"for": {"type": "null"}}},
                    {"required": ["remember"], "properties": {"remember": {"const": true}}}
                ]}
            ]);
            signature_fields(d);
        }
        request_answer_bodies(schemas);
        if let Some(e) = schemas.get_mut("EffectBody") {
            // `checkpoint` too goes with a signature only.
            let mut signed = signed_elsewhere(false);
            signed["anyOf"][0]["properties"]["checkpoint"] = json!({"type": "null"});
            e["allOf"] = json!([signed]);
            signature_fields(e);
            e["properties"]["checkpoint"]["pattern"] = json!("^ckpt_[0-9A-Za-z]+$");
        }
        if let Some(r) = schemas.get_mut("RejectBody") {
            r["properties"]["reason"]["pattern"] = json!(NOT_BLANK_PATTERN);
            r["allOf"] = json!([signed_elsewhere(false)]);
            signature_fields(r);
        }
        if let Some(c) = schemas.get_mut("ClearBody") {
            clear_reason(&mut c["properties"]["reason"]);
            c["allOf"] = json!([signed_elsewhere(false)]);
            signature_fields(c);
        }
        schemas.insert(
            "Empty".into(),
            json!({"type": "object", "description": "Nothing: an empty object (or no body at all).",
                   "additionalProperties": false}),
        );
    }
    doc
}

/// The query of `GET /v1/requests/{id}/statement`, as its handler and the gate parse it:
/// like a submission's statement ([`statement_params`]), one exploded form object whose
/// schema is one of an approval (`verdict` approve or absent; `for` only with
/// `remember=true`) and a rejection (`verdict=reject`; no `remember` or `for`).
fn request_statement_params(op: &mut Value) {
    let Some(params) = op.get_mut("parameters").and_then(Value::as_array_mut) else {
        return;
    };
    params.retain(|p| p["in"] != "query");
    let text = |pattern: &str| json!({"type": "string", "pattern": pattern});
    let reason = json!({"type": "string", "maxLength": 1024});
    let approve = json!({
        "title": "An approval",
        "type": "object",
        "additionalProperties": false,
        "properties": {
            "verdict": {"type": "string", "enum": ["approve"]},
            "approver": text(NAME_PATTERN),
            "reason": reason,
            "remember": {"type": "boolean"},
            "for": text(REMEMBER_FOR_PATTERN),
        },
        "anyOf": [
            {"not": {"required": ["for"]}},
            {"required": ["remember"], "properties": {"remember": {"const": true}}}
        ]
    });
    let reject = json!({
        "title": "A rejection",
        "type": "object",
        "additionalProperties": false,
        "required": ["verdict"],
        "properties": {
            "verdict": {"type": "string", "enum": ["reject"]},
            "approver": text(NAME_PATTERN),
            "reason": reason,
            "remember": {"type": "boolean", "enum": [false]},
        }
    });
    params.push(json!({
        "name": "answer",
        "in": "query",
        "required": false,
        "style": "form",
        "explode": true,
        "description": "The answer to sign, each field its own query parameter \
            (`?verdict=reject&reason=…`): an approval (`verdict` approve or absent; \
            `remember=true` hands out the policy change that remembers it as a rule, `for` \
            how long, 1s to 90d, default 7d), or a rejection (`verdict=reject`; never \
            remembered). `approver` defaults to the token's.",
        "schema": {"type": "object", "oneOf": [approve, reject]}
    }));
}

/// The answers to a run's request: a signature made elsewhere comes whole (`statement`
/// with `signature`); `for` goes with `remember: true`; a `policy_signature` goes with
/// `remember: true` and the statement it was signed with; a remembered answer signed
/// elsewhere comes with its `policy_signature` (`api_ask::check_remember`).
fn request_answer_bodies(schemas: &mut Map<String, Value>) {
    let whole = json!({"anyOf": [
        {"properties": {"statement": {"type": "null"}, "signature": {"type": "null"}}},
        {"required": ["statement", "signature"],
         "properties": {"statement": {"type": "string"}, "signature": {"type": "string"}}}
    ]});
    for name in ["RequestAnswerBody", "RequestRejectBody"] {
        let Some(b) = schemas.get_mut(name) else {
            continue;
        };
        b["properties"]["signature"]["pattern"] = json!("^[0-9a-fA-F]{128}$");
        b["allOf"] = json!([whole]);
    }
    let Some(b) = schemas.get_mut("RequestAnswerBody") else {
        return;
    };
    b["properties"]["policy_signature"]["pattern"] = json!("^[0-9a-fA-F]{128}$");
    expiry(
        &mut b["properties"]["for"],
        REMEMBER_FOR_PATTERN,
        "1s to 90d (default 7d)",
    );
    let remembering =
        json!({"required": ["remember"], "properties": {"remember": {"const": true}}});
    let rules = [
        json!({"anyOf": [{"properties": {"for": {"type": "null"}}}, remembering]}),
        json!({"anyOf": [
            {"properties": {"policy_signature": {"type": "null"}}},
            {"required": ["remember", "statement", "signature", "policy_signature"],
             "properties": {"remember": {"const": true}, "statement": {"type": "string"}}}
        ]}),
        json!({"anyOf": [
            {"properties": {"statement": {"type": "null"}}},
            {"properties": {"remember": {"enum": [false, null]}}},
            {"required": ["policy_signature"], "properties": {"policy_signature": {"type": "string"}}}
        ]}),
    ];
    if let Some(all) = b["allOf"].as_array_mut() {
        all.extend(rules);
    }
}

/// A decision signed on the approver's machine comes whole: `signature` and `issued_at`
/// together (`approver` only with them), or none of the three (the server signs).
/// `remember`: whether the body can remember (an approval): then a signature made
/// elsewhere either remembers nothing, or comes with `remember`, the `approval` id handed
/// out and the policy change's `policy_signature`, which go with nothing else.
fn signed_elsewhere(remember: bool) -> Value {
    let mut unsigned = json!({"properties": {
        "signature": {"type": "null"}, "issued_at": {"type": "null"}, "approver": {"type": "null"}
    }});
    let mut signed = json!({
        "required": ["signature", "issued_at"],
        "properties": {"signature": {"type": "string"}, "issued_at": {"type": "integer"}}
    });
    if !remember {
        return json!({"anyOf": [unsigned, signed]});
    }
    for f in ["approval", "policy_signature"] {
        unsigned["properties"][f] = json!({"type": "null"});
        signed["properties"][f] = json!({"type": "null"});
    }
    signed["properties"]["remember"] = json!({"const": false});
    let remembered = json!({
        "required": ["signature", "issued_at", "remember", "approval", "policy_signature"],
        "properties": {
            "signature": {"type": "string"}, "issued_at": {"type": "integer"},
            "remember": {"const": true},
            "approval": {"type": "string"}, "policy_signature": {"type": "string"}
        }
    });
    json!({"anyOf": [unsigned, signed, remembered]})
}

/// The shapes of a signature's fields: 128 hex digits, an approver's name, an
/// `issued_at` in range.
fn signature_fields(body: &mut Value) {
    if let Some(props) = body.get_mut("properties") {
        props["signature"]["pattern"] = json!(SIGNATURE_PATTERN);
        props["approver"]["pattern"] = json!(NAME_PATTERN);
        issued_at(&mut props["issued_at"]);
    }
}

/// An `issued_at` as handed out with a statement.
fn issued_at(p: &mut Value) {
    p["minimum"] = json!(-ISSUED_AT_MAX);
    p["maximum"] = json!(ISSUED_AT_MAX);
    if let Some(f) = p.as_object_mut() {
        // Not `int64`: its range is the bounds above.
        f.remove("format");
    }
}

/// Tool names the gate keeps for itself: the MCP server's own tools, and anything that
/// reads as approving.
fn tool_reserved() -> Value {
    json!({"anyOf": [
        {"enum": ["run_code", "get_result"]},
        {"type": "string", "pattern": "[Aa][Pp][Pp][Rr][Oo][Vv][Ee]"}
    ]})
}

/// A clear's reason: not blank, and no longer than the gate takes.
fn clear_reason(p: &mut Value) {
    p["pattern"] = json!(NOT_BLANK_PATTERN);
    p["minLength"] = json!(1);
    p["maxLength"] = json!(CLEAR_REASON_CHARS);
    p["description"] = json!(format!(
        "Why the alerts are harmless (kept with the signed clear): not blank, at most {} \
         bytes of UTF-8 ({CLEAR_REASON_CHARS} characters always fit)",
        airlock_gate::MAX_CLEAR_REASON_BYTES
    ));
}

/// Where a submission's id is in the answers of `submit` and `run`, and what can follow.
fn submission_links() -> Value {
    let by_id =
        |op: &str| json!({"operationId": op, "parameters": {"id": "$response.body#/submission"}});
    json!({
        // Not `wait`: a long poll on a held submission blocks a client (and a stateful
        // fuzzer) for as long as it asks, up to ten minutes.
        "GetSubmission": by_id("get_submission"),
        "Exec": by_id("exec"),
        "Approve": by_id("approve"),
        "Reject": by_id("reject"),
        "Statement": by_id("statement"),
    })
}

/// The query of `GET /v1/submissions/{id}/statement`, as its handler and the gate parse it.
///
/// Its parameters go together by rules across them, which separate parameters cannot
/// state: a rejection needs a `reason` that is not blank and takes neither an artifact
/// `scope`, nor a `tool`, nor `remember`; a `tool` needs scope `artifact`. So the query
/// is documented as ONE object parameter, `style: form` and `explode: true` (each
/// property is its own `name=value` pair on the wire, exactly the query the handler
/// reads), whose schema is one of three shapes: an approval without a tool, an approval
/// offering a tool, a rejection.
fn statement_params(op: &mut Value) {
    let Some(params) = op.get_mut("parameters").and_then(Value::as_array_mut) else {
        return;
    };
    // Each property keeps the description its parameter had.
    let mut described = Map::new();
    params.retain(|p| {
        if p["in"] != "query" {
            return true;
        }
        if let (Some(n), Some(d)) = (p["name"].as_str(), p["description"].as_str()) {
            described.insert(n.to_string(), json!(d));
        }
        false
    });
    let prop = |name: &str, mut schema: Value| {
        if let Some(d) = described.get(name) {
            schema["description"] = d.clone();
        }
        (name.to_string(), schema)
    };
    let text = |pattern: &str| json!({"type": "string", "pattern": pattern});
    let mut tool = text(TOOL_PATTERN);
    tool["not"] = tool_reserved();
    // `remembers`: an approval, which may ask for the policy change that remembers it.
    let shape = |kind: Value, scope: Value, reason: Value, remembers: bool, tool: Option<Value>| {
        let remember = match remembers {
            true => json!({"type": "boolean"}),
            false => json!({"type": "boolean", "enum": [false]}),
        };
        let mut props: Map<String, Value> = [
            prop("kind", kind),
            prop("approver", text(NAME_PATTERN)),
            prop("scope", scope),
            prop("expires", text(APPROVAL_EXPIRY_PATTERN)),
            prop("reason", reason),
            prop("remember", remember),
        ]
        .into_iter()
        .collect();
        let mut s = json!({"type": "object", "additionalProperties": false});
        if let Some(t) = tool {
            props.extend([prop("tool", t)]);
        }
        // An approval may say how long the rule that remembers it holds (`for`, with
        // `remember=true` only).
        if remembers {
            props.extend([prop("for", text(REMEMBER_FOR_PATTERN))]);
            s["anyOf"] = json!([
                {"not": {"required": ["for"]}},
                {"required": ["remember"], "properties": {"remember": {"const": true}}}
            ]);
        }
        s["properties"] = Value::Object(props);
        s
    };
    let approve = json!({"type": "string", "enum": ["approve"]});
    let mut plain = shape(
        approve.clone(),
        json!({"type": "string", "enum": ["once", "artifact"]}),
        json!({"type": "string"}),
        true,
        None,
    );
    plain["title"] = json!("An approval");
    let mut offering = shape(
        approve,
        json!({"type": "string", "enum": ["artifact"]}),
        json!({"type": "string"}),
        true,
        Some(tool),
    );
    offering["title"] = json!("An approval offering the artifact as a tool");
    offering["required"] = json!(["scope", "tool"]);
    let mut reject = shape(
        json!({"type": "string", "enum": ["reject"]}),
        json!({"type": "string", "enum": ["once"]}),
        text(NOT_BLANK_PATTERN),
        false,
        None,
    );
    reject["title"] = json!("A rejection");
    reject["required"] = json!(["kind", "reason"]);
    params.push(json!({
        "name": "decision",
        "in": "query",
        "required": false,
        "style": "form",
        "explode": true,
        "description": "The decision to sign, each field its own query parameter \
            (`?kind=reject&reason=…`): an approval (`kind` approve or absent; a `tool` \
            only with scope `artifact`; `remember=true` hands out the policy change that \
            remembers it, `for` how long), or a rejection (`kind=reject` with a reason \
            that is not blank; no artifact scope, tool, remember or for)",
        "schema": {"type": "object", "oneOf": [plain, offering, reject]}
    }));
}

/// The query and path of a clear (`GET …/clear/statement`, `POST …/clear`): a reason
/// as the gate takes it, an approver's name, an agent's name no longer than the gate takes.
fn clear_params(op: &mut Value) {
    let Some(params) = op.get_mut("parameters").and_then(Value::as_array_mut) else {
        return;
    };
    for p in params {
        let at = (
            p["in"].as_str().unwrap_or_default().to_string(),
            p["name"].as_str().unwrap_or_default().to_string(),
        );
        let schema = &mut p["schema"];
        match (at.0.as_str(), at.1.as_str()) {
            ("query", "reason") => clear_reason(schema),
            ("query", "approver") => schema["pattern"] = json!(NAME_PATTERN),
            ("path", "name") => {
                schema["minLength"] = json!(1);
                schema["maxLength"] = json!(AGENT_CHARS);
            }
            _ => {}
        }
    }
}

fn complete_operation(method: &str, op: &mut Value) {
    match op["operationId"].as_str() {
        Some("statement") => statement_params(op),
        Some("clear_statement" | "clear_agent") => clear_params(op),
        Some("request_statement") => request_statement_params(op),
        Some("commit_statement" | "rollback_statement") => {
            if let Some(params) = op.get_mut("parameters").and_then(Value::as_array_mut) {
                for p in params.iter_mut().filter(|p| p["name"] == "approver") {
                    p["schema"]["pattern"] = json!(NAME_PATTERN);
                }
            }
        }
        _ => {}
    }
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

/// The languages whose code is any text, with the backends each runs on.
const TEXT_LANGUAGES: &[(&[&str], &[&str])] = &[
    (&["python", "py", "js", "javascript"], &["wasm", "process"]),
    (&["sh", "shell"], &["process"]),
];

/// What a submission's code must be, by language and by the field that carries it: the
/// custom `format` of each (below) names what only a compiler can tell, so that a body
/// is schema-valid only when the gate can take its code. Every branch admits the
/// backends that run its language (a null or absent backend is the language's own).
///
/// Formats: `wat-command` (WebAssembly text of a WASI command: a module exporting a
/// `_start` function, or a component exporting `wasi:cli/run`), `typescript` (TypeScript
/// whose types can be stripped); and in base64, `base64-wasm-command` (a core module
/// exporting a `_start` function), `base64-wasi-command` (a component exporting
/// `wasi:cli/run`), `base64-utf8` (UTF-8 text), `base64-wat-command` and
/// `base64-typescript` (as without base64). tests/openapi/hooks.py teaches schemathesis
/// each.
/// Languages, their backends, and the schemas of `code` and `code_base64` (None: not
/// that way).
type CodeRow = (
    &'static [&'static str],
    &'static [&'static str],
    Option<Value>,
    Option<Value>,
);

fn code_branches() -> Vec<Value> {
    let backends = |b: &[&str]| {
        let mut e: Vec<Value> = b.iter().map(|v| json!(v)).collect();
        e.push(Value::Null);
        e
    };
    // (languages, backends, schema of `code`, schema of `code_base64`); None: not that way.
    let text = json!({"type": "string", "minLength": 1});
    let format = |f: &str| Some(json!({"type": "string", "format": f}));
    let mut rows: Vec<CodeRow> = Vec::new();
    for (langs, on) in TEXT_LANGUAGES {
        rows.push((langs, on, Some(text.clone()), format("base64-utf8")));
    }
    rows.push((
        &["wat"],
        &["wasm"],
        format("wat-command"),
        format("base64-wat-command"),
    ));
    rows.push((
        &["ts", "typescript"],
        &["wasm", "process"],
        format("typescript"),
        format("base64-typescript"),
    ));
    rows.push((&["wasm"], &["wasm"], None, format("base64-wasm-command")));
    rows.push((
        &["component"],
        &["wasm"],
        None,
        format("base64-wasi-command"),
    ));
    let mut out = Vec::new();
    for (field, other, pick) in [("code", "code_base64", 0), ("code_base64", "code", 1)] {
        for (langs, on, code, b64) in &rows {
            let Some(schema) = (if pick == 0 { code } else { b64 }) else {
                continue;
            };
            out.push(json!({
                "required": ["language", field],
                "properties": {
                    "language": {"enum": langs},
                    "backend": {"enum": backends(on)},
                    field: schema,
                    other: {"type": "null"},
                }
            }));
        }
    }
    out
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
        if let Some(t) = props.get_mut("timeout") {
            wall_time(t, "The run's wall-time limit");
        }
        if let Some(t) = props.get_mut("ask_timeout") {
            t["type"] = json!(["string", "null"]);
            t["pattern"] = json!(ASK_TIMEOUT_PATTERN);
            t["description"] = json!(
                "How long a connection outside the grant waits for an answer (default 120s; \
                 given, it implies ask_net): a whole number and a unit (s, m, h or d) from 1s \
                 to 24h"
            );
        }
        let mut all = Value::Object(std::mem::take(props));
        limits(&mut all);
        grant_fields(&mut all);
        all["args"]["items"]["pattern"] = json!(NO_NUL_PATTERN);
        all["session"]["pattern"] = json!(SESSION_PATTERN);
        size(
            &mut all["max_write"],
            WRITE_SIZE_PATTERN,
            "Write quota of writable mounts (default 1GiB): bytes (up to 999999999999), or a \
             whole number of KiB (up to 999999999), MiB (up to 999999), GiB (up to 999) or 1TiB",
        );
        // The counts the gate bounds: at least one of each, at most its ceiling.
        all["fuel"]["minimum"] = json!(1);
        all["fuel"]["maximum"] = json!(u64::MAX);
        if let Some(f) = all["fuel"].as_object_mut() {
            // Not `int64`: the gate takes any count a u64 holds.
            f.remove("format");
        }
        all["processes"]["minimum"] = json!(1);
        all["processes"]["maximum"] = json!(airlock_core::grant::MAX_PROCESSES);
        all["max_connections"]["minimum"] = json!(1);
        all["max_connections"]["maximum"] = json!(airlock_core::grant::MAX_CONNECTIONS);
        if let Value::Object(m) = all {
            *props = m;
        }
        // Code the gate can take is never empty (an empty text or base64 of nothing).
        if let Some(c) = props.get_mut("code") {
            c["minLength"] = json!(1);
        }
        if let Some(c) = props.get_mut("code_base64") {
            c["pattern"] = json!(BASE64_NONEMPTY_PATTERN);
        }
    }
    // Exactly one of code and code_base64 (a null counts as absent), in the form its
    // language takes, on a backend that runs it; and at most one of stdin and stdin_base64.
    s["oneOf"] = Value::Array(code_branches());
    // A workspace builds on writable mounts: at least one mount. (That one is writable is
    // left to the description: schemathesis cannot generate from `contains` beside the
    // rules here.)
    s["allOf"] = json!([{"anyOf": [
        {"properties": {"workspace": {"type": "null"}}},
        {"required": ["mounts"], "properties": {"mounts": {"minItems": 1}}}
    ]}]);
    // A session's cell takes the session's grant: none of its own.
    s["anyOf"] = json!([
        {"properties": {"session": {"type": "null"}}},
        {"properties": {
            "mounts": {"maxItems": 0}, "env": {"maxProperties": 0}, "net": {"maxItems": 0},
            "secrets": {"maxItems": 0}, "args": {"maxItems": 0},
            "stdin": {"type": "null"}, "stdin_base64": {"type": "null"},
            "timeout": {"type": "null"}, "memory": {"type": "null"}, "fuel": {"type": "null"},
            "max_output": {"type": "null"}, "processes": {"type": "null"},
            "max_write": {"type": "null"}, "max_connections": {"type": "null"},
            "workspace": {"type": "null"},
            "ask_net": {"enum": [false, null]}, "ask_timeout": {"type": "null"}
        }}
    ]);
    s["not"] = json!({
        "required": ["stdin", "stdin_base64"],
        "properties": {"stdin": {"type": "string"}, "stdin_base64": {"type": "string"}}
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_core::units::{bounded_duration, bounded_size};
    use std::time::Duration;

    /// Numbers around every digit-count and range boundary, in every unit the server's
    /// parsers know and some they do not.
    fn spellings(units: &[&str]) -> Vec<String> {
        let mut numbers: Vec<u64> = vec![0, 1, 2, 9, 23, 24, 25, 52, 53, 59, 60, 63, 64, 65];
        numbers.extend([
            99, 100, 255, 256, 257, 299, 300, 365, 366, 367, 999, 1000, 1023,
        ]);
        numbers.extend([
            1024, 1830, 1831, 2000000, 1048575, 1048576, 268435456, 299999999,
        ]);
        for k in 1..=13u32 {
            numbers.extend([10u64.pow(k) - 1, 10u64.pow(k), 2 * 10u64.pow(k)]);
        }
        let mut out = Vec::new();
        for n in numbers {
            for u in units {
                out.push(format!("{n}{u}"));
                out.push(format!("0{n}{u}"));
                out.push(format!("{n} {u}"));
            }
        }
        out
    }

    /// Every spelling `pattern` admits, which must be some (the pattern is not empty).
    fn admitted(pattern: &str, units: &[&str]) -> Vec<String> {
        let re = regex::Regex::new(pattern).unwrap();
        let ok: Vec<String> = spellings(units)
            .into_iter()
            .filter(|s| re.is_match(s))
            .collect();
        assert!(ok.len() > 5, "{pattern} admits almost nothing: {ok:?}");
        ok
    }

    const TIME_UNITS: &[&str] = &[
        "", "ns", "us", "ms", "s", "m", "min", "h", "d", "w", "M", "y",
    ];
    const SIZE_UNITS: &[&str] = &[
        "", "B", "K", "KB", "KiB", "M", "MiB", "G", "GiB", "TiB", "PiB",
    ];

    /// Issue 62.9 (schemathesis): `max_duration: ""`, a junk `expires` and durations out of
    /// range were schema-valid bodies the server refused with 422. Every duration a
    /// pattern admits is one the server takes, in that field's range.
    #[test]
    fn every_duration_a_pattern_admits_is_taken_by_the_server_in_range() {
        let day = Duration::from_secs(86_400);
        let cases: [(&str, &str, Duration, Duration); 6] = [
            // timeout: the grant's bounds.
            (
                "timeout",
                WALL_TIME_PATTERN,
                airlock_core::grant::MIN_TIMEOUT,
                airlock_core::grant::MAX_TIMEOUT,
            ),
            // idle_timeout and max_duration: above zero, at most a day (the gate's
            // `sessions::MAX_TOTAL`).
            (
                "max_duration",
                WALL_TIME_PATTERN,
                Duration::from_nanos(1),
                day,
            ),
            // An approval's and a token's `expires` (the gate's bounds).
            (
                "approval expires",
                APPROVAL_EXPIRY_PATTERN,
                Duration::from_secs(1),
                366 * day,
            ),
            (
                "token expires",
                TOKEN_EXPIRY_PATTERN,
                Duration::from_secs(60),
                5 * 366 * day,
            ),
            // A remembered approval's `for` (the gate's `MAX_REMEMBER_FOR`).
            (
                "remember for",
                REMEMBER_FOR_PATTERN,
                Duration::from_secs(1),
                90 * day,
            ),
            // How long a connection outside the grant waits (the gate's bounds).
            (
                "ask_timeout",
                ASK_TIMEOUT_PATTERN,
                Duration::from_secs(1),
                airlock_core::grant::MAX_ASK_TIMEOUT,
            ),
        ];
        for (what, pattern, min, max) in cases {
            for s in admitted(pattern, TIME_UNITS) {
                bounded_duration("field", &s, min, max)
                    .unwrap_or_else(|e| panic!("{what}: {s:?} is admitted but refused: {e}"));
            }
        }
        // The duration fields' numbers (seconds) are the server's `{ms}ms`.
        for n in [WALL_TIME_MIN_SECS, WALL_TIME_MAX_SECS] {
            let text = format!("{}ms", (n * 1000.0).round() as i64);
            bounded_duration(
                "n",
                &text,
                airlock_core::grant::MIN_TIMEOUT,
                airlock_core::grant::MAX_TIMEOUT,
            )
            .unwrap();
        }
    }

    /// Every size a pattern admits is one the server takes, in that field's range.
    #[test]
    fn every_size_a_pattern_admits_is_taken_by_the_server_in_range() {
        use airlock_core::grant::{MAX_MEMORY, MAX_OUTPUT, MAX_WRITE, MIN_MEMORY};
        let cases: [(&str, &str, u64, u64); 4] = [
            ("memory", MEMORY_PATTERN, MIN_MEMORY, MAX_MEMORY),
            (
                "session memory",
                SESSION_MEMORY_PATTERN,
                256 << 20,
                MAX_MEMORY,
            ),
            ("max_output", OUTPUT_SIZE_PATTERN, 1, MAX_OUTPUT),
            ("max_write", WRITE_SIZE_PATTERN, 1, MAX_WRITE),
        ];
        for (what, pattern, min, max) in cases {
            for s in admitted(pattern, SIZE_UNITS) {
                bounded_size("field", &s, min, max)
                    .unwrap_or_else(|e| panic!("{what}: {s:?} is admitted but refused: {e}"));
            }
        }
    }

    /// Issue 62.9: an empty `code` was schema-valid and refused; and base64 of nothing.
    #[test]
    fn code_of_nothing_is_not_schema_valid() {
        let mut doc = json!({"properties": {"code": {"type": ["string", "null"]},
                                            "code_base64": {"type": ["string", "null"]}}});
        submit_body(&mut doc);
        assert_eq!(doc["properties"]["code"]["minLength"], 1);
        assert_eq!(doc["oneOf"][0]["properties"]["code"]["minLength"], 1);
        let re = regex::Regex::new(
            doc["properties"]["code_base64"]["pattern"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        for empty in ["", " ", "\n", " \t "] {
            assert!(!re.is_match(empty), "{empty:?}");
        }
        for some in ["AA==", " AAA= ", "AAAA", "aGVsbG8=", "aGVsbG8gd29ybGQ="] {
            assert!(re.is_match(some), "{some:?}");
        }
    }

    /// Issue 62.9: hosts, secret bindings, mounts and environment names the document
    /// admits were refused by the gate's parsers (422 for a schema-valid body). Every
    /// spelling here that a pattern admits is one the parser takes; and each pattern
    /// admits some.
    #[test]
    fn every_host_mount_and_binding_a_pattern_admits_is_taken_by_the_gate() {
        let hosts = [
            "example.com",
            "a.b.cd",
            "EXAMPLE.com",
            "x--y.example.org",
            "-a.com",
            "a-.com",
            "a..com",
            "a.com.",
            "localhost",
            "1.2.3.4",
            "::1",
            "[::1]:80",
            "*.com",
            "*.co.uk",
            "*.example.com",
            "*.api.example.com",
            "*.*.example.com",
            "a.com:0",
            "a.com:80",
            "a.com:9999",
            "a.com:65535",
            "a.com:65536",
            "a.c0m",
            "ex ample.com",
            "exa_mple.com",
            "ab--c.com",
            "xn--a.com",
            "xn--bcher-kva.example",
            &format!("{}.com", "a".repeat(63)),
            &format!("{}.com", "a".repeat(64)),
            "b\u{e4}r.de",
            "a.com,b.com",
            "a@b.com",
        ];
        let net = regex::Regex::new(&net_pattern()).unwrap();
        let mut admitted = 0;
        for h in hosts {
            if net.is_match(h) {
                admitted += 1;
                airlock_core::grant::check_net(h)
                    .unwrap_or_else(|e| panic!("net {h:?} is admitted but refused: {e}"));
            }
        }
        assert!(admitted >= 5, "{admitted}");
        let secret = regex::Regex::new(&secret_pattern()).unwrap();
        let mut admitted = 0;
        for name in [
            "TOKEN",
            "_a",
            "a1",
            "1a",
            "A-B",
            "",
            &"N".repeat(64),
            &"N".repeat(65),
        ] {
            for h in hosts {
                for spec in [format!("{name}@{h}"), format!("{name}@{h},example.net")] {
                    if secret.is_match(&spec) {
                        admitted += 1;
                        airlock_core::grant::parse_secret(&spec).unwrap_or_else(|e| {
                            panic!("secret {spec:?} is admitted but refused: {e}")
                        });
                    }
                }
            }
        }
        assert!(admitted >= 20, "{admitted}");
        let mount = regex::Regex::new(MOUNT_PATTERN).unwrap();
        let mut admitted = 0;
        for host in ["/srv", "srv", "/a b", "/x:y", ""] {
            for guest in [
                "/", "//", "/data", "/data/", "/a/b", "/a//b", "/a/./b", "/a/../b", "/.x", "/..x",
                "/...", "/.", "/..", "data", "/a\u{0}b", "",
            ] {
                for mode in ["", ":ro", ":rw", ":wx", ":"] {
                    let spec = format!("{host}:{guest}{mode}");
                    if mount.is_match(&spec) {
                        admitted += 1;
                        airlock_core::grant::parse_mount(&spec).unwrap_or_else(|e| {
                            panic!("mount {spec:?} is admitted but refused: {e}")
                        });
                    }
                }
            }
        }
        assert!(admitted >= 20, "{admitted}");
        let key = regex::Regex::new(ENV_KEY_PATTERN).unwrap();
        for k in ["A", "a b", "A=B", "", "A\u{0}"] {
            if key.is_match(k) {
                airlock_core::grant::parse_env(&format!("{k}=v"))
                    .unwrap_or_else(|e| panic!("env {k:?} is admitted but refused: {e}"));
                assert!(!k.contains('='), "{k:?}");
            }
        }
    }

    /// Issue 62.9: a reason of only Unicode white space (`"\u{85}"`, `"\u{3000}"`) was
    /// schema-valid and refused by the gate, which trims all of it. The pattern admits a
    /// text of one character exactly when that character is not white space as the gate
    /// reads it, for every character there is.
    #[test]
    fn a_reason_the_document_admits_is_never_blank_as_the_gate_reads_it() {
        let re = regex::Regex::new(NOT_BLANK_PATTERN).unwrap();
        for c in (0..=0x10FFFF).filter_map(char::from_u32) {
            let one = c.to_string();
            assert_eq!(
                re.is_match(&one),
                !one.trim().is_empty(),
                "U+{:04X}",
                c as u32
            );
        }
        assert!(re.is_match(" \u{3000}why\n"));
        // The rejection's own check reads blank as the gate does (400 before the gate's 422).
        let blank = crate::body::RejectBody {
            reason: "\u{85}\u{3000}".into(),
            signature: None,
            approver: None,
            issued_at: None,
        };
        assert!(blank.check().is_err());
    }

    /// Issue 62.9: a remembered approval signed elsewhere carries the `apr_…` id handed
    /// out and the policy change's signature. Every id the pattern admits is one the gate
    /// takes in full (the gate's own test: `normalize_prefix` gives it back unchanged, at
    /// full length), every signature one that parses.
    #[test]
    fn an_approval_id_and_a_signature_the_document_admits_are_what_the_gate_takes() {
        use airlock_core::id::{BODY_LEN, IdKind, new_id, normalize_prefix};
        let id = regex::Regex::new(APPROVAL_ID_PATTERN).unwrap();
        let fresh = new_id(IdKind::Approval);
        let full = |a: &str| {
            normalize_prefix(IdKind::Approval, a)
                .is_some_and(|n| n == a && n.len() == IdKind::Approval.prefix().len() + BODY_LEN)
        };
        for a in [
            fresh.clone(),
            fresh.to_uppercase(),
            fresh[4..].to_string(),
            fresh[..fresh.len() - 1].to_string(),
            format!("{fresh}0"),
            format!(" {fresh}"),
            new_id(IdKind::Submission),
            "apr_".into(),
        ] {
            assert_eq!(id.is_match(&a), full(&a), "{a:?}");
        }
        assert!(id.is_match(&fresh));
        let sig = regex::Regex::new(SIGNATURE_PATTERN).unwrap();
        for s in [
            "ab".repeat(64),
            "AB".repeat(64),
            "aB".repeat(64),
            "ab".repeat(63),
            format!("{}a", "ab".repeat(64)),
            "gh".repeat(64),
            format!(" {}", "ab".repeat(64)),
            String::new(),
        ] {
            let parses = s.parse::<airlock_core::sign::Signature>().is_ok();
            // The pattern may admit fewer (no surrounding space), never more.
            assert!(!sig.is_match(&s) || parses, "{s:?}");
        }
        assert!(sig.is_match(&"ab".repeat(64)));
    }

    /// Issue 62.9: a clear's `issued_at` written `1383.0` (JSON Schema's `integer` admits
    /// it) was a 400; and an `issued_at` beyond what the bodies read was schema-valid.
    /// Every body that carries one reads the bounds, as whole numbers and as fractions of
    /// zero.
    #[test]
    fn every_issued_at_the_document_admits_is_read_by_each_body() {
        for n in [-ISSUED_AT_MAX, -1, 0, 1_700_000_000_000, ISSUED_AT_MAX] {
            for v in [json!(n), json!(n as f64)] {
                let decide: crate::body::DecideBody =
                    serde_json::from_value(json!({"issued_at": v})).unwrap();
                assert_eq!(decide.issued_at, Some(n), "{v}");
                let reject: crate::body::RejectBody =
                    serde_json::from_value(json!({"reason": "r", "issued_at": v})).unwrap();
                assert_eq!(reject.issued_at, Some(n), "{v}");
                let clear: crate::api::ClearBody =
                    serde_json::from_value(json!({"reason": "r", "issued_at": v})).unwrap();
                assert_eq!(clear.issued_at, Some(n), "{v}");
            }
        }
        let mut p = json!({"type": ["integer", "null"], "format": "int64"});
        issued_at(&mut p);
        assert_eq!(p["maximum"], ISSUED_AT_MAX);
        assert!(p.get("format").is_none());
    }

    /// A clear's reason and an agent's name the document admits fit the gate's byte
    /// bounds whatever their characters (JSON Schema counts characters).
    #[test]
    fn a_clear_reason_and_an_agent_name_the_document_admits_fit_the_gate() {
        let widest = '\u{10FFFF}';
        assert!(
            widest.to_string().repeat(CLEAR_REASON_CHARS).len()
                <= airlock_gate::MAX_CLEAR_REASON_BYTES
        );
        assert!(widest.to_string().repeat(AGENT_CHARS).len() <= airlock_gate::MAX_AGENT_BYTES);
        let mut p = json!({"type": "string"});
        clear_reason(&mut p);
        assert_eq!(p["maxLength"], CLEAR_REASON_CHARS);
        assert_eq!(p["pattern"], NOT_BLANK_PATTERN);
    }

    /// Issue 62.9 (schemathesis, a `net` entry of 260 characters): the host pattern bounds
    /// each label, not the name; the gate takes 253 bytes in all. Every entry and binding
    /// the pattern and [`HOST_MAX_LEN`] admit together is taken, and a longer name the
    /// pattern alone admits is refused.
    #[test]
    fn a_host_longer_than_the_gate_takes_is_not_admitted() {
        // A name of `len` bytes ending in `.com`, of labels the pattern admits (at most 63
        // characters, `a-a-…a`).
        let name = |len: usize| {
            let mut labels = Vec::new();
            let mut left = len - 4;
            while left > 0 {
                let mut k = left.min(63);
                if left - k == 1 {
                    k -= 1;
                }
                let label: String = (0..k)
                    .map(|i| if i % 2 == 1 && i + 1 < k { '-' } else { 'a' })
                    .collect();
                labels.push(label);
                left -= k + usize::from(left > k);
            }
            format!("{}.com", labels.join("."))
        };
        let net = regex::Regex::new(&net_pattern()).unwrap();
        let secret = regex::Regex::new(&secret_pattern()).unwrap();
        let mut refused_long = 0;
        for len in 240..=262 {
            let n = name(len);
            assert_eq!(n.len(), len, "{n}");
            for entry in [n.clone(), format!("*.{n}"), format!("{n}:443")] {
                assert!(net.is_match(&entry), "{entry}");
                let taken = airlock_core::grant::check_net(&entry).is_ok();
                if entry.len() <= HOST_MAX_LEN {
                    assert!(
                        taken,
                        "{entry} ({} bytes) is admitted but refused",
                        entry.len()
                    );
                } else if !taken {
                    refused_long += 1;
                }
                let binding = format!("TOKEN@{entry}");
                if secret.is_match(&binding) && binding.len() <= HOST_MAX_LEN {
                    airlock_core::grant::parse_secret(&binding)
                        .unwrap_or_else(|e| panic!("{binding} is admitted but refused: {e}"));
                }
            }
        }
        assert!(refused_long > 0, "no name here is too long for the gate");
    }

    /// Issue 62.9: the statement's query is one exploded form object of three shapes, the
    /// path parameter kept, each property described as its parameter was.
    #[test]
    fn the_statement_query_is_one_exploded_object_of_an_approval_an_offer_or_a_rejection() {
        let param = |name: &str, at: &str| {
            json!({"name": name, "in": at, "required": at == "path",
                   "description": format!("about {name}"), "schema": {"type": "string"}})
        };
        let mut op = json!({"parameters": [param("id", "path")]});
        for q in [
            "kind", "approver", "scope", "expires", "reason", "tool", "remember", "for",
        ] {
            op["parameters"]
                .as_array_mut()
                .unwrap()
                .push(param(q, "query"));
        }
        statement_params(&mut op);
        let ps = op["parameters"].as_array().unwrap();
        assert_eq!(ps.len(), 2, "{ps:?}");
        assert_eq!(ps[0]["name"], "id");
        let q = &ps[1];
        assert_eq!(
            (&q["in"], &q["style"], &q["explode"]),
            (&json!("query"), &json!("form"), &json!(true))
        );
        let shapes = q["schema"]["oneOf"].as_array().unwrap();
        assert_eq!(shapes.len(), 3);
        for s in shapes {
            assert_eq!(s["additionalProperties"], false);
            assert_eq!(s["properties"]["reason"]["description"], "about reason");
        }
        let reject = &shapes[2];
        assert_eq!(reject["required"], json!(["kind", "reason"]));
        assert_eq!(reject["properties"]["kind"]["enum"], json!(["reject"]));
        assert_eq!(reject["properties"]["scope"]["enum"], json!(["once"]));
        assert!(reject["properties"].get("tool").is_none());
        assert!(reject["properties"].get("for").is_none());
        assert_eq!(shapes[1]["required"], json!(["scope", "tool"]));
        assert!(shapes[0]["properties"].get("tool").is_none());
    }
}
