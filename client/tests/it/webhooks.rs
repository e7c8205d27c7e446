//! `webhooks::verify_at` against the Standard Webhooks project's own test vector and against
//! a real delivery from orderly.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use orderly_client::webhooks::{self, VerifyError};
use orderly_client::{Basket, Client, Config, Item, Journal};

use crate::server::Server;

const VECTOR_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const VECTOR_BODY: &[u8] = br#"{"test": 2432232314}"#;
const VECTOR_HEADERS: [(&str, &str); 3] = [
    ("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
    ("webhook-timestamp", "1614265330"),
    (
        "webhook-signature",
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
    ),
];

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

#[test]
fn the_standard_webhooks_test_vector_verifies_at_its_own_timestamp() {
    assert_eq!(
        webhooks::verify_at(VECTOR_SECRET, &VECTOR_HEADERS, VECTOR_BODY, at(1614265330)),
        Ok(())
    );
}

#[test]
fn the_test_vector_is_refused_today_as_stale() {
    assert_eq!(
        webhooks::verify(VECTOR_SECRET, &VECTOR_HEADERS, VECTOR_BODY),
        Err(VerifyError::OutsideTolerance)
    );
}

#[test]
fn a_real_delivery_from_orderly_verifies() {
    let server = Server::start(&["--allow-private-callbacks", "--fulfillment-delay", "200ms"]);
    let partner = server.partner(10_000, 0);
    let hooks = tiny_http::Server::http("127.0.0.1:0").unwrap();
    let port = hooks.server_addr().to_ip().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let client = Client::new(
        Config::new(server.url.clone(), partner.api_key.clone()),
        Journal::open(dir.path().join("journal")).unwrap(),
    );
    let basket = Basket {
        items: vec![Item::new("prd_uc", 1).with("username", "player1")],
        callback_url: Some(format!("http://127.0.0.1:{port}/hooks")),
    };
    let placed = client.place_order("hook-1", &basket).unwrap();

    let mut delivery = hooks
        .recv_timeout(Duration::from_secs(20))
        .unwrap()
        .expect("orderly delivered the completion within 20 s");
    let headers: Vec<(String, String)> = delivery
        .headers()
        .iter()
        .map(|h| {
            (
                h.field.as_str().as_str().to_string(),
                h.value.as_str().to_string(),
            )
        })
        .collect();
    let mut body = Vec::new();
    delivery.as_reader().read_to_end(&mut body).unwrap();
    delivery.respond(tiny_http::Response::empty(200)).unwrap();

    assert_eq!(
        webhooks::verify(&partner.webhook_secret, &headers, &body),
        Ok(())
    );
    let event: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(event["type"], "order.completed");
    assert_eq!(
        event["data"]["order"]["id"].as_str(),
        placed.order_id.as_deref()
    );
    assert_eq!(
        webhooks::verify("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", &headers, &body),
        Err(VerifyError::NoMatchingSignature),
        "another account's secret does not verify it"
    );
}
