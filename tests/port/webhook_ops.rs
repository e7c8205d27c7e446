//! Webhook operations through the port: a rotation's replaced secret travels with each due
//! delivery, a redelivery takes over a callback whose attempt is in flight, and recovery
//! takes exactly what was given up since the time given.

use std::time::Duration;

use orderly::now_millis;
use orderly::{AccountId, Id, IdKind};
use orderly::{DeliveryAttempt, DeliveryEnd};
use orderly::{DeliveryOutcome, Redelivered, Store};

use crate::conformance;
use crate::fixtures::*;

conformance!(
    a_rotation_keeps_the_replaced_secret_with_its_end_and_due_deliveries_carry_both,
    a_redelivery_during_an_attempt_in_flight_is_due_after_it_and_the_attempt_only_logs,
    recovery_redelivers_exactly_the_callbacks_given_up_since_the_time_given,
);

const URL: Option<&str> = Some("https://partner.example/cb");

fn attempt(n: u32, at: u64, status: u16) -> DeliveryAttempt {
    DeliveryAttempt {
        attempt: n,
        at,
        status: Some(status),
        error: None,
    }
}

async fn a_rotation_keeps_the_replaced_secret_with_its_end_and_due_deliveries_carry_both(
    store: &dyn Store,
) {
    let account = account_with(store, 1_000, 0).await;
    let now = now_millis();
    let hour = Duration::from_secs(3600);
    let first = store
        .rotate_webhook_secret(soon(), account.id, "whsec_c2Vjb25k".into(), now, hour)
        .await
        .unwrap()
        .expect("the account exists");
    assert_eq!(first.secret, account.webhook_secret);
    assert_eq!(first.valid_until, now + 3_600_000);
    let second = store
        .rotate_webhook_secret(soon(), account.id, "whsec_dGhpcmQ=".into(), now + 1, hour)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        second.secret, "whsec_c2Vjb25k",
        "only the secret replaced is kept"
    );
    let shown = store.account(soon(), account.id).await.unwrap().unwrap();
    assert_eq!(shown.webhook_secret, "whsec_dGhpcmQ=");

    placed_and_cancelled(store, &account, "rot-1", URL).await;
    let due = store
        .due_deliveries(soon(), now_millis(), 10, Box::new(|_| true))
        .await
        .unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].webhook_secret, "whsec_dGhpcmQ=");
    assert_eq!(due[0].previous_secret.as_ref(), Some(&second));
    let nobody = store
        .rotate_webhook_secret(soon(), AccountId::new(), "whsec_eA==".into(), now, hour)
        .await
        .unwrap();
    assert!(nobody.is_none());
}

async fn a_redelivery_during_an_attempt_in_flight_is_due_after_it_and_the_attempt_only_logs(
    store: &dyn Store,
) {
    let account = account_with(store, 1_000, 0).await;
    let other = account_with(store, 0, 0).await;
    placed_and_cancelled(store, &account, "in-flight", URL).await;
    let now = now_millis();
    let mut due = store
        .due_deliveries(soon(), now, 10, Box::new(|_| true))
        .await
        .unwrap();
    assert_eq!(due.len(), 1, "the attempt is taken (and claimed)");
    let in_flight = due.remove(0);
    let event = Id::parse(IdKind::Event, &in_flight.event.id).unwrap();

    let refused = store
        .redeliver(soon(), event, Some(other.id), now)
        .await
        .unwrap();
    assert_eq!(refused, Redelivered::NotFound, "another account's event");
    let queued = store
        .redeliver(soon(), event, Some(account.id), now)
        .await
        .unwrap();
    assert_eq!(queued, Redelivered::Queued);
    // The attempt that was in flight fails for good, after the redelivery was queued.
    store
        .settle_delivery(
            soon(),
            in_flight,
            DeliveryOutcome::Finished,
            attempt(1, now, 410),
        )
        .await
        .unwrap();

    let again = store
        .due_deliveries(soon(), now_millis() + 10, 10, Box::new(|_| true))
        .await
        .unwrap();
    assert_eq!(
        again.len(),
        1,
        "the redelivery is still queued, and free to take"
    );
    assert_eq!(again[0].event.id, event.to_string());
    let log = store
        .delivery_logs(soon(), account.id, vec![event.to_string()])
        .await
        .unwrap()
        .remove(0)
        .expect("the attempt is logged");
    assert_eq!(log.attempts.len(), 1);
    assert_eq!(log.ended, None, "the redelivery decides what comes next");
}

async fn recovery_redelivers_exactly_the_callbacks_given_up_since_the_time_given(
    store: &dyn Store,
) {
    let account = account_with(store, 10_000, 0).await;
    let now = now_millis();
    // Two callbacks given up, at `now - 10 s` and at `now`; a third delivered.
    let mut given_up_at = vec![now - 10_000, now];
    for key in ["early", "late", "fine"] {
        placed_and_cancelled(store, &account, key, URL).await;
        let due = store
            .due_deliveries(soon(), now_millis(), 10, Box::new(|_| true))
            .await
            .unwrap();
        assert_eq!(due.len(), 1, "{key}");
        let at = given_up_at.first().copied().unwrap_or(now);
        let status = if given_up_at.is_empty() { 200 } else { 410 };
        if !given_up_at.is_empty() {
            given_up_at.remove(0);
        }
        let due = due.into_iter().next().unwrap();
        store
            .settle_delivery(
                soon(),
                due,
                DeliveryOutcome::Finished,
                attempt(1, at, status),
            )
            .await
            .unwrap();
    }
    let requeued = store
        .recover_deliveries(soon(), account.id, now - 5_000, now_millis())
        .await
        .unwrap();
    assert_eq!(requeued, 1, "only the one given up since then");
    let due = store
        .due_deliveries(soon(), now_millis() + 10, 10, Box::new(|_| true))
        .await
        .unwrap();
    assert_eq!(due.len(), 1);
    let log = store
        .delivery_logs(soon(), account.id, vec![due[0].event.id.clone()])
        .await
        .unwrap()
        .remove(0)
        .unwrap();
    assert_eq!(log.attempts[0].at, now, "the late one");
    assert_ne!(log.ended, Some(DeliveryEnd::GivenUp));
    let all = store
        .recover_deliveries(soon(), account.id, 0, now_millis())
        .await
        .unwrap();
    assert_eq!(
        all, 1,
        "the early one; the late one is queued, not given up"
    );
}
