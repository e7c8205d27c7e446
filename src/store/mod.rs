//! The storage port: every business operation orderly performs on its data, each an async
//! call that returns only once its write is durable, and whose reads never show a write that
//! is not. Handlers and workers call these and nothing else; they cannot forget to make a
//! write durable, because the port has no other kind of write.
//!
//! The operations are business-level (`place_order`, `replay_lookup`, `credit`, ...), never a
//! key-value API, so that each engine implements them with its own transactions: `sled` is
//! the embedded engine (one binary, nothing else to run), `postgres` the shared one
//! (a database that operators already run, replicate and back up).

/// Room and time for writes: the bound on writes waiting, the line between sent and not.
mod admission;
/// The backup file: the records of a snapshot as checked JSON lines, engine-neutral.
pub(crate) mod backup_file;
/// The pipeline every engine runs its orders through: read a view, decide, write, answer.
mod batch;
/// Rows already read, kept in memory exact under change.
mod cache;
pub(crate) mod ledger_check;
mod open;
/// The shared engine, PostgreSQL: only `open`, `migrate` and their types are public.
pub(crate) mod postgres;
mod records;
/// The embedded engine, sled: only its constructor (`open` and its `Options`) is public.
pub(crate) mod sled;
mod snapshot;
/// The rows each write other than an order leaves, decided for every engine.
mod writes;

use std::net::IpAddr;

use async_trait::async_trait;

use crate::bounds::Deadline;

pub(crate) use open::open_embedded;
pub use open::{open, Engine, FlushHook, FlushStep, OpenError};

use crate::domain::account::{Account, ApiKeyRecord};
use crate::domain::chain::Funds;
use crate::domain::event::{DeliveryAttempt, DeliveryLog, Event};
use crate::domain::idempotency_key::IdempotencyKey;
use crate::domain::ids::{AccountId, Id, OrderId};
use crate::domain::ledger::LedgerEntry;
use crate::domain::money::Cents;
use crate::domain::order::Order;
use crate::domain::product::Product;
use crate::domain::time::Millis;
use crate::domain::webhook_secret::PreviousSecret;

pub use records::{
    checked_counts, Authenticated, CancelRefusal, CancelRequest, CreditRefusal, DeliveryOutcome,
    DueDelivery, KeyClaim, KeyRecord, NewCredit, NewOrder, OrderRefusal, Prefetched,
    ProviderCredit, ProviderPaymentRecord, ProviderRefusal, Record, Recorded, Redelivered,
    RefundRefusal, RefundRequest, StoredResponse,
};
pub(crate) use records::{RestoreCounts, Taken, Tally};
pub(crate) use snapshot::Producer;
pub use snapshot::Snapshot;

/// Why a call on the port did not complete, by what the caller can do about it. Every variant
/// is the opaque 500 on the wire (docs/contract.md "5. Failures"); they differ in whether the same call may succeed
/// when made again, which `retryable` answers.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The storage cannot be reached now (no connection to be had): nothing was done, and
    /// the engine reconnects by itself.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// The write lost a race with another (a serialization failure, a deadlock, a lock held
    /// past the lock timeout) more often than the engine retries it: nothing was written.
    #[error("write conflict: {0}")]
    Conflict(String),
    /// The storage failed under us (an I/O error, a full disk, a failed flush), or a commit's
    /// outcome is unknown: the key of the write decides its retry. On the embedded engine
    /// this is fatal: the process stops, because nothing it holds in memory can be trusted
    /// to match the disk any more.
    #[error("storage failed: {0}")]
    Failed(String),
    /// Not done by the request's deadline, and never to be done: a write that had not been
    /// sent to the storage (it is dropped before its commit), or a read. Nothing was written:
    /// a 503 with `Retry-After` (docs/contract.md "When the storage is slow").
    #[error("not done by the deadline: {0}")]
    TimedOut(String),
    /// Too many writes (`--max-pending-writes`), or reads, wait for the storage already:
    /// refused at once, nothing written, a 503 with `Retry-After` (docs/contract.md "When the storage is slow").
    #[error("too many requests waiting for the storage")]
    Overloaded,
    /// A write sent to the storage (its commit sent, its flush begun) and not confirmed by
    /// the request's deadline: its outcome is unknown, so the opaque 500, and the key of the
    /// write decides its retry (docs/contract.md "5. Failures" and docs/contract.md "When the storage is slow"). Not a failure of the storage.
    #[error("outcome unknown at the deadline: {0}")]
    InDoubt(String),
    /// A record that does not decode, or an index that points nowhere.
    #[error("corrupt record: {0}")]
    Corrupt(String),
    /// The operation cannot be done on the store as it is (a restore into a store that holds
    /// data, or one whose result does not verify).
    #[error("{0}")]
    Refused(String),
}

