//! The ledger's hash chain, encoding v1: each entry's `hash` is SHA-256 over the entry as the
//! API shows it and the hash before it, so a partner who kept a head can prove that the
//! history it saw is still the start of the history served (docs/api.md "Verifying your
//! ledger" states the encoding for partners; this file is it).
//!
//! The bytes hashed are fields, each as its UTF-8 text preceded by that text's length in bytes
//! (4 bytes, big-endian), so that no two different entries give the same bytes:
//!
//! - an entry: `orderly-ledger-v1`, the account id, the entry id, `seq`, `amount`, `reason`,
//!   `reference`, `balanceAfter`, `createdAt`, `previousHash`; integers in decimal (a minus
//!   sign for a debit), `createdAt` and `reason` exactly as the API writes them, the hash in
//!   lowercase hex;
//! - the genesis (the first entry's `previousHash`): `orderly-ledger-v1`, `genesis`, the
//!   account id.
//!
//! Text rather than integers of a width: a partner recomputes it from the JSON it received
//! with any language's SHA-256, never an integer layout.

use sha2::{Digest as _, Sha256};

use super::ledger::{LedgerEntry, LedgerReason};
use super::money::Cents;
use super::time::rfc3339;
use super::time::Millis;

/// A SHA-256 digest.
pub(crate) type Hash = [u8; 32];

/// Names the encoding in every hash, so that a later encoding can never collide with it.
pub(crate) const ENCODING: &str = "orderly-ledger-v1";

/// An account's newest chained entry: its `seq` (0 for an empty ledger) and its hash (the
/// genesis for an empty ledger). What a balance is read with, and what the next entry extends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LedgerHead {
    /// The newest entry's `seq`; 0 for an empty ledger.
    pub seq: u64,
    /// The newest entry's hash; the genesis for an empty ledger.
    pub hash: [u8; 32],
}

impl LedgerHead {
    /// The head of an empty ledger of `account`.
    pub(crate) fn genesis(account: &str) -> Self {
        LedgerHead {
            seq: 0,
            hash: genesis_hash(account),
        }
    }

    /// The head once `entry` (chained onto this one) is the newest.
    pub(crate) fn after(entry: &LedgerEntry) -> Self {
        LedgerHead {
            seq: entry.seq,
            hash: entry.hash,
        }
    }
}

/// An account's money as a decision that moves it reads it: the balance, and the head of the
/// ledger that sums to it. Read together, under what keeps both still until the write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Funds {
    /// The balance.
    pub available: Cents,
    /// The head of the ledger that sums to it.
    pub head: LedgerHead,
}

impl Funds {
    /// An account with no entries yet.
    pub(crate) fn empty(account: &str) -> Self {
        Funds {
            available: Cents::ZERO,
            head: LedgerHead::genesis(account),
        }
    }

    /// What the account holds once `entry` is written.
    pub(crate) fn after(entry: &LedgerEntry) -> Self {
        Funds {
            available: entry.balance_after,
            head: LedgerHead::after(entry),
        }
    }
}

fn field(hasher: &mut Sha256, text: &str) {
    let len = u32::try_from(text.len()).expect("a ledger field under 4 GiB");
    hasher.update(len.to_be_bytes());
    hasher.update(text.as_bytes());
}

/// The first entry's `previousHash` of `account`.
pub(crate) fn genesis_hash(account: &str) -> Hash {
    let mut hasher = Sha256::new();
    for text in [ENCODING, "genesis", account] {
        field(&mut hasher, text);
    }
    hasher.finalize().into()
}

/// The hash `entry` of `account` has when it is `seq`-th and follows `previous`.
pub(crate) fn entry_hash(account: &str, entry: &LedgerEntry, seq: u64, previous: &Hash) -> Hash {
    let mut hasher = Sha256::new();
    for text in [
        ENCODING,
        account,
        &entry.id,
        &seq.to_string(),
        &entry.amount.0.to_string(),
        entry.reason.as_str(),
        &entry.reference,
        &entry.balance_after.0.to_string(),
        &rfc3339(entry.created_at),
        &to_hex(previous),
    ] {
        field(&mut hasher, text);
    }
    hasher.finalize().into()
}

