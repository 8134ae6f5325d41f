//! Kiln's own sessions API: live kernels whose state persists between
//! calls (`kiln_exec::kernels`). Parsing and rendering only.
//!
//! | Route | What |
//! |---|---|
//! | `POST /sessions` `{lang, ttl_seconds?}` | start a kernel → 201 `{session_id, lang, created_at, expires_at}` |
//! | `GET /sessions/{session_id}` | its state (`idle`, `busy`, `lost`) |
//! | `DELETE /sessions/{session_id}` | close it → 204 |
//! | `POST /sessions/{session_id}/exec` `{code, timeout?}` | evaluate (JSON, or SSE with `Accept: text/event-stream`) |
//! | `POST /sessions/{session_id}/interrupt` | interrupt the evaluation in progress |
//! | `GET /sessions/{session_id}/files` | list the workspace |
//! | `GET|PUT|DELETE /sessions/{session_id}/files/{path}` | one file of the workspace |
//!
//! A session belongs to the principal that created it (its `Owner`); every
//! route asks the one access rule, `access::may`, for what it does (read,
//! or control: evaluate, interrupt, put or delete files, close), exactly
//! as the runs API does.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use kiln_core::access::Action::{self, Control, Read};
use kiln_core::{Owner, RelPath};
use kiln_exec::kernels::{EvalResult, Kernel, Kernels, SessionInfo};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::config::AppState;
use crate::error::ApiError;
use crate::identity::{Identity, authorize_owned, header_user_id, parse_id, resolve_caller};
use crate::kit::{Admitted, FileBody, JsonBody, Open, Unresolved};
use crate::runs::rfc3339;

/// `POST /sessions`'s body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    /// `py` or `js` (or an alias such as `python`, `node`).
    pub lang: String,
    /// Idle time after which the session is closed, seconds (at most the
    /// configured `session_idle_ttl_secs`, its default).
    pub ttl_seconds: Option<u64>,
}

/// A session as created.
#[derive(Debug, Serialize, ToSchema)]
pub struct SessionCreated {
    pub session_id: String,
    pub lang: String,
    /// RFC 3339 UTC.
    pub created_at: String,
    /// When it expires if left idle (or at its maximum age), RFC 3339 UTC.
    pub expires_at: String,
}

/// A session's state.
#[derive(Debug, Serialize, ToSchema)]
pub struct SessionView {
    pub session_id: String,
    pub lang: String,
    /// `idle`, `busy` (an evaluation runs) or `lost` (the kernel is gone:
    /// see `lost_reason`).
    pub status: String,
    pub created_at: String,
    pub expires_at: String,
    pub last_used_at: String,
    /// Evaluations so far.
    pub evaluations: u64,
    /// Why the kernel is gone (`session lost: out of memory`, ...).
    pub lost_reason: Option<String>,
}

/// `POST /sessions/{session_id}/exec`'s body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecBody {
    /// Source in the session's language; state (variables, imports,
    /// functions; in `js` globals and top-level `let`/`const`/`class`)
    /// persists.
    pub code: String,
    /// Milliseconds; at most the configured evaluation timeout (its
    /// default). Past it the evaluation is interrupted (`KeyboardInterrupt`
    /// in `py`, `Interrupted` in `js`) and the state kept.
    pub timeout: Option<u64>,
}

/// The value of a final expression (Jupyter's `execute_result`).
#[derive(Debug, Serialize, ToSchema)]
pub struct ValueView {
    /// `py`: `repr()` of the value; `js`: `util.inspect` of the completion
    /// value. At most 64 KiB.
    pub text: String,
    /// `py`: the value as a PNG image, base64 (Jupyter's `image/png`), when
    /// it is a matplotlib figure or axes (the figure is then closed) or has
    /// `_repr_png_`; absent otherwise. At most 4 MiB before encoding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub png: Option<String>,
}

/// An error the code raised (the kernel's own frames hidden).
#[derive(Debug, Serialize, ToSchema)]
pub struct EvalErrorView {
    pub ename: String,
    pub evalue: String,
    pub traceback: Vec<String>,
}

/// A file the evaluation created or changed under `/mnt/data`.
#[derive(Debug, Serialize, ToSchema)]
pub struct FileView {
    /// Relative to `/mnt/data`; read it at `/sessions/{session_id}/files/{path}`.
    pub path: String,
    pub size: u64,
}

/// What one evaluation used (that evaluation alone).
#[derive(Debug, Serialize, ToSchema)]
pub struct EvalUsage {
    pub wall_time_ms: u64,
    /// CPU of every process of the kernel during the evaluation.
    pub cpu_time_ms: Option<u64>,
    /// Peak memory of the kernel during the evaluation.
    pub memory_peak_bytes: Option<u64>,
}

