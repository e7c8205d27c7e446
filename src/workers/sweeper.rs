//! Deletes idempotency rows whose `expires_at` has passed, every `--sweep-interval`.
//! Until it runs, expired rows still decide: a key is remembered at least its TTL and at
//! most about one interval longer.

use crate::bounds::{Deadline, WORKER_CALL};
use crate::domain::time::now_millis;
use crate::metrics::Metrics;
use crate::store::Store;

/// Keys deleted per write, so a backlog never holds the writer for long; a backlog is
/// finished on the same tick.
const BATCH: usize = 256;

pub(crate) async fn sweep_expired_keys(store: &dyn Store, metrics: &Metrics) {
    let now = now_millis();
    let mut total = 0;
    loop {
        match store
            .sweep_expired_keys(Deadline::after(WORKER_CALL), now, BATCH)
            .await
        {
            Ok(0) => break,
            Ok(n) => total += n,
            Err(e) => {
                e.log("sweeper");
                break;
            }
        }
    }
    metrics.sweeper_deleted.inc_by(total as u64);
    if total > 0 {
        log::info!("sweeper deleted {total} expired idempotency key(s)");
    }
}
