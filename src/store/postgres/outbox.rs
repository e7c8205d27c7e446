//! The outbox, read by the webhook worker (only committed rows exist to it), each attempt
//! settled with its delivery log in one transaction; and the sweeper's deletion of expired
//! key rows.
//!
//! Every instance runs the webhook worker, so a delivery is claimed before it is attempted:
//! `claimed_by`/`claimed_until`/`claim` on its outbox row, set by one conditional UPDATE that
//! only one instance can win, `claim` a number no claim had before (a sequence). A claim holds
//! at most `CLAIM_LEASE_MS`, and while its instance is alive: an instance is alive while the
//! lease it renews every 50 ms for 2 s on the database's clock is live (`auth_cache_leases`,
//! the heartbeat row `shared_cache.rs` keeps). Not `pg_stat_activity`: behind a connection
//! pooler the server's sessions are the pooler's, shared by every instance, so a dead instance
//! would look alive and a live one dead. A transaction cannot be the claim here: it would hold
//! a connection and row locks for as long as a receiver keeps the request open.
//!
//! The claim is fenced, so that a receiver never gets one webhook-id from two instances at
//! once (a heartbeat that misses 2 s, a lost synchronous standby, a lock on the heartbeat's
//! row, must not let a second instance send while the first is still sending):
//! - before its POST the holder extends its claim past the attempt (`hold_for_attempt`),
//!   under its claim number, and marks it `attempting`; an attempting claim is taken over only
//!   once it runs out, never on a lapsed heartbeat. The POST starts only when the extension
//!   answered with more of the lease left than the attempt can take (`ATTEMPT_LEASE_MS`,
//!   measured from when it was sent): a claim lost meanwhile, or an answer that came late,
//!   sends nothing;
//! - the attempt's outcome is written under the claim number (`settle_delivery`): a holder
//!   whose claim lapsed (a process paused past its lease may still finish a POST it had
//!   begun) logs its attempt and changes nothing of what the new holder holds.

use deadpool_postgres::Object;

use super::db::Conn;
use futures_util::TryStreamExt;

use super::codec;
use super::migrate::known_version;
use super::rows::{insert_delivery, upsert_delivery_log};
use super::tx::{alone, both4, execute, query_opt, query_stream, Fault};
use super::webhook_ops::lock_callback;
use crate::domain::event::{DeliveryAttempt, DeliveryLog};
use crate::domain::time::Millis;
use crate::store::{DeliveryFilter, DeliveryOutcome, DueDelivery};

/// How long a claimed delivery stays this instance's at most: an attempt's 10 s timeout and
/// the settling write, with room to spare; well inside the 30 s in which another instance must
/// take over the work of one that died without closing its connections.
pub(super) const CLAIM_LEASE_MS: u64 = 20_000;
/// How long a claim extended for an attempt holds, on the database's clock: the attempt's 10 s
/// timeout, the settling write after it, and the round trip of the extension itself.
pub(super) const ATTEMPT_LEASE_MS: u64 = 20_000;

/// The `application_name` of an instance's connections: what an operator sees of it in
/// `pg_stat_activity` (on a direct connection; behind a pooler, the pooler's).
pub(super) fn application_name(instance: &str) -> String {
    format!("orderly {instance}")
}

/// A row nobody holds at `$now`: never claimed, its claim run out, or (unless an attempt is
/// on the wire) its claimant gone (its heartbeat, the cache lease, no longer live on the
/// database's clock).
macro_rules! unclaimed {
    ($now:literal) => {
        concat!(
            "(o.claimed_until IS NULL OR o.claimed_until <= ",
            $now,
            " OR (NOT o.attempting AND NOT EXISTS (SELECT 1 FROM auth_cache_leases l
                 WHERE l.instance = o.claimed_by AND l.valid_until > clock_timestamp())))"
        )
    };
}

/// The database's clock now, in the milliseconds the outbox keeps its times in.
const DB_NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

// `fenced!` spells the attempt's lease out in its SQL.
const _: () = assert!(ATTEMPT_LEASE_MS == 20_000);

