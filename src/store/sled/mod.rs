//! The embedded engine: sled, one tree per keyspace, every write on one writer thread and
//! made durable by a group commit, every read held back until what it saw is on disk.
//!
//! Only `open` (and its `Options`) leave this module: the rest of orderly sees the port. The
//! flush hook's types also leave the crate, for the tests that stall or fail the flush.
//!
//! The patched sled itself is tested by its own crate, vendor/sled-suites (upstream's suites
//! and ours); the tests here are of orderly's use of it.

mod accounts;
mod backup;
mod catalog;
mod chain_upgrade;
mod chained;
mod changes;
mod codec;
mod compression;
mod events;
mod files;
mod idempotency;
mod keys;
mod ledger;
mod lifecycle;
mod orders;
mod providers;
mod readers;
#[cfg(test)]
mod reopen;
mod spooled;
mod trees;
mod tx;
mod upgrade;
mod visibility;
mod webhook_ops;
mod writer;

use std::collections::HashSet;
use std::fs::File;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;

use super::records::{verify_counts, Tally};
use crate::bounds::{
    Deadline, MAX_READS_IN_FLIGHT, PROBE_TIMEOUT, READ_THREADS, WRITES_FLOWING_WITHIN,
};
use crate::domain::account::{Account, ApiKeyRecord};
use crate::domain::chain::Funds;
use crate::domain::event::{DeliveryAttempt, DeliveryLog, Event};
use crate::domain::idempotency_key::IdempotencyKey;
use crate::domain::ids::{AccountId, Id, OrderId};
use crate::domain::ledger::LedgerEntry;
use crate::domain::money::Cents;
use crate::domain::order::Order;
use crate::domain::product::Product;
use crate::domain::time::{now_millis, Millis};
use crate::domain::webhook_secret::PreviousSecret;
use crate::metrics::Metrics;
use crate::store::admission::InFlight;
use crate::store::cache::Cache;
use crate::store::writes::OrderChange;
use crate::store::{
    CancelRefusal, CancelRequest, CreditRefusal, DeliveryFilter, DeliveryOutcome, DueDelivery,
    KeyRecord, NewCredit, NewOrder, OrderRefusal, Page, Prefetched, Progress, ProviderCredit,
    ProviderRefusal, Record, Recorded, Redelivered, RefundRefusal, RefundRequest, RestoreCounts,
    Snapshot, Stopped, Store, StoreError,
};
use events::Due;
use readers::Readers;
use trees::Trees;
use visibility::{Stripe, Visibility};
use writer::{Writer, WriterParts};

/// API keys kept per generation of the cache (deployments have a few hundred keys).
const AUTH_CACHE_HALF: usize = 5_000;
/// Key rows kept per generation (a row is its stored answer, about half a kilobyte).
const REPLAY_CACHE_HALF: usize = 8_192;

/// Called at each step of every group flush; an error fails that flush. Tests use it to
/// slow the durability step down, to make it fail or to count it; the shipped binary has none.
pub type FlushHook = Box<dyn Fn(FlushStep) -> std::io::Result<()> + Send + Sync>;

/// Where a group commit is when the flush hook is called: before it starts (a hook that
/// stalls here holds the commit), after sled's flush and after the `fdatasync`. An error at
/// any step is that commit's failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlushStep {
    /// Before the flush starts.
    Flushing,
    /// After sled's flush.
    Flushed,
    /// After the `fdatasync` of the data file.
    Synced,
}

pub(crate) struct Options {
    pub(crate) path: PathBuf,
    /// Bound on sled's page cache (its default of 1 GiB makes memory unpredictable).
    pub(crate) cache_bytes: u64,
    /// `--max-pending-writes`: writes queued for the writer or waiting for their flush.
    pub(crate) max_pending_writes: usize,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) flush_hook: Option<FlushHook>,
    /// Called on a backup's walk thread before it walks, after the backup's instant: tests
    /// hold a backup in flight with it while writes go on. The shipped binary has none.
    pub(crate) before_walk: Option<Arc<dyn Fn() + Send + Sync>>,
}

