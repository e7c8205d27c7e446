//! orderly's schema, owned by the binary: numbered migrations embedded at build time, each
//! applied once in its own transaction and recorded in `orderly_schema_migrations`, each
//! under the migration lock so that instances starting together migrate once. A database
//! whose recorded version is above the highest this binary knows is refused: it was
//! migrated by a newer orderly, whose rows this one could misread.

use std::time::{Duration, Instant};

use deadpool_postgres::Object;
use tokio_postgres::types::Type;
use tokio_postgres::IsolationLevel;

/// `(version, SQL)`, in order.
const MIGRATIONS: &[(i32, &str)] = &[
    (1, include_str!("migrations/0001_tables.sql")),
    (2, include_str!("migrations/0002_instances.sql")),
    (3, include_str!("migrations/0003_webhook_operations.sql")),
    (4, include_str!("migrations/0004_limiter_ticks.sql")),
    (5, include_str!("migrations/0005_cache_leases.sql")),
    (6, include_str!("migrations/0006_fenced_deliveries.sql")),
    (7, include_str!("migrations/0007_known_keys.sql")),
    (
        8,
        include_str!("migrations/0008_processing_by_due_time.sql"),
    ),
    (9, include_str!("migrations/0009_database_history.sql")),
    (
        10,
        include_str!("migrations/0010_history_without_privileges.sql"),
    ),
    (
        11,
        include_str!("migrations/0011_restored_keys_at_once.sql"),
    ),
    (12, include_str!("migrations/0012_api_key_ends.sql")),
    (13, include_str!("migrations/0013_chained_ledger.sql")),
];

/// The advisory lock under which migrations run (an arbitrary constant: "orderly").
const MIGRATION_LOCK: i64 = 0x006f_7264_6572_6c79;

/// Why the schema could not be brought up to date.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MigrateError {
    #[error("the database schema is at version {found}, newer than this orderly knows ({known}); run a newer orderly")]
    TooNew { found: i32, known: i32 },
    #[error("{0}")]
    Database(String),
}

impl From<tokio_postgres::Error> for MigrateError {
    fn from(e: tokio_postgres::Error) -> Self {
        MigrateError::Database(super::tx::describe(&e))
    }
}

/// The highest version this binary knows.
pub(super) fn known_version() -> i32 {
    MIGRATIONS.last().map(|(v, _)| *v).unwrap_or(0)
}

/// Applies every pending migration; returns the versions applied. Each runs in a transaction
/// of its own that first takes the migration lock, transaction-scoped (a connection pooler
/// hands the server session on after each transaction, and a session lock would go with it),
/// and then reads which version the database is at: instances starting together take turns,
/// and each migration is applied once.
pub(super) async fn run(client: &mut Object) -> Result<Vec<i32>, MigrateError> {
    let known = known_version();
    let waiting_until = Instant::now() + LOCK_WAIT;
    let mut applied = Vec::new();
    loop {
        let tx = client
            .build_transaction()
            .isolation_level(IsolationLevel::ReadCommitted)
            .start()
            .await?;
        if !tx
            .query_typed_one(
                "SELECT pg_try_advisory_xact_lock($1)",
                &[(&MIGRATION_LOCK, Type::INT8)],
            )
            .await?
            .get::<_, bool>(0)
        {
            // Another instance migrates: its transaction ends, and the lock with it.
            drop(tx);
            if Instant::now() >= waiting_until {
                return Err(MigrateError::Database(format!(
                    "another instance has held the migration lock for {} s",
                    LOCK_WAIT.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        // The notices of `IF NOT EXISTS` ("already exists, skipping") are no news to an
        // operator, and a one-line refusal must stay one line. A table lock the migration's
        // DDL needs is waited for as long as the migration lock is, no longer.
        tx.batch_execute(&format!(
            "SET LOCAL client_min_messages = warning;
             SET LOCAL lock_timeout = '{}ms';
             CREATE TABLE IF NOT EXISTS orderly_schema_migrations (
                 version integer PRIMARY KEY,
                 applied_at timestamptz NOT NULL DEFAULT now()
             )",
            LOCK_WAIT.as_millis()
        ))
        .await?;
        let found: i32 = tx
            .query_typed_one(
                "SELECT COALESCE(max(version), 0) FROM orderly_schema_migrations",
                &[],
            )
            .await?
            .get(0);
        if found > known {
            return Err(MigrateError::TooNew { found, known });
        }
        let Some((version, sql)) = MIGRATIONS.iter().find(|(v, _)| *v > found) else {
            tx.commit().await?;
            return Ok(applied);
        };
        tx.batch_execute(sql).await?;
        tx.execute_typed(
            "INSERT INTO orderly_schema_migrations (version, applied_at) VALUES ($1, now())",
            &[(version, Type::INT4)],
        )
        .await?;
        tx.commit().await?;
        log::info!("database schema migrated to version {version}");
        applied.push(*version);
    }
}

/// How long an instance waits for another one's migrations before it gives up.
const LOCK_WAIT: Duration = Duration::from_secs(60);
