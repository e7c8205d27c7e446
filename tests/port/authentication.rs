//! Authentication with the request's idempotency key: where the engine reads the key's row
//! with the API key (in one round trip, or from memory) it is that key's durable
//! row in the API key's own account and nobody else's; where it does not it says so, and the
//! handler looks the key up, or leaves it to the first use, which then decides as a lookup
//! would.

use orderly::now_millis;
use orderly::IdempotencyKey;
use orderly::{hash_api_key, new_api_key, Account, ApiKeyRecord, Scope};
use orderly::{Id, IdKind};
use orderly::{OrderRefusal, Prefetched, Store};

use crate::conformance;
use crate::fixtures::*;

conformance!(
    a_key_read_with_the_api_key_is_that_accounts_durable_row_or_none,
    a_revoked_api_key_authenticates_with_no_key_row_at_all,
    a_key_given_an_end_reads_back_with_that_end_to_the_millisecond,
);

/// A live key of `account`; its plaintext.
async fn api_key(store: &dyn Store, account: &Account) -> String {
    api_key_ending(store, account, None).await
}

/// A live key of `account` that ends at `expires_at`; its plaintext.
async fn api_key_ending(store: &dyn Store, account: &Account, expires_at: Option<u64>) -> String {
    let plaintext = new_api_key();
    let record = ApiKeyRecord {
        id: Id::new(IdKind::ApiKey).to_string(),
        account_id: account.id,
        scopes: vec![Scope::OrdersWrite],
        revoked: false,
        created_at: now_millis(),
        expires_at,
    };
    store
        .create_api_key(soon(), hash_api_key(&plaintext), record)
        .await
        .unwrap();
    plaintext
}

fn key(text: &str) -> IdempotencyKey {
    IdempotencyKey::parse(text.as_bytes()).unwrap()
}

/// What the port read of `idempotency_key` with `plaintext`.
#[derive(Debug, PartialEq)]
enum Seen {
    /// Left to the handler's lookup.
    NotRead,
    /// Read: the row's body, or none.
    Read(Option<Vec<u8>>),
    /// Left to the first use, which must then decide as a lookup would.
    LeftToFirstUse,
}

async fn prefetched(store: &dyn Store, plaintext: &str, idempotency_key: &str) -> Seen {
    let found = store
        .authenticate_with_key(soon(), hash_api_key(plaintext), Some(key(idempotency_key)))
        .await
        .unwrap()
        .expect("a live key authenticates");
    match found.prefetched {
        Prefetched::NotRead => Seen::NotRead,
        Prefetched::Read { key: read, row } => {
            assert_eq!(read, key(idempotency_key), "the row of the key asked for");
            Seen::Read(row.map(|r| r.response.body))
        }
        Prefetched::LeftToFirstUse { key: left } => {
            assert_eq!(left, key(idempotency_key), "the key asked for");
            Seen::LeftToFirstUse
        }
    }
}

async fn a_key_read_with_the_api_key_is_that_accounts_durable_row_or_none(store: &dyn Store) {
    let mine = account_with(store, 1_000, 0).await;
    let theirs = account_with(store, 1_000, 0).await;
    let my_key = api_key(store, &mine).await;
    let their_key = api_key(store, &theirs).await;
    let body = store
        .place_order(soon(), order(&mine, "k-1", 1))
        .await
        .unwrap()
        .unwrap();

    decides_as_its_row(store, &mine, &my_key, "k-1", &body).await;
    // A second used key, with the API key in memory by now: no copy of its row (a first use
    // keeps none), so both engines may leave it to its first use.
    let later = store
        .place_order(soon(), order(&mine, "k-3", 1))
        .await
        .unwrap()
        .unwrap();
    decides_as_its_row(store, &mine, &my_key, "k-3", &later).await;
    for seen in [
        prefetched(store, &my_key, "k-2").await,
        prefetched(store, &their_key, "k-1").await,
    ] {
        assert!(
            matches!(seen, Seen::NotRead | Seen::Read(None) | Seen::LeftToFirstUse),
            "an unused key (another account's use of the same key is not this account's) has no row: {seen:?}"
        );
    }
}

/// Whatever the port says of `key` (used once, answered `body`) decides as its row would: the
/// row itself, a lookup left to the handler, or a first use that refuses with the row and
/// charges nothing.
async fn decides_as_its_row(
    store: &dyn Store,
    account: &Account,
    plaintext: &str,
    key: &str,
    body: &[u8],
) {
    match prefetched(store, plaintext, key).await {
        Seen::Read(row) => assert_eq!(row.as_deref(), Some(body), "the answer's own bytes"),
        // The handler's lookup waits for a flush in flight: nothing read here.
        Seen::NotRead => {}
        Seen::LeftToFirstUse => {
            let before = store.balance(soon(), account.id).await.unwrap();
            let retried = store.place_order(soon(), order(account, key, 1)).await;
            match retried.unwrap() {
                Err(OrderRefusal::KeyTaken(Some(row))) => {
                    assert_eq!(row.response.body, body, "the first answer's own bytes")
                }
                other => panic!("a first use of a used key must return its row: {other:?}"),
            }
            let after = store.balance(soon(), account.id).await.unwrap();
            assert_eq!(before, after, "charged once");
        }
    }
}

async fn a_revoked_api_key_authenticates_with_no_key_row_at_all(store: &dyn Store) {
    let account = account_with(store, 1_000, 0).await;
    let plaintext = api_key(store, &account).await;
    store
        .place_order(soon(), order(&account, "k-1", 1))
        .await
        .unwrap()
        .unwrap();
    let (record, _) = store
        .authenticate(soon(), hash_api_key(&plaintext))
        .await
        .unwrap()
        .unwrap();
    assert!(store
        .revoke_api_key(soon(), Id::parse(IdKind::ApiKey, &record.id).unwrap())
        .await
        .unwrap());
    let found = store
        .authenticate_with_key(soon(), hash_api_key(&plaintext), Some(key("k-1")))
        .await
        .unwrap();
    assert!(found.is_none(), "a revoked key reads nothing");
}

/// The engines keep a key's end (the API judges it: `ApiKeyRecord::authenticates_at`), past
/// the auth cache too: a fresh key is read from storage, then from memory.
async fn a_key_given_an_end_reads_back_with_that_end_to_the_millisecond(store: &dyn Store) {
    let account = account_with(store, 1_000, 0).await;
    let end = now_millis() + 86_400_001;
    let plaintext = api_key_ending(store, &account, Some(end)).await;
    for read in ["from storage", "again"] {
        let found = store
            .authenticate(soon(), hash_api_key(&plaintext))
            .await
            .unwrap()
            .expect("a key before its end is found");
        assert_eq!(found.0.expires_at, Some(end), "read {read}");
    }
}
