//! What the operator writes: one [`ServiceConfig`] per service (a TOML
//! table `[services.<name>]` in Kiln's configuration) and the gateway-wide
//! [`EgressSettings`].
//!
//! Seed 002's entry works as written:
//!
//! ```toml
//! [services.deepl]
//! upstream = "https://api.deepl.com"
//! allowed_methods = ["POST", "GET"]
//! allowed_paths = ["/v2/document", "/v2/document/*"]
//! inject_header = { Authorization = "DeepL-Auth-Key ${DEEPL_API_KEY}" }
//! max_body_bytes = 31457280
//! rate = "60/min"
//! ```
//!
//! `${VAR}` in `inject_header` and `inject_query` values is replaced by the
//! variable from Kiln's environment when the registry is built; a variable
//! that is unset or empty refuses the start.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// One service as configured.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceConfig {
    /// Base URL of the upstream (`https://api.deepl.com`); a path in it is
    /// prefixed to every forwarded path. `http` only for upstreams on private
    /// addresses (`allow_private_upstream`): the injected secret must not
    /// cross a public network in clear text.
    pub upstream: String,
    /// Shown to sandboxed code in the service listing (`GET $KILN_SERVICES_URL/`):
    /// tell the model what the service does and how to call it.
    #[serde(default)]
    pub description: String,
    /// HTTP methods the jail may use.
    #[serde(default = "default_methods")]
    pub allowed_methods: Vec<String>,
    /// Paths the jail may call (see `path.rs` for `*`).
    pub allowed_paths: Vec<String>,
    /// Headers added to every upstream request (`${VAR}` expanded); a header
    /// of the same name from the jail is dropped.
    #[serde(default)]
    pub inject_header: BTreeMap<String, String>,
    /// Query parameters added to every upstream request (`${VAR}`
    /// expanded); a parameter of the same name from the jail is dropped.
    #[serde(default)]
    pub inject_query: BTreeMap<String, String>,
    /// Largest request body from the jail, bytes.
    #[serde(default = "default_body")]
    pub max_body_bytes: u64,
    /// Largest response body from the upstream, bytes.
    #[serde(default = "default_response")]
    pub max_response_bytes: u64,
    /// Calls per period for the whole service (`"60/min"`); none: unlimited.
    #[serde(default)]
    pub rate: Option<String>,
    /// Calls per period for each user of the service; none: unlimited.
    #[serde(default)]
    pub user_rate: Option<String>,
    /// One call, from connecting to the last response byte, seconds.
    #[serde(default = "default_timeout")]
    pub timeout_secs: u64,
    /// Users (their `user_id`) who may use the service; with `tenants`
    /// also empty, every caller may.
    #[serde(default)]
    pub users: Vec<String>,
    /// Tenants whose users may use the service.
    #[serde(default)]
    pub tenants: Vec<String>,
    /// The upstream may be on a loopback or private address (an adapter
    /// next to Kiln, a test double). Link-local and metadata addresses stay
    /// refused.
    #[serde(default)]
    pub allow_private_upstream: bool,
    /// Request headers passed on from the jail besides the standard ones
    /// (`accept`, `content-type`, ...).
    #[serde(default)]
    pub forward_headers: Vec<String>,
    /// Response headers passed back besides the standard ones
    /// (`content-type`, `content-disposition`, ...).
    #[serde(default)]
    pub response_headers: Vec<String>,
    /// Pass the jail's `Range` and `If-Range` on. Off by default: an
    /// upstream that reflects the injected credential would hand it out in
    /// slices too short for the scrubber to recognise (`docs/egress.md`).
    #[serde(default)]
    pub allow_range: bool,
    /// Calls one grant (one run) may make to this service.
    #[serde(default = "default_grant_requests")]
    pub max_requests_per_grant: u32,
}

fn default_methods() -> Vec<String> {
    vec!["GET".to_owned()]
}
fn default_body() -> u64 {
    10 * 1024 * 1024
}
fn default_response() -> u64 {
    64 * 1024 * 1024
}
fn default_timeout() -> u64 {
    60
}
fn default_grant_requests() -> u32 {
    100
}

impl std::fmt::Debug for ServiceConfig {
    /// Injected values may be literal secrets: never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redacted = |m: &BTreeMap<String, String>| -> Vec<String> {
            m.keys().map(|k| format!("{k}=<redacted>")).collect()
        };
        f.debug_struct("ServiceConfig")
            .field("upstream", &self.upstream)
            .field("allowed_methods", &self.allowed_methods)
            .field("allowed_paths", &self.allowed_paths)
            .field("inject_header", &redacted(&self.inject_header))
            .field("inject_query", &redacted(&self.inject_query))
            .field("max_body_bytes", &self.max_body_bytes)
            .field("max_response_bytes", &self.max_response_bytes)
            .field("rate", &self.rate)
            .field("user_rate", &self.user_rate)
            .field("timeout_secs", &self.timeout_secs)
            .field("users", &self.users)
            .field("tenants", &self.tenants)
            .field("allow_private_upstream", &self.allow_private_upstream)
            .field("allow_range", &self.allow_range)
            .finish_non_exhaustive()
    }
}

