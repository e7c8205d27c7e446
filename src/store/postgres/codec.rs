//! Rows to domain values and back: ids as their public text, times as bigint milliseconds,
//! amounts as bigint minor units, enums as their variant names, lists and snapshots as jsonb.

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio_postgres::types::private::BytesMut;
use tokio_postgres::types::{to_sql_checked, FromSql, IsNull, Json, ToSql, Type};
use tokio_postgres::Row;

use crate::domain::account::{Account, ApiKeyRecord};
use crate::domain::event::{Delivery, Event};
use crate::domain::fingerprint::Fingerprint;
use crate::domain::ids::{AccountId, OrderId};
use crate::domain::ledger::LedgerEntry;
use crate::domain::money::Cents;
use crate::domain::order::{Order, Refund};
use crate::domain::product::Product;
use crate::domain::time::Millis;
use crate::domain::webhook_secret::PreviousSecret;
use crate::store::{KeyRecord, ProviderPaymentRecord, StoreError, StoredResponse};

/// An amount is a bigint column of minor units, read and bound as one.
impl ToSql for Cents {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        self.0.to_sql(ty, out)
    }

    fn accepts(ty: &Type) -> bool {
        <i64 as ToSql>::accepts(ty)
    }

    to_sql_checked!();
}

impl<'a> FromSql<'a> for Cents {
    fn from_sql(
        ty: &Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        i64::from_sql(ty, raw).map(Cents)
    }

    fn accepts(ty: &Type) -> bool {
        <i64 as FromSql>::accepts(ty)
    }
}

pub(super) fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(what.to_string())
}

/// A time as stored (an expiry that saturated at `u64::MAX` is kept as the largest bigint).
pub(super) fn time(millis: Millis) -> i64 {
    millis.min(i64::MAX as u64) as i64
}

pub(super) fn millis(stored: i64) -> Millis {
    stored.max(0) as Millis
}

/// An enum's variant name, as serde writes it.
pub(super) fn tag<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(name)) => name,
        other => unreachable!("a unit variant serializes as its name, not {other:?}"),
    }
}

pub(super) fn untag<T: DeserializeOwned>(name: String) -> Result<T, StoreError> {
    serde_json::from_value(serde_json::Value::String(name.clone()))
        .map_err(|_| corrupt(format!("unknown variant {name:?}")))
}

pub(super) fn account_id(text: &str) -> Result<AccountId, StoreError> {
    AccountId::parse(text).ok_or_else(|| corrupt(format!("bad account id {text:?}")))
}

pub(super) fn order_id(text: &str) -> Result<OrderId, StoreError> {
    OrderId::parse(text).ok_or_else(|| corrupt(format!("bad order id {text:?}")))
}

pub(super) fn json<T: DeserializeOwned>(row: &Row, column: &str) -> Result<T, StoreError> {
    let Json(value) = row
        .try_get::<_, Json<T>>(column)
        .map_err(|e| corrupt(format!("column {column}: {e}")))?;
    Ok(value)
}

pub(super) const ACCOUNT: &str =
    "a.id, a.name, a.wholesale, a.credit_limit, a.region, a.webhook_secret, a.created_at";

pub(super) fn account(row: &Row) -> Result<Account, StoreError> {
    Ok(Account {
        id: account_id(row.get("id"))?,
        name: row.get("name"),
        wholesale: row.get("wholesale"),
        credit_limit: row.get("credit_limit"),
        region: row.get("region"),
        webhook_secret: row.get("webhook_secret"),
        created_at: millis(row.get("created_at")),
    })
}

pub(super) const API_KEY: &str =
    "k.hash, k.id AS key_id, k.account_id, k.scopes, k.revoked, k.created_at AS key_created_at, k.expires_at AS key_expires_at";

pub(super) fn api_key(row: &Row) -> Result<([u8; 32], ApiKeyRecord), StoreError> {
    let hash: Vec<u8> = row.get("hash");
    let hash: [u8; 32] = hash
        .try_into()
        .map_err(|_| corrupt("an api key hash is not 32 bytes"))?;
    let record = ApiKeyRecord {
        id: row.get("key_id"),
        account_id: account_id(row.get("account_id"))?,
        scopes: json(row, "scopes")?,
        revoked: row.get("revoked"),
        created_at: millis(row.get("key_created_at")),
        expires_at: row.get::<_, Option<i64>>("key_expires_at").map(millis),
    };
    Ok((hash, record))
}

pub(super) const PRODUCT: &str = "id, name, price, regions, delivery_fields, active, updated_at";

