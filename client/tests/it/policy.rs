//! Each branch of the retry policy against the real server, seen from the proxy in between.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::cli::Cli;
use crate::proxy::{Fate, Proxy};
use crate::server::{basket, Server};

fn canned(status: u16, error: &str) -> Fate {
    Fate::Reply {
        status,
        headers: vec![("x-ratelimit-remaining", "41".to_string())],
        body: json!({"success": false, "error": error}).to_string(),
    }
}

fn posts(proxy: &Proxy) -> Vec<crate::proxy::Seen> {
    proxy
        .seen()
        .into_iter()
        .filter(|s| s.method == "POST")
        .collect()
}

#[test]
fn a_429_is_retried_after_exactly_its_retry_after() {
    let server = Server::start(&["--rate-limit", "30"]);
    let partner = server.partner(10_000, 0);
    // Spend the budget of this address (the proxy connects from it too).
    let mut limited = false;
    for _ in 0..100 {
        if server.get(&partner.api_key, "/b2b/balance").0 == 429 {
            limited = true;
            break;
        }
    }
    assert!(limited, "the server never said 429");
    let proxy = Proxy::passing(&server.url);
    let dir = tempfile::tempdir().unwrap();
    let cli = Cli::new(&proxy.url, &partner.api_key, dir.path());

    let ran = cli.place("rate-1", &basket("player1", 1));

    assert_eq!(ran.line()["outcome"], "placed", "{}", ran.stderr);
    let seen = posts(&proxy);
    assert_eq!(seen[0].status, Some(429));
    let wait: u64 = seen[0]
        .response_header("retry-after")
        .unwrap()
        .parse()
        .unwrap();
    let gap = seen[1].at - seen[0].answered_at.unwrap();
    let asked = Duration::from_secs(wait);
    assert!(
        gap >= asked,
        "retried after {gap:?}, Retry-After was {wait} s"
    );
    assert!(
        gap < asked + Duration::from_millis(500),
        "retried after {gap:?}, Retry-After was {wait} s"
    );
    assert_eq!(seen[1].key(), seen[0].key());
    assert_eq!(seen[1].body, seen[0].body);
}

#[test]
fn the_in_progress_409_is_retried_after_one_to_two_seconds() {
    let server = Server::start(&[]);
    let partner = server.partner(10_000, 0);
    // orderly waits about 5 s for a key in flight before it says this: stand in for it.
    let proxy = Proxy::start(&server.url, |_, n| match n {
        0 => canned(409, "Duplicate request in progress, retry later"),
        _ => Fate::Pass,
    });
    let dir = tempfile::tempdir().unwrap();
    let cli = Cli::new(&proxy.url, &partner.api_key, dir.path());

    let ran = cli.place("busy-1", &basket("player1", 1));

    assert_eq!(ran.line()["outcome"], "placed");
    assert_eq!(ran.line()["attempts"], 2);
    let seen = posts(&proxy);
    let gap = seen[1].at - seen[0].answered_at.unwrap();
    assert!(
        gap >= Duration::from_secs(1) && gap <= Duration::from_millis(2300),
        "retried after {gap:?}"
    );
    assert_eq!(seen[1].key(), seen[0].key());
    assert_eq!(seen[1].body, seen[0].body);
}

#[test]
fn the_concurrent_balance_402_is_retried_after_a_short_pause() {
    let server = Server::start(&[]);
    let partner = server.partner(10_000, 0);
    // orderly retries this inside itself and then rarely sends it: stand in for it.
    let proxy = Proxy::start(&server.url, |_, n| match n {
        0 => canned(402, "Concurrent balance modification"),
        _ => Fate::Pass,
    });
    let dir = tempfile::tempdir().unwrap();
    let cli = Cli::new(&proxy.url, &partner.api_key, dir.path());

    let ran = cli.place("race-1", &basket("player1", 1));

    assert_eq!(ran.line()["outcome"], "placed");
    let seen = posts(&proxy);
    assert_eq!(seen.len(), 2);
    assert!(seen[1].at - seen[0].answered_at.unwrap() < Duration::from_secs(1));
    assert_eq!(server.charges(&partner.api_key).len(), 1);
}

#[test]
fn server_errors_are_retried_with_backoff_under_the_same_key() {
    let server = Server::start(&[]);
    let partner = server.partner(10_000, 0);
    let proxy = Proxy::start(&server.url, |_, n| match n {
        0 | 1 => canned(503, "Internal server error"),
        _ => Fate::Pass,
    });
    let dir = tempfile::tempdir().unwrap();
    let cli = Cli::new(&proxy.url, &partner.api_key, dir.path());

    let ran = cli.place("flaky-1", &basket("player1", 1));

    assert_eq!(ran.line()["outcome"], "placed");
    assert_eq!(ran.line()["attempts"], 3);
    let seen = posts(&proxy);
    assert!(seen
        .iter()
        .all(|s| s.key() == seen[0].key() && s.body == seen[0].body));
    // Backoff: the second wait is not shorter than half the first step doubled.
    let first = seen[1].at - seen[0].answered_at.unwrap();
    let second = seen[2].at - seen[1].answered_at.unwrap();
    assert!(first >= Duration::from_millis(250), "first wait {first:?}");
    assert!(
        second >= Duration::from_millis(500),
        "second wait {second:?}"
    );
}

