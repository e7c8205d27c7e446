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
//! Any number of instances share one database. Their per-client rate budget is a table
//! (`rate_limit.rs`); their background work is claimed: fulfillment and the sweeper take rows
//! with `FOR UPDATE SKIP LOCKED` inside one short transaction (whose locks die with the
//! session), webhook deliveries with a claim on the outbox row that holds while its instance
//! has a connection open and at most a lease (`outbox.rs`), because an attempt lasts as long
//! as the receiver takes to answer.

mod accounts;
mod backup;
mod batch;
mod clock;
mod codec;
mod connect;
mod lifecycle;
mod limiter_loans;
mod migrate;
mod orders;
mod outbox;
mod rate_limit;
mod reads;
mod rows;
mod shared_cache;
mod tx;
mod webhook_ops;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use deadpool_postgres::{Object, Pool};

use crate::domain::account::{Account, ApiKeyRecord};
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
use crate::store::{
    Authenticated, CancelRefusal, CancelRequest, CreditRefusal, DeliveryFilter, DeliveryOutcome,
    DueDelivery, KeyRecord, NewCredit, NewOrder, OrderRefusal, Page, Prefetched, ProviderCredit,
    ProviderRefusal, Record, Recorded, Redelivered, RefundRefusal, RefundRequest, RestoreCounts,
    SharedRateLimit, Snapshot, Store, StoreError,
};
use tx::{retried, Fault, ReadCommitted};

/// How long `/readyz` waits for the database to answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

pub struct Options {
    /// `postgres://…` or `postgresql://…`, with `sslmode` in the query string.
    pub url: String,
    /// Connections held at most.
    pub pool_size: usize,
    /// Where each write's commit time is counted (`orderly_commit_flush_seconds`).
    pub metrics: Arc<Metrics>,
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
    #[error("{0}")]
    Database(String),
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

async fn migrated(pool: &Pool) -> Result<Vec<i32>, OpenError> {
    let mut client = pool
        .get()
        .await
        .map_err(|e| OpenError::Database(format!("cannot connect to the database: {e}")))?;
    Ok(migrate::run(&mut client).await?)
}

/// Applies pending migrations and returns the versions applied (`orderly migrate`).
pub async fn migrate(url: &str) -> Result<Vec<i32>, OpenError> {
    let pool = connect(
        &Options {
            url: url.to_string(),
            pool_size: 1,
            metrics: Arc::default(),
        },
        "orderly migrate",
    )?;
    let applied = migrated(&pool).await;
    pool.close();
    applied
}

/// Connects, brings the schema up to date, and returns the engine.
pub async fn open(options: Options) -> Result<Arc<dyn Store>, OpenError> {
    let instance = format!(
        "{}-{}",
        std::process::id(),
        crate::domain::ids::random_hex()
    );
    let (pool, limiter, lease) = connect_with_own(&options, &outbox::application_name(&instance))?;
    migrated(&pool).await?;
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
    let leases = tokio::spawn(shared_cache::renew_leases(
        Arc::clone(&cache),
        lease,
        instance.clone(),
    ));
    Ok(Arc::new(PgStore {
        background: [clock.abort_handle(), leases.abort_handle()],
        cache,
        limiter: Arc::new(rate_limit::PgRateLimit::new(
            limiter,
            Arc::clone(&options.metrics),
        )),
        orders: batch::Batcher::new(pool.clone()),
        instance,
        pool,
        metrics: options.metrics,
    }))
}

struct PgStore {
    pool: Pool,
    /// The tasks that keep now on the database's clock and renew the cache lease; stopped
    /// with the store.
    background: [tokio::task::AbortHandle; 2],
    /// API keys and key rows in memory, exact across instances (`shared_cache.rs`).
    cache: Arc<shared_cache::SharedCache>,
    metrics: Arc<Metrics>,
    /// The per-client rate budget, on the same connections.
    limiter: Arc<rate_limit::PgRateLimit>,
    /// New orders, placed in batches (one COMMIT each).
    orders: Arc<batch::Batcher>,
    /// Names this process in the outbox claims it holds (unique per start), and in the
    /// `application_name` of its connections, by which the others know it is alive.
    instance: String,
}

impl Drop for PgStore {
    fn drop(&mut self) {
        for task in &self.background {
            task.abort();
        }
    }
}

impl PgStore {
    async fn client(&self) -> Result<Object, Fault> {
        Ok(self.pool.get().await?)
    }

