//! What became of an intent: the value `place_order` and `resume` return, the journal keeps
//! and the binary prints (one JSON line in the shape of client/README.md).

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeKind {
    /// The order exists (first use, replay, or found by `externalOrderId` past the horizon).
    Placed,
    /// The key was already used for another basket: a bug in the caller, never retried.
    Conflict,
    /// 402 `Insufficient balance` / `Exceeds credit limit`: pending until a top-up and a resume.
    NeedsFunds,
    /// Another 4xx; `error` holds its token.
    Rejected,
    /// The attempt or time budget ran out without an answer that decides: still pending.
    Unknown,
    /// Older than the horizon and no order carries its id: for a person to look at.
    Expired,
    /// The same intent id with another basket: refused locally, nothing sent.
    IntentChanged,
}

/// One intent's result. Serialized, it is exactly the line the binary prints.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    pub intent: String,
    pub outcome: OutcomeKind,
    pub order_id: Option<String>,
    /// The 200 carried `Idempotency-Replayed: true`: an earlier attempt had placed it.
    pub replayed: bool,
    /// Requests sent for this intent so far, over every run.
    pub attempts: u32,
    /// The answer's token when it has one, else its whole `error` (401/403: its `message`).
    pub error: Option<String>,
    /// `X-RateLimit-Remaining` of the last answer that carried it; null when none did.
    pub rate_limit_remaining: Option<u64>,
}

impl Outcome {
    pub fn is_placed(&self) -> bool {
        self.outcome == OutcomeKind::Placed
    }

    /// The one JSON line of client/README.md.
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).expect("an outcome always serializes")
    }
}
