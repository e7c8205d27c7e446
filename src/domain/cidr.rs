//! IPv4/IPv6 networks written as CIDR (`203.0.113.0/24`, `2001:db8::/32`, or a bare address).

use std::net::IpAddr;
use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub(crate) fn prefix(&self) -> u8 {
        self.prefix
    }

    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        match (self.network, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = mask_u32(self.prefix);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = mask_u128(self.prefix);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

fn mask_u32(prefix: u8) -> u32 {
    if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix as u32)
    }
}

fn mask_u128(prefix: u8) -> u128 {
    if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - prefix as u32)
    }
}

impl FromStr for Cidr {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let (addr, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let network: IpAddr = addr
            .parse()
            .map_err(|_| format!("{text:?} is not an IP network (e.g. 203.0.113.0/24)"))?;
        let network = network.to_canonical();
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{text:?} has a prefix length outside 0..={max}"))?,
        };
        Ok(Cidr { network, prefix })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_network_contains_its_addresses_only() {
        let net: Cidr = "203.0.113.0/24".parse().unwrap();
        assert!(net.contains("203.0.113.77".parse().unwrap()));
        assert!(!net.contains("203.0.114.1".parse().unwrap()));
        assert!(net.contains("::ffff:203.0.113.5".parse().unwrap()));
    }

    #[test]
    fn a_bare_address_is_a_host_network() {
        let net: Cidr = "127.0.0.1".parse().unwrap();
        assert_eq!(net.prefix(), 32);
        assert!(net.contains("127.0.0.1".parse().unwrap()));
        assert!(!net.contains("127.0.0.2".parse().unwrap()));
    }

    #[test]
    fn malformed_networks_are_refused() {
        for bad in ["10.0.0.0/33", "nonsense", "10.0.0/8", "::/129"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }
}
