//! CHANGELOG "Several versions at once": entries written before chained ledgers are chained in
//! their order when this version first opens the store or database, to the hashes the same
//! entries get when chained as they are written (a backup of an earlier build restored, on both
//! engines; a database of the schema before, on PostgreSQL; a sled store an earlier build
//! wrote is the engine's own test, src/store/sled/chained.rs); and on PostgreSQL an entry
//! that an instance of the previous version writes beside this one is chained before this
//! one's next entry.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::{
    back_to_schema, basket, on_postgres, sealed_backup, spawn_app, sql_on, start, Partner, TestApp,
    TestDatabase,
};

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

/// `GET /admin/backup` as a build before chained ledgers would have written it: every ledger
/// line without its `seq` and `hash` (the digest made right again).
async fn backup_before_chained_ledgers(app: &TestApp) -> String {
    let backup = app.backup_text().await;
    let mut lines: Vec<Value> = backup
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let end = lines.pop().unwrap();
    for line in lines.iter_mut().filter(|l| l["kind"] == "ledger") {
        let fields = line.as_object_mut().unwrap();
        assert!(fields.remove("seq").is_some() && fields.remove("hash").is_some());
    }
    let records: Vec<String> = lines.iter().map(Value::to_string).collect();
    sealed_backup(&records, end)
}

#[tokio::test]
async fn a_backup_of_a_build_before_chained_ledgers_is_chained_at_the_first_start_to_the_same_hashes(
) {
    let (app, p) = four_entries().await;
    let chained_as_written = app.ledger(&p.api_key).await;
    let head = app.get_json(&p.api_key, "/b2b/balance").await["ledgerHead"].clone();
    let backup = backup_before_chained_ledgers(&app).await;
    drop(app);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("earlier.backup");
    std::fs::write(&file, backup).unwrap();
    let restored_dir = dir.path().join("restored");
    let database = on_postgres().then(|| TestDatabase::create(&restored_dir));
    let mut restore = std::process::Command::new(env!("CARGO_BIN_EXE_orderly"));
    restore.args(["restore", "--from"]).arg(&file);
    match &database {
        Some(db) => restore.args(["--database-url", &db.server_url]),
        None => restore.arg("--data-dir").arg(&restored_dir),
    };
    let out = restore.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let app = start(&restored_dir, &[]);

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
    drop(app);
    drop(database);
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn a_database_of_the_schema_before_chained_ledgers_is_chained_at_the_first_start_to_the_same_hashes(
) {
    let (mut app, p) = four_entries().await;
    let chained_as_written = app.ledger(&p.api_key).await;
    let url = app.database_url().expect(NEEDS_POSTGRES);
    assert!(app.signal("TERM", Duration::from_secs(20)).is_some());
    back_to_schema(&url, 12);

    let app = app.restart(&[]);

    assert_eq!(app.ledger(&p.api_key).await, chained_as_written);
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
