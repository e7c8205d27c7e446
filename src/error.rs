//! The one error table of the HTTP surface: every refusal, from the Origin check and the
//! rate limiter at the edge to the handlers' 4xx and the opaque 500, is a variant carrying its
//! data, and this file alone decides its status, its token and its envelope. Internal causes
//! are logged here and never reach a response body.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;
use utoipa::ToSchema;

use crate::domain::basket::BasketRejection;
use crate::domain::callback_url::CallbackRefusal;
use crate::domain::limits::MAX_LINES;
use crate::domain::money::Cents;
use crate::domain::order::OrderStatus;
use crate::store::StoreError;

/// One entry of the 422 `detail` list: `loc` is the JSON path, starting with `"body"`.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub(crate) struct FieldError {
    /// `"body"` (or `"query"`), then the JSON path: field names and list indexes.
    #[schema(value_type = Vec<LocPart>)]
    pub(crate) loc: Vec<serde_json::Value>,
    pub(crate) msg: String,
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
}

/// One step of a `loc` path, as documented: a field name or a list index. It only describes
/// `loc` in `/openapi.json` (`FieldError` writes the path as JSON values), hence never built.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub(crate) enum LocPart {
    Field(String),
    Index(u64),
}

/// `{"success":false,"error":"<token>: <sentence>","code":"<CODE>"}`: `code` is the refusal's
/// machine code (`ApiError::code`), last so that the bytes partners match by prefix are as
/// they always were; the opaque 500 has none.
#[derive(Serialize, ToSchema)]
pub(crate) struct ErrorEnvelope<'a> {
    pub(crate) success: bool,
    pub(crate) error: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<ErrorCode>)]
    pub(crate) code: Option<&'a str>,
}

/// `{"error":"Unauthorized"|"Forbidden","message":"...","code":"<CODE>"}`: the auth envelope
/// has no `success`.
#[derive(Serialize, ToSchema)]
pub(crate) struct AuthError<'a> {
    pub(crate) error: &'a str,
    pub(crate) message: &'a str,
    #[schema(value_type = ErrorCode)]
    pub(crate) code: &'a str,
}

/// The 422 validation envelope.
#[derive(Serialize, ToSchema)]
pub(crate) struct ValidationError<'a> {
    pub(crate) detail: &'a [FieldError],
}

/// The 429 body; `retryAfter` equals the `Retry-After` header.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RateLimited<'a> {
    pub(crate) success: bool,
    #[schema(value_type = ErrorCode)]
    pub(crate) code: &'a str,
    pub(crate) error: &'a str,
    pub(crate) retry_after: u64,
}

