//! What an order's transaction reads and writes, alone or in a batch (`batch.rs` places
//! batches with these): the catalog its lines name, the rows of the accepted orders, and one
//! order placed alone (a batch that was split): one READ COMMITTED transaction that takes the
//! key's lock, reads the catalog and locks the balance row (one round trip), then is decided
//! and written as a batch of one (`store::batch::decide`, `write_decisions`) before it
//! commits. The balance row's lock is what keeps two orders of one account from deciding on
//! the same balance.

use std::collections::HashMap;
use std::sync::LazyLock;

use super::codec;
use super::db::Conn;
use super::locks::key_taken;
use super::order_rows::write_orders;
use super::rows::lock_balance;
use super::tx::{first_cause, query, Fault, Tx};
use crate::domain::order::Order;
use crate::domain::product::Product;
use crate::domain::time::now_millis;
use crate::store::batch::{decide, Decisions, OrderView, Wants};
use crate::store::{NewOrder, OrderRefusal, StoreError};

pub(super) async fn place_order(
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
    let (taken, rows, locked) = match (taken, rows, balance) {
        (Ok(taken), Ok(rows), Ok(locked)) => (taken, rows, locked),
        (a, b, c) => return Err(first_cause([a.err(), b.err(), c.err()]).expect("one failed")),
    };
    if let Some(row) = taken {
        return Ok(Err(OrderRefusal::KeyTaken(row)));
    }
    let view = OrderView {
        balances: [(account, locked.funds)].into(),
        stored: Default::default(),
        catalog: catalog(&rows)?,
        newest_txn: locked
            .newest_txn
            .map(|id| (account, id))
            .into_iter()
            .collect(),
    };
    // Read under the balance row's lock, so the account's ids follow its commits.
    let decisions = decide(view, &[new], now_millis())?;
    write_decisions(&tx, &decisions).await?;
    gate.commit(tx).await?;
    Ok(decisions.answers().pop().expect("one order, one answer"))
}

/// The products an order's (or a batch's) lines name.
pub(super) static PRODUCTS_SQL: LazyLock<String> =
    LazyLock::new(|| format!("SELECT {} FROM products WHERE id = ANY($1)", codec::PRODUCT));

/// The products of `rows`, by id.
pub(super) fn catalog(
    rows: &[tokio_postgres::Row],
) -> Result<HashMap<String, Product>, StoreError> {
    rows.iter()
        .map(|row| codec::product(row).map(|p| (p.id.clone(), p)))
        .collect()
}

/// The accepted orders' rows and each account's final balance: one statement, whatever the
/// batch's size.
pub(super) async fn write_decisions(tx: &Tx<'_>, decisions: &Decisions) -> Result<(), Fault> {
    let accepted = &decisions.accepted;
    if accepted.is_empty() {
        return Ok(());
    }
    let orders: Vec<&Order> = accepted.iter().map(|a| &a.order).collect();
    let entries: Vec<_> = accepted
        .iter()
        .map(|a| (&a.order.account_id, &a.entry))
        .collect();
    let keys: Vec<_> = accepted
        .iter()
        .map(|a| (&a.order.account_id, a.key_name.as_str(), &a.key))
        .collect();
    write_orders(tx, &decisions.balances, &orders, &entries, &keys).await
}
