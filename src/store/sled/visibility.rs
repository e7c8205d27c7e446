//! Visibility after durability: sled shows a committed transaction to every reader at once,
//! long before the group commit has put it on disk, so this module decides when a read may
//! answer with what it saw.
//!
//! The writer numbers its batches. Before a batch's transactions run, it marks every stripe
//! they touch (a hash of the account's money and orders, of its profile and keys, of the
//! account and idempotency key, of an API key's hash, or the catalog) with the batch's
//! number; the commit thread publishes the highest number on disk. A read reads first and
//! then looks at its stripe: if the stripe names a batch not yet durable, whatever it saw may
//! belong to that batch, so it waits for that flush. That holds for what it did not see too:
//! a read that finds nothing waits on the stripe of what it looked for (a revoked key's 401
//! is an answer a failed flush could take back). A stripe no write touched
//! lately never waits, and a collision costs an extra wait, never a missed one.
//!
//! The first storage failure is recorded here: from then on every wait, every read and every
//! write ends in `StoreError::Failed`, so nothing is reported that the disk may not have.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use tokio::sync::watch;

use crate::domain::idempotency_key::IdempotencyKey;
use crate::domain::ids::AccountId;
use crate::store::StoreError;

const STRIPES: usize = 4096;

#[derive(Clone, Copy, Debug, Default)]
struct Durable {
    batch: u64,
    failed: bool,
}

/// What a read saw can only have come from a write in this stripe.
#[derive(Clone, Copy, Debug)]
pub(super) enum Stripe {
    /// The account's balance, orders, ledger and events.
    Account(usize),
    /// The account record and its API keys: what authenticating a request reads, which a
    /// payment in flight must not hold up.
    Profile(usize),
    Key(usize),
    /// An API key by its hash: what a read that found no key asked for, so that the 401 of
    /// a key whose revocation is in flight waits for it.
    Credential(usize),
    Catalog,
    /// Any write at all (the outbox, which every event-writing batch touches).
    Everything,
}

impl Stripe {
    pub(super) fn account(account: &AccountId) -> Self {
        Stripe::Account(slot(account))
    }

    pub(super) fn profile(account: &AccountId) -> Self {
        Stripe::Profile(slot(account))
    }

    pub(super) fn key(account: &AccountId, key: &IdempotencyKey) -> Self {
        Stripe::Key(slot(&(account, key)))
    }

    pub(super) fn credential(key_hash: &[u8; 32]) -> Self {
        Stripe::Credential(slot(key_hash))
    }
}

/// A keyed hash with a key drawn per process: a caller cannot pick idempotency keys that land
/// on someone else's stripe to make their reads wait.
fn slot(value: &impl Hash) -> usize {
    static KEYS: OnceLock<RandomState> = OnceLock::new();
    (KEYS.get_or_init(RandomState::new).hash_one(value) as usize) % STRIPES
}

pub(super) struct Visibility {
    /// The newest batch the writer has started (its marks may already be visible).
    started: AtomicU64,
    /// The newest batch on disk.
    durable: AtomicU64,
    accounts: Box<[AtomicU64]>,
    profiles: Box<[AtomicU64]>,
    keys: Box<[AtomicU64]>,
    credentials: Box<[AtomicU64]>,
    catalog: AtomicU64,
    failure: OnceLock<String>,
    changes: watch::Sender<Durable>,
}

impl Default for Visibility {
    fn default() -> Self {
        let stripes = || (0..STRIPES).map(|_| AtomicU64::new(0)).collect();
        Visibility {
            started: AtomicU64::new(0),
            durable: AtomicU64::new(0),
            accounts: stripes(),
            profiles: stripes(),
            keys: stripes(),
            credentials: stripes(),
            catalog: AtomicU64::new(0),
            failure: OnceLock::new(),
            changes: watch::Sender::new(Durable::default()),
        }
    }
}

impl Visibility {
    fn cell(&self, stripe: Stripe) -> &AtomicU64 {
        match stripe {
            Stripe::Account(i) => &self.accounts[i],
            Stripe::Profile(i) => &self.profiles[i],
            Stripe::Key(i) => &self.keys[i],
            Stripe::Credential(i) => &self.credentials[i],
            Stripe::Catalog => &self.catalog,
            Stripe::Everything => &self.started,
        }
    }

    /// The writer starts batch `batch`.
    pub(super) fn start_batch(&self, batch: u64) {
        self.started.store(batch, Ordering::SeqCst);
    }

