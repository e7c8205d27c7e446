//! Rows that partner requests read on every call, kept in this instance's memory so that a
//! replay costs the database nothing, and exact across every instance on the database: no
//! instance serves a copy that a committed change has made wrong (docs/contract.md "6. Many instances": a key revoked
//! through one instance is 401 on every other at once).
//!
//! - An idempotency key's row never changes once committed; only the sweeper deletes it, and
//!   only after its `expires_at` on the database's clock, which every instance follows
//!   (`clock.rs`). A copy is served until `KEY_ROW_MARGIN` before that instant, then read again
//!   (expired rows still decide until swept, docs/contract.md "2.8 A key lives 24 hours, then is swept", and the database says which are).
//! - An API key and its account change (a revocation, a rotated webhook secret). A copy is
//!   served only while this instance holds a live *lease*, and a change answers only once every
//!   live lease has acknowledged it:
//!   1. the change bumps `auth_cache_version` in its own transaction;
//!   2. every `RENEW` this instance renews its lease for `LEASE` on the database's clock,
//!      acknowledging the version it has purged its copies up to, and reads the current one;
//!      a newer version purges every copy before the renewed lease is used;
//!   3. here the lease ends `LEASE - SAFETY` after the renewal was *sent*, which is before the
//!      database's end of it however far apart the two clocks read (only their rates count);
//!   4. the change then waits (`acknowledged`) until no live lease has acknowledged less.
//!
//!   The renewal reads the version `FOR SHARE`, so it is ordered against every change: a
//!   change that committed first is seen (and purged) by it; a change that comes after waits
//!   for it to commit, and then finds its lease. A lapsed lease needs nothing: copies are not
//!   served without one, and a change made meanwhile is newer than what was purged.
//!
//! A key that cannot authenticate is not a copy: this instance knows every key that can
//! (`known_keys.rs`, caught up by the same renewals before they acknowledge), and refuses one
//! it does not know without a statement while its lease holds. A read that straddles a purge
//! is not remembered (`cache::Cache`).
//!
//! Everything here is a copy of one history of the database, and a database can go back in
//! time under running instances (an asynchronous standby promoted after it missed the newest
//! transactions, a point-in-time restore, the counter set back by hand): the counter then reads
//! below what this instance acknowledged, and a promotion or a restore starts another timeline
//! (`orderly_history_id()`, migration 0009). Each renewal compares both with what it saw
//! before it acknowledges anything; when either went back, it stops serving copies, forgets
//! every one, reloads the known keys, and bumps `History`'s epoch (the delivery claims and
//! the rate limit's loans of the old history are given up by it) before its lease is renewed
//! again. The database holds the rest of the fence:
//! - a renewal's acknowledgement counts only in the history and at the counter it was made
//!   at: a lease that acknowledged more than the counter now reads was made in a history the
//!   database no longer has, and a change waits for it as for one that acknowledged less;
//! - a change answers only once the history it was made in is older than `LEASE`
//!   (`orderly_history.since`, noted by whichever statement sees a new history first): an
//!   instance that renewed its lease just before the old primary died may serve its copies
//!   until its lease ends, and the new primary cannot know of that lease.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;

use super::known_keys::{self, KnownKeys};
use super::tx::{alone, query_opt, Fault, Session};
use crate::bounds::KEYS_LOAD_WITHIN;
use crate::domain::account::{Account, ApiKeyRecord};
use crate::domain::idempotency_key::IdempotencyKey;
use crate::domain::ids::AccountId;
use crate::domain::time::{now_millis, Millis};
use crate::metrics::Metrics;
use crate::store::admission::InFlight;
use crate::store::cache::Cache;
use crate::store::{KeyRecord, StoreError};

