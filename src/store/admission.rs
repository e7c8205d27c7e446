//! Time and room for writes, the same on every engine (docs/contract.md "When the storage is slow"):
//!
//! - `Admission`: how many writes wait for the storage at once (`--max-pending-writes`). A
//!   write holds its place from the call until the engine is done with it (answered after its
//!   commit, or dropped unsent), not until its caller stops waiting, so that writes a stalled
//!   storage still holds keep counting and memory stays flat; one more is refused at once.
//! - `Ticket`: the line between a write not yet sent to the storage and one sent. The engine
//!   sends a write only while its deadline has not passed and its caller still waits; the
//!   caller, at the deadline, withdraws a write not yet sent, which is then never written
//!   (`TimedOut`, a 503), and knows that a write already sent has an unknown outcome
//!   (`InDoubt`, the opaque 500). One atomic decides, so the two never disagree.
//! - `InFlight`: the commits (or flushes) now waiting for the storage, by age, which
//!   readiness reads: a storage that stopped completing writes shows as an old commit.
//! - The age of the oldest write admitted and not yet done with, whatever it waits on (a
//!   lock, a connection, the writer, its commit), which readiness reads too: writes that wait
//!   behind another instance's stalled commit have no commit of their own in flight.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use crate::bounds::Deadline;
use crate::store::StoreError;

/// The writes one instance lets wait for its storage at once.
pub(super) struct Admission {
    places: Arc<Semaphore>,
    limit: usize,
    since: Arc<Since>,
}

/// When each admitted write was admitted.
#[derive(Default)]
struct Since {
    next: AtomicU64,
    admitted: Mutex<HashMap<u64, Instant>>,
}

/// A write's entry in `Since`, removed when the write is done with.
struct Waiting {
    since: Arc<Since>,
    id: u64,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.since
            .admitted
            .lock()
            .expect("the writes admitted")
            .remove(&self.id);
    }
}

impl Admission {
    pub(super) fn new(limit: usize) -> Self {
        Admission {
            places: Arc::new(Semaphore::new(limit)),
            limit,
            since: Arc::default(),
        }
    }

    /// How long the oldest write admitted and not yet done with has waited.
    pub(super) fn oldest(&self) -> Option<Duration> {
        let admitted = self.since.admitted.lock().expect("the writes admitted");
        admitted.values().min().map(|at| at.elapsed())
    }

    /// A place for one more write, refused at once (`Overloaded`) when every place is held,
    /// and (`TimedOut`) when its deadline has already passed: nothing is written either way.
    pub(super) fn admit(&self, deadline: Deadline) -> Result<Admitted, StoreError> {
        if deadline.passed() {
            return Err(not_sent());
        }
        let place = Arc::clone(&self.places)
            .try_acquire_owned()
            .map_err(|_| StoreError::Overloaded)?;
        let id = self.since.next.fetch_add(1, Ordering::Relaxed);
        self.since
            .admitted
            .lock()
            .expect("the writes admitted")
            .insert(id, Instant::now());
        Ok(Admitted {
            _place: place,
            _waiting: Waiting {
                since: Arc::clone(&self.since),
                id,
            },
            ticket: Ticket::default(),
            deadline,
        })
    }

    /// Writes admitted and not yet done with.
    pub(super) fn pending(&self) -> usize {
        self.limit - self.places.available_permits()
    }
}

/// One admitted write: the engine keeps it with the write until it is done with it, and its
/// place is given back when it is dropped.
pub(super) struct Admitted {
    _place: OwnedSemaphorePermit,
    _waiting: Waiting,
    pub(crate) ticket: Ticket,
    pub(crate) deadline: Deadline,
}

const WAITING: u8 = 0;
const SENT: u8 = 1;
const WITHDRAWN: u8 = 2;

/// Whether an admitted write has been sent to the storage, shared by the engine and the
/// caller waiting for it.
#[derive(Clone, Default)]
pub(super) struct Ticket(Arc<AtomicU8>);

