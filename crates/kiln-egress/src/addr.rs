//! The SSRF guard: which upstream addresses a service may connect to, and
//! the DNS resolver that enforces it on every connection.
//!
//! An upstream's host name is resolved by the gateway for each new
//! connection; every resolved address is checked, and if any one is
//! refused the whole lookup is (a name that mixes public and private
//! addresses is a misconfiguration or a rebinding attack). The connection
//! then goes only to the checked addresses: there is no second lookup to
//! race. IP-literal upstreams are checked the same way before each call.
//!
//! Refused unless the service sets `allow_private_upstream`: loopback,
//! private (RFC 1918, unique local), shared (CGNAT), unspecified, benchmark,
//! documentation and reserved ranges, and the IPv4 inside IPv4-mapped,
//! NAT64 and 6to4 IPv6 addresses. Refused always: link-local (where cloud
//! metadata services live: 169.254.169.254, fd00:ec2::254 is checked too),
//! multicast and broadcast.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// Why an address is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Private, loopback, ...: allowed only with `allow_private_upstream`.
    Private(&'static str),
    /// Never allowed (metadata, link-local, multicast).
    Never(&'static str),
}

impl Refusal {
    pub fn describe(&self) -> &'static str {
        match self {
            Refusal::Private(w) | Refusal::Never(w) => w,
        }
    }
}

/// Known cloud metadata addresses outside link-local ranges.
const METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);
const METADATA_V4_ALIBABA: Ipv4Addr = Ipv4Addr::new(100, 100, 100, 200);

fn classify_v4(ip: Ipv4Addr) -> Option<Refusal> {
    let o = ip.octets();
    if ip == METADATA_V4_ALIBABA {
        return Some(Refusal::Never("a cloud metadata address"));
    }
    if ip.is_link_local() {
        return Some(Refusal::Never(
            "a link-local address (cloud metadata services live there)",
        ));
    }
    if ip.is_multicast() || ip.is_broadcast() {
        return Some(Refusal::Never("a multicast or broadcast address"));
    }
    let private = if ip.is_loopback() {
        "a loopback address"
    } else if ip.is_private() {
        "a private address"
    } else if ip.is_unspecified() || o[0] == 0 {
        "an unspecified address"
    } else if o[0] == 100 && (o[1] & 0xc0) == 64 {
        "a shared (carrier-grade NAT) address"
    } else if o[0] == 198 && (o[1] & 0xfe) == 18 {
        "a benchmarking address"
    } else if ip.is_documentation() || (o[0] == 192 && o[1] == 0 && o[2] == 0) || o[0] >= 240 {
        "a reserved address"
    } else {
        return None;
    };
    Some(Refusal::Private(private))
}

fn classify_v6(ip: Ipv6Addr) -> Option<Refusal> {
    if ip == METADATA_V6 {
        return Some(Refusal::Never("a cloud metadata address"));
    }
    if let Some(v4) = ip.to_ipv4_mapped() {
        return classify_v4(v4);
    }
    let s = ip.segments();
    // NAT64 (64:ff9b::/96) and 6to4 (2002::/16) carry an IPv4 address
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
        let v4 = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
        return classify_v4(v4).or(Some(Refusal::Private("a NAT64 address")));
    }
    if s[0] == 0x2002 {
        let v4 = Ipv4Addr::new((s[1] >> 8) as u8, s[1] as u8, (s[2] >> 8) as u8, s[2] as u8);
        return classify_v4(v4).or(Some(Refusal::Private("a 6to4 address")));
    }
    if (s[0] & 0xffc0) == 0xfe80 {
        return Some(Refusal::Never("a link-local address"));
    }
    if ip.is_multicast() {
        return Some(Refusal::Never("a multicast address"));
    }
    let private = if ip.is_loopback() {
        "a loopback address"
    } else if ip.is_unspecified() {
        "an unspecified address"
    } else if (s[0] & 0xfe00) == 0xfc00 {
        "a unique local (private) address"
    } else if (s[0] & 0xffc0) == 0xfec0 {
        "a site-local address"
    } else if s[0] == 0x2001 && s[1] == 0xdb8 {
        "a documentation address"
    } else if s[0] == 0x100 && s[1..4] == [0, 0, 0] {
        "a discard address"
    } else if s[..6] == [0, 0, 0, 0, 0, 0] {
        // IPv4-compatible (deprecated) ::a.b.c.d
        "an IPv4-compatible address"
    } else {
        return None;
    };
    Some(Refusal::Private(private))
}

