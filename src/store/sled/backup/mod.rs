//! A backup's stream and a restore, on sled. A backup, in the order it happens:
//!
//! 1. its instant (`cut.rs`): one writer job that starts the writer's notes of what it changes
//!    (`../changes.rs`), while writes go on;
//! 2. its walk (`spool.rs`): every tree that holds records (`../spooled.rs`) copied into a spool
//!    file beside the data directory, handed to the disk a few MiB at a time (`spool_out.rs`);
//! 3. its stream (here): the spool read back row by row, each key the writer changed since the
//!    instant replaced by its value at the instant, decoded and streamed at the reader's pace,
//!    holding a few records in memory whatever the store's size.
//!
//! sled has no snapshots: that is why the three steps. A restore writes every record and the
//! indexes they imply (the backup checked whole first, `records::checked_counts`), then checks
//! that each kind's rows are as many as its records.

pub(super) mod cut;
mod spool;
mod spool_out;

use std::collections::HashMap;

use super::accounts::{decode_key, encode_key};
use super::chained::{decode_entry, encode_entry};
use super::codec;
use super::events::{event_id, outbox_key};
use super::keys::{child_key, expiry_key, external_prefix};
use super::providers::{payment_key, ProviderPayment};
use super::spooled::{Spooled, SpooledRow};
use super::trees::Trees;
use crate::domain::account::Account;
use crate::domain::event::{Delivery, DeliveryLog, Event};
use crate::domain::idempotency_key::IdempotencyKey;
use crate::domain::ids::{AccountId, Id, IdKind};
use crate::domain::money::Cents;
use crate::domain::order::{Order, OrderStatus, Refund};
use crate::domain::product::Product;
use crate::domain::webhook_secret::PreviousSecret;
use crate::store::{KeyRecord, Producer, ProviderPaymentRecord, Record, StoreError};
use cut::{Overridden, Verdict};
use spool::Spool;

fn corrupt(what: &str) -> StoreError {
    StoreError::Corrupt(format!("{what} has a malformed key"))
}

fn account_of(key: &[u8]) -> Result<AccountId, StoreError> {
    key.get(..16)
        .and_then(AccountId::from_bytes)
        .ok_or_else(|| corrupt("a per-account row"))
}

impl Trees {
    /// Nothing stored at all: a restore writes only into such a store.
    pub(super) fn holds_nothing(&self) -> bool {
        [
            &self.accounts,
            &self.api_keys,
            &self.products,
            &self.orders,
            &self.ledger,
            &self.idem_keys,
        ]
        .iter()
        .all(|t| t.is_empty())
    }

