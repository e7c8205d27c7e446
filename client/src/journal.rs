//! The intent journal: an append-only file of JSON lines, fsynced, locked, read back whole.
//!
//! Why a file and not an embedded database: the journal needs one atomic step (look the
//! intent up and append it if absent) and durability of what was appended. `flock` over the
//! file gives the first across processes and threads, `fdatasync` after each append the
//! second, and a torn last line after a kill -9 is simply a record that was never
//! acknowledged. Every line is a full snapshot of one intent; the last one wins.
//!
//! The rule that makes it safe to share: every change is made under the exclusive lock on a
//! state read fresh from the file, and a finished intent is never reopened.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::basket::IntentId;
use crate::outcome::{Outcome, OutcomeKind};

const FORMAT: u32 = 1;

/// One intent as the journal knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    pub intent: String,
    /// The idempotency key, made once with the intent and sent with every attempt.
    pub key: String,
    /// The exact body of every attempt (UTF-8 JSON, made once).
    pub request: String,
    /// RFC 3339, when the intent was first journaled: the start of its 24-hour horizon.
    pub created_at: String,
    /// Still to be sent (or reconciled) by a `resume`.
    pub pending: bool,
    pub outcome: OutcomeKind,
    pub order_id: Option<String>,
    pub replayed: bool,
    pub attempts: u32,
    pub error: Option<String>,
    pub rate_limit_remaining: Option<u64>,
    pub updated_at: String,
}

impl Entry {
    pub fn created_at(&self) -> SystemTime {
        humantime::parse_rfc3339(&self.created_at).unwrap_or(SystemTime::UNIX_EPOCH)
    }

