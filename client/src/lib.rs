//! orderly-client: the partner's side of orderly's promise that a retry is always safe.
//!
//! An intent (one business order) is journaled with its idempotency key and its exact request
//! bytes, fsynced, before the first attempt; every retry sends those bytes under that key,
//! after the policy of client/README.md says how long to wait; `resume` picks up what a
//! restart left pending, and past the key's 24-hour lifetime an intent is only looked up,
//! never re-sent. `webhooks` verifies and deduplicates the callbacks coming back. `ledger`
//! verifies the account's ledger as a chain, onto what it verified before, and reports a
//! divergence when the server's history changed.

pub mod basket;
pub mod client;
mod files;
pub mod journal;
pub mod ledger;
pub mod outcome;
pub mod policy;
pub mod webhooks;

pub use basket::{Basket, IntentId, Item};
pub use client::{Client, Config, Error};
pub use journal::{Journal, JournalError};
pub use ledger::{LedgerError, Verified};
pub use outcome::{Outcome, OutcomeKind};
