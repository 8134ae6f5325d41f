//! Seed 000's face, under `/librechat`: the "code-interpreter-proxy" API
//! (`POST /runs`, `POST|GET /files`, `GET|DELETE /files/{file_id}`,
//! `GET /health`) with its own JSON shapes and error envelope
//! (`{"detail": ..., "error": <code>}`, FastAPI's `detail`).
//!
//! A `session_id` names a workspace of files ([`FileSessions`]): uploads go
//! into it, a run sees every file of it (or the ones it names in `files`),
//! and the run's new and changed files land in it, replacing what they
//! changed. A file id is 42 characters: the session's storage id and the
//! object's id, so any node can serve it without a lookup table.
//!
//! Everything below the face is shared with LibreChat's routes: runs start
//! in the same registry (streaming, `/v1/runs/{run_id}`, cancel), files live
//! in the same store, and reads are checked with the same access rule.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::multipart::MultipartRejection;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Multipart, Path, Query, State};
use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::TryStreamExt as _;
use futures::future::BoxFuture;
use kiln_core::access::Claim;
use kiln_core::outcome::{ExitStatus, RunStatus, signal_name};
use kiln_core::{Language, Nanoid, RelPath};
use kiln_exec::sessions::OpenError;
use kiln_exec::{
    ExecError, ExecRequest, ExecResult, InputFile, OutputFile, Outputs, RunHandle, StartOptions,
};
use kiln_store::{NewObject, ObjectMeta, StoreError};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::{IntoParams, ToSchema};

use crate::codeapi::files::{file_response, iso8601};
use crate::config::AppState;
use crate::error::{ApiError, retry_seconds};
use crate::identity::{Caller, Identity, authorize, header_user_id, resolve_caller};
use crate::kit::{Admitted, Queues, RawBody};
use crate::sse::{self, Early, Face};

/// An error of this face: `{"detail": <message>, "error": <code>}`.
#[derive(Debug)]
pub struct ProxyError {
    status: StatusCode,
    code: &'static str,
    detail: String,
    retry_after: Option<u64>,
}

/// The body of every error of this face.
#[derive(Debug, Serialize, ToSchema)]
pub struct ProxyErrorBody {
    /// What went wrong, for people (names the field for a bad body).
    pub detail: String,
    /// For programs: `unauthorized`, `bad_request`, `not_found`,
    /// `timeout`, `rate_limited`, `payload_too_large`, `unavailable`,
    /// `internal_error`.
    pub error: String,
    /// With `rate_limited`: seconds to wait (also in `Retry-After`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<u64>,
}

impl ProxyError {
    fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> ProxyError {
        ProxyError {
            status,
            code,
            detail: detail.into(),
            retry_after: None,
        }
    }

    fn bad(detail: impl Into<String>) -> ProxyError {
        ProxyError::new(StatusCode::BAD_REQUEST, "bad_request", detail)
    }

    fn not_found(detail: impl Into<String>) -> ProxyError {
        ProxyError::new(StatusCode::NOT_FOUND, "not_found", detail)
    }

    fn internal(what: impl std::fmt::Display) -> ProxyError {
        tracing::error!(error = %what, "seed-000 request failed");
        ProxyError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            "Internal server error",
        )
    }

    fn body(&self) -> ProxyErrorBody {
        ProxyErrorBody {
            detail: self.detail.clone(),
            error: self.code.to_owned(),
            retry_after_seconds: self.retry_after,
        }
    }
}

impl IntoResponse for ProxyError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            resp.headers_mut().insert(RETRY_AFTER, HeaderValue::from(s));
        }
        resp
    }
}