/// How long a renewed lease holds on the database's clock.
const LEASE: Duration = Duration::from_secs(2);
/// How much sooner it ends here: covers the two clocks' rates over one lease, many times over.
const SAFETY: Duration = Duration::from_millis(500);
/// How often the lease is renewed (and so how long a change waits for this instance, at most
/// two renewals and a round trip).
const RENEW: Duration = Duration::from_millis(50);
/// How often a change looks again at the leases that have not acknowledged it.
const ACK_POLL: Duration = Duration::from_millis(5);
/// Longest a change waits: a live lease either acknowledges within two renewals or lapses
/// within `LEASE`.
const ACK_WAIT: Duration = Duration::from_secs(5);
/// A key row's copy is dropped this long before its expiry, so that no sweep (on any
/// instance's following of the database's clock) can delete a row still served.
const KEY_ROW_MARGIN: Millis = 1_000;
/// Rows kept per generation (`cache::Cache` holds two). A key row is its stored answer,
/// about half a kilobyte, so the key rows stay under about 20 MB (sled keeps half as many):
/// memory a small deployment can predict, and the keys being retried now fit many times over.
const AUTH_ROWS: usize = 16_384;
const KEY_ROWS: usize = 16_384;
/// Renewals between two prunes of the leases of instances that stopped.
const PRUNE_EVERY: u64 = 200;

/// Where the database is: the newest change, and the history it was made in.
const WHERE_THE_DATABASE_IS: &str = "SELECT version, orderly_history_id() FROM auth_cache_version";

/// Notes a new history if this is the first statement to see it, reads the version under a
/// share lock (see the module's note), renews this instance's lease (unless it was released:
/// the instance stopped) acknowledging `$2` only where the history is `$3` and the counter
/// has not gone below it (else `$4`, nothing), and returns the version and the history.
static RENEWAL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "WITH history AS (SELECT orderly_note_history() AS since),
         changes AS (SELECT version FROM auth_cache_version FOR SHARE),
         lease AS (
             INSERT INTO auth_cache_leases (instance, valid_until, acknowledged)
             SELECT $1, clock_timestamp() + interval '{} milliseconds',
                    CASE WHEN version >= $2 AND orderly_history_id() = $3 THEN $2
                         ELSE $4 END
             FROM changes
             ON CONFLICT (instance) DO UPDATE
                 SET valid_until = excluded.valid_until, acknowledged = excluded.acknowledged
                 WHERE NOT auth_cache_leases.released)
         SELECT version, orderly_history_id() FROM changes, history",
        LEASE.as_millis()
    )
});

/// What a lease that acknowledged nothing records: below any counter, even one set back
/// below zero, so that every change waits for it.
const NOTHING_ACKNOWLEDGED: i64 = i64::MIN;

/// After a change committed: how many live leases have not acknowledged it (or acknowledged
/// a counter the database no longer reads, in a history it no longer has), and whether the
/// history the change was made in is younger than `LEASE`.
static UNACKNOWLEDGED: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT (SELECT count(*) FROM auth_cache_leases
                 WHERE valid_until > clock_timestamp()
                   AND (acknowledged < $1
                        OR acknowledged > (SELECT version FROM auth_cache_version))),
                orderly_note_history() + interval '{} milliseconds' > clock_timestamp()",
        LEASE.as_millis()
    )
});

/// In a change's transaction: the version every live lease must acknowledge.
pub(super) async fn bump(tx: &impl Session) -> Result<i64, Fault> {
    let row = query_opt(
        tx,
        "UPDATE auth_cache_version SET version = version + 1 RETURNING version",
        &[],
    )
    .await?
    .ok_or_else(|| StoreError::Corrupt("auth_cache_version has no row".into()))?;
    Ok(row.get(0))
}

/// After a change committed: waits until no instance can serve a copy from before it.
pub(super) async fn acknowledged(client: &impl Session, version: i64) -> Result<(), Fault> {
    let deadline = Instant::now() + ACK_WAIT;
    loop {
        let row = query_opt(client, &UNACKNOWLEDGED, &[&version])
            .await?
            .expect("a SELECT without FROM returns a row");
        let (waiting, history_young): (i64, bool) = (row.get(0), row.get(1));
        if waiting == 0 && !history_young {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(StoreError::Failed(format!(
                "instances holding copies of API keys did not acknowledge change {version} within {} s",
                ACK_WAIT.as_secs()
            ))
            .into());
        }
        tokio::time::sleep(ACK_POLL).await;
    }
}

