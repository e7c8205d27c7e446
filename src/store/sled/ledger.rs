//! The balance ledger as partners read it: newest first a page at a time, or the entries
//! after a `seq`, oldest first. An account's entries are keyed by their time-ordered ids, so
//! the order of their keys is the order of their `seq`: the entry of `seq` n is the n-th key.

use super::chained::{decode_entry, head_of};
use super::trees::{newest_first, trailing_id, Trees};
use crate::domain::chain::fill_previous;
use crate::domain::ids::{AccountId, Id, IdKind};
use crate::domain::ledger::LedgerEntry;
use crate::store::{Page, StoreError};

impl Trees {
    /// Entries strictly older than `before` (a `txn_` id), newest first.
    pub(super) fn ledger_page(
        &self,
        account: &AccountId,
        before: Option<Id>,
        limit: usize,
    ) -> Result<Page<LedgerEntry>, StoreError> {
        let prefix = account.bytes();
        let keys = newest_first(
            &self.ledger,
            &prefix,
            before.map(|b| b.bytes()).as_ref(),
            limit,
        )?;
        // The key past the page, when there is one, is the page's oldest entry's predecessor.
        let mut items = Vec::with_capacity(keys.len());
        for key in &keys {
            let bytes = self
                .ledger
                .get(key)?
                .ok_or_else(|| StoreError::Corrupt("ledger key vanished".into()))?;
            items.push(decode_entry(&bytes)?);
        }
        fill_previous(&account.to_string(), &mut items, true);
        items.truncate(limit);
        let next_cursor = if keys.len() > limit {
            let last = trailing_id(&keys[limit - 1])?;
            Id::from_bytes(IdKind::Transaction, &last).map(|id| id.to_string())
        } else {
            None
        };
        Ok(Page { items, next_cursor })
    }

    /// At most `limit` entries with a `seq` above `after`, oldest first. The account's head
    /// says how many entries it has; they are read from whichever end of its keys is nearer,
    /// with the one at `after` (their first one's predecessor). From the end, the reading
    /// goes back until that predecessor whatever was written since the head was read: counted
    /// positions would then fall on newer entries and leave a gap.
    pub(super) fn ledger_after(
        &self,
        account: &AccountId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<LedgerEntry>, StoreError> {
        let total = head_of(&self.ledger, account)?.seq;
        if after >= total || limit == 0 {
            return Ok(Vec::new());
        }
        // Positions (0-based) `first..end`: the predecessor (when `after` > 0), then the wanted.
        let first = after.saturating_sub(1);
        let end = total.min(after.saturating_add(limit as u64));
        let rows = self.ledger.scan_prefix(account.bytes());
        let mut items = Vec::new();
        if first <= total - end {
            let skip = usize::try_from(first).unwrap_or(usize::MAX);
            let count = usize::try_from(end - first).unwrap_or(usize::MAX);
            for item in rows.skip(skip).take(count) {
                items.push(decode_entry(&item?.1)?);
            }
        } else {
            for item in rows.rev() {
                let entry = decode_entry(&item?.1)?;
                let reached = entry.seq <= after;
                items.push(entry);
                if reached {
                    break;
                }
            }
            items.reverse();
        }
        fill_previous(&account.to_string(), &mut items, false);
        items.retain(|e| e.seq > after);
        items.truncate(limit);
        Ok(items)
    }
}
