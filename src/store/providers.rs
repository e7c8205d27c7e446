//! Inbound payment-provider notifications: a unique `(provider, provider's id)` row written
//! in the same transaction as the credit, so a repeated or concurrent notification credits
//! exactly once (the unique index, not a check before the insert, is what guarantees it).

use serde::{Deserialize, Serialize};
use sled::Transactional;

use super::accounts::{account_bytes, move_money, read_balance};
use super::{codec, refuse, settle, tx, Store, StoreError};
use crate::domain::ids::{Id, IdKind};
use crate::domain::ledger::{LedgerEntry, LedgerReason};
use crate::domain::time::Millis;

#[derive(Serialize, Deserialize)]
struct ProviderPayment {
    txn_id: String,
    account_id: String,
    amount: i64,
    received_at: Millis,
}

pub struct ProviderCredit<'a> {
    pub provider: &'a str,
    pub external_id: &'a str,
    pub account_id: &'a str,
    pub amount: i64,
    pub now: Millis,
}

/// Whether this notification moved money or was a repeat of one that did.
#[derive(Debug, PartialEq, Eq)]
pub enum Recorded {
    Credited,
    Duplicate,
}

#[derive(Debug, PartialEq, Eq)]
pub enum ProviderRefusal {
    BalanceOverflow,
}

/// `len(provider) ‖ provider ‖ provider's id`: no two pairs share a key.
fn payment_key(provider: &str, external_id: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(2 + provider.len() + external_id.len());
    key.extend_from_slice(&(provider.len() as u16).to_be_bytes());
    key.extend_from_slice(provider.as_bytes());
    key.extend_from_slice(external_id.as_bytes());
    key
}

impl Store {
    pub fn record_provider_payment(
        &self,
        credit: &ProviderCredit,
    ) -> Result<Result<Recorded, ProviderRefusal>, StoreError> {
        let account = account_bytes(credit.account_id)?;
        let key = payment_key(credit.provider, credit.external_id);
        let txn_id = Id::new(IdKind::Transaction);
        let outcome = (&self.provider_payments, &self.balances, &self.ledger).transaction(
            |(payments, balances, ledger)| {
                if tx(payments.get(&key))?.is_some() {
                    return Ok(Recorded::Duplicate);
                }
                let before = read_balance(balances, &account)?;
                let Some(after) = before.checked_add(credit.amount) else {
                    return refuse(ProviderRefusal::BalanceOverflow);
                };
                let payment = ProviderPayment {
                    txn_id: txn_id.to_string(),
                    account_id: credit.account_id.to_string(),
                    amount: credit.amount,
                    received_at: credit.now,
                };
                tx(payments.insert(key.as_slice(), codec::encode(&payment)?))?;
                let entry = LedgerEntry {
                    id: txn_id.to_string(),
                    amount: credit.amount,
                    reason: LedgerReason::ProviderPayment,
                    reference: credit.external_id.to_string(),
                    balance_after: after,
                    created_at: credit.now,
                };
                move_money(balances, ledger, &account, &entry)?;
                Ok(Recorded::Credited)
            },
        );
        settle(outcome)
    }
}
