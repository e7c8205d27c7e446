//! What runs around every handler: the request's deadline, the Origin check, the client
//! address, the rate limiter, the request counters, every answer's `Request-Id` and the
//! request log.

pub mod client_ip;
pub mod deadline;
pub mod origin;
pub mod rate_limit;
pub mod request_id;
pub mod request_log;
pub mod request_metrics;
