//! An operator's ordinary day, as faults: a graceful stop (every rolling restart) while
//! webhooks are on the wire, a stop that races its own lease renewal, a catch-up that keeps
//! failing, and a binary older than the schema during a rolling upgrade. Each is what a
//! crash does not exercise: the process ends on purpose, or two versions run at once.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{basket, spawn_app_with, sql_i64, sql_on, start, TestApp, TestDatabase};
use crate::instances::{two_instances, wait_until};
use crate::postgres::hold_in_session;
use crate::receiver::{Attempt, Receiver, SlowReceiver};

const WEBHOOK_FLAGS: [&str; 5] = [
    "--fulfillment-delay",
    "100ms",
    "--allow-private-callbacks",
    "--webhook-retry-schedule",
    "1s,1s,1s",
];

/// Places `n` orders with a callback to `url` through `app`: their ids.
async fn hooked_orders(app: &TestApp, api_key: &str, url: &str, n: usize) -> Vec<String> {
    let mut body = basket("prd_uc", 1, "p");
    body["callbackUrl"] = json!(url);
    let mut ids = Vec::new();
    for i in 0..n {
        let placed = app
            .post_order(Some(api_key), Some(&format!("hooked-{i}")), &body)
            .await;
        assert_eq!(placed.status(), StatusCode::OK);
        let v: Value = placed.json().await.unwrap();
        ids.push(v["order"]["id"].as_str().unwrap().to_string());
    }
    ids
}

