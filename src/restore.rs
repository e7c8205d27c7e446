//! `orderly restore --from FILE --data-dir DIR` (or `--database-url URL`): a backup into an
//! empty data directory or an empty PostgreSQL database, all or nothing. The file is read and checked whole (format, version, digest, counts) before
//! anything is created; the records are written in one writer job and verified (counts, every
//! ledger against its balance); on any failure the directory it created is removed again.

use std::path::Path;

use crate::config::RestoreArgs;
use crate::store::{self, open_embedded, Engine, OpenError, RestoreCounts};

/// Why a restore did not happen; nothing was left behind.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("cannot read {0}: {1}")]
    Read(String, std::io::Error),
    #[error("{0}")]
    Backup(#[from] crate::backup::BackupError),
    #[error("the target {0} is not empty")]
    NotEmpty(String),
    #[error("restoring into {0}: {1}")]
    Store(String, crate::store::StoreError),
}

fn is_empty_dir(dir: &Path) -> bool {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => entries.next().is_none(),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

pub async fn run(args: &RestoreArgs) -> Result<RestoreCounts, RestoreError> {
    match (&args.database_url, &args.data_dir) {
        (Some(url), _) => into_database(url, &args.from).await,
        (None, Some(dir)) => into_data_dir(dir, &args.from).await,
        (None, None) => Err(RestoreError::NotEmpty(
            "no --data-dir or --database-url".into(),
        )),
    }
}

/// Into PostgreSQL: the engine's one transaction refuses a database with rows and verifies
/// before it commits, so a refusal leaves the database as it was.
async fn into_database(url: &str, from: &Path) -> Result<RestoreCounts, RestoreError> {
    let bytes =
        std::fs::read(from).map_err(|e| RestoreError::Read(from.display().to_string(), e))?;
    let records = crate::backup::read(&bytes)?;
    let target = "the database".to_string();
    let engine = Engine::Shared {
        url: url.to_string(),
        pool_size: 2,
    };
    let store = store::open(engine, Default::default()).await.map_err(|e| {
        let why = match e {
            OpenError::Shared(e) => e.to_string(),
            other => other.to_string(),
        };
        RestoreError::Store(target.clone(), crate::store::StoreError::Refused(why))
    })?;
    let restored = store.restore(records).await;
    store.stop().await;
    restored.map_err(|e| RestoreError::Store(target, e))
}

async fn into_data_dir(data_dir: &Path, from: &Path) -> Result<RestoreCounts, RestoreError> {
    let target = data_dir.display().to_string();
    if !is_empty_dir(data_dir) {
        return Err(RestoreError::NotEmpty(target));
    }
    let bytes =
        std::fs::read(from).map_err(|e| RestoreError::Read(from.display().to_string(), e))?;
    let records = crate::backup::read(&bytes)?;
    let existed = data_dir.exists();
    let outcome = async {
        let store = open_embedded(data_dir, 64 << 20).await?;
        let restored = store.restore(records).await;
        store.stop().await;
        restored
    }
    .await;
    outcome.map_err(|e| {
        // All or nothing: what this restore created goes again.
        if existed {
            if let Ok(entries) = std::fs::read_dir(data_dir) {
                for entry in entries.flatten() {
                    let _ = std::fs::remove_dir_all(entry.path())
                        .or_else(|_| std::fs::remove_file(entry.path()));
                }
            }
        } else {
            let _ = std::fs::remove_dir_all(data_dir);
        }
        RestoreError::Store(target, e)
    })
}
