//! `POST /b2b/orders` (the idempotent order), `GET /b2b/orders/{id}` and `GET /b2b/orders`.

use std::collections::BTreeMap;
use std::sync::Arc;

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;

use super::error::ApiError;
use super::extract::{json_body, OrdersRead, OrdersWrite, Partner, Violations};
use super::idempotent::{json_response, run_once, FirstUse, KeyedWrite};
use super::lists::{list_body, query_error, ListQuery};
use super::openapi::{ErrorEnvelope, OrderList, OrderOne, OrderPlaced};
use super::{required_idempotency_key, AppState};
use crate::domain::account::{Account, Shortfall};
use crate::domain::basket::RequestedLine;
use crate::domain::callback_url::CallbackUrl;
use crate::domain::fingerprint::{Fingerprint, LineRef, Operation};
use crate::domain::idempotency_key::IdempotencyKey;
use crate::domain::ids::{Id, IdKind};
use crate::domain::order::Order;
use crate::domain::product::MAX_PRODUCT_ID_LEN;
use crate::domain::time::{expiry_after, now_millis};
use crate::loc;
use crate::store::accounts::account_bytes;
use crate::store::idempotency::KeyClaim;
use crate::store::orders::{NewOrder, OrderRefusal};
use crate::views::{order_only, order_placed, OrderJson};

pub const MAX_QUANTITY: i64 = 1_000_000;
pub const MAX_CALLBACK_URL_LEN: usize = 2048;
pub const MAX_EXTERNAL_ORDER_ID_LEN: usize = 128;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreateOrderBody {
    /// 1 or more lines (more than 200 is the business refusal `too_many_items`).
    #[schema(min_items = 1)]
    items: Vec<ItemBody>,
    /// Where order events are POSTed; http(s) to a public host.
    #[schema(max_length = 2048)]
    callback_url: Option<String>,
    #[schema(max_length = 128)]
    external_order_id: Option<String>,
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct ItemBody {
    #[schema(min_length = 1, max_length = 64)]
    product_id: String,
    #[schema(minimum = 1, maximum = 1000000)]
    quantity: i64,
    #[serde(default)]
    delivery_data: Option<BTreeMap<String, String>>,
}

impl CreateOrderBody {
    /// The schema rules serde cannot express: counts, lengths and ranges.
    fn check_schema(&self) -> Result<(), ApiError> {
        let mut v = Violations::default();
        v.check(
            !self.items.is_empty(),
            || loc!("items"),
            "List should have at least 1 item",
            "too_short",
        );
        for (i, item) in self.items.iter().enumerate() {
            v.check(
                !item.product_id.is_empty()
                    && item.product_id.chars().count() <= MAX_PRODUCT_ID_LEN,
                || loc!("items", i, "productId"),
                "productId must be a non-empty string of at most 64 characters",
                "string_length",
            );
            v.check(
                (1..=MAX_QUANTITY).contains(&item.quantity),
                || loc!("items", i, "quantity"),
                "quantity must be a whole number from 1 to 1000000",
                "range",
            );
        }
        v.check(
            self.callback_url
                .as_ref()
                .is_none_or(|u| u.chars().count() <= MAX_CALLBACK_URL_LEN),
            || loc!("callbackUrl"),
            "callbackUrl must be at most 2048 characters",
            "string_length",
        );
        v.check(
            self.external_order_id
                .as_ref()
                .is_none_or(|e| e.chars().count() <= MAX_EXTERNAL_ORDER_ID_LEN),
            || loc!("externalOrderId"),
            "externalOrderId must be at most 128 characters",
            "string_length",
        );
        v.into_result()
    }

    fn requested_lines(self) -> Vec<RequestedLine> {
        self.items
            .into_iter()
            .map(|item| RequestedLine {
                product_id: item.product_id,
                quantity: item.quantity as u64,
                delivery_data: item.delivery_data.unwrap_or_default(),
            })
            .collect()
    }
}

#[utoipa::path(
    post, path = "/b2b/orders", tag = "orders",
    request_body = CreateOrderBody,
    params(("X-Idempotency-Key" = String, Header, description = "1 to 255 visible ASCII characters; one key per business intent"), ("Idempotency-Key" = Option<String>, Header, description = "The IETF spelling; accepted as the same key")),
    responses(
        (status = 200, description = "The order, durable; a replay returns the first answer byte for byte", body = OrderPlaced, headers(("Idempotency-Replayed" = String, description = "\"true\" when this is the stored answer of an earlier request with the same key"))),
        (status = 400, description = "Missing/invalid idempotency key, invalid callbackUrl, or a business rule (token prefix)", body = ErrorEnvelope),
        (status = 402, description = "Insufficient balance / Exceeds credit limit / Concurrent balance modification", body = ErrorEnvelope),
        (status = 409, description = "The key was used with a different basket, or is in progress", body = ErrorEnvelope),
    ),
    security(("api_key" = []))
)]
/// The checks run in the order the contract fixes: key (auth), body (422), idempotency key
/// (400), callbackUrl (400), key lookup (replay / 409), business rules (400), payment (402).
pub async fn create_order(
    partner: Partner<OrdersWrite>,
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let body: CreateOrderBody = json_body(&req, payload).await?;
    body.check_schema()?;
    let key = required_idempotency_key(&req)?;
    if let Some(url) = &body.callback_url {
        CallbackUrl::parse(url, state.callback_policy())
            .map_err(|reason| ApiError::BadRequest(format!("Invalid callbackUrl: {reason}")))?;
    }
    let callback_url = body.callback_url.clone();
    let external_order_id = body.external_order_id.clone();
    let lines = body.requested_lines();
    let fingerprint = Fingerprint::of_basket(lines.iter().map(|l| LineRef {
        product_id: &l.product_id,
        quantity: l.quantity,
        delivery_data: &l.delivery_data,
    }));
    let write = KeyedWrite {
        account: account_bytes(&partner.account.id)?,
        key: &key,
        operation: Operation::PlaceOrder,
        fingerprint,
    };
    let order = OrderRequest {
        account: partner.account,
        key: key.clone(),
        fingerprint,
        lines,
        callback_url,
        external_order_id,
    };
    run_once(&state, write, || place(state.clone(), order)).await
}

