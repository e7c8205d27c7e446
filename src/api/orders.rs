//! `POST /b2b/orders` (the idempotent order), `GET /b2b/orders/{id}` and `GET /b2b/orders`.

use crate::bounds::Deadline;
use std::collections::BTreeMap;

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;

use super::extract::required_idempotency_key;
use super::extract::{JsonBody, OrdersRead, OrdersWrite, Partner, Violations, WriteCall};
use super::idempotent::{run_once, FirstUse, KeyedWrite};
use super::lists::{query_error, ListQuery};
use super::respond::{callback_policy, json_response, StoreData};
use crate::domain::account::Shortfall;
use crate::domain::basket::RequestedLine;
use crate::domain::callback_url::CallbackUrl;
use crate::domain::fingerprint::{Fingerprint, LineRef, Operation};
use crate::domain::ids::{AccountId, OrderId};
use crate::domain::limits::{
    MAX_CALLBACK_URL_LEN, MAX_EXTERNAL_ORDER_ID_LEN, MAX_PRODUCT_ID_LEN, MAX_QUANTITY,
};
use crate::domain::order::Order;
use crate::error::{ApiError, ErrorEnvelope};
use crate::loc;
use crate::metrics::Metrics;
use crate::store::{NewOrder, OrderRefusal, Store};
use crate::views::{
    order_only, order_placed, to_json, OrderJson, OrderList, OrderOne, OrderPlaced,
};

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CreateOrderBody {
    /// 1 or more lines (more than 200 is the business refusal `too_many_items`).
    #[schema(min_items = 1)]
    items: Vec<ItemBody>,
    /// Where order events are POSTed; http(s) to a public host.
    #[schema(max_length = 2048)]
    callback_url: Option<String>,
    #[schema(max_length = 128)]
    external_order_id: Option<String>,
}

impl JsonBody for CreateOrderBody {}

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
                format_args!("productId must be a non-empty string of at most {MAX_PRODUCT_ID_LEN} characters"),
                "string_length",
            );
            v.whole_number_in(
                item.quantity,
                1..=MAX_QUANTITY,
                || loc!("items", i, "quantity"),
                "quantity",
            );
        }
        v.at_most_chars(
            self.callback_url.as_deref(),
            MAX_CALLBACK_URL_LEN,
            || loc!("callbackUrl"),
            "callbackUrl",
        );
        v.at_most_chars(
            self.external_order_id.as_deref(),
            MAX_EXTERNAL_ORDER_ID_LEN,
            || loc!("externalOrderId"),
            "externalOrderId",
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
    post, path = "/b2b/orders", tag = "orders", summary = "Place an order (idempotent)",
    request_body = CreateOrderBody,
    params(super::key_headers::RequiredKey),
    responses(
        (status = 200, description = "The order, durable; a replay returns the first answer byte for byte", body = OrderPlaced, headers(("Idempotency-Replayed" = String, description = "\"true\" when this is the stored answer of an earlier request with the same key"))),
        (status = 400, description = "Missing/invalid idempotency key, invalid callbackUrl, or a business rule (token prefix)", body = ErrorEnvelope),
        (status = 402, description = "Insufficient balance / Exceeds credit limit / Concurrent balance modification", body = ErrorEnvelope),
        (status = 409, description = "The key was used with a different basket, or is in progress", body = ErrorEnvelope),
    ),
    security(("api_key" = []))
)]
// The checks run in the order the contract fixes: key (auth), body (422), idempotency key
// (400), callbackUrl (400), key lookup (replay / 409), business rules (400), payment (402).
pub(crate) async fn create_order(
    call: WriteCall<Partner<OrdersWrite>, CreateOrderBody>,
) -> Result<HttpResponse, ApiError> {
    let (partner, body, store, deadline) = (call.caller, call.body, call.store, call.deadline);
    let (req, settings, metrics) = (call.req, call.settings, call.metrics);
    body.check_schema()?;
    let key = required_idempotency_key(&req)?;
    let callback_url = body
        .callback_url
        .as_deref()
        .map(|url| CallbackUrl::parse(url, callback_policy(&settings)))
        .transpose()
        .map_err(|reason| ApiError::InvalidCallbackUrl { reason })?;
    let external_order_id = body.external_order_id.clone();
    let lines = body.requested_lines();
    let fingerprint = Fingerprint::of_basket(lines.iter().map(|l| LineRef {
        product_id: &l.product_id,
        quantity: l.quantity,
        delivery_data: &l.delivery_data,
    }));
    let write = KeyedWrite::new(
        deadline,
        partner.account.id,
        key,
        Operation::PlaceOrder,
        fingerprint,
    );
    let claim = write.claim(settings.idempotency_ttl);
    let place = || {
        let order = NewOrder {
            account: partner.account.clone(),
            lines: lines.clone(),
            currency: settings.currency.clone(),
            callback_url: callback_url.clone(),
            external_order_id: external_order_id.clone(),
            claim: claim.clone(),
            render: order_placed,
        };
        first_use(&**store, deadline, &metrics, order)
    };
    run_once(&**store, &metrics, &write, partner.prefetched, place).await
}

