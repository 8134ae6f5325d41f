//! Per-principal rate limits of LibreChat's routes (spec §4): one limiter
//! per route class, keyed by who is calling, each a GCRA (a token bucket
//! without a timer: `max` requests at once, then one per `window / max`).
//!
//! The key is the principal, `<tenant>:user:<id>` — the verified token's,
//! else the request's identity hints — or, for identity-less requests, the
//! client's address. Answers carry the draft-6 headers `RateLimit-Limit`,
//! `RateLimit-Remaining` and `RateLimit-Reset` (seconds until the bucket is
//! full again); a refusal is 429 with `Retry-After` and §4's body for the
//! class (exec's is the coded one with `retry_after_seconds`, the only one
//! LibreChat's client reads). In-process: each node counts on its own.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use kiln_core::{Owner, Principal};

use crate::config::AppState;
use crate::error::ApiError;
use crate::identity::{Identity, ScopeQuery, header_user_id};

pub use crate::limits::{Class, RateLimits, RateRules, Rule, Verdict, refusal_body, stamp};
use crate::limits::{Gcra, PRUNE_ABOVE};

impl Default for RateRules {
    /// Generous: ten to thirty times the official server's (exec 20 per
    /// 30 s, upload 30 per 5 min, download 60/min, list 120/min), since one
    /// LibreChat turn may probe and download dozens of files (skills), skill
    /// priming uploads a batch per skill, and identity-less callers share
    /// their address's bucket.
    fn default() -> Self {
        RateRules {
            exec: Some(Rule::new(600, 60)),
            upload: Some(Rule::new(600, 60)),
            download: Some(Rule::new(1200, 60)),
            fetch: Some(Rule::new(1200, 60)),
            delete: Some(Rule::new(600, 60)),
            cancel: Some(Rule::new(600, 60)),
        }
    }
}

impl RateRules {
    /// No limits at all.
    pub fn off() -> RateRules {
        RateRules {
            exec: None,
            upload: None,
            download: None,
            fetch: None,
            delete: None,
            cancel: None,
        }
    }

    fn get(&self, class: Class) -> Option<Rule> {
        match class {
            Class::Exec => self.exec,
            Class::Upload => self.upload,
            Class::Download => self.download,
            Class::Fetch => self.fetch,
            Class::Delete => self.delete,
            Class::Cancel => self.cancel,
        }
    }
}

impl Gcra {
    fn interval(&self) -> Duration {
        self.rule.window / self.rule.max.max(1)
    }

    /// The verdict of a step that left the key's arrival time `ahead` of
    /// now (allowed), or found it `ahead` of now (refused).
    fn verdict(&self, allowed: bool, ahead: Duration) -> Verdict {
        let t = self.interval();
        let window = self.rule.window;
        if !allowed {
            return Verdict {
                limit: self.rule.max,
                remaining: 0,
                reset: (ahead + t).saturating_sub(window),
                allowed: false,
            };
        }
        let spare = window.saturating_sub(ahead);
        Verdict {
            limit: self.rule.max,
            remaining: u32::try_from(spare.as_nanos() / t.as_nanos().max(1)).unwrap_or(u32::MAX),
            reset: ahead,
            allowed: true,
        }
    }

    /// One step in the shared store, keyed by class and `key`.
    async fn check_shared(
        &self,
        store: &kiln_store::Store,
        class: Class,
        key: &str,
    ) -> Result<Verdict, kiln_store::StoreError> {
        let now_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
        let us = |d: Duration| i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
        let step = store
            .rate_step(
                &format!("{class:?}:{key}"),
                now_us,
                us(self.interval()),
                us(self.rule.window),
            )
            .await?;
        let ahead = Duration::from_micros(u64::try_from(step.tat_us - now_us).unwrap_or(0));
        Ok(self.verdict(step.allowed, ahead))
    }

    fn check(&self, key: &str, now: Instant) -> Verdict {
        let t = self.interval();
        let window = self.rule.window;
        let mut tats = self.tat.lock().unwrap_or_else(|e| e.into_inner());
        // Not an `Expiring`: a key's clock is its theoretical arrival time,
        // which lies ahead of now, and a key past it holds nothing to keep.
        if tats.len() > PRUNE_ABOVE {
            tats.retain(|_, tat| *tat > now);
        }
        let tat = tats
            .get(key)
            .copied()
            .filter(|tat| *tat > now)
            .unwrap_or(now);
        let next = tat + t;
        // allowed while the new arrival time is at most a window ahead
        let ahead = next.saturating_duration_since(now);
        if ahead > window {
            return self.verdict(false, tat.saturating_duration_since(now));
        }
        tats.insert(key.to_owned(), next);
        self.verdict(true, ahead)
    }
}