/// Ends this instance's lease, once it serves no copy (`SharedCache::give_up`): marked
/// released rather than deleted (and written released if no renewal has committed yet), so
/// that a renewal still in flight cannot bring it back when it commits later (the renewal
/// task is stopped, but a statement it had sent may be waiting for a lock). Pruned with the
/// leases that lapsed.
pub(super) async fn release(client: &impl Session, instance: &str) -> Result<(), Fault> {
    super::tx::execute(
        client,
        "INSERT INTO auth_cache_leases (instance, valid_until, acknowledged, released)
         VALUES ($1, clock_timestamp(), $2, true)
         ON CONFLICT (instance) DO UPDATE
             SET released = true, valid_until = excluded.valid_until",
        &[&instance, &NOTHING_ACKNOWLEDGED],
    )
    .await?;
    Ok(())
}

/// How many times this instance has seen the database go back in time: what it holds from
/// an older epoch (a delivery claim, a loan of the rate limit) belongs to a history the
/// database no longer has.
#[derive(Default)]
pub(super) struct History {
    epoch: AtomicU64,
}

impl History {
    pub(super) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    fn went_back(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }
}

pub(super) struct SharedCache {
    auth: Cache<[u8; 32], (ApiKeyRecord, Account)>,
    key_rows: Cache<(AccountId, IdempotencyKey), Arc<KeyRecord>>,
    /// Nanoseconds after `epoch` until which the lease holds here; 0 before the first one.
    lease_until: AtomicU64,
    epoch: Instant,
    /// The newest change whose copies are purged.
    purged: AtomicI64,
    /// Every key that can authenticate; `None` until loaded (`PgStore::open` loads it before
    /// it serves).
    known: std::sync::RwLock<Option<KnownKeys>>,
    /// The history (`orderly_history_id()`) the copies belong to: the one the known keys were
    /// read in, then each renewal's; `None` before the keys are loaded.
    seen_history: Mutex<Option<String>>,
    /// Shared with what else keeps numbers of the database's history.
    history: Arc<History>,
}

/// A key row may be served until shortly before its expiry.
fn servable(row: &KeyRecord) -> bool {
    now_millis().saturating_add(KEY_ROW_MARGIN) < row.expires_at
}

impl Default for SharedCache {
    fn default() -> Self {
        SharedCache {
            auth: Cache::new(AUTH_ROWS),
            key_rows: Cache::new(KEY_ROWS),
            lease_until: AtomicU64::new(0),
            epoch: Instant::now(),
            purged: AtomicI64::new(0),
            known: std::sync::RwLock::new(None),
            seen_history: Mutex::new(None),
            history: Arc::default(),
        }
    }
}

impl SharedCache {
    fn leased(&self) -> bool {
        let now = self.epoch.elapsed().as_nanos() as u64;
        now < self.lease_until.load(Ordering::Acquire)
    }

    /// The live key with this hash and its account, if a copy may be served.
    pub(super) fn api_key(&self, hash: &[u8; 32]) -> Option<(ApiKeyRecord, Account)> {
        if !self.leased() {
            return None;
        }
        self.auth.get(hash)
    }

    /// True when no key with this hash can authenticate, as this instance knows while its
    /// lease holds: every creation answered so far was acknowledged here, after the key was
    /// added (`known_keys.rs`). False when the key may exist, or when this instance cannot
    /// tell (no lease, nothing loaded, or the keys behind the change the lease was renewed
    /// at): the database is asked then.
    ///
    /// A renewal reads the version twice (first to catch up, then with the lease), and a
    /// creation may commit between the two without waiting for this instance: its first
    /// lease, or one that lapsed, is not live on the database yet. The lease then holds at a
    /// version the known keys have not caught up to, and the key just created and answered
    /// would be refused here; so until the next renewal catches up, the database decides.
    pub(super) fn surely_unknown(&self, hash: &[u8; 32]) -> bool {
        if !self.leased() {
            return false;
        }
        let renewed_at = self.purged.load(Ordering::Acquire);
        let known = self.known.read().expect("the known keys");
        known
            .as_ref()
            .is_some_and(|known| known.synced() >= renewed_at && !known.contains(hash))
    }

    /// The keys known when the store opens, and the history they were read in: a renewal
    /// that finds another one (the database went back between the load and it) starts over.
    pub(super) fn know(&self, keys: KnownKeys) {
        *self.seen_history.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(keys.history().to_string());
        *self.known.write().expect("the known keys") = Some(keys);
    }

