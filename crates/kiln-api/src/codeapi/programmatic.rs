//! `POST /exec/programmatic` and `POST /exec/programmatic/cancel`:
//! programmatic tool calling (spec §7) over Kiln's paused runs
//! (`kiln_exec::ptc`).
//!
//! The initial request starts a detached run with a [`Bridge`] and answers
//! at the first of: a round of tool calls (`tool_call_required`, with a
//! signed continuation token), the run's end (`completed` / `error`).
//! A continuation hands the results to the bridge — the paused program
//! goes on from where it waited — and answers the same way. Nothing is
//! replayed.
//!
//! Caps: at most `max_active` programmatic runs alive (running or paused)
//! on the node (503 past it) and `max_per_user` per principal (429), one
//! place each under [`kiln_exec::caps::Caps`], taken before the run starts
//! (check and reservation are one step) and given back when it ends. A
//! paused run holds its jail and an execution slot, so no caller may hold
//! more than its share by leaving tool calls unanswered.
//!
//! Memory: an execution's run is the run registry's (`kiln_exec::Runs`),
//! kept after its end within the registry's one retention budget like any
//! run; an execution whose run the registry forgot is forgotten too, and
//! a finished execution keeps no answer of its own (a retried
//! continuation's answer is rendered again from the run).
//!
//! Continuation tokens are `base64url(JSON{e: run id, o: owner hash, x:
//! expiry}) "." base64url(HMAC-SHA256)` under a server secret (configured,
//! or made at start): a forged or altered token is 400, a token of another
//! principal 403, an expired one or one whose run is gone 404.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use kiln_core::access::{Action, Caller, Policy, may};
use kiln_core::{Language, Owner};
use kiln_exec::caps::CapError;
use kiln_exec::ptc::{Bridge, BridgeFailure, ResumeError, Resumed, ToolDef, ToolResult};
use kiln_exec::turns::Turn;
use kiln_exec::{ExecError, ExecRequest, ExecResult, Outputs, StartOptions, Stream, Work};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;
use utoipa::ToSchema;

use super::exec::{FileOut, parse_files};
use crate::body::parse_object;
use crate::config::AppState;
use crate::error::ApiError;
use crate::identity::{Identity, header_user_id, policy, resolve_caller};
use crate::kit::envelope::plain;
use crate::kit::{Admitted, BodyKind, Open, Unresolved};
use crate::rate::{Peer, stamp, starts_code};
use kiln_exec::ptc::registry::{Execution, InFlight, lock, unix_now};
pub use kiln_exec::ptc::registry::{Programmatic, PtcSettings};

/// The header that names a programmatic request (for cancellation).
pub const REQUEST_ID_HEADER: &str = "x-librechat-code-request-id";

/// Most tools one request may declare.
const MAX_TOOLS: usize = 100;
/// Most results one continuation may carry.
const MAX_RESULTS: usize = 200;
/// Largest single tool result.
const MAX_RESULT_BYTES: usize = 5 * 1024 * 1024;

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::BadRequest(msg.into())
}

/// Registers a request id for the request's life.
struct RequestGuard<'a> {
    ptc: &'a Programmatic,
    id: Option<String>,
    cancel: CancellationToken,
}

impl Drop for RequestGuard<'_> {
    fn drop(&mut self) {
        if let Some(id) = &self.id {
            lock(&self.ptc.requests).remove(id);
        }
    }
}

fn valid_request_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

