//! The rate budget shared by every instance on the database: GCRA on the UNLOGGED
//! `rate_limits` table. The row lock of the upsert serializes the spending of one client
//! across instances, and the database's clock is the only clock, so instances whose clocks
//! drift still spend from one budget.
//!
//! The database's work is bounded per instance, however many clients are counting (SPEC 17):
//! one statement in flight at a time, on a connection of its own (never one of the pool's
//! that partner requests wait for), at most one per `TICK`. Every request that arrives while
//! a statement runs, of every client, goes into the next one: one multi-row upsert that
//! spends each client's requests at once and says how many fit. Each request still gets the
//! decision it would have had alone, in arrival order: the first `granted` of its client are
//! allowed, the rest refused. A quiet instance sends a request's statement at once.
//!
//! The statements run on a task of their own, so a request that gives up waiting (the edge
//! bounds the wait) never cancels the statement the others are waiting for.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use deadpool_postgres::Pool;
use tokio::sync::oneshot;

use super::tx::{execute, query, Fault};
use crate::metrics::Metrics;
use crate::store::{SharedRateLimit, Spent, StoreError};

/// $1 buckets, $2 emission intervals, $3 windows (ns), $4 requests of each. Each bucket's
/// arrival time moves on by one emission per request from max(arrival, now) while it stays
/// within the window of now; `granted` says how many did. The proposed row carries the
/// bucket's terms (`excluded.*`), and RETURNING sees only the new row, so `seen` (the now of
/// this statement) and `granted` are written beside `tat`. Rows go in bucket order, so two
/// instances' statements lock shared buckets in one order and never deadlock.
const SPEND: &str = "
WITH clock AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000000)::bigint AS now)
INSERT INTO rate_limits AS r (bucket, tat, granted, seen, wanted, emission, span)
SELECT u.bucket, clock.now + least(u.n, u.span / u.emission) * u.emission,
       least(u.n, u.span / u.emission), clock.now, u.n, u.emission, u.span
FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[]) AS u(bucket, emission, span, n),
     clock
ORDER BY u.bucket
ON CONFLICT (bucket) DO UPDATE SET
    granted = least(excluded.wanted, greatest(0,
        (excluded.seen + excluded.span - greatest(r.tat, excluded.seen)) / excluded.emission)),
    tat = greatest(r.tat, excluded.seen) + excluded.emission * least(excluded.wanted, greatest(0,
        (excluded.seen + excluded.span - greatest(r.tat, excluded.seen)) / excluded.emission)),
    seen = excluded.seen,
    wanted = excluded.wanted,
    emission = excluded.emission,
    span = excluded.span
RETURNING bucket, granted, greatest(tat - seen, 0) AS ahead";

/// A bucket whose arrival time has passed holds its whole budget: forgetting it changes
/// nothing a client could see.
const PRUNE: &str = "DELETE FROM rate_limits
    WHERE tat < (extract(epoch FROM clock_timestamp()) * 1000000000)::bigint";

/// How long a statement may take before its requests are told it failed (they fall back to
/// the instance's own buckets).
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(2);
/// The shortest time between two statements' starts: at most 500 statements a second per
/// instance, whatever the traffic, and never more than 2 ms added to a request's wait.
pub const TICK: Duration = Duration::from_millis(2);

type Waiter = oneshot::Sender<Result<Spent, StoreError>>;

/// The requests of one client waiting for the next statement.
struct Waiting {
    terms: Terms,
    waiters: Vec<Waiter>,
}

/// Every client's requests waiting for the next statement, and whether statements are
/// being sent.
#[derive(Default)]
struct Queue {
    waiting: HashMap<String, Waiting>,
    running: bool,
}

/// The terms a client's requests are spent under: those of its first request of the tick
/// (an instance applies one limit to one bucket).
#[derive(Clone, Copy)]
struct Terms {
    emission: i64,
    window: i64,
}

pub struct PgRateLimit {
    /// The limiter's own connection (a pool of one, so that it is reopened by itself).
    pool: Pool,
    queue: Arc<Mutex<Queue>>,
    metrics: Arc<Metrics>,
}

