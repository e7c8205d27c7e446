//! A backup held in flight on sled (its walk waits at `before_walk`) while writes go on: the
//! writes are answered in time, whatever they are, and the backup is its instant's store.
//!
//! sled-only: the hook that holds the walk is the embedded engine's (PostgreSQL's snapshot is
//! its REPEATABLE READ transaction, whose instant the port suite's snapshot case covers).

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use orderly::now_millis;
use orderly::Deadline;
use orderly::{checked_counts, Record, Store};
use orderly::{hash_api_key, new_api_key, Account, ApiKeyRecord, Scope};
use orderly::{Id, IdKind};

use crate::fixtures::*;

/// A gate the walk waits at until the test opens it (at most a minute: a test never hangs).
#[derive(Clone, Default)]
struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    fn wait(&self) {
        let (open, opened) = &*self.0;
        let guard = open.lock().unwrap();
        let _ = opened
            .wait_timeout_while(guard, Duration::from_secs(60), |open| !*open)
            .unwrap();
    }

    fn open(&self) {
        let (open, opened) = &*self.0;
        *open.lock().unwrap() = true;
        opened.notify_all();
    }
}

/// Within the deadline a partner's client would give up after.
fn in_time() -> Deadline {
    Deadline::after(Duration::from_secs(5))
}

fn key_record(account: &Account) -> ApiKeyRecord {
    ApiKeyRecord {
        id: Id::new(IdKind::ApiKey).to_string(),
        account_id: account.id,
        scopes: vec![Scope::OrdersWrite],
        revoked: false,
        created_at: now_millis(),
        expires_at: None,
    }
}

/// sled 0.34.7's subscribers, which the backup used to learn what changed, lose every event
/// after a write of the same bytes (the second revocation), and after 1,024 more writes to the
/// tree block the writer inside its commit: every write after that failed until a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_revoked_twice_and_1500_keys_created_while_a_backup_walks_are_answered_and_stay_out_of_it(
) {
    let gate = Gate::default();
    let waiting = gate.clone();
    let opened = crate::engines::embedded_with_walk_gate(Arc::new(move || waiting.wait())).await;
    let store: &dyn Store = &*opened.store;
    let account = account_with(store, 1_000 * PRICE, 0).await;
    let revoked = key_record(&account);
    store
        .create_api_key(soon(), hash_api_key(&new_api_key()), revoked.clone())
        .await
        .unwrap();
    for i in 0..10 {
        store
            .place_order(soon(), order(&account, &format!("before-{i}"), 1))
            .await
            .unwrap()
            .unwrap();
    }

    let snapshot = store.snapshot(soon()).await.unwrap();
    let key_id = Id::parse(IdKind::ApiKey, &revoked.id).unwrap();
    for _ in 0..2 {
        assert!(store.revoke_api_key(in_time(), key_id).await.unwrap());
    }
    for chunk in 0..75 {
        let created = (0..20).map(|_| {
            store.create_api_key(
                in_time(),
                hash_api_key(&new_api_key()),
                key_record(&account),
            )
        });
        for outcome in futures::future::join_all(created).await {
            outcome.unwrap_or_else(|e| panic!("a key created in chunk {chunk}: {e}"));
        }
    }
    for i in 0..10 {
        store
            .place_order(in_time(), order(&account, &format!("during-{i}"), 1))
            .await
            .unwrap()
            .unwrap();
    }
    gate.open();
    let records = snapshot.collect().await.unwrap();

    checked_counts(&records).expect("the backup adds up");
    let keys: Vec<&ApiKeyRecord> = records
        .iter()
        .filter_map(|r| match r {
            Record::ApiKey { record, .. } => Some(record),
            _ => None,
        })
        .collect();
    assert_eq!(keys.len(), 1, "only the key that existed at the instant");
    assert!(!keys[0].revoked, "revoked after the instant");
    let orders = records
        .iter()
        .filter(|r| matches!(r, Record::Order(_)))
        .count();
    assert_eq!(
        orders, 10,
        "the orders placed before the instant, none after"
    );
    opened.close().await;
}
