//! The process log: env_logger's `RUST_LOG` filter and its default line format
//! (`[2026-12-01T12:00:00Z INFO  target] message`), written to stderr by one thread of its
//! own from per-thread buffers, so that no other thread ever waits on stderr.
//!
//! Every request writes a log line. At tens of thousands of requests a second, a write system
//! call per line was a tenth of the server's time, and one shared buffer made the request
//! threads queue on its lock. So each thread appends to a buffer of its own, and the log
//! thread writes them all out every `PERIOD`, at once when a buffer passes `HIGH_WATER`, and
//! at once (woken, not waited for) after a warning or an error, so that the line that explains
//! a stop is not held back.
//!
//! stderr can stop taking lines (a full journald, a log shipper that stopped reading its
//! pipe). Then only the log thread waits: a thread whose buffer holds `MAX_WAITING` drops
//! further lines and counts them (`orderly_log_lines_dropped_total`, and a line saying how
//! many once stderr takes lines again), and `flush` (before the process exits, in the panic
//! hook) waits for the log thread at most `FLUSH_PATIENCE`. Lines of different threads can
//! appear up to `PERIOD` out of order; each carries its time.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use log::{Level, Log, Metadata, Record};

/// How long an info line may wait in memory.
const PERIOD: Duration = Duration::from_millis(50);
/// Bytes waiting in a thread's buffer that wake the log thread before the period is over.
const HIGH_WATER: usize = 64 * 1024;
/// Bytes a thread's buffer holds at most while stderr does not take them: a stalled stderr
/// costs at most this per logging thread (a few dozen threads), never a blocked request.
const MAX_WAITING: usize = 1 << 20;
/// How long `flush` waits for the log thread to write what was logged before it.
const FLUSH_PATIENCE: Duration = Duration::from_secs(1);

type Buffer = Arc<Mutex<Vec<u8>>>;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Lines on their way from every thread to one sink, written by one thread of its own.
struct Pipe {
    /// Tells this pipe's buffers apart in each thread's `MINE`.
    id: usize,
    /// Every thread's buffer, in the order the threads first logged.
    buffers: Mutex<Vec<Buffer>>,
    /// Writes asked for, and written (a `flush` waits for the one it asked for).
    asked: Mutex<u64>,
    woken: Condvar,
    written: Mutex<u64>,
    wrote: Condvar,
    dropped: AtomicU64,
}

static NEXT_PIPE: AtomicUsize = AtomicUsize::new(0);
/// The process's pipe to stderr, once `init` ran.
static STDERR: OnceLock<Arc<Pipe>> = OnceLock::new();

thread_local! {
    /// This thread's buffer in each pipe it logged to (the process has one).
    static MINE: RefCell<Vec<(usize, Buffer)>> = const { RefCell::new(Vec::new()) };
    /// This thread's last formatted second, reused by every line within it.
    static STAMP: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
}

impl Pipe {
    /// A pipe into `sink`, and its log thread.
    fn start(mut sink: impl Write + Send + 'static) -> Arc<Pipe> {
        let pipe = Arc::new(Pipe {
            id: NEXT_PIPE.fetch_add(1, Ordering::Relaxed),
            buffers: Mutex::default(),
            asked: Mutex::new(0),
            woken: Condvar::new(),
            written: Mutex::new(0),
            wrote: Condvar::new(),
            dropped: AtomicU64::new(0),
        });
        let writing = Arc::clone(&pipe);
        let _ = std::thread::Builder::new()
            .name("orderly-log".into())
            .spawn(move || writing.write_forever(&mut sink));
        pipe
    }

    /// This thread's buffer in this pipe.
    fn mine(&self) -> Buffer {
        MINE.with(|mine| {
            let mut mine = mine.borrow_mut();
            if let Some((_, buffer)) = mine.iter().find(|(id, _)| *id == self.id) {
                return Arc::clone(buffer);
            }
            let buffer = Buffer::default();
            lock(&self.buffers).push(Arc::clone(&buffer));
            mine.push((self.id, Arc::clone(&buffer)));
            buffer
        })
    }

    /// Appends one line (written by `line`) to this thread's buffer, or drops it when the
    /// buffer is full; `urgent` lines wake the log thread at once.
    fn append(&self, line: impl FnOnce(&mut Vec<u8>), urgent: bool) {
        let waiting = {
            let buffer = self.mine();
            let mut lines = lock(&buffer);
            if lines.len() >= MAX_WAITING {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                return;
            }
            line(&mut lines);
            lines.len()
        };
        if urgent || waiting >= HIGH_WATER {
            self.ask();
        }
    }

    /// Wakes the log thread; returns the write asked for.
    fn ask(&self) -> u64 {
        let mut asked = lock(&self.asked);
        *asked += 1;
        self.woken.notify_one();
        *asked
    }

    /// Waits (at most `FLUSH_PATIENCE`) until everything appended before it is written.
    fn flush(&self) {
        let asked = self.ask();
        let written = lock(&self.written);
        let _ = self
            .wrote
            .wait_timeout_while(written, FLUSH_PATIENCE, |written| *written < asked);
    }

