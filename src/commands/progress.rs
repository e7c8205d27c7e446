//! How far a long command (`restore`, `copy`) is, on stderr: a bar redrawn in place on a
//! terminal, a plain line every 5 s otherwise (a log, CI). Stdout keeps its one JSON object.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use crate::store::Snapshot;

/// How often a terminal's bar is redrawn, and a log's line written.
const ON_A_TERMINAL: Duration = Duration::from_millis(200);
const IN_A_LOG: Duration = Duration::from_secs(5);

pub(super) struct Progress {
    what: &'static str,
    total: Option<u64>,
    done: u64,
    started: Instant,
    shown: Instant,
    terminal: bool,
    drawn: bool,
}

impl Progress {
    /// `what` is the verb ("restoring"); `total` the records expected, when known.
    pub(super) fn new(what: &'static str, total: Option<u64>) -> Self {
        let now = Instant::now();
        Progress {
            what,
            total,
            done: 0,
            started: now,
            shown: now,
            terminal: std::io::stderr().is_terminal(),
            drawn: false,
        }
    }

    pub(super) fn add(&mut self, records: u64) {
        self.done += records;
        let every = if self.terminal {
            ON_A_TERMINAL
        } else {
            IN_A_LOG
        };
        if self.shown.elapsed() >= every {
            self.shown = Instant::now();
            self.show();
        }
    }

    /// The last state, and the end of the bar's line: only where something was shown, so a
    /// short run says nothing.
    pub(super) fn finish(mut self) {
        if self.terminal && self.drawn {
            self.show();
            eprintln!();
        }
    }

    fn show(&mut self) {
        let line = describe(self.what, self.done, self.total, self.started.elapsed());
        let mut stderr = std::io::stderr().lock();
        let _ = if self.terminal {
            write!(stderr, "\r{line}\x1b[K")
        } else {
            writeln!(stderr, "{line}")
        };
        let _ = stderr.flush();
        self.drawn = true;
    }
}

/// One line of progress: done of total, a bar when the total is known, the rate, time left.
fn describe(what: &str, done: u64, total: Option<u64>, elapsed: Duration) -> String {
    let rate = done as f64 / elapsed.as_secs_f64().max(0.001);
    match total.filter(|&t| t > 0) {
        Some(total) => {
            let share = (done as f64 / total as f64).min(1.0);
            let filled = (share * 30.0).round() as usize;
            let left = match total.saturating_sub(done) as f64 / rate {
                left if rate >= 1.0 => format!("about {left:.0} s left"),
                _ => "starting".to_string(),
            };
            format!(
                "{what} [{}{}] {done} of {total} records, {:.0}%, {:.0}/s, {left}",
                "#".repeat(filled),
                "-".repeat(30 - filled),
                share * 100.0,
                rate,
            )
        }
        None => format!("{what}: {done} records, {rate:.0}/s"),
    }
}

/// `source`, counted as its reader takes each record: the count is what has been written,
/// give or take the few records a snapshot reads ahead.
pub(super) fn counted(mut source: Snapshot, mut progress: Progress) -> Snapshot {
    let (producer, snapshot) = Snapshot::channel();
    tokio::spawn(async move {
        loop {
            match source.next().await {
                Some(Ok(record)) => {
                    if !producer.send(Ok(record)).await {
                        return;
                    }
                    progress.add(1);
                }
                Some(Err(e)) => {
                    producer.send(Err(e)).await;
                    return;
                }
                None => {
                    producer.finish().await;
                    progress.finish();
                    return;
                }
            }
        }
    });
    snapshot
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_known_total_shows_a_bar_the_share_and_the_time_left() {
        let line = describe("restoring", 250, Some(1000), Duration::from_secs(5));
        assert_eq!(
            line,
            "restoring [########----------------------] 250 of 1000 records, 25%, 50/s, about 15 s left"
        );
    }

    #[test]
    fn an_unknown_total_shows_the_count_and_the_rate() {
        let line = describe("checking", 300, None, Duration::from_secs(3));
        assert_eq!(line, "checking: 300 records, 100/s");
    }
}
