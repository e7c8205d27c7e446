//! The retry policy of client/README.md as pure functions: an answer in, a verdict out.
//!
//! It branches on the status first and never on `success`; inside a status it matches the
//! token prefix (`idempotency_key_reused_with_different_body:`), never the sentence after it,
//! and the tokenless errors of section 5 (`Insufficient balance`, ...) as whole strings. No
//! verdict changes the request: a retry is always the journaled bytes under the journaled key.

use std::time::Duration;

use serde_json::Value;

/// What came back from one HTTP exchange that got an answer.
#[derive(Clone, Debug, Default)]
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
    /// `Retry-After` in whole seconds, when the answer had one that parsed.
    pub retry_after: Option<u64>,
    /// `X-RateLimit-Remaining`; absent on the Origin 403, which never reaches the limiter.
    pub rate_limit_remaining: Option<u64>,
    /// `Idempotency-Replayed: true`.
    pub replayed: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Placed {
        order_id: String,
        replayed: bool,
    },
    Conflict {
        error: String,
    },
    NeedsFunds {
        error: String,
    },
    /// `pending`: nothing of the request reached the business rules (401/403, a redirect, a
    /// 404/405 from a wrong base URL), so sending the same bytes again later is still
    /// meaningful and stays allowed.
    Rejected {
        error: String,
        pending: bool,
    },
    Retry {
        wait: Wait,
        error: String,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// A 429's `Retry-After`, to the second.
    Exactly(Duration),
    /// 409 `Duplicate request in progress`: 1 to 2 s.
    InProgress,
    /// 402 `Concurrent balance modification`: a short pause.
    ConcurrentBalance,
    /// 5xx, timeouts, connection errors: capped exponential backoff with jitter.
    Backoff,
}

pub const KEY_REUSED: &str = "idempotency_key_reused_with_different_body";
const IN_PROGRESS: &str = "Duplicate request in progress";
const INSUFFICIENT: &str = "Insufficient balance";
const OVER_CREDIT: &str = "Exceeds credit limit";
const CONCURRENT: &str = "Concurrent balance modification";

/// The verdict on an answer to `POST /b2b/orders`.
pub fn judge_order_answer(answer: &Answer) -> Verdict {
    let body: Option<Value> = serde_json::from_slice(&answer.body).ok();
    let error = error_text(answer.status, body.as_ref());
    let sentence = body
        .as_ref()
        .and_then(|b| b.get("error"))
        .and_then(Value::as_str)
        .unwrap_or("");
    match answer.status {
        200..=299 => match body
            .as_ref()
            .and_then(|b| b.pointer("/order/id"))
            .and_then(Value::as_str)
        {
            Some(id) => Verdict::Placed {
                order_id: id.to_string(),
                replayed: answer.replayed,
            },
            // A success we cannot read (a proxy mangled it?): the same key will replay it.
            None => retry(
                Wait::Backoff,
                format!("unreadable {} answer", answer.status),
            ),
        },
        409 if token_of(sentence) == Some(KEY_REUSED) => Verdict::Conflict { error },
        409 if sentence.starts_with(IN_PROGRESS) => retry(Wait::InProgress, error),
        402 if sentence == CONCURRENT => retry(Wait::ConcurrentBalance, error),
        402 if sentence == INSUFFICIENT || sentence == OVER_CREDIT => Verdict::NeedsFunds { error },
        // A 402 never uses the key (it writes nothing), so an unknown one waits for money
        // under the same key too rather than being given up.
        402 => Verdict::NeedsFunds { error },
        429 => match retry_after(answer, body.as_ref()) {
            Some(secs) => retry(Wait::Exactly(Duration::from_secs(secs)), error),
            None => retry(Wait::Backoff, error),
        },
        // 408 is a timeout by name: like the timeouts it is retried, not a refusal.
        408 | 500..=599 => retry(Wait::Backoff, error),
        // Answers orderly's order route gives before the business rules (401, 403) or never
        // gives at all (a redirect, 404, 405: a wrong base URL): nothing was decided about
        // this request, so it stays pending for a resume once the setup is fixed.
        401 | 403 | 404 | 405 | 300..=399 => Verdict::Rejected {
            error,
            pending: true,
        },
        _ => Verdict::Rejected {
            error,
            pending: false,
        },
    }
}

/// What `GET /b2b/orders?externalOrderId=` says about an intent past the horizon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    Found { order_id: String },
    NotFound,
    Refused { error: String },
    Retry { wait: Wait, error: String },
}

