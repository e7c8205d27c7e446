//! docs/api.md "Partner routes" and docs/architecture.md "Decisions where the contract was silent": the read endpoints, their scopes, lists and cursors.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{basket, spawn_app};

#[tokio::test]
async fn an_order_is_readable_by_its_account_and_404_to_another() {
    let app = spawn_app().await;
    let a = app.partner_with_balance(10_000).await;
    let b = app.partner_with_balance(10_000).await;
    let placed: Value = app
        .post_order(Some(&a.api_key), Some("k"), &basket("prd_uc", 1, "p"))
        .await
        .json()
        .await
        .unwrap();
    let id = placed["order"]["id"].as_str().unwrap();

    let mine = app.get_json(&a.api_key, &format!("/b2b/orders/{id}")).await;
    assert_eq!(mine["success"], true);
    assert_eq!(mine["order"], placed["order"]);

    let theirs = app.get(&b.api_key, &format!("/b2b/orders/{id}")).await;
    assert_eq!(theirs.status(), StatusCode::NOT_FOUND);
    let body: Value = theirs.json().await.unwrap();
    assert!(body["error"]
        .as_str()
        .unwrap()
        .starts_with("order_not_found: "));
}

#[tokio::test]
async fn orders_are_listed_newest_first_with_a_cursor_and_filtered_by_external_id() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(100_000).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        let mut body = basket("prd_uc", 1, "p");
        body["externalOrderId"] = json!(if i % 2 == 0 { "even" } else { "odd" });
        let placed: Value = app
            .post_order(Some(&p.api_key), Some(&format!("k{i}")), &body)
            .await
            .json()
            .await
            .unwrap();
        ids.push(placed["order"]["id"].as_str().unwrap().to_string());
    }

    let page1 = app.get_json(&p.api_key, "/b2b/orders?limit=2").await;
    let got: Vec<&str> = page1["orders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["id"].as_str().unwrap())
        .collect();
    assert_eq!(got, vec![ids[4].as_str(), ids[3].as_str()]);
    let cursor = page1["nextCursor"].as_str().unwrap();
    let page2 = app
        .get_json(&p.api_key, &format!("/b2b/orders?limit=2&cursor={cursor}"))
        .await;
    assert_eq!(page2["orders"][0]["id"], ids[2].as_str());
    let all = app.orders(&p.api_key).await;
    assert_eq!(all.len(), 5);

    let even = app
        .get_json(&p.api_key, "/b2b/orders?externalOrderId=even")
        .await;
    let got: Vec<&str> = even["orders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["id"].as_str().unwrap())
        .collect();
    assert_eq!(got, vec![ids[4].as_str(), ids[2].as_str(), ids[0].as_str()]);
    assert_eq!(even["nextCursor"], Value::Null);
}

#[tokio::test]
async fn a_bad_limit_or_cursor_is_422() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(0).await;
    for path in [
        "/b2b/orders?limit=0",
        "/b2b/orders?limit=101",
        "/b2b/orders?limit=abc",
        "/b2b/orders?cursor=nonsense",
        "/b2b/transactions?cursor=ord_123",
        "/b2b/products?cursor=nonsense",
        "/b2b/orders?limit=+5",
        "/b2b/events?after=nonsense",
    ] {
        let resp = app.get(&p.api_key, path).await;
        assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY, "{path}");
    }
}

#[tokio::test]
async fn the_ledger_records_every_movement_newest_first() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(5_000).await;
    let placed: Value = app
        .post_order(Some(&p.api_key), Some("k"), &basket("prd_uc", 2, "p"))
        .await
        .json()
        .await
        .unwrap();

    let ledger = app.ledger(&p.api_key).await;
    assert_eq!(ledger.len(), 2);
    assert_eq!(ledger[0]["amount"], -1998);
    assert_eq!(ledger[0]["reason"], "order");
    assert_eq!(ledger[0]["reference"], placed["order"]["id"]);
    assert_eq!(ledger[0]["balanceAfter"], 3002);
    assert!(ledger[0]["id"].as_str().unwrap().starts_with("txn_"));
    assert_eq!(ledger[1]["amount"], 5000);
    assert_eq!(ledger[1]["reason"], "credit");
    assert_eq!(app.assert_ledger_matches_balance(&p.api_key).await, 3002);
}

#[tokio::test]
async fn the_balance_has_the_documented_shape() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(1234).await;
    let body = app.get_json(&p.api_key, "/b2b/balance").await;
    let head = body["ledgerHead"]["hash"].as_str().unwrap().to_string();
    assert_eq!(
        body,
        json!({"success": true, "balance": {"available": 1234, "creditLimit": 0, "currency": "USD"},
               "ledgerHead": {"seq": 1, "hash": head}})
    );
    assert_eq!(head.len(), 64);
    assert!(head
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
}

#[tokio::test]
async fn the_catalog_lists_active_products_a_page_at_a_time() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(0).await;
    app.put_product("prd_zz_off", 10, &[], &[], false).await;
    let first = app.get_json(&p.api_key, "/b2b/products?limit=2").await;
    assert_eq!(first["products"].as_array().unwrap().len(), 2);
    let all = app.all_pages(&p.api_key, "/b2b/products", "products").await;
    let ids: Vec<&str> = all.iter().map(|p| p["id"].as_str().unwrap()).collect();
    assert_eq!(ids, vec!["prd_free", "prd_uc", "prd_us"]);
}

#[tokio::test]
async fn a_wrong_method_is_a_json_405() {
    let app = spawn_app().await;
    for path in ["/healthz", "/b2b/balance"] {
        let resp = app.client.post(app.url(path)).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED, "{path}");
        assert_eq!(resp.headers()["Content-Type"], "application/json");
    }
}

#[tokio::test]
async fn an_unknown_route_is_a_json_404() {
    let app = spawn_app().await;
    let resp = app.client.get(app.url("/nope")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert_eq!(resp.headers()["Content-Type"], "application/json");
}