/// Why `ip` may not be an upstream address, if it may not.
pub fn classify(ip: IpAddr) -> Option<Refusal> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

/// Checks one address under a service's policy.
pub fn check(ip: IpAddr, allow_private: bool) -> Result<(), String> {
    match classify(ip) {
        None => Ok(()),
        Some(Refusal::Private(_)) if allow_private => Ok(()),
        Some(r @ Refusal::Private(_)) => Err(format!(
            "{ip} is {} (the service does not set allow_private_upstream)",
            r.describe()
        )),
        Some(r @ Refusal::Never(_)) => Err(format!("{ip} is {}: never allowed", r.describe())),
    }
}

/// The marker in a refused lookup's error, so the forwarder can tell a
/// blocked upstream from an unreachable one.
pub const BLOCKED_MARKER: &str = "kiln-egress: upstream address refused: ";

/// A DNS resolver that refuses a lookup when any resolved address fails
/// [`check`].
#[derive(Debug, Clone)]
pub struct GuardedResolver {
    pub allow_private: bool,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let allow_private = self.allow_private;
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await
                .map_err(|e| format!("resolve {host}: {e}"))?
                .collect();
            if addrs.is_empty() {
                return Err(format!("resolve {host}: no address").into());
            }
            for a in &addrs {
                check(a.ip(), allow_private)
                    .map_err(|why| format!("{BLOCKED_MARKER}{host} resolves to {why}"))?;
            }
            let addrs: Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn public_addresses_pass() {
        for a in [
            "93.184.216.34",
            "1.1.1.1",
            "2606:4700:4700::1111",
            "2a00:1450:4001::200e",
        ] {
            assert_eq!(check(ip(a), false), Ok(()), "{a}");
        }
    }

    #[test]
    fn private_and_loopback_need_the_operator_flag() {
        for a in [
            "127.0.0.1",
            "127.8.9.1",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "0.0.0.0",
            "198.18.0.1",
            "192.0.2.1",
            "240.0.0.1",
            "::1",
            "::",
            "fd12:3456::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::a00:1",
            "2002:c0a8:101::1",
            "::7f00:1",
        ] {
            assert!(check(ip(a), false).is_err(), "{a} allowed");
            assert_eq!(check(ip(a), true), Ok(()), "{a} refused with the flag");
        }
    }

    #[test]
    fn metadata_link_local_and_multicast_are_never_allowed() {
        for a in [
            "169.254.169.254",
            "169.254.0.1",
            "100.100.100.200",
            "fd00:ec2::254",
            "fe80::1",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "2002:a9fe:a9fe::1",
            "224.0.0.1",
            "255.255.255.255",
            "ff02::1",
        ] {
            let e = check(ip(a), true).expect_err(a);
            assert!(e.contains("never"), "{a}: {e}");
        }
    }

    #[tokio::test]
    async fn the_resolver_refuses_a_name_that_resolves_to_loopback() {
        let r = GuardedResolver {
            allow_private: false,
        };
        let name: Name = "localhost".parse().expect("name");
        let e = match r.resolve(name).await {
            Ok(_) => panic!("localhost resolved through the guard"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(BLOCKED_MARKER), "{e}");
        let allowed = GuardedResolver {
            allow_private: true,
        };
        let name: Name = "localhost".parse().expect("name");
        let addrs: Vec<SocketAddr> = allowed.resolve(name).await.expect("resolve").collect();
        assert!(addrs.iter().all(|a| a.ip().is_loopback()), "{addrs:?}");
    }
}