/// The first use of the key: the port's one transaction, answered once on disk.
async fn first_use(
    store: &dyn Store,
    deadline: Deadline,
    metrics: &Metrics,
    order: NewOrder,
) -> Result<FirstUse, ApiError> {
    match store.place_order(deadline, order).await? {
        Ok(body) => Ok(FirstUse::Durable(body)),
        Err(OrderRefusal::KeyTaken(row)) => Ok(FirstUse::KeyTaken(row)),
        Err(OrderRefusal::Basket(rejection)) => Err(ApiError::Basket(rejection)),
        Err(OrderRefusal::Shortfall(Shortfall::InsufficientBalance)) => {
            metrics.payment_refused("insufficient_balance");
            Err(ApiError::InsufficientBalance)
        }
        Err(OrderRefusal::Shortfall(Shortfall::ExceedsCreditLimit)) => {
            metrics.payment_refused("exceeds_credit_limit");
            Err(ApiError::ExceedsCreditLimit)
        }
        // Counted where it is answered (`run_once`): a key already used answers instead.
        Err(OrderRefusal::ConcurrentModification) => Err(ApiError::ConcurrentModification),
    }
}

pub(super) fn order_not_found(id: &str) -> ApiError {
    ApiError::OrderNotFound { id: id.to_string() }
}

#[utoipa::path(
    get, path = "/b2b/orders/{id}", tag = "orders", summary = "Read one order",
    params(("id" = String, Path, description = "ord_…")),
    responses((status = 200, description = "The order now", body = OrderOne), (status = 404, description = "order_not_found", body = ErrorEnvelope)),
    security(("api_key" = []))
)]
pub(crate) async fn get_order(
    partner: Partner<OrdersRead>,
    deadline: Deadline,
    path: web::Path<String>,
    store: StoreData,
) -> Result<HttpResponse, ApiError> {
    let order = own_order(&**store, deadline, partner.account.id, &path).await?;
    Ok(json_response(order_only(&order)))
}

/// The order named in a path, if it is this account's; any other id is `order_not_found`.
pub(super) async fn own_order(
    store: &dyn Store,
    deadline: Deadline,
    account: AccountId,
    path: &str,
) -> Result<Order, ApiError> {
    let id = OrderId::parse(path).ok_or_else(|| order_not_found(path))?;
    match store.order(deadline, id).await? {
        Some(order) if order.account_id == account => Ok(order),
        _ => Err(order_not_found(path)),
    }
}

#[utoipa::path(
    get, path = "/b2b/orders", tag = "orders", summary = "List orders, newest first",
    params(("externalOrderId" = Option<String>, Query, description = "Only orders with this externalOrderId"), ("limit" = Option<u32>, Query, minimum = 1, maximum = 100, description = "Page size, 1 to 100 (default 50)"), ("cursor" = Option<String>, Query, description = "nextCursor of the previous page")),
    responses((status = 200, description = "The account's orders, newest first", body = OrderList)),
    security(("api_key" = []))
)]
pub(crate) async fn list_orders(
    partner: Partner<OrdersRead>,
    deadline: Deadline,
    req: HttpRequest,
    store: StoreData,
) -> Result<HttpResponse, ApiError> {
    orders_of(&**store, deadline, partner.account.id, &req).await
}

/// An account's orders as `GET /b2b/orders` lists them (the admin twin lists the same).
pub(super) async fn orders_of(
    store: &dyn Store,
    deadline: Deadline,
    account: AccountId,
    req: &HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let query = ListQuery::parse(req)?;
    let before = query.typed_cursor(OrderId::parse)?;
    let external = query.get("externalOrderId").map(str::to_string);
    if external
        .as_ref()
        .is_some_and(|e| e.chars().count() > MAX_EXTERNAL_ORDER_ID_LEN)
    {
        return Err(query_error(
            "externalOrderId",
            &format!("externalOrderId must be at most {MAX_EXTERNAL_ORDER_ID_LEN} characters"),
        ));
    }
    let page = store
        .orders_page(deadline, account, external, before, query.limit)
        .await?;
    Ok(json_response(to_json(&OrderList {
        success: true,
        orders: page.items.iter().map(OrderJson::from).collect(),
        next_cursor: page.next_cursor.as_deref(),
    })))
}
