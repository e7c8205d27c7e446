//! Extractors that decide who is calling (401/403 before anything else), and the JSON body
//! reader that turns every schema violation into the 422 validation envelope.
//!
//! A write's body is read by `WriteCall` once its caller is decided, so a body's 422 never
//! overtakes the 401. The partner extractor awaits the port, whose reads answer at once unless
//! a write of that very account is being flushed.

use std::future::{ready, Future, Ready};
use std::marker::PhantomData;
use std::pin::Pin;

use actix_web::dev::Payload;
use actix_web::http::header::HeaderName;
use actix_web::{web, FromRequest, HttpMessage, HttpRequest};
use serde::de::DeserializeOwned;

use crate::bounds::{Deadline, REQUEST_DEADLINE};
use crate::config::Settings;
use crate::credentials::Credentials;
use crate::domain::account::{hash_api_key, Account, Scope};
use crate::domain::idempotency_key::{IdempotencyKey, KeyError};
use crate::domain::time::now_millis;
use crate::error::{ApiError, FieldError};
use crate::header_names as names;
use crate::metrics::Metrics;
use crate::store::{Authenticated, Prefetched, Store};

use crate::domain::limits::MAX_BODY_BYTES;

/// A scope a route requires, as a type so it is part of the handler's signature.
pub(crate) trait RequiredScope {
    const SCOPE: Scope;
}

macro_rules! scope_marker {
    ($name:ident, $scope:expr) => {
        pub(crate) struct $name;
        impl RequiredScope for $name {
            const SCOPE: Scope = $scope;
        }
    };
}

scope_marker!(OrdersWrite, Scope::OrdersWrite);
scope_marker!(OrdersRead, Scope::OrdersRead);
scope_marker!(BalanceRead, Scope::BalanceRead);
scope_marker!(CatalogRead, Scope::CatalogRead);

/// A wholesale partner whose key carries scope `S`, and what the port read of the request's
/// idempotency key beside the API key (a replay's row, on PostgreSQL: one round trip).
pub(crate) struct Partner<S> {
    pub(crate) account: Account,
    pub(crate) prefetched: Prefetched,
    _scope: PhantomData<S>,
}

/// `gc_live_` and 32 lowercase hex digits.
fn well_formed_api_key(key: &str) -> bool {
    key.strip_prefix("gc_live_").is_some_and(|hex| {
        hex.len() == 32
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// The request's deadline, as the edge stamped it (`edge::deadline`).
impl FromRequest for Deadline {
    // Never refused; actix's own error type keeps the HTTP surface's `ApiError` out of the
    // library's public interface (`Deadline` is public).
    type Error = actix_web::Error;
    type Future = Ready<Result<Self, actix_web::Error>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(Ok(deadline_of(req)))
    }
}

/// The deadline the edge stamped on `req`; a request that did not pass the edge (none in
/// the server) gets the default one from now.
pub(crate) fn deadline_of(req: &HttpRequest) -> Deadline {
    req.extensions()
        .get::<Deadline>()
        .copied()
        .unwrap_or_else(|| Deadline::after(REQUEST_DEADLINE))
}

async fn authenticate<S: RequiredScope>(
    deadline: Deadline,
    key_hash: Option<[u8; 32]>,
    idempotency_key: Option<IdempotencyKey>,
    store: Option<web::Data<dyn Store>>,
) -> Result<Partner<S>, ApiError> {
    let key_hash = key_hash.ok_or(ApiError::Unauthorized)?;
    let store = store.ok_or_else(|| ApiError::Internal("the store is not configured".into()))?;
    let Authenticated {
        record,
        account,
        prefetched,
    } = store
        .authenticate_with_key(deadline, key_hash, idempotency_key)
        .await?
        .ok_or(ApiError::Unauthorized)?;
    // A key past its end is refused as a revoked one is (the engines leave out only revoked
    // keys: an end is a business rule, judged here on every instance).
    if !record.authenticates_at(now_millis()) {
        return Err(ApiError::Unauthorized);
    }
    if !account.wholesale {
        return Err(ApiError::NotWholesale);
    }
    if !record.scopes.contains(&S::SCOPE) {
        return Err(ApiError::ScopeMissing);
    }
    Ok(Partner {
        account,
        prefetched,
        _scope: PhantomData,
    })
}

impl<S: RequiredScope + 'static> FromRequest for Partner<S> {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, ApiError>>>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let key_hash = req
            .headers()
            .get(names::X_API_KEY)
            .and_then(|v| v.to_str().ok())
            .filter(|k| well_formed_api_key(k))
            .map(hash_api_key);
        let store = req.app_data::<web::Data<dyn Store>>().cloned();
        let idempotency_key = named_idempotency_key(req);
        Box::pin(authenticate(
            deadline_of(req),
            key_hash,
            idempotency_key,
            store,
        ))
    }
}

