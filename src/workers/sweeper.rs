//! Deletes idempotency rows whose `expires_at` has passed, every `--sweep-interval`.
//! Until it runs, expired rows still decide: a key is remembered at least its TTL and at
//! most about one interval longer.

use std::sync::Arc;

use crate::domain::time::now_millis;
use crate::metrics::Metrics;
use crate::store::Store;

/// Keys deleted per pass before yielding; a backlog is finished on the same tick.
const BATCH: usize = 1_000;

pub fn sweep_expired_keys(store: &Arc<Store>, metrics: &Metrics) {
    let now = now_millis();
    let mut total = 0;
    loop {
        match store.sweep_expired_keys(now, BATCH) {
            Ok(0) => break,
            Ok(n) => total += n,
            Err(e) => {
                log::error!("sweeper: {e}");
                break;
            }
        }
    }
    metrics.sweeper_deleted.inc_by(total as u64);
    if total > 0 {
        log::info!("sweeper deleted {total} expired idempotency key(s)");
    }
}
