//! `/mcp`: the Model Context Protocol face (streamable HTTP), a thin face
//! over Kiln's runs and live kernels. This module is the transport and
//! JSON-RPC; [`tools`] turns a tool call into a run or a kernel evaluation
//! and renders it. No execution logic lives here.
//!
//! Both protocol generations the official SDKs speak are served on one
//! endpoint, told apart per request:
//!
//! - **Modern** (`2026-07-28`): every request carries its version, client
//!   capabilities and client info in `params._meta`
//!   (`io.modelcontextprotocol/protocolVersion`, ...), mirrored in the
//!   `MCP-Protocol-Version`, `Mcp-Method` and (for `tools/call`,
//!   `resources/read`) `Mcp-Name` headers, which must agree with the body
//!   (else 400, `-32020`). No handshake: `server/discover` says what the
//!   server is. An unknown version is 400 `-32022` with the supported
//!   ones; an unknown method is 404 `-32601`.
//! - **Legacy** (`2024-11-05` … `2025-11-25`): `initialize` answers with an
//!   `Mcp-Session-Id` that every later request must carry (400 without, 404
//!   for one that is unknown, closed, or another caller's); `DELETE /mcp`
//!   ends it. The session holds only the negotiated version: tools and
//!   kernels never depend on it.
//!
//! Every answer is one JSON object (`application/json`, which both
//! generations allow); `GET /mcp` (a standalone SSE stream) is 405.
//! Notifications and responses a client posts are accepted with 202.
//! Authentication is the API's own middleware (`X-API-Key`, `Bearer`, JWT);
//! the browser guard in front of every route (`origin.rs`) refuses a
//! foreign `Origin` with 403 and, on a keyless server, an unknown `Host`
//! with 421 (DNS rebinding), here as everywhere.

mod tools;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Extension;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use kiln_core::access::{Action, Caller, Policy, may};
use kiln_core::{Nanoid, Owner};
use serde_json::{Map, Value, json};

use crate::config::AppState;
use crate::error::ApiError;
use crate::identity::{Identity, header_user_id, resolve_caller};
use crate::kit::{Admitted, JsonBody, Open, Unresolved};
use crate::rate::Peer;

/// The modern (per-request metadata) revisions served.
pub const MODERN_VERSIONS: &[&str] = &["2026-07-28"];
/// The handshake revisions served, oldest first.
pub const HANDSHAKE_VERSIONS: &[&str] = &["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
const META_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";

const SESSION_HEADER: HeaderName = HeaderName::from_static("mcp-session-id");
const VERSION_HEADER: &str = "mcp-protocol-version";
const METHOD_HEADER: &str = "mcp-method";
const NAME_HEADER: &str = "mcp-name";

/// JSON-RPC and MCP error codes.
pub mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL_ERROR: i64 = -32603;
    pub const RESOURCE_NOT_FOUND: i64 = -32002;
    pub const HEADER_MISMATCH: i64 = -32020;
    pub const UNSUPPORTED_VERSION: i64 = -32022;
}

/// A JSON-RPC error object.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
            data: None,
        }
    }

    pub fn params(message: impl Into<String>) -> RpcError {
        RpcError::new(code::INVALID_PARAMS, message)
    }

    fn to_json(&self) -> Value {
        let mut e = json!({ "code": self.code, "message": self.message });
        if let Some(d) = &self.data {
            e["data"] = d.clone();
        }
        e
    }
}

/// One message a client posted.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    Request {
        id: Value,
        method: String,
        params: Map<String, Value>,
    },
    /// A notification, or a response to a server request (Kiln sends none):
    /// accepted and ignored.
    Other,
}

