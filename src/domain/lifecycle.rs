//! What becomes of an order after it is placed, decided once for every engine: fulfillment
//! completes it, a cancel returns all its money, a refund part or all of it, and each change
//! emits its event (and the event's first callback when the order has a callbackUrl).
//!
//! Each decision is a pure function of the rows it reads (the order as the account's
//! transaction sees it, the balance), the request, and the ids and time the engine made at
//! commit (`Stamp`). It returns the rows to write or the refusal, which writes nothing. The
//! engines only read, call and write.

use super::chain::{Funds, Movement};
use super::event::{Delivery, Event, EventKind};
use super::ids::{AccountId, Id};
use super::invariant;
use super::ledger::{LedgerEntry, LedgerReason};
use super::money::Cents;
use super::order::{Order, OrderStatus, Refund};
use super::time::Millis;

/// The ids and the time a write is decided with. The engine makes them at commit, in commit
/// order per account (under the account's lock), so that ids and times follow the commits.
#[derive(Clone, Debug)]
pub(crate) struct Stamp {
    pub(crate) now: Millis,
    /// The ledger entry's id.
    pub(crate) txn: Id,
    /// The event's id.
    pub(crate) event: Id,
}

/// An event and, when its order has a callbackUrl, its first callback, due at once.
#[derive(Clone, Debug)]
pub(crate) struct Emitted {
    pub(crate) event: Event,
    pub(crate) delivery: Option<Delivery>,
}

/// The event of one change to `order`, with a snapshot of the order (and refund) after it.
pub(crate) fn emit(
    kind: EventKind,
    order: &Order,
    refund: Option<Refund>,
    id: Id,
    now: Millis,
) -> Emitted {
    let event = Event {
        id: id.to_string(),
        kind,
        account_id: order.account_id,
        created_at: now,
        order: order.clone(),
        refund,
    };
    let delivery = order.callback_url.as_ref().map(|url| Delivery {
        event_id: event.id.clone(),
        account_id: event.account_id,
        url: url.clone(),
        attempt: 1,
    });
    Emitted { event, delivery }
}

/// One decided change of an order: its new row, the refund row (refunds only), the ledger
/// entry of the money returned (its `balance_after` is the account's new balance), and the
/// event. All of it is one atomic write.
#[derive(Clone, Debug)]
pub(crate) struct Change {
    pub(crate) order: Order,
    pub(crate) refund: Option<Refund>,
    pub(crate) entry: LedgerEntry,
    pub(crate) emitted: Emitted,
}

/// Why a cancel changed nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CancelRefused {
    /// No such order, or another account's (which does not exist for this one).
    NotFound,
    /// Only a `processing` order can be cancelled.
    NotCancellable(OrderStatus),
    /// The balance plus the order's total would not fit in an i64 (money came in since the
    /// order was placed).
    BalanceTooLarge,
}

/// Why a refund changed nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RefundRefused {
    NotFound,
    /// Only a `completed` order can be refunded.
    NotRefundable(OrderStatus),
    /// The amount asked is more than what is left to refund (or not positive).
    ExceedsRemaining {
        remaining: Cents,
    },
    /// The balance plus the refund would not fit in an i64.
    BalanceTooLarge,
}

/// The order if it exists and belongs to `account`.
fn own(order: Option<Order>, account: AccountId) -> Option<Order> {
    order.filter(|o| o.account_id == account)
}

/// The ledger entry of money going back to an account whose balance is `balance`, or `None`
/// when the sum does not fit. The debit this undoes fitted when it was made, but money may
/// have come in since (a credit, a provider's payment): the balance can be anywhere up to
/// i64::MAX by now, so the sum is checked, never saturated (invariant 1 holds it exact).
fn give_back(
    account: AccountId,
    funds: &Funds,
    amount: Cents,
    reason: LedgerReason,
    reference: String,
    stamp: &Stamp,
) -> Option<LedgerEntry> {
    let movement = Movement {
        id: stamp.txn.to_string(),
        amount,
        reason,
        reference,
        balance_after: funds.available.checked_add(amount)?,
        created_at: stamp.now,
    };
    Some(LedgerEntry::chained(
        &account.to_string(),
        &funds.head,
        movement,
    ))
}

