//! Orders in batches: the orders waiting when a runner is free go into one transaction with
//! one COMMIT, so one WAL flush makes all of them durable, and the orders of a hot account
//! queue once per batch on its balance row instead of once per order.
//!
//! A batch reads its view in one round trip, with every lock it needs taken in one order
//! (the keys' advisory locks by hash, then the balance rows by account id, so batches of
//! different instances never wait on each other in a cycle): the balances, the key rows
//! and the catalog. Each order is then decided in turn by `domain::placing::place` on that
//! view as the orders before it left it: the second order of an account sees the first
//! one's debit, a second use of a key in the batch finds it taken, and a refusal writes
//! nothing. The accepted orders' rows go in as one pipeline, then the COMMIT; every order
//! is answered once it is durable.
//!
//! A batch that loses a race (serialization failure, deadlock) is run again, a bounded
//! number of times; a batch that still fails before its COMMIT, or that waited past the lock
//! timeout (a row held elsewhere), is split: each order runs alone (`orders::place_order`),
//! at once and off the runner, so neither one bad order nor one held row holds the others
//! of its batch or the batches queued behind it. A
//! COMMIT whose outcome is unknown fails every order of the batch with that fault: the
//! partner's retry with the same key replays what did commit or places it then.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, LazyLock, Mutex};

use deadpool_postgres::{Object, Pool, Transaction};
use futures_util::future::try_join_all;
use tokio::sync::oneshot;
use tokio_postgres::error::SqlState;

use super::codec;
use super::rows::{insert_key_row, insert_ledger, insert_order, key_row, set_balance};
use super::tx::{first_cause, query, retried, Fault, MAX_TRIES};
use crate::domain::ids::{AccountId, Id, IdKind, OrderId};
use crate::domain::ledger::LedgerEntry;
use crate::domain::order::Order;
use crate::domain::placing::{place, OrderStamp, Placed};
use crate::domain::product::Product;
use crate::domain::time::now_millis;
use crate::store::{KeyRecord, NewOrder, OrderRefusal, StoreError};

/// Orders in one transaction at most: past this, a batch holds its locks longer than the
/// flush it saves.
const MAX_BATCH: usize = 64;
/// Batches in flight at once, per instance: enough to keep the database busy while one
/// batch waits for its flush, few enough that batches stay large under load.
const MAX_RUNNERS: usize = 4;

/// What one order's caller gets: the 200 body or the refusal, or the fault that stopped it.
pub type Answer = Result<Result<Vec<u8>, OrderRefusal>, Fault>;

struct Pending {
    order: NewOrder,
    answer: oneshot::Sender<Answer>,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Pending>,
    runners: usize,
}

/// The queue of orders and the runners that place them, batch by batch.
pub struct Batcher {
    pool: Pool,
    queue: Mutex<Queue>,
    /// The runtime the store was opened on, which outlives every request: runners run
    /// there, not on the HTTP worker that queued the first order (a worker that stops first
    /// at shutdown would take the batch of another worker's requests with it).
    runtime: tokio::runtime::Handle,
}

impl Batcher {
    /// Must be called on the runtime that outlives the store's callers.
    pub fn new(pool: Pool) -> Arc<Self> {
        Arc::new(Batcher {
            pool,
            queue: Mutex::default(),
            runtime: tokio::runtime::Handle::current(),
        })
    }

    /// Queues `order` and resolves with its answer once its batch committed (or failed).
    pub async fn place(self: &Arc<Self>, order: NewOrder) -> Answer {
        let (answer, answered) = oneshot::channel();
        let start_runner = {
            let mut queue = self.queue.lock().expect("the order queue");
            queue.waiting.push_back(Pending { order, answer });
            let start = queue.runners < MAX_RUNNERS;
            if start {
                queue.runners += 1;
            }
            start
        };
        if start_runner {
            // A task of its own: a caller that goes away must not take a batch with it.
            self.runtime.spawn(Arc::clone(self).run());
        }
        answered.await.unwrap_or_else(|_| {
            Err(StoreError::Failed("the order's batch ended without an answer".into()).into())
        })
    }

    /// Places batches until the queue is empty.
    async fn run(self: Arc<Self>) {
        loop {
            let batch: Vec<Pending> = {
                let mut queue = self.queue.lock().expect("the order queue");
                if queue.waiting.is_empty() {
                    queue.runners -= 1;
                    return;
                }
                let n = queue.waiting.len().min(MAX_BATCH);
                queue.waiting.drain(..n).collect()
            };
            self.settle(batch).await;
        }
    }

