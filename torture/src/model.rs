//! What each answer implies, as pure rules: a 200 fixes a key's answer forever; a 503 (or a
//! refusal) means nothing was written, so nothing of that attempt may ever show; a 500, a
//! timeout or a dropped connection leaves the outcome open. The workload feeds every answer in;
//! the rules return what is a violation. Nothing here does I/O, so every rule is unit-tested.

use std::collections::HashMap;
use std::sync::Arc;

/// What one answer to a keyed write says about the store, once classified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A 2xx: `replayed` is the `Idempotency-Replayed: true` header; `digest` the body's SHA-256.
    Ok { replayed: bool, digest: [u8; 32] },
    /// A 503 on a write: contract §23, "dropped before it is sent (nothing of it is ever written
    /// afterwards)".
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
    pub at_ms: u64,
    /// Position in the order of acknowledgements (a backup holds every key below its snapshot).
    pub seq: u64,
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
        }
    }

    /// What the end of the run expects of this key.
    pub fn end_expectation(&self) -> EndExpectation {
        if self.acked.is_some() {
            EndExpectation::Replays
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

    /// The answer to an attempt with the key's own body. `object_id` is what a 200 names.
    /// `sent_ms` is when this attempt was sent: a refusal says the key was forgotten only when
    /// the attempt was sent after the acknowledgement arrived (one decided before the commit
    /// may answer later).
    pub fn on_answer(
        &mut self,
        key: &str,
        outcome: &Outcome,
        object_id: &str,
        amount: i64,
        sent_ms: u64,
        now_ms: u64,
    ) -> Vec<Finding> {
        let mut out = Vec::new();
        let next_seq = self.ack_seq;
        let Some(rec) = self.map.get_mut(key) else {
            return out;
        };
        rec.in_flight = rec.in_flight.saturating_sub(1);
        let mut acked_now = false;
        match outcome {
            Outcome::Ok { replayed: false, digest } => {
                rec.fresh_200s += 1;
                rec.may_have_written = true;
                match &rec.acked {
                    None => {
                        rec.acked = Some(Acked { digest: *digest, object_id: object_id.to_string(), amount, at_ms: now_ms, seq: next_seq });
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
                    rec.acked = Some(Acked { digest: *digest, object_id: object_id.to_string(), amount, at_ms: now_ms, seq: next_seq });
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
    /// true.
    pub fn on_other_body_answer(&self, key: &str, outcome: &Outcome) -> Vec<Finding> {
        let mut out = Vec::new();
        let Some(rec) = self.map.get(key) else {
            return out;
        };
        let Some(a) = &rec.acked else {
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Unkeyed {
    pub ok: u32,
    pub unknown: u32,
    pub nothing: u32,
}

impl Unkeyed {
    pub fn record(&mut self, o: &Outcome) {
        match o {
            Outcome::Ok { .. } => self.ok += 1,
            Outcome::Unknown => self.unknown += 1,
            Outcome::NothingWritten => self.nothing += 1,
            _ => {}
        }
    }

    /// At least one attempt was acknowledged: its effect must be visible.
    pub fn must_show(&self) -> bool {
        self.ok > 0
    }

    /// Only "nothing was changed" answers (and refusals): no trace may exist.
    pub fn must_not_show(&self) -> bool {
        self.ok == 0 && self.unknown == 0 && self.nothing > 0
    }

    /// How many times the effect may exist (creations: accounts under one name).
    pub fn allowed(&self, found: u32) -> bool {
        found >= self.ok.min(1) && found <= self.ok + self.unknown
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
/// on the wire (contract §17: one piece of work, one sender at a time):
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

/// contract §23 with §17: a graceful stop (SIGTERM) lets a POST on the wire end (answered, or
/// at its attempt's timeout). A POST whose sender closed the connection less than
/// `CUT_BEFORE_MS` after it started, between the SIGTERM and the process's exit, was cut by
/// the stop. `gone_ms` is when the receiver saw the sender go; `end` how the sender process
/// ended. Some(true): cut by a graceful stop; Some(false): not; None: not known yet (the
/// process has not ended).
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

/// The readiness rule (contract §23): `/readyz` must be 503 once no write has completed for 5 s
/// while writes were waiting. `oldest_pending_ms` is the send time of the oldest write still
/// waiting, `last_done_ms` the last write that completed (a 200), `slack_ms` the polling and
/// scheduling allowance. Returns how long writes have not completed when a 200 was wrong.
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

/// contract §23: every request is answered within the deadline of its arrival; the client allows
/// 0.5 s for the network and its own scheduling.
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
        keys.on_answer("k", &o, "ord_1", 1, 10, 10)
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
        assert_eq!(keys.map["k"].end_expectation(), EndExpectation::Replays);
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
                0
            )
            .is_empty());
        // It turns out to have written nothing: then nobody wrote what was replayed.
        let f = keys.on_answer("k", &Outcome::NothingWritten, "", 0, 0, 0);
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
                0
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
        keys.on_answer("k", &fresh(1), "ord_1", 1, 0, 50);
        // Sent at 0 with the other, refused for money before the commit, answered at 60.
        let f = keys.on_answer("k", &refused(402, "Exceeds credit limit"), "", 0, 0, 60);
        assert!(f.is_empty(), "{f:?}");
    }

    #[test]
    fn only_acknowledged_keys_must_replay_at_the_end() {
        let mut keys = Keys::default();
        answer(&mut keys, Outcome::NothingWritten);
        assert_eq!(
            keys.map["k"].end_expectation(),
            EndExpectation::NeverWritten
        );
        answer(&mut keys, Outcome::Unknown);
        assert_eq!(keys.map["k"].end_expectation(), EndExpectation::Either);
        let mut keys = Keys::default();
        answer(&mut keys, refused(402, "x"));
        assert_eq!(keys.map["k"].end_expectation(), EndExpectation::Either);
    }

    #[test]
    fn another_body_under_an_acknowledged_key_must_be_the_409() {
        let mut keys = Keys::default();
        answer(&mut keys, fresh(1));
        assert!(keys
            .on_other_body_answer("k", &Outcome::KeyConflict)
            .is_empty());
        assert!(keys
            .on_other_body_answer("k", &Outcome::NothingWritten)
            .is_empty());
        let f = keys.on_other_body_answer("k", &fresh(2));
        assert_eq!(f[0].check, "key-reuse-accepted");
    }

    #[test]
    fn ack_sequence_numbers_follow_acknowledgements() {
        let mut keys = Keys::default();
        keys.on_send("a", rec);
        keys.on_send("b", rec);
        keys.on_answer("b", &fresh(1), "ord_b", 1, 5, 5);
        keys.on_answer("a", &Outcome::NothingWritten, "", 0, 6, 6);
        keys.on_send("a", rec);
        keys.on_answer("a", &fresh(2), "ord_a", 1, 7, 7);
        assert_eq!(keys.map["b"].acked.as_ref().unwrap().seq, 0);
        assert_eq!(keys.map["a"].acked.as_ref().unwrap().seq, 1);
        assert_eq!(keys.ack_seq, 2);
    }

    #[test]
    fn unkeyed_writes_answered_503_must_leave_no_trace() {
        let mut u = Unkeyed::default();
        u.record(&Outcome::NothingWritten);
        assert!(u.must_not_show());
        assert!(u.allowed(0));
        assert!(!u.allowed(1));
        u.record(&Outcome::Unknown);
        assert!(!u.must_not_show());
        assert!(u.allowed(1));
        assert!(!u.allowed(2));
        u.record(&Outcome::Ok {
            replayed: false,
            digest: [0; 32],
        });
        assert!(u.must_show());
        assert!(!u.allowed(0));
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
}
