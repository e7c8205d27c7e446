//! Snapshots and restores on PostgreSQL. A snapshot reads every table in one REPEATABLE READ,
//! READ ONLY transaction: one instant, no write half in it, and no write waits for it. A
//! restore checks the backup whole (`records::checked_counts`), writes every record into an
//! empty database in one transaction and checks each kind's rows before it commits: all or
//! nothing.

use deadpool_postgres::{Object, Transaction};
use futures_util::future::try_join_all;
use tokio_postgres::IsolationLevel;

use super::codec;
use super::reads::{row_counts, TABLES};
use super::rows;
use super::tx::{query, Fault};
use crate::store::records::{checked_counts, verify_counts};
use crate::store::{Record, RestoreCounts, StoreError};

/// Records written per round trip of a restore.
const RESTORE_BATCH: usize = 256;

pub async fn snapshot(client: &mut Object) -> Result<Vec<Record>, Fault> {
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    let mut records = Vec::new();
    let sql = format!(
        "SELECT {}, COALESCE(b.available, 0) AS available FROM accounts a
         LEFT JOIN balances b ON b.account_id = a.id ORDER BY a.id",
        codec::ACCOUNT
    );
    for row in query(&tx, &sql, &[]).await? {
        records.push(Record::Account {
            account: codec::account(&row)?,
            balance: row.get("available"),
        });
    }
    let sql = format!("SELECT {} FROM api_keys k ORDER BY k.hash", codec::API_KEY);
    for row in query(&tx, &sql, &[]).await? {
        let (hash, record) = codec::api_key(&row)?;
        records.push(Record::ApiKey { hash, record });
    }
    let sql = format!("SELECT {} FROM products ORDER BY id", codec::PRODUCT);
    for row in query(&tx, &sql, &[]).await? {
        records.push(Record::Product(codec::product(&row)?));
    }
    let sql = format!("SELECT {} FROM orders ORDER BY id", codec::ORDER);
    for row in query(&tx, &sql, &[]).await? {
        records.push(Record::Order(codec::order(&row)?));
    }
    let sql = format!(
        "SELECT {} FROM ledger ORDER BY account_id, id",
        codec::LEDGER
    );
    for row in query(&tx, &sql, &[]).await? {
        records.push(Record::Ledger {
            account: codec::account_id(row.get("account_id"))?,
            entry: codec::ledger(&row)?,
        });
    }
    let sql = "SELECT id, order_id, amount, reason, created_at FROM refunds ORDER BY id";
    for row in query(&tx, sql, &[]).await? {
        records.push(Record::Refund(codec::refund(&row)?));
    }
    for row in query(
        &tx,
        "SELECT snapshot FROM events ORDER BY account_id, id",
        &[],
    )
    .await?
    {
        records.push(Record::Event(codec::event(&row)?));
    }
    let sql =
        "SELECT event_id, due_at, account_id, url, attempt FROM outbox ORDER BY due_at, event_id";
    for row in query(&tx, sql, &[]).await? {
        let (due_at, delivery) = codec::delivery(&row)?;
        records.push(Record::Delivery { due_at, delivery });
    }
    let sql = "SELECT provider, external_id, txn_id, account_id, amount, received_at
               FROM provider_payments ORDER BY provider, external_id";
    for row in query(&tx, sql, &[]).await? {
        records.push(Record::ProviderPayment(codec::provider_payment(&row)?));
    }
    let sql = format!(
        "SELECT account_id, key, {} FROM idempotency_keys ORDER BY account_id, key",
        codec::KEY_ROW
    );
    for row in query(&tx, &sql, &[]).await? {
        records.push(Record::IdempotencyKey {
            account: codec::account_id(row.get("account_id"))?,
            key: row.get("key"),
            record: codec::key_record(&row)?,
        });
    }
    for row in query(
        &tx,
        "SELECT event_id, log FROM delivery_logs ORDER BY event_id",
        &[],
    )
    .await?
    {
        records.push(Record::DeliveryLog {
            event_id: row.get("event_id"),
            log: codec::json(&row, "log")?,
        });
    }
    tx.commit().await?;
    Ok(records)
}

async fn write(tx: &Transaction<'_>, record: &Record) -> Result<(), Fault> {
    match record {
        Record::Account { account, balance } => rows::insert_account(tx, account, *balance).await,
        Record::ApiKey { hash, record } => rows::insert_api_key(tx, hash, record).await,
        Record::Product(product) => rows::upsert_product(tx, product).await,
        Record::Order(order) => rows::insert_orders(tx, &[order]).await,
        Record::Ledger { account, entry } => rows::insert_ledger(tx, &[(account, entry)]).await,
        Record::Refund(refund) => rows::insert_refund(tx, refund).await,
        Record::Event(event) => rows::insert_event(tx, event).await,
        Record::Delivery { due_at, delivery } => rows::insert_delivery(tx, *due_at, delivery).await,
        Record::ProviderPayment(p) => rows::insert_provider_payment(tx, p).await,
        Record::IdempotencyKey {
            account,
            key,
            record,
        } => rows::insert_key_rows(tx, &[(account, key, record)]).await,
        Record::DeliveryLog { event_id, log } => rows::upsert_delivery_log(tx, event_id, log).await,
    }
}

pub async fn restore(client: &mut Object, records: &[Record]) -> Result<RestoreCounts, Fault> {
    let counts = checked_counts(records)?;
    let tx = client.transaction().await?;
    if row_counts(&tx).await?.iter().any(|(_, rows)| *rows > 0) {
        return Err(StoreError::Refused("the target database is not empty".into()).into());
    }
    for batch in records.chunks(RESTORE_BATCH) {
        try_join_all(batch.iter().map(|record| write(&tx, record))).await?;
    }
    verify(&tx, &counts).await?;
    tx.commit().await?;
    Ok(counts)
}

/// What was written matches what was meant: as many rows of each kind as its records.
async fn verify(tx: &Transaction<'_>, expected: &RestoreCounts) -> Result<(), Fault> {
    let found = row_counts(tx).await?;
    let kinds = TABLES
        .iter()
        .zip(found)
        .map(|((_, kind), (_, rows))| (*kind, rows));
    Ok(verify_counts(expected, kinds)?)
}
