//! Every route Kiln serves, with its metadata, declared once: the method
//! and path template the handler is registered under, the rate class
//! counted for it and the node that serves it when there are several.
//!
//! The rate layer ([`crate::rate::limit`]) takes a route's class from
//! here by the matched template, and the cluster layer
//! ([`crate::cluster::forward`], which runs before routing) finds a
//! request's route here by its path ([`lookup`]) to learn where it is
//! served. The tidy test (`crates/kiln-api/tests/tidy.rs`) checks that
//! every route the router serves is in [`ROUTES`], so none is served
//! without a rate class, and that every entry is served.

use axum::http::Method;

/// The route classes of the rate limits, each with its own limiter
/// ([`crate::rate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// Everything that starts code, on every face: `POST /exec`,
    /// `/exec/programmatic`, a live kernel's evaluation
    /// (`/sessions/{id}/exec`, seed 003's `/code`, seed 004's `/execute`),
    /// MCP's `execute_code`. See [`crate::rate::starts_code`] (every
    /// such run, kernel evaluations included, then goes through
    /// `Runs::start`, which counts the registry's per-caller limit).
    Exec,
    /// `POST /upload`, `POST /upload/batch`.
    Upload,
    /// `GET /download/...`.
    Download,
    /// `GET /files/...`, `GET /sessions/.../objects/...`.
    Fetch,
    /// `DELETE /files/...`, `DELETE /sessions/.../objects/...`.
    Delete,
    /// `POST /runs/{run_id}/cancel`.
    Cancel,
}

/// How a route is counted by the rate limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rate {
    /// Not limited.
    Free,
    /// Counted in this class by the rate layer, before the handler runs.
    Layer(Class),
    /// Counted in this class by the handler itself: the key needs the body,
    /// or the request may or may not start code.
    Handler(Class),
}

/// Which node serves a route when there are several
/// ([`crate::cluster`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Affinity {
    /// Any node (the state it touches is in the shared store).
    Any,
    /// The node holding the live kernel its `{session_id}` names.
    Kernel,
    /// The node holding the run its `{run_id}` names.
    Run,
    /// Any node; the kernel a `201` names is recorded as this node's.
    NewKernel,
    /// The node holding the paused programmatic run its body's
    /// continuation token names (else any node).
    Continuation,
    /// A stateful call: the node of the runtime session its body's
    /// `runtime_session_hint` names (else any node).
    RuntimeSession,
    /// The node of the seed 004 worker its `user_uuid` query names.
    Worker,
    /// The node holding the bridge sandbox its `{id}` names.
    Sandbox,
    /// Any node; the sandbox a `200` names is recorded as this node's.
    NewSandbox,
}

/// Where a route is mounted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mount {
    /// Under `/v1`, and at the root.
    Api,
    /// At the root only.
    Root,
    /// Under `runtime_api_prefix` (seed 003; root only).
    Runtime,
}

/// The HTTP methods routes are served with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Get,
    Post,
    Put,
    Delete,
}

impl Verb {
    pub fn method(self) -> Method {
        match self {
            Verb::Get => Method::GET,
            Verb::Post => Method::POST,
            Verb::Put => Method::PUT,
            Verb::Delete => Method::DELETE,
        }
    }

    fn is(self, m: &Method) -> bool {
        self.method() == *m
    }
}

/// One route and its metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub verb: Verb,
    pub mount: Mount,
    /// The template the handler is registered under (relative to its
    /// mount), in axum's syntax (`{param}`, `{*rest}`).
    pub path: &'static str,
    pub rate: Rate,
    pub affinity: Affinity,
}

const fn r(verb: Verb, mount: Mount, path: &'static str, rate: Rate, affinity: Affinity) -> Route {
    Route {
        verb,
        mount,
        path,
        rate,
        affinity,
    }
}

use Affinity as A;
use Mount::{Api, Root, Runtime};
use Rate::{Free, Handler, Layer};
use Verb::{Delete, Get, Post, Put};

