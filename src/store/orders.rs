//! Orders: the one transaction that prices, charges and records an order together with its
//! idempotency rows, and the reads partners make of their orders.

use super::accounts::{account_bytes, move_money, read_balance};
use super::idempotency::{KeyClaim, KeyTrees};
use super::keys::{child_key, external_prefix};
use super::{
    codec, newest_first, refuse, settle, trailing_id, tx, Page, Store, StoreError, TxResult,
};
use crate::domain::account::{debit, Account, Shortfall};
use crate::domain::basket::{price_basket, BasketRejection, RequestedLine};
use crate::domain::ids::Id;
use crate::domain::ledger::{LedgerEntry, LedgerReason};
use crate::domain::order::{BalanceView, Order, OrderStatus};
use crate::domain::product::Product;
use crate::domain::time::Millis;
use sled::Transactional;

/// Everything `place_order` needs, decided before the transaction: the closure may run more
/// than once, so ids and times are made here, not inside it.
pub struct NewOrder<'a> {
    pub account: &'a Account,
    pub order_id: Id,
    pub txn_id: Id,
    pub lines: &'a [RequestedLine],
    pub currency: &'a str,
    pub callback_url: Option<String>,
    pub external_order_id: Option<String>,
    pub now: Millis,
    pub claim: KeyClaim<'a>,
}

/// Why no order was placed; nothing was written.
#[derive(Debug, PartialEq, Eq)]
pub enum OrderRefusal {
    Basket(BasketRejection),
    Shortfall(Shortfall),
    /// A concurrent first use of the same key committed first: look the key up again.
    KeyTaken,
}

impl Store {
    /// One transaction: price the lines from the catalog as it is at commit, debit the
    /// account (ledger entry and balance), create the order (queued for fulfillment) and both
    /// idempotency rows.
    /// `render` turns the order and new balance into the 200 body, which is stored as the
    /// replay and returned, so the bytes sent and the bytes replayed are the same bytes.
    pub fn place_order(
        &self,
        new: &NewOrder,
        render: impl Fn(&Order, &BalanceView) -> Vec<u8>,
    ) -> Result<Result<Vec<u8>, OrderRefusal>, StoreError> {
        let account = account_bytes(&new.account.id)?;
        let order_key = new.order_id.bytes();
        let (responses, bindings, expiry) = self.key_trees();
        let trees = (
            &self.processing,
            &self.products,
            &self.balances,
            &self.orders,
            &self.orders_by_account,
            &self.orders_by_external,
            &self.ledger,
            responses,
            bindings,
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
                responses,
                bindings,
                expiry,
            )| {
                let key_trees = KeyTrees {
                    responses,
                    bindings,
                    expiry,
                };
                key_trees.require_free(Some(&new.claim), OrderRefusal::KeyTaken)?;
                let region = new.account.region.as_deref();
                let lookup = |id: &str| -> TxResult<Option<Product>, OrderRefusal> {
                    match tx(products.get(id.as_bytes()))? {
                        Some(bytes) => Ok(Some(codec::decode(&bytes)?)),
                        None => Ok(None),
                    }
                };
                let priced = price_basket(new.lines, region, lookup)?;
                let (items, total) = match priced {
                    Ok(priced) => priced,
                    Err(rejection) => return refuse(OrderRefusal::Basket(rejection)),
                };
                let before = read_balance(balances, &account)?;
                let after = match debit(before, new.account.credit_limit, total) {
                    Ok(after) => after,
                    Err(shortfall) => return refuse(OrderRefusal::Shortfall(shortfall)),
                };
                let order = Order {
                    id: new.order_id.to_string(),
                    account_id: new.account.id.clone(),
                    status: OrderStatus::Processing,
                    items,
                    total,
                    currency: new.currency.to_string(),
                    callback_url: new.callback_url.clone(),
                    external_order_id: new.external_order_id.clone(),
                    refunded: 0,
                    created_at: new.now,
                    updated_at: new.now,
                };
                tx(orders.insert(&order_key[..], codec::encode(&order)?))?;
                tx(processing.insert(&order_key[..], &[][..]))?;
                tx(by_account.insert(child_key(&account, &order_key), &[][..]))?;
                if let Some(external) = &new.external_order_id {
                    let prefix = external_prefix(&account, external);
                    tx(by_external.insert(child_key(&prefix, &order_key), &[][..]))?;
                }
                let entry = LedgerEntry {
                    id: new.txn_id.to_string(),
                    amount: -total,
                    reason: LedgerReason::Order,
                    reference: order.id.clone(),
                    balance_after: after,
                    created_at: new.now,
                };
                move_money(balances, ledger, &account, &entry)?;
                let body = render(
                    &order,
                    &BalanceView {
                        available: after,
                        credit_limit: new.account.credit_limit,
                        currency: new.currency.to_string(),
                    },
                );
                key_trees.record(&new.claim, body.clone())?;
                Ok(body)
            },
        );
        settle(outcome)
    }

    pub fn order(&self, order_id: &Id) -> Result<Option<Order>, StoreError> {
        match self.orders.get(order_id.bytes())? {
            Some(bytes) => Ok(Some(codec::decode(&bytes)?)),
            None => Ok(None),
        }
    }

    /// The account's orders (only those with `external_order_id` when given), newest first,
    /// strictly older than the cursor order.
    pub fn orders_page(
        &self,
        account: &Account,
        external_order_id: Option<&str>,
        before: Option<Id>,
        limit: usize,
    ) -> Result<Page<Order>, StoreError> {
        let account_key = account_bytes(&account.id)?;
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
            items.last().map(|o: &Order| o.id.clone())
        } else {
            None
        };
        Ok(Page { items, next_cursor })
    }
}