impl From<ExecError> for ProxyError {
    fn from(e: ExecError) -> ProxyError {
        match e {
            ExecError::BadRequest(m) => ProxyError::bad(m),
            ExecError::Unauthorized => {
                ProxyError::bad("files: a file is not readable by the caller")
            }
            ExecError::RateLimited { retry_after } => {
                let secs = retry_seconds(retry_after);
                ProxyError {
                    retry_after: Some(secs),
                    ..ProxyError::new(
                        StatusCode::TOO_MANY_REQUESTS,
                        "rate_limited",
                        format!("Too many runs. Please retry in {secs} seconds."),
                    )
                }
            }
            ExecError::Busy { retry_after } => {
                let secs = retry_seconds(retry_after);
                ProxyError {
                    retry_after: Some(secs),
                    ..ProxyError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "unavailable",
                        format!("Too many runs waiting. Please retry in {secs} seconds."),
                    )
                }
            }
            ExecError::ShuttingDown => ProxyError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "Service is shutting down",
            ),
            ExecError::SandboxSetup(_) => ProxyError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "Sandbox setup failed",
            ),
            ExecError::SandboxFailed(m) => {
                tracing::warn!(error = %m, "sandbox execution failed");
                ProxyError::new(
                    StatusCode::BAD_GATEWAY,
                    "unavailable",
                    "Sandbox execution failed",
                )
            }
            ExecError::Cancelled => ProxyError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "Request cancelled",
            ),
            // seed 000 evaluates in no kernel
            e @ (ExecError::Storage(_) | ExecError::Internal(_) | ExecError::Kernel(_)) => {
                ProxyError::internal(e)
            }
        }
    }
}

impl From<ApiError> for ProxyError {
    fn from(e: ApiError) -> ProxyError {
        let (status, body) = e.status_and_body();
        if status.is_server_error() {
            return ProxyError::internal(e);
        }
        let text = body
            .get("message")
            .or_else(|| body.get("error"))
            .and_then(Value::as_str)
            .unwrap_or("Bad request")
            .to_owned();
        let code = match status {
            StatusCode::UNAUTHORIZED => "unauthorized",
            StatusCode::NOT_FOUND => "not_found",
            StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
            _ => "bad_request",
        };
        ProxyError::new(status, code, text)
    }
}

impl From<OpenError> for ProxyError {
    fn from(e: OpenError) -> ProxyError {
        match e {
            OpenError::BadName(b) => ProxyError::bad(b.to_string()),
            e => ProxyError::internal(e),
        }
    }
}

/// The 401 of this face (authentication failed with `e`).
/// Kiln's credential check for seed 000's routes, answered in that face's envelope.
pub async fn auth(
    axum::extract::State(state): axum::extract::State<AppState>,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    match crate::middleware::authenticate(&state, &req) {
        Ok(identity) => {
            req.extensions_mut().insert(identity);
            next.run(req).await
        }
        Err(e) => {
            let sent = crate::middleware::key_sent(&req);
            unauthorized(e, sent)
        }
    }
}

pub fn unauthorized(e: ApiError, key_sent: bool) -> Response {
    let (status, detail) = match e {
        ApiError::Unauthenticated(_) if key_sent => (StatusCode::UNAUTHORIZED, "Invalid API key"),
        ApiError::Unauthenticated(_) => (
            StatusCode::UNAUTHORIZED,
            "Missing API key (send it in the x-api-key header)",
        ),
        ApiError::BearerRequired => (StatusCode::UNAUTHORIZED, "Bearer token is required"),
        ApiError::JwtMisconfigured => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "CodeAPI JWT auth is misconfigured",
        ),
        _ => (StatusCode::UNAUTHORIZED, "Invalid bearer token"),
    };
    let code = if status.is_server_error() {
        "internal_error"
    } else {
        "unauthorized"
    };
    ProxyError::new(status, code, detail).into_response()
}

/// The caller: the `User-Id` header, else anonymous (the API key alone
/// identifies nobody).
fn caller(
    state: &AppState,
    identity: &Identity,
    headers: &HeaderMap,
) -> Result<Caller, ProxyError> {
    Ok(resolve_caller(
        &state.config,
        identity,
        &[header_user_id(headers).map_err(ProxyError::from)?],
    )?)
}

// ---- file ids --------------------------------------------------------------

/// `<storage session><object>`: 42 characters.
fn file_id(session: &Nanoid, file: &Nanoid) -> String {
    format!("{session}{file}")
}

fn parse_file_id(id: &str) -> Option<(Nanoid, Nanoid)> {
    let n = kiln_core::id::NANOID_LEN;
    if id.len() != 2 * n || !id.is_ascii() {
        return None;
    }
    Some((Nanoid::parse(&id[..n]).ok()?, Nanoid::parse(&id[n..]).ok()?))
}

