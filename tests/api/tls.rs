//! docs/operations.md "One binary", HTTPS: certificates made here (a test CA and leaves signed by it), the
//! binary serving TLS 1.2 and 1.3 only, a SIGHUP reload for new connections, and a pair that
//! does not belong together refused at start with exit status 2.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use reqwest::{Certificate, Client, StatusCode};
use serde_json::Value;

use crate::helpers::{basket, spawn_app_with, ADMIN_TOKEN};

struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl TestCa {
    fn new() -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        TestCa {
            issuer: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap(),
        }
    }

    /// A certificate for 127.0.0.1 and localhost, written as PEM files into `dir`.
    fn leaf(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf, Vec<u8>) {
        let params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &*self.issuer).unwrap();
        let (cert_path, key_path) = (
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path, cert.der().to_vec())
    }

    fn client(&self) -> Client {
        Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(Certificate::from_pem(self.issuer.pem().as_bytes()).unwrap())
            .tls_info(true)
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap()
    }
}

fn https(address: &str, path: &str) -> String {
    format!("{}{path}", address.replace("http://", "https://"))
}

/// The DER of the certificate the server presented on this response's connection.
fn peer_certificate(resp: &reqwest::Response) -> Vec<u8> {
    resp.extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|info| info.peer_certificate())
        .expect("a TLS connection")
        .to_vec()
}

async fn https_app(dir: &Path, ca: &TestCa) -> (crate::helpers::TestApp, Vec<u8>) {
    let (cert, key, der) = ca.leaf(dir, "server");
    let app = spawn_app_with(&[
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ])
    .await;
    (app, der)
}

#[tokio::test]
async fn an_https_client_that_trusts_the_ca_places_and_replays_an_order() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (app, _) = https_app(dir.path(), &ca).await;
    let client = ca.client();
    let admin = |path: &str| {
        client
            .post(https(&app.address, path))
            .bearer_auth(ADMIN_TOKEN)
    };
    let product = client
        .put(https(&app.address, "/admin/products/prd_uc"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&serde_json::json!({"name": "UC", "price": 999, "deliveryFields": ["username"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(product.status(), StatusCode::OK);
    let account: Value = admin("/admin/accounts")
        .json(&serde_json::json!({"name": "Acme", "wholesale": true}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = account["account"]["id"].as_str().unwrap();
    let credited = admin(&format!("/admin/accounts/{id}/credits"))
        .header("X-Idempotency-Key", "top-up")
        .json(&serde_json::json!({"amount": 10_000}))
        .send()
        .await
        .unwrap();
    assert_eq!(credited.status(), StatusCode::OK);
    let key: Value = admin(&format!("/admin/accounts/{id}/api-keys"))
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let api_key = key["apiKey"]["key"].as_str().unwrap();
    let order = || {
        client
            .post(https(&app.address, "/b2b/orders"))
            .header("X-Api-Key", api_key)
            .header("X-Idempotency-Key", "tls-1")
            .json(&basket("prd_uc", 1, "p"))
            .send()
    };
    let first = order().await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let first = first.bytes().await.unwrap();
    let replay = order().await.unwrap();
    assert_eq!(replay.headers()["Idempotency-Replayed"], "true");
    assert_eq!(replay.bytes().await.unwrap(), first);
}

#[tokio::test]
async fn plain_http_to_the_https_port_gets_no_answer() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (app, _) = https_app(dir.path(), &ca).await;
    let plain_url = https(&app.address, "/healthz").replace("https://", "http://");
    let plain = app.client.get(plain_url).send().await;
    assert!(
        plain.is_err() || !plain.unwrap().status().is_success(),
        "plain HTTP must not be served on the TLS port"
    );
    let tls = ca
        .client()
        .get(https(&app.address, "/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(tls.status(), StatusCode::OK);
}

/// What `openssl s_client` makes of the port with only `version` offered.
fn s_client(address: &str, version: &str) -> (bool, String) {
    let host = address
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    let out = Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            host,
            version,
            "-cipher",
            "DEFAULT:@SECLEVEL=0",
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("openssl s_client (Debian's openssl) runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let handshake = text.contains("Cipher is ") && !text.contains("Cipher is (NONE)");
    (handshake, text)
}

#[tokio::test]
async fn tls_1_1_is_refused_and_1_2_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (app, _) = https_app(dir.path(), &ca).await;
    let (tls12, text12) = s_client(&app.address, "-tls1_2");
    assert!(tls12, "TLS 1.2 must be served: {text12}");
    let (tls11, text11) = s_client(&app.address, "-tls1_1");
    assert!(!tls11, "TLS 1.1 must be refused: {text11}");
    assert!(
        !text11.contains("no protocols available"),
        "the client itself refused to offer TLS 1.1, so this proved nothing: {text11}"
    );
}

#[tokio::test]
async fn after_sighup_a_new_connection_sees_the_new_certificate_and_an_old_one_keeps_working() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (mut app, first_der) = https_app(dir.path(), &ca).await;
    let old = ca.client();
    let before = old
        .get(https(&app.address, "/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(peer_certificate(&before), first_der);

    // Renewal: new files under the same names, then SIGHUP.
    let (cert, key, second_der) = ca.leaf(dir.path(), "renewed");
    std::fs::rename(cert, dir.path().join("server.crt")).unwrap();
    std::fs::rename(key, dir.path().join("server.key")).unwrap();
    Command::new("kill")
        .args(["-HUP", &app.pid().to_string()])
        .status()
        .unwrap();
    let mut seen = Vec::new();
    for _ in 0..100 {
        let fresh = ca.client();
        let resp = fresh
            .get(https(&app.address, "/healthz"))
            .send()
            .await
            .unwrap();
        seen = peer_certificate(&resp);
        if seen == second_der {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        seen, second_der,
        "a new connection sees the renewed certificate"
    );
    // The connection opened before the reload is still served (and still the old pair).
    let still = old
        .get(https(&app.address, "/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(still.status(), StatusCode::OK);
    assert_eq!(peer_certificate(&still), first_der);

    // A broken pair at reload is logged and the one in force stays.
    std::fs::write(dir.path().join("server.key"), "not a key").unwrap();
    Command::new("kill")
        .args(["-HUP", &app.pid().to_string()])
        .status()
        .unwrap();
    let mut logged = false;
    for _ in 0..100 {
        if app
            .logged()
            .iter()
            .any(|l| l.contains("SIGHUP") && l.contains("stays"))
        {
            logged = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(logged, "the failed reload is logged");
    let after = ca
        .client()
        .get(https(&app.address, "/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(peer_certificate(&after), second_der);
    let _ = app.signal("TERM", Duration::from_secs(10));
}

#[test]
fn a_key_that_does_not_match_its_certificate_is_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, _, _) = ca.leaf(dir.path(), "a");
    let (_, other_key, _) = ca.leaf(dir.path(), "b");
    let out = Command::new(env!("CARGO_BIN_EXE_orderly"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("db"))
        .arg("--tls-cert")
        .arg(&cert)
        .arg("--tls-key")
        .arg(&other_key)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("does not match"), "{stderr}");
    assert!(!dir.path().join("db").exists(), "nothing was created");
}
