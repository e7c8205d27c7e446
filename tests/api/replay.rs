//! docs/contract.md "2.3 Same key, same request: the same bytes again" and "2.4 The same request means the same fingerprint": replays are byte for byte, conflicts are 409, and the fingerprint
//! covers the normalized basket only.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{basket, spawn_app};

#[tokio::test]
async fn a_replay_returns_identical_bytes_with_the_header_and_charges_once() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(10_000).await;
    let body = basket("prd_uc", 2, "@Player1");

    let first = app.post_order(Some(&p.api_key), Some("k-1"), &body).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert!(first.headers().get("Idempotency-Replayed").is_none());
    let first_type = first.headers()["Content-Type"].clone();
    let first_bytes = first.bytes().await.unwrap();

    let second = app.post_order(Some(&p.api_key), Some("k-1"), &body).await;
    assert_eq!(second.status(), StatusCode::OK);
    assert_eq!(second.headers()["Idempotency-Replayed"], "true");
    assert_eq!(second.headers()["Content-Type"], first_type);
    assert_eq!(second.bytes().await.unwrap(), first_bytes);

    assert_eq!(app.orders(&p.api_key).await.len(), 1);
    assert_eq!(
        app.assert_ledger_matches_balance(&p.api_key).await,
        10_000 - 1998
    );
}

#[tokio::test]
async fn the_first_answer_has_the_documented_shape() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(50_000).await;
    let body = json!({"items": [{"productId": "prd_uc", "quantity": 2, "deliveryData": {"username": "@Player1"}}],
                      "callbackUrl": "https://partner.example.com/hooks/orders", "externalOrderId": "checkout-8812"});
    let resp: Value = app
        .post_order(Some(&p.api_key), Some("shape"), &body)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(resp["success"], true);
    let order = &resp["order"];
    assert!(order["id"].as_str().unwrap().starts_with("ord_"));
    assert_eq!(order["status"], "processing");
    assert_eq!(order["items"][0]["unitPrice"], 999);
    assert_eq!(order["items"][0]["amount"], 1998);
    assert_eq!(order["items"][0]["deliveryData"]["username"], "@Player1");
    assert_eq!(order["total"], 1998);
    assert_eq!(order["currency"], "USD");
    assert_eq!(
        order["callbackUrl"],
        "https://partner.example.com/hooks/orders"
    );
    assert_eq!(order["externalOrderId"], "checkout-8812");
    assert!(order["createdAt"].as_str().unwrap().ends_with('Z'));
    assert_eq!(
        resp["balance"],
        json!({"available": 48002, "creditLimit": 0, "currency": "USD"})
    );
}

#[tokio::test]
async fn at_player1_and_player1_are_the_same_order() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(10_000).await;
    app.post_order(
        Some(&p.api_key),
        Some("k"),
        &basket("prd_uc", 1, "@Player1"),
    )
    .await;
    let again = app
        .post_order(
            Some(&p.api_key),
            Some("k"),
            &basket("prd_uc", 1, " player1 "),
        )
        .await;
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(again.headers()["Idempotency-Replayed"], "true");
    assert_eq!(app.balance(&p.api_key).await, 10_000 - 999);
}

#[tokio::test]
async fn permuted_lines_and_delivery_keys_replay() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(100_000).await;
    app.put_product("prd_two", 100, &[], &["username", "server"], true)
        .await;
    let original = json!({"items": [
        {"productId": "prd_uc", "quantity": 1, "deliveryData": {"username": "a"}},
        {"productId": "prd_uc", "quantity": 3, "deliveryData": {"username": "a"}},
        {"productId": "prd_two", "quantity": 2, "deliveryData": {"username": "b", "server": "eu-1"}}
    ]});
    let permuted = json!({"items": [
        {"productId": "prd_two", "quantity": 2, "deliveryData": {"server": "eu-1", "username": "B"}},
        {"productId": "prd_uc", "quantity": 3, "deliveryData": {"username": "a"}},
        {"productId": "prd_uc", "quantity": 1, "deliveryData": {"username": "@a"}}
    ]});
    let first = app
        .post_order(Some(&p.api_key), Some("perm"), &original)
        .await;
    assert_eq!(first.status(), StatusCode::OK);
    let again = app
        .post_order(Some(&p.api_key), Some("perm"), &permuted)
        .await;
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(again.headers()["Idempotency-Replayed"], "true");
    assert_eq!(app.orders(&p.api_key).await.len(), 1);
}

#[tokio::test]
async fn a_changed_quantity_under_a_used_key_is_a_409_conflict() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(10_000).await;
    app.post_order(Some(&p.api_key), Some("k"), &basket("prd_uc", 1, "p"))
        .await;
    let resp = app
        .post_order(Some(&p.api_key), Some("k"), &basket("prd_uc", 2, "p"))
        .await;
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["success"], false);
    assert!(body["error"]
        .as_str()
        .unwrap()
        .starts_with("idempotency_key_reused_with_different_body: "));
    assert_eq!(app.balance(&p.api_key).await, 10_000 - 999);
}

