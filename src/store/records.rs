//! What the port's operations take and give back: engine-neutral requests (owned, so an
//! engine may run them on a thread of its own) and the refusals each write can end in.
//!
//! Each write that answers a partner carries a `render` function that turns what the
//! transaction decided into the 200 body: the engine stores exactly those bytes as the
//! key's replay, so the bytes sent and the bytes replayed are the same bytes.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::domain::account::{Account, ApiKeyRecord, Shortfall};
use crate::domain::basket::{BasketRejection, RequestedLine};
use crate::domain::callback_url::CallbackUrl;
use crate::domain::event::{Delivery, DeliveryLog, Event};
use crate::domain::fingerprint::{Fingerprint, Operation};
use crate::domain::idempotency_key::IdempotencyKey;
use crate::domain::ids::{AccountId, Id, OrderId};
use crate::domain::ledger::{LedgerEntry, LedgerReason};
use crate::domain::lifecycle::{CancelRefused, RefundAsk, RefundRefused};
use crate::domain::money::Cents;
use crate::domain::order::{BalanceView, Order, OrderStatus, Refund};
use crate::domain::placing::{OrderRefused, OrderTerms};
use crate::domain::product::Product;
use crate::domain::time::Millis;
use crate::domain::webhook_secret::PreviousSecret;

use super::StoreError;

/// The exact response of a key's first successful use, replayed byte for byte.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredResponse {
    pub status: u16,
    pub content_type: String,
    /// As one byte string: a plain `Vec<u8>` would be decoded byte by byte on every replay.
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
}

/// A used key: what it was used for and what was answered, in one row, so that a lookup
/// racing the sweeper sees all of it or none of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRecord {
    pub operation: Operation,
    pub fingerprint: Fingerprint,
    pub expires_at: Millis,
    pub response: StoredResponse,
}

/// The row of a key that a concurrent first use committed first, when the engine read it
/// (PostgreSQL does, under the key's lock): it decides at once, even if the sweeper deletes
/// it a moment later. `None`: taken, or a row the write needs held, past the claim's
/// `wait_until` (another instance's transaction): nothing was written; look the key up again.
pub type Taken = Option<Box<KeyRecord>>;

/// A partner's live API key and its account, with what the engine read of the request's
/// idempotency key beside them.
pub struct Authenticated {
    pub record: ApiKeyRecord,
    pub account: Account,
    pub prefetched: Prefetched,
}

/// What the port read of a request's idempotency key together with its API key.
pub enum Prefetched {
    /// Not read: the handler looks the key up (`replay_lookup`), as on sled, where a lookup
    /// waits for a first use of the key that is being flushed.
    NotRead,
    /// Read with the API key: the key's durable row (PostgreSQL reads it in the same
    /// statement, and only ever shows committed rows; sled finds it in its replay cache), or
    /// `None` when it had none then (a first use decides under the key's lock, and finds a
    /// row committed since).
    Read {
        key: IdempotencyKey,
        row: Option<KeyRecord>,
    },
    /// Not read, because its first use decides as well as a lookup would: it reads the key
    /// where it writes, refuses a taken key with its durable row (which the handler replays)
    /// and waits for a first use in flight as a lookup would. A first use that gives up
    /// before it read the key (`OrderRefusal::ConcurrentModification`) is followed by the
    /// lookup (`api::idempotent::run_once`). PostgreSQL leaves every key it
    /// has no copy of to its first use once the API key is in memory (the first use takes
    /// the key's lock and reads its committed row; a lookup would be one more statement per
    /// order); sled, when no write of the key waits for its flush and writes are completing
    /// (a lookup would hand the request to a reading thread and back).
    LeftToFirstUse { key: IdempotencyKey },
}

/// A first use of a key, recorded by the operation's own transaction when it succeeds.
#[derive(Clone, Debug)]
pub struct KeyClaim {
    pub key: IdempotencyKey,
    pub operation: Operation,
    pub fingerprint: Fingerprint,
    /// The row expires this long after the commit.
    pub ttl: Duration,
    /// The end of the request's wait for the key and the rows its write locks (docs/api.md "POST /b2b/orders": about
    /// 5 s in all); an engine whose locks are shared with other processes waits no longer.
    pub wait_until: Instant,
}

