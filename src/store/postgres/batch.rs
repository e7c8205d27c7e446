//! Orders in batches: the orders waiting when a runner is free go into one transaction with
//! one COMMIT, so one WAL flush makes all of them durable, and the orders of a hot account
//! queue once per batch on its balance row instead of once per order. The batches of one
//! instance in flight at once hold disjoint accounts (`store::batch::Queue`), so they never
//! wait on each other's row locks.
//!
//! A batch reads its view in one round trip, with every lock it needs taken in one order
//! (the keys' advisory locks by hash, then the balance rows by account id, so batches of
//! different instances never wait on each other in a cycle): the balances, the key rows
//! and the catalog. The orders are decided on that view by the engine-neutral pipeline
//! (`store::batch::decide`); the accepted orders' rows go in as one pipeline, then the
//! COMMIT; every order is answered once it is durable.
//!
//! A batch that loses a race (serialization failure, deadlock) is run again, a bounded
//! number of times; a batch that still fails before its COMMIT, or that waited past the lock
//! timeout (a row held elsewhere), is split: each order runs alone (`orders::place_order`),
//! at once and off the runner, so neither one bad order nor one held row holds the others
//! of its batch or the batches queued behind it. A COMMIT whose outcome is unknown fails every order of the batch with that fault: the
//! partner's retry with the same key replays what did commit or places it then.

use std::collections::HashMap;
use std::pin::pin;
use std::sync::{Arc, LazyLock, Mutex};

use tokio::sync::oneshot;
use tokio_postgres::error::SqlState;

use super::chain_rows::{catch_up, head_of};
use super::codec;
use super::db::{self, Bound, Conn, Db};
use super::orders::{catalog, write_decisions, PRODUCTS_SQL};
use super::rows::{txn_id, NEWEST_TXNS_SQL};
use super::tx::{first_cause, query, query_planned, retried, Fault, Tx, MAX_TRIES};
use crate::bounds::{Deadline, COMMIT_PATIENCE, EDGE_MARGIN};
use crate::domain::chain::{Funds, LedgerHead};
use crate::domain::ids::AccountId;
use crate::domain::time::now_millis;
use crate::store::admission::{self, not_sent, Admitted};
use crate::store::batch::{decide, OrderView, Pending, Queue, Wants};
use crate::store::{NewOrder, OrderRefusal, StoreError};
/// Batches in flight at once, per instance: enough to keep the database busy while one
/// batch waits for its flush, few enough that batches stay large under load.
const MAX_RUNNERS: usize = 4;

/// What one order's caller gets: the 200 body or the refusal, or why it has neither.
pub(super) type Answer = Result<Result<Vec<u8>, OrderRefusal>, StoreError>;

/// The queue of orders and the runners that place them, batch by batch.
pub(super) struct Batcher {
    db: Arc<Db>,
    queue: Mutex<Queue<Answer>>,
}

impl Batcher {
    pub(super) fn new(db: Arc<Db>) -> Arc<Self> {
        Arc::new(Batcher {
            db,
            queue: Mutex::default(),
        })
    }

    /// Queues `order` (refused at once past `--max-pending-writes`) and resolves with its
    /// answer once its batch committed (or failed), or at `deadline`: still queued then, it
    /// leaves the queue unwritten (`TimedOut`); its COMMIT sent, its outcome is unknown
    /// (`InDoubt`).
    pub(super) async fn place(self: &Arc<Self>, deadline: Deadline, order: NewOrder) -> Answer {
        let admitted = self.db.admission.admit(deadline)?;
        let ticket = admitted.ticket.clone();
        let (answer, answered) = oneshot::channel();
        let start_runner = {
            let mut queue = self.queue.lock().expect("the order queue");
            let pending = Pending {
                order,
                answer,
                admitted,
            };
            queue.push(pending, MAX_RUNNERS)
        };
        if start_runner {
            // A task of its own on the store's runtime: a caller that goes away must not take
            // a batch with it, nor may an HTTP worker that stops first at shutdown.
            self.db.runtime.spawn(Arc::clone(self).run());
        }
        admission::answer(deadline, &ticket, answered).await
    }

