//! docs/contract.md "When the storage is slow"'s last rule: a failover is a reconnect. A primary and its synchronous streaming
//! standby (clusters of the test's own: `pg_basebackup -R`, the standby's `primary_conninfo`
//! in `postgresql.auto.conf`), two instances on libpq's multi-host URL with
//! `target_session_attrs=read-write`. The primary is killed under load and the standby
//! promoted, as an HA manager does (`pg_ctl promote`, and no synchronous standby of its own):
//! no instance restarts, every acknowledged order is there and none twice, the requests
//! meanwhile are answered (500 or 503) by their deadline, and a key revoked right after the
//! failover is refused by the other instance at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::{
    basket, create_database_sql, server_role, sql_i64, sql_on, start, Partner, TestApp,
};
use crate::instances::{key_b_has_seen, revoke_through_a};
use crate::postgres::{cluster, cluster_of, OwnCluster};
use crate::timing::SLACK;

pub const DEADLINE: Duration = Duration::from_secs(3);
pub const FUNDS: i64 = 10_000_000;

/// What the load saw: each key's answers, and each answer's status and time.
#[derive(Default)]
pub struct Seen {
    pub acknowledged: HashMap<String, String>,
    pub answers: Vec<(String, StatusCode, Duration)>,
    /// Each acknowledgement's instance (0 or 1) and instant.
    pub served: Vec<(usize, Instant)>,
}

/// Orders from four tasks, two through each instance, until `stop`.
pub fn load(
    apps: [&TestApp; 2],
    partner: &Partner,
    stop: &Arc<AtomicBool>,
    seen: &Arc<Mutex<Seen>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..4)
        .map(|worker| {
            let instance = worker % 2;
            let app = apps[instance];
            let (client, url, api_key) = (
                app.client.clone(),
                app.url("/b2b/orders"),
                partner.api_key.clone(),
            );
            let (stop, seen) = (Arc::clone(stop), Arc::clone(seen));
            tokio::spawn(async move {
                let body = basket("prd_uc", 1, "p");
                let mut i = 0;
                while !stop.load(Ordering::SeqCst) {
                    let key = format!("w{worker}-{i}");
                    i += 1;
                    let started = Instant::now();
                    let resp = client
                        .post(&url)
                        .header("X-Api-Key", &api_key)
                        .header("X-Idempotency-Key", &key)
                        .json(&body)
                        .send()
                        .await
                        .unwrap_or_else(|e| panic!("{key}: orderly itself must answer: {e}"));
                    let (status, took) = (resp.status(), started.elapsed());
                    let id = if status == StatusCode::OK {
                        let v: Value = resp.json().await.unwrap();
                        Some(v["order"]["id"].as_str().unwrap().to_string())
                    } else {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        None
                    };
                    let mut seen = seen.lock().unwrap();
                    seen.answers.push((key.clone(), status, took));
                    if let Some(id) = id {
                        seen.acknowledged.insert(key, id);
                        seen.served.push((instance, Instant::now()));
                    }
                }
            })
        })
        .collect()
}

