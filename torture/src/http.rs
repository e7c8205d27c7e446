//! One request of the workload, from send to history line: which instance it went to, when it was
//! sent and answered, what the answer says (model::Outcome), whether it ended by the deadline
//! (docs/contract.md "Every request ends by its deadline"), and whether it is exempt from that
//! because its instance was paused, killed or restarted while it was in flight.

use crate::ctx::Ctx;
use crate::history::{excerpt, short_hash};
use crate::model::{over_deadline, Outcome};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Debug)]
pub enum Auth {
    None,
    Key(String),
    Admin,
}

#[derive(Clone, Debug)]
pub struct Req {
    pub kind: &'static str,
    pub method: reqwest::Method,
    pub path: String,
    pub auth: Auth,
    pub idem_key: Option<String>,
    pub body: Option<Arc<[u8]>>,
    pub headers: Vec<(&'static str, String)>,
    /// A write (for readiness and the model); reads are answered 503 without meaning.
    pub write: bool,
    pub instance: usize,
    pub client: usize,
}

impl Req {
    pub fn new(
        kind: &'static str,
        method: reqwest::Method,
        path: impl Into<String>,
        instance: usize,
        client: usize,
    ) -> Self {
        let write = method != reqwest::Method::GET;
        Req {
            kind,
            method,
            path: path.into(),
            auth: Auth::None,
            idem_key: None,
            body: None,
            headers: Vec::new(),
            write,
            instance,
            client,
        }
    }

    pub fn auth(mut self, a: Auth) -> Self {
        self.auth = a;
        self
    }

    pub fn key(mut self, k: impl Into<String>) -> Self {
        self.idem_key = Some(k.into());
        self
    }

    pub fn body(mut self, b: Arc<[u8]>) -> Self {
        self.body = Some(b);
        self
    }

    pub fn json(self, v: &Value) -> Self {
        let b: Arc<[u8]> = Arc::from(v.to_string().into_bytes());
        self.body(b)
    }

    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Never reached the server (connection refused).
    Connect,
    /// No answer within the client's timeout.
    Timeout,
    /// The connection dropped after the request was (maybe) sent.
    Dropped(String),
}

#[derive(Clone, Debug)]
pub struct Resp {
    pub status: Option<u16>,
    pub replayed: bool,
    pub body: Vec<u8>,
    pub failure: Option<Failure>,
    pub start_ms: u64,
    pub end_ms: u64,
    pub instance: usize,
    /// The instance was paused, killed or restarted while this was in flight.
    pub exempt: bool,
}

impl Resp {
    pub fn ok(&self) -> bool {
        self.status.is_some_and(|s| (200..300).contains(&s))
    }

    pub fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// The `error` field of an error envelope (or the 401/403 `message`).
    pub fn error_text(&self) -> String {
        self.json()
            .and_then(|v| {
                v.get("error")
                    .or_else(|| v.get("message"))
                    .and_then(|e| e.as_str())
                    .map(str::to_string)
            })
            .unwrap_or_default()
    }

    /// The token of an error: the text before its first ':'.
    pub fn token(&self) -> String {
        let e = self.error_text();
        e.split(':').next().unwrap_or("").to_string()
    }

    pub fn digest(&self) -> [u8; 32] {
        Sha256::digest(&self.body).into()
    }

    /// What this answer says about a write (model.rs).
    pub fn outcome(&self) -> Outcome {
        match (&self.failure, self.status) {
            (Some(Failure::Connect), _) => Outcome::NotSent,
            (Some(_), _) | (None, None) => Outcome::Unknown,
            (None, Some(s)) if (200..300).contains(&s) => Outcome::Ok {
                replayed: self.replayed,
                digest: self.digest(),
            },
            (None, Some(503)) => Outcome::NothingWritten,
            (None, Some(s)) if s >= 500 => Outcome::Unknown,
            (None, Some(409)) => {
                let e = self.error_text();
                if e.starts_with("idempotency_key_reused_with_different_body") {
                    Outcome::KeyConflict
                } else if e.starts_with("Duplicate request in progress") {
                    Outcome::InProgress
                } else {
                    Outcome::Refused {
                        status: 409,
                        token: self.token(),
                    }
                }
            }
            (None, Some(s)) => Outcome::Refused {
                status: s,
                token: self.token(),
            },
        }
    }

