//! The HTTP surface: shared state, the route table, and one module per resource.

pub mod account;
pub mod admin;
pub mod admin_reads;
pub mod backup;
pub mod catalog;
pub mod console;
pub mod events;
pub mod extract;
pub mod idempotent;
mod key_headers;
pub mod lists;
pub mod openapi;
pub mod ops;
pub mod orders;
pub mod providers;
pub mod refunds;
pub mod webhook_ops;

use actix_web::{web, HttpRequest, HttpResponse};

use crate::config::Settings;
use crate::domain::callback_url::AddressPolicy;
use crate::domain::idempotency_key::{IdempotencyKey, KeyError};
use crate::error::ApiError;
use extract::AdminAuth;

/// The storage port, as handlers receive it.
pub type StoreData = web::Data<dyn crate::store::Store>;

/// Whether callbackUrls may name private hosts (`--allow-private-callbacks`).
pub fn callback_policy(settings: &Settings) -> AddressPolicy {
    if settings.allow_private_callbacks {
        AddressPolicy::AllowPrivate
    } else {
        AddressPolicy::PublicOnly
    }
}

/// A 200 whose body is JSON bytes already rendered.
pub fn json_response(body: Vec<u8>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(body)
}

fn idempotency_key(req: &HttpRequest) -> Result<IdempotencyKey, KeyError> {
    let values =
        |name: &str| -> Vec<&[u8]> { req.headers().get_all(name).map(|v| v.as_bytes()).collect() };
    IdempotencyKey::from_headers(&values("X-Idempotency-Key"), &values("Idempotency-Key"))
}

fn invalid_key(reason: &'static str) -> ApiError {
    ApiError::InvalidKey { reason }
}

/// The idempotency key of a write that requires one (handler step 1).
pub fn required_idempotency_key(req: &HttpRequest) -> Result<IdempotencyKey, ApiError> {
    idempotency_key(req).map_err(|e| match e {
        KeyError::Missing => ApiError::KeyRequired,
        KeyError::Invalid(reason) => invalid_key(reason),
    })
}

/// The request's idempotency key when it names a well-formed one (read ahead with the API
/// key; the handler's own parse decides what a missing or malformed one is answered).
pub fn named_idempotency_key(req: &HttpRequest) -> Option<IdempotencyKey> {
    idempotency_key(req).ok()
}

/// The idempotency key of a write where it is optional: absent is `None`, malformed is 400.
pub fn optional_idempotency_key(req: &HttpRequest) -> Result<Option<IdempotencyKey>, ApiError> {
    match idempotency_key(req) {
        Ok(key) => Ok(Some(key)),
        Err(KeyError::Missing) => Ok(None),
        Err(KeyError::Invalid(reason)) => Err(invalid_key(reason)),
    }
}

/// Every route, each resource listing its methods so a wrong method is a 405, not a 404.
pub fn routes(cfg: &mut web::ServiceConfig) {
    let not_allowed = || web::to(method_not_allowed);
    cfg.service(
        web::resource("/b2b/orders")
            .route(web::post().to(orders::create_order))
            .route(web::get().to(orders::list_orders))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/b2b/orders/{id}")
            .route(web::get().to(orders::get_order))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/b2b/orders/{id}/cancel")
            .route(web::post().to(refunds::cancel_order))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/b2b/orders/{id}/refunds")
            .route(web::post().to(refunds::refund_order))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/b2b/events")
            .route(web::get().to(events::list_events))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/b2b/events/{event_id}/redeliver")
            .route(web::post().to(webhook_ops::partner_redeliver))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/webhooks/providers/{provider}")
            .route(web::post().to(providers::provider_notification))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/b2b/balance")
            .route(web::get().to(account::balance))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/b2b/transactions")
            .route(web::get().to(account::transactions))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/b2b/products")
            .route(web::get().to(catalog::products))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/admin/accounts")
            .route(web::post().to(admin::create_account))
            .route(web::get().to(admin_reads::list_accounts))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/admin/accounts/{id}")
            .route(web::get().to(admin::get_account))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/admin/accounts/{id}/orders")
            .route(web::get().to(admin_reads::account_orders))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/admin/accounts/{id}/transactions")
            .route(web::get().to(admin_reads::account_transactions))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/admin/accounts/{id}/events")
            .route(web::get().to(admin_reads::account_events))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/admin/accounts/{id}/api-keys")
            .route(web::post().to(admin::create_api_key))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/admin/accounts/{id}/credits")
            .route(web::post().to(admin::credit_account))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/admin/accounts/{id}/webhook-secret")
            .route(web::post().to(webhook_ops::rotate_webhook_secret))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/admin/accounts/{id}/deliveries/recover")
            .route(web::post().to(webhook_ops::recover_deliveries))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/admin/events/{event_id}/redeliver")
            .route(web::post().to(webhook_ops::admin_redeliver))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/admin/api-keys/{key_id}")
            .route(web::delete().to(admin::revoke_api_key))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/admin/backup")
            .route(web::get().to(backup::backup))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/admin/products/{product_id}")
            .route(web::put().to(admin::put_product))
            .default_service(not_allowed()),
    )
    .service(web::resource("/console").route(web::get().to(console::page)))
    .service(web::resource("/console/app.js").route(web::get().to(console::script)))
    .service(web::resource("/console/app.css").route(web::get().to(console::style)))
    .service(web::resource("/console/favicon.svg").route(web::get().to(console::icon)))
    .service(
        web::resource("/openapi.json")
            .route(web::get().to(openapi::openapi_json))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/healthz")
            .route(web::get().to(ops::healthz))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/metrics")
            .route(web::get().to(ops::metrics))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/readyz")
            .route(web::get().to(ops::readyz))
            .default_service(not_allowed()),
    )
    .default_service(web::to(|| async {
        Err::<actix_web::HttpResponse, _>(ApiError::RouteNotFound)
    }));
}

/// A path segment that cannot be decoded names nothing: 404 in the JSON envelope, not
/// actix's plain-text error.
pub fn path_config() -> web::PathConfig {
    web::PathConfig::default().error_handler(|_, _| ApiError::ResourceNotFound.into())
}

/// 405, except under `/admin` while the admin API is off, where every route is 404.
async fn method_not_allowed(
    req: HttpRequest,
    admin: web::Data<AdminAuth>,
) -> Result<actix_web::HttpResponse, ApiError> {
    if req.path().starts_with("/admin") && !admin.enabled() {
        return Err(ApiError::RouteNotFound);
    }
    Err(ApiError::MethodNotAllowed)
}
