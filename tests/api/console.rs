//! docs/operations.md "The console": the console page and the admin reads it uses.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{basket, spawn_app_with, spawn_app_without_admin, ADMIN_TOKEN};
use crate::receiver::Receiver;

#[tokio::test]
async fn the_console_is_served_under_a_self_only_policy_while_an_admin_token_is_in_force() {
    let app = spawn_app_with(&[]).await;
    for (path, kind) in [
        ("/console", "text/html"),
        ("/console/app.js", "text/javascript"),
        ("/console/app.css", "text/css"),
    ] {
        let resp = app.client.get(app.url(path)).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
        assert_eq!(
            resp.headers()["Content-Security-Policy"],
            "default-src 'self'"
        );
        assert!(resp.headers()["Content-Type"]
            .to_str()
            .unwrap()
            .starts_with(kind));
    }
    let html = app.text("/console").await;
    assert!(
        !html.contains("<script>") && !html.contains("style=\""),
        "nothing inline"
    );
}

#[tokio::test]
async fn without_an_admin_token_the_console_is_404() {
    let app = spawn_app_without_admin().await;
    let resp = app.client.get(app.url("/console")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_wrong_method_on_the_console_is_the_405_in_the_json_envelope_or_404_without_a_token() {
    let app = spawn_app_with(&[]).await;
    for path in ["/console", "/console/app.js"] {
        let response = app.client.post(app.url(path)).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED, "{path}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["code"], "METHOD_NOT_ALLOWED", "{path}");
        assert_eq!(body["success"], false);
    }
    let off = spawn_app_without_admin().await;
    let response = off.client.post(off.url("/console")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_write_from_the_servers_own_origin_passes_and_another_origin_does_not() {
    let app = spawn_app_with(&[]).await;
    let host = app.address.trim_start_matches("http://").to_string();
    let create = |origin: String| {
        app.client
            .post(app.url("/admin/accounts"))
            .bearer_auth(ADMIN_TOKEN)
            .header("Origin", origin)
            .json(&json!({"name": "Acme"}))
            .send()
    };
    assert_eq!(
        create(format!("http://{host}")).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(
        create("http://elsewhere.example".into())
            .await
            .unwrap()
            .status(),
        StatusCode::FORBIDDEN
    );
}

#[tokio::test]
async fn the_account_list_is_oldest_first_paginated_and_holds_no_secret() {
    let app = spawn_app_with(&[]).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(app.create_account(true, 0, "EU").await);
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/admin/accounts?limit=2&cursor={c}"),
            None => "/admin/accounts?limit=2".to_string(),
        };
        let page: Value = app
            .admin(Method::GET, &path, None)
            .await
            .json()
            .await
            .unwrap();
        for a in page["accounts"].as_array().unwrap() {
            assert!(a.get("webhookSecret").is_none());
            assert_eq!(a["balance"], 0);
            seen.push(a["id"].as_str().unwrap().to_string());
        }
        match page["nextCursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(seen, ids);
}

#[tokio::test]
async fn the_admin_twins_list_what_the_partner_lists() {
    let app = spawn_app_with(&[]).await;
    let p = app.partner_with_balance(10_000).await;
    for k in ["a", "b"] {
        app.post_order(Some(&p.api_key), Some(k), &basket("prd_uc", 1, "p"))
            .await;
    }
    for (admin_path, partner_path) in [
        ("orders?limit=1", "/b2b/orders?limit=1"),
        ("transactions", "/b2b/transactions"),
    ] {
        let admin: Value = app
            .admin(
                Method::GET,
                &format!("/admin/accounts/{}/{admin_path}", p.account_id),
                None,
            )
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(
            admin,
            app.get_json(&p.api_key, partner_path).await,
            "{admin_path}"
        );
    }
    let unknown = app
        .admin(
            Method::GET,
            "/admin/accounts/acc_0193a0c0000070008000000000000abc/orders",
            None,
        )
        .await;
    assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
}

async fn events_of(app: &crate::helpers::TestApp, account: &str) -> Vec<Value> {
    let page: Value = app
        .admin(
            Method::GET,
            &format!("/admin/accounts/{account}/events"),
            None,
        )
        .await
        .json()
        .await
        .unwrap();
    page["events"].as_array().unwrap().clone()
}

#[tokio::test]
async fn each_event_shows_its_callbacks_state_and_attempts() {
    let failing = Receiver::start(vec![500, 500, 500, 500, 500, 500]);
    let good = Receiver::start(vec![]);
    let app = spawn_app_with(&[
        "--fulfillment-delay",
        "100ms",
        "--allow-private-callbacks",
        "--webhook-retry-schedule",
        "200ms,200ms,1h",
    ])
    .await;
    let p = app.partner_with_balance(10_000).await;
    for (key, url) in [
        ("f", Some(failing.url())),
        ("g", Some(good.url())),
        ("n", None),
    ] {
        let mut body = basket("prd_uc", 1, "p");
        if let Some(url) = url {
            body["callbackUrl"] = json!(url);
        }
        app.post_order(Some(&p.api_key), Some(key), &body).await;
    }
    let mut events = Vec::new();
    for _ in 0..100 {
        events = events_of(&app, &p.account_id).await;
        let states: Vec<&str> = events
            .iter()
            .map(|e| e["delivery"].as_str().unwrap())
            .collect();
        let failing_attempts = events
            .iter()
            .find(|e| e["delivery"] == "retrying")
            .map_or(0, |e| e["deliveries"].as_array().unwrap().len());
        if states.contains(&"delivered") && states.contains(&"none") && failing_attempts >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let by_state = |s: &str| events.iter().find(|e| e["delivery"] == s).cloned();
    let retrying = by_state("retrying").expect("the failing receiver's event is retrying");
    let attempts = retrying["deliveries"].as_array().unwrap();
    assert_eq!(attempts.len(), 3);
    assert!(attempts
        .iter()
        .all(|a| a["status"] == 500 && a["error"].is_null()));
    assert_eq!(attempts[2]["attempt"], 3);
    assert!(retrying["nextAttemptAt"].is_string());
    let delivered = by_state("delivered").expect("the good receiver's event is delivered");
    assert_eq!(delivered["deliveries"][0]["status"], 200);
    assert!(delivered["nextAttemptAt"].is_null());
    let none = by_state("none").expect("the event without a callback");
    assert_eq!(none["deliveries"], json!([]));
    assert_eq!(none["type"], "order.completed");
}