impl RateLimits {
    /// Limits counted in the database of `store`, shared by every node on it.
    pub fn shared(rules: RateRules, store: kiln_store::Store) -> RateLimits {
        RateLimits {
            shared: Some(store),
            ..RateLimits::new(rules)
        }
    }

    /// Limits counted in this process.
    pub fn new(rules: RateRules) -> RateLimits {
        let classes = [
            Class::Exec,
            Class::Upload,
            Class::Download,
            Class::Fetch,
            Class::Delete,
            Class::Cancel,
        ];
        let limiters = classes
            .into_iter()
            .filter_map(|c| {
                rules
                    .get(c)
                    .filter(|r| r.max > 0 && !r.window.is_zero())
                    .map(|rule| {
                        (
                            c,
                            Gcra {
                                rule,
                                tat: Mutex::new(HashMap::new()),
                            },
                        )
                    })
            })
            .collect();
        RateLimits {
            limiters,
            shared: None,
        }
    }

    /// Counts one request of `class` by `key` at `now`; `None` when the
    /// class has no limit.
    pub fn check_at(&self, class: Class, key: &str, now: Instant) -> Option<Verdict> {
        self.limiters.get(&class).map(|g| g.check(key, now))
    }

    /// Counts one request of `class` by `key` now (in the shared store if
    /// there is one): `Ok` with the headers to stamp on the answer, or the
    /// 429.
    pub async fn check(&self, class: Class, key: &str) -> Result<Option<Verdict>, ApiError> {
        let Some(gcra) = self.limiters.get(&class) else {
            return Ok(None);
        };
        let verdict = match &self.shared {
            None => gcra.check(key, Instant::now()),
            Some(store) => match gcra.check_shared(store, class, key).await {
                Ok(v) => v,
                Err(e) => {
                    metrics::counter!("kiln_rate_limit_store_errors_total").increment(1);
                    tracing::warn!(error = %e, "shared rate limit unavailable: counted on this node");
                    gcra.check(key, Instant::now())
                }
            },
        };
        if verdict.allowed {
            Ok(Some(verdict))
        } else {
            Err(ApiError::RateLimited { class, verdict })
        }
    }
}

/// The key code started by `caller` is counted under: the principal when
/// the request named one, else the client's address.
pub fn code_key(caller: &kiln_core::access::Caller, peer: Option<SocketAddr>) -> String {
    if caller.identified {
        Owner::of(caller).key().to_string()
    } else {
        address_key(peer)
    }
}

/// Counts one start of code by `caller` in the one class every face that
/// runs code shares ([`Class::Exec`]): the headers to stamp, or the 429.
/// Every face that runs code asks this; its runs (kernel evaluations
/// included) go through `Runs::start`, which also counts the registry's
/// per-caller limit.
pub async fn starts_code(
    state: &AppState,
    caller: &kiln_core::access::Caller,
    peer: Option<SocketAddr>,
) -> Result<Option<Verdict>, ApiError> {
    state
        .rates
        .check(Class::Exec, &code_key(caller, peer))
        .await
}

/// The key a request is counted under before its body is read: the
/// verified caller, else `User-Id`, else `kind=user&id=` in the query, else
/// the client's address.
pub fn request_key(state: &AppState, req: &Request) -> String {
    let tenant = &state.config.tenant;
    if let Some(Identity(Some(c))) = req.extensions().get::<Identity>() {
        return Owner::of(c).key().to_string();
    }
    let hinted = header_user_id(req.headers())
        .ok()
        .flatten()
        .map(str::to_owned)
        .or_else(|| {
            let q: ScopeQuery = req.uri().query().and_then(scope_query).unwrap_or_default();
            q.user_hint().map(str::to_owned)
        });
    match hinted {
        Some(user) => Owner::new(Principal {
            tenant: tenant.clone(),
            user_id: user,
        })
        .key()
        .to_string(),
        None => address_key(
            req.extensions()
                .get::<ConnectInfo<SocketAddr>>()
                .map(|c| c.0),
        ),
    }
}

