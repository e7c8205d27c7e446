//! The shared engine, PostgreSQL: real tables, one READ COMMITTED transaction per write,
//! committed (with `synchronous_commit` on) before the operation returns, and reads that only
//! ever see committed rows. The uses of one idempotency key are serialized by an advisory
//! lock, so the rule holds across every process that shares the database.
//!
//! The server owns durability here: a failed or unknown COMMIT fails that one request and the
//! process goes on (the key's rows were in the same transaction, so a retry either replays or
//! is a first use). `failure()` therefore never resolves. Only `open`, `migrate` and their
//! types leave this module.
//!
//! Every call is bounded by its request's deadline (`db.rs`): reads by a timer that gives the
//! connection up, writes by running in a task of their own that sends its COMMIT only while
//! the caller still waits, so that a caller answered at the deadline is told the truth
//! (nothing written, or its outcome unknown).
//!
//! Any number of instances share one database. Their per-client rate budget is a table
//! (`rate_limit.rs`); their background work is claimed: fulfillment and the sweeper take rows
//! with `FOR UPDATE SKIP LOCKED` inside one short transaction (whose locks die with the
//! session), webhook deliveries with a claim on the outbox row that holds while its instance
//! renews its heartbeat (the cache lease) and at most a lease of its own (`outbox.rs`),
//! because an attempt lasts as long as the receiver takes to answer.

mod accounts;
mod backup;
mod batch;
mod chain_rows;
mod clock;
mod codec;
pub(crate) mod connect;
mod db;
mod key_reads;
mod known_keys;
mod lifecycle;
mod limiter_loans;
mod locks;
mod migrate;
mod order_rows;
mod orders;
mod outbox;
mod privileges;
mod rate_limit;
mod reads;
mod rows;
mod shared_cache;
mod statement_order;
mod tx;
mod webhook_ops;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use deadpool_postgres::Pool;

use crate::bounds::{Deadline, PROBE_TIMEOUT};
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
use crate::metrics::Metrics;
use crate::store::admission::{self, Admission, InFlight};
use crate::store::{
    Authenticated, CancelRefusal, CancelRequest, CreditRefusal, DeliveryFilter, DeliveryOutcome,
    DueDelivery, KeyRecord, NewCredit, NewOrder, OrderRefusal, Page, Prefetched, Progress,
    ProviderCredit, ProviderRefusal, Recorded, Redelivered, RefundRefusal, RefundRequest,
    RestoreCounts, SharedRateLimit, Snapshot, Stopped, Store, StoreError,
};
use db::{Bound, Db};
use key_reads::KeyReads;
use tx::{retried, Fault};

pub(crate) struct Options {
    /// `postgres://…` or `postgresql://…`, with `sslmode` in the query string.
    pub(crate) url: String,
    /// Connections held at most.
    pub(crate) pool_size: usize,
    /// `--max-pending-writes`: writes queued or being committed at once.
    pub(crate) max_pending_writes: usize,
    /// Where each write's commit time is counted (`orderly_commit_flush_seconds`).
    pub(crate) metrics: Arc<Metrics>,
    /// Refuse (`OpenError::NotEmpty`) a database whose orderly tables hold rows, before the
    /// schema is migrated: what a restore or a copy is allowed into.
    pub(crate) empty_only: bool,
}

/// Why the engine could not start.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The URL cannot be used.
    #[error("{0}")]
    Config(#[from] connect::ConnectError),
    /// The database's schema is newer than this binary: it must not touch it.
    #[error("{0}")]
    SchemaTooNew(String),
    /// The database failed while the engine opened it (connecting, migrating or reading its state).
    #[error("{0}")]
    Database(String),
    /// Opened `empty_only`, and its orderly tables hold rows: nothing was touched.
    #[error("the target database is not empty")]
    NotEmpty,
}

impl From<migrate::MigrateError> for OpenError {
    fn from(e: migrate::MigrateError) -> Self {
        match e {
            migrate::MigrateError::TooNew { .. } => OpenError::SchemaTooNew(e.to_string()),
            migrate::MigrateError::Database(why) => OpenError::Database(why),
        }
    }
}

fn connect(options: &Options, application_name: &str) -> Result<Pool, OpenError> {
    let config = connect::config(&options.url, application_name)?;
    Ok(connect::pool(config, options.pool_size)?)
}