/// The body's bytes → a message; `Err` is the error to answer (with a
/// null id when the id could not be read).
pub fn parse_message(bytes: &[u8]) -> Result<Message, (Value, RpcError)> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        (
            Value::Null,
            RpcError::new(code::PARSE_ERROR, format!("Parse error: {e}")),
        )
    })?;
    let Value::Object(mut obj) = value else {
        let what = if value.is_array() {
            "batches are not supported: send one JSON-RPC message per request"
        } else {
            "a JSON-RPC message must be an object"
        };
        return Err((Value::Null, RpcError::new(code::INVALID_REQUEST, what)));
    };
    let id = obj.remove("id");
    let invalid = |id: Option<Value>, msg: &str| {
        (
            id.unwrap_or(Value::Null),
            RpcError::new(code::INVALID_REQUEST, msg),
        )
    };
    if let Some(id) = &id
        && !(id.is_string() || id.is_i64() || id.is_u64())
    {
        return Err(invalid(None, "id must be a string or an integer"));
    }
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(invalid(id, "jsonrpc must be \"2.0\""));
    }
    let method = match obj.remove("method") {
        Some(Value::String(m)) => m,
        Some(_) => return Err(invalid(id, "method must be a string")),
        // a response to a request of the server's
        None if id.is_some() && (obj.contains_key("result") || obj.contains_key("error")) => {
            return Ok(Message::Other);
        }
        None => return Err(invalid(id, "method is required")),
    };
    let Some(id) = id else {
        return Ok(Message::Other);
    };
    let params = match obj.remove("params") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(p)) => p,
        Some(_) => {
            return Err((id, RpcError::params("params must be an object")));
        }
    };
    Ok(Message::Request { id, method, params })
}

/// Which generation a request speaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Era {
    /// Per-request metadata at this version.
    Modern(String),
    /// The handshake generation.
    Legacy,
}

/// The era of a request, after the modern checks: the `_meta` envelope,
/// the headers that must mirror it, and a supported version. `header`
/// reads a request header (lower-case name).
pub fn classify<'h>(
    method: &str,
    params: &Map<String, Value>,
    header: impl Fn(&str) -> Option<&'h str>,
) -> Result<Era, RpcError> {
    let Some(meta) = params.get("_meta").and_then(Value::as_object) else {
        return Ok(Era::Legacy);
    };
    let Some(version) = meta.get(META_VERSION) else {
        return Ok(Era::Legacy);
    };
    let Value::String(version) = version else {
        return Err(RpcError::params(format!(
            "_meta.{META_VERSION} must be a string"
        )));
    };
    if !meta.contains_key(META_CAPABILITIES) {
        return Err(RpcError::params(format!(
            "params._meta is missing {META_CAPABILITIES}"
        )));
    }
    let mismatch = |what: String| RpcError::new(code::HEADER_MISMATCH, what);
    if header(VERSION_HEADER) != Some(version.as_str()) {
        return Err(mismatch(format!(
            "MCP-Protocol-Version header does not match _meta.{META_VERSION} ({version})"
        )));
    }
    if header(METHOD_HEADER) != Some(method) {
        return Err(mismatch(format!(
            "Mcp-Method header does not match the method ({method})"
        )));
    }
    let name_key = match method {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
        _ => None,
    };
    if let Some(key) = name_key
        && let Some(Value::String(body)) = params.get(key)
        && header(NAME_HEADER).map(decode_header_value).as_deref() != Some(body.as_str())
    {
        return Err(mismatch(format!(
            "Mcp-Name header does not match params.{key}"
        )));
    }
    if !MODERN_VERSIONS.contains(&version.as_str()) {
        let mut e = RpcError::new(code::UNSUPPORTED_VERSION, "Unsupported protocol version");
        e.data = Some(json!({ "supported": supported_versions(), "requested": version }));
        return Err(e);
    }
    Ok(Era::Modern(version.clone()))
}

/// A header value in the `=?base64?…?=` form decoded (others as sent).
fn decode_header_value(v: &str) -> String {
    use base64::Engine as _;
    v.strip_prefix("=?base64?")
        .and_then(|rest| rest.strip_suffix("?="))
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .and_then(|b| String::from_utf8(b).ok())
        .unwrap_or_else(|| v.to_owned())
}

/// Every version served, newest first.
fn supported_versions() -> Vec<&'static str> {
    MODERN_VERSIONS
        .iter()
        .rev()
        .chain(HANDSHAKE_VERSIONS.iter().rev())
        .copied()
        .collect()
}

/// Legacy sessions (`Mcp-Session-Id`): the caller that opened each and
/// when it was last used. Idle ones are dropped after [`SESSION_IDLE`];
/// at most [`MAX_SESSIONS`] are kept (the least recently used goes).
/// Not an `Expiring`: a legacy session holds nothing to close, and the
/// count bound evicts the least recently used, which `Expiring` does not.
#[derive(Debug, Default)]
pub struct McpSessions(Mutex<HashMap<String, LegacySession>>);

