//! Snapshots and restores on PostgreSQL. A snapshot streams every table from one REPEATABLE
//! READ, READ ONLY transaction through cursors: one instant, no write half in it, no write
//! waiting for it, and a page of rows in memory at a time. A
//! restore writes every record into an empty database in one transaction as the records
//! stream in, tallying them (`records::Tally`), and checks every ledger and each kind's rows
//! before it commits: all or nothing.

use std::time::Duration;

use deadpool_postgres::Object;
use tokio_postgres::{IsolationLevel, Row};

use super::codec;
use super::db::Conn;
use super::reads::{row_counts, TABLES};
use super::rows;
use super::tx::{all, both, query_opt, Fault, Tx};
use crate::bounds::{BACKUP_DATABASE_PATIENCE, BACKUP_READER_PATIENCE};
use crate::store::records::{verify_counts, Tally};
use crate::store::{Producer, Record, RestoreCounts, Snapshot, StoreError};

/// Records written per round trip of a restore.
const RESTORE_BATCH: usize = 256;
/// Rows a backup's cursor fetches per round trip.
const FETCH: i32 = 512;

/// One table of a backup: its query and how a row becomes a record.
struct Table {
    sql: String,
    record: fn(&Row) -> Result<Record, StoreError>,
}

/// Every table, in the order of the backup.
fn tables() -> [Table; 12] {
    [
        Table {
            sql: format!(
                "SELECT {}, COALESCE(b.available, 0) AS available FROM accounts a
                 LEFT JOIN balances b ON b.account_id = a.id ORDER BY a.id",
                codec::ACCOUNT
            ),
            record: |row| {
                Ok(Record::Account {
                    account: codec::account(row)?,
                    balance: row.get("available"),
                })
            },
        },
        Table {
            sql: format!("SELECT {} FROM api_keys k ORDER BY k.hash", codec::API_KEY),
            record: |row| {
                let (hash, record) = codec::api_key(row)?;
                Ok(Record::ApiKey { hash, record })
            },
        },
        Table {
            sql: format!("SELECT {} FROM products ORDER BY id", codec::PRODUCT),
            record: |row| Ok(Record::Product(codec::product(row)?)),
        },
        Table {
            sql: format!("SELECT {} FROM orders ORDER BY id", codec::ORDER),
            record: |row| Ok(Record::Order(codec::order(row)?)),
        },
        Table {
            sql: format!(
                "SELECT {} FROM ledger ORDER BY account_id, id",
                codec::LEDGER
            ),
            record: |row| {
                Ok(Record::Ledger {
                    account: codec::account_id(row.get("account_id"))?,
                    entry: codec::ledger(row)?,
                })
            },
        },
        Table {
            sql: "SELECT id, order_id, amount, reason, created_at FROM refunds ORDER BY id".into(),
            record: |row| Ok(Record::Refund(codec::refund(row)?)),
        },
        Table {
            sql: "SELECT snapshot FROM events ORDER BY account_id, id".into(),
            record: |row| Ok(Record::Event(codec::event(row)?)),
        },
        Table {
            sql: "SELECT event_id, due_at, account_id, url, attempt FROM outbox
                  ORDER BY due_at, event_id"
                .into(),
            record: |row| {
                let (due_at, delivery) = codec::delivery(row)?;
                Ok(Record::Delivery { due_at, delivery })
            },
        },
        Table {
            sql: "SELECT provider, external_id, txn_id, account_id, amount, received_at
                  FROM provider_payments ORDER BY provider, external_id"
                .into(),
            record: |row| Ok(Record::ProviderPayment(codec::provider_payment(row)?)),
        },
        Table {
            sql: format!(
                "SELECT account_id, key, {} FROM idempotency_keys ORDER BY account_id, key",
                codec::KEY_ROW
            ),
            record: |row| {
                Ok(Record::IdempotencyKey {
                    account: codec::account_id(row.get("account_id"))?,
                    key: row.get("key"),
                    record: codec::key_record(row)?,
                })
            },
        },
        Table {
            sql: "SELECT event_id, log FROM delivery_logs ORDER BY event_id".into(),
            record: |row| {
                Ok(Record::DeliveryLog {
                    event_id: row.get("event_id"),
                    log: codec::json(row, "log")?,
                })
            },
        },
        Table {
            sql: "SELECT account_id, secret AS previous_secret, valid_until AS previous_valid_until
                  FROM previous_webhook_secrets ORDER BY account_id"
                .into(),
            record: |row| {
                Ok(Record::PreviousWebhookSecret {
                    account: codec::account_id(row.get("account_id"))?,
                    previous: codec::previous_secret(row)
                        .ok_or_else(|| codec::corrupt("a previous webhook secret"))?,
                })
            },
        },
    ]
}

