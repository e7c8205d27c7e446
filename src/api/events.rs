//! `GET /b2b/events?after=&limit=`: every event emitted for the account, oldest first, for
//! catching up on callbacks that were missed.

use crate::bounds::Deadline;
use actix_web::{HttpRequest, HttpResponse};

use super::extract::{OrdersRead, Partner};
use super::lists::{query_error, ListQuery};
use super::respond::{json_response, StoreData};
use crate::domain::event::Event;
use crate::domain::ids::{AccountId, Id, IdKind};
use crate::error::ApiError;
use crate::store::{Page, Store};
use crate::views::{to_json, EventJson, EventList};

#[utoipa::path(
    get, path = "/b2b/events", tag = "account", summary = "List webhook events, oldest first",
    params(("after" = Option<String>, Query, description = "Only events after this one (evt_…), exclusive"), ("limit" = Option<u32>, Query, minimum = 1, maximum = 100, description = "Page size, 1 to 100 (default 50)")),
    responses((status = 200, description = "Every event of the account, oldest first", body = EventList)),
    security(("api_key" = []))
)]
pub(crate) async fn list_events(
    partner: Partner<OrdersRead>,
    req: HttpRequest,
    store: StoreData,
    deadline: Deadline,
) -> Result<HttpResponse, ApiError> {
    let page = events_of(&**store, deadline, partner.account.id, &req).await?;
    Ok(json_response(to_json(&EventList {
        success: true,
        events: page.items.iter().map(EventJson::from).collect(),
        next_cursor: page.next_cursor.as_deref(),
    })))
}

/// A page of an account's events as `GET /b2b/events` selects it (`after`, `limit`).
pub(super) async fn events_of(
    store: &dyn Store,
    deadline: Deadline,
    account: AccountId,
    req: &HttpRequest,
) -> Result<Page<Event>, ApiError> {
    let query = ListQuery::parse(req)?;
    let after = events_after(&query)?;
    Ok(store
        .events_page(deadline, account, after, query.limit)
        .await?)
}

/// Where a list of events starts: `after=` (an event id, exclusive), else the `cursor`.
pub(super) fn events_after(query: &ListQuery) -> Result<Option<Id>, ApiError> {
    match query.get("after").filter(|a| !a.is_empty()) {
        Some(text) => Ok(Some(Id::parse(IdKind::Event, text).ok_or_else(|| {
            query_error("after", "after must be an event id (evt_…)")
        })?)),
        None => query.id_cursor(IdKind::Event),
    }
}