#[derive(Debug)]
struct LegacySession {
    owner: Owner,
    last_used: Instant,
}

/// Whether `caller` may use a session `owner` opened (the one access rule;
/// writing acts in the owner's name, so the deployment's policy, which only
/// widens reading and controlling by id, plays no part).
fn mine(caller: &Caller, owner: &Owner) -> bool {
    may(Policy::default(), caller, Action::Write, owner).is_ok()
}

const SESSION_IDLE: Duration = Duration::from_secs(24 * 3600);
const MAX_SESSIONS: usize = 10_000;

impl McpSessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, LegacySession>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn open(&self, caller: &Caller) -> String {
        let id = Nanoid::random().as_str().to_owned();
        let now = Instant::now();
        let mut map = self.lock();
        map.retain(|_, s| now.duration_since(s.last_used) < SESSION_IDLE);
        if map.len() >= MAX_SESSIONS
            && let Some(oldest) = map
                .iter()
                .min_by_key(|(_, s)| s.last_used)
                .map(|(k, _)| k.clone())
        {
            map.remove(&oldest);
        }
        map.insert(
            id.clone(),
            LegacySession {
                owner: Owner::of(caller),
                last_used: now,
            },
        );
        id
    }

    /// Whether `id` is a live session `caller` may use (touching it): a
    /// protocol session acts in its owner's name, so only its owner may
    /// ([`Action::Write`]).
    fn touch(&self, id: &str, caller: &Caller) -> bool {
        let now = Instant::now();
        let mut map = self.lock();
        match map.get_mut(id) {
            Some(s) if mine(caller, &s.owner) && now.duration_since(s.last_used) < SESSION_IDLE => {
                s.last_used = now;
                true
            }
            _ => false,
        }
    }

    fn close(&self, id: &str, caller: &Caller) -> bool {
        let mut map = self.lock();
        if map.get(id).is_some_and(|s| mine(caller, &s.owner)) {
            map.remove(id);
            true
        } else {
            false
        }
    }
}

/// What a method handler sees of the request.
pub(crate) struct Call<'a> {
    pub state: &'a AppState,
    pub identity: &'a Identity,
    pub headers: &'a HeaderMap,
    pub peer: Peer,
}

