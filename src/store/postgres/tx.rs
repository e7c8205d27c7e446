//! What every operation shares: the one error type inside the engine, the statements, the
//! lock that serializes the uses of one key, and the bounded retry of transactions that lost
//! a serialization race or a deadlock.
//!
//! A statement is kept (prepared under a name once per connection, then only bound and
//! executed) only while every connection reached PostgreSQL directly. Behind a connection
//! pooler in transaction mode (PgBouncer's `pool_mode = transaction`) the server session may
//! serve another client between two transactions; a statement prepared under a name in one
//! would be missing in the next, or collide with a stranger's of the same name. There each
//! goes out as Parse, Bind and Execute of the unnamed statement in one exchange
//! (`query_typed`), so nothing of it outlives the exchange; the server plans it each time.

use deadpool_postgres::{GenericClient as _, Object, Transaction};
use std::sync::atomic::{AtomicU8, Ordering};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{Json, ToSql, Type};

use tokio_postgres::{GenericClient, Row, RowStream, Statement};

use super::statement_order::{SendOrder, Turn};
use crate::domain::money::Cents;
use crate::store::StoreError;

/// Transactions tried before a serialization failure or deadlock is the caller's.
pub(super) const MAX_TRIES: u32 = 3;

/// A statement's parameters, each knowing the type it is sent as.
pub(super) type Params<'a> = &'a [&'a (dyn Param + Sync)];

/// A value sent as a statement's parameter, with its PostgreSQL type (the unnamed statement
/// is not described first, so the types go with it).
pub(super) trait Param: ToSql + Sync {
    fn pg_type(&self) -> Type;
}

impl<T: PgType + ToSql + Sync> Param for T {
    fn pg_type(&self) -> Type {
        T::TYPE
    }
}

/// The PostgreSQL type a Rust type is sent as.
pub(super) trait PgType {
    const TYPE: Type;
}

/// The PostgreSQL array type a `Vec` of it is sent as.
pub(super) trait PgElement {
    const ARRAY: Type;
}

macro_rules! pg_types {
    ($($rust:ty => $one:ident, $array:ident;)*) => {$(
        impl PgType for $rust {
            const TYPE: Type = Type::$one;
        }
        impl PgElement for $rust {
            const ARRAY: Type = Type::$array;
        }
    )*};
}

pg_types! {
    String => TEXT, TEXT_ARRAY;
    str => TEXT, TEXT_ARRAY;
    i64 => INT8, INT8_ARRAY;
    i32 => INT4, INT4_ARRAY;
    bool => BOOL, BOOL_ARRAY;
    [u8] => BYTEA, BYTEA_ARRAY;
    Cents => INT8, INT8_ARRAY;
}

impl<T> PgType for Json<T> {
    const TYPE: Type = Type::JSONB;
}

impl<T> PgElement for Json<T> {
    const ARRAY: Type = Type::JSONB_ARRAY;
}

impl<T: PgType + ?Sized> PgType for &T {
    const TYPE: Type = T::TYPE;
}

impl<T: PgElement + ?Sized> PgElement for &T {
    const ARRAY: Type = T::ARRAY;
}

impl<T: PgType> PgType for Option<T> {
    const TYPE: Type = T::TYPE;
}

impl<T: PgElement> PgElement for Option<T> {
    const ARRAY: Type = T::ARRAY;
}

impl<T: PgElement> PgType for Vec<T> {
    const TYPE: Type = T::ARRAY;
}

impl<T: PgElement> PgType for [T] {
    const TYPE: Type = T::ARRAY;
}

/// `params` as tokio-postgres takes them for an unnamed statement.
fn typed<'a>(params: Params<'a>) -> Vec<(&'a (dyn ToSql + Sync), Type)> {
    params
        .iter()
        .map(|p| (*p as &(dyn ToSql + Sync), p.pg_type()))
        .collect()
}

/// How a new connection reaches PostgreSQL, as far as its statements are concerned
/// (`connect::reach`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Reach {
    /// PostgreSQL itself: a statement prepared on the connection stays the connection's.
    Direct,
    /// A pooler that keeps named statements itself (PgBouncer 1.21 and newer with
    /// `max_prepared_statements` above 0): it gives each a name of its own and prepares it
    /// on whichever server session runs it, so a kept statement is never missing there nor
    /// another client's.
    PoolerKeepsStatements,
    /// Anything else in between: a pooler that passes names through, a proxy, or a Unix
    /// socket that cannot say.
    Pooled,
}

