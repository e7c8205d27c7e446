//! The operator's API (`Authorization: Bearer <admin token>`): accounts, API keys, credits
//! and the catalog. Without `--admin-token` every route here answers 404.

use crate::bounds::Deadline;
use actix_web::{web, HttpResponse};
use serde::Deserialize;

use super::extract::required_idempotency_key;
use super::extract::{Admin, AdminWrite, JsonBody, Violations};
use super::idempotent::{run_once, FirstUse, KeyedWrite};
use super::respond::{json_response, StoreData};
use crate::domain::account::{
    hash_api_key, new_api_key, new_webhook_secret, Account, ApiKeyRecord, Scope,
};
use crate::domain::fingerprint::{Fingerprint, Operation};
use crate::domain::ids::{AccountId, Id, IdKind};
use crate::domain::ledger::LedgerReason;
use crate::domain::limits::{
    MAX_AMOUNT, MAX_DELIVERY_FIELD_LEN, MAX_NAME_LEN, MAX_PRODUCT_ID_LEN, MAX_REASON_LEN,
    MAX_REGION_LEN,
};
use crate::domain::money::Cents;
use crate::domain::product::Product;
use crate::domain::time::{now_millis, parse_rfc3339, rfc3339_exact};
use crate::error::{ApiError, ErrorEnvelope, MoneyIn};
use crate::loc;
use crate::store::{CreditRefusal, NewCredit, Prefetched, Store};
use crate::views::{
    balance_only, to_json, AccountJson, AccountOne, ApiKeyCreated, ApiKeyJson, BalanceOne,
    ProductJson, ProductOne, Success,
};

pub(super) fn account_not_found(id: &str) -> ApiError {
    ApiError::AccountNotFound { id: id.to_string() }
}

/// The id of an account that exists; any other id is `account_not_found`.
pub(super) async fn account_id(
    store: &dyn Store,
    deadline: Deadline,
    id: &str,
) -> Result<AccountId, ApiError> {
    Ok(load_account(store, deadline, id).await?.id)
}

async fn load_account(
    store: &dyn Store,
    deadline: Deadline,
    id: &str,
) -> Result<Account, ApiError> {
    let Some(account_id) = AccountId::parse(id) else {
        return Err(account_not_found(id));
    };
    store
        .account(deadline, account_id)
        .await?
        .ok_or_else(|| account_not_found(id))
}

async fn account_response(
    store: &dyn Store,
    deadline: Deadline,
    account: &Account,
) -> Result<HttpResponse, ApiError> {
    let balance = store.balance(deadline, account.id).await?.available;
    Ok(json_response(to_json(&AccountOne {
        success: true,
        account: AccountJson::new(account, balance),
    })))
}

fn name_ok(name: &str) -> bool {
    !name.trim().is_empty() && name.chars().count() <= MAX_NAME_LEN
}

fn name_message() -> String {
    format!("name must be a non-empty string of at most {MAX_NAME_LEN} characters")
}

