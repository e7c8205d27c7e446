//! The share of the pool that API key lookups may hold at once. A lookup is needed only for a
//! key this instance has no copy of and does not know to be absent (it is not caught up, or
//! the key was just created); whatever arrives with such keys, the rest of the pool stays for
//! the writes and reads partners wait on.

use tokio::sync::{Semaphore, SemaphorePermit};

use crate::bounds::Deadline;
use crate::store::StoreError;

pub(super) struct KeyReads {
    permits: Semaphore,
}

impl KeyReads {
    /// A quarter of the pool, at least one connection.
    pub(super) fn new(pool_size: usize) -> Self {
        KeyReads {
            permits: Semaphore::new((pool_size / 4).max(1)),
        }
    }

    /// A place among the lookups in flight, waited for until `deadline`: past it the request
    /// is answered that nothing was done (503), like any read the storage did not serve.
    pub(super) async fn enter(
        &self,
        deadline: Deadline,
    ) -> Result<SemaphorePermit<'_>, StoreError> {
        match tokio::time::timeout_at(deadline.instant().into(), self.permits.acquire()).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(StoreError::TimedOut(
                "API key lookups held their share of the database's connections past the deadline"
                    .into(),
            )),
        }
    }
}
