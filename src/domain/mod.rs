//! Pure business types and decisions: no I/O, no clocks read here except through `time`.

pub(crate) mod account;
pub(crate) mod basket;
pub(crate) mod callback_url;
pub(crate) mod chain;
pub(crate) mod cidr;
#[cfg(test)]
mod edges;
pub(crate) mod event;
pub(crate) mod fingerprint;
pub(crate) mod idempotency_key;
pub(crate) mod ids;
pub(crate) mod invariant;
pub(crate) mod ledger;
pub(crate) mod lifecycle;
pub(crate) mod limits;
pub(crate) mod money;
pub(crate) mod money_in;
pub(crate) mod order;
pub(crate) mod placing;
pub(crate) mod product;
pub(crate) mod time;
pub(crate) mod webhook_secret;
