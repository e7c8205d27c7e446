//! The engine's connections and what bounds them (docs/contract.md "When the storage is slow"): the pool, the writes admitted at
//! once, the commits in flight, and `Conn`, a pooled connection that carries its request's
//! bounds into every transaction it begins and is given up, not handed back, when the work
//! using it is dropped midway (a statement may still be running on it).
//!
//! A transaction's waits are bounded on the server by what is left of its deadline
//! (`statement_timeout`, and `lock_timeout` by the lock bound), sent with its first
//! statements; what the server cannot bound (a COMMIT that waits for a synchronous standby, a
//! backend that stopped answering) is bounded here: a write runs in a task of its own, whose
//! caller is answered at the deadline (`store::admission`), while the task keeps its
//! connection through an unconfirmed COMMIT for `bounds::COMMIT_PATIENCE`, so the backends
//! orderly holds stay at the pool's size.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Instant;

use deadpool_postgres::{GenericClient as _, Object, Pool};
use tokio_postgres::types::Type;
use tokio_postgres::{GenericClient, IsolationLevel};

use super::tx::{query_opt, Fault, Preparing, Session, Tx};
use crate::bounds::{
    Deadline, COMMIT_PATIENCE, EDGE_MARGIN, IDLE_IN_TRANSACTION_TIMEOUT, LOCK_TIMEOUT,
};
use crate::metrics::Metrics;
use crate::store::admission::{not_sent, Admission, Admitted, InFlight, Ticket};
use crate::store::{KeyClaim, StoreError};

/// What every operation of the engine shares.
pub(super) struct Db {
    pub(crate) pool: Pool,
    /// Writes waiting for the database at once (`--max-pending-writes`).
    pub(crate) admission: Admission,
    /// The COMMITs sent and not yet confirmed (`/readyz`).
    pub(crate) commits: Arc<InFlight>,
    pub(crate) metrics: Arc<Metrics>,
    /// The runtime the store was opened on, which outlives every request: writes and batches
    /// run there, so that a caller that goes away (or is answered at its deadline) takes no
    /// write with it.
    pub(crate) runtime: tokio::runtime::Handle,
}

impl Db {
    /// A connection for work bounded by `bound`: waiting for a free one ends at its deadline
    /// with nothing sent (`TimedOut`).
    pub(super) async fn conn(&self, bound: &Bound) -> Result<Conn, Fault> {
        match tokio::time::timeout_at(bound.deadline.instant().into(), self.pool.get()).await {
            Ok(Ok(object)) => Ok(Conn {
                object: Some(object),
                bound: bound.clone(),
                settled: false,
            }),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(Fault::Store(StoreError::TimedOut(
                "no database connection was free by the deadline".into(),
            ))),
        }
    }

    /// Counts a committed write's time, as the embedded engine counts its flushes.
    pub(super) fn committed<T>(
        &self,
        started: Instant,
        outcome: Result<T, Fault>,
    ) -> Result<T, Fault> {
        if outcome.is_ok() {
            self.metrics
                .commit_seconds
                .observe(started.elapsed().as_secs_f64());
        }
        outcome
    }
}

/// What bounds one piece of work: its deadline, until when it waits for a lock, and (for a
/// write) the ticket that decides whether its COMMIT may still be sent.
#[derive(Clone)]
pub(super) struct Bound {
    pub(crate) deadline: Deadline,
    pub(crate) locks_until: Instant,
    ticket: Option<Ticket>,
    commits: Arc<InFlight>,
}

impl Bound {
    /// A read: nothing to commit.
    pub(super) fn read(deadline: Deadline, db: &Db) -> Self {
        Bound {
            deadline,
            locks_until: deadline.capped(LOCK_TIMEOUT),
            ticket: None,
            commits: Arc::clone(&db.commits),
        }
    }

    /// A write of a request admitted as `admitted`: its locks wait until the claim's bound
    /// (the key's wait) or, without a claim, `LOCK_TIMEOUT`, within the deadline.
    pub(super) fn write(admitted: &Admitted, claim: Option<&KeyClaim>, db: &Db) -> Self {
        let deadline = admitted.deadline;
        let locks_until = match claim {
            Some(claim) => claim.wait_until.min(deadline.instant()),
            None => deadline.capped(LOCK_TIMEOUT),
        };
        Bound {
            deadline,
            locks_until,
            ticket: Some(admitted.ticket.clone()),
            commits: Arc::clone(&db.commits),
        }
    }

    /// A batch of writes: bounded by the earliest deadline and lock bound among them, and
    /// sending their tickets itself before its COMMIT.
    pub(super) fn batch(deadline: Deadline, locks_until: Instant, db: &Db) -> Self {
        Bound {
            deadline,
            locks_until: locks_until.min(deadline.instant()),
            ticket: None,
            commits: Arc::clone(&db.commits),
        }
    }

    /// Whether its COMMIT was sent (its outcome then rests with the database).
    fn sent(&self) -> bool {
        self.ticket.as_ref().is_some_and(Ticket::is_sent)
    }
}

