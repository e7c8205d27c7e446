//! `Inbox`: each event id is claimed by one handler run at a time and, once a run succeeds,
//! marked done for good (fsynced), so a redelivery runs nothing.
//!
//! The claim is the unique insert of seed 000: an id goes into the set of running claims
//! under one mutex, and a second insert of the same id fails and waits for the first run's
//! result instead of starting another. The set lives in memory because the inbox file is
//! held under an exclusive lock for the life of the `Inbox`: one process owns an inbox, so a
//! claim can never outlive the process that made it (a kill -9 mid-handler leaves no stale
//! claim, and the redelivery runs the handler again: at-least-once, as the sender promises).
//! Done ids are lines in an append-only file, fsynced before `done` returns.

use std::collections::{HashMap, HashSet};
use std::fs::{File, TryLockError};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum InboxError {
    #[error("inbox {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("inbox {path} is held by another process (one process owns an inbox)")]
    InUse { path: PathBuf },
    #[error("inbox {path}: damaged record at byte {offset}")]
    Damaged { path: PathBuf, offset: u64 },
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DoneRecord {
    v: u32,
    event: String,
    done_at: String,
}

pub struct Inbox {
    path: PathBuf,
    file: Mutex<File>,
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    done: HashSet<String>,
    /// Event id → the number of the run that holds its claim.
    running: HashMap<String, u64>,
    runs: u64,
}

/// The answer to a claim.
#[must_use]
pub enum Claim<'a> {
    /// The caller holds the event: run the handler, then `done()` (or drop to release).
    Claimed(Ticket<'a>),
    /// A run already succeeded: nothing to do.
    AlreadyDone,
    /// The claim was held by a run that failed while this caller waited for it; the event
    /// is free again for the sender's next redelivery.
    RunFailed,
}

/// A held claim. Dropped without `done()`, it is released.
pub struct Ticket<'a> {
    inbox: &'a Inbox,
    event: String,
    released: bool,
}

/// What `Inbox::handle` did with a delivery.
#[derive(Debug, PartialEq, Eq)]
pub enum Delivery<E> {
    Ran,
    AlreadyDone,
    Failed(E),
    RunFailed,
}

impl Inbox {
    /// Opens (or creates) the inbox file and takes it for this process.
    pub fn open(path: impl AsRef<Path>) -> Result<Inbox, InboxError> {
        let path = path.as_ref().to_path_buf();
        let io_err = |source| InboxError::Io {
            path: path.clone(),
            source,
        };
        let mut file = crate::files::open_appendable(&path).map_err(io_err)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Err(InboxError::InUse { path }),
            Err(TryLockError::Error(e)) => return Err(io_err(e)),
        }
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(io_err)?;
        let mut state = State::default();
        let mut start = 0;
        while let Some(end) = bytes[start..].iter().position(|&b| b == b'\n') {
            let record: DoneRecord =
                serde_json::from_slice(&bytes[start..start + end]).map_err(|_| {
                    InboxError::Damaged {
                        path: path.clone(),
                        offset: start as u64,
                    }
                })?;
            state.done.insert(record.event);
            start += end + 1;
        }
        if start < bytes.len() {
            // A torn last line: a `done` that never returned. Its event was not acknowledged.
            file.set_len(start as u64).map_err(io_err)?;
            file.sync_data().map_err(io_err)?;
        }
        Ok(Inbox {
            path,
            file: Mutex::new(file),
            state: Mutex::new(state),
            changed: Condvar::new(),
        })
    }

    /// Claims `event` for the caller, or waits while another run holds it and answers with
    /// that run's result.
    pub fn claim(&self, event: &str) -> Claim<'_> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.done.contains(event) {
            return Claim::AlreadyDone;
        }
        if let Some(&run) = state.running.get(event) {
            while state.running.get(event) == Some(&run) {
                state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
            }
            return if state.done.contains(event) {
                Claim::AlreadyDone
            } else {
                Claim::RunFailed
            };
        }
        state.runs += 1;
        let run = state.runs;
        state.running.insert(event.to_string(), run);
        Claim::Claimed(Ticket {
            inbox: self,
            event: event.to_string(),
            released: false,
        })
    }

    /// Claims `event` and runs `handler` when the claim is ours: done on `Ok`, released on
    /// `Err`.
    pub fn handle<E>(
        &self,
        event: &str,
        handler: impl FnOnce() -> Result<(), E>,
    ) -> Result<Delivery<E>, InboxError> {
        match self.claim(event) {
            Claim::AlreadyDone => Ok(Delivery::AlreadyDone),
            Claim::RunFailed => Ok(Delivery::RunFailed),
            Claim::Claimed(ticket) => match handler() {
                Ok(()) => ticket.done().map(|()| Delivery::Ran),
                Err(e) => Ok(Delivery::Failed(e)),
            },
        }
    }

    pub fn is_done(&self, event: &str) -> bool {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.done.contains(event)
    }

    fn record_done(&self, event: &str) -> Result<(), InboxError> {
        let mut line = serde_json::to_vec(&DoneRecord {
            v: 1,
            event: event.to_string(),
            done_at: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
        })
        .expect("a record always serializes");
        line.push(b'\n');
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        file.write_all(&line)
            .and_then(|()| file.sync_data())
            .map_err(|source| InboxError::Io {
                path: self.path.clone(),
                source,
            })
    }

    fn finish(&self, event: &str, done: bool) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if done {
            state.done.insert(event.to_string());
        }
        state.running.remove(event);
        self.changed.notify_all();
    }
}

