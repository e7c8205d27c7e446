//! SPEC section 22, webhook operations: a receiver's 410 stops the delivery, given-up
//! deliveries are counted and found by the admin list's `delivery=` filter.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{metric, spawn_app_with, Partner, TestApp};
use crate::receiver::Receiver;

const FAST_RETRIES: [&str; 5] = [
    "--fulfillment-delay",
    "100ms",
    "--allow-private-callbacks",
    "--webhook-retry-schedule",
    "200ms,200ms,200ms",
];

async fn order(app: &TestApp, p: &Partner, key: &str, callback: Option<&str>) {
    let mut body = json!({"items": [{"productId": "prd_uc", "quantity": 1, "deliveryData": {"username": "p"}}]});
    if let Some(url) = callback {
        body["callbackUrl"] = json!(url);
    }
    let resp = app.post_order(Some(&p.api_key), Some(key), &body).await;
    assert_eq!(resp.status(), StatusCode::OK);
}

/// The admin list of the account's events with `query`, as (status, body).
async fn events(app: &TestApp, p: &Partner, query: &str) -> (StatusCode, Value) {
    let path = format!("/admin/accounts/{}/events?{query}", p.account_id);
    let resp = app.admin(Method::GET, &path, None).await;
    (resp.status(), resp.json().await.unwrap())
}

/// Waits (bounded) until the filtered list holds `n` events.
async fn until_listed(app: &TestApp, p: &Partner, query: &str, n: usize) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (status, body) = events(app, p, query).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        if body["events"].as_array().unwrap().len() == n || Instant::now() > deadline {
            return body;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_410_is_attempted_once_and_the_delivery_is_given_up_and_counted() {
    let receiver = Receiver::start(vec![410]);
    let app = spawn_app_with(&FAST_RETRIES).await;
    let p = app.partner_with_balance(10_000).await;
    order(&app, &p, "gone", Some(&receiver.url())).await;

    let listed = until_listed(&app, &p, "delivery=given_up", 1).await;
    let event = &listed["events"][0];
    assert_eq!(event["delivery"], "given_up", "{listed}");
    assert_eq!(event["deliveries"].as_array().unwrap().len(), 1);
    assert_eq!(event["deliveries"][0]["status"], 410);
    // The schedule would have retried three times 200 ms apart: nothing more comes.
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(
        receiver.wait_for(2, Duration::from_millis(10)).await.len(),
        1
    );
    let text = app.text("/metrics").await;
    assert_eq!(metric(&text, "orderly_webhook_given_up_total"), 1.0);
}

#[tokio::test]
async fn the_admin_event_list_filters_by_each_delivery_state() {
    let delivered = Receiver::start(vec![]);
    let given_up = Receiver::start(vec![410]);
    let app = spawn_app_with(&FAST_RETRIES).await;
    let p = app.partner_with_balance(10_000).await;
    order(&app, &p, "to-delivered", Some(&delivered.url())).await;
    order(&app, &p, "to-gone", Some(&given_up.url())).await;
    order(&app, &p, "no-callback", None).await;
    until_listed(&app, &p, "delivery=delivered", 1).await;
    until_listed(&app, &p, "delivery=given_up", 1).await;

    for (state, expected) in [
        ("delivered", 1),
        ("given_up", 1),
        ("none", 1),
        ("pending", 0),
        ("retrying", 0),
    ] {
        let (_, body) = events(&app, &p, &format!("delivery={state}")).await;
        let listed = body["events"].as_array().unwrap();
        assert_eq!(listed.len(), expected, "{state}: {body}");
        assert!(listed.iter().all(|e| e["delivery"] == state), "{body}");
        assert!(body["nextCursor"].is_null(), "{body}");
    }
    let (_, all) = events(&app, &p, "").await;
    assert_eq!(all["events"].as_array().unwrap().len(), 3);
}

#[tokio::test]
async fn a_filtered_page_of_one_goes_on_from_its_cursor() {
    let app = spawn_app_with(&FAST_RETRIES).await;
    let p = app.partner_with_balance(10_000).await;
    for i in 0..3 {
        order(&app, &p, &format!("plain-{i}"), None).await;
    }
    until_listed(&app, &p, "delivery=none", 3).await;

    let mut seen = Vec::new();
    let mut query = "delivery=none&limit=1".to_string();
    for _ in 0..5 {
        let (_, body) = events(&app, &p, &query).await;
        seen.extend(
            body["events"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["id"].clone()),
        );
        match body["nextCursor"].as_str() {
            Some(cursor) => query = format!("delivery=none&limit=1&after={cursor}"),
            None => break,
        }
    }
    let (_, all) = events(&app, &p, "").await;
    let every: Vec<Value> = all["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].clone())
        .collect();
    assert_eq!(seen, every);
}

#[tokio::test]
async fn an_unknown_delivery_state_is_a_422_located_at_the_query_parameter() {
    let app = spawn_app_with(&FAST_RETRIES).await;
    let p = app.partner_with_balance(10_000).await;
    let (status, body) = events(&app, &p, "delivery=lost").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        body["detail"][0]["loc"],
        json!(["query", "delivery"]),
        "{body}"
    );
}