/// The request's id, registered; `Err` with the answer when it is
/// malformed or already in flight.
fn register<'a>(
    ptc: &'a Programmatic,
    headers: &HeaderMap,
    owner: &Owner,
) -> Result<RequestGuard<'a>, (StatusCode, &'static str)> {
    let cancel = CancellationToken::new();
    let Some(v) = headers.get(REQUEST_ID_HEADER) else {
        return Ok(RequestGuard {
            ptc,
            id: None,
            cancel,
        });
    };
    let id = match v.to_str() {
        Ok(s) if valid_request_id(s) => s.to_owned(),
        _ => {
            return Err((
                StatusCode::BAD_REQUEST,
                "Invalid X-LibreChat-Code-Request-ID header",
            ));
        }
    };
    let mut requests = lock(&ptc.requests);
    if requests.contains_key(&id) {
        return Err((
            StatusCode::CONFLICT,
            "Programmatic request ID is already in use",
        ));
    }
    requests.insert(
        id.clone(),
        InFlight {
            owner: owner.clone(),
            cancel: cancel.clone(),
        },
    );
    Ok(RequestGuard {
        ptc,
        id: Some(id),
        cancel,
    })
}

/// What a client may send to `/exec/programmatic` (documentation of the
/// hand-written parser; unknown fields are ignored).
#[derive(Debug, ToSchema)]
#[allow(dead_code)]
pub struct ProgrammaticBody {
    /// Initial request: the program (Python with top-level `await tool(...)`,
    /// or bash with one shell function per tool).
    code: Option<String>,
    /// Initial request: the tools the program may call (0-100; none: a
    /// plain execution answered `completed` or `error`).
    tools: Option<Vec<ToolBody>>,
    /// `python` (default) or `bash`; `language` wins over `lang`.
    lang: Option<String>,
    language: Option<String>,
    /// Informational.
    session_id: Option<String>,
    /// Wall time in milliseconds, not counting time paused for tools.
    timeout: Option<f64>,
    /// Inputs, as for `/exec`.
    files: Option<Vec<super::exec::FileRefBody>>,
    /// Continuation: the token of the last `tool_call_required`.
    continuation_token: Option<String>,
    /// Continuation: one result per call of the last round.
    tool_results: Option<Vec<ToolResultBody>>,
    /// LibreChat's attached workspace instance (64 lowercase hex digits,
    /// with the `X-LibreChat-Code-Workspace-ID` header): the run starts in
    /// the caller's persistent project of that workspace, `/workspace`;
    /// `LIBRECHAT_CODE_DATA_DIR` (`/mnt/data`) holds this call's injected
    /// files and artifacts.
    workspace_instance_id: Option<String>,
}

#[derive(Debug, ToSchema)]
#[allow(dead_code)]
pub struct ToolBody {
    name: String,
    description: Option<String>,
    /// JSON Schema of the tool's keyword arguments.
    parameters: Option<Value>,
}

#[derive(Debug, ToSchema)]
#[allow(dead_code)]
pub struct ToolResultBody {
    /// `call_NNN`, as issued.
    call_id: String,
    /// Any JSON.
    result: Value,
    is_error: Option<bool>,
    error_message: Option<String>,
}

#[derive(Debug, ToSchema)]
#[allow(dead_code)]
pub struct CancelBody {
    /// The `X-LibreChat-Code-Request-ID` of the request to cancel.
    request_id: String,
}

const FIELDS: &[&str] = &[
    "code",
    "tools",
    "lang",
    "language",
    "session_id",
    "timeout",
    "files",
    "user_id",
    "continuation_token",
    "tool_results",
    super::workspace::INSTANCE_FIELD,
];

