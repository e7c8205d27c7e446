//! The business rules of a basket: which lines may be sold to this account, and at what total.

use std::collections::BTreeMap;

use super::money::Cents;
use super::order::OrderLine;
use super::product::Product;

use super::limits::MAX_LINES;

/// One requested line, after the schema has been checked.
#[derive(Clone, Debug)]
pub struct RequestedLine {
    /// The catalog product ordered.
    pub product_id: String,
    /// How many of it.
    pub quantity: u64,
    /// The delivery fields the product asks for, by name.
    pub delivery_data: BTreeMap<String, String>,
}

/// A 400 from the business rules; `message` is the partner-facing `token: sentence`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BasketRejection {
    /// More lines than an order may have.
    TooManyItems,
    /// No active product with this id.
    UnknownProduct(String),
    /// This product is not sold in the account's region.
    RegionNotAllowed(String),
    /// This product costs nothing, which an order may not contain.
    ZeroPriceItem(String),
    /// A delivery field the product asks for is missing or blank.
    InvalidDeliveryData {
        /// The product of the line.
        product_id: String,
        /// The field missing.
        field: String,
    },
    /// The order's total would not fit.
    TotalTooLarge,
}

/// Prices every line from the catalog as `lookup` sees it, applying the rules in the
/// documented order. `lookup` is fallible so it can read inside a storage transaction.
pub(crate) fn price_basket<E>(
    lines: &[RequestedLine],
    region: Option<&str>,
    mut lookup: impl FnMut(&str) -> Result<Option<Product>, E>,
) -> Result<Result<(Vec<OrderLine>, Cents), BasketRejection>, E> {
    if lines.len() > MAX_LINES {
        return Ok(Err(BasketRejection::TooManyItems));
    }
    // Each rule is checked over the whole basket before the next, so a basket with several
    // faults is refused for the first rule in the documented order, whatever the line order.
    let mut products = Vec::with_capacity(lines.len());
    for line in lines {
        let id = line.product_id.trim();
        match lookup(id)? {
            Some(p) if p.active => products.push(p),
            _ => return Ok(Err(BasketRejection::UnknownProduct(id.to_string()))),
        }
    }
    if let Some(p) = products.iter().find(|p| !p.sold_in(region)) {
        return Ok(Err(BasketRejection::RegionNotAllowed(p.id.clone())));
    }
    if let Some(p) = products.iter().find(|p| !p.price.is_positive()) {
        return Ok(Err(BasketRejection::ZeroPriceItem(p.id.clone())));
    }
    for (line, product) in lines.iter().zip(&products) {
        let missing = product.delivery_fields.iter().find(|f| {
            line.delivery_data
                .get(f.as_str())
                .is_none_or(|v| v.trim().is_empty())
        });
        if let Some(field) = missing {
            return Ok(Err(BasketRejection::InvalidDeliveryData {
                product_id: product.id.clone(),
                field: field.clone(),
            }));
        }
    }
    let mut priced = Vec::with_capacity(lines.len());
    let mut total = Cents::ZERO;
    for (line, product) in lines.iter().zip(&products) {
        let amount = product.price.times(line.quantity);
        let Some((amount, sum)) = amount.and_then(|a| Some((a, total.checked_add(a)?))) else {
            return Ok(Err(BasketRejection::TotalTooLarge));
        };
        total = sum;
        priced.push(OrderLine {
            product_id: product.id.clone(),
            quantity: line.quantity,
            delivery_data: line.delivery_data.clone(),
            unit_price: product.price,
            amount,
        });
    }
    Ok(Ok((priced, total)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    fn product(id: &str, price: i64, regions: &[&str], fields: &[&str]) -> Product {
        Product {
            id: id.into(),
            name: id.into(),
            price: Cents(price),
            regions: regions.iter().map(|s| s.to_string()).collect(),
            delivery_fields: fields.iter().map(|s| s.to_string()).collect(),
            active: true,
            updated_at: 0,
        }
    }

    fn catalog() -> Vec<Product> {
        vec![
            product("prd_uc", 999, &[], &["username"]),
            product("prd_us", 500, &["US"], &[]),
            product("prd_free", 0, &[], &[]),
            product("prd_big", 1_000_000_000_000, &[], &[]),
        ]
    }

    fn line(id: &str, quantity: u64, data: &[(&str, &str)]) -> RequestedLine {
        RequestedLine {
            product_id: id.into(),
            quantity,
            delivery_data: data
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn price(lines: &[RequestedLine]) -> Result<(Vec<OrderLine>, Cents), BasketRejection> {
        let catalog = catalog();
        price_basket::<Infallible>(lines, Some("EU"), |id| {
            Ok(catalog.iter().find(|p| p.id == id).cloned())
        })
        .unwrap()
    }

    #[test]
    fn lines_are_priced_and_summed() {
        let (lines, total) = price(&[line(" prd_uc ", 2, &[("username", "@p")])]).unwrap();
        assert_eq!(
            (lines[0].amount, total, lines[0].product_id.as_str()),
            (Cents(1998), Cents(1998), "prd_uc")
        );
    }

    #[test]
    fn each_rule_gives_its_refusal() {
        let refused = |l| price(&[l]).unwrap_err();
        assert!(matches!(
            refused(line("prd_nope", 1, &[])),
            BasketRejection::UnknownProduct(_)
        ));
        assert!(matches!(
            refused(line("prd_us", 1, &[])),
            BasketRejection::RegionNotAllowed(_)
        ));
        assert!(matches!(
            refused(line("prd_free", 1, &[])),
            BasketRejection::ZeroPriceItem(_)
        ));
        for blank in [&[("username", "  ")][..], &[]] {
            assert!(matches!(
                refused(line("prd_uc", 1, blank)),
                BasketRejection::InvalidDeliveryData { .. }
            ));
        }
    }

    #[test]
    fn the_first_rule_in_the_documented_order_wins_whatever_the_line_order() {
        let lines = [line("prd_us", 1, &[]), line("prd_nope", 1, &[])];
        assert!(matches!(
            price(&lines).unwrap_err(),
            BasketRejection::UnknownProduct(_)
        ));
    }

    #[test]
    fn more_than_200_lines_are_refused() {
        let lines = vec![line("prd_big", 1, &[]); 201];
        assert_eq!(price(&lines).unwrap_err(), BasketRejection::TooManyItems);
    }

    #[test]
    fn a_total_that_does_not_fit_is_refused() {
        let lines = vec![line("prd_big", 1_000_000, &[]); 10];
        assert_eq!(price(&lines).unwrap_err(), BasketRejection::TotalTooLarge);
    }
}
