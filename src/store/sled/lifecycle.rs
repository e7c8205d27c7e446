//! An order's life after it is placed: fulfillment completes it, a cancel returns its money,
//! a refund returns part or all of it, each decided in `domain::lifecycle`. Each change, its
//! money and its event are one transaction.

use sled::transaction::TransactionalTree;
use sled::Transactional;

use super::accounts::{move_money, read_funds};
use super::changes::Changes;
use super::codec;
use super::events::record_event;
use super::idempotency::KeyTrees;
use super::spooled::Spooled;
use super::trees::Trees;
use super::tx::{refuse, settle, tx, NineTrees, TxResult};
use crate::domain::chain::{Funds, LedgerHead};
use crate::domain::ids::{AccountId, Id, IdKind, OrderId};
use crate::domain::lifecycle::{self, Change, Stamp};
use crate::domain::order::{Order, OrderStatus};
use crate::domain::time::Millis;
use crate::store::writes::OrderChange;
use crate::store::StoreError;

/// A `processing` order whose fulfillment delay has passed.
pub(super) struct DueOrder {
    pub(crate) order_id: OrderId,
    pub(crate) account: AccountId,
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

/// The trees a cancel or a refund touches, as their transaction sees them.
type ChangeTrees = NineTrees;

/// `ChangeTrees` by name.
struct ChangeView<'a> {
    orders: &'a TransactionalTree,
    processing: &'a TransactionalTree,
    refunds: &'a TransactionalTree,
    balances: &'a TransactionalTree,
    ledger: &'a TransactionalTree,
    events: &'a TransactionalTree,
    outbox: &'a TransactionalTree,
    keys: KeyTrees<'a>,
    changes: &'a Changes,
}

impl<'a> ChangeView<'a> {
    fn of(trees: &'a ChangeTrees, changes: &'a Changes) -> Self {
        let (orders, processing, refunds, balances, ledger, events, outbox, keys, expiry) = trees;
        ChangeView {
            orders,
            processing,
            refunds,
            balances,
            ledger,
            events,
            outbox,
            keys: KeyTrees {
                keys,
                expiry,
                changes,
            },
            changes,
        }
    }

    /// The order and the account's balance a decision reads, with the ledger head read
    /// before the transaction.
    fn read<R>(
        &self,
        order: &OrderId,
        account: &AccountId,
        head: LedgerHead,
    ) -> TxResult<(Option<Order>, Funds), R> {
        Ok((
            read_order(self.orders, order)?,
            read_funds(self.balances, account, head)?,
        ))
    }

    /// Writes a decided change: the order's row (out of the `processing` queue once it left
    /// that status), the refund's, the money and the event. `refund_id` is the id the refund
    /// (if any) was decided with.
    fn write<R>(&self, stamp: &Stamp, change: &Change, refund_id: Option<&Id>) -> TxResult<(), R> {
        let order_key = change.order.id.bytes();
        self.changes.insert(
            Spooled::Order,
            self.orders,
            &order_key[..],
            codec::encode(&change.order)?,
        )?;
        if change.order.status != OrderStatus::Processing {
            self.processing.delete(&order_key[..]);
        }
        if let (Some(refund), Some(id)) = (&change.refund, refund_id) {
            self.changes.insert(
                Spooled::Refund,
                self.refunds,
                &id.bytes()[..],
                codec::encode(refund)?,
            )?;
        }
        move_money(
            self.changes,
            self.balances,
            self.ledger,
            &change.order.account_id,
            &stamp.txn,
            &change.entry,
        )?;
        record_event(
            self.changes,
            self.events,
            self.outbox,
            &stamp.event,
            &change.emitted,
        )
    }
}

impl Trees {
    /// Up to `max` `processing` orders created at or before `created_by`, oldest first: a
    /// read, done outside the writer so the writer only runs the transaction.
    pub(super) fn due_orders(
        &self,
        created_by: Millis,
        max: usize,
    ) -> Result<Vec<DueOrder>, StoreError> {
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
    pub(super) fn complete_orders(
        &self,
        due: &[DueOrder],
        now: Millis,
    ) -> Result<usize, StoreError> {
        let event_ids: Vec<Id> = due.iter().map(|_| Id::new(IdKind::Event)).collect();
        let outcome = (&self.orders, &self.processing, &self.events, &self.outbox).transaction(
            |(orders, processing, events, outbox)| -> TxResult<usize, ()> {
                let mut completed = 0;
                for (DueOrder { order_id, .. }, event_id) in due.iter().zip(&event_ids) {
                    processing.delete(&order_id.bytes()[..]);
                    let Some(order) = read_order(orders, order_id)? else {
                        continue;
                    };
                    let Some((order, emitted)) = lifecycle::complete(order, *event_id, now) else {
                        continue;
                    };
                    self.changes.insert(
                        Spooled::Order,
                        orders,
                        &order_id.bytes()[..],
                        codec::encode(&order)?,
                    )?;
                    record_event(&self.changes, events, outbox, event_id, &emitted)?;
                    completed += 1;
                }
                Ok(completed)
            },
        );
        Ok(settle(outcome)?.unwrap_or(0))
    }

    /// The trees a cancel or a refund reads and writes, in the order `ChangeView::of` reads them.
    fn change_trees(&self) -> [&sled::Tree; 9] {
        let (keys, expiry) = self.key_trees();
        [
            &self.orders,
            &self.processing,
            &self.refunds,
            &self.balances,
            &self.ledger,
            &self.events,
            &self.outbox,
            keys,
            expiry,
        ]
    }

    /// A cancel or a refund (`OrderChange`): the key checked free, the order and its balance
    /// read, decided, and the change with the key's row written, in one transaction.
    pub(super) fn change_order<C: OrderChange>(
        &self,
        request: &C,
        now: Millis,
    ) -> Result<Result<Vec<u8>, C::Refusal>, StoreError> {
        let account = request.account();
        let stamp = stamp(now);
        let head = self.heads.of(&self.ledger, &account)?;
        let [a, b, c, d, e, f, g, h, i] = self.change_trees();
        let outcome = (a, b, c, d, e, f, g, h, i).transaction(|trees| {
            let view = ChangeView::of(trees, &self.changes);
            view.keys
                .require_free(&account, request.claim(), C::key_taken(None))?;
            let (order, funds) = view.read(request.order(), &account, head)?;
            let decided = match request.decide(order, funds, &stamp) {
                Ok(Ok(decided)) => decided,
                Ok(Err(refused)) => return refuse(refused),
                // Caught by the writer and answered as a corrupt store.
                Err(malformed) => panic!("{malformed}"),
            };
            view.write(&stamp, &decided.rows, request.refund_id())?;
            view.keys
                .write_first_use(&account, request.claim(), &decided.key)?;
            Ok((decided.body, LedgerHead::after(&decided.rows.entry)))
        });
        Ok(settle(outcome)?.map(|(body, head)| {
            self.heads.keep(account, head);
            body
        }))
    }
}