impl Ticket {
    /// The engine, about to send the write (apply it, send its COMMIT): true when it may.
    /// False once its deadline passed or its caller withdrew it: the engine then drops it,
    /// and it is never written.
    pub(super) fn send(&self, deadline: Deadline) -> bool {
        if deadline.passed() {
            let _ =
                self.0
                    .compare_exchange(WAITING, WITHDRAWN, Ordering::AcqRel, Ordering::Acquire);
            return false;
        }
        self.0
            .compare_exchange(WAITING, SENT, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The engine took a sent write back before it was written (its batch rolled back before
    /// the COMMIT): it waits again, to be sent again or withdrawn.
    pub(super) fn unsend(&self) {
        let _ = self
            .0
            .compare_exchange(SENT, WAITING, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Whether the engine sent it: its outcome then rests with the storage.
    pub(super) fn is_sent(&self) -> bool {
        self.0.load(Ordering::Acquire) == SENT
    }

    /// Whether it was withdrawn (its caller gave up at its deadline, or the engine found the
    /// deadline passed): the engine drops it unsent.
    pub(super) fn is_withdrawn(&self) -> bool {
        self.0.load(Ordering::Acquire) == WITHDRAWN
    }

    /// The caller, at its deadline: true when the write was never sent and now never will
    /// be; false when it was sent, so that its outcome is unknown.
    fn withdraw(&self) -> bool {
        match self
            .0
            .compare_exchange(WAITING, WITHDRAWN, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(state) => state == WITHDRAWN,
        }
    }
}

/// A write not sent by its deadline: nothing of it is written, ever.
pub(super) fn not_sent() -> StoreError {
    StoreError::TimedOut("the deadline passed before the write reached the storage".into())
}

/// Waits for the engine's answer to an admitted write until its deadline. Past it, a write
/// not yet sent is withdrawn (`TimedOut`: nothing written, ever) and one already sent is
/// `InDoubt`; the engine's work goes on without a caller. An engine that dropped the write
/// without answering has either withdrawn it (`TimedOut`) or failed (`Failed`).
pub(super) async fn answer<T>(
    deadline: Deadline,
    ticket: &Ticket,
    answered: oneshot::Receiver<Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout_at(deadline.instant().into(), answered).await {
        Ok(Ok(outcome)) => outcome,
        _ if ticket.withdraw() => Err(not_sent()),
        Ok(Err(_)) => Err(StoreError::Failed(
            "the storage dropped a write it had taken without an answer".into(),
        )),
        Err(_) => Err(StoreError::InDoubt(
            "sent to the storage, not confirmed by the deadline".into(),
        )),
    }
}

/// The commits (or flushes) waiting for the storage now, and the start of the oldest one
/// given up on unconfirmed since the last commit that completed.
#[derive(Default)]
pub(super) struct InFlight {
    next: AtomicU64,
    started: Mutex<HashMap<u64, Instant>>,
    given_up: Mutex<Option<Instant>>,
}

impl InFlight {
    /// Counts a commit from now until the returned guard is dropped: `done` when it was
    /// confirmed, dropped alone when it was given up unconfirmed.
    pub(super) fn begin(self: &Arc<Self>) -> Commit {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.started
            .lock()
            .expect("the commits in flight")
            .insert(id, Instant::now());
        Commit {
            registry: Arc::clone(self),
            id,
            confirmed: false,
        }
    }

    /// The age of the oldest commit in flight, or of one given up on since the last
    /// confirmed commit: a storage that has not completed a write since then.
    pub(super) fn oldest(&self) -> Option<Duration> {
        let started = self.started.lock().expect("the commits in flight");
        let oldest = started.values().min().copied();
        let given_up = *self.given_up.lock().expect("the commit given up");
        [oldest, given_up]
            .into_iter()
            .flatten()
            .min()
            .map(|at| at.elapsed())
    }
}

/// One commit in flight.
pub(super) struct Commit {
    registry: Arc<InFlight>,
    id: u64,
    confirmed: bool,
}

impl Commit {
    /// The storage confirmed it: the storage completes writes again.
    pub(super) fn done(mut self) {
        self.confirmed = true;
    }
}

impl Drop for Commit {
    fn drop(&mut self) {
        let started = self
            .registry
            .started
            .lock()
            .expect("the commits in flight")
            .remove(&self.id);
        let mut given_up = self.registry.given_up.lock().expect("the commit given up");
        if self.confirmed {
            *given_up = None;
        } else if let Some(at) = started {
            *given_up = Some(given_up.map_or(at, |earlier| earlier.min(at)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn soon() -> Deadline {
        Deadline::after(Duration::from_secs(5))
    }

    #[test]
    fn a_write_past_the_limit_is_refused_at_once_and_a_place_comes_back_when_one_is_done() {
        let admission = Admission::new(2);
        let first = admission.admit(soon()).unwrap();
        let _second = admission.admit(soon()).unwrap();
        assert!(matches!(
            admission.admit(soon()),
            Err(StoreError::Overloaded)
        ));
        assert_eq!(admission.pending(), 2);
        drop(first);
        assert!(admission.admit(soon()).is_ok());
    }

    #[test]
    fn the_oldest_write_admitted_counts_until_it_is_done_with() {
        let admission = Admission::new(4);
        assert_eq!(admission.oldest(), None);
        let first = admission.admit(soon()).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let second = admission.admit(soon()).unwrap();
        assert!(admission.oldest().unwrap() >= Duration::from_millis(20));
        drop(first);
        assert!(admission.oldest().unwrap() < Duration::from_millis(20));
        drop(second);
        assert_eq!(admission.oldest(), None);
    }

    #[test]
    fn a_write_withdrawn_by_its_caller_is_never_sent() {
        let ticket = Ticket::default();
        assert!(ticket.withdraw());
        assert!(!ticket.send(soon()), "the engine must drop it");
    }

    #[test]
    fn a_write_sent_cannot_be_withdrawn_its_outcome_is_unknown() {
        let ticket = Ticket::default();
        assert!(ticket.send(soon()));
        assert!(!ticket.withdraw());
    }

    #[test]
    fn a_write_whose_deadline_passed_is_not_sent() {
        let ticket = Ticket::default();
        let passed = Deadline::at(Instant::now() - Duration::from_millis(1));
        assert!(!ticket.send(passed));
        assert!(
            ticket.withdraw(),
            "its caller answers that nothing was written"
        );
    }

    #[test]
    fn a_write_taken_back_before_its_commit_can_be_withdrawn_again() {
        let ticket = Ticket::default();
        assert!(ticket.send(soon()));
        ticket.unsend();
        assert!(ticket.withdraw());
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_past_its_deadline_gets_timed_out_when_unsent_and_in_doubt_when_sent() {
        let deadline = Deadline::after(Duration::from_secs(1));
        let (_keep, waiting) = oneshot::channel::<Result<(), StoreError>>();
        let ticket = Ticket::default();
        let unsent = answer(deadline, &ticket, waiting).await;
        assert!(matches!(unsent, Err(StoreError::TimedOut(_))));

        let deadline = Deadline::after(Duration::from_secs(1));
        let (_keep, waiting) = oneshot::channel::<Result<(), StoreError>>();
        let ticket = Ticket::default();
        assert!(ticket.send(deadline));
        let sent = answer(deadline, &ticket, waiting).await;
        assert!(matches!(sent, Err(StoreError::InDoubt(_))));
    }

    #[test]
    fn a_commit_given_up_on_counts_as_in_flight_until_another_is_confirmed() {
        let commits = Arc::new(InFlight::default());
        assert_eq!(commits.oldest(), None);
        let stuck = commits.begin();
        assert!(commits.oldest().is_some());
        drop(stuck);
        assert!(commits.oldest().is_some(), "given up, not confirmed");
        commits.begin().done();
        assert_eq!(commits.oldest(), None);
    }
}