    /// How many keys can authenticate, as known here.
    pub(super) fn known_keys(&self) -> usize {
        let known = self.known.read().expect("the known keys");
        known.as_ref().map_or(0, KnownKeys::len)
    }

    /// The newest change the known keys are current to.
    fn known_synced(&self) -> Option<i64> {
        let known = self.known.read().expect("the known keys");
        known.as_ref().map(KnownKeys::synced)
    }

    fn learn(&self, changes: Vec<([u8; 32], bool)>, version: i64) {
        let mut known = self.known.write().expect("the known keys");
        if let Some(known) = known.as_mut() {
            known.apply(changes, version);
        }
    }

    /// Where a read of API keys starts: handed back to `remember_api_key`.
    pub(super) fn auth_generation(&self) -> u64 {
        self.auth.generation()
    }

    /// Keeps a live key read since `generation`, unless a change was purged meanwhile.
    pub(super) fn remember_api_key(
        &self,
        generation: u64,
        hash: [u8; 32],
        found: (ApiKeyRecord, Account),
    ) {
        if self.leased() {
            self.auth.remember(generation, hash, found);
        }
    }

    /// The committed row of a key in its account, if a copy may be served: while the lease
    /// holds, which it stops doing when the database goes back in time (the row may be gone
    /// from the history the database is on now). The caller lends the pair it looks up by
    /// rather than the cache copying the key to make one: replays come here first, every one.
    pub(super) fn key_row(&self, scoped: &(AccountId, IdempotencyKey)) -> Option<KeyRecord> {
        if !self.leased() {
            return None;
        }
        let row = self.key_rows.get(scoped)?;
        servable(&row).then(|| KeyRecord::clone(&row))
    }

    /// Keeps a committed key row (rows never change; only the sweeper deletes them).
    pub(super) fn remember_key_row(
        &self,
        account: &AccountId,
        key: &IdempotencyKey,
        row: &KeyRecord,
    ) {
        if servable(row) {
            let generation = self.key_rows.generation();
            self.key_rows
                .remember(generation, (*account, key.clone()), Arc::new(row.clone()));
        }
    }

    /// Serves no copy from now on (the instance stops).
    pub(super) fn give_up(&self) {
        self.lease_until.store(0, Ordering::Release);
    }

    /// The epochs of the database's history as this instance saw them.
    pub(super) fn history(&self) -> Arc<History> {
        Arc::clone(&self.history)
    }

    /// True when the database read `version` in `history` is not the one the copies came
    /// from: another timeline or system, or a counter below what was purged or caught up on.
    fn another_history(&self, version: i64, history: &str) -> bool {
        let seen = self.seen_history.lock().unwrap_or_else(|e| e.into_inner());
        let timeline_changed = seen.as_deref().is_some_and(|seen| seen != history);
        let newest_seen = self
            .purged
            .load(Ordering::Acquire)
            .max(self.known_synced().unwrap_or(0));
        timeline_changed || version < newest_seen
    }

    /// The history the copies belong to from now on (the first renewal's, or the new one's).
    fn adopt_history(&self, history: &str) {
        let mut seen = self.seen_history.lock().unwrap_or_else(|e| e.into_inner());
        if seen.as_deref() != Some(history) {
            *seen = Some(history.to_string());
        }
    }

    /// The database went back in time: serve nothing from memory until a renewal in the
    /// history it is on now, and forget every copy (their rows may be gone, or changed back).
    fn forget_history(&self) {
        self.lease_until.store(0, Ordering::Release);
        self.auth.forget_all();
        self.key_rows.forget_all();
        self.history.went_back();
    }

    /// Starts over from `keys`, read after `forget_history` in the history they name.
    fn start_over(&self, keys: KnownKeys) {
        self.purged.store(keys.synced(), Ordering::Release);
        self.know(keys);
    }

    /// What a renewal may acknowledge: copies purged, and the known keys caught up, to it.
    fn acknowledgeable(&self) -> i64 {
        let purged = self.purged.load(Ordering::Acquire);
        self.known_synced()
            .map_or(purged, |synced| purged.min(synced))
    }

    /// A renewal sent at `sent` answered `version`: purge first, then extend the lease.
    fn renewed(&self, version: i64, sent: Instant) {
        if version > self.purged.load(Ordering::Acquire) {
            self.auth.forget_all();
            self.purged.store(version, Ordering::Release);
        }
        let until = (sent + LEASE - SAFETY)
            .duration_since(self.epoch)
            .as_nanos() as u64;
        self.lease_until.fetch_max(until, Ordering::AcqRel);
    }
}

