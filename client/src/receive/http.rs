//! The receiver's HTTP/1.1: one request per connection, read whole (head and body) within a
//! deadline or the connection is closed, then one answer and `Connection: close`.
//!
//! A general server (tiny_http was) reads without a timeout: a sender that opens a
//! connection and stalls holds a thread, and its request counted against the in-flight bound
//! as soon as its headers arrived. Here nothing of a request reaches the handler until all of
//! it has arrived, and the deadline covers the whole request, so a byte every few seconds
//! does not keep a connection either. orderly's deliveries are one small POST each, so
//! keep-alive buys nothing worth the state it needs.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Headers beyond this are not one of orderly's deliveries.
const MAX_HEAD: usize = 16 * 1024;
const MAX_HEADERS: usize = 64;

pub struct Request {
    pub method: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// Why a request was not read.
#[derive(Debug, PartialEq, Eq)]
pub enum Unread {
    /// The peer went away, sent nothing in time, or the socket failed: nothing to answer.
    Gone,
    /// The request is refused before its handler: this status and JSON body.
    Refused(u16, &'static str),
}

/// Reads one request from `stream`, all of it within `within`; a body longer than
/// `max_body` is refused unread.
pub fn read_request(
    stream: &mut TcpStream,
    within: Duration,
    max_body: u64,
) -> Result<Request, Unread> {
    let deadline = Instant::now() + within;
    let mut buffer = Vec::with_capacity(1024);
    let (head_len, method, headers) = loop {
        read_more(stream, &mut buffer, deadline)?;
        let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut parsed = httparse::Request::new(&mut slots);
        match parsed.parse(&buffer) {
            Ok(httparse::Status::Complete(len)) => {
                let method = parsed.method.unwrap_or_default().to_string();
                let headers = parsed
                    .headers
                    .iter()
                    .map(|h| {
                        (
                            h.name.to_string(),
                            String::from_utf8_lossy(h.value).into_owned(),
                        )
                    })
                    .collect::<Vec<_>>();
                break (len, method, headers);
            }
            Ok(httparse::Status::Partial) if buffer.len() > MAX_HEAD => {
                return Err(Unread::Refused(
                    431,
                    r#"{"success":false,"error":"headers too large"}"#,
                ))
            }
            Ok(httparse::Status::Partial) => {}
            Err(httparse::Error::TooManyHeaders) => {
                return Err(Unread::Refused(
                    431,
                    r#"{"success":false,"error":"too many headers"}"#,
                ))
            }
            Err(_) => {
                return Err(Unread::Refused(
                    400,
                    r#"{"success":false,"error":"malformed request"}"#,
                ))
            }
        }
    };
    let length = body_length(&headers)?;
    if length > max_body {
        return Err(Unread::Refused(
            413,
            r#"{"success":false,"error":"body too large"}"#,
        ));
    }
    let mut body = buffer.split_off(head_len);
    if body.is_empty()
        && length > 0
        && header(&headers, "expect").is_some_and(|v| v.eq_ignore_ascii_case("100-continue"))
    {
        stream
            .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            .map_err(|_| Unread::Gone)?;
    }
    while (body.len() as u64) < length {
        read_more(stream, &mut body, deadline)?;
    }
    // Bytes past the declared length would be a second request: one per connection.
    body.truncate(length as usize);
    Ok(Request {
        method,
        headers,
        body,
    })
}

/// Writes the answer and closes the connection (the caller drops the stream).
pub fn respond(stream: &mut TcpStream, status: u16, body: &str, extra: &[(&str, &str)]) {
    let mut head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
        reason(status),
        body.len()
    );
    for (name, value) in extra {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let _ = stream
        .write_all(head.as_bytes())
        .and_then(|()| stream.write_all(body.as_bytes()))
        .and_then(|()| stream.flush());
}

fn read_more(stream: &mut TcpStream, into: &mut Vec<u8>, deadline: Instant) -> Result<(), Unread> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(Unread::Gone);
    }
    stream
        .set_read_timeout(Some(left))
        .map_err(|_| Unread::Gone)?;
    let mut chunk = [0u8; 8192];
    match stream.read(&mut chunk) {
        Ok(0) => Err(Unread::Gone),
        Ok(n) => {
            into.extend_from_slice(&chunk[..n]);
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
        Err(_) => Err(Unread::Gone),
    }
}

/// The body's length from `Content-Length` (absent: none). A chunked body is refused: every
/// sender of callbacks knows its body's length, and a chunked reader is code to get wrong.
fn body_length(headers: &[(String, String)]) -> Result<u64, Unread> {
    if header(headers, "transfer-encoding").is_some() {
        return Err(Unread::Refused(
            411,
            r#"{"success":false,"error":"a Content-Length is required"}"#,
        ));
    }
    let mut lengths = headers
        .iter()
        .filter(|(name, _)| name.eq_ignore_ascii_case("content-length"))
        .map(|(_, value)| value.trim().parse::<u64>());
    let malformed = || {
        Unread::Refused(
            400,
            r#"{"success":false,"error":"malformed Content-Length"}"#,
        )
    };
    let Some(first) = lengths.next() else {
        return Ok(0);
    };
    let first = first.map_err(|_| malformed())?;
    // Two different lengths are how requests get smuggled: refuse rather than pick one.
    if lengths.any(|other| other.ok() != Some(first)) {
        return Err(malformed());
    }
    Ok(first)
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        405 => "Method Not Allowed",
        411 => "Length Required",
        413 => "Payload Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A connected pair: what the test writes on the first, the server reads on the second.
    fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        (client, server)
    }

    fn read(sent: &[u8], within: Duration) -> Result<Request, Unread> {
        let (mut client, mut server) = pair();
        client.write_all(sent).unwrap();
        read_request(&mut server, within, 100)
    }

    #[test]
    fn a_request_in_pieces_is_read_whole() {
        let (mut client, mut server) = pair();
        let writer = std::thread::spawn(move || {
            for piece in [
                &b"POST / HTTP/1.1\r\nContent-Le"[..],
                b"ngth: 5\r\n\r\nhe",
                b"llo",
            ] {
                client.write_all(piece).unwrap();
                std::thread::sleep(Duration::from_millis(20));
            }
            client
        });
        let request = read_request(&mut server, Duration::from_secs(5), 100).unwrap();
        assert_eq!(request.method, "POST");
        assert_eq!(request.body, b"hello");
        drop(writer.join());
    }

    #[test]
    fn a_body_that_stalls_is_given_up_at_the_deadline() {
        let started = Instant::now();
        let outcome = read(
            b"POST / HTTP/1.1\r\nContent-Length: 100\r\n\r\nabc",
            Duration::from_millis(200),
        );
        assert_eq!(outcome.err(), Some(Unread::Gone));
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn a_body_over_the_limit_is_refused_unread() {
        let outcome = read(
            b"POST / HTTP/1.1\r\nContent-Length: 101\r\n\r\n",
            Duration::from_secs(5),
        );
        assert!(matches!(outcome, Err(Unread::Refused(413, _))));
    }

    #[test]
    fn chunked_and_conflicting_lengths_are_refused() {
        let chunked = read(
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            Duration::from_secs(5),
        );
        assert!(matches!(chunked, Err(Unread::Refused(411, _))));
        let two = read(
            b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
            Duration::from_secs(5),
        );
        assert!(matches!(two, Err(Unread::Refused(400, _))));
        let garbage = read(b"\x00\x01 nonsense\r\n\r\n", Duration::from_secs(5));
        assert!(matches!(garbage, Err(Unread::Refused(400, _))));
    }
}
