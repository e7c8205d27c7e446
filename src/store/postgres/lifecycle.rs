//! An order's life after it is placed: fulfillment completes it, a cancel returns its money,
//! a refund returns part or all of it, each decided in `domain::lifecycle`. Each change, its
//! money, its event and its callback are one transaction. The order row and the balance row
//! are locked for it (`FOR UPDATE`), so a cancel and a completion of one order cannot both
//! happen and no other write moves the balance between the read and the write.

use super::codec;
use super::db::{Conn, Gate};
use super::locks::{key_taken, lock_events};
use super::rows::{
    insert_delivery, insert_event, insert_key_rows, insert_refund, lock_balance, move_money,
    update_order,
};
use super::tx::{all, both, both4, query, query_opt, Fault, Tx};
use crate::domain::chain::Funds;
use crate::domain::event::Event;
use crate::domain::ids::{AccountId, Id, IdKind, OrderId};
use crate::domain::lifecycle::{self, Change, Emitted, Stamp};
use crate::domain::order::Order;
use crate::domain::time::now_millis;
use crate::store::writes::{Decided, OrderChange};
use crate::store::{KeyClaim, StoreError};
use tokio_postgres::error::SqlState;

/// The order, locked until the commit.
async fn lock_order(tx: &Tx<'_>, id: &OrderId) -> Result<Option<Order>, Fault> {
    let sql = format!(
        "SELECT {} FROM orders WHERE id = $1 FOR UPDATE",
        codec::ORDER
    );
    match query_opt(tx, &sql, &[&id.to_string()]).await? {
        Some(row) => Ok(Some(codec::order(&row)?)),
        None => Ok(None),
    }
}

/// What a cancel or a refund decides from, read in one round trip with every lock its write
/// needs: the order, the balance and the account's event lock (taken before the event's id
/// is made, so ids follow the commits), bounded by what is left of the lock bound (the
/// claim's, or without a claim `LOCK_TIMEOUT`). The stamp is made once they are all held.
/// `None` when a lock was held elsewhere past that bound: busy, nothing written.
async fn lock_view(
    tx: &Tx<'_>,
    gate: &Gate,
    order: &OrderId,
    account: &AccountId,
) -> Result<Option<(Option<Order>, Funds, Stamp)>, Fault> {
    let locked = both4(
        gate.limit_waits(tx),
        lock_order(tx, order),
        lock_balance(tx, account),
        lock_events(tx, account),
    )
    .await;
    let (order, locked, newest) =
        match locked.map(|((), order, balance, newest)| (order, balance, newest)) {
            Err(fault) if fault.is(&SqlState::LOCK_NOT_AVAILABLE) => return Ok(None),
            other => other?,
        };
    let stamp = Stamp {
        now: now_millis(),
        txn: Id::after(IdKind::Transaction, locked.newest_txn),
        event: Id::after(IdKind::Event, newest),
    };
    Ok(Some((order, locked.funds, stamp)))
}

/// Writes the event and, when it has one, its first callback.
async fn insert_emitted(tx: &Tx<'_>, emitted: &Emitted) -> Result<(), Fault> {
    let event: &Event = &emitted.event;
    match &emitted.delivery {
        Some(delivery) => {
            both(
                insert_event(tx, event),
                insert_delivery(tx, event.created_at, delivery),
            )
            .await?;
        }
        None => insert_event(tx, event).await?,
    }
    Ok(())
}

/// Writes a decided change, sent as one pipeline: the order, the refund, the money, the
/// event, and the key's row.
async fn write_change(
    tx: &Tx<'_>,
    account: &AccountId,
    claim: Option<&KeyClaim>,
    decided: &Decided<Change>,
) -> Result<(), Fault> {
    let change = &decided.rows;
    let refund_and_key = async {
        if let Some(refund) = &change.refund {
            insert_refund(tx, refund).await?;
        }
        match (claim, &decided.key) {
            (Some(claim), Some(row)) => {
                insert_key_rows(tx, &[(account, claim.key.as_str(), row)]).await
            }
            _ => Ok(()),
        }
    };
    both4(
        update_order(tx, &change.order),
        refund_and_key,
        move_money(tx, &change.order.account_id, &change.entry),
        insert_emitted(tx, &change.emitted),
    )
    .await?;
    Ok(())
}

