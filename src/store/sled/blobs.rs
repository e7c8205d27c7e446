//! sled's large values, made as durable as the rest of a commit.
//!
//! sled writes any page over a quarter of its segment (about 128 KiB: one large value, or a
//! leaf of 33 rows of about 3.9 KiB) to a file of its own under `blobs/`, created with
//! `create_new`, written whole and closed before its log points at it, and never synced. Its
//! own flush and our `fdatasync` of `db` cover the pointer, not the file: after a power loss
//! the pointer can outlive the bytes, and that page (every key on it) is unreadable.
//!
//! So a commit fsyncs the files sled finished since the last one, then the directory. Which
//! they are, the kernel says: an inotify watch on `blobs/` reports each file closed after
//! writing, so a commit costs one read of the watch however many files are stored (listing
//! the directory and `stat`ing each file cost some 30,000 system calls per commit with 10,000
//! large orders stored). A commit reads the watch twice: before sled's flush, and after it,
//! before the data file's `fdatasync`, so that a file the writer finished while sled flushed
//! (its pointer may be in what was flushed) is synced before the commit answers anyone.
//! sled's own flusher is off (`trees.rs`): a flush happens only there.
//!
//! The files there when the store opens were written by an earlier process and are synced at
//! the first commit, from a listing. Where inotify cannot be had, or its queue overflowed,
//! a commit lists the directory and syncs what it has not synced at its present length (the
//! way every commit used to).

use std::collections::{HashMap, HashSet};
use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

pub(super) struct BlobFiles {
    dir: PathBuf,
    watch: Option<Watch>,
    /// Each file's length when it was last fsynced, by listing; files sled has removed drop
    /// out. Kept only while there is no watch (or it overflowed).
    listed: HashMap<OsString, u64>,
    /// Whether the next commit must list: at the first, and after the watch lost events.
    must_list: bool,
    /// How many times the watch lost events, said in the log at 1, 2, 4, 8, ...
    overflows: u64,
}

impl BlobFiles {
    /// The blob directory of the database at `data_dir`, watched from now on.
    pub(super) fn of(data_dir: PathBuf) -> Self {
        let dir = data_dir.join("blobs");
        let watch = match Watch::on(&dir) {
            Ok(watch) => Some(watch),
            Err(e) => {
                log::warn!(
                    "blob files: no inotify watch on {} ({e}); each commit lists the directory",
                    dir.display()
                );
                None
            }
        };
        BlobFiles {
            dir,
            watch,
            listed: HashMap::new(),
            must_list: true,
            overflows: 0,
        }
    }

    /// Fsyncs every file finished since the last call, then the directory if there was one.
    /// Returns how many files it synced.
    pub(super) fn sync_new(&mut self) -> io::Result<usize> {
        let mut finished = HashSet::new();
        let heard_all = match self.watch.as_mut() {
            Some(watch) => watch.finished(&mut finished)?,
            None => false,
        };
        if !heard_all {
            if self.watch.is_some() {
                self.overflows += 1;
                if self.overflows.is_power_of_two() {
                    log::info!(
                        "blob files: the watch lost events ({} times so far: its queue overflowed, fs.inotify.max_queued_events); that commit lists the directory",
                        self.overflows
                    );
                }
            }
            self.watch = self.watch.take().filter(|w| w.alive);
            self.must_list = true;
        }
        let newly = if self.must_list {
            let newly = self.sync_listed()?;
            // With a watch, what follows is heard; without one, every commit lists.
            self.must_list = self.watch.is_none();
            if !self.must_list {
                self.listed = HashMap::new();
            }
            newly
        } else {
            let mut newly = 0;
            for name in finished {
                newly += usize::from(sync_file(&self.dir.join(name))?);
            }
            newly
        };
        if newly > 0 {
            File::open(&self.dir)?.sync_all()?;
        }
        Ok(newly)
    }

