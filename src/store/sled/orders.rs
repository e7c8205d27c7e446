//! Orders: the one transaction that prices, charges and records an order together with its
//! idempotency rows, and the reads partners make of their orders.

use sled::Transactional;

use super::accounts::move_money;
use super::codec;
use super::idempotency::KeyTrees;
use super::keys::{child_key, external_prefix};
use super::spooled::Spooled;
use super::trees::{newest_first, trailing_id, Trees};
use super::tx::{settle, TxResult};
use crate::domain::chain::Funds;
use crate::domain::ids::{AccountId, OrderId};
use crate::domain::money::Cents;
use crate::domain::order::Order;
use crate::domain::time::Millis;
use crate::store::batch::{decide, Decisions, OrderView, Wants};
use crate::store::{NewOrder, OrderRefusal, Page, StoreError};

/// What placing one order decided: the 200 body, or a refusal that wrote nothing.
pub(super) type Placed = Result<Vec<u8>, OrderRefusal>;

impl Trees {
    /// Places a batch of orders through the engine-neutral pipeline: the view read directly
    /// (the writer thread, which runs this, is the only writer, so nothing moves it until
    /// the write below), decided by `store::batch::decide`, then one transaction that only
    /// writes. One transaction per batch is what the writer saves: sled's global transaction
    /// lock, its batch marker in the log and, on a hot account, all but one write of the
    /// balance row. An error decides nothing and writes nothing; the writer then places the
    /// orders one by one so that one bad order cannot fail the others.
    pub(super) fn place_orders(
        &self,
        orders: &[&NewOrder],
        now: Millis,
    ) -> Result<Vec<Placed>, StoreError> {
        let decisions = decide(self.order_view(&Wants::of(orders))?, orders, now)?;
        self.write_decisions(&decisions)?;
        for (account, funds) in &decisions.balances {
            self.heads.keep(*account, funds.head);
        }
        Ok(decisions.answers())
    }

    fn order_view(&self, wants: &Wants) -> Result<OrderView, StoreError> {
        let mut view = OrderView::default();
        for account in &wants.accounts {
            let funds = Funds {
                available: Trees::get(&self.balances, account.bytes())?.unwrap_or(Cents::ZERO),
                head: self.heads.of(&self.ledger, account)?,
            };
            view.balances.insert(*account, funds);
        }
        for (account, key) in &wants.keys {
            if let Some(row) = self.replay_lookup(account, key)? {
                view.stored
                    .insert((*account, key.as_str().to_string()), Box::new(row));
            }
        }
        for id in &wants.products {
            if let Some(product) = self.product(id)? {
                view.catalog.insert(id.clone(), product);
            }
        }
        Ok(view)
    }

    /// The accepted orders (`processing`, indexed by account and by external id), their
    /// debits and ledger entries, and their key rows.
    fn write_decisions(&self, decisions: &Decisions) -> Result<(), StoreError> {
        if decisions.accepted.is_empty() {
            return Ok(());
        }
        let trees = (
            &self.processing,
            &self.balances,
            &self.orders,
            &self.orders_by_account,
            &self.orders_by_external,
            &self.ledger,
            &self.idem_keys,
            &self.idem_expiry,
        );
        let outcome = trees.transaction(
            |(processing, balances, orders, by_account, by_external, ledger, keys, expiry)| -> TxResult<(), ()> {
                let key_trees = KeyTrees { keys, expiry, changes: &self.changes };
                for accepted in &decisions.accepted {
                    let order = &accepted.order;
                    let order_key = order.id.bytes();
                    let account_key = order.account_id.bytes();
                    self.changes.insert(Spooled::Order, orders, &order_key[..], codec::encode(order)?)?;
                    processing.set(&order_key[..], &[][..]);
                    by_account.set(child_key(&account_key, &order_key), &[][..]);
                    if let Some(external) = &order.external_order_id {
                        let prefix = external_prefix(&account_key, external);
                        by_external.set(child_key(&prefix, &order_key), &[][..]);
                    }
                    // An account's later debits in the batch overwrite its balance in the
                    // transaction, which leaves the last one.
                    move_money(&self.changes, balances, ledger, &order.account_id, &accepted.txn, &accepted.entry)?;
                    key_trees.write(&order.account_id, &accepted.key_name, &accepted.key)?;
                }
                Ok(())
            },
        );
        settle(outcome)?.map_err(|()| StoreError::Corrupt("a batch's write refused".into()))
    }