/// The handler.
#[utoipa::path(
    post,
    path = "/exec/programmatic",
    operation_id = "exec_programmatic",
    tag = "LibreChat",
    summary = "Run code that calls the host's tools (programmatic tool calling)",
    description = "Initial request (`code`, `tools`) or continuation (`continuation_token`, `tool_results`). The program stays alive and paused while the host runs its tool calls; the answer is `tool_call_required` (a round of calls and a signed continuation token), `completed` or `error`. Paused time does not count against `timeout`. `tools: []` is a plain execution. With `X-LibreChat-Code-Workspace-ID` (LibreChat's attached workspace) the program starts in the caller's persistent project of that workspace and `workspace_instance_id`, `/workspace`; `LIBRECHAT_CODE_DATA_DIR` (`/mnt/data`) holds the call's injected files and artifacts.",
    request_body = ProgrammaticBody,
    params(
        ("X-LibreChat-Code-Workspace-ID" = Option<String>, Header, description = "LibreChat's attached workspace, `^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`: run in the caller's persistent project of it"),
    ),
    responses(
        (status = 200, description = "`tool_call_required`, `completed` or `error`"),
        (status = 400, description = "Invalid body or token", body = crate::error::ErrorBody),
        (status = 403, description = "The execution belongs to another principal", body = crate::error::ErrorBody),
        (status = 404, description = "Execution not found or expired", body = crate::error::ErrorBody),
        (status = 409, description = "A conflicting result, a continuation already in flight, a request id in use, or the attached workspace busy with another execution", body = crate::error::ErrorBody),
        (status = 503, description = "Too many programmatic executions, attached workspaces not enabled, or shutting down", body = crate::error::ErrorBody),
    )
)]
pub async fn programmatic(
    State(state): State<AppState>,
    identity: Identity,
    peer: Peer,
    headers: HeaderMap,
    admitted: Admitted<ApiError>,
) -> Result<Response, ApiError> {
    let mut obj = parse_object(&admitted.body, FIELDS)?;
    let user_id = match obj.get("user_id") {
        Some(Value::String(s)) if !s.trim().is_empty() => Some(s.trim().to_owned()),
        _ => None,
    };
    let caller = resolve_caller(
        &state.config,
        &identity,
        &[header_user_id(&headers)?, user_id.as_deref()],
    )?;
    let owner = Owner::of(&caller);
    let ptc = Arc::clone(&state.ptc);
    ptc.sweep(&state.runs);
    let guard = match register(&ptc, &headers, &owner) {
        Ok(g) => g,
        Err((status, msg)) => return Ok(plain(status, msg)),
    };
    if obj.contains_key("continuation_token") {
        return Ok(continuation(&ptc, &caller, &obj, &guard.cancel).await);
    }
    let parsed = parse_initial(&mut obj)?;
    let attached = super::workspace::requested(&headers, &obj)?;
    let verdict = starts_code(&state, &caller, peer.0).await?;
    let place = match ptc.caps.acquire(&owner) {
        Ok(place) => place,
        Err(e) => {
            let (status, msg) = match e {
                CapError::Total(_) => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "Too many programmatic executions in progress (at most {}); retry later",
                        ptc.caps.total()
                    ),
                ),
                CapError::Principal(_) => (
                    StatusCode::TOO_MANY_REQUESTS,
                    format!(
                        "Too many programmatic executions of this user in progress (at most {}); \
                         answer or cancel one first",
                        ptc.caps.per_principal()
                    ),
                ),
            };
            let mut resp = plain(status, &msg);
            resp.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                HeaderValue::from_static("5"),
            );
            return Ok(resp);
        }
    };
    let project = match attached {
        Some(w) => match super::workspace::bind(&state, &caller, w).await {
            Ok(binding) => Some(binding),
            Err(resp) => return Ok(resp),
        },
        None => None,
    };
    // no tools: a plain execution (in the programmatic response shape)
    let with_tools = !parsed.tools.is_empty();
    let bridge = Bridge::new(parsed.lang, parsed.tools, ptc.settings.limits.clone());
    let req = ExecRequest {
        lang: parsed.lang,
        code: parsed.code,
        args: Vec::new(),
        files: parsed.files,
        timeout_ms: parsed.timeout_ms,
        outputs: Outputs::NewSession,
        project,
    };
    let watch = state.runs.start(
        caller,
        if with_tools {
            Work::Programmatic(req, Arc::clone(&bridge))
        } else {
            Work::Fresh(req)
        },
        StartOptions {
            // the run outlives each request: it waits for the next one
            detach: true,
            request_id: crate::middleware::request_id(&headers),
        },
    )?;
    let run = watch.handle().clone();
    let exec = Arc::new(Execution {
        session_id: parsed
            .session_id
            .unwrap_or_else(|| run.id().as_str().to_owned()),
        run,
        bridge,
        owner,
        busy: Turn::default(),
        place: Mutex::new(Some(place)),
        progress: Mutex::default(),
    });
    // served by this request until it answers (a fresh turn is free)
    let busy = exec.busy.try_take();
    lock(&ptc.executions).insert(exec.run.id().as_str().to_owned(), Arc::clone(&exec));
    // the place is given back when the run ends, whoever is watching
    let ended = Arc::clone(&exec);
    tokio::spawn(async move {
        ended.run.outcome().await;
        ended.release();
    });
    let (status, body) = advance(&ptc, &exec, &guard.cancel).await;
    drop(busy);
    let mut resp = (status, Json(body)).into_response();
    if let Some(v) = verdict {
        stamp(resp.headers_mut(), &v);
    }
    crate::sse::insert_run_id(resp.headers_mut(), &exec.run);
    Ok(resp)
}