    /// Lists the directory and fsyncs each file not synced at its present length.
    fn sync_listed(&mut self) -> io::Result<usize> {
        let listing = match std::fs::read_dir(&self.dir) {
            Ok(listing) => listing,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e),
        };
        let mut present = HashMap::with_capacity(self.listed.len());
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
            if self.listed.get(&name) != Some(&length) && sync_file(&entry.path())? {
                newly += 1;
            }
            present.insert(name, length);
        }
        self.listed = present;
        Ok(newly)
    }
}

/// Fsyncs one file; false when sled removed it already (nothing left to make durable).
fn sync_file(path: &Path) -> io::Result<bool> {
    match File::open(path) {
        Ok(file) => file.sync_all().map(|()| true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// An inotify watch on one directory for files closed after writing (or moved in).
struct Watch {
    fd: OwnedFd,
    events: Vec<u8>,
    /// False once the kernel dropped the watch (the directory went away).
    alive: bool,
}

const EVENT_HEADER: usize = std::mem::size_of::<libc::inotify_event>();

impl Watch {
    fn on(dir: &Path) -> io::Result<Watch> {
        let path = CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| io::Error::other("a NUL in the path"))?;
        // SAFETY: inotify_init1 takes flags and returns a new descriptor or -1; the descriptor
        // is owned from here on, closed once.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a descriptor just opened and owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: the descriptor is open and `path` a NUL-terminated string alive for the call.
        let watched = unsafe {
            libc::inotify_add_watch(
                fd.as_raw_fd(),
                path.as_ptr(),
                libc::IN_CLOSE_WRITE | libc::IN_MOVED_TO,
            )
        };
        if watched < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Watch {
            fd,
            events: vec![0; 64 * 1024],
            alive: true,
        })
    }

    /// Adds the names of the files finished since the last call to `into`. False when some
    /// were not heard (the kernel's queue overflowed, or the watch ended).
    fn finished(&mut self, into: &mut HashSet<OsString>) -> io::Result<bool> {
        let mut heard_all = true;
        loop {
            // SAFETY: reads at most `events.len()` bytes into the buffer it owns.
            let read = unsafe {
                libc::read(
                    self.fd.as_raw_fd(),
                    self.events.as_mut_ptr().cast(),
                    self.events.len(),
                )
            };
            if read < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => return Ok(heard_all),
                    io::ErrorKind::Interrupted => continue,
                    _ => return Err(e),
                }
            }
            let read = read as usize;
            if read == 0 {
                return Ok(heard_all);
            }
            let mut at = 0;
            while at + EVENT_HEADER <= read {
                // SAFETY: the kernel wrote a whole event header here; read unaligned, as the
                // buffer is bytes.
                let event: libc::inotify_event =
                    unsafe { std::ptr::read_unaligned(self.events[at..].as_ptr().cast()) };
                let name_at = at + EVENT_HEADER;
                let name_end = (name_at + event.len as usize).min(read);
                let name = &self.events[name_at..name_end];
                let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
                if event.mask & libc::IN_Q_OVERFLOW != 0 {
                    heard_all = false;
                } else if event.mask & libc::IN_IGNORED != 0 {
                    self.alive = false;
                    heard_all = false;
                } else if !name.is_empty() {
                    into.insert(OsStr::from_bytes(name).to_os_string());
                }
                at = name_end;
            }
        }
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
    fn files_there_before_the_store_opened_are_synced_at_the_first_commit_only() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("blobs")).unwrap();
        write(&dir, "3", b"an earlier process's value");
        write(&dir, "5", b"another");
        let mut blobs = BlobFiles::of(dir.path().to_path_buf());
        assert_eq!(blobs.sync_new().unwrap(), 2);
        assert_eq!(blobs.sync_new().unwrap(), 0);
        assert!(
            blobs.watch.is_some() && !blobs.must_list,
            "after the first commit the watch names the files"
        );
        write(&dir, "8", b"this process's");
        assert_eq!(blobs.sync_new().unwrap(), 1, "heard, not listed");
        assert!(blobs.listed.is_empty(), "no listing kept while watched");
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
        std::fs::remove_dir(dir.path().join("blobs")).unwrap();
        assert_eq!(blobs.sync_new().unwrap(), 0);
    }
}
