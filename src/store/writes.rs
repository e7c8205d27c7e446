//! What each write other than an order leaves, decided once for every engine: the engine
//! reads what the write depends on (the balance, the order), calls one of these, and writes
//! the rows it returns. Each wraps the decision in `domain/` with what the port adds to it:
//! the 200 body (rendered by the request) and the key's row that stores it.

use crate::domain::chain::Funds;
use crate::domain::ids::{AccountId, Id, OrderId};
use crate::domain::ledger::{LedgerEntry, LedgerReason};
use crate::domain::lifecycle::{self, Change, Stamp};
use crate::domain::money_in::{money_in, Incoming};
use crate::domain::order::{BalanceView, Order};
use crate::domain::time::Millis;
use crate::store::batch::first_use;
use crate::store::{
    CancelRefusal, CancelRequest, CreditRefusal, KeyClaim, KeyRecord, NewCredit, ProviderCredit,
    ProviderPaymentRecord, ProviderRefusal, RefundRefusal, RefundRequest, StoreError, Taken,
};

/// A decided write's rows: what moved (a ledger entry, or a whole change of an order), the
/// 200 body, and the key's row holding it when the write had a key.
pub(crate) struct Decided<T> {
    pub(crate) rows: T,
    pub(crate) body: Vec<u8>,
    pub(crate) key: Option<KeyRecord>,
}

impl<T> Decided<T> {
    /// `rows` answered with `body`, and the key's row that stores it (`None` without a key).
    fn answered(rows: T, body: Vec<u8>, claim: Option<&KeyClaim>, now: Millis) -> Self {
        let key = claim.map(|c| first_use(c, now, body.clone()));
        Decided { rows, body, key }
    }
}

impl NewCredit {
    /// The credit on `funds` (`domain::money_in::money_in`), its body and key row.
    pub(crate) fn decide(
        &self,
        funds: Funds,
        txn: &Id,
        now: Millis,
    ) -> Result<Decided<LedgerEntry>, CreditRefusal> {
        let incoming = Incoming {
            amount: self.amount,
            reason: self.reason,
            reference: self.reference.clone(),
        };
        let entry = money_in(self.account.id, funds, incoming, txn, now)
            .ok_or(CreditRefusal::BalanceOverflow)?;
        let body = (self.render)(&BalanceView {
            available: entry.balance_after,
            credit_limit: self.account.credit_limit,
            currency: self.currency.clone(),
        });
        Ok(Decided::answered(entry, body, self.claim.as_ref(), now))
    }
}

impl ProviderCredit {
    /// A first notification's credit on `funds`, and the payment's row that makes a
    /// repeat a duplicate.
    pub(crate) fn decide(
        &self,
        funds: Funds,
        txn: &Id,
        now: Millis,
    ) -> Result<(LedgerEntry, ProviderPaymentRecord), ProviderRefusal> {
        let incoming = Incoming {
            amount: self.amount,
            reason: LedgerReason::ProviderPayment,
            reference: self.external_id.clone(),
        };
        let entry = money_in(self.account, funds, incoming, txn, now)
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

/// A change to a placed order, a cancel or a refund, as every engine runs it: the key checked
/// free, the order and its balance read under their locks, decided here, then the change's
/// rows and the key's row written in the same transaction. Each engine writes that one
/// transaction once, generic over this.
pub(super) trait OrderChange {
    /// Why the change was refused, nothing written.
    type Refusal;
    fn account(&self) -> AccountId;
    fn order(&self) -> &OrderId;
    fn claim(&self) -> Option<&KeyClaim>;
    /// The refund's id, made with the request (not in the transaction, which sled may run
    /// again and which must then decide with the same id).
    fn refund_id(&self) -> Option<&Id>;
    /// The refusal when a concurrent first use of the key committed first (`taken`, its row
    /// when the engine read it).
    fn key_taken(taken: Taken) -> Self::Refusal;
    /// The change of `order` (`None`: not found) on `funds`, its body and key row. The
    /// error is a store error when the decision is malformed (a refund without its refund).
    fn decide(
        &self,
        order: Option<Order>,
        funds: Funds,
        stamp: &Stamp,
    ) -> Result<Result<Decided<Change>, Self::Refusal>, StoreError>;
}

impl OrderChange for CancelRequest {
    type Refusal = CancelRefusal;

    fn account(&self) -> AccountId {
        self.account
    }

    fn order(&self) -> &OrderId {
        &self.order
    }

    fn claim(&self) -> Option<&KeyClaim> {
        self.claim.as_ref()
    }

    fn refund_id(&self) -> Option<&Id> {
        None
    }

    fn key_taken(taken: Taken) -> CancelRefusal {
        CancelRefusal::KeyTaken(taken)
    }

    fn decide(
        &self,
        order: Option<Order>,
        funds: Funds,
        stamp: &Stamp,
    ) -> Result<Result<Decided<Change>, CancelRefusal>, StoreError> {
        let change = match lifecycle::cancel(order, self.account, funds, stamp) {
            Ok(change) => change,
            Err(refused) => return Ok(Err(refused.into())),
        };
        let body = (self.render)(&change.order);
        Ok(Ok(Decided::answered(change, body, self.claim(), stamp.now)))
    }
}

impl OrderChange for RefundRequest {
    type Refusal = RefundRefusal;

    fn account(&self) -> AccountId {
        self.account
    }

    fn order(&self) -> &OrderId {
        &self.order
    }

    fn claim(&self) -> Option<&KeyClaim> {
        Some(&self.claim)
    }

    fn refund_id(&self) -> Option<&Id> {
        Some(&self.id)
    }

    fn key_taken(taken: Taken) -> RefundRefusal {
        RefundRefusal::KeyTaken(taken)
    }

    fn decide(
        &self,
        order: Option<Order>,
        funds: Funds,
        stamp: &Stamp,
    ) -> Result<Result<Decided<Change>, RefundRefusal>, StoreError> {
        let change = match lifecycle::refund(order, self.account, funds, self.ask(), stamp) {
            Ok(change) => change,
            Err(refused) => return Ok(Err(refused.into())),
        };
        let refund = change
            .refund
            .as_ref()
            .ok_or_else(|| StoreError::Corrupt("a refund decided without its refund".into()))?;
        let body = (self.render)(refund, &change.order);
        Ok(Ok(Decided::answered(change, body, self.claim(), stamp.now)))
    }
}