/// What one renewal found.
enum Renewal {
    /// The lease is renewed at this version.
    Renewed(i64),
    /// The database is on another history (or its counter went back): nothing was renewed.
    WentBack { version: i64, history: String },
}

/// Renews this instance's lease every `RENEW`, on a connection of its own, until aborted. A
/// failed renewal is tried again at the next tick; meanwhile the lease runs out and API keys
/// are read from the database. Each renewal is a commit, counted in `commits` while in flight
/// (and given up on unconfirmed when it fails), so that readiness sees the heartbeat stall.
///
/// A renewal first reads where the database is and catches up with it (the keys created and
/// revoked since), and only then renews the lease, acknowledging what it has caught up on: a
/// catch-up that fails renews nothing, so the lease lapses here and on the database alike,
/// and no change waits for an instance that cannot acknowledge it. When the database went
/// back in time, the instance starts over (`start_over`), on the open's budget rather than a
/// renewal's.
pub(super) async fn renew_leases(
    cache: Arc<SharedCache>,
    pool: Pool,
    instance: String,
    commits: Arc<InFlight>,
    metrics: Arc<Metrics>,
) {
    let mut ticks = tokio::time::interval(RENEW);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut renewals: u64 = 0;
    let mut failing = false;
    loop {
        ticks.tick().await;
        let sent = Instant::now();
        let renewing = commits.begin();
        let renewal = renew(&cache, &pool, &instance, renewals % PRUNE_EVERY == 0);
        match tokio::time::timeout(LEASE - SAFETY, renewal).await {
            Ok(Ok(renewed)) => {
                renewing.done();
                match renewed {
                    Renewal::Renewed(version) => cache.renewed(version, sent),
                    Renewal::WentBack { version, history } => {
                        start_over(&cache, &pool, version, &history).await
                    }
                }
                metrics.api_keys_known.set(cache.known_keys() as i64);
                if std::mem::take(&mut failing) {
                    log::info!("API keys are kept in memory again (the cache lease is renewed)");
                }
            }
            outcome => {
                if !std::mem::replace(&mut failing, true) {
                    let why = match outcome {
                        Ok(Err(fault)) => StoreError::from(fault).to_string(),
                        _ => "no answer".into(),
                    };
                    log::warn!("renewing the cache lease: {why}; API keys are read from the database until it is renewed");
                }
            }
        }
        renewals += 1;
    }
}

/// One renewal: where the database is, the keys caught up with it, the lease renewed.
async fn renew(
    cache: &SharedCache,
    pool: &Pool,
    instance: &str,
    prune: bool,
) -> Result<Renewal, Fault> {
    let client = pool.get().await?;
    let row = query_opt(&client, WHERE_THE_DATABASE_IS, &[])
        .await?
        .ok_or_else(|| StoreError::Corrupt("auth_cache_version has no row".into()))?;
    let (version, history): (i64, String) = (row.get(0), row.get(1));
    if cache.another_history(version, &history) {
        return Ok(Renewal::WentBack { version, history });
    }
    cache.adopt_history(&history);
    // Caught up with the keys created and revoked before this version is acknowledged: see
    // `known_keys.rs`.
    if let Some(synced) = cache.known_synced().filter(|synced| version > *synced) {
        let changes = known_keys::changed_after(&client, synced).await?;
        cache.learn(changes, version);
    }
    let acknowledging = cache.acknowledgeable();
    let row = alone(
        &client,
        &RENEWAL,
        &[&instance, &acknowledging, &history, &NOTHING_ACKNOWLEDGED],
    )
    .await?
    .pop()
    .ok_or_else(|| StoreError::Corrupt("auth_cache_version has no row".into()))?;
    let (version, renewed_in): (i64, String) = (row.get(0), row.get(1));
    if prune {
        query_opt(
            &client,
            "WITH gone AS (DELETE FROM auth_cache_leases
                 WHERE valid_until < clock_timestamp() - interval '1 minute' RETURNING 1)
             SELECT count(*) FROM gone",
            &[],
        )
        .await?;
    }
    // The database may have gone back between the two statements (another timeline, or a
    // counter below what this instance holds copies of): nothing is extended, nothing served.
    if renewed_in != history || cache.another_history(version, &renewed_in) {
        return Ok(Renewal::WentBack {
            version,
            history: renewed_in,
        });
    }
    Ok(Renewal::Renewed(version))
}

