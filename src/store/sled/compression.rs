//! Whether a store's pages are compressed: a new store's are, and a store keeps what it was
//! created with (sled refuses to open a store with the other setting).

use std::io::ErrorKind;
use std::path::Path;

use crate::store::StoreError;

/// zstd's level for every page sled writes. A negative level leaves literals unencoded, which
/// is where zstd spends its time on messages of a few KiB: at -3 a store of partner-shaped
/// orders keeps 1,796 bytes per order against 4,432 uncompressed, at the same rate of new
/// orders; level 1 kept 1,509 but placed 24 % fewer (docs/benchmarks.md).
pub(super) const LEVEL: i32 = -3;

/// sled's page cache counts a page at its size in the log, which compression makes about a
/// third of its size in memory; the budget is divided so that `--cache-mb` keeps bounding
/// about the same resident memory on either kind of store.
pub(super) const CACHE_SHRINK: u64 = 3;

/// What the store at `path` was created with, read from sled's `conf` file: compressed when
/// there is none yet (a new store).
pub(super) fn of_store(path: &Path) -> Result<bool, StoreError> {
    let conf = match std::fs::read(path.join("conf")) {
        Ok(conf) => conf,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(true),
        Err(e) => return Err(StoreError::Failed(format!("reading the store's conf: {e}"))),
    };
    setting(&conf).ok_or_else(|| {
        StoreError::Failed("the store's conf file does not say whether it is compressed".into())
    })
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
    use super::*;

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
    fn a_store_keeps_the_setting_it_was_created_with() {
        for created in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let db = sled::Config::new()
                .path(dir.path())
                .use_compression(created)
                .open()
                .unwrap();
            drop(db);
            assert_eq!(of_store(dir.path()).unwrap(), created);
        }
    }
}
