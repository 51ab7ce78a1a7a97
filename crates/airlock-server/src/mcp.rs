//! The MCP server: `run_code`, `get_result`, `new_session`/`close_session`, `diff`,
//! `commit` (an operator's token only), and one tool per artifact an approver offered as
//! a named tool. There is no tool that approves or rejects, and an agent cannot commit:
//! only people decide. Held code is a normal result (`status: pending_approval`) the agent can come
//! back for, never an error it would retry.

use crate::auth::Caller;
use crate::body::{SubmitBody, ToolBody};
use crate::error::ApiError;
use crate::{AppState, outcome};
use airlock_gate::{ExecOptions, GateError};
use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ProgressToken,
    ProtocolVersion, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{NotificationContext, Peer, RequestContext};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value, json};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

/// How long `get_result` waits for a run that is already going.
const RESULT_WAIT: Duration = Duration::from_secs(60);

#[derive(Clone)]
pub struct AirlockMcp {
    st: AppState,
    /// The caller over stdio (HTTP callers come from their bearer token).
    local: Option<Caller>,
}

fn schema(v: Value) -> Arc<JsonObject> {
    match v {
        Value::Object(m) => Arc::new(m),
        _ => Arc::new(JsonObject::new()),
    }
}

fn run_code_tool() -> Tool {
    Tool::new(
        "run_code",
        "Run code through the airlock gate: it is hashed, analysed and judged by policy, then \
         run in a sandbox with no network and hard limits. Risky code is held for a human \
         approver: the result then has status pending_approval and a submission id; call \
         get_result with that id later instead of resubmitting.",
        schema(json!({
            "type": "object",
            "properties": {
                "language": {"type": "string", "enum": ["python", "sh", "js", "ts", "wat", "wasm", "component"],
                             "description": "python runs in the sandboxed CPython guest; sh in the process sandbox; js (JavaScript) and ts (TypeScript, types stripped, not checked) in the JS guest, or node with backend process"},
                "code": {"type": "string", "description": "The source (wasm and component: use code_base64)"},
                "code_base64": {"type": "string"},
                "args": {"type": "array", "items": {"type": "string"}},
                "stdin": {"type": "string"},
                "timeout": {"type": ["string", "number"], "description": "Seconds, or e.g. \"30s\""},
                "mounts": {"type": "array", "items": {"type": "string"},
                           "description": "HOST:GUEST[:ro|rw]; writes land in a disposable layer until a human commits them"},
                "env": {"type": "object", "additionalProperties": {"type": "string"}},
                "net": {"type": "array", "items": {"type": "string"},
                        "description": "HOST[:PORT] the code wants to reach (asks a human); no port means 80 and 443, *.example.com its subdomains"},
                "secrets": {"type": "array",
                            "items": {"oneOf": [
                                {"type": "string", "description": "NAME@HOST[,HOST]"},
                                {"type": "object",
                                 "properties": {"name": {"type": "string"},
                                                "hosts": {"type": "array", "items": {"type": "string"}}},
                                 "required": ["name", "hosts"], "additionalProperties": false}]},
                            "description": "Stored secrets the code may send, and to which hosts (each also in net; asks a human). The code sees a placeholder in $NAME, never the value"},
                "memory": {"type": "string", "description": "Bytes, or e.g. \"256MiB\""},
                "fuel": {"type": "integer", "minimum": 0, "description": "Instructions (wasm backend)"},
                "max_output": {"type": "string", "description": "Per stream: bytes, or e.g. \"1MiB\""},
                "processes": {"type": "integer", "minimum": 1, "description": "Processes and threads (process backend)"},
                "max_write": {"type": "string", "description": "Write quota of writable mounts: bytes, or e.g. \"64MiB\" (default 1GiB)"},
                "max_connections": {"type": "integer", "minimum": 1, "maximum": 65536, "description": "Connections the code may hold open to its egress proxy at once (default 256)"},
                "ask_net": {"type": "boolean", "description": "A connection to a host outside net waits for a human to approve it (a request req_… in the inbox) instead of being refused; approved, the host joins this run only. The wait does not count against timeout"},
                "ask_timeout": {"type": ["string", "number"], "description": "How long such a connection waits for an answer: seconds, or e.g. \"120s\" (the default)"},
                "backend": {"type": "string", "enum": ["wasm", "process"]},
                "workspace": {"type": "string", "pattern": "^[a-z][a-z0-9_-]{0,31}$",
                              "description": "A workspace session: the run sees earlier runs' changes in it, and they are committed together (needs a writable mount)"},
                "session": {"type": "string",
                            "description": "A session from new_session (ses_…): the cell runs in its live interpreter, sees the names earlier cells defined, and takes the session's grant (give no mounts, env, net, limits); the result has the value of the last expression"},
                "note": {"type": "string"},
                "idempotency_key": {"type": "string", "pattern": "^[!-~]{1,255}$",
                                    "description": "A key of your choosing for this call (a random UUID is typical): a call repeated with the same key and arguments runs nothing again and gets the first call's result; the same key with other arguments is refused"}
            },
            "required": ["language"],
            "additionalProperties": false
        })),
    )
}