pub struct NewOrder {
    pub account: Account,
    pub lines: Vec<RequestedLine>,
    pub currency: String,
    /// Judged before it reaches the port (`CallbackUrl::parse`).
    pub callback_url: Option<CallbackUrl>,
    pub external_order_id: Option<String>,
    pub claim: KeyClaim,
    pub render: fn(&Order, &BalanceView) -> Vec<u8>,
}

impl NewOrder {
    /// What `domain::placing::place` decides the order from.
    pub fn terms(&self) -> OrderTerms<'_> {
        OrderTerms {
            account: &self.account,
            lines: &self.lines,
            currency: &self.currency,
            callback_url: self.callback_url.as_ref(),
            external_order_id: self.external_order_id.as_deref(),
        }
    }

    /// The 200 body: sent, and stored as the key's replay.
    pub fn answer(&self, order: &Order, after: Cents) -> Vec<u8> {
        (self.render)(
            order,
            &BalanceView {
                available: after,
                credit_limit: self.account.credit_limit,
                currency: self.currency.clone(),
            },
        )
    }
}

/// Why no order was placed; nothing was written.
#[derive(Debug, PartialEq, Eq)]
pub enum OrderRefusal {
    Basket(BasketRejection),
    Shortfall(Shortfall),
    /// A concurrent first use of the same key committed first: look the key up again.
    KeyTaken(Taken),
    /// The balance kept being changed by concurrent commits until the engine's retries were
    /// spent (PostgreSQL only; the embedded engine never races).
    ConcurrentModification,
}

impl From<OrderRefused> for OrderRefusal {
    fn from(refused: OrderRefused) -> Self {
        match refused {
            OrderRefused::Basket(rejection) => OrderRefusal::Basket(rejection),
            OrderRefused::Shortfall(shortfall) => OrderRefusal::Shortfall(shortfall),
        }
    }
}

