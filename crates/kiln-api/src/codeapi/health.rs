//! `GET /health` (no auth, no IO: answers from what the binary probed at
//! startup) and `GET /metrics` (Prometheus text; open like health — it only
//! carries route/status counters, latency histograms and the process's
//! figures, no ids or identities; see [`crate::telemetry`]).

use axum::Json;
use axum::extract::State;
use axum::http::HeaderValue;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};

use crate::config::Operator;
use crate::error::{ApiError, PROFILE};
use crate::kit::Door;

/// `GET /health`'s answer.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct Health {
    /// `ok`, or `draining` (with status 503) once the node stopped taking
    /// new runs to shut down, so that a balancer moves on.
    pub status: &'static str,
    /// The execution profile this deployment serves (`default`).
    pub profile: &'static str,
    pub version: String,
    pub languages: Vec<crate::config::LanguageHealth>,
    /// The runtime image jails run from; absent: the host's `/usr`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime_image: Option<crate::config::RuntimeImageHealth>,
}

#[utoipa::path(
    get,
    path = "/health",
    operation_id = "health",
    tag = "LibreChat",
    summary = "Health and languages (no auth)",
    responses(
        (status = 200, description = "OK", body = Health),
        (status = 503, description = "Draining: finishing its runs before it stops, taking no new ones", body = Health),
    )
)]
pub async fn health(State(op): State<Operator>, State(door): State<Door>) -> Response {
    let draining = door.shutdown.is_cancelled();
    let body = Json(Health {
        status: if draining { "draining" } else { "ok" },
        profile: PROFILE,
        version: op.health.version.clone(),
        languages: op.health.languages.clone(),
        runtime_image: op.health.runtime_image.clone(),
    });
    if draining {
        (axum::http::StatusCode::SERVICE_UNAVAILABLE, body).into_response()
    } else {
        body.into_response()
    }
}

#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    tag = "Operations",
    summary = "Prometheus metrics (root only; behind the API key with `metrics_require_key`)",
    responses(
        (status = 200, description = "Prometheus text exposition", content_type = "text/plain", body = String),
        (status = 404, description = "No metrics recorder", body = crate::error::ErrorBody),
    )
)]
pub async fn metrics(State(op): State<Operator>) -> Result<Response, ApiError> {
    let Some(handle) = &op.metrics else {
        return Err(ApiError::RouteNotFound("/metrics".to_owned()));
    };
    crate::telemetry::sample_process();
    let mut resp = handle.render().into_response();
    resp.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    Ok(resp)
}