/// No claim is taken and no attempt starts while the database's history is younger than an
/// attempt's lease: a POST sent just before the database went back in time (an asynchronous
/// standby promoted, a point-in-time restore) may still be on the wire, and the claim that
/// fenced it is gone with the rest of that history. Nor by a binary older than the schema
/// (`$known`, the newest migration it knows): a newer orderly may fence deliveries in ways this
/// one cannot keep, so during a rolling upgrade the old instances leave them to the new.
macro_rules! fenced {
    ($known:literal) => {
        concat!(
            "clock_timestamp() >= (SELECT orderly_note_history()) + interval '20 seconds'
             AND (SELECT max(version) FROM orderly_schema_migrations) <= ",
            $known
        )
    };
}

/// The deliveries due at `$1` that nobody holds, oldest first, with their events and the
/// accounts' secrets.
const DUE_SQL: &str = concat!(
    "SELECT o.event_id, o.due_at, o.account_id, o.url, o.attempt, e.snapshot,
                    a.webhook_secret, p.secret AS previous_secret,
                    p.valid_until AS previous_valid_until
             FROM outbox o
             LEFT JOIN events e ON e.id = o.event_id
             LEFT JOIN accounts a ON a.id = o.account_id
             LEFT JOIN previous_webhook_secrets p ON p.account_id = o.account_id
             WHERE o.due_at <= $1 AND ",
    unclaimed!("$1"),
    " ORDER BY o.due_at, o.event_id"
);

