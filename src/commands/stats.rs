//! `orderly stats`: rows per keyspace (sled trees or PostgreSQL tables), one per line.

use super::{block_on, Failure};
use crate::bounds::{Deadline, COMMAND_DEADLINE, MAX_PENDING_WRITES};
use crate::config::StatsArgs;
use crate::store;

/// Why the rows were not counted, and whether that is a store this binary must not open
/// (exit 2: a sled store refused before it was touched, a newer schema) or anything else.
#[derive(Debug, thiserror::Error)]
#[error("stats: {0}")]
pub(crate) struct StatsFailure(String, bool);

impl Failure for StatsFailure {
    fn exit_code(&self) -> u8 {
        if self.1 {
            2
        } else {
            1
        }
    }
}

pub(crate) fn run(args: &StatsArgs) -> Result<(), StatsFailure> {
    let engine = super::walked_engine(&args.data_dir, args.database_url.as_deref());
    let counts = block_on(async {
        let deadline = Deadline::after(COMMAND_DEADLINE);
        let store = store::open(engine, Default::default(), MAX_PENDING_WRITES as usize)
            .await
            .map_err(|e| StatsFailure(e.to_string(), e.is_usage()))?;
        let counts = store.row_counts(deadline).await;
        store.stop(deadline).await;
        counts.map_err(|e| StatsFailure(e.to_string(), false))
    })?;
    for (keyspace, rows) in counts {
        println!("{keyspace}\t{rows}");
    }
    Ok(())
}
