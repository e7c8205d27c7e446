//! The per-client rate limit: GCRA via governor, one keyed limiter per configured limit (the
//! default and each `--rate-limit-override` network), burst equal to the per-minute limit.
//! Every response that reached it carries `X-RateLimit-Limit`, `-Remaining` and `-Reset`.

use std::net::IpAddr;
use std::num::NonZeroU32;
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

use super::cidr::Cidr;
use super::client_ip::{bucket_of, client_ip};
use crate::config::Settings;
use crate::error::ApiError;
use crate::metrics::Metrics;

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
}

/// What the limiter decided for one request.
#[derive(Debug, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub limit: u32,
    pub remaining: u32,
    /// Whole seconds until the budget is full again.
    pub reset_secs: u64,
    /// Whole seconds until the next request would be allowed (at least 1); 0 when allowed.
    pub retry_after_secs: u64,
}

pub struct RateLimits {
    default: Bucket,
    /// Most specific network first.
    overrides: Vec<(Cidr, Bucket)>,
    trusted_proxies: Vec<Cidr>,
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

impl RateLimits {
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
        }
    }

    pub fn client(&self, peer: IpAddr, forwarded_for: &[&str]) -> IpAddr {
        client_ip(peer, forwarded_for, &self.trusted_proxies)
    }

    pub fn check(&self, client: IpAddr) -> Decision {
        let bucket = self
            .overrides
            .iter()
            .find(|(net, _)| net.contains(client))
            .map(|(_, b)| b)
            .unwrap_or(&self.default);
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

/// Routes an orchestrator polls; they must never be starved by the limit.
fn exempt(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/metrics")
}

fn set_headers(headers: &mut actix_web::http::header::HeaderMap, d: &Decision) {
    let mut put = |name: &'static str, value: u64| {
        headers.insert(HeaderName::from_static(name), HeaderValue::from(value));
    };
    put("x-ratelimit-limit", u64::from(d.limit));
    put("x-ratelimit-remaining", u64::from(d.remaining));
    put("x-ratelimit-reset", d.reset_secs);
}

pub async fn limit_rate(
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
        .get_all("X-Forwarded-For")
        .filter_map(|v| v.to_str().ok())
        .collect();
    let client = limits.client(peer, &forwarded);
    let decision = limits.check(client);
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
