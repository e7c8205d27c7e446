//! Placing an order, decided once for every engine: the basket priced from the catalog as
//! the commit sees it, then the debit of the balance as the commit sees it. A refusal writes
//! nothing; an acceptance is the order's row and its ledger entry.

use super::account::{debit, Account, Shortfall};
use super::basket::{price_basket, BasketRejection, RequestedLine};
use super::callback_url::CallbackUrl;
use super::chain::{Funds, Movement};
use super::ids::{Id, OrderId};
use super::invariant;
use super::ledger::{LedgerEntry, LedgerReason};
use super::money::Cents;
use super::order::{Order, OrderStatus};
use super::product::Product;
use super::time::Millis;

/// What the partner asked for, borrowed from the request.
pub(crate) struct OrderTerms<'a> {
    pub(crate) account: &'a Account,
    pub(crate) lines: &'a [RequestedLine],
    pub(crate) currency: &'a str,
    pub(crate) callback_url: Option<&'a CallbackUrl>,
    pub(crate) external_order_id: Option<&'a str>,
}

/// The ids and time of one order, made by the engine at commit (see `lifecycle::Stamp`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct OrderStamp {
    pub(crate) now: Millis,
    pub(crate) order: OrderId,
    pub(crate) txn: Id,
}

/// Why no order was placed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum OrderRefused {
    Basket(BasketRejection),
    Shortfall(Shortfall),
}

/// An accepted order: its row (`processing`) and the entry that charges it, whose
/// `balance_after` is the account's new balance.
#[derive(Clone, Debug)]
pub(crate) struct Placed {
    pub(crate) order: Order,
    pub(crate) entry: LedgerEntry,
}

