//! Several nodes: forwarding requests for node-local things to their owner.
//!
//! Live kernels (`/sessions/{id}...`) and runs (`/runs/{id}...`, and the
//! paused programmatic runs a continuation token names) live in one node's
//! memory. When this node is one of several ([`Cluster`], on a shared
//! Postgres database), each such thing gets an owner row when it starts
//! ([`kiln_store::Store::claim`]), and a request for one that this node does
//! not hold is reverse-proxied to the owner's advertised URL — method,
//! path, headers and a streamed body there, status, headers and a streamed
//! body (Server-Sent Events included) back. The owner authenticates and
//! authorizes the request as if it had come to it directly.
//!
//! LibreChat's runtime sessions (a stateful `/exec` with a
//! `runtime_session_hint`) keep their files in the shared store, but their
//! turns and `reused` status are per node: such a call goes to the node
//! that served the hint's last call, and a node that finds the owner gone
//! takes the session over. Seed 004's workers (`/api/v1/...?user_uuid=`,
//! one live kernel per user) follow their owner the same way; a node that
//! finds a worker's owner gone takes the user over and answers that call
//! `503` once, the seed's "environment lost" (the next call starts afresh).
//!
//! A forwarded request carries `X-Kiln-Forwarded-By` (the forwarding node)
//! and `X-Kiln-Node-Secret` (the secret every node is configured with);
//! only with the right secret is it taken as forwarded: it is then never
//! forwarded again (no loops), and `X-Kiln-Client-Addr` stands for the
//! client's address in rate limits. Without it, the headers are removed
//! and the request is an ordinary one. A request whose owner's heartbeat
//! is older than `dead_after`, or whose owner refuses the connection, is
//! answered `410 session_lost` at once.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use kiln_core::Nanoid;
use subtle::ConstantTimeEq as _;

use crate::config::AppState;
use crate::kit::Affinity;
use crate::kit::routes::{self, Params};
use crate::sse::RUN_ID as RUN_ID_HEADER;

pub use crate::node::{
    CLIENT_ADDR, Cluster, FORWARDED_BY, KIND_PROJECT, KIND_RUN, KIND_RUNTIME, KIND_SANDBOX,
    KIND_SESSION, KIND_WORKER, NODE, NODE_SECRET, VIA,
};

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("node_id", &self.node_id)
            .field("advertise_url", &self.advertise_url)
            .field("secret", &"<redacted>")
            .field("dead_after", &self.dead_after)
            .finish()
    }
}

impl Cluster {
    /// `secret` must be the same on every node.
    pub fn new(
        node_id: String,
        advertise_url: String,
        secret: String,
        dead_after: Duration,
    ) -> Result<Cluster, reqwest::Error> {
        // the workspace's reqwest has no TLS provider of its own
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            // an owner that does not answer the connection is gone; a slow
            // answer (a long run, an event stream) is not bounded here: the
            // owner's own limits end it
            .connect_timeout(Duration::from_secs(3))
            .tcp_keepalive(Duration::from_secs(15))
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()?;
        Ok(Cluster {
            node_id,
            advertise_url: advertise_url.trim_end_matches('/').to_owned(),
            secret,
            dead_after,
            client,
        })
    }

    /// Whether the request was forwarded by a node holding the secret.
    pub(crate) fn authentic(&self, headers: &HeaderMap) -> bool {
        headers
            .get(NODE_SECRET)
            .is_some_and(|v| bool::from(v.as_bytes().ct_eq(self.secret.as_bytes())))
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A node-local thing a request names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// A live kernel.
    Kernel(Nanoid),
    /// A run (streaming, watched by id, or a paused programmatic run).
    Run(Nanoid),
    /// A sandbox of the bridge.
    Sandbox(Nanoid),
}

impl Target {
    fn kind(&self) -> &'static str {
        match self {
            Target::Kernel(_) => KIND_SESSION,
            Target::Run(_) => KIND_RUN,
            Target::Sandbox(_) => KIND_SANDBOX,
        }
    }

    fn id(&self) -> &Nanoid {
        match self {
            Target::Kernel(id) | Target::Run(id) | Target::Sandbox(id) => id,
        }
    }
}

