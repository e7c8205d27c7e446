//! The order a transaction's statements go out in: the order they were asked for.
//!
//! A transaction sends its statements as a pipeline: polled together, each goes out on its
//! first poll, and the server runs them in the order they arrive. What a pipeline means rests
//! on that order: the bounds before the locks, a lock before the reads it guards. A statement
//! that is not yet prepared on its connection is prepared first, a round trip during which
//! the statements asked for after it would go out ahead of it. Seen on a fresh connection:
//! a batch's read of its account's newest ledger entry ran before the batch's balance lock,
//! missed two credits that committed meanwhile, and the batch's entry sorted before them in
//! the account's ledger. So each statement of a transaction takes a turn when it is asked
//! for, and goes out once every statement asked for before it has gone (or was given up).

use std::collections::BTreeSet;
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

/// One transaction's turns. A transaction's statements number a handful, so its waiters are
/// few and are all woken whenever the front moves.
#[derive(Default)]
pub(super) struct SendOrder {
    state: Mutex<Turns>,
}

#[derive(Default)]
struct Turns {
    /// Turns handed out so far; the next one gets this number.
    handed: u64,
    /// The oldest turn not yet over: the statement that may go out now.
    front: u64,
    /// Turns over (sent or given up) behind the front, waiting for it to pass them.
    over: BTreeSet<u64>,
    waiting: Vec<Waker>,
}

impl SendOrder {
    /// The next place in the order, taken by a statement when it is asked for.
    pub(super) fn turn(&self) -> Turn<'_> {
        let mut turns = self.state.lock().expect("a transaction's turns");
        let ticket = turns.handed;
        turns.handed += 1;
        Turn {
            order: Some(self),
            ticket,
        }
    }
}

/// A statement's place in its transaction's order; over when dropped.
pub(super) struct Turn<'a> {
    /// `None`: a statement on a connection outside a transaction, which waits for nothing.
    order: Option<&'a SendOrder>,
    ticket: u64,
}

impl Turn<'_> {
    /// A turn that waits for nothing.
    pub(super) fn free() -> Turn<'static> {
        Turn {
            order: None,
            ticket: 0,
        }
    }

    /// Runs `request` (a statement, which goes out on its first poll) once every statement
    /// asked for before it has gone out; its turn is over once its first poll sent it.
    pub(super) async fn send<F: Future>(self, request: F) -> F::Output {
        poll_fn(|cx| self.poll_front(cx)).await;
        let mut request = pin!(request);
        let mut turn = Some(self);
        poll_fn(move |cx| {
            let polled = request.as_mut().poll(cx);
            drop(turn.take());
            polled
        })
        .await
    }

    fn poll_front(&self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(order) = self.order else {
            return Poll::Ready(());
        };
        let mut turns = order.state.lock().expect("a transaction's turns");
        if turns.front == self.ticket {
            return Poll::Ready(());
        }
        turns.waiting.push(cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let Some(order) = self.order else {
            return;
        };
        let waiting = {
            let mut turns = order.state.lock().expect("a transaction's turns");
            turns.over.insert(self.ticket);
            loop {
                let front = turns.front;
                if !turns.over.remove(&front) {
                    break;
                }
                turns.front += 1;
            }
            std::mem::take(&mut turns.waiting)
        };
        waiting.into_iter().for_each(Waker::wake);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Each request records its name when it is first polled (when a statement goes out).
    fn request(
        name: &'static str,
        sent: &Arc<Mutex<Vec<&'static str>>>,
    ) -> impl Future<Output = ()> {
        let sent = Arc::clone(sent);
        async move { sent.lock().unwrap().push(name) }
    }

    #[tokio::test]
    async fn a_statement_held_up_before_sending_still_goes_out_before_those_asked_for_after_it() {
        let order = SendOrder::default();
        let sent = Arc::new(Mutex::new(Vec::new()));
        let (unprepared, prepared) = (order.turn(), order.turn());
        let first = async {
            // A round trip to prepare the statement: the later one is polled meanwhile.
            tokio::task::yield_now().await;
            tokio::task::yield_now().await;
            unprepared.send(request("lock", &sent)).await
        };
        let second = prepared.send(request("read", &sent));
        futures_util::future::join(first, second).await;
        assert_eq!(*sent.lock().unwrap(), ["lock", "read"]);
    }

    #[tokio::test]
    async fn a_turn_given_up_lets_the_next_go() {
        let order = SendOrder::default();
        let sent = Arc::new(Mutex::new(Vec::new()));
        let (failed, next) = (order.turn(), order.turn());
        let second = next.send(request("read", &sent));
        let given_up = async move {
            tokio::task::yield_now().await;
            drop(failed);
        };
        futures_util::future::join(given_up, second).await;
        assert_eq!(*sent.lock().unwrap(), ["read"]);
    }

    #[tokio::test]
    async fn statements_asked_for_in_order_go_out_at_once() {
        let order = SendOrder::default();
        let sent = Arc::new(Mutex::new(Vec::new()));
        let (a, b) = (order.turn(), order.turn());
        a.send(request("a", &sent)).await;
        b.send(request("b", &sent)).await;
        assert_eq!(*sent.lock().unwrap(), ["a", "b"]);
    }
}
