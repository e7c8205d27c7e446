//! docs/contract.md "5. Failures", the rules that hold on every engine: bounded metric labels, isolated
//! webhook receivers, capped Retry-After, the structured IETF key, the order of checks on
//! cancel and refunds, and logs without callback secrets.

use std::time::{Duration, Instant};

use futures::future::join_all;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{basket, metric, spawn_app_logging, spawn_app_with, TestApp};
use crate::receiver::{Receiver, Tarpit};

/// The number of `orderly_http_requests_total` series `/metrics` shows now.
async fn request_series(app: &TestApp) -> usize {
    let text = app.text("/metrics").await;
    text.lines()
        .filter(|l| l.starts_with("orderly_http_requests_total{"))
        .count()
}

/// `n` requests, 50 at a time, each with a made-up method or path (and a fresh order id).
async fn odd_requests(app: &TestApp, round: &str, n: usize) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(50) {
        let sends = chunk.iter().map(|i| {
            let method =
                Method::from_bytes(format!("M{round}X{i}{}", "Y".repeat(i % 300)).as_bytes())
                    .unwrap();
            let path = match i % 4 {
                0 => format!("/nowhere/{round}/{i}"),
                1 => format!("/b2b/orders/ord_{i:032x}"),
                2 => "/healthz".to_string(),
                _ => format!("/b2b/orders/ord_{round}{i:030}"),
            };
            let method = if i % 3 == 0 { Method::GET } else { method };
            app.client.request(method, app.url(&path)).send()
        });
        for resp in join_all(sends).await {
            resp.expect("the server answers every odd request");
        }
    }
}

#[tokio::test]
async fn made_up_methods_paths_and_ids_add_no_metric_series() {
    let app = spawn_app_with(&[]).await;
    // The first look at /metrics adds its own series; from then on nothing may.
    request_series(&app).await;
    odd_requests(&app, "a", 10_000).await;
    let first = request_series(&app).await;
    odd_requests(&app, "b", 10_000).await;
    let second = request_series(&app).await;
    eprintln!("request series after 10,000 odd requests: {first}; after 10,000 more: {second}");
    assert_eq!(first, second, "series grew with made-up labels");
    assert!(first < 40, "{first} series: labels are not from fixed sets");
}

#[tokio::test]
async fn a_quoted_ietf_key_is_the_same_key_as_the_literal_one() {
    let app = spawn_app_with(&[]).await;
    let p = app.partner_with_balance(10_000).await;
    let body = basket("prd_uc", 1, "p");
    let first = app
        .client
        .post(app.url("/b2b/orders"))
        .header("X-Api-Key", &p.api_key)
        .header("Idempotency-Key", "\"ietf-1\";v=1")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let replay = app
        .post_order(Some(&p.api_key), Some("ietf-1"), &body)
        .await;
    assert_eq!(replay.headers()["Idempotency-Replayed"], "true");
    assert_eq!(app.orders(&p.api_key).await.len(), 1);
}

