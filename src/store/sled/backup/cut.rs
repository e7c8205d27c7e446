//! A backup's cut: the instant of one writer job, kept while writes go on.
//!
//! Copying every record under the writer stopped the shop for as long as the copy took (11.9 s
//! at a million orders). Instead, the backup's instant is a writer job that starts the
//! writer's notes (`changes`); the walk then reads the live trees outside the writer
//! (`spool`), and each key the writer changed since the instant is noted with its value at
//! the instant, which overrides what the walk read of it. Writes wait for that one job, and
//! for nothing after it: no catch-up, no second job, whatever the store's size.
//!
//! A thread of the backup's takes the notes every millisecond into `Overrides`: values in a
//! spool file of their own, an index of keys in memory, the first note of a key winning (it
//! holds the value at the instant). The index is bounded (`MAX_CHANGED_BYTES`): a store that
//! changes more keys than that during one walk refuses the backup instead of growing.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Seek, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::spool::{spool_error, unlinked_spool};
use crate::store::sled::changes::{too_busy, Note, Noted};
use crate::store::sled::spooled::{Spooled, SpooledRow};
use crate::store::StoreError;

/// Keys changed during one walk that a backup keeps track of, counted with their overhead in
/// the index (about 80 bytes besides the key): about a million keys, which a store under full
/// load changes in some 40 s of walking.
const MAX_CHANGED_BYTES: usize = 96 << 20;
const ENTRY_OVERHEAD: usize = 80;
/// How often the notes are taken from the writer's buffer.
const TAKE_EVERY: Duration = Duration::from_millis(1);

/// Where each noted key keeps its value at the instant in the overrides' file (`None`: the
/// key did not exist then).
type Index = BTreeMap<(Spooled, Vec<u8>), Option<(u64, u32)>>;

/// Values at the instant of the keys changed since: a spool file of values, and in memory an
/// index of where each key's value is.
struct Overrides {
    file: BufWriter<File>,
    written: u64,
    index: Index,
    bytes: usize,
}

impl Overrides {
    fn new(beside: &Path) -> Result<Overrides, StoreError> {
        Ok(Overrides {
            file: BufWriter::with_capacity(1 << 20, unlinked_spool(beside)?),
            written: 0,
            index: BTreeMap::new(),
            bytes: 0,
        })
    }

    /// Keeps each note's value unless the key was noted before (the first note holds the
    /// value at the instant; later ones hold values written since).
    fn record(&mut self, notes: Vec<Note>) -> Result<(), StoreError> {
        for Note { tree, key, before } in notes {
            let entry = match self.index.entry((tree, key.to_vec())) {
                std::collections::btree_map::Entry::Occupied(_) => continue,
                std::collections::btree_map::Entry::Vacant(entry) => entry,
            };
            self.bytes += key.len() + ENTRY_OVERHEAD;
            if self.bytes > MAX_CHANGED_BYTES {
                return Err(too_busy());
            }
            let at = match before {
                Some(value) => {
                    let length = u32::try_from(value.len())
                        .map_err(|_| spool_error(std::io::Error::other("a value over 4 GiB")))?;
                    self.file.write_all(&value).map_err(spool_error)?;
                    let at = self.written;
                    self.written += u64::from(length);
                    Some((at, length))
                }
                None => None,
            };
            entry.insert(at);
        }
        Ok(())
    }

    /// Done recording: the values become readable by position.
    fn into_reader(self) -> Result<Overridden, StoreError> {
        let mut file = self
            .file
            .into_inner()
            .map_err(|e| spool_error(e.into_error()))?;
        file.rewind().map_err(spool_error)?;
        Ok(Overridden {
            file,
            index: self.index,
        })
    }
}

/// Takes a backup's notes on a thread of its own, until the walk ends (`finish`). Dropped
/// without `finish` (the walk failed), it stops, and the writer stops noting.
pub(in crate::store::sled) struct Following {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<Overrides, StoreError>>>,
}

/// Starts taking the notes of the backup whose instant made `noted`, into files in `beside`.
/// The thread runs at the normal priority: the writer's buffer must not fill while requests
/// keep the CPU busy.
pub(in crate::store::sled) fn follow(
    noted: Arc<Noted>,
    beside: &Path,
) -> Result<Following, StoreError> {
    let mut overrides = Overrides::new(beside)?;
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = Arc::clone(&stop);
    let thread = std::thread::Builder::new()
        .name("orderly-backup-notes".into())
        .spawn(move || loop {
            // Read before the take: once the walk has ended, this take is not the last.
            let walked = stopping.load(Ordering::SeqCst);
            if walked {
                // The last notes: after these, nothing the walk read can have changed
                // unnoted. The writer stops noting for this backup.
                overrides.record(noted.close()?)?;
                return Ok(overrides);
            }
            overrides.record(noted.take()?)?;
            std::thread::sleep(TAKE_EVERY);
        })
        .map_err(|e| StoreError::Unavailable(format!("starting a backup's thread: {e}")))?;
    Ok(Following {
        stop,
        thread: Some(thread),
    })
}

impl Following {
    /// The walk has ended: takes the last notes and returns what they override.
    pub(in crate::store::sled) fn finish(mut self) -> Result<Overridden, StoreError> {
        self.stop.store(true, Ordering::SeqCst);
        let thread = self.thread.take().expect("finished once");
        thread
            .join()
            .map_err(|_| StoreError::Corrupt("a backup's notes thread panicked".into()))??
            .into_reader()
    }
}

impl Drop for Following {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// The overrides, read back while the walk's spool is streamed.
pub(in crate::store::sled) struct Overridden {
    file: File,
    index: Index,
}

/// What the cut says of a key the walk read.
pub(in crate::store::sled) enum Verdict {
    /// Not changed since the instant: the walk's value stands.
    Walked,
    /// Changed since: this was its value at the instant.
    Then(Vec<u8>),
    /// It did not exist at the instant.
    Absent,
}

impl Overridden {
    /// The cut's word on `key` of `tree`; each override is given once.
    pub(in crate::store::sled) fn verdict(
        &mut self,
        tree: Spooled,
        key: &[u8],
    ) -> Result<Verdict, StoreError> {
        if self.index.is_empty() {
            return Ok(Verdict::Walked);
        }
        match self.index.remove(&(tree, key.to_vec())) {
            None => Ok(Verdict::Walked),
            Some(None) => Ok(Verdict::Absent),
            Some(Some(at)) => self.value_at(at).map(Verdict::Then),
        }
    }

    /// The next key that existed at the instant and that the walk did not give before `tree`
    /// (or at all, with `None`): a key removed after the instant, before the walk reached it.
    pub(in crate::store::sled) fn next_unwalked(
        &mut self,
        before: Option<Spooled>,
    ) -> Result<Option<SpooledRow>, StoreError> {
        loop {
            let Some(entry) = self.index.first_entry() else {
                return Ok(None);
            };
            if before.is_some_and(|tree| entry.key().0 >= tree) {
                return Ok(None);
            }
            let ((tree, key), at) = entry.remove_entry();
            if let Some(at) = at {
                return Ok(Some((tree, key, self.value_at(at)?)));
            }
        }
    }

    fn value_at(&self, (at, length): (u64, u32)) -> Result<Vec<u8>, StoreError> {
        let mut value = vec![0u8; length as usize];
        self.file
            .read_exact_at(&mut value, at)
            .map_err(spool_error)?;
        Ok(value)
    }
}
