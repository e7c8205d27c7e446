//! Running a write at most once per (account, idempotency key): replay, conflict, wait for
//! the request that holds the key, or do the first use and answer only once it is durable.
//!
//! There is no lock here. The port's `replay_lookup` answers only with a row that is on disk
//! (waiting for the flush of a first use still in flight), and the engine refuses a second
//! first use of a key that is taken (`KeyTaken`), so two requests with one key charge once and
//! the later one replays. A request that goes away changes nothing: what decides is the
//! write's own durability, not the request's future.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::bounds::{Deadline, KEY_WAIT};

use actix_web::HttpResponse;

use super::respond::json_response;
use crate::domain::fingerprint::{Fingerprint, Operation};
use crate::domain::idempotency_key::IdempotencyKey;
use crate::domain::ids::AccountId;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::store::{KeyClaim, KeyRecord, Prefetched, Store, StoreError};

/// First uses tried when the key keeps being taken and freed (by the sweeper) in between.
const FIRST_USE_TRIES: usize = 3;

/// What a first use did.
pub(crate) enum FirstUse {
    /// Committed and on disk; the body is the 200 to send.
    Durable(Vec<u8>),
    /// A concurrent first use committed the key first: its row decides (looked up again
    /// when the engine did not read it).
    KeyTaken(crate::store::Taken),
}

/// One idempotent write: who is asking, under which key, for what, until when it waits for
/// the key (`KEY_WAIT` from now, in all: lookups, first uses and their locks) and by when it
/// is answered whatever happens (the request's deadline).
pub(crate) struct KeyedWrite {
    pub(crate) account: AccountId,
    pub(crate) key: IdempotencyKey,
    pub(crate) operation: Operation,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) until: Instant,
    pub(crate) deadline: Deadline,
}

impl KeyedWrite {
    pub(crate) fn new(
        deadline: Deadline,
        account: AccountId,
        key: IdempotencyKey,
        operation: Operation,
        fingerprint: Fingerprint,
    ) -> Self {
        KeyedWrite {
            account,
            key,
            operation,
            fingerprint,
            until: deadline.capped(KEY_WAIT),
            deadline,
        }
    }

    /// The claim its first use records, bounded by the same wait.
    pub(crate) fn claim(&self, ttl: Duration) -> KeyClaim {
        KeyClaim {
            key: self.key.clone(),
            operation: self.operation,
            fingerprint: self.fingerprint,
            ttl,
            wait_until: self.until,
        }
    }
}

/// The key's durable row by `until`, waiting for a first use in flight: one still not durable
/// then is in progress (the 409); a storage that did not answer the read is the 503.
async fn lookup(
    store: &dyn Store,
    metrics: &Metrics,
    write: &KeyedWrite,
    until: Deadline,
) -> Result<Option<KeyRecord>, ApiError> {
    match store
        .replay_lookup(until, write.account, write.key.clone())
        .await
    {
        Ok(found) => Ok(found),
        Err(StoreError::InDoubt(_)) => {
            metrics.key_conflict("in_progress");
            Err(ApiError::InProgress)
        }
        Err(e) => Err(e.into()),
    }
}

/// Replays the key's stored answer, refuses a different request under a used key, or runs
/// `first_use` and returns its answer once durable. `prefetched` is what the port read of the
/// key with the API key: when it is this key's row (or its absence), or the port left the key
/// to its first use, the first lookup is decided on it, not read again.
pub(crate) async fn run_once<F, Fut>(
    store: &dyn Store,
    metrics: &Metrics,
    write: &KeyedWrite,
    prefetched: Prefetched,
    first_use: F,
) -> Result<HttpResponse, ApiError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<FirstUse, ApiError>>,
{
    let mut prefetched = match prefetched {
        Prefetched::Read { key, row } if key == write.key => Some(row),
        // Decided by the first use, which replays a taken key's durable row (`KeyTaken`).
        Prefetched::LeftToFirstUse { key } if key == write.key => Some(None),
        _ => None,
    };
    for _ in 0..FIRST_USE_TRIES {
        let found = match prefetched.take() {
            Some(row) => row,
            None => lookup(store, metrics, write, Deadline::at(write.until)).await?,
        };
        if let Some(record) = found {
            return decide(metrics, write, record);
        }
        let used = match first_use().await {
            // The 402 says the key is free. A first use left to read the key where it writes
            // may have lost every race before it read it (a balance row held elsewhere), and
            // the key's check comes before the balance's (docs/api.md "POST /b2b/orders"): a key already used
            // still decides, by its durable row.
            Err(ApiError::ConcurrentModification) => {
                return match lookup(store, metrics, write, write.deadline).await? {
                    Some(record) => decide(metrics, write, record),
                    None => {
                        metrics.payment_refused("concurrent_balance_modification");
                        Err(ApiError::ConcurrentModification)
                    }
                };
            }
            used => used?,
        };
        match used {
            FirstUse::Durable(body) => return Ok(json_response(body)),
            // Taken by a concurrent first use: its row decides on the next lookup.
            FirstUse::KeyTaken(Some(record)) => return decide(metrics, write, *record),
            // Held past the bound: one last lookup may find the holder's commit.
            FirstUse::KeyTaken(None) if Instant::now() >= write.until => {
                return match lookup(store, metrics, write, write.deadline).await? {
                    Some(record) => decide(metrics, write, record),
                    None => {
                        metrics.key_conflict("in_progress");
                        Err(ApiError::InProgress)
                    }
                }
            }
            FirstUse::KeyTaken(None) => continue,
        }
    }
    metrics.key_conflict("in_progress");
    Err(ApiError::InProgress)
}

/// A write without an idempotency key (allowed where the key is optional): run it, and
/// answer once it is durable.
pub(crate) async fn run_unkeyed<Fut>(first_use: Fut) -> Result<HttpResponse, ApiError>
where
    Fut: Future<Output = Result<FirstUse, ApiError>>,
{
    match first_use.await? {
        FirstUse::Durable(body) => Ok(json_response(body)),
        // A row it needs held elsewhere past the bound: in progress, as for a key.
        FirstUse::KeyTaken(None) => Err(ApiError::InProgress),
        FirstUse::KeyTaken(Some(_)) => Err(ApiError::Internal(
            "a write without a key reported its key taken".into(),
        )),
    }
}

fn decide(
    metrics: &Metrics,
    write: &KeyedWrite,
    record: KeyRecord,
) -> Result<HttpResponse, ApiError> {
    if record.operation == write.operation && record.fingerprint == write.fingerprint {
        metrics.replays.inc();
        let status = actix_web::http::StatusCode::from_u16(record.response.status)
            .map_err(|e| ApiError::Internal(format!("stored status: {e}")))?;
        return Ok(HttpResponse::build(status)
            .content_type(record.response.content_type)
            .insert_header((crate::header_names::IDEMPOTENCY_REPLAYED, "true"))
            .body(record.response.body));
    }
    metrics.key_conflict("different_body");
    Err(ApiError::KeyReused {
        other_operation: record.operation != write.operation,
    })
}
