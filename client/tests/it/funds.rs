//! The 402s for lack of money: the intent waits, pending, under its key for a top-up.

use crate::cli::Cli;
use crate::proxy::Proxy;
use crate::server::{basket, Server, PRICE};

#[test]
fn insufficient_balance_needs_funds_and_after_a_top_up_resume_charges_once_with_the_same_key() {
    let server = Server::start(&[]);
    let partner = server.partner(0, 0);
    let proxy = Proxy::passing(&server.url);
    let dir = tempfile::tempdir().unwrap();
    let cli = Cli::new(&proxy.url, &partner.api_key, dir.path());

    let first = cli.place("funds-1", &basket("player1", 1));
    assert_eq!(first.code, 1);
    assert_eq!(first.line()["outcome"], "needs_funds");
    assert_eq!(first.line()["error"], "Insufficient balance");
    assert_eq!(
        proxy.count(),
        1,
        "a 402 for money is not retried in the same run"
    );

    server.top_up(&partner.account_id, 5_000);
    let resumed = cli.run(&["resume"]);

    assert_eq!(resumed.code, 0);
    assert_eq!(resumed.line()["outcome"], "placed");
    assert_eq!(resumed.line()["replayed"], false);
    let seen = proxy.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].key(), seen[0].key());
    assert_eq!(seen[1].body, seen[0].body);
    assert_eq!(server.charges(&partner.api_key).len(), 1);
    assert_eq!(server.balance(&partner.api_key), 5_000 - PRICE);
}

#[test]
fn exceeding_the_credit_limit_needs_funds_and_stays_pending() {
    let server = Server::start(&[]);
    let partner = server.partner(0, 100);
    let dir = tempfile::tempdir().unwrap();
    let cli = Cli::new(&server.url, &partner.api_key, dir.path());

    let ran = cli.place("credit-1", &basket("player1", 1));

    assert_eq!(ran.line()["outcome"], "needs_funds");
    assert_eq!(ran.line()["error"], "Exceeds credit limit");
    let journal = orderly_client::Journal::open(&cli.journal).unwrap();
    assert!(journal.get("credit-1").unwrap().unwrap().pending);
    assert!(server.charges(&partner.api_key).is_empty());
}
