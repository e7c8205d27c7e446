//! What runs before any handler: the Origin check, the client address and the rate limiter.

pub mod cidr;
pub mod client_ip;
pub mod origin;
pub mod rate_limit;
pub mod request_metrics;
