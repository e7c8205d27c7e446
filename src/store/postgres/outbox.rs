//! The outbox, read by the webhook worker (only committed rows exist to it), each attempt
//! settled with its delivery log in one transaction; and the sweeper's deletion of expired
//! key rows.

use deadpool_postgres::{GenericClient, Object};
use futures_util::TryStreamExt;
use tokio_postgres::types::ToSql;

use super::codec;
use super::rows::{insert_delivery, upsert_delivery_log};
use super::tx::{execute, query_opt, Fault};
use crate::domain::event::{DeliveryAttempt, DeliveryEnd, DeliveryLog};
use crate::domain::time::Millis;
use crate::store::{DeliveryFilter, DeliveryOutcome, DueDelivery};

/// Up to `max` deliveries due at `now` that `take` accepts, oldest first, with their events
/// and the accounts' secrets. One whose event or account is gone is dropped from the outbox.
pub async fn due_deliveries(
    c: &Object,
    now: Millis,
    max: usize,
    mut take: DeliveryFilter,
) -> Result<Vec<DueDelivery>, Fault> {
    let statement = c
        .prepare_cached(
            "SELECT o.event_id, o.due_at, o.account_id, o.url, o.attempt, e.snapshot,
                    a.webhook_secret
             FROM outbox o
             LEFT JOIN events e ON e.id = o.event_id
             LEFT JOIN accounts a ON a.id = o.account_id
             WHERE o.due_at <= $1 ORDER BY o.due_at, o.event_id",
        )
        .await?;
    let now = codec::time(now);
    let params: [&(dyn ToSql + Sync); 1] = [&now];
    let mut due = Vec::new();
    let mut orphans = Vec::new();
    // The stream ends (and its unread rows are discarded) before the next statement.
    {
        let mut rows = Box::pin(c.query_raw(&statement, params).await?);
        while due.len() < max {
            let Some(row) = rows.try_next().await? else {
                break;
            };
            let (due_at, delivery) = codec::delivery(&row)?;
            if !take(&delivery) {
                continue;
            }
            let secret: Option<String> = row.get("webhook_secret");
            let has_event = row
                .try_get::<_, Option<tokio_postgres::types::Json<serde_json::Value>>>("snapshot")
                .ok()
                .flatten()
                .is_some();
            match (has_event, secret) {
                (true, Some(webhook_secret)) => due.push(DueDelivery {
                    due_at,
                    event: codec::event(&row)?,
                    delivery,
                    webhook_secret,
                }),
                _ => {
                    log::warn!(
                        "webhook {} dropped: its event or account no longer exists",
                        delivery.event_id
                    );
                    orphans.push(delivery.event_id);
                }
            }
        }
    }
    if !orphans.is_empty() {
        execute(
            c,
            "DELETE FROM outbox WHERE event_id = ANY($1)",
            &[&orphans],
        )
        .await?;
    }
    Ok(due)
}

pub async fn settle_delivery(
    client: &mut Object,
    due: &DueDelivery,
    outcome: DeliveryOutcome,
    attempt: &DeliveryAttempt,
) -> Result<(), Fault> {
    let tx = client.transaction().await?;
    let event_id = &due.delivery.event_id;
    let (removed, found) = futures_util::future::try_join(
        execute(
            &tx,
            "DELETE FROM outbox WHERE event_id = $1 AND due_at = $2",
            &[event_id, &codec::time(due.due_at)],
        ),
        query_opt(
            &tx,
            "SELECT log FROM delivery_logs WHERE event_id = $1 FOR UPDATE",
            &[event_id],
        ),
    )
    .await?;
    let _ = removed;
    let mut log: DeliveryLog = match found {
        Some(row) => codec::json(&row, "log")?,
        None => DeliveryLog::default(),
    };
    log.attempts.push(attempt.clone());
    match outcome {
        DeliveryOutcome::Finished => {
            log.next_attempt_at = None;
            let delivered = attempt.status.is_some_and(|s| (200..300).contains(&s));
            log.ended = Some(if delivered {
                DeliveryEnd::Delivered
            } else {
                DeliveryEnd::GivenUp
            });
        }
        DeliveryOutcome::RetryAt(at) => {
            log.next_attempt_at = Some(at);
            let mut next = due.delivery.clone();
            next.attempt += 1;
            insert_delivery(&tx, at, &next).await?;
        }
    }
    upsert_delivery_log(&tx, event_id, &log).await?;
    tx.commit().await?;
    Ok(())
}

/// Deletes up to `max` key rows whose expiry passed before `now`; returns how many.
pub async fn sweep_expired_keys(c: &Object, now: Millis, max: usize) -> Result<usize, Fault> {
    let deleted = execute(
        c,
        "DELETE FROM idempotency_keys WHERE (account_id, key) IN (
             SELECT account_id, key FROM idempotency_keys WHERE expires_at < $1
             ORDER BY expires_at LIMIT $2)",
        &[&codec::time(now), &(max.min(i64::MAX as usize) as i64)],
    )
    .await?;
    Ok(deleted as usize)
}
