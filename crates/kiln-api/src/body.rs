//! Reading request bodies safely: content-type checks and size-limited
//! buffering that stops reading at the limit.

use axum::body::Body;
use axum::http::HeaderMap;
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::cell::Cell;
use tower_http::timeout::TimeoutError;

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

/// Bodies refused for their declared length are read away up to this size
/// (and for at most [`DRAIN_TIME`]) so the client gets the 413.
const DRAIN_MAX: u64 = 64 * 1024 * 1024;
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(10);

/// Reads away what is left of a multipart body the handler stopped reading
/// (a part over the upload limit, a batch past its file count, any early
/// refusal), at most [`DRAIN_MAX`] bytes and [`DRAIN_TIME`]: a client that
/// writes its whole body before reading the answer (Node's `fetch` with a
/// `FormData`) would otherwise get a reset connection instead of the 413.
pub async fn drain_multipart(multipart: &mut axum::extract::Multipart) {
    let drain = async {
        let mut read = 0u64;
        while let Ok(Some(mut field)) = multipart.next_field().await {
            while let Ok(Some(chunk)) = field.chunk().await {
                read += chunk.len() as u64;
                if read > DRAIN_MAX {
                    return;
                }
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_TIME, drain).await;
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
    if let Some(n) = declared.filter(|&n| n > limit as u64) {
        // Refused from the length alone. A client that writes its whole
        // body before reading would see a reset instead of this answer if
        // the connection closed now: read a bounded amount away first.
        if n <= DRAIN_MAX {
            let mut body = body;
            let _ = tokio::time::timeout(DRAIN_TIME, async {
                while let Some(Ok(_)) = body.frame().await {}
            })
            .await;
        }
        return Err(too_large());
    }
    // One buffer, sized from the declared length when there is one: the
    // body is held once, not once in pieces and again when joined.
    let mut buf = BytesMut::with_capacity(declared.map_or(0, |n| n as usize));
    let mut body = Limited::new(body, limit);
    let read = async {
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame?.into_data() {
                buf.extend_from_slice(&data);
            }
        }
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    };
    match read.await {
        Ok(()) => Ok(buf.freeze()),
        Err(e) => {
            // axum wraps body errors; look through the chain.
            if caused_by::<LengthLimitError>(e.as_ref()) {
                Err(too_large())
            } else if caused_by::<TimeoutError>(e.as_ref()) {
                Err(ApiError::BodyTimeout)
            } else {
                Err(ApiError::ReadBody(e.to_string()))
            }
        }
    }
}

/// Most JSON values (strings, numbers, array and object entries…) one
/// request body may hold once parsed. A body of small values — 8 MiB of
/// `[0,0,…]` is four million of them — would otherwise cost the server tens
/// of times its size in memory; LibreChat's largest bodies hold a few
/// thousand.
pub const MAX_JSON_VALUES: usize = 50_000;

/// Parses a JSON object, keeping only the fields named in `keys` (every
/// other field is skipped without being built) and at most
/// [`MAX_JSON_VALUES`] values in them, so that the memory a body costs is
/// a small multiple of its length whatever its shape.
pub fn parse_object(bytes: &[u8], keys: &[&str]) -> Result<Map<String, Value>, ApiError> {
    let budget = Cell::new(MAX_JSON_VALUES);
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let parsed = KnownFields {
        keys,
        budget: &budget,
    }
    .deserialize(&mut de)
    .and_then(|m| de.end().map(|()| m));
    match parsed {
        Ok(Some(obj)) => Ok(obj),
        Ok(None) => Err(ApiError::BadRequest(
            "Request body must be a JSON object".to_owned(),
        )),
        Err(_) if budget.get() == 0 => Err(ApiError::BadRequest(format!(
            "JSON body holds more than {MAX_JSON_VALUES} values"
        ))),
        Err(_) => Err(ApiError::BadRequest("Invalid JSON body".to_owned())),
    }
}

/// The top level: an object (`Some`, known fields only) or anything else
/// (`None`, skipped).
struct KnownFields<'a> {
    keys: &'a [&'a str],
    budget: &'a Cell<usize>,
}

impl<'de> DeserializeSeed<'de> for KnownFields<'_> {
    type Value = Option<Map<String, Value>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for KnownFields<'_> {
    type Value = Option<Map<String, Value>>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if self.keys.contains(&key.as_ref()) {
                let v = map.next_value_seed(Bounded(self.budget))?;
                out.insert(key.into_owned(), v);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(Some(out))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// A [`Value`] built while the shared budget of values lasts.
#[derive(Clone, Copy)]
struct Bounded<'a>(&'a Cell<usize>);

impl Bounded<'_> {
    fn take<E: de::Error>(self) -> Result<(), E> {
        match self.0.get() {
            0 => Err(E::custom("too many JSON values")),
            n => {
                self.0.set(n - 1);
                Ok(())
            }
        }
    }
}

impl<'de> DeserializeSeed<'de> for Bounded<'_> {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Bounded<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        self.take()?;
        Ok(Value::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        self.take()?;
        Ok(Value::from(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        self.take()?;
        Ok(Value::from(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        self.take()?;
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        self.take()?;
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        self.take()?;
        Ok(Value::String(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        self.take()?;
        Ok(Value::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        self.visit_unit()
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        self.take()?;
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(self)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        self.take()?;
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            self.take()?;
            let v = map.next_value_seed(self)?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

/// Whether `e` or any error in its source chain is an `E`.
pub fn caused_by<E: std::error::Error + 'static>(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.is::<E>() {
            return true;
        }
        cur = err.source();
    }
    false
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

    #[test]
    fn only_known_fields_are_kept_and_values_are_bounded() {
        let obj = parse_object(
            br#"{"a":1,"junk":[1,2,{"x":3}],"b":{"c":[true,null]}}"#,
            &["a", "b"],
        )
        .unwrap();
        assert_eq!(
            Value::Object(obj),
            serde_json::json!({"a":1,"b":{"c":[true,null]}})
        );
        // a huge unknown field costs nothing and is not counted
        let junk = format!(
            r#"{{"a":"x","junk":[{}0]}}"#,
            "0,".repeat(MAX_JSON_VALUES * 2)
        );
        assert_eq!(parse_object(junk.as_bytes(), &["a"]).unwrap()["a"], "x");
        // the same inside a known field is refused
        let known = format!(r#"{{"a":[{}0]}}"#, "0,".repeat(MAX_JSON_VALUES));
        let e = parse_object(known.as_bytes(), &["a"]).unwrap_err();
        assert!(e.to_string().contains("values"), "{e}");
        let just = format!(r#"{{"a":[{}0]}}"#, "0,".repeat(MAX_JSON_VALUES - 2));
        assert!(parse_object(just.as_bytes(), &["a"]).is_ok());
    }

    #[test]
    fn non_objects_and_broken_json_are_told_apart() {
        let not_obj = parse_object(b"[1,2]", &["a"]).unwrap_err().to_string();
        assert!(not_obj.contains("JSON object"), "{not_obj}");
        for bad in [&b"{"[..], b"{\"a\":1} trailing", b"", b"nul"] {
            assert!(
                parse_object(bad, &["a"])
                    .unwrap_err()
                    .to_string()
                    .contains("Invalid JSON")
            );
        }
        // escapes inside keys still match
        assert_eq!(parse_object(br#"{"\u0061":2}"#, &["a"]).unwrap()["a"], 2);
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