    /// Writes every record and the indexes it implies.
    pub(super) fn write_records(&self, records: &[Record]) -> Result<(), StoreError> {
        for record in records {
            match record {
                Record::Account { account, balance } => {
                    self.accounts
                        .insert(account.id.bytes(), codec::encode(account)?)?;
                    self.balances
                        .insert(account.id.bytes(), codec::encode(balance)?)?;
                }
                Record::ApiKey { hash, record } => {
                    let id = Id::parse(IdKind::ApiKey, &record.id)
                        .ok_or_else(|| StoreError::Corrupt("bad api key id".into()))?;
                    self.api_keys.insert(&hash[..], encode_key(record)?)?;
                    self.api_key_ids.insert(&id.bytes()[..], &hash[..])?;
                }
                Record::Product(product) => {
                    self.products
                        .insert(product.id.as_bytes(), codec::encode(product)?)?;
                }
                Record::Order(order) => self.write_order(order)?,
                Record::Ledger { account, entry } => {
                    let txn = Id::parse(IdKind::Transaction, &entry.id)
                        .ok_or_else(|| StoreError::Corrupt("bad ledger id".into()))?;
                    self.ledger.insert(
                        child_key(&account.bytes(), &txn.bytes()),
                        encode_entry(entry)?,
                    )?;
                }
                Record::Refund(refund) => {
                    let id = Id::parse(IdKind::Refund, &refund.id)
                        .ok_or_else(|| StoreError::Corrupt("bad refund id".into()))?;
                    self.refunds
                        .insert(&id.bytes()[..], codec::encode(refund)?)?;
                }
                Record::Event(event) => {
                    let id = event_id(&event.id)?;
                    self.events.insert(
                        child_key(&event.account_id.bytes(), &id.bytes()),
                        codec::encode(event)?,
                    )?;
                }
                Record::Delivery { due_at, delivery } => {
                    let id = event_id(&delivery.event_id)?;
                    self.outbox
                        .insert(outbox_key(*due_at, &id), codec::encode(delivery)?)?;
                }
                Record::ProviderPayment(p) => {
                    let stored = ProviderPayment {
                        txn_id: p.txn_id.clone(),
                        account_id: p.account,
                        amount: p.amount,
                        received_at: p.received_at,
                    };
                    self.provider_payments.insert(
                        payment_key(&p.provider, &p.external_id),
                        codec::encode(&stored)?,
                    )?;
                }
                Record::IdempotencyKey {
                    account,
                    key,
                    record,
                } => {
                    let key = IdempotencyKey::parse(key.as_bytes())
                        .map_err(|_| StoreError::Corrupt(format!("bad idempotency key {key:?}")))?;
                    let scoped = super::keys::scoped_key(&account.bytes(), &key);
                    self.idem_keys
                        .insert(scoped.as_slice(), codec::encode(record)?)?;
                    self.idem_expiry
                        .insert(expiry_key(record.expires_at, &scoped), &[][..])?;
                }
                Record::DeliveryLog { event_id: id, log } => {
                    self.delivery_logs
                        .insert(&event_id(id)?.bytes()[..], codec::encode(log)?)?;
                }
                Record::PreviousWebhookSecret { account, previous } => {
                    self.previous_secrets
                        .insert(account.bytes(), codec::encode(previous)?)?;
                }
            }
        }
        Ok(())
    }

    fn write_order(&self, order: &Order) -> Result<(), StoreError> {
        let (account, id) = (order.account_id.bytes(), order.id.bytes());
        self.orders.insert(&id[..], codec::encode(order)?)?;
        self.orders_by_account
            .insert(child_key(&account, &id), &[][..])?;
        if let Some(external) = &order.external_order_id {
            let prefix = external_prefix(&account, external);
            self.orders_by_external
                .insert(child_key(&prefix, &id), &[][..])?;
        }
        if order.status == OrderStatus::Processing {
            self.processing.insert(&id[..], &[][..])?;
        }
        Ok(())
    }