/// Chains `entry` of `account` onto `head`: its `seq`, `previous_hash` and `hash`.
pub(crate) fn link(account: &str, head: &LedgerHead, entry: &mut LedgerEntry) {
    entry.seq = head.seq + 1;
    entry.previous_hash = head.hash;
    entry.hash = entry_hash(account, entry, entry.seq, &head.hash);
}

/// Fills `previous_hash` of a run of one account's consecutive entries as read (`newest_first`
/// or oldest first): each from the entry before it in the ledger when the run holds it, the
/// genesis for `seq` 1, else left as it is (the run's oldest, whose predecessor was not read).
/// What the store holds is shown: where an entry is missing, the next one's `previous_hash`
/// is the hash of the one the store has before it, and its own hash then does not check.
pub(crate) fn fill_previous(account: &str, entries: &mut [LedgerEntry], newest_first: bool) {
    let genesis = genesis_hash(account);
    let mut before: Option<Hash> = None;
    let mut step = |entry: &mut LedgerEntry| {
        if entry.seq == 1 {
            entry.previous_hash = genesis;
        } else if let Some(hash) = before {
            entry.previous_hash = hash;
        }
        before = (entry.seq != 0).then_some(entry.hash);
    };
    if newest_first {
        entries.iter_mut().rev().for_each(&mut step);
    } else {
        entries.iter_mut().for_each(&mut step);
    }
}

/// Lowercase hex, as the API writes a hash.
pub(crate) fn to_hex(hash: &Hash) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(64);
    for byte in hash {
        out.push(DIGITS[usize::from(byte >> 4)] as char);
        out.push(DIGITS[usize::from(byte & 15)] as char);
    }
    out
}

/// What is wrong with one entry of a chain, as `orderly verify` and the client name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Break {
    /// Its `seq` is not the one after the entry before it.
    Seq { expected: u64, found: u64 },
    /// Its `previousHash` is not the hash of the entry before it (or the genesis).
    PreviousHash,
    /// Its `hash` is not what its fields and `previousHash` give.
    Hash,
    /// Its `balanceAfter` is not the balance before it plus its amount.
    BalanceAfter {
        expected: Option<Cents>,
        found: Cents,
    },
}

impl std::fmt::Display for Break {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Break::Seq { expected, found } => write!(f, "seq is {found}, expected {expected}"),
            Break::PreviousHash => f.write_str("previousHash is not the hash of the entry before"),
            Break::Hash => f.write_str("hash is not what the entry's fields give"),
            Break::BalanceAfter {
                expected: Some(expected),
                found,
            } => write!(f, "balanceAfter is {found}, expected {expected}"),
            Break::BalanceAfter {
                expected: None,
                found,
            } => write!(f, "balanceAfter is {found}; the sum before it overflows"),
        }
    }
}

/// Checks `entry` of `account` as the one after `before` (the funds the entries before it
/// lead to): every break it has, none when it extends them exactly.
pub(crate) fn check(account: &str, before: &Funds, entry: &LedgerEntry) -> Vec<Break> {
    let mut breaks = Vec::new();
    let expected_seq = before.head.seq + 1;
    if entry.seq != expected_seq {
        breaks.push(Break::Seq {
            expected: expected_seq,
            found: entry.seq,
        });
    }
    if entry.previous_hash != before.head.hash {
        breaks.push(Break::PreviousHash);
    }
    if entry.hash != entry_hash(account, entry, entry.seq, &entry.previous_hash) {
        breaks.push(Break::Hash);
    }
    let expected = before.available.checked_add(entry.amount);
    if expected != Some(entry.balance_after) {
        breaks.push(Break::BalanceAfter {
            expected,
            found: entry.balance_after,
        });
    }
    breaks
}

impl LedgerEntry {
    /// A movement of `account`'s money, chained onto `head` (`chain::link`): `seq`, `hash`
    /// and `previous_hash` follow from the rest.
    pub(crate) fn chained(account: &str, head: &LedgerHead, movement: Movement) -> Self {
        let mut entry = LedgerEntry {
            id: movement.id,
            amount: movement.amount,
            reason: movement.reason,
            reference: movement.reference,
            balance_after: movement.balance_after,
            created_at: movement.created_at,
            seq: 0,
            hash: [0; 32],
            previous_hash: [0; 32],
        };
        link(account, head, &mut entry);
        entry
    }
}

