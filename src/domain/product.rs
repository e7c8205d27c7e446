//! Catalog products, as the admin defines them and orders price them.

use serde::{Deserialize, Serialize};

use super::money::Cents;
use super::time::Millis;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Product {
    pub id: String,
    pub name: String,
    pub price: Cents,
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
