//! Every decision that moves money, driven at the ends of its ranges: balances, credit lines,
//! prices, quantities and amounts at 0, 1, the API's limits and i64's ends. Each answer must be
//! a documented refusal or a success whose money adds up exactly; an invariant's panic (which
//! stops the real process) fails the test. A cancel near i64::MAX once did exactly that: its
//! return saturated while invariant 1 demanded the exact sum.

use proptest::prelude::*;

use super::account::Account;
use super::basket::RequestedLine;
use super::chain::Funds;
use super::ids::{Id, IdKind, OrderId};
use super::lifecycle::{cancel, complete, refund, CancelRefused, RefundAsk, RefundRefused, Stamp};
use super::limits::{MAX_AMOUNT, MAX_QUANTITY};
use super::money::Cents;
use super::money_in::{money_in, Incoming};
use super::order::{Order, OrderStatus};
use super::placing::{place, OrderRefused, OrderStamp, OrderTerms};
use super::product::Product;
use crate::domain::ledger::LedgerReason;

/// The values where arithmetic on money breaks if it breaks anywhere.
const EDGES: [i64; 17] = [
    i64::MIN,
    i64::MIN + 1,
    -MAX_AMOUNT - 1,
    -MAX_AMOUNT,
    -1,
    0,
    1,
    2,
    MAX_AMOUNT - 1,
    MAX_AMOUNT,
    MAX_AMOUNT + 1,
    i64::MAX - MAX_AMOUNT,
    i64::MAX - MAX_AMOUNT + 1,
    i64::MAX - 2,
    i64::MAX - 1,
    i64::MAX,
    i64::MAX / 2,
];

/// Mostly an edge, sometimes anything in between, always within `low..=high`.
fn near_edges(low: i64, high: i64) -> impl Strategy<Value = i64> {
    let edges: Vec<i64> = EDGES
        .iter()
        .copied()
        .filter(|v| (low..=high).contains(v))
        .chain([
            low,
            low.saturating_add(1).min(high),
            high.saturating_sub(1).max(low),
            high,
        ])
        .collect();
    prop_oneof![
        3 => proptest::sample::select(edges),
        1 => low..=high,
    ]
}

#[derive(Debug, Clone)]
enum Step {
    Place {
        price: i64,
        quantity: u64,
    },
    Cancel {
        which: usize,
    },
    Complete {
        which: usize,
    },
    Refund {
        which: usize,
        amount: Option<i64>,
    },
    /// An admin credit or a provider's payment (the same decision): any amount the domain
    /// may be handed, also past the API's bound.
    MoneyIn {
        amount: i64,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (near_edges(0, i64::MAX), near_edges(1, MAX_QUANTITY)).prop_map(|(price, q)| Step::Place {
            price,
            quantity: q as u64
        }),
        (0usize..6).prop_map(|which| Step::Cancel { which }),
        (0usize..6).prop_map(|which| Step::Complete { which }),
        (
            0usize..6,
            proptest::option::of(near_edges(i64::MIN, i64::MAX))
        )
            .prop_map(|(which, amount)| Step::Refund { which, amount }),
        near_edges(1, i64::MAX).prop_map(|amount| Step::MoneyIn { amount }),
    ]
}

fn stamp() -> Stamp {
    Stamp {
        now: 2,
        txn: Id::new(IdKind::Transaction),
        event: Id::new(IdKind::Event),
    }
}

fn product(price: i64) -> Product {
    Product {
        id: "prd_edge".into(),
        name: "edge".into(),
        price: Cents(price),
        regions: vec![],
        delivery_fields: vec![],
        active: true,
        updated_at: 0,
    }
}

/// `balance` on `who`'s empty ledger.
fn holding(who: &Account, balance: Cents) -> Funds {
    Funds {
        available: balance,
        ..Funds::empty(&who.id.to_string())
    }
}

