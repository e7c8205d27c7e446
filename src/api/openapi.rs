//! `GET /openapi.json`: the OpenAPI 3.1 description of every route, generated from the
//! handlers' annotations. The envelopes shared by many routes (401, 403, 422, 429, 500) are
//! added by `SharedResponses` from one table, so no route can forget one.

use actix_web::HttpResponse;
use utoipa::openapi::path::{Operation, PathItem};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Components, HeaderBuilder, Ref, RefOr, ResponseBuilder};
use utoipa::{Modify, OpenApi};

use crate::error::{
    AuthError, ErrorCode, ErrorEnvelope, FieldError, LocPart, RateLimited, ValidationError,
};
use crate::views::{EventDataJson, EventJson, OrderItemJson};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "orderly",
        description = "B2B orders for digital goods where a retry is always safe: the same idempotency key never charges twice.",
        version = env!("CARGO_PKG_VERSION")
    ),
    paths(
        super::orders::create_order,
        super::orders::get_order,
        super::orders::list_orders,
        super::refunds::cancel_order,
        super::refunds::refund_order,
        super::account::balance,
        super::account::transactions,
        super::catalog::products,
        super::events::list_events,
        super::providers::provider_notification,
        super::admin::create_account,
        super::admin::get_account,
        super::admin::create_api_key,
        super::admin::revoke_api_key,
        super::admin::credit_account,
        super::admin::put_product,
        super::backup::backup,
        super::admin_reads::list_accounts,
        super::admin_reads::account_orders,
        super::admin_reads::account_transactions,
        super::admin_reads::account_events,
        super::webhook_ops::rotate_webhook_secret,
        super::webhook_ops::admin_redeliver,
        super::webhook_ops::partner_redeliver,
        super::webhook_ops::recover_deliveries,
        super::ops::healthz,
        super::ops::readyz,
        super::ops::metrics,
        openapi_json,
    ),
    components(schemas(
        ErrorEnvelope, ErrorCode, AuthError, ValidationError, FieldError, LocPart, RateLimited, OrderItemJson, EventDataJson, EventJson
    )),
    servers((url = "/", description = "The orderly server that serves this document")),
    modifiers(&SharedResponses),
    tags(
        (name = "orders", description = "Placing, reading, cancelling and refunding orders"),
        (name = "account", description = "The partner's balance, ledger, catalog and events"),
        (name = "providers", description = "Inbound payment-provider notifications"),
        (name = "admin", description = "The operator's API"),
        (name = "ops", description = "Health, readiness, metrics and this document")
    )
)]
pub(crate) struct ApiDoc;

/// Adds the security schemes and the responses many routes share.
struct SharedResponses;

/// Routes outside the rate limiter.
const NOT_RATE_LIMITED: &[&str] = &["/healthz", "/readyz", "/metrics"];

fn json_response(description: &str, schema: &str) -> RefOr<utoipa::openapi::Response> {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            utoipa::openapi::ContentBuilder::new()
                .schema(Some(Ref::from_schema_name(schema)))
                .build(),
        )
        .build()
        .into()
}

fn rate_limited_response() -> RefOr<utoipa::openapi::Response> {
    let integer_header = |description: &str| {
        HeaderBuilder::new()
            .schema(
                utoipa::openapi::ObjectBuilder::new()
                    .schema_type(utoipa::openapi::schema::Type::Integer),
            )
            .description(Some(description))
            .build()
    };
    ResponseBuilder::new()
        .description("Over the per-minute limit")
        .header(
            "Retry-After",
            integer_header("Whole seconds until the next request would be allowed"),
        )
        .header("X-RateLimit-Limit", integer_header("The per-minute limit"))
        .header(
            "X-RateLimit-Remaining",
            integer_header("Requests available now (0)"),
        )
        .header(
            "X-RateLimit-Reset",
            integer_header("Whole seconds until the budget is full again"),
        )
        .content(
            "application/json",
            utoipa::openapi::ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("RateLimited")))
                .build(),
        )
        .build()
        .into()
}

fn add_missing(
    operation: &mut Operation,
    status: &str,
    response: RefOr<utoipa::openapi::Response>,
) {
    operation
        .responses
        .responses
        .entry(status.to_string())
        .or_insert(response);
}

