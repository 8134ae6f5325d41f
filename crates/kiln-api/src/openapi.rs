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
use serde_json::{Value, json};
use utoipa::openapi::tag::Tag;
use utoipa::openapi::{Info, OpenApi};

/// The rendered document, shared by the handlers.
#[derive(Clone)]
pub struct Document(Arc<String>);

impl Document {
    /// The document with its security: `public` names the operations
    /// (`operationId`) served without credentials.
    pub fn new(doc: OpenApi, public: &[&str]) -> Document {
        let mut value = serde_json::to_value(&doc).unwrap_or_default();
        secure(&mut value, public);
        Document(Arc::new(
            serde_json::to_string_pretty(&value).unwrap_or_default(),
        ))
    }
}

/// The operations every deployment serves without credentials.
pub const PUBLIC_OPERATIONS: [&str; 3] = ["health", "seedHealth", "openapi"];

/// The security schemes: the shared key in `X-API-Key`, or a bearer value
/// (the shared key, or LibreChat's CodeAPI JWT).
fn schemes() -> Value {
    json!({
        "apiKey": {
            "type": "apiKey",
            "in": "header",
            "name": "X-API-Key",
            "description": "The shared key (`api_key`, KILN_API_KEY), in auth mode `api-key` or `api-key,jwt`.",
        },
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "`Authorization: Bearer` with the shared key, or LibreChat's CodeAPI JWT in auth mode `jwt` or `api-key,jwt` (docs/librechat.md).",
        },
    })
}

const METHODS: [&str; 5] = ["get", "put", "post", "delete", "patch"];

/// Declares the schemes, gives every operation its `security` (`[]` for
/// the public ones), and a 401 to every protected operation that does not
/// describe one yet.
fn secure(doc: &mut Value, public: &[&str]) {
    doc["components"]["securitySchemes"] = schemes();
    let Some(paths) = doc["paths"].as_object_mut() else {
        return;
    };
    for item in paths.values_mut() {
        for m in METHODS {
            let Some(op) = item.get_mut(m).and_then(Value::as_object_mut) else {
                continue;
            };
            let id = op.get("operationId").and_then(Value::as_str).unwrap_or("");
            if public.contains(&id) {
                op.insert("security".into(), json!([]));
                continue;
            }
            op.insert(
                "security".into(),
                json!([{ "apiKey": [] }, { "bearer": [] }]),
            );
            let responses = op.entry("responses").or_insert_with(|| json!({}));
            if responses.get("401").is_none() {
                responses["401"] = json!({
                    "description": "Missing or invalid credentials: no key or token was sent, or a wrong one (the `error` says which)",
                    "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ErrorBody" } } },
                });
            }
        }
    }
}

const DESCRIPTION: &str = "Kiln is a self-hosted Code Interpreter API: LibreChat's contract \
(the `LibreChat` tag), Kiln's own runs API (`Runs`), and seed 000's code-interpreter-proxy \
API (`Seed 000`), all over one run registry and one store.\n\n\
Every route under `/v1` except seed 000's and the runs API is also served at the root (older \
LibreChat builds call it there). With an API key configured, every route except the health \
checks, `/metrics` (unless `metrics_require_key` is set) and this document needs it (`X-API-Key`, or `Authorization: Bearer`); \
the operations say so in `security`. With LibreChat's CodeAPI JWT on, `Authorization: Bearer` carries the token.\n\n\
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
            "Sandbox bridge",
            "Cloudflare's sandbox bridge protocol (LibreChat's `cloudflare-sandbox` engine): persistent `/workspace`s where each command is a run; see docs/bridge.md",
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
