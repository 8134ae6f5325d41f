//! `GET /health` (no auth, no IO: answers from what the binary probed at
//! startup) and `GET /metrics` (Prometheus text; open like health — it only
//! carries route/status counters and latencies, no ids or identities).

use axum::Json;
use axum::extract::State;
use axum::http::HeaderValue;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::config::AppState;
use crate::error::{ApiError, PROFILE};

pub async fn health(State(state): State<AppState>) -> Response {
    Json(json!({
        "status": "ok",
        "profile": PROFILE,
        "version": state.health.version,
        "languages": state.health.languages,
    }))
    .into_response()
}

pub async fn metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    let Some(handle) = &state.metrics else {
        return Err(ApiError::RouteNotFound("/metrics".to_owned()));
    };
    let mut resp = handle.render().into_response();
    resp.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    Ok(resp)
}
