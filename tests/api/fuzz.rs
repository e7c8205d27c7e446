//! docs/contract.md "8. Bad input changes nothing", searched by machine: requests whose bodies,
//! headers and query strings are random or mutated from valid ones, sent to the real binary.
//! Every answer is a refusal or a success, never a 5xx, and the server is still up after. The
//! short form of the coverage-guided fuzzer of fuzz/ (`http_request`), which runs the same
//! routes in-process under libFuzzer.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use reqwest::header::{HeaderName, HeaderValue};
use reqwest::Method;
use serde_json::json;

use crate::helpers::{spawn_app_with, TestApp, ADMIN_TOKEN};
use crate::providers::{signature, SECRET};

/// Which route a request goes to, and as whom.
#[derive(Clone, Debug)]
enum Route {
    PlaceOrder,
    Cancel,
    Refund,
    ListOrders,
    Payment,
    CreateAccount,
    Credit,
    PutProduct,
    CreateKey,
}

const ROUTES: [Route; 9] = [
    Route::PlaceOrder,
    Route::Cancel,
    Route::Refund,
    Route::ListOrders,
    Route::Payment,
    Route::CreateAccount,
    Route::Credit,
    Route::PutProduct,
    Route::CreateKey,
];

/// A valid body for `route`, which the mutations start from.
fn valid_body(route: &Route, account: &str) -> Vec<u8> {
    let body = match route {
        Route::PlaceOrder => json!({"items": [{"productId": "prd_uc", "quantity": 2,
            "deliveryData": {"username": "@p"}}], "externalOrderId": "x-1",
            "callbackUrl": "https://partner.example/cb"}),
        Route::Refund => json!({"amount": 1, "reason": "r"}),
        Route::Payment => json!({"id": "p-1", "type": "payment.succeeded",
            "accountId": account, "amount": 5, "currency": "USD"}),
        Route::CreateAccount => {
            json!({"name": "n", "wholesale": true, "creditLimit": 0, "region": "EU"})
        }
        Route::Credit => json!({"amount": 5, "reason": "r"}),
        Route::PutProduct => json!({"name": "p", "price": 1, "regions": ["EU"],
            "deliveryFields": ["username"], "active": true}),
        Route::CreateKey => json!({"scopes": ["orders:write", "balance:read"]}),
        Route::Cancel | Route::ListOrders => json!({}),
    };
    body.to_string().into_bytes()
}

/// One request: the route, its body (valid, mutated or random), a query string, and a few
/// headers with values the fuzzer chose.
#[derive(Clone, Debug)]
struct Request {
    route: Route,
    body: Vec<u8>,
    query: String,
    headers: Vec<(&'static str, Vec<u8>)>,
}

fn mutate(seed: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    let len = seed.len();
    proptest::collection::vec((0..len.max(1), any::<u8>(), 0u8..4), 0..6).prop_map(move |edits| {
        let mut bytes = seed.clone();
        for (at, byte, how) in edits {
            let at = at.min(bytes.len().saturating_sub(1));
            match how {
                0 if !bytes.is_empty() => bytes[at] = byte,
                1 => bytes.insert(at, byte),
                2 => bytes.truncate(at),
                // A number at its edges where a digit was.
                _ => {
                    let edge = [
                        "-1",
                        "0",
                        "9223372036854775807",
                        "1e400",
                        "1000000000001",
                        "\"\"",
                        "null",
                    ];
                    let text = edge[usize::from(byte) % edge.len()].as_bytes();
                    bytes.splice(at..at, text.iter().copied());
                }
            }
        }
        bytes
    })
}

fn header_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..40),
        "[ -~]{0,300}".prop_map(String::into_bytes),
        Just(b"application/json; charset=utf-8".to_vec()),
        Just(vec![b'k'; 256]),
    ]
}

