//! What each answer implies, as pure rules: a 200 fixes a key's answer forever; a 503 (or a
//! refusal) means nothing was written, so nothing of that attempt may ever show; a 500, a timeout
//! or a dropped connection leaves the outcome open. The workload feeds every answer in; the rules
//! return what is a violation. Nothing here does I/O, so every rule is unit-tested.  A database
//! that goes back in time (docs/contract.md "When the database goes back in time": an asynchronous
//! standby promoted, a point-in-time restore) may lose what was acknowledged after the point it
//! went back to: the `Rewinds` say which answers that may be, and every rule below judges an answer
//! only against answers of the same history.

use std::collections::HashMap;
use std::sync::Arc;

/// What one answer to a keyed write says about the store, once classified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A 2xx: `replayed` is the `Idempotency-Replayed: true` header; `digest` the body's SHA-256.
    Ok { replayed: bool, digest: [u8; 32] },
    /// A 503 on a write: docs/contract.md "When the storage is slow", "dropped before it is sent
    /// (nothing of it is ever written afterwards)".
    NothingWritten,
    /// A 500, a timeout, a connection dropped after the request was sent: the outcome is open.
    Unknown,
    /// The request never reached the server (connection refused): nothing happened.
    NotSent,
    /// A business refusal (400, 402, 404, a state 409): nothing was written by this attempt.
    Refused { status: u16, token: String },
    /// 409 "Duplicate request in progress": another attempt holds the key.
    InProgress,
    /// 409 `idempotency_key_reused_with_different_body:`.
    KeyConflict,
}

/// A rule broken, named by its check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub check: &'static str,
    pub detail: String,
}

fn finding(check: &'static str, detail: String) -> Finding {
    Finding { check, detail }
}

/// The acknowledged answer of a key: the first 200 the model accepted for it.
#[derive(Clone, Debug)]
pub struct Acked {
    pub digest: [u8; 32],
    /// The id the answer names (`ord_…`, `ref_…`), for the end-of-run ledger checks.
    pub object_id: String,
    /// The money the answer names: an order's total, a refund's or a credit's amount.
    pub amount: i64,
    /// When the attempt that was acknowledged was sent, and when its answer came.
    pub sent_ms: u64,
    pub at_ms: u64,
    /// Position in the order of acknowledgements (a backup holds every key below its snapshot).
    pub seq: u64,
}

impl Acked {
    pub fn span(&self) -> Span {
        (self.sent_ms, self.at_ms)
    }
}

/// A request's span: when it was sent, when its answer came (ms of the run).
pub type Span = (u64, u64);

/// One time the database went back in time under the running instances (docs/contract.md "When the
/// database goes back in time"): `w0` is the point it went back to (every write acknowledged from
/// then on may be gone after it), `w1` the end of the fault (None while it runs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rewind {
    pub w0: u64,
    pub w1: Option<u64>,
}

/// Where an answer stands against one rewind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Era {
    /// Answered before `w0`: every history after it holds what it says.
    Before,
    /// Answered from `w0` on, and sent before `w1` (or while the rewind runs): it may belong to
    /// the history that was lost, or to the one that remains. In flight across the rewind, it
    /// is an unknown outcome.
    During,
    /// Sent after `w1`: the history that remains.
    After,
}

impl Rewind {
    pub fn era(&self, s: Span) -> Era {
        if s.1 < self.w0 {
            Era::Before
        } else if self.w1.is_some_and(|w1| s.0 > w1) {
            Era::After
        } else {
            Era::During
        }
    }
}

/// Past this long after a rewind's end, a revocation gets no grace (docs/contract.md "When the
/// database goes back in time": the first key change of a new history answers only once no instance
/// can serve a copy from before it).
pub const REWIND_GRACE_WINDOW_MS: u64 = 30_000;
/// How long after its answer a revocation made soon after a rewind may still find its key
/// accepted somewhere.
pub const REWIND_REVOCATION_GRACE_MS: u64 = 2_000;

/// Every rewind of the run, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rewinds {
    pub list: Vec<Rewind>,
}

impl Rewinds {
    /// The rewind point is set: what is acknowledged from now on may be lost.
    pub fn begin(&mut self, w0: u64) {
        self.list.push(Rewind { w0, w1: None });
    }

    /// The fault ended: what is sent from now on belongs to the history that remains.
    pub fn end(&mut self, w1: u64) {
        if let Some(r) = self.list.iter_mut().rev().find(|r| r.w1.is_none()) {
            r.w1 = Some(w1);
        }
    }

    /// An answer that a rewind may have undone (answered in its window, or in flight across
    /// its end).
    pub fn at_risk(&self, s: Span) -> bool {
        self.list.iter().any(|r| r.era(s) == Era::During)
    }

    /// At risk from a rewind that has ended: it may be gone now.
    pub fn at_risk_ended(&self, s: Span) -> bool {
        self.list
            .iter()
            .any(|r| r.w1.is_some() && r.era(s) == Era::During)
    }

    /// Two answers are of one history: for every rewind, one of them came before it (every
    /// history holds it), or both came after it.
    pub fn same_history(&self, a: Span, b: Span) -> bool {
        self.list.iter().all(|r| {
            let (x, y) = (r.era(a), r.era(b));
            x == Era::Before || y == Era::Before || (x == Era::After && y == Era::After)
        })
    }

    /// `new` came after every rewind that separates it from `old`: it is an answer of the
    /// history that remains, and `old` may be gone from it.
    pub fn supersedes(&self, old: Span, new: Span) -> bool {
        self.list.iter().all(|r| {
            let (x, y) = (r.era(old), r.era(new));
            x == Era::Before || y == Era::Before || y == Era::After
        })
    }

    /// Until when a key revoked by a revocation answered at `s` may still be accepted: a
    /// revocation sent after a rewind's end and answered less than `REWIND_GRACE_WINDOW_MS`
    /// after it gets `REWIND_REVOCATION_GRACE_MS` from its answer; any other none (refused at
    /// once).
    pub fn revocation_grace_until(&self, s: Span) -> Option<u64> {
        self.list
            .iter()
            .any(|r| {
                r.w1.is_some_and(|w1| s.0 > w1 && s.1 < w1 + REWIND_GRACE_WINDOW_MS)
            })
            .then_some(s.1 + REWIND_REVOCATION_GRACE_MS)
    }
}