    /// The writer is about to change data in `stripe` within batch `batch`. Called before
    /// the transaction runs, so any reader that sees its effect sees this mark too.
    pub(super) fn mark(&self, stripe: Stripe, batch: u64) {
        self.cell(stripe).fetch_max(batch, Ordering::SeqCst);
    }

    /// The commit thread has batches up to `batch` on disk.
    pub(super) fn published(&self, batch: u64) {
        self.durable.fetch_max(batch, Ordering::SeqCst);
        self.changes.send_modify(|d| d.batch = d.batch.max(batch));
    }

    /// Records the first storage failure (later ones add nothing) and wakes every waiter.
    pub(super) fn fail(&self, why: &str) {
        if self.failure.set(why.to_string()).is_ok() {
            log::error!("storage failed, stopping: {why}");
        }
        self.changes.send_modify(|d| d.failed = true);
    }

    pub(super) fn failed(&self) -> Result<(), StoreError> {
        match self.failure.get() {
            Some(why) => Err(StoreError::Failed(why.clone())),
            None => Ok(()),
        }
    }

    /// Whether a write in `stripe` is applied and not yet on disk (a collision says yes).
    pub(super) fn pending(&self, stripe: Stripe) -> bool {
        self.cell(stripe).load(Ordering::SeqCst) > self.durable.load(Ordering::SeqCst)
    }

    /// Call after reading: resolves once whatever the read may have seen in `stripe` is on
    /// disk, at once when no write there is in flight.
    pub(super) async fn settled(&self, stripe: Stripe) -> Result<(), StoreError> {
        let needed = self.cell(stripe).load(Ordering::SeqCst);
        self.until_durable(needed).await
    }

    async fn until_durable(&self, batch: u64) -> Result<(), StoreError> {
        self.failed()?;
        if self.durable.load(Ordering::SeqCst) >= batch {
            return Ok(());
        }
        let mut changes = self.changes.subscribe();
        let reached = changes
            .wait_for(|d| d.failed || d.batch >= batch)
            .await
            .map(|d| !d.failed)
            .unwrap_or(false);
        if reached {
            Ok(())
        } else {
            self.failed()?;
            Err(StoreError::Failed("the commit thread has stopped".into()))
        }
    }

    /// Resolves with the reason once storage has failed.
    pub(super) async fn failure(&self) -> String {
        let mut changes = self.changes.subscribe();
        let _ = changes.wait_for(|d| d.failed).await;
        self.failure
            .get()
            .cloned()
            .unwrap_or_else(|| "the commit thread has stopped".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stripes_are_not_placed_by_the_unkeyed_hasher_every_process_shares() {
        // DefaultHasher::new() places values the same way in every process, so a caller
        // could work out which keys share a stripe; the keyed hash must not agree with it.
        use std::hash::Hasher;
        let unkeyed = |v: u32| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            v.hash(&mut h);
            (h.finish() as usize) % STRIPES
        };
        assert!((0..64u32).any(|v| slot(&v) != unkeyed(v)));
    }

    #[tokio::test]
    async fn a_read_of_an_untouched_stripe_does_not_wait() {
        let v = Visibility::default();
        v.start_batch(1);
        let a = AccountId::new();
        v.mark(Stripe::account(&a), 1);
        let other = (0..100)
            .map(|_| AccountId::new())
            .find(|b| slot(b) != slot(&a))
            .unwrap();
        v.settled(Stripe::account(&other)).await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_of_a_touched_stripe_waits_for_its_batch() {
        let v = std::sync::Arc::new(Visibility::default());
        let a = AccountId::new();
        v.start_batch(1);
        v.mark(Stripe::account(&a), 1);
        let waiter = {
            let v = std::sync::Arc::clone(&v);
            tokio::spawn(async move { v.settled(Stripe::account(&a)).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "must wait for batch 1");
        v.published(1);
        waiter.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn after_a_failure_every_wait_fails() {
        let v = std::sync::Arc::new(Visibility::default());
        let a = AccountId::new();
        v.start_batch(1);
        v.mark(Stripe::account(&a), 1);
        let waiter = {
            let v = std::sync::Arc::clone(&v);
            tokio::spawn(async move { v.settled(Stripe::account(&a)).await })
        };
        v.fail("disk full");
        assert!(matches!(waiter.await.unwrap(), Err(StoreError::Failed(_))));
        assert!(v.settled(Stripe::Catalog).await.is_err(), "even untouched");
        assert_eq!(v.failure().await, "disk full");
    }
}
