//! Which waiting orders form the next batch: the oldest first, at most `MAX_ORDERS`, and
//! none of an account that a batch in flight holds. Batches in flight at once then hold
//! disjoint accounts, so on an engine that locks balance rows they never wait on each
//! other's locks (each would hold a connection through another's commit), and an account's
//! orders stay queued, in their order, for the runner that holds it to take next.
//!
//! The queue holds only admitted orders (`store::admission`: at most `--max-pending-writes`
//! wait), and an order whose deadline passed, or whose caller gave up on it, leaves it before
//! a batch is built: it is never written.

use std::collections::{HashSet, VecDeque};

use tokio::sync::oneshot;

use super::MAX_ORDERS;
use crate::domain::ids::AccountId;
use crate::store::admission::Admitted;
use crate::store::NewOrder;

/// An order waiting for its batch, where its answer goes, and its place among the writes
/// waiting (its deadline and its ticket).
pub(crate) struct Pending<A> {
    pub(crate) order: NewOrder,
    pub(crate) answer: oneshot::Sender<A>,
    pub(crate) admitted: Admitted,
}

impl<A> Pending<A> {
    /// Its deadline passed, or its caller gave up on it: it must not be written.
    pub(crate) fn expired(&self) -> bool {
        self.admitted.deadline.passed() || self.admitted.ticket.is_withdrawn()
    }
}

/// The waiting orders, the runners placing them, and the accounts their batches hold.
pub(crate) struct Queue<A> {
    waiting: VecDeque<Pending<A>>,
    runners: usize,
    busy: HashSet<AccountId>,
}

impl<A> Default for Queue<A> {
    fn default() -> Self {
        Queue {
            waiting: VecDeque::new(),
            runners: 0,
            busy: HashSet::new(),
        }
    }
}

impl<A> Queue<A> {
    /// Queues an order: true when the caller must start a runner for it (fewer than
    /// `max_runners` run), which is then counted.
    pub(crate) fn push(&mut self, pending: Pending<A>, max_runners: usize) -> bool {
        self.waiting.push_back(pending);
        let start = self.runners < max_runners;
        if start {
            self.runners += 1;
        }
        start
    }

    /// A runner's next batch, once it is done with the accounts of its last one (`done`).
    /// Empty when nothing it may take waits: the runner then stops, counted out.
    pub(crate) fn next_batch(&mut self, done: &[AccountId]) -> Vec<Pending<A>> {
        for account in done {
            self.busy.remove(account);
        }
        let batch = self.take();
        if batch.is_empty() {
            self.runners -= 1;
        }
        batch
    }

    /// A runner that stopped without finishing its batch (it unwound): its accounts and its
    /// slot are given back, so that their orders are not left waiting for it.
    pub(crate) fn abandon(&mut self, held: &[AccountId]) {
        for account in held {
            self.busy.remove(account);
        }
        self.runners -= 1;
    }

    fn take(&mut self) -> Vec<Pending<A>> {
        let mut taken = Vec::new();
        let mut skipped = VecDeque::new();
        let mut held_here = HashSet::new();
        while let Some(pending) = self.waiting.pop_front() {
            // Dropped here, its caller is answered that nothing was written.
            if pending.expired() {
                continue;
            }
            let account = pending.order.account.id;
            if taken.len() == MAX_ORDERS || self.busy.contains(&account) {
                skipped.push_back(pending);
                continue;
            }
            held_here.insert(account);
            taken.push(pending);
        }
        self.waiting = skipped;
        self.busy.extend(held_here);
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bounds::Deadline;
    use crate::domain::account::Account;
    use crate::store::admission::Admission;
    use std::time::{Duration, Instant};

    fn pending_until(account: &Account, key: &str, deadline: Deadline) -> Pending<()> {
        Pending {
            order: NewOrder::for_tests(account, key, vec![], 0),
            answer: oneshot::channel().0,
            admitted: Admission::new(1).admit(deadline).unwrap(),
        }
    }

    fn pending(account: &Account, key: &str) -> Pending<()> {
        pending_until(account, key, Deadline::after(Duration::from_secs(60)))
    }

    fn account() -> Account {
        Account::for_tests(0)
    }

    fn keys<'a>(batch: impl IntoIterator<Item = &'a Pending<()>>) -> Vec<&'a str> {
        batch
            .into_iter()
            .map(|p| p.order.claim.key.as_str())
            .collect()
    }

    #[test]
    fn a_batch_takes_no_order_of_an_account_another_batch_holds_and_the_skipped_keep_their_order() {
        let (a, b) = (account(), account());
        let mut queue = Queue::default();
        assert!(queue.push(pending(&a, "a1"), 2), "the first runner starts");
        assert!(queue.push(pending(&b, "b1"), 2), "a second may run");
        let first = queue.next_batch(&[]);
        assert_eq!(keys(&first), ["a1", "b1"]);
        for (who, key) in [(&a, "a2"), (&a, "a3"), (&b, "b2")] {
            assert!(!queue.push(pending(who, key), 2), "two runners already run");
        }
        assert!(queue.next_batch(&[]).is_empty(), "both accounts are held");
        assert_eq!(
            keys(&queue.next_batch(&[a.id])),
            ["a2", "a3"],
            "a's, in order"
        );
        assert_eq!(keys(&queue.waiting), ["b2"], "b's waits for b's batch");
        assert_eq!(keys(&queue.next_batch(&[b.id])), ["b2"]);
    }

    #[test]
    fn an_abandoned_batch_gives_its_accounts_and_its_slot_back() {
        let a = account();
        let mut queue = Queue::default();
        assert!(queue.push(pending(&a, "a1"), 1));
        assert_eq!(queue.next_batch(&[]).len(), 1);
        assert!(!queue.push(pending(&a, "a2"), 1), "the one runner is busy");
        queue.abandon(&[a.id]);
        assert!(queue.push(pending(&a, "a3"), 1), "its slot is free again");
        assert_eq!(
            keys(&queue.next_batch(&[])),
            ["a2", "a3"],
            "a is no longer held"
        );
    }

    #[test]
    fn an_order_whose_deadline_passed_in_the_queue_is_dropped_before_its_batch_is_built() {
        let a = account();
        let mut queue = Queue::default();
        let soon = Deadline::at(Instant::now() + Duration::from_millis(20));
        queue.push(pending_until(&a, "late", soon), 1);
        queue.push(pending(&a, "in-time"), 1);
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(keys(&queue.next_batch(&[])), ["in-time"]);
    }

    #[tokio::test]
    async fn an_order_its_caller_gave_up_on_is_dropped_before_its_batch_is_built() {
        let a = account();
        let mut queue = Queue::default();
        let given_up = pending(&a, "given-up");
        let ticket = given_up.admitted.ticket.clone();
        queue.push(given_up, 1);
        let (_answer, answered) = oneshot::channel::<Result<(), crate::store::StoreError>>();
        let at_once = Deadline::at(Instant::now());
        let _ = crate::store::admission::answer(at_once, &ticket, answered).await;
        assert!(ticket.is_withdrawn());
        assert!(queue.next_batch(&[]).is_empty());
    }

    #[test]
    fn a_batch_takes_at_most_max_orders_and_leaves_the_rest_queued() {
        let a = account();
        let mut queue = Queue::default();
        for n in 0..MAX_ORDERS + 3 {
            queue.push(pending(&a, &format!("k{n}")), 1);
        }
        assert_eq!(queue.next_batch(&[]).len(), MAX_ORDERS);
        assert!(queue.next_batch(&[]).is_empty(), "the account is held");
        assert_eq!(queue.next_batch(&[a.id]).len(), 3);
    }
}
