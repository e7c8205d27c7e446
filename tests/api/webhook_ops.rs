//! docs/contract.md "7. Webhooks", webhook operations: a receiver's 410 stops the delivery, given-up
//! deliveries are counted and found by the admin list's `delivery=` filter, a secret rotates
//! with an overlap in which both sign, and any delivery can be redelivered or recovered.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{metric, spawn_app_with, Partner, TestApp};
use crate::receiver::{Received, Receiver};

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

/// The account's current webhook secret, as the admin API shows it.
async fn current_secret(app: &TestApp, p: &Partner) -> String {
    let path = format!("/admin/accounts/{}", p.account_id);
    let body: Value = app
        .admin(Method::GET, &path, None)
        .await
        .json()
        .await
        .unwrap();
    body["account"]["webhookSecret"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Rotates the account's secret; returns the answer's body.
async fn rotate(app: &TestApp, p: &Partner) -> Value {
    let path = format!("/admin/accounts/{}/webhook-secret", p.account_id);
    let resp = app.admin(Method::POST, &path, None).await;
    assert_eq!(resp.status(), StatusCode::OK);
    resp.json().await.unwrap()
}

/// The space-separated signatures of a delivery, in order.
fn signatures(delivery: &Received) -> Vec<String> {
    let header = delivery.header("webhook-signature").unwrap();
    header.split(' ').map(str::to_string).collect()
}

/// POSTs with no body as the operator, or as the partner when `api_key` is given.
async fn post_empty(app: &TestApp, api_key: Option<&str>, path: &str) -> (StatusCode, Value) {
    let resp = match api_key {
        Some(key) => {
            let req = app.client.post(app.url(path)).header("X-Api-Key", key);
            req.send().await.unwrap()
        }
        None => app.admin(Method::POST, path, None).await,
    };
    (resp.status(), resp.json().await.unwrap())
}

/// The one event of the account listed in `state` (waits for it, bounded).
async fn the_event_in(app: &TestApp, p: &Partner, state: &str) -> Value {
    let listed = until_listed(app, p, &format!("delivery={state}"), 1).await;
    let events = listed["events"].as_array().unwrap();
    assert_eq!(events.len(), 1, "{state}: {listed}");
    events[0].clone()
}

#[tokio::test]
async fn during_the_overlap_a_delivery_is_signed_by_the_new_secret_then_the_old_one() {
    let receiver = Receiver::start(vec![]);
    let app = spawn_app_with(&FAST_RETRIES).await;
    let p = app.partner_with_balance(10_000).await;
    let old = current_secret(&app, &p).await;
    let rotated = rotate(&app, &p).await;
    let new = rotated["webhookSecret"].as_str().unwrap().to_string();
    assert!(new.starts_with("whsec_") && new != old, "{rotated}");
    assert!(rotated["previousSecretValidUntil"].is_string(), "{rotated}");
    assert_eq!(
        current_secret(&app, &p).await,
        new,
        "the account shows the new secret only"
    );

    order(&app, &p, "overlap", Some(&receiver.url())).await;
    let got = receiver.wait_for(1, Duration::from_secs(10)).await;
    let delivery = &got[0];
    assert_eq!(
        signatures(delivery),
        [delivery.signed_by(&new), delivery.signed_by(&old)]
    );
}

#[tokio::test]
async fn after_the_overlap_only_the_new_secret_signs() {
    let receiver = Receiver::start(vec![]);
    // The delivery goes out 1.5 s after the order, past a 1 s overlap.
    let app = spawn_app_with(&[
        "--fulfillment-delay",
        "1500ms",
        "--allow-private-callbacks",
        "--webhook-secret-overlap",
        "1s",
    ])
    .await;
    let p = app.partner_with_balance(10_000).await;
    let new = rotate(&app, &p).await["webhookSecret"]
        .as_str()
        .unwrap()
        .to_string();
    order(&app, &p, "after-overlap", Some(&receiver.url())).await;
    let got = receiver.wait_for(1, Duration::from_secs(10)).await;
    assert_eq!(signatures(&got[0]), [got[0].signed_by(&new)]);
}

#[tokio::test]
async fn a_second_rotation_within_the_overlap_drops_the_oldest_secret() {
    let receiver = Receiver::start(vec![]);
    let app = spawn_app_with(&FAST_RETRIES).await;
    let p = app.partner_with_balance(10_000).await;
    let first = current_secret(&app, &p).await;
    let second = rotate(&app, &p).await["webhookSecret"]
        .as_str()
        .unwrap()
        .to_string();
    let third = rotate(&app, &p).await["webhookSecret"]
        .as_str()
        .unwrap()
        .to_string();
    order(&app, &p, "twice", Some(&receiver.url())).await;
    let got = receiver.wait_for(1, Duration::from_secs(10)).await;
    let delivery = &got[0];
    assert_eq!(
        signatures(delivery),
        [delivery.signed_by(&third), delivery.signed_by(&second)]
    );
    assert!(!signatures(delivery).contains(&delivery.signed_by(&first)));
}

#[tokio::test]
async fn rotating_the_secret_of_an_unknown_account_is_a_404() {
    let app = spawn_app_with(&FAST_RETRIES).await;
    let path = "/admin/accounts/acc_0190d2c4a5a87a3c9e5b6f1d2c3b4a59/webhook-secret";
    let (status, body) = post_empty(&app, None, path).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .starts_with("account_not_found: "),
        "{body}"
    );
}

#[tokio::test]
async fn a_redelivery_sends_the_same_webhook_id_and_body_again_and_is_logged() {
    let receiver = Receiver::start(vec![]);
    let app = spawn_app_with(&FAST_RETRIES).await;
    let p = app.partner_with_balance(10_000).await;
    order(&app, &p, "again", Some(&receiver.url())).await;
    let event = the_event_in(&app, &p, "delivered").await;
    let id = event["id"].as_str().unwrap();

    let (status, body) = post_empty(&app, None, &format!("/admin/events/{id}/redeliver")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!({"success": true, "delivery": "pending"}));
    let got = receiver.wait_for(2, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 2);
    assert_eq!(got[1].header("webhook-id"), Some(id));
    assert_eq!(got[1].body, got[0].body);

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let event = the_event_in(&app, &p, "delivered").await;
        let deliveries = event["deliveries"].as_array().unwrap();
        if deliveries.len() == 2 {
            assert_eq!(deliveries[1]["attempt"], 2, "{event}");
            assert_eq!(deliveries[1]["status"], 200, "{event}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the redelivery is not logged: {event}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_given_up_delivery_redelivered_by_its_partner_is_delivered() {
    let receiver = Receiver::start(vec![410]);
    let app = spawn_app_with(&FAST_RETRIES).await;
    let p = app.partner_with_balance(10_000).await;
    order(&app, &p, "gone-then-back", Some(&receiver.url())).await;
    let event = the_event_in(&app, &p, "given_up").await;
    let id = event["id"].as_str().unwrap();

    let path = format!("/b2b/events/{id}/redeliver");
    let (status, body) = post_empty(&app, Some(&p.api_key), &path).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["delivery"], "pending");
    let delivered = the_event_in(&app, &p, "delivered").await;
    assert_eq!(delivered["id"], id);
    assert_eq!(receiver.wait_for(2, Duration::from_secs(5)).await.len(), 2);
}

#[tokio::test]
async fn a_partner_redelivering_another_accounts_event_gets_a_404() {
    let receiver = Receiver::start(vec![]);
    let app = spawn_app_with(&FAST_RETRIES).await;
    let owner = app.partner_with_balance(10_000).await;
    let other = app.partner_with_balance(10_000).await;
    order(&app, &owner, "mine", Some(&receiver.url())).await;
    let event = the_event_in(&app, &owner, "delivered").await;
    let path = format!("/b2b/events/{}/redeliver", event["id"].as_str().unwrap());

    let (status, body) = post_empty(&app, Some(&other.api_key), &path).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .starts_with("event_not_found: "),
        "{body}"
    );
    let unknown = "/b2b/events/evt_0190d2c4a5a87a3c9e5b6f1d2c3b4a59/redeliver";
    let (status, _) = post_empty(&app, Some(&owner.api_key), unknown).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // Nothing was sent for the refused request.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        receiver.wait_for(2, Duration::from_millis(10)).await.len(),
        1
    );
}