/// A cancel or a refund (`OrderChange`): the key checked free, the order, the balance and the
/// event lock taken in one round trip, decided, and written in one pipeline before the COMMIT.
pub(super) async fn change_order<C: OrderChange>(
    client: &mut Conn,
    request: &C,
) -> Result<Result<Vec<u8>, C::Refusal>, Fault> {
    let (tx, gate) = client.begin().await?;
    let account = request.account();
    let claim = request.claim();
    if let Some(claim) = claim {
        if let Some(row) = key_taken(&tx, &gate, &account, claim).await? {
            return Ok(Err(C::key_taken(row)));
        }
    }
    let Some((order, funds, stamp)) = lock_view(&tx, &gate, request.order(), &account).await?
    else {
        return Ok(Err(C::key_taken(None)));
    };
    let decided = match request.decide(order, funds, &stamp)? {
        Ok(decided) => decided,
        Err(refused) => return Ok(Err(refused)),
    };
    write_change(&tx, &account, claim, &decided).await?;
    gate.commit(tx).await?;
    Ok(Ok(decided.body))
}

/// Completes up to `max` due `processing` orders in one transaction, oldest first, each with
/// its `order.completed` event. Orders another transaction holds (a cancel) are skipped, not
/// waited for: the next pass sees what became of them. The read walks the queue's index by
/// creation time (migration 0008), so a pass reads the due orders only, however many wait.
pub(super) async fn complete_due_orders(
    client: &mut Conn,
    created_by: crate::domain::time::Millis,
    max: usize,
) -> Result<usize, Fault> {
    let (tx, gate) = client.begin().await?;
    let sql = format!(
        "SELECT {} FROM orders WHERE status = 'Processing' AND created_at <= $1
         ORDER BY created_at, id LIMIT $2 FOR UPDATE SKIP LOCKED",
        codec::ORDER
    );
    let ((), rows) = both(
        gate.limit_waits(&tx),
        query(&tx, &sql, &[&codec::time(created_by), &(max as i64)]),
    )
    .await?;
    if rows.is_empty() {
        return Ok(0);
    }
    let mut due = rows
        .iter()
        .map(codec::order)
        .collect::<Result<Vec<Order>, StoreError>>()?;
    // Event locks in one order, so that two passes never wait on each other in a cycle.
    due.sort_by_key(|o| (o.account_id, o.id));
    let mut accounts: Vec<AccountId> = due.iter().map(|o| o.account_id).collect();
    accounts.dedup();
    let newest = all(accounts.iter().map(|account| lock_events(&tx, account))).await?;
    let mut newest: std::collections::HashMap<AccountId, Option<Id>> =
        accounts.iter().copied().zip(newest).collect();
    // Decided once every event lock is held, each id after its account's newest, so the
    // events' ids follow the commits.
    let now = now_millis();
    let completed: Vec<(Order, Emitted)> = due
        .into_iter()
        .filter_map(|order| {
            let last = newest.entry(order.account_id).or_default();
            let id = Id::after(IdKind::Event, *last);
            let done = lifecycle::complete(order, id, now)?;
            *last = Some(id);
            Some(done)
        })
        .collect();
    // Sent as one pipeline: the updates, then the events and their callbacks.
    all(completed.iter().map(|(order, _)| update_order(&tx, order))).await?;
    all(completed
        .iter()
        .map(|(_, emitted)| insert_emitted(&tx, emitted)))
    .await?;
    gate.commit(tx).await?;
    Ok(completed.len())
}