impl StoreError {
    /// Whether the same call, made again later, may succeed: nothing was written, and what
    /// stopped it passes by itself.
    pub(crate) fn retryable(&self) -> bool {
        matches!(
            self,
            StoreError::Unavailable(_)
                | StoreError::Conflict(_)
                | StoreError::TimedOut(_)
                | StoreError::Overloaded
        )
    }

    /// The same failure, met by a step after a write committed (an acknowledgement wait, a
    /// read for the answer): the write is done, so nothing about it may be answered "nothing
    /// was changed". What says so (a timeout, a lost race, no room, no connection) becomes
    /// `InDoubt`, the opaque 500 whose key (or a read) tells the caller what happened; a
    /// storage failure stays one.
    pub(crate) fn after_commit(self) -> StoreError {
        match self {
            StoreError::Failed(_) | StoreError::Corrupt(_) | StoreError::InDoubt(_) => self,
            other => StoreError::InDoubt(format!("committed, then: {other}")),
        }
    }

    /// Logs a background worker's failed pass: a retryable one is a warning (the next pass
    /// tries again), any other an error.
    pub(crate) fn log(&self, worker: &str) {
        if self.retryable() {
            log::warn!("{worker}: {self}");
        } else {
            log::error!("{worker}: {self}");
        }
    }
}

/// Decides, for each due callback in order, whether this pass takes it.
pub(crate) type DeliveryFilter = Box<dyn FnMut(&crate::domain::event::Delivery) -> bool + Send>;

/// What one request spent of a budget kept by the storage (GCRA: a theoretical arrival time
/// that moves one emission interval ahead per request allowed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spent {
    pub(crate) allowed: bool,
    /// How far the bucket's theoretical arrival time is ahead of now, after this request
    /// (nanoseconds, never negative): the time until the budget is full again.
    pub(crate) ahead_nanos: i64,
}

/// The per-client rate budget that every instance sharing one store spends from (docs/contract.md "6. Many instances"),
/// so that adding instances never multiplies a client's limit.
#[async_trait]
pub trait SharedRateLimit: Send + Sync + 'static {
    /// Spends one request of `bucket` (a client's address, as `edge::client_ip::bucket_of`
    /// masks it) whose budget comes back one request every `emission` nanoseconds and holds
    /// `window` nanoseconds of them (the burst): allowed when the arrival time, moved on by
    /// one emission, stays within `window` of now.
    async fn spend(
        &self,
        bucket: IpAddr,
        emission_nanos: i64,
        window_nanos: i64,
    ) -> Result<Spent, StoreError>;
    /// Forgets buckets whose budget is full again. Returns how many.
    async fn prune(&self) -> Result<usize, StoreError>;
}

/// One page of a list, and the cursor of the next one (`None` on the last page).
pub struct Page<T> {
    /// The page's items, in the list's order.
    pub items: Vec<T>,
    /// The cursor that asks for the next page.
    pub next_cursor: Option<String>,
}

