//! docs/contract.md "When the storage is slow" on PostgreSQL, through the binary: commits that wait for a synchronous standby
//! that is gone (`synchronous_standby_names` naming one that does not exist, on a cluster of
//! the test's own, since every commit on it waits), a row held past the deadline, backends
//! stopped with SIGSTOP, and one write more than `--max-pending-writes`. Every request is
//! answered by its deadline, readiness follows progress, a stop is bounded, and once the
//! database completes commits again nothing was lost or charged twice.

use std::collections::HashMap;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use reqwest::StatusCode;

use crate::helpers::{
    as_server_role, basket, create_database_sql, metric, spawn_app, spawn_app_with, sql_i64,
    sql_on, start, Partner, TestApp,
};
use crate::postgres::{cluster, hold_balance_row, hold_in_session, in_own_session, OwnCluster};
use crate::timing::{self, assert_answered_by, at_once, keys, Answer, SLACK};

/// Orders `keys` at once as `partner`; each one's answer.
async fn orders_at_once(app: &TestApp, partner: &Partner, keys: &[String]) -> Vec<Answer> {
    let body = basket("prd_uc", 1, "p");
    let requests = keys.iter().map(|key| {
        let request = app
            .client
            .post(app.url("/b2b/orders"))
            .header("X-Api-Key", &partner.api_key)
            .header("X-Idempotency-Key", key)
            .json(&body);
        (key.clone(), request)
    });
    at_once(requests.collect()).await
}

/// Retries every intent with its key once the storage is back: each is a 200, one answered
/// 503 is a first use (nothing of it had been written); then the account is charged once per
/// intent (`others` intents beside these) and its ledger sums to its balance.
async fn assert_each_intent_charged_once(
    app: &TestApp,
    partner: &Partner,
    funds: i64,
    answers: &[Answer],
    others: usize,
) {
    let body = basket("prd_uc", 1, "p");
    for (key, status, _, _) in answers {
        let resp = app
            .post_order(Some(&partner.api_key), Some(key), &body)
            .await;
        assert_eq!(resp.status(), StatusCode::OK, "{key} on retry");
        if *status == StatusCode::SERVICE_UNAVAILABLE {
            assert!(
                !resp.headers().contains_key("Idempotency-Replayed"),
                "{key} was answered 503, yet something of it was written"
            );
        }
    }
    let intents = (answers.len() + others) as i64;
    let balance = app.assert_ledger_matches_balance(&partner.api_key).await;
    assert_eq!(balance, funds - intents * 999, "each intent charged once");
    assert_eq!(app.orders(&partner.api_key).await.len() as i64, intents);
}

async fn until_status(app: &TestApp, path: &str, status: StatusCode, within: Duration) -> Duration {
    timing::until_status(&app.client, app.url(path), status, within).await
}

/// `/readyz` turns 503 within 5 s of a hold beginning (writes or the heartbeat stop
/// completing), and 200 again within 5 s of `release`.
async fn readiness_follows_the_hold(app: &TestApp, release: impl FnOnce()) {
    let stalled = until_status(
        app,
        "/readyz",
        StatusCode::SERVICE_UNAVAILABLE,
        Duration::from_secs(10),
    )
    .await;
    assert!(
        stalled <= Duration::from_secs(5) + SLACK,
        "503 after {stalled:?}"
    );
    release();
    let back = until_status(app, "/readyz", StatusCode::OK, Duration::from_secs(10)).await;
    assert!(
        back <= Duration::from_secs(5) + SLACK,
        "200 again after {back:?}"
    );
}

/// orderly (`--request-deadline 3s`) on a database of a cluster of this test's own, whose
/// commits the test can make wait for a synchronous standby that does not exist.
struct StandbyGone {
    app: TestApp,
    partner: Partner,
    maintenance: String,
    _cluster: OwnCluster,
}

const STALLED_DEADLINE: Duration = Duration::from_secs(3);
const FUNDS: i64 = 1_000_000;

impl StandbyGone {
    async fn start(name: &str) -> StandbyGone {
        let dir = std::env::temp_dir().join(format!("orderly-{name}-{}", std::process::id()));
        let maintenance = cluster("start", &dir);
        let own = OwnCluster(dir.clone());
        sql_on(maintenance.clone(), create_database_sql("orderly", None)).unwrap();
        let mut url = url::Url::parse(&maintenance).unwrap();
        url.set_path("/orderly");
        let url = as_server_role(url.as_str());
        let app = start(
            &dir.join("unused-data-dir"),
            &["--database-url", url.as_str(), "--request-deadline", "3s"],
        );
        let partner = app.partner_with_balance(FUNDS).await;
        StandbyGone {
            app,
            partner,
            maintenance,
            _cluster: own,
        }
    }

