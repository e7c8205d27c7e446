//! orderly: a single-binary B2B order server where a retry is always safe.

pub mod api;
pub mod background;
pub mod bounds;
pub mod commands;
pub mod config;
pub mod domain;
pub mod edge;
pub mod error;
pub mod header_names;
pub mod logging;
pub mod metrics;
pub mod startup;
pub mod store;
pub mod tls;
pub mod views;
pub mod workers;