/// Everything the model remembers about one idempotency key.
#[derive(Clone, Debug)]
pub struct KeyRecord {
    pub account: usize,
    pub op: &'static str,
    pub method: &'static str,
    pub path: String,
    pub body: Arc<[u8]>,
    pub acked: Option<Acked>,
    /// Attempts sent and not answered yet.
    pub in_flight: u32,
    /// Some attempt was answered in a way that may have written (or none answered yet).
    pub may_have_written: bool,
    /// 503s answered on this key (each says: this attempt wrote nothing).
    pub nothing_written: u32,
    /// 200s without the replay header: more than one is a second execution.
    pub fresh_200s: u32,
    /// A replay seen while other attempts were in flight, to be judged once they all answer.
    pub unexplained_replay: Option<String>,
    /// Acknowledgements a rewind may have undone, replaced by an answer of the history that
    /// remains (the first answer after the rewind).
    pub lost: Vec<Acked>,
    /// Answers of a rewind's window judged against no acknowledgement of another history.
    pub soft: u32,
}

impl KeyRecord {
    pub fn new(
        account: usize,
        op: &'static str,
        method: &'static str,
        path: String,
        body: Arc<[u8]>,
    ) -> Self {
        KeyRecord {
            account,
            op,
            method,
            path,
            body,
            acked: None,
            in_flight: 0,
            may_have_written: false,
            nothing_written: 0,
            fresh_200s: 0,
            unexplained_replay: None,
            lost: Vec::new(),
            soft: 0,
        }
    }

    /// The acknowledged answer, unless a rewind may have undone it.
    pub fn safe_ack(&self, rw: &Rewinds) -> Option<&Acked> {
        self.acked.as_ref().filter(|a| !rw.at_risk(a.span()))
    }

    /// Every acknowledgement of this key that a rewind may have undone: those replaced by an
    /// answer after it, and the current one if it is at risk.
    pub fn risky_acks(&self, rw: &Rewinds) -> Vec<&Acked> {
        self.lost
            .iter()
            .chain(self.acked.iter())
            .filter(|a| rw.at_risk(a.span()))
            .collect()
    }

