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
    /// The HTTP status the first use answered with.
    pub status: u16,
    pub(crate) content_type: String,
    /// As one byte string: a plain `Vec<u8>` would be decoded byte by byte on every replay.
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
}

/// A used key: what it was used for and what was answered, in one row, so that a lookup
/// racing the sweeper sees all of it or none of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRecord {
    /// The operation the key was first used for; a use for another one is refused.
    pub operation: Operation,
    pub(crate) fingerprint: Fingerprint,
    /// When the sweeper may delete the row, and a replay of it stops.
    pub expires_at: Millis,
    /// The answer of the first use, replayed to every repeat.
    pub response: StoredResponse,
}

/// The row of a key that a concurrent first use committed first, when the engine read it
/// (PostgreSQL does, under the key's lock): it decides at once, even if the sweeper deletes
/// it a moment later. `None`: taken, or a row the write needs held, past the claim's
/// `wait_until` (another instance's transaction): nothing was written; look the key up again.
pub(crate) type Taken = Option<Box<KeyRecord>>;

/// A partner's live API key and its account, with what the engine read of the request's
/// idempotency key beside them.
pub struct Authenticated {
    pub(crate) record: ApiKeyRecord,
    pub(crate) account: Account,
    /// What the engine read of the request's idempotency key with the API key.
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
        /// The request's idempotency key.
        key: IdempotencyKey,
        /// Its durable row, if it had one.
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
    LeftToFirstUse {
        /// The request's idempotency key.
        key: IdempotencyKey,
    },
}

/// A first use of a key, recorded by the operation's own transaction when it succeeds.
#[derive(Clone, Debug)]
pub struct KeyClaim {
    /// The idempotency key, as the partner sent it.
    pub key: IdempotencyKey,
    /// The operation using the key, compared with a repeat's.
    pub operation: Operation,
    /// The request's fingerprint: a repeat with another one is refused as a reuse of the key.
    pub fingerprint: Fingerprint,
    /// The row expires this long after the commit.
    pub ttl: Duration,
    /// The end of the request's wait for the key and the rows its write locks (docs/api.md "POST /b2b/orders": about
    /// 5 s in all); an engine whose locks are shared with other processes waits no longer.
    pub wait_until: Instant,
}

/// An order to place for a partner: the basket, the account it is charged to and the key it is
/// placed under.
pub struct NewOrder {
    /// The partner's account, as authenticated; its balance is read again in the transaction.
    pub account: Account,
    /// The basket, priced from the catalog in the transaction.
    pub lines: Vec<RequestedLine>,
    /// The currency the partner asked for; it must be the account's.
    pub currency: String,
    /// Judged before it reaches the port (`CallbackUrl::parse`).
    pub callback_url: Option<CallbackUrl>,
    /// The partner's own reference for the order, stored and echoed back.
    pub external_order_id: Option<String>,
    /// The idempotency key the order is placed under, recorded by the same transaction.
    pub claim: KeyClaim,
    /// Renders the 200 body from the placed order and the balance after it.
    pub render: fn(&Order, &BalanceView) -> Vec<u8>,
}

impl NewOrder {
    /// What `domain::placing::place` decides the order from.
    pub(crate) fn terms(&self) -> OrderTerms<'_> {
        OrderTerms {
            account: &self.account,
            lines: &self.lines,
            currency: &self.currency,
            callback_url: self.callback_url.as_ref(),
            external_order_id: self.external_order_id.as_deref(),
        }
    }

    /// The 200 body: sent, and stored as the key's replay.
    pub(crate) fn answer(&self, order: &Order, after: Cents) -> Vec<u8> {
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
    /// A basket rule refused the order (an unknown product, a quantity, a region).
    Basket(BasketRejection),
    /// The account cannot pay for it: not enough balance, or past its credit limit.
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

/// A partner's or the operator's cancel of one order.
pub struct CancelRequest {
    /// The account that must own the order.
    pub account: AccountId,
    /// The order to cancel.
    pub order: OrderId,
    /// The idempotency key the cancel is made under, if it has one.
    pub claim: Option<KeyClaim>,
    /// Renders the 200 body from the order after the cancel.
    pub render: fn(&Order) -> Vec<u8>,
}

/// Why an order was not cancelled; nothing was written.
#[derive(Debug, PartialEq, Eq)]
pub enum CancelRefusal {
    /// No such order, or not the account's.
    NotFound,
    /// The order's status no longer allows a cancel.
    NotCancellable(OrderStatus),
    /// The balance with the order's money back would not fit in an i64.
    BalanceTooLarge,
    /// A concurrent first use of the same key committed first: look the key up again.
    KeyTaken(Taken),
}

impl From<CancelRefused> for CancelRefusal {
    fn from(refused: CancelRefused) -> Self {
        match refused {
            CancelRefused::NotFound => CancelRefusal::NotFound,
            CancelRefused::NotCancellable(status) => CancelRefusal::NotCancellable(status),
            CancelRefused::BalanceTooLarge => CancelRefusal::BalanceTooLarge,
        }
    }
}

/// A refund of part or all of an order's unrefunded amount.
pub struct RefundRequest {
    /// The account that must own the order.
    pub account: AccountId,
    /// The order to refund.
    pub order: OrderId,
    /// `None`: the whole unrefunded remainder.
    pub amount: Option<Cents>,
    /// The reason the partner gave, kept with the refund.
    pub reason: Option<String>,
    /// The idempotency key the refund is made under.
    pub claim: KeyClaim,
    /// The refund's id, made with the request (`OrderChange::refund_id`).
    pub id: Id,
    /// Renders the 200 body from the refund and the order after it.
    pub render: fn(&Refund, &Order) -> Vec<u8>,
}

/// Why no refund was made; nothing was written.
#[derive(Debug, PartialEq, Eq)]
pub enum RefundRefusal {
    /// No such order, or not the account's.
    NotFound,
    /// The order's status does not allow a refund.
    NotRefundable(OrderStatus),
    /// More than the order has left to refund.
    ExceedsRemaining {
        /// What is left to refund.
        remaining: Cents,
    },
    /// The balance with the refund would not fit in an i64.
    BalanceTooLarge,
    /// A concurrent first use of the same key committed first: look the key up again.
    KeyTaken(Taken),
}

impl RefundRequest {
    /// What `domain::lifecycle::refund` decides the refund from.
    pub(crate) fn ask(&self) -> RefundAsk {
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
            RefundRefused::BalanceTooLarge => RefundRefusal::BalanceTooLarge,
        }
    }
}

