//! API keys already seen, in memory: authentication is on every request, and a hit saves the
//! two point reads, their decoding and the wait on the profile stripe.
//!
//! Exact under change: every write that can change what a key authenticates as (a new
//! account, a new or revoked key, a restore) empties the cache both before and after it is
//! applied, and bumps a generation. A read that missed inserts what it read only if no such
//! write began since it started, and only once that read is durable, so a hit is always
//! what storage holds on disk now. A revoked key is therefore refused from the moment its
//! write is applied, which is before its DELETE answers. Unknown keys are not cached: a
//! flood of made-up keys cannot fill memory, and a key created later is found at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

use crate::domain::account::{Account, ApiKeyRecord};

/// Keys kept at most; past it the cache starts over (deployments have a few hundred keys).
const CAPACITY: usize = 10_000;

pub type Authenticated = (ApiKeyRecord, Account);

#[derive(Default)]
pub struct AuthCache {
    entries: RwLock<HashMap<[u8; 32], Authenticated>>,
    generation: AtomicU64,
}

impl AuthCache {
    pub fn get(&self, hash: &[u8; 32]) -> Option<Authenticated> {
        self.entries.read().ok()?.get(hash).cloned()
    }

    /// The generation to hand back to `insert` after a miss: taken before reading storage.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Remembers a durable read made since `generation`, unless a write came in between.
    pub fn insert(&self, generation: u64, hash: [u8; 32], found: Authenticated) {
        let Ok(mut entries) = self.entries.write() else {
            return;
        };
        if self.generation.load(Ordering::Acquire) != generation {
            return;
        }
        if entries.len() >= CAPACITY {
            entries.clear();
        }
        entries.insert(hash, found);
    }

    /// Runs a write that changes accounts or keys (on the writer thread), forgetting every
    /// key before and after it.
    pub fn around<T>(&self, write: impl FnOnce() -> T) -> T {
        self.invalidate();
        let outcome = write();
        self.invalidate();
        outcome
    }

    pub fn invalidate(&self) {
        if let Ok(mut entries) = self.entries.write() {
            self.generation.fetch_add(1, Ordering::AcqRel);
            entries.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ids::AccountId;

    fn found() -> Authenticated {
        let account = Account {
            id: AccountId::new(),
            name: "a".into(),
            wholesale: false,
            credit_limit: 0,
            region: None,
            webhook_secret: "whsec_x".into(),
            created_at: 0,
        };
        let record = ApiKeyRecord {
            id: "key_1".into(),
            account_id: account.id,
            scopes: Vec::new(),
            revoked: false,
            created_at: 0,
        };
        (record, account)
    }

    #[test]
    fn a_read_that_straddles_a_write_is_not_remembered() {
        let cache = AuthCache::default();
        let before = cache.generation();
        cache.invalidate();
        cache.insert(before, [1; 32], found());
        assert!(cache.get(&[1; 32]).is_none());
    }

    #[test]
    fn a_write_forgets_what_was_remembered() {
        let cache = AuthCache::default();
        cache.insert(cache.generation(), [1; 32], found());
        assert!(cache.get(&[1; 32]).is_some());
        cache.invalidate();
        assert!(cache.get(&[1; 32]).is_none());
    }
}
