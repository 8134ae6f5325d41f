//! `POST /exec`: LibreChat's request JSON → [`ExecRequest`], a run started
//! in the registry, and its [`ExecResult`] → the response JSON (spec §5).
//!
//! The body is parsed by hand from the JSON values of its known fields
//! ([`parse_object`]: unknown fields are skipped unbuilt and the number of
//! values is bounded, so a body costs a small multiple of its size) so
//! that every validation failure carries the message clients expect. Bodies are never logged: old clients put the API key in them.
//!
//! Kiln's additions, invisible to LibreChat: with `Accept:
//! text/event-stream` the run streams as Server-Sent Events ([`crate::sse`]);
//! a body with `"detach": true` starts a run that keeps going when the
//! client disconnects (with `Prefer: respond-async` the answer is a 202 at
//! once, pointing at `/v1/runs/{run_id}`); every answer names its run in
//! `X-Kiln-Run-Id`. Without these, the request is LibreChat's: it waits for
//! the run, and a client that goes away cancels it.
//!
//! LibreChat's stateful profile (spec §13.4): with `X-CodeAPI-Expected-Profile:
//! stateful` a `runtime_session_hint` names a runtime session of the caller's
//! ([`kiln_exec::sessions::FileSessions::open_runtime`]): its files are
//! staged in `/mnt/data` before the request's own (a reference to a replaced
//! version of a session file stands for the current one), outputs go into it
//! ([`Outputs::Workspace`]: a modified file replaces the one it changed), its
//! calls take turns (409 `runtime_session_busy` past the wait) and each is a
//! fresh process — unless `runtime_session_live` is on: then the `py` calls
//! of a runtime session evaluate in its one live kernel
//! ([`kiln_exec::kernels::Kernels::seat`]), through the same pipeline. The
//! answer adds `runtime_session_id` and `runtime_status` and leaves out
//! unchanged files of the session the request did not send.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use futures::future::BoxFuture;
use kiln_core::id::is_resource_id;
use kiln_core::outcome::{ExitStatus, signal_name};
use kiln_core::scope::parse_version;
use kiln_core::{Kind, Language, Nanoid, RelPath};
use kiln_exec::staging::{CallTurn, RuntimeCall, StageError};
use kiln_exec::{
    ExecError, ExecRequest, ExecResult, InputFile, InputRef, OutputFile, Outputs, RunHandle,
    StartOptions, Work,
};
use serde::Serialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::body::parse_object;
use crate::config::{ApiConfig, AppState, RuntimeSessionMode};
use crate::error::ApiError;
use crate::identity::{Caller, Identity, header_user_id, resolve_caller};
use crate::kit::{Admitted, JsonBody, Queues, Unresolved};
use crate::rate::{Peer, stamp, starts_code};
use crate::sse::{self, Early, Face};

/// What a client may send to `/exec` (documentation of the hand-written
/// parser below; unknown fields are ignored).
#[derive(Debug, ToSchema)]
#[schema(as = ExecRequestBody)]
#[allow(dead_code)] // a schema: the parser reads the fields by name
pub struct ExecBody {
    /// Language name or alias (`py`, `python`, `js`, `node`, `ts`, `c`, `cpp`, `java`, `php`, `rs`, `go`, `d`, `f90`, `r`, `bash`, ...).
    lang: String,
    /// The program, written as the runtime's entry file.
    code: String,
    /// Appended to the run command.
    args: Option<Vec<String>>,
    /// Inputs to place in `/mnt/data`.
    files: Option<Vec<FileRefBody>>,
    /// Wall-time limit in milliseconds; lowers the configured one.
    timeout: Option<f64>,
    /// Identity hint (after the `User-Id` header).
    user_id: Option<String>,
    /// G1: the agent (or user) the inputs belong to; with the caller's own
    /// user scope, the claim of every reference that names no scope of its own.
    entity_id: Option<String>,
    /// Kiln: keep running when the client disconnects.
    detach: Option<bool>,
    /// Stateful profile only: names the caller's runtime session, whose
    /// `/mnt/data` persists between calls (`^[A-Za-z0-9._:-]{1,128}$`).
    runtime_session_hint: Option<String>,
}

/// An input file: a stored object by reference (G2/G3 shape; G1 sends
/// `session_id` for `storage_session_id` and may add `entity_id`), or inline
/// content (`name`, `content`, `encoding`).
#[derive(Debug, ToSchema)]
#[allow(dead_code)]
pub struct FileRefBody {
    /// Path below `/mnt/data` (may contain `/`).
    name: String,
    id: Option<String>,
    storage_session_id: Option<String>,
    session_id: Option<String>,
    /// `user`, `agent` or `skill`.
    kind: Option<String>,
    resource_id: Option<String>,
    version: Option<f64>,
    entity_id: Option<String>,
    content: Option<String>,
    /// `utf8` (default), `base64` or `hex`.
    encoding: Option<String>,
}

