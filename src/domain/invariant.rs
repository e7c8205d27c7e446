//! The money invariants, asserted where money moves: each decision of `placing.rs`,
//! `lifecycle.rs` and `money_in.rs`, and each batch of orders before an engine writes it
//! (`store/batch`). The tests and the random workload check the same rules from outside; these
//! catch a bug at the write that would break them, before the write is made.
//!
//! A broken invariant panics with a message that starts with `VIOLATED`. The binary's panic
//! hook (`main.rs`) then logs it and ends the process with status 1 on the spot, whichever
//! thread it is (a request's, the sled writer's): the write is not made, and nothing answers
//! after it, as after a failed flush. Better down than wrong. Each check is a few integer
//! operations; none reads storage.

use super::chain::Funds;
use super::ledger::{LedgerEntry, LedgerReason};
use super::money::Cents;
use super::order::Order;

/// How every invariant's panic message starts (what the panic hook looks for).
pub const VIOLATED: &str = "money invariant violated";

/// Panics with `VIOLATED` and what broke, unless `holds`.
#[track_caller]
fn require(holds: bool, what: std::fmt::Arguments<'_>) {
    if !holds {
        panic!("{VIOLATED}: {what}");
    }
}

/// Invariant 1: A ledger entry moves the balance by exactly its amount: `before + amount = after`,
/// with no overflow, and is the next link of the account's chain: the `seq` after the head's,
/// its `previous_hash` the head's hash.
#[track_caller]
pub(crate) fn entry_moves_the_balance(before: &Funds, entry: &LedgerEntry) {
    let after = before.available.checked_add(entry.amount);
    require(
        after == Some(entry.balance_after),
        format_args!(
            "ledger entry {} of {} on a balance of {} says {} after",
            entry.id, entry.amount.0, before.available.0, entry.balance_after.0
        ),
    );
    require(
        before.head.seq.checked_add(1) == Some(entry.seq)
            && entry.previous_hash == before.head.hash,
        format_args!(
            "ledger entry {} is seq {} on a head of seq {}, or does not link to its hash",
            entry.id, entry.seq, before.head.seq
        ),
    );
}

/// Invariant 2: A balance never goes below minus its credit line.
#[track_caller]
pub(crate) fn within_credit_line(balance: Cents, credit_limit: Cents) {
    require(
        balance.0 >= -credit_limit.0,
        format_args!(
            "a balance of {} is past its credit line of {}",
            balance.0, credit_limit.0
        ),
    );
}

/// Invariant 3: An order's total is the sum of its lines, each line its unit price times its quantity.
#[track_caller]
pub(crate) fn total_is_the_lines(order: &Order) {
    let mut sum = Some(Cents::ZERO);
    for line in &order.items {
        require(
            line.unit_price.times(line.quantity) == Some(line.amount),
            format_args!(
                "order {}: a line of {} x {} says {}",
                order.id, line.quantity, line.unit_price.0, line.amount.0
            ),
        );
        sum = sum.and_then(|s| s.checked_add(line.amount));
    }
    require(
        sum == Some(order.total),
        format_args!(
            "order {}: its lines do not sum to its total {}",
            order.id, order.total.0
        ),
    );
}

/// Invariant 4: An order is charged its total, once: its entry is an order debit of minus the total.
#[track_caller]
pub(crate) fn charged_its_total(order: &Order, entry: &LedgerEntry) {
    require(
        entry.reason == LedgerReason::Order
            && entry.amount == -order.total
            && entry.reference == order.id.to_string(),
        format_args!(
            "order {} of {} charged {} ({:?}, reference {})",
            order.id, order.total.0, entry.amount.0, entry.reason, entry.reference
        ),
    );
}

/// Invariant 5: What an order has had refunded is never more than its total, nor below zero.
#[track_caller]
pub(crate) fn refunded_within_total(order: &Order) {
    require(
        Cents::ZERO <= order.refunded && order.refunded <= order.total,
        format_args!(
            "order {} of {} has {} refunded",
            order.id, order.total.0, order.refunded.0
        ),
    );
}

/// Invariant 6: Money goes back (a cancel, a refund) or comes in (a credit, a provider payment) only in
/// positive amounts.
#[track_caller]
pub(crate) fn money_in_is_positive(entry: &LedgerEntry) {
    require(
        entry.amount.is_positive() && entry.reason != LedgerReason::Order,
        format_args!(
            "entry {} ({:?}) moves {} in",
            entry.id, entry.reason, entry.amount.0
        ),
    );
}

/// Invariant 7: A cancel returns exactly what the order was charged and not yet given back.
#[track_caller]
pub(crate) fn cancel_returns_the_rest(before: &Order, entry: &LedgerEntry) {
    require(
        entry.reason == LedgerReason::Cancel && entry.amount == before.total - before.refunded,
        format_args!(
            "a cancel of order {} (total {}, refunded {}) returns {}",
            before.id, before.total.0, before.refunded.0, entry.amount.0
        ),
    );
}

