//! A network namespace per instance, for net-slow and partition (PostgreSQL): the instance's
//! link to PostgreSQL made slow, or cut with its packets dropped silently, while its clients
//! still reach it. Each namespace has two veth pairs on private /30s of 10.X.0.0/16 (X a second
//! octet no address or route of the machine uses): a front one, where the instance listens
//! and the harness's clients and webhook receiver are reached, and a back one, its only way to
//! PostgreSQL (the harness's proxies listen on the host's end of instance 0's back pair, which
//! every namespace reaches through its own back pair). A fault changes one namespace's back
//! pair only. The namespaces go on every exit (cluster.rs's cleanup).

use crate::cluster::{register, Cleanup, NetPlace};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

/// A next hop that no host answers for, with a fixed neighbour entry so that nothing is
/// asked by ARP: frames sent through it carry a MAC no interface takes, and the host's end of
/// the pair drops them without a word (no reset, no ICMP, no error to the sender). A
/// blackhole route would refuse a new connection at once (EINVAL): a refusal, not a silence.
const NOWHERE: &str = "192.0.2.1";
const NOWHERE_MAC: &str = "02:00:00:00:00:01";

/// What net-slow makes of the back link: a token bucket (`tc ... tbf`) of this rate, each
/// packet waiting at most this long in its queue before it is dropped (netem, which would add
/// a fixed delay, is not on every kernel).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub rate_kbit: u64,
    pub latency_ms: u64,
}

impl Shape {
    /// The shape a fault's draw asks for: 256 kbit/s to 4 Mbit/s, 50 to 500 ms of queue.
    pub fn draw(variant: u64) -> Shape {
        const RATES: [u64; 3] = [256, 1024, 4096];
        Shape {
            rate_kbit: RATES[(variant % 3) as usize],
            latency_ms: 50 + (variant / 3 % 10) * 50,
        }
    }

    /// The arguments after `tc qdisc replace dev DEV root`.
    fn tbf(self) -> Vec<String> {
        [
            "tbf".to_string(),
            "rate".into(),
            format!("{}kbit", self.rate_kbit),
            "burst".into(),
            "32kb".into(),
            "latency".into(),
            format!("{}ms", self.latency_ms),
        ]
        .to_vec()
    }
}

/// The namespaces of a run.
pub struct Net {
    /// The second octet of 10.X.0.0/16.
    x: u8,
    tag: u32,
    count: usize,
}

/// The address of instance `i`'s front (`side` 0) or back (`side` 1) pair: the host's end, or
/// the namespace's.
fn addr(x: u8, side: u8, i: usize, host: bool) -> Ipv4Addr {
    Ipv4Addr::new(10, x, side, (4 * i + if host { 1 } else { 2 }) as u8)
}

/// The first second octet from 200 on that nothing the machine has names as 10.X.
fn free_octet(in_use: &str) -> Option<u8> {
    (200..=250u8).find(|x| !in_use.contains(&format!("10.{x}.")))
}

impl Net {
    /// Where PostgreSQL's proxies listen: the host's end of instance 0's back pair.
    pub fn db_host(&self) -> Ipv4Addr {
        addr(self.x, 1, 0, true)
    }

    /// Where the webhook receiver listens: the host's end of instance 0's front pair.
    pub fn receiver_host(&self) -> Ipv4Addr {
        addr(self.x, 0, 0, true)
    }

    fn ns(&self, i: usize) -> String {
        format!("orderly-torture-{}-{i}", self.tag)
    }

    /// The host's end of instance `i`'s back pair (an interface name: 15 bytes at most).
    fn host_back(&self, i: usize) -> String {
        format!("ot{}b{i}", self.tag)
    }

    pub fn place(&self, i: usize) -> NetPlace {
        NetPlace {
            ns_path: PathBuf::from("/var/run/netns").join(self.ns(i)),
            addr: addr(self.x, 0, i, false),
            db_host: self.db_host(),
        }
    }

    /// One namespace per instance, each with its two pairs, addresses and routes.
    pub async fn build(count: usize, tag: u32) -> Result<Net, String> {
        let mut in_use = run("ip", &["-4", "addr", "show"]).await?;
        in_use.push_str(&run("ip", &["-4", "route", "show", "table", "all"]).await?);
        let x = free_octet(&in_use).ok_or("no free 10.X.0.0/16 from 10.200 to 10.250")?;
        let net = Net {
            x,
            tag: tag % 10_000_000,
            count,
        };
        for i in 0..count {
            net.build_one(i).await?;
        }
        Ok(net)
    }

    async fn build_one(&self, i: usize) -> Result<(), String> {
        let ns = self.ns(i);
        run("ip", &["netns", "add", &ns]).await?;
        register(Cleanup::NetNs(ns.clone()));
        let x = self.x;
        let mut steps: Vec<Vec<String>> = Vec::new();
        for (side, dev) in [(0u8, "front"), (1u8, "back")] {
            let host_dev = format!("ot{}{}{i}", self.tag, if side == 0 { 'f' } else { 'b' });
            let (h, n) = (addr(x, side, i, true), addr(x, side, i, false));
            steps.push(words(&format!(
                "ip link add {host_dev} type veth peer name {dev} netns {ns}"
            )));
            steps.push(words(&format!("ip addr add {h}/30 dev {host_dev}")));
            steps.push(words(&format!("ip link set {host_dev} up")));
            steps.push(words(&format!("ip -n {ns} addr add {n}/30 dev {dev}")));
            steps.push(words(&format!("ip -n {ns} link set {dev} up")));
        }
        steps.push(words(&format!("ip -n {ns} link set lo up")));
        // The receiver through the front pair; PostgreSQL through the back one (a /32 of
        // its own, which partition points elsewhere).
        let (rh, fh) = (self.receiver_host(), addr(x, 0, i, true));
        if i != 0 {
            steps.push(words(&format!(
                "ip -n {ns} route add {rh}/32 via {fh} dev front"
            )));
        }
        steps.push(self.db_route(i, false));
        steps.push(words(&format!(
            "ip -n {ns} neigh replace {NOWHERE} lladdr {NOWHERE_MAC} dev back nud permanent"
        )));
        for s in steps {
            let args: Vec<&str> = s[1..].iter().map(String::as_str).collect();
            run(&s[0], &args).await?;
        }
        Ok(())
    }

