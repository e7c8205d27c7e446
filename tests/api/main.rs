//! The contract, tested through HTTP against the real `orderly` binary.

mod helpers;
mod in_process;
mod receiver;

mod admin;
mod backup;
mod business_rules;
mod busy;
mod clocks;
mod concurrency;
mod console;
mod copy;
mod crash;
mod demo;
mod durability;
mod edge;
mod expiry;
mod failover;
mod hardening;
mod instances;
mod lifecycle;
mod operations;
mod order_of_checks;
mod payment;
mod postgres;
mod providers;
mod reads;
mod refusals;
mod replay;
mod stalled_database;
mod stalled_flush;
mod stored_format;
mod timing;
mod tls;
mod webhook_ops;
mod webhooks;
