//! The rate budget shared by every instance on the database: GCRA on the UNLOGGED
//! `rate_limits` table. The row lock of the upsert serializes the spending of one client
//! across instances, and the database's clock is the only clock, so instances whose clocks
//! drift still spend from one budget.
//!
//! The database's work is bounded per instance, however many clients are counting (docs/contract.md "6. Many instances"):
//! one statement in flight at a time, on a connection of its own (never one of the pool's
//! that partner requests wait for), at most one per `TICK`. Every request that arrives while
//! a statement runs, of every client, goes into the next one: one multi-row upsert that
//! spends each client's requests at once and says how many fit. Each request still gets the
//! decision it would have had alone, in arrival order: the first `granted` of its client are
//! allowed, the rest refused. A quiet instance sends a request's statement at once.
//!
//! The statements run on a task of their own, so a request that gives up waiting (the edge
//! bounds the wait) never cancels the statement the others are waiting for.
//!
//! A client far from its limit whose requests come faster than statements is lent budget
//! ahead of them (`limiter_loans.rs`): its next requests are allowed here without waiting for
//! a statement, from budget already spent in the database, and what a loan has left when it
//! lapses is given back, to the history of the database that lent it: loans of a history the
//! database went back from (`shared_cache::History`) are dropped, neither drawn on nor given
//! back to a bucket that never lent them.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use deadpool_postgres::Pool;
use tokio::sync::{oneshot, Notify};

use super::limiter_loans::{self, Loan, Terms};
use super::shared_cache::History;
use super::tx::{alone, execute, Fault};
use crate::metrics::Metrics;
use crate::store::{SharedRateLimit, Spent, StoreError};

/// $1 buckets, $2 emission intervals, $3 windows (ns), $4 requests of each, $5 loans asked
/// for, $6 lent requests given back, $7 and $8 the loan's floor and share. Each bucket's
/// arrival time first moves back by what is given back (never before now), then on by one
/// emission per request granted while it stays within the window of now, the requests first
/// and then the loan (`orderly_gcra_take`); `granted` says how many in all. The proposed row
/// carries the bucket's terms (`excluded.*`), and RETURNING sees only the new row, so `seen`
/// (the now of this statement) and `granted` are written beside `tat`. Rows go in bucket
/// order, so two instances' statements lock shared buckets in one order and never deadlock.
const SPEND: &str = "
WITH clock AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000000)::bigint AS now)
INSERT INTO rate_limits AS r (bucket, tat, granted, seen, wanted, emission, span, reserve, refund)
SELECT u.bucket, clock.now + g.n * u.emission, g.n, clock.now, u.n, u.emission, u.span,
       u.reserve, u.refund
FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[])
         AS u(bucket, emission, span, n, reserve, refund)
     CROSS JOIN clock
     CROSS JOIN LATERAL (SELECT orderly_gcra_take(clock.now, clock.now, u.span, u.emission,
                                                  u.n, u.reserve, $7, $8) AS n) AS g
ORDER BY u.bucket
ON CONFLICT (bucket) DO UPDATE SET
    granted = orderly_gcra_take(
        greatest(r.tat - excluded.refund * excluded.emission, excluded.seen), excluded.seen,
        excluded.span, excluded.emission, excluded.wanted, excluded.reserve, $7, $8),
    tat = greatest(r.tat - excluded.refund * excluded.emission, excluded.seen)
        + excluded.emission * orderly_gcra_take(
            greatest(r.tat - excluded.refund * excluded.emission, excluded.seen), excluded.seen,
            excluded.span, excluded.emission, excluded.wanted, excluded.reserve, $7, $8),
    seen = excluded.seen,
    wanted = excluded.wanted,
    emission = excluded.emission,
    span = excluded.span,
    reserve = excluded.reserve,
    refund = excluded.refund
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
pub(super) const TICK: Duration = Duration::from_millis(2);

type Waiter = oneshot::Sender<Result<Spent, StoreError>>;

/// The requests of one client waiting for the next statement.
struct Waiting {
    terms: Terms,
    waiters: Vec<Waiter>,
}

/// What one statement asks of one client's bucket.
struct Ask {
    client: IpAddr,
    /// The bucket's row in `rate_limits`: the address as text.
    bucket: String,
    terms: Terms,
    waiters: Vec<Waiter>,
    loan: i64,
    give_back: i64,
}