/// Money into an account's balance: an operator's credit or adjustment, made under a key or not.
pub struct NewCredit {
    /// The account credited.
    pub account: Account,
    /// The amount added to the balance.
    pub amount: Cents,
    /// Why the money came in, as its ledger entry shows it.
    pub reason: LedgerReason,
    /// The caller's reference, kept on the ledger entry.
    pub reference: String,
    /// The currency of the amount; it must be the account's.
    pub currency: String,
    /// The idempotency key the credit is made under, if it has one.
    pub claim: Option<KeyClaim>,
    /// Renders the 200 body from the balance after the credit.
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
    /// The payment provider that sent the notification.
    pub provider: String,
    /// The provider's id of the payment; a repeat of it credits nothing.
    pub external_id: String,
    /// The account the payment is for.
    pub account: AccountId,
    /// The amount paid in.
    pub amount: Cents,
}

/// Whether this notification moved money or was a repeat of one that did.
#[derive(Debug, PartialEq, Eq)]
pub enum Recorded {
    /// The payment was new: the account was credited.
    Credited,
    /// The provider had sent this payment before: nothing was written.
    Duplicate,
}

/// Why a provider's payment was not recorded; nothing was written.
#[derive(Debug, PartialEq, Eq)]
pub enum ProviderRefusal {
    /// The balance after it would not fit in an i64.
    BalanceOverflow,
}

/// A callback that is due, with what its attempt needs.
#[derive(Clone, Debug)]
pub struct DueDelivery {
    /// When this attempt fell due; with the event id it names the outbox entry.
    pub(crate) due_at: Millis,
    /// The number of this instance's claim on the delivery, where instances share the
    /// outbox: the attempt's outcome is written only under it. 0 where one process is the
    /// only sender.
    pub(crate) claim: i64,
    /// Which history of the database the claim was made in, where instances share the
    /// outbox (the epoch `postgres/shared_cache.rs` counts): a claim from a history the
    /// database no longer has sends and settles nothing. 0 where one process is the only
    /// sender.
    pub(crate) claimed_in: u64,
    /// The outbox entry: which attempt this is and when it fell due.
    pub delivery: Delivery,
    /// The event the callback sends.
    pub event: Event,
    /// The account's current webhook secret, which signs the callback.
    pub webhook_secret: String,
    /// The secret the last rotation replaced, signing beside the current one while its
    /// overlap lasts.
    pub previous_secret: Option<PreviousSecret>,
}

/// What a redelivery request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Redelivered {
    /// A new attempt was queued, due now.
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
    /// An account and its balance.
    Account {
        /// The account.
        account: Account,
        /// Its balance when the snapshot was taken.
        balance: Cents,
    },
    /// An API key, stored by its hash only.
    ApiKey {
        /// The SHA-256 of the plaintext key.
        hash: [u8; 32],
        /// The key's account, scopes and state.
        record: ApiKeyRecord,
    },
    /// A catalog product.
    Product(Product),
    /// An order, with its lines and refunds.
    Order(Order),
    /// One ledger entry of an account.
    Ledger {
        /// The account whose ledger it is.
        account: AccountId,
        /// The entry.
        entry: LedgerEntry,
    },
    /// A refund of an order.
    Refund(Refund),
    /// An event of the partner's event list.
    Event(Event),
    /// A callback still to be attempted.
    Delivery {
        /// When its next attempt falls due.
        due_at: Millis,
        /// The delivery.
        delivery: Delivery,
    },
    /// An inbound payment already recorded, so that a repeat stays a repeat.
    ProviderPayment(ProviderPaymentRecord),
    /// A used idempotency key that has not expired.
    IdempotencyKey {
        /// The account that used it.
        account: AccountId,
        /// The key, as sent.
        key: String,
        /// What it was used for and what was answered.
        record: KeyRecord,
    },
    /// The attempts of one event's callback so far.
    DeliveryLog {
        /// The event the callback sends.
        event_id: String,
        /// Its attempts and how the callback ended.
        log: DeliveryLog,
    },
    /// The secret an account's last rotation replaced, with its overlap.
    PreviousWebhookSecret {
        /// The account whose secret was rotated.
        account: AccountId,
        /// The replaced secret and until when it still signs.
        previous: PreviousSecret,
    },
}

