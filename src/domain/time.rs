//! Wall-clock instants as milliseconds since the Unix epoch, and their RFC 3339 rendering.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch; the unit of every stored time.
pub type Millis = u64;

pub fn now_millis() -> Millis {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as Millis)
        .unwrap_or(0)
}

/// `2026-11-30T10:00:00Z`: whole seconds, UTC, as partners see every time.
pub fn rfc3339(millis: Millis) -> String {
    let instant = UNIX_EPOCH + Duration::from_millis(millis);
    humantime::format_rfc3339_seconds(instant).to_string()
}

/// `now + ttl`, saturating instead of wrapping for absurd TTLs.
pub fn expiry_after(now: Millis, ttl: Duration) -> Millis {
    now.saturating_add(ttl.as_millis().min(u64::MAX as u128) as Millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_whole_seconds_in_utc() {
        assert_eq!(rfc3339(1_796_032_800_123), "2026-11-30T10:00:00Z");
    }
}
