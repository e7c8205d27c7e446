//! A backup's spool, handed to the disk as it grows, a few MiB at a time.
//!
//! The spool of a million orders is a gigabyte written in seconds. Left to the kernel it stays
//! dirty in the page cache until its inode is 30 s old (`vm.dirty_expire_centisecs`), then is
//! written back at once: a burst the commits' `fdatasync`s queue behind (orders placed 27 to
//! 33 s into a backup of a million orders waited up to 153 ms). Handed over a chunk at a time,
//! waiting for the previous chunk before starting the next, it keeps the disk's queue short,
//! and the walk goes at the disk's pace.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::os::fd::AsRawFd;

/// Bytes handed to the disk at a time.
const CHUNK: u64 = 8 << 20;

pub(super) struct SpoolOut {
    out: BufWriter<File>,
    written: u64,
    /// Where the bytes not yet handed to the disk begin, and the chunk handed over last.
    handed: u64,
    in_flight: Option<(u64, u64)>,
}

impl SpoolOut {
    pub(super) fn new(file: File) -> Self {
        SpoolOut {
            out: BufWriter::with_capacity(1 << 20, file),
            written: 0,
            handed: 0,
            in_flight: None,
        }
    }

    pub(super) fn into_file(self) -> io::Result<File> {
        self.out.into_inner().map_err(|e| e.into_error())
    }

    /// Only the write of the buffered bytes can fail the spool: a file system that cannot
    /// start writeback early (sync_file_range refused) leaves it to the kernel, as before.
    fn hand_over(&mut self) -> io::Result<()> {
        self.out.flush()?;
        let fd = self.out.get_ref().as_raw_fd();
        if let Some((at, length)) = self.in_flight.take() {
            let all = libc::SYNC_FILE_RANGE_WAIT_BEFORE
                | libc::SYNC_FILE_RANGE_WRITE
                | libc::SYNC_FILE_RANGE_WAIT_AFTER;
            range(fd, at, length, all);
        }
        let chunk = (self.handed, self.written - self.handed);
        range(fd, chunk.0, chunk.1, libc::SYNC_FILE_RANGE_WRITE);
        self.in_flight = Some(chunk);
        self.handed = self.written;
        Ok(())
    }
}

fn range(fd: i32, at: u64, length: u64, flags: libc::c_uint) {
    // SAFETY: sync_file_range takes a descriptor we hold open and plain integers.
    let done = unsafe { libc::sync_file_range(fd, at as i64, length as i64, flags) };
    if done != 0 {
        log::debug!(
            "backup spool: no early writeback: {}",
            io::Error::last_os_error()
        );
    }
}

impl Write for SpoolOut {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let written = self.out.write(bytes)?;
        self.written += written as u64;
        if self.written - self.handed >= CHUNK {
            self.hand_over()?;
        }
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}
