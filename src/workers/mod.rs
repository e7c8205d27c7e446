//! Background work on plain threads: each waits for its interval or for the stop signal,
//! whichever comes first, so shutdown never waits out a long sleep.

pub mod fulfillment;
pub mod sweeper;
pub mod webhooks;

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

pub struct Periodic {
    stop: mpsc::Sender<()>,
    thread: JoinHandle<()>,
}

impl Periodic {
    pub fn spawn(name: &str, every: Duration, mut tick: impl FnMut() + Send + 'static) -> Self {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("orderly-{name}"))
            .spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                    tick();
                }
            })
            .expect("spawning a worker thread");
        Periodic { stop, thread }
    }

    pub fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.thread.join();
    }
}
