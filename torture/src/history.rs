//! The history file: JSON lines, a first line that can re-run the run (`--replay`), then one
//! line per operation, fault, note and violation, with times in ms since the run started.
//! Bounded: 200s carry a hash of their body, not the body, and past `MAX_BYTES` only faults,
//! notes and violations are written (an hour at a few hundred operations a second stays far
//! below it).

use serde_json::{json, Value};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// Past this many bytes, operation lines are counted, not written.
const MAX_BYTES: u64 = 1 << 30;

pub struct History {
    path: PathBuf,
    out: Mutex<BufWriter<File>>,
    start: Instant,
    bytes: AtomicU64,
    ops_dropped: AtomicU64,
    truncated_noted: AtomicBool,
}

impl History {
    pub fn create(path: &Path, first_line: &Value) -> std::io::Result<History> {
        let file = File::create(path)?;
        let h = History {
            path: path.to_path_buf(),
            out: Mutex::new(BufWriter::with_capacity(256 * 1024, file)),
            start: Instant::now(),
            bytes: AtomicU64::new(0),
            ops_dropped: AtomicU64::new(0),
            truncated_noted: AtomicBool::new(false),
        };
        h.write(first_line, true);
        Ok(h)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Milliseconds since the run started: the clock of every line and of every check.
    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    pub fn start(&self) -> Instant {
        self.start
    }

    fn write(&self, v: &Value, essential: bool) {
        let mut line = v.to_string();
        line.push('\n');
        let n = line.len() as u64;
        if !essential && self.bytes.load(Ordering::Relaxed) + n > MAX_BYTES {
            self.ops_dropped.fetch_add(1, Ordering::Relaxed);
            if !self.truncated_noted.swap(true, Ordering::Relaxed) {
                self.note("history reached its bound: operation lines are counted, not written");
            }
            return;
        }
        self.bytes.fetch_add(n, Ordering::Relaxed);
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        // A full disk under the history must not stop the run: the lines are best effort.
        let _ = out.write_all(line.as_bytes());
    }

    pub fn op(&self, v: Value) {
        self.write(&v, false);
    }

    pub fn fault(&self, kind: &str, target: &str, start_ms: u64, end_ms: u64, info: &str) {
        self.write(
            &json!({"t": "fault", "kind": kind, "target": target, "s": start_ms, "e": end_ms, "info": info}),
            true,
        );
    }

    pub fn violation(&self, check: &str, detail: &str) {
        self.write(
            &json!({"t": "violation", "check": check, "at": self.now_ms(), "detail": detail}),
            true,
        );
        self.flush();
    }

    pub fn note(&self, text: &str) {
        self.write(
            &json!({"t": "note", "at": self.now_ms(), "text": text}),
            true,
        );
    }

    pub fn flush(&self) {
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        let _ = out.flush();
    }

    pub fn ops_dropped(&self) -> u64 {
        self.ops_dropped.load(Ordering::Relaxed)
    }
}

/// The first line of a history file, read back for `--replay`.
pub fn read_first_line(path: &Path) -> Result<Value, String> {
    use std::io::BufRead;
    let f = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut line = String::new();
    std::io::BufReader::new(f)
        .read_line(&mut line)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let v: Value = serde_json::from_str(line.trim())
        .map_err(|e| format!("{}: first line: {e}", path.display()))?;
    if v.get("torture").is_none() {
        return Err(format!(
            "{}: not a torture history (no \"torture\" field on line 1)",
            path.display()
        ));
    }
    Ok(v)
}

/// A short, stable digest of a body for the history (the first 12 hex of its SHA-256).
pub fn short_hash(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(bytes);
    d.iter().take(6).map(|b| format!("{b:02x}")).collect()
}

/// At most `max` characters of a body, for failures and violations.
pub fn excerpt(bytes: &[u8], max: usize) -> String {
    let s = String::from_utf8_lossy(bytes);
    if s.chars().count() <= max {
        s.into_owned()
    } else {
        let mut t: String = s.chars().take(max).collect();
        t.push('…');
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_history_file_replays_from_its_first_line() {
        let dir = std::env::temp_dir().join(format!("torture-hist-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("h.jsonl");
        let h = History::create(&p, &json!({"torture": 1, "seed": 7})).unwrap();
        h.op(json!({"t": "op"}));
        h.violation("x", "y");
        h.flush();
        let first = read_first_line(&p).unwrap();
        assert_eq!(first["seed"], 7);
        let text = std::fs::read_to_string(&p).unwrap();
        assert_eq!(text.lines().count(), 3);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn excerpts_are_bounded() {
        assert_eq!(excerpt(b"abc", 5), "abc");
        assert_eq!(excerpt(b"abcdef", 3), "abc…");
        assert_eq!(short_hash(b"x").len(), 12);
    }
}
