//! Callback delivery: takes due entries from the durable outbox, POSTs each event with the
//! Standard Webhooks headers, and on failure reschedules it on `--webhook-retry-schedule`
//! under the same event id (at-least-once; receivers deduplicate on `webhook-id`).
//!
//! One slow receiver delays only itself: each pass starts the due deliveries it may without
//! waiting for earlier ones (no barrier between passes), at most
//! `--webhook-origin-concurrency` at once per origin (scheme, host, port) and one at a time
//! per event; the outbox scan skips what is in flight or would exceed an origin's share.
//!
//! Server-side request forgery is closed at connect time, not only when the URL was stored:
//! an IP literal is judged from the parsed URL (a resolver never sees it), and a name is
//! resolved by `CheckedResolver`, which hands reqwest only the addresses it has checked, so
//! nothing is looked up twice between check and connect. No redirects, no proxies.

use crate::bounds::{Deadline, WORKER_CALL};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use base64::Engine;
use hmac::{Hmac, Mac};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use sha2::Sha256;

use super::survive;
use crate::domain::callback_url::{is_public_ip, origin_of, redacted, AddressPolicy, CallbackUrl};
use crate::domain::event::{Delivery, DeliveryAttempt};
use crate::domain::time::now_millis;
use crate::domain::webhook_secret::signing_secrets;
use crate::metrics::Metrics;
use crate::store::{DeliveryOutcome, DueDelivery, Store};
use crate::views::event_body;

pub(crate) const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// What a delivery's hold must still have left when its POST starts, beyond the attempt's
/// timeout: the time from the hold's answer to the request on the wire, with room to spare.
const HOLD_MARGIN: Duration = Duration::from_secs(1);
/// Deliveries started per pass at most.
const BATCH: usize = 64;
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(200);
/// How often a stopping worker looks again at the deliveries still in flight.
const DRAIN_POLL: Duration = Duration::from_millis(10);

/// Resolves a callback host and keeps only the addresses the policy allows.
struct CheckedResolver {
    policy: AddressPolicy,
}

impl Resolve for CheckedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy;
        let host = name.as_str().to_string();
        Box::pin(async move {
            let resolved: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let allowed: Vec<SocketAddr> = resolved
                .into_iter()
                .filter(|a| policy == AddressPolicy::AllowPrivate || is_public_ip(a.ip()))
                .collect();
            if allowed.is_empty() {
                let refusal = format!("{host} resolves to no public address");
                return Err(
                    std::io::Error::new(std::io::ErrorKind::PermissionDenied, refusal).into(),
                );
            }
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

/// What one attempt came to.
enum Attempt {
    Delivered {
        status: u16,
    },
    /// Try again later; a receiver's `Retry-After` may ask for longer than the schedule.
    Retry {
        retry_after: Option<Duration>,
        /// The receiver's status when it answered, else why there was no answer.
        status: Option<u16>,
        error: Option<String>,
    },
    /// Retrying cannot help (the URL is no longer acceptable, the secret is malformed).
    GiveUp(String),
    /// The receiver answered `410 Gone`: stop sending (Standard Webhooks), no further attempt.
    Gone,
}

/// Deliveries in flight: by event, and how many per origin.
#[derive(Default)]
struct InFlight {
    events: HashSet<String>,
    origins: HashMap<String, usize>,
}

/// A delivery's place in flight; dropping it (even while a panic unwinds) frees it.
struct Slot {
    in_flight: Arc<Mutex<InFlight>>,
    event: String,
    origin: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        in_flight.events.remove(&self.event);
        if let Some(n) = in_flight.origins.get_mut(&self.origin) {
            *n -= 1;
            if *n == 0 {
                in_flight.origins.remove(&self.origin);
            }
        }
    }
}

pub(crate) struct WebhookSender {
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    client: reqwest::Client,
    policy: AddressPolicy,
    schedule: Vec<Duration>,
    per_origin: usize,
    in_flight: Arc<Mutex<InFlight>>,
}

/// What a failed connection or timeout was, for the console: short, and never the URL.
fn transport_error(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        return format!("no answer within {} s", ATTEMPT_TIMEOUT.as_secs());
    }
    let mut cause: &dyn std::error::Error = e;
    while let Some(inner) = cause.source() {
        cause = inner;
    }
    cause.to_string()
}

