//! Budget the shared rate limit lends one instance ahead of a hot client's requests, so that
//! they are allowed without a statement each (a replay in no round trip).
//!
//! A loan is spent from the shared budget like requests are, in the same statement as the
//! requests that were waiting, and only from what is left over after them: the database grants
//! it only while at least `FLOOR` requests of budget remain beyond them, and at most a
//! `SHARE`th of those (`orderly_gcra_take`). A client near its limit is therefore decided
//! request by request, exactly as without loans, and a loan can never lift a limit: what it
//! lends is already spent. What a loan has left when it lapses (`TERM`) is given back in the
//! next statement, so budget lent and not used is not lost to the client.

use std::time::{Duration, Instant};

use crate::store::Spent;

/// A loan is granted only from a budget with at least this many requests left beyond the
/// requests waiting, and is at most a `SHARE`th of them.
pub(super) const FLOOR: i64 = 1024;
pub(super) const SHARE: i64 = 16;
/// The first loan a client gets (when at least two of its requests wait on one statement);
/// each loan spent before it lapses doubles the next, up to `LARGEST`.
const FIRST: i64 = 32;
const LARGEST: i64 = 4096;
/// How long a loan may be drawn on before what is left goes back.
pub(super) const TERM: Duration = Duration::from_millis(200);

/// The terms a client's requests are spent under (nanoseconds).
#[derive(Clone, Copy)]
pub(super) struct Terms {
    pub(crate) emission: i64,
    pub(crate) window: i64,
}

/// Budget lent to this instance for one client.
pub(super) struct Loan {
    /// Requests still allowed from it.
    left: i64,
    /// What was lent, how far the arrival time was ahead of now once it was, and when.
    lent: i64,
    ahead: i64,
    at: Instant,
    emission: i64,
}

impl Loan {
    /// The loan of `lent` requests that a statement answered at `at` granted beyond its
    /// waiting requests, the arrival time then `ahead` ns ahead.
    pub(super) fn new(lent: i64, ahead: i64, at: Instant, terms: Terms) -> Self {
        Loan {
            left: lent,
            lent,
            ahead,
            at,
            emission: terms.emission,
        }
    }

    pub(super) fn lapsed(&self, now: Instant) -> bool {
        now >= self.at + TERM
    }

    pub(super) fn lapses_at(&self) -> Instant {
        self.at + TERM
    }

    /// Allows one request from the loan, if it has any left and has not lapsed: as the
    /// statement would have, the request's arrival time counted from when it was lent.
    pub(super) fn draw(&mut self, now: Instant) -> Option<Spent> {
        if self.left == 0 || self.lapsed(now) {
            return None;
        }
        self.left -= 1;
        let elapsed = now.duration_since(self.at).as_nanos().min(i64::MAX as u128) as i64;
        Some(Spent {
            allowed: true,
            ahead_nanos: (self.ahead - self.left * self.emission - elapsed).max(0),
        })
    }

    /// What goes back to the shared budget when the loan is closed.
    pub(super) fn unused(&self) -> i64 {
        self.left
    }

    /// The loan to ask for next: twice this one when it was all drawn before it lapsed.
    pub(super) fn next_size(&self, now: Instant) -> i64 {
        if self.left == 0 && !self.lapsed(now) {
            (self.lent * 2).clamp(FIRST, LARGEST)
        } else {
            FIRST
        }
    }
}

/// The loan to ask for with `waiting` requests of a client whose last loan (if any) was
/// `previous`: none for a lone request (a quiet client costs no budget ahead of time).
pub(super) fn wanted(waiting: usize, previous: Option<&Loan>, now: Instant) -> i64 {
    match previous {
        Some(loan) => loan.next_size(now),
        None if waiting >= 2 => FIRST,
        None => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TERMS: Terms = Terms {
        emission: 10,
        window: 1_000_000,
    };

    #[test]
    fn each_draw_moves_the_arrival_time_on_by_one_emission_as_a_statement_would() {
        let at = Instant::now();
        // 3 lent; the arrival time ended 30 ahead, so the draws stand at 10, 20, 30.
        let mut loan = Loan::new(3, 30, at, TERMS);
        let drawn: Vec<i64> = (0..3).map(|_| loan.draw(at).unwrap().ahead_nanos).collect();
        assert_eq!(drawn, vec![10, 20, 30]);
        assert!(loan.draw(at).is_none(), "nothing left");
        assert_eq!(loan.unused(), 0);
    }

    #[test]
    fn a_lapsed_loan_allows_nothing_and_gives_back_what_it_has_left() {
        let at = Instant::now();
        let mut loan = Loan::new(5, 50, at, TERMS);
        loan.draw(at).unwrap();
        assert!(loan.draw(at + TERM).is_none());
        assert_eq!(loan.unused(), 4);
        assert_eq!(
            loan.next_size(at + TERM),
            FIRST,
            "not all drawn: start over"
        );
    }

    #[test]
    fn a_loan_drawn_in_full_before_it_lapses_doubles_the_next_up_to_the_largest() {
        let at = Instant::now();
        let mut loan = Loan::new(FIRST, 0, at, TERMS);
        while loan.draw(at).is_some() {}
        assert_eq!(loan.next_size(at), FIRST * 2);
        let mut big = Loan::new(LARGEST, 0, at, TERMS);
        while big.draw(at).is_some() {}
        assert_eq!(big.next_size(at), LARGEST);
    }

    #[test]
    fn a_lone_request_asks_for_no_loan() {
        let now = Instant::now();
        assert_eq!(wanted(1, None, now), 0);
        assert_eq!(wanted(2, None, now), FIRST);
    }
}