/// The engine's pool, the rate limiter's one connection of its own (so that however many
/// clients are counting, the limiter never takes a connection partner requests wait for), and
/// the cache lease's (so that a busy pool never lets the lease lapse).
fn connect_with_own(
    options: &Options,
    application_name: &str,
) -> Result<(Pool, Pool, Pool), OpenError> {
    let config = connect::config(&options.url, application_name)?;
    let pools = connect::pools(config, &[options.pool_size, 1, 1])?;
    let [pool, limiter, lease] = <[Pool; 3]>::try_from(pools).expect("three pools");
    Ok((pool, limiter, lease))
}

async fn migrated(pool: &Pool, url: &str) -> Result<Vec<i32>, OpenError> {
    let mut client = pool
        .get()
        .await
        .map_err(|e| OpenError::Database(connect::cannot_connect(&e, url)))?;
    connect::writable(&client, url)
        .await
        .map_err(OpenError::Database)?;
    Ok(migrate::run(&mut client).await?)
}

/// `OpenError::NotEmpty` when the database's orderly tables (those that exist: it may have no
/// schema yet, or an older one) hold a row; read before anything is migrated.
async fn refuse_rows(pool: &Pool, url: &str) -> Result<(), OpenError> {
    let client = pool
        .get()
        .await
        .map_err(|e| OpenError::Database(connect::cannot_connect(&e, url)))?;
    let holds = reads::holds_rows(&client)
        .await
        .map_err(|e| OpenError::Database(StoreError::from(e).to_string()))?;
    if holds {
        return Err(OpenError::NotEmpty);
    }
    Ok(())
}

/// Applies pending migrations and returns the versions applied (`orderly migrate`).
pub(crate) async fn migrate(url: &str) -> Result<Vec<i32>, OpenError> {
    let pool = connect(
        &Options {
            url: url.to_string(),
            pool_size: 1,
            max_pending_writes: 1,
            metrics: Arc::default(),
            empty_only: false,
        },
        "orderly migrate",
    )?;
    let applied = migrated(&pool, url).await;
    pool.close();
    applied
}

/// Connects, brings the schema up to date, and returns the engine.
pub(crate) async fn open(options: Options) -> Result<Arc<dyn Store>, OpenError> {
    let instance = format!(
        "{}-{}",
        std::process::id(),
        crate::domain::ids::random_hex()
    );
    let (pool, limiter, lease) = connect_with_own(&options, &outbox::application_name(&instance))?;
    if options.empty_only {
        refuse_rows(&pool, &options.url).await?;
    }
    migrated(&pool, &options.url).await?;
    chain_rows::chain_unchained(&pool).await?;
    privileges::report(&pool)
        .await
        .map_err(|e| OpenError::Database(format!("reading what the role may execute: {e}")))?;
    log::info!("{}", tx::how_statements_go());
    // Every time that decides between instances is the database's (`clock.rs`).
    let skew = clock::sync(&pool).await.map_err(|e| {
        OpenError::Database(format!(
            "reading the database's clock: {}",
            StoreError::from(e)
        ))
    })?;
    clock::report(skew);
    let clock = tokio::spawn(clock::follow_the_database(pool.clone()));
    let cache = Arc::new(shared_cache::SharedCache::default());
    // Every key that can authenticate, before anything is served (`known_keys.rs`).
    cache.know(known_keys::at_open(&pool).await?);
    options
        .metrics
        .api_keys_known
        .set(cache.known_keys() as i64);
    // The heartbeat's commits count among the commits in flight (`/readyz`): an instance
    // whose own renewals stall has a storage that stopped completing writes, even while no
    // request writes.
    let commits: Arc<InFlight> = Arc::default();
    let leases = tokio::spawn(shared_cache::renew_leases(
        Arc::clone(&cache),
        lease,
        instance.clone(),
        Arc::clone(&commits),
        Arc::clone(&options.metrics),
    ));
    let db = Arc::new(Db {
        pool,
        admission: Admission::new(options.max_pending_writes),
        commits,
        metrics: Arc::clone(&options.metrics),
        runtime: tokio::runtime::Handle::current(),
    });
    let history = cache.history();
    Ok(Arc::new(PgStore {
        background: [clock.abort_handle(), leases.abort_handle()],
        cache,
        limiter: Arc::new(rate_limit::PgRateLimit::new(
            limiter,
            options.metrics,
            history,
        )),
        orders: batch::Batcher::new(Arc::clone(&db)),
        key_reads: KeyReads::new(options.pool_size),
        instance,
        db,
    }))
}

