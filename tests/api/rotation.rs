//! docs/operations.md "Rotating credentials": admin tokens and provider secrets rotate without
//! a gap. Several are in force at once, a file flag's file is read again on SIGHUP, and a
//! caller holding either the old or the new credential is never refused while the operator
//! adds the new one everywhere, moves callers, and removes the old one; no restart. And
//! `--metrics-listen` takes `/metrics` off the API's listener.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{on_postgres, spawn_app_logging, spawn_app_with, start, TestApp};
use crate::providers::{notify, signature_with};

const OLD: &str = "adm-old-3c1d";
const NEW: &str = "adm-new-77ab";

/// `GET /admin/accounts` with `token`: its status.
async fn admin_status(app: &TestApp, token: &str) -> StatusCode {
    app.client
        .get(app.url("/admin/accounts"))
        .bearer_auth(token)
        .send()
        .await
        .expect("admin call")
        .status()
}

/// `kill -HUP` to the server: it reads its credential files again.
fn hang_up(app: &TestApp) {
    let pid = app.pid().to_string();
    let sent = std::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .expect("kill");
    assert!(sent.success());
}

/// Sends SIGHUP, then waits (at most 10 s) until `token` answers `expected` on `app`.
async fn hang_up_until(app: &TestApp, token: &str, expected: StatusCode) {
    hang_up(app);
    let deadline = Instant::now() + Duration::from_secs(10);
    while admin_status(app, token).await != expected {
        assert!(
            Instant::now() < deadline,
            "{token} never answered {expected}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Two instances, each with `--admin-token-file` (its own file): on PostgreSQL one database,
/// on sled a store each (a token's rotation is each process's own).
async fn two_instances(files: [&Path; 2]) -> (TestApp, TestApp) {
    let flag = |f: &Path| f.display().to_string();
    let (a, b) = (flag(files[0]), flag(files[1]));
    let first = spawn_app_with(&["--admin-token-file", &a]).await;
    let second = if on_postgres() {
        start(&first.data_dir, &["--admin-token-file", &b])
    } else {
        spawn_app_with(&["--admin-token-file", &b]).await
    };
    (first, second)
}

/// A caller sending admin reads with `token` to both instances in turn until stopped:
/// how many it sent, and how many were refused.
fn caller(
    apps: [Arc<TestApp>; 2],
    token: &'static str,
    stop: Arc<AtomicBool>,
) -> (tokio::task::JoinHandle<()>, Arc<AtomicU64>, Arc<AtomicU64>) {
    let (sent, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (s, r) = (Arc::clone(&sent), Arc::clone(&refused));
    let task = tokio::spawn(async move {
        let mut i = 0usize;
        // Bounded in count as well as by the flag.
        while !stop.load(Ordering::SeqCst) && i < 20_000 {
            let status = admin_status(&apps[i % 2], token).await;
            s.fetch_add(1, Ordering::SeqCst);
            if status != StatusCode::OK {
                r.fetch_add(1, Ordering::SeqCst);
            }
            i += 1;
        }
    });
    (task, sent, refused)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_admin_token_rotated_on_two_running_instances_never_refuses_a_caller_holding_either() {
    let dir = tempfile::tempdir().unwrap();
    let files = [dir.path().join("tokens-0"), dir.path().join("tokens-1")];
    for f in &files {
        std::fs::write(f, format!("old={OLD}\n")).unwrap();
    }
    let (first, second) = two_instances([&files[0], &files[1]]).await;
    let pids = [first.pid(), second.pid()];
    let apps = [Arc::new(first), Arc::new(second)];
    assert_eq!(admin_status(&apps[0], NEW).await, StatusCode::UNAUTHORIZED);

    // Callers on the old token, then the new one added everywhere.
    let stop_old = Arc::new(AtomicBool::new(false));
    let (old_task, old_sent, old_refused) = caller(apps.clone(), OLD, Arc::clone(&stop_old));
    for (app, file) in apps.iter().zip(&files) {
        std::fs::write(file, format!("old={OLD}\nnew={NEW}\n")).unwrap();
        hang_up_until(app, NEW, StatusCode::OK).await;
    }
    // Callers moved: the new token's caller starts, the old token's stops.
    let stop_new = Arc::new(AtomicBool::new(false));
    let (new_task, new_sent, new_refused) = caller(apps.clone(), NEW, Arc::clone(&stop_new));
    while new_sent.load(Ordering::SeqCst) < 20 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop_old.store(true, Ordering::SeqCst);
    old_task.await.unwrap();
    // The old token removed everywhere.
    for (app, file) in apps.iter().zip(&files) {
        std::fs::write(file, format!("new={NEW}\n")).unwrap();
        hang_up_until(app, OLD, StatusCode::UNAUTHORIZED).await;
    }
    stop_new.store(true, Ordering::SeqCst);
    new_task.await.unwrap();

    let (sent, refused) = (
        old_sent.load(Ordering::SeqCst),
        old_refused.load(Ordering::SeqCst),
    );
    assert!(sent >= 2, "the old token's caller ran ({sent})");
    assert_eq!(
        refused, 0,
        "the old token refused {refused} of {sent} while in force"
    );
    let (sent, refused) = (
        new_sent.load(Ordering::SeqCst),
        new_refused.load(Ordering::SeqCst),
    );
    assert!(sent >= 20);
    assert_eq!(refused, 0, "the new token refused {refused} of {sent}");
    assert_eq!([apps[0].pid(), apps[1].pid()], pids, "no restart");
}

#[tokio::test]
async fn an_admin_requests_log_line_names_its_token_and_never_shows_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens");
    std::fs::write(&file, format!("# the operators\nops-2026={NEW}\n")).unwrap();
    let app = spawn_app_logging(&["--admin-token-file", &file.display().to_string()]).await;
    assert_eq!(admin_status(&app, NEW).await, StatusCode::OK);
    assert_eq!(admin_status(&app, OLD).await, StatusCode::UNAUTHORIZED);
    let named = logged_line(&app, "GET /admin/accounts 200").await;
    assert!(named.contains(" admin_token=ops-2026"), "{named}");
    let refused = logged_line(&app, "GET /admin/accounts 401").await;
    assert!(!refused.contains("admin_token="), "{refused}");
    let logged = app.logged().join("\n");
    assert!(!logged.contains(NEW) && !logged.contains(OLD), "{logged}");
}

/// The first line the server logged that contains `what` (lines reach stderr within 50 ms of
/// their request; waits at most 10 s).
async fn logged_line(app: &TestApp, what: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let logged = app.logged();
        if let Some(line) = logged.iter().find(|l| l.contains(what)) {
            return line.clone();
        }
        assert!(Instant::now() < deadline, "no line with {what}: {logged:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_token_file_that_no_longer_parses_keeps_the_tokens_in_force() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens");
    std::fs::write(&file, format!("old={OLD}\n")).unwrap();
    let app = spawn_app_with(&["--admin-token-file", &file.display().to_string()]).await;
    // Two tokens under one name: the reload is refused as a whole.
    std::fs::write(&file, format!("old={OLD}\nold={NEW}\n")).unwrap();
    hang_up(&app);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !app.logged().iter().any(|l| l.contains("SIGHUP")) {
        assert!(Instant::now() < deadline, "no SIGHUP line");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(admin_status(&app, OLD).await, StatusCode::OK);
    assert_eq!(admin_status(&app, NEW).await, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_start_with_an_unreadable_token_file_is_refused_with_one_line_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("absent");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_orderly"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("db"))
        .arg("--admin-token-file")
        .arg(&missing)
        .env_remove("ORDERLY_ADMIN_TOKEN")
        .env_remove("ORDERLY_DATABASE_URL")
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("cannot read") && stderr.contains("absent"),
        "{stderr}"
    );
    assert!(!dir.path().join("db").exists(), "the store was not created");
}

#[tokio::test]
async fn a_provider_rolling_its_secret_is_accepted_by_either_until_the_old_one_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("providers");
    std::fs::write(&file, "acmepay=sec-old\n").unwrap();
    let app = spawn_app_logging(&["--provider-secret-file", &file.display().to_string()]).await;
    let p = app.partner_with_balance(0).await;
    let pid = app.pid();
    let body = |n: u32| {
        serde_json::to_vec(
            &json!({"id": format!("pay_{n}"), "type": "payment.succeeded",
            "accountId": p.account_id, "amount": 100, "currency": "USD"}),
        )
        .unwrap()
    };
    let send = |n: u32, secret: &'static str| {
        let b = body(n);
        let app = &app;
        async move {
            notify(app, "acmepay", &b, &signature_with(secret, &b))
                .await
                .status()
        }
    };
    assert_eq!(send(1, "sec-old").await, StatusCode::OK);
    assert_eq!(send(2, "sec-new").await, StatusCode::UNAUTHORIZED);

    // The new secret added beside the old: the provider switches mid-stream.
    std::fs::write(&file, "acmepay=sec-old\nacmepay=sec-new\n").unwrap();
    hang_up_and_wait(&app).await;
    for n in 3..13 {
        let secret = if n < 8 { "sec-old" } else { "sec-new" };
        assert_eq!(send(n, secret).await, StatusCode::OK, "payment {n}");
    }
    // The old secret retired: only the new one signs.
    std::fs::write(&file, "acmepay=sec-new\n").unwrap();
    hang_up_and_wait(&app).await;
    assert_eq!(send(13, "sec-old").await, StatusCode::UNAUTHORIZED);
    assert_eq!(send(14, "sec-new").await, StatusCode::OK);
    assert_eq!(app.pid(), pid, "no restart");
    // 1, 3 to 12 and 14 credited, 100 each; the refused ones nothing.
    assert_eq!(app.assert_ledger_matches_balance(&p.api_key).await, 1_200);
}

/// A provider sending payments of 1 (each its own id) to both instances in turn until stopped,
/// each signed with the secret it signs with at that moment: how many it sent, how many were
/// refused.
fn provider_sending(
    apps: [Arc<TestApp>; 2],
    account: String,
    signing: Arc<std::sync::Mutex<&'static str>>,
    stop: Arc<AtomicBool>,
) -> (tokio::task::JoinHandle<()>, Arc<AtomicU64>, Arc<AtomicU64>) {
    let (sent, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (s, r) = (Arc::clone(&sent), Arc::clone(&refused));
    let task = tokio::spawn(async move {
        let mut i = 0usize;
        while !stop.load(Ordering::SeqCst) && i < 20_000 {
            let body = serde_json::to_vec(&json!({"id": format!("pay_{i}"),
                "type": "payment.succeeded", "accountId": account, "amount": 1, "currency": "USD"}))
            .unwrap();
            let secret = *signing.lock().unwrap();
            let status = notify(
                &apps[i % 2],
                "acmepay",
                &body,
                &signature_with(secret, &body),
            )
            .await
            .status();
            s.fetch_add(1, Ordering::SeqCst);
            if status != StatusCode::OK {
                r.fetch_add(1, Ordering::SeqCst);
            }
            i += 1;
        }
    });
    (task, sent, refused)
}

/// Sends SIGHUP, then waits (at most 10 s) until a notification that moves no money, signed
/// with `secret`, answers `expected` on `app`.
async fn hang_up_until_signed(app: &TestApp, secret: &str, expected: StatusCode) {
    hang_up(app);
    let body = serde_json::to_vec(&json!({"id": "probe", "type": "payment.probe",
        "accountId": "acc_x", "amount": 1, "currency": "USD"}))
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while notify(app, "acmepay", &body, &signature_with(secret, &body))
        .await
        .status()
        != expected
    {
        assert!(
            Instant::now() < deadline,
            "{secret} never answered {expected}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_provider_secret_rotated_on_two_running_instances_never_refuses_a_notification_signed_by_either(
) {
    let dir = tempfile::tempdir().unwrap();
    let files = [
        dir.path().join("providers-0"),
        dir.path().join("providers-1"),
    ];
    for f in &files {
        std::fs::write(f, "acmepay=sec-old\n").unwrap();
    }
    let flag = |f: &Path| f.display().to_string();
    let first = spawn_app_with(&["--provider-secret-file", &flag(&files[0])]).await;
    let partner = first.partner_with_balance(0).await;
    // On PostgreSQL a second instance on the same database, with its own file; on sled the
    // one process (and its file) twice.
    let second = on_postgres().then(|| {
        start(
            &first.data_dir,
            &["--provider-secret-file", &flag(&files[1])],
        )
    });
    let files = if second.is_some() {
        files.clone()
    } else {
        [files[0].clone(), files[0].clone()]
    };
    let first = Arc::new(first);
    let second = second.map(Arc::new).unwrap_or_else(|| Arc::clone(&first));
    let apps = [first, second];
    let pids = [apps[0].pid(), apps[1].pid()];

    let signing = Arc::new(std::sync::Mutex::new("sec-old"));
    let stop = Arc::new(AtomicBool::new(false));
    let (task, sent, refused) = provider_sending(
        apps.clone(),
        partner.account_id.clone(),
        Arc::clone(&signing),
        Arc::clone(&stop),
    );
    while sent.load(Ordering::SeqCst) < 20 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The new secret added beside the old one on every instance, then the provider switches.
    for (app, file) in apps.iter().zip(&files) {
        std::fs::write(file, "acmepay=sec-old\nacmepay=sec-new\n").unwrap();
        hang_up_until_signed(app, "sec-new", StatusCode::OK).await;
    }
    let switched_at = sent.load(Ordering::SeqCst);
    *signing.lock().unwrap() = "sec-new";
    while sent.load(Ordering::SeqCst) < switched_at + 20 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The old secret retired everywhere.
    for (app, file) in apps.iter().zip(&files) {
        std::fs::write(file, "acmepay=sec-new\n").unwrap();
        hang_up_until_signed(app, "sec-old", StatusCode::UNAUTHORIZED).await;
    }
    stop.store(true, Ordering::SeqCst);
    task.await.unwrap();

    let (sent, refused) = (sent.load(Ordering::SeqCst), refused.load(Ordering::SeqCst));
    assert!(
        switched_at >= 20,
        "the provider signed with the old secret ({switched_at})"
    );
    assert_eq!(refused, 0, "{refused} of {sent} notifications refused");
    assert_eq!([apps[0].pid(), apps[1].pid()], pids, "no restart");
    // Each one credited once, through whichever instance it reached.
    let balance = apps[1]
        .assert_ledger_matches_balance(&partner.api_key)
        .await;
    assert_eq!(balance, sent as i64);
}

/// SIGHUP, then waits until the server says it read its credentials again.
async fn hang_up_and_wait(app: &TestApp) {
    let before = count_reloads(app);
    hang_up(app);
    let deadline = Instant::now() + Duration::from_secs(10);
    while count_reloads(app) == before {
        assert!(Instant::now() < deadline, "no reload line");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn count_reloads(app: &TestApp) -> usize {
    app.logged()
        .iter()
        .filter(|l| l.contains("SIGHUP: credentials read again"))
        .count()
}

#[tokio::test]
async fn with_metrics_listen_metrics_are_served_there_and_the_api_listener_answers_them_404() {
    let app = spawn_app_with(&["--metrics-listen", "127.0.0.1:0"]).await;
    let on_api = app.client.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(on_api.status(), StatusCode::NOT_FOUND);
    let body: serde_json::Value = on_api.json().await.unwrap();
    assert_eq!(body["code"], "ROUTE_NOT_FOUND");
    let at = metrics_address(&app).await;
    let scraped = app
        .client
        .get(format!("http://{at}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(scraped.status(), StatusCode::OK);
    assert!(scraped.text().await.unwrap().contains("orderly_"));
    // Nothing else is answered on the metrics listener.
    let other = app
        .client
        .get(format!("http://{at}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        app.client
            .get(app.url("/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
}

/// The metrics listener's address, from its start line ("orderly metrics on http://ADDR/metrics").
async fn metrics_address(app: &TestApp) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found = app.printed().into_iter().find_map(|l| {
            let rest = l.strip_prefix("orderly metrics on http://")?;
            Some(rest.split('/').next()?.to_string())
        });
        if let Some(at) = found {
            return at;
        }
        assert!(Instant::now() < deadline, "no metrics line");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
