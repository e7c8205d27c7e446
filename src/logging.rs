//! The process log: env_logger's format and `RUST_LOG` filter, written to stderr through a
//! buffer instead of one `write` per line.
//!
//! Every request writes a log line, and at tens of thousands of requests a second a write
//! system call per line was a tenth of the server's time. Lines are collected in memory and
//! written out every `PERIOD` or once `HIGH_WATER` bytes wait, whichever comes first. A
//! warning or an error goes out at once, with everything before it, so the line that
//! explains a stop is never held back; `flush` runs before the process exits, and the panic
//! hook flushes before the panic message.

use std::io::{self, Write};
use std::sync::Mutex;
use std::time::Duration;

use log::{Level, Log, Metadata, Record};

/// How long an info line may wait in memory.
const PERIOD: Duration = Duration::from_millis(50);
/// Bytes that make a write happen before the period is over.
const HIGH_WATER: usize = 32 * 1024;

static PENDING: Mutex<Vec<u8>> = Mutex::new(Vec::new());

/// Installs the logger (level `info` unless `RUST_LOG` says otherwise) and its flusher.
pub fn init() {
    let inner = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .target(env_logger::Target::Pipe(Box::new(Pending)))
        .build();
    let max_level = inner.filter();
    if log::set_boxed_logger(Box::new(Buffered { inner })).is_err() {
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

/// Writes out every line still in memory.
pub fn flush() {
    let lines = match PENDING.lock() {
        Ok(mut pending) if !pending.is_empty() => std::mem::take(&mut *pending),
        _ => return,
    };
    let mut stderr = io::stderr().lock();
    let _ = stderr.write_all(&lines);
    let _ = stderr.flush();
}

/// env_logger writes each formatted line here.
struct Pending;

impl Write for Pending {
    fn write(&mut self, line: &[u8]) -> io::Result<usize> {
        let full = match PENDING.lock() {
            Ok(mut pending) => {
                pending.extend_from_slice(line);
                pending.len() >= HIGH_WATER
            }
            Err(_) => false,
        };
        if full {
            flush();
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

struct Buffered {
    inner: env_logger::Logger,
}

impl Log for Buffered {
    fn enabled(&self, metadata: &Metadata) -> bool {
        self.inner.enabled(metadata)
    }

    fn log(&self, record: &Record) {
        if !self.inner.matches(record) {
            return;
        }
        self.inner.log(record);
        if record.level() <= Level::Warn {
            flush();
        }
    }

    fn flush(&self) {
        flush();
    }
}