struct PgStore {
    db: Arc<Db>,
    /// The tasks that keep now on the database's clock and renew the cache lease; stopped
    /// with the store.
    background: [tokio::task::AbortHandle; 2],
    /// API keys and key rows in memory, exact across instances (`shared_cache.rs`).
    cache: Arc<shared_cache::SharedCache>,
    /// The per-client rate budget, on the same connections.
    limiter: Arc<rate_limit::PgRateLimit>,
    /// New orders, placed in batches (one COMMIT each).
    orders: Arc<batch::Batcher>,
    /// Names this process in the outbox claims it holds (unique per start) and in the cache
    /// lease it renews, by which the others know it is alive.
    instance: String,
    /// The share of the pool that API key lookups may hold at once: whatever arrives with
    /// keys this instance cannot answer from memory, the connections partner writes wait for
    /// stay free.
    key_reads: KeyReads,
}

impl Drop for PgStore {
    fn drop(&mut self) {
        for task in &self.background {
            task.abort();
        }
    }
}

impl PgStore {
    /// Before an API key is looked up in the database: `None` when no key with this hash can
    /// authenticate, as this instance knows without a statement (the 401); otherwise a place
    /// among the lookups in flight (`key_reads.rs`), held for the lookup, which is counted.
    async fn key_lookup(
        &self,
        deadline: Deadline,
        hash: &[u8; 32],
    ) -> Result<Option<tokio::sync::SemaphorePermit<'_>>, StoreError> {
        if self.cache.surely_unknown(hash) {
            return Ok(None);
        }
        let share = self.key_reads.enter(deadline).await?;
        self.db.metrics.api_key_reads.inc();
        Ok(Some(share))
    }

    /// Returns once no instance serves a copy of an API key or account from before change
    /// `version` (`shared_cache.rs`): only then may the change be reported done. The change
    /// is committed already, so a wait cut short by the deadline leaves it in doubt.
    async fn acknowledged(&self, deadline: Deadline, version: i64) -> Result<(), StoreError> {
        let waiting = async {
            let mut client = self.db.conn(&Bound::read(deadline, &self.db)).await?;
            let acknowledged = shared_cache::acknowledged(&*client, version).await;
            client.settle();
            acknowledged
        };
        match tokio::time::timeout_at(deadline.instant().into(), waiting).await {
            Ok(acknowledged) => settled(acknowledged).map_err(StoreError::after_commit),
            Err(_) => Err(StoreError::InDoubt(format!(
                "change {version} is committed; not every instance acknowledged it by the deadline"
            ))),
        }
    }
}

/// A write: admitted among the writes waiting (refused at once past `--max-pending-writes`),
/// run with `retried!`'s bounded retries in a task of its own on the engine's runtime, its
/// locks bounded by `$claim`'s wait (or `LOCK_TIMEOUT`), and answered by `$deadline`: not
/// sent by then, it never is (`TimedOut`); sent, its outcome is unknown (`InDoubt`). The task
/// runs on (`db::finish`), so its COMMIT is confirmed or its connection given up, and its
/// place among the waiting writes is given back only then. `$body` is moved into the task.
macro_rules! write {
    ($store:expr, $deadline:expr, $claim:expr, |$client:ident| $body:expr) => {{
        let db = Arc::clone(&$store.db);
        match db.admission.admit($deadline) {
            Err(refused) => Err(refused),
            Ok(admitted) => {
                let (deadline, ticket) = (admitted.deadline, admitted.ticket.clone());
                let bound = Bound::write(&admitted, $claim, &db);
                let (answer, answered) = tokio::sync::oneshot::channel();
                $store.db.runtime.spawn(async move {
                    let started = Instant::now();
                    let work = async { retried!(db, bound, |$client| $body) };
                    let outcome = db::finish(&bound, work).await;
                    let outcome = db.committed(started, outcome).map_err(StoreError::from);
                    drop(admitted);
                    let _ = answer.send(outcome);
                });
                admission::answer(deadline, &ticket, answered).await
            }
        }
    }};
}

