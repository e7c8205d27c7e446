//! docs/contract.md "When the storage is slow" on the embedded engine, with its group commit held in the test's hand (the flush
//! hook of `in_process`), as a disk that stopped answering would hold it: every request is
//! answered by its deadline, readiness follows progress, the writes waiting are bounded, and
//! once the flush goes on every write answered 500 is wholly there or wholly absent.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::basket;
use crate::in_process::InProcess;
use crate::timing::{self, at_once, keys, Answer, SLACK};

/// The deadline these servers run with: short, so that the tests are.
const DEADLINE: Duration = Duration::from_secs(2);
/// orderly with a deadline of `DEADLINE`, unless `extra` names its own.
fn start(extra: &[&str]) -> InProcess {
    let mut args = extra.to_vec();
    if !extra.contains(&"--request-deadline") {
        args.extend(["--request-deadline", "2s"]);
    }
    InProcess::start(&args)
}

/// Orders `keys` at once; each one's answer.
async fn orders_at_once(app: &InProcess, api_key: &str, keys: &[String]) -> Vec<Answer> {
    let body = basket("prd_uc", 1, "p");
    let requests = keys
        .iter()
        .map(|key| (key.clone(), app.order(&app.client, api_key, key, &body)));
    at_once(requests.collect()).await
}

