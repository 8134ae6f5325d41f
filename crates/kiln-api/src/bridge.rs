//! The sandbox bridge face (`/v1/sandbox`): the HTTP protocol of
//! Cloudflare's sandbox bridge, which `@librechat/agents`' `cloudflare-sandbox`
//! engine (`createCloudflareBridgeRuntime`) and the OpenAI Agents SDK speak.
//! Parsing and rendering only: a sandbox is an entry of
//! [`kiln_exec::sandboxes::Sandboxes`] (owner, caps, idle TTL) whose
//! `/workspace` is a persistent project; each command is a run of the one
//! registry in a fresh jail with the project bound at `/workspace`.
//!
//! | Route | What |
//! |---|---|
//! | `POST /sandbox` | a new sandbox → `{id}` |
//! | `DELETE /sandbox/{id}` | remove it and its `/workspace` → 204 |
//! | `GET /sandbox/{id}/running` | `{running: true}` while it exists |
//! | `POST /sandbox/{id}/exec` `{argv, cwd?, timeout_ms?}` | run `argv` (no shell unless `argv` names one) in `cwd` → event stream: `stdout`/`stderr` (base64), then `exit` `{exit_code}` or `error` `{error, code}` |
//! | `GET|PUT /sandbox/{id}/file/{path}` | a file of `/workspace`; `path` is absolute without its leading `/` (`workspace/main.py`) |
//!
//! Errors are the protocol's `{error, code}`. Another principal's sandbox
//! is not found (404), like one that never existed; a path or `cwd` outside
//! `/workspace` is 403 `invalid_request`, as the protocol says.

use std::convert::Infallible;
use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use kiln_core::access::Action::{self, Control, Read};
use kiln_core::access::Caller;
use kiln_core::outcome::{ExitStatus, RunStatus};
use kiln_core::{Language, RelPath};
use kiln_exec::projects::ProjectError;
use kiln_exec::sandboxes::{Sandbox, Sandboxes, SandboxesError};
use kiln_exec::{ExecError, ExecRequest, ExecResult, RunEvent, StartOptions, Stream, Watch};
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::ToSchema;

use crate::config::AppState;
use crate::error::ApiError;
use crate::identity::{Identity, authorize_owned, header_user_id, resolve_caller};
use crate::kit::{Admitted, FileBody, NoBody, Open, Unresolved};

/// Where a sandbox's project is in its jails.
pub const WORKSPACE: &str = "/workspace";

/// The program a command runs as: `cd` to the working directory (the first
/// argument), then `exec` the rest as given: bash parses none of the
/// caller's words.
const LAUNCH: &str = "cd -- \"$1\" || exit 1\nshift\nexec -- \"$@\"\n";

/// `POST /sandbox`'s answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct Created {
    /// The sandbox's id.
    pub id: String,
}

/// `POST /sandbox/{id}/exec`'s body.
#[derive(Debug, Deserialize, ToSchema)]
pub struct ExecBody {
    /// Program and arguments, run as given (`["bash", "-lc", "..."]` for a
    /// shell).
    pub argv: Vec<String>,
    /// Working directory, within `/workspace` (default `/workspace`).
    pub cwd: Option<String>,
    /// Milliseconds; lowers, never raises, the configured run timeout.
    pub timeout_ms: Option<u64>,
}

/// `GET /sandbox/{id}/running`'s answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct Running {
    pub running: bool,
}

/// `PUT /sandbox/{id}/file/{path}`'s answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct Written {
    pub ok: bool,
}

/// The protocol's error body.
#[derive(Debug, Serialize, ToSchema)]
pub struct BridgeErrorBody {
    pub error: String,
    /// `invalid_request`, `not_found`, `sandbox_limit`, ... (or the shared
    /// layer's code for authentication and rate limits).
    pub code: String,
}

