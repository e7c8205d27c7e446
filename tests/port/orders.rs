//! Orders and keys: the answer is the replay, a taken key refuses, a refusal writes nothing,
//! concurrent orders of one account are each decided on the balance the one before left.

use orderly::now_millis;
use orderly::IdempotencyKey;
use orderly::Operation;
use orderly::OrderStatus;
use orderly::Shortfall;
use orderly::{OrderRefusal, Store};

use crate::conformance;
use crate::fixtures::*;

conformance!(
    an_orders_answer_is_its_keys_replay_byte_for_byte_expiring_ttl_after_the_commit,
    a_second_use_of_a_key_is_key_taken_and_writes_nothing,
    a_refused_order_writes_nothing_and_leaves_its_key_free,
    concurrent_orders_of_one_account_never_spend_the_same_money_twice,
    the_credit_line_is_spent_to_its_limit_and_named_in_the_refusal,
    one_key_used_ten_times_at_once_places_one_order,
);

async fn one_key_used_ten_times_at_once_places_one_order(store: &dyn Store) {
    let account = account_with(store, 1_000, 0).await;
    let uses = (0..10).map(|_| store.place_order(soon(), order(&account, "same", 1)));
    let outcomes = futures::future::join_all(uses).await;
    let placed: Vec<&Vec<u8>> = outcomes
        .iter()
        .filter_map(|o| o.as_ref().ok()?.as_ref().ok())
        .collect();
    assert_eq!(placed.len(), 1, "{outcomes:?}");
    for outcome in &outcomes {
        match outcome {
            Ok(Ok(_)) => {}
            Ok(Err(OrderRefusal::KeyTaken(Some(row)))) => {
                assert_eq!(
                    &row.response.body, placed[0],
                    "the taken key's row is the answer"
                )
            }
            Ok(Err(OrderRefusal::KeyTaken(None))) => {}
            other => panic!("a use of a taken key answered {other:?}"),
        }
    }
    assert_eq!(
        store.balance(soon(), account.id).await.unwrap().available.0,
        1_000 - PRICE
    );
}

async fn an_orders_answer_is_its_keys_replay_byte_for_byte_expiring_ttl_after_the_commit(
    store: &dyn Store,
) {
    let account = account_with(store, 1_000, 0).await;
    let before = now_millis();
    let body = store
        .place_order(soon(), order(&account, "k-1", 3))
        .await
        .unwrap()
        .unwrap();
    let after = now_millis();
    let key = IdempotencyKey::parse(b"k-1").unwrap();
    let row = store
        .replay_lookup(soon(), account.id, key)
        .await
        .unwrap()
        .expect("the key's row");
    assert_eq!(
        row.response.body, body,
        "the replay is the answer's own bytes"
    );
    assert_eq!(row.response.status, 200);
    assert_eq!(row.operation, Operation::PlaceOrder);
    let ttl = 3_600_000;
    assert!(row.expires_at >= before + ttl && row.expires_at <= after + ttl);
    let placed = store
        .order(soon(), placed_id(&body))
        .await
        .unwrap()
        .expect("the order");
    assert_eq!(
        (placed.total.0, placed.status),
        (3 * PRICE, OrderStatus::Processing)
    );
    assert_eq!(
        store.balance(soon(), account.id).await.unwrap().available.0,
        1_000 - 3 * PRICE
    );
}

async fn a_second_use_of_a_key_is_key_taken_and_writes_nothing(store: &dyn Store) {
    let account = account_with(store, 1_000, 0).await;
    store
        .place_order(soon(), order(&account, "k-1", 1))
        .await
        .unwrap()
        .unwrap();
    let again = store
        .place_order(soon(), order(&account, "k-1", 2))
        .await
        .unwrap();
    assert!(matches!(again, Err(OrderRefusal::KeyTaken(_))), "{again:?}");
    assert_eq!(
        store.balance(soon(), account.id).await.unwrap().available.0,
        1_000 - PRICE
    );
    let page = store
        .orders_page(soon(), account.id, None, None, 10)
        .await
        .unwrap();
    assert_eq!(page.items.len(), 1);
}

async fn a_refused_order_writes_nothing_and_leaves_its_key_free(store: &dyn Store) {
    let account = account_with(store, 150, 0).await;
    let refused = store
        .place_order(soon(), order(&account, "k-1", 2))
        .await
        .unwrap();
    assert_eq!(
        refused.unwrap_err(),
        OrderRefusal::Shortfall(Shortfall::InsufficientBalance)
    );
    let key = IdempotencyKey::parse(b"k-1").unwrap();
    assert!(store
        .replay_lookup(soon(), account.id, key)
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        store.balance(soon(), account.id).await.unwrap().available.0,
        150
    );
    assert_eq!(ledger(store, &account).await.len(), 1, "only the credit");
    // The same key is a first use once the money is there.
    store
        .credit(soon(), credit(&account, 50, None))
        .await
        .unwrap()
        .unwrap();
    store
        .place_order(soon(), order(&account, "k-1", 2))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        store.balance(soon(), account.id).await.unwrap().available.0,
        0
    );
}

async fn concurrent_orders_of_one_account_never_spend_the_same_money_twice(store: &dyn Store) {
    let account = account_with(store, 10 * PRICE, 0).await;
    let orders = (0..25).map(|i| store.place_order(soon(), order(&account, &format!("c-{i}"), 1)));
    let outcomes = futures::future::join_all(orders).await;
    let accepted = outcomes.iter().filter(|o| matches!(o, Ok(Ok(_)))).count();
    let short = outcomes
        .iter()
        .filter(|o| matches!(o, Ok(Err(OrderRefusal::Shortfall(_)))))
        .count();
    assert_eq!((accepted, short), (10, 15), "{outcomes:?}");
    assert_eq!(
        store.balance(soon(), account.id).await.unwrap().available.0,
        0
    );
    let entries = ledger(store, &account).await;
    assert_eq!(entries.len(), 11, "one credit and ten charges");
    let mut running: Vec<i64> = entries.iter().map(|e| e.balance_after.0).collect();
    running.sort_unstable();
    running.dedup();
    assert_eq!(
        running.len(),
        11,
        "every entry left a different balance: none overwrote another"
    );
    assert_eq!(entries.iter().map(|e| e.amount.0).sum::<i64>(), 0);
}

async fn the_credit_line_is_spent_to_its_limit_and_named_in_the_refusal(store: &dyn Store) {
    let account = account_with(store, 0, 2 * PRICE).await;
    store
        .place_order(soon(), order(&account, "l-1", 2))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        store.balance(soon(), account.id).await.unwrap().available.0,
        -2 * PRICE
    );
    let refused = store
        .place_order(soon(), order(&account, "l-2", 1))
        .await
        .unwrap();
    assert_eq!(
        refused.unwrap_err(),
        OrderRefusal::Shortfall(Shortfall::ExceedsCreditLimit)
    );
}
