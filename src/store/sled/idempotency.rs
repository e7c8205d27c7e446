//! A key's one row (what it was used for and the stored answer), its expiry index, the lookup
//! that decides replay or conflict, and the sweeper's deletion.
//!
//! The row is written only inside the transaction of a successful first use, so a failed
//! attempt leaves the key free, and until the sweeper deletes it an expired row still decides.
//! Binding and answer live in one row so that a lookup racing the sweeper reads all of a key
//! or nothing of it (two rows read with two gets could straddle a sweep).

use sled::transaction::TransactionalTree;
use sled::Transactional;

use super::changes::Changes;
use super::codec;
use super::keys::{expiry_key, scoped_key};
use super::spooled::Spooled;
use super::trees::Trees;
use super::tx::{refuse, settle, tx, TxResult};
use crate::domain::idempotency_key::IdempotencyKey;
use crate::domain::ids::AccountId;
use crate::domain::time::Millis;
use crate::store::{KeyClaim, KeyRecord, StoreError};

/// The key trees as seen inside an operation's transaction.
pub(super) struct KeyTrees<'t> {
    pub(crate) keys: &'t TransactionalTree,
    pub(crate) expiry: &'t TransactionalTree,
    pub(crate) changes: &'t Changes,
}

impl KeyTrees<'_> {
    /// Aborts with `taken` when another use already holds the key (the caller then replays
    /// or conflicts); a write without a key passes.
    pub(super) fn require_free<R>(
        &self,
        account: &AccountId,
        claim: Option<&KeyClaim>,
        taken: R,
    ) -> TxResult<(), R> {
        let Some(claim) = claim else { return Ok(()) };
        match tx(self.keys.get(scoped_key(&account.bytes(), &claim.key)))? {
            Some(_) => refuse(taken),
            None => Ok(()),
        }
    }

    /// A decided write's key row, when it had a key.
    pub(super) fn write_first_use<R>(
        &self,
        account: &AccountId,
        claim: Option<&KeyClaim>,
        row: &Option<KeyRecord>,
    ) -> TxResult<(), R> {
        match (claim, row) {
            (Some(claim), Some(row)) => self.write(account, &claim.key, row),
            _ => Ok(()),
        }
    }

    /// Writes the key's row and its expiry entry.
    pub(super) fn write<R>(
        &self,
        account: &AccountId,
        key: &IdempotencyKey,
        row: &KeyRecord,
    ) -> TxResult<(), R> {
        let scoped = scoped_key(&account.bytes(), key);
        self.expiry
            .set(expiry_key(row.expires_at, &scoped), &[][..]);
        self.changes.insert(
            Spooled::IdempotencyKey,
            self.keys,
            scoped,
            codec::encode(row)?,
        )?;
        Ok(())
    }
}

impl Trees {
    pub(super) fn key_trees(&self) -> (&sled::Tree, &sled::Tree) {
        (&self.idem_keys, &self.idem_expiry)
    }

    /// The row of a key that has been used successfully, if any (expired or not).
    pub(super) fn replay_lookup(
        &self,
        account: &AccountId,
        key: &IdempotencyKey,
    ) -> Result<Option<KeyRecord>, StoreError> {
        Trees::get(&self.idem_keys, scoped_key(&account.bytes(), key))
    }

    /// Whether any key row expired before `now` (so a sweep has work).
    pub(super) fn any_key_expired(&self, now: Millis) -> Result<bool, StoreError> {
        Ok(self
            .idem_expiry
            .range(..now.to_be_bytes().to_vec())
            .next()
            .transpose()?
            .is_some())
    }

    /// Deletes up to `max` keys whose rows expired before `now`, in one transaction.
    /// Returns how many expiry entries were consumed.
    pub(super) fn sweep_expired_keys(&self, now: Millis, max: usize) -> Result<usize, StoreError> {
        let due: Vec<sled::IVec> = self
            .idem_expiry
            .range(..now.to_be_bytes().to_vec())
            .keys()
            .take(max)
            .collect::<Result<_, _>>()?;
        if due.is_empty() {
            return Ok(0);
        }
        let outcome = (&self.idem_keys, &self.idem_expiry).transaction(
            |(keys, expiry)| -> TxResult<(), ()> {
                for entry in &due {
                    let (expires_at, scoped) = entry.split_at(8);
                    let expires_at = u64::from_be_bytes(expires_at.try_into().expect("8 bytes"));
                    // Only the row this entry describes: a newer use of the key keeps its own.
                    let ours = match tx(keys.get(scoped))? {
                        Some(bytes) => codec::decode::<KeyRecord>(&bytes)?.expires_at == expires_at,
                        None => false,
                    };
                    if ours {
                        self.changes.remove(Spooled::IdempotencyKey, keys, scoped)?;
                    }
                    expiry.delete(entry);
                }
                Ok(())
            },
        );
        settle(outcome)?.ok();
        Ok(due.len())
    }
}