/// A refusal of this face.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    /// Malformed input (400).
    #[error("{0}")]
    Invalid(String),
    /// A path or `cwd` outside `/workspace` (403, as the protocol says).
    #[error("{0}")]
    Outside(String),
    /// No such sandbox (or not the caller's), or no such file (404).
    #[error("{0}")]
    NotFound(&'static str),
    /// The registry refused (caps).
    #[error(transparent)]
    Sandboxes(SandboxesError),
    /// The command before this one in the sandbox held it past the wait
    /// (409).
    #[error("the sandbox is busy with another command")]
    Busy,
    /// The bridge is off on this node (503).
    #[error("the sandbox bridge is off on this node")]
    Unavailable,
    /// The sandbox's `/workspace` refused (its budget: 507) or failed.
    #[error(transparent)]
    Project(kiln_exec::projects::ProjectError),
    /// The shared layer refused (identity, body, rate limit, run start).
    #[error(transparent)]
    Api(Box<ApiError>),
}

impl From<ApiError> for BridgeError {
    fn from(e: ApiError) -> Self {
        BridgeError::Api(Box::new(e))
    }
}

impl From<SandboxesError> for BridgeError {
    fn from(e: SandboxesError) -> Self {
        match e {
            SandboxesError::NotFound => BridgeError::NotFound("no such sandbox"),
            e => BridgeError::Sandboxes(e),
        }
    }
}

impl IntoResponse for BridgeError {
    fn into_response(self) -> Response {
        let BridgeError::Api(e) = self else {
            return self.render();
        };
        shared(*e)
    }
}