    fn write_forever(&self, sink: &mut impl Write) {
        let mut reported = 0;
        loop {
            let asked = {
                let asked = lock(&self.asked);
                let handled = *lock(&self.written);
                let (asked, _) = self
                    .woken
                    .wait_timeout_while(asked, PERIOD, |asked| *asked <= handled)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                *asked
            };
            let buffers: Vec<Buffer> = lock(&self.buffers).clone();
            for buffer in buffers {
                let lines = std::mem::take(&mut *lock(&buffer));
                if !lines.is_empty() {
                    let _ = sink.write_all(&lines);
                }
            }
            let dropped = self.dropped.load(Ordering::Relaxed);
            if dropped > reported {
                let mut note = Vec::new();
                stamp(&mut note);
                let _ = writeln!(
                    Line(&mut note),
                    " WARN  orderly::logging] {} log line(s) dropped: stderr did not take them in time",
                    dropped - reported
                );
                let _ = sink.write_all(&note);
                reported = dropped;
            }
            let _ = sink.flush();
            *lock(&self.written) = asked;
            self.wrote.notify_all();
        }
    }
}

/// `fmt::Write` into a byte buffer.
struct Line<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for Line<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// Installs the logger (at `default_level` unless `RUST_LOG` says otherwise) and its thread.
pub fn init(default_level: &str) {
    let env = env_logger::Env::default().default_filter_or(default_level);
    let filter = env_logger::Builder::from_env(env).build();
    let max_level = filter.filter();
    let pipe = Arc::clone(STDERR.get_or_init(|| Pipe::start(io::stderr())));
    if log::set_boxed_logger(Box::new(Buffered { filter, pipe })).is_err() {
        return;
    }
    log::set_max_level(max_level);
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        flush();
        previous(info);
    }));
}

/// Writes out every line logged before it, waiting for stderr at most `FLUSH_PATIENCE`.
pub fn flush() {
    if let Some(pipe) = STDERR.get() {
        pipe.flush();
    }
}

/// Lines dropped so far because stderr did not take them in time.
pub(crate) fn dropped_lines() -> u64 {
    STDERR
        .get()
        .map_or(0, |pipe| pipe.dropped.load(Ordering::Relaxed))
}

struct Buffered {
    /// Used for its filter only: the lines are formatted here.
    filter: env_logger::Logger,
    pipe: Arc<Pipe>,
}

impl Log for Buffered {
    fn enabled(&self, metadata: &Metadata) -> bool {
        self.filter.enabled(metadata)
    }

    fn log(&self, record: &Record) {
        if !self.filter.matches(record) {
            return;
        }
        self.pipe.append(
            |lines| append_line(lines, record),
            record.level() <= Level::Warn,
        );
    }

    fn flush(&self) {
        self.pipe.flush();
    }
}

/// `[<UTC time>` of this second, as env_logger prints it.
fn stamp(out: &mut Vec<u8>) {
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
}

/// `[<UTC time> <LEVEL padded to 5> <target>] <message>\n`, as env_logger prints by default.
fn append_line(out: &mut Vec<u8>, record: &Record) {
    stamp(out);
    let _ = writeln!(
        Line(out),
        " {:<5} {}] {}",
        record.level(),
        record.target(),
        record.args()
    );
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
    use std::time::Instant;

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

    /// A sink that takes nothing until it is opened, as a stderr pipe nobody reads.
    #[derive(Clone, Default)]
    struct Stalled(Arc<(Mutex<Taken>, Condvar)>);

    /// Whether the sink takes bytes yet, and what it took.
    type Taken = (bool, Vec<u8>);

    impl Write for Stalled {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            let (state, opened) = &*self.0;
            let state = lock(state);
            let mut state = opened
                .wait_timeout_while(state, Duration::from_secs(30), |(open, _)| !*open)
                .unwrap()
                .0;
            state.1.extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stderr_that_takes_nothing_never_holds_a_logging_thread_and_drops_are_counted_then_said() {
        let sink = Stalled::default();
        let pipe = Pipe::start(sink.clone());
        let started = Instant::now();
        let line = |out: &mut Vec<u8>| out.extend_from_slice(&[b'x'; 99]);
        for i in 0..30_000 {
            pipe.append(
                |out| {
                    line(out);
                    out.push(b'\n')
                },
                i % 100 == 0,
            );
        }
        pipe.flush();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "logging waited for the sink: {:?}",
            started.elapsed()
        );
        assert!(
            pipe.dropped.load(Ordering::Relaxed) > 0,
            "3 MB against a 1 MiB bound"
        );

        let (state, opened) = &*sink.0;
        lock(state).0 = true;
        opened.notify_all();
        pipe.flush(); // what was kept goes out; the lines after it find room again
        pipe.append(|out| out.extend_from_slice(b"after\n"), true);
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let written = String::from_utf8_lossy(&lock(state).1).into_owned();
            if written.contains("log line(s) dropped") && written.contains("after\n") {
                break;
            }
            assert!(Instant::now() < until, "the drops were never said");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