/// Cancels a `processing` order of `account` and returns its whole total to the balance.
pub(crate) fn cancel(
    order: Option<Order>,
    account: AccountId,
    funds: Funds,
    stamp: &Stamp,
) -> Result<Change, CancelRefused> {
    let mut order = own(order, account).ok_or(CancelRefused::NotFound)?;
    if order.status != OrderStatus::Processing {
        return Err(CancelRefused::NotCancellable(order.status));
    }
    let entry = give_back(
        account,
        &funds,
        order.total - order.refunded,
        LedgerReason::Cancel,
        order.id.to_string(),
        stamp,
    )
    .ok_or(CancelRefused::BalanceTooLarge)?;
    order.status = OrderStatus::Cancelled;
    order.updated_at = stamp.now;
    invariant::cancel_returns_the_rest(&order, &entry);
    invariant::entry_moves_the_balance(&funds, &entry);
    let emitted = emit(
        EventKind::OrderCancelled,
        &order,
        None,
        stamp.event,
        stamp.now,
    );
    Ok(Change {
        order,
        refund: None,
        entry,
        emitted,
    })
}

/// What a refund asks for.
#[derive(Clone, Debug)]
pub(crate) struct RefundAsk {
    /// `None`: the whole unrefunded remainder.
    pub(crate) amount: Option<Cents>,
    pub(crate) reason: Option<String>,
    /// The refund's id, made with the stamp.
    pub(crate) id: Id,
}

/// Refunds part or all of a `completed` order of `account` to the balance: never more than
/// what was paid and not yet refunded.
pub(crate) fn refund(
    order: Option<Order>,
    account: AccountId,
    funds: Funds,
    ask: RefundAsk,
    stamp: &Stamp,
) -> Result<Change, RefundRefused> {
    let mut order = own(order, account).ok_or(RefundRefused::NotFound)?;
    if order.status != OrderStatus::Completed {
        return Err(RefundRefused::NotRefundable(order.status));
    }
    let remaining = order.refundable();
    let amount = ask.amount.unwrap_or(remaining);
    if amount > remaining || !amount.is_positive() {
        return Err(RefundRefused::ExceedsRemaining { remaining });
    }
    let entry = give_back(
        account,
        &funds,
        amount,
        LedgerReason::Refund,
        ask.id.to_string(),
        stamp,
    )
    .ok_or(RefundRefused::BalanceTooLarge)?;
    order.refunded = order.refunded + amount;
    order.updated_at = stamp.now;
    let refund = Refund {
        id: ask.id.to_string(),
        order_id: order.id,
        amount,
        reason: ask.reason,
        created_at: stamp.now,
    };
    invariant::refunded_within_total(&order);
    invariant::money_in_is_positive(&entry);
    invariant::entry_moves_the_balance(&funds, &entry);
    let emitted = emit(
        EventKind::OrderRefunded,
        &order,
        Some(refund.clone()),
        stamp.event,
        stamp.now,
    );
    Ok(Change {
        order,
        refund: Some(refund),
        entry,
        emitted,
    })
}

