//! [`ApiError`]: every way a request can fail, and the LibreChat error
//! envelope (status + JSON body) each one maps to.
//!
//! Bodies are contract (clients match on `error`/`message` codes, spec §1.3,
//! §1.4); internal detail goes to the log, never to the client.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use kiln_core::Nanoid;
use kiln_exec::ExecError;
use kiln_store::StoreError;
use serde_json::{Value, json};

/// The free-text error envelope: `{"error": "<message>"}` (sometimes with
/// `details`).
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<String>,
}

/// The coded error envelope: `{"error": "<code>", "message": "<text>", ...}`
/// (rate limits carry `retry_after_seconds`; profile errors
/// `expected_profile` and `actual_profile`).
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct CodedError {
    /// `rate_limited`, `execution_profile_mismatch`, `sandbox_setup_failed`, ...
    pub error: String,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<u64>,
}

/// The deployment profile Kiln reports unless a client expects `stateful`
/// (runtime sessions, spec §13.4), which it serves too.
pub const PROFILE: &str = "default";

/// Why a request without valid credentials was refused in the key's mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeyProblem {
    /// Neither `X-API-Key` nor `Authorization: Bearer` was sent.
    #[error("no API key was sent (X-API-Key or Authorization: Bearer)")]
    Missing,
    /// A key was sent and it is not the configured one.
    #[error("the API key sent does not match the server's")]
    Wrong,
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Malformed input; the message is safe to show (400 `{"error":msg}`).
    #[error("bad request: {0}")]
    BadRequest(String),
    /// A path or reference id that is not a 21-character nanoid.
    #[error("malformed id")]
    MalformedId,
    /// `X-CodeAPI-Expected-Profile` is neither `default` nor `stateful`.
    #[error("invalid execution profile {0:?}")]
    InvalidProfile(String),
    /// Another call of the same runtime session held it past the wait
    /// (409 `runtime_session_busy`, spec §13.4).
    #[error("runtime session is busy")]
    RuntimeSessionBusy,
    /// Missing or wrong API key (which of the two is said: the first thing
    /// an operator needs to know).
    #[error("missing or invalid credentials: {0}")]
    Unauthenticated(KeyProblem),
    /// Auth `jwt` and no `Authorization: Bearer`.
    #[error("bearer token required")]
    BearerRequired,
    /// A bearer token that failed verification (the reason is logged).
    #[error("invalid bearer token: {0}")]
    InvalidBearer(#[from] crate::jwt::Reject),
    /// Auth `jwt` without a usable verifier.
    #[error("JWT auth is misconfigured")]
    JwtMisconfigured,
    /// The operator's view (`/admin/*`) without the operator's credential:
    /// a user's token, or no API key configured to present (403).
    #[error("the admin view needs the operator's API key")]
    OperatorOnly { key_configured: bool },
    /// A browser request from another origin (403).
    #[error("cross-origin request from {0:?} refused")]
    ForeignOrigin(String),
    /// A `Host` this server does not answer to (421: DNS rebinding).
    #[error("host {0:?} is not one this server answers to")]
    UnknownHost(String),
    /// `require_identity` is on and the request carries no identity.
    #[error("request carries no user identity")]
    IdentityRequired,
    /// The claimed or implied scope does not own the storage session.
    #[error("session {session} is not readable by the caller")]
    SessionForbidden { session: Nanoid },
    /// Unknown storage session or object.
    #[error("file {session}/{file:?} not found")]
    FileNotFound {
        session: Nanoid,
        file: Option<Nanoid>,
    },
    /// The object did not appear within the read-after-write wait.
    #[error("file {session}/{file} did not appear")]
    DownloadNotFound { session: Nanoid, file: Nanoid },
    /// No route matches the path.
    #[error("no route for {0}")]
    RouteNotFound(String),
    /// The route exists, the method does not.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// A request body is larger than the configured limit.
    #[error("request body exceeds {limit} bytes")]
    BodyTooLarge { limit: u64 },
    /// An uploaded file is larger than `max_upload_bytes`.
    #[error("uploaded file {name:?} exceeds {limit} bytes")]
    UploadTooLarge { name: String, limit: u64 },
    /// The body is not JSON / not multipart.
    #[error("unsupported content type: {0}")]
    UnsupportedContentType(&'static str),
    /// Reading the request body failed (client went away, bad framing).
    #[error("reading the request body failed: {0}")]
    ReadBody(String),
    /// A store budget (the caller's quota, the disk's free-space floor)
    /// refused the bytes (507).
    #[error("storage refused: {0}")]
    InsufficientStorage(StoreError),
    /// The client paused sending the body longer than allowed.
    #[error("the request body stalled")]
    BodyTimeout,
    /// New work refused because the server is shutting down.
    #[error("service is shutting down")]
    ShuttingDown,
    /// The executor refused or failed the run.
    #[error("execution failed: {0}")]
    Exec(#[from] ExecError),
    /// Looking up a storage session failed.
    #[error("looking up session {session} failed: {source}")]
    SessionLookup { session: Nanoid, source: StoreError },
    /// Creating the storage session of an upload failed.
    #[error("creating session {session} failed: {source}")]
    CreateSession { session: Nanoid, source: StoreError },
    /// Storing an uploaded file failed.
    #[error("storing upload {session}/{file} failed: {source}")]
    StoreUpload {
        session: Nanoid,
        file: Nanoid,
        source: StoreError,
    },
    /// Opening an object for download failed.
    #[error("downloading {session}/{file} failed: {source}")]
    Download {
        session: Nanoid,
        file: Nanoid,
        source: StoreError,
    },
    /// Listing a storage session failed.
    #[error("listing session {session} failed: {source}")]
    ListSession { session: Nanoid, source: StoreError },
    /// Reading an object's metadata failed.
    #[error("reading metadata of {session}/{file} failed: {source}")]
    ObjectMetadata {
        session: Nanoid,
        file: Nanoid,
        source: StoreError,
    },
    /// Reading the egress ledger failed.
    #[error("reading the egress ledger failed: {0}")]
    EgressLedger(StoreError),
    /// Deleting an object failed.
    #[error("deleting {session}/{file} failed: {source}")]
    DeleteObject {
        session: Nanoid,
        file: Nanoid,
        source: StoreError,
    },
    /// No run of that id (or it is no longer kept).
    #[error("run {0} not found")]
    RunNotFound(Nanoid),
    /// The run's result lists no file of that id.
    #[error("file {0} is not among the run's outputs")]
    RunFileNotFound(Nanoid),
    /// A rate limit of §4 refused the request.
    #[error("rate limited ({class:?})")]
    RateLimited {
        class: crate::kit::routes::Class,
        verdict: crate::limits::Verdict,
    },
    /// A sessions API call failed (`sessions.rs` renders it).
    #[error("session: {0}")]
    Kernel(#[from] kiln_exec::kernels::KernelsError),
    /// A handler panicked (caught by the panic layer).
    #[error("handler panicked: {0}")]
    Panic(String),
}

/// What a client is told when a store budget refused its bytes (every face
/// says the same).
pub fn storage_refusal(e: &StoreError) -> String {
    match e {
        StoreError::QuotaExceeded { quota } => format!(
            "Storage quota exceeded: your stored files may take at most {} MiB; \
             delete some or wait for them to expire",
            quota / (1024 * 1024)
        ),
        _ => "Insufficient storage on the server; try again later".to_owned(),
    }
}

impl ApiError {
    /// Status and JSON body of the envelope.
    pub fn status_and_body(&self) -> (StatusCode, Value) {
        use ApiError::*;
        let plain = |status: StatusCode, msg: &str| (status, json!({ "error": msg }));
        let coded = |status: StatusCode, code: &str, msg: &str| {
            (status, json!({ "error": code, "message": msg }))
        };
        match self {
            BadRequest(msg) => plain(StatusCode::BAD_REQUEST, msg),
            MalformedId => plain(StatusCode::BAD_REQUEST, "Bad request"),
            InvalidProfile(p) => (
                StatusCode::BAD_REQUEST,
                json!({
                    "error": "invalid_execution_profile",
                    "message": format!("Invalid execution profile: {p}"),
                    "expected_profile": p,
                    "actual_profile": PROFILE,
                }),
            ),
            RuntimeSessionBusy => (
                StatusCode::CONFLICT,
                json!({
                    "error": "runtime_session_busy",
                    "message": "Runtime session is busy",
                }),
            ),
            Unauthenticated(problem) => plain(
                StatusCode::UNAUTHORIZED,
                &format!("Unauthorized: {problem}"),
            ),
            BearerRequired => plain(StatusCode::UNAUTHORIZED, "Bearer token is required"),
            RateLimited { class, verdict } => (
                StatusCode::TOO_MANY_REQUESTS,
                crate::limits::refusal_body(*class, verdict),
            ),
            InvalidBearer(_) => plain(StatusCode::UNAUTHORIZED, "Invalid bearer token"),
            JwtMisconfigured => plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                "CodeAPI JWT auth is misconfigured",
            ),
            OperatorOnly { key_configured } => coded(
                StatusCode::FORBIDDEN,
                "operator_only",
                if *key_configured {
                    "The admin view needs the operator's API key (X-API-Key); a user's token \
                     does not open it"
                } else {
                    "The admin view needs the operator's API key: set api_key (KILN_API_KEY); \
                     a user's token does not open it"
                },
            ),
            ForeignOrigin(origin) => coded(
                StatusCode::FORBIDDEN,
                "cross_origin_refused",
                &format!(
                    "Cross-origin browser request refused: Origin {origin} is not this \
                     server's own. Kiln's clients call it from a server; a browser only from \
                     its own origin (the console at /console/). To reach it under another \
                     name, add that name to allowed_hosts (KILN_ALLOWED_HOSTS)"
                ),
            ),
            UnknownHost(host) => coded(
                StatusCode::MISDIRECTED_REQUEST,
                "unknown_host",
                &format!(
                    "Host {host} is not a name this server answers to (a keyless server \
                     answers only its listen address, loopback names and IP addresses). If \
                     Kiln is reached under this name, add it to allowed_hosts \
                     (KILN_ALLOWED_HOSTS)"
                ),
            ),
            IdentityRequired => plain(StatusCode::UNAUTHORIZED, "Authentication is required"),
            SessionForbidden { .. } => plain(StatusCode::FORBIDDEN, "Unauthorized"),
            FileNotFound { .. } => plain(StatusCode::NOT_FOUND, "File not found"),
            DownloadNotFound { .. } => (
                StatusCode::NOT_FOUND,
                json!({
                    "error": "File not found",
                    "details": "The file may have expired or does not exist",
                }),
            ),
            RouteNotFound(_) => plain(StatusCode::NOT_FOUND, "Not found"),
            RunNotFound(_) => plain(StatusCode::NOT_FOUND, "Run not found"),
            RunFileNotFound(_) => plain(StatusCode::NOT_FOUND, "File not among the run's outputs"),
            MethodNotAllowed => plain(StatusCode::METHOD_NOT_ALLOWED, "Method not allowed"),
            BodyTooLarge { .. } => plain(StatusCode::PAYLOAD_TOO_LARGE, "Request body too large"),
            UploadTooLarge { .. } => {
                plain(StatusCode::PAYLOAD_TOO_LARGE, "File size limit exceeded")
            }
            UnsupportedContentType(msg) => plain(StatusCode::UNSUPPORTED_MEDIA_TYPE, msg),
            ReadBody(_) => plain(StatusCode::BAD_REQUEST, "Could not read the request body"),
            BodyTimeout => plain(StatusCode::REQUEST_TIMEOUT, "Request body timed out"),
            InsufficientStorage(e) => plain(StatusCode::INSUFFICIENT_STORAGE, &storage_refusal(e)),
            ShuttingDown => plain(StatusCode::SERVICE_UNAVAILABLE, "Service is shutting down"),
            Exec(e) => exec_envelope(e),
            Kernel(e) => kernel_envelope(e),
            SessionLookup { .. } | Panic(_) | EgressLedger(_) => {
                plain(StatusCode::INTERNAL_SERVER_ERROR, "Internal server error")
            }
            CreateSession { .. } | StoreUpload { .. } => {
                plain(StatusCode::INTERNAL_SERVER_ERROR, "Error uploading files")
            }
            Download { .. } => plain(StatusCode::INTERNAL_SERVER_ERROR, "Error downloading file"),
            ListSession { .. } => plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Error fetching file information",
            ),
            ObjectMetadata { .. } => plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Error fetching object metadata",
            ),
            DeleteObject { .. } => plain(StatusCode::INTERNAL_SERVER_ERROR, "Error deleting file"),
        }
    }
}