impl BridgeError {
    fn render(self) -> Response {
        let (status, code) = match &self {
            BridgeError::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
            BridgeError::Outside(_) => (StatusCode::FORBIDDEN, "invalid_request"),
            BridgeError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            BridgeError::Sandboxes(SandboxesError::PrincipalCap(_)) => {
                (StatusCode::TOO_MANY_REQUESTS, "sandbox_limit")
            }
            BridgeError::Sandboxes(_) => (StatusCode::SERVICE_UNAVAILABLE, "sandboxes_full"),
            BridgeError::Busy => (StatusCode::CONFLICT, "sandbox_busy"),
            BridgeError::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "bridge_unavailable"),
            BridgeError::Project(ProjectError::OverBudget { .. }) => {
                (StatusCode::INSUFFICIENT_STORAGE, "storage_exceeded")
            }
            BridgeError::Project(ProjectError::BadPath(_)) => {
                (StatusCode::BAD_REQUEST, "invalid_request")
            }
            BridgeError::Project(e) => {
                tracing::error!(error = %e, "sandbox workspace failed");
                (StatusCode::INTERNAL_SERVER_ERROR, "internal")
            }
            BridgeError::Api(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        // a failure of the server is not described to the client
        let error = if status == StatusCode::INTERNAL_SERVER_ERROR {
            "internal error".to_owned()
        } else {
            self.to_string()
        };
        let body = BridgeErrorBody {
            error,
            code: code.to_owned(),
        };
        (status, Json(body)).into_response()
    }
}

/// A shared-layer refusal in the protocol's shape: its status and headers
/// (`Retry-After`, `RateLimit-*`) kept, its message and code as
/// `{error, code}`.
fn shared(e: ApiError) -> Response {
    let (status, body) = e.status_and_body();
    let text = |k: &str| body.get(k).and_then(|v| v.as_str()).map(str::to_owned);
    let (error, code) = match (text("error"), text("message")) {
        // a coded envelope: `{error: code, message}`
        (Some(code), Some(message)) => (message, code),
        (error, _) => (
            error.unwrap_or_else(|| e.to_string()),
            status
                .canonical_reason()
                .unwrap_or("error")
                .to_ascii_lowercase()
                .replace(' ', "_"),
        ),
    };
    let mut resp = e.into_response();
    resp.headers_mut()
        .remove(axum::http::header::CONTENT_LENGTH);
    *resp.body_mut() = Body::from(json!({ "error": error, "code": code }).to_string());
    resp
}

/// `path` (absolute, or relative to `/workspace`) as a path below
/// `/workspace`: `None` for `/workspace` itself. `.` and `..` are resolved
/// first, as POSIX does; anything that then is not below `/workspace` is
/// [`BridgeError::Outside`].
pub fn workspace_path(path: &str) -> Result<Option<RelPath>, BridgeError> {
    if path.is_empty() {
        return Err(BridgeError::Invalid("path must not be empty".into()));
    }
    let (mut parts, rest): (Vec<&str>, &str) = match path.strip_prefix('/') {
        Some(abs) => (Vec::new(), abs),
        None => (vec!["workspace"], path),
    };
    for seg in rest.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    let outside = || BridgeError::Outside(format!("{path:?} is outside {WORKSPACE}"));
    match parts.split_first() {
        Some((&"workspace", [])) => Ok(None),
        Some((&"workspace", below)) => RelPath::parse(&below.join("/"))
            .map(Some)
            .map_err(|e| BridgeError::Invalid(format!("path {path:?}: {e}"))),
        _ => Err(outside()),
    }
}

/// `Session-Id` (the protocol's execution sessions): checked, and otherwise
/// without effect, since every command starts in a fresh jail (shell state
/// never persists; `/workspace` always does).
fn check_session_header(headers: &HeaderMap) -> Result<(), BridgeError> {
    let Some(v) = headers.get("session-id") else {
        return Ok(());
    };
    let ok = v.to_str().is_ok_and(|s| {
        (1..=128).contains(&s.len())
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    });
    if ok {
        Ok(())
    } else {
        Err(BridgeError::Invalid(
            "Session-Id must match ^[a-zA-Z0-9._-]{1,128}$".into(),
        ))
    }
}

fn registry(state: &AppState) -> Result<&Sandboxes, BridgeError> {
    state
        .envs
        .sandboxes
        .as_ref()
        .ok_or(BridgeError::Unavailable)
}

fn caller(
    state: &AppState,
    identity: &Identity,
    headers: &HeaderMap,
) -> Result<Caller, BridgeError> {
    check_session_header(headers)?;
    Ok(resolve_caller(
        &state.config,
        identity,
        &[header_user_id(headers)?],
    )?)
}

/// The sandbox `id` if the caller may do `action` to it (the one access
/// rule); someone else's is not found, as a missing one. On a single node,
/// one its creator names after a restart is taken back ([`restore`]).
async fn find(
    state: &AppState,
    identity: &Identity,
    headers: &HeaderMap,
    id: Result<Path<String>, PathRejection>,
    action: Action,
) -> Result<(Caller, Arc<Sandbox>), BridgeError> {
    let caller = caller(state, identity, headers)?;
    let Path(id) = id.map_err(|_| BridgeError::Invalid("malformed sandbox id".into()))?;
    let id = kiln_core::Nanoid::parse(&id)
        .map_err(|_| BridgeError::Invalid("malformed sandbox id".into()))?;
    let sandbox = match registry(state)?.get(&id) {
        Err(SandboxesError::NotFound) => restore(state, &caller, id.clone()).await?,
        found => found?,
    };
    match authorize_owned(&state.config, &caller, action, &id, sandbox.owner()) {
        Ok(()) => Ok((caller, sandbox)),
        Err(ApiError::SessionForbidden { .. }) => Err(BridgeError::NotFound("no such sandbox")),
        Err(e) => Err(e.into()),
    }
}

/// The sandbox `id` of `caller`'s that this node's registry does not hold
/// — a restart forgot it — taken back when its project (on disk, the
/// caller's, since a sandbox's project is its creator's) was used within
/// the idle TTL; one idle longer is removed with its project, as the sweep
/// would have. Several nodes keep 404: which node a sandbox lives on is
/// recorded when it is made, and a node taking one back on its own could
/// serve it next to another node doing the same.
async fn restore(
    state: &AppState,
    caller: &Caller,
    id: kiln_core::Nanoid,
) -> Result<Arc<Sandbox>, BridgeError> {
    let not_found = || BridgeError::NotFound("no such sandbox");
    let sandboxes = registry(state)?;
    if state.cluster.is_some() {
        return Err(not_found());
    }
    let name = Sandbox::project_name_of(&id);
    let Some(opened) = project::last_opened(state, caller, &name).await? else {
        return Err(not_found());
    };
    let idle = std::time::SystemTime::now()
        .duration_since(opened)
        .unwrap_or_default();
    if idle >= sandboxes.config().idle_ttl {
        project::remove_named(state, caller, &name).await?;
        return Err(not_found());
    }
    let sandbox = sandboxes.restore(id, caller)?;
    tracing::info!(sandbox = %sandbox.id(), "bridge sandbox taken back after a restart");
    Ok(sandbox)
}

type IdPath = Result<Path<String>, PathRejection>;
type FilePath = Result<Path<(String, String)>, PathRejection>;

/// `POST /sandbox`.
#[utoipa::path(
    post,
    path = "/sandbox",
    operation_id = "createSandbox",
    tag = "Sandbox bridge",
    summary = "Create a sandbox",
    description = "A new sandbox of the caller's: a persistent `/workspace` (its own storage budget) in which each `exec` runs in a fresh jail. It is removed after `bridge_idle_ttl_secs` unused, or by `DELETE`. At most `bridge_sandboxes_per_user` per principal.",
    responses(
        (status = 200, description = "Created", body = Created),
        (status = 429, description = "The caller holds the most sandboxes allowed", body = BridgeErrorBody),
        (status = 503, description = "The node holds the most sandboxes it allows", body = BridgeErrorBody),
    )
)]
pub async fn create(
    State(state): State<AppState>,
    identity: Identity,
    headers: HeaderMap,
    _: Admitted<BridgeError, Unresolved, NoBody>,
) -> Result<Response, BridgeError> {
    let caller = caller(&state, &identity, &headers)?;
    let sandboxes = registry(&state)?;
    let sandbox = sandboxes.create(&caller)?;
    if let Err(e) = project::open(&state, &sandbox).await {
        let _ = sandboxes.remove(sandbox.id());
        return Err(e);
    }
    let id = sandbox.id().as_str().to_owned();
    Ok(Json(Created { id }).into_response())
}

