//! docs/contract.md "Money at its limits": a cancel or a refund whose money would not fit back in
//! the balance is refused 400 `BALANCE_TOO_LARGE`, nothing changed and the key left free, and
//! the server goes on serving. Payments are bounded as credits are, so no request reaches such a
//! balance within a test's time; a backup of a real deployment, its balances raised by the same
//! amount throughout and its digest made anew, is restored to make one (an operator's restore
//! of an older deployment, whose payments were not bounded, is where a partner would meet it).

use std::path::Path;
use std::process::Command;

use reqwest::StatusCode;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::helpers::{
    basket, on_postgres, order_status, spawn_app_with, start, wait_until_completed, Partner,
    TestApp, TestDatabase, ADMIN_TOKEN,
};
use crate::providers::{notify, signature, SECRET};

/// The balance the restored account is left with: 999 more and it would not fit.
const NEAR_THE_END: i64 = i64::MAX - 500;

/// `backup` with the amounts of `account`'s credits replaced by `credits`, in ledger order,
/// every balance after them (each entry's and the account's) following, and its digest made
/// anew.
fn with_credits(backup: &[u8], account: &str, credits: &[i64]) -> Vec<u8> {
    let text = std::str::from_utf8(backup).unwrap();
    let mut out = String::new();
    let mut credits = credits.iter();
    let mut running = 0i64;
    let mut balance_line = None;
    for line in text.lines() {
        let mut record: Value = serde_json::from_str(line).unwrap();
        match record["kind"].as_str().unwrap() {
            "end" => {
                // The account's line came before its ledger: its balance is put in last.
                let (at, mut account_line): (usize, Value) = balance_line.take().unwrap();
                account_line["balance"] = json!(running);
                let line = serde_json::to_string(&account_line).unwrap();
                out.replace_range(at..at + out[at..].find('\n').unwrap(), &line);
                let digest: String = Sha256::digest(out.as_bytes())
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                record["sha256"] = json!(digest);
            }
            "account" if record["account"]["id"] == account => {
                balance_line = Some((out.len(), record.clone()));
            }
            "ledger" if record["account"] == account => {
                // Entries made by hand, as a backup of a build before chained ledgers has
                // them: no seq and no hash (chained when the restored store opens).
                let fields = record.as_object_mut().unwrap();
                fields.remove("seq");
                fields.remove("hash");
                let entry = &mut record["entry"];
                if entry["reason"] == "Credit" {
                    entry["amount"] = json!(credits.next().expect("a new amount for each credit"));
                }
                running = running
                    .checked_add(entry["amount"].as_i64().unwrap())
                    .unwrap();
                entry["balance_after"] = json!(running);
            }
            _ => {}
        }
        out.push_str(&serde_json::to_string(&record).unwrap());
        out.push('\n');
    }
    out.into_bytes()
}