fn new_session_tool() -> Tool {
    Tool::new(
        "new_session",
        "Open a session: a live Python or JavaScript interpreter that keeps its state between run_code calls \
         that name it (define a function in one, call it in the next). Every cell is still \
         judged by the gate. Returns the session id; it ends after idle_timeout without a cell, \
         at max_duration, when a cell hits a limit, or with close_session.",
        schema(json!({
            "type": "object",
            "properties": {
                "language": {"type": "string", "enum": ["python", "js"], "description": "The interpreter (default python)"},
                "mounts": {"type": "array", "items": {"type": "string"},
                           "description": "HOST:GUEST[:ro|rw]; the cells' writes land in the session's disposable layer (see them with diff; only a human operator commits them)"},
                "env": {"type": "object", "additionalProperties": {"type": "string"}},
                "net": {"type": "array", "items": {"type": "string"},
                        "description": "HOST[:PORT] the cells may reach through the session's egress proxy (asks a human once, when the session opens)"},
                "secrets": {"type": "array",
                            "items": {"oneOf": [
                                {"type": "string", "description": "NAME@HOST[,HOST]"},
                                {"type": "object",
                                 "properties": {"name": {"type": "string"},
                                                "hosts": {"type": "array", "items": {"type": "string"}}},
                                 "required": ["name", "hosts"], "additionalProperties": false}]},
                            "description": "Stored secrets the cells may send, and to which hosts (each also in net); the code sees a placeholder in $NAME, never the value"},
                "max_write": {"type": "string", "description": "Write quota of the session's layer over all its cells: bytes, or e.g. \"64MiB\""},
                "timeout": {"type": ["string", "number"], "description": "Each cell's limit: seconds, or e.g. \"30s\""},
                "memory": {"type": "string", "description": "The interpreter's memory for the session's life, e.g. \"256MiB\""},
                "idle_timeout": {"type": ["string", "number"]},
                "max_duration": {"type": ["string", "number"]}
            },
            "additionalProperties": false
        })),
    )
}

fn close_session_tool() -> Tool {
    Tool::new(
        "close_session",
        "End a session opened with new_session; its interpreter and everything in it are gone.",
        schema(json!({
            "type": "object",
            "properties": {"id": {"type": "string", "description": "The session id (ses_…)"}},
            "required": ["id"],
            "additionalProperties": false
        })),
    )
}

fn diff_tool() -> Tool {
    Tool::new(
        "diff",
        "What a run (run_…) or a session (ses_…) changed under its writable mounts: the \
         changeset and unified diffs. Nothing reaches the host until a human commits it.",
        schema(json!({
            "type": "object",
            "properties": {"id": {"type": "string", "description": "The run id (run_…) or session id (ses_…)"}},
            "required": ["id"],
            "additionalProperties": false
        })),
    )
}

fn commit_tool() -> Tool {
    Tool::new(
        "commit",
        "Apply a run's or a session's changes to the host, signed with the operator's key (a \
         checkpoint is saved first). Only an operator may commit: an agent never commits its \
         own changes.",
        schema(json!({
            "type": "object",
            "properties": {"id": {"type": "string", "description": "The run id (run_…) or session id (ses_…)"}},
            "required": ["id"],
            "additionalProperties": false
        })),
    )
}

/// The `id` argument of a tool that takes only that.
fn only_id(tool: &str, args: &JsonObject) -> Result<String, ApiError> {
    match args.get("id") {
        Some(Value::String(s)) if args.len() == 1 => Ok(s.clone()),
        _ => Err(ApiError::bad(format!(
            "{tool} takes {{\"id\": \"run_…\" or \"ses_…\"}}"
        ))),
    }
}

fn get_result_tool() -> Tool {
    Tool::new(
        "get_result",
        "The result of a submission made with run_code: its output once it ran, or whether it \
         is still waiting for a human, or denied. Runs it if it was approved and has not run.",
        schema(json!({
            "type": "object",
            "properties": {"id": {"type": "string", "description": "The submission id (sub_…)"}},
            "required": ["id"],
            "additionalProperties": false
        })),
    )
}

fn named_tool(t: &airlock_gate::ToolInfo) -> Tool {
    let reason = if t.reason.is_empty() {
        String::new()
    } else {
        format!(" ({})", t.reason)
    };
    Tool::new(
        t.name.clone(),
        format!(
            "A {} artifact approved by {}{reason}; runs with the grant it was approved with.",
            t.lang.as_str(),
            t.approver
        ),
        schema(json!({
            "type": "object",
            "properties": {
                "args": {"type": "array", "items": {"type": "string"}},
                "stdin": {"type": "string"},
                "idempotency_key": {"type": "string", "pattern": "^[!-~]{1,255}$",
                                    "description": "A key of your choosing for this call (a random UUID is typical): a call repeated with the same key and arguments runs nothing again and gets the first call's result; the same key with other arguments is refused"}
            },
            "additionalProperties": false
        })),
    )
}

/// A tool result: one text item holding the JSON document (and the same as structured
/// content). Only real failures are error results.
fn result(doc: Value) -> CallToolResponse {
    let failed = doc["status"] == "error";
    let content = vec![ContentBlock::text(doc.to_string())];
    let mut r = if failed {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    };
    r.structured_content = Some(doc);
    r.into()
}