/// `DELETE /sandbox/{id}`.
#[utoipa::path(
    delete,
    path = "/sandbox/{id}",
    operation_id = "deleteSandbox",
    tag = "Sandbox bridge",
    summary = "Delete a sandbox",
    description = "Removes the sandbox and its `/workspace`; a command running in it is left to end (its jail is its own).",
    params(("id" = String, Path, description = "The sandbox's id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "No such sandbox", body = BridgeErrorBody),
    )
)]
pub async fn delete(
    State(state): State<AppState>,
    identity: Identity,
    headers: HeaderMap,
    id: IdPath,
) -> Result<Response, BridgeError> {
    let (_, sandbox) = find(&state, &identity, &headers, id, Control).await?;
    registry(&state)?.remove(sandbox.id())?;
    project::remove(&state, &sandbox).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /sandbox/{id}/running`.
#[utoipa::path(
    get,
    path = "/sandbox/{id}/running",
    operation_id = "sandboxRunning",
    tag = "Sandbox bridge",
    summary = "Whether a sandbox is alive",
    description = "`{running: true}` while the sandbox exists (asking counts as using it); an unknown or expired one is 404.",
    params(("id" = String, Path, description = "The sandbox's id")),
    responses(
        (status = 200, description = "Alive", body = Running),
        (status = 404, description = "No such sandbox", body = BridgeErrorBody),
    )
)]
pub async fn running(
    State(state): State<AppState>,
    identity: Identity,
    headers: HeaderMap,
    id: IdPath,
) -> Result<Response, BridgeError> {
    find(&state, &identity, &headers, id, Read).await?;
    Ok(Json(Running { running: true }).into_response())
}

/// `POST /sandbox/{id}/exec`.
#[utoipa::path(
    post,
    path = "/sandbox/{id}/exec",
    operation_id = "execInSandbox",
    tag = "Sandbox bridge",
    summary = "Run a command in a sandbox",
    description = "Runs `argv` as given (no shell unless `argv` names one) in a fresh jail whose `/workspace` is the sandbox's, starting in `cwd`. A run of the one registry: rate-limited, audited, cancelled when the client goes away, visible at `/v1/runs/{run_id}` (`X-Kiln-Run-Id`). The answer is Server-Sent Events: `stdout` and `stderr` (base64 data) as the command writes, then `exit` (`{\"exit_code\"}`; a signal `n` is `128+n`) or `error` (`{\"error\", \"code\"}`: `exec_timeout` past the timeout, `exec_error` when the run could not end normally).",
    params(("id" = String, Path, description = "The sandbox's id")),
    request_body = ExecBody,
    responses(
        (status = 200, description = "The event stream", content_type = "text/event-stream", body = String),
        (status = 400, description = "Bad body", body = BridgeErrorBody),
        (status = 403, description = "`cwd` is outside `/workspace`", body = BridgeErrorBody),
        (status = 404, description = "No such sandbox", body = BridgeErrorBody),
        (status = 429, description = "Too many starts of code by this caller", body = BridgeErrorBody),
    )
)]
pub async fn exec(
    State(state): State<AppState>,
    identity: Identity,
    peer: crate::rate::Peer,
    headers: HeaderMap,
    id: IdPath,
    admitted: Admitted<BridgeError>,
) -> Result<Response, BridgeError> {
    let (caller, sandbox) = find(&state, &identity, &headers, id, Control).await?;
    let body: ExecBody = admitted.json()?;
    if body.argv.is_empty() || body.argv[0].is_empty() {
        return Err(BridgeError::Invalid(
            "argv must be a non-empty array".into(),
        ));
    }
    if body.argv.iter().any(|a| a.contains('\0')) {
        return Err(BridgeError::Invalid("argv must not contain NUL".into()));
    }
    if body.timeout_ms == Some(0) {
        return Err(BridgeError::Invalid("timeout_ms must be positive".into()));
    }
    let cwd = match workspace_path(body.cwd.as_deref().unwrap_or(WORKSPACE))? {
        None => WORKSPACE.to_owned(),
        Some(rel) => format!("{WORKSPACE}/{rel}"),
    };
    if let Some(retry_after) = state.runs.saturated() {
        return Err(ApiError::Exec(ExecError::Busy { retry_after }).into());
    }
    let verdict = crate::rate::starts_code(&state, &caller, peer.0).await?;
    let bash =
        Language::shell().ok_or_else(|| BridgeError::Invalid("bash is not available".into()))?;
    let req = ExecRequest {
        lang: bash,
        code: LAUNCH.to_owned(),
        args: std::iter::once(cwd).chain(body.argv).collect(),
        files: Vec::new(),
        timeout_ms: body.timeout_ms,
        outputs: kiln_exec::Outputs::NewSession,
        project: Some(project::binding(&state, &sandbox).await?),
    };
    let watch = state
        .runs
        .start(
            caller,
            req,
            StartOptions {
                detach: false,
                request_id: crate::middleware::request_id(&headers),
            },
        )
        .map_err(ApiError::Exec)?;
    let mut resp = stream(&state, sandbox, watch).await?;
    if let Some(v) = verdict {
        crate::rate::stamp(resp.headers_mut(), &v);
    }
    Ok(resp)
}