/// Every refusal of the HTTP surface, named for what happened. Each variant's status, token
/// and sentence are decided below (`status_code`, `message`) and nowhere else; the wire
/// format is docs/api.md "Errors"'s, byte for byte.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ApiError {
    #[error("invalid or missing API key")]
    Unauthorized,
    #[error("invalid or missing admin token")]
    AdminUnauthorized,
    #[error("invalid provider signature")]
    BadSignature,
    /// The key's account is not enabled for wholesale orders.
    #[error("forbidden: not a wholesale account")]
    NotWholesale,
    /// The key's scopes do not cover the route.
    #[error("forbidden: scope missing")]
    ScopeMissing,
    /// A write whose `Origin` is not allowed (the edge, before the limiter).
    #[error("origin not allowed")]
    OriginNotAllowed,
    /// Over the per-minute limit; the limiter adds its `X-RateLimit-*` headers.
    #[error("rate limited for {retry_after} s")]
    RateLimited { retry_after: u64 },
    #[error("validation failed")]
    Validation(Vec<FieldError>),
    #[error("no such route")]
    RouteNotFound,
    /// A path parameter that cannot be one (actix's path extractor).
    #[error("no such resource")]
    ResourceNotFound,
    #[error("no order {id:?}")]
    OrderNotFound { id: String },
    #[error("no account {id:?}")]
    AccountNotFound { id: String },
    #[error("no API key {id:?}")]
    ApiKeyNotFound { id: String },
    #[error("no event {id:?}")]
    EventNotFound { id: String },
    #[error("no provider {name:?}")]
    UnknownProvider { name: String },
    #[error("no idempotency key")]
    KeyRequired,
    #[error("invalid idempotency key: {reason}")]
    InvalidKey { reason: &'static str },
    #[error("invalid callbackUrl: {reason}")]
    InvalidCallbackUrl { reason: CallbackRefusal },
    /// A basket rule (docs/api.md "POST /b2b/orders" step 4).
    #[error("basket refused: {0:?}")]
    Basket(BasketRejection),
    #[error("currency mismatch")]
    CurrencyMismatch { settles_in: String },
    /// The balance after this money in (or back) would not fit.
    #[error("balance too large after {0:?}")]
    BalanceTooLarge(MoneyIn),
    /// The key was used before for another request (`other_operation`: another kind).
    #[error("idempotency key reused")]
    KeyReused { other_operation: bool },
    /// The key's first use is still in flight past the wait (docs/api.md "POST /b2b/orders").
    #[error("duplicate request in progress")]
    InProgress,
    #[error("order not cancellable: {}", status.as_str())]
    NotCancellable { status: OrderStatus },
    #[error("order not refundable: {}", status.as_str())]
    NotRefundable { status: OrderStatus },
    #[error("refund exceeds the remaining {remaining}")]
    RefundExceedsRemaining { remaining: Cents },
    #[error("event {event:?} has no callback")]
    NoCallbackUrl { event: String },
    #[error("insufficient balance")]
    InsufficientBalance,
    #[error("exceeds credit limit")]
    ExceedsCreditLimit,
    /// A hot balance kept changing under every try (PostgreSQL); retry with the same key.
    #[error("concurrent balance modification")]
    ConcurrentModification,
    #[error("method not allowed")]
    MethodNotAllowed,
    /// The storage does not answer (`/readyz`).
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// The port failed; by its kind in the log, the opaque 500 on the wire (docs/contract.md "5. Failures").
    #[error("storage: {0}")]
    Storage(#[from] StoreError),
    /// An invariant of orderly's own that did not hold; the opaque 500.
    #[error("internal: {0}")]
    Internal(String),
}

/// Every machine code a refusal carries, one per distinct cause: what a program branches on
/// instead of the sentence (docs/api.md lists each with its status and meaning).
pub(crate) const ERROR_CODES: &[&str] = &[
    "INVALID_API_KEY",
    "INVALID_ADMIN_TOKEN",
    "INVALID_SIGNATURE",
    "NOT_WHOLESALE",
    "SCOPE_MISSING",
    "ORIGIN_NOT_ALLOWED",
    "ROUTE_NOT_FOUND",
    "RESOURCE_NOT_FOUND",
    "ORDER_NOT_FOUND",
    "ACCOUNT_NOT_FOUND",
    "API_KEY_NOT_FOUND",
    "EVENT_NOT_FOUND",
    "UNKNOWN_PROVIDER",
    "IDEMPOTENCY_KEY_REQUIRED",
    "INVALID_IDEMPOTENCY_KEY",
    "INVALID_CALLBACK_URL",
    "TOO_MANY_ITEMS",
    "UNKNOWN_PRODUCT",
    "REGION_NOT_ALLOWED",
    "ZERO_PRICE_ITEM",
    "INVALID_DELIVERY_DATA",
    "ORDER_TOTAL_TOO_LARGE",
    "CURRENCY_MISMATCH",
    "BALANCE_TOO_LARGE",
    "IDEMPOTENCY_KEY_REUSED",
    "REQUEST_IN_PROGRESS",
    "ORDER_NOT_CANCELLABLE",
    "ORDER_NOT_REFUNDABLE",
    "REFUND_EXCEEDS_REMAINING",
    "NO_CALLBACK_URL",
    "INSUFFICIENT_BALANCE",
    "EXCEEDS_CREDIT_LIMIT",
    "CONCURRENT_BALANCE_MODIFICATION",
    "METHOD_NOT_ALLOWED",
    "STORAGE_UNAVAILABLE",
    "STORAGE_TIMEOUT",
    "STORAGE_OVERLOADED",
    "RATE_LIMITED",
];

/// A refusal's machine code, for the OpenAPI document: a string enum of `ERROR_CODES`.
pub(crate) struct ErrorCode;

impl utoipa::PartialSchema for ErrorCode {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::schema::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .description(Some(
                "The refusal's machine code: branch on it, not on the sentence of `error`.",
            ))
            .enum_values(Some(ERROR_CODES.iter().copied()))
            .into()
    }
}

