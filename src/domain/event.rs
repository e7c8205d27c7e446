//! Events of an order's life, recorded in the same transaction as the change they describe
//! and delivered to the partner's callbackUrl at least once, always under the same id.

use serde::{Deserialize, Serialize};

use super::ids::AccountId;
use super::order::{Order, Refund};
use super::time::Millis;

/// What happened to the order, as the event's `type` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    /// The fulfillment worker completed the order.
    OrderCompleted,
    /// The order was cancelled and its amount returned.
    OrderCancelled,
    /// Part or all of the order was refunded.
    OrderRefunded,
}

impl EventKind {
    pub(crate) fn as_str(self) -> &'static str {
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
    /// The event's id (`evt_…`): every delivery of it carries the same one.
    pub id: String,
    /// What happened.
    pub kind: EventKind,
    pub(crate) account_id: AccountId,
    /// When it happened, in the transaction of the change.
    pub created_at: Millis,
    /// The order as the change left it.
    pub order: Order,
    pub(crate) refund: Option<Refund>,
}

/// One pending callback of an event: where, and which attempt comes next (1 = the first).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Delivery {
    pub(crate) event_id: String,
    pub(crate) account_id: AccountId,
    pub(crate) url: String,
    /// The number of the next attempt.
    pub attempt: u32,
}

/// One attempt to deliver an event's callback, as the console shows it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeliveryAttempt {
    /// Which attempt this was (1 = the first).
    pub attempt: u32,
    /// When it was made.
    pub at: Millis,
    /// The receiver's HTTP status, when it answered.
    pub status: Option<u16>,
    /// Why the attempt failed without an answer (never the URL's query string).
    pub error: Option<String>,
}

/// How an event's callback ended, once it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeliveryEnd {
    /// The receiver answered with a 2xx.
    Delivered,
    /// Every attempt of the retry schedule failed, or the URL is no longer acceptable.
    GivenUp,
}

/// The history of an event's callback: every attempt, and what comes next.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct DeliveryLog {
    /// Every attempt so far, oldest first.
    pub attempts: Vec<DeliveryAttempt>,
    /// When the next attempt is due; `None` once the callback ended.
    pub next_attempt_at: Option<Millis>,
    /// How the callback ended, once it has.
    pub ended: Option<DeliveryEnd>,
}

/// Where an event's callback stands, as the admin lists show and filter it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DeliveryState {
    /// The order has no callbackUrl: nothing to deliver.
    None,
    /// No attempt yet; the first is due when the event is made.
    Pending,
    Delivered,
    /// Attempted, not delivered, another attempt due.
    Retrying,
    /// Not delivered, and no attempt will follow.
    GivenUp,
}

impl DeliveryState {
    pub(crate) const ALL: [DeliveryState; 5] = [
        DeliveryState::None,
        DeliveryState::Pending,
        DeliveryState::Delivered,
        DeliveryState::Retrying,
        DeliveryState::GivenUp,
    ];

    /// The state of `event`'s callback, given its log (`None`: no attempt yet).
    pub(crate) fn of(event: &Event, log: Option<&DeliveryLog>) -> Self {
        if event.order.callback_url.is_none() {
            return DeliveryState::None;
        }
        match log.map(|l| l.ended) {
            None => DeliveryState::Pending,
            Some(Some(DeliveryEnd::Delivered)) => DeliveryState::Delivered,
            Some(Some(DeliveryEnd::GivenUp)) => DeliveryState::GivenUp,
            Some(None) => DeliveryState::Retrying,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            DeliveryState::None => "none",
            DeliveryState::Pending => "pending",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Retrying => "retrying",
            DeliveryState::GivenUp => "given_up",
        }
    }

    pub(crate) fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

/// What became of one attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeliveryOutcome {
    /// Delivered, or given up: the callback leaves the outbox.
    Finished,
    /// The next attempt is due then, under the same event id.
    RetryAt(Millis),
}

impl DeliveryLog {
    /// The log after `attempt`. `settles` is false when the attempt no longer decides the
    /// callback (its claim lapsed and another instance took the delivery over): the attempt
    /// is logged, and what comes next is the new holder's to say.
    pub(crate) fn after(
        mut self,
        attempt: DeliveryAttempt,
        outcome: DeliveryOutcome,
        settles: bool,
    ) -> Self {
        let delivered = attempt.status.is_some_and(|s| (200..300).contains(&s));
        self.attempts.push(attempt);
        if !settles {
            return self;
        }
        match outcome {
            DeliveryOutcome::Finished => {
                self.next_attempt_at = None;
                self.ended = Some(if delivered {
                    DeliveryEnd::Delivered
                } else {
                    DeliveryEnd::GivenUp
                });
            }
            DeliveryOutcome::RetryAt(at) => self.next_attempt_at = Some(at),
        }
        self
    }
}

impl Delivery {
    /// The callback's next attempt, when the outcome asks for one: due then, same event id.
    pub(crate) fn next(&self, outcome: DeliveryOutcome) -> Option<(Millis, Delivery)> {
        match outcome {
            DeliveryOutcome::Finished => None,
            DeliveryOutcome::RetryAt(at) => {
                let mut next = self.clone();
                next.attempt += 1;
                Some((at, next))
            }
        }
    }
}

/// A redelivery: one attempt of an event's callback queued now, with the same event (so the
/// same `webhook-id` and body), whatever the callback's state.
#[derive(Clone, Debug)]
pub(crate) struct Redelivery {
    pub(crate) due_at: Millis,
    pub(crate) delivery: Delivery,
    /// The callback's log with the attempt queued (`None`: never attempted, still pending).
    pub(crate) log: Option<DeliveryLog>,
}