/// An inbound payment as recorded: unique by `(provider, external_id)`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProviderPaymentRecord {
    pub(crate) provider: String,
    pub(crate) external_id: String,
    pub(crate) txn_id: String,
    pub(crate) account: AccountId,
    pub(crate) amount: Cents,
    pub(crate) received_at: Millis,
}

/// Records restored per kind, as `orderly restore` prints them.
pub(crate) type RestoreCounts = std::collections::BTreeMap<&'static str, u64>;

impl Record {
    /// The kind's name in the backup format and in counts.
    pub(crate) fn kind(&self) -> &'static str {
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
/// counts, and per account its balance (once its record is seen) and what its ledger sums to,
/// exactly: in i128, where no file's entries can overflow it (a sum that saturated at i64's end
/// could equal a balance there and pass a ledger that does not add up).
#[derive(Default)]
pub(crate) struct Tally {
    counts: RestoreCounts,
    books: std::collections::HashMap<AccountId, (Option<Cents>, i128)>,
    chains: super::ledger_check::LedgerCheck,
}

impl Tally {
    pub(crate) fn add(&mut self, record: &Record) {
        *self.counts.entry(record.kind()).or_insert(0) += 1;
        self.chains.add(record);
        match record {
            Record::Account { account, balance } => {
                self.books.entry(account.id).or_default().0 = Some(*balance);
            }
            Record::Ledger { account, entry } => {
                let sum = &mut self.books.entry(*account).or_default().1;
                *sum += i128::from(entry.amount.0);
            }
            _ => {}
        }
    }

    /// The counts, once every ledger is found to sum to its account's balance and to hold
    /// as a chain.
    pub(crate) fn finish(self) -> Result<RestoreCounts, StoreError> {
        for (account, (balance, sum)) in self.books {
            let Some(balance) = balance else {
                return Err(StoreError::Refused(format!(
                    "account {account}: ledger entries of an account the backup does not hold"
                )));
            };
            if sum != i128::from(balance.0) {
                return Err(StoreError::Refused(format!(
                    "account {account}: the ledger sums to {sum}, the balance is {balance}"
                )));
            }
        }
        let report = self.chains.finish();
        if let Some(first) = report.breaks.first() {
            return Err(StoreError::Refused(format!(
                "the ledger's chain breaks ({} break(s)), first {first}",
                report.breaks.len() as u64 + report.more_breaks
            )));
        }
        Ok(self.counts)
    }
}

/// The rows an engine found after writing `expected`'s records, kind by kind: the restore is
/// refused (and rolled back or removed) when any differs.
pub(super) fn verify_counts(
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
    pub(crate) fn for_tests(
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

    fn entry(account: AccountId, amount: i64, after: i64) -> Record {
        Record::Ledger {
            account,
            entry: LedgerEntry {
                id: Id::new(IdKind::Transaction).to_string(),
                amount: Cents(amount),
                reason: LedgerReason::Credit,
                reference: "r".into(),
                balance_after: Cents(after),
                created_at: 0,
                seq: 0,
                hash: [0; 32],
                previous_hash: [0; 32],
            },
        }
    }

    #[test]
    fn a_backup_whose_ledgers_sum_to_their_balances_is_counted_by_kind() {
        let (id, record) = account(70);
        let records = [record, entry(id, 100, 100), entry(id, -30, 70)];
        let counts = checked_counts(&records).unwrap();
        assert_eq!(counts.get("account"), Some(&1));
        assert_eq!(counts.get("ledger"), Some(&2));
    }

    #[test]
    fn a_backup_whose_ledger_does_not_sum_to_the_balance_is_refused_before_anything_is_written() {
        let (id, record) = account(71);
        let refused = checked_counts(&[record, entry(id, 100, 100), entry(id, -30, 70)]);
        assert!(
            matches!(&refused, Err(StoreError::Refused(why)) if why.contains("sums to 70")),
            "{refused:?}"
        );
    }

    #[test]
    fn ledger_entries_of_an_account_the_backup_does_not_hold_are_refused() {
        let (_, record) = account(0);
        let refused = checked_counts(&[record, entry(AccountId::new(), 5, 5)]);
        assert!(
            matches!(refused, Err(StoreError::Refused(_))),
            "{refused:?}"
        );
    }
}
