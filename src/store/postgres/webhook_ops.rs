//! Webhook operations on PostgreSQL (docs/contract.md "7. Webhooks"): secret rotation, redelivery and recovery.
//!
//! A redelivery and the settling of an attempt of the same event hold one transaction-level
//! advisory lock (`lock_callback`), so one sees the other whole: a redelivery never misses
//! the retry an attempt just queued, and an attempt in flight on the entry a redelivery
//! replaced finds it changed (another due time) and only logs its outcome. The replaced
//! entry keeps its claim, so the redelivery waits for that attempt to settle (which releases
//! it) rather than being sent beside it by another instance.

use std::time::Duration;

use super::codec;
use super::db::Conn;
use super::rows::{insert_delivery, upsert_delivery_log, upsert_previous_secret};
use super::shared_cache::bump;
use super::tx::{both, both3, execute, query, query_opt, Fault, Session};
use crate::domain::event::{redelivery, DeliveryLog, Event};
use crate::domain::ids::{AccountId, Id};
use crate::domain::time::Millis;
use crate::domain::webhook_secret::{retire, PreviousSecret};
use crate::store::Redelivered;

/// Serializes everything that moves one event's callback: redeliveries and settlings.
pub(super) async fn lock_callback<C: Session>(c: &C, event_id: &str) -> Result<(), Fault> {
    let name = format!("callback:{event_id}");
    execute(
        c,
        "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
        &[&name],
    )
    .await?;
    Ok(())
}

/// Replaces the secret; returns the one replaced and the change every instance's copies of
/// the account must acknowledge (`shared_cache::bump`).
pub(super) async fn rotate_webhook_secret(
    client: &mut Conn,
    account: &AccountId,
    secret: &str,
    now: Millis,
    overlap: Duration,
) -> Result<Option<(PreviousSecret, i64)>, Fault> {
    let (tx, gate) = client.begin().await?;
    let id = account.to_string();
    let ((), row) = both(
        gate.limit_waits(&tx),
        query_opt(
            &tx,
            "SELECT webhook_secret FROM accounts WHERE id = $1 FOR NO KEY UPDATE",
            &[&id],
        ),
    )
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let previous = retire(row.get("webhook_secret"), now, overlap);
    let (_, _, version) = both3(
        execute(
            &tx,
            "UPDATE accounts SET webhook_secret = $2 WHERE id = $1",
            &[&id, &secret],
        ),
        upsert_previous_secret(&tx, account, &previous),
        // Instances keep accounts in memory beside their API keys.
        bump(&tx),
    )
    .await?;
    gate.commit(tx).await?;
    Ok(Some((previous, version)))
}

/// Queues one attempt of event `id`'s callback at `now`; `owner` limits it to that account's.
pub(super) async fn redeliver(
    client: &mut Conn,
    id: &Id,
    owner: Option<AccountId>,
    now: Millis,
) -> Result<Redelivered, Fault> {
    let (tx, gate) = client.begin().await?;
    let owner = owner.map(|a| a.to_string());
    let ((), row) = both(
        gate.limit_waits(&tx),
        query_opt(
            &tx,
            "SELECT snapshot FROM events WHERE id = $1 AND ($2::text IS NULL OR account_id = $2)",
            &[&id.to_string(), &owner],
        ),
    )
    .await?;
    let Some(row) = row else {
        return Ok(Redelivered::NotFound);
    };
    let event = codec::event(&row)?;
    let outcome = requeue(&tx, &event, None, now).await?;
    gate.commit(tx).await?;
    Ok(outcome)
}

/// Redelivers every callback of `account` given up at or after `since`; returns how many.
pub(super) async fn recover(
    client: &mut Conn,
    account: &AccountId,
    since: Millis,
    now: Millis,
) -> Result<u64, Fault> {
    // Candidates only (the domain decides, again under each callback's lock below).
    let rows = query(
        &**client,
        "SELECT e.snapshot, l.log FROM events e JOIN delivery_logs l ON l.event_id = e.id
         WHERE e.account_id = $1 AND l.log->>'ended' = 'GivenUp' ORDER BY e.id",
        &[&account.to_string()],
    )
    .await?;
    let mut candidates = Vec::new();
    for row in &rows {
        let log: DeliveryLog = codec::json(row, "log")?;
        if log.given_up_since(since) {
            candidates.push(codec::event(row)?);
        }
    }
    if candidates.is_empty() {
        return Ok(0);
    }
    let (tx, gate) = client.begin().await?;
    gate.limit_waits(&tx).await?;
    let mut requeued = 0;
    for event in &candidates {
        if requeue(&tx, event, Some(since), now).await? == Redelivered::Queued {
            requeued += 1;
        }
    }
    gate.commit(tx).await?;
    Ok(requeued)
}

/// Redelivers `event`'s callback inside `tx`; with `given_up_since`, only if its callback
/// (read under the lock) was still given up at or after then.
async fn requeue<C: Session>(
    tx: &C,
    event: &Event,
    given_up_since: Option<Millis>,
    now: Millis,
) -> Result<Redelivered, Fault> {
    lock_callback(tx, &event.id).await?;
    let (queued, log) = both(
        query_opt(
            tx,
            "SELECT event_id, due_at, account_id, url, attempt FROM outbox WHERE event_id = $1",
            &[&event.id],
        ),
        query_opt(
            tx,
            "SELECT log FROM delivery_logs WHERE event_id = $1",
            &[&event.id],
        ),
    )
    .await?;
    let queued = queued.as_ref().map(codec::delivery).transpose()?;
    let log: Option<DeliveryLog> = log.as_ref().map(|r| codec::json(r, "log")).transpose()?;
    if let Some(since) = given_up_since {
        if !log.as_ref().is_some_and(|l| l.given_up_since(since)) {
            return Ok(Redelivered::NotFound);
        }
    }
    let Some(again) = redelivery(event, queued.as_ref().map(|(at, d)| (*at, d)), log, now) else {
        return Ok(Redelivered::NoCallback);
    };
    if queued.is_some() {
        // The claim stays: an attempt in flight on it settles first, and releases it.
        execute(
            tx,
            "UPDATE outbox SET due_at = $2, url = $3, attempt = $4 WHERE event_id = $1",
            &[
                &event.id,
                &codec::time(again.due_at),
                &again.delivery.url,
                &(again.delivery.attempt.min(i32::MAX as u32) as i32),
            ],
        )
        .await?;
    } else {
        insert_delivery(tx, again.due_at, &again.delivery).await?;
    }
    if let Some(log) = &again.log {
        upsert_delivery_log(tx, &event.id, log).await?;
    }
    Ok(Redelivered::Queued)
}
