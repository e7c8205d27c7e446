//! Money coming in (an admin credit, a provider's payment): the one ledger entry it makes,
//! checked by `invariant.rs` before anything writes it.

use super::chain::{Funds, Movement};
use super::ids::AccountId;
use super::ids::Id;
use super::invariant;
use super::ledger::{LedgerEntry, LedgerReason};
use super::money::Cents;
use super::time::Millis;

/// Money coming in (an admin credit, a provider's payment) to `account`, which holds
/// `funds`: its ledger entry, chained onto their head, whose `balance_after` is the new
/// balance, or `None` when the sum would not fit in an i64 (refused, nothing written).
pub(crate) fn money_in(
    account: AccountId,
    funds: Funds,
    incoming: Incoming,
    txn: &Id,
    now: Millis,
) -> Option<LedgerEntry> {
    let movement = Movement {
        id: txn.to_string(),
        amount: incoming.amount,
        reason: incoming.reason,
        reference: incoming.reference,
        balance_after: funds.available.checked_add(incoming.amount)?,
        created_at: now,
    };
    let entry = LedgerEntry::chained(&account.to_string(), &funds.head, movement);
    invariant::money_in_is_positive(&entry);
    invariant::entry_moves_the_balance(&funds, &entry);
    Some(entry)
}

/// What comes in: how much, why, and the caller's reference.
pub(crate) struct Incoming {
    pub(crate) amount: Cents,
    pub(crate) reason: LedgerReason,
    pub(crate) reference: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ids::IdKind;

    fn credit(amount: i64) -> Incoming {
        Incoming {
            amount: Cents(amount),
            reason: LedgerReason::Credit,
            reference: "x".into(),
        }
    }

    #[test]
    fn money_in_that_would_overflow_the_balance_is_refused() {
        let (account, txn) = (AccountId::new(), Id::new(IdKind::Transaction));
        let empty = Funds::empty(&account.to_string());
        let full = Funds {
            available: Cents::MAX,
            ..empty
        };
        assert!(money_in(account, full, credit(1), &txn, 0).is_none());
        let last = Funds {
            available: Cents(i64::MAX - 7),
            ..empty
        };
        let entry = money_in(account, last, credit(7), &txn, 0).unwrap();
        assert_eq!(entry.balance_after, Cents::MAX);
        let five = Funds {
            available: Cents(5),
            ..empty
        };
        let entry = money_in(account, five, credit(7), &txn, 3).unwrap();
        assert_eq!(
            (
                entry.amount,
                entry.balance_after,
                entry.created_at,
                entry.seq
            ),
            (Cents(7), Cents(12), 3, 1)
        );
        assert_eq!(entry.previous_hash, empty.head.hash);
    }
}
