//! Running a write at most once per (account, idempotency key): replay, conflict, wait for
//! the request that holds the key, or do the first use and answer only once it is durable.
//!
//! Requests that share a key are serialized by a fixed array of async mutexes indexed by a
//! hash of the pair: no map to grow or clean. A first use holds its stripe from before its
//! lookup until its commit is on disk, so anyone who finds its rows and then gets the stripe
//! knows those rows are durable: a replay never reports a charge a crash could still undo.

use std::collections::hash_map::DefaultHasher;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::time::Duration;

use actix_web::HttpResponse;
use tokio::sync::{Mutex, MutexGuard};

use super::error::ApiError;
use super::AppState;
use crate::domain::fingerprint::{Fingerprint, Operation};
use crate::domain::idempotency_key::IdempotencyKey;
use crate::metrics::Metrics;
use crate::store::idempotency::KeyRecord;

const STRIPES: usize = 1024;
/// How long a request waits for another request holding the same key.
pub const KEY_WAIT: Duration = Duration::from_secs(5);

pub struct KeyLocks {
    stripes: Vec<Mutex<()>>,
}

impl Default for KeyLocks {
    fn default() -> Self {
        KeyLocks {
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
        }
    }
}

impl KeyLocks {
    fn stripe(&self, account: &[u8; 16], key: &IdempotencyKey) -> &Mutex<()> {
        let mut hasher = DefaultHasher::new();
        account.hash(&mut hasher);
        key.hash(&mut hasher);
        &self.stripes[(hasher.finish() as usize) % STRIPES]
    }
}

/// What a first use did.
pub enum FirstUse {
    /// Committed and on disk; the body is the 200 to send.
    Durable(Vec<u8>),
    /// A concurrent first use committed the key first: decide again from its rows.
    KeyTaken,
}

/// One idempotent write: who is asking, under which key, for what.
pub struct KeyedWrite<'a> {
    pub account: [u8; 16],
    pub key: &'a IdempotencyKey,
    pub operation: Operation,
    pub fingerprint: Fingerprint,
}

/// Takes the stripe, waiting at most `KEY_WAIT` for the request that holds it.
async fn hold<'a>(
    metrics: &Metrics,
    stripe: &'a Mutex<()>,
) -> Result<MutexGuard<'a, ()>, ApiError> {
    if let Ok(guard) = stripe.try_lock() {
        return Ok(guard);
    }
    tokio::time::timeout(KEY_WAIT, stripe.lock())
        .await
        .map_err(|_| {
            metrics.key_conflict("in_progress");
            ApiError::Conflict("Duplicate request in progress, retry later".into())
        })
}

/// Replays `first_use`'s stored answer, refuses a different request under a used key, or
/// runs `first_use` and returns its answer once durable.
pub async fn run_once<F, Fut>(
    state: &AppState,
    write: KeyedWrite<'_>,
    first_use: F,
) -> Result<HttpResponse, ApiError>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<FirstUse, ApiError>>,
{
    let stripe = state.key_locks.stripe(&write.account, write.key);
    // Fast path for a used key: its rows decide as soon as the stripe shows them durable.
    if let Some(record) = state.store.replay_lookup(&write.account, write.key)? {
        let _durable = hold(&state.metrics, stripe).await?;
        return decide(state, &write, record);
    }
    let _held = hold(&state.metrics, stripe).await?;
    if let Some(record) = state.store.replay_lookup(&write.account, write.key)? {
        return decide(state, &write, record);
    }
    match first_use().await? {
        FirstUse::Durable(body) => Ok(json_response(body)),
        FirstUse::KeyTaken => match state.store.replay_lookup(&write.account, write.key)? {
            Some(record) => decide(state, &write, record),
            None => Err(ApiError::Internal(
                "key reported taken but has no rows".into(),
            )),
        },
    }
}

/// A write without an idempotency key (allowed where the key is optional): run it, and
/// answer once it is durable.
pub async fn run_unkeyed<F, Fut>(first_use: F) -> Result<HttpResponse, ApiError>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<FirstUse, ApiError>>,
{
    match first_use().await? {
        FirstUse::Durable(body) => Ok(json_response(body)),
        FirstUse::KeyTaken => Err(ApiError::Internal(
            "a write without a key reported its key taken".into(),
        )),
    }
}

fn decide(
    state: &AppState,
    write: &KeyedWrite,
    record: KeyRecord,
) -> Result<HttpResponse, ApiError> {
    let binding = &record.binding;
    if binding.operation == write.operation && binding.fingerprint == write.fingerprint {
        state.metrics.replays.inc();
        let status = actix_web::http::StatusCode::from_u16(record.response.status)
            .map_err(|e| ApiError::Internal(format!("stored status: {e}")))?;
        return Ok(HttpResponse::build(status)
            .content_type(record.response.content_type)
            .insert_header(("Idempotency-Replayed", "true"))
            .body(record.response.body));
    }
    state.metrics.key_conflict("different_body");
    let detail = if binding.operation != write.operation {
        "this key was already used for another kind of request; use a new key for a new operation"
    } else {
        "this key was already used with a different request body; use a new key for a new operation"
    };
    Err(ApiError::Conflict(format!(
        "idempotency_key_reused_with_different_body: {detail}"
    )))
}

pub fn json_response(body: Vec<u8>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_key_held_past_the_wait_is_the_in_progress_conflict() {
        let metrics = Metrics::default();
        let stripe = Mutex::new(());
        let _held_elsewhere = stripe.lock().await;
        match hold(&metrics, &stripe).await {
            Err(ApiError::Conflict(message)) => {
                assert_eq!(message, "Duplicate request in progress, retry later")
            }
            other => panic!("expected the in-progress 409, got {:?}", other.map(|_| ())),
        }
        assert!(metrics.render().contains("reason=\"in_progress\"} 1"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_released_within_the_wait_is_taken() {
        let metrics = Metrics::default();
        let stripe = std::sync::Arc::new(Mutex::new(()));
        let guard = std::sync::Arc::clone(&stripe).lock_owned().await;
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            drop(guard);
        });
        assert!(hold(&metrics, &stripe).await.is_ok());
    }
}
