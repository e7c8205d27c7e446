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
