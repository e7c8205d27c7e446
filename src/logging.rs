//! The process log: env_logger's `RUST_LOG` filter and its default line format
//! (`[2026-12-01T12:00:00Z INFO  target] message`), written to stderr from per-thread buffers
//! instead of one locked `write` per line.
//!
//! Every request writes a log line. At tens of thousands of requests a second, a write system
//! call per line was a tenth of the server's time, and one shared buffer made the request
//! threads queue on its lock. So each thread appends to a buffer of its own, and a flusher
//! writes them all out every `PERIOD`; a thread whose buffer passes `HIGH_WATER` writes it at
//! once. A warning or an error goes out at once with everything before it, so the line that
//! explains a stop is never held back. `flush` runs before the process exits, and the panic
//! hook flushes before the panic message. Lines of different threads can therefore appear up
//! to `PERIOD` out of order; each carries its time.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::io::{self, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use log::{Level, Log, Metadata, Record};

/// How long an info line may wait in memory.
const PERIOD: Duration = Duration::from_millis(50);
/// Bytes that make a thread write its buffer before the period is over.
const HIGH_WATER: usize = 64 * 1024;

type Buffer = Arc<Mutex<Vec<u8>>>;

/// Every thread's buffer, in the order the threads first logged.
static BUFFERS: Mutex<Vec<Buffer>> = Mutex::new(Vec::new());

thread_local! {
    static MINE: Buffer = {
        let buffer = Buffer::default();
        if let Ok(mut all) = BUFFERS.lock() {
            all.push(Arc::clone(&buffer));
        }
        buffer
    };
    /// This thread's last formatted second, reused by every line within it.
    static STAMP: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
}

/// Installs the logger (at `default_level` unless `RUST_LOG` says otherwise) and its flusher.
pub fn init(default_level: &str) {
    let env = env_logger::Env::default().default_filter_or(default_level);
    let filter = env_logger::Builder::from_env(env).build();
    let max_level = filter.filter();
    if log::set_boxed_logger(Box::new(Buffered { filter })).is_err() {
        return;
    }
    log::set_max_level(max_level);
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        flush();
        previous(info);
    }));
    let _ = std::thread::Builder::new()
        .name("orderly-log".into())
        .spawn(|| loop {
            std::thread::sleep(PERIOD);
            flush();
        });
}

/// Writes out every line still in memory, thread by thread.
pub fn flush() {
    let buffers: Vec<Buffer> = match BUFFERS.lock() {
        Ok(all) => all.clone(),
        Err(_) => return,
    };
    let mut stderr = io::stderr().lock();
    for buffer in buffers {
        write_out(&buffer, &mut stderr);
    }
    let _ = stderr.flush();
}

fn write_out(buffer: &Mutex<Vec<u8>>, out: &mut impl Write) {
    let lines = match buffer.lock() {
        Ok(mut lines) if !lines.is_empty() => std::mem::take(&mut *lines),
        _ => return,
    };
    let _ = out.write_all(&lines);
}

struct Buffered {
    /// Used for its filter only: the lines are formatted here.
    filter: env_logger::Logger,
}

impl Log for Buffered {
    fn enabled(&self, metadata: &Metadata) -> bool {
        self.filter.enabled(metadata)
    }

    fn log(&self, record: &Record) {
        if !self.filter.matches(record) {
            return;
        }
        let full = MINE.with(|buffer| {
            let Ok(mut lines) = buffer.lock() else {
                return false;
            };
            append_line(&mut lines, record);
            lines.len() >= HIGH_WATER
        });
        if record.level() <= Level::Warn {
            flush();
        } else if full {
            MINE.with(|buffer| write_out(buffer, &mut io::stderr().lock()));
        }
    }

    fn flush(&self) {
        flush();
    }
}

/// `[<UTC time> <LEVEL padded to 5> <target>] <message>\n`, as env_logger prints by default.
fn append_line(out: &mut Vec<u8>, record: &Record) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    STAMP.with(|stamp| {
        let mut stamp = stamp.borrow_mut();
        if stamp.0 != now {
            *stamp = (now, utc_seconds(now));
        }
        out.push(b'[');
        out.extend_from_slice(stamp.1.as_bytes());
    });
    let mut line = String::new();
    let _ = writeln!(
        line,
        " {:<5} {}] {}",
        record.level(),
        record.target(),
        record.args()
    );
    out.extend_from_slice(line.as_bytes());
}

/// `YYYY-MM-DDTHH:MM:SSZ` for seconds since the epoch (the proleptic Gregorian calendar).
fn utc_seconds(secs: u64) -> String {
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

/// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_printed_as_env_logger_prints_them() {
        assert_eq!(utc_seconds(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_seconds(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_seconds(1_796_123_096), "2026-12-01T11:04:56Z");
    }

    #[test]
    fn a_line_has_the_default_layout() {
        let mut out = Vec::new();
        append_line(
            &mut out,
            &Record::builder()
                .level(Level::Info)
                .target("orderly::startup")
                .args(format_args!("ready"))
                .build(),
        );
        let line = String::from_utf8(out).unwrap();
        assert!(line.starts_with('[') && line.ends_with(" INFO  orderly::startup] ready\n"));
    }
}
