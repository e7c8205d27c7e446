//! docs/api.md "Verifying your ledger": every entry carries `seq`, `hash` and `previousHash`,
//! each hash is recomputed here from the entry's JSON by the documented encoding with nothing
//! of the server's code, the balance carries the ledger's head, and `afterSeq` lists exactly
//! what is newer than a head, oldest first.

use reqwest::StatusCode;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::helpers::{
    basket, spawn_app, spawn_app_with, wait_until_completed, Partner, TestApp, ADMIN_TOKEN,
};

/// Long enough for an order to be cancelled first, short enough to wait for.
const FULFILLED_AFTER: &str = "2s";

fn field(hasher: &mut Sha256, text: &str) {
    hasher.update((text.len() as u32).to_be_bytes());
    hasher.update(text.as_bytes());
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The first entry's `previousHash` of `account`, by the documented encoding.
pub fn genesis(account: &str) -> String {
    let mut hasher = Sha256::new();
    for text in ["orderly-ledger-v1", "genesis", account] {
        field(&mut hasher, text);
    }
    hex(&hasher.finalize())
}

/// What `entry`'s hash is by the documented encoding.
pub fn hash_of(account: &str, entry: &Value) -> String {
    let mut hasher = Sha256::new();
    let text = |name: &str| entry[name].as_str().unwrap().to_string();
    let number = |name: &str| entry[name].as_i64().unwrap().to_string();
    for text in [
        "orderly-ledger-v1".to_string(),
        account.to_string(),
        text("id"),
        entry["seq"].as_u64().unwrap().to_string(),
        number("amount"),
        text("reason"),
        text("reference"),
        number("balanceAfter"),
        text("createdAt"),
        text("previousHash"),
    ] {
        field(&mut hasher, &text);
    }
    hex(&hasher.finalize())
}

/// `account`'s ledger, oldest first, as `GET /b2b/transactions?afterSeq=0` pages it.
async fn chain(app: &TestApp, p: &Partner) -> Vec<Value> {
    let mut all: Vec<Value> = Vec::new();
    loop {
        let after = all.last().map_or(0, |e| e["seq"].as_u64().unwrap());
        let page = app
            .get_json(
                &p.api_key,
                &format!("/b2b/transactions?afterSeq={after}&limit=2"),
            )
            .await;
        assert_eq!(page["nextCursor"], Value::Null);
        let entries = page["transactions"].as_array().unwrap().clone();
        let done = entries.len() < 2;
        all.extend(entries);
        if done {
            return all;
        }
    }
}

/// Money moved every way a partner's money moves: a credit, orders, a cancel, a refund (the
/// server fulfils orders after `FULFILLED_AFTER`).
async fn every_kind_of_entry(app: &TestApp) -> Partner {
    let p = app.partner_with_balance(10_000).await;
    let mut placed = Vec::new();
    for key in ["a", "b", "c"] {
        let order: Value = app
            .post_order(Some(&p.api_key), Some(key), &basket("prd_uc", 1, "p"))
            .await
            .json()
            .await
            .unwrap();
        placed.push(order["order"]["id"].as_str().unwrap().to_string());
    }
    assert_eq!(
        app.cancel(&p.api_key, &placed[0]).await.status(),
        StatusCode::OK
    );
    wait_until_completed(app, &p.api_key, &placed[1]).await;
    let refunded = app
        .client
        .post(app.url(&format!("/b2b/orders/{}/refunds", placed[1])))
        .header("X-Api-Key", &p.api_key)
        .header("X-Idempotency-Key", "refund-1")
        .json(&json!({"amount": 100}))
        .send()
        .await
        .unwrap();
    assert_eq!(refunded.status(), StatusCode::OK);
    p
}

#[tokio::test]
async fn every_entry_is_chained_by_the_documented_encoding_from_its_accounts_genesis() {
    let app = spawn_app_with(&["--fulfillment-delay", FULFILLED_AFTER]).await;
    let p = every_kind_of_entry(&app).await;

    let entries = chain(&app, &p).await;
    let reasons: Vec<&str> = entries
        .iter()
        .map(|e| e["reason"].as_str().unwrap())
        .collect();
    assert_eq!(
        reasons,
        ["credit", "order", "order", "order", "cancel", "refund"]
    );
    let mut previous = genesis(&p.account_id);
    for (i, entry) in entries.iter().enumerate() {
        assert_eq!(entry["seq"], i as u64 + 1);
        assert_eq!(entry["previousHash"], previous.as_str(), "entry {}", i + 1);
        assert_eq!(entry["hash"], hash_of(&p.account_id, entry).as_str());
        previous = entry["hash"].as_str().unwrap().to_string();
    }
    // Newest first, the same entries with the same three fields.
    let newest_first = app.ledger(&p.api_key).await;
    let reversed: Vec<Value> = entries.iter().rev().cloned().collect();
    assert_eq!(newest_first, reversed);
}

#[tokio::test]
async fn the_balance_carries_its_ledgers_head_and_an_empty_ledger_the_genesis() {
    let app = spawn_app().await;
    let account = app.create_account(true, 0, "EU").await;
    let key = app.create_key(&account, &["balance:read"]).await;
    let empty = app.get_json(&key, "/b2b/balance").await;
    assert_eq!(
        empty["ledgerHead"],
        json!({"seq": 0, "hash": genesis(&account)})
    );

    app.credit(&account, 700).await;
    app.credit(&account, 50).await;
    let body = app.get_json(&key, "/b2b/balance").await;
    let newest = &app.ledger(&key).await[0];
    assert_eq!(body["balance"]["available"], 750);
    assert_eq!(
        body["ledgerHead"],
        json!({"seq": 2, "hash": newest["hash"]})
    );
}

#[tokio::test]
async fn after_seq_lists_only_the_entries_after_it_oldest_first() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(10_000).await;
    for key in ["a", "b", "c", "d"] {
        app.post_order(Some(&p.api_key), Some(key), &basket("prd_uc", 1, "p"))
            .await;
    }
    let all = chain(&app, &p).await;
    assert_eq!(all.len(), 5);

    let page = app
        .get_json(&p.api_key, "/b2b/transactions?afterSeq=2&limit=2")
        .await;
    let seqs: Vec<u64> = page["transactions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, [3, 4]);
    assert_eq!(page["transactions"][0], all[2]);
    assert_eq!(page["transactions"][0]["previousHash"], all[1]["hash"]);
    for (after, expected) in [(0, 5), (4, 1), (5, 0), (99, 0)] {
        let page = app
            .get_json(&p.api_key, &format!("/b2b/transactions?afterSeq={after}"))
            .await;
        assert_eq!(
            page["transactions"].as_array().unwrap().len(),
            expected,
            "afterSeq={after}"
        );
    }
    // The admin's list takes it too.
    let admin = app
        .client
        .get(app.url(&format!(
            "/admin/accounts/{}/transactions?afterSeq=4",
            p.account_id
        )))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    let admin: Value = admin.json().await.unwrap();
    assert_eq!(admin["transactions"], json!([all[4]]));
}

#[tokio::test]
async fn an_after_seq_that_is_not_a_whole_number_or_comes_with_a_cursor_is_a_422() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(100).await;
    for (query, at) in [
        ("afterSeq=-1", "afterSeq"),
        ("afterSeq=abc", "afterSeq"),
        ("afterSeq=1.5", "afterSeq"),
        ("afterSeq=", "afterSeq"),
        ("afterSeq=9223372036854775808", "afterSeq"),
        (
            "afterSeq=1&cursor=txn_0190a1b2c3d4e5f60718293a4b5c6d7e",
            "cursor",
        ),
    ] {
        let resp = app
            .get(&p.api_key, &format!("/b2b/transactions?{query}"))
            .await;
        assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY, "{query}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["detail"][0]["loc"], json!(["query", at]), "{query}");
    }
}