/// The handler.
#[utoipa::path(
    post,
    path = "/exec",
    operation_id = "exec",
    tag = "LibreChat",
    summary = "Run code (LibreChat's contract)",
    description = "Runs `code` in a fresh jail and answers when it is done. With `Accept: text/event-stream` the run streams as Server-Sent Events (`queued`, `started`, `stdout`, `stderr`, `file`, then `result` with exactly the JSON of the non-streaming answer, or `error`). With `\"detach\": true` the run outlives a client that disconnects; add `Prefer: respond-async` to get a 202 at once.",
    request_body = ExecBody,
    responses(
        (status = 200, description = "The run completed (whatever its exit). With `Accept: text/event-stream`: the run as Server-Sent Events, each `event: <name>` with a JSON `data:` line — `queued` (`position`), `started` (`step`), `stdout`/`stderr` (`text`), `file` (one output), then `result` (exactly the JSON answer above) or `error` (`status`, `error`); comment lines keep the connection alive (docs/api.md)",
            content(
                (ExecResponse = "application/json"),
                (String = "text/event-stream", example = json!("event: stdout\ndata: {\"text\":\"hello\\n\"}\n\nevent: result\ndata: {\"session_id\":\"...\",\"stdout\":\"hello\\n\",\"stderr\":\"\",\"files\":[],\"code\":0}\n\n"))
            ),
            headers(("x-kiln-run-id" = String, description = "The run's id (see /runs/{run_id})"))),
        (status = 202, description = "Detached run started (`Prefer: respond-async`)", body = crate::sse::RunStarted),
        (status = 400, description = "Invalid body", body = crate::error::ErrorBody),
        (status = 403, description = "A file reference the caller may not read", body = crate::error::ErrorBody),
        (status = 409, description = "The runtime session is busy with another call past the wait (`runtime_session_busy`)", body = crate::error::CodedError),
        (status = 401, description = "Missing or invalid credentials (API key or LibreChat's JWT)", body = crate::error::ErrorBody),
        (status = 413, description = "The body is larger than `max_json_mb` (10 MiB by default)", body = crate::error::ErrorBody),
        (status = 415, description = "The body is not `application/json`", body = crate::error::ErrorBody),
        (status = 429, description = "Rate limited (`Retry-After`, `RateLimit-*`; `retry_after_seconds`)", body = crate::error::CodedError),
        (status = 503, description = "Sandbox unavailable, too many runs waiting (`Retry-After`), or shutting down", body = crate::error::CodedError),
    )
)]
pub async fn exec(
    State(state): State<AppState>,
    identity: Identity,
    peer: Peer,
    headers: HeaderMap,
    admitted: Admitted<ApiError, Unresolved, JsonBody, Queues>,
) -> Result<Response, ApiError> {
    let parsed = parse_exec(&state.config, &identity, &headers, &admitted.body)?;
    tracing::info!(
        lang = parsed.req.lang.name(),
        files = parsed.req.files.len(),
        user = %parsed.caller.principal.user_id,
        identified = parsed.caller.identified,
        detach = parsed.detach,
        "exec"
    );
    // counted per principal once the body named it (§4)
    let verdict = starts_code(&state, &parsed.caller, peer.0).await?;
    let mut resp = run(state, &headers, parsed).await?;
    if let Some(v) = verdict {
        stamp(resp.headers_mut(), &v);
    }
    Ok(resp)
}

/// Starts the parsed run and answers as the request asked.
async fn run(
    state: AppState,
    headers: &HeaderMap,
    mut parsed: ParsedExec,
) -> Result<Response, ApiError> {
    let detach = parsed.detach;
    let (face, turn, seat) = match parsed.runtime_hint.take() {
        None => (CodeApi::default(), None, None),
        Some(hint) => {
            let (runtime, turn, seat) = open_runtime(&state, &mut parsed, &hint).await?;
            (
                CodeApi {
                    runtime: Some(Arc::new(runtime)),
                },
                Some(turn),
                seat,
            )
        }
    };
    let work = match seat {
        Some(seat) => Work::Seated(parsed.req, seat),
        None => Work::Fresh(parsed.req),
    };
    let watch = state.runs.start(
        parsed.caller,
        work,
        StartOptions {
            detach,
            request_id: crate::middleware::request_id(headers),
        },
    )?;
    if let Some(turn) = turn {
        turn.hold_until_done(watch.handle().clone(), state.sessions.clone());
    }
    let face = Arc::new(face);
    if sse::wants_events(headers) {
        let run = watch.handle().clone();
        return Ok(sse::respond(run, face, Early::HttpError, watch).await);
    }
    if detach && prefers_async(headers) {
        return Ok(crate::sse::started_response(watch.handle()));
    }
    // Dropping this future (client disconnect) drops the watch, which
    // cancels the run unless it is detached.
    let outcome = watch.outcome().await;
    let mut resp = match &*outcome {
        Ok(r) => Json(face.render(r)).into_response(),
        Err(e) => ApiError::Exec(e.clone()).into_response(),
    };
    sse::insert_run_id(resp.headers_mut(), watch.handle());
    Ok(resp)
}

