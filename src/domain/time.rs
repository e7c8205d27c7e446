//! Wall-clock instants as milliseconds since the Unix epoch, and their RFC 3339 rendering;
//! and the process's one notion of now.
//!
//! Alone on sled, now is this machine's clock, never earlier than the newest time the store
//! holds and never going back (`never_before`): a restart under a clock stepped back (an
//! operator, a dead RTC battery, NTP at boot) must not give new ledger entries and events
//! ids that sort before the old ones, nor make orders wait out the step to complete. A
//! forward step of the wall clock is followed within `CATCH_UP`. Instances sharing a database
//! must agree on
//! time (a key's expiry written by one is swept by another, a delivery's lease taken by one is
//! judged by another, event ids order one account's events across all of them), so there the
//! engine makes the database's clock the reference: `follow` anchors now to a reading of it,
//! and from then on now advances with this machine's monotonic clock, which a step of the
//! wall clock (NTP, an operator, a wrong time zone setting) does not move.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch; the unit of every stored time.
pub(crate) type Millis = u64;

/// Whether now follows a reference clock (`follow` was called).
static FOLLOWING: AtomicBool = AtomicBool::new(false);
/// Whether that reference is the wall clock kept from going back (`never_before`), rather
/// than the database's.
static MONOTONE_WALL: AtomicBool = AtomicBool::new(false);
/// How often a wall clock kept from going back looks whether it was stepped forward.
const CATCH_UP: Duration = Duration::from_secs(1);
/// The reference clock's reading minus `monotonic_micros()`, in microseconds.
static OFFSET_MICROS: AtomicI64 = AtomicI64::new(0);

/// Microseconds of this process's monotonic clock, since its first use.
fn monotonic_micros(at: Instant) -> i64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    let base = *BASE.get_or_init(Instant::now);
    // Floored in nanoseconds, so that instants before the base map back exactly too.
    let nanos = match at.checked_duration_since(base) {
        Some(after) => after.as_nanos() as i128,
        None => -(base.duration_since(at).as_nanos() as i128),
    };
    nanos.div_euclid(1_000) as i64
}

fn system_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// Now, in microseconds since the epoch: the reference clock's when one is followed.
pub(crate) fn now_micros() -> i64 {
    if FOLLOWING.load(Ordering::Acquire) {
        followed(OFFSET_MICROS.load(Ordering::Relaxed), Instant::now())
    } else {
        system_micros()
    }
}

/// The reference clock's time at `at`, given the offset one of its readings set.
fn followed(offset_micros: i64, at: Instant) -> i64 {
    monotonic_micros(at) + offset_micros
}

/// The offset that makes the reading `reference_micros`, taken at `at`, the time at `at`.
fn offset_of(reference_micros: i64, at: Instant) -> i64 {
    reference_micros - monotonic_micros(at)
}

/// The time now in milliseconds since the epoch, on the clock every stored time is read from.
pub fn now_millis() -> Millis {
    (now_micros().max(0) / 1_000) as Millis
}

/// Makes the reference clock's reading `reference_micros`, taken at `at`, this process's now
/// (re-anchored at each call: the error is the reading's, half its round trip at most).
pub(crate) fn follow(reference_micros: i64, at: Instant) {
    OFFSET_MICROS.store(offset_of(reference_micros, at), Ordering::Relaxed);
    FOLLOWING.store(true, Ordering::Release);
}

/// Follows the database's clock (`follow`): where instances share a database, its clock
/// decides, whatever a store on this machine's disk set before (tests open both engines in
/// one process).
pub(crate) fn follow_database(reference_micros: i64, at: Instant) {
    MONOTONE_WALL.store(false, Ordering::Release);
    follow(reference_micros, at);
}

