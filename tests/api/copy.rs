//! docs/contract.md "6. Many instances", `orderly copy`: a stopped sled deployment moved whole into an empty
//! PostgreSQL database, where instances carry on as if nothing had happened; a database with
//! rows, or a source that is running, is refused and nothing is written. Each runs only when
//! `ORDERLY_TEST_DATABASE_URL` is set (the source is sled either way).

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{basket, sql_i64, start, TestApp, TestDatabase, ADMIN_TOKEN};
use crate::receiver::Receiver;

fn copy(from: &Path, to: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_orderly"))
        .args(["copy", "--from-data-dir"])
        .arg(from)
        .args(["--to-database-url", to])
        .output()
        .expect("orderly copy runs")
}

/// A sled server on `dir`, whatever engine the other tests use.
fn start_sled(dir: &Path, extra: &[&str]) -> TestApp {
    let dir_arg = dir.display().to_string();
    let mut args = vec!["--data-dir", dir_arg.as_str()];
    args.extend_from_slice(extra);
    start(dir, &args)
}

fn stop(mut app: TestApp) {
    let status = app.signal("TERM", Duration::from_secs(30));
    assert!(status.is_some_and(|s| s.success()), "stopped cleanly");
}

/// A call whose answer must replay byte for byte: method, path, idempotency key, body,
/// credentials (`None`: the admin token), and the exact first answer.
struct Sent {
    method: Method,
    path: String,
    key: String,
    body: Value,
    api_key: Option<String>,
    answer: Vec<u8>,
}

async fn send(app: &TestApp, s: &Sent) -> (StatusCode, bool, Vec<u8>) {
    let mut req = app
        .client
        .request(s.method.clone(), app.url(&s.path))
        .header("X-Idempotency-Key", &s.key)
        .json(&s.body);
    req = match &s.api_key {
        Some(k) => req.header("X-Api-Key", k),
        None => req.bearer_auth(ADMIN_TOKEN),
    };
    let resp = req.send().await.unwrap();
    let status = resp.status();
    let replayed = resp.headers().contains_key("Idempotency-Replayed");
    (status, replayed, resp.bytes().await.unwrap().to_vec())
}

async fn first_use(app: &TestApp, mut s: Sent) -> Sent {
    let (status, replayed, answer) = send(app, &s).await;
    assert_eq!(status, StatusCode::OK, "{} {}", s.method, s.path);
    assert!(!replayed);
    s.answer = answer;
    s
}

fn order_call(api_key: &str, key: &str, body: Value) -> Sent {
    Sent {
        method: Method::POST,
        path: "/b2b/orders".into(),
        key: key.into(),
        body,
        api_key: Some(api_key.into()),
        answer: Vec::new(),
    }
}