/// Every route, by face.
pub const ROUTES: &[Route] = &[
    // LibreChat (codeapi)
    r(Post, Api, "/exec", Handler(Class::Exec), A::RuntimeSession),
    r(
        Post,
        Api,
        "/exec/programmatic",
        Handler(Class::Exec),
        A::Continuation,
    ),
    r(Post, Api, "/exec/programmatic/cancel", Free, A::Any),
    r(Post, Api, "/upload", Layer(Class::Upload), A::Any),
    r(Post, Api, "/upload/batch", Layer(Class::Upload), A::Any),
    r(
        Get,
        Api,
        "/download/{session_id}/{file_id}",
        Layer(Class::Download),
        A::Any,
    ),
    r(Get, Api, "/files/{session_id}", Layer(Class::Fetch), A::Any),
    r(
        Delete,
        Api,
        "/files/{session_id}/{file_id}",
        Layer(Class::Delete),
        A::Any,
    ),
    r(
        Get,
        Api,
        "/sessions/{session_id}/objects/{file_id}",
        Layer(Class::Fetch),
        A::Any,
    ),
    r(
        Delete,
        Api,
        "/sessions/{session_id}/objects/{file_id}",
        Layer(Class::Delete),
        A::Any,
    ),
    r(Get, Api, "/health", Free, A::Any),
    // Kiln's runs
    r(Get, Api, "/runs/{run_id}", Free, A::Run),
    r(Get, Api, "/runs/{run_id}/events", Free, A::Run),
    r(
        Post,
        Api,
        "/runs/{run_id}/cancel",
        Layer(Class::Cancel),
        A::Run,
    ),
    // Cloudflare's sandbox bridge (a sandbox lives on the node that made
    // it; with several nodes its requests are forwarded there)
    r(Post, Api, "/sandbox", Free, A::NewSandbox),
    r(Delete, Api, "/sandbox/{id}", Free, A::Sandbox),
    r(Get, Api, "/sandbox/{id}/running", Free, A::Sandbox),
    r(
        Post,
        Api,
        "/sandbox/{id}/exec",
        Handler(Class::Exec),
        A::Sandbox,
    ),
    r(Get, Api, "/sandbox/{id}/file/{*path}", Free, A::Sandbox),
    r(Put, Api, "/sandbox/{id}/file/{*path}", Free, A::Sandbox),
    // Kiln's sessions (live kernels)
    r(Post, Api, "/sessions", Free, A::NewKernel),
    r(Get, Api, "/sessions/{session_id}", Free, A::Kernel),
    r(Delete, Api, "/sessions/{session_id}", Free, A::Kernel),
    r(
        Post,
        Api,
        "/sessions/{session_id}/exec",
        Handler(Class::Exec),
        A::Kernel,
    ),
    r(
        Post,
        Api,
        "/sessions/{session_id}/interrupt",
        Free,
        A::Kernel,
    ),
    r(Get, Api, "/sessions/{session_id}/files", Free, A::Kernel),
    r(
        Get,
        Api,
        "/sessions/{session_id}/files/{*path}",
        Free,
        A::Kernel,
    ),
    r(
        Put,
        Api,
        "/sessions/{session_id}/files/{*path}",
        Free,
        A::Kernel,
    ),
    r(
        Delete,
        Api,
        "/sessions/{session_id}/files/{*path}",
        Free,
        A::Kernel,
    ),
    // seed 000 (proxy)
    r(Post, Api, "/librechat/runs", Free, A::Any),
    r(Post, Api, "/librechat/files", Free, A::Any),
    r(Get, Api, "/librechat/files", Free, A::Any),
    r(Get, Api, "/librechat/files/{file_id}", Free, A::Any),
    r(Delete, Api, "/librechat/files/{file_id}", Free, A::Any),
    r(Get, Api, "/librechat/health", Free, A::Any),
    // MCP: `execute_code` counts itself
    r(Post, Api, "/mcp", Handler(Class::Exec), A::Any),
    r(Delete, Api, "/mcp", Free, A::Any),
    // operations
    r(Get, Api, "/admin/status", Free, A::Any),
    r(Get, Api, "/admin/runs", Free, A::Any),
    r(Get, Api, "/admin/runs/{run_id}", Free, A::Any),
    r(
        Get,
        Api,
        "/admin/runs/{run_id}/files/{file_id}",
        Free,
        A::Any,
    ),
    r(Get, Api, "/admin/kernels", Free, A::Any),
    r(Delete, Api, "/admin/kernels/{session_id}", Free, A::Any),
    r(Get, Api, "/admin/egress", Free, A::Any),
    r(Get, Root, "/metrics", Free, A::Any),
    r(Get, Root, "/openapi.json", Free, A::Any),
    r(Get, Root, "/v1/openapi.json", Free, A::Any),
    // console
    r(Get, Root, "/", Free, A::Any),
    r(Get, Root, "/console", Free, A::Any),
    r(Get, Root, "/console/", Free, A::Any),
    r(Get, Root, "/console/{asset}", Free, A::Any),
    // seed 004 (stateful gateway)
    r(
        Post,
        Root,
        "/api/v1/execute",
        Handler(Class::Exec),
        A::Worker,
    ),
    r(Post, Root, "/api/v1/release", Free, A::Worker),
    r(Get, Root, "/api/v1/status", Free, A::Worker),
    r(Post, Root, "/api/v1/files", Free, A::Worker),
    r(Delete, Root, "/api/v1/files", Free, A::Worker),
    r(Post, Root, "/api/v1/files/export", Free, A::Worker),
    // seed 003 (runtime daemon)
    r(Post, Runtime, "/code", Handler(Class::Exec), A::Any),
    r(Post, Runtime, "/sessions", Free, A::Any),
    r(Delete, Runtime, "/sessions/{session_id}", Free, A::Any),
    r(Get, Runtime, "/files", Free, A::Any),
    r(Post, Runtime, "/files/upload", Free, A::Any),
    r(Get, Runtime, "/files/download", Free, A::Any),
    r(Get, Runtime, "/metrics", Free, A::Any),
    r(Get, Runtime, "/metrics/watch", Free, A::Any),
];