impl Modify for SharedResponses {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Components::new);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "X-Api-Key",
                "gc_live_ followed by 32 lowercase hex digits",
            ))),
        );
        components.add_security_scheme(
            "admin_token",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        for (path, item) in openapi.paths.paths.iter_mut() {
            for (is_write, operation) in operations(item) {
                // Routes without credentials say so (`security: []`), as linters expect.
                operation.security.get_or_insert_with(Vec::new);
                add_missing(
                    operation,
                    "500",
                    json_response(
                        "Internal error (details are logged, never sent)",
                        "ErrorEnvelope",
                    ),
                );
                if NOT_RATE_LIMITED.contains(&path.as_str()) {
                    // Nothing here refuses a well-formed request; the HTTP layer still
                    // refuses malformed ones (431 for headers over the size limit).
                    add_missing(
                        operation,
                        "4XX",
                        ResponseBuilder::new()
                            .description("A malformed request, refused by the HTTP layer")
                            .build()
                            .into(),
                    );
                    continue;
                }
                add_missing(operation, "429", rate_limited_response());
                if path.starts_with("/b2b/") {
                    add_missing(
                        operation,
                        "401",
                        json_response(
                            "Missing, malformed, unknown or revoked API key",
                            "AuthError",
                        ),
                    );
                    add_missing(
                        operation,
                        "403",
                        json_response(
                            "Not a wholesale account, or the key lacks the scope",
                            "AuthError",
                        ),
                    );
                }
                if path.starts_with("/admin/") {
                    add_missing(
                        operation,
                        "401",
                        json_response("Wrong or missing admin token", "AuthError"),
                    );
                    add_missing(
                        operation,
                        "404",
                        json_response("Unknown resource, or the admin API is off", "ErrorEnvelope"),
                    );
                }
                if is_write {
                    // The origin refusal has the business envelope, the auth one does not.
                    let description = "Origin not allowed (`success:false` envelope), or an auth/scope refusal (`error`/`message`)";
                    let schema = utoipa::openapi::schema::OneOfBuilder::new()
                        .item(Ref::from_schema_name("ErrorEnvelope"))
                        .item(Ref::from_schema_name("AuthError"));
                    operation.responses.responses.insert(
                        "403".into(),
                        ResponseBuilder::new()
                            .description(description)
                            .content(
                                "application/json",
                                utoipa::openapi::ContentBuilder::new()
                                    .schema(Some(schema))
                                    .build(),
                            )
                            .build()
                            .into(),
                    );
                }
                let takes_query = operation.parameters.as_ref().is_some_and(|ps| {
                    ps.iter().any(|p| {
                        matches!(p.parameter_in, utoipa::openapi::path::ParameterIn::Query)
                    })
                });
                if is_write || path.starts_with("/b2b/") || takes_query {
                    add_missing(
                        operation,
                        "422",
                        json_response(
                            "The body or query does not match the schema",
                            "ValidationError",
                        ),
                    );
                }
            }
        }
    }
}

/// Every operation of a path item, with whether it is a write.
fn operations(item: &mut PathItem) -> Vec<(bool, &mut Operation)> {
    [
        (false, item.get.as_mut()),
        (true, item.post.as_mut()),
        (true, item.put.as_mut()),
        (true, item.patch.as_mut()),
        (true, item.delete.as_mut()),
    ]
    .into_iter()
    .filter_map(|(write, op)| op.map(|op| (write, op)))
    .collect()
}