/// `Prefer: respond-async` (RFC 7240).
fn prefers_async(headers: &HeaderMap) -> bool {
    headers
        .get_all(HeaderName::from_static("prefer"))
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| p.trim().eq_ignore_ascii_case("respond-async"))
}

pub use crate::config::RUNTIME_BUSY_WAIT;

/// Opens the caller's runtime session `hint` and stages the call in it
/// ([`FileSessions::stage_runtime_call`]), and seats it in the session's
/// live kernel when the stateful profile keeps one.
async fn open_runtime(
    state: &AppState,
    parsed: &mut ParsedExec,
    hint: &str,
) -> Result<(RuntimeCall, CallTurn, Option<kiln_exec::JailOverride>), ApiError> {
    let (call, turn) = state
        .sessions
        .stage_runtime_call(
            &parsed.caller,
            hint,
            &mut parsed.req,
            state.config.runtime_session_busy_wait,
        )
        .await
        .map_err(|e| match e {
            StageError::Busy => ApiError::RuntimeSessionBusy,
            e => ApiError::Exec(ExecError::Storage(e.to_string())),
        })?;
    let mut seat = None;
    if state.config.runtime_session_live
        && parsed.req.lang == Language::default_kernel()
        && let Some(named) = &state.envs.runtime_kernels
    {
        let owner = kiln_core::Owner::of(&parsed.caller);
        let name = kiln_exec::workers::WorkerName::Runtime(call.id.clone());
        match named.get_or_start(&owner, &name, parsed.req.lang).await {
            Ok((session, _)) => seat = Some(named.kernels().seat(session)),
            Err(e) => tracing::warn!(
                runtime_session = %call.id, error = %e,
                "no live kernel for the runtime session: this call runs in a fresh process"
            ),
        }
    }
    Ok((call, turn, seat))
}

/// How LibreChat's face shows a run.
#[derive(Debug, Default)]
pub struct CodeApi {
    /// The runtime session of a stateful call.
    runtime: Option<Arc<RuntimeCall>>,
}

impl CodeApi {
    /// The response JSON of a completed run of this call.
    fn render(&self, r: &ExecResult) -> Value {
        let mut resp = ExecResponse::from(r);
        if let Some(rt) = &self.runtime {
            stateful_response(&mut resp, rt);
        }
        serde_json::to_value(resp).unwrap_or_default()
    }
}

/// The stateful profile's additions: the runtime session's id and status,
/// and no echo of an unchanged file of the session the request did not send
/// (it was reported in an earlier turn).
fn stateful_response(resp: &mut ExecResponse, rt: &RuntimeCall) {
    resp.runtime_session_id = Some(rt.id.clone());
    resp.runtime_status = Some(if rt.reused { "reused" } else { "new" });
    let workspace = rt.workspace.as_str();
    resp.files.retain(|f| {
        !(f.inherited
            && f.storage_session_id == workspace
            && !rt
                .sent
                .iter()
                .any(|(sid, id)| sid.as_str() == workspace && id.as_str() == f.id))
    });
}

impl Face for CodeApi {
    fn result<'a>(&'a self, _run: &'a RunHandle, r: &'a ExecResult) -> BoxFuture<'a, Value> {
        Box::pin(async move { self.render(r) })
    }

    fn error(&self, e: &ExecError) -> (StatusCode, Value) {
        ApiError::Exec(e.clone()).status_and_body()
    }

    fn file<'a>(&'a self, _run: &'a RunHandle, f: &'a OutputFile) -> BoxFuture<'a, Value> {
        Box::pin(async move { serde_json::to_value(FileOut::from(f)).unwrap_or_default() })
    }
}