/// How this process's connections reach the database, as the first of them found (see
/// `statements_on`).
static REACH: AtomicU8 = AtomicU8::new(UNKNOWN);
const UNKNOWN: u8 = 0;
const DIRECT: u8 = 1;
const POOLED: u8 = 2;
const POOLER_KEEPS: u8 = 3;

/// Records how a new connection reaches the database, before it runs anything. Statements
/// are prepared once per connection and kept only while no connection so far was found
/// behind something that could hand its server session to another client with the
/// statement missing or someone else's under its name: a kept statement outlives its
/// transaction, and behind a transaction pooler that does not keep statements itself the
/// next transaction may run on a server session that never prepared it (or one where
/// another client used that name for another statement). One such connection makes every
/// statement unnamed from then on, for good.
pub(super) fn statements_on(reach: Reach) {
    match reach {
        Reach::Direct => keep_if_first(DIRECT),
        Reach::PoolerKeepsStatements => keep_if_first(POOLER_KEEPS),
        Reach::Pooled => {
            if REACH.swap(POOLED, Ordering::SeqCst) != POOLED && opened() {
                log::info!("{}", how_statements_go());
            }
        }
    }
}

fn keep_if_first(reach: u8) {
    let _ = REACH.compare_exchange(UNKNOWN, reach, Ordering::SeqCst, Ordering::SeqCst);
}

/// Whether statements are prepared and kept, or sent unnamed each time.
fn kept() -> bool {
    matches!(REACH.load(Ordering::SeqCst), DIRECT | POOLER_KEEPS)
}

/// Set once the engine is open: a change of how statements go is news from then on (before,
/// `open` says it once, and a refusal at start stays one line).
static OPENED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn opened() -> bool {
    OPENED.load(Ordering::SeqCst)
}

/// How statements go, for the log: said by `open` once the engine is open.
pub(super) fn how_statements_go() -> &'static str {
    OPENED.store(true, Ordering::SeqCst);
    match REACH.load(Ordering::SeqCst) {
        DIRECT => "PostgreSQL is reached directly: statements are prepared once per connection",
        POOLER_KEEPS => {
            "PostgreSQL is reached through a pooler that keeps prepared statements itself (PgBouncer's max_prepared_statements): statements are prepared once per connection"
        }
        _ => "PostgreSQL is reached through a pooler or a proxy that does not keep prepared statements: every statement is sent unnamed",
    }
}

/// Where statements run: a pooled connection, or a transaction on one.
pub(super) trait Session: Sync {
    fn session(&self) -> &(impl GenericClient + Sync);
    /// The connection's prepared statement for `sql`, prepared on first use and kept.
    fn prepared<'a>(&'a self, sql: &'a str, types: &'a [Type]) -> Preparing<'a>;
    /// The place of a statement asked for now in the order statements go out
    /// (`statement_order`): kept within a transaction, whose pipelines rely on it.
    fn turn(&self) -> Turn<'_> {
        Turn::free()
    }
}

pub(super) type Preparing<'a> =
    futures_util::future::BoxFuture<'a, Result<Statement, tokio_postgres::Error>>;

impl Session for Object {
    fn session(&self) -> &(impl GenericClient + Sync) {
        &***self
    }
    fn prepared<'a>(&'a self, sql: &'a str, types: &'a [Type]) -> Preparing<'a> {
        Box::pin(self.prepare_typed_cached(sql, types))
    }
}

impl Session for Transaction<'_> {
    fn session(&self) -> &(impl GenericClient + Sync) {
        &**self
    }
    fn prepared<'a>(&'a self, sql: &'a str, types: &'a [Type]) -> Preparing<'a> {
        Box::pin(self.prepare_typed_cached(sql, types))
    }
}

/// A transaction whose statements go out in the order they are asked for (`Conn::begin`).
pub(super) struct Tx<'a> {
    inner: Transaction<'a>,
    order: SendOrder,
}

impl<'a> Tx<'a> {
    pub(super) fn new(inner: Transaction<'a>) -> Self {
        Tx {
            inner,
            order: SendOrder::default(),
        }
    }

    pub(super) async fn commit(self) -> Result<(), tokio_postgres::Error> {
        self.inner.commit().await
    }
}

