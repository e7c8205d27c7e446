//! The operator's API (`Authorization: Bearer <admin token>`): accounts, API keys, credits
//! and the catalog. Without `--admin-token` every route here answers 404.

use std::sync::Arc;

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;

use super::error::ApiError;
use super::extract::{json_body, Admin, Violations};
use super::idempotent::{json_response, run_once, FirstUse, KeyedWrite};
use super::openapi::{AccountOne, ApiKeyCreated, BalanceOne, ErrorEnvelope, ProductOne, Success};
use super::{required_idempotency_key, AppState};
use crate::domain::account::{new_api_key, new_webhook_secret, Account, ApiKeyRecord, Scope};
use crate::domain::fingerprint::{Fingerprint, Operation};
use crate::domain::ids::{Id, IdKind};
use crate::domain::ledger::LedgerReason;
use crate::domain::product::{Product, MAX_PRICE, MAX_PRODUCT_ID_LEN};
use crate::domain::time::{expiry_after, now_millis};
use crate::loc;
use crate::store::accounts::{account_bytes, CreditRefusal, NewCredit};
use crate::store::idempotency::KeyClaim;
use crate::views::{balance_only, to_json, AccountJson, ProductJson};

/// The largest credit line or single credit the API accepts (10^12 minor units).
pub const MAX_AMOUNT: i64 = MAX_PRICE;

fn account_not_found(id: &str) -> ApiError {
    ApiError::NotFound(format!("account_not_found: no account {id:?}"))
}

fn load_account(state: &AppState, id: &str) -> Result<Account, ApiError> {
    state
        .store
        .account(id)?
        .ok_or_else(|| account_not_found(id))
}

fn account_response(state: &AppState, account: &Account) -> Result<HttpResponse, ApiError> {
    let balance = state.store.balance(account)?;
    #[derive(serde::Serialize)]
    struct Body<'a> {
        success: bool,
        account: AccountJson<'a>,
    }
    Ok(json_response(to_json(&Body {
        success: true,
        account: AccountJson::new(account, balance),
    })))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NewAccountBody {
    name: String,
    #[serde(default)]
    wholesale: bool,
    #[serde(default)]
    credit_limit: i64,
    region: Option<String>,
}

#[utoipa::path(post, path = "/admin/accounts", tag = "admin", request_body = NewAccountBody, responses((status = 200, description = "The new account", body = AccountOne)), security(("admin_token" = [])))]
pub async fn create_account(
    _admin: Admin,
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let body: NewAccountBody = json_body(&req, payload).await?;
    let mut v = Violations::default();
    v.check(
        !body.name.trim().is_empty() && body.name.chars().count() <= 200,
        || loc!("name"),
        "name must be a non-empty string of at most 200 characters",
        "string_length",
    );
    v.check(
        (0..=MAX_AMOUNT).contains(&body.credit_limit),
        || loc!("creditLimit"),
        "creditLimit must be a whole number from 0 to 1000000000000",
        "range",
    );
    v.check(
        body.region
            .as_ref()
            .is_none_or(|r| !r.trim().is_empty() && r.chars().count() <= 16),
        || loc!("region"),
        "region must be a short non-empty code such as EU",
        "string_length",
    );
    v.into_result()?;
    let account = Account {
        id: Id::new(IdKind::Account).to_string(),
        name: body.name.trim().to_string(),
        wholesale: body.wholesale,
        credit_limit: body.credit_limit,
        region: body.region.map(|r| r.trim().to_string()),
        webhook_secret: new_webhook_secret(),
        created_at: now_millis(),
    };
    let store = Arc::clone(&state.store);
    let stored = account.clone();
    state
        .committer
        .write(move || store.create_account(&stored))
        .await??;
    account_response(&state, &account)
}

#[utoipa::path(get, path = "/admin/accounts/{id}", tag = "admin", params(("id" = String, Path, description = "acc_…")), responses((status = 200, description = "The account now", body = AccountOne)), security(("admin_token" = [])))]
pub async fn get_account(
    _admin: Admin,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let account = load_account(&state, &path)?;
    account_response(&state, &account)
}

#[derive(Deserialize, utoipa::ToSchema)]
pub struct NewApiKeyBody {
    /// Default: all four scopes.
    scopes: Option<Vec<String>>,
}