/// One order of `quantity` at `price` on `funds`, decided as both engines decide it.
fn place_one(
    who: &Account,
    price: i64,
    quantity: u64,
    funds: Funds,
) -> Result<(Order, super::ledger::LedgerEntry), OrderRefused> {
    let lines = [RequestedLine {
        product_id: "prd_edge".into(),
        quantity,
        delivery_data: Default::default(),
    }];
    let terms = OrderTerms {
        account: who,
        lines: &lines,
        currency: "USD",
        callback_url: None,
        external_order_id: None,
    };
    let stamp = OrderStamp {
        now: 1,
        order: OrderId::new(),
        txn: Id::new(IdKind::Transaction),
    };
    let lookup = |_: &str| Ok::<_, std::convert::Infallible>(Some(product(price)));
    match place(&terms, lookup, funds, stamp) {
        Ok(decided) => decided.map(|placed| (placed.order, placed.entry)),
        Err(never) => match never {},
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// Whatever the balance, credit line and amounts, every decision either refuses with its
    /// documented reason (and the arithmetic shows why) or moves the balance by exactly its
    /// entry's amount, within the credit line when it takes money; none panics.
    #[test]
    fn every_money_decision_at_the_ends_of_its_ranges_refuses_or_adds_up(
        start in near_edges(-MAX_AMOUNT, i64::MAX),
        credit_limit in near_edges(0, MAX_AMOUNT),
        steps in proptest::collection::vec(step(), 1..24),
    ) {
        let who = Account::for_tests(credit_limit);
        let limit = Cents(credit_limit);
        let account = who.id.to_string();
        let mut funds = holding(&who, Cents(start));
        let mut orders: Vec<Order> = Vec::new();
        for step in steps {
            let moved = match step {
                Step::Place { price, quantity } => match place_one(&who, price, quantity, funds) {
                    Ok((order, entry)) => {
                        prop_assert!(entry.balance_after >= -limit);
                        orders.push(order);
                        Some(entry)
                    }
                    Err(OrderRefused::Shortfall(_)) => {
                        let total = Cents(price).times(quantity);
                        let fits = total
                            .and_then(|t| funds.available.checked_sub(t))
                            .is_some_and(|after| after >= -limit);
                        prop_assert!(!fits, "refused an order the balance covers");
                        None
                    }
                    Err(OrderRefused::Basket(_)) => {
                        let total = Cents(price).times(quantity);
                        prop_assert!(price == 0 || total.is_none(), "a basket refused for neither its price nor its total");
                        None
                    }
                },
                Step::Cancel { which } => {
                    let Some(order) = orders.get(which).cloned() else { continue };
                    match cancel(Some(order.clone()), who.id, funds, &stamp()) {
                        Ok(change) => {
                            orders[which] = change.order;
                            Some(change.entry)
                        }
                        Err(CancelRefused::BalanceTooLarge) => {
                            prop_assert!(funds.available.checked_add(order.total).is_none());
                            None
                        }
                        Err(CancelRefused::NotCancellable(status)) => {
                            prop_assert_ne!(status, OrderStatus::Processing);
                            None
                        }
                        Err(CancelRefused::NotFound) => {
                            prop_assert!(false, "the account's own order was not found");
                            None
                        }
                    }
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
                    match refund(Some(order.clone()), who.id, funds, ask, &stamp()) {
                        Ok(change) => {
                            orders[which] = change.order;
                            Some(change.entry)
                        }
                        Err(RefundRefused::BalanceTooLarge) => {
                            let asked = amount.map_or(order.refundable(), Cents);
                            prop_assert!(funds.available.checked_add(asked).is_none());
                            None
                        }
                        Err(RefundRefused::ExceedsRemaining { remaining }) => {
                            let asked = amount.map_or(remaining, Cents);
                            prop_assert!(asked > remaining || !asked.is_positive());
                            None
                        }
                        Err(RefundRefused::NotRefundable(status)) => {
                            prop_assert_ne!(status, OrderStatus::Completed);
                            None
                        }
                        Err(RefundRefused::NotFound) => {
                            prop_assert!(false, "the account's own order was not found");
                            None
                        }
                    }
                }
                Step::MoneyIn { amount } => {
                    let txn = Id::new(IdKind::Transaction);
                    let incoming = Incoming { amount: Cents(amount), reason: LedgerReason::Credit, reference: "c".into() };
                    let entry = money_in(who.id, funds, incoming, &txn, 4);
                    prop_assert_eq!(entry.is_none(), funds.available.checked_add(Cents(amount)).is_none());
                    entry
                }
            };
            if let Some(entry) = moved {
                prop_assert_eq!(funds.available.checked_add(entry.amount), Some(entry.balance_after));
                prop_assert!(super::chain::check(&account, &funds, &entry).is_empty());
                funds = Funds::after(&entry);
            }
            for order in &orders {
                prop_assert!(Cents::ZERO <= order.refunded && order.refunded <= order.total);
            }
        }
    }
}

/// An order of `total` kept `processing` on an account whose balance is `balance`.
fn processing(account: &Account, total: i64) -> Order {
    Order {
        id: OrderId::new(),
        account_id: account.id,
        status: OrderStatus::Processing,
        items: vec![],
        total: Cents(total),
        currency: "USD".into(),
        callback_url: None,
        external_order_id: None,
        refunded: Cents::ZERO,
        created_at: 1,
        updated_at: 1,
    }
}

#[test]
fn a_cancel_whose_return_would_not_fit_is_refused_and_one_that_just_fits_is_made() {
    let who = Account::for_tests(0);
    let order = processing(&who, 999);
    let near_max = Cents(i64::MAX - 998);
    assert_eq!(
        cancel(
            Some(order.clone()),
            who.id,
            holding(&who, near_max),
            &stamp()
        )
        .unwrap_err(),
        CancelRefused::BalanceTooLarge
    );
    let change = cancel(
        Some(order),
        who.id,
        holding(&who, Cents(i64::MAX - 999)),
        &stamp(),
    )
    .unwrap();
    assert_eq!(change.entry.balance_after, Cents(i64::MAX));
}

#[test]
fn a_refund_whose_return_would_not_fit_is_refused_and_one_that_just_fits_is_made() {
    let who = Account::for_tests(0);
    let mut order = processing(&who, 999);
    order.status = OrderStatus::Completed;
    let ask = |amount: i64| RefundAsk {
        amount: Some(Cents(amount)),
        reason: None,
        id: Id::new(IdKind::Refund),
    };
    assert_eq!(
        refund(
            Some(order.clone()),
            who.id,
            holding(&who, Cents(i64::MAX - 1)),
            ask(2),
            &stamp()
        )
        .unwrap_err(),
        RefundRefused::BalanceTooLarge
    );
    let change = refund(
        Some(order),
        who.id,
        holding(&who, Cents(i64::MAX - 1)),
        ask(1),
        &stamp(),
    )
    .unwrap();
    assert_eq!(change.entry.balance_after, Cents(i64::MAX));
}