/// Prices `terms` with `lookup` (the catalog as the commit sees it) and debits `balance`.
/// `lookup` may fail (a storage read); that error is the caller's, not a refusal.
pub(crate) fn place<E>(
    terms: &OrderTerms<'_>,
    lookup: impl FnMut(&str) -> Result<Option<Product>, E>,
    funds: Funds,
    stamp: OrderStamp,
) -> Result<Result<Placed, OrderRefused>, E> {
    let region = terms.account.region.as_deref();
    let (items, total) = match price_basket(terms.lines, region, lookup)? {
        Ok(priced) => priced,
        Err(rejection) => return Ok(Err(OrderRefused::Basket(rejection))),
    };
    let after = match debit(funds.available, terms.account.credit_limit, total) {
        Ok(after) => after,
        Err(shortfall) => return Ok(Err(OrderRefused::Shortfall(shortfall))),
    };
    let order = Order {
        id: stamp.order,
        account_id: terms.account.id,
        status: OrderStatus::Processing,
        items,
        total,
        currency: terms.currency.to_string(),
        callback_url: terms.callback_url.map(|url| url.as_str().to_string()),
        external_order_id: terms.external_order_id.map(str::to_string),
        refunded: Cents::ZERO,
        created_at: stamp.now,
        updated_at: stamp.now,
    };
    let movement = Movement {
        id: stamp.txn.to_string(),
        amount: -total,
        reason: LedgerReason::Order,
        reference: order.id.to_string(),
        balance_after: after,
        created_at: stamp.now,
    };
    let entry = LedgerEntry::chained(&order.account_id.to_string(), &funds.head, movement);
    invariant::total_is_the_lines(&order);
    invariant::charged_its_total(&order, &entry);
    invariant::entry_moves_the_balance(&funds, &entry);
    invariant::within_credit_line(after, terms.account.credit_limit);
    Ok(Ok(Placed { order, entry }))
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use proptest::prelude::*;

    use super::*;
    use crate::domain::ids::IdKind;
    use crate::domain::lifecycle::{cancel, complete, refund, RefundAsk, Stamp};

    fn account(credit_limit: i64) -> Account {
        Account::for_tests(credit_limit)
    }

    fn product(price: i64) -> Product {
        Product {
            id: "prd_x".into(),
            name: "x".into(),
            price: Cents(price),
            regions: vec![],
            delivery_fields: vec![],
            active: true,
            updated_at: 0,
        }
    }

    fn line(quantity: u64) -> RequestedLine {
        RequestedLine {
            product_id: "prd_x".into(),
            quantity,
            delivery_data: Default::default(),
        }
    }

    fn order_stamp(now: Millis) -> OrderStamp {
        OrderStamp {
            now,
            order: OrderId::new(),
            txn: Id::new(IdKind::Transaction),
        }
    }

    fn place_at(
        who: &Account,
        quantity: u64,
        price: i64,
        balance: i64,
    ) -> Result<Placed, OrderRefused> {
        let funds = Funds {
            available: Cents(balance),
            ..Funds::empty(&who.id.to_string())
        };
        place_on(who, quantity, price, funds)
    }

    fn place_on(
        who: &Account,
        quantity: u64,
        price: i64,
        funds: Funds,
    ) -> Result<Placed, OrderRefused> {
        let lines = [line(quantity)];
        let terms = OrderTerms {
            account: who,
            lines: &lines,
            currency: "USD",
            callback_url: None,
            external_order_id: None,
        };
        let lookup = |_: &str| Ok::<_, Infallible>(Some(product(price)));
        match place(&terms, lookup, funds, order_stamp(1)) {
            Ok(decided) => decided,
            Err(never) => match never {},
        }
    }

    #[test]
    fn an_order_is_charged_its_total_and_leaves_the_rest() {
        let placed = place_at(&account(0), 3, 100, 1000).unwrap();
        assert_eq!(placed.order.total, Cents(300));
        assert_eq!(placed.order.status, OrderStatus::Processing);
        assert_eq!(
            (placed.entry.amount, placed.entry.balance_after),
            (Cents(-300), Cents(700))
        );
        assert_eq!(placed.entry.reference, placed.order.id.to_string());
    }

    #[test]
    fn the_shortfall_names_the_credit_line_only_when_the_account_has_one() {
        assert_eq!(
            place_at(&account(0), 1, 100, 99).unwrap_err(),
            OrderRefused::Shortfall(Shortfall::InsufficientBalance)
        );
        assert_eq!(
            place_at(&account(50), 1, 100, 49).unwrap_err(),
            OrderRefused::Shortfall(Shortfall::ExceedsCreditLimit)
        );
        assert!(place_at(&account(50), 1, 100, 50).is_ok());
    }

    #[derive(Debug, Clone)]
    enum Step {
        Place { quantity: u64 },
        Cancel { which: usize },
        Complete { which: usize },
        Refund { which: usize, amount: Option<i64> },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (1u64..20).prop_map(|quantity| Step::Place { quantity }),
            (0usize..8).prop_map(|which| Step::Cancel { which }),
            (0usize..8).prop_map(|which| Step::Complete { which }),
            ((0usize..8), proptest::option::of(0i64..2_000))
                .prop_map(|(which, amount)| Step::Refund { which, amount }),
        ]
    }

    proptest! {
        /// Any sequence of decisions on one account, each applied as an engine would apply
        /// it: the ledger sums to the balance, every entry's `balance_after` is the running
        /// sum, and the balance never falls below the credit line.
        #[test]
        fn the_ledger_of_any_sequence_of_decisions_sums_to_the_balance(
            start in 0i64..5_000,
            credit_limit in 0i64..2_000,
            price in 1i64..300,
            steps in proptest::collection::vec(step(), 0..40),
        ) {
            let who = account(credit_limit);
            let (start, credit_limit) = (Cents(start), Cents(credit_limit));
            let account = who.id.to_string();
            let mut funds = Funds { available: start, ..Funds::empty(&account) };
            let mut ledger: Vec<LedgerEntry> = Vec::new();
            let mut orders: Vec<crate::domain::order::Order> = Vec::new();
            let stamp = || Stamp { now: 2, txn: Id::new(IdKind::Transaction), event: Id::new(IdKind::Event) };
            for step in steps {
                let entry = match step {
                    Step::Place { quantity } => match place_on(&who, quantity, price, funds) {
                        Ok(placed) => { orders.push(placed.order); Some(placed.entry) }
                        Err(_) => None,
                    },
                    Step::Cancel { which } => {
                        let Some(order) = orders.get(which).cloned() else { continue };
                        cancel(Some(order), who.id, funds, &stamp()).ok().map(|c| {
                            orders[which] = c.order;
                            c.entry
                        })
                    }
                    Step::Complete { which } => {
                        let Some(order) = orders.get(which).cloned() else { continue };
                        if let Some((done, _)) = complete(order, Id::new(IdKind::Event), 3) {
                            orders[which] = done;
                        }
                        None
                    }
                    Step::Refund { which, amount } => {
                        let Some(order) = orders.get(which).cloned() else { continue };
                        let ask = RefundAsk { amount: amount.map(Cents), reason: None, id: Id::new(IdKind::Refund) };
                        refund(Some(order), who.id, funds, ask, &stamp()).ok().map(|c| {
                            orders[which] = c.order;
                            c.entry
                        })
                    }
                };
                if let Some(entry) = entry {
                    prop_assert_eq!(entry.balance_after, funds.available + entry.amount);
                    prop_assert!(crate::domain::chain::check(&account, &funds, &entry).is_empty());
                    funds = Funds::after(&entry);
                    ledger.push(entry);
                }
                prop_assert!(funds.available >= -credit_limit);
            }
            let sum: Cents = ledger.iter().map(|e| e.amount).sum();
            prop_assert_eq!(start + sum, funds.available);
            prop_assert_eq!(funds.head.seq, ledger.len() as u64);
            for order in &orders {
                prop_assert!(order.refunded <= order.total);
            }
        }
    }
}
