//! The harness's webhook receiver: a small HTTP/1.1 server the orders' callbackUrl points at.
//! It records every POST (webhook-id, which process sent it: the instance and its process
//! generation, arrival, end), verifies the Standard Webhooks signature against the secrets the
//! account is known to have had, and can stall (answer after 8 s, or not at all for a while)
//! on the fault schedule's word, or be made slow by a fault (an override the stalls cannot
//! cancel). Like a real receiver it cannot tell when a sender went away: a POST whose sender
//! closed the connection during a stall is still being handled until the receiver would have
//! answered (at most 10 s after its start, the server's attempt timeout). Two POSTs of one
//! webhook-id from two senders that overlap in time are reported as they end (model.rs).

use crate::history::excerpt;
use crate::model::{
    cut_by_graceful_stop, overlapping_posts, same_process_overlaps, Post, SenderEnd, CUT_BEFORE_MS,
};
use crate::rng::Rng;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Normal,
    /// Every POST answered after this long (an overloaded receiver).
    Slow(Duration),
    /// No answer until the mode changes (a receiver that hangs).
    Hold,
}

/// What the receiver does now: the stall track's mode, and a fault's override (the track's
/// changes do not touch it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Modes {
    track: Mode,
    over: Option<Mode>,
}

impl Modes {
    fn effective(self) -> Mode {
        self.over.unwrap_or(self.track)
    }
}

/// The longest a POST is held to be handled after its sender went away: the server's webhook
/// attempt timeout (a sender's fence can only cover its own attempt).
pub const SPAN_CAP: Duration = Duration::from_secs(10);

#[derive(Clone, Debug)]
pub struct PostRec {
    pub instance: Option<usize>,
    /// The process generation of the instance that held the connection.
    pub gen: Option<u64>,
    pub start_ms: u64,
    pub end_ms: Option<u64>,
    pub status: u16,
    /// When the sender closed the connection before the answer.
    pub gone_ms: Option<u64>,
    /// The pairs already reported (so each overlap is one violation).
    pub reported: bool,
    /// Judged by the graceful-stop rule already.
    pub cut_judged: bool,
}

/// A POST whose signature matched none of the secrets known when it came: judged again at the
/// end, once the accounts' secrets are read back.
#[derive(Clone, Debug)]
pub struct Unverified {
    pub account: usize,
    pub id: String,
    pub timestamp: String,
    pub body: Vec<u8>,
    pub signatures: String,
}

/// What the receiver asks of the run it belongs to, to attribute and judge each POST
/// (`ctx::Ctx` implements it). A trait, so that the receiver does not depend on the run's
/// context, which holds it.
pub trait Judge: Send + Sync {
    /// Milliseconds since the run started.
    fn now_ms(&self) -> u64;
    /// Every instance's (index, pid, process generation) now.
    fn senders(&self) -> Vec<(usize, i32, u64)>;
    /// The webhook secrets an account's deliveries may be signed with.
    fn secrets_of(&self, account: usize) -> Vec<String>;
    /// Counts one check.
    fn check(&self);
    /// Reports a violation of `check`.
    fn violation(&self, check: &str, detail: &str);
    /// A line for the summary that is not a violation.
    fn note(&self, text: &str);
    /// Appends an operation to the history file.
    fn record(&self, op: serde_json::Value);
    /// How process generation `gen` of instance `instance` ended, if it has.
    fn end_of(&self, instance: usize, gen: u64) -> Option<SenderEnd>;
    /// Whether the instance (any, for `None`) was paused at some point within [from, to].
    fn paused_during(&self, instance: Option<usize>, from: u64, to: u64) -> bool;
    /// Whether the run is on sled (a crash there may cut a POST on the wire).
    fn on_sled(&self) -> bool;
}

