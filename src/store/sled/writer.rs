//! The write path: one writer thread runs every transaction, one commit thread makes them
//! durable in groups, and a write resolves only after both.
//!
//! - The writer takes every job queued at that moment as one numbered batch, marks the
//!   stripes each job touches (see `visibility`), runs the jobs in the order they came and
//!   hands the batch to the commit thread. sled takes one process-wide lock per transaction
//!   anyway, so one thread loses no parallelism and saves the lock hand-offs.
//! - Orders that come one after another in the queue are placed in one transaction of up to
//!   `store::batch::MAX_ORDERS` (see `Trees::place_orders`): new orders are most of the
//!   writes, and their transaction's fixed costs are most of what a batch can save.
//! - The commit thread takes every batch the writer has finished, calls sled's `flush()` once
//!   and `fdatasync`s its data file once, publishes the newest batch number on disk, then
//!   answers them all; meanwhile the writer already runs the next batch.
//! - A failed flush, or any storage error in a transaction, is recorded as the store's
//!   failure: the batches after it are answered with that error without being run.
//!
//! A job's answer travels in its own completion, so a request that went away does not free
//! anything early: its key and its account stay "in flight" until the flush says otherwise.
//!
//! Every job carries its request's deadline and its place among the writes waiting
//! (`store::admission`): the writer sends a job to sled only while its deadline has not passed
//! and its caller still waits, and drops it otherwise, so that a caller answered "not written"
//! at its deadline never sees it written afterwards. A caller whose job was applied waits for
//! the flush until its deadline, then is answered that the outcome is unknown, and the flush
//! goes on. The job's place is given back once its flush answered, so writes a stalled disk
//! holds keep counting against `--max-pending-writes`.
//!
//! The files sled keeps large values in (`blobs/`) need nothing here: sled fsyncs each, and
//! the directory, before its log points at it (vendor/sled, ORDERLY-PATCHES.md change 9).
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

use crate::bounds::Deadline;
use crate::store::admission::{self, Admission, Admitted, InFlight};
use crate::store::Stopped;

use super::orders::Placed;
use super::trees::Trees;
use super::visibility::{Stripe, Visibility};
use super::{FlushHook, FlushStep};
use crate::domain::time::now_millis;
use crate::metrics::Metrics;
use crate::store::batch::MAX_ORDERS;
use crate::store::NewOrder;
use crate::store::StoreError;

/// What a job sees while it runs: the trees, and the batch it belongs to.
pub(super) struct Batch<'a> {
    pub(crate) trees: &'a Trees,
    number: u64,
    visibility: &'a Visibility,
}

impl Batch<'_> {
    /// Declares that the job is about to change data in `stripe`: call before writing.
    pub(super) fn touches(&self, stripe: Stripe) {
        self.visibility.mark(stripe, self.number);
    }
}

/// What to do once the job's batch is on disk (or could not be made so).
type Completion = Box<dyn FnOnce(Result<(), StoreError>) + Send>;
type Work = Box<dyn FnOnce(&Batch) -> Completion + Send>;

/// An order waiting for the writer, and where its outcome goes once it is on disk.
struct OrderJob {
    new: NewOrder,
    reply: oneshot::Sender<Result<Placed, StoreError>>,
    admitted: Admitted,
}

/// Any other write waiting for the writer.
struct WriteJob {
    work: Work,
    admitted: Admitted,
}

enum Job {
    Write(Box<WriteJob>),
    Order(Box<OrderJob>),
    Stop,
}

impl Admitted {
    /// Whether the writer may apply the job now: its deadline has not passed and its caller
    /// still waits. A job it may not apply is dropped, never written.
    fn may_apply(&self) -> bool {
        self.ticket.send(self.deadline)
    }
}

/// A job's completion that also gives its place among the waiting writes back once the flush
/// answered.
fn releasing(done: Completion, admitted: Admitted) -> Completion {
    Box::new(move |flushed| {
        done(flushed);
        drop(admitted);
    })
}

enum Finished {
    Batch { number: u64, done: Vec<Completion> },
    Stop,
}

pub(super) struct Writer {
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    visibility: Arc<Visibility>,
    admission: Admission,
}

/// What the writer needs besides the trees.
pub(super) struct WriterParts {
    pub(crate) data_file: File,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) visibility: Arc<Visibility>,
    pub(crate) hook: Option<FlushHook>,
    /// The batch being applied and the flush running, for readiness.
    pub(crate) commits: Arc<InFlight>,
    /// `--max-pending-writes`.
    pub(crate) max_pending: usize,
}