/// The answer of an evaluation.
#[derive(Debug, Serialize, ToSchema)]
pub struct ExecView {
    /// The run this evaluation was (`GET /v1/runs/{run_id}` and its
    /// events know it, with its usage).
    pub run_id: String,
    /// `ok`, `error` (the code raised) or `timeout` (interrupted by the
    /// timeout; the state is kept).
    pub status: String,
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub result: Option<ValueView>,
    pub error: Option<EvalErrorView>,
    pub files: Vec<FileView>,
    pub usage: EvalUsage,
}

impl ExecView {
    /// The answer of the evaluation `r` the run `run_id` made.
    pub fn of(run_id: &kiln_core::Nanoid, r: &EvalResult) -> Self {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let status = crate::evals::status(r);
        ExecView {
            run_id: run_id.as_str().to_owned(),
            status: status.to_owned(),
            stdout: String::from_utf8_lossy(&r.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&r.stderr).into_owned(),
            stdout_truncated: r.stdout_truncated,
            stderr_truncated: r.stderr_truncated,
            result: r.value.clone().map(|text| ValueView {
                text,
                png: r.value_png.clone(),
            }),
            error: r.error.as_ref().map(|e| EvalErrorView {
                ename: e.ename.clone(),
                evalue: e.evalue.clone(),
                traceback: e.traceback.clone(),
            }),
            files: r
                .files
                .iter()
                .map(|f| FileView {
                    path: f.path.clone(),
                    size: f.size,
                })
                .collect(),
            usage: EvalUsage {
                wall_time_ms: ms(r.wall_time),
                cpu_time_ms: r.cpu_time.map(ms),
                memory_peak_bytes: r.memory_peak,
            },
        }
    }
}

/// A file of the workspace.
#[derive(Debug, Serialize, ToSchema)]
pub struct WorkspaceFile {
    pub path: String,
    pub size: u64,
}

/// The workspace's files.
#[derive(Debug, Serialize, ToSchema)]
pub struct FileList {
    pub files: Vec<WorkspaceFile>,
}

fn view(info: &SessionInfo) -> SessionView {
    let status = match (&info.lost, info.busy) {
        (Some(_), _) => "lost",
        (None, true) => "busy",
        (None, false) => "idle",
    };
    SessionView {
        session_id: info.id.as_str().to_owned(),
        lang: info.lang.to_owned(),
        status: status.to_owned(),
        created_at: rfc3339(info.created_at),
        expires_at: rfc3339(info.expires_at),
        last_used_at: rfc3339(info.last_used_at),
        evaluations: info.evaluations,
        lost_reason: info.lost.as_ref().map(|l| format!("session lost: {l}")),
    }
}

pub(crate) fn kernels(state: &AppState) -> Result<&Kernels, ApiError> {
    state.envs.kernels()
}

type SessionPath = Result<Path<String>, PathRejection>;
type FilePath = Result<Path<(String, String)>, PathRejection>;

/// The caller, and the owner of what it starts.
pub(crate) fn owner_of(
    state: &AppState,
    identity: &Identity,
    headers: &HeaderMap,
) -> Result<(kiln_core::access::Caller, Owner), ApiError> {
    let caller = resolve_caller(&state.config, identity, &[header_user_id(headers)?])?;
    let owner = Owner::of(&caller);
    Ok((caller, owner))
}

/// The session `id`, if the caller may use it (the one access rule, as for
/// runs: its creator, and identity-less callers unless identity is
/// required).
pub(crate) fn find(
    state: &AppState,
    identity: &Identity,
    headers: &HeaderMap,
    id: &str,
    action: Action,
) -> Result<Arc<Kernel>, ApiError> {
    let id = parse_id(id)?;
    let (caller, _) = owner_of(state, identity, headers)?;
    let session = kernels(state)?.get(&id)?;
    authorize_owned(&state.config, &caller, action, &id, session.owner())?;
    Ok(session)
}

fn session_id(path: SessionPath) -> Result<String, ApiError> {
    path.map(|Path(id)| id).map_err(|_| ApiError::MalformedId)
}

fn file_path(path: FilePath) -> Result<(String, RelPath), ApiError> {
    let Path((id, rel)) = path.map_err(|_| ApiError::MalformedId)?;
    let rel = RelPath::parse(&rel).map_err(|e| ApiError::BadRequest(format!("path: {e}")))?;
    Ok((id, rel))
}

