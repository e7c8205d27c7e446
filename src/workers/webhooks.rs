//! Callback delivery: takes due entries from the durable outbox, POSTs each event with the
//! Standard Webhooks headers, and on failure reschedules it on `--webhook-retry-schedule`
//! under the same event id (at-least-once; receivers deduplicate on `webhook-id`).
//!
//! Server-side request forgery is closed at connect time, not only when the URL was stored:
//! an IP literal is judged from the parsed URL (a resolver never sees it), and a name is
//! resolved by `CheckedResolver`, which hands reqwest only the addresses it has checked, so
//! nothing is looked up twice between check and connect. No redirects, no proxies.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use futures_util::future::join_all;
use hmac::{Hmac, Mac};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use sha2::Sha256;

use crate::domain::callback_url::{is_public_ip, AddressPolicy, CallbackUrl};
use crate::domain::time::now_millis;
use crate::metrics::Metrics;
use crate::store::{DeliveryOutcome, DueDelivery, Store};
use crate::views::event_body;

pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// Deliveries attempted together per pass.
const BATCH: usize = 64;
pub const POLL_INTERVAL: Duration = Duration::from_millis(200);

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
    Delivered,
    /// Try again later; a receiver's `Retry-After` may ask for longer than the schedule.
    Retry {
        retry_after: Option<Duration>,
    },
    /// Retrying cannot help (the URL is no longer acceptable, or the event is gone).
    GiveUp(String),
}

pub struct WebhookSender {
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    client: reqwest::Client,
    policy: AddressPolicy,
    schedule: Vec<Duration>,
}

/// `v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>` where the key is the base64
/// after `whsec_` (Standard Webhooks).
pub fn sign(secret: &str, id: &str, timestamp: u64, body: &[u8]) -> Option<String> {
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
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

impl WebhookSender {
    pub fn new(
        store: Arc<dyn Store>,
        metrics: Arc<Metrics>,
        policy: AddressPolicy,
        schedule: Vec<Duration>,
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
        })
    }

    /// Attempts every delivery due now (up to a batch), concurrently.
    pub async fn deliver_due(&self) {
        let due = match self.store.due_deliveries(now_millis(), BATCH).await {
            Ok(due) => due,
            Err(e) => {
                log::error!("webhooks: reading the outbox: {e}");
                return;
            }
        };
        join_all(due.into_iter().map(|d| self.deliver(d))).await;
    }

    async fn deliver(&self, due: DueDelivery) {
        let attempt = self.attempt(&due).await;
        let delivery = &due.delivery;
        if !matches!(attempt, Attempt::Delivered) {
            self.metrics.webhook_failures.inc();
        }
        let settled = match attempt {
            Attempt::Delivered => {
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
            Attempt::Retry { retry_after } => {
                match self.schedule.get(delivery.attempt as usize - 1) {
                    Some(delay) => {
                        let wait = retry_after.map_or(*delay, |asked| asked.max(*delay));
                        log::info!(
                            "webhook {} attempt {} failed; next in {}",
                            delivery.event_id,
                            delivery.attempt,
                            humantime::format_duration(wait)
                        );
                        DeliveryOutcome::RetryAt(now_millis() + wait.as_millis() as u64)
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
        if let Err(e) = self.store.settle_delivery(due, settled).await {
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
        let timestamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let Some(signature) = sign(&due.webhook_secret, &event.id, timestamp, &body) else {
            return Attempt::GiveUp("the account's webhook secret is malformed".into());
        };
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
            Ok(response) if response.status().is_success() => Attempt::Delivered,
            Ok(response) => {
                log::info!("webhook {} answered {}", event.id, response.status());
                Attempt::Retry {
                    retry_after: retry_after(&response),
                }
            }
            Err(e) => {
                log::info!("webhook {} failed: {e}", event.id);
                Attempt::Retry { retry_after: None }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn a_secret_without_its_prefix_signs_nothing() {
        assert!(sign("c2VjcmV0", "evt_1", 1, b"{}").is_none());
    }
}
