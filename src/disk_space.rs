//! The space left on a filesystem (`statvfs`): what `/metrics` says of the sled store's disk,
//! so that an alert fires before a write finds it full (which stops the process).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Reads the space of `path`'s filesystem into the gauges. Called at start and by a worker of
/// its own (`startup`): `statvfs` on a stalled disk (or a FUSE file system whose daemon
/// stopped) blocks, and it must block no thread that answers requests.
pub(crate) fn update(path: &Path, metrics: &crate::metrics::Metrics) {
    let (free, size) = of(path).unwrap_or_default();
    metrics.disk_free_bytes.set(gauge_value(free));
    metrics.disk_size_bytes.set(gauge_value(size));
}

/// A byte count as a gauge holds it (past i64's end, its end: no disk is that large).
fn gauge_value(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

/// How often the worker reads the space again.
pub(crate) const EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Bytes an unprivileged writer may still use on the filesystem holding `path`, and its size;
/// `None` when it cannot be read (the path is gone, or holds a NUL).
pub(crate) fn of(path: &Path) -> Option<(u64, u64)> {
    let path = CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: `path` is a NUL-terminated string that outlives the call, and `stat` is a plain
    // struct the call fills in; nothing is kept.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    let done = unsafe { libc::statvfs(path.as_ptr(), &mut stat) };
    if done != 0 {
        return None;
    }
    let block = stat.f_frsize as u64;
    Some((
        (stat.f_bavail as u64).saturating_mul(block),
        (stat.f_blocks as u64).saturating_mul(block),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_has_some_space_of_a_larger_size_and_a_missing_one_none() {
        let dir = tempfile::tempdir().unwrap();
        let (free, size) = of(dir.path()).expect("statvfs");
        assert!(size > 0 && free <= size, "{free} of {size}");
        assert_eq!(of(&dir.path().join("absent")), None);
    }
}
