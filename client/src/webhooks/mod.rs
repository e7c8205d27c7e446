//! Receiving orderly's callbacks: `verify` (the Standard Webhooks signature scheme) and
//! `Inbox` (seed 000's four steps: take `event.id`, insert it under a unique key, skip on
//! conflict, then process).

mod inbox;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

pub use inbox::{Claim, Delivery, Inbox, InboxError, Ticket};

/// How far `webhook-timestamp` may be from now, either way, before the request is refused
/// as a replay (or a sender with a broken clock).
pub const TOLERANCE: Duration = Duration::from_secs(5 * 60);

/// Header lookup by case-insensitive name, for whatever map the caller's HTTP stack has.
pub trait Headers {
    fn header(&self, name: &str) -> Option<&str>;
}

impl Headers for [(&str, &str)] {
    fn header(&self, name: &str) -> Option<&str> {
        self.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
    }
}

impl<const N: usize> Headers for [(&str, &str); N] {
    fn header(&self, name: &str) -> Option<&str> {
        self.as_slice().header(name)
    }
}

impl Headers for [(String, String)] {
    fn header(&self, name: &str) -> Option<&str> {
        self.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

impl Headers for Vec<(String, String)> {
    fn header(&self, name: &str) -> Option<&str> {
        self.as_slice().header(name)
    }
}

impl Headers for HashMap<String, String> {
    fn header(&self, name: &str) -> Option<&str> {
        self.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

impl Headers for BTreeMap<String, String> {
    fn header(&self, name: &str) -> Option<&str> {
        self.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

impl Headers for ureq::http::HeaderMap {
    fn header(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(|v| v.to_str().ok())
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("the {0} header is missing")]
    MissingHeader(&'static str),
    #[error("the secret is not whsec_ followed by base64")]
    BadSecret,
    #[error("webhook-timestamp is not a number of seconds")]
    BadTimestamp,
    #[error("webhook-timestamp is more than 5 minutes from now")]
    OutsideTolerance,
    #[error("no v1 signature matches")]
    NoMatchingSignature,
}

/// Checks a delivery against `secret` (`whsec_<base64>`) at the current time.
pub fn verify<H: Headers + ?Sized>(
    secret: &str,
    headers: &H,
    body: &[u8],
) -> Result<(), VerifyError> {
    verify_at(secret, headers, body, SystemTime::now())
}

/// Checks a delivery as of `now`: the HMAC-SHA256 of `{webhook-id}.{webhook-timestamp}.{body}`
/// under the secret must equal one of the space-separated `v1,<base64>` signatures (a sender
/// rotating its secret sends several), compared in constant time, and the timestamp must be
/// within `TOLERANCE` of `now`.
pub fn verify_at<H: Headers + ?Sized>(
    secret: &str,
    headers: &H,
    body: &[u8],
    now: SystemTime,
) -> Result<(), VerifyError> {
    let id = headers
        .header("webhook-id")
        .ok_or(VerifyError::MissingHeader("webhook-id"))?;
    let timestamp = headers
        .header("webhook-timestamp")
        .ok_or(VerifyError::MissingHeader("webhook-timestamp"))?;
    let signatures = headers
        .header("webhook-signature")
        .ok_or(VerifyError::MissingHeader("webhook-signature"))?;
    let key = STANDARD
        .decode(secret.strip_prefix("whsec_").unwrap_or(secret))
        .map_err(|_| VerifyError::BadSecret)?;
    let sent: i64 = timestamp
        .trim()
        .parse()
        .map_err(|_| VerifyError::BadTimestamp)?;
    let now = match now.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    };
    if sent.abs_diff(now) > TOLERANCE.as_secs() {
        return Err(VerifyError::OutsideTolerance);
    }
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).map_err(|_| VerifyError::BadSecret)?;
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    let matches = signatures
        .split(' ')
        .filter_map(|s| s.strip_prefix("v1,"))
        .filter_map(|s| STANDARD.decode(s).ok())
        .any(|candidate| mac.clone().verify_slice(&candidate).is_ok());
    if matches {
        Ok(())
    } else {
        Err(VerifyError::NoMatchingSignature)
    }
}

/// The `webhook-signature` value for a body, as orderly makes it (for tests and tools that
/// need to send a signed event).
pub fn sign(secret: &str, id: &str, timestamp: i64, body: &[u8]) -> Result<String, VerifyError> {
    let key = STANDARD
        .decode(secret.strip_prefix("whsec_").unwrap_or(secret))
        .map_err(|_| VerifyError::BadSecret)?;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).map_err(|_| VerifyError::BadSecret)?;
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    Ok(format!(
        "v1,{}",
        STANDARD.encode(mac.finalize().into_bytes())
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn a_signature_made_by_sign_verifies_and_a_changed_body_does_not() {
        let sig = sign(SECRET, "evt_1", 1000, b"{}").unwrap();
        let headers = [
            ("webhook-id", "evt_1"),
            ("webhook-timestamp", "1000"),
            ("webhook-signature", sig.as_str()),
        ];
        assert_eq!(verify_at(SECRET, &headers, b"{}", at(1000)), Ok(()));
        assert_eq!(
            verify_at(SECRET, &headers, b"{ }", at(1000)),
            Err(VerifyError::NoMatchingSignature)
        );
    }

    #[test]
    fn any_of_several_signatures_may_match() {
        let good = sign(SECRET, "evt_1", 1000, b"{}").unwrap();
        let list = format!("v1,bm90IGl0 v2,whatever {good}");
        let headers = [
            ("Webhook-Id", "evt_1"),
            ("Webhook-Timestamp", "1000"),
            ("Webhook-Signature", list.as_str()),
        ];
        assert_eq!(verify_at(SECRET, &headers, b"{}", at(1000)), Ok(()));
    }

    #[test]
    fn the_tolerance_is_five_minutes_either_way() {
        let sig = sign(SECRET, "evt_1", 1000, b"{}").unwrap();
        let headers = [
            ("webhook-id", "evt_1"),
            ("webhook-timestamp", "1000"),
            ("webhook-signature", sig.as_str()),
        ];
        assert_eq!(verify_at(SECRET, &headers, b"{}", at(1300)), Ok(()));
        assert_eq!(verify_at(SECRET, &headers, b"{}", at(700)), Ok(()));
        assert_eq!(
            verify_at(SECRET, &headers, b"{}", at(1301)),
            Err(VerifyError::OutsideTolerance)
        );
        assert_eq!(
            verify_at(SECRET, &headers, b"{}", at(699)),
            Err(VerifyError::OutsideTolerance)
        );
    }

    #[test]
    fn a_missing_header_is_named() {
        let headers = [("webhook-id", "evt_1")];
        assert_eq!(
            verify_at(SECRET, &headers, b"{}", at(0)),
            Err(VerifyError::MissingHeader("webhook-timestamp"))
        );
    }
}
