//! The server's faces: where it listens (`listen`), seed 003's runtime API
//! prefix and how runtime sessions are kept.

use std::net::SocketAddr;

use anyhow::{Context, bail};

use super::Config;

impl Config {
    /// `listen` as an address: `ip:port`, or `name:port` with the name
    /// resolved (its first address; `localhost` is `127.0.0.1`).
    pub fn listen_addr(&self) -> anyhow::Result<SocketAddr> {
        let listen = self.listen.trim();
        if let Ok(addr) = listen.parse() {
            return Ok(addr);
        }
        let Some((host, port)) = listen.rsplit_once(':') else {
            bail!(
                "listen address {:?} has no port: use host:port, e.g. 127.0.0.1:8000 or 0.0.0.0:8000",
                self.listen
            );
        };
        let Ok(port) = port.parse::<u16>() else {
            bail!(
                "listen address {:?}: {port:?} is not a port number (use host:port, e.g. 127.0.0.1:8000)",
                self.listen
            );
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let addrs: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
            .map(Iterator::collect)
            .unwrap_or_default();
        // IPv4 first: `localhost` resolves to ::1 and 127.0.0.1, and clients
        // configured with 127.0.0.1 are the common case
        addrs
            .iter()
            .find(|a| a.is_ipv4())
            .or(addrs.first())
            .copied()
            .with_context(|| {
                format!(
                    "listen address {:?}: the host name {host:?} does not resolve; use an IP address, \
                     e.g. 127.0.0.1:{port} (this host only) or 0.0.0.0:{port} (every interface)",
                    self.listen
                )
            })
    }

    /// `runtime_api_prefix`, `None` when empty (seed 003's face off).
    pub fn runtime_api_prefix(&self) -> Option<String> {
        let p = self.runtime_api_prefix.trim();
        (!p.is_empty()).then(|| p.to_owned())
    }

    /// `runtime_session_mode`, parsed.
    pub fn runtime_session_mode(&self) -> anyhow::Result<kiln_api::RuntimeSessionMode> {
        kiln_api::RuntimeSessionMode::parse(&self.runtime_session_mode).with_context(|| {
            format!(
                "runtime_session_mode must be stateless, affinity or strict, not {:?}",
                self.runtime_session_mode
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_session_mode_is_affinity_unless_set_to_a_known_mode() {
        let c = Config::default();
        assert_eq!(
            c.runtime_session_mode().unwrap(),
            kiln_api::RuntimeSessionMode::Affinity
        );
        let c = Config {
            runtime_session_mode: "Strict".into(),
            ..Config::default()
        };
        assert_eq!(
            c.runtime_session_mode().unwrap(),
            kiln_api::RuntimeSessionMode::Strict
        );
        let c = Config {
            runtime_session_mode: "sticky".into(),
            ..Config::default()
        };
        assert!(c.validate().is_err());
    }
}
