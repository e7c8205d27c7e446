//! A loopback HTTP proxy that stands for a network that loses answers: it reads each request
//! whole, records it, and then does what the test's rule says: forward it and pass the answer
//! back, forward it and drop the answer (or hold it past the client's timeout), lose the
//! request itself, or answer in the server's place. One request per connection.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

pub enum Fate {
    /// Forward; pass the answer back.
    Pass,
    /// Forward (the server acts on it); close the client's connection without an answer.
    DropAnswer,
    /// Forward; keep the client waiting this long, then close without an answer.
    HoldAnswer(Duration),
    /// Lose the request: close without forwarding.
    Refuse,
    /// Answer in the server's place, without forwarding.
    Reply {
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: String,
    },
    /// Forward with one more header (and pass the answer back).
    AddHeader(&'static str, &'static str),
}

#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub at: Instant,
    /// The status the client was sent, if it was sent one.
    pub status: Option<u16>,
    pub response_headers: Vec<(String, String)>,
    /// When the answer was written to the client.
    pub answered_at: Option<Instant>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        find(&self.headers, name)
    }

    pub fn response_header(&self, name: &str) -> Option<&str> {
        find(&self.response_headers, name)
    }

    pub fn key(&self) -> Option<&str> {
        self.header("x-idempotency-key")
    }

    pub fn body_json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

fn find<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

type Rule = dyn Fn(&Seen, usize) -> Fate + Send + Sync;

struct Shared {
    upstream: String,
    rule: Box<Rule>,
    seen: Mutex<Vec<Seen>>,
    changed: Condvar,
}

pub struct Proxy {
    pub url: String,
    shared: Arc<Shared>,
}

impl Proxy {
    /// A proxy in front of `upstream` (`http://host:port`); `rule` decides the fate of the
    /// n-th request (from 0) once it has been read whole.
    pub fn start(
        upstream: &str,
        rule: impl Fn(&Seen, usize) -> Fate + Send + Sync + 'static,
    ) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy bind");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let shared = Arc::new(Shared {
            upstream: upstream
                .trim_start_matches("http://")
                .trim_end_matches('/')
                .to_string(),
            rule: Box::new(rule),
            seen: Mutex::new(Vec::new()),
            changed: Condvar::new(),
        });
        let accept = Arc::clone(&shared);
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let shared = Arc::clone(&accept);
                thread::spawn(move || shared.serve(stream));
            }
        });
        Proxy { url, shared }
    }

    /// A proxy that passes everything.
    pub fn passing(upstream: &str) -> Proxy {
        Proxy::start(upstream, |_, _| Fate::Pass)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.shared.seen.lock().unwrap().clone()
    }

    pub fn count(&self) -> usize {
        self.shared.seen.lock().unwrap().len()
    }

    /// Waits until `ready` holds for what the proxy has seen (bounded).
    pub fn wait_until(&self, within: Duration, ready: impl Fn(&[Seen]) -> bool) -> bool {
        let deadline = Instant::now() + within;
        let mut seen = self.shared.seen.lock().unwrap();
        loop {
            if ready(&seen) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            seen = self
                .shared
                .changed
                .wait_timeout(seen, deadline - now)
                .unwrap()
                .0;
        }
    }
}

/// The status and headers the server answered, and the bytes to pass back to the client.
type Forwarded = (u16, Vec<(String, String)>, Vec<u8>);