/// The deliveries of `account`'s events, as the admin API lists them.
async fn delivery_states(app: &TestApp, account: &str) -> Vec<String> {
    let events: Value = app
        .admin(
            Method::GET,
            &format!("/admin/accounts/{account}/events"),
            None,
        )
        .await
        .json()
        .await
        .unwrap();
    events["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["delivery"].as_str().unwrap_or("").to_string())
        .collect()
}

/// Two attempts of one webhook-id that the receiver was handling at once.
fn overlapping(attempts: &[Attempt]) -> Option<String> {
    for a in attempts {
        for b in attempts {
            if a.webhook_id == b.webhook_id && a.arrived < b.arrived && b.arrived < a.answered {
                return Some(a.webhook_id.clone());
            }
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopping_instance_lets_the_webhook_on_the_wire_end_and_settles_it() {
    // The receiver answers each request 4 s after it arrived, whether or not its sender is
    // still there to read the answer (a receiver cannot tell).
    let receiver = SlowReceiver::start(Duration::from_secs(4));
    let mut app = spawn_app_with(&WEBHOOK_FLAGS).await;
    let p = app.partner_with_balance(10_000).await;
    hooked_orders(&app, &p.api_key, &receiver.url(), 1).await;
    assert_eq!(
        receiver.wait_for_arrivals(1, Duration::from_secs(15)).await,
        1,
        "the delivery is on the wire"
    );

    let stopped = app
        .signal("TERM", Duration::from_secs(30))
        .expect("the stop ends within 30 s");
    let stopped_at = Instant::now();
    assert!(stopped.success(), "{stopped:?}");
    let answered = receiver.answered();
    assert_eq!(answered.len(), 1, "the POST was answered before the exit");
    assert!(answered[0].answered <= stopped_at);

    // Settled as delivered before the exit: the restarted process sends nothing again.
    let app = app.restart(&WEBHOOK_FLAGS);
    wait_until(Duration::from_secs(10), "the delivery shown", || async {
        delivery_states(&app, &p.account_id).await == ["delivered"]
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        receiver.wait_for_arrivals(2, Duration::ZERO).await,
        1,
        "the webhook was sent again after the restart"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn an_instance_stopped_with_webhooks_on_the_wire_never_lets_another_send_one_at_once() {
    let receiver = SlowReceiver::start(Duration::from_secs(5));
    let dir = tempfile::tempdir().unwrap();
    let database = TestDatabase::create(&dir.path().join("db"));
    let mut args = vec!["--database-url", database.server_url.as_str()];
    args.extend_from_slice(&WEBHOOK_FLAGS);
    // a alone takes the deliveries; b starts once they are on the wire.
    let mut a = start(&dir.path().join("a"), &args);
    let p = a.partner_with_balance(100_000).await;
    hooked_orders(&a, &p.api_key, &receiver.url(), 6).await;
    assert!(receiver.wait_for_arrivals(1, Duration::from_secs(15)).await >= 1);
    let b = start(&dir.path().join("b"), &args);

    let stopped = a
        .signal("TERM", Duration::from_secs(30))
        .expect("a stops within 30 s");
    assert!(stopped.success(), "{stopped:?}");
    wait_until(Duration::from_secs(60), "all six delivered", || async {
        let delivered: HashSet<String> = receiver
            .answered()
            .into_iter()
            .map(|a| a.webhook_id)
            .collect();
        delivered.len() == 6
    })
    .await;
    // Attempts still in the receiver's hands are answered before overlaps are judged.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let attempts = receiver.answered();
    assert_eq!(
        overlapping(&attempts),
        None,
        "a webhook was sent by two instances at once ({} attempts)",
        attempts.len()
    );
    drop((b, a));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn a_lease_renewal_still_in_flight_when_an_instance_stops_does_not_bring_its_lease_back() {
    let mut app = spawn_app_with(&[]).await;
    let url = app.database_url().expect("on PostgreSQL");
    // Every renewal waits for the row a session of the test's own holds.
    let held = hold_in_session(
        url.clone(),
        "SELECT 1 FROM auth_cache_version FOR UPDATE",
        vec![],
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stopped = app
        .signal("TERM", Duration::from_secs(30))
        .expect("the stop ends within 30 s");
    assert!(stopped.success(), "{stopped:?}");

    // The renewal that was waiting commits now, after the stop released the lease.
    drop(held);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let live = sql_i64(
        url,
        "SELECT count(*) FROM auth_cache_leases WHERE valid_until > clock_timestamp()".into(),
    )
    .unwrap();
    assert_eq!(live, 0, "the stopped instance's lease is live again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn a_key_change_that_no_instance_can_catch_up_on_does_not_hold_every_later_change() {
    let pair = two_instances(&[]);
    let account = pair.a.create_account(true, 0, "EU").await;
    // A key row no instance can read back (its hash is not 32 bytes), as a row written by
    // something else than orderly: every instance's catch-up on key changes fails from now.
    sql_on(
        pair.database_url(),
        format!(
            "INSERT INTO api_keys (hash, id, account_id, scopes, revoked, created_at)
             VALUES ('\\x0102', 'key_unreadable', '{account}', '[]', false, 0)"
        ),
    )
    .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;

    // A key change waits only for instances that can acknowledge it: answered, and exact.
    for i in 0..3 {
        let started = Instant::now();
        let created = pair
            .a
            .admin(
                Method::POST,
                &format!("/admin/accounts/{account}/api-keys"),
                Some(json!({"scopes": ["balance:read"]})),
            )
            .await;
        assert_eq!(created.status(), StatusCode::OK, "key {i}");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "key {i} took {:?}",
            started.elapsed()
        );
        let v: Value = created.json().await.unwrap();
        let key = v["apiKey"]["key"].as_str().unwrap();
        assert_eq!(
            pair.b.get(key, "/b2b/balance").await.status(),
            StatusCode::OK
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn an_instance_older_than_the_schema_leaves_webhooks_to_the_newer_ones() {
    let receiver = Receiver::start(vec![]);
    let app = spawn_app_with(&WEBHOOK_FLAGS).await;
    let url = app.database_url().expect("on PostgreSQL");
    let p = app.partner_with_balance(10_000).await;
    // A newer orderly migrated the database during a rolling upgrade.
    sql_on(
        url.clone(),
        "INSERT INTO orderly_schema_migrations (version, applied_at) VALUES (9999, now())".into(),
    )
    .unwrap();
    hooked_orders(&app, &p.api_key, &receiver.url(), 1).await;
    assert!(
        receiver
            .wait_for(1, Duration::from_secs(4))
            .await
            .is_empty(),
        "an instance older than the schema sent a webhook"
    );

    // Rolled back (or the upgrade never finished): it delivers again.
    sql_on(
        url,
        "DELETE FROM orderly_schema_migrations WHERE version = 9999".into(),
    )
    .unwrap();
    assert_eq!(receiver.wait_for(1, Duration::from_secs(10)).await.len(), 1);
}
