//! Kiln's HTTP layer: every LibreChat route, authentication, the
//! execution-profile check, and the JSON shapes and error envelopes of the
//! Code Interpreter API. This is the only crate that knows those shapes.
//!
//! Routes (each served under `/v1` and at the root; `/metrics` at the root
//! only):
//!
//! | Route | Auth | Module |
//! |---|---|---|
//! | `POST /exec` | yes | [`exec`] |
//! | `POST /upload`, `POST /upload/batch` | yes | [`upload`] |
//! | `GET /download/{session_id}/{file_id}` | yes | [`files`] |
//! | `GET /files/{session_id}?detail=` | yes | [`files`] |
//! | `GET /sessions/{session_id}/objects/{file_id}` | yes | [`files`] |
//! | `DELETE /files/{session_id}/{file_id}`, `DELETE /sessions/{session_id}/objects/{file_id}` | yes | [`files`] |
//! | `GET /health` | no | [`health`] |
//! | `GET /metrics` | no | [`health`] |
//!
//! Layers, outermost first: sensitive-header marking (`authorization`,
//! `x-api-key`), request id (`x-request-id`, generated when absent, echoed),
//! a tracing span per request, HTTP metrics, the profile check (which also
//! stamps `X-CodeAPI-Execution-Profile` on every response), panic → JSON
//! 500; then, per authenticated route, API-key auth.

pub mod body;
pub mod config;
pub mod error;
pub mod exec;
pub mod files;
pub mod health;
pub mod identity;
pub mod middleware;
pub mod upload;

use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath};
use axum::http::header::AUTHORIZATION;
use axum::http::{HeaderName, Request, Response};
use axum::routing::{get, post};
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::sensitive_headers::SetSensitiveRequestHeadersLayer;
use tower_http::trace::{MakeSpan, OnResponse, TraceLayer};
use tracing::Span;

pub use config::{ApiConfig, AppState, AuthMode, HealthInfo, LanguageHealth};
pub use error::ApiError;

/// The complete application: every route under `/v1` and at the root,
/// `/metrics`, JSON fallbacks, and the layer stack described above.
pub fn router(state: AppState) -> Router {
    if state.config.auth == AuthMode::ApiKey && state.config.api_key.is_none() {
        tracing::error!("auth mode api-key without a key: every authenticated route answers 401");
    }
    let upload_limit = DefaultBodyLimit::max(upload::upload_body_limit(&state.config));

    let authenticated = Router::new()
        .route("/exec", post(exec::exec))
        .route("/upload", post(upload::upload).layer(upload_limit))
        .route(
            "/upload/batch",
            post(upload::upload_batch).layer(upload_limit),
        )
        .route("/download/{session_id}/{file_id}", get(files::download))
        .route("/files/{session_id}", get(files::list))
        .route(
            "/files/{session_id}/{file_id}",
            axum::routing::delete(files::delete),
        )
        .route(
            "/sessions/{session_id}/objects/{file_id}",
            get(files::object).delete(files::delete),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::auth,
        ));
    let api = authenticated
        .route("/health", get(health::health))
        .method_not_allowed_fallback(middleware::method_not_allowed);

    let layers = ServiceBuilder::new()
        .layer(SetSensitiveRequestHeadersLayer::new([
            AUTHORIZATION,
            HeaderName::from_static("x-api-key"),
        ]))
        .layer(SetRequestIdLayer::new(
            middleware::REQUEST_ID,
            middleware::NanoidRequestId,
        ))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(RequestSpan)
                .on_response(LogResponse),
        )
        .layer(PropagateRequestIdLayer::new(middleware::REQUEST_ID))
        .layer(axum::middleware::from_fn(middleware::http_metrics))
        .layer(axum::middleware::from_fn(middleware::profile))
        .layer(CatchPanicLayer::custom(middleware::panic_response));

    Router::new()
        .nest("/v1", api.clone())
        .merge(api)
        .route("/metrics", get(health::metrics))
        .fallback(middleware::not_found)
        .method_not_allowed_fallback(middleware::method_not_allowed)
        .layer(layers)
        .with_state(state)
}

/// One span per request: request id, method, route template; status and
/// latency are recorded when the response head is ready.
#[derive(Clone, Copy)]
struct RequestSpan;

impl<B> MakeSpan<B> for RequestSpan {
    fn make_span(&mut self, req: &Request<B>) -> Span {
        let request_id = req
            .headers()
            .get(middleware::REQUEST_ID)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-");
        let route = middleware::route_label(req.extensions().get::<MatchedPath>());
        tracing::info_span!(
            "request",
            request_id = %request_id,
            method = %req.method(),
            route = %route,
            status = tracing::field::Empty,
            latency_ms = tracing::field::Empty,
        )
    }
}

#[derive(Clone, Copy)]
struct LogResponse;

impl<B> OnResponse<B> for LogResponse {
    fn on_response(self, resp: &Response<B>, latency: Duration, span: &Span) {
        let latency_ms = u64::try_from(latency.as_millis()).unwrap_or(u64::MAX);
        span.record("status", resp.status().as_u16());
        span.record("latency_ms", latency_ms);
        tracing::info!(status = resp.status().as_u16(), latency_ms, "response");
    }
}
