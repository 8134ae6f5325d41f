//! Kiln's HTTP layer: the faces. Each parses its own wire shapes, starts
//! runs in the one registry (`kiln_exec::Runs`), reads the one store, asks
//! the one access rule, and renders its own envelopes. This is the only
//! crate that knows any face's JSON.
//!
//! | Face | Routes (under `/v1`; LibreChat's also at the root) | Module |
//! |---|---|---|
//! | LibreChat (codeapi) | `POST /exec`, `POST /upload`, `POST /upload/batch`, `GET /download/{session_id}/{file_id}`, `GET /files/{session_id}`, `GET|DELETE /sessions/{session_id}/objects/{file_id}`, `DELETE /files/{session_id}/{file_id}`, `GET /health` | [`codeapi`] |
//! | Kiln's runs | `GET /runs/{run_id}`, `GET /runs/{run_id}/events`, `POST /runs/{run_id}/cancel` | [`runs`] |
//! | Kiln's sessions (live kernels) | `POST /sessions`, `GET|DELETE /sessions/{session_id}`, `POST /sessions/{session_id}/exec`, `POST /sessions/{session_id}/interrupt`, `GET /sessions/{session_id}/files`, `GET|PUT|DELETE /sessions/{session_id}/files/{path}` | [`sessions`] |
//! | Seed 000 (proxy) | `POST /librechat/runs`, `POST|GET /librechat/files`, `GET|DELETE /librechat/files/{file_id}`, `GET /librechat/health` | [`proxy`] |
//! | Operations | `GET /metrics`, `GET /openapi.json` (root only); `GET /admin/status`, `GET /admin/runs[/{run_id}[/files/{file_id}]]`, `GET /admin/egress`, `GET /admin/kernels`, `DELETE /admin/kernels/{session_id}` (behind the operator's API key; a user's token is refused) | [`codeapi::health`], [`openapi`], [`admin`] |
//! | Sandbox bridge (Cloudflare's protocol) | `POST /sandbox`, `DELETE /sandbox/{id}`, `GET /sandbox/{id}/running`, `POST /sandbox/{id}/exec` (SSE), `GET|PUT /sandbox/{id}/file/{path}` | [`bridge`] |
//! | MCP (streamable HTTP) | `POST|DELETE /mcp` (tools `execute_code`, `create_session`, `close_session`; `resources/read` of their outputs) | [`mcp`] |
//! | Console | `GET /console/` and its assets (root only; off with `console = false`) | [`console`] |
//! | Seed 004 (stateful gateway) | `POST /api/v1/execute`, `POST /api/v1/release`, `GET /api/v1/status`, `POST|DELETE /api/v1/files`, `POST /api/v1/files/export` (root only; off with `seed004_api = false`) | [`compat::seed004`] |
//! | Seed 003 (runtime daemon) | `POST /code`, `POST /sessions`, `DELETE /sessions/{session_id}`, `GET /files`, `POST /files/upload`, `GET /files/download`, `GET /metrics`, `GET /metrics/watch` under `runtime_api_prefix` (default `/runtime`; root only) | [`compat::seed003`] |
//!
//! Streaming (`Accept: text/event-stream` on the run-starting routes, and
//! `/runs/{run_id}/events`) is [`sse`], shared by the faces. The OpenAPI
//! document is generated from the handlers' annotations and types, from the
//! same registrations that build the router ([`openapi`]).
//!
//! Layers, outermost first: sensitive-header marking (`authorization`,
//! `x-api-key`), request id (`x-request-id`, generated when absent, echoed),
//! a tracing span per request, HTTP metrics, the profile check (which also
//! stamps `X-CodeAPI-Execution-Profile` on every response), panic → JSON
//! 500, the browser guard (a foreign `Origin`, and on a keyless server a
//! foreign `Host`, refused: [`origin`]), forwarding to the owner node of a
//! kernel or run ([`cluster`], with several nodes; it reads a body only
//! once the route's credential check admits the caller); then, per
//! authenticated route, authentication (API key or LibreChat's JWT; each
//! face answers a failure in its own envelope; the admin routes take only
//! the operator's key) and the per-principal rate limits of [`rate`], in
//! the class each route declares in [`kit::routes`] (today only
//! LibreChat's file and cancel routes are counted there; code starts are
//! counted by their handlers).
//!
//! Shared modules (everything but the faces above) import no face; the
//! tidy test `tests/tidy.rs` checks it, and that there is no import
//! circle.

