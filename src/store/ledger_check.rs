//! Every account's ledger checked as a chain (`domain::chain`), from records as a snapshot or a
//! backup gives them (an account's entries together, in their order): each entry's `seq` the
//! one after the entry before, its hash what its fields and the hash before give, its
//! `balanceAfter` the balance before plus its amount, and the account's balance its last
//! entry's. What `orderly verify` reports and what a restore refuses.
//!
//! Only a running total per account is held, whatever the ledgers' length. A break is named
//! and the walk goes on from the entry as stored, so that one changed entry is one break.

use std::collections::HashMap;

use crate::domain::chain::{check, Funds};
use crate::domain::ids::AccountId;
use crate::domain::ledger::LedgerEntry;
use crate::domain::money::Cents;
use crate::store::Record;

/// The first breaks named in full; past them only counted.
const NAMED: usize = 1_000;

/// What the walk found.
#[derive(Debug, Default)]
pub(crate) struct LedgerReport {
    pub(crate) accounts: u64,
    pub(crate) entries: u64,
    /// Entries written before chained ledgers and not chained yet (a backup of an earlier
    /// build): their sums are checked, their chain cannot be.
    pub(crate) unchained: u64,
    /// Each break: `account acc_…, seq N: what differs`.
    pub(crate) breaks: Vec<String>,
    /// Breaks past the `NAMED` first.
    pub(crate) more_breaks: u64,
}

impl LedgerReport {
    pub(crate) fn holds(&self) -> bool {
        self.breaks.is_empty()
    }
}

#[derive(Default)]
pub(crate) struct LedgerCheck {
    /// Each account's balance, as its record says.
    balances: HashMap<AccountId, Cents>,
    /// Where each account's ledger ended.
    ended: HashMap<AccountId, Funds>,
    /// The account whose entries come now, and where its ledger is so far.
    current: Option<(AccountId, String, Funds)>,
    report: LedgerReport,
}

impl LedgerCheck {
    pub(crate) fn add(&mut self, record: &Record) {
        match record {
            Record::Account { account, balance } => {
                self.balances.insert(account.id, *balance);
            }
            Record::Ledger { account, entry } => self.entry(*account, entry),
            _ => {}
        }
    }

    fn entry(&mut self, account: AccountId, entry: &LedgerEntry) {
        self.report.entries += 1;
        if self.current.as_ref().map(|(a, _, _)| *a) != Some(account) {
            self.end_account();
            if self.ended.contains_key(&account) {
                self.named(
                    &account.to_string(),
                    entry.seq,
                    "its entries are not together",
                );
            }
            let text = account.to_string();
            let empty = Funds::empty(&text);
            self.current = Some((account, text, empty));
        }
        let Some((_, text, funds)) = self.current.as_mut() else {
            return;
        };
        if entry.seq == 0 {
            // Not chained yet: the sum still holds or not.
            self.report.unchained += 1;
            let expected = funds.available.checked_add(entry.amount);
            let broken = (expected != Some(entry.balance_after)).then(|| {
                format!(
                    "balanceAfter is {}, expected {}",
                    entry.balance_after,
                    expected.map_or("an overflow".into(), |c| c.to_string())
                )
            });
            funds.available = entry.balance_after;
            let text = text.clone();
            if let Some(what) = broken {
                self.named(&text, 0, &what);
            }
            return;
        }
        // The link is what the entry before hashed to: a stored entry keeps no previousHash.
        let mut linked = entry.clone();
        linked.previous_hash = funds.head.hash;
        let breaks = check(text, funds, &linked);
        *funds = Funds::after(entry);
        let text = text.clone();
        for broken in breaks {
            self.named(&text, entry.seq, &broken.to_string());
        }
    }

    fn end_account(&mut self) {
        if let Some((account, _, funds)) = self.current.take() {
            self.report.accounts += 1;
            self.ended.insert(account, funds);
        }
    }

    fn named(&mut self, account: &str, seq: u64, what: &str) {
        if self.report.breaks.len() < NAMED {
            self.report
                .breaks
                .push(format!("account {account}, seq {seq}: {what}"));
        } else {
            self.report.more_breaks += 1;
        }
    }

