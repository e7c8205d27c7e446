//! Every answer's `Request-Id`, and one log line per request: its id (and the caller's own
//! `X-Request-Id`, when it sent one), method, path (never the query, which could carry a
//! secret), status, latency in milliseconds, whether it was a replay, and the name of the
//! admin token it presented (never the token).
//!
//! actix's `Logger` does the same through a parsed format string, a wrapper around the body
//! and a second pass at the end of the stream; this writes the line once the response is
//! ready, which is all the line says, and skips even that when the target is filtered out.

use std::fmt;
use std::time::{Duration, Instant};

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::HttpMessage;

use super::request_id::{self, RequestId, REQUEST_ID, X_REQUEST_ID};
use crate::credentials::AdminTokenName;

pub(crate) async fn log_requests(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let id = request_id::next();
    if !log::log_enabled!(log::Level::Info) {
        return with_id(next.call(req).await, &id);
    }
    let started = Instant::now();
    let method = req.method().clone();
    let path = req.path().to_owned();
    let caller = request_id::caller_id(req.headers().get(X_REQUEST_ID));
    let outcome = with_id(next.call(req).await, &id);
    // A refusal raised as an error on the way (the edge's last resort at the deadline)
    // becomes its response further out; it is logged with that response's status.
    let (status, replayed, admin) = match &outcome {
        Ok(response) => (
            response.status(),
            response
                .headers()
                .contains_key(crate::header_names::IDEMPOTENCY_REPLAYED),
            response
                .request()
                .extensions()
                .get::<AdminTokenName>()
                .cloned(),
        ),
        Err(e) => (e.as_response_error().status_code(), false, None),
    };
    log::info!(
        "{} {method} {path} {} {}ms replayed={replayed}{}{}",
        id.as_str(),
        status.as_u16(),
        Millis(started.elapsed()),
        CallerId(caller.as_deref()),
        AdminToken(admin.as_ref()),
    );
    outcome
}

/// The answer with its `Request-Id`, whether it is a response or an error still to become
/// one (which then carries the id too).
fn with_id<B>(
    outcome: Result<ServiceResponse<B>, actix_web::Error>,
    id: &RequestId,
) -> Result<ServiceResponse<B>, actix_web::Error> {
    match outcome {
        Ok(mut response) => {
            response.headers_mut().insert(REQUEST_ID, id.header_value());
            Ok(response)
        }
        Err(error) => Err(IdentifiedError {
            error,
            id: id.header_value(),
        }
        .into()),
    }
}

/// An error on its way to becoming a response, with the request's id.
#[derive(Debug)]
struct IdentifiedError {
    error: actix_web::Error,
    id: actix_web::http::header::HeaderValue,
}

impl fmt::Display for IdentifiedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl actix_web::ResponseError for IdentifiedError {
    fn status_code(&self) -> actix_web::http::StatusCode {
        self.error.as_response_error().status_code()
    }

    fn error_response(&self) -> actix_web::HttpResponse {
        let mut response = self.error.error_response();
        response.headers_mut().insert(REQUEST_ID, self.id.clone());
        response
    }
}

/// ` caller_id=…` when the caller sent an `X-Request-Id`, else nothing.
struct CallerId<'a>(Option<&'a str>);

impl fmt::Display for CallerId<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(id) => write!(f, " caller_id={id}"),
            None => Ok(()),
        }
    }
}

/// ` admin_token=NAME` when an admin token was accepted: its name, never its value.
struct AdminToken<'a>(Option<&'a AdminTokenName>);

impl fmt::Display for AdminToken<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(name) => write!(f, " admin_token={}", name.0),
            None => Ok(()),
        }
    }
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