fn region_ok(region: &str) -> bool {
    !region.trim().is_empty() && region.chars().count() <= MAX_REGION_LEN
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NewAccountBody {
    name: String,
    #[serde(default)]
    wholesale: bool,
    #[serde(default)]
    credit_limit: i64,
    region: Option<String>,
}

impl JsonBody for NewAccountBody {}

#[utoipa::path(post, path = "/admin/accounts", tag = "admin", summary = "Create an account", request_body = NewAccountBody, responses((status = 200, description = "The new account", body = AccountOne)), security(("admin_token" = [])))]
pub(crate) async fn create_account(
    call: AdminWrite<NewAccountBody>,
) -> Result<HttpResponse, ApiError> {
    let (body, store, deadline) = (call.body, call.store, call.deadline);
    let mut v = Violations::default();
    v.check(
        name_ok(&body.name),
        || loc!("name"),
        name_message(),
        "string_length",
    );
    v.whole_number_in(
        body.credit_limit,
        0..=MAX_AMOUNT,
        || loc!("creditLimit"),
        "creditLimit",
    );
    v.check(
        body.region.as_deref().is_none_or(region_ok),
        || loc!("region"),
        format_args!(
            "region must be a non-empty code of at most {MAX_REGION_LEN} characters, such as EU"
        ),
        "string_length",
    );
    v.into_result()?;
    let account = Account {
        id: AccountId::new(),
        name: body.name.trim().to_string(),
        wholesale: body.wholesale,
        credit_limit: Cents(body.credit_limit),
        region: body.region.map(|r| r.trim().to_string()),
        webhook_secret: new_webhook_secret(),
        created_at: now_millis(),
    };
    store.create_account(deadline, account.clone()).await?;
    // Answered from what was written, not read back: a read that failed now would answer a
    // committed account as not created, and its retry would create a second one.
    Ok(json_response(to_json(&AccountOne {
        success: true,
        account: AccountJson::new(&account, Cents::ZERO),
    })))
}

#[utoipa::path(get, path = "/admin/accounts/{id}", tag = "admin", summary = "Read an account", params(("id" = String, Path, description = "acc_…")), responses((status = 200, description = "The account now", body = AccountOne)), security(("admin_token" = [])))]
pub(crate) async fn get_account(
    _admin: Admin,
    path: web::Path<String>,
    store: StoreData,
    deadline: Deadline,
) -> Result<HttpResponse, ApiError> {
    let account = load_account(&**store, deadline, &path).await?;
    account_response(&**store, deadline, &account).await
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NewApiKeyBody {
    /// Default: all four scopes.
    scopes: Option<Vec<String>>,
    /// The key's end (RFC 3339, in the future): from that instant it answers 401 on every
    /// instance, as a revoked key does. Default: none.
    #[schema(format = DateTime, example = "2027-01-31T00:00:00Z")]
    expires_at: Option<String>,
}

impl JsonBody for NewApiKeyBody {}

#[utoipa::path(post, path = "/admin/accounts/{id}/api-keys", tag = "admin", summary = "Create an API key", params(("id" = String, Path, description = "acc_…")), request_body = NewApiKeyBody, responses((status = 200, description = "The key; its plaintext is shown only here", body = ApiKeyCreated)), security(("admin_token" = [])))]
pub(crate) async fn create_api_key(
    call: AdminWrite<NewApiKeyBody>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let (body, store, deadline) = (call.body, call.store, call.deadline);
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
    let now = now_millis();
    let expires_at = body.expires_at.as_deref().map(parse_rfc3339);
    if let Some(end) = expires_at {
        v.check(
            end.is_some(),
            || loc!("expiresAt"),
            "expiresAt must be an RFC 3339 time, such as 2027-01-31T00:00:00Z",
            "datetime_parsing",
        );
        v.check(
            end.is_none_or(|end| end > now),
            || loc!("expiresAt"),
            "expiresAt must be in the future",
            "datetime_future",
        );
    }
    v.into_result()?;
    let account = load_account(&**store, deadline, &path).await?;
    let plaintext = new_api_key();
    let record = ApiKeyRecord {
        id: Id::new(IdKind::ApiKey).to_string(),
        account_id: account.id,
        scopes,
        revoked: false,
        created_at: now,
        expires_at: expires_at.flatten(),
    };
    store
        .create_api_key(deadline, hash_api_key(&plaintext), record.clone())
        .await?;
    Ok(json_response(to_json(&ApiKeyCreated {
        success: true,
        api_key: ApiKeyJson {
            id: &record.id,
            key: &plaintext,
            scopes: record.scopes.iter().map(|s| s.as_str()).collect(),
            account_id: account.id.to_string(),
            expires_at: record.expires_at.map(rfc3339_exact),
        },
    })))
}

#[utoipa::path(delete, path = "/admin/api-keys/{key_id}", tag = "admin", summary = "Revoke an API key", params(("key_id" = String, Path, description = "key_…")), responses((status = 200, description = "Revoked: the key answers 401 from now on", body = Success)), security(("admin_token" = [])))]
pub(crate) async fn revoke_api_key(
    _admin: Admin,
    path: web::Path<String>,
    store: StoreData,
    deadline: Deadline,
) -> Result<HttpResponse, ApiError> {
    let not_found = || ApiError::ApiKeyNotFound {
        id: path.to_string(),
    };
    let key_id = Id::parse(IdKind::ApiKey, &path).ok_or_else(not_found)?;
    if !store.revoke_api_key(deadline, key_id).await? {
        return Err(not_found());
    }
    Ok(json_response(to_json(&Success { success: true })))
}

#[derive(Deserialize, utoipa::ToSchema)]
pub(crate) struct CreditBody {
    #[schema(minimum = 1, maximum = 1000000000000i64)]
    amount: i64,
    reason: Option<String>,
}

impl JsonBody for CreditBody {}

#[utoipa::path(
    post, path = "/admin/accounts/{id}/credits", tag = "admin", summary = "Credit an account (idempotent)",
    params(("id" = String, Path, description = "acc_…"), super::key_headers::RequiredKey),
    request_body = CreditBody,
    responses(
        (status = 200, description = "Credited; the new balance", body = BalanceOne, headers(("Idempotency-Replayed" = String, description = "\"true\" when this is the stored answer of an earlier request with the same key"))),
        (status = 400, description = "Missing or invalid idempotency key", body = ErrorEnvelope),
        (status = 409, description = "The key was used with a different amount, or is in progress", body = ErrorEnvelope),
    ),
    security(("admin_token" = []))
)]
pub(crate) async fn credit_account(
    call: AdminWrite<CreditBody>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let (body, store, deadline) = (call.body, call.store, call.deadline);
    let (req, settings, metrics) = (call.req, call.settings, call.metrics);
    let mut v = Violations::default();
    v.whole_number_in(body.amount, 1..=MAX_AMOUNT, || loc!("amount"), "amount");
    v.at_most_chars(
        body.reason.as_deref(),
        MAX_REASON_LEN,
        || loc!("reason"),
        "reason",
    );
    v.into_result()?;
    let account = load_account(&**store, deadline, &path).await?;
    let key = required_idempotency_key(&req)?;
    let amount = Cents(body.amount);
    let fingerprint = Fingerprint::of_credit(amount);
    let write = KeyedWrite::new(
        deadline,
        account.id,
        key,
        Operation::AdminCredit,
        fingerprint,
    );
    let credit = || {
        let credit = NewCredit {
            account: account.clone(),
            amount,
            reason: LedgerReason::Credit,
            reference: body.reason.clone().unwrap_or_else(|| "admin credit".into()),
            currency: settings.currency.clone(),
            claim: Some(write.claim(settings.idempotency_ttl)),
            render: balance_only,
        };
        credit_first_use(&**store, deadline, credit)
    };
    run_once(&**store, &metrics, &write, Prefetched::NotRead, credit).await
}