pub(super) fn product(row: &Row) -> Result<Product, StoreError> {
    Ok(Product {
        id: row.get("id"),
        name: row.get("name"),
        price: row.get("price"),
        regions: json(row, "regions")?,
        delivery_fields: json(row, "delivery_fields")?,
        active: row.get("active"),
        updated_at: millis(row.get("updated_at")),
    })
}

pub(super) const ORDER: &str = "id, account_id, status, items, total, currency, callback_url, \
                         external_order_id, refunded, created_at, updated_at";

pub(super) fn order(row: &Row) -> Result<Order, StoreError> {
    Ok(Order {
        id: order_id(row.get("id"))?,
        account_id: account_id(row.get("account_id"))?,
        status: untag(row.get("status"))?,
        items: json(row, "items")?,
        total: row.get("total"),
        currency: row.get("currency"),
        callback_url: row.get("callback_url"),
        external_order_id: row.get("external_order_id"),
        refunded: row.get("refunded"),
        created_at: millis(row.get("created_at")),
        updated_at: millis(row.get("updated_at")),
    })
}

pub(super) const LEDGER: &str =
    "id, account_id, amount, reason, reference, balance_after, created_at, seq, hash";

/// A ledger row; `seq` 0 when it is not chained yet (written by an instance of the version
/// before chained ledgers). Its `previous_hash` is left for whoever reads it in order.
pub(super) fn ledger(row: &Row) -> Result<LedgerEntry, StoreError> {
    let seq: Option<i64> = row.get("seq");
    let hash: Option<&[u8]> = row.get("hash");
    Ok(LedgerEntry {
        id: row.get("id"),
        amount: row.get("amount"),
        reason: untag(row.get("reason"))?,
        reference: row.get("reference"),
        balance_after: row.get("balance_after"),
        created_at: millis(row.get("created_at")),
        seq: seq
            .map_or(Ok(0), u64::try_from)
            .map_err(|_| bad("a ledger seq"))?,
        hash: match hash {
            None => [0; 32],
            Some(bytes) => bytes.try_into().map_err(|_| bad("a ledger hash"))?,
        },
        previous_hash: [0; 32],
    })
}

/// `what` read back malformed.
fn bad(what: &str) -> StoreError {
    StoreError::Corrupt(format!("{what} is malformed"))
}

pub(super) fn refund(row: &Row) -> Result<Refund, StoreError> {
    Ok(Refund {
        id: row.get("id"),
        order_id: order_id(row.get("order_id"))?,
        amount: row.get("amount"),
        reason: row.get("reason"),
        created_at: millis(row.get("created_at")),
    })
}

pub(super) fn event(row: &Row) -> Result<Event, StoreError> {
    json(row, "snapshot")
}

pub(super) fn delivery(row: &Row) -> Result<(Millis, Delivery), StoreError> {
    let attempt: i32 = row.get("attempt");
    Ok((
        millis(row.get("due_at")),
        Delivery {
            event_id: row.get("event_id"),
            account_id: account_id(row.get("account_id"))?,
            url: row.get("url"),
            attempt: attempt.max(0) as u32,
        },
    ))
}

/// The `previous_secret` and `previous_valid_until` columns, when the account has rotated.
pub(super) fn previous_secret(row: &Row) -> Option<PreviousSecret> {
    let secret: Option<String> = row.get("previous_secret");
    let valid_until: Option<i64> = row.get("previous_valid_until");
    Some(PreviousSecret {
        secret: secret?,
        valid_until: millis(valid_until?),
    })
}

pub(super) fn provider_payment(row: &Row) -> Result<ProviderPaymentRecord, StoreError> {
    Ok(ProviderPaymentRecord {
        provider: row.get("provider"),
        external_id: row.get("external_id"),
        txn_id: row.get("txn_id"),
        account: account_id(row.get("account_id"))?,
        amount: row.get("amount"),
        received_at: millis(row.get("received_at")),
    })
}

pub(super) const KEY_ROW: &str = "operation, fingerprint, expires_at, status, content_type, body";

pub(super) fn key_record(row: &Row) -> Result<KeyRecord, StoreError> {
    let fingerprint: Vec<u8> = row.get("fingerprint");
    let fingerprint: [u8; 32] = fingerprint
        .try_into()
        .map_err(|_| corrupt("a key's fingerprint is not 32 bytes"))?;
    let status: i32 = row.get("status");
    Ok(KeyRecord {
        operation: untag(row.get("operation"))?,
        fingerprint: Fingerprint(fingerprint),
        expires_at: millis(row.get("expires_at")),
        response: StoredResponse {
            status: u16::try_from(status).map_err(|_| corrupt("a stored status"))?,
            content_type: row.get("content_type"),
            body: row.get("body"),
        },
    })
}