pub fn judge_lookup_answer(answer: &Answer) -> Lookup {
    let body: Option<Value> = serde_json::from_slice(&answer.body).ok();
    let error = error_text(answer.status, body.as_ref());
    match answer.status {
        200 => match body
            .as_ref()
            .and_then(|b| b.get("orders"))
            .and_then(Value::as_array)
        {
            Some(orders) => match orders
                .first()
                .and_then(|o| o.get("id"))
                .and_then(Value::as_str)
            {
                Some(id) => Lookup::Found {
                    order_id: id.to_string(),
                },
                None => Lookup::NotFound,
            },
            None => Lookup::Retry {
                wait: Wait::Backoff,
                error: "unreadable 200 answer".into(),
            },
        },
        429 => match retry_after(answer, body.as_ref()) {
            Some(secs) => Lookup::Retry {
                wait: Wait::Exactly(Duration::from_secs(secs)),
                error,
            },
            None => Lookup::Retry {
                wait: Wait::Backoff,
                error,
            },
        },
        408 | 500..=599 => Lookup::Retry {
            wait: Wait::Backoff,
            error,
        },
        _ => Lookup::Refused { error },
    }
}

fn retry(wait: Wait, error: String) -> Verdict {
    Verdict::Retry { wait, error }
}

fn retry_after(answer: &Answer, body: Option<&Value>) -> Option<u64> {
    answer.retry_after.or_else(|| {
        body.and_then(|b| b.get("retryAfter"))
            .and_then(Value::as_u64)
    })
}

/// The machine-readable token before the first `": "`, when the error starts with one
/// (`too_many_items: maximum 200 items per order` → `too_many_items`).
pub fn token_of(error: &str) -> Option<&str> {
    let (head, _) = error.split_once(':')?;
    let is_token = !head.is_empty()
        && head
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-');
    is_token.then_some(head)
}