    /// Places batches until no waiting order is of an account it may take.
    async fn run(self: Arc<Self>) {
        let mut done: Vec<AccountId> = Vec::new();
        loop {
            let batch = self
                .queue
                .lock()
                .expect("the order queue")
                .next_batch(&done);
            if batch.is_empty() {
                return;
            }
            let mut held = Unwinding {
                batcher: &self,
                accounts: Some(batch.iter().map(|p| p.order.account.id).collect()),
            };
            done = self.settle(batch).await;
            held.accounts = None;
        }
    }

    /// Runs one batch to its answers: re-run when it loses a race (a serialization failure
    /// or a deadlock), split when it fails before its COMMIT. Returns the batch's accounts,
    /// free for the next batch once its orders are answered (or running alone).
    async fn settle(self: &Arc<Self>, batch: Vec<Pending<Answer>>) -> Vec<AccountId> {
        let accounts = batch.iter().map(|p| p.order.account.id).collect();
        let orders: Vec<&NewOrder> = batch.iter().map(|p| &p.order).collect();
        let admitted: Vec<&Admitted> = batch.iter().map(|p| &p.admitted).collect();
        let started = std::time::Instant::now();
        let mut tries = 0;
        let outcome = loop {
            let outcome = self.bounded(&orders, &admitted).await;
            match outcome {
                Err(Failure::BeforeCommit(fault))
                    if fault.retryable()
                        && !waited(&fault)
                        && tries + 1 < MAX_TRIES
                        && !batch.iter().any(Pending::expired) =>
                {
                    tries += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(5 << tries)).await;
                }
                done => break done,
            }
        };
        match outcome {
            Ok(answers) => {
                let committed = started.elapsed().as_secs_f64();
                self.db.metrics.commit_seconds.observe(committed);
                for (pending, answer) in batch.into_iter().zip(answers) {
                    let _ = pending.answer.send(Ok(answer));
                }
            }
            Err(Failure::BeforeCommit(fault)) if batch.len() == 1 && !waited(&fault) => {
                let pending = batch.into_iter().next().expect("one order");
                let answer = answer_of(Err(fault), &pending.admitted);
                let _ = pending.answer.send(answer);
            }
            Err(Failure::BeforeCommit(fault)) => {
                // Each order alone, at once, each on a connection of its own, as if it had
                // never been batched, and off this runner: an order waiting out a lock (a
                // row held elsewhere past the lock timeout) holds neither the others of its
                // batch nor the batches queued behind it. The lock wait already spent counts
                // as one of its tries.
                let spent = u32::from(waited(&fault));
                let batcher = Arc::clone(self);
                self.db.runtime.spawn(async move {
                    let alone = batch.iter().map(|p| batcher.alone(p, spent));
                    let answers = futures_util::future::join_all(alone).await;
                    for (pending, answer) in batch.into_iter().zip(answers) {
                        let _ = pending.answer.send(answer);
                    }
                });
            }
            Err(Failure::AtCommit(fault)) => {
                let why = StoreError::from(fault);
                for pending in batch {
                    let _ = pending.answer.send(Err(why.clone()));
                }
            }
        }
        accounts
    }

    /// One try of a batch, bounded: its work before the COMMIT by the earliest deadline of
    /// its orders (the server's timeouts are set to it, and the edge's margin later its
    /// connection is given up), its COMMIT by the latest deadline and `COMMIT_PATIENCE`.
    async fn bounded(
        &self,
        orders: &[&NewOrder],
        admitted: &[&Admitted],
    ) -> Result<Vec<Result<Vec<u8>, OrderRefusal>>, Failure> {
        let earliest = admitted.iter().map(|a| a.deadline).min().expect("a batch");
        let latest = admitted.iter().map(|a| a.deadline).max().expect("a batch");
        let locks_until = orders
            .iter()
            .map(|o| o.claim.wait_until)
            .min()
            .expect("a batch");
        let bound = Bound::batch(earliest, locks_until, &self.db);
        let work = async {
            let mut client = self.db.conn(&bound).await.map_err(Failure::BeforeCommit)?;
            let placed = place_batch(&mut client, orders, admitted).await;
            client.settle();
            placed
        };
        let mut work = pin!(work);
        let before_commit = (earliest.instant() + EDGE_MARGIN).into();
        match tokio::time::timeout_at(before_commit, &mut work).await {
            Ok(done) => done,
            Err(_) if !admitted.iter().any(|a| a.ticket.is_sent()) => {
                Err(Failure::BeforeCommit(Fault::Store(not_sent())))
            }
            Err(_) => {
                let patience = (latest.instant() + COMMIT_PATIENCE).into();
                tokio::time::timeout_at(patience, work)
                    .await
                    .unwrap_or_else(|_| {
                        Err(Failure::AtCommit(Fault::Store(StoreError::InDoubt(
                            "the batch's COMMIT was not confirmed; its connection is given up"
                                .into(),
                        ))))
                    })
            }
        }
    }

    /// One order in a transaction of its own, with the bounded retries of a lost race
    /// (`spent` of them already used), unless its deadline passed or its caller left.
    async fn alone(&self, pending: &Pending<Answer>, spent: u32) -> Answer {
        if pending.expired() {
            return Err(not_sent());
        }
        let bound = Bound::write(&pending.admitted, Some(&pending.order.claim), &self.db);
        let work = async {
            retried!(self.db, bound, spent = spent, |c| {
                super::orders::place_order(&mut c, &pending.order)
            })
        };
        answer_of(db::finish(&bound, work).await, &pending.admitted)
    }
}

