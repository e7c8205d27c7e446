//! docs/contract.md "3. The order of checks": auth, then schema, then the idempotency key; a refused call changes nothing.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{basket, spawn_app, TestApp};

async fn snapshot(app: &TestApp, key: &str) -> (i64, usize, usize) {
    (
        app.balance(key).await,
        app.ledger(key).await.len(),
        app.orders(key).await.len(),
    )
}

#[tokio::test]
async fn no_api_key_and_no_idempotency_key_is_401_and_changes_nothing() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(10_000).await;
    let before = snapshot(&app, &p.api_key).await;

    let resp = app.post_order(None, None, &basket("prd_uc", 1, "p")).await;

    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(
        body,
        json!({"error": "Unauthorized", "message": "Invalid or missing API key", "code": "INVALID_API_KEY"})
    );
    assert_eq!(snapshot(&app, &p.api_key).await, before);
}

#[tokio::test]
async fn a_bad_body_without_an_idempotency_key_is_422_and_changes_nothing() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(10_000).await;
    let before = snapshot(&app, &p.api_key).await;
    let bad =
        json!({"items": [{"productId": "prd_uc", "quantity": 1, "deliveryData": {"username": 5}}]});

    let resp = app.post_order(Some(&p.api_key), None, &bad).await;

    assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let body: Value = resp.json().await.unwrap();
    assert!(body.get("success").is_none());
    assert_eq!(
        body["detail"][0]["loc"],
        json!(["body", "items", 0, "deliveryData", "username"])
    );
    assert_eq!(snapshot(&app, &p.api_key).await, before);
}

#[tokio::test]
async fn a_valid_body_without_an_idempotency_key_is_400_with_the_exact_string() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(10_000).await;
    let before = snapshot(&app, &p.api_key).await;

    let resp = app
        .post_order(Some(&p.api_key), None, &basket("prd_uc", 1, "p"))
        .await;

    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(
        body,
        json!({"success": false, "error": "X-Idempotency-Key header is required", "code": "IDEMPOTENCY_KEY_REQUIRED"})
    );
    assert_eq!(snapshot(&app, &p.api_key).await, before);
}

#[tokio::test]
async fn a_blank_idempotency_key_is_the_missing_key_400() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(10_000).await;
    let resp = app
        .post_order(Some(&p.api_key), Some("   "), &basket("prd_uc", 1, "p"))
        .await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"], "X-Idempotency-Key header is required");
}

#[tokio::test]
async fn a_key_with_a_space_or_over_255_characters_is_invalid() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(10_000).await;
    for bad in ["has space".to_string(), "k".repeat(256)] {
        let resp = app
            .post_order(Some(&p.api_key), Some(&bad), &basket("prd_uc", 1, "p"))
            .await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        let body: Value = resp.json().await.unwrap();
        assert!(
            body["error"]
                .as_str()
                .unwrap()
                .starts_with("invalid_idempotency_key: "),
            "{body}"
        );
    }
    assert_eq!(app.balance(&p.api_key).await, 10_000);
}

#[tokio::test]
async fn the_ietf_idempotency_key_header_is_accepted_and_replays() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(10_000).await;
    let send = || {
        app.client
            .post(app.url("/b2b/orders"))
            .header("X-Api-Key", &p.api_key)
            .header("Idempotency-Key", "ietf-1")
            .json(&basket("prd_uc", 1, "p"))
            .send()
    };
    assert_eq!(send().await.unwrap().status(), StatusCode::OK);
    let again = send().await.unwrap();
    assert_eq!(again.headers()["Idempotency-Replayed"], "true");
    assert_eq!(app.balance(&p.api_key).await, 10_000 - 999);
}