    pub fn describe(&self) -> String {
        match (&self.failure, self.status) {
            (Some(Failure::Connect), _) => "connection refused".into(),
            (Some(Failure::Timeout), _) => "no answer (timeout)".into(),
            (Some(Failure::Dropped(e)), _) => format!("dropped: {e}"),
            (None, Some(s)) => format!(
                "{s}{} {}",
                if self.replayed { " (replayed)" } else { "" },
                excerpt(&self.body, 160)
            ),
            (None, None) => "no answer".into(),
        }
    }
}

/// Sends one request and records it: tallies, the deadline check, the history line.
pub async fn send(ctx: &Arc<Ctx>, http: &reqwest::Client, req: &Req) -> Resp {
    let inst = ctx.cluster.instances[req.instance].clone();
    let url = format!("{}{}", inst.url(), req.path);
    let mut b = http.request(req.method.clone(), &url);
    match &req.auth {
        Auth::None => {}
        Auth::Key(k) => b = b.header("X-Api-Key", k),
        Auth::Admin => {
            b = b.header(
                "Authorization",
                format!("Bearer {}", ctx.cluster.admin_token),
            )
        }
    }
    if let Some(k) = &req.idem_key {
        b = b.header("X-Idempotency-Key", k);
    }
    for (n, v) in &req.headers {
        b = b.header(*n, v);
    }
    if let Some(body) = &req.body {
        b = b
            .header("Content-Type", "application/json")
            .body(body.to_vec());
    }
    // The client waits past the deadline, so a late answer is measured rather than cut off;
    // the watchdog judges the ones that never come.
    let timeout = ctx.cfg.deadline + Duration::from_secs(6);
    let start_ms = ctx.now_ms();
    let (rid, epoch) = inst.begin_request(req.write, start_ms);
    let result = tokio::time::timeout(timeout, async {
        let r = b.send().await?;
        let status = r.status().as_u16();
        let replayed = r
            .headers()
            .get("idempotency-replayed")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
        let body = r.bytes().await?;
        Ok::<_, reqwest::Error>((status, replayed, body.to_vec()))
    })
    .await;
    let end_ms = ctx.now_ms();
    let (status, replayed, body, failure) = match result {
        Ok(Ok((s, rp, body))) => (Some(s), rp, body, None),
        Ok(Err(e)) => {
            let f = if e.is_connect() {
                Failure::Connect
            } else if e.is_timeout() {
                Failure::Timeout
            } else {
                Failure::Dropped(short_error(&e))
            };
            (None, false, Vec::new(), Some(f))
        }
        Err(_) => (None, false, Vec::new(), Some(Failure::Timeout)),
    };
    let answered = status.is_some();
    let write_done = req.write && status.is_some_and(|s| (200..300).contains(&s));
    let write_failed = req.write
        && (status.is_some_and(|s| s >= 500)
            || matches!(failure, Some(Failure::Dropped(_)) | Some(Failure::Timeout)));
    inst.end_request(rid, answered, write_done, write_failed, end_ms);
    let exempt = inst.epoch() != epoch || inst.disturbed_during(start_ms, end_ms);
    let resp = Resp {
        status,
        replayed,
        body,
        failure,
        start_ms,
        end_ms,
        instance: req.instance,
        exempt,
    };
    ctx.count_op(req.kind);

    // docs/contract.md "Every request ends by its deadline": every request ends by its deadline
    // (the streamed backup is bounded elsewhere).
    let elapsed = end_ms - start_ms;
    let refused = resp.failure == Some(Failure::Connect);
    if !refused {
        ctx.check();
        if over_deadline(elapsed, ctx.cfg.deadline_ms()) {
            if exempt {
                ctx.tally
                    .exempt
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            } else {
                ctx.violation(
                    "deadline",
                    &format!(
                        "{} {} to instance {} (client {}, kind {}) took {} ms (deadline {} ms + 500): {}",
                        req.method,
                        req.path,
                        req.instance,
                        req.client,
                        req.kind,
                        elapsed,
                        ctx.cfg.deadline_ms(),
                        resp.describe()
                    ),
                );
            }
        }
    }
    let mut line = json!({
        "t": "op", "c": req.client, "k": req.kind, "m": req.method.as_str(), "p": req.path,
        "i": req.instance, "s": start_ms, "e": end_ms, "st": status, "rp": replayed,
    });
    if let Some(k) = &req.idem_key {
        line["key"] = json!(k);
    }
    if let Some(bd) = &req.body {
        line["bh"] = json!(short_hash(bd));
    }
    if resp.ok() {
        line["x"] = json!(short_hash(&resp.body));
    } else if answered {
        line["x"] = json!(excerpt(&resp.body, 160));
    }
    if let Some(f) = &resp.failure {
        line["err"] = json!(format!("{f:?}"));
    }
    if exempt {
        line["exempt"] = json!(true);
    }
    ctx.hist.op(line);
    resp
}

fn short_error(e: &reqwest::Error) -> String {
    use std::error::Error;
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        s = format!("{s}: {x}");
        src = x.source();
    }
    excerpt(s.as_bytes(), 160)
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(8)
        .pool_idle_timeout(Duration::from_secs(20))
        .tcp_nodelay(true)
        .build()
        .expect("an HTTP client with no TLS cannot fail to build")
}
