//! Rows that partner requests read on every call, kept in this instance's memory so that a
//! replay costs the database nothing, and exact across every instance on the database: no
//! instance serves a copy that a committed change has made wrong (contract §17: a key revoked
//! through one instance is 401 on every other at once).
//!
//! - An idempotency key's row never changes once committed; only the sweeper deletes it, and
//!   only after its `expires_at` on the database's clock, which every instance follows
//!   (`clock.rs`). A copy is served until `KEY_ROW_MARGIN` before that instant, then read again
//!   (expired rows still decide until swept, contract §10, and the database says which are).
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

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;

use super::known_keys::{self, KnownKeys};
use super::tx::{alone, query_opt, Fault, Session};
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

/// Reads the version under a share lock (see the module's note), renews this instance's
/// lease, records what it acknowledged, and returns the version.
static RENEWAL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "WITH changes AS (SELECT version FROM auth_cache_version FOR SHARE),
         lease AS (
             INSERT INTO auth_cache_leases (instance, valid_until, acknowledged)
             SELECT $1, clock_timestamp() + interval '{} milliseconds', $2 FROM changes
             ON CONFLICT (instance) DO UPDATE
                 SET valid_until = excluded.valid_until, acknowledged = excluded.acknowledged)
         SELECT version FROM changes",
        LEASE.as_millis()
    )
});

/// In a change's transaction: the version every live lease must acknowledge.
pub async fn bump(tx: &impl Session) -> Result<i64, Fault> {
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
pub async fn acknowledged(client: &impl Session, version: i64) -> Result<(), Fault> {
    let deadline = Instant::now() + ACK_WAIT;
    loop {
        let row = query_opt(
            client,
            "SELECT count(*) FROM auth_cache_leases
             WHERE valid_until > clock_timestamp() AND acknowledged < $1",
            &[&version],
        )
        .await?
        .expect("count(*) returns a row");
        if row.get::<_, i64>(0) == 0 {
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

/// Drops this instance's lease, once it serves no copy (`SharedCache::give_up`).
pub async fn release(client: &impl Session, instance: &str) -> Result<(), Fault> {
    super::tx::execute(
        client,
        "DELETE FROM auth_cache_leases WHERE instance = $1",
        &[&instance],
    )
    .await?;
    Ok(())
}

pub struct SharedCache {
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
        }
    }
}

impl SharedCache {
    fn leased(&self) -> bool {
        let now = self.epoch.elapsed().as_nanos() as u64;
        now < self.lease_until.load(Ordering::Acquire)
    }

    /// The live key with this hash and its account, if a copy may be served.
    pub fn api_key(&self, hash: &[u8; 32]) -> Option<(ApiKeyRecord, Account)> {
        if !self.leased() {
            return None;
        }
        self.auth.get(hash)
    }

    /// True when no key with this hash can authenticate, as this instance knows while its
    /// lease holds: every creation answered so far was acknowledged here, after the key was
    /// added (`known_keys.rs`). False when the key may exist, or when this instance cannot
    /// tell (no lease, nothing loaded): the database is asked then.
    pub fn surely_unknown(&self, hash: &[u8; 32]) -> bool {
        if !self.leased() {
            return false;
        }
        let known = self.known.read().expect("the known keys");
        known.as_ref().is_some_and(|known| !known.contains(hash))
    }

    /// The keys known when the store opens.
    pub fn know(&self, keys: KnownKeys) {
        *self.known.write().expect("the known keys") = Some(keys);
    }

    /// How many keys can authenticate, as known here.
    pub fn known_keys(&self) -> usize {
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
    pub fn auth_generation(&self) -> u64 {
        self.auth.generation()
    }

    /// Keeps a live key read since `generation`, unless a change was purged meanwhile.
    pub fn remember_api_key(
        &self,
        generation: u64,
        hash: [u8; 32],
        found: (ApiKeyRecord, Account),
    ) {
        if self.leased() {
            self.auth.remember(generation, hash, found);
        }
    }

    /// The committed row of a key in its account, if a copy may be served. The caller lends
    /// the pair it looks up by rather than the cache copying the key to make one: replays
    /// come here first, every one.
    pub fn key_row(&self, scoped: &(AccountId, IdempotencyKey)) -> Option<KeyRecord> {
        let row = self.key_rows.get(scoped)?;
        servable(&row).then(|| KeyRecord::clone(&row))
    }

    /// Keeps a committed key row (rows never change; only the sweeper deletes them).
    pub fn remember_key_row(&self, account: &AccountId, key: &IdempotencyKey, row: &KeyRecord) {
        if servable(row) {
            let generation = self.key_rows.generation();
            self.key_rows
                .remember(generation, (*account, key.clone()), Arc::new(row.clone()));
        }
    }

    /// Serves no copy from now on (the instance stops).
    pub fn give_up(&self) {
        self.lease_until.store(0, Ordering::Release);
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

/// Renews this instance's lease every `RENEW`, on a connection of its own, until aborted. A
/// failed renewal is tried again at the next tick; meanwhile the lease runs out and API keys
/// are read from the database. Each renewal is a commit, counted in `commits` while in flight
/// (and given up on unconfirmed when it fails), so that readiness sees the heartbeat stall.
pub async fn renew_leases(
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
        let acknowledging = cache.purged.load(Ordering::Acquire);
        let renewal = async {
            let client = pool.get().await?;
            let row = alone(&client, &RENEWAL, &[&instance, &acknowledging])
                .await?
                .pop()
                .ok_or_else(|| StoreError::Corrupt("auth_cache_version has no row".into()))?;
            let version: i64 = row.get(0);
            // Caught up with the keys created and revoked before this version is
            // acknowledged (the next renewal sends it): see `known_keys.rs`.
            if let Some(synced) = cache.known_synced().filter(|synced| version > *synced) {
                let changes = known_keys::changed_after(&client, synced).await?;
                cache.learn(changes, version);
                metrics.api_keys_known.set(cache.known_keys() as i64);
            }
            if renewals % PRUNE_EVERY == 0 {
                query_opt(
                    &client,
                    "WITH gone AS (DELETE FROM auth_cache_leases
                         WHERE valid_until < clock_timestamp() - interval '1 minute' RETURNING 1)
                     SELECT count(*) FROM gone",
                    &[],
                )
                .await?;
            }
            Ok::<i64, Fault>(version)
        };
        match tokio::time::timeout(LEASE - SAFETY, renewal).await {
            Ok(Ok(version)) => {
                renewing.done();
                cache.renewed(version, sent);
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