pub mod admin;
pub mod body;
pub mod bridge;
pub mod cluster;
pub mod codeapi;
pub mod compat;
pub mod config;
pub mod console;
pub mod error;
pub mod evals;
pub mod hosts;
pub mod identity;
pub mod jwt;
pub mod kit;
pub mod limits;
pub mod mcp;
pub mod middleware;
pub mod node;
pub mod openapi;
pub mod ops;
pub mod origin;
pub mod proxy;
pub mod rate;
pub mod runs;
pub mod server;
pub mod sessions;
pub mod sse;
pub mod telemetry;

pub use codeapi::{exec, files, health, programmatic, upload};

use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath};
use axum::http::header::AUTHORIZATION;
use axum::http::{HeaderName, Request, Response};
use axum::routing::get;
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::sensitive_headers::SetSensitiveRequestHeadersLayer;
use tower_http::trace::{MakeSpan, OnResponse, TraceLayer};
use tracing::Span;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use config::{
    ApiConfig, AppState, AuthMode, Environments, HealthInfo, LanguageHealth, Operator,
    RuntimeImageHealth, RuntimeSessionMode,
};
pub use error::ApiError;

/// Every route served under `/v1` (LibreChat's also at the root), with
/// their OpenAPI operations. The one list of routes: the router and the
/// document are both made from it.
/// An authenticated group of routes: `auth` (the group's credential check)
/// runs first, then the rate layer, which counts the route's declared class
/// (`kit::routes`) per principal. Every authenticated group goes through it.
macro_rules! authenticated {
    ($router:expr, $state:expr, $auth:path) => {
        $router
            .route_layer(axum::middleware::from_fn_with_state(
                $state.clone(),
                rate::limit,
            ))
            .route_layer(axum::middleware::from_fn_with_state($state.clone(), $auth))
    };
}

pub fn api_routes(state: &AppState) -> OpenApiRouter<AppState> {
    let upload_limit = DefaultBodyLimit::max(upload::upload_body_limit(&state.config));
    let uploads = OpenApiRouter::new()
        .routes(routes!(upload::upload))
        .routes(routes!(upload::upload_batch))
        .layer(upload_limit);
    let librechat = authenticated!(
        OpenApiRouter::new()
            .routes(routes!(exec::exec))
            .routes(routes!(programmatic::programmatic))
            .routes(routes!(programmatic::cancel))
            .merge(uploads)
            .routes(routes!(files::download))
            .routes(routes!(files::list))
            .routes(routes!(files::delete))
            .routes(routes!(files::object, files::delete_object))
            .routes(routes!(runs::get_run))
            .routes(routes!(runs::run_events))
            .routes(routes!(runs::cancel_run)),
        state,
        middleware::auth
    );
    let seed_uploads = OpenApiRouter::new()
        .routes(routes!(proxy::upload, proxy::list))
        .layer(upload_limit);
    let seed = authenticated!(
        OpenApiRouter::new()
            .routes(routes!(proxy::run))
            .merge(seed_uploads)
            .routes(routes!(proxy::download, proxy::delete)),
        state,
        proxy::auth
    );
    let sessions = authenticated!(
        OpenApiRouter::new()
            .routes(routes!(sessions::create))
            .routes(routes!(sessions::get_session, sessions::delete_session))
            .routes(routes!(sessions::exec))
            .routes(routes!(sessions::interrupt))
            .routes(routes!(sessions::list_files))
            .routes(routes!(
                sessions::get_file,
                sessions::put_file,
                sessions::delete_file
            ))
            .layer(upload_limit),
        state,
        middleware::auth
    );
    let bridge = authenticated!(
        OpenApiRouter::new()
            .routes(routes!(bridge::create))
            .routes(routes!(bridge::delete))
            .routes(routes!(bridge::running))
            .routes(routes!(bridge::exec))
            .routes(routes!(bridge::read_file, bridge::write_file))
            .layer(upload_limit),
        state,
        middleware::auth
    );
    // the operator's view: the operator's credential, never a user's token
    let admin = authenticated!(
        OpenApiRouter::new()
            .routes(routes!(admin::status))
            .routes(routes!(admin::runs))
            .routes(routes!(admin::run))
            .routes(routes!(admin::run_file))
            .routes(routes!(admin::kernels))
            .routes(routes!(admin::close_kernel))
            .routes(routes!(admin::egress)),
        state,
        middleware::operator_auth
    );
    // one registry of the handshake generation's sessions, shared by `/mcp`
    // and `/v1/mcp` (the router clones this one)
    let mcp = authenticated!(
        OpenApiRouter::new().routes(routes!(mcp::post, mcp::delete)),
        state,
        middleware::auth
    )
    .layer(axum::Extension(std::sync::Arc::new(
        mcp::McpSessions::default(),
    )));
    OpenApiRouter::new()
        .merge(librechat)
        .merge(admin)
        .merge(seed)
        .merge(sessions)
        .merge(bridge)
        .merge(mcp)
        .routes(routes!(health::health))
        .routes(routes!(proxy::health))
}

