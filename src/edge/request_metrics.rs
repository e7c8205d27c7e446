//! Counts every response by route pattern (never the raw path, whose ids would make one
//! series per order), method and status class. Every label comes from a fixed set, so no
//! request can add a time series: a method outside the standard ones is `other`, a path that
//! matches no route is `unmatched`.

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::Method;
use actix_web::middleware::Next;
use actix_web::web;

use crate::metrics::{Metrics, RequestLabels};

pub(crate) async fn count_requests(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let metrics = req.app_data::<web::Data<Metrics>>().cloned();
    let method = method_label(req.method());
    let response = next.call(req).await?.map_into_boxed_body();
    if let Some(metrics) = metrics {
        let labels = RequestLabels {
            route: response
                .request()
                .match_pattern()
                .unwrap_or_else(|| "unmatched".into()),
            method,
            status: status_class(response.status().as_u16()),
        };
        metrics.requests.get_or_create(&labels).inc();
    }
    Ok(response)
}

fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

fn status_class(status: u16) -> &'static str {
    match status / 100 {
        1 => "1xx",
        2 => "2xx",
        3 => "3xx",
        4 => "4xx",
        _ => "5xx",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_made_up_method_is_other() {
        let made_up = Method::from_bytes(b"BREW").unwrap();
        assert_eq!(method_label(&made_up), "other");
        assert_eq!(method_label(&Method::DELETE), "DELETE");
    }
}
