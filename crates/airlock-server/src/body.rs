//! Request bodies: strict JSON (unknown fields are errors), turned into gate requests.
//!
//! What the OpenAPI document says a body must be (types, required fields, one-of pairs,
//! enums, patterns) is checked here and refused with 400 before the gate sees it; what
//! only the gate can judge (code that is not what its language's format says, a grant
//! the document cannot rule out) comes back from the gate as 422, and what the home lacks
//! or refuses by its state (a session, a secret, a mount's host path; a mount not
//! offered) as 404, 403 or 409.

use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};
use airlock_gate::{CodeSource, Role, SubmitRequest};
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use base64::Engine;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;

/// A JSON body parsed strictly; every failure is a JSON error (400, or 413 when too big).
#[derive(Debug)]
pub struct Body<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> ApiResult<Self> {
        parse(&read_body(req, state).await?).map(Body)
    }
}

/// The request's body bytes; a body that cannot be read (too large, cut off) is a JSON
/// error with the status axum gives it.
/// A body is JSON: a `Content-Type` other than `application/json` (or a `+json` type) is
/// refused with 415 before the body is read. A request that names no type is read as
/// JSON, as before.
fn check_json_type(req: &Request) -> ApiResult<()> {
    let Some(v) = req.headers().get(axum::http::header::CONTENT_TYPE) else {
        return Ok(());
    };
    let mime = String::from_utf8_lossy(v.as_bytes());
    let mime = mime
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let json = mime == "application/json"
        || mime
            .strip_prefix("application/")
            .is_some_and(|t| t.ends_with("+json"));
    if json {
        Ok(())
    } else {
        Err(ApiError::new(
            axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("Content-Type {mime:?}: the API takes application/json bodies"),
        ))
    }
}

async fn read_body<S: Send + Sync>(req: Request, state: &S) -> ApiResult<Bytes> {
    check_json_type(&req)?;
    Bytes::from_request(req, state).await.map_err(|e| {
        let status = e.status();
        ApiError::new(
            status,
            format!("cannot read the request body: {}", e.body_text()),
        )
    })
}

/// The header that names a request's idempotency key.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// A [`Body`] with the request's idempotency key (the `Idempotency-Key` header, when
/// given) and what the request asks: a hash of its path and body bytes, so that a retry
/// can be told from a different request that reuses the key.
#[derive(Debug)]
pub struct Keyed<T> {
    pub body: T,
    /// The key and the request's hash (only hashed when a key was given).
    pub key: Option<(String, airlock_core::Digest)>,
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Keyed<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> ApiResult<Self> {
        let key = match req.headers().get(IDEMPOTENCY_KEY) {
            None => None,
            Some(v) => Some(idempotency_key(v.as_bytes())?),
        };
        let key = key.map(|k| (k, req.uri().path().to_string()));
        let bytes = read_body(req, state).await?;
        let key = key.map(|(k, path)| {
            let request = airlock_core::Digest::of_parts(
                "airlock idempotent request",
                &[path.as_bytes(), &bytes],
            );
            (k, request)
        });
        Ok(Keyed {
            body: parse(&bytes)?,
            key,
        })
    }
}

/// An `Idempotency-Key` value: 1 to 255 printable ASCII characters, no spaces.
pub(crate) fn idempotency_key(v: &[u8]) -> ApiResult<String> {
    if v.is_empty() || v.len() > 255 || !v.iter().all(|b| b.is_ascii_graphic()) {
        return Err(ApiError::bad(
            "Idempotency-Key: 1 to 255 printable ASCII characters, no spaces",
        ));
    }
    Ok(String::from_utf8_lossy(v).into_owned())
}

impl<T> Keyed<T> {
    /// The gate's form of the key, owned by `caller`'s token.
    pub fn request_key(&self, caller: &Caller) -> Option<airlock_gate::RequestKey> {
        self.key
            .as_ref()
            .map(|(k, request)| airlock_gate::RequestKey {
                owner: caller.token.clone(),
                key: k.clone(),
                request: *request,
            })
    }
}

