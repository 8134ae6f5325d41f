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

pub use crate::kit::envelope::{Envelope, Fail};

/// The named kernels, or 503 when sessions are off.
pub(crate) fn workers<E>(state: &AppState) -> Result<&kiln_exec::workers::Workers, Fail<E>> {
    state
        .envs
        .workers
        .as_ref()
        .ok_or_else(|| Fail::new(StatusCode::SERVICE_UNAVAILABLE, "sessions are off"))
}

pub use crate::middleware::{ACCESS_TOKEN, AUTH_TOKEN};

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

/// The key check of a face whose key travels in `header`; a refusal is
/// 401 in the face's envelope `E` (a misconfiguration stays 500).
async fn key_auth<E: Envelope>(
    state: AppState,
    header: &HeaderName,
    mut req: Request,
    next: Next,
) -> Response {
    match crate::middleware::authenticate_with(&state, &req, header) {
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
