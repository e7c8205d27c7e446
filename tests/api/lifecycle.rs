//! docs/api.md "Partner routes" and docs/contract.md "7. Webhooks": fulfillment, cancel, refunds and the event list.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{
    basket, order_status as status, spawn_app_with, wait_until_completed, TestApp,
};

async fn place(app: &TestApp, api_key: &str, key: &str) -> String {
    let placed: Value = app
        .post_order(Some(api_key), Some(key), &basket("prd_uc", 1, "p"))
        .await
        .json()
        .await
        .unwrap();
    placed["order"]["id"].as_str().unwrap().to_string()
}

async fn post(
    app: &TestApp,
    api_key: &str,
    path: &str,
    key: Option<&str>,
    body: Option<Value>,
) -> reqwest::Response {
    let mut req = app.client.post(app.url(path)).header("X-Api-Key", api_key);
    if let Some(k) = key {
        req = req.header("X-Idempotency-Key", k);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    req.send().await.unwrap()
}

#[tokio::test]
async fn an_order_is_completed_after_the_fulfillment_delay() {
    let app = spawn_app_with(&["--fulfillment-delay", "300ms"]).await;
    let p = app.partner_with_balance(10_000).await;
    let id = place(&app, &p.api_key, "k").await;
    assert_eq!(status(&app, &p.api_key, &id).await, "processing");
    wait_until_completed(&app, &p.api_key, &id).await;
}

#[tokio::test]
async fn orders_left_processing_are_completed_after_a_restart() {
    let app = spawn_app_with(&["--fulfillment-delay", "1h"]).await;
    let p = app.partner_with_balance(10_000).await;
    let id = place(&app, &p.api_key, "k").await;
    let app = app.crash_and_restart(&["--fulfillment-delay", "100ms"]);
    wait_until_completed(&app, &p.api_key, &id).await;
}

#[tokio::test]
async fn cancel_returns_the_money_then_cancel_again_is_409_and_the_first_key_replays() {
    let app = spawn_app_with(&["--fulfillment-delay", "1h"]).await;
    let p = app.partner_with_balance(10_000).await;
    let id = place(&app, &p.api_key, "order-1").await;
    let path = format!("/b2b/orders/{id}/cancel");

    let first = post(&app, &p.api_key, &path, Some("cancel-1"), None).await;
    assert_eq!(first.status(), StatusCode::OK);
    let first_bytes = first.bytes().await.unwrap();
    let body: Value = serde_json::from_slice(&first_bytes).unwrap();
    assert_eq!(body["order"]["status"], "cancelled");
    assert_eq!(app.balance(&p.api_key).await, 10_000);

    let again = post(&app, &p.api_key, &path, None, Some(json!({}))).await;
    assert_eq!(again.status(), StatusCode::CONFLICT);
    let err: Value = again.json().await.unwrap();
    assert!(err["error"]
        .as_str()
        .unwrap()
        .starts_with("order_not_cancellable: "));

    let replay = post(&app, &p.api_key, &path, Some("cancel-1"), None).await;
    assert_eq!(replay.status(), StatusCode::OK);
    assert_eq!(replay.headers()["Idempotency-Replayed"], "true");
    assert_eq!(replay.bytes().await.unwrap(), first_bytes);

    let ledger = app.ledger(&p.api_key).await;
    assert_eq!(ledger[0]["reason"], "cancel");
    assert_eq!(ledger[0]["amount"], 999);
    assert_eq!(app.assert_ledger_matches_balance(&p.api_key).await, 10_000);
}

#[tokio::test]
async fn a_completed_order_is_not_cancellable() {
    let app = spawn_app_with(&["--fulfillment-delay", "100ms"]).await;
    let p = app.partner_with_balance(10_000).await;
    let id = place(&app, &p.api_key, "k").await;
    wait_until_completed(&app, &p.api_key, &id).await;
    let resp = post(
        &app,
        &p.api_key,
        &format!("/b2b/orders/{id}/cancel"),
        None,
        None,
    )
    .await;
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    assert_eq!(app.balance(&p.api_key).await, 10_000 - 999);
}

#[tokio::test]
async fn refunds_replay_add_up_and_stop_at_the_remainder() {
    let app = spawn_app_with(&["--fulfillment-delay", "100ms"]).await;
    let p = app.partner_with_balance(10_000).await;
    let id = place(&app, &p.api_key, "k").await;
    let path = format!("/b2b/orders/{id}/refunds");

    let early = post(
        &app,
        &p.api_key,
        &path,
        Some("too-early"),
        Some(json!({"amount": 100})),
    )
    .await;
    assert_eq!(early.status(), StatusCode::CONFLICT);
    let err: Value = early.json().await.unwrap();
    assert!(err["error"]
        .as_str()
        .unwrap()
        .starts_with("order_not_refundable: "));

    wait_until_completed(&app, &p.api_key, &id).await;
    let missing_key = post(&app, &p.api_key, &path, None, Some(json!({"amount": 100}))).await;
    assert_eq!(missing_key.status(), StatusCode::BAD_REQUEST);
    let err: Value = missing_key.json().await.unwrap();
    assert_eq!(err["error"], "X-Idempotency-Key header is required");

    let first = post(
        &app,
        &p.api_key,
        &path,
        Some("r1"),
        Some(json!({"amount": 400, "reason": "damaged"})),
    )
    .await;
    assert_eq!(first.status(), StatusCode::OK);
    let first_bytes = first.bytes().await.unwrap();
    let refund: Value = serde_json::from_slice(&first_bytes).unwrap();
    assert!(refund["refund"]["id"].as_str().unwrap().starts_with("ref_"));
    assert_eq!(refund["refund"]["orderId"], id.as_str());
    assert_eq!(refund["refund"]["amount"], 400);

    let replay = post(
        &app,
        &p.api_key,
        &path,
        Some("r1"),
        Some(json!({"amount": 400, "reason": "damaged"})),
    )
    .await;
    assert_eq!(replay.headers()["Idempotency-Replayed"], "true");
    assert_eq!(replay.bytes().await.unwrap(), first_bytes);
    assert_eq!(app.balance(&p.api_key).await, 10_000 - 999 + 400);

    let second = post(
        &app,
        &p.api_key,
        &path,
        Some("r2"),
        Some(json!({"amount": 500})),
    )
    .await;
    assert_eq!(second.status(), StatusCode::OK);
    assert_eq!(app.balance(&p.api_key).await, 10_000 - 999 + 900);

    let over = post(
        &app,
        &p.api_key,
        &path,
        Some("r3"),
        Some(json!({"amount": 100})),
    )
    .await;
    assert_eq!(over.status(), StatusCode::CONFLICT);
    let err: Value = over.json().await.unwrap();
    assert!(err["error"]
        .as_str()
        .unwrap()
        .starts_with("refund_exceeds_remaining: "));

    let rest = post(&app, &p.api_key, &path, Some("r4"), Some(json!({}))).await;
    assert_eq!(rest.status(), StatusCode::OK);
    let rest: Value = rest.json().await.unwrap();
    assert_eq!(rest["refund"]["amount"], 99);
    assert_eq!(app.assert_ledger_matches_balance(&p.api_key).await, 10_000);
}

#[tokio::test]
async fn a_refund_without_a_body_refunds_the_whole_remainder() {
    let app = spawn_app_with(&["--fulfillment-delay", "100ms"]).await;
    let p = app.partner_with_balance(10_000).await;
    let id = place(&app, &p.api_key, "k").await;
    wait_until_completed(&app, &p.api_key, &id).await;
    let resp = post(
        &app,
        &p.api_key,
        &format!("/b2b/orders/{id}/refunds"),
        Some("all"),
        None,
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["refund"]["amount"], 999);
    assert_eq!(body["order"]["refundedAmount"], 999);
    assert_eq!(app.assert_ledger_matches_balance(&p.api_key).await, 10_000);
}

#[tokio::test]
async fn a_refund_without_its_key_is_400_before_an_unknown_order_is_404() {
    let app = spawn_app_with(&[]).await;
    let p = app.partner_with_balance(10_000).await;
    let path = "/b2b/orders/ord_0193a0c0000070008000000000000abc/refunds";
    let resp = post(&app, &p.api_key, path, None, Some(json!({"amount": 1}))).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"], "X-Idempotency-Key header is required");
    let with_key = post(
        &app,
        &p.api_key,
        path,
        Some("k"),
        Some(json!({"amount": 1})),
    )
    .await;
    assert_eq!(with_key.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_refund_amount_below_one_is_422() {
    let app = spawn_app_with(&[]).await;
    let p = app.partner_with_balance(10_000).await;
    let id = place(&app, &p.api_key, "k").await;
    let resp = post(
        &app,
        &p.api_key,
        &format!("/b2b/orders/{id}/refunds"),
        Some("r"),
        Some(json!({"amount": 0})),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn a_key_used_for_an_order_cannot_be_reused_for_a_cancel() {
    let app = spawn_app_with(&[]).await;
    let p = app.partner_with_balance(10_000).await;
    let id = place(&app, &p.api_key, "shared-key").await;
    let resp = post(
        &app,
        &p.api_key,
        &format!("/b2b/orders/{id}/cancel"),
        Some("shared-key"),
        None,
    )
    .await;
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    let err: Value = resp.json().await.unwrap();
    assert!(err["error"]
        .as_str()
        .unwrap()
        .starts_with("idempotency_key_reused_with_different_body: "));
    assert_eq!(status(&app, &p.api_key, &id).await, "processing");
}

#[tokio::test]
async fn every_event_is_listed_oldest_first_with_or_without_a_callback() {
    let app = spawn_app_with(&["--fulfillment-delay", "100ms"]).await;
    let p = app.partner_with_balance(10_000).await;
    let completed = place(&app, &p.api_key, "a").await;
    wait_until_completed(&app, &p.api_key, &completed).await;
    let cancelled = place(&app, &p.api_key, "b").await;
    // Cancel may race the 100 ms fulfillment; either way exactly one event follows.
    let _ = post(
        &app,
        &p.api_key,
        &format!("/b2b/orders/{cancelled}/cancel"),
        None,
        None,
    )
    .await;
    wait_until_event_count(&app, &p.api_key, 2).await;

    let events = app.get_json(&p.api_key, "/b2b/events").await;
    let list = events["events"].as_array().unwrap();
    assert_eq!(list[0]["type"], "order.completed");
    assert_eq!(list[0]["data"]["order"]["id"], completed.as_str());
    assert!(list[0]["id"].as_str().unwrap().starts_with("evt_"));
    assert_eq!(list[1]["data"]["order"]["id"], cancelled.as_str());

    let first_id = list[0]["id"].as_str().unwrap();
    let after = app
        .get_json(&p.api_key, &format!("/b2b/events?after={first_id}"))
        .await;
    assert_eq!(after["events"].as_array().unwrap().len(), 1);
    assert_eq!(after["events"][0]["id"], list[1]["id"]);
}

async fn wait_until_event_count(app: &TestApp, api_key: &str, n: usize) {
    for _ in 0..100 {
        if app.get_json(api_key, "/b2b/events").await["events"]
            .as_array()
            .unwrap()
            .len()
            >= n
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("fewer than {n} events within 5 s");
}

#[tokio::test]
async fn cancel_accepts_an_empty_body_or_json_braces_and_refuses_a_body_not_marked_json() {
    let app = spawn_app_with(&[]).await;
    let p = app.partner_with_balance(10_000).await;
    let send = |id: String, body: &'static str, content_type: Option<&'static str>| {
        let mut req = app
            .client
            .post(app.url(&format!("/b2b/orders/{id}/cancel")))
            .header("X-Api-Key", &p.api_key)
            .body(body);
        if let Some(ct) = content_type {
            req = req.header("Content-Type", ct);
        }
        req.send()
    };
    let a = place(&app, &p.api_key, "a").await;
    assert_eq!(send(a, "", None).await.unwrap().status(), StatusCode::OK);
    let b = place(&app, &p.api_key, "b").await;
    assert_eq!(
        send(b, "{}", Some("application/json"))
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    // A body is JSON only when it says so, as on every other write.
    let c = place(&app, &p.api_key, "c").await;
    assert_eq!(
        send(c.clone(), "{}", None).await.unwrap().status(),
        StatusCode::UNPROCESSABLE_ENTITY
    );
    assert_eq!(
        send(c.clone(), "{}", Some("text/plain"))
            .await
            .unwrap()
            .status(),
        StatusCode::UNPROCESSABLE_ENTITY
    );
    let d = place(&app, &p.api_key, "d").await;
    assert_eq!(
        send(d.clone(), "not json", None).await.unwrap().status(),
        StatusCode::UNPROCESSABLE_ENTITY
    );
    assert_eq!(status(&app, &p.api_key, &d).await, "processing");
}
