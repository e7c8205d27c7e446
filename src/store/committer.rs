//! Group commit: one thread owns durability. A request whose transaction has committed asks
//! it for a flush and waits; the thread takes every request waiting at that moment, flushes
//! sled once and fsyncs its data file once, then answers them all.
//!
//! `Db::flush_async` is not used: it hangs under concurrency in sled 0.34.7 (sled#1412).
//! The extra `sync_data` exists because sled's own flush uses `sync_file_range`, which leaves
//! the disk's write cache and file metadata to a background sync every 500 ms.

use std::fs::File;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use tokio::sync::oneshot;

use super::StoreError;
use crate::metrics::Metrics;

enum Request {
    Flush(oneshot::Sender<Result<(), String>>),
    Stop,
}

pub struct Committer {
    requests: mpsc::Sender<Request>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Committer {
    pub fn start(db: sled::Db, data_file: File, metrics: Arc<Metrics>) -> Self {
        let (requests, inbox) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("orderly-commit".into())
            .spawn(move || run(db, data_file, inbox, &metrics))
            .expect("spawning the commit thread");
        Committer {
            requests,
            thread: Mutex::new(Some(thread)),
        }
    }

    /// Resolves once every transaction committed before this call is on disk.
    pub async fn durable(&self) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        self.requests
            .send(Request::Flush(tx))
            .map_err(|_| StoreError::Flush("commit thread has stopped".into()))?;
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(StoreError::Flush(e)),
            Err(_) => Err(StoreError::Flush(
                "commit thread dropped the request".into(),
            )),
        }
    }

    /// Answers everything still waiting, flushes one last time and joins the thread.
    pub fn stop(&self) {
        let _ = self.requests.send(Request::Stop);
        if let Some(thread) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            let _ = thread.join();
        }
    }
}

fn run(db: sled::Db, data_file: File, inbox: mpsc::Receiver<Request>, metrics: &Metrics) {
    let mut stopping = false;
    while !stopping {
        let mut waiters = Vec::new();
        match inbox.recv() {
            Ok(Request::Flush(w)) => waiters.push(w),
            Ok(Request::Stop) | Err(_) => stopping = true,
        }
        // Everything queued now rides on this one flush.
        while let Ok(request) = inbox.try_recv() {
            match request {
                Request::Flush(w) => waiters.push(w),
                Request::Stop => stopping = true,
            }
        }
        let started = Instant::now();
        let outcome = flush(&db, &data_file);
        metrics
            .commit_seconds
            .observe(started.elapsed().as_secs_f64());
        metrics.commit_batch_size.observe(waiters.len() as f64);
        if let Err(e) = &outcome {
            log::error!(
                "flush failed; {} request(s) answered 500: {e}",
                waiters.len()
            );
        }
        for waiter in waiters {
            let _ = waiter.send(outcome.clone());
        }
    }
    log::info!("commit thread stopped after a final flush");
}

fn flush(db: &sled::Db, data_file: &File) -> Result<(), String> {
    db.flush().map_err(|e| e.to_string())?;
    data_file.sync_data().map_err(|e| e.to_string())
}
