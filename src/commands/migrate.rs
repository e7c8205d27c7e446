//! `orderly migrate --database-url URL`: the pending migrations applied, one line on stdout;
//! a schema newer than this binary is exit 2, any other failure exit 1.

use super::{block_on, Failure};
use crate::store::postgres::{self as shared, OpenError};

/// Why the schema was not brought up to date.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MigrateFailure {
    #[error("{0}")]
    TooNew(OpenError),
    #[error("migrate failed: {0}")]
    Failed(OpenError),
}

impl Failure for MigrateFailure {
    fn exit_code(&self) -> u8 {
        match self {
            MigrateFailure::TooNew(_) => 2,
            MigrateFailure::Failed(_) => 1,
        }
    }
}

pub(crate) fn run(url: &str) -> Result<(), MigrateFailure> {
    match block_on(shared::migrate(url)) {
        Ok(applied) => {
            println!("orderly: schema up to date (applied now: {applied:?})");
            Ok(())
        }
        Err(e @ OpenError::SchemaTooNew(_)) => Err(MigrateFailure::TooNew(e)),
        Err(e) => Err(MigrateFailure::Failed(e)),
    }
}