async fn until_status(
    app: &InProcess,
    path: &str,
    status: StatusCode,
    within: Duration,
) -> Duration {
    timing::until_status(&app.client, app.url(path), status, within).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_order_waiting_on_a_held_flush_is_answered_by_its_deadline_with_a_500_or_503() {
    let app = start(&[]);
    let api_key = app.partner().await;
    app.gate.close();

    let answers = orders_at_once(&app, &api_key, &keys("held", 8)).await;
    app.gate.open();
    for (key, status, retry_after, took) in answers {
        assert!(took <= DEADLINE + SLACK, "{key} answered after {took:?}");
        assert!(
            took >= DEADLINE - Duration::from_millis(100),
            "{key} answered before its deadline ({took:?}) with the flush still held"
        );
        match status {
            StatusCode::INTERNAL_SERVER_ERROR => assert_eq!(retry_after, None, "{key}"),
            StatusCode::SERVICE_UNAVAILABLE => assert_eq!(retry_after.as_deref(), Some("1")),
            other => panic!("{key}: {other} while the flush was held"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_waits_on_a_held_flush_is_a_503_with_retry_after_by_its_deadline() {
    let app = start(&[]);
    let api_key = app.partner().await;
    app.gate.close();
    // An order of the account rides the held flush: its balance is not durable yet.
    let order = tokio::spawn({
        let request = app.order(
            &app.client,
            &api_key,
            "in-flight",
            &basket("prd_uc", 1, "p"),
        );
        async move { request.send().await.unwrap().status() }
    });
    app.gate.until_a_flush_waits().await;

    let started = Instant::now();
    let resp = app.get(&api_key, "/b2b/balance").send().await.unwrap();
    let took = started.elapsed();
    app.gate.open();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(resp.headers()["Retry-After"], "1");
    let body: Value = resp.json().await.unwrap();
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .starts_with("storage_unavailable: "),
        "{body}"
    );
    assert!(took <= DEADLINE + SLACK, "answered after {took:?}");
    order.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_a_held_flush_goes_on_every_order_answered_500_is_wholly_there_or_wholly_absent() {
    let app = start(&[]);
    // 100,000 of funds; `prd_uc` costs 999.
    let api_key = app.partner().await;
    app.gate.close();
    let answers = orders_at_once(&app, &api_key, &keys("retried", 8)).await;
    app.gate.open();

    // Each intent retried with its key: a write not sent (503) was never written, so it is
    // a first use now; a write in doubt (500) is either there (its key replays it) or not.
    let body = basket("prd_uc", 1, "p");
    for (key, status, _, _) in &answers {
        let resp = app
            .order(&app.client, &api_key, key, &body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{key} on retry");
        let replayed = resp.headers().contains_key("Idempotency-Replayed");
        if *status == StatusCode::SERVICE_UNAVAILABLE {
            assert!(
                !replayed,
                "{key} was answered 503, yet something of it was written"
            );
        }
    }
    // Each intent charged exactly once, and the ledger sums to the balance.
    let balance = app.get_json(&api_key, "/b2b/balance").await;
    assert_eq!(balance["balance"]["available"], 100_000 - 8 * 999);
    let orders = app.get_json(&api_key, "/b2b/orders?limit=100").await;
    assert_eq!(orders["orders"].as_array().unwrap().len(), 8);
    let ledger = app.get_json(&api_key, "/b2b/transactions?limit=100").await;
    let sum: i64 = ledger["transactions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["amount"].as_i64().unwrap())
        .sum();
    assert_eq!(sum, 100_000 - 8 * 999);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_flush_turns_readyz_503_within_5_s_and_back_to_200_within_5_s_of_its_release() {
    let app = start(&[]);
    let api_key = app.partner().await;
    until_status(&app, "/readyz", StatusCode::OK, Duration::from_secs(5)).await;
    app.gate.close();
    let order = tokio::spawn({
        let request = app.order(&app.client, &api_key, "stuck", &basket("prd_uc", 1, "p"));
        async move { request.send().await.unwrap().status() }
    });
    app.gate.until_a_flush_waits().await;

    let turned = until_status(
        &app,
        "/readyz",
        StatusCode::SERVICE_UNAVAILABLE,
        Duration::from_secs(7),
    )
    .await;
    assert!(turned <= Duration::from_secs(6), "503 after {turned:?}");
    let health = app.client.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(health.status(), StatusCode::OK, "the process itself is up");
    assert!(app.metric("orderly_oldest_commit_in_flight_seconds").await >= 4.0);
    // What an alert on readiness reads (deploy/alerts.yml, OrderlyNotReady).
    assert_eq!(app.metric("orderly_ready").await, 0.0);

    app.gate.open();
    let back = until_status(&app, "/readyz", StatusCode::OK, Duration::from_secs(5)).await;
    assert!(back <= Duration::from_secs(5), "200 again after {back:?}");
    assert_eq!(
        app.metric("orderly_oldest_commit_in_flight_seconds").await,
        0.0
    );
    assert_eq!(app.metric("orderly_ready").await, 1.0);
    order.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_write_more_than_max_pending_writes_is_a_503_at_once_and_writes_nothing() {
    let app = start(&["--max-pending-writes", "3", "--request-deadline", "20s"]);
    // 100,000 of funds; `prd_uc` costs 999.
    let api_key = app.partner().await;
    app.gate.close();
    let body = basket("prd_uc", 1, "p");
    let waiting: Vec<_> = keys("waiting", 3)
        .into_iter()
        .map(|key| {
            let request = app.order(&app.client, &api_key, &key, &body);
            tokio::spawn(async move { request.send().await.unwrap().status() })
        })
        .collect();
    let until = Instant::now() + Duration::from_secs(10);
    while app.metric("orderly_pending_writes").await < 3.0 {
        assert!(Instant::now() < until, "three writes never waited together");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let started = Instant::now();
    let refused = app
        .order(&app.client, &api_key, "one-more", &body)
        .send()
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "refused at once"
    );
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers()["Retry-After"], "1");

    app.gate.open();
    for waiting in waiting {
        assert_eq!(waiting.await.unwrap(), StatusCode::OK);
    }
    // Nothing of the refused one was written: its key is a first use.
    let retried = app
        .order(&app.client, &api_key, "one-more", &body)
        .send()
        .await
        .unwrap();
    assert_eq!(retried.status(), StatusCode::OK);
    assert!(!retried.headers().contains_key("Idempotency-Replayed"));
    let balance = app.get_json(&api_key, "/b2b/balance").await;
    assert_eq!(balance["balance"]["available"], 100_000 - 4 * 999);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_of_a_durable_key_while_a_flush_is_held_replays_its_first_answer_at_once() {
    let app = start(&[]);
    let api_key = app.partner().await;
    let body = basket("prd_uc", 1, "p");
    let first = app
        .order(&app.client, &api_key, "paid", &body)
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let first = first.bytes().await.unwrap();

    app.gate.close();
    // Another order rides the held flush: writes have stopped completing.
    let held = tokio::spawn({
        let request = app.order(&app.client, &api_key, "held", &body);
        async move { request.send().await.unwrap().status() }
    });
    app.gate.until_a_flush_waits().await;
    let stalled = orderly::WRITES_FLOWING_WITHIN.as_secs_f64();
    let since = Instant::now();
    while app.metric("orderly_oldest_commit_in_flight_seconds").await <= stalled {
        assert!(
            since.elapsed() < DEADLINE,
            "the held flush's age never showed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // The key's row is durable: its retry is looked up and replayed, never queued behind
    // the held flush (where it would wait out its deadline for a 500 or a 503).
    let started = Instant::now();
    let retry = app
        .order(&app.client, &api_key, "paid", &body)
        .send()
        .await
        .unwrap();
    let took = started.elapsed();
    let status = retry.status();
    let replayed = retry.headers().contains_key("Idempotency-Replayed");
    let again = retry.bytes().await.unwrap();
    app.gate.open();
    assert_eq!(
        status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&again)
    );
    assert!(replayed, "the stored answer");
    assert_eq!(again, first, "byte for byte");
    assert!(took < DEADLINE / 2, "answered after {took:?}");
    held.await.unwrap();
}
