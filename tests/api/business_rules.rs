//! docs/api.md "POST /b2b/orders".4: each business rule is a 400 with its token, and charges nothing.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{basket, spawn_app};

async fn error_of(resp: reqwest::Response) -> String {
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["success"], false);
    body["error"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn each_business_rule_answers_400_with_its_token_and_charges_nothing() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(10_000).await;
    app.put_product("prd_off", 100, &[], &[], false).await;
    let cases = [
        (basket("prd_missing", 1, "p"), "unknown_product: "),
        (basket("prd_off", 1, "p"), "unknown_product: "),
        (basket("prd_us", 1, "p"), "region_not_allowed: "),
        (basket("prd_free", 1, "p"), "ZERO_PRICE_ITEM: "),
        (basket("prd_uc", 1, "   "), "invalid_delivery_data: "),
        (
            json!({"items": [{"productId": "prd_uc", "quantity": 1}]}),
            "invalid_delivery_data: ",
        ),
    ];
    for (i, (body, token)) in cases.iter().enumerate() {
        let error = error_of(
            app.post_order(Some(&p.api_key), Some(&format!("k{i}")), body)
                .await,
        )
        .await;
        assert!(error.starts_with(token), "{error}");
    }
    assert_eq!(app.assert_ledger_matches_balance(&p.api_key).await, 10_000);
    assert!(app.orders(&p.api_key).await.is_empty());
}

#[tokio::test]
async fn a_blank_product_id_passes_the_schema_and_is_an_unknown_product() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(10_000).await;
    let body = json!({"items": [{"productId": "   ", "quantity": 1}]});
    let error = error_of(app.post_order(Some(&p.api_key), Some("k"), &body).await).await;
    assert!(error.starts_with("unknown_product: "), "{error}");
}

#[tokio::test]
async fn more_than_200_lines_is_too_many_items() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(10_000).await;
    let items: Vec<Value> = (0..201)
        .map(|i| json!({"productId": "prd_uc", "quantity": 1, "deliveryData": {"username": format!("u{i}")}}))
        .collect();
    let error = error_of(
        app.post_order(Some(&p.api_key), Some("k"), &json!({ "items": items }))
            .await,
    )
    .await;
    assert_eq!(error, "too_many_items: maximum 200 items per order");
}

#[tokio::test]
async fn a_total_that_does_not_fit_is_order_total_too_large() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(10_000).await;
    app.put_product("prd_huge", 1_000_000_000_000, &[], &[], true)
        .await;
    let items: Vec<Value> = (0..10)
        .map(|_| json!({"productId": "prd_huge", "quantity": 1_000_000}))
        .collect();
    let error = error_of(
        app.post_order(Some(&p.api_key), Some("k"), &json!({ "items": items }))
            .await,
    )
    .await;
    assert!(error.starts_with("order_total_too_large: "), "{error}");
    assert_eq!(app.balance(&p.api_key).await, 10_000);
}

#[tokio::test]
async fn a_business_400_leaves_the_key_free_for_a_corrected_basket() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(10_000).await;
    error_of(
        app.post_order(Some(&p.api_key), Some("k"), &basket("prd_us", 1, "p"))
            .await,
    )
    .await;
    let ok = app
        .post_order(Some(&p.api_key), Some("k"), &basket("prd_uc", 1, "p"))
        .await;
    assert_eq!(ok.status(), StatusCode::OK);
}