/// Gateway-wide settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressSettings {
    /// Upstream calls in flight at once, over all runs; more wait up to
    /// `queue_timeout`, then get 503.
    pub max_concurrent_calls: usize,
    /// Upstream calls in flight at once for one grant.
    pub max_concurrent_per_grant: usize,
    /// How long a call waits for a free upstream slot.
    pub queue_timeout: Duration,
    /// Connections from one jail served at once (more wait in the backlog).
    pub connections_per_channel: usize,
    /// Time a jail's client has to send a request's headers.
    pub header_timeout: Duration,
    /// Kept after a grant's owner's lifetime ends before a call is refused
    /// as expired (only a backstop: the owner revokes it when it ends).
    pub grace: Duration,
}

impl Default for EgressSettings {
    fn default() -> Self {
        EgressSettings {
            max_concurrent_calls: 8,
            max_concurrent_per_grant: 4,
            queue_timeout: Duration::from_secs(10),
            connections_per_channel: 16,
            header_timeout: Duration::from_secs(10),
            grace: Duration::from_secs(10),
        }
    }
}

/// Replaces every `${NAME}` in `template` with `lookup(NAME)`. Returns the
/// expanded text and the values substituted (the secrets).
pub fn expand(
    template: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<(String, Vec<String>), String> {
    let mut out = String::with_capacity(template.len());
    let mut values = Vec::new();
    let mut rest = template;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let Some(end) = after.find('}') else {
            return Err(format!(
                "unterminated ${{ in {:?}",
                redact_template(template)
            ));
        };
        let name = &after[..end];
        let valid = !name.is_empty()
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !name.starts_with(|c: char| c.is_ascii_digit());
        if !valid {
            return Err(format!("${{{name}}} is not a variable name"));
        }
        match lookup(name) {
            Some(v) if !v.is_empty() => {
                out.push_str(&v);
                values.push(v);
            }
            Some(_) => return Err(format!("${{{name}}} is empty in Kiln's environment")),
            None => return Err(format!("${{{name}}} is not set in Kiln's environment")),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok((out, values))
}

/// A template with its literal parts shown and nothing else (for errors).
fn redact_template(t: &str) -> String {
    match t.find("${") {
        Some(i) => format!("{}${{...", &t[..i]),
        None => "<literal>".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "DEEPL_API_KEY" => Some("secret-key-123:fx".to_owned()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn variables_expand_from_the_environment() {
        let (v, secrets) = expand("DeepL-Auth-Key ${DEEPL_API_KEY}", &env).expect("expand");
        assert_eq!(v, "DeepL-Auth-Key secret-key-123:fx");
        assert_eq!(secrets, vec!["secret-key-123:fx".to_owned()]);
        let (v, secrets) = expand("no variables $HOME {x}", &env).expect("expand");
        assert_eq!(v, "no variables $HOME {x}");
        assert!(secrets.is_empty());
    }

    #[test]
    fn missing_empty_or_malformed_variables_are_errors_that_name_them() {
        let e = expand("Bearer ${NOPE}", &env).expect_err("unset");
        assert!(e.contains("NOPE") && e.contains("not set"), "{e}");
        let e = expand("Bearer ${EMPTY}", &env).expect_err("empty");
        assert!(e.contains("empty"), "{e}");
        assert!(expand("Bearer ${DEEPL_API_KEY", &env).is_err());
        assert!(expand("Bearer ${1X}", &env).is_err());
        assert!(expand("Bearer ${A-B}", &env).is_err());
    }

    #[test]
    fn debug_output_never_shows_injected_values() {
        let c = ServiceConfig {
            upstream: "https://api.example.com".into(),
            description: String::new(),
            allowed_methods: default_methods(),
            allowed_paths: vec!["/v1".into()],
            inject_header: [(
                "Authorization".to_owned(),
                "Bearer literal-secret".to_owned(),
            )]
            .into(),
            inject_query: [("key".to_owned(), "other-secret".to_owned())].into(),
            max_body_bytes: 1,
            max_response_bytes: 1,
            rate: None,
            user_rate: None,
            timeout_secs: 1,
            users: vec![],
            tenants: vec![],
            allow_private_upstream: false,
            forward_headers: vec![],
            response_headers: vec![],
            allow_range: false,
            max_requests_per_grant: 1,
        };
        let shown = format!("{c:?}");
        assert!(!shown.contains("literal-secret") && !shown.contains("other-secret"));
        assert!(shown.contains("Authorization=<redacted>"), "{shown}");
    }
}