/// The `error` of an outcome: the token when the answer has one, else its whole `error`; for
/// 401 and 403 the `message` (the Origin 403 has none: its whole `error`); for a 422 the first
/// validation problem as `loc: msg`.
pub fn error_text(status: u16, body: Option<&Value>) -> String {
    let field = |name: &str| {
        body.and_then(|b| b.get(name))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    if status == 401 || status == 403 {
        if let Some(message) = field("message").or_else(|| field("error")) {
            return message;
        }
    } else if let Some(error) = field("error") {
        return token_of(&error).map(str::to_string).unwrap_or(error);
    } else if let Some(first) = body
        .and_then(|b| b.get("detail"))
        .and_then(Value::as_array)
        .and_then(|d| d.first())
    {
        let loc: Vec<String> = first
            .get("loc")
            .and_then(Value::as_array)
            .map(|l| {
                l.iter()
                    .map(|p| match p {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let msg = first
            .get("msg")
            .and_then(Value::as_str)
            .unwrap_or("invalid");
        return format!("{}: {msg}", loc.join("."));
    }
    format!("HTTP {status}")
}

/// Capped exponential backoff with jitter ("equal jitter": half fixed, half random, so a
/// retry never comes at once and a crowd of clients spreads out). `failures` counts the
/// transient failures so far, from 1; `unit` is a random number in [0, 1).
pub fn backoff_delay(base: Duration, cap: Duration, failures: u32, unit: f64) -> Duration {
    let exp = base.saturating_mul(1u32 << failures.saturating_sub(1).min(20));
    let full = exp.min(cap);
    let half = full / 2;
    half + half.mul_f64(unit.clamp(0.0, 1.0))
}

/// How long a short pause of the policy lasts; `unit` is a random number in [0, 1).
pub fn pause(wait: Wait, unit: f64) -> Option<Duration> {
    match wait {
        Wait::InProgress => Some(Duration::from_millis(1000 + (1000.0 * unit) as u64)),
        Wait::ConcurrentBalance => Some(Duration::from_millis(100 + (400.0 * unit) as u64)),
        Wait::Exactly(d) => Some(d),
        Wait::Backoff => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn answer(status: u16, body: Value) -> Answer {
        Answer {
            status,
            body: body.to_string().into_bytes(),
            ..Answer::default()
        }
    }

    fn failed(status: u16, error: &str) -> Answer {
        answer(status, json!({"success": false, "error": error}))
    }

    #[test]
    fn a_200_is_placed_and_notes_a_replay() {
        let mut a = answer(200, json!({"success": true, "order": {"id": "ord_1"}}));
        a.replayed = true;
        assert_eq!(
            judge_order_answer(&a),
            Verdict::Placed {
                order_id: "ord_1".into(),
                replayed: true
            }
        );
    }

    #[test]
    fn the_key_reuse_409_is_a_conflict_matched_by_its_token() {
        let v = judge_order_answer(&failed(
            409,
            "idempotency_key_reused_with_different_body: any words",
        ));
        assert_eq!(
            v,
            Verdict::Conflict {
                error: KEY_REUSED.into()
            }
        );
    }

    #[test]
    fn the_in_progress_409_waits_and_retries() {
        let v = judge_order_answer(&failed(409, "Duplicate request in progress, retry later"));
        assert!(matches!(
            v,
            Verdict::Retry {
                wait: Wait::InProgress,
                ..
            }
        ));
    }

    #[test]
    fn the_402s_are_told_apart_by_their_whole_string() {
        for e in ["Insufficient balance", "Exceeds credit limit"] {
            assert_eq!(
                judge_order_answer(&failed(402, e)),
                Verdict::NeedsFunds { error: e.into() }
            );
        }
        assert!(matches!(
            judge_order_answer(&failed(402, "Concurrent balance modification")),
            Verdict::Retry {
                wait: Wait::ConcurrentBalance,
                ..
            }
        ));
    }

    #[test]
    fn a_429_waits_its_retry_after_header_or_else_its_body() {
        let mut a = answer(
            429,
            json!({"success": false, "code": "RATE_LIMITED", "error": "Too many requests. Please try again later.", "retryAfter": 7}),
        );
        assert!(
            matches!(judge_order_answer(&a), Verdict::Retry { wait: Wait::Exactly(d), .. } if d == Duration::from_secs(7))
        );
        a.retry_after = Some(3);
        assert!(
            matches!(judge_order_answer(&a), Verdict::Retry { wait: Wait::Exactly(d), .. } if d == Duration::from_secs(3))
        );
    }

    #[test]
    fn server_errors_back_off_and_other_4xx_are_rejected_with_the_token() {
        assert!(matches!(
            judge_order_answer(&failed(503, "Internal server error")),
            Verdict::Retry {
                wait: Wait::Backoff,
                ..
            }
        ));
        assert_eq!(
            judge_order_answer(&failed(400, "unknown_product: prd_x is not sold")),
            Verdict::Rejected {
                error: "unknown_product".into(),
                pending: false
            }
        );
        assert_eq!(
            judge_order_answer(&failed(400, "Invalid callbackUrl: no host")),
            Verdict::Rejected {
                error: "Invalid callbackUrl: no host".into(),
                pending: false
            }
        );
    }

    #[test]
    fn auth_refusals_use_their_message_and_stay_pending() {
        let a = answer(
            401,
            json!({"error": "Unauthorized", "message": "Invalid or missing API key"}),
        );
        assert_eq!(
            judge_order_answer(&a),
            Verdict::Rejected {
                error: "Invalid or missing API key".into(),
                pending: true
            }
        );
        assert_eq!(
            judge_order_answer(&failed(403, "Forbidden: Origin not allowed")),
            Verdict::Rejected {
                error: "Forbidden: Origin not allowed".into(),
                pending: true
            }
        );
    }

    #[test]
    fn a_wrong_base_url_is_rejected_but_stays_pending() {
        let a = answer(404, json!({"error": "not found"}));
        assert!(matches!(
            judge_order_answer(&a),
            Verdict::Rejected { pending: true, .. }
        ));
    }

    #[test]
    fn a_422_names_the_first_problem_by_its_location() {
        let a = answer(
            422,
            json!({"detail": [{"loc": ["body", "items", 0, "quantity"], "msg": "too big", "type": "range"}]}),
        );
        assert_eq!(
            judge_order_answer(&a),
            Verdict::Rejected {
                error: "body.items.0.quantity: too big".into(),
                pending: false
            }
        );
    }

    #[test]
    fn backoff_grows_to_its_cap_and_never_comes_at_once() {
        let base = Duration::from_millis(100);
        let cap = Duration::from_secs(2);
        assert_eq!(backoff_delay(base, cap, 1, 0.0), Duration::from_millis(50));
        assert_eq!(backoff_delay(base, cap, 1, 0.999).as_millis(), 99);
        assert_eq!(backoff_delay(base, cap, 3, 0.0), Duration::from_millis(200));
        assert_eq!(backoff_delay(base, cap, 30, 0.0), Duration::from_secs(1));
        assert!(backoff_delay(base, cap, 30, 0.999) < cap);
    }

    #[test]
    fn the_lookup_finds_the_newest_order_or_none() {
        let found = answer(
            200,
            json!({"success": true, "orders": [{"id": "ord_9"}], "nextCursor": null}),
        );
        assert_eq!(
            judge_lookup_answer(&found),
            Lookup::Found {
                order_id: "ord_9".into()
            }
        );
        let none = answer(
            200,
            json!({"success": true, "orders": [], "nextCursor": null}),
        );
        assert_eq!(judge_lookup_answer(&none), Lookup::NotFound);
    }
}