/// The node-local thing a route's parameters name: the kernel of an
/// [`Affinity::Kernel`] route, the run of an [`Affinity::Run`] one.
fn target_of(affinity: Affinity, params: &Params<'_>) -> Option<Target> {
    let id = |name| Nanoid::try_from(params.get(name)?.to_owned()).ok();
    match affinity {
        Affinity::Kernel => id("session_id").map(Target::Kernel),
        Affinity::Run => id("run_id").map(Target::Run),
        Affinity::Sandbox => id("id").map(Target::Sandbox),
        _ => None,
    }
}

/// The node-local thing the path names, by its route's affinity
/// ([`crate::kit::routes::ROUTES`]): a live kernel (`/sessions/{id}[/exec|
/// /interrupt|/files...]`, not LibreChat's `/sessions/{id}/objects/...`,
/// stored files) or a run (`/runs/{id}[/...]`), under `/v1` or at the root.
fn target_of_path(path: &str) -> Option<Target> {
    let (route, params) = routes::lookup(None, path, None)?;
    target_of(route.affinity, &params)
}

/// The run a continuation token names (unverified: the owner verifies it).
fn continuation_run(body: &[u8]) -> Option<Nanoid> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let token = v.get("continuation_token")?.as_str()?;
    let payload = URL_SAFE_NO_PAD.decode(token.split_once('.')?.0).ok()?;
    let p: serde_json::Value = serde_json::from_slice(&payload).ok()?;
    Nanoid::try_from(p.get("e")?.as_str()?.to_owned()).ok()
}

/// Whether this node holds `target` now.
fn held_here(state: &AppState, target: &Target) -> bool {
    match target {
        Target::Kernel(id) => state
            .envs
            .kernels
            .as_ref()
            .is_some_and(|k| k.get(id).is_ok()),
        Target::Run(id) => state.runs.get(id).is_some(),
        Target::Sandbox(id) => state
            .envs
            .sandboxes
            .as_ref()
            .is_some_and(|s| s.get(id).is_ok()),
    }
}

/// `410 session_lost`: the owner of the thing is gone.
fn lost(target: &Target, why: &str) -> Response {
    metrics::counter!("kiln_forward_lost_total", "kind" => target.kind()).increment(1);
    let body = serde_json::json!({
        "error": "session_lost",
        "message": format!(
            "The {} {} lived on a node that is gone ({why}); start a new one.",
            target.kind(),
            target.id()
        ),
    });
    (StatusCode::GONE, axum::Json(body)).into_response()
}

/// The middleware (outside routing): forwards requests for things another
/// node owns, records the owner of things started here, and marks
/// requests other nodes forwarded. Every answer names the node that gave
/// it (`X-Kiln-Node`) and, when forwarded, the node reached (`X-Kiln-Via`).
pub async fn forward(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(cluster) = state.cluster.clone() else {
        return next.run(req).await;
    };
    let mut resp = route(&state, &cluster, req, next).await;
    let me = HeaderValue::from_str(&cluster.node_id).ok();
    let h = resp.headers_mut();
    if let Some(me) = me {
        if h.contains_key(NODE) {
            h.insert(VIA, me);
        } else {
            h.insert(NODE, me);
        }
    }
    resp
}