/// A parsed `/exec` body.
pub struct ParsedExec {
    pub caller: Caller,
    pub req: ExecRequest,
    /// Kiln's `detach`.
    pub detach: bool,
    /// The stateful profile's runtime session, when the call names one.
    pub runtime_hint: Option<String>,
}

/// The fields of an `/exec` body Kiln reads; any other is skipped unbuilt.
const EXEC_FIELDS: &[&str] = &[
    "lang",
    "code",
    "args",
    "timeout",
    "user_id",
    "entity_id",
    "files",
    "detach",
    "runtime_session_hint",
];

/// The handler's parser: an `/exec` body's bytes → the caller, the request
/// and Kiln's options.
pub fn parse_exec(
    config: &ApiConfig,
    identity: &Identity,
    headers: &HeaderMap,
    bytes: &[u8],
) -> Result<ParsedExec, ApiError> {
    let mut obj = parse_object(bytes, EXEC_FIELDS)?;
    let top = parse_top(&mut obj)?;
    let caller = resolve_caller(
        config,
        identity,
        &[header_user_id(headers)?, top.user_id.as_deref()],
    )?;
    let files = parse_files(obj.get("files"), top.entity_id.as_deref())?;
    let detach = match field(&obj, "detach") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("detach must be a boolean")),
    };
    let runtime_hint = runtime_hint(
        config.runtime_session_mode,
        crate::middleware::expects_stateful(headers),
        field(&obj, "runtime_session_hint"),
    )?;
    let req = ExecRequest {
        lang: top.lang,
        code: top.code,
        args: top.args,
        files,
        timeout_ms: top.timeout_ms,
        outputs: Outputs::NewSession,
        project: None,
    };
    Ok(ParsedExec {
        caller,
        req,
        detach,
        runtime_hint,
    })
}

/// The runtime session a call names (spec §13.4): only under the stateful
/// profile and outside `stateless` mode (where the hint is not even
/// validated); required in `strict` mode.
fn runtime_hint(
    mode: RuntimeSessionMode,
    stateful: bool,
    hint: Option<&Value>,
) -> Result<Option<String>, ApiError> {
    if !stateful || mode == RuntimeSessionMode::Stateless {
        return Ok(None);
    }
    let hint = match hint {
        None => None,
        Some(Value::String(s)) => Some(s),
        Some(_) => return Err(bad("runtime_session_hint must be a string")),
    };
    match hint {
        None if mode == RuntimeSessionMode::Strict => {
            Err(bad("runtime_session_hint is required in strict mode"))
        }
        None => Ok(None),
        Some(h) if h.chars().count() > 128 => {
            Err(bad("runtime_session_hint must be at most 128 characters"))
        }
        Some(h) if h.is_empty() || !is_resource_id(h) => Err(bad(
            "runtime_session_hint may only contain letters, digits, \".\", \"_\", \":\", and \"-\"",
        )),
        Some(h) => Ok(Some(h.clone())),
    }
}

/// Fuzz entry point: an `/exec` body's bytes → the caller and the request
/// the executor receives. `headers` supply the `User-Id` identity source;
/// never panics, whatever the bytes.
pub fn parse_exec_body(
    config: &ApiConfig,
    headers: &HeaderMap,
    bytes: &[u8],
) -> Result<(Caller, ExecRequest), ApiError> {
    parse_exec(config, &Identity::default(), headers, bytes).map(|p| (p.caller, p.req))
}

/// The fields of the body other than `files`.
struct Top {
    lang: Language,
    code: String,
    args: Vec<String>,
    timeout_ms: Option<u64>,
    user_id: Option<String>,
    /// G1's top-level `entity_id` (validated; empty counts as absent).
    entity_id: Option<String>,
}

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::BadRequest(msg.into())
}

/// `null` counts as absent.
fn field<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

/// Takes `code` out of `obj` (it may be most of the body: never copied).
fn parse_top(obj: &mut Map<String, Value>) -> Result<Top, ApiError> {
    let lang = match field(obj, "lang") {
        Some(Value::String(s)) => {
            Language::resolve(s).ok_or_else(|| bad(format!("Unsupported language: {s}")))?
        }
        Some(other) => return Err(bad(format!("Unsupported language: {other}"))),
        None => return Err(bad("lang is required")),
    };
    let code = match obj.remove("code") {
        Some(Value::String(s)) => s,
        _ => return Err(bad("code is required and must be a string")),
    };
    let args = match field(obj, "args") {
        None => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|a| a.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("args must be an array of strings"))?,
        Some(_) => return Err(bad("args must be an array of strings")),
    };
    let timeout_ms = match field(obj, "timeout") {
        None => None,
        Some(v) => match v.as_f64() {
            // `as` saturates: absurdly large timeouts become u64::MAX and are
            // clamped to the configured limit by the executor.
            Some(ms) if ms > 0.0 => Some(ms.ceil() as u64),
            _ => return Err(bad("timeout must be a positive number of milliseconds")),
        },
    };
    let user_id = match field(obj, "user_id") {
        Some(Value::String(s)) if !s.trim().is_empty() => Some(s.trim().to_owned()),
        _ => None,
    };
    let entity_id = match field(obj, "entity_id") {
        None => None,
        Some(Value::String(s)) if s.is_empty() => None,
        Some(Value::String(s)) if is_resource_id(s) => Some(s.clone()),
        Some(_) => return Err(bad("entity_id must match ^[A-Za-z0-9_.:-]{1,128}$")),
    };
    Ok(Top {
        lang,
        code,
        args,
        timeout_ms,
        user_id,
        entity_id,
    })
}

