//! docs/api.md "Operator routes": the operator's API.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{basket, spawn_app, spawn_app_without_admin, ADMIN_TOKEN};

#[tokio::test]
async fn a_wrong_or_missing_admin_token_is_401() {
    let app = spawn_app().await;
    let missing = app
        .client
        .get(app.url("/admin/accounts/acc_x"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), StatusCode::UNAUTHORIZED);
    let body: Value = missing.json().await.unwrap();
    assert_eq!(
        body,
        json!({"error": "Unauthorized", "message": "Invalid or missing admin token", "code": "INVALID_ADMIN_TOKEN"})
    );
    let wrong = app
        .client
        .get(app.url("/admin/accounts/acc_x"))
        .bearer_auth(format!("{ADMIN_TOKEN}x"))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn without_an_admin_token_every_admin_route_is_404() {
    let app = spawn_app_without_admin().await;
    for (method, path) in [
        (Method::POST, "/admin/accounts"),
        (
            Method::GET,
            "/admin/accounts/acc_0193a0c0000070008000000000000001",
        ),
        (Method::PUT, "/admin/products/prd_x"),
        (Method::DELETE, "/admin/api-keys/key_x"),
        (Method::GET, "/admin/products/prd_x"),
    ] {
        let resp = app
            .client
            .request(method, app.url(path))
            .bearer_auth("anything")
            .json(&json!({"name": "x"}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::NOT_FOUND, "{path}");
    }
}

#[tokio::test]
async fn an_account_is_created_and_read_back_with_its_balance_and_secret() {
    let app = spawn_app().await;
    let id = app.create_account(true, 2500, "EU").await;
    app.credit(&id, 700).await;
    let resp = app
        .admin(Method::GET, &format!("/admin/accounts/{id}"), None)
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let body: Value = resp.json().await.unwrap();
    let account = &body["account"];
    assert_eq!(account["id"], id.as_str());
    assert_eq!(account["balance"], 700);
    assert_eq!(account["creditLimit"], 2500);
    assert_eq!(account["wholesale"], true);
    assert_eq!(account["region"], "EU");
    assert!(account["webhookSecret"]
        .as_str()
        .unwrap()
        .starts_with("whsec_"));
}

#[tokio::test]
async fn an_unknown_account_is_404_account_not_found() {
    let app = spawn_app().await;
    let resp = app
        .admin(
            Method::GET,
            "/admin/accounts/acc_0193a0c0000070008000000000000999",
            None,
        )
        .await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let body: Value = resp.json().await.unwrap();
    assert!(body["error"]
        .as_str()
        .unwrap()
        .starts_with("account_not_found: "));
}

#[tokio::test]
async fn a_revoked_key_answers_401_from_then_on() {
    let app = spawn_app().await;
    let account = app.create_account(true, 0, "EU").await;
    let resp = app
        .admin(
            Method::POST,
            &format!("/admin/accounts/{account}/api-keys"),
            Some(json!({"scopes": ["balance:read"]})),
        )
        .await;
    let body: Value = resp.json().await.unwrap();
    let key = body["apiKey"]["key"].as_str().unwrap().to_string();
    let key_id = body["apiKey"]["id"].as_str().unwrap().to_string();
    assert!(key.starts_with("gc_live_") && key.len() == 40);
    assert_eq!(body["apiKey"]["scopes"], json!(["balance:read"]));
    assert_eq!(app.balance(&key).await, 0);

    let revoked = app
        .admin(Method::DELETE, &format!("/admin/api-keys/{key_id}"), None)
        .await;
    assert_eq!(revoked.status(), StatusCode::OK);
    let after = app.get(&key, "/b2b/balance").await;
    assert_eq!(after.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn an_admin_credit_requires_a_key_and_replays_without_crediting_twice() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(0).await;
    let path = format!("/admin/accounts/{}/credits", p.account_id);
    let send = |key: Option<&'static str>, amount: i64| {
        let mut req = app
            .client
            .post(app.url(&path))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({"amount": amount, "reason": "wire 2211"}));
        if let Some(k) = key {
            req = req.header("X-Idempotency-Key", k);
        }
        req.send()
    };
    let missing = send(None, 50_000).await.unwrap();
    assert_eq!(missing.status(), StatusCode::BAD_REQUEST);
    let first = send(Some("wire-2211"), 50_000).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let first_body: Value = first.json().await.unwrap();
    assert_eq!(first_body["balance"]["available"], 50_000);
    let again = send(Some("wire-2211"), 50_000).await.unwrap();
    assert_eq!(again.headers()["Idempotency-Replayed"], "true");
    let other_amount = send(Some("wire-2211"), 10).await.unwrap();
    assert_eq!(other_amount.status(), StatusCode::CONFLICT);
    assert_eq!(app.assert_ledger_matches_balance(&p.api_key).await, 50_000);
}

#[tokio::test]
async fn a_credit_to_an_unknown_account_is_404_even_without_a_key() {
    let app = spawn_app().await;
    let resp = app
        .admin(
            Method::POST,
            "/admin/accounts/acc_0193a0c0000070008000000000000999/credits",
            Some(json!({"amount": 5})),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let body: Value = resp.json().await.unwrap();
    assert!(body["error"]
        .as_str()
        .unwrap()
        .starts_with("account_not_found: "));
}

#[tokio::test]
async fn a_product_price_outside_the_bounds_is_422() {
    let app = spawn_app().await;
    for price in [-1i64, 1_000_000_000_001] {
        let resp = app
            .admin(
                Method::PUT,
                "/admin/products/prd_x",
                Some(json!({"name": "x", "price": price})),
            )
            .await;
        assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY, "{price}");
    }
}

#[tokio::test]
async fn a_product_region_lock_applies_to_accounts_outside_it() {
    let app = spawn_app().await;
    app.put_product("prd_eu", 100, &["EU"], &[], true).await;
    let us = app.create_account(true, 0, "US").await;
    app.credit(&us, 1_000).await;
    let key = app.create_key(&us, &["orders:write"]).await;
    let resp = app
        .post_order(Some(&key), Some("k"), &basket("prd_eu", 1, "x"))
        .await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let body: Value = resp.json().await.unwrap();
    assert!(body["error"]
        .as_str()
        .unwrap()
        .starts_with("region_not_allowed: "));

    let eu = app.create_account(true, 0, "EU").await;
    app.credit(&eu, 1_000).await;
    let eu_key = app.create_key(&eu, &["orders:write"]).await;
    let ok = app
        .post_order(Some(&eu_key), Some("k"), &basket("prd_eu", 1, "x"))
        .await;
    assert_eq!(ok.status(), StatusCode::OK);
}
