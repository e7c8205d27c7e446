//! Past the key's lifetime a re-send could buy a second order, so an old pending intent is
//! only looked up by its externalOrderId (the intent id), never sent again.

use std::time::Duration;

use crate::cli::Cli;
use crate::proxy::{Fate, Proxy};
use crate::server::{basket, Server};

/// Keys live 3 s on this server and are swept every second; the client's horizon is 2 s.
fn short_lived_server() -> Server {
    Server::start(&["--idempotency-ttl", "3s", "--sweep-interval", "1s"])
}

fn wait_past_horizon(cli: &Cli, intent: &str) {
    let journal = orderly_client::Journal::open(&cli.journal).unwrap();
    let created = journal.get(intent).unwrap().unwrap().created_at();
    let horizon = created + Duration::from_secs(2);
    if let Ok(left) = horizon.duration_since(std::time::SystemTime::now()) {
        std::thread::sleep(left + Duration::from_millis(50));
    }
}

#[test]
fn past_the_horizon_an_intent_whose_order_exists_is_reconciled_as_placed_without_a_resend() {
    let server = short_lived_server();
    let partner = server.partner(10_000, 0);
    let dir = tempfile::tempdir().unwrap();
    // The order is placed, the answer lost: the intent stays pending.
    let lossy = Proxy::start(&server.url, |_, _| Fate::DropAnswer);
    let cli = Cli::new(&lossy.url, &partner.api_key, dir.path()).with(&[
        "--max-attempts",
        "1",
        "--horizon",
        "2s",
    ]);
    assert_eq!(
        cli.place("old-1", &basket("player1", 1)).line()["outcome"],
        "unknown"
    );
    wait_past_horizon(&cli, "old-1");
    let watch = Proxy::passing(&server.url);

    let resumed = cli.via(&watch.url).run(&["resume"]);

    let orders = server.orders(&partner.api_key);
    assert_eq!(orders.len(), 1, "no second order");
    assert_eq!(resumed.line()["outcome"], "placed");
    assert_eq!(resumed.line()["orderId"], orders[0]["id"]);
    let seen = watch.seen();
    assert!(!seen.is_empty());
    assert!(seen
        .iter()
        .all(|s| s.method == "GET" && s.path.contains("externalOrderId=old-1")));
}

#[test]
fn past_the_horizon_an_intent_without_an_order_is_expired_without_a_resend() {
    let server = short_lived_server();
    let partner = server.partner(10_000, 0);
    let dir = tempfile::tempdir().unwrap();
    // The request itself is lost: no order.
    let lost = Proxy::start(&server.url, |_, _| Fate::Refuse);
    let cli = Cli::new(&lost.url, &partner.api_key, dir.path()).with(&[
        "--max-attempts",
        "1",
        "--horizon",
        "2s",
    ]);
    assert_eq!(
        cli.place("old-2", &basket("player1", 1)).line()["outcome"],
        "unknown"
    );
    wait_past_horizon(&cli, "old-2");
    let watch = Proxy::passing(&server.url);

    let resumed = cli.via(&watch.url).run(&["resume"]);

    assert_eq!(resumed.code, 1);
    assert_eq!(resumed.line()["outcome"], "expired");
    assert!(watch.seen().iter().all(|s| s.method == "GET"));
    assert!(server.orders(&partner.api_key).is_empty());
    let again = cli.via(&watch.url).run(&["resume"]);
    assert!(
        again.lines.is_empty(),
        "an expired intent is left for a person"
    );
}