impl Ticket<'_> {
    pub fn event(&self) -> &str {
        &self.event
    }

    /// Marks the event done (durably) and lets any waiting copies answer with that. When the
    /// record cannot be written the claim is released instead, so a redelivery runs again.
    pub fn done(mut self) -> Result<(), InboxError> {
        let written = self.inbox.record_done(&self.event);
        self.inbox.finish(&self.event, written.is_ok());
        self.released = true;
        written
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if !self.released {
            self.inbox.finish(&self.event, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    #[test]
    fn concurrent_copies_run_the_handler_once() {
        let dir = tempfile::tempdir().unwrap();
        let inbox = Arc::new(Inbox::open(dir.path().join("inbox")).unwrap());
        let runs = Arc::new(AtomicU32::new(0));
        let threads: Vec<_> = (0..16)
            .map(|_| {
                let (inbox, runs) = (Arc::clone(&inbox), Arc::clone(&runs));
                std::thread::spawn(move || {
                    inbox
                        .handle("evt_1", || {
                            runs.fetch_add(1, Ordering::SeqCst);
                            std::thread::sleep(std::time::Duration::from_millis(50));
                            Ok::<(), ()>(())
                        })
                        .unwrap()
                })
            })
            .collect();
        for t in threads {
            let d = t.join().unwrap();
            assert!(matches!(d, Delivery::Ran | Delivery::AlreadyDone));
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_failed_run_releases_and_done_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inbox");
        {
            let inbox = Inbox::open(&path).unwrap();
            assert_eq!(
                inbox.handle("evt_1", || Err("boom")).unwrap(),
                Delivery::Failed("boom")
            );
            assert_eq!(
                inbox.handle("evt_1", || Ok::<(), &str>(())).unwrap(),
                Delivery::Ran
            );
        }
        let inbox = Inbox::open(&path).unwrap();
        assert!(inbox.is_done("evt_1"));
        assert_eq!(
            inbox.handle("evt_1", || Ok::<(), &str>(())).unwrap(),
            Delivery::AlreadyDone
        );
    }

    #[test]
    fn a_second_owner_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inbox");
        let _first = Inbox::open(&path).unwrap();
        assert!(matches!(Inbox::open(&path), Err(InboxError::InUse { .. })));
    }
}
