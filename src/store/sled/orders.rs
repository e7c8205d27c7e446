//! Orders: the one transaction that prices, charges and records an order together with its
//! idempotency rows, and the reads partners make of their orders.

use sled::Transactional;

use super::accounts::{move_money, read_balance};
use super::codec;
use super::idempotency::KeyTrees;
use super::keys::{child_key, external_prefix};
use super::trees::{newest_first, trailing_id, Trees};
use super::tx::{settle, tx, NineTrees, TxResult};
use crate::domain::ids::{AccountId, Id, IdKind, OrderId};
use crate::domain::order::Order;
use crate::domain::placing::{self, place, OrderStamp};
use crate::domain::product::Product;
use crate::domain::time::Millis;
use crate::store::{NewOrder, OrderRefusal, Page, StoreError};

/// The trees an order's transaction touches, as seen inside it.
type OrderView = NineTrees;

/// One order to place with what is made for it outside the transaction (which sled may run
/// more than once): its ids and its time.
pub struct OrderPlan {
    pub new: NewOrder,
    order_id: OrderId,
    txn: Id,
    now: Millis,
}

impl OrderPlan {
    pub fn new(new: NewOrder, now: Millis) -> Self {
        OrderPlan {
            new,
            order_id: OrderId::new(),
            txn: Id::new(IdKind::Transaction),
            now,
        }
    }
}

/// What placing one order decided: the 200 body, or a refusal that wrote nothing.
pub type Placed = Result<Vec<u8>, OrderRefusal>;

/// Decides one order on the transaction's own view (so it sees the orders placed before it
/// in the same transaction) and writes it. Every refusal is decided before the first write,
/// so a refused order returns its refusal as a value and leaves the transaction as it was:
/// the other orders of a batch are unaffected.
fn place_one(view: &OrderView, plan: &OrderPlan) -> TxResult<Placed, OrderRefusal> {
    let (processing, products, balances, orders, by_account, by_external, ledger, keys, expiry) =
        view;
    let new = &plan.new;
    let account = new.account.id;
    let key_trees = KeyTrees { keys, expiry };
    if key_trees.is_taken(&account, &new.claim)? {
        return Ok(Err(OrderRefusal::KeyTaken(None)));
    }
    let lookup = |id: &str| -> TxResult<Option<Product>, OrderRefusal> {
        match tx(products.get(id.as_bytes()))? {
            Some(bytes) => Ok(Some(codec::decode(&bytes)?)),
            None => Ok(None),
        }
    };
    let stamp = OrderStamp {
        now: plan.now,
        order: plan.order_id,
        txn: plan.txn,
    };
    let before = read_balance(balances, &account)?;
    let placing::Placed { order, entry } = match place(&new.terms(), lookup, before, stamp)? {
        Ok(placed) => placed,
        Err(refused) => return Ok(Err(refused.into())),
    };
    let after = entry.balance_after;
    let order_key = plan.order_id.bytes();
    let account_key = account.bytes();
    tx(orders.insert(&order_key[..], codec::encode(&order)?))?;
    tx(processing.insert(&order_key[..], &[][..]))?;
    tx(by_account.insert(child_key(&account_key, &order_key), &[][..]))?;
    if let Some(external) = &new.external_order_id {
        let prefix = external_prefix(&account_key, external);
        tx(by_external.insert(child_key(&prefix, &order_key), &[][..]))?;
    }
    move_money(balances, ledger, &order.account_id, &plan.txn, &entry)?;
    let body = new.answer(&order, after);
    key_trees.record(&order.account_id, &new.claim, plan.now, body.clone())?;
    Ok(Ok(body))
}

impl Trees {
    fn order_trees(&self) -> [&sled::Tree; 9] {
        let (keys, expiry) = self.key_trees();
        [
            &self.processing,
            &self.products,
            &self.balances,
            &self.orders,
            &self.orders_by_account,
            &self.orders_by_external,
            &self.ledger,
            keys,
            expiry,
        ]
    }

    /// Places many orders in one transaction, each decided in turn on the transaction's own
    /// view: the second order of an account sees the first one's debit, and a second use of
    /// a key within the batch finds it taken. A refusal writes nothing and does not abort the
    /// others. One transaction per batch is what the writer saves: sled's global transaction
    /// lock, its batch marker in the log and, on a hot account, all but one write of the
    /// balance row. A storage or codec error aborts the whole transaction; the caller then
    /// places the orders one by one so that one bad order cannot fail the others.
    ///
    /// `new.render` turns each order and its new balance into the 200 body, which is stored
    /// as the replay and returned.
    pub fn place_orders(&self, plans: &[&OrderPlan]) -> Result<Vec<Placed>, StoreError> {
        let [a, b, c, d, e, f, g, h, i] = self.order_trees();
        let outcome = (a, b, c, d, e, f, g, h, i)
            .transaction(|view| plans.iter().map(|plan| place_one(view, plan)).collect());
        settle(outcome)?.map_err(|_: OrderRefusal| {
            StoreError::Corrupt("a batched order aborted its transaction".into())
        })
    }

    /// One order in a transaction of its own.
    pub fn place_order(&self, plan: &OrderPlan) -> Result<Placed, StoreError> {
        let [a, b, c, d, e, f, g, h, i] = self.order_trees();
        let outcome = (a, b, c, d, e, f, g, h, i).transaction(|view| place_one(view, plan));
        Ok(settle(outcome)?.unwrap_or_else(Err))
    }