    /// The rows of each kind of record, named as in a backup.
    pub(super) fn restored_counts(&self) -> [(&'static str, u64); 12] {
        [
            ("account", &self.accounts),
            ("apiKey", &self.api_keys),
            ("product", &self.products),
            ("order", &self.orders),
            ("ledger", &self.ledger),
            ("refund", &self.refunds),
            ("event", &self.events),
            ("delivery", &self.outbox),
            ("providerPayment", &self.provider_payments),
            ("idempotencyKey", &self.idem_keys),
            ("deliveryLog", &self.delivery_logs),
            ("previousWebhookSecret", &self.previous_secrets),
        ]
        .map(|(kind, tree)| (kind, tree.len() as u64))
    }
}

/// The next row as of the cut: the walk's, unless the key changed after the instant; the
/// keys the walk did not see (removed after the instant) come after the rest of their tree's.
fn row_at_cut(spool: &mut Spool, cut: &mut Overridden) -> Result<Option<SpooledRow>, StoreError> {
    loop {
        let next_tree = spool.next_tree()?;
        if let Some(row) = cut.next_unwalked(next_tree)? {
            return Ok(Some(row));
        }
        let Some((tree, key, value)) = spool.next_row()? else {
            return Ok(None);
        };
        match cut.verdict(tree, &key)? {
            Verdict::Walked => return Ok(Some((tree, key, value))),
            Verdict::Then(value) => return Ok(Some((tree, key, value))),
            Verdict::Absent => continue,
        }
    }
}

/// Decodes the spool, as of the cut, record by record into `producer`, at the reader's pace.
/// Stops when the reader goes away; an error ends the snapshot with it.
pub(super) fn stream_into(mut spool: Spool, mut cut: Overridden, producer: Producer) {
    let mut balances: HashMap<Vec<u8>, Cents> = HashMap::new();
    loop {
        let record = match row_at_cut(&mut spool, &mut cut) {
            Ok(None) => return producer.blocking_finish(),
            Ok(Some((Spooled::Balance, key, value))) => match codec::decode(&value) {
                Ok(balance) => {
                    balances.insert(key, balance);
                    continue;
                }
                Err(e) => Err(StoreError::from(e)),
            },
            Ok(Some((tree, key, value))) => record(tree, &key, &value, &balances),
            Err(e) => Err(e),
        };
        let failed = record.is_err();
        if !producer.blocking_send(record) || failed {
            return;
        }
    }
}

/// One spooled row as the record it stores.
fn record(
    tree: Spooled,
    key: &[u8],
    value: &[u8],
    balances: &HashMap<Vec<u8>, Cents>,
) -> Result<Record, StoreError> {
    Ok(match tree {
        Spooled::Balance => unreachable!("balances are folded into their accounts"),
        Spooled::Account => Record::Account {
            account: codec::decode::<Account>(value)?,
            balance: balances.get(key).copied().unwrap_or(Cents::ZERO),
        },
        Spooled::ApiKey => Record::ApiKey {
            hash: key.try_into().map_err(|_| corrupt("an api key row"))?,
            record: decode_key(value)?,
        },
        Spooled::Product => Record::Product(codec::decode::<Product>(value)?),
        Spooled::Order => Record::Order(codec::decode::<Order>(value)?),
        Spooled::Ledger => Record::Ledger {
            account: account_of(key)?,
            entry: decode_entry(value)?,
        },
        Spooled::Refund => Record::Refund(codec::decode::<Refund>(value)?),
        Spooled::Event => Record::Event(codec::decode::<Event>(value)?),
        Spooled::Outbox => Record::Delivery {
            due_at: key
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_be_bytes)
                .ok_or_else(|| corrupt("an outbox row"))?,
            delivery: codec::decode::<Delivery>(value)?,
        },
        Spooled::ProviderPayment => {
            let (provider, external_id) = split_payment_key(key)?;
            let p = codec::decode::<ProviderPayment>(value)?;
            Record::ProviderPayment(ProviderPaymentRecord {
                provider,
                external_id,
                txn_id: p.txn_id,
                account: p.account_id,
                amount: p.amount,
                received_at: p.received_at,
            })
        }
        Spooled::IdempotencyKey => Record::IdempotencyKey {
            account: account_of(key)?,
            key: std::str::from_utf8(key.get(16..).ok_or_else(|| corrupt("a key row"))?)
                .map_err(|_| corrupt("a key row"))?
                .to_string(),
            record: codec::decode::<KeyRecord>(value)?,
        },
        Spooled::DeliveryLog => Record::DeliveryLog {
            event_id: Id::from_bytes(IdKind::Event, key)
                .ok_or_else(|| corrupt("a delivery log"))?
                .to_string(),
            log: codec::decode::<DeliveryLog>(value)?,
        },
        Spooled::PreviousSecret => Record::PreviousWebhookSecret {
            account: account_of(key)?,
            previous: codec::decode::<PreviousSecret>(value)?,
        },
    })
}

/// `len(provider) ‖ provider ‖ provider's id` back into its two parts.
fn split_payment_key(key: &[u8]) -> Result<(String, String), StoreError> {
    let len = key
        .get(..2)
        .map(|b| u16::from_be_bytes([b[0], b[1]]) as usize)
        .ok_or_else(|| corrupt("a provider payment row"))?;
    let provider = key
        .get(2..2 + len)
        .ok_or_else(|| corrupt("a provider payment row"))?;
    let external = &key[2 + len..];
    let text =
        |b: &[u8]| String::from_utf8(b.to_vec()).map_err(|_| corrupt("a provider payment row"));
    Ok((text(provider)?, text(external)?))
}