/// A read, with `retried!`'s bounded retries, answered by `$deadline` (`TimedOut` past it;
/// the connection of a read cut short is given up, not handed back).
macro_rules! read {
    ($store:expr, $deadline:expr, |$client:ident| $body:expr) => {{
        let deadline: Deadline = $deadline;
        let bound = Bound::read(deadline, &$store.db);
        let reading = async { retried!($store.db, bound, |$client| $body) };
        match tokio::time::timeout_at(deadline.instant().into(), reading).await {
            Ok(outcome) => settled(outcome),
            Err(_) => Err(StoreError::TimedOut(
                "the database did not answer the read by the deadline".into(),
            )),
        }
    }};
}

/// The engine's result as the port's: races lost past the bound are a storage error too.
fn settled<T>(outcome: Result<T, Fault>) -> Result<T, StoreError> {
    outcome.map_err(StoreError::from)
}

#[async_trait]
impl Store for PgStore {
    async fn authenticate(
        &self,
        deadline: Deadline,
        key_hash: [u8; 32],
    ) -> Result<Option<(ApiKeyRecord, Account)>, StoreError> {
        if let Some(hit) = self.cache.api_key(&key_hash) {
            return Ok(Some(hit));
        }
        let Some(_share) = self.key_lookup(deadline, &key_hash).await? else {
            return Ok(None);
        };
        let generation = self.cache.auth_generation();
        let found = read!(self, deadline, |c| reads::authenticate(&c, &key_hash))?;
        if let Some(found) = &found {
            self.cache
                .remember_api_key(generation, key_hash, found.clone());
        }
        Ok(found)
    }

    async fn authenticate_with_key(
        &self,
        deadline: Deadline,
        key_hash: [u8; 32],
        key: Option<IdempotencyKey>,
    ) -> Result<Option<Authenticated>, StoreError> {
        let Some(key) = key else {
            let found = self.authenticate(deadline, key_hash).await?;
            return Ok(found.map(|(record, account)| Authenticated {
                record,
                account,
                prefetched: Prefetched::NotRead,
            }));
        };
        // With the API key in memory, no round trip at all: a replay from memory, or the key
        // left to its first use, which takes the key's lock and reads its committed row in
        // the same transaction (a batch's view, or `key_taken` alone), refuses a taken key
        // with that row, and so decides as the lookup would have; the lookup would be one
        // more statement for every new order.
        if let Some((record, account)) = self.cache.api_key(&key_hash) {
            let scoped = (account.id, key);
            let prefetched = match self.cache.key_row(&scoped) {
                Some(row) => Prefetched::Read {
                    key: scoped.1,
                    row: Some(row),
                },
                None => Prefetched::LeftToFirstUse { key: scoped.1 },
            };
            return Ok(Some(Authenticated {
                record,
                account,
                prefetched,
            }));
        }
        // Without it, the API key and the idempotency key in one statement.
        let Some(_share) = self.key_lookup(deadline, &key_hash).await? else {
            return Ok(None);
        };
        let generation = self.cache.auth_generation();
        let found = read!(self, deadline, |c| reads::authenticate_with_key(
            &c, &key_hash, &key
        ))?;
        Ok(found.map(|(record, account, row)| {
            self.cache
                .remember_api_key(generation, key_hash, (record.clone(), account.clone()));
            if let Some(row) = &row {
                self.cache.remember_key_row(&account.id, &key, row);
            }
            Authenticated {
                record,
                account,
                prefetched: Prefetched::Read { key, row },
            }
        }))
    }

    async fn account(
        &self,
        deadline: Deadline,
        id: AccountId,
    ) -> Result<Option<Account>, StoreError> {
        read!(self, deadline, |c| reads::account(&c, &id))
    }

    async fn balance(&self, deadline: Deadline, id: AccountId) -> Result<Funds, StoreError> {
        read!(self, deadline, |c| reads::balance(&c, &id))
    }

    async fn create_account(&self, deadline: Deadline, account: Account) -> Result<(), StoreError> {
        write!(self, deadline, None, |c| accounts::create_account(
            &mut c, &account
        ))
    }

