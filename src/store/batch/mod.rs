//! The batching pipeline both engines run their orders through: what a batch must read, the
//! decision of each order in turn on what it read, and the rows and answers that decision
//! leaves. An engine only reads the view (`Wants` in, `OrderView` out) and writes the rows
//! (`Decisions`) as one atomic write, then answers once that write is durable:
//!
//! ```text
//! queue ──drain──▶ Wants::of ──engine reads──▶ OrderView ──decide──▶ Decisions
//!        ──engine writes, one commit──▶ durable ──▶ Decisions::answers
//! ```
//!
//! The decision is `domain::placing::place`'s, taken here for every order of every engine:
//! the second order of an account sees the first one's debit, a second use of a key in the
//! batch finds it taken, and a refusal writes nothing and leaves the others standing.
//!
//! Which waiting orders form a batch is decided here too (`queue`: none of an account that a
//! batch in flight holds). The runners that drain it stay each engine's own, because what
//! they must order differs: sled
//! runs every write of the process on one writer thread (orders beside cancels, credits and
//! key revocations, each marked for the reads that wait on it), while PostgreSQL runs a few
//! batches at once on pooled connections and lets the row locks order them.

mod queue;

pub(super) use queue::{Pending, Queue};

use std::collections::HashMap;

use crate::domain::chain::Funds;
use crate::domain::idempotency_key::IdempotencyKey;
use crate::domain::ids::{AccountId, Id, IdKind, OrderId};
use crate::domain::ledger::LedgerEntry;
use crate::domain::order::Order;
use crate::domain::placing::{place, OrderStamp, Placed};
use crate::domain::product::Product;
use crate::domain::time::{expiry_after, Millis};
use crate::store::{KeyRecord, NewOrder, OrderRefusal, StoreError, StoredResponse};

/// Orders in one batch at most: a batch holds its locks (sled's one transaction lock, which
/// every read waits for; PostgreSQL's row locks) until it is written, so past this it holds
/// them longer than the commit it saves.
pub(super) const MAX_ORDERS: usize = 64;

/// What a batch of orders must read before it is decided.
pub(super) struct Wants {
    /// The accounts whose balances it debits, sorted and without repeats: the order in which
    /// an engine that locks them must lock them.
    pub(crate) accounts: Vec<AccountId>,
    /// The key of each order, in batch order (repeats included).
    pub(crate) keys: Vec<(AccountId, IdempotencyKey)>,
    /// The products its lines name, sorted and without repeats.
    pub(crate) products: Vec<String>,
}

impl Wants {
    pub(super) fn of(orders: &[&NewOrder]) -> Self {
        let mut accounts: Vec<AccountId> = orders.iter().map(|o| o.account.id).collect();
        accounts.sort();
        accounts.dedup();
        let keys = orders
            .iter()
            .map(|o| (o.account.id, o.claim.key.clone()))
            .collect();
        let mut products: Vec<String> = orders
            .iter()
            .flat_map(|o| o.lines.iter().map(|l| l.product_id.trim().to_string()))
            .collect();
        products.sort();
        products.dedup();
        Wants {
            accounts,
            keys,
            products,
        }
    }
}

/// What the engine read for a batch, as of one instant that no other write moves until the
/// batch is written (sled: its one writer; PostgreSQL: the locks taken while reading).
#[derive(Default)]
pub(super) struct OrderView {
    /// Every wanted account's balance and ledger head (an account missing here is a corrupt
    /// store).
    pub(crate) balances: HashMap<AccountId, Funds>,
    /// The wanted keys that already have a row, expired or not.
    pub(crate) stored: HashMap<(AccountId, String), Box<KeyRecord>>,
    /// The wanted products that exist, by id.
    pub(crate) catalog: HashMap<String, Product>,
    /// Each wanted account's newest ledger entry id, where several processes make them (an
    /// engine whose one writer makes every id leaves it empty): each entry is made after it,
    /// so an account's ledger lists its entries in the order its balance moved.
    pub(crate) newest_txn: HashMap<AccountId, Id>,
}

