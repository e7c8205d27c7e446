//! The CSRF guard: a write (POST, PUT, PATCH, DELETE) carrying an `Origin` that is not on
//! `--allowed-origins` is refused before the rate limiter, so it spends no budget and carries
//! no rate-limit headers. Requests without `Origin` (server-to-server calls) pass, and so does
//! the server's own origin (`http://` or `https://` and the request's `Host`): the console's
//! writes come from there.

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::Method;
use actix_web::middleware::Next;
use actix_web::{web, ResponseError};

use crate::config::Settings;
use crate::error::ApiError;
use crate::header_names as names;

pub(crate) fn is_write(method: &Method) -> bool {
    matches!(
        *method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    )
}

/// Exact string comparison; the literal `null` origin is never allowed.
pub(crate) fn origin_allowed(origin: &[u8], allowed: &[String]) -> bool {
    origin != b"null" && allowed.iter().any(|a| a.as_bytes() == origin)
}

/// `http://<Host>` or `https://<Host>`: a page this server served.
pub(crate) fn is_own_origin(origin: &[u8], host: Option<&[u8]>) -> bool {
    let Some(host) = host.filter(|h| !h.is_empty()) else {
        return false;
    };
    [&b"http://"[..], b"https://"]
        .iter()
        .any(|scheme| origin.strip_prefix(*scheme) == Some(host))
}

pub(crate) async fn check_origin(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    if is_write(req.method()) {
        if let Some(origin) = req.headers().get(names::ORIGIN) {
            let host = req.headers().get(names::HOST).map(|h| h.as_bytes());
            let allowed = is_own_origin(origin.as_bytes(), host)
                || req
                    .app_data::<web::Data<Settings>>()
                    .is_some_and(|s| origin_allowed(origin.as_bytes(), &s.allowed_origins));
            if !allowed {
                return Ok(req.into_response(ApiError::OriginNotAllowed.error_response()));
            }
        }
    }
    Ok(next.call(req).await?.map_into_boxed_body())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_exact_listed_origins_pass() {
        let allowed = vec!["https://shop.example".to_string()];
        assert!(origin_allowed(b"https://shop.example", &allowed));
        assert!(!origin_allowed(b"https://shop.example/", &allowed));
        assert!(!origin_allowed(b"https://evil.example", &allowed));
        assert!(!origin_allowed(b"null", &["null".to_string()]));
    }

    #[test]
    fn the_servers_own_origin_passes_and_nothing_like_it() {
        let host = Some(&b"127.0.0.1:8080"[..]);
        assert!(is_own_origin(b"http://127.0.0.1:8080", host));
        assert!(is_own_origin(b"https://127.0.0.1:8080", host));
        assert!(!is_own_origin(b"http://127.0.0.1:8081", host));
        assert!(!is_own_origin(b"http://127.0.0.1:8080.evil", host));
        assert!(!is_own_origin(b"ftp://127.0.0.1:8080", host));
        assert!(!is_own_origin(b"http://", Some(b"")));
        assert!(!is_own_origin(b"null", host));
    }
}
