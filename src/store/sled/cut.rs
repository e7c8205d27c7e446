//! A backup's cut taken while writes go on: the instant of a short writer job at the end.
//!
//! Copying every record under the writer stopped the shop for as long as the copy took (11.9 s
//! at a million orders). Instead:
//!
//! 1. A writer job subscribes to every spooled tree (sled reports each insert and removal it
//!    applies, transactions included, to a `Subscriber`); a thread of the backup's drains the
//!    subscriptions into the set of keys changed since, so the writer never waits on them.
//! 2. The trees are walked and spooled outside the writer, at disk speed, while writes go on.
//!    A key the walk read may have changed since; every such key is in the changed set.
//! 3. Catch-up rounds, still outside the writer, read the keys changed so far again and record
//!    their values (or their absence) as overrides, until few keys changed during a round.
//! 4. One writer job (no write in flight) takes the last changed keys, reads them once more,
//!    and ends the subscriptions. That job is the cut: every key's value is the walk's, unless
//!    the key changed, and then it is the value read last, which no write followed.
//!
//! Writes wait only for the last job, which reads as many keys as changed during the round
//! before it, whatever the store's size. The overrides keep values in a spool file of their
//! own and only an index in memory; the changed set holds keys only, and is bounded.

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io::{BufWriter, Seek, Write};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::backup::{spool_error, unlinked_spool, Spool, Spooled, SpooledRow, SPOOLED};
use super::trees::Trees;
use super::writer::Writer;
use crate::bounds::{Deadline, REQUEST_DEADLINE};
use crate::store::StoreError;

/// A round that changed at most this many keys is followed by the cut itself.
const FEW_CHANGED: usize = 2_000;
/// Catch-up rounds before the cut is taken however many keys changed.
const MAX_ROUNDS: usize = 6;
/// Keys changed during a backup that it keeps track of at most (a store written faster than a
/// backup can follow refuses the backup rather than grow without end).
const MAX_CHANGED: usize = 4_000_000;
/// How often the subscriptions are drained (each holds 1,024 events before the writer waits).
const DRAIN_EVERY: Duration = Duration::from_millis(1);

type ChangedKey = (Spooled, sled::IVec);
/// Where each key read again keeps its value in the overrides' file (`None`: the key is gone).
type Index = BTreeMap<(Spooled, Vec<u8>), Option<(u64, u32)>>;

struct Watched {
    /// The subscriptions, until the cut ends them (on the writer thread: see `Watch::cut`).
    subscribers: Mutex<Option<Vec<(Spooled, sled::Subscriber)>>>,
    changed: Mutex<HashSet<ChangedKey>>,
    /// More than `MAX_CHANGED` keys changed: some were not kept, so no cut can be taken.
    overflowed: AtomicBool,
}

/// The subscriptions of one backup in progress.
pub struct Watch {
    watched: Arc<Watched>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Watched {
    /// Moves every event the subscriptions hold into the changed set.
    fn drain(subscribers: &mut [(Spooled, sled::Subscriber)], changed: &mut HashSet<ChangedKey>) {
        for (tree, subscriber) in subscribers.iter_mut() {
            while let Ok(event) = subscriber.next_timeout(Duration::ZERO) {
                changed.insert((*tree, event.key().clone()));
            }
        }
    }
}

impl Watch {
    /// Subscribes to every spooled tree. Run as a writer job, so that every write after it is
    /// reported; the returned watch drains on a thread of its own until `cut`.
    pub fn start(trees: &Trees) -> Watch {
        let subscribers = SPOOLED
            .iter()
            .map(|&tree| (tree, trees.spooled_tree(tree).watch_prefix(Vec::new())))
            .collect();
        let watched = Arc::new(Watched {
            subscribers: Mutex::new(Some(subscribers)),
            changed: Mutex::new(HashSet::new()),
            overflowed: AtomicBool::new(false),
        });
        let draining = Arc::clone(&watched);
        std::thread::Builder::new()
            .name("orderly-backup-watch".into())
            .spawn(move || drain_until_cut(draining))
            .expect("spawning the backup's watch thread");
        Watch { watched }
    }

    /// Reads the keys changed so far again, until a round changes few, or `MAX_ROUNDS`.
    /// Returns the keys read again in each round.
    pub fn catch_up(
        &self,
        trees: &Trees,
        overrides: &mut Overrides,
    ) -> Result<Vec<usize>, StoreError> {
        let mut rounds = Vec::new();
        for _ in 0..MAX_ROUNDS {
            self.still_followed()?;
            let keys = std::mem::take(&mut *lock(&self.watched.changed));
            rounds.push(keys.len());
            let few = keys.len() <= FEW_CHANGED;
            overrides.read_again(trees, keys)?;
            if few {
                break;
            }
        }
        Ok(rounds)
    }

