//! docs/contract.md "6. Many instances", the database's clock decides: two instances on one PostgreSQL database, one of
//! them run 10 minutes ahead or behind under libfaketime (Debian's `faketime`; its monotonic
//! clock left alone, as a wrong wall clock leaves it). No key is swept early, no live claim
//! is taken over, and an `after=` poller misses no event. Each test first checks that the
//! skew is real: the skewed instance's `Date` header is 10 minutes off.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{basket, on_postgres, start, start_with_env, Partner, TestApp, TestDatabase};
use crate::receiver::Receiver;

const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
const SKEWS: [(&str, i64); 2] = [("+10m", 600), ("-10m", -600)];

/// An instance on `database` whose wall clock is `skew` off (libfaketime), monotonic true.
fn skewed(dir: &Path, database: &TestDatabase, skew: &str, extra: &[&str]) -> TestApp {
    assert!(
        Path::new(LIBFAKETIME).exists(),
        "libfaketime is missing: apt-get install faketime"
    );
    let mut args = vec!["--database-url", database.server_url.as_str()];
    args.extend_from_slice(extra);
    let env = [
        ("LD_PRELOAD", LIBFAKETIME),
        ("FAKETIME", skew),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ("FAKETIME_NO_CACHE", "1"),
    ];
    start_with_env(dir, &args, &env)
}

fn on_time(dir: &Path, database: &TestDatabase, extra: &[&str]) -> TestApp {
    let mut args = vec!["--database-url", database.server_url.as_str()];
    args.extend_from_slice(extra);
    start(dir, &args)
}

