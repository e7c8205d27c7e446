//! An order's life after it is placed: fulfillment completes it, a cancel returns its money,
//! a refund returns part or all of it. Each change, its money, its event and its callback
//! are one transaction; the order row is locked for it (`FOR UPDATE`), so a cancel and a
//! completion of one order cannot both happen.

use deadpool_postgres::{Object, Transaction};
use futures_util::future::try_join_all;

use super::codec;
use super::rows::{
    insert_delivery, insert_event, insert_key_row, insert_ledger, insert_refund, key_row,
    update_order,
};
use super::tx::{key_taken, lock_events, query, query_opt, Fault};
use crate::domain::event::{Delivery, Event, EventKind};
use crate::domain::ids::{AccountId, Id, IdKind, OrderId};
use crate::domain::ledger::{LedgerEntry, LedgerReason};
use crate::domain::order::{Order, OrderStatus, Refund};
use crate::domain::time::{now_millis, Millis};
use crate::store::{CancelRefusal, CancelRequest, RefundRefusal, RefundRequest, StoreError};

/// The order, locked until the commit, if it belongs to `account`.
async fn lock_own_order(
    tx: &Transaction<'_>,
    id: &OrderId,
    account: &AccountId,
) -> Result<Option<Order>, Fault> {
    let sql = format!(
        "SELECT {} FROM orders WHERE id = $1 FOR UPDATE",
        codec::ORDER
    );
    match query_opt(tx, &sql, &[&id.to_string()]).await? {
        Some(row) => Ok(Some(codec::order(&row)?).filter(|o| o.account_id == *account)),
        None => Ok(None),
    }
}

/// Money going back to the account (a cancel's total, a refund's part): its ledger entry.
async fn give_back(
    tx: &Transaction<'_>,
    account: &AccountId,
    amount: i64,
    reason: LedgerReason,
    reference: String,
    now: Millis,
) -> Result<(), Fault> {
    // The debit this undoes fitted, so adding it back fits too; saturate rather than fail.
    let row = query_opt(
        tx,
        "UPDATE balances SET available = CASE WHEN available > 9223372036854775807 - $1
                 THEN 9223372036854775807 ELSE available + $1 END
         WHERE account_id = $2 RETURNING available",
        &[&amount, &account.to_string()],
    )
    .await?
    .ok_or_else(|| StoreError::Corrupt(format!("account {account} has no balance row")))?;
    let entry = LedgerEntry {
        id: Id::new(IdKind::Transaction).to_string(),
        amount,
        reason,
        reference,
        balance_after: row.get(0),
        created_at: now,
    };
    insert_ledger(tx, account, &entry).await
}

/// The event of a change and its first callback, due at once, when the order has a
/// callbackUrl. The caller holds the account's event lock, so the id follows the commits.
fn event_of(kind: EventKind, order: &Order, refund: Option<Refund>, now: Millis) -> Event {
    Event {
        id: Id::new(IdKind::Event).to_string(),
        kind,
        account_id: order.account_id,
        created_at: now,
        order: order.clone(),
        refund,
    }
}

/// Writes the event and, when its order has a callbackUrl, its first delivery.
async fn insert_event_and_callback(tx: &Transaction<'_>, event: &Event) -> Result<(), Fault> {
    match &event.order.callback_url {
        Some(url) => {
            let delivery = Delivery {
                event_id: event.id.clone(),
                account_id: event.account_id,
                url: url.clone(),
                attempt: 1,
            };
            futures_util::future::try_join(
                insert_event(tx, event),
                insert_delivery(tx, event.created_at, &delivery),
            )
            .await?;
        }
        None => insert_event(tx, event).await?,
    }
    Ok(())
}

/// The event of one order's change, its id made under the account's event lock.
async fn record_event(
    tx: &Transaction<'_>,
    kind: EventKind,
    order: &Order,
    refund: Option<Refund>,
    now: Millis,
) -> Result<(), Fault> {
    lock_events(tx, &order.account_id).await?;
    insert_event_and_callback(tx, &event_of(kind, order, refund, now)).await
}