/// Opens (or creates) the database at `options.path` and starts its writer.
pub(crate) fn open(options: Options) -> Result<Arc<dyn Store>, StoreError> {
    if files::inspect(&options.path)? == files::Found::Unmarked {
        adopt_unmarked(&options.path)?;
    }
    let trees = Trees::open(&options.path, options.cache_bytes)?;
    upgrade::check_layout(&trees)?;
    upgrade::merge_split_key_rows(&trees, &options.path)?;
    chain_upgrade::chain_unchained(&trees, &options.path)?;
    // Ids and times never go back past what the store holds, whatever the clock says now.
    crate::domain::time::never_before(trees.newest_time()?);
    let known_keys = trees.api_key_hashes()?;
    let trees = Arc::new(trees);
    let data_file = File::open(options.path.join("db"))
        .map_err(|e| StoreError::Failed(format!("opening the data file: {e}")))?;
    let readers = Readers::new(READ_THREADS, MAX_READS_IN_FLIGHT)
        .map_err(|e| StoreError::Failed(format!("starting the reading threads: {e}")))?;
    let visibility = Arc::new(Visibility::default());
    let commits = Arc::new(InFlight::default());
    let writer = Writer::start(
        Arc::clone(&trees),
        WriterParts {
            data_file,
            metrics: options.metrics,
            visibility: Arc::clone(&visibility),
            hook: options.flush_hook,
            commits: Arc::clone(&commits),
            max_pending: options.max_pending_writes,
        },
    );
    // Beside the data directory, on its filesystem: a backup's spool is as large as the data.
    let spool_dir = match options.path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok(Arc::new(SledStore {
        spool_dir,
        trees,
        writer: Arc::new(writer),
        visibility,
        commits,
        readers,
        auth_cache: Arc::new(Cache::new(AUTH_CACHE_HALF)),
        replay_cache: Arc::new(Cache::new(REPLAY_CACHE_HALF)),
        known_keys: Arc::new(RwLock::new(known_keys)),
        before_walk: options.before_walk,
    }))
}

/// A store with pages and no layout file: from an orderly before the file (its `meta` has no
/// word of one), which gets its file now; or one that lost it, refused untouched. `meta` is
/// read from a scratch copy (`files::read_from_a_copy`): sled's recovery writes.
fn adopt_unmarked(path: &std::path::Path) -> Result<(), StoreError> {
    let (layout, had_the_file) = files::read_from_a_copy(path, |scratch| {
        let trees = Trees::open(scratch, SCRATCH_CACHE_BYTES)?;
        let layout = upgrade::stored_layout(&trees)?;
        Ok((layout, upgrade::kept_layout_file(&trees)?))
    })?;
    if let Some(layout) = layout {
        files::too_new(layout)?;
    }
    if had_the_file {
        return Err(files::refused(
            files::LAYOUT_FILE,
            "is missing (the store's layout mark, which this store had)",
        ));
    }
    files::write_mark(path)
}

/// The fuzzers' entry to the store's own files (`crate::fuzzing`), read as an open reads them.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn fuzz_store_files(conf: &[u8], layout: &[u8], snapshot: &[u8]) {
    files::fuzz(conf, layout, snapshot)
}

/// sled's page cache while a scratch copy's `meta` is read: one tree, a few pages.
const SCRATCH_CACHE_BYTES: u64 = 1 << 20;

/// Records a restore writes between two of sled's flushes.
const RESTORE_FLUSH_EVERY: u64 = 50_000;

