//! The locks that order writes across every instance on the database: the one that
//! serializes the uses of an idempotency key, and the one that orders an account's events by
//! commit. Both are transaction-scoped advisory locks, so a pooler keeps nothing of them.

use tokio_postgres::error::SqlState;

use super::db::Gate;
use super::tx::{both, execute, first_cause, query_opt, Fault, Params, Session};
use crate::domain::ids::AccountId;
use crate::store::{KeyClaim, StoreError, Taken};

/// `None` when the key is free, after waiting for any transaction that is using it now: the
/// transaction-scoped advisory lock on (account, key) makes a concurrent first use, here or
/// in another instance, wait for this one's commit and then find its row, which is returned
/// to decide. A wait past the claim's `wait_until` counts as taken, without a row (the
/// caller looks the key up again, or answers that it is in progress). The transaction's
/// bounds (its first statement), the lock and the row's read are sent together: one round
/// trip.
pub(super) async fn key_taken<C: Session>(
    c: &C,
    gate: &Gate,
    account: &AccountId,
    claim: &KeyClaim,
) -> Result<Option<Taken>, Fault> {
    let bound = gate.limit_waits(c);
    let account = account.to_string();
    // The account id has a fixed length, so the concatenation names one pair.
    let scoped = format!("{account}{}", claim.key.as_str());
    let sql = format!(
        "SELECT {} FROM idempotency_keys WHERE account_id = $1 AND key = $2",
        super::codec::KEY_ROW
    );
    let key = claim.key.as_str();
    let (lock_params, row_params): (Params, Params) = (&[&scoped], &[&account, &key]);
    let (bound, locked, row) = futures_util::future::join3(
        bound,
        execute(
            c,
            "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
            lock_params,
        ),
        query_opt(c, &sql, row_params),
    )
    .await;
    match (bound, locked, row) {
        (Ok(()), Ok(_), Ok(Some(row))) => Ok(Some(Some(Box::new(super::codec::key_record(&row)?)))),
        (Ok(()), Ok(_), Ok(None)) => Ok(None),
        // Held past the bound (the read behind it failed with 25P02, which is no reason).
        (_, Err(fault), _) if fault.is(&SqlState::LOCK_NOT_AVAILABLE) => Ok(Some(None)),
        (a, b, c) => Err(first_cause([a.err(), b.err(), c.err()]).expect("one failed")),
    }
}

/// Orders the events of one account by commit, across instances: the account's event lock,
/// held to the commit, and then its newest event id, which every event made under the lock
/// follows (`Id::after`). Each instance's clock follows the database's, but two clocks agree
/// only to about a round trip; the newest id makes the order exact, so that
/// `GET /b2b/events?after=` never skips an event that commits later with a smaller id.
pub(super) async fn lock_events<C: Session>(
    c: &C,
    account: &AccountId,
) -> Result<Option<crate::domain::ids::Id>, Fault> {
    use crate::domain::ids::{Id, IdKind};
    let name = format!("events:{account}");
    // Pipelined: the second statement runs once the lock is held, and sees every event
    // committed before it was.
    let (_, newest) = both(
        execute(
            c,
            "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
            &[&name],
        ),
        query_opt(
            c,
            "SELECT id FROM events WHERE account_id = $1 ORDER BY id DESC LIMIT 1",
            &[&account.to_string()],
        ),
    )
    .await?;
    match newest {
        Some(row) => {
            let id: String = row.get(0);
            let parsed = Id::parse(IdKind::Event, &id)
                .ok_or_else(|| StoreError::Corrupt(format!("bad event id {id:?}")))?;
            Ok(Some(parsed))
        }
        None => Ok(None),
    }
}