struct Initial {
    lang: Language,
    code: String,
    tools: Vec<ToolDef>,
    files: Vec<kiln_exec::InputFile>,
    timeout_ms: Option<u64>,
    session_id: Option<String>,
}

fn parse_initial(obj: &mut Map<String, Value>) -> Result<Initial, ApiError> {
    let code = match obj.remove("code") {
        Some(Value::String(s)) if !s.is_empty() => s,
        _ => return Err(bad("code is required and must be a non-empty string")),
    };
    let lang_field = obj
        .get("language")
        .filter(|v| !v.is_null())
        .or_else(|| obj.get("lang").filter(|v| !v.is_null()));
    let lang = match lang_field {
        None => Language::default_for_tools(),
        Some(Value::String(s)) => {
            Language::for_tools(s).ok_or_else(|| bad(format!("Unsupported language: {s}")))?
        }
        Some(other) => return Err(bad(format!("Unsupported language: {other}"))),
    };
    let tools = parse_tools(obj.get("tools"), lang)?;
    let timeout_ms = match obj.get("timeout").filter(|v| !v.is_null()) {
        None => None,
        Some(v) => match v.as_f64() {
            Some(ms) if ms > 0.0 => Some(ms.ceil() as u64),
            _ => return Err(bad("timeout must be a positive number of milliseconds")),
        },
    };
    let session_id = match obj.get("session_id") {
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        None | Some(Value::Null) | Some(Value::String(_)) => None,
        Some(_) => return Err(bad("session_id must be a string")),
    };
    let files = parse_files(obj.get("files"), None)?;
    for f in &files {
        let name = match f {
            kiln_exec::InputFile::Ref(r) => r.name.as_str(),
            kiln_exec::InputFile::Inline { name, .. } => name.as_str(),
        };
        if name.rsplit('/').next() == Some("_ptc_history.json") {
            return Err(bad(format!("Invalid file name: {name}")));
        }
    }
    Ok(Initial {
        lang,
        code,
        tools,
        files,
        timeout_ms,
        session_id,
    })
}