impl ToSchema for ErrorCode {}

/// Where money came in (or went back), for `BalanceTooLarge`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum MoneyIn {
    Credit,
    Payment,
    /// A cancel's return of the order's total.
    Cancel,
    /// A refund's return of its amount.
    Refund,
}

impl ApiError {
    pub(crate) fn validation(
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

    /// The machine code of a refusal (one of `ERROR_CODES`): `None` for the answers whose
    /// bodies stay as the seeds fix them (the 422, the 429, the opaque 500).
    pub(crate) fn code(&self) -> Option<&'static str> {
        Some(match self {
            ApiError::Unauthorized => "INVALID_API_KEY",
            ApiError::AdminUnauthorized => "INVALID_ADMIN_TOKEN",
            ApiError::BadSignature => "INVALID_SIGNATURE",
            ApiError::NotWholesale => "NOT_WHOLESALE",
            ApiError::ScopeMissing => "SCOPE_MISSING",
            ApiError::OriginNotAllowed => "ORIGIN_NOT_ALLOWED",
            ApiError::RouteNotFound => "ROUTE_NOT_FOUND",
            ApiError::ResourceNotFound => "RESOURCE_NOT_FOUND",
            ApiError::OrderNotFound { .. } => "ORDER_NOT_FOUND",
            ApiError::AccountNotFound { .. } => "ACCOUNT_NOT_FOUND",
            ApiError::ApiKeyNotFound { .. } => "API_KEY_NOT_FOUND",
            ApiError::EventNotFound { .. } => "EVENT_NOT_FOUND",
            ApiError::UnknownProvider { .. } => "UNKNOWN_PROVIDER",
            ApiError::KeyRequired => "IDEMPOTENCY_KEY_REQUIRED",
            ApiError::InvalidKey { .. } => "INVALID_IDEMPOTENCY_KEY",
            ApiError::InvalidCallbackUrl { .. } => "INVALID_CALLBACK_URL",
            ApiError::Basket(rejection) => match rejection {
                BasketRejection::TooManyItems => "TOO_MANY_ITEMS",
                BasketRejection::UnknownProduct(_) => "UNKNOWN_PRODUCT",
                BasketRejection::RegionNotAllowed(_) => "REGION_NOT_ALLOWED",
                BasketRejection::ZeroPriceItem(_) => "ZERO_PRICE_ITEM",
                BasketRejection::InvalidDeliveryData { .. } => "INVALID_DELIVERY_DATA",
                BasketRejection::TotalTooLarge => "ORDER_TOTAL_TOO_LARGE",
            },
            ApiError::CurrencyMismatch { .. } => "CURRENCY_MISMATCH",
            ApiError::BalanceTooLarge(_) => "BALANCE_TOO_LARGE",
            ApiError::KeyReused { .. } => "IDEMPOTENCY_KEY_REUSED",
            ApiError::InProgress => "REQUEST_IN_PROGRESS",
            ApiError::NotCancellable { .. } => "ORDER_NOT_CANCELLABLE",
            ApiError::NotRefundable { .. } => "ORDER_NOT_REFUNDABLE",
            ApiError::RefundExceedsRemaining { .. } => "REFUND_EXCEEDS_REMAINING",
            ApiError::NoCallbackUrl { .. } => "NO_CALLBACK_URL",
            ApiError::InsufficientBalance => "INSUFFICIENT_BALANCE",
            ApiError::ExceedsCreditLimit => "EXCEEDS_CREDIT_LIMIT",
            ApiError::ConcurrentModification => "CONCURRENT_BALANCE_MODIFICATION",
            ApiError::MethodNotAllowed => "METHOD_NOT_ALLOWED",
            ApiError::Unavailable(_) => "STORAGE_UNAVAILABLE",
            ApiError::Storage(StoreError::TimedOut(_)) => "STORAGE_TIMEOUT",
            ApiError::Storage(StoreError::Overloaded) => "STORAGE_OVERLOADED",
            ApiError::RateLimited { .. }
            | ApiError::Validation(_)
            | ApiError::Storage(_)
            | ApiError::Internal(_) => return None,
        })
    }