struct SledStore {
    trees: Arc<Trees>,
    /// Where a backup spools its cut.
    spool_dir: PathBuf,
    /// Shared with a backup in progress, whose cut is a writer job.
    writer: Arc<Writer>,
    visibility: Arc<Visibility>,
    /// The batch the writer applies and the flush in progress (`/readyz`).
    commits: Arc<InFlight>,
    /// The threads reads run on, and their places (`READ_THREADS`, `MAX_READS_IN_FLIGHT`).
    readers: Readers,
    /// API keys already authenticated: a hit saves two point reads, their decoding and the
    /// wait on the profile stripe. A write of accounts or keys runs inside its `around`, so
    /// a revoked key is refused from the moment its write is applied.
    auth_cache: Arc<Cache<[u8; 32], (ApiKeyRecord, Account)>>,
    /// Key rows already read (a replay is the hottest read there is); only a sweep or a
    /// restore deletes one, and each runs inside its `around`.
    replay_cache: Arc<Cache<Vec<u8>, Arc<KeyRecord>>>,
    /// The hash of every API key the trees hold or a write is adding, revoked ones too (a
    /// hash goes in before its write, and never out): a hash not here is in no tree and in
    /// no write in flight, so its 401 needs no read and no wait (`authenticate`). It grows
    /// only with the keys created, about 75 bytes each at most.
    known_keys: Arc<RwLock<HashSet<[u8; 32]>>>,
    /// `Options::before_walk`.
    before_walk: Option<Arc<dyn Fn() + Send + Sync>>,
}

impl SledStore {
    /// A read, off the async executor and answered by `deadline`: refused once storage
    /// failed, a storage error recorded as the failure. Never on a request's thread: while a
    /// flush waits on a disk that stopped answering, sled's own lock (which its flush holds
    /// shared, and the writer's next transaction waits for) can hold a read, and a read left
    /// waiting there would hold every request of its thread with it. It runs on the store's
    /// few reading threads (`Readers`), and one more than `MAX_READS_IN_FLIGHT` running or
    /// waiting for them is refused at once (`Overloaded`).
    async fn read<T: Send + 'static>(
        &self,
        deadline: Deadline,
        read: impl FnOnce(&Trees) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.visibility.failed()?;
        let trees = Arc::clone(&self.trees);
        let outcome = self.readers.run(deadline, move || read(&trees)).await;
        if let Err(StoreError::Failed(why)) = &outcome {
            self.visibility.fail(why);
        }
        outcome
    }

    /// A cancel or a refund, on the writer, striped by its account and its key.
    async fn change_order<C>(
        &self,
        deadline: Deadline,
        request: C,
    ) -> Result<Result<Vec<u8>, C::Refusal>, StoreError>
    where
        C: OrderChange + Send + 'static,
        C::Refusal: Send + 'static,
    {
        self.writer
            .write(deadline, move |b| {
                let account = request.account();
                b.touches(Stripe::account(&account));
                if let Some(claim) = request.claim() {
                    b.touches(Stripe::key(&account, &claim.key));
                }
                b.trees.change_order(&request, now_millis())
            })
            .await
    }

    /// Returns what a read saw once it is durable, or `TimedOut` when the flush it waits for
    /// has not finished by `deadline`.
    async fn settled<T>(
        &self,
        deadline: Deadline,
        value: T,
        stripe: Stripe,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout_at(deadline.instant().into(), self.visibility.settled(stripe))
            .await
        {
            Ok(settled) => settled.map(|()| value),
            Err(_) => Err(StoreError::TimedOut(
                "what the read saw was not yet durable by the deadline".into(),
            )),
        }
    }
}

#[async_trait]
impl Store for SledStore {
    async fn authenticate(
        &self,
        deadline: Deadline,
        key_hash: [u8; 32],
    ) -> Result<Option<(ApiKeyRecord, Account)>, StoreError> {
        self.visibility.failed()?;
        if let Some(hit) = self.auth_cache.get(&key_hash) {
            return Ok(Some(hit));
        }
        if !self
            .known_keys
            .read()
            .expect("the known keys")
            .contains(&key_hash)
        {
            return Ok(None);
        }
        let generation = self.auth_cache.generation();
        let Some(found) = self
            .read(deadline, move |t| t.authenticate(&key_hash))
            .await?
        else {
            return self
                .settled(deadline, None, Stripe::credential(&key_hash))
                .await;
        };
        let stripe = Stripe::profile(&found.1.id);
        let found = self.settled(deadline, found, stripe).await?;
        self.auth_cache
            .remember(generation, key_hash, found.clone());
        Ok(Some(found))
    }

