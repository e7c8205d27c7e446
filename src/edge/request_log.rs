//! One log line per request: method, path (never the query, which could carry a secret),
//! status, latency in milliseconds and whether it was a replay.
//!
//! actix's `Logger` does the same through a parsed format string, a wrapper around the body
//! and a second pass at the end of the stream; this writes the line once the response is
//! ready, which is all the line says, and skips even that when the target is filtered out.

use std::fmt;
use std::time::{Duration, Instant};

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
            response
                .headers()
                .contains_key(crate::header_names::IDEMPOTENCY_REPLAYED),
        ),
        Err(e) => (e.as_response_error().status_code(), false),
    };
    log::info!(
        "{method} {path} {} {}ms replayed={replayed}",
        status.as_u16(),
        Millis(started.elapsed())
    );
    outcome
}

/// A duration in milliseconds to the microsecond (`12.345`), as `{:.3}` prints the float,
/// in integers: formatting the float was a quarter of the line's cost.
struct Millis(Duration);

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let micros = (self.0.as_nanos() + 500) / 1000;
        write!(f, "{}.{:03}", micros / 1000, micros % 1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_is_printed_in_milliseconds_to_the_microsecond() {
        let printed = |nanos| Millis(Duration::from_nanos(nanos)).to_string();
        assert_eq!(printed(0), "0.000");
        assert_eq!(printed(499), "0.000");
        assert_eq!(printed(500), "0.001");
        assert_eq!(printed(12_345_678), "12.346");
        assert_eq!(printed(7_000_000_000), "7000.000");
    }
}
