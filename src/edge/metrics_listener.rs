//! `--metrics-listen`: `/metrics` answered on a listener of its own (a private address the
//! scraper reaches) and on no other, and nothing but `/metrics` answered there. Without the
//! flag every listener answers everything, as before. The split is by the listener a request
//! arrived on, so one server, one drain and one stop serve both.

use std::net::SocketAddr;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{web, ResponseError};

use crate::error::ApiError;

const METRICS_PATH: &str = "/metrics";

/// The metrics listener's address, when there is one.
pub(crate) struct MetricsListener(pub(crate) Option<SocketAddr>);

/// Whether a request to `path` that arrived on `local` is refused (404) because it belongs to
/// the other listener.
fn belongs_elsewhere(metrics: Option<SocketAddr>, local: SocketAddr, path: &str) -> bool {
    match metrics {
        None => false,
        Some(addr) if addr == local => path != METRICS_PATH,
        Some(_) => path == METRICS_PATH,
    }
}

pub(crate) async fn split_metrics(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let metrics = req
        .app_data::<web::Data<MetricsListener>>()
        .and_then(|m| m.0);
    if belongs_elsewhere(metrics, req.app_config().local_addr(), req.path()) {
        return Ok(req.into_response(ApiError::RouteNotFound.error_response()));
    }
    Ok(next.call(req).await?.map_into_boxed_body())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_listener_answers_only_its_own_paths() {
        let api: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let scrape: SocketAddr = "10.0.0.5:9100".parse().unwrap();
        assert!(!belongs_elsewhere(None, api, "/metrics"));
        assert!(!belongs_elsewhere(None, api, "/b2b/orders"));
        assert!(belongs_elsewhere(Some(scrape), api, "/metrics"));
        assert!(!belongs_elsewhere(Some(scrape), api, "/b2b/orders"));
        assert!(!belongs_elsewhere(Some(scrape), scrape, "/metrics"));
        assert!(belongs_elsewhere(Some(scrape), scrape, "/b2b/orders"));
        assert!(belongs_elsewhere(Some(scrape), scrape, "/metrics/"));
    }
}