/// How long to wait before the next attempt after failed attempt `attempt` (1 = the first),
/// or `None` when the schedule is spent. A receiver's `Retry-After` wins when it asks for
/// longer, up to the schedule's longest step (so no receiver can park an event for ever).
pub(crate) fn next_wait(
    schedule: &[Duration],
    attempt: u32,
    retry_after: Option<Duration>,
) -> Option<Duration> {
    let delay = *schedule.get((attempt as usize).checked_sub(1)?)?;
    let longest = schedule.iter().copied().max().unwrap_or(delay);
    Some(retry_after.map_or(delay, |asked| asked.max(delay).min(longest)))
}

/// `v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>` where the key is the base64
/// after `whsec_` (Standard Webhooks).
pub(crate) fn sign(secret: &str, id: &str, timestamp: u64, body: &[u8]) -> Option<String> {
    let engine = base64::engine::general_purpose::STANDARD;
    let key = engine.decode(secret.strip_prefix("whsec_")?).ok()?;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).ok()?;
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    Some(format!("v1,{}", engine.encode(mac.finalize().into_bytes())))
}

fn retry_after(response: &reqwest::Response) -> Option<Duration> {
    let status = response.status().as_u16();
    if status != 429 && status != 503 {
        return None;
    }
    let value = response.headers().get("Retry-After")?.to_str().ok()?;
    retry_after_value(value, SystemTime::now())
}