    /// The partner-facing `error` of every `{"success":false,"error":…}` answer: the token
    /// and its sentence. `None` for the answers with an envelope of their own.
    fn message(&self) -> Option<String> {
        let text = match self {
            ApiError::Unauthorized
            | ApiError::AdminUnauthorized
            | ApiError::BadSignature
            | ApiError::NotWholesale
            | ApiError::ScopeMissing
            | ApiError::RateLimited { .. }
            | ApiError::Validation(_) => return None,
            ApiError::OriginNotAllowed => "Forbidden: Origin not allowed".into(),
            ApiError::RouteNotFound => "not_found: no such route".into(),
            ApiError::ResourceNotFound => "not_found: no such resource".into(),
            ApiError::OrderNotFound { id } => {
                format!("order_not_found: no order {id:?} in this account")
            }
            ApiError::AccountNotFound { id } => format!("account_not_found: no account {id:?}"),
            ApiError::ApiKeyNotFound { id } => format!("api_key_not_found: no API key {id:?}"),
            ApiError::EventNotFound { id } => format!("event_not_found: no event {id:?}"),
            ApiError::UnknownProvider { name } => {
                format!("unknown_provider: no provider {name:?} is configured")
            }
            ApiError::KeyRequired => "X-Idempotency-Key header is required".into(),
            ApiError::InvalidKey { reason } => format!("invalid_idempotency_key: {reason}"),
            ApiError::InvalidCallbackUrl { reason } => format!("Invalid callbackUrl: {reason}"),
            ApiError::Basket(rejection) => basket_message(rejection),
            ApiError::CurrencyMismatch { settles_in } => {
                format!("currency_mismatch: this deployment settles in {settles_in}")
            }
            ApiError::BalanceTooLarge(MoneyIn::Credit) => {
                "balance_too_large: the balance after this credit does not fit".into()
            }
            ApiError::BalanceTooLarge(MoneyIn::Payment) => {
                "balance_too_large: the balance after this payment does not fit".into()
            }
            ApiError::BalanceTooLarge(MoneyIn::Cancel) => {
                "balance_too_large: the balance after this cancel does not fit".into()
            }
            ApiError::BalanceTooLarge(MoneyIn::Refund) => {
                "balance_too_large: the balance after this refund does not fit".into()
            }
            ApiError::KeyReused { other_operation } => {
                let detail = if *other_operation {
                    "this key was already used for another kind of request; use a new key for a new operation"
                } else {
                    "this key was already used with a different request body; use a new key for a new operation"
                };
                format!("idempotency_key_reused_with_different_body: {detail}")
            }
            ApiError::InProgress => "Duplicate request in progress, retry later".into(),
            ApiError::NotCancellable { status } => format!(
                "order_not_cancellable: the order is {}; only a processing order can be cancelled",
                status.as_str()
            ),
            ApiError::NotRefundable { status } => format!(
                "order_not_refundable: the order is {}; only a completed order can be refunded",
                status.as_str()
            ),
            ApiError::RefundExceedsRemaining { remaining } => format!(
                "refund_exceeds_remaining: at most {remaining} can still be refunded on this order"
            ),
            ApiError::NoCallbackUrl { event } => format!(
                "no_callback_url: the order of event {event:?} has no callbackUrl, so there is nothing to deliver"
            ),
            ApiError::InsufficientBalance => "Insufficient balance".into(),
            ApiError::ExceedsCreditLimit => "Exceeds credit limit".into(),
            ApiError::ConcurrentModification => "Concurrent balance modification".into(),
            ApiError::MethodNotAllowed => {
                "method_not_allowed: this route does not accept that method".into()
            }
            ApiError::Unavailable(_) => "storage_unavailable: the database does not answer".into(),
            ApiError::Storage(StoreError::TimedOut(_)) => {
                "storage_unavailable: the storage did not answer in time; nothing was changed, retry later".into()
            }
            ApiError::Storage(StoreError::Overloaded) => {
                "storage_unavailable: too many requests are waiting for the storage; nothing was changed, retry later".into()
            }
            ApiError::Storage(_) | ApiError::Internal(_) => "Internal server error".into(),
        };
        Some(text)
    }
}