pub struct Receiver {
    pub port: u16,
    /// The address callback URLs name: 127.0.0.1, or one every instance's network namespace
    /// reaches (netns.rs).
    host: Mutex<std::net::Ipv4Addr>,
    mode: watch::Sender<Modes>,
    /// POSTs on the wire now (arrived, not answered, sender still there), by sender process.
    on_wire: Mutex<HashMap<(usize, u64), u32>>,
    pub posts: Mutex<HashMap<String, Vec<PostRec>>>,
    pub unverified: Mutex<Vec<Unverified>>,
    pub count: AtomicU64,
    pub same_instance_overlaps: AtomicU64,
    /// Off while restored backups are served: their outbox repeats the run's deliveries,
    /// which are answered 200 and not judged.
    pub recording: std::sync::atomic::AtomicBool,
    rng: Mutex<Rng>,
    ctx: Mutex<Option<Weak<dyn Judge>>>,
}

impl Receiver {
    pub async fn start(seed: u64) -> std::io::Result<Arc<Receiver>> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let (mode, _) = watch::channel(Modes {
            track: Mode::Normal,
            over: None,
        });
        let r = Arc::new(Receiver {
            port,
            host: Mutex::new(std::net::Ipv4Addr::LOCALHOST),
            mode,
            on_wire: Mutex::new(HashMap::new()),
            posts: Mutex::new(HashMap::new()),
            unverified: Mutex::new(Vec::new()),
            count: AtomicU64::new(0),
            same_instance_overlaps: AtomicU64::new(0),
            recording: std::sync::atomic::AtomicBool::new(true),
            rng: Mutex::new(Rng::stream(seed, "receiver", 0)),
            ctx: Mutex::new(None),
        });
        tokio::spawn(r.clone().accept(listener));
        Ok(r)
    }

    /// Listens on `ip` too, on the same port, and callback URLs name it from now on (before
    /// any is given out: instances in network namespaces reach the host there).
    pub async fn listen_also(self: &Arc<Self>, ip: std::net::Ipv4Addr) -> std::io::Result<()> {
        let listener = TcpListener::bind((ip, self.port)).await?;
        tokio::spawn(self.clone().accept(listener));
        *self.host.lock().unwrap() = ip;
        Ok(())
    }

    async fn accept(self: Arc<Self>, listener: TcpListener) {
        loop {
            let Ok((sock, peer)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            };
            let me = self.clone();
            tokio::spawn(async move { me.connection(sock, peer).await });
        }
    }

    pub fn attach(&self, ctx: Arc<dyn Judge>) {
        *self.ctx.lock().unwrap() = Some(Arc::downgrade(&ctx));
    }

    /// The stall track's mode.
    pub fn set_mode(&self, m: Mode) {
        self.mode.send_modify(|x| x.track = m);
    }

    /// A fault's override (None: back to the track's mode); the track cannot cancel it.
    pub fn set_override(&self, m: Option<Mode>) {
        self.mode.send_modify(|x| x.over = m);
    }

    /// POSTs from process `gen` of instance `idx` on the wire now.
    pub fn on_wire_from(&self, idx: usize, gen: u64) -> u32 {
        self.on_wire
            .lock()
            .unwrap()
            .get(&(idx, gen))
            .copied()
            .unwrap_or(0)
    }

    fn wire(&self, sender: Option<(usize, u64)>, up: bool) {
        let Some(k) = sender else { return };
        let mut m = self.on_wire.lock().unwrap();
        let n = m.entry(k).or_insert(0);
        if up {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(&k);
            }
        }
    }

    pub fn url_for(&self, account: usize) -> String {
        format!(
            "http://{}:{}/hook/{account}",
            self.host.lock().unwrap(),
            self.port
        )
    }

    pub fn received_ids(&self) -> HashSet<String> {
        self.posts.lock().unwrap().keys().cloned().collect()
    }

    async fn connection(self: Arc<Self>, mut sock: TcpStream, peer: SocketAddr) {
        let judge = self.ctx.lock().unwrap().as_ref().and_then(Weak::upgrade);
        let Some(ctx) = judge else {
            return;
        };
        let local = sock.local_addr().ok();
        // Which process holds the other end (read from /proc once per connection): the
        // instance and its process generation, read with the pid when the connection came.
        let pids: Vec<(usize, i32, u64)> = ctx.senders();
        let sender: Option<(usize, u64)> = match local {
            Some(l) => tokio::task::spawn_blocking(move || owner_process(peer, l, &pids))
                .await
                .ok()
                .flatten(),
            None => None,
        };
        let instance = sender.map(|s| s.0);
        let gen = sender.map(|s| s.1);
        let mut buf: Vec<u8> = Vec::with_capacity(8192);
        loop {
            // Read one request: head, then Content-Length bytes of body.
            let (head_len, headers, path) = loop {
                let mut hdrs = [httparse::EMPTY_HEADER; 64];
                let mut req = httparse::Request::new(&mut hdrs);
                match req.parse(&buf) {
                    Ok(httparse::Status::Complete(n)) => {
                        let h: Vec<(String, String)> = req
                            .headers
                            .iter()
                            .map(|h| {
                                (
                                    h.name.to_ascii_lowercase(),
                                    String::from_utf8_lossy(h.value).into_owned(),
                                )
                            })
                            .collect();
                        break (n, h, req.path.unwrap_or("/").to_string());
                    }
                    Ok(httparse::Status::Partial) => {}
                    Err(_) => return,
                }
                let mut chunk = [0u8; 8192];
                match tokio::time::timeout(Duration::from_secs(120), sock.read(&mut chunk)).await {
                    Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return,
                    Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
                }
            };
            let start_ms = ctx.now_ms();
            let started = Instant::now();
            let get = |name: &str| {
                headers
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.clone())
            };
            let len: usize = get("content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            while buf.len() < head_len + len {
                let mut chunk = [0u8; 8192];
                match tokio::time::timeout(Duration::from_secs(30), sock.read(&mut chunk)).await {
                    Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return,
                    Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let body: Vec<u8> = buf[head_len..head_len + len].to_vec();
            buf.drain(..head_len + len);
            let close = get("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
            if !self.recording.load(Ordering::SeqCst) {
                if sock
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                    .await
                    .is_err()
                    || close
                {
                    return;
                }
                continue;
            }
            let id = get("webhook-id").unwrap_or_default();
            let body_id = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["id"].as_str().map(str::to_string))
                .unwrap_or_default();
            let account: Option<usize> = path.strip_prefix("/hook/").and_then(|a| a.parse().ok());
            let sig_ok = match (account, get("webhook-timestamp"), get("webhook-signature")) {
                (Some(acc), Some(ts), Some(sigs)) => {
                    let ok = verify(&ctx.secrets_of(acc), &id, &ts, &body, &sigs);
                    if !ok {
                        let mut u = self.unverified.lock().unwrap();
                        if u.len() < 10_000 {
                            u.push(Unverified {
                                account: acc,
                                id: id.clone(),
                                timestamp: ts,
                                body: body.clone(),
                                signatures: sigs,
                            });
                        }
                    }
                    ok
                }
                _ => false,
            };
            self.count.fetch_add(1, Ordering::Relaxed);
            let slot = {
                let mut posts = self.posts.lock().unwrap();
                let v = posts.entry(id.clone()).or_default();
                v.push(PostRec {
                    instance,
                    gen,
                    start_ms,
                    end_ms: None,
                    status: 0,
                    gone_ms: None,
                    reported: false,
                    cut_judged: false,
                });
                v.len() - 1
            };
            self.wire(sender, true);
            if id.is_empty() || account.is_none() || body_id != id {
                ctx.violation(
                    "webhook-shape",
                    &format!(
                        "a POST to {path} with webhook-id {id:?}, body id {body_id:?}: {}",
                        excerpt(&body, 120)
                    ),
                );
            }
            // Decide the answer: the fault's mode first, then a few refusals of our own so
            // retries and given-up deliveries happen.
            let mut mode_rx = self.mode.subscribe();
            let mode = mode_rx.borrow_and_update().effective();
            let answer_in: Option<Duration> = match mode {
                Mode::Normal => None,
                Mode::Slow(d) => Some(d),
                Mode::Hold => Some(Duration::from_secs(45)),
            };
            // A sender that goes away does not end the POST for the receiver, which cannot
            // tell: it is handled until it would have been answered, at most SPAN_CAP after
            // its start.
            let mut gone_ms: Option<u64> = None;
            if let Some(d) = answer_in {
                let answer = tokio::time::sleep_until((started + d).into());
                let cap = tokio::time::sleep_until((started + SPAN_CAP).into());
                tokio::pin!(answer);
                tokio::pin!(cap);
                let mut probe = [0u8; 1024];
                loop {
                    tokio::select! {
                        _ = &mut answer => break,
                        _ = &mut cap, if gone_ms.is_some() => break,
                        r = sock.read(&mut probe), if gone_ms.is_none() => match r {
                            Ok(0) | Err(_) => {
                                let t = ctx.now_ms();
                                gone_ms = Some(t);
                                self.mark_gone(&id, slot, t);
                                self.wire(sender, false);
                            }
                            Ok(n) => buf.extend_from_slice(&probe[..n]),
                        },
                        ch = mode_rx.changed(), if mode == Mode::Hold => {
                            if ch.is_err() || mode_rx.borrow().effective() != Mode::Hold { break }
                        }
                    }
                }
            }
            let status = if gone_ms.is_some() {
                0
            } else {
                let x = self.rng.lock().unwrap().below(100);
                match x {
                    0 => 410,
                    1..=4 => 500,
                    _ => 200,
                }
            };
            if gone_ms.is_none() {
                let reason = match status {
                    200 => "OK",
                    410 => "Gone",
                    _ => "Internal Server Error",
                };
                let resp = format!("HTTP/1.1 {status} {reason}\r\ncontent-length: 0\r\n\r\n");
                if sock.write_all(resp.as_bytes()).await.is_err() {
                    let t = ctx.now_ms();
                    gone_ms = Some(t);
                    self.mark_gone(&id, slot, t);
                }
                self.wire(sender, false);
            }
            let gone = gone_ms.is_some();
            let end_ms = ctx.now_ms();
            ctx.record(serde_json::json!({
                "t": "post", "id": id, "acc": account, "i": instance, "g": gen, "s": start_ms,
                "e": end_ms, "st": status, "sig": sig_ok, "gone": gone, "gone_at": gone_ms,
            }));
            self.finish(ctx.as_ref(), &id, slot, end_ms, status);
            if gone || close {
                return;
            }
        }
    }

    fn mark_gone(&self, id: &str, slot: usize, t: u64) {
        if let Some(p) = self
            .posts
            .lock()
            .unwrap()
            .get_mut(id)
            .and_then(|v| v.get_mut(slot))
        {
            p.gone_ms = Some(t);
        }
    }

    /// The posts of one webhook-id as model.rs judges them (a POST still open ends `now`).
    fn view(ctx: &dyn Judge, v: &[PostRec], now: u64) -> Vec<Post> {
        v.iter()
            .map(|p| Post {
                instance: p.instance,
                gen: p.gen,
                start_ms: p.start_ms,
                end_ms: p.end_ms.unwrap_or(now.max(p.start_ms + 1)),
                sender_end: match (p.instance, p.gen) {
                    (Some(i), Some(g)) => ctx.end_of(i, g),
                    _ => None,
                },
            })
            .collect()
    }

    /// The graceful-stop rule for one POST whose sender went away (once known, once judged).
    fn judge_cut(ctx: &dyn Judge, id: &str, p: &mut PostRec) -> Option<String> {
        let gone = p.gone_ms?;
        if p.cut_judged {
            return None;
        }
        let (Some(i), Some(g)) = (p.instance, p.gen) else {
            p.cut_judged = true;
            return None;
        };
        let end = ctx.end_of(i, g);
        let cut = cut_by_graceful_stop(p.start_ms, gone, end.as_ref())?;
        p.cut_judged = true;
        ctx.check();
        if !cut {
            return None;
        }
        let end = end?;
        Some(format!(
            "webhook-id {id}: instance {i} (process {g}) closed its POST {} ms after it began, \
             while it was stopping gracefully (SIGTERM at {} ms, exit at {}): the stop cut a \
             POST on the wire instead of letting it end",
            gone - p.start_ms,
            end.signal_ms.unwrap_or(0),
            end.exit_ms
                .map(|e| format!("{e} ms"))
                .unwrap_or_else(|| "(not yet)".into()),
        ))
    }

    /// At the end of the run (every process ended): the POSTs the graceful-stop rule could not
    /// judge when they ended. Returns how many were judged.
    pub fn judge_cut_posts(&self, ctx: &dyn Judge) -> usize {
        let mut lines = Vec::new();
        let mut judged = 0;
        {
            let mut posts = self.posts.lock().unwrap();
            for (id, v) in posts.iter_mut() {
                for p in v.iter_mut() {
                    if p.gone_ms.is_some() && !p.cut_judged {
                        judged += 1;
                        lines.extend(Self::judge_cut(ctx, id, p));
                    }
                }
            }
        }
        for l in lines {
            ctx.violation("graceful-stop-cut-post", &l);
        }
        judged
    }

    /// Records a POST's end and judges it against the other POSTs of its webhook-id.
    fn finish(&self, ctx: &dyn Judge, id: &str, slot: usize, end_ms: u64, status: u16) {
        let mut posts = self.posts.lock().unwrap();
        let Some(v) = posts.get_mut(id) else { return };
        v[slot].end_ms = Some(end_ms);
        v[slot].status = status;
        let cut = if v[slot]
            .gone_ms
            .is_some_and(|g| g - v[slot].start_ms < CUT_BEFORE_MS)
        {
            Self::judge_cut(ctx, id, &mut v[slot])
        } else {
            if v[slot].gone_ms.is_some() {
                v[slot].cut_judged = true;
            }
            None
        };
        if v.len() < 2 {
            drop(posts);
            if let Some(l) = cut {
                ctx.violation("graceful-stop-cut-post", &l);
            }
            return;
        }
        ctx.check();
        let now = end_ms;
        let view = Self::view(ctx, v, now);
        let paused =
            |inst: Option<usize>, from: u64, to: u64| -> bool { ctx.paused_during(inst, from, to) };
        let sled = ctx.on_sled();
        let pairs = overlapping_posts(&view, &paused, sled);
        let mut lines = Vec::new();
        for (a, b) in pairs {
            if a != slot && b != slot {
                continue;
            }
            if v[a].reported && v[b].reported {
                continue;
            }
            v[a].reported = true;
            v[b].reported = true;
            let show = |p: &PostRec, e: &Post| {
                format!(
                    "instance {} (process {}) {}..{}{}",
                    p.instance
                        .map(|i| i.to_string())
                        .unwrap_or_else(|| "?".into()),
                    p.gen.map(|g| g.to_string()).unwrap_or_else(|| "?".into()),
                    p.start_ms,
                    match (p.end_ms, p.gone_ms) {
                        (Some(e), Some(g)) => format!(
                            "{e} ms, the sender gone at {g} ms (the receiver still handling it)"
                        ),
                        (Some(e), None) => format!("{e} ms answered {}", p.status),
                        (None, Some(g)) =>
                            format!("(still being handled) ms, the sender gone at {g} ms"),
                        (None, None) => "(still open) ms".into(),
                    },
                    match e.sender_end {
                        Some(x) => format!(
                            "; that process ended by {}{}",
                            x.how.name(),
                            x.at_ms().map(|t| format!(" at {t} ms")).unwrap_or_default()
                        ),
                        None => String::new(),
                    }
                )
            };
            let two = if v[a].instance.is_some() && v[a].instance == v[b].instance {
                "by two processes of one instance"
            } else {
                "by two instances"
            };
            lines.push(format!(
                "webhook-id {id} POSTed twice at once {two}: {} and {}",
                show(&v[a], &view[a]),
                show(&v[b], &view[b])
            ));
        }
        // The same process twice at once: counted and written down (a redelivery racing an
        // attempt), judged apart from the rules above.
        for (a, b) in same_process_overlaps(&view) {
            if a != slot && b != slot {
                continue;
            }
            let j = if a == slot { b } else { a };
            self.same_instance_overlaps.fetch_add(1, Ordering::Relaxed);
            ctx.note(&format!(
                "webhook-id {id}: two POSTs from instance {} (process {}) overlap ({}..{} and {}..{})",
                v[slot].instance.unwrap_or(0),
                v[slot].gen.unwrap_or(0),
                view[j].start_ms,
                view[j].end_ms,
                v[slot].start_ms,
                end_ms
            ));
        }
        drop(posts);
        for l in lines {
            ctx.violation("webhook-double-delivery", &l);
        }
        if let Some(l) = cut {
            ctx.violation("graceful-stop-cut-post", &l);
        }
    }
}

