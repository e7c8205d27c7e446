//! store-damage (sled): the instance stopped, one file of its store damaged the way a copy, a
//! cleanup or a disk loses one (the seed picks among the files present), and the server
//! started on it. A damaged store must be refused before sled opens it: exit 2, one line on
//! stderr naming the file, not one byte of the store changed; the file is then put back
//! exactly as it was and the server started normally. A store whose snapshot files are all
//! removed must open instead (sled replays its whole log) and serve every acknowledged write,
//! which the end's checks judge. The fault never leaves a store damaged. Pure file work here
//! (which damages a store allows, doing and undoing one, hashing, judging a refusal's line);
//! the fault itself, with the starts, is in faults.rs.

use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// The ways a store is damaged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Damage {
    /// `conf` (sled's settings) removed.
    ConfRemoved,
    /// `layout` (orderly's mark of the store's layout) removed.
    LayoutRemoved,
    /// `layout` cut to half its bytes.
    LayoutCut,
    /// The newest `snap.*` cut to half its bytes.
    SnapCut,
    /// Every `snap.*` removed: the store must open (sled replays its whole log).
    SnapsRemoved,
    /// One blob file under `blobs/` removed.
    BlobRemoved,
    /// One blob file under `blobs/` cut to half its bytes.
    BlobCut,
}

impl Damage {
    pub fn name(self) -> &'static str {
        match self {
            Damage::ConfRemoved => "conf removed",
            Damage::LayoutRemoved => "layout removed",
            Damage::LayoutCut => "layout cut short",
            Damage::SnapCut => "the newest snapshot cut short",
            Damage::SnapsRemoved => "every snapshot removed",
            Damage::BlobRemoved => "a blob file removed",
            Damage::BlobCut => "a blob file cut short",
        }
    }

    pub fn removes(self) -> bool {
        matches!(
            self,
            Damage::ConfRemoved
                | Damage::LayoutRemoved
                | Damage::SnapsRemoved
                | Damage::BlobRemoved
        )
    }
}

/// Every file of a store: its path under the store's directory, its length and SHA-256.
pub type Hashes = BTreeMap<String, (u64, [u8; 32])>;

/// Hashes every file under `dir` (recursively).
pub fn hash_store(dir: &Path) -> std::io::Result<Hashes> {
    let mut out = Hashes::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let path = e.path();
            if e.file_type()?.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = path
                .strip_prefix(dir)
                .map(|r| r.to_string_lossy().to_string())
                .unwrap_or_default();
            out.insert(rel, hash_file(&path)?);
        }
    }
    Ok(out)
}

pub fn hash_file(path: &Path) -> std::io::Result<(u64, [u8; 32])> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut len = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        len += n as u64;
        h.update(&buf[..n]);
    }
    Ok((len, h.finalize().into()))
}

/// What differs between two views of a store (at most a few named).
pub fn diff(a: &Hashes, b: &Hashes) -> Vec<String> {
    let mut out = Vec::new();
    for (k, v) in a {
        match b.get(k) {
            None => out.push(format!("{k} gone")),
            Some(w) if w != v => out.push(format!("{k} changed ({} -> {} bytes)", v.0, w.0)),
            _ => {}
        }
    }
    for k in b.keys() {
        if !a.contains_key(k) {
            out.push(format!("{k} appeared"));
        }
    }
    out
}

/// A snapshot file of sled: `snap.` and the hexadecimal LSN it was taken at (not a
/// `.generating` one being written).
pub fn snap_lsn(rel: &str) -> Option<u64> {
    let hex = rel.strip_prefix("snap.")?;
    u64::from_str_radix(hex, 16).ok()
}

pub fn is_blob(rel: &str) -> bool {
    rel.strip_prefix("blobs/")
        .is_some_and(|n| !n.is_empty() && !n.contains('/'))
}