pub async fn cancel_order(
    client: &mut Object,
    request: &CancelRequest,
) -> Result<Result<Vec<u8>, CancelRefusal>, Fault> {
    let tx = client.transaction().await?;
    let account = request.account;
    if let Some(claim) = &request.claim {
        if let Some(row) = key_taken(&tx, &account, &claim.key).await? {
            return Ok(Err(CancelRefusal::KeyTaken(row)));
        }
    }
    let Some(mut order) = lock_own_order(&tx, &request.order, &account).await? else {
        return Ok(Err(CancelRefusal::NotFound));
    };
    if order.status != OrderStatus::Processing {
        return Ok(Err(CancelRefusal::NotCancellable(order.status)));
    }
    let now = now_millis();
    order.status = OrderStatus::Cancelled;
    order.updated_at = now;
    update_order(&tx, &order).await?;
    let reference = order.id.to_string();
    give_back(
        &tx,
        &account,
        order.total,
        LedgerReason::Cancel,
        reference,
        now,
    )
    .await?;
    record_event(&tx, EventKind::OrderCancelled, &order, None, now).await?;
    let body = (request.render)(&order);
    if let Some(claim) = &request.claim {
        let row = key_row(claim, now, body.clone());
        insert_key_row(&tx, &account, claim.key.as_str(), &row).await?;
    }
    tx.commit().await?;
    Ok(Ok(body))
}

pub async fn refund_order(
    client: &mut Object,
    request: &RefundRequest,
) -> Result<Result<Vec<u8>, RefundRefusal>, Fault> {
    let tx = client.transaction().await?;
    let account = request.account;
    if let Some(row) = key_taken(&tx, &account, &request.claim.key).await? {
        return Ok(Err(RefundRefusal::KeyTaken(row)));
    }
    let Some(mut order) = lock_own_order(&tx, &request.order, &account).await? else {
        return Ok(Err(RefundRefusal::NotFound));
    };
    if order.status != OrderStatus::Completed {
        return Ok(Err(RefundRefusal::NotRefundable(order.status)));
    }
    let remaining = order.refundable();
    let amount = request.amount.unwrap_or(remaining);
    if amount > remaining || amount < 1 {
        return Ok(Err(RefundRefusal::ExceedsRemaining { remaining }));
    }
    let now = now_millis();
    order.refunded += amount;
    order.updated_at = now;
    let refund = Refund {
        id: Id::new(IdKind::Refund).to_string(),
        order_id: order.id,
        amount,
        reason: request.reason.clone(),
        created_at: now,
    };
    futures_util::future::try_join(update_order(&tx, &order), insert_refund(&tx, &refund)).await?;
    give_back(
        &tx,
        &account,
        amount,
        LedgerReason::Refund,
        refund.id.clone(),
        now,
    )
    .await?;
    record_event(
        &tx,
        EventKind::OrderRefunded,
        &order,
        Some(refund.clone()),
        now,
    )
    .await?;
    let body = (request.render)(&refund, &order);
    let row = key_row(&request.claim, now, body.clone());
    insert_key_row(&tx, &account, request.claim.key.as_str(), &row).await?;
    tx.commit().await?;
    Ok(Ok(body))
}

/// Completes up to `max` due `processing` orders in one transaction, each with its
/// `order.completed` event. Orders another transaction holds (a cancel) are skipped, not
/// waited for: the next pass sees what became of them.
pub async fn complete_due_orders(
    client: &mut Object,
    created_by: Millis,
    max: usize,
) -> Result<usize, Fault> {
    let tx = client.transaction().await?;
    let sql = format!(
        "SELECT {} FROM orders WHERE status = 'Processing' AND created_at <= $1
         ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED",
        codec::ORDER
    );
    let rows = query(&tx, &sql, &[&codec::time(created_by), &(max as i64)]).await?;
    if rows.is_empty() {
        return Ok(0);
    }
    let mut due = rows
        .iter()
        .map(codec::order)
        .collect::<Result<Vec<Order>, StoreError>>()?;
    // Event locks in one order, so that two passes never wait on each other in a cycle.
    due.sort_by_key(|o| (o.account_id, o.id));
    let now = now_millis();
    for order in &mut due {
        order.status = OrderStatus::Completed;
        order.updated_at = now;
    }
    let mut accounts: Vec<AccountId> = due.iter().map(|o| o.account_id).collect();
    accounts.dedup();
    // Sent as one pipeline each: the updates, the event locks (in account order), then the
    // events, whose ids are made once every lock is held.
    try_join_all(due.iter().map(|order| update_order(&tx, order))).await?;
    try_join_all(accounts.iter().map(|account| lock_events(&tx, account))).await?;
    let events: Vec<Event> = due
        .iter()
        .map(|order| event_of(EventKind::OrderCompleted, order, None, now))
        .collect();
    try_join_all(
        events
            .iter()
            .map(|event| insert_event_and_callback(&tx, event)),
    )
    .await?;
    tx.commit().await?;
    Ok(due.len())
}
