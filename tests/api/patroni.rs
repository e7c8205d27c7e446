//! docs/operations.md "Under Patroni": a PostgreSQL pair managed by Patroni (its raft DCS with a
//! witness, `synchronous_mode` on, `use_pg_rewind`), two instances on libpq's multi-host URL
//! with `target_session_attrs=read-write`, orders streaming through both. A `patronictl
//! switchover`, a failover (the leader's Patroni and PostgreSQL killed), and the old leader
//! rejoining through pg_rewind: no instance restarts, each serves again within 10 s of each
//! event, every acknowledged order is there and every intent is charged once.
//! `ORDERLY_PATRONI_ROUNDS` (default 1) repeats the three events.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::failover::{
    nothing_lost_and_each_intent_charged_once, until_acknowledged, Seen, UnderLoad,
};
use crate::helpers::script;

/// How soon after each event every instance must serve orders again.
const SERVING_AGAIN: Duration = Duration::from_secs(10);

/// `scripts/patroni.sh COMMAND DIR [NODE]`: what it printed (its last line).
fn patroni(command: &str, dir: &Path, node: &str) -> String {
    let args: Vec<&std::ffi::OsStr> = [command.as_ref(), dir.as_os_str()]
        .into_iter()
        .chain((!node.is_empty()).then_some(node.as_ref()))
        .collect();
    let printed =
        script("patroni.sh", &args).unwrap_or_else(|why| panic!("patroni.sh {command}: {why}"));
    printed
        .trim()
        .lines()
        .last()
        .unwrap_or_default()
        .to_string()
}

/// Stops the test's Patroni cluster, its witness and its servers (even when the test fails).
struct OwnPatroni(PathBuf);

impl Drop for OwnPatroni {
    fn drop(&mut self) {
        let _ = script("patroni.sh", &["stop".as_ref(), self.0.as_os_str()]);
    }
}

/// Waits until each instance has acknowledged an order after `since` (an event's end: the new
/// leader accepting writes, or the replica synchronous again), at most `SERVING_AGAIN`: how
/// long after `since` each one did.
async fn each_serves_again(seen: &Arc<Mutex<Seen>>, since: Instant, what: &str) -> [Duration; 2] {
    loop {
        let first = |instance| {
            seen.lock()
                .unwrap()
                .served
                .iter()
                .find(|(i, at)| *i == instance && *at > since)
                .map(|(_, at)| *at - since)
        };
        if let (Some(a), Some(b)) = (first(0), first(1)) {
            println!("patroni: after {what} the instances served again in {a:?} and {b:?}");
            return [a, b];
        }
        assert!(
            since.elapsed() < SERVING_AGAIN,
            "{what}: an instance did not serve within {SERVING_AGAIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn other(node: &str) -> &'static str {
    if node == "node1" {
        "node2"
    } else {
        "node1"
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL and Patroni (scripts/patroni.sh installs Patroni 4.1.5 from PyPI): pass --include-ignored"]
async fn under_patroni_a_switchover_a_failover_and_a_rejoin_under_load_lose_nothing_and_each_instance_serves_within_10_s(
) {
    let base = std::env::temp_dir().join(format!("orderly-patroni-{}", std::process::id()));
    let cluster_dir = base.join("cluster");
    let url = patroni("start", &cluster_dir, "");
    let _cluster = OwnPatroni(cluster_dir.clone());
    let mut run = UnderLoad::start(&base, &url).await;
    let seen = &run.seen;
    let acknowledged = || seen.lock().unwrap().acknowledged.len();

    let rounds: usize = std::env::var("ORDERLY_PATRONI_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    for round in 1..=rounds {
        println!("patroni: round {round} of {rounds}");
        // A switchover: the leader steps down, the synchronous replica is promoted.
        let started = Instant::now();
        patroni("switchover", &cluster_dir, "");
        let switched = Instant::now();
        println!("patroni: switchover done in {:?}", switched - started);
        each_serves_again(seen, switched, "the switchover").await;

        // A failover: the leader's machine lost (its Patroni and PostgreSQL killed); the
        // replica's Patroni promotes it once the leader key expires.
        let killed = patroni("kill-leader", &cluster_dir, "");
        let kill = Instant::now();
        patroni("wait-leader", &cluster_dir, other(&killed));
        let promoted = Instant::now();
        println!(
            "patroni: {} promoted {:?} after the kill",
            other(&killed),
            promoted - kill
        );
        each_serves_again(seen, promoted, "the failover's promotion").await;

        // The old leader comes back as a replica through pg_rewind; orders go on meanwhile.
        let restarted = Instant::now();
        let from = acknowledged();
        patroni("restart-node", &cluster_dir, &killed);
        let rejoined = patroni("wait-replica", &cluster_dir, &killed);
        println!("patroni: {rejoined} ({:?})", restarted.elapsed());
        // From here every commit waits for the rejoined replica again (synchronous_mode).
        each_serves_again(seen, Instant::now(), "the rejoin").await;
        until_acknowledged(
            seen,
            from,
            30,
            "orders stopped while the old leader rejoined",
        )
        .await;
    }

    let seen = run.stop().await;
    print!("patroni: ");
    nothing_lost_and_each_intent_charged_once(&run.a, &run.b, &run.partner, &seen).await;
}