fn exec_envelope(e: &ExecError) -> (StatusCode, Value) {
    match e {
        ExecError::BadRequest(msg) => (StatusCode::BAD_REQUEST, json!({ "error": msg })),
        ExecError::Unauthorized => (
            StatusCode::FORBIDDEN,
            json!({ "error": "Unauthorized file reference" }),
        ),
        ExecError::SandboxSetup(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({ "error": "sandbox_setup_failed", "message": "Sandbox setup failed" }),
        ),
        ExecError::SandboxFailed(_) => (
            StatusCode::BAD_GATEWAY,
            json!({ "error": "sandbox_execution_failed", "message": "Sandbox execution failed" }),
        ),
        ExecError::ShuttingDown => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({ "error": "Service is shutting down" }),
        ),
        // The client is gone; nobody reads this.
        ExecError::Cancelled => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({ "error": "Request cancelled" }),
        ),
        ExecError::Storage(_) | ExecError::Internal(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({ "error": "Internal server error" }),
        ),
        ExecError::Busy { retry_after } => {
            let secs = retry_seconds(*retry_after);
            (
                StatusCode::SERVICE_UNAVAILABLE,
                json!({
                    "error": "server_busy",
                    "message": format!("Too many executions waiting. Please retry in {secs} seconds."),
                    "retry_after_seconds": secs,
                }),
            )
        }
        ExecError::Kernel(e) => kernel_envelope(e),
        ExecError::RateLimited { retry_after } => {
            let secs = retry_seconds(*retry_after);
            (
                StatusCode::TOO_MANY_REQUESTS,
                json!({
                    "error": "rate_limited",
                    "message": format!("Too many CodeAPI execution requests. Please retry in {secs} seconds."),
                    "retry_after_seconds": secs,
                }),
            )
        }
    }
}

