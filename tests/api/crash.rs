//! kill -9 right after acknowledged orders: every 200 survives the restart.

use std::collections::HashMap;

use futures::future::join_all;
use proptest::prelude::Rng;
use proptest::test_runner::{RngAlgorithm, TestRng};
use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::{basket, metric, spawn_app, spawn_app_on_sled};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_acknowledged_order_survives_kill_9_and_replays_to_the_same_id() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(1_000_000).await;
    let body = basket("prd_uc", 1, "p");
    let keys: Vec<String> = (0..40).map(|i| format!("crash-{i}")).collect();

    let responses = join_all(
        keys.iter()
            .map(|k| app.post_order(Some(&p.api_key), Some(k), &body)),
    )
    .await;
    let mut acknowledged: HashMap<String, String> = HashMap::new();
    for (key, resp) in keys.iter().zip(responses) {
        assert_eq!(resp.status(), StatusCode::OK);
        let body: Value = resp.json().await.unwrap();
        acknowledged.insert(
            key.clone(),
            body["order"]["id"].as_str().unwrap().to_string(),
        );
    }

    // SIGKILL immediately after the last acknowledgement: no graceful flush happens.
    let app = app.crash_and_restart(&[]);

    let orders = app.orders(&p.api_key).await;
    assert_eq!(orders.len(), acknowledged.len());
    for (key, order_id) in &acknowledged {
        let replay = app.post_order(Some(&p.api_key), Some(key), &body).await;
        assert_eq!(replay.headers()["Idempotency-Replayed"], "true");
        let replayed: Value = replay.json().await.unwrap();
        assert_eq!(replayed["order"]["id"], order_id.as_str());
    }
    assert_eq!(
        app.assert_ledger_matches_balance(&p.api_key).await,
        1_000_000 - 999 * acknowledged.len() as i64
    );
}

#[tokio::test]
async fn an_order_with_300_kb_of_delivery_data_is_answered_after_its_large_value_files_are_synced()
{
    // sled's blobs/ directory, whatever the environment (PostgreSQL's server owns its
    // durability): on the PostgreSQL run of CI this test is left out by name.
    let app = spawn_app_on_sled().await;
    let p = app.partner_with_balance(10_000).await;
    let synced = || async {
        let text = app.text("/metrics").await;
        metric(&text, "orderly_storage_blob_files_synced_total")
    };
    app.post_order(Some(&p.api_key), Some("small"), &basket("prd_uc", 1, "p"))
        .await;
    assert_eq!(
        synced().await,
        0.0,
        "small values need no file of their own"
    );

    // Letters that do not compress: sled compresses a new store's pages, and this value
    // must stay past its blob threshold (about 128 KiB) once compressed.
    let mut rng = TestRng::deterministic_rng(RngAlgorithm::ChaCha);
    let large: String = (0..300 * 1024)
        .map(|_| char::from(b'a' + (rng.next_u32() % 26) as u8))
        .collect();
    let body = basket("prd_uc", 1, &large);
    let resp = app.post_order(Some(&p.api_key), Some("large"), &body).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let placed: Value = resp.json().await.unwrap();
    // sled moved the order (and its key row, its event) into files under blobs/; the 200
    // came after the commit fsynced them.
    assert!(
        synced().await >= 1.0,
        "the order's blob files were not synced"
    );

    // Back on the same sled directory, whatever the environment.
    let data_dir = app.data_dir.display().to_string();
    let app = app.crash_and_restart(&["--data-dir", &data_dir]);
    let order_id = placed["order"]["id"].as_str().unwrap();
    let order = app
        .get_json(&p.api_key, &format!("/b2b/orders/{order_id}"))
        .await;
    assert_eq!(
        order["order"]["items"][0]["deliveryData"]["username"],
        large.as_str()
    );
    let replay = app.post_order(Some(&p.api_key), Some("large"), &body).await;
    assert_eq!(replay.headers()["Idempotency-Replayed"], "true");
}
