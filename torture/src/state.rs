//! The model's memory during a run: the accounts and keys made at setup, every idempotency
//! key's record (model.rs judges them), the secrets each account has had, and the unkeyed
//! writes (revocations, account creations, rotations, provider payments) with their answers,
//! and the rewinds of the database (each answer's span is judged against them: model.rs).

use crate::model::{Keys, Rewinds, Span, Unkeyed};
use std::collections::HashMap;
use std::sync::{Mutex, RwLock};

#[derive(Clone, Debug)]
pub struct Account {
    pub idx: usize,
    pub id: String,
    pub region: &'static str,
    /// One all-scope API key per client (made at setup, never revoked).
    pub client_keys: Vec<String>,
    /// The one client that rotates this account's secret (so a 503 can be checked exactly).
    pub rotation_owner: Option<usize>,
}

/// A key made by a client for the revocation ops.
#[derive(Clone, Debug)]
pub struct Revocable {
    pub key_id: String,
    pub plaintext: String,
    /// The creation's 200.
    pub created: Span,
    pub revokes: Unkeyed,
}

#[derive(Clone, Debug)]
pub struct Provider {
    pub account: usize,
    pub amount: i64,
    pub body: Vec<u8>,
    /// Every answer (its 200s with their spans).
    pub answers: Unkeyed,
}

/// The secrets an account has had, as far as the model knows: `current` is None after a
/// rotation whose answer was lost, until a read tells; `current_at` the span of the answer
/// that told it (a rewind may undo it: `State::current_secret`).
#[derive(Clone, Debug, Default)]
pub struct Secrets {
    pub all: Vec<String>,
    pub current: Option<String>,
    pub current_at: Option<Span>,
    /// The rotations answered 200: the secret and the answer's span.
    pub rotations: Vec<(String, Span)>,
}

/// What a client's poller of `/b2b/events?after=` has seen, in order.
#[derive(Clone, Debug, Default)]
pub struct Poller {
    pub account: usize,
    pub seen: Vec<String>,
    /// The span of the answer that listed each of `seen`.
    pub seen_at: Vec<Span>,
    /// The span of the answer that moved its cursor last (a rewind may have lost the event
    /// it points at).
    pub cursor_at: Option<Span>,
    /// Times it started over from the beginning after a rewind.
    pub restarts: u32,
}

/// What the server answered to `after=` of an event a rewind may have lost (a poller's cursor,
/// sent once before the poller starts over).
#[derive(Clone, Debug)]
pub struct CursorProbe {
    pub account: usize,
    pub cursor: String,
    pub at_ms: u64,
    pub answer: String,
}

/// A ledger head a balance answered (`ledgerHead`), to be found on the chain at the end.
#[derive(Clone, Debug)]
pub struct SeenHead {
    pub account: usize,
    pub seq: u64,
    pub hash: String,
    pub span: Span,
}

/// Heads kept at most: past it the rest are not kept (and counted).
pub const MAX_SEEN_HEADS: usize = 50_000;

#[derive(Default)]
pub struct State {
    pub accounts: RwLock<Vec<Account>>,
    /// Ledger heads answered during the run (at most `MAX_SEEN_HEADS`), and how many more.
    pub heads: Mutex<(Vec<SeenHead>, u64)>,
    pub keys: Mutex<Keys>,
    pub revocables: Mutex<HashMap<String, Revocable>>,
    /// Account creations of the run, by name.
    pub created: Mutex<HashMap<String, Unkeyed>>,
    pub secrets: Mutex<HashMap<usize, Secrets>>,
    pub providers: Mutex<HashMap<String, Provider>>,
    /// Orders cancelled by a 200 without a key (keyed cancels are in `keys`), with the span of
    /// the first such 200.
    pub cancelled: Mutex<HashMap<String, Span>>,
    pub pollers: Mutex<Vec<Poller>>,
    /// Events with a callback, by account, for redeliveries: the id and the span of the
    /// listing that showed it.
    pub callback_events: Mutex<HashMap<usize, Vec<(String, Span)>>>,
    /// The database's rewinds (history-rewind faults).
    pub rewinds: RwLock<Rewinds>,
    /// Answers to `after=` of a cursor a rewind may have lost.
    pub cursor_probes: Mutex<Vec<CursorProbe>>,
    /// The prefill's orders (acknowledged keys kept compactly).
    pub prefill_keys: Mutex<Vec<PrefillKey>>,
    /// near-limits: each client's own accounts (empty in other profiles).
    pub edge: RwLock<Vec<EdgeSet>>,
    /// near-limits: writes refused by a rule, which the end checks are absent.
    pub edge_refused: Mutex<Vec<Refused>>,
}

