//! Every bound on time and on queues that orderly keeps, in one place, each with why it has
//! the value it has; and the request's deadline, the one bound that travels.
//!
//! A deadline is born at the edge (arrival + `--request-deadline`) and is handed down as a
//! value through the handler and the port into each engine, so that every wait below it (a
//! pool checkout, a lock, a statement, a commit, a flush, the batch queue) takes what is left
//! of it rather than a constant of its own. The other bounds here are either shorter than any
//! deadline (the wait for a busy key) or belong to work no request waits for (a stop, a
//! worker's pass). Periods that belong to one mechanism and no request's wait (the cache
//! lease's renewal, a webhook attempt's timeout, an outbox claim's lease) stay beside it.

use std::time::{Duration, Instant};

/// `--request-deadline`'s default: every request is answered within this of its arrival,
/// whatever the storage does (docs/contract.md "When the storage is slow"). Twice the wait for a busy key, so that a request that
/// waited out a key still has time to look it up and answer; well under the 15 to 30 s after
/// which partners' HTTP clients and load balancers commonly give up, so the answer arrives
/// while someone still listens.
pub(crate) const REQUEST_DEADLINE: Duration = Duration::from_secs(10);

/// `--max-pending-writes`'s default: writes admitted at once per instance (queued for the
/// storage or being committed). At full load a commit takes a few milliseconds and a batch
/// holds at most 64 orders, so a healthy instance never has more than a few hundred; 4,096
/// waiting writes of about 2 KiB each is under 10 MiB held while the storage stalls, and past
/// it a write is refused at once (503) instead of queueing behind writes that cannot finish
/// within their deadlines anyway.
pub(crate) const MAX_PENDING_WRITES: u32 = 4096;

/// Reads of the embedded engine in flight at once: running on one of its `READ_THREADS` or
/// waiting for one. A read of a disk that stopped answering keeps its thread until the disk
/// answers, so a stall fills this; 256 waiting reads are a few KiB each, and one more read is
/// refused at once (503) rather than queued behind reads that cannot finish within their
/// deadlines.
pub(crate) const MAX_READS_IN_FLIGHT: usize = 256;

/// Threads the embedded engine's reads run on, shared by the whole process. A read is
/// microseconds from sled's cache, so a few threads answer what 64 connections ask; every
/// further thread keeps its own allocator pages, and when every read could take a thread of
/// its own (actix's blocking pools) a loaded server grew about 50 and held 100 MiB more at a
/// million orders for the same throughput. Reads past these wait their turn, each bounded by
/// its deadline; the cost is fewer cold reads of a slow disk at once, and that once this many
/// reads wait on a disk that stopped answering, every read waits behind them (its 503 at the
/// deadline, `/readyz`'s probe at `PROBE_TIMEOUT`).
pub(crate) const READ_THREADS: usize = 8;

/// How long a request waits for a key (or a row) that another request holds before it is the
/// in-progress 409 (docs/api.md "POST /b2b/orders" and docs/contract.md "6. Many instances": "about 5 s"): long enough for a commit at the p99.99 of a
/// loaded database, short enough that a partner's retry loop sees the answer well within its
/// own timeout. Capped by the request's deadline.
pub(crate) const KEY_WAIT: Duration = Duration::from_secs(5);

/// How long a write without a key waits for a row lock on PostgreSQL: a bound on how long it
/// can queue behind another writer of the same row (a hot balance), shorter than a key's wait
/// because nobody is waiting on a replay at the end of it. Capped by the request's deadline.
pub(crate) const LOCK_TIMEOUT: Duration = Duration::from_secs(3);

/// How long PostgreSQL keeps a transaction whose client has gone quiet. orderly never pauses
/// inside a request's or a worker's transaction (its statements are pipelined), so a quiet one
/// belongs to an instance that died without closing its socket (a lost machine) or that the
/// network cut off: ending it releases the rows it holds (a hot balance, the rows fulfillment
/// and the sweeper claimed with `FOR UPDATE SKIP LOCKED`) for the other instances. As long as
/// `DEAD_LINK_AFTER`: an instance cut off for longer has given its connection up by then, and
/// the others should not wait on its locks longer than it waits on its own connection (at 15 s
/// an instance cut off for 8.6 s kept another instance's writes on a hot account waiting 6.3 s
/// after the network came back). A kill -9 closes the socket and releases them at once. A
/// restore, whose transaction waits for the source's records, sets its own.
pub(crate) const IDLE_IN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(6);

/// How long opening one database connection may take: a server that accepts no connection in
/// 5 s is down for the requests waiting on it, which get their answer from their deadline.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a commit may stay unconfirmed after the last of its requests' deadlines passed
/// before the engine gives up its connection: a COMMIT waiting for a synchronous standby is
/// usually confirmed once the standby is back or replaced, and keeping its connection meanwhile
/// keeps the backends orderly holds on the server at the pool's size (a connection given up
/// would leave its backend waiting there). Past this the connection is dropped, the backend is
/// the server's to end, and the pool opens a new one.
pub(crate) const COMMIT_PATIENCE: Duration = Duration::from_secs(60);

/// `/readyz` turns 503 once a commit (or flush) has been in flight this long. docs/contract.md "When the storage is slow" calls
/// writes stopped once a commit is 5 s old and wants the 503 within 5 s of that; at the p99 a
/// commit takes milliseconds, so 4 s already means a storage that stopped completing writes,
/// and the second left over absorbs a load balancer's polling interval. A balancer that probes
/// every few seconds stops sending within about 10 s.
pub(crate) const STALLED_AFTER: Duration = Duration::from_secs(4);