async fn credit_first_use(
    store: &dyn Store,
    deadline: Deadline,
    credit: NewCredit,
) -> Result<FirstUse, ApiError> {
    match store.credit(deadline, credit).await? {
        Ok(body) => Ok(FirstUse::Durable(body)),
        Err(CreditRefusal::KeyTaken(row)) => Ok(FirstUse::KeyTaken(row)),
        Err(CreditRefusal::BalanceOverflow) => Err(ApiError::BalanceTooLarge(MoneyIn::Credit)),
    }
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ProductBody {
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

impl JsonBody for ProductBody {}

fn default_active() -> bool {
    true
}

#[utoipa::path(put, path = "/admin/products/{product_id}", tag = "admin", summary = "Create or replace a product", params(("product_id" = String, Path, description = "1 to 64 characters")), request_body = ProductBody, responses((status = 200, description = "The product as stored", body = ProductOne)), security(("admin_token" = [])))]
pub(crate) async fn put_product(
    call: AdminWrite<ProductBody>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let (body, store, deadline) = (call.body, call.store, call.deadline);
    let id = path.into_inner();
    let mut v = Violations::default();
    if id.trim() != id || id.is_empty() || id.chars().count() > MAX_PRODUCT_ID_LEN {
        v.add(
            vec!["path".into(), "productId".into()],
            format!(
                "productId must be 1 to {MAX_PRODUCT_ID_LEN} characters without surrounding spaces"
            ),
            "string_length",
        );
    }
    v.check(
        name_ok(&body.name),
        || loc!("name"),
        name_message(),
        "string_length",
    );
    v.whole_number_in(body.price, 0..=MAX_AMOUNT, || loc!("price"), "price");
    for (i, region) in body.regions.iter().enumerate() {
        v.check(
            region_ok(region),
            || loc!("regions", i),
            format_args!(
                "a region is a non-empty code of at most {MAX_REGION_LEN} characters, such as EU"
            ),
            "string_length",
        );
    }
    for (i, field) in body.delivery_fields.iter().enumerate() {
        v.check(
            !field.trim().is_empty() && field.chars().count() <= MAX_DELIVERY_FIELD_LEN,
            || loc!("deliveryFields", i),
            format_args!("a delivery field is a non-empty name of at most {MAX_DELIVERY_FIELD_LEN} characters"),
            "string_length",
        );
    }
    v.into_result()?;
    let product = Product {
        id,
        name: body.name,
        price: Cents(body.price),
        regions: body.regions,
        delivery_fields: body.delivery_fields,
        active: body.active,
        updated_at: now_millis(),
    };
    store.put_product(deadline, product.clone()).await?;
    Ok(json_response(to_json(&ProductOne {
        success: true,
        product: ProductJson::from(&product),
    })))
}