/// The sentence of each basket rule (docs/api.md "POST /b2b/orders" step 4), its token first.
fn basket_message(rejection: &BasketRejection) -> String {
    match rejection {
        BasketRejection::TooManyItems => {
            format!("too_many_items: maximum {MAX_LINES} items per order")
        }
        BasketRejection::UnknownProduct(id) => {
            format!("unknown_product: product {id:?} does not exist or is not for sale")
        }
        BasketRejection::RegionNotAllowed(id) => {
            format!("region_not_allowed: product {id:?} is not sold in your account's region")
        }
        BasketRejection::ZeroPriceItem(id) => {
            format!("ZERO_PRICE_ITEM: product {id:?} has no price and cannot be ordered")
        }
        BasketRejection::InvalidDeliveryData { product_id, field } => format!(
            "invalid_delivery_data: product {product_id:?} requires a non-blank deliveryData.{field}"
        ),
        BasketRejection::TotalTooLarge => {
            "order_total_too_large: the order total does not fit in a balance".into()
        }
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
            ApiError::NotWholesale | ApiError::ScopeMissing | ApiError::OriginNotAllowed => {
                StatusCode::FORBIDDEN
            }
            ApiError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Validation(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::KeyRequired
            | ApiError::InvalidKey { .. }
            | ApiError::InvalidCallbackUrl { .. }
            | ApiError::Basket(_)
            | ApiError::CurrencyMismatch { .. }
            | ApiError::BalanceTooLarge(_) => StatusCode::BAD_REQUEST,
            ApiError::RouteNotFound
            | ApiError::ResourceNotFound
            | ApiError::OrderNotFound { .. }
            | ApiError::AccountNotFound { .. }
            | ApiError::ApiKeyNotFound { .. }
            | ApiError::EventNotFound { .. }
            | ApiError::UnknownProvider { .. } => StatusCode::NOT_FOUND,
            ApiError::KeyReused { .. }
            | ApiError::InProgress
            | ApiError::NotCancellable { .. }
            | ApiError::NotRefundable { .. }
            | ApiError::RefundExceedsRemaining { .. }
            | ApiError::NoCallbackUrl { .. } => StatusCode::CONFLICT,
            ApiError::InsufficientBalance
            | ApiError::ExceedsCreditLimit
            | ApiError::ConcurrentModification => StatusCode::PAYMENT_REQUIRED,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Unavailable(_)
            | ApiError::Storage(StoreError::TimedOut(_) | StoreError::Overloaded) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::Storage(_) | ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let status = self.status_code();
        let code = self.code();
        let auth = |error: &str, message: &str| {
            let code = code.expect("every auth refusal has a code");
            json(
                status,
                &AuthError {
                    error,
                    message,
                    code,
                },
            )
        };
        match self {
            ApiError::Unauthorized => auth("Unauthorized", "Invalid or missing API key"),
            ApiError::AdminUnauthorized => auth("Unauthorized", "Invalid or missing admin token"),
            ApiError::BadSignature => auth("Unauthorized", "Invalid signature"),
            ApiError::NotWholesale => {
                auth("Forbidden", "Account is not enabled for wholesale orders")
            }
            ApiError::ScopeMissing => {
                auth("Forbidden", "API key scope does not cover this endpoint")
            }
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
            other => {
                match other {
                    ApiError::Unavailable(cause) => log::error!("readiness probe failed: {cause}"),
                    // A storage that is slow or full is expected to pass: one line each.
                    ApiError::Storage(cause) if status == StatusCode::SERVICE_UNAVAILABLE => {
                        log::warn!("storage unavailable ({}): {cause}", kind(cause))
                    }
                    ApiError::Storage(cause) => {
                        log::error!("storage error ({}): {cause}", kind(cause))
                    }
                    ApiError::Internal(cause) => log::error!("internal error: {cause}"),
                    _ => {}
                }
                let error = other.message().expect("a business envelope");
                let mut response = json(
                    status,
                    &ErrorEnvelope {
                        success: false,
                        error: &error,
                        code,
                    },
                );
                if let ApiError::Storage(_) = other {
                    if status == StatusCode::SERVICE_UNAVAILABLE {
                        // Nothing was changed: the same request, key and all, may come back.
                        response.headers_mut().insert(
                            actix_web::http::header::RETRY_AFTER,
                            STORAGE_RETRY_AFTER_SECS.into(),
                        );
                    }
                }
                response
            }
        }
    }
}

/// The `Retry-After` of a 503 of the storage: a storage that did not answer in time or is
/// full is retried soon (a request refused at once costs nothing), and the key makes the
/// retry safe.
const STORAGE_RETRY_AFTER_SECS: u64 = 1;

/// The port's failure by what a caller could do about it, for the log line.
fn kind(e: &StoreError) -> &'static str {
    match e {
        StoreError::Unavailable(_) => "unavailable",
        StoreError::Conflict(_) => "conflict",
        StoreError::TimedOut(_) => "timed out",
        StoreError::Overloaded => "overloaded",
        StoreError::InDoubt(_) => "in doubt",
        StoreError::Failed(_) => "failed",
        StoreError::Corrupt(_) => "corrupt",
        StoreError::Refused(_) => "refused",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(e: ApiError) -> (u16, String) {
        let response = e.error_response();
        let status = response.status().as_u16();
        let body = actix_web::body::to_bytes(response.into_body());
        let Some(Ok(body)) = futures_util::FutureExt::now_or_never(body) else {
            panic!("the body is in memory");
        };
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    /// The business envelope, its code last (none for the opaque 500).
    fn envelope(error: &str, code: &str) -> String {
        let error = error.replace('"', "\\\"");
        if code.is_empty() {
            format!(r#"{{"success":false,"error":"{error}"}}"#)
        } else {
            format!(r#"{{"success":false,"error":"{error}","code":"{code}"}}"#)
        }
    }

    #[test]
    fn each_refusal_has_its_status_and_its_exact_envelope() {
        let id = "ord_x".to_string();
        let cases: Vec<(ApiError, u16, &str, &str)> = vec![
            (ApiError::RouteNotFound, 404, "not_found: no such route", "ROUTE_NOT_FOUND"),
            (ApiError::ResourceNotFound, 404, "not_found: no such resource", "RESOURCE_NOT_FOUND"),
            (ApiError::OrderNotFound { id: id.clone() }, 404, r#"order_not_found: no order "ord_x" in this account"#, "ORDER_NOT_FOUND"),
            (ApiError::AccountNotFound { id: "acc_x".into() }, 404, r#"account_not_found: no account "acc_x""#, "ACCOUNT_NOT_FOUND"),
            (ApiError::ApiKeyNotFound { id: "key_x".into() }, 404, r#"api_key_not_found: no API key "key_x""#, "API_KEY_NOT_FOUND"),
            (ApiError::EventNotFound { id: "evt_x".into() }, 404, r#"event_not_found: no event "evt_x""#, "EVENT_NOT_FOUND"),
            (ApiError::UnknownProvider { name: "acme".into() }, 404, r#"unknown_provider: no provider "acme" is configured"#, "UNKNOWN_PROVIDER"),
            (ApiError::KeyRequired, 400, "X-Idempotency-Key header is required", "IDEMPOTENCY_KEY_REQUIRED"),
            (ApiError::InvalidKey { reason: "too long" }, 400, "invalid_idempotency_key: too long", "INVALID_IDEMPOTENCY_KEY"),
            (ApiError::InvalidCallbackUrl { reason: CallbackRefusal::NoHost }, 400, "Invalid callbackUrl: the URL has no host", "INVALID_CALLBACK_URL"),
            (ApiError::Basket(BasketRejection::TooManyItems), 400, "too_many_items: maximum 200 items per order", "TOO_MANY_ITEMS"),
            (ApiError::Basket(BasketRejection::ZeroPriceItem("prd_f".into())), 400, r#"ZERO_PRICE_ITEM: product "prd_f" has no price and cannot be ordered"#, "ZERO_PRICE_ITEM"),
            (ApiError::CurrencyMismatch { settles_in: "USD".into() }, 400, "currency_mismatch: this deployment settles in USD", "CURRENCY_MISMATCH"),
            (ApiError::BalanceTooLarge(MoneyIn::Credit), 400, "balance_too_large: the balance after this credit does not fit", "BALANCE_TOO_LARGE"),
            (ApiError::BalanceTooLarge(MoneyIn::Payment), 400, "balance_too_large: the balance after this payment does not fit", "BALANCE_TOO_LARGE"),
            (ApiError::BalanceTooLarge(MoneyIn::Cancel), 400, "balance_too_large: the balance after this cancel does not fit", "BALANCE_TOO_LARGE"),
            (ApiError::BalanceTooLarge(MoneyIn::Refund), 400, "balance_too_large: the balance after this refund does not fit", "BALANCE_TOO_LARGE"),
            (ApiError::KeyReused { other_operation: false }, 409, "idempotency_key_reused_with_different_body: this key was already used with a different request body; use a new key for a new operation", "IDEMPOTENCY_KEY_REUSED"),
            (ApiError::KeyReused { other_operation: true }, 409, "idempotency_key_reused_with_different_body: this key was already used for another kind of request; use a new key for a new operation", "IDEMPOTENCY_KEY_REUSED"),
            (ApiError::InProgress, 409, "Duplicate request in progress, retry later", "REQUEST_IN_PROGRESS"),
            (ApiError::NotCancellable { status: OrderStatus::Completed }, 409, "order_not_cancellable: the order is completed; only a processing order can be cancelled", "ORDER_NOT_CANCELLABLE"),
            (ApiError::NotRefundable { status: OrderStatus::Processing }, 409, "order_not_refundable: the order is processing; only a completed order can be refunded", "ORDER_NOT_REFUNDABLE"),
            (ApiError::RefundExceedsRemaining { remaining: Cents(5) }, 409, "refund_exceeds_remaining: at most 5 can still be refunded on this order", "REFUND_EXCEEDS_REMAINING"),
            (ApiError::NoCallbackUrl { event: "evt_x".into() }, 409, r#"no_callback_url: the order of event "evt_x" has no callbackUrl, so there is nothing to deliver"#, "NO_CALLBACK_URL"),
            (ApiError::InsufficientBalance, 402, "Insufficient balance", "INSUFFICIENT_BALANCE"),
            (ApiError::ExceedsCreditLimit, 402, "Exceeds credit limit", "EXCEEDS_CREDIT_LIMIT"),
            (ApiError::ConcurrentModification, 402, "Concurrent balance modification", "CONCURRENT_BALANCE_MODIFICATION"),
            (ApiError::OriginNotAllowed, 403, "Forbidden: Origin not allowed", "ORIGIN_NOT_ALLOWED"),
            (ApiError::MethodNotAllowed, 405, "method_not_allowed: this route does not accept that method", "METHOD_NOT_ALLOWED"),
            (ApiError::Unavailable("down".into()), 503, "storage_unavailable: the database does not answer", "STORAGE_UNAVAILABLE"),
            (ApiError::Storage(StoreError::Corrupt("a secret detail".into())), 500, "Internal server error", ""),
            (ApiError::Storage(StoreError::InDoubt("a secret detail".into())), 500, "Internal server error", ""),
            (ApiError::Storage(StoreError::TimedOut("a secret detail".into())), 503, "storage_unavailable: the storage did not answer in time; nothing was changed, retry later", "STORAGE_TIMEOUT"),
            (ApiError::Storage(StoreError::Overloaded), 503, "storage_unavailable: too many requests are waiting for the storage; nothing was changed, retry later", "STORAGE_OVERLOADED"),
            (ApiError::Internal("a secret detail".into()), 500, "Internal server error", ""),
        ];
        for (error, status, text, code) in cases {
            let what = format!("{error:?}");
            assert_eq!(answer(error), (status, envelope(text, code)), "{what}");
            assert!(
                code.is_empty() || ERROR_CODES.contains(&code),
                "{code} is listed"
            );
        }
    }

    #[test]
    fn a_storage_that_did_not_answer_in_time_says_when_to_retry() {
        for error in [StoreError::TimedOut("slow".into()), StoreError::Overloaded] {
            let response = ApiError::Storage(error).error_response();
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(response.headers().get("Retry-After").unwrap(), "1");
        }
        let in_doubt = ApiError::Storage(StoreError::InDoubt("sent".into())).error_response();
        assert!(in_doubt.headers().get("Retry-After").is_none());
    }

    #[test]
    fn a_wait_that_failed_after_its_write_committed_never_says_nothing_was_changed() {
        let after_commit = [
            StoreError::TimedOut("no connection".into()),
            StoreError::Overloaded,
            StoreError::Unavailable("down".into()),
            StoreError::Conflict("lost".into()),
            StoreError::Refused("no".into()),
        ];
        for error in after_commit {
            let (status, body) = answer(ApiError::Storage(error.after_commit()));
            assert_eq!(status, 500);
            assert_eq!(body, r#"{"success":false,"error":"Internal server error"}"#);
        }
    }

    /// docs/api.md's table of codes ("| 409 | `CODE` | ...") names every code of the list, and
    /// no other: the document and the enum in /openapi.json cannot drift apart.
    #[test]
    fn the_codes_table_of_the_api_docs_lists_exactly_these_codes() {
        let docs = include_str!("../docs/api.md");
        let mut tabled: Vec<&str> = docs
            .lines()
            .filter_map(|line| {
                let mut cells = line.split('|').map(str::trim).skip(1);
                let status = cells.next()?;
                let code = cells.next()?.strip_prefix('`')?.strip_suffix('`')?;
                (status.len() == 3 && status.bytes().all(|b| b.is_ascii_digit())).then_some(code)
            })
            .collect();
        tabled.sort_unstable();
        tabled.dedup();
        let mut listed = ERROR_CODES.to_vec();
        listed.sort_unstable();
        assert_eq!(tabled, listed);
    }

    #[test]
    fn no_code_is_listed_twice_and_each_is_upper_snake_case() {
        let (mut seen, mut listed) = (ERROR_CODES.to_vec(), ERROR_CODES.to_vec());
        seen.dedup();
        listed.sort_unstable();
        listed.dedup();
        assert_eq!(seen.len(), listed.len(), "no code is listed twice");
        assert!(ERROR_CODES
            .iter()
            .all(|c| c.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')));
    }

    #[test]
    fn the_auth_refusals_have_the_auth_envelope() {
        assert_eq!(
            answer(ApiError::NotWholesale),
            (
                403,
                r#"{"error":"Forbidden","message":"Account is not enabled for wholesale orders","code":"NOT_WHOLESALE"}"#
                    .into()
            )
        );
        assert_eq!(
            answer(ApiError::ScopeMissing),
            (
                403,
                r#"{"error":"Forbidden","message":"API key scope does not cover this endpoint","code":"SCOPE_MISSING"}"#
                    .into()
            )
        );
    }
}
