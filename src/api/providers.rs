//! `POST /webhooks/providers/{provider}`: payment notifications from providers, verified by
//! HMAC-SHA256 over the raw body and deduplicated by the unique `(provider, id)` index, so a
//! repeat, or ten concurrent copies, credit the account exactly once.

use crate::bounds::Deadline;
use actix_web::{web, HttpRequest, HttpResponse};
use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;

use super::extract::{parse_json, read_body, Violations};
use super::respond::{json_response, StoreData};
use crate::config::Settings;
use crate::credentials::Credentials;
use crate::domain::ids::AccountId;
use crate::domain::limits::{MAX_AMOUNT, MAX_PROVIDER_ID_LEN};
use crate::domain::money::Cents;
use crate::error::{ApiError, AuthError, ErrorEnvelope, MoneyIn, ValidationError};
use crate::loc;
use crate::store::{ProviderCredit, ProviderRefusal, Recorded};
use crate::views::{to_json, ProviderAck};

/// The one notification type that moves money.
pub(crate) const PAYMENT_SUCCEEDED: &str = "payment.succeeded";

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Notification {
    id: String,
    #[serde(rename = "type")]
    kind: String,
    account_id: String,
    #[schema(minimum = 1, maximum = 1000000000000i64)]
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
pub(crate) fn signature_valid(secret: &[u8], body: &[u8], header: Option<&str>) -> bool {
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
    post, path = "/webhooks/providers/{provider}", tag = "providers", summary = "Receive a payment-provider notification",
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
pub(crate) async fn provider_notification(
    path: web::Path<String>,
    req: HttpRequest,
    payload: web::Payload,
    store: StoreData,
    deadline: Deadline,
    settings: web::Data<Settings>,
    credentials: web::Data<Credentials>,
) -> Result<HttpResponse, ApiError> {
    let provider = path.into_inner();
    let unknown_provider = || ApiError::UnknownProvider {
        name: provider.clone(),
    };
    if !credentials.knows_provider(&provider) {
        return Err(unknown_provider());
    }
    let body = read_body(&req, payload).await?;
    let header = req
        .headers()
        .get(crate::header_names::X_SIGNATURE)
        .and_then(|v| v.to_str().ok());
    // Any of the provider's secrets in force: one rolling its secret signs with either.
    let signed = credentials
        .provider_accepts(&provider, |secret| signature_valid(secret, &body, header))
        .ok_or_else(unknown_provider)?;
    if !signed {
        return Err(ApiError::BadSignature);
    }
    let note: Notification = parse_json(&body)?;
    let mut v = Violations::default();
    v.check(
        !note.id.trim().is_empty() && note.id.len() <= MAX_PROVIDER_ID_LEN,
        || loc!("id"),
        format_args!("id must be a non-empty string of at most {MAX_PROVIDER_ID_LEN} characters"),
        "string_length",
    );
    // Bounded as an admin credit is: no single payment near i64's end can leave a balance
    // that a later cancel or refund cannot add back to.
    v.whole_number_in(note.amount, 1..=MAX_AMOUNT, || loc!("amount"), "amount");
    v.into_result()?;
    if note.kind != PAYMENT_SUCCEEDED {
        // Acknowledged so the provider stops retrying; only a succeeded payment moves money.
        return Ok(ack(false, Some(true)));
    }
    if note.currency != settings.currency {
        return Err(ApiError::CurrencyMismatch {
            settles_in: settings.currency.clone(),
        });
    }
    let unknown_account = || ApiError::AccountNotFound {
        id: note.account_id.clone(),
    };
    let account = AccountId::parse(&note.account_id).ok_or_else(unknown_account)?;
    if store.account(deadline, account).await?.is_none() {
        return Err(unknown_account());
    }
    // The write resolves once on disk, duplicates too: a duplicate's 200 tells the provider to
    // stop retrying, so the first delivery's credit must be durable before it is sent.
    let outcome = store
        .record_provider_payment(
            deadline,
            ProviderCredit {
                provider,
                external_id: note.id,
                account,
                amount: Cents(note.amount),
            },
        )
        .await?;
    let duplicate = match outcome {
        Ok(Recorded::Credited) => false,
        Ok(Recorded::Duplicate) => true,
        Err(ProviderRefusal::BalanceOverflow) => {
            return Err(ApiError::BalanceTooLarge(MoneyIn::Payment))
        }
    };
    Ok(ack(duplicate, None))
}

fn ack(duplicate: bool, ignored: Option<bool>) -> HttpResponse {
    json_response(to_json(&ProviderAck {
        success: true,
        duplicate,
        ignored,
    }))
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
