//! Cross-cutting request handling: the execution-profile check (and the
//! profile header on every response), API-key authentication, HTTP metrics,
//! request ids, and JSON answers for panics, unknown routes and methods.

use std::any::Any;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderName, HeaderValue, Response};
use axum::middleware::Next;
use axum::response::IntoResponse;
use kiln_core::Nanoid;
use subtle::ConstantTimeEq;
use tower_http::request_id::{MakeRequestId, RequestId};

use crate::config::{AppState, AuthMode};
use crate::error::{ApiError, KeyProblem, PROFILE};
use crate::identity::{Caller, Identity};

/// Request header naming the profile the client expects.
pub const EXPECTED_PROFILE: HeaderName = HeaderName::from_static("x-codeapi-expected-profile");
/// Response header naming the profile that answered.
pub const EXECUTION_PROFILE: HeaderName = HeaderName::from_static("x-codeapi-execution-profile");
/// The request id header (generated when absent, echoed on the response).
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The request's id (set by the request-id layer), for the audit log.
pub fn request_id(headers: &axum::http::HeaderMap) -> Option<String> {
    headers
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// Check `X-CodeAPI-Expected-Profile` before anything else and stamp
/// `X-CodeAPI-Execution-Profile` on every response: `stateful` when the
/// client asked for it (Kiln serves both profiles, spec §3), else `default`.
pub async fn profile(req: Request, next: Next) -> axum::response::Response {
    let (mut resp, reached) = match check_profile(&req) {
        Ok(p) => (next.run(req).await, p),
        Err(e) => (e.into_response(), PROFILE),
    };
    resp.headers_mut()
        .insert(EXECUTION_PROFILE, HeaderValue::from_static(reached));
    resp
}

/// Whether the request expects the stateful profile (the middleware has
/// refused any other value than these two).
pub fn expects_stateful(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(EXPECTED_PROFILE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case(STATEFUL))
}

/// The profile of LibreChat's runtime sessions.
pub const STATEFUL: &str = "stateful";

/// The profile the request reaches, or why it is refused.
fn check_profile(req: &Request) -> Result<&'static str, ApiError> {
    let values: Vec<String> = req
        .headers()
        .get_all(EXPECTED_PROFILE)
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).trim().to_owned())
        .collect();
    match values.as_slice() {
        [] => Ok(PROFILE),
        [one] if one.eq_ignore_ascii_case(PROFILE) => Ok(PROFILE),
        [one] if one.eq_ignore_ascii_case(STATEFUL) => Ok(STATEFUL),
        // Anything else, including a duplicated header, is invalid.
        many => Err(ApiError::InvalidProfile(many.join(", "))),
    }
}

/// Authenticates the request under the configured mode: the verified
/// caller of a token, an empty [`Identity`] when the mode is `none` or the
/// shared key matched, or the refusal. Keys are compared in constant time;
/// neither keys nor tokens are ever logged.
///
/// - `api-key`: a matching `X-API-Key` or `Bearer` value, else 401
///   `Unauthorized`.
/// - `jwt`: a `Bearer` token that verifies (§2.2), else 401 `Bearer token
///   is required` / `Invalid bearer token`.
/// - `api-key,jwt`: a matching key; else a `Bearer` value is verified as a
///   token; else `Unauthorized` when a wrong `X-API-Key` was sent, `Bearer
///   token is required` when nothing was.
///
/// `/health` is outside every mode.
pub fn authenticate(state: &AppState, req: &Request) -> Result<Identity, ApiError> {
    let mode = state.config.auth;
    if mode == AuthMode::None {
        return Ok(Identity::default());
    }
    if mode.accepts_key()
        && let Some(expected) = state.config.api_key.as_deref()
        && presented_keys(req).any(|k| key_matches(k, expected))
    {
        return Ok(Identity::default());
    }
    if !mode.accepts_jwt() {
        let problem = if presented_keys(req).next().is_some() {
            KeyProblem::Wrong
        } else {
            KeyProblem::Missing
        };
        return Err(refused(problem));
    }
    let Some(verifier) = state.config.jwt.as_deref() else {
        return Err(ApiError::JwtMisconfigured);
    };
    let Some(token) = bearer(req) else {
        return Err(
            if mode.accepts_key() && req.headers().contains_key("x-api-key") {
                refused(KeyProblem::Wrong)
            } else {
                tracing::info!("request refused: no bearer token was sent");
                ApiError::BearerRequired
            },
        );
    };
    let token = std::str::from_utf8(token).map_err(|_| crate::jwt::Reject::Malformed)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    match verifier.verify(token, now) {
        Ok(p) => Ok(Identity(Some(Caller::identified(&p.tenant, &p.user_id)))),
        Err(reason) => {
            tracing::info!(%reason, "bearer token refused");
            Err(reason.into())
        }
    }
}

