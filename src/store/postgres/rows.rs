//! One INSERT per kind of record, shared by the operations and by a restore, so that a row
//! restored from a backup is the row the operation would have written.

use deadpool_postgres::GenericClient;
use tokio_postgres::types::Json;

use super::codec::{tag, time};
use super::tx::{execute, Fault};
use crate::domain::account::{Account, ApiKeyRecord};
use crate::domain::event::{Delivery, DeliveryLog, Event};
use crate::domain::ids::AccountId;
use crate::domain::ledger::LedgerEntry;
use crate::domain::order::{Order, Refund};
use crate::domain::product::Product;
use crate::domain::time::Millis;
use crate::store::{KeyRecord, ProviderPaymentRecord, StoreError};

pub async fn insert_account<C: GenericClient>(
    c: &C,
    account: &Account,
    balance: i64,
) -> Result<(), Fault> {
    let id = account.id.to_string();
    execute(
        c,
        "INSERT INTO accounts (id, name, wholesale, credit_limit, region, webhook_secret, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
        &[
            &id,
            &account.name,
            &account.wholesale,
            &account.credit_limit,
            &account.region,
            &account.webhook_secret,
            &time(account.created_at),
        ],
    )
    .await?;
    execute(
        c,
        "INSERT INTO balances (account_id, available, credit_limit) VALUES ($1, $2, $3)",
        &[&id, &balance, &account.credit_limit],
    )
    .await?;
    Ok(())
}

pub async fn insert_api_key<C: GenericClient>(
    c: &C,
    hash: &[u8; 32],
    record: &ApiKeyRecord,
) -> Result<(), Fault> {
    execute(
        c,
        "INSERT INTO api_keys (hash, id, account_id, scopes, revoked, created_at)
         VALUES ($1, $2, $3, $4, $5, $6)",
        &[
            &&hash[..],
            &record.id,
            &record.account_id.to_string(),
            &Json(&record.scopes),
            &record.revoked,
            &time(record.created_at),
        ],
    )
    .await?;
    Ok(())
}

pub async fn upsert_product<C: GenericClient>(c: &C, product: &Product) -> Result<(), Fault> {
    execute(
        c,
        "INSERT INTO products (id, name, price, regions, delivery_fields, active, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (id) DO UPDATE SET name = excluded.name, price = excluded.price,
             regions = excluded.regions, delivery_fields = excluded.delivery_fields,
             active = excluded.active, updated_at = excluded.updated_at",
        &[
            &product.id,
            &product.name,
            &product.price,
            &Json(&product.regions),
            &Json(&product.delivery_fields),
            &product.active,
            &time(product.updated_at),
        ],
    )
    .await?;
    Ok(())
}

pub async fn insert_order<C: GenericClient>(c: &C, order: &Order) -> Result<(), Fault> {
    execute(
        c,
        "INSERT INTO orders (id, account_id, status, items, total, currency, callback_url,
             external_order_id, refunded, created_at, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        &[
            &order.id.to_string(),
            &order.account_id.to_string(),
            &tag(&order.status),
            &Json(&order.items),
            &order.total,
            &order.currency,
            &order.callback_url,
            &order.external_order_id,
            &order.refunded,
            &time(order.created_at),
            &time(order.updated_at),
        ],
    )
    .await?;
    Ok(())
}

/// The order's changing parts: its status, what was refunded, when it last changed.
pub async fn update_order<C: GenericClient>(c: &C, order: &Order) -> Result<(), Fault> {
    execute(
        c,
        "UPDATE orders SET status = $2, refunded = $3, updated_at = $4 WHERE id = $1",
        &[
            &order.id.to_string(),
            &tag(&order.status),
            &order.refunded,
            &time(order.updated_at),
        ],
    )
    .await?;
    Ok(())
}

/// The account's balance, its row locked until the commit: what a decision that moves money
/// reads, so that no other transaction moves it in between.
pub async fn lock_balance<C: GenericClient>(c: &C, account: &AccountId) -> Result<i64, Fault> {
    let row = super::tx::query_opt(
        c,
        "SELECT available FROM balances WHERE account_id = $1 FOR UPDATE",
        &[&account.to_string()],
    )
    .await?
    .ok_or_else(|| StoreError::Corrupt(format!("account {account} has no balance row")))?;
    Ok(row.get(0))
}