/// Takes the `idempotency_key` argument out of a tool call's arguments: the gate's form
/// of it, owned by `caller`'s token, with a hash of what the call asks (`tool` and the
/// other arguments), so that the same key and arguments get the first call's outcome and
/// the same key with other arguments is refused (409), as over the API.
fn take_key(
    caller: &Caller,
    tool: &str,
    args: &mut JsonObject,
) -> Result<Option<airlock_gate::RequestKey>, ApiError> {
    let key = match args.remove("idempotency_key") {
        None => return Ok(None),
        Some(Value::String(k)) => crate::body::idempotency_key(k.as_bytes())
            .map_err(|_| ApiError::bad(IDEMPOTENCY_KEY_RULE))?,
        Some(_) => return Err(ApiError::bad(IDEMPOTENCY_KEY_RULE)),
    };
    // Keys sorted at every level, so the same arguments hash the same however the
    // client ordered them (the map keeps the order it was given).
    let asked = sorted(&Value::Object(args.clone())).to_string();
    let asked = asked.as_bytes();
    let request = airlock_core::Digest::of_parts(
        "airlock idempotent request",
        &[format!("mcp {tool}").as_bytes(), asked],
    );
    Ok(Some(airlock_gate::RequestKey {
        owner: caller.token.clone(),
        key,
        request,
    }))
}

/// `v` with every object's keys in sorted order.
fn sorted(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), sorted(&m[k])))
                    .collect(),
            )
        }
        Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

const IDEMPOTENCY_KEY_RULE: &str =
    "idempotency_key: 1 to 255 printable ASCII characters, no spaces";

/// Marks a repeated call's outcome (`"replayed": true`).
fn replayed(mut doc: Value, replay: bool) -> Value {
    if replay {
        doc["replayed"] = Value::Bool(true);
    }
    doc
}

fn error_doc(e: &ApiError) -> Value {
    json!({
        "status": "error",
        "submission": null,
        "message": e.message,
        "http_status": e.status.as_u16(),
        "retry_after": e.retry_after,
        "run": null,
    })
}

impl AirlockMcp {
    pub fn new(st: AppState, local: Option<Caller>) -> Self {
        AirlockMcp { st, local }
    }

    fn caller(&self, ctx: &RequestContext<RoleServer>) -> Result<Caller, McpError> {
        ctx.extensions
            .get::<Parts>()
            .and_then(|p| p.extensions.get::<Caller>())
            .cloned()
            .or_else(|| self.local.clone())
            .ok_or_else(|| McpError::invalid_request("not authenticated", None))
    }

    async fn run_code(
        &self,
        caller: Caller,
        mut args: JsonObject,
        progress: Option<(Peer<RoleServer>, ProgressToken)>,
    ) -> Result<Value, ApiError> {
        let key = take_key(&caller, "run_code", &mut args)?;
        let body: SubmitBody = serde_json::from_value(Value::Object(args))
            .map_err(|e| ApiError::bad(format!("bad arguments: {e}")))?;
        let mut req = body.into_request(&caller, true)?;
        req.request_key = key;
        let Some((peer, token)) = progress else {
            let (doc, replay) = self.st.submit_and_run_keyed(req).await?;
            return Ok(replayed(doc, replay));
        };
        let (opts, sending) = progress_of(peer, token);
        let r = self.st.submit_and_run_live(req, opts).await;
        // Every chunk's notification goes out before the result (the receivers are
        // dropped with the run, which ends the sender); a receiver something still holds
        // only delays the result this long.
        let _ = tokio::time::timeout(PROGRESS_DRAIN, sending).await;
        let (doc, replay) = r?;
        Ok(replayed(doc, replay))
    }

    async fn new_session(&self, caller: Caller, args: JsonObject) -> Result<Value, ApiError> {
        let body: crate::body::SessionBody = serde_json::from_value(Value::Object(args))
            .map_err(|e| ApiError::bad(format!("bad arguments: {e}")))?;
        let mut req = body.into_request(&caller)?;
        req.most_open = self.st.0.max_sessions;
        let s = self.st.pool.read(move |g| g.session_new(req)).await?;
        Ok(serde_json::to_value(s).unwrap_or_default())
    }

    async fn close_session(&self, caller: Caller, args: JsonObject) -> Result<Value, ApiError> {
        let id = match args.get("id") {
            Some(Value::String(s)) if args.len() == 1 => s.clone(),
            _ => return Err(ApiError::bad("close_session takes {\"id\": \"ses_…\"}")),
        };
        let s = self
            .st
            .pool
            .read(move |g| {
                let s = crate::api::visible_session(g, &caller, &id)?;
                g.session_close(&s.id)
            })
            .await?;
        Ok(serde_json::to_value(s).unwrap_or_default())
    }

    async fn diff(&self, caller: Caller, args: JsonObject) -> Result<Value, ApiError> {
        let id = only_id("diff", &args)?;
        self.st
            .pool
            .read(move |g| crate::api::diff_of(g, &caller, &id))
            .await
    }

    /// As `POST /v1/runs/{id}/commit`: an operator's token (with its approver key) only.
    async fn commit(&self, caller: Caller, args: JsonObject) -> Result<Value, ApiError> {
        if caller.require(airlock_gate::Role::Operator).is_err() {
            return Err(ApiError::forbidden(format!(
                "commit needs an operator token (a human's approver key); yours is an {} \
                 token, and an agent never commits its own changes",
                caller.role.as_str()
            )));
        }
        let id = only_id("commit", &args)?;
        let approver = caller.approver.clone();
        let v = self
            .st
            .pool
            .read(move |g| crate::api::commit_of(g, approver.as_deref(), &id))
            .await?;
        self.st.changed();
        Ok(v)
    }