    /// Returns once no instance serves a copy of an API key or account from before change
    /// `version` (`shared_cache.rs`): only then may the change be reported done.
    async fn acknowledged(&self, version: i64) -> Result<(), StoreError> {
        let client = self.client().await.map_err(StoreError::from)?;
        settled(shared_cache::acknowledged(&client, version).await)
    }

    /// Counts a committed write's time, as the embedded engine counts its flushes.
    fn committed<T>(&self, started: Instant, outcome: Result<T, Fault>) -> Result<T, Fault> {
        if outcome.is_ok() {
            self.metrics
                .commit_seconds
                .observe(started.elapsed().as_secs_f64());
        }
        outcome
    }
}

/// A write: `retried!`, its time counted once it committed.
macro_rules! write {
    ($store:expr, |$client:ident| $body:expr) => {{
        let started = Instant::now();
        $store.committed(started, retried!($store, |$client| $body))
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
        key_hash: [u8; 32],
    ) -> Result<Option<(ApiKeyRecord, Account)>, StoreError> {
        if let Some(hit) = self.cache.api_key(&key_hash) {
            return Ok(Some(hit));
        }
        let generation = self.cache.auth_generation();
        let found = settled(retried!(self, |c| reads::authenticate(&c, &key_hash)))?;
        if let Some(found) = &found {
            self.cache
                .remember_api_key(generation, key_hash, found.clone());
        }
        Ok(found)
    }

    async fn authenticate_with_key(
        &self,
        key_hash: [u8; 32],
        key: Option<IdempotencyKey>,
    ) -> Result<Option<Authenticated>, StoreError> {
        let Some(key) = key else {
            let found = self.authenticate(key_hash).await?;
            return Ok(found.map(|(record, account)| Authenticated {
                record,
                account,
                prefetched: Prefetched::NotRead,
            }));
        };
        // A replay from memory: no round trip at all.
        if let Some((record, account)) = self.cache.api_key(&key_hash) {
            if let Some(row) = self.cache.key_row(&account.id, &key) {
                return Ok(Some(Authenticated {
                    record,
                    account,
                    prefetched: Prefetched::Read {
                        key,
                        row: Some(row),
                    },
                }));
            }
        }
        let generation = self.cache.auth_generation();
        let found = settled(retried!(self, |c| reads::authenticate_with_key(
            &c, &key_hash, &key
        )))?;
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

    async fn account(&self, id: AccountId) -> Result<Option<Account>, StoreError> {
        settled(retried!(self, |c| reads::account(&c, &id)))
    }

    async fn balance(&self, id: AccountId) -> Result<Cents, StoreError> {
        settled(retried!(self, |c| reads::balance(&c, &id)))
    }

    async fn create_account(&self, account: Account) -> Result<(), StoreError> {
        settled(write!(self, |c| async {
            let tx = c.read_committed().await?;
            rows::insert_account(&tx, &account, Cents::ZERO).await?;
            tx.commit().await?;
            Ok(())
        }))
    }

    async fn create_api_key(
        &self,
        key_hash: [u8; 32],
        record: ApiKeyRecord,
    ) -> Result<(), StoreError> {
        settled(write!(self, |c| rows::insert_api_key(
            &c, &key_hash, &record
        )))
    }

    async fn revoke_api_key(&self, key_id: Id) -> Result<bool, StoreError> {
        let changed = settled(write!(self, |c| accounts::revoke_api_key(&mut c, &key_id)))?;
        let Some(version) = changed else {
            return Ok(false);
        };
        self.acknowledged(version).await?;
        Ok(true)
    }

    async fn put_product(&self, product: Product) -> Result<(), StoreError> {
        settled(write!(self, |c| rows::upsert_product(&c, &product)))
    }

    async fn credit(
        &self,
        credit: NewCredit,
    ) -> Result<Result<Vec<u8>, CreditRefusal>, StoreError> {
        settled(write!(self, |c| accounts::credit(&mut c, &credit)))
    }

    async fn product(&self, id: String) -> Result<Option<Product>, StoreError> {
        settled(retried!(self, |c| reads::product(&c, &id)))
    }

    async fn active_products_page(
        &self,
        after: Option<String>,
        limit: usize,
    ) -> Result<Page<Product>, StoreError> {
        settled(retried!(self, |c| reads::active_products_page(
            &c,
            after.clone(),
            limit
        )))
    }

    async fn replay_lookup(
        &self,
        account: AccountId,
        key: IdempotencyKey,
    ) -> Result<Option<KeyRecord>, StoreError> {
        if let Some(row) = self.cache.key_row(&account, &key) {
            return Ok(Some(row));
        }
        let row = settled(retried!(self, |c| reads::replay_lookup(&c, &account, &key)))?;
        if let Some(row) = &row {
            self.cache.remember_key_row(&account, &key, row);
        }
        Ok(row)
    }

    async fn place_order(
        &self,
        order: NewOrder,
    ) -> Result<Result<Vec<u8>, OrderRefusal>, StoreError> {
        let started = Instant::now();
        match self.committed(started, self.orders.place(order).await) {
            // The balance kept changing under every try: the partner retries with the key.
            Err(fault) if fault.retryable() => Ok(Err(OrderRefusal::ConcurrentModification)),
            outcome => settled(outcome),
        }
    }

    async fn cancel_order(
        &self,
        cancel: CancelRequest,
    ) -> Result<Result<Vec<u8>, CancelRefusal>, StoreError> {
        settled(write!(self, |c| lifecycle::change_order(&mut c, &cancel)))
    }

    async fn refund_order(
        &self,
        refund: RefundRequest,
    ) -> Result<Result<Vec<u8>, RefundRefusal>, StoreError> {
        settled(write!(self, |c| lifecycle::change_order(&mut c, &refund)))
    }

    async fn record_provider_payment(
        &self,
        payment: ProviderCredit,
    ) -> Result<Result<Recorded, ProviderRefusal>, StoreError> {
        settled(write!(self, |c| accounts::record_provider_payment(
            &mut c, &payment
        )))
    }

    async fn order(&self, id: OrderId) -> Result<Option<Order>, StoreError> {
        settled(retried!(self, |c| reads::order(&c, &id)))
    }

    async fn orders_page(
        &self,
        account: AccountId,
        external_order_id: Option<String>,
        before: Option<OrderId>,
        limit: usize,
    ) -> Result<Page<Order>, StoreError> {
        settled(retried!(self, |c| reads::orders_page(
            &c,
            &account,
            external_order_id.clone(),
            before,
            limit
        )))
    }

    async fn ledger_page(
        &self,
        account: AccountId,
        before: Option<Id>,
        limit: usize,
    ) -> Result<Page<LedgerEntry>, StoreError> {
        settled(retried!(self, |c| reads::ledger_page(
            &c, &account, before, limit
        )))
    }

    async fn rotate_webhook_secret(
        &self,
        account: AccountId,
        secret: String,
        now: Millis,
        overlap: Duration,
    ) -> Result<Option<PreviousSecret>, StoreError> {
        let rotated = settled(write!(self, |c| webhook_ops::rotate_webhook_secret(
            &mut c, &account, &secret, now, overlap
        )))?;
        let Some((previous, version)) = rotated else {
            return Ok(None);
        };
        self.acknowledged(version).await?;
        Ok(Some(previous))
    }

    async fn redeliver(
        &self,
        event: Id,
        owner: Option<AccountId>,
        now: Millis,
    ) -> Result<Redelivered, StoreError> {
        settled(write!(self, |c| webhook_ops::redeliver(
            &mut c, &event, owner, now
        )))
    }

    async fn recover_deliveries(
        &self,
        account: AccountId,
        since: Millis,
        now: Millis,
    ) -> Result<u64, StoreError> {
        settled(write!(self, |c| webhook_ops::recover(
            &mut c, &account, since, now
        )))
    }

    async fn delivery_logs(
        &self,
        _account: AccountId,
        event_ids: Vec<String>,
    ) -> Result<Vec<Option<DeliveryLog>>, StoreError> {
        settled(retried!(self, |c| reads::delivery_logs(&c, &event_ids)))
    }

    async fn accounts_page(
        &self,
        after: Option<AccountId>,
        limit: usize,
    ) -> Result<Page<(Account, Cents)>, StoreError> {
        settled(retried!(self, |c| reads::accounts_page(&c, after, limit)))
    }

    async fn events_page(
        &self,
        account: AccountId,
        after: Option<Id>,
        limit: usize,
    ) -> Result<Page<Event>, StoreError> {
        settled(retried!(self, |c| reads::events_page(
            &c, &account, after, limit
        )))
    }

    async fn complete_due_orders(
        &self,
        created_by: Millis,
        max: usize,
    ) -> Result<usize, StoreError> {
        settled(write!(self, |c| lifecycle::complete_due_orders(
            &mut c, created_by, max
        )))
    }

    async fn due_deliveries(
        &self,
        now: Millis,
        max: usize,
        take: DeliveryFilter,
    ) -> Result<Vec<DueDelivery>, StoreError> {
        // The filter is used up by one pass: no retry.
        let client = self.client().await?;
        settled(outbox::due_deliveries(&client, &self.instance, now, max, take).await)
    }

    async fn settle_delivery(
        &self,
        due: DueDelivery,
        outcome: DeliveryOutcome,
        attempt: DeliveryAttempt,
    ) -> Result<(), StoreError> {
        settled(write!(self, |c| outbox::settle_delivery(
            &mut c,
            &self.instance,
            &due,
            outcome,
            &attempt
        )))
    }

    async fn sweep_expired_keys(&self, now: Millis, max: usize) -> Result<usize, StoreError> {
        settled(write!(self, |c| outbox::sweep_expired_keys(&c, now, max)))
    }

    async fn snapshot(&self) -> Result<Snapshot, StoreError> {
        let client = settled(self.client().await)?;
        let (producer, snapshot) = Snapshot::channel();
        tokio::spawn(backup::stream(client, producer));
        Ok(snapshot)
    }

    async fn restore(&self, records: Vec<Record>) -> Result<RestoreCounts, StoreError> {
        settled(write!(self, |c| backup::restore(&mut c, &records)))
    }

    fn shared_rate_limit(&self) -> Option<Arc<dyn SharedRateLimit>> {
        Some(Arc::clone(&self.limiter) as Arc<dyn SharedRateLimit>)
    }

    async fn is_empty(&self) -> Result<bool, StoreError> {
        settled(retried!(self, |c| reads::is_empty(&c)))
    }

    async fn row_counts(&self) -> Result<Vec<(&'static str, u64)>, StoreError> {
        settled(retried!(self, |c| reads::row_counts(&c)))
    }

    async fn probe(&self) -> Result<(), StoreError> {
        let answered = tokio::time::timeout(PROBE_TIMEOUT, async {
            let client = self.client().await?;
            tx::execute(&client, "SELECT 1", &[]).await
        })
        .await;
        match answered {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(fault)) => Err(fault.into()),
            Err(_) => Err(StoreError::Failed(
                "the database did not answer in time".into(),
            )),
        }
    }

    async fn failure(&self) -> String {
        // A database error fails one request, never the process.
        std::future::pending().await
    }

    async fn stop(&self) {
        for task in &self.background {
            task.abort();
        }
        // No copy is served from here on, so the lease can go: changes stop waiting for it.
        self.cache.give_up();
        if let Ok(client) = self.client().await {
            if let Err(e) = shared_cache::release(&client, &self.instance).await {
                log::warn!("releasing the cache lease: {}", StoreError::from(e));
            }
        }
        // The workers have stopped, so nothing this instance claimed is in flight any more:
        // hand the claims back at once rather than let another instance wait out the lease
        // (a rolling restart would otherwise delay those callbacks by up to the lease).
        if let Ok(client) = self.client().await {
            if let Err(e) = outbox::release_claims(&client, &self.instance).await {
                log::warn!(
                    "webhooks: releasing this instance's claims: {}",
                    StoreError::from(e)
                );
            }
        }
        self.pool.close();
    }
}