    /// What the end of the run expects of this key.
    pub fn end_expectation(&self, rw: &Rewinds) -> EndExpectation {
        if self.safe_ack(rw).is_some() {
            EndExpectation::Replays
        } else if self.acked.is_some() {
            EndExpectation::Either
        } else if !self.may_have_written && self.nothing_written > 0 {
            EndExpectation::NeverWritten
        } else {
            EndExpectation::Either
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndExpectation {
    /// Acknowledged: the same request must replay the same bytes.
    Replays,
    /// Only answers that say nothing was written: it must never replay.
    NeverWritten,
    /// Some attempt's outcome is unknown: a replay or a first use are both true answers.
    Either,
}

/// All keys of the run. Keys are unique across accounts (each carries its client and number).
#[derive(Default)]
pub struct Keys {
    pub map: HashMap<String, KeyRecord>,
    pub ack_seq: u64,
}

impl Keys {
    /// Registers an attempt about to be sent with the key's one body (created on first use).
    pub fn on_send(&mut self, key: &str, make: impl FnOnce() -> KeyRecord) {
        let rec = self.map.entry(key.to_string()).or_insert_with(make);
        rec.in_flight += 1;
    }

    /// The answer to an attempt with the key's own body. `object_id` is what a 200 names. `sent_ms`
    /// is when this attempt was sent: a refusal says the key was forgotten only when the attempt
    /// was sent after the acknowledgement arrived (one decided before the commit may answer later).
    /// Rewinds (docs/contract.md "When the database goes back in time"): an acknowledgement made in
    /// a rewind's window may be gone after it. The first answer sent after the rewind ended is then
    /// judged as if the key had no acknowledgement (a fresh 200 with another body, a refusal: a
    /// first use again), and fixes the key's answer from then on; answers of the window itself (or
    /// in flight across its end) are unknown outcomes against an acknowledgement of another
    /// history. A key acknowledged before the rewind point is judged as always.
    #[allow(clippy::too_many_arguments)]
    pub fn on_answer(
        &mut self,
        key: &str,
        outcome: &Outcome,
        object_id: &str,
        amount: i64,
        sent_ms: u64,
        now_ms: u64,
        rw: &Rewinds,
    ) -> Vec<Finding> {
        let mut out = Vec::new();
        let next_seq = self.ack_seq;
        let Some(rec) = self.map.get_mut(key) else {
            return out;
        };
        rec.in_flight = rec.in_flight.saturating_sub(1);
        let span = (sent_ms, now_ms);
        if let Some(a) = &rec.acked {
            if !rw.same_history(a.span(), span) {
                if rw.supersedes(a.span(), span) {
                    // The first answer of the history that remains: the acknowledgement may be
                    // gone; this answer is judged from scratch.
                    let a = rec.acked.take().expect("matched above");
                    rec.lost.push(a);
                    rec.fresh_200s = 0;
                    rec.unexplained_replay = None;
                } else {
                    // An answer of the window against one of another history: it says
                    // nothing either way, but what it may have written.
                    rec.soft += 1;
                    match outcome {
                        Outcome::Ok { .. } | Outcome::Unknown => rec.may_have_written = true,
                        Outcome::NothingWritten => rec.nothing_written += 1,
                        _ => {}
                    }
                    return out;
                }
            }
        }
        let mut acked_now = false;
        match outcome {
            Outcome::Ok { replayed: false, digest } => {
                rec.fresh_200s += 1;
                rec.may_have_written = true;
                match &rec.acked {
                    None => {
                        rec.acked = Some(Acked { digest: *digest, object_id: object_id.to_string(), amount, sent_ms, at_ms: now_ms, seq: next_seq });
                        acked_now = true;
                    }
                    // The original answer can arrive after a replay of it (a burst): the same
                    // bytes, and the first fresh one, is that original.
                    Some(a) if a.digest == *digest && rec.fresh_200s == 1 => {}
                    Some(a) => out.push(finding(
                        "second-execution",
                        format!(
                            "key {key}: a 200 without Idempotency-Replayed after the key was acknowledged ({} then {})",
                            a.object_id, object_id
                        ),
                    )),
                }
            }
            Outcome::Ok { replayed: true, digest } => match &rec.acked {
                Some(a) => {
                    if a.digest != *digest {
                        out.push(finding(
                            "replay-bytes",
                            format!("key {key}: a replay answered other bytes than the acknowledged 200 ({} vs {})", object_id, a.object_id),
                        ));
                    }
                }
                None => {
                    if !rec.may_have_written {
                        let what = if rec.nothing_written > 0 {
                            format!("after only answers that said nothing was written ({} x 503)", rec.nothing_written)
                        } else {
                            "although no attempt of it could have written".to_string()
                        };
                        if rec.in_flight == 0 {
                            out.push(finding(
                                "nothing-changed-visible",
                                format!("key {key} ({} {}): replayed {what}", rec.method, rec.path),
                            ));
                        } else {
                            rec.unexplained_replay = Some(what);
                        }
                    }
                    rec.acked = Some(Acked { digest: *digest, object_id: object_id.to_string(), amount, sent_ms, at_ms: now_ms, seq: next_seq });
                    acked_now = true;
                }
            },
            Outcome::NothingWritten => rec.nothing_written += 1,
            Outcome::Unknown => rec.may_have_written = true,
            Outcome::NotSent | Outcome::InProgress => {}
            Outcome::Refused { status, token } => {
                if let Some(a) = rec.acked.as_ref().filter(|a| sent_ms > a.at_ms) {
                    out.push(finding(
                        "key-forgotten",
                        format!("key {key}: acknowledged ({}), then the same request got {status} {token}", a.object_id),
                    ));
                }
            }
            Outcome::KeyConflict => out.push(finding(
                "conflict-same-body",
                format!("key {key}: the very same request answered idempotency_key_reused_with_different_body"),
            )),
        }
        if rec.in_flight == 0 {
            if let Some(what) = rec.unexplained_replay.take() {
                if !rec.may_have_written {
                    out.push(finding(
                        "nothing-changed-visible",
                        format!("key {key} ({} {}): replayed {what}", rec.method, rec.path),
                    ));
                }
            }
        }
        if acked_now {
            self.ack_seq += 1;
        }
        out
    }

    /// The answer to the same key sent with another body, after the key was acknowledged:
    /// only the 409 `idempotency_key_reused_with_different_body:` (or a transient answer) is
    /// true. Not judged against an acknowledgement of another history (a rewind's).
    pub fn on_other_body_answer(
        &self,
        key: &str,
        outcome: &Outcome,
        span: Span,
        rw: &Rewinds,
    ) -> Vec<Finding> {
        let mut out = Vec::new();
        let Some(rec) = self.map.get(key) else {
            return out;
        };
        let Some(a) = rec
            .acked
            .as_ref()
            .filter(|a| rw.same_history(a.span(), span))
        else {
            return out;
        };
        match outcome {
            Outcome::Ok { replayed, .. } => out.push(finding(
                "key-reuse-accepted",
                format!("key {key}: acknowledged ({}), then another body under it got a 200 (replayed={replayed})", a.object_id),
            )),
            Outcome::Refused { status, token } => out.push(finding(
                "key-forgotten",
                format!("key {key}: acknowledged ({}), then another body under it got {status} {token} instead of the 409", a.object_id),
            )),
            _ => {}
        }
        out
    }
}

/// Counts of an unkeyed write's answers on one target (a revocation of a key, a creation under
/// one name, a rotation of one account's secret): what must, and what must not, be visible.
/// Each 200 keeps its span: one a rewind may have undone does not have to show.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unkeyed {
    pub ok: u32,
    pub unknown: u32,
    pub nothing: u32,
    /// The spans of the 200s.
    pub oks: Vec<Span>,
}

impl Unkeyed {
    pub fn record(&mut self, o: &Outcome, span: Span) {
        match o {
            Outcome::Ok { .. } => {
                self.ok += 1;
                self.oks.push(span);
            }
            Outcome::Unknown => self.unknown += 1,
            Outcome::NothingWritten => self.nothing += 1,
            _ => {}
        }
    }

    /// The 200s no rewind may have undone.
    pub fn safe_oks(&self, rw: &Rewinds) -> Vec<Span> {
        self.oks
            .iter()
            .copied()
            .filter(|s| !rw.at_risk(*s))
            .collect()
    }

    /// The 200s a rewind may have undone.
    pub fn risky_oks(&self, rw: &Rewinds) -> usize {
        self.oks.iter().filter(|s| rw.at_risk(**s)).count()
    }

    /// At least one attempt was acknowledged, and no rewind may have undone it: its effect
    /// must be visible.
    pub fn must_show(&self, rw: &Rewinds) -> bool {
        !self.safe_oks(rw).is_empty()
    }

    /// Only "nothing was changed" answers (and refusals): no trace may exist.
    pub fn must_not_show(&self) -> bool {
        self.ok == 0 && self.unknown == 0 && self.nothing > 0
    }

    /// How many times the effect may exist (creations: accounts under one name). A 200 that a
    /// rewind may have undone counts as an unknown outcome.
    pub fn allowed(&self, found: u32, rw: &Rewinds) -> bool {
        let safe = self.safe_oks(rw).len() as u32;
        found >= safe.min(1) && found <= self.ok + self.unknown
    }

    /// A 200 of this target in the same history as `span` (a second "first" answer there is
    /// a second execution).
    pub fn ok_in_history_of(&self, span: Span, rw: &Rewinds) -> bool {
        self.oks.iter().any(|s| rw.same_history(*s, span))
    }
}

/// How a sender process ended (cluster.rs records it for each process generation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// kill -9 by the harness (the kill fault, a stuck start).
    Kill9,
    /// kill -9 with LazyFS's cache dropped: a power loss.
    PowerLoss,
    /// The exit the full-disk fault expects (status 1 within 5 s of the first refused write:
    /// the contract gives it no time to let a POST end).
    FullDiskExit,
    /// An exit the harness did not cause (reported apart as `instance-died`).
    Died,
    /// SIGTERM by the harness: a graceful stop, which must let a POST on the wire end.
    Term,
}

impl Ending {
    /// The process went away at once, as in a crash: whatever it had on the wire was cut,
    /// and nothing it could have done would have let it end.
    pub fn crash_like(self) -> bool {
        !matches!(self, Ending::Term)
    }