/// The damages a store with these files allows, in a fixed order.
pub fn candidates(files: &Hashes) -> Vec<Damage> {
    let mut c = Vec::new();
    if files.contains_key("conf") {
        c.push(Damage::ConfRemoved);
    }
    if files.contains_key("layout") {
        c.extend([Damage::LayoutRemoved, Damage::LayoutCut]);
    }
    if files.keys().any(|k| snap_lsn(k).is_some()) {
        c.extend([Damage::SnapCut, Damage::SnapsRemoved]);
    }
    if files.keys().any(|k| is_blob(k)) {
        c.extend([Damage::BlobRemoved, Damage::BlobCut]);
    }
    c
}

/// How many of the newest blob files the draw picks among.
const NEWEST_BLOBS: usize = 4;

/// The damage a draw picks among those the store allows, and the files it touches.
pub fn pick(draw: u64, files: &Hashes) -> Option<(Damage, Vec<String>)> {
    let c = candidates(files);
    if c.is_empty() {
        return None;
    }
    let d = c[(draw % c.len() as u64) as usize];
    let touched = match d {
        Damage::ConfRemoved => vec!["conf".to_string()],
        Damage::LayoutRemoved | Damage::LayoutCut => vec!["layout".to_string()],
        Damage::SnapCut => {
            let newest = files
                .keys()
                .filter_map(|k| snap_lsn(k).map(|l| (l, k)))
                .max()
                .map(|(_, k)| k.clone());
            newest.into_iter().collect()
        }
        Damage::SnapsRemoved => files
            .keys()
            .filter(|k| snap_lsn(k).is_some())
            .cloned()
            .collect(),
        Damage::BlobRemoved | Damage::BlobCut => {
            // One of the newest (a blob file is named by the LSN it was written at): sled
            // keeps a blob another one replaced until the segment that pointed at it is
            // reused, so an old one is often no live page's; a new one seldom.
            let mut blobs: Vec<(u64, &String)> = files
                .keys()
                .filter(|k| is_blob(k))
                .map(|k| (k[6..].parse().unwrap_or(0), k))
                .collect();
            blobs.sort();
            let newest = &blobs[blobs.len().saturating_sub(NEWEST_BLOBS)..];
            let i = ((draw >> 16) % newest.len() as u64) as usize;
            vec![newest[i].1.clone()]
        }
    };
    Some((d, touched))
}

/// What a draw picks, for `--dry-run` (the files present decide: the store of the moment).
pub fn planned(draw: u64) -> String {
    let full = files_named(&["conf", "layout", "snap.01", "blobs/1"]);
    let no_blob = files_named(&["conf", "layout", "snap.01"]);
    let bare = files_named(&["conf", "layout"]);
    let name = |f: &Hashes| pick(draw, f).map(|(d, _)| d.name()).unwrap_or("nothing");
    format!(
        "{} with snapshots and blob files, {} with snapshots only, {} with neither",
        name(&full),
        name(&no_blob),
        name(&bare)
    )
}

fn files_named(names: &[&str]) -> Hashes {
    names
        .iter()
        .map(|n| (n.to_string(), (1, [0; 32])))
        .collect()
}

/// The refusal's line names the file: `file <rel>` followed by no character of a name (so
/// that `blobs/50` is not found in `blobs/5090`).
pub fn names_file(line: &str, rel: &str) -> bool {
    let pat = format!("file {rel}");
    line.match_indices(&pat).any(|(i, _)| {
        line[i + pat.len()..]
            .chars()
            .next()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '/'))
    })
}

/// What is wrong with a refusal (exit status, stderr): exactly one line, naming the file, and
/// status 2. Empty when it is as documented.
pub fn refusal_faults(
    code: Option<i32>,
    signal: Option<i32>,
    stderr: &str,
    rel: &str,
) -> Vec<String> {
    let mut out = Vec::new();
    if code != Some(2) {
        out.push(format!("exit status {code:?} (signal {signal:?}), not 2"));
    }
    let lines: Vec<&str> = stderr.lines().collect();
    if lines.len() != 1 {
        out.push(format!("{} lines on stderr, not one", lines.len()));
    }
    if !lines.iter().any(|l| names_file(l, rel)) {
        out.push(format!("no line names the file {rel}"));
    }
    out
}