pub struct CancelRequest {
    pub account: AccountId,
    pub order: OrderId,
    pub claim: Option<KeyClaim>,
    pub render: fn(&Order) -> Vec<u8>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum CancelRefusal {
    NotFound,
    NotCancellable(OrderStatus),
    KeyTaken(Taken),
}

impl From<CancelRefused> for CancelRefusal {
    fn from(refused: CancelRefused) -> Self {
        match refused {
            CancelRefused::NotFound => CancelRefusal::NotFound,
            CancelRefused::NotCancellable(status) => CancelRefusal::NotCancellable(status),
        }
    }
}

pub struct RefundRequest {
    pub account: AccountId,
    pub order: OrderId,
    /// `None`: the whole unrefunded remainder.
    pub amount: Option<Cents>,
    pub reason: Option<String>,
    pub claim: KeyClaim,
    /// The refund's id, made with the request (`OrderChange::refund_id`).
    pub id: Id,
    pub render: fn(&Refund, &Order) -> Vec<u8>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum RefundRefusal {
    NotFound,
    NotRefundable(OrderStatus),
    ExceedsRemaining { remaining: Cents },
    KeyTaken(Taken),
}

impl RefundRequest {
    /// What `domain::lifecycle::refund` decides the refund from.
    pub fn ask(&self) -> RefundAsk {
        RefundAsk {
            amount: self.amount,
            reason: self.reason.clone(),
            id: self.id,
        }
    }
}

impl From<RefundRefused> for RefundRefusal {
    fn from(refused: RefundRefused) -> Self {
        match refused {
            RefundRefused::NotFound => RefundRefusal::NotFound,
            RefundRefused::NotRefundable(status) => RefundRefusal::NotRefundable(status),
            RefundRefused::ExceedsRemaining { remaining } => {
                RefundRefusal::ExceedsRemaining { remaining }
            }
        }
    }
}

pub struct NewCredit {
    pub account: Account,
    pub amount: Cents,
    pub reason: LedgerReason,
    pub reference: String,
    pub currency: String,
    pub claim: Option<KeyClaim>,
    pub render: fn(&BalanceView) -> Vec<u8>,
}

/// A credit that could not be made.
#[derive(Debug, PartialEq, Eq)]
pub enum CreditRefusal {
    /// The balance would not fit in an i64.
    BalanceOverflow,
    /// The key was taken by a concurrent first use: look it up again.
    KeyTaken(Taken),
}

/// An inbound payment notification, unique by `(provider, external_id)`.
pub struct ProviderCredit {
    pub provider: String,
    pub external_id: String,
    pub account: AccountId,
    pub amount: Cents,
}

/// Whether this notification moved money or was a repeat of one that did.
#[derive(Debug, PartialEq, Eq)]
pub enum Recorded {
    Credited,
    Duplicate,
}

#[derive(Debug, PartialEq, Eq)]
pub enum ProviderRefusal {
    BalanceOverflow,
}

/// A callback that is due, with what its attempt needs.
#[derive(Clone, Debug)]
pub struct DueDelivery {
    /// When this attempt fell due; with the event id it names the outbox entry.
    pub due_at: Millis,
    /// The number of this instance's claim on the delivery, where instances share the
    /// outbox: the attempt's outcome is written only under it. 0 where one process is the
    /// only sender.
    pub claim: i64,
    /// Which history of the database the claim was made in, where instances share the
    /// outbox (the epoch `postgres/shared_cache.rs` counts): a claim from a history the
    /// database no longer has sends and settles nothing. 0 where one process is the only
    /// sender.
    pub claimed_in: u64,
    pub delivery: Delivery,
    pub event: Event,
    pub webhook_secret: String,
    /// The secret the last rotation replaced, signing beside the current one while its
    /// overlap lasts.
    pub previous_secret: Option<PreviousSecret>,
}

/// What a redelivery request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Redelivered {
    Queued,
    /// The event's order has no callbackUrl.
    NoCallback,
    /// No such event (or not the owner's).
    NotFound,
}

/// What became of one attempt (decided in `domain::event`).
pub use crate::domain::event::DeliveryOutcome;

/// One record of a snapshot: everything orderly stores, engine-neutral (indexes are not
/// records; an engine rebuilds them from these).
#[derive(Clone, Debug)]
pub enum Record {
    Account {
        account: Account,
        balance: Cents,
    },
    ApiKey {
        hash: [u8; 32],
        record: ApiKeyRecord,
    },
    Product(Product),
    Order(Order),
    Ledger {
        account: AccountId,
        entry: LedgerEntry,
    },
    Refund(Refund),
    Event(Event),
    Delivery {
        due_at: Millis,
        delivery: Delivery,
    },
    ProviderPayment(ProviderPaymentRecord),
    IdempotencyKey {
        account: AccountId,
        key: String,
        record: KeyRecord,
    },
    DeliveryLog {
        event_id: String,
        log: DeliveryLog,
    },
    /// The secret an account's last rotation replaced, with its overlap.
    PreviousWebhookSecret {
        account: AccountId,
        previous: PreviousSecret,
    },
}

/// An inbound payment as recorded: unique by `(provider, external_id)`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProviderPaymentRecord {
    pub provider: String,
    pub external_id: String,
    pub txn_id: String,
    pub account: AccountId,
    pub amount: Cents,
    pub received_at: Millis,
}

/// Records restored per kind, as `orderly restore` prints them.
pub type RestoreCounts = std::collections::BTreeMap<&'static str, u64>;

impl Record {
    /// The kind's name in the backup format and in counts.
    pub fn kind(&self) -> &'static str {
        match self {
            Record::Account { .. } => "account",
            Record::ApiKey { .. } => "apiKey",
            Record::Product(_) => "product",
            Record::Order(_) => "order",
            Record::Ledger { .. } => "ledger",
            Record::Refund(_) => "refund",
            Record::Event(_) => "event",
            Record::Delivery { .. } => "delivery",
            Record::ProviderPayment(_) => "providerPayment",
            Record::IdempotencyKey { .. } => "idempotencyKey",
            Record::DeliveryLog { .. } => "deliveryLog",
            Record::PreviousWebhookSecret { .. } => "previousWebhookSecret",
        }
    }
}

/// A backup's records per kind, once the backup is checked whole before anything of it is
/// written: every account's ledger sums to its balance, and every ledger entry belongs to an
/// account of the backup. Each engine then checks only that it wrote as many rows as this
/// counts (a record that overwrote another shows there).
pub fn checked_counts(records: &[Record]) -> Result<RestoreCounts, StoreError> {
    let mut tally = Tally::default();
    records.iter().for_each(|record| tally.add(record));
    tally.finish()
}

