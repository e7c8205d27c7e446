//! When the database goes back in time under running instances (an asynchronous standby
//! promoted after it missed the newest transactions, a point-in-time restore, the key counter
//! set back by hand), what the instances keep from it belongs to a history the database no
//! longer has. The writes acknowledged after the point it went back to may be gone; every
//! other rule holds: a key revoked or created afterwards is refused, or works, on every
//! instance as soon as the change is answered.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{
    as_server_role, basket, create_database_sql, server_role, sql_i64, sql_on, start, TestApp,
};
use crate::instances::{key_b_has_seen, revoke_through_a, two_instances, wait_until};
use crate::postgres::{cluster, cluster_of, OwnCluster};

/// Asserts that `key` is refused on every instance, now and for a while after (no instance
/// serves a copy it kept from before).
async fn refused_everywhere(apps: &[&TestApp], key: &str, what: &str) {
    let until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < until {
        for (i, app) in apps.iter().enumerate() {
            assert_eq!(
                app.get(key, "/b2b/balance").await.status(),
                StatusCode::UNAUTHORIZED,
                "{what}: accepted by instance {i}"
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Asserts that `key` authenticates on every instance.
async fn accepted_everywhere(apps: &[&TestApp], key: &str, what: &str) {
    for (i, app) in apps.iter().enumerate() {
        assert_eq!(
            app.get(key, "/b2b/balance").await.status(),
            StatusCode::OK,
            "{what}: refused by instance {i}"
        );
    }
}

/// A key made for `account` through `app`: (the key, its id).
async fn new_key(app: &TestApp, account: &str) -> (String, String) {
    let created: Value = app
        .admin(
            Method::POST,
            &format!("/admin/accounts/{account}/api-keys"),
            Some(json!({"scopes": ["orders:write", "orders:read", "balance:read"]})),
        )
        .await
        .json()
        .await
        .unwrap();
    (
        created["apiKey"]["key"].as_str().unwrap().to_string(),
        created["apiKey"]["id"].as_str().unwrap().to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn after_the_key_counter_goes_back_a_key_revoked_through_one_instance_is_refused_on_every_instance(
) {
    let pair = two_instances(&[]);
    let (key, key_id) = key_b_has_seen(&pair.a, &pair.b).await;
    assert_eq!(
        pair.a.get(&key, "/b2b/balance").await.status(),
        StatusCode::OK
    );
    // Both keep a copy of the key and acknowledged the counter as it is; it goes back by 3.
    sql_on(
        pair.database_url(),
        "UPDATE auth_cache_version SET version = version - 3".into(),
    )
    .unwrap();

    revoke_through_a(&pair.a, &key_id).await;

    refused_everywhere(&[&pair.a, &pair.b], &key, "a key revoked (200)").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn after_the_key_counter_goes_back_a_key_created_through_one_instance_works_on_every_instance_once_answered(
) {
    let pair = two_instances(&[]);
    let account = pair.a.create_account(true, 0, "EU").await;
    // Each instance knows the keys as of the counter's value; the counter goes back by 3.
    let (first, _) = new_key(&pair.a, &account).await;
    accepted_everywhere(&[&pair.a, &pair.b], &first, "a key created (200)").await;
    sql_on(
        pair.database_url(),
        "UPDATE auth_cache_version SET version = version - 3".into(),
    )
    .unwrap();

    for i in 0..4 {
        let (key, _) = new_key(&pair.a, &account).await;
        accepted_everywhere(&[&pair.b, &pair.a], &key, &format!("key {i} created (200)")).await;
    }
}

/// The port of a libpq URL.
fn port(url: &str) -> u16 {
    url::Url::parse(url).unwrap().port().unwrap()
}

/// Waits (bounded) until the primary at `url` has `n` standbys streaming from it.
async fn streaming(url: &str, n: i64) {
    let until = Instant::now() + Duration::from_secs(30);
    let query = "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'";
    while sql_i64(url.to_string(), query.into()).unwrap() != n {
        assert!(Instant::now() < until, "{n} standby(s) streaming");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn after_an_asynchronous_standby_that_missed_changes_is_promoted_revocations_and_creations_hold_on_every_instance(
) {
    // A primary and its asynchronous standby (clusters of the test's own), two instances on
    // the multi-host URL.
    let base = std::env::temp_dir().join(format!("orderly-rewind-{}", std::process::id()));
    let (primary_dir, standby_dir) = (base.join("primary"), base.join("standby"));
    let primary = cluster("start", &primary_dir);
    let _primary = OwnCluster(primary_dir.clone());
    sql_on(primary.clone(), create_database_sql("orderly", None)).unwrap();
    let standby = cluster_of("standby", &standby_dir, &primary);
    let _standby = OwnCluster(standby_dir.clone());
    streaming(&primary, 1).await;
    let url = format!(
        "postgresql://{}@127.0.0.1:{},127.0.0.1:{}/orderly?target_session_attrs=read-write",
        server_role().unwrap_or_else(|| "postgres".into()),
        port(&primary),
        port(&standby)
    );
    let args = ["--database-url", url.as_str(), "--request-deadline", "3s"];
    let a = start(&base.join("a"), &args);
    let b = start(&base.join("b"), &args);
    let partner = a.partner_with_balance(100_000).await;
    // Both instances keep copies of this key: it is revoked after the failover.
    let (kept, kept_id) = key_b_has_seen(&a, &b).await;
    assert_eq!(a.get(&kept, "/b2b/balance").await.status(), StatusCode::OK);
    // This one is revoked while the standby is cut off.
    let (lost_key, lost_key_id) = new_key(&a, &partner.account_id).await;
    // Replicated before the standby is cut off.
    let replicated =
        "SELECT count(*) FROM pg_stat_replication WHERE replay_lsn = pg_current_wal_lsn()";
    wait_until(Duration::from_secs(30), "the standby caught up", || async {
        sql_i64(primary.clone(), replicated.into()).unwrap() == 1
    })
    .await;

    // The standby stops receiving WAL; what follows is acknowledged by the primary only.
    let standby_url = format!("postgres://postgres@127.0.0.1:{}/postgres", port(&standby));
    sql_on(
        standby_url.clone(),
        "ALTER SYSTEM SET primary_conninfo = ''".into(),
    )
    .unwrap();
    sql_on(standby_url, "SELECT pg_reload_conf()".into()).unwrap();
    streaming(&primary, 0).await;
    revoke_through_a(&a, &lost_key_id).await;
    let (created_then_lost, _) = new_key(&a, &partner.account_id).await;
    for i in 0..3 {
        let placed = a
            .post_order(
                Some(&partner.api_key),
                Some(&format!("lost-{i}")),
                &basket("prd_uc", 1, "p"),
            )
            .await;
        assert_eq!(placed.status(), StatusCode::OK);
    }
    accepted_everywhere(&[&a, &b], &created_then_lost, "a key created before").await;

    // The primary is lost; the standby, which missed all of that, is promoted.
    cluster("kill", &primary_dir);
    cluster("promote", &standby_dir);
    for app in [&a, &b] {
        wait_until(
            Duration::from_secs(30),
            "ready on the new primary",
            || async {
                app.client
                    .get(app.url("/readyz"))
                    .send()
                    .await
                    .is_ok_and(|r| r.status() == StatusCode::OK)
            },
        )
        .await;
    }

    // A revocation and a creation answered now hold on every instance.
    let took = revoke_through_a(&a, &kept_id).await;
    refused_everywhere(&[&a, &b], &kept, "a key revoked after the failover").await;
    assert!(
        took < Duration::from_secs(3),
        "the revocation took {took:?}"
    );
    // What was acknowledged after the point the database went back to is gone: the revoked
    // key works again, the created one does not (operations.md says so).
    accepted_everywhere(&[&a, &b], &lost_key, "a revocation the failover lost").await;
    refused_everywhere(
        &[&a, &b],
        &created_then_lost,
        "a creation the failover lost",
    )
    .await;
    for i in 0..3 {
        let (key, _) = new_key(&a, &partner.account_id).await;
        accepted_everywhere(
            &[&b, &a],
            &key,
            &format!("key {i} created after the failover"),
        )
        .await;
    }
    // The orders placed in the lost window are gone; their keys are a first use again.
    for i in 0..3 {
        let again = b
            .post_order(
                Some(&partner.api_key),
                Some(&format!("lost-{i}")),
                &basket("prd_uc", 1, "p"),
            )
            .await;
        assert_eq!(again.status(), StatusCode::OK);
        assert!(
            !again.headers().contains_key("Idempotency-Replayed"),
            "lost-{i} is a first use on the new primary"
        );
    }
    b.assert_ledger_matches_balance(&partner.api_key).await;
}

/// A database of its own cluster for two instances started as the servers' role, and the
/// maintenance URL of that database.
fn own_database(dir: &std::path::Path) -> (String, String) {
    let maintenance = cluster("start", dir);
    sql_on(maintenance.clone(), create_database_sql("orderly", None)).unwrap();
    let mut url = url::Url::parse(&maintenance).unwrap();
    url.set_path("/orderly");
    (as_server_role(url.as_str()), url.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn after_postgresql_restarts_in_place_a_key_revoked_through_one_instance_is_refused_on_every_instance(
) {
    // A crash restart empties the UNLOGGED cache leases: the database forgets that the other
    // instance holds a copy of the key. The restart is a new history (the server's start
    // time), and a change waits out every lease of the history before.
    let dir = std::env::temp_dir().join(format!("orderly-crash-restart-{}", std::process::id()));
    let (url, direct) = own_database(&dir);
    let _own = OwnCluster(dir.clone());
    let args = ["--database-url", url.as_str(), "--request-deadline", "3s"];
    let a = start(&dir.join("a"), &args);
    let b = start(&dir.join("b"), &args);
    let (key, key_id) = key_b_has_seen(&a, &b).await;
    let leases = "SELECT count(*) FROM auth_cache_leases WHERE valid_until > clock_timestamp()";
    assert_eq!(sql_i64(direct.clone(), leases.into()).unwrap(), 2);

    cluster("crash-restart", &dir);
    // The first answered revocation, as soon as the database takes one.
    wait_until(Duration::from_secs(20), "a revocation answered", || async {
        a.admin(Method::DELETE, &format!("/admin/api-keys/{key_id}"), None)
            .await
            .status()
            == StatusCode::OK
    })
    .await;
    refused_everywhere(&[&b, &a], &key, "a key revoked right after a restart (200)").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL: set ORDERLY_TEST_DATABASE_URL and pass --include-ignored"]
async fn an_instance_whose_database_goes_back_under_two_million_keys_starts_over_once_and_serves_from_memory_again(
) {
    // Reading every key again takes longer than a lease renewal may: two million keys (about a
    // second a million), and the table held locked for 3 s more, as a cold new primary would
    // be slow. The instance starts over on the budget it has at open, once; a reload bounded
    // by a renewal's 1.5 s started over on every tick and never finished.
    let app = crate::helpers::spawn_app_logging(&[]).await;
    let Some(direct) = app.database_url() else {
        panic!("on PostgreSQL")
    };
    let account = app.create_account(true, 0, "EU").await;
    let (key, _) = new_key(&app, &account).await;
    // Two million keys written behind the instances' back (no trigger, no change counted).
    sql_on(
        direct.clone(),
        format!(
            "SET session_replication_role = replica;
             INSERT INTO api_keys (hash, id, account_id, scopes, revoked, created_at)
             SELECT sha256(('bulk ' || i)::bytea), 'key_bulk_' || i, '{account}', '[]', false, 0
             FROM generate_series(1, 2000000) AS i"
        ),
    )
    .unwrap();
    crate::postgres::in_own_session(direct.clone(), |mut client, ready| async move {
        let tx = client.transaction().await.unwrap();
        tx.batch_execute("LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE")
            .await
            .unwrap();
        ready.send(()).unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        tx.commit().await.unwrap();
    });
    sql_on(
        direct.clone(),
        "UPDATE auth_cache_version SET version = version - 1".into(),
    )
    .unwrap();
    let logged = |what: &'static str| {
        let lines = app.logged();
        lines.iter().filter(|l| l.contains(what)).count()
    };
    wait_until(
        Duration::from_secs(60),
        "the instance started over",
        || async { logged("started over in the database's history: 2000001 API key(s)") == 1 },
    )
    .await;
    // Nothing more goes back: one start over, then the lease renewed in the new history.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(logged("the database went back in time"), 1);
    assert_eq!(app.get(&key, "/b2b/balance").await.status(), StatusCode::OK);
    let metrics = app.text("/metrics").await;
    assert_eq!(
        crate::helpers::metric(&metrics, "orderly_api_keys_known"),
        2_000_001.0
    );
}
