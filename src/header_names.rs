//! The header names the request path looks up, each parsed once.
//!
//! A lookup by `&str` parses the name on every call (lowercasing it into a buffer and
//! matching it against the standard names): about ten of them a request, 2.4 % of a worker's
//! time on replays. A `HeaderName` constant is looked up as it is.

use actix_web::http::header::HeaderName;

pub(crate) use actix_web::http::header::{AUTHORIZATION, CONTENT_TYPE, HOST, ORIGIN};

pub(crate) const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");
pub(crate) const X_IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("x-idempotency-key");
pub(crate) const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
pub(crate) const IDEMPOTENCY_REPLAYED: HeaderName = HeaderName::from_static("idempotency-replayed");
pub(crate) const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub(crate) const X_SIGNATURE: HeaderName = HeaderName::from_static("x-signature");
pub(crate) const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
pub(crate) const X_RATELIMIT_REMAINING: HeaderName =
    HeaderName::from_static("x-ratelimit-remaining");
pub(crate) const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
