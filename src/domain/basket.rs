//! The business rules of a basket: which lines may be sold to this account, and at what total.

use std::collections::BTreeMap;

use super::order::OrderLine;
use super::product::Product;

pub const MAX_LINES: usize = 200;

/// One requested line, after the schema has been checked.
#[derive(Clone, Debug)]
pub struct RequestedLine {
    pub product_id: String,
    pub quantity: u64,
    pub delivery_data: BTreeMap<String, String>,
}

/// A 400 from the business rules; `message` is the partner-facing `token: sentence`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BasketRejection {
    TooManyItems,
    UnknownProduct(String),
    RegionNotAllowed(String),
    ZeroPriceItem(String),
    InvalidDeliveryData { product_id: String, field: String },
    TotalTooLarge,
}

impl BasketRejection {
    pub fn message(&self) -> String {
        match self {
            BasketRejection::TooManyItems => "too_many_items: maximum 200 items per order".into(),
            BasketRejection::UnknownProduct(id) => {
                format!("unknown_product: product {id:?} does not exist or is not for sale")
            }
            BasketRejection::RegionNotAllowed(id) => {
                format!("region_not_allowed: product {id:?} is not sold in your account's region")
            }
            BasketRejection::ZeroPriceItem(id) => {
                format!("ZERO_PRICE_ITEM: product {id:?} has no price and cannot be ordered")
            }
            BasketRejection::InvalidDeliveryData { product_id, field } => format!(
                "invalid_delivery_data: product {product_id:?} requires a non-blank deliveryData.{field}"
            ),
            BasketRejection::TotalTooLarge => {
                "order_total_too_large: the order total does not fit in a balance".into()
            }
        }
    }
}

/// Prices every line from the catalog as `lookup` sees it, applying the rules in the
/// documented order. `lookup` is fallible so it can read inside a storage transaction.
pub fn price_basket<E>(
    lines: &[RequestedLine],
    region: Option<&str>,
    mut lookup: impl FnMut(&str) -> Result<Option<Product>, E>,
) -> Result<Result<(Vec<OrderLine>, i64), BasketRejection>, E> {
    if lines.len() > MAX_LINES {
        return Ok(Err(BasketRejection::TooManyItems));
    }
    let mut priced = Vec::with_capacity(lines.len());
    let mut total: i64 = 0;
    for line in lines {
        let id = line.product_id.trim();
        let product = match lookup(id)? {
            Some(p) if p.active => p,
            _ => return Ok(Err(BasketRejection::UnknownProduct(id.to_string()))),
        };
        if !product.sold_in(region) {
            return Ok(Err(BasketRejection::RegionNotAllowed(id.to_string())));
        }
        if product.price <= 0 {
            return Ok(Err(BasketRejection::ZeroPriceItem(id.to_string())));
        }
        if let Some(field) = product.delivery_fields.iter().find(|f| {
            line.delivery_data
                .get(f.as_str())
                .is_none_or(|v| v.trim().is_empty())
        }) {
            return Ok(Err(BasketRejection::InvalidDeliveryData {
                product_id: id.to_string(),
                field: field.clone(),
            }));
        }
        let amount = i64::try_from(line.quantity)
            .ok()
            .and_then(|q| q.checked_mul(product.price));
        let Some(amount) = amount else {
            return Ok(Err(BasketRejection::TotalTooLarge));
        };
        let Some(sum) = total.checked_add(amount) else {
            return Ok(Err(BasketRejection::TotalTooLarge));
        };
        total = sum;
        priced.push(OrderLine {
            product_id: id.to_string(),
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
            price,
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

    fn price(lines: &[RequestedLine]) -> Result<(Vec<OrderLine>, i64), BasketRejection> {
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
            (1998, 1998, "prd_uc")
        );
    }

    #[test]
    fn each_rule_gives_its_token() {
        let cases = [
            (line("prd_nope", 1, &[]), "unknown_product:"),
            (line("prd_us", 1, &[]), "region_not_allowed:"),
            (line("prd_free", 1, &[]), "ZERO_PRICE_ITEM:"),
            (
                line("prd_uc", 1, &[("username", "  ")]),
                "invalid_delivery_data:",
            ),
            (line("prd_uc", 1, &[]), "invalid_delivery_data:"),
        ];
        for (l, token) in cases {
            assert!(
                price(&[l]).unwrap_err().message().starts_with(token),
                "{token}"
            );
        }
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
