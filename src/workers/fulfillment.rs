//! The simulated fulfillment: completes `processing` orders once `--fulfillment-delay` has
//! passed since they were placed. The queue is a sled tree, so orders left `processing` by a
//! stopped or crashed server are completed after the restart.

use std::sync::Arc;
use std::time::Duration;

use crate::domain::time::now_millis;
use crate::store::Store;

/// Orders completed per transaction.
const BATCH: usize = 64;

/// How often to look: often enough that an order completes close to its delay.
pub fn poll_interval(delay: Duration) -> Duration {
    (delay / 4).clamp(Duration::from_millis(20), Duration::from_millis(250))
}

pub fn complete_due_orders(store: &Arc<Store>, delay: Duration) {
    let mut total = 0;
    loop {
        let now = now_millis();
        let created_by = now.saturating_sub(delay.as_millis() as u64);
        match store.complete_due_orders(created_by, now, BATCH) {
            Ok(0) => break,
            Ok(n) => total += n,
            Err(e) => {
                log::error!("fulfillment: {e}");
                break;
            }
        }
    }
    if total > 0 {
        // Completions answer no request, so they share one flush per pass instead of
        // waiting for sled's background one; their events are then safe to deliver.
        if let Err(e) = store.db().flush() {
            log::error!("fulfillment flush: {e}");
        }
        log::debug!("fulfillment completed {total} order(s)");
    }
}