/// `POST /sessions`.
#[utoipa::path(
    post,
    path = "/sessions",
    operation_id = "createSession",
    tag = "Sessions",
    summary = "Start a live kernel",
    description = "Starts a `py` kernel (a fork of the preloaded Python template) or a `js` kernel (a pre-started node, as warm `js` runs use) in a jail of its own, with a workspace at `/mnt/data` that persists for the session's life. It is closed after `ttl_seconds` idle (default and maximum: the configured idle TTL) or at the maximum age.",
    request_body = CreateSession,
    responses(
        (status = 201, description = "Started", body = SessionCreated),
        (status = 400, description = "Bad body or language", body = crate::error::CodedError),
        (status = 429, description = "The caller has the most sessions allowed", body = crate::error::CodedError),
        (status = 503, description = "The node runs the most sessions it allows, or sessions are unavailable", body = crate::error::CodedError),
    )
)]
pub async fn create(
    State(state): State<AppState>,
    admitted: Admitted<ApiError, kiln_core::access::Caller>,
) -> Result<Response, ApiError> {
    let body: CreateSession = admitted.json()?;
    let ttl = match body.ttl_seconds {
        Some(0) => return Err(ApiError::BadRequest("ttl_seconds must be positive".into())),
        t => t.map(Duration::from_secs),
    };
    let caller = admitted.caller;
    let info = kernels(&state)?.create_as(&caller, &body.lang, ttl).await?;
    let created = SessionCreated {
        session_id: info.id.as_str().to_owned(),
        lang: info.lang.to_owned(),
        created_at: rfc3339(info.created_at),
        expires_at: rfc3339(info.expires_at),
    };
    Ok((StatusCode::CREATED, Json(created)).into_response())
}

/// `GET /sessions/{session_id}`.
#[utoipa::path(
    get,
    path = "/sessions/{session_id}",
    operation_id = "getSession",
    tag = "Sessions",
    summary = "A session's state",
    params(("session_id" = String, Path, description = "The session's id")),
    responses(
        (status = 200, description = "OK", body = SessionView),
        (status = 403, description = "Someone else's session", body = crate::error::ErrorBody),
        (status = 404, description = "No such session", body = crate::error::CodedError),
    )
)]
pub async fn get_session(
    State(state): State<AppState>,
    identity: Identity,
    headers: HeaderMap,
    path: SessionPath,
) -> Result<Response, ApiError> {
    let session = find(&state, &identity, &headers, &session_id(path)?, Read)?;
    let info = kernels(&state)?.info(&session);
    Ok(Json(view(&info)).into_response())
}

