//! `orderly-client receive`: verify, claim the event id, run CMD once, answer from its result.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use orderly_client::webhooks;
use serde_json::json;

use crate::cli::{command, Cli};
use crate::server::{agent, basket, Server};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// A running receiver and the file its command appends each event it runs for to.
struct Receiver {
    url: String,
    runs: PathBuf,
    child: Child,
}

impl Receiver {
    /// `script` is run by sh with `$0` = the runs file (the event is on its stdin).
    fn start(dir: &Path, secret: &str, script: &str) -> Receiver {
        let runs = dir.join("runs");
        let mut child = command()
            .args([
                "receive",
                "--listen",
                "127.0.0.1:0",
                "--secret",
                secret,
                "--inbox",
            ])
            .arg(dir.join("inbox"))
            .args(["--", "sh", "-c", script])
            .arg(&runs)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("orderly-client receiving on ") {
                    let _ = tx.send(url.to_string());
                }
            }
        });
        let url = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the receiver did not start");
        Receiver { url, runs, child }
    }

    /// How many times the command ran (one line each).
    fn runs(&self) -> usize {
        std::fs::read_to_string(&self.runs)
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    fn send(&self, id: &str, timestamp: i64, signature: &str, body: &str) -> u16 {
        agent()
            .post(&self.url)
            .header("webhook-id", id)
            .header("webhook-timestamp", &timestamp.to_string())
            .header("webhook-signature", signature)
            .header("Content-Type", "application/json")
            .send(body)
            .expect("delivery")
            .status()
            .as_u16()
    }

    fn deliver(&self, id: &str, body: &str) -> u16 {
        let now = now();
        let signature = webhooks::sign(SECRET, id, now, body.as_bytes()).unwrap();
        self.send(id, now, &signature, body)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn event(id: &str) -> String {
    json!({"id": id, "type": "order.completed", "createdAt": "2026-11-30T10:00:00Z", "data": {"order": {"id": "ord_1"}}}).to_string()
}

/// Appends one line per run (the event body), slowly enough for copies to overlap.
const RECORD: &str = r#"cat >> "$0"; echo >> "$0"; sleep 0.5"#;

#[test]
fn twenty_concurrent_copies_of_one_event_run_the_command_once() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(dir.path(), SECRET, RECORD);
    let body = event("evt_twenty");

    let statuses: Vec<u16> = std::thread::scope(|s| {
        let copies: Vec<_> = (0..20)
            .map(|_| s.spawn(|| receiver.deliver("evt_twenty", &body)))
            .collect();
        copies.into_iter().map(|c| c.join().unwrap()).collect()
    });

    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    assert_eq!(receiver.runs(), 1);
    assert_eq!(
        std::fs::read_to_string(&receiver.runs).unwrap().trim(),
        body
    );
    assert_eq!(
        receiver.deliver("evt_twenty", &body),
        200,
        "an event already done"
    );
    assert_eq!(receiver.runs(), 1);
}

#[test]
fn a_failing_command_answers_500_and_runs_again_on_the_redelivery() {
    let dir = tempfile::tempdir().unwrap();
    // Fails on its first run, succeeds on the next.
    let receiver = Receiver::start(
        dir.path(),
        SECRET,
        r#"echo run >> "$0"; [ "$(wc -l < "$0")" -ge 2 ]"#,
    );
    let body = event("evt_flaky");

    assert_eq!(receiver.deliver("evt_flaky", &body), 500);
    assert_eq!(receiver.runs(), 1);
    assert_eq!(receiver.deliver("evt_flaky", &body), 200);
    assert_eq!(receiver.runs(), 2);
    assert_eq!(receiver.deliver("evt_flaky", &body), 200);
    assert_eq!(receiver.runs(), 2);
}

#[test]
fn a_done_event_stays_done_when_the_receiver_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let body = event("evt_restart");
    {
        let receiver = Receiver::start(dir.path(), SECRET, RECORD);
        assert_eq!(receiver.deliver("evt_restart", &body), 200);
    }
    let receiver = Receiver::start(dir.path(), SECRET, RECORD);

    assert_eq!(receiver.deliver("evt_restart", &body), 200);

    assert_eq!(receiver.runs(), 1);
}

#[test]
fn a_bad_signature_is_refused_with_401_and_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(dir.path(), SECRET, RECORD);
    let body = event("evt_forged");
    let other = webhooks::sign(
        "whsec_c2VjcmV0LW9mLXNvbWVvbmUtZWxzZQ==",
        "evt_forged",
        now(),
        body.as_bytes(),
    )
    .unwrap();

    assert_eq!(receiver.send("evt_forged", now(), &other, &body), 401);
    assert_eq!(receiver.send("evt_forged", now(), "v1,", &body), 401);

    assert_eq!(receiver.runs(), 0);
}

#[test]
fn a_timestamp_outside_the_tolerance_is_refused_with_401_and_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(dir.path(), SECRET, RECORD);
    let body = event("evt_stale");
    let stale = now() - 301;
    let signature = webhooks::sign(SECRET, "evt_stale", stale, body.as_bytes()).unwrap();

    assert_eq!(receiver.send("evt_stale", stale, &signature, &body), 401);

    assert_eq!(receiver.runs(), 0);
}