fn parse_tools(v: Option<&Value>, lang: Language) -> Result<Vec<ToolDef>, ApiError> {
    let items = match v {
        Some(Value::Array(items)) if items.len() <= MAX_TOOLS => items,
        _ => {
            return Err(bad(format!(
                "tools must be an array of at most {MAX_TOOLS} tools"
            )));
        }
    };
    let mut tools: Vec<ToolDef> = Vec::with_capacity(items.len());
    let mut names: HashMap<String, String> = HashMap::new();
    for (i, item) in items.iter().enumerate() {
        let name = match item.get("name") {
            Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
            _ => return Err(bad(format!("tools[{i}].name is required"))),
        };
        let parameters = match item.get("parameters") {
            None | Some(Value::Null) => None,
            Some(p @ Value::Object(_)) => Some(p.clone()),
            Some(_) => return Err(bad(format!("tools[{i}].parameters must be an object"))),
        };
        let f = kiln_exec::ptc::program::function_name(lang, &name);
        if f.is_empty() {
            return Err(bad(format!("tools[{i}].name has no usable characters")));
        }
        if let Some(other) = names.insert(f.clone(), name.clone()) {
            return Err(bad(format!(
                "Tool names collide after normalization: {other}, {name} ({f})"
            )));
        }
        tools.push(ToolDef { name, parameters });
    }
    Ok(tools)
}

/// A continuation's `tool_results`, checked (§7.3).
fn parse_results(v: Option<&Value>) -> Result<Vec<(String, ToolResult)>, String> {
    let items = match v {
        Some(Value::Array(items)) if !items.is_empty() => items,
        _ => return Err("tool_results must be a non-empty array".into()),
    };
    if items.len() > MAX_RESULTS {
        return Err(format!(
            "tool_results must have at most {MAX_RESULTS} entries"
        ));
    }
    let mut out: Vec<(String, ToolResult)> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let Value::Object(o) = item else {
            return Err(format!("tool_results[{i}] must be an object"));
        };
        let id = match o.get("call_id") {
            Some(Value::String(s)) if is_call_id(s) => s.clone(),
            _ => {
                return Err(format!(
                    "tool_results[{i}].call_id must match ^call_\\d{{3,6}}$"
                ));
            }
        };
        if out.iter().any(|(other, _)| *other == id) {
            return Err(format!("Duplicate call_id in tool_results: {id}"));
        }
        let Some(result) = o.get("result") else {
            return Err(format!("tool_results[{i}].result is required"));
        };
        if result.to_string().len() > MAX_RESULT_BYTES {
            return Err(format!(
                "tool_results[{i}].result exceeds {MAX_RESULT_BYTES} bytes"
            ));
        }
        let is_error = match o.get("is_error") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(format!("tool_results[{i}].is_error must be a boolean")),
        };
        let error_message = match o.get("error_message") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err(format!("tool_results[{i}].error_message must be a string")),
        };
        out.push((
            id,
            ToolResult {
                result: result.clone(),
                is_error,
                error_message,
            },
        ));
    }
    Ok(out)
}

fn is_call_id(s: &str) -> bool {
    s.strip_prefix("call_")
        .is_some_and(|d| (3..=6).contains(&d.len()) && d.bytes().all(|b| b.is_ascii_digit()))
}

async fn continuation(
    ptc: &Programmatic,
    caller: &Caller,
    obj: &Map<String, Value>,
    cancel: &CancellationToken,
) -> Response {
    let results = match parse_results(obj.get("tool_results")) {
        Ok(r) => r,
        Err(msg) => return plain(StatusCode::BAD_REQUEST, &msg),
    };
    let Some((run_id, token_owner, exp)) = obj
        .get("continuation_token")
        .and_then(Value::as_str)
        .and_then(|t| ptc.verify(t))
    else {
        return plain(StatusCode::BAD_REQUEST, "Invalid continuation token");
    };
    // a token issued to someone else: continuing acts in its owner's name
    if !Owner::of(caller).named_by(&token_owner) {
        return plain(StatusCode::FORBIDDEN, "Forbidden");
    }
    let found = lock(&ptc.executions).get(&run_id).cloned();
    let exec = match found {
        Some(e)
            if exp >= unix_now()
                && may(Policy::default(), caller, Action::Write, &e.owner).is_ok() =>
        {
            e
        }
        _ => return plain(StatusCode::NOT_FOUND, "Execution not found or expired"),
    };
    let Some(_busy) = exec.busy.try_take() else {
        return plain(
            StatusCode::CONFLICT,
            "Another continuation is already in flight for this execution",
        );
    };
    match exec.bridge.resume(results.clone()) {
        Ok(Resumed::Delivered) => {}
        Ok(Resumed::Repeated) => {
            let last = lock(&exec.progress).last.clone();
            if let Some((prev, answer)) = last
                && prev == results
            {
                return (StatusCode::OK, Json(answer)).into_response();
            }
        }
        Err(e @ ResumeError::Conflict(_)) => return plain(StatusCode::CONFLICT, &e.to_string()),
        Err(e) => return plain(StatusCode::BAD_REQUEST, &e.to_string()),
    }
    let (status, body) = advance(ptc, &exec, cancel).await;
    // a final answer is not kept: a retry renders it again from the run,
    // which the registry keeps within its retention budget
    if status == StatusCode::OK && body["status"] == "tool_call_required" {
        lock(&exec.progress).last = Some((results, body.clone()));
    } else {
        lock(&exec.progress).last = None;
    }
    (status, Json(body)).into_response()
}