impl Session for Tx<'_> {
    fn session(&self) -> &(impl GenericClient + Sync) {
        &*self.inner
    }
    fn prepared<'a>(&'a self, sql: &'a str, types: &'a [Type]) -> Preparing<'a> {
        Box::pin(self.inner.prepare_typed_cached(sql, types))
    }
    fn turn(&self) -> Turn<'_> {
        self.order.turn()
    }
}

/// The kept statement for `sql` when statements are kept; `None` when they go unnamed.
async fn kept_statement<C: Session>(
    c: &C,
    sql: &str,
    params: Params<'_>,
) -> Result<Option<Statement>, Fault> {
    if !kept() {
        return Ok(None);
    }
    let types: Vec<Type> = params.iter().map(|p| p.pg_type()).collect();
    Ok(Some(c.prepared(sql, &types).await?))
}

fn untyped<'a>(params: Params<'a>) -> Vec<&'a (dyn ToSql + Sync)> {
    params.iter().map(|p| *p as &(dyn ToSql + Sync)).collect()
}

/// Why an operation did not complete.
#[derive(Debug)]
pub(crate) enum Fault {
    Db(tokio_postgres::Error),
    /// No connection could be had (the database is unreachable, or the pool is exhausted).
    Pool(String),
    Store(StoreError),
}

impl From<tokio_postgres::Error> for Fault {
    fn from(e: tokio_postgres::Error) -> Self {
        Fault::Db(e)
    }
}

impl From<StoreError> for Fault {
    fn from(e: StoreError) -> Self {
        Fault::Store(e)
    }
}

impl From<deadpool_postgres::PoolError> for Fault {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        match e {
            // Every connection busy (a stalled database holds them all): nothing was sent.
            deadpool_postgres::PoolError::Timeout(deadpool_postgres::TimeoutType::Wait) => {
                Fault::Store(StoreError::TimedOut(
                    "no database connection was free in time".into(),
                ))
            }
            e => Fault::Pool(e.to_string()),
        }
    }
}

impl Fault {
    pub(crate) fn code(&self) -> Option<&SqlState> {
        match self {
            Fault::Db(e) => e.code(),
            _ => None,
        }
    }

    /// A transaction that lost a race and may succeed when run again: serialization failures,
    /// deadlocks, and a lock waited for longer than the lock timeout.
    pub(crate) fn retryable(&self) -> bool {
        matches!(
            self.code(),
            Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE
                || *c == SqlState::T_R_DEADLOCK_DETECTED
                || *c == SqlState::LOCK_NOT_AVAILABLE
        )
    }

    pub(crate) fn is(&self, code: &SqlState) -> bool {
        self.code() == Some(code)
    }
}

/// Of the outcomes of statements sent together in one transaction, the fault that caused the
/// others: once one statement fails, every later one fails with 25P02 ("current transaction
/// is aborted"), which is neither the reason nor retryable. `None` when all succeeded.
pub(super) fn first_cause(faults: impl IntoIterator<Item = Option<Fault>>) -> Option<Fault> {
    let mut faults: Vec<Fault> = faults.into_iter().flatten().collect();
    let cause = faults
        .iter()
        .position(|f| !f.is(&SqlState::IN_FAILED_SQL_TRANSACTION))
        .unwrap_or(0);
    (!faults.is_empty()).then(|| faults.swap_remove(cause))
}

/// Two statements pipelined in one transaction, both awaited: their outputs, or the fault that
/// caused the other (`first_cause`). `try_join` would answer with whichever failure it saw
/// first, and on a multi-threaded runtime both answers can arrive between its two polls: a
/// lock that waited past its timeout then came back as the second statement's 25P02, a 500
/// instead of the in-progress answer.
pub(super) async fn both<A, B>(
    first: impl std::future::Future<Output = Result<A, Fault>>,
    second: impl std::future::Future<Output = Result<B, Fault>>,
) -> Result<(A, B), Fault> {
    match futures_util::future::join(first, second).await {
        (Ok(a), Ok(b)) => Ok((a, b)),
        (a, b) => Err(first_cause([a.err(), b.err()]).expect("one failed")),
    }
}

