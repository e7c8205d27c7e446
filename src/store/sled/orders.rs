//! Orders: the one transaction that prices, charges and records an order together with its
//! idempotency rows, and the reads partners make of their orders.

use sled::Transactional;

use super::accounts::{move_money, read_balance};
use super::codec;
use super::idempotency::KeyTrees;
use super::keys::{child_key, external_prefix};
use super::trees::{newest_first, trailing_id, Trees};
use super::tx::{refuse, settle, tx, TxResult};
use crate::domain::account::debit;
use crate::domain::basket::price_basket;
use crate::domain::ids::{AccountId, Id, IdKind, OrderId};
use crate::domain::order::Order;
use crate::domain::product::Product;
use crate::domain::time::Millis;
use crate::store::{NewOrder, OrderRefusal, Page, StoreError};

impl Trees {
    /// One transaction: price the lines from the catalog as it is at commit, debit the
    /// account (ledger entry and balance), create the order (queued for fulfillment) and both
    /// idempotency rows.
    /// `new.render` turns the order and new balance into the 200 body, which is stored as
    /// the replay and returned. Ids and the time are made here, before the closure, which
    /// sled may run more than once.
    pub fn place_order(
        &self,
        new: &NewOrder,
        now: Millis,
    ) -> Result<Result<Vec<u8>, OrderRefusal>, StoreError> {
        let account = new.account.id;
        let order_id = OrderId::new();
        let txn = Id::new(IdKind::Transaction);
        let order_key = order_id.bytes();
        let (keys, expiry) = self.key_trees();
        let trees = (
            &self.processing,
            &self.products,
            &self.balances,
            &self.orders,
            &self.orders_by_account,
            &self.orders_by_external,
            &self.ledger,
            keys,
            expiry,
        );
        let outcome = trees.transaction(
            |(
                processing,
                products,
                balances,
                orders,
                by_account,
                by_external,
                ledger,
                keys,
                expiry,
            )| {
                let key_trees = KeyTrees { keys, expiry };
                key_trees.require_free(&account, Some(&new.claim), OrderRefusal::KeyTaken(None))?;
                let region = new.account.region.as_deref();
                let lookup = |id: &str| -> TxResult<Option<Product>, OrderRefusal> {
                    match tx(products.get(id.as_bytes()))? {
                        Some(bytes) => Ok(Some(codec::decode(&bytes)?)),
                        None => Ok(None),
                    }
                };
                let priced = price_basket(&new.lines, region, lookup)?;
                let (items, total) = match priced {
                    Ok(priced) => priced,
                    Err(rejection) => return refuse(OrderRefusal::Basket(rejection)),
                };
                let before = read_balance(balances, &new.account.id)?;
                let after = match debit(before, new.account.credit_limit, total) {
                    Ok(after) => after,
                    Err(shortfall) => return refuse(OrderRefusal::Shortfall(shortfall)),
                };
                let order = new.order(order_id, items, total, now);
                let account = account.bytes();
                tx(orders.insert(&order_key[..], codec::encode(&order)?))?;
                tx(processing.insert(&order_key[..], &[][..]))?;
                tx(by_account.insert(child_key(&account, &order_key), &[][..]))?;
                if let Some(external) = &new.external_order_id {
                    let prefix = external_prefix(&account, external);
                    tx(by_external.insert(child_key(&prefix, &order_key), &[][..]))?;
                }
                let entry = new.charge(&order, &txn.to_string(), after);
                move_money(balances, ledger, &order.account_id, &txn, &entry)?;
                let body = new.answer(&order, after);
                key_trees.record(&order.account_id, &new.claim, now, body.clone())?;
                Ok(body)
            },
        );
        settle(outcome)
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