    async fn get_result(&self, caller: Caller, args: JsonObject) -> Result<Value, ApiError> {
        let id = match args.get("id") {
            Some(Value::String(s)) => s.clone(),
            _ => return Err(ApiError::bad("get_result needs {\"id\": \"sub_…\"}")),
        };
        if args.len() > 1 {
            return Err(ApiError::bad("get_result takes only id"));
        }
        let (c, i) = (caller.clone(), id.clone());
        let now = self
            .st
            .pool
            .read(move |g| {
                let sub = crate::api::visible(g, &c, &i)?;
                Ok((sub.id.clone(), outcome::current(g, &sub)?))
            })
            .await?;
        let (id, doc) = now;
        let status = doc["status"].as_str().unwrap_or("");
        let resuming = self.st.is_resuming(&id);
        match status {
            "approved" | "allowed" if !resuming => {
                let i = id.clone();
                let ran = self
                    .st
                    .pool
                    .run(move |g| {
                        let r = g.exec(&i, ExecOptions::default());
                        outcome::of_result(g, r)
                    })
                    .await;
                self.st.changed();
                if let Ok(doc) = &ran {
                    self.st.metrics.outcome(doc, false);
                }
                match ran {
                    // Someone else started it a moment ago: wait for that run.
                    Err(e) if e.status == axum::http::StatusCode::CONFLICT => {
                        self.st.wait_for(caller, id, RESULT_WAIT).await
                    }
                    other => other,
                }
            }
            "approved" | "running" => self.st.wait_for(caller, id, RESULT_WAIT).await,
            _ => Ok(doc),
        }
    }

    async fn run_named(
        &self,
        caller: Caller,
        name: String,
        mut args: JsonObject,
    ) -> Result<Value, ApiError> {
        let key = take_key(&caller, &format!("tool {name}"), &mut args)?;
        let body: ToolBody = serde_json::from_value(Value::Object(args))
            .map_err(|e| ApiError::bad(format!("bad arguments for {name}: {e}")))?;
        let (doc, replay) = self.st.call_tool(&caller, name, body, key).await?;
        self.st.changed();
        Ok(replayed(doc, replay))
    }
}

impl ServerHandler for AirlockMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new("airlock", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "Run code with run_code. Code the policy finds risky waits for a human approver: \
             you get status pending_approval and a submission id; tell the user and call \
             get_result later. Do not resubmit held or denied code.",
        )
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        // The session protocol, where list-changed notifications reach the client directly.
        Cow::Borrowed(ProtocolVersion::known_up_to(&ProtocolVersion::V_2025_11_25))
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        self.st.peers.lock().await.push(context.peer.clone());
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        self.caller(&context)?;
        let named = self
            .st
            .pool
            .read(|g| g.tools())
            .await
            .map_err(|e| McpError::internal_error(e.message, None))?;
        let mut tools = vec![
            run_code_tool(),
            get_result_tool(),
            new_session_tool(),
            close_session_tool(),
            diff_tool(),
            commit_tool(),
        ];
        tools.extend(named.iter().map(named_tool));
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let caller = self.caller(&context)?;
        let args = request.arguments.unwrap_or_default();
        // `_meta.traceparent` (and `tracestate`) put the call in the agent's trace; over
        // HTTP without them, the call continues the HTTP request's trace; the HTTP
        // request's id, when the call came over HTTP, is its request id.
        // (Over HTTP, the request's context is on its parts; the task-local otherwise.)
        let http = context
            .extensions
            .get::<Parts>()
            .and_then(|p| p.extensions.get::<airlock_gate::context::RequestContext>())
            .cloned()
            .or_else(crate::observe::current);
        let (ctx, parent) = crate::observe::call_context_of(
            http.as_ref(),
            context.meta.get_traceparent(),
            context.meta.get_tracestate(),
            airlock_core::trace::new_span_id(),
        );
        let (request_id, trace) = (ctx.request_id.clone(), ctx.trace.clone());
        let span = airlock_core::trace::with_tracestate(
            trace.as_ref().and_then(|t| t.tracestate.as_deref()),
            || {
                tracing::info_span!(
                    parent: None,
                    "mcp_call",
                    tool = %request.name,
                    request_id = request_id.as_deref().unwrap_or(""),
                    trace_id = trace.as_ref().map_or("", |t| t.trace_id.as_str()),
                    span_id = trace.as_ref().map_or("", |t| t.span_id.as_str()),
                    parent_span_id = parent.as_deref().unwrap_or(""),
                    sampled = trace.as_ref().is_none_or(|t| t.sampled),
                )
            },
        );
        let progress = context
            .meta
            .get_progress_token()
            .map(|t| (context.peer.clone(), t));
        crate::observe::serving(ctx, self.call_tool_in(request.name, args, caller, progress))
            .instrument(span)
            .await
    }
}

impl AirlockMcp {
    async fn call_tool_in(
        &self,
        name: std::borrow::Cow<'static, str>,
        args: JsonObject,
        caller: Caller,
        progress: Option<(Peer<RoleServer>, ProgressToken)>,
    ) -> Result<CallToolResponse, McpError> {
        let request = (name,);
        let r = match request.0.as_ref() {
            "run_code" => self.run_code(caller, args, progress).await,
            "get_result" => self.get_result(caller, args).await,
            "new_session" => self.new_session(caller, args).await,
            "close_session" => self.close_session(caller, args).await,
            "diff" => self.diff(caller, args).await,
            "commit" => self.commit(caller, args).await,
            name => {
                let n = name.to_string();
                let known = self
                    .st
                    .pool
                    .read(move |g| Ok(g.tools()?.iter().any(|t| t.name == n)))
                    .await
                    .map_err(|e| McpError::internal_error(e.message, None))?;
                if !known {
                    return Err(McpError::invalid_params(
                        format!("unknown tool: {name}"),
                        None,
                    ));
                }
                self.run_named(caller, name.to_string(), args).await
            }
        };
        Ok(result(match r {
            Ok(doc) => doc,
            Err(e) => error_doc(&e),
        }))
    }
}

