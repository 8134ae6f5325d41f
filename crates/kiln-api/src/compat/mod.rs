//! Thin faces of other projects' APIs over Kiln's kernels: seed 004's
//! stateful gateway ([`seed004`], `/api/v1`) and seed 003's runtime daemon
//! ([`seed003`], under `runtime_api_prefix`). Each parses its wire shapes,
//! calls `kiln_exec` (kernels, named workers, the URL fetcher) and renders
//! its own envelope; none holds a rule of its own.
//!
//! Authentication: Kiln's API key, in the header each seed names
//! (`X-Auth-Token` for seed 004, `X-Access-Token` for seed 003) as well as Kiln's own (`X-API-Key`,
//! `Authorization: Bearer` — a LibreChat token too, under `jwt` modes).

pub mod seed003;
pub mod seed004;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderName, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::config::AppState;
use crate::error::ApiError;
use crate::identity::Identity;

/// How a face writes an error: `{"<FIELD>": "<message>"}`.
pub trait Envelope {
    const FIELD: &'static str;
}

/// A failure in a face's envelope `E`.
#[derive(Debug)]
pub struct Fail<E> {
    pub status: StatusCode,
    pub message: String,
    envelope: std::marker::PhantomData<E>,
}

impl<E> Fail<E> {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Fail<E> {
        Fail {
            status,
            message: message.into(),
            envelope: std::marker::PhantomData,
        }
    }
}

impl<E: Envelope> IntoResponse for Fail<E> {
    fn into_response(self) -> Response {
        (
            self.status,
            axum::Json(serde_json::json!({ E::FIELD: self.message })),
        )
            .into_response()
    }
}

impl<E> From<ApiError> for Fail<E> {
    fn from(e: ApiError) -> Fail<E> {
        let (status, body) = e.status_and_body();
        let message = body
            .get("message")
            .or_else(|| body.get("error"))
            .and_then(|v| v.as_str())
            .map_or_else(|| e.to_string(), str::to_owned);
        Fail::new(status, message)
    }
}

impl<E> From<kiln_exec::kernels::KernelsError> for Fail<E> {
    fn from(e: kiln_exec::kernels::KernelsError) -> Fail<E> {
        ApiError::Session(e).into()
    }
}

/// The named kernels, or 503 when sessions are off.
pub(crate) fn workers<E>(state: &AppState) -> Result<&kiln_exec::workers::Workers, Fail<E>> {
    state
        .workers
        .as_ref()
        .ok_or_else(|| Fail::new(StatusCode::SERVICE_UNAVAILABLE, "sessions are off"))
}

/// Seed 004's key header.
pub const AUTH_TOKEN: HeaderName = HeaderName::from_static("x-auth-token");
/// Seed 003's key header.
pub const ACCESS_TOKEN: HeaderName = HeaderName::from_static("x-access-token");

/// The compatibility faces the configuration turns on.
pub fn routes(state: &AppState) -> Router<AppState> {
    let mut router = Router::new();
    if state.config.seed004_api {
        let seed004 = Router::new()
            .route("/api/v1/execute", post(seed004::execute))
            .route("/api/v1/release", post(seed004::release))
            .route("/api/v1/status", get(seed004::status))
            .route(
                "/api/v1/files",
                post(seed004::import).delete(seed004::delete),
            )
            .route("/api/v1/files/export", post(seed004::export))
            .route_layer(axum::middleware::from_fn_with_state(
                state.clone(),
                seed004_auth,
            ));
        router = router.merge(seed004);
    }
    if let Some(prefix) = &state.config.runtime_api_prefix {
        let upload_limit =
            axum::extract::DefaultBodyLimit::max(crate::upload::upload_body_limit(&state.config));
        let seed003 = Router::new()
            .route("/code", post(seed003::code))
            .route("/sessions", post(seed003::create_session))
            .route(
                "/sessions/{session_id}",
                axum::routing::delete(seed003::delete_session),
            )
            .route("/files", get(seed003::list_files))
            .route("/files/upload", post(seed003::upload).layer(upload_limit))
            .route("/files/download", get(seed003::download))
            .route("/metrics", get(seed003::metrics))
            .route("/metrics/watch", get(seed003::watch))
            .route_layer(axum::middleware::from_fn_with_state(
                state.clone(),
                seed003_auth,
            ));
        router = router.nest(prefix, seed003);
    }
    router
}

/// The key header of the compatibility face serving `path` (seed 004's
/// under `/api/v1/`, seed 003's under `runtime_api_prefix`), when that
/// face is on; `None` for Kiln's own routes.
pub(crate) fn key_header(config: &crate::config::ApiConfig, path: &str) -> Option<HeaderName> {
    let under = |prefix: &str| {
        path.strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    };
    if config.seed004_api && under("/api/v1") {
        Some(AUTH_TOKEN)
    } else if config.runtime_api_prefix.as_deref().is_some_and(under) {
        Some(ACCESS_TOKEN)
    } else {
        None
    }
}

/// Authenticates with the key in `header`, else as Kiln's own routes do.
pub(crate) fn authenticate(
    state: &AppState,
    req: &Request,
    header: &HeaderName,
) -> Result<Identity, ApiError> {
    if let Some(identity) = crate::middleware::key_in_header(state, req, header) {
        return Ok(identity);
    }
    crate::middleware::authenticate(state, req)
}

/// The key check of a face whose key travels in `header`; a refusal is
/// 401 in the face's envelope `E` (a misconfiguration stays 500).
async fn key_auth<E: Envelope>(
    state: AppState,
    header: &HeaderName,
    mut req: Request,
    next: Next,
) -> Response {
    match authenticate(&state, &req, header) {
        Ok(identity) => {
            req.extensions_mut().insert(identity);
            next.run(req).await
        }
        Err(e) => {
            let (status, _) = e.status_and_body();
            let status = if status == StatusCode::INTERNAL_SERVER_ERROR {
                status
            } else {
                StatusCode::UNAUTHORIZED
            };
            Fail::<E>::new(status, format!("Invalid or missing {header}")).into_response()
        }
    }
}

async fn seed004_auth(State(state): State<AppState>, req: Request, next: Next) -> Response {
    key_auth::<seed004::Detail>(state, &AUTH_TOKEN, req, next).await
}

async fn seed003_auth(State(state): State<AppState>, req: Request, next: Next) -> Response {
    key_auth::<seed003::Error>(state, &ACCESS_TOKEN, req, next).await
}
