//! Catalog products, as the admin defines them and orders price them.

use serde::{Deserialize, Serialize};

use super::time::Millis;

/// A price is 1 to 10^12 minor units; 0 is storable only so an order can refuse it.
pub const MAX_PRICE: i64 = 1_000_000_000_000;
pub const MAX_PRODUCT_ID_LEN: usize = 64;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Product {
    pub id: String,
    pub name: String,
    pub price: i64,
    /// Empty: sold everywhere.
    pub regions: Vec<String>,
    /// Keys of `deliveryData` an order line must fill (non-blank).
    pub delivery_fields: Vec<String>,
    pub active: bool,
    pub updated_at: Millis,
}

impl Product {
    pub fn sold_in(&self, region: Option<&str>) -> bool {
        self.regions.is_empty() || region.is_some_and(|r| self.regions.iter().any(|p| p == r))
    }
}