/// Parse `files[]`, accepting the G2/G3 reference shape, the G1 shape and
/// inline content. `entity_id` (the body's top-level one), with the
/// caller's own user scope, is the claim of every reference that makes none
/// of its own.
pub(crate) fn parse_files(
    files: Option<&Value>,
    entity_id: Option<&str>,
) -> Result<Vec<InputFile>, ApiError> {
    let items = match files {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(bad("files must be an array")),
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let Value::Object(obj) = item else {
                return Err(bad(format!("files[{i}] must be an object")));
            };
            parse_file(i, obj, entity_id)
        })
        .collect()
}

fn parse_file(
    i: usize,
    obj: &Map<String, Value>,
    top_entity: Option<&str>,
) -> Result<InputFile, ApiError> {
    let name = match field(obj, "name") {
        Some(Value::String(s)) => {
            RelPath::parse(s).map_err(|e| bad(format!("files[{i}].name is invalid: {e}")))?
        }
        _ => return Err(bad(format!("files[{i}].name is required"))),
    };
    if let Some(content) = field(obj, "content") {
        return parse_inline(i, obj, name, content);
    }
    let id = ref_id(field(obj, "id"))?;
    // G1 names the storage session `session_id`
    let sid = match field(obj, "storage_session_id").or_else(|| field(obj, "session_id")) {
        Some(sid) => ref_id(Some(sid))?,
        None => return Err(bad(format!("files[{i}].storage_session_id is required"))),
    };
    let mut r = parse_ref(i, obj, id, sid, name)?;
    if r.kind.is_none()
        && r.entity_id.is_none()
        && let Some(e) = top_entity
    {
        // the body's entity, or the caller's own user scope: a G1 agent's
        // earlier outputs live there, referenced the same bare way
        r.kind = Some(Kind::User);
        r.entity_id = Some(e.to_owned());
    }
    Ok(InputFile::Ref(r))
}

fn ref_id(v: Option<&Value>) -> Result<Nanoid, ApiError> {
    v.and_then(Value::as_str)
        .and_then(|s| Nanoid::parse(s).ok())
        .ok_or(ApiError::MalformedId)
}

fn optional_string(
    i: usize,
    obj: &Map<String, Value>,
    key: &str,
) -> Result<Option<String>, ApiError> {
    match field(obj, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(bad(format!("files[{i}].{key} must be a string"))),
    }
}

/// A reference in the G2/G3 shape `{id, storage_session_id, name, kind,
/// resource_id, version?, entity_id?}` or the G1 shape `{id, session_id,
/// name, entity_id?}`. Without `kind` the ref claims no scope: its
/// `entity_id`, if any, is its whole claim.
fn parse_ref(
    i: usize,
    obj: &Map<String, Value>,
    id: Nanoid,
    storage_session_id: Nanoid,
    name: RelPath,
) -> Result<InputRef, ApiError> {
    let kind = match field(obj, "kind") {
        None => None,
        Some(v) => Some(v.as_str().and_then(Kind::parse).ok_or_else(|| {
            bad(format!(
                "files[{i}].kind must be one of: skill, agent, user"
            ))
        })?),
    };
    let resource_id = optional_string(i, obj, "resource_id")?;
    if let Some(r) = &resource_id
        && !is_resource_id(r)
    {
        return Err(bad(format!(
            "files[{i}].resource_id must match ^[A-Za-z0-9_.:-]{{1,128}}$"
        )));
    }
    if let Some(k) = kind
        && k != Kind::User
        && resource_id.is_none()
    {
        return Err(bad(format!(
            "files[{i}].resource_id is required for kind {}",
            k.as_str()
        )));
    }
    let version = match (kind, field(obj, "version")) {
        (Some(Kind::Skill), None) => {
            return Err(bad(format!(
                "files[{i}].version is required for kind skill"
            )));
        }
        (Some(Kind::Skill), Some(v)) => {
            let text = match v {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                _ => return Err(bad(format!("files[{i}].version must be a number"))),
            };
            let n = parse_version(&text)
                .map_err(|_| bad(format!("files[{i}].version must be a non-negative integer")))?;
            Some(n.to_string())
        }
        (_, Some(_)) => {
            return Err(bad(format!(
                "files[{i}].version is only allowed for kind skill"
            )));
        }
        (_, None) => None,
    };
    let entity_id = optional_string(i, obj, "entity_id")?.filter(|e| !e.is_empty());
    if let Some(e) = &entity_id
        && !is_resource_id(e)
    {
        return Err(bad(format!(
            "files[{i}].entity_id must match ^[A-Za-z0-9_.:-]{{1,128}}$"
        )));
    }
    Ok(InputRef {
        id,
        storage_session_id,
        name,
        // a scope needs its kind: `resource_id` alone claims nothing
        resource_id: kind.and(resource_id),
        kind,
        version,
        entity_id,
    })
}

