//! Test support: opening a store again in the same process right after closing it.
//!
//! Dropping a `sled::Db` does not wait for sled's I/O threads to let go of the data file, so
//! its lock can outlive the drop by a moment (sled issues 1234 and 1289: "please do not
//! rapidly open and close the same database"). A server opens its store once, and a
//! restarted process gets the lock back from the kernel when the old one exits; only a test
//! that closes and reopens within one process meets this. It waits for the lock, bounded,
//! and fails on every other error at once.

use std::fmt::Display;
use std::time::{Duration, Instant};

/// How long a closed store's lock may take to be released before the test fails.
const RELEASE_BOUND: Duration = Duration::from_secs(10);

/// Calls `open` until it does not fail on sled's file lock, for at most `RELEASE_BOUND`.
pub(crate) fn once_released<T, E: Display>(mut open: impl FnMut() -> Result<T, E>) -> T {
    let started = Instant::now();
    loop {
        match open() {
            Ok(opened) => return opened,
            Err(e) if held_lock(&e) && started.elapsed() < RELEASE_BOUND => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("opening the store again failed: {e}"),
        }
    }
}

/// sled reports a held lock as `ErrorKind::Other` with this text (`Config::try_lock`), so the
/// text is all there is to tell it from a real failure.
fn held_lock(e: &impl Display) -> bool {
    e.to_string().contains("could not acquire lock on")
}
