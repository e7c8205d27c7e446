//! orderly's schema, owned by the binary: numbered migrations embedded at build time, each
//! applied once in its own transaction and recorded in `orderly_schema_migrations`, all under
//! one session advisory lock so that instances starting together migrate once. A database
//! whose recorded version is above the highest this binary knows is refused: it was
//! migrated by a newer orderly, whose rows this one could misread.

use std::time::{Duration, Instant};

use deadpool_postgres::Object;

/// `(version, SQL)`, in order.
const MIGRATIONS: &[(i32, &str)] = &[
    (1, include_str!("migrations/0001_tables.sql")),
    (2, include_str!("migrations/0002_instances.sql")),
    (3, include_str!("migrations/0003_webhook_operations.sql")),
    (4, include_str!("migrations/0004_limiter_ticks.sql")),
    (5, include_str!("migrations/0005_cache_leases.sql")),
];

/// The session advisory lock under which migrations run (an arbitrary constant: "orderly").
const MIGRATION_LOCK: i64 = 0x006f_7264_6572_6c79;

/// Why the schema could not be brought up to date.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
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
pub fn known_version() -> i32 {
    MIGRATIONS.last().map(|(v, _)| *v).unwrap_or(0)
}

/// Applies every pending migration; returns the versions applied.
pub async fn run(client: &mut Object) -> Result<Vec<i32>, MigrateError> {
    take_the_lock(client).await?;
    let outcome = apply_pending(client).await;
    // The lock is the session's: released here, or by the server if this connection dies.
    let unlocked = client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await;
    let applied = outcome?;
    unlocked?;
    Ok(applied)
}

/// How long an instance waits for another one's migrations before it gives up.
const LOCK_WAIT: Duration = Duration::from_secs(60);

/// Takes the migration lock, waiting up to `LOCK_WAIT` for an instance that holds it. Polled
/// with `pg_try_advisory_lock` rather than waited on: a blocking `pg_advisory_lock` would be
/// cut off by the session's `lock_timeout` (3 s), and an instance starting beside a long
/// migration would exit instead of waiting for it.
async fn take_the_lock(client: &Object) -> Result<(), MigrateError> {
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        let taken: bool = client
            .query_one("SELECT pg_try_advisory_lock($1)", &[&MIGRATION_LOCK])
            .await?
            .get(0);
        if taken {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(MigrateError::Database(format!(
                "another instance has held the migration lock for {} s",
                LOCK_WAIT.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn apply_pending(client: &mut Object) -> Result<Vec<i32>, MigrateError> {
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS orderly_schema_migrations (
                 version integer PRIMARY KEY,
                 applied_at timestamptz NOT NULL DEFAULT now()
             )",
        )
        .await?;
    let found: i32 = client
        .query_one(
            "SELECT COALESCE(max(version), 0) FROM orderly_schema_migrations",
            &[],
        )
        .await?
        .get(0);
    let known = known_version();
    if found > known {
        return Err(MigrateError::TooNew { found, known });
    }
    let mut applied = Vec::new();
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > found) {
        let tx = client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::ReadCommitted)
            .start()
            .await?;
        tx.batch_execute(sql).await?;
        tx.execute(
            "INSERT INTO orderly_schema_migrations (version, applied_at) VALUES ($1, now())",
            &[version],
        )
        .await?;
        tx.commit().await?;
        log::info!("database schema migrated to version {version}");
        applied.push(*version);
    }
    Ok(applied)
}
