//! sled's large values, made as durable as the rest of a commit.
//!
//! sled writes any page over a quarter of its segment (about 128 KiB: one large value, or a
//! leaf of sixteen 8 KiB ones) to a file of its own under `blobs/`, created with
//! `create_new` and never synced, and its log only points at it. Its own flush and our
//! `fdatasync` of `db` cover the pointer, not the file: after a power loss the pointer can
//! outlive the bytes, and that page (every key on it) is unreadable.
//!
//! So each group commit, before sled's flush, lists `blobs/` and fsyncs every file it has not
//! synced at its present length, then the directory. sled's own flusher is off (`trees.rs`),
//! so a flush happens only there, after this listing. The writer may be writing the next
//! batch's blob while the list is taken; its length then differs at the next commit, which
//! syncs it again before that batch is answered. A commit with no new blob pays for one
//! directory listing (three system calls, a few microseconds against the milliseconds of
//! its `fdatasync`).

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::path::PathBuf;

pub struct BlobFiles {
    dir: PathBuf,
    /// Each file's length when it was last fsynced; files sled has removed drop out.
    synced: HashMap<OsString, u64>,
}

impl BlobFiles {
    /// The blob directory of the database at `data_dir`. Files already there when the store
    /// opens were written by an earlier process and are synced at the first commit.
    pub fn of(data_dir: PathBuf) -> Self {
        BlobFiles {
            dir: data_dir.join("blobs"),
            synced: HashMap::new(),
        }
    }

    /// Fsyncs every file new (or grown) since the last call, then the directory if there was
    /// one. Returns how many files it synced.
    pub fn sync_new(&mut self) -> io::Result<usize> {
        let listing = match std::fs::read_dir(&self.dir) {
            Ok(listing) => listing,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e),
        };
        let mut present = HashMap::with_capacity(self.synced.len());
        let mut newly = 0;
        for entry in listing {
            let entry = entry?;
            let name = entry.file_name();
            let length = match entry.metadata() {
                Ok(meta) => meta.len(),
                // sled removed it between the listing and now: nothing left to make durable.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if self.synced.get(&name) != Some(&length) {
                match File::open(entry.path()) {
                    Ok(file) => file.sync_all()?,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                }
                newly += 1;
            }
            present.insert(name, length);
        }
        if newly > 0 {
            File::open(&self.dir)?.sync_all()?;
        }
        self.synced = present;
        Ok(newly)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn blob_dir() -> (tempfile::TempDir, BlobFiles) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("blobs")).unwrap();
        let blobs = BlobFiles::of(dir.path().to_path_buf());
        (dir, blobs)
    }

    fn write(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.path().join("blobs").join(name))
            .unwrap();
        file.write_all(bytes).unwrap();
    }

    #[test]
    fn a_new_file_is_synced_once_and_an_unchanged_one_is_left_alone() {
        let (dir, mut blobs) = blob_dir();
        assert_eq!(
            blobs.sync_new().unwrap(),
            0,
            "an empty directory costs no sync"
        );
        write(&dir, "17", b"crc+kind+value");
        assert_eq!(blobs.sync_new().unwrap(), 1);
        assert_eq!(
            blobs.sync_new().unwrap(),
            0,
            "already synced at this length"
        );
    }

    #[test]
    fn a_file_that_grew_after_its_sync_is_synced_again() {
        // The writer may be half way through the next batch's blob when a commit lists them.
        let (dir, mut blobs) = blob_dir();
        write(&dir, "17", b"crc+");
        assert_eq!(blobs.sync_new().unwrap(), 1);
        write(&dir, "17", b"kind+value");
        assert_eq!(blobs.sync_new().unwrap(), 1);
    }

    #[test]
    fn a_removed_file_is_forgotten_and_a_missing_directory_is_no_error() {
        let (dir, mut blobs) = blob_dir();
        write(&dir, "17", b"value");
        blobs.sync_new().unwrap();
        std::fs::remove_file(dir.path().join("blobs").join("17")).unwrap();
        assert_eq!(blobs.sync_new().unwrap(), 0);
        assert!(blobs.synced.is_empty());
        std::fs::remove_dir(dir.path().join("blobs")).unwrap();
        assert_eq!(blobs.sync_new().unwrap(), 0);
    }
}
