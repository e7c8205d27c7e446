//! `orderly restore --from FILE --data-dir DIR` (or `--database-url URL`): a backup into an
//! empty data directory or an empty PostgreSQL database, all or nothing, even across a crash.
//! The file is read through and checked (format, version, digest, counts, every ledger
//! against its balance) before anything of the target is touched, then read again as the
//! records are written, never held whole; sled builds beside the target and moves the result
//! into place last, PostgreSQL writes in one transaction. Progress goes to stderr.
//!
//! Both readings are of one open file, and the second must end on the digest the first
//! checked: a path rewritten between them (a timer writing the next backup to the same name)
//! is either not seen at all (the file open is the one checked) or refuses the restore (a file
//! rewritten in place), never restores what was not checked.

use crate::bounds::{Deadline, COMMAND_DEADLINE, MAX_PENDING_WRITES};
use std::fs::File;
use std::io::{BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use super::progress::{self, Progress};
use super::{block_on, print_counts, Failure, COMMAND_CACHE_BYTES};
use crate::config::RestoreArgs;
use crate::store::backup_file::{self, BackupError, Reader};
use crate::store::{
    self, open_embedded, Engine, OpenError, RestoreCounts, Snapshot, StoreError, Tally,
};

/// Why a restore did not happen; nothing was left behind.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RestoreError {
    #[error("cannot read {0}: {1}")]
    Read(String, std::io::Error),
    #[error("{0}")]
    Backup(#[from] crate::store::backup_file::BackupError),
    #[error("the backup does not add up: {0}")]
    Inconsistent(crate::store::StoreError),
    #[error("the target {0} is not empty")]
    NotEmpty(String),
    #[error("restoring into {0}: {1}")]
    Store(String, crate::store::StoreError),
    /// The target cannot be opened: a sled store refused, or a schema newer than this binary.
    #[error("restoring into {0}: {1}")]
    Open(String, OpenError),
    #[error("moving the restored data into {0}: {1}")]
    Place(String, std::io::Error),
}

/// A restore that did not happen, as the command says it: exit 2 for what this binary must
/// not read or write (a backup or a target written by a newer orderly, a sled target refused
/// before it was touched), 1 for anything else.
#[derive(Debug, thiserror::Error)]
#[error("restore refused: {0}")]
pub(crate) struct RestoreFailure(#[from] RestoreError);

impl Failure for RestoreFailure {
    fn exit_code(&self) -> u8 {
        match &self.0 {
            RestoreError::Backup(BackupError::Version(found)) if *found > backup_file::VERSION => 2,
            RestoreError::Open(_, open) if open.is_usage() => 2,
            _ => 1,
        }
    }
}

/// `orderly restore`: one JSON object of counts per kind on stdout; or one line on stderr,
/// with nothing written.
pub(crate) fn command(args: &RestoreArgs) -> Result<(), RestoreFailure> {
    let counts = block_on(run(args))?;
    print_counts(&counts);
    Ok(())
}

fn is_empty_dir(dir: &Path) -> bool {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => entries.next().is_none(),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

pub(crate) async fn run(args: &RestoreArgs) -> Result<RestoreCounts, RestoreError> {
    match (&args.database_url, &args.data_dir) {
        (Some(url), _) => into_database(url, &args.from).await,
        (None, Some(dir)) => into_data_dir(dir, &args.from).await,
        (None, None) => Err(RestoreError::NotEmpty(
            "no --data-dir or --database-url".into(),
        )),
    }
}

/// A backup file, open once for both readings.
struct Checked {
    file: File,
    /// The records it holds.
    total: u64,
    /// The digest the first reading verified; the second must end on it.
    sha256: String,
}

/// The backup file opened, read through and checked (format, version, digest, counts, every
/// ledger against its balance), keeping none of it.
fn check_file(from: &Path) -> Result<Checked, RestoreError> {
    let file = File::open(from).map_err(|e| RestoreError::Read(from.display().to_string(), e))?;
    let mut tally = Tally::default();
    let mut progress = Progress::new("checking", None);
    let sha256 = backup_file::check(BufReader::with_capacity(1 << 20, &file), |record| {
        tally.add(record);
        progress.add(1);
    })?;
    progress.finish();
    let counts = tally.finish().map_err(RestoreError::Inconsistent)?;
    Ok(Checked {
        file,
        total: counts.values().sum(),
        sha256,
    })
}

/// The checked file's records, read again from its start as the target takes them. A file
/// that differs from the one checked (its digest, checked again at its end, is another) ends
/// the stream with an error, and the target's restore with it.
fn records_of(from: &Path, checked: Checked) -> Result<Snapshot, RestoreError> {
    let Checked {
        mut file,
        total,
        sha256,
    } = checked;
    file.seek(SeekFrom::Start(0))
        .map_err(|e| RestoreError::Read(from.display().to_string(), e))?;
    let (producer, records) = Snapshot::channel();
    tokio::task::spawn_blocking(move || {
        let changed = |e: BackupError| {
            StoreError::Refused(format!("the backup changed while it was restored: {e}"))
        };
        let mut reader = match Reader::open(BufReader::with_capacity(1 << 20, file)) {
            Ok(reader) => reader.expecting(sha256),
            Err(e) => {
                producer.blocking_send(Err(changed(e)));
                return;
            }
        };
        loop {
            match reader.next_record() {
                Ok(Some(record)) => {
                    if !producer.blocking_send(Ok(record)) {
                        return;
                    }
                }
                Ok(None) => return producer.blocking_finish(),
                Err(e) => {
                    producer.blocking_send(Err(changed(e)));
                    return;
                }
            }
        }
    });
    Ok(progress::counted(
        records,
        Progress::new("restoring", Some(total)),
    ))
}

/// Into PostgreSQL: the backup is checked whole before the schema is migrated, so the one
/// refusal left after it (a target whose orderly tables hold rows, whose schema was there
/// already) has written nothing; the engine's one transaction refuses a database with rows
/// and verifies before it commits, so a refusal, or a restore killed at any instant, leaves
/// the database as it was.
async fn into_database(url: &str, from: &Path) -> Result<RestoreCounts, RestoreError> {
    let deadline = Deadline::after(COMMAND_DEADLINE);
    let checked = check_file(from)?;
    let target = "the database".to_string();
    let engine = Engine::Shared {
        url: url.to_string(),
        pool_size: 2,
        empty_only: true,
    };
    let store = store::open(engine, Default::default(), MAX_PENDING_WRITES as usize)
        .await
        .map_err(|e| RestoreError::Open(target.clone(), e))?;
    let restored = match records_of(from, checked) {
        Ok(records) => store
            .restore(deadline, records)
            .await
            .map_err(|e| RestoreError::Store(target, e)),
        Err(e) => Err(e),
    };
    store.stop(deadline).await;
    restored
}

/// Into a sled directory: built beside the target (`.NAME.restoring`), made durable, then
/// moved into place by one rename and the parent directory fsynced. A restore killed at any
/// instant leaves the target absent or empty, as it was; the next restore removes what the
/// killed one left beside it and starts over.
async fn into_data_dir(data_dir: &Path, from: &Path) -> Result<RestoreCounts, RestoreError> {
    let target = data_dir.display().to_string();
    if !is_empty_dir(data_dir) {
        return Err(RestoreError::NotEmpty(target));
    }
    let checked = check_file(from)?;
    let (parent, staging) = staging_dir(data_dir);
    let _ = std::fs::remove_dir_all(&staging);
    let deadline = Deadline::after(COMMAND_DEADLINE);
    let outcome = async {
        let store = open_embedded(&staging, COMMAND_CACHE_BYTES)
            .await
            .map_err(|e| RestoreError::Open(target.clone(), e))?;
        let restored = match records_of(from, checked) {
            Ok(records) => store
                .restore(deadline, records)
                .await
                .map_err(|e| RestoreError::Store(target.clone(), e)),
            Err(e) => Err(e),
        };
        store.stop(deadline).await;
        restored
    }
    .await;
    let placed = outcome.and_then(|counts| {
        // Over an empty directory or where there is none: one rename either way.
        std::fs::rename(&staging, data_dir)
            .and_then(|()| std::fs::File::open(&parent)?.sync_all())
            .map_err(|e| RestoreError::Place(target.clone(), e))?;
        Ok(counts)
    });
    if placed.is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    placed
}

/// The target's parent directory, and the directory beside the target a restore builds in.
fn staging_dir(data_dir: &Path) -> (PathBuf, PathBuf) {
    let name = data_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "db".into());
    let parent = match data_dir.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let staging = parent.join(format!(".{name}.restoring"));
    (parent, staging)
}
