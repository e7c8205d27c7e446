//! CHANGELOG "Several versions at once": entries written before chained ledgers are chained in
//! their order when this version first opens the store or database, to the hashes the same
//! entries get when chained as they are written; and on PostgreSQL an entry that an instance of
//! the previous version writes beside this one is chained before this one's next entry.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::{back_to_schema, basket, on_postgres, spawn_app, sql_on, Partner, TestApp};

const NEEDS_POSTGRES: &str = "needs ORDERLY_TEST_DATABASE_URL";

/// A server whose partner has a credit and three orders.
async fn four_entries() -> (TestApp, Partner) {
    let app = spawn_app().await;
    let p = app.partner_with_balance(10_000).await;
    for key in ["a", "b", "c"] {
        let resp = app
            .post_order(Some(&p.api_key), Some(key), &basket("prd_uc", 1, "p"))
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
    }
    (app, p)
}

/// The store or database as a build before chained ledgers left it: on sled every entry
/// without its seq and hash; on PostgreSQL the schema before migration 13.
fn as_before_chained_ledgers(app: &mut TestApp) {
    assert!(app.signal("TERM", Duration::from_secs(20)).is_some());
    match app.database_url() {
        Some(url) => back_to_schema(&url, 12),
        None => strip_sled_chains(&app.data_dir),
    }
}

/// Each value of the tree `ledger` cut to the entry before its tail, as the build before
/// chained ledgers writes them.
fn strip_sled_chains(dir: &std::path::Path) {
    let open = |compressed: bool| {
        sled::Config::new()
            .path(dir)
            .use_compression(compressed)
            .open()
    };
    let db = open(true).or_else(|_| open(false)).unwrap();
    let config = bincode::config::standard();
    let ledger = db.open_tree("ledger").unwrap();
    for item in ledger.iter() {
        let (key, value) = item.unwrap();
        // The format byte, then the entry; what follows it is the chain.
        let (_, entry_len) =
            bincode::serde::decode_from_slice::<orderly::LedgerEntry, _>(&value[1..], config)
                .unwrap();
        let end = 1 + entry_len;
        assert!(end < value.len(), "a chained entry has a tail");
        ledger.insert(key, &value[..end]).unwrap();
    }
    db.flush().unwrap();
}

#[tokio::test]
async fn entries_written_before_chained_ledgers_are_chained_at_the_first_start_to_the_same_hashes()
{
    let (mut app, p) = four_entries().await;
    let chained_as_written = app.ledger(&p.api_key).await;
    let head = app.get_json(&p.api_key, "/b2b/balance").await["ledgerHead"].clone();
    as_before_chained_ledgers(&mut app);

    let app = app.restart(&[]);

    assert_eq!(app.ledger(&p.api_key).await, chained_as_written);
    assert_eq!(
        app.get_json(&p.api_key, "/b2b/balance").await["ledgerHead"],
        head
    );
    let resp = app
        .post_order(Some(&p.api_key), Some("d"), &basket("prd_uc", 1, "p"))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let ledger = app.ledger(&p.api_key).await;
    assert_eq!(ledger[0]["seq"], 5);
    assert_eq!(ledger[0]["previousHash"], head["hash"]);
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn an_entry_an_instance_of_the_previous_version_writes_is_chained_before_this_ones_next() {
    assert!(on_postgres(), "{NEEDS_POSTGRES}");
    let (app, p) = four_entries().await;
    let url = app.database_url().expect(NEEDS_POSTGRES);
    let newest = app.ledger(&p.api_key).await[0].clone();
    // What the previous version writes for a credit: the entry, after the newest id, without
    // a chain, and the balance, under the balance row's lock.
    let id = newest["id"].as_str().unwrap();
    let next = u128::from_str_radix(&id[4..], 16).unwrap() + 1;
    let after = newest["balanceAfter"].as_i64().unwrap() + 500;
    sql_on(
        url.clone(),
        format!(
            "BEGIN;
             SELECT 1 FROM balances WHERE account_id = '{acc}' FOR UPDATE;
             INSERT INTO ledger (id, account_id, amount, reason, reference, balance_after, created_at)
                 VALUES ('txn_{next:032x}', '{acc}', 500, 'Credit', 'by the previous version', {after},
                         (extract(epoch from now()) * 1000)::bigint);
             UPDATE balances SET available = {after} WHERE account_id = '{acc}';
             COMMIT;",
            acc = p.account_id
        ),
    )
    .unwrap();
    let listed = app.ledger(&p.api_key).await;
    assert_eq!(listed[0]["seq"], Value::Null, "not chained yet");
    assert_eq!(
        app.get_json(&p.api_key, "/b2b/balance").await["ledgerHead"]["seq"],
        4,
        "the head is the newest chained entry until then"
    );

    app.credit(&p.account_id, 7).await;

    let ledger = app.ledger(&p.api_key).await;
    let seqs: Vec<u64> = ledger.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, [6, 5, 4, 3, 2, 1]);
    assert_eq!(ledger[1]["reference"], "by the previous version");
    assert_eq!(ledger[1]["previousHash"], newest["hash"]);
    assert_eq!(ledger[0]["previousHash"], ledger[1]["hash"]);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_orderly"))
        .args(["verify", "--database-url", &url])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("every chain and balance holds"), "{said}");
}
