//! docs/contract.md "6. Many instances" across instances: two (or more) `orderly serve` processes on one
//! PostgreSQL database, tested where only many instances can fail: one key, one rate budget,
//! one revocation, one migration, claimed work taken over after a kill -9, one credit per
//! provider notification, and no acknowledged order lost with an instance. Each runs only
//! when `ORDERLY_TEST_DATABASE_URL` is set.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use hmac::{Hmac, Mac};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use sha2::Sha256;

use crate::helpers::{
    basket, create_database_sql, maintenance_sql, server_database_url, sql_i64, start,
    start_logging, TestApp, TestDatabase,
};
use crate::postgres::{cluster, hold_balance_row, OwnCluster};
use crate::receiver::Receiver;

/// Two instances on one fresh database. Fields drop in order: the servers, then the database.
pub struct Pair {
    pub a: TestApp,
    pub b: TestApp,
    _database: TestDatabase,
    _dir: tempfile::TempDir,
}

impl Pair {
    /// The URL of the database both serve (direct, for the test's own sessions).
    pub fn database_url(&self) -> String {
        self._database.url.clone()
    }
}

pub fn two_instances(extra: &[&str]) -> Pair {
    let dir = tempfile::tempdir().unwrap();
    let database = TestDatabase::create(&dir.path().join("db"));
    let url = database.server_url.clone();
    let mut args = vec!["--database-url", url.as_str()];
    args.extend_from_slice(extra);
    let a = start(&dir.path().join("a"), &args);
    let b = start(&dir.path().join("b"), &args);
    Pair {
        a,
        b,
        _database: database,
        _dir: dir,
    }
}

/// `POST /b2b/orders`, its status, `Idempotency-Replayed` and exact body bytes.
async fn order(
    app: &TestApp,
    api_key: &str,
    key: &str,
    body: &Value,
) -> Result<(StatusCode, bool, Vec<u8>), reqwest::Error> {
    let resp = app
        .client
        .post(app.url("/b2b/orders"))
        .header("X-Api-Key", api_key)
        .header("X-Idempotency-Key", key)
        .json(body)
        .send()
        .await?;
    let status = resp.status();
    let replayed = resp.headers().contains_key("Idempotency-Replayed");
    Ok((status, replayed, resp.bytes().await?.to_vec()))
}

