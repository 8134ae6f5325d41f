//! The error envelopes of faces that answer `{"<FIELD>": "<message>"}`
//! (seed 003's `error`, seed 004's FastAPI-style `detail`), shared with the
//! layers that answer for such a face before its handler runs
//! ([`crate::cluster`]).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// `{"error": "<message>"}` with `status`: the programmatic face's (and
/// its attached workspaces') answer for a refusal that is not an
/// [`ApiError`].
pub fn plain(status: StatusCode, msg: &str) -> Response {
    (status, axum::Json(serde_json::json!({ "error": msg }))).into_response()
}

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
        ApiError::Kernel(e).into()
    }
}

/// FastAPI's envelope, `{"detail": "..."}` (seed 004's).
#[derive(Debug)]
pub enum Detail {}

impl Envelope for Detail {
    const FIELD: &'static str = "detail";
}
