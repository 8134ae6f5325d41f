//! Browsers on the operator's machine: cross-site requests and DNS
//! rebinding.
//!
//! Kiln's clients are servers (LibreChat, the seeds' gateways), which send
//! no `Origin`; the one browser client is the console Kiln serves itself,
//! whose requests are same-origin. A web page the operator visits can
//! still make the operator's browser send requests to a Kiln it can reach
//! (`http://127.0.0.1:8000`), and a keyless Kiln would run them. Two
//! checks, outside routing, before anything else looks at a request:
//!
//! - **Origin** (every auth mode): a request carrying an `Origin` that is
//!   not the server's own (same host and port as the request's `Host`, or
//!   a name in `allowed_hosts`) is refused with 403. Browsers send
//!   `Origin` on every cross-origin request and on every `POST`, `PUT` and
//!   `DELETE`, so a cross-site form, `fetch` or `sendBeacon` (whatever its
//!   `Content-Type`, or none) never reaches a handler.
//! - **Host** (keyless servers, `auth = none`): DNS rebinding makes the
//!   attacker's own name (`evil.example`) resolve to Kiln's address, so
//!   that its page is same-origin with Kiln and can read the answers. Such
//!   a request names the attacker's host in `Host`: a keyless server
//!   answers only IP addresses (a rebinding needs a name), `localhost`
//!   names when it listens on loopback or on every address, and the names
//!   in `allowed_hosts` (with the node's `advertise_url` host); any other
//!   `Host` is refused with 421. With a key or a token configured the page
//!   cannot present the credential, so the check is not needed there (and
//!   names like a compose service's `kiln` or a Kubernetes Service's work
//!   without configuration).
//!
//! Requests another node forwarded (authenticated by the nodes' secret)
//! were checked by the node that received them.

use std::net::{IpAddr, SocketAddr};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::config::{AppState, AuthMode};
use crate::error::ApiError;

pub use crate::hosts::HostPolicy;

impl HostPolicy {
    /// `names`: a comma-separated list (`kiln,kiln.example:8443`).
    pub fn new(listen: Option<SocketAddr>, names: &str) -> HostPolicy {
        let allowed_hosts = names
            .split(',')
            .map(|n| n.trim().trim_end_matches('.').to_ascii_lowercase())
            .filter(|n| !n.is_empty())
            .collect();
        HostPolicy {
            listen,
            allowed_hosts,
        }
    }

    /// Adds a name (the host of `advertise_url`).
    pub fn allow(&mut self, name: &str) {
        self.allowed_hosts.push(name.to_ascii_lowercase());
    }

    /// Whether `host:port` is one of the configured names.
    fn configured(&self, host: &str, port: Option<u16>) -> bool {
        self.allowed_hosts.iter().any(|entry| {
            let (name, entry_port) = split_authority(entry);
            name == host && entry_port.is_none_or(|p| Some(p) == port)
        })
    }

    /// Whether a keyless server answers a request naming `authority` in
    /// `Host`.
    fn host_allowed(&self, authority: &str) -> bool {
        let (host, port) = split_authority(authority);
        if host.parse::<IpAddr>().is_ok() {
            return true;
        }
        let loopback_listen = self
            .listen
            .is_none_or(|l| l.ip().is_loopback() || l.ip().is_unspecified());
        if loopback_listen && (host == "localhost" || host.ends_with(".localhost")) {
            return true;
        }
        self.configured(&host, port)
    }
}

/// `host[:port]` (`[v6]:port` too), the host lower case without a final
/// dot, the port when it is a number.
fn split_authority(authority: &str) -> (String, Option<u16>) {
    let a = authority.trim();
    let (host, port) = if let Some(rest) = a.strip_prefix('[') {
        match rest.split_once(']') {
            Some((h, tail)) => (h, tail.strip_prefix(':')),
            None => (rest, None),
        }
    } else {
        match a.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h, Some(p)),
            _ => (a, None),
        }
    };
    (
        host.trim_end_matches('.').to_ascii_lowercase(),
        port.and_then(|p| p.parse().ok()),
    )
}

/// The request's `Host` (or the authority of an absolute-form target).
fn request_host(req: &Request) -> Option<String> {
    req.headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| req.uri().authority().map(|a| a.as_str().to_owned()))
}

/// Whether `origin` (`scheme://host[:port]`) is the server's own for a
/// request to `host` (its `Host`), or a configured name.
fn same_origin(policy: &HostPolicy, origin: &str, host: Option<&str>) -> bool {
    let Some((scheme, authority)) = origin.split_once("://") else {
        // `null` (a sandboxed frame, a file, a privacy redirect) or garbage
        return false;
    };
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "http" => 80,
        "https" => 443,
        _ => return false,
    };
    let (o_host, o_port) = split_authority(authority);
    let o_port = o_port.unwrap_or(default_port);
    if let Some(host) = host {
        let (h_host, h_port) = split_authority(host);
        if h_host == o_host && h_port.unwrap_or(default_port) == o_port {
            return true;
        }
    }
    policy.configured(&o_host, Some(o_port))
}

