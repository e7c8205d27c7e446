//! Which waiting orders form the next batch: the oldest first, at most `MAX_ORDERS`, and
//! none of an account that a batch in flight holds. Batches in flight at once then hold
//! disjoint accounts, so on an engine that locks balance rows they never wait on each
//! other's locks (each would hold a connection through another's commit), and an account's
//! orders stay queued, in their order, for the runner that holds it to take next.

use std::collections::{HashSet, VecDeque};

use tokio::sync::oneshot;

use super::MAX_ORDERS;
use crate::domain::ids::AccountId;
use crate::store::NewOrder;

/// An order waiting for its batch, and where its answer goes.
pub struct Pending<A> {
    pub order: NewOrder,
    pub answer: oneshot::Sender<A>,
}

/// The waiting orders, the runners placing them, and the accounts their batches hold.
pub struct Queue<A> {
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
    pub fn push(&mut self, pending: Pending<A>, max_runners: usize) -> bool {
        self.waiting.push_back(pending);
        let start = self.runners < max_runners;
        if start {
            self.runners += 1;
        }
        start
    }

    /// A runner's next batch, once it is done with the accounts of its last one (`done`).
    /// Empty when nothing it may take waits: the runner then stops, counted out.
    pub fn next_batch(&mut self, done: &[AccountId]) -> Vec<Pending<A>> {
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
    pub fn abandon(&mut self, held: &[AccountId]) {
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
    use crate::domain::account::Account;

    fn pending(account: &Account, key: &str) -> Pending<()> {
        Pending {
            order: NewOrder::for_tests(account, key, vec![], 0),
            answer: oneshot::channel().0,
        }
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
