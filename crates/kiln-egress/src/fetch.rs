//! Kiln's own server-side transfers to and from URLs a client names (seed
//! 004's file import and export): the same SSRF guard as the services
//! gateway, for one GET or PUT.
//!
//! - Only `http` and `https` URLs, without credentials in them.
//! - Addresses: a host name is resolved once per connection by
//!   [`GuardedResolver`] and every address is checked before the connection
//!   goes to exactly those addresses (no second lookup for a rebinding DNS
//!   server to race); an IP literal is checked before the request. Loopback
//!   and private ranges are refused unless the operator allows them;
//!   link-local (cloud metadata), multicast and broadcast never.
//! - Redirects are never followed: a 3xx answer is an error.
//! - A download larger than the cap is cut off as soon as it passes it
//!   (a `Content-Length` above it is refused before the body is read).
//! - Proxy variables in Kiln's environment are ignored.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;

use crate::addr::{self, GuardedResolver};

/// What a [`Fetcher`] allows.
#[derive(Debug, Clone)]
pub struct FetchPolicy {
    /// Loopback and private addresses are allowed (link-local never).
    pub allow_private: bool,
    /// Largest body downloaded, bytes.
    pub max_bytes: u64,
    /// Whole-transfer timeout.
    pub timeout: Duration,
}

impl Default for FetchPolicy {
    fn default() -> Self {
        FetchPolicy {
            allow_private: false,
            max_bytes: 25 * 1024 * 1024,
            timeout: Duration::from_secs(60),
        }
    }
}

/// Why a transfer failed; every message is safe to show to the client
/// that named the URL.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("not an acceptable URL: {0}")]
    BadUrl(String),
    #[error("the URL's address is refused: {0}")]
    Refused(String),
    #[error("the server answered a redirect ({0}); redirects are not followed")]
    Redirect(u16),
    #[error("the server answered {0}")]
    Status(u16),
    #[error("the file is larger than {0} bytes")]
    TooLarge(u64),
    #[error("the transfer timed out")]
    Timeout,
    #[error("the transfer failed: {0}")]
    Network(String),
}

/// One HTTP client under one [`FetchPolicy`]. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Fetcher {
    client: reqwest::Client,
    policy: Arc<FetchPolicy>,
}

impl Fetcher {
    pub fn new(policy: FetchPolicy) -> Result<Fetcher, FetchError> {
        crate::install_crypto_provider();
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .dns_resolver(Arc::new(GuardedResolver {
                allow_private: policy.allow_private,
            }))
            .connect_timeout(Duration::from_secs(10).min(policy.timeout))
            .timeout(policy.timeout)
            .user_agent(concat!("kiln/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| FetchError::Network(format!("HTTP client: {e}")))?;
        Ok(Fetcher {
            client,
            policy: Arc::new(policy),
        })
    }

    pub fn policy(&self) -> &FetchPolicy {
        &self.policy
    }

    /// The URL, if it may be fetched at all (scheme, credentials, an IP
    /// literal's range; host names are checked when they are resolved).
    fn check_url(&self, raw: &str) -> Result<reqwest::Url, FetchError> {
        let url = reqwest::Url::parse(raw).map_err(|e| FetchError::BadUrl(e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(FetchError::BadUrl(format!(
                "scheme {:?}: only http and https",
                url.scheme()
            )));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(FetchError::BadUrl("credentials in the URL".to_owned()));
        }
        let ip = match url.host() {
            Some(url::Host::Ipv4(v4)) => Some(IpAddr::V4(v4)),
            Some(url::Host::Ipv6(v6)) => Some(IpAddr::V6(v6)),
            Some(url::Host::Domain(_)) => None,
            None => return Err(FetchError::BadUrl("no host".to_owned())),
        };
        if let Some(ip) = ip {
            addr::check(ip, self.policy.allow_private)
                .map_err(|why| FetchError::Refused(without_hint(&why)))?;
        }
        Ok(url)
    }

    /// GETs `url` and returns its body (at most `max_bytes`).
    pub async fn download(&self, url: &str) -> Result<Bytes, FetchError> {
        let url = self.check_url(url)?;
        let resp = self.client.get(url).send().await.map_err(transfer_error)?;
        answered(&resp)?;
        let max = self.policy.max_bytes;
        if resp.content_length().is_some_and(|n| n > max) {
            return Err(FetchError::TooLarge(max));
        }
        let mut body = BytesMut::new();
        let mut stream = resp.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(transfer_error)?;
            if body.len() as u64 + chunk.len() as u64 > max {
                return Err(FetchError::TooLarge(max));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body.freeze())
    }

    /// PUTs `body` to `url` (a presigned upload URL).
    pub async fn upload(&self, url: &str, body: Bytes) -> Result<(), FetchError> {
        let url = self.check_url(url)?;
        let resp = self
            .client
            .put(url)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(body)
            .send()
            .await
            .map_err(transfer_error)?;
        answered(&resp)
    }
}

/// A 2xx answer, or why not.
fn answered(resp: &reqwest::Response) -> Result<(), FetchError> {
    let status = resp.status();
    if status.is_redirection() {
        return Err(FetchError::Redirect(status.as_u16()));
    }
    if !status.is_success() {
        return Err(FetchError::Status(status.as_u16()));
    }
    Ok(())
}

/// The guard's refusal without the services gateway's setting name.
fn without_hint(why: &str) -> String {
    why.split(" (the service").next().unwrap_or(why).to_owned()
}

fn transfer_error(e: reqwest::Error) -> FetchError {
    let mut chain = String::new();
    let mut src: Option<&dyn std::error::Error> = Some(&e);
    while let Some(s) = src {
        chain.push_str(&s.to_string());
        chain.push_str(": ");
        src = s.source();
    }
    if let Some(i) = chain.find(addr::BLOCKED_MARKER) {
        let why = &chain[i + addr::BLOCKED_MARKER.len()..];
        return FetchError::Refused(without_hint(why.split(": ").next().unwrap_or(why)));
    }
    if e.is_timeout() {
        return FetchError::Timeout;
    }
    if e.is_connect() {
        return FetchError::Network("could not connect".to_owned());
    }
    FetchError::Network(e.without_url().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fetcher(allow_private: bool) -> Fetcher {
        Fetcher::new(FetchPolicy {
            allow_private,
            max_bytes: 16,
            timeout: Duration::from_secs(5),
        })
        .expect("fetcher")
    }

    #[tokio::test]
    async fn urls_other_than_plain_http_are_refused_before_any_connection() {
        let f = fetcher(true);
        for url in [
            "file:///etc/passwd",
            "ftp://example.com/x",
            "http://user:pw@example.com/x",
            "not a url",
        ] {
            let e = f.download(url).await.expect_err(url);
            assert!(matches!(e, FetchError::BadUrl(_)), "{url}: {e}");
        }
    }

    #[tokio::test]
    async fn loopback_needs_the_operator_flag_and_metadata_never_passes() {
        let e = fetcher(false)
            .download("http://127.0.0.1:9/x")
            .await
            .expect_err("loopback");
        assert!(matches!(e, FetchError::Refused(_)), "{e}");
        let e = fetcher(false)
            .download("http://localhost:9/x")
            .await
            .expect_err("a name resolving to loopback");
        assert!(matches!(e, FetchError::Refused(_)), "{e}");
        let e = fetcher(true)
            .download("http://169.254.169.254/latest/meta-data/")
            .await
            .expect_err("metadata");
        assert!(matches!(e, FetchError::Refused(_)), "{e}");
    }
}
