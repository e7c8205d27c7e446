//! What the writer changes while a backup walks the store. A backup's instant is one writer
//! job (`Changes::start`); from then until its walk has ended, every write to a tree a backup
//! copies notes the key's value from before that write (its pre-image). The first note of a
//! key is its value at the backup's instant, which then replaces whatever the walk read of it.
//!
//! The writer thread is the only writer of the store (every write is a writer job), so these
//! notes are exact. sled's own subscribers (`watch_prefix`) were not: they lose every event
//! after a write that rewrites the same bytes, and then block the writer inside its commit
//! (read in sled 0.34.7's `Tree::insert_inner` and `Subscriber::next_timeout`, and seen in a
//! probe: a key revoked twice during a backup, then 1,500 key creations, stopped every write). A note is taken before the write it describes can be seen: inside the
//! transaction, which commits after its closure returns, and before a write outside one. So a
//! walk that reads a key's new value finds the key's pre-image noted.
//!
//! While no backup runs a write costs one atomic load here. A backup's notes wait in a buffer
//! bounded by `MAX_NOTED_BYTES` until the backup's own thread takes them (`cut`); past the
//! bound the backup is refused rather than the writer slowed or memory grown.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use sled::transaction::TransactionalTree;
use sled::IVec;

use super::spooled::Spooled;
use super::tx::{tx, TxResult};
use crate::store::StoreError;

/// Notes a backup's thread has not taken yet, at most (keys and values, with their overhead):
/// it takes them every millisecond, so only a thread that cannot run for seconds under a
/// full write load comes near.
const MAX_NOTED_BYTES: usize = 32 << 20;
/// What a note costs besides its bytes.
const NOTE_OVERHEAD: usize = 64;

/// A key's value before a write changed it (`None`: the key did not exist).
pub(super) struct Note {
    pub(crate) tree: Spooled,
    pub(crate) key: IVec,
    pub(crate) before: Option<IVec>,
}

/// The backups in flight whose notes the writer takes.
#[derive(Default)]
pub(super) struct Changes {
    /// Whether any backup is in flight: the one load a write pays otherwise.
    recording: AtomicBool,
    backups: Mutex<Vec<Weak<Noted>>>,
}

/// One backup's notes, from its instant until its walk ends.
#[derive(Default)]
pub(super) struct Noted {
    state: Mutex<NotedState>,
}

#[derive(Default)]
struct NotedState {
    notes: Vec<Note>,
    bytes: usize,
    /// The walk has ended: later writes need no note.
    closed: bool,
    /// Notes were dropped for lack of room: the backup cannot be one instant.
    overflowed: bool,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Refused: the store changed faster than a backup could follow.
pub(super) fn too_busy() -> StoreError {
    StoreError::Unavailable("the store changed faster than the backup could follow".into())
}

impl Changes {
    /// A backup's instant: run as a writer job, so that every write after it is noted and
    /// none before it. The notes are the backup's for as long as it holds them.
    pub(super) fn start(&self) -> Arc<Noted> {
        let noted = Arc::new(Noted::default());
        lock(&self.backups).push(Arc::downgrade(&noted));
        self.recording.store(true, Ordering::SeqCst);
        noted
    }

    /// Notes `key`'s value before a write, for every backup in flight.
    fn note(&self, tree: Spooled, key: &[u8], before: Option<IVec>) {
        if !self.recording.load(Ordering::SeqCst) {
            return;
        }
        let mut backups = lock(&self.backups);
        let key = IVec::from(key);
        backups.retain(|backup| match backup.upgrade() {
            Some(noted) => noted.add(tree, &key, &before),
            None => false,
        });
        if backups.is_empty() {
            self.recording.store(false, Ordering::SeqCst);
        }
    }

    /// Whether a write must read (and note) the value it replaces: some backup is in flight.
    fn recording(&self) -> bool {
        self.recording.load(Ordering::SeqCst)
    }

    /// `tree.insert(key, value)` inside a transaction, noted. While no backup runs, the
    /// value it replaces is not read (`set`): that read was a walk of the tree per write;
    /// these reads, with those of the index rows, were about a fifth of the writer's time
    /// under new orders.
    pub(super) fn insert<R>(
        &self,
        kind: Spooled,
        tree: &TransactionalTree,
        key: impl AsRef<[u8]>,
        value: impl Into<IVec>,
    ) -> TxResult<(), R> {
        let key = key.as_ref();
        if !self.recording() {
            tree.set(key, value.into());
            return Ok(());
        }
        let before = tx(tree.insert(key, value.into()))?;
        self.note(kind, key, before);
        Ok(())
    }

    /// `tree.remove(key)` inside a transaction, noted; not read while no backup runs.
    pub(super) fn remove<R>(
        &self,
        kind: Spooled,
        tree: &TransactionalTree,
        key: impl AsRef<[u8]>,
    ) -> TxResult<(), R> {
        let key = key.as_ref();
        if !self.recording() {
            tree.delete(key);
            return Ok(());
        }
        let before = tx(tree.remove(key))?;
        self.note(kind, key, before);
        Ok(())
    }