/// How long to wait before reading the keys again after a failed attempt to start over.
const START_OVER_RETRY: Duration = Duration::from_secs(1);

/// The database went back in time: forgets every copy and moves to a new epoch once, then
/// reads every key again with the budget an instance has at open (`KEYS_LOAD_WITHIN`: a
/// million keys on a cold new primary take longer than a renewal may), trying again until it
/// has them. No copy is served meanwhile (no lease), so every request asks the database.
async fn start_over(cache: &SharedCache, pool: &Pool, version: i64, history: &str) {
    cache.forget_history();
    log::warn!(
        "the database went back in time (history {history}, change {version}); \
         every copy of its rows is forgotten and the API keys are read again"
    );
    let started = Instant::now();
    let mut told = false;
    loop {
        let loading = async {
            let client = pool.get().await?;
            KnownKeys::load(&client).await
        };
        let why = match tokio::time::timeout(KEYS_LOAD_WITHIN, loading).await {
            Ok(Ok(keys)) => {
                let count = keys.len();
                cache.start_over(keys);
                log::info!(
                    "started over in the database's history: {count} API key(s) read in {} ms",
                    started.elapsed().as_millis()
                );
                return;
            }
            Ok(Err(fault)) => StoreError::from(fault).to_string(),
            Err(_) => format!("no answer within {} s", KEYS_LOAD_WITHIN.as_secs()),
        };
        if !std::mem::replace(&mut told, true) {
            log::warn!("reading the API keys again: {why}; tried again until it is done");
        }
        tokio::time::sleep(START_OVER_RETRY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of(account: &Account) -> ApiKeyRecord {
        ApiKeyRecord {
            id: "key_1".into(),
            account_id: account.id,
            scopes: vec![],
            revoked: false,
            created_at: 0,
            expires_at: None,
        }
    }

    #[test]
    fn no_copy_of_an_api_key_is_served_without_a_lease() {
        let cache = SharedCache::default();
        let account = Account::for_tests(0);
        let record = key_of(&account);
        cache.remember_api_key(
            cache.auth_generation(),
            [1; 32],
            (record.clone(), account.clone()),
        );
        assert!(
            cache.api_key(&[1; 32]).is_none(),
            "not remembered without a lease"
        );

        cache.renewed(0, Instant::now());
        cache.remember_api_key(cache.auth_generation(), [1; 32], (record, account));
        assert!(cache.api_key(&[1; 32]).is_some());
    }

    #[test]
    fn a_newer_version_purges_every_copy_before_the_lease_is_extended() {
        let cache = SharedCache::default();
        cache.renewed(0, Instant::now());
        let account = Account::for_tests(0);
        let record = key_of(&account);
        let read_started = cache.auth_generation();
        cache.remember_api_key(read_started, [1; 32], (record.clone(), account.clone()));
        cache.renewed(1, Instant::now());
        assert!(cache.api_key(&[1; 32]).is_none(), "purged by change 1");
        assert_eq!(cache.purged.load(Ordering::Acquire), 1);
        // A read that started before the purge is not kept after it.
        cache.remember_api_key(read_started, [1; 32], (record, account));
        assert!(cache.api_key(&[1; 32]).is_none());
    }

    #[test]
    fn a_key_is_refused_from_memory_only_while_the_lease_holds_and_the_keys_are_loaded() {
        let cache = SharedCache::default();
        cache.renewed(0, Instant::now());
        assert!(
            !cache.surely_unknown(&[9; 32]),
            "nothing loaded: ask the database"
        );
        let mut keys = KnownKeys::empty(0);
        keys.apply(vec![([1; 32], false)], 0);
        cache.know(keys);
        assert!(cache.surely_unknown(&[9; 32]));
        assert!(
            !cache.surely_unknown(&[1; 32]),
            "a key that exists is looked up"
        );
        cache.learn(vec![([9; 32], false)], 1);
        assert!(!cache.surely_unknown(&[9; 32]), "created since");
        cache.give_up();
        assert!(
            !cache.surely_unknown(&[8; 32]),
            "no lease: ask the database"
        );
    }

    #[test]
    fn a_counter_below_what_was_seen_or_another_timeline_is_another_history() {
        let cache = SharedCache::default();
        cache.know(KnownKeys::empty(5));
        cache.adopt_history("7/00000001");
        cache.renewed(6, Instant::now());
        assert!(!cache.another_history(6, "7/00000001"));
        assert!(!cache.another_history(9, "7/00000001"), "newer changes");
        assert!(
            cache.another_history(5, "7/00000001"),
            "below what was purged"
        );
        assert!(cache.another_history(6, "7/00000002"), "another timeline");
        assert!(cache.another_history(6, "8/00000001"), "another system");
    }

    #[test]
    fn a_database_gone_back_in_time_leaves_no_copy_served_and_starts_over_at_its_counter() {
        let cache = SharedCache::default();
        cache.know(KnownKeys::empty(9));
        cache.adopt_history("7/00000001");
        cache.renewed(9, Instant::now());
        let account = Account::for_tests(0);
        cache.remember_api_key(
            cache.auth_generation(),
            [1; 32],
            (key_of(&account), account),
        );
        let epoch = cache.history().epoch();

        cache.forget_history();
        assert!(
            cache.api_key(&[1; 32]).is_none(),
            "no lease: nothing served"
        );
        assert_eq!(cache.history().epoch(), epoch + 1);
        let mut keys = KnownKeys::empty(4).in_history("7/00000002");
        keys.apply(vec![([2; 32], false)], 4);
        cache.start_over(keys);
        assert!(!cache.another_history(4, "7/00000002"));
        assert_eq!(cache.acknowledgeable(), 4, "what it caught up on, not 9");
        cache.renewed(4, Instant::now());
        assert!(
            cache.api_key(&[1; 32]).is_none(),
            "the old copy is forgotten"
        );
        assert!(cache.surely_unknown(&[1; 32]) && !cache.surely_unknown(&[2; 32]));
    }

    #[test]
    fn a_history_other_than_the_one_the_keys_were_read_in_is_another_history() {
        let cache = SharedCache::default();
        // Loaded at open; the database goes back before the first renewal.
        cache.know(KnownKeys::empty(5).in_history("7/00000001/100"));
        assert!(!cache.another_history(5, "7/00000001/100"));
        assert!(cache.another_history(5, "7/00000002/100"), "a promotion");
        assert!(
            cache.another_history(5, "7/00000001/200"),
            "a restart in place"
        );
    }

    #[test]
    fn a_lease_renewed_past_the_known_keys_refuses_nothing_from_memory_until_they_catch_up() {
        let cache = SharedCache::default();
        cache.know(KnownKeys::empty(10));
        cache.renewed(10, Instant::now());
        assert!(cache.surely_unknown(&[9; 32]));
        // Key [9] created in change 11 between the renewal's two reads: renewed at 11.
        cache.renewed(11, Instant::now());
        assert!(
            !cache.surely_unknown(&[9; 32]),
            "the database decides while the keys are behind"
        );
        cache.learn(vec![([9; 32], false)], 11);
        assert!(!cache.surely_unknown(&[9; 32]), "created in change 11");
        assert!(
            cache.surely_unknown(&[8; 32]),
            "caught up: refused from memory"
        );
    }

    #[test]
    fn a_renewal_acknowledges_no_more_than_the_known_keys_caught_up_on() {
        let cache = SharedCache::default();
        cache.know(KnownKeys::empty(3));
        cache.renewed(8, Instant::now());
        assert_eq!(cache.acknowledgeable(), 3);
        cache.learn(vec![], 8);
        assert_eq!(cache.acknowledgeable(), 8);
    }

    #[test]
    fn a_lease_ends_here_before_it_ends_on_the_database() {
        let cache = SharedCache::default();
        let long_ago = Instant::now() - (LEASE - SAFETY) - Duration::from_millis(1);
        cache.renewed(0, long_ago);
        assert!(
            !cache.leased(),
            "a renewal sent LEASE - SAFETY ago no longer holds"
        );
        cache.renewed(0, Instant::now());
        assert!(cache.leased());
    }
}
