//! The append-only files of the client (the intent journal, the receiver's inbox): opened for
//! reading and appending, and when this call creates one, its bytes and its directory entry
//! fsynced before it is used, so that what is written to it later is not lost with the name.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

pub(crate) fn open_appendable(path: &Path) -> io::Result<File> {
    let existed = path.exists();
    let file = OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .open(path)?;
    if !existed {
        file.sync_all()?;
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        File::open(dir)?.sync_all()?;
    }
    Ok(file)
}