async fn route(state: &AppState, cluster: &Cluster, mut req: Request, next: Next) -> Response {
    let from_node = cluster.authentic(req.headers());
    let client_addr = req
        .headers()
        .get(CLIENT_ADDR)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<SocketAddr>().ok());
    for h in [&FORWARDED_BY, &NODE_SECRET, &CLIENT_ADDR] {
        req.headers_mut().remove(h);
    }
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    // the route's declared affinity ([`crate::kit::routes`]): the path's
    // names a kernel or a run whatever the method; one read from the body
    // or the query is its own method's
    let found = routes::lookup(
        Some(&method),
        &path,
        state.config.runtime_api_prefix.as_deref(),
    );
    let path_target = target_of_path(&path);
    let declared = found
        .as_ref()
        .filter(|(r, _)| r.verb.method() == method)
        .map_or(Affinity::Any, |(r, _)| r.affinity);
    // what may start a run, a kernel or a sandbox: a POST (one naming an
    // existing kernel or sandbox evaluates in it: a run, which other nodes
    // find here by its id)
    let starting = if method != Method::POST {
        Starts::Nothing
    } else if path_target.is_some() {
        Starts::Something { made: None }
    } else {
        Starts::Something {
            made: match declared {
                Affinity::NewKernel => Some(Made::Kernel),
                Affinity::NewSandbox => Some(Made::Sandbox),
                _ => None,
            },
        }
    };
    // a DELETE of a kernel or a sandbox by its own path closes it: its
    // owner row goes once it answers 204, wherever the request entered
    let closing = path_target.as_ref().filter(|t| {
        method == Method::DELETE
            && matches!(t, Target::Kernel(_) | Target::Sandbox(_))
            && path.trim_end_matches('/').ends_with(t.id().as_str())
    });
    if from_node {
        // served here whatever happens: never forwarded twice
        if let Some(addr) = client_addr {
            req.extensions_mut().insert(ConnectInfo(addr));
        }
        let resp = next.run(req).await;
        let resp = claim_started(state, cluster, starting, resp).await;
        return released(state, closing, resp).await;
    }
    if !admitted(state, &req, &path) {
        // a caller the route will refuse: nothing is read, looked up,
        // forwarded or recorded for it; the route's own authentication
        // answers (in its face's envelope) before any body is read
        return next.run(req).await;
    }

    if declared == Affinity::RuntimeSession
        && crate::middleware::expects_stateful(req.headers())
        && state.config.runtime_session_mode != crate::RuntimeSessionMode::Stateless
    {
        // a runtime session is named inside the body
        let (parts, bytes) = match buffered(req, state.config.max_json_bytes).await {
            Ok(read) => read,
            Err(e) => return e.into_response(),
        };
        if let Some(hint) = runtime_hint(&bytes) {
            return affinity(state, cluster, KIND_RUNTIME, &hint, parts, bytes, next).await;
        }
        req = Request::from_parts(parts, Body::from(bytes));
    }
    if let Some(user) = seed004_user(&path, req.uri().query()).filter(|_| state.config.seed004_api)
    {
        // the user's worker lives on one node: the body goes where it is,
        // bounded as the face bounds it (every seed-004 body is JSON)
        let (parts, bytes) = match buffered(req, state.config.max_json_bytes).await {
            Ok(read) => read,
            Err(e) => {
                return crate::kit::envelope::Fail::<crate::kit::envelope::Detail>::from(e)
                    .into_response();
            }
        };
        return affinity(state, cluster, KIND_WORKER, &user, parts, bytes, next).await;
    }
    let target = if declared == Affinity::Continuation {
        // the run is named inside the body: read it (bounded as the
        // handler bounds it) and hand the same bytes on
        let (parts, bytes) = match buffered(req, state.config.max_json_bytes).await {
            Ok(read) => read,
            Err(e) => return e.into_response(),
        };
        if let Some(key) = crate::kit::attached::routing_key(&parts.headers, &bytes) {
            return affinity(state, cluster, KIND_PROJECT, &key, parts, bytes, next).await;
        }
        let target = continuation_run(&bytes).map(Target::Run);
        req = Request::from_parts(parts, Body::from(bytes));
        target
    } else {
        path_target.clone()
    };
    let Some(target) = target else {
        let resp = next.run(req).await;
        return claim_started(state, cluster, starting, resp).await;
    };
    if held_here(state, &target) {
        let resp = next.run(req).await;
        let resp = claim_started(state, cluster, starting, resp).await;
        return released(state, closing, resp).await;
    }
    let owner = match state.store.owner(target.kind(), target.id().as_str()).await {
        Ok(o) => o,
        Err(e) => {
            tracing::warn!(error = %e, "owner lookup failed: answering here");
            None
        }
    };
    let Some(owner) = owner.filter(|o| o.node_id != cluster.node_id) else {
        // nobody else owns it: this node answers (not found, most likely)
        return next.run(req).await;
    };
    let (Some(url), true) = (owner.url.as_deref(), alive(cluster, &owner)) else {
        tracing::info!(kind = target.kind(), id = %target.id(), owner = %owner.node_id,
            "owner node is gone (no heartbeat)");
        return lost(&target, "no heartbeat");
    };
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    match proxy(cluster, url, peer, req).await {
        Ok(resp) => {
            metrics::counter!("kiln_forwarded_total", "kind" => target.kind()).increment(1);
            resp
        }
        Err(e) => {
            tracing::warn!(kind = target.kind(), id = %target.id(), owner = %owner.node_id,
                error = %e, "owner node unreachable");
            lost(&target, "unreachable")
        }
    }
}

