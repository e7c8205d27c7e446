//! `Client`: journal first, then the attempts of the policy, each one recorded.
//!
//! The loop holds no lock while it talks to the server: two processes working on the same
//! pending intent at once send the same bytes under the same key, which the server charges
//! once, so the cost of that race is one extra request, never a second order.

use std::thread;
use std::time::{Duration, Instant, SystemTime};

use crate::basket::{request_bytes, Basket, IntentId, InvalidIntentId};
use crate::journal::{Begun, Entry, Journal, JournalError};
use crate::outcome::{Outcome, OutcomeKind};
use crate::policy::{self, Answer, Lookup, Verdict, Wait};

/// Where and how to call orderly. `Config::new` has the defaults of client/README.md.
#[derive(Clone, Debug)]
pub struct Config {
    /// Base URL of the server, e.g. `https://orders.example.com`.
    pub url: String,
    /// `gc_live_…` with `orders:write` (and `orders:read` for reconciliation).
    pub api_key: String,
    /// Per attempt.
    pub timeout: Duration,
    /// Attempts per intent and run before the outcome is `Unknown`.
    pub max_attempts: u32,
    /// Time per intent and run before the outcome is `Unknown`.
    pub max_time: Duration,
    /// Past this age an intent is never re-sent, only looked up by `externalOrderId`: the
    /// server's key lifetime (24 h) less a margin.
    pub horizon: Duration,
    /// First backoff step after a 5xx, a timeout or a connection error; it doubles up to
    /// `backoff_cap`.
    pub backoff_base: Duration,
    pub backoff_cap: Duration,
}

