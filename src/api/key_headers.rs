//! The idempotency key's headers as `/openapi.json` documents them, written once for every
//! keyed route: `X-Idempotency-Key` and the IETF spelling `Idempotency-Key` (docs/api.md "POST /b2b/orders"). The
//! structs only document (the handlers read the headers themselves), hence never built.

/// A write that requires a key (orders, refunds, credits).
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)]
pub(super) struct RequiredKey {
    /// 1 to 255 visible ASCII characters; one key per business intent
    #[param(rename = "X-Idempotency-Key")]
    x_idempotency_key: String,
    /// The IETF spelling; accepted as the same key
    #[param(rename = "Idempotency-Key")]
    idempotency_key: Option<String>,
}

/// A write where the key is optional (a cancel).
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)]
pub(super) struct OptionalKey {
    /// Optional: with a key, a repeat replays the first answer
    #[param(rename = "X-Idempotency-Key")]
    x_idempotency_key: Option<String>,
    /// The IETF spelling; accepted as the same key
    #[param(rename = "Idempotency-Key")]
    idempotency_key: Option<String>,
}