    async fn create_api_key(
        &self,
        deadline: Deadline,
        key_hash: [u8; 32],
        record: ApiKeyRecord,
    ) -> Result<(), StoreError> {
        let version = write!(self, deadline, None, |c| accounts::create_api_key(
            &mut c, &key_hash, &record
        ))?;
        // Answered once every instance knows the key: from then on each authenticates it.
        self.acknowledged(deadline, version).await
    }

    async fn revoke_api_key(&self, deadline: Deadline, key_id: Id) -> Result<bool, StoreError> {
        let changed = write!(self, deadline, None, |c| accounts::revoke_api_key(
            &mut c, &key_id
        ))?;
        let Some(version) = changed else {
            return Ok(false);
        };
        self.acknowledged(deadline, version).await?;
        Ok(true)
    }

    async fn put_product(&self, deadline: Deadline, product: Product) -> Result<(), StoreError> {
        write!(self, deadline, None, |c| accounts::put_product(
            &mut c, &product
        ))
    }

    async fn credit(
        &self,
        deadline: Deadline,
        credit: NewCredit,
    ) -> Result<Result<Vec<u8>, CreditRefusal>, StoreError> {
        write!(self, deadline, credit.claim.as_ref(), |c| accounts::credit(
            &mut c, &credit
        ))
    }

    async fn product(&self, deadline: Deadline, id: String) -> Result<Option<Product>, StoreError> {
        read!(self, deadline, |c| reads::product(&c, &id))
    }

    async fn active_products_page(
        &self,
        deadline: Deadline,
        after: Option<String>,
        limit: usize,
    ) -> Result<Page<Product>, StoreError> {
        read!(self, deadline, |c| reads::active_products_page(
            &c,
            after.clone(),
            limit
        ))
    }

    async fn replay_lookup(
        &self,
        deadline: Deadline,
        account: AccountId,
        key: IdempotencyKey,
    ) -> Result<Option<KeyRecord>, StoreError> {
        let scoped = (account, key);
        if let Some(row) = self.cache.key_row(&scoped) {
            return Ok(Some(row));
        }
        let (account, key) = scoped;
        let row = read!(self, deadline, |c| reads::replay_lookup(&c, &account, &key))?;
        if let Some(row) = &row {
            self.cache.remember_key_row(&account, &key, row);
        }
        Ok(row)
    }

    async fn place_order(
        &self,
        deadline: Deadline,
        order: NewOrder,
    ) -> Result<Result<Vec<u8>, OrderRefusal>, StoreError> {
        let (account, key) = (order.account.id, order.claim.key.clone());
        let placed = self.orders.place(deadline, order).await?;
        // A taken key's row, as its batch read it: committed, and so kept as a read's is.
        if let Err(OrderRefusal::KeyTaken(Some(row))) = &placed {
            self.cache.remember_key_row(&account, &key, row);
        }
        Ok(placed)
    }

    async fn cancel_order(
        &self,
        deadline: Deadline,
        cancel: CancelRequest,
    ) -> Result<Result<Vec<u8>, CancelRefusal>, StoreError> {
        write!(self, deadline, cancel.claim.as_ref(), |c| {
            lifecycle::change_order(&mut c, &cancel)
        })
    }

    async fn refund_order(
        &self,
        deadline: Deadline,
        refund: RefundRequest,
    ) -> Result<Result<Vec<u8>, RefundRefusal>, StoreError> {
        write!(self, deadline, Some(&refund.claim), |c| {
            lifecycle::change_order(&mut c, &refund)
        })
    }

    async fn record_provider_payment(
        &self,
        deadline: Deadline,
        payment: ProviderCredit,
    ) -> Result<Result<Recorded, ProviderRefusal>, StoreError> {
        write!(self, deadline, None, |c| accounts::record_provider_payment(
            &mut c, &payment
        ))
    }

    async fn order(&self, deadline: Deadline, id: OrderId) -> Result<Option<Order>, StoreError> {
        read!(self, deadline, |c| reads::order(&c, &id))
    }

    async fn orders_page(
        &self,
        deadline: Deadline,
        account: AccountId,
        external_order_id: Option<String>,
        before: Option<OrderId>,
        limit: usize,
    ) -> Result<Page<Order>, StoreError> {
        read!(self, deadline, |c| reads::orders_page(
            &c,
            &account,
            external_order_id.clone(),
            before,
            limit
        ))
    }