/// Every client's requests waiting for the next statement, the loans this instance holds,
/// and whether statements are being sent. Keyed by the bucket's address, not its text: a
/// request drawn from a loan then formats and allocates nothing; the text is made once per
/// client per statement.
#[derive(Default)]
struct Queue {
    waiting: HashMap<IpAddr, Waiting>,
    loans: HashMap<IpAddr, (Terms, Loan)>,
    /// The epoch of the database's history the loans were lent in.
    lent_in: u64,
    running: bool,
}

impl Queue {
    /// Drops the loans when the database's history is no longer the one that lent them.
    fn loans_of(&mut self, epoch: u64) -> &mut HashMap<IpAddr, (Terms, Loan)> {
        if self.lent_in != epoch {
            self.loans.clear();
            self.lent_in = epoch;
        }
        &mut self.loans
    }

    /// The next statement's rows: every waiting client (closing its loan, which is spent or
    /// lapsed, and asking for the next), and every lapsed loan of a client not waiting.
    fn next_statement(&mut self, now: Instant) -> Vec<Ask> {
        let mut asks: Vec<Ask> = std::mem::take(&mut self.waiting)
            .into_iter()
            .map(|(client, waiting)| {
                let previous = self.loans.remove(&client).map(|(_, loan)| loan);
                Ask {
                    loan: limiter_loans::wanted(waiting.waiters.len(), previous.as_ref(), now),
                    give_back: previous.map_or(0, |loan| loan.unused()),
                    client,
                    bucket: client.to_string(),
                    terms: waiting.terms,
                    waiters: waiting.waiters,
                }
            })
            .collect();
        let lapsed: Vec<IpAddr> = self
            .loans
            .iter()
            .filter(|(_, (_, loan))| loan.lapsed(now))
            .map(|(client, _)| *client)
            .collect();
        for client in lapsed {
            let (terms, loan) = self.loans.remove(&client).expect("listed above");
            if loan.unused() > 0 {
                asks.push(Ask {
                    client,
                    bucket: client.to_string(),
                    terms,
                    waiters: Vec::new(),
                    loan: 0,
                    give_back: loan.unused(),
                });
            }
        }
        asks.sort_by(|a, b| a.bucket.cmp(&b.bucket));
        asks
    }

    /// When the next loan lapses, if any is held.
    fn next_lapse(&self) -> Option<Instant> {
        self.loans.values().map(|(_, loan)| loan.lapses_at()).min()
    }
}

struct Shared {
    queue: Mutex<Queue>,
    history: Arc<History>,
    /// Wakes the statement task, asleep until a loan lapses, when a request starts waiting.
    arrived: Notify,
}

pub(super) struct PgRateLimit {
    /// The limiter's own connection (a pool of one, so that it is reopened by itself).
    pool: Pool,
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
}

