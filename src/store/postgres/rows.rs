//! One INSERT per kind of record, shared by the operations and by a restore, so that a row
//! restored from a backup is the row the operation would have written.

use tokio_postgres::types::Json;

use super::chain_rows::{catch_up, head_of, NEWEST_ENTRY_SQL};
use super::codec::{tag, time};
pub(super) use super::order_rows::{insert_key_rows, insert_ledger, insert_orders, set_balances};
use super::tx::{both, execute, Fault, Session};
use crate::domain::account::{Account, ApiKeyRecord};
use crate::domain::chain::Funds;
use crate::domain::event::{Delivery, DeliveryLog, Event};
use crate::domain::ids::{AccountId, Id, IdKind};
use crate::domain::ledger::LedgerEntry;
use crate::domain::money::Cents;
use crate::domain::order::{Order, Refund};
use crate::domain::product::Product;
use crate::domain::time::Millis;
use crate::domain::webhook_secret::PreviousSecret;
use crate::store::{ProviderPaymentRecord, StoreError};

pub(super) async fn insert_account<C: Session>(
    c: &C,
    account: &Account,
    balance: Cents,
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

/// `changed_in` is kept only by a restore (migration 0011); otherwise the table's trigger
/// numbers the change.
pub(super) async fn insert_api_key<C: Session>(
    c: &C,
    hash: &[u8; 32],
    record: &ApiKeyRecord,
    changed_in: i64,
) -> Result<(), Fault> {
    execute(
        c,
        "INSERT INTO api_keys (hash, id, account_id, scopes, revoked, created_at, changed_in, expires_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        &[
            &&hash[..],
            &record.id,
            &record.account_id.to_string(),
            &Json(&record.scopes),
            &record.revoked,
            &time(record.created_at),
            &changed_in,
            &record.expires_at.map(time),
        ],
    )
    .await?;
    Ok(())
}

pub(super) async fn upsert_product<C: Session>(c: &C, product: &Product) -> Result<(), Fault> {
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

/// The order's changing parts: its status, what was refunded, when it last changed.
pub(super) async fn update_order<C: Session>(c: &C, order: &Order) -> Result<(), Fault> {
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

/// The account's balance and ledger head, its row locked until the commit: what a decision
/// that moves money reads, so that no other transaction moves it in between. Entries an
/// instance of the version before chained ledgers wrote are chained first (`catch_up`).
pub(super) async fn lock_balance<C: Session>(c: &C, account: &AccountId) -> Result<Locked, Fault> {
    let id = account.to_string();
    // Pipelined: the second statement runs once the lock is held, and sees every entry
    // committed before it was.
    let (row, newest) = both(
        super::tx::query_opt(
            c,
            "SELECT available FROM balances WHERE account_id = $1 FOR UPDATE",
            &[&id],
        ),
        super::tx::query_opt(c, NEWEST_ENTRY_SQL, &[&id]),
    )
    .await?;
    let row =
        row.ok_or_else(|| StoreError::Corrupt(format!("account {account} has no balance row")))?;
    let head = match head_of(account, newest.as_ref())? {
        Some(head) => head,
        None => catch_up(c, account).await?,
    };
    Ok(Locked {
        funds: Funds {
            available: row.get(0),
            head,
        },
        newest_txn: newest.map(|r| txn_id(&r)).transpose()?,
    })
}

/// The newest ledger entry (id, `seq`, `hash`) of each of the accounts `$1`: one backward
/// step of the `(account_id, id)` index per account, whatever the ledger's length.
/// (`DISTINCT ON` over the same index read and sorted every entry of the accounts: 33 ms for
/// three accounts of 5,000 entries, against 0.1 ms, and a batch holds its balance locks
/// meanwhile.)
pub(super) const NEWEST_TXNS_SQL: &str =
    "SELECT a.account_id, l.id, l.seq, l.hash FROM unnest($1::text[]) AS a(account_id)
     CROSS JOIN LATERAL (SELECT id, seq, hash FROM ledger
                         WHERE ledger.account_id = a.account_id COLLATE \"C\"
                         ORDER BY id DESC LIMIT 1) AS l";

/// A ledger entry id read back.
pub(super) fn txn_id(row: &tokio_postgres::Row) -> Result<Id, StoreError> {
    let id: String = row.get("id");
    Id::parse(IdKind::Transaction, &id)
        .ok_or_else(|| StoreError::Corrupt(format!("bad ledger id {id:?}")))
}

/// An account's balance and ledger head, its row locked to the commit, and its newest ledger
/// entry id, read under that lock: an entry made now with `Id::after` of it follows every
/// entry committed before, whichever instance made them, so ids list an account's ledger in
/// the order its balance moved.
pub(super) struct Locked {
    pub(crate) funds: Funds,
    pub(crate) newest_txn: Option<Id>,
}

/// Writes money a decision moved: the new balance and its ledger entry, whose
/// `balance_after` it is. The caller holds the balance row's lock (`lock_balance`).
pub(super) async fn move_money<C: Session>(
    c: &C,
    account: &AccountId,
    entry: &LedgerEntry,
) -> Result<(), Fault> {
    both(
        set_balances(c, &[(*account, entry.balance_after)]),
        insert_ledger(c, &[(account, entry)]),
    )
    .await?;
    Ok(())
}

pub(super) async fn insert_refund<C: Session>(c: &C, refund: &Refund) -> Result<(), Fault> {
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

pub(super) async fn insert_event<C: Session>(c: &C, event: &Event) -> Result<(), Fault> {
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

pub(super) async fn insert_delivery<C: Session>(
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

pub(super) async fn upsert_delivery_log<C: Session>(
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

pub(super) async fn upsert_previous_secret<C: Session>(
    c: &C,
    account: &AccountId,
    previous: &PreviousSecret,
) -> Result<(), Fault> {
    execute(
        c,
        "INSERT INTO previous_webhook_secrets (account_id, secret, valid_until) VALUES ($1, $2, $3)
         ON CONFLICT (account_id) DO UPDATE
         SET secret = excluded.secret, valid_until = excluded.valid_until",
        &[
            &account.to_string(),
            &previous.secret,
            &time(previous.valid_until),
        ],
    )
    .await?;
    Ok(())
}

pub(super) async fn insert_provider_payment<C: Session>(
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
