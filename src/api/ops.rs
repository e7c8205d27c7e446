//! `/healthz` (the process answers), `/readyz` (the storage answers) and `/metrics`.

use actix_web::{web, HttpResponse};

use super::openapi::{ErrorEnvelope, Health};
use super::AppState;

#[utoipa::path(get, path = "/healthz", tag = "ops", responses((status = 200, description = "The process is up", body = Health)))]
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(r#"{"success":true,"status":"ok"}"#)
}

#[utoipa::path(get, path = "/metrics", tag = "ops", responses((status = 200, description = "Prometheus text", content_type = "text/plain", body = String)))]
pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(state.metrics.render())
}

#[utoipa::path(get, path = "/readyz", tag = "ops", responses((status = 200, description = "Storage answers", body = Health), (status = 503, description = "Storage does not answer", body = ErrorEnvelope)))]
pub async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    match state.store.probe() {
        Ok(()) => HttpResponse::Ok()
            .content_type("application/json")
            .body(r#"{"success":true,"status":"ready"}"#),
        Err(e) => {
            log::error!("readiness probe failed: {e}");
            HttpResponse::ServiceUnavailable()
                .content_type("application/json")
                .body(r#"{"success":false,"error":"storage_unavailable: the database does not answer"}"#)
        }
    }
}
