//! Key rows already read, in memory: a replay is the hottest read there is, and a hit skips
//! sled's lookup, the row's decoding and the wait on the key's stripe.
//!
//! A key's row never changes once written; it only goes away, when the sweeper deletes it
//! (or a restore replaces everything). So the cache is exact if nothing stale survives a
//! deletion: the sweep empties it and bumps a generation before and after deleting, and a
//! read that missed remembers what it read only if no sweep began since it started, and
//! only once that read is durable. Misses are not remembered, so a key used for the first
//! time is found at once.
//!
//! Memory is bounded by two generations of `HALF` rows each: when the newer one fills, the
//! older is dropped and the newer takes its place; a hit in the older moves the row forward.
//! Rows in use stay, and a burst of one-off keys cannot grow it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::store::KeyRecord;

/// Rows per generation (a row is its stored answer, about half a kilobyte for an order).
const HALF: usize = 8_192;

#[derive(Default)]
struct Generations {
    newer: HashMap<Vec<u8>, Arc<KeyRecord>>,
    older: HashMap<Vec<u8>, Arc<KeyRecord>>,
}

#[derive(Default)]
pub struct ReplayCache {
    rows: RwLock<Generations>,
    generation: AtomicU64,
}

impl ReplayCache {
    pub fn get(&self, scoped: &[u8]) -> Option<Arc<KeyRecord>> {
        let (found, in_older, generation) = {
            let rows = self.rows.read().ok()?;
            // Read under the lock that a sweep takes to bump it: the row is current for it.
            let generation = self.generation();
            match rows.newer.get(scoped) {
                Some(row) => (Arc::clone(row), false, generation),
                None => (Arc::clone(rows.older.get(scoped)?), true, generation),
            }
        };
        if in_older {
            self.remember(generation, scoped.to_vec(), Arc::clone(&found));
        }
        Some(found)
    }

    /// The generation to hand back to `remember` after a miss: taken before reading storage.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Keeps a durable row read since `generation`, unless a deletion came in between.
    pub fn remember(&self, generation: u64, scoped: Vec<u8>, row: Arc<KeyRecord>) {
        let Ok(mut rows) = self.rows.write() else {
            return;
        };
        if self.generation.load(Ordering::Acquire) != generation {
            return;
        }
        if rows.newer.len() >= HALF {
            rows.older = std::mem::take(&mut rows.newer);
        }
        rows.newer.insert(scoped, row);
    }

    /// Runs a write that deletes key rows (on the writer thread), forgetting every row before
    /// and after it.
    pub fn around<T>(&self, delete: impl FnOnce() -> T) -> T {
        self.forget_all();
        let outcome = delete();
        self.forget_all();
        outcome
    }

    fn forget_all(&self) {
        if let Ok(mut rows) = self.rows.write() {
            self.generation.fetch_add(1, Ordering::AcqRel);
            rows.newer.clear();
            rows.older.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::fingerprint::{Fingerprint, Operation};
    use crate::store::StoredResponse;

    fn row(body: &[u8]) -> Arc<KeyRecord> {
        Arc::new(KeyRecord {
            operation: Operation::PlaceOrder,
            fingerprint: Fingerprint([0; 32]),
            expires_at: 1,
            response: StoredResponse {
                status: 200,
                content_type: "application/json".into(),
                body: body.to_vec(),
            },
        })
    }

    #[test]
    fn a_read_that_straddles_a_sweep_is_not_remembered() {
        let cache = ReplayCache::default();
        let before = cache.generation();
        cache.around(|| ());
        cache.remember(before, b"k".to_vec(), row(b"old"));
        assert!(cache.get(b"k").is_none());
    }

    #[test]
    fn a_sweep_forgets_every_row() {
        let cache = ReplayCache::default();
        cache.remember(cache.generation(), b"k".to_vec(), row(b"a"));
        assert_eq!(cache.get(b"k").unwrap().response.body, b"a");
        cache.around(|| ());
        assert!(cache.get(b"k").is_none());
    }

    #[test]
    fn rows_in_use_survive_a_flood_of_new_ones_and_the_size_stays_bounded() {
        let cache = ReplayCache::default();
        cache.remember(cache.generation(), b"hot".to_vec(), row(b"h"));
        for n in 0..(HALF * 5) {
            cache.remember(cache.generation(), n.to_string().into_bytes(), row(b"x"));
            if n % (HALF / 2) == 0 {
                assert!(cache.get(b"hot").is_some(), "a row read often stays");
            }
        }
        let rows = cache.rows.read().unwrap();
        assert!(rows.newer.len() + rows.older.len() <= 2 * HALF);
    }
}