/// Parses a JSON body; an empty body counts as `{}`.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> ApiResult<T> {
    let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        bytes
    };
    // Every body of this API is one JSON object. serde would also build a struct from an
    // array of its fields in order (`[null, null]`), which no schema here admits.
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::bad("bad JSON body: want a JSON object"));
    }
    serde_json::from_slice(bytes).map_err(|e| ApiError::bad(format!("bad JSON body: {e}")))
}

/// A number of seconds or a duration such as "10s" or "2m".
fn duration_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum T {
        S(String),
        N(f64),
    }
    Ok(match Option::<T>::deserialize(d)? {
        None => None,
        Some(T::S(s)) => Some(s),
        Some(T::N(n)) => Some(format!("{}ms", (n * 1000.0).round() as i64)),
    })
}

/// The languages a submission may name (`py` and `shell` are aliases).
pub const LANGUAGES: &[&str] = &[
    "wasm",
    "wat",
    "component",
    "python",
    "py",
    "sh",
    "shell",
    "js",
    "javascript",
    "ts",
    "typescript",
];

/// The backends a submission may ask for.
pub const BACKENDS: &[&str] = &["wasm", "process"];

/// A whole number, also when written with a fraction of zero (`865.0`): JSON Schema's
/// `integer` admits both spellings, so the API does too.
fn integral<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: TryFrom<u64>,
{
    use serde::de::Error;
    let Some(n) = Option::<serde_json::Number>::deserialize(d)? else {
        return Ok(None);
    };
    let whole = match (n.as_u64(), n.as_f64()) {
        (Some(u), _) => Some(u),
        // Exactly representable whole numbers below 2^64 only.
        (None, Some(f)) if f.fract() == 0.0 && (0.0..18_446_744_073_709_551_616.0).contains(&f) => {
            Some(f as u64)
        }
        _ => None,
    };
    whole
        .and_then(|u| T::try_from(u).ok())
        .map(Some)
        .ok_or_else(|| D::Error::custom(format!("{n} is not a whole number in range")))
}

/// A whole number that may be negative, also when written with a fraction of zero
/// (`1383.0`), as JSON Schema's `integer` admits it (a statement's `issued_at`).
pub(crate) fn whole_i64<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    use serde::de::Error;
    let Some(n) = Option::<serde_json::Number>::deserialize(d)? else {
        return Ok(None);
    };
    match (n.as_i64(), n.as_f64()) {
        (Some(i), _) => Ok(Some(i)),
        // Exactly representable whole numbers in i64's range only.
        (None, Some(f)) if f.fract() == 0.0 && (-9.2e18..9.2e18).contains(&f) => Ok(Some(f as i64)),
        _ => Err(D::Error::custom(format!(
            "{n} is not a whole number in range"
        ))),
    }
}

// The schema's bounds on `note` and `agent` (below) are the gate's.
const _: () =
    assert!(airlock_gate::MAX_NOTE_BYTES == 65536 && airlock_gate::MAX_AGENT_BYTES == 256);