struct OrderRequest {
    account: Account,
    key: IdempotencyKey,
    fingerprint: Fingerprint,
    lines: Vec<RequestedLine>,
    callback_url: Option<String>,
    external_order_id: Option<String>,
}

/// The first use of the key: one transaction on the writer thread, answered once on disk.
async fn place(state: web::Data<AppState>, request: OrderRequest) -> Result<FirstUse, ApiError> {
    let store = Arc::clone(&state.store);
    let currency = state.settings.currency.clone();
    let ttl = state.settings.idempotency_ttl;
    let outcome = state
        .committer
        .write(move || {
            let now = now_millis();
            let new = NewOrder {
                account: &request.account,
                order_id: Id::new(IdKind::Order),
                txn_id: Id::new(IdKind::Transaction),
                lines: &request.lines,
                currency: &currency,
                callback_url: request.callback_url.clone(),
                external_order_id: request.external_order_id.clone(),
                now,
                claim: KeyClaim {
                    account: account_bytes(&request.account.id)?,
                    key: &request.key,
                    operation: Operation::PlaceOrder,
                    fingerprint: request.fingerprint,
                    expires_at: expiry_after(now, ttl),
                },
            };
            store.place_order(&new, order_placed)
        })
        .await??;
    match outcome {
        Ok(body) => Ok(FirstUse::Durable(body)),
        Err(OrderRefusal::KeyTaken) => Ok(FirstUse::KeyTaken),
        Err(OrderRefusal::Basket(rejection)) => Err(ApiError::BadRequest(rejection.message())),
        Err(OrderRefusal::Shortfall(Shortfall::InsufficientBalance)) => {
            state.metrics.payment_refused("insufficient_balance");
            Err(ApiError::PaymentRequired("Insufficient balance"))
        }
        Err(OrderRefusal::Shortfall(Shortfall::ExceedsCreditLimit)) => {
            state.metrics.payment_refused("exceeds_credit_limit");
            Err(ApiError::PaymentRequired("Exceeds credit limit"))
        }
    }
}

pub(super) fn order_not_found(id: &str) -> ApiError {
    ApiError::NotFound(format!("order_not_found: no order {id:?} in this account"))
}

#[utoipa::path(
    get, path = "/b2b/orders/{id}", tag = "orders",
    params(("id" = String, Path, description = "ord_…")),
    responses((status = 200, description = "The order now", body = OrderOne), (status = 404, description = "order_not_found", body = ErrorEnvelope)),
    security(("api_key" = []))
)]
pub async fn get_order(
    partner: Partner<OrdersRead>,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (_, order) = own_order(&state, &partner.account.id, &path)?;
    Ok(json_response(order_only(&order)))
}

/// The order named in a path, if it is this account's; any other id is `order_not_found`.
pub(super) fn own_order(
    state: &AppState,
    account_id: &str,
    path: &str,
) -> Result<(Id, Order), ApiError> {
    let id = Id::parse(IdKind::Order, path).ok_or_else(|| order_not_found(path))?;
    match state.store.order(&id)? {
        Some(order) if order.account_id == account_id => Ok((id, order)),
        _ => Err(order_not_found(path)),
    }
}

#[utoipa::path(
    get, path = "/b2b/orders", tag = "orders",
    params(("externalOrderId" = Option<String>, Query, description = "Only orders with this externalOrderId"), ("limit" = Option<u32>, Query, minimum = 1, maximum = 100, description = "Page size, 1 to 100 (default 50)"), ("cursor" = Option<String>, Query, description = "nextCursor of the previous page")),
    responses((status = 200, description = "The account's orders, newest first", body = OrderList)),
    security(("api_key" = []))
)]
pub async fn list_orders(
    partner: Partner<OrdersRead>,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let query = ListQuery::parse(&req)?;
    let before = query.id_cursor(IdKind::Order)?;
    let external = query.get("externalOrderId").map(str::to_string);
    if external
        .as_ref()
        .is_some_and(|e| e.chars().count() > MAX_EXTERNAL_ORDER_ID_LEN)
    {
        return Err(query_error(
            "externalOrderId",
            "externalOrderId must be at most 128 characters",
        ));
    }
    let store = Arc::clone(&state.store);
    let page = web::block(move || {
        store.orders_page(&partner.account, external.as_deref(), before, query.limit)
    })
    .await??;
    let items: Vec<OrderJson> = page.items.iter().map(OrderJson::from).collect();
    Ok(json_response(list_body("orders", items, page.next_cursor)))
}
