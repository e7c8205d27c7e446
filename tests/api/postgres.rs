//! docs/contract.md "6. Many instances" where PostgreSQL differs from the embedded engine: a schema newer than the
//! binary, a balance row held by another transaction past every retry (the 402 `Concurrent
//! balance modification`, which sled never produces), and the database stopped and started
//! under load (`/readyz` 503 meanwhile, no acknowledged order lost, service back without
//! restarting orderly). Each runs only when `ORDERLY_TEST_DATABASE_URL` is set.

use std::collections::HashMap;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::{
    as_server_role, back_to_schema, basket, create_database_sql, maintenance_sql, metric, script,
    spawn_app, spawn_app_with, sql_i64, sql_on, start, wait_until_completed, TestDatabase,
};

#[test]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
fn a_schema_newer_than_the_binary_stops_serve_and_migrate_with_one_line_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let database = TestDatabase::create(&dir.path().join("db"));
    sql_on(
        database.url.clone(),
        "INSERT INTO orderly_schema_migrations (version, applied_at) VALUES (9999, now())".into(),
    )
    .unwrap();
    for args in [
        vec![
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            &database.url,
        ],
        vec!["migrate", "--database-url", &database.url],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_orderly"))
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "one line on stderr: {stderr}");
        assert!(stderr.contains("9999"), "{stderr}");
    }
}

/// Runs `hold` on a connection of its own to `url`, on a thread and runtime of its own, and
/// returns once `hold` says (through its sender) that what it holds is held.
pub fn in_own_session<Hold, Holding>(url: String, hold: Hold)
where
    Hold: FnOnce(tokio_postgres::Client, mpsc::Sender<()>) -> Holding + Send + 'static,
    Holding: std::future::Future<Output = ()>,
{
    let (ready, is_ready) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(connection);
            hold(client, ready).await;
        });
    });
    is_ready.recv().unwrap();
}

/// Runs `sql` with `params` in an open transaction of a session of its own, and holds what it
/// locks until the returned sender is dropped (60 s at the most: a failed test lets go).
pub fn hold_in_session(url: String, sql: &'static str, params: Vec<String>) -> mpsc::Sender<()> {
    let (release, released) = mpsc::channel::<()>();
    in_own_session(url, move |mut client, ready| async move {
        let tx = client.transaction().await.unwrap();
        let args: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
            params.iter().map(|p| p as _).collect();
        tx.execute(sql, &args).await.unwrap();
        ready.send(()).unwrap();
        let _ = tokio::task::spawn_blocking(move || released.recv_timeout(Duration::from_secs(60)))
            .await;
        tx.rollback().await.unwrap();
    });
    release
}

