//! The product catalog: the admin's upserts and the partners' paginated reads.

use std::ops::Bound;

use super::codec;
use super::spooled::Spooled;
use super::trees::Trees;
use crate::domain::product::Product;
use crate::store::{Page, StoreError};

impl Trees {
    pub(super) fn put_product(&self, product: &Product) -> Result<(), StoreError> {
        self.changes.put(
            Spooled::Product,
            &self.products,
            product.id.as_bytes(),
            codec::encode(product)?,
        )
    }

    pub(super) fn product(&self, id: &str) -> Result<Option<Product>, StoreError> {
        Trees::get(&self.products, id.as_bytes())
    }

    /// Active products in id order, strictly after the cursor (a product id).
    pub(super) fn active_products_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page<Product>, StoreError> {
        let start = match after {
            Some(id) => Bound::Excluded(id.as_bytes().to_vec()),
            None => Bound::Unbounded,
        };
        let mut items: Vec<Product> = Vec::with_capacity(limit + 1);
        for entry in self.products.range::<Vec<u8>, _>((start, Bound::Unbounded)) {
            let (_, bytes) = entry?;
            let product: Product = codec::decode(&bytes)?;
            if product.active {
                items.push(product);
                if items.len() > limit {
                    break;
                }
            }
        }
        let next_cursor = if items.len() > limit {
            items.truncate(limit);
            items.last().map(|p| p.id.clone())
        } else {
            None
        };
        Ok(Page { items, next_cursor })
    }
}
