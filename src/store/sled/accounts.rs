//! Accounts, their API keys (stored as SHA-256 hashes only), their balances, and credits.

use sled::transaction::TransactionalTree;
use sled::Transactional;

use super::chained::{self, encode_entry, newest_entry};
use super::changes::Changes;
use super::idempotency::KeyTrees;
use super::spooled::Spooled;
use super::trees::Trees;
use super::tx::{refuse, settle, tx, TxResult};
use super::{codec, keys};
use crate::domain::account::{Account, ApiKeyRecord};
use crate::domain::chain::{Funds, LedgerHead};
use crate::domain::ids::{AccountId, Id, IdKind};
use crate::domain::ledger::LedgerEntry;
use crate::domain::money::Cents;
use crate::domain::time::Millis;
use crate::store::{CreditRefusal, NewCredit, StoreError};

/// Readings of a balance and its head that may disagree before `Trees::funds` gives up (each
/// a few microseconds; the writer commits an account's write once per batch).
const MAX_FUNDS_READS: usize = 8;

/// The account's balance, in a transaction, with the ledger head read before it
/// (`chained::head_of`: the writer thread, the store's one writer, read it).
pub(super) fn read_funds<R>(
    balances: &TransactionalTree,
    account: &AccountId,
    head: LedgerHead,
) -> TxResult<Funds, R> {
    let available = match tx(balances.get(account.bytes()))? {
        Some(bytes) => codec::decode(&bytes)?,
        None => Cents::ZERO,
    };
    Ok(Funds { available, head })
}

/// Writes the new balance and its ledger entry: the one way money moves.
pub(super) fn move_money<R>(
    changes: &Changes,
    balances: &TransactionalTree,
    ledger: &TransactionalTree,
    account: &AccountId,
    txn: &Id,
    entry: &LedgerEntry,
) -> TxResult<(), R> {
    let account = account.bytes();
    changes.insert(
        Spooled::Balance,
        balances,
        &account[..],
        codec::encode(&entry.balance_after)?,
    )?;
    changes.insert(
        Spooled::Ledger,
        ledger,
        keys::child_key(&account, &txn.bytes()),
        encode_entry(entry)?,
    )?;
    Ok(())
}

/// An API key's stored bytes: the record, then its end when it has one
/// (`codec::encode_extended`: earlier builds read the record and ignore the end).
pub(super) fn encode_key(record: &ApiKeyRecord) -> Result<Vec<u8>, codec::CodecError> {
    codec::encode_extended(record, &record.expires_at)
}

/// What `encode_key` wrote, or an earlier build's record (a key without an end).
pub(super) fn decode_key(bytes: &[u8]) -> Result<ApiKeyRecord, codec::CodecError> {
    let (mut record, expires_at): (ApiKeyRecord, _) = codec::decode_extended(bytes)?;
    record.expires_at = expires_at;
    Ok(record)
}

impl Trees {
    pub(super) fn create_account(&self, account: &Account) -> Result<(), StoreError> {
        self.changes.put(
            Spooled::Account,
            &self.accounts,
            account.id.bytes(),
            codec::encode(account)?,
        )
    }

    pub(super) fn account(&self, id: &AccountId) -> Result<Option<Account>, StoreError> {
        Trees::get(&self.accounts, id.bytes())
    }

    /// The account's balance and ledger head (its newest entry), read by a reader while the
    /// writer may commit: two reads of two trees, taken again until they agree (the same
    /// newest entry before and after the balance, whose `balanceAfter` it is), so that a
    /// balance is never answered with the head of another.
    pub(super) fn funds(&self, id: &AccountId) -> Result<Funds, StoreError> {
        for _ in 0..MAX_FUNDS_READS {
            let before = newest_entry(&self.ledger, id)?;
            let available = Trees::get(&self.balances, id.bytes())?.unwrap_or(Cents::ZERO);
            let after = newest_entry(&self.ledger, id)?;
            let same =
                before.as_ref().map(|e| (e.seq, e.hash)) == after.as_ref().map(|e| (e.seq, e.hash));
            if same && after.as_ref().is_none_or(|e| e.balance_after == available) {
                let head = chained::head_after(id, after.as_ref())?;
                return Ok(Funds { available, head });
            }
        }
        Err(StoreError::Unavailable(format!(
            "account {id}'s balance moved {MAX_FUNDS_READS} times while it was read"
        )))
    }

