//! A store written by an earlier build opens with this one. sled is vendored and patched
//! (vendor/sled): the patch changes where leaves split and how often pages are rewritten, not
//! the format, and this holds it to that with a store that sled as published wrote.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{order_status, start, wait_until_completed, TestApp};

/// Written by `tests/fixtures/make-sled-0.34.7-store.sh` with orderly b212008, a build on
/// sled 0.34.7 from crates.io (the patch came in 6447efd); the script lists what it holds.
const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/sled-0.34.7-store.tar.gz"
);
/// The fixture account's API key (a test secret that only opens this fixture).
const API_KEY: &str = "gc_live_75e77d9b39094725b1f2c1f3b1e293c7";

fn fixture_order(quantity: u64) -> Value {
    json!({ "items": [ { "productId": "prd_fixture", "quantity": quantity } ] })
}

/// Replays `key` with the body it was first sent with; the order's id.
async fn replayed_id(app: &TestApp, key: &str, quantity: u64) -> String {
    let resp = app
        .post_order(Some(API_KEY), Some(key), &fixture_order(quantity))
        .await;
    assert_eq!(resp.status(), StatusCode::OK, "replay of {key}");
    assert_eq!(resp.headers()["Idempotency-Replayed"], "true", "{key}");
    let body: Value = resp.json().await.unwrap();
    body["order"]["id"].as_str().unwrap().to_string()
}

fn unpack_fixture(into: &Path) {
    let status = Command::new("tar")
        .args(["-xzf", FIXTURE, "-C"])
        .arg(into)
        .status()
        .expect("running tar");
    assert!(status.success(), "unpacking {FIXTURE}");
}

#[tokio::test]
async fn a_store_written_by_sled_as_published_opens_replays_and_takes_new_orders() {
    let root = tempfile::tempdir().unwrap();
    unpack_fixture(root.path());
    let dir = root.path().join("db");
    let data_dir = dir.display().to_string();
    let flags = [
        "--data-dir",
        data_dir.as_str(),
        "--fulfillment-delay",
        "100ms",
        // The fixture's keys expired a day after it was written; unswept, an expired row
        // still replays, and the test replays them whenever it runs.
        "--sweep-interval",
        "1000h",
    ];
    let mut app = start(&dir, &flags);

    let completed = replayed_id(&app, "key-completed", 1).await;
    assert_eq!(order_status(&app, API_KEY, &completed).await, "completed");
    let cancelled = replayed_id(&app, "key-cancelled", 1).await;
    assert_eq!(order_status(&app, API_KEY, &cancelled).await, "cancelled");
    // Left processing by a server with a 1 h delay: this one's fulfillment finds it.
    let waiting = replayed_id(&app, "key-processing", 2).await;
    wait_until_completed(&app, API_KEY, &waiting).await;
    assert_eq!(app.assert_ledger_matches_balance(API_KEY).await, 9_100);

    let placed = app
        .post_order(Some(API_KEY), Some("key-new"), &fixture_order(1))
        .await;
    assert_eq!(placed.status(), StatusCode::OK);
    let stopped = app.signal("TERM", Duration::from_secs(15));
    assert!(stopped.is_some_and(|s| s.success()), "SIGTERM: exit 0");
    let app = app.restart(&flags);
    assert_eq!(app.orders(API_KEY).await.len(), 4);
    replayed_id(&app, "key-new", 1).await;
    assert_eq!(app.assert_ledger_matches_balance(API_KEY).await, 8_800);
}
