//! `GET /b2b/balance` and `GET /b2b/transactions`: the partner's money and its ledger.

use crate::bounds::Deadline;
use actix_web::{web, HttpRequest, HttpResponse};

use super::extract::{BalanceRead, Partner};
use super::lists::ListQuery;
use super::respond::{json_response, StoreData};
use crate::config::Settings;
use crate::domain::ids::{AccountId, IdKind};
use crate::domain::order::BalanceView;
use crate::error::ApiError;
use crate::store::Store;
use crate::views::{to_json, BalanceJson, BalanceOne, LedgerEntryJson, TransactionList};

#[utoipa::path(get, path = "/b2b/balance", tag = "account", summary = "Read the balance", responses((status = 200, description = "The balance now", body = BalanceOne)), security(("api_key" = [])))]
pub(crate) async fn balance(
    partner: Partner<BalanceRead>,
    store: StoreData,
    deadline: Deadline,
    settings: web::Data<Settings>,
) -> Result<HttpResponse, ApiError> {
    let view = BalanceView {
        available: store.balance(deadline, partner.account.id).await?,
        credit_limit: partner.account.credit_limit,
        currency: settings.currency.clone(),
    };
    Ok(json_response(to_json(&BalanceOne {
        success: true,
        balance: BalanceJson::from(&view),
    })))
}

#[utoipa::path(
    get, path = "/b2b/transactions", tag = "account", summary = "List ledger entries, newest first",
    params(("limit" = Option<u32>, Query, minimum = 1, maximum = 100, description = "Page size, 1 to 100 (default 50)"), ("cursor" = Option<String>, Query, description = "nextCursor of the previous page")),
    responses((status = 200, description = "The ledger, newest first; it sums to the balance", body = TransactionList)),
    security(("api_key" = []))
)]
pub(crate) async fn transactions(
    partner: Partner<BalanceRead>,
    req: HttpRequest,
    store: StoreData,
    deadline: Deadline,
) -> Result<HttpResponse, ApiError> {
    transactions_of(&**store, deadline, partner.account.id, &req).await
}

/// An account's ledger as `GET /b2b/transactions` lists it (the admin twin lists the same).
pub(super) async fn transactions_of(
    store: &dyn Store,
    deadline: Deadline,
    account: AccountId,
    req: &HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let query = ListQuery::parse(req)?;
    let before = query.id_cursor(IdKind::Transaction)?;
    let page = store
        .ledger_page(deadline, account, before, query.limit)
        .await?;
    Ok(json_response(to_json(&TransactionList {
        success: true,
        transactions: page.items.iter().map(LedgerEntryJson::from).collect(),
        next_cursor: page.next_cursor.as_deref(),
    })))
}
