//! docs/contract.md "2.8 A key lives 24 hours, then is swept": expired rows decide until the sweeper deletes them; then the key is new.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::{basket, spawn_app_with};

#[tokio::test]
async fn expired_but_unswept_keys_still_replay_and_conflict() {
    let app = spawn_app_with(&["--idempotency-ttl", "1s", "--sweep-interval", "1h"]).await;
    let p = app.partner_with_balance(10_000).await;
    let body = basket("prd_uc", 1, "p");
    app.post_order(Some(&p.api_key), Some("k"), &body).await;

    tokio::time::sleep(Duration::from_millis(1_500)).await;

    let replay = app.post_order(Some(&p.api_key), Some("k"), &body).await;
    assert_eq!(replay.headers()["Idempotency-Replayed"], "true");
    let conflict = app
        .post_order(Some(&p.api_key), Some("k"), &basket("prd_uc", 2, "p"))
        .await;
    assert_eq!(conflict.status(), StatusCode::CONFLICT);
    assert_eq!(app.orders(&p.api_key).await.len(), 1);
}

/// Places an order under one key with `--idempotency-ttl ttl` and a sweep every second, then
/// retries it every `every` (each retry a 200) until one is a first use again, within 10 s:
/// a second order, and the ledger agrees with both.
async fn the_sweep_frees_the_key(ttl: &str, every: Duration) {
    let app = spawn_app_with(&["--idempotency-ttl", ttl, "--sweep-interval", "1s"]).await;
    let p = app.partner_with_balance(10_000).await;
    let body = basket("prd_uc", 1, "p");
    let first: Value = app
        .post_order(Some(&p.api_key), Some("k"), &body)
        .await
        .json()
        .await
        .unwrap();

    let deadline = Instant::now() + Duration::from_secs(10);
    let second = loop {
        assert!(
            Instant::now() < deadline,
            "the sweeper should have freed the key within 10 s"
        );
        tokio::time::sleep(every).await;
        let resp = app.post_order(Some(&p.api_key), Some("k"), &body).await;
        assert_eq!(resp.status(), StatusCode::OK);
        if resp.headers().get("Idempotency-Replayed").is_none() {
            break resp.json::<Value>().await.unwrap();
        }
    };
    assert_ne!(first["order"]["id"], second["order"]["id"]);
    assert_eq!(app.orders(&p.api_key).await.len(), 2);
    assert_eq!(
        app.assert_ledger_matches_balance(&p.api_key).await,
        10_000 - 2 * 999
    );
}

#[tokio::test]
async fn after_the_sweep_the_same_key_and_basket_create_a_new_order() {
    the_sweep_frees_the_key("1s", Duration::from_millis(500)).await;
}

#[tokio::test]
async fn a_key_replayed_often_is_freed_by_the_sweep_like_any_other() {
    // Long enough that the row is kept in memory (PostgreSQL keeps replays there until a
    // second before their expiry), short enough to wait out; replayed ten times a second.
    the_sweep_frees_the_key("3s", Duration::from_millis(100)).await;
}

#[tokio::test]
async fn retries_racing_the_sweeper_get_a_replay_or_a_first_use_never_a_500() {
    // Every row expires at once and the sweeper runs every 5 ms, so lookups, first uses and
    // deletions of one key interleave as closely as this machine can make them.
    let app = spawn_app_with(&["--idempotency-ttl", "1ms", "--sweep-interval", "5ms"]).await;
    let p = app.partner_with_balance(10_000_000).await;
    let body = basket("prd_uc", 1, "p");
    let racers = (0..4).map(|_| {
        let (app, key, body) = (&app, p.api_key.clone(), body.clone());
        async move {
            let mut statuses = Vec::new();
            for _ in 0..100 {
                let resp = app.post_order(Some(&key), Some("raced"), &body).await;
                statuses.push(resp.status());
            }
            statuses
        }
    });
    let statuses: Vec<StatusCode> = futures::future::join_all(racers)
        .await
        .into_iter()
        .flatten()
        .collect();
    let unexpected: Vec<&StatusCode> = statuses.iter().filter(|s| **s != StatusCode::OK).collect();
    assert!(
        unexpected.is_empty(),
        "answers other than 200: {unexpected:?}"
    );
    let orders = app.orders(&p.api_key).await.len() as i64;
    assert_eq!(
        app.assert_ledger_matches_balance(&p.api_key).await,
        10_000_000 - orders * 999
    );
}