/// `POST /mcp`.
#[utoipa::path(
    post,
    path = "/mcp",
    operation_id = "mcp",
    tag = "MCP",
    summary = "Model Context Protocol (streamable HTTP)",
    description = "One JSON-RPC request or notification per POST (`Accept: application/json, text/event-stream`); answers are `application/json`. Tools: `execute_code`, `create_session`, `close_session`; outputs are readable with `resources/read`. Serves the 2026-07-28 revision (per-request `_meta`, `server/discover`, `MCP-Protocol-Version`/`Mcp-Method`/`Mcp-Name` headers) and the `initialize` handshake with `Mcp-Session-Id` (2024-11-05 to 2025-11-25). See docs/mcp.md.",
    request_body(content = Object, description = "A JSON-RPC 2.0 request or notification"),
    responses(
        (status = 200, description = "A JSON-RPC response (result or error)", body = Object),
        (status = 202, description = "A notification (or response) accepted"),
        (status = 400, description = "Unparseable message, header mismatch (-32020), unsupported version (-32022), missing `Mcp-Session-Id`", body = Object),
        (status = 401, description = "Missing or invalid credentials", body = crate::error::ErrorBody),
        (status = 403, description = "A foreign `Origin` (the browser guard in front of every route)", body = Object),
        (status = 404, description = "Unknown method (2026-07-28), or an unknown or closed `Mcp-Session-Id`", body = Object),
    )
)]
pub async fn post(
    State(state): State<AppState>,
    Extension(sessions): Extension<Arc<McpSessions>>,
    identity: Identity,
    peer: Peer,
    headers: HeaderMap,
    admitted: Admitted<ApiError, Unresolved, JsonBody, Open>,
) -> Result<Response, ApiError> {
    let (id, method, params) = match parse_message(&admitted.body) {
        Ok(Message::Request { id, method, params }) => (id, method, params),
        Ok(Message::Other) => return Ok(StatusCode::ACCEPTED.into_response()),
        Err((id, e)) => return Ok(reply(StatusCode::BAD_REQUEST, &id, Err(e))),
    };
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let era = match classify(&method, &params, header) {
        Ok(era) => era,
        Err(e) => return Ok(reply(StatusCode::BAD_REQUEST, &id, Err(e))),
    };
    let caller = resolve_caller(&state.config, &identity, &[header_user_id(&headers)?])?;
    let call = Call {
        state: &state,
        identity: &identity,
        headers: &headers,
        peer,
    };
    match era {
        Era::Modern(_) => {
            let result = modern(&call, &method, &params).await;
            // the revision's one status for a method error; every other
            // error of a method is an answer like a result (200)
            let status = match &result {
                Err(e) if e.code == code::METHOD_NOT_FOUND => StatusCode::NOT_FOUND,
                _ => StatusCode::OK,
            };
            let result = result.map(|mut v| {
                v["resultType"] = json!("complete");
                if cacheable(&method) {
                    v["ttlMs"] = json!(0);
                    v["cacheScope"] = json!("private");
                }
                v
            });
            Ok(reply(status, &id, result))
        }
        Era::Legacy if method == "initialize" => {
            let session = sessions.open(&caller);
            let mut resp = reply(StatusCode::OK, &id, Ok(initialize(&params)));
            if let Ok(v) = HeaderValue::from_str(&session) {
                resp.headers_mut().insert(SESSION_HEADER, v);
            }
            Ok(resp)
        }
        Era::Legacy => {
            if let Some(v) = header(VERSION_HEADER)
                && !HANDSHAKE_VERSIONS.contains(&v)
            {
                let e = RpcError::new(
                    code::INVALID_REQUEST,
                    format!("Unsupported MCP-Protocol-Version: {v}"),
                );
                return Ok(reply(StatusCode::BAD_REQUEST, &id, Err(e)));
            }
            let Some(session) = header(SESSION_HEADER.as_str()) else {
                let e = RpcError::new(
                    code::INVALID_REQUEST,
                    "Mcp-Session-Id is required: call initialize first, or send params._meta with io.modelcontextprotocol/protocolVersion (2026-07-28)",
                );
                return Ok(reply(StatusCode::BAD_REQUEST, &id, Err(e)));
            };
            if !sessions.touch(session, &caller) {
                let e = RpcError::new(code::INVALID_REQUEST, "Session not found");
                return Ok(reply(StatusCode::NOT_FOUND, &id, Err(e)));
            }
            let result = match method.as_str() {
                "ping" => Ok(json!({})),
                _ => dispatch(&call, &method, &params).await,
            };
            Ok(reply(StatusCode::OK, &id, result))
        }
    }
}

/// `DELETE /mcp`: ends a legacy session.
#[utoipa::path(
    delete,
    path = "/mcp",
    operation_id = "mcpEndSession",
    tag = "MCP",
    summary = "End an MCP session (handshake generation)",
    params(("mcp-session-id" = String, Header, description = "The session `initialize` answered with")),
    responses(
        (status = 204, description = "Ended"),
        (status = 400, description = "No `Mcp-Session-Id`", body = Object),
        (status = 401, description = "Missing or invalid credentials", body = crate::error::ErrorBody),
        (status = 404, description = "Unknown or already ended", body = Object),
    )
)]
pub async fn delete(
    State(state): State<AppState>,
    Extension(sessions): Extension<Arc<McpSessions>>,
    identity: Identity,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let caller = resolve_caller(&state.config, &identity, &[header_user_id(&headers)?])?;
    let Some(id) = headers.get(SESSION_HEADER).and_then(|v| v.to_str().ok()) else {
        let e = RpcError::new(code::INVALID_REQUEST, "Mcp-Session-Id is required");
        return Ok(reply(StatusCode::BAD_REQUEST, &Value::Null, Err(e)));
    };
    if sessions.close(id, &caller) {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        let e = RpcError::new(code::INVALID_REQUEST, "Session not found");
        Ok(reply(StatusCode::NOT_FOUND, &Value::Null, Err(e)))
    }
}