#[test]
fn orderlys_own_callback_passes_the_receiver_and_runs_the_command_once() {
    let server = Server::start(&["--allow-private-callbacks", "--fulfillment-delay", "200ms"]);
    let partner = server.partner(10_000, 0);
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(dir.path(), &partner.webhook_secret, RECORD);
    let cli = Cli::new(&server.url, &partner.api_key, dir.path());
    let mut order = basket("player1", 1);
    order["callbackUrl"] = json!(format!("{}/hooks/orders", receiver.url));

    let placed = cli.place("hooked-1", &order);

    let deadline = Instant::now() + Duration::from_secs(20);
    while receiver.runs() == 0 {
        assert!(
            Instant::now() < deadline,
            "no callback ran the command within 20 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let text = std::fs::read_to_string(&receiver.runs).unwrap();
    let event: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(event["type"], "order.completed");
    assert_eq!(event["data"]["order"]["id"], placed.line()["orderId"]);
    assert_eq!(event["data"]["order"]["externalOrderId"], "hooked-1");
}

#[test]
fn during_a_secret_rotations_overlap_a_receiver_holding_either_secret_runs_the_command() {
    let server = Server::start(&["--allow-private-callbacks", "--fulfillment-delay", "200ms"]);
    let partner = server.partner(10_000, 0);
    let rotated = server.admin(
        "POST",
        &format!("/admin/accounts/{}/webhook-secret", partner.account_id),
        None,
    );
    let new_secret = rotated["webhookSecret"].as_str().unwrap();
    let (old_dir, new_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let holding_old = Receiver::start(old_dir.path(), &partner.webhook_secret, RECORD);
    let holding_new = Receiver::start(new_dir.path(), new_secret, RECORD);
    let cli = Cli::new(&server.url, &partner.api_key, old_dir.path());
    for (n, receiver) in [&holding_old, &holding_new].into_iter().enumerate() {
        let mut order = basket("player1", 1);
        order["callbackUrl"] = json!(format!("{}/hooks/orders", receiver.url));
        cli.place(&format!("overlap-{n}"), &order);
    }

    let deadline = Instant::now() + Duration::from_secs(20);
    while holding_old.runs() == 0 || holding_new.runs() == 0 {
        assert!(
            Instant::now() < deadline,
            "runs: old secret {}, new secret {}",
            holding_old.runs(),
            holding_new.runs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn receive_status(dir: &Path, listen: &str, secret: &str) -> Option<i32> {
    command()
        .args(["receive", "--listen", listen, "--secret", secret, "--inbox"])
        .arg(dir.join("inbox"))
        .args(["--", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .code()
}

#[test]
fn a_receiver_with_a_bad_address_or_secret_is_bad_usage() {
    let dir = tempfile::tempdir().unwrap();

    assert_eq!(
        receive_status(dir.path(), "not an address", SECRET),
        Some(2)
    );
    assert_eq!(
        receive_status(dir.path(), "127.0.0.1:0", "whsec_***"),
        Some(2)
    );
}

#[test]
fn a_second_receiver_on_an_owned_inbox_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let _owner = Receiver::start(dir.path(), SECRET, RECORD);

    assert_eq!(receive_status(dir.path(), "127.0.0.1:0", SECRET), Some(1));
}

/// Connections that sent a POST's head announcing 100 bytes of body, and then nothing.
fn stalled_connections(receiver: &Receiver, count: usize) -> Vec<std::net::TcpStream> {
    use std::io::Write;
    let address = receiver
        .url
        .trim_start_matches("http://")
        .trim_end_matches('/');
    (0..count)
        .map(|_| {
            let mut stream = std::net::TcpStream::connect(address).unwrap();
            stream
                .write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
                .unwrap();
            stream
        })
        .collect()
}

#[test]
fn three_hundred_connections_stalled_after_their_headers_do_not_turn_a_delivery_into_a_503() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(dir.path(), SECRET, RECORD);
    let stalled = stalled_connections(&receiver, 300);

    assert_eq!(receiver.deliver("evt_room", &event("evt_room")), 200);
    assert_eq!(receiver.runs(), 1);
    drop(stalled);
}

#[test]
fn a_connection_that_stalls_mid_request_is_closed_within_the_read_deadline() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(dir.path(), SECRET, RECORD);
    let mut stalled = stalled_connections(&receiver, 1).remove(0);
    stalled
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let started = Instant::now();

    let mut answer = Vec::new();
    let read = stalled.read_to_end(&mut answer);
    assert!(
        matches!(read, Ok(0)),
        "closed without an answer, got {read:?} {answer:?}"
    );
    // The deadline is 10 s from the connection's start, a little before `started`.
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(15),
        "still open after {waited:?}"
    );
    assert_eq!(receiver.runs(), 0);
}

#[test]
fn a_get_is_answered_405_and_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(dir.path(), SECRET, RECORD);
    let resp = agent().get(&receiver.url).call().unwrap();
    assert_eq!(resp.status().as_u16(), 405);
    assert_eq!(receiver.runs(), 0);
}
