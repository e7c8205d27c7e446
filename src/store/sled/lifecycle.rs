//! An order's life after it is placed: fulfillment completes it, a cancel returns its money,
//! a refund returns part or all of it, each decided in `domain::lifecycle`. Each change, its
//! money and its event are one transaction.

use sled::transaction::TransactionalTree;
use sled::Transactional;

use super::accounts::{move_money, read_balance};
use super::codec;
use super::events::record_event;
use super::idempotency::KeyTrees;
use super::trees::Trees;
use super::tx::{refuse, settle, tx, TxResult};
use crate::domain::ids::{AccountId, Id, IdKind, OrderId};
use crate::domain::lifecycle::{self, Change, Stamp};
use crate::domain::order::Order;
use crate::domain::time::Millis;
use crate::store::{CancelRefusal, CancelRequest, RefundRefusal, RefundRequest, StoreError};

/// A `processing` order whose fulfillment delay has passed.
pub struct DueOrder {
    pub order_id: OrderId,
    pub account: AccountId,
}

fn read_order<R>(orders: &TransactionalTree, id: &OrderId) -> TxResult<Option<Order>, R> {
    match tx(orders.get(id.bytes()))? {
        Some(bytes) => Ok(Some(codec::decode(&bytes)?)),
        None => Ok(None),
    }
}

/// The stamp of one write: its ids made outside the transaction, which sled may run more
/// than once (a rerun must decide with the same ids).
fn stamp(now: Millis) -> Stamp {
    Stamp {
        now,
        txn: Id::new(IdKind::Transaction),
        event: Id::new(IdKind::Event),
    }
}

/// Writes a decided change: the order's row, the refund's, the money and the event.
/// `refund_id` is the id the refund (if any) was decided with.
fn write_change<R>(
    view: &ChangeView<'_>,
    stamp: &Stamp,
    change: &Change,
    refund_id: Option<&Id>,
) -> TxResult<(), R> {
    let order_key = change.order.id.bytes();
    tx(view
        .orders
        .insert(&order_key[..], codec::encode(&change.order)?))?;
    if let (Some(refund), Some(id)) = (&change.refund, refund_id) {
        tx(view.refunds.insert(&id.bytes()[..], codec::encode(refund)?))?;
    }
    move_money(
        view.balances,
        view.ledger,
        &change.order.account_id,
        &stamp.txn,
        &change.entry,
    )?;
    record_event(view.events, view.outbox, &stamp.event, &change.emitted)
}

/// The trees a cancel or a refund writes, as seen inside its transaction.
struct ChangeView<'a> {
    orders: &'a TransactionalTree,
    refunds: &'a TransactionalTree,
    balances: &'a TransactionalTree,
    ledger: &'a TransactionalTree,
    events: &'a TransactionalTree,
    outbox: &'a TransactionalTree,
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
        let event_ids: Vec<Id> = due.iter().map(|_| Id::new(IdKind::Event)).collect();
        let outcome = (&self.orders, &self.processing, &self.events, &self.outbox).transaction(
            |(orders, processing, events, outbox)| -> TxResult<usize, ()> {
                let mut completed = 0;
                for (DueOrder { order_id, .. }, event_id) in due.iter().zip(&event_ids) {
                    tx(processing.remove(&order_id.bytes()[..]))?;
                    let Some(order) = read_order(orders, order_id)? else {
                        continue;
                    };
                    let Some((order, emitted)) = lifecycle::complete(order, *event_id, now) else {
                        continue;
                    };
                    tx(orders.insert(&order_id.bytes()[..], codec::encode(&order)?))?;
                    record_event(events, outbox, event_id, &emitted)?;
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
        let stamp = stamp(now);
        let (keys, expiry) = self.key_trees();
        let trees = (
            &self.orders,
            &self.processing,
            &self.refunds,
            &self.balances,
            &self.ledger,
            &self.events,
            &self.outbox,
            keys,
            expiry,
        );
        let outcome = trees.transaction(
            |(orders, processing, refunds, balances, ledger, events, outbox, keys, expiry)| {
                let key_trees = KeyTrees { keys, expiry };
                key_trees.require_free(
                    &account,
                    request.claim.as_ref(),
                    CancelRefusal::KeyTaken(None),
                )?;
                let order = read_order(orders, &request.order)?;
                let balance = read_balance(balances, &account)?;
                let change = match lifecycle::cancel(order, account, balance, &stamp) {
                    Ok(change) => change,
                    Err(refused) => return refuse(refused.into()),
                };
                let view = ChangeView {
                    orders,
                    refunds,
                    balances,
                    ledger,
                    events,
                    outbox,
                };
                write_change(&view, &stamp, &change, None)?;
                tx(processing.remove(&request.order.bytes()[..]))?;
                let body = (request.render)(&change.order);
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
        let stamp = stamp(now);
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
                let order = read_order(orders, &request.order)?;
                let balance = read_balance(balances, &account)?;
                let ask = request.ask(refund_id);
                let change = match lifecycle::refund(order, account, balance, ask, &stamp) {
                    Ok(change) => change,
                    Err(refused) => return refuse(refused.into()),
                };
                let view = ChangeView {
                    orders,
                    refunds,
                    balances,
                    ledger,
                    events,
                    outbox,
                };
                write_change(&view, &stamp, &change, Some(&refund_id))?;
                let refund = change
                    .refund
                    .as_ref()
                    .expect("a refund's change has its refund");
                let body = (request.render)(refund, &change.order);
                key_trees.record(&account, &request.claim, now, body.clone())?;
                Ok(body)
            },
        );
        settle(outcome)
    }
}
