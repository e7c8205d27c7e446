//! The threads sled's reads run on: a few, shared by every request of the process.
//!
//! A read never runs on a request's thread (see `SledStore::read`): while a flush waits on a
//! disk that stopped answering, a read can wait with it. It runs here instead, on a pool of
//! its own rather than each HTTP worker's blocking pool: each thread that reads keeps the
//! allocator's pages it used, and actix's pools, 256 threads a worker on two cores, grew to
//! about 50 under load and held 100 MiB more at a million orders for the same throughput. One
//! pool also means that any idle thread serves any read, whichever worker asked, and that the
//! HTTP workers' own pools stay for what else blocks there (a PostgreSQL host's lookup).
//!
//! A read runs inside this runtime's context, which nothing drives and which has no timers:
//! a read is sled's own blocking code only, never tokio's (a timer would panic, a spawned task
//! never run).

use std::sync::Arc;

use tokio::runtime::{Builder, Runtime};
use tokio::sync::Semaphore;

use crate::bounds::Deadline;
use crate::store::StoreError;

pub(super) struct Readers {
    /// Only its blocking pool is used; nothing drives the runtime itself. `None` once dropped.
    runtime: Option<Runtime>,
    /// Reads running or queued for a thread; one more is refused at once.
    places: Arc<Semaphore>,
}

impl Readers {
    /// At most `threads` reads at once, and `places` running or waiting for a thread.
    pub(super) fn new(threads: usize, places: usize) -> std::io::Result<Readers> {
        let runtime = Builder::new_current_thread()
            .max_blocking_threads(threads)
            .thread_name("orderly-read")
            .build()?;
        Ok(Readers {
            runtime: Some(runtime),
            places: Arc::new(Semaphore::new(places)),
        })
    }

    /// `read` on one of the threads, answered by `deadline`: `Overloaded` at once when every
    /// place is taken, `TimedOut` when the deadline comes first. A read the deadline cut short
    /// finishes on its own and keeps its place until then; one whose deadline passed while it
    /// waited for a thread is not run at all, so a backlog left by a stall drains at once.
    pub(super) async fn run<T: Send + 'static>(
        &self,
        deadline: Deadline,
        read: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let place = Arc::clone(&self.places)
            .try_acquire_owned()
            .map_err(|_| StoreError::Overloaded)?;
        let runtime = self
            .runtime
            .as_ref()
            .expect("readers are used only until dropped");
        let reading = runtime.spawn_blocking(move || {
            let _place = place;
            if deadline.passed() {
                return Err(StoreError::TimedOut(
                    "the read waited past its deadline".into(),
                ));
            }
            read()
        });
        tokio::time::timeout_at(deadline.instant().into(), reading)
            .await
            .map_err(|_| StoreError::TimedOut("the disk did not answer a read in time".into()))?
            .map_err(|e| StoreError::Corrupt(format!("a read panicked: {e}")))?
    }
}

impl Drop for Readers {
    fn drop(&mut self) {
        // A store can be dropped on a runtime's thread, where a runtime's own drop (which waits
        // for its threads) would panic; a read still running ends on its own.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    fn soon() -> Deadline {
        Deadline::after(Duration::from_secs(30))
    }

    /// Starts a read that holds its thread until `release` is sent; returns once it runs.
    async fn hold_a_thread(
        readers: &Arc<Readers>,
    ) -> (
        mpsc::Sender<()>,
        tokio::task::JoinHandle<Result<(), StoreError>>,
    ) {
        let (release, released) = mpsc::channel::<()>();
        let (started, running) = tokio::sync::oneshot::channel();
        let held = Arc::clone(readers);
        let read = tokio::spawn(async move {
            held.run(soon(), move || {
                let _ = started.send(());
                released.recv().expect("released");
                Ok(())
            })
            .await
        });
        running.await.expect("the held read runs");
        (release, read)
    }

    #[tokio::test]
    async fn a_read_queued_past_its_deadline_times_out_by_then_and_never_runs() {
        let readers = Arc::new(Readers::new(1, 8).unwrap());
        let (release, held) = hold_a_thread(&readers).await;

        let ran = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&ran);
        let asked = Instant::now();
        let queued = readers
            .run(Deadline::after(Duration::from_millis(100)), move || {
                flag.store(true, Ordering::SeqCst);
                Ok(())
            })
            .await;
        assert!(matches!(queued, Err(StoreError::TimedOut(_))), "{queued:?}");
        assert!(
            asked.elapsed() < Duration::from_secs(5),
            "answered by its deadline"
        );

        release.send(()).unwrap();
        held.await.unwrap().unwrap();
        // The queued read gives its place back without running once the thread is free.
        let freed = Instant::now() + Duration::from_secs(10);
        while readers.places.available_permits() < 8 && Instant::now() < freed {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(readers.places.available_permits(), 8);
        assert!(
            !ran.load(Ordering::SeqCst),
            "a read nobody waits for is not run"
        );
        assert_eq!(readers.run(soon(), || Ok(7)).await.unwrap(), 7);
    }

    #[tokio::test]
    async fn a_read_past_the_places_is_refused_at_once() {
        let readers = Arc::new(Readers::new(1, 1).unwrap());
        let (release, held) = hold_a_thread(&readers).await;

        let refused = readers.run(soon(), || Ok(())).await;
        assert!(
            matches!(refused, Err(StoreError::Overloaded)),
            "{refused:?}"
        );

        release.send(()).unwrap();
        held.await.unwrap().unwrap();
        assert_eq!(readers.run(soon(), || Ok(1)).await.unwrap(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_hundred_reads_from_many_tasks_on_two_threads_each_get_their_own_answer() {
        let readers = Arc::new(Readers::new(2, 256).unwrap());
        let reads = (0..200u32).map(|i| {
            let readers = Arc::clone(&readers);
            tokio::spawn(async move { readers.run(soon(), move || Ok(i * 2)).await })
        });
        for (i, read) in reads.collect::<Vec<_>>().into_iter().enumerate() {
            assert_eq!(read.await.unwrap().unwrap(), i as u32 * 2);
        }
    }
}
