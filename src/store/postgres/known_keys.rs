//! Every API key that can authenticate, known to this instance by its hash, so that a key
//! it does not know is refused with no statement at all: a flood of made-up keys, one
//! repeated or a new one each time, costs the database nothing (docs/contract.md "6. Many instances").
//!
//! Exact under change, by the cache lease of `shared_cache.rs`: every creation or revocation
//! of a key bumps `auth_cache_version` and writes that change's number into the key's row
//! (`changed_in`; the table's trigger does both, for any binary, migration 0007), and
//! orderly's answer waits until every live lease has acknowledged it. A renewal that
//! finds a newer version reads the rows changed after the last change applied here and
//! applies them before it acknowledges the new version. So once a creation is answered,
//! every instance whose lease is live knows the key; an instance whose lease lapsed, or whose
//! lease was renewed at a change its keys have not caught up to (a creation that committed
//! while its lease was not live yet), does not answer from what it knows, it asks the
//! database (`SharedCache::surely_unknown`).
//!
//! Memory: 32 bytes of hash per key that can authenticate, in a hash set (33 bytes a slot, a
//! power of two of slots at most 7/8 full: between 38 and 75 bytes a key, at most 75 MB for a
//! million keys). It grows only with the keys the operator creates, never with what requests
//! send.

use std::collections::HashSet;

use deadpool_postgres::Pool;

use super::tx::{query, query_opt, Fault, Session};
use super::OpenError;
use crate::bounds::KEYS_LOAD_WITHIN;
use crate::store::StoreError;

/// The keys known when an instance opens, read within `KEYS_LOAD_WITHIN`.
pub(super) async fn at_open(pool: &Pool) -> Result<KnownKeys, OpenError> {
    let loading = async {
        let client = pool.get().await.map_err(Fault::from)?;
        KnownKeys::load(&client).await
    };
    tokio::time::timeout(KEYS_LOAD_WITHIN, loading)
        .await
        .map_err(|_| OpenError::Database("reading the API keys took too long".into()))?
        .map_err(|e| OpenError::Database(format!("reading the API keys: {}", StoreError::from(e))))
}

/// The hashes, the newest change applied to them, and the database's history they were read
/// in (`orderly_history_id()`).
pub(super) struct KnownKeys {
    hashes: HashSet<[u8; 32]>,
    synced: i64,
    history: String,
}

impl KnownKeys {
    /// Every key that can authenticate now, the change they are current to and the history
    /// they belong to: the version is read first, so a change that commits meanwhile is newer
    /// and is read again later (applying a row twice leaves it as it is); the history with it,
    /// so that the database going back between this load and the first renewal is seen by
    /// that renewal.
    pub(super) async fn load(c: &impl Session) -> Result<KnownKeys, Fault> {
        let row = query_opt(
            c,
            "SELECT version, orderly_history_id() FROM auth_cache_version",
            &[],
        )
        .await?
        .ok_or_else(|| StoreError::Corrupt("auth_cache_version has no row".into()))?;
        let (version, history): (i64, String) = (row.get(0), row.get(1));
        let rows = query(c, "SELECT hash FROM api_keys WHERE NOT revoked", &[]).await?;
        let mut hashes = HashSet::with_capacity(rows.len());
        for row in &rows {
            hashes.insert(hash_of(row)?);
        }
        Ok(KnownKeys {
            hashes,
            synced: version,
            history,
        })
    }

    /// No key, current to change `version`, in no history yet.
    #[cfg(test)]
    pub(crate) fn empty(version: i64) -> KnownKeys {
        KnownKeys {
            hashes: HashSet::new(),
            synced: version,
            history: String::new(),
        }
    }

    /// The same keys, read in `history`.
    #[cfg(test)]
    pub(crate) fn in_history(mut self, history: &str) -> KnownKeys {
        self.history = history.to_string();
        self
    }

    /// The history the keys were read in.
    pub(super) fn history(&self) -> &str {
        &self.history
    }

    /// The newest change applied.
    pub(super) fn synced(&self) -> i64 {
        self.synced
    }

    pub(super) fn len(&self) -> usize {
        self.hashes.len()
    }

    pub(super) fn contains(&self, hash: &[u8; 32]) -> bool {
        self.hashes.contains(hash)
    }

    /// Applies `changes` (each key changed after `synced`, as it is now) and notes that the
    /// set is current to `version`.
    pub(super) fn apply(&mut self, changes: Vec<([u8; 32], bool)>, version: i64) {
        for (hash, revoked) in changes {
            if revoked {
                self.hashes.remove(&hash);
            } else {
                self.hashes.insert(hash);
            }
        }
        self.synced = self.synced.max(version);
    }
}

/// The keys changed (created or revoked) after change `after`, each as it is now.
pub(super) async fn changed_after(
    c: &impl Session,
    after: i64,
) -> Result<Vec<([u8; 32], bool)>, Fault> {
    let rows = query(
        c,
        "SELECT hash, revoked FROM api_keys WHERE changed_in > $1",
        &[&after],
    )
    .await?;
    rows.iter()
        .map(|row| Ok((hash_of(row)?, row.get::<_, bool>("revoked"))))
        .collect()
}

fn hash_of(row: &tokio_postgres::Row) -> Result<[u8; 32], Fault> {
    let bytes: &[u8] = row.get("hash");
    bytes
        .try_into()
        .map_err(|_| StoreError::Corrupt("an API key's hash is not 32 bytes".into()).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revocation_applied_after_the_creation_leaves_the_key_unknown() {
        let mut known = KnownKeys::empty(3);
        known.apply(vec![([1; 32], false), ([2; 32], false)], 5);
        assert!(known.contains(&[1; 32]) && known.contains(&[2; 32]));
        known.apply(vec![([1; 32], true)], 6);
        assert!(!known.contains(&[1; 32]));
        assert_eq!((known.len(), known.synced()), (1, 6));
        // A row read again (a change that committed between a version's read and its rows')
        // changes nothing, and the version never goes back.
        known.apply(vec![([2; 32], false)], 4);
        assert_eq!((known.len(), known.synced()), (1, 6));
    }
}
