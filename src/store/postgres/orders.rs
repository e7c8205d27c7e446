//! Placing an order: one READ COMMITTED transaction that takes the key's lock, prices the
//! lines from the catalog, debits the balance with one conditional UPDATE (no read, so two
//! orders of one account never overwrite each other's debit, and never abort for it), and
//! writes the order, its ledger entry and the key's row before it commits.

use std::collections::HashMap;

use deadpool_postgres::Object;
use futures_util::future::try_join3;
use tokio_postgres::error::SqlState;

use super::codec;
use super::rows::{insert_key_row, insert_ledger, insert_order, key_row};
use super::tx::{key_taken, query, query_opt, Fault};
use crate::domain::account::Shortfall;
use crate::domain::basket::price_basket;
use crate::domain::ids::{Id, IdKind, OrderId};

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
    // Sent together: the key's lock and check, and the catalog the lines are priced from.
    let (taken, rows) = futures_util::future::try_join(
        key_taken(&tx, &account, &new.claim.key),
        query(&tx, &products_sql, &[&wanted]),
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
    let region = new.account.region.as_deref();
    let priced = price_basket(&new.lines, region, |id| {
        Ok::<_, StoreError>(catalog.get(id).cloned())
    })?;
    let (items, total) = match priced {
        Ok(priced) => priced,
        Err(rejection) => return Ok(Err(OrderRefusal::Basket(rejection))),
    };
    // The debit: one statement, decided by the row as it is when its lock is granted.
    let debited = query_opt(
        &tx,
        "UPDATE balances SET available = available - $1
         WHERE account_id = $2 AND available - $1 >= -credit_limit
         RETURNING available",
        &[&total, &account.to_string()],
    )
    .await;
    let shortfall = if new.account.credit_limit > 0 {
        Shortfall::ExceedsCreditLimit
    } else {
        Shortfall::InsufficientBalance
    };
    let after: i64 = match debited {
        Ok(Some(row)) => row.get(0),
        Ok(None) => return Ok(Err(OrderRefusal::Shortfall(shortfall))),
        // `available - total` does not fit in a bigint: far below any limit.
        Err(fault) if fault.is(&SqlState::NUMERIC_VALUE_OUT_OF_RANGE) => {
            return Ok(Err(OrderRefusal::Shortfall(shortfall)))
        }
        Err(fault) => return Err(fault),
    };
    // Made under the balance row's lock, so the account's ids follow its commits.
    let now = now_millis();
    let order = new.order(OrderId::new(), items, total, now);
    let entry = new.charge(&order, &Id::new(IdKind::Transaction).to_string(), after);
    let body = new.answer(&order, after);
    let row = key_row(&new.claim, now, body);
    try_join3(
        insert_order(&tx, &order),
        insert_ledger(&tx, &account, &entry),
        insert_key_row(&tx, &account, new.claim.key.as_str(), &row),
    )
    .await?;
    tx.commit().await?;
    Ok(Ok(row.response.body))
}