/// A stored file, as this face lists it.
#[derive(Debug, Serialize, ToSchema)]
pub struct FileInfo {
    /// The file's id (42 characters).
    pub id: String,
    /// Its path in the session's workspace (may contain `/`).
    pub name: String,
    pub size_bytes: u64,
    pub mime_type: String,
    /// RFC 3339 UTC.
    pub created_at: String,
}

impl FileInfo {
    fn of(m: &ObjectMeta) -> FileInfo {
        FileInfo {
            id: file_id(&m.session_id, &m.file_id),
            name: m.name.clone(),
            size_bytes: m.size,
            mime_type: m.content_type.clone(),
            created_at: iso8601(m.created_at_ms),
        }
    }
}

/// The object `id` names, if the caller may read it (anything else is
/// "not found": ids are not probed).
async fn readable(state: &AppState, caller: &Caller, id: &str) -> Result<ObjectMeta, ProxyError> {
    let missing = || ProxyError::not_found(format!("File {id} not found"));
    let (sid, fid) = parse_file_id(id).ok_or_else(missing)?;
    let session = state
        .store
        .session(&sid)
        .await
        .map_err(ProxyError::internal)?
        .ok_or_else(missing)?;
    authorize(&state.config, caller, &Claim::none(), &sid, &session.key).map_err(|_| missing())?;
    state
        .store
        .object(&sid, &fid)
        .await
        .map_err(ProxyError::internal)?
        .ok_or_else(missing)
}

// ---- runs --------------------------------------------------------------------

/// `POST /librechat/runs`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct RunBody {
    /// The session (one per chat): its files are the run's workspace.
    pub session_id: String,
    /// `python`, `javascript`, `java`, `cpp`, `go`, `r`, or any other
    /// language name or alias Kiln runs (`typescript`, `c`, `php`, `rust`,
    /// `d`, `fortran`, `bash`, `py`, `js`, ...).
    pub language: String,
    pub code: String,
    /// Command-line arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Wall-time limit; lowers (never raises) the server's.
    pub timeout_seconds: Option<f64>,
    /// Ids of the session's files to place in the workspace (at most 10 by
    /// default); absent: every file of the session.
    pub files: Option<Vec<String>>,
}

/// CPU, memory and time of a run (its compile and run steps together).
#[derive(Debug, Serialize, ToSchema)]
pub struct RunStats {
    /// User + system time of every process (null where the host cannot
    /// account it).
    pub cpu_time_seconds: Option<f64>,
    /// Peak memory.
    pub memory_bytes: Option<u64>,
    pub wall_time_seconds: f64,
}

/// A run's answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunResponse {
    /// Also `GET /v1/runs/{run_id}`.
    pub run_id: String,
    pub session_id: String,
    /// The language's common name (`python`, ...).
    pub language: String,
    pub stdout: String,
    pub stderr: String,
    /// The exit code; 128 + the signal number when killed by a signal.
    pub exit_code: i32,
    /// The terminating signal, when killed by one (`SIGKILL`, ...).
    pub signal: Option<String>,
    /// Why it stopped, when Kiln stopped it: `TO` timeout, `OL`/`EL`
    /// output cap, `SG` signal (out of memory, cancelled), `RE` non-zero exit.
    pub status: Option<String>,
    pub message: Option<String>,
    pub stats: RunStats,
    /// New and changed files, now in the session.
    pub files: Vec<FileInfo>,
    /// With 408: `timeout`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// With 408: what happened.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// How this face shows runs.
struct Proxy {
    state: AppState,
    session_name: String,
    session: Nanoid,
    language: &'static str,
}