fn parse_inline(
    i: usize,
    obj: &Map<String, Value>,
    name: RelPath,
    content: &Value,
) -> Result<InputFile, ApiError> {
    let Value::String(text) = content else {
        return Err(bad(format!("files[{i}].content must be a string")));
    };
    let encoding = optional_string(i, obj, "encoding")?;
    let content = match encoding.as_deref().unwrap_or("utf8") {
        "utf8" | "utf-8" => text.as_bytes().to_vec(),
        "base64" => base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|_| bad(format!("files[{i}].content is not valid base64")))?,
        "hex" => hex::decode(text.trim())
            .map_err(|_| bad(format!("files[{i}].content is not valid hex")))?,
        _ => {
            return Err(bad(format!(
                "files[{i}].encoding must be one of: base64, hex, utf8"
            )));
        }
    };
    Ok(InputFile::Inline { name, content })
}

/// The response of a completed run (spec §5.2). `code`, `signal`,
/// `status`, `message` and `wall_time` are always present (null allowed);
/// optional objects are omitted when absent.
#[derive(Debug, Serialize, ToSchema)]
pub struct ExecResponse {
    /// The execution's storage session (where its new outputs live).
    pub session_id: String,
    pub stdout: String,
    pub stderr: String,
    pub files: Vec<FileOut>,
    /// By-reference inputs the program deleted.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub deleted_files: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub artifact_truncation: Option<ArtifactTruncation>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub artifact_delivery: Option<ArtifactDelivery>,
    /// Exit code; null when killed by a signal.
    pub code: Option<i32>,
    /// Terminating signal (`SIGKILL`, ...).
    pub signal: Option<String>,
    /// `RE` runtime error, `SG` signal, `TO` timeout, `OL`/`EL` output overflow; null on success.
    pub status: Option<String>,
    /// Why Kiln stopped the program (`Time limit exceeded`, ...).
    pub message: Option<String>,
    /// Milliseconds.
    pub wall_time: u64,
    /// Stateful profile: the runtime session (`rt_` + 40 hex digits).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime_session_id: Option<String>,
    /// Stateful profile: `new` or `reused`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime_status: Option<&'static str>,
}

/// One entry of `files`.
#[derive(Debug, Serialize, ToSchema)]
pub struct FileOut {
    pub id: String,
    /// Path relative to `/mnt/data`.
    pub name: String,
    pub storage_session_id: String,
    /// An unchanged (or read-only) input echoed with its original ids.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub inherited: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub modified_from: Option<ModifiedFrom>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entity_id: Option<String>,
}

/// The input an output replaced.
#[derive(Debug, Serialize, ToSchema)]
pub struct ModifiedFrom {
    pub id: String,
    pub storage_session_id: String,
}

/// Why some outputs were not reported.
#[derive(Debug, Serialize, ToSchema)]
pub struct ArtifactTruncation {
    /// Always `artifact_truncated`.
    pub code: &'static str,
    /// Counts per reason (`max_files`, `depth`, `size`, `path`, `unreadable`, and Kiln's `storage`: past the run's output total, the user's quota or the disk's floor), non-zero ones only.
    pub reasons: std::collections::BTreeMap<&'static str, u32>,
    /// Up to 20 skipped paths.
    pub skipped: Vec<String>,
    pub skipped_count: u32,
}

