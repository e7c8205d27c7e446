//! Counts every response by route pattern (never the raw path, whose ids would make one
//! series per order), method and status class.

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::web;

use crate::metrics::{Metrics, RequestLabels};

pub async fn count_requests(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let metrics = req.app_data::<web::Data<Metrics>>().cloned();
    let method = req.method().to_string();
    let response = next.call(req).await?.map_into_boxed_body();
    if let Some(metrics) = metrics {
        let labels = RequestLabels {
            route: response
                .request()
                .match_pattern()
                .unwrap_or_else(|| "unmatched".into()),
            method,
            status: format!("{}xx", response.status().as_u16() / 100),
        };
        metrics.requests.get_or_create(&labels).inc();
    }
    Ok(response)
}