#[tokio::test]
async fn redelivering_an_event_without_a_callback_url_is_a_409() {
    let app = spawn_app_with(&FAST_RETRIES).await;
    let p = app.partner_with_balance(10_000).await;
    order(&app, &p, "no-url", None).await;
    let event = the_event_in(&app, &p, "none").await;
    let id = event["id"].as_str().unwrap();
    for api_key in [None, Some(p.api_key.as_str())] {
        let path = match api_key {
            None => format!("/admin/events/{id}/redeliver"),
            Some(_) => format!("/b2b/events/{id}/redeliver"),
        };
        let (status, body) = post_empty(&app, api_key, &path).await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        assert!(
            body["error"]
                .as_str()
                .unwrap()
                .starts_with("no_callback_url: "),
            "{body}"
        );
    }
}

/// Now as RFC 3339 with milliseconds.
fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

#[tokio::test]
async fn recover_requeues_exactly_the_deliveries_given_up_since_the_time_given() {
    // Both first deliveries are refused with a 410; everything after is taken.
    let receiver = Receiver::start(vec![410, 410]);
    let app = spawn_app_with(&FAST_RETRIES).await;
    let p = app.partner_with_balance(10_000).await;
    order(&app, &p, "before", Some(&receiver.url())).await;
    the_event_in(&app, &p, "given_up").await;
    let since = now_rfc3339();
    tokio::time::sleep(Duration::from_millis(5)).await;
    order(&app, &p, "after", Some(&receiver.url())).await;
    until_listed(&app, &p, "delivery=given_up", 2).await;

    let path = format!("/admin/accounts/{}/deliveries/recover", p.account_id);
    let resp = app
        .admin(Method::POST, &path, Some(json!({"since": since})))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body, json!({"success": true, "requeued": 1}));
    let got = receiver.wait_for(3, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 3);
    assert_eq!(got[2].header("webhook-id"), got[1].header("webhook-id"));
    let delivered = the_event_in(&app, &p, "delivered").await;
    assert_eq!(delivered["id"].as_str(), got[1].header("webhook-id"));
    let still_given_up = the_event_in(&app, &p, "given_up").await;
    assert_eq!(still_given_up["id"].as_str(), got[0].header("webhook-id"));
}

#[tokio::test]
async fn recover_without_an_rfc_3339_since_is_a_422_at_the_field() {
    let app = spawn_app_with(&FAST_RETRIES).await;
    let p = app.partner_with_balance(10_000).await;
    let path = format!("/admin/accounts/{}/deliveries/recover", p.account_id);
    for body in [json!({"since": "yesterday"}), json!({})] {
        let resp = app.admin(Method::POST, &path, Some(body.clone())).await;
        assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        let answer: Value = resp.json().await.unwrap();
        assert_eq!(
            answer["detail"][0]["loc"],
            json!(["body", "since"]),
            "{answer}"
        );
    }
}
