//! `GET /b2b/balance` and `GET /b2b/transactions`: the partner's money and its ledger.

use crate::bounds::Deadline;
use actix_web::{web, HttpRequest, HttpResponse};

use super::extract::{BalanceRead, Partner};
use super::lists::{query_error, ListQuery};
use super::respond::{json_response, StoreData};
use crate::config::Settings;
use crate::domain::ids::{AccountId, IdKind};
use crate::domain::order::BalanceView;
use crate::error::ApiError;
use crate::store::Store;
use crate::views::{
    to_json, BalanceJson, BalanceNow, LedgerEntryJson, LedgerHeadJson, TransactionList,
};

#[utoipa::path(get, path = "/b2b/balance", tag = "account", summary = "Read the balance", responses((status = 200, description = "The balance now, and the head of the ledger that sums to it", body = BalanceNow)), security(("api_key" = [])))]
pub(crate) async fn balance(
    partner: Partner<BalanceRead>,
    store: StoreData,
    deadline: Deadline,
    settings: web::Data<Settings>,
) -> Result<HttpResponse, ApiError> {
    let funds = store.balance(deadline, partner.account.id).await?;
    let view = BalanceView {
        available: funds.available,
        credit_limit: partner.account.credit_limit,
        currency: settings.currency.clone(),
    };
    Ok(json_response(to_json(&BalanceNow {
        success: true,
        balance: BalanceJson::from(&view),
        ledger_head: LedgerHeadJson::from(&funds.head),
    })))
}

#[utoipa::path(
    get, path = "/b2b/transactions", tag = "account", summary = "List ledger entries, newest first (or, with afterSeq, those after a seq, oldest first)",
    params(("limit" = Option<u32>, Query, minimum = 1, maximum = 100, description = "Page size, 1 to 100 (default 50)"), ("cursor" = Option<String>, Query, description = "nextCursor of the previous page"), ("afterSeq" = Option<u64>, Query, minimum = 0, maximum = 9223372036854775807_i64, description = "Only the entries whose seq is greater, oldest first, at most limit of them (nextCursor is then null: ask again with the last seq)")),
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
    if let Some(after) = after_seq(&query)? {
        let entries = store
            .ledger_after(deadline, account, after, query.limit)
            .await?;
        return Ok(json_response(to_json(&TransactionList {
            success: true,
            transactions: entries.iter().map(LedgerEntryJson::from).collect(),
            next_cursor: None,
        })));
    }
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

/// `afterSeq`: a whole number from 0 (what a partner holding the head of seq N asks with),
/// never beside `cursor`, which pages the other way.
fn after_seq(query: &ListQuery) -> Result<Option<u64>, ApiError> {
    let Some(text) = query.get("afterSeq") else {
        return Ok(None);
    };
    let after = Some(text)
        .filter(|t| !t.is_empty() && t.len() <= 19 && t.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|t| t.parse::<u64>().ok())
        .filter(|n| i64::try_from(*n).is_ok())
        .ok_or_else(|| query_error("afterSeq", "afterSeq must be a whole number from 0"))?;
    if query.cursor.is_some() {
        return Err(query_error(
            "cursor",
            "cursor pages newest first and afterSeq oldest first: give one of them",
        ));
    }
    Ok(Some(after))
}