/// Waits for the execution's next stop — a round of tool calls, the run's
/// end, the bridge giving up, or a cancel of this request — and renders it.
async fn advance(
    ptc: &Programmatic,
    exec: &Execution,
    cancel: &CancellationToken,
) -> (StatusCode, Value) {
    let seen = lock(&exec.progress).rounds_seen;
    let mut signal = exec.bridge.subscribe();
    let round = async {
        match signal.wait_for(|s| s.rounds > seen || s.failed).await {
            Ok(s) if !s.failed => Some(s.rounds),
            _ => None,
        }
    };
    let stop = tokio::select! {
        r = round => r,
        _ = exec.run.outcome() => None,
        () = cancel.cancelled() => {
            exec.run.cancel();
            let _ = exec.run.outcome().await;
            exec.release();
            exec.touch();
            return (StatusCode::OK, error_body(exec, "Programmatic execution request cancelled", None));
        }
    };
    exec.touch();
    if let Some(rounds) = stop {
        let calls = exec.bridge.open_round();
        let (out, err) = partial(exec);
        lock(&exec.progress).rounds_seen = rounds;
        let calls: Vec<Value> = calls
            .into_iter()
            .map(|c| json!({"id": c.id, "name": c.name, "input": c.input}))
            .collect();
        return (
            StatusCode::OK,
            json!({
                "status": "tool_call_required",
                "continuation_token": ptc.token(exec.run.id().as_str(), &exec.owner),
                "tool_calls": calls,
                "session_id": exec.session_id,
                "partial_stdout": out,
                "partial_stderr": err,
            }),
        );
    }
    let outcome = exec.run.outcome().await;
    exec.release();
    match exec.bridge.failure() {
        Some(f @ BridgeFailure::TooManyCalls(_)) => {
            return (StatusCode::BAD_REQUEST, json!({"error": f.to_string()}));
        }
        Some(f @ BridgeFailure::Expired) => {
            return (StatusCode::NOT_FOUND, json!({"error": f.to_string()}));
        }
        Some(f @ BridgeFailure::UnregisteredTool(_)) => {
            let r = outcome.as_ref().as_ref().ok();
            return (StatusCode::OK, error_body(exec, &f.to_string(), r));
        }
        None => {}
    }
    match &*outcome {
        Ok(r) => (StatusCode::OK, final_body(exec, r)),
        Err(ExecError::Cancelled) => (
            StatusCode::OK,
            error_body(exec, "Programmatic execution request cancelled", None),
        ),
        Err(e) => ApiError::Exec(e.clone()).status_and_body(),
    }
}

/// Output written since the last answer.
fn partial(exec: &Execution) -> (String, String) {
    let mut p = lock(&exec.progress);
    let out = exec.run.text(Stream::Stdout);
    let err = exec.run.text(Stream::Stderr);
    let new_out = out.get(p.stdout_at..).unwrap_or_default().to_owned();
    let new_err = err.get(p.stderr_at..).unwrap_or_default().to_owned();
    p.stdout_at = out.len();
    p.stderr_at = err.len();
    (new_out, new_err)
}