impl Writer {
    pub(super) fn start(trees: Arc<Trees>, parts: WriterParts) -> Self {
        let WriterParts {
            data_file,
            metrics,
            visibility,
            hook,
            commits,
            max_pending,
        } = parts;
        let (jobs, inbox) = mpsc::channel();
        let (batches, finished) = mpsc::channel();
        let writer = {
            let (trees, visibility) = (Arc::clone(&trees), Arc::clone(&visibility));
            let (metrics, commits) = (Arc::clone(&metrics), Arc::clone(&commits));
            std::thread::Builder::new()
                .name("orderly-writer".into())
                .spawn(move || {
                    let applying = Applying {
                        trees: &trees,
                        visibility: &visibility,
                        metrics: &metrics,
                        commits: &commits,
                    };
                    run_writer(applying, inbox, batches)
                })
                .expect("spawning the writer thread")
        };
        let committer = {
            let visibility = Arc::clone(&visibility);
            std::thread::Builder::new()
                .name("orderly-commit".into())
                .spawn(move || {
                    let mut flush = Flush {
                        trees,
                        data_file,
                        hook,
                        blob_files_counted: 0,
                    };
                    run_commits(&mut flush, finished, &metrics, &visibility, &commits)
                })
                .expect("spawning the commit thread")
        };
        Writer {
            jobs: Mutex::new(Some(jobs)),
            threads: Mutex::new(vec![writer, committer]),
            visibility,
            admission: Admission::new(max_pending),
        }
    }

    /// Runs `work` on the writer thread and resolves with its result once its batch is on
    /// disk. A refused transaction wrote nothing; its answer waits for the same flush, which
    /// costs it a little latency and keeps this path single.
    pub(super) async fn write<T: Send + 'static>(
        &self,
        deadline: Deadline,
        work: impl FnOnce(&Batch) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.visibility.failed()?;
        let admitted = self.admission.admit(deadline)?;
        let (reply, answer) = oneshot::channel::<Result<T, StoreError>>();
        let visibility = Arc::clone(&self.visibility);
        let job: Work = Box::new(move |batch: &Batch| -> Completion {
            let outcome = match catch_unwind(AssertUnwindSafe(|| work(batch))) {
                Ok(outcome) => outcome,
                Err(_) => Err(StoreError::Corrupt("a write panicked".into())),
            };
            if let Err(StoreError::Failed(why)) = &outcome {
                visibility.fail(why);
            }
            Box::new(move |flushed: Result<(), StoreError>| {
                let _ = reply.send(flushed.and(outcome));
            })
        });
        let ticket = admitted.ticket.clone();
        let job = Job::Write(Box::new(WriteJob {
            work: job,
            admitted,
        }));
        self.submit(job, deadline, &ticket, answer).await
    }

    /// Places an order, batched with the orders queued beside it, and resolves once its
    /// batch is on disk.
    pub(super) async fn place_order(
        &self,
        deadline: Deadline,
        new: NewOrder,
    ) -> Result<Placed, StoreError> {
        self.visibility.failed()?;
        let admitted = self.admission.admit(deadline)?;
        let ticket = admitted.ticket.clone();
        let (reply, answer) = oneshot::channel();
        let job = Job::Order(Box::new(OrderJob {
            new,
            reply,
            admitted,
        }));
        self.submit(job, deadline, &ticket, answer).await
    }

    async fn submit<T>(
        &self,
        job: Job,
        deadline: Deadline,
        ticket: &admission::Ticket,
        answer: oneshot::Receiver<Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let sent = match self.jobs.lock() {
            Ok(jobs) => jobs.as_ref().is_some_and(|j| j.send(job).is_ok()),
            Err(_) => false,
        };
        if !sent {
            return Err(StoreError::Failed("the writer has stopped".into()));
        }
        match admission::answer(deadline, ticket, answer).await {
            // After a storage failure (the writer drops what it has not applied), that
            // failure is the answer, whatever else ended the wait.
            Err(e) => {
                self.visibility.failed()?;
                Err(e)
            }
            done => done,
        }
    }

    /// Writes admitted and not yet answered after their flush (or dropped).
    pub(super) fn pending(&self) -> usize {
        self.admission.pending()
    }

    /// How long the oldest of them has waited.
    pub(super) fn oldest(&self) -> Option<std::time::Duration> {
        self.admission.oldest()
    }

    /// Finishes what is queued (the jobs whose deadline has not passed), flushes one last
    /// time and joins both threads, giving up at `deadline` (a flush that hangs on a stalled
    /// disk): then the threads are left to the process's exit.
    pub(super) async fn stop(&self, deadline: Deadline) -> Stopped {
        if let Some(jobs) = self.jobs.lock().ok().and_then(|mut j| j.take()) {
            let _ = jobs.send(Job::Stop);
        }
        let threads: Vec<JoinHandle<()>> = match self.threads.lock() {
            Ok(mut threads) => threads.drain(..).collect(),
            Err(_) => Vec::new(),
        };
        let (joined, all_joined) = oneshot::channel();
        std::thread::spawn(move || {
            for thread in threads {
                let _ = thread.join();
            }
            let _ = joined.send(());
        });
        match tokio::time::timeout_at(deadline.instant().into(), all_joined).await {
            Ok(_) => Stopped::Settled,
            Err(_) => Stopped::Abandoned {
                in_flight: self.admission.pending(),
            },
        }
    }
}