/// `both` of three statements.
pub(super) async fn both3<A, B, C>(
    first: impl std::future::Future<Output = Result<A, Fault>>,
    second: impl std::future::Future<Output = Result<B, Fault>>,
    third: impl std::future::Future<Output = Result<C, Fault>>,
) -> Result<(A, B, C), Fault> {
    let (a, (b, c)) = both(first, both(second, third)).await?;
    Ok((a, b, c))
}

/// `both` of four statements.
pub(super) async fn both4<A, B, C, D>(
    first: impl std::future::Future<Output = Result<A, Fault>>,
    second: impl std::future::Future<Output = Result<B, Fault>>,
    third: impl std::future::Future<Output = Result<C, Fault>>,
    fourth: impl std::future::Future<Output = Result<D, Fault>>,
) -> Result<(A, B, C, D), Fault> {
    let ((a, b), (c, d)) = both(both(first, second), both(third, fourth)).await?;
    Ok((a, b, c, d))
}

/// `both` of any number of statements: every output in order, or the fault that caused the
/// others.
pub(super) async fn all<T>(
    statements: impl IntoIterator<Item = impl std::future::Future<Output = Result<T, Fault>>>,
) -> Result<Vec<T>, Fault> {
    let outcomes = futures_util::future::join_all(statements).await;
    let mut outputs = Vec::with_capacity(outcomes.len());
    let mut faults = Vec::new();
    for outcome in outcomes {
        match outcome {
            Ok(output) => outputs.push(output),
            Err(fault) => faults.push(Some(fault)),
        }
    }
    match first_cause(faults) {
        None => Ok(outputs),
        Some(cause) => Err(cause),
    }
}

impl From<Fault> for StoreError {
    fn from(fault: Fault) -> Self {
        let retryable = fault.retryable();
        match fault {
            Fault::Db(e) if retryable => StoreError::Conflict(describe(&e)),
            Fault::Db(e) => StoreError::Failed(describe(&e)),
            Fault::Pool(why) => StoreError::Unavailable(format!("no database connection: {why}")),
            Fault::Store(e) => e,
        }
    }
}

/// The server's SQLSTATE and message when there is one (tokio-postgres's own `Display`
/// says only "db error").
pub(super) fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("database error {}: {}", db.code().code(), db.message()),
        None => format!("the database connection: {e}"),
    }
}

pub(super) async fn query<C: Session>(
    c: &C,
    sql: &str,
    params: Params<'_>,
) -> Result<Vec<Row>, Fault> {
    let turn = c.turn();
    Ok(match kept_statement(c, sql, params).await? {
        Some(statement) => {
            turn.send(c.session().query(&statement, &untyped(params)))
                .await?
        }
        None => {
            turn.send(c.session().query_typed(sql, &typed(params)))
                .await?
        }
    })
}

/// `query`, but always sent unnamed, and so planned each time for its own parameters and the
/// table as it is now. For a read whose best plan changes as a table grows: a kept statement
/// is planned for any parameters once it has run a few times, and that plan stays with the
/// connection. Made while `idempotency_keys` held about a thousand rows, a batch's read of
/// its key rows kept a hash join over a scan of the whole table (40 to 121 ms a batch, tens
/// of thousands of rows later), and new orders through PgBouncer 1.25 fell from 5,578 to
/// 3,151/s over three 10 s runs (`scripts/pooler-compare.sh`; half of the runs, by chance).
pub(super) async fn query_planned<C: Session>(
    c: &C,
    sql: &str,
    params: Params<'_>,
) -> Result<Vec<Row>, Fault> {
    let turn = c.turn();
    Ok(turn
        .send(c.session().query_typed(sql, &typed(params)))
        .await?)
}

pub(super) async fn query_opt<C: Session>(
    c: &C,
    sql: &str,
    params: Params<'_>,
) -> Result<Option<Row>, Fault> {
    let turn = c.turn();
    Ok(match kept_statement(c, sql, params).await? {
        Some(statement) => {
            turn.send(c.session().query_opt(&statement, &untyped(params)))
                .await?
        }
        None => {
            turn.send(c.session().query_typed_opt(sql, &typed(params)))
                .await?
        }
    })
}

pub(super) async fn execute<C: Session>(
    c: &C,
    sql: &str,
    params: Params<'_>,
) -> Result<u64, Fault> {
    let turn = c.turn();
    Ok(match kept_statement(c, sql, params).await? {
        Some(statement) => {
            turn.send(c.session().execute(&statement, &untyped(params)))
                .await?
        }
        None => {
            turn.send(c.session().execute_typed(sql, &typed(params)))
                .await?
        }
    })
}