/// Up to `max` deliveries due at `now` that `take` accepts and nobody holds, oldest first,
/// with their events and the accounts' secrets, each claimed by `instance` for
/// `CLAIM_LEASE_MS` in the history this instance counts as `claimed_in`. One whose event or
/// account is gone is dropped from the outbox.
pub(super) async fn due_deliveries(
    c: &Object,
    instance: &str,
    claimed_in: u64,
    now: Millis,
    max: usize,
    mut take: DeliveryFilter,
) -> Result<Vec<DueDelivery>, Fault> {
    let now_at = codec::time(now);
    let mut due = Vec::new();
    let mut orphans = Vec::new();
    // The stream ends (and its unread rows are discarded) before the next statement.
    {
        let mut rows = Box::pin(query_stream(c, DUE_SQL, &[&now_at]).await?);
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
                    claim: 0,
                    claimed_in,
                    event: codec::event(&row)?,
                    delivery,
                    webhook_secret,
                    previous_secret: codec::previous_secret(&row),
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
    claim(c, instance, now, due).await
}

/// The deliveries of `due` that this instance now holds: the read above took no lock, so
/// another instance may have claimed some since; the row lock of this UPDATE lets exactly
/// one of two claimers through, and the loser re-reads the row and finds it held.
async fn claim(
    c: &Object,
    instance: &str,
    now: Millis,
    due: Vec<DueDelivery>,
) -> Result<Vec<DueDelivery>, Fault> {
    if due.is_empty() {
        return Ok(due);
    }
    let ids: Vec<&str> = due.iter().map(|d| d.delivery.event_id.as_str()).collect();
    let due_at: Vec<i64> = due.iter().map(|d| codec::time(d.due_at)).collect();
    let now = codec::time(now);
    let until = now.saturating_add(CLAIM_LEASE_MS as i64);
    let won = alone(
        c,
        concat!(
            "UPDATE outbox o SET claimed_by = $1, claimed_until = $2,
                    claim = nextval('outbox_claims'), attempting = false
             FROM unnest($3::text[], $4::bigint[]) AS d(event_id, due_at)
             WHERE o.event_id = d.event_id AND o.due_at = d.due_at AND ",
            unclaimed!("$5"),
            " AND ",
            fenced!("$6"),
            " RETURNING o.event_id, o.claim"
        ),
        &[&instance, &until, &ids, &due_at, &now, &known_version()],
    )
    .await?;
    let won: std::collections::HashMap<String, i64> =
        won.iter().map(|r| (r.get(0), r.get(1))).collect();
    Ok(due
        .into_iter()
        .filter_map(|mut d| {
            d.claim = *won.get(&d.delivery.event_id)?;
            Some(d)
        })
        .collect())
}

/// Extends `instance`'s claim `claim` on the delivery of `event_id` to `ATTEMPT_LEASE_MS` from
/// now on the database's clock, and marks it attempting. False when the claim is no longer
/// this instance's (it ran out, or was taken over): nothing may be sent.
pub(super) async fn hold_for_attempt(
    c: &Conn,
    instance: &str,
    event_id: &str,
    claim: i64,
) -> Result<bool, Fault> {
    let in_flight = c.sending_alone()?;
    let held = alone(
        c,
        &format!(
            "UPDATE outbox SET attempting = true, claimed_until = {DB_NOW_MS} + $4
             WHERE event_id = $1 AND claim = $2 AND claimed_by = $3
               AND claimed_until > {DB_NOW_MS} AND {}
             RETURNING 1",
            fenced!("$5")
        ),
        &[
            &event_id,
            &claim,
            &instance,
            &(ATTEMPT_LEASE_MS as i64),
            &known_version(),
        ],
    )
    .await?;
    in_flight.done();
    Ok(!held.is_empty())
}

/// Gives back the claims `instance` holds that no attempt is made under (it is stopping).
/// An attempting claim stays until it runs out: the stop waits for the POSTs on the wire and
/// settles them, but one it could not wait for (the stop's time ran out) may still be
/// sending, and the receiver may still be handling one whose connection the exit closed.
pub(super) async fn release_claims(c: &Object, instance: &str) -> Result<u64, Fault> {
    execute(
        c,
        "UPDATE outbox SET claimed_by = NULL, claimed_until = NULL, claim = NULL,
                attempting = false
         WHERE claimed_by = $1 AND NOT attempting",
        &[&instance],
    )
    .await
}

/// Settles an attempt of a delivery under the claim it was made with. When the claim lapsed
/// and another instance has taken the delivery over, or a redelivery moved the row, the
/// attempt is still logged, but the outbox row is the new holder's (or the redelivery's) to
/// settle; this claim on a moved row is released, so the redelivery goes out at once.
pub(super) async fn settle_delivery(
    client: &mut Conn,
    due: &DueDelivery,
    outcome: DeliveryOutcome,
    attempt: &DeliveryAttempt,
) -> Result<(), Fault> {
    let (tx, gate) = client.begin().await?;
    let event_id = &due.delivery.event_id;
    // Pipelined: the bounds, then the lock, taken before the two statements behind it run.
    let ((), (), removed, found) = both4(
        gate.limit_waits(&tx),
        lock_callback(&tx, event_id),
        execute(
            &tx,
            "DELETE FROM outbox WHERE event_id = $1 AND due_at = $2 AND claim = $3",
            &[event_id, &codec::time(due.due_at), &due.claim],
        ),
        query_opt(
            &tx,
            "SELECT log FROM delivery_logs WHERE event_id = $1 FOR UPDATE",
            &[event_id],
        ),
    )
    .await?;
    let still_ours = removed > 0;
    if !still_ours {
        execute(
            &tx,
            "UPDATE outbox SET claimed_by = NULL, claimed_until = NULL, claim = NULL,
                    attempting = false
             WHERE event_id = $1 AND claim = $2",
            &[event_id, &due.claim],
        )
        .await?;
    }
    let log: DeliveryLog = match found {
        Some(row) => codec::json(&row, "log")?,
        None => DeliveryLog::default(),
    };
    let log = log.after(attempt.clone(), outcome, still_ours);
    if let (true, Some((at, next))) = (still_ours, due.delivery.next(outcome)) {
        insert_delivery(&tx, at, &next).await?;
    }
    upsert_delivery_log(&tx, event_id, &log).await?;
    gate.commit(tx).await?;
    Ok(())
}

/// Deletes up to `max` key rows whose expiry passed before `now`; returns how many. The
/// statement is the claim: rows another instance's sweep (or a use of the key) holds are
/// skipped rather than waited for, and its locks end with it, even if its instance dies.
pub(super) async fn sweep_expired_keys(c: &Conn, now: Millis, max: usize) -> Result<usize, Fault> {
    let in_flight = c.sending_alone()?;
    let deleted = alone(
        c,
        "WITH gone AS (
             DELETE FROM idempotency_keys WHERE (account_id, key) IN (
                 SELECT account_id, key FROM idempotency_keys WHERE expires_at < $1
                 ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)
             RETURNING 1)
         SELECT count(*) FROM gone",
        &[&codec::time(now), &(max.min(i64::MAX as usize) as i64)],
    )
    .await?;
    in_flight.done();
    let deleted: i64 = deleted.first().map_or(0, |row| row.get(0));
    Ok(deleted as usize)
}