/// The run's output as the protocol's events. A run that fails before its
/// first event (a refused start) answers as an HTTP error instead.
async fn stream(
    state: &AppState,
    sandbox: Arc<Sandbox>,
    watch: Watch,
) -> Result<Response, BridgeError> {
    let run = watch.handle().clone();
    let mut sub = run.subscribe();
    let first = sub.next().await;
    if let Some(RunEvent::Done(outcome)) = &first
        && let Err(e) = &**outcome
        && !matches!(e, ExecError::SandboxFailed(_) | ExecError::Internal(_))
    {
        return Err(ApiError::Exec(e.clone()).into());
    }
    let registry = registry(state)?.clone();
    let events = futures::stream::unfold(
        (Some(first), sub, Some((watch, sandbox, registry))),
        |(mut pending, mut sub, mut keep)| async move {
            loop {
                keep.as_ref()?;
                let ev = match pending.take() {
                    Some(ev) => ev,
                    None => sub.next().await,
                };
                let out = match ev {
                    Some(RunEvent::Output { stream, text }) => output(stream, &text),
                    Some(RunEvent::Done(outcome)) => {
                        if let Some((_, sandbox, registry)) = keep.take() {
                            registry.touch(&sandbox);
                        }
                        last(&outcome)
                    }
                    // the end without a result: the run was dropped
                    None => {
                        keep = None;
                        error_event("the run ended without a result", "exec_error")
                    }
                    Some(_) => continue,
                };
                return Some((Ok::<_, Infallible>(out), (None, sub, keep)));
            }
        },
    );
    let mut resp = crate::sse::response(events);
    crate::sse::insert_run_id(resp.headers_mut(), &run);
    Ok(resp)
}

