//! Background work through the port: callbacks due and settled with their log, expired keys
//! swept and only those, provider payments credited once.

use std::time::Duration;

use orderly::now_millis;
use orderly::Cents;
use orderly::IdempotencyKey;
use orderly::Operation;
use orderly::{DeliveryAttempt, DeliveryEnd};
use orderly::{DeliveryOutcome, ProviderCredit, Recorded, Store};

use crate::conformance;
use crate::fixtures::*;

conformance!(
    a_callback_retried_is_due_again_under_the_same_event_and_its_log_keeps_every_attempt,
    a_sweep_deletes_only_keys_that_expired_before_now,
    a_provider_payment_repeated_concurrently_credits_once,
);

async fn a_callback_retried_is_due_again_under_the_same_event_and_its_log_keeps_every_attempt(
    store: &dyn Store,
) {
    let account = account_with(store, 1_000, 0).await;
    placed_and_cancelled(store, &account, "w-1", Some("https://partner.example/cb")).await;
    let now = now_millis();
    let due = store
        .due_deliveries(soon(), now, 10, Box::new(|_| true))
        .await
        .unwrap();
    assert_eq!(due.len(), 1);
    let first = due.into_iter().next().unwrap();
    assert_eq!(first.delivery.attempt, 1);
    assert_eq!(first.webhook_secret, account.webhook_secret);
    let event_id = first.event.id.clone();
    let retry_at = now + 60_000;
    let attempt = |n, status| DeliveryAttempt {
        attempt: n,
        at: now,
        status,
        error: None,
    };
    store
        .settle_delivery(
            soon(),
            first,
            DeliveryOutcome::RetryAt(retry_at),
            attempt(1, Some(503)),
        )
        .await
        .unwrap();
    let early = store
        .due_deliveries(soon(), now, 10, Box::new(|_| true))
        .await
        .unwrap();
    assert!(early.is_empty(), "not due before its retry time");
    let due = store
        .due_deliveries(soon(), retry_at, 10, Box::new(|_| true))
        .await
        .unwrap();
    assert_eq!(due.len(), 1);
    let second = due.into_iter().next().unwrap();
    assert_eq!((second.delivery.attempt, &second.event.id), (2, &event_id));
    store
        .settle_delivery(
            soon(),
            second,
            DeliveryOutcome::Finished,
            attempt(2, Some(200)),
        )
        .await
        .unwrap();
    let logs = store
        .delivery_logs(soon(), account.id, vec![event_id])
        .await
        .unwrap();
    let log = logs[0].clone().expect("a log");
    assert_eq!(log.attempts.len(), 2);
    assert_eq!(
        (log.ended, log.next_attempt_at),
        (Some(DeliveryEnd::Delivered), None)
    );
    let after = store
        .due_deliveries(soon(), retry_at + 1, 10, Box::new(|_| true))
        .await
        .unwrap();
    assert!(after.is_empty(), "a finished callback leaves the outbox");
}

async fn a_sweep_deletes_only_keys_that_expired_before_now(store: &dyn Store) {
    let account = account_with(store, 0, 0).await;
    let short = claim("short", Operation::AdminCredit, Duration::from_millis(1));
    let long = claim("long", Operation::AdminCredit, Duration::from_secs(3600));
    store
        .credit(soon(), credit(&account, 1, Some(short)))
        .await
        .unwrap()
        .unwrap();
    store
        .credit(soon(), credit(&account, 1, Some(long)))
        .await
        .unwrap()
        .unwrap();
    let swept = store
        .sweep_expired_keys(soon(), now_millis() + 1_000, 100)
        .await
        .unwrap();
    assert_eq!(swept, 1);
    let gone = IdempotencyKey::parse(b"short").unwrap();
    let kept = IdempotencyKey::parse(b"long").unwrap();
    assert!(store
        .replay_lookup(soon(), account.id, gone)
        .await
        .unwrap()
        .is_none());
    assert!(store
        .replay_lookup(soon(), account.id, kept)
        .await
        .unwrap()
        .is_some());
    assert_eq!(
        store.balance(soon(), account.id).await.unwrap().available.0,
        2,
        "sweeping moves no money"
    );
}

async fn a_provider_payment_repeated_concurrently_credits_once(store: &dyn Store) {
    let account = account_with(store, 0, 0).await;
    let payment = || ProviderCredit {
        provider: "acmepay".into(),
        external_id: "pay-1".into(),
        account: account.id,
        amount: Cents(700),
    };
    let copies = (0..10).map(|_| store.record_provider_payment(soon(), payment()));
    let outcomes = futures::future::join_all(copies).await;
    let credited = outcomes
        .iter()
        .filter(|o| matches!(o, Ok(Ok(Recorded::Credited))))
        .count();
    let duplicate = outcomes
        .iter()
        .filter(|o| matches!(o, Ok(Ok(Recorded::Duplicate))))
        .count();
    assert_eq!((credited, duplicate), (1, 9), "{outcomes:?}");
    assert_eq!(
        store.balance(soon(), account.id).await.unwrap().available.0,
        700
    );
    assert_eq!(ledger(store, &account).await.len(), 1);
}
