//! Parallel requests: one key is one order, many keys are an exact balance.

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::{basket, spawn_app, spawn_app_on_sled};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_parallel_requests_with_one_key_make_one_order_and_one_charge() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(100_000).await;
    let body = basket("prd_uc", 1, "p");

    let responses =
        join_all((0..50).map(|_| app.post_order(Some(&p.api_key), Some("same"), &body))).await;

    let mut bodies = Vec::new();
    let mut fresh = 0;
    for resp in responses {
        assert_eq!(resp.status(), StatusCode::OK);
        if resp.headers().get("Idempotency-Replayed").is_none() {
            fresh += 1;
        }
        bodies.push(resp.bytes().await.unwrap());
    }
    assert_eq!(fresh, 1, "exactly one request did the work");
    assert!(
        bodies.windows(2).all(|w| w[0] == w[1]),
        "every answer is the same bytes"
    );
    assert_eq!(app.orders(&p.api_key).await.len(), 1);
    assert_eq!(
        app.assert_ledger_matches_balance(&p.api_key).await,
        100_000 - 999
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_parallel_requests_with_distinct_keys_leave_an_exact_balance() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(100_000).await;
    let body = basket("prd_uc", 1, "p");
    let keys: Vec<String> = (0..50).map(|i| format!("distinct-{i}")).collect();

    let responses = join_all(
        keys.iter()
            .map(|k| app.post_order(Some(&p.api_key), Some(k), &body)),
    )
    .await;

    for resp in responses {
        assert_eq!(resp.status(), StatusCode::OK);
    }
    assert_eq!(app.orders(&p.api_key).await.len(), 50);
    assert_eq!(
        app.assert_ledger_matches_balance(&p.api_key).await,
        100_000 - 50 * 999
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parallel_orders_beyond_the_balance_never_overdraw() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(10 * 999).await;
    let body = basket("prd_uc", 1, "p");
    let keys: Vec<String> = (0..30).map(|i| format!("race-{i}")).collect();

    let responses = join_all(
        keys.iter()
            .map(|k| app.post_order(Some(&p.api_key), Some(k), &body)),
    )
    .await;

    let statuses: Vec<u16> = responses.iter().map(|r| r.status().as_u16()).collect();
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 10);
    assert_eq!(statuses.iter().filter(|s| **s == 402).count(), 20);
    assert_eq!(app.assert_ledger_matches_balance(&p.api_key).await, 0);
    let orders: Vec<Value> = app.orders(&p.api_key).await;
    assert_eq!(orders.len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parallel_orders_on_one_account_list_their_ledger_in_the_order_the_balance_moved() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(100_000).await;
    let body = basket("prd_uc", 1, "p");
    let keys: Vec<String> = (0..60).map(|i| format!("chain-{i}")).collect();
    let placed = join_all(keys.iter().map(|k| async {
        app.post_order(Some(&p.api_key), Some(k), &body)
            .await
            .status()
    }))
    .await;
    assert!(placed.iter().all(|status| *status == StatusCode::OK));

    // Newest first: each entry's balance before it is the next (older) entry's balance after.
    let ledger = app.ledger(&p.api_key).await;
    assert_eq!(ledger.len(), 61, "the credit and sixty charges");
    for pair in ledger.windows(2) {
        let (newer, older) = (&pair[0], &pair[1]);
        assert_eq!(
            newer["balanceAfter"].as_i64().unwrap() - newer["amount"].as_i64().unwrap(),
            older["balanceAfter"].as_i64().unwrap(),
            "{newer} listed right after {older}"
        );
    }
}

/// sled's reads run on a few threads shared by the process; reads past them wait their turn,
/// none is refused and none answers another's order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hundred_reads_at_once_on_sled_are_each_answered_with_their_own_order() {
    let app = spawn_app_on_sled().await;
    let p = app.partner_with_balance(100_000).await;
    let body = basket("prd_uc", 1, "p");
    let mut ids = Vec::new();
    for i in 0..5 {
        let placed: Value = app
            .post_order(Some(&p.api_key), Some(&format!("read-{i}")), &body)
            .await
            .json()
            .await
            .unwrap();
        ids.push(placed["order"]["id"].as_str().unwrap().to_string());
    }

    let (app, api_key) = (&app, &p.api_key);
    let reads = join_all((0..100).map(|i| {
        let id = &ids[i % ids.len()];
        async move {
            let resp = app.get(api_key, &format!("/b2b/orders/{id}")).await;
            (id, resp.status(), resp.json::<Value>().await.unwrap())
        }
    }))
    .await;

    for (id, status, read) in reads {
        assert_eq!(status, StatusCode::OK, "{read}");
        assert_eq!(read["order"]["id"], id.as_str());
    }
}
