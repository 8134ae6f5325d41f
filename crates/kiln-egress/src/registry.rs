//! The operator's services, checked and compiled once at start-up: upstream
//! URL and address policy, methods, path patterns, injected credentials
//! (the secrets), caps, rate limiters, and one HTTP client per service.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue, Method};
use kiln_core::Principal;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::Url;

use crate::addr::{self, GuardedResolver};
use crate::config::{ServiceConfig, expand};
use crate::path::PathPattern;
use crate::rate::{Limiter, Rate};

/// What is percent-encoded in an injected query parameter: everything but
/// RFC 3986's unreserved characters.
const QUERY: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Secrets shorter than this are not scrubbed from responses (too many
/// false matches in binary bodies); the operator is warned.
pub const MIN_SCRUBBED_SECRET: usize = 8;

/// A configuration error, naming the service and the key.
#[derive(Debug, thiserror::Error)]
#[error("services.{service}: {message}")]
pub struct ConfigError {
    pub service: String,
    pub message: String,
}

/// A service, ready to forward to.
pub struct Service {
    pub name: String,
    pub description: String,
    /// Upstream base URL (no query, no fragment).
    pub upstream: Url,
    /// The upstream's host when it is an IP literal (checked on every
    /// call; names are checked by the resolver).
    pub upstream_ip: Option<IpAddr>,
    pub methods: Vec<Method>,
    pub paths: Vec<PathPattern>,
    /// Injected headers (marked sensitive).
    pub inject_headers: Vec<(HeaderName, HeaderValue)>,
    /// Injected query parameters: the name, then name and value
    /// percent-encoded as sent.
    pub inject_query: Vec<(String, String, String)>,
    /// Every `${VAR}` value (and encoded form) and every injected value
    /// without variables: never shown to a jail.
    pub secrets: Vec<Vec<u8>>,
    pub max_request_bytes: u64,
    pub max_response_bytes: u64,
    pub timeout: Duration,
    pub allow_private: bool,
    users: Vec<String>,
    tenants: Vec<String>,
    /// Extra request headers the jail may send.
    pub forward_headers: Vec<HeaderName>,
    /// `Range` and `If-Range` from the jail are passed on.
    pub allow_range: bool,
    /// Extra response headers passed back.
    pub response_headers: Vec<HeaderName>,
    pub max_requests_per_grant: u32,
    /// Whole-service rate limit (key: the service name).
    pub limiter: Option<Limiter>,
    /// Per-user rate limit (key: tenant and user).
    pub user_limiter: Option<Limiter>,
    pub client: reqwest::Client,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("name", &self.name)
            .field("upstream", &self.upstream.as_str())
            .finish_non_exhaustive()
    }
}

impl Service {
    /// Whether `p` may use this service.
    pub fn allows(&self, p: &Principal) -> bool {
        (self.users.is_empty() && self.tenants.is_empty())
            || self.users.contains(&p.user_id)
            || self.tenants.contains(&p.tenant)
    }

    pub fn rate(&self) -> Option<Rate> {
        self.limiter.as_ref().map(Limiter::rate)
    }

    pub fn user_rate(&self) -> Option<Rate> {
        self.user_limiter.as_ref().map(Limiter::rate)
    }
}

/// Every configured service, by name.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    services: BTreeMap<String, Arc<Service>>,
}

/// Names: what a URL segment and a metric label can carry.
fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && n.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}

/// Headers a jail may never set, whatever the configuration says.
const NEVER_FORWARDED: &[&str] = &[
    "host",
    "connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-real-ip",
    // the gateway's own decisions (`forward.rs`): compressed answers could
    // not be scrubbed; ranges only with `allow_range`
    "accept-encoding",
    "range",
    "if-range",
];

/// Response headers never passed back, whatever the configuration says.
const NEVER_RETURNED: &[&str] = &[
    "set-cookie",
    "set-cookie2",
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "location",
    "www-authenticate",
    "authorization",
];

fn header_names(what: &str, names: &[String], never: &[&str]) -> Result<Vec<HeaderName>, String> {
    names
        .iter()
        .map(|n| {
            let h = HeaderName::from_bytes(n.as_bytes())
                .map_err(|_| format!("{what}: {n:?} is not a header name"))?;
            if never.contains(&h.as_str()) {
                return Err(format!("{what}: {n:?} may never be passed on"));
            }
            Ok(h)
        })
        .collect()
}

