//! Events and the outbox: recorded inside the transaction of the change they describe, then
//! read by partners (`GET /b2b/events`) and by the webhook worker, which takes due deliveries
//! and reschedules failures under the same event id.

use sled::transaction::TransactionalTree;

use super::accounts::account_bytes;
use super::keys::child_key;
use super::{codec, tx, Page, Store, StoreError, TxResult};
use crate::domain::event::{Delivery, Event};
use crate::domain::ids::{Id, IdKind};
use crate::domain::time::Millis;

/// `due_at ‖ event id`: the outbox is scanned up to now.
fn outbox_key(due_at: Millis, event_id: &Id) -> Vec<u8> {
    child_key(&due_at.to_be_bytes(), &event_id.bytes())
}

fn event_id(id: &str) -> Result<Id, StoreError> {
    Id::parse(IdKind::Event, id).ok_or_else(|| StoreError::Corrupt(format!("bad event id {id:?}")))
}

/// Records `event` (whose id is `id`, of `account`) and, when the order has a callbackUrl,
/// its first delivery, due at once.
pub fn record_event<R>(
    events: &TransactionalTree,
    outbox: &TransactionalTree,
    account: &[u8; 16],
    id: &Id,
    event: &Event,
) -> TxResult<(), R> {
    tx(events.insert(child_key(account, &id.bytes()), codec::encode(event)?))?;
    if let Some(url) = &event.order.callback_url {
        let delivery = Delivery {
            event_id: event.id.clone(),
            account_id: event.account_id.clone(),
            url: url.clone(),
            attempt: 1,
        };
        tx(outbox.insert(outbox_key(event.created_at, id), codec::encode(&delivery)?))?;
    }
    Ok(())
}

/// A delivery taken from the outbox, with the key that removes or reschedules it.
pub struct DueDelivery {
    key: sled::IVec,
    pub delivery: Delivery,
}

impl Store {
    pub fn event(&self, account_id: &str, id: &str) -> Result<Option<Event>, StoreError> {
        let key = child_key(&account_bytes(account_id)?, &event_id(id)?.bytes());
        match self.events.get(key)? {
            Some(bytes) => Ok(Some(codec::decode(&bytes)?)),
            None => Ok(None),
        }
    }

    /// The account's events, oldest first, strictly after the cursor event.
    pub fn events_page(
        &self,
        account_id: &str,
        after: Option<Id>,
        limit: usize,
    ) -> Result<Page<Event>, StoreError> {
        let prefix = account_bytes(account_id)?;
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

    /// Up to `max` deliveries due at `now`, oldest first.
    pub fn due_deliveries(&self, now: Millis, max: usize) -> Result<Vec<DueDelivery>, StoreError> {
        let mut due = Vec::new();
        for entry in self
            .outbox
            .range(..(now + 1).to_be_bytes().to_vec())
            .take(max)
        {
            let (key, bytes) = entry?;
            due.push(DueDelivery {
                key,
                delivery: codec::decode(&bytes)?,
            });
        }
        Ok(due)
    }

    /// The delivery is done (delivered, or given up): it leaves the outbox.
    pub fn finish_delivery(&self, due: &DueDelivery) -> Result<(), StoreError> {
        self.outbox.remove(&due.key)?;
        Ok(())
    }

    /// Moves the delivery to `due_at` as its next attempt, same event id.
    pub fn reschedule_delivery(&self, due: &DueDelivery, due_at: Millis) -> Result<(), StoreError> {
        let mut next = due.delivery.clone();
        next.attempt += 1;
        let key = outbox_key(due_at, &event_id(&next.event_id)?);
        let value = codec::encode(&next)?;
        let outcome = self.outbox.transaction(|outbox| -> TxResult<(), ()> {
            tx(outbox.remove(&due.key))?;
            tx(outbox.insert(key.as_slice(), value.as_slice()))?;
            Ok(())
        });
        super::settle(outcome)?.ok();
        Ok(())
    }
}
