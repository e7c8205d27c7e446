//! docs/operations.md "Every flag of `orderly serve`" and docs/architecture.md "Decisions where the contract was silent" (Demo): `--demo` seeds data/demo.json into an empty database only,
//! and prints the keys and the admin token it runs with.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{spawn_app_with, ADMIN_TOKEN};

const WHOLESALE_KEY: &str = "gc_live_00000000000000000000000000000001";
const RETAIL_KEY: &str = "gc_live_00000000000000000000000000000002";

#[tokio::test]
async fn demo_seeds_an_empty_database_once_and_prints_what_it_runs_with() {
    let app = spawn_app_with(&["--demo"]).await;
    let printed = app.printed().join("\n");
    assert!(printed.contains("demo: seeded"), "{printed}");
    assert!(
        printed.contains(WHOLESALE_KEY) && printed.contains(RETAIL_KEY),
        "{printed}"
    );
    assert!(
        printed.contains(&format!("demo: admin token: {ADMIN_TOKEN}")),
        "{printed}"
    );
    assert!(
        printed.contains(&format!("demo: console: {}/console", app.address)),
        "{printed}"
    );
    assert_eq!(app.balance(WHOLESALE_KEY).await, 50_000);

    // A change, then a restart with --demo: nothing is seeded over it.
    let resp = app
        .admin(
            Method::PUT,
            "/admin/products/prd_uc_660",
            Some(json!({"name": "660 UC", "price": 1234, "deliveryFields": ["username"]})),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let app = app.crash_and_restart(&["--demo"]);
    let printed = app.printed().join("\n");
    assert!(printed.contains("nothing seeded"), "{printed}");
    let products = app
        .all_pages(WHOLESALE_KEY, "/b2b/products", "products")
        .await;
    let uc: &Value = products.iter().find(|p| p["id"] == "prd_uc_660").unwrap();
    assert_eq!(uc["price"], 1234);
    assert_eq!(app.balance(WHOLESALE_KEY).await, 50_000);
}

#[tokio::test]
async fn the_demo_retail_key_is_403_on_every_b2b_route() {
    let app = spawn_app_with(&["--demo"]).await;
    for path in [
        "/b2b/balance",
        "/b2b/orders",
        "/b2b/products",
        "/b2b/transactions",
        "/b2b/events",
    ] {
        assert_eq!(
            app.get(RETAIL_KEY, path).await.status(),
            StatusCode::FORBIDDEN,
            "{path}"
        );
    }
    let order = app
        .post_order(
            Some(RETAIL_KEY),
            Some("k"),
            &json!({"items": [{"productId": "prd_uc_660", "quantity": 1, "deliveryData": {"username": "p"}}]}),
        )
        .await;
    assert_eq!(order.status(), StatusCode::FORBIDDEN);
}
