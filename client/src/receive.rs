//! `orderly-client receive`: verify, claim, run CMD with the event on its standard input,
//! answer 200 once CMD exits 0 (the event done) and 500 when it fails (the claim released,
//! so the sender's redelivery runs it again). A copy arriving while CMD runs waits for that
//! run's result; an event already done answers 200 and runs nothing; a bad signature or a
//! timestamp outside the tolerance answers 401 and runs nothing.

mod http;

use std::io::Write;
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use orderly_client::webhooks::{self, Claim, Inbox};
use serde_json::Value;

use crate::failure::Failure;
use http::Unread;

/// orderly sends events of a few KiB; anything much larger is not one of its callbacks.
const MAX_BODY: u64 = 1 << 20;
/// A request's head and body arrive within this, or its connection is closed.
const READ_WITHIN: Duration = Duration::from_secs(10);
/// Requests whose handler runs at once; past this the sender is told to come back (503).
/// A connection still being read does not count: it has asked for nothing yet.
const MAX_IN_FLIGHT: usize = 256;
/// Connections open at once (each has a thread); past this a new one is closed unread. Each
/// is held at most `READ_WITHIN` before its handler, so stalled ones free their place.
const MAX_CONNECTIONS: usize = 2048;

struct Receiver {
    secret: String,
    command: Vec<String>,
    inbox: Inbox,
    in_flight: AtomicUsize,
    connections: AtomicUsize,
}

pub(crate) fn run(
    listen: &str,
    secret: &str,
    inbox: &Path,
    command: Vec<String>,
) -> Result<(), Failure> {
    webhooks::sign(secret, "probe", 0, b"")
        .map_err(|e| Failure::Usage(format!("--secret: {e}")))?;
    let inbox = Inbox::open(inbox).map_err(|e| Failure::Runtime(e.to_string()))?;
    let address: std::net::SocketAddr = listen
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| Failure::Usage(format!("--listen {listen}: not an address")))?;
    // Binding can fail for reasons of the moment (the port is taken): not bad usage.
    let listener = TcpListener::bind(address)
        .map_err(|e| Failure::Runtime(format!("--listen {listen}: {e}")))?;
    let address = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| listen.to_string());
    println!("orderly-client receiving on http://{address}");
    let _ = std::io::stdout().flush();
    let receiver = Arc::new(Receiver {
        secret: secret.to_string(),
        command,
        inbox,
        in_flight: AtomicUsize::new(0),
        connections: AtomicUsize::new(0),
    });
    for stream in listener.incoming() {
        // An accept that fails (the peer reset, out of descriptors) costs that connection.
        let Ok(stream) = stream else { continue };
        if receiver.connections.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            receiver.connections.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        let serving = Arc::clone(&receiver);
        let spawned = thread::Builder::new().spawn(move || {
            serving.serve(stream);
            serving.connections.fetch_sub(1, Ordering::SeqCst);
        });
        if spawned.is_err() {
            receiver.connections.fetch_sub(1, Ordering::SeqCst);
        }
    }
    Ok(())
}

/// Why the handler command did not take an event (it is released for the redelivery).
#[derive(Debug, thiserror::Error)]
enum CommandFailed {
    #[error("{0}")]
    Io(std::io::Error),
    #[error("cannot start {0}: {1}")]
    Start(String, std::io::Error),
    #[error("the command failed ({0})")]
    Exit(std::process::ExitStatus),
}

impl Receiver {
    /// Reads the connection's one request, runs it if there is room, answers, closes.
    fn serve(&self, mut stream: TcpStream) {
        // A sender that does not read its answer must not hold the thread either.
        let _ = stream.set_write_timeout(Some(READ_WITHIN));
        let request = match http::read_request(&mut stream, READ_WITHIN, MAX_BODY) {
            Ok(request) => request,
            Err(Unread::Gone) => return,
            Err(Unread::Refused(status, body)) => {
                return http::respond(&mut stream, status, body, &[])
            }
        };
        if self.in_flight.fetch_add(1, Ordering::SeqCst) >= MAX_IN_FLIGHT {
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            let busy = r#"{"success":false,"error":"busy"}"#;
            return http::respond(&mut stream, 503, busy, &[("Retry-After", "1")]);
        }
        let (status, body) = self.answer(&request);
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        http::respond(&mut stream, status, body, &[]);
    }

    fn answer(&self, request: &http::Request) -> (u16, &'static str) {
        if request.method != "POST" {
            return (405, r#"{"success":false,"error":"POST only"}"#);
        }
        let (headers, body) = (&request.headers, &request.body);
        if let Err(e) = webhooks::verify(&self.secret, headers, body) {
            eprintln!("orderly-client: refused a delivery: {e}");
            return (401, r#"{"success":false,"error":"invalid signature"}"#);
        }
        let event: Option<Value> = serde_json::from_slice(body).ok();
        let field = |name: &str| {
            event
                .as_ref()
                .and_then(|e| e.get(name))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        // The signed body's event id; orderly sends the same value as webhook-id.
        let Some(id) = field("id")
            .or_else(|| webhooks::Headers::header(headers, "webhook-id").map(str::to_string))
        else {
            return (400, r#"{"success":false,"error":"no event id"}"#);
        };
        match self.inbox.claim(&id) {
            Claim::AlreadyDone => (200, r#"{"success":true,"duplicate":true}"#),
            Claim::RunFailed => (500, r#"{"success":false,"error":"handler failed"}"#),
            Claim::Claimed(ticket) => {
                let kind = field("type").unwrap_or_default();
                match self.run_command(&id, &kind, body) {
                    Ok(()) => match ticket.done() {
                        Ok(()) => (200, r#"{"success":true,"duplicate":false}"#),
                        Err(e) => {
                            eprintln!("orderly-client: event {id}: {e}");
                            (500, r#"{"success":false,"error":"handler failed"}"#)
                        }
                    },
                    Err(why) => {
                        eprintln!("orderly-client: event {id}: {why}; released for the redelivery");
                        drop(ticket);
                        (500, r#"{"success":false,"error":"handler failed"}"#)
                    }
                }
            }
        }
    }

    /// Runs CMD with the event on stdin; its own output goes to our stderr, keeping our
    /// stdout to the one line that says where we listen.
    fn run_command(&self, id: &str, kind: &str, body: &[u8]) -> Result<(), CommandFailed> {
        let stderr = std::io::stderr()
            .as_fd()
            .try_clone_to_owned()
            .map_err(CommandFailed::Io)?;
        let mut child = Command::new(&self.command[0])
            .args(&self.command[1..])
            .env("ORDERLY_EVENT_ID", id)
            .env("ORDERLY_EVENT_TYPE", kind)
            .stdin(Stdio::piped())
            .stdout(Stdio::from(stderr))
            .spawn()
            .map_err(|e| CommandFailed::Start(self.command[0].clone(), e))?;
        let mut stdin = child.stdin.take().expect("piped stdin");
        let body = body.to_vec();
        // A command that does not read its input must not block us: write from a thread and
        // ignore a broken pipe.
        let writer = thread::spawn(move || {
            let _ = stdin.write_all(&body);
        });
        let status = child.wait().map_err(CommandFailed::Io)?;
        let _ = writer.join();
        if status.success() {
            Ok(())
        } else {
            Err(CommandFailed::Exit(status))
        }
    }
}