/// A `Retry-After` value as a wait from `now`: whole seconds (`120`) or an HTTP date (RFC 9110
/// allows both; a date already past asks for no wait). Anything else is not read.
fn retry_after_value(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

impl WebhookSender {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        metrics: Arc<Metrics>,
        policy: AddressPolicy,
        schedule: Vec<Duration>,
        per_origin: usize,
    ) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .timeout(ATTEMPT_TIMEOUT)
            .dns_resolver(Arc::new(CheckedResolver { policy }))
            .user_agent("orderly-webhooks/1")
            .build()?;
        Ok(WebhookSender {
            store,
            metrics,
            client,
            policy,
            schedule,
            per_origin: per_origin.max(1),
            in_flight: Arc::default(),
        })
    }

    /// Starts every delivery due now that may start (up to a batch) and returns without
    /// waiting for them: each runs on this worker's runtime until it is settled.
    pub(crate) async fn deliver_due(self: &Arc<Self>) {
        let take = {
            let (in_flight, per_origin) = (Arc::clone(&self.in_flight), self.per_origin);
            let mut taken: HashMap<String, usize> = HashMap::new();
            Box::new(move |d: &Delivery| {
                let in_flight = in_flight.lock().unwrap_or_else(|e| e.into_inner());
                let origin = origin_of(&d.url);
                let busy = in_flight.origins.get(&origin).copied().unwrap_or(0);
                let share = taken.entry(origin).or_insert(0);
                if in_flight.events.contains(&d.event_id) || busy + *share >= per_origin {
                    return false;
                }
                *share += 1;
                true
            })
        };
        let due = match self
            .store
            .due_deliveries(Deadline::after(WORKER_CALL), now_millis(), BATCH, take)
            .await
        {
            Ok(due) => due,
            Err(e) => {
                e.log("webhooks: reading the outbox");
                return;
            }
        };
        for due in due {
            let Some(slot) = self.reserve(&due.delivery) else {
                continue;
            };
            let sender = Arc::clone(self);
            tokio::spawn(async move {
                let _slot = slot;
                survive("webhooks", &sender.metrics, sender.deliver(due)).await;
            });
        }
    }

    /// Returns once no delivery is in flight. The worker's stop waits on it before its
    /// runtime goes, so that a POST on the wire ends (answered, or at its attempt's timeout)
    /// and is settled rather than cut: the receiver would still be handling a cut one when
    /// another instance, or this one restarted, sent the delivery again. Each delivery is
    /// bounded by itself (its hold and its settling write by `WORKER_CALL`, its POST by
    /// `ATTEMPT_TIMEOUT`); the stop's own bound covers the rest.
    pub(crate) async fn drain(&self) {
        let on_the_wire = |sender: &Self| {
            let in_flight = sender.in_flight.lock().unwrap_or_else(|e| e.into_inner());
            in_flight.events.len()
        };
        let waiting = on_the_wire(self);
        if waiting > 0 {
            log::info!("stopping: waiting for {waiting} webhook delivery(ies) in flight to end");
        }
        while on_the_wire(self) > 0 {
            tokio::time::sleep(DRAIN_POLL).await;
        }
    }

    fn reserve(&self, delivery: &Delivery) -> Option<Slot> {
        let origin = origin_of(&delivery.url);
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        let busy = in_flight.origins.get(&origin).copied().unwrap_or(0);
        if busy >= self.per_origin || !in_flight.events.insert(delivery.event_id.clone()) {
            return None;
        }
        *in_flight.origins.entry(origin.clone()).or_insert(0) += 1;
        Some(Slot {
            in_flight: Arc::clone(&self.in_flight),
            event: delivery.event_id.clone(),
            origin,
        })
    }

    async fn deliver(&self, due: DueDelivery) {
        // Sent only while this instance holds the delivery for longer than the attempt can
        // take: where instances share the outbox, another may have taken it over since the
        // pass claimed it (this one's heartbeat lapsed), and must be the only one sending.
        let hold = self
            .store
            .hold_for_attempt(
                Deadline::after(WORKER_CALL),
                &due,
                ATTEMPT_TIMEOUT + HOLD_MARGIN,
            )
            .await;
        match hold {
            Ok(true) => {}
            Ok(false) => {
                log::info!(
                    "webhook {}: no longer held by this instance; not sent",
                    due.delivery.event_id
                );
                return;
            }
            Err(e) => {
                e.log("webhooks: holding a delivery for its attempt");
                return;
            }
        }
        let attempt = self.attempt(&due).await;
        let delivery = &due.delivery;
        if !matches!(attempt, Attempt::Delivered { .. }) {
            self.metrics.webhook_failures.inc();
        }
        let (status, error) = match &attempt {
            Attempt::Delivered { status } => (Some(*status), None),
            Attempt::Retry { status, error, .. } => (*status, error.clone()),
            Attempt::GiveUp(why) => (None, Some(why.clone())),
            Attempt::Gone => (Some(410), None),
        };
        let record = DeliveryAttempt {
            attempt: delivery.attempt,
            at: now_millis(),
            status,
            error,
        };
        let delivered = matches!(attempt, Attempt::Delivered { .. });
        let settled = match attempt {
            Attempt::Delivered { .. } => {
                log::info!(
                    "webhook {} delivered (attempt {})",
                    delivery.event_id,
                    delivery.attempt
                );
                DeliveryOutcome::Finished
            }
            Attempt::GiveUp(why) => {
                log::warn!("webhook {} abandoned: {why}", delivery.event_id);
                DeliveryOutcome::Finished
            }
            Attempt::Gone => {
                log::warn!(
                    "webhook {} abandoned: the receiver answered 410 Gone",
                    delivery.event_id
                );
                DeliveryOutcome::Finished
            }
            Attempt::Retry { retry_after, .. } => {
                match next_wait(&self.schedule, delivery.attempt, retry_after) {
                    Some(wait) => {
                        log::info!(
                            "webhook {} attempt {} failed; next in {}",
                            delivery.event_id,
                            delivery.attempt,
                            humantime::format_duration(wait)
                        );
                        let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
                        DeliveryOutcome::RetryAt(now_millis().saturating_add(wait_ms))
                    }
                    None => {
                        log::warn!(
                            "webhook {} abandoned after {} attempts",
                            delivery.event_id,
                            delivery.attempt
                        );
                        DeliveryOutcome::Finished
                    }
                }
            }
        };
        // Finished without a 2xx: given up, whichever way (a 410, the schedule spent, a URL
        // or secret refused).
        if settled == DeliveryOutcome::Finished && !delivered {
            self.metrics.webhook_given_up.inc();
        }
        if let Err(e) = self
            .store
            .settle_delivery(Deadline::after(WORKER_CALL), due, settled, record)
            .await
        {
            log::error!("webhooks: updating the outbox: {e}");
        }
    }

    async fn attempt(&self, due: &DueDelivery) -> Attempt {
        let delivery = &due.delivery;
        if let Err(reason) = CallbackUrl::parse(&delivery.url, self.policy) {
            return Attempt::GiveUp(format!("callbackUrl no longer acceptable: {reason}"));
        }
        let event = &due.event;
        let body = event_body(event);
        // The process's now (the database's clock when instances share one), so that a
        // receiver's tolerance check is not failed by this machine's wrong wall clock.
        let timestamp = now_millis() / 1_000;
        // During a rotation's overlap, one signature per secret, the new one first.
        let secrets = signing_secrets(
            &due.webhook_secret,
            due.previous_secret.as_ref(),
            now_millis(),
        );
        let signatures: Option<Vec<String>> = secrets
            .iter()
            .map(|secret| sign(secret, &event.id, timestamp, &body))
            .collect();
        let Some(signatures) = signatures else {
            return Attempt::GiveUp("the account's webhook secret is malformed".into());
        };
        let signature = signatures.join(" ");
        self.metrics.webhook_attempts.inc();
        let sent = self
            .client
            .post(&delivery.url)
            .header("Content-Type", "application/json")
            .header("webhook-id", &event.id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(body)
            .send()
            .await;
        match sent {
            Ok(response) if response.status().is_success() => Attempt::Delivered {
                status: response.status().as_u16(),
            },
            Ok(response) if response.status() == reqwest::StatusCode::GONE => Attempt::Gone,
            Ok(response) => {
                log::info!(
                    "webhook {} to {} answered {}",
                    event.id,
                    redacted(&delivery.url),
                    response.status()
                );
                Attempt::Retry {
                    retry_after: retry_after(&response),
                    status: Some(response.status().as_u16()),
                    error: None,
                }
            }
            Err(e) => {
                // Never the whole URL: partners put tokens in its query string.
                let e = e.without_url();
                log::info!(
                    "webhook {} to {} failed: {e}",
                    event.id,
                    redacted(&delivery.url)
                );
                Attempt::Retry {
                    retry_after: None,
                    status: None,
                    error: Some(transport_error(&e)),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_read_in_seconds_or_as_an_http_date() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_032_800); // 2026-11-30T10:00:00Z
        assert_eq!(
            retry_after_value("120", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(retry_after_value(" 0 ", now), Some(Duration::ZERO));
        for date in [
            "Mon, 30 Nov 2026 10:05:00 GMT",
            "Monday, 30-Nov-26 10:05:00 GMT",
            "Mon Nov 30 10:05:00 2026",
        ] {
            assert_eq!(
                retry_after_value(date, now),
                Some(Duration::from_secs(300)),
                "{date}"
            );
        }
        assert_eq!(
            retry_after_value("Mon, 30 Nov 2026 09:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        for bad in ["", "-5", "1.5", "soon", "2026-11-30T10:05:00Z"] {
            assert_eq!(retry_after_value(bad, now), None, "{bad:?}");
        }
    }

    #[test]
    fn the_signature_follows_standard_webhooks() {
        // Key bytes "secret" in base64; the expected value computed independently.
        let sig = sign("whsec_c2VjcmV0", "evt_1", 1_700_000_000, b"{}").unwrap();
        let mut mac = Hmac::<Sha256>::new_from_slice(b"secret").unwrap();
        mac.update(b"evt_1.1700000000.{}");
        let expected =
            base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
        assert_eq!(sig, format!("v1,{expected}"));
    }

    #[test]
    fn a_longer_retry_after_wins_up_to_the_longest_step() {
        let schedule = [Duration::from_secs(1), Duration::from_secs(60)];
        let secs = |s| Some(Duration::from_secs(s));
        assert_eq!(next_wait(&schedule, 1, None), secs(1));
        assert_eq!(next_wait(&schedule, 1, secs(30)), secs(30));
        assert_eq!(next_wait(&schedule, 1, secs(u64::MAX)), secs(60));
        assert_eq!(next_wait(&schedule, 2, secs(0)), secs(60));
        assert_eq!(next_wait(&schedule, 3, secs(5)), None);
        assert_eq!(next_wait(&schedule, 0, None), None);
    }

    #[test]
    fn a_secret_without_its_prefix_signs_nothing() {
        assert!(sign("c2VjcmV0", "evt_1", 1, b"{}").is_none());
    }
}
