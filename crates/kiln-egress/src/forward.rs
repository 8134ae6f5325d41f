//! The forwarder: one request from a jail, checked against its grant and
//! the service's rules, sent upstream with the credentials added, and the
//! answer streamed back with caps, header hygiene and secret scrubbing.
//!
//! Order of checks (each refusal is a clear JSON error, see `error.rs`):
//! request target (no absolute URLs) → service granted → grant active →
//! method → path (normalised, then the allow-list) → query → declared body
//! size → rate limits (service, then user) → the grant's call quota → a
//! free upstream slot (per grant, then gateway-wide) → the SSRF guard while
//! connecting → no redirects → declared response size → streaming with
//! caps. Every call, refused or not, ends in one ledger record.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::{Stream, StreamExt};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, BodyStream, StreamBody};
use hyper::body::{Frame, Incoming};
use kiln_core::Owner;
use percent_encoding::percent_decode_str;
use tokio::sync::OwnedSemaphorePermit;

use crate::addr;
use crate::error::{Body, BoxError, Refused, full};
use crate::gateway::Shared;
use crate::grant::{Grant, GrantState, ServiceGrant};
use crate::ledger::CallRecord;
use crate::path::CleanPath;
use crate::registry::Service;
use crate::scrub::Scrubber;

/// One jail's channel: its grant and what it shares with the gateway.
pub(crate) struct ChannelCtx {
    pub grant: Grant,
    pub shared: Arc<Shared>,
    /// `KILN_SERVICES_URL` as the jail sees it (no trailing slash).
    pub public_url: String,
}

/// Request headers passed on from the jail (besides a service's own
/// `forward_headers`); everything else is dropped.
const FORWARDED: &[&str] = &[
    "accept",
    "accept-language",
    "content-type",
    "content-language",
    "content-disposition",
    "if-match",
    "if-none-match",
    "if-modified-since",
    "if-unmodified-since",
];

/// Request headers passed on only to a service that allows them
/// (`allow_range`): slices of an answer that reflects a secret would
/// outwit the scrubber (`scrub.rs`), which sees one slice at a time.
const RANGE: &[&str] = &["range", "if-range"];

/// Response headers passed back (besides a service's own
/// `response_headers`); everything else is dropped.
const RETURNED: &[&str] = &[
    "content-type",
    "content-length",
    "content-disposition",
    "content-language",
    "content-encoding",
    "content-range",
    "accept-ranges",
    "etag",
    "last-modified",
    "cache-control",
    "expires",
    "retry-after",
    "date",
];

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Text from the jail made safe for messages, logs and the ledger.
fn shown(s: &str, max: usize) -> String {
    let mut out: String = s
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .take(max)
        .collect();
    if s.chars().count() > max {
        out.push('…');
    }
    out
}

/// What the ledger records of a call, filled in as it goes.
struct CallLog {
    shared: Arc<Shared>,
    grant: Grant,
    service: String,
    method: String,
    path: String,
    started: Instant,
    started_at_ms: i64,
    /// Request body bytes sent upstream so far.
    up: Arc<AtomicU64>,
}