fn output(stream: Stream, text: &str) -> Event {
    let name = match stream {
        Stream::Stdout => "stdout",
        Stream::Stderr => "stderr",
    };
    Event::default()
        .event(name)
        .data(base64::engine::general_purpose::STANDARD.encode(text.as_bytes()))
}

fn error_event(error: &str, code: &str) -> Event {
    Event::default()
        .event("error")
        .data(json!({ "error": error, "code": code }).to_string())
}

/// The terminal event of a run that ended.
fn last(outcome: &Result<ExecResult, ExecError>) -> Event {
    match outcome {
        Ok(r) if r.status == Some(RunStatus::Timeout) => error_event(
            &format!("the command timed out after {} ms", r.wall_time.as_millis()),
            "exec_timeout",
        ),
        Ok(r) if r.cancelled => error_event("the command was cancelled", "exec_cancelled"),
        // exited 0, yet failed: its `/workspace` changes were refused (over
        // the budget) and discarded
        Ok(r) if r.exit == ExitStatus::Code(0) && r.status == Some(RunStatus::RuntimeError) => {
            error_event(
                r.message.as_deref().unwrap_or("the command failed"),
                "exec_error",
            )
        }
        Ok(r) => {
            let code = match r.exit {
                ExitStatus::Code(c) => c,
                ExitStatus::Signal(s) => 128 + s,
            };
            Event::default()
                .event("exit")
                .data(json!({ "exit_code": code }).to_string())
        }
        Err(e) => error_event(&e.to_string(), "exec_error"),
    }
}

/// The `/workspace` path of a file route (`workspace/...`, no leading `/`).
fn file_path(
    path: FilePath,
) -> Result<(Result<Path<String>, PathRejection>, RelPath), BridgeError> {
    let Path((id, raw)) = path.map_err(|_| BridgeError::Invalid("malformed path".into()))?;
    if raw.is_empty() {
        return Err(BridgeError::Invalid("file path must not be empty".into()));
    }
    let rel = workspace_path(&format!("/{raw}"))?
        .ok_or_else(|| BridgeError::Invalid(format!("{WORKSPACE} is a directory")))?;
    Ok((Ok(Path(id)), rel))
}

/// `GET /sandbox/{id}/file/{path}`.
#[utoipa::path(
    get,
    path = "/sandbox/{id}/file/{*path}",
    operation_id = "readSandboxFile",
    tag = "Sandbox bridge",
    summary = "Read a file of a sandbox",
    description = "The bytes of the regular file `/{path}`, which must be below `/workspace` once `.` and `..` are resolved. Links are not followed (one a command planted is not found).",
    params(
        ("id" = String, Path, description = "The sandbox's id"),
        ("path" = String, Path, description = "Absolute path without the leading `/`, e.g. `workspace/main.py`"),
    ),
    responses(
        (status = 200, description = "The file's bytes", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 400, description = "Not an acceptable path", body = BridgeErrorBody),
        (status = 403, description = "Outside `/workspace`", body = BridgeErrorBody),
        (status = 404, description = "No such sandbox or file", body = BridgeErrorBody),
    )
)]
pub async fn read_file(
    State(state): State<AppState>,
    identity: Identity,
    headers: HeaderMap,
    path: FilePath,
) -> Result<Response, BridgeError> {
    let (id, rel) = file_path(path)?;
    let (_, sandbox) = find(&state, &identity, &headers, id, Read).await?;
    let bytes = project::read(&state, &sandbox, &rel).await?;
    let mut resp = Body::from(bytes).into_response();
    let h = resp.headers_mut();
    h.insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/octet-stream"),
    );
    crate::files::download_headers(h, rel.file_name());
    Ok(resp)
}