/// The operator, proven by `Authorization: Bearer <admin token>`.
pub(crate) struct Admin;

fn authenticate_admin(req: &HttpRequest) -> Result<Admin, ApiError> {
    let credentials = req
        .app_data::<web::Data<Credentials>>()
        .filter(|c| c.admin_enabled());
    let Some(credentials) = credentials else {
        // Without an admin token the admin API does not exist.
        return Err(ApiError::RouteNotFound);
    };
    let presented = req
        .headers()
        .get(names::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token)
        .ok_or(ApiError::AdminUnauthorized)?;
    let name = credentials
        .admin_token(presented.trim())
        .ok_or(ApiError::AdminUnauthorized)?;
    // For the request's log line (edge/request_log.rs): the token's name, never its value.
    req.extensions_mut().insert(name);
    Ok(Admin)
}

impl FromRequest for Admin {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(authenticate_admin(req))
    }
}

/// Reads and parses a JSON body after the caller is known. Wrong content type, malformed
/// JSON, wrong types and a body over 1 MiB are all 422 with the path of the fault in `loc`.
async fn json_body<T: DeserializeOwned>(
    req: &HttpRequest,
    payload: web::Payload,
) -> Result<T, ApiError> {
    let bytes = read_body(req, payload).await?;
    require_json_content_type(req)?;
    parse_json(&bytes)
}

/// For routes whose body may be left out (cancel, a refund of the whole remainder): an empty
/// body without a Content-Type reads as `{}`; a body that is there is JSON as on every other
/// write, refused (422) unless its Content-Type says so.
async fn optional_json_body<T: DeserializeOwned>(
    req: &HttpRequest,
    payload: web::Payload,
) -> Result<T, ApiError> {
    let bytes = read_body(req, payload).await?;
    let empty = bytes.iter().all(u8::is_ascii_whitespace);
    if empty && !req.headers().contains_key(names::CONTENT_TYPE) {
        return parse_json(b"{}");
    }
    require_json_content_type(req)?;
    parse_json(if empty { b"{}" } else { &bytes })
}

/// A route's JSON body, as `WriteCall` reads it.
pub(crate) trait JsonBody: DeserializeOwned + 'static {
    /// Whether the body may be left out (`optional_json_body`); otherwise `json_body`.
    const OPTIONAL: bool = false;
}

/// What every write handler starts from, decided in the contract's order: the caller (`A`:
/// `Admin`, or a `Partner`, its 401 and 403 first), then the body (`B`, its 422); with the
/// request (its idempotency key is read by each handler where the contract puts it), the
/// store, the settings, the metrics and the request's deadline. One extractor, because actix
/// polls a handler's extractors together: a body read beside a `Partner` still reading its
/// key could answer its 422 before the 401.
pub(crate) struct WriteCall<A, B> {
    pub(crate) caller: A,
    pub(crate) body: B,
    pub(crate) req: HttpRequest,
    pub(crate) store: web::Data<dyn Store>,
    pub(crate) settings: web::Data<Settings>,
    pub(crate) metrics: web::Data<Metrics>,
    pub(crate) deadline: Deadline,
}