#[utoipa::path(post, path = "/admin/accounts/{id}/api-keys", tag = "admin", params(("id" = String, Path, description = "acc_…")), request_body = NewApiKeyBody, responses((status = 200, description = "The key; its plaintext is shown only here", body = ApiKeyCreated)), security(("admin_token" = [])))]
pub async fn create_api_key(
    _admin: Admin,
    path: web::Path<String>,
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let body: NewApiKeyBody = json_body(&req, payload).await?;
    let requested = body
        .scopes
        .unwrap_or_else(|| Scope::ALL.iter().map(|s| s.as_str().to_string()).collect());
    let mut v = Violations::default();
    v.check(
        !requested.is_empty(),
        || loc!("scopes"),
        "List should have at least 1 item",
        "too_short",
    );
    let mut scopes = Vec::new();
    for (i, name) in requested.iter().enumerate() {
        match Scope::parse(name) {
            Some(scope) if !scopes.contains(&scope) => scopes.push(scope),
            Some(_) => {}
            None => v.add(
                loc!("scopes", i),
                "scope must be one of orders:write, orders:read, balance:read, catalog:read",
                "enum",
            ),
        }
    }
    v.into_result()?;
    let account = load_account(&state, &path)?;
    let plaintext = new_api_key();
    let record = ApiKeyRecord {
        id: Id::new(IdKind::ApiKey).to_string(),
        account_id: account.id.clone(),
        scopes,
        revoked: false,
        created_at: now_millis(),
    };
    let (store, key, stored) = (Arc::clone(&state.store), plaintext.clone(), record.clone());
    state
        .committer
        .write(move || store.create_api_key(&key, &stored))
        .await??;
    let scope_names: Vec<&str> = record.scopes.iter().map(|s| s.as_str()).collect();
    let body = serde_json::json!({
        "success": true,
        "apiKey": { "id": record.id, "key": plaintext, "scopes": scope_names, "accountId": account.id }
    });
    Ok(json_response(to_json(&body)))
}