/// Outputs that could not be stored.
#[derive(Debug, Serialize, ToSchema)]
pub struct ArtifactDelivery {
    /// Always `artifact_delivery_failed`.
    pub code: &'static str,
    /// `partial` or `failed`.
    pub status: &'static str,
    pub attempted: u32,
    pub delivered: u32,
    pub failed: u32,
}

impl From<&OutputFile> for FileOut {
    fn from(f: &OutputFile) -> FileOut {
        FileOut {
            id: f.id.as_str().to_owned(),
            name: f.name.clone(),
            storage_session_id: f.storage_session_id.as_str().to_owned(),
            inherited: f.inherited,
            modified_from: f.modified_from.as_ref().map(|(id, sid)| ModifiedFrom {
                id: id.as_str().to_owned(),
                storage_session_id: sid.as_str().to_owned(),
            }),
            entity_id: f.entity_id.clone(),
        }
    }
}

impl From<&ExecResult> for ExecResponse {
    fn from(r: &ExecResult) -> ExecResponse {
        let (code, signal) = match r.exit {
            ExitStatus::Code(c) => (Some(c), None),
            ExitStatus::Signal(s) => (None, Some(signal_name(s))),
        };
        ExecResponse {
            session_id: r.session_id.as_str().to_owned(),
            stdout: r.stdout.clone(),
            stderr: r.stderr.clone(),
            files: r.files.iter().map(FileOut::from).collect(),
            deleted_files: r.deleted_files.clone(),
            artifact_truncation: r.truncation.as_ref().map(|t| ArtifactTruncation {
                code: "artifact_truncated",
                reasons: [
                    ("max_files", t.max_files),
                    ("depth", t.depth),
                    ("size", t.size),
                    ("path", t.path),
                    ("unreadable", t.unreadable),
                    ("storage", t.storage),
                ]
                .into_iter()
                .filter(|(_, n)| *n > 0)
                .collect(),
                skipped: t.skipped.clone(),
                skipped_count: t.skipped_count,
            }),
            artifact_delivery: r.delivery.as_ref().map(|d| ArtifactDelivery {
                code: "artifact_delivery_failed",
                status: if d.delivered == 0 {
                    "failed"
                } else {
                    "partial"
                },
                attempted: d.attempted,
                delivered: d.delivered,
                failed: d.failed,
            }),
            code,
            signal,
            status: r.status.map(|s| s.code().to_owned()),
            message: r.message.clone(),
            wall_time: u64::try_from(r.wall_time.as_millis()).unwrap_or(u64::MAX),
            runtime_session_id: None,
            runtime_status: None,
        }
    }
}