/// An operator's write.
pub(crate) type AdminWrite<B> = WriteCall<Admin, B>;

impl<A, B> FromRequest for WriteCall<A, B>
where
    A: FromRequest<Error = ApiError> + 'static,
    B: JsonBody,
{
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, ApiError>>>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let caller = A::from_request(req, &mut Payload::None);
        let payload = web::Payload::from_request(req, payload);
        let req = req.clone();
        Box::pin(async move {
            let caller = caller.await?;
            // Taking the payload cannot fail.
            let payload = payload
                .await
                .map_err(|e| ApiError::Internal(e.to_string()))?;
            let body = if B::OPTIONAL {
                optional_json_body(&req, payload).await?
            } else {
                json_body(&req, payload).await?
            };
            Ok(WriteCall {
                caller,
                body,
                store: app_data(&req, "the store")?,
                settings: app_data(&req, "the settings")?,
                metrics: app_data(&req, "the metrics")?,
                deadline: deadline_of(&req),
                req,
            })
        })
    }
}

/// One of the server's shared values, as `web::Data` would extract it.
fn app_data<T: ?Sized + 'static>(req: &HttpRequest, what: &str) -> Result<web::Data<T>, ApiError> {
    req.app_data::<web::Data<T>>()
        .cloned()
        .ok_or_else(|| ApiError::Internal(format!("{what} is not configured")))
}

fn require_json_content_type(req: &HttpRequest) -> Result<(), ApiError> {
    let is_json = req
        .headers()
        .get(names::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"));
    if is_json {
        Ok(())
    } else {
        Err(ApiError::validation(
            vec!["body".into()],
            "Content-Type must be application/json",
            "content_type",
        ))
    }
}

/// The whole body, read by the request's deadline: a client that has not sent it by then is
/// answered that nothing was done (503), like a request the storage did not serve in time.
pub(crate) async fn read_body(
    req: &HttpRequest,
    payload: web::Payload,
) -> Result<web::Bytes, ApiError> {
    let deadline = deadline_of(req).instant().into();
    let read = tokio::time::timeout_at(deadline, payload.to_bytes_limited(MAX_BODY_BYTES));
    let Ok(read) = read.await else {
        return Err(ApiError::Storage(crate::store::StoreError::TimedOut(
            "the body did not arrive by the deadline".into(),
        )));
    };
    // The outer result is the limit's, the inner one the read's.
    match read {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(e)) => Err(ApiError::validation(
            vec!["body".into()],
            format!("the body could not be read: {e}"),
            "body_error",
        )),
        Err(_) => Err(ApiError::validation(
            vec!["body".into()],
            "the body is larger than 1 MiB",
            "too_large",
        )),
    }
}

pub(crate) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    // The plain parse first: tracking the path costs a third of the parse on every request,
    // and only a rejected body needs it, so only then is the body parsed again to say where.
    if let Ok(value) = serde_json::from_slice(bytes) {
        if let Some(loc) = nul_path(bytes) {
            return Err(ApiError::validation(
                loc,
                "text must not contain U+0000",
                "string_nul",
            ));
        }
        return Ok(value);
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de)
        .map_err(|e| ApiError::Validation(vec![field_error(&e)]))?;
    de.end().map_err(|e| {
        ApiError::validation(
            vec!["body".into()],
            format!("trailing characters after the JSON value: {e}"),
            "json_invalid",
        )
    })?;
    Ok(value)
}

/// The path of the first string (a key or a value) that holds U+0000, if any. This is the
/// one place that refuses it, for every field of every body and so for every engine:
/// PostgreSQL's text and jsonb cannot store it, and the same input must get the same answer
/// everywhere, before anything is stored (docs/contract.md "5. Failures").
fn nul_path(bytes: &[u8]) -> Option<Vec<serde_json::Value>> {
    // JSON carries U+0000 only as the escape `\u0000`, so a body without those six bytes
    // (nearly every body) has none and is not parsed again.
    memchr::memmem::find(bytes, b"\\u0000")?;
    let value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    let mut loc = vec!["body".into()];
    first_nul(&value, &mut loc).then_some(loc)
}