/// The port. Writes resolve after their commit is durable; reads, lists, replays and the
/// outbox never show a write before that.
///
/// Every call takes the deadline of the request it serves (a worker's pass has one of its
/// own) and resolves by then, whatever the storage does (docs/contract.md "When the storage is slow"): a write not yet sent to
/// the storage is dropped, never to be written, and fails with `TimedOut`; one sent but not
/// confirmed fails with `InDoubt`; a read fails with `TimedOut`. Writes waiting for the
/// storage at once are bounded: one more fails at once with `Overloaded`, nothing written.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    // --- who is calling
    /// The live key with this SHA-256 and its account; `None` for unknown or revoked keys.
    async fn authenticate(
        &self,
        deadline: Deadline,
        key_hash: [u8; 32],
    ) -> Result<Option<(ApiKeyRecord, Account)>, StoreError>;
    /// `authenticate`, and what the engine can say of `key` (the request's idempotency key)
    /// in the key's account without a lookup of its own: its row (read in the same round trip,
    /// or from memory), or that its first use decides it (`Prefetched`). By default the key is
    /// not read (`Prefetched::NotRead`) and the handler looks it up.
    async fn authenticate_with_key(
        &self,
        deadline: Deadline,
        key_hash: [u8; 32],
        key: Option<IdempotencyKey>,
    ) -> Result<Option<Authenticated>, StoreError> {
        Ok(self
            .authenticate(deadline, key_hash)
            .await?
            .map(|(record, account)| Authenticated {
                prefetched: key.map_or(Prefetched::NotRead, |key| {
                    self.prefetch_without_reading(&account.id, key)
                }),
                record,
                account,
            }))
    }
    /// What the default `authenticate_with_key` says of a key without reading the storage
    /// (a row in memory, or that its first use decides it); by default nothing, and the
    /// handler looks the key up.
    fn prefetch_without_reading(&self, account: &AccountId, key: IdempotencyKey) -> Prefetched {
        let _ = (account, key);
        Prefetched::NotRead
    }
    /// The account as last committed; `None` when there is no such account.
    async fn account(
        &self,
        deadline: Deadline,
        id: AccountId,
    ) -> Result<Option<Account>, StoreError>;
    /// The account's available balance and the head of its ledger, as last made durable
    /// (0 and the genesis head for an unknown account).
    async fn balance(&self, deadline: Deadline, id: AccountId) -> Result<Funds, StoreError>;

    // --- the operator's writes
    /// Writes a new account with a balance of 0. Resolves once durable.
    async fn create_account(&self, deadline: Deadline, account: Account) -> Result<(), StoreError>;
    /// Stores a key by its SHA-256 (never the key itself), found afterwards by `authenticate`
    /// and, by its id, by `revoke_api_key`. Resolves once durable.
    async fn create_api_key(
        &self,
        deadline: Deadline,
        key_hash: [u8; 32],
        record: ApiKeyRecord,
    ) -> Result<(), StoreError>;
    /// Marks the key revoked; false when no such key exists.
    async fn revoke_api_key(&self, deadline: Deadline, key_id: Id) -> Result<bool, StoreError>;
    /// Creates or replaces the product with this id. Orders placed after it is durable are
    /// priced from it; orders placed before keep the prices they were charged.
    async fn put_product(&self, deadline: Deadline, product: Product) -> Result<(), StoreError>;
    /// Adds money (an admin credit, or the demo seed), decided by `domain::money_in::money_in`:
    /// a ledger entry, the new balance and, with a claim, the key's row holding the 200 body
    /// (`credit.render`), which is returned. `BalanceOverflow` and `KeyTaken` write nothing.
    /// Resolves once durable.
    async fn credit(
        &self,
        deadline: Deadline,
        credit: NewCredit,
    ) -> Result<Result<Vec<u8>, CreditRefusal>, StoreError>;

    // --- the catalog
    /// The product with this id, active or not.
    async fn product(&self, deadline: Deadline, id: String) -> Result<Option<Product>, StoreError>;
    /// Active products in id order, strictly after the cursor (a product id).
    async fn active_products_page(
        &self,
        deadline: Deadline,
        after: Option<String>,
        limit: usize,
    ) -> Result<Page<Product>, StoreError>;

    // --- idempotent writes and the partner's reads
    /// The row of a key that has been used successfully (expired or not), once durable. A
    /// first use still not durable at the deadline (its commit in flight) is `InDoubt`; a
    /// storage that did not answer the read, `TimedOut`.
    async fn replay_lookup(
        &self,
        deadline: Deadline,
        account: AccountId,
        key: IdempotencyKey,
    ) -> Result<Option<KeyRecord>, StoreError>;
    /// Places an order in one atomic write, decided by `domain::placing::place` on the
    /// balance and catalog as the commit sees them: the order (`processing`), its debit and
    /// ledger entry, and the key's row holding the exact 200 body (`order.render`), which is
    /// returned. The ids and the time are made at commit, in commit order per account; the
    /// key row expires `claim.ttl` after that time. Refusals write nothing: the basket or the
    /// shortfall as decided; `KeyTaken` when a first use of the same key committed first (with
    /// its row when the engine read it); `ConcurrentModification` when the engine's bounded
    /// retries of a lost race ran out, possibly before the key was read (the handler looks
    /// the key up before it answers the 402). Resolves once durable.
    async fn place_order(
        &self,
        deadline: Deadline,
        order: NewOrder,
    ) -> Result<Result<Vec<u8>, OrderRefusal>, StoreError>;
    /// Cancels one of the account's orders, decided by `domain::lifecycle::cancel` on the
    /// order and balance as the commit sees them: the cancelled order, its whole total back
    /// (ledger entry and balance), the `order.cancelled` event and its first callback, and,
    /// with a claim, the key's row holding the 200 body (`cancel.render`), which is returned.
    /// Refusals write nothing: `NotFound` (also for another account's order),
    /// `NotCancellable`, `KeyTaken`. Resolves once durable.
    async fn cancel_order(
        &self,
        deadline: Deadline,
        cancel: CancelRequest,
    ) -> Result<Result<Vec<u8>, CancelRefusal>, StoreError>;
    /// Refunds part or all of one of the account's completed orders, decided by
    /// `domain::lifecycle::refund`: the refund row, the order's new refunded total, the money
    /// back, the `order.refunded` event and its first callback, and the key's row holding
    /// the 200 body (`refund.render`), which is returned. Refusals write nothing: `NotFound`,
    /// `NotRefundable`, `ExceedsRemaining` (with what is left), `KeyTaken`. Resolves once
    /// durable.
    async fn refund_order(
        &self,
        deadline: Deadline,
        refund: RefundRequest,
    ) -> Result<Result<Vec<u8>, RefundRefusal>, StoreError>;
    /// Credits a provider's payment notification once per `(provider, external_id)`: the
    /// payment's row, the credit's ledger entry and the new balance in one write. A repeat,
    /// sequential or concurrent, in this instance or another, is `Duplicate` and moves no
    /// money (a unique row decides, not a check before the write). `BalanceOverflow` writes
    /// nothing. Resolves once durable.
    async fn record_provider_payment(
        &self,
        deadline: Deadline,
        payment: ProviderCredit,
    ) -> Result<Result<Recorded, ProviderRefusal>, StoreError>;
    /// The order as last made durable, of any account: the caller checks the owner.
    async fn order(&self, deadline: Deadline, id: OrderId) -> Result<Option<Order>, StoreError>;
    /// The account's orders (only those with `external_order_id` when given), newest first,
    /// strictly older than `before`.
    async fn orders_page(
        &self,
        deadline: Deadline,
        account: AccountId,
        external_order_id: Option<String>,
        before: Option<OrderId>,
        limit: usize,
    ) -> Result<Page<Order>, StoreError>;
    /// Ledger entries strictly older than `before` (a `txn_` id), newest first, each with its
    /// `previous_hash`.
    async fn ledger_page(
        &self,
        deadline: Deadline,
        account: AccountId,
        before: Option<Id>,
        limit: usize,
    ) -> Result<Page<LedgerEntry>, StoreError>;
    /// At most `limit` ledger entries with a `seq` above `after`, oldest first, each with its
    /// `previous_hash`.
    async fn ledger_after(
        &self,
        deadline: Deadline,
        account: AccountId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<LedgerEntry>, StoreError>;
    /// The delivery logs of these events of the account (`None`: no attempt yet).
    async fn delivery_logs(
        &self,
        deadline: Deadline,
        account: AccountId,
        event_ids: Vec<String>,
    ) -> Result<Vec<Option<DeliveryLog>>, StoreError>;
    /// Every account with its balance, oldest first, strictly after `after`.
    async fn accounts_page(
        &self,
        deadline: Deadline,
        after: Option<AccountId>,
        limit: usize,
    ) -> Result<Page<(Account, Cents)>, StoreError>;
    /// The account's events, oldest first, strictly after `after`.
    async fn events_page(
        &self,
        deadline: Deadline,
        account: AccountId,
        after: Option<Id>,
        limit: usize,
    ) -> Result<Page<Event>, StoreError>;

    // --- webhook operations (docs/contract.md "7. Webhooks")
    /// Replaces the account's webhook secret with `secret`; the one replaced keeps signing
    /// for `overlap` after `now` (`domain::webhook_secret::retire`). `None`: no such account.
    async fn rotate_webhook_secret(
        &self,
        deadline: Deadline,
        account: AccountId,
        secret: String,
        now: Millis,
        overlap: std::time::Duration,
    ) -> Result<Option<PreviousSecret>, StoreError>;
    /// Queues one attempt of the event's callback at `now`, as `domain::event::redelivery`
    /// decides; `owner` restricts it to that account's events (a partner's own).
    async fn redeliver(
        &self,
        deadline: Deadline,
        event: Id,
        owner: Option<AccountId>,
        now: Millis,
    ) -> Result<Redelivered, StoreError>;
    /// Redelivers every callback of the account given up at or after `since`; returns how
    /// many were queued.
    async fn recover_deliveries(
        &self,
        deadline: Deadline,
        account: AccountId,
        since: Millis,
        now: Millis,
    ) -> Result<u64, StoreError>;

    // --- background work
    // Every instance on a shared store runs every worker: each call below claims the work it
    // does, so that one piece of work is done by one instance at a time, and a claim of an
    // instance that died lapses by itself (within 30 s). One process alone owns all of it.
    /// Completes up to `max` `processing` orders created at or before `created_by`, each
    /// with its `order.completed` event. Returns how many were completed.
    async fn complete_due_orders(
        &self,
        deadline: Deadline,
        created_by: Millis,
        max: usize,
    ) -> Result<usize, StoreError>;
    /// Up to `max` callbacks due at `now`, oldest first, that `take` accepts (it sees each
    /// due one in order), each with its event and the account's signing secret; only
    /// deliveries whose event is durable. Each returned is claimed by this instance for
    /// longer than one attempt takes; a claim not settled in that time may be taken over.
    async fn due_deliveries(
        &self,
        deadline: Deadline,
        now: Millis,
        max: usize,
        take: DeliveryFilter,
    ) -> Result<Vec<DueDelivery>, StoreError>;
    /// Right before a due delivery's POST: confirms that this instance still holds the
    /// delivery and makes its hold outlast an attempt of `lasting` (and the settling write
    /// after it). False when it no longer holds it (another instance may): nothing is sent.
    async fn hold_for_attempt(
        &self,
        deadline: Deadline,
        due: &DueDelivery,
        lasting: std::time::Duration,
    ) -> Result<bool, StoreError>;
    /// Removes a delivered or abandoned callback, or moves it to its next attempt, and adds
    /// the attempt to the event's delivery log.
    async fn settle_delivery(
        &self,
        deadline: Deadline,
        due: DueDelivery,
        outcome: DeliveryOutcome,
        attempt: DeliveryAttempt,
    ) -> Result<(), StoreError>;
    /// Deletes up to `max` key rows whose expiry passed before `now`. Returns how many.
    async fn sweep_expired_keys(
        &self,
        deadline: Deadline,
        now: Millis,
        max: usize,
    ) -> Result<usize, StoreError>;

    // --- backups
    /// Everything stored, as of one instant: no write is half in it. Writes never wait for
    /// the snapshot to be taken or read, beyond a job as short as one write (sled's cut); the
    /// records may follow the answer by as long as the engine takes to cut.
    async fn snapshot(&self, deadline: Deadline) -> Result<Snapshot, StoreError>;
    /// Writes a whole snapshot into this store, which must be empty, as it streams (never
    /// held whole), then verifies what it wrote (counts per kind, every ledger against its
    /// balance) before any of it counts: a refusal, an error in the stream or a crash leaves
    /// the store as it was.
    async fn restore(
        &self,
        deadline: Deadline,
        records: Snapshot,
    ) -> Result<RestoreCounts, StoreError>;

    // --- many instances
    /// The rate budget shared with the other instances on this store, if the engine has one.
    /// `None` (the embedded engine, one process by construction): each process limits with
    /// its in-memory buckets alone, and the request path makes no call here.
    fn shared_rate_limit(&self) -> Option<std::sync::Arc<dyn SharedRateLimit>> {
        None
    }

    // --- operations
    /// No accounts and no products: the only state in which `--demo` seeds.
    async fn is_empty(&self, deadline: Deadline) -> Result<bool, StoreError>;
    /// Rows per keyspace, for `orderly stats`.
    async fn row_counts(&self, deadline: Deadline) -> Result<Vec<(&'static str, u64)>, StoreError>;
    /// A cheap read that proves the storage answers (`/readyz`), within
    /// `bounds::PROBE_TIMEOUT`; an error once it failed.
    async fn probe(&self) -> Result<(), StoreError>;
    /// What waits for the storage now: `/readyz` turns 503 once the oldest commit has waited
    /// `bounds::STALLED_AFTER`, since writes have stopped completing.
    fn progress(&self) -> Progress;
    /// Resolves with the reason on the first fatal storage error: the caller stops the
    /// process, since no later answer could be trusted.
    async fn failure(&self) -> String;
    /// Finishes the writes already queued, makes them durable and refuses later ones, giving
    /// up at `deadline`: says whether every write it took ended confirmed (or refused).
    async fn stop(&self, deadline: Deadline) -> Stopped;
}

/// What waits for the storage now (`/readyz`, `/metrics`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// How long the oldest commit (or flush) in flight has waited, or the oldest given up on
    /// unconfirmed since the last one confirmed; `None` when none.
    pub(crate) oldest_commit: Option<std::time::Duration>,
    /// How long the oldest write admitted and not yet done with has waited, whatever for.
    pub(crate) oldest_write: Option<std::time::Duration>,
    /// Writes admitted and not yet done with: queued, or waiting for their commit.
    pub(crate) pending_writes: usize,
}

/// How the storage stopped.
#[derive(Debug, PartialEq, Eq)]
pub enum Stopped {
    /// Every write it took was confirmed durable or refused: nothing was left in doubt.
    Settled,
    /// The deadline came first: this many writes were still waiting for the storage, their
    /// outcome unknown (none was acknowledged: a 200 waits for durability).
    Abandoned {
        /// How many writes were left waiting.
        in_flight: usize,
    },
}