impl Proxy {
    async fn response(&self, run: &RunHandle, r: &ExecResult) -> RunResponse {
        let mut files = Vec::new();
        for f in r.files.iter().filter(|f| !f.inherited) {
            if let Ok(Some(m)) = self.state.store.object(&f.storage_session_id, &f.id).await {
                files.push(FileInfo::of(&m));
            }
        }
        let (exit_code, signal) = match r.exit {
            ExitStatus::Code(c) => (c, None),
            ExitStatus::Signal(s) => (128 + s, Some(signal_name(s))),
        };
        let total = r.usage.total();
        let timed_out = r.status == Some(RunStatus::Timeout);
        RunResponse {
            run_id: run.id().as_str().to_owned(),
            session_id: self.session_name.clone(),
            language: self.language.to_owned(),
            stdout: r.stdout.clone(),
            stderr: r.stderr.clone(),
            exit_code,
            signal,
            status: r.status.map(|s| s.code().to_owned()),
            message: r.message.clone(),
            stats: RunStats {
                cpu_time_seconds: total.cpu.map(|d| d.as_secs_f64()),
                memory_bytes: total.memory_peak,
                wall_time_seconds: total.wall.as_secs_f64(),
            },
            files,
            error: timed_out.then(|| "timeout".to_owned()),
            detail: timed_out.then(|| {
                format!(
                    "Execution timed out ({})",
                    r.message.as_deref().unwrap_or("time limit exceeded")
                )
            }),
        }
    }
}

impl Face for Proxy {
    fn result<'a>(&'a self, run: &'a RunHandle, r: &'a ExecResult) -> BoxFuture<'a, Value> {
        Box::pin(
            async move { serde_json::to_value(self.response(run, r).await).unwrap_or_default() },
        )
    }

    fn error(&self, e: &ExecError) -> (StatusCode, Value) {
        let p = ProxyError::from(e.clone());
        (p.status, serde_json::to_value(p.body()).unwrap_or_default())
    }

    fn file<'a>(&'a self, _run: &'a RunHandle, f: &'a OutputFile) -> BoxFuture<'a, Value> {
        Box::pin(async move {
            match self.state.store.object(&f.storage_session_id, &f.id).await {
                Ok(Some(m)) => serde_json::to_value(FileInfo::of(&m)).unwrap_or_default(),
                _ => json!({ "id": file_id(&f.storage_session_id, &f.id), "name": f.name }),
            }
        })
    }
}

#[utoipa::path(
    post,
    path = "/librechat/runs",
    operation_id = "seedRun",
    tag = "Seed 000",
    summary = "Run code in a session",
    description = "Runs `code` with the session's files in `/mnt/data`; new and changed files are stored in the session. With `Accept: text/event-stream` the run streams (see /exec); the `result` event carries this answer's JSON.",
    request_body = RunBody,
    responses(
        (status = 200, description = "The run completed (whatever its exit code)", body = RunResponse),
        (status = 400, description = "Invalid body (the detail names the field)", body = ProxyErrorBody),
        (status = 401, description = "Missing or wrong x-api-key", body = ProxyErrorBody),
        (status = 408, description = "The run timed out: its partial output and stats", body = RunResponse),
        (status = 429, description = "Too many runs", body = ProxyErrorBody),
        (status = 500, description = "Internal fault", body = ProxyErrorBody),
        (status = 503, description = "Too many runs waiting, or shutting down (`Retry-After`)", body = ProxyErrorBody),
    )
)]
pub async fn run(
    State(state): State<AppState>,
    headers: HeaderMap,
    admitted: Admitted<ProxyError, Caller, RawBody, Queues>,
) -> Result<Response, ProxyError> {
    // the error names the field: `code: invalid type: integer 5, expected a string`
    let body: RunBody = admitted.json()?;
    let caller = admitted.caller;
    let lang = Language::resolve(&body.language).ok_or_else(|| {
        ProxyError::bad(format!(
            "language: unsupported language {:?}",
            body.language
        ))
    })?;
    let timeout_ms = match body.timeout_seconds {
        None => None,
        Some(t) if t.is_finite() && t > 0.0 => Some((t * 1000.0).ceil() as u64),
        Some(_) => return Err(ProxyError::bad("timeout_seconds must be a positive number")),
    };
    if let Some(ids) = &body.files
        && ids.len() > state.config.max_run_files
    {
        return Err(ProxyError::bad(format!(
            "files: at most {} files per run",
            state.config.max_run_files
        )));
    }
    let session = state.sessions.open(&caller, &body.session_id).await?;
    let files = inputs(&state, &session, body.files.as_deref()).await?;
    let req = ExecRequest {
        lang,
        code: body.code,
        args: body.args,
        files,
        timeout_ms,
        outputs: Outputs::Workspace(session.clone()),
        project: None,
    };
    let opts = StartOptions {
        request_id: crate::middleware::request_id(&headers),
        ..StartOptions::default()
    };
    let watch = state.runs.start(caller, req, opts)?;
    let face = Arc::new(Proxy {
        state: state.clone(),
        session_name: body.session_id,
        session: session.clone(),
        language: lang.spec().common_name,
    });
    if sse::wants_events(&headers) {
        let run = watch.handle().clone();
        return Ok(sse::respond(run, face, Early::HttpError, watch).await);
    }
    let outcome = watch.outcome().await;
    state.sessions.touch(&face.session);
    let r = match &*outcome {
        Ok(r) => r,
        Err(e) => return Err(e.clone().into()),
    };
    let resp = face.response(watch.handle(), r).await;
    let status = if resp.error.is_some() {
        StatusCode::REQUEST_TIMEOUT
    } else {
        StatusCode::OK
    };
    let mut resp = (status, Json(resp)).into_response();
    sse::insert_run_id(resp.headers_mut(), watch.handle());
    Ok(resp)
}

