//! docs/contract.md "3. The order of checks" and "3.3 The rate limit": the Origin check before the limiter, and the limiter's arithmetic.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{basket, spawn_app_with};

fn remaining(resp: &reqwest::Response) -> u64 {
    resp.headers()["X-RateLimit-Remaining"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn the_limit_counts_down_and_the_next_request_is_429_with_retry_after() {
    let app = spawn_app_with(&["--rate-limit", "30"]).await;
    let url = app.url("/b2b/balance");
    for expected in (0..30).rev() {
        let resp = app.client.get(&url).send().await.unwrap();
        // Unauthenticated, yet it reached the limiter, so it carries the headers.
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(resp.headers()["X-RateLimit-Limit"], "30");
        assert_eq!(remaining(&resp), expected);
        assert!(resp.headers().contains_key("X-RateLimit-Reset"));
    }
    let limited = app.client.get(&url).send().await.unwrap();
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limited.headers()["X-RateLimit-Remaining"], "0");
    let retry_after: u64 = limited.headers()["Retry-After"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry_after >= 1);
    let body: Value = limited.json().await.unwrap();
    assert_eq!(
        body,
        json!({"success": false, "code": "RATE_LIMITED", "error": "Too many requests. Please try again later.", "retryAfter": retry_after})
    );
}

#[tokio::test]
async fn forwarded_for_from_an_untrusted_peer_buys_no_fresh_bucket() {
    let app = spawn_app_with(&["--rate-limit", "5"]).await;
    for i in 0..6 {
        let resp = app
            .client
            .get(app.url("/b2b/balance"))
            .header("X-Forwarded-For", format!("198.51.100.{i}"))
            .send()
            .await
            .unwrap();
        let expect = if i < 5 {
            StatusCode::UNAUTHORIZED
        } else {
            StatusCode::TOO_MANY_REQUESTS
        };
        assert_eq!(resp.status(), expect, "request {i}");
    }
}

#[tokio::test]
async fn a_trusted_proxy_gets_a_bucket_per_forwarded_client() {
    let app = spawn_app_with(&["--rate-limit", "5", "--trusted-proxies", "127.0.0.1/32"]).await;
    for i in 0..12 {
        let resp = app
            .client
            .get(app.url("/b2b/balance"))
            .header("X-Forwarded-For", format!("203.0.113.{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(
            resp.status(),
            StatusCode::UNAUTHORIZED,
            "client {i} has its own bucket"
        );
        assert_eq!(remaining(&resp), 4);
    }
}

#[tokio::test]
async fn an_override_network_gets_its_own_limit() {
    let app = spawn_app_with(&[
        "--rate-limit",
        "5",
        "--rate-limit-override",
        "127.0.0.0/8=50",
    ])
    .await;
    let resp = app
        .client
        .get(app.url("/b2b/balance"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["X-RateLimit-Limit"], "50");
    assert_eq!(remaining(&resp), 49);
}

#[tokio::test]
async fn health_probes_are_not_rate_limited() {
    let app = spawn_app_with(&["--rate-limit", "2"]).await;
    for _ in 0..5 {
        let resp = app.client.get(app.url("/healthz")).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(!resp.headers().contains_key("X-RateLimit-Limit"));
    }
    assert_eq!(
        app.client
            .get(app.url("/readyz"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_disallowed_origin_on_a_write_is_403_without_headers_or_budget() {
    let app = spawn_app_with(&[
        "--rate-limit",
        "10",
        "--allowed-origins",
        "https://shop.example",
    ])
    .await;
    let p = app.partner_with_balance(10_000).await;
    let probe = app.get(&p.api_key, "/b2b/balance").await;
    let before = remaining(&probe);

    let refused = app
        .client
        .post(app.url("/b2b/orders"))
        .header("Origin", "https://evil.example")
        .json(&basket("prd_uc", 1, "p"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    assert!(!refused.headers().contains_key("X-RateLimit-Limit"));
    assert!(!refused.headers().contains_key("X-RateLimit-Remaining"));
    let body: Value = refused.json().await.unwrap();
    assert_eq!(
        body,
        json!({"success": false, "error": "Forbidden: Origin not allowed", "code": "ORIGIN_NOT_ALLOWED"})
    );

    let next = app.get(&p.api_key, "/b2b/balance").await;
    assert_eq!(
        remaining(&next),
        before - 1,
        "the refused request spent no budget"
    );
}

#[tokio::test]
async fn an_allowed_origin_passes_and_a_read_with_any_origin_passes() {
    let app = spawn_app_with(&["--allowed-origins", "https://shop.example"]).await;
    let p = app.partner_with_balance(10_000).await;
    let allowed = app
        .client
        .post(app.url("/b2b/orders"))
        .header("Origin", "https://shop.example")
        .header("X-Api-Key", &p.api_key)
        .header("X-Idempotency-Key", "o1")
        .json(&basket("prd_uc", 1, "p"))
        .send()
        .await
        .unwrap();
    assert_eq!(allowed.status(), StatusCode::OK);
    let read = app
        .client
        .get(app.url("/b2b/balance"))
        .header("Origin", "https://evil.example")
        .header("X-Api-Key", &p.api_key)
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), StatusCode::OK);
}

#[tokio::test]
async fn origin_is_checked_before_the_limiter_and_the_limiter_before_auth() {
    let app = spawn_app_with(&["--rate-limit", "1"]).await;
    let first = app
        .client
        .post(app.url("/b2b/orders"))
        .json(&basket("prd_uc", 1, "p"))
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::UNAUTHORIZED);
    let limited = app
        .client
        .post(app.url("/b2b/orders"))
        .json(&basket("prd_uc", 1, "p"))
        .send()
        .await
        .unwrap();
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    let origin = app
        .client
        .post(app.url("/b2b/orders"))
        .header("Origin", "https://evil.example")
        .json(&basket("prd_uc", 1, "p"))
        .send()
        .await
        .unwrap();
    assert_eq!(origin.status(), StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn the_origin_check_covers_admin_and_provider_writes_too() {
    let app = spawn_app_with(&[
        "--allowed-origins",
        "https://shop.example",
        "--provider-secret",
        "acmepay=s",
    ])
    .await;
    for (method, path) in [
        (reqwest::Method::POST, "/admin/accounts"),
        (reqwest::Method::PUT, "/admin/products/prd_x"),
        (reqwest::Method::DELETE, "/admin/api-keys/key_x"),
        (reqwest::Method::POST, "/webhooks/providers/acmepay"),
    ] {
        let resp = app
            .client
            .request(method, app.url(path))
            .header("Origin", "null")
            .bearer_auth(crate::helpers::ADMIN_TOKEN)
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{path}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(
            body,
            json!({"success": false, "error": "Forbidden: Origin not allowed", "code": "ORIGIN_NOT_ALLOWED"})
        );
    }
}

#[tokio::test]
async fn an_oversized_header_is_never_a_5xx_or_a_dropped_connection() {
    let app = spawn_app_with(&[]).await;
    let resp = app
        .client
        .get(app.url("/b2b/balance"))
        .header("X-Padding", "x".repeat(200_000))
        .send()
        .await
        .expect("the server answers");
    assert!(resp.status().is_client_error(), "{}", resp.status());
}