    pub fn name(self) -> &'static str {
        match self {
            Ending::Kill9 => "kill -9",
            Ending::PowerLoss => "power loss",
            Ending::FullDiskExit => "its exit on a full disk",
            Ending::Died => "a death the harness did not cause",
            Ending::Term => "SIGTERM",
        }
    }
}

/// How one sender process (an instance index and its process generation) ended: how, when the
/// harness signalled it (none for an exit of its own), when it exited (none while stopping).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SenderEnd {
    pub how: Ending,
    pub signal_ms: Option<u64>,
    pub exit_ms: Option<u64>,
}

impl SenderEnd {
    /// When the process stopped being able to send: the signal, or the exit of its own.
    pub fn at_ms(&self) -> Option<u64> {
        self.signal_ms.or(self.exit_ms)
    }
}

/// One POST of a webhook as the receiver saw it: the sender process (its instance index and
/// process generation, when the connection could be attributed), and its span at the
/// receiver (from its arrival to the answer, or, when the sender went away during a stall,
/// to when the receiver would have answered, at most 10 s after the start).
#[derive(Clone, Debug)]
pub struct Post {
    pub instance: Option<usize>,
    /// The instance's process generation (its start count) that held the connection.
    pub gen: Option<u64>,
    pub start_ms: u64,
    pub end_ms: u64,
    /// How that process ended, if it has (or has been signalled).
    pub sender_end: Option<SenderEnd>,
}

impl Post {
    fn same_process(&self, other: &Post) -> bool {
        self.instance.is_some() && self.instance == other.instance && self.gen == other.gen
    }
}

/// Two POSTs of one webhook-id overlapping in time are a second delivery while the first is
/// on the wire (docs/contract.md "One piece of work is done by one instance at a time"):
/// - from two instances (or a sender that could not be attributed): a violation unless the
///   first sender was paused during its POST (a process paused past its lease may finish a
///   POST it had begun; `paused(instance, from, to)` says whether that instance was stopped
///   at some point in the interval);
/// - from one instance index but two processes (a restart between them): a violation, unless
///   the engine is sled and the earlier process ended as in a crash (kill -9, power loss, the
///   full disk's exit) during its POST: a sled process killed mid-POST sends again at once
///   after its restart, and nothing it could have done prevents that. A graceful stop
///   (SIGTERM) gets no such exemption (it must let the POST end), nor PostgreSQL (the
///   attempting claim outlives a kill);
/// - from one process: not judged here (a redelivery racing an attempt; the caller notes it).
///
/// Returns the pairs (earlier, later) that violate.
pub fn overlapping_posts(
    posts: &[Post],
    paused: &dyn Fn(Option<usize>, u64, u64) -> bool,
    sled: bool,
) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for i in 0..posts.len() {
        for j in i + 1..posts.len() {
            let (a, b) = if posts[i].start_ms <= posts[j].start_ms {
                (i, j)
            } else {
                (j, i)
            };
            let (pa, pb) = (&posts[a], &posts[b]);
            let overlap = pb.start_ms < pa.end_ms && pa.start_ms < pb.end_ms;
            if !overlap || pa.same_process(pb) {
                continue;
            }
            let same_index = pa.instance.is_some() && pa.instance == pb.instance;
            if same_index {
                let crashed_mid_post = pa.sender_end.is_some_and(|e| {
                    e.how.crash_like()
                        && e.at_ms()
                            .is_some_and(|t| pa.start_ms <= t && t <= pa.end_ms)
                });
                if sled && crashed_mid_post {
                    continue;
                }
            } else if paused(pa.instance, pa.start_ms, pa.end_ms)
                || paused(pb.instance, pb.start_ms, pb.end_ms)
            {
                continue;
            }
            out.push((a, b));
        }
    }
    out
}

/// The pairs of overlapping POSTs from one and the same process (noted, not judged).
pub fn same_process_overlaps(posts: &[Post]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for i in 0..posts.len() {
        for j in i + 1..posts.len() {
            let (pa, pb) = (&posts[i], &posts[j]);
            if pa.same_process(pb) && pb.start_ms < pa.end_ms && pa.start_ms < pb.end_ms {
                out.push((i, j));
            }
        }
    }
    out
}

/// A POST whose connection the sender closed before its attempt could have timed out: less
/// than this after its start (the server's attempt timeout is 10 s; the receiver sees the
/// request a little after it was sent).
pub const CUT_BEFORE_MS: u64 = 9_500;
/// How long after the process's exit, as the harness saw it, its connections' closes may
/// still be noticed by the receiver.
pub const EXIT_SLACK_MS: u64 = 1_000;

/// docs/contract.md "A stop is bounded" with "One piece of work is done by one instance at a time":
/// a graceful stop (SIGTERM) lets a POST on the wire end (answered, or at its attempt's timeout). A
/// POST whose sender closed the connection less than `CUT_BEFORE_MS` after it started, between the
/// SIGTERM and the process's exit, was cut by the stop. `gone_ms` is when the receiver saw the
/// sender go; `end` how the sender process ended. Some(true): cut by a graceful stop; Some(false):
/// not; None: not known yet (the process has not ended).
pub fn cut_by_graceful_stop(start_ms: u64, gone_ms: u64, end: Option<&SenderEnd>) -> Option<bool> {
    if gone_ms.saturating_sub(start_ms) >= CUT_BEFORE_MS {
        return Some(false);
    }
    let end = end?;
    if end.how != Ending::Term {
        return Some(false);
    }
    let Some(signal) = end.signal_ms else {
        return Some(false);
    };
    if gone_ms < signal {
        return Some(false);
    }
    Some(
        end.exit_ms
            .is_none_or(|exit| gone_ms <= exit + EXIT_SLACK_MS),
    )
}