/// The run's inputs: the named files of the session, or all of them (the
/// newest per name).
async fn inputs(
    state: &AppState,
    session: &Nanoid,
    ids: Option<&[String]>,
) -> Result<Vec<InputFile>, ProxyError> {
    let objects = state
        .store
        .list(session)
        .await
        .map_err(ProxyError::internal)?;
    let chosen: Vec<ObjectMeta> = match ids {
        Some(ids) => {
            let mut out = Vec::new();
            for (i, id) in ids.iter().enumerate() {
                let m = parse_file_id(id)
                    .filter(|(sid, _)| sid == session)
                    .and_then(|(_, fid)| objects.iter().find(|o| o.file_id == fid))
                    .ok_or_else(|| {
                        ProxyError::bad(format!("files[{i}]: no file {id} in this session"))
                    })?;
                out.push(m.clone());
            }
            out
        }
        None => kiln_exec::staging::newest_per_name(&objects),
    };
    chosen
        .into_iter()
        .map(|m| kiln_exec::staging::as_input(m).map_err(ProxyError::internal))
        .collect()
}

// ---- files -------------------------------------------------------------------

/// The session a file request is about.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SessionParam {
    /// The session (required for listing; for uploads, here or as a form
    /// field before the file).
    pub session_id: Option<String>,
}

/// The multipart form of an upload.
#[derive(Debug, ToSchema)]
#[allow(dead_code)] // a schema: parsed by hand
pub struct UploadForm {
    /// The session the file goes to (before `file`, or in the query).
    session_id: String,
    /// The file; its name is the part's filename.
    #[schema(format = Binary, content_media_type = "application/octet-stream")]
    file: String,
}

/// An upload's answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct UploadResponse {
    pub file: UploadedFile,
}

/// A stored upload.
#[derive(Debug, Serialize, ToSchema)]
pub struct UploadedFile {
    pub id: String,
    pub session_id: String,
    pub name: String,
    pub size_bytes: u64,
    pub mime_type: String,
    pub created_at: String,
}

