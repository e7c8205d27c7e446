//! 200 intents through a network that loses 30% of the answers (half dropped, half held past
//! the client's timeout): exactly 200 orders, one charge each, every intent placed.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use orderly_client::{Basket, Client, Config, Item, Journal, OutcomeKind};

use crate::proxy::{Fate, Proxy};
use crate::server::{Server, PRICE};

const INTENTS: usize = 200;
const THREADS: usize = 8;

#[test]
fn two_hundred_intents_through_a_network_losing_30_percent_of_answers_make_exactly_200_orders() {
    let server = Server::start(&[]);
    let start_balance = INTENTS as i64 * PRICE + 5_000;
    let partner = server.partner(start_balance, 0);
    let lost = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&lost);
    let proxy = Proxy::start(&server.url, move |_, _| {
        let roll = fastrand::f64();
        if roll < 0.30 {
            counter.fetch_add(1, Ordering::SeqCst);
        }
        if roll < 0.15 {
            Fate::DropAnswer
        } else if roll < 0.30 {
            Fate::HoldAnswer(Duration::from_millis(1500))
        } else {
            Fate::Pass
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal");
    let mut config = Config::new(proxy.url.clone(), partner.api_key.clone());
    config.timeout = Duration::from_secs(1);
    // 0.3^25: no intent plausibly runs out of attempts.
    config.max_attempts = 25;
    config.backoff_base = Duration::from_millis(20);
    config.backoff_cap = Duration::from_millis(500);
    // Two handles on one journal, as two processes would have.
    let clients = Arc::new([
        Client::new(config.clone(), Journal::open(&path).unwrap()),
        Client::new(config, Journal::open(&path).unwrap()),
    ]);
    let next = Arc::new(AtomicUsize::new(0));

    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (clients, next) = (Arc::clone(&clients), Arc::clone(&next));
            std::thread::spawn(move || {
                let mut outcomes = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= INTENTS {
                        return outcomes;
                    }
                    let basket = Basket {
                        items: vec![Item::new("prd_uc", 1).with("username", format!("player{i}"))],
                        callback_url: None,
                    };
                    let outcome = clients[t % 2]
                        .place_order(&format!("lossy-{i}"), &basket)
                        .unwrap();
                    outcomes.push(outcome);
                }
            })
        })
        .collect();
    let outcomes: Vec<_> = workers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();

    assert_eq!(outcomes.len(), INTENTS);
    let unplaced: Vec<_> = outcomes
        .iter()
        .filter(|o| o.outcome != OutcomeKind::Placed)
        .collect();
    assert!(unplaced.is_empty(), "not placed: {unplaced:?}");
    let ids: HashSet<_> = outcomes
        .iter()
        .map(|o| o.order_id.clone().unwrap())
        .collect();
    assert_eq!(ids.len(), INTENTS, "one order per intent");
    let orders = server.orders(&partner.api_key);
    assert_eq!(orders.len(), INTENTS, "exactly 200 orders on the server");
    let external: HashSet<_> = orders
        .iter()
        .map(|o| o["externalOrderId"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(external.len(), INTENTS);
    assert_eq!(
        server.charges(&partner.api_key).len(),
        INTENTS,
        "one charge each"
    );
    assert_eq!(
        server.balance(&partner.api_key),
        start_balance - INTENTS as i64 * PRICE
    );
    assert!(
        lost.load(Ordering::SeqCst) >= 20,
        "the network did lose answers"
    );
    assert!(
        outcomes.iter().any(|o| o.replayed),
        "some answers came back as replays"
    );
}