/// An order's outcome as its caller gets it: a failure before its COMMIT once its deadline
/// passed wrote nothing (the 503); a race lost on every try, or a balance row held elsewhere
/// past its wait, is the partner's to retry with its key (docs/api.md "POST /b2b/orders"'s 402); anything else is the
/// storage's.
fn answer_of(outcome: Result<Result<Vec<u8>, OrderRefusal>, Fault>, order: &Admitted) -> Answer {
    match outcome {
        Err(_) if !order.ticket.is_sent() && order.deadline.passed() => Err(not_sent()),
        Err(fault) if fault.retryable() => Ok(Err(OrderRefusal::ConcurrentModification)),
        outcome => outcome.map_err(StoreError::from),
    }
}

/// Held while a runner settles a batch, and acting only if it unwinds (a panic, or its task
/// dropped at shutdown): the batch's accounts and the runner's slot are given back, so that
/// the orders of those accounts do not wait forever for a runner that is gone.
struct Unwinding<'a> {
    batcher: &'a Batcher,
    /// `None` once the batch settled: nothing to give back.
    accounts: Option<Vec<AccountId>>,
}

impl Drop for Unwinding<'_> {
    fn drop(&mut self) {
        if let (Some(accounts), Ok(mut queue)) = (&self.accounts, self.batcher.queue.lock()) {
            queue.abandon(accounts);
        }
    }
}

/// A lock waited for past the lock timeout: a row or key held elsewhere, which running the
/// batch again at once would only wait for again.
fn waited(fault: &Fault) -> bool {
    fault.is(&SqlState::LOCK_NOT_AVAILABLE)
}

/// Where a batch failed: before its COMMIT nothing was written; at its COMMIT the outcome is
/// unknown.
enum Failure {
    BeforeCommit(Fault),
    AtCommit(Fault),
}

async fn place_batch(
    client: &mut Conn,
    orders: &[&NewOrder],
    admitted: &[&Admitted],
) -> Result<Vec<Result<Vec<u8>, OrderRefusal>>, Failure> {
    let (tx, gate) = client.begin().await.map_err(Failure::BeforeCommit)?;
    let view = read_view(&tx, &gate, &Wants::of(orders))
        .await
        .map_err(Failure::BeforeCommit)?;
    // Read under every lock of the batch: ids and times follow the commits.
    let decisions = decide(view, orders, now_millis()).map_err(before)?;
    write_decisions(&tx, &decisions)
        .await
        .map_err(Failure::BeforeCommit)?;
    // Every order of the batch must still be sendable: one whose deadline passed meanwhile
    // (or whose caller gave up) takes the whole batch back, unwritten, and the others are
    // placed alone.
    for (i, order) in admitted.iter().enumerate() {
        if !order.ticket.send(order.deadline) {
            admitted[..i].iter().for_each(|a| a.ticket.unsend());
            return Err(Failure::BeforeCommit(Fault::Store(not_sent())));
        }
    }
    gate.commit(tx).await.map_err(Failure::AtCommit)?;
    Ok(decisions.answers())
}

fn before(e: impl Into<Fault>) -> Failure {
    Failure::BeforeCommit(e.into())
}