    /// From now on every COMMIT waits for a standby named `nobody`.
    fn lose_the_standby(&self) {
        self.set(
            "ALTER SYSTEM SET synchronous_standby_names = 'nobody'",
            "nobody",
        );
    }

    /// Commits complete again, and the ones waiting are released.
    fn standby_back(&self) {
        self.set("ALTER SYSTEM RESET synchronous_standby_names", "");
    }

    /// Runs `sql`, reloads the configuration, and returns once a new session sees
    /// `synchronous_standby_names` as `expected` (at most 10 s). `pg_reload_conf()` only signals
    /// the postmaster: a session forked after it reloaded shows the new value, and by then it has
    /// signalled every existing backend, each of which reloads before its next command. Orders
    /// sent the moment `pg_reload_conf()` returned could commit on the old setting (CI, on a
    /// loaded machine: "stalled-0: 200 OK").
    fn set(&self, sql: &str, expected: &str) {
        sql_on(self.maintenance.clone(), sql.into()).unwrap();
        sql_on(self.maintenance.clone(), "SELECT pg_reload_conf()".into()).unwrap();
        let seen = format!(
            "SELECT (current_setting('synchronous_standby_names') = '{expected}')::int::bigint"
        );
        let until = Instant::now() + Duration::from_secs(10);
        while sql_i64(self.maintenance.clone(), seen.clone()).unwrap() != 1 {
            assert!(
                Instant::now() < until,
                "synchronous_standby_names never read '{expected}'"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn orders_whose_commits_wait_for_a_lost_standby_are_answered_by_the_deadline_with_a_500_or_503(
) {
    let s = StandbyGone::start("standby-answers").await;
    s.lose_the_standby();
    let answers = orders_at_once(&s.app, &s.partner, &keys("stalled", 12)).await;
    s.standby_back();
    let allowed = [
        StatusCode::INTERNAL_SERVER_ERROR,
        StatusCode::SERVICE_UNAVAILABLE,
    ];
    assert_answered_by(STALLED_DEADLINE, &answers, &allowed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn once_the_standby_is_back_orders_succeed_without_a_restart_and_no_intent_is_charged_twice()
{
    let s = StandbyGone::start("standby-back").await;
    s.lose_the_standby();
    let answers = orders_at_once(&s.app, &s.partner, &keys("stalled", 12)).await;
    s.standby_back();
    until_status(&s.app, "/readyz", StatusCode::OK, Duration::from_secs(10)).await;

    let body = basket("prd_uc", 1, "p");
    let fresh = s
        .app
        .post_order(Some(&s.partner.api_key), Some("after"), &body)
        .await;
    assert_eq!(
        fresh.status(),
        StatusCode::OK,
        "orders succeed again, same process"
    );
    assert_each_intent_charged_once(&s.app, &s.partner, FUNDS, &answers, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn readyz_is_503_within_5_s_of_commits_stalling_and_200_within_5_s_of_their_completing() {
    let s = StandbyGone::start("standby-readyz").await;
    until_status(&s.app, "/readyz", StatusCode::OK, Duration::from_secs(5)).await;
    s.lose_the_standby();
    let stuck = keys("stuck", 1);
    let order = orders_at_once(&s.app, &s.partner, &stuck);
    let readiness = async {
        let turned = until_status(
            &s.app,
            "/readyz",
            StatusCode::SERVICE_UNAVAILABLE,
            Duration::from_secs(8),
        )
        .await;
        let health = s
            .app
            .client
            .get(s.app.url("/healthz"))
            .send()
            .await
            .unwrap();
        assert_eq!(health.status(), StatusCode::OK, "the process itself is up");
        turned
    };
    let (_, turned) = futures::join!(order, readiness);
    // The commit began with the order; 5 s later it is a stall.
    assert!(turned <= Duration::from_secs(7), "503 after {turned:?}");

    s.standby_back();
    let back = until_status(&s.app, "/readyz", StatusCode::OK, Duration::from_secs(5)).await;
    assert!(back <= Duration::from_secs(5), "200 again after {back:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn sigterm_ends_an_instance_whose_commits_wait_for_a_lost_standby_within_30_s() {
    let mut s = StandbyGone::start("standby-stop").await;
    s.lose_the_standby();
    let stop = Arc::new(AtomicBool::new(false));
    let load: Vec<_> = (0..4)
        .map(|worker| {
            let (client, url, api_key) = (
                s.app.client.clone(),
                s.app.url("/b2b/orders"),
                s.partner.api_key.clone(),
            );
            let stop = Arc::clone(&stop);
            tokio::spawn(async move {
                let body = basket("prd_uc", 1, "p");
                let mut i = 0;
                while !stop.load(Ordering::SeqCst) {
                    let key = format!("w{worker}-{i}");
                    i += 1;
                    let sent = client
                        .post(&url)
                        .header("X-Api-Key", &api_key)
                        .header("X-Idempotency-Key", &key)
                        .json(&body)
                        .send()
                        .await;
                    if sent.is_err() {
                        break; // the process has gone
                    }
                }
            })
        })
        .collect();
    let stuck = Instant::now() + Duration::from_secs(10);
    while metric(&s.app.text("/metrics").await, "orderly_pending_writes") < 1.0 {
        assert!(
            Instant::now() < stuck,
            "no write ever waited for the standby"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let signalled = Instant::now();
    let status = s.app.signal("TERM", Duration::from_secs(40));
    let took = signalled.elapsed();
    stop.store(true, Ordering::SeqCst);
    s.standby_back();
    for task in load {
        task.await.unwrap();
    }
    let status = status.expect("the process ended");
    assert!(
        took <= Duration::from_secs(30),
        "ended {took:?} after SIGTERM"
    );
    assert_eq!(status.code(), Some(1), "writes were left in doubt");
    let logged = s.app.logged().join("\n");
    assert!(
        logged.contains("still waiting for the storage"),
        "the log says why: {logged}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn an_order_waiting_on_a_row_held_past_its_deadline_is_a_503_by_then_and_writes_nothing() {
    let app = spawn_app_with(&["--request-deadline", "2s"]).await;
    let p = app.partner_with_balance(10_000).await;
    let held = hold_balance_row(app.database_url().unwrap(), p.account_id.clone());

    let answers = orders_at_once(&app, &p, &keys("held", 1)).await;
    assert_answered_by(
        Duration::from_secs(2),
        &answers,
        &[StatusCode::SERVICE_UNAVAILABLE],
    );
    drop(held);
    assert_each_intent_charged_once(&app, &p, 10_000, &answers, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn requests_on_backends_stopped_with_sigstop_are_answered_by_the_deadline() {
    let app = spawn_app_with(&["--request-deadline", "2s"]).await;
    let p = app.partner_with_balance(100_000).await;
    let url = app.database_url().unwrap();
    let backends = backends_of(&url);
    assert!(!backends.is_empty(), "orderly holds connections");
    signal_all("STOP", &backends);
    let stopped = Stopped(backends);

    let reads = (0..2).map(|_| {
        let request = app
            .client
            .get(app.url("/b2b/orders"))
            .header("X-Api-Key", &p.api_key);
        async move {
            let started = Instant::now();
            let status = request.send().await.unwrap().status();
            (status, started.elapsed())
        }
    });
    let intents = keys("stopped", 4);
    let (orders, reads) = futures::join!(
        orders_at_once(&app, &p, &intents),
        futures::future::join_all(reads)
    );
    drop(stopped);
    let allowed = [
        StatusCode::OK,
        StatusCode::INTERNAL_SERVER_ERROR,
        StatusCode::SERVICE_UNAVAILABLE,
    ];
    assert_answered_by(Duration::from_secs(2), &orders, &allowed);
    for (status, took) in reads {
        assert!(
            took <= Duration::from_secs(2) + SLACK,
            "a read answered after {took:?}"
        );
        assert!([StatusCode::OK, StatusCode::SERVICE_UNAVAILABLE].contains(&status));
    }
    assert_each_intent_charged_once(&app, &p, 100_000, &orders, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn one_write_more_than_max_pending_writes_is_a_503_at_once_and_writes_nothing() {
    let app = spawn_app_with(&["--max-pending-writes", "3"]).await;
    let p = app.partner_with_balance(100_000).await;
    let held = hold_balance_row(app.database_url().unwrap(), p.account_id.clone());
    let body = basket("prd_uc", 1, "p");
    let waiting: Vec<_> = keys("waiting", 3)
        .into_iter()
        .map(|key| {
            let request = app
                .client
                .post(app.url("/b2b/orders"))
                .header("X-Api-Key", &p.api_key)
                .header("X-Idempotency-Key", key)
                .json(&body);
            tokio::spawn(async move { request.send().await.unwrap().status() })
        })
        .collect();
    let until = Instant::now() + Duration::from_secs(4);
    while metric(&app.text("/metrics").await, "orderly_pending_writes") < 3.0 {
        assert!(Instant::now() < until, "three writes never waited together");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let started = Instant::now();
    let refused = app
        .post_order(Some(&p.api_key), Some("one-more"), &body)
        .await;
    // A write that queued would wait for the held row until the request's deadline (10 s by
    // default); 2 s leaves a loaded machine room (CI once took over 1 s here while other tests
    // ran initdb beside it).
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "refused at once, not at the deadline: {:?}",
        started.elapsed()
    );
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers()["Retry-After"], "1");

    drop(held);
    for waiting in waiting {
        assert_eq!(waiting.await.unwrap(), StatusCode::OK);
    }
    let retried = app
        .post_order(Some(&p.api_key), Some("one-more"), &body)
        .await;
    assert_eq!(retried.status(), StatusCode::OK);
    assert!(!retried.headers().contains_key("Idempotency-Replayed"));
    assert_eq!(app.balance(&p.api_key).await, 100_000 - 4 * 999);
}

/// The server processes serving the database at `url` (orderly's connections).
fn backends_of(url: &str) -> Vec<String> {
    let name = url::Url::parse(url)
        .unwrap()
        .path()
        .trim_start_matches('/')
        .to_string();
    let pids: Arc<std::sync::Mutex<HashMap<i32, ()>>> = Arc::default();
    let found = Arc::clone(&pids);
    let (done, is_done) = mpsc::channel();
    in_own_session(url.to_string(), move |client, ready| async move {
        let rows = client
            .query(
                "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
                &[&name],
            )
            .await
            .unwrap();
        for row in rows {
            found.lock().unwrap().insert(row.get(0), ());
        }
        ready.send(()).unwrap();
        done.send(()).unwrap();
    });
    is_done.recv().unwrap();
    let pids = pids.lock().unwrap();
    pids.keys().map(|p| p.to_string()).collect()
}

fn signal_all(signal: &str, pids: &[String]) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .args(pids)
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{signal} {pids:?}");
}

/// Backends stopped with SIGSTOP, continued when dropped (even when the test fails).
struct Stopped(Vec<String>);

impl Drop for Stopped {
    fn drop(&mut self) {
        signal_all("CONT", &self.0);
    }
}

/// Writes that wait on a row another session holds (as behind another instance's commit
/// that waits for a lost standby) have no commit of their own in flight; readiness counts
/// them all the same: 503 within 5 s of their waiting, 200 within 5 s of the row's release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn readyz_is_503_within_5_s_of_writes_waiting_on_a_held_row_and_200_within_5_s_of_its_release(
) {
    let app = spawn_app().await;
    let p = app.partner_with_balance(1_000_000).await;
    let held = hold_balance_row(app.database_url().unwrap(), p.account_id.clone());
    let waiting = Arc::new(AtomicBool::new(true));
    // Orders on the held account, one after another, each waiting out its key's 5 s.
    let orders = {
        let (client, url, api_key) = (
            app.client.clone(),
            app.url("/b2b/orders"),
            p.api_key.clone(),
        );
        let waiting = Arc::clone(&waiting);
        tokio::spawn(async move {
            for i in 0..10 {
                if !waiting.load(Ordering::SeqCst) {
                    break;
                }
                let _ = client
                    .post(&url)
                    .header("X-Api-Key", &api_key)
                    .header("X-Idempotency-Key", format!("held-{i}"))
                    .json(&basket("prd_uc", 1, "p"))
                    .send()
                    .await;
            }
        })
    };
    readiness_follows_the_hold(&app, move || drop(held)).await;
    waiting.store(false, Ordering::SeqCst);
    orders.await.unwrap();
}

/// The instance's own heartbeat is a commit too: held up (a session holds the row every
/// renewal reads), readiness is 503 within 5 s though no request writes, and 200 again within
/// 5 s of its release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn readyz_is_503_within_5_s_of_the_heartbeat_stalling_with_no_write_in_flight() {
    let app = spawn_app().await;
    until_status(&app, "/readyz", StatusCode::OK, Duration::from_secs(10)).await;
    let release = hold_in_session(
        app.database_url().unwrap(),
        "SELECT 1 FROM auth_cache_version FOR UPDATE",
        vec![],
    );
    readiness_follows_the_hold(&app, move || drop(release)).await;
}
