//! The balance ledger as partners read it: newest first, a page at a time.

use super::codec;
use super::trees::{newest_first, trailing_id, Trees};
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
        let mut items = Vec::with_capacity(keys.len());
        for key in keys.iter().take(limit) {
            let bytes = self
                .ledger
                .get(key)?
                .ok_or_else(|| StoreError::Corrupt("ledger key vanished".into()))?;
            items.push(codec::decode(&bytes)?);
        }
        let next_cursor = if keys.len() > limit {
            let last = trailing_id(&keys[limit - 1])?;
            Id::from_bytes(IdKind::Transaction, &last).map(|id| id.to_string())
        } else {
            None
        };
        Ok(Page { items, next_cursor })
    }
}
