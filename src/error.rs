//! The one error table of the HTTP surface: every refusal, from the Origin check and the
//! rate limiter at the edge to the handlers' 4xx and the opaque 500, is a variant carrying its
//! data, and this file alone decides its status, its token and its envelope. Internal causes
//! are logged here and never reach a response body.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;
use utoipa::ToSchema;

use crate::store::StoreError;

/// One entry of the 422 `detail` list: `loc` is the JSON path, starting with `"body"`.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct FieldError {
    /// `"body"` (or `"query"`), then the JSON path: field names and list indexes.
    #[schema(value_type = Vec<LocPart>)]
    pub loc: Vec<serde_json::Value>,
    pub msg: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// One step of a `loc` path, as documented: a field name or a list index.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub enum LocPart {
    Field(String),
    Index(u64),
}

/// `{"success":false,"error":"<token>: <sentence>"}`.
#[derive(Serialize, ToSchema)]
pub struct ErrorEnvelope<'a> {
    pub success: bool,
    pub error: &'a str,
}

/// `{"error":"Unauthorized"|"Forbidden","message":"..."}`: the auth envelope has no `success`.
#[derive(Serialize, ToSchema)]
pub struct AuthError<'a> {
    pub error: &'a str,
    pub message: &'a str,
}

/// The 422 validation envelope.
#[derive(Serialize, ToSchema)]
pub struct ValidationError<'a> {
    pub detail: &'a [FieldError],
}

/// The 429 body; `retryAfter` equals the `Retry-After` header.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RateLimited<'a> {
    pub success: bool,
    pub code: &'a str,
    pub error: &'a str,
    pub retry_after: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("invalid or missing API key")]
    Unauthorized,
    #[error("invalid or missing admin token")]
    AdminUnauthorized,
    #[error("invalid provider signature")]
    BadSignature,
    #[error("forbidden: {0}")]
    Forbidden(&'static str),
    /// A write whose `Origin` is not allowed (the edge, before the limiter).
    #[error("origin not allowed")]
    OriginNotAllowed,
    /// Over the per-minute limit; the limiter adds its `X-RateLimit-*` headers.
    #[error("rate limited for {retry_after} s")]
    RateLimited { retry_after: u64 },
    #[error("validation failed")]
    Validation(Vec<FieldError>),
    /// 400 with the partner-facing `token: sentence`.
    #[error("bad request: {0}")]
    BadRequest(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("conflict: {0}")]
    Conflict(String),
    #[error("payment required: {0}")]
    PaymentRequired(&'static str),
    #[error("method not allowed")]
    MethodNotAllowed,
    /// The storage does not answer (`/readyz`).
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    #[error("internal: {0}")]
    Internal(String),
}

impl ApiError {
    pub fn validation(
        loc: Vec<serde_json::Value>,
        msg: impl Into<String>,
        kind: &'static str,
    ) -> Self {
        ApiError::Validation(vec![FieldError {
            loc,
            msg: msg.into(),
            kind,
        }])
    }

    /// The `{"success":false,"error":...}` 409 of a key being used right now.
    pub fn in_progress() -> Self {
        ApiError::Conflict("Duplicate request in progress, retry later".into())
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        ApiError::Internal(e.to_string())
    }
}

fn json<T: Serialize>(status: StatusCode, body: &T) -> HttpResponse {
    HttpResponse::build(status)
        .content_type("application/json")
        .body(crate::views::to_json(body))
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::Unauthorized | ApiError::AdminUnauthorized | ApiError::BadSignature => {
                StatusCode::UNAUTHORIZED
            }
            ApiError::Forbidden(_) | ApiError::OriginNotAllowed => StatusCode::FORBIDDEN,
            ApiError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Validation(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::PaymentRequired(_) => StatusCode::PAYMENT_REQUIRED,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let status = self.status_code();
        let business = |error: &str| {
            json(
                status,
                &ErrorEnvelope {
                    success: false,
                    error,
                },
            )
        };
        let auth = |error: &str, message: &str| json(status, &AuthError { error, message });
        match self {
            ApiError::Unauthorized => auth("Unauthorized", "Invalid or missing API key"),
            ApiError::AdminUnauthorized => auth("Unauthorized", "Invalid or missing admin token"),
            ApiError::BadSignature => auth("Unauthorized", "Invalid signature"),
            ApiError::Forbidden(message) => auth("Forbidden", message),
            ApiError::OriginNotAllowed => business("Forbidden: Origin not allowed"),
            ApiError::RateLimited { retry_after } => {
                let mut response = json(
                    status,
                    &RateLimited {
                        success: false,
                        code: "RATE_LIMITED",
                        error: "Too many requests. Please try again later.",
                        retry_after: *retry_after,
                    },
                );
                response
                    .headers_mut()
                    .insert(actix_web::http::header::RETRY_AFTER, (*retry_after).into());
                response
            }
            ApiError::Validation(detail) => json(status, &ValidationError { detail }),
            ApiError::BadRequest(message)
            | ApiError::NotFound(message)
            | ApiError::Conflict(message) => business(message),
            ApiError::PaymentRequired(message) => business(message),
            ApiError::MethodNotAllowed => {
                business("method_not_allowed: this route does not accept that method")
            }
            ApiError::Unavailable(cause) => {
                log::error!("readiness probe failed: {cause}");
                business("storage_unavailable: the database does not answer")
            }
            ApiError::Internal(cause) => {
                log::error!("internal error: {cause}");
                business("Internal server error")
            }
        }
    }
}
