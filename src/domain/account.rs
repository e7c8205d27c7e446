//! Accounts, API-key scopes and the one money rule: how far a balance may fall.

use serde::{Deserialize, Serialize};

use super::ids::AccountId;
use super::money::Cents;
use super::time::Millis;

/// A partner's account: who may order, in which region, and how far its balance may fall.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Account {
    /// The account's id (`acc_…`).
    pub id: AccountId,
    /// The partner's name, as the operator entered it.
    pub name: String,
    /// Whether the account may place orders at all.
    pub wholesale: bool,
    /// How far below zero the balance may go; 0 means prepaid only.
    pub credit_limit: Cents,
    /// The region whose products it may order; `None`: any region.
    pub region: Option<String>,
    /// `whsec_<base64>`: the key that signs this account's callbacks.
    pub webhook_secret: String,
    /// When the account was created.
    pub created_at: Millis,
}

/// What an API key may do, one route group each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Scope {
    /// Place, cancel and refund orders.
    OrdersWrite,
    /// Read orders and events.
    OrdersRead,
    /// Read the balance and the ledger.
    BalanceRead,
    /// Read the catalog.
    CatalogRead,
}

impl Scope {
    pub(crate) const ALL: [Scope; 4] = [
        Scope::OrdersWrite,
        Scope::OrdersRead,
        Scope::BalanceRead,
        Scope::CatalogRead,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Scope::OrdersWrite => "orders:write",
            Scope::OrdersRead => "orders:read",
            Scope::BalanceRead => "balance:read",
            Scope::CatalogRead => "catalog:read",
        }
    }

    pub(crate) fn parse(text: &str) -> Option<Self> {
        Scope::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

/// What is stored for an API key: never the key itself, only its SHA-256 (the tree key).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ApiKeyRecord {
    /// The key's public id (`key_…`), by which it is listed and revoked.
    pub id: String,
    /// The account the key acts for.
    pub account_id: AccountId,
    /// What the key may do.
    pub scopes: Vec<Scope>,
    /// Whether the key was revoked: it authenticates nothing any more.
    pub revoked: bool,
    /// When the key was created.
    pub created_at: Millis,
    /// The instant from which the key authenticates nothing (`expiresAt`), if it was given
    /// an end. Not in the record's serde form: each storage keeps it beside the record (sled
    /// after the record's bytes, where earlier builds do not look; PostgreSQL in a column of
    /// its own; a backup in the key's line), so a record an earlier build wrote reads as a key
    /// without an end, and an earlier build reads a key with one.
    #[serde(skip)]
    pub expires_at: Option<Millis>,
}

impl ApiKeyRecord {
    /// Whether the key authenticates at `now`: not revoked, and before its end. Every instance
    /// judges an end by its own now, which instances sharing a database take from its clock.
    pub(crate) fn authenticates_at(&self, now: Millis) -> bool {
        !self.revoked && self.expires_at.is_none_or(|end| now < end)
    }
}

/// Why a debit cannot be made; each maps to its own 402.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shortfall {
    /// A prepaid account (no credit limit) whose balance does not cover the debit.
    InsufficientBalance,
    /// An account on credit that the debit would take past its limit.
    ExceedsCreditLimit,
}

/// The balance after taking `total`, if the account may go that low.
pub(crate) fn debit(balance: Cents, credit_limit: Cents, total: Cents) -> Result<Cents, Shortfall> {
    let refuse = if credit_limit.is_positive() {
        Shortfall::ExceedsCreditLimit
    } else {
        Shortfall::InsufficientBalance
    };
    match balance.checked_sub(total) {
        Some(after) if after >= -credit_limit => Ok(after),
        _ => Err(refuse),
    }
}

/// A fresh Standard Webhooks secret: `whsec_` and the base64 of 32 random bytes.
pub(crate) fn new_webhook_secret() -> String {
    use base64::Engine;
    let bytes = super::ids::random_bytes(32);
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

/// Only the SHA-256 of a key is ever stored or looked up.
pub fn hash_api_key(plaintext: &str) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    Sha256::digest(plaintext.as_bytes()).into()
}

/// A fresh partner API key: `gc_live_` and 32 lowercase hex digits (122 random bits).
pub fn new_api_key() -> String {
    format!("gc_live_{}", super::ids::random_hex())
}

#[cfg(test)]
impl Account {
    /// A wholesale account with no credit line, for unit tests.
    pub(crate) fn for_tests(credit_limit: i64) -> Account {
        Account {
            id: super::ids::AccountId::new(),
            name: "a".into(),
            wholesale: true,
            credit_limit: Cents(credit_limit),
            region: None,
            webhook_secret: "whsec_x".into(),
            created_at: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `debit` on bare numbers, to keep the cases readable.
    fn debit(balance: i64, limit: i64, total: i64) -> Result<i64, Shortfall> {
        super::debit(Cents(balance), Cents(limit), Cents(total)).map(|after| after.0)
    }

    #[test]
    fn a_prepaid_account_may_reach_zero_but_not_below() {
        assert_eq!(debit(100, 0, 100), Ok(0));
        assert_eq!(debit(100, 0, 101), Err(Shortfall::InsufficientBalance));
    }

    #[test]
    fn a_credit_line_may_be_used_to_its_limit() {
        assert_eq!(debit(100, 50, 150), Ok(-50));
        assert_eq!(debit(100, 50, 151), Err(Shortfall::ExceedsCreditLimit));
    }

    #[test]
    fn an_overflowing_debit_is_refused_not_wrapped() {
        assert_eq!(
            debit(i64::MIN + 1, 0, i64::MAX),
            Err(Shortfall::InsufficientBalance)
        );
    }

    fn key(revoked: bool, expires_at: Option<Millis>) -> ApiKeyRecord {
        ApiKeyRecord {
            id: "key_x".into(),
            account_id: AccountId::new(),
            scopes: Scope::ALL.to_vec(),
            revoked,
            created_at: 0,
            expires_at,
        }
    }

    #[test]
    fn a_key_with_an_end_authenticates_until_the_millisecond_before_it() {
        let end = 1_800_000_000_000;
        assert!(key(false, Some(end)).authenticates_at(end - 1));
        assert!(!key(false, Some(end)).authenticates_at(end));
        assert!(!key(false, Some(end)).authenticates_at(u64::MAX));
    }

    #[test]
    fn a_key_without_an_end_authenticates_at_every_instant_until_revoked() {
        for now in [0, 1, 1_800_000_000_000, u64::MAX] {
            assert!(key(false, None).authenticates_at(now));
            assert!(!key(true, None).authenticates_at(now));
            assert!(!key(true, Some(u64::MAX)).authenticates_at(now));
        }
    }

    #[test]
    fn an_end_at_the_ends_of_time_is_judged_without_overflow() {
        assert!(!key(false, Some(0)).authenticates_at(0));
        assert!(key(false, Some(u64::MAX)).authenticates_at(u64::MAX - 1));
        assert!(!key(false, Some(u64::MAX)).authenticates_at(u64::MAX));
    }
}
