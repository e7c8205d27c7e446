//! The `webhooks` section of `/openapi.json` (OpenAPI 3.1): what orderly POSTs to a
//! partner's `callbackUrl`, one entry per event type, with the Standard Webhooks headers, so
//! that a generator makes a receiver's types. The body's schema is the one `GET /b2b/events`
//! lists (`EventJson`, the struct the worker serializes), narrowed to the event's type.
//! utoipa 5 has no `webhooks` in its document type, so this part is written as JSON and put
//! into the generated document.

use serde_json::{json, Value};

use crate::domain::event::EventKind;
use crate::workers::webhooks::ATTEMPT_TIMEOUT;

/// What each event type says happened, for its entry.
fn what(kind: EventKind) -> &'static str {
    match kind {
        EventKind::OrderCompleted => "An order was fulfilled: its goods were delivered",
        EventKind::OrderCancelled => "An order was cancelled and its total credited back",
        EventKind::OrderRefunded => {
            "A completed order was refunded, wholly or in part: `data.refund` says how much"
        }
    }
}

fn header(name: &str, description: &str, schema: Value) -> Value {
    json!({
        "name": name,
        "in": "header",
        "required": true,
        "description": description,
        "schema": schema,
    })
}

/// The body of `kind`'s deliveries: an event of that type.
fn body(kind: EventKind) -> Value {
    let mut narrowed = json!({
        "type": "object",
        "properties": {"type": {"type": "string", "const": kind.as_str()}},
    });
    if kind == EventKind::OrderRefunded {
        narrowed["properties"]["data"] = json!({"type": "object", "required": ["refund"]});
    }
    json!({"allOf": [{"$ref": "#/components/schemas/EventJson"}, narrowed]})
}

fn entry(kind: EventKind) -> Value {
    let timeout = ATTEMPT_TIMEOUT.as_secs();
    json!({
        "post": {
            "tags": ["webhooks"],
            "operationId": format!("webhook_{}", kind.as_str().replace('.', "_")),
            "summary": what(kind),
            "description": format!(
                "POSTed to the order's `callbackUrl`, signed the Standard Webhooks way \
                 (docs/api.md, \"Verifying webhooks\"). Any 2xx within {timeout} s ends the \
                 delivery; 410 ends it with no further attempt; anything else, or no answer \
                 within {timeout} s, is retried on the server's schedule with the same \
                 `webhook-id` and body. Deduplicate on `webhook-id`."
            ),
            "security": [],
            "parameters": [
                header(
                    "webhook-id",
                    "The event's id (`evt_…`), the same on every attempt: deduplicate on it",
                    json!({"type": "string", "pattern": "^evt_[0-9a-f]{32}$"}),
                ),
                header(
                    "webhook-timestamp",
                    "When this attempt was signed, in whole seconds since the Unix epoch; \
                     refuse one more than 5 minutes from your clock",
                    json!({"type": "string", "pattern": "^[0-9]+$"}),
                ),
                header(
                    "webhook-signature",
                    "`v1,<base64 HMAC-SHA256>` of `{webhook-id}.{webhook-timestamp}.{body}` \
                     with the bytes of the base64 after `whsec_` in the account's secret; \
                     during a rotation's overlap two, space-separated, the new one first",
                    json!({"type": "string", "pattern": "^v1,[A-Za-z0-9+/=]+( v1,[A-Za-z0-9+/=]+)*$"}),
                ),
            ],
            "requestBody": {
                "required": true,
                "content": {"application/json": {"schema": body(kind)}},
            },
            "responses": {
                "2XX": {"description": "Received: the delivery is done"},
                "410": {"description": "Gone: stop delivering this event (no further attempt)"},
                "default": {
                    "description": format!(
                        "Any other status, or no answer within {timeout} s: retried later"
                    ),
                },
            },
        }
    })
}

/// The event types, as the document's `webhooks` object.
pub(super) fn webhooks() -> Value {
    let kinds = [
        EventKind::OrderCompleted,
        EventKind::OrderCancelled,
        EventKind::OrderRefunded,
    ];
    Value::Object(
        kinds
            .into_iter()
            .map(|kind| (kind.as_str().to_string(), entry(kind)))
            .collect(),
    )
}

/// The tag the webhooks are listed under.
pub(super) fn tag() -> Value {
    json!({
        "name": "webhooks",
        "description": "What orderly POSTs to an order's callbackUrl"
    })
}
