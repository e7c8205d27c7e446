//! The one place an engine is chosen: the server, `orderly restore`, `orderly copy`,
//! `orderly stats`, the benchmarks and the port's conformance suite all open their store
//! here, from an `Engine` that says where the data lives.

use std::path::PathBuf;
use std::sync::Arc;

// By their roles, not their crates' names: only the engines' folders name sled or
// tokio-postgres (CI checks it).
use super::postgres as shared;
use super::sled as embedded;

use super::{Store, StoreError};
use crate::metrics::Metrics;
/// The embedded engine's flush hook, which the tests use to fail or stall a flush.
pub use embedded::{FlushHook, FlushStep};

/// Where the data lives, and what opening it needs.
pub enum Engine {
    /// sled files in a directory of this machine: one process, nothing else to run.
    Embedded {
        /// The data directory.
        path: PathBuf,
        /// Bound on sled's page cache.
        cache_bytes: u64,
        /// A step run before every group flush (tests stall or fail it); `None` in the binary.
        flush_hook: Option<embedded::FlushHook>,
        /// Run before a backup's walk, after its instant (tests hold a backup in flight with
        /// it); `None` in the binary.
        before_walk: Option<Arc<dyn Fn() + Send + Sync>>,
    },
    /// A PostgreSQL database, shared by any number of instances; migrated on open.
    Shared {
        /// postgres://user:password@host:port/dbname.
        url: String,
        /// How many connections the pool holds at most.
        pool_size: usize,
        /// Opened only into a database whose orderly tables hold no rows, checked before the
        /// schema is touched (a restore or a copy refused leaves the target as it was).
        empty_only: bool,
    },
}

/// Why no store could be opened, by engine: callers word each for their own users.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The sled store could not be opened.
    #[error("cannot open the database in {path}: {source}")]
    Embedded {
        /// The data directory.
        path: String,
        /// Why.
        source: StoreError,
    },
    /// A sled store this binary must not open: written by a newer orderly, or missing or
    /// damaging a file it needs. Refused before sled touched it, a usage error (exit 2, from
    /// every command), like a schema newer than the binary on PostgreSQL.
    #[error("cannot open the database in {path}: {why}")]
    EmbeddedRefused {
        /// The data directory.
        path: String,
        /// What is wrong with it, naming the file.
        why: String,
    },
    /// The PostgreSQL engine could not start.
    #[error("PostgreSQL: {0}")]
    Shared(#[from] shared::OpenError),
}

impl OpenError {
    /// A store this binary must not use as it is (a usage error, exit 2 from every command):
    /// a sled store refused before it was touched, or a schema newer than the binary.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            OpenError::EmbeddedRefused { .. }
                | OpenError::Shared(shared::OpenError::SchemaTooNew(_))
        )
    }
}

/// Opens the store `engine` names; `metrics` counts its commits; at most
/// `max_pending_writes` writes wait for it at once (`--max-pending-writes`).
pub async fn open(
    engine: Engine,
    metrics: Arc<Metrics>,
    max_pending_writes: usize,
) -> Result<Arc<dyn Store>, OpenError> {
    match engine {
        Engine::Embedded {
            path,
            cache_bytes,
            flush_hook,
            before_walk,
        } => embedded::open(embedded::Options {
            path: path.clone(),
            cache_bytes,
            max_pending_writes,
            metrics,
            flush_hook,
            before_walk,
        })
        .map_err(|source| embedded_error(&path, source)),
        Engine::Shared {
            url,
            pool_size,
            empty_only,
        } => Ok(shared::open(shared::Options {
            url,
            pool_size,
            empty_only,
            max_pending_writes,
            metrics,
        })
        .await?),
    }
}

/// Opening a sled store refuses only a store it must not touch (`sled/files.rs`,
/// `sled/upgrade.rs`); every other failure is the engine's.
fn embedded_error(path: &std::path::Path, source: StoreError) -> OpenError {
    match source {
        StoreError::Refused(why) => OpenError::EmbeddedRefused {
            path: path.display().to_string(),
            why,
        },
        source => OpenError::Embedded {
            path: path.display().to_string(),
            source,
        },
    }
}

/// The embedded store at `path` for a command that reads or fills it outside a server
/// (restore, copy): no flush hook, its own metrics.
pub(crate) async fn open_embedded(
    path: &std::path::Path,
    cache_bytes: u64,
) -> Result<Arc<dyn Store>, OpenError> {
    embedded::open(embedded::Options {
        path: path.to_path_buf(),
        cache_bytes,
        max_pending_writes: crate::bounds::MAX_PENDING_WRITES as usize,
        metrics: Default::default(),
        flush_hook: None,
        before_walk: None,
    })
    .map_err(|source| embedded_error(path, source))
}
