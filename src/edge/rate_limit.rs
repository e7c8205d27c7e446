//! The per-client rate limit: GCRA via governor, one keyed limiter per configured limit (the
//! default and each `--rate-limit-override` network), burst equal to the per-minute limit.
//! Every response that reached it carries `X-RateLimit-Limit`, `-Remaining` and `-Reset`.
//!
//! On an engine shared by many instances (PostgreSQL) the budget is the engine's, one per
//! client across every instance, spent in the database with the same GCRA arithmetic (the
//! engine batches a client's concurrent requests into one statement); the in-memory buckets are then the fallback used while the database does not
//! answer, so that an outage of the database never lifts the limit. On the embedded engine
//! there is no shared budget and the path is exactly the in-memory one.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::Next;
use actix_web::{web, ResponseError};
use governor::clock::{Clock, DefaultClock};
use governor::middleware::StateInformationMiddleware;
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};

use super::client_ip::{bucket_of, client_ip};
use crate::config::Settings;
use crate::domain::cidr::Cidr;
use crate::domain::time::now_millis;
use crate::error::ApiError;
use crate::header_names as names;
use crate::metrics::Metrics;
use crate::store::{SharedRateLimit, Spent};

/// How long a request waits for the shared budget before this instance decides alone: a
/// database that does not answer must not hold up (or lift) the limit.
const SHARED_WAIT: Duration = Duration::from_secs(1);
/// After the shared budget failed, how long requests are decided locally before it is tried
/// again: one slow failure per interval, not one per request, while the database is away.
const SHARED_RETRY_MS: u64 = 1000;

type KeyedLimiter =
    RateLimiter<IpAddr, DefaultKeyedStateStore<IpAddr>, DefaultClock, StateInformationMiddleware>;

struct Bucket {
    per_minute: u32,
    limiter: KeyedLimiter,
}

impl Bucket {
    fn new(per_minute: u32) -> Self {
        let per_minute = per_minute.max(1);
        let quota = Quota::per_minute(NonZeroU32::new(per_minute).expect("at least 1"));
        Bucket {
            per_minute,
            limiter: RateLimiter::keyed(quota).with_middleware::<StateInformationMiddleware>(),
        }
    }

    /// Time for one request's worth of budget to come back.
    fn replenish(&self) -> Duration {
        Duration::from_secs(60) / self.per_minute
    }

    /// The emission interval and the window of the shared budget, in nanoseconds: at the
    /// highest limits one request's worth is well under a microsecond.
    fn gcra_terms(&self) -> (i64, i64) {
        let emission = i64::try_from(self.replenish().as_nanos())
            .unwrap_or(i64::MAX)
            .max(1);
        (
            emission,
            emission.saturating_mul(i64::from(self.per_minute)),
        )
    }
}

/// What the limiter decided for one request.
#[derive(Debug, PartialEq, Eq)]
pub struct Decision {
    pub(crate) allowed: bool,
    pub(crate) limit: u32,
    pub(crate) remaining: u32,
    /// Whole seconds until the budget is full again.
    pub(crate) reset_secs: u64,
    /// Whole seconds until the next request would be allowed (at least 1); 0 when allowed.
    pub(crate) retry_after_secs: u64,
}

/// The per-client request budget of the HTTP surface, kept in memory or shared with other
/// instances.
pub struct RateLimits {
    default: Bucket,
    /// Most specific network first.
    overrides: Vec<(Cidr, Bucket)>,
    trusted_proxies: Vec<Cidr>,
    /// The budget shared with the other instances, when the engine keeps one.
    shared: Option<Arc<dyn SharedRateLimit>>,
    /// While the shared budget is failing: when to try it again (ms since the epoch); 0 while
    /// it answers. An outage is logged once, not per request.
    shared_retry_at: AtomicU64,
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

impl RateLimits {
    /// The limiter the flags configure: the default budget, the per-network overrides and the
    /// trusted proxies.
    pub fn new(settings: &Settings) -> Self {
        let mut overrides: Vec<(Cidr, Bucket)> = settings
            .rate_limit_override
            .iter()
            .map(|o| (o.network, Bucket::new(o.per_minute)))
            .collect();
        overrides.sort_by_key(|(net, _)| std::cmp::Reverse(net.prefix()));
        RateLimits {
            default: Bucket::new(settings.rate_limit),
            overrides,
            trusted_proxies: settings.trusted_proxies.clone(),
            shared: None,
            shared_retry_at: AtomicU64::new(0),
        }
    }

    /// Spends from `shared` (the engine's budget, one for every instance) instead of the
    /// in-memory buckets, which remain as the fallback.
    pub(crate) fn shared_with(mut self, shared: Option<Arc<dyn SharedRateLimit>>) -> Self {
        self.shared = shared;
        self
    }

    pub(crate) fn client(&self, peer: IpAddr, forwarded_for: &[&str]) -> IpAddr {
        client_ip(peer, forwarded_for, &self.trusted_proxies)
    }

