//! Which `Host` and `Origin` values the server takes as its own (the
//! browser guard that applies it is [`crate::origin`]).

use std::net::SocketAddr;

/// Which `Host` and `Origin` values the server takes as its own.
#[derive(Debug, Clone, Default)]
pub struct HostPolicy {
    /// The address the server listens on.
    pub listen: Option<SocketAddr>,
    /// Further names the server is reached under (`kiln`, a Service's DNS
    /// name, a reverse proxy's name), lower case, each with or without a
    /// port (without: any port).
    pub allowed_hosts: Vec<String>,
}
