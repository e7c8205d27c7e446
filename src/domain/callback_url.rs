//! The partner's callbackUrl, judged on the URL-standard parse (so `2130706433`, `0177.0.0.1`
//! and `0x7f.1` are all seen as 127.0.0.1) before it is stored or its key is looked up.

use std::net::{IpAddr, Ipv4Addr};
use url::{Host, Url};

/// A callbackUrl that passed the judgement: the text the partner sent (what the order keeps
/// and echoes, byte for byte) and its parse. Only `parse` makes one, so an order cannot reach
/// the port with a URL nobody judged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallbackUrl {
    raw: String,
    url: Url,
}

/// Whether loopback, private and internal names are acceptable (`--allow-private-callbacks`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddressPolicy {
    /// Only globally routable addresses and public names (the default).
    PublicOnly,
    /// Any host, for a deployment whose partners sit on its own network.
    AllowPrivate,
}

/// Why a callbackUrl is refused; its text follows `Invalid callbackUrl: ` in the 400 (docs/api.md "Errors")
/// and `callbackUrl no longer acceptable: ` in a delivery given up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallbackRefusal {
    /// Not an absolute URL.
    NotAbsolute(url::ParseError),
    /// A scheme other than http or https.
    Scheme(String),
    /// A user name or password in the URL.
    Credentials,
    /// No host.
    NoHost,
    /// An IPv6 address as the host.
    Ipv6Literal,
    /// An address that is not globally routable (under `PublicOnly`).
    NotGlobal {
        /// The address.
        ip: Ipv4Addr,
        /// The special-purpose range it falls in.
        range: &'static str,
    },
    /// A name that only resolves inside a network (under `PublicOnly`).
    InternalName {
        /// The host name.
        name: String,
        /// The rule that found it internal.
        rule: &'static str,
    },
}

impl std::fmt::Display for CallbackRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallbackRefusal::NotAbsolute(e) => write!(f, "not a valid absolute URL ({e})"),
            CallbackRefusal::Scheme(scheme) => {
                write!(f, "scheme {scheme:?} is not allowed; use http or https")
            }
            CallbackRefusal::Credentials => {
                f.write_str("a user name or password in the URL is not allowed")
            }
            CallbackRefusal::NoHost => f.write_str("the URL has no host"),
            CallbackRefusal::Ipv6Literal => f.write_str("IPv6 literals are not allowed"),
            CallbackRefusal::NotGlobal { ip, range } => {
                write!(f, "address {ip} is not globally routable ({range})")
            }
            CallbackRefusal::InternalName { name, rule } => {
                write!(f, "host {name:?} is an internal name ({rule})")
            }
        }
    }
}

impl CallbackUrl {
    /// Judges a callbackUrl as the partner sent it, under the deployment's address policy.
    pub fn parse(raw: &str, policy: AddressPolicy) -> Result<Self, CallbackRefusal> {
        let url = Url::parse(raw).map_err(CallbackRefusal::NotAbsolute)?;
        if url.scheme() != "http" && url.scheme() != "https" {
            return Err(CallbackRefusal::Scheme(url.scheme().to_string()));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(CallbackRefusal::Credentials);
        }
        let host = match url.host() {
            Some(Host::Domain("")) | None => return Err(CallbackRefusal::NoHost),
            Some(host) => host,
        };
        if policy == AddressPolicy::PublicOnly {
            check_public_host(&host)?;
        }
        Ok(CallbackUrl {
            raw: raw.to_string(),
            url,
        })
    }

    /// The text as the partner sent it.
    pub(crate) fn as_str(&self) -> &str {
        &self.raw
    }

    /// The parsed URL, for the tests of what parsing kept.
    #[cfg(test)]
    pub(crate) fn url(&self) -> &Url {
        &self.url
    }
}

fn check_public_host(host: &Host<&str>) -> Result<(), CallbackRefusal> {
    match host {
        Host::Ipv6(_) => Err(CallbackRefusal::Ipv6Literal),
        Host::Ipv4(ip) => match non_global_range(*ip) {
            Some(range) => Err(CallbackRefusal::NotGlobal { ip: *ip, range }),
            None => Ok(()),
        },
        Host::Domain(name) => match internal_name_rule(name) {
            Some(rule) => Err(CallbackRefusal::InternalName {
                name: name.to_string(),
                rule,
            }),
            None => Ok(()),
        },
    }
}

