//! Who the client is: the TCP peer, unless the peer is a trusted proxy, in which case the
//! rightmost `X-Forwarded-For` address that is not itself a trusted proxy. Never a header
//! from an untrusted peer, or any client could pick its own rate-limit bucket.

use std::net::{IpAddr, Ipv6Addr};

use crate::domain::cidr::Cidr;

pub(crate) fn client_ip(peer: IpAddr, forwarded_for: &[&str], trusted: &[Cidr]) -> IpAddr {
    let peer = peer.to_canonical();
    let is_trusted = |ip: IpAddr| trusted.iter().any(|c| c.contains(ip));
    if !is_trusted(peer) {
        return peer;
    }
    let hops: Vec<&str> = forwarded_for
        .iter()
        .flat_map(|header| header.split(','))
        .map(str::trim)
        .filter(|hop| !hop.is_empty())
        .collect();
    let mut client = peer;
    for hop in hops.iter().rev() {
        match hop.parse::<IpAddr>() {
            Ok(ip) => {
                client = ip.to_canonical();
                if !is_trusted(client) {
                    break;
                }
            }
            // A hop we cannot read ends what we can believe: the last proxy that wrote it.
            Err(_) => break,
        }
    }
    client
}

/// The rate-limit bucket of an address: IPv4 as is, IPv6 by its /64 (one customer's
/// allocation, so rotating the interface id buys nothing).
pub(crate) fn bucket_of(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let masked = u128::from(v6) & (u128::MAX << 64);
            IpAddr::V6(Ipv6Addr::from(masked))
        }
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn trusted() -> Vec<Cidr> {
        vec!["10.0.0.0/8".parse().unwrap()]
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_forwards() {
        assert_eq!(
            client_ip(ip("198.51.100.4"), &["1.2.3.4"], &trusted()),
            ip("198.51.100.4")
        );
    }

    #[test]
    fn a_trusted_proxy_forwards_the_rightmost_untrusted_hop() {
        let got = client_ip(
            ip("10.0.0.2"),
            &["6.6.6.6, 203.0.113.9, 10.0.0.7"],
            &trusted(),
        );
        assert_eq!(got, ip("203.0.113.9"));
    }

    #[test]
    fn a_trusted_proxy_without_the_header_is_the_client() {
        assert_eq!(client_ip(ip("10.0.0.2"), &[], &trusted()), ip("10.0.0.2"));
    }

    #[test]
    fn ipv6_clients_share_a_bucket_per_64() {
        assert_eq!(
            bucket_of(ip("2001:db8:1:2::1")),
            bucket_of(ip("2001:db8:1:2:ffff::9"))
        );
        assert_ne!(
            bucket_of(ip("2001:db8:1:2::1")),
            bucket_of(ip("2001:db8:1:3::1"))
        );
        assert_eq!(bucket_of(ip("::ffff:192.0.2.1")), ip("192.0.2.1"));
    }
}
