//! An order's life after it is placed: fulfillment completes it, a cancel returns its money,
//! a refund returns part or all of it. Each change, its money and its event are one transaction.

use sled::Transactional;

use super::accounts::{move_money, read_balance};
use super::codec;
use super::events::record_event;
use super::idempotency::KeyTrees;
use super::trees::Trees;
use super::tx::{refuse, settle, tx, TxResult};
use crate::domain::event::{Event, EventKind};
use crate::domain::ids::{AccountId, Id, IdKind, OrderId};
use crate::domain::ledger::{LedgerEntry, LedgerReason};
use crate::domain::order::{Order, OrderStatus, Refund};
use crate::domain::time::Millis;
use crate::store::{CancelRefusal, CancelRequest, RefundRefusal, RefundRequest, StoreError};

/// A `processing` order whose fulfillment delay has passed.
pub struct DueOrder {
    pub order_id: OrderId,
    pub account: AccountId,
}

fn read_order<R>(
    orders: &sled::transaction::TransactionalTree,
    id: &OrderId,
) -> TxResult<Option<Order>, R> {
    match tx(orders.get(id.bytes()))? {
        Some(bytes) => Ok(Some(codec::decode(&bytes)?)),
        None => Ok(None),
    }
}

/// The order if it belongs to `account_id`; another account's order does not exist for it.
fn read_own_order<R>(
    orders: &sled::transaction::TransactionalTree,
    id: &OrderId,
    account: &AccountId,
) -> TxResult<Option<Order>, R> {
    Ok(read_order(orders, id)?.filter(|o| o.account_id == *account))
}

/// Money going back to the account: a cancel's whole total or a refund's part of it.
struct Returned {
    amount: i64,
    reason: LedgerReason,
    reference: String,
}

impl Returned {
    fn credit<R>(
        self,
        balances: &sled::transaction::TransactionalTree,
        ledger: &sled::transaction::TransactionalTree,
        account: &AccountId,
        txn: &Id,
        now: Millis,
    ) -> TxResult<(), R> {
        let before = read_balance(balances, account)?;
        let entry = LedgerEntry {
            id: txn.to_string(),
            amount: self.amount,
            reason: self.reason,
            reference: self.reference,
            // The debit this undoes fitted, so adding it back fits too.
            balance_after: before.saturating_add(self.amount),
            created_at: now,
        };
        move_money(balances, ledger, account, txn, &entry)
    }
}

fn event_of(kind: EventKind, order: &Order, refund: Option<Refund>, now: Millis) -> (Id, Event) {
    let id = Id::new(IdKind::Event);
    let event = Event {
        id: id.to_string(),
        kind,
        account_id: order.account_id,
        created_at: now,
        order: order.clone(),
        refund,
    };
    (id, event)
}

impl Trees {
    /// Up to `max` `processing` orders created at or before `created_by`, oldest first: a
    /// read, done outside the writer so the writer only runs the transaction.
    pub fn due_orders(&self, created_by: Millis, max: usize) -> Result<Vec<DueOrder>, StoreError> {
        let mut due = Vec::new();
        for key in self.processing.iter().keys().take(max) {
            let key = key?;
            let order_id = OrderId::from_bytes(&key)
                .ok_or_else(|| StoreError::Corrupt("processing key is not an order id".into()))?;
            match self.order(&order_id)? {
                // The queue is in creation order: the first order not yet due ends the pass.
                Some(order) if order.created_at > created_by => break,
                Some(order) => due.push(DueOrder {
                    order_id,
                    account: order.account_id,
                }),
                // A queue entry without its order: the transaction drops it.
                None => due.push(DueOrder {
                    order_id,
                    account: AccountId::new(),
                }),
            }
        }
        Ok(due)
    }

    /// Completes the given orders in one transaction (one per order would double the write
    /// load of the orders themselves), each with its `order.completed` event. Orders a cancel
    /// got to first are left as they are. Returns how many were completed.
    pub fn complete_orders(&self, due: &[DueOrder], now: Millis) -> Result<usize, StoreError> {
        let outcome = (&self.orders, &self.processing, &self.events, &self.outbox).transaction(
            |(orders, processing, events, outbox)| -> TxResult<usize, ()> {
                let mut completed = 0;
                for DueOrder { order_id, account } in due {
                    tx(processing.remove(&order_id.bytes()[..]))?;
                    let Some(mut order) = read_order(orders, order_id)? else {
                        continue;
                    };
                    if order.status != OrderStatus::Processing {
                        continue;
                    }
                    order.status = OrderStatus::Completed;
                    order.updated_at = now;
                    tx(orders.insert(&order_id.bytes()[..], codec::encode(&order)?))?;
                    let (event_id, event) = event_of(EventKind::OrderCompleted, &order, None, now);
                    record_event(events, outbox, account, &event_id, &event)?;
                    completed += 1;
                }
                Ok(completed)
            },
        );
        Ok(settle(outcome)?.unwrap_or(0))
    }