/// Damages the files and makes that durable (LazyFS keeps what is not synced in its cache).
/// Returns each file's bytes before, to put back.
pub fn apply(dir: &Path, d: Damage, touched: &[String]) -> std::io::Result<Vec<(String, Vec<u8>)>> {
    let mut originals = Vec::new();
    for rel in touched {
        let path = dir.join(rel);
        let bytes = std::fs::read(&path)?;
        if d.removes() {
            std::fs::remove_file(&path)?;
        } else {
            let f = std::fs::OpenOptions::new().write(true).open(&path)?;
            f.set_len(bytes.len() as u64 / 2)?;
            f.sync_all()?;
        }
        sync_dir(path.parent().unwrap_or(dir))?;
        originals.push((rel.clone(), bytes));
    }
    Ok(originals)
}

/// Puts each file back exactly as it was, durably.
pub fn put_back(dir: &Path, originals: &[(String, Vec<u8>)]) -> std::io::Result<()> {
    for (rel, bytes) in originals {
        let path = dir.join(rel);
        let mut f = std::fs::File::create(&path)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        sync_dir(path.parent().unwrap_or(dir))?;
    }
    Ok(())
}

fn sync_dir(d: &Path) -> std::io::Result<()> {
    std::fs::File::open(d)?.sync_all()
}

/// The files touched, hashed again, against what they were.
pub fn touched_back(dir: &Path, h0: &Hashes, originals: &[(String, Vec<u8>)]) -> Vec<String> {
    let mut out = Vec::new();
    for (rel, _) in originals {
        match hash_file(&dir.join(rel)) {
            Ok(h) if h0.get(rel) == Some(&h) => {}
            Ok(h) => out.push(format!("{rel} is {} bytes, other than before", h.0)),
            Err(e) => out.push(format!("{rel}: {e}")),
        }
    }
    out
}

/// The files touched, for a note.
pub fn touched_names(touched: &[String]) -> String {
    match touched.len() {
        0 => "no file".into(),
        1..=3 => touched.join(", "),
        n => format!("{}, … ({n} files)", touched[..2].join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(names: &[&str]) -> Hashes {
        files_named(names)
    }

    #[test]
    fn the_damages_are_those_the_files_allow() {
        let f = files(&["conf", "db", "layout"]);
        assert_eq!(
            candidates(&f),
            [
                Damage::ConfRemoved,
                Damage::LayoutRemoved,
                Damage::LayoutCut
            ]
        );
        let f = files(&[
            "conf",
            "db",
            "layout",
            "snap.00000000000000FF",
            "snap.0000000000000100",
            "blobs/12",
            "blobs/99",
        ]);
        assert_eq!(candidates(&f).len(), 7);
        // The newest snapshot by its LSN; every one for a removal.
        assert_eq!(
            pick(3, &f).unwrap(),
            (Damage::SnapCut, vec!["snap.0000000000000100".to_string()])
        );
        assert_eq!(pick(4, &f).unwrap().1.len(), 2);
        let (d, t) = pick(5, &f).unwrap();
        assert_eq!(d, Damage::BlobRemoved);
        assert!(t[0].starts_with("blobs/"));
        assert!(pick(0, &files(&["db"])).is_none());
        assert!(snap_lsn("snap.00FF.generating").is_none());
    }

    #[test]
    fn a_refusal_is_one_line_naming_the_file_and_status_2() {
        let line = "orderly: cannot open the database in /d: its blob file blobs/5090 (page 14, lsn 5090) is missing; nothing of the store was changed\n";
        assert!(refusal_faults(Some(2), None, line, "blobs/5090").is_empty());
        assert!(!refusal_faults(Some(2), None, line, "blobs/509").is_empty());
        assert!(!refusal_faults(Some(1), None, line, "blobs/5090").is_empty());
        let two = format!("warning\n{line}");
        assert_eq!(refusal_faults(Some(2), None, &two, "blobs/5090").len(), 1);
        let conf = "orderly: cannot open the database in /d: its file conf is missing (sled's settings of the store); nothing";
        assert!(names_file(conf, "conf"));
        assert!(!names_file(conf, "layout"));
        assert!(names_file("its file snap.00FF is cut short", "snap.00FF"));
    }
}
