//! The request fingerprint: SHA-256 over an unambiguous encoding of what makes two calls
//! "the same operation". For an order that is the normalized basket and nothing else.

use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

use super::money::Cents;

/// What a key was used for; part of every fingerprint so that one key reused across
/// operations is a conflict, never a replay of the wrong thing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Operation {
    /// `POST /b2b/orders`.
    PlaceOrder,
    /// A cancel of an order.
    CancelOrder,
    /// A refund of an order.
    RefundOrder,
    /// An operator's credit to an account.
    AdminCredit,
}

impl Operation {
    fn tag(self) -> u8 {
        match self {
            Operation::PlaceOrder => 1,
            Operation::CancelOrder => 2,
            Operation::RefundOrder => 3,
            Operation::AdminCredit => 4,
        }
    }
}

/// The SHA-256 of a request's operation and normalized content: two uses of a key with equal
/// fingerprints are the same request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Fingerprint(pub [u8; 32]);

/// One basket line as the fingerprint sees it.
pub struct LineRef<'a> {
    /// The product ordered.
    pub product_id: &'a str,
    /// How many of it.
    pub quantity: u64,
    /// Its delivery fields, by name.
    pub delivery_data: &'a BTreeMap<String, String>,
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct NormalizedLine<'a> {
    product_id: &'a str,
    delivery_data: Vec<(&'a str, String)>,
    quantity: u64,
}

/// `" @Player1 "` and `player1` are one username: trim, lowercase, drop one leading `@`.
pub(crate) fn normalize_username(value: &str) -> String {
    let lowered = value.trim().to_lowercase();
    match lowered.strip_prefix('@') {
        Some(rest) => rest.to_string(),
        None => lowered,
    }
}

fn normalize_value(key: &str, value: &str) -> String {
    if key == "username" {
        normalize_username(value)
    } else {
        value.trim().to_string()
    }
}

/// Length-prefixed writer: no two different inputs share a preimage.
struct Encoder(Sha256);

impl Encoder {
    fn new(operation: Operation) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(b"orderly-fingerprint-v1");
        hasher.update([operation.tag()]);
        Encoder(hasher)
    }
    fn u64(&mut self, value: u64) {
        self.0.update(value.to_be_bytes());
    }
    fn str(&mut self, value: &str) {
        self.u64(value.len() as u64);
        self.0.update(value.as_bytes());
    }
    fn finish(self) -> Fingerprint {
        Fingerprint(self.0.finalize().into())
    }
}

