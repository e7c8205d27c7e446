//! docs/api.md "Errors", machine codes and request ids: every refusal carries a `code` a program can
//! branch on, after the fields the seeds fix (whose bytes, prefix first, stay as they were);
//! every answer carries a `Request-Id` of its own, written on that request's log line.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{basket, spawn_app, spawn_app_logging, spawn_app_with, TestApp};

/// The status, the body as text, and its `code`.
async fn refusal(response: reqwest::Response) -> (StatusCode, String, String) {
    let status = response.status();
    let text = response.text().await.unwrap();
    let body: Value = serde_json::from_str(&text).unwrap();
    let code = body["code"].as_str().unwrap_or("").to_string();
    (status, text, code)
}

#[tokio::test]
async fn each_business_refusal_carries_its_code_after_the_fields_it_always_had() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(1_000).await;
    let order = |key: &'static str, body: Value| {
        let app = &app;
        let api_key = p.api_key.clone();
        async move { app.post_order(Some(&api_key), Some(key), &body).await }
    };
    let cases: Vec<(reqwest::Response, StatusCode, &str, &str)> = vec![
        (
            order("k1", basket("prd_uc", 1, "p")).await,
            StatusCode::OK,
            "",
            "",
        ),
        (
            order("k1", basket("prd_uc", 2, "p")).await,
            StatusCode::CONFLICT,
            r#"{"success":false,"error":"idempotency_key_reused_with_different_body: "#,
            "IDEMPOTENCY_KEY_REUSED",
        ),
        (
            order("k2", basket("prd_uc", 50, "p")).await,
            StatusCode::PAYMENT_REQUIRED,
            r#"{"success":false,"error":"Insufficient balance""#,
            "INSUFFICIENT_BALANCE",
        ),
        (
            order("k3", basket("prd_nope", 1, "p")).await,
            StatusCode::BAD_REQUEST,
            r#"{"success":false,"error":"unknown_product: "#,
            "UNKNOWN_PRODUCT",
        ),
        (
            app.post_order(Some(&p.api_key), None, &basket("prd_uc", 1, "p"))
                .await,
            StatusCode::BAD_REQUEST,
            r#"{"success":false,"error":"X-Idempotency-Key header is required""#,
            "IDEMPOTENCY_KEY_REQUIRED",
        ),
        (
            app.get(
                &p.api_key,
                "/b2b/orders/ord_00000000000000000000000000000000",
            )
            .await,
            StatusCode::NOT_FOUND,
            r#"{"success":false,"error":"order_not_found: "#,
            "ORDER_NOT_FOUND",
        ),
        (
            app.get(&p.api_key, "/b2b/nowhere").await,
            StatusCode::NOT_FOUND,
            r#"{"success":false,"error":"not_found: no such route""#,
            "ROUTE_NOT_FOUND",
        ),
        (
            app.client
                .delete(app.url("/b2b/balance"))
                .header("X-Api-Key", &p.api_key)
                .send()
                .await
                .unwrap(),
            StatusCode::METHOD_NOT_ALLOWED,
            r#"{"success":false,"error":"method_not_allowed: "#,
            "METHOD_NOT_ALLOWED",
        ),
    ];
    for (response, status, prefix, code) in cases {
        let (got, text, got_code) = refusal(response).await;
        assert_eq!(got, status, "{text}");
        if status == StatusCode::OK {
            assert_eq!(got_code, "", "a success carries no code");
            continue;
        }
        assert!(text.starts_with(prefix), "{text}");
        assert_eq!(got_code, code, "{text}");
        assert!(
            text.ends_with(&format!(r#","code":"{code}"}}"#)),
            "the code comes last: {text}"
        );
    }
}

#[tokio::test]
async fn the_auth_and_scope_refusals_carry_their_codes_in_the_auth_envelope() {
    let app = spawn_app().await;
    let retail = app.create_account(false, 0, "EU").await;
    let retail_key = app.create_key(&retail, &["balance:read"]).await;
    let p = app.partner_with_balance(1_000).await;
    let narrow = app.create_key(&p.account_id, &["catalog:read"]).await;
    let cases = [
        (
            app.get("gc_live_00000000000000000000000000000000", "/b2b/balance")
                .await,
            json!({"error": "Unauthorized", "message": "Invalid or missing API key", "code": "INVALID_API_KEY"}),
        ),
        (
            app.get(&retail_key, "/b2b/balance").await,
            json!({"error": "Forbidden", "message": "Account is not enabled for wholesale orders", "code": "NOT_WHOLESALE"}),
        ),
        (
            app.get(&narrow, "/b2b/balance").await,
            json!({"error": "Forbidden", "message": "API key scope does not cover this endpoint", "code": "SCOPE_MISSING"}),
        ),
        (
            app.client
                .get(app.url("/admin/accounts"))
                .bearer_auth("not-the-token")
                .send()
                .await
                .unwrap(),
            json!({"error": "Unauthorized", "message": "Invalid or missing admin token", "code": "INVALID_ADMIN_TOKEN"}),
        ),
    ];
    for (response, expected) in cases {
        let body: Value = response.json().await.unwrap();
        assert_eq!(body, expected);
        assert!(body.get("success").is_none());
    }
}

#[tokio::test]
async fn a_write_from_a_disallowed_origin_carries_its_code() {
    let app = spawn_app_with(&["--allowed-origins", "https://shop.example"]).await;
    let p = app.partner_with_balance(1_000).await;
    let response = app
        .client
        .post(app.url("/b2b/orders"))
        .header("X-Api-Key", &p.api_key)
        .header("X-Idempotency-Key", "o1")
        .header("Origin", "https://evil.example")
        .json(&basket("prd_uc", 1, "p"))
        .send()
        .await
        .unwrap();
    let (status, text, code) = refusal(response).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(
        text,
        r#"{"success":false,"error":"Forbidden: Origin not allowed","code":"ORIGIN_NOT_ALLOWED"}"#
    );
    assert_eq!(code, "ORIGIN_NOT_ALLOWED");
}

#[tokio::test]
async fn the_422_and_the_429_keep_the_bodies_the_seeds_fix() {
    let app = spawn_app_with(&["--rate-limit", "30"]).await;
    let p = app.partner_with_balance(1_000).await;
    let bad = json!({"items": [{"productId": "prd_uc", "quantity": "one"}]});
    let body: Value = app
        .post_order(Some(&p.api_key), Some("v1"), &bad)
        .await
        .json()
        .await
        .unwrap();
    assert!(
        body["detail"].is_array() && body.get("code").is_none(),
        "{body}"
    );
    let mut limited = None;
    for _ in 0..60 {
        let response = app.get(&p.api_key, "/b2b/balance").await;
        if response.status() == StatusCode::TOO_MANY_REQUESTS {
            limited = Some(response.text().await.unwrap());
            break;
        }
    }
    let limited = limited.expect("the limit was reached");
    let prefix = r#"{"success":false,"code":"RATE_LIMITED","error":"Too many requests. Please try again later.","retryAfter":"#;
    assert!(limited.starts_with(prefix), "{limited}");
}

/// The `Request-Id` of an answer.
fn request_id(response: &reqwest::Response) -> String {
    response
        .headers()
        .get("Request-Id")
        .expect("every answer has a Request-Id")
        .to_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn every_answer_has_a_request_id_of_its_own_written_on_its_log_line() {
    let app = spawn_app_logging(&["--rate-limit", "12"]).await;
    let p = app.partner_with_balance(1_000).await;
    let mut ids = Vec::new();
    let mut statuses = HashSet::new();
    for i in 0..14 {
        let response = match i % 4 {
            0 => app.get(&p.api_key, "/b2b/balance").await,
            1 => {
                app.get("gc_live_00000000000000000000000000000000", "/b2b/balance")
                    .await
            }
            2 => app.get(&p.api_key, "/b2b/nowhere").await,
            _ => {
                app.post_order(Some(&p.api_key), Some("k"), &json!({"items": "none"}))
                    .await
            }
        };
        statuses.insert(response.status().as_u16());
        ids.push(request_id(&response));
    }
    assert!(
        [200, 401, 404, 422, 429]
            .iter()
            .all(|s| statuses.contains(s)),
        "statuses met: {statuses:?}"
    );
    let distinct: HashSet<&String> = ids.iter().collect();
    assert_eq!(distinct.len(), ids.len(), "each answer's id is its own");
    for id in &ids {
        assert!(id.starts_with("req_") && id.len() == 36, "{id}");
    }
    logged_within(&app, &ids).await;
}

/// Waits (bounded) until each of `ids` is on a line the server logged.
async fn logged_within(app: &TestApp, ids: &[String]) {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let logged = app.logged();
        let missing: Vec<&String> = ids
            .iter()
            .filter(|id| !logged.iter().any(|line| line.contains(id.as_str())))
            .collect();
        if missing.is_empty() {
            return;
        }
        assert!(Instant::now() < until, "not logged: {missing:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_callers_request_id_is_logged_beside_ours_and_never_replaces_it() {
    let app = spawn_app_logging(&[]).await;
    let p = app.partner_with_balance(1_000).await;
    // One caller id sent twice (callers repeat theirs): two answers, two ids of ours.
    let mut ours = Vec::new();
    for _ in 0..2 {
        let response = app
            .client
            .request(Method::GET, app.url("/b2b/balance"))
            .header("X-Api-Key", &p.api_key)
            .header("X-Request-Id", "partner-trace-7")
            .send()
            .await
            .unwrap();
        ours.push(request_id(&response));
    }
    assert_ne!(ours[0], ours[1]);
    assert!(ours.iter().all(|id| id != "partner-trace-7"));
    logged_within(&app, &ours).await;
    for id in &ours {
        let line = app
            .logged()
            .into_iter()
            .find(|line| line.contains(id.as_str()))
            .unwrap();
        assert!(line.contains("caller_id=partner-trace-7"), "{line}");
    }
}