/// What the writer thread applies batches with.
struct Applying<'a> {
    trees: &'a Trees,
    visibility: &'a Visibility,
    metrics: &'a Metrics,
    /// The batch being applied counts as a commit in flight: a writer blocked inside sled
    /// (a disk that stopped answering) is a storage that stopped completing writes.
    commits: &'a Arc<InFlight>,
}

fn run_writer(applying: Applying, inbox: mpsc::Receiver<Job>, batches: mpsc::Sender<Finished>) {
    let Applying {
        trees,
        visibility,
        metrics,
        commits,
    } = applying;
    let mut number = 0u64;
    let mut stopping = false;
    let mut queued = Vec::new();
    while !stopping {
        match inbox.recv() {
            Ok(Job::Stop) | Err(_) => break,
            Ok(job) => queued.push(job),
        }
        while let Ok(job) = inbox.try_recv() {
            if let Job::Stop = job {
                stopping = true;
                break;
            }
            queued.push(job);
        }
        number += 1;
        let applying = commits.begin();
        visibility.start_batch(number);
        let batch = Batch {
            trees,
            number,
            visibility,
        };
        let mut done = Vec::with_capacity(queued.len());
        let mut orders = Vec::new();
        for job in queued.drain(..) {
            match job {
                Job::Order(order) => {
                    orders.push(*order);
                    if orders.len() == MAX_ORDERS {
                        place_orders(&batch, std::mem::take(&mut orders), &mut done);
                    }
                }
                Job::Write(job) => {
                    // Orders queued before this job are placed before it runs.
                    place_orders(&batch, std::mem::take(&mut orders), &mut done);
                    // After a failure nothing more is applied: memory must not drift
                    // further from what the disk holds. Dropping the job answers its
                    // caller with the failure (or, past its deadline, with "not written").
                    let WriteJob { work, admitted } = *job;
                    if visibility.failed().is_ok() && admitted.may_apply() {
                        done.push(releasing(work(&batch), admitted));
                    }
                }
                Job::Stop => unreachable!("a stop is never queued"),
            }
        }
        place_orders(&batch, orders, &mut done);
        applying.done();
        let applied = done.len() as u64;
        if batches.send(Finished::Batch { number, done }).is_err() {
            return;
        }
        metrics.writes_applied.inc_by(applied);
    }
    let _ = batches.send(Finished::Stop);
}