fn request(account: String) -> impl Strategy<Value = Request> {
    let names = [
        "X-Idempotency-Key",
        "Idempotency-Key",
        "Content-Type",
        "X-Request-Id",
        "X-Forwarded-For",
        "Origin",
        "Accept",
    ];
    (
        0..ROUTES.len(),
        prop_oneof![Just(0u8), Just(1), Just(2)],
        proptest::collection::vec((0..names.len(), header_value()), 0..4),
        prop_oneof![
            Just(String::new()),
            "[ -~]{0,60}",
            Just("limit=0&cursor=zz".to_string())
        ],
    )
        .prop_flat_map(move |(route, kind, headers, query)| {
            let route = ROUTES[route].clone();
            let seed = valid_body(&route, &account);
            let body = match kind {
                0 => Just(seed).boxed(),
                1 => mutate(seed).boxed(),
                _ => proptest::collection::vec(any::<u8>(), 0..200).boxed(),
            };
            let headers: Vec<(&'static str, Vec<u8>)> =
                headers.into_iter().map(|(n, v)| (names[n], v)).collect();
            (Just(route), body, Just(query), Just(headers))
        })
        .prop_map(|(route, body, query, headers)| Request {
            route,
            body,
            query,
            headers,
        })
}

/// What a partner and an operator hold for the requests.
struct Fixture {
    app: TestApp,
    account: String,
    api_key: String,
    order: String,
}

async fn send(f: &Fixture, req: &Request) -> reqwest::Response {
    let (method, path) = match &req.route {
        Route::PlaceOrder => (Method::POST, "/b2b/orders".to_string()),
        Route::Cancel => (Method::POST, format!("/b2b/orders/{}/cancel", f.order)),
        Route::Refund => (Method::POST, format!("/b2b/orders/{}/refunds", f.order)),
        Route::ListOrders => (Method::GET, "/b2b/orders".to_string()),
        Route::Payment => (Method::POST, "/webhooks/providers/acmepay".to_string()),
        Route::CreateAccount => (Method::POST, "/admin/accounts".to_string()),
        Route::Credit => (
            Method::POST,
            format!("/admin/accounts/{}/credits", f.account),
        ),
        Route::PutProduct => (Method::PUT, "/admin/products/prd_fuzz".to_string()),
        Route::CreateKey => (
            Method::POST,
            format!("/admin/accounts/{}/api-keys", f.account),
        ),
    };
    let url = if req.query.is_empty() {
        f.app.url(&path)
    } else {
        format!("{}?{}", f.app.url(&path), req.query)
    };
    let mut builder = f
        .app
        .client
        .request(method, url)
        .header("Content-Type", "application/json")
        .header("X-Idempotency-Key", "fuzz-key");
    builder = match req.route {
        Route::Payment => builder.header("X-Signature", signature(&req.body)),
        Route::CreateAccount | Route::Credit | Route::PutProduct | Route::CreateKey => {
            builder.bearer_auth(ADMIN_TOKEN)
        }
        _ => builder.header("X-Api-Key", &f.api_key),
    };
    for (name, value) in &req.headers {
        if let Ok(value) = HeaderValue::from_bytes(value) {
            builder = builder.header(HeaderName::from_static(lower(name)), value);
        }
    }
    builder
        .body(req.body.clone())
        .send()
        .await
        .expect("an answer")
}

fn lower(name: &'static str) -> &'static str {
    match name {
        "X-Idempotency-Key" => "x-idempotency-key",
        "Idempotency-Key" => "idempotency-key",
        "Content-Type" => "content-type",
        "X-Request-Id" => "x-request-id",
        "X-Forwarded-For" => "x-forwarded-for",
        "Origin" => "origin",
        _ => "accept",
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_and_mutated_requests_are_refused_or_served_never_a_5xx() {
    let app = spawn_app_with(&["--provider-secret", &format!("acmepay={SECRET}")]).await;
    let p = app.partner_with_balance(1_000_000).await;
    let placed = app
        .post_order(
            Some(&p.api_key),
            Some("fixture"),
            &crate::helpers::basket("prd_uc", 1, "@p"),
        )
        .await;
    let order: serde_json::Value = placed.json().await.unwrap();
    let fixture = Fixture {
        order: order["order"]["id"].as_str().unwrap().to_string(),
        account: p.account_id.clone(),
        api_key: p.api_key.clone(),
        app,
    };
    let mut runner = TestRunner::new(Config {
        cases: 600,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = request(fixture.account.clone());
    let handle = tokio::runtime::Handle::current();
    let outcome = tokio::task::block_in_place(|| {
        runner.run(&strategy, |req| {
            let status = handle.block_on(send(&fixture, &req)).status();
            prop_assert!(!status.is_server_error(), "{status} for {req:?}");
            Ok(())
        })
    });
    if let Err(e) = outcome {
        panic!("{e}");
    }
    assert!(!fixture.app.text("/healthz").await.is_empty(), "still up");
    fixture
        .app
        .assert_ledger_matches_balance(&fixture.api_key)
        .await;
}
