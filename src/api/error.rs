//! The one mapping from every failure of the HTTP surface to its status and envelope.
//! Internal causes are logged here and never reach a response body.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;
use serde_json::json;

use crate::store::StoreError;

/// One entry of the 422 `detail` list: `loc` is the JSON path, starting with `"body"`.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct FieldError {
    /// `"body"` (or `"query"`), then the JSON path: field names and list indexes.
    #[schema(value_type = Vec<LocPart>)]
    pub loc: Vec<serde_json::Value>,
    pub msg: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// One step of a `loc` path, as documented: a field name or a list index.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum LocPart {
    Field(String),
    Index(u64),
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
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        ApiError::Internal(e.to_string())
    }
}

impl From<actix_web::error::BlockingError> for ApiError {
    fn from(e: actix_web::error::BlockingError) -> Self {
        ApiError::Internal(e.to_string())
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::Unauthorized | ApiError::AdminUnauthorized | ApiError::BadSignature => {
                StatusCode::UNAUTHORIZED
            }
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::Validation(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::PaymentRequired(_) => StatusCode::PAYMENT_REQUIRED,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let body = match self {
            ApiError::Unauthorized => {
                json!({"error": "Unauthorized", "message": "Invalid or missing API key"})
            }
            ApiError::AdminUnauthorized => {
                json!({"error": "Unauthorized", "message": "Invalid or missing admin token"})
            }
            ApiError::BadSignature => {
                json!({"error": "Unauthorized", "message": "Invalid signature"})
            }
            ApiError::Forbidden(message) => json!({"error": "Forbidden", "message": message}),
            ApiError::Validation(detail) => json!({ "detail": detail }),
            ApiError::BadRequest(message)
            | ApiError::NotFound(message)
            | ApiError::Conflict(message) => {
                json!({"success": false, "error": message})
            }
            ApiError::PaymentRequired(message) => json!({"success": false, "error": message}),
            ApiError::MethodNotAllowed => {
                json!({"success": false, "error": "method_not_allowed: this route does not accept that method"})
            }
            ApiError::Internal(cause) => {
                log::error!("internal error: {cause}");
                json!({"success": false, "error": "Internal server error"})
            }
        };
        HttpResponse::build(self.status_code())
            .content_type("application/json")
            .body(body.to_string())
    }
}