/// Writes money a decision moved: the new balance and its ledger entry, whose
/// `balance_after` it is. The caller holds the balance row's lock (`lock_balance`).
pub async fn move_money<C: GenericClient>(
    c: &C,
    account: &AccountId,
    entry: &LedgerEntry,
) -> Result<(), Fault> {
    futures_util::future::try_join(
        set_balance(c, account, entry.balance_after),
        insert_ledger(c, account, entry),
    )
    .await?;
    Ok(())
}

/// The balance as a decision left it; the caller holds its row's lock (`lock_balance`).
pub async fn set_balance<C: GenericClient>(
    c: &C,
    account: &AccountId,
    available: i64,
) -> Result<(), Fault> {
    execute(
        c,
        "UPDATE balances SET available = $1 WHERE account_id = $2",
        &[&available, &account.to_string()],
    )
    .await?;
    Ok(())
}

pub async fn insert_ledger<C: GenericClient>(
    c: &C,
    account: &AccountId,
    entry: &LedgerEntry,
) -> Result<(), Fault> {
    execute(
        c,
        "INSERT INTO ledger (id, account_id, amount, reason, reference, balance_after, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
        &[
            &entry.id,
            &account.to_string(),
            &entry.amount,
            &tag(&entry.reason),
            &entry.reference,
            &entry.balance_after,
            &time(entry.created_at),
        ],
    )
    .await?;
    Ok(())
}

pub async fn insert_refund<C: GenericClient>(c: &C, refund: &Refund) -> Result<(), Fault> {
    execute(
        c,
        "INSERT INTO refunds (id, order_id, amount, reason, created_at) VALUES ($1, $2, $3, $4, $5)",
        &[
            &refund.id,
            &refund.order_id.to_string(),
            &refund.amount,
            &refund.reason,
            &time(refund.created_at),
        ],
    )
    .await?;
    Ok(())
}

pub async fn insert_event<C: GenericClient>(c: &C, event: &Event) -> Result<(), Fault> {
    execute(
        c,
        "INSERT INTO events (id, account_id, created_at, snapshot) VALUES ($1, $2, $3, $4)",
        &[
            &event.id,
            &event.account_id.to_string(),
            &time(event.created_at),
            &Json(event),
        ],
    )
    .await?;
    Ok(())
}

pub async fn insert_delivery<C: GenericClient>(
    c: &C,
    due_at: Millis,
    delivery: &Delivery,
) -> Result<(), Fault> {
    execute(
        c,
        "INSERT INTO outbox (event_id, due_at, account_id, url, attempt) VALUES ($1, $2, $3, $4, $5)",
        &[
            &delivery.event_id,
            &time(due_at),
            &delivery.account_id.to_string(),
            &delivery.url,
            &(delivery.attempt.min(i32::MAX as u32) as i32),
        ],
    )
    .await?;
    Ok(())
}

pub async fn upsert_delivery_log<C: GenericClient>(
    c: &C,
    event_id: &str,
    log: &DeliveryLog,
) -> Result<(), Fault> {
    execute(
        c,
        "INSERT INTO delivery_logs (event_id, log) VALUES ($1, $2)
         ON CONFLICT (event_id) DO UPDATE SET log = excluded.log",
        &[&event_id, &Json(log)],
    )
    .await?;
    Ok(())
}

pub async fn insert_provider_payment<C: GenericClient>(
    c: &C,
    p: &ProviderPaymentRecord,
) -> Result<(), Fault> {
    execute(
        c,
        "INSERT INTO provider_payments (provider, external_id, txn_id, account_id, amount, received_at)
         VALUES ($1, $2, $3, $4, $5, $6)",
        &[
            &p.provider,
            &p.external_id,
            &p.txn_id,
            &p.account.to_string(),
            &p.amount,
            &time(p.received_at),
        ],
    )
    .await?;
    Ok(())
}

pub async fn insert_key_row<C: GenericClient>(
    c: &C,
    account: &AccountId,
    key: &str,
    record: &KeyRecord,
) -> Result<(), Fault> {
    execute(
        c,
        "INSERT INTO idempotency_keys (account_id, key, operation, fingerprint, expires_at,
             status, content_type, body)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        &[
            &account.to_string(),
            &key,
            &tag(&record.operation),
            &&record.fingerprint.0[..],
            &time(record.expires_at),
            &i32::from(record.response.status),
            &record.response.content_type,
            &record.response.body,
        ],
    )
    .await?;
    Ok(())
}
