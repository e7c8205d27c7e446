//! `/healthz` (the process answers), `/readyz` (the storage answers) and `/metrics`.

use actix_web::{web, HttpResponse};

use super::respond::{json_response, StoreData};
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
pub async fn healthz() -> HttpResponse {
    health("ok")
}

#[utoipa::path(get, path = "/metrics", tag = "ops", summary = "Prometheus metrics", responses((status = 200, description = "Prometheus text", content_type = "text/plain", body = String)))]
pub async fn metrics(metrics: web::Data<Metrics>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(metrics.render())
}

#[utoipa::path(get, path = "/readyz", tag = "ops", summary = "Whether the storage answers", responses((status = 200, description = "Storage answers", body = Health), (status = 503, description = "Storage does not answer, or has failed and the process is stopping", body = ErrorEnvelope)))]
pub async fn readyz(store: StoreData) -> Result<HttpResponse, ApiError> {
    store
        .probe()
        .await
        .map_err(|e| ApiError::Unavailable(e.to_string()))?;
    Ok(health("ready"))
}
