//! What the jail gets when the gateway refuses or cuts a call: an HTTP
//! status, a JSON body `{"error": "<sentence>", "reason": "<code>"}` and the
//! code again in the `X-Kiln-Egress-Error` header (plus `Retry-After` for
//! 429 and 503), so a program can branch on the code and a model can read
//! the sentence.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};

/// The body type of every gateway response.
pub type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Header carrying the refusal code.
pub const ERROR_HEADER: &str = "x-kiln-egress-error";

/// A refused (or failed) call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub status: StatusCode,
    /// Stable code: `not_granted`, `path_not_allowed`, `rate_limited`, ...
    pub reason: &'static str,
    pub message: String,
    pub retry_after: Option<Duration>,
}

impl Refused {
    pub fn new(status: StatusCode, reason: &'static str, message: impl Into<String>) -> Refused {
        Refused {
            status,
            reason,
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn retry_after(mut self, d: Duration) -> Refused {
        self.retry_after = Some(d);
        self
    }

    pub fn bad_request(message: impl Into<String>) -> Refused {
        Refused::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn into_response(self) -> Response<Body> {
        let body = serde_json::json!({
            "error": self.message,
            "reason": self.reason,
        });
        let mut r = Response::new(full(body.to_string()));
        *r.status_mut() = self.status;
        let h = r.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(ERROR_HEADER, HeaderValue::from_static(self.reason));
        if let Some(d) = self.retry_after {
            let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
            h.insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
        }
        r
    }
}

/// A complete body.
pub fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}
