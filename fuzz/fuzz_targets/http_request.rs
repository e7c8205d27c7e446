//! Requests to a real orderly server in this process (sled in a temporary directory), built
//! from the fuzzer's bytes: the route, the query string, a few headers whose names and values
//! are raw bytes (CR and LF included: the HTTP parser is fuzzed too) and the body, with the
//! credentials each route needs (a partner's key, the admin token, a provider's signature over
//! the very body). A finding is a panic anywhere in the process (the panic hook aborts, which
//! libFuzzer reports; a money invariant panics too) or a 5xx answer.
#![no_main]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::OnceLock;
use std::time::Duration;

use clap::Parser;
use hmac::{Hmac, Mac};
use sha2::Sha256;

const ADMIN: &str = "fuzz-admin-token";
const SECRET: &str = "fuzz-provider-secret";

/// The server and what the requests name.
struct Server {
    address: SocketAddr,
    api_key: String,
    account: String,
    processing: String,
}

/// One request over its own connection; the status, if an answer came.
fn exchange(address: SocketAddr, request: &[u8]) -> Option<(u16, Vec<u8>)> {
    let mut stream = TcpStream::connect(address).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .ok()?;
    stream.write_all(request).ok()?;
    // The request ends here: a body shorter than its length is not waited for.
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let status = std::str::from_utf8(answer.get(9..12)?).ok()?.parse().ok()?;
    let body = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|at| answer[at + 4..].to_vec())
        .unwrap_or_default();
    Some((status, body))
}

/// A well-formed request, for the setup.
fn call(
    address: SocketAddr,
    method: &str,
    path: &str,
    auth: &str,
    body: &str,
) -> serde_json::Value {
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n{auth}\r\nContent-Type: application/json\r\nX-Idempotency-Key: setup-{}\r\nContent-Length: {}\r\n\r\n{body}",
        path.len() + body.len(),
        body.len()
    );
    let (status, body) = exchange(address, request.as_bytes()).expect("the setup is answered");
    assert_eq!(
        status / 100,
        2,
        "{method} {path}: {}",
        String::from_utf8_lossy(&body)
    );
    serde_json::from_slice(&body).expect("a JSON answer")
}

fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| {
        std::panic::set_hook(Box::new(|info| {
            eprintln!("panic: {info}");
            std::process::abort();
        }));
        let dir = std::env::temp_dir().join(format!("orderly-fuzz-http-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let argv = [
            "orderly",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            dir.to_str().expect("a UTF-8 temporary directory"),
            "--admin-token",
            ADMIN,
            "--provider-secret",
            &format!("acmepay={SECRET}"),
            "--rate-limit",
            "1000000000",
            "--fulfillment-delay",
            "1h",
            "--request-deadline",
            "10s",
        ];
        let orderly::Command::Serve(settings) = orderly::Cli::parse_from(argv).command else {
            unreachable!("serve")
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                let app = orderly::Application::build_with_flush_hook(*settings, None)
                    .await
                    .expect("the server starts");
                tx.send(app.address()).expect("the address is taken");
                let _ = app.run_until_stopped().await;
            })
        });
        let address = rx.recv().expect("the server's address");
        let admin = format!("Authorization: Bearer {ADMIN}");
        call(
            address,
            "PUT",
            "/admin/products/prd_uc",
            &admin,
            r#"{"name":"uc","price":999,"deliveryFields":["username"],"active":true}"#,
        );
        let account = call(
            address,
            "POST",
            "/admin/accounts",
            &admin,
            r#"{"name":"fuzz","wholesale":true,"creditLimit":1000,"region":"EU"}"#,
        )["account"]["id"]
            .as_str()
            .expect("an account id")
            .to_string();
        call(
            address,
            "POST",
            &format!("/admin/accounts/{account}/credits"),
            &admin,
            r#"{"amount":1000000000000,"reason":"fuzz"}"#,
        );
        let api_key = call(
            address,
            "POST",
            &format!("/admin/accounts/{account}/api-keys"),
            &admin,
            r#"{"scopes":["orders:write","orders:read","balance:read","catalog:read"]}"#,
        )["apiKey"]["key"]
            .as_str()
            .expect("a key")
            .to_string();
        let processing = call(
            address,
            "POST",
            "/b2b/orders",
            &format!("X-Api-Key: {api_key}"),
            r#"{"items":[{"productId":"prd_uc","quantity":1,"deliveryData":{"username":"@p"}}]}"#,
        )["order"]["id"]
            .as_str()
            .expect("an order id")
            .to_string();
        Server {
            address,
            api_key,
            account,
            processing,
        }
    })
}

