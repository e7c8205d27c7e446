//! The contract, tested through HTTP against the real `orderly` binary.

mod helpers;

mod admin;
mod business_rules;
mod concurrency;
mod crash;
mod edge;
mod expiry;
mod order_of_checks;
mod payment;
mod reads;
mod replay;
