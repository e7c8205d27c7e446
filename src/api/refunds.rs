//! `POST /b2b/orders/{id}/cancel` and `POST /b2b/orders/{id}/refunds`: money going back.
//! Both are state changes whose conflicts (already cancelled, not completed, more than the
//! remainder) are 409s of the order's state, distinct from the idempotency-key 409.

use std::sync::Arc;

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;

use super::error::ApiError;
use super::extract::{optional_json_body, OrdersWrite, Partner, Violations};
use super::idempotent::{run_once, run_unkeyed, FirstUse, KeyedWrite};
use super::openapi::{ErrorEnvelope, OrderOne, RefundMade};
use super::orders::{order_not_found, own_order};
use super::{optional_idempotency_key, required_idempotency_key, AppState};
use crate::domain::fingerprint::{Fingerprint, Operation};
use crate::domain::idempotency_key::IdempotencyKey;
use crate::domain::time::{expiry_after, now_millis};
use crate::loc;
use crate::store::accounts::account_bytes;
use crate::store::idempotency::KeyClaim;
use crate::store::lifecycle::{CancelRefusal, CancelRequest, RefundRefusal, RefundRequest};
use crate::views::{order_only, refund_made};

pub const MAX_REASON_LEN: usize = 256;

/// The claim a keyed write records in its transaction.
fn claim_for<'a>(
    state: &AppState,
    account_id: &str,
    key: &'a IdempotencyKey,
    operation: Operation,
    fingerprint: Fingerprint,
    now: u64,
) -> Result<KeyClaim<'a>, ApiError> {
    Ok(KeyClaim {
        account: account_bytes(account_id)?,
        key,
        operation,
        fingerprint,
        expires_at: expiry_after(now, state.settings.idempotency_ttl),
    })
}

/// A cancel takes no fields; an empty body or `{}` is fine, unknown fields are ignored.
#[derive(Deserialize, utoipa::ToSchema)]
pub struct CancelBody {}

#[utoipa::path(
    post, path = "/b2b/orders/{id}/cancel", tag = "orders",
    params(("id" = String, Path, description = "ord_…"), ("X-Idempotency-Key" = Option<String>, Header, description = "Optional: with a key, a repeat replays the first answer"), ("Idempotency-Key" = Option<String>, Header, description = "The IETF spelling; accepted as the same key")),
    request_body(content = Option<CancelBody>, description = "Empty, or {}"),
    responses(
        (status = 200, description = "Cancelled; the money is back on the balance", body = OrderOne, headers(("Idempotency-Replayed" = String, description = "\"true\" when this is the stored answer of an earlier request with the same key"))),
        (status = 400, description = "Invalid idempotency key", body = ErrorEnvelope),
        (status = 404, description = "order_not_found", body = ErrorEnvelope),
        (status = 409, description = "order_not_cancellable (a state conflict), or the key was used differently", body = ErrorEnvelope),
    ),
    security(("api_key" = []))
)]
pub async fn cancel_order(
    partner: Partner<OrdersWrite>,
    path: web::Path<String>,
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let _: CancelBody = optional_json_body(payload).await?;
    let order_id = own_order(&state, &partner.account.id, &path)?.0;
    let key = optional_idempotency_key(&req)?;
    let account_id = partner.account.id.clone();
    let fingerprint = Fingerprint::of_cancel(&path);
    let first_use = || async {
        let store = Arc::clone(&state.store);
        let key = key.clone();
        let inner = state.clone();
        let outcome = state
            .committer
            .write(move || {
                let now = now_millis();
                let claim = match &key {
                    Some(k) => Some(claim_for(
                        &inner,
                        &account_id,
                        k,
                        Operation::CancelOrder,
                        fingerprint,
                        now,
                    )?),
                    None => None,
                };
                let request = CancelRequest {
                    account_id: &account_id,
                    order_id,
                    now,
                    claim,
                };
                Ok::<_, ApiError>(store.cancel_order(&request, order_only)?)
            })
            .await??;
        match outcome {
            Ok(body) => Ok(FirstUse::Durable(body)),
            Err(CancelRefusal::KeyTaken) => Ok(FirstUse::KeyTaken),
            Err(CancelRefusal::NotFound) => Err(order_not_found(&path)),
            Err(CancelRefusal::NotCancellable(status)) => Err(ApiError::Conflict(format!(
                "order_not_cancellable: the order is {}; only a processing order can be cancelled",
                status.as_str()
            ))),
        }
    };
    match &key {
        Some(k) => {
            let write = KeyedWrite {
                account: account_bytes(&partner.account.id)?,
                key: k,
                operation: Operation::CancelOrder,
                fingerprint,
            };
            run_once(&state, write, first_use).await
        }
        None => run_unkeyed(first_use).await,
    }
}

