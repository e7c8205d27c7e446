//! Events and the outbox: recorded inside the transaction of the change they describe, then
//! read by partners (`GET /b2b/events`) and by the webhook worker, which takes due deliveries
//! and reschedules failures under the same event id.

use sled::transaction::TransactionalTree;
use sled::Transactional;

use super::changes::Changes;
use super::codec;
use super::keys::child_key;
use super::spooled::Spooled;
use super::trees::Trees;
use super::tx::{settle, TxResult};
use crate::domain::account::Account;
use crate::domain::event::{Delivery, DeliveryAttempt, DeliveryLog, Event};
use crate::domain::ids::{AccountId, Id, IdKind};
use crate::domain::lifecycle::Emitted;
use crate::domain::money::Cents;
use crate::domain::time::Millis;
use crate::store::{DeliveryFilter, DeliveryOutcome, DueDelivery, Page, StoreError};

/// `due_at ‖ event id`: the outbox is scanned up to now.
pub(super) fn outbox_key(due_at: Millis, event_id: &Id) -> Vec<u8> {
    child_key(&due_at.to_be_bytes(), &event_id.bytes())
}

pub(super) fn event_id(id: &str) -> Result<Id, StoreError> {
    Id::parse(IdKind::Event, id).ok_or_else(|| StoreError::Corrupt(format!("bad event id {id:?}")))
}

/// Records a decided event (whose id is `id`) and its first callback, when it has one.
pub(super) fn record_event<R>(
    changes: &Changes,
    events: &TransactionalTree,
    outbox: &TransactionalTree,
    id: &Id,
    emitted: &Emitted,
) -> TxResult<(), R> {
    let event = &emitted.event;
    changes.insert(
        Spooled::Event,
        events,
        child_key(&event.account_id.bytes(), &id.bytes()),
        codec::encode(event)?,
    )?;
    if let Some(delivery) = &emitted.delivery {
        changes.insert(
            Spooled::Outbox,
            outbox,
            outbox_key(event.created_at, id),
            codec::encode(delivery)?,
        )?;
    }
    Ok(())
}

impl Trees {
    pub(super) fn delivery_logs(
        &self,
        event_ids: &[String],
    ) -> Result<Vec<Option<DeliveryLog>>, StoreError> {
        event_ids
            .iter()
            .map(|id| Trees::get(&self.delivery_logs, event_id(id)?.bytes()))
            .collect()
    }

    /// Accounts with their balances, oldest first (ids are time-ordered), after the cursor.
    pub(super) fn accounts_page(
        &self,
        after: Option<AccountId>,
        limit: usize,
    ) -> Result<Page<(Account, Cents)>, StoreError> {
        let start = match after {
            Some(id) => std::ops::Bound::Excluded(id.bytes().to_vec()),
            None => std::ops::Bound::Unbounded,
        };
        let mut items = Vec::with_capacity(limit + 1);
        for row in self
            .accounts
            .range::<Vec<u8>, _>((start, std::ops::Bound::Unbounded))
            .take(limit + 1)
        {
            let (_, bytes) = row?;
            let account: Account = codec::decode(&bytes)?;
            let balance = self.funds(&account.id)?.available;
            items.push((account, balance));
        }
        let next_cursor = if items.len() > limit {
            items.truncate(limit);
            items.last().map(|(a, _)| a.id.to_string())
        } else {
            None
        };
        Ok(Page { items, next_cursor })
    }
}

/// An outbox entry that is due.
pub(super) enum Due {
    Ready(Box<DueDelivery>),
    /// Its event or account is gone: the key to remove.
    Orphan(Vec<u8>),
}