/// Whether `value` holds U+0000 somewhere; `loc` is then extended to where.
fn first_nul(value: &serde_json::Value, loc: &mut Vec<serde_json::Value>) -> bool {
    use serde_json::Value;
    match value {
        Value::String(text) => text.contains('\0'),
        Value::Array(items) => items.iter().enumerate().any(|(index, item)| {
            loc.push(index.into());
            let found = first_nul(item, loc);
            if !found {
                loc.pop();
            }
            found
        }),
        Value::Object(fields) => fields.iter().any(|(key, item)| {
            loc.push(key.clone().into());
            let found = key.contains('\0') || first_nul(item, loc);
            if !found {
                loc.pop();
            }
            found
        }),
        _ => false,
    }
}

fn field_error(e: &serde_path_to_error::Error<serde_json::Error>) -> FieldError {
    use serde_path_to_error::Segment;
    let mut loc: Vec<serde_json::Value> = vec!["body".into()];
    for segment in e.path().iter() {
        match segment {
            Segment::Seq { index } => loc.push((*index).into()),
            Segment::Map { key } => loc.push(key.clone().into()),
            Segment::Enum { variant } => loc.push(variant.clone().into()),
            Segment::Unknown => {}
        }
    }
    let inner = e.inner();
    let message = inner.to_string();
    // serde reports a missing field at its parent; FastAPI-style `loc` names the field.
    if let Some(field) = message
        .strip_prefix("missing field `")
        .and_then(|m| m.split('`').next())
    {
        loc.push(field.to_string().into());
        return FieldError {
            loc,
            msg: "Field required".into(),
            kind: "missing",
        };
    }
    let kind = match inner.classify() {
        serde_json::error::Category::Syntax
        | serde_json::error::Category::Eof
        | serde_json::error::Category::Io => "json_invalid",
        serde_json::error::Category::Data if message.starts_with("invalid type") => "type_error",
        serde_json::error::Category::Data => "value_error",
    };
    // Strip serde's " at line 1 column 5" suffix: the path already says where.
    let msg = match message.rfind(" at line ") {
        Some(cut) => message[..cut].to_string(),
        None => message,
    };
    FieldError { loc, msg, kind }
}

/// Collects schema rules checked after parsing (lengths, ranges), each with its path.
#[derive(Default)]
pub(crate) struct Violations(Vec<FieldError>);

impl Violations {
    pub(crate) fn add(
        &mut self,
        loc: Vec<serde_json::Value>,
        msg: impl Into<String>,
        kind: &'static str,
    ) {
        self.0.push(FieldError {
            loc,
            msg: msg.into(),
            kind,
        });
    }

    /// Adds `msg` at `loc` when `ok` is false. Both are made only then: a rule's message
    /// may name its bound (`format_args!`), and every order checks several rules per line.
    pub(crate) fn check(
        &mut self,
        ok: bool,
        loc: impl FnOnce() -> Vec<serde_json::Value>,
        msg: impl std::fmt::Display,
        kind: &'static str,
    ) {
        if !ok {
            self.add(loc(), msg.to_string(), kind);
        }
    }

    /// `{field} must be a whole number from {low} to {high}` when `value` is outside.
    pub(crate) fn whole_number_in(
        &mut self,
        value: i64,
        range: std::ops::RangeInclusive<i64>,
        loc: impl FnOnce() -> Vec<serde_json::Value>,
        field: &str,
    ) {
        if !range.contains(&value) {
            let (low, high) = range.into_inner();
            self.add(
                loc(),
                format!("{field} must be a whole number from {low} to {high}"),
                "range",
            );
        }
    }