#[derive(Deserialize, utoipa::ToSchema)]
pub struct RefundBody {
    /// At least 1; absent: the whole unrefunded remainder.
    #[schema(minimum = 1)]
    amount: Option<i64>,
    #[schema(max_length = 256)]
    reason: Option<String>,
}

#[utoipa::path(
    post, path = "/b2b/orders/{id}/refunds", tag = "orders",
    params(("id" = String, Path, description = "ord_…"), ("X-Idempotency-Key" = String, Header, description = "1 to 255 visible ASCII characters; one key per business intent"), ("Idempotency-Key" = Option<String>, Header, description = "The IETF spelling; accepted as the same key")),
    request_body = RefundBody,
    responses(
        (status = 200, description = "The refund, credited to the balance", body = RefundMade, headers(("Idempotency-Replayed" = String, description = "\"true\" when this is the stored answer of an earlier request with the same key"))),
        (status = 400, description = "Missing or invalid idempotency key", body = ErrorEnvelope),
        (status = 404, description = "order_not_found", body = ErrorEnvelope),
        (status = 409, description = "order_not_refundable, refund_exceeds_remaining, or the key was used differently", body = ErrorEnvelope),
    ),
    security(("api_key" = []))
)]
pub async fn refund_order(
    partner: Partner<OrdersWrite>,
    path: web::Path<String>,
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let body: RefundBody = optional_json_body(payload).await?;
    let mut v = Violations::default();
    v.check(
        body.amount.is_none_or(|a| a >= 1),
        || loc!("amount"),
        "amount must be a whole number of at least 1",
        "range",
    );
    v.check(
        body.reason
            .as_ref()
            .is_none_or(|r| r.chars().count() <= MAX_REASON_LEN),
        || loc!("reason"),
        "reason must be at most 256 characters",
        "string_length",
    );
    v.into_result()?;
    let order_id = own_order(&state, &partner.account.id, &path)?.0;
    let key = required_idempotency_key(&req)?;
    let fingerprint = Fingerprint::of_refund(&path, body.amount);
    let write = KeyedWrite {
        account: account_bytes(&partner.account.id)?,
        key: &key,
        operation: Operation::RefundOrder,
        fingerprint,
    };
    let account_id = partner.account.id.clone();
    let first_use = || async {
        let store = Arc::clone(&state.store);
        let key = key.clone();
        let inner = state.clone();
        let outcome = state
            .committer
            .write(move || {
                let now = now_millis();
                let request = RefundRequest {
                    account_id: &account_id,
                    order_id,
                    amount: body.amount,
                    reason: body.reason,
                    now,
                    claim: claim_for(
                        &inner,
                        &account_id,
                        &key,
                        Operation::RefundOrder,
                        fingerprint,
                        now,
                    )?,
                };
                Ok::<_, ApiError>(store.refund_order(&request, refund_made)?)
            })
            .await??;
        match outcome {
            Ok(body) => Ok(FirstUse::Durable(body)),
            Err(RefundRefusal::KeyTaken) => Ok(FirstUse::KeyTaken),
            Err(RefundRefusal::NotFound) => Err(order_not_found(&path)),
            Err(RefundRefusal::NotRefundable(status)) => Err(ApiError::Conflict(format!(
                "order_not_refundable: the order is {}; only a completed order can be refunded",
                status.as_str()
            ))),
            Err(RefundRefusal::ExceedsRemaining { remaining }) => Err(ApiError::Conflict(format!(
                "refund_exceeds_remaining: at most {remaining} can still be refunded on this order"
            ))),
        }
    };
    run_once(&state, write, first_use).await
}