fn build_client(cfg: &ServiceConfig) -> Result<reqwest::Client, String> {
    // rustls on ring, the host's CA store through the platform verifier; a
    // provider installed earlier (by the embedding program) is fine too
    crate::install_crypto_provider();
    reqwest::Client::builder()
        // redirects are answered to the jail as errors, never followed
        .redirect(reqwest::redirect::Policy::none())
        // proxy variables in Kiln's environment must not reroute calls
        .no_proxy()
        .dns_resolver(Arc::new(GuardedResolver {
            allow_private: cfg.allow_private_upstream,
        }))
        .connect_timeout(Duration::from_secs(cfg.timeout_secs.clamp(1, 10)))
        .pool_idle_timeout(Duration::from_secs(30))
        .user_agent(concat!("kiln-egress/", env!("CARGO_PKG_VERSION")))
        .http1_only()
        .build()
        .map_err(|e| format!("HTTP client: {e}"))
}

fn compile(
    name: &str,
    cfg: &ServiceConfig,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Service, String> {
    let upstream =
        Url::parse(&cfg.upstream).map_err(|e| format!("upstream {:?}: {e}", cfg.upstream))?;
    if upstream.query().is_some() || upstream.fragment().is_some() {
        return Err("upstream must not have a query or fragment".to_owned());
    }
    if !upstream.username().is_empty() || upstream.password().is_some() {
        return Err("upstream must not carry credentials (use inject_header)".to_owned());
    }
    let host = upstream
        .host()
        .ok_or_else(|| "upstream has no host".to_owned())?;
    let upstream_ip = match host {
        url::Host::Ipv4(v4) => Some(IpAddr::V4(v4)),
        url::Host::Ipv6(v6) => Some(IpAddr::V6(v6)),
        url::Host::Domain(_) => None,
    };
    match upstream.scheme() {
        "https" => {}
        "http" if cfg.allow_private_upstream => {}
        "http" => {
            return Err(
                "upstream is plain http: allowed only with allow_private_upstream (an adapter \
                 on a private network); the injected secret would cross the network in clear"
                    .to_owned(),
            );
        }
        other => return Err(format!("upstream scheme {other:?} is not http(s)")),
    }
    if let Some(ip) = upstream_ip {
        addr::check(ip, cfg.allow_private_upstream).map_err(|e| format!("upstream: {e}"))?;
    }
    let methods = cfg
        .allowed_methods
        .iter()
        .map(|m| {
            let method = Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                .map_err(|_| format!("allowed_methods: {m:?} is not a method"))?;
            if matches!(method, Method::CONNECT | Method::TRACE) {
                return Err(format!("allowed_methods: {m} is never allowed"));
            }
            Ok(method)
        })
        .collect::<Result<Vec<_>, String>>()?;
    if cfg.allowed_paths.is_empty() {
        return Err("allowed_paths is empty: the service could not be called".to_owned());
    }
    let paths = cfg
        .allowed_paths
        .iter()
        .map(|p| PathPattern::parse(p))
        .collect::<Result<Vec<_>, _>>()?;
    let mut secrets: Vec<Vec<u8>> = Vec::new();
    // A value built from `${VAR}`s is secret in its variables' values (the
    // template's own text, `DeepL-Auth-Key `, is the operator's, not a
    // secret, and scrubbing its pieces would garble answers that name it);
    // a literal value is secret whole.
    let mut remember = |value: &str, vars: Vec<String>| {
        let whole = vars.is_empty().then(|| value.to_owned());
        for s in vars.into_iter().chain(whole) {
            if !s.is_empty() && !secrets.iter().any(|x| x == s.as_bytes()) {
                secrets.push(s.into_bytes());
            }
        }
    };
    let mut inject_headers = Vec::new();
    for (k, template) in &cfg.inject_header {
        let h = HeaderName::from_bytes(k.as_bytes())
            .map_err(|_| format!("inject_header: {k:?} is not a header name"))?;
        if NEVER_FORWARDED.contains(&h.as_str()) {
            return Err(format!("inject_header: {k:?} cannot be injected"));
        }
        let (value, vars) =
            expand(template, lookup).map_err(|e| format!("inject_header.{k}: {e}"))?;
        let mut v = HeaderValue::from_str(&value)
            .map_err(|_| format!("inject_header.{k}: the value is not a valid header value"))?;
        v.set_sensitive(true);
        remember(&value, vars);
        inject_headers.push((h, v));
    }
    let mut inject_query = Vec::new();
    for (k, template) in &cfg.inject_query {
        if k.is_empty() {
            return Err("inject_query: empty parameter name".to_owned());
        }
        let (value, mut vars) =
            expand(template, lookup).map_err(|e| format!("inject_query.{k}: {e}"))?;
        // the upstream sees (and may echo) the encoded form
        let encoded = utf8_percent_encode(&value, QUERY).to_string();
        vars.push(encoded.clone());
        remember(&value, vars);
        inject_query.push((
            k.clone(),
            utf8_percent_encode(k, QUERY).to_string(),
            encoded,
        ));
    }
    if cfg.max_body_bytes == 0 && cfg.allowed_methods.iter().any(|m| m != "GET") {
        return Err("max_body_bytes is 0".to_owned());
    }
    if cfg.max_response_bytes == 0 {
        return Err("max_response_bytes is 0".to_owned());
    }
    if cfg.timeout_secs == 0 {
        return Err("timeout_secs is 0".to_owned());
    }
    if cfg.max_requests_per_grant == 0 {
        return Err("max_requests_per_grant is 0: the service could not be called".to_owned());
    }
    let limiter = cfg
        .rate
        .as_deref()
        .map(Rate::parse)
        .transpose()
        .map_err(|e| format!("rate: {e}"))?
        .map(Limiter::new);
    let user_limiter = cfg
        .user_rate
        .as_deref()
        .map(Rate::parse)
        .transpose()
        .map_err(|e| format!("user_rate: {e}"))?
        .map(Limiter::new);
    let forward_headers = header_names("forward_headers", &cfg.forward_headers, NEVER_FORWARDED)?;
    let response_headers = header_names("response_headers", &cfg.response_headers, NEVER_RETURNED)?;
    let client = build_client(cfg)?;
    Ok(Service {
        name: name.to_owned(),
        description: cfg.description.clone(),
        upstream,
        upstream_ip,
        methods,
        paths,
        inject_headers,
        inject_query,
        secrets,
        max_request_bytes: cfg.max_body_bytes,
        max_response_bytes: cfg.max_response_bytes,
        timeout: Duration::from_secs(cfg.timeout_secs),
        allow_private: cfg.allow_private_upstream,
        users: cfg.users.clone(),
        tenants: cfg.tenants.clone(),
        forward_headers,
        allow_range: cfg.allow_range,
        response_headers,
        max_requests_per_grant: cfg.max_requests_per_grant,
        limiter,
        user_limiter,
        client,
    })
}

impl Registry {
    /// Checks and compiles every service; `lookup` reads Kiln's environment
    /// (`std::env::var`) for `${VAR}`.
    pub fn build(
        services: &BTreeMap<String, ServiceConfig>,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Registry, ConfigError> {
        let mut out = BTreeMap::new();
        for (name, cfg) in services {
            let err = |message: String| ConfigError {
                service: name.clone(),
                message,
            };
            if !valid_name(name) {
                return Err(err(
                    "a service name is 1-64 of a-z, 0-9, - and _, starting with a letter or digit"
                        .to_owned(),
                ));
            }
            let s = compile(name, cfg, lookup).map_err(err)?;
            for secret in &s.secrets {
                if secret.len() < MIN_SCRUBBED_SECRET {
                    tracing::warn!(
                        service = %name,
                        "an injected value is shorter than {MIN_SCRUBBED_SECRET} bytes: it is not scrubbed from responses"
                    );
                }
            }
            out.insert(name.clone(), Arc::new(s));
        }
        Ok(Registry { services: out })
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Service>> {
        self.services.get(name)
    }

    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
    }

    pub fn len(&self) -> usize {
        self.services.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Service>> {
        self.services.values()
    }

    /// The services `p` may use, by name.
    pub fn allowed_for(&self, p: &Principal) -> Vec<Arc<Service>> {
        self.services
            .values()
            .filter(|s| s.allows(p))
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed() -> ServiceConfig {
        ServiceConfig {
            upstream: "https://api.deepl.com".into(),
            description: "DeepL".into(),
            allowed_methods: vec!["POST".into(), "GET".into()],
            allowed_paths: vec!["/v2/document".into(), "/v2/document/*".into()],
            inject_header: [(
                "Authorization".to_owned(),
                "DeepL-Auth-Key ${DEEPL_API_KEY}".to_owned(),
            )]
            .into(),
            inject_query: BTreeMap::new(),
            max_body_bytes: 31_457_280,
            max_response_bytes: 64 << 20,
            rate: Some("60/min".into()),
            user_rate: None,
            timeout_secs: 60,
            users: vec![],
            tenants: vec![],
            allow_private_upstream: false,
            forward_headers: vec![],
            response_headers: vec![],
            allow_range: false,
            max_requests_per_grant: 100,
        }
    }

    fn env(n: &str) -> Option<String> {
        (n == "DEEPL_API_KEY").then(|| "0123456789abcdef:fx".to_owned())
    }

    fn build(name: &str, cfg: ServiceConfig) -> Result<Registry, ConfigError> {
        Registry::build(&[(name.to_owned(), cfg)].into(), &env)
    }

    #[test]
    fn the_seed_entry_compiles_with_its_secret_known() {
        let r = build("deepl", seed()).expect("build");
        let s = r.get("deepl").expect("deepl");
        assert_eq!(s.methods, vec![Method::POST, Method::GET]);
        assert_eq!(s.inject_headers[0].0, "authorization");
        assert!(s.inject_headers[0].1.is_sensitive());
        assert_eq!(s.secrets, vec![b"0123456789abcdef:fx".to_vec()]);
        assert_eq!(s.rate().map(|r| r.to_string()), Some("60/min".to_owned()));
    }

    #[test]
    fn an_unset_variable_refuses_the_start_naming_service_and_key() {
        let e =
            Registry::build(&[("deepl".to_owned(), seed())].into(), &|_| None).expect_err("unset");
        let m = e.to_string();
        assert!(
            m.contains("services.deepl") && m.contains("DEEPL_API_KEY"),
            "{m}"
        );
    }

    #[test]
    fn unsafe_upstreams_are_refused() {
        let mut c = seed();
        c.upstream = "http://api.deepl.com".into();
        assert!(build("deepl", c).is_err(), "plain http to a public host");
        let mut c = seed();
        c.upstream = "http://127.0.0.1:9000".into();
        assert!(
            build("deepl", c.clone()).is_err(),
            "loopback without the flag"
        );
        c.allow_private_upstream = true;
        assert!(build("deepl", c).is_ok(), "loopback with the flag");
        let mut c = seed();
        c.upstream = "http://169.254.169.254".into();
        c.allow_private_upstream = true;
        assert!(build("deepl", c).is_err(), "metadata even with the flag");
        let mut c = seed();
        c.upstream = "https://user:pw@api.deepl.com".into();
        assert!(build("deepl", c).is_err());
        let mut c = seed();
        c.upstream = "ftp://api.deepl.com".into();
        assert!(build("deepl", c).is_err());
    }

    #[test]
    fn bad_names_methods_paths_and_headers_are_refused() {
        assert!(build("DeepL", seed()).is_err());
        assert!(build("deep/l", seed()).is_err());
        let mut c = seed();
        c.allowed_methods = vec!["CONNECT".into()];
        assert!(build("deepl", c).is_err());
        let mut c = seed();
        c.allowed_paths = vec!["/v2/../x".into()];
        assert!(build("deepl", c).is_err());
        let mut c = seed();
        c.allowed_paths = vec![];
        assert!(build("deepl", c).is_err());
        let mut c = seed();
        c.inject_header = [("Host".to_owned(), "evil".to_owned())].into();
        assert!(build("deepl", c).is_err());
        let mut c = seed();
        c.response_headers = vec!["set-cookie".into()];
        assert!(build("deepl", c).is_err());
        let mut c = seed();
        c.rate = Some("lots".into());
        assert!(build("deepl", c).is_err());
    }

    #[test]
    fn access_is_everyone_or_the_listed_users_and_tenants() {
        let p = |t: &str, u: &str| Principal {
            tenant: t.into(),
            user_id: u.into(),
        };
        let r = build("deepl", seed()).expect("build");
        assert_eq!(r.allowed_for(&p("default", "anyone")).len(), 1);
        let mut c = seed();
        c.users = vec!["alice".into()];
        c.tenants = vec!["legal".into()];
        let r = build("deepl", c).expect("build");
        assert_eq!(r.allowed_for(&p("default", "alice")).len(), 1);
        assert_eq!(r.allowed_for(&p("legal", "bob")).len(), 1);
        assert!(r.allowed_for(&p("default", "bob")).is_empty());
    }
}