/// `checked_counts` kept as the records pass, for a stream that is never held whole: the
/// counts, and per account its balance (once its record is seen) and what its ledger sums to.
#[derive(Default)]
pub struct Tally {
    counts: RestoreCounts,
    books: std::collections::HashMap<AccountId, (Option<Cents>, Cents)>,
}

impl Tally {
    pub fn add(&mut self, record: &Record) {
        *self.counts.entry(record.kind()).or_insert(0) += 1;
        match record {
            Record::Account { account, balance } => {
                self.books.entry(account.id).or_default().0 = Some(*balance);
            }
            Record::Ledger { account, entry } => {
                let sum = &mut self.books.entry(*account).or_default().1;
                *sum = sum.saturating_add(entry.amount);
            }
            _ => {}
        }
    }

    /// The counts, once every ledger is found to sum to its account's balance.
    pub fn finish(self) -> Result<RestoreCounts, StoreError> {
        for (account, (balance, sum)) in self.books {
            let Some(balance) = balance else {
                return Err(StoreError::Refused(format!(
                    "account {account}: ledger entries of an account the backup does not hold"
                )));
            };
            if sum != balance {
                return Err(StoreError::Refused(format!(
                    "account {account}: the ledger sums to {sum}, the balance is {balance}"
                )));
            }
        }
        Ok(self.counts)
    }
}

/// The rows an engine found after writing `expected`'s records, kind by kind: the restore is
/// refused (and rolled back or removed) when any differs.
pub fn verify_counts(
    expected: &RestoreCounts,
    found: impl IntoIterator<Item = (&'static str, u64)>,
) -> Result<(), StoreError> {
    for (kind, rows) in found {
        let meant = expected.get(kind).copied().unwrap_or(0);
        if rows != meant {
            return Err(StoreError::Refused(format!(
                "{kind}: {meant} records restored but {rows} rows found"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
impl NewOrder {
    /// An order of `lines` under `key`, for unit tests: its fingerprint is `fingerprint` in
    /// every byte, and its body the order's id and the balance after it.
    pub fn for_tests(
        account: &Account,
        key: &str,
        lines: Vec<RequestedLine>,
        fingerprint: u8,
    ) -> Self {
        NewOrder {
            account: account.clone(),
            lines,
            currency: "USD".into(),
            callback_url: None,
            external_order_id: None,
            claim: KeyClaim {
                key: IdempotencyKey::parse(key.as_bytes()).expect("a valid key"),
                operation: Operation::PlaceOrder,
                fingerprint: Fingerprint([fingerprint; 32]),
                ttl: Duration::from_secs(3600),
                wait_until: Instant::now() + Duration::from_secs(5),
            },
            render: |order, balance| format!("{} {}", order.id, balance.available).into_bytes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ids::IdKind;

    fn account(balance: i64) -> (AccountId, Record) {
        let account = Account::for_tests(0);
        let balance = Cents(balance);
        (account.id, Record::Account { account, balance })
    }

    fn entry(account: AccountId, amount: i64) -> Record {
        Record::Ledger {
            account,
            entry: LedgerEntry {
                id: Id::new(IdKind::Transaction).to_string(),
                amount: Cents(amount),
                reason: LedgerReason::Credit,
                reference: "r".into(),
                balance_after: Cents::ZERO,
                created_at: 0,
            },
        }
    }

    #[test]
    fn a_backup_whose_ledgers_sum_to_their_balances_is_counted_by_kind() {
        let (id, record) = account(70);
        let records = [record, entry(id, 100), entry(id, -30)];
        let counts = checked_counts(&records).unwrap();
        assert_eq!(counts.get("account"), Some(&1));
        assert_eq!(counts.get("ledger"), Some(&2));
    }

    #[test]
    fn a_backup_whose_ledger_does_not_sum_to_the_balance_is_refused_before_anything_is_written() {
        let (id, record) = account(71);
        let refused = checked_counts(&[record, entry(id, 100), entry(id, -30)]);
        assert!(
            matches!(&refused, Err(StoreError::Refused(why)) if why.contains("sums to 70")),
            "{refused:?}"
        );
    }

    #[test]
    fn ledger_entries_of_an_account_the_backup_does_not_hold_are_refused() {
        let (_, record) = account(0);
        let refused = checked_counts(&[record, entry(AccountId::new(), 5)]);
        assert!(
            matches!(refused, Err(StoreError::Refused(_))),
            "{refused:?}"
        );
    }
}