/// Places `orders` as one batch and queues each one's answer for the flush. When the batch
/// fails for a reason other than the disk (an order that does not encode, a panic), each
/// order is placed again as a batch of its own, so that only the bad one is refused.
fn place_orders(batch: &Batch, orders: Vec<OrderJob>, done: &mut Vec<Completion>) {
    if orders.is_empty() || batch.visibility.failed().is_err() {
        return;
    }
    // A queued order whose deadline passed leaves the queue here, before its batch is built.
    let (orders, replies): (Vec<NewOrder>, Vec<_>) = orders
        .into_iter()
        .filter(|job| job.admitted.may_apply())
        .map(|job| (job.new, (job.reply, job.admitted)))
        .unzip();
    if orders.is_empty() {
        return;
    }
    for new in &orders {
        batch.touches(Stripe::account(&new.account.id));
        batch.touches(Stripe::key(&new.account.id, &new.claim.key));
    }
    let orders: Vec<&NewOrder> = orders.iter().collect();
    // The batch's time is read here, in the order batches are applied: an account's ledger
    // then lists its entries in the order its balance moved (ids are time-ordered).
    let place = |orders: &[&NewOrder]| {
        catch_unwind(AssertUnwindSafe(|| {
            batch.trees.place_orders(orders, now_millis())
        }))
        .unwrap_or_else(|_| Err(StoreError::Corrupt("an order panicked".into())))
    };
    let outcomes = match place(&orders) {
        Ok(outcomes) => outcomes.into_iter().map(Ok).collect(),
        Err(StoreError::Failed(why)) => {
            batch.visibility.fail(&why);
            return;
        }
        Err(_) => orders
            .iter()
            .map(|order| {
                // Once one of them fails the store, the rest are not applied either.
                batch.visibility.failed()?;
                let placed = place(&[order]).map(|mut one| one.pop().expect("one answer"));
                if let Err(StoreError::Failed(why)) = &placed {
                    batch.visibility.fail(why);
                }
                placed
            })
            .collect::<Vec<_>>(),
    };
    for ((reply, admitted), outcome) in replies.into_iter().zip(outcomes) {
        let answer: Completion = Box::new(move |flushed: Result<(), StoreError>| {
            let _ = reply.send(flushed.and(outcome));
        });
        done.push(releasing(answer, admitted));
    }
}

/// Why a group commit did not reach the disk (its text follows `flush failed: `).
#[derive(Debug, thiserror::Error)]
enum FlushError {
    #[error("{0}")]
    Sled(sled::Error),
    #[error("{0}")]
    Sync(std::io::Error),
    #[error("{0}")]
    Hook(std::io::Error),
}

struct Flush {
    trees: Arc<Trees>,
    data_file: File,
    hook: Option<FlushHook>,
    /// sled's count of the blob files it synced, as far as the metric has taken it.
    blob_files_counted: u64,
}

impl Flush {
    /// Returns how many blob files sled synced since the last flush.
    fn run(&mut self) -> Result<u64, FlushError> {
        let hook = &self.hook;
        let step = |step: FlushStep| {
            hook.as_ref()
                .map_or(Ok(()), |hook| hook(step))
                .map_err(FlushError::Hook)
        };
        step(FlushStep::Flushing)?;
        self.trees.db.flush().map_err(FlushError::Sled)?;
        step(FlushStep::Flushed)?;
        self.data_file.sync_data().map_err(FlushError::Sync)?;
        step(FlushStep::Synced)?;
        let synced = self.trees.db.blob_files_synced();
        let new = synced - self.blob_files_counted;
        self.blob_files_counted = synced;
        Ok(new)
    }
}

fn run_commits(
    flush: &mut Flush,
    inbox: mpsc::Receiver<Finished>,
    metrics: &Metrics,
    visibility: &Visibility,
    commits: &Arc<InFlight>,
) {
    let mut stopping = false;
    while !stopping {
        let mut waiting: Vec<Completion> = Vec::new();
        let mut newest = 0;
        let mut take = |finished: Finished| match finished {
            Finished::Batch { number, done } => {
                newest = number;
                waiting.extend(done);
                false
            }
            Finished::Stop => true,
        };
        match inbox.recv() {
            Ok(finished) => stopping = take(finished),
            Err(_) => stopping = true,
        }
        // Everything finished by now rides on this one flush.
        while let Ok(finished) = inbox.try_recv() {
            stopping |= take(finished);
        }
        if waiting.is_empty() {
            continue;
        }
        let outcome = match visibility.failed() {
            Err(e) => Err(e),
            Ok(()) => {
                let started = Instant::now();
                let flushing = commits.begin();
                let flushed = flush.run();
                if flushed.is_ok() {
                    flushing.done();
                }
                metrics
                    .commit_seconds
                    .observe(started.elapsed().as_secs_f64());
                metrics.commit_batch_size.observe(waiting.len() as f64);
                if let Ok(blobs) = flushed {
                    metrics.blob_files_synced.inc_by(blobs);
                }
                flushed.map(drop).map_err(|why| {
                    let why = format!("flush failed: {why}");
                    visibility.fail(&why);
                    StoreError::Failed(why)
                })
            }
        };
        if outcome.is_ok() {
            visibility.published(newest);
        }
        for done in waiting {
            done(outcome.clone());
        }
    }
    log::info!("commit thread stopped after a final flush");
}