    async fn ledger_page(
        &self,
        deadline: Deadline,
        account: AccountId,
        before: Option<Id>,
        limit: usize,
    ) -> Result<Page<LedgerEntry>, StoreError> {
        read!(self, deadline, |c| reads::ledger_page(
            &c, &account, before, limit
        ))
    }

    async fn ledger_after(
        &self,
        deadline: Deadline,
        account: AccountId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<LedgerEntry>, StoreError> {
        read!(self, deadline, |c| reads::ledger_after(
            &c, &account, after, limit
        ))
    }

    async fn rotate_webhook_secret(
        &self,
        deadline: Deadline,
        account: AccountId,
        secret: String,
        now: Millis,
        overlap: Duration,
    ) -> Result<Option<PreviousSecret>, StoreError> {
        let rotated = write!(self, deadline, None, |c| {
            webhook_ops::rotate_webhook_secret(&mut c, &account, &secret, now, overlap)
        })?;
        let Some((previous, version)) = rotated else {
            return Ok(None);
        };
        self.acknowledged(deadline, version).await?;
        Ok(Some(previous))
    }

    async fn redeliver(
        &self,
        deadline: Deadline,
        event: Id,
        owner: Option<AccountId>,
        now: Millis,
    ) -> Result<Redelivered, StoreError> {
        write!(self, deadline, None, |c| webhook_ops::redeliver(
            &mut c, &event, owner, now
        ))
    }

    async fn recover_deliveries(
        &self,
        deadline: Deadline,
        account: AccountId,
        since: Millis,
        now: Millis,
    ) -> Result<u64, StoreError> {
        write!(self, deadline, None, |c| webhook_ops::recover(
            &mut c, &account, since, now
        ))
    }

    async fn delivery_logs(
        &self,
        deadline: Deadline,
        _account: AccountId,
        event_ids: Vec<String>,
    ) -> Result<Vec<Option<DeliveryLog>>, StoreError> {
        read!(self, deadline, |c| reads::delivery_logs(&c, &event_ids))
    }

    async fn accounts_page(
        &self,
        deadline: Deadline,
        after: Option<AccountId>,
        limit: usize,
    ) -> Result<Page<(Account, Cents)>, StoreError> {
        read!(self, deadline, |c| reads::accounts_page(&c, after, limit))
    }

    async fn events_page(
        &self,
        deadline: Deadline,
        account: AccountId,
        after: Option<Id>,
        limit: usize,
    ) -> Result<Page<Event>, StoreError> {
        read!(self, deadline, |c| reads::events_page(
            &c, &account, after, limit
        ))
    }

    async fn complete_due_orders(
        &self,
        deadline: Deadline,
        created_by: Millis,
        max: usize,
    ) -> Result<usize, StoreError> {
        write!(self, deadline, None, |c| lifecycle::complete_due_orders(
            &mut c, created_by, max
        ))
    }

    async fn due_deliveries(
        &self,
        deadline: Deadline,
        now: Millis,
        max: usize,
        take: DeliveryFilter,
    ) -> Result<Vec<DueDelivery>, StoreError> {
        // The filter is used up by one pass: no retry. The claims it takes lapse by
        // themselves if the pass is cut short.
        let claiming = async {
            let mut client = self.db.conn(&Bound::read(deadline, &self.db)).await?;
            // Read before the claims are taken: a history change seen meanwhile makes them
            // older than the history, never newer.
            let epoch = self.cache.history().epoch();
            let due = outbox::due_deliveries(&client, &self.instance, epoch, now, max, take).await;
            client.settle();
            due
        };
        match tokio::time::timeout_at(deadline.instant().into(), claiming).await {
            Ok(due) => settled(due),
            Err(_) => Err(StoreError::TimedOut(
                "the outbox was not read by the deadline".into(),
            )),
        }
    }

    async fn hold_for_attempt(
        &self,
        deadline: Deadline,
        due: &DueDelivery,
        lasting: Duration,
    ) -> Result<bool, StoreError> {
        if due.claimed_in != self.cache.history().epoch() {
            // Claimed in a history the database no longer has: it decides again.
            return Ok(false);
        }
        let sent = Instant::now();
        let (instance, event_id, claim) = (
            self.instance.clone(),
            due.delivery.event_id.clone(),
            due.claim,
        );
        let held = write!(self, deadline, None, |c| outbox::hold_for_attempt(
            &c, &instance, &event_id, claim
        ))?;
        // The lease runs from when the database ran the extension, at the earliest when it
        // was sent: an answer that came too late to leave `lasting` of it is not used.
        let left = Duration::from_millis(outbox::ATTEMPT_LEASE_MS).saturating_sub(sent.elapsed());
        Ok(held && left >= lasting)
    }

    async fn settle_delivery(
        &self,
        deadline: Deadline,
        due: DueDelivery,
        outcome: DeliveryOutcome,
        attempt: DeliveryAttempt,
    ) -> Result<(), StoreError> {
        if due.claimed_in != self.cache.history().epoch() {
            // The claim, and the outbox row it was made on, belong to a history the database
            // no longer has (its claim numbers may be handed out again): the row as the
            // database has it now is delivered again, at least once, never at once with this.
            log::warn!(
                "webhook {}: attempted before the database went back in time; not settled, the outbox decides again",
                due.delivery.event_id
            );
            return Ok(());
        }
        write!(self, deadline, None, |c| outbox::settle_delivery(
            &mut c, &due, outcome, &attempt
        ))
    }

    async fn sweep_expired_keys(
        &self,
        deadline: Deadline,
        now: Millis,
        max: usize,
    ) -> Result<usize, StoreError> {
        write!(self, deadline, None, |c| outbox::sweep_expired_keys(
            &c, now, max
        ))
    }

    async fn snapshot(&self, deadline: Deadline) -> Result<Snapshot, StoreError> {
        // Bounded by its start: the stream then runs as long as it needs.
        let client = settled(self.db.conn(&Bound::read(deadline, &self.db)).await)?;
        let (producer, snapshot) = Snapshot::channel();
        tokio::spawn(backup::stream(client, producer));
        Ok(snapshot)
    }

    async fn restore(
        &self,
        deadline: Deadline,
        records: Snapshot,
    ) -> Result<RestoreCounts, StoreError> {
        let mut records = Some(records);
        write!(self, deadline, None, |c| backup::restore(
            &mut c,
            records.take()
        ))
    }

    fn shared_rate_limit(&self) -> Option<Arc<dyn SharedRateLimit>> {
        Some(Arc::clone(&self.limiter) as Arc<dyn SharedRateLimit>)
    }

    async fn is_empty(&self, deadline: Deadline) -> Result<bool, StoreError> {
        read!(self, deadline, |c| reads::is_empty(&c))
    }

    async fn row_counts(&self, deadline: Deadline) -> Result<Vec<(&'static str, u64)>, StoreError> {
        read!(self, deadline, |c| reads::row_counts(&*c))
    }

    async fn probe(&self) -> Result<(), StoreError> {
        let deadline = Deadline::after(PROBE_TIMEOUT);
        read!(self, deadline, |c| tx::execute(&*c, "SELECT 1", &[])).map(drop)
    }

    fn progress(&self) -> Progress {
        Progress {
            oldest_commit: self.db.commits.oldest(),
            oldest_write: self.db.admission.oldest(),
            pending_writes: self.db.admission.pending(),
        }
    }

    async fn failure(&self) -> String {
        // A database error fails one request, never the process.
        std::future::pending().await
    }

    async fn stop(&self, deadline: Deadline) -> Stopped {
        for task in &self.background {
            task.abort();
        }
        // No copy is served from here on, so the lease can go: changes stop waiting for it.
        self.cache.give_up();
        if let Err(e) = read!(self, deadline, |c| shared_cache::release(
            &*c,
            &self.instance
        )) {
            log::warn!("releasing the cache lease: {e}");
        }
        // The workers have stopped (or were left inside a pass, whose claims then lapse
        // by themselves), so hand the claims back at once rather than let another instance
        // wait out the lease (a rolling restart would otherwise delay those callbacks).
        if let Err(e) = read!(self, deadline, |c| outbox::release_claims(
            &c,
            &self.instance
        )) {
            log::warn!("webhooks: releasing this instance's claims: {e}");
        }
        // Writes still running (a COMMIT not yet confirmed) are waited for until the deadline.
        while self.db.admission.pending() > 0 && !deadline.passed() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let in_flight = self.db.admission.pending();
        self.db.pool.close();
        if in_flight == 0 {
            Stopped::Settled
        } else {
            Stopped::Abandoned { in_flight }
        }
    }
}
