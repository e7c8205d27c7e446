//! docs/operations.md "Every flag of `orderly serve`" and "Health, readiness and metrics": metrics, the OpenAPI document, flags, and a graceful stop.

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::{basket, metric, spawn_app, spawn_app_with};

#[tokio::test]
async fn metrics_count_a_replay_and_a_conflict() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(10_000).await;
    app.post_order(Some(&p.api_key), Some("k"), &basket("prd_uc", 1, "p"))
        .await;
    app.post_order(Some(&p.api_key), Some("k"), &basket("prd_uc", 1, "p"))
        .await;
    app.post_order(Some(&p.api_key), Some("k"), &basket("prd_uc", 2, "p"))
        .await;

    let resp = app.client.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(
        !resp.headers().contains_key("X-RateLimit-Limit"),
        "/metrics is not rate-limited"
    );
    let text = resp.text().await.unwrap();
    assert_eq!(
        metric(&text, "orderly_idempotent_replays_total"),
        1.0,
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            "orderly_idempotency_conflicts_total{reason=\"different_body\"}"
        ),
        1.0
    );
    assert!(metric(&text, "orderly_commit_flush_seconds_count") >= 1.0);
    assert!(text.contains(
        "orderly_http_requests_total{route=\"/b2b/orders\",method=\"POST\",status=\"2xx\"}"
    ));
}

/// deploy/alerts.yml reads these: readiness, the process's start, the store's disk.
#[tokio::test]
async fn metrics_say_the_server_is_ready_when_it_started_and_how_much_disk_is_free() {
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let app = spawn_app().await;
    let text = app.text("/metrics").await;
    assert_eq!(metric(&text, "orderly_ready "), 1.0, "{text}");
    let started = metric(&text, "orderly_process_start_time_seconds");
    assert!(
        started >= before - 1.0 && started <= before + 60.0,
        "{started}"
    );
    assert!(metric(&text, "orderly_worker_panics_total{worker=\"fulfillment\"}") == 0.0);
    assert!(
        text.contains("orderly_worker_panics_total{worker=\"webhooks\"} 0"),
        "{text}"
    );
    let (free, size) = (
        metric(&text, "orderly_storage_disk_free_bytes"),
        metric(&text, "orderly_storage_disk_size_bytes"),
    );
    if app.database_url().is_some() {
        assert_eq!((free, size), (0.0, 0.0), "no local store on PostgreSQL");
    } else {
        assert!(size > 0.0 && free > 0.0 && free <= size, "{free} of {size}");
    }
}

#[tokio::test]
async fn the_openapi_document_is_3_1_and_marks_the_key_required_on_orders() {
    let app = spawn_app().await;
    let resp = app
        .client
        .get(app.url("/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(
        resp.headers().contains_key("X-RateLimit-Limit"),
        "/openapi.json is rate-limited"
    );
    let doc: Value = resp.json().await.unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
    let params = doc["paths"]["/b2b/orders"]["post"]["parameters"]
        .as_array()
        .unwrap();
    let key = params
        .iter()
        .find(|p| p["name"] == "X-Idempotency-Key")
        .unwrap();
    assert_eq!(key["required"], true);
}

#[test]
fn a_bad_flag_value_stops_the_start_with_exit_status_2() {
    for args in [
        vec!["--idempotency-ttl", "soon"],
        vec!["--trusted-proxies", "10.0.0.0/40"],
        vec!["--provider-secret", "no-equals-sign"],
        vec!["--rate-limit-override", "10.0.0.0/8=lots"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_orderly"))
            .arg("serve")
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("error:"),
            "{args:?}"
        );
    }
}

#[test]
fn every_flag_is_documented_by_serve_help() {
    let out = Command::new(env!("CARGO_BIN_EXE_orderly"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--listen",
        "--data-dir",
        "--demo",
        "--currency",
        "--admin-token",
        "--allowed-origins",
        "--rate-limit",
        "--rate-limit-override",
        "--trusted-proxies",
        "--idempotency-ttl",
        "--sweep-interval",
        "--fulfillment-delay",
        "--webhook-retry-schedule",
        "--webhook-origin-concurrency",
        "--allow-private-callbacks",
        "--provider-secret",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help");
    }
    assert!(help.contains("ORDERLY_LISTEN"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_during_a_burst_keeps_every_acknowledged_order_and_exits_0() {
    a_stop_signal_during_a_burst_keeps_every_acknowledged_order_and_exits_0("TERM").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigint_during_a_burst_keeps_every_acknowledged_order_and_exits_0() {
    a_stop_signal_during_a_burst_keeps_every_acknowledged_order_and_exits_0("INT").await;
}

async fn a_stop_signal_during_a_burst_keeps_every_acknowledged_order_and_exits_0(signal: &str) {
    let mut app = spawn_app_with(&[]).await;
    let p = app.partner_with_balance(1_000_000).await;
    let body = basket("prd_uc", 1, "p");
    let keys: Vec<String> = (0..60).map(|i| format!("term-{i}")).collect();

    // Requests that meet the closed listener fail; only the 200s are promises to keep.
    let send = |key: &String| {
        app.client
            .post(app.url("/b2b/orders"))
            .header("X-Api-Key", &p.api_key)
            .header("X-Idempotency-Key", key)
            .json(&body)
            .send()
    };
    let burst = join_all(keys.iter().map(send));
    let (responses, status) = tokio::join!(burst, async {
        tokio::time::sleep(Duration::from_millis(30)).await;
        app.signal(signal, Duration::from_secs(30))
    });
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "exit status 0 after SIG{signal}"
    );

    let mut acknowledged: HashMap<String, String> = HashMap::new();
    for (key, resp) in keys.iter().zip(responses) {
        if let Ok(resp) = resp {
            if resp.status() == StatusCode::OK {
                let v: Value = resp.json().await.unwrap();
                acknowledged.insert(key.clone(), v["order"]["id"].as_str().unwrap().to_string());
            }
        }
    }
    assert!(
        !acknowledged.is_empty(),
        "some orders were acknowledged before the stop"
    );
    let app = app.restart(&[]);
    let orders = app.orders(&p.api_key).await;
    for (key, id) in &acknowledged {
        assert!(
            orders.iter().any(|o| o["id"] == id.as_str()),
            "acknowledged order {id} survived"
        );
        let replay: Value = app
            .post_order(Some(&p.api_key), Some(key), &body)
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(replay["order"]["id"], id.as_str());
    }
    app.assert_ledger_matches_balance(&p.api_key).await;
}

#[test]
fn allowing_private_callbacks_logs_a_warning_at_start() {
    use std::io::{BufRead, BufReader};
    let root = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_orderly"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--allow-private-callbacks",
            "--data-dir",
        ])
        .arg(root.path().join("db"))
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if line.contains("WARN") && line.contains("--allow-private-callbacks") {
                let _ = tx.send(());
            }
        }
    });
    // Bounded: a server that never warns fails the test instead of hanging it.
    let warned = rx.recv_timeout(Duration::from_secs(10)).is_ok();
    let _ = child.kill();
    let _ = child.wait();
    assert!(warned, "no warning about --allow-private-callbacks");
}