    pub fn to_outcome(&self) -> Outcome {
        Outcome {
            intent: self.intent.clone(),
            outcome: self.outcome,
            order_id: self.order_id.clone(),
            replayed: self.replayed,
            attempts: self.attempts,
            error: self.error.clone(),
            rate_limit_remaining: self.rate_limit_remaining,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct Record {
    v: u32,
    #[serde(flatten)]
    entry: Entry,
}

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("journal {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("journal {path}: damaged record at byte {offset}: {reason}")]
    Damaged {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
}

/// The result of journaling an intent before its first attempt.
#[derive(Debug)]
pub enum Begun {
    /// Written and fsynced just now.
    New(Entry),
    /// Already there with the same bytes: carry on with its key.
    Existing(Entry),
    /// Already there with other bytes: the caller changed the basket.
    Changed(Entry),
}

pub struct Journal {
    path: PathBuf,
    inner: Mutex<Inner>,
}

struct Inner {
    file: File,
    /// How far the file has been read (always the end of a complete line).
    offset: u64,
    order: Vec<String>,
    entries: HashMap<String, Entry>,
}

enum Lock {
    Shared,
    Exclusive,
}

impl Journal {
    /// Opens the journal at `path`, creating it (and making its directory entry durable).
    pub fn open(path: impl AsRef<Path>) -> Result<Journal, JournalError> {
        let path = path.as_ref().to_path_buf();
        let io_err = |source| JournalError::Io {
            path: path.clone(),
            source,
        };
        let file = crate::files::open_appendable(&path).map_err(io_err)?;
        let journal = Journal {
            path,
            inner: Mutex::new(Inner {
                file,
                offset: 0,
                order: Vec::new(),
                entries: HashMap::new(),
            }),
        };
        journal.read(|_| ())?;
        Ok(journal)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Journals `intent` with `request` unless it is already there; fsynced on return.
    pub fn begin(&self, intent: &IntentId, request: &[u8]) -> Result<Begun, JournalError> {
        let request = String::from_utf8_lossy(request).into_owned();
        self.write(|inner| {
            if let Some(entry) = inner.entries.get(intent.as_str()) {
                return if entry.request == request {
                    Ok((None, Begun::Existing(entry.clone())))
                } else {
                    Ok((None, Begun::Changed(entry.clone())))
                };
            }
            let now = now_text();
            let entry = Entry {
                intent: intent.as_str().to_string(),
                key: uuid::Uuid::new_v4().to_string(),
                request,
                created_at: now.clone(),
                pending: true,
                outcome: OutcomeKind::Unknown,
                order_id: None,
                replayed: false,
                attempts: 0,
                error: None,
                rate_limit_remaining: None,
                updated_at: now,
            };
            Ok((Some(entry.clone()), Begun::New(entry)))
        })
    }

    /// Applies `change` to the intent's current state, read fresh under the lock, and
    /// appends the result, unless the intent is already finished: then nothing is written
    /// and the finished state is returned (another process got there first).
    pub fn update(
        &self,
        intent: &str,
        change: impl FnOnce(&mut Entry),
    ) -> Result<Entry, JournalError> {
        self.write(|inner| {
            let Some(current) = inner.entries.get(intent) else {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("intent {intent} is not in the journal"),
                ));
            };
            if !current.pending {
                return Ok((None, current.clone()));
            }
            let mut next = current.clone();
            change(&mut next);
            next.updated_at = now_text();
            Ok((Some(next.clone()), next))
        })
    }

    pub fn get(&self, intent: &str) -> Result<Option<Entry>, JournalError> {
        self.read(|inner| inner.entries.get(intent).cloned())
    }

    /// Every intent, in the order they were first journaled.
    pub fn entries(&self) -> Result<Vec<Entry>, JournalError> {
        self.read(|inner| {
            inner
                .order
                .iter()
                .map(|id| inner.entries[id].clone())
                .collect()
        })
    }

    fn read<T>(&self, f: impl FnOnce(&Inner) -> T) -> Result<T, JournalError> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        self.locked(&mut inner, Lock::Shared, |inner, _| Ok(f(inner)))
    }

    /// Runs `f` under the exclusive lock on fresh state; appends and fsyncs the entry it
    /// returns, if any.
    fn write<T>(
        &self,
        f: impl FnOnce(&Inner) -> io::Result<(Option<Entry>, T)>,
    ) -> Result<T, JournalError> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        self.locked(&mut inner, Lock::Exclusive, |inner, torn| {
            let (entry, result) = f(inner).map_err(|e| self.io(e))?;
            if let Some(entry) = entry {
                if torn {
                    // A writer died mid-line: that record was never acknowledged.
                    inner.file.set_len(inner.offset).map_err(|e| self.io(e))?;
                }
                let mut line = serde_json::to_vec(&Record {
                    v: FORMAT,
                    entry: entry.clone(),
                })
                .expect("a record always serializes");
                line.push(b'\n');
                inner.file.write_all(&line).map_err(|e| self.io(e))?;
                inner.file.sync_data().map_err(|e| self.io(e))?;
                inner.offset += line.len() as u64;
                inner.apply(entry);
            }
            Ok(result)
        })
    }

    fn locked<T>(
        &self,
        inner: &mut Inner,
        lock: Lock,
        f: impl FnOnce(&mut Inner, bool) -> Result<T, JournalError>,
    ) -> Result<T, JournalError> {
        match lock {
            Lock::Shared => inner.file.lock_shared(),
            Lock::Exclusive => inner.file.lock(),
        }
        .map_err(|e| self.io(e))?;
        let result = self.refresh(inner).and_then(|torn| f(inner, torn));
        let unlocked = inner.file.unlock().map_err(|e| self.io(e));
        let value = result?;
        unlocked?;
        Ok(value)
    }

    /// Reads what other writers appended since the last look; true when the file ends in a
    /// torn line.
    fn refresh(&self, inner: &mut Inner) -> Result<bool, JournalError> {
        let len = inner.file.metadata().map_err(|e| self.io(e))?.len();
        if len < inner.offset {
            // Replaced or truncated behind our back: read it again from the start.
            inner.offset = 0;
            inner.order.clear();
            inner.entries.clear();
        }
        if len == inner.offset {
            return Ok(false);
        }
        let mut bytes = Vec::with_capacity((len - inner.offset) as usize);
        inner
            .file
            .seek(SeekFrom::Start(inner.offset))
            .map_err(|e| self.io(e))?;
        (&inner.file)
            .take(len - inner.offset)
            .read_to_end(&mut bytes)
            .map_err(|e| self.io(e))?;
        let mut start = 0;
        while let Some(end) = bytes[start..].iter().position(|&b| b == b'\n') {
            let line = &bytes[start..start + end];
            let offset = inner.offset + start as u64;
            let record: Record =
                serde_json::from_slice(line).map_err(|e| self.damaged(offset, e.to_string()))?;
            if record.v != FORMAT {
                return Err(self.damaged(offset, format!("unknown format version {}", record.v)));
            }
            inner.apply(record.entry);
            start += end + 1;
        }
        inner.offset += start as u64;
        Ok(start < bytes.len())
    }

    fn io(&self, source: io::Error) -> JournalError {
        JournalError::Io {
            path: self.path.clone(),
            source,
        }
    }

    fn damaged(&self, offset: u64, reason: String) -> JournalError {
        JournalError::Damaged {
            path: self.path.clone(),
            offset,
            reason,
        }
    }
}

impl Inner {
    fn apply(&mut self, entry: Entry) {
        if !self.entries.contains_key(&entry.intent) {
            self.order.push(entry.intent.clone());
        }
        self.entries.insert(entry.intent.clone(), entry);
    }
}

fn now_text() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intent(id: &str) -> IntentId {
        IntentId::parse(id).unwrap()
    }

