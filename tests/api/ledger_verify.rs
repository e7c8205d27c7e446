//! docs/operations.md "Verifying the ledgers": `orderly verify` passes on what the server
//! wrote (a stopped sled store, a PostgreSQL database while the server runs, a backup), and
//! names each break planted in the database (an UPDATE or a DELETE), by account and seq; a
//! restore refuses a backup whose chain was changed. (On sled the same changes are planted in
//! a stopped store's bytes by the engine's own tests, src/store/sled/chained.rs: nothing
//! outside the engine names sled.)

use std::process::Command;
use std::time::Duration;

use reqwest::StatusCode;

use crate::helpers::{basket, sealed_backup, spawn_app, sql_on, Partner, TestApp};

const NEEDS_POSTGRES: &str = "needs ORDERLY_TEST_DATABASE_URL";

/// `orderly verify` with `args`: its exit status and stdout.
fn verify(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_orderly"))
        .arg("verify")
        .args(args)
        .env_remove("ORDERLY_DATABASE_URL")
        .env_remove("ORDERLY_DATA_DIR")
        .output()
        .expect("orderly verify runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
    )
}

/// A server whose partner has a credit and four orders: five entries.
async fn five_entries() -> (TestApp, Partner) {
    let app = spawn_app().await;
    let p = app.partner_with_balance(10_000).await;
    for key in ["a", "b", "c", "d"] {
        let resp = app
            .post_order(Some(&p.api_key), Some(key), &basket("prd_uc", 1, "p"))
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
    }
    (app, p)
}

/// Verifies the server's store: its database while it runs, or its sled store once stopped.
fn verify_store(app: &mut TestApp) -> (i32, String) {
    match app.database_url() {
        Some(url) => verify(&["--database-url", &url]),
        None => {
            stop(app);
            verify(&["--data-dir", &app.data_dir.display().to_string()])
        }
    }
}

fn stop(app: &mut TestApp) {
    if app.database_url().is_none() {
        let status = app.signal("TERM", Duration::from_secs(20));
        assert!(status.is_some(), "the server stops on SIGTERM");
    }
}

/// What a test plants in the store.
enum Plant {
    /// The entry at this seq says another thing (its reference), its hash kept.
    Rewrite(u64),
    /// The entries at seq 2 and 3 trade places.
    Swap,
    /// The newest entry is gone, the balance is not (a rewind of the ledger alone).
    DropNewest,
}

/// Plants `what` in the server's database with SQL, the server running.
fn plant(app: &mut TestApp, account: &str, what: Plant) {
    match app.database_url() {
        Some(url) => {
            let sql = match what {
                Plant::Rewrite(seq) => format!(
                    "UPDATE ledger SET reference = reference || 'x'
                     WHERE account_id = '{account}' AND seq = {seq}"
                ),
                Plant::Swap => format!(
                    "UPDATE ledger l SET amount = o.amount, reference = o.reference
                     FROM ledger o WHERE l.account_id = '{account}' AND o.account_id = l.account_id
                     AND l.seq IN (2, 3) AND o.seq = 5 - l.seq"
                ),
                Plant::DropNewest => format!(
                    "DELETE FROM ledger WHERE account_id = '{account}'
                     AND seq = (SELECT max(seq) FROM ledger WHERE account_id = '{account}')"
                ),
            };
            sql_on(url, sql).unwrap();
        }
        None => panic!("{NEEDS_POSTGRES}"),
    }
}

