//! `/healthz` (the process answers) and `/readyz` (the storage answers).

use actix_web::{web, HttpResponse};

use super::AppState;

pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(r#"{"success":true,"status":"ok"}"#)
}

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
