//! Ledger entries: every movement of money is exactly one, so they sum to the balance.

use serde::{Deserialize, Serialize};

use super::money::Cents;
use super::time::Millis;

/// Why money moved, as a ledger entry records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LedgerReason {
    /// An order's debit.
    Order,
    /// A cancelled order's amount returned.
    Cancel,
    /// A refund returned.
    Refund,
    /// An operator's credit.
    Credit,
    /// A payment notified by a payment provider.
    ProviderPayment,
}

impl LedgerReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            LedgerReason::Order => "order",
            LedgerReason::Cancel => "cancel",
            LedgerReason::Refund => "refund",
            LedgerReason::Credit => "credit",
            LedgerReason::ProviderPayment => "provider_payment",
        }
    }
}

/// One movement of an account's money; an account's entries sum to its balance.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LedgerEntry {
    pub(crate) id: String,
    /// Signed: debits are negative.
    pub amount: Cents,
    pub(crate) reason: LedgerReason,
    /// The order, refund or provider payment this movement belongs to (for an admin
    /// credit, the operator's note).
    pub reference: String,
    /// The account's balance right after this movement.
    pub balance_after: Cents,
    pub(crate) created_at: Millis,
    /// Its place in the account's ledger: 1, 2, 3 ... without gaps (`chain.rs`). Kept beside
    /// the fields above, never among them (`#[serde(skip)]`): earlier builds read the
    /// entry's bytes without it.
    #[serde(skip)]
    pub(crate) seq: u64,
    /// SHA-256 over the entry and `previous_hash` (`chain::entry_hash`).
    #[serde(skip)]
    pub(crate) hash: [u8; 32],
    /// The hash of the entry before it, or the account's genesis. Never stored: it is the
    /// entry before's `hash`, filled in where entries are read in order.
    #[serde(skip)]
    pub(crate) previous_hash: [u8; 32],
}