    pub(super) fn order(&self, order_id: &OrderId) -> Result<Option<Order>, StoreError> {
        Trees::get(&self.orders, order_id.bytes())
    }

    /// The account's orders (only those with `external_order_id` when given), newest first,
    /// strictly older than the cursor order.
    pub(super) fn orders_page(
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

/// Orders of one product at 3 cents, for the tests of this engine.
#[cfg(test)]
pub(super) mod three_cent_orders {
    use super::{NewOrder, Trees};
    use crate::domain::account::Account;
    use crate::domain::basket::RequestedLine;
    use crate::domain::money::Cents;
    use crate::domain::product::Product;

    /// Puts the product `prd_three` (3 cents, active) in `trees`.
    pub(in crate::store::sled) fn put_product(trees: &Trees) {
        trees
            .put_product(&Product {
                id: "prd_three".into(),
                name: "three".into(),
                price: Cents(3),
                regions: vec![],
                delivery_fields: vec![],
                active: true,
                updated_at: 0,
            })
            .unwrap();
    }

    /// `account`'s order of `quantity` of `prd_three` under idempotency key `key`.
    pub(in crate::store::sled) fn order(account: &Account, key: &str, quantity: u64) -> NewOrder {
        let line = RequestedLine {
            product_id: "prd_three".into(),
            quantity,
            delivery_data: Default::default(),
        };
        NewOrder::for_tests(account, key, vec![line], quantity as u8)
    }
}

#[cfg(test)]
mod tests {

    use super::three_cent_orders::{order, put_product};
    use super::*;
    use crate::domain::account::{Account, Shortfall};
    use crate::domain::idempotency_key::IdempotencyKey;
    use crate::domain::money::Cents;

    #[test]
    fn one_transaction_decides_each_order_on_the_view_of_those_before_it_and_a_refusal_writes_nothing(
    ) {
        let dir = tempfile::tempdir().unwrap();
        let trees = Trees::open(&dir.path().join("db"), 1 << 20).unwrap();
        put_product(&trees);
        let (rich, poor) = (Account::for_tests(0), Account::for_tests(0));
        for (who, balance) in [(&rich, Cents(10)), (&poor, Cents(1))] {
            trees.create_account(who).unwrap();
            let encoded = codec::encode(&balance).unwrap();
            trees.balances.insert(who.id.bytes(), encoded).unwrap();
        }
        let orders = [
            order(&rich, "first", 1),  // 10 -> 7
            order(&poor, "poor", 1),   // 1 < 3: refused
            order(&rich, "second", 2), // 7 -> 1: sees the first debit
            order(&rich, "first", 1),  // the key the first order took in this batch
            order(&rich, "third", 1),  // 1 < 3: refused, because of the second debit
        ];
        let outcomes = trees
            .place_orders(&orders.iter().collect::<Vec<_>>(), 1)
            .unwrap();

        assert!(outcomes[0].is_ok());
        assert!(matches!(
            outcomes[1],
            Err(OrderRefusal::Shortfall(Shortfall::InsufficientBalance))
        ));
        assert!(outcomes[2].is_ok());
        assert!(matches!(outcomes[3], Err(OrderRefusal::KeyTaken(Some(_)))));
        assert!(matches!(outcomes[4], Err(OrderRefusal::Shortfall(_))));
        assert_eq!(trees.funds(&rich.id).unwrap().available, Cents(1));
        assert_eq!(trees.funds(&poor.id).unwrap().head.seq, 0);
        assert_eq!(trees.funds(&rich.id).unwrap().head.seq, 2);
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