    /// `tree.insert(key, value)` outside a transaction, noted before it is made (the writer
    /// is the only writer, so the value read is the one the insert replaces).
    pub(super) fn put(
        &self,
        kind: Spooled,
        tree: &sled::Tree,
        key: impl AsRef<[u8]>,
        value: impl Into<IVec>,
    ) -> Result<(), StoreError> {
        let key = key.as_ref();
        if self.recording() {
            self.note(kind, key, tree.get(key)?);
        }
        tree.insert(key, value.into())?;
        Ok(())
    }

    /// `tree.remove(key)` outside a transaction, noted before it is made.
    pub(super) fn delete(
        &self,
        kind: Spooled,
        tree: &sled::Tree,
        key: impl AsRef<[u8]>,
    ) -> Result<(), StoreError> {
        let key = key.as_ref();
        if self.recording() {
            self.note(kind, key, tree.get(key)?);
        }
        tree.remove(key)?;
        Ok(())
    }
}

impl Noted {
    /// Keeps one note; false once the backup needs no more (its walk ended, or it overflowed),
    /// so that the writer stops offering them.
    fn add(&self, tree: Spooled, key: &IVec, before: &Option<IVec>) -> bool {
        let mut state = lock(&self.state);
        if state.closed || state.overflowed {
            return false;
        }
        state.bytes += key.len() + before.as_ref().map_or(0, |v| v.len()) + NOTE_OVERHEAD;
        if state.bytes > MAX_NOTED_BYTES {
            state.overflowed = true;
            state.notes = Vec::new();
            return false;
        }
        state.notes.push(Note {
            tree,
            key: key.clone(),
            before: before.clone(),
        });
        true
    }

    /// The notes taken so far, in the order the writer made them.
    pub(super) fn take(&self) -> Result<Vec<Note>, StoreError> {
        let mut state = lock(&self.state);
        if state.overflowed {
            return Err(too_busy());
        }
        state.bytes = 0;
        Ok(std::mem::take(&mut state.notes))
    }

    /// The last notes: the walk has ended, so no later write can change what it read. A
    /// write noted after this is one the walk did not see (it committed after the walk).
    pub(super) fn close(&self) -> Result<Vec<Note>, StoreError> {
        let notes = self.take();
        lock(&self.state).closed = true;
        notes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_noted_while_no_backup_runs_and_everything_while_one_does() {
        let changes = Changes::default();
        changes.note(Spooled::Order, b"before", None);
        let noted = changes.start();
        changes.note(Spooled::Order, b"a", None);
        changes.note(Spooled::Order, b"a", Some(IVec::from(&b"1"[..])));
        let notes = noted.close().unwrap();
        assert_eq!(
            notes.len(),
            2,
            "every write, in order; the first one decides"
        );
        assert_eq!(&notes[0].key[..], b"a");
        changes.note(Spooled::Order, b"after", None);
        assert!(noted.take().unwrap().is_empty(), "nothing after the close");
        assert!(!changes.recording(), "the writer stops offering notes");
    }

    #[test]
    fn a_write_in_a_transaction_is_seen_and_noted_with_what_it_replaced_only_while_a_backup_runs() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let tree = db.open_tree("t").unwrap();
        tree.insert("k", "0").unwrap();
        let changes = Changes::default();
        let write = |value: Option<&'static str>| {
            tree.transaction(|t| -> TxResult<(), ()> {
                match value {
                    Some(value) => changes.insert(Spooled::Order, t, "k", value)?,
                    None => changes.remove(Spooled::Order, t, "k")?,
                }
                let read = tx(t.get("k"))?;
                assert_eq!(
                    read.as_deref(),
                    value.map(str::as_bytes),
                    "its own write, read back"
                );
                Ok(())
            })
            .unwrap();
        };
        write(None);
        assert_eq!(tree.get("k").unwrap(), None, "removed without reading it");
        write(Some("1"));
        let noted = changes.start();
        write(Some("2"));
        write(None);
        let notes = noted.close().unwrap();
        assert_eq!(
            notes.len(),
            2,
            "only the write and the removal made while the backup ran"
        );
        assert_eq!(
            notes[0].before.as_deref(),
            Some(&b"1"[..]),
            "the value it replaced"
        );
        assert_eq!(
            notes[1].before.as_deref(),
            Some(&b"2"[..]),
            "the value the removal took away"
        );
        assert_eq!(tree.get("k").unwrap(), None);
    }

    #[test]
    fn a_backup_that_went_away_is_forgotten() {
        let changes = Changes::default();
        drop(changes.start());
        changes.note(Spooled::Order, b"a", None);
        assert!(!changes.recording());
    }

    #[test]
    fn notes_past_the_bound_refuse_the_backup_instead_of_growing() {
        let changes = Changes::default();
        let noted = changes.start();
        let big = IVec::from(vec![0u8; 1 << 20]);
        for i in 0..40u32 {
            changes.note(Spooled::Order, &i.to_be_bytes(), Some(big.clone()));
        }
        assert!(matches!(noted.take(), Err(StoreError::Unavailable(_))));
    }
}
