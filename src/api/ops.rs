//! `/healthz` (the process answers), `/readyz` (the storage completes writes and answers)
//! and `/metrics` (with the readiness and the store's disk space read at the scrape).

use actix_web::{web, HttpResponse};

use super::respond::{json_response, StoreData};
use crate::bounds::STALLED_AFTER;
use crate::config::Settings;
use crate::disk_space;
use crate::error::{ApiError, ErrorEnvelope};
use crate::metrics::Metrics;
use crate::views::{to_json, Health};

fn health(status: &str) -> HttpResponse {
    json_response(to_json(&Health {
        success: true,
        status,
    }))
}

#[utoipa::path(get, path = "/healthz", tag = "ops", summary = "Whether the process is up", responses((status = 200, description = "The process is up", body = Health)))]
pub(crate) async fn healthz() -> HttpResponse {
    health("ok")
}

#[utoipa::path(get, path = "/metrics", tag = "ops", summary = "Prometheus metrics", responses((status = 200, description = "OpenMetrics text", content_type = "application/openmetrics-text", body = String)))]
pub(crate) async fn metrics(
    metrics: web::Data<Metrics>,
    store: StoreData,
    settings: web::Data<Settings>,
) -> HttpResponse {
    // A storage that does not answer within the bound is not ready; the scrape still answers.
    let ready = tokio::time::timeout(READY_PROBE_WITHIN, readiness(&store)).await;
    metrics.ready.set(i64::from(matches!(ready, Ok(Ok(())))));
    if settings.database_url.is_none() {
        let (free, size) = disk_space::of(&settings.data_dir).unwrap_or_default();
        metrics.disk_free_bytes.set(gauge_value(free));
        metrics.disk_size_bytes.set(gauge_value(size));
    }
    let progress = store.progress();
    let oldest = progress.oldest_commit.unwrap_or_default();
    metrics.oldest_commit_seconds.set(oldest.as_secs_f64());
    let oldest = progress.oldest_write.unwrap_or_default();
    metrics.oldest_write_seconds.set(oldest.as_secs_f64());
    metrics.pending_writes.set(progress.pending_writes as i64);
    let dropped = crate::logging::dropped_lines();
    let counted = metrics.log_lines_dropped.get();
    metrics
        .log_lines_dropped
        .inc_by(dropped.saturating_sub(counted));
    HttpResponse::Ok()
        // prometheus-client writes the OpenMetrics text format (its `# EOF` included).
        .content_type("application/openmetrics-text; version=1.0.0; charset=utf-8")
        .body(metrics.render())
}

#[utoipa::path(get, path = "/readyz", tag = "ops", summary = "Whether the storage completes writes and answers", responses((status = 200, description = "Storage completes writes and answers", body = Health), (status = 503, description = "A commit or a write has waited 4 s or more, the storage does not answer, or it has failed and the process is stopping", body = ErrorEnvelope)))]
pub(crate) async fn readyz(store: StoreData) -> Result<HttpResponse, ApiError> {
    readiness(&store).await?;
    Ok(health("ready"))
}

/// How long a scrape waits for the storage's answer before `orderly_ready` says 0.
const READY_PROBE_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

/// A byte count as a gauge holds it (past i64's end, its end: no disk is that large).
fn gauge_value(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

/// What `/readyz` judges: the storage completes writes and answers.
async fn readiness(store: &StoreData) -> Result<(), ApiError> {
    // Progress, not only an answer: a storage whose commits hang still answers a read. A
    // write counts whatever it waits on: writes queued on a row that another instance's
    // stalled commit holds have no commit of their own in flight.
    let progress = store.progress();
    if let Some(waited) = progress.oldest_commit {
        if waited >= STALLED_AFTER {
            return Err(ApiError::Unavailable(format!(
                "a commit has waited {:.1} s for the storage",
                waited.as_secs_f64()
            )));
        }
    }
    if let Some(waited) = progress.oldest_write {
        if waited >= STALLED_AFTER {
            return Err(ApiError::Unavailable(format!(
                "a write has waited {:.1} s for the storage",
                waited.as_secs_f64()
            )));
        }
    }
    store
        .probe()
        .await
        .map_err(|e| ApiError::Unavailable(e.to_string()))
}
