//! The reads and lists: every one a single statement on committed rows, so nothing a read
//! returns can be rolled back (on this engine, visibility after durability is the server's).

use deadpool_postgres::Object;

use super::chain_rows::head_of;
use super::codec;
use super::tx::{query, query_opt, Fault};
use crate::domain::account::{Account, ApiKeyRecord};
use crate::domain::chain::{fill_previous, Funds, LedgerHead};
use crate::domain::event::{DeliveryLog, Event};
use crate::domain::idempotency_key::IdempotencyKey;
use crate::domain::ids::{AccountId, Id, OrderId};
use crate::domain::ledger::LedgerEntry;
use crate::domain::money::Cents;
use crate::domain::order::Order;
use crate::domain::product::Product;
use crate::store::{KeyRecord, Page, StoreError};

/// Cuts a page fetched with one row more than `limit`; the cursor is the last item's.
fn page<T>(mut items: Vec<T>, limit: usize, cursor: impl Fn(&T) -> String) -> Page<T> {
    let next_cursor = if items.len() > limit {
        items.truncate(limit);
        items.last().map(cursor)
    } else {
        None
    };
    Page { items, next_cursor }
}

fn fetch_limit(limit: usize) -> i64 {
    limit.saturating_add(1).min(i64::MAX as usize) as i64
}

pub(super) async fn authenticate(
    c: &Object,
    hash: &[u8; 32],
) -> Result<Option<(ApiKeyRecord, Account)>, Fault> {
    let sql = format!(
        "SELECT {}, {} FROM api_keys k JOIN accounts a ON a.id = k.account_id
         WHERE k.hash = $1 AND NOT k.revoked",
        codec::API_KEY,
        codec::ACCOUNT
    );
    match query_opt(c, &sql, &[&&hash[..]]).await? {
        Some(row) => {
            let (_, record) = codec::api_key(&row)?;
            Ok(Some((record, codec::account(&row)?)))
        }
        None => Ok(None),
    }
}

/// `authenticate` and the key's row in the key's account, one statement: a replay costs one
/// round trip.
pub(super) async fn authenticate_with_key(
    c: &Object,
    hash: &[u8; 32],
    key: &IdempotencyKey,
) -> Result<Option<(ApiKeyRecord, Account, Option<KeyRecord>)>, Fault> {
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        let key_row: Vec<String> = codec::KEY_ROW
            .split(", ")
            .map(|c| format!("i.{c}"))
            .collect();
        format!(
            "SELECT {}, {}, {} FROM api_keys k JOIN accounts a ON a.id = k.account_id
             LEFT JOIN idempotency_keys i ON i.account_id = k.account_id AND i.key = $2
             WHERE k.hash = $1 AND NOT k.revoked",
            codec::API_KEY,
            codec::ACCOUNT,
            key_row.join(", ")
        )
    });
    match query_opt(c, &SQL, &[&&hash[..], &key.as_str()]).await? {
        Some(row) => {
            let (_, record) = codec::api_key(&row)?;
            // Every column of a key row is NOT NULL: a NULL operation is the join's "none".
            let key_row = match row.get::<_, Option<String>>("operation") {
                Some(_) => Some(codec::key_record(&row)?),
                None => None,
            };
            Ok(Some((record, codec::account(&row)?, key_row)))
        }
        None => Ok(None),
    }
}

pub(super) async fn account(c: &Object, id: &AccountId) -> Result<Option<Account>, Fault> {
    let sql = format!("SELECT {} FROM accounts a WHERE a.id = $1", codec::ACCOUNT);
    Ok(match query_opt(c, &sql, &[&id.to_string()]).await? {
        Some(row) => Some(codec::account(&row)?),
        None => None,
    })
}

/// The balance and the head of the chained entries that sum to it, in one snapshot. (Entries
/// an instance of the version before chained ledgers wrote moments ago are not in the head
/// until they are chained: `chain_rows.rs`.)
pub(super) async fn balance(c: &Object, id: &AccountId) -> Result<Funds, Fault> {
    let row = query_opt(
        c,
        "SELECT b.available, l.seq, l.hash FROM balances b
         LEFT JOIN LATERAL (SELECT seq, hash FROM ledger
                            WHERE account_id = b.account_id AND seq IS NOT NULL
                            ORDER BY seq DESC LIMIT 1) AS l ON true
         WHERE b.account_id = $1",
        &[&id.to_string()],
    )
    .await?;
    let Some(row) = row else {
        return Ok(Funds::empty(&id.to_string()));
    };
    let seq: Option<i64> = row.get("seq");
    let head = match seq {
        None => LedgerHead::genesis(&id.to_string()),
        Some(_) => head_of(id, Some(&row))?.ok_or_else(|| {
            Fault::from(crate::store::StoreError::Corrupt(format!(
                "account {id}'s head has no hash"
            )))
        })?,
    };
    Ok(Funds {
        available: row.get("available"),
        head,
    })
}

