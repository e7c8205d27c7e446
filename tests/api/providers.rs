//! docs/contract.md "4.7 A provider payment credits once": provider notifications credit exactly once, however often they arrive.

use futures::future::join_all;
use hmac::{Hmac, Mac};
use reqwest::StatusCode;
use serde_json::{json, Value};
use sha2::Sha256;

use crate::helpers::{spawn_app_with, TestApp};

pub(crate) const SECRET: &str = "provider-secret-1";

pub(crate) fn signature(body: &[u8]) -> String {
    signature_with(SECRET, body)
}

/// `sha256=<hex HMAC-SHA256(secret, body)>`, as a provider signs.
pub(crate) fn signature_with(secret: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(body);
    let hex: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256={hex}")
}

pub(crate) async fn notify(
    app: &TestApp,
    provider: &str,
    body: &[u8],
    signature: &str,
) -> reqwest::Response {
    app.client
        .post(app.url(&format!("/webhooks/providers/{provider}")))
        .header("Content-Type", "application/json")
        .header("X-Signature", signature)
        .body(body.to_vec())
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_concurrent_copies_of_a_notification_credit_once() {
    let app = spawn_app_with(&["--provider-secret", &format!("acmepay={SECRET}")]).await;
    let p = app.partner_with_balance(0).await;
    let body = serde_json::to_vec(&json!({"id": "pay_001", "type": "payment.succeeded", "accountId": p.account_id, "amount": 5000, "currency": "USD"})).unwrap();
    let sig = signature(&body);

    let responses = join_all((0..20).map(|_| notify(&app, "acmepay", &body, &sig))).await;

    let mut duplicates = 0;
    for resp in responses {
        assert_eq!(resp.status(), StatusCode::OK);
        let answer: Value = resp.json().await.unwrap();
        assert_eq!(answer["success"], true);
        if answer["duplicate"] == true {
            duplicates += 1;
        }
    }
    assert_eq!(duplicates, 19);
    assert_eq!(app.assert_ledger_matches_balance(&p.api_key).await, 5000);
    let ledger = app.ledger(&p.api_key).await;
    assert_eq!(ledger[0]["reason"], "provider_payment");
    assert_eq!(ledger[0]["reference"], "pay_001");
}

#[tokio::test]
async fn a_bad_signature_is_401_and_credits_nothing() {
    let app = spawn_app_with(&["--provider-secret", &format!("acmepay={SECRET}")]).await;
    let p = app.partner_with_balance(0).await;
    let body = serde_json::to_vec(&json!({"id": "pay_002", "type": "payment.succeeded", "accountId": p.account_id, "amount": 5000, "currency": "USD"})).unwrap();
    let forged = signature(b"something else");
    let resp = notify(&app, "acmepay", &body, &forged).await;
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    let missing = app
        .client
        .post(app.url("/webhooks/providers/acmepay"))
        .header("Content-Type", "application/json")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(app.balance(&p.api_key).await, 0);
    // The genuine notification still credits afterwards.
    let ok = notify(&app, "acmepay", &body, &signature(&body)).await;
    let answer: Value = ok.json().await.unwrap();
    assert_eq!(answer, json!({"success": true, "duplicate": false}));
}

#[tokio::test]
async fn an_unknown_provider_is_404() {
    let app = spawn_app_with(&["--provider-secret", &format!("acmepay={SECRET}")]).await;
    let body = b"{}";
    let resp = notify(&app, "otherpay", body, &signature(body)).await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_payment_past_an_admin_credits_bound_is_422_and_credits_nothing() {
    let app = spawn_app_with(&["--provider-secret", &format!("acmepay={SECRET}")]).await;
    let account = app.create_account(true, 0, "EU").await;
    let key = app.create_key(&account, &["balance:read"]).await;
    for (i, amount) in [1_000_000_000_001_i64, i64::MAX - 1, i64::MAX]
        .into_iter()
        .enumerate()
    {
        let body = json!({"id": format!("big-{i}"), "type": "payment.succeeded",
            "accountId": account, "amount": amount, "currency": "USD"});
        let body = serde_json::to_vec(&body).unwrap();
        let resp = notify(&app, "acmepay", &body, &signature(&body)).await;
        assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY, "{amount}");
        let refusal: Value = resp.json().await.unwrap();
        assert_eq!(
            refusal["detail"][0]["loc"],
            json!(["body", "amount"]),
            "{refusal}"
        );
    }
    assert_eq!(app.balance(&key).await, 0);
    let body = json!({"id": "largest", "type": "payment.succeeded",
        "accountId": account, "amount": 1_000_000_000_000_i64, "currency": "USD"});
    let body = serde_json::to_vec(&body).unwrap();
    let resp = notify(&app, "acmepay", &body, &signature(&body)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(app.balance(&key).await, 1_000_000_000_000);
}
