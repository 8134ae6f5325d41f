//! The OpenAPI 3.1 document of every route Kiln serves, generated from the
//! handlers' `#[utoipa::path]` annotations and the Rust types of their
//! bodies — from the same registrations that build the router
//! ([`crate::api_routes`]), so a route cannot exist undocumented. Served at
//! `/openapi.json` (and `/v1/openapi.json`); the integration test
//! `crates/kiln/tests/openapi.rs` checks it against the running server.

use std::sync::Arc;

use axum::Extension;
use axum::http::HeaderValue;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use utoipa::openapi::tag::Tag;
use utoipa::openapi::{Info, OpenApi};

/// The rendered document, shared by the handlers.
#[derive(Clone)]
pub struct Document(Arc<String>);

impl Document {
    pub fn new(doc: OpenApi) -> Document {
        Document(Arc::new(doc.to_pretty_json().unwrap_or_default()))
    }
}

const DESCRIPTION: &str = "Kiln is a self-hosted Code Interpreter API: LibreChat's contract \
(the `LibreChat` tag), Kiln's own runs API (`Runs`), and seed 000's code-interpreter-proxy \
API (`Seed 000`), all over one run registry and one store.\n\n\
Every route under `/v1` except seed 000's and the runs API is also served at the root (older \
LibreChat builds call it there). With an API key configured, every route except the health \
checks, `/metrics` (unless `metrics_require_key` is set) and this document needs it (`X-API-Key`, or `Authorization: Bearer`).\n\n\
Streaming: `POST /v1/exec` and `POST /v1/librechat/runs` with `Accept: text/event-stream` answer \
with Server-Sent Events; see docs/api.md.";

/// Assembles the document: the `/v1` routes, then the root-only ones.
pub fn document(api: OpenApi, root: OpenApi) -> OpenApi {
    let mut doc = OpenApi::new(
        Info::builder()
            .title("Kiln")
            .version(env!("CARGO_PKG_VERSION"))
            .description(Some(DESCRIPTION))
            .build(),
        utoipa::openapi::Paths::new(),
    )
    .nest("/v1", api);
    doc.merge(root);
    // a catch-all segment (`{*path}`: a workspace path with slashes) is the
    // router's syntax; OpenAPI names the parameter plainly
    let paths = std::mem::take(&mut doc.paths.paths);
    doc.paths.paths = paths
        .into_iter()
        .map(|(path, item)| (path.replace("{*", "{"), item))
        .collect();
    doc.tags = Some(vec![
        tag(
            "LibreChat",
            "LibreChat's Code Interpreter API (drop-in for `LIBRECHAT_CODE_BASEURL`)",
        ),
        tag("Runs", "Runs as objects: status, events, cancel"),
        tag(
            "Sessions",
            "Live kernels: state that persists between calls, interrupts, the workspace's files",
        ),
        tag(
            "MCP",
            "The Model Context Protocol endpoint (streamable HTTP, JSON-RPC): tools over runs and live kernels; see docs/mcp.md",
        ),
        tag(
            "Seed 000",
            "The code-interpreter-proxy API of seed 000, under /v1/librechat",
        ),
        tag(
            "Operations",
            "Metrics, this document, and the operator's status and recent runs (`/admin/*`, what the web console at /console/ shows)",
        ),
    ]);
    doc
}

fn tag(name: &str, description: &str) -> Tag {
    let mut t = Tag::new(name);
    t.description = Some(description.to_owned());
    t
}

/// `GET /openapi.json`.
#[utoipa::path(
    get,
    path = "/openapi.json",
    operation_id = "openapi",
    tag = "Operations",
    summary = "This document (OpenAPI 3.1, no auth)",
    responses((status = 200, description = "The OpenAPI document", content_type = "application/json", body = Object))
)]
pub async fn openapi_json(Extension(doc): Extension<Document>) -> Response {
    let mut resp = doc.0.as_str().to_owned().into_response();
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}