/// Invariant 8: A batch of orders leaves each account's balance at its balance before the batch plus
/// the batch's entries for it, each entry following the one before (`entries` in the order
/// the batch decided them). `before` and `after` give each account's balance.
#[track_caller]
pub(crate) fn batch_adds_up<'a, A: PartialEq + Copy + std::fmt::Debug + 'a>(
    before: impl Fn(A) -> Option<Funds>,
    entries: impl IntoIterator<Item = (A, &'a LedgerEntry)>,
    after: &[(A, Funds)],
) {
    let mut running: Vec<(A, Funds)> = Vec::new();
    for (account, entry) in entries {
        let balance = match running.iter().position(|(a, _)| *a == account) {
            Some(i) => running[i].1,
            None => {
                let start = before(account);
                require(
                    start.is_some(),
                    format_args!("account {account:?} has no balance before the batch"),
                );
                let Some(start) = start else { continue };
                running.push((account, start));
                start
            }
        };
        entry_moves_the_balance(&balance, entry);
        let slot = running.iter_mut().find(|(a, _)| *a == account);
        if let Some(slot) = slot {
            slot.1 = Funds::after(entry);
        }
    }
    require(
        running.len() == after.len(),
        format_args!(
            "the batch moved {} accounts and writes {} balances",
            running.len(),
            after.len()
        ),
    );
    for (account, written) in after {
        let moved = running.iter().find(|(a, _)| a == account).map(|(_, b)| *b);
        require(
            moved == Some(*written),
            format_args!(
                "account {account:?}: the batch writes {written:?} where its entries end at {moved:?}"
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    //! Each invariant seen firing on a planted bug (the wrong value a bug would produce), and
    //! holding on the right one.

    use std::panic::catch_unwind;

    use super::*;
    use crate::domain::ids::{AccountId, OrderId};
    use crate::domain::order::{OrderLine, OrderStatus};

    fn entry(amount: i64, after: i64, reason: LedgerReason, reference: &str) -> LedgerEntry {
        LedgerEntry {
            id: "txn_1".into(),
            amount: Cents(amount),
            reason,
            reference: reference.into(),
            balance_after: Cents(after),
            created_at: 1,
            seq: 1,
            hash: [1; 32],
            previous_hash: [0; 32],
        }
    }

    /// A balance of `cents` on an empty ledger whose genesis is all zeros, as `entry` links.
    fn funds(cents: i64) -> Funds {
        Funds {
            available: Cents(cents),
            head: crate::domain::chain::LedgerHead {
                seq: 0,
                hash: [0; 32],
            },
        }
    }

    /// `entry` made the one after `before`.
    fn after(before: &Funds, mut entry: LedgerEntry) -> LedgerEntry {
        entry.seq = before.head.seq + 1;
        entry.previous_hash = before.head.hash;
        entry.hash = [entry.seq as u8; 32];
        entry
    }

    fn order(lines: &[(u64, i64)], total: i64, refunded: i64) -> Order {
        Order {
            id: OrderId::new(),
            account_id: AccountId::new(),
            status: OrderStatus::Processing,
            items: lines
                .iter()
                .map(|&(quantity, price)| OrderLine {
                    product_id: "prd_x".into(),
                    quantity,
                    delivery_data: Default::default(),
                    unit_price: Cents(price),
                    amount: Cents(quantity as i64 * price),
                })
                .collect(),
            total: Cents(total),
            currency: "USD".into(),
            callback_url: None,
            external_order_id: None,
            refunded: Cents(refunded),
            created_at: 1,
            updated_at: 1,
        }
    }

    /// Whether `check` panics with the invariant's message.
    fn fires(check: impl FnOnce() + std::panic::UnwindSafe) -> bool {
        match catch_unwind(check) {
            Ok(()) => false,
            Err(payload) => payload
                .downcast_ref::<String>()
                .is_some_and(|m| m.starts_with(VIOLATED)),
        }
    }

    #[test]
    fn an_entry_that_moves_the_balance_by_another_amount_fires() {
        let right = entry(-300, 700, LedgerReason::Order, "ord_x");
        assert!(!fires(|| entry_moves_the_balance(&funds(1000), &right)));
        // The bug: the balance after computed from a stale balance.
        let stale = entry(-300, 800, LedgerReason::Order, "ord_x");
        assert!(fires(|| entry_moves_the_balance(&funds(1000), &stale)));
        // The bug: an addition that saturated instead of failing.
        let saturated = entry(5, i64::MAX, LedgerReason::Credit, "c");
        assert!(fires(|| entry_moves_the_balance(
            &funds(i64::MAX - 1),
            &saturated
        )));
    }

    #[test]
    fn an_entry_that_does_not_extend_the_head_fires() {
        let head = after(&funds(0), entry(10, 10, LedgerReason::Credit, "c"));
        let on = Funds::after(&head);
        let next = after(&on, entry(5, 15, LedgerReason::Credit, "c"));
        assert!(!fires(|| entry_moves_the_balance(&on, &next)));
        // The bug: the entry chained onto the head before the last (a stale head).
        let stale = after(&funds(10), entry(5, 15, LedgerReason::Credit, "c"));
        assert!(fires(|| entry_moves_the_balance(&on, &stale)));
        // The bug: the right seq, linked to another hash.
        let mut unlinked = next.clone();
        unlinked.previous_hash = [9; 32];
        assert!(fires(|| entry_moves_the_balance(&on, &unlinked)));
        // The end of the seq's range: no seq after u64::MAX.
        let mut last = on;
        last.head.seq = u64::MAX;
        let mut wrapped = next;
        wrapped.seq = 0;
        assert!(fires(|| entry_moves_the_balance(&last, &wrapped)));
    }

    #[test]
    fn a_balance_past_its_credit_line_fires() {
        assert!(!fires(|| within_credit_line(Cents(-50), Cents(50))));
        // The bug: the credit line compared with the wrong sign.
        assert!(fires(|| within_credit_line(Cents(-51), Cents(50))));
        assert!(fires(|| within_credit_line(Cents(-1), Cents(0))));
    }

    #[test]
    fn a_total_that_is_not_its_lines_fires() {
        assert!(!fires(|| total_is_the_lines(&order(
            &[(2, 100), (1, 50)],
            250,
            0
        ))));
        // The bug: the last line left out of the sum.
        assert!(fires(|| total_is_the_lines(&order(
            &[(2, 100), (1, 50)],
            200,
            0
        ))));
        // The bug: a line priced at one unit whatever its quantity.
        let mut wrong_line = order(&[(3, 100)], 300, 0);
        wrong_line.items[0].amount = Cents(100);
        wrong_line.total = Cents(100);
        assert!(fires(|| total_is_the_lines(&wrong_line)));
    }

    #[test]
    fn a_charge_other_than_the_total_fires() {
        let placed = order(&[(1, 400)], 400, 0);
        let id = placed.id.to_string();
        let right = entry(-400, 600, LedgerReason::Order, &id);
        assert!(!fires(|| charged_its_total(&placed, &right)));
        // The bug: the charge's sign lost.
        let credited = entry(400, 1400, LedgerReason::Order, &id);
        assert!(fires(|| charged_its_total(&placed, &credited)));
        // The bug: another order's id on the charge.
        let elsewhere = entry(-400, 600, LedgerReason::Order, "ord_other");
        assert!(fires(|| charged_its_total(&placed, &elsewhere)));
    }

    #[test]
    fn refunded_past_the_total_fires() {
        assert!(!fires(|| refunded_within_total(&order(
            &[(1, 400)],
            400,
            400
        ))));
        // The bug: a refund added twice.
        assert!(fires(|| refunded_within_total(&order(
            &[(1, 400)],
            400,
            800
        ))));
        assert!(fires(|| refunded_within_total(&order(
            &[(1, 400)],
            400,
            -1
        ))));
    }

    #[test]
    fn money_in_that_is_not_positive_fires() {
        assert!(!fires(|| money_in_is_positive(&entry(
            5,
            5,
            LedgerReason::Refund,
            "r"
        ))));
        // The bug: a refund of the negative amount the order was charged.
        assert!(fires(|| money_in_is_positive(&entry(
            -5,
            -5,
            LedgerReason::Refund,
            "r"
        ))));
        assert!(fires(|| money_in_is_positive(&entry(
            0,
            0,
            LedgerReason::Credit,
            "c"
        ))));
    }

    #[test]
    fn a_cancel_that_returns_more_or_less_than_the_rest_fires() {
        let placed = order(&[(1, 400)], 400, 0);
        let right = entry(400, 1400, LedgerReason::Cancel, "ord_x");
        assert!(!fires(|| cancel_returns_the_rest(&placed, &right)));
        // The bug: a cancel after a refund returning the whole total again.
        let partly = order(&[(1, 400)], 400, 100);
        assert!(fires(|| cancel_returns_the_rest(&partly, &right)));
    }

    #[test]
    fn a_batch_whose_balances_do_not_follow_its_entries_fires() {
        let before = |account: u8| Some(funds(if account == 1 { 1000 } else { 50 }));
        let first = after(&funds(1000), entry(-300, 700, LedgerReason::Order, "o1"));
        let second = after(
            &Funds::after(&first),
            entry(-200, 500, LedgerReason::Order, "o2"),
        );
        let other = after(&funds(50), entry(-50, 0, LedgerReason::Order, "o3"));
        let entries = || vec![(1u8, &first), (2u8, &other), (1u8, &second)];
        let written = [(1, Funds::after(&second)), (2, Funds::after(&other))];
        assert!(!fires(|| batch_adds_up(before, entries(), &written)));
        // The bug: the second order of an account decided on the balance before the first.
        let on_stale = after(&funds(1000), entry(-200, 800, LedgerReason::Order, "o2"));
        assert!(fires(|| batch_adds_up(
            before,
            vec![(1u8, &first), (1u8, &on_stale)],
            &[(1, Funds::after(&on_stale))]
        )));
        // The bug: the balance written is the first order's, not the last's.
        assert!(fires(|| batch_adds_up(
            before,
            entries(),
            &[(1, Funds::after(&first)), (2, Funds::after(&other))]
        )));
    }
}
