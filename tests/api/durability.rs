//! docs/contract.md "5. Failures", first two rules, on the embedded engine with its durability step under the
//! test's control: the application runs in this process with a flush hook that can stall
//! the group commit or make it fail, so "before the flush" is a state the test holds.

use std::time::Duration;

use orderly::RunError;
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{basket, ADMIN_TOKEN};
use crate::in_process::InProcess;
use crate::receiver::Receiver;

/// A request that must still be waiting after `for_at_least`: the negative half of "answers
/// only after the flush", bounded.
async fn still_pending<T>(task: &mut tokio::task::JoinHandle<T>, for_at_least: Duration) {
    assert!(
        tokio::time::timeout(for_at_least, task).await.is_err(),
        "answered while its write was not yet durable"
    );
}

#[tokio::test]
async fn a_retry_after_a_dropped_first_use_waits_for_the_flush_and_gets_no_200_when_it_fails() {
    let app = InProcess::start(&[]);
    let api_key = app.partner().await;
    let body = basket("prd_uc", 1, "p");
    app.gate.close();

    // The first use: its client gives up while the flush is stalled and closes the connection.
    let impatient = Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let dropped = app.order(&impatient, &api_key, "k-1", &body).send().await;
    assert!(dropped.is_err(), "the first use cannot have been answered");
    app.gate.until_a_flush_waits().await;

    // The immediate retry finds the in-memory row but must not report it yet.
    let retry = app.order(&app.client, &api_key, "k-1", &body);
    let mut retry = tokio::spawn(async move { retry.send().await });
    still_pending(&mut retry, Duration::from_millis(500)).await;

    app.gate.fail();
    // A closed connection (Err) is also no 200.
    if let Ok(resp) = retry.await.unwrap() {
        assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
    match app.ended_within(Duration::from_secs(5)) {
        Some(Err(RunError::StorageFailed(why))) => assert!(why.contains("no space"), "{why}"),
        other => panic!("the application must stop on the failed flush, got {other:?}"),
    }
}

#[tokio::test]
async fn a_retry_of_a_first_use_in_flight_answers_once_the_flush_is_done() {
    let app = InProcess::start(&[]);
    let api_key = app.partner().await;
    let body = basket("prd_uc", 1, "p");
    app.gate.close();
    let first = app.order(&app.client, &api_key, "k-2", &body);
    let first = tokio::spawn(async move { first.send().await });
    app.gate.until_a_flush_waits().await;
    let retry = app.order(&app.client, &api_key, "k-2", &body);
    let mut retry = tokio::spawn(async move { retry.send().await });
    still_pending(&mut retry, Duration::from_millis(300)).await;

    app.gate.open();
    let first = first.await.unwrap().unwrap();
    let retry = retry.await.unwrap().unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(retry.status(), StatusCode::OK);
    assert_eq!(retry.headers().get("Idempotency-Replayed").unwrap(), "true");
    assert_eq!(first.bytes().await.unwrap(), retry.bytes().await.unwrap());
}

#[tokio::test]
async fn a_key_whose_first_use_stays_unflushed_past_the_wait_is_the_in_progress_409() {
    let app = InProcess::start(&[]);
    let api_key = app.partner().await;
    let body = basket("prd_uc", 1, "p");
    app.gate.close();
    let first = app.order(&app.client, &api_key, "k-3", &body);
    let first = tokio::spawn(async move { first.send().await });
    app.gate.until_a_flush_waits().await;

    let retry = app
        .order(&app.client, &api_key, "k-3", &body)
        .send()
        .await
        .unwrap();
    assert_eq!(retry.status(), StatusCode::CONFLICT);
    let retry: Value = retry.json().await.unwrap();
    assert_eq!(
        retry,
        json!({"success": false, "error": "Duplicate request in progress, retry later", "code": "REQUEST_IN_PROGRESS"})
    );
    app.gate.open();
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
}

#[tokio::test]
async fn with_the_flush_stalled_on_one_account_another_account_reads_at_once() {
    let app = InProcess::start(&[]);
    let key_a = app.partner().await;
    let key_b = app.partner().await;
    app.gate.close();
    let order = app.order(&app.client, &key_a, "k-4", &basket("prd_uc", 1, "p"));
    let order = tokio::spawn(async move { order.send().await });
    app.gate.until_a_flush_waits().await;

    let b = tokio::time::timeout(
        Duration::from_secs(2),
        app.get(&key_b, "/b2b/balance").send(),
    )
    .await
    .expect("account B's read must not wait for account A's flush")
    .unwrap();
    assert_eq!(b.status(), StatusCode::OK);
    // Account A's own balance would show the unflushed debit: it waits.
    let a = app.get(&key_a, "/b2b/balance");
    let mut a = tokio::spawn(async move { a.send().await });
    still_pending(&mut a, Duration::from_millis(300)).await;

    app.gate.open();
    assert_eq!(order.await.unwrap().unwrap().status(), StatusCode::OK);
    let a: Value = a.await.unwrap().unwrap().json().await.unwrap();
    assert_eq!(a["balance"]["available"], 100_000 - 999);
}

#[tokio::test]
async fn an_event_is_neither_listed_nor_delivered_before_its_batch_is_on_disk() {
    let receiver = Receiver::start(vec![]);
    let app = InProcess::start(&["--allow-private-callbacks"]);
    let api_key = app.partner().await;
    let mut body = basket("prd_uc", 1, "p");
    body["callbackUrl"] = json!(receiver.url());
    let placed: Value = app
        .order(&app.client, &api_key, "k-5", &body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let order_id = placed["order"]["id"].as_str().unwrap().to_string();

    app.gate.close();
    let cancel = app
        .client
        .post(app.url(&format!("/b2b/orders/{order_id}/cancel")))
        .header("X-Api-Key", &api_key);
    let cancel = tokio::spawn(async move { cancel.send().await });
    app.gate.until_a_flush_waits().await;

    let events = app.get(&api_key, "/b2b/events");
    let mut events = tokio::spawn(async move { events.send().await });
    still_pending(&mut events, Duration::from_millis(300)).await;
    assert!(
        receiver
            .wait_for(1, Duration::from_millis(700))
            .await
            .is_empty(),
        "a webhook was sent for an event that a crash could still undo"
    );

    app.gate.open();
    assert_eq!(cancel.await.unwrap().unwrap().status(), StatusCode::OK);
    let listed: Value = events.await.unwrap().unwrap().json().await.unwrap();
    assert_eq!(listed["events"][0]["type"], "order.cancelled");
    let got = receiver.wait_for(1, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 1, "delivered once durable");
    let sent: Value = serde_json::from_slice(&got[0].body).unwrap();
    assert_eq!(sent["type"], "order.cancelled");
}

#[tokio::test]
async fn a_batch_is_answered_after_its_one_flush_and_fdatasync_and_a_402_inside_it_leaves_the_others_charged_once(
) {
    let app = InProcess::start(&["--sweep-interval", "1h"]);
    let rich = app.partner().await; // 100,000 at a price of 999
    let poor = app.partner_with(500).await; // less than one order
    let body = basket("prd_uc", 1, "p");
    let applied = app.metric("orderly_writes_applied_total").await;
    let (flushed, synced) = app.gate.done();
    app.gate.close();

    // One order takes the commit thread into the closed gate...
    let primer = app.order(&app.client, &rich, "primer", &body);
    let primer = tokio::spawn(async move { primer.send().await });
    app.gate.until_a_flush_waits().await;
    // ...so that the next ones are applied by the writer and queue for one flush together.
    let mut batch = Vec::new();
    for n in 0..9 {
        let api_key = if n % 4 == 1 { &poor } else { &rich };
        let request = app.order(&app.client, api_key, &format!("b-{n}"), &body);
        batch.push((
            n % 4 == 1,
            tokio::spawn(async move { request.send().await }),
        ));
    }
    for _ in 0..1000 {
        if app.metric("orderly_writes_applied_total").await >= applied + 10.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        app.metric("orderly_writes_applied_total").await,
        applied + 10.0
    );
    assert_eq!(
        app.gate.done(),
        (flushed, synced),
        "no flush has completed yet"
    );
    assert!(
        !primer.is_finished() && batch.iter().all(|(_, answer)| !answer.is_finished()),
        "an order was answered before any flush completed"
    );

    app.gate.open();
    assert_eq!(primer.await.unwrap().unwrap().status(), StatusCode::OK);
    let mut charged = 1;
    for (refused, answer) in batch {
        let status = answer.await.unwrap().unwrap().status();
        if refused {
            assert_eq!(status, StatusCode::PAYMENT_REQUIRED);
        } else {
            assert_eq!(status, StatusCode::OK);
            charged += 1;
        }
    }
    assert_eq!(
        app.gate.done(),
        (flushed + 2, synced + 2),
        "the primer's flush and one flush and fdatasync for the nine queued behind it"
    );
    let balance = app.get_json(&rich, "/b2b/balance").await;
    assert_eq!(
        balance["balance"]["available"],
        json!(100_000 - 999 * charged)
    );
    let balance = app.get_json(&poor, "/b2b/balance").await;
    assert_eq!(balance["balance"]["available"], json!(500));
    let ledger = app.get_json(&rich, "/b2b/transactions?limit=100").await;
    let charges = ledger["transactions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|entry| entry["amount"].as_i64().is_some_and(|amount| amount < 0))
        .count();
    assert_eq!(charges as i64, charged, "each accepted order charged once");
}

/// A key revoked with the flush stalled, and a request made with it after the revocation was
/// applied: the request's 401 rests on a write that is not yet durable.
async fn revocation_in_flight(
    app: &InProcess,
) -> tokio::task::JoinHandle<reqwest::Result<reqwest::Response>> {
    let account = app
        .admin(
            reqwest::Method::POST,
            "/admin/accounts",
            json!({"name": "Acme", "wholesale": true, "region": "EU"}),
        )
        .await;
    let id = account["account"]["id"].as_str().unwrap().to_string();
    let key = app
        .admin(
            reqwest::Method::POST,
            &format!("/admin/accounts/{id}/api-keys"),
            json!({}),
        )
        .await;
    let api_key = key["apiKey"]["key"].as_str().unwrap().to_string();
    let key_id = key["apiKey"]["id"].as_str().unwrap().to_string();
    app.get_json(&api_key, "/b2b/balance").await;

    app.gate.close();
    let revoke = app
        .client
        .delete(app.url(&format!("/admin/api-keys/{key_id}")))
        .bearer_auth(ADMIN_TOKEN);
    tokio::spawn(async move { revoke.send().await });
    app.gate.until_a_flush_waits().await;
    let refused = app.get(&api_key, "/b2b/balance");
    tokio::spawn(async move { refused.send().await })
}

#[tokio::test]
async fn a_key_whose_revocation_is_not_yet_on_disk_is_refused_only_once_it_is() {
    let app = InProcess::start(&[]);
    let mut request = revocation_in_flight(&app).await;
    still_pending(&mut request, Duration::from_millis(300)).await;
    app.gate.open();
    let resp = request.await.unwrap().unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_revocation_whose_flush_fails_refused_no_request_on_its_strength() {
    let app = InProcess::start(&[]);
    let mut request = revocation_in_flight(&app).await;
    still_pending(&mut request, Duration::from_millis(300)).await;
    app.gate.fail();
    // After the restart the key is live again: a 401 would have been a lie. A closed
    // connection (Err) is no 401 either.
    if let Ok(resp) = request.await.unwrap() {
        assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
}