/// How `alone` opens its transaction: no lock it meets is waited for past `LOCK_TIMEOUT` (a
/// row held by a stalled transaction is this statement's error, not its connection's hang).
static ALONE_BEGIN: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "START TRANSACTION ISOLATION LEVEL READ COMMITTED; SET LOCAL synchronous_commit = on; \
         SET LOCAL lock_timeout = '{}ms'",
        crate::bounds::LOCK_TIMEOUT.as_millis()
    )
});

/// One writing statement as a transaction of its own that states what it relies on: READ
/// COMMITTED (whatever the server's or the role's default), a bound on its lock waits and a
/// COMMIT that waits for durability. BEGIN, the statement and COMMIT go out together: one round trip, like the
/// statement alone. A failed statement makes the COMMIT a rollback, and its error is returned.
pub(super) async fn alone<C: Session>(
    c: &C,
    sql: &str,
    params: Params<'_>,
) -> Result<Vec<Row>, Fault> {
    let session = c.session();
    // Prepared (once per connection) before the transaction, so that its three parts still
    // go out together.
    let statement = kept_statement(c, sql, params).await?;
    let rows = async {
        match &statement {
            Some(statement) => session.query(statement, &untyped(params)).await,
            None => session.query_typed(sql, &typed(params)).await,
        }
    };
    let (begun, rows, committed) = futures_util::future::join3(
        session.batch_execute(&ALONE_BEGIN),
        rows,
        session.batch_execute("COMMIT"),
    )
    .await;
    begun?;
    let rows = rows?;
    committed?;
    Ok(rows)
}

/// The rows of `sql` as they arrive, for a reader that may stop early.
pub(super) async fn query_stream<C: Session>(
    c: &C,
    sql: &str,
    params: Params<'_>,
) -> Result<RowStream, Fault> {
    let turn = c.turn();
    Ok(match kept_statement(c, sql, params).await? {
        Some(statement) => {
            turn.send(c.session().query_raw(&statement, untyped(params)))
                .await?
        }
        None => {
            turn.send(c.session().query_typed_raw(sql, typed(params)))
                .await?
        }
    })
}

/// Runs `$body` (an async expression using `$client`, a connection of `$db` bounded by
/// `$bound`) until it succeeds, fails for good, or has lost `MAX_TRIES` races (serialization
/// failures and deadlocks; a lock timeout is final, its wait was the bound); no try starts
/// once the deadline passed. Evaluates to its last result. `retried!($db, $bound, spent = N,
/// …)` starts with `N` of the tries already used (a batch's lock wait counts as one of its
/// orders' tries).
macro_rules! retried {
    ($db:expr, $bound:expr, |$client:ident| $body:expr) => {
        $crate::store::postgres::tx::retried!($db, $bound, spent = 0u32, |$client| $body)
    };
    ($db:expr, $bound:expr, spent = $spent:expr, |$client:ident| $body:expr) => {{
        let mut tries: u32 = $spent;
        loop {
            let outcome = match $db.conn(&$bound).await {
                Ok(client) => {
                    #[allow(unused_mut)]
                    let mut $client = client;
                    let outcome = $body.await;
                    $client.settle();
                    outcome
                }
                Err(fault) => Err(fault),
            };
            match outcome {
                // A lock waited out is not waited for again: the wait was the bound.
                Err(fault)
                    if fault.retryable()
                        && !fault.is(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE)
                        && tries + 1 < $crate::store::postgres::tx::MAX_TRIES
                        && !$bound.deadline.passed() =>
                {
                    tries += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(5 << tries)).await;
                }
                done => break done,
            }
        }
    }};
}
pub(crate) use retried;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_connection_is_unavailable_and_retryable_while_a_store_fault_keeps_its_kind() {
        let unavailable = StoreError::from(Fault::Pool("timed out".into()));
        assert!(matches!(unavailable, StoreError::Unavailable(_)));
        assert!(unavailable.retryable());
        let corrupt = StoreError::from(Fault::Store(StoreError::Corrupt("bad row".into())));
        assert!(matches!(corrupt, StoreError::Corrupt(_)));
        assert!(!corrupt.retryable());
        assert!(!StoreError::Failed("commit outcome unknown".into()).retryable());
    }
}