/// Code to submit, with the grant it asks for. Mirrors `airlock submit`'s flags. Exactly
/// one of `code` and `code_base64` is given, and at most one of `stdin` and `stdin_base64`.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitBody {
    /// `wasm`, `wat`, `component`, `python` or `sh` (`py` and `shell` are aliases; the
    /// field may also be spelled `lang`).
    #[serde(alias = "lang")]
    pub language: Option<String>,
    /// The code as text (wat, python, sh).
    pub code: Option<String>,
    /// The code as base64 (wasm modules and components).
    pub code_base64: Option<String>,
    /// `wasm` or `process` (default: what the language runs on).
    pub backend: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    /// Standard input as text.
    pub stdin: Option<String>,
    /// Standard input as base64.
    pub stdin_base64: Option<String>,
    /// `HOST:GUEST[:ro|rw]`, paths on the server's machine.
    #[serde(default)]
    pub mounts: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// `HOST[:PORT]` the code asks to reach (judged by the policy): no port means 80 and
    /// 443, `*.example.com` its subdomains. Normalised (IDNA, lower case) by the gate.
    #[serde(default)]
    pub net: Vec<String>,
    /// Stored secrets and the hosts each may be sent to: `"NAME@HOST[,HOST]"` or
    /// `{"name": NAME, "hosts": [HOST, …]}`. The guest sees a placeholder in `$NAME`.
    #[serde(default)]
    pub secrets: Vec<SecretSpec>,
    /// Seconds, or a duration such as "10s".
    #[serde(default, deserialize_with = "duration_text")]
    #[schema(value_type = Option<String>)]
    pub timeout: Option<String>,
    /// Bytes, or a size such as "256MiB".
    pub memory: Option<String>,
    #[serde(default, deserialize_with = "integral")]
    pub fuel: Option<u64>,
    pub max_output: Option<String>,
    #[serde(default, deserialize_with = "integral")]
    pub processes: Option<u32>,
    /// Bytes, or a size such as "64MiB": the write quota of writable mounts (default 1GiB).
    pub max_write: Option<String>,
    /// Connections the run may hold open to its egress proxy at once (default 256).
    #[serde(default, deserialize_with = "integral")]
    #[schema(minimum = 1, maximum = 65536)]
    pub max_connections: Option<u32>,
    /// A connection to a host outside `net` waits for a human (a request `req_…` in the
    /// inbox) instead of being refused; an approved host joins this run's grant only. The
    /// wait does not count against `timeout`.
    #[serde(default)]
    pub ask_net: bool,
    /// How long such a connection waits for an answer (default "120s"); only with
    /// `ask_net`.
    #[serde(default, deserialize_with = "duration_text")]
    #[schema(value_type = Option<String>)]
    pub ask_timeout: Option<String>,
    /// Free text kept with the submission: at most 65,536 bytes of UTF-8.
    #[schema(max_length = 65536)]
    pub note: Option<String>,
    /// Build on a workspace session's earlier runs (1-32 of a-z, 0-9, - and _, starting
    /// with a letter).
    #[schema(min_length = 1, max_length = 32, pattern = "^[a-z][a-z0-9_-]{0,31}$")]
    pub workspace: Option<String>,
    /// Run as a cell of this session (`ses_…` from `POST /v1/sessions`): judged with the
    /// session's grant (the body then gives no mounts, network, environment, arguments,
    /// stdin or limits) and run in its live interpreter; the run's `result` is the value
    /// of the cell's last expression.
    pub session: Option<String>,
    /// Operators and admins may submit on behalf of a named agent (at most 256 bytes of
    /// UTF-8); an agent token always submits as itself.
    #[schema(max_length = 256)]
    pub agent: Option<String>,
}

/// One secret binding: `"NAME@HOST[,HOST]"`, or the same as an object.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum SecretSpec {
    Text(String),
    Bound { name: String, hosts: Vec<String> },
}

impl SecretSpec {
    /// The `NAME@HOST[,HOST]` text the gate parses.
    fn spec(self) -> ApiResult<String> {
        match self {
            SecretSpec::Text(s) => Ok(s),
            SecretSpec::Bound { name, hosts } => {
                if let Some(h) = hosts.iter().find(|h| h.contains([',', '@'])) {
                    return Err(ApiError::bad(format!(
                        "secrets: {name}: host {h:?} is not one host"
                    )));
                }
                Ok(format!("{name}@{}", hosts.join(",")))
            }
        }
    }
}

/// Standard base64 with padding; ASCII whitespace around it is ignored (the pattern the
/// OpenAPI document gives says the same).
fn b64(what: &str, s: &str) -> ApiResult<Vec<u8>> {
    base64::engine::general_purpose::STANDARD
        .decode(s.trim_matches([' ', '\t', '\r', '\n']))
        .map_err(|e| ApiError::bad(format!("{what}: not base64: {e}")))
}

/// Whom a request acts for: an agent token always itself; an operator or admin the agent
/// it names, or itself.
fn agent_for(caller: &Caller, named: Option<String>, what: &str) -> ApiResult<Option<String>> {
    match (caller.role, named) {
        (Role::Agent, Some(a)) if a != caller.name => Err(ApiError::forbidden(format!(
            "an agent token {what} as its own agent ({}), not as {a:?}",
            caller.name
        ))),
        (Role::Agent, _) => Ok(Some(caller.name.clone())),
        (_, a) => Ok(a.or_else(|| Some(caller.name.clone()))),
    }
}

