//! Catalog products, as the admin defines them and orders price them.

use serde::{Deserialize, Serialize};

use super::money::Cents;
use super::time::Millis;

/// A catalog product: what it costs, where it is sold and which delivery fields it asks for.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Product {
    /// The operator's id of the product, as orders name it.
    pub id: String,
    /// Its name, as the catalog shows it.
    pub name: String,
    /// Its unit price.
    pub price: Cents,
    /// Empty: sold everywhere.
    pub regions: Vec<String>,
    /// Keys of `deliveryData` an order line must fill (non-blank).
    pub delivery_fields: Vec<String>,
    /// Whether it may be ordered and is listed; an inactive product is kept for the orders that
    /// name it.
    pub active: bool,
    /// When the operator last changed it.
    pub updated_at: Millis,
}

impl Product {
    pub(crate) fn sold_in(&self, region: Option<&str>) -> bool {
        self.regions.is_empty() || region.is_some_and(|r| self.regions.iter().any(|p| p == r))
    }
}
