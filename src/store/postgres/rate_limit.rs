//! The rate budget shared by every instance on the database: GCRA in one statement per
//! request on the UNLOGGED `rate_limits` table. The row lock of the upsert serializes the
//! requests of one client across instances, and the database's clock is the only clock, so
//! instances whose clocks drift still spend from one budget.

use async_trait::async_trait;
use deadpool_postgres::Pool;

use super::tx::{execute, query_opt, Fault};
use crate::store::{SharedRateLimit, Spent, StoreError};

/// $1 bucket, $2 emission interval, $3 window (ns). A fresh bucket spends one emission; a
/// known one moves its arrival time on by one emission from max(arrival, now), unless that
/// leaves it more than the window ahead of now: then it is refused and keeps its arrival
/// time. `refused` is written beside `tat` because RETURNING sees only the new row.
const SPEND: &str = "
WITH clock AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000000)::bigint AS now)
INSERT INTO rate_limits AS r (bucket, tat, refused)
SELECT $1::text, clock.now + $2::bigint, false FROM clock
ON CONFLICT (bucket) DO UPDATE SET
    refused = greatest(r.tat, excluded.tat - $2) + $2 > excluded.tat - $2 + $3::bigint,
    tat = CASE WHEN greatest(r.tat, excluded.tat - $2) + $2 > excluded.tat - $2 + $3::bigint
               THEN r.tat ELSE greatest(r.tat, excluded.tat - $2) + $2 END
RETURNING refused, greatest(tat - (SELECT now FROM clock), 0) AS ahead";

/// A bucket whose arrival time has passed holds its whole budget: forgetting it changes
/// nothing a client could see.
const PRUNE: &str =
    "DELETE FROM rate_limits WHERE tat < (extract(epoch FROM clock_timestamp()) * 1000000000)::bigint";

pub struct PgRateLimit {
    pub pool: Pool,
}

impl PgRateLimit {
    async fn spent(&self, bucket: &str, emission: i64, window: i64) -> Result<Spent, Fault> {
        let client = self.pool.get().await?;
        let row = query_opt(&client, SPEND, &[&bucket, &emission, &window])
            .await?
            .ok_or_else(|| StoreError::Corrupt("the rate-limit upsert returned no row".into()))?;
        Ok(Spent {
            allowed: !row.get::<_, bool>("refused"),
            ahead_nanos: row.get("ahead"),
        })
    }
}

#[async_trait]
impl SharedRateLimit for PgRateLimit {
    async fn spend(
        &self,
        bucket: String,
        emission_nanos: i64,
        window_nanos: i64,
    ) -> Result<Spent, StoreError> {
        Ok(self.spent(&bucket, emission_nanos, window_nanos).await?)
    }

    async fn prune(&self) -> Result<usize, StoreError> {
        let client = self.pool.get().await.map_err(Fault::from)?;
        Ok(execute(&client, PRUNE, &[]).await? as usize)
    }
}