/// `DELETE /sessions/{session_id}`.
#[utoipa::path(
    delete,
    path = "/sessions/{session_id}",
    operation_id = "deleteSession",
    tag = "Sessions",
    summary = "Close a session",
    description = "Kills the kernel and removes its workspace.",
    params(("session_id" = String, Path, description = "The session's id")),
    responses(
        (status = 204, description = "Closed"),
        (status = 403, description = "Someone else's session", body = crate::error::ErrorBody),
        (status = 404, description = "No such session", body = crate::error::CodedError),
    )
)]
pub async fn delete_session(
    State(state): State<AppState>,
    identity: Identity,
    headers: HeaderMap,
    path: SessionPath,
) -> Result<Response, ApiError> {
    let id = session_id(path)?;
    find(&state, &identity, &headers, &id, Control)?;
    let id = parse_id(&id)?;
    kernels(&state)?.delete(&id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /sessions/{session_id}/exec`.
#[utoipa::path(
    post,
    path = "/sessions/{session_id}/exec",
    operation_id = "execInSession",
    tag = "Sessions",
    summary = "Evaluate code in a session",
    description = "Runs `code` in the session's kernel: variables, imports and functions persist (`js`: REPL semantics, top-level `await` included). The value of a final expression is `result.text` (`js`: the completion value), and `result.png` (base64) when it is a matplotlib figure or has `_repr_png_`; `plt.show()` writes each open figure as `plot_<n>.png`, listed in `files`. With `Accept: text/event-stream` the answer is Server-Sent Events: `stdout`/`stderr` (`{\"text\"}`) as the code writes, then `result` (this route's JSON) or `error` (`{status, error, message}`). One evaluation at a time: a call made while another runs waits up to `session_busy_wait_ms`, then 409. A kernel that dies (out of memory, an evaluation that ignores its interrupt, `exit()`) ends the session: this and every later call answer 410 `session_lost` with the reason.",
    params(("session_id" = String, Path, description = "The session's id")),
    request_body = ExecBody,
    responses(
        (status = 200, description = "Evaluated (`status` says how)", body = ExecView),
        (status = 400, description = "Bad body", body = crate::error::ErrorBody),
        (status = 403, description = "Someone else's session", body = crate::error::ErrorBody),
        (status = 404, description = "No such session", body = crate::error::CodedError),
        (status = 409, description = "Another evaluation runs", body = crate::error::CodedError),
        (status = 410, description = "The session is lost (`message` says why)", body = crate::error::CodedError),
        (status = 429, description = "Too many starts of code by this caller (the limit every face that runs code shares)", body = crate::error::CodedError),
    )
)]
pub async fn exec(
    State(state): State<AppState>,
    identity: Identity,
    peer: crate::rate::Peer,
    headers: HeaderMap,
    path: SessionPath,
    admitted: Admitted<ApiError, Unresolved, JsonBody, Open>,
) -> Result<Response, ApiError> {
    let session = find(&state, &identity, &headers, &session_id(path)?, Control)?;
    let body: ExecBody = admitted.json()?;
    let timeout = match body.timeout {
        Some(0) => return Err(ApiError::BadRequest("timeout must be positive".into())),
        t => t.map(Duration::from_millis),
    };
    let (caller, _) = owner_of(&state, &identity, &headers)?;
    let verdict = crate::rate::starts_code(&state, &caller, peer.0).await?;
    let kernels = kernels(&state)?;
    let watch = crate::evals::start(
        &state, &headers, caller, kernels, session, body.code, timeout,
    )?;
    if !crate::sse::wants_events(&headers) {
        let result = crate::evals::finish(&watch).await?;
        let mut resp = Json(ExecView::of(watch.id(), &result)).into_response();
        crate::sse::insert_run_id(resp.headers_mut(), &watch);
        if let Some(v) = verdict {
            crate::rate::stamp(resp.headers_mut(), &v);
        }
        return Ok(resp);
    }
    let run = watch.handle().clone();
    let events = crate::evals::events(
        watch,
        |stream, text| {
            Event::default()
                .event(stream.as_str())
                .data(serde_json::json!({ "text": text }).to_string())
        },
        |run, answer| {
            vec![match answer {
                Ok(r) => Event::default()
                    .event("result")
                    .data(serde_json::to_string(&ExecView::of(run.id(), &r)).unwrap_or_default()),
                Err(e) => {
                    let (status, mut body) = e.status_and_body();
                    if let Some(obj) = body.as_object_mut() {
                        obj.insert("status".into(), status.as_u16().into());
                    }
                    Event::default().event("error").data(body.to_string())
                }
            }]
        },
    );
    let mut resp = crate::sse::response(events);
    crate::sse::insert_run_id(resp.headers_mut(), &run);
    Ok(resp)
}

/// `POST /sessions/{session_id}/interrupt`.
#[utoipa::path(
    post,
    path = "/sessions/{session_id}/interrupt",
    operation_id = "interruptSession",
    tag = "Sessions",
    summary = "Interrupt the evaluation in progress",
    description = "Raises `KeyboardInterrupt` (`js`: `Interrupted`) in the running evaluation (nothing if none runs); the kernel and its state stay.",
    params(("session_id" = String, Path, description = "The session's id")),
    responses(
        (status = 202, description = "Interrupt sent", body = SessionView),
        (status = 403, description = "Someone else's session", body = crate::error::ErrorBody),
        (status = 404, description = "No such session", body = crate::error::CodedError),
        (status = 410, description = "The session is lost", body = crate::error::CodedError),
    )
)]
pub async fn interrupt(
    State(state): State<AppState>,
    identity: Identity,
    headers: HeaderMap,
    path: SessionPath,
) -> Result<Response, ApiError> {
    let session = find(&state, &identity, &headers, &session_id(path)?, Control)?;
    let kernels = kernels(&state)?;
    kernels.interrupt(&session).await?;
    Ok((StatusCode::ACCEPTED, Json(view(&kernels.info(&session)))).into_response())
}

/// `GET /sessions/{session_id}/files`.
#[utoipa::path(
    get,
    path = "/sessions/{session_id}/files",
    operation_id = "listSessionFiles",
    tag = "Sessions",
    summary = "The session's workspace files",
    description = "Every regular file under `/mnt/data` (links and special files are neither listed nor followed).",
    params(("session_id" = String, Path, description = "The session's id")),
    responses(
        (status = 200, description = "OK", body = FileList),
        (status = 403, description = "Someone else's session", body = crate::error::ErrorBody),
        (status = 404, description = "No such session", body = crate::error::CodedError),
        (status = 410, description = "The session is lost", body = crate::error::CodedError),
    )
)]
pub async fn list_files(
    State(state): State<AppState>,
    identity: Identity,
    headers: HeaderMap,
    path: SessionPath,
) -> Result<Response, ApiError> {
    let session = find(&state, &identity, &headers, &session_id(path)?, Read)?;
    let files = kernels(&state)?.list_files(session).await?;
    let files = files
        .into_iter()
        .map(|(path, size)| WorkspaceFile { path, size })
        .collect();
    Ok(Json(FileList { files }).into_response())
}