/// Whether the route `path` names will admit the caller: the credential
/// check of the face (a compatibility face's key header, else Kiln's),
/// made here before anything of the request's body is read.
fn admitted(state: &AppState, req: &Request, path: &str) -> bool {
    match crate::middleware::key_header(&state.config, path) {
        Some(header) => crate::middleware::authenticate_with(state, req, &header).is_ok(),
        None => crate::middleware::authenticate(state, req).is_ok(),
    }
}

/// The request's head and its body read whole under `limit` (the bound
/// its handler applies), so the node can look inside and hand the same
/// bytes on; the handler's own refusal (413) beyond, from the declared
/// length before anything is reserved.
async fn buffered(
    req: Request,
    limit: usize,
) -> Result<(axum::http::request::Parts, bytes::Bytes), crate::ApiError> {
    let (parts, body) = req.into_parts();
    let bytes = crate::body::read_limited(&parts.headers, body, limit).await?;
    Ok((parts, bytes))
}

/// Whether `owner`'s node sent a heartbeat within `dead_after`.
fn alive(cluster: &Cluster, owner: &kiln_store::OwnerRecord) -> bool {
    owner.heartbeat_at_ms.is_some_and(|t| {
        now_ms() - t <= i64::try_from(cluster.dead_after.as_millis()).unwrap_or(i64::MAX)
    })
}

/// The `runtime_session_hint` of an `/exec` body, if any.
fn runtime_hint(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let hint = v.get("runtime_session_hint")?.as_str()?;
    (!hint.is_empty() && hint.len() <= 128).then(|| hint.to_owned())
}

/// The `user_uuid` of a request to seed 004's face (a route of
/// [`Affinity::Worker`]), whose worker lives on one node. The raw value
/// routes (the face validates it).
fn seed004_user(path: &str, query: Option<&str>) -> Option<String> {
    if !routes::lookup(None, path, None).is_some_and(|(r, _)| r.affinity == Affinity::Worker) {
        return None;
    }
    query?
        .split('&')
        .find_map(|kv| kv.strip_prefix("user_uuid="))
        .filter(|u| !u.is_empty() && u.len() <= 128)
        .map(str::to_owned)
}

/// A request for `key` of `kind` (a runtime session by its hint, a seed-004
/// worker by its user): served by the node that served the key's last
/// requests (its owner), so that they take turns, report `reused` and find
/// their live state as on one node. An owner that is gone is taken over:
/// a runtime session's files are in the shared store, so it carries on; a
/// worker's variables were in the lost kernel, so that one call answers
/// the seed's `503` and the next starts a fresh worker here.
async fn affinity(
    state: &AppState,
    cluster: &Cluster,
    kind: &'static str,
    key: &str,
    parts: axum::http::request::Parts,
    bytes: bytes::Bytes,
    next: Next,
) -> Response {
    let owner = match state.store.owner(kind, key).await {
        Ok(o) => o,
        Err(e) => {
            tracing::warn!(error = %e, "owner lookup failed: answering here");
            None
        }
    };
    let mine = owner.as_ref().is_some_and(|o| o.node_id == cluster.node_id);
    if let Some(o) = owner.as_ref().filter(|o| !mine && alive(cluster, o))
        && let Some(url) = o.url.as_deref()
    {
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0);
        match proxy_parts(cluster, url, peer, &parts, bytes.clone().into()).await {
            Ok(resp) => {
                metrics::counter!("kiln_forwarded_total", "kind" => kind).increment(1);
                return resp;
            }
            Err(e) => tracing::warn!(kind, owner = %o.node_id, error = %e,
                "owner node unreachable: taking over"),
        }
    }
    if !mine {
        claim(state, cluster, kind, key).await;
        if kind == KIND_WORKER && owner.is_some() {
            metrics::counter!("kiln_forward_lost_total", "kind" => kind).increment(1);
            let body = serde_json::json!({
                "detail": "worker lost: the node holding this user's environment is gone; \
                           the next request starts a new one",
            });
            return (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
        }
    }
    let resp = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    claim_started(state, cluster, Starts::Something { made: None }, resp).await
}

/// What a request may start.
#[derive(Debug, Clone, Copy)]
enum Starts {
    Nothing,
    /// A run (any run-starting route); with `made`, a kernel
    /// (`POST /sessions`) or a sandbox (`POST /sandbox`).
    Something {
        made: Option<Made>,
    },
}

/// A node-local thing a `POST` makes, named in its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Made {
    /// A live kernel: `201 {"session_id"}`.
    Kernel,
    /// A bridge sandbox: `200 {"id"}`.
    Sandbox,
}