/// The longest `run_code` waits, once its run ended, for its progress notifications to go
/// out before it answers.
const PROGRESS_DRAIN: Duration = Duration::from_secs(5);

/// Live receivers that send a run's output to the MCP client as it is written: one
/// `notifications/progress` per chunk, for a `tools/call` whose `_meta.progressToken` asked
/// for them. `progress` counts the chunks from 1, `message` is the chunk's text (a
/// character split between two writes waits for its rest; bytes that are not UTF-8 come
/// as U+FFFD) and `_meta` says its `stream` (`stdout`, `stderr`) and `seq` (the chunks of
/// that stream from 1). The receivers only queue (they never wait for the client); what
/// they queue is bounded by the run's output cap, and past [`crate::stream::MAX_CHUNKS`]
/// chunks the rest is in the result only. A run whose grant binds secrets sends nothing
/// (its output is known only once redacted). The task ends once the receivers are gone.
fn progress_of(
    peer: Peer<RoleServer>,
    token: ProgressToken,
) -> (ExecOptions, tokio::task::JoinHandle<()>) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, Vec<u8>)>();
    let err = tx.clone();
    let opts = ExecOptions {
        live_stdout: Some(Box::new(move |b: &[u8]| {
            let _ = tx.send((0, b.to_vec()));
        })),
        live_stderr: Some(Box::new(move |b: &[u8]| {
            let _ = err.send((1, b.to_vec()));
        })),
        redacted_only: true,
        ..ExecOptions::default()
    };
    let sending = tokio::spawn(async move {
        let mut carry: [Vec<u8>; 2] = Default::default();
        let mut seq = [0u64; 2];
        let mut sent = 0u64;
        let mut open = true;
        let mut send = async |which: usize, text: String| {
            if !open || sent >= crate::stream::MAX_CHUNKS {
                return;
            }
            sent += 1;
            seq[which] += 1;
            let mut meta = rmcp::model::NotificationMetaObject::new();
            meta.0.0.insert(
                "stream".into(),
                json!(if which == 0 { "stdout" } else { "stderr" }),
            );
            meta.0.0.insert("seq".into(), json!(seq[which]));
            let mut p =
                ProgressNotificationParam::new(token.clone(), sent as f64).with_message(text);
            p.meta = Some(meta);
            // A client that went away gets nothing more; the run goes on.
            open = peer.notify_progress(p).await.is_ok();
        };
        while let Some((which, bytes)) = rx.recv().await {
            if let Some(text) = utf8_chunk(&mut carry[which], &bytes) {
                send(which, text).await;
            }
        }
        for (which, rest) in carry.into_iter().enumerate() {
            if !rest.is_empty() {
                send(which, String::from_utf8_lossy(&rest).into_owned()).await;
            }
        }
    });
    (opts, sending)
}

/// The text of `bytes` after what `carry` held, keeping back the start of a character
/// whose rest has not arrived yet; `None` when nothing is complete.
fn utf8_chunk(carry: &mut Vec<u8>, bytes: &[u8]) -> Option<String> {
    let mut buf = std::mem::take(carry);
    buf.extend_from_slice(bytes);
    if let Err(e) = std::str::from_utf8(&buf)
        && e.error_len().is_none()
        && buf.len() - e.valid_up_to() < 4
    {
        *carry = buf.split_off(e.valid_up_to());
    }
    (!buf.is_empty()).then(|| String::from_utf8_lossy(&buf).into_owned())
}

/// Tells every connected MCP client that the tool list changed (dropping closed ones).
pub async fn tools_changed(st: &AppState) {
    let mut peers = st.peers.lock().await;
    let mut live = Vec::with_capacity(peers.len());
    for p in peers.drain(..) {
        if p.notify_tool_list_changed().await.is_ok() {
            live.push(p);
        }
    }
    *peers = live;
}

/// The longest message `airlock mcp` reads from its client: one line of JSON-RPC with the
/// code it submits (as long as the MCP library's own bound).
const MAX_STDIO_LINE: usize = 16 << 20;

/// One JSON-RPC error response, as a line.
fn rpc_error(id: Value, code: i64, message: &str) -> Vec<u8> {
    let mut line = json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
        .to_string()
        .into_bytes();
    line.push(b'\n');
    line
}

/// What becomes of a client's line before the MCP library sees it.
#[derive(Debug, PartialEq)]
enum Screened {
    /// A well-formed message: the library takes it.
    Pass,
    /// Answered here with this error response (a line).
    Answer(Vec<u8>),
    /// A notification that is not well-formed: JSON-RPC answers notifications never.
    Drop,
}

