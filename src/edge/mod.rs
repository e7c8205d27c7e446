//! What runs around every handler: the request's deadline, the Origin check, the client
//! address, the rate limiter, the request counters, every answer's `Request-Id` and the
//! request log; which listener answers `/metrics`.

pub(crate) mod client_ip;
pub(crate) mod deadline;
pub(crate) mod metrics_listener;
pub(crate) mod origin;
pub(crate) mod rate_limit;
pub(crate) mod request_id;
pub(crate) mod request_log;
pub(crate) mod request_metrics;
