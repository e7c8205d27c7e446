//! The sled database: one named tree per keyspace, opened together, and the scans that
//! several operation groups share.

use std::path::Path;

use super::chained::WriterHeads;
use super::changes::Changes;
use super::codec;
use super::compression;
use super::keys;
use crate::domain::time::Millis;
use crate::store::StoreError;

pub(super) struct Trees {
    pub(crate) db: sled::Db,
    pub(crate) accounts: sled::Tree,
    pub(crate) balances: sled::Tree,
    pub(crate) api_keys: sled::Tree,
    pub(crate) api_key_ids: sled::Tree,
    pub(crate) products: sled::Tree,
    pub(crate) orders: sled::Tree,
    pub(crate) orders_by_account: sled::Tree,
    pub(crate) orders_by_external: sled::Tree,
    pub(crate) ledger: sled::Tree,
    /// `account ‖ key` → the key's one row (`KeyRecord`).
    pub(crate) idem_keys: sled::Tree,
    /// `expires_at ‖ account ‖ key`: the sweeper scans this up to now.
    pub(crate) idem_expiry: sled::Tree,
    /// Orders still `processing`, in creation order: the fulfillment queue.
    pub(crate) processing: sled::Tree,
    pub(crate) refunds: sled::Tree,
    pub(crate) events: sled::Tree,
    /// Pending callbacks keyed by when they are due.
    pub(crate) outbox: sled::Tree,
    /// The unique `(provider, provider's id)` index of inbound payments.
    pub(crate) provider_payments: sled::Tree,
    /// `event id` → the callback's attempts and what comes next.
    pub(crate) delivery_logs: sled::Tree,
    /// `account id` → the webhook secret its last rotation replaced (`PreviousSecret`).
    pub(crate) previous_secrets: sled::Tree,
    /// What the writer changes while a backup is in flight (its only writer is the writer
    /// thread: every write to a record-holding tree goes through it).
    pub(crate) changes: Changes,
    /// The ledger heads the writer wrote or read (`chained::WriterHeads`).
    pub(crate) heads: WriterHeads,
}

/// sled's recovery refuses a store whose live pages need a blob file that is gone or cut
/// short before it writes anything (vendor/sled change 10): a store refused untouched, like
/// the files `files.rs` reads first.
fn refused_if_damaged(e: sled::Error) -> StoreError {
    match e {
        sled::Error::Unsupported(why) if why.starts_with("damaged store: ") => {
            let what = why.trim_start_matches("damaged store: ");
            StoreError::Refused(format!(
                "{what}; nothing of the store was changed: put the file back from the copy the store came from, or restore a backup"
            ))
        }
        e => e.into(),
    }
}

impl Trees {
    /// Opens (or creates) the database. `cache_bytes` bounds sled's page cache, whose
    /// default of 1 GiB would make the resident size of a small server unpredictable.
    pub(super) fn open(path: &Path, cache_bytes: u64) -> Result<Self, StoreError> {
        let compressed = compression::of_store(path)?;
        let cache_bytes = match compressed {
            true => cache_bytes / compression::CACHE_SHRINK,
            false => cache_bytes,
        };
        let db = sled::Config::new()
            .path(path)
            .cache_capacity(cache_bytes)
            .use_compression(compressed)
            .compression_factor(compression::LEVEL)
            .mode(sled::Mode::HighThroughput)
            // sled's own flusher (every 500 ms by default) is off: every write here is
            // followed by the writer's group commit, whose flush and fdatasync are the
            // durability a 200 waits for (`writer.rs`).
            .flush_every_ms(None)
            .open()
            .map_err(refused_if_damaged)?;
        let tree = |name: &str| db.open_tree(name);
        let trees = Trees {
            accounts: tree("accounts")?,
            balances: tree("balances")?,
            api_keys: tree("api_keys")?,
            api_key_ids: tree("api_key_ids")?,
            products: tree("products")?,
            orders: tree("orders")?,
            orders_by_account: tree("orders_by_account")?,
            orders_by_external: tree("orders_by_external")?,
            ledger: tree("ledger")?,
            idem_keys: tree("idem_keys")?,
            idem_expiry: tree("idem_expiry")?,
            processing: tree("processing")?,
            refunds: tree("refunds")?,
            events: tree("events")?,
            outbox: tree("outbox")?,
            provider_payments: tree("provider_payments")?,
            delivery_logs: tree("delivery_logs")?,
            previous_secrets: tree("previous_secrets")?,
            changes: Changes::default(),
            heads: WriterHeads::default(),
            db,
        };
        Ok(trees)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.accounts.is_empty() && self.products.is_empty()
    }

    /// Rows per keyspace: what grows with orders (orders, ledger, events) and what the
    /// sweeper keeps bounded (the idempotency rows).
    pub(super) fn row_counts(&self) -> Vec<(&'static str, u64)> {
        [
            ("accounts", &self.accounts),
            ("api_keys", &self.api_keys),
            ("products", &self.products),
            ("orders", &self.orders),
            ("orders_by_external", &self.orders_by_external),
            ("processing", &self.processing),
            ("ledger", &self.ledger),
            ("refunds", &self.refunds),
            ("events", &self.events),
            ("outbox", &self.outbox),
            ("idem_keys", &self.idem_keys),
            ("idem_expiry", &self.idem_expiry),
            ("provider_payments", &self.provider_payments),
            ("delivery_logs", &self.delivery_logs),
            ("previous_secrets", &self.previous_secrets),
        ]
        .into_iter()
        .map(|(name, tree)| (name, tree.len() as u64))
        .collect()
    }

    /// The newest time the store's ids carry (UUIDv7: milliseconds in their first 6 bytes):
    /// the newest account and order, and each account's newest ledger entry and event. A few
    /// reads per account, at open.
    pub(super) fn newest_time(&self) -> Result<Millis, StoreError> {
        let stamp = |key: &[u8]| -> Millis {
            key.get(..6).map_or(0, |b| {
                b.iter().fold(0u64, |ms, byte| ms << 8 | u64::from(*byte))
            })
        };
        let last_id = |tree: &sled::Tree| -> Result<Millis, StoreError> {
            Ok(tree.last()?.map_or(0, |(key, _)| stamp(&key)))
        };
        let mut newest = last_id(&self.accounts)?.max(last_id(&self.orders)?);
        for account in self.accounts.iter().keys() {
            let account = account?;
            for tree in [&self.ledger, &self.events] {
                if let Some(entry) = tree.scan_prefix(&account).next_back() {
                    let (key, _) = entry?;
                    newest = newest.max(stamp(key.get(account.len()..).unwrap_or(&[])));
                }
            }
        }
        Ok(newest)
    }

    /// A cheap read that proves the storage answers.
    pub(super) fn probe(&self) -> Result<(), StoreError> {
        self.accounts.first()?;
        Ok(())
    }

    /// A record by key, decoded.
    pub(super) fn get<T: serde::de::DeserializeOwned>(
        tree: &sled::Tree,
        key: impl AsRef<[u8]>,
    ) -> Result<Option<T>, StoreError> {
        match tree.get(key)? {
            Some(bytes) => Ok(Some(codec::decode(&bytes)?)),
            None => Ok(None),
        }
    }
}

/// Keys under `prefix`, newest (largest) first, strictly before `before` when given; one
/// more than `limit` when there is a next page.
pub(super) fn newest_first(
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
pub(super) fn trailing_id(key: &[u8]) -> Result<[u8; 16], StoreError> {
    key.len()
        .checked_sub(16)
        .and_then(|start| key[start..].try_into().ok())
        .ok_or_else(|| StoreError::Corrupt("index key shorter than an id".into()))
}