impl Trees {
    /// The account's events, oldest first, strictly after the cursor event.
    pub(super) fn events_page(
        &self,
        account: &AccountId,
        after: Option<Id>,
        limit: usize,
    ) -> Result<Page<Event>, StoreError> {
        let prefix = account.bytes();
        let start = match after {
            Some(id) => std::ops::Bound::Excluded(child_key(&prefix, &id.bytes())),
            None => std::ops::Bound::Included(prefix.to_vec()),
        };
        let mut items: Vec<Event> = Vec::with_capacity(limit + 1);
        for entry in self
            .events
            .range::<Vec<u8>, _>((start, std::ops::Bound::Unbounded))
        {
            let (key, bytes) = entry?;
            if !key.starts_with(&prefix) || items.len() > limit {
                break;
            }
            items.push(codec::decode(&bytes)?);
        }
        let next_cursor = if items.len() > limit {
            items.truncate(limit);
            items.last().map(|e| e.id.clone())
        } else {
            None
        };
        Ok(Page { items, next_cursor })
    }

    /// Up to `max` deliveries due at `now`, oldest first, with their events and secrets. An
    /// entry whose event or account is gone cannot be sent; it comes back as an orphan for
    /// the writer to remove.
    pub(super) fn due_deliveries(
        &self,
        now: Millis,
        max: usize,
        mut take: DeliveryFilter,
    ) -> Result<Vec<Due>, StoreError> {
        let mut due = Vec::new();
        for entry in self
            .outbox
            .range(..now.saturating_add(1).to_be_bytes().to_vec())
        {
            if due.len() >= max {
                break;
            }
            let (key, bytes) = entry?;
            let delivery: Delivery = codec::decode(&bytes)?;
            if !take(&delivery) {
                continue;
            }
            let due_at = u64::from_be_bytes(key[..8].try_into().expect("8-byte due time"));
            let id = event_id(&delivery.event_id)?;
            let event: Option<Event> = Trees::get(
                &self.events,
                child_key(&delivery.account_id.bytes(), &id.bytes()),
            )?;
            let account: Option<Account> = self.account(&delivery.account_id)?;
            match (event, account) {
                (Some(event), Some(account)) => due.push(Due::Ready(Box::new(DueDelivery {
                    due_at,
                    claim: 0,
                    claimed_in: 0,
                    delivery,
                    event,
                    previous_secret: self.previous_secret(&account.id)?,
                    webhook_secret: account.webhook_secret,
                }))),
                _ => {
                    log::warn!(
                        "webhook {} dropped: its event or account no longer exists",
                        delivery.event_id
                    );
                    due.push(Due::Orphan(key.to_vec()));
                }
            }
        }
        Ok(due)
    }

    pub(super) fn remove_outbox_entry(&self, key: &[u8]) -> Result<(), StoreError> {
        self.changes.delete(Spooled::Outbox, &self.outbox, key)
    }

    /// Removes the delivery from the outbox, or moves it to its next attempt. When its entry
    /// is gone (a redelivery took its place while the attempt was in flight), the attempt is
    /// only logged: what comes next is the redelivery's to say.
    pub(super) fn settle_delivery(
        &self,
        due: &DueDelivery,
        outcome: DeliveryOutcome,
        attempt: &DeliveryAttempt,
    ) -> Result<(), StoreError> {
        let id = event_id(&due.delivery.event_id)?;
        let current = outbox_key(due.due_at, &id);
        // Read on the writer thread, which alone writes the outbox: still true at the commit.
        let settles = self.outbox.contains_key(&current)?;
        let log: DeliveryLog = Trees::get(&self.delivery_logs, id.bytes())?.unwrap_or_default();
        let log = codec::encode(&log.after(attempt.clone(), outcome, settles))?;
        let next = match due.delivery.next(outcome).filter(|_| settles) {
            Some((at, next)) => Some((outbox_key(at, &id), codec::encode(&next)?)),
            None => None,
        };
        let outcome =
            (&self.outbox, &self.delivery_logs).transaction(|(outbox, logs)| -> TxResult<(), ()> {
                if settles {
                    self.changes
                        .remove(Spooled::Outbox, outbox, current.as_slice())?;
                }
                if let Some((key, value)) = &next {
                    self.changes.insert(
                        Spooled::Outbox,
                        outbox,
                        key.as_slice(),
                        value.as_slice(),
                    )?;
                }
                self.changes
                    .insert(Spooled::DeliveryLog, logs, &id.bytes()[..], log.as_slice())?;
                Ok(())
            });
        settle(outcome)?.ok();
        Ok(())
    }
}