impl CallLog {
    /// Writes the record (in the background), the metrics and the grant's
    /// byte counters.
    fn finish(&self, status: u16, outcome: &str, bytes_down: u64) {
        let bytes_up = self.up.load(Ordering::Relaxed);
        if let Some(g) = self.grant.service(&self.service) {
            g.add_bytes(bytes_up, bytes_down);
        }
        let p = self.grant.principal();
        let rec = CallRecord {
            grant_id: self.grant.id().to_string(),
            owner: self.grant.owner().to_string(),
            tenant: p.tenant.clone(),
            user_id: p.user_id.clone(),
            service: self.service.clone(),
            method: self.method.clone(),
            path: self.path.clone(),
            status,
            outcome: outcome.to_owned(),
            bytes_up,
            bytes_down,
            started_at_ms: self.started_at_ms,
            duration_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
        };
        // label values only from the registry, never from the jail
        let service = if self.grant.service(&self.service).is_some() {
            self.service.clone()
        } else {
            "(not granted)".to_owned()
        };
        metrics::counter!("kiln_egress_calls_total", "service" => service.clone(), "outcome" => outcome.to_owned())
            .increment(1);
        metrics::counter!("kiln_egress_bytes_total", "service" => service.clone(), "direction" => "up")
            .increment(bytes_up);
        metrics::counter!("kiln_egress_bytes_total", "service" => service.clone(), "direction" => "down")
            .increment(bytes_down);
        metrics::histogram!("kiln_egress_call_seconds", "service" => service)
            .record(self.started.elapsed().as_secs_f64());
        tracing::info!(
            grant = %rec.grant_id, owner = %rec.owner, user = %rec.user_id,
            service = %rec.service, method = %rec.method, path = %rec.path,
            status, outcome, bytes_up, bytes_down, ms = rec.duration_ms,
            "egress call"
        );
        let ledger = Arc::clone(&self.shared.ledger);
        let write = async move {
            if let Err(e) = ledger.record(rec).await {
                metrics::counter!("kiln_egress_ledger_errors_total").increment(1);
                tracing::error!(error = %e, "could not record an egress call in the ledger");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn(write);
            }
            Err(_) => tracing::error!("no runtime to record an egress call"),
        }
    }
}

/// Serves one request from the jail.
pub(crate) async fn handle(ctx: Arc<ChannelCtx>, req: Request<Incoming>) -> Response<Body> {
    let uri = req.uri().clone();
    if uri.path() == "/" && uri.scheme().is_none() {
        return match *req.method() {
            Method::GET | Method::HEAD => listing(&ctx),
            _ => Refused::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "GET / lists the services of this run; call one as <METHOD> /<service>/<path>",
            )
            .into_response(),
        };
    }
    let (service, rest) = uri
        .path()
        .strip_prefix('/')
        .map(|p| p.split_once('/').map_or((p, ""), |(s, r)| (s, r)))
        .unwrap_or(("", ""));
    let log = CallLog {
        shared: Arc::clone(&ctx.shared),
        grant: ctx.grant.clone(),
        service: shown(service, 64),
        method: shown(req.method().as_str(), 16),
        path: shown(&format!("/{rest}"), 512),
        started: Instant::now(),
        started_at_ms: now_ms(),
        up: Arc::new(AtomicU64::new(0)),
    };
    match forward(&ctx, req, &log).await {
        Ok(r) => r,
        Err(refused) => {
            log.finish(refused.status.as_u16(), refused.reason, 0);
            refused.into_response()
        }
    }
}