impl Config {
    pub fn new(url: impl Into<String>, api_key: impl Into<String>) -> Config {
        Config {
            url: url.into(),
            api_key: api_key.into(),
            timeout: Duration::from_secs(30),
            max_attempts: 8,
            max_time: Duration::from_secs(600),
            horizon: Duration::from_secs(23 * 3600),
            backoff_base: Duration::from_millis(500),
            backoff_cap: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error(transparent)]
    InvalidIntent(#[from] InvalidIntentId),
}

pub struct Client {
    config: Config,
    journal: Journal,
    agent: ureq::Agent,
}

/// What one run has learnt about an intent so far.
struct Run {
    deadline: Instant,
    sent: u32,
    transient_failures: u32,
    rate_limit_remaining: Option<u64>,
}

impl Client {
    pub fn new(config: Config, journal: Journal) -> Client {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(config.timeout))
            .http_status_as_error(false)
            // A redirect would re-send (or drop) the body somewhere else: never follow one.
            .max_redirects(0)
            .user_agent(concat!("orderly-client/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Client {
            config,
            journal,
            agent,
        }
    }

    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub(crate) fn agent(&self) -> &ureq::Agent {
        &self.agent
    }

    /// Journals the intent (fsynced) before anything is sent, then places it. An intent that
    /// is already finished answers its journaled outcome and sends nothing; the same intent
    /// with another basket is `IntentChanged` and sends nothing.
    pub fn place_order(&self, intent_id: &str, basket: &Basket) -> Result<Outcome, Error> {
        let intent = IntentId::parse(intent_id)?;
        let bytes = request_bytes(&intent, basket);
        match self.journal.begin(&intent, &bytes)? {
            Begun::Changed(entry) => Ok(Outcome {
                intent: entry.intent,
                outcome: OutcomeKind::IntentChanged,
                order_id: None,
                replayed: false,
                attempts: 0,
                error: Some(
                    "intent_changed: this intent was journaled with another basket; \
                     a new order needs a new intent id"
                        .into(),
                ),
                rate_limit_remaining: None,
            }),
            Begun::Existing(entry) if !entry.pending => Ok(entry.to_outcome()),
            Begun::Existing(entry) | Begun::New(entry) => self.carry_out(entry),
        }
    }

    /// Works every pending intent of the journal once more, oldest first, with its own
    /// key and bytes (or looks it up, past the horizon). Returns what became of each.
    pub fn resume(&self) -> Result<Vec<Outcome>, Error> {
        let mut outcomes = Vec::new();
        for entry in self.journal.entries()? {
            if entry.pending {
                outcomes.push(self.carry_out(entry)?);
            }
        }
        Ok(outcomes)
    }

    fn carry_out(&self, entry: Entry) -> Result<Outcome, Error> {
        let mut run = Run {
            deadline: Instant::now() + self.config.max_time,
            sent: 0,
            transient_failures: 0,
            rate_limit_remaining: None,
        };
        // Another process may have finished it since the caller looked.
        let mut entry = match self.journal.get(&entry.intent)? {
            Some(fresh) if !fresh.pending => return Ok(fresh.to_outcome()),
            Some(fresh) => fresh,
            None => entry,
        };
        loop {
            if self.past_horizon(&entry) {
                return self.reconcile(entry, run);
            }
            if run.sent >= self.config.max_attempts || Instant::now() >= run.deadline {
                return Ok(entry.to_outcome());
            }
            let answer = self.send(&entry);
            run.sent += 1;
            let verdict = match &answer {
                Ok(answer) => {
                    run.rate_limit_remaining =
                        answer.rate_limit_remaining.or(run.rate_limit_remaining);
                    policy::judge_order_answer(answer)
                }
                Err(error) => Verdict::Retry {
                    wait: Wait::Backoff,
                    error: error.to_string(),
                },
            };
            let (kind, pending, order_id, replayed, error) = match &verdict {
                Verdict::Placed { order_id, replayed } => (
                    OutcomeKind::Placed,
                    false,
                    Some(order_id.clone()),
                    *replayed,
                    None,
                ),
                Verdict::Conflict { error } => (
                    OutcomeKind::Conflict,
                    false,
                    None,
                    false,
                    Some(error.clone()),
                ),
                Verdict::NeedsFunds { error } => (
                    OutcomeKind::NeedsFunds,
                    true,
                    None,
                    false,
                    Some(error.clone()),
                ),
                Verdict::Rejected { error, pending } => (
                    OutcomeKind::Rejected,
                    *pending,
                    None,
                    false,
                    Some(error.clone()),
                ),
                Verdict::Retry { error, .. } => {
                    (OutcomeKind::Unknown, true, None, false, Some(error.clone()))
                }
            };
            let remaining = run.rate_limit_remaining;
            entry = self.journal.update(&entry.intent, |e| {
                e.attempts += 1;
                e.outcome = kind;
                e.pending = pending;
                e.order_id = order_id;
                e.replayed = replayed;
                e.error = error;
                e.rate_limit_remaining = remaining.or(e.rate_limit_remaining);
            })?;
            if !entry.pending {
                // Finished now, or by another process while we were sending.
                return Ok(entry.to_outcome());
            }
            let Verdict::Retry { wait, .. } = verdict else {
                return Ok(entry.to_outcome());
            };
            if !self.wait(wait, &mut run) {
                return Ok(entry.to_outcome());
            }
        }
    }

    /// Past the horizon the key may be gone from the server, and the same bytes would buy a
    /// second order: the only safe question left is whether an order carries the intent id.
    fn reconcile(&self, entry: Entry, mut run: Run) -> Result<Outcome, Error> {
        let mut asked = 0;
        loop {
            if asked >= self.config.max_attempts || Instant::now() >= run.deadline {
                return Ok(entry.to_outcome());
            }
            let answer = self.look_up(&entry.intent);
            asked += 1;
            let lookup = match &answer {
                Ok(answer) => {
                    run.rate_limit_remaining =
                        answer.rate_limit_remaining.or(run.rate_limit_remaining);
                    policy::judge_lookup_answer(answer)
                }
                Err(error) => Lookup::Retry {
                    wait: Wait::Backoff,
                    error: error.to_string(),
                },
            };
            let remaining = run.rate_limit_remaining;
            let record = |kind, pending, order_id: Option<String>, error: Option<String>| {
                self.journal.update(&entry.intent, |e| {
                    e.outcome = kind;
                    e.pending = pending;
                    e.order_id = order_id;
                    e.replayed = false;
                    e.error = error;
                    e.rate_limit_remaining = remaining.or(e.rate_limit_remaining);
                })
            };
            match lookup {
                Lookup::Found { order_id } => {
                    return Ok(
                        record(OutcomeKind::Placed, false, Some(order_id), None)?.to_outcome()
                    )
                }
                Lookup::NotFound => {
                    let why = "expired: past the horizon and no order carries this intent id \
                               as its externalOrderId; it was not re-sent";
                    return Ok(
                        record(OutcomeKind::Expired, false, None, Some(why.into()))?.to_outcome()
                    );
                }
                Lookup::Refused { error } => {
                    return Ok(record(OutcomeKind::Rejected, true, None, Some(error))?.to_outcome())
                }
                Lookup::Retry { wait, error } => {
                    let entry = record(OutcomeKind::Unknown, true, None, Some(error))?;
                    if !entry.pending || !self.wait(wait, &mut run) {
                        return Ok(entry.to_outcome());
                    }
                }
            }
        }
    }

    /// Sleeps as the policy says; false when the budget would run out first (then there is
    /// no point in waiting).
    fn wait(&self, wait: Wait, run: &mut Run) -> bool {
        if run.sent >= self.config.max_attempts {
            return false;
        }
        let delay = policy::pause(wait, fastrand::f64()).unwrap_or_else(|| {
            run.transient_failures += 1;
            policy::backoff_delay(
                self.config.backoff_base,
                self.config.backoff_cap,
                run.transient_failures,
                fastrand::f64(),
            )
        });
        if Instant::now() + delay >= run.deadline {
            return false;
        }
        thread::sleep(delay);
        true
    }

    fn past_horizon(&self, entry: &Entry) -> bool {
        SystemTime::now()
            .duration_since(entry.created_at())
            .is_ok_and(|age| age >= self.config.horizon)
    }

    fn endpoint(&self, path: &str) -> String {
        format!("{}{path}", self.config.url.trim_end_matches('/'))
    }

    fn send(&self, entry: &Entry) -> Result<Answer, Unanswered> {
        let response = self
            .agent
            .post(self.endpoint("/b2b/orders"))
            .header("X-Api-Key", &self.config.api_key)
            .header("X-Idempotency-Key", &entry.key)
            .header("Content-Type", "application/json")
            .header("Accept", "application/json")
            .send(entry.request.as_bytes());
        answer_of(response)
    }

    fn look_up(&self, intent: &str) -> Result<Answer, Unanswered> {
        let response = self
            .agent
            .get(self.endpoint("/b2b/orders"))
            .query("externalOrderId", intent)
            .query("limit", "1")
            .header("X-Api-Key", &self.config.api_key)
            .header("Accept", "application/json")
            .call();
        answer_of(response)
    }
}

/// Why a request got no answer: it may or may not have been applied, so it is retried with
/// the same key.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Unanswered {
    #[error("timeout")]
    Timeout,
    #[error("connection: {0}")]
    Connection(ureq::Error),
}

pub(crate) fn answer_of(
    response: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
) -> Result<Answer, Unanswered> {
    let mut response = response.map_err(transport_error)?;
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim().to_string())
    };
    let retry_after = header("retry-after").and_then(|v| v.parse().ok());
    let rate_limit_remaining = header("x-ratelimit-remaining").and_then(|v| v.parse().ok());
    let replayed = header("idempotency-replayed").is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let status = response.status().as_u16();
    let body = response
        .body_mut()
        .with_config()
        .limit(1 << 20)
        .read_to_vec()
        .map_err(transport_error)?;
    Ok(Answer {
        status,
        body,
        retry_after,
        rate_limit_remaining,
        replayed,
    })
}

fn transport_error(error: ureq::Error) -> Unanswered {
    match error {
        ureq::Error::Timeout(_) => Unanswered::Timeout,
        other => Unanswered::Connection(other),
    }
}
