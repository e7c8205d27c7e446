//! Whether a store's pages are compressed: a new store's are, and a store keeps what it was
//! created with (sled refuses to open a store with the other setting).

use std::io::ErrorKind;
use std::path::Path;

use crate::store::StoreError;

/// zstd's level for every page sled writes. A negative level leaves literals unencoded, which
/// is where zstd spends its time on messages of a few KiB: at -3 a store of partner-shaped
/// orders keeps 1,796 bytes per order against 4,432 uncompressed in a 40 s fill; level 1 kept
/// 1,509 but placed 24 % fewer orders. Even at -3, `perf/compare.sh` places 14 to 17 % fewer
/// new orders than an uncompressed store (docs/benchmarks.md).
pub(super) const LEVEL: i32 = -3;

/// sled's page cache counts a page at its size in the log, which compression makes about a
/// third of its size in memory; the budget is divided so that `--cache-mb` keeps bounding
/// about the same resident memory on either kind of store.
pub(super) const CACHE_SHRINK: u64 = 3;

/// What the store at `path` was created with, read from sled's `conf` file: compressed when
/// there is none yet (a new store).
///
/// sled took a `conf` of 8 bytes or fewer for empty or torn and wrote it again from the setting
/// it was opened with, and before orderly's patch it never synced it: a power cut could empty
/// the `conf` of a store that already held pages. Such a store says what it is by its newest
/// snapshot (sled writes one at every open that finds the log past the last); one with pages
/// and no snapshot predates compressed stores (whose `conf` is synced before their first page).
pub(super) fn of_store(path: &Path) -> Result<bool, StoreError> {
    let failed = |what: &str, e: std::io::Error| StoreError::Failed(format!("{what}: {e}"));
    let conf = match std::fs::read(path.join("conf")) {
        Ok(conf) => conf,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(true),
        Err(e) => return Err(failed("reading the store's conf", e)),
    };
    if conf.len() <= SLEDS_EMPTY_CONF {
        let holds_pages = match std::fs::metadata(path.join("db")) {
            Ok(db) => db.len() > 0,
            Err(e) if e.kind() == ErrorKind::NotFound => false,
            Err(e) => return Err(failed("reading the store's data file", e)),
        };
        if !holds_pages {
            return Ok(true);
        }
        let snapshot =
            newest_snapshot(path).map_err(|e| failed("reading the store's snapshot", e))?;
        return Ok(snapshot.is_some_and(|bytes| snapshot_is_compressed(&bytes)));
    }
    setting(&conf).ok_or_else(|| {
        StoreError::Failed("the store's conf file does not say whether it is compressed".into())
    })
}

/// sled's `read_config`: a `conf` this short is empty or torn.
const SLEDS_EMPTY_CONF: usize = 8;

/// The newest of sled's snapshot files (`snap.` and the 16 hex digits of its position in the
/// log, `.generating` while sled writes it, synced before it is renamed), if any is whole
/// enough to hold its trailer.
fn newest_snapshot(path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    let mut newest: Option<(u64, std::path::PathBuf)> = None;
    for entry in std::fs::read_dir(path)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(lsn) = name
            .to_str()
            .and_then(|n| n.strip_prefix("snap."))
            .map(|n| n.strip_suffix(".generating").unwrap_or(n))
            .filter(|hex| hex.len() == 16)
            .and_then(|hex| u64::from_str_radix(hex, 16).ok())
        else {
            continue;
        };
        if newest.as_ref().is_none_or(|(at, _)| lsn > *at) {
            newest = Some((lsn, entry.path()));
        }
    }
    match newest {
        None => Ok(None),
        Some((_, file)) => Ok(Some(std::fs::read(file)?).filter(|b| b.len() > SNAPSHOT_TRAILER)),
    }
}

/// A snapshot file ends with the length of its contents uncompressed (8 bytes, little endian)
/// and a CRC (4 bytes).
const SNAPSHOT_TRAILER: usize = 12;

/// zstd's frame magic number, as it starts a compressed snapshot.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// A compressed snapshot is a zstd frame whose trailer states its size uncompressed; an
/// uncompressed one states the size it has.
pub(super) fn snapshot_is_compressed(file: &[u8]) -> bool {
    let body = file.len() - SNAPSHOT_TRAILER;
    let mut stated = [0u8; 8];
    stated.copy_from_slice(&file[body..body + 8]);
    file.starts_with(&ZSTD_MAGIC) && u64::from_le_bytes(stated) != body as u64
}

/// The `use_compression: …` line of a sled `conf` file (text lines, then a CRC of 4 bytes).
fn setting(conf: &[u8]) -> Option<bool> {
    conf.split(|b| *b == b'\n')
        .find_map(|line| line.strip_prefix(b"use_compression: "))
        .and_then(|value| match value {
            b"true" => Some(true),
            b"false" => Some(false),
            _ => None,
        })
}

#[cfg(test)]
mod tests {
    use super::super::reopen::once_released;
    use super::*;

    /// sled opened on `dir`, compressed or not (once an instance the test dropped has let go
    /// of it).
    fn open(dir: &Path, compressed: bool) -> sled::Db {
        once_released(|| {
            sled::Config::new()
                .path(dir)
                .use_compression(compressed)
                .open()
        })
    }

    #[test]
    fn a_conf_file_says_whether_its_store_is_compressed() {
        let conf = |c: &str| {
            format!("segment_size: 524288\nuse_compression: {c}\nversion: 0.34\nv\x19Q\x01")
        };
        assert_eq!(setting(conf("false").as_bytes()), Some(false));
        assert_eq!(setting(conf("true").as_bytes()), Some(true));
        assert_eq!(setting(conf("maybe").as_bytes()), None);
        assert_eq!(setting(b"segment_size: 524288\n"), None);
    }

    #[test]
    fn a_directory_without_a_store_gets_a_compressed_one() {
        let dir = tempfile::tempdir().unwrap();
        assert!(of_store(dir.path()).unwrap());
    }

    #[test]
    fn a_store_whose_conf_a_power_cut_emptied_is_known_by_its_snapshot() {
        for created in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let db = open(dir.path(), created);
            let tree = db.open_tree("orders").unwrap();
            for i in 0u32..2_000 {
                let row = format!("{{\"order\":{i},\"status\":\"processing\"}}");
                tree.insert(i.to_be_bytes(), row.as_bytes()).unwrap();
            }
            db.flush().unwrap();
            drop((tree, db));
            // sled writes a snapshot when it opens a store whose log went past the last one.
            drop(open(dir.path(), created));
            std::fs::write(dir.path().join("conf"), b"").unwrap();
            assert_eq!(of_store(dir.path()).unwrap(), created, "created {created}");
            // And sled, told so, opens it and reads every row.
            let db = open(dir.path(), created);
            assert_eq!(db.open_tree("orders").unwrap().len(), 2_000);
        }
    }

    #[test]
    fn an_emptied_conf_beside_no_pages_is_a_new_store() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("conf"), b"").unwrap();
        assert!(of_store(dir.path()).unwrap());
    }

    #[test]
    fn a_store_keeps_the_setting_it_was_created_with() {
        for created in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            drop(open(dir.path(), created));
            assert_eq!(of_store(dir.path()).unwrap(), created);
        }
    }
}