/// The skewed instance's wall clock really is `seconds` off (its `Date` header).
async fn assert_skewed(app: &TestApp, seconds: i64) {
    let resp = app.client.get(app.url("/healthz")).send().await.unwrap();
    let date = resp.headers()["date"].to_str().unwrap().to_string();
    let said = httpdate(&date);
    let off = said - unix_now();
    assert!(
        (off - seconds).abs() <= 5,
        "Date {date:?} is {off} s off, not {seconds}"
    );
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// An IMF-fixdate (`Wed, 02 Dec 2026 10:00:00 GMT`) as Unix seconds.
fn httpdate(text: &str) -> i64 {
    let iso = {
        let parts: Vec<&str> = text.split_whitespace().collect();
        let month = [
            "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
        ]
        .iter()
        .position(|m| *m == parts[2])
        .unwrap()
            + 1;
        format!("{}-{month:02}-{:0>2}T{}Z", parts[3], parts[1], parts[4])
    };
    humantime::parse_rfc3339(&iso)
        .unwrap()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

async fn place(app: &TestApp, p: &Partner, key: &str, body: &Value) -> (StatusCode, bool) {
    let resp = app.post_order(Some(&p.api_key), Some(key), body).await;
    let replayed = resp.headers().contains_key("Idempotency-Replayed");
    (resp.status(), replayed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL and libfaketime: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn no_key_is_swept_early_by_an_instance_whose_clock_is_ten_minutes_ahead_or_behind() {
    assert!(on_postgres(), "needs ORDERLY_TEST_DATABASE_URL");
    for (skew, seconds) in SKEWS {
        let dir = tempfile::tempdir().unwrap();
        let database = TestDatabase::create(&dir.path().join("db"));
        let flags = ["--idempotency-ttl", "5m", "--sweep-interval", "1s"];
        let a = on_time(&dir.path().join("a"), &database, &flags);
        let b = skewed(&dir.path().join("b"), &database, skew, &flags);
        assert_skewed(&b, seconds).await;
        let p = a.partner_with_balance(100_000).await;
        let body = basket("prd_uc", 1, "player1");
        assert_eq!(
            place(&a, &p, "made-on-time", &body).await,
            (StatusCode::OK, false)
        );
        assert_eq!(
            place(&b, &p, "made-skewed", &body).await,
            (StatusCode::OK, false)
        );
        let balance = a.balance(&p.api_key).await;
        // Both sweepers run about three times (every second); none may take a key 5 minutes
        // from its expiry.
        tokio::time::sleep(Duration::from_millis(3_500)).await;
        for (app, key) in [(&b, "made-on-time"), (&a, "made-skewed")] {
            assert_eq!(
                place(app, &p, key, &body).await,
                (StatusCode::OK, true),
                "{skew}: the retry of {key:?} is the replay, not a second order"
            );
        }
        assert_eq!(
            a.balance(&p.api_key).await,
            balance,
            "{skew}: charged once per key"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL and libfaketime: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn an_after_poller_misses_no_event_when_cancels_alternate_with_an_instance_ten_minutes_off() {
    assert!(on_postgres(), "needs ORDERLY_TEST_DATABASE_URL");
    for (skew, seconds) in SKEWS {
        let dir = tempfile::tempdir().unwrap();
        let database = TestDatabase::create(&dir.path().join("db"));
        let a = on_time(&dir.path().join("a"), &database, &[]);
        let b = skewed(&dir.path().join("b"), &database, skew, &[]);
        assert_skewed(&b, seconds).await;
        let p = a.partner_with_balance(100_000).await;
        let mut orders = Vec::new();
        for i in 0..12 {
            let resp = a
                .post_order(
                    Some(&p.api_key),
                    Some(&format!("o-{i}")),
                    &basket("prd_uc", 1, "p"),
                )
                .await;
            let placed: Value = resp.json().await.unwrap();
            orders.push(placed["order"]["id"].as_str().unwrap().to_string());
        }
        let mut seen: Vec<String> = Vec::new();
        let mut cursor: Option<String> = None;
        for (i, order) in orders.iter().enumerate() {
            let app = if i % 2 == 0 { &a } else { &b };
            let resp = app.cancel(&p.api_key, order).await;
            assert_eq!(resp.status(), StatusCode::OK);
            // The poller, through the instance on time, from where it stopped.
            let path = match &cursor {
                Some(after) => format!("/b2b/events?after={after}&limit=100"),
                None => "/b2b/events?limit=100".to_string(),
            };
            let page = a.get_json(&p.api_key, &path).await;
            for event in page["events"].as_array().unwrap() {
                seen.push(event["data"]["order"]["id"].as_str().unwrap().to_string());
                cursor = Some(event["id"].as_str().unwrap().to_string());
            }
        }
        assert_eq!(
            seen, orders,
            "{skew}: every cancel's event, in order, none missed"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL and libfaketime: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn a_live_delivery_claim_is_not_taken_over_by_an_instance_whose_clock_is_ten_minutes_ahead() {
    assert!(on_postgres(), "needs ORDERLY_TEST_DATABASE_URL");
    // The receiver holds the first delivery open (the attempt times out after 10 s).
    let receiver = Receiver::start(vec![0]);
    let dir = tempfile::tempdir().unwrap();
    let database = TestDatabase::create(&dir.path().join("db"));
    let flags = [
        "--fulfillment-delay",
        "100ms",
        "--allow-private-callbacks",
        "--webhook-retry-schedule",
        "1h",
    ];
    let a = on_time(&dir.path().join("a"), &database, &flags);
    let p = a.partner_with_balance(100_000).await;
    let mut body = basket("prd_uc", 1, "p");
    body["callbackUrl"] = json!(receiver.url());
    assert_eq!(
        place(&a, &p, "hooked", &body).await,
        (StatusCode::OK, false)
    );
    assert_eq!(receiver.wait_for(1, Duration::from_secs(10)).await.len(), 1);

    // Only now the fast instance: the claim is `a`'s, live for 20 s by the database's clock.
    let b = skewed(&dir.path().join("b"), &database, "+10m", &flags);
    assert_skewed(&b, 600).await;
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(4) {
        let got = receiver.wait_for(2, Duration::from_millis(200)).await;
        assert_eq!(
            got.len(),
            1,
            "the delivery was sent again while its claim was live"
        );
    }
}

/// The newest event id `GET /b2b/events` lists for `p`, following every page.
async fn newest_event(app: &TestApp, p: &Partner) -> Option<String> {
    let events = app.all_pages(&p.api_key, "/b2b/events", "events").await;
    events.last().map(|e| e["id"].as_str().unwrap().to_string())
}

/// On sled the process's own clock decides, so a restart under a clock stepped 10 minutes
/// back (a dead RTC battery, an operator, NTP at boot) must not make time go back with it:
/// new ledger entries and events come after the old ones (an `after=` poller sees them, the
/// ledger lists them first), and new orders complete on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs libfaketime (apt-get install faketime): pass --include-ignored"]
async fn on_sled_a_restart_under_a_clock_ten_minutes_behind_lists_what_comes_next_after_what_was() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("db");
    let flags = [
        "--data-dir",
        data.to_str().unwrap(),
        "--fulfillment-delay",
        "200ms",
    ];
    let app = start(&data, &flags);
    let p = app.partner_with_balance(100_000).await;
    let body = basket("prd_uc", 1, "player1");
    assert_eq!(
        place(&app, &p, "before", &body).await,
        (StatusCode::OK, false)
    );
    let until = Instant::now() + Duration::from_secs(10);
    while newest_event(&app, &p).await.is_none() {
        assert!(Instant::now() < until, "the first order never completed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let cursor = newest_event(&app, &p).await.unwrap();
    drop(app);

    let env = [
        ("LD_PRELOAD", LIBFAKETIME),
        ("FAKETIME", "-10m"),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ("FAKETIME_NO_CACHE", "1"),
    ];
    let app = start_with_env(&data, &flags, &env);
    assert_skewed(&app, -600).await;
    let resp = app.post_order(Some(&p.api_key), Some("after"), &body).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let placed: Value = resp.json().await.unwrap();
    let order = placed["order"]["id"].as_str().unwrap().to_string();
    let path = format!("/b2b/events?after={cursor}");
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let page = app.get_json(&p.api_key, &path).await;
        let listed = page["events"].as_array().unwrap();
        if listed
            .iter()
            .any(|e| e["data"]["order"]["id"].as_str() == Some(order.as_str()))
        {
            break;
        }
        assert!(
            Instant::now() < until,
            "the new order's event never came after the old cursor: {page}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ledger = app.ledger(&p.api_key).await;
    assert_eq!(
        ledger[0]["reference"].as_str(),
        Some(order.as_str()),
        "the newest entry is listed first"
    );
    app.assert_ledger_matches_balance(&p.api_key).await;
}