    /// The route of namespace `i` to PostgreSQL: through its back pair, or to nowhere.
    fn db_route(&self, i: usize, cut: bool) -> Vec<String> {
        let via = if cut {
            format!("{NOWHERE} dev back onlink")
        } else {
            format!("{} dev back", addr(self.x, 1, i, true))
        };
        words(&format!(
            "ip -n {} route replace {}/32 via {via}",
            self.ns(i),
            self.db_host()
        ))
    }

    /// partition: instance `i`'s packets to PostgreSQL dropped silently (`cut`), or healed.
    pub async fn partition(&self, i: usize, cut: bool) -> Result<(), String> {
        self.check(i)?;
        let r = self.db_route(i, cut);
        let args: Vec<&str> = r[1..].iter().map(String::as_str).collect();
        run(&r[0], &args).await.map(|_| ())
    }

    /// net-slow: both ends of instance `i`'s back pair shaped, or back to full speed (None).
    pub async fn slow(&self, i: usize, shape: Option<Shape>) -> Result<(), String> {
        self.check(i)?;
        let ns = self.ns(i);
        let host_dev = self.host_back(i);
        let ends: [Vec<&str>; 2] = [
            vec!["ip", "netns", "exec", &ns, "tc", "qdisc"],
            vec!["tc", "qdisc"],
        ];
        for (end, dev) in ends.iter().zip(["back", host_dev.as_str()]) {
            let mut args: Vec<String> = end[1..].iter().map(|s| s.to_string()).collect();
            match shape {
                Some(s) => {
                    args.extend(words(&format!("replace dev {dev} root")));
                    args.extend(s.tbf());
                }
                None => args.extend(words(&format!("del dev {dev} root"))),
            }
            let a: Vec<&str> = args.iter().map(String::as_str).collect();
            run(end[0], &a).await?;
        }
        Ok(())
    }

    fn check(&self, i: usize) -> Result<(), String> {
        if i < self.count {
            Ok(())
        } else {
            Err(format!("no namespace for instance {i}"))
        }
    }
}

fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_string).collect()
}

/// What the machine lacks for the namespaces, if anything: root, `ip`, `tc`.
pub async fn missing() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("network namespaces need root".into());
    }
    for tool in ["ip", "tc"] {
        if run(tool, &["-V"]).await.is_err() {
            return Some(format!("no `{tool}` (iproute2: apt-get install iproute2)"));
        }
    }
    None
}

/// Runs a command (bounded: 20 s); its stdout, or why it failed.
async fn run(cmd: &str, args: &[&str]) -> Result<String, String> {
    let line = format!("{cmd} {}", args.join(" "));
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::process::Command::new(cmd)
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| format!("{line}: no end within 20 s"))?
    .map_err(|e| format!("{line}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{line}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_instance_has_two_private_30s_and_the_hubs_are_instance_0s_host_ends() {
        assert_eq!(addr(201, 0, 0, true), Ipv4Addr::new(10, 201, 0, 1));
        assert_eq!(addr(201, 0, 2, false), Ipv4Addr::new(10, 201, 0, 10));
        assert_eq!(addr(201, 1, 1, true), Ipv4Addr::new(10, 201, 1, 5));
        let n = Net {
            x: 201,
            tag: 1234,
            count: 2,
        };
        assert_eq!(n.db_host(), Ipv4Addr::new(10, 201, 1, 1));
        assert_eq!(n.receiver_host(), Ipv4Addr::new(10, 201, 0, 1));
        assert!(n.host_back(1).len() <= 15);
        assert_eq!(n.place(1).addr, Ipv4Addr::new(10, 201, 0, 6));
        assert_eq!(
            n.db_route(1, true).join(" "),
            "ip -n orderly-torture-1234-1 route replace 10.201.1.1/32 via 192.0.2.1 dev back onlink"
        );
        assert_eq!(
            n.db_route(1, false).join(" "),
            "ip -n orderly-torture-1234-1 route replace 10.201.1.1/32 via 10.201.1.5 dev back"
        );
        assert!(n.check(2).is_err());
    }

    #[test]
    fn the_octet_is_one_nothing_uses_and_the_shapes_stay_in_their_ranges() {
        assert_eq!(
            free_octet("inet 10.200.3.1/24 dev x\n10.201.0.0/16 via y"),
            Some(202)
        );
        assert_eq!(free_octet(""), Some(200));
        for v in 0..100 {
            let s = Shape::draw(v);
            assert!([256, 1024, 4096].contains(&s.rate_kbit));
            assert!((50..=500).contains(&s.latency_ms), "{s:?}");
        }
        assert_eq!(
            Shape::draw(4).tbf().join(" "),
            "tbf rate 1024kbit burst 32kb latency 100ms"
        );
    }
}
