//! Reading request bodies safely: content-type checks and size-limited
//! buffering that stops reading at the limit.

use axum::body::Body;
use axum::http::HeaderMap;
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};

use crate::error::ApiError;

/// JSON routes accept `application/json` (or `…+json`); a missing
/// content type is tolerated, any other is refused with 415.
pub fn require_json(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(ct) = headers.get(CONTENT_TYPE) else {
        return Ok(());
    };
    let essence = ct
        .to_str()
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    if essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
    {
        Ok(())
    } else {
        Err(ApiError::UnsupportedContentType(
            "Content-Type must be application/json",
        ))
    }
}

/// Buffer at most `limit` bytes of `body`; 413 beyond (checked against
/// `Content-Length` first, then while reading).
pub async fn read_limited(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<Bytes, ApiError> {
    let too_large = || ApiError::BodyTooLarge {
        limit: limit as u64,
    };
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => Err(too_large()),
        Err(e) => {
            // axum wraps body errors; look through one level too.
            let inner_limit = e
                .downcast_ref::<axum::Error>()
                .and_then(|ae| std::error::Error::source(ae))
                .is_some_and(|s| s.is::<LengthLimitError>());
            if inner_limit {
                Err(too_large())
            } else {
                Err(ApiError::ReadBody(e.to_string()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(ct: Option<&str>, len: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(ct) = ct {
            h.insert(CONTENT_TYPE, ct.parse().unwrap());
        }
        if let Some(len) = len {
            h.insert(CONTENT_LENGTH, len.parse().unwrap());
        }
        h
    }

    #[test]
    fn json_content_types() {
        assert!(require_json(&headers(None, None)).is_ok());
        assert!(require_json(&headers(Some("application/json; charset=utf-8"), None)).is_ok());
        assert!(require_json(&headers(Some("application/vnd.api+json"), None)).is_ok());
        assert!(require_json(&headers(Some("text/plain"), None)).is_err());
        assert!(require_json(&headers(Some("multipart/form-data; boundary=x"), None)).is_err());
    }

    #[tokio::test]
    async fn bodies_over_the_limit_are_refused() {
        let ok = read_limited(&headers(None, None), Body::from("12345"), 5).await;
        assert_eq!(ok.unwrap(), Bytes::from_static(b"12345"));
        let over = read_limited(&headers(None, None), Body::from("123456"), 5).await;
        assert!(matches!(over, Err(ApiError::BodyTooLarge { limit: 5 })));
        let declared = read_limited(&headers(None, Some("100")), Body::from("1"), 5).await;
        assert!(matches!(declared, Err(ApiError::BodyTooLarge { .. })));
    }
}