    /// `{field} must be at most {max} characters` when an optional text is longer.
    pub(crate) fn at_most_chars(
        &mut self,
        value: Option<&str>,
        max: usize,
        loc: impl FnOnce() -> Vec<serde_json::Value>,
        field: &str,
    ) {
        if value.is_some_and(|text| text.chars().count() > max) {
            self.add(
                loc(),
                format!("{field} must be at most {max} characters"),
                "string_length",
            );
        }
    }

    pub(crate) fn into_result(self) -> Result<(), ApiError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(ApiError::Validation(self.0))
        }
    }
}

/// `["body", ...]` from string and index parts.
#[macro_export]
macro_rules! loc {
    ($($part:expr),* $(,)?) => {
        vec![serde_json::Value::from("body"), $(serde_json::Value::from($part)),*]
    };
}

/// The idempotency key the request names, by either spelling of its header.
fn idempotency_key(req: &HttpRequest) -> Result<IdempotencyKey, KeyError> {
    let values = |name: HeaderName| -> Vec<&[u8]> {
        req.headers().get_all(name).map(|v| v.as_bytes()).collect()
    };
    IdempotencyKey::from_headers(
        &values(names::X_IDEMPOTENCY_KEY),
        &values(names::IDEMPOTENCY_KEY),
    )
}

/// The idempotency key of a write that requires one (handler step 1).
pub(crate) fn required_idempotency_key(req: &HttpRequest) -> Result<IdempotencyKey, ApiError> {
    idempotency_key(req).map_err(|e| match e {
        KeyError::Missing => ApiError::KeyRequired,
        KeyError::Invalid(reason) => ApiError::InvalidKey { reason },
    })
}

/// The request's idempotency key when it names a well-formed one (read ahead with the API
/// key; the handler's own parse decides what a missing or malformed one is answered).
pub(crate) fn named_idempotency_key(req: &HttpRequest) -> Option<IdempotencyKey> {
    idempotency_key(req).ok()
}

/// The idempotency key of a write where it is optional: absent is `None`, malformed is 400.
pub(crate) fn optional_idempotency_key(
    req: &HttpRequest,
) -> Result<Option<IdempotencyKey>, ApiError> {
    match idempotency_key(req) {
        Ok(key) => Ok(Some(key)),
        Err(KeyError::Missing) => Ok(None),
        Err(KeyError::Invalid(reason)) => Err(ApiError::InvalidKey { reason }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct Body {
        items: Vec<Item>,
    }
    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct Item {
        #[serde(rename = "deliveryData")]
        delivery_data: std::collections::BTreeMap<String, String>,
    }

    fn loc_of(json: &str) -> Vec<serde_json::Value> {
        match parse_json::<Body>(json.as_bytes()) {
            Err(ApiError::Validation(detail)) => detail[0].loc.clone(),
            other => panic!("expected a 422, got {other:?}"),
        }
    }

    #[test]
    fn a_number_in_delivery_data_is_located_by_its_path() {
        let loc = loc_of(r#"{"items":[{"deliveryData":{"username":5}}]}"#);
        assert_eq!(loc, loc!("items", 0, "deliveryData", "username"));
    }

    #[test]
    fn a_missing_field_is_located_at_the_field() {
        assert_eq!(loc_of("{}"), loc!("items"));
    }

    #[test]
    fn malformed_json_is_a_422_in_the_body() {
        match parse_json::<Body>(b"{\"items\": [") {
            Err(ApiError::Validation(detail)) => {
                assert_eq!(detail[0].loc[0], "body");
                assert_eq!(detail[0].kind, "json_invalid");
            }
            other => panic!("expected a 422, got {other:?}"),
        }
    }

    #[test]
    fn api_keys_must_be_well_formed() {
        assert!(well_formed_api_key(
            "gc_live_0123456789abcdef0123456789abcdef"
        ));
        assert!(!well_formed_api_key(
            "gc_live_0123456789ABCDEF0123456789abcdef"
        ));
        assert!(!well_formed_api_key(
            "gc_test_0123456789abcdef0123456789abcdef"
        ));
        assert!(!well_formed_api_key("gc_live_0123"));
    }
}