/// An accepted order's rows: the order, its debit, and its key's row holding the 200 body.
pub(super) struct Accepted {
    pub(crate) order: Order,
    pub(crate) entry: LedgerEntry,
    /// The ledger entry's id (`entry.id` parsed), which sled keys its ledger by.
    pub(crate) txn: Id,
    pub(crate) key_name: IdempotencyKey,
    pub(crate) key: KeyRecord,
}

/// How each order of a batch was decided, and the rows of those accepted.
pub(super) struct Decisions {
    /// Per order, in batch order: an index into `accepted`, or the refusal.
    decided: Vec<Result<usize, OrderRefusal>>,
    pub(crate) accepted: Vec<Accepted>,
    /// Each debited account's balance and ledger head after the whole batch, sorted by
    /// account.
    pub(crate) balances: Vec<(AccountId, Funds)>,
}

/// Decides each order in turn on `view` as the orders before it left it. `now` is the
/// batch's time, read by the engine once it holds what keeps the view still, so that an
/// account's ids and times follow its commits. An error (a balance missing from the view, a
/// product that does not decode) decides nothing: the engine then places the orders one by
/// one, so that only the bad one fails.
pub(super) fn decide(
    mut view: OrderView,
    orders: &[&NewOrder],
    now: Millis,
) -> Result<Decisions, StoreError> {
    // What each account had before the batch, for the invariant checked at its end.
    let before = view.balances.clone();
    let mut taken_here: HashMap<(AccountId, String), usize> = HashMap::new();
    let mut accepted: Vec<Accepted> = Vec::with_capacity(orders.len());
    let mut decided = Vec::with_capacity(orders.len());
    for new in orders {
        let account = new.account.id;
        let key = (account, new.claim.key.as_str().to_string());
        if let Some(row) = view.stored.get(&key) {
            decided.push(Err(OrderRefusal::KeyTaken(Some(row.clone()))));
            continue;
        }
        if let Some(&first) = taken_here.get(&key) {
            let row = Box::new(accepted[first].key.clone());
            decided.push(Err(OrderRefusal::KeyTaken(Some(row))));
            continue;
        }
        let funds = *view
            .balances
            .get(&account)
            .ok_or_else(|| StoreError::Corrupt(format!("account {account} has no balance")))?;
        let txn = Id::after(IdKind::Transaction, view.newest_txn.get(&account).copied());
        let stamp = OrderStamp {
            now,
            order: OrderId::new(),
            txn,
        };
        let catalog = &view.catalog;
        let lookup = |id: &str| Ok::<_, StoreError>(catalog.get(id).cloned());
        let Placed { order, entry } = match place(&new.terms(), lookup, funds, stamp)? {
            Ok(placed) => placed,
            Err(refused) => {
                decided.push(Err(refused.into()));
                continue;
            }
        };
        let body = new.answer(&order, entry.balance_after);
        view.balances.insert(account, Funds::after(&entry));
        view.newest_txn.insert(account, txn);
        taken_here.insert(key, accepted.len());
        decided.push(Ok(accepted.len()));
        accepted.push(Accepted {
            order,
            entry,
            txn,
            key_name: new.claim.key.clone(),
            key: first_use(&new.claim, now, body),
        });
    }
    let mut balances: Vec<(AccountId, Funds)> = accepted
        .iter()
        .map(|a| (a.order.account_id, view.balances[&a.order.account_id]))
        .collect();
    balances.sort_by_key(|(account, _)| *account);
    balances.dedup_by_key(|(account, _)| *account);
    // What both engines write: each account's balance is where its entries lead.
    crate::domain::invariant::batch_adds_up(
        |account| before.get(&account).copied(),
        accepted.iter().map(|a| (a.order.account_id, &a.entry)),
        &balances,
    );
    Ok(Decisions {
        decided,
        accepted,
        balances,
    })
}