/// near-limits: one client's own accounts (indexes into the accounts), which no other client
/// writes to, so that the model knows each balance exactly: one with no credit line, one with
/// the largest (10^12), and one carried over from an earlier deployment with a balance near
/// i64's end.
#[derive(Clone, Copy, Debug)]
pub struct EdgeSet {
    pub plain: usize,
    pub credit: usize,
    pub rich: usize,
}

/// near-limits: a write refused by a rule (nothing written), which must never show: the
/// account, what (`order`: its externalOrderId; `credit`: its reference; `provider`: its id),
/// and that reference.
#[derive(Clone, Debug)]
pub struct Refused {
    pub account: usize,
    pub what: &'static str,
    pub reference: String,
    pub why: String,
}

/// A key of the prefill: kept apart (compactly) so the end replays a sample of them.
#[derive(Clone, Debug)]
pub struct PrefillKey {
    pub key: String,
    pub body: Vec<u8>,
    pub digest: [u8; 32],
    pub order_id: String,
    pub total: i64,
    pub seq: u64,
}

impl State {
    /// Keeps the head a balance of `account` answered at `span`.
    pub fn saw_head(&self, account: usize, body: &serde_json::Value, span: Span) {
        let head = &body["ledgerHead"];
        let (Some(seq), Some(hash)) = (head["seq"].as_u64(), head["hash"].as_str()) else {
            return;
        };
        let mut heads = self.heads.lock().unwrap();
        if heads.0.len() < MAX_SEEN_HEADS {
            let hash = hash.to_string();
            heads.0.push(SeenHead {
                account,
                seq,
                hash,
                span,
            });
        } else {
            heads.1 += 1;
        }
    }

    pub fn account(&self, idx: usize) -> Account {
        self.accounts.read().unwrap()[idx].clone()
    }

    pub fn account_count(&self) -> usize {
        self.accounts.read().unwrap().len()
    }

    /// A secret the account has (had); `current`: the span of the answer that says it is the
    /// current one (None: not known to be current; `Some((0, 0))`: at setup).
    pub fn add_secret(&self, account: usize, secret: &str, current: Option<Span>) {
        let mut s = self.secrets.lock().unwrap();
        let e = s.entry(account).or_default();
        if !e.all.iter().any(|x| x == secret) {
            e.all.push(secret.to_string());
        }
        if let Some(at) = current {
            e.current = Some(secret.to_string());
            e.current_at = Some(at);
        }
    }

    /// The account's current secret as far as the model knows, unless a rewind may have undone
    /// what told it.
    pub fn current_secret(&self, account: usize) -> Option<String> {
        let rw = self.rewinds();
        let s = self.secrets.lock().unwrap();
        let e = s.get(&account)?;
        if e.current_at.is_some_and(|at| rw.at_risk(at)) {
            return None;
        }
        e.current.clone()
    }

    /// The rewinds so far (a copy: every rule takes them as they are at its answer).
    pub fn rewinds(&self) -> Rewinds {
        self.rewinds.read().unwrap().clone()
    }

    pub fn secrets_of(&self, account: usize) -> Vec<String> {
        self.secrets
            .lock()
            .unwrap()
            .get(&account)
            .map(|s| s.all.clone())
            .unwrap_or_default()
    }
}
