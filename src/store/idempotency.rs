//! The two idempotency rows (the stored response and the key-to-fingerprint binding), their
//! expiry index, the lookup that decides replay or conflict, and the sweeper's deletion.
//!
//! The rows are written only inside the transaction of a successful first use, so a failed
//! attempt leaves the key free, and until the sweeper deletes them expired rows still decide.

use serde::{Deserialize, Serialize};
use sled::transaction::TransactionalTree;
use sled::Transactional;

use super::keys::{expiry_key, scoped_key};
use super::{codec, tx, Store, StoreError, TxResult};
use crate::domain::fingerprint::{Fingerprint, Operation};
use crate::domain::idempotency_key::IdempotencyKey;
use crate::domain::time::Millis;

/// The exact response of the first successful use, replayed byte for byte.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StoredResponse {
    pub status: u16,
    pub content_type: String,
    /// As one byte string: a plain `Vec<u8>` would be decoded byte by byte on every replay.
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
    pub expires_at: Millis,
}

/// What the key was first used for.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KeyBinding {
    pub operation: Operation,
    pub fingerprint: Fingerprint,
    pub expires_at: Millis,
}

pub struct KeyRecord {
    pub binding: KeyBinding,
    pub response: StoredResponse,
}

/// A first use of a key, to be recorded by the operation's transaction.
pub struct KeyClaim<'a> {
    pub account: [u8; 16],
    pub key: &'a IdempotencyKey,
    pub operation: Operation,
    pub fingerprint: Fingerprint,
    pub expires_at: Millis,
}

/// The three idempotency trees as seen inside an operation's transaction.
pub struct KeyTrees<'t> {
    pub responses: &'t TransactionalTree,
    pub bindings: &'t TransactionalTree,
    pub expiry: &'t TransactionalTree,
}

impl KeyTrees<'_> {
    /// Aborts with `taken` when another use already holds the key (the caller then replays
    /// or conflicts); a write without a key passes.
    pub fn require_free<R>(&self, claim: Option<&KeyClaim>, taken: R) -> TxResult<(), R> {
        let Some(claim) = claim else { return Ok(()) };
        match tx(self.bindings.get(scoped_key(&claim.account, claim.key)))? {
            Some(_) => super::refuse(taken),
            None => Ok(()),
        }
    }

    /// Writes both rows and the expiry entry; `body` is the exact 200 being sent.
    pub fn record<R>(&self, claim: &KeyClaim, body: Vec<u8>) -> TxResult<(), R> {
        let scoped = scoped_key(&claim.account, claim.key);
        let response = StoredResponse {
            status: 200,
            content_type: "application/json".into(),
            body,
            expires_at: claim.expires_at,
        };
        let binding = KeyBinding {
            operation: claim.operation,
            fingerprint: claim.fingerprint,
            expires_at: claim.expires_at,
        };
        tx(self
            .responses
            .insert(scoped.as_slice(), codec::encode(&response)?))?;
        tx(self
            .bindings
            .insert(scoped.as_slice(), codec::encode(&binding)?))?;
        tx(self
            .expiry
            .insert(expiry_key(claim.expires_at, &scoped), &[][..]))?;
        Ok(())
    }
}

impl Store {
    pub(super) fn key_trees(&self) -> (&sled::Tree, &sled::Tree, &sled::Tree) {
        (&self.idem_responses, &self.idem_bindings, &self.idem_expiry)
    }

    /// The rows of a key that has been used successfully, if any (expired or not).
    pub fn replay_lookup(
        &self,
        account: &[u8; 16],
        key: &IdempotencyKey,
    ) -> Result<Option<KeyRecord>, StoreError> {
        let scoped = scoped_key(account, key);
        let Some(binding) = self.idem_bindings.get(&scoped)? else {
            return Ok(None);
        };
        let response = self
            .idem_responses
            .get(&scoped)?
            .ok_or_else(|| StoreError::Corrupt("key binding without its response".into()))?;
        Ok(Some(KeyRecord {
            binding: codec::decode(&binding)?,
            response: codec::decode(&response)?,
        }))
    }

    /// Deletes up to `max` keys whose rows expired before `now`, each in its own small
    /// transaction so the sweeper never holds sled's write lock for long. Returns how many.
    pub fn sweep_expired_keys(&self, now: Millis, max: usize) -> Result<usize, StoreError> {
        let due: Vec<sled::IVec> = self
            .idem_expiry
            .range(..now.to_be_bytes().to_vec())
            .keys()
            .take(max)
            .collect::<Result<_, _>>()?;
        let mut deleted = 0;
        for entry in due {
            let (expires_at, scoped) = entry.split_at(8);
            let expires_at = u64::from_be_bytes(expires_at.try_into().expect("8 bytes"));
            let outcome = (&self.idem_responses, &self.idem_bindings, &self.idem_expiry)
                .transaction(|(responses, bindings, expiry)| -> TxResult<(), ()> {
                    // Only the rows this entry describes: a newer use of the key keeps its own.
                    let current = tx(bindings.get(scoped))?;
                    let ours = match current {
                        Some(bytes) => {
                            codec::decode::<KeyBinding>(&bytes)?.expires_at == expires_at
                        }
                        None => true,
                    };
                    if ours {
                        tx(bindings.remove(scoped))?;
                        tx(responses.remove(scoped))?;
                    }
                    tx(expiry.remove(&entry))?;
                    Ok(())
                });
            super::settle(outcome)?.ok();
            deleted += 1;
        }
        Ok(deleted)
    }
}