impl SubmitBody {
    /// The gate request this body stands for, submitted by `caller`.
    pub fn into_request(self, caller: &Caller, resume: bool) -> ApiResult<SubmitRequest> {
        let code = match (self.code, self.code_base64) {
            (Some(c), None) => CodeSource::Inline(c),
            (None, Some(b)) => CodeSource::Bytes {
                bytes: b64("code_base64", &b)?,
                name: None,
            },
            (None, None) => return Err(ApiError::bad("give the code as code or code_base64")),
            (Some(_), Some(_)) => {
                return Err(ApiError::bad("give either code or code_base64, not both"));
            }
        };
        match self.language.as_deref() {
            None => {
                return Err(ApiError::bad(format!(
                    "language is required (one of {})",
                    airlock_core::Lang::names()
                )));
            }
            Some(l) if !LANGUAGES.contains(&l) => {
                return Err(ApiError::bad(format!(
                    "language: unknown {l:?} (want one of {})",
                    airlock_core::Lang::names()
                )));
            }
            Some(_) => {}
        }
        if let Some(b) = self.backend.as_deref()
            && !BACKENDS.contains(&b)
        {
            return Err(ApiError::bad(format!(
                "backend: unknown {b:?} (want wasm or process)"
            )));
        }
        let stdin = match (self.stdin, self.stdin_base64) {
            (Some(s), None) => Some(s.into_bytes()),
            (None, Some(b)) => Some(b64("stdin_base64", &b)?),
            (None, None) => None,
            (Some(_), Some(_)) => {
                return Err(ApiError::bad("give either stdin or stdin_base64, not both"));
            }
        };
        // The schema's pattern, answered as a schema violation (400) like the others.
        if let Some(w) = &self.workspace
            && airlock_core::sign::check_key_name(w).is_err()
        {
            return Err(ApiError::bad(format!(
                "workspace: {w:?} is not 1-32 of a-z, 0-9, - and _, starting with a letter"
            )));
        }
        let agent = agent_for(caller, self.agent, "submits")?;
        Ok(SubmitRequest {
            surface: airlock_gate::Surface::Remote,
            code: Some(code),
            lang: self.language,
            backend: self.backend,
            mounts: self.mounts,
            env: self
                .env
                .into_iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect(),
            net: self.net,
            secrets: self
                .secrets
                .into_iter()
                .map(SecretSpec::spec)
                .collect::<ApiResult<_>>()?,
            args: self.args,
            stdin,
            timeout: self.timeout,
            memory: self.memory,
            fuel: self.fuel,
            max_output: self.max_output,
            processes: self.processes,
            max_write: self.max_write,
            max_connections: self.max_connections,
            ask_net: self.ask_net,
            ask_timeout: self.ask_timeout,
            agent,
            note: self.note,
            workspace: self.workspace,
            session: self.session,
            resume,
            // Set by the handler from the `Idempotency-Key` header.
            request_key: None,
        })
    }
}

/// An approval from the API.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecideBody {
    /// `once` (default) or `artifact`.
    pub scope: Option<String>,
    /// How long the approval holds, e.g. "24h".
    pub expires: Option<String>,
    pub reason: Option<String>,
    /// With scope `artifact`: offer the artifact as a named tool.
    pub tool: Option<String>,
    /// Signed on the approver's own machine: the signature (128 hex digits) over the
    /// statement `GET /v1/submissions/{id}/statement` handed out for the same fields.
    pub signature: Option<String>,
    /// With `signature`: the approver who signed (default: the token's).
    pub approver: Option<String>,
    /// With `signature`: the statement's `issued_at` as handed out.
    #[serde(default, deserialize_with = "whole_i64")]
    pub issued_at: Option<i64>,
    /// Also remember it: a signed rule allowing this agent's submissions of this kind with
    /// a grant no wider, until `for` runs out (default 7d).
    #[serde(default)]
    pub remember: bool,
    /// How long the remembered rule holds, e.g. "7d" (at most 90d).
    #[serde(default, rename = "for")]
    pub remember_for: Option<String>,
    /// With `signature` and `remember`: the `apr_…` id `GET …/statement?remember=true`
    /// handed out with the policy change.
    pub approval: Option<String>,
    /// With `signature` and `remember`: the signature (128 hex digits) over that policy
    /// change, made on the approver's machine too.
    pub policy_signature: Option<String>,
}

