//! Webhook operations (docs/contract.md "7. Webhooks"): rotating an account's webhook secret with an overlap, and
//! bringing back callbacks: one event's (the operator's or the partner's own), or every one of
//! an account given up since a time.

use crate::bounds::Deadline;
use actix_web::{web, HttpResponse};
use serde::{Deserialize, Serialize};

use super::admin::account_id;
use super::extract::{AdminWrite, JsonBody, OrdersWrite, Partner, Violations, WriteCall};
use super::respond::json_response;
use crate::domain::account::new_webhook_secret;
use crate::domain::ids::{AccountId, Id, IdKind};
use crate::domain::time::{now_millis, parse_rfc3339, rfc3339};
use crate::error::{ApiError, ErrorEnvelope};
use crate::loc;
use crate::store::{Redelivered, Store};
use crate::views::to_json;

/// These routes take no fields: an empty body or `{}` (unknown fields are ignored).
#[derive(Deserialize, utoipa::ToSchema)]
pub(crate) struct NoFields {}

impl JsonBody for NoFields {
    const OPTIONAL: bool = true;
}

/// `POST /admin/accounts/{id}/webhook-secret`: the new secret, shown here once.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SecretRotated {
    pub(crate) success: bool,
    /// `whsec_<base64>`: signs every delivery from now on.
    pub(crate) webhook_secret: String,
    /// Until then the replaced secret signs beside it (`v1,<new> v1,<old>`).
    pub(crate) previous_secret_valid_until: String,
}

/// A redelivery was queued.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct RedeliveryQueued {
    pub(crate) success: bool,
    /// Always `pending`: one attempt is queued now.
    pub(crate) delivery: &'static str,
}

/// How many given-up deliveries were queued again.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct Recovered {
    pub(crate) success: bool,
    pub(crate) requeued: u64,
}

#[utoipa::path(
    post, path = "/admin/accounts/{id}/webhook-secret", tag = "admin", summary = "Rotate the account's webhook secret",
    description = "A new secret signs every delivery from now on; for --webhook-secret-overlap (default 24h) the replaced one signs beside it, so a receiver holding either verifies. A second rotation within the overlap drops the oldest.",
    params(("id" = String, Path, description = "acc_…")),
    request_body(content = Option<NoFields>, description = "Empty, or {}"),
    responses(
        (status = 200, description = "The new secret, shown only here", body = SecretRotated),
        (status = 404, description = "account_not_found", body = ErrorEnvelope),
    ),
    security(("admin_token" = []))
)]
pub(crate) async fn rotate_webhook_secret(
    call: AdminWrite<NoFields>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let (store, deadline) = (call.store, call.deadline);
    let settings = call.settings;
    let account = account_id(&**store, deadline, &path).await?;
    let secret = new_webhook_secret();
    let overlap = settings.webhook_secret_overlap;
    let previous = store
        .rotate_webhook_secret(deadline, account, secret.clone(), now_millis(), overlap)
        .await?
        .ok_or_else(|| super::admin::account_not_found(&path))?;
    Ok(json_response(to_json(&SecretRotated {
        success: true,
        webhook_secret: secret,
        previous_secret_valid_until: rfc3339(previous.valid_until),
    })))
}

fn event_not_found(id: &str) -> ApiError {
    ApiError::EventNotFound { id: id.to_string() }
}

/// Queues one attempt of event `id`'s callback; `owner` limits it to that account's events.
async fn redeliver(
    store: &dyn Store,
    deadline: Deadline,
    id: &str,
    owner: Option<AccountId>,
) -> Result<HttpResponse, ApiError> {
    let event = Id::parse(IdKind::Event, id).ok_or_else(|| event_not_found(id))?;
    match store
        .redeliver(deadline, event, owner, now_millis())
        .await?
    {
        Redelivered::Queued => Ok(json_response(to_json(&RedeliveryQueued {
            success: true,
            delivery: "pending",
        }))),
        Redelivered::NotFound => Err(event_not_found(id)),
        Redelivered::NoCallback => Err(ApiError::NoCallbackUrl {
            event: id.to_string(),
        }),
    }
}

#[utoipa::path(
    post, path = "/admin/events/{eventId}/redeliver", tag = "admin", summary = "Redeliver an event's callback",
    description = "Queues one attempt now with the same webhook-id and body, whatever the delivery's state; recorded in the event's deliveries.",
    params(("eventId" = String, Path, description = "evt_…")),
    request_body(content = Option<NoFields>, description = "Empty, or {}"),
    responses(
        (status = 200, description = "Queued", body = RedeliveryQueued),
        (status = 404, description = "event_not_found", body = ErrorEnvelope),
        (status = 409, description = "no_callback_url: the event's order has no callbackUrl", body = ErrorEnvelope),
    ),
    security(("admin_token" = []))
)]
pub(crate) async fn admin_redeliver(
    call: AdminWrite<NoFields>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    redeliver(&**call.store, call.deadline, &path, None).await
}

#[utoipa::path(
    post, path = "/b2b/events/{eventId}/redeliver", tag = "account", summary = "Redeliver one of your events' callback",
    description = "Queues one attempt now with the same webhook-id and body, whatever the delivery's state. Another account's event is 404.",
    params(("eventId" = String, Path, description = "evt_…")),
    request_body(content = Option<NoFields>, description = "Empty, or {}"),
    responses(
        (status = 200, description = "Queued", body = RedeliveryQueued),
        (status = 404, description = "event_not_found (also another account's event)", body = ErrorEnvelope),
        (status = 409, description = "no_callback_url: the event's order has no callbackUrl", body = ErrorEnvelope),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn partner_redeliver(
    call: WriteCall<Partner<OrdersWrite>, NoFields>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let owner = Some(call.caller.account.id);
    redeliver(&**call.store, call.deadline, &path, owner).await
}

#[derive(Deserialize, utoipa::ToSchema)]
pub(crate) struct RecoverBody {
    /// RFC 3339: deliveries given up at or after this time are queued again.
    since: String,
}

impl JsonBody for RecoverBody {}

#[utoipa::path(
    post, path = "/admin/accounts/{id}/deliveries/recover", tag = "admin", summary = "Redeliver every callback given up since a time",
    params(("id" = String, Path, description = "acc_…")),
    request_body = RecoverBody,
    responses(
        (status = 200, description = "How many deliveries were queued again", body = Recovered),
        (status = 404, description = "account_not_found", body = ErrorEnvelope),
    ),
    security(("admin_token" = []))
)]
pub(crate) async fn recover_deliveries(
    call: AdminWrite<RecoverBody>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let (body, store, deadline) = (call.body, call.store, call.deadline);
    let since = parse_rfc3339(&body.since);
    let mut v = Violations::default();
    v.check(
        since.is_some(),
        || loc!("since"),
        "since must be an RFC 3339 time, such as 2026-12-01T10:00:00Z",
        "datetime_parsing",
    );
    v.into_result()?;
    let account = account_id(&**store, deadline, &path).await?;
    let since = since.unwrap_or_default();
    let requeued = store
        .recover_deliveries(deadline, account, since, now_millis())
        .await?;
    Ok(json_response(to_json(&Recovered {
        success: true,
        requeued,
    })))
}
