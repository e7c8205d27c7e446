//! What a write's answer promises about reads, and background work claimed once: every read
//! made after a write resolved shows all of it (its order, balance, ledger entry, key row and
//! event), and two fulfillment passes run at once complete each order once.
//!
//! The other half, that no read shows a write before it is durable, needs a commit held
//! open: it is tested through the binary (`tests/api/durability.rs`, sled's flush hook) and,
//! on PostgreSQL, is the server's own (rows are visible only after COMMIT).

use orderly::now_millis;
use orderly::EventKind;
use orderly::IdempotencyKey;
use orderly::OrderStatus;
use orderly::Store;

use crate::conformance;
use crate::fixtures::*;

conformance!(
    every_read_made_after_a_write_answered_shows_all_of_it,
    two_fulfillment_passes_at_once_complete_each_order_once,
);

async fn every_read_made_after_a_write_answered_shows_all_of_it(store: &dyn Store) {
    let account = account_with(store, 1_000, 0).await;
    for round in 0..5 {
        let key = format!("seen-{round}");
        let body = store
            .place_order(soon(), order(&account, &key, 1))
            .await
            .unwrap()
            .unwrap();
        let id = placed_id(&body);
        // Each round's order is cancelled before the next: one order's price is out.
        let left = 1_000 - PRICE;
        // Each read at once, with nothing awaited in between but the read itself.
        let order = store
            .order(soon(), id)
            .await
            .unwrap()
            .expect("the order is there");
        assert_eq!(order.status, OrderStatus::Processing);
        assert_eq!(
            store.balance(soon(), account.id).await.unwrap().available.0,
            left
        );
        let newest = store
            .ledger_page(soon(), account.id, None, 1)
            .await
            .unwrap();
        assert_eq!(newest.items[0].balance_after.0, left, "its ledger entry");
        let row = store
            .replay_lookup(
                soon(),
                account.id,
                IdempotencyKey::parse(key.as_bytes()).unwrap(),
            )
            .await
            .unwrap()
            .expect("its key row");
        assert_eq!(row.response.body, body);
        let page = store
            .orders_page(soon(), account.id, None, None, 1)
            .await
            .unwrap();
        assert_eq!(page.items[0].id, id, "first in the account's orders");
        store
            .cancel_order(soon(), cancel(&account, id))
            .await
            .unwrap()
            .unwrap();
        let events = store
            .events_page(soon(), account.id, None, 100)
            .await
            .unwrap();
        let last = events.items.last().expect("its event");
        assert_eq!((last.kind, last.order.id), (EventKind::OrderCancelled, id));
        assert_eq!(
            store.balance(soon(), account.id).await.unwrap().available.0,
            1_000,
            "the cancel's money back"
        );
    }
}

async fn two_fulfillment_passes_at_once_complete_each_order_once(store: &dyn Store) {
    let account = account_with(store, 10_000, 0).await;
    for n in 0..30 {
        store
            .place_order(soon(), order(&account, &format!("due-{n}"), 1))
            .await
            .unwrap()
            .unwrap();
    }
    let due_by = now_millis();
    let (a, b) = futures::join!(
        store.complete_due_orders(soon(), due_by, 7),
        store.complete_due_orders(soon(), due_by, 7)
    );
    let mut completed = a.unwrap() + b.unwrap();
    loop {
        match store.complete_due_orders(soon(), due_by, 7).await.unwrap() {
            0 => break,
            n => completed += n,
        }
    }
    assert_eq!(completed, 30, "each order completed once");
    let events = store
        .events_page(soon(), account.id, None, 100)
        .await
        .unwrap();
    let completions = events
        .items
        .iter()
        .filter(|e| e.kind == EventKind::OrderCompleted)
        .count();
    assert_eq!(completions, 30, "one order.completed event per order");
    let page = store
        .orders_page(soon(), account.id, None, None, 100)
        .await
        .unwrap();
    assert!(page
        .items
        .iter()
        .all(|o| o.status == OrderStatus::Completed));
}
