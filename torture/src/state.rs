//! The model's memory during a run: the accounts and keys made at setup, every idempotency
//! key's record (model.rs judges them), the secrets each account has had, and the unkeyed
//! writes (revocations, account creations, rotations, provider payments) with their answers.

use crate::model::{Keys, Unkeyed};
use std::collections::{HashMap, HashSet};
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
    pub revokes: Unkeyed,
}

#[derive(Clone, Debug)]
pub struct Provider {
    pub account: usize,
    pub amount: i64,
    pub body: Vec<u8>,
    pub acked: bool,
    pub answers: Unkeyed,
}

/// The secrets an account has had, as far as the model knows: `current` is None after a
/// rotation whose answer was lost, until a read tells.
#[derive(Clone, Debug, Default)]
pub struct Secrets {
    pub all: Vec<String>,
    pub current: Option<String>,
}

/// What a client's poller of `/b2b/events?after=` has seen, in order.
#[derive(Clone, Debug, Default)]
pub struct Poller {
    pub account: usize,
    pub seen: Vec<String>,
}

#[derive(Default)]
pub struct State {
    pub accounts: RwLock<Vec<Account>>,
    pub keys: Mutex<Keys>,
    pub revocables: Mutex<HashMap<String, Revocable>>,
    /// Account creations of the run, by name.
    pub created: Mutex<HashMap<String, Unkeyed>>,
    pub secrets: Mutex<HashMap<usize, Secrets>>,
    pub providers: Mutex<HashMap<String, Provider>>,
    /// Orders cancelled by a 200 without a key (keyed cancels are in `keys`).
    pub cancelled: Mutex<HashSet<String>>,
    pub pollers: Mutex<Vec<Poller>>,
    /// Events with a callback, by account, for redeliveries.
    pub callback_events: Mutex<HashMap<usize, Vec<String>>>,
    /// The prefill's orders (acknowledged keys kept compactly).
    pub prefill_keys: Mutex<Vec<PrefillKey>>,
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
    pub fn account(&self, idx: usize) -> Account {
        self.accounts.read().unwrap()[idx].clone()
    }

    pub fn account_count(&self) -> usize {
        self.accounts.read().unwrap().len()
    }

    pub fn add_secret(&self, account: usize, secret: &str, current: bool) {
        let mut s = self.secrets.lock().unwrap();
        let e = s.entry(account).or_default();
        if !e.all.iter().any(|x| x == secret) {
            e.all.push(secret.to_string());
        }
        if current {
            e.current = Some(secret.to_string());
        }
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
