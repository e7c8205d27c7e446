//! Background work, each worker on a thread of its own with a small runtime: it waits for its
//! interval or for the stop signal, whichever comes first (so shutdown never waits out a long
//! sleep), then runs one pass. Workers reach storage through the port only.

pub mod fulfillment;
pub mod pruner;
pub mod sweeper;
pub mod webhooks;

use std::future::Future;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

pub struct Periodic {
    stop: mpsc::Sender<()>,
    thread: JoinHandle<()>,
}

impl Periodic {
    pub fn spawn<F, Fut>(name: &str, every: Duration, mut tick: F) -> std::io::Result<Self>
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = ()>,
    {
        let (stop, stopped) = mpsc::channel::<()>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = std::thread::Builder::new()
            .name(format!("orderly-{name}"))
            .spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                    runtime.block_on(tick());
                }
            })?;
        Ok(Periodic { stop, thread })
    }

    pub fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.thread.join();
    }
}