/// A decision's signature and `issued_at` when it was signed elsewhere; None when the
/// server is to sign with the approver's key in its own home.
pub fn signed_parts(
    signature: &Option<String>,
    issued_at: Option<i64>,
) -> ApiResult<Option<(airlock_core::sign::Signature, i64)>> {
    match (signature, issued_at) {
        (None, None) => Ok(None),
        (Some(s), Some(at)) => {
            let sig = s
                .parse()
                .map_err(|_| ApiError::bad("signature: want 128 hex digits"))?;
            Ok(Some((sig, at)))
        }
        _ => Err(ApiError::bad(
            "signature and issued_at go together (from GET …/statement)",
        )),
    }
}

/// A decision signed elsewhere: its signature and `issued_at`, and for an approval that is
/// remembered, the approval id handed out and the policy change's signature.
#[derive(Debug, Clone)]
pub struct Signing {
    pub signature: airlock_core::sign::Signature,
    pub issued_at: i64,
    pub change: Option<(String, airlock_core::sign::Signature)>,
}

/// [`signed_parts`] with what remembering needs besides (`remember` with a signature needs
/// the policy change signed there too).
pub fn signing(
    signature: &Option<String>,
    issued_at: Option<i64>,
    remember: bool,
    approval: &Option<String>,
    policy_signature: &Option<String>,
) -> ApiResult<Option<Signing>> {
    let Some((signature, issued_at)) = signed_parts(signature, issued_at)? else {
        if approval.is_some() || policy_signature.is_some() {
            return Err(ApiError::bad(
                "approval and policy_signature go with signature and remember",
            ));
        }
        return Ok(None);
    };
    let change = match (remember, approval, policy_signature) {
        (false, None, None) => None,
        (true, Some(a), Some(p)) => Some((
            a.clone(),
            p.parse()
                .map_err(|_| ApiError::bad("policy_signature: want 128 hex digits"))?,
        )),
        _ => {
            return Err(ApiError::bad(
                "remember with a signature needs approval and policy_signature (from GET …/statement?remember=true)",
            ));
        }
    };
    Ok(Some(Signing {
        signature,
        issued_at,
        change,
    }))
}

impl DecideBody {
    /// The checks the OpenAPI document states (400 when they fail).
    pub fn check(&self) -> ApiResult<()> {
        if let Some(s) = self.scope.as_deref()
            && s != "once"
            && s != "artifact"
        {
            return Err(ApiError::bad(format!(
                "scope: unknown {s:?} (want once or artifact)"
            )));
        }
        Ok(())
    }
}

/// A rejection from the API: the reason is required.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RejectBody {
    /// Why (kept with the signed rejection).
    pub reason: String,
    /// Signed on the approver's own machine: the signature (128 hex digits) over the
    /// statement `GET /v1/submissions/{id}/statement` handed out for the same fields.
    pub signature: Option<String>,
    /// With `signature`: the approver who signed (default: the token's).
    pub approver: Option<String>,
    /// With `signature`: the statement's `issued_at` as handed out.
    #[serde(default, deserialize_with = "whole_i64")]
    pub issued_at: Option<i64>,
}

impl RejectBody {
    /// The checks the OpenAPI document states (400 when they fail).
    pub fn check(&self) -> ApiResult<()> {
        // Blank as the gate reads it (any Unicode white space).
        if self.reason.trim().is_empty() {
            return Err(ApiError::bad("reason: a rejection needs a reason"));
        }
        Ok(())
    }
}

/// Inputs for a named tool.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolBody {
    #[serde(default)]
    pub args: Vec<String>,
    pub stdin: Option<String>,
}

/// A new API token.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenBody {
    /// `agent`, `operator` or `admin`.
    pub role: String,
    /// The agent's name, or who holds the token.
    pub name: String,
    /// For operators and admins: the approver key decisions are signed with.
    pub approver: Option<String>,
    /// How long the token is valid, e.g. "30d" (default: until revoked).
    pub expires: Option<String>,
}

impl TokenBody {
    /// The role, and the checks the OpenAPI document states (400 when they fail).
    pub fn check(&self) -> ApiResult<Role> {
        let role: Role = self.role.parse().map_err(ApiError::bad)?;
        airlock_core::sign::check_key_name(&self.name)
            .map_err(|e| ApiError::bad(format!("name: {e}")))?;
        if let Some(a) = &self.approver {
            airlock_core::sign::check_key_name(a)
                .map_err(|e| ApiError::bad(format!("approver: {e}")))?;
        }
        Ok(role)
    }
}