    /// The report, once every account's balance is found to be its ledger's last
    /// `balanceAfter` (0 for an account without entries).
    pub(crate) fn finish(mut self) -> LedgerReport {
        self.end_account();
        let mut accounts: Vec<_> = self.balances.iter().map(|(a, b)| (*a, *b)).collect();
        accounts.sort();
        for (account, balance) in accounts {
            let last = self.ended.remove(&account);
            let (ends_at, seq) = last.map_or((Cents::ZERO, 0), |f| (f.available, f.head.seq));
            if ends_at != balance {
                self.named(
                    &account.to_string(),
                    seq,
                    &format!("the balance is {balance}, the ledger ends at {ends_at}"),
                );
            }
        }
        let mut orphans: Vec<_> = std::mem::take(&mut self.ended).into_keys().collect();
        orphans.sort();
        for account in orphans {
            self.named(
                &account.to_string(),
                0,
                "entries of an account there is none of",
            );
        }
        self.report
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::account::Account;
    use crate::domain::chain::link;
    use crate::domain::ledger::LedgerReason;

    fn ledger(account: &Account, amounts: &[i64]) -> Vec<LedgerEntry> {
        let text = account.id.to_string();
        let mut funds = Funds::empty(&text);
        amounts
            .iter()
            .enumerate()
            .map(|(i, amount)| {
                let mut entry = LedgerEntry {
                    id: format!("txn_{i}"),
                    amount: Cents(*amount),
                    reason: LedgerReason::Credit,
                    reference: "r".into(),
                    balance_after: Cents(funds.available.0 + amount),
                    created_at: 1_000 * i as u64,
                    seq: 0,
                    hash: [0; 32],
                    previous_hash: [0; 32],
                };
                link(&text, &funds.head, &mut entry);
                funds = Funds::after(&entry);
                entry
            })
            .collect()
    }

    fn walk(account: &Account, balance: i64, entries: &[LedgerEntry]) -> LedgerReport {
        let mut check = LedgerCheck::default();
        check.add(&Record::Account {
            account: account.clone(),
            balance: Cents(balance),
        });
        for entry in entries {
            check.add(&Record::Ledger {
                account: account.id,
                entry: entry.clone(),
            });
        }
        check.finish()
    }

    #[test]
    fn a_whole_chain_holds() {
        let a = Account::for_tests(0);
        let report = walk(&a, 120, &ledger(&a, &[100, -30, 50]));
        assert!(report.holds(), "{:?}", report.breaks);
        assert_eq!((report.accounts, report.entries), (1, 3));
    }

    #[test]
    fn each_planted_change_is_named_at_its_seq() {
        let a = Account::for_tests(0);
        let whole = ledger(&a, &[100, -30, 50, 7]);
        // A rewrite of what the entry says, its hash kept.
        let mut rewritten = whole.clone();
        rewritten[1].reference = "another order".into();
        let report = walk(&a, 127, &rewritten);
        assert_eq!(
            report.breaks,
            vec![format!(
                "account {}, seq 2: hash is not what the entry's fields give",
                a.id
            )]
        );
        // A rewritten amount: that entry's sum and hash break, and no other's.
        let mut rewritten = whole.clone();
        rewritten[1].amount = Cents(-31);
        let report = walk(&a, 127, &rewritten);
        assert_eq!(report.breaks.len(), 2, "{:?}", report.breaks);
        assert!(report.breaks.iter().all(|b| b.contains("seq 2:")));
        // The last entries dropped (a rewind): the balance no longer is the ledger's end.
        let report = walk(&a, 127, &whole[..2]);
        assert!(report.breaks[0].contains("the balance is 127, the ledger ends at 70"));
        // Two entries swapped.
        let mut swapped = whole.clone();
        swapped.swap(1, 2);
        let report = walk(&a, 127, &swapped);
        assert!(report
            .breaks
            .iter()
            .any(|b| b.contains("seq 3: seq is 3, expected 2")));
        // One dropped from the middle.
        let mut gap = whole.clone();
        gap.remove(1);
        let report = walk(&a, 127, &gap);
        assert!(report
            .breaks
            .iter()
            .any(|b| b.contains("seq 3: seq is 3, expected 2")));
    }

    #[test]
    fn unchained_entries_are_counted_and_their_sums_still_checked() {
        let a = Account::for_tests(0);
        let mut entries = ledger(&a, &[100, 5]);
        for e in &mut entries {
            e.seq = 0;
        }
        let report = walk(&a, 105, &entries);
        assert!(report.holds());
        assert_eq!(report.unchained, 2);
        entries[1].balance_after = Cents(1);
        assert!(!walk(&a, 1, &entries).holds());
    }
}