/// The fault kinds a run enabled and never injected (names), for `fault-coverage`.
pub fn missing_kinds<'a>(enabled: &[&'a str], injected: &dyn Fn(&str) -> bool) -> Vec<&'a str> {
    enabled.iter().copied().filter(|k| !injected(k)).collect()
}

/// The readiness rule (docs/contract.md "Readiness tells the truth"): `/readyz` must be 503 once no
/// write has completed for 5 s while writes were waiting. `oldest_pending_ms` is the send time of
/// the oldest write still waiting, `last_done_ms` the last write that completed (a 200), `slack_ms`
/// the polling and scheduling allowance. Returns how long writes have not completed when a 200 was
/// wrong.
pub fn stale_ready(
    now_ms: u64,
    oldest_pending_ms: Option<u64>,
    last_done_ms: u64,
    slack_ms: u64,
) -> Option<u64> {
    let oldest = oldest_pending_ms?;
    let since = oldest.max(last_done_ms);
    let stuck = now_ms.saturating_sub(since);
    (stuck > 5_000 + slack_ms).then_some(stuck)
}

/// docs/contract.md "Every request ends by its deadline": every request is answered within the
/// deadline of its arrival; the client allows 0.5 s for the network and its own scheduling.
pub fn over_deadline(elapsed_ms: u64, deadline_ms: u64) -> bool {
    elapsed_ms > deadline_ms + 500
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(x: u8) -> [u8; 32] {
        [x; 32]
    }

    /// A first 200 whose bytes hash to `d(x)`.
    fn fresh(x: u8) -> Outcome {
        Outcome::Ok {
            replayed: false,
            digest: d(x),
        }
    }

    fn refused(status: u16, token: &str) -> Outcome {
        Outcome::Refused {
            status,
            token: token.into(),
        }
    }

    fn rec() -> KeyRecord {
        KeyRecord::new(
            0,
            "order",
            "POST",
            "/b2b/orders".into(),
            Arc::from(&b"{}"[..]),
        )
    }

    fn answer(keys: &mut Keys, o: Outcome) -> Vec<Finding> {
        keys.on_send("k", rec);
        keys.on_answer("k", &o, "ord_1", 1, 10, 10, &Rewinds::default())
    }

    #[test]
    fn a_replay_after_only_503s_is_a_violation() {
        let mut keys = Keys::default();
        assert!(answer(&mut keys, Outcome::NothingWritten).is_empty());
        assert!(answer(&mut keys, Outcome::NothingWritten).is_empty());
        let f = answer(
            &mut keys,
            Outcome::Ok {
                replayed: true,
                digest: d(1),
            },
        );
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].check, "nothing-changed-visible");
    }

    #[test]
    fn a_replay_after_a_500_is_not() {
        let mut keys = Keys::default();
        answer(&mut keys, Outcome::NothingWritten);
        answer(&mut keys, Outcome::Unknown);
        assert!(answer(
            &mut keys,
            Outcome::Ok {
                replayed: true,
                digest: d(1)
            }
        )
        .is_empty());
        assert_eq!(
            keys.map["k"].end_expectation(&Rewinds::default()),
            EndExpectation::Replays
        );
    }

    #[test]
    fn a_replay_seen_while_another_attempt_is_in_flight_is_judged_when_it_answers() {
        let mut keys = Keys::default();
        keys.on_send("k", rec);
        keys.on_send("k", rec);
        // The replay arrives first: the other attempt may be the writer.
        assert!(keys
            .on_answer(
                "k",
                &Outcome::Ok {
                    replayed: true,
                    digest: d(1)
                },
                "ord_1",
                1,
                0,
                0,
                &Rewinds::default()
            )
            .is_empty());
        // It turns out to have written nothing: then nobody wrote what was replayed.
        let f = keys.on_answer(
            "k",
            &Outcome::NothingWritten,
            "",
            0,
            0,
            0,
            &Rewinds::default(),
        );
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].check, "nothing-changed-visible");

        let mut keys = Keys::default();
        keys.on_send("k", rec);
        keys.on_send("k", rec);
        keys.on_answer(
            "k",
            &Outcome::Ok {
                replayed: true,
                digest: d(1),
            },
            "ord_1",
            1,
            0,
            0,
            &Rewinds::default(),
        );
        // The original 200 arrives late, with the same bytes: all is well.
        assert!(keys
            .on_answer(
                "k",
                &Outcome::Ok {
                    replayed: false,
                    digest: d(1)
                },
                "ord_1",
                1,
                0,
                0,
                &Rewinds::default()
            )
            .is_empty());
    }

    #[test]
    fn a_second_fresh_200_is_a_second_execution() {
        let mut keys = Keys::default();
        answer(&mut keys, fresh(1));
        let f = answer(&mut keys, fresh(2));
        assert_eq!(f[0].check, "second-execution");
        let f = answer(&mut keys, fresh(1));
        assert_eq!(
            f[0].check, "second-execution",
            "even the same bytes twice fresh"
        );
    }

    #[test]
    fn replays_must_be_byte_for_byte() {
        let mut keys = Keys::default();
        answer(&mut keys, fresh(1));
        assert!(answer(
            &mut keys,
            Outcome::Ok {
                replayed: true,
                digest: d(1)
            }
        )
        .is_empty());
        assert_eq!(
            answer(
                &mut keys,
                Outcome::Ok {
                    replayed: true,
                    digest: d(3)
                }
            )[0]
            .check,
            "replay-bytes"
        );
        // Transient answers to a replay are not violations.
        assert!(answer(&mut keys, Outcome::NothingWritten).is_empty());
        assert!(answer(&mut keys, Outcome::Unknown).is_empty());
        assert!(answer(&mut keys, Outcome::InProgress).is_empty());
        // A refusal sent after the acknowledgement means the key was forgotten.
        keys.map.get_mut("k").unwrap().acked.as_mut().unwrap().at_ms = 5;
        let f = answer(&mut keys, refused(402, "Insufficient balance"));
        assert_eq!(f[0].check, "key-forgotten");
    }

    #[test]
    fn a_refusal_decided_before_the_acknowledgement_arrived_is_not() {
        let mut keys = Keys::default();
        keys.on_send("k", rec);
        keys.on_send("k", rec);
        keys.on_answer("k", &fresh(1), "ord_1", 1, 0, 50, &Rewinds::default());
        // Sent at 0 with the other, refused for money before the commit, answered at 60.
        let f = keys.on_answer(
            "k",
            &refused(402, "Exceeds credit limit"),
            "",
            0,
            0,
            60,
            &Rewinds::default(),
        );
        assert!(f.is_empty(), "{f:?}");
    }

    #[test]
    fn only_acknowledged_keys_must_replay_at_the_end() {
        let mut keys = Keys::default();
        answer(&mut keys, Outcome::NothingWritten);
        assert_eq!(
            keys.map["k"].end_expectation(&Rewinds::default()),
            EndExpectation::NeverWritten
        );
        answer(&mut keys, Outcome::Unknown);
        assert_eq!(
            keys.map["k"].end_expectation(&Rewinds::default()),
            EndExpectation::Either
        );
        let mut keys = Keys::default();
        answer(&mut keys, refused(402, "x"));
        assert_eq!(
            keys.map["k"].end_expectation(&Rewinds::default()),
            EndExpectation::Either
        );
    }

    #[test]
    fn another_body_under_an_acknowledged_key_must_be_the_409() {
        let mut keys = Keys::default();
        answer(&mut keys, fresh(1));
        assert!(keys
            .on_other_body_answer("k", &Outcome::KeyConflict, (0, 0), &Rewinds::default())
            .is_empty());
        assert!(keys
            .on_other_body_answer("k", &Outcome::NothingWritten, (0, 0), &Rewinds::default())
            .is_empty());
        let f = keys.on_other_body_answer("k", &fresh(2), (0, 0), &Rewinds::default());
        assert_eq!(f[0].check, "key-reuse-accepted");
    }

    #[test]
    fn ack_sequence_numbers_follow_acknowledgements() {
        let mut keys = Keys::default();
        keys.on_send("a", rec);
        keys.on_send("b", rec);
        keys.on_answer("b", &fresh(1), "ord_b", 1, 5, 5, &Rewinds::default());
        keys.on_answer(
            "a",
            &Outcome::NothingWritten,
            "",
            0,
            6,
            6,
            &Rewinds::default(),
        );
        keys.on_send("a", rec);
        keys.on_answer("a", &fresh(2), "ord_a", 1, 7, 7, &Rewinds::default());
        assert_eq!(keys.map["b"].acked.as_ref().unwrap().seq, 0);
        assert_eq!(keys.map["a"].acked.as_ref().unwrap().seq, 1);
        assert_eq!(keys.ack_seq, 2);
    }

    #[test]
    fn unkeyed_writes_answered_503_must_leave_no_trace() {
        let mut u = Unkeyed::default();
        u.record(&Outcome::NothingWritten, (0, 0));
        assert!(u.must_not_show());
        assert!(u.allowed(0, &Rewinds::default()));
        assert!(!u.allowed(1, &Rewinds::default()));
        u.record(&Outcome::Unknown, (0, 0));
        assert!(!u.must_not_show());
        assert!(u.allowed(1, &Rewinds::default()));
        assert!(!u.allowed(2, &Rewinds::default()));
        u.record(
            &Outcome::Ok {
                replayed: false,
                digest: [0; 32],
            },
            (0, 0),
        );
        assert!(u.must_show(&Rewinds::default()));
        assert!(!u.allowed(0, &Rewinds::default()));
    }

    fn post(instance: usize, gen: u64, start_ms: u64, end_ms: u64) -> Post {
        Post {
            instance: Some(instance),
            gen: Some(gen),
            start_ms,
            end_ms,
            sender_end: None,
        }
    }

    fn ended(how: Ending, signal_ms: Option<u64>, exit_ms: Option<u64>) -> Option<SenderEnd> {
        Some(SenderEnd {
            how,
            signal_ms,
            exit_ms,
        })
    }

    #[test]
    fn overlapping_posts_from_two_instances_are_a_double_delivery() {
        let never = |_: Option<usize>, _: u64, _: u64| false;
        let posts = vec![
            post(0, 1, 0, 8000),
            post(1, 1, 3000, 11000),
            post(1, 1, 12000, 12100),
        ];
        for sled in [false, true] {
            assert_eq!(overlapping_posts(&posts, &never, sled), vec![(0, 1)]);
        }
        // The first sender was paused during its POST: allowed.
        let paused0 = |i: Option<usize>, _: u64, _: u64| i == Some(0);
        assert!(overlapping_posts(&posts, &paused0, false).is_empty());
        // One after the other is a retry, not an overlap.
        let seq = vec![post(0, 1, 0, 100), post(1, 1, 100, 200)];
        assert!(overlapping_posts(&seq, &never, false).is_empty());
        // A sender that could not be attributed is judged as another sender.
        let mut anon = posts.clone();
        anon[1].instance = None;
        anon[1].gen = None;
        assert_eq!(overlapping_posts(&anon, &never, false), vec![(0, 1)]);
    }

    #[test]
    fn overlapping_posts_of_two_processes_of_one_instance() {
        let never = |_: Option<usize>, _: u64, _: u64| false;
        // Process 1 stopped gracefully mid-POST (the receiver still handles it until 6000),
        // process 2 (its restart) sends the same webhook-id at 2000.
        let mut posts = vec![post(0, 1, 0, 6000), post(0, 2, 2000, 2100)];
        posts[0].sender_end = ended(Ending::Term, Some(500), Some(700));
        for sled in [false, true] {
            assert_eq!(overlapping_posts(&posts, &never, sled), vec![(0, 1)]);
        }
        // Killed with -9 (or power loss, or its exit on a full disk) during its POST: sled
        // sends again at once after its restart, allowed there; not on PostgreSQL.
        for how in [Ending::Kill9, Ending::PowerLoss, Ending::FullDiskExit] {
            posts[0].sender_end = ended(how, Some(500), Some(510));
            assert!(
                overlapping_posts(&posts, &never, true).is_empty(),
                "{how:?}"
            );
            assert_eq!(overlapping_posts(&posts, &never, false), vec![(0, 1)]);
        }
        // Killed, but not during this POST (after its span ended): no exemption.
        posts[0].sender_end = ended(Ending::Kill9, Some(7000), Some(7010));
        assert_eq!(overlapping_posts(&posts, &never, true), vec![(0, 1)]);
        // Not ended at all (how could a second process send?): judged.
        posts[0].sender_end = None;
        assert_eq!(overlapping_posts(&posts, &never, true), vec![(0, 1)]);
        // A pause does not excuse two processes of one instance.
        let paused = |_: Option<usize>, _: u64, _: u64| true;
        assert_eq!(overlapping_posts(&posts, &paused, false), vec![(0, 1)]);
        // One process twice: noted apart, never judged here.
        let same = vec![post(0, 1, 0, 6000), post(0, 1, 2000, 2100)];
        assert!(overlapping_posts(&same, &never, false).is_empty());
        assert_eq!(same_process_overlaps(&same), vec![(0, 1)]);
        assert!(same_process_overlaps(&posts).is_empty());
    }

    #[test]
    fn a_post_cut_by_a_graceful_stop() {
        let term = SenderEnd {
            how: Ending::Term,
            signal_ms: Some(1000),
            exit_ms: Some(1200),
        };
        // Closed at the stop, 1.1 s into the POST.
        assert_eq!(cut_by_graceful_stop(100, 1100, Some(&term)), Some(true));
        // Noticed a little after the exit.
        assert_eq!(cut_by_graceful_stop(100, 2100, Some(&term)), Some(true));
        assert_eq!(cut_by_graceful_stop(100, 2300, Some(&term)), Some(false));
        // Closed before the SIGTERM: not the stop's doing.
        assert_eq!(cut_by_graceful_stop(100, 900, Some(&term)), Some(false));
        // At the attempt's own timeout: the sender let it end.
        let late = SenderEnd {
            exit_ms: Some(20_000),
            ..term
        };
        assert_eq!(cut_by_graceful_stop(100, 9_700, Some(&late)), Some(false));
        assert_eq!(cut_by_graceful_stop(100, 9_500, Some(&late)), Some(true));
        // Still stopping: between the SIGTERM and an exit to come.
        let stopping = SenderEnd {
            exit_ms: None,
            ..term
        };
        assert_eq!(cut_by_graceful_stop(100, 1100, Some(&stopping)), Some(true));
        // A crash is not a graceful stop; a process not ended is not known yet.
        let killed = SenderEnd {
            how: Ending::Kill9,
            ..term
        };
        assert_eq!(cut_by_graceful_stop(100, 1100, Some(&killed)), Some(false));
        assert_eq!(cut_by_graceful_stop(100, 1100, None), None);
    }

    #[test]
    fn every_enabled_kind_must_be_injected() {
        let injected = |k: &str| k == "kill" || k == "pause";
        assert_eq!(
            missing_kinds(&["kill", "pause", "graceful-restart"], &injected),
            vec!["graceful-restart"]
        );
        assert!(missing_kinds(&["kill"], &injected).is_empty());
        assert!(missing_kinds(&[], &injected).is_empty());
    }

    #[test]
    fn readiness_must_turn_within_five_seconds_of_no_progress() {
        assert_eq!(
            stale_ready(10_000, None, 0, 500),
            None,
            "no write waiting: nothing to say"
        );
        assert_eq!(stale_ready(10_000, Some(9_000), 0, 500), None);
        assert_eq!(stale_ready(10_000, Some(4_000), 0, 500), Some(6_000));
        assert_eq!(
            stale_ready(10_000, Some(1_000), 8_000, 500),
            None,
            "a write completed 2 s ago"
        );
    }

    #[test]
    fn the_deadline_allows_half_a_second() {
        assert!(!over_deadline(10_500, 10_000));
        assert!(over_deadline(10_501, 10_000));
    }

    fn rewound(w0: u64, w1: Option<u64>) -> Rewinds {
        let mut rw = Rewinds::default();
        rw.begin(w0);
        if let Some(w1) = w1 {
            rw.end(w1);
        }
        rw
    }

    fn at(keys: &mut Keys, o: Outcome, sent: u64, end: u64, rw: &Rewinds) -> Vec<Finding> {
        keys.on_send("k", rec);
        keys.on_answer("k", &o, "ord", 1, sent, end, rw)
    }

    fn checks(f: &[Finding]) -> Vec<&'static str> {
        f.iter().map(|x| x.check).collect()
    }

    #[test]
    fn an_answer_is_before_during_or_after_a_rewind() {
        let r = Rewind {
            w0: 100,
            w1: Some(200),
        };
        assert_eq!(r.era((0, 99)), Era::Before);
        assert_eq!(r.era((50, 100)), Era::During);
        assert_eq!(r.era((150, 180)), Era::During);
        // In flight across its end: an unknown outcome.
        assert_eq!(r.era((190, 900)), Era::During);
        assert_eq!(r.era((201, 250)), Era::After);
        let running = Rewind { w0: 100, w1: None };
        assert_eq!(running.era((5_000, 6_000)), Era::During);
        let rw = rewound(100, Some(200));
        assert!(rw.at_risk((150, 180)) && rw.at_risk_ended((150, 180)));
        assert!(!rw.at_risk((0, 99)) && !rw.at_risk((201, 250)));
        assert!(rewound(100, None).at_risk((150, 180)));
        assert!(!rewound(100, None).at_risk_ended((150, 180)));
        // One history: one of them before, or both after.
        assert!(rw.same_history((0, 50), (150, 180)));
        assert!(rw.same_history((201, 220), (300, 310)));
        assert!(!rw.same_history((150, 180), (300, 310)));
        assert!(!rw.same_history((150, 180), (160, 170)));
        assert!(rw.supersedes((150, 180), (300, 310)));
        assert!(!rw.supersedes((150, 180), (190, 900)));
        assert!(!rw.supersedes((300, 310), (190, 900)));
    }

    #[test]
    fn a_key_acknowledged_in_a_rewind_window_may_be_a_first_use_once_after_it() {
        let mut keys = Keys::default();
        let mut rw = rewound(100, None);
        assert!(at(&mut keys, fresh(1), 110, 120, &rw).is_empty());
        assert_eq!(keys.map["k"].end_expectation(&rw), EndExpectation::Either);
        assert!(keys.map["k"].safe_ack(&rw).is_none());
        rw.end(200);
        // The first answer after the rewind: a first use again, with another body.
        assert!(at(&mut keys, fresh(2), 250, 260, &rw).is_empty());
        let r = &keys.map["k"];
        assert_eq!(r.acked.as_ref().unwrap().digest, d(2));
        assert_eq!(r.lost.len(), 1);
        assert_eq!(r.risky_acks(&rw).len(), 1);
        assert_eq!(r.end_expectation(&rw), EndExpectation::Replays);
        // From then on the usual rules.
        assert_eq!(
            checks(&at(&mut keys, fresh(3), 300, 310, &rw)),
            ["second-execution"]
        );
        let replay1 = Outcome::Ok {
            replayed: true,
            digest: d(1),
        };
        assert_eq!(
            checks(&at(&mut keys, replay1, 320, 330, &rw)),
            ["replay-bytes"]
        );
        // Or the first answer after it is a refusal (the order's key is free again): no
        // violation, and the next 200 fixes the key.
        let mut keys = Keys::default();
        let rw = rewound(100, Some(200));
        at(&mut keys, fresh(1), 110, 120, &rw);
        assert!(at(&mut keys, refused(402, "x"), 250, 260, &rw).is_empty());
        assert!(at(&mut keys, fresh(4), 270, 280, &rw).is_empty());
        assert_eq!(
            checks(&at(&mut keys, fresh(5), 290, 295, &rw)),
            ["second-execution"]
        );
    }

    #[test]
    fn a_key_acknowledged_before_the_rewind_point_replays_as_before() {
        let mut keys = Keys::default();
        let rw = rewound(100, Some(200));
        at(&mut keys, fresh(1), 10, 20, &rw);
        assert_eq!(keys.map["k"].end_expectation(&rw), EndExpectation::Replays);
        // During the window and after it alike.
        for (s, e) in [(150, 160), (190, 900), (250, 260)] {
            assert_eq!(
                checks(&at(&mut keys, fresh(2), s, e, &rw)),
                ["second-execution"]
            );
            assert_eq!(
                checks(&at(&mut keys, refused(404, "x"), s, e, &rw)),
                ["key-forgotten"]
            );
        }
        assert!(keys
            .on_other_body_answer("k", &fresh(9), (250, 260), &rw)
            .iter()
            .any(|f| f.check == "key-reuse-accepted"));
    }

    #[test]
    fn answers_of_the_window_are_unknown_outcomes_against_another_history() {
        let mut keys = Keys::default();
        let mut rw = rewound(100, None);
        at(&mut keys, fresh(1), 110, 120, &rw);
        // Another first use in the window (the new primary took it): not judged.
        assert!(at(&mut keys, fresh(2), 130, 140, &rw).is_empty());
        rw.end(200);
        // In flight across the end: not judged either.
        assert!(at(&mut keys, fresh(3), 190, 260, &rw).is_empty());
        assert!(at(&mut keys, refused(409, "x"), 195, 265, &rw).is_empty());
        assert_eq!(keys.map["k"].soft, 3);
        // The first answer after it fixes the key.
        assert!(at(&mut keys, fresh(4), 300, 310, &rw).is_empty());
        // A late answer of the window against it: not judged; a later one is.
        assert!(at(&mut keys, fresh(5), 199, 400, &rw).is_empty());
        assert!(keys
            .on_other_body_answer("k", &fresh(9), (199, 400), &rw)
            .is_empty());
        assert_eq!(
            checks(&at(&mut keys, fresh(6), 500, 510, &rw)),
            ["second-execution"]
        );
        // Another body under a key acknowledged in the window, after it: not judged.
        let mut keys = Keys::default();
        at(&mut keys, fresh(1), 110, 120, &rw);
        assert!(keys
            .on_other_body_answer("k", &fresh(9), (300, 310), &rw)
            .is_empty());
    }

    #[test]
    fn unkeyed_writes_of_a_rewind_window_need_not_show() {
        let rw = rewound(100, Some(200));
        let ok = Outcome::Ok {
            replayed: false,
            digest: [0; 32],
        };
        let mut u = Unkeyed::default();
        u.record(&ok, (110, 120));
        assert!(
            !u.must_show(&rw),
            "a revocation of the window may be undone"
        );
        assert!(!u.must_not_show());
        assert!(u.allowed(0, &rw) && u.allowed(1, &rw) && !u.allowed(2, &rw));
        assert_eq!(u.risky_oks(&rw), 1);
        assert!(!u.ok_in_history_of((300, 310), &rw));
        u.record(&ok, (300, 310));
        assert!(u.must_show(&rw));
        assert!(!u.allowed(0, &rw));
        assert!(u.ok_in_history_of((400, 410), &rw));
        let mut before = Unkeyed::default();
        before.record(&ok, (10, 20));
        assert!(before.must_show(&rw));
        assert!(before.ok_in_history_of((300, 310), &rw));
    }

    #[test]
    fn a_revocation_soon_after_a_rewind_gets_two_seconds() {
        let rw = rewound(100, Some(200));
        assert_eq!(rw.revocation_grace_until((250, 260)), Some(2_260));
        assert_eq!(rw.revocation_grace_until((10, 20)), None, "before it");
        assert_eq!(rw.revocation_grace_until((150, 160)), None, "in its window");
        assert_eq!(
            rw.revocation_grace_until((30_000, 30_300)),
            None,
            "30 s after its end"
        );
        assert_eq!(Rewinds::default().revocation_grace_until((5, 6)), None);
    }
}