pub use crate::limits::retry_seconds;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, body) = self.status_and_body();
        if status.is_server_error() {
            tracing::error!(error = %self, status = status.as_u16(), "request failed");
        } else {
            tracing::debug!(error = %self, status = status.as_u16(), "request rejected");
        }
        let mut resp = (status, Json(body)).into_response();
        if let ApiError::RateLimited { verdict, .. } = &self {
            crate::limits::stamp(resp.headers_mut(), verdict);
        }
        if let ApiError::Kernel(
            kiln_exec::kernels::KernelsError::NodeFull(_)
            | kiln_exec::kernels::KernelsError::OwnerCap(_),
        ) = &self
        {
            // a session ends within its idle TTL at worst; clients should
            // not hammer the node meanwhile
            resp.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("10"),
            );
        }
        if let ApiError::Exec(
            ExecError::RateLimited { retry_after } | ExecError::Busy { retry_after },
        ) = &self
        {
            resp.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(retry_seconds(*retry_after)),
            );
        }
        resp
    }
}
/// The status and coded body of a live kernel's error (every face that
/// holds kernels answers it so, or from it).
pub fn kernel_envelope(e: &kiln_exec::kernels::KernelsError) -> (StatusCode, serde_json::Value) {
    let (status, code) = match e {
        kiln_exec::kernels::KernelsError::Language(_) => {
            (StatusCode::BAD_REQUEST, "unsupported_language")
        }
        kiln_exec::kernels::KernelsError::NotFound => (StatusCode::NOT_FOUND, "session_not_found"),
        kiln_exec::kernels::KernelsError::FileNotFound => (StatusCode::NOT_FOUND, "file_not_found"),
        kiln_exec::kernels::KernelsError::OwnerCap(_) => {
            (StatusCode::TOO_MANY_REQUESTS, "session_limit")
        }
        kiln_exec::kernels::KernelsError::NodeFull(_) => {
            (StatusCode::SERVICE_UNAVAILABLE, "sessions_full")
        }
        kiln_exec::kernels::KernelsError::Unavailable(_) => {
            (StatusCode::SERVICE_UNAVAILABLE, "sessions_unavailable")
        }
        kiln_exec::kernels::KernelsError::Busy => (StatusCode::CONFLICT, "session_busy"),
        kiln_exec::kernels::KernelsError::Lost(_) => (StatusCode::GONE, "session_lost"),
        kiln_exec::kernels::KernelsError::Files(m) if m.contains("full") => {
            (StatusCode::INSUFFICIENT_STORAGE, "workspace_full")
        }
        kiln_exec::kernels::KernelsError::Files(_)
        | kiln_exec::kernels::KernelsError::Kernel(_) => {
            (StatusCode::INTERNAL_SERVER_ERROR, "session_failed")
        }
    };
    let message = match e {
        // internal detail goes to the log
        kiln_exec::kernels::KernelsError::Files(m) if !m.contains("full") => {
            "Internal server error".to_owned()
        }
        kiln_exec::kernels::KernelsError::Kernel(_) => {
            "The kernel could not be started or failed".to_owned()
        }
        other => other.to_string(),
    };
    (
        status,
        serde_json::json!({ "error": code, "message": message }),
    )
}