#[tokio::test]
async fn a_different_valid_callback_url_replays_and_keeps_the_original() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(10_000).await;
    let mut first = basket("prd_uc", 1, "p");
    first["callbackUrl"] = json!("https://first.example.com/hook");
    first["externalOrderId"] = json!("ext-1");
    let mut second = basket("prd_uc", 1, "p");
    second["callbackUrl"] = json!("https://second.example.com/hook");
    second["externalOrderId"] = json!("ext-2");

    let a: Value = app
        .post_order(Some(&p.api_key), Some("cb"), &first)
        .await
        .json()
        .await
        .unwrap();
    let resp = app.post_order(Some(&p.api_key), Some("cb"), &second).await;
    assert_eq!(resp.headers()["Idempotency-Replayed"], "true");
    let b: Value = resp.json().await.unwrap();
    assert_eq!(a, b);
    let id = a["order"]["id"].as_str().unwrap();
    let stored = app.get_json(&p.api_key, &format!("/b2b/orders/{id}")).await;
    assert_eq!(
        stored["order"]["callbackUrl"],
        "https://first.example.com/hook"
    );
}

#[tokio::test]
async fn a_replay_after_repricing_or_deactivation_returns_the_original() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(10_000).await;
    let body = basket("prd_uc", 1, "p");
    let original = app
        .post_order(Some(&p.api_key), Some("k"), &body)
        .await
        .bytes()
        .await
        .unwrap();

    app.put_product("prd_uc", 5_000, &[], &["username"], true)
        .await;
    let repriced = app.post_order(Some(&p.api_key), Some("k"), &body).await;
    assert_eq!(repriced.status(), StatusCode::OK);
    assert_eq!(repriced.bytes().await.unwrap(), original);

    app.put_product("prd_uc", 5_000, &[], &["username"], false)
        .await;
    let deactivated = app.post_order(Some(&p.api_key), Some("k"), &body).await;
    assert_eq!(deactivated.status(), StatusCode::OK);
    assert_eq!(deactivated.bytes().await.unwrap(), original);
    assert_eq!(app.balance(&p.api_key).await, 10_000 - 999);
}

#[tokio::test]
async fn keys_are_per_account() {
    let app = spawn_app().await;
    let a = app.partner_with_balance(10_000).await;
    let b = app.partner_with_balance(10_000).await;
    let ra = app
        .post_order(Some(&a.api_key), Some("shared"), &basket("prd_uc", 1, "x"))
        .await;
    let rb = app
        .post_order(Some(&b.api_key), Some("shared"), &basket("prd_uc", 2, "y"))
        .await;
    assert_eq!(ra.status(), StatusCode::OK);
    assert_eq!(rb.status(), StatusCode::OK);
    assert!(rb.headers().get("Idempotency-Replayed").is_none());
    assert_eq!(app.balance(&a.api_key).await, 10_000 - 999);
    assert_eq!(app.balance(&b.api_key).await, 10_000 - 1998);
}

#[tokio::test]
async fn an_invalid_callback_url_under_a_used_key_is_400_and_leaves_the_key_as_it_was() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(10_000).await;
    let body = basket("prd_uc", 1, "p");
    let original = app
        .post_order(Some(&p.api_key), Some("k"), &body)
        .await
        .bytes()
        .await
        .unwrap();

    for (url, rule) in [
        ("http://127.0.0.1/hook", "loopback"),
        ("ftp://partner.example.com/", "scheme"),
    ] {
        let mut bad = basket("prd_uc", 2, "p");
        bad["callbackUrl"] = json!(url);
        let resp = app.post_order(Some(&p.api_key), Some("k"), &bad).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        let err: Value = resp.json().await.unwrap();
        let text = err["error"].as_str().unwrap();
        assert!(
            text.starts_with("Invalid callbackUrl: ") && text.contains(rule),
            "{text}"
        );
    }

    let replay = app.post_order(Some(&p.api_key), Some("k"), &body).await;
    assert_eq!(replay.headers()["Idempotency-Replayed"], "true");
    assert_eq!(replay.bytes().await.unwrap(), original);
}

#[tokio::test]
async fn an_invalid_callback_url_on_a_fresh_key_creates_nothing() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(10_000).await;
    let mut bad = basket("prd_uc", 1, "p");
    bad["callbackUrl"] = json!("http://2130706433/");
    let resp = app.post_order(Some(&p.api_key), Some("fresh"), &bad).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let good = app
        .post_order(Some(&p.api_key), Some("fresh"), &basket("prd_uc", 3, "p"))
        .await;
    assert_eq!(good.status(), StatusCode::OK);
    assert!(good.headers().get("Idempotency-Replayed").is_none());
}