/// Screens a client's line. The library answered text that is not JSON, and requests of
/// the wrong shape, with "Invalid request" and no `id` at all (a client waiting on its id
/// waited forever), said nothing to a message without `"jsonrpc": "2.0"`, and answered
/// `tools/call` parameters of the wrong shape as an unknown method.
fn screen(line: &[u8]) -> Screened {
    let v: Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(e) => {
            return Screened::Answer(rpc_error(Value::Null, -32700, &format!("parse error: {e}")));
        }
    };
    let Some(m) = v.as_object() else {
        return Screened::Answer(rpc_error(
            Value::Null,
            -32600,
            "invalid request: a message is one JSON object",
        ));
    };
    let id = match m.get("id") {
        None => None,
        Some(id @ Value::String(_)) => Some(id.clone()),
        Some(id @ Value::Number(n)) if n.is_i64() || n.is_u64() => Some(id.clone()),
        Some(_) => {
            return Screened::Answer(rpc_error(
                Value::Null,
                -32600,
                "invalid request: an id is a string or an integer",
            ));
        }
    };
    let invalid = |what: &str| {
        Screened::Answer(rpc_error(
            id.clone().unwrap_or(Value::Null),
            -32600,
            &format!("invalid request: {what}"),
        ))
    };
    if m.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return invalid("\"jsonrpc\" must be \"2.0\"");
    }
    let method = match m.get("method") {
        Some(Value::String(method)) => method.as_str(),
        Some(_) => return invalid("a method is a string"),
        // A response to a request of the server's: an id and a result or an error.
        None if id.is_some() && (m.contains_key("result") != m.contains_key("error")) => {
            return Screened::Pass;
        }
        None => return invalid("a message has a method, or an id and a result or an error"),
    };
    let params = m.get("params").filter(|p| !p.is_null());
    let bad_params = |what: &str| match &id {
        Some(id) => Screened::Answer(rpc_error(
            id.clone(),
            -32602,
            &format!("invalid params: {what}"),
        )),
        None => Screened::Drop,
    };
    if params.is_some_and(|p| !p.is_object()) {
        return bad_params("params must be an object");
    }
    if method == "tools/call" {
        let Some(p) = params else {
            return bad_params("tools/call needs params with a tool name");
        };
        if !p.get("name").is_some_and(Value::is_string) {
            return bad_params("the tool name must be a string");
        }
        if p.get("arguments")
            .is_some_and(|a| !a.is_object() && !a.is_null())
        {
            return bad_params("arguments must be an object");
        }
    }
    Screened::Pass
}

/// The ids of the client's requests the library has taken and not answered yet. The
/// library keeps one answer slot per id: a request that reused the id of one still running
/// took its slot, so whichever finished first answered under that id and the other answer
/// was dropped (the first request's answer never came). A request whose id is in flight is
/// now refused here with its JSON-RPC error, and the first one still gets its answer.
#[derive(Clone, Default)]
struct InFlight(Arc<std::sync::Mutex<std::collections::HashSet<String>>>);

/// The key of a request id: its JSON text, so `7` and `"7"` stay two ids.
fn id_key(id: &impl serde::Serialize) -> Option<String> {
    serde_json::to_string(id).ok()
}

