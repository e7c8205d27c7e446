//! Background work, each worker on a thread of its own with a small runtime: it waits for its
//! interval or for the stop signal, whichever comes first (so shutdown never waits out a long
//! sleep), then runs one pass. Workers reach storage through the port only.
//!
//! A worker outlives its mistakes: a panic in a pass is caught, logged and counted in
//! `orderly_worker_panics_total{worker}`, and the next pass runs as usual (the work it was
//! doing is still in storage, so it is retried).

pub(crate) mod fulfillment;
pub(crate) mod pruner;
pub(crate) mod sweeper;
pub(crate) mod webhooks;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use futures_util::future::{select, Either};
use futures_util::FutureExt;
use tokio::sync::watch;

use crate::bounds::Deadline;
use crate::metrics::{Metrics, WorkerLabels};

/// A background worker on a thread of its own.
pub(crate) struct Periodic {
    thread: JoinHandle<()>,
}

/// Tells every worker to stop starting passes: sent when the stop begins (SIGTERM), before the
/// HTTP server drains, so that work begun meanwhile (a webhook POST) ends within the stop's
/// bound instead of starting near its end.
pub(crate) struct StopSignal(watch::Sender<bool>);

impl Default for StopSignal {
    fn default() -> Self {
        StopSignal(watch::channel(false).0)
    }
}

impl StopSignal {
    /// What a worker watches.
    fn subscribe(&self) -> watch::Receiver<bool> {
        self.0.subscribe()
    }

    /// From now on no worker starts another pass; each then finishes what it started.
    pub(crate) fn send(&self) {
        self.0.send_replace(true);
    }
}

/// Runs `work`, catching a panic in it: logged and counted for `worker`, then forgotten.
pub(crate) async fn survive<Fut: Future<Output = ()>>(
    worker: &'static str,
    metrics: &Metrics,
    work: Fut,
) {
    if AssertUnwindSafe(work).catch_unwind().await.is_err() {
        log::error!("worker {worker} panicked; its work is retried on the next pass");
        metrics
            .worker_panics
            .get_or_create(&WorkerLabels { worker })
            .inc();
    }
}

impl Periodic {
    /// A worker that runs `tick` every `every` until `stop` is sent.
    pub(crate) fn spawn<F, Fut>(
        name: &'static str,
        every: Duration,
        metrics: Arc<Metrics>,
        stop: &StopSignal,
        tick: F,
    ) -> std::io::Result<Self>
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = ()>,
    {
        Self::spawn_draining(name, every, metrics, stop, tick, || async {})
    }

    /// As `spawn`, and once stopped the worker runs `drain` before its runtime goes: the
    /// webhook worker's deliveries run as tasks of that runtime, and dropping it would cut a
    /// POST on the wire (the receiver, which cannot tell, would still be handling it when
    /// another instance took the delivery over).
    pub(crate) fn spawn_draining<F, Fut, D, DFut>(
        name: &'static str,
        every: Duration,
        metrics: Arc<Metrics>,
        stop: &StopSignal,
        mut tick: F,
        drain: D,
    ) -> std::io::Result<Self>
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = ()>,
        D: FnOnce() -> DFut + Send + 'static,
        DFut: Future<Output = ()>,
    {
        // The worker's panic count is listed from its start, at 0: an alert on its increase
        // sees the first panic (a series that appears already at 1 shows no increase).
        drop(
            metrics
                .worker_panics
                .get_or_create(&WorkerLabels { worker: name }),
        );
        let mut stopped = stop.subscribe();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = std::thread::Builder::new()
            .name(format!("orderly-{name}"))
            .spawn(move || {
                runtime.block_on(async move {
                    loop {
                        let wait = pin!(tokio::time::sleep(every));
                        let stop = pin!(stopped.wait_for(|stop| *stop));
                        if let Either::Right(_) = select(wait, stop).await {
                            break;
                        }
                        // A panic while making the pass's future counts like one inside it.
                        match std::panic::catch_unwind(AssertUnwindSafe(&mut tick)) {
                            Ok(pass) => survive(name, &metrics, pass).await,
                            Err(_) => survive(name, &metrics, async { panic!("{name}") }).await,
                        }
                    }
                    survive(name, &metrics, drain()).await;
                })
            })?;
        Ok(Periodic { thread })
    }

    /// Waits until `deadline` for the worker to stop (its `StopSignal` sent): true when it
    /// stopped, false when it was left inside a pass or its drain (the process's exit ends
    /// it).
    pub(crate) async fn join(self, deadline: Deadline) -> bool {
        while !self.thread.is_finished() {
            if deadline.passed() {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _ = self.thread.join();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn a_panicking_pass_is_counted_and_the_next_pass_runs() {
        let metrics = Arc::new(Metrics::default());
        let passes = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&passes);
        let stop = StopSignal::default();
        let worker = Periodic::spawn(
            "test",
            Duration::from_millis(5),
            Arc::clone(&metrics),
            &stop,
            move || {
                let n = seen.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n == 0 {
                        panic!("the first pass fails");
                    }
                }
            },
        )
        .unwrap();
        for _ in 0..400 {
            if passes.load(Ordering::SeqCst) >= 3 {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        stop.send();
        let stopped = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(worker.join(Deadline::after(Duration::from_secs(5))));
        assert!(stopped);
        assert!(
            passes.load(Ordering::SeqCst) >= 3,
            "passes after the panic ran"
        );
        assert!(metrics
            .render()
            .contains("orderly_worker_panics_total{worker=\"test\"} 1"));
    }

    #[test]
    fn a_workers_panic_count_is_listed_at_zero_from_its_start() {
        let metrics = Arc::new(Metrics::default());
        let stop = StopSignal::default();
        let worker = Periodic::spawn(
            "quiet",
            Duration::from_secs(3600),
            Arc::clone(&metrics),
            &stop,
            || async {},
        )
        .unwrap();
        let listed = metrics.render();
        stop.send();
        let stopped = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(worker.join(Deadline::after(Duration::from_secs(5))));
        assert!(stopped);
        assert!(
            listed.contains("orderly_worker_panics_total{worker=\"quiet\"} 0"),
            "{listed}"
        );
    }
}