/// A server restored from `app`'s backup with `partner`'s balance raised to `NEAR_THE_END`:
/// its ledger is a credit, an order of 999 and a second credit, which become credits of
/// i64::MAX and 499.
async fn restored_near_the_end(
    app: &TestApp,
    partner: &Partner,
    flags: &[&str],
) -> (TestApp, Restored) {
    app.credit(&partner.account_id, 1).await;
    let backup = app
        .client
        .get(app.url("/admin/backup"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let root = tempfile::tempdir().unwrap();
    let file = root.path().join("near-the-end.backup");
    std::fs::write(
        &file,
        with_credits(&backup, &partner.account_id, &[i64::MAX, 499]),
    )
    .unwrap();
    let dir = root.path().join("restored");
    let database = on_postgres().then(|| TestDatabase::create(&dir));
    restore(&file, &dir, &database);
    let restored = start(&dir, flags);
    assert_eq!(restored.balance(&partner.api_key).await, NEAR_THE_END);
    (
        restored,
        Restored {
            _dir: root,
            _database: database,
        },
    )
}

/// What the restored server stands on (its directory, or its database), kept until its end.
struct Restored {
    _dir: tempfile::TempDir,
    _database: Option<TestDatabase>,
}

fn restore(file: &Path, dir: &Path, database: &Option<TestDatabase>) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_orderly"));
    command.args(["restore", "--from"]).arg(file);
    match database {
        Some(db) => command.args(["--database-url", &db.server_url]),
        None => command.arg("--data-dir").arg(dir),
    };
    let out = command.output().expect("orderly restore runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn refused_as_too_large(resp: reqwest::Response, what: &str) {
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(
        body,
        json!({"success": false, "error": format!("balance_too_large: the balance after this {what} does not fit"), "code": "BALANCE_TOO_LARGE"})
    );
}

#[tokio::test]
async fn a_cancel_whose_money_would_not_fit_the_balance_is_refused_400_and_changes_nothing() {
    let flags = ["--fulfillment-delay", "1h"];
    let app = spawn_app_with(&flags).await;
    let p = app.partner_with_balance(1_000).await;
    let placed = app
        .post_order(Some(&p.api_key), Some("o"), &basket("prd_uc", 1, "@p"))
        .await;
    let order: Value = placed.json().await.unwrap();
    let id = order["order"]["id"].as_str().unwrap().to_string();
    let (restored, _root) = restored_near_the_end(&app, &p, &flags).await;
    let cancel = |key: &'static str| {
        restored
            .client
            .post(restored.url(&format!("/b2b/orders/{id}/cancel")))
            .header("X-Api-Key", &p.api_key)
            .header("X-Idempotency-Key", key)
            .send()
    };
    refused_as_too_large(cancel("c").await.unwrap(), "cancel").await;
    // The retry meets the same refusal (the key was left free), and the server still serves.
    refused_as_too_large(cancel("c").await.unwrap(), "cancel").await;
    let unkeyed = restored.cancel(&p.api_key, &id).await;
    refused_as_too_large(unkeyed, "cancel").await;
    assert_eq!(restored.balance(&p.api_key).await, NEAR_THE_END);
    assert_eq!(order_status(&restored, &p.api_key, &id).await, "processing");
    assert_eq!(
        restored.assert_ledger_matches_balance(&p.api_key).await,
        NEAR_THE_END
    );
}

#[tokio::test]
async fn a_refund_whose_money_would_not_fit_the_balance_is_refused_400_and_changes_nothing() {
    let flags = ["--fulfillment-delay", "50ms"];
    let app = spawn_app_with(&flags).await;
    let p = app.partner_with_balance(1_000).await;
    let placed = app
        .post_order(Some(&p.api_key), Some("o"), &basket("prd_uc", 1, "@p"))
        .await;
    let order: Value = placed.json().await.unwrap();
    let id = order["order"]["id"].as_str().unwrap().to_string();
    wait_until_completed(&app, &p.api_key, &id).await;
    let (restored, _root) = restored_near_the_end(&app, &p, &flags).await;
    let refund = |amount: i64| {
        restored
            .client
            .post(restored.url(&format!("/b2b/orders/{id}/refunds")))
            .header("X-Api-Key", &p.api_key)
            .header("X-Idempotency-Key", format!("r{amount}"))
            .json(&json!({"amount": amount}))
            .send()
    };
    refused_as_too_large(refund(999).await.unwrap(), "refund").await;
    assert_eq!(restored.balance(&p.api_key).await, NEAR_THE_END);
    // What still fits is refunded, to the last unit.
    let fits = refund(500).await.unwrap();
    assert_eq!(fits.status(), StatusCode::OK);
    assert_eq!(restored.balance(&p.api_key).await, i64::MAX);
    assert_eq!(
        restored.assert_ledger_matches_balance(&p.api_key).await,
        i64::MAX
    );
}

#[tokio::test]
async fn a_payment_that_would_overflow_the_balance_is_refused_and_a_cancel_after_it_is_not_a_crash()
{
    let flags = [
        "--fulfillment-delay",
        "1h",
        "--provider-secret",
        &format!("acmepay={SECRET}"),
    ];
    let app = spawn_app_with(&flags).await;
    let p = app.partner_with_balance(1_000).await;
    let placed = app
        .post_order(Some(&p.api_key), Some("o"), &basket("prd_uc", 1, "@p"))
        .await;
    let order: Value = placed.json().await.unwrap();
    let id = order["order"]["id"].as_str().unwrap().to_string();
    let (restored, _root) = restored_near_the_end(&app, &p, &flags).await;
    let body = serde_json::to_vec(&json!({"id": "pay-1", "type": "payment.succeeded",
        "accountId": p.account_id, "amount": 1_000, "currency": "USD"}))
    .unwrap();
    let resp = notify(&restored, "acmepay", &body, &signature(&body)).await;
    refused_as_too_large(resp, "payment").await;
    refused_as_too_large(restored.cancel(&p.api_key, &id).await, "cancel").await;
    assert_eq!(restored.balance(&p.api_key).await, NEAR_THE_END);
}