impl PgRateLimit {
    pub fn new(pool: Pool, metrics: Arc<Metrics>) -> Self {
        PgRateLimit {
            pool,
            queue: Arc::default(),
            metrics,
        }
    }
}

/// The decision of each request of a client's `n` that `granted` of fit, the arrival time
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

/// One tick's statement: every client's (granted, ahead), by bucket.
async fn spend_tick(
    pool: &Pool,
    tick: &[(String, Waiting)],
) -> Result<HashMap<String, (i64, i64)>, Fault> {
    let client = pool.get().await?;
    let buckets: Vec<&str> = tick.iter().map(|(b, _)| b.as_str()).collect();
    let emissions: Vec<i64> = tick.iter().map(|(_, w)| w.terms.emission).collect();
    let windows: Vec<i64> = tick.iter().map(|(_, w)| w.terms.window).collect();
    let counts: Vec<i64> = tick.iter().map(|(_, w)| w.waiters.len() as i64).collect();
    let rows = query(&client, SPEND, &[&buckets, &emissions, &windows, &counts]).await?;
    Ok(rows
        .iter()
        .map(|row| (row.get("bucket"), (row.get("granted"), row.get("ahead"))))
        .collect())
}

/// Sends statement after statement, at most one per `TICK`, until nobody is waiting.
async fn run_ticks(pool: Pool, queue: Arc<Mutex<Queue>>, metrics: Arc<Metrics>) {
    let mut last_start: Option<Instant> = None;
    loop {
        if let Some(started) = last_start {
            let next = started + TICK;
            if Instant::now() < next {
                tokio::time::sleep_until(next.into()).await;
            }
        }
        let mut clients: Vec<(String, Waiting)> = {
            let mut queue = queue.lock().unwrap_or_else(|e| e.into_inner());
            if queue.waiting.is_empty() {
                queue.running = false;
                return;
            }
            std::mem::take(&mut queue.waiting).into_iter().collect()
        };
        clients.sort_by(|(a, _), (b, _)| a.cmp(b));
        last_start = Some(Instant::now());
        metrics.rate_limit_statements.inc();
        metrics
            .rate_limit_buckets_spent
            .inc_by(clients.len() as u64);
        let spent = tokio::time::timeout(STATEMENT_TIMEOUT, spend_tick(&pool, &clients)).await;
        match spent {
            Ok(Ok(mut spent)) => {
                for (bucket, waiting) in clients {
                    let answers: Vec<Result<Spent, StoreError>> = match spent.remove(&bucket) {
                        Some((granted, ahead)) => decisions(
                            waiting.waiters.len(),
                            granted,
                            ahead,
                            waiting.terms.emission,
                        )
                        .into_iter()
                        .map(Ok)
                        .collect(),
                        None => {
                            let why = StoreError::Failed(
                                "the rate-limit statement returned no row for a client".into(),
                            );
                            vec![Err(why); waiting.waiters.len()]
                        }
                    };
                    for (waiter, answer) in waiting.waiters.into_iter().zip(answers) {
                        let _ = waiter.send(answer);
                    }
                }
            }
            outcome => {
                let why = match outcome {
                    Ok(Err(fault)) => StoreError::from(fault),
                    _ => StoreError::Failed("the rate-limit statement did not finish".into()),
                };
                for waiter in clients.into_iter().flat_map(|(_, w)| w.waiters) {
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
            let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            let terms = Terms {
                emission: emission_nanos.max(1),
                window: window_nanos,
            };
            queue
                .waiting
                .entry(bucket)
                .or_insert_with(|| Waiting {
                    terms,
                    waiters: Vec::new(),
                })
                .waiters
                .push(decided);
            !std::mem::replace(&mut queue.running, true)
        };
        if start {
            tokio::spawn(run_ticks(
                self.pool.clone(),
                Arc::clone(&self.queue),
                Arc::clone(&self.metrics),
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
