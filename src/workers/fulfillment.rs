//! The simulated fulfillment: completes `processing` orders once `--fulfillment-delay` has
//! passed since they were placed. The queue is durable, so orders left `processing` by a
//! stopped or crashed server are completed after the restart.

use crate::bounds::{Deadline, WORKER_CALL};
use std::time::Duration;

use crate::domain::time::now_millis;
use crate::store::Store;

/// Orders completed per write (one per order would double the write load of the orders).
const BATCH: usize = 64;

/// How often to look: often enough that an order completes close to its delay.
pub(crate) fn poll_interval(delay: Duration) -> Duration {
    (delay / 4).clamp(Duration::from_millis(20), Duration::from_millis(250))
}

/// Completes every due order, a batch per write.
pub(crate) async fn complete_due_orders(store: &dyn Store, delay: Duration) {
    let mut total = 0;
    loop {
        let created_by = now_millis().saturating_sub(delay.as_millis() as u64);
        match store
            .complete_due_orders(Deadline::after(WORKER_CALL), created_by, BATCH)
            .await
        {
            Ok(0) => break,
            Ok(n) => {
                total += n;
                if n < BATCH {
                    break;
                }
            }
            Err(e) => {
                e.log("fulfillment");
                break;
            }
        }
    }
    if total > 0 {
        log::debug!("fulfillment completed {total} order(s)");
    }
}