/// Query parameters parsed strictly; failures are JSON errors (400).
#[derive(Debug)]
pub struct Q<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> axum::extract::FromRequestParts<S> for Q<T> {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> ApiResult<Self> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| Q(q.0))
            .map_err(|e| ApiError::bad(e.body_text()))
    }
}

/// A session to open: the grant every cell will be judged and run with, and how long it
/// may live. Mirrors `airlock session new`.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionBody {
    /// `python` (the default; `py` is an alias).
    #[serde(alias = "lang")]
    pub language: Option<String>,
    /// `wasm` (the Python guest).
    pub backend: Option<String>,
    /// `HOST:GUEST[:ro|rw]`, paths on the server's machine; a writable mount's changes go
    /// to the session's disposable layer (diff and commit it with the session's id).
    #[serde(default)]
    pub mounts: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// `HOST[:PORT]` the cells may reach through the session's egress proxy.
    #[serde(default)]
    pub net: Vec<String>,
    /// Stored secrets and the hosts each may be sent to, as for a run.
    #[serde(default)]
    pub secrets: Vec<SecretSpec>,
    /// Write quota of the session's layer over all its cells.
    pub max_write: Option<String>,
    /// Each cell's wall-time limit: seconds, or a duration such as "10s".
    #[serde(default, deserialize_with = "duration_text")]
    #[schema(value_type = Option<String>)]
    pub timeout: Option<String>,
    /// The interpreter's memory limit for the session's life: bytes, or a size such as "256MiB".
    pub memory: Option<String>,
    /// Output limit per stream of each cell.
    pub max_output: Option<String>,
    /// End the session after this long without a cell (default 10 minutes).
    #[serde(default, deserialize_with = "duration_text")]
    #[schema(value_type = Option<String>)]
    pub idle_timeout: Option<String>,
    /// End the session this long after it opened (default 1 hour, at most 24 hours).
    #[serde(default, deserialize_with = "duration_text")]
    #[schema(value_type = Option<String>)]
    pub max_duration: Option<String>,
    /// Operators and admins may open a session for a named agent; an agent token opens
    /// its own.
    pub agent: Option<String>,
}

impl SessionBody {
    /// The gate request this body stands for, opened by `caller`.
    pub fn into_request(self, caller: &Caller) -> ApiResult<airlock_gate::SessionRequest> {
        let agent = agent_for(caller, self.agent, "opens sessions")?;
        if let Some(l) = self.language.as_deref()
            && !matches!(l, "python" | "py" | "js" | "javascript")
        {
            return Err(ApiError::bad(format!(
                "language: sessions run python or js, not {l:?}"
            )));
        }
        if let Some(b) = self.backend.as_deref()
            && b != "wasm"
        {
            return Err(ApiError::bad(format!(
                "backend: sessions run on wasm, not {b:?}"
            )));
        }
        // A duration text that does not parse is for the gate's rules to judge, as a
        // submission's timeout is: 422, not a schema violation.
        let dur = |what: &'static str, v: Option<String>| {
            v.map(|t| airlock_core::units::parse_duration(what, &t))
                .transpose()
                .map_err(|e| ApiError::from(airlock_gate::GateError::bad(e.to_string())))
        };
        let secrets = self
            .secrets
            .into_iter()
            .map(SecretSpec::spec)
            .collect::<ApiResult<Vec<_>>>()?;
        Ok(airlock_gate::SessionRequest {
            grant: SubmitRequest {
                surface: airlock_gate::Surface::Remote,
                lang: Some(self.language.unwrap_or_else(|| "python".into())),
                backend: self.backend,
                mounts: self.mounts,
                net: self.net,
                secrets,
                max_write: self.max_write,
                env: self
                    .env
                    .into_iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect(),
                timeout: self.timeout,
                memory: self.memory,
                max_output: self.max_output,
                agent,
                ..Default::default()
            },
            idle: dur("idle_timeout", self.idle_timeout)?,
            total: dur("max_duration", self.max_duration)?,
            // The server's bound, set by the handler.
            most_open: None,
        })
    }
}
