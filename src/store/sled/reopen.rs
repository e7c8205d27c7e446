//! Tests' reopening of a store they just closed.

use std::fmt::Display;
use std::time::{Duration, Instant};

/// Opens a store again right after the test closed it. Dropping a `sled::Db` does not wait for
/// sled's I/O threads to let go of the data file, so its lock can outlive the drop by a moment
/// (sled's "please do not rapidly open and close the same database"); a server opens its store
/// once, and a restarted process gets the lock back when the old one exits. Waits for the lock
/// (sled says `could not acquire lock on`: the text is all there is), for at most 10 s, and
/// fails on any other error at once.
pub(super) fn once_released<T, E: Display>(mut open: impl FnMut() -> Result<T, E>) -> T {
    let started = Instant::now();
    loop {
        match open() {
            Ok(opened) => return opened,
            Err(e)
                if e.to_string().contains("could not acquire lock on")
                    && started.elapsed() < Duration::from_secs(10) =>
            {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("opening the store again failed: {e}"),
        }
    }
}