/// The document: the routes from their annotations, and the webhooks orderly sends
/// (`webhooks_doc.rs`).
pub(crate) fn document() -> String {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).expect("the OpenAPI document serializes");
    doc["webhooks"] = super::webhooks_doc::webhooks();
    if let Some(tags) = doc["tags"].as_array_mut() {
        tags.push(super::webhooks_doc::tag());
    }
    doc.to_string()
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "ops", summary = "This OpenAPI document", responses((status = 200, description = "OpenAPI 3.1 document", content_type = "application/json")))]
pub(crate) async fn openapi_json() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(document())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc() -> serde_json::Value {
        serde_json::from_str(&document()).unwrap()
    }

    fn idempotency_required(doc: &serde_json::Value, path: &str, method: &str) -> Option<bool> {
        doc["paths"][path][method]["parameters"]
            .as_array()?
            .iter()
            .find(|p| p["name"] == "X-Idempotency-Key")
            .map(|p| p["required"].as_bool().unwrap_or(false))
    }

    #[test]
    fn the_documented_limits_are_the_enforced_ones() {
        use crate::domain::limits::*;
        let d = doc();
        let schema = |name: &str| d["components"]["schemas"][name]["properties"].clone();
        let order = schema("CreateOrderBody");
        assert_eq!(order["callbackUrl"]["maxLength"], MAX_CALLBACK_URL_LEN);
        assert_eq!(
            order["externalOrderId"]["maxLength"],
            MAX_EXTERNAL_ORDER_ID_LEN
        );
        let item = schema("ItemBody");
        assert_eq!(item["productId"]["maxLength"], MAX_PRODUCT_ID_LEN);
        assert_eq!(item["quantity"]["maximum"], MAX_QUANTITY);
        assert_eq!(schema("RefundBody")["reason"]["maxLength"], MAX_REASON_LEN);
        assert_eq!(schema("CreditBody")["amount"]["maximum"], MAX_AMOUNT);
        assert_eq!(schema("ProductBody")["price"]["maximum"], MAX_AMOUNT);
    }

    #[test]
    fn every_operation_has_a_summary_a_declared_security_and_a_4xx() {
        let d = doc();
        assert!(d["servers"].as_array().is_some_and(|s| !s.is_empty()));
        for (path, item) in d["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                assert!(op["summary"].is_string(), "{method} {path}: summary");
                assert!(op["security"].is_array(), "{method} {path}: security");
                let has_4xx = op["responses"]
                    .as_object()
                    .unwrap()
                    .keys()
                    .any(|k| k.starts_with('4'));
                assert!(has_4xx, "{method} {path}: a 4xx response");
                let takes_query = op["parameters"]
                    .as_array()
                    .is_some_and(|ps| ps.iter().any(|p| p["in"] == "query"));
                if takes_query {
                    assert!(op["responses"].get("422").is_some(), "{method} {path}: 422");
                }
            }
        }
    }

    #[test]
    fn each_event_type_is_a_webhook_whose_body_is_the_listed_event() {
        let d = doc();
        let schemas = &d["components"]["schemas"];
        assert!(schemas["EventJson"].is_object());
        for kind in ["order.completed", "order.cancelled", "order.refunded"] {
            let post = &d["webhooks"][kind]["post"];
            let headers: Vec<&str> = post["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["name"].as_str().unwrap())
                .collect();
            assert_eq!(
                headers,
                ["webhook-id", "webhook-timestamp", "webhook-signature"]
            );
            let body = &post["requestBody"]["content"]["application/json"]["schema"]["allOf"];
            assert_eq!(body[0]["$ref"], "#/components/schemas/EventJson");
            assert_eq!(body[1]["properties"]["type"]["const"], kind);
        }
    }

    #[test]
    fn every_refusal_code_is_in_the_documents_enum() {
        let d = doc();
        let schemas = &d["components"]["schemas"];
        let listed: Vec<&str> = schemas["ErrorCode"]["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap())
            .collect();
        assert_eq!(listed, crate::error::ERROR_CODES);
        for envelope in ["ErrorEnvelope", "AuthError"] {
            let code = schemas[envelope]["properties"]["code"].to_string();
            assert!(
                code.contains("#/components/schemas/ErrorCode"),
                "{envelope}: {code}"
            );
        }
    }

    #[test]
    fn the_document_is_openapi_3_1() {
        assert!(doc()["openapi"].as_str().unwrap().starts_with("3.1"));
    }

    #[test]
    fn the_idempotency_key_is_required_exactly_where_the_server_refuses_without_it() {
        let d = doc();
        assert_eq!(idempotency_required(&d, "/b2b/orders", "post"), Some(true));
        assert_eq!(
            idempotency_required(&d, "/b2b/orders/{id}/refunds", "post"),
            Some(true)
        );
        assert_eq!(
            idempotency_required(&d, "/admin/accounts/{id}/credits", "post"),
            Some(true)
        );
        assert_eq!(
            idempotency_required(&d, "/b2b/orders/{id}/cancel", "post"),
            Some(false)
        );
    }

    #[test]
    fn every_rate_limited_route_documents_429_and_every_route_500() {
        let d = doc();
        for (path, item) in d["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                assert!(op["responses"].get("500").is_some(), "{method} {path}");
                if !NOT_RATE_LIMITED.contains(&path.as_str()) {
                    assert!(op["responses"].get("429").is_some(), "{method} {path}");
                }
            }
        }
    }
}