impl Decisions {
    /// Each order's answer, to send once the batch is durable: the accepted ones' bodies
    /// are moved out of their key rows (written by then), not copied.
    pub(super) fn answers(self) -> Vec<Result<Vec<u8>, OrderRefusal>> {
        let mut bodies: Vec<Option<Vec<u8>>> = self
            .accepted
            .into_iter()
            .map(|a| Some(a.key.response.body))
            .collect();
        self.decided
            .into_iter()
            .map(|d| d.map(|i| bodies[i].take().expect("one answer per accepted order")))
            .collect()
    }
}

/// A first use's key row: what the key was used for and the exact 200 sent, expiring the
/// claim's TTL after the commit's time.
pub(super) fn first_use(claim: &crate::store::KeyClaim, now: Millis, body: Vec<u8>) -> KeyRecord {
    KeyRecord {
        operation: claim.operation,
        fingerprint: claim.fingerprint,
        expires_at: expiry_after(now, claim.ttl),
        response: StoredResponse {
            status: 200,
            content_type: "application/json".into(),
            body,
        },
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::domain::account::Account;
    use crate::domain::basket::RequestedLine;
    use crate::domain::limits::{MAX_AMOUNT, MAX_QUANTITY};
    use crate::domain::money::Cents;
    use crate::store::NewOrder;

    fn product(id: &str, price: i64) -> Product {
        Product {
            id: id.into(),
            name: id.into(),
            price: Cents(price),
            regions: vec![],
            delivery_fields: vec![],
            active: true,
            updated_at: 0,
        }
    }

    fn line(id: &str, quantity: u64) -> RequestedLine {
        RequestedLine {
            product_id: id.into(),
            quantity,
            delivery_data: Default::default(),
        }
    }

    /// A value at an end of `low..=high`, or anywhere in it.
    fn near_edges(low: i64, high: i64) -> impl Strategy<Value = i64> {
        prop_oneof![
            proptest::sample::select(vec![low, low + 1, high - 1, high, 0.max(low), 1.max(low)]),
            low..=high,
        ]
    }

    proptest! {
        /// A batch of orders on accounts whose balances, credit lines and prices sit at the
        /// ends of their ranges is decided without a panic (invariant 8 holds), and every
        /// accepted order moves its account's running balance by exactly its total.
        #[test]
        fn a_batch_at_the_ends_of_every_range_adds_up(
            balances in proptest::collection::vec(near_edges(-MAX_AMOUNT, i64::MAX), 1..4),
            limits in proptest::collection::vec(near_edges(0, MAX_AMOUNT), 4),
            prices in proptest::collection::vec(near_edges(0, i64::MAX), 2),
            orders in proptest::collection::vec((0usize..4, 0usize..2, near_edges(1, MAX_QUANTITY), 0u8..3), 1..12),
        ) {
            let accounts: Vec<Account> = balances.iter().zip(&limits).map(|(_, limit)| Account::for_tests(*limit)).collect();
            let mut view = OrderView::default();
            for (account, balance) in accounts.iter().zip(&balances) {
                let funds = Funds { available: Cents(*balance), ..Funds::empty(&account.id.to_string()) };
                view.balances.insert(account.id, funds);
            }
            for (i, price) in prices.iter().enumerate() {
                view.catalog.insert(format!("prd_{i}"), product(&format!("prd_{i}"), *price));
            }
            let news: Vec<NewOrder> = orders
                .iter()
                .map(|(who, what, quantity, key)| {
                    let lines = vec![line(&format!("prd_{what}"), *quantity as u64)];
                    NewOrder::for_tests(&accounts[who % accounts.len()], &format!("k{key}"), lines, 1)
                })
                .collect();
            let refs: Vec<&NewOrder> = news.iter().collect();
            let mut running = view.balances.clone();
            let decisions = decide(view, &refs, 5).unwrap();
            for accepted in &decisions.accepted {
                let before = running[&accepted.order.account_id];
                let account = accepted.order.account_id.to_string();
                prop_assert!(crate::domain::chain::check(&account, &before, &accepted.entry).is_empty());
                prop_assert_eq!(accepted.entry.amount, -accepted.order.total);
                running.insert(accepted.order.account_id, Funds::after(&accepted.entry));
            }
            for (account, after) in &decisions.balances {
                prop_assert_eq!(running[account], *after);
            }
        }
    }
}