#[utoipa::path(delete, path = "/admin/api-keys/{key_id}", tag = "admin", params(("key_id" = String, Path, description = "key_…")), responses((status = 200, description = "Revoked: the key answers 401 from now on", body = Success)), security(("admin_token" = [])))]
pub async fn revoke_api_key(
    _admin: Admin,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (store, key_id) = (Arc::clone(&state.store), path.clone());
    if !state
        .committer
        .write(move || store.revoke_api_key(&key_id))
        .await??
    {
        return Err(ApiError::NotFound(format!(
            "api_key_not_found: no API key {:?}",
            path.as_str()
        )));
    }
    Ok(json_response(br#"{"success":true}"#.to_vec()))
}

#[derive(Deserialize, utoipa::ToSchema)]
pub struct CreditBody {
    #[schema(minimum = 1, maximum = 1000000000000i64)]
    amount: i64,
    reason: Option<String>,
}

#[utoipa::path(
    post, path = "/admin/accounts/{id}/credits", tag = "admin",
    params(("id" = String, Path, description = "acc_…"), ("X-Idempotency-Key" = String, Header, description = "1 to 255 visible ASCII characters; one key per business intent"), ("Idempotency-Key" = Option<String>, Header, description = "The IETF spelling; accepted as the same key")),
    request_body = CreditBody,
    responses(
        (status = 200, description = "Credited; the new balance", body = BalanceOne, headers(("Idempotency-Replayed" = String, description = "\"true\" when this is the stored answer of an earlier request with the same key"))),
        (status = 400, description = "Missing or invalid idempotency key", body = ErrorEnvelope),
        (status = 409, description = "The key was used with a different amount, or is in progress", body = ErrorEnvelope),
    ),
    security(("admin_token" = []))
)]
pub async fn credit_account(
    _admin: Admin,
    path: web::Path<String>,
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let body: CreditBody = json_body(&req, payload).await?;
    let mut v = Violations::default();
    v.check(
        (1..=MAX_AMOUNT).contains(&body.amount),
        || loc!("amount"),
        "amount must be a whole number from 1 to 1000000000000",
        "range",
    );
    v.check(
        body.reason
            .as_ref()
            .is_none_or(|r| r.chars().count() <= 256),
        || loc!("reason"),
        "reason must be at most 256 characters",
        "string_length",
    );
    v.into_result()?;
    let account = load_account(&state, &path)?;
    let key = required_idempotency_key(&req)?;
    let fingerprint = Fingerprint::of_credit(body.amount);
    let write = KeyedWrite {
        account: account_bytes(&account.id)?,
        key: &key,
        operation: Operation::AdminCredit,
        fingerprint,
    };
    let first_use = || async {
        let store = Arc::clone(&state.store);
        let currency = state.settings.currency.clone();
        let ttl = state.settings.idempotency_ttl;
        let key = key.clone();
        let outcome = state
            .committer
            .write(move || {
                let now = now_millis();
                let credit = NewCredit {
                    account: &account,
                    amount: body.amount,
                    reason: LedgerReason::Credit,
                    reference: body.reason.clone().unwrap_or_else(|| "admin credit".into()),
                    now,
                    currency: &currency,
                    claim: Some(KeyClaim {
                        account: account_bytes(&account.id)?,
                        key: &key,
                        operation: Operation::AdminCredit,
                        fingerprint,
                        expires_at: expiry_after(now, ttl),
                    }),
                };
                store.credit(&credit, Id::new(IdKind::Transaction), balance_only)
            })
            .await??;
        match outcome {
            Ok(body) => Ok(FirstUse::Durable(body)),
            Err(CreditRefusal::KeyTaken) => Ok(FirstUse::KeyTaken),
            Err(CreditRefusal::BalanceOverflow) => Err(ApiError::BadRequest(
                "balance_too_large: the balance after this credit does not fit".into(),
            )),
        }
    };
    run_once(&state, write, first_use).await
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProductBody {
    name: String,
    #[schema(minimum = 0, maximum = 1000000000000i64)]
    price: i64,
    #[serde(default)]
    regions: Vec<String>,
    #[serde(default)]
    delivery_fields: Vec<String>,
    #[serde(default = "default_active")]
    active: bool,
}

fn default_active() -> bool {
    true
}

#[utoipa::path(put, path = "/admin/products/{product_id}", tag = "admin", params(("product_id" = String, Path, description = "1 to 64 characters")), request_body = ProductBody, responses((status = 200, description = "The product as stored", body = ProductOne)), security(("admin_token" = [])))]
pub async fn put_product(
    _admin: Admin,
    path: web::Path<String>,
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let body: ProductBody = json_body(&req, payload).await?;
    let id = path.into_inner();
    let mut v = Violations::default();
    if id.trim() != id || id.is_empty() || id.chars().count() > MAX_PRODUCT_ID_LEN {
        v.add(
            vec!["path".into(), "productId".into()],
            "productId must be 1 to 64 characters without surrounding spaces",
            "string_length",
        );
    }
    v.check(
        !body.name.trim().is_empty() && body.name.chars().count() <= 200,
        || loc!("name"),
        "name must be a non-empty string of at most 200 characters",
        "string_length",
    );
    v.check(
        (0..=MAX_PRICE).contains(&body.price),
        || loc!("price"),
        "price must be a whole number from 0 to 1000000000000",
        "range",
    );
    for (i, region) in body.regions.iter().enumerate() {
        v.check(
            !region.trim().is_empty() && region.chars().count() <= 16,
            || loc!("regions", i),
            "a region is a short non-empty code such as EU",
            "string_length",
        );
    }
    for (i, field) in body.delivery_fields.iter().enumerate() {
        v.check(
            !field.trim().is_empty() && field.chars().count() <= 64,
            || loc!("deliveryFields", i),
            "a delivery field is a non-empty name of at most 64 characters",
            "string_length",
        );
    }
    v.into_result()?;
    let product = Product {
        id,
        name: body.name,
        price: body.price,
        regions: body.regions,
        delivery_fields: body.delivery_fields,
        active: body.active,
        updated_at: now_millis(),
    };
    let (store, stored) = (Arc::clone(&state.store), product.clone());
    state
        .committer
        .write(move || store.put_product(&stored))
        .await??;
    #[derive(serde::Serialize)]
    struct Body<'a> {
        success: bool,
        product: ProductJson<'a>,
    }
    Ok(json_response(to_json(&Body {
        success: true,
        product: (&product).into(),
    })))
}
