//! Accounts, their API keys (stored as SHA-256 hashes only) and their balances.

use sha2::{Digest, Sha256};
use sled::transaction::TransactionalTree;
use sled::Transactional;

use super::idempotency::{KeyClaim, KeyTrees};
use super::{codec, keys, refuse, settle, tx, Store, StoreError, TxResult};
use crate::domain::account::{Account, ApiKeyRecord};
use crate::domain::ids::{Id, IdKind};
use crate::domain::ledger::{LedgerEntry, LedgerReason};
use crate::domain::order::BalanceView;
use crate::domain::time::Millis;

/// The storage form of an account id.
pub fn account_bytes(account_id: &str) -> Result<[u8; 16], StoreError> {
    Id::parse(IdKind::Account, account_id)
        .map(|id| id.bytes())
        .ok_or_else(|| StoreError::Corrupt(format!("bad account id {account_id:?}")))
}

pub fn hash_api_key(plaintext: &str) -> [u8; 32] {
    Sha256::digest(plaintext.as_bytes()).into()
}

/// A credit that could not be made.
#[derive(Debug, PartialEq, Eq)]
pub enum CreditRefusal {
    /// The balance would not fit in an i64.
    BalanceOverflow,
    /// The key was taken by a concurrent first use: look it up again.
    KeyTaken,
}

pub struct NewCredit<'a> {
    pub account: &'a Account,
    pub amount: i64,
    pub reason: LedgerReason,
    pub reference: String,
    pub now: Millis,
    pub currency: &'a str,
    pub claim: Option<KeyClaim<'a>>,
}

pub fn read_balance<R>(balances: &TransactionalTree, account: &[u8; 16]) -> TxResult<i64, R> {
    match tx(balances.get(account))? {
        Some(bytes) => Ok(codec::decode(&bytes)?),
        None => Ok(0),
    }
}

/// Writes the new balance and its ledger entry: the one way money moves.
pub fn move_money<R>(
    balances: &TransactionalTree,
    ledger: &TransactionalTree,
    account: &[u8; 16],
    entry: &LedgerEntry,
) -> TxResult<(), R> {
    let txn = Id::parse(IdKind::Transaction, &entry.id).expect("ledger ids are made here");
    tx(balances.insert(&account[..], codec::encode(&entry.balance_after)?))?;
    tx(ledger.insert(
        keys::child_key(account, &txn.bytes()),
        codec::encode(entry)?,
    ))?;
    Ok(())
}

impl Store {
    pub fn create_account(&self, account: &Account) -> Result<(), StoreError> {
        let id = account_bytes(&account.id)?;
        self.accounts.insert(id, codec::encode(account)?)?;
        Ok(())
    }

    pub fn account(&self, account_id: &str) -> Result<Option<Account>, StoreError> {
        let Some(id) = Id::parse(IdKind::Account, account_id) else {
            return Ok(None);
        };
        match self.accounts.get(id.bytes())? {
            Some(bytes) => Ok(Some(codec::decode(&bytes)?)),
            None => Ok(None),
        }
    }

    pub fn balance(&self, account: &Account) -> Result<i64, StoreError> {
        match self.balances.get(account_bytes(&account.id)?)? {
            Some(bytes) => Ok(codec::decode(&bytes)?),
            None => Ok(0),
        }
    }

    pub fn create_api_key(&self, plaintext: &str, record: &ApiKeyRecord) -> Result<(), StoreError> {
        let hash = hash_api_key(plaintext);
        let key_id = Id::parse(IdKind::ApiKey, &record.id)
            .ok_or_else(|| StoreError::Corrupt("bad api key id".into()))?;
        let outcome = (&self.api_keys, &self.api_key_ids).transaction(
            |(by_hash, by_id)| -> TxResult<(), ()> {
                tx(by_hash.insert(&hash[..], codec::encode(record)?))?;
                tx(by_id.insert(&key_id.bytes()[..], &hash[..]))?;
                Ok(())
            },
        );
        settle(outcome)?.ok();
        Ok(())
    }

    /// The live key and its account, or `None` for an unknown or revoked key.
    pub fn authenticate(
        &self,
        plaintext: &str,
    ) -> Result<Option<(ApiKeyRecord, Account)>, StoreError> {
        let Some(bytes) = self.api_keys.get(hash_api_key(plaintext))? else {
            return Ok(None);
        };
        let record: ApiKeyRecord = codec::decode(&bytes)?;
        if record.revoked {
            return Ok(None);
        }
        let account = self
            .account(&record.account_id)?
            .ok_or_else(|| StoreError::Corrupt("api key of a missing account".into()))?;
        Ok(Some((record, account)))
    }

    /// Marks the key revoked; false when no such key exists.
    pub fn revoke_api_key(&self, key_id: &str) -> Result<bool, StoreError> {
        let Some(id) = Id::parse(IdKind::ApiKey, key_id) else {
            return Ok(false);
        };
        let Some(hash) = self.api_key_ids.get(id.bytes())? else {
            return Ok(false);
        };
        let outcome = self.api_keys.transaction(|by_hash| -> TxResult<(), ()> {
            let Some(bytes) = tx(by_hash.get(&hash))? else {
                return refuse(());
            };
            let mut record: ApiKeyRecord = codec::decode(&bytes)?;
            record.revoked = true;
            tx(by_hash.insert(&hash, codec::encode(&record)?))?;
            Ok(())
        });
        Ok(settle(outcome)?.is_ok())
    }

    /// Adds money to an account: one ledger entry and the new balance, plus the key rows
    /// when the credit is idempotent. `render` makes the 200 body from the new balance.
    pub fn credit(
        &self,
        credit: &NewCredit,
        txn_id: Id,
        render: impl Fn(&BalanceView) -> Vec<u8>,
    ) -> Result<Result<Vec<u8>, CreditRefusal>, StoreError> {
        let account = account_bytes(&credit.account.id)?;
        let (responses, bindings, expiry) = self.key_trees();
        let outcome = (&self.balances, &self.ledger, responses, bindings, expiry).transaction(
            |(balances, ledger, responses, bindings, expiry)| {
                let key_trees = KeyTrees {
                    responses,
                    bindings,
                    expiry,
                };
                key_trees.require_free(credit.claim.as_ref(), CreditRefusal::KeyTaken)?;
                let before = read_balance(balances, &account)?;
                let Some(after) = before.checked_add(credit.amount) else {
                    return refuse(CreditRefusal::BalanceOverflow);
                };
                let entry = LedgerEntry {
                    id: txn_id.to_string(),
                    amount: credit.amount,
                    reason: credit.reason,
                    reference: credit.reference.clone(),
                    balance_after: after,
                    created_at: credit.now,
                };
                move_money(balances, ledger, &account, &entry)?;
                let body = render(&BalanceView {
                    available: after,
                    credit_limit: credit.account.credit_limit,
                    currency: credit.currency.to_string(),
                });
                if let Some(claim) = &credit.claim {
                    key_trees.record(claim, body.clone())?;
                }
                Ok(body)
            },
        );
        settle(outcome)
    }
}
