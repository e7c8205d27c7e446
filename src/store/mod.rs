//! Storage on sled: one struct, one tree per keyspace, and methods named after business
//! operations (`place_order`, `replay_lookup`, `credit`, ...), never a generic key-value API,
//! so another engine can implement the same operations later.

pub mod accounts;
pub mod catalog;
pub mod codec;
pub mod committer;
pub mod events;
pub mod idempotency;
pub mod keys;
pub mod ledger;
pub mod lifecycle;
pub mod orders;
pub mod providers;

use std::path::Path;

use sled::transaction::{
    ConflictableTransactionError, TransactionError, UnabortableTransactionError,
};

pub use codec::CodecError;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
    #[error("codec: {0}")]
    Codec(#[from] CodecError),
    #[error("corrupt record: {0}")]
    Corrupt(String),
    #[error("durability: {0}")]
    Flush(String),
}

/// What a transaction closure can fail with: a business refusal `R` (the transaction is
/// rolled back and `R` returned as a value), or a record that does not decode.
#[derive(Debug)]
pub enum TxFailure<R> {
    Refused(R),
    Codec(CodecError),
}

impl<R> From<CodecError> for ConflictableTransactionError<TxFailure<R>> {
    fn from(e: CodecError) -> Self {
        ConflictableTransactionError::Abort(TxFailure::Codec(e))
    }
}

pub type TxResult<T, R> = Result<T, ConflictableTransactionError<TxFailure<R>>>;

/// Aborts the running transaction with a business refusal.
pub fn refuse<T, R>(reason: R) -> TxResult<T, R> {
    Err(ConflictableTransactionError::Abort(TxFailure::Refused(
        reason,
    )))
}

/// Unfolds a transaction's outcome: expected refusals become `Ok(Err(_))`, so callers match
/// them as values; storage and codec failures stay errors.
pub fn settle<T, R>(
    outcome: Result<T, TransactionError<TxFailure<R>>>,
) -> Result<Result<T, R>, StoreError> {
    match outcome {
        Ok(value) => Ok(Ok(value)),
        Err(TransactionError::Abort(TxFailure::Refused(r))) => Ok(Err(r)),
        Err(TransactionError::Abort(TxFailure::Codec(e))) => Err(StoreError::Codec(e)),
        Err(TransactionError::Storage(e)) => Err(StoreError::Sled(e)),
    }
}

/// Lets `?` on a transactional read/write work inside closures that use `TxFailure`.
pub fn tx<T, R>(r: Result<T, UnabortableTransactionError>) -> TxResult<T, R> {
    r.map_err(ConflictableTransactionError::from)
}

pub struct Store {
    db: sled::Db,
    accounts: sled::Tree,
    balances: sled::Tree,
    api_keys: sled::Tree,
    api_key_ids: sled::Tree,
    products: sled::Tree,
    orders: sled::Tree,
    orders_by_account: sled::Tree,
    orders_by_external: sled::Tree,
    ledger: sled::Tree,
    idem_responses: sled::Tree,
    idem_bindings: sled::Tree,
    idem_expiry: sled::Tree,
    /// Orders still `processing`, in creation order: the fulfillment queue.
    processing: sled::Tree,
    refunds: sled::Tree,
    events: sled::Tree,
    /// Pending callbacks keyed by when they are due.
    outbox: sled::Tree,
    /// The unique `(provider, provider's id)` index of inbound payments.
    provider_payments: sled::Tree,
}

impl Store {
    /// Opens (or creates) the database. `cache_bytes` bounds sled's page cache, whose
    /// default of 1 GiB would make the resident size of a small server unpredictable.
    pub fn open(path: &Path, cache_bytes: u64) -> Result<Self, StoreError> {
        let db = sled::Config::new()
            .path(path)
            .cache_capacity(cache_bytes)
            .mode(sled::Mode::HighThroughput)
            .open()?;
        let tree = |name: &str| db.open_tree(name);
        Ok(Store {
            accounts: tree("accounts")?,
            balances: tree("balances")?,
            api_keys: tree("api_keys")?,
            api_key_ids: tree("api_key_ids")?,
            products: tree("products")?,
            orders: tree("orders")?,
            orders_by_account: tree("orders_by_account")?,
            orders_by_external: tree("orders_by_external")?,
            ledger: tree("ledger")?,
            idem_responses: tree("idem_responses")?,
            idem_bindings: tree("idem_bindings")?,
            idem_expiry: tree("idem_expiry")?,
            processing: tree("processing")?,
            refunds: tree("refunds")?,
            events: tree("events")?,
            outbox: tree("outbox")?,
            provider_payments: tree("provider_payments")?,
            db,
        })
    }

    pub fn db(&self) -> &sled::Db {
        &self.db
    }

    /// No accounts and no products: the only state in which `--demo` seeds.
    pub fn is_empty(&self) -> bool {
        self.accounts.is_empty() && self.products.is_empty()
    }

    /// Rows per keyspace, for `orderly stats`: what grows with orders (orders, ledger,
    /// events) and what the sweeper keeps bounded (the idempotency rows).
    pub fn row_counts(&self) -> Vec<(&'static str, usize)> {
        vec![
            ("accounts", self.accounts.len()),
            ("api_keys", self.api_keys.len()),
            ("products", self.products.len()),
            ("orders", self.orders.len()),
            ("orders_by_external", self.orders_by_external.len()),
            ("processing", self.processing.len()),
            ("ledger", self.ledger.len()),
            ("refunds", self.refunds.len()),
            ("events", self.events.len()),
            ("outbox", self.outbox.len()),
            ("idem_responses", self.idem_responses.len()),
            ("idem_bindings", self.idem_bindings.len()),
            ("idem_expiry", self.idem_expiry.len()),
            ("provider_payments", self.provider_payments.len()),
        ]
    }

    /// A cheap read that proves the storage answers (`/readyz`).
    pub fn probe(&self) -> Result<(), StoreError> {
        self.accounts.first()?;
        Ok(())
    }
}

/// One page of a newest-first or oldest-first list, and the cursor of the next one.
pub struct Page<T> {
    pub items: Vec<T>,
    pub next_cursor: Option<String>,
}

/// Keys under `prefix`, newest (largest) first, strictly before `before` when given.
fn newest_first(
    tree: &sled::Tree,
    prefix: &[u8],
    before: Option<&[u8; 16]>,
    limit: usize,
) -> Result<Vec<sled::IVec>, StoreError> {
    let iter = match before {
        Some(cursor) => tree.range(prefix.to_vec()..keys::child_key(prefix, cursor)),
        None => tree.scan_prefix(prefix),
    };
    let mut out = Vec::with_capacity(limit + 1);
    for item in iter.rev() {
        let (key, _) = item?;
        if !key.starts_with(prefix) {
            break;
        }
        out.push(key);
        if out.len() > limit {
            break;
        }
    }
    Ok(out)
}

/// The trailing 16-byte id of an index key.
fn trailing_id(key: &[u8]) -> Result<[u8; 16], StoreError> {
    key.len()
        .checked_sub(16)
        .and_then(|start| key[start..].try_into().ok())
        .ok_or_else(|| StoreError::Corrupt("index key shorter than an id".into()))
}