pub async fn wait_until<F, Fut>(within: Duration, what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !done().await {
        assert!(Instant::now() < deadline, "{what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn fifty_requests_of_one_key_split_over_two_instances_place_one_order_and_charge_once() {
    let pair = two_instances(&[]);
    let p = pair.a.partner_with_balance(100_000).await;
    let body = basket("prd_uc", 1, "p");

    let answers = join_all((0..50).map(|i| {
        let app = if i % 2 == 0 { &pair.a } else { &pair.b };
        order(app, &p.api_key, "one-key", &body)
    }))
    .await;

    let answers: Vec<_> = answers.into_iter().map(|a| a.unwrap()).collect();
    assert!(answers.iter().all(|(s, _, _)| *s == StatusCode::OK));
    assert!(
        answers.iter().all(|(_, _, b)| *b == answers[0].2),
        "identical"
    );
    assert_eq!(
        answers.iter().filter(|(_, replayed, _)| !replayed).count(),
        1
    );
    assert_eq!(pair.b.orders(&p.api_key).await.len(), 1);
    assert_eq!(
        pair.b.assert_ledger_matches_balance(&p.api_key).await,
        100_000 - 999
    );
}

/// An instance with the API key in memory and no copy of the idempotency key leaves the key
/// to its first use, which reads it under the balance's lock. When that lock is held past the
/// retries the first use never read the key; the key's check comes before the balance's
/// (docs/api.md "POST /b2b/orders"), so the answer is still the key's, never the 402 that says it is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn a_different_body_under_a_key_used_through_the_other_instance_is_the_409_while_its_balance_row_stays_locked(
) {
    let pair = two_instances(&[]);
    let p = pair.a.partner_with_balance(10_000).await;
    let first = basket("prd_uc", 1, "p");
    let (status, _, placed) = order(&pair.a, &p.api_key, "used", &first).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        pair.b.get(&p.api_key, "/b2b/balance").await.status(),
        StatusCode::OK
    );
    let held = hold_balance_row(pair.database_url(), p.account_id.clone());

    let other = basket("prd_uc", 2, "p");
    let (status, _, body) = order(&pair.b, &p.api_key, "used", &other).await.unwrap();
    let text = String::from_utf8_lossy(&body);
    assert_eq!(status, StatusCode::CONFLICT, "{text}");
    assert!(
        text.contains("idempotency_key_reused_with_different_body: "),
        "{text}"
    );
    let (status, replayed, again) = order(&pair.b, &p.api_key, "used", &first).await.unwrap();
    assert_eq!((status, replayed), (StatusCode::OK, true));
    assert_eq!(again, placed);

    drop(held);
    assert_eq!(
        pair.b.assert_ledger_matches_balance(&p.api_key).await,
        10_000 - 999
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn thirty_one_requests_within_two_seconds_over_two_instances_limited_to_30_get_one_429_the_last(
) {
    let pair = two_instances(&["--rate-limit", "30"]);

    let started = Instant::now();
    let mut seen = Vec::new();
    for i in 0..31 {
        let app = if i % 2 == 0 { &pair.a } else { &pair.b };
        let resp = app
            .client
            .get(app.url("/openapi.json"))
            .send()
            .await
            .unwrap();
        let remaining = resp.headers()["X-RateLimit-Remaining"]
            .to_str()
            .unwrap()
            .to_string();
        seen.push((resp.status(), remaining));
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the 31 requests took {:?}; the rule is about 2 s",
        started.elapsed()
    );

    let statuses: Vec<StatusCode> = seen.iter().map(|(s, _)| *s).collect();
    let mut expected = vec![StatusCode::OK; 30];
    expected.push(StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(statuses, expected);
    // One budget: it counts down across both instances.
    let remaining: Vec<String> = seen.iter().map(|(_, r)| r.clone()).collect();
    let mut counted: Vec<String> = (0..30).rev().map(|n| n.to_string()).collect();
    counted.push("0".into());
    assert_eq!(remaining, counted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn forty_requests_at_once_over_two_instances_limited_to_30_allow_exactly_30() {
    let pair = two_instances(&["--rate-limit", "30"]);

    // At once: each instance spends the requests that wait together in one statement.
    let started = Instant::now();
    let answers = join_all((0..40).map(|i| {
        let app = if i % 2 == 0 { &pair.a } else { &pair.b };
        app.client.get(app.url("/openapi.json")).send()
    }))
    .await;
    assert!(started.elapsed() < Duration::from_secs(2), "within 2 s");

    let statuses: Vec<StatusCode> = answers.into_iter().map(|a| a.unwrap().status()).collect();
    let allowed = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    let refused = statuses
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert_eq!((allowed, refused), (30, 10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn an_api_key_revoked_through_one_instance_is_401_on_the_other_at_once() {
    let pair = two_instances(&[]);
    let account = pair.a.create_account(true, 0, "EU").await;
    let created: Value = pair
        .a
        .admin(
            Method::POST,
            &format!("/admin/accounts/{account}/api-keys"),
            Some(json!({"scopes": ["balance:read"]})),
        )
        .await
        .json()
        .await
        .unwrap();
    let key = created["apiKey"]["key"].as_str().unwrap().to_string();
    let key_id = created["apiKey"]["id"].as_str().unwrap().to_string();
    assert_eq!(
        pair.b.get(&key, "/b2b/balance").await.status(),
        StatusCode::OK
    );

    revoke_through_a(&pair.a, &key_id).await;

    let after = pair.b.get(&key, "/b2b/balance").await;
    assert_eq!(after.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn a_key_created_through_one_instance_authenticates_on_the_other_as_soon_as_it_is_answered() {
    // The other instance refuses keys it does not know from memory: it must have learned of
    // each one before its creation is answered, whichever instance is asked first.
    let pair = two_instances(&[]);
    let account = pair.a.create_account(true, 0, "EU").await;
    for i in 0..20 {
        let (through, other) = if i % 2 == 0 {
            (&pair.a, &pair.b)
        } else {
            (&pair.b, &pair.a)
        };
        let key = through.create_key(&account, &["balance:read"]).await;
        let answer = other.get(&key, "/b2b/balance").await;
        assert_eq!(answer.status(), StatusCode::OK, "key {i}");
    }
}

/// A key of its own for the account, with every scope: (the key, its id).
async fn key_with_id(app: &TestApp, account: &str) -> (String, String) {
    let created: Value = app
        .admin(
            Method::POST,
            &format!("/admin/accounts/{account}/api-keys"),
            Some(
                json!({"scopes": ["orders:write", "orders:read", "balance:read", "catalog:read"]}),
            ),
        )
        .await
        .json()
        .await
        .unwrap();
    (
        created["apiKey"]["key"].as_str().unwrap().to_string(),
        created["apiKey"]["id"].as_str().unwrap().to_string(),
    )
}

/// A key made through `a` for a new account and used once through `b`, so that `b` holds a
/// copy of it: (the key, its id).
pub async fn key_b_has_seen(a: &TestApp, b: &TestApp) -> (String, String) {
    let account = a.create_account(true, 0, "EU").await;
    let (key, key_id) = key_with_id(a, &account).await;
    assert_eq!(b.get(&key, "/b2b/balance").await.status(), StatusCode::OK);
    (key, key_id)
}

/// Revokes the key through `a`; how long the 200 took.
pub async fn revoke_through_a(a: &TestApp, key_id: &str) -> Duration {
    let started = Instant::now();
    let revoked = a
        .admin(Method::DELETE, &format!("/admin/api-keys/{key_id}"), None)
        .await;
    assert_eq!(revoked.status(), StatusCode::OK);
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn a_key_revoked_through_one_instance_is_401_at_once_for_replays_the_other_answers_from_memory(
) {
    let pair = two_instances(&[]);
    let p = pair.a.partner_with_balance(10_000).await;
    let (key, key_id) = key_with_id(&pair.a, &p.account_id).await;
    let body = basket("prd_uc", 1, "p");
    let (status, _, first) = order(&pair.b, &key, "k", &body).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    // The first replay reads the key row and keeps it; the second is answered from memory.
    for _ in 0..2 {
        let (status, replayed, bytes) = order(&pair.b, &key, "k", &body).await.unwrap();
        assert_eq!((status, replayed), (StatusCode::OK, true));
        assert_eq!(bytes, first);
    }

    revoke_through_a(&pair.a, &key_id).await;

    let (status, _, _) = order(&pair.b, &key, "k", &body).await.unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn a_revocation_waits_for_an_instance_killed_with_its_copies_no_longer_than_its_lease() {
    let mut pair = two_instances(&[]);
    let (key, key_id) = key_b_has_seen(&pair.a, &pair.b).await;
    assert!(pair.b.signal("KILL", Duration::from_secs(5)).is_some());

    let took = revoke_through_a(&pair.a, &key_id).await;
    // The dead instance's lease (2 s on the database's clock) lapses; nothing waits longer.
    assert!(
        took < Duration::from_secs(4),
        "the revocation took {took:?}"
    );
    assert_eq!(
        pair.a.get(&key, "/b2b/balance").await.status(),
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn an_instance_that_stopped_gives_its_lease_back_and_a_revocation_does_not_wait_for_it() {
    let mut pair = two_instances(&[]);
    let (key, key_id) = key_b_has_seen(&pair.a, &pair.b).await;
    let stopped = pair
        .b
        .signal("TERM", Duration::from_secs(20))
        .expect("b stops");
    assert!(stopped.success());
    let leases = sql_i64(
        pair._database.url.clone(),
        "SELECT count(*) FROM auth_cache_leases WHERE valid_until > now()".into(),
    )
    .unwrap();
    assert_eq!(leases, 1, "only a's lease is live");

    revoke_through_a(&pair.a, &key_id).await;
    assert_eq!(
        pair.a.get(&key, "/b2b/balance").await.status(),
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn two_instances_started_together_on_an_empty_database_apply_each_migration_once() {
    let name = format!("orderly_empty_{}", std::process::id());
    maintenance_sql(format!("DROP DATABASE IF EXISTS {name}")).unwrap();
    maintenance_sql(create_database_sql(&name, None)).unwrap();
    let url = server_database_url(&name);
    let dir = tempfile::tempdir().unwrap();

    let starts: Vec<_> = ["a", "b"]
        .iter()
        .map(|which| {
            let (url, data_dir) = (url.clone(), dir.path().join(which));
            std::thread::spawn(move || start_logging(&data_dir, &["--database-url", &url]))
        })
        .collect();
    let apps: Vec<TestApp> = starts.into_iter().map(|t| t.join().unwrap()).collect();

    // Both serve, and the migrations were applied once between them.
    for app in &apps {
        app.create_account(true, 0, "EU").await;
    }
    let versions = sql_i64(
        url.clone(),
        "SELECT count(*) FROM orderly_schema_migrations".into(),
    )
    .unwrap();
    // Info lines reach the log within the logger's flush period: wait for them, bounded.
    let migrated = || -> Vec<String> {
        apps.iter()
            .flat_map(|app| app.logged())
            .filter(|line| line.contains("database schema migrated to version"))
            .collect()
    };
    let mut applied = migrated();
    for _ in 0..100 {
        if applied.len() as i64 >= versions {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        applied = migrated();
    }
    assert_eq!(applied.len() as i64, versions, "{applied:?}");
    assert!(versions >= 2);
    drop(apps);
    let _ = maintenance_sql(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn after_a_kill_9_of_one_instance_the_other_completes_its_due_orders_and_sweeps_its_expired_keys_within_30_s(
) {
    let mut pair = two_instances(&[
        "--fulfillment-delay",
        "3s",
        "--idempotency-ttl",
        "3s",
        "--sweep-interval",
        "1s",
    ]);
    let p = pair.a.partner_with_balance(1_000_000).await;
    let body = basket("prd_uc", 1, "p");
    let placed_at = Instant::now();
    let mut placed = Vec::new();
    for i in 0..20 {
        let (status, _, bytes) = order(&pair.a, &p.api_key, &format!("k{i}"), &body)
            .await
            .unwrap();
        assert_eq!(status, StatusCode::OK);
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        placed.push(v["order"]["id"].as_str().unwrap().to_string());
    }
    pair.a
        .signal("KILL", Duration::from_secs(5))
        .expect("killed");
    let killed_at = Instant::now();
    if placed_at.elapsed() < Duration::from_secs(3) {
        // None was due while the killed instance lived: the survivor does every completion.
        let orders = pair.b.orders(&p.api_key).await;
        assert!(orders.iter().all(|o| o["status"] == "processing"));
    }

    wait_until(Duration::from_secs(30), "every order completed", || async {
        let orders = pair.b.orders(&p.api_key).await;
        orders.len() == placed.len() && orders.iter().all(|o| o["status"] == "completed")
    })
    .await;
    // Swept: the same key and basket are a first use again (a replay writes nothing).
    wait_until(
        Duration::from_secs(30),
        "the expired keys swept",
        || async {
            let (status, replayed, _) = order(&pair.b, &p.api_key, "k0", &body).await.unwrap();
            status == StatusCode::OK && !replayed
        },
    )
    .await;
    assert!(killed_at.elapsed() < Duration::from_secs(30));
    pair.b.assert_ledger_matches_balance(&p.api_key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn after_a_kill_9_of_the_instance_mid_delivery_the_other_delivers_within_30_s_with_the_same_webhook_id(
) {
    // Killed: its sessions end with its sockets, and its claim with them.
    in_flight_delivery_is_taken_over_after("KILL").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn after_the_instance_mid_delivery_freezes_the_other_delivers_within_30_s_once_its_lease_runs_out(
) {
    // Frozen (SIGSTOP), as a machine that vanished: its sessions stay open, only the lease ends.
    in_flight_delivery_is_taken_over_after("STOP").await;
}

/// One instance in the middle of a delivery (the receiver holds the request open), a second
/// one started beside it, then `signal` to the first: the second delivers the event within
/// 30 s, same `webhook-id`, and never while the first is alive and well.
async fn in_flight_delivery_is_taken_over_after(signal: &str) {
    // The first request is held open, as by a receiver that hangs; later ones get a 200.
    let receiver = Receiver::start(vec![0]);
    let flags = [
        "--fulfillment-delay",
        "100ms",
        "--allow-private-callbacks",
        "--webhook-retry-schedule",
        "1s,1s,1s",
    ];
    let dir = tempfile::tempdir().unwrap();
    let database = TestDatabase::create(&dir.path().join("db"));
    let mut args = vec!["--database-url", database.server_url.as_str()];
    args.extend_from_slice(&flags);
    let mut a = start(&dir.path().join("a"), &args);
    let p = a.partner_with_balance(10_000).await;
    let mut body = basket("prd_uc", 1, "p");
    body["callbackUrl"] = json!(receiver.url());
    let (status, _, _) = order(&a, &p.api_key, "hooked", &body).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    let first = receiver.wait_for(1, Duration::from_secs(15)).await;
    assert_eq!(first.len(), 1, "the first instance is mid-delivery");

    // A second instance leaves a live claim alone.
    let b = start(&dir.path().join("b"), &args);
    let early = receiver.wait_for(2, Duration::from_secs(3)).await;
    assert_eq!(
        early.len(),
        1,
        "the claim of a live instance was taken over"
    );

    let killed_at = Instant::now();
    if signal == "KILL" {
        a.signal("KILL", Duration::from_secs(5)).expect("killed");
    } else {
        a.signal(signal, Duration::ZERO);
    }
    let both = receiver.wait_for(2, Duration::from_secs(30)).await;
    assert_eq!(both.len(), 2, "redelivered within 30 s of SIG{signal}");
    assert!(both[1].at.duration_since(killed_at) < Duration::from_secs(30));
    assert_eq!(both[1].header("webhook-id"), first[0].header("webhook-id"));
    assert_eq!(both[1].body, first[0].body);
    let events_path = format!("/admin/accounts/{}/events", p.account_id);
    let event = || async {
        let events: Value = b
            .admin(Method::GET, &events_path, None)
            .await
            .json()
            .await
            .unwrap();
        events["events"][0].clone()
    };
    wait_until(Duration::from_secs(10), "the delivery settled", || async {
        event().await["delivery"] == "delivered"
    })
    .await;
    assert_eq!(
        event().await["id"].as_str(),
        first[0].header("webhook-id"),
        "the event delivered is the one in flight"
    );
    drop((b, a));
    drop(database);
}

const PROVIDER_SECRET: &str = "provider-secret-1";

fn provider_signature(body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(PROVIDER_SECRET.as_bytes()).unwrap();
    mac.update(body);
    let hex: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256={hex}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn twenty_copies_of_one_provider_notification_over_two_instances_credit_once() {
    let secret = format!("acmepay={PROVIDER_SECRET}");
    let pair = two_instances(&["--provider-secret", &secret]);
    let p = pair.a.partner_with_balance(0).await;
    let body = serde_json::to_vec(&json!({"id": "pay_001", "type": "payment.succeeded",
        "accountId": p.account_id, "amount": 5000, "currency": "USD"}))
    .unwrap();
    let signature = provider_signature(&body);

    let answers = join_all((0..20).map(|i| {
        let app = if i % 2 == 0 { &pair.a } else { &pair.b };
        app.client
            .post(app.url("/webhooks/providers/acmepay"))
            .header("Content-Type", "application/json")
            .header("X-Signature", &signature)
            .body(body.clone())
            .send()
    }))
    .await;

    let mut first_uses = 0;
    for answer in answers {
        let answer = answer.unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
        let v: Value = answer.json().await.unwrap();
        if v["duplicate"] == false {
            first_uses += 1;
        }
    }
    assert_eq!(first_uses, 1);
    assert_eq!(pair.b.assert_ledger_matches_balance(&p.api_key).await, 5000);
}

/// What the load saw: acknowledged orders (key -> exact body, and which instance), and the
/// keys whose answer never came (to be retried on the survivor).
#[derive(Default)]
struct Seen {
    acknowledged: HashMap<String, (Vec<u8>, &'static str)>,
    unanswered: Vec<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn after_a_kill_9_of_one_of_two_instances_under_mixed_load_every_acknowledged_order_replays_from_the_survivor(
) {
    let mut pair = two_instances(&[]);
    let p = pair.a.partner_with_balance(10_000_000).await;
    let body = basket("prd_uc", 1, "p");
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    // Two workers per instance: new orders, a replay of an earlier key every 4th request, a
    // balance read every 5th. Bounded: at most 2,000 requests per worker.
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (app, name) = if w % 2 == 0 {
                (&pair.a, "a")
            } else {
                (&pair.b, "b")
            };
            let (client, orders_url, balance_url) = (
                app.client.clone(),
                app.url("/b2b/orders"),
                app.url("/b2b/balance"),
            );
            let (api_key, body, seen, stop) = (
                p.api_key.clone(),
                body.clone(),
                Arc::clone(&seen),
                Arc::clone(&stop),
            );
            tokio::spawn(async move {
                for i in 0..2000 {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    if i % 5 == 4 {
                        let _ = client
                            .get(&balance_url)
                            .header("X-Api-Key", &api_key)
                            .send()
                            .await;
                        continue;
                    }
                    let key = if i % 4 == 3 {
                        format!("w{w}-{}", i - 1)
                    } else {
                        format!("w{w}-{i}")
                    };
                    let sent = client
                        .post(&orders_url)
                        .header("X-Api-Key", &api_key)
                        .header("X-Idempotency-Key", &key)
                        .json(&body)
                        .send()
                        .await;
                    // A connection refused or cut: this worker's instance is gone.
                    let gone = sent.is_err();
                    let answer = match sent {
                        Ok(resp) if resp.status() == StatusCode::OK => resp.bytes().await.ok(),
                        _ => None,
                    };
                    let mut seen = seen.lock().unwrap();
                    match answer {
                        Some(bytes) => {
                            seen.acknowledged
                                .entry(key)
                                .or_insert((bytes.to_vec(), name));
                        }
                        None => seen.unanswered.push(key),
                    }
                    if gone {
                        break;
                    }
                }
            })
        })
        .collect();
    let acked_by = |seen: &Arc<Mutex<Seen>>, name: &str| {
        let seen = seen.lock().unwrap();
        seen.acknowledged
            .values()
            .filter(|(_, n)| *n == name)
            .count()
    };
    wait_until(
        Duration::from_secs(30),
        "orders acknowledged by a",
        || async { acked_by(&seen, "a") >= 40 },
    )
    .await;
    pair.a
        .signal("KILL", Duration::from_secs(5))
        .expect("killed");
    let after_kill = acked_by(&seen, "b");
    wait_until(
        Duration::from_secs(30),
        "the survivor serving on",
        || async { acked_by(&seen, "b") >= after_kill + 40 },
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    for worker in workers {
        worker.await.unwrap();
    }

    let (acknowledged, unanswered) = {
        let seen = seen.lock().unwrap();
        (seen.acknowledged.clone(), seen.unanswered.clone())
    };
    // Every acknowledged order, wherever it was answered, replays byte for byte.
    for (key, (bytes, _)) in &acknowledged {
        let (status, replayed, again) = order(&pair.b, &p.api_key, key, &body).await.unwrap();
        assert_eq!(status, StatusCode::OK, "{key}");
        assert!(replayed, "{key} replays");
        assert_eq!(&again, bytes, "{key} replays byte for byte");
    }
    // A request the dead instance never answered is safe to retry on the survivor.
    let unanswered: std::collections::BTreeSet<String> = unanswered
        .into_iter()
        .filter(|k| !acknowledged.contains_key(k))
        .collect();
    let mut retried = 0;
    for key in &unanswered {
        let (status, _, _) = order(&pair.b, &p.api_key, key, &body).await.unwrap();
        assert_eq!(status, StatusCode::OK, "{key}");
        retried += 1;
    }
    let orders = pair.b.orders(&p.api_key).await;
    assert_eq!(
        orders.len(),
        acknowledged.len() + retried,
        "one order per key"
    );
    assert_eq!(
        pair.b.assert_ledger_matches_balance(&p.api_key).await,
        10_000_000 - 999 * orders.len() as i64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn while_the_database_is_down_an_instance_still_limits_with_a_bucket_of_its_own() {
    // A cluster of its own: the shared one serves the other tests meanwhile.
    let dir = std::env::temp_dir().join(format!("orderly-pg-limit-{}", std::process::id()));
    let url = cluster("start", &dir);
    let own = OwnCluster(dir.clone());
    let mut database_url = url::Url::parse(&url).unwrap();
    database_url.set_path("/orderly");
    crate::helpers::sql_on(url.clone(), create_database_sql("orderly", None)).unwrap();
    let server_url = crate::helpers::as_server_role(database_url.as_str());
    let app = start(
        &dir.join("unused-data-dir"),
        &["--database-url", server_url.as_str(), "--rate-limit", "5"],
    );
    cluster("down", &dir);

    // /openapi.json needs no database, so only the limiter decides its answers.
    let mut statuses = Vec::new();
    for _ in 0..6 {
        let resp = app
            .client
            .get(app.url("/openapi.json"))
            .send()
            .await
            .unwrap();
        assert!(resp.headers().contains_key("X-RateLimit-Remaining"));
        statuses.push(resp.status());
    }

    let mut expected = vec![StatusCode::OK; 5];
    expected.push(StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(statuses, expected);
    drop(app);
    drop(own);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn a_secret_rotated_through_one_instance_signs_beside_the_old_one_on_every_instance() {
    let receiver = Receiver::start(vec![]);
    let pair = two_instances(&["--fulfillment-delay", "100ms", "--allow-private-callbacks"]);
    let p = pair.a.partner_with_balance(100_000).await;
    let path = format!("/admin/accounts/{}", p.account_id);
    let shown: Value = pair
        .a
        .admin(Method::GET, &path, None)
        .await
        .json()
        .await
        .unwrap();
    let old = shown["account"]["webhookSecret"]
        .as_str()
        .unwrap()
        .to_string();
    let rotated: Value = pair
        .a
        .admin(Method::POST, &format!("{path}/webhook-secret"), None)
        .await
        .json()
        .await
        .unwrap();
    let new = rotated["webhookSecret"].as_str().unwrap().to_string();
    let shown: Value = pair
        .b
        .admin(Method::GET, &path, None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        shown["account"]["webhookSecret"],
        new.as_str(),
        "b shows the new secret"
    );

    // Eight callbacks, placed through both; each instance's worker takes its share.
    for i in 0..8 {
        let app = if i % 2 == 0 { &pair.a } else { &pair.b };
        let mut body = basket("prd_uc", 1, "p");
        body["callbackUrl"] = json!(receiver.url());
        let (status, _, _) = order(app, &p.api_key, &format!("rot-{i}"), &body)
            .await
            .unwrap();
        assert_eq!(status, StatusCode::OK);
    }
    let got = receiver.wait_for(8, Duration::from_secs(20)).await;
    assert!(got.len() >= 8, "{} deliveries", got.len());
    for delivery in &got {
        let expected = format!("{} {}", delivery.signed_by(&new), delivery.signed_by(&old));
        assert_eq!(
            delivery.header("webhook-signature"),
            Some(expected.as_str())
        );
    }
}

/// Two instances deliver while their heartbeat is held up past its 2 s lease (a session holds
/// the row every renewal reads, as a lock or a lost synchronous standby would) and the
/// receiver takes 8 s to answer: a delivery on the wire stays its sender's until its own hold
/// runs out, so no webhook-id reaches the receiver from two instances at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn a_heartbeat_held_up_past_its_lease_never_lets_two_instances_send_one_webhook_at_once() {
    let receiver = crate::receiver::SlowReceiver::start(Duration::from_secs(8));
    let pair = two_instances(&[
        "--fulfillment-delay",
        "100ms",
        "--allow-private-callbacks",
        "--webhook-retry-schedule",
        "1s,1s,1s",
    ]);
    let p = pair.a.partner_with_balance(100_000).await;
    let mut body = basket("prd_uc", 1, "p");
    body["callbackUrl"] = json!(receiver.url());
    for i in 0..6 {
        let (status, _, _) = order(&pair.a, &p.api_key, &format!("hooked-{i}"), &body)
            .await
            .unwrap();
        assert_eq!(status, StatusCode::OK);
    }
    // Once deliveries are on the wire (a request arrived 1 s ago and is held for 8 s)...
    let events = format!("/admin/accounts/{}/events", p.account_id);
    wait_until(
        Duration::from_secs(20),
        "a delivery on the wire",
        || async {
            let listed: Value = pair
                .a
                .admin(Method::GET, &events, None)
                .await
                .json()
                .await
                .unwrap();
            listed["events"].as_array().is_some_and(|e| {
                e.iter()
                    .any(|e| e["deliveries"].as_array().is_none_or(|d| d.is_empty()))
            })
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // ...every renewal waits 3 s for the row a session of its own holds.
    let release = crate::postgres::hold_in_session(
        pair.database_url(),
        "SELECT 1 FROM auth_cache_version FOR UPDATE",
        vec![],
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    drop(release);

    wait_until(Duration::from_secs(60), "all six delivered", || async {
        let delivered: std::collections::HashSet<String> = receiver
            .answered()
            .into_iter()
            .map(|a| a.webhook_id)
            .collect();
        delivered.len() == 6
    })
    .await;
    // Retries still in flight land too before the overlaps are judged.
    tokio::time::sleep(Duration::from_secs(9)).await;
    let attempts = receiver.answered();
    for a in &attempts {
        for b in &attempts {
            let overlap = a.arrived < b.arrived && b.arrived < a.answered;
            assert!(
                !(a.webhook_id == b.webhook_id && overlap),
                "webhook {} was sent twice at once ({} attempts in all)",
                a.webhook_id,
                attempts.len()
            );
        }
    }
}

/// The ledger lists an account's entries in the order its balance moved, whichever instance
/// made them and whatever made them (orders, credits, cancels): each entry's `balanceAfter` is
/// the one before it plus its amount. Entry ids are made under the balance row's lock, after
/// the account's newest entry; made before the wait, a credit that waited behind orders
/// listed before them. Read before the lock, the newest entry misses what committed while
/// the lock was awaited: on a fresh connection the read went out ahead of the lock while
/// the lock's statement was being prepared (1 run in about 40 on a loaded machine, before
/// statements went out in the order they were asked for).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL and libfaketime: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn an_accounts_ledger_lists_its_entries_in_the_order_its_balance_moved_across_instances() {
    // b's clocks run twice as fast (libfaketime): between two of its readings of the
    // database's clock it runs ahead, as a loaded instance's reading can be off by a round
    // trip. Ids made from each instance's own now would sort b's entries after a's later ones.
    let dir = tempfile::tempdir().unwrap();
    let database = TestDatabase::create(&dir.path().join("db"));
    let args = ["--database-url", database.server_url.as_str()];
    let fast = [
        (
            "LD_PRELOAD",
            "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        ),
        ("FAKETIME", "+0 x2"),
        ("FAKETIME_NO_CACHE", "1"),
    ];
    let pair = (
        start(&dir.path().join("a"), &args),
        crate::helpers::start_with_env(&dir.path().join("b"), &args, &fast),
    );
    struct Two<'a> {
        a: &'a TestApp,
        b: &'a TestApp,
    }
    let pair = Two {
        a: &pair.0,
        b: &pair.1,
    };
    let p = pair.a.partner_with_balance(10_000_000).await;
    let body = basket("prd_uc", 1, "p");
    for round in 0..10 {
        let sends = (0..12).map(|i| {
            let app = if i % 2 == 0 { &pair.a } else { &pair.b };
            let (body, p) = (&body, &p);
            async move {
                // What a partner does with an answer that is not final (a lost race, a
                // deadline, an outcome unknown): the same request under the same key. This
                // test is about the order of what was written, not about load.
                for _ in 0..20 {
                    let (status, text) = if i % 3 == 0 {
                        let resp = app
                            .client
                            .post(app.url(&format!("/admin/accounts/{}/credits", p.account_id)))
                            .bearer_auth(crate::helpers::ADMIN_TOKEN)
                            .header("X-Idempotency-Key", format!("credit-{round}-{i}"))
                            .json(&json!({ "amount": 100 + i }))
                            .send()
                            .await
                            .unwrap();
                        (resp.status(), resp.text().await.unwrap())
                    } else {
                        let key = format!("order-{round}-{i}");
                        let (status, _, bytes) = order(app, &p.api_key, &key, body).await.unwrap();
                        (status, String::from_utf8_lossy(&bytes).into_owned())
                    };
                    let retry = status.is_server_error()
                        || text.contains("Concurrent balance modification")
                        || text.contains("in progress");
                    if status == StatusCode::OK {
                        return;
                    }
                    assert!(retry, "round {round}, request {i}: {status} {text}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                panic!("round {round}, request {i}: no final answer in 20 tries");
            }
        });
        join_all(sends).await;
    }
    let mut entries = pair.a.ledger(&p.api_key).await;
    entries.reverse();
    for pair_of in entries.windows(2) {
        let (before, after) = (&pair_of[0], &pair_of[1]);
        assert_eq!(
            after["balanceAfter"].as_i64().unwrap(),
            before["balanceAfter"].as_i64().unwrap() + after["amount"].as_i64().unwrap(),
            "listed in another order than the balance moved ({} entries): {before} then {after}",
            entries.len()
        );
    }
}
