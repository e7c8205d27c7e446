//! `POST /b2b/orders/{id}/cancel` and `POST /b2b/orders/{id}/refunds`: money going back.
//! Both are state changes whose conflicts (already cancelled, not completed, more than the
//! remainder) are 409s of the order's state, distinct from the idempotency-key 409.

use crate::bounds::Deadline;
use actix_web::{web, HttpResponse};
use serde::Deserialize;

use super::extract::{optional_idempotency_key, required_idempotency_key};
use super::extract::{JsonBody, OrdersWrite, Partner, Violations, WriteCall};
use super::idempotent::{run_once, run_unkeyed, FirstUse, KeyedWrite};
use super::orders::{order_not_found, own_order};
use crate::domain::fingerprint::{Fingerprint, Operation};
use crate::domain::ids::{Id, IdKind};
use crate::domain::limits::MAX_REASON_LEN;
use crate::domain::money::Cents;
use crate::error::{ApiError, ErrorEnvelope, MoneyIn};
use crate::loc;
use crate::store::{CancelRefusal, CancelRequest, RefundRefusal, RefundRequest, Store};
use crate::views::{order_only, refund_made, OrderOne, RefundMade};

/// A cancel takes no fields; an empty body or `{}` is fine, unknown fields are ignored.
#[derive(Deserialize, utoipa::ToSchema)]
pub(crate) struct CancelBody {}

impl JsonBody for CancelBody {
    const OPTIONAL: bool = true;
}

#[utoipa::path(
    post, path = "/b2b/orders/{id}/cancel", tag = "orders", summary = "Cancel a processing order",
    params(("id" = String, Path, description = "ord_…"), super::key_headers::OptionalKey),
    request_body(content = Option<CancelBody>, description = "Empty, or {}"),
    responses(
        (status = 200, description = "Cancelled; the money is back on the balance", body = OrderOne, headers(("Idempotency-Replayed" = String, description = "\"true\" when this is the stored answer of an earlier request with the same key"))),
        (status = 400, description = "Invalid idempotency key, or balance_too_large: the balance with the order's money back would not fit", body = ErrorEnvelope),
        (status = 404, description = "order_not_found", body = ErrorEnvelope),
        (status = 409, description = "order_not_cancellable (a state conflict), or the key was used differently", body = ErrorEnvelope),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn cancel_order(
    call: WriteCall<Partner<OrdersWrite>, CancelBody>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let (partner, store, deadline) = (call.caller, call.store, call.deadline);
    let (req, settings, metrics) = (call.req, call.settings, call.metrics);
    // The key's 400 before the order's 404 (docs/contract.md "5. Failures"), as on every keyed route.
    let key = optional_idempotency_key(&req)?;
    let order = own_order(&**store, deadline, partner.account.id, &path)
        .await?
        .id;
    let fingerprint = Fingerprint::of_cancel(&path);
    let write = key.map(|k| {
        KeyedWrite::new(
            deadline,
            partner.account.id,
            k,
            Operation::CancelOrder,
            fingerprint,
        )
    });
    let cancel = || {
        let request = CancelRequest {
            account: partner.account.id,
            order,
            claim: write.as_ref().map(|w| w.claim(settings.idempotency_ttl)),
            render: order_only,
        };
        cancel_first_use(&**store, deadline, request, &path)
    };
    match &write {
        Some(write) => run_once(&**store, &metrics, write, partner.prefetched, cancel).await,
        None => run_unkeyed(cancel()).await,
    }
}

async fn cancel_first_use(
    store: &dyn Store,
    deadline: Deadline,
    request: CancelRequest,
    path: &str,
) -> Result<FirstUse, ApiError> {
    match store.cancel_order(deadline, request).await? {
        Ok(body) => Ok(FirstUse::Durable(body)),
        Err(CancelRefusal::KeyTaken(row)) => Ok(FirstUse::KeyTaken(row)),
        Err(CancelRefusal::NotFound) => Err(order_not_found(path)),
        Err(CancelRefusal::NotCancellable(status)) => Err(ApiError::NotCancellable { status }),
        Err(CancelRefusal::BalanceTooLarge) => Err(ApiError::BalanceTooLarge(MoneyIn::Cancel)),
    }
}

#[derive(Deserialize, utoipa::ToSchema)]
pub(crate) struct RefundBody {
    /// At least 1; absent: the whole unrefunded remainder.
    #[schema(minimum = 1)]
    amount: Option<i64>,
    #[schema(max_length = 256)]
    reason: Option<String>,
}

impl JsonBody for RefundBody {
    const OPTIONAL: bool = true;
}

#[utoipa::path(
    post, path = "/b2b/orders/{id}/refunds", tag = "orders", summary = "Refund a completed order (idempotent)",
    params(("id" = String, Path, description = "ord_…"), super::key_headers::RequiredKey),
    request_body = RefundBody,
    responses(
        (status = 200, description = "The refund, credited to the balance", body = RefundMade, headers(("Idempotency-Replayed" = String, description = "\"true\" when this is the stored answer of an earlier request with the same key"))),
        (status = 400, description = "Missing or invalid idempotency key, or balance_too_large: the balance with the refund would not fit", body = ErrorEnvelope),
        (status = 404, description = "order_not_found", body = ErrorEnvelope),
        (status = 409, description = "order_not_refundable, refund_exceeds_remaining, or the key was used differently", body = ErrorEnvelope),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn refund_order(
    call: WriteCall<Partner<OrdersWrite>, RefundBody>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let (partner, body, store, deadline) = (call.caller, call.body, call.store, call.deadline);
    let (req, settings, metrics) = (call.req, call.settings, call.metrics);
    let mut v = Violations::default();
    v.check(
        body.amount.is_none_or(|a| a >= 1),
        || loc!("amount"),
        "amount must be a whole number of at least 1",
        "range",
    );
    v.at_most_chars(
        body.reason.as_deref(),
        MAX_REASON_LEN,
        || loc!("reason"),
        "reason",
    );
    v.into_result()?;
    let key = required_idempotency_key(&req)?;
    let order = own_order(&**store, deadline, partner.account.id, &path)
        .await?
        .id;
    let amount = body.amount.map(Cents);
    let fingerprint = Fingerprint::of_refund(&path, amount);
    let write = KeyedWrite::new(
        deadline,
        partner.account.id,
        key,
        Operation::RefundOrder,
        fingerprint,
    );
    let refund = || {
        let request = RefundRequest {
            account: partner.account.id,
            order,
            amount,
            reason: body.reason.clone(),
            claim: write.claim(settings.idempotency_ttl),
            id: Id::new(IdKind::Refund),
            render: refund_made,
        };
        refund_first_use(&**store, deadline, request, &path)
    };
    run_once(&**store, &metrics, &write, partner.prefetched, refund).await
}

async fn refund_first_use(
    store: &dyn Store,
    deadline: Deadline,
    request: RefundRequest,
    path: &str,
) -> Result<FirstUse, ApiError> {
    match store.refund_order(deadline, request).await? {
        Ok(body) => Ok(FirstUse::Durable(body)),
        Err(RefundRefusal::KeyTaken(row)) => Ok(FirstUse::KeyTaken(row)),
        Err(RefundRefusal::NotFound) => Err(order_not_found(path)),
        Err(RefundRefusal::NotRefundable(status)) => Err(ApiError::NotRefundable { status }),
        Err(RefundRefusal::ExceedsRemaining { remaining }) => {
            Err(ApiError::RefundExceedsRemaining { remaining })
        }
        Err(RefundRefusal::BalanceTooLarge) => Err(ApiError::BalanceTooLarge(MoneyIn::Refund)),
    }
}