impl Made {
    /// The success status and the answer's id field.
    fn answer(self) -> (StatusCode, &'static str) {
        match self {
            Made::Kernel => (StatusCode::CREATED, "session_id"),
            Made::Sandbox => (StatusCode::OK, "id"),
        }
    }

    /// The thing made, by the id its answer names.
    fn target(self, id: Nanoid) -> Target {
        match self {
            Made::Kernel => Target::Kernel(id),
            Made::Sandbox => Target::Sandbox(id),
        }
    }
}

/// Records this node as the owner of what `resp` started: the run its
/// `X-Kiln-Run-Id` names, the kernel a `201` to `POST /sessions` names, or
/// the sandbox a `200` to `POST /sandbox` names.
async fn claim_started(
    state: &AppState,
    cluster: &Cluster,
    starting: Starts,
    resp: Response,
) -> Response {
    let Starts::Something { made } = starting else {
        return resp;
    };
    let run = resp
        .headers()
        .get(RUN_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let Some(run) = run {
        claim(state, cluster, KIND_RUN, &run).await;
        return resp;
    }
    let Some(made) = made else {
        return resp;
    };
    let (status, field) = made.answer();
    if resp.status() != status {
        return resp;
    }
    // a small JSON answer: read it, claim, hand the same bytes on
    let (parts, body) = resp.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, 64 * 1024).await else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "answer too large").into_response();
    };
    let created = serde_json::from_slice::<serde_json::Value>(&bytes).ok();
    if let Some(id) = created.as_ref().and_then(|v| v.get(field)?.as_str())
        && let Ok(nanoid) = Nanoid::try_from(id.to_owned())
    {
        let target = made.target(nanoid);
        if held_here(state, &target) {
            claim(state, cluster, target.kind(), id).await;
        }
    }
    Response::from_parts(parts, Body::from(bytes))
}

/// Forgets the owner of the kernel or sandbox `closing` names once `resp`
/// says it was closed (`204`).
async fn released(state: &AppState, closing: Option<&Target>, resp: Response) -> Response {
    if let Some(target) = closing
        && resp.status() == StatusCode::NO_CONTENT
        && let Err(e) = state
            .store
            .release(target.kind(), target.id().as_str())
            .await
    {
        tracing::warn!(error = %e, kind = target.kind(), "forgetting the owner of a closed thing failed");
    }
    resp
}

async fn claim(state: &AppState, cluster: &Cluster, kind: &str, id: &str) {
    if let Err(e) = state
        .store
        .claim(kind, id, &cluster.node_id, now_ms())
        .await
    {
        // the thing works here; only other nodes will not find it
        tracing::warn!(error = %e, kind, id, "recording the owner failed");
    }
}

/// Hop-by-hop headers, which a proxy does not pass on (RFC 9110 §7.6.1).
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
    )
}

/// Sends `req` to the node at `url` and streams its answer back.
async fn proxy(
    cluster: &Cluster,
    url: &str,
    peer: Option<SocketAddr>,
    req: Request,
) -> Result<Response, reqwest::Error> {
    let (parts, body) = req.into_parts();
    let body = reqwest::Body::wrap_stream(body.into_data_stream());
    proxy_parts(cluster, url, peer, &parts, body).await
}