    fn bucket(&self, client: IpAddr) -> &Bucket {
        self.overrides
            .iter()
            .find(|(net, _)| net.contains(client))
            .map(|(_, b)| b)
            .unwrap_or(&self.default)
    }

    /// Decides one request: from the shared budget when there is one and it answers, else
    /// from this instance's buckets.
    pub(crate) async fn decide(&self, client: IpAddr) -> Decision {
        let Some(shared) = &self.shared else {
            return self.check(client);
        };
        let retry_at = self.shared_retry_at.load(Ordering::Relaxed);
        if retry_at != 0 && now_millis() < retry_at {
            return self.check(client);
        }
        let bucket = self.bucket(client);
        let (emission, window) = bucket.gcra_terms();
        let key = bucket_of(client);
        match tokio::time::timeout(SHARED_WAIT, shared.spend(key, emission, window)).await {
            Ok(Ok(spent)) => {
                if self.shared_retry_at.swap(0, Ordering::Relaxed) != 0 {
                    log::info!("rate limit: the shared budget answers again");
                }
                gcra_decision(bucket.per_minute, emission, window, spent)
            }
            outcome => {
                let again = now_millis().saturating_add(SHARED_RETRY_MS);
                if self.shared_retry_at.swap(again, Ordering::Relaxed) == 0 {
                    let why = match outcome {
                        Ok(Err(e)) => e.to_string(),
                        _ => format!("no answer within {} ms", SHARED_WAIT.as_millis()),
                    };
                    log::warn!("rate limit: the shared budget failed ({why}); each instance limits on its own until it answers");
                }
                self.check(client)
            }
        }
    }

    /// Decides one request from this instance's in-memory buckets.
    pub fn check(&self, client: IpAddr) -> Decision {
        let bucket = self.bucket(client);
        let key = bucket_of(client);
        match bucket.limiter.check_key(&key) {
            Ok(snapshot) => {
                let remaining = snapshot.remaining_burst_capacity();
                let used = bucket.per_minute.saturating_sub(remaining);
                Decision {
                    allowed: true,
                    limit: bucket.per_minute,
                    remaining,
                    reset_secs: ceil_secs(bucket.replenish() * used),
                    retry_after_secs: 0,
                }
            }
            Err(not_until) => {
                let wait = not_until.wait_time_from(bucket.limiter.clock().now());
                Decision {
                    allowed: false,
                    limit: bucket.per_minute,
                    remaining: 0,
                    reset_secs: ceil_secs(bucket.replenish() * bucket.per_minute),
                    retry_after_secs: ceil_secs(wait).max(1),
                }
            }
        }
    }

    /// Forgets the shared buckets that are full again (every instance may do it: deleting a
    /// full bucket twice changes nothing).
    pub(crate) async fn prune_shared(&self) {
        if let Some(shared) = &self.shared {
            match shared.prune().await {
                Ok(n) if n > 0 => log::debug!("rate limit: forgot {n} full shared bucket(s)"),
                Ok(_) => {}
                Err(e) => log::warn!("rate limit: pruning the shared buckets: {e}"),
            }
        }
    }

    /// Forgets clients whose buckets are full again, so memory tracks recent clients only.
    pub fn prune(&self) {
        for limiter in std::iter::once(&self.default).chain(self.overrides.iter().map(|(_, b)| b)) {
            limiter.limiter.retain_recent();
            limiter.limiter.shrink_to_fit();
        }
    }