/// `status: "error"` (§7.2), with what the run wrote and stored.
fn error_body(exec: &Execution, error: &str, r: Option<&ExecResult>) -> Value {
    let mut body = json!({
        "status": "error",
        "error": error,
        "session_id": exec.session_id,
        "stdout": exec.run.text(Stream::Stdout),
        "stderr": exec.run.text(Stream::Stderr),
    });
    if let Some(r) = r {
        body["session_id"] = json!(r.session_id.as_str());
        body["stdout"] = json!(r.stdout);
        body["stderr"] = json!(r.stderr);
        body["files"] = json!(r.files.iter().map(FileOut::from).collect::<Vec<_>>());
    }
    body
}

/// The run's result as `completed`, or as `error` with one of the reasons
/// the client shows (§7.2).
fn final_body(exec: &Execution, r: &ExecResult) -> Value {
    use kiln_core::RunStatus;
    use kiln_core::outcome::ExitStatus;
    let reason = if r.cancelled {
        Some("Programmatic execution request cancelled".to_owned())
    } else {
        match (r.status, r.exit) {
            (None, _) => None,
            (Some(RunStatus::Timeout), _) => Some("Time limit exceeded".to_owned()),
            (Some(RunStatus::StdoutOverflow), _) => Some("stdout length exceeded".to_owned()),
            (Some(RunStatus::StderrOverflow), _) => Some("stderr length exceeded".to_owned()),
            (Some(_), _) if r.message.as_deref() == Some("Out of memory") => {
                Some("Out of memory".to_owned())
            }
            (Some(RunStatus::Internal), _) => Some("Execution failed or timed out".to_owned()),
            // a program that succeeded but whose project changes were
            // refused (over the budget): the reason is the message
            (Some(RunStatus::RuntimeError), ExitStatus::Code(0)) if r.message.is_some() => {
                r.message.clone()
            }
            (Some(_), ExitStatus::Code(c)) => Some(format!("Sandbox exited with code {c}")),
            (Some(_), ExitStatus::Signal(s)) => Some(format!("Sandbox exited with code -{s}")),
        }
    };
    if let Some(reason) = reason {
        return error_body(exec, &reason, Some(r));
    }
    let mut body = super::exec::exec_response(r);
    if let Value::Object(o) = &mut body {
        for k in ["code", "signal", "status", "message", "wall_time"] {
            o.remove(k);
        }
        o.insert("status".into(), json!("completed"));
    }
    body
}

/// The cancel route's body: any bytes, at most 64 KiB.
pub enum CancelRead {}

impl BodyKind for CancelRead {
    fn limit(_: &crate::config::ApiConfig) -> usize {
        64 * 1024
    }
}