impl DeliveryLog {
    /// Whether the callback was given up at or after `since` (when its last attempt was made).
    pub(crate) fn given_up_since(&self, since: Millis) -> bool {
        self.ended == Some(DeliveryEnd::GivenUp)
            && self.attempts.last().is_some_and(|a| a.at >= since)
    }
}

/// The redelivery of `event`'s callback at `now`, or `None` when its order has no callbackUrl.
///
/// `queued` is the callback's outbox entry, when it still has one (pending or retrying): the
/// redelivery takes its place, brought forward to now, and keeps its attempt number, so the
/// schedule goes on from where it stood. A callback that ended (delivered or given up) gets the
/// attempt after its last one: when that fails, the schedule resumes from there, and once it
/// is spent the redelivery was a single attempt. Its due time always differs from the
/// replaced entry's: an attempt still in flight on that entry then finds it gone, and logs its
/// outcome without settling the callback, which is now the redelivery's.
pub(crate) fn redelivery(
    event: &Event,
    queued: Option<(Millis, &Delivery)>,
    log: Option<DeliveryLog>,
    now: Millis,
) -> Option<Redelivery> {
    let url = event.order.callback_url.clone()?;
    let attempt = match (queued, &log) {
        (Some((_, delivery)), _) => delivery.attempt,
        (None, Some(log)) => log.attempts.iter().map(|a| a.attempt).max().unwrap_or(0) + 1,
        (None, None) => 1,
    };
    let due_at = match queued {
        Some((at, _)) if at == now => now + 1,
        _ => now,
    };
    let log = log.map(|mut log| {
        log.ended = None;
        log.next_attempt_at = Some(due_at);
        log
    });
    Some(Redelivery {
        due_at,
        delivery: Delivery {
            event_id: event.id.clone(),
            account_id: event.account_id,
            url,
            attempt,
        },
        log,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(status: Option<u16>) -> DeliveryAttempt {
        DeliveryAttempt {
            attempt: 1,
            at: 5,
            status,
            error: None,
        }
    }

    #[test]
    fn a_finished_delivery_ends_delivered_on_a_2xx_and_given_up_otherwise() {
        let done =
            DeliveryLog::default().after(attempt(Some(204)), DeliveryOutcome::Finished, true);
        assert_eq!(done.ended, Some(DeliveryEnd::Delivered));
        let gone =
            DeliveryLog::default().after(attempt(Some(500)), DeliveryOutcome::Finished, true);
        assert_eq!(gone.ended, Some(DeliveryEnd::GivenUp));
        assert_eq!(gone.next_attempt_at, None);
    }

    #[test]
    fn an_attempt_that_no_longer_settles_is_logged_and_decides_nothing() {
        let log = DeliveryLog::default().after(attempt(None), DeliveryOutcome::RetryAt(9), true);
        let log = log.after(attempt(Some(200)), DeliveryOutcome::Finished, false);
        assert_eq!(log.attempts.len(), 2);
        assert_eq!((log.next_attempt_at, log.ended), (Some(9), None));
    }

    #[test]
    fn a_retry_is_the_same_event_one_attempt_later() {
        let delivery = Delivery {
            event_id: "evt_1".into(),
            account_id: AccountId::new(),
            url: "https://p.example/cb".into(),
            attempt: 2,
        };
        let (at, next) = delivery.next(DeliveryOutcome::RetryAt(40)).unwrap();
        assert_eq!((at, next.attempt, next.event_id.as_str()), (40, 3, "evt_1"));
        assert!(delivery.next(DeliveryOutcome::Finished).is_none());
    }
    fn event(url: Option<&str>) -> Event {
        use crate::domain::ids::OrderId;
        use crate::domain::money::Cents;
        use crate::domain::order::OrderStatus;
        let account_id = AccountId::new();
        Event {
            id: "evt_1".into(),
            kind: EventKind::OrderCompleted,
            account_id,
            created_at: 10,
            order: Order {
                id: OrderId::new(),
                account_id,
                status: OrderStatus::Completed,
                items: Vec::new(),
                total: Cents(100),
                currency: "USD".into(),
                callback_url: url.map(str::to_string),
                external_order_id: None,
                refunded: Cents::ZERO,
                created_at: 10,
                updated_at: 10,
            },
            refund: None,
        }
    }

    #[test]
    fn an_event_without_a_callback_url_has_nothing_to_redeliver() {
        assert!(redelivery(&event(None), None, None, 50).is_none());
    }

    #[test]
    fn a_given_up_callback_is_redelivered_as_the_attempt_after_its_last_one_due_now() {
        let log = DeliveryLog::default().after(attempt(Some(410)), DeliveryOutcome::Finished, true);
        assert!(log.given_up_since(5) && !log.given_up_since(6));
        let again = redelivery(&event(Some("https://p.example/cb")), None, Some(log), 50).unwrap();
        assert_eq!((again.due_at, again.delivery.attempt), (50, 2));
        assert_eq!(again.delivery.event_id, "evt_1");
        let log = again.log.unwrap();
        assert_eq!(
            (log.ended, log.next_attempt_at, log.attempts.len()),
            (None, Some(50), 1)
        );
    }

    #[test]
    fn a_queued_callback_is_brought_forward_keeping_its_attempt_and_never_onto_its_own_due_time() {
        let cb = "https://p.example/cb";
        let url = Some(cb);
        let queued = Delivery {
            event_id: "evt_1".into(),
            account_id: AccountId::new(),
            url: cb.into(),
            attempt: 3,
        };
        let later = redelivery(&event(url), Some((900, &queued)), None, 50).unwrap();
        assert_eq!((later.due_at, later.delivery.attempt), (50, 3));
        let same_instant = redelivery(&event(url), Some((50, &queued)), None, 50).unwrap();
        assert_eq!(same_instant.due_at, 51);
    }
}
