//! The operator's reads, which the console polls: every account, and an account's orders,
//! ledger and events, in the list shape of SPEC 16 and with the same items and order as their
//! `/b2b` twins. Each event adds its callback's state and every attempt.

use actix_web::{web, HttpRequest, HttpResponse};

use super::account::transactions_of;
use super::admin::account_id;
use super::events::events_of;
use super::extract::Admin;
use super::lists::ListQuery;
use super::orders::orders_of;
use super::{json_response, StoreData};
use crate::domain::ids::AccountId;
use crate::error::{ApiError, ErrorEnvelope};
use crate::views::{
    to_json, AccountList, AccountSummaryJson, AdminEventJson, AdminEventList, OrderList,
    TransactionList,
};

#[utoipa::path(
    get, path = "/admin/accounts", tag = "admin", summary = "List every account, oldest first",
    params(("limit" = Option<u32>, Query, minimum = 1, maximum = 100, description = "Page size, 1 to 100 (default 50)"), ("cursor" = Option<String>, Query, description = "nextCursor of the previous page")),
    responses((status = 200, description = "Accounts with their balances", body = AccountList)),
    security(("admin_token" = []))
)]
pub async fn list_accounts(
    _admin: Admin,
    req: HttpRequest,
    store: StoreData,
) -> Result<HttpResponse, ApiError> {
    let query = ListQuery::parse(&req)?;
    let after = query.typed_cursor(AccountId::parse)?;
    let page = store.accounts_page(after, query.limit).await?;
    Ok(json_response(to_json(&AccountList {
        success: true,
        accounts: page
            .items
            .iter()
            .map(|(a, balance)| AccountSummaryJson::new(a, *balance))
            .collect(),
        next_cursor: page.next_cursor.as_deref(),
    })))
}

#[utoipa::path(
    get, path = "/admin/accounts/{id}/orders", tag = "admin", summary = "List an account's orders, newest first",
    params(("id" = String, Path, description = "acc_…"), ("externalOrderId" = Option<String>, Query, description = "Only orders with this externalOrderId"), ("limit" = Option<u32>, Query, minimum = 1, maximum = 100, description = "Page size, 1 to 100 (default 50)"), ("cursor" = Option<String>, Query, description = "nextCursor of the previous page")),
    responses((status = 200, description = "As GET /b2b/orders lists them", body = OrderList), (status = 404, description = "account_not_found", body = ErrorEnvelope)),
    security(("admin_token" = []))
)]
pub async fn account_orders(
    _admin: Admin,
    path: web::Path<String>,
    req: HttpRequest,
    store: StoreData,
) -> Result<HttpResponse, ApiError> {
    let account = account_id(&**store, &path).await?;
    orders_of(&**store, account, &req).await
}

#[utoipa::path(
    get, path = "/admin/accounts/{id}/transactions", tag = "admin", summary = "List an account's ledger, newest first",
    params(("id" = String, Path, description = "acc_…"), ("limit" = Option<u32>, Query, minimum = 1, maximum = 100, description = "Page size, 1 to 100 (default 50)"), ("cursor" = Option<String>, Query, description = "nextCursor of the previous page")),
    responses((status = 200, description = "As GET /b2b/transactions lists them", body = TransactionList), (status = 404, description = "account_not_found", body = ErrorEnvelope)),
    security(("admin_token" = []))
)]
pub async fn account_transactions(
    _admin: Admin,
    path: web::Path<String>,
    req: HttpRequest,
    store: StoreData,
) -> Result<HttpResponse, ApiError> {
    let account = account_id(&**store, &path).await?;
    transactions_of(&**store, account, &req).await
}

#[utoipa::path(
    get, path = "/admin/accounts/{id}/events", tag = "admin", summary = "List an account's events and their callbacks",
    params(("id" = String, Path, description = "acc_…"), ("after" = Option<String>, Query, description = "Only events after this one (evt_…), exclusive"), ("limit" = Option<u32>, Query, minimum = 1, maximum = 100, description = "Page size, 1 to 100 (default 50)")),
    responses((status = 200, description = "As GET /b2b/events lists them, each with its callback's state and attempts", body = AdminEventList), (status = 404, description = "account_not_found", body = ErrorEnvelope)),
    security(("admin_token" = []))
)]
pub async fn account_events(
    _admin: Admin,
    path: web::Path<String>,
    req: HttpRequest,
    store: StoreData,
) -> Result<HttpResponse, ApiError> {
    let account = account_id(&**store, &path).await?;
    let page = events_of(&**store, account, &req).await?;
    let ids = page.items.iter().map(|e| e.id.clone()).collect();
    let logs = store.delivery_logs(account, ids).await?;
    Ok(json_response(to_json(&AdminEventList {
        success: true,
        events: page
            .items
            .iter()
            .zip(&logs)
            .map(|(event, log)| AdminEventJson::new(event, log.as_ref()))
            .collect(),
        next_cursor: page.next_cursor.as_deref(),
    })))
}
