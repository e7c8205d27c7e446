//! `/healthz` (the process answers), `/readyz` (the storage completes writes and answers)
//! and `/metrics` (with the readiness judged from what waits on the storage, never a probe).

use actix_web::{web, HttpResponse};

use super::respond::{json_response, StoreData};
use crate::bounds::STALLED_AFTER;
use crate::error::{ApiError, ErrorEnvelope};
use crate::metrics::Metrics;
use crate::store::Progress;
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
pub(crate) async fn metrics(metrics: web::Data<Metrics>, store: StoreData) -> HttpResponse {
    // What /readyz judges before its probe, from memory: a scrape never waits on the storage
    // (a stalled disk would hold every worker that answers it, /readyz's included). The disk's
    // space is read by a worker of its own (`disk_space`).
    let progress = store.progress();
    metrics.ready.set(i64::from(stalled(&progress).is_none()));
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

/// Why the storage is not completing writes, from what waits on it now; `None` when nothing
/// has waited `STALLED_AFTER`.
fn stalled(progress: &Progress) -> Option<ApiError> {
    // Progress, not only an answer: a storage whose commits hang still answers a read. A
    // write counts whatever it waits on: writes queued on a row that another instance's
    // stalled commit holds have no commit of their own in flight.
    if let Some(waited) = progress.oldest_commit.filter(|w| *w >= STALLED_AFTER) {
        return Some(ApiError::Unavailable(format!(
            "a commit has waited {:.1} s for the storage",
            waited.as_secs_f64()
        )));
    }
    let waited = progress.oldest_write.filter(|w| *w >= STALLED_AFTER)?;
    Some(ApiError::Unavailable(format!(
        "a write has waited {:.1} s for the storage",
        waited.as_secs_f64()
    )))
}

/// What `/readyz` judges: the storage completes writes and answers.
async fn readiness(store: &StoreData) -> Result<(), ApiError> {
    if let Some(why) = stalled(&store.progress()) {
        return Err(why);
    }
    store
        .probe()
        .await
        .map_err(|e| ApiError::Unavailable(e.to_string()))
}
