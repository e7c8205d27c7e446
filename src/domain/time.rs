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

/// An RFC 3339 time (`2026-11-30T10:00:00Z`, fractions and `±hh:mm` offsets allowed) as
/// milliseconds since the epoch; `None` when it is not one, or is before the epoch.
pub fn parse_rfc3339(text: &str) -> Option<Millis> {
    let text = text.trim();
    if !text.is_ascii() {
        return None;
    }
    let (local, offset_secs) = match text.as_bytes().last()? {
        b'Z' | b'z' => (&text[..text.len() - 1], 0i64),
        _ => {
            let (local, offset) = text.split_at(text.len().checked_sub(6)?);
            let sign = match offset.as_bytes()[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let (hours, minutes) = offset[1..].split_once(':')?;
            let (hours, minutes): (i64, i64) = (hours.parse().ok()?, minutes.parse().ok()?);
            if hours > 23 || minutes > 59 || offset[1..].len() != 5 {
                return None;
            }
            (local, sign * (hours * 3600 + minutes * 60))
        }
    };
    if !local.contains('T') && !local.contains('t') {
        return None;
    }
    let utc = humantime::parse_rfc3339_weak(&format!("{}Z", local.replace('t', "T"))).ok()?;
    let millis = utc.duration_since(UNIX_EPOCH).ok()?.as_millis() as i64;
    u64::try_from(millis - offset_secs * 1000).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_times_parse_in_utc_with_offsets_and_fractions() {
        assert_eq!(
            parse_rfc3339("2026-11-30T10:00:00Z"),
            Some(1_796_032_800_000)
        );
        assert_eq!(
            parse_rfc3339("2026-11-30T12:00:00+02:00"),
            Some(1_796_032_800_000)
        );
        assert_eq!(
            parse_rfc3339("2026-11-30T10:00:00.250Z"),
            Some(1_796_032_800_250)
        );
        for bad in [
            "",
            "yesterday",
            "2026-11-30",
            "2026-11-30T10:00:00",
            "2026-11-30T10:00:00+2:00",
            "2026-11-30T10:00:00é",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn renders_whole_seconds_in_utc() {
        assert_eq!(rfc3339(1_796_032_800_123), "2026-11-30T10:00:00Z");
    }
}