pub(super) async fn product(c: &Object, id: &str) -> Result<Option<Product>, Fault> {
    let sql = format!("SELECT {} FROM products WHERE id = $1", codec::PRODUCT);
    Ok(match query_opt(c, &sql, &[&id]).await? {
        Some(row) => Some(codec::product(&row)?),
        None => None,
    })
}

pub(super) async fn active_products_page(
    c: &Object,
    after: Option<String>,
    limit: usize,
) -> Result<Page<Product>, Fault> {
    let sql = format!(
        "SELECT {} FROM products WHERE active AND ($1::text IS NULL OR id > $1)
         ORDER BY id LIMIT $2",
        codec::PRODUCT
    );
    let rows = query(c, &sql, &[&after, &fetch_limit(limit)]).await?;
    let items = rows
        .iter()
        .map(codec::product)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(page(items, limit, |p| p.id.clone()))
}

pub(super) async fn replay_lookup(
    c: &Object,
    account: &AccountId,
    key: &IdempotencyKey,
) -> Result<Option<KeyRecord>, Fault> {
    let sql = format!(
        "SELECT {} FROM idempotency_keys WHERE account_id = $1 AND key = $2",
        codec::KEY_ROW
    );
    Ok(
        match query_opt(c, &sql, &[&account.to_string(), &key.as_str()]).await? {
            Some(row) => Some(codec::key_record(&row)?),
            None => None,
        },
    )
}

pub(super) async fn order(c: &Object, id: &OrderId) -> Result<Option<Order>, Fault> {
    let sql = format!("SELECT {} FROM orders WHERE id = $1", codec::ORDER);
    Ok(match query_opt(c, &sql, &[&id.to_string()]).await? {
        Some(row) => Some(codec::order(&row)?),
        None => None,
    })
}

pub(super) async fn orders_page(
    c: &Object,
    account: &AccountId,
    external_order_id: Option<String>,
    before: Option<OrderId>,
    limit: usize,
) -> Result<Page<Order>, Fault> {
    let before = before.map(|b| b.to_string());
    let rows = match &external_order_id {
        Some(external) => {
            let sql = format!(
                "SELECT {} FROM orders WHERE account_id = $1 AND external_order_id = $2
                 AND ($3::text IS NULL OR id < $3) ORDER BY id DESC LIMIT $4",
                codec::ORDER
            );
            let params: [&(dyn super::tx::Param + Sync); 4] =
                [&account.to_string(), external, &before, &fetch_limit(limit)];
            query(c, &sql, &params).await?
        }
        None => {
            let sql = format!(
                "SELECT {} FROM orders WHERE account_id = $1
                 AND ($2::text IS NULL OR id < $2) ORDER BY id DESC LIMIT $3",
                codec::ORDER
            );
            query(
                c,
                &sql,
                &[&account.to_string(), &before, &fetch_limit(limit)],
            )
            .await?
        }
    };
    let items = rows
        .iter()
        .map(codec::order)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(page(items, limit, |o| o.id.to_string()))
}

pub(super) async fn ledger_page(
    c: &Object,
    account: &AccountId,
    before: Option<Id>,
    limit: usize,
) -> Result<Page<LedgerEntry>, Fault> {
    let sql = format!(
        "SELECT {} FROM ledger WHERE account_id = $1 AND ($2::text IS NULL OR id < $2)
         ORDER BY id DESC LIMIT $3",
        codec::LEDGER
    );
    let before = before.map(|b| b.to_string());
    let rows = query(
        c,
        &sql,
        &[&account.to_string(), &before, &fetch_limit(limit)],
    )
    .await?;
    let mut items = rows
        .iter()
        .map(codec::ledger)
        .collect::<Result<Vec<_>, _>>()?;
    // The row past the page, when there is one, is the page's oldest entry's predecessor.
    fill_previous(&account.to_string(), &mut items, true);
    Ok(page(items, limit, |e| e.id.clone()))
}

/// The account's entries with a `seq` above `after`, oldest first, at most `limit`, read
/// with the one at `after` (their first one's predecessor).
pub(super) async fn ledger_after(
    c: &Object,
    account: &AccountId,
    after: u64,
    limit: usize,
) -> Result<Vec<LedgerEntry>, Fault> {
    let sql = format!(
        "SELECT {} FROM ledger WHERE account_id = $1 AND seq >= $2 ORDER BY seq LIMIT $3",
        codec::LEDGER
    );
    let from = i64::try_from(after.max(1)).unwrap_or(i64::MAX);
    let rows = query(c, &sql, &[&account.to_string(), &from, &fetch_limit(limit)]).await?;
    let mut items = rows
        .iter()
        .map(codec::ledger)
        .collect::<Result<Vec<_>, _>>()?;
    fill_previous(&account.to_string(), &mut items, false);
    items.retain(|e| e.seq > after);
    items.truncate(limit);
    Ok(items)
}