/// [`proxy`] of a request's head and a body.
async fn proxy_parts(
    cluster: &Cluster,
    url: &str,
    peer: Option<SocketAddr>,
    parts: &axum::http::request::Parts,
    body: reqwest::Body,
) -> Result<Response, reqwest::Error> {
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let mut headers = HeaderMap::new();
    for (name, value) in &parts.headers {
        if !hop_by_hop(name) {
            headers.append(name.clone(), value.clone());
        }
    }
    if let Ok(v) = HeaderValue::from_str(&cluster.node_id) {
        headers.insert(FORWARDED_BY, v);
    }
    if let Ok(v) = HeaderValue::from_str(&cluster.secret) {
        headers.insert(NODE_SECRET, v);
    }
    if let Some(v) = peer.and_then(|p| HeaderValue::from_str(&p.to_string()).ok()) {
        headers.insert(CLIENT_ADDR, v);
    }
    let upstream = cluster
        .client
        .request(parts.method.clone(), format!("{url}{path}"))
        .headers(headers)
        .body(body)
        .send()
        .await?;
    let mut resp = Response::builder().status(upstream.status());
    if let Some(h) = resp.headers_mut() {
        for (name, value) in upstream.headers() {
            if !hop_by_hop(name) && name != header::CONTENT_LENGTH {
                h.append(name.clone(), value.clone());
            }
        }
    }
    let length = upstream.content_length();
    let mut resp = resp
        .body(Body::from_stream(upstream.bytes_stream()))
        .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response());
    if let Some(n) = length {
        resp.headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(n));
    }
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed004_requests_route_by_their_user_and_nothing_else_does() {
        let user = |path, q| seed004_user(path, q);
        assert_eq!(
            user("/api/v1/execute", Some("user_uuid=u-1")),
            Some("u-1".into())
        );
        assert_eq!(
            user("/api/v1/files/export", Some("x=1&user_uuid=abc")),
            Some("abc".into())
        );
        assert_eq!(user("/api/v1/status", None), None);
        assert_eq!(user("/api/v1/execute", Some("user_uuid=")), None);
        assert_eq!(user("/v1/exec", Some("user_uuid=u")), None);
        assert_eq!(user("/api/v1/execute", Some("xuser_uuid=u")), None);
        let long = format!("user_uuid={}", "u".repeat(129));
        assert_eq!(user("/api/v1/execute", Some(long.as_str())), None);
    }

    #[test]
    fn kernel_and_run_paths_name_their_owner_kind_and_stored_files_do_not() {
        let id = "V1StGXR8_Z5jdHi6B-myT";
        let session = Some(Target::Kernel(Nanoid::try_from(id.to_owned()).unwrap()));
        let run = Some(Target::Run(Nanoid::try_from(id.to_owned()).unwrap()));
        assert_eq!(target_of_path(&format!("/v1/sessions/{id}")), session);
        assert_eq!(target_of_path(&format!("/sessions/{id}/exec")), session);
        assert_eq!(
            target_of_path(&format!("/v1/sessions/{id}/files/a/b.txt")),
            session
        );
        assert_eq!(target_of_path(&format!("/v1/runs/{id}/events")), run);
        assert_eq!(target_of_path(&format!("/runs/{id}/cancel")), run);
        // LibreChat's stored files and anything else stay on any node
        assert_eq!(
            target_of_path(&format!("/v1/sessions/{id}/objects/{id}")),
            None
        );
        assert_eq!(target_of_path(&format!("/v1/download/{id}/{id}")), None);
        assert_eq!(target_of_path("/v1/sessions"), None);
        assert_eq!(target_of_path("/v1/runs/not-an-id"), None);
    }

    #[test]
    fn a_continuation_names_its_run_without_the_signature_checked() {
        let id = "V1StGXR8_Z5jdHi6B-myT";
        let payload = URL_SAFE_NO_PAD.encode(format!(r#"{{"e":"{id}","o":"x","x":1}}"#));
        let body = format!(r#"{{"continuation_token":"{payload}.c2ln","tool_results":[]}}"#);
        assert_eq!(
            continuation_run(body.as_bytes()).map(|n| n.as_str().to_owned()),
            Some(id.to_owned())
        );
        assert_eq!(continuation_run(br#"{"code":"print(1)"}"#), None);
    }

    #[test]
    fn a_stateful_exec_names_its_runtime_session_by_the_hint() {
        assert_eq!(
            runtime_hint(br#"{"code":"1","runtime_session_hint":"v2:user:abc"}"#).as_deref(),
            Some("v2:user:abc")
        );
        assert_eq!(runtime_hint(br#"{"code":"1"}"#), None);
        assert_eq!(runtime_hint(br#"{"runtime_session_hint":""}"#), None);
        assert_eq!(runtime_hint(br#"{"runtime_session_hint":7}"#), None);
    }

    #[test]
    fn only_the_shared_secret_marks_a_request_as_forwarded() {
        let c = Cluster::new(
            "a".into(),
            "http://127.0.0.1:1".into(),
            "s3cret-s3cret-s3cret".into(),
            Duration::from_secs(15),
        )
        .unwrap();
        let mut h = HeaderMap::new();
        assert!(!c.authentic(&h));
        h.insert(NODE_SECRET, HeaderValue::from_static("guess"));
        assert!(!c.authentic(&h));
        h.insert(
            NODE_SECRET,
            HeaderValue::from_static("s3cret-s3cret-s3cret"),
        );
        assert!(c.authentic(&h));
    }
}
