//! The simulated fulfillment: completes `processing` orders once `--fulfillment-delay` has
//! passed since they were placed. The queue is a sled tree, so orders left `processing` by a
//! stopped or crashed server are completed after the restart.

use std::sync::Arc;
use std::time::Duration;

use crate::domain::time::now_millis;
use crate::store::committer::Committer;
use crate::store::Store;

/// Orders completed per transaction.
const BATCH: usize = 64;

/// How often to look: often enough that an order completes close to its delay.
pub fn poll_interval(delay: Duration) -> Duration {
    (delay / 4).clamp(Duration::from_millis(20), Duration::from_millis(250))
}

/// Completes every due order, a batch per transaction on the writer thread, so completions
/// neither contend with orders for sled's transaction lock nor flush on their own: they ride
/// the group commit, and their events are on disk before the webhook worker can see them.
pub fn complete_due_orders(store: &Arc<Store>, committer: &Committer, delay: Duration) {
    let mut total = 0;
    loop {
        let now = now_millis();
        let created_by = now.saturating_sub(delay.as_millis() as u64);
        let due = match store.due_orders(created_by, BATCH) {
            Ok(due) if due.is_empty() => break,
            Ok(due) => due,
            Err(e) => {
                log::error!("fulfillment: {e}");
                break;
            }
        };
        let batch = due.len();
        let store = Arc::clone(store);
        match committer.write_blocking(move || store.complete_orders(&due, now)) {
            Ok(Ok(n)) => total += n,
            Ok(Err(e)) | Err(e) => {
                log::error!("fulfillment: {e}");
                break;
            }
        }
        if batch < BATCH {
            break;
        }
    }
    if total > 0 {
        log::debug!("fulfillment completed {total} order(s)");
    }
}
