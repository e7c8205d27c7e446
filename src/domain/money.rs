//! An amount of the deployment's currency in minor units (cents), signed: a balance may be
//! below zero down to its credit limit, and a ledger debit is negative. A type of its own so
//! that an amount is never confused with a count, a quantity, an id or a time where it
//! crosses a module boundary; stored and sent as the bare integer (`serde(transparent)`), so
//! neither the wire nor the files change.

use serde::{Deserialize, Serialize};

#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
/// An amount in minor units, signed; the field is the bare number of cents.
#[serde(transparent)]
pub struct Cents(pub i64);

impl Cents {
    /// No money.
    pub const ZERO: Cents = Cents(0);
    /// The largest amount, for the tests of the overflow checks.
    #[cfg(test)]
    pub(crate) const MAX: Cents = Cents(i64::MAX);

    pub(crate) fn checked_add(self, other: Cents) -> Option<Cents> {
        self.0.checked_add(other.0).map(Cents)
    }

    pub(crate) fn checked_sub(self, other: Cents) -> Option<Cents> {
        self.0.checked_sub(other.0).map(Cents)
    }

    /// `quantity` times this price, `None` when it does not fit.
    pub(crate) fn times(self, quantity: u64) -> Option<Cents> {
        i64::try_from(quantity)
            .ok()
            .and_then(|q| q.checked_mul(self.0))
            .map(Cents)
    }

    pub(crate) fn is_positive(self) -> bool {
        self.0 > 0
    }
}

/// Plain arithmetic for amounts already bounded (an order's total less what was refunded);
/// sums that can overflow use `checked_add`.
impl std::ops::Add for Cents {
    type Output = Cents;
    fn add(self, other: Cents) -> Cents {
        Cents(self.0 + other.0)
    }
}

impl std::ops::Sub for Cents {
    type Output = Cents;
    fn sub(self, other: Cents) -> Cents {
        Cents(self.0 - other.0)
    }
}

impl std::ops::Neg for Cents {
    type Output = Cents;
    fn neg(self) -> Cents {
        Cents(-self.0)
    }
}

impl std::iter::Sum for Cents {
    fn sum<I: Iterator<Item = Cents>>(iter: I) -> Cents {
        Cents(iter.map(|c| c.0).sum())
    }
}

/// The bare integer, as the wire and the error sentences write it.
impl std::fmt::Display for Cents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_amount_is_stored_and_sent_as_the_bare_integer() {
        assert_eq!(serde_json::to_string(&Cents(-250)).unwrap(), "-250");
        let standard = bincode::config::standard();
        assert_eq!(
            bincode::serde::encode_to_vec(Cents(-7), standard).unwrap(),
            bincode::serde::encode_to_vec(-7i64, standard).unwrap()
        );
        assert_eq!(Cents(42).to_string(), "42");
    }

    #[test]
    fn a_price_times_a_quantity_that_does_not_fit_is_none() {
        assert_eq!(Cents(3).times(4), Some(Cents(12)));
        assert_eq!(Cents(i64::MAX).times(2), None);
        assert_eq!(Cents(1).times(u64::MAX), None);
    }
}
