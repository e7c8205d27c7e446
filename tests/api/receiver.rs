//! A real HTTP receiver on 127.0.0.1 for callbacks: it records every request and answers
//! with the statuses it was told to, in order (then 200).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct Received {
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub at: Instant,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `v1,…` signature `secret` makes for this delivery (Standard Webhooks, written from
    /// the spec here rather than with the server's code).
    pub fn signed_by(&self, secret: &str) -> String {
        use base64::Engine;
        use hmac::{Hmac, Mac};
        let engine = base64::engine::general_purpose::STANDARD;
        let key = engine
            .decode(secret.strip_prefix("whsec_").unwrap())
            .unwrap();
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&key).unwrap();
        let id = self.header("webhook-id").unwrap();
        let timestamp = self.header("webhook-timestamp").unwrap();
        mac.update(format!("{id}.{timestamp}.").as_bytes());
        mac.update(&self.body);
        format!("v1,{}", engine.encode(mac.finalize().into_bytes()))
    }
}

pub struct Receiver {
    pub port: u16,
    received: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    /// Listens on `port` (0: any free port), answering `script` statuses first, then 200.
    /// A scripted status 0 is no answer: that request is recorded and held open for good.
    pub fn start_on(port: u16, script: Vec<u16>) -> Receiver {
        Self::scripted(port, script.into_iter().map(|s| (s, None)).collect())
    }

    /// Like `start_on`, each answer with an optional `Retry-After` (seconds).
    pub fn scripted(port: u16, script: Vec<(u16, Option<u64>)>) -> Receiver {
        let replies = script
            .into_iter()
            .map(|(status, retry_after)| {
                let header = retry_after.map(|s| format!("Retry-After: {s}\r\n"));
                (status, header.unwrap_or_default())
            })
            .collect();
        Self::replying(port, replies)
    }

    /// Answers its first request with a 302 whose `Location` is `target`, then 200s.
    pub fn redirecting_to(target: &str) -> Receiver {
        Self::replying(0, vec![(302, format!("Location: {target}\r\n"))])
    }

    /// Answers with each scripted status and extra header lines in turn, then 200.
    pub fn replying(port: u16, script: Vec<(u16, String)>) -> Receiver {
        let listener = TcpListener::bind(("127.0.0.1", port)).expect("receiver bind");
        let port = listener.local_addr().unwrap().port();
        let received = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&received);
        let script = Arc::new(Mutex::new(script.into_iter()));
        let mut held = Vec::new();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut headers = Vec::new();
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    continue;
                }
                loop {
                    line.clear();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    if let Some((k, v)) = line.trim_end().split_once(':') {
                        headers.push((k.trim().to_string(), v.trim().to_string()));
                    }
                }
                let length = headers
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                    .and_then(|(_, v)| v.parse::<usize>().ok())
                    .unwrap_or(0);
                let mut body = vec![0; length];
                let _ = reader.read_exact(&mut body);
                log.lock().unwrap().push(Received {
                    headers,
                    body,
                    at: Instant::now(),
                });
                let (status, extra) = script
                    .lock()
                    .unwrap()
                    .next()
                    .unwrap_or((200, String::new()));
                if status == 0 {
                    held.push(stream);
                    continue;
                }
                let reply = format!(
                    "HTTP/1.1 {status} X\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n"
                );
                let _ = stream.write_all(reply.as_bytes());
            }
        });
        Receiver { port, received }
    }

    pub fn start(script: Vec<u16>) -> Receiver {
        Self::start_on(0, script)
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hooks/orders", self.port)
    }

    /// Waits (bounded) until at least `n` requests have arrived; returns them all.
    pub async fn wait_for(&self, n: usize, within: Duration) -> Vec<Received> {
        let deadline = Instant::now() + within;
        loop {
            let got = self.received.lock().unwrap().clone();
            if got.len() >= n || Instant::now() > deadline {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A receiver that accepts connections and never answers: the slow partner.
pub struct Tarpit {
    pub port: u16,
    held: Arc<Mutex<Vec<std::net::TcpStream>>>,
}

impl Tarpit {
    pub fn start() -> Tarpit {
        let listener = TcpListener::bind(("127.0.0.1", 0)).expect("tarpit bind");
        let port = listener.local_addr().unwrap().port();
        let held = Arc::new(Mutex::new(Vec::new()));
        let keep = Arc::clone(&held);
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                keep.lock().unwrap().push(stream);
            }
        });
        Tarpit { port, held }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hooks/orders", self.port)
    }

    /// Connections accepted so far (none is ever answered).
    pub fn connections(&self) -> usize {
        self.held.lock().unwrap().len()
    }

    /// Waits until at least `n` connections were accepted, or `timeout` passed; returns the count.
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        while self.connections() < n && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.connections()
    }
}

/// One request a `SlowReceiver` got: its `webhook-id`, and when it arrived and was answered.
#[derive(Clone, Debug)]
pub struct Attempt {
    pub webhook_id: String,
    pub arrived: Instant,
    pub answered: Instant,
}

/// A receiver that takes every request at once, each on a thread of its own, and answers 200
/// after `delay`: deliveries overlap on it as they do on a slow partner's server.
pub struct SlowReceiver {
    pub port: u16,
    attempts: Arc<Mutex<Vec<Attempt>>>,
    arrivals: Arc<Mutex<Vec<Instant>>>,
}

impl SlowReceiver {
    pub fn start(delay: Duration) -> SlowReceiver {
        let listener = TcpListener::bind(("127.0.0.1", 0)).expect("receiver bind");
        let port = listener.local_addr().unwrap().port();
        let attempts = Arc::new(Mutex::new(Vec::new()));
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let (log, arrived_log) = (Arc::clone(&attempts), Arc::clone(&arrivals));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let (log, arrived_log) = (Arc::clone(&log), Arc::clone(&arrived_log));
                std::thread::spawn(move || {
                    let arrived = Instant::now();
                    arrived_log.lock().unwrap().push(arrived);
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let (mut webhook_id, mut length, mut line) = (String::new(), 0, String::new());
                    while reader.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
                        if let Some((k, v)) = line.trim_end().split_once(':') {
                            match k.trim().to_ascii_lowercase().as_str() {
                                "webhook-id" => webhook_id = v.trim().to_string(),
                                "content-length" => length = v.trim().parse().unwrap_or(0),
                                _ => {}
                            }
                        }
                        line.clear();
                    }
                    let mut body = vec![0; length];
                    let _ = reader.read_exact(&mut body);
                    std::thread::sleep(delay);
                    let reply = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
                    let _ = stream.write_all(reply.as_bytes());
                    log.lock().unwrap().push(Attempt {
                        webhook_id,
                        arrived,
                        answered: Instant::now(),
                    });
                });
            }
        });
        SlowReceiver {
            port,
            attempts,
            arrivals,
        }
    }

    /// Waits (bounded) until at least `n` requests have arrived; returns how many did.
    /// Each is handled to its end whether or not its sender is still there to read the
    /// answer, as a receiver's server does.
    pub async fn wait_for_arrivals(&self, n: usize, within: Duration) -> usize {
        let deadline = Instant::now() + within;
        loop {
            let arrived = self.arrivals.lock().unwrap().len();
            if arrived >= n || Instant::now() > deadline {
                return arrived;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hooks/orders", self.port)
    }

    /// The requests answered so far.
    pub fn answered(&self) -> Vec<Attempt> {
        self.attempts.lock().unwrap().clone()
    }
}
