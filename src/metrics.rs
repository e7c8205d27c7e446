//! Prometheus metrics: what an operator needs to see that retries are safe and the service
//! is healthy (replays, key conflicts, 402s, rate limiting, commit latency, callbacks, the
//! sweeper). Rendered as OpenMetrics text on `GET /metrics`.

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RequestLabels {
    /// The route pattern (`/b2b/orders/{id}`), or `unmatched`.
    pub(crate) route: String,
    /// A standard method, or `other`.
    pub(crate) method: &'static str,
    /// `2xx`, `4xx`, ...: classes keep the series count small.
    pub(crate) status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct WorkerLabels {
    pub(crate) worker: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReasonLabels {
    pub(crate) reason: &'static str,
}

/// The Prometheus counters, gauges and histograms `GET /metrics` renders.
pub struct Metrics {
    registry: Registry,
    pub(crate) requests: Family<RequestLabels, Counter>,
    pub(crate) replays: Counter,
    pub(crate) key_conflicts: Family<ReasonLabels, Counter>,
    pub(crate) payment_required: Family<ReasonLabels, Counter>,
    pub(crate) rate_limited: Counter,
    pub(crate) commit_seconds: Histogram,
    pub(crate) commit_batch_size: Histogram,
    /// How long the oldest commit (or flush) in flight has waited, read from the storage at
    /// each scrape: what `/readyz` judges by.
    pub(crate) oldest_commit_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub(crate) oldest_write_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub(crate) log_lines_dropped: Counter,
    /// Writes waiting for the storage (queued or committing), against `--max-pending-writes`.
    pub(crate) pending_writes: Gauge,
    /// Writes the sled writer has applied and handed to the commit thread; those not yet in
    /// `commit_batch_size` are waiting for their flush.
    pub(crate) writes_applied: Counter,
    /// Files of sled's `blobs/` directory fsynced by a group commit.
    pub(crate) blob_files_synced: Counter,
    pub(crate) webhook_attempts: Counter,
    pub(crate) webhook_failures: Counter,
    /// Callbacks that will not be attempted again (410, the schedule spent, a URL refused).
    pub(crate) webhook_given_up: Counter,
    pub(crate) sweeper_deleted: Counter,
    pub(crate) worker_panics: Family<WorkerLabels, Counter>,
    /// Statements the shared rate limit sent (PostgreSQL), and the client buckets they spent:
    /// the work the limiter costs the database, however many addresses are counting.
    pub(crate) rate_limit_statements: Counter,
    pub(crate) rate_limit_buckets_spent: Counter,
    /// Requests allowed from budget lent to this instance ahead of them (no statement), and
    /// lent budget that lapsed unused and was given back.
    pub(crate) rate_limit_lent: Counter,
    pub(crate) rate_limit_returned: Counter,
    /// API keys looked up in the database (PostgreSQL): a key this instance has no copy of
    /// and that it knows exists, or any key while it is not caught up. A key it knows does
    /// not exist costs none.
    pub(crate) api_key_reads: Counter,
    /// API keys that can authenticate, as this instance knows them (PostgreSQL).
    pub(crate) api_keys_known: Gauge,
    /// 0 when a commit or write has waited long enough for `/readyz` to answer 503, else 1:
    /// judged from memory at the scrape (no probe of the storage), for an alert on readiness.
    pub(crate) ready: Gauge,
    /// When this process started (seconds since the epoch): a change is a restart.
    pub(crate) process_start_time_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// The filesystem of the sled store (and of a backup's spool, beside it): bytes free to an
    /// unprivileged writer, and its size. 0 on PostgreSQL.
    pub(crate) disk_free_bytes: Gauge,
    pub(crate) disk_size_bytes: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("orderly");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests by route, method and status class",
            requests.clone(),
        );
        let replays = Counter::default();
        registry.register(
            "idempotent_replays",
            "Requests answered with a stored response",
            replays.clone(),
        );
        let key_conflicts = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "idempotency_conflicts",
            "409s about an idempotency key (different_body or in_progress)",
            key_conflicts.clone(),
        );
        let payment_required = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "payment_required",
            "402 answers by reason",
            payment_required.clone(),
        );
        let rate_limited = Counter::default();
        registry.register(
            "rate_limited",
            "Requests refused with 429",
            rate_limited.clone(),
        );
        let commit_seconds = Histogram::new(exponential_buckets(0.0001, 2.0, 16));
        registry.register(
            "commit_flush_seconds",
            "Time of one durable commit (sled: a group flush + fdatasync; PostgreSQL: a write transaction)",
            commit_seconds.clone(),
        );
        let commit_batch_size = Histogram::new(exponential_buckets(1.0, 2.0, 10));
        registry.register(
            "commit_batch_size",
            "Commits made durable by one flush",
            commit_batch_size.clone(),
        );
        let oldest_commit_seconds = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "oldest_commit_in_flight_seconds",
            format!(
                "Age of the oldest commit (or flush) waiting for the storage now; 0 when none (readiness fails from {} s)",
                crate::bounds::STALLED_AFTER.as_secs()
            ),
            oldest_commit_seconds.clone(),
        );
        let oldest_write_seconds = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "oldest_write_waiting_seconds",
            format!(
                "Age of the oldest write admitted and not yet done with, whatever it waits on (a lock, a connection, its commit); 0 when none (readiness fails from {} s)",
                crate::bounds::STALLED_AFTER.as_secs()
            ),
            oldest_write_seconds.clone(),
        );
        let log_lines_dropped = Counter::default();
        registry.register(
            "log_lines_dropped",
            "Log lines dropped because stderr did not take them in time (a stalled log pipe never holds a request)",
            log_lines_dropped.clone(),
        );
        let pending_writes = Gauge::default();
        registry.register(
            "pending_writes",
            "Writes waiting for the storage now, queued or committing (bounded by --max-pending-writes)",
            pending_writes.clone(),
        );
        let writes_applied = Counter::default();
        registry.register(
            "writes_applied",
            "Writes applied by the sled writer and handed to the group commit",
            writes_applied.clone(),
        );
        let blob_files_synced = Counter::default();
        registry.register(
            "storage_blob_files_synced",
            "Files holding large values (sled's blobs/) fsynced before a commit's answer",
            blob_files_synced.clone(),
        );
        let webhook_attempts = Counter::default();
        registry.register(
            "webhook_attempts",
            "Callback delivery attempts",
            webhook_attempts.clone(),
        );
        let webhook_failures = Counter::default();
        registry.register(
            "webhook_failures",
            "Callback attempts that did not get a 2xx",
            webhook_failures.clone(),
        );
        let webhook_given_up = Counter::default();
        registry.register(
            "webhook_given_up",
            "Callbacks given up: a 410 Gone, the retry schedule spent, or a callback URL refused",
            webhook_given_up.clone(),
        );
        let sweeper_deleted = Counter::default();
        registry.register(
            "sweeper_deleted_keys",
            "Expired idempotency keys deleted by the sweeper",
            sweeper_deleted.clone(),
        );
        let worker_panics = Family::<WorkerLabels, Counter>::default();
        registry.register(
            "worker_panics",
            "Panics caught in a background worker (its work is retried on the next pass)",
            worker_panics.clone(),
        );
        let rate_limit_statements = Counter::default();
        registry.register(
            "rate_limit_statements",
            "Statements the shared rate limit sent to the database (one per tick, all its clients)",
            rate_limit_statements.clone(),
        );
        let rate_limit_buckets_spent = Counter::default();
        registry.register(
            "rate_limit_buckets_spent",
            "Client buckets spent by the shared rate limit's statements",
            rate_limit_buckets_spent.clone(),
        );
        let rate_limit_lent = Counter::default();
        registry.register(
            "rate_limit_lent",
            "Requests the shared rate limit allowed from budget lent to this instance ahead of them",
            rate_limit_lent.clone(),
        );
        let rate_limit_returned = Counter::default();
        registry.register(
            "rate_limit_returned",
            "Lent budget of the shared rate limit that lapsed unused and was given back",
            rate_limit_returned.clone(),
        );
        let api_key_reads = Counter::default();
        registry.register(
            "api_key_reads",
            "API keys looked up in the database; a key known not to exist costs none",
            api_key_reads.clone(),
        );
        let api_keys_known = Gauge::default();
        registry.register(
            "api_keys_known",
            "API keys that can authenticate, as this instance knows them (PostgreSQL)",
            api_keys_known.clone(),
        );
        let ready = Gauge::default();
        registry.register(
            "ready",
            "0 when a commit or write has waited 4 s for the storage (/readyz answers 503), else 1",
            ready.clone(),
        );
        let process_start_time_seconds = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "process_start_time_seconds",
            "When this process started, in seconds since the Unix epoch",
            process_start_time_seconds.clone(),
        );
        let disk_free_bytes = Gauge::default();
        registry.register(
            "storage_disk_free_bytes",
            "Bytes free on the filesystem of the sled store and its backup spool (0 on PostgreSQL)",
            disk_free_bytes.clone(),
        );
        let disk_size_bytes = Gauge::default();
        registry.register(
            "storage_disk_size_bytes",
            "Size of the filesystem of the sled store and its backup spool (0 on PostgreSQL)",
            disk_size_bytes.clone(),
        );
        Metrics {
            ready,
            process_start_time_seconds,
            disk_free_bytes,
            disk_size_bytes,
            api_key_reads,
            api_keys_known,
            rate_limit_statements,
            rate_limit_buckets_spent,
            rate_limit_lent,
            rate_limit_returned,
            worker_panics,
            registry,
            requests,
            replays,
            key_conflicts,
            payment_required,
            rate_limited,
            commit_seconds,
            commit_batch_size,
            oldest_commit_seconds,
            oldest_write_seconds,
            log_lines_dropped,
            pending_writes,
            writes_applied,
            blob_files_synced,
            webhook_attempts,
            webhook_failures,
            webhook_given_up,
            sweeper_deleted,
        }
    }
}

impl Metrics {
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }

    pub(crate) fn key_conflict(&self, reason: &'static str) {
        self.key_conflicts
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    pub(crate) fn payment_refused(&self, reason: &'static str) {
        self.payment_required
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_render_with_the_prefix_and_total_suffix() {
        let m = Metrics::default();
        m.replays.inc();
        m.key_conflict("different_body");
        let text = m.render();
        assert!(
            text.contains("orderly_idempotent_replays_total 1"),
            "{text}"
        );
        assert!(
            text.contains("orderly_idempotency_conflicts_total{reason=\"different_body\"} 1"),
            "{text}"
        );
    }
}