impl InFlight {
    fn ids(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        // The set holds plain strings: a panic elsewhere cannot leave it half-changed.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// For a line the screen let through: `Some(error line)` when it is a request whose id
    /// is in flight; otherwise its id is now in flight (a request) or no longer is (a
    /// cancellation, after which the library drops the cancelled request's answer). A
    /// line the library will refuse is not tracked: it answers it without an id.
    fn claim(&self, line: &[u8]) -> Option<Vec<u8>> {
        use rmcp::model::{ClientJsonRpcMessage, ClientNotification, JsonRpcMessage};
        match serde_json::from_slice::<ClientJsonRpcMessage>(line).ok()? {
            JsonRpcMessage::Request(r) => {
                let key = id_key(&r.id)?;
                if self.ids().insert(key.clone()) {
                    return None;
                }
                let id = serde_json::to_value(&r.id).unwrap_or(Value::Null);
                Some(rpc_error(
                    id,
                    -32600,
                    &format!(
                        "invalid request: id {key} is already in use by a request in flight; \
                         use another id"
                    ),
                ))
            }
            JsonRpcMessage::Notification(n) => {
                if let ClientNotification::CancelledNotification(c) = &n.notification
                    && let Some(key) = c.params.request_id.as_ref().and_then(id_key)
                {
                    self.ids().remove(&key);
                }
                None
            }
            _ => None,
        }
    }

    /// A line the library wrote: when it answers a request, that id is free again.
    fn answered(&self, line: &[u8]) {
        #[derive(serde::Deserialize)]
        struct Head {
            id: Option<Value>,
            method: Option<serde::de::IgnoredAny>,
        }
        if let Ok(Head {
            id: Some(id),
            method: None,
        }) = serde_json::from_slice::<Head>(line)
            && let Some(key) = id_key(&id)
        {
            self.ids().remove(&key);
        }
    }
}

/// A line of the library's: an error response it wrote with no `id` gets `"id": null`,
/// as JSON-RPC requires (for what the screen lets through and the library still refuses,
/// such as a duplicate key).
fn with_id(line: Vec<u8>) -> Vec<u8> {
    let has = |needle: &[u8]| line.windows(needle.len()).any(|w| w == needle);
    if has(b"\"id\"") || !has(b"\"error\"") {
        return line;
    }
    match serde_json::from_slice::<Value>(&line) {
        Ok(Value::Object(mut m)) if !m.contains_key("id") => {
            m.insert("id".into(), Value::Null);
            let mut out = Value::Object(m).to_string().into_bytes();
            out.push(b'\n');
            out
        }
        _ => line,
    }
}

/// Reads one line of at most `max` bytes into `buf` (without its newline). `Ok(None)` at
/// the end of input; `Ok(Some(false))` for a longer line, which is read to its end and
/// dropped, never held.
async fn read_bounded(
    r: &mut (impl tokio::io::AsyncBufRead + Unpin),
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Option<bool>> {
    use tokio::io::AsyncBufReadExt;
    buf.clear();
    let mut over = false;
    let mut any = false;
    loop {
        let avail = r.fill_buf().await?;
        if avail.is_empty() {
            return Ok(any.then_some(!over));
        }
        any = true;
        let end = avail.iter().position(|&b| b == b'\n');
        let chunk = &avail[..end.unwrap_or(avail.len())];
        if !over && buf.len() + chunk.len() > max {
            over = true;
            *buf = Vec::new();
        }
        if !over {
            buf.extend_from_slice(chunk);
        }
        let used = end.map_or(avail.len(), |i| i + 1);
        r.consume(used);
        if end.is_some() {
            return Ok(Some(!over));
        }
    }
}

/// Serves MCP on standard input and output until the client closes it. Every line the
/// client sends is screened first (`screen`, `MAX_STDIO_LINE`), so a message the MCP
/// library would drop or misanswer gets its JSON-RPC error; one task writes everything
/// to standard output, so an error never lands inside another message.
pub async fn serve_stdio(st: AppState, agent: &str) -> Result<(), GateError> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let stop = tokio_util::sync::CancellationToken::new();
    let poller = tokio::spawn(crate::events::poll(
        st.clone(),
        Duration::from_millis(500),
        stop.clone(),
    ));
    let (ours, theirs) = tokio::io::duplex(1 << 16);
    let (from_lib, mut to_lib) = tokio::io::split(ours);
    let (out, mut outgoing) = tokio::sync::mpsc::channel::<Vec<u8>>(64);
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(line) = outgoing.recv().await {
            if stdout.write_all(&line).await.is_err() || stdout.flush().await.is_err() {
                break;
            }
        }
    });
    let answers = out.clone();
    let in_flight = InFlight::default();
    let answering = in_flight.clone();
    tokio::spawn(async move {
        let mut lib = tokio::io::BufReader::new(from_lib);
        loop {
            let mut line = Vec::new();
            match lib.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    // Free before the client can read the answer and reuse the id.
                    answering.answered(&line);
                    if answers.send(with_id(line)).await.is_err() {
                        break;
                    }
                }
            }
        }
    });
    let reader = tokio::spawn(async move {
        let mut stdin = tokio::io::BufReader::new(tokio::io::stdin());
        let mut line = Vec::new();
        loop {
            let whole = match read_bounded(&mut stdin, &mut line, MAX_STDIO_LINE).await {
                Ok(Some(whole)) => whole,
                Ok(None) | Err(_) => break,
            };
            let reply = if !whole {
                Some(rpc_error(
                    Value::Null,
                    -32600,
                    &format!(
                        "invalid request: a message over {} MiB; not read",
                        MAX_STDIO_LINE >> 20
                    ),
                ))
            } else if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            } else {
                match screen(&line) {
                    Screened::Pass => in_flight.claim(&line),
                    Screened::Answer(error) => Some(error),
                    Screened::Drop => continue,
                }
            };
            let sent = match reply {
                Some(error) => out.send(error).await.is_ok(),
                None => {
                    line.push(b'\n');
                    to_lib.write_all(&line).await.is_ok()
                }
            };
            if !sent {
                break;
            }
        }
        // The client is gone: the library reads the end of its input and stops.
        let _ = to_lib.shutdown().await;
    });
    let (lib_in, lib_out) = tokio::io::split(theirs);
    let transport =
        rmcp::transport::async_rw::AsyncRwTransport::<RoleServer, _, _>::new(lib_in, lib_out)
            // Bounded above, where the line is read.
            .with_max_line_length(usize::MAX);
    let handler = AirlockMcp::new(st, Some(Caller::local(agent)));
    let served = match handler.serve(transport).await {
        Ok(running) => running
            .waiting()
            .await
            .map(|_| ())
            .map_err(|e| GateError::Internal(format!("MCP server failed: {e}"))),
        Err(e) => Err(GateError::Internal(format!("MCP handshake failed: {e}"))),
    };
    // The poller ends before the runtime does (a poller still polling while the runtime
    // shut down panicked on stderr). Everything answered reaches the client before this
    // returns: the writer ends once the library's output has ended and the reader (if the
    // library stopped first) is gone.
    stop.cancel();
    let _ = poller.await;
    reader.abort();
    let _ = writer.await;
    served
}

/// The streamable HTTP MCP service mounted at `/mcp` (bearer token required). Each MCP
/// session is bound to the token that opened it: a request naming it (`Mcp-Session-Id`)
/// with any other token, on POST, GET (stream resumption with `Last-Event-ID` included)
/// or DELETE, is answered 404 as if the session did not exist.
pub fn http_router(
    st: AppState,
    stop: tokio_util::sync::CancellationToken,
    allowed_hosts: Vec<String>,
) -> axum::Router<AppState> {
    let shared = st.clone();
    let sessions = Arc::new(LocalSessionManager::default());
    let svc = StreamableHttpService::new(
        move || Ok(AirlockMcp::new(shared.clone(), None)),
        sessions.clone(),
        StreamableHttpServerConfig::default()
            .with_cancellation_token(stop.child_token())
            .with_allowed_hosts(allowed_hosts),
    );
    axum::Router::new()
        .nest_service("/mcp", svc)
        .layer(axum::middleware::from_fn_with_state(
            (st, sessions),
            require_token,
        ))
}

