//! What an intent asks for, and the one place that turns it into the bytes that are sent.
//!
//! The bytes are made once, when the intent is journaled, and never again: every retry sends
//! what the journal holds. Serialization is deterministic (fields in declaration order,
//! `deliveryData` keys sorted), so the same basket always makes the same bytes and a changed
//! basket is a byte difference.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// The order body of docs/api.md "POST /b2b/orders" without `externalOrderId`, which the client sets to the
/// intent id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Basket {
    pub items: Vec<Item>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_url: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Item {
    pub product_id: String,
    pub quantity: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub delivery_data: BTreeMap<String, String>,
}

impl Item {
    pub fn new(product_id: impl Into<String>, quantity: u64) -> Item {
        Item {
            product_id: product_id.into(),
            quantity,
            delivery_data: BTreeMap::new(),
        }
    }

    pub fn with(mut self, field: impl Into<String>, value: impl Into<String>) -> Item {
        self.delivery_data.insert(field.into(), value.into());
        self
    }
}

/// The caller's name for one business intent (one checkout); also the `externalOrderId`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IntentId(String);

#[derive(Debug, thiserror::Error)]
#[error("invalid intent id: {0}")]
pub struct InvalidIntentId(&'static str);

impl IntentId {
    /// 1 to 128 characters (the server's limit on `externalOrderId`), no control characters.
    pub fn parse(value: &str) -> Result<IntentId, InvalidIntentId> {
        if value.is_empty() {
            return Err(InvalidIntentId("it is empty"));
        }
        if value.chars().count() > 128 {
            return Err(InvalidIntentId("it is longer than 128 characters"));
        }
        if value.chars().any(char::is_control) {
            return Err(InvalidIntentId("it holds a control character"));
        }
        Ok(IntentId(value.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IntentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OrderBody<'a> {
    items: &'a [Item],
    #[serde(skip_serializing_if = "Option::is_none")]
    callback_url: Option<&'a str>,
    external_order_id: &'a str,
}

/// The exact bytes of `POST /b2b/orders` for this intent.
pub fn request_bytes(intent: &IntentId, basket: &Basket) -> Vec<u8> {
    let body = OrderBody {
        items: &basket.items,
        callback_url: basket.callback_url.as_deref(),
        external_order_id: intent.as_str(),
    };
    serde_json::to_vec(&body).expect("an order body always serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_basket_always_makes_the_same_bytes() {
        let intent = IntentId::parse("checkout-1").unwrap();
        let a = Basket {
            items: vec![Item::new("prd_uc", 2)
                .with("username", "@P")
                .with("zone", "eu")],
            callback_url: None,
        };
        let b = Basket {
            items: vec![Item::new("prd_uc", 2)
                .with("zone", "eu")
                .with("username", "@P")],
            callback_url: None,
        };
        assert_eq!(request_bytes(&intent, &a), request_bytes(&intent, &b));
        assert_eq!(
            String::from_utf8(request_bytes(&intent, &a)).unwrap(),
            r#"{"items":[{"productId":"prd_uc","quantity":2,"deliveryData":{"username":"@P","zone":"eu"}}],"externalOrderId":"checkout-1"}"#
        );
    }

    #[test]
    fn an_intent_id_is_one_to_128_printable_characters() {
        assert!(IntentId::parse("").is_err());
        assert!(IntentId::parse(&"x".repeat(129)).is_err());
        assert!(IntentId::parse("a\nb").is_err());
        assert!(IntentId::parse(&"x".repeat(128)).is_ok());
    }
}