pub(super) async fn events_page(
    c: &Object,
    account: &AccountId,
    after: Option<Id>,
    limit: usize,
) -> Result<Page<Event>, Fault> {
    let after = after.map(|a| a.to_string());
    let rows = query(
        c,
        "SELECT snapshot FROM events WHERE account_id = $1 AND ($2::text IS NULL OR id > $2)
         ORDER BY id LIMIT $3",
        &[&account.to_string(), &after, &fetch_limit(limit)],
    )
    .await?;
    let items = rows
        .iter()
        .map(codec::event)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(page(items, limit, |e| e.id.clone()))
}

pub(super) async fn delivery_logs(
    c: &Object,
    event_ids: &[String],
) -> Result<Vec<Option<DeliveryLog>>, Fault> {
    let rows = query(
        c,
        "SELECT event_id, log FROM delivery_logs WHERE event_id = ANY($1)",
        &[&event_ids],
    )
    .await?;
    let mut found = std::collections::HashMap::with_capacity(rows.len());
    for row in &rows {
        let id: String = row.get("event_id");
        found.insert(id, codec::json::<DeliveryLog>(row, "log")?);
    }
    Ok(event_ids.iter().map(|id| found.remove(id)).collect())
}

pub(super) async fn accounts_page(
    c: &Object,
    after: Option<AccountId>,
    limit: usize,
) -> Result<Page<(Account, Cents)>, Fault> {
    let sql = format!(
        "SELECT {}, COALESCE(b.available, 0) AS available FROM accounts a
         LEFT JOIN balances b ON b.account_id = a.id
         WHERE ($1::text IS NULL OR a.id > $1) ORDER BY a.id LIMIT $2",
        codec::ACCOUNT
    );
    let after = after.map(|a| a.to_string());
    let rows = query(c, &sql, &[&after, &fetch_limit(limit)]).await?;
    let items = rows
        .iter()
        .map(|row| Ok((codec::account(row)?, row.get("available"))))
        .collect::<Result<Vec<_>, StoreError>>()?;
    Ok(page(items, limit, |(a, _)| a.id.to_string()))
}

pub(super) async fn is_empty(c: &Object) -> Result<bool, Fault> {
    let row = query_opt(
        c,
        "SELECT NOT EXISTS (SELECT 1 FROM accounts) AND NOT EXISTS (SELECT 1 FROM products)",
        &[],
    )
    .await?;
    Ok(row.map(|r| r.get(0)).unwrap_or(true))
}

/// Whether any of orderly's tables that exist holds a row: the database may have no schema
/// yet, or an older one, so only the tables present are read.
pub(super) async fn holds_rows(c: &Object) -> Result<bool, Fault> {
    let names: Vec<&str> = TABLES.iter().map(|(table, _)| *table).collect();
    let present: Vec<String> = query(
        c,
        "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND c.relname = ANY($1)",
        &[&names],
    )
    .await?
    .iter()
    .map(|row| row.get(0))
    .collect();
    if present.is_empty() {
        return Ok(false);
    }
    let any = present
        .iter()
        .map(|table| format!("EXISTS (SELECT 1 FROM {table})"))
        .collect::<Vec<_>>()
        .join(" OR ");
    let row = query_opt(c, &format!("SELECT {any}"), &[]).await?;
    Ok(row.is_some_and(|r| r.get(0)))
}

/// The tables that hold records, with the kind each holds in a backup.
pub(super) const TABLES: [(&str, &str); 12] = [
    ("accounts", "account"),
    ("api_keys", "apiKey"),
    ("products", "product"),
    ("orders", "order"),
    ("ledger", "ledger"),
    ("refunds", "refund"),
    ("events", "event"),
    ("outbox", "delivery"),
    ("provider_payments", "providerPayment"),
    ("idempotency_keys", "idempotencyKey"),
    ("delivery_logs", "deliveryLog"),
    ("previous_webhook_secrets", "previousWebhookSecret"),
];

pub(super) async fn row_counts<C: super::tx::Session>(
    c: &C,
) -> Result<Vec<(&'static str, u64)>, Fault> {
    let sql = TABLES
        .iter()
        .map(|(table, _)| format!("(SELECT count(*) FROM {table})"))
        .collect::<Vec<_>>()
        .join(", ");
    let row = query_opt(c, &format!("SELECT {sql}"), &[])
        .await?
        .ok_or_else(|| StoreError::Corrupt("no counts".into()))?;
    Ok(TABLES
        .iter()
        .enumerate()
        .map(|(i, (table, _))| (*table, row.get::<_, i64>(i).max(0) as u64))
        .collect())
}