    /// Cancels a `processing` order and returns its money, with an `order.cancelled` event.
    /// `request.render` makes the 200 body from the cancelled order.
    pub fn cancel_order(
        &self,
        request: &CancelRequest,
        now: Millis,
    ) -> Result<Result<Vec<u8>, CancelRefusal>, StoreError> {
        let account = request.account;
        let txn_id = Id::new(IdKind::Transaction);
        let (keys, expiry) = self.key_trees();
        let trees = (
            &self.orders,
            &self.processing,
            &self.balances,
            &self.ledger,
            &self.events,
            &self.outbox,
            keys,
            expiry,
        );
        let outcome = trees.transaction(
            |(orders, processing, balances, ledger, events, outbox, keys, expiry)| {
                let key_trees = KeyTrees { keys, expiry };
                key_trees.require_free(
                    &account,
                    request.claim.as_ref(),
                    CancelRefusal::KeyTaken(None),
                )?;
                let Some(mut order) = read_own_order(orders, &request.order, &account)? else {
                    return refuse(CancelRefusal::NotFound);
                };
                if order.status != OrderStatus::Processing {
                    return refuse(CancelRefusal::NotCancellable(order.status));
                }
                order.status = OrderStatus::Cancelled;
                order.updated_at = now;
                tx(orders.insert(&request.order.bytes()[..], codec::encode(&order)?))?;
                tx(processing.remove(&request.order.bytes()[..]))?;
                let returned = Returned {
                    amount: order.total,
                    reason: LedgerReason::Cancel,
                    reference: order.id.to_string(),
                };
                returned.credit(balances, ledger, &account, &txn_id, now)?;
                let (event_id, event) = event_of(EventKind::OrderCancelled, &order, None, now);
                record_event(events, outbox, &account, &event_id, &event)?;
                let body = (request.render)(&order);
                if let Some(claim) = &request.claim {
                    key_trees.record(&account, claim, now, body.clone())?;
                }
                Ok(body)
            },
        );
        settle(outcome)
    }

    /// Refunds part or all of a `completed` order to the balance, with an `order.refunded`
    /// event. `request.render` makes the 200 body from the refund and the order after it.
    pub fn refund_order(
        &self,
        request: &RefundRequest,
        now: Millis,
    ) -> Result<Result<Vec<u8>, RefundRefusal>, StoreError> {
        let account = request.account;
        let txn_id = Id::new(IdKind::Transaction);
        let refund_id = Id::new(IdKind::Refund);
        let (keys, expiry) = self.key_trees();
        let trees = (
            &self.orders,
            &self.refunds,
            &self.balances,
            &self.ledger,
            &self.events,
            &self.outbox,
            keys,
            expiry,
        );
        let outcome = trees.transaction(
            |(orders, refunds, balances, ledger, events, outbox, keys, expiry)| {
                let key_trees = KeyTrees { keys, expiry };
                key_trees.require_free(
                    &account,
                    Some(&request.claim),
                    RefundRefusal::KeyTaken(None),
                )?;
                let Some(mut order) = read_own_order(orders, &request.order, &account)? else {
                    return refuse(RefundRefusal::NotFound);
                };
                if order.status != OrderStatus::Completed {
                    return refuse(RefundRefusal::NotRefundable(order.status));
                }
                let remaining = order.refundable();
                let amount = request.amount.unwrap_or(remaining);
                if amount > remaining || amount < 1 {
                    return refuse(RefundRefusal::ExceedsRemaining { remaining });
                }
                order.refunded += amount;
                order.updated_at = now;
                let refund = Refund {
                    id: refund_id.to_string(),
                    order_id: order.id,
                    amount,
                    reason: request.reason.clone(),
                    created_at: now,
                };
                tx(orders.insert(&request.order.bytes()[..], codec::encode(&order)?))?;
                tx(refunds.insert(&refund_id.bytes()[..], codec::encode(&refund)?))?;
                let returned = Returned {
                    amount,
                    reason: LedgerReason::Refund,
                    reference: refund.id.clone(),
                };
                returned.credit(balances, ledger, &account, &txn_id, now)?;
                let (event_id, event) =
                    event_of(EventKind::OrderRefunded, &order, Some(refund.clone()), now);
                record_event(events, outbox, &account, &event_id, &event)?;
                let body = (request.render)(&refund, &order);
                key_trees.record(&account, &request.claim, now, body.clone())?;
                Ok(body)
            },
        );
        settle(outcome)
    }
}