/// The route registered as `template` (axum's matched path, under `/v1`
/// or not) for `method`.
pub fn by_template(method: &Method, template: &str) -> Option<&'static Route> {
    let api = template.strip_prefix("/v1").filter(|t| t.starts_with('/'));
    ROUTES.iter().find(|r| {
        r.verb.is(method)
            && match (r.mount, api) {
                (Mount::Api, Some(t)) => r.path == t,
                (Mount::Api | Mount::Root, None) => r.path == template,
                (Mount::Root, Some(_)) => r.path == template,
                (Mount::Runtime, _) => false,
            }
    })
}

/// A request's route found by its concrete path (before routing), with
/// the path's parameters; `runtime_prefix` is seed 003's mount, if any.
/// The route of `method` when the path has one, else the path's first
/// (a node's affinity is the path's, whatever the method).
pub fn lookup<'p>(
    method: Option<&Method>,
    path: &'p str,
    runtime_prefix: Option<&str>,
) -> Option<(&'static Route, Params<'p>)> {
    let api = path.strip_prefix("/v1").filter(|p| p.starts_with('/'));
    let runtime = runtime_prefix
        .map(|p| p.trim_end_matches('/'))
        .and_then(|p| path.strip_prefix(p))
        .filter(|p| p.starts_with('/'));
    let candidates = ROUTES.iter().filter_map(|r| {
        let rest = match r.mount {
            Mount::Api => api.unwrap_or(path),
            Mount::Root => path,
            Mount::Runtime => runtime?,
        };
        matches(r.path, rest).map(|params| (r, params))
    });
    let mut first = None;
    for (route, params) in candidates {
        if method.is_some_and(|m| route.verb.is(m)) {
            return Some((route, params));
        }
        first.get_or_insert((route, params));
    }
    first
}

/// A path's parameters by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Params<'p>(Vec<(&'static str, &'p str)>);

impl<'p> Params<'p> {
    pub fn get(&self, name: &str) -> Option<&'p str> {
        self.0.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }
}

