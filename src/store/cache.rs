//! Rows already read, in memory, exact under change: for reads made on every request whose
//! rows change rarely (API keys, which a revocation changes; key rows, which only a sweep
//! deletes). An engine feeds it only reads that are durable, and runs every write that can
//! change a cached row inside `around`.
//!
//! Exact because nothing stale survives a change: `around` empties the cache and bumps a
//! generation before and after the write, and a read that missed remembers what it read
//! only if no such write began since the read started (the generation it took before
//! reading is still current). Misses are not remembered, so a row written later is found at
//! once, and a flood of unknown keys cannot fill memory.
//!
//! Memory is bounded by two generations of `half` rows each: when the newer one fills, the
//! older is dropped and the newer takes its place; a hit in the older moves the row
//! forward. Rows in use stay, and a burst of one-off reads cannot grow it.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

struct Generations<K, V> {
    newer: HashMap<K, V>,
    older: HashMap<K, V>,
}

pub(super) struct Cache<K, V> {
    rows: RwLock<Generations<K, V>>,
    generation: AtomicU64,
    half: usize,
}

impl<K: Hash + Eq, V: Clone> Cache<K, V> {
    /// A cache of at most `2 * half` rows.
    pub(super) fn new(half: usize) -> Self {
        Cache {
            rows: RwLock::new(Generations {
                newer: HashMap::new(),
                older: HashMap::new(),
            }),
            generation: AtomicU64::new(0),
            half,
        }
    }

    pub(super) fn get<Q>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let (found, in_older, generation) = {
            let rows = self.rows.read().ok()?;
            // Read under the lock that a change takes to bump it: the row is current for it.
            let generation = self.generation();
            match rows.newer.get(key) {
                Some(row) => (row.clone(), false, generation),
                None => (rows.older.get(key)?.clone(), true, generation),
            }
        };
        if in_older {
            self.remember(generation, key.to_owned(), found.clone());
        }
        Some(found)
    }

    /// The generation to hand back to `remember` after a miss: taken before reading storage.
    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Keeps a durable row read since `generation`, unless a change came in between.
    pub(super) fn remember(&self, generation: u64, key: K, row: V) {
        let Ok(mut rows) = self.rows.write() else {
            return;
        };
        if self.generation.load(Ordering::Acquire) != generation {
            return;
        }
        if rows.newer.len() >= self.half {
            rows.older = std::mem::take(&mut rows.newer);
        }
        rows.newer.insert(key, row);
    }

    /// Runs a write that can change cached rows, forgetting every row before and after it.
    pub(super) fn around<T>(&self, write: impl FnOnce() -> T) -> T {
        self.forget_all();
        let outcome = write();
        self.forget_all();
        outcome
    }

    /// Forgets every row, and any read that started before (see `remember`).
    pub(super) fn forget_all(&self) {
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

    const HALF: usize = 64;

    #[test]
    fn a_read_that_straddles_a_change_is_not_remembered() {
        let cache: Cache<Vec<u8>, u32> = Cache::new(HALF);
        let before = cache.generation();
        cache.around(|| ());
        cache.remember(before, b"k".to_vec(), 1);
        assert!(cache.get(&b"k"[..]).is_none());
    }

    #[test]
    fn a_change_forgets_every_row() {
        let cache: Cache<Vec<u8>, u32> = Cache::new(HALF);
        cache.remember(cache.generation(), b"k".to_vec(), 7);
        assert_eq!(cache.get(&b"k"[..]), Some(7));
        cache.around(|| ());
        assert!(cache.get(&b"k"[..]).is_none());
    }

    #[test]
    fn rows_in_use_survive_a_flood_of_new_ones_and_the_size_stays_bounded() {
        let cache: Cache<Vec<u8>, u32> = Cache::new(HALF);
        cache.remember(cache.generation(), b"hot".to_vec(), 1);
        for n in 0..(HALF * 5) {
            cache.remember(cache.generation(), n.to_string().into_bytes(), 0);
            if n % (HALF / 2) == 0 {
                assert!(cache.get(&b"hot"[..]).is_some(), "a row read often stays");
            }
        }
        let rows = cache.rows.read().unwrap();
        assert!(rows.newer.len() + rows.older.len() <= 2 * HALF);
    }
}