    /// What a keyed write needs looked up before its first use: its row when memory has it
    /// (durable, as everything the replay cache holds); nothing, when a lookup could only
    /// find a durable row the first use finds too: no write of the key waits for its
    /// flush (whose row a retry must wait for, up to the in-progress 409, and never queue
    /// behind), and the writer's commits complete (a retry of a durable key replays at once
    /// rather than waiting behind a slow flush). The lookup's hand-off to a reading thread
    /// and back is then saved on every new key.
    fn prefetch_without_reading(&self, account: &AccountId, key: IdempotencyKey) -> Prefetched {
        let scoped = keys::scoped_key(&account.bytes(), &key);
        if let Some(hit) = self.replay_cache.get(&scoped) {
            let row = Some(KeyRecord::clone(&hit));
            return Prefetched::Read { key, row };
        }
        let flowing = self
            .commits
            .oldest()
            .is_none_or(|age| age < WRITES_FLOWING_WITHIN);
        if flowing && !self.visibility.pending(Stripe::key(account, &key)) {
            Prefetched::LeftToFirstUse { key }
        } else {
            Prefetched::NotRead
        }
    }

    async fn account(
        &self,
        deadline: Deadline,
        id: AccountId,
    ) -> Result<Option<Account>, StoreError> {
        let account = self.read(deadline, move |t| t.account(&id)).await?;
        self.settled(deadline, account, Stripe::profile(&id)).await
    }

    async fn balance(&self, deadline: Deadline, id: AccountId) -> Result<Funds, StoreError> {
        let funds = self.read(deadline, move |t| t.funds(&id)).await?;
        self.settled(deadline, funds, Stripe::account(&id)).await
    }

    async fn create_account(&self, deadline: Deadline, account: Account) -> Result<(), StoreError> {
        let cache = Arc::clone(&self.auth_cache);
        self.writer
            .write(deadline, move |b| {
                b.touches(Stripe::profile(&account.id));
                cache.around(|| b.trees.create_account(&account))
            })
            .await
    }

    async fn create_api_key(
        &self,
        deadline: Deadline,
        key_hash: [u8; 32],
        record: ApiKeyRecord,
    ) -> Result<(), StoreError> {
        let cache = Arc::clone(&self.auth_cache);
        // Known before it is written: a request with it is then looked up (and waits for
        // the write like any other read), never refused for being unknown.
        self.known_keys
            .write()
            .expect("the known keys")
            .insert(key_hash);
        self.writer
            .write(deadline, move |b| {
                b.touches(Stripe::profile(&record.account_id));
                cache.around(|| b.trees.create_api_key(&key_hash, &record))
            })
            .await
    }

    async fn revoke_api_key(&self, deadline: Deadline, key_id: Id) -> Result<bool, StoreError> {
        let cache = Arc::clone(&self.auth_cache);
        self.writer
            .write(deadline, move |b| {
                let Some((hash, record)) = b.trees.api_key_by_id(&key_id)? else {
                    return Ok(false);
                };
                b.touches(Stripe::profile(&record.account_id));
                b.touches(Stripe::credential(&hash));
                cache.around(|| b.trees.revoke_api_key(&hash))?;
                Ok(true)
            })
            .await
    }

    async fn put_product(&self, deadline: Deadline, product: Product) -> Result<(), StoreError> {
        self.writer
            .write(deadline, move |b| {
                b.touches(Stripe::Catalog);
                b.trees.put_product(&product)
            })
            .await
    }

    async fn credit(
        &self,
        deadline: Deadline,
        credit: NewCredit,
    ) -> Result<Result<Vec<u8>, CreditRefusal>, StoreError> {
        self.writer
            .write(deadline, move |b| {
                let account = credit.account.id;
                b.touches(Stripe::account(&account));
                if let Some(claim) = &credit.claim {
                    b.touches(Stripe::key(&account, &claim.key));
                }
                b.trees.credit(&credit, now_millis())
            })
            .await
    }

