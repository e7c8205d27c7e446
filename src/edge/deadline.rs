//! The request's deadline is born here: its arrival plus `--request-deadline`, put in the
//! request's extensions, from which handlers take it (`Deadline` is an extractor) and hand it
//! down through the port. Every wait below is bounded by it; this middleware is the last
//! resort for a handler that has not answered by `bounds::EDGE_MARGIN` after it.

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::Method;
use actix_web::middleware::Next;
use actix_web::{web, HttpMessage};

use crate::bounds::{Deadline, EDGE_MARGIN, REQUEST_DEADLINE};
use crate::config::Settings;
use crate::error::ApiError;
use crate::store::StoreError;

pub(crate) async fn stamp_deadline(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let within = req
        .app_data::<web::Data<Settings>>()
        .map_or(REQUEST_DEADLINE, |s| s.request_deadline);
    let deadline = Deadline::after(within);
    req.extensions_mut().insert(deadline);
    let reads_only = matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    let path = req.path().to_owned();
    let last_resort = (deadline.instant() + EDGE_MARGIN).into();
    match tokio::time::timeout_at(last_resort, next.call(req)).await {
        Ok(answered) => Ok(answered?.map_into_boxed_body()),
        Err(_) => {
            // Whatever the handler was waiting for is dropped with it. A read changed
            // nothing (503); a write's outcome is not known here (the opaque 500).
            log::error!("{path}: no answer by the deadline; answered by the edge");
            let why = "the handler did not answer by the deadline".to_string();
            let error = if reads_only {
                StoreError::TimedOut(why)
            } else {
                StoreError::InDoubt(why)
            };
            Err(ApiError::Storage(error).into())
        }
    }
}