/// The special-purpose IPv4 ranges a callback may never reach, with their names.
const NON_GLOBAL_V4: &[([u8; 4], u8, &str)] = &[
    ([0, 0, 0, 0], 8, "unspecified/this network"),
    ([10, 0, 0, 0], 8, "private"),
    ([100, 64, 0, 0], 10, "shared address space (CGNAT)"),
    ([127, 0, 0, 0], 8, "loopback"),
    ([169, 254, 0, 0], 16, "link-local"),
    ([172, 16, 0, 0], 12, "private"),
    ([192, 0, 0, 0], 24, "IETF protocol assignments"),
    ([192, 0, 2, 0], 24, "documentation"),
    ([192, 88, 99, 0], 24, "6to4 relay anycast"),
    ([192, 168, 0, 0], 16, "private"),
    ([198, 18, 0, 0], 15, "benchmarking"),
    ([198, 51, 100, 0], 24, "documentation"),
    ([203, 0, 113, 0], 24, "documentation"),
    ([224, 0, 0, 0], 4, "multicast"),
    ([240, 0, 0, 0], 4, "reserved"),
    ([255, 255, 255, 255], 32, "broadcast"),
];

/// The name of the special range `ip` falls in, or `None` for a globally routable address.
/// (`Ipv4Addr::is_global` is unstable, so the table is spelled out.)
pub(crate) fn non_global_range(ip: Ipv4Addr) -> Option<&'static str> {
    let addr = u32::from(ip);
    NON_GLOBAL_V4.iter().find_map(|(net, prefix, name)| {
        let mask = if *prefix == 0 {
            0
        } else {
            u32::MAX << (32 - prefix)
        };
        (addr & mask == u32::from(Ipv4Addr::from(*net)) & mask).then_some(*name)
    })
}

/// IPv6 ranges that carry an IPv4 address in their last 32 bits: judged by that address.
const EMBEDS_V4: &[(u128, u32, &str)] = &[
    (0, 96, "IPv4-compatible"),
    (0x0064_ff9b << 96, 96, "NAT64"),
    (0x0064_ff9b_0001 << 80, 48, "local-use NAT64"),
];

/// IPv6 ranges a callback may never reach (beyond loopback, unspecified and multicast).
const NON_GLOBAL_V6: &[(u128, u32, &str)] = &[
    (0x2002 << 112, 16, "6to4"),
    (0x2001 << 112, 32, "Teredo"),
    (0xfc00 << 112, 7, "unique-local"),
    (0xfe80 << 112, 10, "link-local"),
    (0xfec0 << 112, 10, "site-local"),
    (0x2001_0db8 << 96, 32, "documentation"),
    (0x0100 << 112, 64, "discard"),
];

fn in_v6_net(bits: u128, net: u128, prefix: u32) -> bool {
    bits >> (128 - prefix) == net >> (128 - prefix)
}

/// Whether a resolved address may be called back: a globally routable IPv4 address, or an
/// IPv6 address outside every internal range (docs/contract.md "5. Failures"). IPv4-mapped, IPv4-compatible and
/// NAT64 forms are judged by the IPv4 address inside them; 6to4 and Teredo, which tunnel to
/// addresses that cannot be judged from here, are refused outright.
pub(crate) fn is_public_ip(ip: IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(v4) => non_global_range(v4).is_none(),
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            if v6.is_loopback() || v6.is_unspecified() || v6.is_multicast() {
                return false;
            }
            if EMBEDS_V4
                .iter()
                .any(|(net, prefix, _)| in_v6_net(bits, *net, *prefix))
            {
                return non_global_range(Ipv4Addr::from(bits as u32)).is_none();
            }
            !NON_GLOBAL_V6
                .iter()
                .any(|(net, prefix, _)| in_v6_net(bits, *net, *prefix))
        }
    }
}

/// The origin of a URL (`https://host:port`): what one receiver is, for sharing out
/// deliveries. A URL that does not parse is its own origin.
pub(crate) fn origin_of(url: &str) -> String {
    match Url::parse(url) {
        Ok(parsed) => parsed.origin().ascii_serialization(),
        Err(_) => url.to_string(),
    }
}

/// A URL fit for a log line: scheme, host, port and path; never the query (partners put
/// tokens there), the fragment or a user name.
pub(crate) fn redacted(url: &str) -> String {
    match Url::parse(url) {
        Ok(parsed) => format!("{}{}", parsed.origin().ascii_serialization(), parsed.path()),
        Err(_) => "<unparseable url>".into(),
    }
}