/// How long `/readyz`'s probe of the storage may take before it counts as failing: a read of
/// one record takes microseconds on a storage that answers, and a balancer's probe gives up
/// within a second (Kubernetes' default): half of that, so that a storage which stopped
/// answering reads is a 503 the balancer receives, not a probe it gives up on. (On sled a
/// probe that waits on a stalled disk, or behind `READ_THREADS` reads that do, fails so.)
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// A stop (SIGTERM, SIGINT) ends the process within this, whatever the storage does (docs/contract.md "When the storage is slow"):
/// the common default of orchestrators (Kubernetes' grace period, systemd's is 90 s) before
/// they kill.
pub(crate) const STOP_WITHIN: Duration = Duration::from_secs(30);

/// How far past its deadline the edge answers a request whose handler has not: a last resort
/// (every wait below is bounded by the deadline itself), late enough that the handler's own
/// answer at the deadline always wins the race.
pub(crate) const EDGE_MARGIN: Duration = Duration::from_millis(500);

/// The deadline of each storage call of a background pass (fulfillment, the sweeper, the
/// webhook worker): as long as a request's, and shorter than any claim such a pass holds (an
/// outbox claim's lease is 20 s), so that a pass on a stalled storage gives its work up
/// before another instance may take it over.
pub(crate) const WORKER_CALL: Duration = Duration::from_secs(10);

/// How long a connection to PostgreSQL may go without a sign of life from the other end
/// before the kernel drops it (`TCP_USER_TIMEOUT`, and keepalive probes from
/// `DEAD_LINK_PROBE_AFTER` of silence, one a second): a network that drops packets silently
/// otherwise leaves a connection waiting on TCP's retransmission backoff, which doubles from
/// 0.2 s and, after a 7-second partition, sends its next try only at 12.6 s. At 6 s, a
/// partition up to 6 s heals by a retransmission at most 3.2 s after it ends, and a longer one
/// has dropped the connection already (the pool opens another), so readiness comes back within
/// its 5 s either way. A link that is merely slow still acknowledges within a second, and a
/// database that is slow to answer (a commit waiting for a standby) acknowledges at once.
pub(crate) const DEAD_LINK_AFTER: Duration = Duration::from_secs(6);

/// The silence after which a PostgreSQL connection is probed (see `DEAD_LINK_AFTER`).
pub(crate) const DEAD_LINK_PROBE_AFTER: Duration = Duration::from_secs(3);

/// How long a backup's stream waits for its reader to take the next records before it gives
/// the snapshot up (the stream then ends without its end record, which a restore refuses): a
/// reader that stopped reading must not pin a PostgreSQL snapshot and connection, or a sled
/// backup's spool files and threads, for as long as it likes. A reader writing to a disk
/// that stalls for a minute is not taking a backup anyone can use either.
pub(crate) const BACKUP_READER_PATIENCE: Duration = Duration::from_secs(60);

/// How long a PostgreSQL backup waits for the next page of rows from its snapshot before it
/// gives the backup up (the stream ends without its end record, which a restore refuses): a
/// page of 512 rows crosses even a 256 kbit/s link in well under a minute, and a database
/// replaced under the backup (a failover, a restore) must end it with an error, never leave it
/// open.
pub(crate) const BACKUP_DATABASE_PATIENCE: Duration = Duration::from_secs(60);

/// How long an instance may take at start to read every API key that can authenticate
/// (PostgreSQL: `known_keys.rs`): about a second per million keys on a loaded database, so a
/// minute is a database that is not answering.
pub(crate) const KEYS_LOAD_WITHIN: Duration = Duration::from_secs(60);

/// How long sled's oldest commit (a batch applied, or its flush) may have been in flight for
/// the writer to count as flowing: a first use is then left to decide its key without a
/// lookup first (`Prefetched::LeftToFirstUse`). A group flush takes a few milliseconds on any
/// disk that keeps up; past this the disk is slow, and a retry is looked up first, so that a
/// durable row still replays from memory instead of queueing behind the slow flush.
pub const WRITES_FLOWING_WITHIN: Duration = Duration::from_millis(100);

/// The deadline of a command run from the shell (`restore`, `copy`, `stats`): the operator
/// watches it and can stop it; nothing waits on it but them.
pub(crate) const COMMAND_DEADLINE: Duration = Duration::from_secs(24 * 3600);

/// When a request must have its answer: its arrival plus `--request-deadline`. Every wait on
/// its behalf ends by then.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Deadline(Instant);

impl Deadline {
    /// `within` from now.
    pub fn after(within: Duration) -> Self {
        Deadline(Instant::now() + within)
    }

    pub(crate) fn at(instant: Instant) -> Self {
        Deadline(instant)
    }

    pub(crate) fn instant(self) -> Instant {
        self.0
    }

    /// What is left of it (zero once it passed).
    pub(crate) fn left(self) -> Duration {
        self.0.saturating_duration_since(Instant::now())
    }

    pub(crate) fn passed(self) -> bool {
        Instant::now() >= self.0
    }

    /// The earlier of this deadline and `bound` from now: a wait of its own, within it.
    pub(crate) fn capped(self, bound: Duration) -> Instant {
        self.0.min(Instant::now() + bound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_that_passed_has_nothing_left() {
        let deadline = Deadline::at(Instant::now() - Duration::from_millis(1));
        assert!(deadline.passed());
        assert_eq!(deadline.left(), Duration::ZERO);
    }

    #[test]
    fn a_wait_of_its_own_never_outlasts_the_deadline() {
        let deadline = Deadline::after(Duration::from_secs(1));
        assert_eq!(deadline.capped(Duration::from_secs(5)), deadline.instant());
        assert!(deadline.capped(Duration::from_millis(10)) < deadline.instant());
    }
}