    async fn product(&self, deadline: Deadline, id: String) -> Result<Option<Product>, StoreError> {
        let product = self.read(deadline, move |t| t.product(&id)).await?;
        self.settled(deadline, product, Stripe::Catalog).await
    }

    async fn active_products_page(
        &self,
        deadline: Deadline,
        after: Option<String>,
        limit: usize,
    ) -> Result<Page<Product>, StoreError> {
        let page = self
            .read(deadline, move |t| {
                t.active_products_page(after.as_deref(), limit)
            })
            .await?;
        self.settled(deadline, page, Stripe::Catalog).await
    }

    async fn replay_lookup(
        &self,
        deadline: Deadline,
        account: AccountId,
        key: IdempotencyKey,
    ) -> Result<Option<KeyRecord>, StoreError> {
        self.visibility.failed()?;
        let scoped = keys::scoped_key(&account.bytes(), &key);
        if let Some(hit) = self.replay_cache.get(&scoped) {
            return Ok(Some(KeyRecord::clone(&hit)));
        }
        let generation = self.replay_cache.generation();
        let looked_up = key.clone();
        let Some(row) = self
            .read(deadline, move |t| t.replay_lookup(&account, &looked_up))
            .await?
        else {
            // No answer rests on this: a key not found goes on to its first use, a write
            // whose answer waits for its own flush (and for a sweep's delete before it).
            return Ok(None);
        };
        // Found in memory, perhaps not yet on disk: a first use whose flush has not come by
        // the deadline is in flight, its outcome unknown.
        let row = match self
            .settled(deadline, row, Stripe::key(&account, &key))
            .await
        {
            Err(StoreError::TimedOut(_)) => {
                return Err(StoreError::InDoubt(
                    "the key's first use is not yet durable".into(),
                ))
            }
            settled => settled?,
        };
        self.replay_cache
            .remember(generation, scoped, Arc::new(row.clone()));
        Ok(Some(row))
    }

    async fn place_order(
        &self,
        deadline: Deadline,
        order: NewOrder,
    ) -> Result<Result<Vec<u8>, OrderRefusal>, StoreError> {
        // A taken key's row, answered after its batch's flush, is durable: remembered as a
        // read's would be (unless a sweep or a restore began since), so the next retry of
        // the key replays from memory.
        let generation = self.replay_cache.generation();
        let scoped = keys::scoped_key(&order.account.id.bytes(), &order.claim.key);
        let placed = self.writer.place_order(deadline, order).await?;
        if let Err(OrderRefusal::KeyTaken(Some(row))) = &placed {
            self.replay_cache
                .remember(generation, scoped, Arc::new(KeyRecord::clone(row)));
        }
        Ok(placed)
    }

    async fn cancel_order(
        &self,
        deadline: Deadline,
        cancel: CancelRequest,
    ) -> Result<Result<Vec<u8>, CancelRefusal>, StoreError> {
        self.change_order(deadline, cancel).await
    }

    async fn refund_order(
        &self,
        deadline: Deadline,
        refund: RefundRequest,
    ) -> Result<Result<Vec<u8>, RefundRefusal>, StoreError> {
        self.change_order(deadline, refund).await
    }

    async fn record_provider_payment(
        &self,
        deadline: Deadline,
        payment: ProviderCredit,
    ) -> Result<Result<Recorded, ProviderRefusal>, StoreError> {
        self.writer
            .write(deadline, move |b| {
                b.touches(Stripe::account(&payment.account));
                b.trees.record_provider_payment(&payment, now_millis())
            })
            .await
    }

    async fn order(&self, deadline: Deadline, id: OrderId) -> Result<Option<Order>, StoreError> {
        match self.read(deadline, move |t| t.order(&id)).await? {
            Some(order) => {
                let stripe = Stripe::account(&order.account_id);
                self.settled(deadline, Some(order), stripe).await
            }
            // No write removes an order, and one whose placing is in flight has not been
            // answered, so nobody holds its id yet: this 404 cannot be taken back.
            None => Ok(None),
        }
    }