struct Request {
    head: String,
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Shared {
    fn serve(&self, client: TcpStream) {
        let _ = client.set_read_timeout(Some(Duration::from_secs(30)));
        let Some(request) = read_request(&client) else {
            return;
        };
        let index = {
            let mut seen = self.seen.lock().unwrap();
            seen.push(Seen {
                method: request.method.clone(),
                path: request.path.clone(),
                headers: request.headers.clone(),
                body: request.body.clone(),
                at: Instant::now(),
                status: None,
                response_headers: Vec::new(),
                answered_at: None,
            });
            self.changed.notify_all();
            seen.len() - 1
        };
        let snapshot = self.seen.lock().unwrap()[index].clone();
        let fate = (self.rule)(&snapshot, index);
        let (extra, fate) = match fate {
            Fate::AddHeader(k, v) => (Some((k, v)), Fate::Pass),
            other => (None, other),
        };
        match fate {
            Fate::Refuse => close(&client),
            Fate::Reply {
                status,
                headers,
                body,
            } => {
                let mut head = format!("HTTP/1.1 {status} Canned\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n", body.len());
                for (k, v) in &headers {
                    head.push_str(&format!("{k}: {v}\r\n"));
                }
                head.push_str("\r\n");
                let mut out = head.into_bytes();
                out.extend_from_slice(body.as_bytes());
                let headers = headers
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect();
                self.answer(&client, index, status, headers, &out);
            }
            Fate::Pass | Fate::DropAnswer | Fate::HoldAnswer(_) => {
                let Some((status, headers, bytes)) = self.forward(&request, extra) else {
                    close(&client);
                    return;
                };
                match fate {
                    Fate::Pass => self.answer(&client, index, status, headers, &bytes),
                    Fate::HoldAnswer(d) => {
                        thread::sleep(d);
                        close(&client);
                    }
                    _ => close(&client),
                }
            }
            Fate::AddHeader(..) => unreachable!(),
        }
    }

    fn answer(
        &self,
        mut client: &TcpStream,
        index: usize,
        status: u16,
        headers: Vec<(String, String)>,
        bytes: &[u8],
    ) {
        let _ = client.write_all(bytes);
        let _ = client.flush();
        {
            let mut seen = self.seen.lock().unwrap();
            seen[index].status = Some(status);
            seen[index].response_headers = headers;
            seen[index].answered_at = Some(Instant::now());
            self.changed.notify_all();
        }
        close(client);
    }

    /// Sends the request upstream on a connection of its own and reads the whole answer,
    /// rewritten to close the client's connection after it.
    fn forward(&self, request: &Request, extra: Option<(&str, &str)>) -> Option<Forwarded> {
        let mut upstream = TcpStream::connect(&self.upstream).ok()?;
        let _ = upstream.set_read_timeout(Some(Duration::from_secs(30)));
        let mut out = request.head.clone();
        for (k, v) in &request.headers {
            if !k.eq_ignore_ascii_case("connection") {
                out.push_str(&format!("{k}: {v}\r\n"));
            }
        }
        if let Some((k, v)) = extra {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        out.push_str("connection: close\r\n\r\n");
        let mut bytes = out.into_bytes();
        bytes.extend_from_slice(&request.body);
        upstream.write_all(&bytes).ok()?;
        let mut answer = Vec::new();
        upstream.read_to_end(&mut answer).ok()?;
        let split = answer.windows(4).position(|w| w == b"\r\n\r\n")?;
        let head = String::from_utf8_lossy(&answer[..split]).to_string();
        let body = &answer[split + 4..];
        let mut lines = head.split("\r\n");
        let status: u16 = lines.next()?.split(' ').nth(1)?.parse().ok()?;
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        let mut rebuilt = format!("{}\r\n", head.split("\r\n").next()?);
        for (k, v) in &headers {
            if !k.eq_ignore_ascii_case("connection") {
                rebuilt.push_str(&format!("{k}: {v}\r\n"));
            }
        }
        rebuilt.push_str("connection: close\r\n\r\n");
        let mut bytes = rebuilt.into_bytes();
        bytes.extend_from_slice(body);
        Some((status, headers, bytes))
    }
}

fn close(stream: &TcpStream) {
    let _ = stream.shutdown(Shutdown::Both);
}

fn read_request(stream: &TcpStream) -> Option<Request> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let head = line.clone();
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_string();
    let path = parts.next()?.to_string();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).ok()? == 0 {
            return None;
        }
        if h == "\r\n" || h == "\n" {
            break;
        }
        if let Some((k, v)) = h.trim_end().split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    let length: usize = find(&headers, "content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(Request {
        head,
        method,
        path,
        headers,
        body,
    })
}
