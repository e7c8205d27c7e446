//! Placing one order alone (a batch that was split): one READ COMMITTED transaction that
//! takes the key's lock, reads the catalog and locks the balance row (one round trip), then
//! decides and writes as a batch of one does (`batch::decide`, `batch::write_accepted`)
//! before it commits. The balance row's lock is what keeps two orders of one account from
//! deciding on the same balance.

use deadpool_postgres::Object;

use super::batch::{answers, decide, write_accepted, View, PRODUCTS_SQL};
use super::codec;
use super::rows::lock_balance;
use super::tx::{key_taken, pipelined3, query, Fault};
use crate::domain::time::now_millis;
use crate::store::{NewOrder, OrderRefusal};

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
    // Sent together: the key's lock and check, the catalog the lines are priced from, and
    // the balance row, locked to the commit.
    let (taken, rows, balance) = pipelined3(
        key_taken(&tx, &account, &new.claim.key),
        query(&tx, &PRODUCTS_SQL, &[&wanted]),
        lock_balance(&tx, &account),
    )
    .await?;
    if let Some(row) = taken {
        return Ok(Err(OrderRefusal::KeyTaken(row)));
    }
    // A batch of one: decided and written as every batch is.
    let mut view = View::default();
    view.balances.insert(account, balance);
    for row in &rows {
        let product = codec::product(row)?;
        view.catalog.insert(product.id.clone(), product);
    }
    // Made under the balance row's lock, so the account's ids follow its commits.
    let now = now_millis();
    let mut accepted = Vec::with_capacity(1);
    let decided = decide(&mut view, new, now, &mut accepted)?;
    write_accepted(&tx, &view, &accepted).await?;
    tx.commit().await?;
    Ok(answers(vec![decided], accepted)
        .pop()
        .expect("one order, one answer"))
}
