//! `orderly copy --from-data-dir DIR --to-database-url URL`: a stopped sled deployment moved
//! whole into an empty PostgreSQL database. It is a backup and a restore without the file in
//! between: the embedded engine's snapshot (everything as of one instant) goes straight into
//! the shared engine's restore, which migrates the schema, refuses a database with rows, and
//! writes every record in one transaction that commits only once the counts and every
//! ledger sum verify. So there is one path that moves data between engines, not two.

use crate::bounds::{Deadline, COMMAND_DEADLINE, MAX_PENDING_WRITES};
use std::path::Path;

use super::progress::{self, Progress};
use super::{block_on, print_counts, Failure, WALK_CACHE_BYTES};
use crate::config::CopyArgs;
use crate::store::{self, open_embedded, Engine, OpenError, RestoreCounts, Store, StoreError};

/// Why nothing was copied; the target is as it was.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CopyError {
    /// The source cannot be read: missing, not an orderly directory, or in use by a server
    /// (sled holds a lock on its files while it runs).
    #[error("cannot open {0}: {1}")]
    Source(String, StoreError),
    /// The source is a sled store this binary must not open (newer, or missing a file).
    #[error("{0}")]
    Refused(OpenError),
    #[error("cannot read {0} (no server may be running on it): {1}")]
    Snapshot(String, StoreError),
    #[error("the database: {0}")]
    Target(String),
    #[error("into the database: {0}")]
    Restore(StoreError),
}

/// A copy that did not happen, as the command says it: exit 2 for a source or target this
/// binary must not use (a sled store refused before it was touched, a newer schema), 1 for
/// anything else.
#[derive(Debug, thiserror::Error)]
#[error("copy refused: {0}")]
pub(crate) struct CopyFailure(#[from] CopyError);

impl Failure for CopyFailure {
    fn exit_code(&self) -> u8 {
        match &self.0 {
            CopyError::Refused(_) => 2,
            _ => 1,
        }
    }
}

/// `orderly copy`: one JSON object of counts per kind on stdout; or one line on stderr, the
/// target untouched.
pub(crate) fn command(args: &CopyArgs) -> Result<(), CopyFailure> {
    let counts = block_on(run(&args.from_data_dir, &args.to_database_url))?;
    print_counts(&counts);
    Ok(())
}

pub(crate) async fn run(from: &Path, to_url: &str) -> Result<RestoreCounts, CopyError> {
    let deadline = Deadline::after(COMMAND_DEADLINE);
    let source = from.display().to_string();
    // An empty path would make sled create a fresh deployment and copy nothing.
    if !from.join("db").is_file() {
        return Err(CopyError::Source(
            source,
            StoreError::Refused("no sled database there".into()),
        ));
    }
    let source_store = open_embedded(from, WALK_CACHE_BYTES)
        .await
        .map_err(|e| match e {
            OpenError::Embedded { source: why, .. } => CopyError::Snapshot(source.clone(), why),
            refused => CopyError::Refused(refused),
        })?;
    let copied = into(&*source_store, &source, to_url, deadline).await;
    source_store.stop(deadline).await;
    copied
}

/// The source's snapshot (one instant), streamed into the database as it is read.
async fn into(
    source_store: &dyn Store,
    source: &str,
    to_url: &str,
    deadline: Deadline,
) -> Result<RestoreCounts, CopyError> {
    let snapshot_error = |e| CopyError::Snapshot(source.to_string(), e);
    let total = records_in(source_store, deadline)
        .await
        .map_err(snapshot_error)?;
    let records = source_store
        .snapshot(deadline)
        .await
        .map_err(snapshot_error)?;
    let engine = Engine::Shared {
        url: to_url.to_string(),
        pool_size: 2,
        empty_only: true,
    };
    let target = store::open(engine, Default::default(), MAX_PENDING_WRITES as usize)
        .await
        .map_err(|e| match e {
            e if e.is_usage() => CopyError::Refused(e),
            OpenError::Shared(e) => CopyError::Target(e.to_string()),
            other => CopyError::Target(other.to_string()),
        })?;
    let records = progress::counted(records, Progress::new("copying", Some(total)));
    let restored = target.restore(deadline, records).await;
    target.stop(deadline).await;
    restored.map_err(CopyError::Restore)
}

/// Indexes the embedded engine keeps beside its records: rebuilt, never copied.
const INDEXES: [&str; 3] = ["orders_by_external", "processing", "idem_expiry"];

/// How many records the source holds (its rows, less its indexes): the progress's total.
async fn records_in(store: &dyn Store, deadline: Deadline) -> Result<u64, StoreError> {
    let rows = store.row_counts(deadline).await?;
    Ok(rows
        .iter()
        .filter(|(name, _)| !INDEXES.contains(name))
        .map(|(_, rows)| rows)
        .sum())
}
