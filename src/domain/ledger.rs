//! Ledger entries: every movement of money is exactly one, so they sum to the balance.

use serde::{Deserialize, Serialize};

use super::money::Cents;
use super::time::Millis;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LedgerReason {
    Order,
    Cancel,
    Refund,
    Credit,
    ProviderPayment,
}

impl LedgerReason {
    pub fn as_str(self) -> &'static str {
        match self {
            LedgerReason::Order => "order",
            LedgerReason::Cancel => "cancel",
            LedgerReason::Refund => "refund",
            LedgerReason::Credit => "credit",
            LedgerReason::ProviderPayment => "provider_payment",
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LedgerEntry {
    pub id: String,
    /// Signed: debits are negative.
    pub amount: Cents,
    pub reason: LedgerReason,
    /// The order, refund or provider payment this movement belongs to (for an admin
    /// credit, the operator's note).
    pub reference: String,
    pub balance_after: Cents,
    pub created_at: Millis,
}