/// Why a request is refused, if it is: a foreign `Origin` (any mode), or,
/// on a keyless server, a `Host` it does not answer to.
pub fn check(policy: &HostPolicy, auth: AuthMode, req: &Request) -> Result<(), ApiError> {
    let host = request_host(req);
    if let Some(origin) = origin(req.headers())
        && !same_origin(policy, &origin, host.as_deref())
    {
        return Err(ApiError::ForeignOrigin(origin));
    }
    if auth == AuthMode::None
        && let Some(host) = host
        && !policy.host_allowed(&host)
    {
        return Err(ApiError::UnknownHost(host));
    }
    Ok(())
}

/// The `Origin` header, as sent (several values are taken as foreign).
fn origin(headers: &HeaderMap) -> Option<String> {
    let mut all = headers.get_all(header::ORIGIN).iter();
    let first = all.next()?;
    if all.next().is_some() {
        return Some("(several Origin headers)".to_owned());
    }
    Some(String::from_utf8_lossy(first.as_bytes()).into_owned())
}

/// The middleware (outside routing, before anything reads the request).
pub async fn guard(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let forwarded = state
        .cluster
        .as_ref()
        .is_some_and(|c| c.authentic(req.headers()));
    if !forwarded && let Err(e) = check(&state.config.hosts, state.config.auth, &req) {
        tracing::info!(error = %e, "browser request refused");
        return e.into_response();
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

    fn req(host: Option<&str>, origin: Option<&str>) -> Request {
        let mut b = axum::http::Request::builder().uri("/v1/exec");
        if let Some(h) = host {
            b = b.header("host", h);
        }
        if let Some(o) = origin {
            b = b.header("origin", o);
        }
        b.body(Body::empty()).unwrap()
    }

    fn local() -> HostPolicy {
        HostPolicy::new(
            Some("127.0.0.1:8000".parse().unwrap()),
            " Kiln , proxy.example:8443 ",
        )
    }

    #[test]
    fn a_keyless_server_answers_addresses_loopback_names_and_configured_names_only() {
        let p = local();
        let ok = |h: &str| check(&p, AuthMode::None, &req(Some(h), None)).is_ok();
        assert!(ok("127.0.0.1:8000"));
        assert!(ok("10.1.2.3:8000"));
        assert!(ok("[::1]:8000"));
        assert!(ok("localhost:8000"));
        assert!(ok("LOCALHOST."));
        assert!(ok("app.localhost:8000"));
        assert!(ok("kiln:8000"));
        assert!(ok("kiln"));
        assert!(ok("proxy.example:8443"));
        assert!(!ok("proxy.example:8444"));
        assert!(!ok("evil.example:8000"));
        assert!(!ok("kiln.evil.example"));
        assert!(!ok("127.0.0.1.nip.io:8000"));
        // no Host at all: not a browser
        assert!(check(&p, AuthMode::None, &req(None, None)).is_ok());
        // listening on one outside address, localhost does not reach it
        let p = HostPolicy::new(Some("10.0.0.7:8000".parse().unwrap()), "");
        assert!(check(&p, AuthMode::None, &req(Some("localhost:8000"), None)).is_err());
        // with a key the page cannot authenticate: names are not checked
        assert!(check(&p, AuthMode::ApiKey, &req(Some("kiln:8000"), None)).is_ok());
    }

    #[test]
    fn only_the_servers_own_origin_or_a_configured_one_passes() {
        let p = local();
        let check = |h: &str, o: &str| check(&p, AuthMode::ApiKey, &req(Some(h), Some(o)));
        assert!(check("127.0.0.1:8000", "http://127.0.0.1:8000").is_ok());
        assert!(check("localhost:8000", "http://LOCALHOST:8000").is_ok());
        assert!(check("kiln.example", "https://kiln.example").is_ok());
        assert!(check("kiln.example", "http://kiln.example").is_ok());
        assert!(check("kiln.example", "https://kiln.example:443").is_ok());
        // a reverse proxy that rewrites Host, under a configured name
        assert!(check("127.0.0.1:8000", "https://proxy.example:8443").is_ok());
        assert!(check("127.0.0.1:8000", "http://127.0.0.1:9000").is_err());
        assert!(check("127.0.0.1:8000", "http://evil.example").is_err());
        assert!(check("127.0.0.1:8000", "null").is_err());
        assert!(check("127.0.0.1:8000", "file://").is_err());
        let r = {
            let mut r = req(Some("127.0.0.1:8000"), Some("http://127.0.0.1:8000"));
            r.headers_mut()
                .append("origin", "http://evil.example".parse().unwrap());
            r
        };
        assert!(super::check(&p, AuthMode::ApiKey, &r).is_err());
    }
}