const INTERNAL_SUFFIXES: &[&str] = &[
    ".localhost",
    ".local",
    ".internal",
    ".lan",
    ".home.arpa",
    ".corp",
];

/// Names that resolve inside someone's network rather than on the Internet.
fn internal_name_rule(name: &str) -> Option<&'static str> {
    // `localhost.` is `localhost`: the trailing dot only makes the name absolute.
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    if name == "localhost" {
        return Some("localhost");
    }
    if !name.contains('.') {
        return Some("single-label name");
    }
    INTERNAL_SUFFIXES
        .iter()
        .find(|suffix| name.ends_with(*suffix))
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn judge(raw: &str) -> Result<CallbackUrl, CallbackRefusal> {
        CallbackUrl::parse(raw, AddressPolicy::PublicOnly)
    }

    #[test]
    fn the_url_table_is_judged_as_the_spec_says() {
        let cases: &[(&str, bool)] = &[
            ("https://partner.example.com/hooks/orders", true),
            ("http://partner.example.com:8443/h?x=1", true),
            ("https://8.8.8.8/hook", true),
            ("https://93.184.216.34/", true),
            ("https://sub.domain.co.uk/a/b", true),
            ("HTTPS://Partner.Example.COM/", true),
            ("not a url", false),
            ("/relative/path", false),
            ("", false),
            ("ftp://partner.example.com/", false),
            ("file:///etc/passwd", false),
            ("gopher://partner.example.com/", false),
            ("javascript:alert(1)", false),
            ("https://user:pass@partner.example.com/", false),
            ("https://user@partner.example.com/", false),
            ("https://:pass@partner.example.com/", false),
            ("http:///nohost", false),
            ("http://127.0.0.1/", false),
            ("http://127.1/", false),
            ("http://2130706433/", false),
            ("http://0177.0.0.1/", false),
            ("http://0x7f.1/", false),
            ("http://0x7f000001/", false),
            ("http://017700000001/", false),
            ("http://0/", false),
            ("http://0.0.0.0/", false),
            ("http://10.0.0.1/", false),
            ("http://172.16.5.4/", false),
            ("http://172.31.255.255/", false),
            ("http://192.168.1.1/", false),
            ("http://169.254.169.254/latest/meta-data", false),
            ("http://100.64.0.1/", false),
            ("http://100.127.255.254/", false),
            ("http://255.255.255.255/", false),
            ("http://192.0.2.10/", false),
            ("http://198.51.100.7/", false),
            ("http://203.0.113.9/", false),
            ("http://198.18.0.1/", false),
            ("http://198.19.255.1/", false),
            ("http://240.0.0.1/", false),
            ("http://224.0.0.1/", false),
            ("http://[::1]/", false),
            ("http://[::ffff:127.0.0.1]/", false),
            ("http://[::ffff:8.8.8.8]/", false),
            ("http://[2001:4860:4860::8888]/", false),
            ("http://localhost/", false),
            ("http://LOCALHOST:8080/", false),
            ("http://localhost./", false),
            ("http://%6c%6fcalhost/", false),
            ("http://api.localhost/", false),
            ("http://intranet/", false),
            ("http://printer.local/", false),
            ("http://db.internal/", false),
            ("http://nas.lan/", false),
            ("http://router.home.arpa/", false),
            ("http://erp.corp/", false),
            ("http://172.15.255.255/", true),
            ("http://100.128.0.1/", true),
            ("http://172.32.0.1/", true),
        ];
        for (raw, accepted) in cases {
            assert_eq!(judge(raw).is_ok(), *accepted, "{raw}: {:?}", judge(raw));
        }
    }

    #[test]
    fn allowing_private_callbacks_lifts_the_address_and_name_rules_only() {
        let allow = |raw| CallbackUrl::parse(raw, AddressPolicy::AllowPrivate);
        assert!(allow("http://127.0.0.1:9000/hook").is_ok());
        assert!(allow("http://localhost:9000/hook").is_ok());
        assert!(allow("http://[::1]:9000/hook").is_ok());
        assert!(allow("ftp://127.0.0.1/").is_err());
        assert!(allow("http://u:p@127.0.0.1/").is_err());
        assert!(allow("http://").is_err());
        assert!(allow("http://:80/").is_err());
    }

    #[test]
    fn each_refusal_names_its_rule_in_the_words_of_the_400() {
        let cases = [
            (
                "ftp://a.example/",
                r#"scheme "ftp" is not allowed; use http or https"#,
            ),
            (
                "http://0x7f.1/",
                "address 127.0.0.1 is not globally routable (loopback)",
            ),
            (
                "http://db.internal/",
                r#"host "db.internal" is an internal name (.internal)"#,
            ),
            ("http://[::1]/", "IPv6 literals are not allowed"),
            (
                "http://u:p@a.example/",
                "a user name or password in the URL is not allowed",
            ),
            (
                "/relative",
                "not a valid absolute URL (relative URL without a base)",
            ),
        ];
        for (raw, reason) in cases {
            assert_eq!(judge(raw).unwrap_err().to_string(), reason, "{raw}");
        }
    }

    #[test]
    fn an_accepted_url_keeps_the_text_the_partner_sent() {
        let url = judge("HTTPS://Partner.Example.com:443/h?a=1").unwrap();
        assert_eq!(url.as_str(), "HTTPS://Partner.Example.com:443/h?a=1");
        assert_eq!(url.url().as_str(), "https://partner.example.com/h?a=1");
    }

    #[test]
    fn resolved_addresses_are_judged_like_literals() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:10.0.0.1",
            "64:ff9b::7f00:1",
        ] {
            assert!(!is_public_ip(private.parse().unwrap()), "{private}");
        }
        for public in ["8.8.8.8", "2606:4700:4700::1111", "::ffff:8.8.8.8"] {
            assert!(is_public_ip(public.parse().unwrap()), "{public}");
        }
    }

    fn non_global_v4() -> impl Strategy<Value = Ipv4Addr> {
        prop::sample::select(NON_GLOBAL_V4.to_vec()).prop_flat_map(|(net, prefix, _)| {
            let base = u32::from(Ipv4Addr::from(net));
            let span = if prefix == 32 {
                1u64
            } else {
                1u64 << (32 - prefix)
            };
            (0..span).prop_map(move |offset| Ipv4Addr::from(base + offset as u32))
        })
    }

    proptest! {
        #[test]
        fn no_url_whose_host_is_a_non_global_ipv4_is_accepted(ip in non_global_v4(), form in 0..4u8) {
            let n = u32::from(ip);
            let [a, b, c, d] = ip.octets();
            let host = match form {
                0 => ip.to_string(),
                1 => n.to_string(),
                2 => format!("{:#x}", n),
                _ => format!("0{:o}.0{:o}.0{:o}.0{:o}", a, b, c, d),
            };
            let raw = format!("https://{host}/hook");
            prop_assert!(judge(&raw).is_err(), "{} was accepted", raw);
        }
    }

    #[test]
    fn resolved_ipv6_addresses_that_reach_internal_networks_are_refused() {
        let cases: &[(&str, bool)] = &[
            ("2606:4700:4700::1111", true),
            ("::ffff:8.8.8.8", true),
            ("::ffff:10.0.0.1", false),
            ("::8.8.8.8", true),
            ("::10.0.0.1", false),
            ("::127.0.0.1", false),
            ("64:ff9b::8.8.8.8", true),
            ("64:ff9b::192.168.1.1", false),
            ("64:ff9b:1::8.8.8.8", true),
            ("64:ff9b:1::a9fe:a9fe", false),
            ("2002:c0a8:101::1", false),
            ("2001::1", false),
            ("2001:0:4136:e378:8000:63bf:3fff:fdd2", false),
            ("fec0::1", false),
            ("fc00::1", false),
            ("fd12:3456::1", false),
            ("fe80::1", false),
            ("ff02::1", false),
            ("2001:db8::1", false),
            ("100::1", false),
            ("100:0:0:1::1", true),
            ("::1", false),
            ("::", false),
        ];
        for (text, public) in cases {
            let ip: IpAddr = text.parse().unwrap();
            assert_eq!(is_public_ip(ip), *public, "{text}");
        }
    }

    proptest! {
        #[test]
        fn an_embedded_ipv4_is_judged_as_the_ipv4(a: u8, b: u8, c: u8, d: u8) {
            let v4 = Ipv4Addr::new(a, b, c, d);
            let expected = non_global_range(v4).is_none();
            let tail = u128::from(u32::from(v4));
            for prefix in [0u128, 0x0064_ff9b << 96, 0x0064_ff9b_0001 << 80, 0xffff << 32] {
                let v6 = std::net::Ipv6Addr::from(prefix | tail);
                prop_assert_eq!(is_public_ip(IpAddr::V6(v6)), expected, "{}", v6);
            }
        }
    }
}
