//! What a store's own files say, read before sled opens any of them. sled's recovery writes
//! as it opens (a snapshot, the torn tail zeroed, unused segments cleared, a `conf` written
//! anew when it finds none), so a store it should not open must be refused before that: one
//! written by a newer orderly, or one missing a file it needs. Never write to a store that
//! could not first be read whole.
//!
//! The store's own file beside sled's is the layout mark (`LAYOUT_FILE`): `orderly layout N`,
//! written before a new store's first page. A store without one was written by an orderly
//! from before the mark (its layout is in sled's `meta` tree, `upgrade.rs`), or lost it; which
//! of the two only the `meta` tree says, so it is read from a scratch copy of the store
//! (`read_from_a_copy`), once, and the store itself is opened only when it is the first.

use std::fs::{self, File};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

use super::compression;
use super::upgrade::LAYOUT;
use crate::store::StoreError;

/// The layout mark's file name in the data directory.
pub(super) const LAYOUT_FILE: &str = "layout";

/// How the mark's one line starts.
const MARK_PREFIX: &str = "orderly layout ";

/// What the files say of the store before sled opens it.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Found {
    /// No pages yet: a new store (its mark is written now, before sled writes its first).
    New,
    /// A store with its mark, of a layout this binary reads.
    Marked,
    /// Pages and no mark: a store from before the mark, whose `meta` tree must say so.
    Unmarked,
}

fn failed(what: String, e: std::io::Error) -> StoreError {
    StoreError::Failed(format!("{what}: {e}"))
}

/// A refusal that names the file (exit 2, nothing written).
pub(super) fn refused(file: &str, why: &str) -> StoreError {
    StoreError::Refused(format!(
        "its file {file} {why}; nothing of the store was changed: put the file back from the copy the store came from, or restore a backup"
    ))
}

/// Reads what the store's files say and refuses a store sled must not open. A new store gets
/// its mark here (synced, with its directory), before sled creates anything.
pub(super) fn inspect(path: &Path) -> Result<Found, StoreError> {
    let names = match fs::read_dir(path) {
        Ok(entries) => entries
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| failed(format!("listing {}", path.display()), e))?,
        Err(e) if e.kind() == ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(failed(format!("listing {}", path.display()), e)),
    };
    let has = |name: &str| names.iter().any(|n| n == name);
    let snapshots: Vec<&String> = names.iter().filter(|n| is_snapshot(n)).collect();
    let data_len = file_len(&path.join("db"))?;
    let blobs = blob_count(&path.join("blobs"))?;
    let holds_pages = data_len > 0 || !snapshots.is_empty() || blobs > 0;
    if has(LAYOUT_FILE) {
        read_mark(path)?;
    }
    if !holds_pages {
        if !has(LAYOUT_FILE) {
            write_mark(path)?;
        }
        return Ok(Found::New);
    }
    if !has("conf") {
        // sled would write a new one from the settings it is opened with, right or not.
        return Err(refused("conf", "is missing (sled's settings of the store)"));
    }
    if data_len == 0 {
        return Err(refused("db", "is missing or empty (the store's log)"));
    }
    let compressed = check_conf(path)?;
    if let Some(snapshot) = the_snapshot_sled_reads(path, snapshots)? {
        if compression::snapshot_is_compressed(&snapshot) != compressed {
            // A conf written anew over the store's (an orderly before this check wrote one
            // when it found none): sled would fail to decompress, or misread, every page.
            return Err(refused(
                "conf",
                "does not match the store (it says the pages are compressed or not, and its snapshot says otherwise)",
            ));
        }
    }
    Ok(if has(LAYOUT_FILE) {
        Found::Marked
    } else {
        Found::Unmarked
    })
}

/// sled's snapshot files (`snap.` and 16 hex digits, `.generating` while written), as sled
/// lists them (it skips only `.in___motion`).
fn is_snapshot(name: &str) -> bool {
    name.starts_with("snap.") && !name.ends_with(".in___motion")
}

