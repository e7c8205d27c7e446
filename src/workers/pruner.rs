//! Forgets rate-limit buckets that are full again, every minute, so the limiter's memory
//! tracks recent clients only: the in-memory ones, and the shared table's rows on an engine
//! that keeps one.

use std::time::Duration;

/// How often idle rate-limit buckets are forgotten.
pub(crate) const PRUNE_EVERY: Duration = Duration::from_secs(60);

use crate::edge::rate_limit::RateLimits;

pub(crate) async fn prune_idle_buckets(limits: &RateLimits) {
    limits.prune();
    limits.prune_shared().await;
}
