//! orderly: a single-binary B2B order server where a retry is always safe.
//!
//! Every module is private. The `pub use` lines below are the library's whole public surface:
//! what the binary (`src/main.rs`), the HTTP tests (`tests/api`), the storage port's
//! conformance suite (`tests/port`), the benchmarks and the examples use, and the types those
//! items' signatures name (the port's calls take and answer many). Anything else is
//! `pub(crate)`, and the lints keep it so: a public item no caller can reach, a public type
//! reachable but not named here, or a public item without a doc fails CI.
#![warn(missing_docs, unreachable_pub, unnameable_types)]

mod api;
mod background;
mod bounds;
mod commands;
mod config;
mod credentials;
mod disk_space;
mod domain;
mod edge;
mod error;
/// Entry points for the fuzzers (`fuzz/`): every parser of outside bytes.
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
mod header_names;
mod logging;
mod metrics;
mod startup;
mod store;
mod tls;
mod views;
mod workers;

// The binary: its flags and their values, its commands, its log, and the panic that stops it.
pub use commands::run as run_command;
pub use config::{
    Cli, Command, CopyArgs, MigrateArgs, RestoreArgs, Settings, StatsArgs, VerifyArgs,
};
pub use domain::invariant::VIOLATED as INVARIANT_VIOLATED;
pub use logging::{flush as flush_log, init as init_log};

// A server in the tests' own process (`tests/api/in_process.rs`), why it did not start or
// ended badly, and the rate limiter its memory example drives.
pub use credentials::CredentialsError;
pub use edge::rate_limit::{Decision, RateLimits};
pub use startup::demo::DemoError;
pub use startup::{Application, RunError, StartupError};
pub use store::{FlushHook, FlushStep};
pub use tls::TlsError;

// The storage port, as the conformance suite and the benchmarks drive it: an engine opened,
// the calls, what they take and answer, their refusals, a backup's records.
pub use store::postgres::connect::ConnectError;
pub use store::postgres::OpenError as PostgresOpenError;
pub use store::{
    checked_counts, open as open_store, Authenticated, CancelRefusal, CancelRequest, CreditRefusal,
    DeliveryOutcome, DueDelivery, Engine, KeyClaim, KeyRecord, NewCredit, NewOrder, OpenError,
    OrderRefusal, Page, Prefetched, Progress, ProviderCredit, ProviderPaymentRecord,
    ProviderRefusal, Record, Recorded, Redelivered, RefundRefusal, RefundRequest, SharedRateLimit,
    Snapshot, Spent, Stopped, Store, StoreError, StoredResponse,
};

// The domain values those calls carry, and the bodies stored with them.
pub use bounds::{Deadline, WRITES_FLOWING_WITHIN};
pub use domain::account::{hash_api_key, new_api_key, Account, ApiKeyRecord, Scope, Shortfall};
pub use domain::basket::{BasketRejection, RequestedLine};
pub use domain::callback_url::{AddressPolicy, CallbackRefusal, CallbackUrl};
pub use domain::chain::{Funds, LedgerHead};
pub use domain::event::{Delivery, DeliveryAttempt, DeliveryEnd, DeliveryLog, Event, EventKind};
pub use domain::fingerprint::{Fingerprint, LineRef, Operation};
pub use domain::idempotency_key::{IdempotencyKey, KeyError};
pub use domain::ids::{AccountId, Id, IdKind, OrderId};
pub use domain::ledger::{LedgerEntry, LedgerReason};
pub use domain::money::Cents;
pub use domain::order::{BalanceView, Order, OrderLine, OrderStatus, Refund};
pub use domain::product::Product;
pub use domain::time::now_millis;
pub use domain::webhook_secret::PreviousSecret;
pub use metrics::Metrics;
pub use views::{balance_only, order_only, order_placed, refund_made};