/// Makes now this machine's clock, but never earlier than `floor` (the newest time a store
/// holds) nor earlier than it was: from here on now advances with the monotonic clock, and
/// moves forward to the wall clock whenever that is ahead (checked every `CATCH_UP` on a
/// thread of its own). Not when a database's clock is followed: that one decides.
pub(crate) fn never_before(floor: Millis) {
    if FOLLOWING.load(Ordering::Acquire) && !MONOTONE_WALL.load(Ordering::Acquire) {
        return;
    }
    let at = Instant::now();
    let floor_micros = (floor as i64).saturating_add(1).saturating_mul(1_000);
    let now = if FOLLOWING.load(Ordering::Acquire) {
        now_micros()
    } else {
        system_micros()
    };
    MONOTONE_WALL.store(true, Ordering::Release);
    follow(now.max(floor_micros), at);
    static CATCHING_UP: OnceLock<()> = OnceLock::new();
    CATCHING_UP.get_or_init(|| {
        let _ = std::thread::Builder::new()
            .name("orderly-clock".into())
            .spawn(|| loop {
                std::thread::sleep(CATCH_UP);
                catch_up(Instant::now());
            });
    });
}

/// Moves now forward to the wall clock when that is ahead; never back.
fn catch_up(at: Instant) {
    if !MONOTONE_WALL.load(Ordering::Acquire) {
        return;
    }
    let wall = system_micros();
    if wall > followed(OFFSET_MICROS.load(Ordering::Relaxed), at) {
        follow(wall, at);
    }
}

/// `2026-11-30T10:00:00Z`: whole seconds, UTC, as partners see every time.
pub(crate) fn rfc3339(millis: Millis) -> String {
    let instant = UNIX_EPOCH + Duration::from_millis(millis);
    humantime::format_rfc3339_seconds(instant).to_string()
}

/// `millis` in RFC 3339 to the millisecond when it is not a whole second (an instant a
/// caller gave, answered as it is kept), else to the second as `rfc3339`.
pub(crate) fn rfc3339_exact(millis: Millis) -> String {
    if millis % 1000 == 0 {
        return rfc3339(millis);
    }
    let instant = UNIX_EPOCH + Duration::from_millis(millis);
    humantime::format_rfc3339_millis(instant).to_string()
}

/// `now + ttl`, saturating instead of wrapping for absurd TTLs.
pub(crate) fn expiry_after(now: Millis, ttl: Duration) -> Millis {
    now.saturating_add(ttl.as_millis().min(u64::MAX as u128) as Millis)
}

/// An RFC 3339 time (`2026-11-30T10:00:00Z`, fractions and `±hh:mm` offsets allowed) as
/// milliseconds since the epoch; `None` when it is not one, or is before the epoch.
pub(crate) fn parse_rfc3339(text: &str) -> Option<Millis> {
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
    fn a_followed_reading_is_the_time_at_its_instant_and_advances_with_the_monotonic_clock() {
        // A reading ten minutes ahead of this machine, taken at `read`. (Pure: the process's
        // own clock is left alone, other tests run beside this one.)
        let read = Instant::now();
        let reading = system_micros() + 600_000_000;
        let offset = offset_of(reading, read);
        assert_eq!(followed(offset, read), reading);
        let later = read + Duration::from_millis(1_500);
        assert_eq!(followed(offset, later), reading + 1_500_000);
        // An instant before the process's monotonic base still maps back in time.
        let earlier = read.checked_sub(Duration::from_secs(1)).unwrap();
        assert_eq!(followed(offset, earlier), reading - 1_000_000);
    }

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
    fn an_instant_is_answered_to_the_millisecond_only_when_it_has_a_fraction() {
        for (millis, text) in [
            (1_796_032_800_000, "2026-11-30T10:00:00Z"),
            (1_796_032_800_250, "2026-11-30T10:00:00.250Z"),
            (1_796_032_800_001, "2026-11-30T10:00:00.001Z"),
            (253_402_300_799_999, "9999-12-31T23:59:59.999Z"),
        ] {
            assert_eq!(rfc3339_exact(millis), text);
            assert_eq!(parse_rfc3339(text), Some(millis));
        }
    }

    #[test]
    fn renders_whole_seconds_in_utc() {
        assert_eq!(rfc3339(1_796_032_800_123), "2026-11-30T10:00:00Z");
    }
}