/// A modern request: `server/discover` or a method both generations share.
async fn modern(
    call: &Call<'_>,
    method: &str,
    params: &Map<String, Value>,
) -> Result<Value, RpcError> {
    match method {
        "server/discover" => {
            let mut v = server_description();
            v["supportedVersions"] = json!(supported_versions());
            v["_meta"] = json!({ META_SERVER_INFO: server_info() });
            Ok(v)
        }
        _ => dispatch(call, method, params).await,
    }
}

/// The methods both generations share.
async fn dispatch(
    call: &Call<'_>,
    method: &str,
    params: &Map<String, Value>,
) -> Result<Value, RpcError> {
    match method {
        "tools/list" => Ok(json!({ "tools": tools::definitions() })),
        "tools/call" => tools::call(call, params).await,
        "resources/list" => Ok(json!({ "resources": [] })),
        "resources/templates/list" => Ok(json!({ "resourceTemplates": tools::templates() })),
        "resources/read" => tools::read(call, params).await,
        "prompts/list" => Ok(json!({ "prompts": [] })),
        other => Err(RpcError::new(
            code::METHOD_NOT_FOUND,
            format!("Method not found: {other}"),
        )),
    }
}

/// Methods whose modern results carry caching directives.
fn cacheable(method: &str) -> bool {
    matches!(
        method,
        "server/discover"
            | "tools/list"
            | "resources/list"
            | "resources/templates/list"
            | "resources/read"
            | "prompts/list"
    )
}

/// `initialize`: the client's version when Kiln speaks it, else the newest
/// handshake version.
fn initialize(params: &Map<String, Value>) -> Value {
    let asked = params.get("protocolVersion").and_then(Value::as_str);
    let version = asked
        .filter(|v| HANDSHAKE_VERSIONS.contains(v))
        .unwrap_or(HANDSHAKE_VERSIONS[HANDSHAKE_VERSIONS.len() - 1]);
    let mut v = server_description();
    v["protocolVersion"] = json!(version);
    v["serverInfo"] = server_info();
    v
}

fn server_info() -> Value {
    json!({ "name": "kiln", "title": "Kiln code interpreter", "version": env!("CARGO_PKG_VERSION") })
}

fn server_description() -> Value {
    json!({
        "capabilities": { "tools": { "listChanged": false }, "resources": {} },
        "instructions": tools::INSTRUCTIONS,
    })
}

