//! SPEC section 21, backups and restores: `GET /admin/backup` taken while orders stream in,
//! restored with `orderly restore` into an empty data directory, and the restored server
//! holding every order acknowledged before the backup began, no order without its charge,
//! balanced ledgers, and every key of the backup replaying byte for byte. A truncated or
//! altered backup restores nothing.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::{basket, on_postgres, spawn_app_with, start, TestDatabase, ADMIN_TOKEN};

/// Every key answered 200, with its order id and the exact body of that answer.
type Answers = HashMap<String, (String, Vec<u8>)>;

/// `orderly restore` into `data_dir`, or on PostgreSQL into the database that `start(data_dir)`
/// will use (created here, empty, on first use).
fn restore(file: &Path, data_dir: &Path, database: &Option<TestDatabase>) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_orderly"));
    command.args(["restore", "--from"]).arg(file);
    match database {
        Some(db) => command.args(["--database-url", &db.url]),
        None => command.arg("--data-dir").arg(data_dir),
    };
    command.output().expect("orderly restore runs")
}

/// The keys a backup file holds (its idempotency-key records).
fn keys_in(backup: &[u8]) -> Vec<String> {
    backup
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice::<Value>(l).unwrap())
        .filter(|v| v["kind"] == "idempotencyKey")
        .map(|v| v["key"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_taken_under_load_restores_every_acknowledged_order_and_replays_every_key() {
    let app = spawn_app_with(&[]).await;
    let p = app.partner_with_balance(10_000_000).await;
    let body = basket("prd_uc", 1, "p");
    let answered: Arc<Mutex<Answers>> = Arc::default();
    for i in 0..30 {
        let key = format!("before-{i}");
        let resp = app.post_order(Some(&p.api_key), Some(&key), &body).await;
        let bytes = resp.bytes().await.unwrap().to_vec();
        let id = serde_json::from_slice::<Value>(&bytes).unwrap()["order"]["id"]
            .as_str()
            .unwrap()
            .to_string();
        answered.lock().unwrap().insert(key, (id, bytes));
    }
    let acknowledged_before: Vec<String> = answered.lock().unwrap().keys().cloned().collect();

    // A steady stream of orders while the backup is taken and read.
    let stop = Arc::new(AtomicBool::new(false));
    let stream = {
        let (client, url, api_key, body) = (
            app.client.clone(),
            app.url("/b2b/orders"),
            p.api_key.clone(),
            body.clone(),
        );
        let (stop, answered) = (Arc::clone(&stop), Arc::clone(&answered));
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) && i < 2_000 {
                let key = format!("during-{i}");
                let resp = client
                    .post(&url)
                    .header("X-Api-Key", &api_key)
                    .header("X-Idempotency-Key", &key)
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(resp.status(), StatusCode::OK);
                let bytes = resp.bytes().await.unwrap().to_vec();
                let v: Value = serde_json::from_slice(&bytes).unwrap();
                let id = v["order"]["id"].as_str().unwrap().to_string();
                answered.lock().unwrap().insert(key, (id, bytes));
                i += 1;
            }
        })
    };
    // The stream is under way (bounded wait) when the backup is taken.
    for _ in 0..500 {
        if answered.lock().unwrap().len() >= 50 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let backup = app
        .client
        .get(app.url("/admin/backup"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(backup.status(), StatusCode::OK);
    assert_eq!(backup.headers()["Content-Type"], "application/octet-stream");
    let backup = backup.bytes().await.unwrap().to_vec();
    stop.store(true, Ordering::SeqCst);
    stream.await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("orderly.backup");
    std::fs::write(&file, &backup).unwrap();
    let restored_dir = dir.path().join("restored");
    let database = on_postgres().then(|| TestDatabase::create(&restored_dir));
    let out = restore(&file, &restored_dir, &database);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let counts: Value = serde_json::from_slice(&out.stdout).unwrap();
    eprintln!(
        "restored {counts}; {} orders answered in all",
        answered.lock().unwrap().len()
    );
    assert!(counts["order"].as_u64().unwrap() >= 30, "{counts}");

    drop(app);
    let restored = start(&restored_dir, &[]);
    let orders = restored.orders(&p.api_key).await;
    let ledger = restored.ledger(&p.api_key).await;
    for key in &acknowledged_before {
        let id = &answered.lock().unwrap()[key].0;
        assert!(
            orders.iter().any(|o| o["id"] == id.as_str()),
            "order {id}, acknowledged before the backup, is restored"
        );
    }
    for order in &orders {
        let charged = ledger
            .iter()
            .any(|e| e["reason"] == "order" && e["reference"] == order["id"]);
        assert!(charged, "order {} has its charge", order["id"]);
    }
    restored.assert_ledger_matches_balance(&p.api_key).await;

    let keys = keys_in(&backup);
    assert!(keys.len() >= 30);
    for key in keys
        .iter()
        .filter(|k| k.starts_with("before-") || k.starts_with("during-"))
    {
        let replay = restored
            .post_order(Some(&p.api_key), Some(key), &body)
            .await;
        assert_eq!(replay.headers()["Idempotency-Replayed"], "true", "{key}");
        let original = answered.lock().unwrap()[key].1.clone();
        assert_eq!(
            replay.bytes().await.unwrap().to_vec(),
            original,
            "{key} replays byte for byte"
        );
    }

    // Into a target that holds data: refused, and the data is untouched.
    drop(restored);
    let again = restore(&file, &restored_dir, &database);
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("not empty"));
}

#[tokio::test]
async fn a_truncated_or_altered_backup_restores_nothing() {
    let app = spawn_app_with(&[]).await;
    let p = app.partner_with_balance(10_000).await;
    app.post_order(Some(&p.api_key), Some("k"), &basket("prd_uc", 1, "p"))
        .await;
    let backup = app
        .client
        .get(app.url("/admin/backup"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .to_vec();
    let dir = tempfile::tempdir().unwrap();
    let mut altered = backup.clone();
    let middle = altered.len() / 2;
    altered[middle] = if altered[middle] == b'7' { b'8' } else { b'7' };
    for (name, bytes) in [
        ("truncated", backup[..backup.len() - 20].to_vec()),
        ("altered", altered),
    ] {
        let file = dir.path().join(name);
        std::fs::write(&file, bytes).unwrap();
        let target = dir.path().join(format!("{name}-db"));
        let database = on_postgres().then(|| TestDatabase::create(&target));
        let out = restore(&file, &target, &database);
        assert_eq!(out.status.code(), Some(1), "{name}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "one line on stderr: {stderr}");
        assert!(!target.exists(), "{name}: nothing written");
    }
    // The untouched file restores.
    let file = dir.path().join("whole");
    std::fs::write(&file, &backup).unwrap();
    let target = dir.path().join("whole-db");
    let database = on_postgres().then(|| TestDatabase::create(&target));
    assert!(restore(&file, &target, &database).status.success());
}