/// Streams every table into `producer` from one REPEATABLE READ, READ ONLY transaction (one
/// instant, no write half in it, no write waiting for it), through a cursor per table that
/// fetches `FETCH` rows at a time: memory holds a page, whatever the database's size.
pub(super) async fn stream(mut client: Conn, producer: Producer) {
    let streamed = stream_tables(&mut client, &producer).await;
    client.settle();
    match streamed {
        Ok(true) => producer.finish().await,
        // The reader went away, or was sent the error that ends the snapshot.
        Ok(false) => {}
        Err(fault) => {
            producer.send(Err(fault.into())).await;
        }
    }
}

async fn stream_tables(client: &mut Object, producer: &Producer) -> Result<bool, Fault> {
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    // A stream whose reader stops is given up here after BACKUP_READER_PATIENCE (`Producer`);
    // the server ends the snapshot a little later on its own, should this process stop
    // answering at all (paused, or its machine lost without closing the socket).
    let idle = (BACKUP_READER_PATIENCE + Duration::from_secs(15))
        .as_millis()
        .to_string();
    query_opt(
        &tx,
        "SELECT set_config('idle_in_transaction_session_timeout', $1, true)",
        &[&idle],
    )
    .await?;
    for table in tables() {
        let portal = tx.bind(table.sql.as_str(), &[]).await?;
        loop {
            // A database replaced or silent under the snapshot ends the backup with an
            // error rather than holding it open.
            let rows =
                tokio::time::timeout(BACKUP_DATABASE_PATIENCE, tx.query_portal(&portal, FETCH))
                    .await
                    .map_err(|_| {
                        StoreError::TimedOut(format!(
                            "the database gave no rows for {} s",
                            BACKUP_DATABASE_PATIENCE.as_secs()
                        ))
                    })??;
            if rows.is_empty() {
                break;
            }
            for row in &rows {
                let record = (table.record)(row);
                let failed = record.is_err();
                if !producer.send(record).await || failed {
                    return Ok(false);
                }
            }
        }
    }
    tx.commit().await?;
    Ok(true)
}

async fn write(tx: &Tx<'_>, record: &Record, keys_change: i64) -> Result<(), Fault> {
    match record {
        Record::Account { account, balance } => rows::insert_account(tx, account, *balance).await,
        Record::ApiKey { hash, record } => {
            rows::insert_api_key(tx, hash, record, keys_change).await
        }
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
        Record::PreviousWebhookSecret { account, previous } => {
            rows::upsert_previous_secret(tx, account, previous).await
        }
    }
}

/// `records` is taken by the first attempt: a stream is read once, so a restore is never
/// retried on what is left of it.
pub(super) async fn restore(
    client: &mut Conn,
    records: Option<Snapshot>,
) -> Result<RestoreCounts, Fault> {
    let Some(mut records) = records else {
        return Err(StoreError::Failed("a restore cannot be retried".into()).into());
    };
    // The transaction begins with the first record, not before: a source still taking its
    // snapshot (a sled walk of a million orders) would hold it idle past its timeout.
    let mut next = records.next().await.transpose()?;
    let (tx, gate) = client.begin().await?;
    let ((), counted) = both(gate.limit_waits(&tx), row_counts(&tx)).await?;
    // Between batches the transaction waits for the source's next records (a file, another
    // store's walk), which may pause longer than a request's transaction ever does.
    let idle = BACKUP_READER_PATIENCE.as_millis().to_string();
    query_opt(
        &tx,
        "SELECT set_config('idle_in_transaction_session_timeout', $1, true)",
        &[&idle],
    )
    .await?;
    if counted.iter().any(|(_, rows)| *rows > 0) {
        return Err(StoreError::Refused("the target database is not empty".into()).into());
    }
    // The restored keys are one change of the keys, numbered once (migration 0011): one bump
    // per key would make the restore's time grow with the square of their number.
    query_opt(
        &tx,
        "SELECT set_config('orderly.restoring_keys', 'on', true)",
        &[],
    )
    .await?;
    let keys_change: i64 = query_opt(
        &tx,
        "UPDATE auth_cache_version SET version = version + 1 RETURNING version",
        &[],
    )
    .await?
    .ok_or_else(|| StoreError::Corrupt("auth_cache_version has no row".into()))?
    .get(0);
    let mut tally = Tally::default();
    let mut batch = Vec::with_capacity(RESTORE_BATCH);
    loop {
        let ended = next.is_none();
        if let Some(record) = next {
            tally.add(&record);
            batch.push(record);
        }
        if batch.len() == RESTORE_BATCH || (ended && !batch.is_empty()) {
            all(batch.iter().map(|record| write(&tx, record, keys_change))).await?;
            batch.clear();
        }
        if ended {
            break;
        }
        next = records.next().await.transpose()?;
    }
    let counts = tally.finish()?;
    verify(&tx, &counts).await?;
    gate.commit(tx).await?;
    Ok(counts)
}

/// What was written matches what was meant: as many rows of each kind as its records.
async fn verify(tx: &Tx<'_>, expected: &RestoreCounts) -> Result<(), Fault> {
    let found = row_counts(tx).await?;
    let kinds = TABLES
        .iter()
        .zip(found)
        .map(|((_, kind), (_, rows))| (*kind, rows));
    Ok(verify_counts(expected, kinds)?)
}