/// A JSON-RPC response at `status`.
fn reply(status: StatusCode, id: &Value, result: Result<Value, RpcError>) -> Response {
    let body = match result {
        Ok(r) => json!({ "jsonrpc": "2.0", "id": id, "result": r }),
        Err(e) => json!({ "jsonrpc": "2.0", "id": id, "error": e.to_json() }),
    };
    (status, axum::Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(bytes: &str) -> (Value, String, Map<String, Value>) {
        match parse_message(bytes.as_bytes()) {
            Ok(Message::Request { id, method, params }) => (id, method, params),
            other => panic!("not a request: {other:?}"),
        }
    }

    fn refused(bytes: &str) -> (Value, i64) {
        match parse_message(bytes.as_bytes()) {
            Err((id, e)) => (id, e.code),
            other => panic!("accepted: {other:?}"),
        }
    }

    #[test]
    fn bad_json_is_a_parse_error_with_a_null_id() {
        assert_eq!(refused("{\"jsonrpc\":"), (Value::Null, code::PARSE_ERROR));
        assert_eq!(refused("not json"), (Value::Null, code::PARSE_ERROR));
    }

    #[test]
    fn malformed_messages_are_invalid_requests() {
        assert_eq!(refused("[]"), (Value::Null, code::INVALID_REQUEST));
        assert_eq!(refused("3"), (Value::Null, code::INVALID_REQUEST));
        assert_eq!(
            refused(r#"{"id":1,"method":"tools/list"}"#),
            (json!(1), code::INVALID_REQUEST)
        );
        assert_eq!(
            refused(r#"{"jsonrpc":"2.0","id":1,"method":7}"#),
            (json!(1), code::INVALID_REQUEST)
        );
        assert_eq!(
            refused(r#"{"jsonrpc":"2.0","id":{"x":1},"method":"ping"}"#),
            (Value::Null, code::INVALID_REQUEST)
        );
        assert_eq!(
            refused(r#"{"jsonrpc":"2.0","id":"a","method":"ping","params":[1]}"#),
            (json!("a"), code::INVALID_PARAMS)
        );
    }

    #[test]
    fn notifications_and_responses_are_not_requests() {
        let n = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
        assert_eq!(parse_message(n.as_bytes()), Ok(Message::Other));
        let r = r#"{"jsonrpc":"2.0","id":4,"result":{}}"#;
        assert_eq!(parse_message(r.as_bytes()), Ok(Message::Other));
        let (id, method, params) = request(r#"{"jsonrpc":"2.0","id":"x","method":"tools/list"}"#);
        assert_eq!(
            (id, method.as_str(), params.len()),
            (json!("x"), "tools/list", 0)
        );
    }

    fn modern_params(version: &str) -> Map<String, Value> {
        let v = json!({
            "name": "execute_code",
            "_meta": { META_VERSION: version, META_CAPABILITIES: {} },
        });
        v.as_object().cloned().unwrap()
    }

    fn headers<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<&'a str> {
        move |n| pairs.iter().find(|(k, _)| *k == n).map(|(_, v)| *v)
    }

    #[test]
    fn a_request_without_the_envelope_is_legacy() {
        let p = json!({ "protocolVersion": "2025-06-18" });
        let era = classify("initialize", p.as_object().unwrap(), headers(&[]));
        assert_eq!(era, Ok(Era::Legacy));
    }

    #[test]
    fn a_modern_request_needs_headers_that_mirror_its_body() {
        let p = modern_params("2026-07-28");
        let good = [
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "execute_code"),
        ];
        assert_eq!(
            classify("tools/call", &p, headers(&good)),
            Ok(Era::Modern("2026-07-28".into()))
        );
        // the name may come base64-encoded
        let encoded = [
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "=?base64?ZXhlY3V0ZV9jb2Rl?="),
        ];
        assert!(classify("tools/call", &p, headers(&encoded)).is_ok());
        for bad in [
            &good[1..],
            &[good[0], ("mcp-method", "tools/list"), good[2]][..],
            &[good[0], good[1], ("mcp-name", "close_session")][..],
            &good[..2],
        ] {
            let e = classify("tools/call", &p, headers(bad)).unwrap_err();
            assert_eq!(e.code, code::HEADER_MISMATCH, "{bad:?}");
        }
    }

    #[test]
    fn an_unknown_modern_version_names_the_supported_ones() {
        let p = modern_params("2099-01-01");
        let h = [
            ("mcp-protocol-version", "2099-01-01"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "execute_code"),
        ];
        let e = classify("tools/call", &p, headers(&h)).unwrap_err();
        assert_eq!(e.code, code::UNSUPPORTED_VERSION);
        let data = e.data.unwrap();
        assert_eq!(data["requested"], "2099-01-01");
        assert_eq!(data["supported"][0], "2026-07-28");
        assert!(
            data["supported"]
                .as_array()
                .unwrap()
                .contains(&json!("2025-11-25"))
        );
    }

    #[test]
    fn a_modern_envelope_without_capabilities_is_invalid_params() {
        let p = json!({ "_meta": { META_VERSION: "2026-07-28" } });
        let e = classify("tools/list", p.as_object().unwrap(), headers(&[])).unwrap_err();
        assert_eq!(e.code, code::INVALID_PARAMS);
    }

    #[test]
    fn initialize_echoes_a_known_version_and_counters_an_unknown_one() {
        let p = json!({ "protocolVersion": "2025-03-26" });
        assert_eq!(
            initialize(p.as_object().unwrap())["protocolVersion"],
            "2025-03-26"
        );
        let p = json!({ "protocolVersion": "1999-01-01" });
        assert_eq!(
            initialize(p.as_object().unwrap())["protocolVersion"],
            "2025-11-25"
        );
    }

    #[test]
    fn legacy_sessions_belong_to_their_opener() {
        let (alice, bob) = (
            Caller::identified("local", "alice"),
            Caller::identified("local", "bob"),
        );
        let s = McpSessions::default();
        let id = s.open(&alice);
        assert!(s.touch(&id, &alice));
        assert!(!s.touch(&id, &bob));
        // an identity-less caller does not use someone else's either
        assert!(!s.touch(&id, &Caller::anonymous("local")));
        assert!(!s.close(&id, &bob));
        assert!(s.close(&id, &alice));
        assert!(!s.touch(&id, &alice));
    }
}