#[tokio::test]
async fn two_key_headers_with_different_values_are_invalid() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(10_000).await;
    let resp = app
        .client
        .post(app.url("/b2b/orders"))
        .header("X-Api-Key", &p.api_key)
        .header("X-Idempotency-Key", "a")
        .header("Idempotency-Key", "b")
        .json(&basket("prd_uc", 1, "p"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let body: Value = resp.json().await.unwrap();
    assert!(body["error"]
        .as_str()
        .unwrap()
        .starts_with("invalid_idempotency_key: "));
}

#[tokio::test]
async fn a_retail_account_is_403_without_success() {
    let app = spawn_app().await;
    let account = app.create_account(false, 0, "EU").await;
    let key = app.create_key(&account, &["orders:write"]).await;
    let resp = app
        .post_order(Some(&key), Some("k"), &basket("prd_uc", 1, "p"))
        .await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"], "Forbidden");
    assert!(body.get("success").is_none());
}

#[tokio::test]
async fn a_key_without_the_scope_is_403() {
    let app = spawn_app().await;
    let account = app.create_account(true, 0, "EU").await;
    let key = app.create_key(&account, &["orders:read"]).await;
    let resp = app
        .post_order(Some(&key), Some("k"), &basket("prd_uc", 1, "p"))
        .await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let resp = app.get(&key, "/b2b/balance").await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn a_malformed_or_unknown_api_key_is_401() {
    let app = spawn_app().await;
    for key in ["nonsense", "gc_live_ffffffffffffffffffffffffffffffff"] {
        let resp = app
            .post_order(Some(key), Some("k"), &basket("prd_uc", 1, "p"))
            .await;
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    }
}

#[tokio::test]
async fn an_api_key_in_the_query_string_is_not_accepted() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(0).await;
    let resp = app
        .client
        .get(app.url(&format!(
            "/b2b/balance?api_key={0}&X-Api-Key={0}",
            p.api_key
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn malformed_json_and_a_wrong_content_type_are_422() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(0).await;
    let send = |content_type: &'static str, body: &'static str| {
        app.client
            .post(app.url("/b2b/orders"))
            .header("X-Api-Key", &p.api_key)
            .header("X-Idempotency-Key", "k")
            .header("Content-Type", content_type)
            .body(body)
            .send()
    };
    let malformed = send("application/json", "{\"items\": [").await.unwrap();
    assert_eq!(malformed.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let wrong_type = send("text/plain", "{\"items\":[]}").await.unwrap();
    assert_eq!(wrong_type.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let body: Value = wrong_type.json().await.unwrap();
    assert!(body["detail"].is_array());
}

#[tokio::test]
async fn schema_violations_name_their_field() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(0).await;
    let cases = [
        (json!({}), json!(["body", "items"])),
        (json!({"items": []}), json!(["body", "items"])),
        (
            json!({"items": [{"productId": "prd_uc", "quantity": 0}]}),
            json!(["body", "items", 0, "quantity"]),
        ),
        (
            json!({"items": [{"productId": "prd_uc", "quantity": 1_000_001}]}),
            json!(["body", "items", 0, "quantity"]),
        ),
        (
            json!({"items": [{"productId": "prd_uc", "quantity": "1"}]}),
            json!(["body", "items", 0, "quantity"]),
        ),
        (
            json!({"items": [{"productId": "", "quantity": 1}]}),
            json!(["body", "items", 0, "productId"]),
        ),
        (
            json!({"items": [{"productId": "p".repeat(65), "quantity": 1}]}),
            json!(["body", "items", 0, "productId"]),
        ),
        (
            json!({"items": [{"productId": "prd_uc", "quantity": 1}], "externalOrderId": "x".repeat(129)}),
            json!(["body", "externalOrderId"]),
        ),
        (
            json!({"items": [{"productId": "prd_uc", "quantity": 1}], "callbackUrl": format!("https://a.example/{}", "x".repeat(2048))}),
            json!(["body", "callbackUrl"]),
        ),
    ];
    for (body, loc) in cases {
        let resp = app.post_order(Some(&p.api_key), Some("k"), &body).await;
        assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        let detail: Value = resp.json().await.unwrap();
        assert_eq!(detail["detail"][0]["loc"], loc, "{body}");
    }
}

#[tokio::test]
async fn a_body_over_one_mebibyte_is_a_422_that_says_so() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(0).await;
    let huge = format!("{{\"items\":[],\"pad\":\"{}\"}}", "x".repeat(1_100_000));
    let resp = app
        .client
        .post(app.url("/b2b/orders"))
        .header("X-Api-Key", &p.api_key)
        .header("X-Idempotency-Key", "k")
        .header("Content-Type", "application/json")
        .body(huge)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let body: Value = resp.json().await.unwrap();
    assert!(
        body.to_string().contains("the body is larger than 1 MiB"),
        "{body}"
    );
}
