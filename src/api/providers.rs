//! `POST /webhooks/providers/{provider}`: payment notifications from providers, verified by
//! HMAC-SHA256 over the raw body and deduplicated by the unique `(provider, id)` index, so a
//! repeat, or ten concurrent copies, credit the account exactly once.

use std::sync::Arc;

use actix_web::{web, HttpRequest, HttpResponse};
use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;

use super::error::ApiError;
use super::extract::{parse_json, read_body, Violations};
use super::idempotent::json_response;
use super::openapi::{AuthError, ErrorEnvelope, ProviderAck, ValidationError};
use super::AppState;
use crate::domain::time::now_millis;
use crate::loc;
use crate::store::providers::{ProviderCredit, ProviderRefusal, Recorded};

/// The one notification type that moves money.
pub const PAYMENT_SUCCEEDED: &str = "payment.succeeded";

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Notification {
    id: String,
    #[serde(rename = "type")]
    kind: String,
    account_id: String,
    amount: i64,
    currency: String,
}

/// Lowercase or uppercase hex to bytes; `None` for anything else.
fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// `X-Signature: sha256=<hex HMAC-SHA256(secret, body)>`, compared in constant time.
pub fn signature_valid(secret: &[u8], body: &[u8], header: Option<&str>) -> bool {
    let Some(signature) = header
        .and_then(|h| h.trim().strip_prefix("sha256="))
        .and_then(decode_hex)
    else {
        return false;
    };
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret) else {
        return false;
    };
    mac.update(body);
    mac.verify_slice(&signature).is_ok()
}

#[utoipa::path(
    post, path = "/webhooks/providers/{provider}", tag = "providers",
    params(("provider" = String, Path, description = "A provider configured with --provider-secret"), ("X-Signature" = String, Header, description = "sha256=<hex HMAC-SHA256(secret, raw body)>")),
    request_body = Notification,
    responses(
        (status = 200, description = "Recorded; duplicate is true when it had been credited already", body = ProviderAck),
        (status = 400, description = "currency_mismatch", body = ErrorEnvelope),
        (status = 401, description = "Missing or wrong signature", body = AuthError),
        (status = 404, description = "Unknown provider or account", body = ErrorEnvelope),
        (status = 422, description = "The body does not match the schema", body = ValidationError),
    )
)]
pub async fn provider_notification(
    path: web::Path<String>,
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let provider = path.into_inner();
    let secret = state
        .settings
        .provider_secret
        .iter()
        .find(|p| p.name == provider)
        .map(|p| p.secret.clone())
        .ok_or_else(|| {
            ApiError::NotFound(format!(
                "unknown_provider: no provider {provider:?} is configured"
            ))
        })?;
    let body = read_body(payload).await?;
    let header = req
        .headers()
        .get("X-Signature")
        .and_then(|v| v.to_str().ok());
    if !signature_valid(secret.as_bytes(), &body, header) {
        return Err(ApiError::BadSignature);
    }
    let note: Notification = parse_json(&body)?;
    let mut v = Violations::default();
    v.check(
        !note.id.trim().is_empty() && note.id.len() <= 255,
        || loc!("id"),
        "id must be a non-empty string of at most 255 characters",
        "string_length",
    );
    v.check(
        note.amount >= 1,
        || loc!("amount"),
        "amount must be at least 1",
        "range",
    );
    v.into_result()?;
    if note.kind != PAYMENT_SUCCEEDED {
        // Acknowledged so the provider stops retrying; only a succeeded payment moves money.
        return Ok(json_response(
            br#"{"success":true,"duplicate":false,"ignored":true}"#.to_vec(),
        ));
    }
    if note.currency != state.settings.currency {
        return Err(ApiError::BadRequest(format!(
            "currency_mismatch: this deployment settles in {}",
            state.settings.currency
        )));
    }
    if state.store.account(&note.account_id)?.is_none() {
        return Err(ApiError::NotFound(format!(
            "account_not_found: no account {:?}",
            note.account_id
        )));
    }
    let store = Arc::clone(&state.store);
    // The write resolves once on disk, duplicates too: a duplicate's 200 tells the provider to
    // stop retrying, so the first delivery's credit must be durable before it is sent.
    let outcome = state
        .committer
        .write(move || {
            store.record_provider_payment(&ProviderCredit {
                provider: &provider,
                external_id: &note.id,
                account_id: &note.account_id,
                amount: note.amount,
                now: now_millis(),
            })
        })
        .await??;
    let duplicate = match outcome {
        Ok(Recorded::Credited) => false,
        Ok(Recorded::Duplicate) => true,
        Err(ProviderRefusal::BalanceOverflow) => {
            return Err(ApiError::BadRequest(
                "balance_too_large: the balance after this payment does not fit".into(),
            ))
        }
    };
    let body = if duplicate {
        br#"{"success":true,"duplicate":true}"#.to_vec()
    } else {
        br#"{"success":true,"duplicate":false}"#.to_vec()
    };
    Ok(json_response(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sign(secret: &[u8], body: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap();
        mac.update(body);
        let bytes = mac.finalize().into_bytes();
        format!(
            "sha256={}",
            bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
        )
    }

    #[test]
    fn a_correct_signature_is_accepted_and_any_change_refused() {
        let header = sign(b"s3cret", b"{\"id\":\"p1\"}");
        assert!(signature_valid(
            b"s3cret",
            b"{\"id\":\"p1\"}",
            Some(&header)
        ));
        assert!(!signature_valid(
            b"s3cret",
            b"{\"id\":\"p2\"}",
            Some(&header)
        ));
        assert!(!signature_valid(
            b"other",
            b"{\"id\":\"p1\"}",
            Some(&header)
        ));
        assert!(!signature_valid(b"s3cret", b"{\"id\":\"p1\"}", None));
        assert!(!signature_valid(b"s3cret", b"{}", Some("sha256=zz")));
    }
}