/// Waits (bounded) until `more` orders beyond `from` were acknowledged.
pub async fn until_acknowledged(seen: &Arc<Mutex<Seen>>, from: usize, more: usize, what: &str) {
    let until = Instant::now() + Duration::from_secs(45);
    while seen.lock().unwrap().acknowledged.len() < from + more {
        assert!(Instant::now() < until, "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn a_primary_killed_under_load_is_replaced_by_its_standby_with_no_restart_and_no_order_lost()
{
    let base = std::env::temp_dir().join(format!("orderly-failover-{}", std::process::id()));
    let (primary_dir, standby_dir) = (base.join("primary"), base.join("standby"));
    let primary = cluster("start", &primary_dir);
    let _primary = OwnCluster(primary_dir.clone());
    sql_on(primary.clone(), create_database_sql("orderly", None)).unwrap();
    let standby = cluster_of("standby", &standby_dir, &primary);
    let _standby = OwnCluster(standby_dir.clone());
    sql_on(
        primary.clone(),
        "ALTER SYSTEM SET synchronous_standby_names = '*'".into(),
    )
    .unwrap();
    sql_on(primary.clone(), "SELECT pg_reload_conf()".into()).unwrap();
    let synced = Instant::now() + Duration::from_secs(30);
    let sync_standbys = "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'";
    while sql_i64(primary.clone(), sync_standbys.into()).unwrap() < 1 {
        assert!(
            Instant::now() < synced,
            "the standby never became synchronous"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let port = |url: &str| url::Url::parse(url).unwrap().port().unwrap();
    let url = format!(
        "postgresql://{}@127.0.0.1:{},127.0.0.1:{}/orderly?target_session_attrs=read-write",
        server_role().unwrap_or_else(|| "postgres".into()),
        port(&primary),
        port(&standby)
    );
    let mut run = UnderLoad::start(&base, &url).await;
    let (a, b, seen) = (&run.a, &run.b, &run.seen);

    cluster("kill", &primary_dir);
    let before_promotion = seen.lock().unwrap().acknowledged.len();
    let killed = Instant::now();
    cluster("promote", &standby_dir);
    let promoted = Instant::now();
    until_acknowledged(
        seen,
        before_promotion,
        1,
        "orders did not resume on the promoted standby",
    )
    .await;
    // Figures for the README and BENCHMARKS (see them with --nocapture).
    println!(
        "failover: first order acknowledged {:?} after the kill (the promotion took {:?})",
        killed.elapsed(),
        promoted - killed
    );
    until_acknowledged(
        seen,
        before_promotion,
        30,
        "orders did not resume on the promoted standby",
    )
    .await;
    // A key revoked right after the failover: the other instance refuses it at once.
    let (key, key_id) = key_b_has_seen(a, b).await;
    revoke_through_a(a, &key_id).await;
    assert_eq!(
        b.get(&key, "/b2b/balance").await.status(),
        StatusCode::UNAUTHORIZED
    );
    let seen = run.stop().await;
    assert!(
        seen.answers.iter().any(|(_, s, _)| *s != StatusCode::OK),
        "some orders met the failover"
    );
    nothing_lost_and_each_intent_charged_once(&run.a, &run.b, &run.partner, &seen).await;
}

/// Two instances on `url` (a 3 s deadline), a funded partner, and orders streaming through both
/// (`load`), 30 of them acknowledged already.
pub struct UnderLoad {
    pub a: TestApp,
    pub b: TestApp,
    pub partner: Partner,
    pub seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    workers: Vec<tokio::task::JoinHandle<()>>,
    pids: [u32; 2],
}

impl UnderLoad {
    /// The instances keep their files under `base`.
    pub async fn start(base: &std::path::Path, url: &str) -> UnderLoad {
        let args = ["--database-url", url, "--request-deadline", "3s"];
        let (a, b) = (start(&base.join("a"), &args), start(&base.join("b"), &args));
        let partner = a.partner_with_balance(FUNDS).await;
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let workers = load([&a, &b], &partner, &stop, &seen);
        until_acknowledged(&seen, 0, 30, "no order was acknowledged at first").await;
        let pids = [a.pid(), b.pid()];
        UnderLoad {
            a,
            b,
            partner,
            seen,
            stop,
            workers,
            pids,
        }
    }

    /// Stops the orders and waits for them; what they saw. Asserts no instance restarted.
    pub async fn stop(&mut self) -> Seen {
        self.stop.store(true, Ordering::SeqCst);
        for worker in self.workers.drain(..) {
            worker.await.unwrap();
        }
        assert_eq!(
            [self.a.pid(), self.b.pid()],
            self.pids,
            "no instance restarted"
        );
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}

/// After the load has stopped: every answer was 200, 500 or 503 within the deadline; every
/// acknowledged order is there; every key, retried now, is 200; and each intent was charged
/// once (the ledger sums to the balance, which is the funds less one charge per key).
pub async fn nothing_lost_and_each_intent_charged_once(
    a: &TestApp,
    b: &TestApp,
    partner: &Partner,
    seen: &Seen,
) {
    let allowed = [
        StatusCode::OK,
        StatusCode::INTERNAL_SERVER_ERROR,
        StatusCode::SERVICE_UNAVAILABLE,
    ];
    for (key, status, took) in &seen.answers {
        assert!(allowed.contains(status), "{key}: {status}");
        assert!(*took <= DEADLINE + SLACK, "{key} answered after {took:?}");
    }
    let met = |status| seen.answers.iter().filter(|(_, s, _)| *s == status).count();
    println!(
        "{} answers: {} acknowledged, {} 500, {} 503",
        seen.answers.len(),
        seen.acknowledged.len(),
        met(StatusCode::INTERNAL_SERVER_ERROR),
        met(StatusCode::SERVICE_UNAVAILABLE)
    );
    // Every acknowledged order is there, and every intent, retried now, is charged once.
    let orders = b.orders(&partner.api_key).await;
    for (key, id) in &seen.acknowledged {
        assert!(
            orders.iter().any(|o| o["id"] == id.as_str()),
            "acknowledged order {id} ({key}) is there"
        );
    }
    let body = basket("prd_uc", 1, "p");
    for (key, _, _) in &seen.answers {
        let retried = a.post_order(Some(&partner.api_key), Some(key), &body).await;
        assert_eq!(retried.status(), StatusCode::OK, "{key} on retry");
    }
    let intents = seen.answers.len() as i64;
    let balance = b.assert_ledger_matches_balance(&partner.api_key).await;
    assert_eq!(balance, FUNDS - intents * 999, "each intent charged once");
    assert_eq!(b.orders(&partner.api_key).await.len() as i64, intents);
}