/// `PUT /sandbox/{id}/file/{path}`.
#[utoipa::path(
    put,
    path = "/sandbox/{id}/file/{*path}",
    operation_id = "writeSandboxFile",
    tag = "Sandbox bridge",
    summary = "Write a file of a sandbox",
    description = "The body becomes the file `/{path}` (below `/workspace`; parent directories created; a file or link of that name replaced, never followed). At most `max_upload_mb`, within the sandbox's storage budget.",
    params(
        ("id" = String, Path, description = "The sandbox's id"),
        ("path" = String, Path, description = "Absolute path without the leading `/`, e.g. `workspace/main.py`"),
    ),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses(
        (status = 200, description = "Written", body = Written),
        (status = 400, description = "Not an acceptable path", body = BridgeErrorBody),
        (status = 403, description = "Outside `/workspace`", body = BridgeErrorBody),
        (status = 404, description = "No such sandbox", body = BridgeErrorBody),
        (status = 413, description = "Too large", body = BridgeErrorBody),
        (status = 507, description = "Past the sandbox's storage budget", body = BridgeErrorBody),
    )
)]
pub async fn write_file(
    State(state): State<AppState>,
    identity: Identity,
    headers: HeaderMap,
    path: FilePath,
    admitted: Admitted<BridgeError, Unresolved, FileBody, Open>,
) -> Result<Response, BridgeError> {
    let (id, rel) = file_path(path)?;
    let (_, sandbox) = find(&state, &identity, &headers, id, Control).await?;
    project::write(&state, &sandbox, &rel, admitted.body.to_vec()).await?;
    Ok(Json(Written { ok: true }).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(p: &str) -> Option<String> {
        workspace_path(p)
            .unwrap_or_else(|e| panic!("{p}: {e}"))
            .map(|r| r.as_str().to_owned())
    }

    #[test]
    fn paths_below_workspace_resolve_to_relative_names() {
        assert_eq!(rel("/workspace"), None);
        assert_eq!(rel("/workspace/"), None);
        assert_eq!(
            rel("/workspace/src/main.py").as_deref(),
            Some("src/main.py")
        );
        assert_eq!(rel("/workspace/./a//b/../c").as_deref(), Some("a/c"));
        assert_eq!(rel("src/x.js").as_deref(), Some("src/x.js"));
        assert_eq!(rel(".").as_deref(), None);
        assert_eq!(rel("/workspace/../workspace/a").as_deref(), Some("a"));
    }

    #[test]
    fn paths_that_resolve_outside_workspace_are_refused() {
        for p in [
            "/",
            "/etc/passwd",
            "/workspace/../etc/passwd",
            "/workspace/../../etc",
            "..",
            "../workspace2/x",
            "/workspacefoo/x",
            "/tmp",
            "/mnt/data/x",
        ] {
            assert!(
                matches!(workspace_path(p), Err(BridgeError::Outside(_))),
                "{p} was not refused as outside"
            );
        }
    }

    #[test]
    fn empty_and_unacceptable_names_are_invalid() {
        assert!(matches!(workspace_path(""), Err(BridgeError::Invalid(_))));
        assert!(matches!(
            workspace_path("/workspace/a\u{0}b"),
            Err(BridgeError::Invalid(_))
        ));
    }

    #[test]
    fn session_id_header_is_checked() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert("session-id", v.parse().expect("header"));
            check_session_header(&h)
        };
        assert!(check_session_header(&HeaderMap::new()).is_ok());
        assert!(with("sess_abc-1.2").is_ok());
        assert!(with("a b").is_err());
        assert!(with(&"x".repeat(129)).is_err());
    }

    #[test]
    fn a_signal_is_128_plus_its_number_and_a_timeout_is_an_error_event() {
        let result = |exit, status| ExecResult {
            session_id: kiln_core::Nanoid::random(),
            stdout: String::new(),
            stderr: String::new(),
            files: Vec::new(),
            deleted_files: Vec::new(),
            truncation: None,
            delivery: None,
            exit,
            status,
            message: None,
            wall_time: std::time::Duration::from_millis(1500),
            usage: Default::default(),
            cancelled: false,
            evaluation: None,
        };
        let text = |e: Event| format!("{e:?}");
        assert!(
            text(last(&Ok(result(
                ExitStatus::Signal(9),
                Some(RunStatus::Signal)
            ))))
            .contains("137")
        );
        assert!(
            text(last(&Ok(result(
                ExitStatus::Code(3),
                Some(RunStatus::RuntimeError)
            ))))
            .contains("exit_code")
        );
        let timeout = text(last(&Ok(result(
            ExitStatus::Signal(9),
            Some(RunStatus::Timeout),
        ))));
        assert!(timeout.contains("exec_timeout"), "{timeout}");
    }
}