/// The 401 for `problem`, logged (never the key itself).
fn refused(problem: KeyProblem) -> ApiError {
    tracing::info!(reason = %problem, "request refused: 401");
    ApiError::Unauthenticated(problem)
}

/// The identity of a request whose `header` carries the shared key (a
/// compatibility face's own key header), when the mode accepts keys and it
/// matches; `None` otherwise (the caller then tries [`authenticate`]).
pub fn key_in_header(state: &AppState, req: &Request, header: &HeaderName) -> Option<Identity> {
    let mode = state.config.auth;
    if mode == AuthMode::None {
        return Some(Identity::default());
    }
    let expected = state.config.api_key.as_deref()?;
    (mode.accepts_key()
        && req
            .headers()
            .get_all(header)
            .iter()
            .any(|v| key_matches(v.as_bytes(), expected)))
    .then(Identity::default)
}

/// Authentication for LibreChat's and Kiln's routes it wraps (not
/// `/health`, `/metrics`); the verified caller goes into the request's
/// extensions for the handlers' [`Identity`] extractor.
pub async fn auth(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> axum::response::Response {
    let who = authenticate(&state, &req);
    admit(req, next, who).await
}

/// The request goes on with the caller's identity, or the refusal is
/// the answer.
async fn admit(
    mut req: Request,
    next: Next,
    who: Result<Identity, ApiError>,
) -> axum::response::Response {
    match who {
        Ok(identity) => {
            req.extensions_mut().insert(identity);
            next.run(req).await
        }
        Err(e) => e.into_response(),
    }
}

/// The operator's view (`/admin/*`: every tenant's principals, runs,
/// stored bytes and the egress ledger) needs the operator's credential:
/// the API key (in any auth mode it is configured in, `jwt` included), or
/// no authentication at all (`auth = none`). A LibreChat token, which
/// every chat user holds, never opens it: 403.
pub fn authenticate_operator(state: &AppState, req: &Request) -> Result<(), ApiError> {
    if state.config.auth == AuthMode::None {
        return Ok(());
    }
    let key = state.config.api_key.as_deref().filter(|k| !k.is_empty());
    if let Some(expected) = key
        && presented_keys(req).any(|k| key_matches(k, expected))
    {
        return Ok(());
    }
    // refused: 403 to a caller who proved who they are, 401 otherwise
    match authenticate(state, req) {
        Ok(_) => Err(ApiError::OperatorOnly {
            key_configured: key.is_some(),
        }),
        Err(e) => Err(e),
    }
}

/// [`authenticate_operator`] as the layer of the admin routes.
pub async fn operator_auth(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> axum::response::Response {
    let who = authenticate_operator(&state, &req).map(|()| Identity::default());
    admit(req, next, who).await
}

/// Whether the request presents a key at all (`X-API-Key` or a bearer
/// value), for faces whose refusal says which was wrong.
pub fn key_sent(req: &Request) -> bool {
    presented_keys(req).next().is_some()
}

/// The `Authorization: Bearer` value, if any.
fn bearer(req: &Request) -> Option<&[u8]> {
    req.headers()
        .get_all(axum::http::header::AUTHORIZATION)
        .iter()
        .find_map(|v| {
            let v = v.as_bytes();
            let (scheme, rest) = v.split_at_checked(7)?;
            scheme
                .eq_ignore_ascii_case(b"bearer ")
                .then(|| rest.trim_ascii())
                .filter(|t| !t.is_empty())
        })
}

/// Keys the request presents: `X-API-Key` values and `Bearer` tokens.
fn presented_keys(req: &Request) -> impl Iterator<Item = &[u8]> {
    let headers = req.headers();
    let api_keys = headers.get_all("x-api-key").iter().map(|v| v.as_bytes());
    api_keys.chain(bearer(req))
}

fn key_matches(presented: &[u8], expected: &str) -> bool {
    presented.ct_eq(expected.as_bytes()).into()
}

/// Record `kiln_http_requests_total{route,status}` and
/// `kiln_http_request_duration_seconds{route}` (time to response head).
pub async fn http_metrics(req: Request, next: Next) -> axum::response::Response {
    let route = route_label(req.extensions().get::<MatchedPath>());
    let started = Instant::now();
    let resp = next.run(req).await;
    let status = resp.status().as_u16().to_string();
    metrics::counter!("kiln_http_requests_total", "route" => route.clone(), "status" => status)
        .increment(1);
    metrics::histogram!("kiln_http_request_duration_seconds", "route" => route)
        .record(started.elapsed().as_secs_f64());
    resp
}

/// The route template without the `/v1` prefix (`/download/{session_id}/{file_id}`),
/// or `unmatched`, so labels stay bounded.
pub fn route_label(matched: Option<&MatchedPath>) -> String {
    match matched {
        Some(m) => {
            let p = m.as_str();
            match p.strip_prefix("/v1") {
                Some("") => "/".to_owned(),
                Some(rest) if rest.starts_with('/') => rest.to_owned(),
                _ => p.to_owned(),
            }
        }
        None => "unmatched".to_owned(),
    }
}

/// Request ids are fresh nanoids.
#[derive(Clone, Copy, Default)]
pub struct NanoidRequestId;

impl MakeRequestId for NanoidRequestId {
    fn make_request_id<B>(&mut self, _req: &http::Request<B>) -> Option<RequestId> {
        HeaderValue::from_str(Nanoid::random().as_str())
            .ok()
            .map(RequestId::new)
    }
}

/// The JSON 500 answered when a handler panics.
pub fn panic_response(err: Box<dyn Any + Send + 'static>) -> Response<Body> {
    let detail = if let Some(s) = err.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = err.downcast_ref::<&str>() {
        (*s).to_owned()
    } else {
        "unknown panic payload".to_owned()
    };
    ApiError::Panic(detail).into_response()
}

/// Unknown paths (including `/exec/programmatic`).
pub async fn not_found(req: Request) -> ApiError {
    ApiError::RouteNotFound(req.uri().path().to_owned())
}

/// Known paths with an unsupported method.
pub async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

/// Seed 004's key header.
pub const AUTH_TOKEN: HeaderName = HeaderName::from_static("x-auth-token");
/// Seed 003's key header.
pub const ACCESS_TOKEN: HeaderName = HeaderName::from_static("x-access-token");

/// The key header of the compatibility face serving `path` (seed 004's
/// under `/api/v1/`, seed 003's under `runtime_api_prefix`), when that
/// face is on; `None` for Kiln's own routes.
pub fn key_header(config: &crate::config::ApiConfig, path: &str) -> Option<HeaderName> {
    let under = |prefix: &str| {
        path.strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    };
    if config.seed004_api && under("/api/v1") {
        Some(AUTH_TOKEN)
    } else if config.runtime_api_prefix.as_deref().is_some_and(under) {
        Some(ACCESS_TOKEN)
    } else {
        None
    }
}

/// Authenticates with the key in `header`, else as Kiln's own routes do.
pub fn authenticate_with(
    state: &AppState,
    req: &Request,
    header: &HeaderName,
) -> Result<Identity, ApiError> {
    if let Some(identity) = key_in_header(state, req, header) {
        return Ok(identity);
    }
    authenticate(state, req)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req_with(headers: &[(&str, &str)]) -> Request {
        let mut b = http::Request::builder().uri("/v1/exec");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(Body::empty()).unwrap()
    }

    #[test]
    fn profile_check_reaches_default_or_stateful() {
        assert_eq!(check_profile(&req_with(&[])).ok(), Some("default"));
        let d = check_profile(&req_with(&[("x-codeapi-expected-profile", "default")]));
        assert_eq!(d.ok(), Some("default"));
        let st = check_profile(&req_with(&[("x-codeapi-expected-profile", "Stateful")]));
        assert_eq!(st.ok(), Some("stateful"));
    }

    #[test]
    fn profile_check_rejects_unknown_and_duplicate() {
        let bad = check_profile(&req_with(&[("x-codeapi-expected-profile", "turbo")]));
        assert!(matches!(bad, Err(ApiError::InvalidProfile(p)) if p == "turbo"));
        let dup = check_profile(&req_with(&[
            ("x-codeapi-expected-profile", "default"),
            ("x-codeapi-expected-profile", "default"),
        ]));
        assert!(matches!(dup, Err(ApiError::InvalidProfile(_))));
    }

    #[test]
    fn presented_keys_come_from_x_api_key_and_bearer() {
        let r = req_with(&[("x-api-key", "k1"), ("authorization", "Bearer  k2 ")]);
        let keys: Vec<&[u8]> = presented_keys(&r).collect();
        assert_eq!(keys, [&b"k1"[..], &b"k2"[..]]);
        let r = req_with(&[("authorization", "Basic abc")]);
        assert_eq!(presented_keys(&r).count(), 0);
    }

    #[test]
    fn key_comparison_is_exact() {
        assert!(key_matches(b"secret", "secret"));
        assert!(!key_matches(b"secre", "secret"));
        assert!(!key_matches(b"secret!", "secret"));
        assert!(!key_matches(b"", "secret"));
    }
}