/// `ip:<address>` of the peer (`ip:unknown` when the server was not given
/// peer addresses).
pub fn address_key(peer: Option<SocketAddr>) -> String {
    match peer {
        Some(addr) => format!("ip:{}", addr.ip()),
        None => "ip:unknown".to_owned(),
    }
}

/// Extractor: the peer's address, when the server records it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Peer(pub Option<SocketAddr>);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Peer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(Peer(
            parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|c| c.0),
        ))
    }
}

fn scope_query(q: &str) -> Option<ScopeQuery> {
    axum::extract::Query::<ScopeQuery>::try_from_uri(
        &format!("/?{q}").parse::<axum::http::Uri>().ok()?,
    )
    .ok()
    .map(|axum::extract::Query(q)| q)
}

/// The class the rate layer counts a route in, by method and route
/// template (under `/v1` or not), as [`crate::kit::routes::ROUTES`]
/// declares it; `None` for routes the layer does not count (free, or
/// counted by their handler, whose key needs the body).
pub fn classify(method: &axum::http::Method, route: &str) -> Option<Class> {
    match crate::kit::routes::by_template(method, route)?.rate {
        crate::kit::Rate::Layer(class) => Some(class),
        crate::kit::Rate::Free | crate::kit::Rate::Handler(_) => None,
    }
}

/// The middleware of the authenticated routes: counts the request in its
/// route's class's limiter (see [`classify`]) and stamps the headers on the answer.
pub async fn limit(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|m| m.as_str().to_owned())
        .unwrap_or_else(|| req.uri().path().to_owned());
    let Some(class) = classify(req.method(), &route) else {
        return next.run(req).await;
    };
    let key = request_key(&state, &req);
    match state.rates.check(class, &key).await {
        Err(e) => e.into_response(),
        Ok(verdict) => {
            let mut resp = next.run(req).await;
            if let Some(v) = verdict {
                stamp(resp.headers_mut(), &v);
            }
            resp
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: u32, secs: u64) -> RateLimits {
        RateLimits::new(RateRules {
            exec: Some(Rule::new(max, secs)),
            ..RateRules::off()
        })
    }

    #[test]
    fn a_burst_of_max_then_one_per_interval() {
        let l = limits(3, 30);
        let t0 = Instant::now();
        let remaining: Vec<u32> = (0..3)
            .map(|_| l.check_at(Class::Exec, "u", t0).unwrap())
            .inspect(|v| assert!(v.allowed))
            .map(|v| v.remaining)
            .collect();
        assert_eq!(remaining, [2, 1, 0]);
        let refused = l.check_at(Class::Exec, "u", t0).unwrap();
        assert!(!refused.allowed);
        assert_eq!(refused.reset, Duration::from_secs(10));
        // another key has its own bucket; a class without a rule is free
        assert!(l.check_at(Class::Exec, "v", t0).unwrap().allowed);
        assert_eq!(l.check_at(Class::Upload, "u", t0), None);
        // one request's worth comes back after window / max
        let later = t0 + Duration::from_secs(10);
        assert!(l.check_at(Class::Exec, "u", later).unwrap().allowed);
        assert!(!l.check_at(Class::Exec, "u", later).unwrap().allowed);
        // a full window later the whole burst is back
        let v = l
            .check_at(Class::Exec, "u", t0 + Duration::from_secs(60))
            .unwrap();
        assert_eq!((v.allowed, v.remaining), (true, 2));
    }

    #[test]
    fn idle_keys_are_forgotten() {
        let l = limits(10, 1);
        let t0 = Instant::now();
        for i in 0..(PRUNE_ABOVE * 2) {
            l.check_at(Class::Exec, &format!("u{i}"), t0);
        }
        l.check_at(Class::Exec, "last", t0 + Duration::from_secs(5));
        let n = l.limiters[&Class::Exec].tat.lock().unwrap().len();
        assert!(n <= PRUNE_ABOVE + 1, "{n}");
    }

    #[test]
    fn exec_refusals_carry_the_coded_body() {
        let v = Verdict {
            limit: 1,
            remaining: 0,
            reset: Duration::from_millis(1500),
            allowed: false,
        };
        assert_eq!(
            refusal_body(Class::Exec, &v),
            serde_json::json!({"error": "rate_limited",
                "message": "Too many CodeAPI execution requests. Please retry in 2 seconds.",
                "retry_after_seconds": 2})
        );
        assert_eq!(
            refusal_body(Class::Upload, &v),
            serde_json::json!({"error": "Too many file uploads. Please retry in 2 seconds."})
        );
    }
}
