//! Orders as stored: their lines priced at commit, their status and their money.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use super::ids::{AccountId, OrderId};
use super::money::Cents;
use super::time::Millis;

/// Where an order is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OrderStatus {
    /// Placed and paid, not yet fulfilled: it may be cancelled.
    Processing,
    /// Fulfilled: it may be refunded.
    Completed,
    /// Cancelled, its amount returned to the balance.
    Cancelled,
}

impl OrderStatus {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            OrderStatus::Processing => "processing",
            OrderStatus::Completed => "completed",
            OrderStatus::Cancelled => "cancelled",
        }
    }
}

/// One line of an order, priced when the order was placed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderLine {
    pub(crate) product_id: String,
    pub(crate) quantity: u64,
    pub(crate) delivery_data: BTreeMap<String, String>,
    pub(crate) unit_price: Cents,
    pub(crate) amount: Cents,
}

/// An order as stored: its lines, its money and its status.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Order {
    /// The order's id (`ord_…`).
    pub id: OrderId,
    pub(crate) account_id: AccountId,
    /// Where the order is in its life.
    pub status: OrderStatus,
    pub(crate) items: Vec<OrderLine>,
    /// What the order cost, in the account's currency.
    pub total: Cents,
    pub(crate) currency: String,
    pub(crate) callback_url: Option<String>,
    pub(crate) external_order_id: Option<String>,
    /// Minor units refunded so far; never more than `total`.
    pub refunded: Cents,
    pub(crate) created_at: Millis,
    pub(crate) updated_at: Millis,
}

impl Order {
    pub(crate) fn refundable(&self) -> Cents {
        self.total - self.refunded
    }
}

/// A refund of part or all of an order.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Refund {
    pub(crate) id: String,
    pub(crate) order_id: OrderId,
    pub(crate) amount: Cents,
    pub(crate) reason: Option<String>,
    pub(crate) created_at: Millis,
}

/// A balance as partners see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BalanceView {
    pub(crate) available: Cents,
    pub(crate) credit_limit: Cents,
    pub(crate) currency: String,
}