impl Fingerprint {
    /// The basket's fingerprint. Lines are sorted by product, then normalized delivery data,
    /// then quantity, so any permutation of the same basket gives the same fingerprint.
    pub fn of_basket<'a>(lines: impl IntoIterator<Item = LineRef<'a>>) -> Self {
        let mut normalized: Vec<NormalizedLine<'a>> = lines
            .into_iter()
            .map(|line| NormalizedLine {
                product_id: line.product_id.trim(),
                // BTreeMap iteration is already sorted by key.
                delivery_data: line
                    .delivery_data
                    .iter()
                    .map(|(k, v)| (k.as_str(), normalize_value(k, v)))
                    .collect(),
                quantity: line.quantity,
            })
            .collect();
        normalized.sort();
        let mut enc = Encoder::new(Operation::PlaceOrder);
        enc.u64(normalized.len() as u64);
        for line in &normalized {
            enc.str(line.product_id);
            enc.u64(line.quantity);
            enc.u64(line.delivery_data.len() as u64);
            for (key, value) in &line.delivery_data {
                enc.str(key);
                enc.str(value);
            }
        }
        enc.finish()
    }

    /// A cancel is the same operation when it names the same order.
    pub(crate) fn of_cancel(order_id: &str) -> Self {
        let mut enc = Encoder::new(Operation::CancelOrder);
        enc.str(order_id);
        enc.finish()
    }

    /// A refund is the same operation when it names the same order and amount
    /// (`None`: the whole remainder).
    pub(crate) fn of_refund(order_id: &str, amount: Option<Cents>) -> Self {
        let mut enc = Encoder::new(Operation::RefundOrder);
        enc.str(order_id);
        match amount {
            Some(a) => {
                enc.u64(1);
                enc.u64(a.0 as u64);
            }
            None => enc.u64(0),
        }
        enc.finish()
    }

    /// An admin credit is the same operation when it moves the same amount.
    pub(crate) fn of_credit(amount: Cents) -> Self {
        let mut enc = Encoder::new(Operation::AdminCredit);
        enc.u64(amount.0 as u64);
        enc.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    type Line = (String, u64, BTreeMap<String, String>);

    fn fp(lines: &[Line]) -> Fingerprint {
        Fingerprint::of_basket(lines.iter().map(|(p, q, d)| LineRef {
            product_id: p,
            quantity: *q,
            delivery_data: d,
        }))
    }

    fn line(product: &str, quantity: u64, data: &[(&str, &str)]) -> Line {
        let data = data
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        (product.to_string(), quantity, data)
    }

    #[test]
    fn at_player1_and_player1_are_one_basket() {
        let a = fp(&[line("prd_a", 1, &[("username", "@Player1")])]);
        let b = fp(&[line("prd_a", 1, &[("username", " player1 ")])]);
        assert_eq!(a, b);
    }

    #[test]
    fn only_one_leading_at_sign_is_removed() {
        let a = fp(&[line("prd_a", 1, &[("username", "@@player1")])]);
        let b = fp(&[line("prd_a", 1, &[("username", "player1")])]);
        assert_ne!(a, b);
    }

    #[test]
    fn other_delivery_fields_keep_their_case_but_lose_their_padding() {
        let a = fp(&[line("prd_a", 1, &[("server", " EU-1 ")])]);
        let b = fp(&[line("prd_a", 1, &[("server", "EU-1")])]);
        let c = fp(&[line("prd_a", 1, &[("server", "eu-1")])]);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn two_lines_of_one_product_and_data_swapped_are_one_basket() {
        let a = fp(&[
            line("prd_a", 1, &[("username", "x")]),
            line("prd_a", 2, &[("username", "x")]),
        ]);
        let b = fp(&[
            line("prd_a", 2, &[("username", "x")]),
            line("prd_a", 1, &[("username", "x")]),
        ]);
        assert_eq!(a, b);
    }

    #[test]
    fn a_changed_quantity_is_another_basket() {
        assert_ne!(fp(&[line("prd_a", 1, &[])]), fp(&[line("prd_a", 2, &[])]));
    }

    #[test]
    fn field_boundaries_cannot_be_shifted() {
        let a = fp(&[line("prd_a", 1, &[("ab", "c")])]);
        let b = fp(&[line("prd_a", 1, &[("a", "bc")])]);
        assert_ne!(a, b);
    }

    #[test]
    fn operations_never_share_a_fingerprint() {
        assert_ne!(
            Fingerprint::of_cancel("ord_1"),
            Fingerprint::of_refund("ord_1", None)
        );
        assert_ne!(
            Fingerprint::of_refund("ord_1", Some(Cents(5))),
            Fingerprint::of_refund("ord_1", None)
        );
    }

    fn arb_line() -> impl Strategy<Value = Line> {
        (
            "prd_[a-c]",
            1u64..4,
            prop::collection::btree_map("(username|server|zone)", "[ @]?[A-Za-z]{0,3}", 0..3),
        )
    }

    proptest! {
        #[test]
        fn any_permutation_of_a_basket_has_the_same_fingerprint(
            lines in prop::collection::vec(arb_line(), 1..8),
            seed in any::<u64>(),
        ) {
            let mut shuffled = lines.clone();
            // A deterministic Fisher-Yates driven by the seed.
            let mut state = seed | 1;
            for i in (1..shuffled.len()).rev() {
                state ^= state << 13; state ^= state >> 7; state ^= state << 17;
                shuffled.swap(i, (state % (i as u64 + 1)) as usize);
            }
            prop_assert_eq!(fp(&lines), fp(&shuffled));
        }

        #[test]
        fn adding_a_line_changes_the_fingerprint(
            lines in prop::collection::vec(arb_line(), 1..6),
            extra in arb_line(),
        ) {
            let mut longer = lines.clone();
            longer.push(extra);
            prop_assert_ne!(fp(&lines), fp(&longer));
        }
    }
}