async fn events(app: &TestApp, account: &str) -> Vec<Value> {
    let v: Value = app
        .admin(
            Method::GET,
            &format!("/admin/accounts/{account}/events?limit=100"),
            None,
        )
        .await
        .json()
        .await
        .unwrap();
    v["events"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn a_sled_deployment_copied_into_postgresql_replays_every_key_byte_for_byte_and_delivers_its_pending_callbacks(
) {
    // Callbacks go to a port where nobody listens yet: they stay pending in the outbox.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let callback = format!("http://127.0.0.1:{port}/hooks/orders");
    let flags = [
        "--fulfillment-delay",
        "200ms",
        "--allow-private-callbacks",
        "--webhook-retry-schedule",
        "2s,2s,2s,2s,2s,2s,2s,2s,2s,2s",
    ];
    let dir = tempfile::tempdir().unwrap();
    let sled_dir = dir.path().join("sled");
    let sled = start_sled(&sled_dir, &flags);
    let p = sled.partner_with_balance(100_000).await;
    let revoked: Value = sled
        .admin(
            Method::POST,
            &format!("/admin/accounts/{}/api-keys", p.account_id),
            Some(json!({"scopes": ["balance:read"]})),
        )
        .await
        .json()
        .await
        .unwrap();
    let revoked_key = revoked["apiKey"]["key"].as_str().unwrap().to_string();
    let revoked_id = revoked["apiKey"]["id"].as_str().unwrap();
    sled.admin(
        Method::DELETE,
        &format!("/admin/api-keys/{revoked_id}"),
        None,
    )
    .await;

    let mut calls = Vec::new();
    for i in 0..3 {
        let mut body = basket("prd_uc", 1 + i, "p");
        body["callbackUrl"] = json!(callback);
        calls.push(first_use(&sled, order_call(&p.api_key, &format!("o{i}"), body)).await);
    }
    calls.push(
        first_use(
            &sled,
            order_call(&p.api_key, "o-plain", basket("prd_uc", 2, "q")),
        )
        .await,
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !sled
        .orders(&p.api_key)
        .await
        .iter()
        .all(|o| o["status"] == "completed")
    {
        assert!(Instant::now() < deadline, "orders completed on sled");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let first: Value = serde_json::from_slice(&calls[0].answer).unwrap();
    let refunded = first["order"]["id"].as_str().unwrap();
    let refund = Sent {
        method: Method::POST,
        path: format!("/b2b/orders/{refunded}/refunds"),
        key: "r1".into(),
        body: json!({"amount": 100, "reason": "partial"}),
        api_key: Some(p.api_key.clone()),
        answer: Vec::new(),
    };
    calls.push(first_use(&sled, refund).await);
    let credit = Sent {
        method: Method::POST,
        path: format!("/admin/accounts/{}/credits", p.account_id),
        key: "c1".into(),
        body: json!({"amount": 5000, "reason": "wire"}),
        api_key: None,
        answer: Vec::new(),
    };
    calls.push(first_use(&sled, credit).await);
    // Every callback has failed at least once: each is pending, with an attempt count.
    let deadline = Instant::now() + Duration::from_secs(20);
    let pending: Vec<String> = loop {
        let events = events(&sled, &p.account_id).await;
        let hooked: Vec<&Value> = events.iter().filter(|e| e["delivery"] != "none").collect();
        if hooked.len() == 4 && hooked.iter().all(|e| e["delivery"] == "retrying") {
            break hooked
                .iter()
                .map(|e| e["id"].as_str().unwrap().into())
                .collect();
        }
        assert!(Instant::now() < deadline, "callbacks retrying on sled");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let balance = sled.assert_ledger_matches_balance(&p.api_key).await;
    let ledger = sled.ledger(&p.api_key).await;
    let orders = sled.orders(&p.api_key).await;
    stop(sled);

    let database = TestDatabase::create(&dir.path().join("pg"));
    let copied = copy(&sled_dir, &database.url);
    assert!(
        copied.status.success(),
        "{}",
        String::from_utf8_lossy(&copied.stderr)
    );
    let counts: Value = serde_json::from_slice(&copied.stdout).unwrap();
    assert_eq!(counts["order"], 4);
    assert_eq!(counts["apiKey"], 2);

    let receiver = Receiver::start_on(port, vec![]);
    let mut args = vec!["--database-url", database.server_url.as_str()];
    args.extend_from_slice(&flags);
    let a = start(&dir.path().join("a"), &args);
    let b = start(&dir.path().join("b"), &args);

    for (i, call) in calls.iter().enumerate() {
        let app = if i % 2 == 0 { &a } else { &b };
        let (status, replayed, answer) = send(app, call).await;
        assert_eq!(status, StatusCode::OK, "{}", call.path);
        assert!(replayed, "{} {} replays", call.path, call.key);
        assert_eq!(
            answer, call.answer,
            "{} {} byte for byte",
            call.path, call.key
        );
    }
    assert_eq!(b.assert_ledger_matches_balance(&p.api_key).await, balance);
    assert_eq!(a.ledger(&p.api_key).await, ledger);
    assert_eq!(a.orders(&p.api_key).await, orders);
    assert_eq!(
        a.get(&revoked_key, "/b2b/balance").await.status(),
        StatusCode::UNAUTHORIZED
    );

    let arrived = receiver
        .wait_for(pending.len(), Duration::from_secs(30))
        .await;
    let mut ids: Vec<String> = arrived
        .iter()
        .filter_map(|r| r.header("webhook-id").map(String::from))
        .collect();
    ids.sort();
    ids.dedup();
    let mut expected = pending.clone();
    expected.sort();
    assert_eq!(ids, expected, "every pending callback arrived");
    drop((a, b));
    drop(database);
}

/// Row counts of the tables a copy writes, summed.
fn rows_in(url: &str) -> i64 {
    sql_i64(
        url.to_string(),
        "SELECT (SELECT count(*) FROM accounts) + (SELECT count(*) FROM products)
              + (SELECT count(*) FROM ledger) + (SELECT count(*) FROM api_keys)"
            .into(),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn a_second_copy_into_the_same_database_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (one, two) = (dir.path().join("one"), dir.path().join("two"));
    let first = start_sled(&one, &[]);
    first.partner_with_balance(1000).await;
    stop(first);
    let second = start_sled(&two, &[]);
    second.partner_with_balance(2000).await;
    second.create_account(true, 0, "US").await;
    stop(second);
    let database = TestDatabase::create(&dir.path().join("pg"));
    assert!(copy(&one, &database.url).status.success());
    let before = rows_in(&database.url);

    let refused = copy(&two, &database.url);

    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(refused.stdout.is_empty());
    assert_eq!(rows_in(&database.url), before, "nothing written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn a_copy_of_a_running_deployment_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("running");
    let running = start_sled(&source, &[]);
    running.partner_with_balance(1000).await;
    let database = TestDatabase::create(&dir.path().join("pg"));

    let refused = copy(&source, &database.url);

    assert_eq!(refused.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&refused.stderr).lines().count(), 1);
    assert_eq!(rows_in(&database.url), 0, "nothing written");
    drop(running);
}
