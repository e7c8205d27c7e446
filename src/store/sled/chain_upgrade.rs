//! The upgrade of a sled store whose entries an earlier build wrote without their chain (a
//! store of a build before chained ledgers, one such a build wrote to since, or a backup of
//! one restored): at open, every account whose newest entry has no chain has its entries
//! chained in their order, the order of their keys.

use std::path::Path;
use std::time::{Duration, Instant};

use super::chained::{decode_entry, encode_entry, newest_entry};
use super::trees::Trees;
use super::upgrade::durable;
use crate::domain::chain::{link, LedgerHead};
use crate::domain::ids::AccountId;
use crate::store::StoreError;

/// Entries rewritten in one sled batch: an account of a million entries is not held in
/// memory whole.
const BATCH_ENTRIES: u64 = 10_000;

/// How often the upgrade says how far it is.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// Chains the entries of every account whose newest entry has no chain, in their order; made
/// durable before the store serves. A crash part way leaves the newest entries without a
/// chain, so the next open chains those accounts again from their first entry: the same
/// entries give the same hashes.
pub(super) fn chain_unchained(trees: &Trees, data_dir: &Path) -> Result<(), StoreError> {
    let mut unchained = Vec::new();
    for item in trees.balances.iter() {
        let (key, _) = item?;
        let account = AccountId::from_bytes(&key)
            .ok_or_else(|| StoreError::Corrupt("a balance has a malformed key".into()))?;
        if newest_entry(&trees.ledger, &account)?.is_some_and(|e| e.seq == 0) {
            unchained.push(account);
        }
    }
    if unchained.is_empty() {
        return Ok(());
    }
    let started = Instant::now();
    let mut shown = started;
    let mut entries = 0u64;
    log::info!(
        "chaining the ledger entries of {} account(s) written before chained ledgers",
        unchained.len()
    );
    for (done, account) in unchained.iter().enumerate() {
        let text = account.to_string();
        let mut head = LedgerHead::genesis(&text);
        let mut batch = sled::Batch::default();
        for item in trees.ledger.scan_prefix(account.bytes()) {
            let (key, value) = item?;
            let mut entry = decode_entry(&value)?;
            link(&text, &head, &mut entry);
            head = LedgerHead::after(&entry);
            batch.insert(key, encode_entry(&entry)?);
            entries += 1;
            if entries % BATCH_ENTRIES == 0 {
                trees.ledger.apply_batch(std::mem::take(&mut batch))?;
            }
        }
        trees.ledger.apply_batch(batch)?;
        if shown.elapsed() >= PROGRESS_EVERY {
            shown = Instant::now();
            log::info!(
                "chaining: {} of {} account(s), {entries} entries",
                done + 1,
                unchained.len()
            );
        }
    }
    durable(trees, data_dir)?;
    log::info!(
        "chained {entries} ledger entries of {} account(s) in {:.1} s",
        unchained.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The chain as sled keeps it, checked as `orderly verify` checks it (`ledger_check`), on
    //! a store whose bytes are then changed the way a hand on a stopped store would (the HTTP
    //! tests cannot reach sled's trees; on PostgreSQL they plant the same changes with SQL).

    use super::*;
    use crate::domain::account::Account;
    use crate::domain::ledger::LedgerEntry;
    use crate::domain::money::Cents;
    use crate::store::ledger_check::{LedgerCheck, LedgerReport};
    use crate::store::sled::chained::head_of;
    use crate::store::sled::codec;
    use crate::store::sled::orders::three_cent_orders;
    use crate::store::Record;

    /// A store whose account has four orders on its credit line: entries of seq 1 to 4.
    fn four_entries() -> (tempfile::TempDir, Trees, Account) {
        let dir = tempfile::tempdir().unwrap();
        let trees = Trees::open(&dir.path().join("db"), 1 << 20).unwrap();
        three_cent_orders::put_product(&trees);
        let account = Account::for_tests(1_000);
        trees.create_account(&account).unwrap();
        for key in ["a", "b", "c", "d"] {
            let order = three_cent_orders::order(&account, key, 1);
            assert!(trees.place_orders(&[&order], 1_000).unwrap()[0].is_ok());
        }
        (dir, trees, account)
    }

    /// What `orderly verify` finds in the account's ledger.
    fn walk(trees: &Trees, account: &Account) -> LedgerReport {
        let mut check = LedgerCheck::default();
        check.add(&Record::Account {
            account: account.clone(),
            balance: Trees::get(&trees.balances, account.id.bytes())
                .unwrap()
                .unwrap_or(Cents::ZERO),
        });
        for item in trees.ledger.scan_prefix(account.id.bytes()) {
            let entry = decode_entry(&item.unwrap().1).unwrap();
            check.add(&Record::Ledger {
                account: account.id,
                entry,
            });
        }
        check.finish()
    }

    fn rows(trees: &Trees, account: &Account) -> Vec<(sled::IVec, sled::IVec)> {
        trees
            .ledger
            .scan_prefix(account.id.bytes())
            .map(Result::unwrap)
            .collect()
    }

    #[test]
    fn a_store_as_written_holds_and_its_head_is_its_newest_entry() {
        let (_dir, trees, account) = four_entries();
        let report = walk(&trees, &account);
        assert!(report.holds(), "{:?}", report.breaks);
        assert_eq!(report.entries, 4);
        assert_eq!(trees.funds(&account.id).unwrap().head.seq, 4);
        assert_eq!(trees.funds(&account.id).unwrap().available, Cents(-12));
    }

    #[test]
    fn the_entries_after_a_seq_are_those_and_no_others_read_from_either_end() {
        let (_dir, trees, account) = four_entries();
        let seqs = |after, limit| -> Vec<u64> {
            trees
                .ledger_after(&account.id, after, limit)
                .unwrap()
                .iter()
                .map(|e| e.seq)
                .collect()
        };
        // From the start (0, 1), from the end (2, 3), past the head (4, 9).
        assert_eq!(seqs(0, 100), [1, 2, 3, 4]);
        assert_eq!(seqs(1, 2), [2, 3]);
        assert_eq!(seqs(2, 100), [3, 4]);
        assert_eq!(seqs(3, 1), [4]);
        assert_eq!(seqs(2, 1), [3]);
        assert!(seqs(4, 10).is_empty() && seqs(9, 10).is_empty());
        let after_two = trees.ledger_after(&account.id, 2, 100).unwrap();
        let all = trees.ledger_after(&account.id, 0, 100).unwrap();
        assert_eq!(after_two[0].previous_hash, all[1].hash);
    }

    #[test]
    fn an_entry_rewritten_on_disk_is_named_at_its_seq() {
        let (_dir, trees, account) = four_entries();
        let (key, value) = rows(&trees, &account)[2].clone();
        let mut bytes = value.to_vec();
        let at = bytes.windows(4).position(|w| w == b"ord_").unwrap() + 4;
        bytes[at] = if bytes[at] == b'0' { b'1' } else { b'0' };
        trees.ledger.insert(key, bytes).unwrap();

        let report = walk(&trees, &account);

        assert_eq!(
            report.breaks,
            vec![format!(
                "account {}, seq 3: hash is not what the entry's fields give",
                account.id
            )]
        );
    }

    #[test]
    fn two_entries_that_traded_places_on_disk_are_named() {
        let (_dir, trees, account) = four_entries();
        let rows = rows(&trees, &account);
        trees.ledger.insert(&rows[1].0, rows[2].1.clone()).unwrap();
        trees.ledger.insert(&rows[2].0, rows[1].1.clone()).unwrap();

        let report = walk(&trees, &account);

        assert!(!report.holds());
        assert!(
            report.breaks[0].contains("seq 3: seq is 3, expected 2"),
            "{:?}",
            report.breaks
        );
    }

    #[test]
    fn the_newest_entry_gone_from_disk_is_named_by_the_balance() {
        let (_dir, trees, account) = four_entries();
        trees
            .ledger
            .remove(&rows(&trees, &account).last().unwrap().0)
            .unwrap();

        let report = walk(&trees, &account);

        assert_eq!(
            report.breaks,
            vec![format!(
                "account {}, seq 3: the balance is -12, the ledger ends at -9",
                account.id
            )]
        );
    }

    #[test]
    fn entries_an_earlier_build_wrote_are_chained_at_open_to_the_same_hashes() {
        let (dir, trees, account) = four_entries();
        let chained: Vec<LedgerEntry> = rows(&trees, &account)
            .iter()
            .map(|(_, v)| decode_entry(v).unwrap())
            .collect();
        // What a build before chained ledgers wrote: each entry's bytes without the tail.
        for (key, value) in rows(&trees, &account) {
            let entry = decode_entry(&value).unwrap();
            trees
                .ledger
                .insert(key, codec::encode(&entry).unwrap())
                .unwrap();
        }
        assert!(head_of(&trees.ledger, &account.id).is_err(), "not chained");

        chain_unchained(&trees, &dir.path().join("db")).unwrap();

        let again: Vec<LedgerEntry> = rows(&trees, &account)
            .iter()
            .map(|(_, v)| decode_entry(v).unwrap())
            .collect();
        let links = |es: &[LedgerEntry]| es.iter().map(|e| (e.seq, e.hash)).collect::<Vec<_>>();
        assert_eq!(links(&again), links(&chained));
        assert!(walk(&trees, &account).holds());
    }
}