/// `POST /librechat/files`.
#[utoipa::path(
    post,
    path = "/librechat/files",
    operation_id = "seedUpload",
    tag = "Seed 000",
    summary = "Upload a file into a session",
    params(SessionParam),
    request_body(content = UploadForm, content_type = "multipart/form-data"),
    responses(
        (status = 200, description = "OK", body = UploadResponse),
        (status = 400, description = "Bad request", body = ProxyErrorBody),
        (status = 401, description = "Missing or wrong credentials", body = ProxyErrorBody),
        (status = 413, description = "The file is over the upload limit", body = ProxyErrorBody),
    )
)]
pub async fn upload(
    State(state): State<AppState>,
    identity: Identity,
    headers: HeaderMap,
    query: Result<Query<SessionParam>, QueryRejection>,
    multipart: Result<Multipart, MultipartRejection>,
) -> Result<Response, ProxyError> {
    let caller = caller(&state, &identity, &headers)?;
    let mut session_name = query
        .map_err(|_| ProxyError::bad("invalid query string"))?
        .0
        .session_id;
    let mut multipart =
        multipart.map_err(|_| ProxyError::bad("the body must be multipart/form-data"))?;
    let bad_form = |e: axum::extract::multipart::MultipartError| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ProxyError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                "Request body too large",
            )
        } else {
            ProxyError::bad("invalid multipart body")
        }
    };
    // one file per request: what follows it (or anything after a refusal)
    // is read away before answering, or a client still writing gets a reset
    let answer: Result<Response, ProxyError> = async {
        while let Some(field) = multipart.next_field().await.map_err(bad_form)? {
            match field.name() {
                Some("session_id") if field.file_name().is_none() => {
                    let text = field.text().await.map_err(bad_form)?;
                    session_name = Some(text.trim().to_owned());
                }
                Some("file") => {
                    let Some(name) = session_name.clone() else {
                        return Err(ProxyError::bad(
                            "session_id is required (a form field before file, or in the query)",
                        ));
                    };
                    let raw = field.file_name().unwrap_or_default().to_owned();
                    let file_name = RelPath::parse(&raw)
                        .map_err(|e| ProxyError::bad(format!("file: invalid filename: {e}")))?;
                    let sid = state.sessions.open(&caller, &name).await?;
                    let declared = field.content_type().map(str::to_owned);
                    let obj = NewObject {
                        session_id: sid.clone(),
                        file_id: Nanoid::random(),
                        content_type: crate::codeapi::upload::content_type(
                            declared.as_deref(),
                            &file_name,
                        ),
                        name: file_name,
                        read_only: false,
                    };
                    let body = field.map_err(std::io::Error::other);
                    let meta = match state
                        .store
                        .put_stream(obj, body, state.config.max_upload_bytes)
                        .await
                    {
                        Ok(m) => m,
                        Err(StoreError::TooLarge { limit }) => {
                            return Err(ProxyError::new(
                                StatusCode::PAYLOAD_TOO_LARGE,
                                "payload_too_large",
                                format!("file: larger than the limit of {limit} bytes"),
                            ));
                        }
                        Err(StoreError::BodyRead(_)) => {
                            return Err(ProxyError::bad("invalid multipart body"));
                        }
                        Err(
                            e @ (StoreError::QuotaExceeded { .. } | StoreError::DiskFull { .. }),
                        ) => {
                            return Err(ProxyError::new(
                                StatusCode::INSUFFICIENT_STORAGE,
                                "insufficient_storage",
                                crate::error::storage_refusal(&e),
                            ));
                        }
                        Err(e) => return Err(ProxyError::internal(e)),
                    };
                    // one file per request: what follows is not read
                    let info = FileInfo::of(&meta);
                    tracing::info!(session = %sid, file = %meta.file_id, "seed-000 upload");
                    return Ok(Json(UploadResponse {
                        file: UploadedFile {
                            id: info.id,
                            session_id: name,
                            name: info.name,
                            size_bytes: info.size_bytes,
                            mime_type: info.mime_type,
                            created_at: info.created_at,
                        },
                    })
                    .into_response());
                }
                _ => {}
            }
        }
        Err(ProxyError::bad(
            "file is required (a multipart part named file)",
        ))
    }
    .await;
    crate::body::drain_multipart(&mut multipart).await;
    answer
}

/// A session's files.
#[derive(Debug, Serialize, ToSchema)]
pub struct FileList {
    pub session_id: String,
    pub files: Vec<FileInfo>,
}

/// `GET /librechat/files?session_id=`.
#[utoipa::path(
    get,
    path = "/librechat/files",
    operation_id = "seedListFiles",
    tag = "Seed 000",
    summary = "List a session's files",
    params(SessionParam),
    responses(
        (status = 200, description = "OK", body = FileList),
        (status = 400, description = "session_id missing or malformed", body = ProxyErrorBody),
        (status = 401, description = "Missing or wrong credentials", body = ProxyErrorBody),
    )
)]
pub async fn list(
    State(state): State<AppState>,
    identity: Identity,
    headers: HeaderMap,
    query: Result<Query<SessionParam>, QueryRejection>,
) -> Result<Response, ProxyError> {
    let caller = caller(&state, &identity, &headers)?;
    let name = query
        .map_err(|_| ProxyError::bad("invalid query string"))?
        .0
        .session_id
        .ok_or_else(|| ProxyError::bad("session_id is required"))?;
    let files = match state.sessions.find(&caller, &name).await? {
        Some(sid) => state
            .store
            .list(&sid)
            .await
            .map_err(ProxyError::internal)?
            .iter()
            .map(FileInfo::of)
            .collect(),
        None => Vec::new(),
    };
    Ok(Json(FileList {
        session_id: name,
        files,
    })
    .into_response())
}