#[tokio::test]
async fn verify_passes_on_what_the_server_wrote_and_on_its_backup() {
    let (mut app, p) = five_entries().await;
    let backup = app.backup_text().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("orderly.backup");
    std::fs::write(&file, &backup).unwrap();
    assert_eq!(
        app.assert_ledger_matches_balance(&p.api_key).await,
        10_000 - 4 * 999
    );

    let (code, out) = verify(&["--backup", &file.display().to_string()]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("verified 1 account(s), 5 ledger entries"),
        "{out}"
    );
    let (code, out) = verify_store(&mut app);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("5 ledger entries"), "{out}");
    assert!(
        out.trim_end().ends_with("every chain and balance holds"),
        "{out}"
    );
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn verify_names_an_entry_rewritten_in_the_store_by_account_and_seq() {
    let (mut app, p) = five_entries().await;
    plant(&mut app, &p.account_id, Plant::Rewrite(3));

    let (code, out) = verify_store(&mut app);

    assert_eq!(code, 1, "{out}");
    let line = format!(
        "account {}, seq 3: hash is not what the entry's fields give",
        p.account_id
    );
    assert!(out.lines().any(|l| l == line), "{out}");
    assert_eq!(
        out.lines().filter(|l| l.starts_with("account ")).count(),
        1,
        "{out}"
    );
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn verify_names_two_entries_that_traded_places() {
    let (mut app, p) = five_entries().await;
    plant(&mut app, &p.account_id, Plant::Swap);

    let (code, out) = verify_store(&mut app);

    assert_eq!(code, 1, "{out}");
    let named: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with(&format!("account {}, seq ", p.account_id)))
        .collect();
    assert!(!named.is_empty(), "{out}");
    // The two, and at most the link after them (sled's swap moves whole entries, so the
    // fourth follows another entry than the one it hashed).
    assert!(
        named
            .iter()
            .all(|l| ["seq 2:", "seq 3:", "seq 4:"].iter().any(|s| l.contains(s))),
        "only the entries around the swap are named: {out}"
    );
    assert!(
        named[0].contains("seq 2:") || named[0].contains("seq 3:"),
        "{out}"
    );
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn verify_names_a_ledger_that_lost_its_newest_entry() {
    let (mut app, p) = five_entries().await;
    let balance = app.balance(&p.api_key).await;
    plant(&mut app, &p.account_id, Plant::DropNewest);

    let (code, out) = verify_store(&mut app);

    assert_eq!(code, 1, "{out}");
    let line = format!(
        "account {}, seq 4: the balance is {balance}, the ledger ends at {}",
        p.account_id,
        balance + 999
    );
    assert!(out.lines().any(|l| l == line), "{out}");
}

#[tokio::test]
async fn a_backup_whose_chain_was_changed_is_refused_by_restore_and_by_verify() {
    let (app, p) = five_entries().await;
    let backup = app.backup_text().await;
    // One entry's reference changed and the file's digest made right again: only the chain
    // tells.
    let mut lines: Vec<String> = backup.lines().map(str::to_string).collect();
    let at = lines
        .iter()
        .position(|l| l.contains("\"kind\":\"ledger\"") && l.contains("\"seq\":2"))
        .expect("the entry of seq 2");
    let reference = "\"reference\":\"ord_";
    lines[at] = lines[at].replacen(reference, &format!("{reference}f"), 1);
    let end = serde_json::from_str(lines.last().unwrap()).unwrap();
    let changed = sealed_backup(&lines[..lines.len() - 1], end);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("changed.backup");
    std::fs::write(&file, changed).unwrap();

    let (code, out) = verify(&["--backup", &file.display().to_string()]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!("account {}, seq 2: hash is not", p.account_id)),
        "{out}"
    );
    let restored = Command::new(env!("CARGO_BIN_EXE_orderly"))
        .args(["restore", "--from"])
        .arg(&file)
        .arg("--data-dir")
        .arg(dir.path().join("restored"))
        .output()
        .unwrap();
    assert_eq!(restored.status.code(), Some(1));
    let said = String::from_utf8_lossy(&restored.stderr);
    assert!(said.contains("the ledger's chain breaks"), "{said}");
    let left = std::fs::read_dir(dir.path().join("restored")).map_or(0, |d| d.count());
    assert_eq!(left, 0, "a refused restore leaves nothing");
}
