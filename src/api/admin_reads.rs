//! The operator's reads, which the console polls: every account, and an account's orders,
//! ledger and events, in the list shape of docs/architecture.md "Decisions where the contract was silent" and with the same items and order as their
//! `/b2b` twins. Each event adds its callback's state and every attempt.

use crate::bounds::Deadline;
use actix_web::{web, HttpRequest, HttpResponse};

use super::account::transactions_of;
use super::admin::account_id;
use super::events::events_after;
use super::extract::Admin;
use super::lists::{query_error, ListQuery};
use super::orders::orders_of;
use super::respond::{json_response, StoreData};
use crate::domain::event::{DeliveryLog, DeliveryState, Event};
use crate::domain::ids::{AccountId, Id, IdKind};
use crate::domain::limits::MAX_PAGE;
use crate::error::{ApiError, ErrorEnvelope, ValidationError};
use crate::store::{Page, Store};
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
pub(crate) async fn list_accounts(
    _admin: Admin,
    req: HttpRequest,
    store: StoreData,
    deadline: Deadline,
) -> Result<HttpResponse, ApiError> {
    let query = ListQuery::parse(&req)?;
    let after = query.typed_cursor(AccountId::parse)?;
    let page = store.accounts_page(deadline, after, query.limit).await?;
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
pub(crate) async fn account_orders(
    _admin: Admin,
    path: web::Path<String>,
    req: HttpRequest,
    store: StoreData,
    deadline: Deadline,
) -> Result<HttpResponse, ApiError> {
    let account = account_id(&**store, deadline, &path).await?;
    orders_of(&**store, deadline, account, &req).await
}

#[utoipa::path(
    get, path = "/admin/accounts/{id}/transactions", tag = "admin", summary = "List an account's ledger, newest first (or, with afterSeq, those after a seq, oldest first)",
    params(("id" = String, Path, description = "acc_…"), ("limit" = Option<u32>, Query, minimum = 1, maximum = 100, description = "Page size, 1 to 100 (default 50)"), ("cursor" = Option<String>, Query, description = "nextCursor of the previous page"), ("afterSeq" = Option<u64>, Query, minimum = 0, maximum = 9223372036854775807_i64, description = "Only the entries whose seq is greater, oldest first")),
    responses((status = 200, description = "As GET /b2b/transactions lists them", body = TransactionList), (status = 404, description = "account_not_found", body = ErrorEnvelope)),
    security(("admin_token" = []))
)]
pub(crate) async fn account_transactions(
    _admin: Admin,
    path: web::Path<String>,
    req: HttpRequest,
    store: StoreData,
    deadline: Deadline,
) -> Result<HttpResponse, ApiError> {
    let account = account_id(&**store, deadline, &path).await?;
    transactions_of(&**store, deadline, account, &req).await
}

#[utoipa::path(
    get, path = "/admin/accounts/{id}/events", tag = "admin", summary = "List an account's events and their callbacks",
    params(("id" = String, Path, description = "acc_…"), ("after" = Option<String>, Query, description = "Only events after this one (evt_…), exclusive"), ("limit" = Option<u32>, Query, minimum = 1, maximum = 100, description = "Page size, 1 to 100 (default 50)"), ("delivery" = Option<String>, Query, description = "Only events whose callback is in this state: none, pending, delivered, retrying or given_up. A page may then hold fewer than `limit` events and still have a nextCursor.")),
    responses((status = 200, description = "As GET /b2b/events lists them, each with its callback's state and attempts", body = AdminEventList), (status = 404, description = "account_not_found", body = ErrorEnvelope), (status = 422, description = "A bad limit, after or delivery", body = ValidationError)),
    security(("admin_token" = []))
)]
pub(crate) async fn account_events(
    _admin: Admin,
    path: web::Path<String>,
    req: HttpRequest,
    store: StoreData,
    deadline: Deadline,
) -> Result<HttpResponse, ApiError> {
    let account = account_id(&**store, deadline, &path).await?;
    let query = ListQuery::parse(&req)?;
    let after = events_after(&query)?;
    let wanted = match query.get("delivery").filter(|d| !d.is_empty()) {
        None => None,
        Some(text) => Some(DeliveryState::parse(text).ok_or_else(|| {
            query_error(
                "delivery",
                "delivery must be one of none, pending, delivered, retrying, given_up",
            )
        })?),
    };
    let page = match wanted {
        None => {
            let page = store
                .events_page(deadline, account, after, query.limit)
                .await?;
            let ids = page.items.iter().map(|e| e.id.clone()).collect();
            let logs = store.delivery_logs(deadline, account, ids).await?;
            Page {
                items: page.items.into_iter().zip(logs).collect(),
                next_cursor: page.next_cursor,
            }
        }
        Some(state) => {
            filtered_events(&**store, deadline, account, after, query.limit, state).await?
        }
    };
    Ok(json_response(to_json(&AdminEventList {
        success: true,
        events: page
            .items
            .iter()
            .map(|(event, log)| AdminEventJson::new(event, log.as_ref()))
            .collect(),
        next_cursor: page.next_cursor.as_deref(),
    })))
}

/// Pages of events read per request of a filtered list: the work of one request stays
/// bounded whatever the history, and the cursor says where the next one goes on.
const FILTER_SCAN_PAGES: usize = 10;

/// Up to `limit` events after `after` whose callback is in `state`, scanning at most
/// `FILTER_SCAN_PAGES` pages of `MAX_PAGE`. The cursor is the last event looked at, unless
/// the history ended.
async fn filtered_events(
    store: &dyn Store,
    deadline: Deadline,
    account: AccountId,
    mut after: Option<Id>,
    limit: usize,
    state: DeliveryState,
) -> Result<Page<(Event, Option<DeliveryLog>)>, ApiError> {
    let mut items = Vec::new();
    let mut last_seen: Option<String> = None;
    for _ in 0..FILTER_SCAN_PAGES {
        let page = store
            .events_page(deadline, account, after, MAX_PAGE)
            .await?;
        let ids = page.items.iter().map(|e| e.id.clone()).collect();
        let logs = store.delivery_logs(deadline, account, ids).await?;
        let count = page.items.len();
        for (i, (event, log)) in page.items.into_iter().zip(logs).enumerate() {
            last_seen = Some(event.id.clone());
            if DeliveryState::of(&event, log.as_ref()) != state {
                continue;
            }
            items.push((event, log));
            if items.len() == limit {
                let at_the_end = i + 1 == count && page.next_cursor.is_none();
                let next_cursor = if at_the_end { None } else { last_seen };
                return Ok(Page { items, next_cursor });
            }
        }
        let Some(next) = page.next_cursor else {
            return Ok(Page {
                items,
                next_cursor: None,
            });
        };
        after = Some(
            Id::parse(IdKind::Event, &next)
                .ok_or_else(|| ApiError::Internal("an events page gave a bad cursor".into()))?,
        );
    }
    Ok(Page {
        items,
        next_cursor: last_seen,
    })
}