/// `GET /sessions/{session_id}/files/{path}`.
#[utoipa::path(
    get,
    path = "/sessions/{session_id}/files/{*path}",
    operation_id = "getSessionFile",
    tag = "Sessions",
    summary = "Read a workspace file",
    params(
        ("session_id" = String, Path, description = "The session's id"),
        ("path" = String, Path, description = "Relative to `/mnt/data`"),
    ),
    responses(
        (status = 200, description = "The file's bytes", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 404, description = "No such session or file", body = crate::error::CodedError),
        (status = 410, description = "The session is lost", body = crate::error::CodedError),
    )
)]
pub async fn get_file(
    State(state): State<AppState>,
    identity: Identity,
    headers: HeaderMap,
    path: FilePath,
) -> Result<Response, ApiError> {
    let (id, rel) = file_path(path)?;
    let session = find(&state, &identity, &headers, &id, Read)?;
    let content_type = kiln_exec::content_type(rel.as_str());
    let name = rel.as_str().to_owned();
    let (file, size) = kernels(&state)?.read_file(session, rel).await?;
    Ok(file_response(file, size, &content_type, &name))
}

/// A workspace file's bytes, streamed, with its type and length, served
/// as LibreChat's `/download` serves a stored file (an attachment,
/// `nosniff`, a sandboxing CSP: [`crate::files::download_headers`]).
pub(crate) fn file_response(
    file: std::fs::File,
    size: u64,
    content_type: &str,
    name: &str,
) -> Response {
    let stream = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(file));
    let mut resp = Body::from_stream(stream).into_response();
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(content_type) {
        h.insert(CONTENT_TYPE, v);
    }
    h.insert(CONTENT_LENGTH, HeaderValue::from(size));
    crate::files::download_headers(h, name);
    resp
}

/// `PUT /sessions/{session_id}/files/{path}`.
#[utoipa::path(
    put,
    path = "/sessions/{session_id}/files/{*path}",
    operation_id = "putSessionFile",
    tag = "Sessions",
    summary = "Write a workspace file",
    description = "The body becomes the file (replacing one of that name; parent directories are created), owned by the kernel's user. At most `max_upload_mb`.",
    params(
        ("session_id" = String, Path, description = "The session's id"),
        ("path" = String, Path, description = "Relative to `/mnt/data`"),
    ),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses(
        (status = 204, description = "Written"),
        (status = 400, description = "Not an acceptable path", body = crate::error::ErrorBody),
        (status = 404, description = "No such session", body = crate::error::CodedError),
        (status = 410, description = "The session is lost", body = crate::error::CodedError),
        (status = 413, description = "Too large", body = crate::error::ErrorBody),
    )
)]
pub async fn put_file(
    State(state): State<AppState>,
    identity: Identity,
    headers: HeaderMap,
    path: FilePath,
    admitted: Admitted<ApiError, Unresolved, FileBody, Open>,
) -> Result<Response, ApiError> {
    let (id, rel) = file_path(path)?;
    let session = find(&state, &identity, &headers, &id, Control)?;
    kernels(&state)?
        .write_file(session, rel, admitted.body)
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `DELETE /sessions/{session_id}/files/{path}`.
#[utoipa::path(
    delete,
    path = "/sessions/{session_id}/files/{*path}",
    operation_id = "deleteSessionFile",
    tag = "Sessions",
    summary = "Delete a workspace file",
    params(
        ("session_id" = String, Path, description = "The session's id"),
        ("path" = String, Path, description = "Relative to `/mnt/data`"),
    ),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "No such session or file", body = crate::error::CodedError),
        (status = 410, description = "The session is lost", body = crate::error::CodedError),
    )
)]
pub async fn delete_file(
    State(state): State<AppState>,
    identity: Identity,
    headers: HeaderMap,
    path: FilePath,
) -> Result<Response, ApiError> {
    let (id, rel) = file_path(path)?;
    let session = find(&state, &identity, &headers, &id, Control)?;
    kernels(&state)?.delete_file(session, rel).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
