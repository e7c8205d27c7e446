//! docs/api.md "POST /b2b/orders".5: the 402s roll everything back and leave the key free.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{basket, spawn_app};

#[tokio::test]
async fn a_402_then_a_top_up_then_the_same_request_and_key_succeeds() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(500).await;
    let body = basket("prd_uc", 1, "p");

    let refused = app.post_order(Some(&p.api_key), Some("k"), &body).await;
    assert_eq!(refused.status(), StatusCode::PAYMENT_REQUIRED);
    let err: Value = refused.json().await.unwrap();
    assert_eq!(
        err,
        json!({"success": false, "error": "Insufficient balance", "code": "INSUFFICIENT_BALANCE"})
    );
    assert_eq!(app.orders(&p.api_key).await.len(), 0);

    app.credit(&p.account_id, 1_000).await;
    let ok = app.post_order(Some(&p.api_key), Some("k"), &body).await;
    assert_eq!(ok.status(), StatusCode::OK);
    assert!(ok.headers().get("Idempotency-Replayed").is_none());
    assert_eq!(
        app.assert_ledger_matches_balance(&p.api_key).await,
        1_500 - 999
    );
}

#[tokio::test]
async fn a_402_then_a_different_basket_under_the_same_key_is_a_new_order_not_a_conflict() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(1_000).await;
    let big = app
        .post_order(Some(&p.api_key), Some("k"), &basket("prd_uc", 5, "p"))
        .await;
    assert_eq!(big.status(), StatusCode::PAYMENT_REQUIRED);
    let small = app
        .post_order(Some(&p.api_key), Some("k"), &basket("prd_uc", 1, "p"))
        .await;
    assert_eq!(small.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_credit_line_may_be_used_and_past_it_is_exceeds_credit_limit() {
    let app = spawn_app().await;
    app.put_product("prd_uc", 999, &[], &["username"], true)
        .await;
    let account = app.create_account(true, 1_500, "EU").await;
    let key = app
        .create_key(&account, &["orders:write", "balance:read"])
        .await;

    let within = app
        .post_order(Some(&key), Some("a"), &basket("prd_uc", 1, "p"))
        .await;
    assert_eq!(within.status(), StatusCode::OK);
    let body: Value = within.json().await.unwrap();
    assert_eq!(
        body["balance"],
        json!({"available": -999, "creditLimit": 1500, "currency": "USD"})
    );

    let past = app
        .post_order(Some(&key), Some("b"), &basket("prd_uc", 1, "p"))
        .await;
    assert_eq!(past.status(), StatusCode::PAYMENT_REQUIRED);
    let err: Value = past.json().await.unwrap();
    assert_eq!(
        err,
        json!({"success": false, "error": "Exceeds credit limit", "code": "EXCEEDS_CREDIT_LIMIT"})
    );
    assert_eq!(app.balance(&key).await, -999);
}