#[test]
fn a_key_reused_for_another_basket_is_a_conflict_and_never_retried() {
    let server = Server::start(&[]);
    let partner = server.partner(10_000, 0);
    let dir = tempfile::tempdir().unwrap();
    // The first attempt is lost on the way: the intent is journaled with its key, pending.
    let lost = Proxy::start(&server.url, |_, _| Fate::Refuse);
    let cli = Cli::new(&lost.url, &partner.api_key, dir.path()).with(&["--max-attempts", "1"]);
    assert_eq!(
        cli.place("dup-1", &basket("player1", 1)).line()["outcome"],
        "unknown"
    );
    let journal = orderly_client::Journal::open(&cli.journal).unwrap();
    let key = journal.get("dup-1").unwrap().unwrap().key;
    // Someone else spends that key on another basket.
    let (status, _) = server.call(
        "POST",
        "/b2b/orders",
        &[("X-Api-Key", &partner.api_key), ("X-Idempotency-Key", &key)],
        Some(&basket("someone-else", 2)),
    );
    assert_eq!(status, 200);
    let proxy = Proxy::passing(&server.url);

    let ran = cli.via(&proxy.url).run(&["resume"]);

    assert_eq!(ran.code, 1);
    assert_eq!(ran.line()["outcome"], "conflict");
    assert_eq!(
        ran.line()["error"],
        "idempotency_key_reused_with_different_body"
    );
    assert_eq!(proxy.count(), 1, "a conflict is never retried");
    let again = cli.via(&proxy.url).run(&["resume"]);
    assert!(again.lines.is_empty());
    assert_eq!(proxy.count(), 1, "nor resumed");
}

#[test]
fn a_business_refusal_is_rejected_with_its_token_and_not_retried() {
    let server = Server::start(&[]);
    let partner = server.partner(10_000, 0);
    let proxy = Proxy::passing(&server.url);
    let dir = tempfile::tempdir().unwrap();
    let cli = Cli::new(&proxy.url, &partner.api_key, dir.path());
    let unknown: Value = json!({"items": [{"productId": "prd_nope", "quantity": 1}]});

    let ran = cli.place("nope-1", &unknown);

    assert_eq!(ran.code, 1);
    assert_eq!(ran.line()["outcome"], "rejected");
    assert_eq!(ran.line()["error"], "unknown_product");
    assert_eq!(proxy.count(), 1);
    assert!(cli.run(&["resume"]).lines.is_empty());
    assert_eq!(proxy.count(), 1);
}

#[test]
fn unanswered_attempts_end_unknown_after_the_attempt_budget_and_stay_pending() {
    let server = Server::start(&[]);
    let partner = server.partner(10_000, 0);
    let proxy = Proxy::start(&server.url, |_, _| Fate::Refuse);
    let dir = tempfile::tempdir().unwrap();
    let cli = Cli::new(&proxy.url, &partner.api_key, dir.path()).with(&["--max-attempts", "3"]);

    let ran = cli.place("lost-1", &basket("player1", 1));

    assert_eq!(ran.code, 1);
    assert_eq!(ran.line()["outcome"], "unknown");
    assert_eq!(ran.line()["attempts"], 3);
    assert_eq!(proxy.count(), 3);
    let keys: Vec<_> = proxy
        .seen()
        .iter()
        .map(|s| s.key().map(str::to_string))
        .collect();
    assert!(keys.iter().all(|k| k == &keys[0]));
    let journal = orderly_client::Journal::open(&cli.journal).unwrap();
    assert!(journal.get("lost-1").unwrap().unwrap().pending);
}

#[test]
fn a_time_budget_ends_the_retries_unknown_before_the_attempts_run_out() {
    let server = Server::start(&[]);
    let partner = server.partner(10_000, 0);
    let proxy = Proxy::start(&server.url, |_, _| Fate::Refuse);
    let dir = tempfile::tempdir().unwrap();
    let cli = Cli::new(&proxy.url, &partner.api_key, dir.path()).with(&[
        "--max-attempts",
        "100",
        "--max-time",
        "2s",
    ]);
    let started = Instant::now();

    let ran = cli.place("slow-1", &basket("player1", 1));

    assert_eq!(ran.line()["outcome"], "unknown");
    assert!(started.elapsed() < Duration::from_secs(4));
    assert!(proxy.count() < 100);
}

#[test]
fn an_outcome_carries_the_last_rate_limit_remaining() {
    let server = Server::start(&["--rate-limit", "1000"]);
    let partner = server.partner(10_000, 0);
    let dir = tempfile::tempdir().unwrap();
    let cli = Cli::new(&server.url, &partner.api_key, dir.path());

    let ran = cli.place("budget-1", &basket("player1", 1));

    let remaining = ran.line()["rateLimitRemaining"].as_u64().expect("a number");
    assert!(remaining < 1000);
}

#[test]
fn the_origin_403_which_has_no_rate_limit_headers_is_rejected_with_a_null_budget() {
    let server = Server::start(&[]);
    let partner = server.partner(10_000, 0);
    // The client never sends Origin; a browser-ish middlebox might. The real server refuses it
    // before its limiter, so the answer has no X-RateLimit-* headers.
    let proxy = Proxy::start(&server.url, |_, _| {
        Fate::AddHeader("Origin", "https://shop.example")
    });
    let dir = tempfile::tempdir().unwrap();
    let cli = Cli::new(&proxy.url, &partner.api_key, dir.path());

    let ran = cli.place("origin-1", &basket("player1", 1));

    let line = ran.line();
    assert_eq!(line["outcome"], "rejected");
    assert_eq!(line["error"], "Forbidden: Origin not allowed");
    assert_eq!(line["rateLimitRemaining"], Value::Null);
    assert_eq!(proxy.seen()[0].status, Some(403));
    assert!(proxy.seen()[0]
        .response_header("x-ratelimit-remaining")
        .is_none());
}