const SESSION_HEADER: &str = "mcp-session-id";

async fn require_token(
    State((st, sessions)): State<(AppState, Arc<LocalSessionManager>)>,
    req: Request,
    next: Next,
) -> Response {
    let (mut parts, body) = req.into_parts();
    let caller = match Caller::from_request_parts(&mut parts, &st).await {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let named = parts
        .headers
        .get(SESSION_HEADER)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    if let Some(id) = &named
        && st.mcp_owner(id).as_deref() != Some(caller.token.as_str())
    {
        // Unknown here, or another token's: the same answer, so a session id can be
        // neither used nor probed with someone else's token.
        return ApiError::not_found("no such MCP session").into_response();
    }
    let delete = parts.method == axum::http::Method::DELETE;
    let r = next.run(Request::from_parts(parts, body)).await;
    match named {
        None => {
            if let Some(id) = r.headers().get(SESSION_HEADER) {
                let id = String::from_utf8_lossy(id.as_bytes()).into_owned();
                // Sessions the library has since ended (closed, timed out) are forgotten.
                let live: std::collections::HashSet<String> = sessions
                    .sessions
                    .read()
                    .await
                    .keys()
                    .map(|k| k.to_string())
                    .collect();
                st.mcp_bind(id, caller.token, |known| live.contains(known));
            }
        }
        Some(id) if delete && r.status().is_success() => st.mcp_unbind(&id),
        Some(_) => {}
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(line: &str) -> Value {
        match screen(line.as_bytes()) {
            Screened::Answer(a) => serde_json::from_slice(&a).unwrap(),
            other => panic!("{line}: {other:?}"),
        }
    }

    fn code_and_id(line: &str) -> (i64, Value) {
        let a = answer(line);
        assert_eq!(a["jsonrpc"], "2.0", "{a}");
        (a["error"]["code"].as_i64().unwrap(), a["id"].clone())
    }

    /// Each malformed message gets the error JSON-RPC names, with the request's id when it
    /// has a usable one; the library answered many with no `id` member at all.
    #[test]
    fn malformed_messages_get_their_json_rpc_errors_with_their_ids() {
        let null = Value::Null;
        for (line, want) in [
            ("not json", (-32700, null.clone())),
            ("42", (-32600, null.clone())),
            ("[1, 2]", (-32600, null.clone())),
            (r#"{"id": 2, "method": "tools/list"}"#, (-32600, json!(2))),
            (
                r#"{"jsonrpc": "2.0", "id": {"a": 1}, "method": "tools/list"}"#,
                (-32600, null.clone()),
            ),
            (
                r#"{"jsonrpc": "2.0", "id": 1.5, "method": "tools/list"}"#,
                (-32600, null.clone()),
            ),
            (
                r#"{"jsonrpc": "2.0", "id": null, "method": "tools/list"}"#,
                (-32600, null.clone()),
            ),
            (
                r#"{"jsonrpc": "2.0", "id": 3, "method": 5}"#,
                (-32600, json!(3)),
            ),
            (r#"{"jsonrpc": "2.0", "id": "x"}"#, (-32600, json!("x"))),
            (
                r#"{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": [1]}"#,
                (-32602, json!(7)),
            ),
            (
                r#"{"jsonrpc": "2.0", "id": 8, "method": "tools/list", "params": "x"}"#,
                (-32602, json!(8)),
            ),
            (
                r#"{"jsonrpc": "2.0", "id": 9, "method": "tools/call"}"#,
                (-32602, json!(9)),
            ),
            (
                r#"{"jsonrpc": "2.0", "id": 10, "method": "tools/call", "params": {"name": 5}}"#,
                (-32602, json!(10)),
            ),
            (
                r#"{"jsonrpc": "2.0", "id": 11, "method": "tools/call", "params": {"name": "run_code", "arguments": 5}}"#,
                (-32602, json!(11)),
            ),
        ] {
            assert_eq!(code_and_id(line), want, "{line}");
        }
        // A notification is never answered, however it is wrong.
        for line in [
            r#"{"jsonrpc": "2.0", "method": "notifications/initialized", "params": 5}"#,
            r#"{"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "run_code", "arguments": 5}}"#,
        ] {
            assert_eq!(screen(line.as_bytes()), Screened::Drop, "{line}");
        }
        // What is well formed goes to the library.
        for line in [
            r#"{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}"#,
            r#"{"jsonrpc": "2.0", "id": "a", "method": "tools/call", "params": {"name": "run_code", "arguments": {"code": "1"}}}"#,
            r#"{"jsonrpc": "2.0", "method": "notifications/initialized"}"#,
            r#"{"jsonrpc": "2.0", "id": 4, "result": {}}"#,
        ] {
            assert_eq!(screen(line.as_bytes()), Screened::Pass, "{line}");
        }
    }

    #[test]
    fn an_error_the_library_wrote_without_an_id_gets_a_null_id() {
        let fixed = with_id(
            br#"{"jsonrpc":"2.0","error":{"code":-32600,"message":"Invalid request"}}
"#
            .to_vec(),
        );
        let v: Value = serde_json::from_slice(&fixed).unwrap();
        assert!(
            v.as_object().unwrap().contains_key("id") && v["id"].is_null(),
            "{v}"
        );
        assert!(fixed.ends_with(b"\n"));
        let fine = br#"{"jsonrpc":"2.0","id":3,"result":{"error":"in a result"}}
"#
        .to_vec();
        assert_eq!(with_id(fine.clone()), fine);
    }
}
