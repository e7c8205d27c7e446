//! docs/api.md "Keys with an end" and docs/operations.md "Rotating a partner's key": a key
//! created with `expiresAt` answers that end, works until it, and from that instant answers
//! 401 as a revoked key does, on every instance; a partner moving to its next key before the
//! end is never refused.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{on_postgres, spawn_app, start, TestApp};

/// Now plus `ahead` in RFC 3339 to the millisecond, as a partner's program would write it.
pub fn rfc3339_in(ahead: Duration) -> String {
    let at = SystemTime::now() + ahead;
    let millis = at.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    // A whole number of milliseconds that is not a whole second: answered to the millisecond.
    let millis = if millis % 1000 == 0 {
        millis + 1
    } else {
        millis
    };
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(millis)).to_string()
}

/// `POST /admin/accounts/{account}/api-keys` with `body`: its status and JSON.
async fn create_key_with(app: &TestApp, account: &str, body: Value) -> (StatusCode, Value) {
    let resp = app
        .admin(
            Method::POST,
            &format!("/admin/accounts/{account}/api-keys"),
            Some(body),
        )
        .await;
    (resp.status(), resp.json().await.unwrap())
}

/// A key of `account` with every scope, ending at `end`: its plaintext.
pub async fn key_ending_at(app: &TestApp, account: &str, end: &str) -> String {
    let (status, body) = create_key_with(app, account, json!({ "expiresAt": end })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["apiKey"]["key"].as_str().unwrap().to_string()
}

async fn balance_status(app: &TestApp, key: &str) -> StatusCode {
    app.get(key, "/b2b/balance").await.status()
}

/// Waits (at most `within`) until `key` answers 401 on `app`; the body it then answers.
pub async fn refused_within(app: &TestApp, key: &str, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let resp = app.get(key, "/b2b/balance").await;
        if resp.status() == StatusCode::UNAUTHORIZED {
            return resp.json().await.unwrap();
        }
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(
            Instant::now() < deadline,
            "the key still works past its end"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_key_created_with_an_end_answers_that_end_and_one_without_answers_null() {
    let app = spawn_app().await;
    let account = app.create_account(true, 0, "EU").await;
    let end = rfc3339_in(Duration::from_secs(30 * 86_400));
    let (status, with_end) = create_key_with(&app, &account, json!({ "expiresAt": end })).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(with_end["apiKey"]["expiresAt"], json!(end));
    let (status, plain) = create_key_with(&app, &account, json!({})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(plain["apiKey"]["expiresAt"], Value::Null);
    let (status, null) = create_key_with(&app, &account, json!({ "expiresAt": null })).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(null["apiKey"]["expiresAt"], Value::Null);
    for body in [with_end, plain, null] {
        let key = body["apiKey"]["key"].as_str().unwrap();
        assert_eq!(balance_status(&app, key).await, StatusCode::OK);
    }
}

#[tokio::test]
async fn an_end_given_with_an_offset_is_answered_as_the_same_instant_in_utc() {
    let app = spawn_app().await;
    let account = app.create_account(true, 0, "EU").await;
    let (status, body) = create_key_with(
        &app,
        &account,
        json!({ "expiresAt": "2099-01-01T03:00:00.5+03:00" }),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["apiKey"]["expiresAt"], "2099-01-01T00:00:00.500Z");
}

#[tokio::test]
async fn an_end_that_is_not_an_rfc_3339_time_in_the_future_is_422_naming_expires_at() {
    let app = spawn_app().await;
    let account = app.create_account(true, 0, "EU").await;
    let not_a_time = |msg: &str| json!({"detail":[{"loc":["body","expiresAt"],"msg":msg,"type":"datetime_parsing"}]});
    let parsing = "expiresAt must be an RFC 3339 time, such as 2027-01-31T00:00:00Z";
    let past = json!({"detail":[{"loc":["body","expiresAt"],"msg":"expiresAt must be in the future","type":"datetime_future"}]});
    for (end, expected) in [
        (json!("tomorrow"), not_a_time(parsing)),
        (json!("2099-01-01"), not_a_time(parsing)),
        (json!("2099-02-30T00:00:00Z"), not_a_time(parsing)),
        (json!("2020-01-01T00:00:00Z"), past.clone()),
        (json!("2000-01-01T00:00:00+00:00"), past),
    ] {
        let (status, body) = create_key_with(&app, &account, json!({ "expiresAt": end })).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{end}");
        assert_eq!(body, expected, "{end}");
    }
    // Not a string at all: the 422 of a wrong type, at the same place.
    let (status, body) =
        create_key_with(&app, &account, json!({ "expiresAt": 1_900_000_000 })).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["detail"][0]["loc"], json!(["body", "expiresAt"]));
}

#[tokio::test]
async fn a_key_past_its_end_answers_401_as_a_revoked_key_does() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(0).await;
    let key = key_ending_at(
        &app,
        &p.account_id,
        &rfc3339_in(Duration::from_millis(1_500)),
    )
    .await;
    assert_eq!(balance_status(&app, &key).await, StatusCode::OK);
    let ended = refused_within(&app, &key, Duration::from_secs(10)).await;
    let revoked = app
        .get("gc_live_00000000000000000000000000000000", "/b2b/balance")
        .await;
    assert_eq!(revoked.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(ended, revoked.json::<Value>().await.unwrap());
    // The partner's other key is untouched.
    assert_eq!(balance_status(&app, &p.api_key).await, StatusCode::OK);
}

#[tokio::test]
async fn a_keys_end_is_kept_across_a_crash_and_restart() {
    let app = spawn_app().await;
    let p = app.partner_with_balance(0).await;
    let later = key_ending_at(&app, &p.account_id, &rfc3339_in(Duration::from_secs(3_600))).await;
    let soon = key_ending_at(&app, &p.account_id, &rfc3339_in(Duration::from_secs(3))).await;
    let app = app.crash_and_restart(&[]);
    assert_eq!(balance_status(&app, &later).await, StatusCode::OK);
    refused_within(&app, &soon, Duration::from_secs(15)).await;
    assert_eq!(balance_status(&app, &later).await, StatusCode::OK);
}

/// The partner's rotation: its key has an end; before it, a new key is made (through another
/// instance), the partner's program switches, and the old key ends by itself on every instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partner_moving_to_its_next_key_before_the_end_is_never_refused_on_either_instance() {
    let first = spawn_app().await;
    let p = first.partner_with_balance(0).await;
    // On PostgreSQL a second instance on the same database; on sled the one process twice.
    let second = on_postgres().then(|| start(&first.data_dir, &[]));
    let old = key_ending_at(&first, &p.account_id, &rfc3339_in(Duration::from_secs(4))).await;
    let first = Arc::new(first);
    let second = second.map(Arc::new).unwrap_or_else(|| Arc::clone(&first));
    let current = Arc::new(std::sync::Mutex::new(old.clone()));
    let stop = Arc::new(AtomicBool::new(false));
    let (sent, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let caller = {
        let (apps, current, stop) = (
            [Arc::clone(&first), Arc::clone(&second)],
            Arc::clone(&current),
            Arc::clone(&stop),
        );
        let (sent, refused) = (Arc::clone(&sent), Arc::clone(&refused));
        tokio::spawn(async move {
            let mut i = 0usize;
            while !stop.load(Ordering::SeqCst) && i < 20_000 {
                let key = current.lock().unwrap().clone();
                if balance_status(&apps[i % 2], &key).await != StatusCode::OK {
                    refused.fetch_add(1, Ordering::SeqCst);
                }
                sent.fetch_add(1, Ordering::SeqCst);
                i += 1;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let next = key_ending_at(
        &second,
        &p.account_id,
        &rfc3339_in(Duration::from_secs(90 * 86_400)),
    )
    .await;
    *current.lock().unwrap() = next.clone();
    for app in [&first, &second] {
        refused_within(app, &old, Duration::from_secs(15)).await;
        assert_eq!(balance_status(app, &next).await, StatusCode::OK);
    }
    stop.store(true, Ordering::SeqCst);
    caller.await.unwrap();
    assert!(sent.load(Ordering::SeqCst) > 10, "the caller ran");
    assert_eq!(refused.load(Ordering::SeqCst), 0, "a valid key was refused");
}