/// What an entry says of the money it moves, before it is chained.
pub(crate) struct Movement {
    pub(crate) id: String,
    pub(crate) amount: Cents,
    pub(crate) reason: LedgerReason,
    pub(crate) reference: String,
    pub(crate) balance_after: Cents,
    pub(crate) created_at: Millis,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str, amount: i64, after: i64) -> LedgerEntry {
        LedgerEntry {
            id: id.into(),
            amount: Cents(amount),
            reason: LedgerReason::Credit,
            reference: "ref".into(),
            balance_after: Cents(after),
            created_at: 1_765_000_000_000,
            seq: 0,
            hash: [0; 32],
            previous_hash: [0; 32],
        }
    }

    #[test]
    fn the_encoding_is_the_documented_one() {
        // Computed by hand from the rule in this file's header (and docs/api.md's example):
        // a change here breaks every partner's verification, so it is pinned.
        let mut hasher = Sha256::new();
        hasher.update(17u32.to_be_bytes());
        hasher.update(b"orderly-ledger-v1");
        hasher.update(7u32.to_be_bytes());
        hasher.update(b"genesis");
        hasher.update(7u32.to_be_bytes());
        hasher.update(b"acc_one");
        let expected: Hash = hasher.finalize().into();
        assert_eq!(genesis_hash("acc_one"), expected);

        let mut e = entry("txn_1", -250, -250);
        link("acc_one", &LedgerHead::genesis("acc_one"), &mut e);
        let mut hasher = Sha256::new();
        for text in [
            "orderly-ledger-v1",
            "acc_one",
            "txn_1",
            "1",
            "-250",
            "credit",
            "ref",
            "-250",
            "2025-12-06T05:46:40Z",
            &to_hex(&expected),
        ] {
            hasher.update((text.len() as u32).to_be_bytes());
            hasher.update(text.as_bytes());
        }
        let expected_entry: Hash = hasher.finalize().into();
        assert_eq!(e.hash, expected_entry);
        assert_eq!(e.seq, 1);
        assert_eq!(e.previous_hash, expected);
    }

    #[test]
    fn a_chain_checks_and_every_change_to_an_entry_breaks_it() {
        let account = "acc_a";
        let mut funds = Funds::empty(account);
        let mut chain = Vec::new();
        for (i, amount) in [100i64, -30, 5].into_iter().enumerate() {
            let mut e = entry(&format!("txn_{i}"), amount, funds.available.0 + amount);
            link(account, &funds.head, &mut e);
            assert!(check(account, &funds, &e).is_empty());
            funds = Funds::after(&e);
            chain.push(e);
        }
        assert_eq!(funds.head.seq, 3);
        let before = Funds::after(&chain[0]);
        let mut changed = chain[1].clone();
        changed.amount = Cents(-31);
        assert!(check(account, &before, &changed).contains(&Break::Hash));
        let mut changed = chain[1].clone();
        changed.reference = "other".into();
        assert_eq!(check(account, &before, &changed), vec![Break::Hash]);
        // Another account's chain never verifies as this one's.
        assert!(check("acc_b", &before, &chain[1]).contains(&Break::Hash));
        // An entry skipped: the next one does not link.
        let breaks = check(account, &before, &chain[2]);
        assert!(breaks.contains(&Break::PreviousHash));
        assert!(breaks.contains(&Break::Seq {
            expected: 2,
            found: 3
        }));
    }

    #[test]
    fn hex_is_lowercase_two_digits_a_byte() {
        let mut hash = [0u8; 32];
        hash[0] = 0xab;
        hash[31] = 0x0f;
        let text = to_hex(&hash);
        assert_eq!(text.len(), 64);
        assert!(text.starts_with("ab00"));
        assert!(text.ends_with("000f"));
    }

    #[test]
    fn the_last_seq_and_extreme_amounts_hash_without_overflow() {
        let mut e = entry("txn_x", i64::MIN + 1, i64::MIN + 1);
        let head = LedgerHead {
            seq: u64::MAX - 1,
            hash: [0xff; 32],
        };
        link("acc", &head, &mut e);
        assert_eq!(e.seq, u64::MAX);
        let before = Funds {
            available: Cents::ZERO,
            head,
        };
        assert!(check("acc", &before, &e).is_empty());
        let funds = Funds {
            available: Cents(i64::MAX),
            head,
        };
        assert!(matches!(
            check("acc", &funds, &entry("t", 1, 0))[..],
            [.., Break::BalanceAfter { expected: None, .. }]
        ));
    }
}