/// The sandbox's `/workspace`: a project of the one primitive
/// ([`kiln_exec::projects`]), its creator's, named after the sandbox.
mod project {
    use std::time::Duration;

    use kiln_core::RelPath;
    use kiln_core::access::Caller;
    use kiln_exec::projects::{Project, ProjectBinding, ProjectError, Projects};
    use kiln_exec::sandboxes::Sandbox;

    use super::BridgeError;
    use crate::config::AppState;

    /// How long a command (or a file write) waits for the command before it
    /// in the same sandbox; past it, 409.
    const TURN_WAIT: Duration = Duration::from_secs(60);

    /// Largest file the file route reads.
    pub(super) const MAX_READ_BYTES: u64 = 256 * 1024 * 1024;

    fn projects(state: &AppState) -> Result<&Projects, BridgeError> {
        state.envs.projects.as_ref().ok_or(BridgeError::Unavailable)
    }

    fn failed(e: ProjectError) -> BridgeError {
        BridgeError::Project(e)
    }

    pub(super) async fn open(state: &AppState, sandbox: &Sandbox) -> Result<Project, BridgeError> {
        projects(state)?
            .open(sandbox.creator(), &sandbox.project_name())
            .await
            .map_err(failed)
    }

    pub(super) async fn remove(state: &AppState, sandbox: &Sandbox) -> Result<(), BridgeError> {
        remove_named(state, sandbox.creator(), &sandbox.project_name()).await
    }

    /// Removes `creator`'s project `name` (a sandbox's, by its name).
    pub(super) async fn remove_named(
        state: &AppState,
        creator: &Caller,
        name: &str,
    ) -> Result<(), BridgeError> {
        projects(state)?
            .delete(creator, name)
            .await
            .map(drop)
            .map_err(failed)
    }

    /// When `creator`'s project `name` was last opened, if it exists.
    pub(super) async fn last_opened(
        state: &AppState,
        creator: &Caller,
        name: &str,
    ) -> Result<Option<std::time::SystemTime>, BridgeError> {
        projects(state)?
            .last_opened(creator, name)
            .await
            .map_err(failed)
    }

    /// The project bound for one run, its turn taken.
    pub(super) async fn binding(
        state: &AppState,
        sandbox: &Sandbox,
    ) -> Result<ProjectBinding, BridgeError> {
        let project = open(state, sandbox).await?;
        let projects = projects(state)?.clone();
        ProjectBinding::take(projects, project, &state.sessions, TURN_WAIT, Vec::new())
            .await
            .map_err(|_| BridgeError::Busy)
    }

    pub(super) async fn read(
        state: &AppState,
        sandbox: &Sandbox,
        rel: &RelPath,
    ) -> Result<Vec<u8>, BridgeError> {
        let project = open(state, sandbox).await?;
        projects(state)?
            .read(&project, rel.as_str(), MAX_READ_BYTES)
            .await
            .map_err(failed)?
            .ok_or(BridgeError::NotFound("no such file"))
    }

    pub(super) async fn write(
        state: &AppState,
        sandbox: &Sandbox,
        rel: &RelPath,
        bytes: Vec<u8>,
    ) -> Result<(), BridgeError> {
        let binding = binding(state, sandbox).await?;
        binding
            .projects
            .write(&binding.project, rel.as_str(), bytes)
            .await
            .map_err(failed)
    }
}
