//! The trees a backup copies: those that hold records (indexes are left out and rebuilt by a
//! restore), in the order a backup lists them.

/// A record-holding tree, in the order of the spool (balances first: each account's record
/// carries its balance) and so of the backup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub(super) enum Spooled {
    Balance,
    Account,
    ApiKey,
    Product,
    Order,
    Ledger,
    Refund,
    Event,
    Outbox,
    ProviderPayment,
    IdempotencyKey,
    DeliveryLog,
    PreviousSecret,
}

pub(super) const SPOOLED: [Spooled; 13] = [
    Spooled::Balance,
    Spooled::Account,
    Spooled::ApiKey,
    Spooled::Product,
    Spooled::Order,
    Spooled::Ledger,
    Spooled::Refund,
    Spooled::Event,
    Spooled::Outbox,
    Spooled::ProviderPayment,
    Spooled::IdempotencyKey,
    Spooled::DeliveryLog,
    Spooled::PreviousSecret,
];

/// One row as spooled: its tree, key and value.
pub(super) type SpooledRow = (Spooled, Vec<u8>, Vec<u8>);
