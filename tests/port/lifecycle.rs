//! An order's life through the port: cancel, completion, refund, and the events they emit,
//! listed oldest first after a cursor.

use orderly::now_millis;
use orderly::Cents;
use orderly::EventKind;
use orderly::IdempotencyKey;
use orderly::Operation;
use orderly::OrderStatus;
use orderly::{CancelRefusal, RefundRefusal, Store};
use orderly::{Id, IdKind};

use crate::conformance;
use crate::fixtures::*;

conformance!(
    a_cancel_returns_the_whole_total_once_and_emits_one_event,
    another_accounts_order_is_not_found,
    a_completed_order_is_refunded_in_parts_never_past_what_was_paid,
    events_are_listed_oldest_first_strictly_after_the_cursor,
);

async fn a_cancel_returns_the_whole_total_once_and_emits_one_event(store: &dyn Store) {
    let account = account_with(store, 1_000, 0).await;
    let body = store
        .place_order(soon(), order(&account, "o-1", 4))
        .await
        .unwrap()
        .unwrap();
    let id = placed_id(&body);
    store
        .cancel_order(soon(), cancel(&account, id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        store.balance(soon(), account.id).await.unwrap().available.0,
        1_000
    );
    let again = store
        .cancel_order(soon(), cancel(&account, id))
        .await
        .unwrap();
    assert_eq!(
        again.unwrap_err(),
        CancelRefusal::NotCancellable(OrderStatus::Cancelled)
    );
    assert_eq!(
        store.balance(soon(), account.id).await.unwrap().available.0,
        1_000,
        "returned once"
    );
    let events = store
        .events_page(soon(), account.id, None, 10)
        .await
        .unwrap()
        .items;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kind, EventKind::OrderCancelled);
    assert_eq!(events[0].order.status, OrderStatus::Cancelled);
    // A completion pass finds nothing to complete.
    assert_eq!(
        store
            .complete_due_orders(soon(), now_millis(), 10)
            .await
            .unwrap(),
        0
    );
}

async fn another_accounts_order_is_not_found(store: &dyn Store) {
    let owner = account_with(store, 1_000, 0).await;
    let stranger = account_with(store, 1_000, 0).await;
    let body = store
        .place_order(soon(), order(&owner, "o-1", 1))
        .await
        .unwrap()
        .unwrap();
    let id = placed_id(&body);
    let cancelled = store
        .cancel_order(soon(), cancel(&stranger, id))
        .await
        .unwrap();
    assert_eq!(cancelled.unwrap_err(), CancelRefusal::NotFound);
    let refunded = store
        .refund_order(soon(), refund(&stranger, id, "r-1", None))
        .await
        .unwrap();
    assert_eq!(refunded.unwrap_err(), RefundRefusal::NotFound);
    assert_eq!(
        store
            .balance(soon(), stranger.id)
            .await
            .unwrap()
            .available
            .0,
        1_000
    );
}

async fn a_completed_order_is_refunded_in_parts_never_past_what_was_paid(store: &dyn Store) {
    let account = account_with(store, 1_000, 0).await;
    let body = store
        .place_order(soon(), order(&account, "o-1", 5))
        .await
        .unwrap()
        .unwrap();
    let id = placed_id(&body);
    let early = store
        .refund_order(soon(), refund(&account, id, "r-0", None))
        .await
        .unwrap();
    assert_eq!(
        early.unwrap_err(),
        RefundRefusal::NotRefundable(OrderStatus::Processing)
    );
    assert_eq!(
        store
            .complete_due_orders(soon(), now_millis(), 10)
            .await
            .unwrap(),
        1
    );
    let first = store
        .refund_order(soon(), refund(&account, id, "r-1", Some(200)))
        .await
        .unwrap();
    let first = first.unwrap();
    let key = IdempotencyKey::parse(b"r-1").unwrap();
    let row = store
        .replay_lookup(soon(), account.id, key)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (row.operation, row.response.body),
        (Operation::RefundOrder, first)
    );
    let over = store
        .refund_order(soon(), refund(&account, id, "r-2", Some(301)))
        .await
        .unwrap();
    assert_eq!(
        over.unwrap_err(),
        RefundRefusal::ExceedsRemaining {
            remaining: Cents(300)
        }
    );
    store
        .refund_order(soon(), refund(&account, id, "r-3", None))
        .await
        .unwrap()
        .unwrap();
    let done = store.order(soon(), id).await.unwrap().unwrap();
    assert_eq!((done.refunded.0, done.total.0), (500, 500));
    assert_eq!(
        store.balance(soon(), account.id).await.unwrap().available.0,
        1_000
    );
    let entries = ledger(store, &account).await;
    assert_eq!(entries.iter().map(|e| e.amount.0).sum::<i64>(), 1_000);
}

async fn events_are_listed_oldest_first_strictly_after_the_cursor(store: &dyn Store) {
    let account = account_with(store, 10_000, 0).await;
    for i in 0..5 {
        placed_and_cancelled(store, &account, &format!("e-{i}"), None).await;
    }
    let all = store
        .events_page(soon(), account.id, None, 100)
        .await
        .unwrap()
        .items;
    assert_eq!(all.len(), 5);
    let first = store
        .events_page(soon(), account.id, None, 2)
        .await
        .unwrap();
    assert_eq!(first.items.len(), 2);
    let cursor = first.next_cursor.expect("more pages");
    let after = Id::parse(IdKind::Event, &cursor).unwrap();
    let rest = store
        .events_page(soon(), account.id, Some(after), 100)
        .await
        .unwrap();
    assert!(rest.next_cursor.is_none());
    let paged: Vec<String> = first
        .items
        .iter()
        .chain(&rest.items)
        .map(|e| e.id.clone())
        .collect();
    let listed: Vec<String> = all.iter().map(|e| e.id.clone()).collect();
    assert_eq!(
        paged, listed,
        "the pages are the list, in order, without repeats"
    );
    let times: Vec<u64> = all.iter().map(|e| e.created_at).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "oldest first");
}
