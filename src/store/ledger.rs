//! The balance ledger as partners read it: newest first, a page at a time.

use super::accounts::account_bytes;
use super::{codec, newest_first, trailing_id, Page, Store, StoreError};
use crate::domain::account::Account;
use crate::domain::ids::{Id, IdKind};
use crate::domain::ledger::LedgerEntry;

impl Store {
    /// Entries strictly older than `before` (a `txn_` id), newest first.
    pub fn ledger_page(
        &self,
        account: &Account,
        before: Option<Id>,
        limit: usize,
    ) -> Result<Page<LedgerEntry>, StoreError> {
        let prefix = account_bytes(&account.id)?;
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