/// Holds the account's balance row locked (`SELECT … FOR UPDATE` in an open transaction)
/// until the returned sender is dropped.
pub fn hold_balance_row(url: String, account: String) -> mpsc::Sender<()> {
    hold_in_session(
        url,
        "SELECT 1 FROM balances WHERE account_id = $1 FOR UPDATE",
        vec![account],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn an_order_whose_balance_row_stays_locked_past_the_retries_is_the_402_concurrent_balance_modification(
) {
    let app = spawn_app().await;
    let p = app.partner_with_balance(10_000).await;
    let body = basket("prd_uc", 1, "p");
    let held = hold_balance_row(app.database_url().unwrap(), p.account_id.clone());

    let started = Instant::now();
    let resp = app.post_order(Some(&p.api_key), Some("held"), &body).await;
    assert_eq!(resp.status(), StatusCode::PAYMENT_REQUIRED);
    assert_eq!(
        resp.text().await.unwrap(),
        r#"{"success":false,"error":"Concurrent balance modification","code":"CONCURRENT_BALANCE_MODIFICATION"}"#
    );
    assert!(started.elapsed() < Duration::from_secs(25), "bounded");

    // Nothing was written: once the row is free, the same key is a first use.
    drop(held);
    let resp = app.post_order(Some(&p.api_key), Some("held"), &body).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp.headers().get("Idempotency-Replayed").is_none());
    assert_eq!(
        app.assert_ledger_matches_balance(&p.api_key).await,
        10_000 - 999
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn orders_queued_behind_batches_waiting_on_a_held_balance_row_are_answered_first() {
    let app = Arc::new(spawn_app().await);
    let held_partner = app.partner_with_balance(10_000).await;
    let free_partner = app.partner_with_balance(100_000).await;
    let body = basket("prd_uc", 1, "p");
    let url = app.database_url().unwrap();
    let held = hold_balance_row(url.clone(), held_partner.account_id.clone());
    let answered = Arc::new(Mutex::new(Vec::new()));
    let send = |held_account: bool, key: String| {
        let (app, answered, body) = (Arc::clone(&app), Arc::clone(&answered), body.clone());
        let api_key = if held_account {
            held_partner.api_key.clone()
        } else {
            free_partner.api_key.clone()
        };
        tokio::spawn(async move {
            let resp = app.post_order(Some(&api_key), Some(&key), &body).await;
            answered.lock().unwrap().push((held_account, resp.status()));
        })
    };
    // Four orders of the held account, their batch waiting on the row (a batch in flight
    // holds its accounts, so the four are one batch or wait behind it). Then twenty orders
    // of another account, queued behind them.
    let mut sends: Vec<_> = (0..4).map(|i| send(true, format!("held-{i}"))).collect();
    let waiting = "SELECT count(*) FROM pg_stat_activity
                   WHERE wait_event_type = 'Lock' AND datname = current_database()";
    let deadline = Instant::now() + Duration::from_secs(10);
    while sql_i64(url.clone(), waiting.into()).unwrap() < 1 {
        assert!(
            Instant::now() < deadline,
            "the held orders never waited on the row"
        );
        tokio::task::yield_now().await;
    }
    sends.extend((0..20).map(|i| send(false, format!("free-{i}"))));
    for send in sends {
        send.await.unwrap();
    }
    drop(held);
    let answered = answered.lock().unwrap().clone();
    let first_held = answered.iter().position(|(held, _)| *held).unwrap();
    assert_eq!(
        first_held, 20,
        "every other order is answered first: {answered:?}"
    );
    for (held_account, status) in &answered {
        let expected = if *held_account {
            StatusCode::PAYMENT_REQUIRED
        } else {
            StatusCode::OK
        };
        assert_eq!(*status, expected, "{answered:?}");
    }
    assert_eq!(app.balance(&free_partner.api_key).await, 100_000 - 20 * 999);
    assert_eq!(app.balance(&held_partner.api_key).await, 10_000);
}

pub fn cluster(command: &str, dir: &std::path::Path) -> String {
    cluster_of(command, dir, "")
}

/// `scripts/pg-cluster.sh COMMAND DIR [ARG]` (a standby's primary, say); what it printed.
pub fn cluster_of(command: &str, dir: &std::path::Path, arg: &str) -> String {
    let dir = dir.as_os_str();
    let args: Vec<&std::ffi::OsStr> = [command.as_ref(), dir]
        .into_iter()
        .chain((!arg.is_empty()).then_some(arg.as_ref()))
        .collect();
    script("pg-cluster.sh", &args).unwrap_or_else(|why| panic!("{why}"))
}

/// Stops this test's own cluster (even when the test fails).
pub struct OwnCluster(pub std::path::PathBuf);

impl Drop for OwnCluster {
    fn drop(&mut self) {
        let _ = script("pg-cluster.sh", &["stop".as_ref(), self.0.as_os_str()]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn the_database_stopped_and_started_under_load_loses_no_acknowledged_order() {
    // A cluster of its own: the shared one serves the other tests meanwhile.
    let dir = std::env::temp_dir().join(format!("orderly-pg-restart-{}", std::process::id()));
    let url = cluster("start", &dir);
    let own = OwnCluster(dir.clone());
    let mut database_url = url::Url::parse(&url).unwrap();
    database_url.set_path("/orderly");
    sql_on(url.clone(), create_database_sql("orderly", None)).unwrap();
    let data_dir = dir.join("unused-data-dir");
    let server_url = as_server_role(database_url.as_str());
    let app = start(&data_dir, &["--database-url", server_url.as_str()]);
    let p = app.partner_with_balance(10_000_000).await;
    let body = basket("prd_uc", 1, "p");

    let acknowledged: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let refused = Arc::new(Mutex::new(0usize));
    let stop = Arc::new(AtomicBool::new(false));
    let load = (0..4).map(|worker| {
        let (client, url, api_key, body) = (
            app.client.clone(),
            app.url("/b2b/orders"),
            p.api_key.clone(),
            body.clone(),
        );
        let (acknowledged, refused, stop) = (
            Arc::clone(&acknowledged),
            Arc::clone(&refused),
            Arc::clone(&stop),
        );
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                let key = format!("w{worker}-{i}");
                i += 1;
                let sent = client
                    .post(&url)
                    .header("X-Api-Key", &api_key)
                    .header("X-Idempotency-Key", &key)
                    .json(&body)
                    .send()
                    .await;
                match sent {
                    Ok(resp) if resp.status() == StatusCode::OK => {
                        let v: Value = resp.json().await.unwrap();
                        let id = v["order"]["id"].as_str().unwrap().to_string();
                        acknowledged.lock().unwrap().insert(key, id);
                    }
                    Ok(resp) => {
                        assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR, "{key}");
                        *refused.lock().unwrap() += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    Err(e) => panic!("{key}: orderly itself must keep answering: {e}"),
                }
            }
        })
    });
    let load: Vec<_> = load.collect();
    let readyz = |app: &crate::helpers::TestApp| {
        let (client, url) = (app.client.clone(), app.url("/readyz"));
        async move { client.get(url).send().await.unwrap().status() }
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = acknowledged.lock().unwrap().len();
    assert!(before > 0, "orders were acknowledged before the stop");

    cluster("down", &dir);
    assert_eq!(readyz(&app).await, StatusCode::SERVICE_UNAVAILABLE);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(readyz(&app).await, StatusCode::SERVICE_UNAVAILABLE);
    let during = acknowledged.lock().unwrap().len();
    cluster("up", &dir);

    // Back without restarting orderly: /readyz, then new orders.
    let deadline = Instant::now() + Duration::from_secs(20);
    while readyz(&app).await != StatusCode::OK {
        assert!(Instant::now() < deadline, "/readyz did not come back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let back = Instant::now() + Duration::from_secs(20);
    while acknowledged.lock().unwrap().len() < during + 20 {
        assert!(Instant::now() < back, "orders did not resume");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for task in load {
        task.await.unwrap();
    }
    assert!(
        *refused.lock().unwrap() > 0,
        "some orders met the stopped database"
    );

    let orders = app.orders(&p.api_key).await;
    let acknowledged = acknowledged.lock().unwrap().clone();
    for (key, id) in &acknowledged {
        assert!(
            orders.iter().any(|o| o["id"] == id.as_str()),
            "acknowledged order {id} ({key}) is there"
        );
    }
    for (key, id) in acknowledged.iter().take(20) {
        let replay: Value = app
            .post_order(Some(&p.api_key), Some(key), &body)
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(replay["order"]["id"], id.as_str(), "{key} replays");
    }
    app.assert_ledger_matches_balance(&p.api_key).await;
    drop(app);
    drop(own);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn a_database_whose_default_isolation_is_repeatable_read_still_takes_concurrent_orders_and_top_ups_of_one_account(
) {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("db");
    let database = TestDatabase::create(&dir);
    // What a DBA might set: every transaction that does not state its level would run so.
    maintenance_sql(format!(
        "ALTER DATABASE {} SET default_transaction_isolation = 'repeatable read'",
        database.name
    ))
    .unwrap();
    let app = start(&dir, &[]);
    let p = app.partner_with_balance(1_000_000).await;
    let body = basket("prd_uc", 1, "p");
    let keys: Vec<String> = (0..40).map(|i| format!("hot-{i}")).collect();

    // Orders and top-ups of one account at once: each write waits for the balance row that
    // the one before it updated, which under REPEATABLE READ is a serialization failure.
    let orders = futures::future::join_all(
        keys.iter()
            .map(|key| app.post_order(Some(&p.api_key), Some(key), &body)),
    );
    let credits = futures::future::join_all((0..40).map(|_| app.credit(&p.account_id, 100)));
    let (answers, _) = futures::future::join(orders, credits).await;
    let statuses: Vec<u16> = answers.iter().map(|r| r.status().as_u16()).collect();
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    assert_eq!(
        app.assert_ledger_matches_balance(&p.api_key).await,
        1_000_000 - 999 * 40 + 100 * 40
    );
}

/// Holds orderly's migration lock on `url` from a session of its own for `held`.
fn hold_migration_lock(url: String, held: Duration) {
    in_own_session(url, move |client, ready| async move {
        // The constant of src/store/postgres/migrate.rs ("orderly").
        client
            .execute("SELECT pg_advisory_lock($1)", &[&0x006f_7264_6572_6c79_i64])
            .await
            .unwrap();
        ready.send(()).unwrap();
        tokio::time::sleep(held).await;
    });
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn an_instance_that_starts_while_another_migrates_waits_for_the_lock_instead_of_exiting() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("db");
    let database = TestDatabase::create(&dir);
    // Longer than the session's lock_timeout (3 s), which used to end the wait with exit 1.
    hold_migration_lock(database.url.clone(), Duration::from_secs(5));
    let started = Instant::now();

    let app = start(&dir, &[]);
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "listened after {:?}, while the lock was held",
        started.elapsed()
    );
    let resp = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn an_order_whose_key_another_session_holds_past_the_lock_timeout_is_the_in_progress_409_not_a_500(
) {
    let app = spawn_app().await;
    let p = app.partner_with_balance(10_000).await;
    let body = basket("prd_uc", 1, "p");
    // The key's lock as another instance's first use would hold it: longer than every try.
    let release = hold_in_session(
        app.database_url().unwrap(),
        "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
        vec![format!("{}busy", p.account_id)],
    );

    let resp = app.post_order(Some(&p.api_key), Some("busy"), &body).await;
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    assert_eq!(
        resp.text().await.unwrap(),
        r#"{"success":false,"error":"Duplicate request in progress, retry later","code":"REQUEST_IN_PROGRESS"}"#
    );

    // Nothing was written: once the key is free, the same request is its first use.
    drop(release);
    let resp = app.post_order(Some(&p.api_key), Some("busy"), &body).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp.headers().get("Idempotency-Replayed").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn three_hundred_clients_at_once_cost_the_shared_limiter_at_most_one_statement_per_tick() {
    let app = spawn_app_with(&["--trusted-proxies", "127.0.0.1/32"]).await;
    let started = Instant::now();
    let answers = futures::future::join_all((0..300).map(|i| {
        app.client
            .get(app.url("/b2b/balance"))
            .header("X-Forwarded-For", format!("198.18.{}.{}", i / 250, i % 250))
            .send()
    }))
    .await;
    let elapsed = started.elapsed();
    for answer in answers {
        let answer = answer.unwrap();
        assert_eq!(answer.status(), StatusCode::UNAUTHORIZED);
        // Spent from the shared budget, each client its own bucket.
        assert_eq!(answer.headers()["X-RateLimit-Remaining"], "999999");
    }
    let text = app.text("/metrics").await;
    let statements = metric(&text, "orderly_rate_limit_statements_total");
    assert_eq!(
        metric(&text, "orderly_rate_limit_buckets_spent_total"),
        300.0
    );
    // One statement per tick of 2 ms at most, whatever the number of clients.
    let ticks = (elapsed.as_millis() / 2 + 1) as f64;
    assert!(
        statements >= 1.0 && statements <= ticks,
        "{statements} statements in {elapsed:?} for 300 clients"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn budget_lent_to_an_instance_and_not_drawn_goes_back_to_the_client() {
    // 1,200 a minute: one request's worth comes back every 50 ms.
    let app = spawn_app_with(&["--rate-limit", "1200"]).await;
    let wave = 32;
    let mut sent = 0;
    let mut last_answered = Instant::now();
    let mut returned = 0.0;
    // Waves of requests at once, until some wait together and are lent budget beyond them
    // (while at least 1,024 requests are left) that lapses undrawn (after 200 ms): four waves
    // at most, so that the budget left stays above the floor.
    for _ in 0..4 {
        let answers = futures::future::join_all(
            (0..wave).map(|_| app.client.get(app.url("/b2b/balance")).send()),
        )
        .await;
        for answer in answers {
            assert_eq!(answer.unwrap().status(), StatusCode::UNAUTHORIZED);
        }
        sent += wave;
        last_answered = Instant::now();
        let deadline = Instant::now() + Duration::from_millis(500);
        while returned == 0.0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let text = app.text("/metrics").await;
            returned = metric(&text, "orderly_rate_limit_returned_total");
        }
        if returned > 0.0 {
            break;
        }
    }
    assert!(returned > 0.0, "budget was lent and given back");

    let since_last = last_answered.elapsed();
    let last = app
        .client
        .get(app.url("/b2b/balance"))
        .send()
        .await
        .unwrap();
    let remaining: i64 = last.headers()["X-RateLimit-Remaining"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    // The client spent what it sent and no more: 1,200 less its requests, plus at least what
    // came back since the last of them was answered. Budget lent and kept would be missing.
    let spent = sent + 1;
    let came_back = (since_last.as_millis() / 50) as i64;
    assert!(
        remaining >= 1200 - spent + came_back - 1,
        "remaining {remaining} after {spent} requests, {came_back} back since"
    );
}

/// docs/contract.md "When the storage is slow": statements are prepared and kept only where nothing can hand a server session to
/// another client with a kept statement missing, or someone else's under its name: directly,
/// or behind a pooler proved at start to keep statements itself (PgBouncer 1.21 and newer);
/// behind anything else every statement goes unnamed. The log says which, and orders and
/// their replays work either way. CI runs it direct, through PgBouncer 1.18 and through 1.25
/// (with `ORDERLY_TEST_POOLER_KEEPS_STATEMENTS=1`).
#[tokio::test]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn the_log_says_whether_statements_are_kept_as_the_path_to_the_database_allows() {
    let pooled = std::env::var("ORDERLY_TEST_POOLER_URL").is_ok_and(|u| !u.trim().is_empty());
    let keeps = std::env::var("ORDERLY_TEST_POOLER_KEEPS_STATEMENTS").is_ok_and(|v| v == "1");
    let expected = match (pooled, keeps) {
        (false, _) => "PostgreSQL is reached directly: statements are prepared once per connection",
        (true, true) => "keeps prepared statements itself (PgBouncer's max_prepared_statements): statements are prepared once per connection",
        (true, false) => "does not keep prepared statements: every statement is sent unnamed",
    };
    let app = crate::helpers::spawn_app_logging(&[]).await;
    // Said before the server listens; its stderr is read on a thread of its own.
    let until = Instant::now() + Duration::from_secs(5);
    let said = loop {
        let said: Vec<String> = app
            .logged()
            .into_iter()
            .filter(|line| line.contains("statements"))
            .collect();
        if !said.is_empty() || Instant::now() >= until {
            break said;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        said.len() == 1 && said[0].contains(expected),
        "expected one line saying {expected:?}, got {said:?}"
    );

    // Many transactions over the pool's connections, each statement run many times.
    let p = app.partner_with_balance(1_000_000).await;
    for round in 0..2 {
        let answers = futures::future::join_all((0..40).map(|i| {
            let body = basket("prd_uc", 1, "p");
            let (app, key) = (&app, p.api_key.clone());
            async move {
                app.post_order(Some(&key), Some(&format!("k-{i}")), &body)
                    .await
            }
        }))
        .await;
        for resp in answers {
            assert_eq!(resp.status(), StatusCode::OK);
            let replayed = resp.headers().get("Idempotency-Replayed").is_some();
            assert_eq!(replayed, round == 1, "round {round}");
        }
    }
    assert_eq!(
        app.assert_ledger_matches_balance(&p.api_key).await,
        1_000_000 - 40 * 999
    );
}

/// A key made up by the caller (valid in form, never created).
fn made_up_key(i: u64) -> String {
    format!("gc_live_{:032x}", 0x5eed_0000_0000u64 + i * 7919)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn keys_that_do_not_exist_are_refused_from_memory_with_no_lookup_and_no_growth() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(0).await;
    // A key that exists and has no copy here yet is looked up once: the counter counts.
    let before = app.text("/metrics").await;
    let reads_before = metric(&before, "orderly_api_key_reads_total");
    let known = metric(&before, "orderly_api_keys_known");
    assert!(known >= 1.0, "the partner's key is known: {known}");
    let fresh = app.create_key(&p.account_id, &["balance:read"]).await;
    assert_eq!(
        app.get(&fresh, "/b2b/balance").await.status(),
        StatusCode::OK
    );
    let text = app.text("/metrics").await;
    assert_eq!(
        metric(&text, "orderly_api_key_reads_total"),
        reads_before + 1.0
    );
    assert_eq!(metric(&text, "orderly_api_keys_known"), known + 1.0);

    // A thousand made-up keys, a new one each time, then one of them repeated: every one a
    // 401, none looked up, nothing remembered.
    let reads = metric(&text, "orderly_api_key_reads_total");
    for round in 0..2u64 {
        let answers = futures::future::join_all((0..500u64).map(|i| {
            let (key, app) = (made_up_key(if round == 0 { i } else { 7 }), &app);
            async move { app.get(&key, "/b2b/balance").await.status() }
        }))
        .await;
        assert!(answers.iter().all(|s| *s == StatusCode::UNAUTHORIZED));
    }
    let after = app.text("/metrics").await;
    assert_eq!(metric(&after, "orderly_api_key_reads_total"), reads);
    assert_eq!(metric(&after, "orderly_api_keys_known"), known + 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn a_key_an_older_binary_writes_is_learned_within_a_renewal() {
    // An instance of an older version, still running during a rolling upgrade, inserts its
    // keys without knowing of `changed_in`: the table's trigger records the change anyway.
    use sha2::Digest;
    let app = spawn_app().await;
    let p = app.partner_with_balance(0).await;
    let key = made_up_key(424_242);
    let hash: String = sha2::Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let url = app.database_url().expect("a PostgreSQL server");
    sql_on(
        url,
        format!(
            "INSERT INTO api_keys (hash, id, account_id, scopes, revoked, created_at)
             SELECT '\\x{hash}', 'key_{hash:.32}', account_id, scopes, false, created_at
             FROM api_keys WHERE account_id = '{}' LIMIT 1",
            p.account_id
        ),
    )
    .unwrap();
    let started = Instant::now();
    loop {
        let status = app.get(&key, "/b2b/balance").await.status();
        if status == StatusCode::OK {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "still {status} after {:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Orders left waiting for fulfillment by a schema before migration 8 (the queue's index on id
/// alone) are completed once a newer binary has applied it: the upgrade moves the queue to the
/// index on creation time without losing an order from it.
#[tokio::test]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn orders_waiting_under_the_schema_before_the_due_time_index_are_completed_after_the_upgrade()
{
    let mut app = spawn_app_with(&["--fulfillment-delay", "1h"]).await;
    let p = app.partner_with_balance(10_000).await;
    let mut ids = Vec::new();
    for key in ["wait-1", "wait-2", "wait-3"] {
        let resp = app
            .post_order(Some(&p.api_key), Some(key), &basket("prd_uc", 1, "p"))
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
        let body: Value = resp.json().await.unwrap();
        ids.push(body["order"]["id"].as_str().unwrap().to_string());
    }
    let url = app.database_url().expect("on PostgreSQL");
    assert!(app.signal("TERM", Duration::from_secs(20)).is_some());
    // The database as the binary before migration 8 left it, its orders still waiting.
    back_to_schema(&url, 7);

    let app = app.restart(&["--fulfillment-delay", "100ms"]);
    let latest = "SELECT max(version)::bigint FROM orderly_schema_migrations";
    assert_eq!(
        sql_i64(url.clone(), latest.into()).unwrap(),
        crate::helpers::LATEST_MIGRATION
    );
    let index = |name: &str| {
        sql_i64(
            url.clone(),
            format!("SELECT count(*) FROM pg_indexes WHERE indexname = '{name}'"),
        )
        .unwrap()
    };
    assert_eq!(index("orders_processing_due"), 1);
    assert_eq!(index("orders_processing"), 0);
    for id in &ids {
        wait_until_completed(&app, &p.api_key, id).await;
    }
    assert_eq!(
        app.assert_ledger_matches_balance(&p.api_key).await,
        10_000 - 3 * 999
    );
}