/// The stored rows of a batch's keys, by (account, key) pairs.
static KEY_ROWS_SQL: LazyLock<String> = LazyLock::new(|| {
    let columns: Vec<String> = codec::KEY_ROW
        .split(", ")
        .map(|c| format!("i.{c}"))
        .collect();
    format!(
        "SELECT i.account_id, i.key, {} FROM idempotency_keys i
         JOIN unnest($1::text[], $2::text[]) AS u(account_id, key)
           ON i.account_id = u.account_id AND i.key = u.key",
        columns.join(", ")
    )
});

/// The batch's view in one round trip, its locks taken in one order, behind the
/// transaction's bounds.
async fn read_view(tx: &Tx<'_>, gate: &db::Gate, wants: &Wants) -> Result<OrderView, Fault> {
    let accounts: Vec<String> = wants.accounts.iter().map(|a| a.to_string()).collect();
    let key_accounts: Vec<String> = wants.keys.iter().map(|(a, _)| a.to_string()).collect();
    let keys: Vec<&str> = wants.keys.iter().map(|(_, k)| k.as_str()).collect();
    // The account id has a fixed length, so the concatenation names one pair (as in
    // `locks::key_taken`, whose lock this is).
    let scoped: Vec<String> = wants
        .keys
        .iter()
        .map(|(account, key)| format!("{account}{}", key.as_str()))
        .collect();
    // Sent together, in this order: the bounds, the keys' locks (by hash), the balance rows'
    // (by account id), then the reads they guard.
    // Polled, and so sent, in this order (the second triple after the first).
    let ((bounded, locked, balances), (newest, key_rows, products)) = futures_util::future::join(
        futures_util::future::join3(
            gate.limit_waits(tx),
            query(
                tx,
                "SELECT count(pg_advisory_xact_lock(h)) FROM
                 (SELECT hashtextextended(k, 0) AS h FROM unnest($1::text[]) AS k ORDER BY h) AS o",
                &[&scoped],
            ),
            query(
                tx,
                "SELECT account_id, available FROM balances WHERE account_id = ANY($1)
             ORDER BY account_id FOR UPDATE",
                &[&accounts],
            ),
        ),
        futures_util::future::join3(
            // Once the balance rows are locked: every entry committed before is seen.
            query(tx, NEWEST_TXNS_SQL, &[&accounts]),
            // Planned each time: its best plan depends on the table's size (`query_planned`).
            query_planned(tx, &KEY_ROWS_SQL, &[&key_accounts, &keys]),
            query(tx, &PRODUCTS_SQL, &[&wants.products]),
        ),
    )
    .await;
    let outcome = (bounded, locked, balances, newest, key_rows, products);
    let (balances, newest, key_rows, products) = match outcome {
        (Ok(()), Ok(_), Ok(b), Ok(n), Ok(k), Ok(p)) => (b, n, k, p),
        (a, b, c, d, e, f) => {
            let faults = [a.err(), b.err(), c.err(), d.err(), e.err(), f.err()];
            return Err(first_cause(faults).expect("one failed"));
        }
    };
    let mut view = OrderView::default();
    let mut heads = HashMap::new();
    for row in &newest {
        let account = account_of(row, "a ledger entry")?;
        view.newest_txn.insert(account, txn_id(row)?);
        heads.insert(account, head_of(&account, Some(row))?);
    }
    for row in &balances {
        let account = account_of(row, "a balance")?;
        let head = match heads.get(&account) {
            // No entry yet.
            None => LedgerHead::genesis(&account.to_string()),
            Some(Some(head)) => *head,
            // Written by an instance of the version before chained ledgers.
            Some(None) => catch_up(tx, &account).await?,
        };
        let available = row.get("available");
        view.balances.insert(account, Funds { available, head });
    }
    for row in &key_rows {
        let key: String = row.get("key");
        view.stored.insert(
            (account_of(row, "a key row")?, key),
            Box::new(codec::key_record(row)?),
        );
    }
    view.catalog = catalog(&products)?;
    Ok(view)
}

fn account_of(row: &tokio_postgres::Row, what: &str) -> Result<AccountId, StoreError> {
    let account: String = row.get("account_id");
    AccountId::parse(&account)
        .ok_or_else(|| StoreError::Corrupt(format!("{what} of a bad account id")))
}
