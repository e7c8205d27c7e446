//! orderly-client against the real `orderly` binary over HTTP, through a proxy that loses
//! answers when a test asks it to.

mod cli;
mod proxy;
mod server;

mod crash;
mod funds;
mod horizon;
mod intents;
mod ledger;
mod lossy;
mod policy;
mod receive;
mod webhooks;