/// `GET /`: what this run may call, for programs and models alike.
fn listing(ctx: &ChannelCtx) -> Response<Body> {
    let now = Instant::now();
    let services: Vec<serde_json::Value> = ctx
        .grant
        .services()
        .iter()
        .map(|g| {
            let s = &g.service;
            serde_json::json!({
                "name": s.name,
                "description": s.description,
                "url": format!("{}/{}", ctx.public_url, s.name),
                "methods": s.methods.iter().map(Method::as_str).collect::<Vec<_>>(),
                "paths": s.paths.iter().map(|p| p.as_str()).collect::<Vec<_>>(),
                "max_request_bytes": s.max_request_bytes,
                "max_response_bytes": s.max_response_bytes,
                "timeout_secs": s.timeout.as_secs(),
                "rate": s.rate().map(|r| r.to_string()),
                "user_rate": s.user_rate().map(|r| r.to_string()),
                "requests_left": g.remaining_requests(),
            })
        })
        .collect();
    let body = serde_json::json!({
        "services": services,
        "expires_in_secs": ctx.grant.expires_at().saturating_duration_since(now).as_secs(),
        "usage": format!(
            "Call a service as <METHOD> {}/<service><path>, e.g. POST {}/<service>/<path>, with an ordinary HTTP client. \
             Kiln adds the service's credentials; never send your own. Errors are JSON {{\"error\", \"reason\"}}.",
            ctx.public_url, ctx.public_url
        ),
    });
    let mut r = Response::new(full(body.to_string()));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// The query string as forwarded: the jail's (checked), minus parameters
/// the service injects, plus the injected ones.
fn build_query(raw: Option<&str>, service: &Service) -> Result<Option<String>, Refused> {
    let mut parts: Vec<String> = Vec::new();
    if let Some(q) = raw {
        if q.bytes().any(|b| !(0x21..=0x7e).contains(&b) || b == b'#') {
            return Err(Refused::bad_request(
                "the query string has a character that must be percent-encoded",
            ));
        }
        if q.len() > 4096 {
            return Err(Refused::bad_request(
                "the query string is longer than 4096 bytes",
            ));
        }
        for pair in q.split('&').filter(|p| !p.is_empty()) {
            let name = pair.split_once('=').map_or(pair, |(n, _)| n);
            let name = percent_decode_str(&name.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned();
            if service.inject_query.iter().any(|(k, _, _)| *k == name) {
                continue;
            }
            parts.push(pair.to_owned());
        }
    }
    for (_, k, v) in &service.inject_query {
        parts.push(format!("{k}={v}"));
    }
    Ok((!parts.is_empty()).then(|| parts.join("&")))
}

fn request_headers(from: &HeaderMap, service: &Service) -> HeaderMap {
    let mut out = HeaderMap::new();
    for (name, value) in from {
        let n = name.as_str();
        let passed = FORWARDED.contains(&n)
            || service.forward_headers.contains(name)
            || (service.allow_range && RANGE.contains(&n));
        let injected = service.inject_headers.iter().any(|(h, _)| h == name);
        if passed && !injected {
            out.append(name.clone(), value.clone());
        }
    }
    if let Some(len) = from.get(header::CONTENT_LENGTH) {
        out.insert(header::CONTENT_LENGTH, len.clone());
    }
    for (h, v) in &service.inject_headers {
        out.insert(h.clone(), v.clone());
    }
    // only bodies the scrubber can read: nothing compressed
    out.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    out
}

fn response_headers(from: &HeaderMap, service: &Service, scrub: &Scrubber) -> HeaderMap {
    let mut out = HeaderMap::new();
    for (name, value) in from {
        let passed = RETURNED.contains(&name.as_str()) || service.response_headers.contains(name);
        if passed && !scrub.contains_secret(value.as_bytes()) {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

/// Takes a token from the service's and the user's bucket, or says when
/// to retry.
fn rate_limit(service: &Service, user_key: &str) -> Result<(), Refused> {
    let now = Instant::now();
    if let Some(l) = &service.limiter
        && let Err(wait) = l.take(&service.name, now)
    {
        return Err(Refused::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            format!(
                "the service {} allows {} calls for everyone together; retry in {} s",
                service.name,
                l.rate(),
                wait.as_secs() + 1
            ),
        )
        .retry_after(wait));
    }
    if let Some(l) = &service.user_limiter
        && let Err(wait) = l.take(user_key, now)
    {
        if let Some(sl) = &service.limiter {
            sl.give_back(&service.name);
        }
        return Err(Refused::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            format!(
                "the service {} allows {} calls per user; retry in {} s",
                service.name,
                l.rate(),
                wait.as_secs() + 1
            ),
        )
        .retry_after(wait));
    }
    Ok(())
}

/// Gives back what [`rate_limit`] took (a call refused later).
fn give_back(service: &Service, user_key: &str) {
    if let Some(l) = &service.limiter {
        l.give_back(&service.name);
    }
    if let Some(l) = &service.user_limiter {
        l.give_back(user_key);
    }
}

/// The checks up to the rate limits; `Ok` is the granted service and the
/// cleaned path.
fn authorize<'g>(
    ctx: &'g ChannelCtx,
    method: &Method,
    uri: &http::Uri,
    service_name: &str,
    rest: &str,
) -> Result<(&'g ServiceGrant, CleanPath), Refused> {
    if uri.scheme().is_some() || uri.authority().is_some() {
        return Err(Refused::bad_request(format!(
            "absolute URLs are not accepted: send the request to {}/<service>/<path>",
            ctx.public_url
        )));
    }
    let Some(g) = ctx.grant.service(service_name) else {
        let granted = ctx.grant.service_names();
        return Err(Refused::new(
            StatusCode::FORBIDDEN,
            "not_granted",
            format!(
                "the service {:?} is not granted to this run (granted: {}); GET {}/ lists them",
                shown(service_name, 64),
                if granted.is_empty() {
                    "none".to_owned()
                } else {
                    granted.join(", ")
                },
                ctx.public_url
            ),
        ));
    };
    match ctx.grant.state(Instant::now()) {
        GrantState::Active => {}
        GrantState::Expired => {
            return Err(Refused::new(
                StatusCode::UNAUTHORIZED,
                "expired",
                "this run's grant has expired",
            ));
        }
        GrantState::Revoked => {
            return Err(Refused::new(
                StatusCode::FORBIDDEN,
                "revoked",
                "this run's grant was revoked",
            ));
        }
    }
    let s = &g.service;
    if !s.methods.contains(method) {
        return Err(Refused::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            format!(
                "{} is not allowed for {} (allowed: {})",
                shown(method.as_str(), 16),
                s.name,
                s.methods
                    .iter()
                    .map(Method::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    let path = CleanPath::parse(&format!("/{rest}"))
        .map_err(|e| Refused::new(StatusCode::BAD_REQUEST, "bad_path", e))?;
    if !s.paths.iter().any(|p| p.matches(&path)) {
        return Err(Refused::new(
            StatusCode::FORBIDDEN,
            "path_not_allowed",
            format!(
                "{} {} is not an allowed path of {} (allowed: {})",
                method,
                shown(&path.to_string(), 256),
                s.name,
                s.paths
                    .iter()
                    .map(|p| p.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    Ok((g, path))
}

async fn forward(
    ctx: &ChannelCtx,
    req: Request<Incoming>,
    log: &CallLog,
) -> Result<Response<Body>, Refused> {
    let (parts, body) = req.into_parts();
    let rest = parts
        .uri
        .path()
        .strip_prefix('/')
        .and_then(|p| p.split_once('/'))
        .map_or("", |(_, r)| r);
    let (g, path) = authorize(ctx, &parts.method, &parts.uri, &log.service, rest)?;
    let service = Arc::clone(&g.service);
    let query = build_query(parts.uri.query(), &service)?;
    let declared: Option<u64> = match parts.headers.get(header::CONTENT_LENGTH) {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| Refused::bad_request("Content-Length is not a number"))?,
        ),
    };
    if let Some(n) = declared.filter(|n| *n > service.max_request_bytes) {
        // a client that sends its whole body before it reads the answer
        // gets the 413, not a broken connection: read a bounded body away
        if n <= service.max_request_bytes.saturating_add(DRAIN_MAX) {
            drain(body).await;
        }
        return Err(too_large_request(&service));
    }

    let user_key = Owner::new(ctx.grant.principal().clone()).key();
    let user_key = user_key.as_str();
    rate_limit(&service, user_key)?;
    if !g.reserve_request() {
        give_back(&service, user_key);
        return Err(Refused::new(
            StatusCode::TOO_MANY_REQUESTS,
            "grant_exhausted",
            format!(
                "this run has made the {} calls to {} it may make",
                service.max_requests_per_grant, service.name
            ),
        ));
    }
    let permits = match acquire_slots(ctx).await {
        Ok(p) => p,
        Err(e) => {
            g.release_request();
            give_back(&service, user_key);
            return Err(e);
        }
    };

    let mut url = service.upstream.clone();
    let base = url.path().trim_end_matches('/').to_owned();
    url.set_path(&format!("{base}{}", path.encoded()));
    url.set_query(query.as_deref());
    if let Some(ip) = service.upstream_ip {
        addr::check(ip, service.allow_private)
            .map_err(|e| Refused::new(StatusCode::BAD_GATEWAY, "upstream_blocked", e))?;
    }

    let sent = Arc::clone(&log.up);
    let overflow = Arc::new(AtomicBool::new(false));
    let broken = Arc::new(AtomicBool::new(false));
    let has_body =
        declared.is_some_and(|n| n > 0) || parts.headers.contains_key(header::TRANSFER_ENCODING);
    let scrub = Scrubber::new(&service.secrets);
    let mut rb = service
        .client
        .request(parts.method.clone(), url)
        .headers(request_headers(&parts.headers, &service))
        .timeout(service.timeout);
    if has_body {
        rb = rb.body(reqwest::Body::wrap_stream(Upload {
            inner: BodyStream::new(body),
            sent: Arc::clone(&sent),
            cap: service.max_request_bytes,
            overflow: Arc::clone(&overflow),
            broken: Arc::clone(&broken),
            drained: 0,
        }));
    }
    let resp = match rb.send().await {
        Ok(r) => r,
        Err(e) => {
            return Err(if overflow.load(Ordering::Relaxed) {
                too_large_request(&service)
            } else if broken.load(Ordering::Relaxed) {
                Refused::bad_request(
                    "the request body could not be read (malformed chunked encoding?)",
                )
            } else {
                upstream_error(&service, &e, sent.load(Ordering::Relaxed), &scrub)
            });
        }
    };
    let status = resp.status();
    if status.is_redirection() && status != StatusCode::NOT_MODIFIED {
        return Err(Refused::new(
            StatusCode::BAD_GATEWAY,
            "upstream_redirect",
            format!(
                "the upstream of {} answered {} with a redirect; the gateway never follows redirects",
                service.name,
                status.as_u16()
            ),
        ));
    }
    if resp
        .content_length()
        .is_some_and(|n| n > service.max_response_bytes)
    {
        return Err(too_large_response(&service));
    }
    if let Some(coding) = resp
        .headers()
        .get(header::CONTENT_ENCODING)
        .filter(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"))
    {
        // compressed bytes would pass the scrubber and be inflated in the jail
        return Err(Refused::new(
            StatusCode::BAD_GATEWAY,
            "upstream_encoded",
            format!(
                "the upstream of {} answered with Content-Encoding {:?} although the gateway asked for identity; \
                 the gateway passes only bodies it can check for secrets",
                service.name,
                shown(&String::from_utf8_lossy(coding.as_bytes()), 32)
            ),
        ));
    }
    let headers = response_headers(resp.headers(), &service, &scrub);
    let download = Download {
        inner: resp.bytes_stream().boxed(),
        scrub,
        received: 0,
        passed: 0,
        cap: service.max_response_bytes,
        done: false,
        end: Some(End {
            log: CallLog {
                shared: Arc::clone(&log.shared),
                grant: log.grant.clone(),
                service: log.service.clone(),
                method: log.method.clone(),
                path: log.path.clone(),
                started: log.started,
                started_at_ms: log.started_at_ms,
                up: Arc::clone(&log.up),
            },
            status: status.as_u16(),
            bytes_down: 0,
            outcome: "aborted",
            _permits: permits,
        }),
    };
    let mut out = Response::new(BodyExt::boxed_unsync(StreamBody::new(download)));
    *out.status_mut() = status;
    *out.headers_mut() = headers;
    Ok(out)
}

fn too_large_request(service: &Service) -> Refused {
    Refused::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "request_too_large",
        format!(
            "the request body is larger than {} bytes, the limit of {}",
            service.max_request_bytes, service.name
        ),
    )
}

fn too_large_response(service: &Service) -> Refused {
    Refused::new(
        StatusCode::BAD_GATEWAY,
        "response_too_large",
        format!(
            "the upstream's answer is larger than {} bytes, the limit of {}",
            service.max_response_bytes, service.name
        ),
    )
}

/// An upstream failure in words, with neither the URL (it may carry an
/// injected query secret) nor any secret.
fn upstream_error(service: &Service, e: &reqwest::Error, sent: u64, scrub: &Scrubber) -> Refused {
    let mut chain = String::new();
    let mut src: Option<&dyn std::error::Error> = Some(e);
    while let Some(s) = src {
        chain.push_str(&s.to_string());
        chain.push_str(": ");
        src = s.source();
    }
    let blocked = chain
        .find(addr::BLOCKED_MARKER)
        .map(|i| chain[i + addr::BLOCKED_MARKER.len()..].to_owned());
    let mut msg = match (&blocked, e.is_timeout(), e.is_connect()) {
        (Some(why), _, _) => format!(
            "the upstream of {} is refused: {}",
            service.name,
            why.split(": ").next().unwrap_or("")
        ),
        (None, true, _) => format!(
            "the upstream of {} did not answer within {} s",
            service.name,
            service.timeout.as_secs()
        ),
        (None, false, true) => format!("could not connect to the upstream of {}", service.name),
        (None, false, false) if sent > 0 => format!(
            "the upstream of {} broke off the call while the request body was being sent",
            service.name
        ),
        (None, false, false) => format!("the call to the upstream of {} failed", service.name),
    };
    if scrub.contains_secret(msg.as_bytes()) {
        msg = format!("the call to the upstream of {} failed", service.name);
    }
    let (status, reason) = match (&blocked, e.is_timeout(), e.is_connect()) {
        (Some(_), _, _) => (StatusCode::BAD_GATEWAY, "upstream_blocked"),
        (None, true, _) => (StatusCode::GATEWAY_TIMEOUT, "upstream_timeout"),
        (None, false, true) => (StatusCode::BAD_GATEWAY, "upstream_unreachable"),
        (None, false, false) => (StatusCode::BAD_GATEWAY, "upstream_error"),
    };
    tracing::warn!(service = %service.name, error = %e.without_url_ref(), "egress upstream call failed");
    Refused::new(status, reason, msg)
}

trait WithoutUrl {
    fn without_url_ref(&self) -> String;
}

impl WithoutUrl for reqwest::Error {
    /// The error's description without its URL.
    fn without_url_ref(&self) -> String {
        let mut chain = Vec::new();
        let mut src = std::error::Error::source(self);
        while let Some(s) = src {
            chain.push(s.to_string());
            src = s.source();
        }
        let kind = if self.is_timeout() {
            "timeout"
        } else if self.is_connect() {
            "connect"
        } else if self.is_body() {
            "body"
        } else if self.is_request() {
            "request"
        } else {
            "error"
        };
        format!("{kind}: {}", chain.join(": "))
    }
}

/// A slot for one upstream call: the grant's own, then the gateway's.
async fn acquire_slots(ctx: &ChannelCtx) -> Result<Permits, Refused> {
    let busy = |what: &str| {
        Refused::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "busy",
            format!("{what}; retry shortly"),
        )
        .retry_after(Duration::from_secs(1))
    };
    let wait = ctx.shared.settings.queue_timeout;
    let grant = tokio::time::timeout(wait, ctx.grant.in_flight().acquire_owned())
        .await
        .map_err(|_| {
            busy(&format!(
                "this run already has {} calls in flight",
                ctx.shared.settings.max_concurrent_per_grant
            ))
        })?
        .map_err(|_| busy("the gateway is closing"))?;
    let gateway = tokio::time::timeout(wait, Arc::clone(&ctx.shared.upstream).acquire_owned())
        .await
        .map_err(|_| busy("the gateway is at its limit of concurrent upstream calls"))?
        .map_err(|_| busy("the gateway is closing"))?;
    Ok(Permits {
        _grant: grant,
        _gateway: gateway,
    })
}

/// Held while a call uses an upstream connection (until its body ends).
struct Permits {
    _grant: OwnedSemaphorePermit,
    _gateway: OwnedSemaphorePermit,
}

/// The jail's request body on its way up, counted and capped.
struct Upload {
    inner: BodyStream<Incoming>,
    sent: Arc<AtomicU64>,
    cap: u64,
    overflow: Arc<AtomicBool>,
    /// The jail's body could not be read (malformed chunked encoding, or
    /// the connection broke).
    broken: Arc<AtomicBool>,
    /// Bytes read and discarded after the cap was passed.
    drained: u64,
}

/// After a request body passed its cap, up to this much more is read and
/// discarded, so that a client that sends its whole body before it reads
/// the answer gets the 413 instead of a broken connection.
const DRAIN_MAX: u64 = 32 * 1024 * 1024;

/// Reads a refused request's body away (at most its declared length, which
/// hyper enforces, and for at most `DRAIN_TIME`).
async fn drain(mut body: Incoming) {
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        while let Some(Ok(_)) = body.frame().await {}
    })
    .await;
}

/// How long a refused body is read away at most.
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
#[error("the request body exceeds the service's limit")]
struct UploadTooLarge;

impl Stream for Upload {
    type Item = Result<Bytes, BoxError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            let frame = match Pin::new(&mut self.inner).poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) if self.overflow.load(Ordering::Relaxed) => {
                    return Poll::Ready(Some(Err(Box::new(UploadTooLarge))));
                }
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Ready(Some(Err(e))) => {
                    self.broken.store(true, Ordering::Relaxed);
                    return Poll::Ready(Some(Err(Box::new(e))));
                }
                Poll::Ready(Some(Ok(f))) => f,
            };
            let Ok(data) = frame.into_data() else {
                continue; // trailers are not forwarded
            };
            if self.overflow.load(Ordering::Relaxed) {
                self.drained += data.len() as u64;
                if self.drained > DRAIN_MAX {
                    return Poll::Ready(Some(Err(Box::new(UploadTooLarge))));
                }
                continue;
            }
            let total = self.sent.load(Ordering::Relaxed) + data.len() as u64;
            if total > self.cap {
                // nothing more goes up; read the rest away, then fail the call
                self.overflow.store(true, Ordering::Relaxed);
                self.drained = data.len() as u64;
                continue;
            }
            self.sent.store(total, Ordering::Relaxed);
            return Poll::Ready(Some(Ok(data)));
        }
    }
}

/// Written to the ledger when the response body ends, however it ends
/// (the jail may go away mid-body: then the outcome stays `aborted`).
struct End {
    log: CallLog,
    status: u16,
    bytes_down: u64,
    outcome: &'static str,
    _permits: Permits,
}

impl Drop for End {
    fn drop(&mut self) {
        self.log.finish(self.status, self.outcome, self.bytes_down);
    }
}

/// The upstream's response body on its way to the jail: capped, counted
/// and scrubbed of secrets.
struct Download {
    inner: futures::stream::BoxStream<'static, Result<Bytes, reqwest::Error>>,
    scrub: Scrubber,
    received: u64,
    passed: u64,
    cap: u64,
    done: bool,
    end: Option<End>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct DownloadCut(&'static str);

impl Download {
    fn finish(&mut self, outcome: &'static str) {
        if let Some(end) = self.end.as_mut() {
            end.outcome = outcome;
        }
        self.end = None; // Drop of End records it
        self.done = true;
    }
}

impl Stream for Download {
    type Item = Result<Frame<Bytes>, BoxError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        loop {
            match self.inner.poll_next_unpin(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(chunk))) => {
                    self.received += chunk.len() as u64;
                    if self.received > self.cap {
                        self.record_down();
                        self.finish("response_too_large");
                        return Poll::Ready(Some(Err(Box::new(DownloadCut(
                            "the upstream's answer exceeds the service's limit",
                        )))));
                    }
                    let out = self.scrub.push(&chunk);
                    if out.is_empty() {
                        continue;
                    }
                    self.passed += out.len() as u64;
                    return Poll::Ready(Some(Ok(Frame::data(out))));
                }
                Poll::Ready(Some(Err(e))) => {
                    self.record_down();
                    let outcome = if e.is_timeout() {
                        "upstream_timeout"
                    } else {
                        "upstream_error"
                    };
                    self.finish(outcome);
                    return Poll::Ready(Some(Err(Box::new(DownloadCut(
                        "the upstream's answer broke off",
                    )))));
                }
                Poll::Ready(None) => {
                    let tail = self.scrub.finish();
                    self.passed += tail.len() as u64;
                    self.record_down();
                    self.finish("ok");
                    if tail.is_empty() {
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(tail))));
                }
            }
        }
    }
}

impl Download {
    /// Puts the bytes passed so far into the ledger record.
    fn record_down(&mut self) {
        let passed = self.passed;
        let hits = self.scrub.hits;
        if let Some(end) = self.end.as_mut() {
            end.bytes_down = passed;
            if hits > 0 {
                metrics::counter!("kiln_egress_secrets_scrubbed_total").increment(hits);
                tracing::warn!(service = %end.log.service, hits, "a secret in an upstream response was scrubbed");
            }
        }
    }
}

impl Drop for Download {
    fn drop(&mut self) {
        if self.end.is_some() {
            // the jail went away mid-body
            self.record_down();
        }
    }
}
