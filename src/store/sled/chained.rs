//! How sled keeps the ledger's chain (`domain::chain`): an entry's value is the entry, then its
//! `seq` and `hash` (`codec::encode_extended`: a build before chained ledgers reads the entry
//! and ignores what follows, and what it writes has no tail). An account's head is its newest
//! entry, the last of its keys: nothing is kept beside the balance, whose value a hot account
//! rewrites with every order (a head there made each rewrite of the balances' page 35 bytes an
//! account longer: 300 bytes more per order at a million orders, in `scripts/scale.sh`). The
//! writer thread is the store's one writer, so the newest entry it reads before a write is
//! still the newest when the write commits. An entry's `previous_hash` is never stored: it is
//! the hash of the entry before it, filled in where entries are read in order.
//!
//! At open, every account whose newest entry has no chain is chained (`chain_upgrade.rs`).

use std::collections::HashMap;
use std::sync::Mutex;

use super::codec::{self, CodecError};
use crate::domain::chain::{Hash, LedgerHead};
use crate::domain::ids::AccountId;
use crate::domain::ledger::LedgerEntry;
use crate::store::StoreError;

/// What follows an entry's value: `(seq, hash)`, absent on what a build before chained ledgers
/// wrote.
type Link = Option<(u64, Hash)>;

/// An entry's stored bytes: the entry, then its `seq` and `hash` (nothing for one not chained
/// yet: restored from a backup of a build before chained ledgers).
pub(super) fn encode_entry(entry: &LedgerEntry) -> Result<Vec<u8>, CodecError> {
    let link: Link = (entry.seq != 0).then_some((entry.seq, entry.hash));
    codec::encode_extended(entry, &link)
}

/// An entry's stored bytes read back, `seq` 0 when it is not chained yet; its
/// `previous_hash` is left for whoever reads it in order.
pub(super) fn decode_entry(bytes: &[u8]) -> Result<LedgerEntry, CodecError> {
    let (mut entry, link): (LedgerEntry, Link) = codec::decode_extended(bytes)?;
    if let Some((seq, hash)) = link {
        entry.seq = seq;
        entry.hash = hash;
    }
    Ok(entry)
}

/// `account`'s newest entry, if it has one.
pub(super) fn newest_entry(
    ledger: &sled::Tree,
    account: &AccountId,
) -> Result<Option<LedgerEntry>, StoreError> {
    match ledger.scan_prefix(account.bytes()).next_back() {
        Some(item) => Ok(Some(decode_entry(&item?.1)?)),
        None => Ok(None),
    }
}

/// `account`'s ledger head: its newest entry (the genesis when it has none).
pub(super) fn head_of(ledger: &sled::Tree, account: &AccountId) -> Result<LedgerHead, StoreError> {
    head_after(account, newest_entry(ledger, account)?.as_ref())
}

/// The head of `account`'s ledger whose newest entry is `newest` (`None`: no entry yet).
pub(super) fn head_after(
    account: &AccountId,
    newest: Option<&LedgerEntry>,
) -> Result<LedgerHead, StoreError> {
    match newest {
        None => Ok(LedgerHead::genesis(&account.to_string())),
        Some(entry) if entry.seq != 0 => Ok(LedgerHead::after(entry)),
        // Chained at open (`chain_unchained`): none is left once the store serves.
        Some(_) => Err(CodecError::Unchained.into()),
    }
}

/// Accounts whose head the writer keeps at most (about 80 bytes each: 8 MB); past it the
/// whole map is dropped and read again as it is needed.
const MAX_KEPT_HEADS: usize = 100_000;

/// Each account's ledger head as the writer last wrote it or read it, so that a batch of
/// orders does not read every account's newest entry again (one page a sled lookup away,
/// compressed on disk: on a batch over 64 accounts, a fifth of the new orders a second on
/// `perf/compare.sh`). Only the writer thread uses it, after each write has committed, and it
/// is the store's one writer: a head here is the newest entry's. Readers (`Trees::funds`)
/// read the newest entry itself: one that kept what it read could put back a head older than
/// a write that committed meanwhile.
#[derive(Default)]
pub(super) struct WriterHeads {
    heads: Mutex<HashMap<AccountId, LedgerHead>>,
}

impl WriterHeads {
    /// `account`'s head: kept, or read from its newest entry and kept.
    pub(super) fn of(
        &self,
        ledger: &sled::Tree,
        account: &AccountId,
    ) -> Result<LedgerHead, StoreError> {
        if let Some(head) = self.heads.lock().expect("heads").get(account) {
            return Ok(*head);
        }
        let head = head_of(ledger, account)?;
        self.keep(*account, head);
        Ok(head)
    }

    /// `account`'s head once a write that made it committed.
    pub(super) fn keep(&self, account: AccountId, head: LedgerHead) {
        let mut heads = self.heads.lock().expect("heads");
        if heads.len() >= MAX_KEPT_HEADS && !heads.contains_key(&account) {
            heads.clear();
        }
        heads.insert(account, head);
    }
}
