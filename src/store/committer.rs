//! The write path: one writer thread runs every request's transaction, one commit thread
//! makes them durable in groups, and a request gets its answer only after both.
//!
//! - The writer runs transactions one after another. sled takes one process-wide lock per
//!   transaction anyway, so running them on one thread loses no parallelism and saves the
//!   lock hand-offs and the hop through the blocking pool.
//! - The commit thread takes every batch the writer has finished, calls sled's `flush()` once
//!   and `fdatasync`s its data file once, then answers them all; meanwhile the writer already
//!   runs the next batch (the two overlap).
//!
//! `Db::flush_async` is not used: it hangs under concurrency in sled 0.34.7 (sled#1412).
//! The extra `sync_data` exists because sled's own flush uses `sync_file_range`, which leaves
//! the disk's write cache and file metadata to a background sync every 500 ms.

use std::fs::File;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use tokio::sync::oneshot;

use super::StoreError;
use crate::metrics::Metrics;

/// What to do once the write's batch is on disk (or the flush failed).
type Completion = Box<dyn FnOnce(Result<(), String>) + Send>;
type Work = Box<dyn FnOnce() -> Completion + Send>;

enum Job {
    Write(Work),
    Stop,
}

enum Batch {
    Flush(Vec<Completion>),
    Stop,
}

pub struct Committer {
    jobs: mpsc::Sender<Job>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Committer {
    pub fn start(db: sled::Db, data_file: File, metrics: Arc<Metrics>) -> Self {
        let (jobs, inbox) = mpsc::channel();
        let (batches, batch_inbox) = mpsc::channel();
        let writer = std::thread::Builder::new()
            .name("orderly-writer".into())
            .spawn(move || run_writer(inbox, batches))
            .expect("spawning the writer thread");
        let committer = std::thread::Builder::new()
            .name("orderly-commit".into())
            .spawn(move || run_commits(db, data_file, batch_inbox, &metrics))
            .expect("spawning the commit thread");
        Committer {
            jobs,
            threads: Mutex::new(vec![writer, committer]),
        }
    }

    /// Runs `work` (a transaction) on the writer thread and resolves with its result once it
    /// is on disk. A refused transaction wrote nothing; its answer waits for the same flush,
    /// which costs it a little latency and keeps this path single.
    pub async fn write<R: Send + 'static>(
        &self,
        work: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, StoreError> {
        let (tx, rx) = oneshot::channel::<Result<R, StoreError>>();
        self.submit(work, move |outcome| {
            let _ = tx.send(outcome);
        })?;
        rx.await
            .map_err(|_| StoreError::Flush("the writer dropped the request".into()))?
    }

    /// `write` for the background threads, which block instead of awaiting.
    pub fn write_blocking<R: Send + 'static>(
        &self,
        work: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, StoreError> {
        let (tx, rx) = mpsc::sync_channel::<Result<R, StoreError>>(1);
        self.submit(work, move |outcome| {
            let _ = tx.send(outcome);
        })?;
        rx.recv()
            .map_err(|_| StoreError::Flush("the writer dropped the request".into()))?
    }

    fn submit<R: Send + 'static>(
        &self,
        work: impl FnOnce() -> R + Send + 'static,
        reply: impl FnOnce(Result<R, StoreError>) + Send + 'static,
    ) -> Result<(), StoreError> {
        let job: Work = Box::new(move || -> Completion {
            match catch_unwind(AssertUnwindSafe(work)) {
                Ok(result) => Box::new(move |flushed: Result<(), String>| {
                    reply(flushed.map(|()| result).map_err(StoreError::Flush));
                }),
                Err(_) => {
                    Box::new(move |_| reply(Err(StoreError::Flush("the write panicked".into()))))
                }
            }
        });
        self.jobs
            .send(Job::Write(job))
            .map_err(|_| StoreError::Flush("the writer has stopped".into()))
    }

    /// Finishes what is queued, flushes one last time and joins both threads.
    pub fn stop(&self) {
        let _ = self.jobs.send(Job::Stop);
        if let Ok(mut threads) = self.threads.lock() {
            for thread in threads.drain(..) {
                let _ = thread.join();
            }
        }
    }
}

fn run_writer(inbox: mpsc::Receiver<Job>, batches: mpsc::Sender<Batch>) {
    let mut stopping = false;
    while !stopping {
        let mut completions = Vec::new();
        let mut run = |job: Job| match job {
            Job::Write(work) => {
                completions.push(work());
                false
            }
            Job::Stop => true,
        };
        match inbox.recv() {
            Ok(job) => stopping = run(job),
            Err(_) => stopping = true,
        }
        while !stopping {
            match inbox.try_recv() {
                Ok(job) => stopping = run(job),
                Err(_) => break,
            }
        }
        if !completions.is_empty() && batches.send(Batch::Flush(completions)).is_err() {
            return;
        }
    }
    let _ = batches.send(Batch::Stop);
}

fn run_commits(db: sled::Db, data_file: File, inbox: mpsc::Receiver<Batch>, metrics: &Metrics) {
    let mut stopping = false;
    while !stopping {
        let mut waiting: Vec<Completion> = Vec::new();
        match inbox.recv() {
            Ok(Batch::Flush(batch)) => waiting.extend(batch),
            Ok(Batch::Stop) | Err(_) => stopping = true,
        }
        // Everything finished by now rides on this one flush.
        while let Ok(batch) = inbox.try_recv() {
            match batch {
                Batch::Flush(batch) => waiting.extend(batch),
                Batch::Stop => stopping = true,
            }
        }
        let started = Instant::now();
        let outcome = flush(&db, &data_file);
        metrics
            .commit_seconds
            .observe(started.elapsed().as_secs_f64());
        metrics.commit_batch_size.observe(waiting.len() as f64);
        if let Err(e) = &outcome {
            log::error!(
                "flush failed; {} request(s) answered 500: {e}",
                waiting.len()
            );
        }
        for done in waiting {
            done(outcome.clone());
        }
    }
    log::info!("commit thread stopped after a final flush");
}

fn flush(db: &sled::Db, data_file: &File) -> Result<(), String> {
    db.flush().map_err(|e| e.to_string())?;
    data_file.sync_data().map_err(|e| e.to_string())
}