/// The response JSON for a completed run.
pub fn exec_response(r: &ExecResult) -> Value {
    serde_json::to_value(ExecResponse::from(r)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use kiln_core::RunStatus;
    use kiln_exec::{DeliveryFailure, OutputFile, Truncation};
    use serde_json::json;

    use super::*;

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(o) => o,
            _ => unreachable!("test input is an object"),
        }
    }

    fn err_msg(e: ApiError) -> String {
        e.status_and_body().1["error"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    #[test]
    fn top_level_validation_messages() {
        let e = parse_top(&mut obj(json!({"lang": "cobol", "code": ""})))
            .err()
            .unwrap();
        assert_eq!(err_msg(e), "Unsupported language: cobol");
        for t in [json!(0), json!(-5), json!("100"), json!(true)] {
            let e = parse_top(&mut obj(json!({"lang": "py", "code": "", "timeout": t})))
                .err()
                .unwrap();
            assert_eq!(
                err_msg(e),
                "timeout must be a positive number of milliseconds"
            );
        }
        let e = parse_top(&mut obj(json!({"lang": "py", "code": "", "args": [1]})))
            .err()
            .unwrap();
        assert_eq!(err_msg(e), "args must be an array of strings");
        assert!(parse_top(&mut obj(json!({"lang": "py"}))).is_err());
        let ok = parse_top(&mut obj(
            json!({"lang": "Python", "code": "x", "timeout": 1500.5}),
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ok.lang.name(), "py");
        assert_eq!(ok.timeout_ms, Some(1501));
    }

    #[test]
    fn skill_refs_need_a_version_and_others_must_not_have_one() {
        let id = Nanoid::random();
        let sid = Nanoid::random();
        let base = json!({"id": id.as_str(), "storage_session_id": sid.as_str(), "name": "a.txt",
                          "resource_id": "sk1", "kind": "skill"});
        let e = parse_files(Some(&json!([base])), None).err().unwrap();
        assert_eq!(err_msg(e), "files[0].version is required for kind skill");
        let mut agent = base.clone();
        agent["kind"] = json!("agent");
        agent["version"] = json!(2);
        let e = parse_files(Some(&json!([agent])), None).err().unwrap();
        assert_eq!(
            err_msg(e),
            "files[0].version is only allowed for kind skill"
        );
        let mut skill = base.clone();
        skill["version"] = json!(2.0);
        let files = parse_files(Some(&json!([skill])), None).unwrap_or_else(|e| panic!("{e}"));
        match &files[0] {
            InputFile::Ref(r) => assert_eq!(r.version.as_deref(), Some("2")),
            InputFile::Inline { .. } => panic!("expected a reference"),
        }
    }

    #[test]
    fn stateful_answers_leave_out_unchanged_session_files_the_request_did_not_send() {
        let ws = Nanoid::random();
        let sent_id = Nanoid::random();
        let file = |id: &Nanoid, sid: &Nanoid, name: &str, inherited: bool| OutputFile {
            id: id.clone(),
            name: name.into(),
            storage_session_id: sid.clone(),
            inherited,
            modified_from: None,
            entity_id: None,
        };
        let other = Nanoid::random();
        let r = ExecResult {
            session_id: ws.clone(),
            stdout: String::new(),
            stderr: String::new(),
            files: vec![
                // reported in an earlier turn, unchanged, not re-sent
                file(&Nanoid::random(), &ws, "old.csv", true),
                // re-sent by the client, unchanged
                file(&sent_id, &ws, "sent.csv", true),
                // an unchanged input of another session
                file(&Nanoid::random(), &other, "primed.txt", true),
                // new this turn
                file(&Nanoid::random(), &ws, "new.png", false),
            ],
            deleted_files: vec![],
            truncation: None,
            delivery: None,
            exit: ExitStatus::Code(0),
            status: None,
            message: None,
            wall_time: Duration::from_millis(1),
            usage: Default::default(),
            cancelled: false,
            evaluation: None,
        };
        let face = CodeApi {
            runtime: Some(Arc::new(RuntimeCall {
                id: "rt_0123".into(),
                reused: true,
                workspace: ws.clone(),
                sent: [(ws.clone(), sent_id.clone())].into_iter().collect(),
            })),
        };
        let v = face.render(&r);
        let names: Vec<&str> = v["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["sent.csv", "primed.txt", "new.png"]);
        assert_eq!(v["runtime_session_id"], "rt_0123");
        assert_eq!(v["runtime_status"], "reused");
        // a stateless answer has neither field
        let v = CodeApi::default().render(&r);
        assert_eq!(v["files"].as_array().unwrap().len(), 4);
        assert!(v.get("runtime_session_id").is_none() && v.get("runtime_status").is_none());
    }

    #[test]
    fn response_shape_keeps_null_fields_and_omits_absent_objects() {
        let sid = Nanoid::random();
        let r = ExecResult {
            session_id: sid.clone(),
            stdout: "hi\n".into(),
            stderr: String::new(),
            files: vec![OutputFile {
                id: Nanoid::random(),
                name: "a/b.csv".into(),
                storage_session_id: sid.clone(),
                inherited: false,
                modified_from: None,
                entity_id: None,
            }],
            deleted_files: vec![],
            truncation: None,
            delivery: None,
            exit: ExitStatus::Signal(9),
            status: Some(RunStatus::Timeout),
            message: None,
            wall_time: Duration::from_millis(1234),
            usage: Default::default(),
            cancelled: false,
            evaluation: None,
        };
        let v = exec_response(&r);
        assert_eq!(v["code"], Value::Null);
        assert_eq!(v["signal"], "SIGKILL");
        assert_eq!(v["status"], "TO");
        assert_eq!(v["message"], Value::Null);
        assert_eq!(v["wall_time"], 1234);
        let o = v.as_object().unwrap();
        for absent in ["deleted_files", "artifact_truncation", "artifact_delivery"] {
            assert!(!o.contains_key(absent), "{absent}");
        }
        let f = v["files"][0].as_object().unwrap();
        assert!(!f.contains_key("inherited") && !f.contains_key("modified_from"));

        let r2 = ExecResult {
            truncation: Some(Truncation {
                depth: 2,
                skipped: vec!["x".into()],
                skipped_count: 2,
                ..Default::default()
            }),
            delivery: Some(DeliveryFailure {
                attempted: 2,
                delivered: 0,
                failed: 2,
            }),
            exit: ExitStatus::Code(0),
            status: None,
            ..r
        };
        let v = exec_response(&r2);
        assert_eq!(v["code"], 0);
        assert_eq!(v["artifact_truncation"]["reasons"], json!({"depth": 2}));
        assert_eq!(v["artifact_delivery"]["status"], "failed");
    }
}