    /// Runs one batch to its answers: re-run when it loses a race (a serialization failure
    /// or a deadlock), split when it fails before its COMMIT.
    async fn settle(self: &Arc<Self>, batch: Vec<Pending>) {
        let orders: Vec<&NewOrder> = batch.iter().map(|p| &p.order).collect();
        let mut tries = 0;
        let outcome = loop {
            let outcome = match self.client().await {
                Ok(mut client) => place_batch(&mut client, &orders).await,
                Err(fault) => Err(Failure::BeforeCommit(fault)),
            };
            match outcome {
                Err(Failure::BeforeCommit(fault))
                    if fault.retryable() && !waited(&fault) && tries + 1 < MAX_TRIES =>
                {
                    tries += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(5 << tries)).await;
                }
                done => break done,
            }
        };
        match outcome {
            Ok(answers) => {
                for (pending, answer) in batch.into_iter().zip(answers) {
                    let _ = pending.answer.send(Ok(answer));
                }
            }
            Err(Failure::BeforeCommit(fault)) if batch.len() == 1 && !waited(&fault) => {
                let pending = batch.into_iter().next().expect("one order");
                let _ = pending.answer.send(Err(fault));
            }
            Err(Failure::BeforeCommit(fault)) => {
                // Each order alone, at once, each on a connection of its own, as if it had
                // never been batched, and off this runner: an order waiting out a lock (a
                // row held elsewhere past the lock timeout) holds neither the others of its
                // batch nor the batches queued behind it. The lock wait already spent counts
                // as one of its tries.
                let spent = u32::from(waited(&fault));
                let batcher = Arc::clone(self);
                self.runtime.spawn(async move {
                    let alone = batch.iter().map(|p| batcher.alone(&p.order, spent));
                    let answers = futures_util::future::join_all(alone).await;
                    for (pending, answer) in batch.into_iter().zip(answers) {
                        let _ = pending.answer.send(answer);
                    }
                });
            }
            Err(Failure::AtCommit(fault)) => {
                let why = StoreError::from(fault).to_string();
                for pending in batch {
                    let _ = pending
                        .answer
                        .send(Err(StoreError::Failed(why.clone()).into()));
                }
            }
        }
    }

    async fn client(&self) -> Result<Object, Fault> {
        Ok(self.pool.get().await?)
    }

    /// One order in a transaction of its own, with the bounded retries of a lost race
    /// (`spent` of them already used).
    async fn alone(&self, order: &NewOrder, spent: u32) -> Answer {
        retried!(self, spent = spent, |c| super::orders::place_order(
            &mut c, order
        ))
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

/// What a batch is decided on: the rows its transaction read under its locks, and what the
/// orders decided before the current one left (balances, keys now taken).
#[derive(Default)]
pub struct View {
    pub balances: HashMap<AccountId, i64>,
    /// Key rows that were stored before the batch.
    pub stored: HashMap<(AccountId, String), Box<KeyRecord>>,
    /// Keys an accepted order of this batch took: the index of that order.
    taken_here: HashMap<(AccountId, String), usize>,
    pub catalog: HashMap<String, Product>,
}

/// An accepted order's rows.
pub struct Accepted {
    order: Order,
    entry: LedgerEntry,
    /// The idempotency key it used, and the key's row (which holds the 200 body).
    key_name: String,
    key: KeyRecord,
}

/// How one order of a batch was decided: accepted (an index into the accepted orders) or
/// refused.
pub type Decided = Result<usize, OrderRefusal>;

async fn place_batch(
    client: &mut Object,
    orders: &[&NewOrder],
) -> Result<Vec<Result<Vec<u8>, OrderRefusal>>, Failure> {
    let tx = client.transaction().await.map_err(before)?;
    let mut view = read_view(&tx, orders)
        .await
        .map_err(Failure::BeforeCommit)?;
    // Made under every lock of the batch, in batch order: ids and times follow the commits.
    let now = now_millis();
    let mut accepted: Vec<Accepted> = Vec::with_capacity(orders.len());
    let mut decided = Vec::with_capacity(orders.len());
    for new in orders {
        decided.push(decide(&mut view, new, now, &mut accepted).map_err(before)?);
    }
    write_accepted(&tx, &view, &accepted)
        .await
        .map_err(Failure::BeforeCommit)?;
    tx.commit().await.map_err(|e| Failure::AtCommit(e.into()))?;
    Ok(answers(decided, accepted))
}

/// Each order's answer, once its batch is durable: the accepted ones' bodies are moved out
/// of their key rows (written, so no longer needed), not copied.
pub fn answers(
    decided: Vec<Decided>,
    accepted: Vec<Accepted>,
) -> Vec<Result<Vec<u8>, OrderRefusal>> {
    let mut bodies: Vec<Option<Vec<u8>>> = accepted
        .into_iter()
        .map(|a| Some(a.key.response.body))
        .collect();
    decided
        .into_iter()
        .map(|d| d.map(|i| bodies[i].take().expect("one answer per accepted order")))
        .collect()
}

fn before(e: impl Into<Fault>) -> Failure {
    Failure::BeforeCommit(e.into())
}

/// Decides one order on the view as the orders before it in the batch left it.
pub fn decide(
    view: &mut View,
    new: &NewOrder,
    now: crate::domain::time::Millis,
    accepted: &mut Vec<Accepted>,
) -> Result<Decided, StoreError> {
    let account = new.account.id;
    let key = (account, new.claim.key.as_str().to_string());
    if let Some(row) = view.stored.get(&key) {
        return Ok(Err(OrderRefusal::KeyTaken(Some(row.clone()))));
    }
    if let Some(&first) = view.taken_here.get(&key) {
        let row = Box::new(accepted[first].key.clone());
        return Ok(Err(OrderRefusal::KeyTaken(Some(row))));
    }
    let balance = *view
        .balances
        .get(&account)
        .ok_or_else(|| StoreError::Corrupt(format!("account {account} has no balance row")))?;
    let stamp = OrderStamp {
        now,
        order: OrderId::new(),
        txn: Id::new(IdKind::Transaction),
    };
    let catalog = &view.catalog;
    let lookup = |id: &str| Ok::<_, StoreError>(catalog.get(id).cloned());
    let Placed { order, entry } = match place(&new.terms(), lookup, balance, stamp)? {
        Ok(placed) => placed,
        Err(refused) => return Ok(Err(refused.into())),
    };
    let body = new.answer(&order, entry.balance_after);
    view.balances.insert(account, entry.balance_after);
    view.taken_here.insert(key.clone(), accepted.len());
    accepted.push(Accepted {
        order,
        entry,
        key_name: key.1,
        key: key_row(&new.claim, now, body),
    });
    Ok(Ok(accepted.len() - 1))
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

/// The products a batch's lines name.
pub static PRODUCTS_SQL: LazyLock<String> =
    LazyLock::new(|| format!("SELECT {} FROM products WHERE id = ANY($1)", codec::PRODUCT));

/// The batch's view in one round trip, its locks taken in one order.
async fn read_view(tx: &Transaction<'_>, orders: &[&NewOrder]) -> Result<View, Fault> {
    let mut accounts: Vec<String> = orders.iter().map(|o| o.account.id.to_string()).collect();
    accounts.sort();
    accounts.dedup();
    let key_accounts: Vec<String> = orders.iter().map(|o| o.account.id.to_string()).collect();
    let keys: Vec<&str> = orders.iter().map(|o| o.claim.key.as_str()).collect();
    // The account id has a fixed length, so the concatenation names one pair (as in
    // `tx::key_taken`, whose lock this is).
    let scoped: Vec<String> = orders
        .iter()
        .map(|o| format!("{}{}", o.account.id, o.claim.key.as_str()))
        .collect();
    let mut wanted: Vec<String> = orders
        .iter()
        .flat_map(|o| o.lines.iter().map(|l| l.product_id.trim().to_string()))
        .collect();
    wanted.sort();
    wanted.dedup();
    // Sent together, in this order: the keys' locks (by hash), the balance rows' (by account
    // id), then the reads they guard.
    let (locked, balances, key_rows, products) = futures_util::future::join4(
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
        query(tx, &KEY_ROWS_SQL, &[&key_accounts, &keys]),
        query(tx, &PRODUCTS_SQL, &[&wanted]),
    )
    .await;
    let (balances, key_rows, products) = match (locked, balances, key_rows, products) {
        (Ok(_), Ok(b), Ok(k), Ok(p)) => (b, k, p),
        (a, b, c, d) => {
            return Err(first_cause([a.err(), b.err(), c.err(), d.err()]).expect("one failed"))
        }
    };
    let mut view = View::default();
    for row in &balances {
        let account: String = row.get("account_id");
        let account = AccountId::parse(&account)
            .ok_or_else(|| StoreError::Corrupt("a balance of a bad account id".into()))?;
        view.balances.insert(account, row.get("available"));
    }
    for row in &key_rows {
        let account: String = row.get("account_id");
        let account = AccountId::parse(&account)
            .ok_or_else(|| StoreError::Corrupt("a key row of a bad account id".into()))?;
        let key: String = row.get("key");
        view.stored
            .insert((account, key), Box::new(codec::key_record(row)?));
    }
    for row in &products {
        let product = codec::product(row)?;
        view.catalog.insert(product.id.clone(), product);
    }
    Ok(view)
}

/// The accepted orders' rows and each account's final balance, sent as one pipeline.
pub async fn write_accepted(
    tx: &Transaction<'_>,
    view: &View,
    accepted: &[Accepted],
) -> Result<(), Fault> {
    if accepted.is_empty() {
        return Ok(());
    }
    let mut debited: Vec<AccountId> = accepted.iter().map(|a| a.order.account_id).collect();
    debited.sort();
    debited.dedup();
    let balances = try_join_all(
        debited
            .iter()
            .map(|account| set_balance(tx, account, view.balances[account])),
    );
    let rows = try_join_all(accepted.iter().map(|a| async move {
        let account = &a.order.account_id;
        let key = &a.key;
        futures_util::future::try_join3(
            insert_order(tx, &a.order),
            insert_ledger(tx, account, &a.entry),
            insert_key_row(tx, account, &a.key_name, key),
        )
        .await
    }));
    futures_util::future::try_join(balances, rows).await?;
    Ok(())
}