/// Runs a write's `work` to its end in its task: up to the deadline (and the edge's margin,
/// so that the server's own timeouts, set to the deadline, fire first) before its COMMIT is
/// sent, and then up to `COMMIT_PATIENCE` longer for the COMMIT's answer. Work dropped at
/// either bound gives its connection up (`Conn`). Work that ended before its COMMIT with
/// its deadline passed wrote nothing: `TimedOut`.
pub(super) async fn finish<T>(
    bound: &Bound,
    work: impl Future<Output = Result<T, Fault>>,
) -> Result<T, Fault> {
    let mut work = pin!(work);
    let before_commit = (bound.deadline.instant() + EDGE_MARGIN).into();
    match tokio::time::timeout_at(before_commit, &mut work).await {
        // Failed before its COMMIT once the deadline passed (the server's statement and lock
        // timeouts are set to it): nothing was written, whatever the server's reason.
        Ok(Err(_)) if !bound.sent() && bound.deadline.passed() => Err(Fault::Store(not_sent())),
        Ok(done) => done,
        Err(_) if !bound.sent() => Err(Fault::Store(not_sent())),
        Err(_) => {
            let patience = (bound.deadline.instant() + COMMIT_PATIENCE).into();
            tokio::time::timeout_at(patience, work)
                .await
                .unwrap_or_else(|_| {
                    Err(Fault::Store(StoreError::InDoubt(format!(
                        "the COMMIT was not confirmed {COMMIT_PATIENCE:?} after the deadline; its connection is given up"
                    ))))
                })
        }
    }
}

/// A pooled connection and the bounds of the work it serves. Handed back to the pool only
/// once that work ran to its end (`settle`); dropped midway (at a deadline, a statement
/// perhaps still running on it), it is taken out of the pool and closed instead, so that no
/// later request queues behind what it was doing.
pub(super) struct Conn {
    object: Option<Object>,
    bound: Bound,
    settled: bool,
}

impl std::ops::Deref for Conn {
    type Target = Object;

    fn deref(&self) -> &Object {
        self.object.as_ref().expect("a connection until dropped")
    }
}

impl std::ops::DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut Object {
        self.object.as_mut().expect("a connection until dropped")
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let (false, Some(object)) = (self.settled, self.object.take()) {
            drop(Object::take(object));
        }
    }
}

impl Session for Conn {
    fn session(&self) -> &(impl GenericClient + Sync) {
        &****self
    }
    fn prepared<'a>(&'a self, sql: &'a str, types: &'a [Type]) -> Preparing<'a> {
        Box::pin((**self).prepare_typed_cached(sql, types))
    }
}

impl Conn {
    /// The work using it ran to its end: the connection may serve the next one.
    pub(super) fn settle(&mut self) {
        self.settled = true;
    }

    /// For a write that is one statement on its own (its own transaction): sends the write's
    /// ticket, refused once its deadline passed or its caller withdrew it, and counts the
    /// statement in flight as a commit until `Commit::done`.
    pub(super) fn sending_alone(&self) -> Result<crate::store::admission::Commit, Fault> {
        if let Some(ticket) = &self.bound.ticket {
            if !ticket.send(self.bound.deadline) {
                return Err(Fault::Store(not_sent()));
            }
        }
        Ok(self.bound.commits.begin())
    }

    /// Begins a READ COMMITTED transaction (whatever the server's or the role's default:
    /// money is serialized by orderly's row locks, and under REPEATABLE READ each race on a
    /// hot account would be a serialization failure), and the gate its COMMIT goes through.
    /// The transaction's first statements must be sent with `Gate::limit_waits`.
    pub(super) async fn begin(&mut self) -> Result<(Tx<'_>, Gate), Fault> {
        let gate = Gate {
            bound: self.bound.clone(),
        };
        let tx = self
            .build_transaction()
            .isolation_level(IsolationLevel::ReadCommitted)
            .start()
            .await?;
        Ok((Tx::new(tx), gate))
    }
}

/// Where a transaction's bounds are kept and its COMMIT is decided.
pub(super) struct Gate {
    bound: Bound,
}

impl Gate {
    /// Sets what the transaction relies on, for itself alone (`SET LOCAL`: it all ends with
    /// the transaction, so a pooler that hands the server session to another client hands
    /// none of it on, and a server or role default changes none of it): its COMMIT waits for
    /// durability (`synchronous_commit`), each statement ends by the deadline, each lock wait
    /// by the lock bound (at least 1 ms: 0 would mean no bound at all, and a lock that is free
    /// is still taken), and the server ends the transaction if its client goes quiet inside
    /// it (`IDLE_IN_TRANSACTION_TIMEOUT`). Sent together with the transaction's first
    /// statements (no round trip of its own), and again before a later lock, which then gets
    /// only what is left.
    pub(super) async fn limit_waits<C: Session>(&self, c: &C) -> Result<(), Fault> {
        let now = Instant::now();
        let millis = |until: Instant| {
            until
                .saturating_duration_since(now)
                .as_millis()
                .max(1)
                .to_string()
        };
        let statement = millis(self.bound.deadline.instant());
        let lock = millis(self.bound.locks_until);
        let idle = IDLE_IN_TRANSACTION_TIMEOUT.as_millis().to_string();
        query_opt(
            c,
            "SELECT set_config('synchronous_commit', 'on', true),
                    set_config('statement_timeout', $1, true),
                    set_config('lock_timeout', $2, true),
                    set_config('idle_in_transaction_session_timeout', $3, true)",
            &[&statement, &lock, &idle],
        )
        .await?;
        Ok(())
    }

    /// COMMITs `tx` when its write may still be sent (its deadline has not passed, its caller
    /// still waits), counted in flight until the database confirms it; otherwise rolls it
    /// back (`TimedOut`: nothing of it is ever written).
    pub(super) async fn commit(self, tx: Tx<'_>) -> Result<(), Fault> {
        if let Some(ticket) = &self.bound.ticket {
            if !ticket.send(self.bound.deadline) {
                return Err(Fault::Store(not_sent()));
            }
        }
        let in_flight = self.bound.commits.begin();
        tx.commit().await?;
        in_flight.done();
        Ok(())
    }
}
