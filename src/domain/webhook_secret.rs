//! Webhook secrets and their rotation: the secret a rotation replaces keeps signing beside the
//! new one for the overlap, so a receiver that holds either verifies every delivery, and can
//! move to the new secret without a gap (Standard Webhooks allows several signatures).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::time::{expiry_after, Millis};

/// The secret the last rotation replaced, and until when it still signs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreviousSecret {
    /// The replaced `whsec_…` secret.
    pub secret: String,
    /// Until when callbacks are still signed with it too.
    pub valid_until: Millis,
}

/// What replacing `current` at `now` leaves behind: it signs beside the new secret until the
/// overlap ends. Only the secret replaced is kept, so a second rotation within the overlap
/// drops the oldest: a leaked secret is never kept alive by rotating again.
pub(crate) fn retire(current: &str, now: Millis, overlap: Duration) -> PreviousSecret {
    PreviousSecret {
        secret: current.to_string(),
        valid_until: expiry_after(now, overlap),
    }
}

/// The secrets a delivery sent at `now` is signed with: the current one first, then the one
/// it replaced while its overlap lasts.
pub(crate) fn signing_secrets<'a>(
    current: &'a str,
    previous: Option<&'a PreviousSecret>,
    now: Millis,
) -> Vec<&'a str> {
    let mut secrets = vec![current];
    if let Some(previous) = previous.filter(|p| now < p.valid_until) {
        secrets.push(&previous.secret);
    }
    secrets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn during_the_overlap_both_sign_the_new_one_first_and_after_it_only_the_new_one() {
        let previous = retire("whsec_old", 1_000, Duration::from_secs(60));
        assert_eq!(previous.valid_until, 61_000);
        assert_eq!(
            signing_secrets("whsec_new", Some(&previous), 60_999),
            ["whsec_new", "whsec_old"]
        );
        assert_eq!(
            signing_secrets("whsec_new", Some(&previous), 61_000),
            ["whsec_new"]
        );
    }

    #[test]
    fn a_second_rotation_within_the_overlap_keeps_only_the_secret_it_replaced() {
        let first = retire("whsec_a", 0, Duration::from_secs(3600));
        let second = retire("whsec_b", 10, Duration::from_secs(3600));
        assert_ne!(first.secret, second.secret);
        assert_eq!(
            signing_secrets("whsec_c", Some(&second), 20),
            ["whsec_c", "whsec_b"]
        );
    }

    #[test]
    fn a_zero_overlap_signs_with_the_new_secret_alone_at_once() {
        let previous = retire("whsec_old", 5, Duration::ZERO);
        assert_eq!(
            signing_secrets("whsec_new", Some(&previous), 5),
            ["whsec_new"]
        );
    }
}
