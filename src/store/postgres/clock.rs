//! The database's clock as every instance's now: read at open and every `RESYNC` after, the
//! reading with the shortest round trip of a few taken as the reference
//! (`domain::time::follow`), so that expiries, leases, due times and event ids mean the same
//! instant on every instance however far their own clocks drift. Between readings now
//! advances with the monotonic clock, which a step of the wall clock does not move; the error
//! is half a round trip (well under a millisecond on one network) plus the monotonic clock's
//! drift over `RESYNC` (microseconds).

use std::time::{Duration, Instant};

use deadpool_postgres::Pool;

use super::tx::{query_opt, Fault};
use crate::domain::time;
use crate::store::StoreError;

/// How often the reference is read again.
pub(super) const RESYNC: Duration = Duration::from_secs(10);
/// Readings per sync; the one with the shortest round trip is kept.
const READINGS: usize = 3;
/// A skew worth an operator's attention (the instance still follows the database).
const NOTABLE_SKEW: Duration = Duration::from_secs(1);

/// Reads the database's clock and makes it this process's now; returns the skew of this
/// machine's wall clock against it, in microseconds (positive: this machine is ahead).
pub(super) async fn sync(pool: &Pool) -> Result<i64, Fault> {
    let client = pool.get().await?;
    let mut best: Option<(Duration, i64, Instant)> = None;
    for _ in 0..READINGS {
        let sent = Instant::now();
        let row = query_opt(
            &client,
            "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint",
            &[],
        )
        .await?
        .ok_or_else(|| StoreError::Corrupt("the database returned no time".into()))?;
        let round_trip = sent.elapsed();
        let reading: i64 = row.get(0);
        if best.is_none_or(|(shortest, _, _)| round_trip < shortest) {
            best = Some((round_trip, reading, sent + round_trip / 2));
        }
    }
    let (_, reading, at) = best.expect("at least one reading");
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64);
    let skew = wall - (reading + at.elapsed().as_micros() as i64);
    time::follow_database(reading, at);
    Ok(skew)
}

/// Keeps now on the database's clock: a sync every `RESYNC`. A failed one keeps the last
/// reference (now goes on with the monotonic clock) and is tried again at the next tick.
pub(super) async fn follow_the_database(pool: Pool) {
    let mut ticks = tokio::time::interval(RESYNC);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        if let Err(e) = sync(&pool).await {
            log::warn!("reading the database's clock: {}", StoreError::from(e));
        }
    }
}

/// Says how far this machine's clock is from the database's, when that is notable.
pub(super) fn report(skew_micros: i64) {
    let skew = Duration::from_micros(skew_micros.unsigned_abs());
    if skew >= NOTABLE_SKEW {
        let side = if skew_micros > 0 {
            "ahead of"
        } else {
            "behind"
        };
        log::warn!(
            "this machine's clock is {} {side} the database's; orderly follows the database's",
            humantime::format_duration(Duration::from_millis(skew.as_millis() as u64))
        );
    }
}
