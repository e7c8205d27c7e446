//! `GET /b2b/events?after=&limit=`: every event emitted for the account, oldest first, for
//! catching up on callbacks that were missed.

use std::sync::Arc;

use actix_web::{web, HttpRequest, HttpResponse};

use super::error::ApiError;
use super::extract::{OrdersRead, Partner};
use super::idempotent::json_response;
use super::lists::{list_body, query_error, ListQuery};
use super::openapi::EventList;
use super::AppState;
use crate::domain::ids::{Id, IdKind};
use crate::views::EventJson;

#[utoipa::path(
    get, path = "/b2b/events", tag = "account",
    params(("after" = Option<String>, Query, description = "Only events after this one (evt_…), exclusive"), ("limit" = Option<u32>, Query, minimum = 1, maximum = 100, description = "Page size, 1 to 100 (default 50)")),
    responses((status = 200, description = "Every event of the account, oldest first", body = EventList)),
    security(("api_key" = []))
)]
pub async fn list_events(
    partner: Partner<OrdersRead>,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let query = ListQuery::parse(&req)?;
    let after = match query.get("after").filter(|a| !a.is_empty()) {
        Some(text) => Some(
            Id::parse(IdKind::Event, text)
                .ok_or_else(|| query_error("after", "after must be an event id (evt_…)"))?,
        ),
        None => query.id_cursor(IdKind::Event)?,
    };
    let store = Arc::clone(&state.store);
    let account_id = partner.account.id.clone();
    let page = web::block(move || store.events_page(&account_id, after, query.limit)).await??;
    let items: Vec<EventJson> = page.items.iter().map(EventJson::from).collect();
    Ok(json_response(list_body("events", items, page.next_cursor)))
}
