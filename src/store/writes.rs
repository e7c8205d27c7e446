//! What each write other than an order leaves, decided once for every engine: the engine
//! reads what the write depends on (the balance, the order), calls one of these, and writes
//! the rows it returns. Each wraps the decision in `domain/` with what the port adds to it:
//! the 200 body (rendered by the request) and the key's row that stores it.

use crate::domain::ids::Id;
use crate::domain::ledger::{money_in, LedgerEntry, LedgerReason};
use crate::domain::lifecycle::{self, Change, Stamp};
use crate::domain::order::{BalanceView, Order};
use crate::domain::time::Millis;
use crate::store::batch::first_use;
use crate::store::{
    CancelRefusal, CancelRequest, CreditRefusal, KeyRecord, NewCredit, ProviderCredit,
    ProviderPaymentRecord, ProviderRefusal, RefundRefusal, RefundRequest, StoreError,
};

/// A decided write's rows: what moved (a ledger entry, or a whole change of an order), the
/// 200 body, and the key's row holding it when the write had a key.
pub struct Decided<T> {
    pub rows: T,
    pub body: Vec<u8>,
    pub key: Option<KeyRecord>,
}

impl NewCredit {
    /// The credit on `balance` (`domain::ledger::money_in`), its body and key row.
    pub fn decide(
        &self,
        balance: i64,
        txn: &Id,
        now: Millis,
    ) -> Result<Decided<LedgerEntry>, CreditRefusal> {
        let reference = self.reference.clone();
        let entry = money_in(balance, self.amount, self.reason, reference, txn, now)
            .ok_or(CreditRefusal::BalanceOverflow)?;
        let body = (self.render)(&BalanceView {
            available: entry.balance_after,
            credit_limit: self.account.credit_limit,
            currency: self.currency.clone(),
        });
        let key = self.claim.as_ref().map(|c| first_use(c, now, body.clone()));
        Ok(Decided {
            rows: entry,
            body,
            key,
        })
    }
}

impl ProviderCredit {
    /// A first notification's credit on `balance`, and the payment's row that makes a
    /// repeat a duplicate.
    pub fn decide(
        &self,
        balance: i64,
        txn: &Id,
        now: Millis,
    ) -> Result<(LedgerEntry, ProviderPaymentRecord), ProviderRefusal> {
        let reason = LedgerReason::ProviderPayment;
        let reference = self.external_id.clone();
        let entry = money_in(balance, self.amount, reason, reference, txn, now)
            .ok_or(ProviderRefusal::BalanceOverflow)?;
        let record = ProviderPaymentRecord {
            provider: self.provider.clone(),
            external_id: self.external_id.clone(),
            txn_id: entry.id.clone(),
            account: self.account,
            amount: self.amount,
            received_at: now,
        };
        Ok((entry, record))
    }
}

impl CancelRequest {
    /// The cancel of `order` (`None`: not found) on `balance`, its body and key row.
    pub fn decide(
        &self,
        order: Option<Order>,
        balance: i64,
        stamp: &Stamp,
    ) -> Result<Decided<Change>, CancelRefusal> {
        let change = lifecycle::cancel(order, self.account, balance, stamp)?;
        let body = (self.render)(&change.order);
        let key = self
            .claim
            .as_ref()
            .map(|c| first_use(c, stamp.now, body.clone()));
        Ok(Decided {
            rows: change,
            body,
            key,
        })
    }
}

impl RefundRequest {
    /// The refund (`refund_id`) of `order` on `balance`, its body and key row. The error is
    /// a store error when the decision is malformed (a refund's change without its refund).
    pub fn decide(
        &self,
        order: Option<Order>,
        balance: i64,
        refund_id: Id,
        stamp: &Stamp,
    ) -> Result<Result<Decided<Change>, RefundRefusal>, StoreError> {
        let ask = self.ask(refund_id);
        let change = match lifecycle::refund(order, self.account, balance, ask, stamp) {
            Ok(change) => change,
            Err(refused) => return Ok(Err(refused.into())),
        };
        let refund = change
            .refund
            .as_ref()
            .ok_or_else(|| StoreError::Corrupt("a refund decided without its refund".into()))?;
        let body = (self.render)(refund, &change.order);
        let key = Some(first_use(&self.claim, stamp.now, body.clone()));
        Ok(Ok(Decided {
            rows: change,
            body,
            key,
        }))
    }
}
