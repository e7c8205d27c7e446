//! How sled keeps the ledger's chain (`domain::chain`): a balance's value is its `Cents`, then
//! the account's ledger head; an entry's value is the entry, then its `seq` and `hash`
//! (`codec::encode_extended`: a build before chained ledgers reads both and ignores what
//! follows, and what it writes has no tail). An entry's `previous_hash` is never stored: it
//! is the hash of the entry before it, filled in where entries are read in order.
//!
//! At open, every account whose balance has no head (a store of a build before chained
//! ledgers, or one such a build wrote to since) has its entries chained in their order, the
//! order of their keys (`chain_unchained`).

use std::path::Path;
use std::time::{Duration, Instant};

use super::codec::{self, CodecError};
use super::trees::Trees;
use super::upgrade::durable;
use crate::domain::chain::{link, Funds, Hash, LedgerHead};
use crate::domain::ids::AccountId;
use crate::domain::ledger::LedgerEntry;
use crate::domain::money::Cents;
use crate::store::StoreError;

/// What follows a value: `(seq, hash)`, absent on what a build before chained ledgers wrote.
type Link = Option<(u64, Hash)>;

/// A balance's stored bytes: the balance, then its head.
pub(super) fn encode_funds(funds: &Funds) -> Result<Vec<u8>, CodecError> {
    let link: Link = Some((funds.head.seq, funds.head.hash));
    codec::encode_extended(&funds.available, &link)
}

/// A balance's stored bytes read back: the balance and its head (`None`: not chained yet).
pub(super) fn decode_funds(bytes: &[u8]) -> Result<(Cents, Option<LedgerHead>), CodecError> {
    let (available, link): (Cents, Link) = codec::decode_extended(bytes)?;
    Ok((available, link.map(|(seq, hash)| LedgerHead { seq, hash })))
}

/// `account`'s funds from its stored balance (`None`: nothing stored, an empty ledger).
pub(super) fn funds_of(account: &AccountId, stored: Option<&[u8]>) -> Result<Funds, CodecError> {
    let Some(bytes) = stored else {
        return Ok(Funds::empty(&account.to_string()));
    };
    match decode_funds(bytes)? {
        (available, Some(head)) => Ok(Funds { available, head }),
        // Chained at open (`chain_unchained`): none is left once the store serves.
        (_, None) => Err(CodecError::Unchained),
    }
}

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

/// Entries rewritten in one sled batch: an account of a million entries is not held in
/// memory whole.
const BATCH_ENTRIES: u64 = 10_000;

/// How often the upgrade says how far it is.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// Chains the entries of every account whose balance has no head, in their order, and gives
/// the balance its head; made durable before the store serves. A crash part way leaves those
/// balances without a head, so the next open chains them again from their first entry: the
/// same entries give the same hashes.
pub(super) fn chain_unchained(trees: &Trees, data_dir: &Path) -> Result<(), StoreError> {
    let mut unchained = Vec::new();
    for item in trees.balances.iter() {
        let (key, value) = item?;
        if decode_funds(&value)?.1.is_none() {
            unchained.push(key);
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
    for (done, key) in unchained.iter().enumerate() {
        let account = AccountId::from_bytes(key)
            .ok_or_else(|| StoreError::Corrupt("a balance has a malformed key".into()))?;
        let account_text = account.to_string();
        let mut head = LedgerHead::genesis(&account_text);
        let mut batch = sled::Batch::default();
        for item in trees.ledger.scan_prefix(key) {
            let (entry_key, value) = item?;
            let mut entry = decode_entry(&value)?;
            link(&account_text, &head, &mut entry);
            head = LedgerHead::after(&entry);
            batch.insert(entry_key, encode_entry(&entry)?);
            entries += 1;
            if entries % BATCH_ENTRIES == 0 {
                trees.ledger.apply_batch(std::mem::take(&mut batch))?;
            }
        }
        trees.ledger.apply_batch(batch)?;
        let (available, _) = decode_funds(
            &trees
                .balances
                .get(key)?
                .ok_or_else(|| StoreError::Corrupt("a balance vanished".into()))?,
        )?;
        trees
            .balances
            .insert(key, encode_funds(&Funds { available, head })?)?;
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
