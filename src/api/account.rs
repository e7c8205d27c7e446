//! `GET /b2b/balance` and `GET /b2b/transactions`: the partner's money and its ledger.

use std::sync::Arc;

use actix_web::{web, HttpRequest, HttpResponse};

use super::error::ApiError;
use super::extract::{BalanceRead, Partner};
use super::idempotent::json_response;
use super::lists::{list_body, ListQuery};
use super::openapi::{BalanceOne, TransactionList};
use super::AppState;
use crate::domain::ids::IdKind;
use crate::domain::order::BalanceView;
use crate::views::{to_json, BalanceJson, LedgerEntryJson};

#[utoipa::path(get, path = "/b2b/balance", tag = "account", responses((status = 200, description = "The balance now", body = BalanceOne)), security(("api_key" = [])))]
pub async fn balance(
    partner: Partner<BalanceRead>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let view = BalanceView {
        available: state.store.balance(&partner.account)?,
        credit_limit: partner.account.credit_limit,
        currency: state.settings.currency.clone(),
    };
    #[derive(serde::Serialize)]
    struct Body<'a> {
        success: bool,
        balance: BalanceJson<'a>,
    }
    Ok(json_response(to_json(&Body {
        success: true,
        balance: (&view).into(),
    })))
}

#[utoipa::path(
    get, path = "/b2b/transactions", tag = "account",
    params(("limit" = Option<u32>, Query, minimum = 1, maximum = 100, description = "Page size, 1 to 100 (default 50)"), ("cursor" = Option<String>, Query, description = "nextCursor of the previous page")),
    responses((status = 200, description = "The ledger, newest first; it sums to the balance", body = TransactionList)),
    security(("api_key" = []))
)]
pub async fn transactions(
    partner: Partner<BalanceRead>,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let query = ListQuery::parse(&req)?;
    let before = query.id_cursor(IdKind::Transaction)?;
    let store = Arc::clone(&state.store);
    let page =
        web::block(move || store.ledger_page(&partner.account, before, query.limit)).await??;
    let items: Vec<LedgerEntryJson> = page.items.iter().map(LedgerEntryJson::from).collect();
    Ok(json_response(list_body(
        "transactions",
        items,
        page.next_cursor,
    )))
}