#[tokio::test]
async fn sigint_lets_a_request_in_flight_finish() {
    let mut app = spawn_app_with(&[]).await;
    let p = app.partner_with_balance(10_000).await;
    let body = serde_json::to_vec(&basket("prd_uc", 1, "p")).unwrap();
    let (first, rest) = body.split_at(body.len() / 2);
    let (first, rest) = (first.to_vec(), rest.to_vec());
    // The body arrives in two halves; the second only after the signal, so the request is
    // in the server's hands, half read, when SIGINT comes.
    let (sending, started) = tokio::sync::oneshot::channel::<()>();
    let (signalled, go_on) = tokio::sync::oneshot::channel::<()>();
    let halves = futures::stream::unfold(
        (Some(first), Some(rest), Some(sending), Some(go_on)),
        |(first, rest, sending, go_on)| async move {
            if let Some(first) = first {
                let _ = sending.map(|s| s.send(()));
                return Some((Ok::<_, std::io::Error>(first), (None, rest, None, go_on)));
            }
            let rest = rest?;
            if let Some(go_on) = go_on {
                let _ = go_on.await;
            }
            Some((Ok(rest), (None, None, None, None)))
        },
    );
    let request = app
        .client
        .post(app.url("/b2b/orders"))
        .header("X-Api-Key", &p.api_key)
        .header("X-Idempotency-Key", "in-flight")
        .header("Content-Type", "application/json")
        .header("Content-Length", body.len())
        .body(reqwest::Body::wrap_stream(halves))
        .send();
    let request = tokio::spawn(request);
    started.await.unwrap();
    // The first half is on the wire; give the accept loop a moment to take the connection.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pid = app.pid();
    std::process::Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    signalled.send(()).unwrap();
    let answered = request
        .await
        .unwrap()
        .expect("the request in flight was answered");
    assert_eq!(answered.status(), StatusCode::OK);
    let status = app.signal("INT", Duration::from_secs(30));
    assert_eq!(status.and_then(|s| s.code()), Some(0));
}

#[tokio::test]
async fn stats_counts_the_rows_of_the_database_the_server_wrote_on_either_engine() {
    let mut app = spawn_app().await;
    let partner = app.partner_with_balance(5_000).await;
    let body = basket("prd_uc", 2, "stats");
    let response = app
        .post_order(Some(&partner.api_key), Some("stats-1"), &body)
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let database_url = app.database_url();
    let status = app.signal("TERM", Duration::from_secs(10));
    assert_eq!(status.and_then(|s| s.code()), Some(0), "a graceful stop");
    let mut stats = Command::new(env!("CARGO_BIN_EXE_orderly"));
    stats.arg("stats").env_remove("ORDERLY_DATABASE_URL");
    match &database_url {
        Some(url) => stats.args(["--database-url", url]),
        None => stats.arg("--data-dir").arg(&app.data_dir),
    };
    let out = stats.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let counts: HashMap<String, u64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let (name, rows) = line.split_once('\t')?;
            Some((name.to_string(), rows.parse().ok()?))
        })
        .collect();
    assert_eq!(counts.get("accounts"), Some(&1), "{counts:?}");
    assert_eq!(counts.get("orders"), Some(&1), "{counts:?}");
    assert_eq!(counts.get("products"), Some(&3), "{counts:?}");
}
