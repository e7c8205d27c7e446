//! Snapshots and restores on sled. A snapshot is a raw copy of every tree that holds records
//! (indexes are left out and rebuilt), taken as one job on the writer thread: no write can be
//! half in it, and writes wait only for the copy (cheap: sled's values are shared, not
//! copied), not for the decoding and streaming that follow. A restore writes every record and
//! the indexes they imply (the backup checked whole first, `records::checked_counts`), then
//! checks that each kind's rows are as many as its records.

use std::collections::HashMap;

use super::codec;
use super::events::{event_id, outbox_key};
use super::keys::{child_key, expiry_key, external_prefix};
use super::providers::{payment_key, ProviderPayment};
use super::trees::Trees;
use crate::domain::account::{Account, ApiKeyRecord};
use crate::domain::event::{Delivery, DeliveryLog, Event};
use crate::domain::idempotency_key::IdempotencyKey;
use crate::domain::ids::{AccountId, Id, IdKind};
use crate::domain::ledger::LedgerEntry;
use crate::domain::order::{Order, OrderStatus, Refund};
use crate::domain::product::Product;
use crate::store::{KeyRecord, ProviderPaymentRecord, Record, Snapshot, StoreError};

type Rows = Vec<(sled::IVec, sled::IVec)>;

/// Every record-holding tree, copied at one instant.
pub struct RawCut {
    accounts: Rows,
    balances: Rows,
    api_keys: Rows,
    products: Rows,
    orders: Rows,
    ledger: Rows,
    refunds: Rows,
    events: Rows,
    outbox: Rows,
    provider_payments: Rows,
    idem_keys: Rows,
    delivery_logs: Rows,
}

fn rows(tree: &sled::Tree) -> Result<Rows, StoreError> {
    Ok(tree.iter().collect::<Result<Rows, _>>()?)
}

fn corrupt(what: &str) -> StoreError {
    StoreError::Corrupt(format!("{what} has a malformed key"))
}

fn account_of(key: &[u8]) -> Result<AccountId, StoreError> {
    key.get(..16)
        .and_then(AccountId::from_bytes)
        .ok_or_else(|| corrupt("a per-account row"))
}

fn decoded<T: serde::de::DeserializeOwned>(
    rows: Rows,
    make: impl Fn(&[u8], T) -> Result<Record, StoreError> + Send + 'static,
) -> impl Iterator<Item = Result<Record, StoreError>> + Send {
    rows.into_iter()
        .map(move |(key, value)| make(&key, codec::decode::<T>(&value)?))
}

impl Trees {
    pub fn raw_cut(&self) -> Result<RawCut, StoreError> {
        Ok(RawCut {
            accounts: rows(&self.accounts)?,
            balances: rows(&self.balances)?,
            api_keys: rows(&self.api_keys)?,
            products: rows(&self.products)?,
            orders: rows(&self.orders)?,
            ledger: rows(&self.ledger)?,
            refunds: rows(&self.refunds)?,
            events: rows(&self.events)?,
            outbox: rows(&self.outbox)?,
            provider_payments: rows(&self.provider_payments)?,
            idem_keys: rows(&self.idem_keys)?,
            delivery_logs: rows(&self.delivery_logs)?,
        })
    }

    /// Nothing stored at all: a restore writes only into such a store.
    pub fn holds_nothing(&self) -> bool {
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
    pub fn write_records(&self, records: &[Record]) -> Result<(), StoreError> {
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
                    self.api_keys.insert(&hash[..], codec::encode(record)?)?;
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
                        codec::encode(entry)?,
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
    pub fn restored_counts(&self) -> [(&'static str, u64); 11] {
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
        ]
        .map(|(kind, tree)| (kind, tree.len() as u64))
    }
}

impl RawCut {
    /// The records, decoded one at a time as they are read.
    pub fn into_records(self) -> Snapshot {
        let balances: HashMap<sled::IVec, sled::IVec> = self.balances.into_iter().collect();
        let accounts = decoded(self.accounts, move |key, account: Account| {
            let balance = match balances.get(key) {
                Some(bytes) => codec::decode(bytes)?,
                None => 0,
            };
            Ok(Record::Account { account, balance })
        });
        let api_keys = decoded(self.api_keys, |key, record: ApiKeyRecord| {
            let hash = key.try_into().map_err(|_| corrupt("an api key row"))?;
            Ok(Record::ApiKey { hash, record })
        });
        let products = decoded(self.products, |_, p: Product| Ok(Record::Product(p)));
        let orders = decoded(self.orders, |_, o: Order| Ok(Record::Order(o)));
        let ledger = decoded(self.ledger, |key, entry: LedgerEntry| {
            Ok(Record::Ledger {
                account: account_of(key)?,
                entry,
            })
        });
        let refunds = decoded(self.refunds, |_, r: Refund| Ok(Record::Refund(r)));
        let events = decoded(self.events, |_, e: Event| Ok(Record::Event(e)));
        let outbox = decoded(self.outbox, |key, delivery: Delivery| {
            let due_at = key
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_be_bytes)
                .ok_or_else(|| corrupt("an outbox row"))?;
            Ok(Record::Delivery { due_at, delivery })
        });
        let payments = decoded(self.provider_payments, |key, p: ProviderPayment| {
            let (provider, external_id) = split_payment_key(key)?;
            Ok(Record::ProviderPayment(ProviderPaymentRecord {
                provider,
                external_id,
                txn_id: p.txn_id,
                account: p.account_id,
                amount: p.amount,
                received_at: p.received_at,
            }))
        });
        let keys = decoded(self.idem_keys, |key, record: KeyRecord| {
            let text = std::str::from_utf8(&key[16..]).map_err(|_| corrupt("a key row"))?;
            Ok(Record::IdempotencyKey {
                account: account_of(key)?,
                key: text.to_string(),
                record,
            })
        });
        let logs = decoded(self.delivery_logs, |key, log: DeliveryLog| {
            let id = Id::from_bytes(IdKind::Event, key).ok_or_else(|| corrupt("a delivery log"))?;
            Ok(Record::DeliveryLog {
                event_id: id.to_string(),
                log,
            })
        });
        Box::new(
            accounts
                .chain(api_keys)
                .chain(products)
                .chain(orders)
                .chain(ledger)
                .chain(refunds)
                .chain(events)
                .chain(outbox)
                .chain(payments)
                .chain(keys)
                .chain(logs),
        )
    }
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
