//! A snapshot is one instant of the store, however many writes go on while it is taken.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};

use orderly::{checked_counts, Record, Store};

use crate::conformance;
use crate::fixtures::*;

conformance!(a_snapshot_taken_while_orders_are_placed_holds_each_one_whole_or_not_at_all);

/// Orders already stored, so that taking the snapshot lasts while the writes go on.
const STORED: usize = 6_000;

async fn a_snapshot_taken_while_orders_are_placed_holds_each_one_whole_or_not_at_all(
    store: &dyn Store,
) {
    let account = account_with(store, 1_000_000 * PRICE, 0).await;
    for chunk in 0..STORED / 200 {
        let orders = (0..200)
            .map(|i| store.place_order(soon(), order(&account, &format!("stored-{chunk}-{i}"), 1)));
        for placed in futures::future::join_all(orders).await {
            placed.unwrap().unwrap();
        }
    }
    let placing = AtomicBool::new(true);
    let writes = async {
        let mut placed = 0;
        while placing.load(Ordering::SeqCst) && placed < 20_000 {
            let orders = (0..8).map(|i| {
                store.place_order(soon(), order(&account, &format!("during-{placed}-{i}"), 1))
            });
            for outcome in futures::future::join_all(orders).await {
                outcome.unwrap().unwrap();
            }
            placed += 8;
        }
        placed
    };
    let taken = async {
        let records = store.snapshot(soon()).await.unwrap().collect().await;
        placing.store(false, Ordering::SeqCst);
        records.unwrap()
    };
    let (placed_during, records) = futures::join!(writes, taken);

    // Every ledger sums to its account's balance, and every kind counts as recorded.
    checked_counts(&records).expect("the snapshot adds up");
    let mut orders = HashSet::new();
    let mut charges = HashSet::new();
    let mut keys = 0;
    for record in &records {
        match record {
            Record::Order(order) => {
                orders.insert(order.id.to_string());
            }
            Record::Ledger { entry, .. } if entry.amount.0 < 0 => {
                charges.insert(entry.reference.clone());
            }
            Record::IdempotencyKey { .. } => keys += 1,
            _ => {}
        }
    }
    assert_eq!(
        orders, charges,
        "each order with its charge, no charge without its order"
    );
    assert_eq!(keys, orders.len(), "each order with its key");
    assert!(orders.len() >= STORED, "{} orders", orders.len());
    eprintln!(
        "{placed_during} orders placed while the snapshot was taken; it holds {}",
        orders.len()
    );
}