/// Standard Webhooks: HMAC-SHA256 keyed by the base64 bytes after `whsec_`, over
/// `{id}.{timestamp}.{body}`; any `v1,` signature of the space-separated list may match.
pub fn verify(secrets: &[String], id: &str, ts: &str, body: &[u8], signatures: &str) -> bool {
    let given: Vec<&str> = signatures
        .split(' ')
        .filter_map(|s| s.strip_prefix("v1,"))
        .collect();
    for secret in secrets {
        let Some(b64) = secret.strip_prefix("whsec_") else {
            continue;
        };
        let Ok(key) = base64::engine::general_purpose::STANDARD.decode(b64) else {
            continue;
        };
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&key) else {
            continue;
        };
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(ts.as_bytes());
        mac.update(b".");
        mac.update(body);
        let expected =
            base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
        if given.iter().any(|g| *g == expected) {
            return true;
        }
    }
    false
}

/// The process (instance index, process generation) that owns the other end of a connection
/// the receiver accepted: the TCP table of each instance's network namespace
/// (/proc/PID/net/tcp: the harness's own, or the instance's namespace's) names the socket's
/// inode, /proc/PID/fd says whether that process holds it.
fn owner_process(
    peer: SocketAddr,
    local: SocketAddr,
    pids: &[(usize, i32, u64)],
) -> Option<(usize, u64)> {
    let (SocketAddr::V4(peer), SocketAddr::V4(local)) = (peer, local) else {
        return None;
    };
    let hex = |a: &std::net::SocketAddrV4| {
        let o = a.ip().octets();
        format!(
            "{:02X}{:02X}{:02X}{:02X}:{:04X}",
            o[3],
            o[2],
            o[1],
            o[0],
            a.port()
        )
    };
    let (want_local, want_rem) = (hex(&peer), hex(&local));
    for (idx, pid, gen) in pids {
        if *pid <= 0 {
            continue;
        }
        let Ok(table) = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")) else {
            continue;
        };
        let Some(inode) = table.lines().skip(1).find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 9 && f[1] == want_local && f[2] == want_rem).then(|| f[9].to_string())
        }) else {
            continue;
        };
        let needle = format!("socket:[{inode}]");
        let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for e in rd.flatten() {
            if std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy() == needle) {
                return Some((*idx, *gen));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_webhooks_signatures_verify_with_either_secret() {
        let key =
            base64::engine::general_purpose::STANDARD.encode(b"0123456789abcdef0123456789abcdef");
        let secret = format!("whsec_{key}");
        let mut mac = Hmac::<Sha256>::new_from_slice(b"0123456789abcdef0123456789abcdef").unwrap();
        mac.update(b"evt_1.1700000000.{}");
        let sig = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
        let header = format!("v1,AAAA v1,{sig}");
        assert!(verify(
            std::slice::from_ref(&secret),
            "evt_1",
            "1700000000",
            b"{}",
            &header
        ));
        assert!(verify(
            &["whsec_Zm9v".into(), secret.clone()],
            "evt_1",
            "1700000000",
            b"{}",
            &header
        ));
        assert!(!verify(&[secret], "evt_2", "1700000000", b"{}", &header));
        assert!(!verify(&[], "evt_1", "1700000000", b"{}", &header));
    }
}