impl PgRateLimit {
    pub(super) fn new(pool: Pool, metrics: Arc<Metrics>, history: Arc<History>) -> Self {
        PgRateLimit {
            pool,
            shared: Arc::new(Shared {
                queue: Mutex::default(),
                history,
                arrived: Notify::new(),
            }),
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

/// One statement: every client's (granted, ahead), by bucket.
async fn spend_tick(pool: &Pool, asks: &[Ask]) -> Result<HashMap<String, (i64, i64)>, Fault> {
    let client = pool.get().await?;
    let buckets: Vec<&str> = asks.iter().map(|a| a.bucket.as_str()).collect();
    let emissions: Vec<i64> = asks.iter().map(|a| a.terms.emission).collect();
    let windows: Vec<i64> = asks.iter().map(|a| a.terms.window).collect();
    let counts: Vec<i64> = asks.iter().map(|a| a.waiters.len() as i64).collect();
    let loans: Vec<i64> = asks.iter().map(|a| a.loan).collect();
    let given_back: Vec<i64> = asks.iter().map(|a| a.give_back).collect();
    let rows = alone(
        &client,
        SPEND,
        &[
            &buckets,
            &emissions,
            &windows,
            &counts,
            &loans,
            &given_back,
            &limiter_loans::FLOOR,
            &limiter_loans::SHARE,
        ],
    )
    .await?;
    Ok(rows
        .iter()
        .map(|row| (row.get("bucket"), (row.get("granted"), row.get("ahead"))))
        .collect())
}

/// Answers every request of a statement that failed (they fall back to the instance's own
/// buckets). Budget given back in it is lost to its clients until it refills by itself.
fn answer_failed(asks: Vec<Ask>, why: StoreError) {
    for waiter in asks.into_iter().flat_map(|a| a.waiters) {
        let _ = waiter.send(Err(why.clone()));
    }
}

/// Answers each request of a statement in arrival order, and keeps the loans it granted.
fn answer(
    shared: &Shared,
    metrics: &Metrics,
    asks: Vec<Ask>,
    mut spent: HashMap<String, (i64, i64)>,
) {
    let answered = Instant::now();
    let mut loans = Vec::new();
    for ask in asks {
        metrics.rate_limit_returned.inc_by(ask.give_back as u64);
        let n = ask.waiters.len();
        let Some((granted, ahead)) = spent.remove(&ask.bucket) else {
            let why =
                StoreError::Failed("the rate-limit statement returned no row for a client".into());
            for waiter in ask.waiters {
                let _ = waiter.send(Err(why.clone()));
            }
            continue;
        };
        let lent = granted - (n as i64).min(granted);
        for (waiter, decision) in
            ask.waiters
                .into_iter()
                .zip(decisions(n, granted, ahead, ask.terms.emission))
        {
            let _ = waiter.send(Ok(decision));
        }
        if lent > 0 {
            loans.push((
                ask.client,
                ask.terms,
                Loan::new(lent, ahead, answered, ask.terms),
            ));
        }
    }
    if loans.is_empty() {
        return;
    }
    let mut queue = shared.queue.lock().unwrap_or_else(|e| e.into_inner());
    for (client, terms, mut loan) in loans {
        // Requests of the client that arrived while the statement ran are first in line.
        if let Some(waiting) = queue.waiting.get_mut(&client) {
            let drawn: Vec<Spent> = (0..waiting.waiters.len())
                .map_while(|_| loan.draw(answered))
                .collect();
            metrics.rate_limit_lent.inc_by(drawn.len() as u64);
            for (waiter, spent) in waiting.waiters.drain(..drawn.len()).zip(drawn) {
                let _ = waiter.send(Ok(spent));
            }
            if waiting.waiters.is_empty() {
                queue.waiting.remove(&client);
            }
        }
        queue.loans.insert(client, (terms, loan));
    }
}

/// Sends statement after statement, at most one per `TICK`, while requests wait or loans are
/// held (each lapsed one is given back); stops when there are neither.
async fn run_ticks(pool: Pool, shared: Arc<Shared>, metrics: Arc<Metrics>) {
    let mut last_start: Option<Instant> = None;
    loop {
        if let Some(started) = last_start {
            let next = started + TICK;
            if Instant::now() < next {
                tokio::time::sleep_until(next.into()).await;
            }
        }
        let (asks, lapse) = {
            let mut queue = shared.queue.lock().unwrap_or_else(|e| e.into_inner());
            queue.loans_of(shared.history.epoch());
            let asks = queue.next_statement(Instant::now());
            let lapse = queue.next_lapse();
            if asks.is_empty() && lapse.is_none() {
                queue.running = false;
                return;
            }
            (asks, lapse)
        };
        if asks.is_empty() {
            let lapse = lapse.expect("a loan is held");
            // Asleep until a loan lapses, or a request starts waiting.
            tokio::select! {
                _ = tokio::time::sleep_until(lapse.into()) => {}
                _ = shared.arrived.notified() => {}
            }
            continue;
        }
        last_start = Some(Instant::now());
        metrics.rate_limit_statements.inc();
        metrics.rate_limit_buckets_spent.inc_by(asks.len() as u64);
        match tokio::time::timeout(STATEMENT_TIMEOUT, spend_tick(&pool, &asks)).await {
            Ok(Ok(spent)) => answer(&shared, &metrics, asks, spent),
            Ok(Err(fault)) => answer_failed(asks, StoreError::from(fault)),
            Err(_) => answer_failed(
                asks,
                StoreError::Failed("the rate-limit statement did not finish".into()),
            ),
        }
    }
}

#[async_trait]
impl SharedRateLimit for PgRateLimit {
    async fn spend(
        &self,
        bucket: IpAddr,
        emission_nanos: i64,
        window_nanos: i64,
    ) -> Result<Spent, StoreError> {
        let (decided, decision) = oneshot::channel();
        let start = {
            let mut queue = self.shared.queue.lock().unwrap_or_else(|e| e.into_inner());
            let epoch = self.shared.history.epoch();
            if let Some((_, loan)) = queue.loans_of(epoch).get_mut(&bucket) {
                if let Some(spent) = loan.draw(Instant::now()) {
                    self.metrics.rate_limit_lent.inc();
                    return Ok(spent);
                }
            }
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
                Arc::clone(&self.shared),
                Arc::clone(&self.metrics),
            ));
        } else {
            self.shared.arrived.notify_one();
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