fn file_len(file: &Path) -> Result<u64, StoreError> {
    match fs::metadata(file) {
        Ok(meta) => Ok(meta.len()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(0),
        Err(e) => Err(failed(format!("reading {}", file.display()), e)),
    }
}

fn blob_count(dir: &Path) -> Result<usize, StoreError> {
    match fs::read_dir(dir) {
        Ok(entries) => Ok(entries.count()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(0),
        Err(e) => Err(failed(format!("listing {}", dir.display()), e)),
    }
}

/// The layout the mark states; a mark that does not parse (cut short, overwritten) or states a
/// layout newer than this binary's is refused.
fn read_mark(path: &Path) -> Result<u32, StoreError> {
    let file = path.join(LAYOUT_FILE);
    let text = fs::read(&file).map_err(|e| failed(format!("reading {}", file.display()), e))?;
    let layout = std::str::from_utf8(&text)
        .ok()
        .and_then(|t| t.strip_prefix(MARK_PREFIX))
        .and_then(|t| t.strip_suffix('\n'))
        .and_then(|n| n.parse::<u32>().ok())
        .ok_or_else(|| {
            refused(
                LAYOUT_FILE,
                "is damaged (it must hold one line, `orderly layout N`)",
            )
        })?;
    too_new(layout)?;
    Ok(layout)
}

/// Refuses a layout newer than this binary's.
pub(super) fn too_new(layout: u32) -> Result<(), StoreError> {
    if layout > LAYOUT {
        return Err(StoreError::Refused(format!(
            "it was written by a newer orderly (layout {layout}; this binary knows {LAYOUT}): run that orderly or a newer one; nothing of the store was changed"
        )));
    }
    Ok(())
}

/// Writes this binary's mark, synced with its directory (created if need be).
pub(super) fn write_mark(path: &Path) -> Result<(), StoreError> {
    fs::create_dir_all(path).map_err(|e| failed(format!("creating {}", path.display()), e))?;
    let file = path.join(LAYOUT_FILE);
    let staged = path.join(format!("{LAYOUT_FILE}.new"));
    let write = || -> std::io::Result<()> {
        let mut f = File::create(&staged)?;
        f.write_all(format!("{MARK_PREFIX}{LAYOUT}\n").as_bytes())?;
        f.sync_all()?;
        fs::rename(&staged, &file)?;
        File::open(path)?.sync_all()
    };
    write().map_err(|e| failed(format!("writing {}", file.display()), e))
}

/// Whether the store is compressed, as its `conf` says. sled takes a `conf` of 8 bytes or
/// fewer for empty or torn (a power cut before orderly's patch synced it) and writes it again;
/// `compression::of_store` reads such a store's setting from its snapshot. A longer one must
/// state the setting sled needs.
fn check_conf(path: &Path) -> Result<bool, StoreError> {
    match compression::of_store(path) {
        Err(StoreError::Failed(why)) if why.contains("does not say") => Err(refused(
            "conf",
            "is damaged (it does not say whether the store is compressed)",
        )),
        other => other,
    }
}

/// The snapshot sled will read, which must be whole: the newest by name, passing over a
/// `.generating` one a crash cut short while it was written (vendor/sled change 10: the one
/// before it is what recovery had then). A torn one under its final name is refused here,
/// naming it: sled refuses it with a bare "corruption" after it has already written.
fn the_snapshot_sled_reads(
    path: &Path,
    mut names: Vec<&String>,
) -> Result<Option<Vec<u8>>, StoreError> {
    names.sort();
    for name in names.into_iter().rev() {
        let file = path.join(name);
        let bytes =
            fs::read(&file).map_err(|e| failed(format!("reading {}", file.display()), e))?;
        if snapshot_is_whole(&bytes) {
            return Ok(Some(bytes));
        }
        if !name.ends_with(".generating") {
            return Err(refused(
                name,
                "is cut short or damaged (its checksum does not match)",
            ));
        }
    }
    Ok(None)
}

/// A snapshot file is its body, the body's length uncompressed (8 bytes) and the CRC-32 of the
/// body (4 bytes, little endian), as sled's `read_snapshot` checks it.
fn snapshot_is_whole(bytes: &[u8]) -> bool {
    if bytes.len() <= 12 {
        return false;
    }
    let (body, trailer) = bytes.split_at(bytes.len() - 12);
    let stated = u32::from_le_bytes([trailer[8], trailer[9], trailer[10], trailer[11]]);
    crc32fast::hash(body) == stated
}

/// What `read` finds in a scratch copy of the store beside it (an unmarked store's `meta`):
/// sled's recovery writes, and this store may be one that lost its mark and must not be
/// written. The log and the snapshots are copied, the blob files linked (sled never writes
/// into one), and the copy removed after.
pub(super) fn read_from_a_copy<T>(
    path: &Path,
    read: impl FnOnce(&Path) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let scratch = scratch_dir(path);
    let _ = fs::remove_dir_all(&scratch);
    let copied = copy_store(path, &scratch)
        .map_err(|e| failed(format!("copying the store to {}", scratch.display()), e));
    let layout = copied.and_then(|()| read(&scratch));
    let _ = fs::remove_dir_all(&scratch);
    layout
}

/// Beside the store, on its file system (a link needs the same one).
fn scratch_dir(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "db".into());
    path.with_file_name(format!(".{name}.layout-check"))
}

fn copy_store(from: &Path, to: &Path) -> std::io::Result<()> {
    fs::create_dir_all(to.join("blobs"))?;
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            fs::copy(entry.path(), to.join(entry.file_name()))?;
        }
    }
    match fs::read_dir(from.join("blobs")) {
        Ok(blobs) => {
            for blob in blobs {
                let blob = blob?;
                let target = to.join("blobs").join(blob.file_name());
                if fs::hard_link(blob.path(), &target).is_err() {
                    fs::copy(blob.path(), &target)?;
                }
            }
            Ok(())
        }
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// The fuzzers' entry (`crate::fuzzing`): a store made of `conf`, `layout` and one snapshot
/// holding these bytes (and a log of one byte), inspected as an open would. Whatever the bytes,
/// an answer or a refusal, never a panic; the directory is removed after.
#[cfg(any(test, feature = "fuzzing"))]
pub(super) fn fuzz(conf: &[u8], layout: &[u8], snapshot: &[u8]) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "orderly-fuzz-store-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let write = || -> std::io::Result<()> {
        fs::create_dir_all(&dir)?;
        fs::write(dir.join("conf"), conf)?;
        fs::write(dir.join(LAYOUT_FILE), layout)?;
        fs::write(dir.join("snap.0000000000000010"), snapshot)?;
        fs::write(dir.join("db"), [0u8])
    };
    if write().is_ok() {
        let _ = inspect(&dir);
    }
    let _ = fs::remove_dir_all(&dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_directory_is_a_new_store_and_gets_its_mark() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("db");
        assert_eq!(inspect(&store).unwrap(), Found::New);
        assert_eq!(
            fs::read_to_string(store.join(LAYOUT_FILE)).unwrap(),
            format!("orderly layout {LAYOUT}\n")
        );
        assert_eq!(read_mark(&store).unwrap(), LAYOUT);
    }

    #[test]
    fn a_mark_cut_short_or_newer_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        for text in ["orderly lay", "orderly layout \n", "", "orderly layout 1"] {
            fs::write(dir.path().join(LAYOUT_FILE), text).unwrap();
            let err = inspect(dir.path()).unwrap_err();
            assert!(
                matches!(&err, StoreError::Refused(why) if why.contains("layout")),
                "{text:?}: {err}"
            );
        }
        fs::write(
            dir.path().join(LAYOUT_FILE),
            format!("orderly layout {}\n", LAYOUT + 1),
        )
        .unwrap();
        let err = inspect(dir.path()).unwrap_err();
        assert!(matches!(&err, StoreError::Refused(why) if why.contains("newer orderly")));
    }

    #[test]
    fn pages_without_a_conf_are_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("db"), [1u8; 64]).unwrap();
        let err = inspect(dir.path()).unwrap_err();
        assert!(matches!(&err, StoreError::Refused(why) if why.contains("conf")));
        assert!(!dir.path().join(LAYOUT_FILE).exists(), "nothing written");
    }

    #[test]
    fn a_snapshot_is_whole_only_with_its_checksum() {
        let body = b"a snapshot body".to_vec();
        let mut file = body.clone();
        file.extend_from_slice(&(body.len() as u64).to_le_bytes());
        file.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        assert!(snapshot_is_whole(&file));
        assert!(!snapshot_is_whole(&file[..file.len() - 1]));
        assert!(!snapshot_is_whole(&file[..12]));
    }
}
