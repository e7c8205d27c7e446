//! kill -9 of a client, then `resume`: the journal held every intent before its first byte
//! went out, so the restart sends the same key and the server charges once.

use std::collections::HashSet;
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::cli::Cli;
use crate::proxy::{Fate, Proxy};
use crate::server::{basket, Server};

fn intent_of(seen: &crate::proxy::Seen) -> String {
    seen.body_json()["externalOrderId"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn clients_killed_in_the_middle_of_their_retries_resume_to_one_order_per_intent() {
    let server = Server::start(&[]);
    let partner = server.partner(100_000, 0);
    // Every answer is lost: each attempt reaches the server, the client never hears back.
    let proxy = Proxy::start(&server.url, |_, _| Fate::DropAnswer);
    let dir = tempfile::tempdir().unwrap();
    let cli = Cli::new(&proxy.url, &partner.api_key, dir.path()).with(&["--max-attempts", "1000"]);
    let intents: Vec<String> = (0..5).map(|i| format!("crash-{i}")).collect();
    let mut children: Vec<Child> = intents
        .iter()
        .enumerate()
        .map(|(i, intent)| {
            let file = cli.basket_file(intent, &basket(&format!("player{i}"), 1));
            cli.spawn(&[
                "place",
                "--intent",
                intent,
                "--basket",
                file.to_str().unwrap(),
            ])
        })
        .collect();
    let retrying = proxy.wait_until(Duration::from_secs(30), |seen| {
        intents
            .iter()
            .all(|i| seen.iter().filter(|s| &intent_of(s) == i).count() >= 2)
    });
    assert!(retrying, "every client should be retrying");
    for child in &mut children {
        child.kill().unwrap();
        child.wait().unwrap();
    }

    let resumed = cli.via(&server.url).run(&["resume"]);

    assert_eq!(resumed.code, 0, "{}", resumed.stderr);
    assert_eq!(resumed.lines.len(), 5);
    assert!(resumed
        .lines
        .iter()
        .all(|l| l["outcome"] == "placed" && l["replayed"] == true));
    let ids: HashSet<_> = resumed
        .lines
        .iter()
        .map(|l| l["orderId"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 5);
    assert_eq!(server.orders(&partner.api_key).len(), 5);
    assert_eq!(server.charges(&partner.api_key).len(), 5);
}

#[test]
fn a_client_killed_as_its_first_request_arrives_had_journaled_the_key_that_resume_sends() {
    let server = Server::start(&[]);
    let partner = server.partner(10_000, 0);
    let child: Arc<Mutex<Option<Child>>> = Arc::new(Mutex::new(None));
    let victim = Arc::clone(&child);
    let proxy = Proxy::start(&server.url, move |_, n| {
        if n == 0 {
            // The spawn may still be returning: wait (bounded) for the handle, then kill.
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if let Some(c) = victim.lock().unwrap().as_mut() {
                    c.kill().unwrap();
                    c.wait().unwrap();
                    break;
                }
                assert!(Instant::now() < deadline, "no child to kill");
                std::thread::sleep(Duration::from_millis(5));
            }
            return Fate::Refuse;
        }
        Fate::Pass
    });
    let dir = tempfile::tempdir().unwrap();
    let cli = Cli::new(&proxy.url, &partner.api_key, dir.path());
    let file = cli.basket_file("first-1", &basket("player1", 1));
    *child.lock().unwrap() = Some(cli.spawn(&[
        "place",
        "--intent",
        "first-1",
        "--basket",
        file.to_str().unwrap(),
    ]));
    assert!(proxy.wait_until(Duration::from_secs(30), |seen| !seen.is_empty()));
    let killed = loop {
        if let Some(status) = child.lock().unwrap().as_mut().unwrap().try_wait().unwrap() {
            break status;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(!killed.success());
    let status = cli.run(&["status", "first-1"]);
    assert_eq!(
        status.line()["outcome"],
        "unknown",
        "journaled, still pending"
    );

    let resumed = cli.run(&["resume"]);

    assert_eq!(resumed.line()["outcome"], "placed");
    let seen = proxy.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(
        seen[1].key(),
        seen[0].key(),
        "resume sends the key journaled before the kill"
    );
    assert_eq!(seen[1].body, seen[0].body);
    assert_eq!(server.orders(&partner.api_key).len(), 1);
}
