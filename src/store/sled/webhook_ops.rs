//! Webhook operations on sled (docs/contract.md "7. Webhooks"): secret rotation, redelivery and recovery. Each runs
//! as one job on the writer thread, so it is ordered with every attempt's settling: an
//! attempt in flight on an entry a redelivery replaced finds its entry gone and only logs.

use std::time::Duration;

use sled::Transactional;

use super::codec;
use super::events::{event_id, outbox_key};
use super::keys::child_key;
use super::spooled::Spooled;
use super::trees::Trees;
use super::tx::{settle, TxResult};
use crate::domain::event::{redelivery, Delivery, DeliveryLog, Event};
use crate::domain::ids::{AccountId, Id};
use crate::domain::time::Millis;
use crate::domain::webhook_secret::{retire, PreviousSecret};
use crate::store::{Redelivered, StoreError};

impl Trees {
    pub(super) fn previous_secret(
        &self,
        account: &AccountId,
    ) -> Result<Option<PreviousSecret>, StoreError> {
        Trees::get(&self.previous_secrets, account.bytes())
    }

    /// Makes `secret` the account's; the one it replaces signs beside it until the overlap
    /// ends. `None`: no such account.
    pub(super) fn rotate_webhook_secret(
        &self,
        account: &AccountId,
        secret: String,
        now: Millis,
        overlap: Duration,
    ) -> Result<Option<PreviousSecret>, StoreError> {
        let Some(mut stored) = self.account(account)? else {
            return Ok(None);
        };
        let previous = retire(&stored.webhook_secret, now, overlap);
        stored.webhook_secret = secret;
        let (account_bytes, previous_bytes) = (codec::encode(&stored)?, codec::encode(&previous)?);
        let outcome = (&self.accounts, &self.previous_secrets).transaction(
            |(accounts, secrets)| -> TxResult<(), ()> {
                self.changes.insert(
                    Spooled::Account,
                    accounts,
                    &account.bytes()[..],
                    account_bytes.as_slice(),
                )?;
                self.changes.insert(
                    Spooled::PreviousSecret,
                    secrets,
                    &account.bytes()[..],
                    previous_bytes.as_slice(),
                )?;
                Ok(())
            },
        );
        settle(outcome)?.ok();
        Ok(Some(previous))
    }

    /// The event `id`, with its account: the owner's when given, else found by looking under
    /// each account (events are keyed by account; deployments have a few hundred accounts,
    /// and only the operator's redelivery asks without naming one).
    pub(super) fn event_by_id(
        &self,
        id: &Id,
        owner: Option<AccountId>,
    ) -> Result<Option<Event>, StoreError> {
        let lookup = |account: &[u8]| Trees::get(&self.events, child_key(account, &id.bytes()));
        if let Some(owner) = owner {
            return lookup(&owner.bytes());
        }
        for account in self.accounts.iter().keys() {
            if let Some(event) = lookup(&account?)? {
                return Ok(Some(event));
            }
        }
        Ok(None)
    }

    /// Queues one attempt of `event`'s callback at `now` (`domain::event::redelivery`).
    pub(super) fn redeliver(&self, event: &Event, now: Millis) -> Result<Redelivered, StoreError> {
        let id = event_id(&event.id)?;
        let log: Option<DeliveryLog> = Trees::get(&self.delivery_logs, id.bytes())?;
        // The callback's outbox entry, if it is still queued: due at its first attempt
        // (the event's time) or at the next one its log names.
        let queued_at = match &log {
            Some(log) if log.ended.is_some() => None,
            Some(log) => log.next_attempt_at,
            None => Some(event.created_at),
        };
        let queued: Option<(Millis, Delivery)> = match queued_at {
            Some(at) => Trees::get::<Delivery>(&self.outbox, outbox_key(at, &id))?.map(|d| (at, d)),
            None => None,
        };
        let Some(again) = redelivery(event, queued.as_ref().map(|(at, d)| (*at, d)), log, now)
        else {
            return Ok(Redelivered::NoCallback);
        };
        let replaced = queued.map(|(at, _)| outbox_key(at, &id));
        let entry = (
            outbox_key(again.due_at, &id),
            codec::encode(&again.delivery)?,
        );
        let log = again.log.as_ref().map(codec::encode).transpose()?;
        let outcome =
            (&self.outbox, &self.delivery_logs).transaction(|(outbox, logs)| -> TxResult<(), ()> {
                if let Some(key) = &replaced {
                    self.changes
                        .remove(Spooled::Outbox, outbox, key.as_slice())?;
                }
                self.changes.insert(
                    Spooled::Outbox,
                    outbox,
                    entry.0.as_slice(),
                    entry.1.as_slice(),
                )?;
                if let Some(log) = &log {
                    self.changes.insert(
                        Spooled::DeliveryLog,
                        logs,
                        &id.bytes()[..],
                        log.as_slice(),
                    )?;
                }
                Ok(())
            });
        settle(outcome)?.ok();
        Ok(Redelivered::Queued)
    }

    /// The account's events whose callback was given up at or after `since`, oldest first.
    pub(super) fn given_up_since(
        &self,
        account: &AccountId,
        since: Millis,
    ) -> Result<Vec<Event>, StoreError> {
        let mut found = Vec::new();
        for entry in self.events.scan_prefix(account.bytes()) {
            let (_, bytes) = entry?;
            let event: Event = codec::decode(&bytes)?;
            let log: Option<DeliveryLog> =
                Trees::get(&self.delivery_logs, event_id(&event.id)?.bytes())?;
            if log.is_some_and(|l| l.given_up_since(since)) {
                found.push(event);
            }
        }
        Ok(found)
    }

    /// Redelivers those of `events` still given up at or after `since` (looked at again on
    /// the writer: one may have been redelivered since the scan); returns how many.
    pub(super) fn recover(
        &self,
        events: &[Event],
        since: Millis,
        now: Millis,
    ) -> Result<u64, StoreError> {
        let mut requeued = 0;
        for event in events {
            let log: Option<DeliveryLog> =
                Trees::get(&self.delivery_logs, event_id(&event.id)?.bytes())?;
            if log.is_some_and(|l| l.given_up_since(since))
                && self.redeliver(event, now)? == Redelivered::Queued
            {
                requeued += 1;
            }
        }
        Ok(requeued)
    }
}