    #[test]
    fn an_intent_is_journaled_once_with_one_key() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(dir.path().join("j")).unwrap();
        let Begun::New(first) = journal.begin(&intent("a"), b"{}").unwrap() else {
            panic!("expected a new intent");
        };
        let Begun::Existing(again) = journal.begin(&intent("a"), b"{}").unwrap() else {
            panic!("expected the existing intent");
        };
        assert_eq!(first.key, again.key);
        assert!(matches!(
            journal.begin(&intent("a"), b"{\"x\":1}").unwrap(),
            Begun::Changed(_)
        ));
    }

    #[test]
    fn a_second_handle_sees_what_the_first_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let one = Journal::open(dir.path().join("j")).unwrap();
        let two = Journal::open(dir.path().join("j")).unwrap();
        one.begin(&intent("a"), b"{}").unwrap();
        two.update("a", |e| {
            e.pending = false;
            e.outcome = OutcomeKind::Placed;
        })
        .unwrap();
        let seen = one.get("a").unwrap().unwrap();
        assert_eq!(seen.outcome, OutcomeKind::Placed);
        // A finished intent is never reopened by a late writer.
        let after = one
            .update("a", |e| e.outcome = OutcomeKind::Unknown)
            .unwrap();
        assert_eq!(after.outcome, OutcomeKind::Placed);
    }

    #[test]
    fn a_torn_last_line_is_dropped_and_the_journal_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let key = {
            let journal = Journal::open(&path).unwrap();
            match journal.begin(&intent("a"), b"{}").unwrap() {
                Begun::New(e) => e.key,
                other => panic!("{other:?}"),
            }
        };
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"{\"v\":1,\"intent\":\"b\",\"ke")
            .unwrap();
        let journal = Journal::open(&path).unwrap();
        assert_eq!(journal.get("a").unwrap().unwrap().key, key);
        assert!(journal.get("b").unwrap().is_none());
        journal.begin(&intent("c"), b"{}").unwrap();
        let reopened = Journal::open(&path).unwrap();
        let ids: Vec<String> = reopened
            .entries()
            .unwrap()
            .into_iter()
            .map(|e| e.intent)
            .collect();
        assert_eq!(ids, ["a", "c"]);
    }

    #[test]
    fn a_damaged_line_in_the_middle_is_an_error_not_a_guess() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        std::fs::write(&path, b"not json\n").unwrap();
        assert!(matches!(
            Journal::open(&path),
            Err(JournalError::Damaged { offset: 0, .. })
        ));
    }

    #[test]
    fn times_are_written_and_read_back_to_the_millisecond() {
        let now = SystemTime::now();
        let text = humantime::format_rfc3339_millis(now).to_string();
        let back = humantime::parse_rfc3339(&text).unwrap();
        let diff = now.duration_since(back).unwrap();
        assert!(diff.as_millis() < 1);
    }
}
