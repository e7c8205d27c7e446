//! Upgrades of a sled database written by an earlier layout, applied once when it is opened.

use std::fs::File;
use std::path::Path;

use serde::Deserialize;

use super::codec;
use super::trees::Trees;
use crate::domain::fingerprint::{Fingerprint, Operation};
use crate::domain::time::Millis;
use crate::store::{KeyRecord, StoreError, StoredResponse};

/// The layout this binary writes: bumped by a change an older orderly would misread. Kept
/// in the `meta` tree under `layout` (none there: a store from before the mark, layout 1).
pub(super) const LAYOUT: u32 = 1;

/// Refuses a store written by a newer orderly (its layout above `LAYOUT`); marks the layout
/// of one that has none, and that the store has its layout file (`files.rs`): a store without
/// that file whose `meta` says it had one lost it. `files::inspect` refused a newer store by
/// its file before sled opened it; this is the check of stores from before the file.
pub(super) fn check_layout(trees: &Trees) -> Result<(), StoreError> {
    let meta = trees.db.open_tree("meta")?;
    let mut wrote = false;
    match stored_layout(trees)? {
        Some(found) if found > LAYOUT => {
            return Err(StoreError::Refused(format!(
                "it was written by a newer orderly (layout {found}; this binary knows {LAYOUT}): run that orderly or a newer one"
            )));
        }
        Some(_) => {}
        None => {
            meta.insert(b"layout", &LAYOUT.to_be_bytes())?;
            wrote = true;
        }
    }
    if meta.get(LAYOUT_FILE_KEPT)?.is_none() {
        meta.insert(LAYOUT_FILE_KEPT, &[1u8])?;
        wrote = true;
    }
    if wrote {
        trees.db.flush()?;
    }
    Ok(())
}

/// In `meta`: the store keeps its layout in a file too (written by every orderly since the file).
pub(super) const LAYOUT_FILE_KEPT: &[u8] = b"layout_file";

/// The layout `meta` states, if any.
pub(super) fn stored_layout(trees: &Trees) -> Result<Option<u32>, StoreError> {
    let meta = trees.db.open_tree("meta")?;
    match meta.get(b"layout")? {
        Some(bytes) => <[u8; 4]>::try_from(bytes.as_ref())
            .map(|b| Some(u32::from_be_bytes(b)))
            .map_err(|_| StoreError::Corrupt("the store's layout mark is not 4 bytes".into())),
        None => Ok(None),
    }
}

/// Whether `meta` says the store kept its layout file.
pub(super) fn kept_layout_file(trees: &Trees) -> Result<bool, StoreError> {
    Ok(trees.db.open_tree("meta")?.get(LAYOUT_FILE_KEPT)?.is_some())
}

/// The earlier layout kept a key's binding and its answer in two trees; a database written
/// by it has them merged into the one row at open, once.
pub(super) fn merge_split_key_rows(trees: &Trees, data_dir: &Path) -> Result<(), StoreError> {
    #[derive(Deserialize)]
    struct OldResponse {
        status: u16,
        content_type: String,
        #[serde(with = "serde_bytes")]
        body: Vec<u8>,
        #[allow(dead_code)]
        expires_at: Millis,
    }
    #[derive(Deserialize)]
    struct OldBinding {
        operation: Operation,
        fingerprint: Fingerprint,
        expires_at: Millis,
    }
    let names = trees.db.tree_names();
    let had = |name: &str| names.iter().any(|n| n.as_ref() == name.as_bytes());
    if !had("idem_bindings") {
        return Ok(());
    }
    let bindings = trees.db.open_tree("idem_bindings")?;
    let responses = trees.db.open_tree("idem_responses")?;
    let mut merged = 0usize;
    for entry in bindings.iter() {
        let (scoped, bytes) = entry?;
        let binding: OldBinding = codec::decode(&bytes)?;
        let Some(response) = responses.get(&scoped)? else {
            continue;
        };
        let response: OldResponse = codec::decode(&response)?;
        let row = KeyRecord {
            operation: binding.operation,
            fingerprint: binding.fingerprint,
            expires_at: binding.expires_at,
            response: StoredResponse {
                status: response.status,
                content_type: response.content_type,
                body: response.body,
            },
        };
        trees.idem_keys.insert(scoped, codec::encode(&row)?)?;
        merged += 1;
    }
    durable(trees, data_dir)?;
    trees.db.drop_tree("idem_bindings")?;
    trees.db.drop_tree("idem_responses")?;
    durable(trees, data_dir)?;
    log::info!("merged {merged} idempotency key(s) into one row each");
    Ok(())
}

