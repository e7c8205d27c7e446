//! One log line per request: method, path (never the query, which could carry a secret),
//! status, latency in milliseconds and whether it was a replay.
//!
//! actix's `Logger` does the same through a parsed format string, a wrapper around the body
//! and a second pass at the end of the stream; this writes the line once the response is
//! ready, which is all the line says, and skips even that when the target is filtered out.

use std::time::Instant;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;

pub async fn log_requests(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    if !log::log_enabled!(log::Level::Info) {
        return next.call(req).await;
    }
    let started = Instant::now();
    let method = req.method().clone();
    let path = req.path().to_owned();
    let outcome = next.call(req).await;
    // A middleware's refusal (the 403 of Origin, the 429) arrives as an error that actix
    // turns into its response further out; it is logged with that response's status.
    let (status, replayed) = match &outcome {
        Ok(response) => (
            response.status(),
            response.headers().contains_key("Idempotency-Replayed"),
        ),
        Err(e) => (e.as_response_error().status_code(), false),
    };
    log::info!(
        "{method} {path} {} {:.3}ms replayed={replayed}",
        status.as_u16(),
        started.elapsed().as_secs_f64() * 1000.0
    );
    outcome
}
