//! Orders as stored: their lines priced at commit, their status and their money.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use super::ids::{AccountId, OrderId};
use super::money::Cents;
use super::time::Millis;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OrderStatus {
    Processing,
    Completed,
    Cancelled,
}

impl OrderStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::Processing => "processing",
            OrderStatus::Completed => "completed",
            OrderStatus::Cancelled => "cancelled",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderLine {
    pub product_id: String,
    pub quantity: u64,
    pub delivery_data: BTreeMap<String, String>,
    pub unit_price: Cents,
    pub amount: Cents,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Order {
    pub id: OrderId,
    pub account_id: AccountId,
    pub status: OrderStatus,
    pub items: Vec<OrderLine>,
    pub total: Cents,
    pub currency: String,
    pub callback_url: Option<String>,
    pub external_order_id: Option<String>,
    /// Minor units refunded so far; never more than `total`.
    pub refunded: Cents,
    pub created_at: Millis,
    pub updated_at: Millis,
}

impl Order {
    pub fn refundable(&self) -> Cents {
        self.total - self.refunded
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Refund {
    pub id: String,
    pub order_id: OrderId,
    pub amount: Cents,
    pub reason: Option<String>,
    pub created_at: Millis,
}

/// A balance as partners see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BalanceView {
    pub available: Cents,
    pub credit_limit: Cents,
    pub currency: String,
}