/// Makes what the upgrade wrote durable as a group commit does (`writer.rs`): sled's flush,
/// then the data file's fdatasync (sled's flush alone does not reach the disk's cache; sled
/// synced its blob files as it wrote them).
pub(super) fn durable(trees: &Trees, data_dir: &Path) -> Result<(), StoreError> {
    let failed = |what: &str, e: std::io::Error| StoreError::Failed(format!("{what}: {e}"));
    trees.db.flush()?;
    File::open(data_dir.join("db"))
        .and_then(|file| file.sync_data())
        .map_err(|e| failed("syncing the data file", e))
}

#[cfg(test)]
mod tests {
    use serde::Serialize;

    use super::super::reopen::once_released;
    use super::*;

    #[derive(Serialize)]
    struct OldResponse<'a> {
        status: u16,
        content_type: &'a str,
        #[serde(with = "serde_bytes")]
        body: &'a [u8],
        expires_at: Millis,
    }

    #[derive(Serialize)]
    struct OldBinding {
        operation: Operation,
        fingerprint: Fingerprint,
        expires_at: Millis,
    }

    #[test]
    fn a_key_written_as_two_rows_by_the_earlier_layout_is_one_row_after_the_upgrade() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        {
            let db = sled::open(&path).unwrap();
            let binding = OldBinding {
                operation: Operation::PlaceOrder,
                fingerprint: Fingerprint([7; 32]),
                expires_at: 1_234,
            };
            let response = OldResponse {
                status: 201,
                content_type: "application/json",
                body: b"{\"id\":\"ord_1\"}",
                expires_at: 1_234,
            };
            let bindings = db.open_tree("idem_bindings").unwrap();
            let responses = db.open_tree("idem_responses").unwrap();
            bindings
                .insert(b"scoped-a", codec::encode(&binding).unwrap())
                .unwrap();
            responses
                .insert(b"scoped-a", codec::encode(&response).unwrap())
                .unwrap();
            // A binding whose answer was never written (the old layout's torn pair) is dropped.
            bindings
                .insert(b"scoped-b", codec::encode(&binding).unwrap())
                .unwrap();
            db.flush().unwrap();
        }
        let trees = once_released(|| Trees::open(&path, 1 << 20));
        merge_split_key_rows(&trees, &path).unwrap();

        let row: KeyRecord =
            codec::decode(&trees.idem_keys.get(b"scoped-a").unwrap().unwrap()).unwrap();
        assert_eq!(row.operation, Operation::PlaceOrder);
        assert_eq!(row.fingerprint, Fingerprint([7; 32]));
        assert_eq!(row.expires_at, 1_234);
        assert_eq!(row.response.status, 201);
        assert_eq!(row.response.body, b"{\"id\":\"ord_1\"}");
        assert!(trees.idem_keys.get(b"scoped-b").unwrap().is_none());
        let names = trees.db.tree_names();
        assert!(!names.iter().any(|n| n.as_ref() == b"idem_bindings"));
        assert!(!names.iter().any(|n| n.as_ref() == b"idem_responses"));
        // Once merged, opening again changes nothing.
        merge_split_key_rows(&trees, &path).unwrap();
        assert_eq!(trees.idem_keys.len(), 1);
    }

    #[test]
    fn a_store_marked_by_a_newer_layout_is_refused_and_an_unmarked_one_is_marked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        {
            let trees = Trees::open(&path, 1 << 20).unwrap();
            check_layout(&trees).unwrap();
            let meta = trees.db.open_tree("meta").unwrap();
            assert_eq!(
                meta.get(b"layout").unwrap().unwrap().as_ref(),
                LAYOUT.to_be_bytes()
            );
            check_layout(&trees).unwrap();
            meta.insert(b"layout", &(LAYOUT + 1).to_be_bytes()).unwrap();
            trees.db.flush().unwrap();
        }
        let trees = once_released(|| Trees::open(&path, 1 << 20));
        match check_layout(&trees) {
            Err(StoreError::Refused(why)) => assert!(why.contains("newer orderly"), "{why}"),
            other => panic!("{other:?}"),
        }
    }
}