#[tokio::test]
async fn a_malformed_quoted_ietf_key_is_400() {
    let app = spawn_app_with(&[]).await;
    let p = app.partner_with_balance(10_000).await;
    let resp = app
        .client
        .post(app.url("/b2b/orders"))
        .header("X-Api-Key", &p.api_key)
        .header("Idempotency-Key", "\"unterminated")
        .json(&basket("prd_uc", 1, "p"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let body: Value = resp.json().await.unwrap();
    assert!(body["error"]
        .as_str()
        .unwrap()
        .starts_with("invalid_idempotency_key: "));
    assert!(app.orders(&p.api_key).await.is_empty());
}

#[tokio::test]
async fn an_invalid_cancel_key_is_400_before_an_unknown_order_is_404() {
    let app = spawn_app_with(&[]).await;
    let p = app.partner_with_balance(10_000).await;
    let resp = app
        .client
        .post(app.url("/b2b/orders/ord_0193a0c0000070008000000000000abc/cancel"))
        .header("X-Api-Key", &p.api_key)
        .header("X-Idempotency-Key", "has space")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn a_refund_body_not_marked_json_is_422_and_refunds_nothing() {
    let app = spawn_app_with(&["--fulfillment-delay", "50ms"]).await;
    let p = app.partner_with_balance(10_000).await;
    let placed: Value = app
        .post_order(Some(&p.api_key), Some("k"), &basket("prd_uc", 1, "p"))
        .await
        .json()
        .await
        .unwrap();
    let id = placed["order"]["id"].as_str().unwrap();
    let resp = app
        .client
        .post(app.url(&format!("/b2b/orders/{id}/refunds")))
        .header("X-Api-Key", &p.api_key)
        .header("X-Idempotency-Key", "r")
        .header("Content-Type", "text/plain")
        .body(r#"{"amount":1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        app.assert_ledger_matches_balance(&p.api_key).await,
        10_000 - 999
    );
}

async fn order_with_callback(app: &TestApp, api_key: &str, key: &str, url: &str) {
    let mut body = basket("prd_uc", 1, "p");
    body["callbackUrl"] = json!(url);
    let resp = app.post_order(Some(api_key), Some(key), &body).await;
    assert_eq!(resp.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_receiver_that_never_answers_does_not_delay_another_receivers_events() {
    let tarpit = Tarpit::start();
    let good = Receiver::start(vec![]);
    let app = spawn_app_with(&[
        "--fulfillment-delay",
        "100ms",
        "--allow-private-callbacks",
        "--webhook-retry-schedule",
        "1h",
    ])
    .await;
    let p = app.partner_with_balance(100_000).await;
    for i in 0..8 {
        order_with_callback(&app, &p.api_key, &format!("slow-{i}"), &tarpit.url()).await;
    }
    let placed = Instant::now();
    order_with_callback(&app, &p.api_key, "fast", &good.url()).await;

    // One attempt times out after 10 s: a barrier between passes would hold this one back.
    let got = good.wait_for(1, Duration::from_secs(5)).await;
    assert_eq!(got.len(), 1, "the good receiver's event arrived");
    assert!(got[0].at.duration_since(placed) < Duration::from_secs(3));
    // The good event may overtake the tarpit's fourth connection: wait for the cap to be
    // reached, then give a fifth (the cap broken) time to show.
    assert_eq!(tarpit.wait_for(4, Duration::from_secs(5)).await, 4);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        tarpit.connections(),
        4,
        "at most --webhook-origin-concurrency (4) deliveries in flight to one origin"
    );
}

#[tokio::test]
async fn a_huge_retry_after_is_capped_at_the_longest_step_and_the_worker_lives() {
    let receiver = Receiver::scripted(0, vec![(503, Some(u64::MAX))]);
    let app = spawn_app_with(&[
        "--fulfillment-delay",
        "100ms",
        "--allow-private-callbacks",
        "--webhook-retry-schedule",
        "200ms,500ms",
    ])
    .await;
    let p = app.partner_with_balance(10_000).await;
    order_with_callback(&app, &p.api_key, "k", &receiver.url()).await;
    let got = receiver.wait_for(2, Duration::from_secs(5)).await;
    assert_eq!(got.len(), 2, "retried within the schedule's longest step");
    let waited = got[1].at.duration_since(got[0].at);
    assert!(waited >= Duration::from_millis(450), "waited {waited:?}");
    let metrics = app.text("/metrics").await;
    // Each worker's count is listed from its start; none rose.
    assert!(
        metrics.contains("orderly_worker_panics_total{"),
        "{metrics}"
    );
    assert_eq!(
        metric(&metrics, "orderly_worker_panics_total"),
        0.0,
        "{metrics}"
    );
}

#[tokio::test]
async fn failed_delivery_logs_carry_no_query_string() {
    let refusing = Receiver::start(vec![500]);
    let dead_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let app = spawn_app_logging(&[
        "--fulfillment-delay",
        "100ms",
        "--allow-private-callbacks",
        "--webhook-retry-schedule",
        "1h",
    ])
    .await;
    let p = app.partner_with_balance(10_000).await;
    let secret_url = |base: String| format!("{base}?token=s3cr3t-token");
    order_with_callback(&app, &p.api_key, "a", &secret_url(refusing.url())).await;
    let dead = format!("http://127.0.0.1:{dead_port}/hooks/orders");
    order_with_callback(&app, &p.api_key, "b", &secret_url(dead)).await;

    let mut failures = Vec::new();
    for _ in 0..100 {
        failures = app
            .logged()
            .into_iter()
            .filter(|l| {
                l.contains("webhook evt_") && (l.contains("answered") || l.contains("failed"))
            })
            .collect();
        if failures.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        failures.len() >= 2,
        "both failures were logged: {failures:?}"
    );
    let leaked: Vec<String> = app
        .logged()
        .into_iter()
        .filter(|l| l.contains("s3cr3t-token"))
        .collect();
    assert!(
        leaked.is_empty(),
        "a log line holds the callback's query: {leaked:?}"
    );
}

#[tokio::test]
async fn text_holding_u0000_is_a_422_with_its_path_and_nothing_is_stored() {
    let app = spawn_app_with(&[]).await;
    let p = app.partner_with_balance(10_000).await;
    let nul = "a\u{0}b";
    let mut key_with_nul = basket("prd_uc", 1, "p");
    key_with_nul["items"][0]["deliveryData"] = json!({ "username": "p", nul: "x" });
    let mut external = basket("prd_uc", 1, "p");
    external["externalOrderId"] = json!(nul);
    let cases = [
        (
            basket("prd_uc", 1, nul),
            json!(["body", "items", 0, "deliveryData", "username"]),
        ),
        (
            key_with_nul,
            json!(["body", "items", 0, "deliveryData", nul]),
        ),
        (external, json!(["body", "externalOrderId"])),
    ];
    for (n, (body, loc)) in cases.into_iter().enumerate() {
        let key = format!("nul-{n}");
        let response = app.post_order(Some(&p.api_key), Some(&key), &body).await;
        assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY, "{loc}");
        let answer: Value = response.json().await.unwrap();
        assert_eq!(answer["detail"][0]["loc"], loc, "{answer}");
        // Nothing stored: the key is still free for a first use without the U+0000.
        let clean = app
            .post_order(Some(&p.api_key), Some(&key), &basket("prd_uc", 1, "p"))
            .await;
        assert_eq!(clean.status(), StatusCode::OK, "{loc}: the key was taken");
        assert!(clean.headers().get("Idempotency-Replayed").is_none());
    }
    assert_eq!(app.balance(&p.api_key).await, 10_000 - 3 * 999);
    // The operator's text too: an account's name.
    let response = app
        .admin(
            Method::POST,
            "/admin/accounts",
            Some(json!({ "name": nul, "wholesale": true })),
        )
        .await;
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["detail"][0]["loc"], json!(["body", "name"]));
}

/// A stderr that nobody reads (a log shipper that stopped, a full journald) never holds a
/// request: 3,000 requests, each logging a line, against a pipe that takes 64 KiB and no
/// more, are all answered in time. (Lines past a thread's bound are dropped and counted:
/// `logging`'s own test.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stderr_nobody_reads_never_holds_a_request() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    /// Killed when the test ends, however it ends.
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_orderly"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--rate-limit",
            "1000000",
        ])
        .arg("--data-dir")
        .arg(dir.path().join("db"))
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map(Killed)
        .unwrap();
    // Held and never read: the pipe fills after 64 KiB of lines.
    let _stalled_stderr = child.0.stderr.take();
    let mut stdout = std::io::BufReader::new(child.0.stdout.take().unwrap());
    let mut line = String::new();
    let address = loop {
        line.clear();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "no address printed"
        );
        if let Some(address) = line.trim().strip_prefix("orderly listening on ") {
            break address.to_string();
        }
    };
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let started = Instant::now();
    for chunk in 0..150 {
        let sends = (0..20).map(|i| {
            client
                .get(format!("{address}/b2b/balance"))
                .header("X-Api-Key", format!("gc_live_{:032x}", chunk * 20 + i))
                .send()
        });
        for answer in join_all(sends).await {
            let answer = answer.unwrap_or_else(|e| panic!("no answer in chunk {chunk}: {e}"));
            assert_eq!(answer.status(), StatusCode::UNAUTHORIZED);
        }
    }
    eprintln!("3,000 requests answered in {:?}", started.elapsed());
}
