//! Events of an order's life, recorded in the same transaction as the change they describe
//! and delivered to the partner's callbackUrl at least once, always under the same id.

use serde::{Deserialize, Serialize};

use super::ids::AccountId;
use super::order::{Order, Refund};
use super::time::Millis;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    OrderCompleted,
    OrderCancelled,
    OrderRefunded,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::OrderCompleted => "order.completed",
            EventKind::OrderCancelled => "order.cancelled",
            EventKind::OrderRefunded => "order.refunded",
        }
    }
}

/// The event with a snapshot of what it is about, so every delivery renders the same body.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Event {
    pub id: String,
    pub kind: EventKind,
    pub account_id: AccountId,
    pub created_at: Millis,
    pub order: Order,
    pub refund: Option<Refund>,
}

/// One pending callback of an event: where, and which attempt comes next (1 = the first).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Delivery {
    pub event_id: String,
    pub account_id: AccountId,
    pub url: String,
    pub attempt: u32,
}

/// One attempt to deliver an event's callback, as the console shows it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeliveryAttempt {
    pub attempt: u32,
    pub at: Millis,
    /// The receiver's HTTP status, when it answered.
    pub status: Option<u16>,
    /// Why the attempt failed without an answer (never the URL's query string).
    pub error: Option<String>,
}

/// How an event's callback ended, once it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeliveryEnd {
    Delivered,
    GivenUp,
}

/// The history of an event's callback: every attempt, and what comes next.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct DeliveryLog {
    pub attempts: Vec<DeliveryAttempt>,
    pub next_attempt_at: Option<Millis>,
    pub ended: Option<DeliveryEnd>,
}
