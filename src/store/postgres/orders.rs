//! Placing an order: one READ COMMITTED transaction that takes the key's lock, reads the
//! catalog and locks the balance row (one round trip), lets `domain::placing` price and
//! debit, and writes the order, the balance, its ledger entry and the key's row (one more)
//! before it commits. The balance row's lock is what keeps two orders of one account from
//! deciding on the same balance.

use std::collections::HashMap;

use deadpool_postgres::Object;
use futures_util::future::try_join4;

use super::codec;
use super::rows::{
    insert_key_row, insert_ledger, insert_order, key_row, lock_balance, set_balance,
};
use super::tx::{key_taken, pipelined3, query, Fault};
use crate::domain::ids::{Id, IdKind, OrderId};
use crate::domain::placing::{place, OrderStamp, Placed};
use crate::domain::product::Product;
use crate::domain::time::now_millis;
use crate::store::{NewOrder, OrderRefusal, StoreError};

pub async fn place_order(
    client: &mut Object,
    new: &NewOrder,
) -> Result<Result<Vec<u8>, OrderRefusal>, Fault> {
    let tx = client.transaction().await?;
    let account = new.account.id;
    let wanted: Vec<String> = new
        .lines
        .iter()
        .map(|l| l.product_id.trim().to_string())
        .collect();
    let products_sql = format!("SELECT {} FROM products WHERE id = ANY($1)", codec::PRODUCT);
    // Sent together: the key's lock and check, the catalog the lines are priced from, and
    // the balance row, locked to the commit.
    let (taken, rows, balance) = pipelined3(
        key_taken(&tx, &account, &new.claim.key),
        query(&tx, &products_sql, &[&wanted]),
        lock_balance(&tx, &account),
    )
    .await?;
    if let Some(row) = taken {
        return Ok(Err(OrderRefusal::KeyTaken(row)));
    }
    let mut catalog: HashMap<String, Product> = HashMap::with_capacity(rows.len());
    for row in &rows {
        let product = codec::product(row)?;
        catalog.insert(product.id.clone(), product);
    }
    // Made under the balance row's lock, so the account's ids follow its commits.
    let stamp = OrderStamp {
        now: now_millis(),
        order: OrderId::new(),
        txn: Id::new(IdKind::Transaction),
    };
    let lookup = |id: &str| Ok::<_, StoreError>(catalog.get(id).cloned());
    let Placed { order, entry } = match place(&new.terms(), lookup, balance, stamp)? {
        Ok(placed) => placed,
        Err(refused) => return Ok(Err(refused.into())),
    };
    let after = entry.balance_after;
    let body = new.answer(&order, after);
    let row = key_row(&new.claim, stamp.now, body);
    try_join4(
        set_balance(&tx, &account, after),
        insert_order(&tx, &order),
        insert_ledger(&tx, &account, &entry),
        insert_key_row(&tx, &account, new.claim.key.as_str(), &row),
    )
    .await?;
    tx.commit().await?;
    Ok(Ok(row.response.body))
}