/// The cancel handler.
#[utoipa::path(
    post,
    path = "/exec/programmatic/cancel",
    operation_id = "exec_programmatic_cancel",
    tag = "LibreChat",
    summary = "Cancel a programmatic request in flight",
    request_body = CancelBody,
    responses(
        (status = 202, description = "`{status: \"cancellation_requested\"}`"),
        (status = 200, description = "`{status: \"already_completed\"}`: no such request in flight"),
        (status = 400, description = "Invalid or missing request_id", body = crate::error::ErrorBody),
        (status = 403, description = "The request belongs to another principal", body = crate::error::ErrorBody),
    )
)]
pub async fn cancel(
    State(state): State<AppState>,
    identity: Identity,
    headers: HeaderMap,
    admitted: Admitted<ApiError, Unresolved, CancelRead, Open>,
) -> Result<Response, ApiError> {
    let id = serde_json::from_slice::<Value>(&admitted.body)
        .ok()
        .and_then(|v| {
            v.get("request_id")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .filter(|s| valid_request_id(s));
    let Some(id) = id else {
        return Ok(plain(
            StatusCode::BAD_REQUEST,
            "Invalid or missing request_id",
        ));
    };
    let caller = resolve_caller(&state.config, &identity, &[header_user_id(&headers)?])?;
    let requests = lock(&state.ptc.requests);
    Ok(match requests.get(&id) {
        None => (StatusCode::OK, Json(json!({"status": "already_completed"}))).into_response(),
        // a request id is the client's choice, no capability: only the
        // request's owner cancels it
        Some(r) if may(policy(&state.config), &caller, Action::Write, &r.owner).is_err() => {
            plain(StatusCode::FORBIDDEN, "Forbidden")
        }
        Some(r) => {
            r.cancel.cancel();
            (
                StatusCode::ACCEPTED,
                Json(json!({"status": "cancellation_requested"})),
            )
                .into_response()
        }
    })
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;

    use super::*;

    #[test]
    fn tokens_are_bound_to_their_server_run_and_owner() {
        let ptc = Programmatic::new(PtcSettings {
            secret: Some(b"k1".to_vec()),
            ..PtcSettings::default()
        });
        let alice = Owner::of(&Caller::identified("local", "alice"));
        let t = ptc.token("run1", &alice);
        let (run, owner, exp) = ptc.verify(&t).expect("valid");
        assert_eq!(run.as_str(), "run1");
        assert!(alice.named_by(&owner));
        assert!(!Owner::of(&Caller::identified("local", "bob")).named_by(&owner));
        assert!(exp > unix_now());
        // another server's secret
        let other = Programmatic::new(PtcSettings {
            secret: Some(b"k2".to_vec()),
            ..PtcSettings::default()
        });
        assert!(other.verify(&t).is_none());
        // an altered payload
        let (p, tag) = t.split_once('.').expect("two parts");
        let forged = URL_SAFE_NO_PAD.encode(
            String::from_utf8(URL_SAFE_NO_PAD.decode(p).expect("b64"))
                .expect("utf8")
                .replace("run1", "run2"),
        );
        assert!(ptc.verify(&format!("{forged}.{tag}")).is_none());
        assert!(ptc.verify("garbage").is_none());
    }

    #[test]
    fn results_are_checked_like_the_contract_says() {
        let ok = json!([{"call_id": "call_001", "result": {"a": 1}}]);
        assert_eq!(parse_results(Some(&ok)).expect("ok").len(), 1);
        let cases = [
            (json!([]), "tool_results must be a non-empty array"),
            (
                json!([{"call_id": "call_1", "result": 1}]),
                "tool_results[0].call_id must match ^call_\\d{3,6}$",
            ),
            (
                json!([{"call_id": "call_001"}]),
                "tool_results[0].result is required",
            ),
            (
                json!([{"call_id": "call_001", "result": 1, "is_error": "no"}]),
                "tool_results[0].is_error must be a boolean",
            ),
            (
                json!([{"call_id": "call_001", "result": 1}, {"call_id": "call_001", "result": 2}]),
                "Duplicate call_id in tool_results: call_001",
            ),
        ];
        for (v, msg) in cases {
            assert_eq!(parse_results(Some(&v)).err().as_deref(), Some(msg), "{v}");
        }
        let big = json!([{"call_id": "call_001", "result": "x".repeat(MAX_RESULT_BYTES)}]);
        assert_eq!(
            parse_results(Some(&big)).err().as_deref(),
            Some("tool_results[0].result exceeds 5242880 bytes")
        );
        let many: Vec<Value> = (1..=201)
            .map(|i| json!({"call_id": format!("call_{i:03}"), "result": null}))
            .collect();
        assert_eq!(
            parse_results(Some(&Value::Array(many))).err().as_deref(),
            Some("tool_results must have at most 200 entries")
        );
    }
}