type FilePath = Result<Path<String>, PathRejection>;

fn path_id(p: FilePath) -> Result<String, ProxyError> {
    p.map(|Path(id)| id)
        .map_err(|_| ProxyError::bad("invalid file id"))
}

/// `GET /librechat/files/{file_id}`.
#[utoipa::path(
    get,
    path = "/librechat/files/{file_id}",
    operation_id = "seedDownload",
    tag = "Seed 000",
    summary = "Download a file",
    params(("file_id" = String, Path, description = "The file's id")),
    responses(
        (status = 200, description = "The bytes, with Content-Type and Content-Disposition", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 401, description = "Missing or wrong credentials", body = ProxyErrorBody),
        (status = 404, description = "Not found", body = ProxyErrorBody),
    )
)]
pub async fn download(
    State(state): State<AppState>,
    identity: Identity,
    headers: HeaderMap,
    path: FilePath,
) -> Result<Response, ProxyError> {
    let caller = caller(&state, &identity, &headers)?;
    let id = path_id(path)?;
    let meta = readable(&state, &caller, &id).await?;
    let stream = match state.store.read(&meta).await {
        Ok(s) => s,
        Err(StoreError::NotFound) => {
            return Err(ProxyError::not_found(format!("File {id} not found")));
        }
        Err(e) => return Err(ProxyError::internal(e)),
    };
    Ok(file_response(&meta, Body::from_stream(stream)))
}

/// A deletion's answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct Deleted {
    pub id: String,
    pub deleted: bool,
}

/// `DELETE /librechat/files/{file_id}`.
#[utoipa::path(
    delete,
    path = "/librechat/files/{file_id}",
    operation_id = "seedDeleteFile",
    tag = "Seed 000",
    summary = "Delete a file from its session",
    params(("file_id" = String, Path, description = "The file's id")),
    responses(
        (status = 200, description = "OK", body = Deleted),
        (status = 401, description = "Missing or wrong credentials", body = ProxyErrorBody),
        (status = 404, description = "Not found", body = ProxyErrorBody),
    )
)]
pub async fn delete(
    State(state): State<AppState>,
    identity: Identity,
    headers: HeaderMap,
    path: FilePath,
) -> Result<Response, ProxyError> {
    let caller = caller(&state, &identity, &headers)?;
    let id = path_id(path)?;
    let meta = readable(&state, &caller, &id).await?;
    let deleted = state
        .store
        .delete(&meta.session_id, &meta.file_id)
        .await
        .map_err(ProxyError::internal)?;
    if !deleted {
        return Err(ProxyError::not_found(format!("File {id} not found")));
    }
    state.sessions.touch(&meta.session_id);
    Ok(Json(Deleted { id, deleted: true }).into_response())
}

/// The health answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ProxyHealth {
    /// `ok`.
    pub status: String,
    /// `kiln`.
    pub backend: String,
    /// Common names of the languages this host runs.
    pub languages: Vec<String>,
    pub version: String,
}

/// `GET /librechat/health` (no auth).
#[utoipa::path(
    get,
    path = "/librechat/health",
    operation_id = "seedHealth",
    tag = "Seed 000",
    summary = "Health and languages",
    responses((status = 200, description = "OK", body = ProxyHealth))
)]
pub async fn health(State(op): State<crate::config::Operator>) -> Response {
    Json(ProxyHealth {
        status: "ok".to_owned(),
        backend: "kiln".to_owned(),
        languages: op
            .health
            .languages
            .iter()
            .filter(|l| l.available)
            .map(|l| l.common_name.clone())
            .collect(),
        version: op.health.version.clone(),
    })
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_ids_carry_session_and_object() {
        let (s, f) = (Nanoid::random(), Nanoid::random());
        let id = file_id(&s, &f);
        assert_eq!(id.len(), 42);
        assert_eq!(parse_file_id(&id), Some((s, f)));
        assert_eq!(parse_file_id("file_123"), None);
        assert_eq!(parse_file_id(&"é".repeat(21)), None);
    }
}
