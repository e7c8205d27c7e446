//! Placing one order alone (a batch that was split): one READ COMMITTED transaction that
//! takes the key's lock, reads the catalog and locks the balance row (one round trip), then
//! is decided and written as a batch of one (`store::batch::decide`,
//! `batch::write_decisions`) before it commits. The balance row's lock is what keeps two
//! orders of one account from deciding on the same balance.

use super::batch::{catalog, write_decisions, PRODUCTS_SQL};
use super::db::Conn;
use super::rows::lock_balance;
use super::tx::{first_cause, key_taken, query, Fault};
use crate::domain::time::now_millis;
use crate::store::batch::{decide, OrderView, Wants};
use crate::store::{NewOrder, OrderRefusal};

pub async fn place_order(
    client: &mut Conn,
    new: &NewOrder,
) -> Result<Result<Vec<u8>, OrderRefusal>, Fault> {
    let (tx, gate) = client.begin().await?;
    let account = new.account.id;
    let wants = Wants::of(&[new]);
    // Sent together: the key's lock and check, the catalog the lines are priced from, and
    // the balance row, locked to the commit.
    let (taken, rows, balance) = futures_util::future::join3(
        key_taken(&tx, &gate, &account, &new.claim),
        query(&tx, &PRODUCTS_SQL, &[&wants.products]),
        lock_balance(&tx, &account),
    )
    .await;
    // A key held elsewhere past the lock timeout aborts the transaction, and the statements
    // sent with it fail with 25P02, which is no reason: the answer is the key's (taken, its
    // row not yet visible), which the caller turns into a replay or the in-progress 409.
    if let Ok(Some(None)) = taken {
        return Ok(Err(OrderRefusal::KeyTaken(None)));
    }
    let (taken, rows, balance) = match (taken, rows, balance) {
        (Ok(taken), Ok(rows), Ok(balance)) => (taken, rows, balance),
        (a, b, c) => return Err(first_cause([a.err(), b.err(), c.err()]).expect("one failed")),
    };
    if let Some(row) = taken {
        return Ok(Err(OrderRefusal::KeyTaken(row)));
    }
    let view = OrderView {
        balances: [(account, balance)].into(),
        stored: Default::default(),
        catalog: catalog(&rows)?,
    };
    // Read under the balance row's lock, so the account's ids follow its commits.
    let decisions = decide(view, &[new], now_millis())?;
    write_decisions(&tx, &decisions).await?;
    gate.commit(tx).await?;
    Ok(decisions.answers().pop().expect("one order, one answer"))
}
