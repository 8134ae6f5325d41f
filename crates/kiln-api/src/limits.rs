//! The rate limits' data: each class's rule, the limiters' state, what a
//! limiter says about one request and how an answer carries it. The
//! layer that counts requests and the checks faces ask are in
//! [`crate::rate`]; this module imports no other of the HTTP layer but the
//! route classes, so the configuration and the errors can name it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderName, HeaderValue};

pub use crate::kit::routes::Class;

impl Class {
    /// The 429 sentence of §4 (exec's is in the coded body).
    pub(crate) fn sentence(self, secs: u64) -> String {
        let what = match self {
            Class::Exec => "CodeAPI execution requests",
            Class::Upload => "file uploads",
            Class::Download => "file downloads",
            Class::Fetch => "file list requests",
            Class::Delete => "file delete requests",
            Class::Cancel => "cancellation requests",
        };
        format!("Too many {what}. Please retry in {secs} seconds.")
    }
}

/// `max` requests per `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub max: u32,
    pub window: Duration,
}

impl Rule {
    pub const fn new(max: u32, secs: u64) -> Rule {
        Rule {
            max,
            window: Duration::from_secs(secs),
        }
    }
}

/// The limit of each class; `None` turns a class's limit off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateRules {
    pub exec: Option<Rule>,
    pub upload: Option<Rule>,
    pub download: Option<Rule>,
    pub fetch: Option<Rule>,
    pub delete: Option<Rule>,
    pub cancel: Option<Rule>,
}

/// What a limiter said about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub limit: u32,
    /// Requests still allowed at once.
    pub remaining: u32,
    /// Until the bucket is full again (allowed) or until the next request
    /// is (refused).
    pub reset: Duration,
    pub allowed: bool,
}

/// Keys kept before idle ones (their bucket full again) are forgotten.
pub(crate) const PRUNE_ABOVE: usize = 4096;

/// One class's GCRA: per key, the theoretical arrival time of the next
/// request.
#[derive(Debug)]
pub(crate) struct Gcra {
    pub(crate) rule: Rule,
    pub(crate) tat: Mutex<HashMap<String, Instant>>,
}

/// Every class's limiter.
#[derive(Debug)]
pub struct RateLimits {
    pub(crate) limiters: HashMap<Class, Gcra>,
    /// Where the nodes count together; `None`: in this process.
    pub(crate) shared: Option<kiln_store::Store>,
}

/// Whole seconds to wait, at least one.
pub fn retry_seconds(d: std::time::Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0).max(u64::from(d.is_zero()))
}

/// Whole seconds for a header or body, at least one.
fn secs(d: Duration) -> u64 {
    retry_seconds(d)
}

/// Stamps the draft-6 headers of `v` (and `Retry-After` on a refusal).
pub fn stamp(headers: &mut HeaderMap, v: &Verdict) {
    let set = |h: &mut HeaderMap, name: &'static str, n: u64| {
        h.insert(HeaderName::from_static(name), HeaderValue::from(n));
    };
    set(headers, "ratelimit-limit", u64::from(v.limit));
    set(headers, "ratelimit-remaining", u64::from(v.remaining));
    set(headers, "ratelimit-reset", secs(v.reset));
    if !v.allowed {
        set(headers, "retry-after", secs(v.reset));
    }
}

/// The status and body of a refusal of `class`.
pub fn refusal_body(class: Class, v: &Verdict) -> serde_json::Value {
    let n = secs(v.reset);
    match class {
        Class::Exec => serde_json::json!({
            "error": "rate_limited",
            "message": class.sentence(n),
            "retry_after_seconds": n,
        }),
        _ => serde_json::json!({ "error": class.sentence(n) }),
    }
}
