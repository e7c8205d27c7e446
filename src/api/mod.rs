//! The HTTP surface: the route table, and one module per resource. What handlers share is
//! in modules of their own (`extract`: who calls and what they sent; `respond`: the port as
//! handlers hold it and the 200 they answer), so no handler imports from here.

pub(crate) mod account;
pub(crate) mod admin;
pub(crate) mod admin_reads;
pub(crate) mod backup;
pub(crate) mod catalog;
pub(crate) mod console;
pub(crate) mod events;
pub(crate) mod extract;
pub(crate) mod idempotent;
mod key_headers;
pub(crate) mod lists;
pub(crate) mod openapi;
pub(crate) mod ops;
pub(crate) mod orders;
pub(crate) mod providers;
pub(crate) mod refunds;
pub(crate) mod respond;
pub(crate) mod webhook_ops;
mod webhooks_doc;

use actix_web::{web, HttpRequest};

use crate::credentials::Credentials;
use crate::error::ApiError;

/// Every route, each resource listing its methods so a wrong method is a 405, not a 404.
pub(crate) fn routes(cfg: &mut web::ServiceConfig) {
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
    .service(
        web::resource("/console")
            .route(web::get().to(console::page))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/console/app.js")
            .route(web::get().to(console::script))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/console/app.css")
            .route(web::get().to(console::style))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/console/favicon.svg")
            .route(web::get().to(console::icon))
            .default_service(not_allowed()),
    )
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
pub(crate) fn path_config() -> web::PathConfig {
    web::PathConfig::default().error_handler(|_, _| ApiError::ResourceNotFound.into())
}

/// 405, except under `/admin` and `/console` while the admin API is off, where every route
/// is 404 (as their pages are).
async fn method_not_allowed(
    req: HttpRequest,
    admin: web::Data<Credentials>,
) -> Result<actix_web::HttpResponse, ApiError> {
    let admin_only = req.path().starts_with("/admin") || req.path().starts_with("/console");
    if admin_only && !admin.admin_enabled() {
        return Err(ApiError::RouteNotFound);
    }
    Err(ApiError::MethodNotAllowed)
}