    pub fn order(&self, order_id: &OrderId) -> Result<Option<Order>, StoreError> {
        Trees::get(&self.orders, order_id.bytes())
    }

    /// The account's orders (only those with `external_order_id` when given), newest first,
    /// strictly older than the cursor order.
    pub fn orders_page(
        &self,
        account: &AccountId,
        external_order_id: Option<&str>,
        before: Option<OrderId>,
        limit: usize,
    ) -> Result<Page<Order>, StoreError> {
        let account_key = account.bytes();
        let (tree, prefix) = match external_order_id {
            Some(external) => (
                &self.orders_by_external,
                external_prefix(&account_key, external),
            ),
            None => (&self.orders_by_account, account_key.to_vec()),
        };
        let keys = newest_first(tree, &prefix, before.map(|b| b.bytes()).as_ref(), limit)?;
        let mut items = Vec::with_capacity(keys.len().min(limit));
        for key in keys.iter().take(limit) {
            let id = trailing_id(key)?;
            let bytes = self
                .orders
                .get(id)?
                .ok_or_else(|| StoreError::Corrupt("order index points nowhere".into()))?;
            items.push(codec::decode(&bytes)?);
        }
        let next_cursor = if keys.len() > limit {
            items.last().map(|o: &Order| o.id.to_string())
        } else {
            None
        };
        Ok(Page { items, next_cursor })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::domain::account::{Account, Shortfall};
    use crate::domain::basket::RequestedLine;
    use crate::domain::fingerprint::{Fingerprint, Operation};
    use crate::domain::idempotency_key::IdempotencyKey;
    use crate::domain::order::BalanceView;
    use crate::store::KeyClaim;

    fn account(name: &str) -> Account {
        Account {
            id: AccountId::new(),
            name: name.into(),
            wholesale: true,
            credit_limit: 0,
            region: None,
            webhook_secret: "whsec_test".into(),
            created_at: 0,
        }
    }

    fn render(order: &Order, balance: &BalanceView) -> Vec<u8> {
        format!("{} {}", order.id, balance.available).into_bytes()
    }

    fn plan(account: &Account, key: &str, quantity: u64) -> OrderPlan {
        let new = NewOrder {
            account: account.clone(),
            lines: vec![RequestedLine {
                product_id: "prd_three".into(),
                quantity,
                delivery_data: Default::default(),
            }],
            currency: "USD".into(),
            callback_url: None,
            external_order_id: None,
            claim: KeyClaim {
                key: IdempotencyKey::parse(key.as_bytes()).unwrap(),
                operation: Operation::PlaceOrder,
                fingerprint: Fingerprint([quantity as u8; 32]),
                ttl: Duration::from_secs(3600),
            },
            render,
        };
        OrderPlan::new(new, 1)
    }

    #[test]
    fn one_transaction_decides_each_order_on_the_view_of_those_before_it_and_a_refusal_writes_nothing(
    ) {
        let dir = tempfile::tempdir().unwrap();
        let trees = Trees::open(&dir.path().join("db"), 1 << 20).unwrap();
        trees
            .put_product(&Product {
                id: "prd_three".into(),
                name: "three".into(),
                price: 3,
                regions: vec![],
                delivery_fields: vec![],
                active: true,
                updated_at: 0,
            })
            .unwrap();
        let (rich, poor) = (account("rich"), account("poor"));
        for (who, balance) in [(&rich, 10i64), (&poor, 1)] {
            trees.create_account(who).unwrap();
            let encoded = codec::encode(&balance).unwrap();
            trees.balances.insert(who.id.bytes(), encoded).unwrap();
        }
        let plans = [
            plan(&rich, "first", 1),  // 10 -> 7
            plan(&poor, "poor", 1),   // 1 < 3: refused
            plan(&rich, "second", 2), // 7 -> 1: sees the first debit
            plan(&rich, "first", 1),  // the key the first order took in this batch
            plan(&rich, "third", 1),  // 1 < 3: refused, because of the second debit
        ];
        let outcomes = trees
            .place_orders(&plans.iter().collect::<Vec<_>>())
            .unwrap();

        assert!(outcomes[0].is_ok());
        assert!(matches!(
            outcomes[1],
            Err(OrderRefusal::Shortfall(Shortfall::InsufficientBalance))
        ));
        assert!(outcomes[2].is_ok());
        assert!(matches!(outcomes[3], Err(OrderRefusal::KeyTaken(None))));
        assert!(matches!(outcomes[4], Err(OrderRefusal::Shortfall(_))));
        assert_eq!(trees.balance(&rich.id).unwrap(), 1);
        assert_eq!(trees.balance(&poor.id).unwrap(), 1);
        assert_eq!(trees.orders.len(), 2, "only the two accepted orders exist");
        assert_eq!(trees.ledger.len(), 2, "one charge per accepted order");
        assert_eq!(trees.idem_keys.len(), 2, "refused orders took no key");
        let first = trees
            .replay_lookup(&rich.id, &IdempotencyKey::parse(b"first").unwrap())
            .unwrap()
            .unwrap();
        assert_eq!(
            first.response.body,
            outcomes[0].as_ref().unwrap().as_slice(),
            "the stored replay is the first order's own answer"
        );
    }
}
