//! Money coming in (an admin credit, a provider's payment): the one ledger entry it makes,
//! checked by `invariant.rs` before anything writes it.

use super::ids::Id;
use super::invariant;
use super::ledger::{LedgerEntry, LedgerReason};
use super::money::Cents;
use super::time::Millis;

/// Money coming in (an admin credit, a provider's payment) to a balance of `balance`: its
/// ledger entry, whose `balance_after` is the new balance, or `None` when the sum would not
/// fit in an i64 (refused, nothing written).
pub(crate) fn money_in(
    balance: Cents,
    amount: Cents,
    reason: LedgerReason,
    reference: String,
    txn: &Id,
    now: Millis,
) -> Option<LedgerEntry> {
    let after = balance.checked_add(amount)?;
    let entry = LedgerEntry {
        id: txn.to_string(),
        amount,
        reason,
        reference,
        balance_after: after,
        created_at: now,
    };
    invariant::money_in_is_positive(&entry);
    Some(entry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ids::IdKind;

    #[test]
    fn money_in_that_would_overflow_the_balance_is_refused() {
        let txn = Id::new(IdKind::Transaction);
        assert!(money_in(
            Cents::MAX,
            Cents(1),
            LedgerReason::Credit,
            "x".into(),
            &txn,
            0
        )
        .is_none());
        let entry = money_in(
            Cents(5),
            Cents(7),
            LedgerReason::Credit,
            "x".into(),
            &txn,
            3,
        )
        .unwrap();
        assert_eq!(
            (entry.amount, entry.balance_after, entry.created_at),
            (Cents(7), Cents(12), 3)
        );
    }
}