/// `path` matched against `template`: `{name}` takes one non-empty
/// segment, a last `{*name}` the non-empty rest; `None` when it does not
/// match.
fn matches<'p>(template: &'static str, path: &'p str) -> Option<Params<'p>> {
    let n = template.split('/').count();
    let wildcard = template
        .rsplit('/')
        .next()
        .is_some_and(|s| s.starts_with("{*"));
    let segments: Vec<&'p str> = if wildcard {
        path.splitn(n, '/').collect()
    } else {
        path.split('/').collect()
    };
    if segments.len() != n {
        return None;
    }
    let mut params = Vec::new();
    for (t, p) in template.split('/').zip(segments) {
        if let Some(name) = t.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
            if p.is_empty() {
                return None;
            }
            params.push((name.trim_start_matches('*'), p));
        } else if t != p {
            return None;
        }
    }
    Some(Params(params))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_finds_its_route_and_parameters() {
        let id = "V1StGXR8_Z5jdHi6B-myT";
        let exec = format!("/v1/sessions/{id}/exec");
        let (route, params) = lookup(Some(&Method::POST), &exec, None).unwrap();
        assert_eq!(route.path, "/sessions/{session_id}/exec");
        assert_eq!(params.get("session_id"), Some(id));
        let file = format!("/sessions/{id}/files/a/b.txt");
        let (route, params) = lookup(Some(&Method::PUT), &file, None).unwrap();
        assert_eq!((route.verb, route.affinity), (Verb::Put, Affinity::Kernel));
        assert_eq!(params.get("path"), Some("a/b.txt"));
        let (route, _) = lookup(
            Some(&Method::GET),
            &format!("/v1/sessions/{id}/objects/{id}"),
            None,
        )
        .unwrap();
        assert_eq!(route.affinity, Affinity::Any);
        // another method finds the path's route
        let (route, _) = lookup(Some(&Method::PATCH), &format!("/runs/{id}"), None).unwrap();
        assert_eq!(route.affinity, Affinity::Run);
        // root-only routes are not under /v1; unknown paths have no route
        assert_eq!(
            lookup(Some(&Method::POST), "/v1/api/v1/execute", None),
            None
        );
        assert!(lookup(Some(&Method::POST), "/api/v1/execute", None).is_some());
        assert_eq!(lookup(Some(&Method::GET), "/v1/nothing", None), None);
        assert_eq!(lookup(Some(&Method::GET), "/v1/runs/", None), None);
        assert_eq!(
            lookup(Some(&Method::GET), "/v1/runs/x/events/more", None),
            None
        );
        assert_eq!(
            lookup(Some(&Method::GET), "/v1/sessions/x/files/", None),
            None
        );
    }

    #[test]
    fn seed003_routes_are_found_under_their_prefix_only() {
        let (route, _) = lookup(Some(&Method::POST), "/runtime/code", Some("/runtime")).unwrap();
        assert_eq!((route.mount, route.path), (Mount::Runtime, "/code"));
        let (route, _) = lookup(
            Some(&Method::DELETE),
            "/runtime/sessions/abc",
            Some("/runtime/"),
        )
        .unwrap();
        assert_eq!(route.affinity, Affinity::Any);
        assert_eq!(lookup(Some(&Method::POST), "/runtime/code", None), None);
        assert_eq!(lookup(Some(&Method::POST), "/code", Some("/runtime")), None);
    }

    #[test]
    fn a_template_finds_its_route_under_v1_or_at_the_root() {
        let upload = by_template(&Method::POST, "/v1/upload").unwrap();
        assert_eq!(upload.rate, Rate::Layer(Class::Upload));
        assert_eq!(by_template(&Method::POST, "/upload"), Some(upload));
        assert_eq!(by_template(&Method::GET, "/upload"), None);
        assert!(by_template(&Method::GET, "/v1/openapi.json").is_some());
        assert_eq!(by_template(&Method::GET, "/v1/metrics"), None);
    }

    #[test]
    fn each_method_and_template_is_declared_once() {
        for (i, a) in ROUTES.iter().enumerate() {
            for b in &ROUTES[i + 1..] {
                assert!(
                    (a.verb, a.mount, a.path) != (b.verb, b.mount, b.path),
                    "{a:?} twice"
                );
            }
        }
    }
}