/// Routes served at the root only; `/metrics` behind the API key when the
/// configuration asks for it.
pub fn root_routes(state: &AppState) -> OpenApiRouter<AppState> {
    let mut metrics = OpenApiRouter::new().routes(routes!(health::metrics));
    if state.config.metrics_require_key {
        metrics = metrics.route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::auth,
        ));
    }
    metrics.routes(routes!(openapi::openapi_json))
}

/// The complete application: every route under `/v1` and LibreChat's at
/// the root, `/metrics` and `/openapi.json`, JSON fallbacks, and the layer
/// stack described above.
pub fn router(state: AppState) -> Router {
    if state.config.auth == AuthMode::ApiKey && state.config.api_key.is_none() {
        tracing::error!("auth mode api-key without a key: every authenticated route answers 401");
    }
    let (api, api_doc) = api_routes(&state).split_for_parts();
    let (root, root_doc) = root_routes(&state).split_for_parts();
    let doc = openapi::document(api_doc, root_doc);
    let mut public = openapi::PUBLIC_OPERATIONS.to_vec();
    if !state.config.metrics_require_key {
        public.push("metrics");
    }
    let api = api.method_not_allowed_fallback(middleware::method_not_allowed);

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
        .layer(CatchPanicLayer::custom(middleware::panic_response))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            origin::guard,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            cluster::forward,
        ));

    let console = if state.config.console {
        console::routes()
    } else {
        Router::new()
    };
    Router::new()
        .nest("/v1", api.clone())
        .merge(console)
        .merge(api)
        .merge(root)
        .merge(compat::routes(&state))
        .route("/v1/openapi.json", get(openapi::openapi_json))
        .layer(axum::Extension(openapi::Document::new(doc, &public)))
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
        // a span's level is a constant of its call site: one site per level
        macro_rules! request_span {
            ($level:expr) => {
                tracing::span!(
                    $level,
                    "request",
                    request_id = %request_id,
                    method = %req.method(),
                    route = %route,
                    status = tracing::field::Empty,
                    latency_ms = tracing::field::Empty,
                )
            };
        }
        // the console polls `/admin/*` every few seconds: its requests are
        // logged at debug, so that an open tab does not fill the log
        if is_polled(&route) {
            request_span!(tracing::Level::DEBUG)
        } else {
            request_span!(tracing::Level::INFO)
        }
    }
}

/// Routes a client polls (the console's `/admin/*`), logged at debug.
fn is_polled(route: &str) -> bool {
    route.starts_with("/admin/")
}

#[derive(Clone, Copy)]
struct LogResponse;

impl<B> OnResponse<B> for LogResponse {
    fn on_response(self, resp: &Response<B>, latency: Duration, span: &Span) {
        let status = resp.status().as_u16();
        span.record("status", status);
        // an info span is one of the requests logged at info; a debug one
        // (polling) or a disabled one is logged at debug
        let loud = span
            .metadata()
            .is_some_and(|m| *m.level() == tracing::Level::INFO);
        let streamed = resp
            .headers()
            .get(axum::http::header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        if streamed {
            // the head of a stream is ready at once: the time to it is not
            // the request's latency, so none is recorded (the run's audit
            // record has its duration)
            if loud {
                tracing::info!(status, "response streams");
            } else {
                tracing::debug!(status, "response streams");
            }
            return;
        }
        let latency_ms = u64::try_from(latency.as_millis()).unwrap_or(u64::MAX);
        span.record("latency_ms", latency_ms);
        if loud {
            tracing::info!(status, latency_ms, "response");
        } else {
            tracing::debug!(status, latency_ms, "response");
        }
    }
}
