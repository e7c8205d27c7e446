//! Inbound payment-provider notifications: a unique `(provider, provider's id)` row written
//! in the same transaction as the credit, so a repeated or concurrent notification credits
//! exactly once (the unique index, not a check before the insert, is what guarantees it).

use serde::{Deserialize, Serialize};
use sled::Transactional;

use super::accounts::{move_money, read_funds};
use super::codec;
use super::spooled::Spooled;
use super::trees::Trees;
use super::tx::{refuse, settle, tx};
use crate::domain::chain::LedgerHead;
use crate::domain::ids::{AccountId, Id, IdKind};
use crate::domain::money::Cents;
use crate::domain::time::Millis;
use crate::store::{ProviderCredit, ProviderRefusal, Recorded, StoreError};

#[derive(Serialize, Deserialize)]
pub(super) struct ProviderPayment {
    pub(crate) txn_id: String,
    pub(crate) account_id: AccountId,
    pub(crate) amount: Cents,
    pub(crate) received_at: Millis,
}

/// `len(provider) ‖ provider ‖ provider's id`: no two pairs share a key.
pub(super) fn payment_key(provider: &str, external_id: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(2 + provider.len() + external_id.len());
    key.extend_from_slice(&(provider.len() as u16).to_be_bytes());
    key.extend_from_slice(provider.as_bytes());
    key.extend_from_slice(external_id.as_bytes());
    key
}

impl Trees {
    pub(super) fn record_provider_payment(
        &self,
        credit: &ProviderCredit,
        now: Millis,
    ) -> Result<Result<Recorded, ProviderRefusal>, StoreError> {
        let account = credit.account;
        let key = payment_key(&credit.provider, &credit.external_id);
        let txn_id = Id::new(IdKind::Transaction);
        let head = self.heads.of(&self.ledger, &account)?;
        let outcome = (&self.provider_payments, &self.balances, &self.ledger).transaction(
            |(payments, balances, ledger)| {
                if tx(payments.get(&key))?.is_some() {
                    return Ok((Recorded::Duplicate, None));
                }
                let funds = read_funds(balances, &account, head)?;
                let (entry, record) = match credit.decide(funds, &txn_id, now) {
                    Ok(decided) => decided,
                    Err(refused) => return refuse(refused),
                };
                let payment = ProviderPayment {
                    txn_id: record.txn_id,
                    account_id: account,
                    amount: record.amount,
                    received_at: record.received_at,
                };
                self.changes.insert(
                    Spooled::ProviderPayment,
                    payments,
                    key.as_slice(),
                    codec::encode(&payment)?,
                )?;
                move_money(&self.changes, balances, ledger, &account, &txn_id, &entry)?;
                Ok((Recorded::Credited, Some(LedgerHead::after(&entry))))
            },
        );
        Ok(settle(outcome)?.map(|(recorded, head)| {
            if let Some(head) = head {
                self.heads.keep(account, head);
            }
            recorded
        }))
    }
}
