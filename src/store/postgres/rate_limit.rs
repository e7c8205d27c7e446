//! The rate budget shared by every instance on the database: GCRA on the UNLOGGED
//! `rate_limits` table, one statement per batch. The row lock of the upsert serializes the
//! spending of one client across instances, and the database's clock is the only clock, so
//! instances whose clocks drift still spend from one budget.
//!
//! Requests of one client that arrive while its statement is in flight wait for it and then
//! go together as the next statement, which spends all of them at once and says how many fit
//! (group commit, for the limiter): a client with 64 connections open costs the database one
//! statement per round trip, not 64 updates queueing on one row. Each request still gets the
//! decision it would have had alone, in arrival order: the first `granted` are allowed, the
//! rest refused.
//!
//! A batch runs on a task of its own, so a request that gives up waiting (the edge bounds the
//! wait) never cancels the statement the others are waiting for.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::Pool;
use tokio::sync::oneshot;

use super::tx::{execute, query_opt, Fault};
use crate::store::{SharedRateLimit, Spent, StoreError};

/// $1 bucket, $2 emission interval, $3 window (ns), $4 requests in the batch. Each moves the
/// arrival time on by one emission from max(arrival, now) while it stays within the window
/// of now; `granted` says how many did. RETURNING sees only the new row, so `seen` (the now
/// of this statement) and `granted` are written beside `tat`.
const SPEND: &str = "
WITH clock AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000000)::bigint AS now)
INSERT INTO rate_limits AS r (bucket, tat, granted, seen)
SELECT $1::text, clock.now + least($4::bigint, $3::bigint / $2::bigint) * $2,
       least($4, $3 / $2), clock.now FROM clock
ON CONFLICT (bucket) DO UPDATE SET
    granted = least($4, greatest(0,
        (excluded.seen + $3 - greatest(r.tat, excluded.seen)) / $2)),
    tat = greatest(r.tat, excluded.seen) + $2 * least($4, greatest(0,
        (excluded.seen + $3 - greatest(r.tat, excluded.seen)) / $2)),
    seen = excluded.seen
RETURNING granted, greatest(tat - seen, 0) AS ahead";

/// A bucket whose arrival time has passed holds its whole budget: forgetting it changes
/// nothing a client could see.
const PRUNE: &str = "DELETE FROM rate_limits
    WHERE tat < (extract(epoch FROM clock_timestamp()) * 1000000000)::bigint";

/// How long a batch's statement may take before its requests are told it failed (they fall
/// back to the instance's own buckets).
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(2);

/// The requests of one bucket waiting for the next statement, and whether a batch is running.
#[derive(Default)]
struct Queue {
    waiting: Vec<oneshot::Sender<Result<Spent, StoreError>>>,
    running: bool,
}

/// The terms a batch is spent under: those of its first request (an instance applies one
/// limit to one bucket).
#[derive(Clone, Copy)]
struct Terms {
    emission: i64,
    window: i64,
}

pub struct PgRateLimit {
    pool: Pool,
    queues: Arc<Mutex<HashMap<String, Queue>>>,
}

impl PgRateLimit {
    pub fn new(pool: Pool) -> Self {
        PgRateLimit {
            pool,
            queues: Arc::default(),
        }
    }
}

/// The decision of each request of a batch of `n` that `granted` of fit, the arrival time
/// ending `ahead` ns ahead of now: request i (in arrival order) moved it to
/// `ahead - (granted - 1 - i) * emission`.
fn decisions(n: usize, granted: i64, ahead: i64, emission: i64) -> Vec<Spent> {
    (0..n as i64)
        .map(|i| {
            if i < granted {
                Spent {
                    allowed: true,
                    ahead_nanos: (ahead - (granted - 1 - i) * emission).max(0),
                }
            } else {
                Spent {
                    allowed: false,
                    ahead_nanos: ahead,
                }
            }
        })
        .collect()
}

async fn spend_batch(
    pool: &Pool,
    bucket: &str,
    terms: Terms,
    n: usize,
) -> Result<(i64, i64), Fault> {
    let client = pool.get().await?;
    let n = n as i64;
    let row = query_opt(
        &client,
        SPEND,
        &[&bucket, &terms.emission, &terms.window, &n],
    )
    .await?
    .ok_or_else(|| StoreError::Corrupt("the rate-limit upsert returned no row".into()))?;
    Ok((row.get("granted"), row.get("ahead")))
}

/// Spends batch after batch of `bucket` until nobody is waiting.
async fn run_batches(
    pool: Pool,
    queues: Arc<Mutex<HashMap<String, Queue>>>,
    bucket: String,
    terms: Terms,
) {
    loop {
        let batch = {
            let mut queues = queues.lock().unwrap_or_else(|e| e.into_inner());
            let Some(queue) = queues.get_mut(&bucket) else {
                return;
            };
            if queue.waiting.is_empty() {
                queues.remove(&bucket);
                return;
            }
            std::mem::take(&mut queue.waiting)
        };
        let spent = tokio::time::timeout(
            STATEMENT_TIMEOUT,
            spend_batch(&pool, &bucket, terms, batch.len()),
        )
        .await;
        match spent {
            Ok(Ok((granted, ahead))) => {
                let each = decisions(batch.len(), granted, ahead, terms.emission);
                for (waiter, spent) in batch.into_iter().zip(each) {
                    let _ = waiter.send(Ok(spent));
                }
            }
            outcome => {
                let why = match outcome {
                    Ok(Err(fault)) => StoreError::from(fault),
                    _ => StoreError::Failed("the rate-limit statement did not finish".into()),
                };
                for waiter in batch {
                    let _ = waiter.send(Err(why.clone()));
                }
            }
        }
    }
}

#[async_trait]
impl SharedRateLimit for PgRateLimit {
    async fn spend(
        &self,
        bucket: String,
        emission_nanos: i64,
        window_nanos: i64,
    ) -> Result<Spent, StoreError> {
        let (decided, decision) = oneshot::channel();
        let start = {
            let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
            let queue = queues.entry(bucket.clone()).or_default();
            queue.waiting.push(decided);
            !std::mem::replace(&mut queue.running, true)
        };
        if start {
            let terms = Terms {
                emission: emission_nanos.max(1),
                window: window_nanos,
            };
            tokio::spawn(run_batches(
                self.pool.clone(),
                Arc::clone(&self.queues),
                bucket,
                terms,
            ));
        }
        decision
            .await
            .unwrap_or_else(|_| Err(StoreError::Failed("the rate-limit batch was lost".into())))
    }

    async fn prune(&self) -> Result<usize, StoreError> {
        let client = self.pool.get().await.map_err(Fault::from)?;
        Ok(execute(&client, PRUNE, &[]).await? as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_decided_as_its_requests_would_be_one_by_one() {
        // 3 fit of 5, one emission = 10; the last allowed left the arrival time 30 ahead.
        let each = decisions(5, 3, 30, 10);
        let allowed: Vec<bool> = each.iter().map(|s| s.allowed).collect();
        assert_eq!(allowed, vec![true, true, true, false, false]);
        let ahead: Vec<i64> = each.iter().map(|s| s.ahead_nanos).collect();
        assert_eq!(ahead, vec![10, 20, 30, 30, 30]);
    }
}