    /// Clients currently tracked (for measuring the pruning).
    pub fn tracked_clients(&self) -> usize {
        self.default.limiter.len()
            + self
                .overrides
                .iter()
                .map(|(_, b)| b.limiter.len())
                .sum::<usize>()
    }
}

/// The decision for a request that spent (or was refused) `spent` of a shared budget of
/// `per_minute` requests, one coming back every `emission` ns, `window` ns of them in all.
fn gcra_decision(per_minute: u32, emission: i64, window: i64, spent: Spent) -> Decision {
    let nanos = |ns: i64| Duration::from_nanos(ns.max(0) as u64);
    let ahead = spent.ahead_nanos.clamp(0, window);
    if spent.allowed {
        let remaining = ((window - ahead) / emission.max(1)).clamp(0, i64::from(per_minute));
        Decision {
            allowed: true,
            limit: per_minute,
            remaining: remaining as u32,
            reset_secs: ceil_secs(nanos(ahead)),
            retry_after_secs: 0,
        }
    } else {
        // The next request fits once the arrival time, moved on by one emission, is back
        // within the window.
        let wait = spent.ahead_nanos.saturating_add(emission) - window;
        Decision {
            allowed: false,
            limit: per_minute,
            remaining: 0,
            reset_secs: ceil_secs(nanos(ahead)),
            retry_after_secs: ceil_secs(nanos(wait)).max(1),
        }
    }
}

/// Routes an orchestrator polls; they must never be starved by the limit.
fn exempt(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/metrics")
}

fn set_headers(headers: &mut actix_web::http::header::HeaderMap, d: &Decision) {
    let mut put = |name: HeaderName, value: u64| {
        headers.insert(name, HeaderValue::from(value));
    };
    put(names::X_RATELIMIT_LIMIT, u64::from(d.limit));
    put(names::X_RATELIMIT_REMAINING, u64::from(d.remaining));
    put(names::X_RATELIMIT_RESET, d.reset_secs);
}

pub(crate) async fn limit_rate(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let (Some(limits), Some(metrics)) = (
        req.app_data::<web::Data<RateLimits>>().cloned(),
        req.app_data::<web::Data<Metrics>>().cloned(),
    ) else {
        return Ok(next.call(req).await?.map_into_boxed_body());
    };
    if exempt(req.path()) {
        return Ok(next.call(req).await?.map_into_boxed_body());
    }
    let Some(peer) = req.peer_addr().map(|a| a.ip()) else {
        return Ok(next.call(req).await?.map_into_boxed_body());
    };
    let forwarded: Vec<&str> = req
        .headers()
        .get_all(names::X_FORWARDED_FOR)
        .filter_map(|v| v.to_str().ok())
        .collect();
    let client = limits.client(peer, &forwarded);
    let decision = limits.decide(client).await;
    if !decision.allowed {
        metrics.rate_limited.inc();
        let mut refusal = ApiError::RateLimited {
            retry_after: decision.retry_after_secs,
        }
        .error_response();
        set_headers(refusal.headers_mut(), &decision);
        return Ok(req.into_response(refusal));
    }
    let mut response = next.call(req).await?.map_into_boxed_body();
    set_headers(response.headers_mut(), &decision);
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn limits(args: &[&str]) -> RateLimits {
        let argv = ["orderly", "serve"].iter().chain(args).copied();
        match crate::config::Cli::parse_from(argv).command {
            crate::config::Command::Serve(s) => RateLimits::new(&s),
            _ => unreachable!("serve was parsed"),
        }
    }

    #[test]
    fn remaining_counts_down_from_the_limit_then_refuses() {
        let l = limits(&["--rate-limit", "3"]);
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let seen: Vec<u32> = (0..3).map(|_| l.check(ip).remaining).collect();
        assert_eq!(seen, vec![2, 1, 0]);
        let refused = l.check(ip);
        assert!(!refused.allowed);
        assert!(refused.retry_after_secs >= 1);
    }

    #[test]
    fn pruning_forgets_clients_whose_budget_is_full_again() {
        // 6000/min: one request's worth comes back every 10 ms.
        let l = limits(&["--rate-limit", "6000"]);
        for i in 0..100u8 {
            l.check(IpAddr::from([198, 51, 100, i]));
        }
        assert_eq!(l.tracked_clients(), 100);
        std::thread::sleep(std::time::Duration::from_millis(50));
        l.prune();
        assert_eq!(l.tracked_clients(), 0);
    }

    fn spent(allowed: bool, ahead_nanos: i64) -> Spent {
        Spent {
            allowed,
            ahead_nanos,
        }
    }

    #[test]
    fn a_shared_budget_counts_down_like_the_local_one() {
        // 3 per minute: one request back every 20 s.
        let (t, w) = (20_000_000_000, 60_000_000_000);
        let first = gcra_decision(3, t, w, spent(true, t));
        assert_eq!((first.remaining, first.reset_secs), (2, 20));
        let last = gcra_decision(3, t, w, spent(true, w));
        assert_eq!((last.remaining, last.reset_secs), (0, 60));
    }

    #[test]
    fn the_shared_budget_of_a_very_high_limit_still_has_room() {
        // 10^8 a minute: 600 ns per request, which a microsecond clock would round to nothing.
        let (emission, window) = Bucket::new(100_000_000).gcra_terms();
        assert_eq!(emission, 600);
        assert_eq!(window, 60_000_000_000);
    }

    #[test]
    fn a_refusal_of_the_shared_budget_says_when_the_next_request_fits() {
        let (t, w) = (20_000_000_000, 60_000_000_000);
        let refused = gcra_decision(3, t, w, spent(false, w - 500_000_000));
        assert!(!refused.allowed);
        assert_eq!(refused.remaining, 0);
        assert_eq!(refused.retry_after_secs, 20);
        assert_eq!(
            gcra_decision(3, t, w, spent(false, w - t)).retry_after_secs,
            1
        );
    }

    #[test]
    fn the_most_specific_override_wins() {
        let l = limits(&[
            "--rate-limit-override",
            "203.0.113.0/24=5000",
            "--rate-limit-override",
            "203.0.113.7/32=7",
        ]);
        assert_eq!(l.check("203.0.113.7".parse().unwrap()).limit, 7);
        assert_eq!(l.check("203.0.113.8".parse().unwrap()).limit, 5000);
        assert_eq!(l.check("198.51.100.1".parse().unwrap()).limit, 500);
    }
}
