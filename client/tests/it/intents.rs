//! The journal seen from the command line: an intent is fixed once written, `status` only
//! reads, several processes share one journal, and bad usage is exit 2.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::Value;

use crate::cli::{command, finish, Cli};
use crate::proxy::{Fate, Proxy};
use crate::server::{basket, Server};

#[test]
fn a_changed_basket_under_an_existing_intent_is_refused_before_anything_is_sent() {
    let server = Server::start(&[]);
    let partner = server.partner(10_000, 0);
    let dir = tempfile::tempdir().unwrap();
    let direct = Cli::new(&server.url, &partner.api_key, dir.path());
    assert_eq!(
        direct.place("cart-1", &basket("player1", 1)).line()["outcome"],
        "placed"
    );
    let lost = Proxy::start(&server.url, |_, _| Fate::Refuse);
    let pending = direct.via(&lost.url).with(&["--max-attempts", "1"]);
    assert_eq!(
        pending.place("cart-2", &basket("player1", 1)).line()["outcome"],
        "unknown"
    );
    let watch = Proxy::passing(&server.url);

    let after_placed = direct
        .via(&watch.url)
        .place("cart-1", &basket("player1", 2));
    let after_pending = direct
        .via(&watch.url)
        .place("cart-2", &basket("player2", 1));

    for ran in [&after_placed, &after_pending] {
        assert_eq!(ran.code, 1);
        assert_eq!(ran.line()["outcome"], "intent_changed");
        assert_eq!(ran.line()["attempts"], 0);
    }
    assert_eq!(watch.count(), 0, "nothing may be sent for a changed basket");
    assert_eq!(server.orders(&partner.api_key).len(), 1);
}

#[test]
fn a_finished_intent_prints_its_journaled_outcome_and_sends_nothing() {
    let server = Server::start(&[]);
    let partner = server.partner(10_000, 0);
    let dir = tempfile::tempdir().unwrap();
    let direct = Cli::new(&server.url, &partner.api_key, dir.path());
    let first = direct.place("done-1", &basket("player1", 1));
    let watch = Proxy::passing(&server.url);

    let again = direct
        .via(&watch.url)
        .place("done-1", &basket("player1", 1));

    assert_eq!(again.code, 0);
    assert_eq!(again.line(), first.line());
    assert_eq!(watch.count(), 0);
}

#[test]
fn status_prints_the_journal_and_sends_nothing() {
    let server = Server::start(&[]);
    let partner = server.partner(10_000, 0);
    let dir = tempfile::tempdir().unwrap();
    let direct = Cli::new(&server.url, &partner.api_key, dir.path());
    let placed = direct.place("st-1", &basket("player1", 1));
    let unknown_product: Value =
        serde_json::json!({"items": [{"productId": "prd_nope", "quantity": 1}]});
    let rejected = direct.place("st-2", &unknown_product);
    let watch = Proxy::passing(&server.url);
    let status = direct.via(&watch.url);

    let all = status.run(&["status"]);
    let one = status.run(&["status", "st-1"]);
    let missing = status.run(&["status", "st-404"]);

    assert_eq!(
        all.lines,
        vec![placed.line().clone(), rejected.line().clone()]
    );
    assert_eq!(all.code, 1, "not every intent is placed");
    assert_eq!(one.lines, vec![placed.line().clone()]);
    assert_eq!(one.code, 0);
    assert_eq!(missing.code, 1);
    assert!(missing.lines.is_empty());
    assert_eq!(watch.count(), 0, "status never calls the server");
}

#[test]
fn several_processes_share_one_journal() {
    let server = Server::start(&[]);
    let partner = server.partner(100_000, 0);
    let dir = tempfile::tempdir().unwrap();
    let cli = Cli::new(&server.url, &partner.api_key, dir.path());
    let children: Vec<_> = (0..6)
        .map(|i| {
            let intent = format!("shared-{i}");
            let file = cli.basket_file(&intent, &basket(&format!("player{i}"), 1));
            cli.spawn(&[
                "place",
                "--intent",
                &intent,
                "--basket",
                file.to_str().unwrap(),
            ])
        })
        .collect();

    let ran: Vec<_> = children
        .into_iter()
        .map(|c| finish(c, Duration::from_secs(60)))
        .collect();

    assert!(ran
        .iter()
        .all(|r| r.code == 0 && r.line()["outcome"] == "placed"));
    let status = cli.run(&["status"]);
    let intents: HashSet<_> = status
        .lines
        .iter()
        .map(|l| l["intent"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(status.lines.len(), 6);
    assert_eq!(intents.len(), 6);
    assert_eq!(server.orders(&partner.api_key).len(), 6);
}

#[test]
fn resume_with_nothing_pending_prints_nothing_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let cli = Cli::new(
        "http://127.0.0.1:9",
        "gc_live_00000000000000000000000000000000",
        dir.path(),
    );

    let ran = cli.run(&["resume"]);

    assert_eq!(ran.code, 0);
    assert!(ran.lines.is_empty());
}

#[test]
fn bad_usage_exits_2_and_prints_no_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let cli = Cli::new(
        "http://127.0.0.1:9",
        "gc_live_00000000000000000000000000000000",
        dir.path(),
    );
    let good = cli.basket_file("good", &basket("player1", 1));
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{\"items\": [ {\"productId\": 1} ]}").unwrap();
    let good = good.to_str().unwrap();

    for args in [
        vec!["place", "--intent", "x"],
        vec![
            "place",
            "--intent",
            "x",
            "--basket",
            "/nonexistent/basket.json",
        ],
        vec!["place", "--intent", "x", "--basket", bad.to_str().unwrap()],
        vec!["place", "--intent", "", "--basket", good],
        vec![
            "--max-attempts",
            "0",
            "place",
            "--intent",
            "x",
            "--basket",
            good,
        ],
        vec!["--timeout", "soon", "resume"],
        vec!["frobnicate"],
    ] {
        let ran = cli.run(&args);
        assert_eq!(ran.code, 2, "{args:?}: {}", ran.stderr);
        assert!(ran.lines.is_empty());
    }
    let output = command()
        .args(["place", "--intent", "x", "--basket", good])
        .env("ORDERLY_CLIENT_JOURNAL", dir.path().join("j2"))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "no API key is bad usage");
}
