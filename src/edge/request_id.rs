//! Every answer's `Request-Id` (docs/api.md "Errors"): what a partner quotes when asking why a request
//! was refused, and what an operator searches the log for.
//!
//! Distinct per request without a lock: a random 64-bit prefix drawn once per process (so
//! that instances sharing a database, and restarts, draw their own), and a per-process counter
//! taken with one atomic add, scrambled by a bijection (SplitMix64's finalizer) so that ids
//! do not count the server's traffic for whoever reads them. A caller's own `X-Request-Id`
//! is written beside it on the log line, never instead of it: callers repeat theirs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;

use actix_web::http::header::{HeaderName, HeaderValue};

/// The header every answer carries.
pub(crate) const REQUEST_ID: HeaderName = HeaderName::from_static("request-id");
/// A caller's own id, logged beside ours.
pub(crate) const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
/// Longest caller id written to the log; longer ones are cut there.
const CALLER_ID_MAX: usize = 128;

/// `req_` and 32 lowercase hex digits: the form of every id orderly makes.
pub(crate) struct RequestId([u8; 36]);

impl RequestId {
    pub(crate) fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("ASCII")
    }

    pub(crate) fn header_value(&self) -> HeaderValue {
        HeaderValue::from_bytes(&self.0).expect("visible ASCII")
    }
}

struct Ids {
    prefix: u64,
    next: AtomicU64,
}

static IDS: LazyLock<Ids> = LazyLock::new(|| Ids {
    prefix: u64::from_le_bytes(
        uuid::Uuid::new_v4().as_bytes()[..8]
            .try_into()
            .expect("8 bytes"),
    ),
    next: AtomicU64::new(0),
});

/// A bijection of u64 (SplitMix64's finalizer): distinct counters stay distinct.
fn scramble(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn hex(into: &mut [u8], value: u64) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, slot) in into.iter_mut().enumerate() {
        *slot = DIGITS[((value >> (60 - 4 * i)) & 0xf) as usize];
    }
}

/// The next request's id.
pub(crate) fn next() -> RequestId {
    let ids = &*IDS;
    let n = ids.next.fetch_add(1, Ordering::Relaxed);
    let mut id = *b"req_00000000000000000000000000000000";
    hex(&mut id[4..20], ids.prefix);
    hex(&mut id[20..36], scramble(n));
    RequestId(id)
}

/// A caller's `X-Request-Id` as it may be logged: visible ASCII only (no line breaks or
/// escape sequences reach the log), at most `CALLER_ID_MAX` bytes. `None` when absent or
/// when nothing of it is printable.
pub(crate) fn caller_id(value: Option<&HeaderValue>) -> Option<String> {
    let bytes = value?.as_bytes();
    let kept: String = bytes
        .iter()
        .take(CALLER_ID_MAX)
        .filter(|b| b.is_ascii_graphic())
        .map(|&b| b as char)
        .collect();
    (!kept.is_empty()).then_some(kept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn ids_are_distinct_and_shaped_like_the_others() {
        let ids: HashSet<String> = (0..10_000).map(|_| next().as_str().to_string()).collect();
        assert_eq!(ids.len(), 10_000);
        for id in ids.iter().take(10) {
            assert!(id.starts_with("req_") && id.len() == 36, "{id}");
            assert!(id[4..]
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        }
    }

    #[test]
    fn the_counter_is_not_readable_from_consecutive_ids() {
        assert_ne!(scramble(1).wrapping_sub(scramble(0)), 1);
        let distinct: HashSet<u64> = (0..1000).map(scramble).collect();
        assert_eq!(distinct.len(), 1000);
    }

    #[test]
    fn a_callers_id_reaches_the_log_only_as_visible_ascii_and_cut_short() {
        let header = |s: &str| HeaderValue::from_str(s).unwrap();
        assert_eq!(
            caller_id(Some(&header("abc-123"))).as_deref(),
            Some("abc-123")
        );
        assert_eq!(caller_id(Some(&header("a b\tc"))).as_deref(), Some("abc"));
        assert_eq!(
            caller_id(Some(&header(&"x".repeat(500)))).unwrap().len(),
            128
        );
        assert_eq!(caller_id(Some(&header(" \t "))), None);
        assert_eq!(caller_id(None), None);
    }
}