/// Completes a due order, with its `order.completed` event; `None` when it is no longer
/// `processing` (a cancel got to it first), and then nothing is written for it.
pub(crate) fn complete(mut order: Order, event: Id, now: Millis) -> Option<(Order, Emitted)> {
    if order.status != OrderStatus::Processing {
        return None;
    }
    order.status = OrderStatus::Completed;
    order.updated_at = now;
    let emitted = emit(EventKind::OrderCompleted, &order, None, event, now);
    Some((order, emitted))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::domain::ids::{IdKind, OrderId};

    fn stamp(now: Millis) -> Stamp {
        Stamp {
            now,
            txn: Id::new(IdKind::Transaction),
            event: Id::new(IdKind::Event),
        }
    }

    fn order(account: AccountId, total: i64, status: OrderStatus, url: Option<&str>) -> Order {
        Order {
            id: OrderId::new(),
            account_id: account,
            status,
            items: vec![],
            total: Cents(total),
            currency: "USD".into(),
            callback_url: url.map(str::to_string),
            external_order_id: None,
            refunded: Cents::ZERO,
            created_at: 1,
            updated_at: 1,
        }
    }

    fn ask(amount: Option<i64>) -> RefundAsk {
        RefundAsk {
            amount: amount.map(Cents),
            reason: None,
            id: Id::new(IdKind::Refund),
        }
    }

    /// `cents` on `account`'s empty ledger.
    fn holding(account: AccountId, cents: i64) -> Funds {
        Funds {
            available: Cents(cents),
            ..Funds::empty(&account.to_string())
        }
    }

    #[test]
    fn a_cancel_returns_the_whole_total_and_emits_order_cancelled() {
        let account = AccountId::new();
        let placed = order(
            account,
            700,
            OrderStatus::Processing,
            Some("https://p.example/cb"),
        );
        let change = cancel(Some(placed), account, holding(account, 300), &stamp(9)).unwrap();
        assert_eq!(change.order.status, OrderStatus::Cancelled);
        assert_eq!(change.order.updated_at, 9);
        assert_eq!(change.entry.amount, Cents(700));
        assert_eq!(change.entry.balance_after, Cents(1000));
        assert_eq!(change.entry.reason, LedgerReason::Cancel);
        assert_eq!(change.emitted.event.kind, EventKind::OrderCancelled);
        let delivery = change
            .emitted
            .delivery
            .expect("a callback for an order with a url");
        assert_eq!(
            (delivery.attempt, delivery.event_id),
            (1, change.emitted.event.id)
        );
    }

    #[test]
    fn another_accounts_order_is_not_found_for_cancel_and_refund() {
        let other = order(AccountId::new(), 5, OrderStatus::Processing, None);
        let me = AccountId::new();
        assert_eq!(
            cancel(Some(other.clone()), me, holding(me, 0), &stamp(1)).unwrap_err(),
            CancelRefused::NotFound
        );
        assert_eq!(
            refund(Some(other), me, holding(me, 0), ask(None), &stamp(1)).unwrap_err(),
            RefundRefused::NotFound
        );
    }

    #[test]
    fn only_a_processing_order_is_cancellable() {
        let account = AccountId::new();
        for status in [OrderStatus::Completed, OrderStatus::Cancelled] {
            let done = order(account, 5, status, None);
            assert_eq!(
                cancel(Some(done), account, holding(account, 0), &stamp(1)).unwrap_err(),
                CancelRefused::NotCancellable(status)
            );
        }
    }

    #[test]
    fn only_a_completed_order_is_refundable_and_never_for_nothing() {
        let account = AccountId::new();
        let open = order(account, 5, OrderStatus::Processing, None);
        assert_eq!(
            refund(
                Some(open),
                account,
                holding(account, 0),
                ask(None),
                &stamp(1)
            )
            .unwrap_err(),
            RefundRefused::NotRefundable(OrderStatus::Processing)
        );
        let done = order(account, 5, OrderStatus::Completed, None);
        assert_eq!(
            refund(
                Some(done),
                account,
                holding(account, 0),
                ask(Some(0)),
                &stamp(1)
            )
            .unwrap_err(),
            RefundRefused::ExceedsRemaining {
                remaining: Cents(5)
            }
        );
    }

    #[test]
    fn an_order_a_cancel_got_to_first_is_not_completed() {
        let cancelled = order(AccountId::new(), 5, OrderStatus::Cancelled, None);
        assert!(complete(cancelled, Id::new(IdKind::Event), 2).is_none());
        let open = order(AccountId::new(), 5, OrderStatus::Processing, None);
        let (done, emitted) = complete(open, Id::new(IdKind::Event), 2).unwrap();
        assert_eq!(done.status, OrderStatus::Completed);
        assert_eq!(emitted.event.kind, EventKind::OrderCompleted);
        assert!(emitted.delivery.is_none(), "no callbackUrl, no callback");
    }

    proptest! {
        /// Whatever partial refunds are asked, in whatever order, what is refunded never
        /// exceeds what was paid, each refund's money is exactly its ledger entry, and the
        /// balance after the last is the balance before plus everything refunded.
        #[test]
        fn refunds_never_exceed_what_was_paid(
            total in 1i64..1_000_000,
            asks in proptest::collection::vec(proptest::option::of(-10i64..600_000), 0..12),
            start in -1_000_000i64..1_000_000,
        ) {
            let account = AccountId::new();
            let mut current = order(account, total, OrderStatus::Completed, None);
            let (total, start) = (Cents(total), Cents(start));
            let mut funds = Funds { available: start, ..Funds::empty(&account.to_string()) };
            let mut refunded = Cents::ZERO;
            for amount in asks {
                match refund(Some(current.clone()), account, funds, ask(amount), &stamp(3)) {
                    Ok(change) => {
                        let refund = change.refund.unwrap();
                        prop_assert!(refund.amount.is_positive());
                        prop_assert_eq!(change.entry.amount, refund.amount);
                        prop_assert_eq!(change.entry.balance_after, funds.available + refund.amount);
                        prop_assert_eq!(change.entry.seq, funds.head.seq + 1);
                        refunded = refunded + refund.amount;
                        funds = Funds::after(&change.entry);
                        current = change.order;
                    }
                    Err(RefundRefused::ExceedsRemaining { remaining }) => {
                        prop_assert_eq!(remaining, total - refunded);
                    }
                    Err(other) => prop_assert!(false, "unexpected refusal {:?}", other),
                }
                prop_assert!(current.refunded <= total);
                prop_assert_eq!(current.refunded, refunded);
            }
            prop_assert_eq!(funds.available, start + refunded);
        }
    }
}