/// The routes the bytes choose from: method, path, and who calls.
fn route(choice: u8, s: &Server) -> (&'static str, String, Caller) {
    match choice % 12 {
        0 => ("POST", "/b2b/orders".into(), Caller::Partner),
        1 => (
            "POST",
            format!("/b2b/orders/{}/cancel", s.processing),
            Caller::Partner,
        ),
        2 => (
            "POST",
            format!("/b2b/orders/{}/refunds", s.processing),
            Caller::Partner,
        ),
        3 => ("GET", "/b2b/orders".into(), Caller::Partner),
        4 => ("GET", "/b2b/transactions".into(), Caller::Partner),
        5 => ("GET", "/b2b/events".into(), Caller::Partner),
        6 => (
            "POST",
            "/webhooks/providers/acmepay".into(),
            Caller::Provider,
        ),
        7 => ("POST", "/admin/accounts".into(), Caller::Admin),
        8 => (
            "POST",
            format!("/admin/accounts/{}/credits", s.account),
            Caller::Admin,
        ),
        9 => ("PUT", "/admin/products/prd_fuzz".into(), Caller::Admin),
        10 => (
            "POST",
            format!("/admin/accounts/{}/api-keys", s.account),
            Caller::Admin,
        ),
        _ => (
            "GET",
            format!("/admin/accounts/{}/orders", s.account),
            Caller::Admin,
        ),
    }
}

enum Caller {
    Partner,
    Admin,
    Provider,
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&choice, rest)) = data.split_first() else {
        return;
    };
    let s = server();
    let (method, path, caller) = route(choice, s);
    // The rest: the query, then up to three raw headers, then the body, separated by 0xFF.
    let mut parts = rest.splitn(5, |b| *b == 0xFF);
    let query = parts.next().unwrap_or_default();
    let headers: Vec<&[u8]> = (0..3).filter_map(|_| parts.next()).collect();
    let body = parts.next().unwrap_or_default();
    let mut request = Vec::new();
    request.extend_from_slice(format!("{method} {path}").as_bytes());
    if !query.is_empty() {
        request.push(b'?');
        request.extend_from_slice(query);
    }
    request.extend_from_slice(b" HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n");
    let auth = match caller {
        Caller::Partner => format!("X-Api-Key: {}", s.api_key),
        Caller::Admin => format!("Authorization: Bearer {ADMIN}"),
        Caller::Provider => {
            let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).expect("a key");
            mac.update(body);
            let hex: String = mac
                .finalize()
                .into_bytes()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            format!("X-Signature: sha256={hex}")
        }
    };
    request.extend_from_slice(auth.as_bytes());
    request.extend_from_slice(b"\r\n");
    for header in headers.into_iter().filter(|h| !h.is_empty()) {
        // A header line the bytes make: "X-Idempotency-Key: ..." unless they name their own.
        if !header.contains(&b':') {
            request.extend_from_slice(b"X-Idempotency-Key: ");
        }
        request.extend_from_slice(header);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
    request.extend_from_slice(body);
    if let Some((status, answer)) = exchange(s.address, &request) {
        assert!(
            status < 500,
            "{status} for {:?}: {}",
            String::from_utf8_lossy(&request),
            String::from_utf8_lossy(&answer)
        );
    }
});