    pub(super) fn create_api_key(
        &self,
        hash: &[u8; 32],
        record: &ApiKeyRecord,
    ) -> Result<(), StoreError> {
        let key_id = Id::parse(IdKind::ApiKey, &record.id)
            .ok_or_else(|| StoreError::Corrupt("bad api key id".into()))?;
        let outcome = (&self.api_keys, &self.api_key_ids).transaction(
            |(by_hash, by_id)| -> TxResult<(), ()> {
                self.changes
                    .insert(Spooled::ApiKey, by_hash, &hash[..], encode_key(record)?)?;
                by_id.set(&key_id.bytes()[..], &hash[..]);
                Ok(())
            },
        );
        settle(outcome)?.ok();
        Ok(())
    }

    /// The live key and its account, or `None` for an unknown or revoked key.
    /// The hash of every API key stored, revoked ones too: what a store knows at open.
    pub(super) fn api_key_hashes(&self) -> Result<std::collections::HashSet<[u8; 32]>, StoreError> {
        self.api_keys
            .iter()
            .keys()
            .map(|hash| {
                let hash = hash?;
                <[u8; 32]>::try_from(&hash[..])
                    .map_err(|_| StoreError::Corrupt("an API key's hash is not 32 bytes".into()))
            })
            .collect()
    }

    pub(super) fn authenticate(
        &self,
        hash: &[u8; 32],
    ) -> Result<Option<(ApiKeyRecord, Account)>, StoreError> {
        let Some(record) = self.api_key(hash)? else {
            return Ok(None);
        };
        if record.revoked {
            return Ok(None);
        }
        let account = self
            .account(&record.account_id)?
            .ok_or_else(|| StoreError::Corrupt("api key of a missing account".into()))?;
        Ok(Some((record, account)))
    }

    /// The hash and record of a key by its id, if it exists.
    pub(super) fn api_key_by_id(
        &self,
        id: &Id,
    ) -> Result<Option<([u8; 32], ApiKeyRecord)>, StoreError> {
        let Some(hash) = self.api_key_ids.get(id.bytes())? else {
            return Ok(None);
        };
        let hash: [u8; 32] = hash
            .as_ref()
            .try_into()
            .map_err(|_| StoreError::Corrupt("api key hash is not 32 bytes".into()))?;
        Ok(self.api_key(&hash)?.map(|record| (hash, record)))
    }

    fn api_key(&self, hash: &[u8; 32]) -> Result<Option<ApiKeyRecord>, StoreError> {
        match self.api_keys.get(hash)? {
            Some(bytes) => Ok(Some(decode_key(&bytes)?)),
            None => Ok(None),
        }
    }

    /// Marks the key revoked.
    pub(super) fn revoke_api_key(&self, hash: &[u8; 32]) -> Result<(), StoreError> {
        let outcome = self.api_keys.transaction(|by_hash| -> TxResult<(), ()> {
            let Some(bytes) = tx(by_hash.get(hash))? else {
                return refuse(());
            };
            let mut record = decode_key(&bytes)?;
            record.revoked = true;
            self.changes
                .insert(Spooled::ApiKey, by_hash, &hash[..], encode_key(&record)?)?;
            Ok(())
        });
        settle(outcome)?.ok();
        Ok(())
    }

    /// Adds money to an account: one ledger entry and the new balance, plus the key row
    /// when the credit is idempotent.
    pub(super) fn credit(
        &self,
        credit: &NewCredit,
        now: Millis,
    ) -> Result<Result<Vec<u8>, CreditRefusal>, StoreError> {
        let account = credit.account.id;
        let txn = Id::new(IdKind::Transaction);
        let (keys, expiry) = self.key_trees();
        let head = self.heads.of(&self.ledger, &account)?;
        let outcome = (&self.balances, &self.ledger, keys, expiry).transaction(
            |(balances, ledger, keys, expiry)| {
                let key_trees = KeyTrees {
                    keys,
                    expiry,
                    changes: &self.changes,
                };
                key_trees.require_free(
                    &account,
                    credit.claim.as_ref(),
                    CreditRefusal::KeyTaken(None),
                )?;
                let funds = read_funds(balances, &account, head)?;
                let decided = match credit.decide(funds, &txn, now) {
                    Ok(decided) => decided,
                    Err(refused) => return refuse(refused),
                };
                move_money(
                    &self.changes,
                    balances,
                    ledger,
                    &account,
                    &txn,
                    &decided.rows,
                )?;
                key_trees.write_first_use(&account, credit.claim.as_ref(), &decided.key)?;
                Ok((decided.body, LedgerHead::after(&decided.rows)))
            },
        );
        Ok(settle(outcome)?.map(|(body, head)| {
            self.heads.keep(account, head);
            body
        }))
    }
}
