//! Pure business types and decisions: no I/O, no clocks read here except through `time`.

pub mod account;
pub mod basket;
pub mod callback_url;
pub mod cidr;
pub mod event;
pub mod fingerprint;
pub mod idempotency_key;
pub mod ids;
pub mod invariant;
pub mod ledger;
pub mod lifecycle;
pub mod limits;
pub mod money;
pub(crate) mod money_in;
pub mod order;
pub mod placing;
pub mod product;
pub mod time;
pub mod webhook_secret;