    /// The cut: run as a writer job. Ends the subscriptions (here, where no write can be
    /// waiting on a full one) and reads the keys changed since the last round; returns how
    /// many.
    pub fn cut(self, trees: &Trees, overrides: &mut Overrides) -> Result<usize, StoreError> {
        let subscribers = lock(&self.watched.subscribers).take();
        let mut changed = std::mem::take(&mut *lock(&self.watched.changed));
        if let Some(mut subscribers) = subscribers {
            Watched::drain(&mut subscribers, &mut changed);
        }
        self.still_followed()?;
        if changed.len() > MAX_CHANGED {
            return Err(too_busy());
        }
        let read = changed.len();
        overrides.read_again(trees, changed)?;
        Ok(read)
    }
}

impl Watch {
    /// Refused once the changed keys outgrew what the watch keeps.
    fn still_followed(&self) -> Result<(), StoreError> {
        if self.watched.overflowed.load(Ordering::SeqCst) {
            return Err(too_busy());
        }
        Ok(())
    }
}

fn too_busy() -> StoreError {
    StoreError::Unavailable("the store changed faster than the backup could follow".into())
}

/// Drains the subscriptions every `DRAIN_EVERY` until the cut takes them. A watch dropped
/// without a cut (the backup failed, or its writer job was never run) leaves this thread the
/// only holder: it ends the subscriptions itself, each right after draining it.
fn drain_until_cut(watched: Arc<Watched>) {
    loop {
        {
            let mut subscribers = lock(&watched.subscribers);
            let Some(live) = subscribers.as_mut() else {
                return;
            };
            let mut changed = lock(&watched.changed);
            Watched::drain(live, &mut changed);
            if changed.len() > MAX_CHANGED {
                // Keys stop being kept; the cut refuses the backup.
                watched.overflowed.store(true, Ordering::SeqCst);
                changed.clear();
                changed.shrink_to_fit();
                drop(changed);
                abandon(subscribers.take());
                return;
            }
            if Arc::strong_count(&watched) == 1 {
                drop(changed);
                abandon(subscribers.take());
                return;
            }
        }
        std::thread::sleep(DRAIN_EVERY);
    }
}

/// Ends subscriptions off the writer thread: each is drained right before it is dropped, so
/// that the writer (which would hold its list while waiting on a full one) is not waiting.
fn abandon(subscribers: Option<Vec<(Spooled, sled::Subscriber)>>) {
    let mut ignored = HashSet::new();
    for (tree, subscriber) in subscribers.into_iter().flatten() {
        let mut one = [(tree, subscriber)];
        Watched::drain(&mut one, &mut ignored);
        ignored.clear();
    }
}

/// Values read again after the walk, latest first: a spool file of values, and in memory an
/// index of where each key's value is (`None`: the key is gone).
pub struct Overrides {
    file: BufWriter<File>,
    written: u64,
    index: Index,
}

impl Overrides {
    pub fn new(beside: &std::path::Path) -> Result<Overrides, StoreError> {
        Ok(Overrides {
            file: BufWriter::with_capacity(1 << 20, unlinked_spool(beside)?),
            written: 0,
            index: BTreeMap::new(),
        })
    }

    fn read_again(&mut self, trees: &Trees, keys: HashSet<ChangedKey>) -> Result<(), StoreError> {
        for (tree, key) in keys {
            let at = match trees.spooled_tree(tree).get(&key)? {
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
            self.index.insert((tree, key.to_vec()), at);
        }
        Ok(())
    }

    /// Done recording: the values become readable by position.
    pub fn into_reader(self) -> Result<Overridden, StoreError> {
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

/// The overrides, read back while the walk's spool is streamed.
pub struct Overridden {
    file: File,
    index: Index,
}

/// What the cut says of a key the walk read.
pub enum Verdict {
    /// Not changed since the walk: its value stands.
    Walked,
    /// Changed: this is its value at the cut.
    Now(Vec<u8>),
    /// Removed by the cut.
    Gone,
}

impl Overridden {
    /// The cut's word on `key` of `tree`; each override is given once.
    pub fn verdict(&mut self, tree: Spooled, key: &[u8]) -> Result<Verdict, StoreError> {
        if self.index.is_empty() {
            return Ok(Verdict::Walked);
        }
        match self.index.remove(&(tree, key.to_vec())) {
            None => Ok(Verdict::Walked),
            Some(None) => Ok(Verdict::Gone),
            Some(Some(at)) => self.value_at(at).map(Verdict::Now),
        }
    }

    /// The next key the cut holds that the walk did not give before `tree` (or at all, with
    /// `None`): a key written after the walk passed its place.
    pub fn next_unwalked(
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

/// Takes a cut of the store while writes go on: the walk and the catch-up rounds on a blocking
/// thread, the cut itself as one writer job. Returns the walk's spool and what the cut
/// overrides in it.
pub async fn take(
    trees: Arc<Trees>,
    writer: Arc<Writer>,
    beside: PathBuf,
    watch: Watch,
) -> Result<(Spool, Overridden), StoreError> {
    let started = Instant::now();
    let (walked, walk) = tokio::sync::oneshot::channel();
    crate::background::spawn_idle("orderly-backup-walk", move || {
        let walking = || {
            let spool = trees.spool_walk(&beside)?;
            let mut overrides = Overrides::new(&beside)?;
            let rounds = watch.catch_up(&trees, &mut overrides)?;
            Ok::<_, StoreError>((spool, overrides, watch, rounds))
        };
        let _ = walked.send(walking());
    });
    let (spool, mut overrides, watch, rounds) = walk
        .await
        .map_err(|_| StoreError::Corrupt("a backup's walk panicked".into()))??;
    let walked = started.elapsed();
    // The cut waits its turn among the writes as any write does.
    let (overrides, last, held) = writer
        .write(Deadline::after(REQUEST_DEADLINE), move |b| {
            let holding = Instant::now();
            let read = watch.cut(b.trees, &mut overrides)?;
            Ok((overrides, read, holding.elapsed()))
        })
        .await?;
    log::info!(
        "backup: walked in {walked:.1?}, read again {rounds:?} changed keys, then {last} \
         under the writer for {held:.1?}"
    );
    Ok((spool, overrides.into_reader()?))
}
