//! The operator's web console, served at `/console/` when `console` is on.
//!
//! Static assets only, embedded in the binary: the page, its stylesheet and
//! script, and the CodeMirror bundle when it was built (`build.rs`; without
//! it the console edits in a `<textarea>`); the API reference page at
//! [`API_PATH`], Swagger UI (npm's `swagger-ui-dist`, copied by the same
//! build) reading `/openapi.json`. The pages carry no secret and
//! need no key; every piece of data they show comes from the API with the
//! key the operator typed, kept in the tab's `sessionStorage` and sent as
//! `X-API-Key` (never in a URL). A strict Content-Security-Policy allows
//! scripts, styles and connections from this origin only.

use axum::Router;
use axum::extract::Path;
use axum::http::header::{CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, LOCATION};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::config::AppState;
use crate::error::ApiError;

/// Where the console lives.
pub const PATH: &str = "/console/";

/// Same-origin everything; images also from `blob:` (downloaded outputs
/// shown inline); no framing, no plugins, no forms posting elsewhere.
/// The page itself also allows the style elements carrying its per-response
/// nonce ([`page_csp`]): CodeMirror injects its styles that way.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
img-src 'self' blob:; connect-src 'self'; font-src 'self'; base-uri 'none'; \
form-action 'self'; frame-ancestors 'none'";

/// [`CSP`] with `nonce` allowed for style elements.
pub fn page_csp(nonce: &str) -> String {
    CSP.replace(
        "style-src 'self';",
        &format!("style-src 'self' 'nonce-{nonce}';"),
    )
}

/// Where the page template takes its nonce.
const NONCE_SLOT: &str = "{{STYLE_NONCE}}";

const INDEX: &str = include_str!("../console/index.html");
const APP_JS: &str = include_str!("../console/app.js");
const APP_CSS: &str = include_str!("../console/app.css");
const FAVICON: &str = include_str!("../console/favicon.svg");
const EDITOR_JS: &str = include_str!(concat!(env!("OUT_DIR"), "/editor.js"));
const API_HTML: &str = include_str!("../console/api.html");
const API_JS: &str = include_str!("../console/api.js");
const API_CSS: &str = include_str!("../console/api.css");
const SWAGGER_JS: &str = include_str!(concat!(env!("OUT_DIR"), "/swagger-ui.js"));
const SWAGGER_CSS: &str = include_str!(concat!(env!("OUT_DIR"), "/swagger-ui.css"));

/// Where the API reference page lives (Swagger UI over `/openapi.json`).
pub const API_PATH: &str = "/console/api";

/// [`CSP`] for the API reference page: Swagger UI's stylesheet draws a few
/// icons as `data:` images; nothing else changes.
pub const API_CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
img-src 'self' blob: data:; connect-src 'self'; font-src 'self'; base-uri 'none'; \
form-action 'self'; frame-ancestors 'none'";

/// Whether Swagger UI is embedded (the API reference page works).
pub fn has_api_reference() -> bool {
    !SWAGGER_JS.is_empty() && !SWAGGER_CSS.is_empty()
}

/// Whether the CodeMirror bundle is embedded.
pub fn has_editor() -> bool {
    !EDITOR_JS.is_empty()
}

/// The console's routes, and `GET /` pointing at it.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(root))
        .route("/console", get(redirect))
        .route("/console/", get(index))
        .route("/console/{asset}", get(asset))
}

/// `GET /`: a person who opens the server's address lands on the console
/// (temporary: turning the console off makes `/` a 404 again).
async fn root() -> Response {
    (
        StatusCode::TEMPORARY_REDIRECT,
        [(LOCATION, HeaderValue::from_static(PATH))],
    )
        .into_response()
}

async fn redirect() -> Response {
    (
        StatusCode::PERMANENT_REDIRECT,
        [(LOCATION, HeaderValue::from_static(PATH))],
    )
        .into_response()
}

/// The page, with a fresh style nonce (not a secret: it only lets this
/// response's own script add style elements).
async fn index() -> Response {
    let nonce = kiln_core::Nanoid::random();
    let mut resp = page(
        "text/html; charset=utf-8",
        INDEX.replace(NONCE_SLOT, nonce.as_str()),
    );
    if let Ok(v) = HeaderValue::from_str(&page_csp(nonce.as_str())) {
        resp.headers_mut().insert(CONTENT_SECURITY_POLICY, v);
    }
    resp
}

async fn asset(Path(name): Path<String>) -> Result<Response, ApiError> {
    let (ty, body) = match name.as_str() {
        "index.html" => return Ok(index().await),
        "api" => {
            let mut resp = page("text/html; charset=utf-8", API_HTML);
            resp.headers_mut()
                .insert(CONTENT_SECURITY_POLICY, HeaderValue::from_static(API_CSP));
            return Ok(resp);
        }
        "api.js" => ("text/javascript; charset=utf-8", API_JS),
        "api.css" => ("text/css; charset=utf-8", API_CSS),
        "swagger-ui.js" if has_api_reference() => ("text/javascript; charset=utf-8", SWAGGER_JS),
        "swagger-ui.css" if has_api_reference() => ("text/css; charset=utf-8", SWAGGER_CSS),
        // empty when absent: the page then says it was not built
        "swagger-ui.js" => (
            "text/javascript; charset=utf-8",
            "/* kiln: built without Swagger UI (scripts/build-console.sh) */\n",
        ),
        "swagger-ui.css" => ("text/css; charset=utf-8", ""),
        "app.js" => ("text/javascript; charset=utf-8", APP_JS),
        "app.css" => ("text/css; charset=utf-8", APP_CSS),
        "favicon.svg" => ("image/svg+xml", FAVICON),
        // an empty script when absent: the page then uses its textarea
        "editor.js" if has_editor() => ("text/javascript; charset=utf-8", EDITOR_JS),
        "editor.js" => (
            "text/javascript; charset=utf-8",
            "/* kiln: built without the CodeMirror bundle (scripts/build-console.sh) */\n",
        ),
        _ => return Err(ApiError::RouteNotFound(format!("/console/{name}"))),
    };
    Ok(page(ty, body))
}

fn page(ty: &'static str, body: impl IntoResponse) -> Response {
    let mut resp = body.into_response();
    let h = resp.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(ty));
    h.insert(CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        HeaderName::from_static("x-content-type-options"),
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        HeaderName::from_static("referrer-policy"),
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        HeaderName::from_static("x-frame-options"),
        HeaderValue::from_static("DENY"),
    );
    resp
}