    async fn orders_page(
        &self,
        deadline: Deadline,
        account: AccountId,
        external_order_id: Option<String>,
        before: Option<OrderId>,
        limit: usize,
    ) -> Result<Page<Order>, StoreError> {
        let page = self
            .read(deadline, move |t| {
                t.orders_page(&account, external_order_id.as_deref(), before, limit)
            })
            .await?;
        self.settled(deadline, page, Stripe::account(&account))
            .await
    }

    async fn ledger_page(
        &self,
        deadline: Deadline,
        account: AccountId,
        before: Option<Id>,
        limit: usize,
    ) -> Result<Page<LedgerEntry>, StoreError> {
        let page = self
            .read(deadline, move |t| t.ledger_page(&account, before, limit))
            .await?;
        self.settled(deadline, page, Stripe::account(&account))
            .await
    }

    async fn ledger_after(
        &self,
        deadline: Deadline,
        account: AccountId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<LedgerEntry>, StoreError> {
        let entries = self
            .read(deadline, move |t| t.ledger_after(&account, after, limit))
            .await?;
        self.settled(deadline, entries, Stripe::account(&account))
            .await
    }

    async fn events_page(
        &self,
        deadline: Deadline,
        account: AccountId,
        after: Option<Id>,
        limit: usize,
    ) -> Result<Page<Event>, StoreError> {
        let page = self
            .read(deadline, move |t| t.events_page(&account, after, limit))
            .await?;
        self.settled(deadline, page, Stripe::account(&account))
            .await
    }

    async fn complete_due_orders(
        &self,
        deadline: Deadline,
        created_by: Millis,
        max: usize,
    ) -> Result<usize, StoreError> {
        // Looked at first, so that an idle queue costs no write (and no flush).
        let due = self.read(deadline, move |t| t.due_orders(created_by, 1));
        if due.await?.is_empty() {
            return Ok(0);
        }
        self.writer
            .write(deadline, move |b| {
                let due = b.trees.due_orders(created_by, max)?;
                for order in &due {
                    b.touches(Stripe::account(&order.account));
                }
                b.trees.complete_orders(&due, now_millis())
            })
            .await
    }

    async fn due_deliveries(
        &self,
        deadline: Deadline,
        now: Millis,
        max: usize,
        take: DeliveryFilter,
    ) -> Result<Vec<DueDelivery>, StoreError> {
        let due = self
            .read(deadline, move |t| t.due_deliveries(now, max, take))
            .await?;
        // Any outbox entry may come from a batch still being flushed.
        let due = self.settled(deadline, due, Stripe::Everything).await?;
        let mut ready = Vec::with_capacity(due.len());
        let mut orphans = Vec::new();
        for entry in due {
            match entry {
                Due::Ready(delivery) => ready.push(*delivery),
                Due::Orphan(key) => orphans.push(key),
            }
        }
        if !orphans.is_empty() {
            self.writer
                .write(deadline, move |b| {
                    orphans
                        .iter()
                        .try_for_each(|key| b.trees.remove_outbox_entry(key))
                })
                .await?;
        }
        Ok(ready)
    }

    async fn hold_for_attempt(
        &self,
        _deadline: Deadline,
        _due: &DueDelivery,
        _lasting: std::time::Duration,
    ) -> Result<bool, StoreError> {
        // One process is the only sender, and its worker never takes an event already in
        // flight: the delivery stays this one's until it is settled.
        Ok(true)
    }

    async fn settle_delivery(
        &self,
        deadline: Deadline,
        due: DueDelivery,
        outcome: DeliveryOutcome,
        attempt: DeliveryAttempt,
    ) -> Result<(), StoreError> {
        self.writer
            .write(deadline, move |b| {
                // The log is shown by the console with the account's events.
                b.touches(Stripe::account(&due.delivery.account_id));
                b.trees.settle_delivery(&due, outcome, &attempt)
            })
            .await
    }

    async fn rotate_webhook_secret(
        &self,
        deadline: Deadline,
        account: AccountId,
        secret: String,
        now: Millis,
        overlap: std::time::Duration,
    ) -> Result<Option<PreviousSecret>, StoreError> {
        let cache = Arc::clone(&self.auth_cache);
        self.writer
            .write(deadline, move |b| {
                b.touches(Stripe::profile(&account));
                cache.around(|| {
                    b.trees
                        .rotate_webhook_secret(&account, secret, now, overlap)
                })
            })
            .await
    }

    async fn redeliver(
        &self,
        deadline: Deadline,
        event: Id,
        owner: Option<AccountId>,
        now: Millis,
    ) -> Result<Redelivered, StoreError> {
        self.writer
            .write(deadline, move |b| {
                let Some(found) = b.trees.event_by_id(&event, owner)? else {
                    // Nothing is written: the not-found rests on what is durable once the
                    // batch it rode in is (every earlier write of the event was before it).
                    return Ok(Redelivered::NotFound);
                };
                b.touches(Stripe::account(&found.account_id));
                b.trees.redeliver(&found, now)
            })
            .await
    }

    async fn recover_deliveries(
        &self,
        deadline: Deadline,
        account: AccountId,
        since: Millis,
        now: Millis,
    ) -> Result<u64, StoreError> {
        // The scan runs off the writer; the writer then looks at each event again.
        let events = self
            .read(deadline, move |t| t.given_up_since(&account, since))
            .await?;
        if events.is_empty() {
            return self.settled(deadline, 0, Stripe::account(&account)).await;
        }
        self.writer
            .write(deadline, move |b| {
                b.touches(Stripe::account(&account));
                b.trees.recover(&events, since, now)
            })
            .await
    }

    async fn delivery_logs(
        &self,
        deadline: Deadline,
        account: AccountId,
        event_ids: Vec<String>,
    ) -> Result<Vec<Option<DeliveryLog>>, StoreError> {
        let logs = self
            .read(deadline, move |t| t.delivery_logs(&event_ids))
            .await?;
        self.settled(deadline, logs, Stripe::account(&account))
            .await
    }

    async fn accounts_page(
        &self,
        deadline: Deadline,
        after: Option<AccountId>,
        limit: usize,
    ) -> Result<Page<(Account, Cents)>, StoreError> {
        let page = self
            .read(deadline, move |t| t.accounts_page(after, limit))
            .await?;
        // A page of many accounts: wait for every batch started, not one stripe.
        self.settled(deadline, page, Stripe::Everything).await
    }

    async fn sweep_expired_keys(
        &self,
        deadline: Deadline,
        now: Millis,
        max: usize,
    ) -> Result<usize, StoreError> {
        if !self.read(deadline, move |t| t.any_key_expired(now)).await? {
            return Ok(0);
        }
        // A deleted row only frees its key: nothing a read could report, so no stripe.
        let cache = Arc::clone(&self.replay_cache);
        self.writer
            .write(deadline, move |b| {
                cache.around(|| b.trees.sweep_expired_keys(now, max))
            })
            .await
    }

    async fn snapshot(&self, deadline: Deadline) -> Result<Snapshot, StoreError> {
        // The snapshot's instant is one writer job, and writes wait for nothing else. Answered
        // once that job's batch is on disk, so nothing in the snapshot is undurable; its
        // records follow the walk.
        let noted = self
            .writer
            .write(deadline, |b| Ok(b.trees.changes.start()))
            .await?;
        let following = backup::cut::follow(noted, &self.spool_dir)?;
        let (producer, snapshot) = Snapshot::channel();
        let (trees, beside) = (Arc::clone(&self.trees), self.spool_dir.clone());
        let before_walk = self.before_walk.clone();
        crate::background::spawn_idle("orderly-backup-walk", move || {
            if let Some(hook) = before_walk {
                hook();
            }
            let started = std::time::Instant::now();
            let walked = trees
                .spool_walk(&beside)
                .and_then(|spool| Ok((spool, following.finish()?)));
            match walked {
                Ok((spool, cut)) => {
                    log::info!("backup: walked in {:.1?}", started.elapsed());
                    backup::stream_into(spool, cut, producer)
                }
                Err(e) => {
                    producer.blocking_send(Err(e));
                }
            }
        });
        Ok(snapshot)
    }

    async fn restore(
        &self,
        deadline: Deadline,
        mut records: Snapshot,
    ) -> Result<RestoreCounts, StoreError> {
        let cache = Arc::clone(&self.auth_cache);
        let replays = Arc::clone(&self.replay_cache);
        let known_keys = Arc::clone(&self.known_keys);
        // One writer job that takes the records as they come (the writer thread may wait on
        // the stream; nothing else writes into a store being restored).
        self.writer
            .write(deadline, move |b| {
                if !b.trees.holds_nothing() {
                    return Err(StoreError::Refused("the target already holds data".into()));
                }
                let mut tally = Tally::default();
                let mut written = 0u64;
                let write = || -> Result<(), StoreError> {
                    while let Some(record) = records.blocking_next() {
                        let record = record?;
                        tally.add(&record);
                        if let Record::ApiKey { hash, .. } = &record {
                            known_keys.write().expect("the known keys").insert(*hash);
                        }
                        b.trees.write_records(std::slice::from_ref(&record))?;
                        written += 1;
                        // sled evicts only pages its log holds: a flush now and then keeps
                        // the restore within its cache rather than the whole store in memory.
                        if written % RESTORE_FLUSH_EVERY == 0 {
                            b.trees.db.flush()?;
                        }
                    }
                    Ok(())
                };
                replays.around(|| cache.around(write))?;
                let counts = tally.finish()?;
                verify_counts(&counts, b.trees.restored_counts())?;
                Ok(counts)
            })
            .await
    }

    async fn is_empty(&self, deadline: Deadline) -> Result<bool, StoreError> {
        self.read(deadline, |t| Ok(t.is_empty())).await
    }

    async fn row_counts(&self, deadline: Deadline) -> Result<Vec<(&'static str, u64)>, StoreError> {
        self.read(deadline, |t| Ok(t.row_counts())).await
    }

    async fn probe(&self) -> Result<(), StoreError> {
        self.read(Deadline::after(PROBE_TIMEOUT), |t| t.probe())
            .await
    }

    fn progress(&self) -> Progress {
        Progress {
            oldest_commit: self.commits.oldest(),
            oldest_write: self.writer.oldest(),
            pending_writes: self.writer.pending(),
        }
    }

    async fn failure(&self) -> String {
        self.visibility.failure().await
    }

    async fn stop(&self, deadline: Deadline) -> Stopped {
        self.writer.stop(deadline).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::product::Product;

    fn product() -> Product {
        Product {
            id: "prd_t".into(),
            name: "t".into(),
            price: Cents(1),
            regions: vec![],
            delivery_fields: vec![],
            active: true,
            updated_at: 0,
        }
    }

    fn soon() -> Deadline {
        Deadline::after(std::time::Duration::from_secs(30))
    }

    #[tokio::test]
    async fn after_a_failed_flush_the_probe_fails_and_no_write_is_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let fail = Arc::clone(&failing);
        let store = open(Options {
            path: dir.path().join("db"),
            cache_bytes: 1 << 20,
            max_pending_writes: 16,
            metrics: Arc::default(),
            flush_hook: Some(Box::new(move |_| {
                if fail.load(std::sync::atomic::Ordering::SeqCst) {
                    Err(std::io::Error::other("injected: the disk refused"))
                } else {
                    Ok(())
                }
            })),
            before_walk: None,
        })
        .unwrap();
        store.put_product(soon(), product()).await.unwrap();
        store.probe().await.unwrap();

        failing.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(matches!(
            store.put_product(soon(), product()).await,
            Err(StoreError::Failed(_))
        ));
        assert!(
            store.probe().await.is_err(),
            "/readyz must say 503 from now on"
        );
        failing.store(false, std::sync::atomic::Ordering::SeqCst);
        assert!(
            store.put_product(soon(), product()).await.is_err(),
            "no write after the failure"
        );
        assert!(
            store.product(soon(), "prd_t".into()).await.is_err(),
            "no read either"
        );
        assert!(store.failure().await.contains("the disk refused"));
    }
}
